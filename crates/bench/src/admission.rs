//! The policy webhook: how long `kubectl apply --dry-run=server` of the
//! shipped policies takes, through an API server (the sandbox) that calls
//! Runbook's webhook over HTTPS as kube-apiserver does, against an
//! operator holding no other policy.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use kube::core::DynamicObject;
use serde_json::json;

use super::Stats;
use runbook_core::clock::Clock;
use runbook_core::kinds::KindRef;
use runbook_core::policy::{Bundle, PolicySet};
use runbook_core::script::ScriptEngine;
use runbook_operator::alert::LogSink;
use runbook_operator::reload::{self, Reloader, SourceConfig};
use runbook_operator::runtime::{Operator, OperatorConfig, WebhookConfig};
use runbook_operator::telemetry::Metrics;
use runbook_sandbox::Sandbox;

const NAMESPACE: &str = "runbook-system";

#[derive(Clone, Copy, Debug)]
pub struct AdmissionFigures {
    pub reviews: usize,
    /// Files in the policy ConfigMap checked.
    pub files: usize,
    pub latency: Stats,
}

/// `reviews` server-side dry runs of a ConfigMap holding every file of
/// `policies` (the shipped bundle), each answered by the policy webhook.
pub async fn run(policies: &Path, reviews: usize) -> AdmissionFigures {
    let sandbox = Sandbox::default();
    let client = sandbox.client();
    install(&sandbox, policies);
    let engine = Arc::new(ScriptEngine::default());
    let metrics = Arc::new(Metrics::new());
    let webhook = WebhookConfig {
        listen: "127.0.0.1:0".parse().expect("an address"),
        endpoint: None,
        configuration: "runbook".into(),
        secret: None,
        created_with: None,
    };
    let config = OperatorConfig {
        namespace: Some(NAMESPACE.into()),
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
    let reloader = Arc::new(Reloader::new(
        engine,
        Some(client.clone()),
        metrics,
        "bench",
    ));
    let sources = SourceConfig {
        dirs: vec![],
        configmap_namespaces: vec![NAMESPACE.into()],
        admission: true,
    };
    let _tasks = reload::spawn(reloader, op.clone(), sources);
    wait_for_configuration(&client).await;
    let bundle = Bundle::from_dir(policies).expect("the policies directory");
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shipped", "labels": {"runbook.dev/policy": "true"}},
        "data": bundle.files,
    }))
    .expect("a ConfigMap");
    let cms: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
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
    AdmissionFigures {
        reviews,
        files: bundle.files.len(),
        latency: Stats::from_samples(took),
    }
}

/// The kinds the shipped policies name: Runbook's CRDs, the
/// VolumeSnapshot CRD beside them, and the operator's namespace.
fn install(sandbox: &Sandbox, policies: &Path) {
    let store = sandbox.store();
    let crd_def = store
        .def("apiextensions.k8s.io", "customresourcedefinitions")
        .expect("CRDs");
    let mut crds: Vec<serde_json::Value> = runbook_core::crd::all()
        .into_iter()
        .map(|c| serde_json::to_value(c).expect("a CRD serialises"))
        .collect();
    let snapshots = policies.join("../examples/crds/volumesnapshot.yaml");
    let text = std::fs::read_to_string(&snapshots)
        .unwrap_or_else(|e| panic!("{}: {e}", snapshots.display()));
    crds.extend(runbook_core::util::yaml::parse_documents(&text).expect("the VolumeSnapshot CRD"));
    for crd in crds {
        store
            .create(&crd_def, "", crd, &Default::default())
            .expect("a CRD");
    }
    let ns_def = store.def("", "namespaces").expect("namespaces");
    store
        .create(
            &ns_def,
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
            &Default::default(),
        )
        .expect("the namespace");
}

/// Until the policy webhook's configuration is written.
async fn wait_for_configuration(client: &kube::Client) {
    let configurations: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &KindRef::new(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
        )
        .api_resource(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while configurations
        .get_opt("runbook")
        .await
        .ok()
        .flatten()
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the policy webhook's configuration was not written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
