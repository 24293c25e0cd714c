//! Sandbox benchmarks: request round trips through `kube::Client`, large
//! lists, watch fan-out, and memory per stored object.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

use super::{Stats, measure_async};
use crate::sandbox::Sandbox;

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
    let list_ns = "list";
    let store = sandbox.store().clone();
    let ns_def = store.def("", "namespaces").expect("namespaces");
    store
        .create(
            &ns_def,
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": list_ns}}),
            &Default::default(),
        )
        .expect("namespace");
    let cm_def = store.def("", "configmaps").expect("configmaps");
    let listed = n(10_000);
    for k in 0..listed {
        let mut o = kilobyte_configmap(&format!("cm-{k:06}"));
        o["metadata"]["namespace"] = json!(list_ns);
        store
            .create(&cm_def, list_ns, o, &Default::default())
            .expect("create");
    }
    let list_api: Api<ConfigMap> = Api::namespaced(client.clone(), list_ns);
    let list_10k = measure_async(2, n(20).max(3), || async {
        let l = list_api.list(&ListParams::default()).await.expect("list");
        assert_eq!(l.items.len(), listed);
        l
    })
    .await;

    // One write seen by 100 open watches.
    let fan_api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let start_rv = fan_api
        .get("probe")
        .await
        .expect("get")
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut streams = Vec::new();
    for _ in 0..100 {
        let s = fan_api
            .watch(
                &WatchParams::default()
                    .fields("metadata.name=probe")
                    .disable_bookmarks(),
                &start_rv,
            )
            .await
            .expect("watch");
        streams.push(s.boxed());
    }
    let mut samples = Vec::new();
    for round in 0..n(50).max(5) {
        let t = Instant::now();
        fan_api
            .patch(
                "probe",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"fan": round.to_string()}})),
            )
            .await
            .expect("patch");
        for s in streams.iter_mut() {
            loop {
                match s.next().await {
                    Some(Ok(WatchEvent::Modified(o)))
                        if o.data
                            .as_ref()
                            .and_then(|d| d.get("fan"))
                            .map(String::as_str)
                            == Some(&round.to_string()) =>
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
    let fanout_100 = Stats::from_samples(samples);
    drop(streams);

    // Memory: 100,000 objects of 1 KB.
    let before = rss_bytes();
    let mem_ns = "memory";
    store
        .create(
            &ns_def,
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": mem_ns}}),
            &Default::default(),
        )
        .expect("namespace");
    let stored = n(100_000);
    for k in 0..stored {
        let mut o = kilobyte_configmap(&format!("m-{k:07}"));
        o["metadata"]["namespace"] = json!(mem_ns);
        store
            .create(&cm_def, mem_ns, o, &Default::default())
            .expect("create");
    }
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
