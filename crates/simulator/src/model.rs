//! The Scenario document: policies, initial objects, standing world rules,
//! a timeline of world events and expectations at simulated times, and
//! the final state expected. Parsed with positions, so every mistake is
//! reported as `file:line:col` before anything runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use runbook_core::util::time::parse_duration_ms;
use runbook_core::util::yaml::{self, Node, NodeValue, Pos};

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioDoc {
    pub api_version: String,
    pub kind: String,
    /// The scenario's name.
    pub metadata: Meta,
    /// The world and the timeline.
    pub spec: ScenarioSpec,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// What the scenario shows; `runbook test` prints it.
    pub name: String,
}

/// A string, or a list of them.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn items(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioSpec {
    /// The policy directory, relative to the scenario file (default: its
    /// directory), or a list of them, each loaded as its own bundle (the
    /// first is the one `editPolicy` edits).
    #[serde(default)]
    pub policies: Option<OneOrMany>,
    /// Files of initial objects, relative to the scenario file.
    #[serde(default)]
    pub objects: Vec<String>,
    /// Namespace of objects that name none (default `default`).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Simulated start time (default 2026-01-01T00:00:00Z).
    #[serde(default)]
    pub start: Option<String>,
    /// How long the simulation runs (default: the last step plus one minute).
    #[serde(default)]
    pub until: Option<String>,
    /// Standing world behaviour: what happens to new objects by themselves.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// Steps in time order: at each, world events, and expectations over the window up to the next step.
    #[serde(default)]
    pub timeline: Vec<StepSpec>,
    /// Object states expected when the simulation ends.
    #[serde(default, rename = "final")]
    pub final_: Vec<FinalSpec>,
    /// The flags the simulated operator is started with.
    #[serde(default)]
    pub operator: OperatorFlags,
    /// What the policies' metric inputs (`spec.metrics`) read, over
    /// simulated time: each series answers the metric it names, or the
    /// query it gives (as asked, spaces aside).
    #[serde(default)]
    pub metrics: Vec<MetricSeriesSpec>,
}

/// A metric's values over simulated time.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricSeriesSpec {
    /// The metric's name in the policy (`spec.metrics[].name`): its
    /// reading for every target.
    #[serde(default)]
    pub name: Option<String>,
    /// Or the query it answers, as the policy asks it (spaces aside).
    #[serde(default)]
    pub query: Option<String>,
    /// `[at, value]` pairs in time order: from each `at` (after the
    /// start, `2h30m`) the value is this number, or no data (`null`).
    pub values: Vec<(String, Option<f64>)>,
    /// A line drawn across its chart in `runbook simulate --html`
    /// (default: the `spec.metric.threshold` of the targets, when they
    /// agree).
    #[serde(default)]
    pub threshold: Option<f64>,
}

/// What `runbook run` would be started with, as far as a scenario's
/// policies need it.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorFlags {
    /// `--allow-dangerous-kinds`: accept policies that declare Secrets,
    /// RBAC objects and the like.
    #[serde(default)]
    pub allow_dangerous_kinds: bool,
    /// `--allow-other-namespaces`: accept policies that make children in
    /// other namespaces than their targets' (`spec.namespaces`).
    #[serde(default)]
    pub allow_other_namespaces: bool,
}

/// A standing rule: every new object of this kind (and name glob) has
/// `complete`, `snapshotReady` or `podReady` done to it `after` its creation.
/// The first rule (in file order) that matches an object claims it.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    /// The kind of new objects the rule acts on.
    pub kind: String,
    /// Their API version (default: any).
    #[serde(default)]
    pub api_version: Option<String>,
    /// A name glob (default `*`).
    #[serde(default = "star")]
    pub name: String,
    /// Only objects holding these fields (a subset match).
    #[serde(default)]
    pub fields: Option<Value>,
    /// How long after the object's creation (default 0s).
    #[serde(default)]
    pub after: Option<String>,
    /// Finish the Job (its pod terminates with a message).
    #[serde(default)]
    pub complete: Option<CompleteSpec>,
    /// Mark the VolumeSnapshot readyToUse.
    #[serde(default)]
    pub snapshot_ready: Option<SnapshotReadySpec>,
    /// Make the pods ready (or not).
    #[serde(default)]
    pub pod_ready: Option<PodReadySpec>,
    /// Claim matching objects and do nothing to them (so that a later,
    /// broader rule does not).
    #[serde(default)]
    pub ignore: bool,
}

fn star() -> String {
    "*".into()
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepSpec {
    /// The step's time after the start, such as `50h30m`.
    pub at: String,
    /// What happens in the world at that time.
    #[serde(default)]
    pub world: Vec<WorldEvent>,
    /// What the operator is expected to do from this step's time to the next step's.
    #[serde(default)]
    pub expect: Vec<Expectation>,
}

/// Something that happens in the world at a step's time.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WorldEvent {
    /// Create objects, from a file or inline.
    Create(CreateSpec),
    /// Merge-patch an object (its status with `status: true`).
    Update(UpdateSpec),
    /// Delete objects (a name glob).
    Delete(RefSpec),
    /// Finish a Job: its pod terminates with a message.
    Complete(CompleteSpec),
    /// Make pods ready or not.
    PodReady(PodReadySpec),
    /// Mark a VolumeSnapshot readyToUse.
    SnapshotReady(SnapshotReadySpec),
    /// Make the API server fail requests.
    Fail(FailSpec),
    /// Change, replace or delete a policy file (a hot reload).
    EditPolicy(EditPolicySpec),
}

impl WorldEvent {
    pub fn name(&self) -> &'static str {
        match self {
            WorldEvent::Create(_) => "create",
            WorldEvent::Update(_) => "update",
            WorldEvent::Delete(_) => "delete",
            WorldEvent::Complete(_) => "complete",
            WorldEvent::PodReady(_) => "podReady",
            WorldEvent::SnapshotReady(_) => "snapshotReady",
            WorldEvent::Fail(_) => "fail",
            WorldEvent::EditPolicy(_) => "editPolicy",
        }
    }
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSpec {
    /// A YAML file of objects, relative to the scenario.
    #[serde(default)]
    pub file: Option<String>,
    /// One object inline.
    #[serde(default)]
    pub object: Option<Value>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RefSpec {
    /// The object's kind.
    pub kind: String,
    /// Its API version (default: the one kind of that name).
    #[serde(default)]
    pub api_version: Option<String>,
    /// A name glob.
    pub name: String,
    /// Its namespace (default: the scenario's).
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateSpec {
    /// The object's kind.
    pub kind: String,
    /// Its API version (default: the one kind of that name).
    #[serde(default)]
    pub api_version: Option<String>,
    /// A name glob.
    pub name: String,
    /// Its namespace (default: the scenario's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// A JSON merge patch of the object; with `status: true`, of its status.
    pub patch: Value,
    /// Patch the status (through the status subresource where there is one).
    #[serde(default)]
    pub status: bool,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteSpec {
    /// A Job name glob (default `*`: every Job not finished).
    #[serde(default)]
    pub name: Option<String>,
    /// Its namespace (default: the scenario's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Whether the Job succeeds (default true) or fails.
    #[serde(default = "yes")]
    pub succeeded: bool,
    /// What its pod's container writes as its termination message (a benchmark's score, say).
    #[serde(default)]
    pub termination_message: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodReadySpec {
    /// A pod name glob (default `*`).
    #[serde(default)]
    pub name: Option<String>,
    /// Its namespace (default: the scenario's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Ready (default true) or not.
    #[serde(default = "yes")]
    pub ready: bool,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotReadySpec {
    /// A VolumeSnapshot name glob (default `*`).
    #[serde(default)]
    pub name: Option<String>,
    /// Its namespace (default: the scenario's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The `status.restoreSize` to report, such as `10Gi`.
    #[serde(default)]
    pub restore_size: Option<String>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailSpec {
    /// get, list, watch, create, update, patch, delete (default: any).
    #[serde(default)]
    pub verb: Option<String>,
    /// A resource plural such as `jobs` (its subresources too), or one
    /// subresource such as `jobs/status` (default: any).
    #[serde(default)]
    pub resource: Option<String>,
    /// The HTTP status code of the failures (default 500).
    #[serde(default = "code500")]
    pub code: u16,
    /// How many requests fail (default 1).
    #[serde(default = "one")]
    pub count: u32,
}

fn code500() -> u16 {
    500
}

fn one() -> u32 {
    1
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EditPolicySpec {
    /// A file of the policy directory.
    pub file: String,
    /// The file's new content.
    #[serde(default)]
    pub content: Option<String>,
    /// Replace a piece of the file's text.
    #[serde(default)]
    pub replace: Option<ReplaceSpec>,
    /// Delete the file.
    #[serde(default)]
    pub delete: bool,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplaceSpec {
    /// The text to find (it must occur).
    pub from: String,
    /// What replaces it.
    pub to: String,
}

/// What the operator is expected to do in a step's window.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expectation {
    /// The action expected (see Expectation actions).
    #[serde(default)]
    pub action: Option<String>,
    /// `none: apply` is `action: apply` with `count: 0`.
    #[serde(default)]
    pub none: Option<String>,
    /// The API version of the object acted on.
    #[serde(default)]
    pub api_version: Option<String>,
    /// The kind of the object acted on.
    #[serde(default)]
    pub kind: Option<String>,
    /// A glob (`*`, `?`).
    #[serde(default)]
    pub name: Option<String>,
    /// The namespace of the object acted on.
    #[serde(default)]
    pub namespace: Option<String>,
    /// A subset of what the action wrote.
    #[serde(default)]
    pub fields: Option<Value>,
    /// Alert labels (a subset).
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Receivers the alert reaches (each of these).
    #[serde(default)]
    pub receivers: Option<Vec<String>>,
    /// The receiver of a notification.
    #[serde(default)]
    pub receiver: Option<String>,
    /// A rollback's revision written back.
    #[serde(default)]
    pub to_revision: Option<i64>,
    /// An Event's reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// The policy that acted (when several act on one target).
    #[serde(default)]
    pub policy: Option<String>,
    /// ok (the default), unchanged, refused, limited, shadow, suspended,
    /// skipped, failed.
    #[serde(default)]
    pub result: Option<String>,
    /// Exactly this many (default: at least one).
    #[serde(default)]
    pub count: Option<usize>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FinalSpec {
    /// The object's kind.
    pub kind: String,
    /// Its API version (default: the one kind of that name).
    #[serde(default)]
    pub api_version: Option<String>,
    /// A name glob: every object it matches must hold `fields`.
    pub name: String,
    /// Its namespace (default: the scenario's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// A subset of the object (maps by key, lists by element, numbers by value).
    #[serde(default)]
    pub fields: Option<Value>,
    /// The object must not exist.
    #[serde(default)]
    pub absent: bool,
}

/// Actions an expectation may name, and what each matches.
pub const ACTIONS: &[(&str, &str)] = &[
    (
        "apply",
        "a server-side apply of a child; `fields` is a subset of the applied object.",
    ),
    ("delete", "a delete of an owned object."),
    (
        "patch",
        "a merge patch of a declared object (`ctx.patch`, a `mutates` kind).",
    ),
    (
        "status",
        "a status write on the target; `fields` is a subset of the fields written.",
    ),
    (
        "state",
        "a write of Runbook's state of the target (its RunbookState: a kind whose status keeps none of Runbook's fields); `fields` is a subset of the state written.",
    ),
    (
        "rollback",
        "a Deployment rolled back; `toRevision` is the revision written back.",
    ),
    (
        "event",
        "a Kubernetes Event on the target; `reason` is its reason.",
    ),
    (
        "refusal",
        "an action the executor refused (undeclared kind, another namespace, another policy's child, status outside `spec.status`); its result is `refused`.",
    ),
    (
        "error",
        "a script error or a failed decision; its result is `failed`.",
    ),
    (
        "alert",
        "an alert raised; `labels` is a subset of its labels, `receivers` the receivers it reaches.",
    ),
    ("resolve", "an alert resolved."),
    (
        "notify",
        "a notification sent to a receiver (`receiver`), after its group's wait.",
    ),
];

/// Results an expectation may ask for, and what each means.
pub const RESULTS: &[(&str, &str)] = &[
    ("ok", "done (the default, but for `refusal` and `error`)."),
    ("unchanged", "not sent: it would have changed nothing."),
    (
        "refused",
        "refused by the executor (the default for `refusal`).",
    ),
    (
        "limited",
        "held back by a blast-radius limit (`spec.limits`).",
    ),
    ("shadow", "decided by a shadow-mode policy and not written."),
    (
        "suspended",
        "held back while the policy's circuit breaker is open.",
    ),
    (
        "skipped",
        "not attempted: an earlier action of the same decision failed.",
    ),
    (
        "failed",
        "attempted, and the API server refused it (the default for `error`).",
    ),
];

fn names(table: &[(&str, &str)]) -> String {
    let n: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
    n.join(", ")
}

/// An error in a scenario, positioned.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ScenarioError {
    pub file: String,
    pub pos: Option<Pos>,
    pub message: String,
}

impl std::fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{}:{}: {}", self.file, p, self.message),
            // The message names its own file (a policy error, say).
            None if self.file.is_empty() => f.write_str(&self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// One step, compiled.
#[derive(Clone, Debug)]
pub struct TimelineStep {
    pub at_ms: i64,
    pub pos: Pos,
    pub world: Vec<(WorldEvent, Pos)>,
    pub expect: Vec<(Expectation, Pos)>,
}

/// A scenario ready to run.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// As given (for display).
    pub file: String,
    pub dir: PathBuf,
    pub policies: PathBuf,
    /// Further policy directories, each its own bundle.
    pub more_policies: Vec<PathBuf>,
    pub objects: Vec<(String, Vec<Value>)>,
    pub namespace: String,
    pub start: jiff::Timestamp,
    pub until_ms: i64,
    pub rules: Vec<Rule>,
    pub steps: Vec<TimelineStep>,
    pub final_: Vec<(FinalSpec, Pos)>,
    pub operator: OperatorFlags,
    /// The world's metric series.
    pub metrics: Vec<Series>,
}

/// A metric series, compiled: its points as milliseconds after the start.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: Option<String>,
    /// The query, without whitespace.
    pub query: Option<String>,
    pub points: Vec<(i64, Option<f64>)>,
    pub threshold: Option<f64>,
}

impl Series {
    /// What it is shown as.
    pub fn label(&self) -> String {
        match (&self.name, &self.query) {
            (Some(n), _) => format!("metric {n}"),
            (None, Some(q)) => q.clone(),
            (None, None) => "metric".into(),
        }
    }

    /// Whether it answers metric `name` asked as `text`.
    pub fn answers(&self, name: &str, text: &str) -> bool {
        self.name.as_deref() == Some(name) || self.query.as_deref() == Some(squeezed(text).as_str())
    }

    /// Its value at `ms` after the start, with when it was set (`None`:
    /// no data).
    pub fn at(&self, ms: i64) -> Option<(i64, f64)> {
        let (t, v) = self.points.iter().rev().find(|(t, _)| *t <= ms)?;
        v.map(|v| (*t, v))
    }
}

/// `text` without whitespace.
pub fn squeezed(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

/// A standing rule, compiled: the objects it claims, how long after their
/// creation it acts, and what it does to each, as the world event a step
/// would give (`None`: it claims them and does nothing).
#[derive(Clone, Debug)]
pub struct Rule {
    pub kind: String,
    pub api_version: Option<String>,
    /// A name glob.
    pub name: String,
    /// Only objects holding these fields (a subset match).
    pub fields: Option<Value>,
    pub after_ms: i64,
    pub pos: Pos,
    pub does: Option<WorldEvent>,
}

impl Rule {
    /// Whether the rule claims an object of this name and content.
    pub fn matches(&self, name: &str, object: &Value) -> bool {
        glob(&self.name, name) && self.fields.as_ref().is_none_or(|f| subset(f, object))
    }
}

fn items<'a>(node: &'a Node, path: &[&str]) -> Vec<&'a Node> {
    match node.at(path).map(|n| &n.value) {
        Some(NodeValue::Seq(items)) => items.iter().collect(),
        _ => Vec::new(),
    }
}

/// Whether a text is a scenario document.
pub fn is_scenario(text: &str) -> bool {
    text.lines().any(|l| l.trim() == "kind: Scenario")
}

/// What loading one scenario file carries along: where it is, and the
/// errors found so far.
struct Loader {
    file: String,
    dir: PathBuf,
    errors: Vec<ScenarioError>,
}

impl Loader {
    /// The scenario document, typed and as a positioned tree.
    fn parse(&mut self, path: &Path) -> Option<(ScenarioDoc, Node)> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                self.fail(None, e.to_string());
                return None;
            }
        };
        let doc: ScenarioDoc = match yaml::parse(&text) {
            Ok(d) => d,
            Err(e) => {
                let at = if e.path.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", e.path)
                };
                self.fail(Some(e.pos), format!("{at}{}", e.message));
                return None;
            }
        };
        match yaml::parse_node(&text) {
            Ok(n) => Some((doc, n)),
            Err(e) => {
                self.fail(Some(e.pos), e.message);
                None
            }
        }
    }

    fn fail(&mut self, pos: Option<Pos>, message: impl Into<String>) {
        self.errors.push(ScenarioError {
            file: self.file.clone(),
            pos,
            message: message.into(),
        });
    }

    /// The objects of a file beside the scenario.
    fn read_objects(&mut self, name: &str, pos: Option<Pos>) -> Option<Vec<Value>> {
        let p = self.dir.join(name);
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) => {
                self.fail(pos, format!("{}: {e}", p.display()));
                return None;
            }
        };
        match yaml::parse_documents(&text) {
            Ok(docs) => Some(docs),
            Err(e) => {
                self.errors.push(ScenarioError {
                    file: p.display().to_string(),
                    pos: Some(e.pos),
                    message: e.message,
                });
                None
            }
        }
    }

    /// The world's metric series, each naming a metric or a query, its
    /// times in order.
    fn metric_series(&mut self, doc: &ScenarioDoc, node: &Node) -> Vec<Series> {
        let nodes = items(node, &["spec", "metrics"]);
        let mut out = Vec::new();
        for (i, m) in doc.spec.metrics.iter().enumerate() {
            let pos = nodes.get(i).map(|n| n.pos);
            if m.name.is_some() == m.query.is_some() {
                self.fail(
                    pos,
                    format!("metrics[{i}]: give name or query, one of them"),
                );
                continue;
            }
            let mut points = Vec::new();
            for (at, v) in &m.values {
                let ms = self.duration(at, pos, &format!("metrics[{i}].values"));
                if points.last().is_some_and(|(last, _)| *last > ms) {
                    self.fail(
                        pos,
                        format!("metrics[{i}].values: {at} comes before the value above it"),
                    );
                }
                points.push((ms, *v));
            }
            out.push(Series {
                name: m.name.clone(),
                query: m.query.as_deref().map(squeezed),
                points,
                threshold: m.threshold,
            });
        }
        out
    }

    /// A duration that is not negative (0 after an error).
    fn duration(&mut self, text: &str, pos: Option<Pos>, what: &str) -> i64 {
        match parse_duration_ms(text) {
            Ok(ms) if ms >= 0 => ms,
            Ok(_) => {
                self.fail(pos, format!("{what} must not be negative"));
                0
            }
            Err(e) => {
                self.fail(pos, format!("{what}: {e}"));
                0
            }
        }
    }

    /// The policy directories (the scenario's own by default).
    fn policy_dirs(&mut self, doc: &ScenarioDoc, node: &Node) -> Vec<PathBuf> {
        let pos = node.at(&["spec", "policies"]).map(|n| n.pos);
        let named = doc.spec.policies.as_ref().map(OneOrMany::items);
        let dirs: Vec<PathBuf> = named
            .unwrap_or_else(|| vec![".".into()])
            .iter()
            .map(|p| self.dir.join(p))
            .collect();
        if dirs.is_empty() {
            self.fail(pos, "policies: name at least one directory");
        }
        for p in &dirs {
            if !p.is_dir() {
                self.fail(pos, format!("policies: {} is not a directory", p.display()));
            }
        }
        dirs
    }

    fn objects(&mut self, doc: &ScenarioDoc, node: &Node) -> Vec<(String, Vec<Value>)> {
        let nodes = items(node, &["spec", "objects"]);
        let mut objects = Vec::new();
        for (i, name) in doc.spec.objects.iter().enumerate() {
            let pos = nodes.get(i).map(|n| n.pos);
            if let Some(docs) = self.read_objects(name, pos) {
                objects.push((name.clone(), docs));
            }
        }
        objects
    }

    /// The standing rules: each does exactly one thing, after a delay.
    fn rules(&mut self, doc: &ScenarioDoc, node: &Node) -> Vec<Rule> {
        let nodes = items(node, &["spec", "rules"]);
        let mut rules = Vec::new();
        for (i, r) in doc.spec.rules.iter().enumerate() {
            let pos = nodes.get(i).map(|n| n.pos).unwrap_or_default();
            let after_ms = r
                .after
                .as_deref()
                .map_or(0, |a| self.duration(a, Some(pos), "after"));
            let mut does: Vec<Option<WorldEvent>> = Vec::new();
            does.extend(r.complete.clone().map(|c| Some(WorldEvent::Complete(c))));
            does.extend(
                r.snapshot_ready
                    .clone()
                    .map(|s| Some(WorldEvent::SnapshotReady(s))),
            );
            does.extend(r.pod_ready.clone().map(|p| Some(WorldEvent::PodReady(p))));
            if r.ignore {
                does.push(None);
            }
            if does.len() != 1 {
                let m = "a rule does exactly one of complete, snapshotReady, podReady, ignore";
                self.fail(Some(pos), m);
            }
            rules.push(Rule {
                kind: r.kind.clone(),
                api_version: r.api_version.clone(),
                name: r.name.clone(),
                fields: r.fields.clone(),
                after_ms,
                pos,
                does: does.into_iter().next().flatten(),
            });
        }
        rules
    }

    /// The timeline, in order, its world events and expectations checked.
    fn steps(&mut self, doc: &ScenarioDoc, node: &Node, policies: &Path) -> Vec<TimelineStep> {
        let nodes = items(node, &["spec", "timeline"]);
        let mut steps = Vec::new();
        let mut last = -1;
        for (i, s) in doc.spec.timeline.iter().enumerate() {
            let step_node = nodes.get(i).copied();
            let pos = step_node.map(|n| n.pos).unwrap_or_default();
            let at = self.duration(&s.at, Some(pos), "at");
            if at < last {
                self.fail(
                    Some(pos),
                    format!("step at {} comes before the step above it", s.at),
                );
            }
            last = at;
            let sub = |key: &str| step_node.map(|n| items(n, &[key])).unwrap_or_default();
            let world_nodes = sub("world");
            let mut world = Vec::new();
            for (j, w) in s.world.iter().enumerate() {
                let wpos = world_nodes.get(j).map(|n| n.pos).unwrap_or(pos);
                self.check_world(w, wpos, policies);
                world.push((w.clone(), wpos));
            }
            let expect_nodes = sub("expect");
            let mut expect = Vec::new();
            for (j, e) in s.expect.iter().enumerate() {
                let epos = expect_nodes.get(j).map(|n| n.pos).unwrap_or(pos);
                match normalise(e) {
                    Ok(e) => expect.push((e, epos)),
                    Err(m) => self.fail(Some(epos), m),
                }
            }
            steps.push(TimelineStep {
                at_ms: at,
                pos,
                world,
                expect,
            });
        }
        steps
    }

    /// A world event: its files exist, its shape is one the world knows.
    fn check_world(&mut self, w: &WorldEvent, pos: Pos, policies: &Path) {
        match w {
            WorldEvent::Create(c) => match (&c.file, &c.object) {
                (Some(f), None) => {
                    self.read_objects(f, Some(pos));
                }
                (None, Some(o)) if o.is_object() => {}
                _ => self.fail(Some(pos), "create: give either file or object"),
            },
            WorldEvent::EditPolicy(e) => {
                let given = [e.content.is_some(), e.replace.is_some(), e.delete];
                if given.iter().filter(|g| **g).count() != 1 {
                    let m = "editPolicy: give exactly one of content, replace, delete";
                    self.fail(Some(pos), m);
                }
                let path = policies.join(&e.file);
                if (e.replace.is_some() || e.delete) && !path.is_file() {
                    self.fail(
                        Some(pos),
                        format!("editPolicy: {} is not a file", path.display()),
                    );
                }
            }
            WorldEvent::Fail(f) => {
                if let Some(v) = &f.verb
                    && runbook_sandbox::faults::ApiVerb::parse(v).is_none()
                {
                    let known: Vec<&str> = runbook_sandbox::faults::ApiVerb::ALL
                        .iter()
                        .map(|v| v.as_str())
                        .collect();
                    let apply = if v == "apply" {
                        " (a server-side apply is a patch)"
                    } else {
                        ""
                    };
                    self.fail(
                        Some(pos),
                        format!(
                            "fail: unknown verb {v:?}{apply}; the API's verbs are {}",
                            known.join(", ")
                        ),
                    );
                }
            }
            _ => {}
        }
    }
}

/// Read and check a scenario file: files exist, events and expectations
/// are well formed, times parse. Kinds are checked when the cluster is up.
pub fn load(path: &Path) -> Result<Scenario, Vec<ScenarioError>> {
    let mut l = Loader {
        file: path.display().to_string(),
        dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
        errors: Vec::new(),
    };
    let Some((doc, node)) = l.parse(path) else {
        return Err(l.errors);
    };
    if doc.kind != "Scenario" || !doc.api_version.starts_with("runbook.dev/") {
        let m = "not a Scenario (want apiVersion runbook.dev/v1alpha1, kind Scenario)";
        l.fail(Some(node.pos), m);
    }
    let pos_of = |p: &[&str]| node.at(p).map(|n| n.pos);
    let policy_dirs = l.policy_dirs(&doc, &node);
    let policies = policy_dirs
        .first()
        .cloned()
        .unwrap_or_else(|| l.dir.clone());
    let objects = l.objects(&doc, &node);
    let start = match &doc.spec.start {
        None => "2026-01-01T00:00:00Z"
            .parse()
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH),
        Some(s) => s.parse().unwrap_or_else(|e| {
            l.fail(pos_of(&["spec", "start"]), format!("start: {e}"));
            jiff::Timestamp::UNIX_EPOCH
        }),
    };
    let rules = l.rules(&doc, &node);
    let steps = l.steps(&doc, &node, &policies);
    let metrics = l.metric_series(&doc, &node);
    let last = steps.last().map_or(0, |s| s.at_ms).max(0);
    let until_ms = match &doc.spec.until {
        Some(u) => l.duration(u, pos_of(&["spec", "until"]), "until"),
        None => last + 60_000,
    };
    if until_ms < last {
        l.fail(
            pos_of(&["spec", "until"]),
            "until comes before the last step",
        );
    }
    let final_nodes = items(&node, &["spec", "final"]);
    let final_ = doc
        .spec
        .final_
        .iter()
        .enumerate()
        .map(|(i, f)| {
            (
                f.clone(),
                final_nodes.get(i).map(|n| n.pos).unwrap_or_default(),
            )
        })
        .collect();
    if !l.errors.is_empty() {
        return Err(l.errors);
    }
    Ok(Scenario {
        name: doc.metadata.name,
        file: l.file,
        dir: l.dir,
        policies,
        more_policies: policy_dirs.iter().skip(1).cloned().collect(),
        objects,
        namespace: doc.spec.namespace.unwrap_or_else(|| "default".into()),
        start,
        until_ms,
        rules,
        steps,
        final_,
        operator: doc.spec.operator,
        metrics,
    })
}

/// Fill in the sugar (`none`, `toRevision`, `reason`) and check the action.
fn normalise(e: &Expectation) -> Result<Expectation, String> {
    let mut e = e.clone();
    if let Some(n) = e.none.take() {
        if e.action.is_some() {
            return Err("give action or none, not both".into());
        }
        e.action = Some(n);
        e.count = Some(0);
    }
    let Some(action) = e.action.as_deref() else {
        return Err(format!(
            "an expectation needs an action: one of {}",
            names(ACTIONS)
        ));
    };
    if !ACTIONS.iter().any(|(a, _)| *a == action) {
        return Err(format!(
            "unknown action {action:?}: want one of {}",
            names(ACTIONS)
        ));
    }
    if let Some(r) = e.result.as_deref()
        && !RESULTS.iter().any(|(n, _)| *n == r)
    {
        return Err(format!(
            "unknown result {r:?}: want one of {}",
            names(RESULTS)
        ));
    }
    Ok(e)
}

/// `*` matches any run of characters, `?` one.
pub fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], t) || (!t.is_empty() && go(p, &t[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &t[1..]),
            _ => false,
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

/// Whether `actual` holds everything in `want`: maps by key, arrays when
/// each wanted element is in the actual array, scalars by equality
/// (numbers by value, so 3 matches 3.0).
pub fn subset(want: &Value, actual: &Value) -> bool {
    match (want, actual) {
        (Value::Object(w), Value::Object(a)) => w.iter().all(|(k, wv)| {
            a.get(k).is_some_and(|av| subset(wv, av)) || (wv.is_null() && !a.contains_key(k))
        }),
        (Value::Array(w), Value::Array(a)) => w.iter().all(|wv| a.iter().any(|av| subset(wv, av))),
        (Value::Number(w), Value::Number(a)) => w.as_f64() == a.as_f64(),
        (w, a) => w == a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_expectations_result_must_be_one_the_journal_writes() {
        let e = Expectation {
            action: Some("apply".into()),
            result: Some("sucess".into()),
            ..Default::default()
        };
        let m = normalise(&e).unwrap_err();
        assert!(
            m.contains("unknown result \"sucess\"") && m.contains("skipped"),
            "{m}"
        );
        let e = Expectation {
            result: Some("limited".into()),
            ..e
        };
        assert!(normalise(&e).is_ok());
    }

    #[test]
    fn globs_match_like_a_shell() {
        assert!(glob("chatbot-eval-*", "chatbot-eval-5f2c"));
        assert!(glob("*", ""));
        assert!(glob("a?c", "abc"));
        assert!(!glob("chatbot-eval-*", "chatbot-snap"));
    }

    #[test]
    fn subsets_compare_maps_arrays_and_numbers() {
        let actual = json!({"phase": "RolledBack", "score": 0.7, "rev": 3.0, "conditions": [{"type": "Ready", "status": "False"}, {"type": "Progressing"}]});
        assert!(subset(&json!({"phase": "RolledBack"}), &actual));
        assert!(subset(&json!({"rev": 3}), &actual));
        assert!(subset(
            &json!({"conditions": [{"type": "Ready", "status": "False"}]}),
            &actual
        ));
        assert!(
            subset(&json!({"missing": null}), &actual),
            "null means absent"
        );
        assert!(!subset(&json!({"phase": "Healthy"}), &actual));
        assert!(!subset(
            &json!({"conditions": [{"type": "Degraded"}]}),
            &actual
        ));
    }
}
