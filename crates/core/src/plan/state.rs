//! Where Runbook's own state of a target lives, and the two pure steps
//! that keep one code path for every target. Runbook's own kinds declare
//! its fields in their status, and a kind whose status schema keeps any
//! field (`x-kubernetes-preserve-unknown-fields`) keeps them too: there the
//! state stays in the status, one write per decision. A built-in kind, or
//! one whose status schema lists only its own fields (found when a write's
//! answer lacks what was written), has it in a `RunbookState` of its own
//! (see `crd::state`). Decisions
//! see the target with that state laid over its status (`overlay`), and
//! the status a decision concludes is split back into what goes to the
//! target's own status and what goes to its `RunbookState` (`split`).

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::kinds::KindRef;
use crate::policy::claim::RUNBOOK_CONDITION;

/// Status fields that are Runbook's bookkeeping, not the target's: the
/// decision records and the schedules' times.
pub const STATE_FIELDS: &[&str] = &["decisions", "lastRunTime", "nextRunTime", "schedules"];

/// The progress of a policy's declarative steps, Runbook's too for a
/// policy with steps (a script's `phase` is the policy's own field).
pub const STEP_FIELDS: &[&str] = &["run", "phase", "currentStep", "steps"];

pub use crate::kinds::{built_in, owns_schema};

/// What a policy's status claim declares that a status schema (`status`,
/// the `status` property of a kind's schema; null: none) would drop:
/// each declared field it does not list, and the first condition if it
/// lists no `conditions`, with where the claim declares it. A schema that
/// keeps any field drops nothing; Runbook's own fields are kept apart.
pub fn unlisted(
    status: &Value,
    claim: &crate::policy::claim::StatusClaim,
) -> Vec<(String, Option<crate::util::yaml::Pos>)> {
    if !claim.declared || status["x-kubernetes-preserve-unknown-fields"] == true {
        return Vec::new();
    }
    let listed = |f: &str| status["properties"].get(f).is_some();
    let mut out: Vec<(String, Option<crate::util::yaml::Pos>)> = claim
        .fields
        .iter()
        .filter(|(f, _)| !STATE_FIELDS.contains(&f.as_str()) && !listed(f))
        .map(|(f, pos)| (f.clone(), *pos))
        .collect();
    if !listed("conditions")
        && let Some((_, pos)) = claim.conditions.iter().next()
    {
        out.push(("conditions".into(), *pos));
    }
    out
}

/// What `unlisted` finds, said at each place for the policy's author:
/// the field the schema lacks, what becomes of it, and the field it lists
/// that the author may have meant.
pub fn unlisted_notes(
    kind: &str,
    status: &Value,
    claim: &crate::policy::claim::StatusClaim,
) -> Vec<(Option<crate::util::yaml::Pos>, String)> {
    let listed: Vec<&str> = status["properties"]
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    unlisted(status, claim)
        .into_iter()
        .map(|(what, pos)| {
            let message = if what == "conditions" {
                format!(
                    "spec.status.conditions: {kind}'s status schema has no `conditions`, so the API server would drop the conditions the policy sets; add conditions to the CRD's status properties"
                )
            } else {
                let hint = crate::util::suggest::closest(&what, listed.iter().copied())
                    .map(|m| format!(" (did you mean {m:?}?)"))
                    .unwrap_or_default();
                format!(
                    "spec.status.fields: {kind}'s status schema has no field {what:?}{hint}, so the API server would drop what the policy writes there; add it to the CRD's status properties"
                )
            };
            (pos, message)
        })
        .collect()
}

/// The `RunbookState` of a target whose schema is not Runbook's.
#[derive(Clone, Debug)]
pub struct Apart {
    /// Where the state object is (or is to be made).
    pub namespace: String,
    pub name: String,
    /// The state object as last seen or written; `None` before the first.
    pub state: Option<Arc<Value>>,
    /// The target as the API server holds it (its own status only).
    pub target: Arc<Value>,
}

/// An object's shard label, where it has one.
fn shard_of(o: &Value) -> Option<&str> {
    o.pointer("/metadata/labels")
        .and_then(|l| l.get(crate::shard::SHARD_LABEL))
        .and_then(Value::as_str)
}

impl Apart {
    fn state_status(&self) -> Option<&Value> {
        self.state.as_deref().and_then(|s| s.get("status"))
    }

    /// Whether the state object exists and carries another shard label
    /// than its target (the target moved to another replica, running
    /// sharded): it is written again, so that it follows its target into
    /// the new replica's cache.
    pub fn moved(&self) -> bool {
        self.state
            .as_deref()
            .is_some_and(|s| shard_of(s) != shard_of(&self.target))
    }

    /// The target as decisions see it.
    pub fn overlaid(&self) -> Value {
        overlay(&self.target, self.state_status())
    }
}

fn conditions(status: &Value) -> Vec<Value> {
    status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn is_runbooks(c: &Value) -> bool {
    c.get("type").and_then(Value::as_str) == Some(RUNBOOK_CONDITION)
}

/// `target` with `state` (a `RunbookState`'s status) laid over its status:
/// Runbook's fields and its condition as the state has them. Before a
/// target has a state, what an earlier release wrote into its status is
/// seen as it is, so it is carried over by the first write.
pub fn overlay(target: &Value, state: Option<&Value>) -> Value {
    let Some(state) = state.and_then(Value::as_object) else {
        return target.clone();
    };
    let mut out = target.clone();
    if !out.get("status").is_some_and(Value::is_object) {
        out["status"] = json!({});
    }
    let Some(status) = out["status"].as_object_mut() else {
        return out;
    };
    // The policies' own fields a built-in kind's status cannot keep.
    if let Some(fields) = state.get(FIELDS).and_then(Value::as_object) {
        for (k, v) in fields {
            status.insert(k.clone(), v.clone());
        }
    }
    for k in STATE_FIELDS.iter().chain(STEP_FIELDS) {
        if let Some(v) = state.get(*k) {
            status.insert(k.to_string(), v.clone());
        }
    }
    // Runbook's generation of a target that keeps none of its own.
    if let Some(g) = state.get("observedGeneration")
        && !status.contains_key("observedGeneration")
    {
        status.insert("observedGeneration".into(), g.clone());
    }
    let own: Vec<Value> = conditions(&Value::Object(status.clone()))
        .into_iter()
        .filter(|c| !is_runbooks(c))
        .collect();
    let runbooks: Vec<Value> = conditions(&Value::Object(state.clone()))
        .into_iter()
        .filter(is_runbooks)
        .collect();
    if !runbooks.is_empty() || status.contains_key("conditions") {
        let mut all = own;
        all.extend(runbooks);
        status.insert("conditions".into(), Value::Array(all));
    }
    out
}

/// Where a `RunbookState` keeps the policies' own status fields of a
/// built-in kind's target.
pub const FIELDS: &str = "fields";

/// What decides which fields are Runbook's when a status is split.
#[derive(Clone, Copy, Debug, Default)]
pub struct Keeping {
    /// The policy has declarative steps, whose progress is Runbook's.
    pub steps: bool,
    /// The target's kind is built in: its status keeps none of a
    /// policy's fields.
    pub built_in: bool,
}

/// A concluded status split in two: the target's own status (`own`,
/// changed as the decision changed it, Runbook's fields and condition
/// left out), and Runbook's state of it (`state`, changed likewise).
/// `seen` is the status the decision saw (the overlay), to tell what the
/// decision removed; `keeping` says whether step progress is Runbook's,
/// and whether a policy's fields are kept in the state's `fields`
/// instead (a built-in kind's status keeps none: a Pod's `announced`).
pub fn split(
    own: &Value,
    state: &Value,
    seen: &Value,
    concluded: &Value,
    keeping: Keeping,
) -> (Value, Value) {
    let Keeping { steps, built_in } = keeping;
    let empty = Map::new();
    let concluded_map = concluded.as_object().unwrap_or(&empty);
    let seen_map = seen.as_object().unwrap_or(&empty);
    let fields: Vec<&str> = STATE_FIELDS
        .iter()
        .chain(if steps { STEP_FIELDS } else { &[] })
        .copied()
        .chain(["observedGeneration"])
        .collect();
    let runbooks = |k: &str| fields.contains(&k);
    let mut target = own.as_object().cloned().unwrap_or_default();
    let mut apart = state
        .get(FIELDS)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (k, v) in concluded_map {
        if runbooks(k) || k == "conditions" {
            continue;
        }
        if seen_map.get(k) != Some(v) {
            // A built-in kind's own field (one its status has) stays
            // there; a policy's goes to the state.
            if built_in && (apart.contains_key(k) || own.get(k).is_none()) {
                if v.is_null() {
                    apart.remove(k);
                } else {
                    apart.insert(k.clone(), v.clone());
                }
            } else {
                target.insert(k.clone(), v.clone());
            }
        }
    }
    for k in seen_map.keys() {
        if !runbooks(k)
            && k != "conditions"
            && !concluded_map.contains_key(k)
            && apart.remove(k).is_none()
        {
            target.remove(k);
        }
    }
    // What an earlier release wrote there is carried over to the state.
    target.remove("decisions");
    let mut theirs: Vec<Value> = conditions(concluded)
        .into_iter()
        .filter(|c| !is_runbooks(c))
        .collect();
    // A condition of the target's own named like Runbook's stays its own.
    theirs.extend(conditions(own).into_iter().filter(is_runbooks));
    if !theirs.is_empty() || target.contains_key("conditions") {
        target.insert("conditions".into(), Value::Array(theirs));
    }
    let mut kept = state.as_object().cloned().unwrap_or_default();
    if apart.is_empty() {
        kept.remove(FIELDS);
    } else {
        kept.insert(FIELDS.into(), Value::Object(apart));
    }
    for k in &fields {
        match concluded_map.get(*k).filter(|v| !v.is_null()) {
            Some(v) => kept.insert(k.to_string(), v.clone()),
            None => kept.remove(*k),
        };
    }
    let mine: Vec<Value> = conditions(concluded)
        .into_iter()
        .filter(is_runbooks)
        .collect();
    if mine.is_empty() {
        kept.remove("conditions");
    } else {
        kept.insert("conditions".into(), Value::Array(mine));
    }
    match last_decision(kept.get("decisions")) {
        Some(last) => kept.insert("last".into(), last),
        None => kept.remove("last"),
    };
    (Value::Object(target), Value::Object(kept))
}

/// The newest record of `decisions`, as `kubectl get` shows it.
fn last_decision(decisions: Option<&Value>) -> Option<Value> {
    let newest = decisions?
        .as_array()?
        .iter()
        .max_by_key(|d| d.get("time").and_then(Value::as_str).unwrap_or(""))?;
    let text = |k: &str| newest.get(k).and_then(Value::as_str).unwrap_or("");
    let result = if newest.get("error").is_some_and(|e| !e.is_null()) {
        "failed".to_string()
    } else {
        newest
            .get("actions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| a.get("result").and_then(Value::as_str))
            .find(|r| *r != "ok")
            .unwrap_or("ok")
            .to_string()
    };
    let mut last = json!({"policy": text("policy"), "result": result});
    if let Some(t) = newest.get("time").filter(|t| t.is_string()) {
        last["time"] = t.clone();
    }
    Some(last)
}

/// The label of a sweep's `RunbookState`: its policy's name.
pub const SWEEP_LABEL: &str = "runbook.dev/sweep";

/// A new `RunbookState` for `target` holding `status`.
pub fn new_state(apart: &Apart, status: &Value) -> Value {
    let t = &apart.target;
    let text = |p: &str| t.pointer(p).and_then(Value::as_str).unwrap_or("");
    let kind = KindRef::new(text("/apiVersion"), text("/kind"));
    // Sharded, it carries its target's shard label, as children do: each
    // replica caches only the states of its share.
    let mut labels = json!({crate::observe::MANAGED_BY: "runbook"});
    if let Some(shard) = shard_of(t) {
        labels[crate::shard::SHARD_LABEL] = json!(shard);
    }
    // A sweep's record has no object to be collected with: it names its
    // policy, and stays until removed with it.
    let owners = if crate::kinds::is_sweep(&kind) {
        labels[SWEEP_LABEL] = json!(crate::observe::policy_label_value(text("/metadata/name")));
        json!([])
    } else {
        json!([{
            "apiVersion": kind.api_version, "kind": kind.kind,
            "name": text("/metadata/name"), "uid": text("/metadata/uid"),
        }])
    };
    json!({
        "apiVersion": "runbook.dev/v1alpha1",
        "kind": "RunbookState",
        "metadata": {
            "name": apart.name,
            "namespace": apart.namespace,
            "labels": labels,
            "ownerReferences": owners,
        },
        "spec": {"target": {
            "apiVersion": kind.api_version, "kind": kind.kind,
            "namespace": text("/metadata/namespace"),
            "name": text("/metadata/name"), "uid": text("/metadata/uid"),
        }},
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sts(status: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"name": "db", "namespace": "n", "uid": "u"}, "status": status})
    }

    #[test]
    fn runbooks_fields_go_to_the_state_and_the_targets_stay_its_own() {
        let real = json!({"replicas": 3, "observedGeneration": 7,
                          "conditions": [{"type": "Available", "status": "True"}]});
        let state = json!({"decisions": [{"policy": "p", "time": "t1"}],
                           "conditions": [{"type": "Degraded", "status": "False"}]});
        let seen = overlay(&sts(real.clone()), Some(&state))["status"].clone();
        assert_eq!(seen["decisions"][0]["policy"], "p");
        assert_eq!(seen["observedGeneration"], 7, "the target's own");
        assert_eq!(seen["conditions"].as_array().unwrap().len(), 2);
        // A decision: a field of the policy's, a new record, Degraded set.
        let mut concluded = seen.clone();
        concluded["ready"] = json!(true);
        concluded["decisions"] = json!([{"policy": "p", "time": "t2",
                                          "actions": [{"result": "refused"}]}]);
        concluded["observedGeneration"] = json!(8);
        concluded["conditions"] = json!([{"type": "Available", "status": "True"},
                                         {"type": "Degraded", "status": "True"}]);
        concluded["lastRunTime"] = json!("2026-01-01T00:00:00Z");
        let (own, st) = split(&real, &state, &seen, &concluded, Keeping::default());
        assert_eq!(
            own,
            json!({"replicas": 3, "observedGeneration": 7, "ready": true,
                   "conditions": [{"type": "Available", "status": "True"}]})
        );
        assert_eq!(st["decisions"][0]["time"], "t2");
        assert_eq!(st["observedGeneration"], 8);
        assert_eq!(st["lastRunTime"], "2026-01-01T00:00:00Z");
        assert_eq!(
            st["conditions"],
            json!([{"type": "Degraded", "status": "True"}])
        );
        assert_eq!(
            st["last"],
            json!({"policy": "p", "result": "refused", "time": "t2"})
        );
    }

    #[test]
    fn a_status_without_conditions_gets_none_and_old_records_move_over() {
        // An earlier release wrote records into the target; no state yet.
        let real = json!({"value": "a", "decisions": [{"policy": "p", "time": "t0"}]});
        let seen = overlay(&sts(real.clone()), None)["status"].clone();
        assert_eq!(seen["decisions"][0]["time"], "t0");
        let mut concluded = seen.clone();
        concluded["value"] = json!("b");
        concluded["conditions"] = json!([{"type": "Degraded", "status": "True"}]);
        let (own, st) = split(&real, &json!({}), &seen, &concluded, Keeping::default());
        assert_eq!(own, json!({"value": "b"}), "no conditions, no records");
        assert_eq!(st["decisions"][0]["time"], "t0", "carried over");
        // A field the decision removes is removed from the target.
        let mut removed = seen.clone();
        removed.as_object_mut().unwrap().remove("value");
        let (own, _) = split(&real, &json!({}), &seen, &removed, Keeping::default());
        assert_eq!(own, json!({}));
    }

    #[test]
    fn a_steps_progress_is_runbooks_and_a_scripts_phase_the_policys() {
        let real = json!({});
        let state = json!({"run": "r1", "phase": "Running", "steps": [{"name": "a"}]});
        let seen = overlay(&sts(real.clone()), Some(&state))["status"].clone();
        assert_eq!(seen["phase"], "Running");
        // A script policy on the same target: its phase is its own, and
        // the step policy's progress stays in the state.
        let mut concluded = seen.clone();
        concluded["ready"] = json!(true);
        let (own, st) = split(&real, &state, &seen, &concluded, Keeping::default());
        assert_eq!(own, json!({"ready": true}));
        assert_eq!(st["run"], "r1");
        // The step policy moves on.
        let mut concluded = seen.clone();
        concluded["phase"] = json!("Completed");
        let (own, st) = split(
            &real,
            &state,
            &seen,
            &concluded,
            Keeping {
                steps: true,
                built_in: false,
            },
        );
        assert_eq!(own, json!({}));
        assert_eq!(st["phase"], "Completed");
        // A script that sets a phase of its own writes it to the target.
        let mut concluded = overlay(&sts(real.clone()), None)["status"].clone();
        concluded["phase"] = json!("Ready");
        let (own, _) = split(
            &real,
            &json!({}),
            &json!({}),
            &concluded,
            Keeping::default(),
        );
        assert_eq!(own, json!({"phase": "Ready"}));
    }

    #[test]
    fn only_runbooks_own_kinds_keep_their_state_in_status() {
        assert!(owns_schema(&KindRef::new(
            "runbook.dev/v1alpha1",
            "Evaluator"
        )));
        assert!(!owns_schema(&KindRef::new(
            "runbook.dev/v1alpha1",
            "RunbookState"
        )));
        assert!(!owns_schema(&KindRef::new("apps/v1", "StatefulSet")));
        assert!(!owns_schema(&KindRef::new("example.com/v1", "Evaluator")));
    }

    /// A built-in kind's status keeps only its own fields: a policy's
    /// (`announced` on a Pod) is kept in the state, seen by the next
    /// decision as if in the status, and removed from there as it would
    /// be from the status; the kind's own fields stay its own.
    #[test]
    fn a_policys_fields_of_a_built_in_kind_are_kept_apart() {
        let real = json!({"phase": "Running"});
        let seen = overlay(&json!({"status": real}), None)["status"].clone();
        let mut concluded = seen.clone();
        concluded["announced"] = json!(true);
        let (own, st) = split(
            &real,
            &json!({}),
            &seen,
            &concluded,
            Keeping {
                steps: false,
                built_in: true,
            },
        );
        assert_eq!(
            own,
            json!({"phase": "Running"}),
            "nothing written to the Pod"
        );
        assert_eq!(st[FIELDS], json!({"announced": true}));
        // The next decision sees it in the status.
        let seen = overlay(&json!({"status": real}), Some(&st))["status"].clone();
        assert_eq!(seen["announced"], true);
        assert_eq!(seen["phase"], "Running");
        // And can remove it.
        let mut removed = seen.clone();
        removed.as_object_mut().unwrap().remove("announced");
        let (own, st) = split(
            &real,
            &st,
            &seen,
            &removed,
            Keeping {
                steps: false,
                built_in: true,
            },
        );
        assert_eq!(own, json!({"phase": "Running"}));
        assert!(st.get(FIELDS).is_none(), "{st}");
    }
}
