//! Discovery documents: `/version`, `/api`, `/apis`, and the resource lists
//! of every group version, in the forms kube's `Discovery` and kubectl read.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::registry::ResourceDef;

pub const KUBE_MINOR: &str = "34";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBE_MINOR,
        "gitVersion": format!("v1.{KUBE_MINOR}.0-runbook-sandbox"),
        "gitCommit": "runbook-sandbox",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a",
        "compiler": "rustc",
        "platform": "linux/amd64"
    })
}

pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
}

fn group_versions(defs: &[Arc<ResourceDef>]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in defs.iter().filter(|d| !d.group.is_empty()) {
        let vs = out.entry(d.group.clone()).or_default();
        for v in &d.versions {
            if !vs.contains(v) {
                vs.push(v.clone());
            }
        }
    }
    out
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs[0]})
}

pub fn groups(defs: &[Arc<ResourceDef>]) -> Value {
    let groups: Vec<Value> = group_versions(defs)
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(defs: &[Arc<ResourceDef>], group: &str) -> Option<Value> {
    let gv = group_versions(defs);
    let vs = gv.get(group)?;
    let mut doc = group_doc(group, vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub fn resources(defs: &[Arc<ResourceDef>], group: &str, version: &str) -> Option<Value> {
    let matching: Vec<&Arc<ResourceDef>> = defs
        .iter()
        .filter(|d| d.group == group && d.serves(version))
        .collect();
    if matching.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for d in matching {
        let verbs: &[&str] = if d.kind == "SelfSubjectAccessReview" {
            &["create"]
        } else {
            VERBS
        };
        let mut r = json!({
            "name": d.plural,
            "singularName": d.singular,
            "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": verbs,
        });
        if !d.short_names.is_empty() {
            r["shortNames"] = json!(d.short_names);
        }
        if !d.categories.is_empty() {
            r["categories"] = json!(d.categories);
        }
        resources.push(r);
        if d.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", d.plural), "singularName": "", "namespaced": d.namespaced,
                "kind": d.kind, "verbs": ["get", "patch", "update"]
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}
