//! Hot reload: from a policy ConfigMap edit to the first reconcile that
//! uses the new version, over many edits; and how long the targets of a
//! changed policy take to be reconciled on the new version.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::DynamicObject;
use serde_json::json;

use super::Stats;
use super::operator::{item_resource, populate};
use runbook_core::alert::LogSink;
use runbook_core::clock::Clock;
use runbook_core::script::ScriptEngine;
use runbook_operator::reload::{self, Reloader, SourceConfig};
use runbook_operator::runtime::{Operator, OperatorConfig};
use runbook_operator::telemetry::Metrics;
use runbook_sandbox::Sandbox;

fn policy(n: usize) -> String {
    format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: tuned}}\nspec:\n  target: {{apiVersion: bench.runbook.dev/v1, kind: Item}}\n  script: tuned.rhai\n  params:\n    n: {n}\n"
    )
}

const SCRIPT: &str = "fn reconcile(ctx) { [status(#{ seen: ctx.params.n })] }\n";

#[derive(Clone, Copy, Debug)]
pub struct ReloadFigures {
    pub edits: usize,
    pub latency: Stats,
    pub targets: usize,
    /// From the edit of the ConfigMap to every target reconciled on the new version.
    pub requeue_all: Duration,
    pub storm: StormFigures,
}

/// An edit storm: `edits` edits of one policy ConfigMap spread over
/// `over`, beside `targets` targets.
#[derive(Clone, Copy, Debug)]
pub struct StormFigures {
    pub edits: usize,
    pub over: Duration,
    pub targets: usize,
    /// From the last edit to every target on its version.
    pub converged: Duration,
    /// The operator's API writes from the first edit until then.
    pub writes: u64,
    /// Policy sets swapped in for the storm.
    pub loads: u64,
}

fn seen(sandbox: &Sandbox, namespace: &str, n: usize) -> usize {
    let store = sandbox.store();
    let Some(def) = store.def(super::operator::GROUP, "items") else {
        return 0;
    };
    let filter = runbook_sandbox::store::Filter {
        namespace: Some(namespace.into()),
        ..Default::default()
    };
    // Stored objects are compact JSON with sorted keys; `seen` is followed
    // by `,` or `}`, so the number is matched whole.
    let patterns = [format!("\"seen\":{n},"), format!("\"seen\":{n}}}")];
    let finders: Vec<_> = patterns.iter().map(memchr::memmem::Finder::new).collect();
    store
        .list(&def, &filter, None, None)
        .map(|l| {
            l.items
                .iter()
                .filter(|b| finders.iter().any(|f| f.find(b).is_some()))
                .count()
        })
        .unwrap_or(0)
}

/// `edits` successive ConfigMap edits with one target watched; then, on a
/// fresh sandbox, one edit with `targets` targets.
pub async fn run(edits: usize, targets: usize) -> ReloadFigures {
    let (latency, _) = phase(edits, 1).await;
    let (_, requeue_all) = phase(0, targets).await;
    ReloadFigures {
        edits,
        latency,
        targets,
        requeue_all,
        storm: storm(100, Duration::from_secs(10), 1_000).await,
    }
}

/// `edits` edits spread evenly over `over` beside `targets` targets: how
/// long after the last one every target runs on it, and what it cost.
pub async fn storm(edits: usize, over: Duration, targets: usize) -> StormFigures {
    let sandbox = Sandbox::default();
    let ns = "storm";
    populate(&sandbox, ns, targets);
    let op = operator(&sandbox, ns, targets).await;
    let cms: Api<ConfigMap> = Api::namespaced(sandbox.client(), ns);
    let reloads = || {
        op.ctx
            .metrics
            .policy_reloads
            .get_or_create(&Metrics::labels(&[("result", "ok")]))
            .get()
    };
    let (writes, loads) = (op.ctx.metrics.writes.get(), reloads());
    let gap = over / edits.max(1) as u32;
    for i in 1..edits {
        edit(&cms, i).await;
        tokio::time::sleep(gap).await;
    }
    edit(&cms, edits).await;
    let last = Instant::now();
    while seen(&sandbox, ns, edits) < targets && last.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let converged = last.elapsed();
    let figures = StormFigures {
        edits,
        over,
        targets,
        converged,
        writes: op.ctx.metrics.writes.get() - writes,
        loads: reloads() - loads,
    };
    op.shutdown(Duration::from_secs(5)).await;
    figures
}

/// The operator running the tuned policy from its ConfigMap, hot reload
/// on, every target reconciled once.
async fn operator(sandbox: &Sandbox, ns: &str, targets: usize) -> Arc<Operator> {
    let client = sandbox.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "tuned", "labels": {"runbook.dev/policy": "true"}},
        "data": {"tuned.yaml": policy(0), "tuned.rhai": SCRIPT}
    }))
    .expect("a ConfigMap");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("the policy ConfigMap");
    let engine = Arc::new(ScriptEngine::default());
    let metrics = Arc::new(Metrics::new());
    let reloader = Arc::new(
        Reloader::new(
            engine.clone(),
            Some(client.clone()),
            metrics.clone(),
            "bench",
        )
        .with_secret_namespace(ns),
    );
    let bundles = runbook_operator::reload::sources::configmap_bundles(&client, ns)
        .await
        .expect("bundles");
    let (set, errors) = reloader.initial(bundles).await;
    assert!(errors.is_empty(), "{errors:?}");
    let config = OperatorConfig {
        namespace: Some(ns.into()),
        ..Default::default()
    };
    let sink = Arc::new(LogSink::default());
    let op = Arc::new(Operator::new(
        client,
        engine,
        set,
        Clock::real(),
        sink,
        metrics,
        config,
    ));
    op.start().await.expect("the operator starts");
    let sources = SourceConfig {
        dirs: vec![],
        configmap_namespaces: vec![ns.into()],
        admission: false,
    };
    // The reload tasks run as long as the runtime does.
    let _tasks = reload::spawn(reloader, op.clone(), sources);
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen(sandbox, ns, 0) < targets && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    op.settle(Duration::from_millis(200), Duration::from_secs(60))
        .await;
    op
}

/// Edit the policy to version `i`.
async fn edit(cms: &Api<ConfigMap>, i: usize) {
    let p = json!({"data": {"tuned.yaml": policy(i)}});
    cms.patch("tuned", &PatchParams::default(), &Patch::Merge(p))
        .await
        .expect("edit");
}

/// Latency of single edits, watched on one target: edit, then wait for the
/// target's status to show the new version (and every target to settle).
async fn edit_latency(sandbox: &Sandbox, ns: &str, edits: usize, targets: usize) -> Stats {
    let client = sandbox.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let items: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &item_resource());
    let probe = "item-00000";
    let start_rv = items
        .get(probe)
        .await
        .expect("the probe")
        .metadata
        .resource_version
        .unwrap_or_default();
    let params = WatchParams::default()
        .fields(&format!("metadata.name={probe}"))
        .disable_bookmarks();
    let mut stream = items
        .watch(&params, &start_rv)
        .await
        .expect("watch")
        .boxed();
    let mut samples = Vec::with_capacity(edits);
    for i in 1..=edits {
        let t0 = Instant::now();
        edit(&cms, i).await;
        loop {
            match stream.try_next().await {
                Ok(Some(WatchEvent::Modified(o))) if o.data["status"]["seen"] == json!(i) => break,
                Ok(Some(_)) => continue,
                other => panic!("the watch ended: {other:?}"),
            }
        }
        samples.push(t0.elapsed());
        // Let every target settle before the next edit.
        let wait = Instant::now() + Duration::from_secs(120);
        while seen(sandbox, ns, i) < targets && Instant::now() < wait {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    if samples.is_empty() {
        Stats::from_samples(vec![Duration::ZERO])
    } else {
        Stats::from_samples(samples)
    }
}

async fn phase(edits: usize, targets: usize) -> (Stats, Duration) {
    let sandbox = Sandbox::default();
    let ns = "reload";
    let targets = targets.max(1);
    populate(&sandbox, ns, targets);
    let op = operator(&sandbox, ns, targets).await;
    let latency = edit_latency(&sandbox, ns, edits, targets).await;
    // All targets of the changed policy.
    let cms: Api<ConfigMap> = Api::namespaced(sandbox.client(), ns);
    let next = edits + 1;
    let t0 = Instant::now();
    edit(&cms, next).await;
    while seen(&sandbox, ns, next) < targets && t0.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let requeue_all = t0.elapsed();
    op.shutdown(Duration::from_secs(5)).await;
    (latency, requeue_all)
}
