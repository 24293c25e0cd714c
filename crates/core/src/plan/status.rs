//! Status writing: merging what a decision set, standard conditions with
//! honest transition times, `observedGeneration`, and the decision record;
//! and the smallest merge patch that gets the status there.

use serde_json::{Map, Value, json};

use crate::script::action::Condition;

/// Merge `fields` into `status` with JSON merge patch semantics (null removes).
pub fn merge_fields(status: &mut Value, fields: &Map<String, Value>) {
    if !status.is_object() {
        *status = json!({});
    }
    json_patch::merge(status, &Value::Object(fields.clone()));
}

/// Add one `status(map)` action's fields to those of the actions before
/// it: maps merge, anything else (a null included) replaces. Unlike a
/// merge patch applied here, a null survives, so that merging the result
/// into the status removes that field.
pub fn accumulate(into: &mut Map<String, Value>, fields: &Map<String, Value>) {
    for (k, v) in fields {
        match (into.get_mut(k), v) {
            (Some(Value::Object(have)), Value::Object(more)) => accumulate(have, more),
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Set one condition: `lastTransitionTime` changes only when the status
/// does; `observedGeneration` is the target's generation.
pub fn set_condition(status: &mut Value, c: &Condition, generation: Option<i64>, now: &str) {
    if !status.is_object() {
        *status = json!({});
    }
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let Some(list) = status["conditions"].as_array_mut() else {
        return;
    };
    let mut new =
        json!({"type": c.type_, "status": c.status, "reason": c.reason, "message": c.message});
    if let Some(g) = generation {
        new["observedGeneration"] = json!(g);
    }
    match list.iter_mut().find(|e| e["type"] == c.type_.as_str()) {
        Some(existing) => {
            let transition = if existing["status"] == c.status.as_str() {
                existing
                    .get("lastTransitionTime")
                    .cloned()
                    .unwrap_or(json!(now))
            } else {
                json!(now)
            };
            new["lastTransitionTime"] = transition;
            *existing = new;
        }
        None => {
            new["lastTransitionTime"] = json!(now);
            list.push(new);
        }
    }
}

pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The JSON merge patch that turns `old` into `new` (None when equal).
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    match (old.as_object(), new.as_object()) {
        (Some(o), Some(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(d) = merge_diff(ov, nv) {
                            patch.insert(k.clone(), d);
                        }
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    patch.insert(k.clone(), Value::Null);
                }
            }
            if patch.is_empty() {
                None
            } else {
                Some(Value::Object(patch))
            }
        }
        // Nulls inside a merge patch mean "remove", so a new null must be
        // sent as the whole parent; it never occurs in status we write.
        _ => Some(new.clone()),
    }
}

/// Whether every field `desired` sets has the same value in `live`
/// (arrays element by element, since the server may default fields inside
/// list items).
pub fn is_subset(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d
            .iter()
            .all(|(k, v)| l.get(k).is_some_and(|lv| is_subset(v, lv))),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(a, b)| is_subset(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        // An int-or-string field (a resource quantity, a port): the API
        // server keeps `1` as given for some fields and answers `"1"` for
        // quantities.
        (Value::Number(a), Value::String(b)) => a.to_string() == *b,
        (Value::Null, _) => true,
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::action::ConditionStatus;

    #[test]
    fn a_null_from_a_later_status_action_removes_the_field() {
        let mut fields = Map::new();
        accumulate(
            &mut fields,
            json!({"phase": "Running", "run": {"id": "a", "n": 1}})
                .as_object()
                .unwrap(),
        );
        accumulate(
            &mut fields,
            json!({"currentRun": null, "run": {"n": 2}})
                .as_object()
                .unwrap(),
        );
        assert_eq!(
            Value::Object(fields.clone()),
            json!({"phase": "Running", "run": {"id": "a", "n": 2}, "currentRun": null})
        );
        let mut status = json!({"currentRun": "job-1", "phase": "Pending"});
        let before = status.clone();
        merge_fields(&mut status, &fields);
        assert_eq!(
            status,
            json!({"phase": "Running", "run": {"id": "a", "n": 2}})
        );
        let patch = merge_diff(&before, &status).unwrap();
        assert_eq!(
            patch["currentRun"],
            Value::Null,
            "the removal is in the patch"
        );
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let ready = |status, reason: &str, message: &str| Condition {
            type_: "Ready".into(),
            status,
            reason: reason.into(),
            message: message.into(),
        };
        let mut s = json!({});
        set_condition(
            &mut s,
            &ready(ConditionStatus::True, "Ok", "fine"),
            Some(1),
            "t1",
        );
        let still = ready(ConditionStatus::True, "Ok", "still fine");
        set_condition(&mut s, &still, Some(2), "t2");
        assert_eq!(condition(&s, "Ready").unwrap()["lastTransitionTime"], "t1");
        assert_eq!(condition(&s, "Ready").unwrap()["observedGeneration"], 2);
        let broke = ready(ConditionStatus::False, "Bad", "broke");
        set_condition(&mut s, &broke, Some(2), "t3");
        assert_eq!(condition(&s, "Ready").unwrap()["lastTransitionTime"], "t3");
    }

    #[test]
    fn the_merge_diff_patches_old_into_new() {
        let old = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        let new = json!({"a": 1, "b": {"c": 5}, "e": [1, 2], "f": "x"});
        let d = merge_diff(&old, &new).unwrap();
        assert_eq!(d, json!({"b": {"c": 5, "d": null}, "e": [1, 2], "f": "x"}));
        let mut patched = old.clone();
        json_patch::merge(&mut patched, &d);
        assert_eq!(patched, new);
        assert!(merge_diff(&new, &new).is_none());
    }

    #[test]
    fn subsets_allow_server_defaults() {
        let desired = json!({"spec": {"containers": [{"name": "a", "image": "x"}]}});
        let live = json!({"spec": {"containers": [{"name": "a", "image": "x", "terminationMessagePath": "/dev/termination-log"}], "restartPolicy": "Always"}});
        assert!(is_subset(&desired, &live));
        assert!(!is_subset(
            &json!({"spec": {"containers": [{"name": "a", "image": "y"}]}}),
            &live
        ));
        assert!(is_subset(&json!({"n": 1}), &json!({"n": 1.0})));
    }
}

/// Reasons of `Degraded` that do not clear by themselves: a person must
/// act (grant a right, fix a script or a spec, install a CRD). They make
/// `Stalled` true.
pub const STALLING_REASONS: &[&str] = &[
    "ActionRefused",
    "NotAuthorized",
    "Forbidden",
    "ScriptError",
    "ScheduleError",
    "StatusDropped",
    "PolicyWaitingForKind",
    "InternalError",
];

/// Whether `target` is one of Runbook's own kinds, whose status follows
/// kstatus (`Reconciling`, `Stalled`, `observedGeneration`).
pub fn follows_kstatus(target: &Value) -> bool {
    target["apiVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("runbook.dev/"))
        && target["kind"] != "RunbookState"
}

/// The conditions kstatus reads (Flux, kpt, `kubectl wait`), derived from
/// those Runbook's kinds carry: `Reconciling` mirrors `Progressing` (True
/// while a run, a rollout or a step is in flight), `Stalled` is True while
/// `Degraded` is True for a reason that will not clear by itself.
pub fn set_kstatus(status: &mut Value, generation: Option<i64>, now: &str) {
    use crate::script::action::ConditionStatus;
    let degraded = condition(status, "Degraded").cloned();
    let stalled = degraded.as_ref().and_then(|d| {
        let reason = d["reason"].as_str().unwrap_or("");
        (d["status"] == "True" && STALLING_REASONS.contains(&reason)).then(|| {
            (
                reason.to_string(),
                d["message"].as_str().unwrap_or("").to_string(),
            )
        })
    });
    let stalled_condition = match &stalled {
        Some((reason, message)) => Condition {
            type_: "Stalled".into(),
            status: ConditionStatus::True,
            reason: reason.clone(),
            message: message.clone(),
        },
        None => Condition {
            type_: "Stalled".into(),
            status: ConditionStatus::False,
            reason: "NotStalled".into(),
            message: "nothing needs a person".into(),
        },
    };
    set_condition(status, &stalled_condition, generation, now);
    let progressing = condition(status, "Progressing").cloned();
    let reconciling = match progressing {
        Some(p) if p["status"] == "True" && stalled.is_none() => Condition {
            type_: "Reconciling".into(),
            status: ConditionStatus::True,
            reason: p["reason"].as_str().unwrap_or("Progressing").to_string(),
            message: p["message"].as_str().unwrap_or("").to_string(),
        },
        _ => Condition {
            type_: "Reconciling".into(),
            status: ConditionStatus::False,
            reason: if stalled.is_some() {
                "Stalled"
            } else {
                "Reconciled"
            }
            .into(),
            message: "no work in flight".into(),
        },
    };
    set_condition(status, &reconciling, generation, now);
}

#[cfg(test)]
mod kstatus_tests {
    use super::*;

    fn statuses(status: &Value) -> (String, String) {
        let of = |t: &str| {
            condition(status, t).unwrap()["status"]
                .as_str()
                .unwrap()
                .to_string()
        };
        (of("Reconciling"), of("Stalled"))
    }

    #[test]
    fn reconciling_mirrors_progressing_and_stalled_needs_a_person() {
        let now = "2026-01-01T00:00:00Z";
        let mut s = json!({"conditions": [
            {"type": "Progressing", "status": "True", "reason": "BenchmarkRunning", "message": "benchmark 3"}]});
        set_kstatus(&mut s, Some(4), now);
        assert_eq!(statuses(&s), ("True".into(), "False".into()));
        assert_eq!(
            condition(&s, "Reconciling").unwrap()["reason"],
            "BenchmarkRunning"
        );
        assert_eq!(condition(&s, "Stalled").unwrap()["observedGeneration"], 4);
        // A refused action: stalled, and not reconciling however it got there.
        s["conditions"].as_array_mut().unwrap().push(json!(
            {"type": "Degraded", "status": "True", "reason": "ActionRefused", "message": "delete refused"}));
        set_kstatus(&mut s, Some(4), now);
        assert_eq!(statuses(&s), ("False".into(), "True".into()));
        assert_eq!(
            condition(&s, "Stalled").unwrap()["message"],
            "delete refused"
        );
        // A failed write is retried by itself: degraded, not stalled.
        for c in s["conditions"].as_array_mut().unwrap() {
            if c["type"] == "Degraded" {
                c["reason"] = json!("ActionFailed");
            }
        }
        set_kstatus(&mut s, Some(4), now);
        assert_eq!(statuses(&s), ("True".into(), "False".into()));
    }

    #[test]
    fn only_runbooks_own_kinds_follow_kstatus() {
        assert!(follows_kstatus(
            &json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator"})
        ));
        assert!(!follows_kstatus(
            &json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "RunbookState"})
        ));
        assert!(!follows_kstatus(
            &json!({"apiVersion": "example.com/v1", "kind": "Widget"})
        ));
        assert!(!follows_kstatus(&json!({})));
    }
}
