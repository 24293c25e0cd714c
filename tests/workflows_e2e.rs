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

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

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
use runbook_core::alert::{Alert, AlertSink, AlertSource, CompiledRoutes};
use runbook_operator::runtime::{Operator, OperatorConfig};
use runbook_operator::telemetry::Metrics;
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

/// The kubelet stand-in, running benchmark pods to their score.
fn benchmark_kubelet(c: &Cluster) -> Kubelet {
    let kubelet = Kubelet::start(c);
    kubelet.run("chatbot-eval-", |pod| {
        Some(Fate::Exit {
            code: 0,
            message: Some(score_for(pod)),
        })
    });
    kubelet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_scores_low_is_rolled_back_and_the_team_is_paged() {
    let c = Cluster::new("evaluator").await;
    install_crds(&c).await;
    let kubelet = benchmark_kubelet(&c);
    kubelet.ready("chatbot-");
    let sink = Arc::new(Firing::default());
    let op = start(&c, sink.clone()).await;
    let deployments = model_deployment(&c, "chatbot").await;
    eventually("revision 1", 60, || async {
        revision_of(&deployments.get("chatbot").await.unwrap()) == "1"
    })
    .await;
    let evaluators = kind_api(&c, "runbook.dev/v1alpha1", "Evaluator");
    create(
        &c,
        json!({
            "apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
            "metadata": {"name": "chatbot"},
            // Nightly at 03:00 in Berlin, whatever the season.
            "spec": {"targetRef": {"name": "chatbot"}, "threshold": 0.85, "schedule": "CRON_TZ=Europe/Berlin 0 3 * * *",
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
    // The next run is at 03:00 on Berlin's clock.
    let next: jiff::Timestamp = status_of(&evaluators, "chatbot").await["nextRunTime"]
        .as_str()
        .expect("a next run time")
        .parse()
        .unwrap();
    let local = next.to_zoned(jiff::tz::TimeZone::get("Europe/Berlin").unwrap());
    assert_eq!(
        (local.hour(), local.minute()),
        (3, 0),
        "next run {next} is {local} in Berlin"
    );
    // A bad release, then a run asked for by an SRE.
    release(&deployments, "chatbot", "registry.k8s.io/pause:3.10").await;
    eventually("revision 2", 60, || async {
        revision_of(&deployments.get("chatbot").await.unwrap()) == "2"
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
    // `runbook explain` as an SRE types it, in the kubeconfig context's
    // namespace: the Deployment says who changed it and for what; the
    // Evaluator what was written, and its recent history.
    let dir = std::env::temp_dir().join(format!("runbook-explain-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    in_namespace(&kubeconfig, &c.ns);
    let text = explain(&kubeconfig, "deployment.apps/chatbot").await;
    assert!(
        text.contains(&format!(
            "changed by:   policy evaluator-drift for Evaluator {}/chatbot: rollback to revision 1",
            c.ns
        )),
        "{text}"
    );
    let text = explain(&kubeconfig, "evaluator/chatbot").await;
    for part in [
        "phase: RolledBack",
        "lastRollback: {",
        "alert EvaluatorRolledBack",
        "history (last Events):",
        "RolledBack: ",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
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
            "spec": {"modelUri": "https://models.example.com/llama/v1.safetensors", "servingImage": "registry.k8s.io/pause:3.9",
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
    // The default downloader: busybox's wget, given the URI.
    let init = &pod.init_containers.unwrap()[0];
    let env = init.env.clone().unwrap_or_default();
    assert_eq!(
        env[0].value.as_deref(),
        Some("https://models.example.com/llama/v1.safetensors")
    );
    assert!(
        init.command
            .clone()
            .unwrap_or_default()
            .join(" ")
            .contains("wget")
    );
    let services: Api<Service> = c.api();
    eventually("the Service", 30, || async {
        services.get("llama").await.is_ok()
    })
    .await;
    eventually("serving", 60, || async {
        let st = status_of(&models, "llama").await;
        st["phase"] == "Ready"
            && st["servedModelUri"] == "https://models.example.com/llama/v1.safetensors"
    })
    .await;
    // kstatus: the generation seen, nothing in flight, nothing stalled.
    eventually("kstatus conditions once serving", 30, || async {
        let m = models.get("llama").await.unwrap();
        let st = &m.data["status"];
        let of = |t: &str| {
            st["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == t))
                .map(|c| c["status"].as_str().unwrap_or("").to_string())
        };
        st["observedGeneration"] == json!(m.metadata.generation)
            && of("Ready").as_deref() == Some("True")
            && of("Reconciling").as_deref() == Some("False")
            && of("Stalled").as_deref() == Some("False")
    })
    .await;
    if cluster::have_kubectl() {
        let dir = std::env::temp_dir().join(format!("runbook-kstatus-{}", c.ns));
        let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
        for condition in ["Ready", "Reconciling=false", "Stalled=false"] {
            let (ok, out, err) = cluster::kubectl(
                &kubeconfig,
                &c.ns,
                &[
                    "wait",
                    "aimodel/llama",
                    &format!("--for=condition={condition}"),
                    "--timeout=30s",
                ],
            );
            assert!(ok, "kubectl wait --for=condition={condition}: {out}{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    models
        .patch(
            "llama",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"modelUri": "https://models.example.com/llama/v2.safetensors"}}),
            ),
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
            == Some("https://models.example.com/llama/v2.safetensors")
    })
    .await;
    eventually("serving v2", 60, || async {
        status_of(&models, "llama").await["servedModelUri"]
            == "https://models.example.com/llama/v2.safetensors"
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

/// The shipped policies and those of an example directory, loaded together
/// as `runbook run --policy-dir policies/ --policy-dir DIR` would.
fn shipped_and(example: &str) -> runbook_core::policy::PolicySet {
    let engine = runbook_core::script::ScriptEngine::default();
    let bundles = [
        runbook_core::policy::Bundle::from_dir(&repo().join("policies")).unwrap(),
        runbook_core::policy::Bundle::from_dir(&repo().join(example)).unwrap(),
    ];
    let (set, errors) = runbook_core::policy::load(&engine, &bundles);
    assert!(errors.is_empty(), "{errors:?}");
    set
}

/// The field managers that wrote an object, by operation and subresource.
fn managers(o: &DynamicObject) -> Vec<String> {
    o.metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            format!(
                "{} {}{}",
                m.manager.as_deref().unwrap_or(""),
                m.operation.as_deref().unwrap_or(""),
                m.subresource
                    .as_deref()
                    .map(|s| format!(" {s}"))
                    .unwrap_or_default()
            )
        })
        .collect()
}

fn policy_label(o: &Value) -> &str {
    o["metadata"]["labels"]["runbook.dev/policy-name"]
        .as_str()
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_teams_policy_collects_training_data_once_per_rollback_beside_the_drift_policy() {
    let c = Cluster::new("retrain").await;
    install_crds(&c).await;
    let kubelet = benchmark_kubelet(&c);
    kubelet.exit("chatbot-collect-", 0, None);
    kubelet.ready("chatbot-");
    let sink = Arc::new(Firing::default());
    let op = support::operator_with_sink(
        &c,
        shipped_and("examples/retrain-on-drift/policy"),
        OperatorConfig::default(),
        Arc::new(Metrics::new()),
        sink.clone(),
    );
    op.start().await.expect("the operator starts");
    let deployments = model_deployment(&c, "chatbot").await;
    let evaluators = kind_api(&c, "runbook.dev/v1alpha1", "Evaluator");
    create(
        &c,
        json!({
            "apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
            "metadata": {"name": "chatbot"},
            "spec": {"targetRef": {"name": "chatbot"}, "threshold": 0.85, "schedule": "@daily",
                     "benchmark": {"image": "busybox:1.36", "command": ["sh", "-c", BENCHMARK]}}
        }),
    )
    .await;
    eventually("a healthy first run", 120, || async {
        let st = status_of(&evaluators, "chatbot").await;
        st["phase"] == "Healthy" && st["lastGoodRevision"] == 1
    })
    .await;
    let jobs: Api<Job> = c.api();
    let job_values = || async {
        jobs.list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|j| serde_json::to_value(j).unwrap())
            .collect::<Vec<Value>>()
    };
    assert!(
        job_values().await.iter().all(|j| {
            let name = j["metadata"]["name"].as_str().unwrap_or("");
            name.starts_with("chatbot-eval-") && policy_label(j) == "evaluator-drift"
        }),
        "no collection before a rollback; benchmarks carry their policy's label"
    );
    release(&deployments, "chatbot", "registry.k8s.io/pause:3.10").await;
    eventually("revision 2", 60, || async {
        let d = deployments.get("chatbot").await.unwrap();
        d.metadata.annotations.unwrap_or_default()["deployment.kubernetes.io/revision"] == "2"
    })
    .await;
    annotate(&evaluators, "chatbot", "runbook.dev/run-now", "1").await;
    eventually(
        "the rollback and its collected training data",
        120,
        || async {
            let o = evaluators.get("chatbot").await.unwrap();
            let st = &o.data["status"];
            let collected = st["conditions"].as_array().into_iter().flatten().any(|c| {
                c["type"] == "TrainingData" && c["status"] == "True" && c["reason"] == "Collected"
            });
            st["lastRollback"]["fromRevision"] == 2 && collected
        },
    )
    .await;
    let all = job_values().await;
    let collections: Vec<&Value> = all
        .iter()
        .filter(|j| {
            j["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .starts_with("chatbot-collect-")
        })
        .collect();
    assert_eq!(collections.len(), 1, "one collection per rollback: {all:?}");
    assert_eq!(policy_label(collections[0]), "retrain-on-drift");
    assert_eq!(
        collections[0]["metadata"]["annotations"]["runbook.dev/bad-revision"],
        "2"
    );
    let job: Job = jobs
        .get(collections[0]["metadata"]["name"].as_str().unwrap())
        .await
        .unwrap();
    let job = serde_json::from_value::<DynamicObject>(serde_json::to_value(job).unwrap()).unwrap();
    assert!(
        managers(&job)
            .iter()
            .any(|m| m == "runbook/retrain-on-drift Apply"),
        "applied by its policy's field manager: {:?}",
        managers(&job)
    );
    // Each policy's status writes under its own manager, and each keeps
    // its own decision record.
    let ev = evaluators.get("chatbot").await.unwrap();
    let ms = managers(&ev);
    for m in [
        "runbook/evaluator-drift Update status",
        "runbook/retrain-on-drift Update status",
    ] {
        assert!(ms.iter().any(|x| x == m), "{m} in {ms:?}");
    }
    let records: Vec<&str> = ev.data["status"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["policy"].as_str().unwrap())
        .collect();
    assert_eq!(records, ["evaluator-drift", "retrain-on-drift"]);
    // Another benchmark run: evaluator-drift cleans up only its own Jobs.
    annotate(&evaluators, "chatbot", "runbook.dev/run-now", "2").await;
    eventually("healthy again", 120, || async {
        status_of(&evaluators, "chatbot").await["lastGoodRevision"] == 3
    })
    .await;
    let after = job_values().await;
    assert!(
        after
            .iter()
            .any(|j| j["metadata"]["name"] == collections[0]["metadata"]["name"]),
        "the collection Job is not the drift policy's to delete: {after:?}"
    );
    assert!(sink.named("EvaluatorRolledBack").is_empty(), "resolved");
    op.shutdown(Duration::from_secs(5)).await;
    drop(kubelet);
    c.cleanup().await;
}

fn statefulset_image(s: &Value, container: &str) -> String {
    s["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == container)
        .and_then(|c| c["image"].as_str())
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_waits_for_its_snapshot_and_a_failed_snapshot_withholds_the_next() {
    let c = Cluster::new("upgrade").await;
    install_crds(&c).await;
    let crd =
        std::fs::read_to_string(repo().join("examples/snapshot-before-upgrade/crd.yaml")).unwrap();
    apply_crd(
        &c,
        runbook_core::util::yaml::parse_documents(&crd)
            .unwrap()
            .remove(0),
    )
    .await;
    let databases = kind_api(&c, "db.example.com/v1", "Postgres");
    eventually("Postgres to be served", 60, || async {
        databases.list(&Default::default()).await.is_ok()
    })
    .await;
    let sink = Arc::new(Firing::default());
    let op = support::operator_with_sink(
        &c,
        shipped_and("examples/snapshot-before-upgrade/policy"),
        OperatorConfig::default(),
        Arc::new(Metrics::new()),
        sink.clone(),
    );
    op.start().await.expect("the operator starts");
    let sets = kind_api(&c, "apps/v1", "StatefulSet");
    create(
        &c,
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "orders"},
            "spec": {"replicas": 1, "serviceName": "orders", "selector": {"matchLabels": {"app": "orders"}},
                     "template": {"metadata": {"labels": {"app": "orders"}},
                                  "spec": {"containers": [
                                      {"name": "postgres", "image": "postgres:16.1"},
                                      {"name": "exporter", "image": "registry.k8s.io/pause:3.9"}]}}}
        }),
    )
    .await;
    create(
        &c,
        json!({
            "apiVersion": "db.example.com/v1", "kind": "Postgres",
            "metadata": {"name": "orders"},
            "spec": {"version": "16.1", "statefulSet": "orders", "pvc": "data-orders-0",
                     "volumeSnapshotClassName": "csi-snapclass"}
        }),
    )
    .await;
    eventually("the running version recorded", 60, || async {
        let st = status_of(&databases, "orders").await;
        st["phase"] == "Current" && st["runningVersion"] == "16.1"
    })
    .await;
    let patch_version = |v: &'static str| {
        let databases = databases.clone();
        async move {
            databases
                .patch(
                    "orders",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"version": v}})),
                )
                .await
                .unwrap();
        }
    };
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &snapshot_kind().api_resource());
    patch_version("16.4").await;
    eventually("the snapshot taken first", 60, || async {
        snapshots.get("orders-before-16-4").await.is_ok()
            && status_of(&databases, "orders").await["phase"] == "Snapshotting"
    })
    .await;
    let snap = snapshots.get("orders-before-16-4").await.unwrap();
    assert_eq!(
        snap.data["spec"]["source"]["persistentVolumeClaimName"],
        "data-orders-0"
    );
    assert_eq!(
        policy_label(&serde_json::to_value(&snap).unwrap()),
        "snapshot-before-upgrade"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sts = sets.get("orders").await.unwrap();
    assert_eq!(
        statefulset_image(&sts.data, "postgres"),
        "postgres:16.1",
        "no upgrade before the snapshot is ready"
    );
    // A cluster may have no CSI snapshotter: the test marks it ready.
    snapshots
        .patch_status(
            "orders-before-16-4",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"readyToUse": true}})),
        )
        .await
        .unwrap();
    eventually("the upgrade to 16.4", 60, || async {
        let sts = sets.get("orders").await.unwrap();
        statefulset_image(&sts.data, "postgres") == "postgres:16.4"
            && status_of(&databases, "orders").await["runningVersion"] == "16.4"
    })
    .await;
    let sts = sets.get("orders").await.unwrap();
    assert_eq!(
        statefulset_image(&sts.data, "exporter"),
        "registry.k8s.io/pause:3.9",
        "the other container is untouched"
    );
    // The next upgrade's snapshot fails: the upgrade is withheld and paged.
    patch_version("17.0").await;
    eventually("the second snapshot", 60, || async {
        snapshots.get("orders-before-17-0").await.is_ok()
    })
    .await;
    snapshots
        .patch_status(
            "orders-before-17-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"readyToUse": false,
                "error": {"message": "CSI driver: snapshot quota exceeded"}}})),
        )
        .await
        .unwrap();
    eventually("the upgrade withheld", 60, || async {
        status_of(&databases, "orders").await["phase"] == "UpgradeWithheld"
    })
    .await;
    let paged = sink.named("DatabaseUpgradeWithheld");
    assert_eq!(paged.len(), 1, "{paged:?}");
    assert_eq!(paged[0].0.labels["severity"], "critical");
    let sts = sets.get("orders").await.unwrap();
    assert_eq!(statefulset_image(&sts.data, "postgres"), "postgres:16.4");
    assert!(
        events_for(&c, "orders")
            .await
            .contains(&"UpgradeWithheld".to_string())
    );
    op.shutdown(Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// A schedule in an Evaluator or DatabaseBackup fires at most once a
/// minute: the API server refuses six fields (seconds) at `kubectl
/// apply`, with the field named, and takes five.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_in_seconds_is_refused_at_apply() {
    let c = Cluster::new("wf-seconds").await;
    install_crds(&c).await;
    let evaluators: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        &c.ns,
        &runbook_core::kinds::KindRef::new("runbook.dev/v1alpha1", "Evaluator").api_resource(),
    );
    let ev = |name: &str, schedule: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
            "metadata": {"name": name},
            "spec": {"targetRef": {"name": "chatbot"}, "threshold": 0.85, "schedule": schedule,
                     "benchmark": {"image": "busybox:1.36"}}
        }))
        .unwrap()
    };
    match evaluators
        .create(&PostParams::default(), &ev("every-second", "* * * * * *"))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("spec.schedule"), "{}", s.message);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    evaluators
        .create(&PostParams::default(), &ev("every-minute", "* * * * *"))
        .await
        .unwrap();
    c.cleanup().await;
}

/// An Evaluator judges by a benchmark, a metric or both: one with neither,
/// or a benchmark without a threshold, is refused at `kubectl apply` with
/// the field named; a metric alone needs no threshold of the benchmark's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluator_needs_a_benchmark_or_a_metric() {
    let c = Cluster::new("wf-judge").await;
    install_crds(&c).await;
    let evaluators: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        &c.ns,
        &runbook_core::kinds::KindRef::new("runbook.dev/v1alpha1", "Evaluator").api_resource(),
    );
    let ev = |name: &str, spec: Value| -> DynamicObject {
        let mut spec = spec;
        spec["targetRef"] = json!({"name": "chatbot"});
        serde_json::from_value(json!({
            "apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap()
    };
    let bench = json!({"image": "busybox:1.36"});
    let metric = json!({"query": "avg(model_accuracy)", "threshold": 0.85, "direction": "Above"});
    for (name, spec, says) in [
        (
            "neither",
            json!({"threshold": 0.8}),
            "give a benchmark, a metric, or both",
        ),
        (
            "no-threshold",
            json!({"benchmark": bench}),
            "spec.threshold",
        ),
        (
            "bad-direction",
            json!({"metric": {"query": "m", "threshold": 1, "direction": "Sideways"}}),
            "spec.metric.direction",
        ),
    ] {
        match evaluators
            .create(&PostParams::default(), &ev(name, spec))
            .await
        {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{name}: {s:?}");
                assert!(s.message.contains(says), "{name}: {}", s.message);
            }
            other => panic!("{name}: expected a refusal, got {other:?}"),
        }
    }
    for (name, spec) in [
        ("metric-only", json!({"metric": metric})),
        (
            "both",
            json!({"benchmark": bench, "threshold": 0.8, "metric": metric}),
        ),
    ] {
        evaluators
            .create(&PostParams::default(), &ev(name, spec))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    c.cleanup().await;
}

/// Make `namespace` the kubeconfig's current context's namespace (what
/// `kubectl config set-context --current --namespace` does).
fn in_namespace(kubeconfig: &std::path::Path, namespace: &str) {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let mut config = runbook_core::util::yaml::parse_documents(&text)
        .unwrap()
        .remove(0);
    let current = config["current-context"].as_str().unwrap_or("").to_string();
    for ctx in config["contexts"].as_array_mut().unwrap() {
        if ctx["name"] == current.as_str() {
            ctx["context"]["namespace"] = json!(namespace);
        }
    }
    // JSON is YAML.
    std::fs::write(kubeconfig, config.to_string()).unwrap();
}

/// `runbook explain OBJECT` with no namespace given: what it printed.
async fn explain(kubeconfig: &std::path::Path, object: &str) -> String {
    let (kubeconfig, object) = (kubeconfig.to_path_buf(), object.to_string());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_runbook"))
            .args(["explain", &object])
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("RUNBOOK_EXPLAIN_NAMESPACE")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}
