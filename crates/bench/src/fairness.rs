//! Fair share: how long a quiet policy takes to react (a target's spec
//! changed, until its status shows the change), alone and beside a noisy
//! policy on the same kind whose 300 targets each run to the script's
//! time limit and fail, touched again and again, on one operator; and the
//! same beside it with no shares, as the operator was before them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Stats;
use super::operator::{GROUP, item_resource, populate};
use runbook_core::policy::{self, Bundle, Origin};
use runbook_core::script::ScriptEngine;
use runbook_operator::runtime::fair::FairConfig;
use runbook_operator::runtime::{Operator, OperatorConfig};
use runbook_operator::telemetry::Metrics;
use runbook_sandbox::Sandbox;

const NAMESPACE: &str = "fair";
const QUIET_TARGETS: usize = 10;

const QUIET_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: quiet}
spec:
  target: {apiVersion: bench.runbook.dev/v1, kind: Item}
  selector: {matchLabels: {team: quiet}}
  script: quiet.rhai
  status: {fields: [seen]}
"#;

const QUIET_SCRIPT: &str = "fn reconcile(ctx) { [status(#{ seen: ctx.resource.spec.value })] }";

const NOISY_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: noisy}
spec:
  target: {apiVersion: bench.runbook.dev/v1, kind: Item}
  selector: {matchLabels: {team: noisy}}
  script: noisy.rhai
  status: {fields: [never]}
"#;

const NOISY_SCRIPT: &str = "fn reconcile(ctx) { let i = 0; loop { i += 1; } }";

pub struct FairnessFigures {
    pub alone: Stats,
    pub beside: Stats,
    /// Beside the noisy policy, every policy taking what it needs (as
    /// before shares).
    pub unshared: Stats,
    pub noisy_targets: usize,
    /// The noisy policy's decisions put off for its share.
    pub throttled: u64,
}

impl FairnessFigures {
    pub fn p50_ratio(&self) -> f64 {
        self.beside.median.as_secs_f64() / self.alone.median.as_secs_f64().max(1e-9)
    }

    pub fn p99_ratio(&self) -> f64 {
        self.beside.p99.as_secs_f64() / self.alone.p99.as_secs_f64().max(1e-9)
    }

    /// Without shares, beside / alone: (p50, p99).
    pub fn unshared_ratios(&self) -> (f64, f64) {
        let alone = &self.alone;
        (
            self.unshared.median.as_secs_f64() / alone.median.as_secs_f64().max(1e-9),
            self.unshared.p99.as_secs_f64() / alone.p99.as_secs_f64().max(1e-9),
        )
    }
}

fn item(name: &str, team: &str) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/v1"), "kind": "Item",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"team": team}},
        "spec": {"value": 0}
    })
}

fn operator(sandbox: &Sandbox, noisy: bool, fair: FairConfig) -> Operator {
    let engine = ScriptEngine::default();
    let mut files: std::collections::BTreeMap<String, String> = [
        ("quiet.yaml".to_string(), QUIET_POLICY.to_string()),
        ("quiet.rhai".to_string(), QUIET_SCRIPT.to_string()),
    ]
    .into();
    if noisy {
        files.insert("noisy.yaml".into(), NOISY_POLICY.into());
        files.insert("noisy.rhai".into(), NOISY_SCRIPT.into());
    }
    let (set, errors) = policy::load(
        &engine,
        &[Bundle::new(Origin::Inline("fair".into()), files)],
    );
    assert!(errors.is_empty(), "{errors:?}");
    super::operator::operator_over(
        sandbox.client(),
        engine,
        set,
        OperatorConfig {
            namespace: Some(NAMESPACE.into()),
            fair,
            ..Default::default()
        },
    )
}

/// The status field `seen` of a quiet target, straight from the store.
fn seen(sandbox: &Sandbox, name: &str) -> Option<i64> {
    let store = sandbox.store();
    let def = store.def(GROUP, "items")?;
    let bytes = store.get(&def, NAMESPACE, name).ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v["status"]["seen"].as_i64()
}

async fn wait_seen(sandbox: &Sandbox, name: &str, value: i64, limit: Duration) -> Duration {
    let began = Instant::now();
    while seen(sandbox, name) != Some(value) && began.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    began.elapsed()
}

/// The quiet policy's reaction latency over `rounds` changes, with the
/// noisy policy loaded (`noisy`) or not; the noisy targets are touched
/// throughout either way.
async fn reactions(
    noisy_targets: usize,
    rounds: usize,
    noisy: bool,
    fair: FairConfig,
) -> (Stats, u64) {
    let sandbox = Sandbox::default();
    populate(&sandbox, NAMESPACE, 0);
    let store = sandbox.store();
    let def = store.def(GROUP, "items").expect("items");
    for i in 0..QUIET_TARGETS {
        let name = format!("quiet-{i}");
        store
            .create(&def, NAMESPACE, item(&name, "quiet"), &Default::default())
            .expect("a quiet Item");
    }
    for i in 0..noisy_targets {
        let name = format!("noisy-{i:03}");
        store
            .create(&def, NAMESPACE, item(&name, "noisy"), &Default::default())
            .expect("a noisy Item");
    }
    let op = Arc::new(operator(&sandbox, noisy, fair));
    op.start().await.expect("the operator starts");
    for i in 0..QUIET_TARGETS {
        wait_seen(&sandbox, &format!("quiet-{i}"), 0, Duration::from_secs(60)).await;
    }
    // Each noisy target touched every two seconds, as a busy kind is.
    let items: kube::Api<kube::core::DynamicObject> =
        kube::Api::namespaced_with(sandbox.client(), NAMESPACE, &item_resource());
    let toucher = {
        let items = items.clone();
        tokio::spawn(async move {
            let pause = Duration::from_secs(2) / noisy_targets.max(1) as u32;
            for tick in 0u64.. {
                let name = format!("noisy-{:03}", tick as usize % noisy_targets.max(1));
                let patch = json!({"spec": {"tick": tick}});
                let _ = items
                    .patch(&name, &Default::default(), &kube::api::Patch::Merge(&patch))
                    .await;
                tokio::time::sleep(pause).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut samples = Vec::with_capacity(rounds);
    for r in 1..=rounds {
        let name = format!("quiet-{}", r % QUIET_TARGETS);
        let patch = json!({"spec": {"value": r}});
        let began = Instant::now();
        items
            .patch(&name, &Default::default(), &kube::api::Patch::Merge(&patch))
            .await
            .expect("a quiet change");
        wait_seen(&sandbox, &name, r as i64, Duration::from_secs(10)).await;
        samples.push(began.elapsed());
        // Changes come now and then, not back to back.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    toucher.abort();
    let throttled = op
        .ctx
        .metrics
        .policy_throttled
        .get_or_create(&Metrics::labels(&[("policy", "noisy"), ("limit", "cpu")]))
        .get();
    op.shutdown(Duration::from_secs(5)).await;
    (Stats::from_samples(samples), throttled)
}

pub async fn run(noisy_targets: usize, rounds: usize) -> FairnessFigures {
    let shared = FairConfig::default();
    let (alone, _) = reactions(noisy_targets, rounds, false, shared.clone()).await;
    let (beside, throttled) = reactions(noisy_targets, rounds, true, shared).await;
    // Slow enough without shares that a few rounds tell it.
    let few = rounds.min(20);
    let (unshared, _) = reactions(noisy_targets, few, true, FairConfig::unlimited()).await;
    FairnessFigures {
        alone,
        beside,
        unshared,
        noisy_targets,
        throttled,
    }
}
