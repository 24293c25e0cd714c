//! The operator end to end: a CRD it has never heard of (defined by the
//! test), a policy bound to it, and the executor's contract. Runs on the
//! sandbox, or on a real cluster when RUNBOOK_TEST_KUBECONFIG is set.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod operator;
#[path = "support/proxy.rs"]
mod proxy;

use std::time::Duration;

use cluster::{Cluster, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use operator::*;
use proxy::Proxy;
use runbook_core::alert::LogSink;
use runbook_core::script::ScriptEngine;
use runbook_operator::reload::{self, Reloader};
use runbook_operator::runtime::OperatorConfig;
use runbook_operator::telemetry::Metrics;
use serde_json::{Value, json};
use std::sync::Arc;

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
    std::sync::Arc<runbook_operator::runtime::Operator>,
    Api<DynamicObject>,
    Api<ConfigMap>,
) {
    setup_with(test, SCRIPT).await
}

/// The widget policy with `script`, running.
async fn setup_with(
    test: &str,
    script: &str,
) -> (
    Cluster,
    std::sync::Arc<runbook_operator::runtime::Operator>,
    Api<DynamicObject>,
    Api<ConfigMap>,
) {
    let c = Cluster::new(test).await;
    install_widget_crd(&c).await;
    let set = policies(&c, &[("widget.yaml", POLICY), ("widget.rhai", script)]);
    let op = operator(&c, set, OperatorConfig::default());
    op.start().await.expect("the operator starts");
    let widgets = Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(&c));
    let cms = Api::namespaced(c.client.clone(), &c.ns);
    (c, op, widgets, cms)
}

/// Wait until Widget `name` says Ready.
async fn ready(widgets: &Api<DynamicObject>, name: &str) {
    eventually("the status", 30, || async {
        widgets.get(name).await.unwrap().data["status"]["phase"] == "Ready"
    })
    .await;
}

/// Label Widget `name`: a change no decision reads.
async fn label_owner(widgets: &Api<DynamicObject>, name: &str) {
    widgets
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"owner": "sre"}}})),
        )
        .await
        .unwrap();
}

/// Wait for an Event with `reason` on the object named `name`, whose
/// note contains `says`.
/// How many times an Event of `reason` was recorded on `name`.
async fn events_of(c: &Cluster, reason: &str, name: &str) -> i32 {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.client.clone(), &c.ns);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| e.deprecated_count.unwrap_or(1))
        .sum()
}

async fn event_on(c: &Cluster, reason: &str, name: &str, says: &str) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.client.clone(), &c.ns);
    eventually(&format!("a {reason} Event on {name}"), 30, || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.note.as_deref().unwrap_or_default().contains(says)
            })
    })
    .await;
}

async fn teardown(c: Cluster, op: std::sync::Arc<runbook_operator::runtime::Operator>) {
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

fn rv<K: kube::Resource>(k: &K) -> String {
    k.meta().resource_version.clone().unwrap_or_default()
}

/// What `/readyz` would answer for `op` (with a reloader that has loaded
/// nothing yet, so only the operator's own state counts).
fn readiness(
    c: &Cluster,
    op: &Arc<runbook_operator::runtime::Operator>,
    metrics: &Arc<Metrics>,
) -> runbook_operator::telemetry::Readiness {
    let reloader = Arc::new(Reloader::new(
        Arc::new(ScriptEngine::default()),
        Some(c.client.clone()),
        metrics.clone(),
        "test",
    ));
    reload::readiness(op, &reloader)
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
    ready(&widgets, "w1").await;
    let w = widgets.get("w1").await.unwrap();
    let st = &w.data["status"];
    assert_eq!(st["observedGeneration"], 1);
    assert_eq!(st["decisions"][0]["policy"], "widget");
    // The compact record: enforcing, and each action carried out, go
    // without saying; an action on the widget itself names no target.
    let record = &st["decisions"][0];
    assert!(record.get("mode").is_none(), "{record}");
    let actions = record["actions"].as_array().unwrap();
    assert!(
        actions.iter().all(|a| a.get("result").is_none()),
        "{record}"
    );
    assert!(
        actions.iter().any(
            |a| a["action"] == "apply" && a["target"].as_str().unwrap().ends_with("/w1-config")
        ),
        "{record}"
    );
    assert!(
        actions
            .iter()
            .filter(|a| a["action"] == "status")
            .all(|a| a.get("target").is_none()),
        "{record}"
    );
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
    let before = op.ctx.metrics.writes.get();
    create_widget(&c, &widgets, "w1", json!({"size": 1})).await;
    ready(&widgets, "w1").await;
    settle(&op).await;
    // The finalizer, two children and one status write; the reconciles
    // that our own writes trigger decide again and write nothing.
    assert_eq!(
        op.ctx.metrics.writes.get() - before,
        4,
        "writes to bring one new Widget to Ready"
    );
    let (w_rv, cm_rv) = (
        rv(&widgets.get("w1").await.unwrap()),
        rv(&cms.get("w1-config").await.unwrap()),
    );
    let writes = op.ctx.metrics.writes.get();
    let kind = runbook_core::kinds::KindRef::new(format!("{}/v1", widget_group(&c)), "Widget");
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
    // The record as a release before the compact form wrote it (each
    // result, the mode, the widget named as the status action's target):
    // the reconciles it wakes leave it as it is.
    let w = widgets.get("w1").await.unwrap();
    let mut older = w.data["status"]["decisions"].clone();
    for d in older.as_array_mut().unwrap() {
        d["mode"] = json!("enforce");
        for a in d["actions"].as_array_mut().unwrap() {
            a["result"] = json!("ok");
            if a["action"] == "status" {
                a["target"] = json!(format!("{}/v1 Widget {}/w1", widget_group(&c), c.ns));
            }
        }
    }
    widgets
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"decisions": older}})),
        )
        .await
        .unwrap();
    let upgraded_rv = rv(&widgets.get("w1").await.unwrap());
    let writes = op.ctx.metrics.writes.get();
    for _ in 0..3 {
        op.ctx.resync(std::slice::from_ref(&kind));
        settle(&op).await;
    }
    let w = widgets.get("w1").await.unwrap();
    assert_eq!(rv(&w), upgraded_rv, "{}", w.data["status"]);
    assert_eq!(w.data["status"]["decisions"], older);
    assert_eq!(
        op.ctx.metrics.writes.get(),
        writes,
        "an older record was rewritten"
    );
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_cr_runs_finalize_then_its_children_are_collected() {
    let (c, op, widgets, cms) = setup("finalize").await;
    create_widget(&c, &widgets, "w1", json!({"size": 1})).await;
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
    // Once the widget is gone from the cache, nothing is remembered of it.
    let kind = runbook_core::kinds::KindRef::new(format!("{}/v1", widget_group(&c)), "Widget");
    eventually("the widget out of the cache", 30, || async {
        op.ctx.target_keys(std::slice::from_ref(&kind)).is_empty()
    })
    .await;
    op.ctx.prune_memory();
    for (store, n) in op.ctx.remembered() {
        assert_eq!(n, 0, "{store} still holds the deleted widget");
    }
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_on_an_undeclared_kind_is_refused_and_reported() {
    let (c, op, widgets, _cms) = setup("refused").await;
    create_widget(&c, &widgets, "w1", json!({"size": 1, "leak": true})).await;
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
    let refused: Vec<&Value> = w.data["status"]["decisions"][0]["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["result"] == "refused")
        .collect();
    assert_eq!(refused.len(), 1);
    event_on(&c, "ActionRefused", "w1", "").await;
    // The status write lands a moment before the reconcile counts it.
    eventually("the refusal counted", 10, || async {
        op.ctx
            .metrics
            .render()
            .lines()
            .find_map(|l| {
                l.strip_prefix("runbook_refusals_total{policy=\"widget\",action=\"apply\"} ")
            })
            .and_then(|n| n.trim().parse::<u64>().ok())
            .is_some_and(|n| n >= 1)
    })
    .await;
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
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    sandbox.faults().fail_next(
        4,
        Some(runbook_sandbox::ApiVerb::Patch),
        Some("configmaps"),
        500,
    );
    create_widget(&c, &widgets, "w1", json!({"size": 2})).await;
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
    // Each failed decision is counted by its cause: the API server's 500s.
    let failures: u64 = op
        .ctx
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("runbook_reconcile_failures_total{kind=\"Widget\",policy=\""))
        .filter_map(|l| l.split_once("cause=\"server\"} ").map(|(_, n)| n))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum();
    assert!((1..=4).contains(&failures), "{failures}");
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_spec_is_applied_to_the_child() {
    let (c, op, widgets, cms) = setup("update").await;
    create_widget(&c, &widgets, "w1", json!({"size": 1})).await;
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

/// A child whose kind the policy owns with `force`: a hand edit of a
/// field the policy writes is taken back at the next reconcile, with an
/// Event on the child naming the manager that had it; a field the policy
/// does not write stays as edited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_edit_of_a_forced_childs_field_is_taken_back() {
    let c = Cluster::new("force").await;
    install_widget_crd(&c).await;
    let forced = POLICY.replace(
        "owns: [{apiVersion: v1, kind: ConfigMap}]",
        "owns: [{apiVersion: v1, kind: ConfigMap, force: true}]",
    );
    let set = policies(&c, &[("widget.yaml", &forced), ("widget.rhai", SCRIPT)]);
    let op = operator(&c, set, OperatorConfig::default());
    op.start().await.expect("the operator starts");
    let widgets = Api::namespaced_with(c.client.clone(), &c.ns, &widget_resource(&c));
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    create_widget(&c, &widgets, "w1", json!({"size": 1})).await;
    let data = |name: &'static str| {
        let cms = cms.clone();
        async move { cms.get(name).await.unwrap().data.unwrap_or_default() }
    };
    eventually("the child", 30, || async {
        cms.get_opt("w1-config").await.unwrap().is_some()
    })
    .await;
    // As `kubectl edit` would: an update under another field manager.
    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    cms.patch(
        "w1-config",
        &edit,
        &Patch::Merge(json!({"data": {"size": "5", "note": "by hand"}})),
    )
    .await
    .unwrap();
    eventually("the policy's field taken back", 30, || async {
        data("w1-config").await.get("size").map(String::as_str) == Some("1")
    })
    .await;
    assert_eq!(
        data("w1-config").await.get("note").map(String::as_str),
        Some("by hand"),
        "a field the policy does not write is left alone"
    );
    event_on(&c, "FieldsReverted", "w1-config", "kubectl-edit").await;
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leads_and_the_other_takes_over() {
    let c = Cluster::new("leader").await;
    install_widget_crd(&c).await;
    let lease = |id: &str| short_lease(&c, "runbook-leader", id);
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
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    reconciled_widget(&c, &widgets, &cms, "w1").await;
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

/// Replicas sharing the work (`--shards`): each target is labelled for
/// its place on the ring of live replicas and decided for by that one
/// only, its children labelled alike; a replica that leaves gives its
/// targets to the others, and one that joins takes its share from them
/// by the drain handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_share_the_targets() {
    use runbook_core::shard::{DRAIN_LABEL, Ring, SHARD_LABEL, key};
    let c = Cluster::new("shards").await;
    install_widget_crd(&c).await;
    // What each replica wrote, and when.
    let journals: std::sync::Mutex<
        Vec<(
            String,
            Arc<runbook_operator::telemetry::journal::MemoryJournal>,
        )>,
    > = Default::default();
    let replica = |id: &str| {
        let op = operator(
            &c,
            policies(&c, &[("widget.yaml", POLICY), ("widget.rhai", SCRIPT)]),
            sharded(&c, id),
        );
        let journal = Arc::new(runbook_operator::telemetry::journal::MemoryJournal::default());
        op.ctx.set_journal(journal.clone());
        journals.lock().unwrap().push((id.to_string(), journal));
        let started = op.clone();
        // As `runbook run` does: start, then follow the Lease and the ring.
        tokio::spawn(async move {
            started.start().await.unwrap();
            started.follow_leadership().await
        });
        op
    };
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let group = widget_group(&c);
    let names: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    // Every widget labelled for its place among `members`, its child
    // labelled alike and showing `size`.
    let placed = |members: Vec<&'static str>, size: i64| {
        let (widgets, cms, names, group, ns) = (
            widgets.clone(),
            cms.clone(),
            names.clone(),
            group.clone(),
            c.ns.clone(),
        );
        async move {
            let ring = Ring::new(members);
            for n in &names {
                let want = ring
                    .owner(&key(&group, "Widget", &ns, n))
                    .unwrap()
                    .to_string();
                let w = widgets.get(n).await.unwrap();
                let labels = w.metadata.labels.clone().unwrap_or_default();
                if labels.get(SHARD_LABEL) != Some(&want) || labels.contains_key(DRAIN_LABEL) {
                    return false;
                }
                let Ok(child) = cms.get(&format!("{n}-config")).await else {
                    return false;
                };
                let child_labels = child.metadata.labels.clone().unwrap_or_default();
                if child_labels.get(SHARD_LABEL) != Some(&want)
                    || child.data.unwrap_or_default().get("size") != Some(&size.to_string())
                {
                    return false;
                }
            }
            true
        }
    };
    let resize = |size: i64| {
        let (widgets, names) = (widgets.clone(), names.clone());
        async move {
            for n in &names {
                widgets
                    .patch(
                        n,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"size": size}})),
                    )
                    .await
                    .unwrap();
            }
        }
    };
    let a = replica("a");
    let b = replica("b");
    for n in &names {
        create_widget(&c, &widgets, n, json!({"size": 1})).await;
    }
    eventually("each widget placed on a or b and reconciled", 60, || {
        placed(vec!["a", "b"], 1)
    })
    .await;
    // b leaves: its widgets go to a.
    b.shutdown(Duration::from_secs(5)).await;
    resize(2).await;
    eventually("every widget on a, reconciled there", 60, || {
        placed(vec!["a"], 2)
    })
    .await;
    // c joins: it takes its share from a, by the handshake.
    let c_op = replica("c");
    eventually("the widgets shared between a and c", 60, || {
        placed(vec!["a", "c"], 2)
    })
    .await;
    resize(3).await;
    eventually("each reconciled by its own replica", 60, || {
        placed(vec!["a", "c"], 3)
    })
    .await;
    a.shutdown(Duration::from_secs(5)).await;
    c_op.shutdown(Duration::from_secs(5)).await;
    // No widget was written by two replicas at once: the spans of time
    // in which each replica wrote it do not overlap.
    let journals = std::mem::take(&mut *journals.lock().unwrap());
    for n in &names {
        let spans: Vec<(String, jiff::Timestamp, jiff::Timestamp)> = journals
            .iter()
            .filter_map(|(id, j)| {
                let times: Vec<jiff::Timestamp> = j
                    .entries()
                    .into_iter()
                    .filter(|e| e.kind == "Widget" && &e.name == n && e.result == "ok")
                    .map(|e| e.time)
                    .collect();
                Some((id.clone(), *times.iter().min()?, *times.iter().max()?))
            })
            .collect();
        for (i, (x, x0, x1)) in spans.iter().enumerate() {
            for (y, y0, y1) in &spans[i + 1..] {
                assert!(
                    x1 < y0 || y1 < x0,
                    "{n} written by {x} ({x0} .. {x1}) and by {y} ({y0} .. {y1}) at once"
                );
            }
        }
        assert!(!spans.is_empty(), "{n} was written by none");
        if spans.len() > 1 {
            eprintln!(
                "{n}: written by {:?}, one after another",
                spans.iter().map(|s| &s.0).collect::<Vec<_>>()
            );
        }
    }
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// Sharded replicas serving the authorship webhook place a target at
/// its creation: the object the API server stores already carries its
/// member's label (and the mark that it was placed so), so the assigner
/// never writes it, and that member decides for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_place_new_targets_at_admission() {
    use runbook_core::shard::{PLACED_ANNOTATION, Ring, SHARD_LABEL, key};
    use runbook_operator::runtime::shard::{MEMBERS_ANNOTATION, published_name};
    let c = Cluster::new("shards-admit").await;
    install_widget_crd(&c).await;
    let replica = |id: &str| {
        let config = OperatorConfig {
            webhook: Some(test_webhook(&c)),
            ..sharded(&c, id)
        };
        let op = operator(
            &c,
            policies(&c, &[("widget.yaml", POLICY), ("widget.rhai", SCRIPT)]),
            config,
        );
        let started = op.clone();
        tokio::spawn(async move {
            started.start().await.unwrap();
            started.follow_leadership().await
        });
        op
    };
    let (a, b) = (replica("a"), replica("b"));
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.client.clone(), &c.ns);
    eventually("the ring of a and b published", 60, || async {
        leases
            .get(&published_name("runbook-ring"))
            .await
            .ok()
            .and_then(|l| l.metadata.annotations?.get(MEMBERS_ANNOTATION).cloned())
            .as_deref()
            == Some("a,b")
    })
    .await;
    let (widgets, group, ns) = (widgets(&c), widget_group(&c), c.ns.clone());
    let ring = Ring::new(["a", "b"]);
    let owner = |n: &str| {
        ring.owner(&key(&group, "Widget", &ns, n))
            .unwrap()
            .to_string()
    };
    let meta = |o: &DynamicObject, field: &str, k: &str| -> Option<String> {
        let m = match field {
            "labels" => o.metadata.labels.as_ref(),
            _ => o.metadata.annotations.as_ref(),
        };
        m?.get(k).cloned()
    };
    // Both replicas have seen that ring once a creation is placed by it
    // (whichever replica the API server reached, the answer is the same).
    let mut probe = 0;
    eventually("a probe placed at its creation", 30, || {
        probe += 1;
        let name = format!("probe{probe}");
        let (widgets, want) = (widgets.clone(), owner(&name));
        let c = &c;
        async move {
            let w = widgets
                .create(
                    &PostParams::default(),
                    &widget(c, &name, json!({"size": 1})),
                )
                .await
                .unwrap();
            meta(&w, "labels", SHARD_LABEL) == Some(want)
        }
    })
    .await;
    // Probes placed by a ring a replica had not yet read are moved; they
    // are settled before the reads are counted.
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let decided_by = |n: String| {
        let (cms, widgets, want) = (cms.clone(), widgets.clone(), owner(&n));
        async move {
            let labelled = |l: Option<std::collections::BTreeMap<String, String>>| {
                let l = l.unwrap_or_default();
                l.get(SHARD_LABEL) == Some(&want)
                    && !l.contains_key(runbook_core::shard::DRAIN_LABEL)
            };
            widgets
                .get(&n)
                .await
                .is_ok_and(|w| labelled(w.metadata.labels))
                && cms
                    .get(&format!("{n}-config"))
                    .await
                    .is_ok_and(|cm| labelled(cm.metadata.labels))
        }
    };
    for i in 1..=probe {
        let n = format!("probe{i}");
        eventually(&format!("{n} placed and decided"), 60, || {
            decided_by(n.clone())
        })
        .await;
    }
    // From here on, reading a RunbookState fails (on the sandbox): a
    // target placed at its creation is decided without asking for one.
    if let Some(sandbox) = &c.sandbox {
        sandbox.faults().fail_next(
            1_000,
            Some(runbook_sandbox::ApiVerb::Get),
            Some("runbookstates"),
            500,
        );
    }
    let names: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    for n in &names {
        let w = widgets
            .create(&PostParams::default(), &widget(&c, n, json!({"size": 4})))
            .await
            .unwrap();
        // As stored by the create itself.
        assert_eq!(meta(&w, "labels", SHARD_LABEL), Some(owner(n)), "{n}");
        assert_eq!(
            meta(&w, "annotations", PLACED_ANNOTATION),
            Some(owner(n)),
            "{n}"
        );
    }
    for n in &names {
        let want = owner(n);
        eventually(&format!("{n} decided by {want}"), 60, || {
            decided_by(n.clone())
        })
        .await;
        // Never labelled again by the assigner: its placement takes the
        // mark off.
        let w = widgets.get(n).await.unwrap();
        assert_eq!(
            meta(&w, "annotations", PLACED_ANNOTATION),
            Some(want),
            "{n}"
        );
    }
    match &c.sandbox {
        Some(sandbox) => {
            assert_eq!(sandbox.faults().failed(), 0, "no RunbookState was read");
            // The fault is armed: a read of one fails.
            let read = c.runbook_states().get_opt("any").await;
            assert!(read.is_err(), "{read:?}");
            assert_eq!(sandbox.faults().failed(), 1);
            sandbox.faults().clear();
        }
        None => eprintln!("the reads of RunbookStates are counted on the sandbox only"),
    }
    // A user's edit of the label drops the mark: the target is treated as
    // moved from then on.
    let patch = json!({"metadata": {"labels": {SHARD_LABEL: "elsewhere"}}});
    let w = widgets
        .patch("w0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(meta(&w, "annotations", PLACED_ANNOTATION), None);
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const ROLLBACK_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: roller}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  mutates: [{apiVersion: apps/v1, kind: Deployment}]
  script: roller.rhai
"#;

/// Rolls back once: a rollback to "the previous revision" is not
/// idempotent (a second one would undo the first), so the script records
/// that it rolled back and does not again, as a user's script must.
const ROLLBACK_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let w = ctx.resource;
    if w.spec.rollback != true {
        [status(#{ phase: "Idle" })]
    } else if w.status?.phase == "RolledBack" {
        []
    } else {
        [rollback(w.spec.deployment, w.spec?.toRevision), status(#{ phase: "RolledBack" })]
    }
}
"#;

fn template(rev: i64) -> Value {
    json!({"metadata": {"labels": {"app": "web"}},
           "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9", "env": [{"name": "REV", "value": rev.to_string()}]}]}})
}

/// A Deployment with three revisions: rolled out by the real controller on
/// a cluster; written by hand on the sandbox, which runs no controllers.
async fn deployment_with_revisions(c: &Cluster) -> Api<k8s_openapi::api::apps::v1::Deployment> {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), &c.ns);
    let rsets: Api<ReplicaSet> = Api::namespaced(c.client.clone(), &c.ns);
    let dep: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}}, "template": template(1)}
    }))
    .unwrap();
    let created = deps.create(&PostParams::default(), &dep).await.unwrap();
    if c.sandbox.is_some() {
        for rev in 1..=3 {
            let mut t = template(rev);
            t["metadata"]["labels"]["pod-template-hash"] = json!(format!("h{rev}"));
            let rs: ReplicaSet = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": format!("web-h{rev}"), "labels": {"app": "web", "pod-template-hash": format!("h{rev}")},
                             "annotations": {"deployment.kubernetes.io/revision": rev.to_string()},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": created.metadata.uid, "controller": true}]},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web", "pod-template-hash": format!("h{rev}")}}, "template": t}
            }))
            .unwrap();
            rsets.create(&PostParams::default(), &rs).await.unwrap();
        }
        deps.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"deployment.kubernetes.io/revision": "3"}},
                "spec": {"template": template(3)}
            })),
        )
        .await
        .unwrap();
    } else {
        for rev in 2..=3 {
            deps.patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": template(rev)}})),
            )
            .await
            .unwrap();
            eventually("the rollout to record the revision", 120, || async {
                deps.get("web")
                    .await
                    .unwrap()
                    .metadata
                    .annotations
                    .unwrap_or_default()
                    .get("deployment.kubernetes.io/revision")
                    == Some(&rev.to_string())
            })
            .await;
        }
    }
    deps
}

fn rev_of(d: &k8s_openapi::api::apps::v1::Deployment) -> String {
    let env = d.spec.template.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    env[0].value.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_writes_back_the_previous_revisions_template() {
    let c = Cluster::new("rollback").await;
    install_widget_crd(&c).await;
    let deps = deployment_with_revisions(&c).await;
    assert_eq!(rev_of(&deps.get("web").await.unwrap()), "3");
    let op = started(
        &c,
        &[
            ("roller.yaml", ROLLBACK_POLICY),
            ("roller.rhai", ROLLBACK_SCRIPT),
        ],
    )
    .await;
    let widgets = widgets(&c);
    create_widget(
        &c,
        &widgets,
        "undo",
        json!({"rollback": true, "deployment": "web"}),
    )
    .await;
    eventually("the rollback to revision 2", 60, || async {
        rev_of(&deps.get("web").await.unwrap()) == "2"
    })
    .await;
    eventually("the status", 30, || async {
        widgets.get("undo").await.unwrap().data["status"]["phase"] == "RolledBack"
    })
    .await;
    // An explicit revision.
    widgets
        .create(
            &PostParams::default(),
            &widget(
                &c,
                "to-one",
                json!({"rollback": true, "deployment": "web", "toRevision": 1}),
            ),
        )
        .await
        .unwrap();
    eventually("the rollback to revision 1", 60, || async {
        rev_of(&deps.get("web").await.unwrap()) == "1"
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const FRAGILE_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let w = ctx.resource;
    if w.spec.size == 13 { throw "thirteen is unlucky"; }
    let data = if w.spec?.badKey == true { #{ "not a key!": "x" } } else { #{ size: `${w.spec.size}` } };
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${w.metadata.name}-config` }, data: data }),
     status(#{ phase: "Ready" })]
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_object_is_reported_and_the_others_carry_on() {
    let c = Cluster::new("isolation").await;
    install_widget_crd(&c).await;
    let op = started(
        &c,
        &[("widget.yaml", POLICY), ("widget.rhai", FRAGILE_SCRIPT)],
    )
    .await;
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    create_widget(&c, &widgets, "unlucky", json!({"size": 13})).await;
    create_widget(&c, &widgets, "invalid", json!({"size": 1, "badKey": true})).await;
    create_widget(&c, &widgets, "fine", json!({"size": 2})).await;
    eventually("the healthy one", 30, || async {
        widgets.get("fine").await.unwrap().data["status"]["phase"] == "Ready"
    })
    .await;
    let degraded = |name: &'static str, reason: &'static str, text: &'static str| {
        let widgets = widgets.clone();
        async move {
            eventually(&format!("{name} degraded with {reason}"), 30, || async {
                let w = widgets.get(name).await.unwrap();
                w.data["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == "Degraded"
                            && c["reason"] == reason
                            && c["message"].as_str().unwrap_or("").contains(text)
                    })
                })
            })
            .await;
        }
    };
    degraded("unlucky", "ScriptError", "thirteen is unlucky").await;
    degraded("invalid", "ActionFailed", "422").await;
    assert!(cms.get("invalid-config").await.is_err());
    assert_ne!(
        widgets.get("invalid").await.unwrap().data["status"]["phase"],
        "Ready",
        "no status claims what did not happen"
    );
    assert_eq!(
        cms.get("fine-config").await.unwrap().data.unwrap()["size"],
        "2"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_ends_is_restarted_and_readyz_names_it_meanwhile() {
    let c = Cluster::new("supervise").await;
    install_widget_crd(&c).await;
    let metrics = Arc::new(Metrics::new());
    let op = operator_through(
        &c,
        c.operator_client.clone(),
        policies(&c, &[("widget.yaml", POLICY), ("widget.rhai", SCRIPT)]),
        OperatorConfig::default(),
        metrics.clone(),
        Arc::new(LogSink::default()),
    );
    op.start().await.expect("the operator starts");
    let ready = readiness(&c, &op, &metrics);
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    create_widget(&c, &widgets, "first", json!({"size": 1})).await;
    eventually("the first widget", 30, || async {
        cms.get("first-config").await.is_ok()
    })
    .await;
    eventually("ready", 30, || async { ready().is_ok() }).await;
    // The controller of Widgets ends, as a panic outside a reconcile
    // would end it: nothing would reconcile a Widget again.
    let kind = runbook_core::kinds::KindRef::new(format!("{}/v1", widget_group(&c)), "Widget");
    op.ctx.end_controller(&kind);
    eventually("/readyz names the controller that ended", 10, || async {
        ready().is_err_and(|why| {
            why.contains(&format!("controller of {kind}")) && why.contains("restarting")
        })
    })
    .await;
    eventually("ready again once it is restarted", 30, || async {
        ready().is_ok()
    })
    .await;
    create_widget(&c, &widgets, "second", json!({"size": 2})).await;
    eventually(
        "a widget created after the restart is reconciled",
        30,
        || async { cms.get("second-config").await.is_ok() },
    )
    .await;
    let text = metrics.render();
    assert!(
        text.contains("runbook_controller_restarts_total{kind=\"Widget\"} 1"),
        "{text}"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// Create a widget and wait until the leader made its ConfigMap.
async fn reconciled_widget(
    c: &Cluster,
    widgets: &Api<DynamicObject>,
    cms: &Api<ConfigMap>,
    name: &str,
) {
    create_widget(c, widgets, name, json!({"size": 1})).await;
    let config = format!("{name}-config");
    eventually("the leader to reconcile", 30, || async {
        cms.get(&config).await.is_ok()
    })
    .await;
}

/// The widget CRD, and an operator running the widget policy that reaches
/// its API server through a proxy the test can cut.
async fn behind_a_proxy(
    c: &Cluster,
    config: OperatorConfig,
) -> (
    Proxy,
    Arc<runbook_operator::runtime::Operator>,
    Arc<Metrics>,
) {
    install_widget_crd(c).await;
    let proxy = Proxy::start(c).await;
    let metrics = Arc::new(Metrics::new());
    let op = operator_through(
        c,
        proxy.client().await,
        policies(c, &[("widget.yaml", POLICY), ("widget.rhai", SCRIPT)]),
        config,
        metrics.clone(),
        Arc::new(LogSink::default()),
    );
    (proxy, op, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_is_waited_out_and_nothing_is_done_twice() {
    let c = Cluster::new("outage").await;
    let (proxy, op, metrics) = behind_a_proxy(&c, OperatorConfig::default()).await;
    // It starts while the API server is away, and waits for it.
    proxy.cut();
    let starting = {
        let op = op.clone();
        tokio::spawn(async move { op.start().await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!starting.is_finished(), "start-up waits for the API server");
    proxy.restore();
    starting
        .await
        .unwrap()
        .expect("the operator starts once the API server answers");
    let ready = readiness(&c, &op, &metrics);
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    create_widget(&c, &widgets, "before", json!({"size": 1})).await;
    eventually("the first widget", 30, || async {
        cms.get("before-config").await.is_ok()
    })
    .await;
    eventually("ready", 30, || async { ready().is_ok() }).await;
    // The API server goes away for the operator: every request fails and
    // every watch drops. Meanwhile another client creates a widget.
    proxy.cut();
    create_widget(&c, &widgets, "during", json!({"size": 2})).await;
    eventually("not ready, naming the failing watches", 30, || async {
        ready().is_err_and(|why| why.contains("watch of") && why.contains("failing for"))
    })
    .await;
    proxy.restore();
    let back = std::time::Instant::now();
    eventually("recovery", 60, || async {
        cms.get("during-config").await.is_ok()
    })
    .await;
    let caught_up = back.elapsed();
    eprintln!(
        "caught up {:.1} s after the API server came back",
        caught_up.as_secs_f64()
    );
    assert!(
        caught_up < Duration::from_secs(15),
        "watches retry at most every 5 s: caught up after {caught_up:?}"
    );
    eventually("both reconciled", 30, || async {
        widgets.get("during").await.unwrap().data["status"]["phase"] == "Ready"
    })
    .await;
    eventually("ready again", 30, || async { ready().is_ok() }).await;
    let names: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.ends_with("-config"))
        .collect();
    assert_eq!(
        names,
        ["before-config", "during-config"],
        "one child each, nothing twice"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// A leader that loses its Lease to an outage stops acting and stands by
/// (it used to exit, leaving a single replica gone until restarted): while
/// another holds the Lease it writes nothing, and when that holder stops
/// renewing it leads again and reconciles what changed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_stands_by_and_leads_again() {
    use k8s_openapi::api::coordination::v1::Lease;
    let c = Cluster::new("relead").await;
    let config = OperatorConfig {
        lease: Some(runbook_operator::runtime::leader::LeaseConfig {
            namespace: c.ns.clone(),
            name: "runbook-leader".into(),
            identity: "a".into(),
            duration: Duration::from_secs(2),
            renew_every: Duration::from_millis(300),
        }),
        identity: "a".into(),
        ..Default::default()
    };
    let (proxy, op, _metrics) = behind_a_proxy(&c, config).await;
    op.start().await.unwrap();
    let following = {
        let op = op.clone();
        tokio::spawn(async move { op.follow_leadership().await })
    };
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    reconciled_widget(&c, &widgets, &cms, "first").await;
    // The API server goes away for the leader; once its renewal is no
    // longer trusted it stops leading, and another holder takes the Lease.
    proxy.cut();
    eventually("the leader to step down", 30, || async { !op.is_leading() }).await;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.ns);
    // Another replica's renewals, written as the test's user.
    let hold = move || {
        let leases = leases.clone();
        async move {
            let mut l = leases.get("runbook-leader").await.unwrap();
            let spec = l.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some("other".into());
            spec.lease_duration_seconds = Some(2);
            spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                jiff::Timestamp::now(),
            ));
            let _ = leases
                .replace("runbook-leader", &PostParams::default(), &l)
                .await;
        }
    };
    hold().await;
    let other = tokio::spawn(async move {
        for _ in 0..20 {
            hold().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    proxy.restore();
    create_widget(&c, &widgets, "meanwhile", json!({"size": 2})).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!following.is_finished(), "the replica stays, standing by");
    assert!(!op.is_leading(), "another holds the Lease");
    assert!(
        cms.get_opt("meanwhile-config").await.unwrap().is_none(),
        "a replica that lost the Lease writes nothing"
    );
    // The other holder stops renewing: the replica leads again and
    // reconciles what was created meanwhile.
    other.await.unwrap();
    eventually("leading again", 30, || async { op.is_leading() }).await;
    eventually("the change made meanwhile reconciled", 30, || async {
        cms.get_opt("meanwhile-config").await.unwrap().is_some()
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    assert!(following.await.is_ok());
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// A network that drops packets rather than refusing them: the leader's
/// renewal neither succeeds nor fails. It must stop acting once its last
/// renewal is no longer trusted (half the lease), before a standby, which
/// waits three fifths of it, can take over; a renewal left hanging must
/// not keep it leading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_renewal_hangs_stops_before_a_standby_takes_over() {
    let c = Cluster::new("hang").await;
    let lease = short_lease(&c, "runbook-leader", "a");
    let duration = lease.duration;
    let config = OperatorConfig {
        lease: Some(lease),
        identity: "a".into(),
        ..Default::default()
    };
    let (proxy, op, _metrics) = behind_a_proxy(&c, config).await;
    op.start().await.unwrap();
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    reconciled_widget(&c, &widgets, &cms, "first").await;
    let lost = {
        let op = op.clone();
        tokio::spawn(async move { op.lost_leadership().await })
    };
    proxy.stall();
    // Its last renewal was sent before the stall; a standby that saw it
    // could count it gone three fifths of the lease after.
    let bound = duration.mul_f64(0.6);
    assert!(
        tokio::time::timeout(bound, lost).await.is_ok(),
        "still leading {bound:?} after the stall, when a standby may take over"
    );
    proxy.restore();
    eventually("leading again", 30, || async { op.is_leading() }).await;
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const SHADOW_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: widget-next}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  owns: [{apiVersion: v1, kind: ConfigMap}]
  script: widget.rhai
  mode: shadow
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_decides_and_records_but_writes_nothing() {
    let c = Cluster::new("shadow").await;
    install_widget_crd(&c).await;
    let op = started(&c, &[("next.yaml", SHADOW_POLICY), ("widget.rhai", SCRIPT)]).await;
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    create_widget(&c, &widgets, "w1", json!({"size": 1})).await;
    eventually("a shadow record", 30, || async {
        !op.ctx.shadow_records().is_empty()
    })
    .await;
    settle(&op).await;
    let rec = op.ctx.shadow_records().pop().unwrap();
    assert_eq!(rec.record.policy, "widget-next");
    assert_eq!(rec.record.mode.as_deref(), Some("shadow"));
    assert!(
        rec.record
            .actions
            .iter()
            .any(|a| a.action == "apply" && a.result == runbook_core::crd::ActionResult::Shadow),
        "{:?}",
        rec.record.actions
    );
    assert!(
        cms.get("w1-config").await.is_err(),
        "a shadow policy applies nothing"
    );
    let w = widgets.get("w1").await.unwrap();
    assert!(
        w.data
            .get("status")
            .is_none_or(|s| s.is_null() || s.get("decisions").is_none()),
        "nor writes status: {:?}",
        w.data
    );
    assert!(
        w.metadata.finalizers.unwrap_or_default().is_empty(),
        "nor adds finalizers"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const LIMITED_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: limited}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  owns: [{apiVersion: v1, kind: ConfigMap}]
  script: limited.rhai
  limits: {apply: 1/1h}
"#;

const LIMITED_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let n = ctx.resource.metadata.name;
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${n}-a` }, data: #{ x: "1" } }),
     apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${n}-b` }, data: #{ x: "1" } })]
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blast_radius_limit_holds_actions_past_it() {
    let c = Cluster::new("limits").await;
    install_widget_crd(&c).await;
    let op = started(
        &c,
        &[
            ("limited.yaml", LIMITED_POLICY),
            ("limited.rhai", LIMITED_SCRIPT),
        ],
    )
    .await;
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    create_widget(&c, &widgets, "w1", json!({})).await;
    eventually("the limit on the status", 30, || async {
        let w = widgets.get("w1").await.unwrap();
        w.data["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "ActionLimited"))
    })
    .await;
    settle(&op).await;
    assert!(cms.get("w1-a").await.is_ok());
    assert!(
        cms.get("w1-b").await.is_err(),
        "the second apply is over the 1/1h limit"
    );
    let w = widgets.get("w1").await.unwrap();
    assert_eq!(
        w.data["status"]["decisions"][0]["recentActions"]["apply"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "the limit's memory is in status"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const LISTER_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: lister}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  owns: [{apiVersion: v1, kind: ConfigMap}]
  script: lister.rhai
"#;

/// Reports the kinds of the target and its children as the script sees them.
const LISTER_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let owned = [];
    for c in ctx.owned("ConfigMap") { owned.push(`${c.apiVersion} ${c.kind} ${c.metadata.name}`); }
    owned.sort();
    [status(#{ target: `${ctx.resource.apiVersion} ${ctx.resource.kind}`, owned: owned })]
}
"#;

/// A real API server leaves `apiVersion` and `kind` off listed objects, and
/// at start-up (as after a failover or a relist) every object is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_listed_at_start_up_carry_their_kind() {
    let c = Cluster::new("listedkind").await;
    install_widget_crd(&c).await;
    let widgets = widgets(&c);
    let w = widgets
        .create(&PostParams::default(), &widget(&c, "w", json!({})))
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let child: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "w-child",
            "labels": {"app.kubernetes.io/managed-by": "runbook", "runbook.dev/policy-name": "lister"},
            "ownerReferences": [{
            "apiVersion": format!("{}/v1", widget_group(&c)), "kind": "Widget", "name": "w",
            "uid": w.metadata.uid, "controller": true}]},
        "data": {"a": "b"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &child).await.unwrap();
    let want = json!({
        "target": format!("{}/v1 Widget", widget_group(&c)),
        "owned": ["v1 ConfigMap w-child"],
    });
    for run in 0..2 {
        if run == 1 {
            widgets
                .patch_status(
                    "w",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"target": null, "owned": null}})),
                )
                .await
                .unwrap();
        }
        // Start (then restart) the operator on objects that already exist.
        let op = operator(
            &c,
            policies(
                &c,
                &[
                    ("lister.yaml", LISTER_POLICY),
                    ("lister.rhai", LISTER_SCRIPT),
                ],
            ),
            OperatorConfig::default(),
        );
        op.start().await.unwrap();
        eventually("the kinds in the status", 30, || async {
            let st = &widgets.get("w").await.unwrap().data["status"];
            st["target"] == want["target"] && st["owned"] == want["owned"]
        })
        .await;
        op.shutdown(Duration::from_secs(5)).await;
    }
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const SIZE_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: sizer}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  script: sizer.rhai
"#;

/// The same actions every time; only the status they write changes.
const SIZE_SCRIPT: &str = r#"
fn reconcile(ctx) {
    [status(#{ size: ctx.resource.spec.size })]
}
"#;

/// `runbook explain` reads the decision record in the status: it must be
/// the record of the decision that wrote that status, not an older one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_record_is_never_older_than_its_status() {
    let c = Cluster::new("recordage").await;
    install_widget_crd(&c).await;
    let op = started(
        &c,
        &[("sizer.yaml", SIZE_POLICY), ("sizer.rhai", SIZE_SCRIPT)],
    )
    .await;
    let widgets = widgets(&c);
    create_widget(&c, &widgets, "w", json!({"size": 1})).await;
    eventually("size 1", 30, || async {
        widgets.get("w").await.unwrap().data["status"]["size"] == 1
    })
    .await;
    let first = widgets.get("w").await.unwrap().data["status"]["decisions"][0].clone();
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    eventually("size 2", 30, || async {
        widgets.get("w").await.unwrap().data["status"]["size"] == 2
    })
    .await;
    settle(&op).await;
    let second = widgets.get("w").await.unwrap().data["status"]["decisions"][0].clone();
    assert_ne!(
        first["inputsHash"], second["inputsHash"],
        "the record is that of the decision that wrote size 2"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// A user's own kind named as they like: a plural that is not the kind's
/// lowercase + "s", and cluster scope. Watches and writes use what
/// discovery says, not a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_scoped_kind_with_an_odd_plural_is_reconciled() {
    let c = Cluster::new("oddplural").await;
    let (group, clusters) = database_cluster_kind(&c).await;
    let policy = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: clusters}}\nspec:\n  target: {{apiVersion: {group}/v1, kind: DatabaseCluster}}\n  script: clusters.rhai\n"
    );
    let op = operator(
        &c,
        policies(
            &c,
            &[
                ("clusters.yaml", &policy),
                (
                    "clusters.rhai",
                    "fn reconcile(ctx) { [status(#{ seen: ctx.resource.metadata.name })] }",
                ),
            ],
        ),
        OperatorConfig::default(),
    );
    tokio::time::timeout(Duration::from_secs(30), op.start())
        .await
        .expect("the operator starts")
        .unwrap();
    let db: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "DatabaseCluster",
        "metadata": {"name": format!("{}-orders", c.ns)}, "spec": {}
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &db).await.unwrap();
    let name = format!("{}-orders", c.ns);
    eventually("the cluster-scoped object reconciled", 30, || async {
        clusters.get(&name).await.unwrap().data["status"]["seen"] == json!(name)
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// A cluster-scoped kind of the test's own, with an odd plural
/// (`dbclusters` for DatabaseCluster), once served: its group and API.
async fn database_cluster_kind(c: &Cluster) -> (String, Api<DynamicObject>) {
    let group = format!("{}.e2e.runbook.dev", c.ns);
    let crds: Api<DynamicObject> = Api::all_with(c.client.clone(), &crd_resource());
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("dbclusters.{group}")},
        "spec": {"group": group, "scope": "Cluster",
                 "names": {"kind": "DatabaseCluster", "plural": "dbclusters", "singular": "dbcluster"},
                 "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let ar = kube::core::ApiResource {
        group: group.clone(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "DatabaseCluster".into(),
        plural: "dbclusters".into(),
    };
    let clusters: Api<DynamicObject> = Api::all_with(c.client.clone(), &ar);
    eventually("the kind to be served", 60, || async {
        clusters.list(&Default::default()).await.is_ok()
    })
    .await;
    (group, clusters)
}

/// Sharded replicas place a cluster-scoped kind's objects too (no
/// namespace in their key), each decided by the replica it is placed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_share_a_cluster_scoped_kind() {
    use runbook_core::shard::{Ring, SHARD_LABEL, key};
    let c = Cluster::new("shardcl").await;
    let (group, clusters) = database_cluster_kind(&c).await;
    let policy = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: clusters}}\nspec:\n  target: {{apiVersion: {group}/v1, kind: DatabaseCluster}}\n  script: clusters.rhai\n"
    );
    let replica = |id: &str| {
        let op = operator(
            &c,
            policies(
                &c,
                &[
                    ("clusters.yaml", &policy),
                    (
                        "clusters.rhai",
                        "fn reconcile(ctx) { [status(#{ seen: ctx.resource.metadata.name })] }",
                    ),
                ],
            ),
            sharded(&c, id),
        );
        let started = op.clone();
        // As `runbook run` does: start, then follow the Lease and the ring.
        tokio::spawn(async move {
            started.start().await.unwrap();
            started.follow_leadership().await
        });
        op
    };
    let (a, b) = (replica("a"), replica("b"));
    let names: Vec<String> = (0..6).map(|i| format!("{}-db{i}", c.ns)).collect();
    for n in &names {
        let db: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{group}/v1"), "kind": "DatabaseCluster",
            "metadata": {"name": n}, "spec": {}
        }))
        .unwrap();
        clusters.create(&PostParams::default(), &db).await.unwrap();
    }
    let ring = Ring::new(["a", "b"]);
    eventually("each placed for its key and decided", 60, || async {
        for n in &names {
            let o = clusters.get(n).await.unwrap();
            let want = ring.owner(&key(&group, "DatabaseCluster", "", n)).unwrap();
            let shard = o
                .metadata
                .labels
                .clone()
                .unwrap_or_default()
                .get(SHARD_LABEL)
                .cloned();
            if shard.as_deref() != Some(want) || o.data["status"]["seen"] != json!(n) {
                return false;
            }
        }
        true
    })
    .await;
    for n in &names {
        let _ = clusters.delete(n, &Default::default()).await;
    }
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
    c.cleanup().await;
}

const SLOPPY_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let w = ctx.resource;
    let labels = if w.spec?.sloppy == true { "team=ml" } else { #{ team: "ml" } };
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${w.metadata.name}-config`, labels: labels }, data: #{ a: "b" } }),
     status(#{ phase: "Ready" })]
}
"#;

/// A user's script that hands over labels that are not a map (it used to
/// panic in the executor and end the controller of the whole kind): the
/// error names the script's place, on that object only, and the kind's
/// other objects are still reconciled, before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_object_from_a_script_fails_that_object_only() {
    let c = Cluster::new("sloppy").await;
    install_widget_crd(&c).await;
    let op = started(
        &c,
        &[("widget.yaml", POLICY), ("widget.rhai", SLOPPY_SCRIPT)],
    )
    .await;
    let widgets = widgets(&c);
    create_widget(&c, &widgets, "sloppy", json!({"sloppy": true})).await;
    eventually(
        "the error on the object, with the script's place",
        30,
        || async {
            let st = &widgets.get("sloppy").await.unwrap().data["status"];
            st["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["type"] == "Degraded"
                        && c["message"].as_str().is_some_and(|m| {
                            m.contains("widget.rhai:5:")
                                && m.contains(
                                    "metadata.labels must be a map of strings, not a string",
                                )
                        })
                })
            })
        },
    )
    .await;
    create_widget(&c, &widgets, "tidy", json!({})).await;
    eventually("the kind's other objects still reconciled", 30, || async {
        widgets.get("tidy").await.unwrap().data["status"]["phase"] == "Ready"
    })
    .await;
    assert!(!op.ctx.metrics.render().contains("runbook_panics_total{"));
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const UNIT_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let w = ctx.resource;
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${w.metadata.name}-config` },
              data: #{ a: "b", owner: w.spec?.owner } }),
     status(#{ phase: "Ready", size: w.spec.size })]
}
"#;

/// `()` in an object to apply leaves the field out; it does not make every
/// later reconcile apply the object again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_field_in_an_applied_object_is_left_out_and_applied_once() {
    let c = Cluster::new("unitfield").await;
    install_widget_crd(&c).await;
    let op = started(&c, &[("widget.yaml", POLICY), ("widget.rhai", UNIT_SCRIPT)]).await;
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    create_widget(&c, &widgets, "w", json!({"size": 1})).await;
    eventually("the child", 30, || async {
        cms.get("w-config").await.is_ok()
    })
    .await;
    settle(&op).await;
    let first = cms.get("w-config").await.unwrap();
    assert_eq!(
        first.data.clone().unwrap().keys().collect::<Vec<_>>(),
        ["a"],
        "the unit field is left out"
    );
    for size in 2..5 {
        widgets
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"size": size}})),
            )
            .await
            .unwrap();
        eventually("the reconcile", 30, || async {
            widgets.get("w").await.unwrap().data["status"]["size"] == size
        })
        .await;
    }
    settle(&op).await;
    assert_eq!(
        cms.get("w-config").await.unwrap().metadata.resource_version,
        first.metadata.resource_version,
        "the child was not applied again"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const TICKER: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: ticker}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  script: ticker.rhai
  status: {fields: [ripe]}
---
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: broken}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  script: broken.rhai
  status: {fields: [broken]}
"#;

/// Six seconds after its object is made, and not before, the ticker
/// writes; until then it asks to come back every 200ms.
const TICKER_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let born = parse_time(ctx.resource.metadata.creationTimestamp);
    if ctx.now - born >= 6 { [status(#{ ripe: true })] } else { [requeue("200ms")] }
}
"#;

/// Two enforcing policies on one object: one fails every time and backs
/// off on its own (2s, 4s, 8s, ...); the other keeps its own time, and
/// does not clear the `Degraded` the failing one set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_policy_backs_off_alone_and_the_other_keeps_its_time() {
    let c = Cluster::new("twopolicies").await;
    install_widget_crd(&c).await;
    let config = OperatorConfig {
        backoff_base: Duration::from_secs(2),
        backoff_max: Duration::from_secs(60),
        ..OperatorConfig::default()
    };
    let op = operator(
        &c,
        policies(
            &c,
            &[
                ("policies.yaml", TICKER),
                ("ticker.rhai", TICKER_SCRIPT),
                (
                    "broken.rhai",
                    "fn reconcile(ctx) { throw \"always broken\"; }",
                ),
            ],
        ),
        config,
    );
    op.start().await.expect("the operator starts");
    let widgets = widgets(&c);
    let made = std::time::Instant::now();
    create_widget(&c, &widgets, "w", json!({"size": 1})).await;
    eventually("the ticker's write", 20, || async {
        widgets.get("w").await.unwrap().data["status"]["ripe"] == true
    })
    .await;
    // Held to the broken policy's backoff it would come at its third try,
    // ten seconds or more after creation; on its own time, about six.
    let after = made.elapsed();
    assert!(after < Duration::from_millis(8500), "{after:?}");
    let w = widgets.get("w").await.unwrap();
    let st = &w.data["status"];
    let degraded = st["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Degraded")
        .cloned()
        .unwrap_or_default();
    assert_eq!(degraded["status"], "True", "{st}");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap_or("")
            .contains("always broken"),
        "{degraded}"
    );
    let records: Vec<(&str, bool)> = st["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["policy"].as_str().unwrap(), d.get("error").is_some()))
        .collect();
    assert_eq!(records, [("broken", true), ("ticker", false)]);
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// `spec.selector` is a LabelSelector: the watch asks the API server for
/// it, and an object that comes to match (a label added) is reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_selector_binds_the_policy_to_the_objects_it_matches() {
    let c = Cluster::new("selector").await;
    install_widget_crd(&c).await;
    let policy = POLICY.replace(
        "  script: widget.rhai\n",
        "  script: widget.rhai\n  selector:\n    matchLabels: {team: ml}\n    matchExpressions:\n      - {key: tier, operator: In, values: [gold, silver]}\n      - {key: frozen, operator: DoesNotExist}\n",
    );
    let op = started(&c, &[("widget.yaml", &policy), ("widget.rhai", SCRIPT)]).await;
    let widgets = widgets(&c);
    let labelled = |name: &str, labels: Value| {
        let mut w = widget(&c, name, json!({"size": 1}));
        w.metadata.labels = Some(serde_json::from_value(labels).unwrap());
        w
    };
    for (name, labels) in [
        ("gold", json!({"team": "ml", "tier": "gold"})),
        ("bronze", json!({"team": "ml", "tier": "bronze"})),
        (
            "frozen",
            json!({"team": "ml", "tier": "gold", "frozen": "yes"}),
        ),
        ("other-team", json!({"team": "web", "tier": "gold"})),
    ] {
        widgets
            .create(&PostParams::default(), &labelled(name, labels))
            .await
            .unwrap();
    }
    let phase = |name: &'static str| {
        let widgets = widgets.clone();
        async move { widgets.get(name).await.unwrap().data["status"]["phase"].clone() }
    };
    eventually("the matching widget reconciled", 30, || async {
        phase("gold").await == "Ready"
    })
    .await;
    settle(&op).await;
    for name in ["bronze", "frozen", "other-team"] {
        assert_eq!(phase(name).await, Value::Null, "{name} is not selected");
    }
    // Relabelled into the selector: reconciled.
    widgets
        .patch(
            "bronze",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "silver"}}})),
        )
        .await
        .unwrap();
    eventually("the relabelled widget reconciled", 30, || async {
        phase("bronze").await == "Ready"
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// Reads only its name and spec: its own status write coming back, a label
/// or another writer's status field change nothing it decides on.
const SPEC_ONLY: &str = r#"
fn reconcile(ctx) {
    let w = ctx.resource;
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${w.metadata.name}-config` }, data: #{ size: `${w.spec.size}` } }),
     status(#{ phase: "Ready" })]
}
"#;

/// A counter of the operator's metrics, by its labels as rendered.
fn counter(op: &runbook_operator::runtime::Operator, name: &str, labels: &str) -> u64 {
    let prefix = format!("{name}{{{labels}}} ");
    op.ctx
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

fn decided(op: &runbook_operator::runtime::Operator) -> u64 {
    counter(
        op,
        "runbook_reconciles_total",
        r#"policy="widget",result="ok""#,
    )
}

fn not_decided_again(op: &runbook_operator::runtime::Operator) -> u64 {
    counter(
        op,
        "runbook_unchanged_reconciles_total",
        r#"policy="widget""#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_nothing_the_decision_read_is_not_decided_again() {
    let (c, op, widgets, cms) = setup_with("unchanged", SPEC_ONLY).await;
    create_widget(&c, &widgets, "w1", json!({"size": 1})).await;
    ready(&widgets, "w1").await;
    settle(&op).await;
    let (made, skipped, writes) = (
        decided(&op),
        not_decided_again(&op),
        op.ctx.metrics.writes.get(),
    );
    // Its own status coming back through the watch is not decided on, nor
    // its own child (unless the child's watch event beats the answer to
    // the apply, which then cannot tell it is the apply's).
    assert!(made <= 2, "{made} decisions for one new Widget");

    // A label and another writer's status field: no decision, no write.
    label_owner(&widgets, "w1").await;
    widgets
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"note": "from another tool"}})),
        )
        .await
        .unwrap();
    eventually("both changes reach the operator", 30, || async {
        not_decided_again(&op) > skipped
    })
    .await;
    settle(&op).await;
    assert_eq!(decided(&op), made, "a change nothing read was decided on");
    assert_eq!(op.ctx.metrics.writes.get(), writes);

    // What it read changes: decided again.
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    eventually("the child follows the spec", 30, || async {
        cms.get("w1-config").await.unwrap().data.unwrap_or_default()["size"] == "5"
    })
    .await;
    settle(&op).await;
    // Something else it read changes (its child, deleted): decided again,
    // though the Widget itself did not change.
    let made = decided(&op);
    cms.delete("w1-config", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the child is made again", 30, || async {
        cms.get("w1-config")
            .await
            .is_ok_and(|cm| cm.metadata.deletion_timestamp.is_none())
    })
    .await;
    // The new child can be seen before the reconcile that made it has
    // counted its decision (it counts once its writes are answered).
    eventually("the deleted child is decided on", 30, || async {
        decided(&op) > made
    })
    .await;
    // And a resync decides on every target again, writing nothing.
    settle(&op).await;
    let (made, writes) = (decided(&op), op.ctx.metrics.writes.get());
    let kind = runbook_core::kinds::KindRef::new(format!("{}/v1", widget_group(&c)), "Widget");
    op.ctx.resync(std::slice::from_ref(&kind));
    settle(&op).await;
    assert!(decided(&op) > made, "a resync was not decided on");
    assert_eq!(op.ctx.metrics.writes.get(), writes);
    teardown(c, op).await;
}

/// Answers in its status what another writer asks in it.
const STATUS_READER: &str = r#"
fn reconcile(ctx) {
    let asked = ctx.resource.status?.asked ?? "";
    [status(#{ answered: asked })]
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_a_status_field_the_decision_read_is_decided_on() {
    let (c, op, widgets, _) = setup_with("statusread", STATUS_READER).await;
    create_widget(&c, &widgets, "w1", json!({"size": 1})).await;
    eventually("the first answer", 30, || async {
        widgets.get("w1").await.unwrap().data["status"]["answered"] == ""
    })
    .await;
    settle(&op).await;
    for question in ["ping", "pong"] {
        widgets
            .patch_status(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"asked": question}})),
            )
            .await
            .unwrap();
        eventually("the answer", 30, || async {
            widgets.get("w1").await.unwrap().data["status"]["answered"] == question
        })
        .await;
    }
    teardown(c, op).await;
}

/// A function that gives a script something Runbook does not record: each
/// call a new number (as a function reading the clock, or the target
/// outside its view, unrecorded, would).
fn engine_with_a_hidden_input() -> runbook_core::script::ScriptEngine {
    use std::sync::atomic::{AtomicI64, Ordering};
    static CALLS: AtomicI64 = AtomicI64::new(0);
    let mut engine = runbook_core::script::ScriptEngine::default();
    engine
        .rhai_mut()
        .register_fn("hidden", || CALLS.fetch_add(1, Ordering::Relaxed));
    engine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_reconcile_that_would_decide_differently_is_reported_when_checked() {
    let c = Cluster::new("checkskips").await;
    install_widget_crd(&c).await;
    let engine = engine_with_a_hidden_input();
    let script = r#"
fn reconcile(ctx) {
    [status(#{ phase: "Ready", seen: hidden() })]
}
"#;
    let set = policies_on(
        &c,
        &engine,
        &[("widget.yaml", POLICY), ("widget.rhai", script)],
    );
    let config = OperatorConfig {
        check_skips: true,
        ..Default::default()
    };
    let op = operator_on(&c, engine, set, config);
    op.start().await.expect("the operator starts");
    let widgets = widgets(&c);
    create_widget(&c, &widgets, "w1", json!({"size": 1})).await;
    ready(&widgets, "w1").await;
    // A label: nothing the decision recorded changed, so the reconcile is
    // skipped; decided again to check, it comes out different.
    label_owner(&widgets, "w1").await;
    eventually("the difference reported", 30, || async {
        !op.ctx.skip_differences.lock().unwrap().is_empty()
    })
    .await;
    let told = op.ctx.skip_differences.lock().unwrap()[0].clone();
    assert!(told.starts_with("policy widget on "), "{told}");
    assert!(
        told.contains("/w1: a reconcile skipped as unchanged decides differently"),
        "{told}"
    );
    assert!(
        counter(
            &op,
            "runbook_skip_check_differences_total",
            r#"policy="widget""#
        ) >= 1,
        "the metric counts it"
    );
    teardown(c, op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_loses_nothing_a_resync_makes_it_up() {
    // Thirty Widgets read one ConfigMap; changing it wakes all thirty at
    // once, through a queue that holds two.
    let c = Cluster::new("overflow").await;
    install_widget_crd(&c).await;
    let policy = &POLICY.replace("owns:", "reads:");
    let script = r#"
fn reconcile(ctx) {
    let common = ctx.get("ConfigMap", "shared");
    [status(#{ phase: "Ready", size: if common == () { "none" } else { common.data.size } })]
}
"#;
    let set = policies(&c, &[("widget.yaml", policy), ("widget.rhai", script)]);
    let metrics = Arc::new(Metrics::new());
    let config = OperatorConfig {
        queue_capacity: 2,
        ..Default::default()
    };
    let op = operator_with_metrics(&c, set, config, metrics);
    op.start().await.expect("the operator starts");
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let shared = |size: &str| {
        serde_json::from_value::<ConfigMap>(json!({
            "metadata": {"name": "shared"}, "data": {"size": size}
        }))
        .unwrap()
    };
    cms.create(&PostParams::default(), &shared("1"))
        .await
        .unwrap();
    for i in 0..30 {
        create_widget(&c, &widgets, &format!("w{i}"), json!({"size": 1})).await;
    }
    let sizes = || async {
        let list = widgets.list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .map(|w| w.data["status"]["size"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    eventually("every widget read the ConfigMap", 60, || async {
        let s = sizes().await;
        s.len() == 30 && s.iter().all(|v| v == "1")
    })
    .await;
    settle(&op).await;
    cms.replace("shared", &PostParams::default(), &{
        let mut cm = cms.get("shared").await.unwrap();
        cm.data = Some([("size".to_string(), "2".to_string())].into());
        cm
    })
    .await
    .unwrap();
    eventually("every widget follows the change", 60, || async {
        sizes().await.iter().all(|v| v == "2")
    })
    .await;
    let dropped = counter(&op, "runbook_queue_overflows_total", r#"queue="trigger""#);
    assert!(
        dropped > 0,
        "the queue of two never overflowed: the test shows nothing"
    );
    teardown(c, op).await;
}

const REFUSED_FIRST: &str = r#"
fn reconcile(ctx) {
    let name = ctx.resource.metadata.name;
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${name}-away`, namespace: "kube-system" } }),
     apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${name}-after` } }),
     status(#{ phase: "Decided" })]
}
"#;

/// A decision's actions are a sequence: after one is refused, the writes
/// that follow are skipped (said in the record), and the status is still
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_refused_action_the_later_writes_are_skipped() {
    let c = Cluster::new("refusedfirst").await;
    install_widget_crd(&c).await;
    let op = started(
        &c,
        &[("widget.yaml", POLICY), ("widget.rhai", REFUSED_FIRST)],
    )
    .await;
    let widgets = widgets(&c);
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    create_widget(&c, &widgets, "w", json!({})).await;
    eventually("the decision", 30, || async {
        widgets.get("w").await.unwrap().data["status"]["phase"] == "Decided"
    })
    .await;
    settle(&op).await;
    let w = widgets.get("w").await.unwrap();
    let actions = &w.data["status"]["decisions"][0]["actions"];
    assert_eq!(actions[0]["result"], "refused", "{actions}");
    assert_eq!(actions[1]["result"], "skipped", "{actions}");
    assert!(
        actions[1]["message"]
            .as_str()
            .is_some_and(|d| d.contains("an earlier action was refused")),
        "{actions}"
    );
    assert!(cms.get_opt("w-after").await.unwrap().is_none());
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const DESIRED: &str = r#"
fn reconcile(ctx) {
    let name = ctx.resource.metadata.name;
    let want = [];
    for i in 0..ctx.resource.spec.size {
        want.push(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${name}-${i}` }, data: #{ index: `${i}` } });
    }
    ctx.sync_children(want) + [status(#{ phase: "Synced" })]
}
"#;

/// Children as a desired set: the policy says which it wants; Runbook
/// applies them and deletes its own children the set no longer names,
/// the highest first, and leaves objects it did not make alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_follow_the_desired_set() {
    let c = Cluster::new("desired").await;
    install_widget_crd(&c).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    // Someone else's ConfigMap in the namespace, not the policy's child.
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "w-9"}, "data": {"mine": "no"}}))
            .unwrap(),
    )
    .await
    .unwrap();
    let op = started(&c, &[("widget.yaml", POLICY), ("widget.rhai", DESIRED)]).await;
    let widgets = widgets(&c);
    create_widget(&c, &widgets, "w", json!({"size": 3})).await;
    let names = || async {
        let mut n: Vec<String> = cms
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .filter(|n| n.starts_with("w-"))
            .collect();
        n.sort();
        n
    };
    eventually("three children", 30, || async {
        names().await == ["w-0", "w-1", "w-2", "w-9"]
    })
    .await;
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 1}})),
        )
        .await
        .unwrap();
    eventually("the set shrunk to one", 30, || async {
        names().await == ["w-0", "w-9"]
    })
    .await;
    // The decision that shrank it, newest first among those recorded.
    let w = widgets.get("w").await.unwrap();
    let decisions = w.data["status"]["decisions"].as_array().unwrap().clone();
    let deleted: Vec<String> = decisions
        .iter()
        .map(|d| {
            d["actions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| a["action"] == "delete")
                .map(|a| a["target"].as_str().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        })
        .find(|d| !d.is_empty())
        .unwrap_or_default();
    assert_eq!(deleted.len(), 2, "{decisions:?}");
    assert!(
        deleted[0].ends_with("/w-2") && deleted[1].ends_with("/w-1"),
        "{deleted:?}"
    );
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

const CLEANUP_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: cleanup}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  deletes:
    - {apiVersion: GROUP/v1, kind: Widget}
    - {apiVersion: v1, kind: Pod, selector: {matchLabels: {tier: scratch}}}
  status: {fields: [], conditions: []}
  script: cleanup.rhai
"#;

const CLEANUP: &str = r#"
fn reconcile(ctx) {
    if ctx.resource.spec?.expired == true {
        return [delete(ctx.resource)];
    }
    ctx.list("Pod").map(|p| delete(p))
}
"#;

fn pod(name: &str, labels: Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}
    }))
    .unwrap()
}

/// What a policy did not make it deletes only as `spec.deletes` declares:
/// Pods its selector matches, and its own target (a TTL); another Pod is
/// refused, saying where to declare it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_deletes_what_it_did_not_make_only_as_declared() {
    let c = Cluster::new("deletes").await;
    install_widget_crd(&c).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = c.api();
    pods.create(
        &PostParams::default(),
        &pod("a-scratch", json!({"tier": "scratch"})),
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod("z-keep", json!({})))
        .await
        .unwrap();
    let policy = CLEANUP_POLICY.replace("GROUP", &widget_group(&c));
    let policy = policy.as_str();
    let op = operator(
        &c,
        policies(&c, &[("cleanup.yaml", policy), ("cleanup.rhai", CLEANUP)]),
        OperatorConfig::default(),
    );
    op.start().await.expect("the operator starts");
    let widgets = widgets(&c);
    create_widget(&c, &widgets, "w", json!({})).await;
    eventually("the scratch Pod deleted", 30, || async {
        pods.get_opt("a-scratch").await.unwrap().is_none()
    })
    .await;
    settle(&op).await;
    assert!(
        pods.get_opt("z-keep").await.unwrap().is_some(),
        "not declared"
    );
    let w = widgets.get("w").await.unwrap();
    let refused: Vec<String> = w.data["status"]["decisions"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["actions"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["result"] == "refused")
        .map(|a| a["message"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        refused
            .iter()
            .any(|m| m.contains("z-keep") && m.contains("only where spec.deletes declares them")),
        "{refused:?}"
    );
    // The target itself, once it says it has expired.
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"expired": true}})),
        )
        .await
        .unwrap();
    eventually("the widget deleted by its own policy", 30, || async {
        widgets.get_opt("w").await.unwrap().is_none()
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// `fn deleted(ctx)`: a ConfigMap deleted is told once, with the labels
/// it last had, though the policy holds no finalizer on it; one that only
/// leaves the policy's selector (a real API server's watch then sends a
/// delete event too) is not told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_is_heard_without_a_finalizer_and_a_relabel_is_not() {
    let c = Cluster::new("deleted").await;
    let policy = "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: gone}
spec:
  target: {apiVersion: v1, kind: ConfigMap}
  selector: {matchLabels: {watched: \"yes\"}}
  script: gone.rhai
";
    let script = "fn reconcile(ctx) { [] }
fn deleted(ctx) {
    [event(\"Normal\", \"Deleted\", `${ctx.resource.metadata.name} of ${ctx.resource.metadata.labels.team} deleted`)]
}
";
    let set = policies(&c, &[("gone.yaml", policy), ("gone.rhai", script)]);
    let op = operator(&c, set, OperatorConfig::default());
    op.start().await.expect("the operator starts");
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    for (name, team) in [("a", "ml"), ("b", "web")] {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"watched": "yes", "team": team}}}))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let reconciled = || {
        op.ctx
            .metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("runbook_reconciles_total{") && l.contains("gone"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    eventually("both decided", 30, || async { reconciled() >= 2.0 }).await;
    cms.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"watched": "no"}}})),
    )
    .await
    .unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    event_on(&c, "Deleted", "a", "a of ml deleted").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(events_of(&c, "Deleted", "a").await, 1, "told once");
    assert_eq!(
        events_of(&c, "Deleted", "b").await,
        0,
        "a relabel is no deletion"
    );
    assert!(cms.get_opt("b").await.unwrap().is_some());
    op.shutdown(Duration::from_secs(5)).await;
    c.cleanup().await;
}
