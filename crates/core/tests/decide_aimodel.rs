//! The shipped aimodel-serving policy: what it serves, and how it reports a
//! spec the CRD schema would refuse today but an older one admitted.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "../../../tests/common/mod.rs"]
mod common;

use common::*;
use runbook_core::script::Action;
use serde_json::{Value, json};

fn model(spec: Value) -> Value {
    json!({
        "apiVersion": "runbook.dev/v1alpha1", "kind": "AIModel",
        "metadata": {"name": "llama", "namespace": "default", "uid": "uid-llama", "generation": 1,
                     "resourceVersion": "5", "creationTimestamp": "2026-11-29T08:00:00Z"},
        "spec": spec
    })
}

fn events(d: &runbook_core::decide::Decision) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|p| match &p.action {
            Action::Event { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_model_gets_a_gpu_deployment_a_service_and_a_weights_volume() {
    let w = World::shipped();
    let d = w.decide(
        "aimodel-serving",
        &model(
            json!({"modelUri": "hf://meta/llama-3-8b", "servingImage": "vllm:0.6",
                      "downloaderImage": "registry.example.com/fetch:1",
                      "gpusPerReplica": 2, "replicas": 3, "weights": {"size": "40Gi"}}),
        ),
    );
    let objs = applied(&d);
    let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["PersistentVolumeClaim", "Deployment", "Service"]);
    let dep = objs[1];
    assert_eq!(dep["spec"]["replicas"], 3);
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        2
    );
    assert_eq!(pod["initContainers"][0]["args"][1], "hf://meta/llama-3-8b");
    assert_eq!(
        pod["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "llama-weights"
    );
    assert_eq!(objs[0]["spec"]["resources"]["requests"]["storage"], "40Gi");
    // No Deployment yet in the cache: rolling out, not ready.
    assert_eq!(status_of(&d)["phase"], "Progressing");
    assert_eq!(condition(&d, "Ready").unwrap().1, "RollingOut");
}

#[test]
fn zero_gpus_or_a_malformed_uri_is_degraded_with_a_condition_an_event_and_an_alert() {
    for (spec, words) in [
        (
            json!({"modelUri": "s3://m/v1", "servingImage": "vllm", "gpusPerReplica": 0}),
            "at least 1 GPU",
        ),
        (
            json!({"modelUri": "ftp:/m v1", "servingImage": "vllm", "gpusPerReplica": 1}),
            "is not a s3://",
        ),
        (
            json!({"modelUri": "s3://m/v1", "servingImage": "vllm", "gpusPerReplica": 64}),
            "at most 16",
        ),
    ] {
        let w = World::shipped();
        let d = w.decide("aimodel-serving", &model(spec));
        assert!(applied(&d).is_empty(), "nothing is deployed for a bad spec");
        assert_eq!(status_of(&d)["phase"], "Degraded");
        let (status, reason, message) = condition(&d, "Ready").unwrap();
        assert_eq!((status, reason), ("False", "InvalidSpec"));
        assert!(message.contains(words), "{message}");
        assert_eq!(events(&d), ["InvalidSpec"]);
        assert_eq!(alerts(&d)[0]["alertname"], "AIModelInvalidSpec");
    }
}

/// The default downloader (busybox) fetches http(s):// with wget; any
/// other scheme needs the AIModel's own downloader, called as `fetch URI
/// DIR`, and without one the model is refused with what to set, instead
/// of an init container that crash-loops on a command busybox lacks.
#[test]
fn weights_come_from_the_downloader_that_can_fetch_them() {
    let w = World::shipped();
    let init = |spec: serde_json::Value| {
        let d = w.decide("aimodel-serving", &model(spec));
        applied(&d)
            .into_iter()
            .find(|o| o["kind"] == "Deployment")
            .map(|dep| dep["spec"]["template"]["spec"]["initContainers"][0].clone())
    };
    let web =
        init(json!({"modelUri": "https://hf.co/m/w.safetensors", "servingImage": "vllm"})).unwrap();
    assert_eq!(web["image"], "docker.io/library/busybox:1.36");
    assert!(
        web["command"][2].as_str().unwrap().contains("wget"),
        "{web}"
    );
    assert!(web.get("args").is_none(), "{web}");
    let own = init(json!({"modelUri": "s3://m/v1", "servingImage": "vllm",
                          "downloaderImage": "registry.example.com/fetch:1"}))
    .unwrap();
    assert_eq!(own["image"], "registry.example.com/fetch:1");
    assert_eq!(own["args"], json!(["fetch", "s3://m/v1", "/models"]));
    assert!(init(json!({"modelUri": "s3://m/v1", "servingImage": "vllm"})).is_none());
    let d = w.decide(
        "aimodel-serving",
        &model(json!({"modelUri": "s3://m/v1", "servingImage": "vllm"})),
    );
    let message = format!("{:?}", d.actions);
    assert!(message.contains("set spec.downloaderImage"), "{message}");
}

#[test]
fn the_invalid_spec_event_is_not_repeated_on_every_reconcile() {
    let w = World::shipped();
    let mut m =
        model(json!({"modelUri": "s3://m/v1", "servingImage": "vllm", "gpusPerReplica": 0}));
    m["status"] = json!({"phase": "Degraded"});
    let d = w.decide("aimodel-serving", &m);
    assert!(events(&d).is_empty());
    assert_eq!(
        alerts(&d).len(),
        1,
        "the alert stays firing while the spec is bad"
    );
}
