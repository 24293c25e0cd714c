//! The three shipped workflows end to end, through the real operator and
//! the shipped policies: drift rollback, ordered (and resumable) backups,
//! model serving.
//!
//! Pods "run" through the kubelet stand-in (tests/support/kubelet.rs): on a
//! real control plane it writes pod status as a kubelet would and the real
//! Job, StatefulSet and Deployment controllers react; on the sandbox it
//! drives the scenario world, which plays those controllers. Only the
//! VolumeSnapshot is marked ready by the test itself, as a cluster may have
//! no CSI snapshot driver. The assertions are the same on both sides. The
//! backup also goes through an operator restart and two API outages (a
//! proxy the test cuts), and nothing is done twice.

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/kubelet.rs"]
mod kubelet;
#[path = "support/proxy.rs"]
mod proxy;
#[path = "support/operator.rs"]
mod support;
#[path = "support/workflows.rs"]
mod workflows;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{Cluster, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kubelet::{Fate, Kubelet};
use proxy::Proxy;
use runbook::alert::{Alert, AlertSink, AlertSource, CompiledRoutes};
use runbook::runtime::{Operator, OperatorConfig};
use runbook::telemetry::Metrics;
use serde_json::{Value, json};
use workflows::*;

/// The alerts firing now, by alert name, with the receivers they reach.
#[derive(Default)]
struct Firing(Mutex<BTreeMap<AlertSource, Vec<Routed>>>);

/// An alert and the receivers its routes reach.
type Routed = (Alert, Vec<String>);

impl Firing {
    fn named(&self, name: &str) -> Vec<(Alert, Vec<String>)> {
        self.0
            .lock()
            .unwrap()
            .values()
            .flatten()
            .filter(|(a, _)| a.labels.get("alertname").map(String::as_str) == Some(name))
            .cloned()
            .collect()
    }
}

impl AlertSink for Firing {
    fn report(
        &self,
        source: &AlertSource,
        routes: Option<&Arc<CompiledRoutes>>,
        alerts: Vec<Alert>,
    ) {
        let with: Vec<(Alert, Vec<String>)> = alerts
            .into_iter()
            .map(|a| {
                let r = routes
                    .map(|r| r.receivers_for(&a.labels))
                    .unwrap_or_default();
                (a, r)
            })
            .collect();
        let mut m = self.0.lock().unwrap();
        if with.is_empty() {
            m.remove(source);
        } else {
            m.insert(source.clone(), with);
        }
    }

    fn retain(&self, keep: &dyn Fn(&AlertSource) -> bool) {
        self.0.lock().unwrap().retain(|s, _| keep(s));
    }
}

async fn start(c: &Cluster, sink: Arc<Firing>) -> Arc<Operator> {
    let op = support::operator_with_sink(
        c,
        shipped_policies(),
        OperatorConfig::default(),
        Arc::new(Metrics::new()),
        sink,
    );
    op.start().await.expect("the operator starts");
    op
}

async fn events_for(c: &Cluster, name: &str) -> Vec<String> {
    let events: Api<Event> = c.api();
    events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reason)
        .collect()
}

/// The benchmark: score 0.62 on revision 2 (the bad release), 0.91 on
/// anything else, from the revision the policy passes in its environment.
const BENCHMARK: &str = r#"if [ "$TARGET_REVISION" = "2" ]; then echo '{"score": 0.62}'; else echo '{"score": 0.91}'; fi > /dev/termination-log"#;

/// What the benchmark program writes to its termination log, from the
/// revision the policy passes in the pod's environment.
fn score_for(pod: &Value) -> String {
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

fn image_of(d: &Deployment) -> String {
    d.spec.template.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap()
}

async fn annotate(api: &Api<DynamicObject>, name: &str, key: &str, value: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_scores_low_is_rolled_back_and_the_team_is_paged() {
    let c = Cluster::new("evaluator").await;
    install_crds(&c).await;
    let kubelet = Kubelet::start(&c);
    kubelet.run("chatbot-eval-", |pod| {
        Some(Fate::Exit {
            code: 0,
            message: Some(score_for(pod)),
        })
    });
    kubelet.ready("chatbot-");
    let sink = Arc::new(Firing::default());
    let op = start(&c, sink.clone()).await;
    let deployments: Api<Deployment> = c.api();
    let template = |image: &str| {
        json!({"metadata": {"labels": {"app": "chatbot"}},
               "spec": {"containers": [{"name": "model", "image": image}]}})
    };
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "chatbot"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chatbot"}},
                         "template": template("registry.k8s.io/pause:3.9")}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let revision = |d: Deployment| {
        d.metadata
            .annotations
            .unwrap_or_default()
            .get("deployment.kubernetes.io/revision")
            .cloned()
            .unwrap_or_default()
    };
    eventually("revision 1", 60, || async {
        revision(deployments.get("chatbot").await.unwrap()) == "1"
    })
    .await;
    let evaluators = kind_api(&c, "runbook.dev/v1alpha1", "Evaluator");
    create(
        &c,
        json!({
            "apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
            "metadata": {"name": "chatbot"},
            "spec": {"targetRef": {"name": "chatbot"}, "threshold": 0.85, "schedule": "@daily",
                     "benchmark": {"image": "busybox:1.36", "command": ["sh", "-c", BENCHMARK]},
                     "alert": {"labels": {"team": "ml"}}}
        }),
    )
    .await;
    // The first run starts at creation and passes on revision 1.
    eventually("a healthy first run", 120, || async {
        let st = status_of(&evaluators, "chatbot").await;
        st["phase"] == "Healthy" && st["lastGoodRevision"] == 1
    })
    .await;
    // A bad release, then a run asked for by an SRE.
    deployments
        .patch(
            "chatbot",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": template("registry.k8s.io/pause:3.10")}})),
        )
        .await
        .unwrap();
    eventually("revision 2", 60, || async {
        revision(deployments.get("chatbot").await.unwrap()) == "2"
    })
    .await;
    annotate(&evaluators, "chatbot", "runbook.dev/run-now", "1").await;
    eventually("the rollback", 120, || async {
        let st = status_of(&evaluators, "chatbot").await;
        st["phase"] == "RolledBack"
            && st["lastRollback"]["fromRevision"] == 2
            && st["lastRollback"]["toRevision"] == 1
    })
    .await;
    eventually("the good template back", 60, || async {
        image_of(&deployments.get("chatbot").await.unwrap()) == "registry.k8s.io/pause:3.9"
    })
    .await;
    let paged = sink.named("EvaluatorRolledBack");
    assert_eq!(paged.len(), 1, "one critical alert: {paged:?}");
    assert_eq!(paged[0].0.labels["severity"], "critical");
    assert_eq!(paged[0].0.labels["team"], "ml");
    assert!(
        paged[0].1.contains(&"events".to_string()),
        "routed to the critical route: {:?}",
        paged[0].1
    );
    assert!(
        events_for(&c, "chatbot")
            .await
            .contains(&"RolledBack".to_string())
    );
    // The rolled-back revision passes the next run; the alert resolves.
    annotate(&evaluators, "chatbot", "runbook.dev/run-now", "2").await;
    eventually("healthy again", 120, || async {
        let st = status_of(&evaluators, "chatbot").await;
        st["phase"] == "Healthy" && st["lastGoodRevision"] == 3
    })
    .await;
    assert!(
        sink.named("EvaluatorRolledBack").is_empty(),
        "the alert resolved"
    );
    let st = status_of(&evaluators, "chatbot").await;
    assert_eq!(
        st["lastRollback"]["fromRevision"], 2,
        "one rollback, recorded"
    );
    let scores: Vec<f64> = st["scoreHistory"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["score"].as_f64().unwrap())
        .collect();
    assert_eq!(scores, [0.91, 0.62, 0.91]);
    op.shutdown(Duration::from_secs(5)).await;
    drop(kubelet);
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_runs_in_order_and_a_restarted_operator_resumes_it() {
    let c = Cluster::new("backup").await;
    install_crds(&c).await;
    let kubelet = Kubelet::start(&c);
    let sink = Arc::new(Firing::default());
    let op = start(&c, sink.clone()).await;
    database(&c).await;
    let backups = kind_api(&c, "runbook.dev/v1alpha1", "DatabaseBackup");
    create(&c, nightly_backup()).await;
    let jobs: Api<Job> = c.api();
    // Nothing is dumped while the database is not ready.
    eventually("waiting on the database", 30, || async {
        status_of(&backups, "nightly").await["currentStep"] == "wait-database"
    })
    .await;
    assert!(
        jobs.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    kubelet.ready("db-");
    eventually("the dump Job", 120, || async {
        jobs.get("nightly-once-dump").await.is_ok()
    })
    .await;
    let dump_uid = jobs.get("nightly-once-dump").await.unwrap().metadata.uid;
    let snapshots = kind_api(&c, "snapshot.storage.k8s.io/v1", "VolumeSnapshot");
    assert!(
        snapshots.get("nightly-once-snap").await.is_err(),
        "no snapshot before the dump succeeded"
    );

    // The operator stops mid-backup; a new one takes over.
    op.shutdown(Duration::from_secs(5)).await;
    kubelet.exit("nightly-once-dump", 0, None);
    let done: Api<Job> = c.api();
    eventually("the dump Job to succeed", 60, || async {
        done.get("nightly-once-dump")
            .await
            .ok()
            .and_then(|j| j.status)
            .and_then(|s| s.succeeded)
            == Some(1)
    })
    .await;
    // The new one starts while its API server is away (it waits), and
    // loses it again for longer than its watches' patience mid-backup.
    let proxy = Proxy::start(&c).await;
    proxy.cut();
    let op = support::operator_through(
        &c,
        proxy.client().await,
        shipped_policies(),
        OperatorConfig::default(),
        Arc::new(Metrics::new()),
        sink.clone(),
    );
    let starting = {
        let op = op.clone();
        tokio::spawn(async move { op.start().await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.restore();
    starting.await.unwrap().expect("the operator starts");
    eventually("the snapshot", 120, || async {
        snapshots.get("nightly-once-snap").await.is_ok()
    })
    .await;
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(11)).await;
    proxy.restore();
    assert_eq!(
        jobs.get("nightly-once-dump").await.unwrap().metadata.uid,
        dump_uid,
        "the finished dump is not repeated"
    );
    assert_eq!(jobs.list(&Default::default()).await.unwrap().items.len(), 1);
    let snap = snapshots.get("nightly-once-snap").await.unwrap();
    assert_eq!(
        snap.data["spec"]["source"]["persistentVolumeClaimName"],
        "data-db-0"
    );
    assert_eq!(status_of(&backups, "nightly").await["phase"], "Running");
    // A cluster may have no CSI snapshotter: the test marks it ready.
    snapshots
        .patch_status(
            "nightly-once-snap",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"readyToUse": true}})),
        )
        .await
        .unwrap();
    eventually("the backup published", 60, || async {
        let st = status_of(&backups, "nightly").await;
        st["phase"] == "Completed" && st["backupURL"] == "s3://backups/e2e/nightly-once.sql.gz"
    })
    .await;
    let st = status_of(&backups, "nightly").await;
    let states: Vec<&str> = st["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["Succeeded"; 5]);
    eventually("the completion Event", 30, || async {
        events_for(&c, "nightly")
            .await
            .contains(&"BackupCompleted".to_string())
    })
    .await;
    assert!(sink.named("DatabaseBackupFailed").is_empty());
    op.shutdown(Duration::from_secs(5)).await;
    drop(kubelet);
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_is_served_and_a_new_uri_rolls_out() {
    let c = Cluster::new("aimodel").await;
    install_crds(&c).await;
    let kubelet = Kubelet::start(&c);
    // The model servers start; a GPU node is the kubelet stand-in's to fake.
    kubelet.ready("llama-");
    let sink = Arc::new(Firing::default());
    let op = start(&c, sink.clone()).await;
    let models = kind_api(&c, "runbook.dev/v1alpha1", "AIModel");
    create(
        &c,
        json!({
            "apiVersion": "runbook.dev/v1alpha1", "kind": "AIModel",
            "metadata": {"name": "llama"},
            "spec": {"modelUri": "s3://models/llama/v1", "servingImage": "registry.k8s.io/pause:3.9",
                     "gpusPerReplica": 1, "replicas": 1}
        }),
    )
    .await;
    let deployments: Api<Deployment> = c.api();
    eventually("the serving Deployment", 60, || async {
        deployments.get("llama").await.is_ok()
    })
    .await;
    let d = deployments.get("llama").await.unwrap();
    let pod = d.spec.template.spec.clone().unwrap();
    let limits = pod.containers[0].resources.clone().unwrap().limits.unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "1");
    let init = &pod.init_containers.unwrap()[0];
    assert!(
        init.args
            .as_ref()
            .unwrap()
            .contains(&"s3://models/llama/v1".to_string())
    );
    let services: Api<Service> = c.api();
    eventually("the Service", 30, || async {
        services.get("llama").await.is_ok()
    })
    .await;
    eventually("serving", 60, || async {
        let st = status_of(&models, "llama").await;
        st["phase"] == "Ready" && st["servedModelUri"] == "s3://models/llama/v1"
    })
    .await;
    models
        .patch(
            "llama",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"modelUri": "s3://models/llama/v2"}})),
        )
        .await
        .unwrap();
    eventually("the new URI in the pod template", 60, || async {
        let d = deployments.get("llama").await.unwrap();
        d.spec
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap_or_default()
            .get("runbook.dev/model-uri")
            .map(String::as_str)
            == Some("s3://models/llama/v2")
    })
    .await;
    eventually("serving v2", 60, || async {
        status_of(&models, "llama").await["servedModelUri"] == "s3://models/llama/v2"
    })
    .await;
    // A weights download stuck in a crash loop: Degraded and alerted.
    let pods: Api<Pod> = c.api();
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "weights-crashloop", "labels": {"runbook.dev/model": "llama"}},
            "spec": {"initContainers": [{"name": "fetch-weights", "image": "busybox:1.36"}],
                 "containers": [{"name": "server", "image": "registry.k8s.io/pause:3.9"}]}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    pods.patch_status(
        "weights-crashloop",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Pending", "initContainerStatuses": [{
            "name": "fetch-weights", "image": "busybox", "imageID": "", "ready": false, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "403 Forbidden"}}}]}})),
    )
    .await
    .unwrap();
    eventually("Degraded", 60, || async {
        status_of(&models, "llama").await["phase"] == "Degraded"
    })
    .await;
    eventually("the alert", 30, || async {
        !sink.named("AIModelWeightsDownloadFailing").is_empty()
    })
    .await;
    assert!(
        events_for(&c, "llama")
            .await
            .contains(&"WeightsDownloadFailing".to_string())
    );
    op.shutdown(Duration::from_secs(5)).await;
    drop(kubelet);
    c.cleanup().await;
}
