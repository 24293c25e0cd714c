//! Where raised alerts go. Every reconcile reports the complete set of
//! alerts a (policy, target) raises now: an alert that was raised before
//! and is missing now has resolved.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;

use super::routes::CompiledRoutes;
use crate::util::lock;

/// One alert as a policy raised it (labels include policy, kind,
/// namespace and name).
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub starts_at: Timestamp,
}

impl Alert {
    /// A stable identity: the hash of the labels.
    pub fn fingerprint(&self) -> String {
        let mut text = String::new();
        for (k, v) in &self.labels {
            text.push_str(k);
            text.push('\u{0}');
            text.push_str(v);
            text.push('\u{0}');
        }
        format!("{:016x}", crate::util::hash::fnv64(text.as_bytes()))
    }
}

/// The (policy, object) an alert comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AlertSource {
    pub policy: String,
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Takes the alerts each reconcile raises. Must not block.
pub trait AlertSink: Send + Sync {
    /// The complete set of alerts `source` raises now (alerts it raised
    /// before and not now have resolved).
    fn report(
        &self,
        source: &AlertSource,
        routes: Option<&Arc<CompiledRoutes>>,
        alerts: Vec<Alert>,
    );

    /// Resolve the alerts of every source `keep` says is gone (its object
    /// was deleted, or its policy removed).
    fn retain(&self, keep: &dyn Fn(&AlertSource) -> bool);

    /// The alerts firing now, by receiver (`runbook_alerts_firing`): those
    /// this sink notifies, each counted once per receiver it goes to.
    fn firing(&self) -> std::collections::BTreeMap<String, usize> {
        Default::default()
    }

    /// Read back what survives this process (what was last notified),
    /// before any alert is reported: the operator calls it when it becomes
    /// the leader.
    fn restore(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Replicas sharing the targets (`--shards`): called by each replica
    /// at every look at the live members, `notifying` on the one that
    /// notifies for all of them; `routes` finds a policy's alert routes.
    /// A sink that notifies on its own does nothing here.
    fn gather<'a>(
        &'a self,
        _notifying: bool,
        _live: &'a std::collections::BTreeSet<String>,
        _routes: &'a (dyn Fn(&str) -> Option<Arc<CompiledRoutes>> + Sync),
    ) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The alerts each source raises now, by fingerprint: what tells a sink
/// which alerts start firing and which resolve.
#[derive(Default)]
pub struct ActiveAlerts(Mutex<HashMap<AlertSource, BTreeMap<String, Alert>>>);

impl ActiveAlerts {
    /// Record the complete set `source` raises now; the alerts that started
    /// and those that resolved.
    pub fn update(&self, source: &AlertSource, alerts: &[Alert]) -> (Vec<Alert>, Vec<Alert>) {
        let mut active = lock(&self.0);
        let before = active.remove(source).unwrap_or_default();
        let mut now = BTreeMap::new();
        let mut started = Vec::new();
        for a in alerts {
            let fp = a.fingerprint();
            if !before.contains_key(&fp) {
                started.push(a.clone());
            }
            now.insert(fp, a.clone());
        }
        let resolved = before
            .into_iter()
            .filter(|(fp, _)| !now.contains_key(fp))
            .map(|(_, a)| a)
            .collect();
        if !now.is_empty() {
            active.insert(source.clone(), now);
        }
        (started, resolved)
    }

    /// The sources with alerts that `keep` says are gone.
    pub fn gone(&self, keep: &dyn Fn(&AlertSource) -> bool) -> Vec<AlertSource> {
        let active = lock(&self.0);
        active.keys().filter(|s| !keep(s)).cloned().collect()
    }
}

/// Logs each alert when it starts firing and when it resolves.
#[derive(Default)]
pub struct LogSink {
    active: ActiveAlerts,
}

impl AlertSink for LogSink {
    fn report(
        &self,
        source: &AlertSource,
        _routes: Option<&Arc<CompiledRoutes>>,
        alerts: Vec<Alert>,
    ) {
        let (started, resolved) = self.active.update(source, &alerts);
        for a in started {
            tracing::warn!(alert = a.labels.get("alertname").map(String::as_str).unwrap_or(""), labels = ?a.labels, summary = a.annotations.get("summary").map(String::as_str).unwrap_or(""), "alert firing");
        }
        for a in resolved {
            tracing::info!(alert = a.labels.get("alertname").map(String::as_str).unwrap_or(""), labels = ?a.labels, "alert resolved");
        }
    }

    fn retain(&self, keep: &dyn Fn(&AlertSource) -> bool) {
        for s in self.active.gone(keep) {
            self.report(&s, None, Vec::new());
        }
    }
}
