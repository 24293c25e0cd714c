//! A kubelet stand-in: makes the test's pods "run", on either side.
//!
//! A test says what becomes of the pods whose names start with a prefix:
//! they turn Ready, or their container exits with a code and a termination
//! message. On a real control plane (no kubelet, no scheduler) the stand-in
//! writes pod status as a kubelet would (phase, conditions, containerStatuses
//! with `terminated.exitCode` and `message`) and the real Job, StatefulSet,
//! ReplicaSet and Deployment controllers do the rest. On the sandbox, which
//! runs no controllers, it drives the scenario world instead: it finishes
//! Jobs with the same termination message, creates a StatefulSet's pods as
//! its controller would, and marks pods Ready (the world then reports the
//! StatefulSet's ready replicas and rolls Deployments out). The assertions
//! that follow are the same on both sides.
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use runbook_operator::telemetry::journal::MemoryJournal;
use runbook_simulator::model::{CompleteSpec, PodReadySpec};
use runbook_simulator::world::World;
use serde_json::{Value, json};

use super::cluster::Cluster;

/// What becomes of a pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Fate {
    /// Running, its containers started and Ready.
    Ready,
    /// Its containers exited with this code (0: Succeeded, else Failed)
    /// and this termination message.
    Exit { code: i32, message: Option<String> },
}

/// Decides a pod's fate from the pod (on the sandbox, for a Job, from a pod
/// made of the Job's template); `None` leaves the pod alone.
type Rule = Arc<dyn Fn(&Value) -> Option<Fate> + Send + Sync>;

pub struct Kubelet {
    rules: Arc<Mutex<Vec<(String, Rule)>>>,
    world: Option<(Arc<World>, Vec<tokio::task::JoinHandle<()>>)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
        if let Some((_, tasks)) = &self.world {
            tasks.iter().for_each(|t| t.abort());
        }
    }
}

impl Kubelet {
    /// Start the stand-in for the test's namespace; it acts on no pod until
    /// a rule says what to do with it.
    pub fn start(c: &Cluster) -> Self {
        let rules: Arc<Mutex<Vec<(String, Rule)>>> = Arc::default();
        let world = c.sandbox.clone().map(|s| {
            let w = World::new(s, &c.ns, Arc::new(MemoryJournal::default())).with_kinds();
            let tasks = w.spawn(Vec::new());
            (w, tasks)
        });
        let side = Side {
            client: c.client.clone(),
            ns: c.ns.clone(),
            world: world.as_ref().map(|(w, _)| w.clone()),
            rules: rules.clone(),
            done: Mutex::default(),
        };
        let task = tokio::spawn(async move {
            loop {
                side.pass().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { rules, world, task }
    }

    /// From now on, pods whose name starts with `prefix` meet `fate`. The
    /// first rule added whose prefix matches a pod decides it.
    pub fn run(&self, prefix: &str, fate: impl Fn(&Value) -> Option<Fate> + Send + Sync + 'static) {
        self.rules
            .lock()
            .unwrap()
            .push((prefix.to_string(), Arc::new(fate)));
    }

    /// Pods whose name starts with `prefix` become Ready.
    pub fn ready(&self, prefix: &str) {
        self.run(prefix, |_| Some(Fate::Ready));
    }

    /// Pods whose name starts with `prefix` exit with `code` and `message`.
    pub fn exit(&self, prefix: &str, code: i32, message: Option<&str>) {
        let message = message.map(str::to_string);
        self.run(prefix, move |_| {
            Some(Fate::Exit {
                code,
                message: message.clone(),
            })
        });
    }
}

struct Side {
    client: kube::Client,
    ns: String,
    world: Option<Arc<World>>,
    rules: Arc<Mutex<Vec<(String, Rule)>>>,
    /// Pods (by uid) and sandbox Jobs (by name) already given their fate.
    done: Mutex<HashSet<String>>,
}

impl Side {
    fn fate(&self, name: &str, pod: &Value) -> Option<Fate> {
        let rule = self
            .rules
            .lock()
            .unwrap()
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix.as_str()))
            .map(|(_, r)| r.clone())?;
        rule(pod)
    }

    fn first_time(&self, key: &str) -> bool {
        self.done.lock().unwrap().insert(key.to_string())
    }

    async fn pass(&self) {
        if self.world.is_some() {
            self.sandbox_jobs().await;
            self.sandbox_stateful_sets().await;
        }
        self.pods().await;
    }

    /// Every pod a rule covers gets its status, once.
    async fn pods(&self) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let Ok(list) = pods.list(&Default::default()).await else {
            return;
        };
        for pod in list.items {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let value = serde_json::to_value(&pod).unwrap_or_default();
            let Some(fate) = self.fate(&name, &value) else {
                continue;
            };
            if !self.first_time(&uid) {
                continue;
            }
            let written = match (&self.world, &fate) {
                (Some(w), Fate::Ready) => w
                    .pod_ready(
                        &PodReadySpec {
                            name: Some(name.clone()),
                            namespace: Some(self.ns.clone()),
                            ready: true,
                        },
                        Some(&name),
                    )
                    .await
                    .map(|_| ()),
                _ => pods
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(status(&value, &fate)),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            };
            if written.is_err() {
                // Try again on the next pass.
                self.done.lock().unwrap().remove(&uid);
            }
        }
    }

    /// The sandbox runs no Job controller: a Job whose pod a rule covers
    /// is finished through the world, with the pod's termination message.
    async fn sandbox_jobs(&self) {
        let Some(w) = &self.world else { return };
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.ns);
        let Ok(list) = jobs.list(&Default::default()).await else {
            return;
        };
        for job in list.items {
            let name = job.metadata.name.clone().unwrap_or_default();
            let finished = job
                .status
                .as_ref()
                .is_some_and(|s| s.succeeded.unwrap_or(0) + s.failed.unwrap_or(0) > 0);
            if finished {
                continue;
            }
            let template =
                serde_json::to_value(job.spec.as_ref().map(|s| &s.template)).unwrap_or_default();
            // A Job's pods are named after it: `NAME-<suffix>`.
            let pod_name = format!("{name}-");
            let pod = json!({"metadata": {"name": pod_name}, "spec": template["spec"]});
            let Some(Fate::Exit { code, message }) = self.fate(&pod_name, &pod) else {
                continue;
            };
            let key = format!("job/{}", job.metadata.uid.clone().unwrap_or_default());
            if !self.first_time(&key) {
                continue;
            }
            let spec = CompleteSpec {
                name: Some(name.clone()),
                namespace: Some(self.ns.clone()),
                succeeded: code == 0,
                termination_message: message,
            };
            if w.complete(&spec, Some(&name)).await.is_err() {
                self.done.lock().unwrap().remove(&key);
            }
        }
    }

    /// The sandbox runs no StatefulSet controller: make each set's pods
    /// (`NAME-0` .. `NAME-(replicas-1)`) as it would.
    async fn sandbox_stateful_sets(&self) {
        let Some(w) = &self.world else { return };
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), &self.ns);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let Ok(list) = sets.list(&Default::default()).await else {
            return;
        };
        for set in list.items {
            let name = set.metadata.name.clone().unwrap_or_default();
            let spec = &set.spec;
            let template = serde_json::to_value(&spec.template).unwrap_or_default();
            for i in 0..spec.replicas.unwrap_or(1) {
                let pod_name = format!("{name}-{i}");
                if pods.get_opt(&pod_name).await.ok().flatten().is_some() {
                    continue;
                }
                let _ = w
                    .create(json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod_name, "labels": template["metadata"]["labels"],
                                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                                                          "uid": set.metadata.uid, "controller": true, "blockOwnerDeletion": true}]},
                        "spec": template["spec"],
                    }))
                    .await;
            }
        }
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .to_string()
}

/// The status a kubelet writes for a pod that met `fate`.
fn status(pod: &Value, fate: &Fate) -> Value {
    let now = now();
    let containers = pod["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let statuses = |state: Value, ready: bool| -> Vec<Value> {
        containers
            .iter()
            .map(|c| {
                json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                       "restartCount": 0, "started": ready, "state": state})
            })
            .collect()
    };
    let condition = |t: &str, ok: bool, reason: Option<&str>| {
        let mut c = json!({"type": t, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        c
    };
    match fate {
        Fate::Ready => json!({"status": {
            "phase": "Running", "startTime": now,
            "conditions": [condition("PodScheduled", true, None), condition("Initialized", true, None),
                           condition("ContainersReady", true, None), condition("Ready", true, None)],
            "containerStatuses": statuses(json!({"running": {"startedAt": now}}), true),
        }}),
        Fate::Exit { code, message } => {
            let mut terminated = json!({"exitCode": code, "reason": if *code == 0 { "Completed" } else { "Error" },
                                        "startedAt": now, "finishedAt": now});
            if let Some(m) = message {
                terminated["message"] = json!(m);
            }
            json!({"status": {
                "phase": if *code == 0 { "Succeeded" } else { "Failed" }, "startTime": now,
                "conditions": [condition("PodScheduled", true, None), condition("Initialized", true, None),
                               condition("ContainersReady", false, Some("PodCompleted")),
                               condition("Ready", false, Some("PodCompleted"))],
                "containerStatuses": statuses(json!({"terminated": terminated}), false),
            }})
        }
    }
}
