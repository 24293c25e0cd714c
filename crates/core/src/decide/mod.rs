//! `decide`: from what is observed to what should be done. Pure and
//! synchronous: no I/O, no clock but the `now` it is given, so every policy
//! can be tested offline and the same inputs always give the same decision.

pub mod previous;
mod steps;

use std::sync::Arc;

use jiff::Timestamp;
use rhai::{Array, Dynamic};
use serde_json::Value;

use crate::failure::{Cause, Refusal, Refused};
use crate::kinds::{KindRef, Role};
use crate::observe::{CachedObject, ObjectView};
use crate::policy::compile::{Body, CompiledPolicy, ScheduleSource};
use crate::policy::limits::{Recent, Verb};
use crate::policy::model::Mode;
use crate::schedule::Schedule;
use crate::script::action::{Action, ActionValue};
use crate::script::ctx::{Ctx, CtxData, Timely, Times};
use crate::script::engine::ScriptEngine;
use crate::script::error::ScriptError;
use crate::script::obj::TargetReads;
use crate::util::time;

/// Everything a decision may look at.
#[derive(Clone)]
pub struct Observed {
    pub target: Arc<CachedObject>,
    pub view: Arc<dyn ObjectView>,
    pub now: Timestamp,
    /// The readings of `spec.metrics` the runtime asked for, by name.
    pub readings: std::collections::BTreeMap<String, crate::metric::Asked>,
}

/// One planned action and, when it may not be carried out, why.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub action: Action,
    /// `file:line:col` of the call that made it, for scripts.
    pub origin: Option<String>,
    /// Set when the policy may not do this (undeclared kind, other namespace).
    pub refusal: Option<Refusal>,
}

/// What a policy decided for one target.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub policy: String,
    pub policy_version: String,
    pub mode: Mode,
    pub actions: Vec<Planned>,
    /// Reconcile again after this long at the latest.
    pub requeue_after_ms: Option<i64>,
    /// Hash of the target's spec and metadata, its children and the schedule.
    pub inputs_hash: String,
    /// Whether the schedule fired for this reconcile.
    pub due: bool,
    /// What the script read of the target.
    pub target_reads: TargetReads,
    /// The metric readings the script read, for its record.
    pub metrics: Vec<(String, crate::metric::Asked)>,
}

impl Decision {
    /// Actions that were not refused.
    pub fn allowed(&self) -> impl Iterator<Item = &Planned> {
        self.actions.iter().filter(|p| p.refusal.is_none())
    }

    pub fn refused(&self) -> impl Iterator<Item = &Planned> {
        self.actions.iter().filter(|p| p.refusal.is_some())
    }
}

/// Why a decision could not be made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DecideError {
    #[error("{0}")]
    Script(#[from] ScriptError),
    #[error("{policy}: schedule: {message}")]
    Schedule { policy: String, message: String },
}

impl DecideError {
    pub fn cause(&self) -> Cause {
        match self {
            DecideError::Script(e) => Cause::Script(e.kind),
            DecideError::Schedule { .. } => Cause::Schedule,
        }
    }
}

/// Where a policy's schedules stand for one target: each schedule's own
/// state (one, unnamed, for `spec.schedule`), and their sum.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleState {
    /// Whether any schedule fired.
    pub due: bool,
    /// The latest fire time this reconcile runs for (when due).
    pub fire: Option<Timestamp>,
    /// The latest run of any schedule.
    pub last: Option<Timestamp>,
    /// The earliest next fire time of any schedule.
    pub next: Option<Timestamp>,
    /// Each schedule's state, in the policy's order.
    pub timers: Vec<TimerState>,
}

impl ScheduleState {
    /// The names of the named schedules that fired.
    pub fn fired(&self) -> Vec<String> {
        self.timers
            .iter()
            .filter(|t| t.due)
            .filter_map(|t| t.name.clone())
            .collect()
    }
}

/// Where one schedule stands for one target.
#[derive(Clone, Debug, PartialEq)]
pub struct TimerState {
    pub name: Option<String>,
    pub due: bool,
    /// The fire time this reconcile runs for (when due).
    pub fire: Option<Timestamp>,
    pub last: Option<Timestamp>,
    pub next: Option<Timestamp>,
}

/// An identifier for a run, from its fire time, usable in object names.
pub fn run_id(t: Timestamp) -> String {
    // `2026-11-29T10:00:00Z` -> `20261129-100000`.
    let text = time::format(t);
    match text.as_bytes() {
        // `YYYY-MM-DDTHH:MM:SSZ`: its digits, a dash between day and time.
        [y @ .., b'Z'] if y.len() == 19 => [
            &y[0..4],
            &y[5..7],
            &y[8..10],
            b"-",
            &y[11..13],
            &y[14..16],
            &y[17..19],
        ]
        .iter()
        .map(|part| String::from_utf8_lossy(part))
        .collect(),
        _ => t.strftime("%Y%m%d-%H%M%S").to_string(),
    }
}

fn field<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k.as_str()))
}

fn status_time(target: &Value, key: &str) -> Option<Timestamp> {
    target
        .get("status")
        .and_then(|s| s.get(key))
        .and_then(Value::as_str)
        .and_then(time::parse)
}

/// Compute the schedule state: a schedule is due when a fire time passed
/// since its last run (or there was never a run). However many fire times
/// were missed, the run happens once. `None`: the policy has no schedule,
/// or none applies to this target (no expression in its field and no
/// default).
pub fn schedule_state(
    policy: &CompiledPolicy,
    target: &Value,
    now: Timestamp,
) -> Result<Option<ScheduleState>, DecideError> {
    let suspended = target
        .get("spec")
        .and_then(|s| s.get("suspend"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // The first run belongs to the target's creation, not to "now": a
    // reconcile that sees a stale cache then names the same run.
    let created = target
        .get("metadata")
        .and_then(|m| m.get("creationTimestamp"))
        .and_then(Value::as_str)
        .and_then(time::parse)
        .filter(|c| *c <= now)
        .unwrap_or(now);
    let mut timers = Vec::new();
    for timer in &policy.schedules {
        let Some(schedule) = timer_schedule(policy, timer, target, (created, now))? else {
            continue;
        };
        let last = match &timer.name {
            None => status_time(target, "lastRunTime"),
            Some(name) => target
                .pointer("/status/schedules")
                .and_then(|s| s.get(name))
                .and_then(|s| s.get("lastRunTime"))
                .and_then(Value::as_str)
                .and_then(time::parse),
        };
        let (due, fire) = match last {
            _ if suspended => (false, None),
            // An idle timer's first run waits for the target to be idle.
            None if timer.first_run == crate::policy::model::FirstRun::Creation
                && !matches!(
                    timer.source,
                    ScheduleSource::Every {
                        idle_ms: Some(_),
                        ..
                    }
                ) =>
            {
                (true, Some(created))
            }
            // The first fire time after the creation, once it has come.
            None => match schedule.last_at_or_before(created, now) {
                Some(f) => (true, Some(f)),
                None => (false, None),
            },
            Some(last) => match schedule.last_at_or_before(last, now) {
                Some(f) => (true, Some(f)),
                None => (false, None),
            },
        };
        let next = schedule.next_after(fire.unwrap_or(now).max(now));
        timers.push(TimerState {
            name: timer.name.clone(),
            due,
            fire,
            last,
            next,
        });
    }
    if timers.is_empty() {
        return Ok(None);
    }
    Ok(Some(ScheduleState {
        due: timers.iter().any(|t| t.due),
        fire: timers.iter().filter_map(|t| t.fire).max(),
        last: timers.iter().filter_map(|t| t.last).max(),
        next: timers.iter().filter_map(|t| t.next).min(),
        timers,
    }))
}

/// The schedule one timer follows for this target; `None` when it reads
/// the expression from a field the target leaves empty and has no default.
fn timer_schedule<'a>(
    policy: &CompiledPolicy,
    timer: &'a crate::policy::compile::Timer,
    target: &Value,
    (created, now): (Timestamp, Timestamp),
) -> Result<Option<Picked<'a>>, DecideError> {
    match &timer.source {
        ScheduleSource::Fixed(s) => Ok(Some(Picked::Fixed(s))),
        ScheduleSource::Every { every_ms, idle_ms } => {
            // Idle: from the last change of a declared field, which is
            // now when this decision sees one (or sees the target first).
            let anchor = match idle_ms {
                Some(idle) => {
                    let last = previous::last(target, &policy.name);
                    let changed = if previous::changed(&policy.previous, last.kept.as_ref(), target)
                        .is_empty()
                    {
                        last.changed_at.unwrap_or(created)
                    } else {
                        now
                    };
                    // On a whole second, as the run times status keeps.
                    let at = time::add_ms(changed, *idle).as_millisecond();
                    let up = at.div_euclid(1000) + i64::from(at.rem_euclid(1000) > 0);
                    Timestamp::from_second(up).unwrap_or(Timestamp::MAX)
                }
                None => created,
            };
            Ok(Some(Picked::Every {
                anchor,
                every_ms: *every_ms,
            }))
        }
        ScheduleSource::FromField {
            path,
            default,
            parsed: known,
        } => match field(target, path).and_then(Value::as_str) {
            Some(expr) => known
                .get(expr)
                .map(|s| Some(Picked::Parsed(s)))
                .map_err(|message| {
                    let which = timer
                        .name
                        .as_ref()
                        .map(|n| format!("{n}: "))
                        .unwrap_or_default();
                    DecideError::Schedule {
                        policy: policy.name.clone(),
                        message: format!("{which}{}: {message}", path.join(".")),
                    }
                }),
            None => Ok(default.as_ref().map(Picked::Fixed)),
        },
    }
}

/// A schedule found for one target: the policy's own, or one parsed
/// from the target's field.
enum Picked<'a> {
    Fixed(&'a Schedule),
    Parsed(Arc<Schedule>),
    /// Fire times `anchor + k * every_ms`, for k from 0.
    Every {
        anchor: Timestamp,
        every_ms: i64,
    },
}

impl Picked<'_> {
    /// The first fire time after `t`.
    fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Picked::Fixed(s) => s.next_after(t),
            Picked::Parsed(s) => s.next_after(t),
            Picked::Every { anchor, every_ms } => {
                let since = t.as_millisecond() - anchor.as_millisecond();
                if since < 0 {
                    return Some(*anchor);
                }
                let k = since / every_ms + 1;
                Some(time::add_ms(*anchor, k.saturating_mul(*every_ms)))
            }
        }
    }

    /// The latest fire time after `since` and at or before `t`.
    fn last_at_or_before(&self, since: Timestamp, t: Timestamp) -> Option<Timestamp> {
        match self {
            Picked::Fixed(s) => s.last_at_or_before(since, t),
            Picked::Parsed(s) => s.last_at_or_before(since, t),
            Picked::Every { anchor, every_ms } => {
                let passed = t.as_millisecond() - anchor.as_millisecond();
                if passed < 0 {
                    return None;
                }
                let fire = time::add_ms(*anchor, (passed / every_ms) * every_ms);
                (fire > since).then_some(fire)
            }
        }
    }
}

/// The hash of what a decision depends on that is the target's own: its
/// spec and identifying metadata, and the schedule. The status is left out
/// (it is the decision's own memory) and so are children and read objects,
/// whose every change (a Job's progress, a Pod's readiness) would otherwise
/// turn into a status write on the target.
pub fn inputs_hash(
    policy: &CompiledPolicy,
    observed: &Observed,
    sched: Option<&ScheduleState>,
) -> String {
    use crate::util::hash::Fnv64;
    use std::hash::Hasher;
    let mut h = Fnv64::resume(observed.target.own_hash());
    h.write(policy.version.as_bytes());
    for t in sched.iter().flat_map(|s| &s.timers) {
        h.write_u8(t.due as u8);
        h.write_i64(t.fire.map_or(0, |f| f.as_second()));
    }
    format!("{:016x}", h.finish())
}

/// Why an object of kind `k` in `obj_ns` may not be written for a target
/// in `target_ns`: a cluster-scoped kind, or a namespace neither the
/// target's nor one of `writable`.
fn namespace_refusal(
    k: &KindRef,
    obj_ns: Option<&str>,
    target_ns: &str,
    writable: &[String],
) -> Option<Refused> {
    if !k.namespaced() {
        return Some(Refused::ClusterScoped { kind: k.clone() });
    }
    match obj_ns {
        Some(ns) if !ns.is_empty() && ns != target_ns && !writable.iter().any(|w| w == ns) => {
            Some(Refused::OtherNamespace {
                kind: k.clone(),
                namespace: ns.to_string(),
                target: target_ns.to_string(),
            })
        }
        _ => None,
    }
}

/// Why an action may not be taken by this policy on this target, if so.
/// `writable`: the other namespaces the policy may make children in
/// (`observe::namespaces_matching` of its `spec.namespaces`).
pub fn check_permission(
    policy: &CompiledPolicy,
    target_ns: &str,
    action: &Action,
    writable: &[String],
) -> Option<Refused> {
    let kinds = &policy.kinds;
    let refuse_kind = |kind: &KindRef, verb, roles| {
        Some(Refused::Undeclared {
            verb,
            kind: kind.clone(),
            roles,
        })
    };
    if policy.sweep
        && let Some(refusal) = sweep_refusal(policy, action)
    {
        return refusal;
    }
    let check_ns =
        |obj_ns: Option<&str>, k: &KindRef| namespace_refusal(k, obj_ns, target_ns, writable);
    let unknown = |verb, error: String| Some(Refused::UnknownKind { verb, error });
    match action {
        Action::Apply { object } => {
            let k = KindRef::new(
                object["apiVersion"].as_str().unwrap_or_default(),
                object["kind"].as_str().unwrap_or_default(),
            );
            if !kinds.has(&k, Role::Owns) {
                return refuse_kind(&k, "apply", "owns");
            }
            check_ns(object["metadata"]["namespace"].as_str(), &k)
        }
        Action::Delete {
            kind, namespace, ..
        } => match kinds.resolve(kind) {
            // In another namespace only its own children (the planner
            // checks that it made the object), where it may make them.
            Ok(k) if namespace.as_deref().is_some_and(|n| n != target_ns) => {
                match (kinds.has(&k, Role::Owns), &policy.namespaces) {
                    (true, Some(_)) => check_ns(None, &k),
                    (true, None) => check_ns(namespace.as_deref(), &k),
                    (false, _) => refuse_kind(&k, "delete", "owns"),
                }
            }
            Ok(k) if kinds.has(&k, Role::Owns) || kinds.has(&k, Role::Deletes) => {
                check_ns(None, &k)
            }
            Ok(k) => refuse_kind(&k, "delete", "owns or deletes"),
            Err(e) => unknown("delete", e),
        },
        Action::Patch {
            kind, namespace, ..
        } => match kinds.resolve(kind) {
            Ok(k) if kinds.has(&k, Role::Owns) || kinds.has(&k, Role::Mutates) => {
                check_ns(namespace.as_deref(), &k)
            }
            Ok(k) => refuse_kind(&k, "patch", "owns or mutates"),
            Err(e) => unknown("patch", e),
        },
        Action::Rollback { .. } => {
            let k = KindRef::new("apps/v1", "Deployment");
            if kinds.has(&k, Role::Mutates) {
                None
            } else {
                refuse_kind(&k, "rollback", "mutates")
            }
        }
        Action::Status { fields } => {
            let claim = &policy.status;
            let outside: Vec<String> = fields
                .keys()
                .filter(|f| !claim.allows_field(f))
                .cloned()
                .collect();
            (!outside.is_empty()).then_some(Refused::StatusFields { fields: outside })
        }
        Action::Condition(c) if !policy.status.allows_condition(&c.type_) => {
            Some(Refused::Condition {
                type_: c.type_.clone(),
            })
        }
        _ => None,
    }
}

/// What a sweep decides over: every object of its target kind that it
/// selects, in the one namespace a tenant's policy acts in or in all.
pub fn swept(policy: &CompiledPolicy, view: &dyn ObjectView) -> Vec<Arc<CachedObject>> {
    let mut all = view.every(&policy.target);
    all.retain(|o| policy.selects(o.value()) && policy.acts_in(o.namespace()));
    all
}

/// A sweep's delete or patch of one of its targets: `Some(None)` when it
/// may (it declares the verb in `spec.deletes` or `spec.mutates`, and the
/// object is where the policy acts: a tenant's own namespace, or for a
/// cluster-wide policy any), `Some(Some(why))` when not; `None` for
/// anything else, checked as for any policy (in the namespace its record
/// is kept in).
fn sweep_refusal(policy: &CompiledPolicy, action: &Action) -> Option<Option<Refused>> {
    let (kind, namespace, verb, role, roles) = match action {
        Action::Delete {
            kind, namespace, ..
        } => (kind, namespace, "delete", Role::Deletes, "deletes"),
        Action::Patch {
            kind, namespace, ..
        } => (kind, namespace, "patch", Role::Mutates, "mutates"),
        _ => return None,
    };
    let k = policy.kinds.resolve(kind).ok()?;
    if k != policy.target {
        return None;
    }
    if !policy.kinds.has(&k, role) {
        return Some(Some(Refused::Undeclared {
            verb,
            kind: k,
            roles,
        }));
    }
    let Some(tenant) = &policy.tenant else {
        return Some(None);
    };
    if !k.namespaced() {
        return Some(Some(Refused::ClusterScoped { kind: k }));
    }
    match namespace.as_deref() {
        Some(ns) if ns != tenant => Some(Some(Refused::OtherNamespace {
            kind: k,
            namespace: ns.to_string(),
            target: tenant.clone(),
        })),
        _ => Some(None),
    }
}

fn build_ctx(policy: &CompiledPolicy, observed: &Observed, sched: Option<&ScheduleState>) -> Ctx {
    let run = match sched {
        Some(s) => s
            .fire
            .or(s.last)
            .map(run_id)
            .unwrap_or_else(|| "once".into()),
        None => "once".into(),
    };
    let limited = {
        let recent = Recent::of(observed.target.value(), &policy.name);
        Verb::ALL
            .into_iter()
            .filter(|v| !recent.allows(&policy.limits, *v, observed.now))
            .map(|v| v.as_str().to_string())
            .collect()
    };
    Ctx(Arc::new(CtxData {
        resource: crate::script::obj::of(&observed.target),
        params: policy.params_dyn.clone(),
        timely: Timely::new(
            observed.now.as_second(),
            Times {
                due: sched.is_some_and(|s| s.due),
                fired: sched.map(ScheduleState::fired).unwrap_or_default(),
                next_run: sched.and_then(|s| s.next).map(|t| t.as_second()),
                last_run: sched.and_then(|s| s.last).map(|t| t.as_second()),
                run,
            },
            limited,
        ),
        policy_name: policy.name.clone(),
        policy_version: policy.version.clone(),
        namespace: observed.target.acting_namespace().to_string(),
        target_uid: observed.target.uid().to_string(),
        view: observed.view.clone(),
        kinds: policy.kinds.clone(),
        namespaces: policy.namespaces.as_ref().map(|(s, _)| s.clone()),
        previous: previous_of(policy, observed.target.value()),
        targets: policy.sweep.then(|| swept(policy, observed.view.as_ref())),
        metrics: Arc::new(crate::metric::Readings::new(
            policy.metrics.iter().map(|m| m.name.clone()).collect(),
            observed.readings.clone(),
        )),
    }))
}

/// `ctx.previous` and `ctx.changed` for a decision on `target`.
fn previous_of(policy: &CompiledPolicy, target: &Value) -> crate::script::ctx::Previous {
    if policy.previous.is_empty() {
        return Default::default();
    }
    let last = previous::last(target, &policy.name);
    crate::script::ctx::Previous {
        changed_at: last.changed_at.map(|t| t.as_second()),
        declared: policy.previous.clone(),
        changed: previous::changed(&policy.previous, last.kept.as_ref(), target),
        last: last.kept.map_or(Dynamic::UNIT, |l| {
            crate::script::obj::view(Arc::new(previous::as_object(&l)))
        }),
    }
}

/// The most actions one decision may take.
pub const MAX_ACTIONS: usize = 1_000;
/// The most Events one decision may record.
pub const MAX_EVENTS: usize = 100;
/// The most status one decision may write, as JSON (the API server takes
/// about 1.5 MB for a whole object, and the decision record goes beside).
pub const MAX_STATUS_BYTES: usize = 256 * 1024;

/// Flatten what a script returned into actions, within a decision's caps.
fn collect(
    file: &str,
    fn_pos: Option<crate::util::yaml::Pos>,
    name: &str,
    result: Dynamic,
) -> Result<Vec<ActionValue>, ScriptError> {
    let mut c = Collected {
        file,
        fn_pos,
        name,
        out: Vec::new(),
        events: 0,
        status_bytes: 0,
    };
    c.walk(result)?;
    Ok(c.out)
}

/// The actions found so far, and what counts against the caps.
struct Collected<'a> {
    file: &'a str,
    fn_pos: Option<crate::util::yaml::Pos>,
    name: &'a str,
    out: Vec<ActionValue>,
    events: usize,
    status_bytes: usize,
}

impl Collected<'_> {
    fn walk(&mut self, v: Dynamic) -> Result<(), ScriptError> {
        if v.is_unit() {
            return Ok(());
        }
        if v.is_array() {
            for item in v.cast::<Array>() {
                self.walk(item)?;
            }
            return Ok(());
        }
        let type_name = v.type_name().to_string();
        let name = self.name;
        let Some(a) = v.try_cast::<ActionValue>() else {
            return Err(ScriptError::bad_result(
                self.file,
                self.fn_pos,
                format!(
                    "{name} returned a {type_name} at position {}; want an array of actions such as apply(obj), status(map) or alert(map)",
                    self.out.len()
                ),
            ));
        };
        let over = |message: String| {
            Err(ScriptError::bad_result(
                self.file,
                a.pos.or(self.fn_pos),
                format!("{message}; nothing of it was done"),
            ))
        };
        if self.out.len() >= MAX_ACTIONS {
            return over(format!(
                "{name} returned more than {MAX_ACTIONS} actions, the most one decision may take"
            ));
        }
        match &a.action {
            Action::Event { .. } => {
                self.events += 1;
                if self.events > MAX_EVENTS {
                    return over(format!(
                        "{name} returned more than {MAX_EVENTS} Events, the most one decision may record"
                    ));
                }
            }
            Action::Status { fields } => {
                self.status_bytes += serde_json::to_vec(fields).map_or(0, |v| v.len());
                if self.status_bytes > MAX_STATUS_BYTES {
                    return over(format!(
                        "{name} returned {} bytes of status fields, more than the {MAX_STATUS_BYTES} one decision may write (an object's status shares the API server's size limit with the rest of it)",
                        self.status_bytes
                    ));
                }
            }
            _ => {}
        }
        self.out.push(a);
        Ok(())
    }
}

fn plan(
    policy: &CompiledPolicy,
    target_ns: &str,
    view: &dyn ObjectView,
    file: Option<&str>,
    values: Vec<ActionValue>,
) -> Vec<Planned> {
    // Looked up once for the decision, not once per action.
    let writable = match &policy.namespaces {
        Some((selector, _)) => crate::observe::namespaces_matching(view, selector),
        None => Vec::new(),
    };
    values
        .into_iter()
        .map(|a| {
            let origin = match (file, a.pos) {
                (Some(f), Some(p)) => Some(format!("{f}:{}:{}", p.line, p.col)),
                (Some(f), None) => Some(f.to_string()),
                _ => None,
            };
            let refusal =
                check_permission(policy, target_ns, &a.action, &writable).map(|why| Refusal {
                    why,
                    origin: origin.clone(),
                });
            Planned {
                action: a.action,
                origin,
                refusal,
            }
        })
        .collect()
}

/// The status a schedule keeps: `lastRunTime` (when it fired) and
/// `nextRunTime`, at the top for `spec.schedule`, under
/// `schedules.<name>` for named ones (every declared name, so the map is
/// written whole and a schedule removed from the policy leaves it).
fn schedule_fields(s: &ScheduleState, target: &Value) -> serde_json::Map<String, Value> {
    let times = |t: &TimerState, out: &mut serde_json::Map<String, Value>| {
        if t.due
            && let Some(f) = t.fire
        {
            out.insert("lastRunTime".into(), Value::String(time::format(f)));
        }
        if let Some(n) = t.next {
            out.insert("nextRunTime".into(), Value::String(time::format(n)));
        }
    };
    let mut fields = serde_json::Map::new();
    let mut named = serde_json::Map::new();
    for t in &s.timers {
        match &t.name {
            None => times(t, &mut fields),
            Some(name) => {
                let mut entry = target
                    .pointer("/status/schedules")
                    .and_then(|m| m.get(name))
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                times(t, &mut entry);
                named.insert(name.clone(), Value::Object(entry));
            }
        }
    }
    if !named.is_empty() {
        fields.insert(
            crate::policy::claim::NAMED_SCHEDULE_FIELD.into(),
            Value::Object(named),
        );
    }
    fields
}

fn finish(
    policy: &CompiledPolicy,
    observed: &Observed,
    sched: Option<ScheduleState>,
    mut actions: Vec<Planned>,
    mut requeue: Option<i64>,
) -> Decision {
    let now = observed.now;
    if let Some(s) = &sched {
        let fields = schedule_fields(s, observed.target.value());
        if let Some(n) = s.next {
            let wait = (n.as_millisecond() - now.as_millisecond()).max(1);
            requeue = Some(requeue.map_or(wait, |r| r.min(wait)));
        }
        if !fields.is_empty() {
            actions.push(Planned {
                action: Action::Status { fields },
                origin: None,
                refusal: None,
            });
        }
    }
    for p in &actions {
        if let (Action::Requeue { after_ms }, None) = (&p.action, &p.refusal) {
            requeue = Some(requeue.map_or(*after_ms, |r| r.min(*after_ms)));
        }
    }
    Decision {
        policy: policy.name.clone(),
        policy_version: policy.version.clone(),
        mode: policy.mode,
        inputs_hash: inputs_hash(policy, observed, sched.as_ref()),
        due: sched.as_ref().is_some_and(|s| s.due),
        actions,
        requeue_after_ms: requeue,
        target_reads: TargetReads::default(),
        metrics: Vec::new(),
    }
}

/// Decide what to do for one target.
pub fn decide(
    engine: &ScriptEngine,
    policy: &CompiledPolicy,
    observed: &Observed,
) -> Result<Decision, DecideError> {
    decide_wanting(engine, policy, observed).0
}

/// Decide, and say which metrics the script asked for that `observed`
/// did not hold (whether or not the decision was made): the runtime asks
/// for them and decides again.
pub fn decide_wanting(
    engine: &ScriptEngine,
    policy: &CompiledPolicy,
    observed: &Observed,
) -> (Result<Decision, DecideError>, Vec<String>) {
    let sched = match schedule_state(policy, observed.target.value(), observed.now) {
        Ok(s) => s,
        Err(e) => return (Err(e), Vec::new()),
    };
    let ctx = build_ctx(policy, observed, sched.as_ref());
    let readings = ctx.0.metrics.clone();
    let decision = decide_with(engine, policy, observed, ctx, sched);
    let (read, wanted) = readings.take();
    (
        decision.map(|mut d| {
            d.metrics = read;
            d
        }),
        wanted,
    )
}

fn decide_with(
    engine: &ScriptEngine,
    policy: &CompiledPolicy,
    observed: &Observed,
    ctx: Ctx,
    sched: Option<ScheduleState>,
) -> Result<Decision, DecideError> {
    let ns = observed.target.acting_namespace().to_string();
    match &policy.body {
        Body::Script { script, .. } => {
            let target = observed.target.shared();
            let (result, reads) =
                crate::script::obj::recording(&target, || engine.call(script, "reconcile", (ctx,)));
            let values = collect(
                &script.file,
                script.fn_pos("reconcile"),
                "reconcile",
                result?,
            )?;
            let actions = plan(policy, &ns, &*observed.view, Some(&script.file), values);
            let mut decision = finish(policy, observed, sched, actions, None);
            decision.target_reads = reads;
            // What `ctx.changed` compares is read, whether or not the
            // script asked: a change of it is decided again.
            for path in &policy.previous {
                decision.target_reads.note_path(path);
            }
            // And what the last concluded decision kept of them, which this
            // one's conclusion changes: the next decision sees the new
            // values (a change told once is not told again).
            if !policy.previous.is_empty() {
                decision.target_reads.note_path("status.decisions");
            }
            Ok(decision)
        }
        Body::Steps {
            steps: list,
            on_failure,
            retention,
        } => {
            let body = steps::Body {
                steps: list,
                on_failure,
                retention: retention.as_ref(),
            };
            let out = steps::decide(engine, policy, &body, observed, &ctx, sched.as_ref())?;
            let actions = plan(policy, &ns, &*observed.view, None, out.actions);
            Ok(finish(
                policy,
                observed,
                sched,
                actions,
                out.requeue_after_ms,
            ))
        }
    }
}

/// The actions a script's hook `name` (`finalize`, `deleted`) returns,
/// planned; none when the script does not define it.
fn hook_actions(
    engine: &ScriptEngine,
    policy: &CompiledPolicy,
    observed: &Observed,
    name: &str,
) -> Result<Vec<Planned>, DecideError> {
    let Body::Script { script, .. } = &policy.body else {
        return Ok(Vec::new());
    };
    if !script.has_fn(name) {
        return Ok(Vec::new());
    }
    let ctx = build_ctx(policy, observed, None);
    let ns = observed.target.acting_namespace();
    let result = engine.call(script, name, (ctx,))?;
    let values = collect(&script.file, script.fn_pos(name), name, result)?;
    Ok(plan(
        policy,
        ns,
        &*observed.view,
        Some(&script.file),
        values,
    ))
}

/// Decide the clean-up for a target being deleted. An empty decision means
/// the clean-up is done and the finalizer can go.
pub fn finalize(
    engine: &ScriptEngine,
    policy: &CompiledPolicy,
    observed: &Observed,
) -> Result<Decision, DecideError> {
    let actions = hook_actions(engine, policy, observed, "finalize")?;
    Ok(finish(policy, observed, None, actions, None))
}

/// Decide what to do now that a target is deleted (`fn deleted(ctx)`),
/// on the last state of it Runbook saw. The target being gone, actions on
/// it (its status, a condition, a child of it, a requeue) are refused.
/// A policy without `deleted` decides nothing.
pub fn deleted(
    engine: &ScriptEngine,
    policy: &CompiledPolicy,
    observed: &Observed,
) -> Result<Decision, DecideError> {
    let mut actions = hook_actions(engine, policy, observed, "deleted")?;
    for a in &mut actions {
        let on_target = matches!(
            a.action,
            Action::Status { .. }
                | Action::Condition(_)
                | Action::Apply { .. }
                | Action::Requeue { .. }
        );
        if on_target && a.refusal.is_none() {
            a.refusal = Some(Refusal {
                why: Refused::TargetGone {
                    verb: a.action.verb(),
                },
                origin: a.origin.clone(),
            });
        }
    }
    Ok(finish(policy, observed, None, actions, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Named schedules keep their own times: each fires on its own cron,
    /// `fired` names those due, and the status keeps every name's times.
    #[test]
    fn named_schedules_fire_on_their_own_times() {
        let yaml = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  schedules:\n    - {name: every 1 min, cron: '*/1 * * * *', firstRun: schedule}\n    - {name: every 5 min, cron: '*/5 * * * *', firstRun: schedule}\n  script: p.rhai\n";
        let loaded = crate::policy::compile::tests::load(&[
            ("p.yaml", yaml),
            ("p.rhai", "fn reconcile(ctx) { [] }"),
        ]);
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        let p = loaded.policies.into_iter().next().unwrap();
        let at = |t: &str| -> Timestamp { t.parse().unwrap() };
        let mut target =
            serde_json::json!({"metadata": {"creationTimestamp": "2026-11-29T10:00:30Z"}});
        // 10:01: only the minute schedule fired.
        let s = schedule_state(&p, &target, at("2026-11-29T10:01:10Z"))
            .unwrap()
            .unwrap();
        assert_eq!(s.fired(), ["every 1 min"]);
        assert_eq!(s.next, Some(at("2026-11-29T10:02:00Z")));
        let fields = schedule_fields(&s, &target);
        assert_eq!(
            fields["schedules"],
            serde_json::json!({
                "every 1 min": {"lastRunTime": "2026-11-29T10:01:00Z", "nextRunTime": "2026-11-29T10:02:00Z"},
                "every 5 min": {"nextRunTime": "2026-11-29T10:05:00Z"},
            })
        );
        assert!(fields.get("lastRunTime").is_none(), "{fields:?}");
        target["status"] = Value::Object(fields);
        // Not again within the minute.
        let s = schedule_state(&p, &target, at("2026-11-29T10:01:50Z"))
            .unwrap()
            .unwrap();
        assert!(!s.due && s.fired().is_empty(), "{s:?}");
        // 10:05 (two minutes missed): both fire, each once.
        let s = schedule_state(&p, &target, at("2026-11-29T10:05:02Z"))
            .unwrap()
            .unwrap();
        assert_eq!(s.fired(), ["every 1 min", "every 5 min"]);
        assert_eq!(s.fire, Some(at("2026-11-29T10:05:00Z")));
    }

    #[test]
    fn named_schedules_are_checked_where_they_are_written() {
        let load = |schedules: &str| {
            let yaml = format!(
                "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: p}}\nspec:\n  target: {{apiVersion: v1, kind: ConfigMap}}\n{schedules}  script: p.rhai\n"
            );
            crate::policy::compile::tests::load(&[
                ("p.yaml", &yaml),
                ("p.rhai", "fn reconcile(ctx) { [] }"),
            ])
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
        };
        assert_eq!(
            load(
                "  schedules:\n    - {name: a, cron: '@hourly'}\n    - {name: a, cron: '@daily'}\n"
            ),
            ["test/p.yaml:8:7: spec.schedules[1].name: \"a\" names two schedules"]
        );
        assert_eq!(
            load("  schedules:\n    - {name: a, cron: 'every day'}\n"),
            [
                "test/p.yaml:7:7: spec.schedules[0]: schedule \"every day\" has 2 fields; want 5 (minute hour day month weekday) or 6 (seconds first)"
            ]
        );
        assert_eq!(
            load("  schedule: {cron: '@hourly'}\n  schedules:\n    - {name: a, cron: '@daily'}\n"),
            ["test/p.yaml:8:5: spec.schedules: give schedule or schedules, not both"]
        );
        assert_eq!(
            load("  schedules:\n    - {cron: '@daily'}\n"),
            ["test/p.yaml:7:7: spec.schedules[0].name: give each schedule a name"]
        );
        assert_eq!(
            load("  schedule: {name: nightly, cron: '@daily'}\n"),
            ["test/p.yaml:6:13: spec.schedule.name: only the entries of spec.schedules are named"]
        );
        assert_eq!(
            load("  schedules:\n    - {name: '', cron: '@daily'}\n"),
            ["test/p.yaml:7:7: spec.schedules[0].name: give each schedule a name"]
        );
    }

    /// A child in another namespace: refused unless the policy declares
    /// `spec.namespaces` and the namespace's labels match it; declaring
    /// it takes a finalize, and a tenant may not.
    #[test]
    fn other_namespaces_are_declared_and_matched() {
        use crate::observe::MemoryView;
        use serde_json::json;
        let yaml = |namespaces: &str, finalize: bool| {
            let script = if finalize {
                "fn reconcile(ctx) { [] }\nfn finalize(ctx) { ctx.sync_children([]) }"
            } else {
                "fn reconcile(ctx) { [] }"
            };
            crate::policy::compile::tests::load(&[
                (
                    "p.yaml",
                    &format!(
                        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: p}}\nspec:\n  target: {{apiVersion: v1, kind: Secret}}\n  owns: [{{apiVersion: v1, kind: Secret}}]\n{namespaces}  script: p.rhai\n"
                    ),
                ),
                ("p.rhai", script),
            ])
        };
        let errors = |l: &crate::policy::Loaded| -> Vec<String> {
            l.errors.iter().map(|e| e.to_string()).collect()
        };
        let plain = yaml("", true);
        assert!(
            errors(&plain)[0].contains("cannot own its own target kind"),
            "{:?}",
            errors(&plain)
        );
        let declared = "  namespaces: {selector: {matchLabels: {copies: \"yes\"}}}\n";
        let unfinished = yaml(declared, false);
        assert!(
            errors(&unfinished)[0].contains("test/p.yaml:7:15: spec.namespaces: a policy that makes children in other namespaces needs a script with fn finalize"),
            "{:?}",
            errors(&unfinished)
        );
        let mut tenant = yaml(declared, true);
        assert!(tenant.errors.is_empty(), "{:?}", errors(&tenant));
        tenant.confine_to("team-a", &Default::default());
        assert!(
            errors(&tenant)[0].contains("spec.namespaces: a policy ConfigMap in namespace \"team-a\" acts only in \"team-a\""),
            "{:?}",
            errors(&tenant)
        );
        let p = yaml(declared, true).policies.remove(0);
        let view = MemoryView::new();
        view.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "wanted", "labels": {"copies": "yes"}}}));
        view.insert(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}),
        );
        let apply = |ns: &str| Action::Apply {
            object: json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": ns}}),
        };
        let writable =
            crate::observe::namespaces_matching(&view, &p.namespaces.as_ref().unwrap().0);
        assert_eq!(writable, ["wanted"]);
        assert_eq!(
            check_permission(&p, "src", &apply("wanted"), &writable),
            None
        );
        assert_eq!(check_permission(&p, "src", &apply("src"), &writable), None);
        for refused in ["other", "absent"] {
            let why =
                check_permission(&p, "src", &apply(refused), &writable).map(|r| r.to_string());
            assert!(
                why.as_deref()
                    .is_some_and(|w| w.contains("spec.namespaces selector")),
                "{refused}: {why:?}"
            );
        }
        let undeclared = yaml("", true);
        assert!(undeclared.policies.is_empty());
    }

    /// A sweep deletes and patches its targets in any namespace, as its
    /// policy declares; a tenant's sweep only in the tenant's namespace,
    /// and never a cluster-scoped object.
    #[test]
    fn a_sweep_acts_where_its_policy_does() {
        let load = |kind: &str, tenant: Option<&str>| {
            let mut l = crate::policy::compile::tests::load(&[
                (
                    "p.yaml",
                    &format!(
                        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: p}}\nspec:\n  target: {{apiVersion: v1, kind: {kind}}}\n  sweep: true\n  schedule: {{every: 1m}}\n  deletes: [{{apiVersion: v1, kind: {kind}}}]\n  script: p.rhai\n"
                    ),
                ),
                ("p.rhai", "fn reconcile(ctx) { [] }"),
            ]);
            assert!(l.errors.is_empty(), "{:?}", l.errors);
            if let Some(t) = tenant {
                l.confine_to(t, &Default::default());
            }
            l.policies.remove(0)
        };
        let delete = |kind: &str, ns: Option<&str>| Action::Delete {
            kind: crate::kinds::KindName::parse(kind),
            name: "x".into(),
            namespace: ns.map(str::to_string),
        };
        let patch = |ns: &str| Action::Patch {
            kind: crate::kinds::KindName::parse("Pod"),
            name: "x".into(),
            patch: serde_json::json!({"metadata": {"labels": {"a": "b"}}}),
            namespace: Some(ns.to_string()),
        };
        let why = |p: &CompiledPolicy, a: &Action| {
            check_permission(p, "runbook-system", a, &[]).map(|r| r.to_string())
        };
        let admin = load("Pod", None);
        assert_eq!(why(&admin, &delete("Pod", Some("shop"))), None);
        assert_eq!(why(&admin, &delete("Pod", Some("kube-system"))), None);
        // Patching needs spec.mutates, which it does not declare.
        assert!(why(&admin, &patch("shop")).is_some_and(|w| w.contains("mutates")));
        let tenant = load("Pod", Some("team-a"));
        assert_eq!(why(&tenant, &delete("Pod", Some("team-a"))), None);
        let elsewhere = why(&tenant, &delete("Pod", Some("team-b")));
        assert!(
            elsewhere.as_deref().is_some_and(|w| w.contains("team-b")),
            "{elsewhere:?}"
        );
        let nodes = load("Node", Some("team-a"));
        assert!(why(&nodes, &delete("Node", None)).is_some());
        assert_eq!(why(&load("Node", None), &delete("Node", None)), None);
    }

    /// A new target's first run: at its creation by default; with
    /// `firstRun: schedule`, at the first fire time after it.
    #[test]
    fn the_first_run_is_at_creation_or_at_the_first_fire_time() {
        let policy = |first: &str| {
            let yaml = format!(
                "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: p}}\nspec:\n  target: {{apiVersion: v1, kind: ConfigMap}}\n  schedule: {{cron: '0 * * * *'{first}}}\n  script: p.rhai\n"
            );
            let loaded = crate::policy::compile::tests::load(&[
                ("p.yaml", &yaml),
                ("p.rhai", "fn reconcile(ctx) { [] }"),
            ]);
            assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
            loaded.policies.into_iter().next().unwrap()
        };
        let target = serde_json::json!({"metadata": {"creationTimestamp": "2026-11-29T10:05:00Z"}});
        let at = |t: &str| -> Timestamp { t.parse().unwrap() };
        let state =
            |p: &CompiledPolicy, now: &str| schedule_state(p, &target, at(now)).unwrap().unwrap();
        let creation = policy("");
        let s = state(&creation, "2026-11-29T10:06:00Z");
        assert!(s.due);
        assert_eq!(s.fire, Some(at("2026-11-29T10:05:00Z")));
        let scheduled = policy(", firstRun: schedule");
        let s = state(&scheduled, "2026-11-29T10:30:00Z");
        assert!(!s.due, "{s:?}");
        assert_eq!(s.next, Some(at("2026-11-29T11:00:00Z")));
        let s = state(&scheduled, "2026-11-29T11:00:30Z");
        assert!(s.due);
        assert_eq!(s.fire, Some(at("2026-11-29T11:00:00Z")));
    }

    #[test]
    fn a_run_is_named_by_its_fire_time() {
        let t: Timestamp = "2026-11-29T10:05:09Z".parse().unwrap();
        assert_eq!(run_id(t), "20261129-100509");
        assert_eq!(run_id(t), t.strftime("%Y%m%d-%H%M%S").to_string());
    }
}
