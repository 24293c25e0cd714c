//! What a decision leaves once its steps are done: the target's new
//! status (fields, conditions, `Degraded`, `observedGeneration`), its
//! decision record, and the Events to write. Pure, like the plan: the
//! steps' results go in, the writes about the target come out.

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::Acting;
use super::status;
use super::{Note, Plan, Todo};
use crate::crd::{ActionRecord, ActionResult, DecisionRecord};
use crate::decide::DecideError;
use crate::policy::compile::CompiledPolicy;
use crate::policy::limits::Recent;
use crate::script::action::{Condition, ConditionStatus, EventType};

/// Reasons of conditions Runbook sets, so it knows which it may clear.
const OWN_REASONS: &[&str] = &[
    "StatusDropped",
    "ScriptError",
    "ActionRefused",
    "NotAuthorized",
    "ActionFailed",
    "Forbidden",
    "ActionLimited",
    "ScheduleError",
    "PolicyWaitingForKind",
];

/// What became of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Done {
    pub result: ActionResult,
    pub detail: Option<String>,
    /// Whether it wrote to the API server.
    pub wrote: bool,
}

impl Done {
    pub fn new(result: ActionResult, detail: Option<String>) -> Self {
        Self {
            result,
            detail,
            wrote: false,
        }
    }
}

/// What a conclusion is drawn from.
pub struct Input<'a> {
    pub policy: &'a CompiledPolicy,
    pub target: &'a Value,
    pub plan: &'a Plan,
    /// One per step of the plan.
    pub done: &'a [Done],
    pub decide_error: Option<&'a DecideError>,
    /// The action that failed (or was refused on what the cluster
    /// holds), if one did.
    pub failed: Option<&'a super::Failed>,
    pub inputs_hash: &'a str,
    pub mode: &'a Acting,
    pub now: Timestamp,
    /// Status fields of this policy the target's schema is known to drop.
    pub dropped: &'a [String],
    /// The metric readings the decision read.
    pub metrics: &'a [(String, crate::metric::Asked)],
}

/// The writes about the target a decision ends with.
#[derive(Clone, Debug, PartialEq)]
pub struct Conclusion {
    pub record: DecisionRecord,
    /// The status as it should be, decision record included.
    pub status: Value,
    /// The merge patch from the current status to it, if they differ.
    pub patch: Option<Value>,
    /// Events to write: those the decision asked for, and a warning for a
    /// problem not reported before.
    pub events: Vec<Note>,
    /// The reason and message of `Degraded`, when something is wrong.
    pub problem: Option<(&'static str, String)>,
}

/// What is wrong after a decision, as the reason and message of its
/// `Degraded` condition: a decide error first, then a failed action, a
/// refused one, one held by its limit.
pub fn problem_of(
    decide_error: Option<&DecideError>,
    failed: Option<&super::Failed>,
    plan: &Plan,
    done: &[Done],
) -> Option<(&'static str, String)> {
    if let Some(e) = decide_error {
        return Some((e.cause().reason(), e.to_string()));
    }
    if let Some(f) = failed {
        return Some((f.cause.reason(), f.message.clone()));
    }
    let refused = plan.steps.iter().find_map(|s| match &s.todo {
        Todo::Refused(r) => Some(r.to_string()),
        _ => None,
    });
    if let Some(r) = refused {
        return Some(("ActionRefused", r));
    }
    done.iter()
        .find(|d| d.result == ActionResult::Limited)
        .map(|d| ("ActionLimited", d.detail.clone().unwrap_or_default()))
}

/// The status a decision leaves, from the current one: its fields (none
/// when an action failed), its conditions, `Degraded` for a problem (or
/// cleared when Runbook had set it and no other policy on the target
/// still has one: `others_troubled`), and `observedGeneration`.
pub fn next_status(
    current: &Value,
    fields: Option<&Map<String, Value>>,
    conditions: &[Condition],
    problem: Option<&(&'static str, String)>,
    others_troubled: bool,
    generation: Option<i64>,
    now: &str,
) -> Value {
    let mut new_status = current.clone();
    if let Some(fields) = fields {
        status::merge_fields(&mut new_status, fields);
    }
    for c in conditions {
        status::set_condition(&mut new_status, c, generation, now);
    }
    let degraded = |status, reason: &str, message: &str| Condition {
        type_: "Degraded".into(),
        status,
        reason: reason.into(),
        message: message.into(),
    };
    match problem {
        Some((reason, message)) => status::set_condition(
            &mut new_status,
            &degraded(ConditionStatus::True, reason, message),
            generation,
            now,
        ),
        None => {
            let ours = status::condition(&new_status, "Degraded").is_some_and(|c| {
                c["status"] == "True" && OWN_REASONS.contains(&c["reason"].as_str().unwrap_or(""))
            });
            if ours && !others_troubled {
                status::set_condition(
                    &mut new_status,
                    &degraded(
                        ConditionStatus::False,
                        "Reconciled",
                        "the last decision was carried out",
                    ),
                    generation,
                    now,
                );
            }
        }
    }
    if let Some(g) = generation {
        new_status["observedGeneration"] = json!(g);
    }
    new_status
}

/// The decision record to write. It is that of the last decision that
/// did something: one that repeats it, or that changes nothing at all
/// (`quiet`: no write, no Event, no problem; typically the reconcile our
/// own status write triggers), keeps the last record as it was, time and
/// inputs hash included, so it writes nothing. A decision that changes the
/// status is always recorded: the record is never older than the status
/// it sits in.
pub fn record_to_keep(
    mut record: DecisionRecord,
    previous: &DecisionRecord,
    status_unchanged: bool,
    quiet: bool,
    now: &str,
) -> DecisionRecord {
    // A record of an older form says the same in more words: it is kept
    // as it is where the compact one would say the same.
    let written = previous.clone().compact();
    let mut compare = record.clone();
    compare.time = previous.time.clone();
    compare.inputs_hash = previous.inputs_hash.clone();
    let idle = quiet
        && record.error.is_none()
        && previous.error.is_none()
        && record.policy_version == previous.policy_version
        && record.mode == written.mode
        && record.alert_routes == previous.alert_routes
        && record.previous == previous.previous
        && record.changed_at == previous.changed_at;
    if previous.time.is_some() && status_unchanged && (compare == written || idle) {
        previous.clone()
    } else {
        record.time = Some(now.to_string());
        record
    }
}

/// A reading as its decision record keeps it.
pub fn metric_record(asked: &crate::metric::Asked) -> crate::crd::MetricRecord {
    use crate::metric::Reading;
    let query = crate::metric::cut(&asked.asked, 512);
    match &asked.reading {
        Reading::Value { value, at, samples } => crate::crd::MetricRecord {
            query,
            value: Some(*value),
            at: jiff::Timestamp::from_second(*at)
                .ok()
                .map(crate::util::time::format),
            samples: Some(*samples),
            ..Default::default()
        },
        Reading::Missing { reason, message } => crate::crd::MetricRecord {
            query,
            reason: Some(reason.as_str().to_string()),
            message: Some(message.clone()),
            ..Default::default()
        },
    }
}

/// Whether two statuses are the same but for their decision records.
fn equal_but_decisions(a: &Value, b: &Value) -> bool {
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            fn rest(m: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
                m.iter().filter(|(k, _)| k.as_str() != "decisions")
            }
            rest(a).eq(rest(b))
        }
        _ => a == b,
    }
}

/// The record of each step, as `runbook explain` shows it.
fn action_records(plan: &Plan, done: &[Done]) -> Vec<ActionRecord> {
    plan.steps
        .iter()
        .zip(done)
        .map(|(s, d)| ActionRecord {
            action: s.action.verb().to_string(),
            // The target itself goes without saying.
            target: s
                .target
                .clone()
                .filter(|_| !ActionRecord::on_itself(s.action.verb())),
            result: d.result,
            message: d.detail.clone(),
        })
        .collect()
}

/// Fields of the status the target's schema drops, as a problem: said
/// where Runbook's own condition can be written (its state, if not the
/// status).
fn dropped_fields(input: &Input<'_>) -> Option<(&'static str, String)> {
    let lost: Vec<&String> = input
        .plan
        .fields
        .keys()
        .filter(|k| input.dropped.contains(k))
        .collect();
    if lost.is_empty() {
        return None;
    }
    let names: Vec<String> = lost.iter().map(|k| format!("status.{k}")).collect();
    Some((
        "StatusDropped",
        format!(
            "the API server drops {}: the target's status schema does not list {}",
            names.join(", "),
            if lost.len() == 1 { "it" } else { "them" }
        ),
    ))
}

/// A Warning Event for a problem the previous decision did not already
/// tell (in its error or an action's message).
fn new_problem(
    problem: Option<&(&'static str, String)>,
    previous: &DecisionRecord,
) -> Option<Note> {
    let (reason, message) = problem?;
    let told = previous.error.as_deref() == Some(message.as_str())
        || previous
            .actions
            .iter()
            .any(|a| a.message.as_deref() == Some(message.as_str()));
    (!told).then(|| Note {
        type_: EventType::Warning,
        reason: reason.to_string(),
        message: message.clone(),
    })
}

/// Conclude a decision.
pub fn conclude(input: &Input<'_>) -> Conclusion {
    let t = input.target;
    let now = crate::util::time::format(input.now);
    let generation = t
        .get("metadata")
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64);
    let current = t.get("status").cloned().unwrap_or(json!({}));
    let previous = DecisionRecord::of(t, &input.policy.name).unwrap_or_default();
    let failed = input.failed.map(|f| f.message.clone());
    let error = input.decide_error.map(|e| e.to_string()).or(failed);
    let problem = problem_of(input.decide_error, input.failed, input.plan, input.done)
        .or_else(|| dropped_fields(input));
    let others_troubled = DecisionRecord::others(t, &input.policy.name)
        .iter()
        .any(DecisionRecord::has_problem);
    let mut new_status = next_status(
        &current,
        input.failed.is_none().then_some(&input.plan.fields),
        &input.plan.conditions,
        problem.as_ref(),
        others_troubled,
        generation,
        &now,
    );
    if status::follows_kstatus(t) {
        status::set_kstatus(&mut new_status, generation, &now);
    }
    let limits = &input.policy.limits;
    let mut recent = Recent::of(t, &input.policy.name);
    for (s, d) in input.plan.steps.iter().zip(input.done) {
        if let (true, Some(v)) = (d.wrote, s.action.limited_verb()) {
            recent.note(limits, v, input.now);
        }
    }
    let actions = action_records(input.plan, input.done);
    // A failure is said once: on the action it came from, not again as
    // the decision's error (which is for what failed before any action).
    let error = error.filter(|e| !actions.iter().any(|a| a.message.as_ref() == Some(e)));
    // What `spec.previous` names, as this decision saw it when it
    // concluded; a failed one keeps what the last that concluded saw.
    let kept = if input.decide_error.is_none() && input.failed.is_none() {
        crate::decide::previous::snapshot(&input.policy.previous, t)
    } else {
        previous.previous.clone()
    };
    let record = DecisionRecord {
        policy: input.policy.name.clone(),
        policy_version: input.policy.version.clone(),
        inputs_hash: input.inputs_hash.to_string(),
        time: None,
        // Enforcing goes without saying.
        mode: (*input.mode != Acting::Enforce).then(|| input.mode.as_str().to_string()),
        actions,
        alert_routes: input.plan.routes.iter().cloned().collect(),
        recent_actions: recent.to_record(limits, input.now),
        error,
        // What `spec.previous` names, as this decision saw it when it
        // concluded; a failed one keeps what the last that concluded saw.
        previous: kept.clone(),
        // To the millisecond: an idle timer counts from it.
        changed_at: if kept != previous.previous {
            Some(format!("{:.3}", input.now))
        } else {
            previous.changed_at.clone()
        },
        metrics: input
            .metrics
            .iter()
            .map(|(name, asked)| (name.clone(), metric_record(asked)))
            .collect(),
    };
    let status_unchanged = equal_but_decisions(&current, &new_status);
    let wrote = input.done.iter().any(|d| d.wrote);
    let quiet = !wrote && input.plan.events.is_empty() && problem.is_none();
    let record = record_to_keep(record, &previous, status_unchanged, quiet, &now);
    // The last record kept is left as it is written, in whatever form
    // (an older release's says more).
    if previous.time.is_none() || record != previous {
        new_status["decisions"] = record.upsert_into(current.get("decisions"));
    }
    let mut events = input.plan.events.clone();
    events.extend(new_problem(problem.as_ref(), &previous));
    Conclusion {
        patch: status::merge_diff(&current, &new_status),
        record,
        status: new_status,
        events,
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-11-29T10:00:00Z";

    fn conditions(status: &Value) -> Vec<(String, String, String)> {
        status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["type"].as_str().unwrap_or("").to_string(),
                    c["status"].as_str().unwrap_or("").to_string(),
                    c["reason"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn a_decision_sets_its_fields_conditions_and_generation() {
        let current = json!({"phase": "Pending", "keep": 1});
        let mut fields = Map::new();
        fields.insert("phase".into(), json!("Healthy"));
        fields.insert("gone".into(), Value::Null);
        let conds = vec![Condition {
            type_: "Ready".into(),
            status: ConditionStatus::True,
            reason: "ScoreAboveThreshold".into(),
            message: "ok".into(),
        }];
        let next = next_status(&current, Some(&fields), &conds, None, false, Some(3), NOW);
        assert_eq!(next["phase"], "Healthy");
        assert_eq!(next["keep"], 1);
        assert_eq!(next["observedGeneration"], 3);
        assert_eq!(
            conditions(&next),
            [(
                "Ready".to_string(),
                "True".to_string(),
                "ScoreAboveThreshold".to_string()
            )]
        );
    }

    #[test]
    fn a_problem_is_degraded_and_a_later_clean_decision_clears_only_ours() {
        let problem = ("ActionFailed", "apply failed".to_string());
        // A failed action keeps the decision's fields out.
        let mut fields = Map::new();
        fields.insert("phase".into(), json!("Healthy"));
        let failed = next_status(&json!({}), None, &[], Some(&problem), false, None, NOW);
        assert!(failed.get("phase").is_none());
        assert_eq!(
            conditions(&failed),
            [(
                "Degraded".to_string(),
                "True".to_string(),
                "ActionFailed".to_string()
            )]
        );
        let clean = next_status(&failed, Some(&fields), &[], None, false, None, NOW);
        assert_eq!(
            conditions(&clean),
            [(
                "Degraded".to_string(),
                "False".to_string(),
                "Reconciled".to_string()
            )]
        );
        // A Degraded someone else set is left alone.
        let theirs =
            json!({"conditions": [{"type": "Degraded", "status": "True", "reason": "Theirs"}]});
        let kept = next_status(&theirs, Some(&fields), &[], None, false, None, NOW);
        assert_eq!(conditions(&kept)[0].2, "Theirs");
        // Another policy on the target still has a problem: Degraded stays.
        let still = next_status(&failed, Some(&fields), &[], None, true, None, NOW);
        assert_eq!(conditions(&still)[0].1, "True");
    }

    #[test]
    fn a_decision_that_changes_nothing_keeps_the_last_record_as_it_was() {
        let previous = DecisionRecord {
            policy: "p".into(),
            policy_version: "v1".into(),
            inputs_hash: "old".into(),
            time: Some("2026-11-29T09:00:00Z".into()),
            ..Default::default()
        };
        let mut this = previous.clone();
        this.inputs_hash = "new".into();
        this.time = None;
        // Nothing changed: the old record, time and inputs hash included.
        assert_eq!(
            record_to_keep(this.clone(), &previous, true, true, NOW),
            previous
        );
        // The status changed: this decision is recorded, at `now`.
        let kept = record_to_keep(this.clone(), &previous, false, true, NOW);
        assert_eq!(kept.time.as_deref(), Some(NOW));
        assert_eq!(kept.inputs_hash, "new");
        // A new policy version is news even when nothing else is.
        let mut newer = this;
        newer.policy_version = "v2".into();
        newer.actions.push(ActionRecord {
            action: "apply".into(),
            target: None,
            result: ActionResult::Ok,
            message: None,
        });
        assert_eq!(
            record_to_keep(newer, &previous, true, true, NOW).policy_version,
            "v2"
        );
    }

    #[test]
    fn a_record_is_written_compactly_and_an_older_form_of_it_is_not_rewritten() {
        let action = |verb: &str, target: Option<&str>| ActionRecord {
            action: verb.into(),
            target: target.map(str::to_string),
            result: ActionResult::Ok,
            message: None,
        };
        let this = DecisionRecord {
            policy: "p".into(),
            policy_version: "v1".into(),
            inputs_hash: "h2".into(),
            actions: vec![
                action("apply", Some("v1 ConfigMap ns/w-child")),
                action("status", None),
            ],
            ..Default::default()
        };
        // Enforcing, an action carried out, and the record's own object
        // go without saying.
        assert_eq!(
            serde_json::to_value(&this).unwrap(),
            json!({"policy": "p", "policyVersion": "v1", "inputsHash": "h2",
                   "actions": [{"action": "apply", "target": "v1 ConfigMap ns/w-child"}, {"action": "status"}]})
        );
        // The same decision as a record written before said it: kept as
        // it is, so an upgrade rewrites no status.
        let older: DecisionRecord = serde_json::from_value(json!({
            "policy": "p", "policyVersion": "v1", "inputsHash": "h1", "time": "2026-11-29T09:00:00Z",
            "mode": "enforce",
            "actions": [{"action": "apply", "target": "v1 ConfigMap ns/w-child", "result": "ok"},
                        {"action": "status", "target": "example.com/v1 Widget ns/w", "result": "ok"}]}))
        .unwrap();
        assert_eq!(
            record_to_keep(this.clone(), &older, true, false, NOW),
            older
        );
        // A refusal is news, and is said.
        let mut refused = this;
        refused.actions[0].result = ActionResult::Refused;
        let kept = record_to_keep(refused, &older, true, false, NOW);
        assert_eq!(kept.time.as_deref(), Some(NOW));
        assert_eq!(
            serde_json::to_value(&kept).unwrap()["actions"][0]["result"],
            "refused"
        );
    }
}
