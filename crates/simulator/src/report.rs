//! What a scenario run produced: the timeline, each expectation checked
//! against the window of its step, and readable output (a timeline, a
//! test line with diffs, or JSON). Entries at the same simulated instant
//! are put in a canonical order, so the output is the same on every run.

use std::cmp::Ordering;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::model::{Expectation, FinalSpec, Scenario, ScenarioError, glob, subset};
use super::world::World;
use runbook_core::util::yaml::Pos;
use runbook_operator::telemetry::journal::Entry;

/// A patch as the timeline shows it: its JSON, without the note Runbook
/// leaves of who changed the object, cut at 160 characters.
fn patch_summary(patch: &Value) -> String {
    let mut p = patch.clone();
    if let Some(meta) = p.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(notes) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            notes.remove(runbook_core::plan::CHANGED_BY);
            if notes.is_empty() {
                meta.remove("annotations");
            }
        }
        if meta.is_empty()
            && let Some(o) = p.as_object_mut()
        {
            o.remove("metadata");
        }
    }
    let text = p.to_string();
    let cut: String = text.chars().take(160).collect();
    if cut.len() < text.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::{offset, patch_summary};

    #[test]
    fn a_patch_shows_what_it_changes_without_runbooks_note() {
        let p = serde_json::json!({"spec": {"replicas": 0},
            "metadata": {"annotations": {"runbook.dev/changed-by": "policy p for X ns/x"}}});
        assert_eq!(patch_summary(&p), r#"{"spec":{"replicas":0}}"#);
    }

    #[test]
    fn offsets_are_exact() {
        assert_eq!(offset(0), "+0s");
        assert_eq!(offset(20_000), "+20s");
        assert_eq!(offset(1_250), "+1.250s");
        assert_eq!(offset(150_000), "+2m30s");
        assert_eq!(offset(3_600_000), "+1h00m");
        assert_eq!(offset(3_930_000), "+1h05m30s");
        assert_eq!(offset(3_900_000), "+1h05m");
    }
}

/// A failed expectation (or world event, or policy error).
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub pos: Option<Pos>,
    pub message: String,
    /// Lines that show what happened instead.
    pub detail: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Report {
    pub name: String,
    pub file: String,
    pub start: Timestamp,
    pub entries: Vec<Entry>,
    pub checked: usize,
    pub failures: Vec<Failure>,
    /// Problems found before running (files, kinds, policies).
    pub load_errors: Vec<ScenarioError>,
    /// Policies the operator set aside at start-up, and why: said first
    /// when the scenario fails.
    pub set_aside: Vec<String>,
    /// The spec at the end of each object the operator wrote status to,
    /// by `apiVersion|kind|namespace|name`.
    pub specs: std::collections::BTreeMap<String, Value>,
    /// The time zone the policies' schedules are in, when they name one
    /// (and the same one): times in status are shown there too.
    pub zone: Option<String>,
    /// The world's metric series (`spec.metrics`), charted by `--html`.
    pub metrics: Vec<crate::model::Series>,
}

fn rank(e: &Entry) -> u8 {
    if e.action == "world" && e.fields["reaction"] == true {
        // The world's own controllers react to what the operator did.
        return 12;
    }
    match e.action.as_str() {
        "world" => 0,
        "error" => 1,
        "refusal" => 2,
        "apply" => 3,
        "patch" => 4,
        "rollback" => 5,
        "delete" => 6,
        "status" => 7,
        "event" => 8,
        "alert" => 9,
        "resolve" => 10,
        _ => 11,
    }
}

fn canonical(a: &Entry, b: &Entry) -> Ordering {
    let order = a
        .time
        .cmp(&b.time)
        .then(rank(a).cmp(&rank(b)))
        .then_with(|| {
            (&a.api_version, &a.kind, &a.namespace, &a.name).cmp(&(
                &b.api_version,
                &b.kind,
                &b.namespace,
                &b.name,
            ))
        });
    // What happens to one object stays in the order it happened (one
    // object is reconciled by one task at a time); entries about no
    // object, such as notifications, are ordered by content.
    if order != Ordering::Equal || !a.kind.is_empty() {
        return order;
    }
    (&a.action, &a.result, &a.detail)
        .cmp(&(&b.action, &b.result, &b.detail))
        .then_with(|| a.fields.to_string().cmp(&b.fields.to_string()))
}

/// `+1h05m30s`, `+1h00m`, `+2m30s`, `+0s`, `+1.250s`: exact, so that two
/// things at different times never look simultaneous.
pub fn offset(ms: i64) -> String {
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1000, rest % 1000);
    let secs = if milli > 0 {
        format!("{s}.{milli:03}s")
    } else {
        format!("{s:02}s")
    };
    if h > 0 {
        if rest == 0 {
            format!("+{h}h{m:02}m")
        } else {
            format!("+{h}h{m:02}m{secs}")
        }
    } else if m > 0 {
        format!("+{m}m{secs}")
    } else if milli > 0 {
        format!("+{s}.{milli:03}s")
    } else {
        format!("+{s}s")
    }
}

fn default_result(action: &str) -> &'static str {
    match action {
        "refusal" => "refused",
        "error" => "failed",
        _ => "ok",
    }
}

fn matches(e: &Expectation, x: &Entry) -> bool {
    let action = e.action.as_deref().unwrap_or("");
    x.action == action
        && x.result == e.result.as_deref().unwrap_or(default_result(action))
        && e.api_version.as_deref().is_none_or(|v| x.api_version == v)
        && e.kind.as_deref().is_none_or(|k| x.kind == k)
        && e.name.as_deref().is_none_or(|n| glob(n, &x.name))
        && e.namespace.as_deref().is_none_or(|n| x.namespace == n)
        && e.fields.as_ref().is_none_or(|f| subset(f, &x.fields))
        && e.labels.as_ref().is_none_or(|l| {
            l.iter()
                .all(|(k, v)| x.fields["labels"][k].as_str() == Some(v.as_str()))
        })
        && e.receivers.as_ref().is_none_or(|rs| {
            rs.iter().all(|r| {
                x.fields["receivers"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|v| v == r))
            })
        })
        && e.receiver
            .as_deref()
            .is_none_or(|r| x.fields["receiver"] == r)
        && e.to_revision
            .is_none_or(|r| x.fields["toRevision"].as_i64() == Some(r))
        && e.reason.as_deref().is_none_or(|r| x.fields["reason"] == r)
        && e.policy.as_deref().is_none_or(|p| x.policy == p)
}

/// A one-line rendering of what an expectation wants.
fn describe(e: &Expectation) -> String {
    let mut parts = vec![e.action.clone().unwrap_or_default()];
    if let Some(p) = &e.policy {
        parts.push(format!("by {p}"));
    }
    if let Some(r) = &e.result {
        parts.push(format!("[{r}]"));
    }
    if let Some(k) = &e.kind {
        parts.push(k.clone());
    }
    if let Some(n) = &e.name {
        parts.push(n.clone());
    }
    let mut want = serde_json::Map::new();
    if let Some(f) = &e.fields {
        want.insert("fields".into(), f.clone());
    }
    if let Some(l) = &e.labels {
        want.insert("labels".into(), json!(l));
    }
    if let Some(r) = &e.receivers {
        want.insert("receivers".into(), json!(r));
    }
    if let Some(r) = &e.receiver {
        want.insert("receiver".into(), json!(r));
    }
    if let Some(r) = e.to_revision {
        want.insert("toRevision".into(), json!(r));
    }
    if let Some(r) = &e.reason {
        want.insert("reason".into(), json!(r));
    }
    if !want.is_empty() {
        parts.push(Value::Object(want).to_string());
    }
    parts.join(" ")
}

impl Report {
    pub fn new(s: &Scenario) -> Self {
        Self {
            name: s.name.clone(),
            file: s.file.clone(),
            start: s.start,
            entries: Vec::new(),
            checked: 0,
            failures: Vec::new(),
            load_errors: Vec::new(),
            specs: Default::default(),
            set_aside: Vec::new(),
            zone: None,
            metrics: s.metrics.clone(),
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.load_errors.is_empty()
    }

    fn ms(&self, e: &Entry) -> i64 {
        e.time.as_millisecond() - self.start.as_millisecond()
    }

    /// Every error a policy raised, once per distinct error (a failing
    /// policy retries), as failures of a scenario that expected none.
    fn unexpected_errors(&mut self) {
        let errors: Vec<Failure> = self
            .entries
            .iter()
            .filter(|x| x.action == "error")
            .map(|x| Failure {
                pos: None,
                message: format!(
                    "at {}: policy {} failed on {} {}/{}: {}",
                    offset(self.ms(x)),
                    x.policy,
                    x.kind,
                    x.namespace,
                    x.name,
                    x.detail
                ),
                detail: Vec::new(),
            })
            .collect();
        // One line per distinct error: a failing policy retries.
        for f in errors {
            let key = f.message.split_once(": policy").map(|(_, r)| r.to_string());
            if !self
                .failures
                .iter()
                .any(|g| g.message.split_once(": policy").map(|(_, r)| r.to_string()) == key)
            {
                self.failures.push(f);
            }
        }
    }

    /// Order the entries and check every expectation against them.
    pub fn finish(&mut self, s: &Scenario, mut entries: Vec<Entry>) {
        entries.sort_by(canonical);
        self.entries = entries;
        let mut expected_errors = false;
        for (i, step) in s.steps.iter().enumerate() {
            let end = s.steps.get(i + 1).map(|n| n.at_ms);
            let in_window = |x: &&Entry| {
                let t = self.ms(x);
                t >= step.at_ms && end.map_or(t <= s.until_ms, |e| t < e)
            };
            let window: Vec<&Entry> = self.entries.iter().filter(in_window).collect();
            let shown_end = offset(end.unwrap_or(s.until_ms));
            for (e, pos) in &step.expect {
                self.checked += 1;
                if e.action.as_deref() == Some("error") {
                    expected_errors = true;
                }
                let n = window.iter().filter(|x| matches(e, x)).count();
                let ok = match e.count {
                    Some(c) => n == c,
                    None => n >= 1,
                };
                if ok {
                    continue;
                }
                let how = match e.count {
                    Some(c) => format!("exactly {c}"),
                    None => "at least one".into(),
                };
                let mut detail: Vec<String> = window
                    .iter()
                    .filter(|x| Some(x.action.as_str()) == e.action.as_deref())
                    .filter(|x| e.kind.as_deref().is_none_or(|k| x.kind == k))
                    .take(8)
                    .map(|x| format!("saw  {}", self.line(x)))
                    .collect();
                if detail.is_empty() {
                    detail.push(format!(
                        "saw  no {} in [{}, {}]",
                        e.action.as_deref().unwrap_or(""),
                        offset(step.at_ms),
                        shown_end
                    ));
                }
                self.failures.push(Failure {
                    pos: Some(*pos),
                    message: format!(
                        "at {}: want {how} {}, got {n}",
                        offset(step.at_ms),
                        describe(e)
                    ),
                    detail,
                });
            }
        }
        if !expected_errors {
            self.unexpected_errors();
        }
    }

    /// One timeline line.
    pub fn line(&self, x: &Entry) -> String {
        let what = if x.action == "world" || x.action == "notify" || x.kind.is_empty() {
            String::new()
        } else if x.namespace.is_empty() {
            format!("{} {} {}", x.api_version, x.kind, x.name)
        } else {
            format!("{} {} {}/{}", x.api_version, x.kind, x.namespace, x.name)
        };
        let mut detail = match x.action.as_str() {
            "status" if x.result != "ok" && !x.detail.is_empty() => x.detail.clone(),
            "status" => status_summary(&x.fields, self.zone.as_deref()),
            "rollback" => match (
                x.fields["fromRevision"].as_i64(),
                x.fields["toRevision"].as_i64(),
            ) {
                (Some(f), Some(t)) => format!("revision {f} -> {t}"),
                (None, Some(t)) => format!("to revision {t}"),
                _ => String::new(),
            },
            "patch" if x.result == "ok" && x.fields.is_object() => patch_summary(&x.fields),
            "world" if !x.kind.is_empty() => {
                let obj = if x.namespace.is_empty() {
                    format!("{} {} {}", x.api_version, x.kind, x.name)
                } else {
                    format!("{} {} {}/{}", x.api_version, x.kind, x.namespace, x.name)
                };
                format!("{obj}: {}", x.detail)
            }
            _ => x.detail.clone(),
        };
        if x.result != "ok" && x.action != "refusal" && x.action != "error" {
            detail = format!("[{}] {detail}", x.result);
        }
        let body = match (what.is_empty(), detail.is_empty()) {
            (false, false) => format!("{what}  {detail}"),
            (false, true) => what,
            (true, _) => detail,
        };
        format!("{:>9}  {:<8} {}", offset(self.ms(x)), x.action, body)
            .trim_end()
            .to_string()
    }

    /// The readable timeline: what the world did and what the operator did.
    pub fn timeline(&self) -> String {
        let mut out = format!("scenario: {} ({})\n", self.name, self.file);
        if let Some(z) = &self.zone {
            out.push_str(&format!(
                "times: UTC, and in {z} (the policies' schedules) beside each time in status\n"
            ));
        }
        for x in &self.entries {
            if x.result == "unchanged" {
                continue;
            }
            out.push_str(&self.line(x));
            out.push('\n');
        }
        out
    }

    /// What went wrong before any expectation was checked, each once:
    /// script errors, refused and failed actions (their messages carry
    /// the script's position).
    fn root_causes(&self) -> Vec<String> {
        let mut out: Vec<String> = self.set_aside.clone();
        for f in self.failures.iter().filter(|f| f.pos.is_none()) {
            out.push(format!("{}: {}", self.file, f.message));
        }
        for x in &self.entries {
            let cause = match (x.action.as_str(), x.result.as_str()) {
                ("refusal", _) => format!("policy {} refused: {}", x.policy, x.detail),
                ("error", _) => continue,
                (action, "failed") => format!(
                    "policy {}: {action} {} {}/{} failed: {}",
                    x.policy, x.kind, x.namespace, x.name, x.detail
                ),
                _ => continue,
            };
            let line = format!("at {}: {cause}", offset(self.ms(x)));
            // A retried failure is one cause.
            let same = |l: &String| l.split_once(": ").map(|(_, r)| r) == Some(cause.as_str());
            if !out.iter().any(same) {
                out.push(line);
            }
        }
        out
    }

    /// The failures: the root causes first (load errors, script errors,
    /// refusals, failed actions), then each expectation with its position
    /// and what was seen.
    pub fn diffs(&self) -> String {
        let mut out = String::new();
        for e in &self.load_errors {
            out.push_str(&format!("    {e}\n"));
        }
        for c in self.root_causes() {
            out.push_str(&format!("    cause: {c}\n"));
        }
        for f in self.failures.iter().filter(|f| f.pos.is_some()) {
            match f.pos {
                Some(p) => out.push_str(&format!("    {}:{p}: {}\n", self.file, f.message)),
                None => out.push_str(&format!("    {}: {}\n", self.file, f.message)),
            }
            for d in &f.detail {
                out.push_str(&format!("        {d}\n"));
            }
        }
        out
    }

    /// The test line: `ok` or `FAIL`, the name, the file, the count.
    pub fn summary(&self) -> String {
        let status = if self.passed() { "ok  " } else { "FAIL" };
        format!(
            "{status}  {}  ({}, {} expectations, {} actions)",
            self.name,
            self.file,
            self.checked,
            self.entries
                .iter()
                .filter(|x| x.action != "world" && x.result != "unchanged")
                .count()
        )
    }

    pub fn to_json(&self) -> Value {
        let entries: Vec<Value> = self
            .entries
            .iter()
            .filter(|x| x.result != "unchanged")
            .map(|x| {
                let mut v = serde_json::to_value(x).unwrap_or_default();
                v["offset"] = json!(offset(self.ms(x)));
                v
            })
            .collect();
        json!({
            "scenario": self.name,
            "file": self.file,
            "start": runbook_core::util::time::format(self.start),
            "passed": self.passed(),
            "expectations": self.checked,
            "failures": self.failures.iter().map(|f| json!({
                "position": f.pos.map(|p| p.to_string()),
                "message": f.message,
                "detail": f.detail,
            })).collect::<Vec<_>>(),
            "loadErrors": self.load_errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            "entries": entries,
        })
    }
}

/// A status time shown in `zone` too: `2026-03-30T18:00:00Z (20:00 CEST)`.
fn in_zone(text: &str, zone: Option<&str>) -> String {
    let (Some(zone), Ok(t)) = (zone, text.parse::<Timestamp>()) else {
        return text.to_string();
    };
    let Ok(tz) = runbook_core::schedule::time_zone(zone) else {
        return text.to_string();
    };
    let local = t.to_zoned(tz);
    format!(
        "{text} ({} {})",
        local.strftime("%H:%M"),
        local.strftime("%Z")
    )
}

fn status_summary(fields: &Value, zone: Option<&str>) -> String {
    let Some(m) = fields.as_object() else {
        return String::new();
    };
    let mut parts = Vec::new();
    // The phase first: a long line is cut, and it is what is read first.
    let first = ["phase"];
    let ordered = first
        .iter()
        .filter_map(|k| m.get_key_value(*k))
        .chain(m.iter().filter(|(k, _)| !first.contains(&k.as_str())));
    for (k, v) in ordered {
        let shown = match v {
            Value::String(s) => in_zone(s, zone),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => "null".into(),
            _ => continue,
        };
        parts.push(format!("{k}={shown}"));
    }
    let mut s = parts.join(" ");
    if s.len() > 120 {
        let cut = s.char_indices().nth(117).map_or(s.len(), |(i, _)| i);
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// The objects a final state names: one by name, or every one a name
/// with wildcards matches.
async fn final_objects(
    f: &FinalSpec,
    world: &World,
) -> Result<Vec<kube::api::DynamicObject>, String> {
    let served = match world.served(f.api_version.as_deref(), &f.kind) {
        Ok(s) => s,
        Err(e) => return Err(e),
    };
    let ns = f
        .namespace
        .clone()
        .unwrap_or_else(|| world.namespace.clone());
    let api: kube::Api<kube::api::DynamicObject> = if served.namespaced {
        kube::Api::namespaced_with(world.client.clone(), &ns, &served.resource)
    } else {
        kube::Api::all_with(world.client.clone(), &served.resource)
    };
    // A name with wildcards stands for every object it matches.
    let got = if f.name.contains(['*', '?']) {
        match api.list(&Default::default()).await {
            Ok(l) => l
                .items
                .into_iter()
                .filter(|o| super::model::glob(&f.name, o.metadata.name.as_deref().unwrap_or("")))
                .collect(),
            Err(e) => {
                let e = runbook_operator::util::api_error(&e);
                return Err(format!("at the end: list {}: {e}", f.kind));
            }
        }
    } else {
        api.get_opt(&f.name)
            .await
            .ok()
            .flatten()
            .into_iter()
            .collect()
    };
    Ok(got)
}

/// What an object holds of the parts an expectation names (its spec and
/// status where it names neither), for a failure's detail.
fn saw(want: &Value, value: &Value) -> String {
    let mut parts: Vec<&str> = want
        .as_object()
        .map(|w| w.keys().map(String::as_str).collect())
        .unwrap_or_default();
    if parts.is_empty() {
        parts = vec!["spec", "status"];
    }
    let shown: Vec<String> = parts
        .iter()
        .map(|k| match k {
            &"metadata" => {
                let of_want: Vec<&str> = want[k]
                    .as_object()
                    .map(|m| m.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                let meta = &value[k];
                let picked: serde_json::Map<String, Value> = of_want
                    .iter()
                    .map(|f| (f.to_string(), meta.get(*f).cloned().unwrap_or(Value::Null)))
                    .collect();
                format!("metadata {}", Value::Object(picked))
            }
            _ => format!("{k} {}", value.get(*k).unwrap_or(&Value::Null)),
        })
        .collect();
    format!("saw  {}", shown.join(" "))
}

/// Check one final object state.
pub async fn check_final(f: &FinalSpec, pos: Pos, world: &World) -> Option<Failure> {
    let fail = |message: String, detail: Vec<String>| {
        Some(Failure {
            pos: Some(pos),
            message,
            detail,
        })
    };
    let got = match final_objects(f, world).await {
        Ok(got) => got,
        Err(e) => return fail(e, Vec::new()),
    };
    if f.absent {
        return match got.first() {
            None => None,
            Some(o) => fail(
                format!(
                    "at the end: want no {} {}, but {} exists",
                    f.kind,
                    f.name,
                    o.metadata.name.as_deref().unwrap_or("")
                ),
                Vec::new(),
            ),
        };
    }
    if got.is_empty() {
        return fail(
            format!(
                "at the end: want {} {}, but it does not exist",
                f.kind, f.name
            ),
            Vec::new(),
        );
    }
    for o in got {
        let value = serde_json::to_value(&o).unwrap_or_default();
        if let Some(want) = &f.fields
            && !subset(want, &value)
        {
            return fail(
                format!(
                    "at the end: {} {} does not hold {want}",
                    f.kind,
                    o.metadata.name.as_deref().unwrap_or("")
                ),
                vec![saw(want, &value)],
            );
        }
    }
    None
}
