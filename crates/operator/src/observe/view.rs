//! What a reconcile reads: the shared caches, through an `ObjectView` that
//! remembers every object a decision looked up, so that a change to any of
//! them wakes exactly the targets that depend on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::Store;

use super::cache::KindCache;
use super::index::TargetIndex;
use runbook_core::kinds::KindRef;
use runbook_core::labels::Selector;
use runbook_core::observe::RawObject;
use runbook_core::observe::{CachedObject, ObjectView};
use runbook_core::util::lock;

/// A target: its kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetKey {
    pub kind: KindRef,
    pub namespace: String,
    pub name: String,
}

/// An object (or, with no name, a whole namespace of a kind) a decision read.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccessKey {
    pub kind: KindRef,
    pub namespace: String,
    pub name: Option<String>,
}

/// Where one kind's objects are cached.
#[derive(Clone)]
pub enum Source {
    Informer(Arc<KindCache>),
    /// A target kind's controller store, with the resource its objects
    /// are keyed under and the index that finds them.
    Targets(
        Store<RawObject>,
        Arc<kube::core::ApiResource>,
        Arc<TargetIndex>,
    ),
}

/// The caches by kind, as a reconcile sees them.
#[derive(Clone, Default)]
pub struct Sources(pub HashMap<KindRef, Source>);

/// The objects of a target kind's store with these names, in that order.
fn from_store(
    store: &Store<RawObject>,
    resource: &Arc<kube::core::ApiResource>,
    namespace: &str,
    names: Vec<String>,
) -> Vec<Arc<CachedObject>> {
    names
        .iter()
        .filter_map(|name| store.get(&target_ref(resource, namespace, name)))
        .filter(|o| o.undecodable.is_none())
        .map(|o| o.cached())
        .collect()
}

impl ObjectView for Sources {
    fn list(&self, kind: &KindRef, namespace: &str) -> Vec<Arc<CachedObject>> {
        match self.0.get(kind) {
            Some(Source::Informer(c)) => c.list(namespace),
            Some(Source::Targets(s, resource, index)) => {
                from_store(s, resource, namespace, index.names(namespace))
            }
            None => Vec::new(),
        }
    }

    fn get(&self, kind: &KindRef, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        match self.0.get(kind)? {
            Source::Informer(c) => c.get(namespace, name),
            Source::Targets(s, resource, _) => {
                let r = target_ref(resource, namespace, name);
                s.get(&r)
                    .filter(|o| o.undecodable.is_none())
                    .map(|o| o.cached())
            }
        }
    }

    fn select(
        &self,
        kind: &KindRef,
        namespace: &str,
        selector: &Selector,
    ) -> Vec<Arc<CachedObject>> {
        match self.0.get(kind) {
            Some(Source::Informer(c)) => c.select(namespace, selector),
            Some(Source::Targets(s, resource, index)) => {
                from_store(s, resource, namespace, index.select(namespace, selector))
            }
            None => Vec::new(),
        }
    }

    fn every(&self, kind: &KindRef) -> Vec<Arc<CachedObject>> {
        match self.0.get(kind) {
            Some(Source::Informer(c)) => c.every(),
            Some(Source::Targets(s, _, _)) => {
                let mut all: Vec<Arc<CachedObject>> = s
                    .state()
                    .into_iter()
                    .filter(|o| o.undecodable.is_none())
                    .map(|o| o.cached())
                    .collect();
                all.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
                all
            }
            None => Vec::new(),
        }
    }

    fn children_elsewhere(&self, kind: &KindRef, uid: &str) -> Vec<Arc<CachedObject>> {
        let found = match self.0.get(kind) {
            Some(Source::Informer(c)) => c.owned_anywhere(uid),
            Some(Source::Targets(s, resource, index)) => index
                .owned_anywhere(uid)
                .into_iter()
                .filter_map(|(ns, name)| s.get(&target_ref(resource, &ns, &name)))
                .filter(|o| o.undecodable.is_none())
                .map(|o| o.cached())
                .collect(),
            None => Vec::new(),
        };
        found
            .into_iter()
            .filter(|o| runbook_core::observe::controller_uid(o.value()).is_none())
            .collect()
    }

    fn owned_by(&self, kind: &KindRef, namespace: &str, uid: &str) -> Vec<Arc<CachedObject>> {
        match self.0.get(kind) {
            Some(Source::Informer(c)) => c.owned_by(namespace, uid),
            Some(Source::Targets(s, resource, index)) => {
                from_store(s, resource, namespace, index.owned_by(namespace, uid))
            }
            None => Vec::new(),
        }
    }
}

/// A view that records what it was asked for, and makes its target a
/// reader of each object as it reads it, before the cache is read: a
/// change that lands in the cache after the read is then routed to the
/// target even while its decision is still running (registering only once
/// the decision ends would lose it, and the target would wait for something
/// else to wake it).
pub struct Tracking {
    pub sources: Sources,
    accessed: Mutex<Vec<AccessKey>>,
    /// The reads made for the target's own sake (not of what one of the
    /// policy's children owns): what its author must be allowed to read.
    checked: Mutex<Vec<AccessKey>>,
    log: Arc<dyn ReadLog>,
    target: TargetKey,
    policy: String,
}

impl Tracking {
    pub fn new(sources: Sources, log: Arc<dyn ReadLog>, target: TargetKey, policy: &str) -> Self {
        Self {
            sources,
            accessed: Mutex::new(Vec::new()),
            checked: Mutex::new(Vec::new()),
            log,
            target,
            policy: policy.to_string(),
        }
    }

    fn note(&self, kind: &KindRef, namespace: &str, name: Option<&str>, checked: bool) {
        let key = AccessKey {
            kind: kind.clone(),
            namespace: namespace.to_string(),
            name: name.map(str::to_string),
        };
        self.log.read(&self.target, &self.policy, key.clone());
        if checked {
            lock(&self.checked).push(key.clone());
        }
        lock(&self.accessed).push(key);
    }

    /// Everything the decision read (what wakes it again).
    pub fn take(&self) -> Vec<AccessKey> {
        std::mem::take(&mut *lock(&self.accessed))
    }

    /// What the decision read for the target's own sake.
    pub fn take_checked(&self) -> Vec<AccessKey> {
        let mut keys = std::mem::take(&mut *lock(&self.checked));
        keys.sort_by(|a, b| {
            (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name))
        });
        keys.dedup();
        keys
    }
}

impl ObjectView for Tracking {
    fn list(&self, kind: &KindRef, namespace: &str) -> Vec<Arc<CachedObject>> {
        self.note(kind, namespace, None, true);
        self.sources.list(kind, namespace)
    }

    fn list_for_child(&self, kind: &KindRef, namespace: &str) -> Vec<Arc<CachedObject>> {
        self.note(kind, namespace, None, false);
        self.sources.list(kind, namespace)
    }

    fn select(
        &self,
        kind: &KindRef,
        namespace: &str,
        selector: &Selector,
    ) -> Vec<Arc<CachedObject>> {
        self.note(kind, namespace, None, true);
        self.sources.select(kind, namespace, selector)
    }

    fn select_for_child(
        &self,
        kind: &KindRef,
        namespace: &str,
        selector: &Selector,
    ) -> Vec<Arc<CachedObject>> {
        self.note(kind, namespace, None, false);
        self.sources.select(kind, namespace, selector)
    }

    fn get(&self, kind: &KindRef, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        self.note(kind, namespace, Some(name), true);
        self.sources.get(kind, namespace, name)
    }

    fn list_owned_by(&self, kind: &KindRef, namespace: &str, uid: &str) -> Vec<Arc<CachedObject>> {
        self.note(kind, namespace, None, true);
        self.sources.owned_by(kind, namespace, uid)
    }

    // A sweep's listing wakes nothing: a sweep decides at its fire
    // times, whatever changed in between.
    fn every(&self, kind: &KindRef) -> Vec<Arc<CachedObject>> {
        self.sources.every(kind)
    }

    // Children in other namespaces are noted one by one (a change to
    // one wakes the target; so does one to its namespace's children of
    // the kind, through the noted read of children).
    fn children_elsewhere(&self, kind: &KindRef, uid: &str) -> Vec<Arc<CachedObject>> {
        self.note(kind, &self.target.namespace, Some(CHILDREN), false);
        let found = self.sources.children_elsewhere(kind, uid);
        for c in &found {
            self.note(kind, c.namespace(), Some(c.name()), false);
        }
        found
    }

    // Children report their own changes through their owner references;
    // that the decision read them is noted, so that its own apply of one
    // coming back wakes it too (it now sees the child it made).
    fn owned_by(&self, kind: &KindRef, namespace: &str, uid: &str) -> Vec<Arc<CachedObject>> {
        self.note(kind, namespace, Some(CHILDREN), false);
        self.sources.owned_by(kind, namespace, uid)
    }
}

/// The name under which a read of a target's children of a kind is
/// noted: no object has it (names cannot hold a NUL), so it matches no
/// read of an object by name.
pub const CHILDREN: &str = "\u{0}children";

/// Where the reads of a decision are noted as it makes them (the target's
/// record, in the runtime's memory): from then on a change of what was
/// read wakes the target.
pub trait ReadLog: Send + Sync {
    /// `policy`'s decision on `target` read `key`.
    fn read(&self, target: &TargetKey, policy: &str, key: AccessKey);
}

/// The key of a target in its controller's store: cluster-scoped objects
/// have no namespace.
pub fn target_ref(
    resource: &Arc<kube::core::ApiResource>,
    namespace: &str,
    name: &str,
) -> kube::runtime::reflector::ObjectRef<RawObject> {
    let r = kube::runtime::reflector::ObjectRef::new_with(name, resource.clone());
    if namespace.is_empty() {
        r
    } else {
        r.within(namespace)
    }
}
