//! `RawObject`: any Kubernetes object, kept compact, as every watch and
//! cache of the runtime holds it.
//!
//! It decodes leniently: whatever the API server sends becomes a
//! `RawObject`, and one whose metadata Runbook cannot use is marked
//! undecodable (logged and skipped) instead of failing a whole list or
//! watch. `managedFields` are dropped while decoding, before an object
//! enters any cache. The object is kept as compact JSON text (a parsed JSON
//! tree costs several times its text in memory) with the metadata the
//! runtime indexes by (labels among them); a decision that reads a
//! resourceVersion parses it, and every read while some decision still
//! holds that tree shares it. Once none does, the tree is dropped, so a
//! cache holds the text of each object, not a tree of each object it ever
//! decided about.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, Weak};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube_core::{ApiResource, DynamicResourceScope, Resource};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::CachedObject;

/// A cached object. Its fields are shared by its clones: the controller's
/// store keeps a clone of every object its watch delivers, and with the
/// fields behind one `Arc` that clone costs a reference count, not a copy
/// of the metadata (about 400 bytes before its strings).
#[derive(Clone, Debug)]
pub struct RawObject(Arc<RawFields>);

impl std::ops::Deref for RawObject {
    type Target = RawFields;

    fn deref(&self) -> &RawFields {
        &self.0
    }
}

/// What a [`RawObject`] holds.
#[derive(Clone, Debug)]
pub struct RawFields {
    /// Just what the runtime needs: name, namespace, uid, resourceVersion,
    /// generation, deletionTimestamp, ownerReferences (the labels are in
    /// `labels`, and `meta.labels` is left empty).
    pub meta: ObjectMeta,
    /// The object's labels, compact (see [`Labels`]).
    pub labels: Labels,
    /// The whole object as compact JSON, without managedFields.
    pub json: Arc<str>,
    /// Why the object cannot be used, if it cannot.
    pub undecodable: Option<String>,
    /// Whether the object carries its `apiVersion` and `kind`. A real API
    /// server leaves both off the items of a list, so objects a watch
    /// lists (at start-up, after a failover or a 410) arrive without them.
    typed: bool,
    /// The object parsed, while a decision holds it: reads of this
    /// resourceVersion meanwhile share it instead of parsing the text again.
    parsed: Parsed,
}

/// An object's labels, sorted by key, as compact as they come: a label
/// costs its key and value and 32 bytes. (A `BTreeMap` takes a node of
/// 544 bytes for the first label, and every cached object and index entry
/// kept one.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Box<[(Box<str>, Box<str>)]>);

impl Labels {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Into<Box<str>>, V: Into<Box<str>>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut v: Vec<(Box<str>, Box<str>)> = iter
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        // A key given twice keeps its last value, as a map would.
        v.reverse();
        v.dedup_by(|later, earlier| later.0 == earlier.0);
        v.reverse();
        Self(v.into_boxed_slice())
    }
}

/// The parsed object, weakly: alive while some reader holds it.
#[derive(Debug, Default)]
struct Parsed(Mutex<Weak<CachedObject>>);

impl Parsed {
    fn held(&self) -> std::sync::MutexGuard<'_, Weak<CachedObject>> {
        crate::util::lock(&self.0)
    }
}

impl Clone for Parsed {
    fn clone(&self) -> Self {
        Self(Mutex::new(self.held().clone()))
    }
}

impl RawObject {
    pub fn from_value(mut value: Value) -> Self {
        let mut undecodable = None;
        let typed = ["apiVersion", "kind"].iter().all(|k| {
            value
                .get(k)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        });
        if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        let m = &value["metadata"];
        let s = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
        let owners: Vec<OwnerReference> = m
            .get("ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|r| {
                Some(OwnerReference {
                    api_version: r.get("apiVersion")?.as_str()?.to_string(),
                    kind: r.get("kind")?.as_str()?.to_string(),
                    name: r.get("name")?.as_str()?.to_string(),
                    uid: r.get("uid")?.as_str()?.to_string(),
                    controller: r.get("controller").and_then(Value::as_bool),
                    block_owner_deletion: None,
                })
            })
            .collect();
        let meta = ObjectMeta {
            name: s("name"),
            namespace: s("namespace"),
            uid: s("uid"),
            resource_version: s("resourceVersion"),
            generation: m.get("generation").and_then(Value::as_i64),
            deletion_timestamp: s("deletionTimestamp")
                .and_then(|t| t.parse().ok())
                .map(Time),
            owner_references: (!owners.is_empty()).then_some(owners),
            // Of the annotations, only the one routing a child in another
            // namespace to its target (the rest stay in `json`).
            annotations: m
                .get("annotations")
                .and_then(|a| a.get(super::OWNER_ANNOTATION))
                .and_then(Value::as_str)
                .map(|v| [(super::OWNER_ANNOTATION.to_string(), v.to_string())].into()),
            ..Default::default()
        };
        if !m.is_object() {
            undecodable = Some("the object has no metadata".to_string());
        } else if meta.name.as_deref().is_none_or(str::is_empty) {
            undecodable = Some("the object has no metadata.name".to_string());
        } else if let Some(labels) = m.get("labels")
            && !labels.is_null()
            && !labels
                .as_object()
                .is_some_and(|l| l.values().all(Value::is_string))
        {
            undecodable = Some("metadata.labels is not a map of strings".to_string());
        }
        let labels = m
            .get("labels")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
            .collect();
        let json: Arc<str> = serde_json::to_string(&value).unwrap_or_default().into();
        Self(Arc::new(RawFields {
            meta,
            labels,
            json,
            undecodable,
            typed,
            parsed: Parsed::default(),
        }))
    }

    /// Give the object the `apiVersion` and `kind` of the watch it came
    /// from where it arrived without them (a listed object). Every object
    /// a cache holds goes through here, so decisions, `is_ready` and
    /// `delete(obj)` see the kind whichever way the object arrived.
    pub fn stamp(&mut self, resource: &ApiResource) {
        if self.typed {
            return;
        }
        // Appended to the text (last, so they win over an empty one the
        // object carried), not parsed and written again.
        let Some(body) = self.json.strip_suffix('}').filter(|b| b.starts_with('{')) else {
            return;
        };
        let quote = |s: &str| Value::String(s.to_string()).to_string();
        let sep = if body.len() > 1 { "," } else { "" };
        let json = format!(
            "{body}{sep}\"apiVersion\":{},\"kind\":{}}}",
            quote(&resource.api_version),
            quote(&resource.kind)
        )
        .into();
        let fields = Arc::make_mut(&mut self.0);
        fields.json = json;
        fields.typed = true;
        fields.parsed = Parsed::default();
    }

    /// The object parsed, as decisions read it.
    pub fn value(&self) -> Value {
        serde_json::from_str(&self.json).unwrap_or(Value::Null)
    }

    /// The object as decisions see it: parsed on a read of this
    /// resourceVersion, and shared by every read while one still holds it.
    pub fn cached(&self) -> Arc<CachedObject> {
        let mut held = self.parsed.held();
        if let Some(tree) = held.upgrade() {
            return tree;
        }
        let tree = CachedObject::new(self.value());
        *held = Arc::downgrade(&tree);
        tree
    }

    /// The object as if it carried label `key` with `value` (its
    /// resourceVersion unchanged): how a decision sees a target it makes
    /// before the label is written.
    pub fn with_label(&self, key: &str, value: &str) -> RawObject {
        let mut v = self.value();
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            let labels = meta
                .entry("labels")
                .or_insert_with(|| Value::Object(Default::default()));
            if !labels.is_object() {
                *labels = Value::Object(Default::default());
            }
            labels[key] = Value::String(value.to_string());
        }
        Self::from_value(v)
    }

    /// The object's label `key`, without parsing it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)
    }

    pub fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or("")
    }

    pub fn namespace(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or("")
    }

    pub fn resource_version(&self) -> &str {
        self.meta.resource_version.as_deref().unwrap_or("")
    }

    /// The uids of its owners: its ownerReferences, and the target a
    /// child of Runbook's in another namespace names by label.
    pub fn owner_uids(&self) -> impl Iterator<Item = &str> {
        let elsewhere = Some(&self.labels)
            .filter(|l| l.get(super::MANAGED_BY) == Some("runbook"))
            .and_then(|l| l.get(super::OWNER_UID_LABEL));
        self.meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.as_str())
            .chain(elsewhere)
    }
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WithoutManagedFields { top: true })
            .map(RawObject::from_value)
    }
}

/// An object's JSON text decoded to a tree without its
/// `metadata.managedFields`, which are never built.
pub fn decode_without_managed_fields(text: &str) -> serde_json::Result<Value> {
    let mut d = serde_json::Deserializer::from_str(text);
    let v = serde::Deserializer::deserialize_any(&mut d, WithoutManagedFields { top: true })?;
    d.end()?;
    Ok(v)
}

/// Decodes an object as a JSON tree, passing over `metadata.managedFields`
/// instead of building it (a good part of what the API server sends, and
/// dropped anyway): one pass, and no tree built only to be freed.
struct WithoutManagedFields {
    /// Decoding the object itself (else its `metadata`).
    top: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for WithoutManagedFields {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for WithoutManagedFields {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" if self.top => {
                    let meta = map.next_value_seed(WithoutManagedFields { top: false })?;
                    out.insert(key, meta);
                }
                "managedFields" if !self.top => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
                _ => {
                    out.insert(key, map.next_value::<Value>()?);
                }
            }
        }
        Ok(Value::Object(out))
    }

    // Anything but a map is kept as it is (and `from_value` says what is
    // wrong with it).
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// The kind is shared, not copied: kube-runtime keeps a copy of it in the
/// key of every object its stores and queues hold (five strings each).
impl Resource for RawObject {
    type DynamicType = Arc<ApiResource>;
    type Scope = DynamicResourceScope;

    fn group(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn kind(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn api_version(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &Arc<ApiResource>) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut Arc::make_mut(&mut self.0).meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A cache holds each object's text, not a tree of every object a
    /// decision ever read: the tree lives while a reader holds it, and
    /// readers meanwhile share it.
    #[test]
    fn the_parsed_object_is_shared_while_held_then_dropped() {
        let o = RawObject::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "d", "resourceVersion": "1"}}));
        let a = o.cached();
        let b = o.cached();
        assert!(Arc::ptr_eq(&a, &b));
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "nobody holds it: dropped");
        let c = o.cached();
        assert_eq!(c.value()["metadata"]["name"], "p");
        // A clone of the object shares what is held.
        assert!(Arc::ptr_eq(&c, &o.clone().cached()));
    }

    /// A target decided before its shard label is written is seen with
    /// it, at the same resourceVersion, whatever its labels held.
    #[test]
    fn an_object_seen_with_a_label_it_does_not_carry_yet() {
        for labels in [json!({"app": "web"}), json!(null), json!("oops")] {
            let o = RawObject::from_value(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "resourceVersion": "7", "labels": labels}}));
            let l = o.with_label("runbook.dev/shard", "r1");
            assert_eq!(l.label("runbook.dev/shard"), Some("r1"));
            assert_eq!(l.resource_version(), "7");
            assert_eq!(l.value()["metadata"]["labels"]["runbook.dev/shard"], "r1");
            assert_eq!(o.label("runbook.dev/shard"), None);
        }
        let o = RawObject::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "web"}}}));
        assert_eq!(o.with_label("x", "y").label("app"), Some("web"));
    }

    #[test]
    fn a_listed_object_takes_the_kind_of_its_watch() {
        let mut o: RawObject = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "prod"}, "spec": {"replicas": 2}
        }))
        .unwrap();
        let sts = ApiResource {
            group: "apps".into(),
            version: "v1".into(),
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            plural: "statefulsets".into(),
        };
        o.stamp(&sts);
        let v = o.value();
        assert_eq!(
            (v["apiVersion"].as_str(), v["kind"].as_str()),
            (Some("apps/v1"), Some("StatefulSet"))
        );
        assert_eq!(v["spec"]["replicas"], 2);
        // An object that names its kind keeps it.
        let mut typed: RawObject = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
        )
        .unwrap();
        typed.stamp(&sts);
        assert_eq!(typed.value()["kind"], "Pod");
        // An empty kind is no kind; an empty object gets both.
        for (text, spec) in [
            (
                r#"{"apiVersion":"","kind":"","metadata":{"name":"e"},"spec":{"r":1}}"#,
                json!({"r": 1}),
            ),
            ("{}", Value::Null),
        ] {
            let mut o: RawObject = serde_json::from_str(text).unwrap();
            o.stamp(&sts);
            let v = o.value();
            assert_eq!(
                (v["apiVersion"].as_str(), v["kind"].as_str()),
                (Some("apps/v1"), Some("StatefulSet")),
                "{text}"
            );
            assert_eq!(v["spec"], spec);
        }
    }

    /// Labels are looked up by key however the object listed them, and a
    /// value that is not a string makes the object undecodable, not a
    /// label.
    #[test]
    fn labels_are_found_by_key() {
        let o = RawObject::from_value(json!({"metadata": {"name": "a", "labels": {
            "z": "last", "app": "web", "m": "mid", "app.kubernetes.io/name": "shop"}}}));
        assert!(o.undecodable.is_none());
        assert_eq!(o.label("app"), Some("web"));
        assert_eq!(o.label("z"), Some("last"));
        assert_eq!(o.label("app.kubernetes.io/name"), Some("shop"));
        assert_eq!(o.label("ap"), None);
        let keys: Vec<&str> = o.labels.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["app", "app.kubernetes.io/name", "m", "z"]);
        // A key given twice keeps its last value, as a map does.
        let l: Labels = [("k", "1"), ("j", "0"), ("k", "2")].into_iter().collect();
        assert_eq!((l.get("k"), l.get("j")), (Some("2"), Some("0")));
        let none = RawObject::from_value(json!({"metadata": {"name": "b"}}));
        assert!(none.labels.is_empty() && none.label("app").is_none());
        // The object's clone shares its fields; changing one leaves the
        // other as it was.
        let mut stamped = none.clone();
        stamped.stamp(&ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()));
        assert_eq!(stamped.value()["kind"], "Pod");
        assert!(none.value().get("kind").is_none());
    }

    #[test]
    fn managed_fields_are_dropped_on_the_way_in() {
        let o: RawObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "d", "resourceVersion": "5", "managedFields": [{"manager": "x"}],
                         "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u1"}]}
        }))
        .unwrap();
        assert!(o.undecodable.is_none());
        assert_eq!(o.resource_version(), "5");
        assert!(o.value()["metadata"].get("managedFields").is_none());
        assert_eq!(o.owner_uids().collect::<Vec<_>>(), ["u1"]);
    }

    #[test]
    fn decoding_text_passes_over_managed_fields_of_the_metadata_only() {
        // As watches and lists read objects: from the API server's text.
        let text = r#"{"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"name":"a","namespace":"d","managedFields":[{"manager":"x","fieldsV1":{"f:data":{}}}],"labels":{"app":"x"}},
            "data":{"managedFields":"kept","metadata":"kept"},
            "spec":{"metadata":{"managedFields":[1]}},"n":[1,2.5,-3,true,null,"s"]}"#;
        let o: RawObject = serde_json::from_str(text).unwrap();
        assert!(o.undecodable.is_none());
        let v = o.value();
        let mut want: Value = serde_json::from_str(text).unwrap();
        want["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        assert_eq!(v, want, "everything but metadata.managedFields, as sent");
        // A write's answer, decoded the same way.
        assert_eq!(decode_without_managed_fields(text).unwrap(), want);
        assert!(decode_without_managed_fields(&format!("{text} x")).is_err());
        assert!(decode_without_managed_fields("{\"metadata\":").is_err());
        // Not an object at all: decoded, and marked.
        for odd in ["[1,2]", "3", "\"x\"", "null", "true"] {
            let o: RawObject = serde_json::from_str(odd).unwrap();
            assert!(o.undecodable.is_some(), "{odd}");
        }
        // Not JSON: an error, as before.
        assert!(serde_json::from_str::<RawObject>("{\"metadata\":").is_err());
    }

    #[test]
    fn odd_objects_decode_but_are_marked() {
        let o: RawObject =
            serde_json::from_value(json!({"metadata": {"name": "a", "labels": {"x": 1}}})).unwrap();
        assert!(o.undecodable.as_deref().unwrap().contains("labels"));
        let o: RawObject = serde_json::from_value(json!({"kind": "X"})).unwrap();
        assert!(o.undecodable.is_some());
    }
}
