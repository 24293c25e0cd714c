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
//! Decisions under way are limited where another policy targets the same
//! kind: reconciles of one kind share a queue and its slots, and a policy
//! that held them all would keep every other policy on the kind from even
//! asking for its turn. Script time is limited while another policy has
//! asked for a turn lately. A policy alone takes what it needs.
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
use runbook_core::util::lock;

/// How much of the operator one policy may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FairConfig {
    /// Decisions of one policy under way at once.
    pub concurrency: usize,
    /// Script time one policy may use per second.
    pub cpu_per_second: Duration,
    /// Scripts of one policy running at once (0: half the threads).
    pub scripts_at_once: usize,
}

impl Default for FairConfig {
    fn default() -> Self {
        Self {
            concurrency: 8,
            cpu_per_second: Duration::from_millis(100),
            scripts_at_once: 0,
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
            scripts_at_once: Semaphore::MAX_PERMITS,
        }
    }
}

/// How long after it last asked for a turn a policy counts as wanting a
/// share of the threads.
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
    /// When it last asked for a turn.
    asked: Instant,
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
    policy: &'a str,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.fair.shares).get_mut(self.policy) {
            s.running = s.running.saturating_sub(1);
        }
    }
}

impl FairShare {
    pub fn new(config: FairConfig, metrics: Arc<Metrics>) -> Self {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let script_slots = match config.scripts_at_once {
            0 => (threads / 2).max(1),
            n => n.min(Semaphore::MAX_PERMITS),
        };
        Self {
            config,
            metrics,
            shares: Mutex::default(),
            script_slots,
        }
    }

    fn rate(&self) -> f64 {
        self.config.cpu_per_second.as_secs_f64()
    }

    /// A turn for `policy` now, or how long until it may have one, and why.
    /// `kind_shared`: another policy targets the same kind.
    pub fn take<'a>(
        &'a self,
        policy: &'a str,
        kind_shared: bool,
    ) -> Result<Turn<'a>, (Duration, Limit)> {
        let now = Instant::now();
        let rate = self.rate();
        let cap = rate * BURST;
        let refused = {
            let mut shares = lock(&self.shares);
            let others = Self::others(&shares, policy, now);
            if !shares.contains_key(policy) {
                let share = Share {
                    running: 0,
                    credit: cap,
                    at: now,
                    asked: now,
                    scripts: Arc::new(Semaphore::new(self.script_slots)),
                };
                shares.insert(policy.to_string(), share);
            }
            let Some(s) = shares.get_mut(policy) else {
                return Ok(Turn { fair: self, policy });
            };
            let earned = now.saturating_duration_since(s.at).as_secs_f64() * rate;
            s.credit = (s.credit + earned).min(cap);
            s.at = now;
            s.asked = now;
            if kind_shared && s.running >= self.config.concurrency.max(1) {
                Some((BUSY_AGAIN, Limit::Concurrency))
            } else if others && s.credit <= 0.0 && rate > 0.0 {
                // Until it has a little credit again: a twentieth of what
                // it may hold.
                let owed = -s.credit + cap / 20.0;
                Some((Duration::from_secs_f64(owed / rate), Limit::Cpu))
            } else {
                s.running += 1;
                None
            }
        };
        match refused {
            None => Ok(Turn { fair: self, policy }),
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

    /// Whether a policy other than `policy` wants a share now.
    fn others(shares: &HashMap<String, Share>, policy: &str, now: Instant) -> bool {
        shares.iter().any(|(p, s)| {
            p != policy && (s.running > 0 || now.saturating_duration_since(s.asked) < ACTIVE_FOR)
        })
    }

    /// A place for one of `policy`'s scripts to run, once fewer than half
    /// the threads run its scripts; none is needed while no other policy
    /// wants a share.
    pub async fn script(&self, policy: &str) -> Option<OwnedSemaphorePermit> {
        let slots = {
            let shares = lock(&self.shares);
            if !Self::others(&shares, policy, Instant::now()) {
                return None;
            }
            shares.get(policy).map(|s| s.scripts.clone())?
        };
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
                scripts_at_once: 0,
            },
            Arc::new(Metrics::new()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_past_its_script_time_waits_and_others_do_not() {
        let f = fair(4, 100);
        // Another policy wants its share too.
        drop(f.take("quiet", true).unwrap());
        // A tenth of a second's worth (10 ms), then owing: the noisy
        // policy waits until it has earned its way back; the quiet one
        // never waits.
        let t = f.take("noisy", true).unwrap();
        f.spent("noisy", Duration::from_millis(300));
        drop(t);
        let (wait, limit) = f.take("noisy", true).err().unwrap();
        assert_eq!(limit, Limit::Cpu);
        // 290 ms owed plus half a millisecond, earned at 100 ms a second.
        assert!(
            wait >= Duration::from_millis(2900) && wait <= Duration::from_millis(2910),
            "{wait:?}"
        );
        assert!(f.take("quiet", true).is_ok());
        tokio::time::advance(wait).await;
        assert!(f.take("noisy", true).is_ok());
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
        let a = f.take("p", true).unwrap();
        let _b = f.take("p", true).unwrap();
        // Another policy on the kind needs slots too.
        assert_eq!(
            f.take("p", true).err().map(|e| e.1),
            Some(Limit::Concurrency)
        );
        // Alone on its kind, it takes what it needs.
        assert!(f.take("p", false).is_ok());
        assert!(f.take("other", true).is_ok());
        drop(a);
        assert!(f.take("p", true).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_alone_is_not_held_to_its_script_time() {
        let f = fair(4, 100);
        drop(f.take("only", true).unwrap());
        f.spent("only", Duration::from_millis(900));
        assert!(f.take("only", true).is_ok());
        // Once another last asked a second ago, it is alone again.
        drop(f.take("other", true).unwrap());
        assert!(f.take("only", true).is_err());
        tokio::time::advance(ACTIVE_FOR).await;
        assert!(f.take("only", true).is_ok());
    }
}
