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

/// Built-in groups in the API server's priority order; groups from CRDs
/// follow, sorted. kubectl resolves an ambiguous short name (`ev` is both
/// core Events and Runbook's Evaluators) to the higher priority group.
const GROUP_ORDER: &[&str] = &[
    "apps",
    "events.k8s.io",
    "authorization.k8s.io",
    "batch",
    "policy",
    "rbac.authorization.k8s.io",
    "coordination.k8s.io",
    "apiextensions.k8s.io",
];

fn group_versions(defs: &[Arc<ResourceDef>]) -> Vec<(String, Vec<String>)> {
    let mut by_group: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in defs.iter().filter(|d| !d.group.is_empty()) {
        let vs = by_group.entry(d.group.clone()).or_default();
        for v in &d.versions {
            if !vs.contains(v) {
                vs.push(v.clone());
            }
        }
    }
    let rank = |g: &str| {
        GROUP_ORDER
            .iter()
            .position(|x| *x == g)
            .unwrap_or(GROUP_ORDER.len())
    };
    let mut out: Vec<(String, Vec<String>)> = by_group.into_iter().collect();
    out.sort_by(|a, b| (rank(&a.0), &a.0).cmp(&(rank(&b.0), &b.0)));
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
    let (_, vs) = gv.iter().find(|(g, _)| g == group)?;
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
        let verbs: &[&str] = if d.is_review() { &["create"] } else { VERBS };
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
        if d.has_scale() {
            resources.push(json!({
                "name": format!("{}/scale", d.plural), "singularName": "", "namespaced": d.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]
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

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The OpenAPI v3 index: one document per group version.
pub fn openapi_root(defs: &[Arc<ResourceDef>]) -> Value {
    let mut paths = serde_json::Map::new();
    for d in defs {
        for v in &d.versions {
            let p = gv_path(&d.group, v);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// The OpenAPI v2 document, with no definitions: kubectl reads it to
/// validate a `List` (which v3 has no path for) and, finding none of the
/// items' kinds, leaves them to the server's field validation.
pub fn openapi_v2() -> Value {
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": version_string()},
        "paths": {},
        "definitions": {}
    })
}

/// The OpenAPI v3 document of a group version: enough for kubectl to see
/// that every kind supports server-side field validation, which it then
/// leaves to the server instead of validating client-side.
pub fn openapi_gv(defs: &[Arc<ResourceDef>], group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    let params = json!([
        {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        {"name": "force", "in": "query", "schema": {"type": "boolean"}}
    ]);
    for d in defs
        .iter()
        .filter(|d| d.group == group && d.serves(version))
    {
        let base = format!("/{}", gv_path(group, version));
        let path = if d.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("{base}/{}/{{name}}", d.plural)
        };
        let gvk = json!({"group": group, "version": version, "kind": d.kind});
        paths.insert(
            path,
            json!({
                "get": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "get"},
                "put": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "put", "parameters": params},
                "patch": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "patch", "parameters": params},
            }),
        );
    }
    if paths.is_empty() {
        return None;
    }
    // A custom resource's schema, under the name the API server gives it
    // (the group reversed, the version, the kind).
    let mut schemas = serde_json::Map::new();
    for d in defs
        .iter()
        .filter(|d| d.group == group && d.serves(version) && d.crd.is_some())
    {
        if let Some(schema) = d.schemas.get(version) {
            let reversed: Vec<&str> = group.split('.').rev().collect();
            schemas.insert(
                format!("{}.{version}.{}", reversed.join("."), d.kind),
                schema.clone(),
            );
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": version_string()},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}

fn version_string() -> String {
    format!("v1.{KUBE_MINOR}.0")
}
