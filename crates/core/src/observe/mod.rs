//! What a decision can see: objects from the watch caches, each converted to
//! a Rhai value at most once per resourceVersion while a reader holds it.
//!
//! Nothing here does I/O. The operator's watch caches
//! (`runbook_operator::observe`) fill the views decisions read; tests and
//! simulations fill a [`MemoryView`] by hand.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use serde_json::Value;

use crate::kinds::KindRef;

pub mod object;
pub use object::{Labels, RawFields, RawObject};

/// A kind as the API server serves it (what discovery answered).
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub resource: kube_core::ApiResource,
    pub namespaced: bool,
    pub status_subresource: bool,
}

impl Resolved {
    /// The kind, as policies name it.
    pub fn kind_ref(&self) -> KindRef {
        KindRef::new(&self.resource.api_version, &self.resource.kind)
    }
}

/// One object as cached, immutable: a new resourceVersion is a new
/// `CachedObject`. Scripts see it through a read-only view that shares the
/// JSON, so it is never converted or copied for them.
#[derive(Debug)]
pub struct CachedObject {
    value: Arc<Value>,
    /// See [`CachedObject::own_hash`]; computed on first use.
    own_hash: OnceLock<u64>,
}

impl CachedObject {
    pub fn new(value: Value) -> Arc<Self> {
        Self::from_arc(Arc::new(value))
    }

    /// Wrap JSON already behind an `Arc` (a cache's copy), without copying it.
    pub fn from_arc(value: Arc<Value>) -> Arc<Self> {
        Arc::new(Self {
            value,
            own_hash: OnceLock::new(),
        })
    }

    /// The FNV-1a state after hashing what is the object's own and not its
    /// status: its identifying metadata (name, namespace, uid, generation,
    /// labels, annotations, whether it is being deleted) and its spec. A
    /// decision's inputs hash goes on from here; computed once per object
    /// version, however many decisions read it.
    pub fn own_hash(&self) -> u64 {
        *self.own_hash.get_or_init(|| {
            use crate::util::hash::{Fnv64, hash_value};
            use std::hash::Hasher;
            let t = &*self.value;
            let mut h = Fnv64::default();
            let meta = &t["metadata"];
            for key in [
                "name",
                "namespace",
                "uid",
                "generation",
                "labels",
                "annotations",
            ] {
                h.write(key.as_bytes());
                hash_value(&meta[key], &mut h);
            }
            h.write_u8(meta.get("deletionTimestamp").is_some() as u8);
            hash_value(&t["spec"], &mut h);
            h.finish()
        })
    }

    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The JSON, shared (a script's view of the object holds it).
    pub fn shared(&self) -> Arc<Value> {
        self.value.clone()
    }

    pub fn name(&self) -> &str {
        meta_str(&self.value, "name")
    }

    pub fn namespace(&self) -> &str {
        meta_str(&self.value, "namespace")
    }

    /// Where a policy on this object acts (its children, the objects it
    /// looks up and writes): its namespace; a Namespace acts in itself;
    /// another cluster-scoped object in none.
    pub fn acting_namespace(&self) -> &str {
        acting_namespace(&self.value)
    }

    pub fn uid(&self) -> &str {
        meta_str(&self.value, "uid")
    }

    /// Whether one of the ownerReferences points at `uid`.
    pub fn is_owned_by(&self, uid: &str) -> bool {
        owner_uids(&self.value).any(|u| u == uid)
    }

    /// Whether this object is the child that the policy whose label value
    /// is `policy` (see [`policy_label_value`]) made for the target with
    /// uid `target_uid`: it carries Runbook's labels with that policy's
    /// name, and a controller ownerReference to that target. Nothing else
    /// is a policy's to change or delete: an object of the same name that
    /// someone else made is never taken over.
    pub fn is_child_of(&self, policy: &str, target_uid: &str) -> bool {
        is_child_of(&self.value, policy, target_uid)
    }
}

/// The label every object Runbook makes carries, with the value `runbook`.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// [`CachedObject::is_child_of`] for any JSON object.
pub fn is_child_of(v: &Value, policy: &str, target_uid: &str) -> bool {
    let labels = v.get("metadata").and_then(|m| m.get("labels"));
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    !target_uid.is_empty()
        && label(MANAGED_BY) == Some("runbook")
        && label(POLICY_NAME_LABEL) == Some(policy)
        && match controller_uid(v) {
            Some(uid) => uid == target_uid,
            // A child in another namespace than its target's names it
            // by label: an ownerReference cannot cross namespaces.
            None => label(OWNER_UID_LABEL) == Some(target_uid),
        }
}

/// The namespaces a policy's `spec.namespaces` selector lets it make
/// children in: those whose labels match, not being deleted, sorted by
/// name. Read as the policy's own business (its declaration), not its
/// target author's: whether the author may write there is asked apart.
pub fn namespaces_matching(
    view: &dyn ObjectView,
    selector: &crate::labels::Selector,
) -> Vec<String> {
    view.list_for_child(&KindRef::new("v1", "Namespace"), "")
        .iter()
        .filter(|n| n.value().pointer("/metadata/deletionTimestamp").is_none())
        .filter(|n| selector.matches_object(n.value()))
        .map(|n| n.name().to_string())
        .collect()
}

/// Whether `object` is one the policy named `policy` made, for whichever
/// target: a policy that owns its own target kind (a Secret copied into
/// other namespaces) never takes its own children for targets.
pub fn made_by(policy: &str, object: &Value) -> bool {
    let labels = object.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    label(MANAGED_BY) == Some("runbook")
        && label(POLICY_NAME_LABEL) == Some(policy_label_value(policy).as_str())
}

/// The label naming the target (its uid) that a child in another
/// namespace was made for, where no ownerReference can (see
/// `spec.namespaces`).
pub const OWNER_UID_LABEL: &str = "runbook.dev/owner-uid";

/// The annotation naming that target, as the routing of its child's
/// changes needs it: `{"apiVersion", "kind", "namespace", "name"}` as JSON.
pub const OWNER_ANNOTATION: &str = "runbook.dev/owner";

/// The target a child in another namespace names in its annotation:
/// (apiVersion, kind, namespace, name).
pub fn owner_elsewhere(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<(String, String, String, String)> {
    let text = annotations?.get(OWNER_ANNOTATION)?;
    let v: Value = serde_json::from_str(text).ok()?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    Some((s("apiVersion")?, s("kind")?, s("namespace")?, s("name")?))
}

/// The uid of the object's controller (the ownerReference with
/// `controller: true`), if it has one.
pub fn controller_uid(v: &Value) -> Option<&str> {
    v.get("metadata")?
        .get("ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))?
        .get("uid")?
        .as_str()
}

/// The label naming the policy that made a child: each policy on a target
/// sees, counts and cleans up only its own children.
pub const POLICY_NAME_LABEL: &str = "runbook.dev/policy-name";

/// A policy's name as a label value (63 characters at most: a longer name
/// is cut and ends in a hash of the whole).
pub fn policy_label_value(policy: &str) -> String {
    if policy.len() <= 63 {
        return policy.to_string();
    }
    let hash = crate::util::hash::short_hex(policy.as_bytes(), 8);
    let mut head: String = policy.chars().take(63 - hash.len() - 1).collect();
    while head.ends_with(['-', '.']) {
        head.pop();
    }
    format!("{head}-{hash}")
}

/// The policy a child says made it, if it says.
pub fn policy_of_child(v: &Value) -> Option<&str> {
    v.get("metadata")?
        .get("labels")?
        .get(POLICY_NAME_LABEL)?
        .as_str()
}

/// Where a policy on `target` acts: see [`CachedObject::acting_namespace`].
pub fn acting_namespace(target: &Value) -> &str {
    let is_namespace = target.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && target.get("kind").and_then(Value::as_str) == Some("Namespace");
    if is_namespace {
        meta_str(target, "name")
    } else {
        meta_str(target, "namespace")
    }
}

/// [`acting_namespace`] of a target known by its kind, namespace and name.
pub fn acting_namespace_of<'a>(
    kind: &crate::kinds::KindRef,
    namespace: &'a str,
    name: &'a str,
) -> &'a str {
    if kind.api_version == "v1" && kind.kind == "Namespace" {
        name
    } else {
        namespace
    }
}

fn meta_str<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The finalizers an object carries.
pub fn finalizers_of(v: &Value) -> Vec<String> {
    v.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

/// The uids an object's ownerReferences name.
pub fn owner_uids(v: &Value) -> impl Iterator<Item = &str> {
    // (A child in another namespace is found through its label instead:
    // see `ObjectView::children_elsewhere`.)
    v.get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

/// What this process wrote that its watch caches may not show yet, by
/// object, with what identifies the write (the hash applied, or the
/// version written over). Deciding before the cache catches up would
/// repeat the write: the executor keeps one for children it applied, the
/// runtime one for status it wrote.
pub struct OwnWrites<K, V>(std::sync::Mutex<std::collections::HashMap<K, V>>);

impl<K, V> Default for OwnWrites<K, V> {
    fn default() -> Self {
        Self(std::sync::Mutex::new(std::collections::HashMap::new()))
    }
}

impl<K: std::hash::Hash + Eq, V: Clone> OwnWrites<K, V> {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<K, V>> {
        crate::util::lock(&self.0)
    }

    /// This process wrote `key`, identified by `write`.
    pub fn remember(&self, key: K, write: V) {
        self.map().insert(key, write);
    }

    /// The write of `key` the cache may not show yet.
    pub fn pending(&self, key: &K) -> Option<V> {
        self.map().get(key).cloned()
    }

    /// The cache shows `key` as written (or it is gone): forget it.
    pub fn settled(&self, key: &K) {
        self.map().remove(key);
    }

    /// Keep only the writes whose key `keep` says.
    pub fn retain(&self, keep: impl Fn(&K) -> bool) {
        self.map().retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}

/// Read access to cached objects of the kinds a policy declared.
pub trait ObjectView: Send + Sync {
    /// Every object of `kind` in `namespace`, sorted by name.
    fn list(&self, kind: &KindRef, namespace: &str) -> Vec<Arc<CachedObject>>;

    /// One object by name.
    fn get(&self, kind: &KindRef, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        self.list(kind, namespace)
            .into_iter()
            .find(|o| o.name() == name)
    }

    /// [`ObjectView::list`], for what one of the policy's own children
    /// owns or selects (the pods of its Job): read on the target's behalf
    /// without its author's rights, since the child is Runbook's own.
    fn list_for_child(&self, kind: &KindRef, namespace: &str) -> Vec<Arc<CachedObject>> {
        self.list(kind, namespace)
    }

    /// Objects of `kind` in `namespace` whose labels satisfy `selector`,
    /// sorted by name. Caches answer this from a label index.
    fn select(
        &self,
        kind: &KindRef,
        namespace: &str,
        selector: &crate::labels::Selector,
    ) -> Vec<Arc<CachedObject>> {
        let mut found = self.list(kind, namespace);
        found.retain(|o| selector.matches_object(o.value()));
        found
    }

    /// [`ObjectView::select`], read for one of the policy's own children
    /// (see [`ObjectView::list_for_child`]).
    fn select_for_child(
        &self,
        kind: &KindRef,
        namespace: &str,
        selector: &crate::labels::Selector,
    ) -> Vec<Arc<CachedObject>> {
        self.select(kind, namespace, selector)
    }

    /// [`ObjectView::owned_by`] for an owner other than the target (a
    /// Deployment's ReplicaSets): a read of the namespace like
    /// [`ObjectView::list`], answered from the owner index.
    fn list_owned_by(&self, kind: &KindRef, namespace: &str, uid: &str) -> Vec<Arc<CachedObject>> {
        self.owned_by(kind, namespace, uid)
    }

    /// Every object of `kind` in every namespace the caches hold (or, of
    /// a cluster-scoped kind, all of them), sorted by namespace and name:
    /// what a sweep lists at its fire time.
    fn every(&self, kind: &KindRef) -> Vec<Arc<CachedObject>>;

    /// The children of `kind` made for the target with uid `uid` in other
    /// namespaces than its own (they name it by label, see
    /// [`OWNER_UID_LABEL`]), sorted by namespace and name.
    fn children_elsewhere(&self, kind: &KindRef, uid: &str) -> Vec<Arc<CachedObject>>;

    /// Objects of `kind` in `namespace` with an ownerReference to `uid`,
    /// sorted by name. Caches answer this from an index.
    fn owned_by(&self, kind: &KindRef, namespace: &str, uid: &str) -> Vec<Arc<CachedObject>> {
        self.list(kind, namespace)
            .into_iter()
            .filter(|o| o.is_owned_by(uid))
            .collect()
    }
}

type Key = (KindRef, String);

/// An in-memory view for tests, `runbook test` fixtures and benchmarks.
#[derive(Default)]
pub struct MemoryView {
    objects: RwLock<BTreeMap<Key, BTreeMap<String, Arc<CachedObject>>>>,
}

impl MemoryView {
    pub fn new() -> Self {
        Self::default()
    }

    /// Insert or replace an object; its kind comes from `apiVersion`/`kind`.
    pub fn insert(&self, value: Value) -> Arc<CachedObject> {
        let kind = KindRef::new(
            value["apiVersion"].as_str().unwrap_or_default(),
            value["kind"].as_str().unwrap_or_default(),
        );
        let obj = CachedObject::new(value);
        let key = (kind, obj.namespace().to_string());
        crate::util::write(&self.objects)
            .entry(key)
            .or_default()
            .insert(obj.name().to_string(), obj.clone());
        obj
    }

    pub fn remove(&self, kind: &KindRef, namespace: &str, name: &str) {
        if let Some(m) =
            crate::util::write(&self.objects).get_mut(&(kind.clone(), namespace.to_string()))
        {
            m.remove(name);
        }
    }
}

impl ObjectView for MemoryView {
    fn list(&self, kind: &KindRef, namespace: &str) -> Vec<Arc<CachedObject>> {
        crate::util::read(&self.objects)
            .get(&(kind.clone(), namespace.to_string()))
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    fn get(&self, kind: &KindRef, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        crate::util::read(&self.objects)
            .get(&(kind.clone(), namespace.to_string()))
            .and_then(|m| m.get(name).cloned())
    }

    fn every(&self, kind: &KindRef) -> Vec<Arc<CachedObject>> {
        crate::util::read(&self.objects)
            .iter()
            .filter(|((k, _), _)| k == kind)
            .flat_map(|(_, m)| m.values().cloned())
            .collect()
    }

    fn children_elsewhere(&self, kind: &KindRef, uid: &str) -> Vec<Arc<CachedObject>> {
        let objects = crate::util::read(&self.objects);
        objects
            .iter()
            .filter(|((k, _), _)| k == kind)
            .flat_map(|(_, m)| m.values())
            .filter(|o| {
                controller_uid(o.value()).is_none()
                    && o.value()
                        .pointer("/metadata/labels")
                        .and_then(|l| l.get(OWNER_UID_LABEL))
                        .and_then(Value::as_str)
                        == Some(uid)
            })
            .cloned()
            .collect()
    }
}
