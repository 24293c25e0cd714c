//! Metric inputs at scale: 1,000 Evaluators judged by one shared query,
//! on one operator over a sandbox, with a Prometheus stand-in on loopback
//! that counts the requests it answers. The Evaluators run at creation
//! (each its own fire time), then all at the next minute's tick: how many
//! requests that tick made, and how long until every Evaluator's decision
//! was written.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use runbook_core::script::ScriptEngine;
use runbook_operator::runtime::OperatorConfig;
use runbook_sandbox::Sandbox;

const NAMESPACE: &str = "metrics";
/// The query every Evaluator gives.
pub const QUERY: &str = "avg(model_accuracy{deployment=\"chatbot\"})";

/// What the section measured.
#[derive(Clone, Debug, Default)]
pub struct MetricFigures {
    pub evaluators: usize,
    /// Requests while every Evaluator ran at its creation.
    pub creation_requests: usize,
    /// Requests made for the tick every Evaluator ran at.
    pub tick_requests: usize,
    /// From the tick until the last Evaluator's decision was written.
    pub tick_decided: Duration,
    /// Evaluators whose decision at the tick was written.
    pub decided: usize,
}

/// A Prometheus stand-in: every query answers 0.93; the requests counted.
async fn prometheus() -> Result<(u16, Arc<AtomicUsize>), String> {
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    let (port, _task) = runbook_sandbox::stub::serve(move |_head| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::ready(runbook_sandbox::stub::Answer::ok(
            "application/json",
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"0.93"]}]}}"#,
        ))
    })
    .await
    .map_err(|e| format!("a port on loopback: {e}"))?;
    Ok((port, count))
}

/// The sandbox's objects: Runbook's CRDs, the namespace, the model's
/// Deployment, the ConfigMap naming Prometheus, and `n` Evaluators on one
/// query, every minute.
fn populate(sandbox: &Sandbox, n: usize, port: u16) {
    let store = sandbox.store();
    let crd_def = store
        .def("apiextensions.k8s.io", "customresourcedefinitions")
        .expect("CRDs");
    for crd in runbook_core::crd::all() {
        let crd = serde_json::to_value(crd).expect("a CRD serialises");
        store
            .create(&crd_def, "", crd, &Default::default())
            .expect("a CRD");
    }
    let create = |group: &str, plural: &str, obj: Value| {
        let def = store.def(group, plural).expect("a served kind");
        let ns = if plural == "namespaces" {
            ""
        } else {
            NAMESPACE
        };
        store
            .create(&def, ns, obj, &Default::default())
            .expect("an object");
    };
    create(
        "",
        "namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
    );
    let mut deployment = super::fixtures::deployment("chatbot", 1);
    deployment["metadata"]["namespace"] = json!(NAMESPACE);
    for k in ["uid", "resourceVersion", "creationTimestamp"] {
        deployment["metadata"].as_object_mut().map(|m| m.remove(k));
    }
    // Its owner lets every Evaluator here act on it (no authorship
    // webhook runs in the bench).
    deployment["metadata"]["annotations"]["runbook.dev/allow-targets"] = json!("Evaluator/*");
    create("apps", "deployments", deployment);
    create(
        "",
        "configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "runbook-metrics", "namespace": NAMESPACE},
               "data": {"prometheus": format!("http://127.0.0.1:{port}")}}),
    );
    for i in 0..n {
        create(
            "runbook.dev",
            "evaluators",
            json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
                   "metadata": {"name": format!("chatbot-{i}"), "namespace": NAMESPACE},
                   "spec": {"targetRef": {"name": "chatbot"}, "schedule": "* * * * *",
                            "metric": {"query": QUERY, "threshold": 0.85}}}),
        );
    }
}

/// The Evaluators whose status says their last run was at `run` (any run
/// when `None`) and whose metric was judged.
fn judged(sandbox: &Sandbox, run: Option<&str>) -> usize {
    let store = sandbox.store();
    let Some(def) = store.def("runbook.dev", "evaluators") else {
        return 0;
    };
    let filter = runbook_sandbox::store::Filter {
        namespace: Some(NAMESPACE.into()),
        ..Default::default()
    };
    let Ok(list) = store.list(&def, &filter, None, None) else {
        return 0;
    };
    list.items
        .iter()
        .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
        .filter(|v| v["status"]["lastMetric"]["value"].is_number())
        .filter(|v| run.is_none_or(|r| v["status"]["lastRunTime"] == r))
        .count()
}

/// The status of the first Evaluator, as what went wrong shows in it.
fn first_status(sandbox: &Sandbox) -> String {
    let store = sandbox.store();
    store
        .def("runbook.dev", "evaluators")
        .and_then(|def| store.get(&def, NAMESPACE, "chatbot-0").ok())
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .map(|v| v["status"].to_string())
        .unwrap_or_default()
}

/// Wait until `judged` counts `n`, or `limit` passes; when it did.
async fn wait_judged(
    sandbox: &Sandbox,
    run: Option<&str>,
    n: usize,
    limit: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        if judged(sandbox, run) >= n {
            return Some(Instant::now());
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Run the section: `n` Evaluators over the shipped policies in `policies`.
pub async fn run(policies: &std::path::Path, n: usize) -> Result<MetricFigures, String> {
    let (port, requests) = prometheus().await?;
    let sandbox = Sandbox::default();
    populate(&sandbox, n, port);
    // The Deployment's controller has seen its spec: it has settled.
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(sandbox.client(), NAMESPACE);
    deployments
        .patch_status(
            "chatbot",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}})),
        )
        .await
        .map_err(|e| format!("the Deployment's status: {e}"))?;
    let engine = ScriptEngine::default();
    let bundle = runbook_core::policy::Bundle::from_dir(policies).map_err(|e| e.to_string())?;
    let (set, errors) = runbook_core::policy::load(&engine, &[bundle]);
    if !errors.is_empty() {
        return Err(format!("the policies do not load: {errors:?}"));
    }
    let op = super::operator::operator_over(
        sandbox.client(),
        engine,
        set,
        OperatorConfig {
            namespace: Some(NAMESPACE.into()),
            operator_namespace: NAMESPACE.into(),
            concurrency: 16,
            ..Default::default()
        },
    );
    let op = Arc::new(op);
    op.start().await.map_err(|e| e.to_string())?;
    let mut figures = MetricFigures {
        evaluators: n,
        ..Default::default()
    };
    let limit = Duration::from_secs(
        std::env::var("RUNBOOK_BENCH_METRICS_LIMIT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300),
    );
    let first = wait_judged(&sandbox, None, n, limit).await;
    figures.creation_requests = requests.load(Ordering::SeqCst);
    if first.is_none() {
        op.shutdown(Duration::from_secs(5)).await;
        return Err(format!(
            "the Evaluators' first runs did not all finish within 5 minutes ({} did; the first's status: {})",
            judged(&sandbox, None),
            first_status(&sandbox)
        ));
    }
    // The next minute's tick, as the Evaluators' schedule fires it.
    let now = jiff::Timestamp::now();
    let next = (now.as_second() / 60 + 1) * 60;
    let tick = jiff::Timestamp::from_second(next).map_err(|e| e.to_string())?;
    let wait = Duration::from_millis(
        u64::try_from(tick.as_millisecond() - now.as_millisecond()).unwrap_or(0),
    );
    let before = requests.load(Ordering::SeqCst);
    tokio::time::sleep(wait).await;
    let at = Instant::now();
    let run = runbook_core::util::time::format(tick);
    let done = wait_judged(&sandbox, Some(&run), n, Duration::from_secs(300)).await;
    figures.tick_requests = requests.load(Ordering::SeqCst) - before;
    figures.decided = judged(&sandbox, Some(&run));
    figures.tick_decided = done.map_or(Duration::from_secs(300), |d| d - at);
    op.shutdown(Duration::from_secs(5)).await;
    Ok(figures)
}
