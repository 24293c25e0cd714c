//! Policies set aside for a kind the API server does not serve come back
//! by themselves: discovery is looked at again on each change of a
//! CustomResourceDefinition (and every 30 s while a policy waits, should
//! CRDs not be watchable), and the set last offered is swapped in again
//! when what it would keep changes. A kind that goes sets its policies
//! aside again the same way. While a policy waits, the leader marks each
//! of its targets (of a kind that is served) `Degraded`, reason
//! `PolicyWaitingForKind`; its first decision once in force clears it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;
use kube::core::DynamicObject;
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::context::SetAside;
use super::operator::{Operator, REDISCOVER_EVERY};
use runbook_core::kinds::KindRef;
use runbook_core::policy::CompiledPolicy;
use runbook_core::script::action::{Condition, ConditionStatus};

/// The reason of the `Degraded` condition on the targets of a policy set
/// aside for a kind not served.
pub const WAITING_REASON: &str = "PolicyWaitingForKind";

/// Events of CRDs come in bursts (a chart installs several): one look at
/// discovery after the burst.
const SETTLE: Duration = Duration::from_millis(300);

/// The kinds a CRD that changed (or went) defines: to be asked about
/// again.
type CrdChange = Vec<KindRef>;

fn kinds_of(crd: &CustomResourceDefinition) -> Vec<KindRef> {
    let group = &crd.spec.group;
    crd.spec
        .versions
        .iter()
        .map(|v| KindRef::new(format!("{group}/{}", v.name), crd.spec.names.kind.clone()))
        .collect()
}

/// Feed each change of a CRD to `tx` until the receiver goes. An
/// operator that may not watch CRDs says so once and relies on the
/// periodic look.
async fn watch_crds(
    client: kube::Client,
    tx: tokio::sync::mpsc::Sender<CrdChange>,
    timeout_secs: u32,
) {
    use kube::runtime::WatchStreamExt;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut told = false;
    let mut events = watcher(api, watcher::Config::default().timeout(timeout_secs))
        .default_backoff()
        .boxed();
    tracing::debug!("watching CustomResourceDefinitions");
    while let Some(ev) = events.next().await {
        tracing::trace!(?ev, "a CRD event");
        let change = match ev {
            Ok(watcher::Event::Apply(crd))
            | Ok(watcher::Event::InitApply(crd))
            | Ok(watcher::Event::Delete(crd)) => {
                tracing::debug!(crd = ?crd.metadata.name, "a CustomResourceDefinition changed");
                kinds_of(&crd)
            }
            Ok(_) => continue,
            Err(e) => {
                if !told {
                    told = true;
                    tracing::warn!(
                        "watching CustomResourceDefinitions: {e}; a policy set aside for a kind not served is looked at again every {} s instead",
                        REDISCOVER_EVERY.as_secs()
                    );
                }
                continue;
            }
        };
        if tx.send(change).await.is_err() {
            return;
        }
    }
}

/// Resolves on the next change of `rx`; never once its sender is gone.
async fn changed<T>(rx: &mut tokio::sync::watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Operator {
    /// Bring set-aside policies back when their kinds are served, and set
    /// policies aside when their kinds go, until the operator stops.
    pub async fn watch_kinds(self: Arc<Self>) {
        let (tx, mut changes) = tokio::sync::mpsc::channel(64);
        let watching = tokio::spawn(watch_crds(
            self.ctx.client.clone(),
            tx,
            self.ctx.config.watch_timeout_secs,
        ));
        let mut waiting = self.ctx.health.set_aside.subscribe();
        let mut leading = self.leading();
        let mut stop = self.ctx.stop.clone();
        let mut every = tokio::time::interval(REDISCOVER_EVERY);
        every.tick().await;
        // What the targets were last marked for.
        let mut marked = SetAside::new();
        loop {
            let look = tokio::select! {
                Some(first) = changes.recv() => {
                    let mut burst = vec![first];
                    let settle = tokio::time::sleep(SETTLE);
                    tokio::pin!(settle);
                    loop {
                        tokio::select! {
                            Some(c) = changes.recv() => burst.push(c),
                            _ = &mut settle => break,
                        }
                    }
                    self.take_in(&burst)
                }
                _ = every.tick() => {
                    // Targets made since are marked too.
                    marked.clear();
                    !self.ctx.health.set_aside.borrow().is_empty()
                }
                // Without an elector, leading is settled once and for all:
                // its sender is gone, and nothing changes there any more.
                _ = changed(&mut waiting) => false,
                _ = changed(&mut leading) => false,
                // (The guard it answers with is not held across the awaits.)
                _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            };
            if look {
                self.rediscover().await;
            }
            if self.is_leading() {
                self.mark_waiting(&mut marked).await;
            } else {
                marked.clear();
            }
        }
        watching.abort();
    }

    /// Forget what discovery said of the kinds a burst of CRD changes
    /// concerns that policies name; whether to look at discovery again
    /// (a policy waits, or a kind in use changed).
    fn take_in(&self, burst: &[CrdChange]) -> bool {
        let set = self.ctx.policies.load_full();
        let in_use: Vec<&KindRef> = set
            .policies
            .values()
            .flat_map(|p| p.kinds.kinds())
            .collect();
        let mut look = !self.ctx.health.set_aside.borrow().is_empty();
        for c in burst {
            for k in c {
                if in_use.contains(&k) {
                    self.ctx.resources.forget(k);
                    look = true;
                }
            }
        }
        look
    }

    /// Check the set last offered against discovery again, and swap it in
    /// when what it would keep is not what runs.
    pub async fn rediscover(&self) {
        let offered = self.offered.lock().await;
        tracing::debug!("looking at discovery again");
        let running = self.ctx.policies.load_full();
        let kept = match self.dry_check_kinds(&offered).await {
            Ok(kept) => kept,
            Err(e) => {
                tracing::warn!("looking at discovery again: {e}");
                return;
            }
        };
        let same = kept.policies.len() == running.policies.len()
            && kept
                .policies
                .keys()
                .all(|k| running.policies.contains_key(k));
        if same {
            return;
        }
        tracing::info!(
            before = running.policies.len(),
            now = kept.policies.len(),
            "the kinds served changed: policies in force again or set aside"
        );
        let set = offered.clone();
        self.swap_in(set).await;
    }

    /// Mark the targets of each policy newly set aside (or set aside for
    /// other kinds than last marked).
    async fn mark_waiting(&self, marked: &mut SetAside) {
        let now = self.ctx.health.set_aside.borrow().clone();
        if now == *marked {
            return;
        }
        let offered = self.offered.lock().await.clone();
        for (id, kinds) in &now {
            if marked.get(id) == Some(kinds) {
                continue;
            }
            if let Some(p) = offered.policies.get(id) {
                self.mark_targets(p, kinds).await;
            }
        }
        *marked = now;
    }

    /// `Degraded=True`, reason `PolicyWaitingForKind`, on each target of
    /// `p` (whose kind is served and whose status is not Kubernetes'),
    /// written as the policy acts.
    async fn mark_targets(&self, p: &CompiledPolicy, absent: &[KindRef]) {
        let kind = &p.target;
        if absent.contains(kind) || runbook_core::kinds::built_in(kind) {
            return;
        }
        let Ok(resolved) = self.ctx.resources.resolve(kind).await else {
            return;
        };
        let namespace = p.tenant.clone().or_else(|| {
            resolved
                .namespaced
                .then(|| self.ctx.config.namespace.clone())
                .flatten()
        });
        let acting = self.ctx.acting_for(p);
        let client = acting.as_ref().map_or(&self.ctx.client, |a| &a.client);
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) if resolved.namespaced => {
                Api::namespaced_with(client.clone(), ns, &resolved.resource)
            }
            _ => Api::all_with(client.clone(), &resolved.resource),
        };
        let listed = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(policy = %p.id, "listing the targets of a policy set aside: {e}");
                return;
            }
        };
        let names: Vec<String> = absent.iter().map(|k| k.to_string()).collect();
        let message = format!(
            "policy {} is set aside: the API server does not serve {}; install the CustomResourceDefinition that defines it, and the policy loads within seconds",
            p.id,
            names.join(", ")
        );
        let condition = Condition {
            type_: "Degraded".into(),
            status: ConditionStatus::True,
            reason: WAITING_REASON.into(),
            message,
        };
        let now = runbook_core::util::time::format(self.ctx.clock.now());
        let writer = self.ctx.writer_as(acting.as_deref());
        for obj in listed.items {
            let value = match serde_json::to_value(&obj) {
                Ok(v) => v,
                Err(_) => continue,
            };
            let ns = obj.metadata.namespace.clone().unwrap_or_default();
            if !p.selects(&value) || !p.acts_in(&ns) {
                continue;
            }
            let Some(name) = obj.metadata.name.clone() else {
                continue;
            };
            let mut status = value.get("status").cloned().unwrap_or(json!({}));
            if !status.is_object() {
                status = json!({});
            }
            let already =
                runbook_core::plan::status::condition(&status, "Degraded").is_some_and(|c| {
                    c["status"] == "True"
                        && c["reason"] == WAITING_REASON
                        && c["message"] == condition.message.as_str()
                });
            if already {
                continue;
            }
            let generation = obj.metadata.generation;
            runbook_core::plan::status::set_condition(&mut status, &condition, generation, &now);
            if runbook_core::plan::status::follows_kstatus(&value) {
                runbook_core::plan::status::set_kstatus(&mut status, generation, &now);
            }
            let patch =
                json!({"conditions": status.get("conditions").cloned().unwrap_or(Value::Null)});
            if let Err(e) = writer.status(&resolved, &ns, &name, &patch).await {
                tracing::debug!(policy = %p.id, target = %name, "marking a target of a policy set aside: {e}");
            }
        }
    }
}
