//! What the workflow tests share: the shipped policies, Runbook's CRDs
//! (and VolumeSnapshot's) installed and served, a database to back up,
//! and short ways to make and read objects of any kind.
#![allow(dead_code)]

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use runbook_core::kinds::KindRef;
use serde_json::{Value, json};

use super::cluster::{Cluster, crd_resource, eventually};

pub fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn shipped_policies() -> runbook_core::policy::PolicySet {
    let engine = runbook_core::script::ScriptEngine::default();
    let bundle = runbook_core::policy::Bundle::from_dir(&repo().join("policies")).unwrap();
    let (set, errors) = runbook_core::policy::load(&engine, &[bundle]);
    assert!(errors.is_empty(), "{errors:?}");
    set
}

pub async fn apply_crd(c: &Cluster, crd: Value) {
    let api: Api<DynamicObject> = Api::all_with(c.client.clone(), &crd_resource());
    let name = crd["metadata"]["name"].as_str().unwrap().to_string();
    api.patch(
        &name,
        &PatchParams::apply("runbook-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
}

/// Runbook's CRDs and the VolumeSnapshot CRD, served.
pub async fn install_crds(c: &Cluster) {
    for crd in runbook_core::crd::all() {
        apply_crd(c, serde_json::to_value(crd).unwrap()).await;
    }
    let vs = std::fs::read_to_string(repo().join("examples/crds/volumesnapshot.yaml")).unwrap();
    let vs = runbook_core::util::yaml::parse_documents(&vs)
        .unwrap()
        .remove(0);
    let snapshots: Api<DynamicObject> =
        Api::all_with(c.client.clone(), &snapshot_kind().api_resource());
    if snapshots.list(&Default::default()).await.is_err() {
        apply_crd(c, vs).await;
    }
    for kind in [
        KindRef::new("runbook.dev/v1alpha1", "Evaluator"),
        KindRef::new("runbook.dev/v1alpha1", "DatabaseBackup"),
        KindRef::new("runbook.dev/v1alpha1", "AIModel"),
        snapshot_kind(),
    ] {
        let api: Api<DynamicObject> =
            Api::namespaced_with(c.client.clone(), &c.ns, &kind.api_resource());
        eventually(&format!("{kind} to be served"), 60, || async {
            api.list(&Default::default()).await.is_ok()
        })
        .await;
    }
}

pub fn snapshot_kind() -> KindRef {
    KindRef::new("snapshot.storage.k8s.io/v1", "VolumeSnapshot")
}

pub fn kind_api(c: &Cluster, api_version: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        c.client.clone(),
        &c.ns,
        &KindRef::new(api_version, kind).api_resource(),
    )
}

pub async fn create(c: &Cluster, obj: Value) {
    let av = obj["apiVersion"].as_str().unwrap().to_string();
    let kind = obj["kind"].as_str().unwrap().to_string();
    let o: DynamicObject = serde_json::from_value(obj).unwrap();
    kind_api(c, &av, &kind)
        .create(&PostParams::default(), &o)
        .await
        .unwrap();
}

pub async fn status_of(api: &Api<DynamicObject>, name: &str) -> Value {
    api.get(name)
        .await
        .map(|o| o.data["status"].clone())
        .unwrap_or(Value::Null)
}

pub fn postgres() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}},
                              "spec": {"containers": [{"name": "db", "image": "registry.k8s.io/pause:3.9"}]}}}
    })
}

/// The database a backup needs: its volume (PVC `data-db-0`) and the
/// StatefulSet `db`.
pub async fn database(c: &Cluster) {
    let pvcs: Api<PersistentVolumeClaim> = c.api();
    pvcs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "data-db-0"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap(),
    )
    .await
    .unwrap();
    create(c, postgres()).await;
}

/// The DatabaseBackup `nightly` of that database, run once.
pub fn nightly_backup() -> Value {
    json!({
        "apiVersion": "runbook.dev/v1alpha1", "kind": "DatabaseBackup",
        "metadata": {"name": "nightly"},
        "spec": {"database": {"statefulSet": "db"}, "pvc": "data-db-0",
                 "dump": {"image": "busybox:1.36", "command": ["sh", "-c", "echo dumped"]},
                 "volumeSnapshotClassName": "csi-snapclass", "destination": "s3://backups/e2e"}
    })
}

/// The benchmark: score 0.62 on revision 2 (the bad release), 0.91 on
/// anything else, from the revision the policy passes in its environment.
pub const BENCHMARK: &str = r#"if [ "$TARGET_REVISION" = "2" ]; then echo '{"score": 0.62}'; else echo '{"score": 0.91}'; fi > /dev/termination-log"#;

/// What the benchmark program writes to its termination log, from the
/// revision the policy passes in the pod's environment.
pub fn score_for(pod: &Value) -> String {
    let revision = pod["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "TARGET_REVISION")
        .and_then(|e| e["value"].as_str());
    if revision == Some("2") {
        r#"{"score": 0.62}"#.into()
    } else {
        r#"{"score": 0.91}"#.into()
    }
}

pub fn image_of(d: &Deployment) -> String {
    d.spec.template.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap()
}

pub async fn annotate(api: &Api<DynamicObject>, name: &str, key: &str, value: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
    )
    .await
    .unwrap();
}

/// A model server's pod template on `image` (label `app: NAME`).
pub fn model_template(name: &str, image: &str) -> Value {
    json!({"metadata": {"labels": {"app": name}},
           "spec": {"containers": [{"name": "model", "image": image}]}})
}

/// A model Deployment an Evaluator watches, on its first release.
pub async fn model_deployment(c: &Cluster, name: &str) -> Api<Deployment> {
    let deployments: Api<Deployment> = c.api();
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                         "template": model_template(name, "registry.k8s.io/pause:3.9")}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    deployments
}

/// A new release of Deployment `name`.
pub async fn release(deployments: &Api<Deployment>, name: &str, image: &str) {
    deployments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": model_template(name, image)}})),
        )
        .await
        .unwrap();
}

/// The revision the Deployment controller gave a Deployment ("" before it has).
pub fn revision_of(d: &Deployment) -> String {
    d.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("deployment.kubernetes.io/revision"))
        .cloned()
        .unwrap_or_default()
}
