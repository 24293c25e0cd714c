//! The evaluator rule written directly in Rust: the baseline the scripted
//! policy is measured against. For a finished benchmark run it reads the
//! same objects and produces the same actions as `policies/evaluator-drift.rhai`
//! (a test holds the two to that), so the comparison is like for like.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::script::action::{Action, Condition, EventType};
use crate::script::helpers::{job_failed, job_succeeded, revision_of, termination_message};
use crate::util::time;

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
        let parsed: Value = serde_json::from_str(&msg)
            .map_err(|_| format!("benchmark message is not JSON or a number: {msg}"))?;
        return parsed
            .as_f64()
            .or_else(|| parsed.get("score").and_then(Value::as_f64))
            .ok_or_else(|| format!("benchmark message has no numeric score: {msg}"));
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

/// Decide for an Evaluator whose run may have finished.
pub fn decide(i: &Inputs) -> Vec<Action> {
    let ev = i.evaluator;
    let st = ev.get("status").cloned().unwrap_or(json!({}));
    let name = ev["metadata"]["name"].as_str().unwrap_or("");
    let threshold = ev["spec"]["threshold"].as_f64().unwrap_or(1.0);
    let labels = ev
        .pointer("/spec/alert/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let team = labels
        .get("team")
        .and_then(Value::as_str)
        .unwrap_or(i.default_team)
        .to_string();
    let dep_name = i.deployment["metadata"]["name"].as_str().unwrap_or("");
    let mut actions = Vec::new();
    let mut fields = Map::new();
    let current_run = st.get("currentRun").and_then(Value::as_str);
    let current = i
        .jobs
        .iter()
        .find(|j| j["metadata"]["name"].as_str() == current_run);
    let mut phase = st
        .get("phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
        .to_string();
    let mut finished = false;
    if let Some(job) = current {
        let job_name = job["metadata"]["name"].as_str().unwrap_or("");
        if job_failed(job) {
            phase = "Degraded".into();
            finished = true;
            let msg = format!("benchmark Job {job_name} failed");
            fields.insert("lastError".into(), json!(msg));
            actions.push(condition("Ready", false, "BenchmarkFailed", msg.clone()));
            actions.push(event("BenchmarkFailed", msg));
        } else if job_succeeded(job) {
            finished = true;
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
                Err(e) => {
                    phase = "Degraded".into();
                    fields.insert("lastError".into(), json!(e));
                    actions.push(condition("Ready", false, "NoScore", e.clone()));
                    actions.push(event("NoScore", e));
                }
                Ok(score) => {
                    fields.insert("lastScore".into(), json!(score));
                    fields.insert("lastError".into(), Value::Null);
                    let mut history = st
                        .get("scoreHistory")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    history.push(json!({"time": time::format_secs(i.now), "score": score, "revision": ran_on}));
                    let limit = ev["spec"]["historyLimit"].as_u64().unwrap_or(10) as usize;
                    while history.len() > limit {
                        history.remove(0);
                    }
                    fields.insert("scoreHistory".into(), Value::Array(history));
                    let (s, t) = (num(score), num(threshold));
                    if score >= threshold {
                        phase = "Healthy".into();
                        fields.insert("lastGoodRevision".into(), json!(ran_on));
                        actions.push(condition(
                            "Ready",
                            true,
                            "ScoreAboveThreshold",
                            format!("score {s} >= {t} at revision {ran_on}"),
                        ));
                    } else if st
                        .pointer("/lastRollback/fromRevision")
                        .and_then(Value::as_i64)
                        == Some(ran_on)
                    {
                        phase = "RolledBack".into();
                    } else {
                        let last_good = st.get("lastGoodRevision").and_then(Value::as_i64);
                        let dep_uid = i.deployment["metadata"]["uid"].as_str();
                        let revisions: Vec<i64> = i
                            .replicasets
                            .iter()
                            .filter(|rs| crate::observe::owner_uids(rs).any(|u| Some(u) == dep_uid))
                            .filter_map(|rs| revision_of(rs))
                            .collect();
                        let to = match last_good {
                            Some(g) if g != ran_on && revisions.contains(&g) => Some(g),
                            _ => revisions.iter().copied().filter(|r| *r < ran_on).max(),
                        };
                        let msg = format!("score {s} < {t} at revision {ran_on}");
                        match to {
                            None => {
                                phase = "Degraded".into();
                                let e = format!("{msg}; no earlier revision to roll back to");
                                fields.insert("lastError".into(), json!(e));
                                actions.push(condition(
                                    "Ready",
                                    false,
                                    "NoRollbackTarget",
                                    e.clone(),
                                ));
                                actions.push(event("NoRollbackTarget", e));
                            }
                            Some(_) if !i.rollback_allowed => {
                                phase = "Degraded".into();
                                let e = format!(
                                    "{msg}; rollback withheld by the policy's rollback limit"
                                );
                                fields.insert("lastError".into(), json!(e));
                                actions.push(condition(
                                    "Ready",
                                    false,
                                    "RollbackLimited",
                                    e.clone(),
                                ));
                                actions.push(event("RollbackLimited", e));
                            }
                            Some(to) => {
                                phase = "RolledBack".into();
                                actions.push(Action::Rollback {
                                    deployment: dep_name.into(),
                                    revision: Some(to),
                                });
                                fields.insert(
                                    "lastRollback".into(),
                                    json!({"fromRevision": ran_on, "toRevision": to, "time": time::format_secs(i.now), "score": score}),
                                );
                                let m = format!("{msg}: rolled back to revision {to}");
                                actions.push(condition("Ready", false, "RolledBack", m.clone()));
                                actions.push(event("RolledBack", m));
                            }
                        }
                    }
                }
            }
        }
    }
    if finished {
        fields.insert("currentRun".into(), Value::Null);
        actions.push(condition(
            "Progressing",
            false,
            "Idle",
            "waiting for the next scheduled run".into(),
        ));
    }
    fields.insert("phase".into(), json!(phase));
    actions.push(Action::Status {
        fields: fields.clone(),
    });
    let mut base: BTreeMap<String, String> = BTreeMap::from([
        ("team".to_string(), team),
        ("evaluator".to_string(), name.to_string()),
        ("deployment".to_string(), dep_name.to_string()),
    ]);
    for (k, v) in &labels {
        base.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
    }
    if phase == "RolledBack" {
        let rb = fields
            .get("lastRollback")
            .or_else(|| st.get("lastRollback"))
            .cloned()
            .unwrap_or(Value::Null);
        let show = |v: &Value| match v {
            Value::Null => "".to_string(),
            Value::Number(n) if n.is_f64() => num(n.as_f64().unwrap_or_default()),
            other => other.to_string(),
        };
        let mut l = base.clone();
        l.insert("alertname".into(), "EvaluatorRolledBack".into());
        l.insert("severity".into(), "critical".into());
        let annotations = BTreeMap::from([
            (
                "summary".to_string(),
                format!(
                    "{dep_name} rolled back from revision {} to {}",
                    show(&rb["fromRevision"]),
                    show(&rb["toRevision"])
                ),
            ),
            (
                "description".to_string(),
                format!(
                    "benchmark score {} fell below the threshold {}",
                    show(&rb["score"]),
                    num(threshold)
                ),
            ),
        ]);
        actions.push(Action::Alert {
            labels: l,
            annotations,
        });
    } else if phase == "Degraded" {
        let mut l = base;
        l.insert("alertname".into(), "EvaluatorDegraded".into());
        l.insert("severity".into(), "warning".into());
        let why = fields
            .get("lastError")
            .and_then(Value::as_str)
            .or_else(|| st.get("lastError").and_then(Value::as_str))
            .unwrap_or("degraded");
        let annotations = BTreeMap::from([("summary".to_string(), format!("{name}: {why}"))]);
        actions.push(Action::Alert {
            labels: l,
            annotations,
        });
    }
    actions
}
