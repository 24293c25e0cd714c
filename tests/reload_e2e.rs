//! Hot reload: a policy ConfigMap or directory edit changes behaviour within
//! a second, a broken edit never breaks the running operator, and removing
//! a bundle touches nothing it made. Sandbox by default; a real cluster
//! with RUNBOOK_TEST_KUBECONFIG.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod operator;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cluster::{Cluster, eventually, have_kubectl, kubectl};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use operator::*;
use runbook_core::script::ScriptEngine;
use runbook_operator::reload::{self, Reloader, SourceConfig};
use runbook_operator::runtime::OperatorConfig;
use runbook_operator::telemetry::Metrics;
use serde_json::{Value, json};

fn policy_yaml(c: &Cluster, threshold: &str) -> String {
    format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: tuned}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Widget}}\n  owns: [{{apiVersion: v1, kind: ConfigMap}}]\n  script: tuned.rhai\n  params:\n    threshold: {threshold}\n",
        widget_group(c)
    )
}

const SCRIPT: &str = r#"
fn reconcile(ctx) {
    let n = ctx.resource.metadata.name;
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${n}-out` }, data: #{ threshold: `${ctx.params.threshold}` } }),
     status(#{ threshold: ctx.params.threshold })]
}
"#;

async fn status_threshold(widgets: &Api<DynamicObject>, name: &str) -> serde_json::Value {
    widgets
        .get(name)
        .await
        .map(|w| w.data["status"]["threshold"].clone())
        .unwrap_or_default()
}

async fn start(
    c: &Cluster,
    sources: SourceConfig,
) -> (Arc<runbook_operator::runtime::Operator>, Arc<Reloader>) {
    start_with(c, sources, |r| r).await
}

/// As `start`, with the reloader configured by `configure`.
async fn start_with(
    c: &Cluster,
    sources: SourceConfig,
    configure: impl FnOnce(Reloader) -> Reloader,
) -> (Arc<runbook_operator::runtime::Operator>, Arc<Reloader>) {
    let (op, reloader, errors) = start_refusing(c, sources, configure).await;
    assert!(errors.is_empty(), "{errors:?}");
    (op, reloader)
}

/// As `start_with`, returning the errors of the bundles refused at start-up.
async fn start_refusing(
    c: &Cluster,
    sources: SourceConfig,
    configure: impl FnOnce(Reloader) -> Reloader,
) -> (
    Arc<runbook_operator::runtime::Operator>,
    Arc<Reloader>,
    Vec<String>,
) {
    start_configured(c, sources, configure, OperatorConfig::default()).await
}

/// As `start_refusing`, with the operator's own settings.
async fn start_configured(
    c: &Cluster,
    sources: SourceConfig,
    configure: impl FnOnce(Reloader) -> Reloader,
    config: OperatorConfig,
) -> (
    Arc<runbook_operator::runtime::Operator>,
    Arc<Reloader>,
    Vec<String>,
) {
    let engine = Arc::new(ScriptEngine::default());
    let metrics = Arc::new(Metrics::new());
    // The test's namespace is the operator's (its bundles cluster-wide)
    // unless the test says otherwise.
    let reloader = Arc::new(configure(
        Reloader::new(engine, Some(c.client.clone()), metrics.clone(), "test")
            .with_secret_namespace(&c.ns),
    ));
    let mut bundles = Reloader::read_dirs(&sources.dirs);
    for ns in &sources.configmap_namespaces {
        bundles.extend(
            runbook_operator::reload::sources::configmap_bundles(&c.client, ns)
                .await
                .unwrap(),
        );
    }
    let (set, errors) = reloader.initial(bundles).await;
    let op = operator_with_metrics(c, set, config, metrics);
    op.start().await.unwrap();
    reload::spawn(reloader.clone(), op.clone(), sources);
    (op, reloader, errors)
}

/// Whether a `PolicyInvalid` Event on the ConfigMap `name` has a note
/// `note` accepts.
async fn policy_invalid(c: &Cluster, name: &str, note: impl Fn(&str) -> bool) -> bool {
    event_on(c, name, "PolicyInvalid", note).await
}

/// Whether an Event of `reason` on the ConfigMap `name` has a note `note`
/// accepts.
async fn event_on(c: &Cluster, name: &str, reason: &str, note: impl Fn(&str) -> bool) -> bool {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.client.clone(), &c.ns);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.note.as_deref().is_some_and(&note)
        })
}

/// Whether `text` holds `prefix` followed by `LINE:COL:`.
fn positioned(text: &str, prefix: &str) -> bool {
    text.match_indices(prefix).any(|(i, _)| {
        let rest = &text[i + prefix.len()..];
        let mut parts = rest.splitn(3, ':');
        parts.next().is_some_and(|l| l.parse::<u32>().is_ok())
            && parts.next().is_some_and(|c| c.parse::<u32>().is_ok())
    })
}

fn bundle_cm(c: &Cluster, yaml: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "tuned-policy", "labels": {"runbook.dev/policy": "true"}},
        "data": {"tuned.yaml": yaml, "tuned.rhai": SCRIPT}
    }))
    .unwrap_or_else(|e| panic!("{e}: {c:?}", c = c.ns))
}

/// The widget CRD, the tuned policy at `threshold` in a ConfigMap of the
/// test's namespace, and an operator loading it from there: the operator,
/// the widgets and the ConfigMaps.
async fn from_configmap(
    c: &Cluster,
    threshold: &str,
) -> (
    Arc<runbook_operator::runtime::Operator>,
    Api<DynamicObject>,
    Api<ConfigMap>,
) {
    checked_at_admission(c, threshold, false).await
}

/// As `from_configmap`, with the policy webhook checking policy
/// ConfigMaps as they are written when `admission`.
async fn checked_at_admission(
    c: &Cluster,
    threshold: &str,
    admission: bool,
) -> (
    Arc<runbook_operator::runtime::Operator>,
    Api<DynamicObject>,
    Api<ConfigMap>,
) {
    install_widget_crd(c).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    cms.create(
        &PostParams::default(),
        &bundle_cm(c, &policy_yaml(c, threshold)),
    )
    .await
    .unwrap();
    let (op, _reloader) = start(
        c,
        SourceConfig {
            dirs: vec![],
            configmap_namespaces: vec![c.ns.clone()],
            admission,
        },
    )
    .await;
    let widgets = Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(c));
    (op, widgets, cms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_edit_takes_effect_and_a_broken_one_does_not_break_anything() {
    let c = Cluster::new("reloadcm").await;
    let (op, widgets, cms) = from_configmap(&c, "1").await;
    create_widget(&c, &widgets, "a", json!({})).await;
    eventually("threshold 1", 30, || async {
        status_threshold(&widgets, "a").await == 1
    })
    .await;
    let v1 =
        widgets.get("a").await.unwrap().data["status"]["decisions"][0]["policyVersion"].clone();

    // Edit the threshold: the next reconcile uses it.
    let patch = |yaml: String| json!({"data": {"tuned.yaml": yaml}});
    cms.patch(
        "tuned-policy",
        &PatchParams::default(),
        &Patch::Merge(patch(policy_yaml(&c, "2"))),
    )
    .await
    .unwrap();
    eventually("threshold 2", 30, || async {
        status_threshold(&widgets, "a").await == 2
    })
    .await;
    let v2 =
        widgets.get("a").await.unwrap().data["status"]["decisions"][0]["policyVersion"].clone();
    assert_ne!(v1, v2, "the decision record names the new version");
    assert_eq!(
        cms.get("a-out").await.unwrap().data.unwrap()["threshold"],
        "2"
    );

    // Break it: the old version keeps working, the ConfigMap gets an Event with the position.
    let broken = policy_yaml(&c, "2").replace("script: tuned.rhai", "script: [tuned.rhai");
    cms.patch(
        "tuned-policy",
        &PatchParams::default(),
        &Patch::Merge(patch(broken)),
    )
    .await
    .unwrap();
    eventually("an Event on the ConfigMap naming the position", 30, || {
        policy_invalid(&c, "tuned-policy", |n| {
            positioned(n, &format!("configmap/{}/tuned-policy/tuned.yaml:", c.ns))
        })
    })
    .await;
    assert!(
        op.ctx
            .metrics
            .render()
            .contains("runbook_policy_reload_total{result=\"error\"}")
    );
    // A second, different mistake: the ConfigMap's Events show it, not
    // the first one counted twice.
    let script_error = SCRIPT.replacen("fn reconcile(ctx) {", "fn reconcile(ctx) { let x = ;", 1);
    cms.patch(
        "tuned-policy",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"data": {"tuned.yaml": policy_yaml(&c, "2"), "tuned.rhai": script_error}}),
        ),
    )
    .await
    .unwrap();
    eventually("an Event naming the script's position", 30, || {
        policy_invalid(&c, "tuned-policy", |n| {
            positioned(n, &format!("configmap/{}/tuned-policy/tuned.rhai:", c.ns))
        })
    })
    .await;
    cms.patch(
        "tuned-policy",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"tuned.rhai": SCRIPT}})),
    )
    .await
    .unwrap();
    create_widget(&c, &widgets, "b", json!({})).await;
    eventually("the last good version serves a new widget", 30, || async {
        status_threshold(&widgets, "b").await == 2
    })
    .await;

    // Fix it: the new version comes in.
    cms.patch(
        "tuned-policy",
        &PatchParams::default(),
        &Patch::Merge(patch(policy_yaml(&c, "3"))),
    )
    .await
    .unwrap();
    eventually("threshold 3 everywhere", 30, || async {
        status_threshold(&widgets, "a").await == 3 && status_threshold(&widgets, "b").await == 3
    })
    .await;

    // Delete it: nothing else is touched, nothing new is reconciled.
    let before: BTreeMap<String, String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.metadata.name.as_deref() != Some("tuned-policy"))
        // The bundle's last good version goes with it (checked below).
        .filter(|c| {
            !c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("runbook-last-good."))
        })
        .map(|c| {
            (
                c.metadata.name.unwrap(),
                c.metadata.resource_version.unwrap(),
            )
        })
        .collect();
    cms.delete("tuned-policy", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the policy to go", 30, || async {
        op.ctx.policies.load().policies.is_empty()
    })
    .await;
    create_widget(&c, &widgets, "c", json!({})).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        widgets.get("c").await.unwrap().data.get("status").is_none(),
        "no policy, no reconcile"
    );
    assert_eq!(
        status_threshold(&widgets, "a").await,
        3,
        "the old status stays"
    );
    let after: BTreeMap<String, String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.unwrap(),
                c.metadata.resource_version.unwrap(),
            )
        })
        .collect();
    assert_eq!(before, after, "the children are untouched");
    assert!(
        !after.keys().any(|n| n.starts_with("runbook-last-good.")),
        "the deleted bundle's last good version is gone: {after:?}"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// Lay a directory out as the kubelet mounts a ConfigMap: the files are
/// links into `..data`, itself a link to a timestamped directory, swapped
/// atomically on update.
fn mount(dir: &Path, generation: u32, files: &[(&str, &str)]) {
    let ts = format!("..2026_11_29_{generation:04}");
    std::fs::create_dir_all(dir.join(&ts)).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(&ts).join(name), text).unwrap();
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_reloads_on_edits_and_on_a_configmap_volume_swap() {
    let c = Cluster::new("reloaddir").await;
    install_widget_crd(&c).await;
    let dir = std::env::temp_dir().join(format!("runbook-reload-{}", c.ns));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    mount(
        &dir,
        1,
        &[
            ("tuned.yaml", &policy_yaml(&c, "1")),
            ("tuned.rhai", SCRIPT),
        ],
    );
    let (op, _reloader) = start(
        &c,
        SourceConfig {
            dirs: vec![dir.clone()],
            configmap_namespaces: vec![],
            admission: false,
        },
    )
    .await;
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(&c));
    create_widget(&c, &widgets, "a", json!({})).await;
    eventually("threshold 1", 30, || async {
        status_threshold(&widgets, "a").await == 1
    })
    .await;
    // The kubelet's symlink swap.
    mount(
        &dir,
        2,
        &[
            ("tuned.yaml", &policy_yaml(&c, "2")),
            ("tuned.rhai", SCRIPT),
        ],
    );
    eventually("threshold 2 after the swap", 30, || async {
        status_threshold(&widgets, "a").await == 2
    })
    .await;
    // A broken swap keeps version 2 serving.
    mount(
        &dir,
        3,
        &[
            (
                "tuned.yaml",
                &policy_yaml(&c, "2").replace("target:", "targt:"),
            ),
            ("tuned.rhai", SCRIPT),
        ],
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        op.ctx
            .metrics
            .render()
            .contains("runbook_policy_reload_total{result=\"error\"}")
    );
    assert_eq!(op.ctx.policies.load().policies.len(), 1);
    // An editor writing through a temporary file into a plain directory.
    let plain = std::env::temp_dir().join(format!("runbook-reload-plain-{}", c.ns));
    let _ = std::fs::remove_dir_all(&plain);
    std::fs::create_dir_all(&plain).unwrap();
    let other = policy_yaml(&c, "4")
        .replace("name: tuned", "name: tuned-other")
        .replace(
            "kind: Widget}",
            "kind: Widget}\n  selector: {matchLabels: {tier: b}}",
        );
    std::fs::write(plain.join("tuned.rhai"), SCRIPT).unwrap();
    std::fs::write(plain.join(".other.yaml.swp"), &other).unwrap();
    std::fs::rename(plain.join(".other.yaml.swp"), plain.join("other.yaml")).unwrap();
    // Only the watched directory counts; this one is not watched, so the set is unchanged.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(op.ctx.policies.load().policies.len(), 1);
    // Fixing the mounted one brings version 3 in.
    mount(
        &dir,
        4,
        &[
            ("tuned.yaml", &policy_yaml(&c, "3")),
            ("tuned.rhai", SCRIPT),
        ],
    );
    eventually("threshold 3", 30, || async {
        status_threshold(&widgets, "a").await == 3
    })
    .await;
    // Deleting the files removes the policy.
    std::fs::remove_file(dir.join("tuned.yaml")).unwrap();
    eventually("the policy to go", 30, || async {
        op.ctx.policies.load().policies.is_empty()
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&plain);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_routes_naming_a_missing_secret_are_refused_until_it_exists() {
    let c = Cluster::new("reloadsecret").await;
    let routes = "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: team}\nspec:\n  route:\n    receiver: hook\n  receivers:\n    - name: hook\n      webhook:\n        url: {secretKeyRef: {name: hooks, key: url}}\n";
    let bundle = || {
        runbook_core::policy::Bundle::new(
            runbook_core::policy::Origin::ConfigMap {
                namespace: c.ns.clone(),
                name: "routes".into(),
            },
            [("routes.yaml".to_string(), routes.to_string())].into(),
        )
    };
    let reloader = Reloader::new(
        Arc::new(ScriptEngine::default()),
        Some(c.client.clone()),
        Arc::new(Metrics::new()),
        "test",
    )
    .with_secret_namespace(&c.ns);
    let (set, errors) = reloader.initial(vec![bundle()]).await;
    assert!(set.routes.is_empty());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].ends_with(&format!(
            "routes.yaml:10:29: receiver \"hook\": Secret {}/hooks does not exist",
            c.ns
        )),
        "{errors:?}"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.client.clone(), &c.ns);
    let s = serde_json::from_value(
        json!({"metadata": {"name": "hooks"}, "stringData": {"other": "x"}}),
    )
    .unwrap();
    secrets.create(&PostParams::default(), &s).await.unwrap();
    let reloader = Reloader::new(
        Arc::new(ScriptEngine::default()),
        Some(c.client.clone()),
        Arc::new(Metrics::new()),
        "test",
    )
    .with_secret_namespace(&c.ns);
    let (_, errors) = reloader.initial(vec![bundle()]).await;
    assert!(errors[0].ends_with("has no key \"url\""), "{errors:?}");
    // Credentials before the host would be dropped silently by the HTTP
    // client: refused, saying where a token goes, without echoing it.
    secrets
        .patch(
            "hooks",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"stringData": {"url": "https://bot:hunter2@hooks.example.com/x"}}),
            ),
        )
        .await
        .unwrap();
    let (_, errors) = reloader.initial(vec![bundle()]).await;
    assert!(
        errors[0].contains("key \"url\": the URL holds credentials")
            && errors[0].contains("path or query")
            && !errors[0].contains("hunter2"),
        "{errors:?}"
    );
    secrets
        .patch(
            "hooks",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"url": "https://hooks.example.com/x"}})),
        )
        .await
        .unwrap();
    let (set, errors) = reloader.initial(vec![bundle()]).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(set.routes.contains_key("team"));
    c.cleanup().await;
}

/// An edit whose policies need a permission the operator lacks is refused
/// like a broken edit, naming the permission; the last good version keeps
/// serving. (The sandbox is told to deny it; on a real cluster the test's
/// credentials decide, so the test runs on the sandbox only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_needing_a_missing_permission_is_refused() {
    let c = Cluster::new("reloadrbac").await;
    let Some(sandbox) = c.sandbox.clone() else {
        eprintln!("skipped on a real cluster: permissions cannot be taken away there");
        return;
    };
    install_widget_crd(&c).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    cms.create(
        &PostParams::default(),
        &bundle_cm(&c, &policy_yaml(&c, "1")),
    )
    .await
    .unwrap();
    let (op, _reloader) = start_with(
        &c,
        SourceConfig {
            dirs: vec![],
            configmap_namespaces: vec![c.ns.clone()],
            admission: false,
        },
        |r| r.with_secret_namespace(&c.ns).with_access_check(true),
    )
    .await;
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(&c));
    create_widget(&c, &widgets, "a", json!({})).await;
    eventually("threshold 1", 30, || async {
        status_threshold(&widgets, "a").await == 1
    })
    .await;

    // The operator may not create CronJobs; the edit makes the policy own them.
    for verb in [
        runbook_sandbox::ApiVerb::Create,
        runbook_sandbox::ApiVerb::Delete,
    ] {
        sandbox.faults().deny(runbook_sandbox::Denied {
            verb,
            group: "batch".into(),
            resource: "cronjobs".into(),
            namespace: None,
        });
    }
    let greedy = policy_yaml(&c, "2").replace(
        "owns: [{apiVersion: v1, kind: ConfigMap}]",
        "owns: [{apiVersion: v1, kind: ConfigMap}, {apiVersion: batch/v1, kind: CronJob}]",
    );
    cms.patch(
        "tuned-policy",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"tuned.yaml": greedy}})),
    )
    .await
    .unwrap();
    eventually("an Event naming the missing permission", 30, || {
        policy_invalid(&c, "tuned-policy", |n| {
            // One line for the resource, with every verb it lacks.
            n.contains("the operator may not create, delete cronjobs.batch")
                && n.matches("cronjobs.batch").count() == 1
                && n.contains("policy tuned owns batch/v1 CronJob")
        })
    })
    .await;
    create_widget(&c, &widgets, "b", json!({})).await;
    eventually("the last good version serves a new widget", 30, || async {
        status_threshold(&widgets, "b").await == 1
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// A bundle refused for a cause in the cluster (here a Secret its alert
/// routes name does not exist yet) is tried again without an edit, and
/// loads once the cause is mended; until then nothing of it runs and the
/// instance is not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_refused_for_a_missing_secret_loads_once_it_exists() {
    let c = Cluster::new("reloadretry").await;
    install_widget_crd(&c).await;
    let routes = "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: team}\nspec:\n  route:\n    receiver: hook\n  receivers:\n    - name: hook\n      webhook:\n        url: {secretKeyRef: {name: hooks, key: url}}\n";
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let mut cm = bundle_cm(&c, &policy_yaml(&c, "1"));
    cm.data
        .as_mut()
        .unwrap()
        .insert("routes.yaml".into(), routes.into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let (op, reloader, errors) = start_refusing(
        &c,
        SourceConfig {
            dirs: vec![],
            configmap_namespaces: vec![c.ns.clone()],
            admission: false,
        },
        |r| r.with_secret_namespace(&c.ns),
    )
    .await;
    assert!(
        errors
            .iter()
            .any(|e| e.contains("Secret") && e.contains("hooks")),
        "{errors:?}"
    );
    assert!(op.ctx.policies.load().policies.is_empty());
    assert_eq!(
        reloader.never_loaded().len(),
        1,
        "not ready: nothing of it runs"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.client.clone(), &c.ns);
    let s = serde_json::from_value(
        json!({"metadata": {"name": "hooks"}, "stringData": {"url": "http://127.0.0.1:9/hook"}}),
    )
    .unwrap();
    secrets.create(&PostParams::default(), &s).await.unwrap();
    eventually("the bundle to load without an edit", 30, || async {
        op.ctx.policies.load().policies.contains_key("tuned")
    })
    .await;
    assert!(reloader.never_loaded().is_empty());
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_watch_is_told_on_the_policy_configmap_and_its_recovery_too() {
    let c = Cluster::new("watchtell").await;
    install_widget_crd(&c).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    cms.create(
        &PostParams::default(),
        &bundle_cm(&c, &policy_yaml(&c, "0.5")),
    )
    .await
    .unwrap();
    let sources = SourceConfig {
        configmap_namespaces: vec![c.ns.clone()],
        ..Default::default()
    };
    let (op, _reloader) = start(&c, sources).await;
    // Someone deletes the CRD of the policy's target: its watch answers
    // 404 from now on.
    remove_widget_crd(&c).await;
    eventually(
        "a WatchFailing Event on the policy's ConfigMap",
        60,
        || async {
            event_on(&c, "tuned-policy", "WatchFailing", |note| {
                note.contains("Widget") && note.contains("policy tuned") && note.contains("fails")
            })
            .await
        },
    )
    .await;
    install_widget_crd(&c).await;
    eventually(
        "a WatchRecovered Event once the CRD is back",
        60,
        || async {
            event_on(&c, "tuned-policy", "WatchRecovered", |note| {
                note.contains("Widget")
            })
            .await
        },
    )
    .await;
    // And the policy acts again on what the watch delivers.
    let widgets = widgets(&c);
    eventually("a widget reconciled after the recovery", 60, || async {
        let _ = widgets
            .create(&PostParams::default(), &widget(&c, "after", json!({})))
            .await;
        cms.get("after-out").await.is_ok()
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// A policy ConfigMap in a namespace other than the operator's is a
/// tenant's: its policy acts on targets in that namespace only (a Widget
/// elsewhere gets no child and no status from it), and its routes may not
/// read a Secret of another namespace (the bundle is refused, with the
/// place, in a PolicyInvalid Event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_policy_acts_only_in_its_own_namespace() {
    let c = Cluster::new("tenant").await;
    install_widget_crd(&c).await;
    let elsewhere = format!("{}-x", c.ns);
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": elsewhere}})).unwrap(),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    cms.create(
        &PostParams::default(),
        &bundle_cm(&c, &policy_yaml(&c, "7")),
    )
    .await
    .unwrap();
    // The tenant's account holds what `runbook rbac --tenant` prints for
    // the policy; the operator here is the test's administrator.
    let tenant_set = policies(
        &c,
        &[
            ("tuned.yaml", policy_yaml(&c, "7").as_str()),
            ("tuned.rhai", SCRIPT),
        ],
    );
    grant_tenant(&c, &c.ns, &tenant_set, ("kube-system", "default")).await;
    let (op, _reloader, errors) = start_configured(
        &c,
        SourceConfig {
            dirs: vec![],
            configmap_namespaces: vec![c.ns.clone()],
            admission: false,
        },
        // The operator's own namespace is another one: the test's is a tenant's.
        |r| r.with_secret_namespace(&format!("{}-ops", c.ns)),
        all_namespaces(),
    )
    .await;
    assert!(errors.is_empty(), "{errors:?}");
    let home = widgets(&c);
    let away: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &elsewhere, &widget_resource(&c));
    create_widget(&c, &home, "a", json!({})).await;
    let mut w = widget(&c, "b", json!({}));
    w.metadata.namespace = Some(elsewhere.clone());
    away.create(&PostParams::default(), &w).await.unwrap();
    eventually("the tenant's own Widget reconciled", 30, || async {
        status_threshold(&home, "a").await == 7
    })
    .await;
    settle(&op).await;
    let b = away.get("b").await.unwrap();
    assert!(
        b.data.get("status").is_none_or(|s| s.is_null()),
        "{:?}",
        b.data
    );
    let away_cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &elsewhere);
    assert!(away_cms.get_opt("b-out").await.unwrap().is_none());
    // Routes reading the operator namespace's Secret: refused at its place.
    let routes = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {{name: team}}\nspec:\n  route: {{receiver: hook}}\n  receivers:\n    - name: hook\n      webhook: {{url: {{secretKeyRef: {{name: alerting, key: url, namespace: {}-ops}}}}}}\n",
        c.ns
    );
    cms.patch(
        "tuned-policy",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"routes.yaml": routes}})),
    )
    .await
    .unwrap();
    eventually("the refusal of the routes, with its place", 30, || {
        policy_invalid(&c, "tuned-policy", |n| {
            positioned(n, &format!("configmap/{}/tuned-policy/routes.yaml:", c.ns))
                && n.contains("may read Secrets only in")
        })
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    let _ = nss.delete(&elsewhere, &DeleteParams::default()).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// A storm of edits to one policy ConfigMap is loaded once per burst, the
/// newest version each time: 30 edits sent back to back are swapped in a
/// few times at most (each edit was loaded in turn, one wave of
/// reconciles per edit, the last one in force long after the storm), and
/// the last edit is what every target runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_edits_is_loaded_as_its_newest_version() {
    let c = Cluster::new("reloadstorm").await;
    let (op, widgets, cms) = from_configmap(&c, "0").await;
    for name in ["a", "b", "c"] {
        create_widget(&c, &widgets, name, json!({})).await;
    }
    eventually("threshold 0 everywhere", 30, || async {
        for name in ["a", "b", "c"] {
            if status_threshold(&widgets, name).await != 0 {
                return false;
            }
        }
        true
    })
    .await;
    let swapped = || {
        op.ctx
            .metrics
            .policy_reloads
            .get_or_create(&Metrics::labels(&[("result", "ok")]))
            .get()
    };
    let before = swapped();
    for i in 1..=30 {
        cms.patch(
            "tuned-policy",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"tuned.yaml": policy_yaml(&c, &i.to_string())}})),
        )
        .await
        .unwrap();
    }
    eventually("the last edit in force everywhere", 30, || async {
        for name in ["a", "b", "c"] {
            if status_threshold(&widgets, name).await != 30 {
                return false;
            }
        }
        true
    })
    .await;
    op.settle(Duration::from_millis(300), Duration::from_secs(10))
        .await;
    let loads = swapped() - before;
    assert!(
        (1..=5).contains(&loads),
        "30 edits were loaded {loads} times"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// The ValidatingWebhookConfigurations of the cluster.
fn validating_configurations(c: &Cluster) -> Api<DynamicObject> {
    Api::all_with(
        c.client.clone(),
        &runbook_core::kinds::KindRef::new(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
        )
        .api_resource(),
    )
}

/// A CRD of the test's own group: `Gizmo`, its object any shape.
fn gizmo_crd(c: &Cluster) -> Value {
    let g = widget_group(c);
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("gizmos.{g}")},
        "spec": {
            "group": g, "scope": "Namespaced",
            "names": {"kind": "Gizmo", "plural": "gizmos", "singular": "gizmo"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    })
}

/// With the policy webhook on, `kubectl apply` of a broken policy is
/// refused, printing each error at its place (a Rhai syntax error, an
/// enforcing policy that claims what another one already writes), and
/// `--dry-run=server` gives the same verdict without writing anything; a
/// good policy is accepted and loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_policy_is_refused_at_kubectl_apply() {
    if !have_kubectl() {
        return;
    }
    let c = Cluster::new("admitpol").await;
    let (op, _widgets, cms) = checked_at_admission(&c, "0.5", true).await;
    let configurations = validating_configurations(&c);
    let name = format!("runbook-{}", c.ns);
    eventually("the policy webhook's configuration", 30, || async {
        configurations.get(&name).await.is_ok_and(|v| {
            v.data["webhooks"][0]["name"] == runbook_operator::admission::policies::POLICIES_WEBHOOK
        })
    })
    .await;
    let dir = std::env::temp_dir().join(format!("runbook-admit-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    // A second enforcing policy on the widgets claiming the status field
    // `threshold` the tuned policy writes, with a script that does not parse.
    let clash = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: clash}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Widget}}\n  script: clash.rhai\n  status: {{fields: [threshold]}}\n",
        widget_group(&c)
    );
    let broken = "fn reconcile(ctx) {\n    let x = ;\n    []\n}\n";
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        policy_configmap("clash", &[("clash.yaml", &clash), ("clash.rhai", broken)]),
    )
    .unwrap();
    let bad_path = bad.to_str().unwrap();
    // All three in one ConfigMap: one answer names each at its place.
    let misspelt = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: typo}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Widgets}}\n  mode: shadow\n  script: typo.rhai\n",
        widget_group(&c)
    );
    let parsing = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: parsing}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Widget}}\n  mode: shadow\n  script: parsing.rhai\n",
        widget_group(&c)
    );
    let fine_script = "fn reconcile(ctx) {\n    []\n}\n";
    let all_three = dir.join("three.json");
    std::fs::write(
        &all_three,
        policy_configmap(
            "three",
            &[
                ("clash.yaml", &clash),
                ("clash.rhai", fine_script),
                ("parsing.yaml", &parsing),
                ("parsing.rhai", broken),
                ("typo.yaml", &misspelt),
                ("typo.rhai", fine_script),
            ],
        ),
    )
    .unwrap();
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &c.ns,
        &["apply", "-f", all_three.to_str().unwrap()],
    );
    assert!(!ok, "a policy with three errors was accepted: {out}");
    assert!(
        err.contains("Runbook refuses this policy (3 errors)"),
        "{err}"
    );
    for place in [
        format!("configmap/{}/three/parsing.rhai:2:13: ", c.ns),
        format!("configmap/{}/three/typo.yaml:5:11: spec.target", c.ns),
        format!("configmap/{}/three/clash.yaml:7:11", c.ns),
    ] {
        assert!(err.contains(&place), "no {place} in {err}");
    }
    for dry_run in [true, false] {
        let mut args = vec!["apply", "-f", bad_path];
        if dry_run {
            args.push("--dry-run=server");
        }
        let (ok, out, err) = kubectl(&kubeconfig, &c.ns, &args);
        assert!(!ok, "{args:?} was accepted: {out}");
        let place = format!("configmap/{}/clash/clash.rhai:2:", c.ns);
        assert!(err.contains("Runbook refuses this policy"), "{err}");
        assert!(err.contains(&place), "{args:?}: no {place} in {err}");
        assert!(
            cms.get_opt("clash").await.unwrap().is_none(),
            "nothing was written"
        );
    }
    // Fixed, the script parses; its claim on the widgets' status still
    // clashes with the tuned policy, which writes the whole status.
    let fixed = "fn reconcile(ctx) {\n    []\n}\n";
    std::fs::write(
        &bad,
        policy_configmap("clash", &[("clash.yaml", &clash), ("clash.rhai", fixed)]),
    )
    .unwrap();
    let (ok, out, err) = kubectl(&kubeconfig, &c.ns, &["apply", "-f", bad_path]);
    assert!(!ok, "a conflicting claim was accepted: {out}");
    assert!(err.contains("both write the whole status"), "{err}");
    let places = [
        format!("configmap/{}/clash/clash.yaml:7:11", c.ns),
        format!("configmap/{}/tuned-policy/tuned.yaml:5:11", c.ns),
    ];
    for place in places {
        assert!(err.contains(&place), "no {place} in {err}");
    }
    // A misspelt kind: no API serves it, said at its place with the kind
    // the group serves.
    let typo = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: typo}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Widgets}}\n  mode: shadow\n  script: typo.rhai\n",
        widget_group(&c)
    );
    std::fs::write(
        &bad,
        policy_configmap("typo", &[("typo.yaml", &typo), ("typo.rhai", fixed)]),
    )
    .unwrap();
    let (ok, out, err) = kubectl(&kubeconfig, &c.ns, &["apply", "-f", bad_path]);
    assert!(!ok, "a misspelt kind was accepted: {out}");
    let place = format!("configmap/{}/typo/typo.yaml:5:11: spec.target", c.ns);
    assert!(err.contains(&place), "no {place} in {err}");
    let meant = format!("(did you mean {}/v1 Widget?)", widget_group(&c));
    assert!(err.contains(&meant), "no {meant} in {err}");
    // A good policy goes through and is loaded, with a warning: the
    // status field it declares is not in its target's schema, and the
    // one it lists is near.
    let good = dir.join("good.json");
    operator::install_mirror_crd(&c).await;
    let own = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: fine}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Mirror}}\n  mode: shadow\n  status: {{fields: [valeu]}}\n  script: fine.rhai\n",
        widget_group(&c)
    );
    std::fs::write(
        &good,
        policy_configmap("fine", &[("fine.yaml", &own), ("fine.rhai", fixed)]),
    )
    .unwrap();
    let (ok, out, err) = kubectl(&kubeconfig, &c.ns, &["apply", "-f", good.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let warning = format!(
        "Warning: configmap/{}/fine/fine.yaml:7:21: spec.status.fields: Mirror's status schema has no field \"valeu\" (did you mean \"value\"?)",
        c.ns
    );
    assert!(err.contains(&warning), "no {warning} in {err}");
    eventually("the good policy loaded", 30, || async {
        op.ctx.policies.load().policies.contains_key("fine")
    })
    .await;
    // A CRD and a policy on its kind in one `kubectl apply`: the check
    // waits for the new kind to be served rather than refuse the policy.
    let together = dir.join("together.json");
    let gizmos = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: gizmos}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Gizmo}}\n  mode: shadow\n  script: fine.rhai\n",
        widget_group(&c)
    );
    let cm: Value = serde_json::from_str(&policy_configmap(
        "gizmos",
        &[("gizmos.yaml", &gizmos), ("fine.rhai", fixed)],
    ))
    .unwrap();
    std::fs::write(
        &together,
        json!({"apiVersion": "v1", "kind": "List", "items": [gizmo_crd(&c), cm]}).to_string(),
    )
    .unwrap();
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &c.ns,
        &["apply", "-f", together.to_str().unwrap()],
    );
    assert!(ok, "a policy applied with its CRD was refused: {out}{err}");
    eventually("the policy applied with its CRD loaded", 30, || async {
        op.ctx.policies.load().policies.contains_key("gizmos")
    })
    .await;
    // With no replica answering, the failure policy (Ignore) lets an
    // edit through unchecked; the next operator refuses it at load.
    op.shutdown(Duration::from_secs(1)).await;
    std::fs::write(
        &bad,
        policy_configmap("clash", &[("clash.yaml", &clash), ("clash.rhai", broken)]),
    )
    .unwrap();
    let (ok, out, err) = kubectl(&kubeconfig, &c.ns, &["apply", "-f", bad_path]);
    assert!(ok, "refused with the operator down: {out}{err}");
    let sources = SourceConfig {
        configmap_namespaces: vec![c.ns.clone()],
        admission: true,
        ..Default::default()
    };
    let (_next, _reloader, errors) = start_refusing(&c, sources, |r| r).await;
    let place = format!("configmap/{}/clash/clash.rhai:2:13", c.ns);
    assert!(errors.iter().any(|e| e.contains(&place)), "{errors:?}");
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

/// The policy webhook reached through a Service, as an install reaches
/// it: the API server resolves the Service (here an `ExternalName` one
/// naming the loopback address the test's operator listens on) and checks
/// that the certificate names `<service>.<namespace>.svc`. With the
/// operator and its Service gone, the webhook cannot be called and its
/// failure policy (`Ignore`) lets the edit through, to be checked at load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_webhook_is_reached_through_its_service() {
    if !have_kubectl() {
        return;
    }
    let c = Cluster::new("admitsvc").await;
    install_widget_crd(&c).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let services: Api<k8s_openapi::api::core::v1::Service> = c.api();
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "runbook-webhook"},
        "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let webhook = runbook_operator::runtime::WebhookConfig {
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        endpoint: Some(runbook_operator::admission::config::Endpoint::Service {
            namespace: c.ns.clone(),
            name: "runbook-webhook".into(),
            port,
        }),
        ..operator::test_webhook(&c)
    };
    let sources = SourceConfig {
        configmap_namespaces: vec![c.ns.clone()],
        admission: true,
        ..Default::default()
    };
    let config = OperatorConfig {
        webhook: Some(webhook),
        ..Default::default()
    };
    let (op, _reloader, errors) = start_configured(&c, sources, |r| r, config).await;
    assert!(errors.is_empty(), "{errors:?}");
    let configurations = validating_configurations(&c);
    let name = format!("runbook-{}", c.ns);
    eventually("the policy webhook pointed at the Service", 30, || async {
        configurations.get(&name).await.is_ok_and(|v| {
            v.data["webhooks"][0]["clientConfig"]["service"]["name"] == "runbook-webhook"
        })
    })
    .await;
    let dir = std::env::temp_dir().join(format!("runbook-admit-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    let broken = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: broken}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Widget}}\n  mode: shadow\n  script: broken.rhai\n",
        widget_group(&c)
    );
    let file = dir.join("broken.json");
    std::fs::write(
        &file,
        policy_configmap(
            "broken",
            &[
                ("broken.yaml", &broken),
                ("broken.rhai", "fn reconcile(ctx) {\n    let = 1;\n}\n"),
            ],
        ),
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let (ok, out, err) = kubectl(&kubeconfig, &c.ns, &["apply", "-f", path]);
    assert!(
        !ok,
        "a broken policy was accepted through the Service: {out}"
    );
    let place = format!("configmap/{}/broken/broken.rhai:2:", c.ns);
    assert!(err.contains(&place), "no {place} in {err}");
    // The operator down and its Service gone: the call fails (a kept
    // connection no longer helps), and the failure is ignored.
    op.shutdown(Duration::from_secs(1)).await;
    services
        .delete("runbook-webhook", &Default::default())
        .await
        .unwrap();
    let (ok, out, err) = kubectl(&kubeconfig, &c.ns, &["apply", "-f", path]);
    assert!(ok, "refused with the webhook unreachable: {out}{err}");
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

/// A kind of the test's own group that no CRD defines until the test
/// installs it: `Gadget`, with a status.
fn gadget_crd(c: &Cluster) -> Value {
    let g = widget_group(c);
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("gadgets.{g}")},
        "spec": {
            "group": g, "scope": "Namespaced",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    })
}

fn gadgets(c: &Cluster) -> Api<DynamicObject> {
    let g = widget_group(c);
    let resource = kube::core::ApiResource {
        group: g.clone(),
        version: "v1".into(),
        api_version: format!("{g}/v1"),
        kind: "Gadget".into(),
        plural: "gadgets".into(),
    };
    Api::namespaced_with(c.client.clone(), &c.ns, &resource)
}

/// The Widget's `Degraded` condition: (status, reason).
async fn degraded(widgets: &Api<DynamicObject>, name: &str) -> (String, String) {
    let w = widgets.get(name).await.unwrap();
    w.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Degraded"))
        .map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .unwrap_or_default()
}

/// A policy that owns a kind no CRD defines is set aside at start-up, and
/// said so: a Warning `PolicyWaitingForKind` on its ConfigMap naming the
/// kind, `Degraded` with that reason on its targets, and
/// `runbook_policy_state` at `set_aside`. Once the CRD is installed the
/// policy loads by itself (no restart) and reconciles its targets; when
/// the CRD goes, it is set aside again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_set_aside_for_a_missing_kind_loads_once_its_crd_is_installed() {
    let c = Cluster::new("aside").await;
    install_widget_crd(&c).await;
    let g = widget_group(&c);
    let widgets = widgets(&c);
    create_widget(&c, &widgets, "w1", json!({})).await;
    let yaml = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: gadgets}}\nspec:\n  target: {{apiVersion: {g}/v1, kind: Widget}}\n  owns: [{{apiVersion: {g}/v1, kind: Gadget}}]\n  script: gadgets.rhai\n"
    );
    let script = format!(
        "fn reconcile(ctx) {{ let n = ctx.resource.metadata.name; [apply(#{{ apiVersion: \"{g}/v1\", kind: \"Gadget\", metadata: #{{ name: `${{n}}-gadget` }}, spec: #{{}} }}), status(#{{ gadgets: 1 }})] }}"
    );
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "gadget-policy", "labels": {"runbook.dev/policy": "true"}},
        "data": {"gadgets.yaml": yaml, "gadgets.rhai": script}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let sources = SourceConfig {
        configmap_namespaces: vec![c.ns.clone()],
        ..Default::default()
    };
    let (op, _reloader) = start(&c, sources).await;
    assert!(
        !op.ctx.policies.load().policies.contains_key("gadgets"),
        "the policy is not in force while Gadget is not served"
    );
    eventually(
        "a PolicyWaitingForKind Event on the ConfigMap",
        60,
        || async {
            event_on(&c, "gadget-policy", "PolicyWaitingForKind", |note| {
                note.contains(&format!("{g}/v1 Gadget")) && note.contains("kubectl apply")
            })
            .await
        },
    )
    .await;
    eventually(
        "Degraded PolicyWaitingForKind on the widget",
        60,
        || async {
            degraded(&widgets, "w1").await == ("True".into(), "PolicyWaitingForKind".into())
        },
    )
    .await;
    let bundle = format!("configmap/{}/gadget-policy", c.ns);
    let series = format!(
        "runbook_policy_state{{bundle=\"{bundle}\",policy=\"gadgets\",state=\"set_aside\"}} 1"
    );
    assert!(
        op.ctx.metrics.render().contains(&series),
        "{series} in:\n{}",
        op.ctx.metrics.render()
    );

    // The CRD arrives: the policy loads within seconds, no restart.
    let installed = std::time::Instant::now();
    support_apply_crd(&c, gadget_crd(&c)).await;
    let made = gadgets(&c);
    eventually(
        "the widget's Gadget made once the kind is served",
        60,
        || async { made.get("w1-gadget").await.is_ok() },
    )
    .await;
    println!(
        "set-aside policy in force and its target reconciled {:.1} s after its CRD was created",
        installed.elapsed().as_secs_f64()
    );
    eventually("Degraded cleared by the policy's decision", 60, || async {
        degraded(&widgets, "w1").await.1 != "PolicyWaitingForKind"
    })
    .await;
    eventually("a PolicyKindServed Event on the ConfigMap", 60, || async {
        event_on(&c, "gadget-policy", "PolicyKindServed", |note| {
            note.contains("gadgets")
        })
        .await
    })
    .await;
    let loaded = format!(
        "runbook_policy_state{{bundle=\"{bundle}\",policy=\"gadgets\",state=\"loaded\"}} 1"
    );
    eventually("runbook_policy_state at loaded", 30, || async {
        op.ctx.metrics.render().contains(&loaded)
    })
    .await;

    // The CRD goes: the policy is set aside again, with the same signals.
    let crds: Api<DynamicObject> = Api::all_with(c.client.clone(), &cluster::crd_resource());
    crds.delete(&format!("gadgets.{g}"), &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the policy set aside again once Gadget goes",
        60,
        || async {
            !op.ctx.policies.load().policies.contains_key("gadgets")
                && op.ctx.metrics.render().contains(&series)
        },
    )
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

async fn support_apply_crd(c: &Cluster, crd: Value) {
    let api: Api<DynamicObject> = Api::all_with(c.client.clone(), &cluster::crd_resource());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
}
