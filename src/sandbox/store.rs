//! The sandbox's state: every object of every served kind, one global
//! resourceVersion, a bounded history of changes for watches, the watches
//! themselves, and the garbage collection of dependents.
//!
//! Objects are kept as their JSON bytes with a small index (labels, owners,
//! finalizers) beside them: reads and watches hand out the bytes as they
//! are; writes parse, change and serialise. Everything happens under one
//! lock, so every request sees a consistent state and resourceVersions are
//! strictly ordered.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::fields;
use super::patch;
use super::registry::{self, ResKey, ResourceDef};
use super::schema;
use super::status::{ApiError, Cause};
use crate::clock::Clock;
use crate::labels::Selector;
use crate::names;

/// (namespace, name); the namespace is empty for cluster-scoped kinds.
pub type ObjKey = (String, String);

/// The ConfigMap every namespace holds on a real cluster.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// What the sandbox publishes as its CA: it serves plain HTTP, so this is
/// a placeholder with the shape of a PEM bundle, not a usable certificate.
const SANDBOX_CA_PEM: &str =
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
    old_labels: Option<Labels>,
    new_labels: Labels,
}

/// A field selector the sandbox supports: `metadata.name` and
/// `metadata.namespace`, with `=`, `==` or `!=`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(text: &str) -> Result<Self, ApiError> {
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
            if field != "metadata.name" && field != "metadata.namespace" {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            out.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(Self(out))
    }

    fn matches(&self, key: &ObjKey) -> bool {
        self.0.iter().all(|(f, eq, v)| {
            let have = if f == "metadata.name" { &key.1 } else { &key.0 };
            (have == v) == *eq
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
    fn matches(&self, key: &ObjKey, labels: &Labels) -> bool {
        self.namespace.as_ref().is_none_or(|ns| ns == &key.0)
            && self.fields.matches(key)
            && labels.matched_by(&self.labels)
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

struct Inner {
    rv: u64,
    seq: u64,
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
fn to_bytes(v: &Value) -> Bytes {
    let mut buf = serde_json::to_vec(v).unwrap_or_default();
    buf.shrink_to_fit();
    Bytes::from(buf)
}

fn meta_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
}

fn labels_of(v: &Value) -> Labels {
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

fn owners_of(v: &Value) -> Box<[Box<str>]> {
    crate::observe::owner_uids(v).map(Into::into).collect()
}

fn finalizers_of(v: &Value) -> Vec<String> {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    v["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

fn without(v: &Value, keys: &[&str]) -> Value {
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

/// Two objects equal but for `managedFields` times and the resourceVersion,
/// compared without copying either.
fn same_content(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    if a.len() != b.len() {
        return false;
    }
    a.iter().all(|(k, av)| {
        let Some(bv) = b.get(k) else { return false };
        if k != "metadata" {
            return av == bv;
        }
        let (Some(am), Some(bm)) = (av.as_object(), bv.as_object()) else {
            return av == bv;
        };
        let keys = |m: &Map<String, Value>| m.keys().filter(|k| *k != "resourceVersion").count();
        keys(am) == keys(bm)
            && am
                .iter()
                .filter(|(k, _)| *k != "resourceVersion")
                .all(|(k, x)| match (k.as_str(), bm.get(k)) {
                    (_, None) => false,
                    ("managedFields", Some(y)) => same_managed(x, y),
                    (_, Some(y)) => x == y,
                })
    })
}

fn same_managed(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_array(), b.as_array()) else {
        return a == b;
    };
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| match (x.as_object(), y.as_object()) {
                (Some(x), Some(y)) => {
                    x.len() == y.len() && x.iter().all(|(k, v)| k == "time" || y.get(k) == Some(v))
                }
                _ => x == y,
            })
}

const GENERATE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl Store {
    pub fn new(clock: Clock, config: StoreConfig) -> Self {
        let mut defs = BTreeMap::new();
        for d in registry::builtins() {
            defs.insert(d.key(), Arc::new(d));
        }
        let store = Self {
            inner: Mutex::new(Inner {
                rv: 0,
                seq: 0,
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
        crate::util::lock(&self.inner)
    }

    fn now(&self) -> String {
        crate::util::time::format(self.clock.now())
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

    // ----- reads -----

    pub fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> Result<Bytes, ApiError> {
        let inner = self.lock();
        inner
            .objects
            .get(&def.storage())
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .map(|s| s.bytes.clone())
            .ok_or_else(|| ApiError::not_found(def, name))
    }

    pub fn list(
        &self,
        def: &ResourceDef,
        filter: &Filter,
        limit: Option<usize>,
        cont: Option<&str>,
    ) -> Result<Listed, ApiError> {
        if cont.is_none() {
            self.lists
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let inner = self.lock();
        let (start, list_rv) = match cont {
            Some(token) => {
                let (rv, ns, name) = decode_continue(token)?;
                if rv < inner.compacted {
                    return Err(ApiError::gone(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (Some((ns, name)), rv)
            }
            None => (None, inner.rv),
        };
        let empty = BTreeMap::new();
        let objs = inner.objects.get(&def.storage()).unwrap_or(&empty);
        let range: Box<dyn Iterator<Item = (&ObjKey, &Stored)>> = match (&start, &filter.namespace)
        {
            (Some(s), _) => Box::new(objs.range((
                std::ops::Bound::Excluded(s.clone()),
                std::ops::Bound::Unbounded,
            ))),
            (None, Some(ns)) => Box::new(objs.range((ns.clone(), String::new())..)),
            (None, None) => Box::new(objs.iter()),
        };
        let mut items = Vec::new();
        let mut last: Option<&ObjKey> = None;
        let mut remaining = 0u64;
        for (k, s) in range {
            if let Some(ns) = &filter.namespace
                && &k.0 != ns
            {
                if k.0 > *ns {
                    break;
                }
                continue;
            }
            if !filter.matches(k, &s.labels) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                remaining += 1;
                continue;
            }
            items.push(s.bytes.clone());
            last = Some(k);
        }
        let continue_token = if remaining > 0 {
            last.map(|k| encode_continue(list_rv, &k.0, &k.1))
        } else {
            None
        };
        Ok(Listed {
            items,
            rv: list_rv,
            continue_token,
            remaining: (remaining > 0).then_some(remaining),
        })
    }

    // ----- watches -----

    /// Start a watch. `rv` None (or 0) sends the current objects as ADDED
    /// first; otherwise every change after `rv` is replayed.
    #[allow(clippy::too_many_arguments)]
    pub fn watch(
        &self,
        def: &ResourceDef,
        filter: Filter,
        rv: Option<u64>,
        send_initial: bool,
        renderer: Arc<dyn EventRenderer>,
        initial_bookmark: Option<Box<dyn Fn(u64) -> Bytes + Send>>,
    ) -> Result<WatchStream, ApiError> {
        let mut inner = self.lock();
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let key = def.storage();
        let send = |line: Bytes| {
            queued.fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(line);
        };
        match rv {
            Some(rv) if rv > 0 && !send_initial => {
                let oldest = inner
                    .compacted
                    .max(inner.served_since.get(&key).copied().unwrap_or(0));
                if rv < oldest {
                    let status =
                        ApiError::gone(format!("too old resource version: {rv} ({oldest})"))
                            .to_status();
                    send(Bytes::from(format!(
                        "{}\n",
                        json!({"type": "ERROR", "object": status})
                    )));
                    drop(tx);
                    return Ok(WatchStream { id: 0, rx, queued });
                }
                for e in inner.history.iter().filter(|e| e.rv > rv && e.res == key) {
                    if let Some(ty) = visible(&filter, e) {
                        send(renderer.line(ty, &e.bytes));
                    }
                }
            }
            _ => {
                if let Some(objs) = inner.objects.get(&key) {
                    for (k, s) in objs {
                        if filter.matches(k, &s.labels) {
                            send(renderer.line("ADDED", &s.bytes));
                        }
                    }
                }
                if let Some(mark) = initial_bookmark {
                    send(mark(inner.rv));
                }
            }
        }
        let id = inner.next_watch;
        inner.next_watch += 1;
        inner.watchers.entry(key).or_default().push(Watcher {
            id,
            filter,
            tx: tx.clone(),
            queued: queued.clone(),
            renderer,
        });
        Ok(WatchStream { id, rx, queued })
    }

    /// Push a line (a bookmark) into one watch, in order with its events.
    pub fn send_to_watch(
        &self,
        def: &ResourceDef,
        id: u64,
        make: impl FnOnce(u64) -> Bytes,
    ) -> bool {
        let inner = self.lock();
        let rv = inner.rv;
        match inner
            .watchers
            .get(&def.storage())
            .and_then(|ws| ws.iter().find(|w| w.id == id))
        {
            Some(w) => {
                w.queued.fetch_add(1, Ordering::Relaxed);
                w.tx.send(make(rv)).is_ok()
            }
            None => false,
        }
    }

    pub fn stop_watch(&self, def: &ResourceDef, id: u64) {
        let mut inner = self.lock();
        if let Some(ws) = inner.watchers.get_mut(&def.storage()) {
            ws.retain(|w| w.id != id);
        }
    }

    /// Close every open watch (a fault the tests inject).
    pub fn cut_watches(&self) {
        self.lock().watchers.clear();
    }

    /// Lists served so far (first pages only).
    pub fn lists_served(&self) -> u64 {
        self.lists.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Forget the watch history up to now, as an etcd compaction does: a
    /// watch resumed from an older resourceVersion gets 410 Gone and its
    /// client must list again.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    pub fn watch_count(&self) -> usize {
        self.lock().watchers.values().map(Vec::len).sum()
    }

    // ----- writes -----

    pub fn create(
        &self,
        def: &ResourceDef,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Written, ApiError> {
        let mut inner = self.lock();
        let mut warnings = Vec::new();
        check_identity(def, &obj, ns, None)?;
        if !obj.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        if def.namespaced {
            inner.check_namespace(ns, true)?;
        }
        let meta = meta_mut(&mut obj);
        if def.namespaced {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            let Some(prefix) = meta
                .get("generateName")
                .and_then(Value::as_str)
                .map(str::to_string)
            else {
                return Err(ApiError::invalid(
                    def,
                    "",
                    vec![Cause::required("metadata.name")],
                ));
            };
            name = inner.generate_name(def, ns, &prefix);
            meta.insert("name".into(), json!(name));
        }
        validate_meta(def, &obj, &name)?;
        let key = (ns.to_string(), name.clone());
        if inner
            .objects
            .get(&def.storage())
            .is_some_and(|m| m.contains_key(&key))
        {
            return Err(ApiError::already_exists(def, &name));
        }
        inner.seq += 1;
        let uid = uid_from(inner.seq);
        let now = self.now();
        let meta = meta_mut(&mut obj);
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(now));
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
        ] {
            meta.remove(k);
        }
        if def.has_generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        // Status is the server's (and the controllers') to write: a create
        // starts it afresh, as the API server's create strategies do.
        if def.status_subresource
            && let Some(m) = obj.as_object_mut()
        {
            match (def.group.as_str(), def.kind.as_str()) {
                ("", "Pod") => m.insert("status".into(), json!({"phase": "Pending"})),
                ("", "Namespace") => m.insert("status".into(), json!({"phase": "Active"})),
                ("", "PersistentVolumeClaim") => {
                    m.insert("status".into(), json!({"phase": "Pending"}))
                }
                _ => m.remove("status"),
            };
        }
        default_builtin(def, &mut obj, &uid);
        inner.validate_content(def, &mut obj, opts, &mut warnings, &name)?;
        if def.key()
            == (
                "apiextensions.k8s.io".to_string(),
                "customresourcedefinitions".to_string(),
            )
        {
            let rd = registry::from_crd(&obj).map_err(|errs| {
                ApiError::invalid(
                    def,
                    &name,
                    errs.into_iter()
                        .map(|(f, m)| Cause {
                            field: f,
                            reason: "FieldValueInvalid",
                            message: m,
                        })
                        .collect(),
                )
            })?;
            obj["status"] = registry::crd_status(&obj, &now);
            if !opts.dry_run {
                let since = inner.rv;
                inner.served_since.insert(rd.storage(), since);
                inner.defs.insert(rd.key(), Arc::new(rd));
            }
        }
        if let Some(manager) = &opts.field_manager {
            let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
            fields::record_update(&json!({}), &mut obj, manager, &api_version, None, &now);
        }
        if opts.dry_run {
            return Ok(Written {
                bytes: Bytes::from(serde_json::to_vec(&obj).unwrap_or_default()),
                created: true,
                warnings,
            });
        }
        let bytes = inner.commit(def, key.clone(), obj, EventType::Added, &self.config);
        inner.collect_if_orphaned(def, &key, &self.config, &now);
        drop(inner);
        if def.key() == (String::new(), "namespaces".to_string()) {
            self.publish_root_ca(&name);
        }
        Ok(Written {
            bytes,
            created: true,
            warnings,
        })
    }

    /// Every namespace of a real cluster holds the `kube-root-ca.crt`
    /// ConfigMap (kube-controller-manager's root CA publisher writes it as
    /// soon as the namespace exists), so lists of ConfigMaps see it too.
    fn publish_root_ca(&self, namespace: &str) {
        let Some(def) = self.def("", "configmaps") else {
            return;
        };
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": ROOT_CA_CONFIGMAP,
                "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}
            },
            "data": {"ca.crt": SANDBOX_CA_PEM}
        });
        let opts = WriteOpts {
            field_manager: Some("kube-controller-manager".into()),
            ..WriteOpts::default()
        };
        // Racing a test that made it first is fine: it exists either way.
        let _ = self.create(&def, namespace, cm, &opts);
    }

    /// Replace an object (PUT).
    pub fn update(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        obj: Value,
        part: Part,
        opts: &WriteOpts,
    ) -> Result<Written, ApiError> {
        check_identity(def, &obj, ns, Some(name))?;
        let want_rv = meta_str(&obj, "resourceVersion").map(str::to_string);
        let manager = opts.field_manager.clone();
        self.modify(def, ns, name, part, opts, move |old| {
            if let Some(rv) = &want_rv
                && meta_str(old, "resourceVersion") != Some(rv.as_str())
            {
                return Err(Conflicted);
            }
            Ok((obj, manager))
        })
    }

    /// Patch an object. An apply patch of a missing object creates it.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        kind: PatchKind,
        body: Value,
        part: Part,
        opts: &WriteOpts,
    ) -> Result<Written, ApiError> {
        if kind == PatchKind::Strategic && def.crd.is_some() {
            return Err(ApiError::unsupported_media(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        if kind == PatchKind::Apply {
            let Some(manager) = opts.field_manager.clone().filter(|m| !m.is_empty()) else {
                return Err(ApiError::bad_request(
                    "PATCH, fieldManager is required for apply patches",
                ));
            };
            check_identity(def, &body, ns, Some(name))?;
            let exists = self.get(def, ns, name).is_ok();
            if !exists {
                if part == Part::Status {
                    return Err(ApiError::not_found(def, name));
                }
                let mut obj = body.clone();
                meta_mut(&mut obj).insert("name".into(), json!(name));
                let created_opts = WriteOpts {
                    field_manager: None,
                    ..opts.clone()
                };
                let now = self.now();
                let api_version = body["apiVersion"].as_str().unwrap_or_default().to_string();
                let applied =
                    fields::apply(&json!({}), &body, &manager, true, &api_version, None, &now)
                        .map_err(|_| {
                            ApiError::internal("apply to an empty object cannot conflict")
                        })?;
                fields::write_managed(&mut obj, &applied.managed);
                return self.create(def, ns, obj, &created_opts);
            }
            let now = self.now();
            let force = opts.force;
            let def2 = def.clone();
            let name2 = name.to_string();
            return self.modify_with(def, ns, name, part, opts, move |old| {
                let api_version = body["apiVersion"].as_str().unwrap_or_default().to_string();
                let sub = (part == Part::Status).then_some("status");
                let applied_cfg = match part {
                    // The status subresource takes only status from an apply.
                    Part::Status => json!({"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": {"name": name2}, "status": body.get("status").cloned().unwrap_or(json!({}))}),
                    Part::Main => body,
                };
                match fields::apply(old, &applied_cfg, &manager, force, &api_version, sub, &now) {
                    Ok(a) => {
                        let mut o = a.object;
                        fields::write_managed(&mut o, &a.managed);
                        Ok(o)
                    }
                    Err(conflicts) => {
                        let n = conflicts.len();
                        let lines: Vec<String> = conflicts.iter().map(|c| format!("conflict with \"{}\": {}", c.manager, c.path)).collect();
                        let mut e = ApiError::conflict_msg(&def2, &name2, &format!(
                            "Apply failed with {n} conflict{}: {}",
                            if n == 1 { "" } else { "s" },
                            lines.join("\n")
                        ));
                        e.message = format!("Apply failed with {n} conflict{}: {}", if n == 1 { "" } else { "s" }, lines.join("\n"));
                        e.details["causes"] = Value::Array(
                            conflicts.iter().map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.path})).collect(),
                        );
                        Err(WriteFail::Api(e))
                    }
                }
            });
        }
        let manager = opts.field_manager.clone();
        let def2 = def.clone();
        let name2 = name.to_string();
        self.modify(def, ns, name, part, opts, move |old| {
            let mut new = old.clone();
            match kind {
                PatchKind::Merge => patch::merge_patch(&mut new, &body),
                PatchKind::Strategic => patch::strategic_merge(&mut new, &body),
                PatchKind::Json => {
                    if let Err(e) = patch::json_patch(&mut new, &body) {
                        return Err(Failed(ApiError::new(
                            422,
                            "Invalid",
                            format!("{} \"{name2}\" is invalid: {e}", def2.qualified()),
                        )));
                    }
                }
                PatchKind::Apply => unreachable!("handled above"),
            }
            if let Some(rv) = meta_str(&body, "resourceVersion")
                && meta_str(old, "resourceVersion") != Some(rv)
            {
                return Err(Conflicted);
            }
            Ok((new, manager))
        })
    }

    fn modify(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        part: Part,
        opts: &WriteOpts,
        f: impl FnOnce(&Value) -> Result<(Value, Option<String>), ModifyFail>,
    ) -> Result<Written, ApiError> {
        let now = self.now();
        let def2 = def.clone();
        let name2 = name.to_string();
        self.modify_with(def, ns, name, part, opts, move |old| {
            let (mut new, manager) = f(old).map_err(|e| match e {
                Conflicted => WriteFail::Api(ApiError::conflict(&def2, &name2)),
                Failed(e) => WriteFail::Api(e),
            })?;
            let manager = manager.unwrap_or_else(|| "unknown".to_string());
            let api_version = new["apiVersion"].as_str().unwrap_or_default().to_string();
            let sub = (part == Part::Status).then_some("status");
            // Keep the old managedFields as the record starts from them.
            if let Some(m) = old.pointer("/metadata/managedFields") {
                meta_mut(&mut new).insert("managedFields".into(), m.clone());
            }
            fields::record_update(old, &mut new, &manager, &api_version, sub, &now);
            Ok(new)
        })
    }

    /// The shared write path: `f` turns the old object into the new one;
    /// then identity, status, generation, validation and finalizers are
    /// applied as the API server does, and the result committed unless it
    /// changes nothing.
    fn modify_with(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        part: Part,
        opts: &WriteOpts,
        f: impl FnOnce(&Value) -> Result<Value, WriteFail>,
    ) -> Result<Written, ApiError> {
        let mut inner = self.lock();
        let key = (ns.to_string(), name.to_string());
        let stored = inner
            .objects
            .get(&def.storage())
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        let old: Value =
            serde_json::from_slice(&stored.bytes).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut new = f(&old).map_err(|WriteFail::Api(e)| e)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        let mut warnings = Vec::new();
        // Identity the client cannot change.
        let om = old["metadata"].clone();
        {
            let meta = meta_mut(&mut new);
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
                "name",
            ] {
                match om.get(k) {
                    Some(v) => {
                        meta.insert(k.into(), v.clone());
                    }
                    None => {
                        meta.remove(k);
                    }
                }
            }
            meta.insert("resourceVersion".into(), om["resourceVersion"].clone());
            meta.remove("selfLink");
        }
        new["apiVersion"] = old["apiVersion"].clone();
        new["kind"] = old["kind"].clone();
        match part {
            Part::Status => {
                // Only status changes through the status subresource.
                let status = new.get("status").cloned();
                let managed = new.pointer("/metadata/managedFields").cloned();
                new = old.clone();
                match status {
                    Some(s) => new["status"] = s,
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                if let Some(m) = managed {
                    meta_mut(&mut new).insert("managedFields".into(), m);
                }
            }
            Part::Main if def.status_subresource => match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            },
            Part::Main => {}
        }
        if part == Part::Main {
            validate_meta(def, &new, name)?;
            // No new finalizers on an object that is going away.
            if om.get("deletionTimestamp").is_some() {
                let before = finalizers_of(&old);
                if finalizers_of(&new).iter().any(|f| !before.contains(f)) {
                    return Err(ApiError::invalid(
                        def,
                        name,
                        vec![Cause::forbidden(
                            "metadata.finalizers",
                            "no new finalizers can be added if the object is being deleted",
                        )],
                    ));
                }
            }
        }
        inner.validate_content(def, &mut new, opts, &mut warnings, name)?;
        if def.has_generation {
            let strip: &[&str] = if def.status_subresource {
                &["metadata", "status"]
            } else {
                &["metadata"]
            };
            let gen_old = om["generation"].as_i64().unwrap_or(1);
            let g = if without(&old, strip) != without(&new, strip) {
                gen_old + 1
            } else {
                gen_old
            };
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        let is_crd = def.key()
            == (
                "apiextensions.k8s.io".to_string(),
                "customresourcedefinitions".to_string(),
            );
        if is_crd && part == Part::Main {
            let rd = registry::from_crd(&new).map_err(|errs| {
                ApiError::invalid(
                    def,
                    name,
                    errs.into_iter()
                        .map(|(f, m)| Cause {
                            field: f,
                            reason: "FieldValueInvalid",
                            message: m,
                        })
                        .collect(),
                )
            })?;
            if !opts.dry_run {
                inner.defs.insert(rd.key(), Arc::new(rd));
            }
        }
        if same_content(&old, &new) {
            return Ok(Written {
                bytes: stored.bytes,
                created: false,
                warnings,
            });
        }
        if opts.dry_run {
            return Ok(Written {
                bytes: Bytes::from(serde_json::to_vec(&new).unwrap_or_default()),
                created: false,
                warnings,
            });
        }
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        let is_namespace = def.key() == (String::new(), "namespaces".to_string());
        if deleting && finalizers_of(&new).is_empty() && !is_namespace {
            let bytes = inner.remove(def, key, Some(new), &self.config, &self.now());
            return Ok(Written {
                bytes,
                created: false,
                warnings,
            });
        }
        let bytes = inner.commit(def, key.clone(), new, EventType::Modified, &self.config);
        inner.finish_foreground(&self.config, &self.now());
        Ok(Written {
            bytes,
            created: false,
            warnings,
        })
    }

    pub fn delete(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Deleted, ApiError> {
        let mut inner = self.lock();
        let now = self.now();
        inner.delete_one(def, ns, name, opts, &self.config, &now)
    }

    pub fn delete_collection(
        &self,
        def: &ResourceDef,
        filter: &Filter,
        opts: &DeleteOpts,
    ) -> Result<Vec<Bytes>, ApiError> {
        let mut inner = self.lock();
        let now = self.now();
        let keys: Vec<ObjKey> = inner
            .objects
            .get(&def.storage())
            .map(|m| {
                m.iter()
                    .filter(|(k, s)| filter.matches(k, &s.labels))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        let mut out = Vec::new();
        for (ns, name) in keys {
            match inner.delete_one(def, &ns, &name, opts, &self.config, &now) {
                Ok(Deleted::Gone(b)) | Ok(Deleted::Pending(b)) => out.push(b),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Every object of a kind, parsed (for tests and the simulator).
    pub fn all(&self, def: &ResourceDef) -> Vec<Value> {
        let inner = self.lock();
        inner
            .objects
            .get(&def.storage())
            .map(|m| {
                m.values()
                    .filter_map(|s| serde_json::from_slice(&s.bytes).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Why a modification function gave up.
pub enum ModifyFail {
    Conflicted,
    Failed(ApiError),
}
use ModifyFail::{Conflicted, Failed};

pub enum WriteFail {
    Api(ApiError),
}

fn visible(filter: &Filter, e: &HistEvent) -> Option<&'static str> {
    let ns_ok =
        filter.namespace.as_ref().is_none_or(|ns| ns == &e.key.0) && filter.fields.matches(&e.key);
    if !ns_ok {
        return None;
    }
    let now = e.new_labels.matched_by(&filter.labels);
    let before = e.old_labels.as_ref().map(|l| l.matched_by(&filter.labels));
    match (e.ty, before, now) {
        (EventType::Added, _, true) => Some("ADDED"),
        (EventType::Deleted, _, true) => Some("DELETED"),
        (EventType::Modified, Some(true), true) => Some("MODIFIED"),
        // Label changes move objects in and out of a selector's view.
        (EventType::Modified, Some(false), true) => Some("ADDED"),
        (EventType::Modified, Some(true), false) => Some("DELETED"),
        (EventType::Modified, None, true) => Some("MODIFIED"),
        _ => None,
    }
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let raw = format!("{rv}\u{0}{ns}\u{0}{name}");
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect();
    let text = String::from_utf8(bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    let mut parts = text.split('\u{0}');
    let rv = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
    let ns = parts.next().ok_or_else(bad)?.to_string();
    let name = parts.next().ok_or_else(bad)?.to_string();
    Ok((rv, ns, name))
}

fn uid_from(seq: u64) -> String {
    let a = crate::util::hash::fnv64(&seq.to_le_bytes());
    let b = crate::util::hash::fnv64(&a.to_le_bytes());
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

/// The body must name the kind and version the URL serves, and the same
/// namespace and name.
fn check_identity(
    def: &ResourceDef,
    obj: &Value,
    ns: &str,
    name: Option<&str>,
) -> Result<(), ApiError> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if kind.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Object 'Kind' is missing in '{}'",
            truncate(&obj.to_string(), 200)
        )));
    }
    if kind != def.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            def.kind
        )));
    }
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    if group != def.group || !def.serves(version) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version(def.storage_version())
        )));
    }
    if let Some(body_ns) = meta_str(obj, "namespace")
        && def.namespaced
        && !body_ns.is_empty()
        && body_ns != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if let (Some(url_name), Some(body_name)) = (name, meta_str(obj, "name"))
        && !body_name.is_empty()
        && body_name != url_name
    {
        return Err(ApiError::bad_request(
            "the name of the object (".to_string()
                + body_name
                + ") does not match the name on the URL ("
                + url_name
                + ")",
        ));
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        format!("{}...", &s[..n])
    }
}

fn validate_meta(def: &ResourceDef, obj: &Value, name: &str) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let ok = if def.dns_label_names {
        names::is_dns_label(name)
    } else {
        names::is_dns_subdomain(name)
    };
    if !ok {
        let what = if def.dns_label_names {
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
        } else {
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        };
        causes.push(Cause::invalid("metadata.name", &json!(name), what));
    }
    if let Some(labels) = obj.pointer("/metadata/labels") {
        match labels.as_object() {
            Some(m) => {
                for (k, v) in m {
                    if let Err(e) = crate::labels::check_key(k) {
                        causes.push(Cause::invalid("metadata.labels", &json!(k), e));
                    }
                    match v.as_str() {
                        Some(s) => {
                            if let Err(e) = crate::labels::check_value(s) {
                                causes.push(Cause::invalid(format!("metadata.labels.{k}"), v, e));
                            }
                        }
                        None => causes.push(Cause::invalid(
                            format!("metadata.labels.{k}"),
                            v,
                            "label values must be strings",
                        )),
                    }
                }
            }
            None if labels.is_null() => {}
            None => causes.push(Cause::invalid(
                "metadata.labels",
                labels,
                "must be a map of strings",
            )),
        }
    }
    if let Some(ann) = obj.pointer("/metadata/annotations")
        && !ann.is_null()
        && !ann
            .as_object()
            .is_some_and(|m| m.values().all(Value::is_string))
    {
        causes.push(Cause::invalid(
            "metadata.annotations",
            ann,
            "must be a map of strings",
        ));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def, name, causes))
    }
}

/// What the API server fills in for built-in kinds that the sandbox's
/// clients rely on.
fn default_builtin(def: &ResourceDef, obj: &mut Value, uid: &str) {
    match (def.group.as_str(), def.kind.as_str()) {
        ("batch", "Job") => {
            let spec = &mut obj["spec"];
            if spec.is_object() && spec.get("selector").is_none() && spec["manualSelector"] != true
            {
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let labels = json!({
                    "batch.kubernetes.io/controller-uid": uid,
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": uid,
                    "job-name": name,
                });
                let spec = &mut obj["spec"];
                spec["selector"] =
                    json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
                if !spec["template"]["metadata"].is_object() {
                    spec["template"]["metadata"] = json!({});
                }
                let tl = &mut spec["template"]["metadata"]["labels"];
                if !tl.is_object() {
                    *tl = json!({});
                }
                for (k, v) in labels.as_object().into_iter().flatten() {
                    tl[k] = v.clone();
                }
            }
            let spec = &mut obj["spec"];
            if spec.is_object() {
                for (k, v) in [
                    ("backoffLimit", json!(6)),
                    ("completions", json!(1)),
                    ("parallelism", json!(1)),
                    ("suspend", json!(false)),
                    ("completionMode", json!("NonIndexed")),
                ] {
                    if spec.get(k).is_none() {
                        spec[k] = v;
                    }
                }
            }
        }
        ("apps", "Deployment") => {
            let spec = &mut obj["spec"];
            if spec.is_object() {
                for (k, v) in [
                    ("replicas", json!(1)),
                    ("revisionHistoryLimit", json!(10)),
                    ("progressDeadlineSeconds", json!(600)),
                    (
                        "strategy",
                        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
                    ),
                ] {
                    if spec.get(k).is_none() {
                        spec[k] = v;
                    }
                }
            }
        }
        _ => {}
    }
}

/// Checks of built-in kinds the sandbox's users meet most: a Pod template
/// needs containers with names and images; a workload's selector must match
/// its template's labels.
/// The counts a workload's status must keep consistent, as kube-apiserver's
/// apps validation checks them on every status write: none negative, none
/// above `replicas`, and no more available replicas than ready ones.
fn workload_status_causes(kind: &str, status: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let count = |f: &str| status.get(f).and_then(Value::as_i64);
    let counts: &[&str] = match kind {
        "Deployment" => &[
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "unavailableReplicas",
            "observedGeneration",
            "collisionCount",
        ],
        "ReplicaSet" => &[
            "replicas",
            "fullyLabeledReplicas",
            "readyReplicas",
            "availableReplicas",
            "observedGeneration",
        ],
        _ => &[
            "replicas",
            "readyReplicas",
            "currentReplicas",
            "updatedReplicas",
            "availableReplicas",
            "observedGeneration",
            "collisionCount",
        ],
    };
    for f in counts {
        if let Some(n) = count(f).filter(|n| *n < 0) {
            causes.push(Cause::invalid(
                format!("status.{f}"),
                &json!(n),
                "must be greater than or equal to 0",
            ));
        }
    }
    let (bounded, above_replicas, above_ready): (&[&str], &str, &str) = match kind {
        "Deployment" => (
            &["updatedReplicas", "readyReplicas", "availableReplicas"],
            "cannot be greater than status.replicas",
            "cannot be greater than readyReplicas",
        ),
        "ReplicaSet" => (
            &["fullyLabeledReplicas", "readyReplicas", "availableReplicas"],
            "cannot be greater than the number of replicas",
            "cannot be greater than readyReplicas",
        ),
        _ => (
            &[
                "readyReplicas",
                "currentReplicas",
                "updatedReplicas",
                "availableReplicas",
            ],
            "cannot be greater than status.replicas",
            "cannot be greater than status.readyReplicas",
        ),
    };
    let replicas = count("replicas").unwrap_or(0);
    for f in bounded {
        if let Some(n) = count(f).filter(|n| *n > replicas) {
            causes.push(Cause::invalid(
                format!("status.{f}"),
                &json!(n),
                above_replicas,
            ));
        }
    }
    if let Some(n) = count("availableReplicas").filter(|n| *n > count("readyReplicas").unwrap_or(0))
    {
        causes.push(Cause::invalid(
            "status.availableReplicas",
            &json!(n),
            above_ready,
        ));
    }
    causes
}

fn validate_builtin(def: &ResourceDef, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let check_pod_spec =
        |spec: &Value, path: &str, causes: &mut Vec<Cause>, restart_never_or_onfailure: bool| {
            match spec.get("containers").and_then(Value::as_array) {
                Some(cs) if !cs.is_empty() => {
                    for (i, c) in cs.iter().enumerate() {
                        match c.get("name").and_then(Value::as_str) {
                            None | Some("") => {
                                causes.push(Cause::required(format!("{path}.containers[{i}].name")))
                            }
                            Some(n) if !names::is_dns_label(n) => causes.push(Cause::invalid(
                                format!("{path}.containers[{i}].name"),
                                &json!(n),
                                "must be a DNS label",
                            )),
                            _ => {}
                        }
                        if c.get("image")
                            .and_then(Value::as_str)
                            .is_none_or(str::is_empty)
                        {
                            causes.push(Cause::required(format!("{path}.containers[{i}].image")));
                        }
                    }
                }
                _ => causes.push(Cause::required(format!("{path}.containers"))),
            }
            if restart_never_or_onfailure {
                let rp = spec
                    .get("restartPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or("Always");
                if rp != "Never" && rp != "OnFailure" {
                    causes.push(Cause::unsupported(
                        format!("{path}.restartPolicy"),
                        &json!(rp),
                        &[json!("OnFailure"), json!("Never")],
                    ));
                }
            }
        };
    let workload_selector = |causes: &mut Vec<Cause>| {
        let sel = obj
            .pointer("/spec/selector/matchLabels")
            .and_then(Value::as_object);
        let labels = obj
            .pointer("/spec/template/metadata/labels")
            .and_then(Value::as_object);
        match sel {
            None if obj.pointer("/spec/selector/matchExpressions").is_none() => {
                causes.push(Cause::required("spec.selector"))
            }
            Some(sel)
                if !sel
                    .iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)) =>
            {
                causes.push(Cause::invalid(
                    "spec.template.metadata.labels",
                    &Value::Object(labels.cloned().unwrap_or_default()),
                    "`selector` does not match template `labels`",
                ));
            }
            Some(_) => {}
            None => {}
        }
    };
    match (def.group.as_str(), def.kind.as_str()) {
        ("", "Pod") => check_pod_spec(&obj["spec"], "spec", &mut causes, false),
        ("apps", "Deployment") | ("apps", "ReplicaSet") | ("apps", "StatefulSet") => {
            workload_selector(&mut causes);
            causes.extend(workload_status_causes(def.kind.as_str(), &obj["status"]));
            check_pod_spec(
                &obj["spec"]["template"]["spec"],
                "spec.template.spec",
                &mut causes,
                false,
            );
        }
        ("batch", "Job") => check_pod_spec(
            &obj["spec"]["template"]["spec"],
            "spec.template.spec",
            &mut causes,
            true,
        ),
        ("", "ConfigMap") | ("", "Secret") => {
            for field in ["data", "binaryData", "stringData"] {
                for k in obj
                    .get(field)
                    .and_then(Value::as_object)
                    .into_iter()
                    .flat_map(|m| m.keys())
                {
                    if k.is_empty()
                        || !k
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    {
                        causes.push(Cause::invalid(format!("{field}[{k}]"), &json!(k), "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"));
                    }
                }
            }
        }
        ("", "Service") => {
            for (i, p) in obj
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                if p.get("port")
                    .and_then(Value::as_i64)
                    .is_none_or(|n| !(1..=65535).contains(&n))
                {
                    causes.push(Cause::invalid(
                        format!("spec.ports[{i}].port"),
                        &p["port"],
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
        _ => {}
    }
    causes
}

impl Inner {
    fn check_namespace(&self, ns: &str, for_create: bool) -> Result<(), ApiError> {
        if ns.is_empty() {
            return Err(ApiError::bad_request(
                "the namespace of the object is not set; a namespaced resource needs one",
            ));
        }
        let key = (String::new(), "namespaces".to_string());
        match self
            .objects
            .get(&key)
            .and_then(|m| m.get(&(String::new(), ns.to_string())))
        {
            None => Err(ApiError::namespace_not_found(ns)),
            Some(s) if for_create => {
                let v: Value = serde_json::from_slice(&s.bytes).unwrap_or_default();
                if v.pointer("/metadata/deletionTimestamp").is_some() {
                    Err(ApiError::forbidden(format!(
                        "unable to create new content in namespace {ns} because it is being terminated"
                    )))
                } else {
                    Ok(())
                }
            }
            Some(_) => Ok(()),
        }
    }

    fn generate_name(&mut self, def: &ResourceDef, ns: &str, prefix: &str) -> String {
        loop {
            self.seq += 1;
            let mut h = crate::util::hash::fnv64(&self.seq.to_le_bytes());
            let mut suffix = String::new();
            for _ in 0..5 {
                suffix
                    .push(GENERATE_ALPHABET[(h % GENERATE_ALPHABET.len() as u64) as usize] as char);
                h /= GENERATE_ALPHABET.len() as u64;
            }
            let name = format!("{prefix}{suffix}");
            if !self
                .objects
                .get(&def.storage())
                .is_some_and(|m| m.contains_key(&(ns.to_string(), name.clone())))
            {
                return name;
            }
        }
    }

    /// Schema (for custom resources) and built-in validation.
    fn validate_content(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        opts: &WriteOpts,
        warnings: &mut Vec<String>,
        name: &str,
    ) -> Result<(), ApiError> {
        let mut causes = validate_builtin(def, obj);
        if def.crd.is_some() {
            let version = obj["apiVersion"]
                .as_str()
                .and_then(|a| a.rsplit('/').next())
                .unwrap_or("")
                .to_string();
            if let Some(schema) = def
                .schemas
                .get(&version)
                .or_else(|| def.schemas.values().next())
            {
                let out = schema::apply(schema, obj);
                causes.extend(out.causes);
                match opts.field_validation {
                    FieldValidation::Strict => {
                        causes.extend(out.unknown.iter().map(|u| Cause::unknown(format!(".{u}"))))
                    }
                    FieldValidation::Warn => warnings
                        .extend(out.unknown.iter().map(|u| format!("unknown field \"{u}\""))),
                    FieldValidation::Ignore => {}
                }
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(def, name, causes))
        }
    }

    /// Store a new version of an object and tell the watches.
    fn commit(
        &mut self,
        def: &ResourceDef,
        key: ObjKey,
        mut obj: Value,
        ty: EventType,
        config: &StoreConfig,
    ) -> Bytes {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        if def.is_event() {
            mirror_event(&mut obj, def.group.is_empty());
        }
        let bytes = to_bytes(&obj);
        let uid = meta_str(&obj, "uid").unwrap_or_default().to_string();
        let labels = labels_of(&obj);
        let owners = owners_of(&obj);
        let res = def.storage();
        let old = self.objects.entry(res.clone()).or_default().insert(
            key.clone(),
            Stored {
                bytes: bytes.clone(),
                rv,
                uid: uid.as_str().into(),
                labels: labels.clone(),
                owners: owners.clone(),
            },
        );
        if let Some(o) = &old {
            for owner in o.owners.iter() {
                if let Some(d) = self.dependents.get_mut(owner.as_ref()) {
                    d.remove(&(res.clone(), key.clone()));
                }
            }
        }
        for owner in owners.iter() {
            self.dependents
                .entry(owner.to_string())
                .or_default()
                .insert((res.clone(), key.clone()));
        }
        self.by_uid.insert(uid, (res.clone(), key.clone()));
        self.record(
            HistEvent {
                rv,
                res,
                key,
                ty,
                bytes: bytes.clone(),
                old_labels: old.map(|o| o.labels),
                new_labels: labels,
            },
            config,
        );
        bytes
    }

    fn record(&mut self, e: HistEvent, config: &StoreConfig) {
        if let Some(ws) = self.watchers.get_mut(&e.res) {
            ws.retain(|w| {
                let Some(ty) = visible(&w.filter, &e) else {
                    return !w.tx.is_closed();
                };
                if w.queued.load(Ordering::Relaxed) >= config.watch_queue_limit {
                    // Too slow: close it; the client re-watches from its last resourceVersion.
                    return false;
                }
                w.queued.fetch_add(1, Ordering::Relaxed);
                w.tx.send(w.renderer.line(ty, &e.bytes)).is_ok()
            });
        }
        self.history.push_back(e);
        while self.history.len() > config.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
    }

    /// Remove an object for good: the DELETED event carries its final state.
    fn remove(
        &mut self,
        def: &ResourceDef,
        key: ObjKey,
        last: Option<Value>,
        config: &StoreConfig,
        now: &str,
    ) -> Bytes {
        let res = def.storage();
        let Some(stored) = self.objects.get_mut(&res).and_then(|m| m.remove(&key)) else {
            return Bytes::new();
        };
        let mut obj = match last {
            Some(v) => v,
            None => serde_json::from_slice(&stored.bytes).unwrap_or_default(),
        };
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let bytes = Bytes::from(serde_json::to_vec(&obj).unwrap_or_default());
        for owner in &stored.owners {
            if let Some(d) = self.dependents.get_mut(owner.as_ref()) {
                d.remove(&(res.clone(), key.clone()));
            }
        }
        self.by_uid.remove(stored.uid.as_ref());
        self.record(
            HistEvent {
                rv: self.rv,
                res: res.clone(),
                key: key.clone(),
                ty: EventType::Deleted,
                bytes: bytes.clone(),
                old_labels: Some(stored.labels.clone()),
                new_labels: stored.labels,
            },
            config,
        );
        // A deleted CRD takes its kind and every object of it along.
        if res
            == (
                "apiextensions.k8s.io".to_string(),
                "customresourcedefinitions".to_string(),
            )
        {
            let group = obj
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let plural = obj
                .pointer("/spec/names/plural")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let served = (group, plural);
            if let Some(sdef) = self.defs.get(&served).cloned() {
                let keys: Vec<ObjKey> = self
                    .objects
                    .get(&served)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                for k in keys {
                    self.remove(&sdef, k, None, config, now);
                }
                self.defs.remove(&served);
                self.watchers.remove(&served);
            }
        }
        self.collect_dependents(&stored.uid, config, now);
        self.finish_foreground(config, now);
        self.finish_namespaces(config, now);
        bytes
    }

    /// Background garbage collection of an owner's dependents: a dependent
    /// with no owner left is deleted; one with other live owners loses only
    /// the dangling reference.
    fn collect_dependents(&mut self, owner_uid: &str, config: &StoreConfig, now: &str) {
        let Some(deps) = self.dependents.remove(owner_uid) else {
            return;
        };
        for (res, key) in deps {
            let Some(def) = self.defs.get(&res).cloned() else {
                continue;
            };
            let Some(stored) = self.objects.get(&res).and_then(|m| m.get(&key)).cloned() else {
                continue;
            };
            let live_owners = stored
                .owners
                .iter()
                .any(|u| u.as_ref() != owner_uid && self.by_uid.contains_key(u.as_ref()));
            if live_owners {
                let mut v: Value = serde_json::from_slice(&stored.bytes).unwrap_or_default();
                if let Some(refs) = v
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r["uid"] != owner_uid);
                }
                self.commit(&def, key, v, EventType::Modified, config);
            } else {
                let _ = self.delete_one(&def, &key.0, &key.1, &DeleteOpts::default(), config, now);
            }
        }
    }

    /// An object created with owners none of which exist is collected, as
    /// the garbage collector would do shortly after.
    fn collect_if_orphaned(
        &mut self,
        def: &ResourceDef,
        key: &ObjKey,
        config: &StoreConfig,
        now: &str,
    ) {
        let Some(stored) = self.objects.get(&def.storage()).and_then(|m| m.get(key)) else {
            return;
        };
        if !stored.owners.is_empty()
            && stored
                .owners
                .iter()
                .all(|u| !self.by_uid.contains_key(u.as_ref()))
        {
            let _ = self.delete_one(def, &key.0, &key.1, &DeleteOpts::default(), config, now);
        }
    }

    fn delete_one(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
        config: &StoreConfig,
        now: &str,
    ) -> Result<Deleted, ApiError> {
        let key = (ns.to_string(), name.to_string());
        let stored = self
            .objects
            .get(&def.storage())
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        let mut obj: Value =
            serde_json::from_slice(&stored.bytes).map_err(|e| ApiError::internal(e.to_string()))?;
        if let Some(uid) = &opts.precondition_uid
            && uid.as_str() != stored.uid.as_ref()
        {
            return Err(ApiError::conflict_msg(
                def,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    stored.uid
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && rv != &stored.rv.to_string()
        {
            return Err(ApiError::conflict_msg(
                def,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    stored.rv
                ),
            ));
        }
        if opts.dry_run {
            return Ok(Deleted::Gone(stored.bytes));
        }
        let is_namespace = def.key() == (String::new(), "namespaces".to_string());
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            // Already going; a second delete changes nothing.
            return Ok(Deleted::Pending(stored.bytes));
        }
        let propagation = opts.propagation.unwrap_or_default();
        if propagation == Propagation::Orphan {
            let deps: Vec<(ResKey, ObjKey)> = self
                .dependents
                .remove(stored.uid.as_ref())
                .map(|d| d.into_iter().collect())
                .unwrap_or_default();
            for (res, k) in deps {
                let Some(ddef) = self.defs.get(&res).cloned() else {
                    continue;
                };
                let Some(s) = self.objects.get(&res).and_then(|m| m.get(&k)).cloned() else {
                    continue;
                };
                let mut v: Value = serde_json::from_slice(&s.bytes).unwrap_or_default();
                if let Some(refs) = v
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r["uid"] != stored.uid.as_ref());
                }
                self.commit(&ddef, k, v, EventType::Modified, config);
            }
        }
        let mut finalizers = finalizers_of(&obj);
        let has_dependents = self
            .dependents
            .get(stored.uid.as_ref())
            .is_some_and(|d| !d.is_empty());
        if propagation == Propagation::Foreground
            && has_dependents
            && !finalizers.iter().any(|f| f == "foregroundDeletion")
        {
            finalizers.push("foregroundDeletion".into());
        }
        if is_namespace {
            obj["spec"]["finalizers"] = json!(["kubernetes"]);
            obj["status"]["phase"] = json!("Terminating");
        }
        if finalizers.is_empty() && !is_namespace {
            let bytes = self.remove(def, key, None, config, now);
            return Ok(Deleted::Gone(bytes));
        }
        let meta = meta_mut(&mut obj);
        meta.insert("deletionTimestamp".into(), json!(now));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if !finalizers.is_empty() {
            meta.insert("finalizers".into(), json!(finalizers));
        }
        let bytes = self.commit(def, key.clone(), obj, EventType::Modified, config);
        if finalizers.iter().any(|f| f == "foregroundDeletion") {
            self.foreground.insert((def.storage(), key.clone()));
        }
        if is_namespace {
            self.terminating.insert(name.to_string());
        }
        if propagation == Propagation::Foreground {
            let deps: Vec<(ResKey, ObjKey)> = self
                .dependents
                .get(stored.uid.as_ref())
                .map(|d| d.iter().cloned().collect())
                .unwrap_or_default();
            for (res, k) in deps {
                if let Some(ddef) = self.defs.get(&res).cloned() {
                    let fg = DeleteOpts {
                        propagation: Some(Propagation::Foreground),
                        ..Default::default()
                    };
                    let _ = self.delete_one(&ddef, &k.0, &k.1, &fg, config, now);
                }
            }
            self.finish_foreground(config, now);
        }
        if is_namespace {
            let contents: Vec<(Arc<ResourceDef>, ObjKey)> = self
                .objects
                .iter()
                .flat_map(|(res, m)| {
                    let d = self.defs.get(res).cloned();
                    m.keys()
                        .filter(|k| k.0 == name)
                        .filter_map(move |k| d.clone().map(|d| (d, k.clone())))
                })
                .collect();
            for (d, k) in contents {
                let _ = self.delete_one(&d, &k.0, &k.1, &DeleteOpts::default(), config, now);
            }
            self.finish_namespaces(config, now);
            if !self
                .objects
                .get(&def.storage())
                .is_some_and(|m| m.contains_key(&key))
            {
                return Ok(Deleted::Gone(bytes));
            }
        }
        let current = self
            .objects
            .get(&def.storage())
            .and_then(|m| m.get(&key))
            .map(|s| s.bytes.clone());
        Ok(match current {
            Some(b) => Deleted::Pending(b),
            None => Deleted::Gone(bytes),
        })
    }

    /// Owners in foreground deletion whose dependents are all gone lose the
    /// `foregroundDeletion` finalizer (and go, if it was the last).
    fn finish_foreground(&mut self, config: &StoreConfig, now: &str) {
        loop {
            let ready = self.foreground.iter().find(|(res, k)| {
                self.objects
                    .get(res)
                    .and_then(|m| m.get(k))
                    .is_none_or(|s| {
                        self.dependents
                            .get(s.uid.as_ref())
                            .is_none_or(|d| d.is_empty())
                    })
            });
            let Some((res, k)) = ready.cloned() else {
                return;
            };
            self.foreground.remove(&(res.clone(), k.clone()));
            let Some(stored) = self.objects.get(&res).and_then(|m| m.get(&k)).cloned() else {
                continue;
            };
            let Some(def) = self.defs.get(&res).cloned() else {
                continue;
            };
            let mut v: Value = serde_json::from_slice(&stored.bytes).unwrap_or_default();
            let rest: Vec<String> = finalizers_of(&v)
                .into_iter()
                .filter(|f| f != "foregroundDeletion")
                .collect();
            if rest.is_empty() {
                meta_mut(&mut v).remove("finalizers");
                self.remove(&def, k, Some(v), config, now);
            } else {
                meta_mut(&mut v).insert("finalizers".into(), json!(rest));
                self.commit(&def, k, v, EventType::Modified, config);
            }
        }
    }

    /// Terminating namespaces with nothing left in them go.
    fn finish_namespaces(&mut self, config: &StoreConfig, now: &str) {
        if self.terminating.is_empty() {
            return;
        }
        let key = (String::new(), "namespaces".to_string());
        let terminating: Vec<String> = self.terminating.iter().cloned().collect();
        for ns in terminating {
            let empty = self
                .objects
                .iter()
                .all(|(res, m)| res == &key || !m.keys().any(|k| k.0 == ns));
            if empty && let Some(def) = self.defs.get(&key).cloned() {
                self.terminating.remove(&ns);
                self.remove(&def, (String::new(), ns), None, config, now);
            }
        }
    }
}

/// The fields that core `v1` Events and `events.k8s.io/v1` Events name
/// differently: (core, events.k8s.io).
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("count", "deprecatedCount"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("source", "deprecatedSource"),
    ("reportingComponent", "reportingController"),
];

/// Keep both groups' names of an Event's fields, the group that wrote it
/// deciding, so that it reads the same through either group.
fn mirror_event(obj: &mut Value, written_as_core: bool) {
    let Some(m) = obj.as_object_mut() else {
        return;
    };
    for (core, events) in EVENT_FIELDS {
        let (from, to) = if written_as_core {
            (core, events)
        } else {
            (events, core)
        };
        match m.get(*from).cloned() {
            Some(v) if !v.is_null() => {
                m.insert(to.to_string(), v);
            }
            _ => {
                m.remove(*to);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns", "name-1");
        assert_eq!(
            decode_continue(&t).unwrap(),
            (42, "ns".into(), "name-1".into())
        );
        assert!(decode_continue("zz").is_err());
    }

    #[test]
    fn uids_look_like_uuids_and_differ() {
        let a = uid_from(1);
        assert_eq!(a.len(), 36);
        assert_ne!(a, uid_from(2));
    }
}
