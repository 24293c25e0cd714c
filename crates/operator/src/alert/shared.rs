//! Alerts of replicas sharing the targets (`--shards`), notified once.
//!
//! An aggregation group (say every `WidgetTooBig` of team ml) gathers
//! alerts of targets that different replicas hold, so no replica can
//! notify for it from what it sees alone. Each replica publishes the
//! alerts its own targets raise in a ConfigMap of the operator namespace,
//! `<ring>-alerts-<identity>`. The replica holding the ring's Lease (the
//! assigner) reads them all and alone groups, notifies and keeps the
//! notification log, with the dispatcher a single leader would use. Its
//! successor, after a failover, reads the log and the same ConfigMaps, so
//! nothing notified is notified again.
//!
//! When a target moves, its old replica stops publishing its alerts and
//! its new one starts once it has reconciled it; a gap shorter than the
//! group's interval tells nothing. A replica that is gone keeps its
//! ConfigMap for one more lease duration (the others have taken its
//! targets over by then and publish what they raise); then the assigner
//! deletes it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde::{Deserialize, Serialize};

use super::dispatch::Dispatcher;
use runbook_core::alert::routes::CompiledRoutes;
use runbook_core::alert::sink::{Alert, AlertSink, AlertSource};

/// The label that marks a replica's published alerts, its value the
/// replica's identity.
pub const LABEL: &str = "runbook.dev/alerts-of";
const KEY: &str = "alerts.json";

/// The ConfigMap replica `identity` of ring `ring` publishes its alerts in.
pub fn configmap(ring: &str, identity: &str) -> String {
    format!("{ring}-alerts-{identity}")
}

/// One source's alerts as published.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Published {
    policy: String,
    api_version: String,
    kind: String,
    #[serde(default)]
    namespace: String,
    name: String,
    #[serde(default)]
    uid: String,
    alerts: Vec<PublishedAlert>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PublishedAlert {
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    /// Milliseconds since the epoch.
    starts_at: i64,
}

type Alerts = BTreeMap<AlertSource, Vec<Alert>>;

fn encode(alerts: &Alerts) -> String {
    let list: Vec<Published> = alerts
        .iter()
        .map(|(s, a)| Published {
            policy: s.policy.clone(),
            api_version: s.api_version.clone(),
            kind: s.kind.clone(),
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            uid: s.uid.clone(),
            alerts: a
                .iter()
                .map(|a| PublishedAlert {
                    labels: a.labels.clone(),
                    annotations: a.annotations.clone(),
                    starts_at: a.starts_at.as_millisecond(),
                })
                .collect(),
        })
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

fn decode(text: &str) -> Result<Alerts, serde_json::Error> {
    let list: Vec<Published> = serde_json::from_str(text)?;
    Ok(list
        .into_iter()
        .map(|p| {
            let source = AlertSource {
                policy: p.policy,
                api_version: p.api_version,
                kind: p.kind,
                namespace: p.namespace,
                name: p.name,
                uid: p.uid,
            };
            let alerts = p
                .alerts
                .into_iter()
                .map(|a| Alert {
                    labels: a.labels,
                    annotations: a.annotations,
                    starts_at: Timestamp::from_millisecond(a.starts_at)
                        .unwrap_or(Timestamp::UNIX_EPOCH),
                })
                .collect();
            (source, alerts)
        })
        .collect())
}

/// What this replica's targets raise, and whether the API has it yet.
#[derive(Default)]
struct Own {
    alerts: Alerts,
    dirty: bool,
}

/// The notifying replica's side: its dispatcher and what it was told.
struct Notifier {
    dispatcher: Arc<Dispatcher>,
    flusher: tokio::task::JoinHandle<()>,
    /// Since when each replica that published is no longer live.
    gone_since: HashMap<String, Instant>,
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.flusher.abort();
    }
}

/// Where a replica's ring lives and who it is in it.
pub struct Ring {
    /// The operator namespace.
    pub namespace: String,
    /// The ring's Lease (`--lease-name`).
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

/// The alert sink of a sharded replica.
pub struct SharedAlerts {
    api: Api<ConfigMap>,
    ring: String,
    identity: String,
    duration: Duration,
    make: Box<dyn Fn() -> Arc<Dispatcher> + Send + Sync>,
    own: Mutex<Own>,
    notifier: tokio::sync::Mutex<Option<Notifier>>,
}

impl SharedAlerts {
    /// `make` builds the dispatcher this replica notifies with while it
    /// is the assigner (its notification log kept where a single leader
    /// keeps it).
    pub fn new(
        client: kube::Client,
        ring: &Ring,
        make: impl Fn() -> Arc<Dispatcher> + Send + Sync + 'static,
    ) -> Self {
        Self {
            api: Api::namespaced(client, &ring.namespace),
            ring: ring.name.clone(),
            identity: ring.identity.clone(),
            duration: ring.duration,
            make: Box::new(make),
            own: Mutex::default(),
            notifier: tokio::sync::Mutex::new(None),
        }
    }

    fn own(&self) -> std::sync::MutexGuard<'_, Own> {
        runbook_core::util::lock(&self.own)
    }

    /// Write what this replica's targets raise, if it changed.
    async fn publish(&self) {
        let text = {
            let mut own = self.own();
            if !own.dirty {
                return;
            }
            own.dirty = false;
            encode(&own.alerts)
        };
        let name = configmap(&self.ring, &self.identity);
        let cm = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {
                LABEL: self.identity,
                "app.kubernetes.io/managed-by": "runbook",
            }},
            "data": {KEY: text},
        });
        if let Err(e) = self
            .api
            .patch(
                &name,
                &PatchParams::apply("runbook").force(),
                &Patch::Apply(&cm),
            )
            .await
        {
            self.own().dirty = true;
            tracing::warn!(
                configmap = name,
                "publishing this replica's alerts (trying again): {}",
                crate::util::api_error(&e)
            );
        }
    }

    /// Every live replica's published alerts, by source; the ConfigMaps
    /// of replicas gone for over a lease duration are deleted.
    ///
    /// Served by the API server's watch cache (`resourceVersion=0`): the
    /// operator namespace may hold the children of thousands of targets,
    /// and a list by label from storage reads every ConfigMap in it, about
    /// once a second. A look a moment behind is as good: the next one
    /// follows within a second.
    async fn read_all(
        &self,
        notifier: &mut Notifier,
        live: &BTreeSet<String>,
    ) -> Result<BTreeMap<AlertSource, BTreeMap<String, Alert>>, kube::Error> {
        let list = self
            .api
            .list(&ListParams::default().labels(LABEL).match_any())
            .await?
            .items;
        let now = Instant::now();
        let mut all: BTreeMap<AlertSource, BTreeMap<String, Alert>> = BTreeMap::new();
        for cm in list {
            let name = cm.metadata.name.clone().unwrap_or_default();
            let member = cm
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL))
                .cloned()
                .unwrap_or_default();
            // Another ring's replicas in the same namespace.
            if name != configmap(&self.ring, &member) {
                continue;
            }
            if live.contains(&member) {
                notifier.gone_since.remove(&member);
            } else {
                let since = *notifier.gone_since.entry(member.clone()).or_insert(now);
                if now.duration_since(since) > self.duration {
                    match self.api.delete(&name, &Default::default()).await {
                        Ok(_) => {
                            tracing::info!(
                                configmap = name,
                                "a replica gone for a lease duration: its alerts are the others' now"
                            );
                            notifier.gone_since.remove(&member);
                            continue;
                        }
                        Err(e) => tracing::warn!(
                            configmap = name,
                            "deleting a gone replica's alerts: {}",
                            crate::util::api_error(&e)
                        ),
                    }
                }
            }
            let text = cm
                .data
                .as_ref()
                .and_then(|d| d.get(KEY))
                .map_or("[]", String::as_str);
            match decode(text) {
                Ok(alerts) => {
                    for (source, list) in alerts {
                        let entry = all.entry(source).or_default();
                        for a in list {
                            entry.entry(a.fingerprint()).or_insert(a);
                        }
                    }
                }
                Err(e) => tracing::warn!(
                    configmap = name,
                    "a replica's published alerts do not read (key {KEY}: {e}); skipped"
                ),
            }
        }
        Ok(all)
    }
}

impl AlertSink for SharedAlerts {
    /// On the replica that notifies for all (none elsewhere); a moment
    /// the notifier is being changed, none.
    fn firing(&self) -> std::collections::BTreeMap<String, usize> {
        self.notifier
            .try_lock()
            .ok()
            .and_then(|n| n.as_ref().map(|n| n.dispatcher.firing()))
            .unwrap_or_default()
    }

    fn report(
        &self,
        source: &AlertSource,
        _routes: Option<&Arc<CompiledRoutes>>,
        alerts: Vec<Alert>,
    ) {
        let mut own = self.own();
        let changed = if alerts.is_empty() {
            own.alerts.remove(source).is_some()
        } else {
            let before = own.alerts.insert(source.clone(), alerts.clone());
            before.as_ref() != Some(&alerts)
        };
        own.dirty |= changed;
    }

    fn retain(&self, keep: &dyn Fn(&AlertSource) -> bool) {
        let mut own = self.own();
        let before = own.alerts.len();
        own.alerts.retain(|s, _| keep(s));
        if own.alerts.len() != before {
            own.dirty = true;
        }
    }

    /// What this replica published before it restarted, until its sweep
    /// says which of those targets it no longer holds.
    fn restore(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let name = configmap(&self.ring, &self.identity);
            match self.api.get_opt(&name).await {
                Ok(Some(cm)) => {
                    let text = cm.data.and_then(|mut d| d.remove(KEY)).unwrap_or_default();
                    match decode(&text) {
                        Ok(before) => {
                            let mut own = self.own();
                            for (s, a) in before {
                                own.alerts.entry(s).or_insert(a);
                            }
                        }
                        Err(e) => tracing::warn!(
                            configmap = name,
                            "this replica's published alerts do not read (key {KEY}: {e}); published anew"
                        ),
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    configmap = name,
                    "reading this replica's published alerts: {}",
                    crate::util::api_error(&e)
                ),
            }
        })
    }

    fn gather<'a>(
        &'a self,
        notifying: bool,
        live: &'a BTreeSet<String>,
        routes: &'a (dyn Fn(&str) -> Option<Arc<CompiledRoutes>> + Sync),
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.publish().await;
            let mut slot = self.notifier.lock().await;
            if !notifying {
                // Another replica notifies: this one forgets its groups
                // without telling anything.
                if slot.take().is_some() {
                    tracing::info!("no longer notifying the replicas' alerts");
                }
                return;
            }
            if slot.is_none() {
                let dispatcher = (self.make)();
                // What was notified before, so that nothing is sent twice.
                dispatcher.restore().await;
                let flusher = dispatcher.spawn();
                tracing::info!("notifying the alerts of every replica");
                *slot = Some(Notifier {
                    dispatcher,
                    flusher,
                    gone_since: HashMap::new(),
                });
            }
            let Some(notifier) = slot.as_mut() else {
                return;
            };
            let all = match self.read_all(notifier, live).await {
                Ok(all) => all,
                Err(e) => {
                    tracing::warn!(
                        "reading the replicas' published alerts: {}",
                        crate::util::api_error(&e)
                    );
                    return;
                }
            };
            let d = &notifier.dispatcher;
            // Sources no replica publishes any more have resolved.
            d.retain(&|s| all.contains_key(s));
            for (source, alerts) in all {
                let r = routes(&source.policy);
                d.report(&source, r.as_ref(), alerts.into_values().collect());
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_alerts_read_back_as_they_were() {
        let source = AlertSource {
            policy: "widget-size".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            namespace: "shop".into(),
            name: "big".into(),
            uid: "u-1".into(),
        };
        let alert = Alert {
            labels: [("alertname".to_string(), "WidgetTooBig".to_string())].into(),
            annotations: [("summary".to_string(), "big is too big".to_string())].into(),
            starts_at: Timestamp::from_millisecond(1_700_000_000_123).unwrap(),
        };
        let alerts: Alerts = [(source.clone(), vec![alert.clone()])].into();
        let back = decode(&encode(&alerts)).unwrap();
        assert_eq!(back.get(&source), Some(&vec![alert]));
        // What a person might leave there does not read, and says why.
        assert!(decode("{\"not\": \"a list\"}").is_err());
        assert!(decode("[{\"policy\": \"p\"}]").is_err());
    }
}
