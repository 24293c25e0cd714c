//! Watch caches: one per kind, shared by every policy that declares the
//! kind. Each is filled by a kube-runtime watcher (which lists, watches,
//! resumes from resourceVersions, relists after 410 and backs off on
//! errors), indexed by namespace and by owner, and reports every change so
//! that the targets it concerns can be reconciled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::Api;
use kube::core::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;

use super::health::{WatchBackoff, WatchHealth, report_watch};
use runbook_core::kinds::KindRef;
use runbook_core::labels::Selector;
use runbook_core::observe::CachedObject;
use runbook_core::observe::RawObject;

use super::index::Index;
pub use super::index::ObjKey;

/// An owner an object points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    /// The owner's namespace where it is not the object's: the target a
    /// child of Runbook's in another namespace was made for.
    pub namespace: Option<String>,
}

/// One object that was added, changed or removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub kind: KindRef,
    pub namespace: String,
    pub name: String,
    pub owners: Vec<OwnerRef>,
    /// The object's resourceVersion now; `None` when it is gone.
    pub version: Option<String>,
}

/// The owners an object's changes concern: its ownerReferences, and the
/// target a child of Runbook's in another namespace names.
pub fn owners_of(o: &RawObject) -> Vec<OwnerRef> {
    let mut owners: Vec<OwnerRef> = o
        .meta
        .owner_references
        .iter()
        .flatten()
        .map(|r| OwnerRef {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
            namespace: None,
        })
        .collect();
    let uid = Some(&o.labels)
        .filter(|l| l.get(runbook_core::observe::MANAGED_BY) == Some("runbook"))
        .and_then(|l| l.get(runbook_core::observe::OWNER_UID_LABEL));
    if let Some(uid) = uid
        && let Some((api_version, kind, namespace, name)) =
            runbook_core::observe::owner_elsewhere(o.meta.annotations.as_ref())
    {
        owners.push(OwnerRef {
            api_version,
            kind,
            name,
            uid: uid.to_string(),
            namespace: Some(namespace),
        });
    }
    owners
}

#[derive(Default)]
struct State {
    objects: HashMap<ObjKey, Arc<RawObject>>,
    index: Index,
}

impl State {
    fn index(&mut self, key: &ObjKey, obj: &RawObject, add: bool) {
        self.index
            .index(key, obj.labels.iter(), obj.owner_uids(), add);
    }

    fn insert(&mut self, key: ObjKey, obj: Arc<RawObject>) -> Option<Arc<RawObject>> {
        let old = self.objects.insert(key.clone(), obj.clone());
        if let Some(o) = &old {
            self.index(&key, o, false);
        }
        self.index(&key, &obj, true);
        old
    }

    fn remove(&mut self, key: &ObjKey) -> Option<Arc<RawObject>> {
        let old = self.objects.remove(key)?;
        self.index(key, &old, false);
        Some(old)
    }

    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        self.objects
            .get(&(namespace.to_string(), name.to_string()))
            .map(|o| o.cached())
    }
}

/// The cached objects of one kind.
pub struct KindCache {
    pub kind: KindRef,
    state: RwLock<State>,
    synced: AtomicBool,
    synced_notify: Notify,
}

fn rv(o: &RawObject) -> &str {
    o.resource_version()
}

impl KindCache {
    pub fn new(kind: KindRef) -> Self {
        Self {
            kind,
            state: RwLock::new(State::default()),
            synced: AtomicBool::new(false),
            synced_notify: Notify::new(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        runbook_core::util::read(&self.state)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        runbook_core::util::write(&self.state)
    }

    /// A change to `o`, which is now in the cache, or (`present` false)
    /// no longer.
    fn change(&self, o: &RawObject, present: bool) -> Change {
        Change {
            kind: self.kind.clone(),
            namespace: o.namespace().to_string(),
            name: o.name().to_string(),
            owners: owners_of(o),
            version: present.then(|| o.resource_version().to_string()),
        }
    }

    /// Add or replace an object; a change unless the resourceVersion is the same.
    pub fn apply(&self, obj: Arc<RawObject>) -> Option<Change> {
        let key = (obj.namespace().to_string(), obj.name().to_string());
        let old = self.write().insert(key, obj.clone());
        match old {
            Some(o) if rv(&o) == rv(&obj) && !rv(&obj).is_empty() => None,
            Some(o) => {
                // Owners that were dropped hear about it too.
                let mut c = self.change(&obj, true);
                for owner in owners_of(&o) {
                    if !c.owners.contains(&owner) {
                        c.owners.push(owner);
                    }
                }
                Some(c)
            }
            None => Some(self.change(&obj, true)),
        }
    }

    pub fn delete(&self, namespace: &str, name: &str) -> Option<Change> {
        let old = self
            .write()
            .remove(&(namespace.to_string(), name.to_string()))?;
        Some(self.change(&old, false))
    }

    /// Replace everything after a (re)list; the changes are what differs.
    pub fn replace_all(&self, objs: Vec<Arc<RawObject>>) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut fresh: HashMap<ObjKey, Arc<RawObject>> = HashMap::new();
        for o in objs {
            fresh.insert((o.namespace().to_string(), o.name().to_string()), o);
        }
        let mut st = self.write();
        let gone: Vec<ObjKey> = st
            .objects
            .keys()
            .filter(|k| !fresh.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(o) = st.remove(&k) {
                changes.push(self.change(&o, false));
            }
        }
        for (k, o) in fresh {
            let same = st.objects.get(&k).is_some_and(|old| rv(old) == rv(&o));
            if !same {
                changes.push(self.change(&o, true));
                st.insert(k, o);
            }
        }
        changes
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        let raw = self
            .read()
            .objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned();
        raw.map(|o| o.cached())
    }

    /// Objects in a namespace (`""`: of a cluster-scoped kind), sorted by
    /// name.
    pub fn list(&self, namespace: &str) -> Vec<Arc<CachedObject>> {
        let st = self.read();
        st.index
            .names(namespace)
            .filter_map(|n| st.cached(namespace, n))
            .collect()
    }

    /// Every object, sorted by namespace and name.
    pub fn every(&self) -> Vec<Arc<CachedObject>> {
        let st = self.read();
        let mut keys: Vec<&ObjKey> = st.objects.keys().collect();
        keys.sort();
        keys.into_iter()
            .filter_map(|(ns, name)| st.cached(ns, name))
            .collect()
    }

    /// Objects in a namespace whose labels satisfy `selector`, sorted by
    /// name. Labels are matched without parsing an object; with an
    /// equality among the requirements only the objects carrying that
    /// label are looked at, so the cost follows what is returned, not how
    /// many objects the namespace holds.
    pub fn select(&self, namespace: &str, selector: &Selector) -> Vec<Arc<CachedObject>> {
        let st = self.read();
        st.index
            .candidates(namespace, selector)
            .filter_map(|n| st.objects.get(&(namespace.to_string(), n.clone())))
            .filter(|o| selector.matches_with(|k| o.label(k)))
            .map(|o| o.cached())
            .collect()
    }

    /// Objects of any namespace with an owner of this uid (a child in
    /// another namespace names its target by label).
    pub fn owned_anywhere(&self, uid: &str) -> Vec<Arc<CachedObject>> {
        let st = self.read();
        st.index
            .owned_anywhere(uid)
            .into_iter()
            .filter_map(|k| st.objects.get(k).map(|o| o.cached()))
            .collect()
    }

    pub fn owned_by(&self, namespace: &str, uid: &str) -> Vec<Arc<CachedObject>> {
        let st = self.read();
        st.index
            .owned(namespace, uid)
            .into_iter()
            .filter_map(|k| st.objects.get(k).map(|o| o.cached()))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
        self.synced_notify.notify_waiters();
    }

    /// Wait until the first list has filled the cache.
    pub async fn wait_synced(&self) {
        loop {
            let notified = self.synced_notify.notified();
            if self.is_synced() {
                return;
            }
            notified.await;
        }
    }
}

/// A running informer: its cache and the task that fills it.
pub struct Informer {
    pub cache: Arc<KindCache>,
    /// The label selector of its watch, if any.
    pub selector: Option<String>,
    /// The namespaces it watches (none: all, or the one reconciled).
    pub namespaces: Vec<String>,
    /// The only objects it watches, by name (none: every one).
    pub names: Vec<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Informer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where an informer watches: the namespaces (none: all), whether they
/// are tenants' (a kind only tenants' policies declare, watched in their
/// namespaces alone), whether the kind is namespaced, and a label selector
/// (`None`: every object).
pub struct Scope {
    pub namespaces: Vec<String>,
    pub tenants: bool,
    pub namespaced: bool,
    pub selector: Option<String>,
    /// Only these objects, each watched by its name (`metadata.name`
    /// field selector, which RBAC authorizes by `resourceNames`); none:
    /// every object.
    pub names: Vec<String>,
    /// Seconds each watch asks to stay open (`OperatorConfig`).
    pub timeout_secs: u32,
    /// List from the API server's watch cache (`resourceVersion=0`, as
    /// client-go's informers do) rather than from etcd: a sharded replica,
    /// whose selector changes as members come and go, lists a share of
    /// many objects at the moment it takes over a gone member's, and the
    /// watch then follows from the version listed.
    pub from_cache: bool,
}

/// How long a watch stays open before it is made again, as kube's
/// watcher asks by default (under the API server's own limit).
pub const WATCH_TIMEOUT_SECS: u32 = 290;

/// A watch's configuration: its label selector where it has one, and its
/// list from storage in pages of 500, or (`from_cache`) from the API
/// server's watch cache in one answer. kube sends no `resourceVersion=0`
/// along with a page size, and without it the API server lists from
/// storage, page after page, each a request of its own that reads etcd
/// until it has a page of matches. So a list from the cache asks for no
/// pages, and the watch cache answers with every match at once, as it
/// does for client-go's informers.
pub fn watch_config(
    selector: Option<&str>,
    from_cache: bool,
    timeout_secs: u32,
) -> watcher::Config {
    let mut config = watcher::Config::default()
        .page_size(500)
        .timeout(timeout_secs);
    if let Some(s) = selector {
        config = config.labels(s);
    }
    if from_cache {
        config = config.any_semantic();
        config.page_size = None;
    }
    config
}

/// Watch one kind into a cache, sending every change to `changes`. Given
/// the cache of a watch of the same kind with another selector, it goes on
/// from its objects: its first list tells only what differs from them
/// (see `KindCache::replace_all`), and it counts as filled once listed.
pub fn spawn_informer(
    client: kube::Client,
    resource: ApiResource,
    kind: KindRef,
    kept: Option<Arc<KindCache>>,
    scope: Scope,
    changes: crate::util::channel::Sender<Change>,
    health: Arc<WatchHealth>,
) -> Informer {
    let Scope {
        namespaces,
        tenants,
        namespaced,
        selector,
        names,
        timeout_secs,
        from_cache,
    } = scope;
    let cache = match kept {
        Some(c) => {
            c.synced.store(false, Ordering::Release);
            c
        }
        None => Arc::new(KindCache::new(kind.clone())),
    };
    let dyntype = Arc::new(resource.clone());
    let config = watch_config(selector.as_deref(), from_cache, timeout_secs);
    let name = cache.kind.to_string();
    // One watch per namespace watched (one of all when none is named), as
    // one stream; each reports its health under its own name.
    let scoped: Vec<Option<String>> = if namespaces.is_empty() || !namespaced {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    // By name: one watch of each name in each namespace watched.
    let each_name: Vec<Option<String>> = match names.is_empty() {
        true => vec![None],
        false => names.iter().cloned().map(Some).collect(),
    };
    let scoped: Vec<(Option<String>, Option<String>)> = scoped
        .into_iter()
        .flat_map(|ns| each_name.iter().map(move |n| (ns.clone(), n.clone())))
        .collect();
    let watches: Vec<_> = scoped
        .into_iter()
        .map(|(ns, only)| {
            let config = match &only {
                Some(n) => config.clone().fields(&format!("metadata.name={n}")),
                None => config.clone(),
            };
            let (api, watch_name): (Api<RawObject>, String) = match &ns {
                Some(ns) => (
                    Api::namespaced_with(client.clone(), ns, &dyntype),
                    if tenants {
                        let n = super::health::tenant_watch_name(&name, ns);
                        health.of_tenant(&n, ns);
                        n
                    } else {
                        name.clone()
                    },
                ),
                None => (Api::all_with(client.clone(), &dyntype), name.clone()),
            };
            let health = health.clone();
            let resource = resource.clone();
            watcher::watcher(api, config)
                .backoff(WatchBackoff::default())
                .map(move |event| {
                    report_watch(&health, &watch_name, event.as_ref().err());
                    event.map(|e| e.modify(|o| o.stamp(&resource)))
                })
        })
        .collect();
    let task = tokio::spawn(fill(cache.clone(), super::merge::merged(watches), changes));
    Informer {
        cache,
        selector,
        namespaces,
        names,
        task,
    }
}

/// Keep `c` as the watch events of `stream` say, sending every change to
/// `changes`; an object that cannot be decoded is skipped and logged.
async fn fill<S>(c: Arc<KindCache>, mut stream: S, changes: crate::util::channel::Sender<Change>)
where
    S: futures::Stream<Item = Result<Event<RawObject>, watcher::Error>> + Unpin,
{
    let mut buffer: Vec<Arc<RawObject>> = Vec::new();
    while let Some(event) = stream.next().await {
        let usable = |o: &RawObject| match &o.undecodable {
            Some(why) => {
                tracing::warn!(kind = %c.kind, name = o.meta.name.as_deref().unwrap_or("?"), "skipping an object: {why}");
                false
            }
            None => true,
        };
        match event {
            Ok(Event::Apply(o)) if usable(&o) => {
                if let Some(ch) = c.apply(Arc::new(o)) {
                    let _ = changes.send(ch);
                }
            }
            Ok(Event::Delete(o)) => {
                let (ns, name) = (
                    o.meta.namespace.clone().unwrap_or_default(),
                    o.meta.name.clone().unwrap_or_default(),
                );
                if let Some(ch) = c.delete(&ns, &name) {
                    let _ = changes.send(ch);
                }
            }
            Ok(Event::Init) => buffer.clear(),
            Ok(Event::InitApply(o)) if usable(&o) => buffer.push(Arc::new(o)),
            Ok(Event::InitDone) => {
                for ch in c.replace_all(std::mem::take(&mut buffer)) {
                    let _ = changes.send(ch);
                }
                c.mark_synced();
            }
            Ok(_) | Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A sharded replica's lists come from the watch cache only if kube
    /// sends `resourceVersion=0`, which it leaves out beside a limit.
    #[test]
    fn lists_meant_for_the_watch_cache_ask_for_no_pages() {
        let cached = watch_config(Some("runbook.dev/shard=a"), true, WATCH_TIMEOUT_SECS);
        assert_eq!(cached.page_size, None);
        assert!(matches!(cached.list_semantic, watcher::ListSemantic::Any));
        let url = |lp: &kube::api::ListParams| {
            kube::core::Request::new("/api/v1/configmaps")
                .list(lp)
                .unwrap()
                .uri()
                .to_string()
        };
        let any = kube::api::ListParams::default().match_any();
        assert!(url(&any).contains("resourceVersion=0"), "{}", url(&any));
        let paged = any.limit(500);
        assert!(!url(&paged).contains("resourceVersion"), "{}", url(&paged));
        assert_eq!(
            watch_config(None, false, WATCH_TIMEOUT_SECS).page_size,
            Some(500)
        );
    }

    fn obj(name: &str, rv: &str, owner: Option<&str>) -> Arc<RawObject> {
        let mut v = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "d", "resourceVersion": rv}});
        if let Some(o) = owner {
            v["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "x/v1", "kind": "X", "name": "owner", "uid": o}]);
        }
        Arc::new(RawObject::from_value(v))
    }

    #[test]
    fn changes_are_reported_once_per_resource_version() {
        let c = KindCache::new(KindRef::new("batch/v1", "Job"));
        assert!(c.apply(obj("a", "1", Some("u1"))).is_some());
        assert!(
            c.apply(obj("a", "1", Some("u1"))).is_none(),
            "same resourceVersion, no change"
        );
        let ch = c.apply(obj("a", "2", None)).unwrap();
        assert_eq!(ch.owners.len(), 1, "the former owner hears of the change");
        assert!(c.owned_by("d", "u1").is_empty());
    }

    #[test]
    fn owners_and_namespaces_are_indexed() {
        let c = KindCache::new(KindRef::new("batch/v1", "Job"));
        c.apply(obj("b", "1", Some("u1")));
        c.apply(obj("a", "1", Some("u1")));
        c.apply(obj("c", "1", Some("u2")));
        let names: Vec<String> = c
            .owned_by("d", "u1")
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(c.list("d").len(), 3);
        assert!(c.list("other").is_empty());
        c.delete("d", "a");
        assert_eq!(c.owned_by("d", "u1").len(), 1);
    }

    fn pod(ns: &str, name: &str, rv: &str, labels: Value) -> Arc<RawObject> {
        Arc::new(RawObject::from_value(
            json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels}}),
        ))
    }

    fn names(objs: &[Arc<CachedObject>]) -> Vec<&str> {
        objs.iter().map(|o| o.name()).collect()
    }

    #[test]
    fn a_selector_is_answered_from_the_label_index_and_follows_changes() {
        let c = KindCache::new(KindRef::new("v1", "Pod"));
        for i in 0..50 {
            c.apply(pod(
                "d",
                &format!("p{i:02}"),
                "1",
                json!({"app": format!("a{}", i % 10), "tier": "web"}),
            ));
        }
        c.apply(pod("other", "p00", "1", json!({"app": "a0"})));
        let sel = Selector::parse("app=a3,tier=web").unwrap();
        assert_eq!(
            names(&c.select("d", &sel)),
            ["p03", "p13", "p23", "p33", "p43"]
        );
        // A relabelled pod leaves the old label's set and joins the new one.
        c.apply(pod("d", "p13", "2", json!({"app": "a4", "tier": "web"})));
        assert_eq!(names(&c.select("d", &sel)), ["p03", "p23", "p33", "p43"]);
        // Requirements other than equality still hold.
        let not_web = Selector::parse("app=a4,tier!=web").unwrap();
        assert!(c.select("d", &not_web).is_empty());
        c.delete("d", "p03");
        assert_eq!(names(&c.select("d", &sel)), ["p23", "p33", "p43"]);
        // Without an equality, the namespace is scanned.
        let exists = Selector::parse("tier").unwrap();
        assert_eq!(c.select("d", &exists).len(), 49);
        assert_eq!(
            names(&c.select("other", &Selector::parse("app=a0").unwrap())),
            ["p00"]
        );
        // While one reader holds a resourceVersion, every reader shares
        // its one parse.
        let a = c.get("d", "p23").unwrap();
        let b = c.select("d", &sel).remove(0);
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn a_relist_reports_what_differs() {
        let c = KindCache::new(KindRef::new("batch/v1", "Job"));
        c.apply(obj("a", "1", None));
        c.apply(obj("b", "1", None));
        let changes = c.replace_all(vec![obj("a", "1", None), obj("c", "1", None)]);
        let mut names: Vec<String> = changes.iter().map(|c| c.name.clone()).collect();
        names.sort();
        assert_eq!(names, ["b", "c"]);
    }
}
