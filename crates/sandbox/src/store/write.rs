//! Writes: create (generateName, defaults, validation), replace, and the
//! patches (merge, JSON, strategic merge, server-side apply), each
//! committed under the store's lock with a new resourceVersion.

use super::validate::{check_identity, default_builtin, same_content, validate_meta};
use super::*;

impl Store {
    // ----- writes -----

    pub fn create(
        &self,
        def: &ResourceDef,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Written, ApiError> {
        let mut inner = self.lock();
        let mut warnings = Vec::new();
        check_identity(def, &obj, ns, None)?;
        if !obj.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        if def.namespaced {
            inner.check_namespace(ns, true)?;
        }
        let name = inner.name_new(def, ns, &mut obj)?;
        validate_meta(def, &obj, &name)?;
        let key = (ns.to_string(), name.clone());
        if inner
            .objects
            .get(&def.storage())
            .is_some_and(|m| m.contains_key(&key))
        {
            return Err(ApiError::already_exists(def, &name));
        }
        let uid = uid_from(inner.draw(&("uid", def.storage(), ns, &name)));
        let now = self.now();
        stamp_new(def, &mut obj, &uid, &now);
        drop_empty_meta(&mut obj);
        default_builtin(def, &mut obj, &uid);
        if let Some(admit) = &opts.admit {
            (admit.0)(&mut obj)?;
        }
        inner.validate_content(def, &mut obj, None, opts, &mut warnings, &name)?;
        if def.key()
            == (
                "apiextensions.k8s.io".to_string(),
                "customresourcedefinitions".to_string(),
            )
        {
            inner.define(def, &mut obj, &name, &now, opts.dry_run)?;
        }
        if let Some(manager) = &opts.field_manager {
            let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
            fields::record_update(&json!({}), &mut obj, manager, &api_version, None, &now);
        }
        if opts.dry_run {
            return Ok(Written {
                bytes: Bytes::from(serde_json::to_vec(&obj).unwrap_or_default()),
                created: true,
                warnings,
            });
        }
        let bytes = inner.commit(def, key.clone(), obj, EventType::Added, &self.config);
        inner.collect_if_orphaned(def, &key, &self.config, &now);
        drop(inner);
        if def.key() == (String::new(), "namespaces".to_string()) {
            self.publish_root_ca(&name);
        }
        Ok(Written {
            bytes,
            created: true,
            warnings,
        })
    }

    /// Every namespace of a real cluster holds the `kube-root-ca.crt`
    /// ConfigMap (kube-controller-manager's root CA publisher writes it as
    /// soon as the namespace exists), so lists of ConfigMaps see it too.
    pub(super) fn publish_root_ca(&self, namespace: &str) {
        let Some(def) = self.def("", "configmaps") else {
            return;
        };
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": ROOT_CA_CONFIGMAP,
                "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}
            },
            "data": {"ca.crt": SANDBOX_CA_PEM}
        });
        let opts = WriteOpts {
            field_manager: Some("kube-controller-manager".into()),
            ..WriteOpts::default()
        };
        // Racing a test that made it first is fine: it exists either way.
        let _ = self.create(&def, namespace, cm, &opts);
    }

    /// Replace an object (PUT).
    pub fn update(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        obj: Value,
        part: Part,
        opts: &WriteOpts,
    ) -> Result<Written, ApiError> {
        check_identity(def, &obj, ns, Some(name))?;
        let want_rv = meta_str(&obj, "resourceVersion").map(str::to_string);
        let manager = opts.field_manager.clone();
        let (def2, name2) = (def.clone(), name.to_string());
        self.modify(def, ns, name, part, opts, move |old| {
            if let Some(rv) = &want_rv
                && meta_str(old, "resourceVersion") != Some(rv.as_str())
            {
                return Err(Conflicted);
            }
            // A replace naming a uid is a precondition on it, as on a
            // real API server.
            if let Some(uid) = meta_str(&obj, "uid").filter(|u| !u.is_empty())
                && meta_str(old, "uid") != Some(uid)
            {
                let why = format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(old, "uid").unwrap_or_default()
                );
                return Err(Failed(ApiError::conflict_msg(&def2, &name2, &why)));
            }
            Ok((obj, manager))
        })
    }

    /// Patch an object. An apply patch of a missing object creates it.
    pub fn patch(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        patch: PatchBody,
        part: Part,
        opts: &WriteOpts,
    ) -> Result<Written, ApiError> {
        let PatchBody { kind, body } = patch;
        if kind == PatchKind::Strategic && def.crd.is_some() {
            return Err(ApiError::unsupported_media(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        if kind == PatchKind::Apply {
            return self.apply(def, ns, name, body, part, opts);
        }
        let manager = opts.field_manager.clone();
        let def2 = def.clone();
        let name2 = name.to_string();
        self.modify(def, ns, name, part, opts, move |old| {
            let mut new = old.clone();
            match kind {
                PatchKind::Merge => patch::merge_patch(&mut new, &body),
                PatchKind::Strategic => patch::strategic_merge(&mut new, &body),
                PatchKind::Json => {
                    if let Err(e) = patch::json_patch(&mut new, &body) {
                        return Err(Failed(ApiError::new(
                            422,
                            "Invalid",
                            format!("{} \"{name2}\" is invalid: {e}", def2.qualified()),
                        )));
                    }
                }
                PatchKind::Apply => return Err(Failed(ApiError::internal("apply is not a merge"))),
            }
            if let Some(rv) = meta_str(&body, "resourceVersion")
                && meta_str(old, "resourceVersion") != Some(rv)
            {
                return Err(Conflicted);
            }
            Ok((new, manager))
        })
    }

    /// A server-side apply: create the object when it is absent, else
    /// merge the applied configuration, its fields owned by `manager`.
    fn apply(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        body: Value,
        part: Part,
        opts: &WriteOpts,
    ) -> Result<Written, ApiError> {
        let Some(manager) = opts.field_manager.clone().filter(|m| !m.is_empty()) else {
            return Err(ApiError::bad_request(
                "PATCH, fieldManager is required for apply patches",
            ));
        };
        check_identity(def, &body, ns, Some(name))?;
        undeclared_in_apply(def, &body, name)?;
        let api_version = body["apiVersion"].as_str().unwrap_or_default().to_string();
        if self.get(def, ns, name).is_err() {
            if part == Part::Status {
                return Err(ApiError::not_found(def, name));
            }
            // An applied uid is a precondition: it never creates.
            if let Some(uid) = meta_str(&body, "uid").filter(|u| !u.is_empty()) {
                let why = format!(
                    "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                );
                return Err(ApiError::conflict_msg(def, name, &why));
            }
            let mut obj = body.clone();
            meta_mut(&mut obj).insert("name".into(), json!(name));
            let created_opts = WriteOpts {
                field_manager: None,
                ..opts.clone()
            };
            let now = self.now();
            let applied =
                fields::apply(&json!({}), &body, &manager, true, &api_version, None, &now)
                    .map_err(|_| ApiError::internal("apply to an empty object cannot conflict"))?;
            fields::write_managed(&mut obj, &applied.managed);
            return self.create(def, ns, obj, &created_opts);
        }
        let now = self.now();
        let force = opts.force;
        let (def2, name2) = (def.clone(), name.to_string());
        self.modify_with(def, ns, name, part, opts, move |old| {
            let sub = (part == Part::Status).then_some("status");
            let applied_cfg = match part {
                // The status subresource takes only status from an apply.
                Part::Status => json!({"apiVersion": body["apiVersion"], "kind": body["kind"],
                                       "metadata": {"name": name2},
                                       "status": body.get("status").cloned().unwrap_or(json!({}))}),
                Part::Main => body,
            };
            match fields::apply(old, &applied_cfg, &manager, force, &api_version, sub, &now) {
                Ok(a) => {
                    let mut o = a.object;
                    fields::write_managed(&mut o, &a.managed);
                    Ok((o, None))
                }
                Err(conflicts) => Err(WriteFail::Api(conflict_error(&def2, &name2, &conflicts))),
            }
        })
    }

    pub(super) fn modify(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        part: Part,
        opts: &WriteOpts,
        f: impl FnOnce(&Value) -> Result<(Value, Option<String>), ModifyFail>,
    ) -> Result<Written, ApiError> {
        let def2 = def.clone();
        let name2 = name.to_string();
        self.modify_with(def, ns, name, part, opts, move |old| {
            let (new, manager) = f(old).map_err(|e| match e {
                Conflicted => WriteFail::Api(ApiError::conflict(&def2, &name2)),
                Failed(e) => WriteFail::Api(e),
            })?;
            Ok((new, Some(manager.unwrap_or_else(|| "unknown".to_string()))))
        })
    }

    /// The shared write path: `f` turns the old object into the new one
    /// (and names the manager of an update, whose fields are recorded once
    /// the object is decoded: a field its kind drops is managed by nobody);
    /// then identity, status, generation, validation and finalizers are
    /// applied as the API server does, and the result committed unless it
    /// changes nothing.
    /// Record `manager`'s update in the managed fields, starting from
    /// those the object had.
    fn record_manager(&self, old: &Value, new: &mut Value, manager: &str, part: Part) {
        match old.pointer("/metadata/managedFields") {
            Some(m) => meta_mut(new).insert("managedFields".into(), m.clone()),
            None => meta_mut(new).remove("managedFields"),
        };
        let api_version = new["apiVersion"].as_str().unwrap_or_default().to_string();
        let sub = (part == Part::Status).then_some("status");
        fields::record_update(old, new, manager, &api_version, sub, &self.now());
    }

    pub(super) fn modify_with(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        part: Part,
        opts: &WriteOpts,
        f: impl FnOnce(&Value) -> Result<(Value, Option<String>), WriteFail>,
    ) -> Result<Written, ApiError> {
        let mut inner = self.lock();
        let key = (ns.to_string(), name.to_string());
        let stored = inner
            .objects
            .get(&def.storage())
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        let old: Value =
            serde_json::from_slice(&stored.bytes).map_err(|e| ApiError::internal(e.to_string()))?;
        let (mut new, updated_by) = f(&old).map_err(|WriteFail::Api(e)| e)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        if let Some(uid) = meta_str(&new, "uid").filter(|u| !u.is_empty())
            && meta_str(&old, "uid") != Some(uid)
        {
            let cause = Cause::invalid("metadata.uid", &json!(uid), "field is immutable");
            return Err(ApiError::invalid(def, name, vec![cause]));
        }
        let mut warnings = Vec::new();
        keep_identity(&old, &mut new);
        keep_other_part(def, part, &old, &mut new);
        drop_empty_meta(&mut new);
        super::validate::label_namespace(def, &mut new);
        super::validate::secret_string_data(def, &mut new);
        if let Some(admit) = &opts.admit {
            (admit.0)(&mut new)?;
        }
        if part == Part::Main {
            validate_meta(def, &new, name)?;
            no_new_finalizers_while_deleting(def, name, &old, &new)?;
        }
        inner.validate_content(def, &mut new, Some(&old), opts, &mut warnings, name)?;
        if let Some(manager) = updated_by {
            self.record_manager(&old, &mut new, &manager, part);
        }
        if def.has_generation {
            let g = next_generation(def, &old, &new);
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        if part == Part::Main && is_crd(def) {
            let rd = crd_def(def, &new, name)?;
            if !opts.dry_run {
                inner.defs.insert(rd.key(), Arc::new(rd));
            }
        }
        let change = Modified {
            key,
            stored: stored.bytes,
            old: &old,
            new,
        };
        Ok(self.store_modified(&mut inner, def, change, opts, warnings))
    }

    /// Keep the modified object `new` (nothing, if it is the same as
    /// `old`; a dry run only tells it); one being deleted whose last
    /// finalizer went is removed.
    fn store_modified(
        &self,
        inner: &mut Inner,
        def: &ResourceDef,
        change: Modified<'_>,
        opts: &WriteOpts,
        warnings: Vec<String>,
    ) -> Written {
        let Modified {
            key,
            stored,
            old,
            new,
        } = change;
        if same_content(old, &new) {
            return Written {
                bytes: stored,
                created: false,
                warnings,
            };
        }
        if opts.dry_run {
            return Written {
                bytes: Bytes::from(serde_json::to_vec(&new).unwrap_or_default()),
                created: false,
                warnings,
            };
        }
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        let is_namespace = def.key() == (String::new(), "namespaces".to_string());
        if deleting && finalizers_of(&new).is_empty() && !is_namespace {
            let bytes = inner.remove(def, key, Some(new), &self.config, &self.now());
            return Written {
                bytes,
                created: false,
                warnings,
            };
        }
        let bytes = inner.commit(def, key, new, EventType::Modified, &self.config);
        inner.finish_foreground(&self.config, &self.now());
        Written {
            bytes,
            created: false,
            warnings,
        }
    }
}

/// A write `modify` made: the object's key, its stored bytes, and the
/// object before and after.
struct Modified<'a> {
    key: ObjKey,
    stored: Bytes,
    old: &'a Value,
    new: Value,
}

/// Whether objects of `def` are CustomResourceDefinitions.
fn is_crd(def: &ResourceDef) -> bool {
    def.key()
        == (
            "apiextensions.k8s.io".to_string(),
            "customresourcedefinitions".to_string(),
        )
}

/// Identity the client cannot change: uid, times, namespace, name, the
/// resourceVersion it is checked against, apiVersion and kind.
fn keep_identity(old: &Value, new: &mut Value) {
    let om = &old["metadata"];
    let meta = meta_mut(new);
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "name",
    ] {
        match om.get(k) {
            Some(v) => meta.insert(k.into(), v.clone()),
            None => meta.remove(k),
        };
    }
    meta.insert("resourceVersion".into(), om["resourceVersion"].clone());
    meta.remove("selfLink");
    new["apiVersion"] = old["apiVersion"].clone();
    new["kind"] = old["kind"].clone();
}

/// What a write through one part may not change: through the status
/// subresource only status changes; through the main resource of a kind
/// with a status subresource, status stays as it was.
fn keep_other_part(def: &ResourceDef, part: Part, old: &Value, new: &mut Value) {
    let set_status = |obj: &mut Value, status: Option<Value>| match status {
        Some(s) => obj["status"] = s,
        None => {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
    };
    match part {
        Part::Status => {
            let status = new.get("status").cloned();
            let managed = new.pointer("/metadata/managedFields").cloned();
            *new = old.clone();
            set_status(new, status);
            if let Some(m) = managed {
                meta_mut(new).insert("managedFields".into(), m);
            }
        }
        Part::Main if def.status_subresource => set_status(new, old.get("status").cloned()),
        Part::Main => {}
    }
}

/// No new finalizers on an object that is going away.
fn no_new_finalizers_while_deleting(
    def: &ResourceDef,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    if old["metadata"].get("deletionTimestamp").is_none() {
        return Ok(());
    }
    let before = finalizers_of(old);
    if finalizers_of(new).iter().all(|f| before.contains(f)) {
        return Ok(());
    }
    let why = "no new finalizers can be added if the object is being deleted";
    Err(ApiError::invalid(
        def,
        name,
        vec![Cause::forbidden("metadata.finalizers", why)],
    ))
}

/// The generation counts changes of the spec (of anything but metadata and
/// a status with its own subresource).
fn next_generation(def: &ResourceDef, old: &Value, new: &Value) -> i64 {
    let strip: &[&str] = if def.status_subresource {
        &["metadata", "status"]
    } else {
        &["metadata"]
    };
    let gen_old = old["metadata"]["generation"].as_i64().unwrap_or(1);
    if without(old, strip) != without(new, strip) {
        gen_old + 1
    } else {
        gen_old
    }
}

/// The kind a CustomResourceDefinition defines, or why it is invalid.
fn crd_def(def: &ResourceDef, obj: &Value, name: &str) -> Result<ResourceDef, ApiError> {
    registry::from_crd(obj).map_err(|errs| {
        let causes = errs
            .into_iter()
            .map(|(f, m)| Cause {
                field: f,
                reason: "FieldValueInvalid",
                message: m,
            })
            .collect();
        ApiError::invalid(def, name, causes)
    })
}

/// A server-side apply's conflicts, as the API server reports them.
fn conflict_error(def: &ResourceDef, name: &str, conflicts: &[fields::Conflict]) -> ApiError {
    let n = conflicts.len();
    let lines: Vec<String> = conflicts
        .iter()
        .map(|c| format!("conflict with \"{}\": {}", c.manager, c.path))
        .collect();
    let message = format!(
        "Apply failed with {n} conflict{}: {}",
        if n == 1 { "" } else { "s" },
        lines.join("\n")
    );
    let mut e = ApiError::conflict_msg(def, name, &message);
    e.message = message;
    e.details["causes"] = conflicts
        .iter()
        .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.path}))
        .collect();
    e
}

/// Empty metadata lists and maps are not kept: the API server decodes
/// metadata into its typed form, whose `omitempty` drops an empty
/// `finalizers`, `labels` or `ownerReferences` (removing the last finalizer
/// leaves no `finalizers: []` behind).
fn drop_empty_meta(obj: &mut Value) {
    let meta = meta_mut(obj);
    for k in ["finalizers", "labels", "annotations", "ownerReferences"] {
        let empty = match meta.get(k) {
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(m)) => m.is_empty(),
            Some(Value::Null) => true,
            _ => false,
        };
        if empty {
            meta.remove(k);
        }
    }
}

/// What the server sets on a new object: uid, creation time, generation,
/// and a fresh status (status is the server's and the controllers' to
/// write: a create starts it afresh, as the API server's create strategies
/// do).
fn stamp_new(def: &ResourceDef, obj: &mut Value, uid: &str, now: &str) {
    let meta = meta_mut(obj);
    meta.insert("uid".into(), json!(uid));
    meta.insert("creationTimestamp".into(), json!(now));
    for k in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "selfLink",
    ] {
        meta.remove(k);
    }
    if def.has_generation {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    if def.status_subresource
        && let Some(m) = obj.as_object_mut()
    {
        match (def.group.as_str(), def.kind.as_str()) {
            ("", "Pod") | ("", "PersistentVolumeClaim") => {
                m.insert("status".into(), json!({"phase": "Pending"}))
            }
            ("", "Namespace") => m.insert("status".into(), json!({"phase": "Active"})),
            ("networking.k8s.io", "Ingress") => {
                m.insert("status".into(), json!({"loadBalancer": {}}))
            }
            _ => m.remove("status"),
        };
    }
}

impl Inner {
    /// The new object's namespace (or none, cluster-scoped) and its name,
    /// made from `generateName` when it has none.
    fn name_new(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        obj: &mut Value,
    ) -> Result<String, ApiError> {
        let meta = meta_mut(obj);
        if def.namespaced {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
        if !name.is_empty() {
            return Ok(name.to_string());
        }
        let Some(prefix) = meta.get("generateName").and_then(Value::as_str) else {
            return Err(ApiError::invalid(
                def,
                "",
                vec![Cause::required("metadata.name")],
            ));
        };
        let prefix = prefix.to_string();
        let name = self.generate_name(def, ns, &prefix);
        meta_mut(obj).insert("name".into(), json!(name));
        Ok(name)
    }

    /// A new CustomResourceDefinition: its kind is served from now on.
    fn define(
        &mut self,
        def: &ResourceDef,
        obj: &mut Value,
        name: &str,
        now: &str,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let rd = crd_def(def, obj, name)?;
        obj["status"] = registry::crd_status(obj, now);
        if !dry_run {
            let since = self.rv;
            self.served_since.insert(rd.storage(), since);
            self.defs.insert(rd.key(), Arc::new(rd));
        }
        Ok(())
    }

    pub(super) fn check_namespace(&self, ns: &str, for_create: bool) -> Result<(), ApiError> {
        if ns.is_empty() {
            return Err(ApiError::bad_request(
                "the namespace of the object is not set; a namespaced resource needs one",
            ));
        }
        let key = (String::new(), "namespaces".to_string());
        match self
            .objects
            .get(&key)
            .and_then(|m| m.get(&(String::new(), ns.to_string())))
        {
            None => Err(ApiError::namespace_not_found(ns)),
            Some(s) if for_create => {
                let v: Value = serde_json::from_slice(&s.bytes).unwrap_or_default();
                if v.pointer("/metadata/deletionTimestamp").is_some() {
                    Err(ApiError::forbidden(format!(
                        "unable to create new content in namespace {ns} because it is being terminated"
                    )))
                } else {
                    Ok(())
                }
            }
            Some(_) => Ok(()),
        }
    }

    /// A number for the next uid or generated name of `what` (a kind,
    /// namespace and name or prefix): the same from one run to the next
    /// whatever else was written meanwhile, and another each time.
    pub(super) fn draw(&mut self, what: &impl std::hash::Hash) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = runbook_core::util::hash::Fnv64::default();
        what.hash(&mut h);
        let id = h.finish();
        let n = self.draws.entry(id).or_default();
        *n = n.wrapping_add(1);
        let mut h = runbook_core::util::hash::Fnv64::default();
        (id, *n).hash(&mut h);
        h.finish()
    }

    pub(super) fn generate_name(&mut self, def: &ResourceDef, ns: &str, prefix: &str) -> String {
        loop {
            let mut h = self.draw(&("generateName", def.storage(), ns, prefix));
            let mut suffix = String::new();
            for _ in 0..5 {
                suffix
                    .push(GENERATE_ALPHABET[(h % GENERATE_ALPHABET.len() as u64) as usize] as char);
                h /= GENERATE_ALPHABET.len() as u64;
            }
            let name = format!("{prefix}{suffix}");
            if !self
                .objects
                .get(&def.storage())
                .is_some_and(|m| m.contains_key(&(ns.to_string(), name.clone())))
            {
                return name;
            }
        }
    }
}

/// A server-side apply to a custom resource whose schema does not declare
/// one of the applied fields: the API server cannot make a typed patch of
/// it and answers 500, whatever `fieldValidation` says (a plain write would
/// prune the field instead).
fn undeclared_in_apply(def: &ResourceDef, body: &Value, name: &str) -> Result<(), ApiError> {
    if def.crd.is_none() {
        return Ok(());
    }
    let api_version = body["apiVersion"].as_str().unwrap_or_default();
    let Some(schema) = super::validate::schema_of(def, body) else {
        return Ok(());
    };
    let mut probe = body.clone();
    let out = crate::schema::apply(schema, &mut probe, None);
    match out.unknown.first() {
        None => Ok(()),
        Some(field) => {
            let applied_ns = meta_str(body, "namespace").unwrap_or("");
            let kind = body["kind"].as_str().unwrap_or_default();
            Err(ApiError::new(
                500,
                "",
                format!(
                    "failed to create typed patch object ({applied_ns}/{name}; {api_version}, Kind={kind}): .{field}: field not declared in schema"
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{config_map, def, store};
    use super::*;

    #[test]
    fn a_create_gets_identity_and_a_generated_name_and_refuses_a_second() {
        let s = store();
        let made = config_map(&s, "", json!({"generateName": "web-"})).unwrap();
        let name = made["metadata"]["name"].as_str().unwrap();
        assert!(
            name.starts_with("web-") && name.len() == "web-".len() + 5,
            "{name}"
        );
        assert_eq!(made["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert!(made["metadata"]["resourceVersion"].is_string());
        assert_eq!(config_map(&s, name, json!({})).unwrap_err().code, 409);
        assert_eq!(config_map(&s, "", json!({})).unwrap_err().code, 422);
    }

    #[test]
    fn the_generation_counts_spec_changes_and_status_goes_through_its_part() {
        let s = store();
        let deploys = def(&s, "apps", "deployments");
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                       "spec": {"selector": {"matchLabels": {"app": "web"}},
                                "template": {"metadata": {"labels": {"app": "web"}},
                                             "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        s.create(&deploys, "ns", d, &WriteOpts::default()).unwrap();
        let patch = |body: Value, part: Part| {
            let w = s.patch(
                &deploys,
                "ns",
                "web",
                PatchBody {
                    kind: PatchKind::Merge,
                    body,
                },
                part,
                &WriteOpts::default(),
            );
            serde_json::from_slice::<Value>(&w.unwrap().bytes).unwrap()
        };
        let labelled = patch(json!({"metadata": {"labels": {"x": "y"}}}), Part::Main);
        assert_eq!(
            labelled["metadata"]["generation"], 1,
            "metadata is not the spec"
        );
        let scaled = patch(json!({"spec": {"replicas": 3}}), Part::Main);
        assert_eq!(scaled["metadata"]["generation"], 2);
        let ignored = patch(json!({"status": {"replicas": 3}}), Part::Main);
        assert!(
            ignored.get("status").is_none(),
            "status only through its subresource"
        );
        let status = patch(
            json!({"status": {"replicas": 3}, "spec": {"replicas": 9}}),
            Part::Status,
        );
        assert_eq!(status["status"]["replicas"], 3);
        assert_eq!(
            status["spec"]["replicas"], 3,
            "the status subresource leaves the spec"
        );
    }

    #[test]
    fn a_stale_resource_version_conflicts_and_an_apply_owns_its_fields() {
        let s = store();
        let cms = def(&s, "", "configmaps");
        config_map(&s, "a", json!({})).unwrap();
        let stale = json!({"metadata": {"resourceVersion": "1"}, "data": {"x": "1"}});
        let r = s.patch(
            &cms,
            "ns",
            "a",
            PatchBody {
                kind: PatchKind::Merge,
                body: stale,
            },
            Part::Main,
            &WriteOpts::default(),
        );
        assert_eq!(r.unwrap_err().code, 409);
        let apply = |manager: &str, x: &str, force: bool| {
            let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"x": x}});
            let opts = WriteOpts {
                field_manager: Some(manager.into()),
                force,
                ..Default::default()
            };
            s.patch(
                &cms,
                "ns",
                "a",
                PatchBody {
                    kind: PatchKind::Apply,
                    body,
                },
                Part::Main,
                &opts,
            )
        };
        apply("one", "1", false).unwrap();
        let conflict = apply("two", "2", false).unwrap_err();
        assert_eq!(conflict.code, 409);
        assert!(
            conflict.message.contains("conflict with \"one\""),
            "{}",
            conflict.message
        );
        assert!(apply("two", "2", true).is_ok(), "forced");
    }
}
