//! The policy webhook: how long `kubectl apply --dry-run=server` of the
//! shipped policies takes, through an API server that calls Runbook's
//! webhook over HTTPS (the sandbox, or a real cluster's kube-apiserver
//! calling it on loopback), against an operator holding no other policy.
//! On a real cluster the benchmark applies Runbook's CRDs (and the
//! VolumeSnapshot CRD the shipped policies name), works in a namespace of
//! its own and removes that namespace and its webhook configuration after.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use serde_json::json;

use super::Stats;
use runbook_core::alert::LogSink;
use runbook_core::clock::Clock;
use runbook_core::kinds::KindRef;
use runbook_core::policy::{Bundle, PolicySet};
use runbook_core::script::ScriptEngine;
use runbook_operator::reload::{self, Reloader, SourceConfig};
use runbook_operator::runtime::{Operator, OperatorConfig, WebhookConfig};
use runbook_operator::telemetry::Metrics;
use runbook_sandbox::Sandbox;

#[derive(Clone, Copy, Debug)]
pub struct AdmissionFigures {
    pub reviews: usize,
    /// Files in the policy ConfigMap checked.
    pub files: usize,
    pub latency: Stats,
}

/// `reviews` server-side dry runs of a ConfigMap holding every file of
/// `policies` (the shipped bundle), each answered by the policy webhook;
/// through `cluster` where one is given, else through a sandbox.
pub async fn run(
    policies: &Path,
    reviews: usize,
    cluster: Option<kube::Client>,
) -> AdmissionFigures {
    let sandbox = Sandbox::default();
    let real = cluster.is_some();
    let client = cluster.unwrap_or_else(|| sandbox.client());
    let namespace = if real {
        format!("runbook-bench-{}", std::process::id())
    } else {
        "runbook-system".to_string()
    };
    install(&client, policies, &namespace).await;
    let engine = Arc::new(ScriptEngine::default());
    let metrics = Arc::new(Metrics::new());
    let webhook = WebhookConfig {
        listen: "127.0.0.1:0".parse().expect("an address"),
        endpoint: None,
        configuration: namespace.clone(),
        secret: None,
        created_with: None,
    };
    let config = OperatorConfig {
        namespace: Some(namespace.clone()),
        webhook: Some(webhook),
        ..Default::default()
    };
    let op = Arc::new(Operator::new(
        client.clone(),
        engine.clone(),
        PolicySet::default(),
        Clock::real(),
        Arc::new(LogSink::default()),
        metrics.clone(),
        config,
    ));
    op.start().await.expect("the operator starts");
    let reloader = Arc::new(
        Reloader::new(engine, Some(client.clone()), metrics, "bench")
            // The bench namespace is the operator's own: the shipped policies are
            // the operator's, not a tenant's.
            .with_secret_namespace(&namespace),
    );
    let sources = SourceConfig {
        dirs: vec![],
        configmap_namespaces: vec![namespace.clone()],
        admission: true,
    };
    let _tasks = reload::spawn(reloader, op.clone(), sources);
    wait_for_configuration(&client, &namespace).await;
    let bundle = Bundle::from_dir(policies).expect("the policies directory");
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shipped", "labels": {"runbook.dev/policy": "true"}},
        "data": bundle.files,
    }))
    .expect("a ConfigMap");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut took = Vec::with_capacity(reviews);
    for _ in 0..reviews {
        let t = Instant::now();
        cms.create(&dry_run, &cm)
            .await
            .unwrap_or_else(|e| panic!("the shipped policies were refused: {e}"));
        took.push(t.elapsed());
    }
    op.shutdown(Duration::from_secs(1)).await;
    if real {
        remove(&client, &namespace).await;
    }
    AdmissionFigures {
        reviews,
        files: bundle.files.len(),
        latency: Stats::from_samples(took),
    }
}

/// The kinds the shipped policies name (Runbook's CRDs, the
/// VolumeSnapshot CRD beside them) served, and the namespace made.
async fn install(client: &kube::Client, policies: &Path, namespace: &str) {
    let mut crds: Vec<serde_json::Value> = runbook_core::crd::all()
        .into_iter()
        .map(|c| serde_json::to_value(c).expect("a CRD serialises"))
        .collect();
    let snapshots = policies.join("../examples/crds/volumesnapshot.yaml");
    let text = std::fs::read_to_string(&snapshots)
        .unwrap_or_else(|e| panic!("{}: {e}", snapshots.display()));
    crds.extend(runbook_core::util::yaml::parse_documents(&text).expect("the VolumeSnapshot CRD"));
    let definitions: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &KindRef::new("apiextensions.k8s.io/v1", "CustomResourceDefinition").api_resource(),
    );
    let apply = PatchParams::apply("runbook-bench").force();
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().expect("a CRD's name");
        definitions
            .patch(name, &apply, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("applying the CRD {name}: {e}"));
    }
    // Served once listed (a real API server establishes a CRD a moment
    // after it is written).
    for crd in &crds {
        let spec = &crd["spec"];
        let group = spec["group"].as_str().unwrap_or_default();
        let version = spec["versions"][0]["name"].as_str().unwrap_or_default();
        let kind = spec["names"]["kind"].as_str().unwrap_or_default();
        let api: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &KindRef::new(format!("{group}/{version}"), kind).api_resource(),
        );
        until("a CRD to be served", || async {
            api.list(&Default::default()).await.is_ok()
        })
        .await;
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": namespace}})).expect("a Namespace");
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating the namespace {namespace}: {e}"),
    }
}

/// The namespace and the webhook configuration the benchmark made.
async fn remove(client: &kube::Client, namespace: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(namespace, &Default::default()).await;
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        let api: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &KindRef::new("admissionregistration.k8s.io/v1", kind).api_resource(),
        );
        let _ = api.delete(namespace, &Default::default()).await;
    }
}

/// Poll `check` until it holds, for a minute at most.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Until the policy webhook's configuration is written.
async fn wait_for_configuration(client: &kube::Client, name: &str) {
    let configurations: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &KindRef::new(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
        )
        .api_resource(),
    );
    until("the policy webhook's configuration", || async {
        configurations.get_opt(name).await.ok().flatten().is_some()
    })
    .await;
}
