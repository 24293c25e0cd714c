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
        let meta = meta_mut(&mut obj);
        if def.namespaced {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            let Some(prefix) = meta
                .get("generateName")
                .and_then(Value::as_str)
                .map(str::to_string)
            else {
                return Err(ApiError::invalid(
                    def,
                    "",
                    vec![Cause::required("metadata.name")],
                ));
            };
            name = inner.generate_name(def, ns, &prefix);
            meta.insert("name".into(), json!(name));
        }
        validate_meta(def, &obj, &name)?;
        let key = (ns.to_string(), name.clone());
        if inner
            .objects
            .get(&def.storage())
            .is_some_and(|m| m.contains_key(&key))
        {
            return Err(ApiError::already_exists(def, &name));
        }
        inner.seq += 1;
        let uid = uid_from(inner.seq);
        let now = self.now();
        let meta = meta_mut(&mut obj);
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
        // Status is the server's (and the controllers') to write: a create
        // starts it afresh, as the API server's create strategies do.
        if def.status_subresource
            && let Some(m) = obj.as_object_mut()
        {
            match (def.group.as_str(), def.kind.as_str()) {
                ("", "Pod") => m.insert("status".into(), json!({"phase": "Pending"})),
                ("", "Namespace") => m.insert("status".into(), json!({"phase": "Active"})),
                ("", "PersistentVolumeClaim") => {
                    m.insert("status".into(), json!({"phase": "Pending"}))
                }
                _ => m.remove("status"),
            };
        }
        default_builtin(def, &mut obj, &uid);
        inner.validate_content(def, &mut obj, opts, &mut warnings, &name)?;
        if def.key()
            == (
                "apiextensions.k8s.io".to_string(),
                "customresourcedefinitions".to_string(),
            )
        {
            let rd = registry::from_crd(&obj).map_err(|errs| {
                ApiError::invalid(
                    def,
                    &name,
                    errs.into_iter()
                        .map(|(f, m)| Cause {
                            field: f,
                            reason: "FieldValueInvalid",
                            message: m,
                        })
                        .collect(),
                )
            })?;
            obj["status"] = registry::crd_status(&obj, &now);
            if !opts.dry_run {
                let since = inner.rv;
                inner.served_since.insert(rd.storage(), since);
                inner.defs.insert(rd.key(), Arc::new(rd));
            }
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
        self.modify(def, ns, name, part, opts, move |old| {
            if let Some(rv) = &want_rv
                && meta_str(old, "resourceVersion") != Some(rv.as_str())
            {
                return Err(Conflicted);
            }
            Ok((obj, manager))
        })
    }

    /// Patch an object. An apply patch of a missing object creates it.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        kind: PatchKind,
        body: Value,
        part: Part,
        opts: &WriteOpts,
    ) -> Result<Written, ApiError> {
        if kind == PatchKind::Strategic && def.crd.is_some() {
            return Err(ApiError::unsupported_media(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        if kind == PatchKind::Apply {
            let Some(manager) = opts.field_manager.clone().filter(|m| !m.is_empty()) else {
                return Err(ApiError::bad_request(
                    "PATCH, fieldManager is required for apply patches",
                ));
            };
            check_identity(def, &body, ns, Some(name))?;
            let exists = self.get(def, ns, name).is_ok();
            if !exists {
                if part == Part::Status {
                    return Err(ApiError::not_found(def, name));
                }
                let mut obj = body.clone();
                meta_mut(&mut obj).insert("name".into(), json!(name));
                let created_opts = WriteOpts {
                    field_manager: None,
                    ..opts.clone()
                };
                let now = self.now();
                let api_version = body["apiVersion"].as_str().unwrap_or_default().to_string();
                let applied =
                    fields::apply(&json!({}), &body, &manager, true, &api_version, None, &now)
                        .map_err(|_| {
                            ApiError::internal("apply to an empty object cannot conflict")
                        })?;
                fields::write_managed(&mut obj, &applied.managed);
                return self.create(def, ns, obj, &created_opts);
            }
            let now = self.now();
            let force = opts.force;
            let def2 = def.clone();
            let name2 = name.to_string();
            return self.modify_with(def, ns, name, part, opts, move |old| {
                let api_version = body["apiVersion"].as_str().unwrap_or_default().to_string();
                let sub = (part == Part::Status).then_some("status");
                let applied_cfg = match part {
                    // The status subresource takes only status from an apply.
                    Part::Status => json!({"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": {"name": name2}, "status": body.get("status").cloned().unwrap_or(json!({}))}),
                    Part::Main => body,
                };
                match fields::apply(old, &applied_cfg, &manager, force, &api_version, sub, &now) {
                    Ok(a) => {
                        let mut o = a.object;
                        fields::write_managed(&mut o, &a.managed);
                        Ok(o)
                    }
                    Err(conflicts) => {
                        let n = conflicts.len();
                        let lines: Vec<String> = conflicts.iter().map(|c| format!("conflict with \"{}\": {}", c.manager, c.path)).collect();
                        let mut e = ApiError::conflict_msg(&def2, &name2, &format!(
                            "Apply failed with {n} conflict{}: {}",
                            if n == 1 { "" } else { "s" },
                            lines.join("\n")
                        ));
                        e.message = format!("Apply failed with {n} conflict{}: {}", if n == 1 { "" } else { "s" }, lines.join("\n"));
                        e.details["causes"] = Value::Array(
                            conflicts.iter().map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.path})).collect(),
                        );
                        Err(WriteFail::Api(e))
                    }
                }
            });
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
                PatchKind::Apply => unreachable!("handled above"),
            }
            if let Some(rv) = meta_str(&body, "resourceVersion")
                && meta_str(old, "resourceVersion") != Some(rv)
            {
                return Err(Conflicted);
            }
            Ok((new, manager))
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
        let now = self.now();
        let def2 = def.clone();
        let name2 = name.to_string();
        self.modify_with(def, ns, name, part, opts, move |old| {
            let (mut new, manager) = f(old).map_err(|e| match e {
                Conflicted => WriteFail::Api(ApiError::conflict(&def2, &name2)),
                Failed(e) => WriteFail::Api(e),
            })?;
            let manager = manager.unwrap_or_else(|| "unknown".to_string());
            let api_version = new["apiVersion"].as_str().unwrap_or_default().to_string();
            let sub = (part == Part::Status).then_some("status");
            // Keep the old managedFields as the record starts from them.
            if let Some(m) = old.pointer("/metadata/managedFields") {
                meta_mut(&mut new).insert("managedFields".into(), m.clone());
            }
            fields::record_update(old, &mut new, &manager, &api_version, sub, &now);
            Ok(new)
        })
    }

    /// The shared write path: `f` turns the old object into the new one;
    /// then identity, status, generation, validation and finalizers are
    /// applied as the API server does, and the result committed unless it
    /// changes nothing.
    pub(super) fn modify_with(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        part: Part,
        opts: &WriteOpts,
        f: impl FnOnce(&Value) -> Result<Value, WriteFail>,
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
        let mut new = f(&old).map_err(|WriteFail::Api(e)| e)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        let mut warnings = Vec::new();
        // Identity the client cannot change.
        let om = old["metadata"].clone();
        {
            let meta = meta_mut(&mut new);
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
                "name",
            ] {
                match om.get(k) {
                    Some(v) => {
                        meta.insert(k.into(), v.clone());
                    }
                    None => {
                        meta.remove(k);
                    }
                }
            }
            meta.insert("resourceVersion".into(), om["resourceVersion"].clone());
            meta.remove("selfLink");
        }
        new["apiVersion"] = old["apiVersion"].clone();
        new["kind"] = old["kind"].clone();
        match part {
            Part::Status => {
                // Only status changes through the status subresource.
                let status = new.get("status").cloned();
                let managed = new.pointer("/metadata/managedFields").cloned();
                new = old.clone();
                match status {
                    Some(s) => new["status"] = s,
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                if let Some(m) = managed {
                    meta_mut(&mut new).insert("managedFields".into(), m);
                }
            }
            Part::Main if def.status_subresource => match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            },
            Part::Main => {}
        }
        if part == Part::Main {
            validate_meta(def, &new, name)?;
            // No new finalizers on an object that is going away.
            if om.get("deletionTimestamp").is_some() {
                let before = finalizers_of(&old);
                if finalizers_of(&new).iter().any(|f| !before.contains(f)) {
                    return Err(ApiError::invalid(
                        def,
                        name,
                        vec![Cause::forbidden(
                            "metadata.finalizers",
                            "no new finalizers can be added if the object is being deleted",
                        )],
                    ));
                }
            }
        }
        inner.validate_content(def, &mut new, opts, &mut warnings, name)?;
        if def.has_generation {
            let strip: &[&str] = if def.status_subresource {
                &["metadata", "status"]
            } else {
                &["metadata"]
            };
            let gen_old = om["generation"].as_i64().unwrap_or(1);
            let g = if without(&old, strip) != without(&new, strip) {
                gen_old + 1
            } else {
                gen_old
            };
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        let is_crd = def.key()
            == (
                "apiextensions.k8s.io".to_string(),
                "customresourcedefinitions".to_string(),
            );
        if is_crd && part == Part::Main {
            let rd = registry::from_crd(&new).map_err(|errs| {
                ApiError::invalid(
                    def,
                    name,
                    errs.into_iter()
                        .map(|(f, m)| Cause {
                            field: f,
                            reason: "FieldValueInvalid",
                            message: m,
                        })
                        .collect(),
                )
            })?;
            if !opts.dry_run {
                inner.defs.insert(rd.key(), Arc::new(rd));
            }
        }
        if same_content(&old, &new) {
            return Ok(Written {
                bytes: stored.bytes,
                created: false,
                warnings,
            });
        }
        if opts.dry_run {
            return Ok(Written {
                bytes: Bytes::from(serde_json::to_vec(&new).unwrap_or_default()),
                created: false,
                warnings,
            });
        }
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        let is_namespace = def.key() == (String::new(), "namespaces".to_string());
        if deleting && finalizers_of(&new).is_empty() && !is_namespace {
            let bytes = inner.remove(def, key, Some(new), &self.config, &self.now());
            return Ok(Written {
                bytes,
                created: false,
                warnings,
            });
        }
        let bytes = inner.commit(def, key.clone(), new, EventType::Modified, &self.config);
        inner.finish_foreground(&self.config, &self.now());
        Ok(Written {
            bytes,
            created: false,
            warnings,
        })
    }
}

impl Inner {
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

    pub(super) fn generate_name(&mut self, def: &ResourceDef, ns: &str, prefix: &str) -> String {
        loop {
            self.seq += 1;
            let mut h = crate::util::hash::fnv64(&self.seq.to_le_bytes());
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
