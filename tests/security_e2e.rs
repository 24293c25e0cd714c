//! Nobody gets through Runbook what their own rights do not give them.
//!
//! The operator runs as its ServiceAccount with exactly the RBAC `runbook
//! rbac` derives for the shipped policies, and serves its authorship
//! webhook; people act as users holding only the rights their Roles grant
//! (impersonation on a real control plane; on the sandbox, RBAC evaluated
//! from the four RBAC kinds as a real server does). Each attack a user
//! with rights only on Runbook's objects could try through Runbook is
//! refused with a reason that user can read on their own object, and the
//! shipped workflows still work for a user who has the rights they need.

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

use std::sync::Arc;
use std::time::Duration;

use cluster::{Cluster, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kubelet::{Fate, Kubelet};
use runbook_core::kinds::KindRef;
use runbook_operator::admission::config::AUTHORSHIP_WEBHOOK;
use runbook_operator::runtime::{Operator, OperatorConfig};
use serde_json::{Value, json};
use workflows::*;

/// The MutatingWebhookConfiguration of the test's operator.
fn configuration(c: &Cluster) -> String {
    format!("runbook-{}", c.ns)
}

fn webhook_configurations(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &KindRef::new(
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
        )
        .api_resource(),
    )
}

/// Create each object of a YAML stream (or JSON list) as the administrator.
async fn create_all(c: &Cluster, docs: Vec<Value>) {
    for d in docs {
        let kind = KindRef::new(
            d["apiVersion"].as_str().unwrap(),
            d["kind"].as_str().unwrap(),
        );
        let api: Api<DynamicObject> = if kind.namespaced() {
            Api::namespaced_with(c.client.clone(), &c.ns, &kind.api_resource())
        } else {
            Api::all_with(c.client.clone(), &kind.api_resource())
        };
        let obj: DynamicObject = serde_json::from_value(d.clone()).unwrap();
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {kind} {}: {e}", d["metadata"]["name"]));
    }
}

/// What an installation of Runbook in the test's namespace holds before
/// the operator starts: its ServiceAccount with the rights `runbook rbac`
/// derives for the shipped policies, the empty Secret for the webhook's
/// certificates, and the webhook configuration (limited to the test's
/// namespace, pointing nowhere until the operator writes where it is).
async fn install(c: &Cluster) {
    install_crds(c).await;
    let set = shipped_policies();
    let opts = runbook_operator::rbac::Options {
        name: configuration(c),
        namespace: c.ns.clone(),
        service_account: "runbook".into(),
        watch_namespaces: vec![c.ns.clone()],
        policy_configmaps: false,
        webhook: Some(runbook_operator::rbac::WebhookObjects {
            configuration: configuration(c),
            secret: "runbook-webhook-tls".into(),
        }),
        ..Default::default()
    };
    let served = runbook_operator::runtime::access::served_kinds(&c.client, &set).await;
    let rbac =
        runbook_operator::rbac::render(&runbook_operator::rbac::needs(&set, &opts, &served), &opts);
    let mut docs = runbook_core::util::yaml::parse_documents(&rbac).unwrap();
    for d in &mut docs {
        if d["metadata"]["namespace"].is_string() {
            assert_eq!(d["metadata"]["namespace"], c.ns.as_str(), "{d}");
        }
    }
    docs.push(
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "runbook"}}),
    );
    docs.push(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                     "metadata": {"name": "runbook-webhook-tls"}}),
    );
    docs.push(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": configuration(c)},
        "webhooks": [{
            "name": AUTHORSHIP_WEBHOOK,
            "clientConfig": {"url": "https://127.0.0.1:1/authorship"},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["runbook.dev"],
                       "apiVersions": ["v1alpha1"], "resources": ["evaluators"], "scope": "*"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": c.ns}},
            "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 5,
        }]
    }));
    create_all(c, docs).await;
}

/// The operator, as its ServiceAccount, running the shipped policies; it
/// has written where its webhook is once this returns.
async fn start_operator(c: &Cluster) -> Arc<Operator> {
    let ns = &c.ns;
    let me = c
        .client_as(
            &format!("system:serviceaccount:{ns}:runbook"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{ns}"),
                "system:authenticated",
            ],
        )
        .await;
    start_operator_as(c, me).await
}

/// The operator acting as whoever `me` is (an SRE's own credentials, in
/// an operator run outside the cluster).
async fn start_operator_as(c: &Cluster, me: Client) -> Arc<Operator> {
    let op = support::operator_through(
        c,
        me,
        shipped_policies(),
        OperatorConfig::default(),
        Arc::new(runbook_operator::telemetry::Metrics::new()),
        Arc::new(runbook_core::alert::LogSink::default()),
    );
    op.start().await.expect("the operator starts");
    let configs = webhook_configurations(&c.client);
    eventually("the operator to announce its webhook", 60, || async {
        let Ok(cfg) = configs.get(&configuration(c)).await else {
            return false;
        };
        let hook = &cfg.data["webhooks"][0];
        hook["clientConfig"]["caBundle"].is_string()
            && hook["clientConfig"]["url"] != "https://127.0.0.1:1/authorship"
            && hook["rules"].as_array().is_some_and(|r| r.len() >= 3)
    })
    .await;
    op
}

/// Rights on Runbook's own objects and ConfigMaps: what a team member
/// who uses Runbook is given.
fn editor() -> Value {
    json!([
        {"apiGroups": ["runbook.dev"], "resources": ["evaluators", "databasebackups", "aimodels"],
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
        {"apiGroups": [""], "resources": ["configmaps"],
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
    ])
}

/// Reading the namespace's workloads, not changing them.
fn viewer() -> Value {
    json!([
        {"apiGroups": ["apps"], "resources": ["deployments", "replicasets", "statefulsets"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
    ])
}

/// A user holding `rules` in the test's namespace (a Role and its
/// binding, made by the administrator), and a client acting as them.
async fn user(c: &Cluster, name: &str, rules: &[Value]) -> Client {
    let all: Vec<Value> = rules
        .iter()
        .flat_map(|r| r.as_array().unwrap().clone())
        .collect();
    create_all(
        c,
        vec![
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": name}, "rules": all}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}]}),
        ],
    )
    .await;
    let client = c.client_as(name, &["system:authenticated"]).await;
    in_force(c, &client, &all).await;
    client
}

/// Wait until the API server grants what `rules` give (a real one's RBAC
/// follows new bindings through a cache, a moment later).
async fn in_force(c: &Cluster, client: &Client, rules: &[Value]) {
    use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
    let Some(rule) = rules.first() else { return };
    let first = |k: &str| rule[k][0].as_str().unwrap_or("").to_string();
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({
        "spec": {"resourceAttributes": {
            "namespace": c.ns, "verb": first("verbs"),
            "group": first("apiGroups"), "resource": first("resources"),
        }}
    }))
    .unwrap();
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    eventually("the user's Role in force", 30, || async {
        reviews
            .create(&PostParams::default(), &review)
            .await
            .is_ok_and(|r| r.status.is_some_and(|s| s.allowed))
    })
    .await;
}

fn runbook_api(client: &Client, c: &Cluster, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        &c.ns,
        &KindRef::new("runbook.dev/v1alpha1", kind).api_resource(),
    )
}

async fn create_as(api: &Api<DynamicObject>, obj: Value) {
    let o: DynamicObject = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &o).await.unwrap();
}

/// Condition `type_` of a target as its author reads it: (status,
/// reason, message).
async fn condition(api: &Api<DynamicObject>, name: &str, type_: &str) -> Option<[String; 3]> {
    let st = status_of(api, name).await;
    let c = st["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    let text = |k: &str| c[k].as_str().unwrap_or("").to_string();
    Some([text("status"), text("reason"), text("message")])
}

/// Wait until condition `type_` of the target is `status` for `reason`;
/// its message.
async fn said(
    api: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    let mut last = None;
    let found = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let now = condition(api, name, type_).await;
            if let Some([s, r, m]) = &now
                && s == status
                && r == reason
            {
                return m.clone();
            }
            last = now;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("{name}: no {type_}={status} ({reason}); last: {last:?}"))
}

/// Wait until the target is `Degraded` for `reason`: what it was refused
/// and why, as its author reads it.
async fn refused(api: &Api<DynamicObject>, name: &str, reason: &str) -> String {
    said(api, name, "Degraded", "True", reason).await
}

fn owner_refs(meta: &kube::api::ObjectMeta) -> usize {
    meta.owner_references.as_ref().map_or(0, Vec::len)
}

/// An AIModel named after an administrator's Service, or whose weights
/// volume is named as an administrator's PVC, and a DatabaseBackup whose
/// clean-up names an administrator's VolumeSnapshot: none of them is
/// taken over, changed or deleted, then or when the user deletes their
/// objects, and the user reads why on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_named_like_an_admins_are_never_taken_over() {
    let c = Cluster::new("sec-names").await;
    install(&c).await;
    let _op = start_operator(&c).await;
    let kubelet = Kubelet::start(&c);
    kubelet.ready("llm-");
    let editor = user(&c, "cr-editor", &[editor(), viewer()]).await;
    // The administrator's objects.
    let services: Api<Service> = c.api();
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "llm"},
                "spec": {"selector": {"app": "admin-llm"}, "ports": [{"port": 80}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let pvcs: Api<PersistentVolumeClaim> = c.api();
    pvcs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cache-weights"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &snapshot_kind().api_resource());
    create(
        &c,
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
               "metadata": {"name": "nightly-once-snap"},
               "spec": {"source": {"persistentVolumeClaimName": "cache-weights"}}}),
    )
    .await;
    // The user's objects, named to take them over.
    let models = runbook_api(&editor, &c, "AIModel");
    for (name, weights) in [("llm", Value::Null), ("cache", json!({"size": "1Gi"}))] {
        create_as(
            &models,
            json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "AIModel",
                   "metadata": {"name": name},
                   "spec": {"modelUri": "https://models.example.com/x/v1.safetensors", "servingImage": "registry.k8s.io/pause:3.9",
                            "gpusPerReplica": 1, "replicas": 1, "weights": weights}}),
        )
        .await;
    }
    let backups = runbook_api(&editor, &c, "DatabaseBackup");
    let mut backup = nightly_backup();
    backup["spec"]["pvc"] = json!("no-such-volume");
    create_as(&backups, backup).await;
    for (api, name, what) in [
        (
            &models,
            "llm",
            format!("apply of v1 Service {}/llm refused", c.ns),
        ),
        (
            &models,
            "cache",
            format!(
                "apply of v1 PersistentVolumeClaim {}/cache-weights refused",
                c.ns
            ),
        ),
        (
            &backups,
            "nightly",
            format!(
                "delete of snapshot.storage.k8s.io/v1 VolumeSnapshot {}/nightly-once-snap refused",
                c.ns
            ),
        ),
    ] {
        let message = refused(api, name, "ActionRefused").await;
        assert!(message.contains(&what), "{name}: {message}");
        assert!(
            message.contains("Runbook never takes over an object it did not make"),
            "{name}: {message}"
        );
    }
    // The model's own Deployment was made; the admin's Service untouched.
    let deployments: Api<Deployment> = c.api();
    eventually("the model's own Deployment", 60, || async {
        deployments.get("llm").await.is_ok()
    })
    .await;
    let svc = services.get("llm").await.unwrap();
    assert_eq!(
        svc.spec.unwrap().selector.unwrap()["app"],
        "admin-llm",
        "the Service still selects the admin's pods"
    );
    assert_eq!(owner_refs(&svc.metadata), 0);
    assert_eq!(
        owner_refs(&pvcs.get("cache-weights").await.unwrap().metadata),
        0
    );
    // Deleting the user's objects takes what Runbook made for them with
    // them, and nothing of the administrator's.
    for (api, name) in [(&models, "llm"), (&models, "cache"), (&backups, "nightly")] {
        api.delete(name, &Default::default()).await.unwrap();
    }
    eventually("the model's Deployment collected", 90, || async {
        deployments.get_opt("llm").await.unwrap().is_none()
    })
    .await;
    eventually("the user's objects gone", 60, || async {
        models.get_opt("llm").await.unwrap().is_none()
            && models.get_opt("cache").await.unwrap().is_none()
            && backups.get_opt("nightly").await.unwrap().is_none()
    })
    .await;
    assert!(services.get_opt("llm").await.unwrap().is_some());
    assert!(pvcs.get_opt("cache-weights").await.unwrap().is_some());
    assert!(
        snapshots
            .get_opt("nightly-once-snap")
            .await
            .unwrap()
            .is_some()
    );
    drop(kubelet);
    c.cleanup().await;
}

/// Runs the benchmark pods of Evaluators `names`, scoring by revision.
fn benchmark_kubelet(c: &Cluster, names: &[&str]) -> Kubelet {
    let kubelet = Kubelet::start(c);
    // The first rule whose prefix a pod's name has decides its fate.
    for name in names {
        kubelet.run(&format!("{name}-eval-"), |pod| {
            Some(Fate::Exit {
                code: 0,
                message: Some(score_for(pod)),
            })
        });
        kubelet.ready(&format!("{name}-"));
    }
    kubelet
}

/// Wait until Deployment `name` runs its good first release again.
async fn good_template_back(deployments: &Api<Deployment>, name: &str) {
    eventually(&format!("{name}'s good template back"), 60, || async {
        image_of(&deployments.get(name).await.unwrap()) == "registry.k8s.io/pause:3.9"
    })
    .await;
}

/// A Deployment on its bad second release, with revision 1 to go back to.
async fn released_twice(c: &Cluster, name: &str) -> Api<Deployment> {
    let deployments = model_deployment(c, name).await;
    eventually(&format!("{name} at revision 1"), 60, || async {
        revision_of(&deployments.get(name).await.unwrap()) == "1"
    })
    .await;
    release(&deployments, name, "registry.k8s.io/pause:3.10").await;
    eventually(&format!("{name} at revision 2"), 60, || async {
        revision_of(&deployments.get(name).await.unwrap()) == "2"
    })
    .await;
    deployments
}

/// The benchmark Job of Evaluator `evaluator`, once there is one.
async fn benchmark_job(jobs: &Api<Job>, evaluator: &str) -> Option<Job> {
    let prefix = format!("{evaluator}-eval-");
    jobs.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|j| {
            j.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&prefix))
        })
}

/// Evaluator `name` of Deployment `target`.
fn evaluator(name: &str, target: &str) -> Value {
    json!({
        "apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
        "metadata": {"name": name},
        "spec": {"targetRef": {"name": target}, "threshold": 0.85, "schedule": "@daily",
                 "benchmark": {"image": "busybox:1.36", "command": ["sh", "-c", BENCHMARK]}}
    })
}

/// A low score rolls a Deployment back only for an author who may patch
/// it, or when the Deployment's owner allows the Evaluator by annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_is_made_only_for_an_author_who_may_make_it() {
    let c = Cluster::new("sec-rollback").await;
    install(&c).await;
    let _op = start_operator(&c).await;
    let kubelet = benchmark_kubelet(&c, &["alpha", "beta"]);
    let deployments = released_twice(&c, "alpha").await;
    released_twice(&c, "beta").await;
    // A user who can see the Deployments but not change them, and one
    // who may also patch them.
    let viewer_user = user(&c, "cr-editor", &[editor(), viewer()]).await;
    let patch = json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]);
    let oncall = user(&c, "ml-oncall", &[editor(), viewer(), patch]).await;
    let as_editor = runbook_api(&viewer_user, &c, "Evaluator");
    let as_oncall = runbook_api(&oncall, &c, "Evaluator");
    create_as(&as_editor, evaluator("alpha", "alpha")).await;
    create_as(&as_oncall, evaluator("beta", "beta")).await;
    // The shipped workflow, for the author who may roll back.
    eventually("beta rolled back", 120, || async {
        let st = status_of(&as_oncall, "beta").await;
        st["phase"] == "RolledBack" && st["lastRollback"]["toRevision"] == 1
    })
    .await;
    good_template_back(&deployments, "beta").await;
    // The same score for the author who may not: refused, said why.
    let message = refused(&as_editor, "alpha", "NotAuthorized").await;
    for part in [
        "rollback",
        "cr-editor",
        "may not patch deployments.apps \"alpha\"",
        "runbook.dev/allow-targets=Evaluator/alpha",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert_eq!(
        image_of(&deployments.get("alpha").await.unwrap()),
        "registry.k8s.io/pause:3.10",
        "alpha is not rolled back"
    );
    assert_ne!(status_of(&as_editor, "alpha").await["phase"], "RolledBack");
    // The Deployment's owner lets this Evaluator act on it.
    deployments
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"runbook.dev/allow-targets": "Evaluator/alpha"}}}),
            ),
        )
        .await
        .unwrap();
    eventually(
        "alpha rolled back once its owner allows it",
        120,
        || async { status_of(&as_editor, "alpha").await["phase"] == "RolledBack" },
    )
    .await;
    good_template_back(&deployments, "alpha").await;
    drop(kubelet);
    c.cleanup().await;
}

/// A SubjectAccessReview the API server fails (a 503) is its failure,
/// not the author's refusal: the decision fails as the server's
/// (`ActionFailed`, "could not be checked", retried with the server's
/// backoff, never `NotAuthorized`), and once the server answers again the
/// author who may roll back gets the rollback. The first reviews a
/// decision asks are of its reads, the later ones of its writes: failing
/// several fails both. Fault injection needs the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_review_the_server_fails_is_its_failure_not_a_refusal() {
    let c = Cluster::new("sec-sar").await;
    let Some(sandbox) = c.sandbox.clone() else {
        eprintln!("skipped: fault injection needs the sandbox");
        c.cleanup().await;
        return;
    };
    install(&c).await;
    let _op = start_operator(&c).await;
    let kubelet = benchmark_kubelet(&c, &["gamma"]);
    let deployments = released_twice(&c, "gamma").await;
    let patch = json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]);
    let oncall = user(&c, "ml-oncall", &[editor(), viewer(), patch]).await;
    let as_oncall = runbook_api(&oncall, &c, "Evaluator");
    sandbox.faults().fail_next(
        6,
        Some(runbook_sandbox::ApiVerb::Create),
        Some("subjectaccessreviews"),
        503,
    );
    create_as(&as_oncall, evaluator("gamma", "gamma")).await;
    let message = said(&as_oncall, "gamma", "Degraded", "True", "ActionFailed").await;
    assert!(
        message.contains("could not be checked") && message.contains("SubjectAccessReview"),
        "{message}"
    );
    assert!(!message.contains("refused"), "{message}");
    eventually(
        "gamma rolled back once the reviews are answered",
        120,
        || async { status_of(&as_oncall, "gamma").await["phase"] == "RolledBack" },
    )
    .await;
    assert_eq!(sandbox.faults().failed(), 6);
    good_template_back(&deployments, "gamma").await;
    drop(kubelet);
    c.cleanup().await;
}

/// `runbook run --kubeconfig` with the credentials the SRE's own kubectl
/// uses: what they apply with those credentials is theirs, not
/// Runbook's, and is acted on with their rights; what another user
/// applies still gets only that user's rights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_run_with_its_users_own_credentials_acts_for_them() {
    let c = Cluster::new("sec-own").await;
    install(&c).await;
    let _op = start_operator_as(&c, c.client.clone()).await;
    let kubelet = benchmark_kubelet(&c, &["mine", "theirs"]);
    let deployments = released_twice(&c, "mine").await;
    released_twice(&c, "theirs").await;
    let as_admin = runbook_api(&c.client, &c, "Evaluator");
    create_as(&as_admin, evaluator("mine", "mine")).await;
    let viewer_user = user(&c, "cr-editor", &[editor(), viewer()]).await;
    let as_editor = runbook_api(&viewer_user, &c, "Evaluator");
    create_as(&as_editor, evaluator("theirs", "theirs")).await;
    eventually("mine rolled back, for its author", 120, || async {
        status_of(&as_admin, "mine").await["phase"] == "RolledBack"
    })
    .await;
    good_template_back(&deployments, "mine").await;
    let message = refused(&as_editor, "theirs", "NotAuthorized").await;
    assert!(message.contains("cr-editor"), "{message}");
    assert_eq!(
        image_of(&deployments.get("theirs").await.unwrap()),
        "registry.k8s.io/pause:3.10",
        "theirs is not rolled back"
    );
    drop(kubelet);
    c.cleanup().await;
}

/// The recipe of docs/running.md "Running outside the cluster", as
/// written there: `runbook run` with the user's own kubeconfig (only the
/// namespace, ports and configuration name made the test's own), and the
/// example applied with the same kubeconfig gets its benchmark Job, not
/// a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outside_the_cluster_recipe_works_as_written() {
    let c = Cluster::new("sec-outside").await;
    install_crds(&c).await;
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(repo.join("docs/running.md")).unwrap();
    let section = doc
        .split("### Running outside the cluster")
        .nth(1)
        .expect("the recipe's section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the recipe's commands");
    let run = block
        .lines()
        .find(|l| l.starts_with("runbook run "))
        .expect("a runbook run line");
    let apply = block
        .lines()
        .find(|l| l.starts_with("kubectl apply -f examples/"))
        .expect("the example's kubectl apply");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("runbook-outside-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    let args: Vec<String> = run
        .split_whitespace()
        .skip(1)
        .map(|a| a.replace("9443", &port.to_string()))
        .collect();
    let configuration = format!("runbook-{}", c.ns);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(&args)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--operator-namespace", &c.ns, "-n", &c.ns])
        .args(["--webhook-configuration", &configuration])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .current_dir(&repo)
        .env("RUNBOOK_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("runbook run");
    let _stop = cluster::Running(child);
    let configs = webhook_configurations(&c.client);
    eventually("the operator to announce its webhook", 90, || async {
        configs
            .get_opt(&configuration)
            .await
            .ok()
            .flatten()
            .is_some_and(|cfg| {
                let hook = &cfg.data["webhooks"][0];
                hook["clientConfig"]["caBundle"].is_string()
                    && hook["rules"].to_string().contains("evaluators")
            })
    })
    .await;
    // The user's kubectl, with the same kubeconfig: the files the recipe
    // names, applied as that user.
    let user_config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let me = Client::try_from(user_config).unwrap();
    let kubelet = benchmark_kubelet(&c, &["chatbot"]);
    for file in apply.split(" -f ").skip(1) {
        let text = std::fs::read_to_string(repo.join(file.trim())).unwrap();
        for doc in runbook_core::util::yaml::parse_documents(&text).unwrap() {
            let kind = KindRef::new(
                doc["apiVersion"].as_str().unwrap(),
                doc["kind"].as_str().unwrap(),
            );
            let api: Api<DynamicObject> =
                Api::namespaced_with(me.clone(), &c.ns, &kind.api_resource());
            create_as(&api, doc).await;
        }
    }
    let jobs: Api<Job> = c.api();
    let evaluators = runbook_api(&c.client, &c, "Evaluator");
    for _ in 0..900 {
        if benchmark_job(&jobs, "chatbot").await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        benchmark_job(&jobs, "chatbot").await.is_some(),
        "no benchmark Job; the Evaluator: {}",
        evaluators
            .get("chatbot")
            .await
            .map(|e| e.data.to_string())
            .unwrap_or_default()
    );
    assert_eq!(
        condition(&evaluators, "chatbot", "Degraded")
            .await
            .map(|c| c[1].clone())
            .filter(|r| r == "NotAuthorized"),
        None
    );
    drop(_stop);
    drop(kubelet);
    let _ = configs.delete(&configuration, &Default::default()).await;
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

const CERT_WATCH: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: cert-watch}
spec:
  target: {apiVersion: v1, kind: ConfigMap}
  selector: {matchLabels: {certs: watched}}
  readsByName: [{apiVersion: v1, kind: Secret, names: [tls-web]}]
  status: {fields: [], conditions: []}
  script: cert-watch.rhai
"#;

const CERT_WATCH_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let all = ctx.list("Secret").map(|s| s.metadata.name);
    let s = ctx.get("Secret", "tls-web");
    if s == () { return [event("Warning", "CertMissing", "tls-web not found")]; }
    let crt = s.data?["tls.crt"] ?? "";
    [event("Normal", "CertSeen", `tls-web: ${crt.len()} characters; listed: ${all}`)]
}
"#;

/// A certificate watcher reads one Secret by name: `runbook rbac` grants
/// get, list and watch of that Secret alone (no `--allow-dangerous-kinds`),
/// the operator runs with exactly that, watches it alone, and the
/// decision sees it and nothing else of the namespace's Secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_read_by_name_needs_only_that_secret() {
    if let Ok(filter) = std::env::var("RUNBOOK_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
    let c = Cluster::new("sec-byname").await;
    let set = support::policies(
        &c,
        &[
            ("cert-watch.yaml", CERT_WATCH),
            ("cert-watch.rhai", CERT_WATCH_SCRIPT),
        ],
    );
    assert!(
        runbook_operator::rbac::dangers(&set).is_empty(),
        "{:?}",
        runbook_operator::rbac::dangers(&set)
    );
    let opts = runbook_operator::rbac::Options {
        name: format!("runbook-{}", c.ns),
        namespace: c.ns.clone(),
        service_account: "runbook".into(),
        watch_namespaces: vec![c.ns.clone()],
        policy_configmaps: false,
        webhook: None,
        ..Default::default()
    };
    let served = runbook_operator::runtime::access::served_kinds(&c.client, &set).await;
    let rbac =
        runbook_operator::rbac::render(&runbook_operator::rbac::needs(&set, &opts, &served), &opts);
    assert!(rbac.contains("tls-web"), "{rbac}");
    let mut docs = runbook_core::util::yaml::parse_documents(&rbac).unwrap();
    // Of Secrets, only tls-web is granted.
    for d in &docs {
        for rule in d["rules"].as_array().into_iter().flatten() {
            if rule["resources"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x == "secrets"))
            {
                assert_eq!(rule["resourceNames"], json!(["tls-web"]), "{rule}");
            }
        }
    }
    docs.push(
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "runbook"}}),
    );
    create_all(&c, docs).await;
    let secrets: Api<Secret> = c.api();
    for name in ["tls-web", "db-password"] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name,
                         // Its owner lets the watcher read it for any author.
                         "annotations": {"runbook.dev/allow-targets": "ConfigMap/certs"}},
            "stringData": {"tls.crt": "-----BEGIN CERTIFICATE-----"}
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let me = c.client_of_service_account(&c.ns, "runbook").await;
    let op = Arc::new(Operator::new(
        me,
        Arc::new(runbook_core::script::ScriptEngine::default()),
        set,
        runbook_core::clock::Clock::real(),
        Arc::new(runbook_core::alert::LogSink::default()),
        Arc::new(runbook_operator::telemetry::Metrics::new()),
        OperatorConfig {
            namespace: Some(c.ns.clone()),
            operator_namespace: c.ns.clone(),
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            ..Default::default()
        },
    ));
    op.start()
        .await
        .expect("the operator starts with only the printed RBAC");
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = c.api();
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "certs", "labels": {"certs": "watched"}}}),
    )
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = c.api();
    let mut seen = String::new();
    for _ in 0..600 {
        let list = events.list(&Default::default()).await.unwrap().items;
        if let Some(e) = list
            .iter()
            .find(|e| e.reason.as_deref() == Some("CertSeen"))
        {
            seen = e.note.clone().unwrap_or_default();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen.contains("tls-web: 36 characters"),
        "no CertSeen Event: {seen:?}"
    );
    assert!(!seen.contains("db-password"), "{seen}");
    // Its watch of Secrets is healthy: nothing failed for want of rights.
    let health = op.ctx.metrics.render();
    assert!(
        !health.contains("runbook_watch_failing{watch=\"v1 Secret\"} 1"),
        "{health}"
    );
    op.shutdown(Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// What an Evaluator puts into its benchmark pod is bounded: no pod
/// template or privilege can be written into it at all, a Secret goes in
/// only for an author who may read it, the pod runs with no
/// ServiceAccount token, and what the pod reports comes back parsed, never
/// as it was written. A target written while the webhook did not answer
/// has no author, and gets nothing done for it until it is written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_benchmark_pod_gets_no_privilege_or_secret_its_author_lacks() {
    let c = Cluster::new("sec-pods").await;
    install(&c).await;
    model_deployment(&c, "alpha").await;
    // Written before the operator runs: the webhook does not answer.
    let admin_evaluators = kind_api(&c, "runbook.dev/v1alpha1", "Evaluator");
    create(&c, evaluator("early", "alpha")).await;
    let _op = start_operator(&c).await;
    let kubelet = Kubelet::start(&c);
    kubelet.run("honest-eval-", |_| {
        Some(Fate::Exit {
            code: 0,
            message: Some("password=hunter2 and no score".into()),
        })
    });
    let editor = user(&c, "cr-editor", &[editor(), viewer()]).await;
    let evaluators = runbook_api(&editor, &c, "Evaluator");
    // A pod template, a security context or a ServiceAccount is not part
    // of an Evaluator: a server-side apply is refused, and a strictly
    // validated create (kubectl's default) too.
    for (field, extra) in [
        (
            "template",
            json!({"spec": {"containers": [{"name": "x", "image": "busybox", "securityContext": {"privileged": true}}], "hostPID": true}}),
        ),
        ("securityContext", json!({"privileged": true})),
        ("serviceAccountName", json!("admin")),
    ] {
        let mut ev = evaluator("sneaky", "alpha");
        ev["spec"]["benchmark"][field] = extra;
        let err = evaluators
            .patch(
                "sneaky",
                &PatchParams::apply("kubectl").validation_strict(),
                &Patch::Apply(&ev),
            )
            .await
            .expect_err(field);
        let text = err.to_string();
        assert!(
            text.contains(&format!("{field}: field not declared in schema")),
            "{field}: {text}"
        );
        let strict = http::Request::post(format!(
            "/apis/runbook.dev/v1alpha1/namespaces/{}/evaluators?fieldValidation=Strict",
            c.ns
        ))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&ev).unwrap())
        .unwrap();
        let err = editor.request::<Value>(strict).await.expect_err(field);
        let text = err.to_string();
        assert!(
            text.contains(&format!("unknown field \"spec.benchmark.{field}\"")),
            "{field}: {text}"
        );
    }
    assert!(evaluators.get_opt("sneaky").await.unwrap().is_none());
    // A Secret the author may not read is not put into their pod.
    let secrets: Api<Secret> = c.api();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "db-password"}, "stringData": {"password": "hunter2"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let mut leaky = evaluator("leaky", "alpha");
    leaky["spec"]["benchmark"]["env"] = json!([{"name": "PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "password"}}}]);
    create_as(&evaluators, leaky).await;
    let message = refused(&evaluators, "leaky", "NotAuthorized").await;
    for part in ["cr-editor", "may not get secrets \"db-password\""] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    // An honest benchmark runs without a token or privilege, and what it
    // writes comes back only as what the policy parsed.
    let mut honest = evaluator("honest", "alpha");
    // A record written by hand is replaced by the webhook's.
    honest["metadata"]["annotations"] = json!({"runbook.dev/author": "{\"user\":\"system:admin\",\"groups\":[\"system:masters\"]}"});
    create_as(&evaluators, honest).await;
    let recorded = evaluators.get("honest").await.unwrap();
    let record = recorded.metadata.annotations.unwrap()["runbook.dev/author"].clone();
    assert!(
        record.contains("\"cr-editor\"") && !record.contains("system:admin"),
        "{record}"
    );
    let jobs: Api<Job> = c.api();
    let honest_job = || benchmark_job(&jobs, "honest");
    eventually("the honest benchmark Job", 60, || async {
        honest_job().await.is_some()
    })
    .await;
    let job = honest_job().await.unwrap();
    let pod = serde_json::to_value(job.spec.unwrap().template.spec.unwrap()).unwrap();
    assert_eq!(pod["automountServiceAccountToken"], false, "{pod}");
    for absent in ["serviceAccountName", "hostPID", "hostNetwork", "volumes"] {
        assert!(pod.get(absent).is_none(), "{absent} in {pod}");
    }
    assert!(
        pod["containers"][0].get("securityContext").is_none(),
        "{pod}"
    );
    let message = said(&evaluators, "honest", "Ready", "False", "NoScore").await;
    assert!(message.contains("not JSON"), "{message}");
    let everything = status_of(&evaluators, "honest").await.to_string();
    assert!(!everything.contains("hunter2"), "{everything}");
    let events: Api<k8s_openapi::api::events::v1::Event> = c.api();
    for e in events.list(&Default::default()).await.unwrap().items {
        let note = e.note.unwrap_or_default();
        assert!(!note.contains("hunter2"), "an Event says {note}");
    }
    for j in jobs.list(&Default::default()).await.unwrap().items {
        assert!(
            !j.metadata.name.unwrap_or_default().starts_with("leaky-"),
            "no benchmark for leaky"
        );
    }
    assert!(secrets.get("db-password").await.is_ok());
    // Written while no webhook answered: no author, nothing done for it.
    let message = refused(&admin_evaluators, "early", "NotAuthorized").await;
    let command = format!(
        "kubectl annotate evaluator.runbook.dev/early -n {} --overwrite runbook.dev/touched=",
        c.ns
    );
    assert!(message.contains("has no author record"), "{message}");
    assert!(message.contains(&command), "{message}");
    assert!(
        message.len() < 400,
        "{} characters: {message}",
        message.len()
    );
    // Said in the condition (and its kstatus twin `Stalled`) and once in
    // the decision record, not on every action of the decision.
    let status = status_of(&admin_evaluators, "early").await.to_string();
    assert_eq!(status.matches(&command).count(), 3, "{status}");
    // What the message says to run: an annotation only, written with the
    // webhook up, records its administrator as the author.
    admin_evaluators
        .patch(
            "early",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"runbook.dev/touched": "1"}}})),
        )
        .await
        .unwrap();
    eventually("early's benchmark", 60, || async {
        benchmark_job(&jobs, "early").await.is_some()
    })
    .await;
    drop(kubelet);
    c.cleanup().await;
}

/// The operator's own rights taken away under it: a write it may no longer
/// make is seen on the target (`Degraded`, reason `Forbidden`), counted in
/// `runbook_writes_forbidden_total`, and keeps `/readyz` failing within
/// seconds, naming the write (its watches, authorized when they began,
/// stay open: readiness stayed 200 for minutes); once the rights are back
/// the write goes through and the instance is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_operator_may_no_longer_make_is_seen_and_unreadies_it() {
    use k8s_openapi::api::rbac::v1::Role;
    let c = Cluster::new("sec-revoked").await;
    install(&c).await;
    let op = start_operator(&c).await;
    let reloader = Arc::new(runbook_operator::reload::Reloader::new(
        Arc::new(runbook_core::script::ScriptEngine::default()),
        Some(c.client.clone()),
        op.ctx.metrics.clone(),
        "test",
    ));
    let ready = runbook_operator::reload::readiness(&op, &reloader);
    eventually("ready", 60, || async { ready().is_ok() }).await;
    let kubelet = benchmark_kubelet(&c, &["gamma"]);
    let deployments = model_deployment(&c, "gamma").await;
    eventually("gamma at revision 1", 60, || async {
        revision_of(&deployments.get("gamma").await.unwrap()) == "1"
    })
    .await;
    // The administrator takes the operator's rights on Jobs away.
    let roles: Api<Role> = c.api();
    let granted = roles.get(&configuration(&c)).await.unwrap();
    let mut revoked = granted.clone();
    for rule in revoked.rules.iter_mut().flatten() {
        if rule
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r == "jobs"))
        {
            rule.verbs
                .retain(|v| !["create", "patch", "update"].contains(&v.as_str()));
        }
    }
    roles
        .replace(&configuration(&c), &PostParams::default(), &revoked)
        .await
        .unwrap();
    let editor = user(&c, "cr-editor", &[editor(), viewer()]).await;
    let evaluators = runbook_api(&editor, &c, "Evaluator");
    create_as(&evaluators, evaluator("gamma", "gamma")).await;
    let message = refused(&evaluators, "gamma", "Forbidden").await;
    assert!(
        message.contains("apply") && message.contains("Job"),
        "{message}"
    );
    eventually("unready, naming the refused write", 30, || async {
        ready().is_err_and(|why| why.contains("patch batch/jobs") && why.contains("403"))
    })
    .await;
    let counted = op
        .ctx
        .metrics
        .writes_forbidden
        .get_or_create(&runbook_operator::telemetry::Metrics::labels(&[
            ("verb", "patch"),
            ("resource", "batch/jobs"),
        ]))
        .get();
    assert!(counted > 0, "counted in runbook_writes_forbidden_total");
    // The rights come back: the Job is made and the instance is ready.
    let mut back = roles.get(&configuration(&c)).await.unwrap();
    back.rules = granted.rules.clone();
    roles
        .replace(&configuration(&c), &PostParams::default(), &back)
        .await
        .unwrap();
    let jobs: Api<Job> = c.api();
    eventually("the benchmark Job made once allowed", 60, || async {
        benchmark_job(&jobs, "gamma").await.is_some()
    })
    .await;
    eventually("ready again", 60, || async { ready().is_ok() }).await;
    drop(kubelet);
    c.cleanup().await;
}
