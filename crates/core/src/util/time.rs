//! Kubernetes-style timestamps (RFC 3339, second precision, UTC) and
//! durations written as `90s`, `5m`, `1h30m`, `7d`.

use jiff::Timestamp;

/// Format as Kubernetes does: `2026-11-29T10:00:00Z`.
pub fn format(ts: Timestamp) -> String {
    let secs = ts.as_second();
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    }
    let mut out = String::with_capacity(20);
    for (n, width, sep) in [
        (y, 4, '-'),
        (m, 2, '-'),
        (d, 2, 'T'),
        (rem / 3600, 2, ':'),
        (rem % 3600 / 60, 2, ':'),
        (rem % 60, 2, 'Z'),
    ] {
        let mut digits = [b'0'; 4];
        let mut v = n;
        for slot in digits[..width].iter_mut().rev() {
            *slot = b'0' + (v % 10) as u8;
            v /= 10;
        }
        digits[..width]
            .iter()
            .for_each(|c| out.push(char::from(*c)));
        out.push(sep);
    }
    out
}

/// The proleptic Gregorian (year, month, day) of a count of days since
/// 1970-01-01 (the usual era arithmetic: 400-year eras of 146,097 days).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Format unix seconds.
pub fn format_secs(secs: i64) -> String {
    Timestamp::from_second(secs)
        .map(format)
        .unwrap_or_else(|_| secs.to_string())
}

/// Parse an RFC 3339 timestamp. The form Kubernetes writes
/// (`2026-11-29T10:00:00Z`, what every decision reads) is read by integer
/// arithmetic; any other is left to jiff.
pub fn parse(text: &str) -> Option<Timestamp> {
    canonical(text).or_else(|| text.parse::<Timestamp>().ok())
}

/// `YYYY-MM-DDTHH:MM:SSZ` exactly, with every field in range; `None` for
/// anything else (a fraction, an offset, a leap second).
fn canonical(text: &str) -> Option<Timestamp> {
    let b = text.as_bytes();
    if b.len() != 20 {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        b[from..to].iter().try_fold(0i64, |n, c| {
            c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
        })
    };
    let seps = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'Z'),
    ];
    if seps.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, min, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let month_days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if d < 1 || d > month_days || h > 23 || min > 59 || sec > 59 {
        return None;
    }
    let secs = days_from_civil(y, m, d) * 86_400 + h * 3600 + min * 60 + sec;
    Timestamp::from_second(secs).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the inverse of
/// `civil_from_days`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `t` plus `ms` milliseconds, kept within the representable times.
pub fn add_ms(t: Timestamp, ms: i64) -> Timestamp {
    let at = t.as_millisecond().saturating_add(ms);
    Timestamp::from_millisecond(at).unwrap_or(if ms < 0 {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
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

    /// A day in every `days` from 1200 to 9000, each at a different time
    /// of day.
    fn across_eight_centuries(days: i64) -> impl Iterator<Item = Timestamp> {
        let at = |text: &str| text.parse::<Timestamp>().unwrap().as_second();
        let end = at("9000-01-01T00:00:00Z");
        let mut step = 0;
        std::iter::successors(Some(at("1200-01-01T00:00:00Z")), move |secs| {
            step += 1;
            Some(secs + 86_400 * days + (step * 7_919) % 86_400)
        })
        .take_while(move |secs| *secs < end)
        .map(|secs| Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn timestamps_format_as_the_calendar_says() {
        // Against jiff's own calendar.
        for t in across_eight_centuries(10) {
            assert_eq!(
                format(t),
                t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                "{t}"
            );
        }
        assert_eq!(format(Timestamp::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let leap = "2024-02-29T23:59:59Z".parse::<Timestamp>().unwrap();
        assert_eq!(format(leap), "2024-02-29T23:59:59Z");
        // Subseconds are dropped, as Kubernetes writes times.
        let late = "2026-11-29T10:00:00.75Z".parse::<Timestamp>().unwrap();
        assert_eq!(format(late), "2026-11-29T10:00:00Z");
    }

    #[test]
    fn timestamps_parse_as_jiff_parses_them() {
        // The texts `format` writes read back as jiff reads them.
        for t in across_eight_centuries(9) {
            let text = format(t);
            assert_eq!(parse(&text), text.parse::<Timestamp>().ok(), "{text}");
            assert_eq!(parse(&text), Some(t), "{text}");
        }
        // Dates that do not exist, and the forms only jiff reads, give
        // jiff's answer.
        for text in [
            "2026-02-29T10:00:00Z",
            "2024-02-29T10:00:00Z",
            "2100-02-29T10:00:00Z",
            "2000-02-29T10:00:00Z",
            "2026-04-31T10:00:00Z",
            "2026-13-01T10:00:00Z",
            "2026-00-01T10:00:00Z",
            "2026-11-00T10:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T10:60:00Z",
            "2026-11-29T23:59:60Z",
            "2026-11-29T10:00:00.5Z",
            "2026-11-29T10:00:00+01:00",
            "2026-11-29t10:00:00z",
            "2026-11-29T1a:00:00Z",
            "+2026-11-29T10:00:00Z",
            "",
            "yesterday",
        ] {
            assert_eq!(parse(text), text.parse::<Timestamp>().ok(), "{text:?}");
        }
    }

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
