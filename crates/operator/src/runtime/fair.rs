//! Each policy's fair share of the operator: how many of its decisions
//! may be under way at once, how much script time it may use per second
//! of wall clock, and how many of its scripts may run at the same moment.
//! A policy over the first two is not decided now: its target comes back
//! when the policy has room again, without holding a reconcile slot
//! meanwhile, so a slow, failing or busy policy (a tenant's script that
//! runs to its time limit on hundreds of targets) slows only itself, and
//! every other policy's targets are reconciled as if it were not there.
//! Reaching a limit is counted in
//! `runbook_policy_throttled_total{policy,limit}`.
//!
//! The limits hold while another policy has had a turn lately: a policy
//! alone takes what it needs, since nobody waits.
//!
//! Script time is a token bucket: a policy starts with a tenth of a
//! second's worth, earns `cpu_per_second` per second up to that, and
//! spends what each of its decisions took. Scripts run on the operator's
//! few threads, so at most half of them run one policy's scripts at once:
//! the others stay free for every other policy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
            concurrency: 8,
            cpu_per_second: Duration::from_millis(250),
        }
    }
}

impl FairConfig {
    /// No limit: every policy takes what it needs (a simulation, whose
    /// clock stands still while scripts run).
    pub fn unlimited() -> Self {
        Self {
            concurrency: usize::MAX,
            cpu_per_second: Duration::ZERO,
        }
    }
}

/// How long after its last turn a policy counts as wanting a share.
const ACTIVE_FOR: Duration = Duration::from_secs(1);

/// The bucket holds this part of a second's budget.
const BURST: f64 = 0.1;

/// How soon a policy at its concurrency is looked at again.
const BUSY_AGAIN: Duration = Duration::from_millis(20);

/// One policy's use of its share.
struct Share {
    running: usize,
    /// Script time it may still use, in seconds (negative: owed).
    credit: f64,
    at: Instant,
    /// Its last turn.
    turned: Instant,
    /// Its scripts running now.
    scripts: Arc<Semaphore>,
}

/// Every policy's share.
pub struct FairShare {
    config: FairConfig,
    metrics: Arc<Metrics>,
    shares: Mutex<HashMap<String, Share>>,
    /// Scripts of one policy running at once: half the threads.
    script_slots: usize,
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
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            config,
            metrics,
            shares: Mutex::default(),
            script_slots: (threads / 2).max(1),
        }
    }

    fn rate(&self) -> f64 {
        self.config.cpu_per_second.as_secs_f64()
    }

    /// A turn for `policy` now, or how long until it may have one, and why.
    pub fn take(&self, policy: &str) -> Result<Turn<'_>, (Duration, Limit)> {
        let now = Instant::now();
        let rate = self.rate();
        let cap = rate * BURST;
        let refused = {
            let mut shares = lock(&self.shares);
            let others = shares.iter().any(|(p, s)| {
                p != policy
                    && (s.running > 0 || now.saturating_duration_since(s.turned) < ACTIVE_FOR)
            });
            let scripts = self.script_slots;
            let s = shares.entry(policy.to_string()).or_insert_with(|| Share {
                running: 0,
                credit: cap,
                at: now,
                turned: now,
                scripts: Arc::new(Semaphore::new(scripts)),
            });
            let earned = now.saturating_duration_since(s.at).as_secs_f64() * rate;
            s.credit = (s.credit + earned).min(cap);
            s.at = now;
            if others && s.running >= self.config.concurrency.max(1) {
                Some((BUSY_AGAIN, Limit::Concurrency))
            } else if others && s.credit <= 0.0 && rate > 0.0 {
                // Until it has a little credit again: a twentieth of what
                // it may hold.
                let owed = -s.credit + cap / 20.0;
                Some((Duration::from_secs_f64(owed / rate), Limit::Cpu))
            } else {
                s.running += 1;
                s.turned = now;
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

    /// A place for one of `policy`'s scripts to run, once fewer than half
    /// the threads run its scripts.
    pub async fn script(&self, policy: &str) -> Option<OwnedSemaphorePermit> {
        let slots = lock(&self.shares).get(policy).map(|s| s.scripts.clone())?;
        slots.acquire_owned().await.ok()
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
        // Another policy wants its share too.
        drop(f.take("quiet").unwrap());
        // A tenth of a second's worth (10 ms), then owing: the noisy
        // policy waits until it has earned its way back; the quiet one
        // never waits.
        let t = f.take("noisy").unwrap();
        f.spent("noisy", Duration::from_millis(300));
        drop(t);
        let (wait, limit) = f.take("noisy").err().unwrap();
        assert_eq!(limit, Limit::Cpu);
        // 290 ms owed plus half a millisecond, earned at 100 ms a second.
        assert!(
            wait >= Duration::from_millis(2900) && wait <= Duration::from_millis(2910),
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
        // Alone, it takes what it needs.
        let c = f.take("p").unwrap();
        drop(c);
        // Once another policy wants a share, the limit holds.
        let _other = f.take("other").unwrap();
        assert_eq!(f.take("p").err().map(|e| e.1), Some(Limit::Concurrency));
        drop(a);
        assert!(f.take("p").is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_alone_is_not_held_to_its_script_time() {
        let f = fair(4, 100);
        drop(f.take("only").unwrap());
        f.spent("only", Duration::from_millis(900));
        assert!(f.take("only").is_ok());
        // Once another's last turn is a second old, it is alone again.
        drop(f.take("other").unwrap());
        assert!(f.take("only").is_err());
        tokio::time::advance(ACTIVE_FOR).await;
        assert!(f.take("only").is_ok());
    }
}
