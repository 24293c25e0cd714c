//! Bad input ends in a clear error naming the file and position: never a
//! panic, never a hang.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use common::*;
use runbook_bench::fixtures::{deployment, evaluator};
use runbook_core::policy::{self, Bundle, Origin};
use runbook_core::script::{ScriptEngine, ScriptErrorKind};

fn load_errors(files: &[(&str, &str)]) -> Vec<String> {
    let engine = ScriptEngine::default();
    let bundle = Bundle::new(
        Origin::Dir("pol".into()),
        files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let (_, errors) = policy::load(&engine, &[bundle]);
    errors.iter().map(|e| e.to_string()).collect()
}

const HEAD: &str = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\n";

fn script_policy(extra: &str) -> String {
    format!(
        "{HEAD}spec:\n  target: {{apiVersion: runbook.dev/v1alpha1, kind: Evaluator}}\n  owns: [{{apiVersion: batch/v1, kind: Job}}]\n  script: p.rhai\n{extra}"
    )
}

#[test]
fn malformed_yaml_names_file_line_and_column() {
    let errs = load_errors(&[(
        "p.yaml",
        &format!("{HEAD}spec:\n  target: {{apiVersion: v1, kind: X\n  script: p.rhai\n"),
    )]);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].starts_with("pol/p.yaml:6:"), "{}", errs[0]);
}

#[test]
fn a_missing_field_names_its_path() {
    let errs = load_errors(&[(
        "p.yaml",
        &format!("{HEAD}spec:\n  target:\n    apiVersion: v1\n  script: p.rhai\n"),
    )]);
    assert_eq!(errs, ["pol/p.yaml:6:5: spec.target: missing field `kind`"]);
}

#[test]
fn a_wrong_type_names_the_field() {
    let errs = load_errors(&[
        ("p.yaml", &script_policy("  priority: high\n")),
        ("p.rhai", "fn reconcile(ctx) { [] }"),
    ]);
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].starts_with("pol/p.yaml:8:13: spec.priority:"),
        "{}",
        errs[0]
    );
}

#[test]
fn an_unknown_field_is_an_error_not_silence() {
    let errs = load_errors(&[
        ("p.yaml", &script_policy("  shedule: {cron: '@hourly'}\n")),
        ("p.rhai", "fn reconcile(ctx) { [] }"),
    ]);
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].starts_with("pol/p.yaml:8:3:") && errs[0].contains("unknown field `shedule`"),
        "{}",
        errs[0]
    );
}

#[test]
fn a_missing_script_points_at_the_reference() {
    let errs = load_errors(&[("p.yaml", &script_policy(""))]);
    assert_eq!(
        errs,
        ["pol/p.yaml:7:11: spec.script: \"p.rhai\" is not in this bundle"]
    );
}

#[test]
fn a_script_syntax_error_names_script_line_and_column() {
    let errs = load_errors(&[
        ("p.yaml", &script_policy("")),
        ("p.rhai", "fn reconcile(ctx) {\n  let x = ;\n}\n"),
    ]);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].starts_with("pol/p.rhai:2:11:"), "{}", errs[0]);
}

#[test]
fn an_undefined_variable_is_caught_when_the_policy_loads() {
    let errs = load_errors(&[
        ("p.yaml", &script_policy("")),
        (
            "p.rhai",
            "fn reconcile(ctx) {\n  [status(#{ phase: phsae })]\n}\n",
        ),
    ]);
    assert!(
        errs[0].starts_with("pol/p.rhai:2:21:") && errs[0].contains("phsae"),
        "{errs:?}"
    );
}

#[test]
fn a_bad_schedule_and_a_bad_limit_are_load_errors() {
    let errs = load_errors(&[
        (
            "p.yaml",
            &script_policy("  schedule: {cron: '61 * * * *'}\n  limits: {rollback: 'once/6h'}\n"),
        ),
        ("p.rhai", "fn reconcile(ctx) { [] }"),
    ]);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs.iter()
            .any(|e| e.starts_with("pol/p.yaml:8:") && e.contains("spec.schedule"))
    );
    assert!(
        errs.iter()
            .any(|e| e.starts_with("pol/p.yaml:9:") && e.contains("spec.limits.rollback"))
    );
}

#[test]
fn a_step_template_of_an_undeclared_kind_is_refused_at_load() {
    let policy = format!(
        "{HEAD}spec:\n  target: {{apiVersion: runbook.dev/v1alpha1, kind: DatabaseBackup}}\n  owns: [{{apiVersion: batch/v1, kind: Job}}]\n  steps:\n    - name: leak\n      apply: {{template: secret.yaml}}\n"
    );
    let errs = load_errors(&[
        ("p.yaml", &policy),
        (
            "secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: '`${resource.metadata.name}`'\n",
        ),
    ]);
    assert_eq!(
        errs,
        [
            "pol/secret.yaml:2:7: step leak applies v1 Secret, which the policy does not declare in owns"
        ]
    );
}

#[test]
fn a_template_syntax_error_points_into_the_template() {
    let policy = format!(
        "{HEAD}spec:\n  target: {{apiVersion: runbook.dev/v1alpha1, kind: DatabaseBackup}}\n  owns: [{{apiVersion: batch/v1, kind: Job}}]\n  steps:\n    - name: dump\n      apply: {{template: job.yaml}}\n"
    );
    let errs = load_errors(&[
        ("p.yaml", &policy),
        (
            "job.yaml",
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: '`${resource.metadata.name + }-dump`'\n",
        ),
    ]);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].starts_with("pol/job.yaml:4:"), "{}", errs[0]);
}

// Runtime failures: the policy loads, the decision fails with a position.

fn runtime_world(script: &str) -> World {
    runtime_world_on(ScriptEngine::default(), script)
}

fn runtime_world_on(engine: ScriptEngine, script: &str) -> World {
    let yaml = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: runbook.dev/v1alpha1, kind: Evaluator}\n  owns: [{apiVersion: batch/v1, kind: Job}]\n  mutates: [{apiVersion: apps/v1, kind: Deployment}]\n  script: p.rhai\n";
    World::from_files_on(engine, &[("p.yaml", yaml), ("p.rhai", script)])
}

fn runtime_error(script: &str) -> runbook_core::script::ScriptError {
    runtime_error_on(ScriptEngine::default(), script)
}

/// An engine whose wall-clock budget is far above what a script needs
/// before the error a test looks for: on a loaded machine (a debug build
/// beside a real control plane on 2 cores) the 20 ms default can stop it
/// first.
fn unhurried() -> ScriptEngine {
    ScriptEngine::new(runbook_core::script::ScriptLimits {
        wall_time: std::time::Duration::from_secs(5),
        ..Default::default()
    })
}

fn runtime_error_on(engine: ScriptEngine, script: &str) -> runbook_core::script::ScriptError {
    let w = runtime_world_on(engine, script);
    w.add(deployment("chatbot", 1));
    match w.try_decide("p", &evaluator("chatbot", "chatbot", 0.9)) {
        Err(runbook_core::decide::DecideError::Script(e)) => e,
        other => panic!("expected a script error, got {other:?}"),
    }
}

#[test]
fn a_script_that_loops_forever_is_stopped_by_its_wall_clock_budget() {
    let e = runtime_error("fn reconcile(ctx) {\n  let n = 0;\n  loop { n += 1; }\n}\n");
    assert_eq!(e.kind, ScriptErrorKind::Timeout, "{e}");
    // Inside the loop that never ends (`n += 1`), not the function's header.
    assert!(e.to_string().starts_with("test/p.rhai:3:"), "{e}");
    assert!(e.pos.is_some_and(|p| p.col >= 10), "{e}");
    assert!(e.message.contains("wall-clock budget of 20ms"), "{e}");
}

#[test]
fn a_recursion_bomb_hits_the_call_depth_limit() {
    let e = runtime_error("fn boom(n) { boom(n + 1) }\nfn reconcile(ctx) {\n  boom(0)\n}\n");
    assert_eq!(e.kind, ScriptErrorKind::Limit, "{e}");
    assert!(e.message.contains("nested deeper"), "{e}");
    // Inside the function that recursed (`n`, read at the depth past
    // the limit), and how deep it went.
    assert!(e.to_string().starts_with("test/p.rhai:1:19:"), "{e}");
    assert!(e.message.starts_with("in boom (47 calls deep): "), "{e}");
}

#[test]
fn a_limit_hit_in_a_called_function_is_told_where_it_was_hit() {
    // Rhai moves the position of its own limit errors to the call site as
    // they leave each function; the error still names the expression, and
    // the functions it was in.
    let e = runtime_error(
        "fn reconcile(ctx) {\n  let a = 1;\n  wait(a)\n}\nfn wait(a) {\n  let n = 0;\n  while a > 0 {\n    n += a;\n  }\n}\n",
    );
    assert_eq!(e.kind, ScriptErrorKind::Timeout, "{e}");
    let at = e.pos.expect("a position");
    assert!((7..=8).contains(&at.line), "{e}");
    assert!(e.message.starts_with("in wait: stopped: ran past"), "{e}");
}

#[test]
fn a_hundred_megabyte_string_hits_the_size_limit() {
    let e = runtime_error(
        "// doubles\nfn reconcile(ctx) {\n  let s = \"x\";\n  while s.len() < 100000000 { s += s; }\n  []\n}\n",
    );
    assert_eq!(e.kind, ScriptErrorKind::Limit, "{e}");
    assert!(e.message.contains("string"), "{e}");
    // Rhai drops the position of its size errors as they leave a
    // function: the error names the function, not the top of the file.
    assert!(e.to_string().starts_with("test/p.rhai:2:1:"), "{e}");
    assert!(e.message.ends_with("(in fn reconcile)"), "{e}");
}

#[test]
fn returning_a_number_instead_of_actions_is_an_error_at_the_function() {
    let e = runtime_error("// header\nfn reconcile(ctx) {\n  42\n}\n");
    assert_eq!(e.kind, ScriptErrorKind::BadResult);
    assert_eq!(
        e.to_string(),
        "test/p.rhai:2:1: reconcile returned a i64 at position 0; want an array of actions such as apply(obj), status(map) or alert(map)"
    );
}

#[test]
fn an_unknown_action_is_an_error_naming_it_and_its_place() {
    // Found when the policy loads, not when the line runs.
    let errs = load_errors(&[
        ("p.yaml", &script_policy("")),
        (
            "p.rhai",
            "fn reconcile(ctx) {\n  if ctx.resource.spec.threshold > 2.0 { [frobnicate(ctx.resource)] } else { [statuss(#{ a: 1 })] }\n}\n",
        ),
    ]);
    assert_eq!(
        errs,
        [
            "pol/p.rhai:2:43: no function frobnicate exists: the script defines none, and it is not a helper or an action",
            "pol/p.rhai:2:79: no function statuss exists: the script defines none, and it is not a helper or an action (did you mean status?)",
        ]
    );
}

#[test]
fn an_action_on_an_undeclared_kind_is_refused_with_its_place() {
    let w = runtime_world(
        "fn reconcile(ctx) {\n  [apply(#{ apiVersion: \"v1\", kind: \"Secret\", metadata: #{ name: \"x\" } }),\n   status(#{ phase: \"ok\" })]\n}\n",
    );
    let d = w.decide("p", &evaluator("chatbot", "chatbot", 0.9));
    let refused: Vec<String> = d
        .refused()
        .filter_map(|p| p.refusal.as_ref().map(|r| r.to_string()))
        .collect();
    assert_eq!(
        refused,
        ["test/p.rhai:2:4: apply of v1 Secret refused: the policy does not declare it in owns"]
    );
    assert_eq!(d.allowed().count(), 1, "the status is still allowed");
}

#[test]
fn an_action_in_another_namespace_is_refused() {
    let w = runtime_world(
        "fn reconcile(ctx) {\n  [apply(#{ apiVersion: \"batch/v1\", kind: \"Job\", metadata: #{ name: \"x\", namespace: \"kube-system\" } })]\n}\n",
    );
    let d = w.decide("p", &evaluator("chatbot", "chatbot", 0.9));
    let r = d.refused().next().unwrap().refusal.clone().unwrap();
    assert!(
        matches!(&r.why, runbook_core::failure::Refused::OtherNamespace { namespace, .. } if namespace == "kube-system"),
        "{r:?}"
    );
    assert!(
        r.to_string().contains("only in its target's namespace"),
        "{r}"
    );
}

#[test]
fn reading_an_undeclared_kind_is_an_error() {
    // A kind named as a literal: when the policy loads, with what was meant.
    let errs = load_errors(&[
        ("p.yaml", &script_policy("")),
        (
            "p.rhai",
            "fn reconcile(ctx) {\n  ctx.list(\"Secret\");\n  ctx.owned(\"job\");\n  []\n}\n",
        ),
    ]);
    assert_eq!(
        errs,
        [
            "pol/p.rhai:2:12: kind Secret is not declared by this policy (declare it in owns, reads, mutates or deletes)",
            "pol/p.rhai:3:13: kind job is not declared by this policy (declare it in owns, reads, mutates or deletes) (did you mean \"Job\"?)",
        ]
    );
    // A kind made at run time: when the line runs.
    let e = runtime_error(
        "fn reconcile(ctx) {\n  let k = \"Sec\" + \"ret\";\n  ctx.list(k);\n  []\n}\n",
    );
    assert!(e.message.contains("kind Secret is not declared"), "{e}");
}

#[test]
fn a_template_that_interpolates_a_missing_field_names_its_place() {
    let policy = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: runbook.dev/v1alpha1, kind: Evaluator}\n  steps:\n    - name: publish\n      status:\n        url: '`s3://${resource.spec.bucket}/x`'\n";
    let w = World::from_files(&[("p.yaml", policy)]);
    let err = w
        .try_decide("p", &evaluator("chatbot", "chatbot", 0.9))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "test/p.yaml:9:36: .spec has no field `bucket`; if it may be absent, read it as `?.bucket`, \
         give a default with `?? value`, or ask first with `\"bucket\" in ...`"
    );
}

#[test]
fn a_misspelt_field_in_a_script_is_an_error_at_the_read_and_nothing_is_applied() {
    // Before strict reads, `treshold` read as `()` and the Job went out with
    // the argument `--min=`.
    let script = "fn reconcile(ctx) {\n  let ev = ctx.resource;\n  let job = #{ apiVersion: \"batch/v1\", kind: \"Job\", metadata: #{ name: \"x\" },\n    spec: #{ template: #{ spec: #{ containers: [#{ name: \"c\", image: \"b\", args: [`--min=${ev.spec.treshold}`] }] } } } };\n  [apply(job)]\n}\n";
    let e = runtime_error(script);
    assert_eq!(e.kind, ScriptErrorKind::Runtime, "{e}");
    assert!(e.to_string().starts_with("test/p.rhai:4:"), "{e}");
    assert!(
        e.message
            .contains(".spec has no field `treshold` (did you mean `threshold`?)"),
        "{e}"
    );
}

#[test]
fn nothing_interpolated_into_text_is_an_error_even_when_the_read_may_be_absent() {
    let script = "fn reconcile(ctx) {\n  let v = ctx.resource.spec?.version;\n  [status(#{ image: `postgres:${v}` })]\n}\n";
    let e = runtime_error(script);
    assert!(e.to_string().starts_with("test/p.rhai:3:"), "{e}");
    assert!(e.message.contains("was turned into text"), "{e}");
    // Said to be absent and given a default, it is fine.
    let w = runtime_world(
        "fn reconcile(ctx) {\n  let v = ctx.resource.spec?.version ?? \"16\";\n  [status(#{ image: `postgres:${v}` })]\n}\n",
    );
    w.add(deployment("chatbot", 1));
    let d = w.decide("p", &evaluator("chatbot", "chatbot", 0.9));
    assert_eq!(d.allowed().count(), 1);
}

#[test]
fn a_runaway_script_leaves_the_engine_usable_for_the_next_call() {
    let w = runtime_world(
        "fn reconcile(ctx) {\n  if ctx.resource.spec.threshold > 0.5 { loop {} }\n  [status(#{ phase: \"ok\" })]\n}\n",
    );
    assert!(w.try_decide("p", &evaluator("a", "chatbot", 0.9)).is_err());
    let d = w.decide("p", &evaluator("b", "chatbot", 0.1));
    assert_eq!(status_of(&d)["phase"], "ok");
}

const ROUTES_HEAD: &str =
    "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: default}\nspec:\n";

#[test]
fn bad_alert_routes_are_refused_at_load_with_positions() {
    let errs = load_errors(&[(
        "routes.yaml",
        &format!(
            "{ROUTES_HEAD}  route:\n    receiver: log\n    routes:\n      - matchers: ['team =~ \"(ml\"']\n        receiver: log\n      - receiver: pager\n  receivers:\n    - name: log\n      log: {{}}\n    - name: hook\n      webhook: {{url: \"ftp://example.com/x\"}}\n    - name: chat\n      slack: {{url: \"https://hooks.example.com/services/T0/B0/tok3n-abc\"}}\n"
        ),
    )]);
    let find = |needle: &str| {
        errs.iter()
            .find(|e| e.contains(needle))
            .unwrap_or_else(|| panic!("no error about {needle:?} in {errs:?}"))
            .clone()
    };
    assert!(
        find("invalid regex").starts_with("pol/routes.yaml:8:"),
        "{errs:?}"
    );
    assert!(
        find("receiver \"pager\" is not defined").starts_with("pol/routes.yaml:10:"),
        "{errs:?}"
    );
    assert!(
        find("is not an http(s) URL").starts_with("pol/routes.yaml:15:"),
        "{errs:?}"
    );
    let inline = find("receiver URLs come from Secrets");
    assert!(inline.starts_with("pol/routes.yaml:17:"), "{inline}");
    assert!(!inline.contains("tok3n"), "the URL is not echoed: {inline}");
}

#[test]
fn a_loopback_url_may_be_written_inline() {
    let errs = load_errors(&[(
        "routes.yaml",
        &format!(
            "{ROUTES_HEAD}  route:\n    receiver: hook\n  receivers:\n    - name: hook\n      webhook: {{url: \"http://127.0.0.1:9093/hook\"}}\n"
        ),
    )]);
    assert!(errs.is_empty(), "{errs:?}");
}

#[test]
fn objects_of_the_wrong_shape_are_refused_where_the_script_makes_them() {
    for (object, wanted) in [
        (
            r#"#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: "Chatbot_Eval" } }"#,
            "metadata.name \"Chatbot_Eval\" is not a valid name",
        ),
        (
            r#"#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: "x", annotations: #{ n: 3 } } }"#,
            "metadata.annotations.n must be a string, not a number",
        ),
        (
            r#"#{ apiVersion: "batch/v1/Job", kind: "Job", metadata: #{ name: "x" } }"#,
            "apiVersion \"batch/v1/Job\" is not GROUP/VERSION",
        ),
        (
            r#"#{ apiVersion: "v1", kind: "configmap", metadata: #{ name: "x" } }"#,
            "kind \"configmap\" is not a kind name",
        ),
    ] {
        let e = runtime_error(&format!("fn reconcile(ctx) {{\n  [apply({object})]\n}}\n"));
        assert!(e.to_string().starts_with("test/p.rhai:2:"), "{e}");
        assert!(e.message.contains(wanted), "want {wanted:?} in {e}");
    }
}

#[test]
fn status_outside_what_the_policy_declares_is_refused_with_its_place() {
    let yaml = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: runbook.dev/v1alpha1, kind: Evaluator}\n  script: p.rhai\n  status: {fields: [notes], conditions: [Noted]}\n";
    let script = "fn reconcile(ctx) {\n  [status(#{ notes: \"n\" }),\n   status(#{ phase: \"Healthy\", notes: \"m\" }),\n   condition(\"Noted\", true, \"Yes\", \"\"),\n   condition(\"Ready\", true, \"Yes\", \"\")]\n}\n";
    let w = World::from_files(&[("p.yaml", yaml), ("p.rhai", script)]);
    let d = w.decide("p", &evaluator("chatbot", "chatbot", 0.9));
    let refused: Vec<String> = d
        .refused()
        .filter_map(|p| p.refusal.as_ref().map(|r| r.to_string()))
        .collect();
    assert_eq!(
        refused,
        [
            "test/p.rhai:3:4: status of phase refused: the policy does not declare it in spec.status.fields",
            "test/p.rhai:5:4: condition Ready refused: the policy does not declare it in spec.status.conditions",
        ]
    );
    assert_eq!(d.allowed().count(), 2, "its own field and condition");
}

#[test]
fn declaring_what_runbook_keeps_itself_is_a_load_error() {
    let errs = load_errors(&[
        (
            "p.yaml",
            &script_policy(
                "  status:\n    fields: [phase, decisions, phase]\n    conditions: [Degraded]\n",
            ),
        ),
        ("p.rhai", "fn reconcile(ctx) { [] }"),
    ]);
    assert_eq!(
        errs,
        [
            "pol/p.yaml:9:21: spec.status.fields: Runbook keeps status.decisions itself; do not declare it",
            "pol/p.yaml:9:32: spec.status.fields: \"phase\" is declared twice",
            "pol/p.yaml:10:18: spec.status.conditions: Runbook sets Degraded itself when a decision goes wrong; do not declare it",
        ]
    );
}

#[test]
fn a_selector_is_a_label_selector_checked_where_it_is_written() {
    let errs = load_errors(&[
        (
            "p.yaml",
            &script_policy(
                "  selector:\n    matchLabels: {team: ml}\n    matchExpressions:\n      - {key: tier, operator: in, values: [gold]}\n      - {key: frozen, operator: Exists, values: [x]}\n",
            ),
        ),
        ("p.rhai", "fn reconcile(ctx) { [] }"),
    ]);
    assert_eq!(
        errs,
        [
            "pol/p.yaml:11:9: spec.selector.matchExpressions[0]: operator \"in\" is not one of In, NotIn, Exists, DoesNotExist",
            "pol/p.yaml:12:9: spec.selector.matchExpressions[1]: operator Exists takes no values",
        ]
    );
    // The plain label map of old is refused with its place.
    let errs = load_errors(&[
        ("p.yaml", &script_policy("  selector: {team: ml}\n")),
        ("p.rhai", "fn reconcile(ctx) { [] }"),
    ]);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("pol/p.yaml:8:") && errs[0].contains("unknown field `team`"),
        "{}",
        errs[0]
    );
}

/// A decision is capped in what it may do at once: past 100 Events, 1,000
/// actions or 256 KB of status it fails at the action that crossed the
/// cap, and nothing of it is done (3,000 `event()` calls made 3,000
/// Events; 65,536 actions took hundreds of MB).
#[test]
fn a_decision_past_its_caps_fails_at_the_action_that_crossed_them() {
    let e = runtime_error_on(
        unhurried(),
        "fn reconcile(ctx) {\n  let out = [];\n  for i in 0..3000 {\n    out.push(event(\"Normal\", \"Tick\", `tick ${i}`));\n  }\n  out\n}\n",
    );
    assert_eq!(e.kind, ScriptErrorKind::BadResult, "{e}");
    assert!(e.to_string().starts_with("test/p.rhai:4:14:"), "{e}");
    assert!(e.message.contains("more than 100 Events"), "{e}");
    let e = runtime_error_on(
        unhurried(),
        "fn reconcile(ctx) {\n  let out = [];\n  for i in 0..1500 {\n    out.push(status(#{ n: i }));\n  }\n  out\n}\n",
    );
    assert!(e.message.contains("more than 1000 actions"), "{e}");
    assert!(e.to_string().starts_with("test/p.rhai:4:"), "{e}");
    let e = runtime_error_on(
        unhurried(),
        "fn reconcile(ctx) {\n  let big = \"x\";\n  for i in 0..17 { big += big; }\n  [status(#{ a: big }), status(#{ b: big })]\n}\n",
    );
    assert!(
        e.message
            .contains("bytes of status fields, more than the 262144"),
        "{e}"
    );
    assert!(e.to_string().starts_with("test/p.rhai:4:25:"), "{e}");
    // Within the caps, the same shapes decide.
    let w = runtime_world(
        "fn reconcile(ctx) {\n  [event(\"Normal\", \"Tick\", \"one\"), status(#{ n: 1 })]\n}\n",
    );
    w.add(deployment("chatbot", 1));
    assert!(
        w.try_decide("p", &evaluator("chatbot", "chatbot", 0.9))
            .is_ok()
    );
}

#[test]
fn a_builtin_that_takes_the_budget_stops_the_call_in_its_statement() {
    let e = runtime_error(
        "fn reconcile(ctx) {\n  let a = [];\n  a.pad(100000, 0);\n  let found = false;\n  for i in 0..1000 {\n    found = a.contains(1);\n  }\n  []\n}\n",
    );
    assert_eq!(e.kind, ScriptErrorKind::Timeout, "{e}");
    assert!(e.to_string().starts_with("test/p.rhai:6:"), "{e}");
}

#[test]
fn a_lookup_that_takes_the_budget_is_named_when_time_runs_out() {
    use runbook_bench::lookup::{busy_pods, caches};
    // Every pod of a busy namespace, read cold: each one is parsed.
    let yaml = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: runbook.dev/v1alpha1, kind: Evaluator}\n  reads: [{apiVersion: v1, kind: Pod}]\n  script: p.rhai\n";
    let script = "fn count(ctx) {\n  let n = 0;\n  n += ctx.list(\"Pod\").len();\n  n\n}\nfn reconcile(ctx) {\n  let n = count(ctx);\n  []\n}\n";
    let w = World::from_files(&[("p.yaml", yaml), ("p.rhai", script)]);
    let ev = evaluator("chatbot", "chatbot", 0.9);
    let observed = runbook_core::decide::Observed {
        readings: Default::default(),
        target: runbook_core::observe::CachedObject::new(ev),
        view: std::sync::Arc::new(caches(busy_pods(5_000).collect::<Vec<_>>())),
        now: w.now,
    };
    let e = match runbook_core::decide::decide(&w.engine, &w.set.policies["p"], &observed) {
        Err(runbook_core::decide::DecideError::Script(e)) => e,
        other => panic!("expected the lookup to run out of time, got {other:?}"),
    };
    assert_eq!(e.kind, ScriptErrorKind::Timeout, "{e}");
    // The lookup that took the time, in the function that made it.
    assert!(e.to_string().starts_with("test/p.rhai:3:"), "{e}");
    assert!(e.message.starts_with("in count: "), "{e}");
    assert!(e.message.contains("; this call took "), "{e}");
}

/// `runbook simulate ... | head -1`: the reader goes after one line and
/// the command ends quietly, as `cat` would, not with a panic.
#[cfg(unix)]
#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for args in [
        vec!["simulate", "examples/evaluator-drift", "-o", "json"],
        vec!["crds"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_runbook"))
            .args(&args)
            .current_dir(root)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty(), "{args:?} printed nothing");
        // The reader is gone; what is left to print meets a closed pipe.
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
}
