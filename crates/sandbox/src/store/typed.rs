//! Unknown fields of built-in kinds. A real API server decodes a built-in
//! object into its Go type, so a field the type does not have is dropped
//! (with a warning, or refused under strict field validation), in the spec
//! and in the status alike. The sandbox finds those fields the same way:
//! through the kind's k8s-openapi type, whose fields are the API's.

use serde_json::Value;

/// The paths (`spec.bogus`, `status.decisions`) of the fields of `obj`
/// that its built-in kind does not have; `None` when the kind is not one
/// the sandbox knows the type of, or `obj` does not decode as it (the
/// validation that follows says why).
pub(super) fn unknown_fields(group: &str, kind: &str, obj: &Value) -> Option<Vec<String>> {
    let typed = round_trip(group, kind, obj)?;
    let mut out = Vec::new();
    diff(obj, &typed, "", &mut out);
    Some(out)
}

/// `obj` decoded as its kind's type and encoded again.
fn round_trip(group: &str, kind: &str, obj: &Value) -> Option<Value> {
    use k8s_openapi::api::{apps, batch, coordination, core, networking, policy, rbac};
    fn through<T: serde::de::DeserializeOwned + serde::Serialize>(obj: &Value) -> Option<Value> {
        let t: T = serde_json::from_value(obj.clone()).ok()?;
        serde_json::to_value(t).ok()
    }
    match (group, kind) {
        ("", "Pod") => through::<core::v1::Pod>(obj),
        ("", "ConfigMap") => through::<core::v1::ConfigMap>(obj),
        ("", "Secret") => through::<core::v1::Secret>(obj),
        ("", "Service") => through::<core::v1::Service>(obj),
        ("", "ServiceAccount") => through::<core::v1::ServiceAccount>(obj),
        ("", "PersistentVolumeClaim") => through::<core::v1::PersistentVolumeClaim>(obj),
        ("", "Namespace") => through::<core::v1::Namespace>(obj),
        ("apps", "Deployment") => through::<apps::v1::Deployment>(obj),
        ("apps", "ReplicaSet") => through::<apps::v1::ReplicaSet>(obj),
        ("apps", "StatefulSet") => through::<apps::v1::StatefulSet>(obj),
        ("batch", "Job") => through::<batch::v1::Job>(obj),
        ("batch", "CronJob") => through::<batch::v1::CronJob>(obj),
        ("coordination.k8s.io", "Lease") => through::<coordination::v1::Lease>(obj),
        ("networking.k8s.io", "NetworkPolicy") => through::<networking::v1::NetworkPolicy>(obj),
        ("networking.k8s.io", "Ingress") => through::<networking::v1::Ingress>(obj),
        ("networking.k8s.io", "IngressClass") => through::<networking::v1::IngressClass>(obj),
        ("policy", "PodDisruptionBudget") => through::<policy::v1::PodDisruptionBudget>(obj),
        ("rbac.authorization.k8s.io", "Role") => through::<rbac::v1::Role>(obj),
        ("rbac.authorization.k8s.io", "RoleBinding") => through::<rbac::v1::RoleBinding>(obj),
        ("rbac.authorization.k8s.io", "ClusterRole") => through::<rbac::v1::ClusterRole>(obj),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            through::<rbac::v1::ClusterRoleBinding>(obj)
        }
        _ => None,
    }
}

/// Fields of `seen` that `kept` lacks (a null is no field), by path.
fn diff(seen: &Value, kept: &Value, path: &str, out: &mut Vec<String>) {
    match (seen, kept) {
        (Value::Object(s), Value::Object(k)) => {
            for (key, v) in s {
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match k.get(key) {
                    Some(kv) => diff(v, kv, &here, out),
                    None if v.is_null() => {}
                    None => out.push(here),
                }
            }
        }
        (Value::Array(s), Value::Array(k)) if s.len() == k.len() => {
            for (i, (sv, kv)) in s.iter().zip(k).enumerate() {
                diff(sv, kv, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Remove the field at `path` (as `unknown_fields` names it) from `obj`.
pub(super) fn remove(obj: &mut Value, path: &str) {
    let mut parts: Vec<(String, Option<usize>)> = Vec::new();
    for seg in path.split('.') {
        match seg.split_once('[') {
            Some((name, rest)) => {
                parts.push((name.to_string(), None));
                for idx in rest.split('[') {
                    let i = idx.trim_end_matches(']').parse().ok();
                    parts.push((String::new(), i));
                }
            }
            None => parts.push((seg.to_string(), None)),
        }
    }
    let Some(((last, _), init)) = parts.split_last() else {
        return;
    };
    let mut at = obj;
    for (name, idx) in init {
        let next = match idx {
            Some(i) => at.get_mut(*i),
            None => at.get_mut(name.as_str()),
        };
        match next {
            Some(n) => at = n,
            None => return,
        }
    }
    if let Some(m) = at.as_object_mut() {
        m.remove(last);
    }
}

/// The unknown fields of `obj`, removed, as paths.
pub(super) fn prune(group: &str, kind: &str, obj: &mut Value) -> Vec<String> {
    let Some(unknown) = unknown_fields(group, kind, obj) else {
        return Vec::new();
    };
    for p in &unknown {
        remove(obj, p);
    }
    // A status left with nothing is no status (its type's empty value).
    if obj
        .get("status")
        .is_some_and(|s| s.as_object().is_some_and(|m| m.is_empty()))
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    unknown
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_a_built_in_kind_lacks_are_found_and_removed() {
        let mut sts = json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "labels": {"a": "b"}},
            "spec": {"replicas": 2, "bogus": 1, "selector": {"matchLabels": {"app": "db"}},
                     "template": {"spec": {"containers": [{"name": "db", "image": "x", "colour": "red"}]}}},
            "status": {"replicas": 2, "decisions": [{"policy": "p"}], "observedGeneration": 3}
        });
        let unknown = prune("apps", "StatefulSet", &mut sts);
        assert_eq!(
            unknown,
            [
                "spec.bogus",
                "spec.template.spec.containers[0].colour",
                "status.decisions"
            ]
        );
        assert!(sts["spec"].get("bogus").is_none());
        assert!(
            sts["spec"]["template"]["spec"]["containers"][0]
                .get("colour")
                .is_none()
        );
        assert_eq!(
            sts["status"],
            json!({"replicas": 2, "observedGeneration": 3})
        );
        assert_eq!(
            sts["metadata"]["labels"]["a"], "b",
            "what the type has is kept"
        );
        // A kind it does not know is left alone.
        assert!(unknown_fields("example.com", "Widget", &sts).is_none());
    }
}
