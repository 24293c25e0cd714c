//! `runbook capture` and `runbook replay` against a cluster the operator
//! runs in: the three shipped workflows decide live, the namespace is
//! captured, the captured scenario decides as the live operator did, and a
//! changed threshold is reported on its Evaluator alone. No Secret value
//! leaves the cluster.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/kubelet.rs"]
mod kubelet;
#[path = "support/operator.rs"]
mod support;
#[path = "support/workflows.rs"]
mod workflows;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cluster::{Cluster, eventually};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use runbook_operator::runtime::OperatorConfig;
use serde_json::{Value, json};
use workflows::*;

/// What the planted Secret holds; no captured file may contain it.
const PLANTED: &str = "s3cr3t-planted-by-the-capture-test";

/// A policy beside the shipped ones that reads a Secret by name (its
/// keys, never its values) for a labelled ConfigMap.
const CREDENTIALS: &str = "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: credentials-check}
spec:
  target: {apiVersion: v1, kind: ConfigMap}
  selector: {matchLabels: {credentials: checked}}
  readsByName: [{apiVersion: v1, kind: Secret, names: [db-credentials]}]
  status: {fields: [keys]}
  script: credentials-check.rhai
";

const CREDENTIALS_SCRIPT: &str = "fn reconcile(ctx) {
    let s = ctx.get(\"Secret\", \"db-credentials\");
    [status(#{ keys: if s == () { 0 } else { s.data.keys().len() } })]
}
";

/// The shipped policies and the credentials check, in a directory.
fn policies_dir(name: &str, edit: impl Fn(&str, String) -> String) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("runbook-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(repo().join("policies")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let file = path.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(dir.join(&file), edit(&file, text)).unwrap();
        }
    }
    std::fs::write(dir.join("credentials-check.yaml"), CREDENTIALS).unwrap();
    std::fs::write(dir.join("credentials-check.rhai"), CREDENTIALS_SCRIPT).unwrap();
    dir
}

/// `runbook ARGS` with `KUBECONFIG`: its exit and what it printed (out, err).
async fn runbook(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let (kubeconfig, args) = (
        kubeconfig.to_path_buf(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_runbook"))
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    })
    .await
    .unwrap()
}

/// Every file below `dir`, as text.
fn texts(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out
}

/// The actions of a decision record, as `verb target` lines.
fn actions_of(record: &Value) -> Vec<String> {
    let mut out: Vec<String> = record["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            format!(
                "{} {}",
                a["action"].as_str().unwrap_or(""),
                a["target"].as_str().unwrap_or("")
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_namespace_decides_as_it_did_and_a_replay_finds_the_one_change() {
    let c = Cluster::new("capture").await;
    install_crds(&c).await;
    let live = policies_dir("capture-live", |_, t| t);
    let bundle = runbook_core::policy::Bundle::from_dir(&live).unwrap();
    let engine = runbook_core::script::ScriptEngine::default();
    let (set, errors) = runbook_core::policy::load(&engine, &[bundle]);
    assert!(errors.is_empty(), "{errors:?}");
    let op = support::operator(&c, set, OperatorConfig::default());
    op.start().await.expect("the operator starts");

    // The three workflows, and the credentials check, each settled where
    // a simulated world would leave it too: the model servers running, a
    // benchmark Job and the database's pods never started.
    let kubelet = kubelet::Kubelet::start(&c);
    kubelet.ready("chat-");
    kubelet.ready("llama-");
    model_deployment(&c, "chat").await;
    create(
        &c,
        json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
            "metadata": {"name": "chatbot"},
            "spec": {"targetRef": {"name": "chat"}, "threshold": 0.85, "schedule": "0 3 1 1 *",
                     "benchmark": {"image": "busybox:1.36", "command": ["sh", "-c", BENCHMARK]}}}),
    )
    .await;
    database(&c).await;
    create(&c, nightly_backup()).await;
    create(
        &c,
        json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "AIModel",
            "metadata": {"name": "llama"},
            "spec": {"modelUri": "https://models.example.com/llama/v1.safetensors",
                     "servingImage": "registry.k8s.io/pause:3.9", "gpusPerReplica": 1, "replicas": 1}}),
    )
    .await;
    let secrets: Api<Secret> = c.api();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "db-credentials"},
                "stringData": {"password": PLANTED}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let maps: Api<ConfigMap> = c.api();
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "settings", "labels": {"credentials": "checked"}}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let kinds = [
        ("Evaluator", "chatbot"),
        ("DatabaseBackup", "nightly"),
        ("AIModel", "llama"),
    ];
    let record = |kind: &'static str, name: &'static str| {
        let api = kind_api(&c, "runbook.dev/v1alpha1", kind);
        async move { status_of(&api, name).await["decisions"][0].clone() }
    };
    for (kind, name) in kinds {
        eventually(&format!("a decision on {kind} {name}"), 60, || async {
            record(kind, name).await.is_object()
        })
        .await;
    }
    let evaluators = kind_api(&c, "runbook.dev/v1alpha1", "Evaluator");
    eventually("the benchmark started", 60, || async {
        status_of(&evaluators, "chatbot").await["phase"] == "Running"
    })
    .await;
    let models = kind_api(&c, "runbook.dev/v1alpha1", "AIModel");
    eventually("the model served", 60, || async {
        status_of(&models, "llama").await["phase"] == "Ready"
    })
    .await;
    let states = kind_api(&c, "runbook.dev/v1alpha1", "RunbookState");
    eventually("the credentials check's state", 60, || async {
        status_of(&states, "configmap.settings").await["fields"]["keys"] == 1
    })
    .await;
    op.settle(Duration::from_secs(2), Duration::from_secs(30))
        .await;
    let mut decided = Vec::new();
    for (kind, name) in kinds {
        decided.push((kind, name, actions_of(&record(kind, name).await)));
    }
    op.shutdown(Duration::from_secs(5)).await;

    // Captured: the namespace, its policies, no Secret value.
    let work = std::env::temp_dir().join(format!("runbook-capture-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&work).await;
    let out = work.join("scenario");
    let (ok, _, err) = runbook(
        &kubeconfig,
        &[
            "capture",
            "-n",
            &c.ns,
            "--policies",
            live.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--until",
            "10m",
        ],
    )
    .await;
    assert!(ok, "{err}");
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(PLANTED);
    let files = texts(&out);
    for (path, text) in &files {
        assert!(
            !text.contains(PLANTED) && !text.contains(&encoded),
            "{} holds the Secret's value",
            path.display()
        );
    }
    let objects = &files
        .iter()
        .find(|(p, _)| p.ends_with("objects.yaml"))
        .unwrap()
        .1;
    assert!(objects.contains("name: db-credentials"), "{objects}");

    // Simulated from the capture, the operator decides as the live one
    // did: the same actions on each target, and nothing to write.
    let (ok, text, err) = runbook(
        &kubeconfig,
        &["simulate", out.to_str().unwrap(), "-o", "json"],
    )
    .await;
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}{err}"));
    assert!(ok, "{text}{err}");
    let writes: Vec<&Value> = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            ["apply", "delete", "patch", "rollback"].contains(&e["action"].as_str().unwrap_or(""))
                && e["result"] == "ok"
        })
        .collect();
    assert!(writes.is_empty(), "the capture wrote again: {writes:#?}");
    for (kind, name, actions) in &decided {
        let simulated: Vec<String> = report["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["action"] == "status" && e["kind"] == *kind && e["name"] == *name)
            .filter_map(|e| e["fields"]["decisions"].get(0))
            .map(actions_of)
            .next_back()
            .unwrap_or_else(|| actions.clone());
        assert_eq!(&simulated, actions, "{kind} {name}");
    }

    // A threshold raised by 0.05, against a benchmark that scores 0.88:
    // the Evaluator alone decides otherwise.
    let raised = policies_dir("capture-new", |file, t| {
        if file == "evaluator-drift.rhai" {
            t.replace("if score >= threshold {", "if score >= threshold + 0.05 {")
        } else {
            t
        }
    });
    assert_ne!(
        std::fs::read_to_string(raised.join("evaluator-drift.rhai")).unwrap(),
        std::fs::read_to_string(live.join("evaluator-drift.rhai")).unwrap(),
        "the edit took"
    );
    let world = work.join("world.yaml");
    std::fs::write(
        &world,
        "apiVersion: runbook.dev/v1alpha1
kind: Scenario
metadata: {name: the benchmark scores 0.88}
spec:
  timeline:
    - at: 1m
      world:
        - complete: {name: \"chatbot-eval-*\", terminationMessage: '{\"score\": 0.88}'}
",
    )
    .unwrap();
    let (ok, text, err) = runbook(
        &kubeconfig,
        &[
            "replay",
            out.to_str().unwrap(),
            "--policies",
            raised.to_str().unwrap(),
            "--world",
            world.to_str().unwrap(),
            "--for",
            "2h",
            "-o",
            "json",
            "--expect-same",
        ],
    )
    .await;
    assert!(!ok, "--expect-same passes a change: {text}{err}");
    let diff: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}{err}"));
    let differing: Vec<&str> = diff["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["object"].as_str().unwrap())
        .collect();
    assert_eq!(
        differing,
        [format!("runbook.dev/v1alpha1 Evaluator {}/chatbot", c.ns)],
        "{text}"
    );
    // The same policies replayed change nothing.
    let (ok, text, err) = runbook(
        &kubeconfig,
        &[
            "replay",
            out.to_str().unwrap(),
            "--policies",
            live.to_str().unwrap(),
            "--world",
            world.to_str().unwrap(),
            "--for",
            "2h",
            "--expect-same",
        ],
    )
    .await;
    assert!(ok, "{text}{err}");
    // A check that now also tells of the keys it found decides otherwise
    // than the last decision the cluster recorded on its ConfigMap.
    let telling = policies_dir("capture-history", |_, t| t);
    std::fs::write(
        telling.join("credentials-check.rhai"),
        CREDENTIALS_SCRIPT.replace(
            "[status(",
            "[event(\"Normal\", \"Checked\", \"keys counted\"), status(",
        ),
    )
    .unwrap();
    let page = work.join("replay.html");
    let (ok, text, err) = runbook(
        &kubeconfig,
        &[
            "replay",
            out.to_str().unwrap(),
            "--policies",
            telling.to_str().unwrap(),
            "--for",
            "10m",
            "-o",
            "json",
            "--html",
            page.to_str().unwrap(),
        ],
    )
    .await;
    assert!(ok, "{text}{err}");
    let diff: Value = serde_json::from_str(&text).unwrap();
    let history = diff["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{text}");
    assert_eq!(
        history[0]["target"],
        format!("v1 ConfigMap {}/settings", c.ns),
        "{text}"
    );
    assert!(
        history[0]["new"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "event"),
        "{text}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    // Both runs, side by side, old first.
    let (old_at, new_at) = (
        html.find("old: captured at").unwrap(),
        html.find("new: captured at").unwrap(),
    );
    assert!(html.contains("<div class=\"versions\">") && old_at < new_at);
    c.cleanup().await;
}
