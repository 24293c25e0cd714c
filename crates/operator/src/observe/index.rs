//! Where a kind's objects are, by namespace, owner and label, kept as
//! names: lookups read only the objects they return. The informer caches
//! keep one beside their objects; a target kind, whose objects live in its
//! controller's store, keeps one fed by the same watch (`TargetIndex`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::RwLock;

use kube::runtime::watcher::Event;

use runbook_core::labels::{Requirement, Selector};
use runbook_core::observe::{Labels, RawObject};

/// (namespace, name).
pub type ObjKey = (String, String);

/// (namespace, label key, label value).
type LabelKey = (String, String, String);

/// Names by namespace, by owner uid and by label.
#[derive(Default)]
pub(super) struct Index {
    by_ns: BTreeMap<String, Set<String>>,
    by_owner: HashMap<String, Set<ObjKey>>,
    /// Names by one of their labels, within a namespace: a selector with an
    /// equality looks at the objects carrying that label only.
    by_label: HashMap<LabelKey, Set<String>>,
}

/// A sorted set kept as a small vector while it holds few values (most
/// owners have one child, many label values one object), and as a B-tree
/// beyond: a B-tree's first value takes a node for eleven.
#[derive(Debug)]
enum Set<V> {
    Few(Vec<V>),
    Many(BTreeSet<V>),
}

/// The most values a `Set` keeps as a vector.
const FEW: usize = 8;

impl<V> Default for Set<V> {
    fn default() -> Self {
        Set::Few(Vec::new())
    }
}

impl<V: Ord> Set<V> {
    fn insert(&mut self, value: V) {
        match self {
            Set::Few(v) => match v.binary_search(&value) {
                Ok(_) => {}
                Err(_) if v.len() >= FEW => {
                    let mut many: BTreeSet<V> = std::mem::take(v).into_iter().collect();
                    many.insert(value);
                    *self = Set::Many(many);
                }
                Err(i) => {
                    if v.capacity() == 0 {
                        v.reserve_exact(1);
                    }
                    v.insert(i, value);
                }
            },
            Set::Many(m) => {
                m.insert(value);
            }
        }
    }

    fn remove(&mut self, value: &V) {
        match self {
            Set::Few(v) => {
                if let Ok(i) = v.binary_search(value) {
                    v.remove(i);
                }
            }
            Set::Many(m) => {
                m.remove(value);
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Set::Few(v) => v.len(),
            Set::Many(m) => m.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// In order.
    fn iter(&self) -> impl Iterator<Item = &V> {
        let (few, many) = match self {
            Set::Few(v) => (Some(v.iter()), None),
            Set::Many(m) => (None, Some(m.iter())),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }
}

fn add_to<K: std::hash::Hash + Eq, V: Ord>(map: &mut HashMap<K, Set<V>>, key: K, value: V) {
    map.entry(key).or_default().insert(value);
}

fn remove_from<K: std::hash::Hash + Eq, V: Ord>(map: &mut HashMap<K, Set<V>>, key: &K, value: &V) {
    if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

impl Index {
    /// Add (or, `add` false, remove) the object at `key` with these labels
    /// and owner uids.
    pub(super) fn index<'a>(
        &mut self,
        key: &ObjKey,
        labels: impl Iterator<Item = (&'a str, &'a str)>,
        owners: impl Iterator<Item = &'a str>,
        add: bool,
    ) {
        let (ns, name) = key;
        if add {
            self.by_ns
                .entry(ns.clone())
                .or_default()
                .insert(name.clone());
        } else if let Some(names) = self.by_ns.get_mut(ns) {
            names.remove(name);
            if names.is_empty() {
                self.by_ns.remove(ns);
            }
        }
        for (k, v) in labels {
            let lk = (ns.clone(), k.to_string(), v.to_string());
            if add {
                add_to(&mut self.by_label, lk, name.clone());
            } else {
                remove_from(&mut self.by_label, &lk, name);
            }
        }
        for uid in owners {
            if add {
                add_to(&mut self.by_owner, uid.to_string(), key.clone());
            } else {
                remove_from(&mut self.by_owner, &uid.to_string(), key);
            }
        }
    }

    /// The names in a namespace, sorted.
    pub(super) fn names(&self, namespace: &str) -> impl Iterator<Item = &String> {
        self.by_ns.get(namespace).into_iter().flat_map(Set::iter)
    }

    /// The names in a namespace that may satisfy `selector`: with an
    /// equality among its requirements, those carrying the rarest such
    /// label; otherwise all of them. Sorted; the caller checks each.
    pub(super) fn candidates(
        &self,
        namespace: &str,
        selector: &Selector,
    ) -> impl Iterator<Item = &String> {
        // An equality on a label no object carries finds none (`None`).
        let narrowest = selector
            .0
            .iter()
            .filter_map(|r| match r {
                Requirement::Eq(k, v) => Some(self.by_label.get(&(
                    namespace.to_string(),
                    k.clone(),
                    v.clone(),
                ))),
                _ => None,
            })
            .min_by_key(|names| names.map_or(0, Set::len));
        let names = narrowest.unwrap_or_else(|| self.by_ns.get(namespace));
        names.into_iter().flat_map(Set::iter)
    }

    /// The objects of any namespace with an owner of this uid, sorted by
    /// namespace and name.
    pub(super) fn owned_anywhere(&self, uid: &str) -> Vec<&ObjKey> {
        let mut keys: Vec<&ObjKey> = self
            .by_owner
            .get(uid)
            .into_iter()
            .flat_map(Set::iter)
            .collect();
        keys.sort();
        keys
    }

    /// The objects of a namespace with an owner of this uid, sorted by name.
    pub(super) fn owned(&self, namespace: &str, uid: &str) -> Vec<&ObjKey> {
        let mut keys: Vec<&ObjKey> = self
            .by_owner
            .get(uid)
            .into_iter()
            .flat_map(Set::iter)
            .filter(|k| k.0 == namespace)
            .collect();
        keys.sort_by(|a, b| a.1.cmp(&b.1));
        keys
    }
}

/// What the index of a target kind keeps of each object: enough to find it
/// and to take it out again.
#[derive(Clone, Debug, Default)]
struct Indexed {
    labels: Labels,
    owners: Vec<String>,
}

impl Indexed {
    fn of(o: &RawObject) -> Self {
        Self {
            labels: o.labels.clone(),
            owners: o.owner_uids().map(str::to_string).collect(),
        }
    }
}

#[derive(Default)]
struct Targets {
    objects: HashMap<ObjKey, Indexed>,
    index: Index,
    /// A relist under way: what it has listed so far.
    relist: Option<Vec<(ObjKey, Indexed)>>,
}

impl Targets {
    fn put(&mut self, key: ObjKey, new: Indexed) {
        self.take(&key);
        self.index.index(
            &key,
            new.labels.iter(),
            new.owners.iter().map(String::as_str),
            true,
        );
        self.objects.insert(key, new);
    }

    fn take(&mut self, key: &ObjKey) {
        if let Some(old) = self.objects.remove(key) {
            self.index.index(
                key,
                old.labels.iter(),
                old.owners.iter().map(String::as_str),
                false,
            );
        }
    }
}

/// The index of a target kind, beside its controller's store (which holds
/// the objects): fed by the controller's own watch, so that lists, label
/// selections and owner lookups of a target kind read only what they
/// return instead of copying the whole store.
#[derive(Default)]
pub struct TargetIndex {
    state: RwLock<Targets>,
}

fn key_of(o: &RawObject) -> ObjKey {
    (o.namespace().to_string(), o.name().to_string())
}

impl TargetIndex {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Targets> {
        runbook_core::util::read(&self.state)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Targets> {
        runbook_core::util::write(&self.state)
    }

    /// Follow one event of the watch (a relist replaces everything once
    /// it is done, as the store does).
    pub fn observe(&self, event: &Event<RawObject>) {
        let mut st = self.write();
        match event {
            Event::Apply(o) => st.put(key_of(o), Indexed::of(o)),
            Event::Delete(o) => st.take(&key_of(o)),
            Event::Init => st.relist = Some(Vec::new()),
            Event::InitApply(o) => {
                if let Some(listed) = st.relist.as_mut() {
                    listed.push((key_of(o), Indexed::of(o)));
                }
            }
            Event::InitDone => {
                let listed = st.relist.take().unwrap_or_default();
                *st = Targets::default();
                for (key, indexed) in listed {
                    st.put(key, indexed);
                }
            }
        }
    }

    /// The names in a namespace, sorted.
    pub fn names(&self, namespace: &str) -> Vec<String> {
        self.read().index.names(namespace).cloned().collect()
    }

    /// The names in a namespace whose labels satisfy `selector`, sorted.
    pub fn select(&self, namespace: &str, selector: &Selector) -> Vec<String> {
        let st = self.read();
        st.index
            .candidates(namespace, selector)
            .filter(|name| {
                st.objects
                    .get(&(namespace.to_string(), (*name).clone()))
                    .is_some_and(|o| selector.matches_with(|k| o.labels.get(k)))
            })
            .cloned()
            .collect()
    }

    /// The objects of any namespace with an owner of this uid.
    pub fn owned_anywhere(&self, uid: &str) -> Vec<ObjKey> {
        self.read()
            .index
            .owned_anywhere(uid)
            .into_iter()
            .cloned()
            .collect()
    }

    /// The names in a namespace with an owner of this uid, sorted.
    pub fn owned_by(&self, namespace: &str, uid: &str) -> Vec<String> {
        self.read()
            .index
            .owned(namespace, uid)
            .into_iter()
            .map(|k| k.1.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(ns: &str, name: &str, labels: &[(&str, &str)], owner: Option<&str>) -> RawObject {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        let owners: Vec<serde_json::Value> = owner
            .map(
                |uid| serde_json::json!({"apiVersion": "v1", "kind": "X", "name": "o", "uid": uid}),
            )
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Thing",
            "metadata": {"namespace": ns, "name": name, "labels": labels, "ownerReferences": owners},
        }))
        .expect("a raw object")
    }

    #[test]
    fn a_target_index_follows_changes_deletes_and_relists() {
        let ix = TargetIndex::default();
        ix.observe(&Event::Apply(obj(
            "a",
            "two",
            &[("tier", "web")],
            Some("u1"),
        )));
        ix.observe(&Event::Apply(obj("a", "one", &[("tier", "db")], None)));
        ix.observe(&Event::Apply(obj(
            "b",
            "three",
            &[("tier", "web")],
            Some("u1"),
        )));
        assert_eq!(ix.names("a"), ["one", "two"]);
        let web = Selector::parse("tier=web").expect("a selector");
        assert_eq!(ix.select("a", &web), ["two"]);
        assert_eq!(ix.owned_by("a", "u1"), ["two"]);
        // A label changed: found under its new value only.
        ix.observe(&Event::Apply(obj("a", "two", &[("tier", "db")], None)));
        assert!(ix.select("a", &web).is_empty());
        assert!(ix.owned_by("a", "u1").is_empty());
        ix.observe(&Event::Delete(obj("a", "one", &[], None)));
        assert_eq!(ix.names("a"), ["two"]);
        // A relist drops what it no longer lists, once it is done.
        ix.observe(&Event::Init);
        ix.observe(&Event::InitApply(obj(
            "b",
            "three",
            &[("tier", "web")],
            None,
        )));
        assert_eq!(ix.names("a"), ["two"]);
        ix.observe(&Event::InitDone);
        assert!(ix.names("a").is_empty());
        assert_eq!(ix.select("b", &web), ["three"]);
        assert_eq!(ix.len(), 1);
    }

    /// An owner with many children, and a label many objects carry: the
    /// index finds every one of them, sorted, as it grows past a small
    /// set and shrinks back, and forgets an owner whose last child left.
    #[test]
    fn many_children_of_one_owner_are_found_as_they_come_and_go() {
        let ix = TargetIndex::default();
        let names: Vec<String> = (0..40).map(|i| format!("c{i:02}")).collect();
        // Added out of order.
        for name in names.iter().rev() {
            ix.observe(&Event::Apply(obj("a", name, &[("app", "web")], Some("u1"))));
        }
        assert_eq!(ix.owned_by("a", "u1"), names);
        let web = Selector::parse("app=web").expect("a selector");
        assert_eq!(ix.select("a", &web), names);
        // Down to a few again, then none.
        for name in &names[3..] {
            ix.observe(&Event::Delete(obj("a", name, &[], None)));
        }
        assert_eq!(ix.owned_by("a", "u1"), &names[..3]);
        ix.observe(&Event::Apply(obj(
            "a",
            "c01",
            &[("app", "web")],
            Some("u1"),
        )));
        assert_eq!(ix.owned_by("a", "u1"), &names[..3], "the same child twice");
        for name in &names[..3] {
            ix.observe(&Event::Delete(obj("a", name, &[], None)));
        }
        assert!(ix.owned_by("a", "u1").is_empty());
        assert!(ix.owned_anywhere("u1").is_empty());
        assert!(ix.select("a", &web).is_empty());
        assert!(ix.is_empty());
    }
}
