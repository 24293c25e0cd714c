//! Cron schedules in UTC: five fields (crontab), six fields (seconds
//! first), or a macro such as `@hourly`. Day-of-week numbers follow crontab
//! in both forms: 0 or 7 is Sunday.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use jiff::Timestamp;

/// A pattern the CRD schemas use so the API server refuses an expression
/// with the wrong number of fields or an unknown macro.
pub const CRON_PATTERN: &str =
    r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|(\S+\s+){4,5}\S+)$";

/// A parsed schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    source: String,
    inner: cron::Schedule,
    /// The last answer of `next_after`: `(asked, fire)` means `fire` is
    /// the first fire time after `asked`, so it is also the answer for any
    /// time from `asked` up to (not including) `fire`. Between two fire
    /// times every decision on a scheduled target asks the same question;
    /// this answers it without walking the cron fields again.
    memo: Arc<Mutex<Option<(Timestamp, Timestamp)>>>,
}

impl Schedule {
    /// Parse an expression; the error says what is wrong with it.
    pub fn parse(expr: &str) -> Result<Self, String> {
        let trimmed = expr.trim();
        let native = match trimmed {
            "@yearly" | "@annually" => "@yearly".to_string(),
            "@monthly" | "@weekly" | "@daily" | "@hourly" => trimmed.to_string(),
            "@midnight" => "@daily".to_string(),
            m if m.starts_with('@') => {
                return Err(format!(
                    "unknown schedule macro {m:?} (use @yearly, @monthly, @weekly, @daily or @hourly)"
                ));
            }
            _ => {
                let fields: Vec<&str> = trimmed.split_whitespace().collect();
                let (seconds, rest): (&str, &[&str]) = match fields.len() {
                    5 => ("0", &fields[..]),
                    6 => (fields[0], &fields[1..]),
                    n => {
                        return Err(format!(
                            "schedule {trimmed:?} has {n} fields; want 5 (minute hour day month weekday) or 6 (seconds first)"
                        ));
                    }
                };
                format!(
                    "{} {} {} {} {} {}",
                    seconds,
                    rest[0],
                    rest[1],
                    rest[2],
                    rest[3],
                    crontab_weekdays(rest[4])?
                )
            }
        };
        let inner =
            cron::Schedule::from_str(&native).map_err(|e| format!("schedule {trimmed:?}: {e}"))?;
        Ok(Self {
            source: trimmed.to_string(),
            inner,
            memo: Arc::default(),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The first fire time strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let remembered = *self.memo.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((asked, fire)) = remembered
            && asked <= t
            && t < fire
        {
            return Some(fire);
        }
        let dt =
            DateTime::<Utc>::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32)?;
        let next = self.inner.after(&dt).next()?;
        let fire = Timestamp::from_second(next.timestamp()).ok()?;
        *self.memo.lock().unwrap_or_else(|p| p.into_inner()) = Some((t, fire));
        Some(fire)
    }

    /// The latest fire time at or before `t`, if one exists after `since`.
    pub fn last_at_or_before(&self, since: Timestamp, t: Timestamp) -> Option<Timestamp> {
        let mut cursor = since;
        let mut last = None;
        // Walk forward; schedules that fire more than once a second do not exist.
        for _ in 0..100_000 {
            match self.next_after(cursor) {
                Some(n) if n <= t => {
                    last = Some(n);
                    cursor = n;
                }
                _ => break,
            }
        }
        last
    }
}

/// Schedules parsed from targets' own fields (`schedule.fromField`), by
/// expression: a policy's targets mostly share a handful, and each is
/// parsed once rather than at every decision. Bounded: past
/// [`ParsedSchedules::MAX`] expressions it starts again.
#[derive(Clone, Debug, Default)]
pub struct ParsedSchedules(Arc<Mutex<HashMap<String, Arc<Schedule>>>>);

impl ParsedSchedules {
    pub const MAX: usize = 1024;

    /// The schedule for `expr`, parsed on first use. Errors are not kept.
    pub fn get(&self, expr: &str) -> Result<Arc<Schedule>, String> {
        if let Some(s) = self.lock().get(expr) {
            return Ok(s.clone());
        }
        let parsed = Arc::new(Schedule::parse(expr)?);
        let mut map = self.lock();
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(expr.to_string(), parsed.clone());
        Ok(parsed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Schedule>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Shift crontab day-of-week numbers (0-7, Sunday = 0 or 7) to the cron
/// crate's (1-7, Sunday = 1). Names and `*` pass through unchanged.
fn crontab_weekdays(field: &str) -> Result<String, String> {
    let day = |text: &str| -> Result<Option<u32>, String> {
        if text.chars().all(|c| c.is_ascii_digit()) && !text.is_empty() {
            let n: u32 = text
                .parse()
                .map_err(|_| format!("day of week {text:?} is not a number"))?;
            if n > 7 {
                return Err(format!("day of week {n} is out of range (0-7)"));
            }
            Ok(Some(n))
        } else {
            Ok(None)
        }
    };
    let shift = |n: u32| if n == 7 { 1 } else { n + 1 };
    let mut items = Vec::new();
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (item, None),
        };
        let step_suffix = step.map(|s| format!("/{s}")).unwrap_or_default();
        let converted = match range.split_once('-') {
            Some((a, b)) => match (day(a)?, day(b)?) {
                // A range ending on Sunday (7) wraps: Friday-Sunday is 6-7 plus 1.
                (Some(a), Some(7)) if step.is_none() => {
                    if a == 0 {
                        "*".to_string()
                    } else {
                        format!("{}-7,1", shift(a))
                    }
                }
                (Some(a), Some(b)) => format!("{}-{}{step_suffix}", shift(a), shift(b)),
                _ => item.to_string(),
            },
            None => match day(range)? {
                Some(n) => format!("{}{step_suffix}", shift(n)),
                None => item.to_string(),
            },
        };
        items.push(converted);
    }
    Ok(items.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn hourly_fires_on_the_hour() {
        let s = Schedule::parse("@hourly").unwrap();
        assert_eq!(
            s.next_after(ts("2026-11-29T10:15:00Z")),
            Some(ts("2026-11-29T11:00:00Z"))
        );
        assert_eq!(
            s.next_after(ts("2026-11-29T11:00:00Z")),
            Some(ts("2026-11-29T12:00:00Z"))
        );
    }

    #[test]
    fn five_fields_are_crontab_with_sunday_zero() {
        // 2026-11-29 is a Sunday.
        let s = Schedule::parse("30 9 * * 1-5").unwrap();
        assert_eq!(
            s.next_after(ts("2026-11-29T00:00:00Z")),
            Some(ts("2026-11-30T09:30:00Z"))
        );
        let sunday = Schedule::parse("0 6 * * 0").unwrap();
        assert_eq!(
            sunday.next_after(ts("2026-11-28T00:00:00Z")),
            Some(ts("2026-11-29T06:00:00Z"))
        );
        let weekend = Schedule::parse("0 6 * * 6-7").unwrap();
        assert_eq!(
            weekend.next_after(ts("2026-11-28T07:00:00Z")),
            Some(ts("2026-11-29T06:00:00Z"))
        );
        let sunday7 = Schedule::parse("0 6 * * 7").unwrap();
        assert_eq!(
            sunday7.next_after(ts("2026-11-28T00:00:00Z")),
            Some(ts("2026-11-29T06:00:00Z"))
        );
    }

    #[test]
    fn six_fields_put_seconds_first() {
        let s = Schedule::parse("*/30 * * * * *").unwrap();
        assert_eq!(
            s.next_after(ts("2026-11-29T10:00:00Z")),
            Some(ts("2026-11-29T10:00:30Z"))
        );
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        assert!(Schedule::parse("* * *").unwrap_err().contains("3 fields"));
        assert!(
            Schedule::parse("@every 5m")
                .unwrap_err()
                .contains("unknown schedule macro")
        );
        assert!(Schedule::parse("61 * * * *").is_err());
    }

    #[test]
    fn a_remembered_answer_holds_only_until_the_next_fire_time() {
        let s = Schedule::parse("*/15 * * * *").unwrap();
        let at = |t| s.next_after(ts(t)).unwrap();
        // Asked, remembered, and asked again from either side of it.
        assert_eq!(at("2026-11-29T10:05:00Z"), ts("2026-11-29T10:15:00Z"));
        assert_eq!(at("2026-11-29T10:14:59Z"), ts("2026-11-29T10:15:00Z"));
        assert_eq!(at("2026-11-29T10:15:00Z"), ts("2026-11-29T10:30:00Z"));
        assert_eq!(at("2026-11-29T10:00:00Z"), ts("2026-11-29T10:15:00Z"));
        assert_eq!(at("2026-11-29T09:59:59Z"), ts("2026-11-29T10:00:00Z"));
        // Clones share what was learnt and answer alike.
        let copy = s.clone();
        assert_eq!(
            copy.next_after(ts("2026-11-29T09:59:30Z")),
            Some(ts("2026-11-29T10:00:00Z"))
        );
        assert_eq!(
            s.last_at_or_before(ts("2026-11-29T09:59:59Z"), ts("2026-11-29T10:40:00Z")),
            Some(ts("2026-11-29T10:30:00Z"))
        );
    }

    #[test]
    fn schedules_from_fields_are_parsed_once_each() {
        let cache = ParsedSchedules::default();
        let a = cache.get("@hourly").unwrap();
        let b = cache.get("@hourly").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(cache.get("61 * * * *").is_err());
        assert!(!Arc::ptr_eq(&a, &cache.get("@daily").unwrap()));
    }

    #[test]
    fn the_last_fire_time_before_now_is_found() {
        let s = Schedule::parse("@hourly").unwrap();
        let last = s.last_at_or_before(ts("2026-11-29T07:30:00Z"), ts("2026-11-29T10:45:00Z"));
        assert_eq!(last, Some(ts("2026-11-29T10:00:00Z")));
    }
}
