//! Replay: one scenario (a captured cluster, say) run under two versions
//! of its policies on the same simulated clock, and the difference of
//! what the operator did, object by object: actions only one version
//! takes, actions both take with different content (field by field), the
//! status each left, and alerts.
//!
//! Both runs start from the same objects at the same simulated time and
//! the world behaves the same, so a policy change that changes nothing
//! gives two identical journals; every difference is the change's.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::model::Scenario;
use super::report::{self, Report};
use runbook_operator::telemetry::journal::Entry;

/// What to replay: the scenario, the two policy versions (each one or
/// more directories, each its own bundle), and for how long.
pub struct Replay {
    pub scenario: Scenario,
    pub old: Vec<PathBuf>,
    pub new: Vec<PathBuf>,
    pub for_ms: i64,
    /// A scenario whose rules and timeline are what the world does
    /// meanwhile (Job completions, edits), added to the scenario's own.
    pub world: Option<Scenario>,
    /// How much wall-clock time each run may take.
    pub limit: std::time::Duration,
}

/// How one object fared under the two versions.
#[derive(Debug, Default)]
pub struct ObjectDiff {
    /// `apiVersion kind namespace/name`.
    pub object: String,
    pub only_old: Vec<Entry>,
    pub only_new: Vec<Entry>,
    /// The same action at the same time with other content.
    pub changed: Vec<(Entry, Entry, Vec<FieldDiff>)>,
    /// Status fields the object ended with that differ.
    pub status: Vec<FieldDiff>,
}

/// One field that differs: its path, and its value in each version
/// (`null`: absent).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldDiff {
    pub path: String,
    pub old: Value,
    pub new: Value,
}

/// A target whose last decision, as the cluster recorded it, the new
/// version would not make: what it did, and what the new version's first
/// decision there does (each `verb object`, results left aside).
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryDiff {
    pub target: String,
    pub policy: String,
    pub recorded_at: Option<String>,
    pub recorded: Vec<String>,
    pub new: Vec<String>,
}

/// Both runs and their difference.
pub struct Replayed {
    pub old: Report,
    pub new: Report,
    pub objects: Vec<ObjectDiff>,
    /// Against the decisions the scenario's objects carry (a captured
    /// cluster's history).
    pub history: Vec<HistoryDiff>,
}

impl Replayed {
    pub fn same(&self) -> bool {
        self.objects.is_empty()
    }
}

/// Run the scenario under each version and compare.
pub fn replay(r: &Replay) -> Replayed {
    let under = |dirs: &[PathBuf]| {
        let mut s = r.scenario.clone();
        if let Some((first, more)) = dirs.split_first() {
            s.policies = first.clone();
            s.more_policies = more.to_vec();
        }
        s.until_ms = r.for_ms;
        // What the scenario expects belongs to one version; a replay
        // compares, it does not check.
        s.final_.clear();
        for step in &mut s.steps {
            step.expect.clear();
        }
        if let Some(w) = &r.world {
            s.rules.extend(w.rules.iter().cloned());
            s.metrics.extend(w.metrics.iter().cloned());
            s.steps.extend(w.steps.iter().cloned());
            s.steps.sort_by_key(|step| step.at_ms);
        }
        super::run::run_within(&s, r.limit)
    };
    let old = under(&r.old);
    let new = under(&r.new);
    let objects = compare(&old, &new);
    let history = against_history(&r.scenario, &new);
    Replayed {
        old,
        new,
        objects,
        history,
    }
}

/// A record's actions, as compared: `verb object`, sorted.
fn actions_of(record: &Value) -> Vec<String> {
    let mut out: Vec<String> = record["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let verb = a["action"].as_str().unwrap_or("");
            // The record's own object: said by records of an older form,
            // left out by the compact one.
            let on = if runbook_core::crd::ActionRecord::on_itself(verb) {
                ""
            } else {
                a["target"].as_str().unwrap_or("")
            };
            format!("{verb} {on}").trim_end().to_string()
        })
        .collect();
    out.sort();
    out
}

/// Which target an object's decision records are of: itself, or for a
/// `RunbookState` the target it names.
fn recorded_target(o: &Value) -> String {
    let (v, t) = match o["kind"].as_str() {
        Some("RunbookState") => (&o["spec"]["target"], &o["spec"]["target"]),
        _ => (o, &o["metadata"]),
    };
    let text = |x: &Value, k: &str| x[k].as_str().unwrap_or("").to_string();
    let ns = text(t, "namespace");
    let name = text(t, "name");
    let at = if ns.is_empty() {
        name
    } else {
        format!("{ns}/{name}")
    };
    format!("{} {} {at}", text(v, "apiVersion"), text(v, "kind"))
}

/// Where the new version's first decision on a target differs from the
/// last one the scenario's objects record for the same policy. A new
/// version's first decision always writes its record (the policy's
/// version changed), so the first record written is that decision.
fn against_history(s: &Scenario, new: &Report) -> Vec<HistoryDiff> {
    let mut first: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for e in new
        .entries
        .iter()
        .filter(|e| matches!(e.action.as_str(), "status" | "state") && e.result == "ok")
    {
        let target = object_of(e);
        for record in e.fields["decisions"].as_array().into_iter().flatten() {
            let policy = record["policy"].as_str().unwrap_or("").to_string();
            first
                .entry((target.clone(), policy))
                .or_insert_with(|| actions_of(record));
        }
    }
    let mut out = Vec::new();
    for o in s.objects.iter().flat_map(|(_, docs)| docs) {
        for record in o["status"]["decisions"].as_array().into_iter().flatten() {
            let target = recorded_target(o);
            let policy = record["policy"].as_str().unwrap_or("").to_string();
            let Some(decided) = first.get(&(target.clone(), policy.clone())) else {
                continue;
            };
            let recorded = actions_of(record);
            if *decided != recorded {
                out.push(HistoryDiff {
                    target,
                    policy,
                    recorded_at: record["time"].as_str().map(str::to_string),
                    recorded,
                    new: decided.clone(),
                });
            }
        }
    }
    out
}

/// What the operator did, as compared: neither the world's own doings nor
/// the notifications (their batching follows the alerts), nor what
/// changed nothing.
fn acted(e: &Entry) -> bool {
    !matches!(e.action.as_str(), "world" | "notify") && e.result != "unchanged"
}

fn object_of(e: &Entry) -> String {
    if e.namespace.is_empty() {
        format!("{} {} {}", e.api_version, e.kind, e.name)
    } else {
        format!("{} {} {}/{}", e.api_version, e.kind, e.namespace, e.name)
    }
}

/// Each object's entries, in time order.
fn by_object(r: &Report) -> BTreeMap<String, Vec<&Entry>> {
    let mut out: BTreeMap<String, Vec<&Entry>> = BTreeMap::new();
    for e in r.entries.iter().filter(|e| acted(e)) {
        out.entry(object_of(e)).or_default().push(e);
    }
    out
}

/// The difference of the two runs, object by object; objects the same
/// under both are left out.
pub fn compare(old: &Report, new: &Report) -> Vec<ObjectDiff> {
    let (a, b) = (by_object(old), by_object(new));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let empty = Vec::new();
    let mut out = Vec::new();
    for k in keys {
        let (xs, ys) = (a.get(k).unwrap_or(&empty), b.get(k).unwrap_or(&empty));
        let mut d = ObjectDiff {
            object: k.clone(),
            ..Default::default()
        };
        let mut unmatched: Vec<&Entry> = ys.clone();
        for x in xs {
            if let Some(i) = unmatched.iter().position(|y| same(x, y)) {
                unmatched.remove(i);
                continue;
            }
            let counterpart = unmatched
                .iter()
                .position(|y| y.time == x.time && y.action == x.action);
            match counterpart {
                Some(i) => {
                    let y = unmatched.remove(i);
                    let mut fields = Vec::new();
                    field_diffs("", &x.fields, &y.fields, &mut fields);
                    d.changed.push(((*x).clone(), y.clone(), fields));
                }
                None => d.only_old.push((*x).clone()),
            }
        }
        d.only_new = unmatched.into_iter().cloned().collect();
        field_diffs("", &final_status(xs), &final_status(ys), &mut d.status);
        if !(d.only_old.is_empty()
            && d.only_new.is_empty()
            && d.changed.is_empty()
            && d.status.is_empty())
        {
            out.push(d);
        }
    }
    out
}

fn same(x: &Entry, y: &Entry) -> bool {
    x.time == y.time
        && x.action == y.action
        && x.result == y.result
        && x.fields == y.fields
        && x.detail == y.detail
}

/// The status fields an object's writes left it with, merged in order.
fn final_status(entries: &[&Entry]) -> Value {
    let mut status = json!({});
    for e in entries
        .iter()
        .filter(|e| e.action == "status" && e.result == "ok")
    {
        json_patch::merge(&mut status, &e.fields);
    }
    status
}

/// Every leaf where `a` and `b` differ, by dotted path (a list counts as
/// one value).
fn field_diffs(path: &str, a: &Value, b: &Value, out: &mut Vec<FieldDiff>) {
    if a == b {
        return;
    }
    if let (Some(x), Some(y)) = (keyed(a), keyed(b)) {
        return field_diffs(path, &Value::Object(x), &Value::Object(y), out);
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let null = Value::Null;
                field_diffs(
                    &p,
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        _ => out.push(FieldDiff {
            path: if path.is_empty() {
                ".".into()
            } else {
                path.to_string()
            },
            old: a.clone(),
            new: b.clone(),
        }),
    }
}

/// A list whose items each name themselves (`type`, as conditions do,
/// or `name`) as a map by that name, so one item's change is told alone
/// (`conditions.Ready.status`).
fn keyed(v: &Value) -> Option<serde_json::Map<String, Value>> {
    let items = v.as_array()?;
    let mut out = serde_json::Map::new();
    for item in items {
        let key = ["type", "name"]
            .iter()
            .find_map(|k| item.get(*k).and_then(Value::as_str))?;
        if out.insert(key.to_string(), item.clone()).is_some() {
            return None;
        }
    }
    (!items.is_empty()).then_some(out)
}

fn short(v: &Value) -> String {
    let text = match v {
        Value::Null => "(absent)".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match text.char_indices().nth(120) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text,
    }
}

impl Replayed {
    /// The difference as text: per object, each action one version took
    /// alone, each changed one with its fields, and the status fields.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let line = |r: &Report, e: &Entry| r.line(e).trim_start().to_string();
        for d in &self.objects {
            out.push_str(&format!("{}\n", d.object));
            for e in &d.only_old {
                out.push_str(&format!("  only old: {}\n", line(&self.old, e)));
            }
            for e in &d.only_new {
                out.push_str(&format!("  only new: {}\n", line(&self.new, e)));
            }
            for (x, _, fields) in &d.changed {
                let at = report::offset(x.time.as_millisecond() - self.old.start.as_millisecond());
                out.push_str(&format!("  changed:  {at} {}\n", x.action));
                for f in fields {
                    out.push_str(&format!(
                        "    {}: {} -> {}\n",
                        f.path,
                        short(&f.old),
                        short(&f.new)
                    ));
                }
            }
            if !d.status.is_empty() {
                out.push_str("  status at the end:\n");
                for f in &d.status {
                    out.push_str(&format!(
                        "    {}: {} -> {}\n",
                        f.path,
                        short(&f.old),
                        short(&f.new)
                    ));
                }
            }
        }
        if !self.history.is_empty() {
            out.push_str("against the last decision each target records:\n");
        }
        for h in &self.history {
            let at = h.recorded_at.as_deref().unwrap_or("an unknown time");
            out.push_str(&format!(
                "{} (policy {}): at {at} it did [{}]; the new version does [{}]\n",
                h.target,
                h.policy,
                h.recorded.join(", "),
                h.new.join(", ")
            ));
        }
        let count = |f: fn(&ObjectDiff) -> usize| self.objects.iter().map(f).sum::<usize>();
        out.push_str(&format!(
            "{} objects differ: {} actions only old, {} only new, {} changed; {} status fields differ\n",
            self.objects.len(),
            count(|d| d.only_old.len()),
            count(|d| d.only_new.len()),
            count(|d| d.changed.len()),
            count(|d| d.status.len()),
        ));
        out
    }

    /// The difference as JSON, for CI.
    pub fn to_json(&self) -> Value {
        let diffs = |fs: &[FieldDiff]| -> Vec<Value> {
            fs.iter()
                .map(|f| json!({"path": f.path, "old": f.old, "new": f.new}))
                .collect()
        };
        let objects: Vec<Value> = self
            .objects
            .iter()
            .map(|d| {
                json!({
                    "object": d.object,
                    "onlyOld": d.only_old,
                    "onlyNew": d.only_new,
                    "changed": d.changed.iter().map(|(x, y, f)| json!({"old": x, "new": y, "fields": diffs(f)})).collect::<Vec<_>>(),
                    "status": diffs(&d.status),
                })
            })
            .collect();
        let history: Vec<Value> = self
            .history
            .iter()
            .map(|h| {
                json!({"target": h.target, "policy": h.policy, "recordedAt": h.recorded_at,
                       "recorded": h.recorded, "new": h.new})
            })
            .collect();
        json!({
            "same": self.same(),
            "objects": objects,
            "history": history,
            "old": {"file": self.old.file, "failures": self.old.load_errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(), "actions": self.old.entries.len()},
            "new": {"file": self.new.file, "failures": self.new.load_errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(), "actions": self.new.entries.len()},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: i64, action: &str, name: &str, fields: Value) -> Entry {
        let mut e = Entry::new(
            jiff::Timestamp::from_second(1_700_000_000 + at).unwrap(),
            action,
            "ok",
        )
        .object("v1", "ConfigMap", "ns", name);
        e.fields = fields;
        e
    }

    fn report(entries: Vec<Entry>) -> Report {
        Report {
            name: "r".into(),
            file: "r.yaml".into(),
            start: jiff::Timestamp::from_second(1_700_000_000).unwrap(),
            entries,
            checked: 0,
            failures: Vec::new(),
            load_errors: Vec::new(),
            set_aside: Vec::new(),
            specs: Default::default(),
            metrics: Vec::new(),
            zone: None,
        }
    }

    #[test]
    fn only_the_objects_acted_on_differently_are_told() {
        let old = report(vec![
            entry(1, "status", "a", json!({"phase": "Healthy", "score": 0.9})),
            entry(1, "status", "b", json!({"phase": "Healthy"})),
            entry(2, "apply", "c", json!({"data": {"x": "1"}})),
        ]);
        let new = report(vec![
            entry(1, "status", "a", json!({"phase": "Degraded", "score": 0.9})),
            entry(1, "status", "b", json!({"phase": "Healthy"})),
            entry(3, "delete", "d", json!({})),
        ]);
        let d = compare(&old, &new);
        let names: Vec<&str> = d.iter().map(|o| o.object.as_str()).collect();
        assert_eq!(
            names,
            [
                "v1 ConfigMap ns/a",
                "v1 ConfigMap ns/c",
                "v1 ConfigMap ns/d"
            ]
        );
        assert_eq!(
            d[0].changed[0].2,
            [FieldDiff {
                path: "phase".into(),
                old: json!("Healthy"),
                new: json!("Degraded")
            }]
        );
        assert_eq!(d[0].status.len(), 1);
        assert_eq!(d[1].only_old.len(), 1);
        assert_eq!(d[2].only_new.len(), 1);
        assert!(compare(&old, &old).is_empty());
    }
}
