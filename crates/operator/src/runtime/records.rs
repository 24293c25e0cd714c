//! What the runtime remembers of each target between its reconciles that
//! the cache cannot tell, one record per target behind one lock and these
//! methods: its last decisions (`unchanged`), what they looked up (the
//! objects whose changes wake it), its failures in a row (the backoff),
//! and the status and Runbook state this process wrote that the cache may
//! not show yet. A record with nothing in it is dropped at once, and
//! [`Records::retain`] drops those of targets gone.
//!
//! Beside the records, and kept with them, is the index of who read what:
//! for each object looked up, the targets whose decisions did.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::time::Instant;

use super::unchanged::{Decisions, Made, Now, SharedReads};
use crate::observe::view::{AccessKey, CHILDREN, ReadLog, TargetKey};
use runbook_core::decide::Decision;
use runbook_core::kinds::KindRef;
use runbook_core::policy::compile::CompiledPolicy;
use runbook_core::util::lock;

/// What failed on a target, for its backoff: one of its policies, or the
/// reconcile itself before any decided (discovery, a finalizer, a panic).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Failing {
    Policy(String),
    Reconcile,
}

/// A status write of this process: the resourceVersions of the target it
/// replaced (one per policy that wrote), and when.
pub(super) type StatusWrite = (Vec<String>, Instant);

/// Runbook's state of a target as this process wrote it, with the
/// resourceVersion it replaced (`None`: it made it).
pub(super) type StateWrite = (Option<String>, Arc<Value>);

/// One target's record. Its last decisions are what most targets keep
/// for good; everything else (a status write, there for a moment after
/// each decision that wrote; reads, failures, a state write) is kept
/// apart, so that a record costs its decisions and a pointer.
#[derive(Default)]
struct Record {
    decisions: Decisions,
    rare: Option<Box<Rare>>,
}

/// The rarer part of a record.
struct Rare {
    /// The target: records are found by a hash of it, and what the rare
    /// part holds is another target's should two hash alike.
    key: TargetKey,
    /// Failed reconciles in a row, by what failed.
    failures: Vec<(Failing, u32)>,
    status: Option<StatusWrite>,
    state: Option<StateWrite>,
    /// What the last decision of each policy looked up.
    reads: Reads,
}

/// What each policy's last decision on a target looked up, by policy
/// name. Few policies with few reads each: sorted vectors, as a hash map
/// of one entry costs hundreds of bytes and most targets have one.
#[derive(Default)]
struct Reads(Vec<(String, Vec<AccessKey>)>);

impl Reads {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn all(&self) -> impl Iterator<Item = &AccessKey> {
        self.0.iter().flat_map(|(_, keys)| keys)
    }

    /// Take `policy`'s reads out (none: empty).
    fn take(&mut self, policy: &str) -> Vec<AccessKey> {
        match self.0.iter().position(|(p, _)| p == policy) {
            Some(i) => self.0.swap_remove(i).1,
            None => Vec::new(),
        }
    }

    /// `policy`'s reads are `keys` (sorted, each once, not empty).
    fn put(&mut self, policy: &str, mut keys: Vec<AccessKey>) {
        keys.shrink_to_fit();
        self.0.reserve_exact(1);
        self.0.push((policy.to_string(), keys));
    }

    /// One more read of `policy`: whether it is new.
    fn add(&mut self, policy: &str, key: &AccessKey) -> bool {
        let keys = match self.0.iter().position(|(p, _)| p == policy) {
            Some(i) => &mut self.0[i].1,
            None => {
                self.0.reserve_exact(1);
                self.0.push((policy.to_string(), Vec::new()));
                let last = self.0.len() - 1;
                &mut self.0[last].1
            }
        };
        match keys.binary_search(key) {
            Ok(_) => false,
            Err(at) => {
                keys.insert(at, key.clone());
                true
            }
        }
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

impl Rare {
    fn new(key: &TargetKey) -> Self {
        Self {
            key: key.clone(),
            failures: Vec::new(),
            status: None,
            state: None,
            reads: Reads::default(),
        }
    }

    fn is_empty(&self) -> bool {
        self.failures.is_empty()
            && self.status.is_none()
            && self.state.is_none()
            && self.reads.is_empty()
    }
}

impl Record {
    fn is_empty(&self) -> bool {
        self.decisions.is_empty() && self.rare.is_none()
    }

    /// The rarer part of `key`'s record, if it has one.
    fn rare(&self, key: &TargetKey) -> Option<&Rare> {
        self.rare.as_deref().filter(|r| r.key == *key)
    }

    /// The rarer part of `key`'s record, made if missing (or if it held
    /// another target's, whose reads leave the index).
    fn rare_mut(&mut self, key: &TargetKey, readers: &mut Readers) -> &mut Rare {
        if let Some(other) = self.rare.take_if(|r| r.key != *key) {
            readers.unread_all(&other);
        }
        self.rare.get_or_insert_with(|| Box::new(Rare::new(key)))
    }

    /// Drop the rarer part once nothing is in it.
    fn tidy(&mut self) {
        if self.rare.as_ref().is_some_and(|r| r.is_empty()) {
            self.rare = None;
        }
    }
}

/// For each object looked up, the targets whose decisions did and how
/// many of their policies.
#[derive(Default)]
struct Readers(HashMap<AccessKey, HashMap<TargetKey, usize>>);

impl Readers {
    fn read(&mut self, key: &AccessKey, target: &TargetKey) {
        *self
            .0
            .entry(key.clone())
            .or_default()
            .entry(target.clone())
            .or_default() += 1;
    }

    fn unread(&mut self, key: &AccessKey, target: &TargetKey) {
        let Some(targets) = self.0.get_mut(key) else {
            return;
        };
        if let Some(n) = targets.get_mut(target) {
            *n -= 1;
            if *n == 0 {
                targets.remove(target);
            }
        }
        if targets.is_empty() {
            self.0.remove(key);
        }
    }

    /// Take every read of a record's rare part out of the index.
    fn unread_all(&mut self, rare: &Rare) {
        for k in rare.reads.all() {
            self.unread(k, &rare.key);
        }
    }
}

/// The records' map is keyed by a keyed hash already: it is used as it
/// is, not hashed again.
#[derive(Clone, Copy, Default)]
struct Prehashed;

impl std::hash::BuildHasher for Prehashed {
    type Hasher = PrehashedHasher;
    fn build_hasher(&self) -> PrehashedHasher {
        PrehashedHasher(0)
    }
}

#[derive(Default)]
struct PrehashedHasher(u64);

impl std::hash::Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; anything else is folded in.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The records of every target, and the index of their reads.
pub(super) struct Records(Mutex<Inner>);

struct Inner {
    /// Hashes target keys, with a key of its own: no tenant can pick names
    /// that hash alike on purpose.
    hasher: std::hash::RandomState,
    targets: HashMap<u64, Record, Prehashed>,
    readers: Readers,
    /// Counts the wake-ups of targets (`wake`).
    woken: u64,
    shared: SharedReads,
}

impl Default for Records {
    fn default() -> Self {
        Self(Mutex::new(Inner {
            hasher: std::hash::RandomState::new(),
            targets: HashMap::default(),
            readers: Readers::default(),
            woken: 0,
            shared: SharedReads::default(),
        }))
    }
}

/// The parts of the store a change of one record may reach.
struct Reach<'a> {
    readers: &'a mut Readers,
    woken: &'a mut u64,
    shared: &'a mut SharedReads,
}

impl Records {
    /// Change `key`'s record with `f`, dropping it if left empty.
    fn with<R>(&self, key: &TargetKey, f: impl FnOnce(&mut Record, Reach<'_>) -> R) -> R {
        let mut all = lock(&self.0);
        let inner = &mut *all;
        let h = inner.hasher.hash_one(key);
        let reach = Reach {
            readers: &mut inner.readers,
            woken: &mut inner.woken,
            shared: &mut inner.shared,
        };
        // Most calls find the record, or leave none: a new one is kept
        // only when something was put in it.
        match inner.targets.get_mut(&h) {
            Some(record) => {
                let out = f(record, reach);
                record.tidy();
                if record.is_empty() {
                    inner.targets.remove(&h);
                }
                out
            }
            None => {
                let mut record = Record::default();
                let out = f(&mut record, reach);
                record.tidy();
                if !record.is_empty() {
                    inner.targets.insert(h, record);
                }
                out
            }
        }
    }

    /// Read `key`'s record, if it has one.
    fn get<R>(&self, key: &TargetKey, f: impl FnOnce(&Record) -> Option<R>) -> Option<R> {
        let all = lock(&self.0);
        all.targets.get(&all.hasher.hash_one(key)).and_then(f)
    }

    /// One more failure of `failing` on `key` in a row: how many now.
    pub fn failed(&self, key: &TargetKey, failing: Failing) -> u32 {
        self.with(key, |r, reach| {
            let failures = &mut r.rare_mut(key, reach.readers).failures;
            match failures.iter_mut().find(|(f, _)| *f == failing) {
                Some((_, n)) => {
                    *n = n.saturating_add(1);
                    *n
                }
                None => {
                    failures.push((failing, 1));
                    1
                }
            }
        })
    }

    /// `failing` succeeded on `key`: its backoff starts over.
    pub fn succeeded(&self, key: &TargetKey, failing: &Failing) {
        self.with(key, |r, _| {
            if let Some(rare) = r.rare.as_mut().filter(|r| r.key == *key) {
                rare.failures.retain(|(f, _)| f != failing);
            }
        });
    }

    /// This process wrote `key`'s status.
    pub fn wrote_status(&self, key: &TargetKey, write: StatusWrite) {
        self.with(key, |r, reach| {
            r.rare_mut(key, reach.readers).status = Some(write)
        });
    }

    /// The status write of `key` the cache may not show yet.
    pub fn status_written(&self, key: &TargetKey) -> Option<StatusWrite> {
        self.get(key, |r| r.rare(key)?.status.clone())
    }

    /// The cache shows `key`'s status write (or no longer matters).
    pub fn status_settled(&self, key: &TargetKey) {
        self.with(key, |r, _| {
            if let Some(rare) = r.rare.as_mut().filter(|r| r.key == *key) {
                rare.status = None;
            }
        });
    }

    /// This process wrote Runbook's state of `key`.
    pub fn wrote_state(&self, key: &TargetKey, write: StateWrite) {
        self.with(key, |r, reach| {
            r.rare_mut(key, reach.readers).state = Some(write)
        });
    }

    /// The state write of `key` the cache may not show yet.
    pub fn state_written(&self, key: &TargetKey) -> Option<StateWrite> {
        self.get(key, |r| r.rare(key)?.state.clone())
    }

    /// The cache shows `key`'s state write.
    pub fn state_settled(&self, key: &TargetKey) {
        self.with(key, |r, _| {
            if let Some(rare) = r.rare.as_mut().filter(|r| r.key == *key) {
                rare.state = None;
            }
        });
    }

    /// What `policy`'s last decision on `target` looked up: these, in
    /// place of what it looked up before.
    pub fn read_by(&self, target: &TargetKey, policy: &str, reads: Vec<AccessKey>) {
        let mut new = reads;
        new.sort();
        new.dedup();
        self.with(target, |r, reach| {
            let had = r.rare.as_ref().is_some_and(|x| x.key == *target);
            if new.is_empty() && !had {
                return;
            }
            let rare = r.rare_mut(target, reach.readers);
            let old = rare.reads.take(policy);
            for k in old.iter().filter(|k| new.binary_search(k).is_err()) {
                reach.readers.unread(k, target);
            }
            for k in new.iter().filter(|k| old.binary_search(k).is_err()) {
                reach.readers.read(k, target);
            }
            if !new.is_empty() {
                rare.reads.put(policy, new);
            }
        });
    }

    /// No policy applies to `key` any more: forget its decisions and what
    /// they looked up.
    pub fn no_policy_applies(&self, key: &TargetKey) {
        self.with(key, |r, reach| {
            r.decisions.clear();
            if let Some(rare) = r.rare.as_mut().filter(|r| r.key == *key) {
                reach.readers.unread_all(rare);
                rare.reads.clear();
            }
        });
    }

    /// Whether a decision on `owner` looked up its children of `kind`.
    pub fn reads_children(&self, owner: &TargetKey, kind: &KindRef) -> bool {
        let at =
            runbook_core::observe::acting_namespace_of(&owner.kind, &owner.namespace, &owner.name);
        let key = AccessKey {
            kind: kind.clone(),
            namespace: at.to_string(),
            name: Some(CHILDREN.to_string()),
        };
        lock(&self.0)
            .readers
            .0
            .get(&key)
            .is_some_and(|targets| targets.contains_key(owner))
    }

    /// The targets whose last decisions looked up this object, by name or
    /// by listing its namespace.
    pub fn readers_of(&self, kind: &KindRef, namespace: &str, name: &str) -> Vec<TargetKey> {
        let exact = AccessKey {
            kind: kind.clone(),
            namespace: namespace.to_string(),
            name: Some(name.to_string()),
        };
        let all = AccessKey {
            name: None,
            ..exact.clone()
        };
        let inner = lock(&self.0);
        let mut out: Vec<TargetKey> = [exact, all]
            .iter()
            .filter_map(|k| inner.readers.0.get(k))
            .flat_map(|targets| targets.keys().cloned())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The wake-up count, read before a decision (`Made::woken`).
    pub fn woken(&self) -> u64 {
        lock(&self.0).woken
    }

    /// Something a decision on `key` read changed, or it was asked to be
    /// reconciled: its next reconcile decides again.
    pub fn wake(&self, key: &TargetKey) {
        self.with(key, |r, reach| {
            *reach.woken += 1;
            r.decisions.wake(*reach.woken);
        });
    }

    /// `Some` when deciding `p` on `key` now would repeat its last
    /// decision there, with how long after now it asked to be made again.
    pub fn repeats(
        &self,
        key: &TargetKey,
        p: &CompiledPolicy,
        now: &Now<'_>,
    ) -> Option<Option<i64>> {
        self.get(key, |r| r.decisions.repeats(p, now))
    }

    /// What the last decision of `p` on `key` decided, where it was kept.
    pub fn decided(&self, key: &TargetKey, p: &CompiledPolicy) -> Option<Arc<str>> {
        self.get(key, |r| r.decisions.decided(p))
    }

    /// Keep `p`'s decision on `key`, when a later one could repeat it.
    pub fn remember(
        &self,
        key: &TargetKey,
        p: &CompiledPolicy,
        decision: Option<&Decision>,
        made: &Made<'_>,
    ) {
        self.with(key, |r, reach| {
            r.decisions.remember(p, decision, made, reach.shared)
        });
    }

    /// Keep the decisions on `key` of these policies only.
    pub fn keep_only<'a>(&self, key: &TargetKey, names: impl IntoIterator<Item = &'a str>) {
        self.with(key, |r, _| r.decisions.keep_only(names));
    }

    /// Keep the records of the targets `alive` only.
    pub fn retain(&self, alive: &HashSet<TargetKey>) {
        let mut all = lock(&self.0);
        let inner = &mut *all;
        let alive: HashSet<u64> = alive.iter().map(|k| inner.hasher.hash_one(k)).collect();
        let readers = &mut inner.readers;
        inner.targets.retain(|h, r| {
            let keep = alive.contains(h);
            if let Some(rare) = r.rare.as_deref().filter(|_| !keep) {
                readers.unread_all(rare);
            }
            keep
        });
    }

    /// How many targets have something of each kind remembered, by kind.
    pub fn counts(&self) -> [(&'static str, usize); 5] {
        let all = lock(&self.0);
        let count = |f: fn(&Record) -> bool| all.targets.values().filter(|r| f(r)).count();
        [
            (
                "deps",
                count(|r| r.rare.as_ref().is_some_and(|x| !x.reads.is_empty())),
            ),
            ("last", count(|r| r.decisions.any())),
            (
                "written",
                count(|r| r.rare.as_ref().is_some_and(|x| x.status.is_some())),
            ),
            (
                "states",
                count(|r| r.rare.as_ref().is_some_and(|x| x.state.is_some())),
            ),
            (
                "failures",
                count(|r| r.rare.as_ref().is_some_and(|x| !x.failures.is_empty())),
            ),
        ]
    }

    /// Targets with a record.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.0).targets.len()
    }
}

impl ReadLog for Records {
    /// One more read of `policy`'s decision on `target`, until its next
    /// `read_by`.
    fn read(&self, target: &TargetKey, policy: &str, key: AccessKey) {
        self.with(target, |r, reach| {
            let rare = r.rare_mut(target, reach.readers);
            if rare.reads.add(policy, &key) {
                reach.readers.read(&key, target);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> TargetKey {
        TargetKey {
            kind: KindRef::new("example.com/v1", "Widget"),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn failures_count_in_a_row_by_what_failed_and_start_over_on_success() {
        let r = Records::default();
        let (k, p, q) = (
            key("a"),
            Failing::Policy("p".into()),
            Failing::Policy("q".into()),
        );
        assert_eq!(r.failed(&k, p.clone()), 1);
        assert_eq!(r.failed(&k, p.clone()), 2);
        assert_eq!(r.failed(&k, q.clone()), 1, "each policy has its own count");
        assert_eq!(r.failed(&k, Failing::Reconcile), 1);
        r.succeeded(&k, &p);
        assert_eq!(
            r.failed(&k, p.clone()),
            1,
            "a success starts the count over"
        );
        assert_eq!(r.failed(&k, q.clone()), 2, "the others keep theirs");
    }

    #[test]
    fn a_record_with_nothing_left_is_dropped() {
        let r = Records::default();
        let k = key("a");
        r.wrote_status(&k, (vec!["7".into()], Instant::now()));
        r.wrote_state(&k, (None, Arc::new(Value::Null)));
        r.failed(&k, Failing::Reconcile);
        r.read_by(&k, "p", vec![read("a-config")]);
        let counts = r.counts().map(|(_, n)| n);
        assert_eq!((r.len(), counts), (1, [1, 0, 1, 1, 1]));
        r.read_by(&k, "p", vec![]);
        r.status_settled(&k);
        r.state_settled(&k);
        assert!(r.status_written(&k).is_none() && r.state_written(&k).is_none());
        assert_eq!(r.len(), 1, "its failures are still remembered");
        r.succeeded(&k, &Failing::Reconcile);
        assert_eq!(r.len(), 0);
        // Settling what was never written leaves nothing behind either.
        r.status_settled(&key("b"));
        r.succeeded(&key("b"), &Failing::Reconcile);
        assert_eq!(r.len(), 0);
    }

    /// Most records hold last decisions alone: one costs those and a
    /// pointer, not room for everything a record may hold.
    #[test]
    fn a_record_costs_its_decisions_and_a_pointer() {
        let decisions = std::mem::size_of::<Decisions>();
        assert!(std::mem::size_of::<Record>() <= decisions + std::mem::size_of::<usize>());
    }

    /// A config map of namespace `ns` read by name.
    fn read(name: &str) -> AccessKey {
        AccessKey {
            kind: KindRef::new("v1", "ConfigMap"),
            namespace: "ns".into(),
            name: Some(name.into()),
        }
    }

    /// A target deleted while nothing reconciled it again (or while its
    /// watch was down) leaves nothing behind: neither its record nor its
    /// reads in the index.
    #[test]
    fn retain_keeps_only_the_targets_alive() {
        let r = Records::default();
        for name in ["gone", "kept"] {
            let k = key(name);
            r.wrote_status(&k, (vec!["1".into()], Instant::now()));
            r.wrote_state(&k, (None, Arc::new(Value::Null)));
            r.failed(&k, Failing::Policy("p".into()));
            r.read_by(&k, "p", vec![read(&format!("{name}-config"))]);
            r.wake(&k);
        }
        r.retain(&HashSet::from([key("kept")]));
        assert_eq!(r.len(), 1);
        assert!(r.status_written(&key("gone")).is_none());
        assert!(r.status_written(&key("kept")).is_some());
        let kind = KindRef::new("v1", "ConfigMap");
        assert!(r.readers_of(&kind, "ns", "gone-config").is_empty());
        assert_eq!(r.readers_of(&kind, "ns", "kept-config"), [key("kept")]);
        let counts = r.counts().map(|(_, n)| n);
        assert_eq!(counts, [1, 0, 1, 1, 1]);
    }

    /// Two targets whose keys hash alike share a record's place: what the
    /// rarer part holds is never taken for the other's, and its reads
    /// leave the index when the other's take its place.
    #[test]
    fn a_rare_part_is_only_ever_its_own_targets() {
        let mut readers = Readers::default();
        let mut record = Record::default();
        let (a, b) = (key("a"), key("b"));
        let rare = record.rare_mut(&a, &mut readers);
        rare.state = Some((None, Arc::new(Value::Null)));
        rare.reads.put("p", vec![read("x")]);
        readers.read(&read("x"), &a);
        assert!(record.rare(&a).is_some());
        assert!(record.rare(&b).is_none());
        assert!(record.rare_mut(&b, &mut readers).state.is_none());
        assert!(readers.0.is_empty(), "a's read left the index");
    }

    /// Each policy's reads are kept once each, whatever order they come
    /// in, and taken out whole.
    #[test]
    fn reads_are_kept_once_each_by_policy() {
        let mut reads = Reads::default();
        assert!(reads.add("p", &read("b")));
        assert!(reads.add("p", &read("a")));
        assert!(!reads.add("p", &read("b")), "already read");
        assert!(reads.add("q", &read("b")));
        assert_eq!(reads.all().count(), 3);
        assert_eq!(reads.take("p"), vec![read("a"), read("b")]);
        assert!(reads.take("p").is_empty());
        reads.clear();
        assert!(reads.is_empty());
    }

    #[test]
    fn a_change_wakes_the_targets_that_read_it() {
        let r = Records::default();
        let all = AccessKey {
            name: None,
            ..read("web")
        };
        r.read_by(&key("a"), "p", vec![read("web")]);
        r.read_by(&key("b"), "p", vec![all]);
        r.read_by(&key("c"), "p", vec![read("api")]);
        let kind = KindRef::new("v1", "ConfigMap");
        assert_eq!(r.readers_of(&kind, "ns", "web"), [key("a"), key("b")]);
        r.read_by(&key("a"), "p", vec![]);
        assert_eq!(r.readers_of(&kind, "ns", "web"), [key("b")]);
        assert!(r.readers_of(&kind, "other", "web").is_empty());
    }

    #[test]
    fn each_policy_on_a_target_keeps_its_own_reads() {
        let r = Records::default();
        let kind = KindRef::new("v1", "ConfigMap");
        let a = key("a");
        r.read_by(&a, "drift", vec![read("web")]);
        // A second policy on the same target reads nothing: the first
        // one's read still wakes the target.
        r.read_by(&a, "retrain", vec![]);
        assert_eq!(r.readers_of(&kind, "ns", "web"), vec![a.clone()]);
        // Both read it; one stops; the other still does.
        r.read_by(&a, "retrain", vec![read("web")]);
        r.read_by(&a, "drift", vec![]);
        assert_eq!(r.readers_of(&kind, "ns", "web"), vec![a.clone()]);
        r.read_by(&a, "retrain", vec![]);
        assert!(r.readers_of(&kind, "ns", "web").is_empty());
        assert_eq!(r.len(), 0, "nothing kept");
    }

    #[test]
    fn a_read_wakes_its_target_from_the_moment_it_is_made() {
        use crate::observe::view::{Sources, Tracking};
        use runbook_core::observe::ObjectView;
        let records = Arc::new(Records::default());
        let a = key("a");
        let view = Tracking::new(Sources::default(), records.clone(), a.clone(), "drift");
        let kind = KindRef::new("v1", "ConfigMap");
        // The decision is still running (nothing set yet), and a change to
        // what it read already finds it.
        assert!(view.get(&kind, "ns", "web").is_none());
        assert_eq!(records.readers_of(&kind, "ns", "web"), vec![a.clone()]);
        // Its end replaces the reads with what it read, once each.
        records.read_by(&a, "drift", view.take());
        assert_eq!(records.readers_of(&kind, "ns", "web"), vec![a.clone()]);
        records.no_policy_applies(&a);
        assert!(records.readers_of(&kind, "ns", "web").is_empty());
    }
}
