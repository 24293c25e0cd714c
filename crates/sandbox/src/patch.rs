//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the
//! strategic merge patch of the built-in kinds, whose lists of containers,
//! env, volumes, ports and the like merge by key instead of being replaced.
//!
//! The strategic merge here knows merge keys by field name rather than from
//! the full OpenAPI schema, which is what every built-in list the sandbox
//! serves needs. Directives: `$patch: delete|replace|merge` on maps and list
//! items, `$deleteFromPrimitiveList/<field>`, `$retainKeys`; ordering
//! directives (`$setElementOrder/<field>`) are accepted and ignored.

use serde_json::{Map, Value};

/// The key list items of `field` merge by, if any. `items` disambiguates
/// container ports (`containerPort`) from service ports (`port`).
pub fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "imagePullSecrets"
        | "volumes"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        "ports" => match sample {
            Some(s) if s.get("containerPort").is_some() => "containerPort",
            _ => "port",
        },
        _ => return None,
    })
}

/// Lists of scalars that merge as sets.
fn merges_as_set(field: &str) -> bool {
    field == "finalizers"
}

/// Apply a strategic merge patch.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => merge_maps(t, p),
        _ => *target = strip_directives(patch),
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_maps(t: &mut Map<String, Value>, p: &Map<String, Value>) {
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *t = strip_directives(&Value::Object(p.clone()))
                .as_object()
                .cloned()
                .unwrap_or_default();
            return;
        }
        Some("delete") => {
            t.clear();
            return;
        }
        _ => {}
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, pv) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (t.get_mut(field), pv.as_array()) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if pv.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), pv) {
            (Some(Value::Object(tm)), Value::Object(pm)) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                } else {
                    merge_maps(tm, pm);
                }
            }
            (Some(Value::Array(tl)), Value::Array(pl)) => merge_lists(k, tl, pl),
            _ => {
                if let Value::Object(pm) = pv
                    && pm.get("$patch").and_then(Value::as_str) == Some("delete")
                {
                    t.remove(k);
                    continue;
                }
                t.insert(k.clone(), strip_directives(pv));
            }
        }
    }
}

fn merge_lists(field: &str, t: &mut Vec<Value>, p: &[Value]) {
    if p.iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *t = p
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .map(strip_directives)
            .collect();
        return;
    }
    let key = merge_key(field, p.first().or(t.first()));
    match key {
        Some(key) if p.iter().all(|i| i.is_object()) => {
            let server_order: Vec<Value> = t.iter().filter_map(|x| x.get(key).cloned()).collect();
            for item in p {
                let id = item.get(key);
                let pos = id.and_then(|id| t.iter().position(|x| x.get(key) == Some(id)));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        t.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => strategic_merge(&mut t[i], item),
                    (None, false) => t.push(strip_directives(item)),
                }
            }
            let patch_order: Vec<&Value> = p.iter().filter_map(|i| i.get(key)).collect();
            order_like_the_api_server(t, &patch_order, &server_order, |x| x.get(key));
        }
        _ if merges_as_set(field) => {
            let server_order = t.clone();
            for item in p {
                if !t.contains(item) {
                    t.push(item.clone());
                }
            }
            let patch_order: Vec<&Value> = p.iter().collect();
            order_like_the_api_server(t, &patch_order, &server_order, |v| Some(v));
        }
        _ => *t = p.iter().map(strip_directives).collect(),
    }
}

/// The order a real API server gives a merged list: the items the patch
/// names, in the patch's order, interleaved with the items only the server
/// had, in the server's order. Two items both known to the server keep the
/// server's order; where either is new, the patch's item comes first.
fn order_like_the_api_server(
    merged: &mut Vec<Value>,
    patch_order: &[&Value],
    server_order: &[Value],
    id: impl for<'v> Fn(&'v Value) -> Option<&'v Value>,
) {
    let position =
        |order: &[Value], v: &Value| id(v).and_then(|k| order.iter().position(|o| o == k));
    let in_patch = |v: &Value| id(v).and_then(|k| patch_order.iter().position(|o| *o == k));
    let (mut from_patch, server_only): (Vec<Value>, Vec<Value>) = std::mem::take(merged)
        .into_iter()
        .partition(|v| in_patch(v).is_some());
    from_patch.sort_by_key(|v| in_patch(v));
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        from_patch.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some(l), Some(r)) => matches!(
                (position(server_order, l), position(server_order, r)),
                (Some(a), Some(b)) if a < b
            ),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_left { left.next() } else { right.next() };
        merged.extend(next);
    }
}

/// Apply a JSON patch (RFC 6902).
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let ops: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| format!("invalid JSON patch: {e}"))?;
    json_patch::patch(target, &ops).map_err(|e| e.to_string())
}

/// Apply a JSON merge patch (RFC 7386).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let mut t = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}]}});
        strategic_merge(
            &mut t,
            &json!({"spec": {"containers": [
            {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]},
            {"name": "c", "image": "c:1"}]}}),
        );
        // The order kube-apiserver v1.28 answers with: a new item the patch
        // names comes before the server's items that follow it.
        assert_eq!(t["spec"]["containers"][0]["image"], "a:2");
        assert_eq!(
            t["spec"]["containers"][0]["env"],
            json!([{"name": "Y", "value": "2"}, {"name": "X", "value": "1"}])
        );
        assert_eq!(t["spec"]["containers"][1]["name"], "c");
        assert_eq!(t["spec"]["containers"][2]["name"], "b");
    }

    #[test]
    fn directives_delete_and_replace() {
        let mut t = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}], "args": ["x"], "finalizers": ["f1"]}});
        strategic_merge(
            &mut t,
            &json!({"spec": {
            "containers": [{"name": "a", "$patch": "delete"}],
            "args": ["y"],
            "finalizers": ["f2"],
            "$setElementOrder/containers": [{"name": "b"}]}}),
        );
        assert_eq!(t["spec"]["containers"], json!([{"name": "b"}]));
        assert_eq!(
            t["spec"]["args"],
            json!(["y"]),
            "lists without a merge key are replaced"
        );
        assert_eq!(t["spec"]["finalizers"], json!(["f2", "f1"]));
        strategic_merge(&mut t, &json!({"spec": {"$patch": "replace", "only": 1}}));
        assert_eq!(t["spec"], json!({"only": 1}));
    }

    #[test]
    fn ports_merge_by_container_port_or_service_port() {
        let mut t = json!({"ports": [{"containerPort": 80, "name": "http"}]});
        strategic_merge(
            &mut t,
            &json!({"ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 443}]}),
        );
        assert_eq!(
            t["ports"],
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"}, {"containerPort": 443}])
        );
        let mut s = json!({"ports": [{"port": 80, "targetPort": 8080}]});
        strategic_merge(&mut s, &json!({"ports": [{"port": 80, "name": "web"}]}));
        assert_eq!(
            s["ports"],
            json!([{"port": 80, "targetPort": 8080, "name": "web"}])
        );
    }

    #[test]
    fn json_patch_reports_a_failed_test() {
        let mut t = json!({"a": 1});
        assert!(json_patch(&mut t, &json!([{"op": "test", "path": "/a", "value": 2}])).is_err());
        json_patch(
            &mut t,
            &json!([{"op": "replace", "path": "/a", "value": 3}]),
        )
        .unwrap();
        assert_eq!(t["a"], 3);
    }
}
