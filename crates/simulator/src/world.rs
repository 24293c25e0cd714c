//! The simulated world around the operator: what the scenario does to the
//! cluster (create, update, complete a Job, make pods ready, fail the API),
//! the standing rules that finish Jobs and snapshots by themselves, and the
//! part of the Deployment controller that keeps ReplicaSet revisions as a
//! real cluster does. Everything goes through the API, like a real client.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::model::{CompleteSpec, PodReadySpec, Rule, SnapshotReadySpec, WorldEvent, glob};
use runbook_core::clock::Clock;
use runbook_core::script::helpers::without_hash;
use runbook_core::util::time;
use runbook_operator::observe::health::WatchBackoff;
use runbook_operator::telemetry::journal::{Entry, Journal, MemoryJournal};
use runbook_sandbox::Sandbox;
use runbook_sandbox::registry::ResourceDef;

/// Kinds the sandbox serves, by kind name.
#[derive(Clone)]
pub struct Kinds {
    defs: Vec<Arc<ResourceDef>>,
}

/// A kind the API serves.
#[derive(Clone, Debug)]
pub struct Served {
    pub resource: ApiResource,
    pub namespaced: bool,
    pub status: bool,
}

impl Kinds {
    pub fn of(sandbox: &Sandbox) -> Self {
        Self {
            defs: sandbox.store().defs(),
        }
    }

    /// The served kind whose name is nearest `kind` (a typo's fix).
    pub fn nearest(&self, kind: &str) -> Option<&str> {
        runbook_core::util::suggest::closest(kind, self.defs.iter().map(|d| d.kind.as_str()))
    }

    /// Whether a resource of this plural (as in the API's paths) is served.
    pub fn serves_plural(&self, plural: &str) -> bool {
        self.defs.iter().any(|d| d.plural == plural)
    }

    /// The plural meant by `name`: a kind's of that name (in any case),
    /// else the nearest served plural.
    pub fn plural_for(&self, name: &str) -> Option<&str> {
        self.defs
            .iter()
            .find(|d| d.kind.eq_ignore_ascii_case(name))
            .map(|d| d.plural.as_str())
            .or_else(|| {
                runbook_core::util::suggest::closest(
                    name,
                    self.defs.iter().map(|d| d.plural.as_str()),
                )
            })
    }

    /// The kind by name (and apiVersion, when given). Core kinds win over
    /// same-named kinds of other groups, as kubectl resolves them.
    pub fn find(&self, api_version: Option<&str>, kind: &str) -> Option<Served> {
        let mut found: Vec<&Arc<ResourceDef>> = self
            .defs
            .iter()
            .filter(|d| d.kind == kind)
            .filter(|d| {
                api_version.is_none_or(|av| {
                    let (g, v) = av.split_once('/').unwrap_or(("", av));
                    d.group == g && d.versions.iter().any(|x| x == v)
                })
            })
            .collect();
        found.sort_by_key(|d| (!d.group.is_empty(), d.group.clone()));
        let d = found.first()?;
        let version = match api_version {
            Some(av) => av.rsplit('/').next().unwrap_or(av).to_string(),
            None => d.versions.first().cloned().unwrap_or_default(),
        };
        Some(Served {
            resource: ApiResource {
                group: d.group.clone(),
                version: version.clone(),
                api_version: if d.group.is_empty() {
                    version
                } else {
                    format!("{}/{version}", d.group)
                },
                kind: d.kind.clone(),
                plural: d.plural.clone(),
            },
            namespaced: d.namespaced,
            status: d.status_subresource,
        })
    }
}

/// The world: the cluster as the scenario sees it.
pub struct World {
    pub client: kube::Client,
    pub sandbox: Sandbox,
    pub kinds: Kinds,
    pub namespace: String,
    pub journal: Arc<MemoryJournal>,
    pub clock: Clock,
    /// Objects rules have already acted on (by uid).
    seen: Mutex<HashSet<String>>,
}

use runbook_operator::util::api_error;

/// Who writes the scenario's objects, as the authorship webhook records
/// them: an administrator, so the operator may do for them whatever the
/// policies say.
pub const AUTHOR: &str = "scenario-admin";

fn ns_or<'a>(given: Option<&'a str>, default: &'a str) -> &'a str {
    given.unwrap_or(default)
}

impl World {
    /// The world acts as its own user (an administrator), so that what it
    /// writes has an author apart from the operator.
    pub fn new(sandbox: Sandbox, namespace: &str, journal: Arc<MemoryJournal>) -> Arc<Self> {
        Arc::new(Self {
            client: sandbox.client_as(AUTHOR, &[runbook_sandbox::auth::MASTERS]),
            kinds: Kinds::of(&sandbox),
            clock: sandbox.clock().clone(),
            sandbox,
            namespace: namespace.to_string(),
            journal,
            seen: Mutex::new(HashSet::new()),
        })
    }

    /// Refresh the kinds (after CRDs were created).
    pub fn with_kinds(self: &Arc<Self>) -> Arc<Self> {
        Arc::new(Self {
            client: self.client.clone(),
            sandbox: self.sandbox.clone(),
            kinds: Kinds::of(&self.sandbox),
            namespace: self.namespace.clone(),
            journal: self.journal.clone(),
            clock: self.clock.clone(),
            seen: Mutex::new(HashSet::new()),
        })
    }

    pub fn note(&self, detail: String, obj: Option<(&ApiResource, &str, &str)>) {
        self.record(detail, obj, false);
    }

    /// A note of what the world's controllers did in reaction.
    fn reacted(&self, detail: String, obj: Option<(&ApiResource, &str, &str)>) {
        self.record(detail, obj, true);
    }

    fn record(&self, detail: String, obj: Option<(&ApiResource, &str, &str)>, reaction: bool) {
        let mut e = Entry::new(self.clock.now(), "world", "ok").detail(detail);
        if reaction {
            e = e.fields(json!({"reaction": true}));
        }
        if let Some((r, ns, name)) = obj {
            e = e.object(&r.api_version, &r.kind, ns, name);
        }
        self.journal.record(e);
    }

    pub fn served(&self, api_version: Option<&str>, kind: &str) -> Result<Served, String> {
        self.kinds
            .find(api_version, kind)
            .ok_or_else(|| format!("the API server does not serve kind {kind}"))
    }

    /// The API of a served kind, in `ns` where it is namespaced.
    pub fn api(&self, s: &Served, ns: &str) -> Api<DynamicObject> {
        if s.namespaced {
            Api::namespaced_with(self.client.clone(), ns, &s.resource)
        } else {
            Api::all_with(self.client.clone(), &s.resource)
        }
    }

    /// Create an object (then its status, as a controller would have set
    /// it). Owner references that give a name but no uid get the uid of
    /// the named object.
    pub async fn create(&self, mut obj: Value) -> Result<(), String> {
        let api_version = obj["apiVersion"].as_str().unwrap_or("").to_string();
        let kind = obj["kind"].as_str().unwrap_or("").to_string();
        let s = self.served(Some(&api_version), &kind)?;
        let ns = if s.namespaced {
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or(&self.namespace)
                .to_string()
        } else {
            String::new()
        };
        if s.namespaced {
            obj["metadata"]["namespace"] = json!(ns);
        }
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        if let Some(refs) = obj["metadata"]["ownerReferences"].as_array_mut() {
            for r in refs {
                if r.get("uid").is_some() {
                    continue;
                }
                let owner =
                    self.served(r["apiVersion"].as_str(), r["kind"].as_str().unwrap_or(""))?;
                let o = self
                    .api(&owner, &ns)
                    .get(r["name"].as_str().unwrap_or(""))
                    .await
                    .map_err(|e| format!("owner of {kind} {name}: {}", api_error(&e)))?;
                r["uid"] = json!(o.metadata.uid);
                if r.get("apiVersion").is_none() {
                    r["apiVersion"] = json!(owner.resource.api_version);
                }
            }
        }
        if kind == "RunbookState" {
            self.find_state_target(&mut obj, &ns).await?;
        }
        let status = obj.as_object_mut().and_then(|m| m.remove("status"));
        let dynamic: DynamicObject =
            serde_json::from_value(obj).map_err(|e| format!("{kind} {name}: {e}"))?;
        let api = self.api(&s, &ns);
        api.create(&PostParams::default(), &dynamic)
            .await
            .map_err(|e| format!("create {kind} {ns}/{name}: {}", api_error(&e)))?;
        if let Some(st) = status.filter(|s| !s.is_null()) {
            let body = json!({"status": st});
            let r = if s.status {
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
            } else {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
            };
            r.map_err(|e| format!("status of {kind} {ns}/{name}: {}", api_error(&e)))?;
        }
        Ok(())
    }

    /// A captured `RunbookState` names its target without a uid (the
    /// scenario's target has a new one): the target's, found by name.
    async fn find_state_target(&self, state: &mut Value, ns: &str) -> Result<(), String> {
        let Some(t) = state.pointer_mut("/spec/target") else {
            return Ok(());
        };
        if t["uid"].as_str().is_some_and(|u| !u.is_empty()) {
            return Ok(());
        }
        let text = |k: &str| t[k].as_str().unwrap_or("").to_string();
        let (name, kind) = (text("name"), text("kind"));
        let s = self.served(Some(&text("apiVersion")), &kind)?;
        let target_ns = if s.namespaced { ns } else { "" };
        let found = self
            .api(&s, target_ns)
            .get_opt(&name)
            .await
            .map_err(|e| format!("target of RunbookState: {kind} {name}: {}", api_error(&e)))?;
        if let Some(o) = found {
            t["uid"] = json!(o.metadata.uid);
        }
        Ok(())
    }

    pub async fn update(
        &self,
        api_version: Option<&str>,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
        status: bool,
    ) -> Result<(), String> {
        let s = self.served(api_version, kind)?;
        let ns = ns_or(ns, &self.namespace);
        let api = self.api(&s, ns);
        for name in self.names(&s, ns, kind, name, "update").await? {
            let name = name.as_str();
            let r = if status && s.status {
                api.patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": patch})),
                )
                .await
            } else if status {
                api.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": patch})),
                )
                .await
            } else {
                api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
            };
            r.map_err(|e| format!("update {kind} {ns}/{name}: {}", api_error(&e)))?;
        }
        Ok(())
    }

    /// The names a world event means: the one given, or every object of
    /// the kind whose name matches it as a glob (`*`, `?`), at least one.
    async fn names(
        &self,
        s: &Served,
        ns: &str,
        kind: &str,
        name: &str,
        verb: &str,
    ) -> Result<Vec<String>, String> {
        if !name.contains(['*', '?']) {
            return Ok(vec![name.to_string()]);
        }
        let names: Vec<String> = self
            .matching(s, ns, name)
            .await?
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect();
        if names.is_empty() {
            return Err(format!("{verb} {kind} {ns}/{name}: no object matches"));
        }
        Ok(names)
    }

    pub async fn delete(
        &self,
        api_version: Option<&str>,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<(), String> {
        let s = self.served(api_version, kind)?;
        let ns = ns_or(ns, &self.namespace);
        for name in self.names(&s, ns, kind, name, "delete").await? {
            self.api(&s, ns)
                .delete(&name, &Default::default())
                .await
                .map_err(|e| format!("delete {kind} {ns}/{name}: {}", api_error(&e)))?;
        }
        Ok(())
    }

    /// Objects of a kind in a namespace whose names match a glob, by name.
    async fn matching(
        &self,
        s: &Served,
        ns: &str,
        pattern: &str,
    ) -> Result<Vec<DynamicObject>, String> {
        // One name (a rule acting on the object it claimed): read alone,
        // not picked from a list of the namespace, which grows with the
        // scenario (a day over a thousand targets lists thousands of
        // Jobs per Job finished).
        if !pattern.contains(['*', '?']) {
            let found = self
                .api(s, ns)
                .get_opt(pattern)
                .await
                .map_err(|e| format!("get {} {pattern}: {}", s.resource.kind, api_error(&e)))?;
            return Ok(found.into_iter().collect());
        }
        let mut items = self
            .api(s, ns)
            .list(&Default::default())
            .await
            .map_err(|e| format!("list {}: {}", s.resource.kind, api_error(&e)))?
            .items;
        items.retain(|o| glob(pattern, o.metadata.name.as_deref().unwrap_or("")));
        items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(items)
    }

    /// Finish Jobs: their pod terminates (with the message), the Job is
    /// Complete or Failed. Jobs already finished are left alone.
    pub async fn complete(&self, spec: &CompleteSpec, only: Option<&str>) -> Result<usize, String> {
        let jobs = self.served(Some("batch/v1"), "Job")?;
        let ns = ns_or(spec.namespace.as_deref(), &self.namespace).to_string();
        let pattern = only.or(spec.name.as_deref()).unwrap_or("*");
        let mut done = 0;
        for job in self.matching(&jobs, &ns, pattern).await? {
            let st = &job.data["status"];
            if st["succeeded"].as_i64().unwrap_or(0) > 0 || st["failed"].as_i64().unwrap_or(0) > 0 {
                continue;
            }
            self.finish_job(&job, &ns, spec).await?;
            done += 1;
        }
        if done == 0 && only.is_none() {
            return Err(format!(
                "complete: no unfinished Job matches {pattern:?} in {ns}"
            ));
        }
        Ok(done)
    }

    async fn finish_job(
        &self,
        job: &DynamicObject,
        ns: &str,
        spec: &CompleteSpec,
    ) -> Result<(), String> {
        let name = job.metadata.name.clone().unwrap_or_default();
        let now = time::format(self.clock.now());
        let pods = self.served(Some("v1"), "Pod")?;
        let (pod_name, pod) = job_pod(job, ns, spec, &now);
        if self
            .api(&pods, ns)
            .get_opt(&pod_name)
            .await
            .ok()
            .flatten()
            .is_none()
        {
            self.create(pod).await?;
        }
        // As the Job controller of v1.33 writes it: the criterion met
        // (`SuccessCriteriaMet`, `FailureTarget`) beside the verdict
        // (`Complete`, `Failed`), each with its reason and message.
        let condition = |type_: &str, reason: &str, message: &str| {
            json!({"type": type_, "status": "True", "reason": reason, "message": message,
                   "lastProbeTime": now, "lastTransitionTime": now})
        };
        let status = if spec.succeeded {
            let m = "Reached expected number of succeeded pods";
            json!({"active": 0, "ready": 0, "terminating": 0, "succeeded": 1,
                   "startTime": now, "completionTime": now, "uncountedTerminatedPods": {},
                   "conditions": [condition("SuccessCriteriaMet", "CompletionsReached", m),
                                  condition("Complete", "CompletionsReached", m)]})
        } else {
            let m = "Job has reached the specified backoff limit";
            json!({"active": 0, "ready": 0, "terminating": 0, "failed": 1,
                   "startTime": now, "uncountedTerminatedPods": {},
                   "conditions": [condition("FailureTarget", "BackoffLimitExceeded", m),
                                  condition("Failed", "BackoffLimitExceeded", m)]})
        };
        let jobs = self.served(Some("batch/v1"), "Job")?;
        self.update(Some("batch/v1"), "Job", Some(ns), &name, &status, true)
            .await?;
        let how = if spec.succeeded {
            "succeeded"
        } else {
            "failed"
        };
        let msg = spec
            .termination_message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        self.note(format!("Job {how}{msg}"), Some((&jobs.resource, ns, &name)));
        Ok(())
    }

    pub async fn pod_ready(
        &self,
        spec: &PodReadySpec,
        only: Option<&str>,
    ) -> Result<usize, String> {
        let pods = self.served(Some("v1"), "Pod")?;
        let ns = ns_or(spec.namespace.as_deref(), &self.namespace).to_string();
        let pattern = only.or(spec.name.as_deref()).unwrap_or("*");
        let found = self.matching(&pods, &ns, pattern).await?;
        if found.is_empty() && only.is_none() {
            return Err(format!("podReady: no Pod matches {pattern:?} in {ns}"));
        }
        let now = time::format(self.clock.now());
        let ready = if spec.ready { "True" } else { "False" };
        for p in &found {
            let name = p.metadata.name.clone().unwrap_or_default();
            let status = json!({"phase": "Running", "conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now}]});
            self.update(Some("v1"), "Pod", Some(&ns), &name, &status, true)
                .await?;
            self.note(
                format!("Pod {}", if spec.ready { "ready" } else { "not ready" }),
                Some((&pods.resource, &ns, &name)),
            );
        }
        self.count_ready_replicas(&ns).await?;
        Ok(found.len())
    }

    /// What the StatefulSet controller reports: how many of the pods its
    /// selector matches are Ready.
    async fn count_ready_replicas(&self, ns: &str) -> Result<(), String> {
        let (Ok(sets), Ok(pods)) = (
            self.served(Some("apps/v1"), "StatefulSet"),
            self.served(Some("v1"), "Pod"),
        ) else {
            return Ok(());
        };
        let pods = self.matching(&pods, ns, "*").await?;
        for set in self.matching(&sets, ns, "*").await? {
            let Some(want) = set.data["spec"]["selector"]["matchLabels"].as_object() else {
                continue;
            };
            let selected: Vec<&DynamicObject> = pods
                .iter()
                .filter(|p| {
                    let labels = p.metadata.labels.clone().unwrap_or_default();
                    want.iter()
                        .all(|(k, v)| v.as_str() == labels.get(k).map(String::as_str))
                })
                .collect();
            let replicas = selected.len() as i64;
            let ready = selected
                .iter()
                .filter(|p| {
                    runbook_core::script::helpers::is_ready(
                        &serde_json::to_value(p).unwrap_or_default(),
                    )
                })
                .count() as i64;
            let st = &set.data["status"];
            if st["readyReplicas"].as_i64().unwrap_or(0) == ready
                && st["replicas"].as_i64().unwrap_or(0) == replicas
            {
                continue;
            }
            let name = set.metadata.name.clone().unwrap_or_default();
            // The counts as a StatefulSet controller reports them: the pods it
            // has, and of those the Ready ones (the API refuses more ready
            // replicas than replicas).
            let status = json!({"replicas": replicas, "currentReplicas": replicas,
                                "updatedReplicas": replicas, "readyReplicas": ready,
                                "availableReplicas": ready,
                                "observedGeneration": set.metadata.generation});
            self.update(
                Some("apps/v1"),
                "StatefulSet",
                Some(ns),
                &name,
                &status,
                true,
            )
            .await?;
            self.reacted(
                format!("{ready} replicas ready"),
                Some((&sets.resource, ns, &name)),
            );
        }
        Ok(())
    }

    pub async fn snapshot_ready(
        &self,
        spec: &SnapshotReadySpec,
        only: Option<&str>,
    ) -> Result<usize, String> {
        let snaps = self.served(None, "VolumeSnapshot")?;
        let ns = ns_or(spec.namespace.as_deref(), &self.namespace).to_string();
        let pattern = only.or(spec.name.as_deref()).unwrap_or("*");
        let found = self.matching(&snaps, &ns, pattern).await?;
        if found.is_empty() && only.is_none() {
            return Err(format!(
                "snapshotReady: no VolumeSnapshot matches {pattern:?} in {ns}"
            ));
        }
        let now = time::format(self.clock.now());
        for s in &found {
            let name = s.metadata.name.clone().unwrap_or_default();
            let status = json!({"readyToUse": true, "creationTime": now,
                                "restoreSize": spec.restore_size.clone().unwrap_or_else(|| "10Gi".into()),
                                "boundVolumeSnapshotContentName": format!("snapcontent-{}", runbook_core::util::hash::short_hex(name.as_bytes(), 8))});
            self.update(None, "VolumeSnapshot", Some(&ns), &name, &status, true)
                .await?;
            self.note(
                "VolumeSnapshot readyToUse".into(),
                Some((&snaps.resource, &ns, &name)),
            );
        }
        Ok(found.len())
    }

    /// Run the standing rules and the Deployment controller until dropped.
    pub fn spawn(self: &Arc<Self>, rules: Vec<Rule>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Ok(deps) = self.served(Some("apps/v1"), "Deployment") {
            let w = self.clone();
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &deps.resource);
            tasks.push(tokio::spawn(async move {
                let mut stream = watched(api);
                while let Some(ev) = stream.next().await {
                    if let Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = ev
                        && let Err(e) = w.rollout(&d).await
                    {
                        w.note(format!("the Deployment controller failed: {e}"), None);
                    }
                }
            }));
        }
        // One watch per kind; the first matching rule claims an object.
        let mut by_kind: Vec<(Served, Vec<Rule>)> = Vec::new();
        for rule in rules {
            let Ok(s) = self.served(rule.api_version.as_deref(), &rule.kind) else {
                continue;
            };
            let same = |k: &Served| {
                k.resource.api_version == s.resource.api_version
                    && k.resource.kind == s.resource.kind
            };
            match by_kind.iter_mut().find(|(k, _)| same(k)) {
                Some((_, rs)) => rs.push(rule),
                None => by_kind.push((s, vec![rule])),
            }
        }
        for (s, rules) in by_kind {
            let w = self.clone();
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &s.resource);
            tasks.push(tokio::spawn(async move {
                let mut stream = watched(api);
                while let Some(ev) = stream.next().await {
                    if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = ev {
                        w.claim(&rules, &o);
                    }
                }
            }));
        }
        tasks
    }

    /// The first rule matching an object claims it (once per object): what
    /// it says happens after its delay.
    fn claim(self: &Arc<Self>, rules: &[Rule], o: &DynamicObject) {
        let name = o.metadata.name.clone().unwrap_or_default();
        let uid = o.metadata.uid.clone().unwrap_or_default();
        let value = serde_json::to_value(o).unwrap_or_default();
        let Some(rule) = rules.iter().find(|r| r.matches(&name, &value)) else {
            return;
        };
        if !runbook_core::util::lock(&self.seen).insert(uid) {
            return;
        }
        let Some(event) = rule.does.clone() else {
            return;
        };
        let (w, kind, after) = (self.clone(), rule.kind.clone(), rule.after_ms);
        let ns = o.metadata.namespace.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after as u64)).await;
            if let Err(e) = w.on_objects(&event, Some((ns, &name))).await {
                w.note(format!("rule on {kind} {name} failed: {e}"), None);
            }
        });
    }

    /// A world event on objects (finish Jobs, make pods or snapshots
    /// ready), from a step or a rule. A rule acts on the object it claimed
    /// (`claimed`: its namespace and name) instead of the event's
    /// namespace and name glob. How many objects it changed.
    pub async fn on_objects(
        &self,
        event: &WorldEvent,
        claimed: Option<(Option<String>, &str)>,
    ) -> Result<usize, String> {
        let only = claimed.as_ref().map(|(_, name)| *name);
        let ns = |own: &Option<String>| match &claimed {
            Some((ns, _)) => ns.clone(),
            None => own.clone(),
        };
        match event {
            WorldEvent::Complete(c) => {
                let c = CompleteSpec {
                    namespace: ns(&c.namespace),
                    ..c.clone()
                };
                self.complete(&c, only).await
            }
            WorldEvent::SnapshotReady(s) => {
                let s = SnapshotReadySpec {
                    namespace: ns(&s.namespace),
                    ..s.clone()
                };
                self.snapshot_ready(&s, only).await
            }
            WorldEvent::PodReady(p) => {
                let p = PodReadySpec {
                    namespace: ns(&p.namespace),
                    ..p.clone()
                };
                self.pod_ready(&p, only).await
            }
            other => Err(format!("{} is not an event on objects", other.name())),
        }
    }

    /// What the Deployment controller does with revisions: the ReplicaSet
    /// whose template is the Deployment's becomes the newest revision
    /// (created if none matches), and the Deployment carries its number.
    async fn rollout(&self, d: &DynamicObject) -> Result<(), String> {
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let name = d.metadata.name.clone().unwrap_or_default();
        let deps = self.served(Some("apps/v1"), "Deployment")?;
        let revision = self.revision_for(d).await?;
        let have = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REVISION))
            .cloned();
        if have.as_deref() != Some(revision.to_string().as_str()) {
            let patch = json!({"metadata": {"annotations": {REVISION: revision.to_string()}}});
            self.api(&deps, &ns)
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map_err(|e| api_error(&e))?;
            let what = format!("rolled out revision {revision}");
            self.reacted(what, Some((&deps.resource, &ns, &name)));
        }
        // Every rollout completes at once with all replicas available,
        // unless the scenario sets the Deployment's status itself after
        // this generation was observed.
        let generation = d.metadata.generation.unwrap_or(0);
        if d.data["status"]["observedGeneration"].as_i64() != Some(generation) {
            let replicas = d.data["spec"]["replicas"].as_i64().unwrap_or(1);
            let status = json!({"observedGeneration": generation, "replicas": replicas,
                                "updatedReplicas": replicas, "readyReplicas": replicas,
                                "availableReplicas": replicas,
                                "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]});
            let (av, ns) = (Some("apps/v1"), Some(ns.as_str()));
            self.update(av, "Deployment", ns, &name, &status, true)
                .await?;
        }
        Ok(())
    }

    /// The revision of a Deployment's template: the ReplicaSet with that
    /// template, renumbered as the newest when it is an older one, or made
    /// when there is none.
    async fn revision_for(&self, d: &DynamicObject) -> Result<i64, String> {
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let rss = self.served(Some("apps/v1"), "ReplicaSet")?;
        let template = without_hash(&d.data["spec"]["template"]);
        let api = self.api(&rss, &ns);
        let listed = api
            .list(&Default::default())
            .await
            .map_err(|e| api_error(&e))?;
        let owned: Vec<DynamicObject> = listed
            .items
            .into_iter()
            .filter(|r| {
                r.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
            })
            .collect();
        let rev = |o: &DynamicObject| {
            o.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REVISION))
                .and_then(|r| r.parse::<i64>().ok())
                .unwrap_or(0)
        };
        let max = owned.iter().map(rev).max().unwrap_or(0);
        let current = owned
            .iter()
            .find(|r| without_hash(&r.data["spec"]["template"]) == template);
        Ok(match current {
            Some(r) if rev(r) == max && max > 0 => max,
            Some(r) => {
                let rs_name = r.metadata.name.clone().unwrap_or_default();
                let patch = json!({"metadata": {"annotations": {REVISION: (max + 1).to_string()}}});
                api.patch(&rs_name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map_err(|e| api_error(&e))?;
                max + 1
            }
            None => {
                self.create(replica_set(d, &template, max + 1)).await?;
                max + 1
            }
        })
    }
}

/// The ReplicaSet a Deployment's controller makes for a new template.
fn replica_set(d: &DynamicObject, template: &Value, revision: i64) -> Value {
    let ns = d.metadata.namespace.clone().unwrap_or_default();
    let name = d.metadata.name.clone().unwrap_or_default();
    let hash = runbook_core::util::hash::json_hash(template, 10);
    let mut t = template.clone();
    t["metadata"]["labels"]["pod-template-hash"] = json!(hash);
    let mut selector = d.data["spec"]["selector"].clone();
    if selector["matchLabels"].is_object() {
        selector["matchLabels"]["pod-template-hash"] = json!(hash);
    }
    json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": format!("{name}-{hash}"), "namespace": ns,
                     "labels": t["metadata"]["labels"],
                     "annotations": {REVISION: revision.to_string()},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                          "uid": d.metadata.uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"replicas": d.data["spec"]["replicas"].as_i64().unwrap_or(1),
                 "selector": selector, "template": t},
    })
}

/// The pod a finished Job leaves: its template's containers, terminated
/// with the Job's exit code and termination message.
fn job_pod(job: &DynamicObject, ns: &str, spec: &CompleteSpec, now: &str) -> (String, Value) {
    let name = job.metadata.name.clone().unwrap_or_default();
    let pod_name = format!(
        "{name}-{}",
        &runbook_core::util::hash::short_hex(name.as_bytes(), 5)
    );
    let template = &job.data["spec"]["template"];
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["job-name"] = json!(name);
    let containers: Vec<Value> = template["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![json!({"name": "main", "image": "busybox"})]);
    let (exit, reason, phase) = if spec.succeeded {
        (0, "Completed", "Succeeded")
    } else {
        (1, "Error", "Failed")
    };
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            let mut term =
                json!({"exitCode": exit, "reason": reason, "startedAt": now, "finishedAt": now});
            if let Some(m) = &spec.termination_message {
                term["message"] = json!(m);
            }
            json!({"name": c["name"], "image": c["image"], "ready": false, "restartCount": 0,
                   "state": {"terminated": term}})
        })
        .collect();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                          "uid": job.metadata.uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"restartPolicy": "Never", "containers": containers},
        "status": {"phase": phase, "containerStatuses": statuses},
    });
    (pod_name, pod)
}

const REVISION: &str = "deployment.kubernetes.io/revision";

/// A watch of every object of `api` that waits between failed attempts. A
/// watch that retries at once never yields when its client is gone (at a
/// runtime's shutdown, the sandbox's buffer answers at once), and a task
/// that never yields holds the runtime's shutdown forever.
fn watched(
    api: Api<DynamicObject>,
) -> futures::stream::BoxStream<'static, Result<watcher::Event<DynamicObject>, watcher::Error>> {
    // Open a day at a time: the clock jumps, and a watch remade every
    // 290 s would be remade 2,000 times in a simulated week.
    watcher(api, watcher::Config::default().timeout(86_400))
        .backoff(WatchBackoff::default())
        .boxed()
}
