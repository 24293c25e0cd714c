//! Kubernetes-style timestamps (RFC 3339, second precision, UTC) and
//! durations written as `90s`, `5m`, `1h30m`, `7d`.

use jiff::Timestamp;

/// Format as Kubernetes does: `2026-11-29T10:00:00Z`.
pub fn format(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Format unix seconds.
pub fn format_secs(secs: i64) -> String {
    Timestamp::from_second(secs)
        .map(format)
        .unwrap_or_else(|_| secs.to_string())
}

/// Parse an RFC 3339 timestamp.
pub fn parse(text: &str) -> Option<Timestamp> {
    text.parse::<Timestamp>().ok()
}

/// Parse a duration such as `30s`, `5m`, `1h30m`, `2d`, `500ms` into
/// milliseconds. A bare number is seconds.
pub fn parse_duration_ms(text: &str) -> Result<i64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(n) = t.parse::<i64>() {
        return n
            .checked_mul(1000)
            .ok_or_else(|| format!("duration {t:?} is too large"));
    }
    let mut total: i64 = 0;
    let mut num = String::new();
    let mut chars = t.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit_ms: i64 = match c {
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                1
            }
            's' => 1000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            'w' => 7 * 86_400_000,
            _ => {
                return Err(format!(
                    "duration {t:?}: unknown unit {c:?} (use ms, s, m, h, d, w)"
                ));
            }
        };
        if num.is_empty() {
            return Err(format!("duration {t:?}: a unit needs a number before it"));
        }
        let n: i64 = num
            .parse()
            .map_err(|_| format!("duration {t:?} is too large"))?;
        total = n
            .checked_mul(unit_ms)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("duration {t:?} is too large"))?;
        num.clear();
        any = true;
    }
    if !num.is_empty() || !any {
        return Err(format!("duration {t:?}: the last number has no unit"));
    }
    Ok(total)
}

/// Render milliseconds compactly: `1h05m`, `2m30s`, `45s`, `250ms`.
pub fn render_duration_ms(ms: i64) -> String {
    if ms < 1000 && ms > -1000 {
        return format!("{ms}ms");
    }
    let neg = ms < 0;
    let mut s = ms.abs() / 1000;
    let d = s / 86_400;
    s %= 86_400;
    let h = s / 3600;
    s %= 3600;
    let m = s / 60;
    s %= 60;
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if d > 0 {
        out.push_str(&format!("{d}d{h:02}h{m:02}m"));
    } else if h > 0 {
        out.push_str(&format!("{h}h{m:02}m"));
    } else if m > 0 {
        out.push_str(&format!("{m}m{s:02}s"));
    } else {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration_ms("90s"), Ok(90_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("2d"), Ok(172_800_000));
        assert_eq!(parse_duration_ms("15"), Ok(15_000));
        assert!(parse_duration_ms("5x").is_err());
        assert!(parse_duration_ms("m").is_err());
        assert!(parse_duration_ms("1h30").is_err());
    }

    #[test]
    fn durations_render_compactly() {
        assert_eq!(render_duration_ms(3_900_000), "1h05m");
        assert_eq!(render_duration_ms(150_000), "2m30s");
        assert_eq!(render_duration_ms(250), "250ms");
    }

    #[test]
    fn timestamps_round_trip_at_second_precision() {
        let ts = parse("2026-11-29T10:00:00Z").unwrap();
        assert_eq!(format(ts), "2026-11-29T10:00:00Z");
    }
}
