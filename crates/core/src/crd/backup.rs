//! `DatabaseBackup`: dump a database, snapshot its volume, publish the URL,
//! strictly in that order.

use std::collections::BTreeMap;

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    DecisionRecord, EnvValue, Resources, ScheduleTimes, StepStatus, conditions_schema,
    decisions_schema, optional_cron_schema,
};

/// An ordered, resumable database backup.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "runbook.dev",
    version = "v1alpha1",
    kind = "DatabaseBackup",
    namespaced,
    status = "DatabaseBackupStatus",
    shortname = "dbb",
    category = "runbook",
    derive = "PartialEq",
    printcolumn(
        name = "Database",
        type_ = "string",
        json_path = ".spec.database.statefulSet"
    ),
    printcolumn(name = "PVC", type_ = "string", json_path = ".spec.pvc"),
    printcolumn(name = "Step", type_ = "string", json_path = ".status.currentStep"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "URL",
        type_ = "string",
        json_path = ".status.backupURL",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.retention) || has(self.schedule)",
    "fieldPath": ".retention",
    "reason": "FieldValueForbidden",
    "message": "retention counts the runs of a schedule: set a schedule, or remove retention"
}]))]
pub struct DatabaseBackupSpec {
    /// The database to back up.
    pub database: DatabaseRef,
    /// The dump Job's container.
    pub dump: DumpSpec,
    /// The PersistentVolumeClaim to snapshot once the dump succeeded.
    #[schemars(length(min = 1, max = 253))]
    pub pvc: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// URL prefix the backup is published under, for example `s3://backups/db`.
    #[schemars(regex(pattern = r"^[a-z][a-z0-9+.-]*://.+$"))]
    pub destination: String,
    /// Run a new backup at every fire time instead of once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_cron_schema")]
    pub schedule: Option<String>,
    /// With a schedule: how many runs' Jobs and snapshots to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub retention: Option<u32>,
    /// Seconds a step may take before the backup fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub step_timeout_seconds: Option<i64>,
}

/// Which database: a StatefulSet by name, or the pods a selector matches
/// (one of the two).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.statefulSet) != has(self.podSelector)",
    "message": "name the database by statefulSet or by podSelector: exactly one of them"
}]))]
pub struct DatabaseRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub stateful_set: Option<String>,
    /// Labels the database's pods carry (at least one: an empty selector
    /// would match every pod of the namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minProperties" = 1))]
    pub pod_selector: Option<BTreeMap<String, String>>,
}

/// The dump Job's container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DumpSpec {
    #[schemars(length(min = 1))]
    pub image: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

/// Progress of the backup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseBackupStatus {
    /// Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Identifies the run in progress (the fire time for scheduled backups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepStatus>,
    #[serde(default, rename = "backupURL", skip_serializing_if = "Option::is_none")]
    pub backup_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_time: Option<String>,
    /// The times of each of a policy's named schedules, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schedules: BTreeMap<String, ScheduleTimes>,
    /// Completed runs, newest last (scheduled backups).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Each policy's latest decision, keyed by policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "decisions_schema")]
    pub decisions: Vec<DecisionRecord>,
}
