//! Blast-radius limits, in one place: how many rollbacks, deletes, patches
//! and applies a policy may make per target in a window (counted from the
//! times its decision record keeps), and the circuit breaker that suspends
//! a policy's writes while its reconciles keep failing.
//!
//! The decision reads them (`ctx.allowed(verb)`), the executor holds an
//! action past its limit and records the ones it makes: both through
//! [`Recent`], so they can never count differently.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use jiff::Timestamp;
use serde_json::Value;

use crate::util::time::{self, parse_duration_ms};

pub use crate::script::action::Verb;

/// `N/duration`: at most N actions per target in the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub count: u32,
    pub per_ms: i64,
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.count,
            crate::util::time::render_duration_ms(self.per_ms)
        )
    }
}

impl RateLimit {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (n, d) = text.split_once('/').ok_or_else(|| {
            format!("{text:?}: a limit is written count/window, such as \"1/6h\"")
        })?;
        let count: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("{text:?}: {n:?} is not a count"))?;
        let per_ms = parse_duration_ms(d)?;
        if per_ms <= 0 {
            return Err(format!("{text:?}: the window must be positive"));
        }
        Ok(Self { count, per_ms })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CircuitBreaker {
    pub error_rate: f64,
    pub window_ms: i64,
    pub min_requests: u32,
    pub cooldown_ms: i64,
}

/// Blast-radius limits, compiled.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompiledLimits {
    pub rollback: Option<RateLimit>,
    pub delete: Option<RateLimit>,
    pub patch: Option<RateLimit>,
    pub apply: Option<RateLimit>,
    pub circuit_breaker: Option<CircuitBreaker>,
}

impl CompiledLimits {
    /// The limit for a verb, if any.
    pub fn get(&self, verb: Verb) -> Option<RateLimit> {
        match verb {
            Verb::Rollback => self.rollback,
            Verb::Delete => self.delete,
            Verb::Patch => self.patch,
            Verb::Apply => self.apply,
        }
    }

    /// The slot of a verb's limit, to fill when compiling.
    pub fn slot(&mut self, verb: Verb) -> &mut Option<RateLimit> {
        match verb {
            Verb::Rollback => &mut self.rollback,
            Verb::Delete => &mut self.delete,
            Verb::Patch => &mut self.patch,
            Verb::Apply => &mut self.apply,
        }
    }
}

/// The limited actions a target's decision record says were made, and
/// when: what the limits count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recent(BTreeMap<Verb, Vec<Timestamp>>);

impl Recent {
    /// Read from the `recentActions` of `policy`'s decision record on a
    /// target.
    pub fn of(target: &Value, policy: &str) -> Self {
        let mut out = BTreeMap::new();
        // Read in place: a reconcile asks three times, and the rest of
        // the record is not needed for it.
        let recent =
            crate::crd::DecisionRecord::raw_of(target, policy).and_then(|r| r.get("recentActions"));
        for verb in Verb::ALL {
            let times: Vec<Timestamp> = recent
                .and_then(|r| r.get(verb.as_str()))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().and_then(time::parse))
                .collect();
            if !times.is_empty() {
                out.insert(verb, times);
            }
        }
        Self(out)
    }

    /// How many `verb` actions fall inside its limit's window at `now`.
    pub fn used(&self, limits: &CompiledLimits, verb: Verb, now: Timestamp) -> usize {
        let Some(limit) = limits.get(verb) else {
            return 0;
        };
        let since = now.as_millisecond() - limit.per_ms;
        self.0
            .get(&verb)
            .into_iter()
            .flatten()
            .filter(|t| t.as_millisecond() > since)
            .count()
    }

    /// Whether the limit for `verb` allows one more at `now`.
    pub fn allows(&self, limits: &CompiledLimits, verb: Verb, now: Timestamp) -> bool {
        limits
            .get(verb)
            .is_none_or(|l| self.used(limits, verb, now) < l.count as usize)
    }

    /// A limited action was made at `now` (an unlimited one is not kept).
    pub fn note(&mut self, limits: &CompiledLimits, verb: Verb, now: Timestamp) {
        if limits.get(verb).is_some() {
            self.0.entry(verb).or_default().push(now);
        }
    }

    /// What the decision record keeps: the actions still inside their
    /// limit's window at `now`, by verb.
    pub fn to_record(
        &self,
        limits: &CompiledLimits,
        now: Timestamp,
    ) -> BTreeMap<String, Vec<String>> {
        let mut out = BTreeMap::new();
        for (verb, times) in &self.0 {
            let Some(limit) = limits.get(*verb) else {
                continue;
            };
            let since = now.as_millisecond() - limit.per_ms;
            let kept: Vec<String> = times
                .iter()
                .filter(|t| t.as_millisecond() > since)
                .map(|t| time::format(*t))
                .collect();
            if !kept.is_empty() {
                out.insert(verb.to_string(), kept);
            }
        }
        out
    }
}

/// The circuit breaker's state for one policy: the outcomes inside its
/// window, and until when it is open.
#[derive(Default)]
pub struct Breaker {
    window: VecDeque<(i64, bool)>,
    open_until: Option<i64>,
}

impl Breaker {
    pub fn open(&mut self, cfg: &CircuitBreaker, now_ms: i64) -> Option<String> {
        match self.open_until {
            Some(t) if now_ms < t => Some(format!(
                "writes suspended by the circuit breaker for {} more (error rate above {:.0}%)",
                crate::util::time::render_duration_ms(t - now_ms),
                cfg.error_rate * 100.0
            )),
            Some(_) => {
                self.open_until = None;
                self.window.clear();
                None
            }
            None => None,
        }
    }

    pub fn record(&mut self, cfg: &CircuitBreaker, now_ms: i64, failed: bool) {
        self.window.push_back((now_ms, failed));
        while self
            .window
            .front()
            .is_some_and(|(t, _)| *t < now_ms - cfg.window_ms)
        {
            self.window.pop_front();
        }
        let n = self.window.len();
        let failures = self.window.iter().filter(|(_, f)| *f).count();
        if n >= cfg.min_requests as usize && failures as f64 / n as f64 >= cfg.error_rate {
            self.open_until = Some(now_ms + cfg.cooldown_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cb() -> CircuitBreaker {
        CircuitBreaker {
            error_rate: 0.5,
            window_ms: 60_000,
            min_requests: 4,
            cooldown_ms: 30_000,
        }
    }

    #[test]
    fn the_breaker_opens_when_errors_spike_and_closes_after_its_cooldown() {
        let mut b = Breaker::default();
        let cfg = cb();
        for (t, failed) in [(0, true), (1, false), (2, true)] {
            b.record(&cfg, t, failed);
        }
        assert!(b.open(&cfg, 3).is_none(), "too few reconciles to judge");
        b.record(&cfg, 3, true);
        let why = b.open(&cfg, 4).expect("3 of 4 failed");
        assert!(why.contains("suspended"), "{why}");
        assert!(b.open(&cfg, 30_004).is_none(), "closed after the cooldown");
    }

    fn limits() -> CompiledLimits {
        CompiledLimits {
            rollback: Some(RateLimit::parse("1/6h").unwrap()),
            ..Default::default()
        }
    }

    #[test]
    fn a_limit_counts_the_recorded_actions_inside_its_window() {
        let at = |s: &str| time::parse(s).unwrap();
        let target = json!({"status": {"decisions": [
            {"policy": "other", "policyVersion": "v", "inputsHash": "h",
             "recentActions": {"rollback": ["2026-11-29T12:00:00Z"]}},
            {"policy": "p", "policyVersion": "v", "inputsHash": "h", "recentActions": {
            "rollback": ["2026-11-29T10:00:00Z"], "delete": ["2026-11-29T10:00:00Z"]}}]}});
        let recent = Recent::of(&target, "p");
        let l = limits();
        assert!(!recent.allows(&l, Verb::Rollback, at("2026-11-29T15:59:59Z")));
        assert!(recent.allows(&l, Verb::Rollback, at("2026-11-29T16:00:00Z")));
        assert!(
            recent.allows(&l, Verb::Delete, at("2026-11-29T10:00:01Z")),
            "no limit"
        );
        // Only limited actions inside the window are kept.
        let mut r = recent.clone();
        r.note(&l, Verb::Apply, at("2026-11-29T12:00:00Z"));
        r.note(&l, Verb::Rollback, at("2026-11-29T12:00:00Z"));
        assert_eq!(
            serde_json::to_value(r.to_record(&l, at("2026-11-29T17:00:00Z"))).unwrap(),
            json!({"rollback": ["2026-11-29T12:00:00Z"]})
        );
    }
}
