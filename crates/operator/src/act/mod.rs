//! Act: a decision carried out. Three parts, in order:
//!
//! 1. [`plan`] (pure, in `runbook_core`): the decision and the cached state in, the steps out
//!    — each a write to make, or a result to record without one
//!    (refused, shadow, suspended, limited, unchanged);
//! 2. [`writer`]: the one code that writes to the API server for a
//!    decision, performing the plan's writes in order (after a failed one,
//!    the writes that follow are skipped); the journal hears every outcome
//!    there;
//! 3. [`conclude`] (pure, in `runbook_core`): the steps' results in, the target's new status,
//!    its decision record and the Events to write out.
//!
//! A no-op reconcile makes no request at all; shadow mode and an open
//! circuit breaker write nothing but the record (shadow not even that).

pub mod authorize;
pub mod rollback;
pub mod writer;

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::{Value, json};

pub use self::writer::{MANAGER, Writer, manager_of};
use crate::observe::discovery::Resources;
use crate::telemetry::journal::Entry;
use runbook_core::alert::AlertSink;
use runbook_core::alert::routes::CompiledRoutes;
use runbook_core::crd::{ActionResult, DecisionRecord};
use runbook_core::decide::{DecideError, Decision};
use runbook_core::kinds::KindRef;
use runbook_core::observe::Resolved;
use runbook_core::observe::{CachedObject, ObjectView};
use runbook_core::plan::conclude::Done;
use runbook_core::plan::{
    self, Cause, Discovered, Failed, Note, Plan, Todo, conclude, state, status,
};
use runbook_core::plan::{Acting, Applied, AppliedWrite};
use runbook_core::policy::compile::CompiledPolicy;
use runbook_core::script::Action;

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// One line: what was being done, and the API server's message.
    #[error("{what}: {}", crate::util::api_error(.source))]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Rollback(String),
    #[error("{0}")]
    Invalid(String),
    /// The object in the way is not the policy's to write (found when
    /// the writer looked before making a new child).
    #[error("{0}")]
    Refused(String),
}

impl ExecError {
    pub fn api(what: &str, source: kube::Error) -> Self {
        Self::Api {
            what: what.to_string(),
            source,
        }
    }

    pub fn cause(&self) -> Cause {
        match self {
            ExecError::Api {
                source: kube::Error::Api(s),
                ..
            } => Cause::of_status(s.code),
            ExecError::Api { .. } => Cause::Transport,
            ExecError::Rollback(_) => Cause::Rollback,
            ExecError::Invalid(_) => Cause::Invalid,
            ExecError::Refused(_) => Cause::Refused,
        }
    }
}

impl From<&ExecError> for Failed {
    fn from(e: &ExecError) -> Self {
        Failed::new(e.cause(), e.to_string())
    }
}

/// What carrying out a decision needs.
pub struct Exec<'a> {
    pub writer: Writer<'a>,
    pub resources: &'a Resources,
    /// The caches the decision read, for what its writes would change.
    pub view: &'a dyn ObjectView,
    pub alerts: &'a dyn AlertSink,
    /// Who the target's author is and what they may do.
    pub authority: &'a authorize::Authority,
    /// What the decision read for the target's sake (its author must be
    /// allowed to read it).
    pub reads: &'a [crate::observe::view::AccessKey],
    /// Where Runbook's state of the target lives when it is not in the
    /// target's status (a kind whose schema is not Runbook's).
    pub state: Option<&'a state::Apart>,
    /// Where the state would be kept apart (namespace, name), for a kind
    /// whose status turns out to prune it.
    pub state_at: Option<(String, String)>,
    /// Status fields of the policy the target's schema is known to drop.
    pub dropped: &'a [String],
    /// The target is deleted (`deleted(ctx)`): its status is not written.
    pub gone: bool,
}

/// What executing a decision did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub record: DecisionRecord,
    /// API write requests made (0 for a no-op reconcile).
    pub writes: u32,
    /// What ended the reconcile: a decide error or a failed action.
    pub failure: Option<Failed>,
    /// (verb, reason) of each refused action.
    pub refused: Vec<(String, String)>,
    pub limited: Vec<String>,
    /// (verb, result) of each action on another object and each refused
    /// one, for metrics.
    pub results: Vec<(&'static str, &'static str)>,
    /// When the decision wants to run again.
    pub requeue_ms: Option<i64>,
    /// Whether the target's status was written.
    pub status_written: bool,
    /// The target as the status write left it, for the next policy on it.
    pub target_after: Option<Value>,
    /// Runbook's state of the target as its write left it (a kind whose
    /// schema is not Runbook's).
    pub state_after: Option<Value>,
    /// The status write's answer lacked the decision record written: the
    /// target's kind prunes Runbook's fields from its status.
    pub pruned: bool,
    /// Status fields the policy wrote that the API server dropped (its
    /// schema does not list them), and those it kept.
    pub dropped: Vec<String>,
    pub kept: Vec<String>,
}

/// The top-level status fields `patch` set that `after` (the API server's
/// answer) does not hold: dropped by the target's schema. Runbook's own
/// fields are not counted (they move apart when dropped).
fn dropped_fields(patch: &Value, after: &Value) -> Vec<String> {
    let Some(sent) = patch.as_object() else {
        return Vec::new();
    };
    sent.iter()
        .filter(|(k, v)| {
            !v.is_null()
                && k.as_str() != "conditions"
                && !state::STATE_FIELDS.contains(&k.as_str())
                && !state::STEP_FIELDS.contains(&k.as_str())
                && k.as_str() != "observedGeneration"
                && after.pointer(&format!("/status/{k}")).is_none()
        })
        .map(|(k, _)| k.clone())
        .collect()
}

/// Tell that the API server dropped status fields the policy wrote: a
/// Warning Event on the target, and the outcome (counted by the caller,
/// and remembered, so the next decision says it in Runbook's condition).
async fn tell_dropped(
    w: &Writer<'_>,
    target: &CachedObject,
    patch: &Value,
    after: &Value,
    out: &mut Outcome,
) {
    let fields = dropped_fields(patch, after);
    out.kept = patch
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| !v.is_null() && !fields.contains(k))
        .map(|(k, _)| k.clone())
        .collect();
    if fields.is_empty() {
        return;
    }
    let kind = plan::kind_of(target.value());
    let list: Vec<String> = fields.iter().map(|f| format!("status.{f}")).collect();
    let message = format!(
        "the API server dropped {} of {}: {}'s status schema does not list {}; add {} to its CRD, or stop writing {}",
        list.join(", "),
        plan::target_string(&kind, target.namespace(), target.name()),
        kind.kind,
        if fields.len() == 1 { "it" } else { "them" },
        if fields.len() == 1 { "it" } else { "them" },
        if fields.len() == 1 { "it" } else { "them" },
    );
    tracing::warn!("{message}");
    w.event(
        target.value(),
        &Note {
            type_: runbook_core::script::action::EventType::Warning,
            reason: "StatusDropped".into(),
            message,
        },
    )
    .await;
    out.dropped = fields;
}

/// The `ObjectReference` Events point at.
pub fn object_ref(target: &Value) -> ObjectReference {
    let m = &target["metadata"];
    let s = |v: &Value| v.as_str().map(str::to_string);
    ObjectReference {
        api_version: s(&target["apiVersion"]),
        kind: s(&target["kind"]),
        name: s(&m["name"]),
        namespace: s(&m["namespace"]),
        uid: s(&m["uid"]),
        resource_version: s(&m["resourceVersion"]),
        field_path: None,
    }
}

/// Ask discovery about each kind (it remembers what it was told).
async fn discover(resources: &Resources, kinds: Vec<KindRef>) -> Discovered {
    let mut out = Discovered::new();
    for k in kinds {
        let answer = resources
            .resolve(&k)
            .await
            .map_err(|e| Failed::from(&ExecError::api(&format!("discovering {k}"), e)));
        out.insert(k, answer);
    }
    out
}

/// Carry out the plan's steps in order; after a failed or refused
/// action, the writes that follow are skipped (a decision's actions are a
/// sequence: a later one may rely on an earlier one). Returns each step's
/// result and the failure.
async fn carry_out(
    w: &Writer<'_>,
    policy: &CompiledPolicy,
    target: &Value,
    plan: &Plan,
) -> (Vec<Done>, Option<Failed>) {
    let mut done = Vec::with_capacity(plan.steps.len());
    let mut failure: Option<Failed> = None;
    let mut refused = false;
    for step in &plan.steps {
        if (failure.is_some() || refused) && step.writes_elsewhere() {
            let why = if failure.is_some() {
                "an earlier action failed"
            } else {
                "an earlier action was refused"
            };
            done.push(Done::new(ActionResult::Skipped, Some(why.to_string())));
            continue;
        }
        let tell = |result: &str, fields: Value, detail: Option<&str>| {
            w.observe(|| w.step_entry(policy, target, step, result, fields, detail))
        };
        let d = match &step.todo {
            Todo::Refused(r) => {
                refused = true;
                let r = r.to_string();
                w.observe(|| {
                    let mut e =
                        w.step_entry(policy, target, step, "refused", Value::Null, Some(&r));
                    e.action = "refusal".into();
                    e.fields = json!({"action": step.action.verb()});
                    e
                });
                Done::new(ActionResult::Refused, Some(r))
            }
            Todo::Record(result, detail) => {
                if step.action.limited_verb().is_some() {
                    tell(result.as_str(), Value::Null, detail.as_deref());
                }
                Done::new(*result, detail.clone())
            }
            Todo::Unchanged => {
                tell("unchanged", Value::Null, None);
                Done::new(ActionResult::Ok, None)
            }
            Todo::Write(write) => match w.write(write).await {
                Ok(Some(wrote)) => {
                    if let Some(line) = mutation_line(step) {
                        tracing::info!(
                            policy = %policy.name,
                            target = %target_name(target),
                            "{line}"
                        );
                    }
                    tell("ok", wrote, None);
                    Done {
                        result: ActionResult::Ok,
                        detail: None,
                        wrote: true,
                    }
                }
                Ok(None) => {
                    tell("unchanged", Value::Null, None);
                    Done::new(ActionResult::Ok, None)
                }
                Err(e) => fail(&mut failure, Failed::from(&e), tell),
            },
            Todo::Fail(f) => fail(&mut failure, f.clone(), tell),
        };
        done.push(d);
    }
    (done, failure)
}

/// What a write that changes something a policy does not own says in the
/// log, at info level: a rollback, a patch, a delete. (Applies of the
/// policy's own children and writes of its target's status are the
/// policy's everyday work, in its decision record.)
fn mutation_line(step: &plan::Step) -> Option<String> {
    let on = step.target.as_deref().unwrap_or("?");
    Some(match &step.action {
        Action::Rollback { revision, .. } => match revision {
            Some(r) => format!("rolled back {on} to revision {r}"),
            None => format!("rolled back {on} to its previous revision"),
        },
        Action::Patch { patch, .. } => {
            let text = patch.to_string();
            let cut: String = text.chars().take(200).collect();
            let more = if cut.len() < text.len() { "..." } else { "" };
            format!("patched {on}: {cut}{more}")
        }
        // A delete of its own child is the policy's everyday work; of
        // anything else (what `spec.deletes` lets it delete), it needs its
        // author's rights and is said.
        Action::Delete { .. } if !step.needs.is_empty() => format!("deleted {on}"),
        _ => return None,
    })
}

/// `Kind namespace/name` of a target, for log lines.
fn target_name(target: &Value) -> String {
    let text = |p: &str| target.pointer(p).and_then(Value::as_str).unwrap_or("");
    match text("/metadata/namespace") {
        "" => format!("{} {}", text("/kind"), text("/metadata/name")),
        ns => format!("{} {ns}/{}", text("/kind"), text("/metadata/name")),
    }
}

/// A step that failed (or was refused on what the cluster holds): told,
/// and kept as the decision's failure (the first one, which the later
/// ones follow from), which stops its later writes.
fn fail(failure: &mut Option<Failed>, f: Failed, tell: impl Fn(&str, Value, Option<&str>)) -> Done {
    let result = if f.is_refusal() {
        ActionResult::Refused
    } else {
        ActionResult::Failed
    };
    tell(result.as_str(), Value::Null, Some(&f.message));
    let d = Done::new(result, Some(f.message.clone()));
    failure.get_or_insert(f);
    d
}

/// What the outcome counts of the steps: refusals, limits, results.
fn tally(out: &mut Outcome, plan: &Plan, done: &[Done]) {
    for (s, d) in plan.steps.iter().zip(done) {
        let verb = s.action.verb();
        if let Todo::Refused(r) = &s.todo {
            out.refused.push((verb.to_string(), r.to_string()));
        } else if d.result == ActionResult::Refused {
            out.refused
                .push((verb.to_string(), d.detail.clone().unwrap_or_default()));
        } else if s.action.limited_verb().is_none() {
            continue;
        }
        if d.result == ActionResult::Limited {
            out.limited.push(d.detail.clone().unwrap_or_default());
        }
        out.writes += u32::from(d.wrote);
        out.results.push((verb, d.result.as_str()));
    }
}

/// Carry out a decision (or report why none could be made).
pub async fn execute(
    x: &Exec<'_>,
    policy: &CompiledPolicy,
    routes: Option<&Arc<CompiledRoutes>>,
    target: &CachedObject,
    target_kind: &Resolved,
    decision: Result<&Decision, &DecideError>,
    mode: Acting,
) -> Outcome {
    let w = &x.writer;
    let t = target.value();
    let actions = decision.map(|d| d.actions.as_slice()).unwrap_or_default();
    let plan = authorized_plan(x, policy, routes, target, actions, &mode).await;
    let (done, failure) = carry_out(w, policy, t, &plan).await;
    let decide_error = decision.err();
    if let Some(e) = decide_error {
        observe_error(w, policy, target, e);
    }
    // A decision that failed keeps the inputs hash its record had.
    let previous_hash = match decision {
        Ok(_) => String::new(),
        Err(_) => {
            DecisionRecord::of(t, &policy.name)
                .unwrap_or_default()
                .inputs_hash
        }
    };
    let end = conclude::conclude(&conclude::Input {
        policy,
        target: t,
        plan: &plan,
        done: &done,
        decide_error,
        failed: failure.as_ref(),
        inputs_hash: decision.map_or(previous_hash.as_str(), |d| d.inputs_hash.as_str()),
        mode: &mode,
        now: w.now,
        dropped: x.dropped,
        metrics: decision.map(|d| d.metrics.as_slice()).unwrap_or_default(),
    });
    let mut out = Outcome {
        record: end.record.clone(),
        failure: decide_error
            .map(|e| Failed::new(e.cause(), e.to_string()))
            .or(failure),
        ..Outcome::default()
    };
    tally(&mut out, &plan, &done);
    if mode == Acting::Shadow {
        return out;
    }
    for note in &end.events {
        w.event(t, note).await;
    }
    // A decision that failed says nothing about its alerts: keep them as
    // they were rather than resolve them.
    if decision.is_ok() {
        x.alerts.report(&plan.source, routes, plan.alerts.clone());
    }
    // A state kept apart that must follow its target to another replica
    // is written even when nothing in it changed.
    let relabel = json!({});
    let moved = x.state.filter(|a| a.moved()).map(|_| &relabel);
    if let Some(patch) = end.patch.as_ref().or(moved).filter(|_| !x.gone) {
        let subject = Subject {
            policy,
            target,
            target_kind,
        };
        finish_status(x, subject, &plan, &end, patch, &mut out).await;
    }
    out
}

/// A decision's actions planned into writes and results, and (enforcing)
/// each write on something not Runbook's own checked against the rights of
/// the target's author.
async fn authorized_plan(
    x: &Exec<'_>,
    policy: &CompiledPolicy,
    routes: Option<&Arc<CompiledRoutes>>,
    target: &CachedObject,
    actions: &[runbook_core::decide::Planned],
    mode: &Acting,
) -> plan::Plan {
    let w = &x.writer;
    let discovered = match mode {
        Acting::Enforce => discover(x.resources, plan::kinds_to_discover(policy, actions)).await,
        _ => Discovered::new(),
    };
    let mut plan = plan::plan(&plan::Input {
        policy,
        target,
        actions,
        mode,
        view: x.view,
        discovered: &discovered,
        applied: w.applied,
        routes: routes.map(|r| r.as_ref()),
        now: w.now,
    });
    if let Some(own) = w.applied {
        plan.settled.iter().for_each(|k| own.settled(k));
    }
    if *mode == Acting::Enforce {
        let reads = authorize::reads_to_check(policy, target, x.reads, x.view);
        authorize::authorize(x.authority, x.resources, x.view, target, &mut plan, &reads).await;
    }
    plan
}

/// Tell the journal of a decision that failed.
fn observe_error(w: &Writer<'_>, policy: &CompiledPolicy, target: &CachedObject, e: &DecideError) {
    w.observe(|| {
        let k = plan::kind_of(target.value());
        Entry::new(w.now, "error", "failed")
            .policy(&policy.name)
            .object(&k.api_version, &k.kind, target.namespace(), target.name())
            .detail(e.to_string())
    });
}

/// What a decision's status is written for: the policy, the target as the
/// decision saw it, and how its kind is served.
#[derive(Clone, Copy)]
struct Subject<'a> {
    policy: &'a CompiledPolicy,
    target: &'a CachedObject,
    target_kind: &'a Resolved,
}

/// Where Runbook's state of a target lives apart: the concluded status
/// split in two, each part written only if it changed (the state first, so
/// that records an earlier release left in the target's status are
/// carried over before they are removed from it).
async fn finish_apart(
    x: &Exec<'_>,
    subject: Subject<'_>,
    apart: &state::Apart,
    end: &conclude::Conclusion,
    out: &mut Outcome,
) {
    let Subject {
        policy,
        target,
        target_kind,
    } = subject;
    let w = &x.writer;
    let (ns, name) = (target.namespace(), target.name());
    let kind = plan::kind_of(target.value());
    let empty = json!({});
    let seen = target.value().get("status").unwrap_or(&empty);
    let own_now = apart.target.get("status").unwrap_or(&empty);
    let state_now = apart
        .state
        .as_deref()
        .and_then(|s| s.get("status"))
        .unwrap_or(&empty);
    let steps = matches!(
        policy.body,
        runbook_core::policy::compile::Body::Steps { .. }
    );
    let built_in = state::built_in(&target_kind.kind_ref());
    let keeping = state::Keeping { steps, built_in };
    let (own, runbooks) = state::split(own_now, state_now, seen, &end.status, keeping);
    let entry = |action: &str, result: &str| {
        Entry::new(w.now, action, result)
            .policy(&policy.name)
            .object(&kind.api_version, &kind.kind, ns, name)
    };
    if status::merge_diff(state_now, &runbooks).is_some() || apart.moved() {
        let whole = state::new_state(apart, &runbooks);
        match w.runbook_state(&whole).await {
            Ok(after) => {
                w.observe(|| entry("state", "ok").fields(runbooks.clone()));
                out.writes += 1;
                out.state_after = Some(after);
            }
            Err(e) => {
                let m = format!(
                    "writing Runbook's state of {} (RunbookState {}/{}): {}",
                    plan::target_string(&kind, ns, name),
                    apart.namespace,
                    apart.name,
                    crate::util::api_error(&e)
                );
                w.observe(|| entry("state", "failed").detail(m.clone()));
                out.failure.get_or_insert(Failed::new(Cause::Status, m));
                return;
            }
        }
    }
    // A sweep has no object of its own: its record is all there is.
    if runbook_core::kinds::is_sweep(&kind) {
        return;
    }
    let Some(patch) = status::merge_diff(own_now, &own) else {
        return;
    };
    match w.status(target_kind, ns, name, &patch).await {
        Ok(after) => {
            w.observe(|| entry("status", "ok").fields(patch.clone()));
            out.writes += 1;
            out.status_written = true;
            tell_dropped(w, target, &patch, &after, out).await;
            out.target_after = Some(after);
        }
        Err(e) => {
            let entry = entry("status", "failed").fields(patch.clone());
            status_failed(w, &kind, target, &e, entry, out).await
        }
    }
}

/// A status write that failed: journaled (`entry`, with what it meant to
/// set), the decision's error, and a Warning Event on the target (an
/// Event is an object of its own, written where the status cannot be: a
/// 413 for an object grown past the API server's limit, a 422, a 403).
async fn status_failed(
    w: &Writer<'_>,
    kind: &KindRef,
    target: &CachedObject,
    e: &kube::Error,
    entry: Entry,
    out: &mut Outcome,
) {
    let m = format!(
        "writing the status of {}: {}",
        plan::target_string(kind, target.namespace(), target.name()),
        crate::util::api_error(e)
    );
    w.observe(|| entry.detail(m.clone()));
    let note = plan::Note {
        type_: runbook_core::script::action::EventType::Warning,
        reason: "StatusWriteFailed".into(),
        message: m.clone(),
    };
    w.event(target.value(), &note).await;
    let cause = match e {
        kube::Error::Api(s) if s.code == 403 => Cause::Forbidden,
        _ => Cause::Status,
    };
    out.failure.get_or_insert(Failed::new(cause, m));
}

/// Write the status the decision ends with.
async fn finish_status(
    x: &Exec<'_>,
    subject: Subject<'_>,
    plan: &Plan,
    end: &conclude::Conclusion,
    patch: &Value,
    out: &mut Outcome,
) {
    let Subject {
        policy,
        target,
        target_kind,
    } = subject;
    let w = &x.writer;
    let (ns, name) = (target.namespace(), target.name());
    let kind = plan::kind_of(target.value());
    // What the write sets, as the journal shows it: the decision's fields
    // only when it was carried out (a failed one writes its conditions and
    // record, not the fields it meant to set), and the conditions.
    let set = || {
        let mut set = match out.failure {
            None => Value::Object(plan.fields.clone()),
            Some(_) => Value::Object(Default::default()),
        };
        if let Some(c) = end.status.get("conditions") {
            set["conditions"] = c.clone();
        }
        set
    };
    let entry = |result: &str| {
        Entry::new(w.now, "status", result)
            .policy(&policy.name)
            .object(&kind.api_version, &kind.kind, ns, name)
    };
    if let Some(apart) = x.state {
        return finish_apart(x, subject, apart, end, out).await;
    }
    match w.status(target_kind, ns, name, patch).await {
        Ok(after) => {
            w.observe(|| entry("ok").fields(set()));
            out.writes += 1;
            out.status_written = true;
            // The answer lacks one of Runbook's fields just written (the
            // record, a schedule's times): this kind's status prunes them.
            // What the decision concluded is kept apart at once, so
            // nothing is decided twice for want of it.
            let kept = |v: &Value| {
                state::STATE_FIELDS.iter().all(|f| {
                    end.status.get(*f).is_none_or(Value::is_null)
                        || v.pointer(&format!("/status/{f}"))
                            .is_some_and(|d| !d.is_null())
                })
            };
            tell_dropped(w, target, patch, &after, out).await;
            if let Some((namespace, state_name)) = &x.state_at
                && !kept(&after)
            {
                out.pruned = true;
                let apart = state::Apart {
                    namespace: namespace.clone(),
                    name: state_name.clone(),
                    state: None,
                    target: std::sync::Arc::new(after.clone()),
                };
                let seen = CachedObject::new(after.clone());
                out.target_after = Some(after);
                let subject = Subject {
                    target: &seen,
                    ..subject
                };
                finish_apart(x, subject, &apart, end, out).await;
                return;
            }
            out.target_after = Some(after);
        }
        Err(e) => status_failed(w, &kind, target, &e, entry("failed").fields(set()), out).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runbook_core::kinds::KindName;
    use serde_json::json;

    fn step(action: Action, on: &str) -> plan::Step {
        plan::Step {
            action,
            target: Some(on.to_string()),
            todo: Todo::Unchanged,
            needs: vec![],
        }
    }

    #[test]
    fn a_rollback_a_patch_and_a_delete_each_say_what_they_changed() {
        let on = "apps/v1 Deployment ml/chatbot";
        let rollback = Action::Rollback {
            deployment: "chatbot".into(),
            revision: Some(2),
        };
        assert_eq!(
            mutation_line(&step(rollback, on)).as_deref(),
            Some("rolled back apps/v1 Deployment ml/chatbot to revision 2")
        );
        let patch = Action::Patch {
            kind: KindName::parse("Deployment"),
            name: "chatbot".into(),
            patch: json!({"spec": {"replicas": 0}}),
            namespace: None,
        };
        assert_eq!(
            mutation_line(&step(patch, on)).as_deref(),
            Some(r#"patched apps/v1 Deployment ml/chatbot: {"spec":{"replicas":0}}"#)
        );
        let delete = Action::Delete {
            kind: KindName::parse("Pod"),
            name: "web-1".into(),
            namespace: None,
        };
        // Its own child: everyday work, not said.
        assert_eq!(
            mutation_line(&step(delete.clone(), "v1 Pod ml/web-1")),
            None
        );
        let mut other = step(delete, "v1 Pod ml/web-1");
        other.needs.push(plan::Access {
            verb: "delete",
            kind: KindRef::new("v1", "Pod"),
            namespace: "ml".into(),
            name: Some("web-1".into()),
            why: "delete v1 Pod ml/web-1".into(),
            opted_in: false,
        });
        assert_eq!(
            mutation_line(&other).as_deref(),
            Some("deleted v1 Pod ml/web-1")
        );
        let status = Action::Status {
            fields: Default::default(),
        };
        assert_eq!(mutation_line(&step(status, on)), None);
    }
}
