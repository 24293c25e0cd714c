//! The plan: a decision turned into the writes it needs, with nothing
//! performed. Pure: the target, the cached children, what discovery said of
//! the kinds involved and what this process wrote lately go in; steps come
//! out, each a write to make or a result to record without one.
//!
//! Everything that decides *whether* to write is here: refusals, shadow
//! mode and an open circuit breaker, rate limits, and the comparison with
//! the cache that makes a no-op reconcile cost zero writes. The writer
//! (`runbook_operator::act::writer`) only performs what the plan says.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use jiff::Timestamp;
use serde_json::{Map, Value, json};

pub mod conclude;
pub mod pods;
pub mod state;
pub mod status;

pub use crate::failure::{Cause, Failed, Refusal, Refused};

use crate::alert::routes::CompiledRoutes;
use crate::alert::{Alert, AlertSource};
use crate::crd::ActionResult;
use crate::decide::Planned;
use crate::kinds::{KindRef, Role};
use crate::observe::Resolved;
use crate::observe::{
    CachedObject, OWNER_ANNOTATION, OWNER_UID_LABEL, ObjectView, POLICY_NAME_LABEL,
    policy_label_value, policy_of_child,
};
use crate::policy::compile::CompiledPolicy;
use crate::policy::limits::Recent;
use crate::script::action::{Action, Condition, EventType};

/// Annotation holding the hash of what Runbook last applied to a child.
pub const APPLIED_HASH: &str = "runbook.dev/applied-hash";

/// How a decision may act.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acting {
    Enforce,
    /// Decide and record, write nothing.
    Shadow,
    /// Writes suspended (circuit breaker open): record why.
    Suspended(String),
}

impl Acting {
    pub fn as_str(&self) -> &'static str {
        match self {
            Acting::Enforce => "enforce",
            Acting::Shadow => "shadow",
            Acting::Suspended(_) => "suspended",
        }
    }
}

/// A child by kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChildKey {
    pub kind: KindRef,
    pub namespace: String,
    pub name: String,
}

impl ChildKey {
    pub fn new(kind: &KindRef, namespace: &str, name: &str) -> Self {
        Self {
            kind: kind.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// Children applied by this process whose new version the watch cache may
/// not show yet, with the hash applied. Without it, a reconcile that runs
/// before the cache catches up would apply the same object again
/// (harmless, but a write).
pub type Applied = crate::observe::OwnWrites<ChildKey, AppliedWrite>;

/// One apply of a child by this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedWrite {
    /// The applied-hash annotation it wrote.
    pub hash: String,
    /// The child's resourceVersion the apply made ("" when the answer had
    /// none): the watch event of that version is the apply coming back.
    pub version: String,
}

impl Applied {
    /// The watch cache shows child `key` at `version` (`None`: deleted).
    /// Whether that is this process's own apply coming back: the version
    /// its answer named. Either that or the child's deletion settles the
    /// pending apply; a deleted child must be applied again, not taken for
    /// a cache that has not caught up (an apply the server found nothing
    /// to change in makes no watch event, so its entry would otherwise
    /// stay until the owner is decided with the child in the cache).
    pub fn seen(&self, key: &ChildKey, version: Option<&str>) -> bool {
        let Some(pending) = self.pending(key) else {
            return false;
        };
        let own = version.is_some_and(|v| !v.is_empty() && pending.version == v);
        if own || version.is_none() {
            self.settled(key);
        }
        own
    }
}

/// What discovery answered for each kind the decision writes (an error
/// fails the action that needed it, at its turn).
pub type Discovered = HashMap<KindRef, Result<Resolved, Failed>>;

/// Something the target's author must be allowed to do for an action to
/// be taken for them: what the API server's authorizer is asked.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Access {
    pub verb: &'static str,
    pub kind: KindRef,
    pub namespace: String,
    /// One object (`None`: every object of the kind in the namespace).
    pub name: Option<String>,
    /// Why the action needs it, as a refusal says it.
    pub why: String,
    /// The object's owner allowed this target to act on it (annotation
    /// [`ALLOW_TARGETS`]): nobody else need be asked.
    pub opted_in: bool,
}

/// The annotation with which the owner of an object lets targets act on
/// it whoever wrote them: `Kind/name`, `Kind/*` or `*`, comma-separated.
pub const ALLOW_TARGETS: &str = "runbook.dev/allow-targets";

/// The annotation Runbook leaves on an object it changed without owning
/// it (a rollback, a patch of a mutated kind): which policy, for which
/// target (`runbook explain` shows it).
pub const CHANGED_BY: &str = "runbook.dev/changed-by";

/// The value of [`CHANGED_BY`] for a write of this decision.
fn changed_by(input: &Input<'_>) -> String {
    let t = input.target.value();
    let kind = t.get("kind").and_then(Value::as_str).unwrap_or("target");
    let at = match input.target.namespace() {
        "" => input.target.name().to_string(),
        ns => format!("{ns}/{}", input.target.name()),
    };
    format!("policy {} for {kind} {at}", input.policy.name)
}

/// Whether `object`'s owner allows `target` (by its kind and name) to
/// act on it.
pub fn allows_target(object: &Value, target: &CachedObject) -> bool {
    let Some(list) = object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ALLOW_TARGETS))
        .and_then(Value::as_str)
    else {
        return false;
    };
    let kind = target
        .value()
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("");
    list.split(',').map(str::trim).any(|entry| {
        entry == "*"
            || entry.split_once('/').is_some_and(|(k, n)| {
                k.eq_ignore_ascii_case(kind) && (n == "*" || n == target.name())
            })
    })
}

/// What a plan is made from.
pub struct Input<'a> {
    pub policy: &'a CompiledPolicy,
    pub target: &'a CachedObject,
    /// The decision's actions (none when it could not be made).
    pub actions: &'a [Planned],
    pub mode: &'a Acting,
    /// The cached objects the decision's writes would change.
    pub view: &'a dyn ObjectView,
    pub discovered: &'a Discovered,
    /// Children this process applied that the cache may not show yet.
    pub applied: Option<&'a Applied>,
    pub routes: Option<&'a CompiledRoutes>,
    pub now: Timestamp,
}

/// One write to the API server.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Server-side apply of a child, ready to send (owner, labels, hash).
    Apply {
        kind: Resolved,
        key: ChildKey,
        object: Value,
        hash: String,
        /// The uid of the child the cache shows, sent as a precondition
        /// (the API server refuses the apply if the object of that name
        /// is another one by now). `None`: a new child; the writer first
        /// makes sure no object of that name exists.
        uid: Option<String>,
        /// The policy owns the child's fields outright (`spec.owns[].force`):
        /// one another field manager took is taken back.
        force: bool,
    },
    /// The deletion of a child, on condition that it is still the object
    /// of this uid.
    Delete {
        kind: Resolved,
        namespace: String,
        name: String,
        uid: String,
    },
    /// A JSON merge patch of a declared object (with the uid of a child as
    /// a precondition; none for an object the policy mutates).
    Patch {
        kind: Resolved,
        namespace: String,
        name: String,
        patch: Value,
        uid: Option<String>,
    },
    /// `kubectl rollout undo`: the writer reads the Deployment and its
    /// ReplicaSets fresh from the API server, as a rollback must.
    Rollback {
        namespace: String,
        deployment: String,
        revision: Option<i64>,
        /// Left on the Deployment as [`CHANGED_BY`].
        changed_by: String,
    },
}

/// What a step comes to.
#[derive(Clone, Debug, PartialEq)]
pub enum Todo {
    /// The policy may not do this (undeclared kind, other namespace).
    Refused(Refusal),
    /// Recorded with this result and detail; nothing to write.
    Record(ActionResult, Option<String>),
    /// The cluster already is as the action wants it.
    Unchanged,
    Write(Box<Write>),
    /// The write could not be prepared (discovery failed, a kind the
    /// policy does not declare): it fails at its turn.
    Fail(Failed),
}

/// One action of the decision and what to do about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub action: Action,
    /// `apiVersion Kind namespace/name` of the object acted on.
    pub target: Option<String>,
    pub todo: Todo,
    /// What the target's author must be allowed to do for its write to
    /// be made (acting on or taking in something the target refers to).
    pub needs: Vec<Access>,
}

impl Step {
    /// Whether the action writes to another object (a failed write before
    /// it means it is skipped).
    pub fn writes_elsewhere(&self) -> bool {
        self.action.limited_verb().is_some() && !matches!(self.todo, Todo::Refused(_))
    }
}

/// A decision as steps, with what it says of the target itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Status fields to merge (a null removes one).
    pub fields: Map<String, Value>,
    pub conditions: Vec<Condition>,
    /// Events the decision asked for.
    pub events: Vec<Note>,
    pub alerts: Vec<Alert>,
    /// `routes/receiver` of every receiver the alerts reach.
    pub routes: BTreeSet<String>,
    pub source: AlertSource,
    /// Children the cache now shows as this process applied them: no
    /// longer pending in the read-your-own-writes cache.
    pub settled: Vec<ChildKey>,
}

/// An Event to write on the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub type_: EventType,
    pub reason: String,
    pub message: String,
}

/// `apiVersion Kind namespace/name` (or without a namespace).
pub fn target_string(kind: &KindRef, ns: &str, name: &str) -> String {
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

/// The kind an applied object names.
pub fn kind_of(object: &Value) -> KindRef {
    KindRef::new(
        object["apiVersion"].as_str().unwrap_or(""),
        object["kind"].as_str().unwrap_or(""),
    )
}

/// The kinds whose discovery the decision's writes need, in order.
pub fn kinds_to_discover(policy: &CompiledPolicy, actions: &[Planned]) -> Vec<KindRef> {
    let mut out: Vec<KindRef> = Vec::new();
    for p in actions.iter().filter(|p| p.refusal.is_none()) {
        let kind = match &p.action {
            Action::Apply { object } => Some(kind_of(object)),
            Action::Delete { kind, .. } | Action::Patch { kind, .. } => {
                policy.kinds.resolve(kind).ok()
            }
            _ => None,
        };
        if let Some(k) = kind.filter(|k| !out.contains(k)) {
            out.push(k);
        }
    }
    out
}

/// The target kind and identity of the object an action is about.
fn action_target(a: &Action, ns: &str, target: &CachedObject) -> Option<String> {
    match a {
        Action::Apply { object } => Some(target_string(
            &kind_of(object),
            ns,
            object["metadata"]["name"].as_str().unwrap_or(""),
        )),
        Action::Delete {
            kind,
            name,
            namespace,
        } => Some(format!(
            "{kind} {}/{name}",
            namespace.as_deref().unwrap_or(ns)
        )),
        Action::Patch {
            kind,
            name,
            namespace,
            ..
        } => Some(format!(
            "{kind} {}/{name}",
            namespace.as_deref().unwrap_or(ns)
        )),
        Action::Rollback { deployment, .. } => {
            Some(format!("apps/v1 Deployment {ns}/{deployment}"))
        }
        Action::Status { .. } | Action::Condition { .. } | Action::Event { .. } => Some(
            target_string(&kind_of(target.value()), target.namespace(), target.name()),
        ),
        Action::Alert { labels, .. } => Some(format!(
            "alert {}",
            labels
                .get("alertname")
                .map_or("(no alertname)", String::as_str)
        )),
        Action::Requeue { .. } => None,
    }
}

/// An alert's labels as they leave: what the decision gave, with the
/// policy and the object it is about, and `alertname` and `severity`
/// defaulted.
pub fn alert_labels(
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

/// Plan a decision.
pub fn plan(input: &Input<'_>) -> Plan {
    let t = input.target;
    let ns = t.acting_namespace().to_string();
    let tkind = kind_of(t.value());
    let mut plan = Plan {
        source: AlertSource {
            policy: input.policy.id.clone(),
            api_version: tkind.api_version.clone(),
            kind: tkind.kind.clone(),
            namespace: t.namespace().to_string(),
            name: t.name().to_string(),
            uid: t.uid().to_string(),
        },
        ..Plan::default()
    };
    // Limits count the writes this plan makes, as if each succeeds: a
    // failed one skips every write after it anyway.
    let mut recent = Recent::of(t.value(), &input.policy.name);
    for p in input.actions {
        let a = &p.action;
        // A requeue says when to come back; there is nothing to record.
        if matches!(a, Action::Requeue { .. }) && p.refusal.is_none() {
            continue;
        }
        let target = action_target(a, &ns, t);
        let todo = match &p.refusal {
            Some(r) => Todo::Refused(r.clone()),
            None => about_target(input, &mut plan, a)
                .unwrap_or_else(|| elsewhere(input, &mut plan, &mut recent, &ns, a)),
        };
        plan.steps.push(Step {
            action: a.clone(),
            target,
            todo,
            needs: Vec::new(),
        });
    }
    // What this decision writes of its children: a child it makes may be
    // referred to by another without its author's rights (it is Runbook's
    // to make); an apply refused (an object of that name Runbook did not
    // make) is not one of them.
    let applies: Vec<(KindRef, String)> = plan
        .steps
        .iter()
        .filter_map(|s| match &s.todo {
            Todo::Write(w) => match &**w {
                Write::Apply { kind, key, .. } => Some((kind.kind_ref(), key.name.clone())),
                _ => None,
            },
            _ => None,
        })
        .collect();
    // A sweep acts for no target's author: with the rights its policy
    // declares (a tenant's, as the account its namespace acts as).
    let for_author = !input.policy.sweep;
    for i in (0..plan.steps.len()).filter(|_| for_author) {
        if let Todo::Write(w) = &plan.steps[i].todo {
            plan.steps[i].needs = needs_of(input, w, &applies);
        }
    }
    plan
}

/// What the target's author must be allowed for a write to be made for
/// them: to patch what the policy mutates and is not its child (a
/// rollback is a patch of the Deployment), and to read every Secret,
/// ConfigMap and PersistentVolumeClaim a child takes in (in its pods, or
/// a VolumeSnapshot's source) that is not one of the policy's own
/// children or made by this same decision.
fn needs_of(input: &Input<'_>, w: &Write, applies: &[(KindRef, String)]) -> Vec<Access> {
    let t = input.target;
    // Where the write is: the target's namespace, or another one the
    // policy may make children in (whose objects are looked up there).
    let ns = match w {
        Write::Apply { key, .. } => key.namespace.as_str(),
        Write::Delete { namespace, .. } => namespace.as_str(),
        _ => t.acting_namespace(),
    };
    let live = |kind: &KindRef, name: &str| input.view.get(kind, ns, name);
    let opted =
        |kind: &KindRef, name: &str| live(kind, name).is_some_and(|o| allows_target(o.value(), t));
    let access = |verb: &'static str, kind: KindRef, name: &str, why: String| Access {
        opted_in: opted(&kind, name),
        verb,
        namespace: ns.to_string(),
        name: Some(name.to_string()),
        why,
        kind,
    };
    // A write in another namespace than the target's is one its author
    // must be allowed there: Runbook's own rights reach further.
    let elsewhere = ns != t.acting_namespace();
    match w {
        Write::Patch {
            kind,
            name,
            uid: None,
            ..
        } if input.policy.kinds.has(&kind.kind_ref(), Role::Mutates) => {
            let k = kind.kind_ref();
            vec![access(
                "patch",
                k.clone(),
                name,
                format!("patch {k} {ns}/{name}"),
            )]
        }
        Write::Delete { kind, name, .. }
            if elsewhere
                || !live(&kind.kind_ref(), name).is_some_and(|o| {
                    o.is_child_of(&policy_label_value(&input.policy.name), t.uid())
                }) =>
        {
            let k = kind.kind_ref();
            vec![access(
                "delete",
                k.clone(),
                name,
                format!("delete {k} {ns}/{name}"),
            )]
        }
        Write::Rollback { deployment, .. } => {
            let k = KindRef::new("apps/v1", "Deployment");
            vec![access(
                "patch",
                k,
                deployment,
                format!("roll back Deployment {ns}/{deployment}"),
            )]
        }
        Write::Apply { key, object, .. } => {
            let mut out = Vec::new();
            let child = &key.name;
            if elsewhere {
                let verb = if live(&key.kind, child).is_some() {
                    "patch"
                } else {
                    "create"
                };
                let why = format!("{verb} {} {ns}/{child}", key.kind);
                out.push(Access {
                    opted_in: false,
                    ..access(verb, key.kind.clone(), child, why)
                });
            }
            for (kind, name) in taken_in(input, ns, object, applies) {
                let why = format!("put {} {name} into {} {child}", kind.kind, key.kind.kind);
                out.push(access("get", kind, &name, why));
            }
            out
        }
        _ => Vec::new(),
    }
}

/// The Secrets, ConfigMaps and PersistentVolumeClaims a child `object`
/// applied in `ns` takes in that are neither made by this decision
/// (`applies`) nor children the policy already made for the target.
fn taken_in(
    input: &Input<'_>,
    ns: &str,
    object: &serde_json::Value,
    applies: &[(KindRef, String)],
) -> Vec<(KindRef, String)> {
    let refs = self::pods::references(object);
    let mine = policy_label_value(&input.policy.name);
    let t = input.target;
    let mut out = Vec::new();
    for (kind, names) in [
        (KindRef::new("v1", "Secret"), &refs.secrets),
        (KindRef::new("v1", "ConfigMap"), &refs.config_maps),
        (KindRef::new("v1", "PersistentVolumeClaim"), &refs.claims),
    ] {
        for name in names {
            let ours = applies.iter().any(|(k, n)| *k == kind && n == name)
                || input
                    .view
                    .get(&kind, ns, name)
                    .is_some_and(|o| o.is_child_of(&mine, t.uid()));
            if !ours {
                out.push((kind.clone(), name.clone()));
            }
        }
    }
    out
}

/// The step of an action about the target itself (status, a condition,
/// an Event, an alert), gathered into the plan; `None` for the others.
fn about_target(input: &Input<'_>, plan: &mut Plan, a: &Action) -> Option<Todo> {
    let ok = Todo::Record(ActionResult::Ok, None);
    Some(match a {
        Action::Status { fields } => {
            // Nulls are kept: they remove the field from the status.
            status::accumulate(&mut plan.fields, fields);
            ok
        }
        Action::Condition(c) => {
            plan.conditions.push(c.clone());
            ok
        }
        Action::Event {
            type_,
            reason,
            message,
        } => {
            plan.events.push(Note {
                type_: *type_,
                reason: reason.clone(),
                message: message.clone(),
            });
            match input.mode {
                Acting::Enforce => ok,
                _ => Todo::Record(ActionResult::Shadow, None),
            }
        }
        Action::Alert {
            labels,
            annotations,
        } => {
            let labels = alert_labels(labels, &plan.source);
            if let Some(r) = input.routes {
                for rcv in r.receivers_for(&labels) {
                    plan.routes.insert(format!("{}/{rcv}", r.name));
                }
            }
            plan.alerts.push(Alert {
                labels,
                annotations: annotations.clone(),
                starts_at: input.now,
            });
            match input.mode {
                Acting::Shadow => Todo::Record(ActionResult::Shadow, None),
                _ => ok,
            }
        }
        _ => return None,
    })
}

/// The step of an action on another object: held back by the mode or a
/// limit, unchanged, or a write.
fn elsewhere(
    input: &Input<'_>,
    plan: &mut Plan,
    recent: &mut Recent,
    ns: &str,
    a: &Action,
) -> Todo {
    match input.mode {
        Acting::Shadow => return Todo::Record(ActionResult::Shadow, None),
        Acting::Suspended(why) => return Todo::Record(ActionResult::Suspended, Some(why.clone())),
        Acting::Enforce => {}
    }
    let limits = &input.policy.limits;
    let verb = a.limited_verb();
    if let Some((v, limit)) = verb
        .filter(|v| !recent.allows(limits, *v, input.now))
        .and_then(|v| Some((v, limits.get(v)?)))
    {
        return Todo::Record(
            ActionResult::Limited,
            Some(format!("{v} limit {limit} reached for this object")),
        );
    }
    let todo = write_of(input, plan, ns, a);
    if let (Todo::Write(_), Some(v)) = (&todo, verb) {
        recent.note(limits, v, input.now);
    }
    todo
}

fn discovered(input: &Input<'_>, kind: &KindRef) -> Result<Resolved, Failed> {
    match input.discovered.get(kind) {
        Some(r) => r.clone(),
        None => Err(Failed::new(
            Cause::Discovery,
            format!("discovering {kind}: it was not looked up"),
        )),
    }
}

/// The write of a delete action, or why none.
fn delete_of(
    input: &Input<'_>,
    ns: &str,
    kind: &crate::kinds::KindName,
    name: &str,
    namespace: Option<&str>,
) -> Todo {
    let policy = input.policy;
    let found = |kind: &KindRef| discovered(input, kind);
    let k = match policy.kinds.resolve(kind) {
        Ok(k) => k,
        Err(e) => return Todo::Fail(Failed::invalid(e)),
    };
    // A sweep's targets are in any namespace it acts in (the
    // permission check confines a tenant's to its own).
    let elsewhere = namespace.is_some_and(|n| n != ns) && !(policy.sweep && k == policy.target);
    let ns = namespace.unwrap_or(if k.namespaced() { ns } else { "" });
    let Some(live) = input.view.get(&k, ns, name) else {
        return Todo::Unchanged;
    };
    // What the policy did not make it deletes only where
    // `spec.deletes` declares it (its kind, its selector), and
    // only in its target's namespace.
    if (elsewhere || !policy.may_delete(&k, live.value()))
        && let Some(refusal) = not_its_child(input, "delete", &k, &live)
    {
        return refusal;
    }
    // Already on its way out (its own finalizers hold it): a
    // delete would change nothing, and is not sent again.
    if live
        .value()
        .pointer("/metadata/deletionTimestamp")
        .is_some()
    {
        return Todo::Unchanged;
    }
    match found(&k) {
        Ok(r) if let Some(refusal) = without_namespace("delete", &r, ns) => refusal,
        Ok(r) => Todo::Write(Box::new(Write::Delete {
            kind: r,
            namespace: ns.to_string(),
            name: name.to_string(),
            uid: live.uid().to_string(),
        })),
        Err(e) => Todo::Fail(e),
    }
}

/// The write of a patch action, or why none.
fn patch_of(
    input: &Input<'_>,
    namespace: Option<&str>,
    ns: &str,
    (kind, name): (&crate::kinds::KindName, &str),
    patch: &serde_json::Value,
) -> Todo {
    let policy = input.policy;
    let found = |kind: &KindRef| discovered(input, kind);
    let k = match policy.kinds.resolve(kind) {
        Ok(k) => k,
        Err(e) => return Todo::Fail(Failed::invalid(e)),
    };
    let ns = namespace.unwrap_or(if k.namespaced() { ns } else { "" });
    let live = input.view.get(&k, ns, name);
    // A child is patched only if it is this policy's own; an
    // object of a kind the policy mutates is not its child by
    // design (whose rights allow it is checked apart).
    let mutated = policy.kinds.has(&k, Role::Mutates);
    let mut uid = None;
    if let Some(live) = &live {
        let mine = policy_label_value(&policy.name);
        if live.is_child_of(&mine, input.target.uid()) {
            uid = Some(live.uid().to_string());
        } else if !mutated {
            return not_its_child(input, "patch", &k, live).unwrap_or(Todo::Unchanged);
        }
        let mut after = live.value().clone();
        json_patch::merge(&mut after, patch);
        if &after == live.value() {
            return Todo::Unchanged;
        }
    }
    // What is not its own child says who changed it.
    let mut patch = patch.clone();
    if uid.is_none()
        && let Some(p) = patch.as_object_mut()
    {
        let meta = p.entry("metadata").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            let notes = meta.entry("annotations").or_insert_with(|| json!({}));
            if let Some(notes) = notes.as_object_mut() {
                notes.insert(CHANGED_BY.into(), json!(changed_by(input)));
            }
        }
    }
    match found(&k) {
        Ok(r) if let Some(refusal) = without_namespace("patch", &r, ns) => refusal,
        Ok(r) => Todo::Write(Box::new(Write::Patch {
            kind: r,
            namespace: ns.to_string(),
            name: name.to_string(),
            patch,
            uid,
        })),
        Err(e) => Todo::Fail(e),
    }
}

/// The write an action needs, or why none is needed or possible.
fn write_of(input: &Input<'_>, plan: &mut Plan, ns: &str, a: &Action) -> Todo {
    match a {
        Action::Apply { object } => apply_of(input, plan, ns, object),
        Action::Delete {
            kind,
            name,
            namespace,
        } => delete_of(input, ns, kind, name, namespace.as_deref()),
        Action::Patch {
            kind,
            name,
            patch,
            namespace,
        } => patch_of(input, namespace.as_deref(), ns, (kind, name), patch),
        Action::Rollback {
            deployment,
            revision,
        } => Todo::Write(Box::new(Write::Rollback {
            namespace: ns.to_string(),
            deployment: deployment.clone(),
            revision: *revision,
            changed_by: changed_by(input),
        })),
        _ => Todo::Record(ActionResult::Ok, None),
    }
}

/// The refusal to touch an object that is not a child this policy made
/// for this target: another policy's child, or an object someone else
/// made that happens to have the name. Runbook never takes an object
/// over: applying to it would rewrite someone else's object and, through
/// the ownerReference, hand its life to the target.
fn not_its_child(
    input: &Input<'_>,
    verb: &str,
    kind: &KindRef,
    live: &CachedObject,
) -> Option<Todo> {
    let mine = policy_label_value(&input.policy.name);
    if live.is_child_of(&mine, input.target.uid()) {
        return None;
    }
    let t = input.target;
    let target = TargetId {
        kind: t.value().get("kind").and_then(Value::as_str).unwrap_or(""),
        namespace: t.namespace(),
        name: t.name(),
        uid: t.uid(),
    };
    Some(Todo::Fail(Failed::refused(not_its_child_message(
        verb,
        kind,
        live.value(),
        &mine,
        &target,
    ))))
}

/// A target as a refusal names it.
pub struct TargetId<'a> {
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// Why an object is not the policy's child, as a refusal says it.
pub fn not_its_child_message(
    verb: &str,
    kind: &KindRef,
    live: &Value,
    policy: &str,
    target: &TargetId<'_>,
) -> String {
    let tkind = target.kind;
    let controlled = crate::observe::controller_uid(live) == Some(target.uid);
    let why = match policy_of_child(live) {
        Some(other) if controlled && other != policy => {
            format!("it is the work of policy {other:?} ({POLICY_NAME_LABEL}), not of this one")
        }
        _ => format!(
            "an object of that name exists that Runbook did not make for {tkind} {}/{} \
             (it lacks the label {POLICY_NAME_LABEL}={policy} or a controller ownerReference to it); \
             Runbook never takes over an object it did not make: rename the {tkind} or remove that object{}",
            target.namespace,
            target.name,
            if verb == "delete" {
                " (a policy deletes objects it did not make only where spec.deletes declares them)"
            } else {
                ""
            }
        ),
    };
    let name = live
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    format!(
        "{verb} of {} refused: {why}",
        target_string(kind, target.namespace, name)
    )
}

/// The refusal of a write to a namespaced kind for a target with no
/// namespace (its kind is cluster-scoped): a policy acts in its target's
/// namespace, and there is none. Sent as it is, the request would have no
/// namespace, be answered 404 and be retried for ever.
fn without_namespace(verb: &'static str, r: &Resolved, ns: &str) -> Option<Todo> {
    (r.namespaced && ns.is_empty()).then(|| {
        Todo::Refused(Refusal::new(Refused::NoNamespace {
            verb,
            kind: r.kind_ref(),
        }))
    })
}

/// The server-side apply of a child, or why none is needed.
fn apply_of(input: &Input<'_>, plan: &mut Plan, ns: &str, object: &Value) -> Todo {
    let kind = kind_of(object);
    let r = match discovered(input, &kind) {
        Ok(r) => r,
        Err(e) => return Todo::Fail(e),
    };
    if let Some(refusal) = without_namespace("apply", &r, ns) {
        return refusal;
    }
    let desired = prepare_child(
        object,
        input.target.value(),
        r.namespaced,
        &policy_label_value(&input.policy.name),
    );
    let name = desired["metadata"]["name"].as_str().unwrap_or_default();
    // The target's namespace, or another the policy may make children in.
    let ns = desired["metadata"]["namespace"].as_str().unwrap_or(ns);
    if let Some(why) = self::pods::refusal(&desired, &input.policy.pods) {
        return Todo::Fail(Failed::refused(format!(
            "apply of {} refused: {why}",
            target_string(&kind, ns, name)
        )));
    }
    let hash = applied_hash(&desired).unwrap_or_default().to_string();
    let key = ChildKey::new(&kind, ns, name);
    let live = input.view.get(&kind, ns, name);
    if let Some(refusal) = live
        .as_deref()
        .and_then(|l| not_its_child(input, "apply", &kind, l))
    {
        return refusal;
    }
    if apply_is_noop(&desired, live.as_deref()) {
        plan.settled.push(key);
        return Todo::Unchanged;
    }
    // Applied by this process a moment ago, not in the cache yet.
    let cache_lags = live.as_deref().and_then(|l| applied_hash(l.value())) != Some(&hash);
    let pending = |own: &Applied| own.pending(&key).is_some_and(|w| w.hash == hash);
    if cache_lags && input.applied.is_some_and(pending) {
        return Todo::Unchanged;
    }
    Todo::Write(Box::new(Write::Apply {
        kind: r,
        key,
        object: desired,
        hash,
        uid: live.map(|l| l.uid().to_string()),
        force: input.policy.forced.contains(&kind),
    }))
}

fn applied_hash(v: &Value) -> Option<&str> {
    v.get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(APPLIED_HASH))
        .and_then(Value::as_str)
}

fn hash_of(v: &Value) -> String {
    crate::util::hash::json_hash(v, 16)
}

/// Fill in what every child gets: namespace, owner reference, the
/// managed-by label and the label of the policy that made it (its value
/// `policy`, see [`crate::observe::policy_label_value`]), the applied-hash
/// annotation.
pub fn prepare_child(object: &Value, target: &Value, namespaced: bool, policy: &str) -> Value {
    let mut o = object.clone();
    // `()` (null) in an object to apply means "leave the field out": the
    // API server stores no nulls, so keeping them would make the applied
    // object differ from the live one forever and re-apply it every time.
    without_nulls(&mut o);
    let mut meta = match o.as_object_mut().and_then(|m| m.remove("metadata")) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    // Where the target acts: its namespace, or a Namespace's own name.
    let target_ns = crate::observe::acting_namespace(target);
    // A child in another namespace (the policy declares `namespaces`,
    // checked before) names its target by label and annotation: an
    // ownerReference cannot cross namespaces.
    let elsewhere = meta
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|n| namespaced && !n.is_empty() && *n != target_ns)
        .is_some();
    if namespaced && !elsewhere {
        meta.insert("namespace".into(), json!(target_ns));
    }
    let owner = json!({
        "apiVersion": target["apiVersion"], "kind": target["kind"], "name": target["metadata"]["name"],
        "uid": target["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true
    });
    let mut refs: Vec<Value> = match meta.remove("ownerReferences") {
        Some(Value::Array(refs)) => refs
            .into_iter()
            .filter(|r| r["uid"] != owner["uid"] && r["controller"] != true)
            .collect(),
        _ => Vec::new(),
    };
    if elsewhere {
        let named = json!({
            "apiVersion": target["apiVersion"], "kind": target["kind"],
            "namespace": target["metadata"]["namespace"].as_str().unwrap_or(""),
            "name": target["metadata"]["name"],
        });
        with_map(&mut meta, "labels", |l| {
            l.insert(OWNER_UID_LABEL.into(), target["metadata"]["uid"].clone());
        });
        with_map(&mut meta, "annotations", |a| {
            a.insert(OWNER_ANNOTATION.into(), json!(named.to_string()));
        });
    } else {
        refs.push(owner);
    }
    if !refs.is_empty() || !elsewhere {
        meta.insert("ownerReferences".into(), Value::Array(refs));
    }
    // Scripts' objects are checked where they are made (`apply`), but
    // nothing here may panic on a shape it did not build: anything that is
    // not a map is replaced by one.
    with_map(&mut meta, "labels", |l| {
        l.entry("app.kubernetes.io/managed-by")
            .or_insert_with(|| json!("runbook"));
        l.insert(POLICY_NAME_LABEL.into(), json!(policy));
        // Sharded replicas: a child belongs where its target does.
        if let Some(shard) = target
            .pointer("/metadata/labels")
            .and_then(|t| t.get(crate::shard::SHARD_LABEL))
            .filter(|s| s.is_string())
        {
            l.insert(crate::shard::SHARD_LABEL.into(), shard.clone());
        }
    });
    with_map(&mut meta, "annotations", |a| {
        a.remove(APPLIED_HASH);
    });
    let mut o = match o {
        Value::Object(mut m) => {
            m.insert("metadata".into(), Value::Object(meta));
            Value::Object(m)
        }
        _ => json!({"metadata": meta}),
    };
    let h = hash_of(&without_owner_uid(&o));
    if let Some(a) = o
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        a.insert(APPLIED_HASH.into(), json!(h));
    }
    o
}

/// A child as its applied hash sees it: without its target's uid (in its
/// ownerReferences, or its owner label elsewhere), so that the same
/// target under another uid (a cluster captured into a scenario, where
/// every object is made again) has children of the same hash. Whether the
/// live child names this very target is still checked, field by field
/// (`apply_is_noop`).
fn without_owner_uid(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(refs) = meta
            .get_mut("ownerReferences")
            .and_then(Value::as_array_mut)
        {
            for r in refs.iter_mut().filter_map(Value::as_object_mut) {
                r.remove("uid");
            }
        }
        if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            labels.remove(OWNER_UID_LABEL);
        }
    }
    o
}

/// Change the map under `key`, made one first if it is absent or anything
/// else.
fn with_map(
    meta: &mut Map<String, Value>,
    key: &str,
    change: impl FnOnce(&mut Map<String, Value>),
) {
    let v = meta.entry(key).or_insert_with(|| json!({}));
    if !v.is_object() {
        *v = json!({});
    }
    if let Some(m) = v.as_object_mut() {
        change(m);
    }
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
    applied_hash(live.value()) == applied_hash(desired) && status::is_subset(desired, live.value())
}

#[cfg(test)]
mod tests {
    //! Objects in, steps out: no client, no clock but the one given.
    use super::*;
    use crate::kinds::KindName;
    use crate::observe::MemoryView;
    use crate::plan::AppliedWrite;
    use crate::policy::{self, Bundle, Origin};
    use crate::script::ScriptEngine;
    use kube_core::ApiResource;
    use std::sync::Arc;

    const POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: widget}
spec:
  target: {apiVersion: example.com/v1, kind: Widget}
  owns: [{apiVersion: v1, kind: ConfigMap}, {apiVersion: v1, kind: Pod}]
  mutates: [{apiVersion: apps/v1, kind: Deployment}]
  script: widget.rhai
  limits: {rollback: 1/1h}
"#;

    fn policy() -> CompiledPolicy {
        let engine = ScriptEngine::default();
        let files = [
            ("widget.yaml", POLICY),
            ("widget.rhai", "fn reconcile(ctx) { [] }"),
        ];
        let bundle = Bundle::new(
            Origin::Inline("plan".into()),
            files
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let (set, errors) = policy::load(&engine, &[bundle]);
        assert!(errors.is_empty(), "{errors:?}");
        set.policies["widget"].as_ref().clone()
    }

    fn widget(status: Value) -> Arc<CachedObject> {
        CachedObject::new(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "uid": "u-1", "generation": 1},
            "status": status,
        }))
    }

    fn resolved(api_version: &str, kind: &str, plural: &str) -> Resolved {
        Resolved {
            resource: ApiResource::from_gvk_with_plural(
                &kube_core::GroupVersionKind::gvk(
                    KindRef::new(api_version, kind).group(),
                    KindRef::new(api_version, kind).version(),
                    kind,
                ),
                plural,
            ),
            namespaced: true,
            status_subresource: false,
        }
    }

    fn discovered() -> Discovered {
        [
            (
                KindRef::new("v1", "ConfigMap"),
                Ok(resolved("v1", "ConfigMap", "configmaps")),
            ),
            (
                KindRef::new("apps/v1", "Deployment"),
                Ok(resolved("apps/v1", "Deployment", "deployments")),
            ),
            (KindRef::new("v1", "Pod"), Ok(resolved("v1", "Pod", "pods"))),
        ]
        .into()
    }

    fn planned(action: Action) -> Planned {
        Planned {
            action,
            origin: None,
            refusal: None,
        }
    }

    fn config_map(name: &str, x: &str) -> Action {
        Action::Apply {
            object: json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name}, "data": {"x": x}}),
        }
    }

    /// Plan `actions` against `target`, with the view holding `live`.
    fn plan_of(target: &CachedObject, live: &[Value], mode: Acting, actions: Vec<Action>) -> Plan {
        plan_after(target, live, None, mode, actions)
    }

    /// `plan_of`, with the applies this process made that may be pending.
    fn plan_after(
        target: &CachedObject,
        live: &[Value],
        applied: Option<&Applied>,
        mode: Acting,
        actions: Vec<Action>,
    ) -> Plan {
        let view = MemoryView::new();
        for v in live {
            view.insert(v.clone());
        }
        let actions: Vec<Planned> = actions.into_iter().map(planned).collect();
        plan(&Input {
            policy: &policy(),
            target,
            actions: &actions,
            mode: &mode,
            view: &view,
            discovered: &discovered(),
            applied,
            routes: None,
            now: "2026-11-29T10:00:00Z".parse().unwrap(),
        })
    }

    /// The write of step `i`, if it is one.
    fn write(p: &Plan, i: usize) -> Option<&Write> {
        match &p.steps.get(i)?.todo {
            Todo::Write(w) => Some(w),
            _ => None,
        }
    }

    fn todos(p: &Plan) -> Vec<&Todo> {
        p.steps.iter().map(|s| &s.todo).collect()
    }

    #[test]
    fn a_new_child_is_applied_with_its_owner_label_and_hash() {
        let w = widget(json!({}));
        let p = plan_of(&w, &[], Acting::Enforce, vec![config_map("w-a", "1")]);
        let Some(Write::Apply {
            key, object, hash, ..
        }) = write(&p, 0)
        else {
            panic!("an apply, got {:?}", todos(&p));
        };
        assert_eq!(p.steps.len(), 1);
        assert_eq!(
            key,
            &ChildKey::new(&KindRef::new("v1", "ConfigMap"), "ns", "w-a")
        );
        assert_eq!(object["metadata"]["namespace"], "ns");
        assert_eq!(object["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(
            object["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "runbook"
        );
        assert_eq!(
            object["metadata"]["annotations"][APPLIED_HASH],
            hash.as_str()
        );
        assert_eq!(p.steps[0].target.as_deref(), Some("v1 ConfigMap ns/w-a"));
    }

    /// A target made again under another uid (a captured cluster in a
    /// scenario) has children of the same hash; the live child must
    /// still name the target of this uid to be taken as applied.
    #[test]
    fn a_childs_hash_does_not_hang_on_its_targets_uid() {
        let target = |uid: &str| {
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "ns", "uid": uid}})
        };
        let child = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "w-a"}, "data": {"x": "1"}});
        let first = prepare_child(&child, &target("u-1"), true, "widget");
        let again = prepare_child(&child, &target("u-2"), true, "widget");
        assert_eq!(applied_hash(&first), applied_hash(&again));
        assert_ne!(first, again);
        let live = CachedObject::new(first.clone());
        assert!(apply_is_noop(&first, Some(&live)));
        assert!(
            !apply_is_noop(&again, Some(&live)),
            "the live child names u-1"
        );
        // A quantity the API server answers as a string is the number
        // applied.
        let mut quantity = first.clone();
        quantity["data"] = json!({"x": 1});
        assert!(status::is_subset(&quantity, live.value()));
    }

    #[test]
    fn a_child_the_cache_shows_as_applied_is_not_written_again() {
        let w = widget(json!({}));
        let first = plan_of(&w, &[], Acting::Enforce, vec![config_map("w-a", "1")]);
        let Some(Write::Apply { object, .. }) = write(&first, 0) else {
            panic!("an apply");
        };
        let mut live = object.clone();
        live["metadata"]["resourceVersion"] = json!("7");
        let again = plan_of(
            &w,
            &[live.clone()],
            Acting::Enforce,
            vec![config_map("w-a", "1")],
        );
        assert_eq!(todos(&again), [&Todo::Unchanged]);
        assert_eq!(again.settled.len(), 1, "no longer pending");
        // A changed child is written.
        let changed = plan_of(&w, &[live], Acting::Enforce, vec![config_map("w-a", "2")]);
        assert!(matches!(write(&changed, 0), Some(Write::Apply { .. })));
    }

    #[test]
    fn a_pending_apply_settles_on_its_own_version_or_the_childs_deletion() {
        let w = widget(json!({}));
        let first = plan_of(&w, &[], Acting::Enforce, vec![config_map("w-a", "1")]);
        let Some(Write::Apply { key, hash, .. }) = write(&first, 0) else {
            panic!("an apply, got {:?}", todos(&first));
        };
        let applied = Applied::default();
        let pending = AppliedWrite {
            hash: hash.clone(),
            version: "7".into(),
        };
        applied.remember(key.clone(), pending.clone());
        // Until the cache shows the child, the apply is taken for cache lag.
        let lagging = plan_after(
            &w,
            &[],
            Some(&applied),
            Acting::Enforce,
            vec![config_map("w-a", "1")],
        );
        assert_eq!(todos(&lagging), [&Todo::Unchanged]);
        // Another writer's version of the child is not the apply coming back.
        assert!(!applied.seen(key, Some("6")));
        assert_eq!(applied.pending(key), Some(pending.clone()));
        // The version the apply's answer named is.
        assert!(applied.seen(key, Some("7")));
        assert_eq!(applied.pending(key), None);
        // An apply the server found nothing to change in makes no watch
        // event of its own: when the child is then deleted, the deletion
        // settles it and the child is applied again.
        applied.remember(key.clone(), pending);
        assert!(!applied.seen(key, None));
        assert_eq!(applied.pending(key), None);
        let again = plan_after(
            &w,
            &[],
            Some(&applied),
            Acting::Enforce,
            vec![config_map("w-a", "1")],
        );
        assert!(
            matches!(write(&again, 0), Some(Write::Apply { .. })),
            "the deleted child is applied again, got {:?}",
            todos(&again)
        );
    }

    /// A ConfigMap `name` as someone other than this policy left it.
    fn foreign(name: &str, labels: Value, owner_uid: Option<&str>) -> Value {
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                                         "resourceVersion": "3", "labels": labels},
                            "data": {"admin": "yes"}});
        if let Some(uid) = owner_uid {
            cm["metadata"]["ownerReferences"] = json!([{"apiVersion": "example.com/v1", "kind": "Widget",
                                                        "name": "w", "uid": uid, "controller": true}]);
        }
        cm
    }

    #[test]
    fn an_object_of_a_childs_name_that_the_policy_did_not_make_is_refused_not_taken_over() {
        let w = widget(json!({}));
        let ours =
            json!({"app.kubernetes.io/managed-by": "runbook", "runbook.dev/policy-name": "widget"});
        for (why, live) in [
            ("an admin's object", foreign("w-a", json!({}), None)),
            (
                "labelled as ours, owned by no one",
                foreign("w-a", ours.clone(), None),
            ),
            (
                "labelled as ours, controlled by another target",
                foreign("w-a", ours.clone(), Some("u-2")),
            ),
            (
                "controlled by the target, unlabelled",
                foreign("w-a", json!({}), Some("u-1")),
            ),
            (
                "another policy's child of the target",
                foreign(
                    "w-a",
                    json!({"app.kubernetes.io/managed-by": "runbook", "runbook.dev/policy-name": "other"}),
                    Some("u-1"),
                ),
            ),
        ] {
            let p = plan_of(
                &w,
                std::slice::from_ref(&live),
                Acting::Enforce,
                vec![config_map("w-a", "1")],
            );
            let Todo::Fail(f) = &p.steps[0].todo else {
                panic!("{why}: a refusal, got {:?}", todos(&p));
            };
            assert!(f.is_refusal(), "{why}: {f:?}");
            assert!(
                f.message
                    .starts_with("apply of v1 ConfigMap ns/w-a refused: "),
                "{why}: {}",
                f.message
            );
            let delete = Action::Delete {
                kind: KindName::parse("ConfigMap"),
                name: "w-a".into(),
                namespace: None,
            };
            let patch = Action::Patch {
                kind: KindName::parse("ConfigMap"),
                name: "w-a".into(),
                patch: json!({"data": {"admin": "no"}}),
                namespace: None,
            };
            let p = plan_of(&w, &[live], Acting::Enforce, vec![delete, patch]);
            for (i, verb) in [(0, "delete"), (1, "patch")] {
                assert!(
                    matches!(&p.steps[i].todo, Todo::Fail(f) if f.is_refusal() && f.message.starts_with(verb)),
                    "{why}: {verb}: {:?}",
                    p.steps[i].todo
                );
            }
        }
        let admin = plan_of(
            &w,
            &[foreign("w-a", json!({}), None)],
            Acting::Enforce,
            vec![config_map("w-a", "1")],
        );
        let Todo::Fail(f) = &admin.steps[0].todo else {
            unreachable!()
        };
        assert!(
            f.message
                .contains("Runbook never takes over an object it did not make"),
            "{}",
            f.message
        );
    }

    /// A child the same decision makes may be put into another without
    /// the author's rights; an object of that name the policy did not make
    /// (its apply refused) is the author's to read, whatever the order.
    #[test]
    fn a_refused_apply_does_not_vouch_for_what_another_child_takes_in() {
        let w = widget(json!({}));
        let pod = Action::Apply {
            object: json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w-run"},
                           "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                    "volumes": [{"name": "v", "configMap": {"name": "w-a"}}]}}),
        };
        let needs = |live: &[Value]| {
            let p = plan_of(
                &w,
                live,
                Acting::Enforce,
                vec![pod.clone(), config_map("w-a", "1")],
            );
            let what: Vec<String> = p.steps[0]
                .needs
                .iter()
                .map(|a| {
                    format!(
                        "{} {} {}",
                        a.verb,
                        a.kind.kind,
                        a.name.clone().unwrap_or_default()
                    )
                })
                .collect();
            (
                what,
                todos(&p)
                    .iter()
                    .map(|t| format!("{t:?}"))
                    .collect::<Vec<_>>(),
            )
        };
        let (made, _) = needs(&[]);
        assert!(made.is_empty(), "{made:?}");
        let (taken, todos) = needs(&[foreign("w-a", json!({}), None)]);
        assert_eq!(taken, ["get ConfigMap w-a"], "{todos:?}");
        assert!(todos[1].contains("refused"), "{todos:?}");
    }

    #[test]
    fn writes_to_a_child_name_its_uid_and_a_new_child_none() {
        let w = widget(json!({}));
        let first = plan_of(&w, &[], Acting::Enforce, vec![config_map("w-a", "1")]);
        let Some(Write::Apply { object, uid, .. }) = write(&first, 0) else {
            panic!("an apply, got {:?}", todos(&first));
        };
        assert_eq!(
            uid, &None,
            "a new child: the writer looks before it applies"
        );
        let mut live = object.clone();
        live["metadata"]["uid"] = json!("uid-child");
        live["metadata"]["resourceVersion"] = json!("7");
        let delete = Action::Delete {
            kind: KindName::parse("ConfigMap"),
            name: "w-a".into(),
            namespace: None,
        };
        let p = plan_of(
            &w,
            std::slice::from_ref(&live),
            Acting::Enforce,
            vec![config_map("w-a", "2"), delete],
        );
        assert!(
            matches!(write(&p, 0), Some(Write::Apply { uid: Some(u), .. }) if u == "uid-child")
        );
        assert!(matches!(write(&p, 1), Some(Write::Delete { uid, .. }) if uid == "uid-child"));
        // Once it is terminating, deleting it again changes nothing.
        let mut terminating = live.clone();
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let delete = Action::Delete {
            kind: KindName::parse("ConfigMap"),
            name: "w-a".into(),
            namespace: None,
        };
        let p = plan_of(&w, &[terminating], Acting::Enforce, vec![delete]);
        assert_eq!(todos(&p), [&Todo::Unchanged]);
    }

    #[test]
    fn deleting_what_is_gone_and_patching_to_what_is_are_unchanged() {
        let w = widget(json!({}));
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                                "metadata": {"name": "web", "namespace": "ns"}, "spec": {"replicas": 2}});
        let delete = Action::Delete {
            kind: KindName::parse("ConfigMap"),
            name: "w-old".into(),
            namespace: None,
        };
        let same = Action::Patch {
            kind: KindName::parse("Deployment"),
            name: "web".into(),
            patch: json!({"spec": {"replicas": 2}}),
            namespace: None,
        };
        let scale = Action::Patch {
            kind: KindName::parse("Deployment"),
            name: "web".into(),
            patch: json!({"spec": {"replicas": 3}}),
            namespace: None,
        };
        let p = plan_of(
            &w,
            &[deployment],
            Acting::Enforce,
            vec![delete, same, scale],
        );
        assert_eq!(todos(&p)[..2], [&Todo::Unchanged, &Todo::Unchanged]);
        assert!(matches!(
            write(&p, 2),
            Some(Write::Patch { name, patch, .. }) if name == "web" && patch["spec"]["replicas"] == 3
        ));
    }

    #[test]
    fn a_limit_holds_the_write_past_it_with_the_limit_named() {
        let rollback = || Action::Rollback {
            deployment: "web".into(),
            revision: None,
        };
        let fresh = widget(json!({}));
        let p = plan_of(&fresh, &[], Acting::Enforce, vec![rollback(), rollback()]);
        assert!(matches!(write(&p, 0), Some(Write::Rollback { .. })));
        assert_eq!(
            p.steps[1].todo,
            Todo::Record(
                ActionResult::Limited,
                Some("rollback limit 1/1h00m reached for this object".into())
            )
        );
        // Another policy's rollback on the target is its own to count.
        let theirs = widget(
            json!({"decisions": [{"policy": "other", "policyVersion": "v", "inputsHash": "h",
            "recentActions": {"rollback": ["2026-11-29T09:50:00Z"]}}]}),
        );
        let p = plan_of(&theirs, &[], Acting::Enforce, vec![rollback()]);
        assert!(matches!(write(&p, 0), Some(Write::Rollback { .. })));
        // This policy's rollback ten minutes ago counts.
        let recent = widget(
            json!({"decisions": [{"policy": "widget", "policyVersion": "v", "inputsHash": "h",
            "recentActions": {"rollback": ["2026-11-29T09:50:00Z"]}}]}),
        );
        let p = plan_of(&recent, &[], Acting::Enforce, vec![rollback()]);
        assert!(matches!(
            p.steps[0].todo,
            Todo::Record(ActionResult::Limited, _)
        ));
    }

    #[test]
    fn shadow_and_suspended_modes_write_nothing() {
        let w = widget(json!({}));
        let shadow = plan_of(&w, &[], Acting::Shadow, vec![config_map("w-a", "1")]);
        assert_eq!(todos(&shadow), [&Todo::Record(ActionResult::Shadow, None)]);
        let open = Acting::Suspended("3 errors in 1m".into());
        let suspended = plan_of(&w, &[], open, vec![config_map("w-a", "1")]);
        assert_eq!(
            todos(&suspended),
            [&Todo::Record(
                ActionResult::Suspended,
                Some("3 errors in 1m".into())
            )]
        );
    }

    #[test]
    fn what_the_decision_says_of_the_target_is_gathered_not_written() {
        let w = widget(json!({}));
        let status = Action::Status {
            fields: json!({"phase": "Ready"}).as_object().cloned().unwrap(),
        };
        let ready = Action::Condition(Condition {
            type_: "Ready".into(),
            status: crate::script::action::ConditionStatus::True,
            reason: "Done".into(),
            message: "all there".into(),
        });
        let event = Action::Event {
            type_: EventType::Normal,
            reason: "Made".into(),
            message: "made it".into(),
        };
        let alert = Action::Alert {
            labels: [("severity".to_string(), "critical".to_string())].into(),
            annotations: Default::default(),
        };
        let requeue = Action::Requeue { after_ms: 1000 };
        let p = plan_of(
            &w,
            &[],
            Acting::Enforce,
            vec![status, ready, event, alert, requeue],
        );
        assert_eq!(p.steps.len(), 4, "a requeue is not a step");
        assert!(
            p.steps
                .iter()
                .all(|s| s.todo == Todo::Record(ActionResult::Ok, None))
        );
        assert_eq!(p.fields["phase"], "Ready");
        assert_eq!(p.conditions[0].type_, "Ready");
        assert_eq!(p.events[0].reason, "Made");
        assert_eq!(p.alerts[0].labels["severity"], "critical");
        assert_eq!(p.alerts[0].labels["alertname"], "RunbookAlert");
        assert_eq!(p.alerts[0].labels["name"], "w");
    }

    #[test]
    fn a_refusal_and_an_unknown_kind_are_steps_that_write_nothing() {
        let w = widget(json!({}));
        let mut refused = planned(config_map("w-a", "1"));
        let secret = Refusal {
            why: Refused::Undeclared {
                verb: "apply",
                kind: KindRef::new("v1", "Secret"),
                roles: "owns",
            },
            origin: Some("p.rhai:3:5".into()),
        };
        refused.refusal = Some(secret.clone());
        let undeclared = planned(Action::Delete {
            kind: KindName::parse("Secret"),
            name: "s".into(),
            namespace: None,
        });
        let mut undiscovered = planned(Action::Apply {
            object: json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}}),
        });
        undiscovered.refusal = None;
        let view = MemoryView::new();
        let actions = vec![refused, undeclared, undiscovered];
        let p = plan(&Input {
            policy: &policy(),
            target: &w,
            actions: &actions,
            mode: &Acting::Enforce,
            view: &view,
            discovered: &discovered(),
            applied: None,
            routes: None,
            now: "2026-11-29T10:00:00Z".parse().unwrap(),
        });
        assert_eq!(p.steps[0].todo, Todo::Refused(secret));
        assert!(matches!(&p.steps[1].todo, Todo::Fail(f) if f.cause == Cause::Invalid));
        assert!(
            matches!(&p.steps[2].todo, Todo::Fail(f) if f.message.starts_with("discovering batch/v1 Job"))
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
