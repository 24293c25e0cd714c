//! Each policy's fair share of the operator: how many of its decisions
//! may be under way at once, and how much script time it may use per
//! second of wall clock. A policy over either is not decided now: its
//! target comes back when the policy has room again, without holding a
//! reconcile slot meanwhile, so a slow, failing or busy policy (a tenant's
//! script that runs to its time limit on hundreds of targets) slows only
//! itself, and every other policy's targets are reconciled as if it were
//! not there. Reaching a limit is counted in
//! `runbook_policy_throttled_total{policy,limit}`.
//!
//! Script time is a token bucket: a policy starts with a second's worth,
//! earns `cpu_per_second` per second up to that, and spends what each of
//! its decisions took.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::telemetry::Metrics;
use crate::util::lock;

/// How much of the operator one policy may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FairConfig {
    /// Decisions of one policy under way at once.
    pub concurrency: usize,
    /// Script time one policy may use per second.
    pub cpu_per_second: Duration,
}

impl Default for FairConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            cpu_per_second: Duration::from_millis(250),
        }
    }
}

/// How soon a policy at its concurrency is looked at again.
const BUSY_AGAIN: Duration = Duration::from_millis(20);

/// One policy's use of its share.
struct Share {
    running: usize,
    /// Script time it may still use, in seconds (negative: owed).
    credit: f64,
    at: Instant,
}

/// Every policy's share.
pub struct FairShare {
    config: FairConfig,
    metrics: Arc<Metrics>,
    shares: Mutex<HashMap<String, Share>>,
}

/// Why a policy waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Concurrency,
    Cpu,
}

impl Limit {
    pub fn label(self) -> &'static str {
        match self {
            Limit::Concurrency => "concurrency",
            Limit::Cpu => "cpu",
        }
    }
}

/// A decision of a policy under way; its place is given back on drop.
pub struct Turn<'a> {
    fair: &'a FairShare,
    policy: String,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.fair.shares).get_mut(&self.policy) {
            s.running = s.running.saturating_sub(1);
        }
    }
}

impl FairShare {
    pub fn new(config: FairConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            config,
            metrics,
            shares: Mutex::default(),
        }
    }

    fn rate(&self) -> f64 {
        self.config.cpu_per_second.as_secs_f64()
    }

    /// A turn for `policy` now, or how long until it may have one, and why.
    pub fn take(&self, policy: &str) -> Result<Turn<'_>, (Duration, Limit)> {
        let now = Instant::now();
        let rate = self.rate();
        let refused = {
            let mut shares = lock(&self.shares);
            let s = shares.entry(policy.to_string()).or_insert(Share {
                running: 0,
                credit: rate,
                at: now,
            });
            let earned = now.saturating_duration_since(s.at).as_secs_f64() * rate;
            s.credit = (s.credit + earned).min(rate);
            s.at = now;
            if s.running >= self.config.concurrency.max(1) {
                Some((BUSY_AGAIN, Limit::Concurrency))
            } else if s.credit <= 0.0 && rate > 0.0 {
                // Until it has a little credit again: a twentieth of what
                // it earns in a second.
                let owed = -s.credit + rate / 20.0;
                Some((Duration::from_secs_f64(owed / rate), Limit::Cpu))
            } else {
                s.running += 1;
                None
            }
        };
        match refused {
            None => Ok(Turn {
                fair: self,
                policy: policy.to_string(),
            }),
            Some((wait, limit)) => {
                self.metrics
                    .policy_throttled
                    .get_or_create(&Metrics::labels(&[
                        ("policy", policy),
                        ("limit", limit.label()),
                    ]))
                    .inc();
                Err((wait, limit))
            }
        }
    }

    /// `policy`'s script ran for `took`.
    pub fn spent(&self, policy: &str, took: Duration) {
        if let Some(s) = lock(&self.shares).get_mut(policy) {
            s.credit -= took.as_secs_f64();
        }
    }

    /// Forget the policies no longer loaded.
    pub fn retain(&self, loaded: impl Fn(&str) -> bool) {
        lock(&self.shares).retain(|p, s| s.running > 0 || loaded(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fair(concurrency: usize, ms: u64) -> FairShare {
        FairShare::new(
            FairConfig {
                concurrency,
                cpu_per_second: Duration::from_millis(ms),
            },
            Arc::new(Metrics::new()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_past_its_script_time_waits_and_others_do_not() {
        let f = fair(4, 100);
        // A second's worth, then owing: the noisy policy waits until it
        // has earned its way back; the quiet one never waits.
        let t = f.take("noisy").unwrap();
        f.spent("noisy", Duration::from_millis(300));
        drop(t);
        let (wait, limit) = f.take("noisy").err().unwrap();
        assert_eq!(limit, Limit::Cpu);
        assert!(
            wait >= Duration::from_millis(2000) && wait <= Duration::from_millis(2100),
            "{wait:?}"
        );
        assert!(f.take("quiet").is_ok());
        tokio::time::advance(wait).await;
        assert!(f.take("noisy").is_ok());
        let throttled = f
            .metrics
            .policy_throttled
            .get_or_create(&Metrics::labels(&[("policy", "noisy"), ("limit", "cpu")]))
            .get();
        assert_eq!(throttled, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_at_its_concurrency_waits_until_a_turn_ends() {
        let f = fair(2, 1000);
        let a = f.take("p").unwrap();
        let _b = f.take("p").unwrap();
        assert_eq!(f.take("p").err().map(|e| e.1), Some(Limit::Concurrency));
        assert!(f.take("other").is_ok());
        drop(a);
        assert!(f.take("p").is_ok());
    }
}
