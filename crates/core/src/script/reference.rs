//! Every function Runbook gives a script, as its users read them: written
//! here once, held by a test to what the engine registers (a function
//! without an entry, or an entry for nothing, fails it), and printed as
//! `docs/script-functions.md` by `runbook schema --functions`.

use std::collections::BTreeSet;

use rhai::Engine;

/// One function (all its overloads of one arity).
pub struct Entry {
    /// The section it is listed under.
    pub group: Group,
    /// Its name as Rhai registers it (`get$field` for a property).
    pub name: &'static str,
    /// How many arguments it takes, the receiver of a method included.
    pub arity: usize,
    /// How it is called.
    pub call: &'static str,
    /// What it does.
    pub text: &'static str,
    /// A line that uses it, run by a test (see `EXAMPLE_FIXTURES`).
    pub example: &'static str,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Group {
    Ctx,
    Lookups,
    Helpers,
    Views,
    Actions,
}

impl Group {
    const ALL: [Group; 5] = [
        Group::Ctx,
        Group::Lookups,
        Group::Helpers,
        Group::Views,
        Group::Actions,
    ];

    fn title(self) -> &'static str {
        match self {
            Group::Ctx => "What `ctx` tells",
            Group::Lookups => "Lookups in the caches",
            Group::Helpers => "Helpers",
            Group::Views => "Object views",
            Group::Actions => "Actions",
        }
    }

    fn intro(self) -> &'static str {
        match self {
            Group::Ctx => {
                "Properties of the `ctx` a script's `reconcile(ctx)`, `finalize(ctx)` and `deleted(ctx)` receive."
            }
            Group::Lookups => {
                "Objects of the kinds the policy declares (`owns`, `reads`, `mutates`), from \
                 the operator's watch caches; a kind not declared is an error at the call. \
                 Each read is recorded, so a change of what was read wakes the target."
            }
            Group::Helpers => "Functions of their arguments only.",
            Group::Views => {
                "Objects from `ctx` are read-only views sharing the watch cache: read them as \
                 maps (`obj.spec.replicas`, `obj[\"metadata\"]`); a missing field is an \
                 error at its position (`?.` and `?? default` where it may be absent)."
            }
            Group::Actions => {
                "What a script returns: an array of these. Each is checked against what the \
                 policy declares before anything is written."
            }
        }
    }
}

macro_rules! entry {
    ($group:ident, $name:literal, $arity:literal, $call:literal, $text:literal, $example:literal) => {
        Entry {
            group: Group::$group,
            name: $name,
            arity: $arity,
            call: $call,
            text: $text,
            example: $example,
        }
    };
}

/// The functions, in the order the reference lists them.
pub const FUNCTIONS: &[Entry] = &[
    entry!(
        Ctx,
        "get$resource",
        1,
        "ctx.resource",
        "The target, as a view.",
        "let replicas = ctx.resource.spec.replicas;"
    ),
    entry!(
        Ctx,
        "get$params",
        1,
        "ctx.params",
        "The policy's `params`, as a map.",
        "let threshold = ctx.params.threshold;"
    ),
    entry!(
        Ctx,
        "get$now",
        1,
        "ctx.now",
        "The time of the decision, in unix seconds.",
        "let age = ctx.now - parse_time(pod.metadata.creationTimestamp);"
    ),
    entry!(
        Ctx,
        "get$due",
        1,
        "ctx.due",
        "Whether a scheduled policy's run is due (any of its schedules fired).",
        "if ctx.due { /* start this run's Job */ }"
    ),
    entry!(
        Ctx,
        "get$fired",
        1,
        "ctx.fired",
        "The names of the policy's `schedules` that fired for this reconcile (empty with a single `schedule`).",
        "if \"nightly\" in ctx.fired { /* the nightly report */ }"
    ),
    entry!(
        Ctx,
        "get$next_run",
        1,
        "ctx.next_run",
        "When the schedule fires next (unix seconds), or `()`.",
        "let wait = ctx.next_run - ctx.now;"
    ),
    entry!(
        Ctx,
        "get$last_run",
        1,
        "ctx.last_run",
        "When the schedule fired last (unix seconds), or `()`.",
        "let since = ctx.last_run ?? 0;"
    ),
    entry!(
        Ctx,
        "get$run",
        1,
        "ctx.run",
        "The current run's id, from its fire time.",
        "let job_name = `bench-${ctx.run}`;"
    ),
    entry!(
        Ctx,
        "get$namespace",
        1,
        "ctx.namespace",
        "The namespace the target acts in: its own; a Namespace's own name; `\"\"` for a target of another cluster-scoped kind.",
        "let url = `postgres://db.${ctx.namespace}.svc:5432`;"
    ),
    entry!(
        Ctx,
        "get$policy",
        1,
        "ctx.policy",
        "`#{name, version}` of the policy deciding.",
        "let by = ctx.policy.name;"
    ),
    entry!(
        Ctx,
        "get$previous",
        1,
        "ctx.previous",
        "The fields the policy declares in `spec.previous` as its last decision that concluded saw them, shaped like the target (a value over 1 KiB is left out); `()` before its first.",
        "let was = ctx.previous?.spec?.replicas;"
    ),
    entry!(
        Ctx,
        "get$targets",
        1,
        "ctx.targets",
        "A sweep's (`spec.sweep: true`) targets: every object of its target kind it selects, in each namespace it acts in, sorted by namespace and name. An error in a policy that decides per target.",
        "let bare = ctx.targets.filter(|p| p.metadata.ownerReferences == ());"
    ),
    entry!(
        Ctx,
        "get$changed_at",
        1,
        "ctx.changed_at",
        "When a field declared in `spec.previous` last changed (unix seconds), as the decision that concluded on it saw; `()` before the first.",
        "let quiet_for = ctx.now - (ctx.changed_at ?? ctx.now);"
    ),
    entry!(
        Ctx,
        "changed",
        2,
        "ctx.changed(path)",
        "Whether a field declared in `spec.previous` differs from what the last concluded decision saw (true before the first); a path not declared is an error.",
        "if ctx.changed(\"metadata.labels\") { /* tell */ }"
    ),
    entry!(
        Ctx,
        "changed",
        1,
        "ctx.changed()",
        "The paths of `spec.previous` that changed since the last concluded decision (all of them before the first).",
        "for path in ctx.changed() { /* ... */ }"
    ),
    entry!(
        Lookups,
        "owned",
        2,
        "ctx.owned(kind)",
        "The policy's own children of a kind (its label and a controller ownerReference to the target), sorted by name.",
        "let maps = ctx.owned(\"ConfigMap\");"
    ),
    entry!(
        Lookups,
        "get",
        3,
        "ctx.get(kind, name)",
        "One object of the target's namespace, or `()`.",
        "let db = ctx.get(\"Pod\", \"web-1\");"
    ),
    entry!(
        Lookups,
        "list",
        2,
        "ctx.list(kind)",
        "Every object of a kind in the target's namespace, sorted by name.",
        "let pods = ctx.list(\"Pod\");"
    ),
    entry!(
        Lookups,
        "list",
        3,
        "ctx.list(kind, selector)",
        "Those whose labels match a selector (`#{app: \"web\"}` or `\"app=web,tier!=db\"`), from the label index.",
        "let web = ctx.list(\"Pod\", \"app=web\");"
    ),
    entry!(
        Lookups,
        "owned_by",
        3,
        "ctx.owned_by(kind, owner)",
        "Objects of a kind with an ownerReference to `owner`.",
        "let runs = ctx.owned_by(\"Pod\", job);"
    ),
    entry!(
        Lookups,
        "pods_of",
        2,
        "ctx.pods_of(obj)",
        "The pods a workload or Job selects (its `spec.selector`, else the pods it owns); needs Pods in `reads`.",
        "let serving = ctx.pods_of(ctx.resource);"
    ),
    entry!(
        Lookups,
        "metric",
        2,
        "ctx.metric(name)",
        "The reading of a metric the policy declares in `spec.metrics`: `#{value, at, samples}` (`at` in unix seconds; `samples`: how many series answered, `value` being the first's), or `()` when there is none (no data, a timeout, NaN, an error: `ctx.metric_error` says which). The runtime asks, at most once per query and period for every target, and decides again with it; the reading is kept in the decision record.",
        "let m = ctx.metric(\"accuracy\"); if m != () && m.value < 0.85 { /* roll back */ }"
    ),
    entry!(
        Lookups,
        "metric_error",
        2,
        "ctx.metric_error(name)",
        "Why a metric has no reading: `#{reason, message}` with `reason` one of `NoData`, `Timeout`, `NaN`, `Error`; `()` when it has a value.",
        "let why = ctx.metric_error(\"accuracy\");"
    ),
    entry!(
        Lookups,
        "allowed",
        2,
        "ctx.allowed(verb)",
        "Whether the policy's limits allow one more `\"rollback\"`, `\"delete\"`, `\"patch\"` or `\"apply\"` now.",
        "if ctx.allowed(\"rollback\") { /* roll back */ }"
    ),
    entry!(
        Lookups,
        "namespaces",
        1,
        "ctx.namespaces()",
        "The other namespaces the policy may make children in (`spec.namespaces`: its selector matches their labels, and they are not being deleted), sorted; empty without `spec.namespaces`.",
        "for ns in ctx.namespaces() { /* a copy in ns */ }"
    ),
    entry!(
        Helpers,
        "is_ready",
        1,
        "is_ready(obj)",
        "Whether an object is ready, as its kind says: a Pod's `Ready` condition; a Deployment's updated and available replicas, a StatefulSet's or ReplicaSet's ready ones (its generation observed); a Job succeeded; a VolumeSnapshot ready to use; a PersistentVolumeClaim bound.",
        "let up = is_ready(pod);"
    ),
    entry!(
        Helpers,
        "all_ready",
        1,
        "all_ready(objs)",
        "Whether every object of an array is ready (false for none).",
        "let up = all_ready(ctx.list(\"Pod\", \"app=web\"));"
    ),
    entry!(
        Helpers,
        "job_succeeded",
        1,
        "job_succeeded(job)",
        "Whether a Job has succeeded.",
        "if job_succeeded(job) { /* read its result */ }"
    ),
    entry!(
        Helpers,
        "job_failed",
        1,
        "job_failed(job)",
        "Whether a Job has failed.",
        "if job_failed(job) { /* alert */ }"
    ),
    entry!(
        Helpers,
        "condition_is",
        3,
        "condition_is(obj, type, status)",
        "Whether an object's condition `type` has `status`: `true`, `false`, or `\"True\"`, `\"False\"`, `\"Unknown\"`, as `condition` takes it.",
        "let ready = condition_is(pod, \"Ready\", true);"
    ),
    entry!(
        Helpers,
        "termination_message",
        1,
        "termination_message(pod)",
        "The first non-empty termination message of a pod's containers (their current state, then their last), or `()`.",
        "let result = termination_message(pod) ?? \"{}\";"
    ),
    entry!(
        Helpers,
        "revision_of",
        1,
        "revision_of(obj)",
        "The `deployment.kubernetes.io/revision` of a Deployment or ReplicaSet, as a number, or `()`.",
        "let revision = revision_of(ctx.resource);"
    ),
    entry!(
        Helpers,
        "labels_match",
        2,
        "labels_match(obj, selector)",
        "Whether an object's labels match a map of labels.",
        "let web = labels_match(pod, #{app: \"web\"});"
    ),
    entry!(
        Helpers,
        "parse_json",
        1,
        "parse_json(text)",
        "A value from JSON text; an error naming the fault otherwise.",
        "let score = parse_json(`{\"score\": 0.91}`).score;"
    ),
    entry!(
        Helpers,
        "to_json",
        1,
        "to_json(value)",
        "A value as compact JSON text.",
        "let text = to_json(#{score: 0.91});"
    ),
    entry!(
        Helpers,
        "hash",
        1,
        "hash(value)",
        "A short stable hash of a value's JSON.",
        "let h = hash(ctx.resource.spec.template);"
    ),
    entry!(
        Helpers,
        "child_name",
        2,
        "child_name(parent, suffix)",
        "`parent-suffix`, made to fit a child's name (63 characters) whatever the parent's length: a long parent is cut and a hash of it kept, so names stay distinct and the same parent always gets the same one.",
        "let job = child_name(ctx.resource.metadata.name, `eval-${hash(ctx.run)}`);"
    ),
    entry!(
        Helpers,
        "short_name",
        1,
        "short_name(text)",
        "`text` as it is when it fits 63 characters (a label value, a Service's name); otherwise cut, with a hash of the whole.",
        "let labels = #{ \"runbook.dev/model\": short_name(ctx.resource.metadata.name) };"
    ),
    entry!(
        Helpers,
        "duration",
        1,
        "duration(text)",
        "Seconds in a duration such as `\"90s\"`, `\"5m\"`, `\"1h30m\"`.",
        "let ttl = duration(\"1h30m\");"
    ),
    entry!(
        Helpers,
        "format_time",
        1,
        "format_time(secs)",
        "Unix seconds as RFC 3339 text.",
        "let when = format_time(ctx.now);"
    ),
    entry!(
        Helpers,
        "parse_time",
        1,
        "parse_time(text)",
        "RFC 3339 text as unix seconds; `()` for `()` or text that is not a time.",
        "let born = parse_time(pod.metadata.creationTimestamp);"
    ),
    entry!(
        Helpers,
        "to_map",
        1,
        "to_map(obj)",
        "A copy of a view (or a map) that the script can change.",
        "let labels = to_map(pod.metadata.labels); labels.tier = \"front\";"
    ),
    entry!(
        Views,
        "len",
        1,
        "obj.len()",
        "How many fields (or items) a view holds.",
        "let n = pod.metadata.labels.len();"
    ),
    entry!(
        Views,
        "is_empty",
        1,
        "obj.is_empty()",
        "Whether it holds none.",
        "let bare = pod.metadata.labels.is_empty();"
    ),
    entry!(
        Views,
        "contains",
        2,
        "obj.contains(key)",
        "Whether it has the field `key`.",
        "let tagged = pod.metadata.labels.contains(\"app\");"
    ),
    entry!(
        Views,
        "keys",
        1,
        "obj.keys()",
        "Its field names.",
        "let names = pod.metadata.labels.keys();"
    ),
    entry!(
        Views,
        "values",
        1,
        "obj.values()",
        "Its field values.",
        "let values = pod.metadata.labels.values();"
    ),
    entry!(
        Views,
        "to_string",
        1,
        "obj.to_string()",
        "Its JSON text (also what `${obj}` in a string gives); `()` made text is an error.",
        "let text = pod.metadata.labels.to_string();"
    ),
    entry!(
        Views,
        "to_debug",
        1,
        "obj.to_debug()",
        "The same, for `debug(obj)`.",
        "let text = pod.spec.to_debug();"
    ),
    entry!(
        Views,
        "==",
        2,
        "a == b",
        "Equal content (a view and a view, or a view and a map).",
        "let same = pod.metadata.labels == #{app: \"web\"};"
    ),
    entry!(
        Views,
        "!=",
        2,
        "a != b",
        "Different content.",
        "let moved = pod.metadata.labels != #{app: \"web\"};"
    ),
    entry!(
        Actions,
        "apply",
        1,
        "apply(obj)",
        "Server-side apply of an object the policy owns (labelled and owner-referenced for it).",
        "let a = apply(#{apiVersion: \"v1\", kind: \"ConfigMap\", metadata: #{name: \"web-settings\"}, data: #{level: \"info\"}});"
    ),
    entry!(
        Actions,
        "sync_children",
        2,
        "ctx.sync_children(want)",
        "The complete set of children the policy wants: an `apply` for each (in order), then a `delete` for each of its own children of the kinds it owns that `want` does not name, the highest name first. Terminating children are not deleted again.",
        "let actions = ctx.sync_children([#{apiVersion: \"v1\", kind: \"ConfigMap\", metadata: #{name: \"web-0\"}}]);"
    ),
    entry!(
        Actions,
        "sync_children",
        3,
        "ctx.sync_children(want, kinds)",
        "The same, deleting only children of `kinds` (an array of owned kinds).",
        "let actions = ctx.sync_children([], [\"ConfigMap\"]);"
    ),
    entry!(
        Actions,
        "delete",
        1,
        "delete(obj)",
        "Delete one of the policy's own children, or an object `spec.deletes` lets it delete (its target included, where it names the target's kind).",
        "let a = delete(pod);"
    ),
    entry!(
        Actions,
        "delete",
        2,
        "delete(kind, name)",
        "The same, by kind and name.",
        "let a = delete(\"Pod\", \"web-1\");"
    ),
    entry!(
        Actions,
        "patch",
        2,
        "patch(obj, merge_patch)",
        "Merge-patch an object of a kind the policy `mutates`.",
        "let a = patch(ctx.resource, #{spec: #{replicas: 2}});"
    ),
    entry!(
        Actions,
        "patch",
        3,
        "patch(kind, name, merge_patch)",
        "The same, by kind and name.",
        "let a = patch(\"Deployment\", \"web\", #{spec: #{paused: true}});"
    ),
    entry!(
        Actions,
        "status",
        1,
        "status(map)",
        "Fields of the target's status (those the policy declares), merged into it: maps merge key by key, and a field given `()` is removed, at any depth.",
        "let a = status(#{phase: \"Healthy\", timers: #{nightly: ()}});"
    ),
    entry!(
        Actions,
        "condition",
        4,
        "condition(type, status, reason, message)",
        "A condition of the target (`status` a bool or `\"True\"`/`\"False\"`/`\"Unknown\"`).",
        "let a = condition(\"Ready\", true, \"Benchmarked\", \"score 0.91\");"
    ),
    entry!(
        Actions,
        "rollback",
        1,
        "rollback(name)",
        "Roll the Deployment `name` (a mutated kind) back to its previous revision.",
        "let a = rollback(\"web\");"
    ),
    entry!(
        Actions,
        "rollback",
        2,
        "rollback(name, revision)",
        "Roll it back to a revision (`()`: the previous one).",
        "let a = rollback(\"web\", 3);"
    ),
    entry!(
        Actions,
        "alert",
        1,
        "alert(#{labels, annotations})",
        "Raise an alert, routed by the policy's AlertRoutes.",
        "let a = alert(#{labels: #{alertname: \"ModelDrift\", severity: \"critical\"}, annotations: #{summary: \"score below 0.85\"}});"
    ),
    entry!(
        Actions,
        "alert",
        2,
        "alert(severity, summary)",
        "The same, with a severity and a summary.",
        "let a = alert(\"warning\", \"the benchmark took twice as long\");"
    ),
    entry!(
        Actions,
        "event",
        3,
        "event(type, reason, message)",
        "A Kubernetes Event on the target (`\"Normal\"` or `\"Warning\"`).",
        "let a = event(\"Normal\", \"Benchmarked\", \"score 0.91\");"
    ),
    entry!(
        Actions,
        "get$verb",
        1,
        "action.verb",
        "What an action does (`\"apply\"`, `\"delete\"`, `\"rollback\"`, ...), as limits count it.",
        "let verb = delete(pod).verb;"
    ),
    entry!(
        Actions,
        "requeue",
        1,
        "requeue(after)",
        "Decide again after a duration (`\"30s\"`, or a number of seconds).",
        "let a = requeue(\"30s\");"
    ),
];

/// Names Rhai registers that are not functions a user calls: a view's
/// indexers (what `obj["key"]` and `obj.key` use).
const NOT_CALLED: &[&str] = &["index$get$", "index$set$"];

/// What the engine registers of Runbook's own (Rhai's standard functions
/// aside), as (name, arity).
pub fn registered(engine: &Engine) -> BTreeSet<(String, usize)> {
    engine
        .collect_fn_metadata(
            None,
            |f| Some((f.metadata.name.to_string(), f.metadata.num_params)),
            false,
        )
        .into_iter()
        .filter(|(name, _)| !NOT_CALLED.contains(&name.as_str()))
        .collect()
}

/// The reference, as Markdown.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Script functions\n\n\
         Every function Runbook gives a script, beside Rhai's own (strings, arrays, maps, \
         numbers: see the Rhai book). Generated by `runbook schema --functions` from the \
         table in `crates/core/src/script/reference.rs`, which a test holds to what the engine \
         registers; regenerate with\n\n    \
         cargo run -q -- schema --functions > docs/script-functions.md\n\n\
         Every example is run by that test, in a policy on a Deployment `web` with a \
         schedule, beside a ready Pod `pod` and a Job `job` that succeeded.\n",
    );
    for group in Group::ALL {
        out.push_str(&format!("\n## {}\n\n{}\n\n", group.title(), group.intro()));
        out.push_str("| call | what it does | example |\n|---|---|---|\n");
        for e in FUNCTIONS.iter().filter(|e| e.group == group) {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                e.call,
                e.text.replace('|', "\\|"),
                code_span(e.example).replace('|', "\\|")
            ));
        }
    }
    out
}

/// Text as Markdown code, with a longer fence when it holds backticks.
fn code_span(text: &str) -> String {
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

/// What every example may use beside `ctx` (a Deployment `web` in the
/// namespace `shop`, with a schedule `nightly`): `pod`, a ready Pod of
/// it, and `job`, a Job that succeeded.
pub const EXAMPLE_FIXTURES: &str =
    r#"let pod = ctx.get("Pod", "web-1"); let job = ctx.get("Job", "bench");"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_function_has_an_entry_and_every_entry_a_function() {
        let engine = crate::script::ScriptEngine::default();
        let registered = registered(engine.rhai());
        assert!(registered.len() > 40, "{registered:?}");
        let documented: BTreeSet<(String, usize)> = FUNCTIONS
            .iter()
            .map(|e| (e.name.to_string(), e.arity))
            .collect();
        let missing: Vec<_> = registered.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&registered).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "registered without an entry in crates/core/src/script/reference.rs: {missing:?}; \
             entries for nothing registered: {extra:?}"
        );
    }

    /// Every example runs, as the reference prints it, in a policy that
    /// declares what it uses: a renamed function, a changed argument
    /// form or a wrong example fails here.
    #[test]
    fn every_example_runs() {
        use crate::decide::{Observed, decide};
        use crate::observe::{MemoryView, ObjectView};
        use serde_json::json;
        use std::sync::Arc;

        const POLICY: &str = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: example}\nspec:\n  target: {apiVersion: apps/v1, kind: Deployment}\n  owns: [{apiVersion: v1, kind: ConfigMap}]\n  reads: [{apiVersion: v1, kind: Pod}, {apiVersion: batch/v1, kind: Job}]\n  mutates: [{apiVersion: apps/v1, kind: Deployment}]\n  deletes: [{apiVersion: v1, kind: Pod}]\n  schedules: [{name: nightly, cron: '0 3 * * *'}]\n  params: {threshold: 0.85}\n  previous: [metadata.labels, spec.replicas]\n  metrics: [{name: accuracy, prometheus: {address: 'http://prometheus:9090', query: 'avg(model_accuracy)'}}]\n  script: example.rhai\n";
        const SWEEP: &str = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: example}\nspec:\n  target: {apiVersion: v1, kind: Pod}\n  sweep: true\n  reads: [{apiVersion: batch/v1, kind: Job}, {apiVersion: apps/v1, kind: Deployment}]\n  deletes: [{apiVersion: v1, kind: Pod}]\n  schedule: {every: 1m}\n  params: {threshold: 0.85}\n  script: example.rhai\n";
        let view = MemoryView::new();
        let meta = |name: &str| {
            json!({"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
            "creationTimestamp": "2026-12-01T09:00:00Z", "labels": {"app": "web"}})
        };
        let target = view.insert(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web", "generation": 1,
                "creationTimestamp": "2026-12-01T09:00:00Z",
                "annotations": {"deployment.kubernetes.io/revision": "4"}},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}));
        view.insert(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta("web-1"),
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        view.insert(
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("bench"),
            "spec": {"template": {"spec": {"containers": []}}},
            "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}),
        );
        let view: Arc<dyn ObjectView> = Arc::new(view);
        let engine = crate::script::ScriptEngine::default();
        let mut failed = Vec::new();
        for e in FUNCTIONS {
            let script = format!(
                "fn reconcile(ctx) {{\n{EXAMPLE_FIXTURES}\n{}\n[]\n}}\n",
                e.example
            );
            // What only a sweep may read runs in one.
            let policy = if e.call == "ctx.targets" {
                SWEEP
            } else {
                POLICY
            };
            let loaded = crate::policy::compile::tests::load(&[
                ("example.yaml", policy),
                ("example.rhai", &script),
            ]);
            let Some(policy) = loaded.policies.first() else {
                failed.push(format!("{}: {:?}", e.call, loaded.errors));
                continue;
            };
            let observed = Observed {
                readings: Default::default(),
                target: target.clone(),
                view: view.clone(),
                now: "2026-12-02T03:00:05Z".parse().unwrap(),
            };
            if let Err(err) = decide(&engine, policy, &observed) {
                failed.push(format!("{}: {err}", e.call));
            }
        }
        assert!(
            failed.is_empty(),
            "examples that do not run:\n{}",
            failed.join("\n")
        );
    }
}
