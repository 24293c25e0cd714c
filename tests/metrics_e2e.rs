//! Decisions from metrics, end to end: a real Prometheus (Debian's
//! `prometheus` package; without it the test says it skips) scrapes a
//! small exporter the test serves, and the shipped Evaluator policy judges
//! a model Deployment by a query of it. The value drops: the Deployment is
//! rolled back. There is no data: nothing is done, and a condition says
//! so. Queries that try to reach other series are bounded or refused, and
//! a target's field with quotes, braces and a newline stays one string:
//! the test reads what Prometheus received from its query log. The same
//! assertions hold on the sandbox and on a real control plane.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/kubelet.rs"]
mod kubelet;
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/operator.rs"]
mod support;
#[path = "support/workflows.rs"]
mod workflows;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{Cluster, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kubelet::Kubelet;
use runbook_operator::runtime::OperatorConfig;
use runbook_operator::telemetry::Metrics;
use serde_json::{Value, json};
use workflows::*;

/// The exporter's text: the model's accuracy in the test's namespace (none
/// when `None`), and a series of another namespace an Evaluator must never
/// read.
fn exposition(ns: &str, accuracy: Option<f64>) -> String {
    let mut text = String::from("# TYPE model_accuracy gauge\n");
    if let Some(v) = accuracy {
        text.push_str(&format!(
            "model_accuracy{{namespace=\"{ns}\",deployment=\"chatbot\"}} {v}\n"
        ));
    }
    text.push_str("model_accuracy{namespace=\"other-team\",deployment=\"chatbot\"} 0.99\n");
    text
}

/// The condition `type` of a status.
fn condition<'a>(st: &'a Value, type_: &str) -> Option<&'a Value> {
    st["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metric_that_drops_rolls_the_model_back_and_no_data_does_nothing() {
    let Some(prom) = prometheus::tool("prometheus") else {
        return;
    };
    let c = Cluster::new("metrics").await;
    install_crds(&c).await;
    let exporter = prometheus::Exporter::start().await;
    exporter.set(&exposition(&c.ns, None));
    let dir = std::env::temp_dir().join(format!("runbook-metrics-{}", c.ns));
    let log = dir.join("queries.log");
    let port = prometheus::free_port();
    let _prometheus = prometheus::start(
        &prom,
        &dir,
        port,
        &format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s, query_log_file: {}}}\nscrape_configs:\n- job_name: models\n  static_configs: [{{targets: ['127.0.0.1:{}']}}]\n",
            log.display(),
            exporter.port
        ),
    );
    let base = format!("127.0.0.1:{port}");
    eventually("Prometheus to scrape the exporter", 60, || async {
        prometheus::query(&base, "model_accuracy{namespace=\"other-team\"}")
            .await
            .is_ok_and(|r| !r.is_empty())
    })
    .await;
    // Where the administrator keeps Prometheus' address.
    let config_maps: Api<ConfigMap> = c.api();
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "runbook-metrics"},
                "data": {"prometheus": format!("http://{base}")}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // A second policy whose query is a template over a ConfigMap's data,
    // which may hold anything.
    let probe = runbook_core::policy::Bundle::new(
        runbook_core::policy::Origin::Inline("probe".into()),
        [
            (
                "probe.yaml".to_string(),
                "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: probe}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  selector: {matchLabels: {probe: \"yes\"}}\n  metrics:\n  - name: asked\n    prometheus:\n      addressFrom: {configMapKeyRef: {name: runbook-metrics, key: prometheus}}\n      query: 'model_accuracy{deployment=\"{{ .data.model }}\"}'\n  script: probe.rhai\n".to_string(),
            ),
            (
                "probe.rhai".to_string(),
                "fn reconcile(ctx) { ctx.metric(\"asked\"); [] }".to_string(),
            ),
        ]
        .into(),
    );
    let shipped = runbook_core::policy::Bundle::from_dir(&repo().join("policies")).unwrap();
    let (set, errors) = runbook_core::policy::load(
        &runbook_core::script::ScriptEngine::default(),
        &[shipped, probe],
    );
    assert!(errors.is_empty(), "{errors:?}");
    let metrics = Arc::new(Metrics::new());
    let op = support::operator_with_metrics(
        &c,
        set,
        OperatorConfig {
            operator_namespace: c.ns.clone(),
            ..OperatorConfig::default()
        },
        metrics.clone(),
    );
    op.start().await.expect("the operator starts");
    let kubelet = Kubelet::start(&c);
    kubelet.ready("chatbot-");
    let deployments = model_deployment(&c, "chatbot").await;
    eventually("revision 1", 60, || async {
        revision_of(&deployments.get("chatbot").await.unwrap()) == "1"
    })
    .await;
    let evaluators = kind_api(&c, "runbook.dev/v1alpha1", "Evaluator");
    let query = "avg(model_accuracy{deployment=\"chatbot\"})";
    let evaluator = |name: &str, query: &str| {
        json!({
            "apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
            "metadata": {"name": name},
            "spec": {"targetRef": {"name": "chatbot"}, "schedule": "0 3 * * *",
                     "metric": {"query": query, "threshold": 0.85}}
        })
    };
    // No data yet: the first run judges nothing and says why.
    create(&c, evaluator("chatbot", query)).await;
    eventually("no data, said", 60, || async {
        let st = status_of(&evaluators, "chatbot").await;
        condition(&st, "MetricAvailable")
            .is_some_and(|m| m["status"] == "False" && m["reason"] == "NoData")
    })
    .await;
    let asked = Instant::now();
    let st = status_of(&evaluators, "chatbot").await;
    assert!(st.get("lastRollback").is_none(), "{st}");
    assert!(st.get("lastGoodRevision").is_none(), "{st}");
    let record = &st["decisions"][0]["metrics"]["quality"];
    assert_eq!(record["reason"], "NoData", "{st}");
    let confined = format!(
        "avg ( model_accuracy {{ deployment = \"chatbot\" , namespace=\"{}\" }} )",
        c.ns
    );
    assert_eq!(record["query"], confined.as_str());

    // The model reports a value, until Prometheus has scraped it.
    let report = |value: f64| {
        exporter.set(&exposition(&c.ns, Some(value)));
        let (base, confined) = (base.clone(), confined.clone());
        async move {
            eventually(&format!("Prometheus to see {value}"), 30, || async {
                prometheus::query(&base, &confined).await.is_ok_and(|r| {
                    r.first()
                        .is_some_and(|s| s["value"][1] == value.to_string().as_str())
                })
            })
            .await;
        }
    };
    // 0.93: a run passes.
    report(0.93).await;
    // A manual run shares answers for the policy's 10 s: it asks anew.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(asked.elapsed())).await;
    annotate(&evaluators, "chatbot", "runbook.dev/run-now", "1").await;
    eventually("a passing run", 60, || async {
        let st = status_of(&evaluators, "chatbot").await;
        st["phase"] == "Healthy" && st["lastGoodRevision"] == 1 && st["lastMetric"]["value"] == 0.93
    })
    .await;
    let passed = Instant::now();

    // A bad release, and the model's accuracy drops.
    release(&deployments, "chatbot", "registry.k8s.io/pause:3.10").await;
    eventually("revision 2", 60, || async {
        revision_of(&deployments.get("chatbot").await.unwrap()) == "2"
    })
    .await;
    report(0.62).await;
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(passed.elapsed())).await;
    annotate(&evaluators, "chatbot", "runbook.dev/run-now", "2").await;
    eventually("the rollback", 60, || async {
        let st = status_of(&evaluators, "chatbot").await;
        st["phase"] == "RolledBack"
            && st["lastRollback"]["fromRevision"] == 2
            && st["lastRollback"]["toRevision"] == 1
            && st["lastRollback"]["metric"] == 0.62
    })
    .await;
    eventually("the good template back", 60, || async {
        image_of(&deployments.get("chatbot").await.unwrap()) == "registry.k8s.io/pause:3.9"
    })
    .await;

    // Queries that reach for other series: another namespace's is
    // confined to this one (no data), a bare selector is refused before
    // anything is sent.
    create(
        &c,
        evaluator("other", "model_accuracy{namespace=\"other-team\"}"),
    )
    .await;
    create(&c, evaluator("bare", "{__name__=~\"model_.+\"}")).await;
    eventually("the other team's value unseen", 60, || async {
        let st = status_of(&evaluators, "other").await;
        condition(&st, "MetricAvailable").is_some_and(|m| m["reason"] == "NoData")
    })
    .await;
    eventually("a bare selector refused", 60, || async {
        let st = status_of(&evaluators, "bare").await;
        condition(&st, "MetricAvailable").is_some_and(|m| {
            m["reason"] == "Error"
                && m["message"]
                    .as_str()
                    .is_some_and(|t| t.contains("without a metric name"))
        })
    })
    .await;
    // A field with quotes, braces and a newline, placed in a template.
    let evil = "chatbot\"} or model_accuracy{namespace=\"other-team\"} or up{a=\"\nb";
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "probe", "labels": {"probe": "yes"}},
                "data": {"model": evil}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let escaped = "model_accuracy{deployment=\"chatbot\\\"} or model_accuracy{namespace=\\\"other-team\\\"} or up{a=\\\"\\nb\"}";
    eventually("the probe's query received", 60, || async {
        prometheus::logged_queries(&log)
            .iter()
            .any(|q| q == escaped)
    })
    .await;
    // What Prometheus received from the operator: every Evaluator query
    // confined to the test's namespace, the probe's in one string, and
    // nothing of the refused one.
    let matcher = format!("namespace=\"{}\"", c.ns);
    // (Less the test's own look at the scrape.)
    let received: Vec<String> = prometheus::logged_queries(&log)
        .into_iter()
        .filter(|q| q != "model_accuracy{namespace=\"other-team\"}")
        .collect();
    assert!(
        received.contains(&format!(
            "model_accuracy {{ namespace = \"other-team\" , {matcher} }}"
        )),
        "{received:#?}"
    );
    for q in &received {
        assert!(
            q.contains(&matcher) || q == escaped,
            "a query reached past the namespace: {q}"
        );
        assert!(!q.contains("__name__"), "{q}");
    }
    // The probe's answer: no series has that deployment.
    let probe_state = probe_reason(&c).await;
    assert_eq!(probe_state, "NoData");
    let text = metrics.render();
    for line in [
        "runbook_metric_queries_total{policy=\"evaluator-drift\",result=\"value\"}",
        "runbook_metric_queries_total{policy=\"evaluator-drift\",result=\"no_data\"}",
        "runbook_metric_queries_total{policy=\"evaluator-drift\",result=\"refused\"}",
        "runbook_metric_query_duration_seconds_count{policy=\"evaluator-drift\"}",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    op.shutdown(Duration::from_secs(5)).await;
    drop(kubelet);
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

/// The reason the probe policy's last decision recorded for its reading
/// (its record is kept apart from a ConfigMap, in a RunbookState).
async fn probe_reason(c: &Cluster) -> String {
    let states = c.runbook_states();
    let mut reason = String::new();
    for _ in 0..60 {
        let list = states.list(&Default::default()).await.unwrap();
        if let Some(r) = list.items.iter().find_map(|s| {
            let v = serde_json::to_value(s).ok()?;
            let d = v["status"]["decisions"]
                .as_array()?
                .iter()
                .find(|d| d["policy"] == "probe")?
                .clone();
            d["metrics"]["asked"]["reason"].as_str().map(str::to_string)
        }) {
            reason = r;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    reason
}
