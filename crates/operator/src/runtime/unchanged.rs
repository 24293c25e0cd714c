//! Deciding once per change: a target whose change touched nothing its
//! policy's last decision read is not decided again.
//!
//! Most changes of a target that wake its reconcile are not changes its
//! policy reads: its own status write coming back through the watch,
//! another policy's status fields, a label another tool sets. A decision
//! is a pure function of what it read (DESIGN section 1), so deciding
//! again on fields it never read repeats the decision, and carrying it out
//! again writes nothing. What the script read of its target is recorded
//! as it runs (`script::obj::TargetReads`); the next reconcile compares a
//! hash of those fields, and decides again only when one of them changed.
//!
//! Everything else that could change a decision makes one: a change of an
//! object the decision read (routed to the target as a trigger), a resync,
//! another policy version or mode, the time the decision asked to come
//! back at, and any decision that read the clock or the schedule, took
//! the target as a whole, read objects of its own kind, has rate limits
//! (they count over time), failed, or came from a steps policy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use serde_json::Value;

use crate::act::Acting;
use crate::observe::view::TargetKey;
use crate::util::lock;
use runbook_core::decide::Decision;
use runbook_core::policy::compile::{Body, CompiledPolicy};
use runbook_core::policy::limits::Verb;
use runbook_core::script::obj::TargetReads;

/// The last decision of one policy on one target, as far as deciding
/// again depends on it.
struct Last {
    /// The policy's name and version, hashed (`hash_of`).
    policy: u64,
    version: u64,
    /// `Context::resyncs` when it was made.
    resyncs: u64,
    reads: Arc<TargetReads>,
    /// What `reads` found in the target.
    fingerprint: u64,
    /// When the decision asked to be made again.
    requeue_at: Option<Timestamp>,
    /// `LastDecisions::woken` before it was made.
    woken: u64,
    /// What it decided (`effects`), kept when skips are checked.
    decided: Option<Arc<str>>,
}

/// What a decision comes to, as text two decisions are compared by: its
/// actions and when it asked to be made again.
pub(super) fn effects(d: &Decision) -> String {
    format!("{:?}; requeue after {:?} ms", d.actions, d.requeue_after_ms)
}

/// A 64-bit hash of a name, a version or a target.
fn hash_of(x: &(impl std::hash::Hash + ?Sized)) -> u64 {
    use std::hash::Hasher;
    let mut h = crate::util::hash::Fnv64::default();
    x.hash(&mut h);
    h.finish()
}

/// What a decision's reads found in the target, and its shard label: every
/// child the decision makes copies that label, so a target labelled for
/// another replica (after a takeover, its labels follow its decisions)
/// decides its children's labels anew, whatever the script read.
fn fingerprint(reads: &TargetReads, target: &Value) -> u64 {
    let shard = target
        .pointer("/metadata/labels")
        .and_then(|l| l.get(runbook_core::shard::SHARD_LABEL))
        .and_then(Value::as_str);
    hash_of(&(reads.fingerprint(target), shard))
}

/// The last decisions that need not be made again while nothing they read
/// changes, by target, one per policy. Kept small (it is per target):
/// names are hashed; two targets whose names hash alike would only decide
/// more, as each one's fingerprint holds its uid.
#[derive(Default)]
pub(super) struct LastDecisions(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    targets: HashMap<u64, Decisions>,
    /// Counts the wake-ups of targets (`wake`).
    woken: u64,
    /// The reads of each policy's latest decision: a policy reads the same
    /// fields of most of its targets, and they share one copy.
    reads: HashMap<String, Arc<TargetReads>>,
}

/// The last decisions on one target.
#[derive(Default)]
struct Decisions {
    last: Vec<Last>,
    /// `Inner::woken` at the target's latest wake-up: a decision made
    /// before it is made again.
    woken: u64,
}

/// Where a decision was made.
pub(super) struct Made<'a> {
    /// The target it was made on.
    pub target: &'a Value,
    /// It looked up objects of the target's own kind.
    pub reads_own_kind: bool,
    pub mode: &'a Acting,
    /// `Context::resyncs` before it was made.
    pub resyncs: u64,
    /// `LastDecisions::woken()` before it was made.
    pub woken: u64,
    pub now: Timestamp,
    /// Keep what it decided, for a check of the reconciles it lets skip.
    pub check: bool,
}

/// Whether a policy's decisions can be known to repeat from the target's
/// fields alone.
fn repeatable(p: &CompiledPolicy) -> bool {
    matches!(p.body, Body::Script { .. })
        && p.schedules.is_empty()
        && Verb::ALL.iter().all(|v| p.limits.get(*v).is_none())
}

impl LastDecisions {
    /// `Some` when deciding now would repeat the last decision of `p` on
    /// `key`, with how long after now it asked to be made again.
    pub fn repeats(
        &self,
        key: &TargetKey,
        p: &CompiledPolicy,
        target: &Value,
        mode: &Acting,
        resyncs: u64,
        now: Timestamp,
    ) -> Option<Option<i64>> {
        let inner = lock(&self.0);
        let decisions = inner.targets.get(&hash_of(key))?;
        let policy = hash_of(p.id.as_str());
        let last = decisions.last.iter().find(|l| l.policy == policy)?;
        let same = decisions.woken <= last.woken
            && last.version == hash_of(p.version.as_str())
            && *mode == Acting::Enforce
            && last.resyncs == resyncs
            && last.requeue_at.is_none_or(|at| at > now)
            && fingerprint(&last.reads, target) == last.fingerprint;
        same.then(|| {
            last.requeue_at
                .map(|at| (at.as_millisecond() - now.as_millisecond()).max(1))
        })
    }

    /// What the last decision of `p` on `key` decided, where it was kept
    /// (`Made::check`).
    pub fn decided(&self, key: &TargetKey, p: &CompiledPolicy) -> Option<Arc<str>> {
        let inner = lock(&self.0);
        let policy = hash_of(p.id.as_str());
        inner
            .targets
            .get(&hash_of(key))?
            .last
            .iter()
            .find(|l| l.policy == policy)?
            .decided
            .clone()
    }

    /// Keep a decision carried out in full, when a later one could repeat
    /// it (`None`: it failed); forget the last one otherwise.
    pub fn remember(
        &self,
        key: &TargetKey,
        p: &CompiledPolicy,
        decision: Option<&Decision>,
        made: &Made<'_>,
    ) {
        let reads = match decision {
            Some(d)
                if *made.mode == Acting::Enforce
                    && repeatable(p)
                    && d.target_reads.fields_only()
                    && !made.reads_own_kind =>
            {
                &d.target_reads
            }
            _ => return self.forget_policy(key, &p.id),
        };
        let now = made.now;
        let mut inner = lock(&self.0);
        let shared = match inner.reads.get(&p.id) {
            Some(r) if **r == *reads => r.clone(),
            _ => {
                let r = Arc::new(reads.clone());
                inner.reads.insert(p.id.clone(), r.clone());
                r
            }
        };
        let policy = hash_of(p.id.as_str());
        let last = Last {
            policy,
            version: hash_of(p.version.as_str()),
            resyncs: made.resyncs,
            fingerprint: fingerprint(reads, made.target),
            reads: shared,
            requeue_at: decision
                .and_then(|d| d.requeue_after_ms)
                .map(|ms| Timestamp::from_millisecond(now.as_millisecond() + ms).unwrap_or(now)),
            woken: made.woken,
            decided: decision
                .filter(|_| made.check)
                .map(|d| Arc::from(effects(d))),
        };
        let target = inner.targets.entry(hash_of(key)).or_default();
        target.last.retain(|l| l.policy != policy);
        // Most targets have one policy: room for one, not the four a
        // vector's first push makes.
        target.last.reserve_exact(1);
        target.last.push(last);
    }

    /// Something a decision on `key` read changed, or it was asked to be
    /// reconciled: however unchanged the target itself is, its next
    /// reconcile decides again. (A count, not a flag the next reconcile
    /// clears: one that ends before deciding, waiting for the cache to
    /// catch up, must not use the wake-up up.)
    pub fn wake(&self, key: &TargetKey) {
        let mut inner = lock(&self.0);
        inner.woken += 1;
        let n = inner.woken;
        inner.targets.entry(hash_of(key)).or_default().woken = n;
    }

    /// The count of wake-ups so far, read before a decision.
    pub fn woken(&self) -> u64 {
        lock(&self.0).woken
    }

    /// Forget the last decision of `policy` on `key`.
    pub fn forget_policy(&self, key: &TargetKey, policy: &str) {
        let policy = hash_of(policy);
        self.retain(key, |l| l.policy != policy);
    }

    fn retain(&self, key: &TargetKey, keep: impl Fn(&Last) -> bool) {
        if let Some(target) = lock(&self.0).targets.get_mut(&hash_of(key)) {
            target.last.retain(keep);
        }
    }

    /// Keep the decisions on `key` of the policies that apply to it now
    /// (one that stopped applying, its selector no longer matching, has
    /// made none since, and will decide afresh when it applies again).
    pub fn keep_only<'a>(&self, key: &TargetKey, names: impl IntoIterator<Item = &'a str>) {
        let keep: Vec<u64> = names.into_iter().map(hash_of).collect();
        self.retain(key, |l| keep.contains(&l.policy));
    }

    /// Forget every decision on `key` (no policy applies to it any more).
    pub fn forget(&self, key: &TargetKey) {
        lock(&self.0).targets.remove(&hash_of(key));
    }

    /// Keep only the decisions on the targets still `alive`.
    pub fn prune(&self, alive: &std::collections::HashSet<TargetKey>) {
        let alive: std::collections::HashSet<u64> = alive.iter().map(hash_of).collect();
        lock(&self.0).targets.retain(|k, _| alive.contains(k));
    }

    /// How many targets have a decision kept.
    pub fn len(&self) -> usize {
        lock(&self.0).targets.len()
    }
}
