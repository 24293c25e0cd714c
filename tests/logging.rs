//! The operator under the log subscriber `runbook run` installs, with
//! thousands of targets on two worker threads: no controller panics in
//! the subscriber's span bookkeeping, and no log line is nested in more
//! than one reconcile. (A span guard held across an `.await` left stale
//! spans on a worker's stack: at 5,000 targets a controller panicked with
//! "tried to clone Id(..), but no span exists", and lines carried up to
//! 255 nested, unrelated reconcile spans.) Sandbox by default; a real
//! cluster with RUNBOOK_TEST_KUBECONFIG.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod operator;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cluster::{Cluster, eventually};
use futures::StreamExt;
use kube::api::ListParams;
use operator::*;
use runbook_operator::runtime::OperatorConfig;
use runbook_operator::telemetry::Metrics;
use serde_json::json;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Every span the operator opens is looked at: how many reconciles (the
/// controller's `reconciling object`, the policy's `reconcile`) enclose
/// it, the most seen, and the first chain past one of each.
#[derive(Clone, Default)]
struct Nesting {
    spans: Arc<AtomicUsize>,
    deepest: Arc<AtomicUsize>,
    first_bad: Arc<Mutex<Option<String>>>,
}

impl<S> Layer<S> for Nesting
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        self.spans.fetch_add(1, Ordering::Relaxed);
        let names: Vec<&str> = span.scope().map(|s| s.name()).collect();
        let count = |n: &str| names.iter().filter(|x| **x == n).count();
        let depth = count("reconciling object").max(count("reconcile"));
        self.deepest.fetch_max(depth, Ordering::Relaxed);
        if depth > 1 {
            runbook_core::util::lock(&self.first_bad).get_or_insert(names.join(" < "));
        }
    }
}

const POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: counted}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  script: counted.rhai
"#;

const SCRIPT: &str = r#"
fn reconcile(ctx) {
    [status(#{ phase: "Counted", size: ctx.resource.spec.size })]
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_targets_under_the_real_log_subscriber_nest_no_spans() {
    let nesting = Nesting::default();
    let subscriber = runbook_operator::telemetry::log::text(std::io::sink).with(nesting.clone());
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let c = Cluster::new("logging").await;
    install_widget_crd(&c).await;
    let metrics = Arc::new(Metrics::new());
    let op = operator_with_metrics(
        &c,
        policies(&c, &[("counted.yaml", POLICY), ("counted.rhai", SCRIPT)]),
        OperatorConfig::default(),
        metrics.clone(),
    );
    op.start().await.unwrap();
    let widgets = widgets(&c);
    let n = 2_000;
    futures::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let (c, widgets) = (&c, &widgets);
            async move { create_widget(c, widgets, &format!("w{i:05}"), json!({"size": i})).await }
        })
        .await;
    eventually("every widget counted", 300, || async {
        let all = widgets.list(&ListParams::default()).await.unwrap();
        all.items.len() == n
            && all
                .items
                .iter()
                .all(|w| w.data["status"]["phase"] == "Counted")
    })
    .await;
    settle(&op).await;
    let restarts = metrics
        .controller_restarts
        .get_or_create(&Metrics::labels(&[("kind", "Widget")]))
        .get();
    assert_eq!(
        restarts, 0,
        "the controller ended (a panic in the subscriber?)"
    );
    assert!(
        nesting.spans.load(Ordering::Relaxed) >= n,
        "the subscriber saw the reconciles' spans"
    );
    assert!(
        nesting.deepest.load(Ordering::Relaxed) <= 1,
        "a span inside more than one reconcile: {:?}",
        runbook_core::util::lock(&nesting.first_bad)
    );
    op.shutdown(std::time::Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}
