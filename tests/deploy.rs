//! Shipping: `deploy/` renders and every object in it is accepted by the
//! API server (a server-side dry-run apply), `deploy/rbac.yaml` is exactly
//! what `runbook rbac policies/` derives, the derivation follows the
//! policies, dangerous kinds are refused, and the start-up check names the
//! permission that is missing.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cluster::Cluster;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use runbook_core::kinds::KindRef;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn runbook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(args)
        .current_dir(repo())
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

fn copy_policies(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("runbook-rbac-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(repo().join("policies")).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    dir
}

fn edit(path: &Path, from: &str, to: &str) {
    let t = std::fs::read_to_string(path).unwrap();
    assert!(t.contains(from), "{} lacks {from:?}", path.display());
    std::fs::write(path, t.replacen(from, to, 1)).unwrap();
}

/// The rules of the derived roles, as (apiGroup, resource, verbs) triples.
fn rules(yaml: &str) -> Vec<(String, String, Vec<String>, String)> {
    let docs = runbook_core::util::yaml::parse_documents(yaml).unwrap();
    let mut out = Vec::new();
    for d in docs {
        let scope = format!(
            "{} {}",
            d["kind"].as_str().unwrap_or(""),
            d["metadata"]["namespace"].as_str().unwrap_or("")
        );
        for r in d["rules"].as_array().into_iter().flatten() {
            let verbs: Vec<String> = r["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            for g in r["apiGroups"].as_array().unwrap() {
                for res in r["resources"].as_array().unwrap() {
                    out.push((
                        g.as_str().unwrap().to_string(),
                        res.as_str().unwrap().to_string(),
                        verbs.clone(),
                        scope.clone(),
                    ));
                }
            }
        }
    }
    out
}

fn verbs_on(
    rules: &[(String, String, Vec<String>, String)],
    group: &str,
    resource: &str,
) -> Vec<String> {
    let mut v: Vec<String> = rules
        .iter()
        .filter(|r| r.0 == group && r.1 == resource)
        .flat_map(|r| r.2.clone())
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn deploy_rbac_is_what_the_shipped_policies_need() {
    let out = runbook(&["rbac", "policies/"]);
    assert!(out.status.success(), "{}", text(&out));
    let committed = std::fs::read_to_string(repo().join("deploy/rbac.yaml")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        committed,
        "deploy/rbac.yaml drifted from the policies; run `runbook rbac policies/ > deploy/rbac.yaml`"
    );
    let r = rules(&committed);
    // Reads only where policies only read; writes where they own.
    assert_eq!(verbs_on(&r, "", "pods"), ["get", "list", "watch"]);
    assert_eq!(
        verbs_on(&r, "batch", "jobs"),
        [
            "create", "delete", "get", "list", "patch", "update", "watch"
        ]
    );
    assert_eq!(
        verbs_on(&r, "runbook.dev", "evaluators/status"),
        ["get", "patch", "update"]
    );
    assert!(verbs_on(&r, "runbook.dev", "evaluators").contains(&"watch".to_string()));
    assert!(!verbs_on(&r, "runbook.dev", "evaluators").contains(&"create".to_string()));
    // No receiver names a Secret: only the webhook's own, by name
    // (the_webhook_rights_follow_its_flags).
    assert_eq!(verbs_on(&r, "", "secrets"), ["get", "update"]);
    assert_eq!(
        verbs_on(&r, "coordination.k8s.io", "leases"),
        ["create", "get", "patch", "update"]
    );
    assert!(
        r.iter()
            .any(|x| x.1 == "leases" && x.3 == "Role runbook-system"),
        "leases only in the operator's namespace"
    );
}

#[test]
fn a_policy_that_adds_a_kind_changes_the_rbac() {
    let dir = copy_policies("adds");
    let before = rules(&String::from_utf8_lossy(
        &runbook(&["rbac", dir.to_str().unwrap()]).stdout,
    ));
    assert!(verbs_on(&before, "networking.k8s.io", "ingresses").is_empty());
    edit(
        &dir.join("aimodel-serving.yaml"),
        "    - {apiVersion: v1, kind: Service}",
        "    - {apiVersion: v1, kind: Service}\n    - {apiVersion: networking.k8s.io/v1, kind: Ingress}",
    );
    // An alert receiver whose URL is in a Secret grants `get` on that one Secret.
    edit(
        &dir.join("alert-routes.yaml"),
        "    - name: events\n      event: {reason: RunbookAlert}",
        "    - name: events\n      event: {reason: RunbookAlert}\n    - name: pager\n      webhook: {url: {secretKeyRef: {name: ml-pager, key: url}}}",
    );
    let out = runbook(&["rbac", dir.to_str().unwrap(), "--webhook=false"]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = String::from_utf8_lossy(&out.stdout).to_string();
    let after = rules(&yaml);
    assert_eq!(
        verbs_on(&after, "networking.k8s.io", "ingresses"),
        [
            "create", "delete", "get", "list", "patch", "update", "watch"
        ]
    );
    assert_eq!(verbs_on(&after, "", "secrets"), ["get"]);
    assert!(yaml.contains("resourceNames:\n  - ml-pager"), "{yaml}");
    // Watching one namespace: Roles there, no cluster-wide access to jobs.
    let out = runbook(&["rbac", dir.to_str().unwrap(), "--watch-namespace", "ml"]);
    let scoped = rules(&String::from_utf8_lossy(&out.stdout));
    assert!(scoped.iter().any(|x| x.1 == "jobs" && x.3 == "Role ml"));
    assert!(
        !scoped
            .iter()
            .any(|x| x.1 == "jobs" && x.3.starts_with("ClusterRole"))
    );
}

/// Replicas sharing the targets need to label them, see each other's
/// Leases and publish their alerts: `runbook rbac --shards` grants that,
/// and nothing of it is granted without the flag.
#[test]
fn sharded_replicas_are_granted_what_they_need() {
    let plain = rules(&text(&runbook(&["rbac", "policies/"])));
    let out = runbook(&["rbac", "policies/", "--shards"]);
    assert!(out.status.success(), "{}", text(&out));
    let sharded = rules(&String::from_utf8_lossy(&out.stdout));
    // Each target kind of the shipped policies: its label patched.
    for target in ["evaluators", "databasebackups", "aimodels"] {
        assert!(
            !verbs_on(&plain, "runbook.dev", target).contains(&"patch".to_string()),
            "{target}"
        );
        assert!(
            verbs_on(&sharded, "runbook.dev", target).contains(&"patch".to_string()),
            "{target}"
        );
    }
    let own = |rules: &[(String, String, Vec<String>, String)], group: &str, res: &str| {
        let mut v: Vec<String> = rules
            .iter()
            .filter(|r| r.0 == group && r.1 == res && r.3 == "Role runbook-system")
            .flat_map(|r| r.2.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    assert!(!own(&plain, "coordination.k8s.io", "leases").contains(&"list".to_string()));
    assert!(own(&sharded, "coordination.k8s.io", "leases").contains(&"list".to_string()));
    let cms = own(&sharded, "", "configmaps");
    for verb in ["create", "delete", "get", "list", "patch"] {
        assert!(
            cms.contains(&verb.to_string()),
            "configmaps {verb}: {cms:?}"
        );
    }
    // Without shards, the operator's namespace's ConfigMaps are written
    // only for the last good version of each policy bundle.
    let plain_cms = own(&plain, "", "configmaps");
    for verb in ["create", "delete", "get", "patch"] {
        assert!(plain_cms.contains(&verb.to_string()), "{plain_cms:?}");
    }
}

/// The authorship webhook's rights follow `runbook run`'s flags: named
/// after its objects, gone with `--webhook=false`, never in a tenant's Role.
#[test]
fn the_webhook_rights_follow_its_flags() {
    let with = text(&runbook(&[
        "rbac",
        "policies/",
        "--webhook-secret",
        "tls-x",
        "--webhook-configuration",
        "hook-x",
    ]));
    assert!(with.contains("- tls-x\n"), "{with}");
    assert!(with.contains("- hook-x\n"), "{with}");
    assert!(with.contains("- subjectaccessreviews\n"), "{with}");
    for args in [
        vec!["rbac", "policies/", "--webhook=false"],
        vec!["rbac", "policies/", "--tenant", "team-a"],
    ] {
        let out = runbook(&args);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        for absent in [
            "runbook-webhook-tls",
            "mutatingwebhookconfigurations",
            "- subjectaccessreviews\n",
        ] {
            assert!(!t.contains(absent), "{args:?} grants {absent}: {t}");
        }
    }
}

#[test]
fn dangerous_kinds_are_refused_unless_allowed() {
    let dir = copy_policies("danger");
    edit(
        &dir.join("backup-ordering.yaml"),
        "    - {apiVersion: v1, kind: Pod}",
        "    - {apiVersion: v1, kind: Pod}\n    - {apiVersion: v1, kind: Secret}",
    );
    let out = runbook(&["rbac", dir.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("policy backup-ordering"), "{t}");
    assert!(t.contains("reads v1 Secret"), "{t}");
    assert!(out.stdout.is_empty(), "nothing is printed to apply");
    let out = runbook(&[
        "rbac",
        dir.to_str().unwrap(),
        "--allow-dangerous-kinds",
        "--webhook=false",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        verbs_on(&rules(&String::from_utf8_lossy(&out.stdout)), "", "secrets"),
        ["get", "list", "watch"]
    );
    // RBAC objects are refused too.
    edit(
        &dir.join("aimodel-serving.yaml"),
        "    - {apiVersion: v1, kind: Service}",
        "    - {apiVersion: v1, kind: Service}\n    - {apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRoleBinding}",
    );
    let t = text(&runbook(&["rbac", dir.to_str().unwrap()]));
    assert!(
        t.contains("policy aimodel-serving") && t.contains("ClusterRoleBinding"),
        "{t}"
    );
}

#[tokio::test]
async fn the_operator_refuses_a_bundle_declaring_a_dangerous_kind() {
    let dir = copy_policies("reload-danger");
    edit(
        &dir.join("backup-ordering.yaml"),
        "    - {apiVersion: v1, kind: Pod}",
        "    - {apiVersion: v1, kind: Pod}\n    - {apiVersion: v1, kind: Secret}",
    );
    let engine = std::sync::Arc::new(runbook_core::script::ScriptEngine::default());
    let metrics = std::sync::Arc::new(runbook_operator::telemetry::Metrics::new());
    let reloader =
        runbook_operator::reload::Reloader::new(engine.clone(), None, metrics.clone(), "test");
    let bundle = runbook_core::policy::Bundle::from_dir(&dir).unwrap();
    let (set, errors) = reloader.initial(vec![bundle.clone()]).await;
    assert!(set.policies.is_empty(), "the bundle is refused as a whole");
    assert!(
        errors.iter().any(|e| e.contains("policy backup-ordering")
            && e.contains("v1 Secret")
            && e.contains("--allow-dangerous-kinds")),
        "{errors:?}"
    );
    let allowed = runbook_operator::reload::Reloader::new(engine, None, metrics, "test")
        .with_dangerous_kinds(true);
    let (set, errors) = allowed.initial(vec![bundle]).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(set.policies.contains_key("backup-ordering"));
}

/// Every object `kubectl kustomize deploy/` renders, accepted by a
/// server-side dry-run apply (namespaced objects go to the test's namespace).
#[tokio::test]
async fn every_rendered_object_is_accepted_by_the_api_server() {
    let kustomize = Command::new("kubectl")
        .args(["kustomize", "deploy/"])
        .current_dir(repo())
        .output();
    let Ok(out) = kustomize else {
        eprintln!("kubectl is not installed: rendering deploy/ is not checked");
        return;
    };
    assert!(out.status.success(), "{}", text(&out));
    let docs =
        runbook_core::util::yaml::parse_documents(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    for want in [
        "Namespace",
        "ServiceAccount",
        "CustomResourceDefinition",
        "ConfigMap",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "Secret",
        "MutatingWebhookConfiguration",
    ] {
        assert!(
            kinds.contains(&want),
            "deploy/ renders no {want}: {kinds:?}"
        );
    }
    let c = Cluster::new("deploy").await;
    for d in &docs {
        let kind = KindRef::new(
            d["apiVersion"].as_str().unwrap(),
            d["kind"].as_str().unwrap(),
        );
        let name = d["metadata"]["name"].as_str().unwrap().to_string();
        let mut obj = d.clone();
        let api: Api<DynamicObject> = if kind.namespaced() {
            assert_eq!(obj["metadata"]["namespace"], "runbook-system", "{name}");
            obj["metadata"]["namespace"] = Value::String(c.ns.clone());
            Api::namespaced_with(c.client.clone(), &c.ns, &kind.api_resource())
        } else {
            Api::all_with(c.client.clone(), &kind.api_resource())
        };
        // Forced: on a cluster where another manager (an earlier install,
        // another test) owns the CRDs' fields, acceptance is the question,
        // not who owned them before.
        let applied = api
            .patch(
                &name,
                &PatchParams::apply("runbook-deploy-test").force().dry_run(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_or_else(|e| panic!("{} {name} refused: {e}", kind));
        assert_eq!(applied.metadata.name.as_deref(), Some(name.as_str()));
    }
    // The policy ConfigMap is what the operator loads: labelled, every file.
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    assert_eq!(cm["metadata"]["labels"]["runbook.dev/policy"], "true");
    for f in [
        "evaluator-drift.yaml",
        "evaluator-drift.rhai",
        "alert-routes.yaml",
        "backup-ordering.yaml",
    ] {
        assert!(cm["data"][f].is_string(), "the policy ConfigMap lacks {f}");
    }
    let dep = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &dep["spec"]["template"]["spec"];
    let ctr = &pod["containers"][0];
    assert_eq!(dep["spec"]["replicas"], 2);
    assert_eq!(ctr["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(ctr["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(ctr["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(ctr["resources"]["limits"]["memory"].is_string());
    // The authorship webhook: the configuration reaches the replicas
    // through the Service on the port they serve it on, and the names
    // the operator is granted are the objects shipped.
    let mwc = docs
        .iter()
        .find(|d| d["kind"] == "MutatingWebhookConfiguration")
        .unwrap();
    let hook = &mwc["webhooks"][0];
    assert_eq!(
        hook["name"],
        runbook_operator::admission::config::AUTHORSHIP_WEBHOOK
    );
    assert_eq!(hook["failurePolicy"], "Ignore");
    let svc_ref = &hook["clientConfig"]["service"];
    assert_eq!(
        svc_ref["path"],
        runbook_operator::admission::config::AUTHORSHIP_PATH
    );
    let svc = docs
        .iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == svc_ref["name"])
        .unwrap_or_else(|| panic!("no Service {} for the webhook", svc_ref["name"]));
    assert_eq!(svc["metadata"]["namespace"], svc_ref["namespace"]);
    let port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == svc_ref["port"])
        .expect("the Service serves the webhook's port");
    let served = ctr["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port["targetPort"])
        .expect("the container has the port the Service targets");
    let listen = ctr["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "RUNBOOK_WEBHOOK_ADDR")
        .expect("the Deployment sets RUNBOOK_WEBHOOK_ADDR");
    assert!(
        listen["value"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", served["containerPort"])),
        "{listen} {served}"
    );
    // The policy webhook: policy ConfigMaps of the operator's namespace,
    // at the same Service, as the operator would write it.
    let vwc = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("deploy/webhook.yaml ships the policy webhook");
    let endpoint = runbook_operator::admission::config::Endpoint::Service {
        namespace: svc_ref["namespace"].as_str().unwrap().into(),
        name: svc_ref["name"].as_str().unwrap().into(),
        port: svc_ref["port"].as_u64().unwrap() as u16,
    };
    let written = runbook_operator::admission::config::policies_webhook(
        Some(&vwc["webhooks"][0]),
        &endpoint,
        None,
        runbook_operator::reload::sources::BUNDLE_LABEL,
        &[svc_ref["namespace"].as_str().unwrap().to_string()],
    );
    assert_eq!(vwc["webhooks"][0], written, "as the operator keeps it");
    assert_eq!(vwc["metadata"]["name"], mwc["metadata"]["name"]);
    let secret = docs.iter().find(|d| d["kind"] == "Secret").unwrap();
    let objects = runbook_operator::rbac::WebhookObjects::default();
    assert_eq!(secret["metadata"]["name"], objects.secret.as_str());
    assert!(secret.get("data").is_none(), "the operator fills it");
    assert_eq!(mwc["metadata"]["name"], objects.configuration.as_str());
    // Granted by name, `get` and `update` only: never `create` (which
    // RBAC cannot limit to a name) nor any other Secret.
    let rbac = std::fs::read_to_string(repo().join("deploy/rbac.yaml")).unwrap();
    for (group, resource, name) in [
        ("", "secrets", &objects.secret),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            &objects.configuration,
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            &objects.configuration,
        ),
    ] {
        let mut grants = Vec::new();
        for d in runbook_core::util::yaml::parse_documents(&rbac).unwrap() {
            for r in d["rules"].as_array().into_iter().flatten() {
                let has = |k: &str, v: &str| r[k].as_array().unwrap().iter().any(|x| x == v);
                if has("apiGroups", group) && has("resources", resource) {
                    grants.push((r["verbs"].clone(), r["resourceNames"].clone()));
                }
            }
        }
        assert_eq!(
            grants,
            vec![(json!(["get", "update"]), json!([name]))],
            "deploy/rbac.yaml on {resource}"
        );
    }
    c.cleanup().await;
}

/// The start-up check asks the API server about every permission the
/// policies need and names the one that is missing. (The sandbox is told
/// to deny it; on a real cluster the test's own credentials decide, so
/// there it only checks that a full set of rights reports nothing.)
#[tokio::test]
async fn the_startup_check_names_a_missing_permission() {
    let c = Cluster::new("access").await;
    let engine = runbook_core::script::ScriptEngine::default();
    let (set, errors) = runbook_core::policy::load(
        &engine,
        &[runbook_core::policy::Bundle::from_dir(&repo().join("policies")).unwrap()],
    );
    assert!(errors.is_empty(), "{errors:?}");
    let opts = runbook_operator::rbac::Options::default();
    let served = runbook_operator::runtime::access::served_kinds(&c.client, &set).await;
    let needs = runbook_operator::rbac::needs(&set, &opts, &served);
    if let Some(sandbox) = &c.sandbox {
        let missing = runbook_operator::runtime::access::check(&c.client, &needs, None)
            .await
            .unwrap();
        assert!(missing.is_empty(), "{missing:?}");
        sandbox.faults().deny(runbook_sandbox::Denied {
            verb: runbook_sandbox::ApiVerb::Create,
            group: "batch".into(),
            resource: "jobs".into(),
            namespace: None,
        });
        let missing = runbook_operator::runtime::access::check(&c.client, &needs, None)
            .await
            .unwrap();
        assert_eq!(missing.len(), 1, "{missing:?}");
        let m = missing[0].to_string();
        assert!(m.starts_with("create jobs.batch in all namespaces"), "{m}");
        assert!(
            m.contains("policy evaluator-drift owns batch/v1 Job"),
            "{m}"
        );
        assert!(
            m.contains("policy backup-ordering owns batch/v1 Job"),
            "{m}"
        );
        // The same permission really is refused, as a real server would.
        let jobs: Api<k8s_openapi::api::batch::v1::Job> = c.api();
        let err = jobs
            .create(&Default::default(), &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "x"},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "x", "image": "busybox"}]}}}
            })).unwrap())
            .await
            .unwrap_err();
        assert_eq!(cluster::code::<()>(Err(err)), 403);
    } else {
        // Whatever the test user lacks is reported, not an error.
        runbook_operator::runtime::access::check(&c.client, &needs, None)
            .await
            .unwrap();
    }
    c.cleanup().await;
}

/// No container engine runs here, so the Dockerfile is held to the tree:
/// every path it copies exists, and its dependency-layer stubs cover every
/// crate of the workspace and every bench target Cargo.toml declares (a
/// missing one breaks the build).
#[test]
fn the_dockerfile_matches_the_tree() {
    let docker = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    for line in docker
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let parts: Vec<&str> = line.split_whitespace().collect();
        for src in &parts[1..parts.len() - 1] {
            assert!(
                repo().join(src).exists(),
                "Dockerfile copies {src}, which does not exist"
            );
        }
    }
    assert!(docker.contains("cargo build --release --locked"));
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let stubs = docker
        .lines()
        .find(|l| l.contains("for b in "))
        .expect("the bench stubs line");
    for bench in manifest.split("[[bench]]").skip(1) {
        let name = bench
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .unwrap()
            .trim_matches('"');
        assert!(
            stubs
                .split_whitespace()
                .any(|w| w.trim_end_matches(';') == name),
            "the Dockerfile stubs no benches/{name}.rs"
        );
    }
    // Every crate of the workspace has its manifest in the dependency
    // layer and a stub library there (cargo refuses a member without one).
    let crates = docker
        .lines()
        .find(|l| l.contains("for c in "))
        .expect("the crate stubs line");
    for entry in std::fs::read_dir(repo().join("crates")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        assert!(
            docker.contains(&format!("COPY crates/{name}/Cargo.toml crates/{name}/")),
            "the Dockerfile's dependency layer lacks crates/{name}/Cargo.toml"
        );
        assert!(
            crates
                .split_whitespace()
                .any(|w| w.trim_end_matches(';') == name),
            "the Dockerfile stubs no crates/{name}/src/lib.rs"
        );
    }
    assert!(docker.contains("USER 65532"), "the image runs as non-root");
}

/// `spec.deletes` grants exactly `delete` (beside reading) on its kind,
/// never create, patch or update.
#[test]
fn deletes_grant_delete_and_nothing_else() {
    let dir = copy_policies("deletes");
    let before = rules(&String::from_utf8_lossy(
        &runbook(&["rbac", dir.to_str().unwrap(), "--webhook=false"]).stdout,
    ));
    assert_eq!(verbs_on(&before, "", "pods"), ["get", "list", "watch"]);
    edit(
        &dir.join("evaluator-drift.yaml"),
        "  mutates:\n",
        "  deletes:\n    - {apiVersion: v1, kind: Pod, selector: {matchLabels: {benchmark: done}}}\n  mutates:\n",
    );
    let out = runbook(&["rbac", dir.to_str().unwrap(), "--webhook=false"]);
    assert!(out.status.success(), "{}", text(&out));
    let after = rules(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        verbs_on(&after, "", "pods"),
        ["delete", "get", "list", "watch"]
    );
}

/// A policy that makes children in other namespaces (the secret copier)
/// is refused unless the operator is started to accept it, at its place;
/// `runbook rbac` grants its owned kind in every namespace, and reading
/// namespaces, only when asked to.
#[tokio::test]
async fn other_namespaces_are_refused_unless_allowed() {
    let dir = repo().join("examples/secret-copier/policy");
    let engine = std::sync::Arc::new(runbook_core::script::ScriptEngine::default());
    let metrics = std::sync::Arc::new(runbook_operator::telemetry::Metrics::new());
    let bundle = runbook_core::policy::Bundle::from_dir(&dir).unwrap();
    let reloader = |dangerous: bool, elsewhere: bool| {
        runbook_operator::reload::Reloader::new(engine.clone(), None, metrics.clone(), "test")
            .with_dangerous_kinds(dangerous)
            .with_other_namespaces(elsewhere)
    };
    let (set, errors) = reloader(true, false).initial(vec![bundle.clone()]).await;
    assert!(set.policies.is_empty(), "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("secret-copier.yaml:18:5: spec.namespaces")
                && e.contains("--allow-other-namespaces")),
        "{errors:?}"
    );
    let (set, errors) = reloader(true, true).initial(vec![bundle]).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(set.policies.contains_key("secret-copier"));

    let path = dir.to_str().unwrap();
    let out = runbook(&["rbac", path, "--allow-dangerous-kinds", "--webhook=false"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("--allow-other-namespaces"),
        "{}",
        text(&out)
    );
    let out = runbook(&[
        "rbac",
        path,
        "--allow-dangerous-kinds",
        "--allow-other-namespaces",
        "--webhook=false",
        "--watch-namespace=default",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let granted = rules(&String::from_utf8_lossy(&out.stdout));
    let cluster: Vec<_> = granted
        .iter()
        .filter(|r| r.3.starts_with("ClusterRole "))
        .cloned()
        .collect();
    // Copies may be written in any namespace, however few are watched.
    for verb in ["create", "delete", "patch"] {
        assert!(
            verbs_on(&cluster, "", "secrets").contains(&verb.to_string()),
            "{granted:?}"
        );
    }
    assert_eq!(
        verbs_on(&cluster, "", "namespaces"),
        ["get", "list", "watch"]
    );
}

/// A policy that only watches Namespaces (Kyverno's generate, a namespace
/// monitor) is not cluster administration: its state of them is kept
/// apart, so nothing is written to a Namespace, and it needs no
/// `--allow-dangerous-kinds`. One that holds a finalizer on them writes
/// them, and does.
#[test]
fn a_namespace_target_is_dangerous_only_when_written() {
    let dir = std::env::temp_dir().join(format!("runbook-rbac-ns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("ns.yaml"),
        "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: ns}
spec:
  target: {apiVersion: v1, kind: Namespace}
  script: ns.rhai
",
    )
    .unwrap();
    std::fs::write(dir.join("ns.rhai"), "fn reconcile(ctx) { [] }\n").unwrap();
    let out = runbook(&["rbac", dir.to_str().unwrap(), "--webhook=false"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let granted = rules(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        verbs_on(&granted, "", "namespaces"),
        ["get", "list", "watch"]
    );
    assert!(
        verbs_on(&granted, "", "namespaces/status").is_empty(),
        "{t}"
    );
    std::fs::write(
        dir.join("ns.rhai"),
        "fn reconcile(ctx) { [] }\nfn finalize(ctx) { [] }\n",
    )
    .unwrap();
    let out = runbook(&["rbac", dir.to_str().unwrap(), "--webhook=false"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("target v1 Namespace: writing Nodes or Namespaces is cluster administration"),
        "{t}"
    );
}
