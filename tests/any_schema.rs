//! Targets of any schema: policies bound to kinds whose status Runbook
//! does not define, as users bring them (third-party CRDs whose status
//! schema lists only their own fields).

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod support;

use cluster::{Cluster, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const MIRROR: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: mirror}
spec:
  target: {apiVersion: GROUP/v1, kind: Mirror}
  reads: [{apiVersion: v1, kind: ConfigMap}]
  status: {fields: [value, source]}
  script: mirror.rhai
"#;

const MIRROR_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let source = ctx.get("ConfigMap", ctx.resource.spec.source);
    if source == () { return []; }
    // `source` is not in the Mirror's status schema: the API server drops it.
    [status(#{ value: source.data.value, source: ctx.resource.spec.source })]
}
"#;

/// The source's `value`, and a note beside it that the Mirror ignores.
async fn set_source(sources: &Api<ConfigMap>, value: &str, note: &str) {
    sources
        .patch(
            "source",
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "source"},
                                 "data": {"value": value, "note": note}})),
        )
        .await
        .unwrap();
}

/// The server prunes Runbook's record from the Mirror's status, so a
/// decision that changes nothing else is a write the server makes nothing
/// of (no new resourceVersion). The next change must still be decided: a
/// wait for that write to show in the cache would never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_schema_that_prunes_runbooks_fields_does_not_stall_the_target() {
    let c = Cluster::new("any-mirror").await;
    let resource = support::install_mirror_crd(&c).await;
    let sources: Api<ConfigMap> = c.api();
    set_source(&sources, "one", "").await;
    let op = support::started(
        &c,
        &[("mirror.yaml", MIRROR), ("mirror.rhai", MIRROR_SCRIPT)],
    )
    .await;
    // Declared, and not in the served schema: said before any write.
    assert!(
        op.ctx
            .metrics
            .render()
            .contains("runbook_status_unlisted{policy=\"mirror\",field=\"source\"} 1"),
        "{}",
        op.ctx.metrics.render()
    );
    let mirrors: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), &c.ns, &resource);
    mirrors
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": resource.api_version, "kind": "Mirror",
                "metadata": {"name": "m"}, "spec": {"source": "source"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let value = || async {
        mirrors
            .get("m")
            .await
            .map(|m| m.data["status"]["value"].clone())
            .unwrap_or(Value::Null)
    };
    eventually("the first value mirrored", 30, || async {
        value().await == "one"
    })
    .await;
    // Each round: a change of the source that changes nothing of the
    // Mirror's own status (its decision's status write is one the server
    // makes nothing of), then one that does, which must be mirrored well
    // within the bound of a wait for the cache (30 s): decided because
    // nothing waits, not because a wait ran out.
    let mut was = "one";
    for next in ["two", "three"] {
        set_source(&sources, was, &format!("before {next}")).await;
        support::settle(&op).await;
        set_source(&sources, next, &format!("before {next}")).await;
        was = next;
        eventually(&format!("{next} mirrored"), 15, || async {
            value().await == next
        })
        .await;
    }
    // A field the policy writes that the schema drops is told, on the
    // Mirror and in a metric.
    let events: Api<k8s_openapi::api::events::v1::Event> = c.api();
    eventually("a StatusDropped Event", 30, || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("StatusDropped")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("status.source"))
            })
    })
    .await;
    assert!(
        op.ctx
            .metrics
            .render()
            .contains("runbook_status_dropped_total{policy=\"mirror\",field=\"source\"}"),
        "{}",
        op.ctx.metrics.render()
    );
    // What the Mirror's status cannot keep is in its RunbookState.
    let states = c.runbook_states();
    let name = runbook_core::crd::state::name_for(&resource.group, "Mirror", "m");
    let state = states.get(&name).await.unwrap();
    assert_eq!(state.data["status"]["decisions"][0]["policy"], "mirror");
    // And Runbook's condition says what is dropped, where it can be
    // written: the state.
    let degraded = state.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Degraded")
        .cloned()
        .unwrap_or_default();
    assert_eq!(degraded["status"], "True", "{}", state.data);
    assert_eq!(degraded["reason"], "StatusDropped");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap_or("")
            .contains("status.source"),
        "{degraded}"
    );
    assert!(
        mirrors.get("m").await.unwrap().data["status"]
            .get("decisions")
            .is_none()
    );
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

const STATEFULSETS: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: sts-watch}
spec:
  target: {apiVersion: apps/v1, kind: StatefulSet}
  status: {fields: [], conditions: []}
  script: sts-watch.rhai
"#;

const STATEFULSETS_SCRIPT: &str = r#"
fn reconcile(ctx) {
    if ctx.resource.spec.replicas > 5 {
        return [event("Warning", "TooBig", `${ctx.resource.metadata.name} asks for too many replicas`)];
    }
    []
}
"#;

/// A policy on a built-in kind writes nothing into its targets' status
/// (a StatefulSet's status is its controller's, and the API server keeps
/// none of Runbook's fields there): Runbook's state of each is a
/// RunbookState beside it, owned by it, and `runbook explain` reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_on_a_built_in_kind_keeps_its_state_beside_the_target() {
    let c = Cluster::new("any-sts").await;
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = c.api();
    sets.create(&PostParams::default(), &statefulset("db", json!({})))
        .await
        .unwrap();
    let op = support::started(
        &c,
        &[
            ("sts.yaml", STATEFULSETS),
            ("sts-watch.rhai", STATEFULSETS_SCRIPT),
        ],
    )
    .await;
    let states = c.runbook_states();
    eventually("the StatefulSet's state", 30, || async {
        states
            .get_opt("statefulset.apps.db")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    support::settle(&op).await;
    let state = states.get("statefulset.apps.db").await.unwrap();
    let set = sets.get("db").await.unwrap();
    assert_eq!(state.data["status"]["decisions"][0]["policy"], "sts-watch");
    assert_eq!(state.data["status"]["last"]["policy"], "sts-watch");
    assert_eq!(
        state.data["spec"]["target"]["uid"],
        set.metadata.uid.clone().unwrap().as_str()
    );
    let owner = &state.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("StatefulSet", "db")
    );
    let status = serde_json::to_value(set.status.unwrap_or_default()).unwrap();
    assert!(status.get("decisions").is_none(), "{status}");
    // Nothing of Runbook's was written into the StatefulSet: its only
    // manager of status is its controller, if any.
    let managers: Vec<String> = set
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.iter().all(|m| !m.starts_with("runbook")),
        "{managers:?}"
    );
    // `runbook explain` finds the decisions where they are.
    let dir = std::env::temp_dir().join(format!("runbook-explain-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    let out = explain(&kubeconfig, "statefulset/db", &c.ns).await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("policy:       sts-watch"), "{text}");
    // An object that is not there: said in a line, not a Rust structure.
    let out = explain(&kubeconfig, "statefulset/nope", &c.ns).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim(),
        format!(
            "error: StatefulSet \"nope\" not found in namespace {:?}",
            c.ns
        )
    );
    // Deleting the StatefulSet takes its state with it.
    sets.delete("db", &Default::default()).await.unwrap();
    eventually("the state collected with its target", 60, || async {
        states
            .get_opt("statefulset.apps.db")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// Running sharded, a built-in kind's RunbookState carries its target's
/// shard label, as children do, so that each replica caches only the
/// states of its share; when the target moves to another replica, its
/// state follows with what it holds (the new replica reads it from the
/// API server, not finding it in its cache, rather than starting afresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_a_built_in_kinds_state_follows_its_target() {
    use runbook_core::shard::SHARD_LABEL;
    let c = Cluster::new("any-shards").await;
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = c.api();
    sets.create(&PostParams::default(), &statefulset("db", json!({})))
        .await
        .unwrap();
    let files = [
        ("sts.yaml", STATEFULSETS),
        ("sts-watch.rhai", STATEFULSETS_SCRIPT),
    ];
    let replica = |id: &str| {
        let op = support::operator(&c, support::policies(&c, &files), support::sharded(&c, id));
        let started = op.clone();
        // As `runbook run` does: start, then follow the Lease and the ring.
        tokio::spawn(async move {
            started.start().await.unwrap();
            started.follow_leadership().await
        });
        op
    };
    let shard_of = |o: &DynamicObject| {
        o.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SHARD_LABEL))
            .cloned()
    };
    let states = c.runbook_states();
    let a = replica("a");
    eventually("the StatefulSet's state, labelled for a", 60, || async {
        states
            .get_opt("statefulset.apps.db")
            .await
            .unwrap()
            .is_some_and(|s| shard_of(&s).as_deref() == Some("a"))
    })
    .await;
    let record =
        states.get("statefulset.apps.db").await.unwrap().data["status"]["decisions"][0].clone();
    assert_eq!(record["policy"], "sts-watch", "{record}");
    // a leaves and b takes the StatefulSet over.
    let b = replica("b");
    a.shutdown(std::time::Duration::from_secs(5)).await;
    let set_on_b = || async {
        use kube::ResourceExt;
        sets.get("db")
            .await
            .unwrap()
            .labels()
            .get(SHARD_LABEL)
            .map(String::as_str)
            == Some("b")
    };
    eventually("the StatefulSet labelled for b", 60, set_on_b).await;
    eventually("its state labelled for b", 60, || async {
        shard_of(&states.get("statefulset.apps.db").await.unwrap()).as_deref() == Some("b")
    })
    .await;
    // Nothing changed for the decision: a's record stands, not one b made
    // afresh as if the StatefulSet had no state.
    let state = states.get("statefulset.apps.db").await.unwrap();
    let decisions = state.data["status"]["decisions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(decisions, vec![record], "{}", state.data);
    b.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// `runbook explain OBJECT -n NS` against the cluster of `kubeconfig`.
async fn explain(kubeconfig: &std::path::Path, object: &str, ns: &str) -> std::process::Output {
    let (kubeconfig, object, ns) = (kubeconfig.to_path_buf(), object.to_string(), ns.to_string());
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_runbook"))
            .args(["explain", &object, "-n", &ns])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

const TICK: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: tick}
spec:
  target: {apiVersion: GROUP/v1, kind: Mirror}
  schedule: {cron: "* * * * *"}
  status: {fields: [value]}
  script: tick.rhai
"#;

const TICK_SCRIPT: &str = r#"
fn reconcile(ctx) {
    if !ctx.due { return []; }
    [status(#{ value: ctx.run })]
}
"#;

/// A scheduled policy on a kind whose status keeps only its own fields
/// fires at creation and then on its schedule: its times are kept apart,
/// not pruned away with the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_policy_on_a_pruning_kind_fires_on_its_schedule() {
    let c = Cluster::new("any-tick").await;
    let resource = support::install_mirror_crd(&c).await;
    let op = support::started(&c, &[("tick.yaml", TICK), ("tick.rhai", TICK_SCRIPT)]).await;
    let mirrors: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), &c.ns, &resource);
    mirrors
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": resource.api_version, "kind": "Mirror",
                "metadata": {"name": "t"}, "spec": {}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let value = || async {
        mirrors
            .get("t")
            .await
            .map(|m| m.data["status"]["value"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    eventually("the run at creation", 30, || async {
        !value().await.is_empty()
    })
    .await;
    let first = value().await;
    // The next minute's run, and only one more.
    eventually("the next scheduled run", 75, || async {
        value().await != first
    })
    .await;
    let states = c.runbook_states();
    let state = states
        .get(&runbook_core::crd::state::name_for(
            &resource.group,
            "Mirror",
            "t",
        ))
        .await
        .unwrap();
    let st = &state.data["status"];
    assert!(
        st["lastRunTime"].is_string() && st["nextRunTime"].is_string(),
        "{st}"
    );
    assert!(
        !op.ctx
            .metrics
            .render()
            .contains("runbook_status_dropped_total{"),
        "the policy writes only what the Mirror keeps"
    );
    eprintln!(
        "RunbookState of a scheduled target: {} bytes",
        serde_json::to_vec(&state).unwrap().len()
    );
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

const GUARD: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: sts-guard}
spec:
  target: {apiVersion: apps/v1, kind: StatefulSet}
  annotationSelector: {matchAnnotations: {example.com/guard: "on"}}
  owns: [{apiVersion: v1, kind: ConfigMap}]
  status: {fields: [], conditions: []}
  script: sts-guard.rhai
"#;

const GUARD_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let name = `${ctx.resource.metadata.name}-guard`;
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: name }, data: #{ guarded: "yes" } })]
}

// Clean-up: the guard goes before the finalizer does.
fn finalize(ctx) {
    let guard = ctx.get("ConfigMap", `${ctx.resource.metadata.name}-guard`);
    if guard == () { [] } else { [delete(guard)] }
}
"#;

fn statefulset(name: &str, annotations: Value) -> k8s_openapi::api::apps::v1::StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": 1, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}}}
    }))
    .unwrap()
}

/// A policy with `finalize` on StatefulSets, opted into by annotation:
/// one that never matched gets no finalizer (and is deleted at once); the
/// one that opts in gets it with the first thing the policy makes for it,
/// and when it opts out, `finalize` runs and the finalizer goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_are_only_where_the_policy_made_something() {
    let c = Cluster::new("any-guard").await;
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = c.api();
    let cms: Api<ConfigMap> = c.api();
    let pp = PostParams::default();
    sets.create(&pp, &statefulset("plain", json!({})))
        .await
        .unwrap();
    sets.create(
        &pp,
        &statefulset("guarded", json!({"example.com/guard": "on"})),
    )
    .await
    .unwrap();
    let op = support::started(
        &c,
        &[("guard.yaml", GUARD), ("sts-guard.rhai", GUARD_SCRIPT)],
    )
    .await;
    let finalizers = |name: &'static str| {
        let sets = sets.clone();
        async move {
            sets.get(name)
                .await
                .unwrap()
                .metadata
                .finalizers
                .unwrap_or_default()
        }
    };
    eventually("the guard of the opted-in StatefulSet", 30, || async {
        cms.get_opt("guarded-guard").await.unwrap().is_some()
    })
    .await;
    assert_eq!(finalizers("guarded").await, ["runbook.dev/sts-guard"]);
    support::settle(&op).await;
    assert!(
        finalizers("plain").await.is_empty(),
        "never matched, never held"
    );
    assert!(cms.get_opt("plain-guard").await.unwrap().is_none());
    // Opting out: finalize deletes the guard, then the finalizer goes.
    sets.patch(
        "guarded",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"example.com/guard": null}}})),
    )
    .await
    .unwrap();
    eventually("the finalizer gone with the opt-out", 30, || async {
        finalizers("guarded").await.is_empty()
    })
    .await;
    assert!(
        cms.get_opt("guarded-guard").await.unwrap().is_none(),
        "finalize ran"
    );
    // Neither waits on Runbook to be deleted.
    op.shutdown(std::time::Duration::from_secs(5)).await;
    for name in ["plain", "guarded"] {
        sets.delete(name, &Default::default()).await.unwrap();
    }
    eventually("both deleted with Runbook down", 30, || async {
        sets.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    c.cleanup().await;
}
