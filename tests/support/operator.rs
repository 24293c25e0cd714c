//! An operator running in-process against the test's cluster, with a
//! policy bound to a CRD that only the test defines.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, PostParams};
use kube::core::DynamicObject;
use runbook_core::alert::LogSink;
use runbook_core::clock::Clock;
use runbook_core::policy::{self, Bundle, Origin};
use runbook_core::script::ScriptEngine;
use runbook_operator::runtime::{Operator, OperatorConfig};
use runbook_operator::telemetry::Metrics;
use serde_json::{Value, json};

pub use super::cluster::crd_resource;
use super::cluster::{Cluster, eventually};

/// The test's own kind: `Widget` in a group named after the namespace, so
/// tests (and runs against a real cluster) never share a CRD.
pub fn widget_group(c: &Cluster) -> String {
    format!("{}.e2e.runbook.dev", c.ns)
}

pub fn widget_resource(c: &Cluster) -> ApiResource {
    let g = widget_group(c);
    ApiResource {
        group: g.clone(),
        version: "v1".into(),
        api_version: format!("{g}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

pub async fn install_widget_crd(c: &Cluster) {
    let g = widget_group(c);
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{g}")},
        "spec": {
            "group": g,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}}
            }]
        }
    }))
    .unwrap();
    let crds: Api<DynamicObject> = Api::all_with(c.client.clone(), &crd_resource());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(c));
    eventually("the Widget kind to be served", 60, || async {
        widgets.list(&Default::default()).await.is_ok()
    })
    .await;
}

/// A Mirror: a CRD shaped like third-party ones, its status a structural
/// schema of its own fields only (`value`), so the API server prunes
/// whatever else is written there.
pub async fn install_mirror_crd(c: &Cluster) -> ApiResource {
    let g = widget_group(c);
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("mirrors.{g}")},
        "spec": {
            "group": g, "scope": "Namespaced",
            "names": {"kind": "Mirror", "plural": "mirrors", "singular": "mirror"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"source": {"type": "string"}}},
                    "status": {"type": "object", "properties": {"value": {"type": "string"}}}
                }}}
            }]
        }
    }))
    .unwrap();
    let crds: Api<DynamicObject> = Api::all_with(c.client.clone(), &crd_resource());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let resource = ApiResource {
        group: g.clone(),
        version: "v1".into(),
        api_version: format!("{g}/v1"),
        kind: "Mirror".into(),
        plural: "mirrors".into(),
    };
    let mirrors: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), &c.ns, &resource);
    eventually("the Mirror kind to be served", 60, || async {
        mirrors.list(&Default::default()).await.is_ok()
    })
    .await;
    // And its schema published (a real API server does so a moment later).
    let reversed: Vec<&str> = g.split('.').rev().collect();
    let key = format!("{}.v1.Mirror", reversed.join("."));
    eventually("the Mirror schema to be published", 60, || async {
        let req = http::Request::get(format!("/openapi/v3/apis/{g}/v1"))
            .body(Vec::new())
            .unwrap();
        c.client
            .request::<Value>(req)
            .await
            .is_ok_and(|d| d["components"]["schemas"].get(&key).is_some())
    })
    .await;
    resource
}

pub async fn remove_widget_crd(c: &Cluster) {
    let crds: Api<DynamicObject> = Api::all_with(c.client.clone(), &crd_resource());
    let _ = crds
        .delete(&format!("widgets.{}", widget_group(c)), &Default::default())
        .await;
}

pub fn widget(c: &Cluster, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{}/v1", widget_group(c)), "kind": "Widget",
        "metadata": {"name": name, "namespace": c.ns}, "spec": spec
    }))
    .unwrap()
}

/// Create Widget `name` with `spec` through `widgets`.
pub async fn create_widget(c: &Cluster, widgets: &Api<DynamicObject>, name: &str, spec: Value) {
    widgets
        .create(&PostParams::default(), &widget(c, name, spec))
        .await
        .unwrap();
}

/// Policies from text; `GROUP` in the YAML is replaced with the widget group.
pub fn policies(c: &Cluster, files: &[(&str, &str)]) -> runbook_core::policy::PolicySet {
    policies_on(c, &ScriptEngine::default(), files)
}

/// Policies from text, loaded by `engine` (one with functions of its own).
pub fn policies_on(
    c: &Cluster,
    engine: &ScriptEngine,
    files: &[(&str, &str)],
) -> runbook_core::policy::PolicySet {
    let g = widget_group(c);
    let bundle = Bundle::new(
        Origin::Inline("test".into()),
        files
            .iter()
            .map(|(k, v)| (k.to_string(), v.replace("GROUP", &g)))
            .collect(),
    );
    let (set, errors) = policy::load(engine, &[bundle]);
    assert!(errors.is_empty(), "{errors:?}");
    set
}

/// The configuration of replica `id` sharing the targets with the others
/// on the ring Lease `runbook-ring` (a 2 s lease, renewed every 300 ms).
pub fn sharded(c: &Cluster, id: &str) -> OperatorConfig {
    OperatorConfig {
        lease: Some(short_lease(c, "runbook-ring", id)),
        identity: id.into(),
        shards: true,
        ..Default::default()
    }
}

/// A Lease in the test's namespace short enough for tests: 2 s, renewed
/// every 300 ms.
pub fn short_lease(
    c: &Cluster,
    name: &str,
    id: &str,
) -> runbook_operator::runtime::leader::LeaseConfig {
    runbook_operator::runtime::leader::LeaseConfig {
        namespace: c.ns.clone(),
        name: name.into(),
        identity: id.into(),
        duration: Duration::from_secs(2),
        renew_every: Duration::from_millis(300),
    }
}

pub fn operator(
    c: &Cluster,
    set: runbook_core::policy::PolicySet,
    config: OperatorConfig,
) -> Arc<Operator> {
    operator_with_metrics(c, set, config, Arc::new(Metrics::new()))
}

pub fn operator_with_metrics(
    c: &Cluster,
    set: runbook_core::policy::PolicySet,
    config: OperatorConfig,
    metrics: Arc<Metrics>,
) -> Arc<Operator> {
    operator_with_sink(c, set, config, metrics, Arc::new(LogSink::default()))
}

/// An operator whose alerts go to `sink`.
pub fn operator_with_sink(
    c: &Cluster,
    set: runbook_core::policy::PolicySet,
    config: OperatorConfig,
    metrics: Arc<Metrics>,
    sink: Arc<dyn runbook_core::alert::AlertSink>,
) -> Arc<Operator> {
    operator_through(c, c.operator_client.clone(), set, config, metrics, sink)
}

/// An operator that talks to the API server through `client` (a proxy).
pub fn operator_through(
    c: &Cluster,
    client: kube::Client,
    set: runbook_core::policy::PolicySet,
    config: OperatorConfig,
    metrics: Arc<Metrics>,
    sink: Arc<dyn runbook_core::alert::AlertSink>,
) -> Arc<Operator> {
    if std::env::var("RUNBOOK_TEST_LOG").is_ok() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                std::env::var("RUNBOOK_TEST_LOG").unwrap(),
            ))
            .with_test_writer()
            .try_init();
    }
    Arc::new(Operator::new(
        client,
        Arc::new(ScriptEngine::default()),
        set,
        Clock::real(),
        sink,
        metrics,
        test_config(c, config),
    ))
}

/// An operator whose scripts run on `engine` (one with functions of its
/// own; the policies loaded by it too).
pub fn operator_on(
    c: &Cluster,
    engine: ScriptEngine,
    set: runbook_core::policy::PolicySet,
    config: OperatorConfig,
) -> Arc<Operator> {
    Arc::new(Operator::new(
        c.operator_client.clone(),
        Arc::new(engine),
        set,
        Clock::real(),
        Arc::new(LogSink::default()),
        Arc::new(Metrics::new()),
        test_config(c, config),
    ))
}

/// A test's operator settings: its own namespace and webhook, short
/// backoffs, unless the test chose otherwise.
fn test_config(c: &Cluster, config: OperatorConfig) -> OperatorConfig {
    // Short backoffs, unless the test chose its own.
    let defaults = OperatorConfig::default();
    let webhook = config.webhook.clone().or_else(|| Some(test_webhook(c)));
    OperatorConfig {
        webhook,
        // The test's namespace, unless the test asked for all of them.
        namespace: match config.namespace.as_deref() {
            Some("") => None,
            Some(ns) => Some(ns.to_string()),
            None => Some(c.ns.clone()),
        },
        backoff_base: if config.backoff_base == defaults.backoff_base {
            Duration::from_millis(50)
        } else {
            config.backoff_base
        },
        backoff_max: if config.backoff_max == defaults.backoff_max {
            Duration::from_secs(2)
        } else {
            config.backoff_max
        },
        ..config
    }
}

/// The authorship webhook as tests run it: served on loopback, reached by
/// URL, its configuration named after the test's namespace and covering
/// only that namespace, its material in a Secret there (every operator
/// of the test shares it, as replicas do).
pub fn test_webhook(c: &Cluster) -> runbook_operator::runtime::WebhookConfig {
    runbook_operator::runtime::WebhookConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        endpoint: None,
        configuration: format!("runbook-{}", c.ns),
        secret: Some((c.ns.clone(), "runbook-webhook-tls".into())),
        created_with: Some(json!({"namespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In",
            "values": [c.ns.clone(), format!("{}-x", c.ns)]}]}})),
    }
}

/// Settings for an operator that reconciles every namespace (the test's
/// helpers otherwise keep it to the test's own).
pub fn all_namespaces() -> OperatorConfig {
    OperatorConfig {
        namespace: Some(String::new()),
        ..Default::default()
    }
}

pub async fn settle(op: &Operator) {
    op.settle(Duration::from_millis(150), Duration::from_secs(20))
        .await;
}

/// The test's Widgets, through the test's own client.
pub fn widgets(c: &Cluster) -> Api<DynamicObject> {
    Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(c))
}

/// An operator running the policies in `files` (default settings), started.
pub async fn started(c: &Cluster, files: &[(&str, &str)]) -> Arc<Operator> {
    let op = operator(c, policies(c, files), OperatorConfig::default());
    op.start().await.expect("the operator starts");
    op
}

/// What `runbook rbac --tenant TENANT` prints for `set`, created as the
/// tenant's administrator would: the account the tenant's policies act as
/// (`runbook-tenant`), its Role and binding, and the operator's Role there
/// bound to the operator's ServiceAccount `operator` (namespace, name).
pub async fn grant_tenant(
    c: &Cluster,
    tenant: &str,
    set: &runbook_core::policy::PolicySet,
    operator: (&str, &str),
) {
    let opts = runbook_operator::rbac::Options {
        name: format!("runbook-{}", c.ns),
        namespace: operator.0.to_string(),
        service_account: operator.1.to_string(),
        tenant: Some(tenant.to_string()),
        ..Default::default()
    };
    let served = runbook_operator::runtime::access::served_kinds(&c.client, set).await;
    let rbac =
        runbook_operator::rbac::render(&runbook_operator::rbac::needs(set, &opts, &served), &opts);
    let mut docs = runbook_core::util::yaml::parse_documents(&rbac).unwrap();
    docs.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": opts.tenant_account, "namespace": tenant}}));
    for d in docs {
        let kind = runbook_core::kinds::KindRef::new(
            d["apiVersion"].as_str().unwrap(),
            d["kind"].as_str().unwrap(),
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(c.client.clone(), tenant, &kind.api_resource());
        let obj: DynamicObject = serde_json::from_value(d.clone()).unwrap();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        let apply = kube::api::PatchParams::apply("runbook-test-admin").force();
        api.patch(name, &apply, &kube::api::Patch::Apply(&obj))
            .await
            .unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
    }
}

/// A policy ConfigMap, as a user writes it for `kubectl apply`.
pub fn policy_configmap(name: &str, files: &[(&str, &str)]) -> String {
    let data: serde_json::Map<String, serde_json::Value> = files
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"runbook.dev/policy": "true"}},
        "data": data,
    }))
    .unwrap()
}
