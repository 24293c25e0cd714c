//! The Argo CD health checks of deploy/argocd/, one per kind of Runbook's,
//! run by a real Lua interpreter (Debian's lua5.4, which `.ci/run`
//! installs; without it the test says it skips) as Argo CD runs them: the
//! object as the global `obj`, the script's returned table the health.
//! And the ConfigMap patch that installs them holds each script as is.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn lua() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("lua5.4"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        eprintln!("skipping: lua5.4 is not installed (apt-get install lua5.4)");
    }
    found
}

/// `v` as a Lua table constructor (JSON null as nil).
fn lua_literal(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(lua_literal).collect();
            format!("{{{}}}", inner.join(", "))
        }
        Value::Object(map) => {
            let inner: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("[{k:?}] = {}", lua_literal(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}

/// The health the script of `kind` gives `obj`: (status, message).
fn health(lua: &PathBuf, kind: &str, obj: &Value) -> (String, String) {
    let script = repo().join(format!("deploy/argocd/runbook.dev_{kind}.lua"));
    let harness = format!(
        "obj = {}\nlocal check = assert(loadfile({:?}))\nlocal hs = check()\nio.write(hs.status, \"\\n\", hs.message or \"\")\n",
        lua_literal(obj),
        script.to_str().unwrap()
    );
    let out = Command::new(lua)
        .arg("-e")
        .arg(&harness)
        .output()
        .expect("running lua5.4");
    assert!(
        out.status.success(),
        "{kind}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (status, message) = text.split_once('\n').unwrap_or((&text, ""));
    (status.to_string(), message.to_string())
}

fn object(kind: &str, generation: i64, status: Value) -> Value {
    let mut o = json!({
        "apiVersion": "runbook.dev/v1alpha1", "kind": kind,
        "metadata": {"name": "x", "namespace": "ml", "generation": generation},
    });
    if !status.is_null() {
        o["status"] = status;
    }
    o
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message})
}

#[test]
fn each_kind_is_healthy_progressing_or_degraded_as_its_status_says() {
    let Some(lua) = lua() else { return };
    let mut seen = Vec::new();
    for kind in ["Evaluator", "DatabaseBackup", "AIModel"] {
        let cases = [
            // New: Runbook has not reconciled it yet.
            (
                object(kind, 1, Value::Null),
                "Progressing",
                "Waiting for Runbook",
            ),
            // Edited, not yet seen.
            (
                object(
                    kind,
                    3,
                    json!({"observedGeneration": 2, "conditions": [cond("Ready", "True", "Fine", "fine")]}),
                ),
                "Progressing",
                "generation 3",
            ),
            (
                object(
                    kind,
                    2,
                    json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "True", "ScoreAboveThreshold", "score 0.91"),
                    cond("Reconciling", "False", "Reconciled", "no work in flight"),
                    cond("Stalled", "False", "NotStalled", "nothing needs a person")]}),
                ),
                "Healthy",
                "score 0.91",
            ),
            (
                object(
                    kind,
                    2,
                    json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "False", "RollingOut", "1/3"),
                    cond("Reconciling", "True", "BenchmarkRunning", "benchmark 7 running")]}),
                ),
                "Progressing",
                "benchmark 7 running",
            ),
            (
                object(
                    kind,
                    2,
                    json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "True", "Fine", "fine"),
                    cond("Degraded", "True", "ActionRefused", "delete of Job x refused"),
                    cond("Stalled", "True", "ActionRefused", "delete of Job x refused")]}),
                ),
                "Degraded",
                "delete of Job x refused",
            ),
            (
                object(
                    kind,
                    2,
                    json!({"observedGeneration": 2, "conditions": [
                    cond("Degraded", "True", "ActionFailed", "the API server answered 500")]}),
                ),
                "Degraded",
                "answered 500",
            ),
        ];
        for (obj, want, says) in cases {
            let (status, message) = health(&lua, kind, &obj);
            assert_eq!(status, want, "{kind} {obj}: {message}");
            assert!(message.contains(says), "{kind}: {message:?} lacks {says:?}");
            seen.push(format!("{kind}: {status} ({message})"));
        }
    }
    // What only one kind says: a backup's phase, a model's.
    let failed = object(
        "DatabaseBackup",
        1,
        json!({"observedGeneration": 1, "phase": "Failed", "currentStep": "snapshot"}),
    );
    assert_eq!(
        health(&lua, "DatabaseBackup", &failed),
        (
            "Degraded".into(),
            "the backup failed at step snapshot".into()
        )
    );
    let done = object(
        "DatabaseBackup",
        1,
        json!({"observedGeneration": 1, "phase": "Completed", "backupURL": "s3://b/1"}),
    );
    assert_eq!(
        health(&lua, "DatabaseBackup", &done),
        ("Healthy".into(), "s3://b/1".into())
    );
    let weights = object(
        "AIModel",
        1,
        json!({"observedGeneration": 1, "phase": "Degraded", "conditions": [
            cond("Ready", "False", "WeightsDownloadFailing", "weights: 403")]}),
    );
    assert_eq!(
        health(&lua, "AIModel", &weights),
        ("Degraded".into(), "weights: 403".into())
    );
    let below = object(
        "Evaluator",
        1,
        json!({"observedGeneration": 1, "conditions": [
            cond("Ready", "False", "RolledBack", "score 0.61 < 0.85: rolled back")]}),
    );
    assert_eq!(health(&lua, "Evaluator", &below).0, "Degraded");
    println!("{}", seen.join("\n"));
}

#[test]
fn the_argocd_patch_holds_each_script_as_is() {
    let patch = std::fs::read_to_string(repo().join("deploy/argocd/argocd-cm.yaml")).unwrap();
    let doc = runbook_core::util::yaml::parse_documents(&patch)
        .unwrap()
        .remove(0);
    for kind in ["Evaluator", "DatabaseBackup", "AIModel"] {
        let script =
            std::fs::read_to_string(repo().join(format!("deploy/argocd/runbook.dev_{kind}.lua")))
                .unwrap();
        let key = format!("resource.customizations.health.runbook.dev_{kind}");
        assert_eq!(
            doc["data"][&key].as_str(),
            Some(script.as_str()),
            "{key} in deploy/argocd/argocd-cm.yaml differs from runbook.dev_{kind}.lua"
        );
    }
}
