//! End-to-end: many targets, each needing one child and one status write,
//! reconciled by Runbook (a Rhai policy) and by a minimal hand-written
//! kube-rs controller doing the same writes, on the same in-process
//! sandbox; then the writes of a no-op resync. (The memory of the
//! operator's caches is `super::memory`.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

use runbook_core::alert::LogSink;
use runbook_core::clock::Clock;
use runbook_core::kinds::KindRef;
use runbook_core::policy::{self, Bundle, Origin};
use runbook_core::script::ScriptEngine;
use runbook_operator::runtime::{Operator, OperatorConfig};
use runbook_operator::telemetry::Metrics;
use runbook_sandbox::Sandbox;

pub const GROUP: &str = "bench.runbook.dev";

pub const POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: bench-item}
spec:
  target: {apiVersion: bench.runbook.dev/v1, kind: Item}
  owns: [{apiVersion: v1, kind: ConfigMap}]
  script: item.rhai
"#;

pub const SCRIPT: &str = r#"
fn reconcile(ctx) {
    let item = ctx.resource;
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${item.metadata.name}-child` }, data: #{ size: `${item.spec.size}` } }),
     status(#{ phase: "Done" })]
}
"#;

pub fn item_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "Item".into(),
        plural: "items".into(),
    }
}

pub fn item_kind() -> KindRef {
    KindRef::new(format!("{GROUP}/v1"), "Item")
}

/// The Item CRD.
pub fn item_crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("items.{GROUP}")},
        "spec": {"group": GROUP, "scope": "Namespaced", "names": {"kind": "Item", "plural": "items"},
                 "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                   "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    })
}

/// An Item of the benchmark, the `i`th of `namespace`.
pub fn item(namespace: &str, i: usize) -> serde_json::Value {
    json!({
        "apiVersion": format!("{GROUP}/v1"), "kind": "Item",
        "metadata": {"name": format!("item-{i:05}"), "namespace": namespace, "labels": {"app": "bench"}},
        "spec": {"size": i % 100, "owner": "team-a", "tier": "standard"}
    })
}

/// Install the Item CRD and `n` Items in `namespace`, straight into the store.
pub fn populate(sandbox: &Sandbox, namespace: &str, n: usize) {
    let store = sandbox.store();
    let crd_def = store
        .def("apiextensions.k8s.io", "customresourcedefinitions")
        .expect("CRDs");
    if store.def(GROUP, "items").is_none() {
        let crd = item_crd();
        store
            .create(&crd_def, "", crd, &Default::default())
            .expect("the Item CRD");
    }
    // Runbook's CRDs, as an installation has them (RunbookState holds
    // Runbook's state of built-in targets).
    if store.def("runbook.dev", "runbookstates").is_none() {
        let crd = serde_json::to_value(runbook_core::crd::state::crd()).expect("a CRD serialises");
        store
            .create(&crd_def, "", crd, &Default::default())
            .expect("the RunbookState CRD");
    }
    let ns_def = store.def("", "namespaces").expect("namespaces");
    let _ = store.create(
        &ns_def,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        &Default::default(),
    );
    let def = store.def(GROUP, "items").expect("items");
    for i in 0..n {
        store
            .create(&def, namespace, item(namespace, i), &Default::default())
            .expect("an Item");
    }
}

/// Items in `namespace` whose status says Done.
pub fn done(sandbox: &Sandbox, namespace: &str) -> usize {
    let store = sandbox.store();
    let Some(def) = store.def(GROUP, "items") else {
        return 0;
    };
    let filter = runbook_sandbox::store::Filter {
        namespace: Some(namespace.into()),
        ..Default::default()
    };
    store
        .list(&def, &filter, None, None)
        .map(|l| {
            // Searched from the end, where the status is (keys are kept in
            // order): counting costs the same for both controllers' Items,
            // however long what comes before the phase (Runbook's decision
            // record), so it takes from neither more than from the other.
            let finder = memchr::memmem::FinderRev::new(br#""phase":"Done""#);
            l.items.iter().filter(|b| finder.rfind(b).is_some()).count()
        })
        .unwrap_or(0)
}

/// What a controller wrote to finish every Item, and what it left: write
/// requests and their bytes as the API server received them, and the
/// bytes of the finished Items and of their children as it stores them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Written {
    pub writes: u64,
    pub bytes: u64,
    pub item_bytes: u64,
    pub child_bytes: u64,
}

impl Written {
    fn of(sandbox: &Sandbox, namespace: &str) -> Self {
        let store = sandbox.store();
        let stored = |group: &str, plural: &str| {
            let filter = runbook_sandbox::store::Filter {
                namespace: Some(namespace.into()),
                ..Default::default()
            };
            store
                .def(group, plural)
                .and_then(|def| store.list(&def, &filter, None, None).ok())
                .map_or(0, |l| l.items.iter().map(|b| b.len() as u64).sum())
        };
        Written {
            writes: sandbox.traffic().writes(),
            bytes: sandbox.traffic().bytes(),
            item_bytes: stored(GROUP, "items"),
            child_bytes: stored("", "configmaps"),
        }
    }
}

async fn wait_done(sandbox: &Sandbox, namespace: &str, n: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let counting = Instant::now();
        if done(sandbox, namespace) >= n {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        // Counting is work too: not so often that it slows what it
        // measures (at most a tenth of a core, however many Items).
        tokio::time::sleep((counting.elapsed() * 9).max(Duration::from_millis(50))).await;
    }
}

pub fn runbook_operator(client: kube::Client, namespace: &str, concurrency: u16) -> Operator {
    runbook_operator_with(client, namespace, concurrency, &[])
}

/// The bench operator with more policy files beside the Item policy.
pub fn runbook_operator_with(
    client: kube::Client,
    namespace: &str,
    concurrency: u16,
    extra: &[(&str, &str)],
) -> Operator {
    let config = OperatorConfig {
        namespace: Some(namespace.into()),
        concurrency,
        ..Default::default()
    };
    runbook_operator_configured(client, config, extra)
}

/// The bench operator, configured as given.
pub fn runbook_operator_configured(
    client: kube::Client,
    config: OperatorConfig,
    extra: &[(&str, &str)],
) -> Operator {
    let engine = ScriptEngine::default();
    let mut files: std::collections::BTreeMap<String, String> = [
        ("item.yaml".to_string(), POLICY.to_string()),
        ("item.rhai".to_string(), SCRIPT.to_string()),
    ]
    .into();
    for (k, v) in extra {
        files.insert(k.to_string(), v.to_string());
    }
    let bundle = Bundle::new(Origin::Inline("bench".into()), files);
    let (set, errors) = policy::load(&engine, &[bundle]);
    assert!(errors.is_empty(), "{errors:?}");
    operator_over(client, engine, set, config)
}

/// An operator of `set` on the real clock, its alerts logged.
pub fn operator_over(
    client: kube::Client,
    engine: ScriptEngine,
    set: runbook_core::policy::PolicySet,
    config: OperatorConfig,
) -> Operator {
    Operator::new(
        client,
        Arc::new(engine),
        set,
        Clock::real(),
        Arc::new(LogSink::default()),
        Arc::new(Metrics::new()),
        config,
    )
}

struct Hand {
    client: kube::Client,
}

async fn hand_reconcile(item: Arc<DynamicObject>, ctx: Arc<Hand>) -> Result<Action, kube::Error> {
    if item.data["status"]["phase"] == "Done" {
        return Ok(Action::await_change());
    }
    let ns = item.namespace().unwrap_or_default();
    let name = item.name_any();
    let child = format!("{name}-child");
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": child, "namespace": ns, "ownerReferences": [{
            "apiVersion": format!("{GROUP}/v1"), "kind": "Item", "name": name, "uid": item.uid(), "controller": true, "blockOwnerDeletion": true}]},
        "data": {"size": item.data["spec"]["size"].to_string()}
    });
    let cms: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &ns,
        &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    cms.patch(
        &child,
        &PatchParams::apply("hand").force(),
        &Patch::Apply(&cm),
    )
    .await?;
    let items: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &item_resource());
    items
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Done"}})),
        )
        .await?;
    Ok(Action::await_change())
}

/// What the hand-written controller watches besides its Items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Children {
    /// Its ConfigMaps too (`Controller::owns`, the kube-rs idiom for a
    /// controller that keeps children): a child deleted or edited wakes its
    /// Item, as it does under Runbook, whose policy owns them.
    Watched,
    /// Nothing: it writes each child once and never looks at it again.
    Unwatched,
}

/// The hand-written controller: reconcile until every Item in `namespace`
/// is done; the time it took.
pub async fn run_hand(
    sandbox: &Sandbox,
    namespace: &str,
    n: usize,
    concurrency: u16,
    children: Children,
) -> (Duration, Written) {
    let client = sandbox.client();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &item_resource());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let controller = Controller::new_with(
        api,
        watcher::Config::default().page_size(500),
        item_resource(),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
    .graceful_shutdown_on(async move {
        let _ = stop_rx.await;
    });
    let controller = match children {
        Children::Watched => controller.owns(
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace),
            watcher::Config::default().page_size(500),
        ),
        Children::Unwatched => controller,
    };
    let task = tokio::spawn(
        controller
            .run(
                hand_reconcile,
                |_, _: &kube::Error, _| Action::requeue(Duration::from_millis(100)),
                Arc::new(Hand { client }),
            )
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!("hand-written controller: {e}");
                }
            }),
    );
    assert!(
        wait_done(sandbox, namespace, n, Duration::from_secs(600)).await,
        "the hand-written controller did not finish"
    );
    let took = started.elapsed();
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    (took, Written::of(sandbox, namespace))
}

/// One run of Runbook on the Items.
pub struct RunbookRun {
    /// Until every Item was done.
    pub took: Duration,
    /// Decisions made until then (the reconciles that decided).
    pub decisions: u64,
    /// API writes of a resync of the finished state.
    pub noop_writes: u64,
    /// What it wrote until every Item was done, and left.
    pub written: Written,
}

/// Runbook: reconcile until every Item is done; the time it took, the
/// decisions it made, and the API writes a resync of the finished state
/// made.
pub async fn run_runbook(
    sandbox: &Sandbox,
    namespace: &str,
    n: usize,
    concurrency: u16,
) -> RunbookRun {
    let op = runbook_operator(sandbox.client(), namespace, concurrency);
    let started = Instant::now();
    op.start().await.expect("the operator starts");
    if std::env::var("RUNBOOK_BENCH_VERBOSE").is_ok() {
        eprintln!("start-up took {:?}", started.elapsed());
    }
    assert!(
        wait_done(sandbox, namespace, n, Duration::from_secs(600)).await,
        "Runbook did not finish"
    );
    let took = started.elapsed();
    op.settle(Duration::from_millis(300), Duration::from_secs(60))
        .await;
    let written = Written::of(sandbox, namespace);
    let decisions = op
        .ctx
        .metrics
        .reconciles
        .get_or_create(&Metrics::labels(&[
            ("policy", "bench-item"),
            ("result", "ok"),
        ]))
        .get();
    if std::env::var("RUNBOOK_BENCH_VERBOSE").is_ok() {
        eprintln!(
            "{}",
            op.ctx
                .metrics
                .render()
                .lines()
                .filter(|l| l.starts_with("runbook_reconciles_total")
                    || l.starts_with("runbook_api_writes")
                    || l.starts_with("runbook_actions_total"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let before = op.ctx.metrics.writes.get();
    op.ctx.resync(&[item_kind()]);
    op.settle(Duration::from_millis(300), Duration::from_secs(120))
        .await;
    let noop_writes = op.ctx.metrics.writes.get() - before;
    op.shutdown(Duration::from_secs(10)).await;
    RunbookRun {
        took,
        decisions,
        noop_writes,
        written,
    }
}

fn median_secs(rounds: &[Duration]) -> f64 {
    median(&rounds.iter().map(Duration::as_secs_f64).collect::<Vec<_>>())
}

#[derive(Clone, Debug)]
pub struct OperatorFigures {
    pub targets: usize,
    /// Each round's time, in the order the rounds ran.
    pub runbook: Vec<Duration>,
    /// The hand-written controller watching its children, as Runbook does.
    pub hand: Vec<Duration>,
    /// The same controller without a watch on its children.
    pub hand_unwatched: Vec<Duration>,
    pub noop_writes: u64,
    /// The most decisions a Runbook round made.
    pub decisions: u64,
    /// What Runbook wrote and left, in its last round.
    pub runbook_written: Written,
    /// What the hand-written controller watching its children wrote and
    /// left, in its last round.
    pub hand_written: Written,
}

fn ratios(a: &[Duration], b: &[Duration]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64().max(1e-9))
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl OperatorFigures {
    /// Runbook's time over the hand-written controller's, per round.
    pub fn ratios(&self) -> Vec<f64> {
        ratios(&self.runbook, &self.hand)
    }

    /// The median of the rounds' ratios.
    pub fn ratio(&self) -> f64 {
        median(&self.ratios())
    }

    /// The median of the rounds' ratios against the hand-written
    /// controller that does not watch its children.
    pub fn ratio_unwatched(&self) -> f64 {
        median(&ratios(&self.runbook, &self.hand_unwatched))
    }

    /// That controller's median round, in seconds.
    pub fn median_hand_unwatched(&self) -> f64 {
        median_secs(&self.hand_unwatched)
    }

    /// Runbook's median round, in seconds.
    pub fn median_runbook(&self) -> f64 {
        median_secs(&self.runbook)
    }

    /// The hand-written controller's median round, in seconds.
    pub fn median_hand(&self) -> f64 {
        median_secs(&self.hand)
    }

    /// The lowest and highest ratio of the rounds.
    pub fn spread(&self) -> (f64, f64) {
        let r = self.ratios();
        (
            r.iter().copied().fold(f64::INFINITY, f64::min),
            r.iter().copied().fold(0.0, f64::max),
        )
    }
}

/// `rounds` interleaved rounds (the controllers take turns going first),
/// each controller on a fresh sandbox holding just its `n` Items, so none
/// pays for another's objects or always runs on a warmer machine.
pub async fn run(n: usize, rounds: usize) -> OperatorFigures {
    #[derive(Clone, Copy)]
    enum Who {
        Runbook,
        Hand(Children),
    }
    const ORDER: [Who; 3] = [
        Who::Hand(Children::Watched),
        Who::Runbook,
        Who::Hand(Children::Unwatched),
    ];
    let only = std::env::var("RUNBOOK_BENCH_ONLY").unwrap_or_default();
    let mut figures = OperatorFigures {
        targets: n,
        runbook: Vec::new(),
        hand: Vec::new(),
        hand_unwatched: Vec::new(),
        noop_writes: 0,
        decisions: 0,
        runbook_written: Written::default(),
        hand_written: Written::default(),
    };
    for round in 0..rounds.max(1) {
        for turn in 0..ORDER.len() {
            let who = ORDER[(round + turn) % ORDER.len()];
            let took = match who {
                // The other side only (`RUNBOOK_BENCH_ONLY`): a placeholder.
                Who::Runbook if only == "hand" => Duration::from_secs(1),
                Who::Hand(_) if only == "runbook" => Duration::from_secs(1),
                Who::Runbook => {
                    let sandbox = Sandbox::default();
                    populate(&sandbox, "runbook", n);
                    let run = run_runbook(&sandbox, "runbook", n, 16).await;
                    figures.noop_writes = figures.noop_writes.max(run.noop_writes);
                    figures.decisions = figures.decisions.max(run.decisions);
                    figures.runbook_written = run.written;
                    run.took
                }
                Who::Hand(children) => {
                    let sandbox = Sandbox::default();
                    populate(&sandbox, "hand", n);
                    let (took, written) = run_hand(&sandbox, "hand", n, 16, children).await;
                    if children == Children::Watched {
                        figures.hand_written = written;
                    }
                    took
                }
            };
            match who {
                Who::Runbook => figures.runbook.push(took),
                Who::Hand(Children::Watched) => figures.hand.push(took),
                Who::Hand(Children::Unwatched) => figures.hand_unwatched.push(took),
            }
        }
    }
    figures
}
