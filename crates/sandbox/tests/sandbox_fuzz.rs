//! Property test over request bodies, paths and query strings: whatever a
//! client sends, the sandbox answers with a proper status code and a
//! Status object, and never panics.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use bytes::Bytes;
use http_body_util::BodyExt;
use runbook_sandbox::Sandbox;
use serde_json::{Value, json};

#[path = "../../../tests/support/rng.rs"]
mod rng;
use rng::Rng;

const SEEDS: &[&str] = &[
    r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"1"}}"#,
    r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","labels":{"app":"d"}},"spec":{"replicas":1,"selector":{"matchLabels":{"app":"d"}},"template":{"metadata":{"labels":{"app":"d"}},"spec":{"containers":[{"name":"a","image":"x"}]}}}}"#,
    r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"j"},"spec":{"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"a","image":"x"}]}}}}"#,
    r#"[{"op":"replace","path":"/data/a","value":"2"}]"#,
    r#"{"metadata":{"labels":{"x":"y"}},"data":{"a":null}}"#,
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: '1'\n",
    r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"things.fuzz.example.com"},"spec":{"group":"fuzz.example.com","scope":"Namespaced","names":{"kind":"Thing","plural":"things"},"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}"#,
    "",
    "null",
    "{}",
];

const MATCHED: &[(&str, &str, &str)] = &[
    (
        "/api/v1/namespaces/default/configmaps",
        "/api/v1/namespaces/default/configmaps/c",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"1"}}"#,
    ),
    (
        "/apis/apps/v1/namespaces/default/deployments",
        "/apis/apps/v1/namespaces/default/deployments/d",
        r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","labels":{"app":"d"}},"spec":{"replicas":1,"selector":{"matchLabels":{"app":"d"}},"template":{"metadata":{"labels":{"app":"d"}},"spec":{"containers":[{"name":"a","image":"x"}]}}}}"#,
    ),
    (
        "/apis/apps/v1/namespaces/default/deployments",
        "/apis/apps/v1/namespaces/default/deployments/e",
        r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"e"},"spec":{"selector":{"matchLabels":{"app":"e"}},"template":{"metadata":{"labels":{"app":"x"}},"spec":{"containers":[]}}}}"#,
    ),
    (
        "/apis/batch/v1/namespaces/default/jobs",
        "/apis/batch/v1/namespaces/default/jobs/j",
        r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"j"},"spec":{"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"a","image":"x"}]}}}}"#,
    ),
];

const PATHS: &[&str] = &[
    "/api/v1/namespaces/default/configmaps",
    "/api/v1/namespaces/default/configmaps/c",
    "/api/v1/namespaces/default/configmaps/c/status",
    "/apis/apps/v1/namespaces/default/deployments",
    "/apis/apps/v1/namespaces/default/deployments/d",
    "/apis/apps/v1/namespaces/default/deployments/d/status",
    "/apis/batch/v1/namespaces/default/jobs",
    "/apis/batch/v1/namespaces/nope/jobs/j",
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "/apis/fuzz.example.com/v1/namespaces/default/things",
    "/api/v1/namespaces",
    "/api/v1/namespaces/default",
    "/api/v1/configmaps",
    "/apis/apps/v1/deployments/d",
    "/apis/nothing/v9/widgets",
    "/api/v1/namespaces/default/pods/p/log",
    "/version",
    "/apis",
    "/api",
    "/",
];

const QUERIES: &[&str] = &[
    "",
    "?watch=true&timeoutSeconds=0",
    "?watch=true&resourceVersion=abc",
    "?labelSelector=a%3Db,c+in+(d)",
    "?labelSelector=((",
    "?fieldSelector=metadata.name%3Dc",
    "?fieldSelector=spec.x%3D1",
    "?limit=1&continue=zz",
    "?dryRun=All",
    "?dryRun=Maybe",
    "?fieldManager=fuzz&force=true",
    "?fieldValidation=Strict",
    "?propagationPolicy=Sideways",
];

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
const TYPES: &[&str] = &[
    "application/json",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/yaml",
    "text/plain",
    "",
];

fn mutate(rng: &mut Rng, seed: &str) -> Vec<u8> {
    let mut b = seed.as_bytes().to_vec();
    for _ in 0..rng.below(4) {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let i = rng.below(b.len());
        match rng.below(4) {
            0 => b[i] = rng.next() as u8,
            1 => {
                b.remove(i);
            }
            2 => {
                let c = rng.pick(b"{}[]\":,0a-\\".as_slice());
                b.insert(i, c)
            }
            _ => b.truncate(i),
        }
    }
    b
}

#[tokio::test]
async fn arbitrary_requests_get_proper_answers_and_never_a_panic() {
    let sandbox = Sandbox::default();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let allowed = [200u16, 201, 400, 404, 405, 406, 409, 410, 415, 422, 403];
    let mut seen = std::collections::BTreeMap::<u16, u32>::new();
    for i in 0..3000 {
        // Half the time a body that fits its path, so requests get deep
        // enough to create, conflict and fail validation; else anything.
        let (method, path, ct, seed): (&str, String, &str, &str) = if rng.below(2) == 0 {
            let (coll, obj, seed) = rng.pick(MATCHED);
            match rng.below(5) {
                0 | 1 => ("POST", coll.to_string(), "application/json", seed),
                2 => ("PUT", obj.to_string(), "application/json", seed),
                3 => (
                    "PATCH",
                    format!("{obj}?fieldManager=fuzz"),
                    "application/apply-patch+yaml",
                    seed,
                ),
                _ => (
                    "PATCH",
                    obj.to_string(),
                    "application/merge-patch+json",
                    r#"{"spec":{"replicas":"many"}}"#,
                ),
            }
        } else {
            (
                rng.pick(METHODS),
                format!("{}{}", rng.pick(PATHS), rng.pick(QUERIES)),
                rng.pick(TYPES),
                rng.pick(SEEDS),
            )
        };
        let body = if rng.below(3) == 0 {
            seed.as_bytes().to_vec()
        } else {
            mutate(&mut rng, seed)
        };
        let mut req = http::Request::builder().method(method).uri(&path);
        if !ct.is_empty() {
            req = req.header("Content-Type", ct);
        }
        let req = req.body(Bytes::from(body.clone())).unwrap();
        let is_watch = path.contains("watch=true") && method == "GET";
        let resp = sandbox.handle(req).await;
        let code = resp.status().as_u16();
        *seen.entry(code).or_default() += 1;
        // A 500 is what kube-apiserver itself answers a resourceVersion that
        // is not a number with; nothing else may get one.
        let bad_rv = path.contains("resourceVersion=") && !path.contains("resourceVersion=0");
        assert!(
            allowed.contains(&code) || (code == 500 && bad_rv),
            "request {i}: {method} {path} ({ct}) {:?} -> {code}",
            String::from_utf8_lossy(&body)
        );
        if is_watch && code == 200 {
            continue;
        }
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        if code >= 400 {
            let v: Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("request {i}: error body is not JSON ({e}): {bytes:?}"));
            assert_eq!(v["kind"], "Status", "request {i}: {v}");
            assert_eq!(v["code"], json!(code), "request {i}: {v}");
            assert!(
                v["message"].as_str().is_some_and(|m| !m.is_empty()),
                "request {i}: {v}"
            );
            if code == 500 {
                assert!(
                    v["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("resourceVersion: Invalid value")),
                    "request {i}: {v}"
                );
            }
        }
    }
    // The generator reaches every kind of answer, not just one.
    for code in [200, 201, 400, 404, 405, 409, 415, 422] {
        assert!(
            seen.get(&code).is_some_and(|n| *n > 0),
            "no {code} among {seen:?}"
        );
    }
}
