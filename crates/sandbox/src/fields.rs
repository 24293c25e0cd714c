//! Field ownership for server-side apply: which manager set which fields,
//! in the `managedFields` / FieldsV1 form the API server uses
//! (`{"f:spec": {"f:replicas": {}}}`, list items as `k:{"name":"x"}`).
//!
//! Simplifications, said plainly: lists merge by key only where the
//! strategic merge knows a merge key for the field's name (containers, env,
//! volumes, ports, conditions, ...); every other list is atomic, owned and
//! replaced whole. Custom resources follow the same rule, so a CRD's
//! `x-kubernetes-list-type: map` lists are atomic unless their field has one
//! of those names.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::patch::merge_key;

/// A set of field paths as a tree. An empty node is a leaf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet(pub BTreeMap<String, FieldSet>);

/// One step of a path into an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathStep {
    Field(String),
    Item(String, Value),
}

fn item_key(key: &str, item: &Value) -> Option<String> {
    let id = item.get(key)?;
    Some(format!("k:{}", json!({ key: id })))
}

fn parse_step(s: &str) -> Option<PathStep> {
    if let Some(f) = s.strip_prefix("f:") {
        return Some(PathStep::Field(f.to_string()));
    }
    if let Some(k) = s.strip_prefix("k:") {
        let v: Value = serde_json::from_str(k).ok()?;
        let (key, id) = v.as_object()?.iter().next()?;
        return Some(PathStep::Item(key.clone(), id.clone()));
    }
    None
}

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The fields an object sets. `skip_identity` leaves out apiVersion,
    /// kind, metadata.name/namespace and managedFields, which nobody owns.
    pub fn of(v: &Value) -> Self {
        let mut fs = Self::of_map(v.as_object().unwrap_or(&Map::new()));
        fs.0.remove("f:apiVersion");
        fs.0.remove("f:kind");
        if let Some(meta) = fs.0.get_mut("f:metadata") {
            for k in [
                "f:name",
                "f:namespace",
                "f:managedFields",
                "f:resourceVersion",
                "f:uid",
                "f:creationTimestamp",
                "f:generation",
            ] {
                meta.0.remove(k);
            }
            if meta.0.is_empty() {
                fs.0.remove("f:metadata");
            }
        }
        fs
    }

    fn of_map(m: &Map<String, Value>) -> Self {
        let mut out = BTreeMap::new();
        for (k, v) in m {
            out.insert(format!("f:{k}"), Self::of_value(k, v));
        }
        FieldSet(out)
    }

    fn of_value(field: &str, v: &Value) -> Self {
        match v {
            Value::Object(m) if !m.is_empty() => Self::of_map(m),
            Value::Array(items) if !items.is_empty() => match merge_key(field, items.first()) {
                Some(key) if items.iter().all(|i| i.get(key).is_some()) => {
                    let mut out = BTreeMap::new();
                    for item in items {
                        if let Some(k) = item_key(key, item) {
                            let mut child = item.as_object().map(Self::of_map).unwrap_or_default();
                            child.0.insert(".".into(), FieldSet::default());
                            out.insert(k, child);
                        }
                    }
                    FieldSet(out)
                }
                _ => FieldSet::default(),
            },
            _ => FieldSet::default(),
        }
    }

    /// Every path to a leaf (`.` markers count as leaves of their item).
    pub fn leaves(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.walk(&mut Vec::new(), &mut out);
        out
    }

    fn walk(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for (k, child) in &self.0 {
            prefix.push(k.clone());
            if child.is_empty() {
                out.push(prefix.clone());
            } else {
                child.walk(prefix, out);
            }
            prefix.pop();
        }
    }

    /// Whether the set holds this path, or any path through it or above it
    /// that is a leaf (an atomic owner of everything below).
    pub fn touches(&self, path: &[String]) -> bool {
        let mut node = self;
        for step in path {
            match node.0.get(step) {
                None => return false,
                Some(child) if child.is_empty() => return true,
                Some(child) => node = child,
            }
        }
        true
    }

    pub fn insert(&mut self, path: &[String]) {
        let mut node = self;
        for step in path {
            node = node.0.entry(step.clone()).or_default();
        }
    }

    /// Remove a path and prune parents left empty.
    pub fn remove(&mut self, path: &[String]) {
        fn go(node: &mut FieldSet, path: &[String]) -> bool {
            match path.split_first() {
                None => true,
                Some((first, rest)) => {
                    let remove_child = match node.0.get_mut(first) {
                        None => return node.0.is_empty(),
                        Some(child) => rest.is_empty() || go(child, rest),
                    };
                    if remove_child {
                        node.0.remove(first);
                    }
                    node.0.is_empty()
                }
            }
        }
        go(self, path);
    }

    pub fn to_json(&self) -> Value {
        Value::Object(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v.to_json()))
                .collect(),
        )
    }

    pub fn from_json(v: &Value) -> Self {
        FieldSet(
            v.as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), Self::from_json(v)))
                .collect(),
        )
    }
}

/// The value at a field path, if present.
pub fn resolve<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for step in path {
        if step == "." {
            continue;
        }
        cur = match parse_step(step)? {
            PathStep::Field(f) => cur.get(&f)?,
            PathStep::Item(key, id) => cur.as_array()?.iter().find(|i| i.get(&key) == Some(&id))?,
        };
    }
    Some(cur)
}

/// Delete the value at a field path (a list item for a `k:` step whose
/// path ends there or at its `.` marker).
pub fn delete_at(v: &mut Value, path: &[String]) {
    let path: Vec<&String> = path.iter().filter(|s| s.as_str() != ".").collect();
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for step in parents {
        let next = match parse_step(step) {
            Some(PathStep::Field(f)) => cur.get_mut(&f),
            Some(PathStep::Item(key, id)) => cur
                .as_array_mut()
                .and_then(|items| items.iter_mut().find(|i| i.get(&key) == Some(&id))),
            None => None,
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match parse_step(last) {
        Some(PathStep::Field(f)) => {
            if let Some(m) = cur.as_object_mut() {
                m.remove(&f);
            }
        }
        Some(PathStep::Item(key, id)) => {
            if let Some(items) = cur.as_array_mut() {
                items.retain(|i| i.get(&key) != Some(&id));
            }
        }
        None => {}
    }
}

/// Merge an applied configuration into a live object: maps recursively,
/// keyed lists by key, everything else replaced.
pub fn merge_applied(live: &mut Value, applied: &Value) {
    merge_field("", live, applied);
}

fn merge_field(field: &str, live: &mut Value, applied: &Value) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                match l.get_mut(k) {
                    Some(lv) => merge_field(k, lv, av),
                    None => {
                        l.insert(k.clone(), av.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(a)) => match merge_key(field, a.first().or(l.first())) {
            Some(key)
                if a.iter().all(|i| i.get(key).is_some())
                    && l.iter().all(|i| i.get(key).is_some()) =>
            {
                for item in a {
                    match l.iter_mut().find(|x| x.get(key) == item.get(key)) {
                        Some(existing) => merge_field("", existing, item),
                        None => l.push(item.clone()),
                    }
                }
            }
            _ => *l = a.clone(),
        },
        (live, applied) => *live = applied.clone(),
    }
}

/// Paths whose values differ between two objects: added or changed leaves
/// (over the new object) and removed ones (over the old), found in one walk.
pub fn changed(old: &Value, new: &Value) -> (FieldSet, FieldSet) {
    let mut changed = FieldSet::default();
    let mut removed = FieldSet::default();
    let empty = Map::new();
    diff_maps(
        old.as_object().unwrap_or(&empty),
        new.as_object().unwrap_or(&empty),
        &mut Vec::new(),
        &mut changed,
        &mut removed,
        true,
    );
    (changed, removed)
}

fn diff_maps(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    path: &mut Vec<String>,
    changed: &mut FieldSet,
    removed: &mut FieldSet,
    root: bool,
) {
    for (k, nv) in new {
        if root && matches!(k.as_str(), "apiVersion" | "kind") {
            continue;
        }
        if path.len() == 1
            && path[0] == "f:metadata"
            && matches!(
                k.as_str(),
                "name"
                    | "namespace"
                    | "managedFields"
                    | "resourceVersion"
                    | "uid"
                    | "creationTimestamp"
                    | "generation"
            )
        {
            continue;
        }
        path.push(format!("f:{k}"));
        match old.get(k) {
            Some(ov) if ov == nv => {}
            Some(ov) => diff_values(k, ov, nv, path, changed, removed),
            None => {
                let sub = FieldSet::of_value(k, nv);
                insert_all(changed, path, &sub);
            }
        }
        path.pop();
    }
    for (k, ov) in old {
        let identity = root && matches!(k.as_str(), "apiVersion" | "kind");
        if !new.contains_key(k) && !identity {
            path.push(format!("f:{k}"));
            let sub = FieldSet::of_value(k, ov);
            insert_all(removed, path, &sub);
            path.pop();
        }
    }
}

fn diff_values(
    field: &str,
    old: &Value,
    new: &Value,
    path: &mut Vec<String>,
    changed: &mut FieldSet,
    removed: &mut FieldSet,
) {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) if !o.is_empty() && !n.is_empty() => {
            diff_maps(o, n, path, changed, removed, false)
        }
        (Value::Array(o), Value::Array(n)) => match merge_key(field, n.first().or(o.first())) {
            Some(key) if o.iter().chain(n).all(|i| i.get(key).is_some()) => {
                for item in n {
                    let Some(k) = item_key(key, item) else {
                        continue;
                    };
                    path.push(k);
                    match o.iter().find(|x| x.get(key) == item.get(key)) {
                        Some(prev) if prev == item => {}
                        Some(prev) => diff_maps(
                            prev.as_object().unwrap_or(&Map::new()),
                            item.as_object().unwrap_or(&Map::new()),
                            path,
                            changed,
                            removed,
                            false,
                        ),
                        None => {
                            let mut sub =
                                item.as_object().map(FieldSet::of_map).unwrap_or_default();
                            sub.0.insert(".".into(), FieldSet::default());
                            insert_all(changed, path, &sub);
                        }
                    }
                    path.pop();
                }
                for item in o {
                    if !n.iter().any(|x| x.get(key) == item.get(key))
                        && let Some(k) = item_key(key, item)
                    {
                        path.push(k);
                        removed.insert(path);
                        path.pop();
                    }
                }
            }
            _ => changed.insert(path),
        },
        _ => changed.insert(path),
    }
}

/// Insert `prefix` followed by every leaf of `sub` (or `prefix` itself when
/// `sub` is a leaf).
fn insert_all(set: &mut FieldSet, prefix: &[String], sub: &FieldSet) {
    if sub.is_empty() {
        set.insert(prefix);
        return;
    }
    let mut node = set;
    for step in prefix {
        node = node.0.entry(step.clone()).or_default();
    }
    merge_into(node, sub);
}

fn merge_into(dst: &mut FieldSet, src: &FieldSet) {
    for (k, v) in &src.0 {
        merge_into(dst.0.entry(k.clone()).or_default(), v);
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Managed {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub subresource: Option<String>,
    pub time: String,
    pub fields: FieldSet,
}

pub fn read_managed(obj: &Value) -> Vec<Managed> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| Managed {
            manager: m["manager"].as_str().unwrap_or_default().to_string(),
            operation: m["operation"].as_str().unwrap_or("Update").to_string(),
            api_version: m["apiVersion"].as_str().unwrap_or_default().to_string(),
            subresource: m["subresource"].as_str().map(str::to_string),
            time: m["time"].as_str().unwrap_or_default().to_string(),
            fields: FieldSet::from_json(&m["fieldsV1"]),
        })
        .collect()
}

pub fn write_managed(obj: &mut Value, managed: &[Managed]) {
    let entries: Vec<Value> = managed
        .iter()
        .filter(|m| !m.fields.is_empty())
        .map(|m| {
            let mut e = json!({
                "manager": m.manager,
                "operation": m.operation,
                "apiVersion": m.api_version,
                "time": m.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": m.fields.to_json(),
            });
            if let Some(s) = &m.subresource {
                e["subresource"] = json!(s);
            }
            e
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(entries));
        }
    }
}

/// A field another manager owns with a different value.
#[derive(Clone, Debug, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub path: String,
}

/// Render a path as the API server does in conflict messages: `.spec.replicas`.
pub fn render_path(path: &[String]) -> String {
    let mut out = String::new();
    for step in path {
        match parse_step(step) {
            Some(PathStep::Field(f)) => {
                out.push('.');
                out.push_str(&f);
            }
            Some(PathStep::Item(k, id)) => out.push_str(&format!(
                "[{k}={}]",
                id.as_str().map(str::to_string).unwrap_or(id.to_string())
            )),
            None => {}
        }
    }
    out
}

/// The outcome of a server-side apply.
pub struct Applied {
    pub object: Value,
    pub managed: Vec<Managed>,
}

/// Server-side apply `applied` by `manager` onto `live`.
pub fn apply(
    live: &Value,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    subresource: Option<&str>,
    now: &str,
) -> Result<Applied, Vec<Conflict>> {
    let mut managed = read_managed(live);
    let new_set = FieldSet::of(applied);
    let mine = |m: &Managed| {
        m.manager == manager && m.operation == "Apply" && m.subresource.as_deref() == subresource
    };
    let prev_set = managed
        .iter()
        .find(|m| mine(m))
        .map(|m| m.fields.clone())
        .unwrap_or_default();

    let (conflicts, conflict_paths) =
        conflicts_of(live, applied, &new_set, &managed, manager, &mine);
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }

    let mut object = live.clone();
    merge_applied(&mut object, applied);
    // Fields this manager applied before and no longer does go, unless
    // another manager also owns them.
    for path in prev_set.leaves() {
        if new_set.touches(&path) {
            continue;
        }
        let owned_elsewhere = managed.iter().any(|m| !mine(m) && m.fields.touches(&path));
        if !owned_elsewhere {
            delete_at(&mut object, &path);
        }
    }
    // Forcing takes the conflicting fields from their owners; fields set to
    // the same value stay shared.
    for path in &conflict_paths {
        for m in managed
            .iter_mut()
            .filter(|m| !(m.manager == manager && m.operation == "Apply"))
        {
            m.fields.remove(path);
        }
    }
    let changed_set = prev_set != new_set;
    match managed.iter_mut().find(|m| mine(m)) {
        Some(m) if changed_set => {
            m.fields = new_set;
            m.time = now.to_string();
            m.api_version = api_version.to_string();
        }
        Some(_) => {}
        None => managed.push(Managed {
            manager: manager.to_string(),
            operation: "Apply".into(),
            api_version: api_version.to_string(),
            subresource: subresource.map(str::to_string),
            time: now.to_string(),
            fields: new_set,
        }),
    }
    managed.retain(|m| !m.fields.is_empty());
    Ok(Applied { object, managed })
}

/// The fields an apply would change that other managers own: each with
/// its owner (for the error), and their paths (for a forced apply).
fn conflicts_of(
    live: &Value,
    applied: &Value,
    new_set: &FieldSet,
    managed: &[Managed],
    manager: &str,
    mine: &dyn Fn(&Managed) -> bool,
) -> (Vec<Conflict>, Vec<Vec<String>>) {
    let mut conflicts = Vec::new();
    let mut paths = Vec::new();
    for path in new_set.leaves() {
        if path.last().map(String::as_str) == Some(".") {
            continue;
        }
        let (lv, av) = (resolve(live, &path), resolve(applied, &path));
        if lv.is_none() || lv == av {
            continue;
        }
        for m in managed.iter().filter(|m| !mine(m) && m.manager != manager) {
            if m.fields.touches(&path) {
                conflicts.push(Conflict {
                    manager: m.manager.clone(),
                    path: render_path(&path),
                });
                paths.push(path.clone());
            }
        }
    }
    (conflicts, paths)
}

/// Record an update (PUT or non-apply patch) by `manager`: it takes the
/// fields it changed; fields that disappeared leave every manager.
pub fn record_update(
    old: &Value,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
    now: &str,
) {
    let mut managed = read_managed(old);
    let (changed_set, removed) = changed(old, new);
    if changed_set.is_empty() && removed.is_empty() {
        write_managed(new, &managed);
        return;
    }
    for path in removed.leaves() {
        for m in managed.iter_mut() {
            m.fields.remove(&path);
        }
    }
    for path in changed_set.leaves() {
        for m in managed
            .iter_mut()
            .filter(|m| m.manager != manager || m.operation != "Update")
        {
            m.fields.remove(&path);
        }
    }
    let entry = managed.iter_mut().find(|m| {
        m.manager == manager && m.operation == "Update" && m.subresource.as_deref() == subresource
    });
    match entry {
        Some(m) => {
            for path in changed_set.leaves() {
                m.fields.insert(&path);
            }
            m.time = now.to_string();
        }
        None => managed.push(Managed {
            manager: manager.to_string(),
            operation: "Update".into(),
            api_version: api_version.to_string(),
            subresource: subresource.map(str::to_string),
            time: now.to_string(),
            fields: changed_set,
        }),
    }
    managed.retain(|m| !m.fields.is_empty());
    write_managed(new, &managed);
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-11-29T10:00:00Z";

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"}, "data": data})
    }

    fn applied(
        live: &Value,
        a: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, Vec<Conflict>> {
        apply(live, a, manager, force, "v1", None, NOW).map(|r| {
            let mut o = r.object;
            write_managed(&mut o, &r.managed);
            o
        })
    }

    #[test]
    fn applying_twice_changes_nothing() {
        let a = cm(json!({"x": "1"}));
        let once = applied(&json!({}), &a, "runbook", false).unwrap();
        let twice = applied(&once, &a, "runbook", false).unwrap();
        assert_eq!(once, twice);
    }

    #[test]
    fn a_field_dropped_from_the_applied_config_is_removed() {
        let once = applied(
            &json!({}),
            &cm(json!({"x": "1", "y": "2"})),
            "runbook",
            false,
        )
        .unwrap();
        let after = applied(&once, &cm(json!({"x": "1"})), "runbook", false).unwrap();
        assert_eq!(after["data"], json!({"x": "1"}));
    }

    #[test]
    fn another_managers_field_conflicts_unless_forced() {
        let once = applied(&json!({}), &cm(json!({"x": "1"})), "alice", false).unwrap();
        let err = applied(&once, &cm(json!({"x": "2"})), "bob", false).unwrap_err();
        assert_eq!(
            err,
            vec![Conflict {
                manager: "alice".into(),
                path: ".data.x".into()
            }]
        );
        let forced = applied(&once, &cm(json!({"x": "2"})), "bob", true).unwrap();
        assert_eq!(forced["data"]["x"], "2");
        let managers: Vec<&str> = forced["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, ["bob"], "alice lost the field she no longer owns");
    }

    #[test]
    fn the_same_value_from_two_managers_is_shared_not_a_conflict() {
        let once = applied(&json!({}), &cm(json!({"x": "1"})), "alice", false).unwrap();
        let both = applied(&once, &cm(json!({"x": "1"})), "bob", false).unwrap();
        assert_eq!(
            both["metadata"]["managedFields"].as_array().unwrap().len(),
            2
        );
        // Alice stops applying x; Bob still owns it, so it stays.
        let after = applied(
            &both,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
            "alice",
            false,
        )
        .unwrap();
        assert_eq!(after["data"]["x"], "1");
    }

    #[test]
    fn containers_are_owned_by_name() {
        let dep = |image: &str| {
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}})
        };
        let once = applied(&json!({}), &dep("a:1"), "runbook", false).unwrap();
        let fields = &once["metadata"]["managedFields"][0]["fieldsV1"];
        assert!(
            fields
                .pointer("/f:spec/f:template/f:spec/f:containers/k:{\"name\":\"app\"}/f:image")
                .is_some(),
            "{fields}"
        );
        // Someone adds a sidecar with an update; our apply keeps it.
        let mut with_sidecar = once.clone();
        with_sidecar["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar", "image": "s:1"}));
        record_update(
            &once,
            &mut with_sidecar,
            "kubectl-edit",
            "apps/v1",
            None,
            NOW,
        );
        let again = applied(&with_sidecar, &dep("a:2"), "runbook", false).unwrap();
        let names: Vec<&str> = again["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["app", "sidecar"]);
        assert_eq!(
            again["spec"]["template"]["spec"]["containers"][0]["image"],
            "a:2"
        );
    }

    #[test]
    fn an_update_takes_ownership_of_what_it_changed() {
        let once = applied(&json!({}), &cm(json!({"x": "1"})), "runbook", false).unwrap();
        let mut edited = once.clone();
        edited["data"]["x"] = json!("9");
        record_update(&once, &mut edited, "kubectl-edit", "v1", None, NOW);
        let err = applied(&edited, &cm(json!({"x": "1"})), "runbook", false).unwrap_err();
        assert_eq!(err[0].manager, "kubectl-edit");
    }
}
