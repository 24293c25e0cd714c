//! What ships in deploy/monitoring/ works with the real tools: the alert
//! rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`), and a real Prometheus scraping `runbook run`
//! answers every dashboard panel's query and every alert's expression
//! without an error, with data wherever the test made some. Without
//! promtool and prometheus (Debian's `prometheus` package, which
//! `.ci/run` installs) the tests say they skip.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/operator.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cluster::{Cluster, Running, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use prometheus::{free_port, get, query, tool};
use serde_json::{Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The rule file inside the PrometheusRule (its `spec`), written to
/// `dir/rules.yaml`; the alerts, each as (name, expression).
fn rules_into(dir: &Path) -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(repo().join("deploy/monitoring/prometheusrule.yaml")).unwrap();
    let doc = runbook_core::util::yaml::parse_documents(&text)
        .unwrap()
        .remove(0);
    assert_eq!(doc["kind"], "PrometheusRule");
    std::fs::create_dir_all(dir).unwrap();
    // JSON is YAML: promtool reads it as a rule file.
    std::fs::write(
        dir.join("rules.yaml"),
        serde_json::to_string_pretty(&doc["spec"]).unwrap(),
    )
    .unwrap();
    doc["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_string(),
                r["expr"].as_str().unwrap().trim().to_string(),
            )
        })
        .collect()
}

/// Each panel of the dashboard: (title, query).
fn panels() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/monitoring/dashboard.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap().to_string();
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_string()))
        })
        .collect()
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("running a tool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("runbook-rules-{}", std::process::id()));
    let alerts = rules_into(&dir);
    let (ok, out) = run(Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(dir.join("rules.yaml")));
    assert!(ok, "promtool check rules:\n{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{out}"
    );
    std::fs::copy(
        repo().join("deploy/monitoring/rules.test.yaml"),
        dir.join("rules.test.yaml"),
    )
    .unwrap();
    let (ok, out) = run(Command::new(&promtool)
        .arg("test")
        .arg("rules")
        .arg(dir.join("rules.test.yaml")));
    println!("promtool test rules:\n{out}");
    assert!(ok, "promtool test rules:\n{out}");
    // Every alert has a test that fires it.
    let tests = std::fs::read_to_string(dir.join("rules.test.yaml")).unwrap();
    for (alert, _) in &alerts {
        assert!(
            tests.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - "
            )),
            "no test fires {alert}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The test's policies: a Widget policy that works (Ready), one that fails
/// on widgets labelled `fail` (Degraded, failures counted), alert routes,
/// and a bundle that does not compile (a policy not in force).
async fn bundles(c: &Cluster) {
    let g = support::widget_group(c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let good = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: fine}}\nspec:\n  target: {{apiVersion: {g}/v1, kind: Widget}}\n  selector: {{matchExpressions: [{{key: fail, operator: DoesNotExist}}]}}\n  owns: [{{apiVersion: v1, kind: ConfigMap}}]\n  script: fine.rhai\n  status: {{fields: [fine], conditions: [Ready]}}\n"
    );
    let failing = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: failing}}\nspec:\n  target: {{apiVersion: {g}/v1, kind: Widget}}\n  selector: {{matchLabels: {{fail: \"yes\"}}}}\n  script: failing.rhai\n  status: {{fields: [failing]}}\n"
    );
    let routes = "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: default}\nspec:\n  route: {receiver: log}\n  receivers:\n  - name: log\n    log: {level: warn}\n";
    let cm = |name: &str, files: Value| -> ConfigMap {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"runbook.dev/policy": "true"}},
            "data": files,
        }))
        .unwrap()
    };
    for c in [
        cm(
            "widgets",
            json!({
                "fine.yaml": good, "failing.yaml": failing, "routes.yaml": routes,
                "fine.rhai": "fn reconcile(ctx) { let n = ctx.resource.metadata.name; [apply(#{ apiVersion: \"v1\", kind: \"ConfigMap\", metadata: #{ name: `${n}-made` }, data: #{} }), status(#{ fine: true }), condition(\"Ready\", true, \"Fine\", \"fine\")] }",
                "failing.rhai": "fn reconcile(ctx) { throw \"this widget cannot be reconciled\"; }",
            }),
        ),
        cm(
            "broken",
            json!({"broken.yaml": "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: broken}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  script: broken.rhai\n", "broken.rhai": "fn reconcile(ctx) { ["}),
        ),
    ] {
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
}

/// A real Prometheus scrapes `runbook run` every second; each panel's
/// query answers with data, each alert's expression answers without an
/// error, and those the test made true (a policy not in force, targets
/// Degraded) with data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_and_alert_queries_a_real_prometheus() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let c = Cluster::new("monitoring").await;
    support::install_widget_crd(&c).await;
    bundles(&c).await;
    let dir = std::env::temp_dir().join(format!("runbook-monitoring-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    let (metrics_port, hook_port, prom_port) = (free_port(), free_port(), free_port());
    let runbook = Running(
        Command::new(env!("CARGO_BIN_EXE_runbook"))
            .args(["run", "--skip-access-check", "--identity", "monitoring"])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            .args(["--operator-namespace", &c.ns, "--namespace", &c.ns])
            .args(["--policy-namespaces", &c.ns])
            .args(["--webhook-addr", &format!("127.0.0.1:{hook_port}")])
            .args(["--webhook-url", &format!("https://127.0.0.1:{hook_port}")])
            .args(["--webhook-configuration", &format!("runbook-{}", c.ns)])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("RUNBOOK_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("runbook run"),
    );
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    eventually("runbook run ready", 60, || async {
        get(&metrics_addr, "/readyz")
            .await
            .is_some_and(|(code, _)| code == 200)
    })
    .await;
    let widgets = support::widgets(&c);
    support::create_widget(&c, &widgets, "calm", json!({})).await;
    let failing = support::widget(&c, "doomed", json!({}));
    let mut failing = serde_json::to_value(failing).unwrap();
    failing["metadata"]["labels"] = json!({"fail": "yes"});
    widgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(failing).unwrap(),
        )
        .await
        .unwrap();

    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n- job_name: runbook\n  static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
        ),
    )
    .unwrap();
    let _prometheus = Running(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus"),
    );
    let base = format!("127.0.0.1:{prom_port}");
    // Scraped a while: rates need two samples in their window, and the
    // targets' gauge is said every 15 s.
    eventually("Prometheus to see degraded targets", 90, || async {
        query(
            &base,
            "runbook_targets{condition=\"Degraded\",status=\"True\"} > 0",
        )
        .await
        .is_ok_and(|r| !r.is_empty())
    })
    .await;
    for counter in ["runbook_reconcile_failures_total", "runbook_actions_total"] {
        eventually(&format!("two scrapes of {counter}"), 30, || async {
            query(&base, &format!("count_over_time({counter}[1m]) >= 2"))
                .await
                .is_ok_and(|r| !r.is_empty())
        })
        .await;
    }

    let mut queries = 0;
    let mut problems = Vec::new();
    for (title, expr) in panels() {
        queries += 1;
        match query(&base, &expr).await {
            Ok(r) if r.is_empty() => problems.push(format!("panel {title:?}: no data for {expr}")),
            Ok(_) => {}
            Err(e) => problems.push(format!("panel {title:?}: {e} in {expr}")),
        }
    }
    let made = ["RunbookPolicyNotInForce", "RunbookTargetsDegraded"];
    // The failing policy's errors: whether their rate shows yet depends on
    // when its retries fell between scrapes.
    let may = ["RunbookReconcileErrors"];
    let rules = rules_into(&dir);
    for (alert, expr) in &rules {
        queries += 1;
        match query(&base, expr).await {
            Ok(r) if r.is_empty() && made.contains(&alert.as_str()) => {
                problems.push(format!("alert {alert}: no data for {expr}"))
            }
            Ok(r)
                if !r.is_empty()
                    && !made.contains(&alert.as_str())
                    && !may.contains(&alert.as_str()) =>
            {
                problems.push(format!(
                    "alert {alert} would fire on a healthy operator: {r:?}"
                ))
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("alert {alert}: {e} in {expr}")),
        }
    }
    println!("{queries} queries run through Prometheus");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    drop(runbook);
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}
