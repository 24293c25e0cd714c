//! Targets of any schema: policies bound to kinds whose status Runbook
//! does not define, as users bring them (third-party CRDs whose status
//! schema lists only their own fields).

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod support;

use cluster::{Cluster, crd_resource, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

/// A Mirror: a CRD shaped like third-party ones, its status a structural
/// schema of its own fields only (`value`), so the API server prunes
/// whatever else is written there.
async fn install_mirror_crd(c: &Cluster) -> ApiResource {
    let g = support::widget_group(c);
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("mirrors.{g}")},
        "spec": {
            "group": g, "scope": "Namespaced",
            "names": {"kind": "Mirror", "plural": "mirrors", "singular": "mirror"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"source": {"type": "string"}}},
                    "status": {"type": "object", "properties": {"value": {"type": "string"}}}
                }}}
            }]
        }
    }))
    .unwrap();
    let crds: Api<DynamicObject> = Api::all_with(c.client.clone(), &crd_resource());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let resource = ApiResource {
        group: g.clone(),
        version: "v1".into(),
        api_version: format!("{g}/v1"),
        kind: "Mirror".into(),
        plural: "mirrors".into(),
    };
    let mirrors: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), &c.ns, &resource);
    eventually("the Mirror kind to be served", 60, || async {
        mirrors.list(&Default::default()).await.is_ok()
    })
    .await;
    resource
}

const MIRROR: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: mirror}
spec:
  target: {apiVersion: GROUP/v1, kind: Mirror}
  reads: [{apiVersion: v1, kind: ConfigMap}]
  script: mirror.rhai
"#;

const MIRROR_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let source = ctx.get("ConfigMap", ctx.resource.spec.source);
    if source == () { return []; }
    [status(#{ value: source.data.value })]
}
"#;

/// The source's `value`, and a note beside it that the Mirror ignores.
async fn set_source(sources: &Api<ConfigMap>, value: &str, note: &str) {
    sources
        .patch(
            "source",
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "source"},
                                 "data": {"value": value, "note": note}})),
        )
        .await
        .unwrap();
}

/// The server prunes Runbook's record from the Mirror's status, so a
/// decision that changes nothing else is a write the server makes nothing
/// of (no new resourceVersion). The next change must still be decided: a
/// wait for that write to show in the cache would never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_schema_that_prunes_runbooks_fields_does_not_stall_the_target() {
    let c = Cluster::new("any-mirror").await;
    let resource = install_mirror_crd(&c).await;
    let sources: Api<ConfigMap> = c.api();
    set_source(&sources, "one", "").await;
    let op = support::started(
        &c,
        &[("mirror.yaml", MIRROR), ("mirror.rhai", MIRROR_SCRIPT)],
    )
    .await;
    let mirrors: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), &c.ns, &resource);
    mirrors
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": resource.api_version, "kind": "Mirror",
                "metadata": {"name": "m"}, "spec": {"source": "source"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let value = || async {
        mirrors
            .get("m")
            .await
            .map(|m| m.data["status"]["value"].clone())
            .unwrap_or(Value::Null)
    };
    eventually("the first value mirrored", 30, || async {
        value().await == "one"
    })
    .await;
    // Each round: a change of the source that changes nothing of the
    // Mirror's own status (its decision's status write is one the server
    // makes nothing of), then one that does, which must be mirrored well
    // within the bound of a wait for the cache (30 s): decided because
    // nothing waits, not because a wait ran out.
    let mut was = "one";
    for next in ["two", "three"] {
        set_source(&sources, was, &format!("before {next}")).await;
        support::settle(&op).await;
        set_source(&sources, next, &format!("before {next}")).await;
        was = next;
        eventually(&format!("{next} mirrored"), 15, || async {
            value().await == next
        })
        .await;
    }
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}
