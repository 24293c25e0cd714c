//! `runbook check`: exit 0 with a line per policy, or exit 1 with every
//! error as file:line:col.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::Path;
use std::process::Command;

fn runbook() -> Command {
    Command::new(env!("CARGO_BIN_EXE_runbook"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("runbook-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn the_shipped_policies_check_clean() {
    let out = runbook()
        .args(["check", "policies/"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for p in ["evaluator-drift", "backup-ordering", "aimodel-serving"] {
        assert!(stdout.contains(&format!("ok  policy {p} ")), "{stdout}");
    }
    assert!(stdout.contains("ok  alert routes default"), "{stdout}");
}

#[test]
fn a_broken_copy_fails_with_every_error_positioned() {
    let dir = temp_dir("broken");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("policies"),
        &dir,
    );
    // A typo in the script and a misspelt key in another policy.
    let script = dir.join("evaluator-drift.rhai");
    let text = std::fs::read_to_string(&script).unwrap().replacen(
        "let revision = revision_of(dep);",
        "let revision = revison_of(dep) +;",
        1,
    );
    std::fs::write(&script, text).unwrap();
    let policy = dir.join("aimodel-serving.yaml");
    let text = std::fs::read_to_string(&policy).unwrap().replacen(
        "  script: aimodel-serving.rhai",
        "  scirpt: aimodel-serving.rhai",
        1,
    );
    std::fs::write(&policy, text).unwrap();

    let out = runbook().arg("check").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    let rhai = format!("{}/evaluator-drift.rhai:", dir.display());
    let yaml = format!("{}/aimodel-serving.yaml:", dir.display());
    let positioned = |prefix: &str| {
        lines.iter().any(|l| {
            l.strip_prefix(prefix).is_some_and(|rest| {
                let mut parts = rest.splitn(3, ':');
                parts.next().unwrap().parse::<u32>().is_ok()
                    && parts.next().unwrap().parse::<u32>().is_ok()
            })
        })
    };
    assert!(positioned(&rhai), "{stderr}");
    assert!(
        positioned(&yaml) && stderr.contains("unknown field `scirpt`"),
        "{stderr}"
    );
    assert!(stderr.contains("errors"), "{stderr}");
    // The same, as one JSON document for CI and editors.
    let out = runbook()
        .args(["check", "-o", "json"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(doc["ok"], false);
    let errors = doc["errors"].as_array().unwrap();
    assert!(
        errors.iter().any(|e| e["file"]
            .as_str()
            .unwrap()
            .ends_with("evaluator-drift.rhai")
            && e["line"].as_u64().is_some()
            && e["column"].as_u64().is_some()),
        "{doc}"
    );
    assert!(
        errors.iter().any(|e| e["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `scirpt`")),
        "{doc}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // Clean: every policy, ok.
    let out = runbook()
        .args(["check", "-o", "json", "policies/"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["policies"].as_array().unwrap().len(), 3, "{doc}");
}

/// `runbook test -o json`: a verdict per scenario, failures at their place.
#[test]
fn test_results_come_as_json_too() {
    let dir = temp_dir("test-json");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    copy_dir(&root.join("policies"), &dir.join("policies"));
    copy_dir(
        &root.join("policies/scenarios"),
        &dir.join("policies/scenarios"),
    );
    copy_dir(&root.join("examples/crds"), &dir.join("examples/crds"));
    let scenario = dir.join("policies/scenarios/evaluator-rollback.yaml");
    let text = std::fs::read_to_string(&scenario).unwrap();
    let broken = text.replacen("fields: {phase: RolledBack", "fields: {phase: Exploded", 1);
    assert_ne!(text, broken, "the scenario expects a RolledBack phase");
    std::fs::write(&scenario, broken).unwrap();
    let out = runbook()
        .args(["test", "-o", "json"])
        .arg(dir.join("policies/scenarios"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert!(doc["failed"].as_u64().unwrap() >= 1, "{doc}");
    let failed: Vec<&serde_json::Value> = doc["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["passed"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{doc}");
    let f = &failed[0]["failures"][0];
    assert!(
        f["line"].as_u64().is_some() && f["message"].is_string(),
        "{doc}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_single_file_checks_only_that_file() {
    let out = runbook()
        .args(["check", "policies/evaluator-drift.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    // evaluator-drift names the "default" routes, which live in another file.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no AlertRoutes named \"default\""),
        "{stderr}"
    );
    let out = runbook()
        .args(["check", "policies/backup-ordering.rhai"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_missing_path_is_an_error() {
    let out = runbook().args(["check", "no/such/dir"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/dir"));
}

#[test]
fn alerts_route_prints_the_receivers_an_alert_reaches() {
    let route = |labels: &[&str], extra: &[&str]| {
        let out = runbook()
            .args(["alerts", "route", "--routes", "policies/alert-routes.yaml"])
            .args(extra)
            .args(labels)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, stdout, _) = route(&["severity=critical", "team=ml"], &[]);
    assert_eq!(code, Some(0));
    assert_eq!(
        stdout, "events,log\n",
        "critical alerts are Events and log lines"
    );
    let (code, stdout, _) = route(&["severity=info"], &[]);
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "log\n"),
        "the root route"
    );
    let (code, _, stderr) = route(&["severity=warning"], &["--verify-receivers", "events"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("want events, got log"), "{stderr}");
    let (code, stdout, _) = route(&["severity=critical"], &["-v"]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("route.routes[0]") && stdout.contains("continue"),
        "{stdout}"
    );
    let (code, _, stderr) = route(&["severity"], &[]);
    assert_ne!(code, Some(0));
    assert!(stderr.contains("labels are name=value"), "{stderr}");
}

#[test]
fn a_user_kind_without_its_crd_is_a_guess_said_so_and_its_crd_settles_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = temp_dir("guess");
    copy_dir(
        &root.join("examples/clustered-db/policy"),
        &dir.join("policy"),
    );
    let guess = "note db.example.com/v1 DatabaseCluster (policy database-cluster): no CRD for it \
                 among the paths, so its resource is taken to be `databaseclusters`";
    // The policy alone: the plural is a guess, and both commands say so.
    let check = runbook()
        .arg("check")
        .arg(dir.join("policy"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{stdout}");
    assert!(stdout.contains(guess), "{stdout}");
    let rbac = runbook()
        .arg("rbac")
        .arg(dir.join("policy"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&rbac.stderr);
    assert!(rbac.status.success(), "{stderr}");
    assert!(
        stderr.contains("note: db.example.com/v1 DatabaseCluster"),
        "{stderr}"
    );
    // Its CRD among the paths, naming a plural no rule could guess and
    // cluster scope: nothing is guessed, and the rules follow the CRD.
    let crd = std::fs::read_to_string(root.join("examples/clustered-db/crd.yaml"))
        .unwrap()
        .replace("plural: databaseclusters", "plural: dbclusters")
        .replace("scope: Namespaced", "scope: Cluster");
    std::fs::write(dir.join("crd.yaml"), crd).unwrap();
    let rbac = runbook().arg("rbac").arg(&dir).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&rbac.stdout),
        String::from_utf8_lossy(&rbac.stderr),
    );
    assert!(!stderr.contains("note:"), "{stderr}");
    assert!(stdout.contains("- dbclusters"), "{stdout}");
    assert!(!stdout.contains("databaseclusters"), "{stdout}");
    let check = runbook().arg("check").arg(&dir).output().unwrap();
    assert!(!String::from_utf8_lossy(&check.stdout).contains("note "));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Several teams' policies on one kind: each declares the status it
/// writes; a shared field or condition, or a policy that declares none,
/// is an error at the second declaration naming the first, and routes are
/// named across every directory given.
#[test]
fn policies_sharing_a_kind_are_refused_only_where_their_status_overlaps() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = temp_dir("composition");
    let notes = dir.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let policy = |name: &str, status: &str, alerts: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata:\n  name: {name}\nspec:\n  target: {{apiVersion: runbook.dev/v1alpha1, kind: Evaluator}}\n  script: notes.rhai\n{status}{alerts}"
        )
    };
    std::fs::write(notes.join("notes.rhai"), "fn reconcile(ctx) { [] }\n").unwrap();
    let check = |paths: &[&Path]| {
        let mut cmd = runbook();
        cmd.arg("check").args(paths).current_dir(repo);
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let shipped = repo.join("policies");
    let retrain = repo.join("examples/retrain-on-drift/policy");
    // Beside the shipped drift policy and the retrain example: fine.
    let (ok, out) = check(&[&shipped, &retrain]);
    assert!(ok, "{out}");
    assert!(out.contains("ok  policy retrain-on-drift"), "{out}");

    // A condition the retrain policy declares too.
    std::fs::write(
        notes.join("notes.yaml"),
        policy(
            "notes",
            "  status:\n    conditions: [Noted, TrainingData]\n",
            "",
        ),
    )
    .unwrap();
    let (ok, out) = check(&[&shipped, &retrain, &notes]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("notes.yaml:9:25: policies \"retrain-on-drift\" (")
            && out.contains("retrain-on-drift.yaml:19:18) and \"notes\" both write condition \"TrainingData\" of runbook.dev/v1alpha1 Evaluator"),
        "{out}"
    );

    // No declaration at all: the whole status, named at spec.target.
    std::fs::write(notes.join("notes.yaml"), policy("notes", "", "")).unwrap();
    let (ok, out) = check(&[&shipped, &notes]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("notes.yaml:6:11: policies \"evaluator-drift\" (")
            && out
                .contains("both write the whole status (the second does not declare spec.status)"),
        "{out}"
    );

    // Shadow mode shares anything.
    std::fs::write(
        notes.join("notes.yaml"),
        policy("notes", "  mode: shadow\n", ""),
    )
    .unwrap();
    let (ok, out) = check(&[&shipped, &notes]);
    assert!(ok, "{out}");

    // Routes are looked up in every directory given, and a misspelt name
    // is an error where it is written.
    std::fs::write(
        notes.join("notes.yaml"),
        policy(
            "notes",
            "  status: {conditions: [Noted]}\n",
            "  alerts: defualt\n",
        ),
    )
    .unwrap();
    let (ok, out) = check(&[&shipped, &notes]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("notes.yaml:9:11: spec.alerts: no AlertRoutes named \"defualt\" is loaded (did you mean \"default\"?)"),
        "{out}"
    );
    std::fs::write(
        notes.join("notes.yaml"),
        policy(
            "notes",
            "  status: {conditions: [Noted]}\n",
            "  alerts: default\n",
        ),
    )
    .unwrap();
    let (ok, out) = check(&[&shipped, &notes]);
    assert!(ok, "routes from another directory: {out}");

    // The same routes name in two directories: both places.
    std::fs::copy(shipped.join("alert-routes.yaml"), notes.join("routes.yaml")).unwrap();
    let (ok, out) = check(&[&shipped, &notes]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("routes.yaml:")
            && out.contains("AlertRoutes \"default\" is already defined at ")
            && out.contains("alert-routes.yaml:"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Typical mistakes in a new policy are found before anything runs, each
/// at its place with what was meant: a kind no API serves (a misspelt
/// target, a wrong apiVersion), a kind a script looks up without
/// declaring it, a function that exists nowhere.
#[test]
fn a_new_policys_mistakes_are_found_before_it_runs() {
    let dir = temp_dir("mistakes");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("p.yaml"),
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: runbook.dev/v1alpha1, kind: Evalutor}\n  owns:\n    - {apiVersion: batch/v2, kind: Job}\n  mutates:\n    - {apiVersion: apps/v1, kind: StatefulSet}\n  reads:\n    - {apiVersion: example.com/v1, kind: Thing}\n  script: p.rhai\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("p.rhai"),
        "fn reconcile(ctx) {\n    let s = ctx.get(\"Statefulset\", \"db\");\n    if s == () { return [statuss(#{ phase: \"Pending\" })]; }\n    []\n}\n",
    )
    .unwrap();
    let out = runbook().arg("check").arg(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}{err}");
    let p = dir.join("p.yaml").display().to_string();
    let r = dir.join("p.rhai").display().to_string();
    for want in [
        format!(
            "{p}:5:11: spec.target: no API serves runbook.dev/v1alpha1 Evalutor: it is neither built into Kubernetes nor defined by a CRD among the paths (did you mean runbook.dev/v1alpha1 Evaluator?)"
        ),
        format!(
            "{p}:7:7: spec.owns[0]: no API serves batch/v2 Job: it is neither built into Kubernetes nor defined by a CRD among the paths (did you mean batch/v1 Job?)"
        ),
        format!(
            "{r}:2:21: kind Statefulset is not declared by this policy (declare it in owns, reads, mutates or deletes) (did you mean \"StatefulSet\"?)"
        ),
        format!(
            "{r}:3:26: no function statuss exists: the script defines none, and it is not a helper or an action (did you mean status?)"
        ),
    ] {
        assert!(err.contains(&want), "want {want}\nin:\n{err}");
    }
    // A kind of a group nothing here knows may be served by a CRD in the
    // cluster only: a note, not an error.
    assert!(!err.contains("example.com/v1 Thing"), "{err}");
    assert!(
        stdout.contains("note example.com/v1 Thing (policy p)") || err.contains("4 errors"),
        "{stdout}{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runbook rbac` warns about every Secret a receiver reads outside the
/// operator's namespace, and for a tenant's policies prints only a Role in
/// the tenant's namespace and refuses a Secret elsewhere.
#[test]
fn rbac_warns_of_secrets_elsewhere_and_confines_a_tenant() {
    let dir = temp_dir("tenant");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("notes.yaml"),
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: notes}\nspec:\n  target: {apiVersion: runbook.dev/v1alpha1, kind: Evaluator}\n  owns: [{apiVersion: batch/v1, kind: Job}]\n  reads: [{apiVersion: v1, kind: Node}]\n  script: notes.rhai\n  alerts: hooks\n",
    )
    .unwrap();
    std::fs::write(dir.join("notes.rhai"), "fn reconcile(ctx) { [] }\n").unwrap();
    let routes = |secret: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {{name: hooks}}\nspec:\n  route: {{receiver: hook}}\n  receivers:\n    - name: hook\n      webhook: {{url: {{secretKeyRef: {{{secret}}}}}}}\n"
        )
    };
    std::fs::write(
        dir.join("routes.yaml"),
        routes("name: pager, key: url, namespace: kube-system"),
    )
    .unwrap();
    let out = runbook().arg("rbac").arg(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: receiver hook of AlertRoutes hooks")
            && stderr.contains("reads Secret kube-system/pager, outside runbook-system"),
        "{stderr}"
    );
    // A tenant's: refused outright.
    let out = runbook()
        .args(["rbac", "--tenant", "team-a"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("refused: receiver hook") && stderr.contains("outside team-a"),
        "{stderr}"
    );
    // With its Secret at home: a Role and RoleBinding in team-a, nothing
    // cluster-wide, nothing of the cluster-scoped kind it reads.
    std::fs::write(dir.join("routes.yaml"), routes("name: pager, key: url")).unwrap();
    let out = runbook()
        .args(["rbac", "--tenant", "team-a"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kinds: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .collect();
    assert_eq!(
        kinds,
        ["Role", "RoleBinding", "Role", "RoleBinding"],
        "{stdout}"
    );
    assert!(!stdout.contains("nodes"), "{stdout}");
    assert!(!stdout.contains("leases"), "{stdout}");
    let docs = runbook_core::util::yaml::parse_documents(&stdout).unwrap();
    for d in &docs {
        assert_eq!(d["metadata"]["namespace"], "team-a", "{d}");
    }
    // First what the tenant's account needs: what its policies write,
    // bound to runbook-tenant in team-a.
    let account = docs[0].to_string();
    assert_eq!(docs[0]["metadata"]["name"], "runbook-tenant");
    assert!(account.contains("\"jobs\""), "{account}");
    assert!(account.contains("\"create\""), "{account}");
    assert_eq!(docs[1]["subjects"][0]["name"], "runbook-tenant");
    assert_eq!(docs[1]["subjects"][0]["namespace"], "team-a");
    // Then the operator's: acting as that account, watching, reading the
    // Secret its receivers name; never writing the tenant's objects.
    let operator = docs[2].to_string();
    assert!(operator.contains("\"impersonate\""), "{operator}");
    assert!(operator.contains("\"serviceaccounts\""), "{operator}");
    assert!(
        operator.contains("\"pager\""),
        "the Secret by name: {operator}"
    );
    assert!(!operator.contains("\"create\",\"delete\""), "{operator}");
    assert_eq!(docs[3]["subjects"][0]["name"], "runbook");
    assert_eq!(docs[2]["metadata"]["name"], "runbook-for-tenant");
    assert_eq!(docs[3]["subjects"][0]["namespace"], "runbook-system");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A status field or condition the target's CRD would prune is an error
/// at the place the policy declares it, when the CRD is among the paths;
/// the shipped example, whose policy writes only what its CRD lists, is
/// clean.
#[test]
fn status_the_targets_schema_would_prune_is_an_error_where_it_is_declared() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = repo.join("examples/scheduled-report");
    let out = runbook()
        .args(["check"])
        .arg(example.join("policy"))
        .arg(example.join("crd.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = temp_dir("pruned");
    copy_dir(&example.join("policy"), &dir);
    std::fs::copy(example.join("crd.yaml"), dir.join("crd.yaml")).unwrap();
    let yaml = dir.join("hourly-report.yaml");
    let text = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(
        &yaml,
        text.replace(
            "  script: hourly-report.rhai\n",
            "  script: hourly-report.rhai\n  status:\n    fields: [lastReport, lastRows]\n    conditions: [Ready]\n",
        ),
    )
    .unwrap();
    let out = runbook().arg("check").arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let file = yaml.display().to_string();
    assert!(
        text.contains(&format!(
            "{file}:15:26: spec.status.fields: Report's status schema has no field \"lastRows\""
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{file}:16:18: spec.status.conditions: Report's status schema has no `conditions`"
        )),
        "{text}"
    );
    // A listed field is fine, and the schedule's times are Runbook's.
    for fine in ["\"lastReport\"", "lastRunTime"] {
        assert!(!text.contains(fine), "{fine}: {text}");
    }
    assert_eq!(text.matches("status schema has no").count(), 2, "{text}");
}

/// A misspelt `ctx` property is refused when the policy is checked, with
/// the property meant, as a misspelt function is: before, it passed check
/// and failed at run time.
#[test]
fn a_misspelt_ctx_property_is_refused_with_the_one_meant() {
    let dir = temp_dir("ctx-property");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("p.yaml"),
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  script: p.rhai\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("p.rhai"),
        "fn reconcile(ctx) {\n    if ctx.dew { return []; }\n    let n = ctx.resource.metadata.name;\n    let x = ctx.params[\"a\"];\n    let p = ctx.polcy.name;\n    []\n}\n",
    )
    .unwrap();
    let out = runbook().args(["check"]).arg(&dir).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    let p = dir.join("p.rhai");
    let p = p.display();
    for want in [
        format!("{p}:2:12: ctx has no property dew: it has resource, params, now, due, "),
        format!("{p}:5:17: ctx has no property polcy (did you mean ctx.policy?)"),
    ] {
        assert!(text.contains(&want), "{want} in:\n{text}");
    }
    // The properties it has pass.
    assert!(
        !text.contains("property resource") && !text.contains("property params"),
        "{text}"
    );
}

/// A certificate watcher reading every Secret is refused by `check` as it
/// is by `rbac`, the webhook and `run` (unless each is given
/// `--allow-dangerous-kinds`); reading its one Secret by name is not, and
/// `rbac` grants that Secret alone.
#[test]
fn check_refuses_what_run_refuses_and_a_secret_read_by_name_passes() {
    let dir = temp_dir("secrets");
    std::fs::create_dir_all(&dir).unwrap();
    let policy = |reads: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: certs}}\nspec:\n  target: {{apiVersion: v1, kind: ConfigMap}}\n  {reads}\n  status: {{fields: [], conditions: []}}\n  script: certs.rhai\n"
        )
    };
    std::fs::write(
        dir.join("certs.rhai"),
        "fn reconcile(ctx) {\n    let s = ctx.get(\"Secret\", \"tls-web\");\n    []\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("certs.yaml"),
        policy("reads: [{apiVersion: v1, kind: Secret}]"),
    )
    .unwrap();
    let out = runbook().arg("check").arg(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refused: policy certs") && err.contains("reads v1 Secret"),
        "{err}"
    );
    let rbac = runbook().arg("rbac").arg(&dir).output().unwrap();
    assert!(!rbac.status.success(), "rbac refuses it too");
    let out = runbook()
        .args(["check", "--allow-dangerous-kinds"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // By name: no flag needed, and the RBAC names the Secret.
    std::fs::write(
        dir.join("certs.yaml"),
        policy("readsByName: [{apiVersion: v1, kind: Secret, names: [tls-web]}]"),
    )
    .unwrap();
    let out = runbook().arg("check").arg(&dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rbac = runbook().arg("rbac").arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&rbac.stdout);
    assert!(
        rbac.status.success(),
        "{}",
        String::from_utf8_lossy(&rbac.stderr)
    );
    let docs = runbook_core::util::yaml::parse_documents(&text).unwrap();
    let secret_rules: Vec<&serde_json::Value> = docs
        .iter()
        .flat_map(|d| d["rules"].as_array().into_iter().flatten())
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|x| x.iter().any(|v| v == "secrets"))
        })
        .collect();
    // Every rule on Secrets names them: the policy's, and the webhook's own.
    assert!(
        secret_rules.iter().all(|r| r["resourceNames"].is_array()),
        "{text}"
    );
    let read = secret_rules
        .iter()
        .find(|r| r["resourceNames"] == serde_json::json!(["tls-web"]))
        .unwrap_or_else(|| panic!("no rule for tls-web in {text}"));
    assert_eq!(read["verbs"], serde_json::json!(["get", "list", "watch"]));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The functions Runbook calls take `ctx` alone: a `deleted` or
/// `finalize` written without it (or with more) is refused where it is
/// defined, not found missing when a target is deleted.
#[test]
fn a_hook_without_its_ctx_argument_is_refused_where_it_is_defined() {
    let dir = temp_dir("hooks");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("p.yaml"),
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  script: p.rhai\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("p.rhai"),
        "fn reconcile(ctx) { [] }\n\nfn finalize(ctx, more) { [] }\n\nfn deleted() { [] }\n",
    )
    .unwrap();
    let out = runbook().arg("check").arg(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("p.rhai:3:1: fn finalize takes one argument, ctx (fn finalize(ctx)); it is defined with 2"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "p.rhai:5:1: fn deleted takes one argument, ctx (fn deleted(ctx)); it is defined with 0"
        ),
        "{stderr}"
    );
}
