//! The notification log: what each aggregation group last told each
//! integration of its receiver (when, which alerts firing, which
//! resolved), as Alertmanager keeps it. It outlives the process: the leader
//! writes it to a ConfigMap after each notification and a new leader (after
//! a restart or a failover) reads it before it reconciles anything, so an
//! alert that is still firing is not sent again before its repeat interval.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::{Deserialize, Serialize};

/// The ConfigMap the operator keeps its notification log in.
pub const CONFIGMAP: &str = "runbook-notifications";
const KEY: &str = "log.json";

/// What one notification said.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SentRecord {
    /// When, in milliseconds since the epoch.
    pub at: i64,
    pub firing: Vec<String>,
    pub resolved: Vec<String>,
}

/// By aggregation group, by integration of its receiver.
pub type NotificationLog = BTreeMap<String, BTreeMap<usize, SentRecord>>;

/// Why the log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The API server did not answer, or refused.
    #[error("{}", crate::util::api_error(.0))]
    Api(#[source] kube::Error),
    /// What the ConfigMap holds is not a notification log.
    #[error("ConfigMap {CONFIGMAP} key {KEY}: {0}")]
    Unreadable(#[source] serde_json::Error),
    /// The log could not be written as JSON.
    #[error("the notification log as JSON: {0}")]
    Unwritable(#[source] serde_json::Error),
}

/// Where the log is kept.
pub trait LogStore: Send + Sync {
    fn load(&self) -> BoxFuture<'_, Result<NotificationLog, LogError>>;
    fn save(&self, log: NotificationLog) -> BoxFuture<'_, Result<(), LogError>>;
}

/// The log in a ConfigMap of the operator's namespace, written with
/// server-side apply (created on first use).
pub struct ConfigMapLog {
    api: Api<ConfigMap>,
}

impl ConfigMapLog {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
        }
    }
}

impl LogStore for ConfigMapLog {
    fn load(&self) -> BoxFuture<'_, Result<NotificationLog, LogError>> {
        Box::pin(async move {
            let cm = self.api.get_opt(CONFIGMAP).await.map_err(LogError::Api)?;
            let Some(text) = cm.and_then(|c| c.data).and_then(|mut d| d.remove(KEY)) else {
                return Ok(NotificationLog::new());
            };
            serde_json::from_str(&text).map_err(LogError::Unreadable)
        })
    }

    fn save(&self, log: NotificationLog) -> BoxFuture<'_, Result<(), LogError>> {
        Box::pin(async move {
            let text = serde_json::to_string(&log).map_err(LogError::Unwritable)?;
            let cm = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": CONFIGMAP, "labels": {"app.kubernetes.io/managed-by": "runbook"}},
                "data": {KEY: text},
            });
            self.api
                .patch(
                    CONFIGMAP,
                    &PatchParams::apply("runbook").force(),
                    &Patch::Apply(&cm),
                )
                .await
                .map(|_| ())
                .map_err(LogError::Api)
        })
    }
}
