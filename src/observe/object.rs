//! `RawObject`: any Kubernetes object, kept compact, as every watch and
//! cache of the runtime holds it.
//!
//! It decodes leniently: whatever the API server sends becomes a
//! `RawObject`, and one whose metadata Runbook cannot use is marked
//! undecodable (logged and skipped) instead of failing a whole list or
//! watch. `managedFields` are dropped while decoding, before an object
//! enters any cache. The object is kept as compact JSON text (a parsed JSON
//! tree costs several times its text in memory) with the metadata the
//! runtime indexes by; a decision parses it when it reads it.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::core::{ApiResource, DynamicResourceScope, Resource};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::CachedObject;

#[derive(Clone, Debug)]
pub struct RawObject {
    /// Just what the runtime needs: name, namespace, uid, resourceVersion,
    /// generation, deletionTimestamp, ownerReferences.
    pub meta: ObjectMeta,
    /// The whole object as compact JSON, without managedFields.
    pub json: Arc<str>,
    /// Why the object cannot be used, if it cannot.
    pub undecodable: Option<String>,
    /// Whether the object carries its `apiVersion` and `kind`. A real API
    /// server leaves both off the items of a list, so objects a watch
    /// lists (at start-up, after a failover or a 410) arrive without them.
    typed: bool,
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
        let json: Arc<str> = serde_json::to_string(&value).unwrap_or_default().into();
        Self {
            meta,
            json,
            undecodable,
            typed,
        }
    }

    /// Give the object the `apiVersion` and `kind` of the watch it came
    /// from where it arrived without them (a listed object). Every object
    /// a cache holds goes through here, so decisions, `is_ready` and
    /// `delete(obj)` see the kind whichever way the object arrived.
    pub fn stamp(&mut self, resource: &ApiResource) {
        if self.typed {
            return;
        }
        let mut value = self.value();
        if let Some(m) = value.as_object_mut() {
            m.insert(
                "apiVersion".into(),
                Value::String(resource.api_version.clone()),
            );
            m.insert("kind".into(), Value::String(resource.kind.clone()));
            self.json = serde_json::to_string(&value).unwrap_or_default().into();
            self.typed = true;
        }
    }

    /// The object parsed, as decisions read it.
    pub fn value(&self) -> Value {
        serde_json::from_str(&self.json).unwrap_or(Value::Null)
    }

    /// The object as decisions see it: parsed now, for this reader.
    pub fn cached(&self) -> Arc<CachedObject> {
        CachedObject::new(self.value())
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

    pub fn owner_uids(&self) -> impl Iterator<Item = &str> {
        self.meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.as_str())
    }
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(RawObject::from_value)
    }
}

impl Resource for RawObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn odd_objects_decode_but_are_marked() {
        let o: RawObject =
            serde_json::from_value(json!({"metadata": {"name": "a", "labels": {"x": 1}}})).unwrap();
        assert!(o.undecodable.unwrap().contains("labels"));
        let o: RawObject = serde_json::from_value(json!({"kind": "X"})).unwrap();
        assert!(o.undecodable.is_some());
    }
}
