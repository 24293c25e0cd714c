//! The writer: the one place a decision's writes reach the API server
//! (children applied, deleted and patched, rollbacks, the target's status
//! and finalizers, Events), and where the journal hears what became of
//! each. It decides nothing: the plan said what to write.

use std::sync::Arc;

use jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::{Request, Resource};
use serde::Serialize;
use serde_json::{Value, json};

use super::plan::{Note, Step, Write, kind_of, target_string};
use super::{Applied, AppliedWrite, ExecError, rollback};
use crate::events::{Event, EventWriter};
use crate::telemetry::journal::{Entry, Journal};
use runbook_core::kinds::KindRef;
use runbook_core::observe::Resolved;
use runbook_core::observe::{RawObject, finalizers_of};
use runbook_core::policy::compile::CompiledPolicy;
use runbook_core::script::action::{Action, event_type_str};

/// The field manager of Runbook's own writes; a policy's writes use
/// [`manager_of`] it.
pub const MANAGER: &str = crate::admission::author::MANAGER;

/// The field manager of a policy's writes, `runbook/POLICY`, so
/// `kubectl get --show-managed-fields` tells which policy wrote what
/// (at most 128 characters, as the API server allows).
pub fn manager_of(policy: &str) -> String {
    let m = format!("{MANAGER}/{policy}");
    if m.len() <= 128 {
        return m;
    }
    let cut = policy.char_indices().take_while(|(i, _)| *i < 100).count();
    let head: String = policy.chars().take(cut).collect();
    let hash = runbook_core::util::hash::short_hex(policy.as_bytes(), 8);
    format!("{MANAGER}/{head}-{hash}")
}

/// The field manager of Runbook's writes of its own state.
pub const STATE_MANAGER: &str = "runbook";

/// Writes for one reconcile.
#[derive(Clone, Copy)]
pub struct Writer<'a> {
    pub client: &'a kube::Client,
    /// Where Events go (none: Events are only journaled).
    pub recorder: Option<&'a EventWriter>,
    /// Who hears every outcome (scenarios), if anyone.
    pub journal: Option<&'a dyn Journal>,
    /// What this process applied lately, for when the cache lags.
    pub applied: Option<&'a Applied>,
    pub now: Timestamp,
    /// The field manager of every write ([`manager_of`] the policy).
    pub manager: &'a str,
}

fn api(client: &kube::Client, kind: &Resolved, ns: &str) -> Api<RawObject> {
    let resource = Arc::new(kind.resource.clone());
    if kind.namespaced {
        Api::namespaced_with(client.clone(), ns, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    }
}

/// Requests for a kind's objects in a namespace (or cluster-wide).
fn requests(kind: &Resolved, ns: &str) -> Request {
    let ns = kind.namespaced.then_some(ns);
    Request::new(kube::core::DynamicObject::url_path(&kind.resource, ns))
}

/// Send a patch, `subresource` of the object if one is named. Of the
/// answer only the status counts (an error is an error); the object it
/// carries is not decoded, since nothing reads it.
async fn send_patch<P: Serialize + std::fmt::Debug>(
    client: &kube::Client,
    request: Request,
    subresource: Option<&str>,
    name: &str,
    pp: &PatchParams,
    patch: &Patch<P>,
) -> Result<String, kube::Error> {
    let req = match subresource {
        Some(sub) => request.patch_subresource(sub, name, pp, patch),
        None => request.patch(name, pp, patch),
    }
    .map_err(kube::Error::BuildRequest)?;
    client.request_text(req).await
}

/// The resourceVersion of the object in an API answer ("" if it has none),
/// read without building the object.
fn version_of(answer: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Answer {
        metadata: Meta,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion", default)]
        resource_version: String,
    }
    serde_json::from_str::<Answer>(answer)
        .map(|a| a.metadata.resource_version)
        .unwrap_or_default()
}

/// The identity of the target of an object: kind, namespace, name.
fn identity(target: &Value) -> (String, String, String, String) {
    let m = &target["metadata"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    (
        s(&target["apiVersion"]),
        s(&target["kind"]),
        s(&m["namespace"]),
        s(&m["name"]),
    )
}

/// Delete in the background, on condition that the object is still `uid`.
fn delete_params(uid: &str) -> DeleteParams {
    let mut d = DeleteParams::background();
    if !uid.is_empty() {
        d = d.preconditions(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        });
    }
    d
}

/// `object` with `metadata.uid` set to `uid` (if given): sent with a
/// write, the API server refuses it when the object of that name is not
/// that one (deleted and made again by someone else meanwhile).
fn with_uid(object: &Value, uid: Option<&str>) -> Value {
    let mut o = object.clone();
    if let (Some(uid), Some(m)) = (uid, o.as_object_mut()) {
        let meta = m.entry("metadata").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("uid".into(), json!(uid));
        }
    }
    o
}

pub use crate::admission::is_runbook_manager;

/// The fields an apply conflicted over, each with the field manager that
/// holds it (`conflict with "kubectl-edit" using v1`, `.data.k`), from the
/// API server's answer; empty when the error is not such a conflict.
pub fn conflicts(e: &kube::Error) -> Vec<(String, String)> {
    let kube::Error::Api(s) = e else {
        return Vec::new();
    };
    if s.code != 409 {
        return Vec::new();
    }
    let Some(details) = &s.details else {
        return Vec::new();
    };
    details
        .causes
        .iter()
        .filter(|c| c.reason == "FieldManagerConflict")
        .filter_map(|c| {
            let rest = c.message.split_once('"')?.1;
            Some((rest.split_once('"')?.0.to_string(), c.field.clone()))
        })
        .collect()
}

/// The field managers an apply conflicted with (see [`conflicts`]).
pub fn conflicting_managers(e: &kube::Error) -> Vec<String> {
    conflicts(e).into_iter().map(|(m, _)| m).collect()
}

/// What a forced apply took back, as its Event says it: each other
/// manager with the fields it had.
fn reverted_message(taken: &[(String, String)]) -> String {
    let mut by_manager: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (manager, field) in taken.iter().filter(|(m, _)| !is_runbook_manager(m)) {
        by_manager.entry(manager).or_default().push(field);
    }
    let parts: Vec<String> = by_manager
        .iter()
        .map(|(m, fields)| format!("{} from {m:?}", fields.join(", ")))
        .collect();
    format!(
        "took back what the policy writes (spec.owns force): {}",
        parts.join("; ")
    )
}

/// A child to apply, as the plan made it.
#[derive(Clone, Copy)]
struct Child<'a> {
    kind: &'a Resolved,
    key: &'a runbook_core::plan::ChildKey,
    object: &'a Value,
    hash: &'a str,
    force: bool,
}

impl Writer<'_> {
    /// Apply a child, on condition that it is the object `uid` (if given).
    /// A conflict only with Runbook's own managers (an earlier version of
    /// the policy, say) is forced. Fields another manager holds are taken
    /// back only where the policy owns the kind's fields outright (`force`,
    /// with a `FieldsReverted` Event on the child); otherwise the apply
    /// fails, naming the manager.
    async fn apply(
        &self,
        kind: &Resolved,
        key: &runbook_core::plan::ChildKey,
        object: &Value,
        uid: Option<&str>,
        force: bool,
    ) -> Result<String, kube::Error> {
        let body = with_uid(object, uid);
        let send = |force: bool| {
            let mut pp = PatchParams::apply(self.manager);
            pp.force = force;
            let body = &body;
            async move {
                send_patch(
                    self.client,
                    requests(kind, &key.namespace),
                    None,
                    &key.name,
                    &pp,
                    &Patch::Apply(body),
                )
                .await
            }
        };
        let e = match send(false).await {
            Err(e) => e,
            ok => return ok,
        };
        let taken = conflicts(&e);
        if taken.is_empty() {
            return Err(e);
        }
        if taken.iter().all(|(m, _)| is_runbook_manager(m)) {
            return send(true).await;
        }
        if !force {
            return Err(e);
        }
        let answer = send(true).await?;
        let note = Note {
            type_: runbook_core::script::action::EventType::Normal,
            reason: "FieldsReverted".into(),
            message: reverted_message(&taken),
        };
        let mut regarding = body.clone();
        if kind.namespaced {
            regarding["metadata"]["namespace"] = json!(key.namespace);
        }
        self.event(&regarding, &note).await;
        Ok(answer)
    }

    /// Before a new child is applied: the object of its name as the API
    /// server has it now (the cache may not show it yet). `None` when
    /// there is none; its uid when it is this policy's child after all
    /// (made a moment ago); a refusal when it is anything else.
    async fn new_child(
        &self,
        kind: &Resolved,
        key: &runbook_core::plan::ChildKey,
        desired: &Value,
    ) -> Result<Option<String>, ExecError> {
        let found = match api(self.client, kind, &key.namespace)
            .get_opt(&key.name)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                let what = target_string(&key.kind, &key.namespace, &key.name);
                return Err(ExecError::api(&format!("looking up {what}"), e));
            }
        };
        let Some(found) = found else {
            return Ok(None);
        };
        let live = found.value();
        let policy = runbook_core::observe::policy_of_child(desired).unwrap_or_default();
        // Its target: the controller, or (a child in another namespace)
        // the one its label names.
        let owner = runbook_core::observe::controller_uid(desired)
            .or_else(|| {
                desired
                    .pointer("/metadata/labels")
                    .and_then(|l| l.get(runbook_core::observe::OWNER_UID_LABEL))
                    .and_then(Value::as_str)
            })
            .unwrap_or_default();
        if runbook_core::observe::is_child_of(&live, policy, owner) {
            return Ok(found.meta.uid.clone());
        }
        let target = desired
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .and_then(|refs| refs.iter().find(|r| r["controller"] == true))
            .cloned()
            .unwrap_or_default();
        Err(ExecError::Refused(super::plan::not_its_child_message(
            "apply",
            &key.kind,
            &live,
            policy,
            &super::plan::TargetId {
                kind: target["kind"].as_str().unwrap_or("target"),
                namespace: &key.namespace,
                name: target["name"].as_str().unwrap_or(""),
                uid: owner,
            },
        )))
    }

    /// The parameters of a merge or JSON patch: this writer's manager.
    fn params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.manager.into()),
            ..Default::default()
        }
    }

    /// Tell the journal, if anyone listens.
    pub fn observe(&self, entry: impl FnOnce() -> Entry) {
        if let Some(j) = self.journal {
            j.record(entry());
        }
    }

    /// The journal entry of a step's outcome, `fields` saying what it wrote.
    pub fn step_entry(
        &self,
        policy: &CompiledPolicy,
        target: &Value,
        step: &Step,
        result: &str,
        fields: Value,
        detail: Option<&str>,
    ) -> Entry {
        let (tversion, tkind, tns, tname) = identity(target);
        // What the action writes is where the target acts (a Namespace's
        // children are in it); the target itself is where it is.
        let mut ns = runbook_core::observe::acting_namespace(target).to_string();
        let (api_version, kind, name) = match &step.action {
            Action::Apply { object } => {
                let k = kind_of(object);
                let name = object["metadata"]["name"].as_str().unwrap_or("");
                // A child in another namespace is recorded there.
                if let Some(other) = object["metadata"]["namespace"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                {
                    ns = other.to_string();
                }
                (k.api_version, k.kind, name.to_string())
            }
            Action::Delete {
                kind,
                name,
                namespace,
            }
            | Action::Patch {
                kind,
                name,
                namespace,
                ..
            } => {
                if let Some(other) = namespace {
                    ns = other.clone();
                }
                match policy.kinds.resolve(kind) {
                    Ok(k) => (k.api_version, k.kind, name.clone()),
                    Err(_) => (String::new(), kind.to_string(), name.clone()),
                }
            }
            Action::Rollback { deployment, .. } => {
                ("apps/v1".into(), "Deployment".into(), deployment.clone())
            }
            _ => {
                ns = tns;
                (tversion, tkind, tname)
            }
        };
        Entry::new(self.now, step.action.verb(), result)
            .policy(&policy.name)
            .object(&api_version, &kind, &ns, &name)
            .fields(fields)
            .detail(detail.unwrap_or(""))
    }

    /// Perform one write: `Ok(None)` when nothing needed doing after all,
    /// else what was written (the applied object, a rollback's revisions).
    pub async fn write(&self, w: &Write) -> Result<Option<Value>, ExecError> {
        match w {
            Write::Apply {
                kind,
                key,
                object,
                hash,
                uid,
                force,
            } => {
                let child = Child {
                    kind,
                    key,
                    object,
                    hash,
                    force: *force,
                };
                self.apply_child(&child, uid.as_deref()).await
            }
            Write::Delete {
                kind,
                namespace,
                name,
                uid,
            } => self.delete(kind, namespace, name, uid).await,
            Write::Patch {
                kind,
                namespace,
                name,
                patch,
                uid,
            } => send_patch(
                self.client,
                requests(kind, namespace),
                None,
                name,
                &self.params(),
                &Patch::Merge(with_uid(patch, uid.as_deref())),
            )
            .await
            .map(|_| Some(patch.clone()))
            .map_err(|e| {
                let what = target_string(&kind.kind_ref(), namespace, name);
                ExecError::api(&format!("patch {what}"), e)
            }),
            Write::Rollback {
                namespace,
                deployment,
                revision,
                changed_by,
            } => match rollback::rollback(
                self.client,
                namespace,
                deployment,
                *revision,
                self.manager,
                changed_by,
            )
            .await?
            {
                rollback::RolledBack::To { from, to } => {
                    Ok(Some(json!({"fromRevision": from, "toRevision": to})))
                }
                rollback::RolledBack::AlreadyAt(_) => Ok(None),
            },
        }
    }

    /// Server-side apply of a child: a new one is made first (so that it
    /// is Runbook's, never an object of that name it did not make), then
    /// remembered with the version the answer gave.
    async fn apply_child(
        &self,
        child: &Child<'_>,
        uid: Option<&str>,
    ) -> Result<Option<Value>, ExecError> {
        let Child {
            kind,
            key,
            object,
            hash,
            force,
        } = *child;
        let what = || {
            format!(
                "apply {}",
                target_string(&key.kind, &key.namespace, &key.name)
            )
        };
        let uid = match uid {
            Some(u) => Some(u.to_string()),
            None => self.new_child(kind, key, object).await?,
        };
        let answer = self
            .apply(kind, key, object, uid.as_deref(), force)
            .await
            .map_err(|e| ExecError::api(&what(), e))?;
        if let Some(own) = self.applied {
            let write = AppliedWrite {
                hash: hash.to_string(),
                version: version_of(&answer),
            };
            own.remember(key.clone(), write);
        }
        Ok(Some(object.clone()))
    }

    /// Delete one object: the one with `uid` (a precondition).
    async fn delete(
        &self,
        kind: &Resolved,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<Value>, ExecError> {
        match api(self.client, kind, namespace)
            .delete(name, &delete_params(uid))
            .await
        {
            Ok(_) => Ok(Some(Value::Null)),
            // Gone, or another object by now (the uid precondition):
            // nothing of this policy's is left to delete.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(None),
            Err(e) => {
                let what = target_string(&kind.kind_ref(), namespace, name);
                Err(ExecError::api(&format!("delete {what}"), e))
            }
        }
    }

    /// Merge `patch` into the target's status, through its status
    /// subresource when it has one; the target as the API server returns
    /// it after the write.
    pub async fn status(
        &self,
        kind: &Resolved,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Value, kube::Error> {
        tracing::debug!(target = %format!("{}/{name}", kind.resource.kind), namespace = %ns, patch = %patch, "writing status");
        let body = json!({"status": patch});
        let sub = kind.status_subresource.then_some("status");
        let answer = send_patch(
            self.client,
            requests(kind, ns),
            sub,
            name,
            &self.params(),
            &Patch::Merge(&body),
        )
        .await?;
        // Decoded once, straight to the tree decisions read, without the
        // managedFields no decision reads (as the caches keep objects).
        runbook_core::observe::object::decode_without_managed_fields(&answer)
            .map_err(kube::Error::SerdeError)
    }

    /// Write Runbook's state of a target (a `RunbookState`, created the
    /// first time): the whole state, server-side applied with Runbook's
    /// own field manager, so that one request creates or changes it and
    /// what it no longer holds is removed. The state as the API server
    /// returns it.
    pub async fn runbook_state(&self, state: &Value) -> Result<Value, kube::Error> {
        let (ns, name) = (
            state["metadata"]["namespace"].as_str().unwrap_or_default(),
            state["metadata"]["name"].as_str().unwrap_or_default(),
        );
        tracing::debug!(state = %format!("{ns}/{name}"), "writing Runbook's state");
        let resource = KindRef::new("runbook.dev/v1alpha1", "RunbookState").api_resource();
        let request = Request::new(kube::core::DynamicObject::url_path(&resource, Some(ns)));
        let answer = send_patch(
            self.client,
            request,
            None,
            name,
            &PatchParams::apply(STATE_MANAGER).force(),
            &Patch::Apply(state),
        )
        .await?;
        runbook_core::observe::object::decode_without_managed_fields(&answer)
            .map_err(kube::Error::SerdeError)
    }

    /// Add or remove one finalizer of the target, guarded by its
    /// resourceVersion (a concurrent change fails the write instead of
    /// losing a finalizer someone else added).
    pub async fn finalizers(
        &self,
        kind: &Resolved,
        target: &Value,
        add: Option<&str>,
        remove: Option<&str>,
    ) -> Result<(), ExecError> {
        let (_, _, ns, name) = identity(target);
        let present = finalizers_of(target);
        let mut ops = vec![
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": target["metadata"]["resourceVersion"]}),
        ];
        if let Some(f) = add {
            if target.pointer("/metadata/finalizers").is_some() {
                ops.push(json!({"op": "add", "path": "/metadata/finalizers/-", "value": f}));
            } else {
                ops.push(json!({"op": "add", "path": "/metadata/finalizers", "value": [f]}));
            }
        }
        if let Some(i) = remove.and_then(|f| present.iter().position(|x| x == f)) {
            ops.push(json!({"op": "remove", "path": format!("/metadata/finalizers/{i}")}));
        }
        let ops: json_patch::Patch = serde_json::from_value(Value::Array(ops))
            .map_err(|e| ExecError::Invalid(e.to_string()))?;
        api(self.client, kind, &ns)
            .patch(&name, &self.params(), &Patch::<()>::Json(ops))
            .await
            .map(|_| ())
            .map_err(|e| ExecError::api(&format!("updating the finalizers of {ns}/{name}"), e))
    }

    /// Write an Event on `regarding` (journaled first, so a scenario sees
    /// it even without a recorder).
    pub async fn event(&self, regarding: &Value, note: &Note) {
        let type_ = event_type_str(&note.type_);
        self.observe(|| {
            let (api_version, kind, ns, name) = identity(regarding);
            Entry::new(self.now, "event", "ok")
                .object(&api_version, &kind, &ns, &name)
                .fields(json!({"type": type_, "reason": note.reason, "message": note.message}))
                .detail(format!("{type_} {}: {}", note.reason, note.message))
        });
        let Some(rec) = self.recorder else { return };
        let ev = Event {
            type_: note.type_,
            reason: note.reason.clone(),
            note: Some(note.message.chars().take(1024).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = rec.publish(&ev, &super::object_ref(regarding)).await {
            tracing::warn!("recording an Event failed: {}", crate::util::api_error(&e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::conflicting_managers;

    fn conflict(code: u16, causes: &[(&str, &str)]) -> kube::Error {
        let status = serde_json::json!({
            "status": "Failure", "message": "Apply failed", "reason": "Conflict", "code": code,
            "details": {"causes": causes.iter().map(|(reason, message)| serde_json::json!({
                "reason": reason, "message": message, "field": ".data.k",
            })).collect::<Vec<_>>()},
        });
        match serde_json::from_value(status) {
            Ok(s) => kube::Error::Api(s),
            Err(e) => panic!("a Status: {e}"),
        }
    }

    /// A forced apply's Event names each other manager with its fields,
    /// and none of Runbook's own (those are taken back without a word).
    #[test]
    fn what_a_forced_apply_took_back_names_each_manager_and_field() {
        let taken = [
            ("kubectl-edit".to_string(), ".data.size".to_string()),
            ("runbook/other".to_string(), ".data.x".to_string()),
            ("kubectl-edit".to_string(), ".data.mode".to_string()),
            ("helm".to_string(), ".metadata.labels.tier".to_string()),
        ];
        assert_eq!(
            super::reverted_message(&taken),
            "took back what the policy writes (spec.owns force): \
             .metadata.labels.tier from \"helm\"; .data.size, .data.mode from \"kubectl-edit\""
        );
    }

    #[test]
    fn a_conflict_names_each_manager_that_owns_a_field() {
        let e = conflict(
            409,
            &[
                (
                    "FieldManagerConflict",
                    r#"conflict with "kubectl-edit" using v1: .data.k"#,
                ),
                ("FieldManagerConflict", r#"conflict with "helm": .data.j"#),
                ("FieldValueInvalid", r#"not "a manager""#),
            ],
        );
        assert_eq!(conflicting_managers(&e), ["kubectl-edit", "helm"]);
    }

    #[test]
    fn only_a_409_with_field_manager_causes_names_managers() {
        let not_conflict = conflict(422, &[("FieldManagerConflict", r#"conflict with "x""#)]);
        assert!(conflicting_managers(&not_conflict).is_empty());
        let unquoted = conflict(409, &[("FieldManagerConflict", "conflict with nobody")]);
        assert!(conflicting_managers(&unquoted).is_empty());
    }
}
