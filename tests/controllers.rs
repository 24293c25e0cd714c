//! What the cluster's controllers do, as the tests and scenarios rely on
//! it: on a real control plane kube-controller-manager does it (with the
//! kubelet stand-in writing pod status), on the sandbox the scenario world
//! plays it. The same assertions hold on both sides, so the world cannot
//! drift from the controllers it stands in for.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/kubelet.rs"]
mod kubelet;

use std::collections::BTreeMap;

use cluster::{Cluster, eventually};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubelet::Kubelet;
use serde_json::json;

const REVISION: &str = "deployment.kubernetes.io/revision";

fn revision(annotations: &Option<BTreeMap<String, String>>) -> Option<String> {
    annotations.as_ref().and_then(|a| a.get(REVISION)).cloned()
}

fn template(image: &str) -> serde_json::Value {
    json!({"metadata": {"labels": {"app": "web"}},
           "spec": {"containers": [{"name": "app", "image": image}]}})
}

/// The ReplicaSets of the Deployment, by revision, with their images.
async fn revisions(c: &Cluster) -> BTreeMap<String, String> {
    let rsets: Api<ReplicaSet> = c.api();
    rsets
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|rs| {
            let image = rs.spec.template?.spec?.containers[0].image.clone()?;
            Some((revision(&rs.metadata.annotations)?, image))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_new_pod_template_is_a_new_replicaset_revision() {
    let c = Cluster::new("revisions").await;
    let kubelet = Kubelet::start(&c);
    kubelet.ready("web-");
    let deployments: Api<Deployment> = c.api();
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                         "template": template("registry.k8s.io/pause:3.9")}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let set_image = |image: &'static str| {
        let deployments = deployments.clone();
        async move {
            deployments
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"template": template(image)}})),
                )
                .await
                .unwrap();
        }
    };
    let at_revision = |want: &'static str| {
        let deployments = deployments.clone();
        async move {
            eventually(&format!("revision {want}"), 60, || async {
                let d = deployments.get("web").await.unwrap();
                let available = d.status.as_ref().and_then(|s| s.available_replicas) == Some(1);
                revision(&d.metadata.annotations).as_deref() == Some(want) && available
            })
            .await;
        }
    };
    at_revision("1").await;
    set_image("registry.k8s.io/pause:3.10").await;
    at_revision("2").await;
    assert_eq!(
        revisions(&c).await,
        BTreeMap::from([
            ("1".to_string(), "registry.k8s.io/pause:3.9".to_string()),
            ("2".to_string(), "registry.k8s.io/pause:3.10".to_string()),
        ])
    );
    // Going back to an earlier template reuses its ReplicaSet, which
    // becomes the newest revision: what `kubectl rollout undo` relies on.
    set_image("registry.k8s.io/pause:3.9").await;
    at_revision("3").await;
    assert_eq!(
        revisions(&c).await,
        BTreeMap::from([
            ("2".to_string(), "registry.k8s.io/pause:3.10".to_string()),
            ("3".to_string(), "registry.k8s.io/pause:3.9".to_string()),
        ])
    );
    drop(kubelet);
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_reports_its_ready_pods() {
    let c = Cluster::new("statefulset").await;
    let kubelet = Kubelet::start(&c);
    let sets: Api<StatefulSet> = c.api();
    sets.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "db"},
            "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                     "template": {"metadata": {"labels": {"app": "db"}},
                                  "spec": {"containers": [{"name": "db", "image": "registry.k8s.io/pause:3.9"}]}}}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = c.api();
    eventually("the first member", 60, || async {
        pods.get_opt("db-0").await.unwrap().is_some()
    })
    .await;
    let ready = |s: &StatefulSet| {
        s.status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0)
    };
    assert_eq!(ready(&sets.get("db").await.unwrap()), 0);
    kubelet.ready("db-");
    eventually("both members ready", 60, || async {
        let s = sets.get("db").await.unwrap();
        let st = s.status.clone().unwrap_or_default();
        ready(&s) == 2 && st.replicas == 2 && st.available_replicas == Some(2)
    })
    .await;
    drop(kubelet);
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_completes_when_its_pod_exits_and_keeps_the_message() {
    let c = Cluster::new("job").await;
    let kubelet = Kubelet::start(&c);
    kubelet.exit("bench-", 0, Some(r#"{"score": 0.9}"#));
    kubelet.exit("broken-", 1, Some("out of memory"));
    let jobs: Api<Job> = c.api();
    for name in ["bench", "broken"] {
        jobs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"backoffLimit": 0,
                         "template": {"spec": {"restartPolicy": "Never",
                                               "containers": [{"name": "main", "image": "busybox:1.36"}]}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    }
    // The verdict, `Complete` or `Failed`: from v1.31 the Job controller
    // first writes the criterion it met (`SuccessCriteriaMet`,
    // `FailureTarget`), then the verdict, both `True`.
    let condition = |j: &Job| {
        j.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter().find(|c| {
                    c.status == "True" && matches!(c.type_.as_str(), "Complete" | "Failed")
                })
            })
            .map(|c| c.type_.clone())
    };
    eventually("both Jobs finished", 60, || async {
        let done = |n| {
            let jobs = jobs.clone();
            async move { condition(&jobs.get(n).await.unwrap()) }
        };
        done("bench").await.as_deref() == Some("Complete")
            && done("broken").await.as_deref() == Some("Failed")
    })
    .await;
    assert_eq!(
        jobs.get("bench").await.unwrap().status.unwrap().succeeded,
        Some(1)
    );
    // The policies read a run's result from its pod's termination message.
    let pods: Api<Pod> = c.api();
    let messages: BTreeMap<String, String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| {
            let job = p.metadata.labels.as_ref()?.get("job-name")?.clone();
            let status = p.status?.container_statuses?;
            let terminated = status[0].state.as_ref()?.terminated.as_ref()?;
            Some((job, terminated.message.clone()?))
        })
        .collect();
    assert_eq!(
        messages,
        BTreeMap::from([
            ("bench".to_string(), r#"{"score": 0.9}"#.to_string()),
            ("broken".to_string(), "out of memory".to_string()),
        ])
    );
    drop(kubelet);
    c.cleanup().await;
}
