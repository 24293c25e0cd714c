//! The clock decisions and the sandbox read: the real one, or a simulated
//! one that tests and `runbook simulate` move by hand.

use std::sync::{Arc, Mutex};

use jiff::{SignedDuration, Timestamp};

/// A clock that is real until it is set, then manual; or one that follows
/// tokio's clock (which a simulation pauses and advances).
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Arc<Mutex<Option<Timestamp>>>,
    /// `base` at the tokio instant `start`.
    tokio: Option<(Timestamp, tokio::time::Instant)>,
}

impl Clock {
    /// The real clock.
    pub fn real() -> Self {
        Self::default()
    }

    /// A manual clock starting at `t`.
    pub fn manual(t: Timestamp) -> Self {
        Self {
            manual: Arc::new(Mutex::new(Some(t))),
            tokio: None,
        }
    }

    /// A clock reading `base` now and moving with tokio's clock, so that
    /// timers, sleeps and this clock agree in a paused (simulated) runtime.
    pub fn tokio(base: Timestamp) -> Self {
        Self {
            manual: Arc::default(),
            tokio: Some((base, tokio::time::Instant::now())),
        }
    }

    pub fn now(&self) -> Timestamp {
        if let Some((base, start)) = self.tokio {
            let d = jiff::SignedDuration::try_from(start.elapsed())
                .unwrap_or(jiff::SignedDuration::MAX);
            return base.saturating_add(d).unwrap_or(base);
        }
        crate::util::lock(&self.manual).unwrap_or_else(Timestamp::now)
    }

    pub fn is_manual(&self) -> bool {
        self.tokio.is_some() || crate::util::lock(&self.manual).is_some()
    }

    /// Set the time (making the clock manual).
    pub fn set(&self, t: Timestamp) {
        *crate::util::lock(&self.manual) = Some(t);
    }

    /// Move a manual clock forward; a real clock becomes manual at now + d.
    pub fn advance(&self, d: std::time::Duration) {
        let mut m = crate::util::lock(&self.manual);
        let base = m.unwrap_or_else(Timestamp::now);
        let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
        *m = Some(base.saturating_add(d).unwrap_or(base));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = Clock::manual("2026-11-29T10:00:00Z".parse().unwrap());
        assert_eq!(c.now().to_string(), "2026-11-29T10:00:00Z");
        c.advance(std::time::Duration::from_secs(90));
        assert_eq!(c.now().to_string(), "2026-11-29T10:01:30Z");
        assert!(c.is_manual());
        assert!(!Clock::real().is_manual());
    }
}
