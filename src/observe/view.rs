//! What a reconcile reads: the shared caches, through an `ObjectView` that
//! remembers every object a decision looked up, so that a change to any of
//! them wakes exactly the targets that depend on it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::Store;

use super::cache::KindCache;
use crate::kinds::KindRef;
use crate::observe::RawObject;
use crate::observe::{CachedObject, ObjectView};
use crate::util::lock;

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
    /// are keyed under.
    Targets(Store<RawObject>, kube::core::ApiResource),
}

/// The caches by kind, as a reconcile sees them.
#[derive(Clone, Default)]
pub struct Sources(pub HashMap<KindRef, Source>);

fn sorted(mut v: Vec<Arc<CachedObject>>) -> Vec<Arc<CachedObject>> {
    v.sort_by(|a, b| a.name().cmp(b.name()));
    v
}

impl ObjectView for Sources {
    fn list(&self, kind: &KindRef, namespace: &str) -> Vec<Arc<CachedObject>> {
        match self.0.get(kind) {
            Some(Source::Informer(c)) => c.list(namespace),
            Some(Source::Targets(s, _)) => sorted(
                s.state()
                    .into_iter()
                    .filter(|o| {
                        o.undecodable.is_none()
                            && o.meta.namespace.as_deref().unwrap_or("") == namespace
                    })
                    .map(|o| o.cached())
                    .collect(),
            ),
            None => Vec::new(),
        }
    }

    fn get(&self, kind: &KindRef, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        match self.0.get(kind)? {
            Source::Informer(c) => c.get(namespace, name),
            Source::Targets(s, resource) => {
                let r = target_ref(resource, namespace, name);
                s.get(&r)
                    .filter(|o| o.undecodable.is_none())
                    .map(|o| o.cached())
            }
        }
    }

    fn owned_by(&self, kind: &KindRef, namespace: &str, uid: &str) -> Vec<Arc<CachedObject>> {
        match self.0.get(kind) {
            Some(Source::Informer(c)) => c.owned_by(namespace, uid),
            _ => self
                .list(kind, namespace)
                .into_iter()
                .filter(|o| o.is_owned_by(uid))
                .collect(),
        }
    }
}

/// A view that records what it was asked for.
pub struct Tracking {
    pub sources: Sources,
    accessed: Mutex<Vec<AccessKey>>,
}

impl Tracking {
    pub fn new(sources: Sources) -> Self {
        Self {
            sources,
            accessed: Mutex::new(Vec::new()),
        }
    }

    fn note(&self, kind: &KindRef, namespace: &str, name: Option<&str>) {
        lock(&self.accessed).push(AccessKey {
            kind: kind.clone(),
            namespace: namespace.to_string(),
            name: name.map(str::to_string),
        });
    }

    pub fn take(&self) -> Vec<AccessKey> {
        std::mem::take(&mut *lock(&self.accessed))
    }
}

impl ObjectView for Tracking {
    fn list(&self, kind: &KindRef, namespace: &str) -> Vec<Arc<CachedObject>> {
        self.note(kind, namespace, None);
        self.sources.list(kind, namespace)
    }

    fn get(&self, kind: &KindRef, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        self.note(kind, namespace, Some(name));
        self.sources.get(kind, namespace, name)
    }

    // Children report their own changes through their owner references.
    fn owned_by(&self, kind: &KindRef, namespace: &str, uid: &str) -> Vec<Arc<CachedObject>> {
        self.sources.owned_by(kind, namespace, uid)
    }
}

/// Which targets read which objects, from their last reconcile.
#[derive(Default)]
pub struct Dependencies {
    readers: HashMap<AccessKey, HashSet<TargetKey>>,
    reads: HashMap<TargetKey, Vec<AccessKey>>,
}

impl Dependencies {
    /// Replace what a target depends on.
    pub fn set(&mut self, target: &TargetKey, mut keys: Vec<AccessKey>) {
        keys.sort_by(|a, b| {
            (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name))
        });
        keys.dedup();
        if let Some(old) = self.reads.remove(target) {
            for k in old {
                if let Some(set) = self.readers.get_mut(&k) {
                    set.remove(target);
                    if set.is_empty() {
                        self.readers.remove(&k);
                    }
                }
            }
        }
        for k in &keys {
            self.readers
                .entry(k.clone())
                .or_default()
                .insert(target.clone());
        }
        if !keys.is_empty() {
            self.reads.insert(target.clone(), keys);
        }
    }

    pub fn forget(&mut self, target: &TargetKey) {
        self.set(target, Vec::new());
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
            if let Some(set) = self.readers.get(&k) {
                out.extend(set.iter().cloned());
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
    resource: &kube::core::ApiResource,
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
        d.set(&t("a"), vec![dep(Some("web"))]);
        d.set(&t("b"), vec![dep(None)]);
        d.set(&t("c"), vec![dep(Some("api"))]);
        let kind = KindRef::new("apps/v1", "Deployment");
        assert_eq!(d.readers_of(&kind, "d", "web"), vec![t("a"), t("b")]);
        d.set(&t("a"), vec![]);
        assert_eq!(d.readers_of(&kind, "d", "web"), vec![t("b")]);
        assert!(d.readers_of(&kind, "other", "web").is_empty());
    }
}
