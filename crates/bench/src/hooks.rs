//! The rollback decision as the designs Runbook replaces run it: a
//! shell-operator-style hook (bash reading the binding context with jq,
//! writing its patches to `$KUBERNETES_PATCH_PATH`) and the same hook in
//! Python, each a process per event. Both read the same objects the Rhai
//! policy decides on, and must reach the same decision: roll the
//! Deployment back to revision 3, status RolledBack.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Stats;
use super::decision::Setup;

/// The hook as a shell-operator user writes it.
pub const SHELL_HOOK: &str = r#"#!/usr/bin/env bash
# The Evaluator's rollback rule as a shell-operator hook: read the binding
# context, decide with jq, write the patches for the operator to apply.
set -euo pipefail
ctx="$BINDING_CONTEXT_PATH"
ev=$(jq -c '.[0].snapshots.evaluators[0].object' "$ctx")
name=$(jq -r '.metadata.name' <<<"$ev")
threshold=$(jq -r '.spec.threshold' <<<"$ev")
run=$(jq -r '.status.currentRun // empty' <<<"$ev")
[ -n "$run" ] || { echo '[]' > "$KUBERNETES_PATCH_PATH"; exit 0; }
score=$(jq -r --arg run "$run" '
  .[0].snapshots.pods[].object
  | select(.metadata.labels["job-name"] == $run)
  | .status.containerStatuses[0].state.terminated.message
  | fromjson | .score' "$ctx")
dep=$(jq -r '.spec.targetRef.name' <<<"$ev")
current=$(jq -r '.[0].snapshots.deployments[0].object.metadata.annotations["deployment.kubernetes.io/revision"]' "$ctx")
if awk -v s="$score" -v t="$threshold" 'BEGIN { exit !(s >= t) }'; then
  jq -n --arg name "$name" --argjson score "$score" --argjson rev "$current" '[{
    operation: "MergePatch", kind: "Evaluator", name: $name, subresource: "/status",
    mergePatch: {status: {phase: "Healthy", lastScore: $score, lastGoodRevision: $rev, currentRun: null}}}]' \
    > "$KUBERNETES_PATCH_PATH"
  exit 0
fi
to=$(jq -r --argjson cur "$current" '
  [.[0].snapshots.replicasets[].object
   | (.metadata.annotations["deployment.kubernetes.io/revision"] | tonumber) as $r
   | select($r < $cur) | $r] | max' "$ctx")
template=$(jq -c --arg to "$to" '
  .[0].snapshots.replicasets[].object
  | select(.metadata.annotations["deployment.kubernetes.io/revision"] == $to)
  | .spec.template' "$ctx")
jq -n --arg name "$name" --arg dep "$dep" --argjson score "$score" \
  --argjson from "$current" --argjson to "$to" --argjson template "$template" '[
  {operation: "MergePatch", kind: "Deployment", name: $dep,
   mergePatch: {spec: {template: $template}}},
  {operation: "MergePatch", kind: "Evaluator", name: $name, subresource: "/status",
   mergePatch: {status: {phase: "RolledBack", lastScore: $score, currentRun: null,
     lastRollback: {fromRevision: $from, toRevision: $to, score: $score}}}}]' \
  > "$KUBERNETES_PATCH_PATH"
"#;

/// The same hook in Python, as a Kopf-less script hook would be.
pub const PYTHON_HOOK: &str = r#"import json, os
with open(os.environ["BINDING_CONTEXT_PATH"]) as f:
    snap = json.load(f)[0]["snapshots"]
ev = snap["evaluators"][0]["object"]
name, st = ev["metadata"]["name"], ev.get("status", {})
run = st.get("currentRun")
patches = []
if run:
    pod = next(p["object"] for p in snap["pods"]
               if p["object"]["metadata"]["labels"].get("job-name") == run)
    score = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])["score"]
    dep = snap["deployments"][0]["object"]
    rev = lambda o: int(o["metadata"]["annotations"]["deployment.kubernetes.io/revision"])
    current = rev(dep)
    if score >= ev["spec"]["threshold"]:
        patches.append({"operation": "MergePatch", "kind": "Evaluator", "name": name,
                        "subresource": "/status", "mergePatch": {"status": {
                            "phase": "Healthy", "lastScore": score,
                            "lastGoodRevision": current, "currentRun": None}}})
    else:
        older = [r["object"] for r in snap["replicasets"] if rev(r["object"]) < current]
        to = max(older, key=rev)
        patches.append({"operation": "MergePatch", "kind": "Deployment",
                        "name": ev["spec"]["targetRef"]["name"],
                        "mergePatch": {"spec": {"template": to["spec"]["template"]}}})
        patches.append({"operation": "MergePatch", "kind": "Evaluator", "name": name,
                        "subresource": "/status", "mergePatch": {"status": {
                            "phase": "RolledBack", "lastScore": score, "currentRun": None,
                            "lastRollback": {"fromRevision": current, "toRevision": rev(to),
                                             "score": score}}}})
with open(os.environ["KUBERNETES_PATCH_PATH"], "w") as f:
    json.dump(patches, f)
"#;

/// A hook language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Shell,
    Python,
}

impl Hook {
    fn program(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Hook::Shell => ("bash", "hook.sh", SHELL_HOOK),
            Hook::Python => ("python3", "hook.py", PYTHON_HOOK),
        }
    }
}

/// The binding context shell-operator would write for the decision the
/// Rhai benchmark measures: the Evaluator and what it reads, as snapshots.
pub fn binding_context(setup: &Setup) -> Value {
    let objects = |v: &[Value]| -> Vec<Value> { v.iter().map(|o| json!({"object": o})).collect() };
    json!([{
        "binding": "evaluators",
        "type": "Event",
        "watchEvent": "Modified",
        "object": setup.target,
        "snapshots": {
            "evaluators": objects(std::slice::from_ref(&setup.target)),
            "deployments": objects(std::slice::from_ref(&setup.deployment)),
            "jobs": objects(&setup.jobs),
            "pods": objects(&setup.pods),
            "replicasets": objects(&setup.replicasets),
        }
    }])
}

/// A hook ready to run: its files in a directory of their own.
pub struct Prepared {
    hook: Hook,
    dir: PathBuf,
    interpreter: PathBuf,
}

/// The interpreter itself, not a version manager's shim in front of it
/// (pyenv's is a shell script that would double the Python hook's cost).
fn interpreter(name: &str) -> PathBuf {
    if name == "python3"
        && let Ok(out) = Command::new(name)
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
        && out.status.success()
    {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(name)
}

impl Prepared {
    pub fn new(hook: Hook, setup: &Setup) -> std::io::Result<Prepared> {
        let dir = std::env::temp_dir().join(format!(
            "runbook-bench-hook-{}-{:?}",
            std::process::id(),
            hook
        ));
        std::fs::create_dir_all(&dir)?;
        let (_, file, text) = hook.program();
        std::fs::write(dir.join(file), text)?;
        std::fs::write(
            dir.join("context.json"),
            serde_json::to_vec(&binding_context(setup)).unwrap_or_default(),
        )?;
        Ok(Prepared {
            hook,
            dir,
            interpreter: interpreter(hook.program().0),
        })
    }

    /// Run the hook once, as the operator would for one event; its patches.
    pub fn run(&self) -> Result<Value, String> {
        let (interpreter, file, _) = self.hook.program();
        let patch = self.dir.join("patch.json");
        let status = Command::new(&self.interpreter)
            .arg(self.dir.join(file))
            .env("BINDING_CONTEXT_PATH", self.dir.join("context.json"))
            .env("KUBERNETES_PATCH_PATH", &patch)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("{interpreter}: {e}"))?;
        if !status.status.success() {
            return Err(format!(
                "{interpreter} {file}: {}",
                String::from_utf8_lossy(&status.stderr)
            ));
        }
        let text = std::fs::read(&patch).map_err(|e| format!("{}: {e}", patch.display()))?;
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", patch.display()))
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The revision a hook's patches roll the Deployment back to.
pub fn rolled_back_to(patches: &Value) -> Option<i64> {
    patches.as_array()?.iter().find_map(|p| {
        (p["kind"] == "Evaluator")
            .then(|| p["mergePatch"]["status"]["lastRollback"]["toRevision"].as_i64())?
    })
}

/// CPU time this process's waited-for children have used (Linux: the
/// `cutime` and `cstime` fields of /proc/self/stat, in clock ticks).
fn children_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of the line: 14 and 15 here.
    let ticks: u64 = f.get(13)?.parse::<u64>().ok()? + f.get(14)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(Duration::from_millis(ticks * 10))
}

/// Figures for one hook.
pub struct HookFigures {
    pub wall: Stats,
    /// CPU time per run (its processes: the interpreter and every jq).
    pub cpu: Option<Duration>,
    pub to_revision: Option<i64>,
}

/// Run a hook `iters` times (after one warm-up run whose decision is kept).
pub fn measure(hook: Hook, setup: &Setup, iters: usize) -> Result<HookFigures, String> {
    let p = Prepared::new(hook, setup).map_err(|e| e.to_string())?;
    let first = p.run()?;
    let before = children_cpu();
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        p.run()?;
        samples.push(t.elapsed());
    }
    let cpu = match (before, children_cpu()) {
        (Some(a), Some(b)) => Some((b.saturating_sub(a)) / iters.max(1) as u32),
        _ => None,
    };
    Ok(HookFigures {
        wall: Stats::from_samples(samples),
        cpu,
        to_revision: rolled_back_to(&first),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have(program: &str, arg: &str) -> bool {
        Command::new(program)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The anchors are only fair if they decide what Runbook decides.
    #[test]
    fn the_shell_and_python_hooks_reach_the_policys_decision() {
        let setup = Setup::new(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies"),
            0.72,
        );
        let rhai = setup.scripted();
        assert!(
            rhai.actions
                .iter()
                .any(|a| format!("{a:?}").contains("Rollback")),
            "{:?}",
            rhai.actions
        );
        for (hook, needs) in [(Hook::Shell, "jq"), (Hook::Python, "python3")] {
            if !have(needs, "--version") {
                eprintln!("SKIPPED {hook:?}: no {needs} on this machine");
                continue;
            }
            let patches = Prepared::new(hook, &setup).unwrap().run().unwrap();
            assert_eq!(rolled_back_to(&patches), Some(3), "{hook:?}: {patches}");
            let deployment = patches
                .as_array()
                .and_then(|a| a.iter().find(|p| p["kind"] == "Deployment"))
                .unwrap_or_else(|| panic!("{hook:?} patches no Deployment: {patches}"));
            assert_eq!(
                deployment["mergePatch"]["spec"]["template"]["spec"]["containers"][0]["image"],
                "registry.example.com/ml/chatbot:v3",
                "{hook:?}"
            );
        }
    }
}
