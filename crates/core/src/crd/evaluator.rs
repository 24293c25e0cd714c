//! `Evaluator`: judge a model Deployment on a schedule, by a benchmark's
//! score or a metric it already reports, and roll it back when either
//! fails its threshold.

use std::collections::BTreeMap;

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    DecisionRecord, EnvValue, Resources, ScheduleTimes, conditions_schema, cron_schema,
    decisions_schema,
};

fn default_schedule() -> String {
    "@hourly".to_string()
}

fn default_history_limit() -> u32 {
    10
}

fn default_deadline() -> i64 {
    1800
}

/// Benchmark a Deployment on a schedule; roll it back when its score drops.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "runbook.dev",
    version = "v1alpha1",
    kind = "Evaluator",
    namespaced,
    status = "EvaluatorStatus",
    shortname = "eval",
    category = "runbook",
    derive = "PartialEq",
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.targetRef.name"),
    printcolumn(name = "Threshold", type_ = "number", json_path = ".spec.threshold"),
    printcolumn(name = "Last-Score", type_ = "number", json_path = ".status.lastScore"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.benchmark) || has(self.metric)",
    "reason": "FieldValueRequired",
    "message": "give a benchmark, a metric, or both: what the model is judged by"
}, {
    "rule": "!has(self.benchmark) || has(self.threshold)",
    "fieldPath": ".threshold",
    "reason": "FieldValueRequired",
    "message": "a benchmark's score is judged against spec.threshold: set it"
}]))]
pub struct EvaluatorSpec {
    /// The Deployment whose model is benchmarked and rolled back. Fixed
    /// once set: the scores and the last good revision in status are this
    /// Deployment's, and a rollback of another one by them would be wrong.
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.name == oldSelf.name",
        "message": "targetRef is fixed once set: create another Evaluator for another Deployment"
    }]))]
    pub target_ref: TargetRef,
    /// What to run as the benchmark. Its pod writes the score as its
    /// termination message: `{"score": 0.91}` or a plain number. Only
    /// these fields reach the benchmark's pod: what else it runs with (a
    /// ServiceAccount, say) is the policy's, set by an administrator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<Benchmark>,
    /// Benchmark scores below this roll the Deployment back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub threshold: Option<f64>,
    /// A metric the model already reports, queried from Prometheus at
    /// each scheduled run (and each manual one): a value on the wrong side
    /// of its threshold rolls the Deployment back. With a benchmark too,
    /// either failing rolls back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<EvaluatorMetric>,
    /// When to benchmark.
    #[serde(default = "default_schedule")]
    #[schemars(schema_with = "cron_schema")]
    pub schedule: String,
    /// Labels added to the alerts this Evaluator raises (team, severity overrides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<EvaluatorAlert>,
    /// How many scores to keep in status.
    #[serde(default = "default_history_limit")]
    #[schemars(range(min = 1, max = 100))]
    pub history_limit: u32,
    /// Stop scheduling new benchmark runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// A metric an Evaluator judges by.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvaluatorMetric {
    /// A PromQL query answering one number, of the metrics the policy
    /// allows (`model_*` as shipped), such as
    /// `avg(model_accuracy{deployment="chatbot"})`. Every selector in it
    /// is confined to the Evaluator's namespace.
    #[schemars(length(min = 1, max = 2000))]
    pub query: String,
    /// The value a healthy model stays on the right side of.
    pub threshold: f64,
    /// `Above`: values at or above the threshold pass (accuracy);
    /// `Below`: values at or below it pass (error rate, latency).
    #[serde(default)]
    pub direction: Direction,
}

/// Which side of a metric's threshold passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Direction {
    #[default]
    Above,
    Below,
}

/// The Deployment an Evaluator watches over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// Name of a Deployment in the Evaluator's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The benchmark Job's container: its image, command, arguments,
/// environment and resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Benchmark {
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
    /// A run that takes longer fails and is alerted.
    #[serde(default = "default_deadline")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: i64,
}

/// Labels for the alerts an Evaluator raises.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvaluatorAlert {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// What the Evaluator has seen and done.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvaluatorStatus {
    /// Pending, Running, Healthy, RolledBack, Degraded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_time: Option<String>,
    /// The times of each of a policy's named schedules, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schedules: BTreeMap<String, ScheduleTimes>,
    /// Name of the benchmark Job of the run in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_score: Option<f64>,
    /// The metric's last reading that had a value, and what became of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_metric: Option<MetricSample>,
    /// Newest last, at most `historyLimit` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub score_history: Vec<ScoreSample>,
    /// The newest Deployment revision that passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_revision: Option<i64>,
    /// The last `runbook.dev/run-now` annotation value a run was started for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_manual_run: Option<String>,
    /// A scheduled run that fired while the target Deployment was rolling
    /// out; it starts once the Deployment's controller has observed the
    /// rollout, so its score belongs to the new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback: Option<RollbackRecord>,
    /// Why the last run has no score, or why a low score was not rolled
    /// back (no earlier revision, the rollback limit); cleared by a score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
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

/// One benchmark result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScoreSample {
    pub time: String,
    pub score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

/// One reading of an Evaluator's metric.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricSample {
    /// When it was judged.
    pub time: String,
    /// The value read.
    pub value: f64,
    /// The Deployment revision it was judged on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Whether it passed the threshold.
    pub passed: bool,
}

/// The last rollback the Evaluator made.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollbackRecord {
    pub from_revision: i64,
    pub to_revision: i64,
    pub time: String,
    /// The benchmark score that caused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// The metric value that caused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<f64>,
}
