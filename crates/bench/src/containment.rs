//! Containment: a script that never returns is stopped by its wall-clock
//! budget, and the operator's other reconciles go on meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::Stats;
use super::operator::{populate, runbook_operator_with};
use runbook_core::decide::{self, Observed};
use runbook_core::observe::{CachedObject, MemoryView};
use runbook_core::policy::{self, Bundle, Origin};
use runbook_core::script::ScriptEngine;
use runbook_core::script::error::ScriptErrorKind;
use runbook_sandbox::Sandbox;

const RUNAWAY_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: runaway}
spec:
  target: {apiVersion: v1, kind: Service}
  selector: {matchLabels: {runaway: "yes"}}
  script: runaway.rhai
"#;

const RUNAWAY_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let i = 0;
    loop { i += 1; }
}
"#;

pub struct ContainmentFigures {
    /// A runaway script's start to its termination.
    pub runaway: Stats,
    /// `items` Items reconciled with nothing else going on.
    pub alone: Duration,
    /// The same, with `runaways` runaway targets reconciled meanwhile.
    pub beside_runaways: Duration,
    pub items: usize,
    pub runaways: usize,
    /// Runaway reconciles stopped during the second run.
    pub runaway_errors: u64,
}

impl ContainmentFigures {
    pub fn slowdown(&self) -> f64 {
        self.beside_runaways.as_secs_f64() / self.alone.as_secs_f64().max(1e-9)
    }
}

fn runaway_bundle() -> Bundle {
    Bundle::new(
        Origin::Inline("runaway".into()),
        [
            ("runaway.yaml".to_string(), RUNAWAY_POLICY.to_string()),
            ("runaway.rhai".to_string(), RUNAWAY_SCRIPT.to_string()),
        ]
        .into(),
    )
}

/// Call the runaway script `iters` times; each must end in a timeout.
pub fn runaway(iters: usize) -> Stats {
    let engine = ScriptEngine::default();
    let (set, errors) = policy::load(&engine, &[runaway_bundle()]);
    assert!(errors.is_empty(), "{errors:?}");
    let policy = &set.policies["runaway"];
    let observed = Observed {
        readings: Default::default(),
        target: CachedObject::new(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "spin", "namespace": "default", "uid": "u1", "labels": {"runaway": "yes"}},
            "spec": {}
        })),
        view: Arc::new(MemoryView::new()),
        now: "2026-11-29T10:00:00Z".parse().expect("time"),
    };
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        let r = decide::decide(&engine, policy, &observed);
        samples.push(t.elapsed());
        match r {
            Err(decide::DecideError::Script(e)) if e.kind == ScriptErrorKind::Timeout => {}
            other => panic!("the runaway script must time out, not {other:?}"),
        }
    }
    Stats::from_samples(samples)
}

async fn reconcile_items(items: usize, runaways: usize) -> (Duration, u64) {
    let sandbox = Sandbox::default();
    populate(&sandbox, "bench", items);
    let client = sandbox.client();
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "bench");
    for i in 0..runaways {
        let svc = serde_json::from_value(json!({
            "metadata": {"name": format!("spin-{i}"), "labels": {"runaway": "yes"}},
            "spec": {"ports": [{"port": 80}]}
        }))
        .expect("service");
        services
            .create(&Default::default(), &svc)
            .await
            .expect("creating a runaway target");
    }
    let extra: Vec<(&str, &str)> = if runaways > 0 {
        vec![
            ("runaway.yaml", RUNAWAY_POLICY),
            ("runaway.rhai", RUNAWAY_SCRIPT),
        ]
    } else {
        Vec::new()
    };
    let op = runbook_operator_with(client, "bench", 16, &extra);
    let started = Instant::now();
    op.start().await.expect("the operator starts");
    let deadline = Instant::now() + Duration::from_secs(600);
    while super::operator::done(&sandbox, "bench") < items && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    let errors = op
        .ctx
        .metrics
        .render()
        .lines()
        .filter(|l| {
            l.starts_with("runbook_reconciles_total")
                && l.contains("runaway")
                && l.contains("error")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64;
    op.shutdown(Duration::from_secs(5)).await;
    (took, errors)
}

pub async fn run(items: usize, runaways: usize, iters: usize) -> ContainmentFigures {
    let runaway = tokio::task::spawn_blocking(move || runaway(iters))
        .await
        .expect("runaway task");
    let (alone, _) = reconcile_items(items, 0).await;
    let (beside_runaways, runaway_errors) = reconcile_items(items, runaways).await;
    ContainmentFigures {
        runaway,
        alone,
        beside_runaways,
        items,
        runaways,
        runaway_errors,
    }
}
