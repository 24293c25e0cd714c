//! Reads in a busy namespace: the caches as the operator fills them (JSON
//! text, indexed by namespace, owner and label) holding thousands of pods,
//! and the lookups a decision makes among them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Stats, fixtures, measure};
use runbook_core::kinds::KindRef;
use runbook_core::labels::Selector;
use runbook_core::observe::{ObjectView, RawObject};
use runbook_operator::observe::cache::KindCache;
use runbook_operator::observe::view::{Source, Sources};

/// Pods of 250 workloads (`app: web-N`), each about 2 KB of JSON as a
/// serving pod's spec makes it.
pub fn busy_pods(n: usize) -> impl Iterator<Item = Value> {
    (0..n).map(|i| {
        let mut p = fixtures::job_pod(&format!("web-{i}"), "serving");
        p["metadata"]["labels"] =
            json!({"app": format!("web-{}", i % 250), "pod-template-hash": "5d8f"});
        p["spec"]["containers"][0]["env"] = (0..20)
            .map(|e| json!({"name": format!("SETTING_{e}"), "value": "x".repeat(40)}))
            .collect();
        p
    })
}

/// Watch caches of the kinds the drift policy reads, holding `objects`.
pub fn caches(objects: impl IntoIterator<Item = Value>) -> Sources {
    let caches: Vec<Arc<KindCache>> = [
        ("v1", "Pod"),
        ("batch/v1", "Job"),
        ("apps/v1", "Deployment"),
        ("apps/v1", "ReplicaSet"),
    ]
    .iter()
    .map(|&(v, k)| Arc::new(KindCache::new(KindRef::new(v, k))))
    .collect();
    for v in objects {
        let k = KindRef::new(
            v["apiVersion"].as_str().unwrap_or_default(),
            v["kind"].as_str().unwrap_or_default(),
        );
        if let Some(c) = caches.iter().find(|c| c.kind == k) {
            c.apply(Arc::new(RawObject::from_value(v)));
        }
    }
    Sources(
        caches
            .into_iter()
            .map(|c| (c.kind.clone(), Source::Informer(c)))
            .collect(),
    )
}

/// The same pods as the objects of a target kind: a controller's store and
/// the index kept beside it, as the operator fills them from its watch.
pub fn target_store(objects: impl IntoIterator<Item = Value>) -> Sources {
    use kube::runtime::watcher::Event;
    let kind = KindRef::new("v1", "Pod");
    let resource = Arc::new(kube::core::ApiResource::erase::<
        k8s_openapi::api::core::v1::Pod,
    >(&()));
    let mut writer = kube::runtime::reflector::store::Writer::<RawObject>::new(resource.clone());
    let index = Arc::new(runbook_operator::observe::index::TargetIndex::default());
    for v in objects {
        let event = Event::Apply(RawObject::from_value(v));
        index.observe(&event);
        writer.apply_watcher_event(&event);
    }
    Sources(
        [(kind, Source::Targets(writer.as_reader(), resource, index))]
            .into_iter()
            .collect(),
    )
}

/// Figures for reads among `pods` pods in one namespace.
pub struct LookupFigures {
    pub pods: usize,
    /// One workload's pods by its selector, read again (parsed already).
    pub select: Stats,
    /// The same on a fresh cache: every pod it returns parsed on the way.
    pub select_first: Duration,
    /// Every pod of the namespace, as `ctx.list("Pod")` reads them.
    pub list_all: Stats,
    /// The same on a fresh cache, every pod parsed: what each lookup cost
    /// while caches parsed objects for every reader.
    pub list_first: Duration,
    /// The drift policy's rollback decision in that namespace.
    pub decision: Stats,
    /// One workload's pods by its selector when Pods are a target kind
    /// (read from the controller's store through its index).
    pub target_select: Stats,
}

pub fn run(policies: &std::path::Path, pods: usize, iters: usize) -> LookupFigures {
    let pod = KindRef::new("v1", "Pod");
    let sel = Selector::parse("app=web-7,pod-template-hash=5d8f").unwrap_or_default();
    let first = |f: &dyn Fn(&Sources)| {
        let view = caches(busy_pods(pods));
        let t = std::time::Instant::now();
        f(&view);
        t.elapsed()
    };
    let select_first = first(&|v| {
        std::hint::black_box(v.select(&pod, fixtures::NS, &sel));
    });
    let list_first = first(&|v| {
        std::hint::black_box(v.list(&pod, fixtures::NS));
    });
    let setup = super::decision::Setup::new(policies, 0.72);
    let mut objects: Vec<Value> = busy_pods(pods).collect();
    objects.push(setup.deployment.clone());
    objects.extend(
        setup
            .jobs
            .iter()
            .chain(&setup.pods)
            .chain(&setup.replicasets)
            .cloned(),
    );
    let view = Arc::new(caches(objects));
    let select = measure(iters / 10, iters, || view.select(&pod, fixtures::NS, &sel));
    let list_all = measure(2, (iters / 100).max(5), || view.list(&pod, fixtures::NS));
    let observed = runbook_core::decide::Observed {
        readings: Default::default(),
        target: setup.observed.target.clone(),
        view,
        now: setup.observed.now,
    };
    let policy = &setup.set.policies["evaluator-drift"];
    let decision = measure(iters / 100, iters / 10, || {
        runbook_core::decide::decide(&setup.engine, policy, &observed).expect("decision")
    });
    let targets = target_store(busy_pods(pods));
    let target_select = measure(iters / 10, iters, || {
        targets.select(&pod, fixtures::NS, &sel)
    });
    LookupFigures {
        pods,
        select,
        select_first,
        list_all,
        list_first,
        decision,
        target_select,
    }
}
