//! Reads: get, list (pages with continue tokens), and watches (from a
//! resourceVersion, with bookmarks), served from the store's state and
//! its bounded history.

use super::*;

pub(super) fn visible(filter: &Filter, e: &HistEvent) -> Option<&'static str> {
    let ns_ok =
        filter.namespace.as_ref().is_none_or(|ns| ns == &e.key.0) && filter.fields.matches(&e.key);
    if !ns_ok {
        return None;
    }
    // Label and selectable-field changes move objects in and out of a
    // selector's view.
    let now = e.new_labels.matched_by(&filter.labels) && filter.fields.matches_object(&e.bytes);
    let before = e.old_labels.as_ref().map(|l| {
        l.matched_by(&filter.labels)
            && e.old_bytes
                .as_ref()
                .is_none_or(|b| filter.fields.matches_object(b))
    });
    match (e.ty, before, now) {
        (EventType::Added, _, true) => Some("ADDED"),
        (EventType::Deleted, _, true) => Some("DELETED"),
        (EventType::Modified, Some(true), true) => Some("MODIFIED"),
        // Label changes move objects in and out of a selector's view.
        (EventType::Modified, Some(false), true) => Some("ADDED"),
        (EventType::Modified, Some(true), false) => Some("DELETED"),
        (EventType::Modified, None, true) => Some("MODIFIED"),
        _ => None,
    }
}

/// The objects after `after`, as they were at resourceVersion `rv`: what
/// changed since is taken back from the history (it holds every change
/// after a list's resourceVersion, or the continue token is refused as
/// too old).
fn as_of<'a>(
    history: &'a VecDeque<HistEvent>,
    res: &ResKey,
    rv: u64,
    after: &ObjKey,
    now: impl Iterator<Item = (&'a ObjKey, (&'a Bytes, &'a Labels))>,
) -> Vec<(&'a ObjKey, (&'a Bytes, &'a Labels))> {
    // The first change of each object after `rv` says what it was then.
    let mut then: BTreeMap<&ObjKey, Option<(&Bytes, &Labels)>> = BTreeMap::new();
    for e in history
        .iter()
        .filter(|e| e.rv > rv && &e.res == res && &e.key > after)
    {
        then.entry(&e.key)
            .or_insert_with(|| match (&e.old_bytes, &e.old_labels) {
                (Some(b), Some(l)) => Some((b, l)),
                _ => None,
            });
    }
    let mut out: BTreeMap<&ObjKey, (&Bytes, &Labels)> =
        now.filter(|(k, _)| !then.contains_key(k)).collect();
    out.extend(then.into_iter().filter_map(|(k, v)| Some((k, v?))));
    out.into_iter().collect()
}

pub(super) fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let raw = format!("{rv}\u{0}{ns}\u{0}{name}");
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn decode_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect();
    let text = String::from_utf8(bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    let mut parts = text.split('\u{0}');
    let rv = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
    let ns = parts.next().ok_or_else(bad)?.to_string();
    let name = parts.next().ok_or_else(bad)?.to_string();
    Ok((rv, ns, name))
}

impl Store {
    // ----- reads -----

    pub fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> Result<Bytes, ApiError> {
        let inner = self.lock();
        inner
            .objects
            .get(&def.storage())
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .map(|s| s.bytes.clone())
            .ok_or_else(|| ApiError::not_found(def, name))
    }

    pub fn list(
        &self,
        def: &ResourceDef,
        filter: &Filter,
        limit: Option<usize>,
        cont: Option<&str>,
    ) -> Result<Listed, ApiError> {
        if cont.is_none() {
            self.lists
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let inner = self.lock();
        let (start, list_rv) = match cont {
            Some(token) => {
                let (rv, ns, name) = decode_continue(token)?;
                if rv < inner.compacted {
                    return Err(ApiError::gone(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (Some((ns, name)), rv)
            }
            None => (None, inner.rv),
        };
        let empty = BTreeMap::new();
        let objs = inner.objects.get(&def.storage()).unwrap_or(&empty);
        let now: Box<dyn Iterator<Item = (&ObjKey, &Stored)>> = match (&start, &filter.namespace) {
            (Some(s), _) => Box::new(objs.range((
                std::ops::Bound::Excluded(s.clone()),
                std::ops::Bound::Unbounded,
            ))),
            (None, Some(ns)) => Box::new(objs.range((ns.clone(), String::new())..)),
            (None, None) => Box::new(objs.iter()),
        };
        let now = now.map(|(k, s)| (k, (&s.bytes, &s.labels)));
        // A later page shows the objects as they were at the first page's
        // resourceVersion, as the real server serves it from etcd.
        let range: Vec<(&ObjKey, (&Bytes, &Labels))> = match &start {
            Some(after) if list_rv < inner.rv => {
                as_of(&inner.history, &def.storage(), list_rv, after, now)
            }
            _ => now.collect(),
        };
        let mut items = Vec::new();
        let mut last: Option<&ObjKey> = None;
        let mut remaining = 0u64;
        for (k, (bytes, labels)) in range {
            if let Some(ns) = &filter.namespace
                && &k.0 != ns
            {
                if k.0 > *ns {
                    break;
                }
                continue;
            }
            if !filter.matches(k, labels, bytes) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                remaining += 1;
                continue;
            }
            items.push(bytes.clone());
            last = Some(k);
        }
        let continue_token = if remaining > 0 {
            last.map(|k| encode_continue(list_rv, &k.0, &k.1))
        } else {
            None
        };
        Ok(Listed {
            items,
            rv: list_rv,
            continue_token,
            remaining: (remaining > 0).then_some(remaining),
        })
    }

    // ----- watches -----

    /// Start a watch. `rv` None (or 0) sends the current objects as ADDED
    /// first; otherwise every change after `rv` is replayed.
    pub fn watch(
        &self,
        def: &ResourceDef,
        filter: Filter,
        rv: Option<u64>,
        send_initial: bool,
        renderer: Arc<dyn EventRenderer>,
        initial_bookmark: Option<Box<dyn Fn(u64) -> Bytes + Send>>,
    ) -> Result<WatchStream, ApiError> {
        let mut inner = self.lock();
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let key = def.storage();
        let send = |line: Bytes| {
            queued.fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(line);
        };
        match rv {
            Some(rv) if rv > 0 && !send_initial => {
                let oldest = inner
                    .compacted
                    .max(inner.served_since.get(&key).copied().unwrap_or(0));
                if rv < oldest {
                    let status =
                        ApiError::gone(format!("too old resource version: {rv} ({oldest})"))
                            .to_status();
                    send(Bytes::from(format!(
                        "{}\n",
                        json!({"type": "ERROR", "object": status})
                    )));
                    drop(tx);
                    return Ok(WatchStream { id: 0, rx, queued });
                }
                for e in inner.history.iter().filter(|e| e.rv > rv && e.res == key) {
                    if let Some(ty) = visible(&filter, e) {
                        send(renderer.line(ty, &e.bytes));
                    }
                }
            }
            _ => {
                if let Some(objs) = inner.objects.get(&key) {
                    for (k, s) in objs {
                        if filter.matches(k, &s.labels, &s.bytes) {
                            send(renderer.line("ADDED", &s.bytes));
                        }
                    }
                }
                if let Some(mark) = initial_bookmark {
                    send(mark(inner.rv));
                }
            }
        }
        let id = inner.next_watch;
        inner.next_watch += 1;
        inner.watchers.entry(key).or_default().push(Watcher {
            id,
            filter,
            tx: tx.clone(),
            queued: queued.clone(),
            renderer,
        });
        Ok(WatchStream { id, rx, queued })
    }

    /// Push a line (a bookmark) into one watch, in order with its events.
    pub fn send_to_watch(
        &self,
        def: &ResourceDef,
        id: u64,
        make: impl FnOnce(u64) -> Bytes,
    ) -> bool {
        let inner = self.lock();
        let rv = inner.rv;
        match inner
            .watchers
            .get(&def.storage())
            .and_then(|ws| ws.iter().find(|w| w.id == id))
        {
            Some(w) => {
                w.queued.fetch_add(1, Ordering::Relaxed);
                w.tx.send(make(rv)).is_ok()
            }
            None => false,
        }
    }

    pub fn stop_watch(&self, def: &ResourceDef, id: u64) {
        let mut inner = self.lock();
        if let Some(ws) = inner.watchers.get_mut(&def.storage()) {
            ws.retain(|w| w.id != id);
        }
    }

    /// Close every open watch (a fault the tests inject).
    pub fn cut_watches(&self) {
        self.lock().watchers.clear();
    }

    /// Lists served so far (first pages only).
    pub fn lists_served(&self) -> u64 {
        self.lists.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Forget the watch history up to now, as an etcd compaction does: a
    /// watch resumed from an older resourceVersion gets 410 Gone and its
    /// client must list again.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    pub fn watch_count(&self) -> usize {
        self.lock().watchers.values().map(Vec::len).sum()
    }

    /// Every object of a kind, parsed (for tests and the simulator).
    pub fn all(&self, def: &ResourceDef) -> Vec<Value> {
        let inner = self.lock();
        inner
            .objects
            .get(&def.storage())
            .map(|m| {
                m.values()
                    .filter_map(|s| serde_json::from_slice(&s.bytes).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{config_map, def, store};
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns", "name-1");
        assert_eq!(
            decode_continue(&t).unwrap(),
            (42, "ns".into(), "name-1".into())
        );
        assert!(decode_continue("zz").is_err());
    }

    fn names(s: &Store, listed: &Listed) -> Vec<String> {
        let _ = s;
        listed
            .items
            .iter()
            .map(|b| {
                let v: Value = serde_json::from_slice(b).unwrap();
                v["metadata"]["name"].as_str().unwrap().to_string()
            })
            .collect()
    }

    /// As the real server serves them from etcd: every page shows the
    /// objects as they were when the first page was listed.
    #[test]
    fn a_list_comes_in_pages_at_one_resource_version() {
        let s = store();
        for n in ["a", "b", "c"] {
            config_map(&s, n, json!({})).unwrap();
        }
        let cms = def(&s, "", "configmaps");
        let filter = Filter {
            namespace: Some("ns".into()),
            ..Default::default()
        };
        let first = s.list(&cms, &filter, Some(2), None).unwrap();
        // kube-root-ca.crt sorts before the three.
        assert_eq!(names(&s, &first), ["a", "b"]);
        assert_eq!(first.remaining, Some(2));
        // Writes between pages do not change what the next page sees: a new
        // object is not in it, a changed one is as it was, a deleted one
        // is still there.
        config_map(&s, "bb", json!({})).unwrap();
        let changed = s
            .patch(
                &cms,
                "ns",
                "c",
                PatchBody {
                    kind: PatchKind::Merge,
                    body: json!({"data": {"x": "1"}}),
                },
                Part::Main,
                &WriteOpts::default(),
            )
            .unwrap();
        assert!(String::from_utf8_lossy(&changed.bytes).contains("\"x\""));
        s.delete(&cms, "ns", ROOT_CA_CONFIGMAP, &DeleteOpts::default())
            .unwrap();
        let token = first.continue_token.clone().unwrap();
        let second = s.list(&cms, &filter, Some(5), Some(&token)).unwrap();
        assert_eq!(names(&s, &second), ["c", "kube-root-ca.crt"]);
        let c: Value = serde_json::from_slice(&second.items[0]).unwrap();
        assert!(c.get("data").is_none(), "c as it was: {c}");
        assert_eq!(second.rv, first.rv);
        assert!(second.continue_token.is_none());
    }

    #[test]
    fn lists_filter_by_labels_and_fields() {
        let s = store();
        config_map(&s, "web", json!({"labels": {"app": "web"}})).unwrap();
        config_map(&s, "db", json!({"labels": {"app": "db"}})).unwrap();
        let cms = def(&s, "", "configmaps");
        let by_label = Filter {
            labels: runbook_core::labels::Selector::parse("app=web").unwrap(),
            ..Default::default()
        };
        assert_eq!(
            names(&s, &s.list(&cms, &by_label, None, None).unwrap()),
            ["web"]
        );
        let by_field = Filter {
            fields: FieldSelector::parse("metadata.name!=web,metadata.namespace=ns", &[]).unwrap(),
            ..Default::default()
        };
        assert_eq!(
            names(&s, &s.list(&cms, &by_field, None, None).unwrap()),
            ["db", "kube-root-ca.crt"]
        );
        assert_eq!(FieldSelector::parse("spec.x=1", &[]).unwrap_err().code, 400);
    }

    #[test]
    fn a_watch_from_before_a_compaction_is_gone() {
        let s = store();
        config_map(&s, "a", json!({})).unwrap();
        let before = s.current_rv();
        config_map(&s, "b", json!({})).unwrap();
        s.compact();
        let cms = def(&s, "", "configmaps");
        struct Plain;
        impl EventRenderer for Plain {
            fn line(&self, ty: &str, _: &Bytes) -> Bytes {
                Bytes::from(ty.to_string())
            }
        }
        let mut w = s
            .watch(
                &cms,
                Filter::default(),
                Some(before),
                false,
                Arc::new(Plain),
                None,
            )
            .unwrap();
        // As the real server: the watch opens, and its one event is a 410.
        let line = w.rx.try_recv().unwrap();
        let event: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(event["type"], "ERROR");
        assert_eq!(event["object"]["code"], 410);
        assert!(w.rx.try_recv().is_err(), "and then it ends");
    }
}
