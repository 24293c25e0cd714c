//! The sandbox's state: every object of every served kind, one global
//! resourceVersion, a bounded history of changes for watches, the watches
//! themselves, and the garbage collection of dependents.
//!
//! Objects are kept as their JSON bytes with a small index (labels, owners,
//! finalizers) beside them: reads and watches hand out the bytes as they
//! are; writes parse, change and serialise. Everything happens under one
//! lock, so every request sees a consistent state and resourceVersions are
//! strictly ordered.

mod lifecycle;
mod read;
mod typed;
mod validate;
mod write;

use super::fields;
use super::patch;
use super::registry::{self, ResKey, ResourceDef};
use super::schema;
use super::status::{ApiError, Cause};
use ModifyFail::{Conflicted, Failed};
use bytes::Bytes;
use runbook_core::clock::Clock;
use runbook_core::labels::Selector;
use runbook_core::names;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// (namespace, name); the namespace is empty for cluster-scoped kinds.
pub type ObjKey = (String, String);

/// The ConfigMap every namespace holds on a real cluster.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// What the sandbox publishes as its CA: it serves plain HTTP, so this is
/// a placeholder with the shape of a PEM bundle, not a usable certificate.
pub(super) const SANDBOX_CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nc2FuZGJveA==\n-----END CERTIFICATE-----\n";

/// Tunables.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Watch events kept for resuming watches; older resourceVersions get 410.
    pub history_limit: usize,
    /// Events queued for one watch before it is closed as too slow.
    pub watch_queue_limit: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            history_limit: 20_000,
            watch_queue_limit: 200_000,
        }
    }
}

pub(super) struct Inner {
    rv: u64,
    /// How many uids and generated names each name (or prefix) has had:
    /// see [`Inner::draw`].
    draws: HashMap<u64, u32>,
    defs: BTreeMap<ResKey, Arc<ResourceDef>>,
    objects: HashMap<ResKey, BTreeMap<ObjKey, Stored>>,
    by_uid: HashMap<String, (ResKey, ObjKey)>,
    dependents: HashMap<String, BTreeSet<(ResKey, ObjKey)>>,
    history: VecDeque<HistEvent>,
    compacted: u64,
    /// Where the watch cache of a CRD's kind begins: the version its CRD
    /// was made at. A watch from before it gets 410 Gone, as a real API
    /// server answers once a CRD is deleted and made again.
    served_since: HashMap<ResKey, u64>,
    watchers: HashMap<ResKey, Vec<Watcher>>,
    next_watch: u64,
    /// Objects waiting in foreground deletion for their dependents.
    foreground: BTreeSet<(ResKey, ObjKey)>,
    /// Namespaces being deleted.
    terminating: BTreeSet<String>,
}

/// The store.
pub struct Store {
    inner: Mutex<Inner>,
    clock: Clock,
    config: StoreConfig,
    /// First pages of lists served (continuations not counted).
    lists: std::sync::atomic::AtomicU64,
}

/// Serialise for keeping: the buffer is trimmed to its length, since a
/// stored object would otherwise hold the serialiser's spare capacity.
pub(super) fn to_bytes(v: &Value) -> Bytes {
    let mut buf = serde_json::to_vec(v).unwrap_or_default();
    buf.shrink_to_fit();
    Bytes::from(buf)
}

pub(super) fn meta_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
}

pub(super) fn labels_of(v: &Value) -> Labels {
    // serde_json's map is ordered, so the pairs come sorted.
    Labels(
        v.get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.as_str().into(), s.into())))
                    .collect()
            })
            .unwrap_or_default(),
    )
}

pub(super) fn owners_of(v: &Value) -> Box<[Box<str>]> {
    runbook_core::observe::owner_uids(v)
        .map(Into::into)
        .collect()
}

pub(super) use runbook_core::observe::finalizers_of;

pub(super) fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    v["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

pub(super) fn without(v: &Value, keys: &[&str]) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

pub(super) const GENERATE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A uid in the UUID form, from a number drawn for it.
pub(super) fn uid_from(seq: u64) -> String {
    let a = runbook_core::util::hash::fnv64(&seq.to_le_bytes());
    let b = runbook_core::util::hash::fnv64(&a.to_le_bytes());
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// An object's labels, sorted by key: compact, since every stored object
/// and every remembered event keeps a copy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Box<[(Box<str>, Box<str>)]>);

impl Labels {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| self.0[i].1.as_ref())
    }

    fn matched_by(&self, sel: &Selector) -> bool {
        sel.is_empty() || sel.matches_with(|k| self.get(k))
    }
}

#[derive(Clone, Debug)]
struct Stored {
    bytes: Bytes,
    rv: u64,
    uid: Box<str>,
    labels: Labels,
    owners: Box<[Box<str>]>,
}

/// ADDED, MODIFIED or DELETED.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

#[derive(Clone, Debug)]
struct HistEvent {
    rv: u64,
    res: ResKey,
    key: ObjKey,
    ty: EventType,
    bytes: Bytes,
    /// What the object was before (none for ADDED): later pages of a list
    /// are served as of the list's resourceVersion.
    old_bytes: Option<Bytes>,
    old_labels: Option<Labels>,
    new_labels: Labels,
}

/// A field selector: `metadata.name`, `metadata.namespace` and the
/// kind's selectable fields (a CRD's `selectableFields`), with `=`, `==`
/// or `!=`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parse `text`; a field outside the metadata pair and `selectable` is
    /// refused as the API server refuses it.
    pub fn parse(text: &str, selectable: &[String]) -> Result<Self, ApiError> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: {part:?}: no operator"
                )));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !selectable.iter().any(|s| s == field)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            out.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(Self(out))
    }

    /// Whether the metadata fields match the key.
    fn matches(&self, key: &ObjKey) -> bool {
        self.0.iter().all(|(f, eq, v)| {
            let have = match f.as_str() {
                "metadata.name" => &key.1,
                "metadata.namespace" => &key.0,
                _ => return true,
            };
            (have == v) == *eq
        })
    }

    /// Whether the selectable fields match the object: a missing field
    /// reads as "", a boolean or an integer as its text, as the API server
    /// renders them. Objects are read only when the selector names such a
    /// field.
    fn matches_object(&self, bytes: &Bytes) -> bool {
        let body: Vec<&(String, bool, String)> = self
            .0
            .iter()
            .filter(|(f, _, _)| !f.starts_with("metadata."))
            .collect();
        if body.is_empty() {
            return true;
        }
        let obj: Value = serde_json::from_slice(bytes).unwrap_or_default();
        body.iter().all(|(f, eq, v)| {
            let mut at = &obj;
            for part in f.split('.') {
                at = &at[part];
            }
            let have = match at {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                _ => String::new(),
            };
            (&have == v) == *eq
        })
    }
}

/// Filters of a list or watch.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: FieldSelector,
}

impl Filter {
    fn matches(&self, key: &ObjKey, labels: &Labels, bytes: &Bytes) -> bool {
        self.namespace.as_ref().is_none_or(|ns| ns == &key.0)
            && self.fields.matches(key)
            && labels.matched_by(&self.labels)
            && self.fields.matches_object(bytes)
    }
}

/// How a watch renders each event.
pub trait EventRenderer: Send + Sync {
    /// One watch line (with its trailing newline) for an event.
    fn line(&self, ty: &str, object: &Bytes) -> Bytes;
}

struct Watcher {
    id: u64,
    filter: Filter,
    tx: mpsc::UnboundedSender<Bytes>,
    queued: Arc<AtomicUsize>,
    renderer: Arc<dyn EventRenderer>,
}

/// The receiving end of a watch.
pub struct WatchStream {
    pub id: u64,
    pub rx: mpsc::UnboundedReceiver<Bytes>,
    pub queued: Arc<AtomicUsize>,
}

/// Options every write takes.
#[derive(Clone, Debug, Default)]
pub struct WriteOpts {
    pub dry_run: bool,
    /// `Strict` refuses unknown fields; `Warn` (the default) prunes and warns; `Ignore` prunes.
    pub field_validation: FieldValidation,
    pub field_manager: Option<String>,
    pub force: bool,
    /// What mutating admission webhooks made of the object: applied to it
    /// once the write has made it, before validation.
    pub admit: Option<Admit>,
}

/// A change admission makes to an object being written.
#[derive(Clone)]
pub struct Admit(pub Arc<AdmitFn>);

/// The function behind [`Admit`]: it changes the object or refuses it.
pub type AdmitFn = dyn Fn(&mut Value) -> Result<(), ApiError> + Send + Sync;

impl std::fmt::Debug for Admit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admit(..)")
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Strict,
    #[default]
    Warn,
    Ignore,
}

/// The result of a write.
#[derive(Clone, Debug)]
pub struct Written {
    pub bytes: Bytes,
    pub created: bool,
    pub warnings: Vec<String>,
}

/// Delete propagation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

#[derive(Clone, Debug, Default)]
pub struct DeleteOpts {
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

/// What a delete did.
#[derive(Clone, Debug)]
pub enum Deleted {
    /// Gone now; the final state of the object.
    Gone(Bytes),
    /// Waiting on finalizers; the object as it is now.
    Pending(Bytes),
}

/// A page of a list.
pub struct Listed {
    pub items: Vec<Bytes>,
    pub rv: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// Which part of an object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

/// How a patch body is to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

/// A patch: how its body is to be read, and the body.
pub struct PatchBody {
    pub kind: PatchKind,
    pub body: Value,
}

/// Why a modification function gave up.
pub enum ModifyFail {
    Conflicted,
    Failed(ApiError),
}

pub enum WriteFail {
    Api(ApiError),
}

impl Store {
    pub fn new(clock: Clock, config: StoreConfig) -> Self {
        let mut defs = BTreeMap::new();
        for d in registry::builtins() {
            defs.insert(d.key(), Arc::new(d));
        }
        let store = Self {
            inner: Mutex::new(Inner {
                rv: 0,
                draws: HashMap::new(),
                defs,
                objects: HashMap::new(),
                by_uid: HashMap::new(),
                dependents: HashMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                served_since: HashMap::new(),
                watchers: HashMap::new(),
                next_watch: 1,
                foreground: BTreeSet::new(),
                terminating: BTreeSet::new(),
            }),
            clock,
            config,
            lists: std::sync::atomic::AtomicU64::new(0),
        };
        let ns = store
            .def("", "namespaces")
            .expect("namespaces are built in");
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            store
                .create(
                    &ns,
                    "",
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
                    &WriteOpts::default(),
                )
                .expect("creating a built-in namespace");
        }
        store
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        runbook_core::util::lock(&self.inner)
    }

    fn now(&self) -> String {
        runbook_core::util::time::format(self.clock.now())
    }

    /// The resource type served under a group and plural.
    pub fn def(&self, group: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.lock()
            .defs
            .get(&(group.to_string(), plural.to_string()))
            .cloned()
    }

    /// Every served resource type.
    pub fn defs(&self) -> Vec<Arc<ResourceDef>> {
        self.lock().defs.values().cloned().collect()
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Number of stored objects (all kinds).
    pub fn len(&self) -> usize {
        self.lock().objects.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
pub(super) mod tests {
    //! A store for the parts' tests, and a few ways to write into it.
    use super::*;

    /// A store with the built-in kinds and the namespace `ns`.
    pub fn store() -> Store {
        let start = "2026-11-29T10:00:00Z".parse().unwrap();
        let s = Store::new(Clock::manual(start), StoreConfig::default());
        let ns = def(&s, "", "namespaces");
        s.create(
            &ns,
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}),
            &WriteOpts::default(),
        )
        .unwrap();
        s
    }

    pub fn def(s: &Store, group: &str, plural: &str) -> Arc<ResourceDef> {
        s.def(group, plural).expect("a served kind")
    }

    /// Create a ConfigMap `name` in `ns`, with these labels and metadata.
    pub fn config_map(s: &Store, name: &str, meta: Value) -> Result<Value, ApiError> {
        let cms = def(s, "", "configmaps");
        let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta});
        obj["metadata"]["name"] = json!(name);
        let w = s.create(&cms, "ns", obj, &WriteOpts::default())?;
        Ok(serde_json::from_slice(&w.bytes).unwrap())
    }

    #[test]
    fn uids_look_like_uuids_and_differ() {
        let a = uid_from(1);
        assert_eq!(a.len(), 36);
        assert_ne!(a, uid_from(2));
    }

    /// An object's uid depends on what it is and how often that name was
    /// made before, not on what else was written first: two simulations
    /// of one scenario give their objects the same uids however their
    /// writes interleave. A name made again gets another uid.
    #[test]
    fn uids_follow_the_name_not_the_order_of_writes() {
        let uid = |v: &Value| v["metadata"]["uid"].as_str().unwrap().to_string();
        let (one, two) = (store(), store());
        let a1 = uid(&config_map(&one, "a", json!({})).unwrap());
        let b1 = uid(&config_map(&one, "b", json!({})).unwrap());
        let b2 = uid(&config_map(&two, "b", json!({})).unwrap());
        let a2 = uid(&config_map(&two, "a", json!({})).unwrap());
        assert_eq!((a1.as_str(), b1.as_str()), (a2.as_str(), b2.as_str()));
        assert_ne!(a1, b1);
        let cms = def(&one, "", "configmaps");
        one.delete(&cms, "ns", "a", &Default::default()).unwrap();
        let again = uid(&config_map(&one, "a", json!({})).unwrap());
        assert_ne!(again, a1, "made again, it is another object");
    }

    #[test]
    fn every_namespace_holds_the_root_ca_config_map() {
        let s = store();
        let cms = def(&s, "", "configmaps");
        assert!(s.get(&cms, "ns", ROOT_CA_CONFIGMAP).is_ok());
    }
}
