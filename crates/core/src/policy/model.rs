//! The policy documents as written in YAML: `Policy` and `AlertRoutes`.
//! Unknown fields are errors, so a misspelt key never silently does nothing.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::KindRef;
use crate::util::yaml::Node;

pub const API_VERSION: &str = "runbook.dev/v1alpha1";

/// Just enough of a document to tell what it is.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Header {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
}

pub use crate::util::yaml::DocMeta;

/// `kind: Policy`.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyDoc {
    pub api_version: String,
    pub kind: String,
    pub metadata: DocMeta,
    pub spec: PolicySpec,
}

/// What a policy acts on, what it may touch, and how it decides.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySpec {
    /// The kind whose objects this policy reconciles.
    pub target: KindRef,
    /// Only targets this label selector matches (a Kubernetes
    /// LabelSelector: `matchLabels`, `matchExpressions`).
    #[serde(default)]
    pub selector: Option<LabelSelectorSpec>,
    /// Only targets whose annotations this selector matches
    /// (`matchAnnotations`, `matchExpressions`), as an opt-in: checked by
    /// Runbook as it reconciles, as annotations have no server-side
    /// selector. A target that stops matching is left as one that stops
    /// matching `selector` is (its `finalize` runs, its finalizer goes).
    #[serde(default)]
    pub annotation_selector: Option<AnnotationSelectorSpec>,
    /// Children: created with an ownerReference to the target, watched.
    #[serde(default)]
    pub owns: Vec<OwnsSpec>,
    /// Kinds read from caches (never written).
    #[serde(default)]
    pub reads: Vec<KindRef>,
    /// Objects read by name only: the operator watches just these (in
    /// the namespaces it reconciles), and is granted get, list and watch
    /// on them alone (RBAC `resourceNames`), so a Secret read this way
    /// needs no `--allow-dangerous-kinds`. A kind given here is not also
    /// in `reads`.
    #[serde(default)]
    pub reads_by_name: Vec<ReadsByNameSpec>,
    /// Kinds that may be patched or rolled back, but are not owned.
    #[serde(default)]
    pub mutates: Vec<KindRef>,
    /// Objects the policy may delete though it did not make them: of these
    /// kinds, in its target's namespace, that the selector matches (a
    /// clean-up of old Pods; the target itself when it names the target's
    /// kind, at the end of a TTL). Anything else a policy did not make is
    /// never deleted.
    #[serde(default)]
    pub deletes: Vec<DeletesSpec>,
    /// Namespaces beside the target's own where the policy may make its
    /// children (a Secret copied into labelled namespaces). Accepted only
    /// from a cluster-wide policy, with `fn finalize` (nothing collects
    /// such children with their target), and only when the operator runs
    /// with `--allow-other-namespaces`.
    #[serde(default)]
    pub namespaces: Option<NamespacesSpec>,
    /// When the policy's work is due (a cron expression, or one read from the target).
    #[serde(default)]
    pub schedule: Option<ScheduleSpec>,
    /// Several schedules, each named, with its own cron and times
    /// (instead of `schedule`): an hourly check and a nightly report of
    /// one policy. `ctx.fired` names those due in a reconcile.
    #[serde(default)]
    pub schedules: Vec<ScheduleSpec>,
    /// A `.rhai` script in the same bundle defining `reconcile(ctx)`.
    #[serde(default)]
    pub script: Option<String>,
    /// Declarative, strictly ordered steps (instead of a script).
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    /// With steps: a `.rhai` file whose functions step expressions and
    /// templates may call.
    #[serde(default)]
    pub functions: Option<String>,
    /// Compensation run once when a step fails or times out.
    #[serde(default)]
    pub on_failure: Vec<StepSpec>,
    /// With steps: how many runs' children to keep.
    #[serde(default)]
    pub retention: Option<RetentionSpec>,
    /// Values the script and templates see as `params`.
    #[serde(default)]
    pub params: Option<Node>,
    /// The `AlertRoutes` document this policy's alerts go through.
    #[serde(default)]
    pub alerts: Option<String>,
    /// `enforce` (the default) writes; `shadow` decides and records the decision, and writes nothing.
    #[serde(default)]
    pub mode: Mode,
    /// Blast-radius limits per target, and a circuit breaker.
    #[serde(default)]
    pub limits: Limits,
    /// Order among policies that target the same kind (lower runs first).
    #[serde(default)]
    pub priority: i32,
    /// Fields of the target (dotted paths: `spec.replicas`,
    /// `metadata.labels`) whose values at the last decision that
    /// concluded a script reads back as `ctx.previous` and asks about
    /// with `ctx.changed(path)`: Kopf's old and new, without a status
    /// field of the policy's own. Kept in the policy's decision record.
    #[serde(default)]
    pub previous: Vec<String>,
    /// Decide once per fire time of the schedule over every target the
    /// policy selects (`ctx.targets`), instead of once per target: a
    /// clean-up of bare Pods every few minutes, without any state written
    /// per target. The run times, the decision record and the limits'
    /// history live in one `RunbookState` of the policy (`ctx.object` is
    /// that record). Needs `spec.schedule`; takes no `finalize`,
    /// `deleted`, `owns` or `previous`.
    #[serde(default)]
    pub sweep: bool,
    /// Values read from Prometheus or an HTTP JSON endpoint that a
    /// decision judges by (`ctx.metric(name)`). The runtime asks, never
    /// the script: a decision stays a function of what it was given, and
    /// what it was given is kept in its decision record.
    #[serde(default)]
    pub metrics: Vec<MetricSpec>,
    /// The part of its targets' status this policy writes. Absent: all of
    /// it, so no other enforcing policy may share its targets.
    #[serde(default)]
    pub status: Option<StatusSpec>,
    /// What the pods of this policy's children may ask for beyond an
    /// ordinary pod (privileges, the host's namespaces or files, a
    /// ServiceAccount): each is refused unless an administrator allows it
    /// here.
    #[serde(default)]
    pub pods: PodsSpec,
}

/// `spec.pods`: what a child's pod (a Pod, or the pod template of a Job,
/// Deployment, StatefulSet, CronJob or any kind with `spec.template`) may
/// ask for. Everything is off by default, so a policy that copies what a
/// custom resource says into a pod cannot be made to run a privileged pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodsSpec {
    /// Privileged containers and added Linux capabilities.
    #[serde(default)]
    pub privileged: bool,
    /// `hostNetwork`, `hostPID`, `hostIPC` and container `hostPort`s.
    #[serde(default)]
    pub host_namespaces: bool,
    /// `hostPath` volumes.
    #[serde(default)]
    pub host_path: bool,
    /// ServiceAccounts the pods may run as, besides none (`default`).
    #[serde(default)]
    pub service_accounts: Vec<String>,
}

impl PodsSpec {
    /// What this allows that `bounds` does not, each said as its field.
    pub fn beyond(&self, bounds: &PodsSpec) -> Vec<String> {
        let mut out = Vec::new();
        for (mine, theirs, field) in [
            (self.privileged, bounds.privileged, "privileged"),
            (
                self.host_namespaces,
                bounds.host_namespaces,
                "hostNamespaces",
            ),
            (self.host_path, bounds.host_path, "hostPath"),
        ] {
            if mine && !theirs {
                out.push(format!("{field}: true"));
            }
        }
        for sa in &self.service_accounts {
            if !bounds.service_accounts.contains(sa) {
                out.push(format!("serviceAccounts: {sa}"));
            }
        }
        out
    }

    /// What this allows, in a few words (`nothing`, or the fields).
    pub fn describe(&self) -> String {
        let mut allowed: Vec<String> = [
            (self.privileged, "privileged"),
            (self.host_namespaces, "hostNamespaces"),
            (self.host_path, "hostPath"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, field)| field.to_string())
        .collect();
        if !self.service_accounts.is_empty() {
            allowed.push(format!(
                "serviceAccounts: {}",
                self.service_accounts.join(", ")
            ));
        }
        if allowed.is_empty() {
            "nothing".into()
        } else {
            allowed.join(", ")
        }
    }
}

/// A Kubernetes LabelSelector: every `matchLabels` pair and every
/// expression must hold.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorSpec {
    /// Labels the target must carry, each with exactly this value.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Expressions over the target's labels; every one must hold.
    #[serde(default)]
    pub match_expressions: Vec<LabelExpression>,
}

/// One `spec.readsByName` entry: a kind and the names of its objects.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadsByNameSpec {
    /// The kind's API group and version, such as `v1`.
    pub api_version: String,
    /// The kind, such as `Secret`.
    pub kind: String,
    /// The objects' names: `ctx.get` and `ctx.list` see these alone.
    pub names: Vec<String>,
}

impl ReadsByNameSpec {
    pub fn kind_ref(&self) -> KindRef {
        KindRef::new(self.api_version.clone(), self.kind.clone())
    }
}

/// One `spec.owns` entry: a kind of the policy's children.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OwnsSpec {
    /// The kind's API group and version, such as `batch/v1` (`v1` for the
    /// core group).
    pub api_version: String,
    /// The kind, as the API server spells it (`Job`, `StatefulSet`).
    pub kind: String,
    /// The fields the policy writes on its children of this kind are its
    /// own outright: one somebody else changed (`kubectl edit`, another
    /// controller) is taken back at the next reconcile, with a Normal
    /// Event `FieldsReverted` on the child naming who had it. Without it,
    /// such an apply fails with a conflict naming the other manager and
    /// is retried. Never applies to an object the policy did not make.
    #[serde(default)]
    pub force: bool,
}

impl OwnsSpec {
    pub fn kind_ref(&self) -> KindRef {
        KindRef::new(self.api_version.clone(), self.kind.clone())
    }
}

impl PolicySpec {
    /// The kinds of `spec.owns`.
    pub fn owned_kinds(&self) -> Vec<KindRef> {
        self.owns.iter().map(OwnsSpec::kind_ref).collect()
    }
}

/// One `spec.deletes` entry.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeletesSpec {
    /// The kind's API group and version, such as `v1`.
    pub api_version: String,
    /// The kind (the target's own kind lets the policy delete its target).
    pub kind: String,
    /// Only objects this label selector matches (none: any of the kind).
    #[serde(default)]
    pub selector: Option<LabelSelectorSpec>,
}

impl DeletesSpec {
    pub fn kind_ref(&self) -> KindRef {
        KindRef::new(self.api_version.clone(), self.kind.clone())
    }
}

/// `spec.annotationSelector`: a LabelSelector over annotations.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnnotationSelectorSpec {
    /// Annotations the target must carry, each with exactly this value.
    #[serde(default)]
    pub match_annotations: BTreeMap<String, String>,
    /// Expressions over the target's annotations (`key` an annotation);
    /// every one must hold.
    #[serde(default)]
    pub match_expressions: Vec<LabelExpression>,
}

/// One `matchExpressions` entry: `operator` is In, NotIn, Exists or
/// DoesNotExist.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelExpression {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// With `In` and `NotIn`: the values (at least one); empty for `Exists` and `DoesNotExist`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// `spec.status`: the top-level status fields and the condition types a
/// policy writes; a write outside them is refused, and two policies that
/// share targets may not declare the same one.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusSpec {
    /// Top-level status fields this policy writes (such as `phase`, `lastScore`).
    #[serde(default)]
    pub fields: Vec<String>,
    /// Condition types this policy sets (such as `Ready`).
    #[serde(default)]
    pub conditions: Vec<String>,
}

/// Keep the children of the newest `keep` runs (the run in progress
/// included) and delete older runs' children, of every owned kind. A run's
/// children carry its id in the label `label`.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetentionSpec {
    /// A template evaluating to a count; null (or absent) keeps everything.
    #[schemars(with = "Option<crate::util::yaml::shape::Count>")]
    pub keep: Node,
    /// The label holding a run's id on its children.
    #[serde(default = "run_label")]
    pub label: String,
}

fn run_label() -> String {
    "runbook.dev/run".into()
}

/// `enforce` writes; `shadow` decides and records, and writes nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Shadow,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

/// When a policy's work is due.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    /// The schedule's name, unique in the policy: each entry of
    /// `spec.schedules` has one (`ctx.fired` lists it, and the target's
    /// `status.schedules` keeps its times under it); `spec.schedule` has
    /// none.
    #[serde(default)]
    pub name: Option<String>,
    /// A fixed cron expression.
    #[serde(default)]
    pub cron: Option<String>,
    /// A dotted path in the target (`spec.schedule`) that holds the expression.
    #[serde(default)]
    pub from_field: Option<String>,
    /// The expression when the field is absent.
    #[serde(default)]
    pub default: Option<String>,
    /// Instead of a cron expression: fire at this interval (`30s`,
    /// `5m`), from the target's creation, or with `idle` from when it
    /// has been left unchanged that long.
    #[serde(default)]
    pub every: Option<String>,
    /// With `every`: fire only once the fields the policy declares in
    /// `spec.previous` have been unchanged this long (`10s`, `1h`), and
    /// every `every` after that while they stay so; a change of one of
    /// them starts the wait again (Kopf's `@timer(idle=...)`).
    #[serde(default)]
    pub idle: Option<String>,
    /// The time zone the expression's times are in (an IANA name such as
    /// `Europe/Berlin`), evaluated with the time zone database: a
    /// night-time run stays at night across DST changes. UTC when absent.
    /// An expression may name its own instead (`CRON_TZ=Europe/Berlin 0 20
    /// * * 1-5`), as a target's field may.
    #[serde(default)]
    pub time_zone: Option<String>,
    /// A new target's first run: at its creation (`creation`, the
    /// default: a new Evaluator is benchmarked at once), or at the first
    /// fire time after it (`schedule`: a nightly report starts tonight).
    #[serde(default)]
    pub first_run: FirstRun,
}

/// The namespaces a policy may make children in, beside its target's.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespacesSpec {
    /// Namespaces whose labels this selector matches (`ctx.namespaces()`
    /// lists them); `{}` matches every namespace.
    pub selector: LabelSelectorSpec,
}

/// When a new target's first scheduled run is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FirstRun {
    /// As soon as the target exists.
    #[default]
    Creation,
    /// At the schedule's first fire time after the target's creation.
    Schedule,
}

/// One declarative step.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepSpec {
    /// The step's name, unique in the policy (decision records and status name it).
    pub name: String,
    /// Server-side apply an object (a child, owned by the target).
    #[serde(default)]
    pub apply: Option<ApplySpec>,
    /// Merge these fields into the target's status.
    #[serde(default)]
    #[schemars(with = "Option<crate::util::yaml::shape::Object>")]
    pub status: Option<Node>,
    /// Delete an owned object.
    #[serde(default)]
    pub delete: Option<DeleteSpec>,
    /// Raise an alert.
    #[serde(default)]
    #[schemars(with = "Option<crate::util::yaml::shape::Object>")]
    pub alert: Option<Node>,
    /// Record a Kubernetes Event on the target.
    #[serde(default)]
    pub event: Option<EventSpec>,
    /// Rhai expression over `it`, `resource`, `ctx`, `params`: the step is done.
    #[serde(default)]
    #[schemars(with = "Option<crate::util::yaml::shape::Expression>")]
    pub ready_when: Option<Node>,
    /// Rhai expression: the step has failed.
    #[serde(default)]
    #[schemars(with = "Option<crate::util::yaml::shape::Expression>")]
    pub failed_when: Option<Node>,
    /// How long the step may take, such as `10m`.
    #[serde(default)]
    pub timeout: Option<String>,
    /// What to report when `failedWhen` holds (a template string).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub message: Option<Node>,
}

/// The object a step applies: a template file in the bundle or inline.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplySpec {
    /// A YAML file of the bundle holding the object, with templates in backticks.
    #[serde(default)]
    pub template: Option<String>,
    /// The object inline, with templates in backticks.
    #[serde(default)]
    #[schemars(with = "Option<crate::util::yaml::shape::Object>")]
    pub object: Option<Node>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteSpec {
    /// Defaults to the one owned kind with this `kind`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// The kind of the owned object to delete.
    pub kind: String,
    /// A name, or a template string in backticks.
    #[schemars(with = "String")]
    pub name: Node,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventSpec {
    /// `Normal` or `Warning`.
    #[serde(default = "default_event_type", rename = "type")]
    pub type_: String,
    /// The Event's reason, in CamelCase (`BackupFailed`).
    pub reason: String,
    /// The Event's message (a template string).
    #[schemars(with = "String")]
    pub message: Node,
}

fn default_event_type() -> String {
    "Normal".into()
}

/// Blast-radius limits, per target object, enforced by the executor.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// For example `1/6h`: at most one rollback per target in six hours.
    #[serde(default)]
    pub rollback: Option<String>,
    /// For example `10/1h`: at most ten deletes per target an hour.
    #[serde(default)]
    pub delete: Option<String>,
    /// For example `5/1h`: at most five patches of declared objects per target an hour.
    #[serde(default)]
    pub patch: Option<String>,
    /// For example `20/1h`: at most twenty applies of children per target an hour.
    #[serde(default)]
    pub apply: Option<String>,
    /// Suspend the policy's writes when errors spike.
    #[serde(default)]
    pub circuit_breaker: Option<CircuitBreakerSpec>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CircuitBreakerSpec {
    /// Fraction of failed reconciles (0..1) that opens the breaker.
    pub error_rate: f64,
    /// Window the rate is measured over, such as `5m`.
    #[serde(default = "default_window")]
    pub window: String,
    /// Reconciles in the window before the rate counts.
    #[serde(default = "default_min_requests")]
    pub min_requests: u32,
    /// How long writes stay suspended.
    #[serde(default = "default_cooldown")]
    pub cooldown: String,
}

fn default_window() -> String {
    "5m".into()
}
fn default_min_requests() -> u32 {
    10
}
fn default_cooldown() -> String {
    "10m".into()
}

/// One `spec.metrics` entry: a number read for a decision, from
/// Prometheus (`prometheus`) or any HTTP endpoint answering JSON (`web`).
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricSpec {
    /// What a script asks for: `ctx.metric("accuracy")`. Unique in the policy.
    pub name: String,
    /// An instant query of Prometheus' HTTP API.
    #[serde(default)]
    pub prometheus: Option<PrometheusSpec>,
    /// A GET of an HTTP endpoint answering JSON, and where the number is in it.
    #[serde(default)]
    pub web: Option<WebSpec>,
    /// How old a value may be (`30s`, `5m`; default `1m`): answers are
    /// kept per query text and per period of this length, so targets
    /// that share a query share one request each period.
    #[serde(default)]
    pub every: Option<String>,
    /// In a decision the schedule fired, ask as of its fire time (the
    /// query's `time`) and share the answer per fire time instead: every
    /// target of one tick judged by the same value, with one request,
    /// however long deciding them all takes. Other decisions (a manual
    /// run) share answers per `every`.
    #[serde(default)]
    pub on_schedule: bool,
    /// How long an answer may take (default `10s`, at most `1m`); a late
    /// one is a reading with the reason `Timeout`.
    #[serde(default)]
    pub timeout: Option<String>,
}

/// `spec.metrics[].prometheus`.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrometheusSpec {
    /// Prometheus' base URL (`http://prometheus.monitoring:9090`). Only a
    /// cluster-wide policy may give one here; a tenant's names its own
    /// ConfigMap or Secret (`addressFrom`).
    #[serde(default)]
    pub address: Option<String>,
    /// The base URL from a key of a ConfigMap or Secret in the policy's
    /// namespace (the operator's, or a tenant's own), read at each query.
    #[serde(default)]
    pub address_from: Option<ValueFrom>,
    /// The query, a template over the target: `{{ .metadata.namespace }}`
    /// is its value quoted as a PromQL string (escaped inside a string
    /// already quoted), so no field of a target can change the query's
    /// shape. Give this or `queryFrom`.
    #[serde(default)]
    pub query: Option<String>,
    /// A query the target chooses (its field), bounded: every metric it
    /// names must match `allowedMetrics`, and every selector in it is
    /// confined to the target's namespace.
    #[serde(default)]
    pub query_from: Option<QueryFromSpec>,
    /// Credentials sent with each query.
    #[serde(default)]
    pub auth: Option<AuthSpec>,
}

/// `spec.metrics[].web`: Argo's web provider, under the same rules.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebSpec {
    /// The endpoint's base URL; only a cluster-wide policy gives one here.
    #[serde(default)]
    pub address: Option<String>,
    /// The base URL from a ConfigMap or Secret of the policy's namespace.
    #[serde(default)]
    pub address_from: Option<ValueFrom>,
    /// Path and query string after the base URL, a template over the
    /// target whose values are percent-encoded
    /// (`/v1/models/{{ .metadata.name }}/quality`).
    #[serde(default)]
    pub path: Option<String>,
    /// Where the number is in the answer: `$.data.score`, `$.items[0].value`,
    /// `$['quality score']` (a number, or a string holding one).
    pub json_path: String,
    /// Credentials sent with each request.
    #[serde(default)]
    pub auth: Option<AuthSpec>,
}

/// A value kept in a key of a ConfigMap or a Secret of the policy's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValueFrom {
    /// A key of a ConfigMap.
    #[serde(default)]
    pub config_map_key_ref: Option<KeyRefSpec>,
    /// A key of a Secret.
    #[serde(default)]
    pub secret_key_ref: Option<KeyRefSpec>,
}

/// A key of a named object.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyRefSpec {
    /// The object's name, in the policy's namespace.
    pub name: String,
    /// The key whose value is read (trimmed).
    pub key: String,
}

/// `queryFrom`: the query a target's field holds, and its bounds.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueryFromSpec {
    /// The target's field holding the query (`spec.metric.query`).
    pub field: String,
    /// The metric names the query may use; `*` matches any run of
    /// characters (`model_*`). At least one.
    pub allowed_metrics: Vec<String>,
    /// The label every selector of the query is confined with:
    /// `namespace="<the target's namespace>"` is added to each (default
    /// `namespace`; empty: not confined, for a cluster-wide policy only).
    #[serde(default)]
    pub namespace_label: Option<String>,
}

/// Credentials for a metric source, each from a Secret of the policy's
/// namespace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthSpec {
    /// `Authorization: Bearer <the key's value>`.
    #[serde(default)]
    pub bearer_token: Option<KeyRefSpec>,
    /// `Authorization: Basic`, from a Secret's two keys.
    #[serde(default)]
    pub basic_auth: Option<BasicAuthSpec>,
}

/// A Secret holding a user name and a password.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BasicAuthSpec {
    /// The Secret's name.
    pub name: String,
    /// The key holding the user name (default `username`).
    #[serde(default = "username_key")]
    pub username_key: String,
    /// The key holding the password (default `password`).
    #[serde(default = "password_key")]
    pub password_key: String,
}

fn username_key() -> String {
    "username".into()
}
fn password_key() -> String {
    "password".into()
}
