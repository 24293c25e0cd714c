//! `RunbookState`: what Runbook remembers of one target whose schema is
//! not Runbook's (a built-in kind, a third-party CRD). Decision records,
//! schedule times, step progress, limit history and Runbook's own
//! `Degraded` condition live here, in a schema Runbook owns, instead of in
//! a status the target's kind would prune. One object per target at most,
//! in the target's namespace, owner-referenced to it (collected with it);
//! `kubectl get runbookstates` lists each target's last decision.
//!
//! Runbook's own kinds (Evaluator, DatabaseBackup, AIModel) declare these
//! fields in their status and keep them there: one status write per
//! decision, as before.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    DecisionRecord, ScheduleTimes, StepStatus, conditions_schema, decisions_schema,
};

/// What Runbook keeps of one target.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "runbook.dev",
    version = "v1alpha1",
    kind = "RunbookState",
    namespaced,
    status = "RunbookStateStatus",
    shortname = "rbstate",
    category = "runbook",
    derive = "PartialEq",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.target.kind"),
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.target.name"),
    printcolumn(name = "Policy", type_ = "string", json_path = ".status.last.policy"),
    printcolumn(name = "Result", type_ = "string", json_path = ".status.last.result"),
    printcolumn(name = "Decided", type_ = "date", json_path = ".status.last.time"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RunbookStateSpec {
    /// The target this state is of.
    pub target: StateTarget,
}

/// A target, as its state names it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateTarget {
    pub api_version: String,
    pub kind: String,
    /// Empty for a cluster-scoped target (its state is in the namespace
    /// Runbook keeps such states in).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The newest decision recorded, for `kubectl get`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastDecision {
    pub policy: String,
    /// `ok`, or the failure or refusal that ended it.
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
}

/// What Runbook remembers of the target, written as a whole state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunbookStateStatus {
    /// Each policy's latest decision, keyed by policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "decisions_schema")]
    pub decisions: Vec<DecisionRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<LastDecision>,
    /// The run due last and the next one, of a scheduled policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_time: Option<String>,
    /// The times of each of a policy's named schedules, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schedules: BTreeMap<String, ScheduleTimes>,
    /// Progress of a policy's declarative steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepStatus>,
    /// Runbook's own condition (`Degraded`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    /// The policies' own status fields of a built-in kind's target, whose
    /// status keeps only its own fields: kept here, and seen by decisions
    /// in the target's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::common::any_fields_schema")]
    pub fields: Option<serde_json::Map<String, serde_json::Value>>,
    /// The target's generation the last decision saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CRD as installed: the state is written whole with the object, so
/// it has no status subresource (one write creates or changes it).
pub fn crd() -> CustomResourceDefinition {
    let mut crd = RunbookState::crd();
    for v in &mut crd.spec.versions {
        v.subresources = None;
    }
    crd
}

/// The name of a target's state: its kind, its group and its name
/// (`statefulset.apps.db`, `configmap.settings`); where that is not a
/// valid name (too long, or a target name such as `system:admin`), as
/// much of it as fits with the characters a name allows, and a digest of
/// the whole.
pub fn name_for(group: &str, kind: &str, name: &str) -> String {
    let full = if group.is_empty() {
        format!("{}.{name}", kind.to_ascii_lowercase())
    } else {
        format!("{}.{group}.{name}", kind.to_ascii_lowercase())
    };
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-';
    if full.len() <= 253
        && full.chars().all(allowed)
        && full.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return full;
    }
    let digest = crate::util::hash::short_hex(full.as_bytes(), 12);
    let kept: String = full
        .chars()
        .map(|c| if allowed(c) { c } else { '-' })
        .take(253 - digest.len() - 1)
        .collect();
    format!("{}.{digest}", kept.trim_end_matches(['.', '-']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_states_name_is_its_targets_kind_group_and_name_within_bounds() {
        assert_eq!(name_for("apps", "StatefulSet", "db"), "statefulset.apps.db");
        assert_eq!(name_for("", "ConfigMap", "settings"), "configmap.settings");
        let long = "x".repeat(250);
        let n = name_for("example.com", "Widget", &long);
        assert!(n.len() <= 253, "{}", n.len());
        assert_ne!(n, name_for("example.com", "Widget", &format!("{long}y")));
        let odd = name_for("rbac.authorization.k8s.io", "ClusterRole", "system:admin");
        assert!(
            odd.starts_with("clusterrole.rbac.authorization.k8s.io.system-admin."),
            "{odd}"
        );
        for n in [n, odd] {
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-'),
                "{n}"
            );
        }
    }

    #[test]
    fn the_state_crd_has_no_status_subresource() {
        let c = crd();
        assert_eq!(c.spec.names.kind, "RunbookState");
        assert!(c.spec.versions.iter().all(|v| v.subresources.is_none()));
    }
}
