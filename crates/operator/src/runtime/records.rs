//! What the runtime remembers of each target between its reconciles that
//! the cache cannot tell: its failures in a row (the backoff), the status
//! and the Runbook state this process wrote that the cache may not show
//! yet. One record per target, behind one lock and these methods; a
//! record with nothing in it is dropped at once, and [`Records::retain`]
//! drops those of targets gone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::time::Instant;

use crate::observe::view::TargetKey;
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

/// One target's record. The status write is what most targets have for a
/// moment after each decision that wrote; the rest is rarer and kept
/// apart, so that a record costs what the status write alone did.
#[derive(Default)]
struct Record {
    status: Option<StatusWrite>,
    rare: Option<Box<Rare>>,
}

/// The rarer part of a record.
#[derive(Default)]
struct Rare {
    /// Failed reconciles in a row, by what failed.
    failures: Vec<(Failing, u32)>,
    state: Option<StateWrite>,
}

impl Record {
    fn is_empty(&self) -> bool {
        self.status.is_none() && self.rare.is_none()
    }

    /// The rarer part, made if missing.
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Drop the rarer part once nothing is in it.
    fn tidy(&mut self) {
        if self
            .rare
            .as_ref()
            .is_some_and(|r| r.failures.is_empty() && r.state.is_none())
        {
            self.rare = None;
        }
    }

    fn failures(&self) -> &[(Failing, u32)] {
        self.rare.as_ref().map_or(&[], |r| &r.failures)
    }

    fn state(&self) -> Option<&StateWrite> {
        self.rare.as_ref().and_then(|r| r.state.as_ref())
    }
}

/// The records of every target.
#[derive(Default)]
pub(super) struct Records(Mutex<HashMap<TargetKey, Record>>);

impl Records {
    /// Change `key`'s record with `f`, dropping it if left empty.
    fn with<R>(&self, key: &TargetKey, f: impl FnOnce(&mut Record) -> R) -> R {
        let mut all = lock(&self.0);
        match all.get_mut(key) {
            Some(r) => {
                let out = f(r);
                r.tidy();
                if r.is_empty() {
                    all.remove(key);
                }
                out
            }
            None => {
                let mut r = Record::default();
                let out = f(&mut r);
                r.tidy();
                if !r.is_empty() {
                    all.insert(key.clone(), r);
                }
                out
            }
        }
    }

    /// Read `key`'s record, if it has one.
    fn get<R>(&self, key: &TargetKey, f: impl FnOnce(&Record) -> Option<R>) -> Option<R> {
        lock(&self.0).get(key).and_then(f)
    }

    /// One more failure of `failing` on `key` in a row: how many now.
    pub fn failed(&self, key: &TargetKey, failing: Failing) -> u32 {
        self.with(key, |r| {
            let failures = &mut r.rare().failures;
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
        self.with(key, |r| {
            if let Some(rare) = r.rare.as_mut() {
                rare.failures.retain(|(f, _)| f != failing);
            }
        });
    }

    /// This process wrote `key`'s status.
    pub fn wrote_status(&self, key: &TargetKey, write: StatusWrite) {
        self.with(key, |r| r.status = Some(write));
    }

    /// The status write of `key` the cache may not show yet.
    pub fn status_written(&self, key: &TargetKey) -> Option<StatusWrite> {
        self.get(key, |r| r.status.clone())
    }

    /// The cache shows `key`'s status write (or no longer matters).
    pub fn status_settled(&self, key: &TargetKey) {
        self.with(key, |r| r.status = None);
    }

    /// This process wrote Runbook's state of `key`.
    pub fn wrote_state(&self, key: &TargetKey, write: StateWrite) {
        self.with(key, |r| r.rare().state = Some(write));
    }

    /// The state write of `key` the cache may not show yet.
    pub fn state_written(&self, key: &TargetKey) -> Option<StateWrite> {
        self.get(key, |r| r.state().cloned())
    }

    /// The cache shows `key`'s state write.
    pub fn state_settled(&self, key: &TargetKey) {
        self.with(key, |r| {
            if let Some(rare) = r.rare.as_mut() {
                rare.state = None;
            }
        });
    }

    /// Keep the records of the targets `alive` only.
    pub fn retain(&self, alive: &HashSet<TargetKey>) {
        lock(&self.0).retain(|k, _| alive.contains(k));
    }

    /// How many targets have a status write, a state write and failures
    /// remembered.
    pub fn counts(&self) -> [usize; 3] {
        let all = lock(&self.0);
        let count = |f: fn(&Record) -> bool| all.values().filter(|r| f(r)).count();
        [
            count(|r| r.status.is_some()),
            count(|r| r.state().is_some()),
            count(|r| !r.failures().is_empty()),
        ]
    }

    /// Targets with a record.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runbook_core::kinds::KindRef;

    fn key(name: &str) -> TargetKey {
        TargetKey {
            kind: KindRef::new("v1", "ConfigMap"),
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
        assert_eq!((r.len(), r.counts()), (1, [1, 1, 1]));
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

    /// Most records hold a status write alone: one costs that write and a
    /// pointer, not room for everything a record may hold.
    #[test]
    fn a_record_costs_its_status_write_and_a_pointer() {
        let write = std::mem::size_of::<StatusWrite>();
        assert!(std::mem::size_of::<Record>() <= write + std::mem::size_of::<usize>());
    }

    #[test]
    fn retain_keeps_only_the_targets_alive() {
        let r = Records::default();
        for name in ["gone", "kept"] {
            r.wrote_status(&key(name), (vec!["1".into()], Instant::now()));
        }
        r.retain(&HashSet::from([key("kept")]));
        assert!(r.status_written(&key("gone")).is_none());
        assert!(r.status_written(&key("kept")).is_some());
    }
}
