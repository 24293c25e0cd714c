//! `runbook simulate` and `runbook test`: the shipped scenarios pass, runs
//! are byte-identical, and bad scenarios fail with positions before they
//! run while the other scenarios still run.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn runbook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh directory holding `files`.
fn dir_with(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("runbook-scenario-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (f, body) in files {
        let p = dir.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    dir
}

#[test]
fn the_shipped_scenarios_pass() {
    let out = runbook(&["test", "policies/", "examples/"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains(" 0 failed"), "{t}");
    for name in [
        "evaluator rolls back a release whose score drops",
        "backup dumps, then snapshots, then publishes, in that order",
        "a model is served, upgraded, and a failing weights download is reported",
        "a week of hourly evaluations with one bad release",
        "a clustered database starts member by member, then backs up",
        "scheduled backups run hourly and keep the newest two runs",
    ] {
        assert!(t.contains(&format!("ok    {name}")), "{name} missing:\n{t}");
    }
}

#[test]
fn the_same_scenario_gives_byte_identical_output() {
    for args in [
        [
            "simulate",
            "policies/scenarios/evaluator-rollback.yaml",
            "-o",
            "json",
        ],
        [
            "simulate",
            "policies/scenarios/backup-ordering.yaml",
            "-o",
            "text",
        ],
        // Objects the scenario makes carry an authorship record, and
        // each decision's inputs hash covers it and the object's uid.
        ["simulate", "examples/monitor-pods", "-o", "json"],
        ["simulate", "examples/secret-copier", "-o", "json"],
    ] {
        let a = runbook(&args);
        let b = runbook(&args);
        assert!(a.status.success(), "{}", text(&a));
        assert!(!a.stdout.is_empty());
        assert_eq!(a.stdout, b.stdout, "two runs of {args:?} differ");
    }
}

#[test]
fn the_timeline_names_each_action_and_its_object() {
    let out = runbook(&["simulate", "policies/scenarios/evaluator-rollback.yaml"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let line = |start: &str, rest: &str| {
        t.lines()
            .any(|l| l.trim_start().starts_with(start) && l.contains(rest))
    };
    assert!(
        line("+1m00s  apply", "batch/v1 Job default/chatbot-eval-"),
        "{t}"
    );
    assert!(
        line(
            "+1h05m  rollback",
            "apps/v1 Deployment default/chatbot  revision 4 -> 3"
        ),
        "{t}"
    );
    let json = runbook(&[
        "simulate",
        "policies/scenarios/evaluator-rollback.yaml",
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["passed"], true);
    let rollbacks: Vec<&serde_json::Value> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "rollback")
        .collect();
    assert_eq!(rollbacks.len(), 1, "exactly one rollback: {rollbacks:?}");
    assert_eq!(rollbacks[0]["offset"], "+1h05m");
    assert_eq!(rollbacks[0]["fields"]["toRevision"], 3);
}

const SCENARIO_HEAD: &str = "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata:
  name: NAME
spec:
  policies: POLICIES
  objects: [OBJECTS]
  start: \"2026-11-29T10:00:00Z\"
  until: 2h
";

fn scenario(name: &str, objects: &str, rest: &str) -> String {
    SCENARIO_HEAD
        .replace("NAME", name)
        .replace("POLICIES", &repo().join("policies").display().to_string())
        .replace("OBJECTS", objects)
        + rest
}

/// A fresh directory holding the chatbot Deployment and Evaluator.
fn chatbot_dir(name: &str) -> PathBuf {
    let dir = dir_with(name, &[]);
    std::fs::create_dir_all(&dir).unwrap();
    chatbot_objects(&dir);
    dir
}

fn chatbot_objects(dir: &Path) {
    for f in ["chatbot-deployment.yaml", "chatbot-evaluator.yaml"] {
        std::fs::copy(repo().join("policies/scenarios").join(f), dir.join(f)).unwrap();
    }
}

#[test]
fn a_missing_file_an_unknown_event_or_kind_fails_before_running() {
    let dir = dir_with(
        "bad",
        &[
            (
                "missing.yaml",
                &scenario("missing", "nowhere.yaml", "  timeline: []\n"),
            ),
            (
                "event.yaml",
                &scenario(
                    "event",
                    "chatbot-deployment.yaml",
                    "  timeline:\n    - at: 1m\n      world:\n        - explode: {kind: Deployment, name: chatbot}\n",
                ),
            ),
            (
                "kind.yaml",
                &scenario(
                    "kind",
                    "chatbot-deployment.yaml",
                    "  timeline:\n    - at: 1m\n      expect:\n        - {action: apply, kind: Jbo, name: x}\n",
                ),
            ),
            (
                // A fault that could never fire: the scenario would pass
                // without the failure it is about.
                "verb.yaml",
                &scenario(
                    "verb",
                    "chatbot-deployment.yaml",
                    "  timeline:\n    - at: 1m\n      world:\n        - fail: {verb: apply}\n",
                ),
            ),
            (
                "resource.yaml",
                &scenario(
                    "resource",
                    "chatbot-deployment.yaml",
                    "  timeline:\n    - at: 1m\n      world:\n        - fail: {verb: patch, resource: Job}\n",
                ),
            ),
            (
                // A user's own kind whose CRD the timeline creates: too late
                // for the kinds the scenario is checked against.
                "late.yaml",
                &scenario(
                    "late",
                    "chatbot-deployment.yaml",
                    "  timeline:\n    - at: 0s\n      world:\n        - create:\n            object: {apiVersion: apiextensions.k8s.io/v1, kind: CustomResourceDefinition, metadata: {name: widgetries.acme.io}, spec: {group: acme.io, scope: Cluster, names: {kind: Widgetry, plural: widgetries}, versions: [{name: v1, served: true, storage: true}]}}\n      expect:\n        - {action: status, kind: Widgetry, name: w1}\n",
                ),
            ),
        ],
    );
    chatbot_objects(&dir);
    for (file, line, words) in [
        ("missing.yaml", 7, "nowhere.yaml"),
        ("event.yaml", 13, "explode"),
        (
            "kind.yaml",
            13,
            "\"Jbo\": the sandbox serves no such kind (did you mean Job?)",
        ),
        (
            "verb.yaml",
            13,
            "unknown verb \"apply\" (a server-side apply is a patch); the API's verbs are get, list",
        ),
        (
            "resource.yaml",
            13,
            "no resource \"Job\" is served (did you mean jobs?)",
        ),
        (
            "late.yaml",
            16,
            "CustomResourceDefinition widgetries.acme.io is created in the timeline (line 13)",
        ),
    ] {
        let path = dir.join(file);
        let out = runbook(&["simulate", path.to_str().unwrap()]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{t}");
        let want = format!("{}:{line}:", path.display());
        assert!(t.contains(&want), "want {want} in:\n{t}");
        assert!(t.contains(words), "want {words} in:\n{t}");
        // A timeline line (`  +1m  apply ...`) would mean it ran.
        assert!(
            !t.lines().any(|l| l.trim_start().starts_with('+')),
            "a bad scenario must not run:\n{t}"
        );
    }
}

#[test]
fn a_policy_that_throws_fails_its_scenario_and_the_others_run() {
    let policies = dir_with(
        "throws-policies",
        &[
            (
                "noisy.yaml",
                "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata:
  name: noisy
spec:
  target: {apiVersion: v1, kind: ConfigMap}
  selector: {matchLabels: {watched: \"yes\"}}
  owns: [{apiVersion: batch/v1, kind: Job}]
  script: noisy.rhai
",
            ),
            (
                "noisy.rhai",
                "fn reconcile(ctx) {
    let size = parse_int(ctx.resource.data.size);
    if size > 3 {
        throw `size ${size} is too big`;
    }
    [status(#{ size: size })]
}
",
            ),
        ],
    );
    let cm = |size: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: box, labels: {{watched: \"yes\"}}}}\ndata: {{size: \"{size}\"}}\n"
        )
    };
    let head = |name: &str| {
        SCENARIO_HEAD
            .replace("NAME", name)
            .replace("POLICIES", &policies.display().to_string())
            .replace("OBJECTS", "")
    };
    let dir = dir_with(
        "throws",
        &[
            ("small.yaml", &cm("2")),
            ("big.yaml", &cm("9")),
            (
                "a-throws.yaml",
                &(head("throws")
                    + "  timeline:\n    - at: 1m\n      world:\n        - create: {file: big.yaml}\n      expect:\n        - {action: status, kind: ConfigMap, fields: {size: 9}}\n        - {action: status, kind: ConfigMap, fields: {size: 10}}\n"),
            ),
            (
                "b-fine.yaml",
                &(head("fine")
                    + "  timeline:\n    - at: 1m\n      world:\n        - create: {file: small.yaml}\n      expect:\n        - {none: apply}\n"),
            ),
        ],
    );
    let out = runbook(&["test", dir.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("FAIL  throws"), "{t}");
    assert!(
        t.contains("ok    fine"),
        "the other scenario still runs:\n{t}"
    );
    // The script position of the throw.
    assert!(
        t.contains("noisy.rhai:4:"),
        "want the script position in:\n{t}"
    );
    assert!(t.contains("size 9 is too big"), "{t}");
    assert!(t.contains("2 scenarios: 1 passed, 1 failed"), "{t}");
    // The root cause comes first, once, then what the expectations saw.
    let cause = t.find("cause: ").expect("a root cause line");
    let diff = t
        .find("want at least one status")
        .expect("an expectation diff");
    assert!(cause < diff, "the cause first:\n{t}");
    assert!(
        t[cause..]
            .lines()
            .next()
            .unwrap()
            .contains("size 9 is too big"),
        "{t}"
    );
    assert_eq!(t.matches("size 9 is too big").count(), 1, "once:\n{t}");
}

#[test]
fn a_failed_expectation_shows_what_was_wanted_and_what_happened() {
    let dir = chatbot_dir("diff");
    let s = scenario(
        "wrong revision",
        "chatbot-deployment.yaml",
        "  timeline:
    - at: 1m
      world:
        - create: {file: chatbot-evaluator.yaml}
      expect:
        - {action: apply, kind: Job, name: \"chatbot-eval-*\", fields: {metadata: {annotations: {runbook.dev/revision: \"9\"}}}}
",
    );
    std::fs::write(dir.join("s.yaml"), s).unwrap();
    let out = runbook(&["test", dir.join("s.yaml").to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("s.yaml:15:"), "the expectation's position:\n{t}");
    assert!(t.contains("\"9\""), "what was wanted:\n{t}");
    assert!(
        t.contains("saw") && t.contains("apply    batch/v1 Job default/chatbot-eval-"),
        "what happened instead:\n{t}"
    );
}

#[test]
fn api_faults_are_retried_and_nothing_is_done_twice() {
    let dir = chatbot_dir("faults");
    let s = scenario(
        "faults",
        "chatbot-deployment.yaml",
        "  timeline:
    - at: 1m
      world:
        - fail: {verb: patch, resource: jobs, code: 503, count: 3}
        - create: {file: chatbot-evaluator.yaml}
      expect:
        - {action: apply, kind: Job, name: \"chatbot-eval-*\", result: failed}
        - {action: apply, kind: Job, name: \"chatbot-eval-*\", result: ok, count: 1}
        - {action: status, kind: Evaluator, fields: {phase: Running}}
    - at: 30m
      expect:
        - {none: apply}
",
    )
    .replace("until: 2h", "until: 50m");
    std::fs::write(dir.join("s.yaml"), s).unwrap();
    let out = runbook(&["test", dir.join("s.yaml").to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
}

/// A status write the API refuses is in the timeline as failed, with why;
/// and the status of a decision whose action failed is shown as written:
/// its conditions and record, not the fields the decision meant to set.
#[test]
fn a_failed_status_write_and_a_failed_decisions_status_are_shown_as_they_were() {
    let dir = chatbot_dir("status-fault");
    let s = scenario(
        "status-fault",
        "chatbot-deployment.yaml",
        "  timeline:
    - at: 1m
      world:
        - fail: {verb: patch, resource: jobs, code: 503, count: 1}
        - fail: {verb: patch, resource: evaluators/status, code: 503, count: 1}
        - create: {file: chatbot-evaluator.yaml}
      expect:
        - {action: apply, kind: Job, result: failed}
        - {action: status, kind: Evaluator, result: failed}
        - {action: status, kind: Evaluator, fields: {phase: Running}}
",
    )
    .replace("until: 2h", "until: 10m");
    let file = dir.join("s.yaml");
    std::fs::write(&file, s).unwrap();
    let out = runbook(&["simulate", file.to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("status   runbook.dev/v1alpha1 Evaluator default/chatbot  [failed] writing the status of"),
        "{t}"
    );
    let out = runbook(&["simulate", file.to_str().unwrap(), "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entries = v["entries"]
        .as_array()
        .or_else(|| v[0]["entries"].as_array())
        .expect("entries");
    let status: Vec<&serde_json::Value> =
        entries.iter().filter(|e| e["action"] == "status").collect();
    // The first decision's apply failed: neither its failed write nor the
    // retry of its record carries phase Running; the one after the
    // successful apply does.
    let phases: Vec<(&str, Option<&str>)> = status
        .iter()
        .map(|e| (e["result"].as_str().unwrap(), e["fields"]["phase"].as_str()))
        .collect();
    assert_eq!(phases.first(), Some(&("failed", None)), "{phases:?}");
    assert_eq!(phases.last(), Some(&("ok", Some("Running"))), "{phases:?}");
}

/// A user's own cluster-scoped kind has no namespace to keep a child in:
/// the apply is refused with why, not sent without a namespace (the API
/// answered 404 and it was retried for ever), and the rest of the
/// decision is carried out.
#[test]
fn a_namespaced_child_of_a_cluster_scoped_target_is_refused_not_sent() {
    let dir = dir_with(
        "cluster-scoped",
        &[
            (
                "crd.yaml",
                "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgetries.acme.io}
spec:
  group: acme.io
  scope: Cluster
  names: {kind: Widgetry, plural: widgetries}
  versions:
    - {name: v1, served: true, storage: true, subresources: {status: {}}, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
",
            ),
            (
                "pol/widgets.yaml",
                "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: widgets}
spec:
  target: {apiVersion: acme.io/v1, kind: Widgetry}
  owns: [{apiVersion: v1, kind: ConfigMap}]
  script: widgets.rhai
",
            ),
            (
                "pol/widgets.rhai",
                "fn reconcile(ctx) {
    [apply(#{ apiVersion: \"v1\", kind: \"ConfigMap\", metadata: #{ name: ctx.resource.metadata.name }, data: #{ a: \"b\" } }),
     status(#{ phase: \"Ready\" })]
}
",
            ),
            (
                "s.yaml",
                "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata: {name: cluster-scoped}
spec:
  policies: pol
  objects: [crd.yaml]
  start: \"2026-11-29T09:00:00Z\"
  until: 10m
  timeline:
    - at: 0s
      world:
        - create:
            object: {apiVersion: acme.io/v1, kind: Widgetry, metadata: {name: w1}, spec: {size: 2}}
      expect:
        - {action: refusal, kind: ConfigMap, name: w1}
        - {none: apply}
        - {action: status, kind: Widgetry, name: w1, fields: {phase: Ready}}
",
            ),
        ],
    );
    let out = runbook(&["simulate", dir.join("s.yaml").to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(
            "apply of v1 ConfigMap refused: it is namespaced and the target is cluster-scoped"
        ),
        "{t}"
    );
}

#[test]
fn simulate_fails_when_an_expectation_fails() {
    let dir = dir_with(
        "unmet",
        &[(
            "unmet.yaml",
            &scenario(
                "unmet",
                "chatbot-deployment.yaml",
                "  timeline:\n    - at: 1m\n      expect:\n        - {action: rollback, kind: Deployment, name: chatbot}\n",
            ),
        )],
    );
    chatbot_objects(&dir);
    let path = dir.join("unmet.yaml");
    for command in ["simulate", "test"] {
        let out = runbook(&[command, path.to_str().unwrap()]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{command}: {t}");
        assert!(
            t.contains("rollback"),
            "{command} names the expectation: {t}"
        );
    }
}

#[test]
fn a_scenario_past_its_wall_clock_limit_fails_instead_of_hanging() {
    let out = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(["test", "examples/evaluator-drift/week.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUNBOOK_SCENARIO_TIMEOUT", "0")
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("did not finish within 0s of wall-clock time"),
        "{t}"
    );
}

/// The README's main command fits on a screen: the healthy hours folded
/// into a line each with their count, the rollback shown line by line,
/// and a closing summary; `--full` shows every line.
#[test]
fn the_week_fits_on_a_screen_with_the_rollback_and_a_summary() {
    let out = runbook(&["simulate", "examples/evaluator-drift"]);
    assert!(out.status.success(), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines.len() <= 50, "{} lines:\n{t}", lines.len());
    assert!(
        lines
            .iter()
            .any(|l| l.contains("rollback apps/v1 Deployment default/chatbot  revision 2 -> 1")),
        "{t}"
    );
    let folded: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains(" cycles, one every 1h00m: "))
        .collect();
    assert!(!folded.is_empty(), "{t}");
    assert!(
        folded
            .iter()
            .all(|l| l.ends_with("lastScore=0.91 phase=Healthy")),
        "{folded:?}"
    );
    let summary = t.find("summary: ").expect("a summary");
    let tail = &t[summary..];
    assert!(
        tail.starts_with("summary: 13 expectations held, 0 failed"),
        "{tail}"
    );
    assert!(tail.contains("rollback Deployment 1"), "{tail}");
    assert!(tail.contains("alerts: 1 fired, 1 resolved"), "{tail}");
    let full = runbook(&["simulate", "examples/evaluator-drift", "--full"]);
    let full = String::from_utf8_lossy(&full.stdout).into_owned();
    // Each of the week's 169 runs is an apply, a Job finishing, a delete
    // and two status writes: every one a line of its own with --full.
    assert!(full.lines().count() > 169 * 4, "every line with --full");
    assert!(!full.contains(" cycles"), "nothing folded with --full");
}

/// World `delete` and `update` take a glob as `complete` does; a glob
/// that matches nothing is an error naming it.
#[test]
fn world_events_take_globs_alike() {
    let dir = dir_with(
        "globs",
        &[
            (
                "a-globs.yaml",
                &scenario(
                    "globs",
                    "chatbot-deployment.yaml, chatbot-evaluator.yaml",
                    "  rules:\n    - {kind: Job, name: chatbot-eval-*, after: 5m, complete: {terminationMessage: '{\"score\": 0.91}'}}\n  timeline:\n    - at: 10m\n      world:\n        - update: {kind: Job, name: chatbot-eval-*, patch: {metadata: {labels: {seen: \"yes\"}}}}\n    - at: 11m\n      world:\n        - delete: {kind: Job, name: chatbot-eval-*}\n  final:\n    - {kind: Job, name: chatbot-eval-*, absent: true}\n",
                )
                // Ends before the next hourly run makes a new Job.
                .replace("until: 2h", "until: 30m"),
            ),
            (
                "b-none.yaml",
                &scenario(
                    "none",
                    "chatbot-deployment.yaml, chatbot-evaluator.yaml",
                    "  timeline:\n    - at: 10m\n      world:\n        - delete: {kind: Job, name: nothing-*}\n",
                ),
            ),
        ],
    );
    chatbot_objects(&dir);
    let out = runbook(&["test", dir.to_str().unwrap()]);
    let t = text(&out);
    assert!(t.contains("ok    globs"), "{t}");
    assert!(t.contains("FAIL  none"), "{t}");
    assert!(
        t.contains("delete Job default/nothing-*: no object matches"),
        "{t}"
    );
    let sim = runbook(&[
        "simulate",
        dir.join("a-globs.yaml").to_str().unwrap(),
        "--full",
    ]);
    let s = text(&sim);
    assert!(s.contains("updated Job chatbot-eval-"), "{s}");
}

/// Every write a decision makes changes something a reader can see: in no
/// shipped scenario does a target get a second status write at the same
/// instant saying what the first said, or a child the same object applied
/// again (unless it was deleted in between).
#[test]
fn no_shipped_scenario_writes_what_it_has_just_written() {
    let mut files = Vec::new();
    for dir in ["policies", "examples"] {
        files.extend(runbook_simulator::find(&repo().join(dir)).unwrap());
    }
    assert!(files.len() >= 14, "{files:?}");
    let mut wasted = Vec::new();
    for f in &files {
        let r = runbook_simulator::run_file(f);
        assert!(r.passed(), "{}: {}", f.display(), r.summary());
        let mut last_status: std::collections::HashMap<_, (jiff::Timestamp, serde_json::Value)> =
            Default::default();
        let mut last_apply: std::collections::HashMap<_, serde_json::Value> = Default::default();
        for e in r.entries.iter().filter(|e| e.result == "ok") {
            let key = (
                e.kind.clone(),
                e.namespace.clone(),
                e.name.clone(),
                e.policy.clone(),
            );
            match e.action.as_str() {
                "status" => {
                    if let Some((t, prev)) = last_status.get(&key)
                        && *t == e.time
                        && e.fields
                            .as_object()
                            .is_some_and(|m| m.iter().all(|(k, v)| prev.get(k) == Some(v)))
                    {
                        wasted.push(format!("{}: {}", f.display(), r.line(e)));
                    }
                    last_status.insert(key, (e.time, e.fields.clone()));
                }
                "apply" => {
                    if last_apply.get(&key) == Some(&e.fields) {
                        wasted.push(format!("{}: {} (again)", f.display(), r.line(e)));
                    }
                    last_apply.insert(key, e.fields.clone());
                }
                // Deleted: applying it again makes it anew.
                "delete" => {
                    last_apply.remove(&key);
                }
                // The world deleted or edited it (by hand): an apply
                // after that puts it back.
                "world" => {
                    last_apply.retain(|(kind, _, name, _), _| {
                        e.detail != format!("deleted {kind} {name}")
                            && !e.detail.starts_with(&format!("updated {kind} {name}:"))
                    });
                }
                _ => {}
            }
        }
    }
    assert!(wasted.is_empty(), "\n{}\n", wasted.join("\n"));
}

/// A policy set aside for a kind the sandbox does not serve does nothing;
/// when an expectation then fails, that is the first cause named.
#[test]
fn a_set_aside_policy_is_the_first_cause_of_its_failed_scenario() {
    let dir = dir_with(
        "set-aside",
        &[
            (
                "pol/p.yaml",
                "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: widgets}\nspec:\n  target: {apiVersion: runbook.dev/v1alpha1, kind: Evaluator}\n  owns: [{apiVersion: example.com/v1, kind: Widget}]\n  script: p.rhai\n",
            ),
            ("pol/p.rhai", "fn reconcile(ctx) { [] }\n"),
            (
                "s.yaml",
                "apiVersion: runbook.dev/v1alpha1\nkind: Scenario\nmetadata: {name: set aside}\nspec:\n  policies: pol\n  timeline:\n  - at: 1m\n    expect: [{action: apply}]\n",
            ),
        ],
    );
    let out = runbook(&["test", dir.join("s.yaml").to_str().unwrap()]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    let cause = t.find("cause: policy widgets (").expect(&t);
    assert!(
        t[cause..].contains("was set aside: the sandbox does not serve example.com/v1 Widget"),
        "{t}"
    );
    assert!(cause < t.find("want at least one apply").expect(&t), "{t}");
}

/// A CRD of `Hoard`s: a status subresource, any fields.
const HOARD_CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: hoards.acme.io}
spec:
  group: acme.io
  scope: Namespaced
  names: {kind: Hoard, plural: hoards, singular: hoard}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
";

/// A field given `()` in `status(map)` is removed from the status, at
/// any depth, on a custom resource (its status) and on a built-in kind
/// (its RunbookState) alike; the rest of the map stays.
#[test]
fn a_field_given_unit_is_removed_from_a_status_map() {
    let script = "fn reconcile(ctx) {
    if ctx.resource?.metadata?.labels?.drop == \"yes\" {
        [status(#{ timers: #{ nightly: () } })]
    } else {
        [status(#{ timers: #{ nightly: 1, hourly: 2 } })]
    }
}
";
    let policy = |name: &str, target: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: {name}}}\nspec:\n  target: {target}\n  status: {{fields: [timers], conditions: []}}\n  script: {name}.rhai\n"
        )
    };
    let objects = [
        HOARD_CRD,
        "---
apiVersion: acme.io/v1
kind: Hoard
metadata: {name: h1, namespace: default}
spec: {}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c1, namespace: default}
data: {x: \"1\"}
",
    ]
    .concat();
    let scenario = "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata: {name: a status key removed}
spec:
  policies: pol
  objects: [objects.yaml]
  start: \"2026-11-29T09:00:00Z\"
  until: 5m
  timeline:
    - at: 1m
      world:
        - update: {kind: Hoard, name: h1, patch: {metadata: {labels: {drop: \"yes\"}}}}
        - update: {kind: ConfigMap, name: c1, patch: {metadata: {labels: {drop: \"yes\"}}}}
  final:
    - {kind: Hoard, name: h1, fields: {status: {timers: {nightly: null, hourly: 2}}}}
    - {kind: RunbookState, name: configmap.c1, fields: {status: {fields: {timers: {nightly: null, hourly: 2}}}}}
";
    let dir = dir_with(
        "unset",
        &[
            ("objects.yaml", &objects),
            (
                "pol/hoards.yaml",
                &policy("hoards", "{apiVersion: acme.io/v1, kind: Hoard}"),
            ),
            ("pol/hoards.rhai", script),
            (
                "pol/maps.yaml",
                &policy("maps", "{apiVersion: v1, kind: ConfigMap}"),
            ),
            ("pol/maps.rhai", script),
            ("s.yaml", scenario),
        ],
    );
    let out = runbook(&["test", dir.join("s.yaml").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
}

/// A scenario directory: a `Hoard` CRD (status subresource, any fields),
/// a policy `hoard` running `script` on it, and `s.yaml` creating Hoard
/// `h1` at once, with `world` (more world events, indented as list items)
/// and `expect` (expectations, the same) at that moment.
fn hoard(name: &str, script: &str, world: &str, expect: &str) -> PathBuf {
    let scenario = format!(
        "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata: {{name: {name}}}
spec:
  policies: pol
  objects: [crd.yaml]
  start: \"2026-11-29T09:00:00Z\"
  until: 1m
  timeline:
    - at: 0s
      world:
{world}        - create:
            object: {{apiVersion: acme.io/v1, kind: Hoard, metadata: {{name: h1}}, spec: {{}}}}
      expect:
{expect}"
    );
    let dir = dir_with(
        name,
        &[
            ("crd.yaml", HOARD_CRD),
            (
                "pol/hoard.yaml",
                "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: hoard}
spec:
  target: {apiVersion: acme.io/v1, kind: Hoard}
  script: hoard.rhai
",
            ),
            ("pol/hoard.rhai", script),
            ("s.yaml", &scenario),
        ],
    );
    dir.join("s.yaml")
}

/// A script that holds more than it should (900 strings of 512 KB, as a
/// careless accumulation would) is stopped at the memory cap of a call,
/// all its values together, where each value alone is within its limit;
/// the decision fails with the script's position and writes nothing of
/// its own. It used to take the operator from 43 to 272 MB of RSS.
#[test]
fn a_script_holding_too_much_is_stopped_at_the_memory_cap() {
    // Locals, each within every per-value limit (an array's or map's
    // strings count together against the string limit already).
    let locals: String = (0..900)
        .map(|i| format!("    let v{i} = s + {i};\n"))
        .collect();
    let script = format!(
        "fn reconcile(ctx) {{\n    let s = \"x\";\n    for i in 0..19 {{ s += s; }}\n{locals}    [status(#{{ held: v899.len() }})]\n}}\n"
    );
    let s = hoard("greedy", &script, "", "        - {none: apply}\n");
    let out = runbook(&["simulate", s.to_str().unwrap(), "-o", "json"]);
    let t = text(&out);
    assert!(
        t.contains("hoard.rhai:") && t.contains("memory cap of a call (32 MB by default)"),
        "{t}"
    );
    assert!(
        !t.contains("\"held\""),
        "nothing of the decision written: {t}"
    );
}

/// A status write the API server refuses (413: the object grew past its
/// size limit) is a visible failure: a Warning Event `StatusWriteFailed`
/// on the target saying why, beside the retry (it used to leave the old
/// record and nothing else).
#[test]
fn a_refused_status_write_is_told_on_the_target() {
    let s = hoard(
        "toolarge",
        "fn reconcile(ctx) {\n    [status(#{ phase: \"Counted\" })]\n}\n",
        "        - fail: {verb: patch, resource: hoards/status, code: 413}\n",
        "        - {action: event, kind: Hoard, name: h1, fields: {type: Warning, reason: StatusWriteFailed}}\n        - {action: status, kind: Hoard, name: h1, fields: {phase: Counted}}\n",
    );
    let out = runbook(&["simulate", s.to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("StatusWriteFailed") && t.contains("413"), "{t}");
}

/// A policy's schedule in a time zone: 20:00 in Berlin on weekdays is
/// 19:00 UTC before the spring-forward Sunday and 18:00 after it, and
/// `runbook simulate` shows each time in status in Berlin's time too. An
/// unknown zone is refused with its place.
#[test]
fn a_schedule_in_a_time_zone_keeps_its_wall_time_across_dst() {
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: hoards.acme.io}\nspec:\n  group: acme.io\n  scope: Namespaced\n  names: {kind: Hoard, plural: hoards, singular: hoard}\n  versions:\n    - name: v1\n      served: true\n      storage: true\n      subresources: {status: {}}\n      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n";
    let policy = |zone: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: nightly}}\nspec:\n  target: {{apiVersion: acme.io/v1, kind: Hoard}}\n  schedule: {{cron: \"0 20 * * 1-5\", timeZone: {zone}, firstRun: schedule}}\n  script: hoard.rhai\n"
        )
    };
    let scenario = "apiVersion: runbook.dev/v1alpha1\nkind: Scenario\nmetadata: {name: berlin evenings}\nspec:\n  policies: pol\n  objects: [crd.yaml]\n  start: \"2026-03-27T12:00:00Z\"\n  until: 4d\n  timeline:\n    - at: 0s\n      world:\n        - create:\n            object: {apiVersion: acme.io/v1, kind: Hoard, metadata: {name: h1}, spec: {}}\n    - at: 7h\n      expect: [{action: status, kind: Hoard, fields: {lastRunTime: \"2026-03-27T19:00:00Z\"}}]\n    - at: 78h\n      expect: [{action: status, kind: Hoard, fields: {lastRunTime: \"2026-03-30T18:00:00Z\"}}]\n";
    let berlin = policy("Europe/Berlin");
    let dir = dir_with(
        "time-zone",
        &[
            ("crd.yaml", crd),
            ("pol/hoard.yaml", berlin.as_str()),
            ("pol/hoard.rhai", "fn reconcile(ctx) { [] }\n"),
            ("s.yaml", scenario),
        ],
    );
    let out = runbook(&["simulate", dir.join("s.yaml").to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("times: UTC, and in Europe/Berlin"),
        "the zone is said: {t}"
    );
    assert!(
        t.contains("nextRunTime=2026-03-30T18:00:00Z (20:00 CEST)")
            && t.contains("lastRunTime=2026-03-27T19:00:00Z (20:00 CET)"),
        "times in Berlin's: {t}"
    );
    let typo = policy("Europe/Berln");
    let bad = dir_with(
        "time-zone-typo",
        &[
            ("crd.yaml", crd),
            ("pol/hoard.yaml", typo.as_str()),
            ("pol/hoard.rhai", "fn reconcile(ctx) { [] }\n"),
            ("s.yaml", scenario),
        ],
    );
    let out = runbook(&["check", bad.join("pol").to_str().unwrap()]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("hoard.yaml:6:13: spec.schedule.timeZone: unknown time zone \"Europe/Berln\""),
        "{t}"
    );
}

/// A status line with many long fields still shows the phase: it comes
/// first, before the line is cut (sorted by name, it was cut off).
#[test]
fn a_long_status_line_shows_its_phase() {
    let long = "x".repeat(40);
    let script = format!(
        "fn reconcile(ctx) {{\n    [status(#{{ alpha: \"{long}\", beta: \"{long}\", gamma: \"{long}\", phase: \"Scaled\" }})]\n}}\n"
    );
    let s = hoard(
        "phase-first",
        &script,
        "",
        "        - {action: status, kind: Hoard, name: h1, fields: {phase: Scaled}}\n",
    );
    let out = runbook(&["simulate", s.to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let line = t
        .lines()
        .find(|l| l.contains("status") && l.contains("Hoard default/h1"))
        .unwrap_or_else(|| panic!("a status line in {t}"));
    assert!(line.contains("phase=Scaled alpha="), "{line}");
    assert!(line.ends_with("..."), "the line is cut: {line}");
}

/// `fn deleted(ctx)`: a deletion is heard once, without a finalizer, on
/// the last state seen (its labels); a target that only leaves the
/// policy's selector is not deleted and is not told; actions on the gone
/// target itself are refused with their position.
#[test]
fn a_deleted_handler_hears_a_deletion_once_and_never_a_selector_change() {
    let dir = dir_with(
        "deleted",
        &[
            (
                "pol/gone.yaml",
                "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: gone}
spec:
  target: {apiVersion: v1, kind: ConfigMap}
  selector: {matchLabels: {watched: \"yes\"}}
  script: gone.rhai
",
            ),
            (
                "pol/gone.rhai",
                "fn reconcile(ctx) { [] }
fn deleted(ctx) {
    let team = ctx.resource.metadata.labels.team;
    [event(\"Normal\", \"Deleted\", `ConfigMap ${ctx.resource.metadata.name} of ${team} was deleted`),
     alert(\"warning\", `${ctx.resource.metadata.name} deleted`),
     status(#{ gone: true })]
}
",
            ),
            (
                "s.yaml",
                "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata: {name: deleted}
spec:
  policies: pol
  namespace: default
  start: \"2026-11-29T09:00:00Z\"
  until: 30m
  timeline:
    - at: 0s
      world:
        - create:
            object: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, labels: {watched: \"yes\", team: ml}}}
        - create:
            object: {apiVersion: v1, kind: ConfigMap, metadata: {name: b, labels: {watched: \"yes\", team: web}}}
      expect:
        - {none: event}
    - at: 1m
      world:
        - update: {kind: ConfigMap, name: b, patch: {metadata: {labels: {watched: \"no\"}}}}
      expect:
        - {none: event}
    - at: 2m
      world:
        - delete: {kind: ConfigMap, name: a}
      expect:
        - {action: event, kind: ConfigMap, name: a, reason: Deleted, count: 1}
        - {action: alert, kind: ConfigMap, name: a, labels: {severity: warning}}
        - {action: refusal, kind: ConfigMap, name: a}
        - {none: status}
    - at: 5m
      world:
        - delete: {kind: ConfigMap, name: b}
      expect:
        - {none: event}
",
            ),
        ],
    );
    let out = runbook(&["simulate", dir.join("s.yaml").to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("ConfigMap a of ml was deleted"), "{t}");
    assert!(
        t.contains("gone.rhai:6:6: status refused: the target is deleted"),
        "{t}"
    );
}

/// `spec.previous`: a decision reads what changed since the last one that
/// concluded. A label change is told once with its old and new value; a
/// change of a field not declared is not and writes nothing; keeping the
/// old value costs no write of its own, no more API writes than the same
/// monitor keeping the last labels in a status field by hand.
#[test]
fn previous_tells_a_declared_change_once_and_costs_no_write_of_its_own() {
    let timeline = "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata: {name: diffs}
spec:
  policies: pol
  namespace: default
  start: \"2026-11-29T09:00:00Z\"
  until: 30m
  timeline:
    - at: 0s
      world:
        - create:
            object: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, labels: {tier: web, watched: \"yes\"}}, data: {size: \"1\"}}
      expect:
        - {none: event}
    - at: 1m
      world:
        - update: {kind: ConfigMap, name: a, patch: {data: {size: \"2\"}}}
      expect:
        - {none: event}
    - at: 2m
      world:
        - update: {kind: ConfigMap, name: a, patch: {metadata: {labels: {tier: db}}}}
      expect:
        - {action: event, kind: ConfigMap, name: a, reason: LabelsChanged, count: 1}
    - at: 3m
      world:
        - update: {kind: ConfigMap, name: a, patch: {data: {size: \"3\"}}}
      expect:
        - {none: event}
";
    let policy = |extra: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {{name: diffs}}
spec:
  target: {{apiVersion: v1, kind: ConfigMap}}
  selector: {{matchLabels: {{watched: \"yes\"}}}}
  script: diffs.rhai
{extra}"
        )
    };
    let declared = dir_with(
        "previous",
        &[
            ("pol/diffs.yaml", &policy("  previous: [metadata.labels]\n")),
            (
                "pol/diffs.rhai",
                "fn reconcile(ctx) {
    if ctx.previous == () || !ctx.changed(\"metadata.labels\") { return []; }
    let was = ctx.previous.metadata.labels.tier;
    let now = ctx.resource.metadata.labels.tier;
    [event(\"Normal\", \"LabelsChanged\", `tier ${was} -> ${now}`)]
}
",
            ),
            ("s.yaml", timeline),
        ],
    );
    let by_hand = dir_with(
        "previous-by-hand",
        &[
            (
                "pol/diffs.yaml",
                &policy("  status: {fields: [lastTier]}\n"),
            ),
            (
                "pol/diffs.rhai",
                "fn reconcile(ctx) {
    let now = ctx.resource.metadata.labels.tier;
    let was = ctx.resource?.status?.lastTier;
    if was == now { return []; }
    let out = [status(#{ lastTier: now })];
    if was != () { out.push(event(\"Normal\", \"LabelsChanged\", `tier ${was} -> ${now}`)); }
    out
}
",
            ),
            ("s.yaml", timeline),
        ],
    );
    let writes = |dir: &Path| -> (String, u64) {
        let out = runbook(&["simulate", dir.join("s.yaml").to_str().unwrap()]);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        let n = t
            .lines()
            .find_map(|l| l.trim().strip_prefix("API writes: "))
            .and_then(|n| n.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no API writes line: {t}"));
        (t, n)
    };
    let (t, declared_writes) = writes(&declared);
    assert!(t.contains("LabelsChanged: tier web -> db"), "{t}");
    // Its first decision and the label change write the record; the
    // changes of undeclared data do not.
    let state_writes = t.lines().filter(|l| l.contains(" state    v1 ")).count();
    assert_eq!(state_writes, 2, "{t}");
    let (t, hand_writes) = writes(&by_hand);
    assert!(t.contains("LabelsChanged: tier web -> db"), "{t}");
    assert!(
        declared_writes <= hand_writes,
        "spec.previous: {declared_writes} writes; by hand: {hand_writes}"
    );
    eprintln!("API writes: spec.previous {declared_writes}, kept by hand {hand_writes}");
}

/// A namespaced target reads its own Namespace (a cluster-scoped kind) by
/// name, and a policy that lists namespaces decides again when one is
/// deleted, not only when one is made.
#[test]
fn namespaces_are_read_by_name_and_a_deleted_one_wakes_who_listed_it() {
    let dir = dir_with(
        "namespaces",
        &[
            (
                "pol/count.yaml",
                "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: count}
spec:
  target: {apiVersion: v1, kind: ConfigMap}
  selector: {matchLabels: {counted: \"yes\"}}
  reads: [{apiVersion: v1, kind: Namespace}]
  owns: [{apiVersion: v1, kind: ConfigMap}]
  namespaces: {selector: {matchLabels: {team: ml}}}
  status: {fields: [teams, owner]}
  script: count.rhai
",
            ),
            (
                "pol/count.rhai",
                "fn reconcile(ctx) {
    let own = ctx.get(\"Namespace\", ctx.namespace);
    [status(#{ teams: ctx.namespaces().len(), owner: own.metadata.labels.owner })]
}
fn finalize(ctx) { ctx.sync_children([]) }
",
            ),
            (
                "s.yaml",
                "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata: {name: namespaces}
spec:
  policies: pol
  namespace: home
  operator: {allowOtherNamespaces: true}
  start: \"2026-11-29T09:00:00Z\"
  until: 30m
  timeline:
    - at: 0s
      world:
        - update: {kind: Namespace, name: home, patch: {metadata: {labels: {owner: ana}}}}
        - create:
            object: {apiVersion: v1, kind: Namespace, metadata: {name: ml-a, labels: {team: ml}}}
        - create:
            object: {apiVersion: v1, kind: Namespace, metadata: {name: ml-b, labels: {team: ml}}}
        - create:
            object: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: home, labels: {counted: \"yes\"}}}
      expect:
        - {action: state, kind: ConfigMap, name: c, fields: {fields: {teams: 2, owner: ana}}}
    - at: 5m
      world:
        - delete: {kind: Namespace, name: ml-b}
      expect:
        - {action: state, kind: ConfigMap, name: c, fields: {fields: {teams: 1}}}
",
            ),
        ],
    );
    let out = runbook(&["simulate", dir.join("s.yaml").to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
}

/// `count` Pods named `prefix-N` in `default`, with these labels.
fn pods(prefix: &str, count: usize, labels: &str) -> String {
    (0..count)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {prefix}-{i}, namespace: default, labels: {labels}}}\nspec: {{containers: [{{name: c, image: busybox}}]}}\n---\n"
            )
        })
        .collect()
}

/// The API writes a scenario run made, from its summary.
fn api_writes(t: &str) -> u64 {
    t.lines()
        .find_map(|l| l.trim().strip_prefix("API writes: "))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no API writes line: {t}"))
}

/// A sweep decides once per fire time over all the Pods it selects: what
/// it deletes is bounded by its limit (the rest waits for the next run),
/// nothing is written per Pod, and each run writes its one record. The
/// same clean-up decided per Pod writes every Pod's state at every run.
#[test]
fn a_sweep_decides_once_per_run_within_its_limit_and_writes_nothing_per_pod() {
    let policy = |sweep: bool| {
        format!(
            "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {{name: tidy}}
spec:
  target: {{apiVersion: v1, kind: Pod}}
  sweep: {sweep}
  schedule: {{cron: \"*/5 * * * *\", firstRun: schedule}}
  deletes: [{{apiVersion: v1, kind: Pod}}]
  limits: {{delete: 20/5m}}
  status: {{fields: [found]}}
  script: tidy.rhai
"
        )
    };
    let swept = "fn reconcile(ctx) {
    if !ctx.due { return []; }
    let gone = ctx.targets.filter(|p| p.metadata.labels.temporary == \"yes\");
    let out = gone.map(|p| delete(p));
    out.push(status(#{ found: gone.len() }));
    out
}
";
    let each = "fn reconcile(ctx) {
    if !ctx.due || ctx.resource.metadata.labels.temporary != \"yes\" { return []; }
    [delete(ctx.resource)]
}
";
    let scenario = |until: &str, timeline: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata: {{name: tidy}}
spec:
  policies: pol
  objects: [pods.yaml]
  start: \"2026-12-01T09:02:30Z\"
  until: {until}
  timeline:
{timeline}  final:
    - {{kind: RunbookState, name: \"pod.*\", absent: true}}
    - {{kind: RunbookState, name: sweep.runbook.dev.tidy}}
"
        )
    };
    // 25 to delete against a limit of 20 per 5 minutes.
    let bounded = dir_with(
        "sweep-bounded",
        &[
            ("pol/tidy.yaml", &policy(true)),
            ("pol/tidy.rhai", swept),
            ("pods.yaml", &pods("tmp", 25, "{temporary: \"yes\"}")),
            (
                "s.yaml",
                &scenario(
                    "10m",
                    "    - at: 0s
      expect:
        - {none: delete, kind: Pod}
    - at: 2m30s
      expect:
        - {action: delete, kind: Pod, result: ok, count: 20}
        - {action: delete, kind: Pod, result: limited, count: 5}
        - {action: state, kind: Sweep, name: tidy, count: 1, fields: {fields: {found: 25}}}
    - at: 7m30s
      expect:
        - {action: delete, kind: Pod, result: ok, count: 5}
        - {action: state, kind: Sweep, name: tidy, count: 1, fields: {fields: {found: 5}}}
",
                ),
            ),
        ],
    );
    let out = runbook(&["simulate", bounded.join("s.yaml").to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(!t.contains("state    v1 Pod"), "{t}");

    // Writes per run: 10 Pods to delete among 30, three runs.
    let mixed = format!(
        "{}{}",
        pods("tmp", 10, "{temporary: \"yes\"}"),
        pods("app", 20, "{temporary: \"no\"}")
    );
    let timeline = "    - at: 2m30s
      expect:
        - {action: delete, kind: Pod, name: \"tmp-*\", count: 10}
        - {none: delete, kind: Pod, name: \"app-*\"}
";
    let run = |sweep: bool| {
        let dir = dir_with(
            if sweep {
                "sweep-writes"
            } else {
                "per-pod-writes"
            },
            &[
                ("pol/tidy.yaml", &policy(sweep)),
                ("pol/tidy.rhai", if sweep { swept } else { each }),
                ("pods.yaml", &mixed),
                ("s.yaml", &scenario("15m", timeline)),
            ],
        );
        let out = runbook(&["simulate", dir.join("s.yaml").to_str().unwrap()]);
        (out.status.success(), text(&out))
    };
    let (ok, t) = run(true);
    assert!(ok, "{t}");
    let sweep_writes = api_writes(&t);
    // Its first look (not due: the first run is at 09:05), then three
    // runs (09:05, 09:10, 09:15): one record write each, and 10 deletes.
    assert_eq!(sweep_writes, 4 + 10, "{t}");
    let (ok, t) = run(false);
    // Decided per Pod, each Pod's run times are kept in a RunbookState
    // of its own: the final check that none exists fails.
    assert!(!ok, "{t}");
    assert!(t.contains("RunbookState"), "{t}");
    let per_pod_writes = api_writes(&t);
    eprintln!(
        "30 Pods, 10 to delete, 3 runs: API writes swept {sweep_writes}, decided per Pod {per_pod_writes}"
    );
    assert!(per_pod_writes > 3 * 20, "{t}");
}
