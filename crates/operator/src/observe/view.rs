//! What a reconcile reads: the shared caches, through an `ObjectView` that
//! remembers every object a decision looked up, so that a change to any of
//! them wakes exactly the targets that depend on it.

use std::collections::{HashMap, HashSet};
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
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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
    deps: Arc<Mutex<Dependencies>>,
    target: TargetKey,
    policy: String,
}

impl Tracking {
    pub fn new(
        sources: Sources,
        deps: Arc<Mutex<Dependencies>>,
        target: TargetKey,
        policy: &str,
    ) -> Self {
        Self {
            sources,
            accessed: Mutex::new(Vec::new()),
            checked: Mutex::new(Vec::new()),
            deps,
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
        lock(&self.deps).add(&self.target, &self.policy, key.clone());
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

/// Which targets read which objects: for each target, what the last
/// decision of each of its policies looked up (two teams' policies on one
/// target each keep their own reads).
#[derive(Default)]
pub struct Dependencies {
    /// For each object read, the targets that read it and how many of
    /// their policies did.
    readers: HashMap<AccessKey, HashMap<TargetKey, usize>>,
    reads: HashMap<TargetKey, HashMap<String, HashSet<AccessKey>>>,
}

impl Dependencies {
    /// Replace what one policy's decision on a target depends on.
    pub fn set(&mut self, target: &TargetKey, policy: &str, keys: Vec<AccessKey>) {
        let new: HashSet<AccessKey> = keys.into_iter().collect();
        let old = self
            .reads
            .get_mut(target)
            .and_then(|by_policy| by_policy.remove(policy))
            .unwrap_or_default();
        for k in old.difference(&new) {
            self.unread(k, target);
        }
        for k in new.difference(&old) {
            self.read(k, target);
        }
        if !new.is_empty() {
            self.reads
                .entry(target.clone())
                .or_default()
                .insert(policy.to_string(), new);
        } else if self.reads.get(target).is_some_and(HashMap::is_empty) {
            self.reads.remove(target);
        }
    }

    /// Add one read to what a policy's decision on a target depends on
    /// (until its next `set`).
    pub fn add(&mut self, target: &TargetKey, policy: &str, key: AccessKey) {
        let keys = self
            .reads
            .entry(target.clone())
            .or_default()
            .entry(policy.to_string())
            .or_default();
        if keys.insert(key.clone()) {
            self.read(&key, target);
        }
    }

    /// The targets whose reads are kept.
    pub fn targets(&self) -> impl Iterator<Item = &TargetKey> {
        self.reads.keys()
    }

    /// Forget the reads of every target but those `alive`.
    pub fn prune(&mut self, alive: &HashSet<TargetKey>) {
        let gone: Vec<TargetKey> = self
            .reads
            .keys()
            .filter(|t| !alive.contains(*t))
            .cloned()
            .collect();
        for t in &gone {
            self.forget(t);
        }
    }

    /// Forget every read of a target (it is gone, or no policy applies).
    pub fn forget(&mut self, target: &TargetKey) {
        for keys in self
            .reads
            .remove(target)
            .into_iter()
            .flat_map(HashMap::into_values)
        {
            for k in &keys {
                self.unread(k, target);
            }
        }
    }

    fn read(&mut self, key: &AccessKey, target: &TargetKey) {
        *self
            .readers
            .entry(key.clone())
            .or_default()
            .entry(target.clone())
            .or_default() += 1;
    }

    fn unread(&mut self, key: &AccessKey, target: &TargetKey) {
        let Some(targets) = self.readers.get_mut(key) else {
            return;
        };
        if let Some(n) = targets.get_mut(target) {
            *n -= 1;
            if *n == 0 {
                targets.remove(target);
            }
        }
        if targets.is_empty() {
            self.readers.remove(key);
        }
    }

    /// Whether the last decision of a policy on `target` read its children
    /// of `kind` (see [`CHILDREN`]).
    pub fn reads_children(&self, target: &TargetKey, kind: &KindRef) -> bool {
        let key = AccessKey {
            kind: kind.clone(),
            namespace: target.namespace.clone(),
            name: Some(CHILDREN.to_string()),
        };
        self.readers
            .get(&key)
            .is_some_and(|targets| targets.contains_key(target))
    }

    /// Targets that read this object, by name or by listing its namespace.
    pub fn readers_of(&self, kind: &KindRef, namespace: &str, name: &str) -> Vec<TargetKey> {
        let exact = AccessKey {
            kind: kind.clone(),
            namespace: namespace.to_string(),
            name: Some(name.to_string()),
        };
        let all = AccessKey {
            kind: kind.clone(),
            namespace: namespace.to_string(),
            name: None,
        };
        let mut out: Vec<TargetKey> = Vec::new();
        for k in [exact, all] {
            if let Some(targets) = self.readers.get(&k) {
                out.extend(targets.keys().cloned());
            }
        }
        out.sort();
        out.dedup();
        out
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TargetKey {
        TargetKey {
            kind: KindRef::new("runbook.dev/v1alpha1", "Evaluator"),
            namespace: "d".into(),
            name: name.into(),
        }
    }

    fn dep(name: Option<&str>) -> AccessKey {
        AccessKey {
            kind: KindRef::new("apps/v1", "Deployment"),
            namespace: "d".into(),
            name: name.map(str::to_string),
        }
    }

    #[test]
    fn a_change_wakes_the_targets_that_read_it() {
        let mut d = Dependencies::default();
        d.set(&t("a"), "p", vec![dep(Some("web"))]);
        d.set(&t("b"), "p", vec![dep(None)]);
        d.set(&t("c"), "p", vec![dep(Some("api"))]);
        let kind = KindRef::new("apps/v1", "Deployment");
        assert_eq!(d.readers_of(&kind, "d", "web"), vec![t("a"), t("b")]);
        d.set(&t("a"), "p", vec![]);
        assert_eq!(d.readers_of(&kind, "d", "web"), vec![t("b")]);
        assert!(d.readers_of(&kind, "other", "web").is_empty());
    }

    #[test]
    fn each_policy_on_a_target_keeps_its_own_reads() {
        let mut d = Dependencies::default();
        let kind = KindRef::new("apps/v1", "Deployment");
        d.set(&t("a"), "drift", vec![dep(Some("web"))]);
        // A second policy on the same target reads nothing: the first
        // one's read still wakes the target.
        d.set(&t("a"), "retrain", vec![]);
        assert_eq!(d.readers_of(&kind, "d", "web"), vec![t("a")]);
        // Both read it; one stops; the other still does.
        d.set(&t("a"), "retrain", vec![dep(Some("web"))]);
        d.set(&t("a"), "drift", vec![]);
        assert_eq!(d.readers_of(&kind, "d", "web"), vec![t("a")]);
        d.set(&t("a"), "retrain", vec![]);
        assert!(d.readers_of(&kind, "d", "web").is_empty());
        assert!(d.reads.is_empty() && d.readers.is_empty(), "nothing kept");
    }

    #[test]
    fn a_read_wakes_its_target_from_the_moment_it_is_made() {
        let deps = Arc::new(Mutex::new(Dependencies::default()));
        let view = Tracking::new(Sources::default(), deps.clone(), t("a"), "drift");
        let kind = KindRef::new("apps/v1", "Deployment");
        // The decision is still running (nothing set yet), and a change to
        // what it read already finds it.
        assert!(view.get(&kind, "d", "web").is_none());
        assert_eq!(lock(&deps).readers_of(&kind, "d", "web"), vec![t("a")]);
        // Its end replaces the reads with what it read, once each.
        let keys = view.take();
        lock(&deps).set(&t("a"), "drift", keys);
        assert_eq!(lock(&deps).readers_of(&kind, "d", "web"), vec![t("a")]);
        lock(&deps).forget(&t("a"));
        assert!(lock(&deps).readers_of(&kind, "d", "web").is_empty());
    }
}
