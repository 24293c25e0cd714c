//! Sandbox benchmarks: request round trips through `kube::Client`, large
//! lists, watch fan-out, and memory per stored object.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

use super::{Stats, measure_async};
use runbook_sandbox::{Sandbox, Store};

/// A ConfigMap whose JSON is about 1 KB.
pub fn kilobyte_configmap(name: &str) -> Value {
    let filler = "x".repeat(64);
    let data: serde_json::Map<String, Value> = (0..12)
        .map(|i| (format!("key-{i:02}"), json!(filler)))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "bench", "shard": format!("s{}", name.len() % 7)}},
        "data": data
    })
}

#[derive(Clone, Copy, Debug)]
pub struct SandboxFigures {
    pub get: Stats,
    pub patch: Stats,
    pub list_10k: Stats,
    pub fanout_100: Stats,
    pub objects: usize,
    pub rss_bytes: u64,
    pub rss_delta_bytes: u64,
}

/// Resident set size of this process, from /proc.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// A namespace filled with `count` kilobyte ConfigMaps, written straight
/// into the store.
fn fill(store: &Store, ns: &str, count: usize, prefix: &str) {
    let ns_def = store.def("", "namespaces").expect("namespaces");
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    store
        .create(&ns_def, "", namespace, &Default::default())
        .expect("namespace");
    let cm_def = store.def("", "configmaps").expect("configmaps");
    for k in 0..count {
        let mut o = kilobyte_configmap(&format!("{prefix}-{k:07}"));
        o["metadata"]["namespace"] = json!(ns);
        store
            .create(&cm_def, ns, o, &Default::default())
            .expect("create");
    }
}

/// One write seen by 100 open watches: the time until all have it.
async fn fanout(client: &kube::Client, rounds: usize) -> Stats {
    let fan_api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let start_rv = fan_api
        .get("probe")
        .await
        .expect("get")
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut streams = Vec::new();
    let params = WatchParams::default()
        .fields("metadata.name=probe")
        .disable_bookmarks();
    for _ in 0..100 {
        let s = fan_api.watch(&params, &start_rv).await.expect("watch");
        streams.push(s.boxed());
    }
    let mut samples = Vec::new();
    for round in 0..rounds {
        let t = Instant::now();
        let p = json!({"data": {"fan": round.to_string()}});
        fan_api
            .patch("probe", &PatchParams::default(), &Patch::Merge(p))
            .await
            .expect("patch");
        let want = round.to_string();
        for s in streams.iter_mut() {
            loop {
                match s.next().await {
                    Some(Ok(WatchEvent::Modified(o)))
                        if o.data.as_ref().and_then(|d| d.get("fan")) == Some(&want) =>
                    {
                        break;
                    }
                    Some(Ok(_)) => continue,
                    other => panic!("watch ended: {other:?}"),
                }
            }
        }
        samples.push(t.elapsed());
    }
    Stats::from_samples(samples)
}

/// Run them all; `scale` 1.0 is the full size (10,000 listed, 100,000 stored).
pub async fn run(scale: f64) -> SandboxFigures {
    let n = |x: usize| ((x as f64 * scale) as usize).max(1);
    let sandbox = Sandbox::default();
    let client = sandbox.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(kilobyte_configmap("probe")).expect("a ConfigMap");
    api.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let get = measure_async(200, n(5000), || async {
        api.get("probe").await.expect("get")
    })
    .await;
    let mut i = 0u64;
    let patch = measure_async(200, n(5000), || {
        i += 1;
        let p = json!({"data": {"counter": i.to_string()}});
        let api = &api;
        async move {
            api.patch("probe", &PatchParams::default(), &Patch::Merge(p))
                .await
                .expect("patch")
        }
    })
    .await;

    // A list of 10,000 objects, decoded by the client.
    let store = sandbox.store().clone();
    let listed = n(10_000);
    fill(&store, "list", listed, "cm");
    let list_api: Api<ConfigMap> = Api::namespaced(client.clone(), "list");
    let list_10k = measure_async(2, n(20).max(3), || async {
        let l = list_api.list(&ListParams::default()).await.expect("list");
        assert_eq!(l.items.len(), listed);
        l
    })
    .await;
    let fanout_100 = fanout(&client, n(50).max(5)).await;

    // Memory: 100,000 objects of 1 KB.
    let before = rss_bytes();
    let stored = n(100_000);
    fill(&store, "memory", stored, "m");
    let after = rss_bytes();
    SandboxFigures {
        get,
        patch,
        list_10k,
        fanout_100,
        objects: stored,
        rss_bytes: after,
        rss_delta_bytes: after.saturating_sub(before),
    }
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> f64 {
    (d.as_micros() as f64 / 10.0).round() / 100.0
}
