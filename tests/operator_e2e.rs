//! The operator end to end: a CRD it has never heard of (defined by the
//! test), a policy bound to it, and the executor's contract. Runs on the
//! sandbox, or on a real cluster when RUNBOOK_TEST_KUBECONFIG is set.

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod operator;

use std::time::Duration;

use cluster::{Cluster, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use operator::*;
use runbook::controller::OperatorConfig;
use serde_json::{Value, json};

const POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: widget}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  owns: [{apiVersion: v1, kind: ConfigMap}]
  script: widget.rhai
"#;

const SCRIPT: &str = r#"
fn reconcile(ctx) {
    let w = ctx.resource;
    let name = w.metadata.name;
    let actions = [
        apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${name}-config` }, data: #{ size: `${w.spec.size}` } }),
        apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${name}-ledger` }, data: #{ owner: name } }),
        status(#{ phase: "Ready", configMap: `${name}-config` }),
        condition("Ready", true, "ChildApplied", "the ConfigMap is applied"),
    ];
    if w.spec?.leak == true {
        actions.push(apply(#{ apiVersion: "v1", kind: "Secret", metadata: #{ name: "leak" }, stringData: #{ x: "y" } }));
    }
    actions
}

// Clean-up: the ledger goes first, and only then does the finalizer.
fn finalize(ctx) {
    let ledger = ctx.get("ConfigMap", `${ctx.resource.metadata.name}-ledger`);
    if ledger != () { [delete(ledger)] } else { [] }
}
"#;

async fn setup(
    test: &str,
) -> (
    Cluster,
    std::sync::Arc<runbook::controller::Operator>,
    Api<DynamicObject>,
    Api<ConfigMap>,
) {
    let c = Cluster::new(test).await;
    install_widget_crd(&c).await;
    let set = policies(&c, &[("widget.yaml", POLICY), ("widget.rhai", SCRIPT)]);
    let op = operator(&c, set, OperatorConfig::default());
    op.start().await.expect("the operator starts");
    let widgets = Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(&c));
    let cms = Api::namespaced(c.client.clone(), &c.ns);
    (c, op, widgets, cms)
}

async fn teardown(c: Cluster, op: std::sync::Arc<runbook::controller::Operator>) {
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

fn rv<K: kube::Resource>(k: &K) -> String {
    k.meta().resource_version.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cr_gets_its_children_and_status() {
    let (c, op, widgets, cms) = setup("children").await;
    let w = widgets
        .create(
            &PostParams::default(),
            &widget(&c, "w1", json!({"size": 3})),
        )
        .await
        .unwrap();
    eventually("the child ConfigMap", 30, || async {
        cms.get("w1-config").await.is_ok()
    })
    .await;
    let child = cms.get("w1-config").await.unwrap();
    assert_eq!(child.data.as_ref().unwrap()["size"], "3");
    let owner = &child.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.uid, w.metadata.uid.clone().unwrap());
    assert_eq!(owner.controller, Some(true));
    eventually("the status", 30, || async {
        widgets.get("w1").await.unwrap().data["status"]["phase"] == "Ready"
    })
    .await;
    let w = widgets.get("w1").await.unwrap();
    let st = &w.data["status"];
    assert_eq!(st["observedGeneration"], 1);
    assert_eq!(st["decision"]["policy"], "widget");
    assert_eq!(st["decision"]["mode"], "enforce");
    let ready: Vec<&Value> = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "Ready")
        .collect();
    assert_eq!(ready[0]["status"], "True");
    assert!(
        w.metadata
            .finalizers
            .unwrap()
            .contains(&"runbook.dev/widget".to_string())
    );
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciling_again_without_change_writes_nothing() {
    let (c, op, widgets, cms) = setup("noop").await;
    widgets
        .create(
            &PostParams::default(),
            &widget(&c, "w1", json!({"size": 1})),
        )
        .await
        .unwrap();
    eventually("the status", 30, || async {
        widgets.get("w1").await.unwrap().data["status"]["phase"] == "Ready"
    })
    .await;
    settle(&op).await;
    let (w_rv, cm_rv) = (
        rv(&widgets.get("w1").await.unwrap()),
        rv(&cms.get("w1-config").await.unwrap()),
    );
    let writes = op.ctx.metrics.writes.get();
    let kind = runbook::kinds::KindRef::new(format!("{}/v1", widget_group(&c)), "Widget");
    for _ in 0..10 {
        op.ctx.resync(std::slice::from_ref(&kind));
        settle(&op).await;
    }
    assert_eq!(rv(&widgets.get("w1").await.unwrap()), w_rv);
    assert_eq!(rv(&cms.get("w1-config").await.unwrap()), cm_rv);
    assert_eq!(
        op.ctx.metrics.writes.get(),
        writes,
        "ten no-op reconciles made API writes"
    );
    let children = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.metadata.name.as_deref() == Some("w1-config"))
        .count();
    assert_eq!(children, 1);
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_cr_runs_finalize_then_its_children_are_collected() {
    let (c, op, widgets, cms) = setup("finalize").await;
    widgets
        .create(
            &PostParams::default(),
            &widget(&c, "w1", json!({"size": 1})),
        )
        .await
        .unwrap();
    eventually("the children", 30, || async {
        cms.get("w1-ledger").await.is_ok() && cms.get("w1-config").await.is_ok()
    })
    .await;
    eventually("the finalizer", 30, || async {
        widgets
            .get("w1")
            .await
            .unwrap()
            .metadata
            .finalizers
            .is_some_and(|f| !f.is_empty())
    })
    .await;
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("finalize to delete the ledger", 30, || async {
        cms.get("w1-ledger").await.is_err()
    })
    .await;
    eventually("the widget to go once finalize is done", 30, || async {
        widgets.get("w1").await.is_err()
    })
    .await;
    eventually("the owned ConfigMap to be collected", 60, || async {
        cms.get("w1-config").await.is_err()
    })
    .await;
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_on_an_undeclared_kind_is_refused_and_reported() {
    let (c, op, widgets, _cms) = setup("refused").await;
    widgets
        .create(
            &PostParams::default(),
            &widget(&c, "w1", json!({"size": 1, "leak": true})),
        )
        .await
        .unwrap();
    eventually("the refusal on the status", 30, || async {
        let w = widgets.get("w1").await.unwrap();
        w.data["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "Degraded"
                    && c["status"] == "True"
                    && c["reason"] == "ActionRefused"
                    && c["message"].as_str().unwrap_or("").contains("v1 Secret")
            })
        })
    })
    .await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.client.clone(), &c.ns);
    assert!(secrets.get("leak").await.is_err(), "nothing was written");
    let w = widgets.get("w1").await.unwrap();
    let refused: Vec<&Value> = w.data["status"]["decision"]["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["result"] == "refused")
        .collect();
    assert_eq!(refused.len(), 1);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.client.clone(), &c.ns);
    eventually("a warning Event", 30, || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ActionRefused")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("w1")
            })
    })
    .await;
    let metrics = op.ctx.metrics.render();
    let refusals: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("runbook_refusals_total{policy=\"widget\",action=\"apply\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(refusals >= 1, "{metrics}");
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_server_errors_back_off_and_converge() {
    let c = Cluster::new("faults500").await;
    let Some(sandbox) = c.sandbox.clone() else {
        eprintln!("skipped: fault injection needs the sandbox");
        return;
    };
    install_widget_crd(&c).await;
    let set = policies(&c, &[("widget.yaml", POLICY), ("widget.rhai", SCRIPT)]);
    let op = operator(&c, set, OperatorConfig::default());
    op.start().await.unwrap();
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(&c));
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    sandbox.faults().fail_next(
        4,
        Some(runbook::sandbox::Verb::Patch),
        Some("configmaps"),
        500,
    );
    widgets
        .create(
            &PostParams::default(),
            &widget(&c, "w1", json!({"size": 2})),
        )
        .await
        .unwrap();
    eventually("convergence after the faults", 30, || async {
        widgets.get("w1").await.unwrap().data["status"]["phase"] == "Ready"
    })
    .await;
    assert_eq!(sandbox.faults().failed(), 4);
    assert_eq!(
        cms.get("w1-config").await.unwrap().data.unwrap()["size"],
        "2"
    );
    let w = widgets.get("w1").await.unwrap();
    let degraded = w.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .cloned();
    assert_eq!(
        degraded.map(|d| d["status"].clone()),
        Some(json!("False")),
        "the failure was reported, then cleared"
    );
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_spec_is_applied_to_the_child() {
    let (c, op, widgets, cms) = setup("update").await;
    widgets
        .create(
            &PostParams::default(),
            &widget(&c, "w1", json!({"size": 1})),
        )
        .await
        .unwrap();
    eventually("the child", 30, || async {
        cms.get("w1-config").await.is_ok()
    })
    .await;
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 9}})),
        )
        .await
        .unwrap();
    eventually("the child to follow", 30, || async {
        cms.get("w1-config").await.unwrap().data.unwrap()["size"] == "9"
    })
    .await;
    eventually("observedGeneration 2", 30, || async {
        widgets.get("w1").await.unwrap().data["status"]["observedGeneration"] == 2
    })
    .await;
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leads_and_the_other_takes_over() {
    let c = Cluster::new("leader").await;
    install_widget_crd(&c).await;
    let lease = |id: &str| runbook::controller::leader::LeaseConfig {
        namespace: c.ns.clone(),
        name: "runbook-leader".into(),
        identity: id.into(),
        duration: Duration::from_secs(2),
        renew_every: Duration::from_millis(300),
    };
    let set = || policies(&c, &[("widget.yaml", POLICY), ("widget.rhai", SCRIPT)]);
    let a = operator(
        &c,
        set(),
        OperatorConfig {
            lease: Some(lease("a")),
            identity: "a".into(),
            ..Default::default()
        },
    );
    let b = operator(
        &c,
        set(),
        OperatorConfig {
            lease: Some(lease("b")),
            identity: "b".into(),
            ..Default::default()
        },
    );
    let (a2, b2) = (a.clone(), b.clone());
    tokio::spawn(async move { a2.start().await.unwrap() });
    eventually("a to lead", 30, || async { a.is_leading() }).await;
    tokio::spawn(async move { b2.start().await.unwrap() });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!b.is_leading(), "only one leads");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(&c));
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    widgets
        .create(
            &PostParams::default(),
            &widget(&c, "w1", json!({"size": 1})),
        )
        .await
        .unwrap();
    eventually("the leader to reconcile", 30, || async {
        cms.get("w1-config").await.is_ok()
    })
    .await;
    a.shutdown(Duration::from_secs(5)).await;
    eventually("b to take over", 30, || async { b.is_leading() }).await;
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    eventually("the new leader to reconcile", 30, || async {
        cms.get("w1-config").await.unwrap().data.unwrap()["size"] == "5"
    })
    .await;
    b.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}
