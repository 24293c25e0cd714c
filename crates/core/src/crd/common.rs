//! Status parts every Runbook kind shares: the decision record and the
//! progress of declarative steps.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An environment variable of a container a custom resource describes:
/// a value, or one key of a Secret or ConfigMap of the resource's
/// namespace (which Runbook reads into a child only for an author who may
/// read it). Nothing else a pod's `env` allows (field and resource
/// references) passes through.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvValue {
    #[schemars(length(min = 1))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvSource>,
}

/// Where an environment variable's value comes from: exactly one key of
/// a Secret or a ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// One key of a Secret or ConfigMap in the resource's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    #[schemars(length(min = 1))]
    pub name: String,
    #[schemars(length(min = 1))]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// CPU, memory and other resources a container asks for and is held to,
/// as quantities (`500m`, `1Gi`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(schema_with = "quantities_schema")]
    pub requests: std::collections::BTreeMap<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(schema_with = "quantities_schema")]
    pub limits: std::collections::BTreeMap<String, serde_json::Value>,
}

/// Schema for a map of resource quantities (a number or a string such as
/// `500m`), as Kubernetes declares them.
pub(crate) fn quantities_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": true
        }
    })
}

/// Schema for a cron expression: five fields or an `@hourly`-style macro,
/// refused by the API server unless Runbook can parse it (see
/// [`crate::schedule::cron_rules`]).
pub(crate) fn cron_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let rules: Vec<serde_json::Value> = crate::schedule::cron_rules()
        .into_iter()
        .map(|(rule, message)| serde_json::json!({"rule": rule, "message": message}))
        .collect();
    schemars::json_schema!({
        "type": "string",
        "pattern": crate::schedule::CRON_PATTERN,
        "maxLength": 128,
        "x-kubernetes-validations": rules,
        "description": "Cron expression (5 fields: minute hour day-of-month month day-of-week; UTC unless a CRON_TZ= prefix names a zone) or one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly."
    })
}

/// Optional cron expression.
pub(crate) fn optional_cron_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    cron_schema(g)
}

/// Schema for standard Kubernetes conditions, kept as a list keyed by type.
pub(crate) fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status"],
            "properties": {
                "type": {"type": "string"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string"},
                "message": {"type": "string"},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "observedGeneration": {"type": "integer", "format": "int64"}
            }
        }
    })
}

/// Schema for the decision records: a list keyed by policy, one record
/// per policy that acts on the object.
/// A map of any fields, kept as written.
pub(crate) fn any_fields_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

pub(crate) fn decisions_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = g.subschema_for::<Vec<DecisionRecord>>();
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["policy"]),
    );
    s
}

/// What one reconcile decided and did: each policy's latest lands in the
/// target's `status.decisions` so `runbook explain` can print it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRecord {
    /// Policy that decided.
    pub policy: String,
    /// Content hash of the policy version that decided.
    pub policy_version: String,
    /// Hash of the inputs the decision saw (target spec and metadata, children).
    pub inputs_hash: String,
    /// When the record last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// `shadow` when the policy only records; absent when it enforces
    /// (records written before this form say `enforce`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Each action and what became of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<ActionRecord>,
    /// Alert routes the decision's alerts matched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alert_routes: Vec<String>,
    /// When rate-limited actions (rollback, delete, patch, apply) were last
    /// taken, by verb, within their limit's window: kept here so limits hold
    /// across operator restarts.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub recent_actions: std::collections::BTreeMap<String, Vec<String>>,
    /// The error that ended the reconcile, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The values of the fields the policy declares in `spec.previous`
    /// at its last decision that concluded, by path (`null`: absent; a
    /// value over 1 KiB of JSON kept as its hash).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(schema_with = "any_fields_schema")]
    pub previous: std::collections::BTreeMap<String, serde_json::Value>,
    /// When a field the policy declares in `spec.previous` last changed,
    /// as the decision that concluded on it saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at: Option<String>,
    /// The metric readings (`spec.metrics`) the decision read, by name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metrics: std::collections::BTreeMap<String, MetricRecord>,
}

/// A metric reading a decision judged by: its value, or why it has none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricRecord {
    /// What was asked: the query, or the web path (at most 512 characters).
    pub query: String,
    /// The value read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// When the value was sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// How many series the answer held (the value is the first's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u32>,
    /// Why there is no value: `NoData`, `Timeout`, `NaN` or `Error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What went wrong, in a sentence (never an address or a credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl DecisionRecord {
    /// The record `policy` left in an object's `status.decisions`, if it
    /// left one that reads as a record (the one place records are parsed).
    pub fn of(object: &serde_json::Value, policy: &str) -> Option<Self> {
        // Every reconcile reads its own record several times: parse only
        // the records that name the policy, not every policy's.
        Self::entries(object)
            .filter(|d| d.get("policy").and_then(serde_json::Value::as_str) == Some(policy))
            .find_map(|d| Self::deserialize(d).ok())
    }

    /// `policy`'s record in an object's status as it is there, unparsed
    /// (the first that names the policy; Runbook keeps one per policy).
    pub fn raw_of<'a>(
        object: &'a serde_json::Value,
        policy: &str,
    ) -> Option<&'a serde_json::Value> {
        Self::entries(object)
            .find(|d| d.get("policy").and_then(serde_json::Value::as_str) == Some(policy))
    }

    /// The records of every policy but `policy`.
    pub fn others(object: &serde_json::Value, policy: &str) -> Vec<Self> {
        Self::entries(object)
            .filter(|d| d.get("policy").and_then(serde_json::Value::as_str) != Some(policy))
            .filter_map(|d| Self::deserialize(d).ok())
            .collect()
    }

    fn entries(object: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
        object
            .get("status")
            .and_then(|s| s.get("decisions"))
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
    }

    /// Every policy's record in an object's `status.decisions`, in their
    /// order there (by policy name).
    pub fn all(object: &serde_json::Value) -> Vec<Self> {
        Self::entries(object)
            .filter_map(|d| Self::deserialize(d).ok())
            .collect()
    }

    /// The record in the form Runbook writes it: an older record's
    /// `mode: enforce` and the targets of its actions on the object
    /// itself (status, condition, event) left out, so that it compares
    /// equal to the same decision recorded now.
    pub fn compact(mut self) -> Self {
        if self.mode.as_deref() == Some("enforce") {
            self.mode = None;
        }
        for a in &mut self.actions {
            if ActionRecord::on_itself(&a.action) {
                a.target = None;
            }
        }
        self
    }

    /// Whether the decision went wrong: an error, or an action refused,
    /// held by a limit, or failed (what `Degraded` reports).
    pub fn has_problem(&self) -> bool {
        self.error.is_some()
            || self.actions.iter().any(|a| {
                matches!(
                    a.result,
                    ActionResult::Refused | ActionResult::Limited | ActionResult::Failed
                )
            })
    }

    /// `decisions` with `self` in place of its policy's record (added in
    /// name order when there is none); others' records are kept as they
    /// are, even those this version cannot read.
    pub fn upsert_into(&self, decisions: Option<&serde_json::Value>) -> serde_json::Value {
        let mut list: Vec<serde_json::Value> = decisions
            .and_then(serde_json::Value::as_array)
            .cloned()
            .unwrap_or_default();
        let me = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        let name = |v: &serde_json::Value| v["policy"].as_str().unwrap_or("").to_string();
        match list.iter().position(|d| name(d) == self.policy) {
            Some(i) => list[i] = me,
            None => {
                let at = list
                    .iter()
                    .position(|d| name(d) > self.policy)
                    .unwrap_or(list.len());
                list.insert(at, me);
            }
        }
        serde_json::Value::Array(list)
    }
}

/// One action of a decision and its outcome.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActionRecord {
    /// apply, delete, patch, status, condition, rollback, alert, event, requeue.
    pub action: String,
    /// `apiVersion Kind namespace/name` of the object acted on; absent
    /// when it is the object the record is on (status, condition, event)
    /// or none (requeue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// What became of it; absent: `ok`.
    #[serde(default, skip_serializing_if = "ActionResult::is_ok")]
    pub result: ActionResult,
    /// Why, when the result is not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ActionRecord {
    /// Whether an action of this verb acts on the object its record is
    /// on (whose target a record therefore leaves out).
    pub fn on_itself(action: &str) -> bool {
        matches!(action, "status" | "condition" | "event")
    }
}

/// What became of an action.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ActionResult {
    /// Carried out, or nothing needed doing.
    #[default]
    Ok,
    /// The policy may not do it (an undeclared kind, another namespace).
    Refused,
    /// Held back by the policy's rate limit.
    Limited,
    /// Decided by a shadow policy: recorded, not carried out.
    Shadow,
    /// Held back while the policy's circuit breaker is open.
    Suspended,
    /// Not tried: an action before it failed.
    Skipped,
    /// Tried, and the API server (or discovery) refused it: the message
    /// says why.
    Failed,
}

impl ActionResult {
    /// Whether it was carried out (a record leaves such a result out).
    pub fn is_ok(&self) -> bool {
        *self == ActionResult::Ok
    }

    /// The name records, metrics and scenarios use.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionResult::Ok => "ok",
            ActionResult::Refused => "refused",
            ActionResult::Limited => "limited",
            ActionResult::Shadow => "shadow",
            ActionResult::Suspended => "suspended",
            ActionResult::Skipped => "skipped",
            ActionResult::Failed => "failed",
        }
    }
}

impl std::fmt::Display for ActionResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// State of one declarative step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StepState {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
}

/// The times of one of a policy's named schedules
/// (`status.schedules.<name>`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleTimes {
    /// The fire time of the schedule's latest run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_time: Option<String>,
    /// Its next fire time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_time: Option<String>,
}

/// Progress of one declarative step, kept in the target's status so a
/// restarted operator resumes where it stopped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepStatus {
    pub name: String,
    pub state: StepState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_policy_reads_its_own_record_and_the_others_apart() {
        let object = json!({"status": {"decisions": [
            {"policy": "backup", "policyVersion": "v1", "inputsHash": "a", "time": "2026-12-01T00:00:00Z",
             "error": "dump failed"},
            {"policy": "drift", "actions": "not a list"},
            {"policy": "drift", "policyVersion": "v2", "inputsHash": "b", "time": "2026-12-01T00:00:00Z"},
            {"not": "a record"}
        ]}});
        let own = DecisionRecord::of(&object, "drift").expect("drift's readable record");
        assert_eq!(own.inputs_hash, "b");
        let others = DecisionRecord::others(&object, "drift");
        assert_eq!(
            others.iter().map(|d| d.policy.as_str()).collect::<Vec<_>>(),
            ["backup"]
        );
        assert!(others[0].has_problem());
        assert!(DecisionRecord::of(&object, "absent").is_none());
        assert_eq!(DecisionRecord::all(&object).len(), 2);
    }
}
