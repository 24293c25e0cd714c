//! The executor: the only part of Runbook that writes. It turns a
//! `Decision` into API calls (server-side apply of children with owner
//! references, deletes, merge patches, rollbacks, status through the status
//! subresource, Events) and alerts, and leaves a decision record.
//!
//! It refuses what the policy may not do, holds rate-limited actions to
//! their limits (persisted in the decision record, so they survive a
//! restart), writes nothing in shadow mode or while a circuit breaker is
//! open, and makes no request at all for an action that would change
//! nothing, so a no-op reconcile costs zero writes.

pub mod resources;
pub mod rollback;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::events::{Event as KubeEvent, EventType, EventWriter};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Map, Value, json};

use self::resources::{Resolved, Resources};
use crate::alert::routes::CompiledRoutes;
use crate::alert::{Alert, AlertSink, AlertSource};
use crate::crd::{ActionRecord, DecisionRecord};
use crate::decide::{DecideError, Decision};
use crate::journal::{Entry, Journal};
use crate::kinds::KindRef;
use crate::observe::RawObject;
use crate::observe::{CachedObject, ObjectView};
use crate::policy::compile::CompiledPolicy;
use crate::policy::limits::{Recent, Verb};
use crate::script::action::Action;
use crate::util::time;

/// The field manager of every write.
pub const MANAGER: &str = "runbook";
/// Annotation holding the hash of what Runbook last applied to a child.
pub const APPLIED_HASH: &str = "runbook.dev/applied-hash";
/// Reasons of conditions the executor sets, so it knows which it may clear.
const OWN_REASONS: &[&str] = &[
    "ScriptError",
    "ActionRefused",
    "ActionFailed",
    "ActionLimited",
    "ScheduleError",
];

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
}

impl ExecError {
    pub fn api(what: &str, source: kube::Error) -> Self {
        Self::Api {
            what: what.to_string(),
            source,
        }
    }

    /// Label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ExecError::Api {
                source: kube::Error::Api(s),
                ..
            } => match s.code {
                409 => "conflict",
                422 => "invalid",
                403 => "forbidden",
                404 => "not_found",
                c if c >= 500 => "server",
                _ => "api",
            },
            ExecError::Api { .. } => "transport",
            ExecError::Rollback(_) => "rollback",
            ExecError::Invalid(_) => "invalid",
        }
    }
}

/// How a decision may act.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Enforce,
    /// Decide and record, write nothing.
    Shadow,
    /// Writes suspended (circuit breaker open): record why.
    Suspended(String),
}

impl Mode {
    fn as_str(&self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Suspended(_) => "suspended",
        }
    }
}

/// What the executor needs.
pub struct Exec<'a> {
    pub client: &'a kube::Client,
    pub resources: &'a Resources,
    pub view: &'a dyn ObjectView,
    pub recorder: Option<&'a EventWriter>,
    pub alerts: &'a dyn AlertSink,
    pub now: Timestamp,
    /// What this process applied lately, for when the cache lags.
    pub applied: Option<&'a Applied>,
    /// Where each action's outcome is written down (scenarios).
    pub journal: Option<&'a dyn Journal>,
}

/// Children applied by this process whose new version the watch cache may
/// not show yet: (kind, namespace, name) -> applied hash. Without it, a
/// reconcile that runs before the cache catches up would apply the same
/// object again (harmless, but a write).
pub type Applied = crate::observe::OwnWrites<(KindRef, String, String), String>;

/// What executing a decision did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub record: DecisionRecord,
    /// API write requests made (0 for a no-op reconcile).
    pub writes: u32,
    /// The error that ended the reconcile: a decide error or a failed action.
    pub error: Option<String>,
    pub error_label: Option<&'static str>,
    pub refused: Vec<(String, String)>,
    pub limited: Vec<String>,
    /// (verb, result) of each action, for metrics.
    pub results: Vec<(&'static str, &'static str)>,
    /// When the decision wants to run again.
    pub requeue_ms: Option<i64>,
    /// Whether the target's status was written.
    pub status_written: bool,
}

fn target_string(kind: &KindRef, ns: &str, name: &str) -> String {
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

fn action_target(a: &Action, ns: &str, target_kind: &KindRef, target_name: &str) -> Option<String> {
    match a {
        Action::Apply { object } => Some(target_string(
            &KindRef::new(
                object["apiVersion"].as_str().unwrap_or(""),
                object["kind"].as_str().unwrap_or(""),
            ),
            ns,
            object["metadata"]["name"].as_str().unwrap_or(""),
        )),
        Action::Delete { kind, name } | Action::Patch { kind, name, .. } => {
            Some(format!("{kind} {ns}/{name}"))
        }
        Action::Rollback { deployment, .. } => {
            Some(format!("apps/v1 Deployment {ns}/{deployment}"))
        }
        Action::Status { .. } | Action::Condition { .. } | Action::Event { .. } => {
            Some(target_string(target_kind, ns, target_name))
        }
        Action::Alert { .. } | Action::Requeue { .. } => None,
    }
}

/// The journal entry of an action's outcome (`fields` says what it wrote).
fn journal_entry(
    x: &Exec<'_>,
    policy: &CompiledPolicy,
    a: &Action,
    (tkind, ns, tname): (&KindRef, &str, &str),
    result: &str,
    fields: Value,
    detail: Option<&str>,
) -> Entry {
    let (api_version, kind, name) = match a {
        Action::Apply { object } => (
            object["apiVersion"].as_str().unwrap_or("").to_string(),
            object["kind"].as_str().unwrap_or("").to_string(),
            object["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        ),
        Action::Delete { kind, name } | Action::Patch { kind, name, .. } => {
            match policy.kinds.resolve(kind) {
                Ok(k) => (k.api_version, k.kind, name.clone()),
                Err(_) => (String::new(), kind.to_string(), name.clone()),
            }
        }
        Action::Rollback { deployment, .. } => {
            ("apps/v1".into(), "Deployment".into(), deployment.clone())
        }
        _ => (
            tkind.api_version.clone(),
            tkind.kind.clone(),
            tname.to_string(),
        ),
    };
    Entry::new(x.now, a.verb(), result)
        .policy(&policy.name)
        .object(&api_version, &kind, ns, &name)
        .fields(fields)
        .detail(detail.unwrap_or(""))
}

fn record(
    a: &Action,
    target: Option<String>,
    result: &str,
    message: Option<String>,
) -> ActionRecord {
    ActionRecord {
        action: a.verb().to_string(),
        target,
        result: result.to_string(),
        message,
    }
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

fn hash_of(v: &Value) -> String {
    crate::util::hash::json_hash(v, 16)
}

/// Fill in what every child gets: namespace, owner reference, the
/// managed-by label, the applied-hash annotation.
pub fn prepare_child(object: &Value, target: &Value, namespaced: bool) -> Value {
    let mut o = object.clone();
    // `()` (null) in an object to apply means "leave the field out": the
    // API server stores no nulls, so keeping them would make the applied
    // object differ from the live one forever and re-apply it every time.
    without_nulls(&mut o);
    let meta = o
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut meta = meta;
    if namespaced {
        meta.insert("namespace".into(), target["metadata"]["namespace"].clone());
    }
    let owner = json!({
        "apiVersion": target["apiVersion"], "kind": target["kind"], "name": target["metadata"]["name"],
        "uid": target["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true
    });
    let mut refs: Vec<Value> = meta
        .get("ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["uid"] != owner["uid"] && r["controller"] != true)
        .collect();
    refs.push(owner);
    meta.insert("ownerReferences".into(), Value::Array(refs));
    // Scripts' objects are checked where they are made (`apply`), but
    // nothing here may panic on a shape it did not build: anything that is
    // not a map is replaced by one.
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if !labels.is_object() {
        *labels = json!({});
    }
    if let Some(l) = labels.as_object_mut() {
        l.entry("app.kubernetes.io/managed-by")
            .or_insert_with(|| json!("runbook"));
    }
    let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
    if !annotations.is_object() {
        *annotations = json!({});
    }
    if let Some(a) = annotations.as_object_mut() {
        a.remove(APPLIED_HASH);
    }
    let mut o = match o {
        Value::Object(mut m) => {
            m.insert("metadata".into(), Value::Object(meta));
            Value::Object(m)
        }
        _ => json!({"metadata": meta}),
    };
    let h = hash_of(&o);
    if let Some(a) = o
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.insert(APPLIED_HASH.into(), json!(h));
    }
    o
}

/// Drop every map entry whose value is null, at any depth.
fn without_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(without_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(without_nulls),
        _ => {}
    }
}

/// Whether applying `desired` to the cached child would change nothing.
pub fn apply_is_noop(desired: &Value, live: Option<&CachedObject>) -> bool {
    let Some(live) = live else { return false };
    let same_hash = live
        .value()
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(APPLIED_HASH))
        == desired
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(APPLIED_HASH));
    same_hash && status::is_subset(desired, live.value())
}

async fn api_for(
    x: &Exec<'_>,
    kind: &KindRef,
    ns: &str,
) -> Result<(Api<RawObject>, Resolved), ExecError> {
    let r = x
        .resources
        .resolve(kind)
        .await
        .map_err(|e| ExecError::api(&format!("discovering {kind}"), e))?;
    let api = if r.namespaced {
        Api::namespaced_with(x.client.clone(), ns, &r.resource)
    } else {
        Api::all_with(x.client.clone(), &r.resource)
    };
    Ok((api, r))
}

/// Carry out one write action: `Ok(None)` when nothing needed doing, else
/// what was written (the applied object, a rollback's revisions).
async fn write(
    x: &Exec<'_>,
    policy: &CompiledPolicy,
    target: &Value,
    ns: &str,
    a: &Action,
) -> Result<Option<Value>, ExecError> {
    let pp = PatchParams::apply(MANAGER).force();
    match a {
        Action::Apply { object } => {
            let kind = KindRef::new(
                object["apiVersion"].as_str().unwrap_or(""),
                object["kind"].as_str().unwrap_or(""),
            );
            let (api, r) = api_for(x, &kind, ns).await?;
            let desired = prepare_child(object, target, r.namespaced);
            let name = desired["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let hash = desired["metadata"]["annotations"][APPLIED_HASH]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let live = x.view.get(&kind, ns, &name);
            if apply_is_noop(&desired, live.as_deref()) {
                if let Some(a) = x.applied {
                    a.settled(&(kind.clone(), ns.to_string(), name.clone()));
                }
                return Ok(None);
            }
            let live_hash = live.as_ref().and_then(|l| {
                l.value()
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(APPLIED_HASH))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
            let cache_lags = live_hash.as_deref() != Some(hash.as_str());
            if cache_lags
                && x.applied.is_some_and(|a| {
                    a.pending(&(kind.clone(), ns.to_string(), name.clone()))
                        .is_some_and(|h| h == hash)
                })
            {
                return Ok(None);
            }
            api.patch(&name, &pp, &Patch::Apply(&desired))
                .await
                .map_err(|e| {
                    ExecError::api(&format!("apply {}", target_string(&kind, ns, &name)), e)
                })?;
            if let Some(a) = x.applied {
                a.remember((kind.clone(), ns.to_string(), name.clone()), hash.clone());
            }
            Ok(Some(desired))
        }
        Action::Delete { kind, name } => {
            let k = policy.kinds.resolve(kind).map_err(ExecError::Invalid)?;
            if x.view.get(&k, ns, name).is_none() {
                return Ok(None);
            }
            let (api, _) = api_for(x, &k, ns).await?;
            match api.delete(name, &DeleteParams::background()).await {
                Ok(_) => Ok(Some(Value::Null)),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
                Err(e) => Err(ExecError::api(
                    &format!("delete {}", target_string(&k, ns, name)),
                    e,
                )),
            }
        }
        Action::Patch { kind, name, patch } => {
            let k = policy.kinds.resolve(kind).map_err(ExecError::Invalid)?;
            if let Some(live) = x.view.get(&k, ns, name) {
                let mut after = live.value().clone();
                json_patch::merge(&mut after, patch);
                if &after == live.value() {
                    return Ok(None);
                }
            }
            let (api, _) = api_for(x, &k, ns).await?;
            api.patch(
                name,
                &PatchParams {
                    field_manager: Some(MANAGER.into()),
                    ..Default::default()
                },
                &Patch::Merge(patch),
            )
            .await
            .map_err(|e| ExecError::api(&format!("patch {}", target_string(&k, ns, name)), e))?;
            Ok(Some(patch.clone()))
        }
        Action::Rollback {
            deployment,
            revision,
        } => match rollback::rollback(x.client, ns, deployment, *revision, MANAGER).await? {
            rollback::RolledBack::To { from, to } => {
                Ok(Some(json!({"fromRevision": from, "toRevision": to})))
            }
            rollback::RolledBack::AlreadyAt(_) => Ok(None),
        },
        _ => Ok(None),
    }
}

async fn publish(x: &Exec<'_>, target: &Value, warning: bool, reason: &str, message: &str) {
    if let Some(j) = x.journal {
        let m = &target["metadata"];
        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
        let type_ = if warning { "Warning" } else { "Normal" };
        j.record(
            Entry::new(x.now, "event", "ok")
                .object(
                    &s(&target["apiVersion"]),
                    &s(&target["kind"]),
                    &s(&m["namespace"]),
                    &s(&m["name"]),
                )
                .fields(json!({"type": type_, "reason": reason, "message": message}))
                .detail(format!("{type_} {reason}: {message}")),
        );
    }
    let Some(rec) = x.recorder else { return };
    let ev = KubeEvent {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(message.chars().take(1024).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = rec.publish(&ev, &object_ref(target)).await {
        tracing::warn!("recording an Event failed: {e}");
    }
}

/// An alert's labels as they leave: what the decision gave, with the
/// policy and the object it is about, and `alertname` and `severity`
/// defaulted.
fn alert_labels(
    given: &BTreeMap<String, String>,
    source: &AlertSource,
) -> BTreeMap<String, String> {
    let mut labels = given.clone();
    labels
        .entry("alertname".into())
        .or_insert_with(|| "RunbookAlert".into());
    labels.insert("policy".into(), source.policy.clone());
    labels.insert("kind".into(), source.kind.clone());
    labels.insert("namespace".into(), source.namespace.clone());
    labels.insert("name".into(), source.name.clone());
    labels
        .entry("severity".into())
        .or_insert_with(|| "warning".into());
    labels
}

/// The decision record to write. It is that of the last decision that
/// did something: one that repeats it, or that changes nothing at all
/// (`quiet`: no write, no Event, no problem; typically the reconcile our
/// own status write triggers), keeps the last record as it was, time and
/// inputs hash included, so it writes nothing. A decision that changes the
/// status is always recorded: the record is never older than the status
/// it sits in.
fn record_to_keep(
    mut record: DecisionRecord,
    previous: &DecisionRecord,
    status_unchanged: bool,
    quiet: bool,
    now: &str,
) -> DecisionRecord {
    let mut compare = record.clone();
    compare.time = previous.time.clone();
    compare.inputs_hash = previous.inputs_hash.clone();
    let idle = quiet
        && record.error.is_none()
        && previous.error.is_none()
        && record.policy_version == previous.policy_version
        && record.mode == previous.mode
        && record.alert_routes == previous.alert_routes;
    if previous.time.is_some() && status_unchanged && (compare == *previous || idle) {
        previous.clone()
    } else {
        record.time = Some(now.to_string());
        record
    }
}

/// What is wrong after a decision, as the reason and message of its
/// `Degraded` condition: a decide error first, then a failed action, a
/// refused one, one held by its limit.
fn problem_of(decide_error: Option<&DecideError>, out: &Outcome) -> Option<(&'static str, String)> {
    match (
        decide_error,
        &out.error,
        out.refused.first(),
        out.limited.first(),
    ) {
        (Some(e), _, _, _) => Some((
            match e {
                DecideError::Schedule { .. } => "ScheduleError",
                _ => "ScriptError",
            },
            e.to_string(),
        )),
        (None, Some(e), _, _) => Some(("ActionFailed", e.clone())),
        (None, None, Some((_, r)), _) => Some(("ActionRefused", r.clone())),
        (None, None, None, Some(l)) => Some(("ActionLimited", l.clone())),
        _ => None,
    }
}

/// The status a decision leaves, from the current one: its fields (none
/// when an action failed), its conditions, `Degraded` for a problem (or
/// cleared when Runbook had set it), and `observedGeneration`. Pure.
fn next_status(
    current: &Value,
    fields: Option<&Map<String, Value>>,
    conditions: &[(String, String, String, String)],
    problem: Option<&(&'static str, String)>,
    generation: Option<i64>,
    now: &str,
) -> Value {
    let mut new_status = current.clone();
    if let Some(fields) = fields {
        status::merge_fields(&mut new_status, fields);
    }
    for (ty, st, reason, message) in conditions {
        status::set_condition(&mut new_status, ty, st, reason, message, generation, now);
    }
    match problem {
        Some((reason, message)) => status::set_condition(
            &mut new_status,
            "Degraded",
            "True",
            reason,
            message,
            generation,
            now,
        ),
        None => {
            let ours = status::condition(&new_status, "Degraded").is_some_and(|c| {
                c["status"] == "True" && OWN_REASONS.contains(&c["reason"].as_str().unwrap_or(""))
            });
            if ours {
                status::set_condition(
                    &mut new_status,
                    "Degraded",
                    "False",
                    "Reconciled",
                    "the last decision was carried out",
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

/// Carry out a decision (or report why none could be made).
#[allow(clippy::too_many_arguments)]
pub async fn execute(
    x: &Exec<'_>,
    policy: &CompiledPolicy,
    routes: Option<&Arc<CompiledRoutes>>,
    target: &CachedObject,
    target_kind: &Resolved,
    decision: Result<&Decision, &DecideError>,
    mode: Mode,
) -> Outcome {
    let t = target.value();
    let ns = target.namespace().to_string();
    let name = target.name().to_string();
    let tkind = KindRef::new(
        t["apiVersion"].as_str().unwrap_or(""),
        t["kind"].as_str().unwrap_or(""),
    );
    let now = time::format(x.now);
    let generation = t.pointer("/metadata/generation").and_then(Value::as_i64);
    let current = t.get("status").cloned().unwrap_or(json!({}));
    let previous = DecisionRecord::of(t).unwrap_or_default();
    let mut out = Outcome::default();
    let mut recent = Recent::of(t);
    let mut fields = Map::new();
    let mut conditions: Vec<(String, String, String, String)> = Vec::new();
    let mut events: Vec<(bool, String, String)> = Vec::new();
    let mut alerts: Vec<Alert> = Vec::new();
    let mut route_names: BTreeSet<String> = BTreeSet::new();
    let source = AlertSource {
        policy: policy.name.clone(),
        api_version: tkind.api_version.clone(),
        kind: tkind.kind.clone(),
        namespace: ns.clone(),
        name: name.clone(),
        uid: target.uid().to_string(),
    };

    // One action's outcome goes to three places: the decision record, the
    // (verb, result) pairs metrics count, and the journal when someone
    // listens (with what was written, or its own word for the result).
    let settle = |out: &mut Outcome,
                  a: &Action,
                  tgt: Option<String>,
                  result: &'static str,
                  detail: Option<String>,
                  journal: Option<(&'static str, Value)>| {
        if let Some(j) = x.journal {
            let (said, wrote) = journal.unwrap_or((result, Value::Null));
            j.record(journal_entry(
                x,
                policy,
                a,
                (&tkind, &ns, &name),
                said,
                wrote,
                detail.as_deref(),
            ));
        }
        out.record.actions.push(record(a, tgt, result, detail));
        out.results.push((a.verb(), result));
    };

    let (inputs_hash, decide_error) = match decision {
        Ok(d) => (d.inputs_hash.clone(), None),
        Err(e) => (previous.inputs_hash.clone(), Some(e)),
    };
    if let Ok(d) = decision {
        for p in &d.actions {
            let a = &p.action;
            let tgt = action_target(a, &ns, &tkind, &name);
            if let Some(r) = &p.refusal {
                if let Some(j) = x.journal {
                    let mut e = journal_entry(
                        x,
                        policy,
                        a,
                        (&tkind, &ns, &name),
                        "refused",
                        Value::Null,
                        Some(r),
                    );
                    e.action = "refusal".into();
                    e.fields = json!({"action": a.verb()});
                    j.record(e);
                }
                out.refused.push((a.verb().to_string(), r.clone()));
                out.record
                    .actions
                    .push(record(a, tgt, "refused", Some(r.clone())));
                out.results.push((a.verb(), "refused"));
                continue;
            }
            match a {
                Action::Status { fields: f } => {
                    // Nulls are kept: they remove the field from the status.
                    status::accumulate(&mut fields, f);
                    out.record.actions.push(record(a, tgt, "ok", None));
                }
                Action::Condition {
                    type_,
                    status,
                    reason,
                    message,
                } => {
                    conditions.push((
                        type_.clone(),
                        status.clone(),
                        reason.clone(),
                        message.clone(),
                    ));
                    out.record.actions.push(record(a, tgt, "ok", None));
                }
                Action::Event {
                    type_,
                    reason,
                    message,
                } => {
                    events.push((type_ == "Warning", reason.clone(), message.clone()));
                    out.record.actions.push(record(
                        a,
                        tgt,
                        if mode == Mode::Enforce {
                            "ok"
                        } else {
                            "shadow"
                        },
                        None,
                    ));
                }
                Action::Alert {
                    labels,
                    annotations,
                } => {
                    let labels = alert_labels(labels, &source);
                    if let Some(r) = routes {
                        for rcv in r.receivers_for(&labels) {
                            route_names.insert(format!("{}/{rcv}", r.name));
                        }
                    }
                    alerts.push(Alert {
                        labels,
                        annotations: annotations.clone(),
                        starts_at: x.now,
                    });
                    out.record.actions.push(record(
                        a,
                        None,
                        if mode == Mode::Shadow { "shadow" } else { "ok" },
                        None,
                    ));
                }
                Action::Requeue { .. } => {}
                Action::Apply { .. }
                | Action::Delete { .. }
                | Action::Patch { .. }
                | Action::Rollback { .. } => {
                    let verb = a.verb();
                    if out.error.is_some() {
                        out.record.actions.push(record(
                            a,
                            tgt,
                            "skipped",
                            Some("an earlier action failed".into()),
                        ));
                        out.results.push((verb, "skipped"));
                        continue;
                    }
                    match &mode {
                        Mode::Shadow => {
                            settle(&mut out, a, tgt, "shadow", None, None);
                            continue;
                        }
                        Mode::Suspended(why) => {
                            settle(&mut out, a, tgt, "suspended", Some(why.clone()), None);
                            continue;
                        }
                        Mode::Enforce => {}
                    }
                    let limited = Verb::parse(verb)
                        .filter(|v| !recent.allows(&policy.limits, *v, x.now))
                        .and_then(|v| policy.limits.get(v));
                    if let Some(limit) = limited {
                        let m = format!("{verb} limit {limit} reached for this object");
                        out.limited.push(m.clone());
                        settle(&mut out, a, tgt, "limited", Some(m), None);
                        continue;
                    }
                    match write(x, policy, t, &ns, a).await {
                        Ok(Some(wrote)) => {
                            out.writes += 1;
                            if let Some(v) = Verb::parse(verb) {
                                recent.note(&policy.limits, v, x.now);
                            }
                            settle(&mut out, a, tgt, "ok", None, Some(("ok", wrote)));
                        }
                        // Nothing needed doing: "ok" in the record, told
                        // apart in the journal.
                        Ok(None) => settle(
                            &mut out,
                            a,
                            tgt,
                            "ok",
                            None,
                            Some(("unchanged", Value::Null)),
                        ),
                        Err(e) => {
                            let m = e.to_string();
                            out.error_label = Some(e.metric_label());
                            settle(&mut out, a, tgt, "failed", Some(m.clone()), None);
                            out.error = Some(m);
                        }
                    }
                }
            }
        }
    }
    if let Some(e) = decide_error {
        if let Some(j) = x.journal {
            j.record(
                Entry::new(x.now, "error", "failed")
                    .policy(&policy.name)
                    .object(&tkind.api_version, &tkind.kind, &ns, &name)
                    .detail(e.to_string()),
            );
        }
        out.error = Some(e.to_string());
        out.error_label = Some(e.metric_label());
    }

    // The status the decision leaves.
    let problem = problem_of(decide_error, &out);
    let mut new_status = next_status(
        &current,
        (out.error.is_none()).then_some(&fields),
        &conditions,
        problem.as_ref(),
        generation,
        &now,
    );
    out.record.policy = policy.name.clone();
    out.record.policy_version = policy.version.clone();
    out.record.inputs_hash = inputs_hash;
    out.record.mode = Some(mode.as_str().to_string());
    out.record.alert_routes = route_names.into_iter().collect();
    out.record.error = out.error.clone();
    out.record.recent_actions = recent.to_record(&policy.limits, x.now);
    let status_unchanged =
        status::merge_diff(&without_decision(&current), &without_decision(&new_status)).is_none();
    let quiet = out.writes == 0 && events.is_empty() && problem.is_none();
    out.record = record_to_keep(
        std::mem::take(&mut out.record),
        &previous,
        status_unchanged,
        quiet,
        &now,
    );
    new_status["decision"] = serde_json::to_value(&out.record).unwrap_or(Value::Null);

    if mode == Mode::Shadow {
        return out;
    }
    // Events: those the decision asked for, and a warning for each new problem.
    for (warning, reason, message) in &events {
        publish(x, t, *warning, reason, message).await;
    }
    if let Some((reason, message)) = &problem
        && previous.error.as_deref() != Some(message.as_str())
        && !previous
            .actions
            .iter()
            .any(|a| a.message.as_deref() == Some(message.as_str()))
    {
        publish(x, t, true, reason, message).await;
    }
    // A decision that failed says nothing about its alerts: keep them as
    // they were rather than resolve them.
    if decision.is_ok() {
        x.alerts.report(&source, routes, alerts);
    }

    if let Some(patch) = status::merge_diff(&current, &new_status) {
        match write_status(x, target_kind, &ns, &name, &patch).await {
            Ok(()) => {
                out.writes += 1;
                out.status_written = true;
                if let Some(j) = x.journal {
                    let mut set = Value::Object(fields.clone());
                    if let Some(c) = new_status.get("conditions") {
                        set["conditions"] = c.clone();
                    }
                    j.record(
                        Entry::new(x.now, "status", "ok")
                            .policy(&policy.name)
                            .object(&tkind.api_version, &tkind.kind, &ns, &name)
                            .fields(set),
                    );
                }
            }
            Err(e) => {
                let m = format!(
                    "writing the status of {}: {e}",
                    target_string(&tkind, &ns, &name)
                );
                out.error_label.get_or_insert("status");
                out.error.get_or_insert(m);
            }
        }
    }
    out
}

/// Write a status patch to the target, through its status subresource
/// when it has one.
async fn write_status(
    x: &Exec<'_>,
    target_kind: &Resolved,
    ns: &str,
    name: &str,
    patch: &Value,
) -> Result<(), kube::Error> {
    let api: Api<RawObject> = if target_kind.namespaced {
        Api::namespaced_with(x.client.clone(), ns, &target_kind.resource)
    } else {
        Api::all_with(x.client.clone(), &target_kind.resource)
    };
    tracing::debug!(target = %format!("{}/{name}", target_kind.resource.kind), namespace = %ns, patch = %patch, "writing status");
    let body = json!({"status": patch});
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    let result = if target_kind.status_subresource {
        api.patch_status(name, &pp, &Patch::Merge(&body)).await
    } else {
        api.patch(name, &pp, &Patch::Merge(&body)).await
    };
    result.map(|_| ())
}

/// A status without its decision record.
fn without_decision(status: &Value) -> Value {
    let mut s = status.clone();
    if let Some(m) = s.as_object_mut() {
        m.remove("decision");
    }
    s
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
        let conds = vec![(
            "Ready".to_string(),
            "True".to_string(),
            "ScoreAboveThreshold".to_string(),
            "ok".to_string(),
        )];
        let next = next_status(&current, Some(&fields), &conds, None, Some(3), NOW);
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
        let failed = next_status(&json!({}), None, &[], Some(&problem), None, NOW);
        assert!(failed.get("phase").is_none());
        assert_eq!(
            conditions(&failed),
            [(
                "Degraded".to_string(),
                "True".to_string(),
                "ActionFailed".to_string()
            )]
        );
        let clean = next_status(&failed, Some(&fields), &[], None, None, NOW);
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
        let kept = next_status(&theirs, Some(&fields), &[], None, None, NOW);
        assert_eq!(conditions(&kept)[0].2, "Theirs");
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
            result: "ok".into(),
            message: None,
        });
        assert_eq!(
            record_to_keep(newer, &previous, true, true, NOW).policy_version,
            "v2"
        );
    }

    #[test]
    fn alerts_carry_their_object_and_default_name_and_severity() {
        let source = AlertSource {
            policy: "drift".into(),
            api_version: "runbook.dev/v1alpha1".into(),
            kind: "Evaluator".into(),
            namespace: "ml".into(),
            name: "chatbot".into(),
            uid: "u".into(),
        };
        let given: BTreeMap<String, String> =
            [("severity".to_string(), "critical".to_string())].into();
        let labels = alert_labels(&given, &source);
        assert_eq!(labels["alertname"], "RunbookAlert");
        assert_eq!(labels["severity"], "critical");
        assert_eq!(labels["policy"], "drift");
        assert_eq!(labels["namespace"], "ml");
        assert_eq!(labels["name"], "chatbot");
    }
}
