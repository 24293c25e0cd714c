//! An object's life after a write: committing it (history, watches),
//! deleting it (finalizers, propagation), and the garbage collection of
//! dependents and of namespaces.

use super::read::visible;
use super::*;

/// The fields that core `v1` Events and `events.k8s.io/v1` Events name
/// differently: (core, events.k8s.io).
pub(super) const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("count", "deprecatedCount"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("source", "deprecatedSource"),
    ("reportingComponent", "reportingController"),
];

/// Keep both groups' names of an Event's fields, the group that wrote it
/// deciding, so that it reads the same through either group.
pub(super) fn mirror_event(obj: &mut Value, written_as_core: bool) {
    let Some(m) = obj.as_object_mut() else {
        return;
    };
    for (core, events) in EVENT_FIELDS {
        let (from, to) = if written_as_core {
            (core, events)
        } else {
            (events, core)
        };
        match m.get(*from).cloned() {
            Some(v) if !v.is_null() => {
                m.insert(to.to_string(), v);
            }
            _ => {
                m.remove(*to);
            }
        }
    }
}

impl Store {
    pub fn delete(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Deleted, ApiError> {
        let mut inner = self.lock();
        let now = self.now();
        inner.delete_one(def, ns, name, opts, &self.config, &now)
    }

    pub fn delete_collection(
        &self,
        def: &ResourceDef,
        filter: &Filter,
        opts: &DeleteOpts,
    ) -> Result<Vec<Bytes>, ApiError> {
        let mut inner = self.lock();
        let now = self.now();
        let keys: Vec<ObjKey> = inner
            .objects
            .get(&def.storage())
            .map(|m| {
                m.iter()
                    .filter(|(k, s)| filter.matches(k, &s.labels, &s.bytes))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        let mut out = Vec::new();
        for (ns, name) in keys {
            match inner.delete_one(def, &ns, &name, opts, &self.config, &now) {
                Ok(Deleted::Gone(b)) | Ok(Deleted::Pending(b)) => out.push(b),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

impl Inner {
    /// Store a new version of an object and tell the watches.
    pub(super) fn commit(
        &mut self,
        def: &ResourceDef,
        key: ObjKey,
        mut obj: Value,
        ty: EventType,
        config: &StoreConfig,
    ) -> Bytes {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        if def.is_event() {
            mirror_event(&mut obj, def.group.is_empty());
        }
        let bytes = to_bytes(&obj);
        let uid = meta_str(&obj, "uid").unwrap_or_default().to_string();
        let labels = labels_of(&obj);
        let owners = owners_of(&obj);
        let res = def.storage();
        let old = self.objects.entry(res.clone()).or_default().insert(
            key.clone(),
            Stored {
                bytes: bytes.clone(),
                rv,
                uid: uid.as_str().into(),
                labels: labels.clone(),
                owners: owners.clone(),
            },
        );
        if let Some(o) = &old {
            for owner in o.owners.iter() {
                if let Some(d) = self.dependents.get_mut(owner.as_ref()) {
                    d.remove(&(res.clone(), key.clone()));
                }
            }
        }
        for owner in owners.iter() {
            self.dependents
                .entry(owner.to_string())
                .or_default()
                .insert((res.clone(), key.clone()));
        }
        self.by_uid.insert(uid, (res.clone(), key.clone()));
        self.record(
            HistEvent {
                rv,
                res,
                key,
                ty,
                bytes: bytes.clone(),
                old_bytes: old.as_ref().map(|o| o.bytes.clone()),
                old_labels: old.map(|o| o.labels),
                new_labels: labels,
            },
            config,
        );
        bytes
    }

    pub(super) fn record(&mut self, e: HistEvent, config: &StoreConfig) {
        if let Some(ws) = self.watchers.get_mut(&e.res) {
            ws.retain(|w| {
                let Some(ty) = visible(&w.filter, &e) else {
                    return !w.tx.is_closed();
                };
                if w.queued.load(Ordering::Relaxed) >= config.watch_queue_limit {
                    // Too slow: close it; the client re-watches from its last resourceVersion.
                    return false;
                }
                w.queued.fetch_add(1, Ordering::Relaxed);
                w.tx.send(w.renderer.line(ty, &e.bytes)).is_ok()
            });
        }
        self.history.push_back(e);
        while self.history.len() > config.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
    }

    /// Remove an object for good: the DELETED event carries its final state.
    pub(super) fn remove(
        &mut self,
        def: &ResourceDef,
        key: ObjKey,
        last: Option<Value>,
        config: &StoreConfig,
        now: &str,
    ) -> Bytes {
        let res = def.storage();
        let Some(stored) = self.objects.get_mut(&res).and_then(|m| m.remove(&key)) else {
            return Bytes::new();
        };
        let mut obj = match last {
            Some(v) => v,
            None => serde_json::from_slice(&stored.bytes).unwrap_or_default(),
        };
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let bytes = Bytes::from(serde_json::to_vec(&obj).unwrap_or_default());
        for owner in &stored.owners {
            if let Some(d) = self.dependents.get_mut(owner.as_ref()) {
                d.remove(&(res.clone(), key.clone()));
            }
        }
        self.by_uid.remove(stored.uid.as_ref());
        self.record(
            HistEvent {
                rv: self.rv,
                res: res.clone(),
                key: key.clone(),
                ty: EventType::Deleted,
                bytes: bytes.clone(),
                old_bytes: Some(stored.bytes.clone()),
                old_labels: Some(stored.labels.clone()),
                new_labels: stored.labels,
            },
            config,
        );
        // A deleted CRD takes its kind and every object of it along.
        if res
            == (
                "apiextensions.k8s.io".to_string(),
                "customresourcedefinitions".to_string(),
            )
        {
            let group = obj
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let plural = obj
                .pointer("/spec/names/plural")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let served = (group, plural);
            if let Some(sdef) = self.defs.get(&served).cloned() {
                let keys: Vec<ObjKey> = self
                    .objects
                    .get(&served)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                for k in keys {
                    self.remove(&sdef, k, None, config, now);
                }
                self.defs.remove(&served);
                self.watchers.remove(&served);
            }
        }
        self.collect_dependents(&stored.uid, config, now);
        self.finish_foreground(config, now);
        self.finish_namespaces(config, now);
        bytes
    }

    /// Background garbage collection of an owner's dependents: a dependent
    /// with no owner left is deleted; one with other live owners loses only
    /// the dangling reference.
    pub(super) fn collect_dependents(&mut self, owner_uid: &str, config: &StoreConfig, now: &str) {
        let Some(deps) = self.dependents.remove(owner_uid) else {
            return;
        };
        for (res, key) in deps {
            let Some(def) = self.defs.get(&res).cloned() else {
                continue;
            };
            let Some(stored) = self.objects.get(&res).and_then(|m| m.get(&key)).cloned() else {
                continue;
            };
            let live_owners = stored
                .owners
                .iter()
                .any(|u| u.as_ref() != owner_uid && self.by_uid.contains_key(u.as_ref()));
            if live_owners {
                let mut v: Value = serde_json::from_slice(&stored.bytes).unwrap_or_default();
                if let Some(refs) = v
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r["uid"] != owner_uid);
                }
                self.commit(&def, key, v, EventType::Modified, config);
            } else {
                let _ = self.delete_one(&def, &key.0, &key.1, &DeleteOpts::default(), config, now);
            }
        }
    }

    /// An object created with owners none of which exist is collected, as
    /// the garbage collector would do shortly after.
    pub(super) fn collect_if_orphaned(
        &mut self,
        def: &ResourceDef,
        key: &ObjKey,
        config: &StoreConfig,
        now: &str,
    ) {
        let Some(stored) = self.objects.get(&def.storage()).and_then(|m| m.get(key)) else {
            return;
        };
        if !stored.owners.is_empty()
            && stored
                .owners
                .iter()
                .all(|u| !self.by_uid.contains_key(u.as_ref()))
        {
            let _ = self.delete_one(def, &key.0, &key.1, &DeleteOpts::default(), config, now);
        }
    }

    pub(super) fn delete_one(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
        config: &StoreConfig,
        now: &str,
    ) -> Result<Deleted, ApiError> {
        let key = (ns.to_string(), name.to_string());
        let stored = self
            .objects
            .get(&def.storage())
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        let mut obj: Value =
            serde_json::from_slice(&stored.bytes).map_err(|e| ApiError::internal(e.to_string()))?;
        check_preconditions(def, name, &stored, opts)?;
        if opts.dry_run {
            return Ok(Deleted::Gone(stored.bytes));
        }
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            // Already going; a second delete changes nothing.
            return Ok(Deleted::Pending(stored.bytes));
        }
        let is_namespace = def.key() == (String::new(), "namespaces".to_string());
        let propagation = opts.propagation.unwrap_or_default();
        if propagation == Propagation::Orphan {
            self.orphan_dependents(&stored.uid, config);
        }
        let mut finalizers = finalizers_of(&obj);
        let has_dependents = self
            .dependents
            .get(stored.uid.as_ref())
            .is_some_and(|d| !d.is_empty());
        if propagation == Propagation::Foreground
            && has_dependents
            && !finalizers.iter().any(|f| f == "foregroundDeletion")
        {
            finalizers.push("foregroundDeletion".into());
        }
        if is_namespace {
            obj["spec"]["finalizers"] = json!(["kubernetes"]);
            obj["status"]["phase"] = json!("Terminating");
        }
        if finalizers.is_empty() && !is_namespace {
            let bytes = self.remove(def, key, None, config, now);
            return Ok(Deleted::Gone(bytes));
        }
        let meta = meta_mut(&mut obj);
        meta.insert("deletionTimestamp".into(), json!(now));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if !finalizers.is_empty() {
            meta.insert("finalizers".into(), json!(finalizers));
        }
        let bytes = self.commit(def, key.clone(), obj, EventType::Modified, config);
        if finalizers.iter().any(|f| f == "foregroundDeletion") {
            self.foreground.insert((def.storage(), key.clone()));
        }
        if propagation == Propagation::Foreground {
            self.delete_dependents(&stored.uid, config, now);
        }
        if is_namespace {
            self.terminating.insert(name.to_string());
            self.empty_namespace(name, config, now);
        }
        let current = self
            .objects
            .get(&def.storage())
            .and_then(|m| m.get(&key))
            .map(|s| s.bytes.clone());
        Ok(match current {
            Some(b) => Deleted::Pending(b),
            None => Deleted::Gone(bytes),
        })
    }

    /// Orphan deletion: the dependents lose their reference to the owner.
    fn orphan_dependents(&mut self, owner_uid: &str, config: &StoreConfig) {
        let deps: Vec<(ResKey, ObjKey)> = self
            .dependents
            .remove(owner_uid)
            .map(|d| d.into_iter().collect())
            .unwrap_or_default();
        for (res, k) in deps {
            let Some(ddef) = self.defs.get(&res).cloned() else {
                continue;
            };
            let Some(s) = self.objects.get(&res).and_then(|m| m.get(&k)).cloned() else {
                continue;
            };
            let mut v: Value = serde_json::from_slice(&s.bytes).unwrap_or_default();
            if let Some(refs) = v
                .pointer_mut("/metadata/ownerReferences")
                .and_then(Value::as_array_mut)
            {
                refs.retain(|r| r["uid"] != owner_uid);
            }
            self.commit(&ddef, k, v, EventType::Modified, config);
        }
    }

    /// Foreground deletion: every dependent is deleted (in the foreground
    /// too) before the owner goes.
    fn delete_dependents(&mut self, owner_uid: &str, config: &StoreConfig, now: &str) {
        let deps: Vec<(ResKey, ObjKey)> = self
            .dependents
            .get(owner_uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        for (res, k) in deps {
            if let Some(ddef) = self.defs.get(&res).cloned() {
                let fg = DeleteOpts {
                    propagation: Some(Propagation::Foreground),
                    ..Default::default()
                };
                let _ = self.delete_one(&ddef, &k.0, &k.1, &fg, config, now);
            }
        }
        self.finish_foreground(config, now);
    }

    /// A terminating namespace: everything in it is deleted, then the
    /// namespace goes once it is empty.
    fn empty_namespace(&mut self, name: &str, config: &StoreConfig, now: &str) {
        let contents: Vec<(Arc<ResourceDef>, ObjKey)> = self
            .objects
            .iter()
            .flat_map(|(res, m)| {
                let d = self.defs.get(res).cloned();
                m.keys()
                    .filter(|k| k.0 == name)
                    .filter_map(move |k| d.clone().map(|d| (d, k.clone())))
            })
            .collect();
        for (d, k) in contents {
            let _ = self.delete_one(&d, &k.0, &k.1, &DeleteOpts::default(), config, now);
        }
        self.finish_namespaces(config, now);
    }

    /// Owners in foreground deletion whose dependents are all gone lose the
    /// `foregroundDeletion` finalizer (and go, if it was the last).
    pub(super) fn finish_foreground(&mut self, config: &StoreConfig, now: &str) {
        loop {
            let ready = self.foreground.iter().find(|(res, k)| {
                self.objects
                    .get(res)
                    .and_then(|m| m.get(k))
                    .is_none_or(|s| {
                        self.dependents
                            .get(s.uid.as_ref())
                            .is_none_or(|d| d.is_empty())
                    })
            });
            let Some((res, k)) = ready.cloned() else {
                return;
            };
            self.foreground.remove(&(res.clone(), k.clone()));
            let Some(stored) = self.objects.get(&res).and_then(|m| m.get(&k)).cloned() else {
                continue;
            };
            let Some(def) = self.defs.get(&res).cloned() else {
                continue;
            };
            let mut v: Value = serde_json::from_slice(&stored.bytes).unwrap_or_default();
            let rest: Vec<String> = finalizers_of(&v)
                .into_iter()
                .filter(|f| f != "foregroundDeletion")
                .collect();
            if rest.is_empty() {
                meta_mut(&mut v).remove("finalizers");
                self.remove(&def, k, Some(v), config, now);
            } else {
                meta_mut(&mut v).insert("finalizers".into(), json!(rest));
                self.commit(&def, k, v, EventType::Modified, config);
            }
        }
    }

    /// Terminating namespaces with nothing left in them go.
    pub(super) fn finish_namespaces(&mut self, config: &StoreConfig, now: &str) {
        if self.terminating.is_empty() {
            return;
        }
        let key = (String::new(), "namespaces".to_string());
        let terminating: Vec<String> = self.terminating.iter().cloned().collect();
        for ns in terminating {
            let empty = self
                .objects
                .iter()
                .all(|(res, m)| res == &key || !m.keys().any(|k| k.0 == ns));
            if empty && let Some(def) = self.defs.get(&key).cloned() {
                self.terminating.remove(&ns);
                self.remove(&def, (String::new(), ns), None, config, now);
            }
        }
    }
}

/// A delete's preconditions: the uid and resourceVersion it names.
fn check_preconditions(
    def: &ResourceDef,
    name: &str,
    stored: &Stored,
    opts: &DeleteOpts,
) -> Result<(), ApiError> {
    if let Some(uid) = &opts.precondition_uid
        && uid.as_str() != stored.uid.as_ref()
    {
        let m = format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            stored.uid
        );
        return Err(ApiError::conflict_msg(def, name, &m));
    }
    if let Some(rv) = &opts.precondition_rv
        && rv != &stored.rv.to_string()
    {
        let m = format!(
            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
            stored.rv
        );
        return Err(ApiError::conflict_msg(def, name, &m));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{config_map, def, store};
    use super::*;

    fn exists(s: &Store, name: &str) -> bool {
        s.get(&def(s, "", "configmaps"), "ns", name).is_ok()
    }

    #[test]
    fn a_finalizer_holds_a_delete_until_it_is_removed() {
        let s = store();
        let cms = def(&s, "", "configmaps");
        config_map(&s, "held", json!({"finalizers": ["example.com/keep"]})).unwrap();
        let d = s
            .delete(&cms, "ns", "held", &DeleteOpts::default())
            .unwrap();
        let Deleted::Pending(b) = d else {
            panic!("held by its finalizer");
        };
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert!(v["metadata"]["deletionTimestamp"].is_string());
        let opts = WriteOpts::default();
        let release = json!({"metadata": {"finalizers": null}});
        s.patch(
            &cms,
            "ns",
            "held",
            PatchBody {
                kind: PatchKind::Merge,
                body: release,
            },
            Part::Main,
            &opts,
        )
        .unwrap();
        assert!(!exists(&s, "held"));
    }

    #[test]
    fn dependents_go_with_their_owner_unless_orphaned() {
        let s = store();
        let cms = def(&s, "", "configmaps");
        let owner = config_map(&s, "owner", json!({})).unwrap();
        let uid = owner["metadata"]["uid"].clone();
        let refs = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]);
        config_map(&s, "child", json!({"ownerReferences": refs})).unwrap();
        s.delete(&cms, "ns", "owner", &DeleteOpts::default())
            .unwrap();
        assert!(!exists(&s, "child"), "collected with its owner");

        let owner = config_map(&s, "owner2", json!({})).unwrap();
        let uid = owner["metadata"]["uid"].clone();
        let refs = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner2", "uid": uid}]);
        config_map(&s, "kept", json!({"ownerReferences": refs})).unwrap();
        let orphan = DeleteOpts {
            propagation: Some(Propagation::Orphan),
            ..Default::default()
        };
        s.delete(&cms, "ns", "owner2", &orphan).unwrap();
        let kept: Value = serde_json::from_slice(&s.get(&cms, "ns", "kept").unwrap()).unwrap();
        assert!(
            kept["metadata"]
                .get("ownerReferences")
                .is_none_or(|r| r.as_array().is_some_and(Vec::is_empty))
        );
    }

    #[test]
    fn a_delete_checks_its_preconditions() {
        let s = store();
        let cms = def(&s, "", "configmaps");
        config_map(&s, "a", json!({})).unwrap();
        let wrong = DeleteOpts {
            precondition_uid: Some("not-its-uid".into()),
            ..Default::default()
        };
        let e = s.delete(&cms, "ns", "a", &wrong).unwrap_err();
        assert_eq!(e.code, 409);
        assert!(
            e.message
                .contains("Precondition failed: UID in precondition: not-its-uid")
        );
        assert!(exists(&s, "a"));
    }
}
