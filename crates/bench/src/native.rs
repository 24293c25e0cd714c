//! The evaluator rule written directly in Rust: the baseline the scripted
//! policy is measured against. For a finished benchmark run it reads the
//! same objects and produces the same actions as `policies/evaluator-drift.rhai`
//! (a test holds the two to that), so the comparison is like for like.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use runbook_core::script::action::{Action, Condition, EventType};
use runbook_core::script::helpers::{job_failed, job_succeeded, revision_of, termination_message};
use runbook_core::util::time;

/// What the rule needs: the Evaluator and the objects around it.
pub struct Inputs<'a> {
    pub evaluator: &'a Value,
    pub deployment: &'a Value,
    pub jobs: &'a [&'a Value],
    pub pods: &'a [&'a Value],
    pub replicasets: &'a [&'a Value],
    pub now: i64,
    pub default_team: &'a str,
    pub rollback_allowed: bool,
}

fn condition(type_: &str, status: bool, reason: &str, message: String) -> Action {
    Action::Condition(Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
    })
}

fn event(reason: &str, message: String) -> Action {
    Action::Event {
        type_: EventType::Warning,
        reason: reason.into(),
        message,
    }
}

fn read_score(pods: &[&Value]) -> Result<f64, String> {
    for pod in pods {
        let Some(msg) = termination_message(pod) else {
            continue;
        };
        let parsed: Value = serde_json::from_str(&msg).map_err(|_| {
            format!(
                "benchmark message is not JSON or a number ({} characters)",
                msg.chars().count()
            )
        })?;
        let shape = match &parsed {
            Value::Object(_) => "a JSON object without a numeric score".to_string(),
            Value::String(_) => "a JSON string".to_string(),
            Value::Array(_) => "a JSON array".to_string(),
            Value::Bool(_) => "a JSON bool".to_string(),
            _ => "a JSON ()".to_string(),
        };
        return parsed
            .as_f64()
            .or_else(|| parsed.get("score").and_then(Value::as_f64))
            .ok_or_else(|| format!("benchmark message has no numeric score ({shape})"));
    }
    Err("the benchmark pod left no termination message".into())
}

fn selector_matches(job: &Value, pod: &Value) -> bool {
    let Some(sel) = job
        .get("spec")
        .and_then(|s| s.get("selector"))
        .and_then(|s| s.get("matchLabels"))
        .and_then(Value::as_object)
    else {
        return false;
    };
    let labels = pod.get("metadata").and_then(|m| m.get("labels"));
    sel.iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

fn num(f: f64) -> String {
    // Rhai prints floats the way Rust's Display does.
    format!("{f}")
}

/// What a decision has found so far: the phase, status fields, actions.
struct Verdict {
    phase: String,
    fields: Map<String, Value>,
    actions: Vec<Action>,
}

impl Verdict {
    /// A problem: Degraded, with the error in status, a condition and an Event.
    fn degraded(&mut self, reason: &str, message: String) {
        self.phase = "Degraded".into();
        self.fields.insert("lastError".into(), json!(message));
        self.actions
            .push(condition("Ready", false, reason, message.clone()));
        self.actions.push(event(reason, message));
    }
}

/// The revision to roll back to: the last good one (if it is not the bad
/// one and still exists), else the highest below the bad one.
fn rollback_target(i: &Inputs, st: &Value, ran_on: i64) -> Option<i64> {
    let last_good = st.get("lastGoodRevision").and_then(Value::as_i64);
    let dep_uid = i.deployment["metadata"]["uid"].as_str();
    let revisions: Vec<i64> = i
        .replicasets
        .iter()
        .filter(|rs| runbook_core::observe::owner_uids(rs).any(|u| Some(u) == dep_uid))
        .filter_map(|rs| revision_of(rs))
        .collect();
    match last_good {
        Some(g) if g != ran_on && revisions.contains(&g) => Some(g),
        _ => revisions.iter().copied().filter(|r| *r < ran_on).max(),
    }
}

/// A score read: kept in the history, then healthy, or rolled back (unless
/// already, or there is no earlier revision, or the limit withholds it).
fn scored(i: &Inputs, st: &Value, v: &mut Verdict, score: f64, ran_on: i64) {
    let threshold = i.evaluator["spec"]["threshold"].as_f64().unwrap_or(1.0);
    v.fields.insert("lastScore".into(), json!(score));
    v.fields.insert("lastError".into(), Value::Null);
    let mut history = st
        .get("scoreHistory")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    history.push(json!({"time": time::format_secs(i.now), "score": score, "revision": ran_on}));
    let limit = i.evaluator["spec"]["historyLimit"].as_u64().unwrap_or(10) as usize;
    while history.len() > limit {
        history.remove(0);
    }
    v.fields
        .insert("scoreHistory".into(), Value::Array(history));
    let (s, t) = (num(score), num(threshold));
    if score >= threshold {
        v.phase = "Healthy".into();
        v.fields.insert("lastGoodRevision".into(), json!(ran_on));
        let m = format!("score {s} >= {t} at revision {ran_on}");
        v.actions
            .push(condition("Ready", true, "ScoreAboveThreshold", m));
        return;
    }
    if st
        .pointer("/lastRollback/fromRevision")
        .and_then(Value::as_i64)
        == Some(ran_on)
    {
        v.phase = "RolledBack".into();
        return;
    }
    let msg = format!("score {s} < {t} at revision {ran_on}");
    match rollback_target(i, st, ran_on) {
        None => v.degraded(
            "NoRollbackTarget",
            format!("{msg}; no earlier revision to roll back to"),
        ),
        Some(_) if !i.rollback_allowed => v.degraded(
            "RollbackLimited",
            format!("{msg}; rollback withheld by the policy's rollback limit"),
        ),
        Some(to) => {
            v.phase = "RolledBack".into();
            let dep_name = i.deployment["metadata"]["name"].as_str().unwrap_or("");
            v.actions.push(Action::Rollback {
                deployment: dep_name.into(),
                revision: Some(to),
            });
            v.fields.insert(
                "lastRollback".into(),
                json!({"fromRevision": ran_on, "toRevision": to, "time": time::format_secs(i.now), "score": score}),
            );
            let m = format!("{msg}: rolled back to revision {to}");
            v.actions
                .push(condition("Ready", false, "RolledBack", m.clone()));
            v.actions.push(event("RolledBack", m));
        }
    }
}

/// A run's Job that finished: failed, or succeeded with a score (or none).
fn finished(i: &Inputs, st: &Value, v: &mut Verdict, job: &Value) {
    let job_name = job["metadata"]["name"].as_str().unwrap_or("");
    if job_failed(job) {
        v.degraded(
            "BenchmarkFailed",
            format!("benchmark Job {job_name} failed"),
        );
        return;
    }
    let ran_on: i64 = job
        .pointer("/metadata/annotations/runbook.dev~1revision")
        .and_then(Value::as_str)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let pods: Vec<&Value> = i
        .pods
        .iter()
        .copied()
        .filter(|p| selector_matches(job, p))
        .collect();
    match read_score(&pods) {
        Err(e) => v.degraded("NoScore", e),
        Ok(score) => scored(i, st, v, score, ran_on),
    }
}

/// The alert a rolled-back or degraded Evaluator raises.
fn alert(i: &Inputs, st: &Value, v: &Verdict) -> Option<Action> {
    let ev = i.evaluator;
    let name = ev["metadata"]["name"].as_str().unwrap_or("");
    let dep_name = i.deployment["metadata"]["name"].as_str().unwrap_or("");
    let labels = ev
        .pointer("/spec/alert/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let team = labels
        .get("team")
        .and_then(Value::as_str)
        .unwrap_or(i.default_team);
    let mut base: BTreeMap<String, String> = BTreeMap::from([
        ("team".to_string(), team.to_string()),
        ("evaluator".to_string(), name.to_string()),
        ("deployment".to_string(), dep_name.to_string()),
    ]);
    for (k, val) in &labels {
        base.insert(k.clone(), val.as_str().unwrap_or_default().to_string());
    }
    let threshold = ev["spec"]["threshold"].as_f64().unwrap_or(1.0);
    let (alertname, severity, annotations) = match v.phase.as_str() {
        "RolledBack" => {
            let rb = v
                .fields
                .get("lastRollback")
                .or_else(|| st.get("lastRollback"))
                .cloned()
                .unwrap_or(Value::Null);
            let show = |x: &Value| match x {
                Value::Null => "".to_string(),
                Value::Number(n) if n.is_f64() => num(n.as_f64().unwrap_or_default()),
                other => other.to_string(),
            };
            let (from, to) = (show(&rb["fromRevision"]), show(&rb["toRevision"]));
            let summary = format!("{dep_name} rolled back from revision {from} to {to}");
            let description = format!(
                "benchmark score {} fell below the threshold {}",
                show(&rb["score"]),
                num(threshold)
            );
            let annotations = BTreeMap::from([
                ("summary".to_string(), summary),
                ("description".to_string(), description),
            ]);
            ("EvaluatorRolledBack", "critical", annotations)
        }
        "Degraded" => {
            let why = v
                .fields
                .get("lastError")
                .and_then(Value::as_str)
                .or_else(|| st.get("lastError").and_then(Value::as_str))
                .unwrap_or("degraded");
            let summary = BTreeMap::from([("summary".to_string(), format!("{name}: {why}"))]);
            ("EvaluatorDegraded", "warning", summary)
        }
        _ => return None,
    };
    base.insert("alertname".into(), alertname.into());
    base.insert("severity".into(), severity.into());
    Some(Action::Alert {
        labels: base,
        annotations,
    })
}

/// Decide for an Evaluator whose run may have finished.
pub fn decide(i: &Inputs) -> Vec<Action> {
    let st = i.evaluator.get("status").cloned().unwrap_or(json!({}));
    let current_run = st.get("currentRun").and_then(Value::as_str);
    let current = i
        .jobs
        .iter()
        .find(|j| j["metadata"]["name"].as_str() == current_run);
    let phase = st.get("phase").and_then(Value::as_str).unwrap_or("Pending");
    let mut v = Verdict {
        phase: phase.to_string(),
        fields: Map::new(),
        actions: Vec::new(),
    };
    let done = current.filter(|job| job_failed(job) || job_succeeded(job));
    if let Some(job) = done {
        finished(i, &st, &mut v, job);
        v.fields.insert("currentRun".into(), Value::Null);
        let m = "waiting for the next scheduled run".to_string();
        v.actions.push(condition("Progressing", false, "Idle", m));
    }
    v.fields.insert("phase".into(), json!(v.phase));
    v.actions.push(Action::Status {
        fields: v.fields.clone(),
    });
    if let Some(a) = alert(i, &st, &v) {
        v.actions.push(a);
    }
    v.actions
}
