//! Declarative steps: strictly in order, each starting only when the one
//! before it is ready. Progress lives in the target's status (`run`,
//! `phase`, `currentStep`, `steps`), so a restarted operator resumes at the
//! step it was on and never repeats a finished one.

use std::collections::BTreeMap;

use jiff::Timestamp;
use rhai::Dynamic;
use serde_json::{Value, json};

use super::{Observed, ScheduleState, run_id};
use crate::crd::{StepState, StepStatus};
use crate::kinds::KindRef;
use crate::policy::compile::{CompiledPolicy, CompiledRetention, CompiledStep};
use crate::script::action::{Action, ActionValue, Condition, EventType};
use crate::script::ctx::Ctx;
use crate::script::engine::{Expr, ScriptEngine};
use crate::script::error::{ScriptError, ScriptErrorKind};
use crate::script::template::{Template, scope_with};
use crate::util::time;

pub struct StepsOutcome {
    pub actions: Vec<ActionValue>,
    pub requeue_after_ms: Option<i64>,
}

fn act(action: Action) -> ActionValue {
    ActionValue { action, pos: None }
}

struct Run<'a> {
    engine: &'a ScriptEngine,
    observed: &'a Observed,
    vars: Vec<(&'static str, Dynamic)>,
    actions: Vec<ActionValue>,
}

impl Run<'_> {
    fn render(&self, t: &Template, it: &Dynamic) -> Result<Value, ScriptError> {
        let mut vars = self.vars.clone();
        vars.push(("it", it.clone()));
        let mut scope = scope_with(&vars);
        t.render(self.engine, &mut scope)
    }

    fn truth(&self, e: &Expr, it: &Dynamic, what: &str) -> Result<bool, ScriptError> {
        let mut vars = self.vars.clone();
        vars.push(("it", it.clone()));
        let mut scope = scope_with(&vars);
        let v = self.engine.eval(e, &mut scope)?;
        if v.is_unit() {
            return Ok(false);
        }
        v.as_bool().map_err(|t| ScriptError {
            file: e.file.clone(),
            pos: None,
            kind: ScriptErrorKind::Runtime,
            message: format!("{what} must be true or false, not a {t}"),
        })
    }

    fn lookup(&self, kind: &KindRef, name: &str) -> Dynamic {
        self.observed
            .view
            .get(kind, self.observed.target.acting_namespace(), name)
            .map(|o| crate::script::obj::of(&o))
            .unwrap_or(Dynamic::UNIT)
    }

    /// Emit a step's actions; returns `it`, the object the step is about,
    /// and the apply, which is only worth sending while the step waits.
    fn emit(
        &mut self,
        step: &CompiledStep,
        starting: bool,
    ) -> Result<(Dynamic, Option<ActionValue>), ScriptError> {
        let mut it = Dynamic::UNIT;
        let mut apply = None;
        if let Some((kind, t)) = &step.apply {
            let object = self.render(t, &Dynamic::UNIT)?;
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            it = self.lookup(kind, &name);
            apply = Some(act(Action::Apply { object }));
        }
        if let Some(t) = &step.status
            && let Value::Object(fields) = self.render(t, &Dynamic::UNIT)?
        {
            self.actions.push(act(Action::Status { fields }));
        }
        if let Some((kind, t)) = &step.delete {
            let name = match self.render(t, &Dynamic::UNIT)? {
                Value::String(s) => s,
                other => other.to_string(),
            };
            it = self.lookup(kind, &name);
            self.actions.push(act(Action::Delete {
                kind: crate::kinds::KindName {
                    api_version: Some(kind.api_version.clone()),
                    kind: kind.kind.clone(),
                },
                name,
                namespace: None,
            }));
        }
        if let Some(t) = &step.alert {
            let spec = self.render(t, &it)?;
            let strings = |key: &str| -> BTreeMap<String, String> {
                spec.get(key)
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| {
                                (
                                    k.clone(),
                                    v.as_str()
                                        .map(str::to_string)
                                        .unwrap_or_else(|| v.to_string()),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            };
            self.actions.push(act(Action::Alert {
                labels: strings("labels"),
                annotations: strings("annotations"),
            }));
        }
        if let Some((type_, reason, t)) = &step.event
            && starting
        {
            let message = match self.render(t, &it)? {
                Value::String(s) => s,
                other => other.to_string(),
            };
            self.actions.push(act(Action::Event {
                type_: *type_,
                reason: reason.clone(),
                message,
            }));
        }
        Ok((it, apply))
    }
}

impl Run<'_> {
    /// Delete the children of runs older than the newest `keep` (the
    /// current run always counts as kept), of every owned kind.
    fn retain(
        &mut self,
        policy: &CompiledPolicy,
        ret: &CompiledRetention,
        current: &str,
    ) -> Result<(), ScriptError> {
        let keep = match self.render(&ret.keep, &Dynamic::UNIT)? {
            Value::Null => return Ok(()),
            Value::Number(n) if n.as_u64().is_some_and(|k| k >= 1) => {
                n.as_u64().unwrap_or(1) as usize
            }
            Value::String(s) if s.parse::<usize>().is_ok_and(|k| k >= 1) => s.parse().unwrap_or(1),
            other => {
                return Err(ScriptError {
                    file: policy.file.clone(),
                    pos: None,
                    kind: ScriptErrorKind::Runtime,
                    message: format!("retention.keep must be a count of at least 1, not {other}"),
                });
            }
        };
        let target = &self.observed.target;
        let mut children = Vec::new();
        for kind in policy.kinds.with_role(crate::kinds::Role::Owns) {
            let mine = crate::observe::policy_label_value(&policy.name);
            for child in self
                .observed
                .view
                .owned_by(kind, target.acting_namespace(), target.uid())
                .into_iter()
                .filter(|c| c.is_child_of(&mine, target.uid()))
            {
                let run = child
                    .value()
                    .pointer(&format!(
                        "/metadata/labels/{}",
                        ret.label.replace('~', "~0").replace('/', "~1")
                    ))
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if let Some(run) = run {
                    children.push((kind.clone(), child.name().to_string(), run));
                }
            }
        }
        // Run ids sort in time order (schedule fire times, `once` last).
        let mut runs: Vec<&str> = children.iter().map(|(_, _, r)| r.as_str()).collect();
        runs.push(current);
        runs.sort_unstable_by(|a, b| b.cmp(a));
        runs.dedup();
        let mut kept: Vec<&str> = vec![current];
        for r in runs {
            if kept.len() >= keep {
                break;
            }
            if r != current {
                kept.push(r);
            }
        }
        let kept: Vec<String> = kept.into_iter().map(str::to_string).collect();
        for (kind, name, run) in children {
            if !kept.contains(&run) {
                self.actions.push(act(Action::Delete {
                    kind: crate::kinds::KindName {
                        api_version: Some(kind.api_version.clone()),
                        kind: kind.kind.clone(),
                    },
                    name,
                    namespace: None,
                }));
            }
        }
        Ok(())
    }
}

fn read_progress(status: &Value) -> Vec<StepStatus> {
    status
        .get("steps")
        .cloned()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default()
}

fn condition(type_: &str, status: bool, reason: &str, message: &str) -> ActionValue {
    act(Action::Condition(Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
    }))
}

/// A steps policy's body, as compiled.
pub struct Body<'a> {
    pub steps: &'a [CompiledStep],
    pub on_failure: &'a [CompiledStep],
    pub retention: Option<&'a CompiledRetention>,
}

/// Which run this reconcile works on, and whether it starts now. A fire
/// time while a run is still in progress is skipped, like a CronJob with
/// concurrencyPolicy: Forbid.
fn which_run(sched: Option<&ScheduleState>, status: &Value) -> (String, bool) {
    let running = status.get("phase").and_then(Value::as_str) == Some("Running");
    let current = status.get("run").and_then(Value::as_str);
    let once = || "once".to_string();
    match (sched, current) {
        (Some(s), _) if s.due && !running => (s.fire.map(run_id).unwrap_or_else(once), true),
        (_, Some(r)) => (r.to_string(), false),
        (None, None) => (once(), true),
        (Some(s), None) => (s.last.map(run_id).unwrap_or_else(once), true),
    }
}

/// The progress of each of the policy's steps, by name (a fresh run
/// starts with none).
fn aligned_progress(steps: &[CompiledStep], status: &Value, fresh: bool) -> Vec<StepStatus> {
    let progress = if fresh {
        Vec::new()
    } else {
        read_progress(status)
    };
    steps
        .iter()
        .map(|s| {
            progress
                .iter()
                .find(|p| p.name == s.name)
                .cloned()
                .unwrap_or(StepStatus {
                    name: s.name.clone(),
                    ..Default::default()
                })
        })
        .collect()
}

/// Where the walk through the steps stopped.
#[derive(Default)]
struct Walk {
    requeue: Option<i64>,
    /// The step that failed, and why.
    failure: Option<(usize, String)>,
    /// The step not ready yet.
    waiting_on: Option<usize>,
}

/// What became of one step's turn.
enum Turn {
    Ready,
    /// Not ready; come back after this long at the latest.
    Waiting(Option<i64>),
    Failed(String),
}

/// Run one step's turn: emit its work, then see whether it failed, is
/// ready, or is waiting (or has waited too long).
fn turn(
    r: &mut Run<'_>,
    step: &CompiledStep,
    progress: &mut StepStatus,
    now: Timestamp,
) -> Result<Turn, ScriptError> {
    let starting = progress.state == StepState::Pending;
    if starting {
        progress.state = StepState::Running;
        progress.start_time = Some(time::format(now));
        progress.end_time = None;
        progress.message = None;
    }
    let (it, apply) = r.emit(step, starting)?;
    if let Some(e) = &step.failed_when
        && r.truth(e, &it, "failedWhen")?
    {
        let message = match &step.message {
            Some(t) => match r.render(t, &it)? {
                Value::String(s) => s,
                other => other.to_string(),
            },
            None => format!("step {} failed", step.name),
        };
        return Ok(Turn::Failed(message));
    }
    let ready = match (&step.ready_when, &step.apply, &step.delete) {
        (Some(e), _, _) => r.truth(e, &it, "readyWhen")?,
        (None, Some(_), _) => !it.is_unit(),
        (None, None, Some(_)) => it.is_unit(),
        (None, None, None) => true,
    };
    // A finished step's object is left alone; one still awaited is
    // applied again, which changes nothing unless it drifted.
    if let Some(a) = apply
        && (!ready || it.is_unit())
    {
        r.actions.push(a);
    }
    if ready {
        return Ok(Turn::Ready);
    }
    let Some(limit) = step.timeout_ms else {
        return Ok(Turn::Waiting(None));
    };
    let started = progress
        .start_time
        .as_deref()
        .and_then(time::parse)
        .unwrap_or(now);
    let deadline = started.as_millisecond() + limit;
    if now.as_millisecond() >= deadline {
        let took = time::render_duration_ms(limit);
        return Ok(Turn::Failed(format!(
            "step {} timed out after {took}",
            step.name
        )));
    }
    Ok(Turn::Waiting(Some(deadline - now.as_millisecond())))
}

/// Walk the steps in order up to the first that is not done.
fn walk(
    r: &mut Run<'_>,
    steps: &[CompiledStep],
    progress: &mut [StepStatus],
    now: Timestamp,
) -> Result<Walk, ScriptError> {
    let mut w = Walk::default();
    for (i, step) in steps.iter().enumerate() {
        if progress[i].state == StepState::Succeeded {
            continue;
        }
        match turn(r, step, &mut progress[i], now)? {
            Turn::Ready => {
                progress[i].state = StepState::Succeeded;
                progress[i].end_time = Some(time::format(now));
            }
            Turn::Waiting(requeue) => {
                w.requeue = requeue;
                w.waiting_on = Some(i);
                break;
            }
            Turn::Failed(message) => {
                w.failure = Some((i, message));
                break;
            }
        }
    }
    Ok(w)
}

/// A failed run's alerts keep firing until a later run replaces it (alerts
/// resolve when a reconcile no longer raises them); its other
/// compensations ran once, when it failed.
fn alerts_of_failed_run(r: &mut Run<'_>, on_failure: &[CompiledStep]) -> Result<(), ScriptError> {
    for comp in on_failure.iter().filter(|c| c.alert.is_some()) {
        let only_alert = CompiledStep {
            name: comp.name.clone(),
            alert: comp.alert.clone(),
            apply: None,
            status: None,
            delete: None,
            event: None,
            ready_when: None,
            failed_when: None,
            timeout_ms: None,
            message: None,
        };
        if let (_, Some(a)) = r.emit(&only_alert, true)? {
            r.actions.push(a);
        }
    }
    Ok(())
}

/// The run's phase, current step and conditions (and the compensation of
/// a failed run).
fn close(
    r: &mut Run<'_>,
    body: &Body<'_>,
    w: &Walk,
    progress: &mut [StepStatus],
    fields: &mut serde_json::Map<String, Value>,
    now: Timestamp,
) -> Result<(), ScriptError> {
    let steps = body.steps;
    match (&w.failure, w.waiting_on) {
        (Some((i, message)), _) => {
            progress[*i].state = StepState::Failed;
            progress[*i].end_time = Some(time::format(now));
            progress[*i].message = Some(message.clone());
            for comp in body.on_failure {
                if let (_, Some(a)) = r.emit(comp, true)? {
                    r.actions.push(a);
                }
            }
            fields.insert("phase".into(), json!("Failed"));
            fields.insert("currentStep".into(), json!(steps[*i].name));
            r.actions
                .push(condition("Ready", false, "StepFailed", message));
            r.actions
                .push(condition("Progressing", false, "StepFailed", message));
            r.actions.push(act(Action::Event {
                type_: EventType::Warning,
                reason: "StepFailed".into(),
                message: message.clone(),
            }));
        }
        (None, Some(i)) => {
            fields.insert("phase".into(), json!("Running"));
            fields.insert("currentStep".into(), json!(steps[i].name));
            let message = format!("step {} of {}: {}", i + 1, steps.len(), steps[i].name);
            r.actions
                .push(condition("Progressing", true, "StepRunning", &message));
            r.actions
                .push(condition("Ready", false, "StepRunning", &message));
        }
        (None, None) => {
            let done = "all steps succeeded";
            fields.insert("phase".into(), json!("Completed"));
            fields.insert("currentStep".into(), Value::Null);
            r.actions.push(condition("Ready", true, "Completed", done));
            r.actions
                .push(condition("Progressing", false, "Completed", done));
        }
    }
    Ok(())
}

/// Decide a steps policy: retention first, then the steps in order.
pub fn decide(
    engine: &ScriptEngine,
    policy: &CompiledPolicy,
    body: &Body<'_>,
    observed: &Observed,
    ctx: &Ctx,
    sched: Option<&ScheduleState>,
) -> Result<StepsOutcome, ScriptError> {
    let now: Timestamp = observed.now;
    let status = observed
        .target
        .value()
        .get("status")
        .cloned()
        .unwrap_or(Value::Null);
    let phase = status.get("phase").and_then(Value::as_str).unwrap_or("");
    let (run, fresh) = which_run(sched, &status);
    let mut progress = aligned_progress(body.steps, &status, fresh);
    let mut r = Run {
        engine,
        observed,
        vars: vec![
            ("resource", crate::script::obj::of(&observed.target)),
            ("ctx", Dynamic::from(ctx.clone())),
            ("params", policy.params_dyn.clone()),
            ("run", Dynamic::from(run.clone())),
        ],
        actions: Vec::new(),
    };
    if let Some(ret) = body.retention {
        r.retain(policy, ret, &run)?;
    }
    if !fresh && (phase == "Completed" || phase == "Failed") {
        if phase == "Failed" {
            alerts_of_failed_run(&mut r, body.on_failure)?;
        }
        return Ok(StepsOutcome {
            actions: r.actions,
            requeue_after_ms: None,
        });
    }
    let w = walk(&mut r, body.steps, &mut progress, now)?;
    let mut fields = serde_json::Map::new();
    fields.insert("run".into(), json!(run));
    close(&mut r, body, &w, &mut progress, &mut fields, now)?;
    fields.insert(
        "steps".into(),
        serde_json::to_value(&progress).unwrap_or(Value::Null),
    );
    r.actions.push(act(Action::Status { fields }));
    Ok(StepsOutcome {
        actions: r.actions,
        requeue_after_ms: w.requeue,
    })
}
