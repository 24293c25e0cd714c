//! Cron schedules: five fields (crontab), six fields (seconds first), or a
//! macro such as `@hourly`. Day-of-week numbers follow crontab in both
//! forms: 0 or 7 is Sunday. In UTC unless a time zone is named (an IANA
//! name, from a `CRON_TZ=` or `TZ=` prefix or a policy's `timeZone`): then
//! the fields are wall-clock times there, evaluated with the time zone
//! database, as CronJob's `.spec.timeZone` does: a time the clocks skip
//! (02:30 on the spring-forward day) does not fire that day, and a time
//! they pass twice (01:30 on the fall-back day) fires at both.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use jiff::Timestamp;

/// A pattern the CRD schemas use so the API server refuses an expression
/// with the wrong number of fields, seconds, or an unknown macro: a
/// schedule a custom resource carries has five fields (see
/// [`MIN_TARGET_INTERVAL_SECS`]).
pub const CRON_PATTERN: &str = r"^((CRON_)?TZ=\S+\s+)?(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|(\S+\s+){4}\S+)$";

/// CEL rules (`x-kubernetes-validations`) a CRD gives a schedule with
/// [`CRON_PATTERN`], so the API server refuses at `kubectl apply` what
/// Runbook could not parse, each with a message naming the field: a value
/// or a step out of its field's range, a name outside the month and weekday
/// fields or one that is no month or day, and a numeric range that runs
/// backwards (`5-1`). Two things only Runbook checks, and reports on the
/// object: a time zone name, and a named range that runs backwards
/// (`fri-mon`). Each rule passes what the pattern refuses (a macro, a wrong
/// number of fields), so a mistake is told once. Pairs of rule and message.
pub fn cron_rules() -> Vec<(String, String)> {
    const MONTHS: &str = "jan|january|feb|february|mar|march|apr|april|may|jun|june|jul|july|aug|august|sep|september|oct|october|nov|november|dec|december";
    const DAYS: &str = "sun|sunday|mon|monday|tue|tues|tuesday|wed|wednesday|thu|thurs|thursday|fri|friday|sat|saturday";
    // (field, value, step, names, `?` allowed, the range said to a user)
    let fields: [(&str, &str, &str, &str, bool, &str); 5] = [
        (
            "minute",
            "0*[1-5]?[0-9]",
            "0*([1-9]|[1-5][0-9])",
            "",
            false,
            "0-59",
        ),
        (
            "hour",
            "0*(1?[0-9]|2[0-3])",
            "0*([1-9]|1[0-9]|2[0-3])",
            "",
            false,
            "0-23",
        ),
        (
            "day-of-month",
            "0*([1-9]|[12][0-9]|3[01])",
            "0*([1-9]|[12][0-9]|3[01])",
            "",
            true,
            "1-31",
        ),
        (
            "month",
            "0*([1-9]|1[0-2])",
            "0*([1-9]|1[0-2])",
            MONTHS,
            false,
            "1-12 or jan-dec",
        ),
        (
            "day-of-week",
            "0*[0-7]",
            "0*[1-7]",
            DAYS,
            true,
            "0-7 or sun-sat",
        ),
    ];
    // The pattern holds for a schedule with its five fields: they are the
    // words after an optional time zone prefix.
    let fields_given =
        r"!self.matches('^((CRON_)?TZ=\\S+\\s+)?\\S+\\s+\\S+\\s+\\S+\\s+\\S+\\s+\\S+$')";
    let word = |i: usize| {
        format!(r"self.lowerAscii().findAll('\\S+')[(self.matches('^(CRON_)?TZ=') ? 1 : 0) + {i}]")
    };
    let mut rules: Vec<(String, String)> = fields
        .iter()
        .enumerate()
        .map(|(i, (name, value, step, names, any, said))| {
            let mut base = vec![r"\\*".to_string(), format!("({value})(-({value}))?")];
            if *any {
                base.push(r"\\?".to_string());
            }
            if !names.is_empty() {
                base.push(format!("({names})-({names})"));
            }
            let mut item = format!("({})(/({step}))?", base.join("|"));
            if !names.is_empty() {
                item = format!("({item}|{names})");
            }
            let rule = format!("{fields_given} || {}.matches('^{item}(,{item})*$')", word(i));
            let message = format!(
                "the {name} field of a schedule takes {said}: a value, a range or *, with an optional /step within that range, or a comma-separated list of them"
            );
            (rule, message)
        })
        .collect();
    rules.push((
        "self.findAll('[0-9]+-[0-9]+').all(r, int(r.split('-')[0]) <= int(r.split('-')[1]))".into(),
        "a range in a schedule must run upwards (write 1-5, not 5-1)".into(),
    ));
    rules
}

/// The smallest interval of a schedule read from a target's field
/// (`fromField`): whoever writes a custom resource may not have Runbook
/// decide (and write) more often than once a minute for it. A policy's own
/// `cron`, written by its administrator, may use seconds (six fields):
/// its smallest interval is one second.
pub const MIN_TARGET_INTERVAL_SECS: i64 = 60;

/// Offsets change by less than this at any transition the database holds:
/// how far around a wall time the candidates that may map to the next
/// instant are looked for.
const TRANSITION_MAX: jiff::SignedDuration = jiff::SignedDuration::from_hours(3);

/// A parsed schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    source: String,
    inner: cron::Schedule,
    /// The time zone the fields are wall-clock times of (`None`: UTC).
    zone: Option<(String, jiff::tz::TimeZone)>,
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
        Self::parse_in(expr, None)
    }

    /// Parse an expression whose times are in `zone` (an IANA name) unless
    /// it names its own with a `CRON_TZ=` (or `TZ=`) prefix.
    pub fn parse_in(expr: &str, zone: Option<&str>) -> Result<Self, String> {
        let whole = expr.trim();
        let (prefixed, trimmed) = match whole.split_once(char::is_whitespace) {
            Some((first, rest)) if first.starts_with("CRON_TZ=") || first.starts_with("TZ=") => {
                let name = first.split_once('=').map_or("", |(_, n)| n);
                (Some(name), rest.trim())
            }
            _ => (None, whole),
        };
        if let (Some(p), Some(z)) = (prefixed, zone)
            && p != z
        {
            return Err(format!(
                "schedule {whole:?} names time zone {p:?}, and timeZone says {z:?}: give one"
            ));
        }
        let zone = match prefixed.or(zone) {
            None => None,
            Some(name) => Some((name.to_string(), time_zone(name)?)),
        };
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
            source: whole.to_string(),
            inner,
            zone,
            memo: Arc::default(),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The time zone's IANA name, when not UTC.
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_ref().map(|(n, _)| n.as_str())
    }

    /// The shortest time between two fire times, in seconds, over the
    /// first fire times of a day (2026-01-05, a Monday, UTC): enough to
    /// see seconds and minutes patterns. `None`: it fires less than twice.
    pub fn smallest_gap_secs(&self) -> Option<i64> {
        let start = DateTime::<Utc>::from_timestamp(1_767_571_200, 0)?;
        let fires: Vec<i64> = self
            .inner
            .after(&start)
            .take(256)
            .map(|t| t.timestamp())
            .collect();
        fires.windows(2).map(|w| w[1] - w[0]).min()
    }

    /// The first fire time strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let remembered = *crate::util::lock(&self.memo);
        if let Some((asked, fire)) = remembered
            && asked <= t
            && t < fire
        {
            return Some(fire);
        }
        let fire = match &self.zone {
            None => {
                let dt = DateTime::<Utc>::from_timestamp(
                    t.as_second(),
                    t.subsec_nanosecond().max(0) as u32,
                )?;
                let next = self.inner.after(&dt).next()?;
                Timestamp::from_second(next.timestamp()).ok()?
            }
            Some((_, tz)) => self.next_in(tz, t)?,
        };
        *crate::util::lock(&self.memo) = Some((t, fire));
        Some(fire)
    }

    /// The first fire time strictly after `t` of the fields read as wall
    /// times in `tz`. The cron fields walk wall times (as if they were
    /// UTC's); each candidate is then the instants it is in `tz`: none in
    /// a gap, two in a fold. Candidates from a little before `t`'s wall
    /// time are looked at, since in a fold a wall time already passed
    /// comes again.
    fn next_in(&self, tz: &jiff::tz::TimeZone, t: Timestamp) -> Option<Timestamp> {
        use jiff::tz::AmbiguousOffset;
        let wall = t.to_zoned(tz.clone()).datetime();
        let start = wall.checked_sub(TRANSITION_MAX).ok()?;
        let cursor = naive(start)?;
        let mut best: Option<(Timestamp, jiff::civil::DateTime)> = None;
        for candidate in self.inner.after(&cursor).take(100_000) {
            let civil = civil(candidate)?;
            if let Some((_, at)) = best
                && civil > at.checked_add(TRANSITION_MAX).ok()?
            {
                break;
            }
            let instants: Vec<Timestamp> = match tz.to_ambiguous_timestamp(civil).offset() {
                AmbiguousOffset::Unambiguous { offset } => {
                    offset.to_timestamp(civil).ok().into_iter().collect()
                }
                AmbiguousOffset::Gap { .. } => Vec::new(),
                AmbiguousOffset::Fold { before, after } => [before, after]
                    .into_iter()
                    .filter_map(|o| o.to_timestamp(civil).ok())
                    .collect(),
            };
            for i in instants {
                if i > t && best.is_none_or(|(b, _)| i < b) {
                    best = Some((i, civil));
                }
            }
        }
        best.map(|(b, _)| b)
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

/// The time zone of an IANA name, from the database; an error that says
/// what a good name looks like.
pub fn time_zone(name: &str) -> Result<jiff::tz::TimeZone, String> {
    jiff::tz::TimeZone::get(name).map_err(|_| {
        format!(
            "unknown time zone {name:?}: give an IANA name such as Europe/Berlin, America/New_York or UTC"
        )
    })
}

/// A wall time as the cron fields walk it: as if it were UTC's.
fn naive(wall: jiff::civil::DateTime) -> Option<DateTime<Utc>> {
    let ts = wall.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    DateTime::<Utc>::from_timestamp(ts.as_second(), 0)
}

/// The wall time a cron candidate stands for.
fn civil(candidate: DateTime<Utc>) -> Option<jiff::civil::DateTime> {
    Some(
        Timestamp::from_second(candidate.timestamp())
            .ok()?
            .to_zoned(jiff::tz::TimeZone::UTC)
            .datetime(),
    )
}

/// Schedules parsed from targets' own fields (`schedule.fromField`), by
/// expression: a policy's targets mostly share a handful, and each is
/// parsed once rather than at every decision. Bounded: past
/// [`ParsedSchedules::MAX`] expressions it starts again.
#[derive(Clone, Debug, Default)]
pub struct ParsedSchedules {
    parsed: Arc<Mutex<HashMap<String, Arc<Schedule>>>>,
    /// The time zone of expressions that name none (the policy's
    /// `timeZone`; `None`: UTC).
    zone: Option<String>,
}

impl ParsedSchedules {
    pub const MAX: usize = 1024;

    /// Expressions whose times are in `zone` unless they name their own.
    pub fn in_zone(zone: Option<String>) -> Self {
        Self {
            parsed: Arc::default(),
            zone,
        }
    }

    /// The time zone of expressions that name none.
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// The schedule for `expr`, parsed on first use; refused when it
    /// fires more often than [`MIN_TARGET_INTERVAL_SECS`]. Errors are not
    /// kept.
    pub fn get(&self, expr: &str) -> Result<Arc<Schedule>, String> {
        if let Some(s) = self.lock().get(expr) {
            return Ok(s.clone());
        }
        let parsed = Arc::new(Schedule::parse_in(expr, self.zone.as_deref())?);
        if let Some(gap) = parsed.smallest_gap_secs()
            && gap < MIN_TARGET_INTERVAL_SECS
        {
            return Err(format!(
                "schedule {:?} fires every {gap}s; a schedule written in a resource may fire at most once a minute",
                expr.trim()
            ));
        }
        let mut map = self.lock();
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(expr.to_string(), parsed.clone());
        Ok(parsed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Schedule>>> {
        crate::util::lock(&self.parsed)
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
    fn a_resources_schedule_fires_at_most_once_a_minute() {
        let parsed = ParsedSchedules::in_zone(None);
        for every_second in ["* * * * * *", "*/30 * * * * *", "0,1 * * * * *"] {
            let e = parsed.get(every_second).unwrap_err();
            assert!(e.contains("at most once a minute"), "{e}");
        }
        for fine in ["* * * * *", "0 * * * * *", "@hourly", "*/5 * * * *"] {
            assert!(parsed.get(fine).is_ok(), "{fine}");
        }
        assert_eq!(
            Schedule::parse("*/10 * * * * *")
                .unwrap()
                .smallest_gap_secs(),
            Some(10)
        );
        assert_eq!(
            Schedule::parse("0 0 1 1 *").unwrap().smallest_gap_secs(),
            Some(31_536_000)
        );
        // The CRDs' pattern refuses seconds at `kubectl apply`.
        let re = regex::Regex::new(CRON_PATTERN).unwrap();
        assert!(re.is_match("*/5 * * * *") && re.is_match("CRON_TZ=Europe/Paris 0 2 * * *"));
        assert!(!re.is_match("* * * * * *"));
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

#[cfg(test)]
mod zone_tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// Fire times after `from`, `n` of them.
    fn fires(s: &Schedule, from: &str, n: usize) -> Vec<String> {
        let mut t = at(from);
        (0..n)
            .map(|_| {
                t = s.next_after(t).unwrap();
                t.to_string()
            })
            .collect()
    }

    #[test]
    fn a_time_the_clocks_skip_does_not_fire_that_day() {
        // New York springs forward at 02:00 on 2026-03-08: no 02:30 then.
        let s = Schedule::parse_in("30 2 * * *", Some("America/New_York")).unwrap();
        assert_eq!(
            fires(&s, "2026-03-07T00:00:00Z", 3),
            [
                "2026-03-07T07:30:00Z", // 02:30 EST
                "2026-03-09T06:30:00Z", // 02:30 EDT, the day after
                "2026-03-10T06:30:00Z",
            ]
        );
    }

    #[test]
    fn a_time_the_clocks_pass_twice_fires_at_both() {
        // New York falls back at 02:00 on 2026-11-01: 01:30 comes twice.
        let s = Schedule::parse_in("30 1 * * *", Some("America/New_York")).unwrap();
        assert_eq!(
            fires(&s, "2026-10-31T12:00:00Z", 3),
            [
                "2026-11-01T05:30:00Z", // 01:30 EDT
                "2026-11-01T06:30:00Z", // 01:30 EST
                "2026-11-02T06:30:00Z",
            ]
        );
        // Asked from between the two, the second is next.
        assert_eq!(
            fires(&s, "2026-11-01T06:00:00Z", 1),
            ["2026-11-01T06:30:00Z"]
        );
    }

    #[test]
    fn a_night_time_run_stays_at_night_across_dst() {
        let s = Schedule::parse("CRON_TZ=Europe/Berlin 0 20 * * 1-5").unwrap();
        assert_eq!(s.zone(), Some("Europe/Berlin"));
        // 20:00 in Berlin: 19:00 UTC in winter, 18:00 in summer.
        assert_eq!(
            fires(&s, "2026-03-26T00:00:00Z", 1),
            ["2026-03-26T19:00:00Z"]
        );
        assert_eq!(
            fires(&s, "2026-03-30T00:00:00Z", 1),
            ["2026-03-30T18:00:00Z"]
        );
        // TZ= says the same; six fields with seconds too.
        let t = Schedule::parse("TZ=Europe/Berlin 15 0 20 * * 1-5").unwrap();
        assert_eq!(
            fires(&t, "2026-03-30T00:00:00Z", 1),
            ["2026-03-30T18:00:15Z"]
        );
        // UTC stays the default.
        let u = Schedule::parse("0 20 * * 1-5").unwrap();
        assert_eq!(u.zone(), None);
        assert_eq!(
            fires(&u, "2026-03-30T00:00:00Z", 1),
            ["2026-03-30T20:00:00Z"]
        );
    }

    #[test]
    fn zones_are_named_once_and_known() {
        let e = Schedule::parse("CRON_TZ=Europe/Berln 0 20 * * *").unwrap_err();
        assert!(e.contains("unknown time zone \"Europe/Berln\""), "{e}");
        let e =
            Schedule::parse_in("CRON_TZ=Europe/Berlin 0 20 * * *", Some("Asia/Tokyo")).unwrap_err();
        assert!(e.contains("give one"), "{e}");
        // The same zone twice is fine.
        assert!(Schedule::parse_in("CRON_TZ=Asia/Tokyo 0 20 * * *", Some("Asia/Tokyo")).is_ok());
    }
}
