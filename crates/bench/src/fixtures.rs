//! Objects for tests, benchmarks and `runbook bench`: an Evaluator and the
//! Deployment, ReplicaSets, Jobs and Pods around it, as the API server would
//! return them.

use serde_json::{Value, json};

pub const NS: &str = "default";
pub const CREATED: &str = "2026-11-29T10:00:00Z";

/// An Evaluator watching `deployment`, hourly, with a threshold.
pub fn evaluator(name: &str, deployment: &str, threshold: f64) -> Value {
    json!({
        "apiVersion": "runbook.dev/v1alpha1",
        "kind": "Evaluator",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-evaluator-{name}"),
            "generation": 1, "resourceVersion": "10", "creationTimestamp": CREATED,
            "labels": {
                "app": "chatbot",
                "app.kubernetes.io/name": name,
                "app.kubernetes.io/part-of": "assistant",
                "app.kubernetes.io/managed-by": "platform-gitops",
                "environment": "production"
            },
            "annotations": {
                "runbook.dev/owner": "ml-platform@example.com",
                "runbook.dev/runbook-url": "https://runbooks.example.com/ml/chatbot-regression",
                "description": "Hourly regression benchmark of the chatbot model against the held-out suite"
            }
        },
        "spec": {
            "targetRef": {"name": deployment},
            "benchmark": {
                "image": "registry.example.com/ml/bench:1.4",
                "command": ["python", "-m", "bench"],
                "args": ["--suite", "regression", "--samples", "500"],
                "env": [{"name": "BENCH_MODE", "value": "full"}],
                "activeDeadlineSeconds": 1800
            },
            "threshold": threshold,
            "schedule": "@hourly",
            "alert": {"labels": {"team": "ml"}},
            "historyLimit": 10
        }
    })
}

/// A Deployment at `revision`.
pub fn deployment(name: &str, revision: i64) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": revision,
            "resourceVersion": "5", "creationTimestamp": CREATED,
            "annotations": {"deployment.kubernetes.io/revision": revision.to_string()}
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "model", "image": format!("registry.example.com/ml/{name}:v{revision}")}]}
            }
        },
        "status": {"observedGeneration": revision, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}
    })
}

/// A ReplicaSet of `deployment` at `revision`.
pub fn replicaset(deployment: &str, revision: i64) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": format!("{deployment}-rs{revision}"), "namespace": NS, "uid": format!("uid-{deployment}-rs{revision}"),
            "resourceVersion": "6", "creationTimestamp": CREATED,
            "annotations": {"deployment.kubernetes.io/revision": revision.to_string()},
            "labels": {"app": deployment},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment,
                                  "uid": format!("uid-{deployment}"), "controller": true}]
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": deployment}},
            "template": {
                "metadata": {"labels": {"app": deployment}},
                "spec": {"containers": [{"name": "model", "image": format!("registry.example.com/ml/{deployment}:v{revision}")}]}
            }
        }
    })
}

/// A benchmark Job owned by an Evaluator, in a given state.
pub fn job(owner: &Value, name: &str, revision: i64, state: JobState) -> Value {
    let status = match state {
        JobState::Running => json!({"active": 1}),
        JobState::Succeeded => {
            json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
        }
        JobState::Failed => {
            json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]})
        }
    };
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "20",
            "creationTimestamp": CREATED,
            "annotations": {"runbook.dev/revision": revision.to_string()},
            "labels": {"app.kubernetes.io/managed-by": "runbook", "runbook.dev/policy-name": "evaluator-drift"},
            "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                  "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"], "controller": true}]
        },
        "spec": {
            "activeDeadlineSeconds": 1800,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": format!("uid-{name}")}},
            "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": format!("uid-{name}")}},
                          "spec": {"restartPolicy": "Never", "containers": [{"name": "benchmark", "image": "bench"}]}}
        },
        "status": status
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Running,
    Succeeded,
    Failed,
}

/// The finished pod of a Job, with a termination message.
pub fn job_pod(job_name: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{job_name}-pod"), "namespace": NS, "uid": format!("uid-{job_name}-pod"),
            "resourceVersion": "30", "creationTimestamp": CREATED,
            "labels": {"batch.kubernetes.io/controller-uid": format!("uid-{job_name}"), "job-name": job_name}
        },
        "spec": {"restartPolicy": "Never", "containers": [{"name": "benchmark", "image": "bench"}]},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "benchmark", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}}}]
        }
    })
}

/// Merge `patch` into `obj` (JSON merge patch), returning the result.
pub fn with(mut obj: Value, patch: Value) -> Value {
    json_patch::merge(&mut obj, &patch);
    obj
}

/// A DatabaseBackup of StatefulSet `db` and PVC `data-db-0`.
pub fn backup(name: &str) -> Value {
    json!({
        "apiVersion": "runbook.dev/v1alpha1",
        "kind": "DatabaseBackup",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-backup-{name}"),
            "generation": 1, "resourceVersion": "10", "creationTimestamp": CREATED
        },
        "spec": {
            "database": {"statefulSet": "db"},
            "dump": {"image": "postgres:16", "command": ["sh", "-c", "pg_dumpall | gzip > /var/lib/db/backup.sql.gz"]},
            "pvc": "data-db-0",
            "volumeSnapshotClassName": "csi-snapclass",
            "destination": "s3://backups/prod"
        }
    })
}

/// A StatefulSet with `ready` of `replicas` ready, and its pods.
pub fn statefulset(name: &str, replicas: i64, ready: i64) -> Vec<Value> {
    let mut out = vec![json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": 1,
                      "resourceVersion": "3", "creationTimestamp": CREATED},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "serviceName": name,
                  "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "db", "image": "postgres:16"}]}}},
        "status": {"observedGeneration": 1, "replicas": replicas, "readyReplicas": ready}
    })];
    for i in 0..replicas {
        let is_ready = if i < ready { "True" } else { "False" };
        out.push(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": format!("{name}-{i}"), "namespace": NS, "uid": format!("uid-{name}-{i}"),
                          "resourceVersion": "4", "creationTimestamp": CREATED, "labels": {"app": name}},
            "spec": {"containers": [{"name": "db", "image": "postgres:16"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": is_ready}]}
        }));
    }
    out
}

/// A bound PersistentVolumeClaim.
pub fn pvc(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "2", "creationTimestamp": CREATED},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
        "status": {"phase": "Bound"}
    })
}

/// Make `child` the child `policy` made for `owner`: its controller
/// ownerReference and Runbook's labels.
pub fn child_of(mut child: Value, owner: &Value, policy: &str) -> Value {
    child["metadata"]["ownerReferences"] = json!([{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true
    }]);
    let labels = &mut child["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    labels["app.kubernetes.io/managed-by"] = json!("runbook");
    labels["runbook.dev/policy-name"] = json!(policy);
    child
}
