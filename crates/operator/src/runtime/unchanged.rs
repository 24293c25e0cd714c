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
use std::sync::Arc;

use jiff::Timestamp;
use serde_json::Value;

use runbook_core::decide::Decision;
use runbook_core::plan::Acting;
use runbook_core::policy::compile::{Body, CompiledPolicy};
use runbook_core::policy::limits::Verb;
use runbook_core::script::obj::TargetReads;

/// What a decision of one policy on one target is remembered by: a
/// reconcile whose memo equals the last decision's would decide the same,
/// and is not decided again. Built by [`Memo::new`] alone, for the
/// decision when it is made and for each reconcile after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Memo {
    /// The policy's version, hashed.
    version: u64,
    /// Enforced: another mode (shadow, suspended) decides every time.
    enforce: bool,
    /// `Context::resyncs`: a resync decides everything again.
    resyncs: u64,
    /// The target was woken since (an object the decision read changed,
    /// or a reconcile was asked for).
    woken: bool,
    /// The time the decision asked to be made again has come.
    due: bool,
    /// What the decision's reads find in the target, with its shard
    /// label (see `fingerprint`).
    fingerprint: u64,
}

/// What a [`Memo`] is built from.
struct MemoOf<'a> {
    policy: &'a CompiledPolicy,
    mode: &'a Acting,
    resyncs: u64,
    reads: &'a TargetReads,
    target: &'a Value,
    woken: bool,
    due: bool,
}

impl Memo {
    fn new(of: MemoOf<'_>) -> Self {
        Self {
            version: hash_of(of.policy.version.as_str()),
            enforce: *of.mode == Acting::Enforce,
            resyncs: of.resyncs,
            woken: of.woken,
            due: of.due,
            fingerprint: fingerprint(of.reads, of.target),
        }
    }
}

/// The last decision of one policy on one target, as far as deciding
/// again depends on it.
struct Last {
    /// The policy's name, hashed (`hash_of`).
    policy: u64,
    /// What it is remembered by (never woken, never due).
    memo: Memo,
    reads: Arc<TargetReads>,
    /// When the decision asked to be made again.
    requeue_at: Option<Timestamp>,
    /// The wake-up count before it was made.
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
    let mut h = runbook_core::util::hash::Fnv64::default();
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

/// The reads of each policy's latest decision: a policy reads the same
/// fields of most of its targets, and they share one copy.
#[derive(Default)]
pub(super) struct SharedReads(HashMap<String, Arc<TargetReads>>);

impl SharedReads {
    fn share(&mut self, policy: &str, reads: &TargetReads) -> Arc<TargetReads> {
        match self.0.get(policy) {
            Some(r) if **r == *reads => r.clone(),
            _ => {
                let r = Arc::new(reads.clone());
                self.0.insert(policy.to_string(), r.clone());
                r
            }
        }
    }
}

/// The last decisions on one target that need not be made again while
/// nothing they read changes, one per policy: part of the target's record
/// (`records`). Kept small; policy names are hashed.
#[derive(Default)]
pub(super) struct Decisions {
    last: Vec<Last>,
    /// The wake-up count at the target's latest wake-up (`wake`): a
    /// decision made before it is made again.
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
    /// The wake-up count (`Records::woken`) before it was made.
    pub woken: u64,
    pub now: Timestamp,
    /// Keep what it decided, for a check of the reconciles it lets skip.
    pub check: bool,
}

/// The reads a decision is remembered by, if it may be remembered at all:
/// an enforced decision, carried out in full, of a script policy with no
/// schedule and no rate limits (they count over time), that read fields of
/// its target (not the clock, not the target as a whole) and no object of
/// its own kind. `None`: the next reconcile decides again.
fn memorable<'d>(
    p: &CompiledPolicy,
    decision: Option<&'d Decision>,
    made: &Made<'_>,
) -> Option<&'d TargetReads> {
    let d = decision?;
    let repeatable = matches!(p.body, Body::Script { .. })
        && p.schedules.is_empty()
        && Verb::ALL.iter().all(|v| p.limits.get(*v).is_none());
    (*made.mode == Acting::Enforce
        && repeatable
        && d.target_reads.fields_only()
        && !made.reads_own_kind)
        .then_some(&d.target_reads)
}

/// What a reconcile compares with the last decision: the target as cached
/// now, and how the policy would act on it.
pub(super) struct Now<'a> {
    pub target: &'a Value,
    pub mode: &'a Acting,
    /// `Context::resyncs` now.
    pub resyncs: u64,
    pub now: Timestamp,
}

impl Decisions {
    /// Nothing kept: neither a decision nor a wake-up.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty() && self.woken == 0
    }

    /// Whether a decision is kept.
    pub fn any(&self) -> bool {
        !self.last.is_empty()
    }

    fn of(&self, p: &CompiledPolicy) -> Option<&Last> {
        let policy = hash_of(p.id.as_str());
        self.last.iter().find(|l| l.policy == policy)
    }

    /// `Some` when deciding now would repeat the last decision of `p`,
    /// with how long after now it asked to be made again.
    pub fn repeats(&self, p: &CompiledPolicy, now: &Now<'_>) -> Option<Option<i64>> {
        let last = self.of(p)?;
        let now_memo = Memo::new(MemoOf {
            policy: p,
            mode: now.mode,
            resyncs: now.resyncs,
            reads: &last.reads,
            target: now.target,
            woken: self.woken > last.woken,
            due: last.requeue_at.is_some_and(|at| at <= now.now),
        });
        (now_memo == last.memo).then(|| {
            last.requeue_at
                .map(|at| (at.as_millisecond() - now.now.as_millisecond()).max(1))
        })
    }

    /// What the last decision of `p` decided, where it was kept
    /// (`Made::check`).
    pub fn decided(&self, p: &CompiledPolicy) -> Option<Arc<str>> {
        self.of(p)?.decided.clone()
    }

    /// Keep a decision carried out in full, when a later one could repeat
    /// it (`None`: it failed); forget the last one otherwise.
    pub fn remember(
        &mut self,
        p: &CompiledPolicy,
        decision: Option<&Decision>,
        made: &Made<'_>,
        shared: &mut SharedReads,
    ) {
        let policy = hash_of(p.id.as_str());
        self.last.retain(|l| l.policy != policy);
        let Some(reads) = memorable(p, decision, made) else {
            return;
        };
        let now = made.now;
        let memo = Memo::new(MemoOf {
            policy: p,
            mode: made.mode,
            resyncs: made.resyncs,
            reads,
            target: made.target,
            woken: false,
            due: false,
        });
        let last = Last {
            policy,
            memo,
            reads: shared.share(&p.id, reads),
            requeue_at: decision
                .and_then(|d| d.requeue_after_ms)
                .map(|ms| Timestamp::from_millisecond(now.as_millisecond() + ms).unwrap_or(now)),
            woken: made.woken,
            decided: decision
                .filter(|_| made.check)
                .map(|d| Arc::from(effects(d))),
        };
        // Most targets have one policy: room for one, not the four a
        // vector's first push makes.
        self.last.reserve_exact(1);
        self.last.push(last);
    }

    /// Something a decision read changed, or a reconcile was asked for:
    /// `count` is the wake-up count now. However unchanged the target
    /// itself is, its next reconcile decides again. (A count, not a flag
    /// the next reconcile clears: one that ends before deciding, waiting
    /// for the cache to catch up, must not use the wake-up up.)
    pub fn wake(&mut self, count: u64) {
        self.woken = count;
    }

    /// Keep the decisions of the policies that apply to the target now
    /// (one that stopped applying, its selector no longer matching, has
    /// made none since, and will decide afresh when it applies again).
    pub fn keep_only<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let keep: Vec<u64> = names.into_iter().map(hash_of).collect();
        self.last.retain(|l| keep.contains(&l.policy));
    }

    /// Forget every decision (no policy applies to the target any more).
    pub fn clear(&mut self) {
        self.last.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runbook_core::policy::bundle::{Bundle, Origin};
    use runbook_core::script::ScriptEngine;
    use serde_json::json;

    /// A script policy on ConfigMaps, `extra` added to its spec.
    fn policy(extra: &str) -> Arc<CompiledPolicy> {
        let yaml = format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: sizer}}\nspec:\n  target: {{apiVersion: v1, kind: ConfigMap}}\n  script: sizer.rhai\n{extra}"
        );
        let script = "fn reconcile(ctx) { [] }".to_string();
        let files = [
            ("sizer.yaml".to_string(), yaml),
            ("sizer.rhai".to_string(), script),
        ]
        .into_iter()
        .collect();
        let bundle = Bundle::new(Origin::Inline("test".into()), files);
        let (set, errors) = runbook_core::policy::load(&ScriptEngine::default(), &[bundle]);
        assert!(errors.is_empty(), "{errors:?}");
        set.policies["sizer"].clone()
    }

    fn target(size: &str, shard: &str) -> Value {
        json!({"metadata": {"uid": "u1", "labels": {"runbook.dev/shard": shard}},
               "data": {"size": size, "other": "x"}})
    }

    /// A decision that read `data.size`, asking to come back in `requeue`.
    fn decision(requeue: Option<i64>) -> Decision {
        Decision {
            metrics: Vec::new(),
            policy: "sizer".into(),
            policy_version: String::new(),
            mode: Default::default(),
            actions: Vec::new(),
            requeue_after_ms: requeue,
            inputs_hash: String::new(),
            due: false,
            target_reads: TargetReads {
                whole: false,
                clock: false,
                fields: vec![("data".into(), Some("size".into()))],
            },
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// The memory after `d` was remembered on `target` at second 0.
    fn remembered(p: &CompiledPolicy, d: &Decision, target: &Value) -> Decisions {
        let mut last = Decisions::default();
        let made = Made {
            target,
            reads_own_kind: false,
            mode: &Acting::Enforce,
            resyncs: 1,
            woken: 0,
            now: at(0),
            check: false,
        };
        last.remember(p, Some(d), &made, &mut SharedReads::default());
        last
    }

    /// Whether deciding `p` on `target` now would repeat the last decision.
    fn repeats(
        last: &Decisions,
        p: &CompiledPolicy,
        target: &Value,
        mode: &Acting,
        resyncs: u64,
        now: Timestamp,
    ) -> Option<Option<i64>> {
        last.repeats(
            p,
            &Now {
                target,
                mode,
                resyncs,
                now,
            },
        )
    }

    #[test]
    fn an_unchanged_read_repeats_until_the_requeue_time() {
        let p = policy("");
        let t = target("2", "r0");
        let last = remembered(&p, &decision(Some(60_000)), &t);
        assert_eq!(
            repeats(&last, &p, &t, &Acting::Enforce, 1, at(10)),
            Some(Some(50_000))
        );
        // A field the decision did not read changes nothing.
        let mut other = t.clone();
        other["data"]["other"] = json!("y");
        assert!(repeats(&last, &p, &other, &Acting::Enforce, 1, at(10)).is_some());
        // The time it asked to come back at has come.
        assert_eq!(repeats(&last, &p, &t, &Acting::Enforce, 1, at(60)), None);
    }

    #[test]
    fn each_input_of_the_memo_decides_again() {
        let p = policy("");
        let t = target("2", "r0");
        let mut last = remembered(&p, &decision(None), &t);
        let repeats = |last: &Decisions, p: &CompiledPolicy, t: &Value, mode: &Acting, r: u64| {
            repeats(last, p, t, mode, r, at(10)).is_some()
        };
        assert!(repeats(&last, &p, &t, &Acting::Enforce, 1));
        // A field it read.
        assert!(!repeats(&last, &p, &target("3", "r0"), &Acting::Enforce, 1));
        // The shard label (its children copy it).
        assert!(!repeats(&last, &p, &target("2", "r1"), &Acting::Enforce, 1));
        // Another mode.
        assert!(!repeats(&last, &p, &t, &Acting::Shadow, 1));
        // A resync.
        assert!(!repeats(&last, &p, &t, &Acting::Enforce, 2));
        // Another version of the policy.
        let edited = policy("  params: {x: 1}\n");
        assert_ne!(edited.version, p.version);
        assert!(!repeats(&last, &edited, &t, &Acting::Enforce, 1));
        // A wake-up of the target (something it read changed).
        last.wake(1);
        assert!(!repeats(&last, &p, &t, &Acting::Enforce, 1));
    }

    #[test]
    fn what_cannot_repeat_is_not_remembered() {
        let t = target("2", "r0");
        let check = |p: &CompiledPolicy, d: Option<&Decision>, own_kind: bool, mode: &Acting| {
            let mut last = Decisions::default();
            let made = Made {
                target: &t,
                reads_own_kind: own_kind,
                mode,
                resyncs: 1,
                woken: 0,
                now: at(0),
                check: false,
            };
            last.remember(p, d, &made, &mut SharedReads::default());
            repeats(&last, p, &t, mode, 1, at(1)).is_some()
        };
        let p = policy("");
        let d = decision(None);
        assert!(check(&p, Some(&d), false, &Acting::Enforce));
        // A failed decision, one that read its own kind, one not enforced.
        assert!(!check(&p, None, false, &Acting::Enforce));
        assert!(!check(&p, Some(&d), true, &Acting::Enforce));
        assert!(!check(&p, Some(&d), false, &Acting::Shadow));
        // One that read the clock, or the target as a whole.
        let mut clock = decision(None);
        clock.target_reads.clock = true;
        assert!(!check(&p, Some(&clock), false, &Acting::Enforce));
        let mut whole = decision(None);
        whole.target_reads.whole = true;
        assert!(!check(&p, Some(&whole), false, &Acting::Enforce));
        // A policy with a schedule, or with rate limits.
        let scheduled = policy("  schedule: {cron: \"@hourly\"}\n");
        assert!(!check(&scheduled, Some(&d), false, &Acting::Enforce));
        let limited =
            policy("  owns: [{apiVersion: v1, kind: Secret}]\n  limits: {delete: 1/1h}\n");
        assert!(!check(&limited, Some(&d), false, &Acting::Enforce));
    }
}
