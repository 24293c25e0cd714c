//! Behaviours of other projects' example suites, ported onto Runbook
//! (the examples' READMEs say which and how): each example's own policy,
//! run by the operator against the test's cluster, checked as the peer's
//! own test script checks it.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/kubelet.rs"]
mod kubelet;
#[path = "support/operator.rs"]
mod support;

use std::path::Path;

use cluster::{Cluster, eventually};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// A file of an example, as text.
fn example_file(example: &str, file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(example)
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An operator running an example's `policy` folder, each file's text
/// passed through `edit` (a group of the test's own, a shorter time).
async fn start_example(
    c: &Cluster,
    example: &str,
    edit: impl Fn(String) -> String,
) -> std::sync::Arc<runbook_operator::runtime::Operator> {
    start_example_with(c, example, edit, Default::default()).await
}

/// [`start_example`], the operator started with `config`.
async fn start_example_with(
    c: &Cluster,
    example: &str,
    edit: impl Fn(String) -> String,
    config: runbook_operator::runtime::OperatorConfig,
) -> std::sync::Arc<runbook_operator::runtime::Operator> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(example)
        .join("policy");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .map(|name| {
            let text = example_file(example, &format!("policy/{name}"));
            (name, edit(text))
        })
        .collect();
    files.sort();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let op = support::operator(c, support::policies(c, &files), config);
    op.start().await.expect("the operator starts");
    op
}

/// The end of a port's test: no reconcile failed, the operator stopped,
/// the test's objects removed.
async fn finish_without_failures(
    c: Cluster,
    op: std::sync::Arc<runbook_operator::runtime::Operator>,
) {
    let metrics = op.ctx.metrics.render();
    assert!(
        !metrics.contains("runbook_reconcile_failures_total{"),
        "{metrics}"
    );
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// An example's CRD installed in a group of the test's own
/// (`<namespace>.<group>`), once served: the group and an API of the kind
/// in the test's namespace.
async fn example_crd(
    c: &Cluster,
    example: &str,
    group: &str,
) -> (String, Api<kube::core::DynamicObject>) {
    let crds: Api<kube::core::DynamicObject> =
        Api::all_with(c.client.clone(), &cluster::crd_resource());
    let mut crd = yaml_document(&example_file(example, "crd.yaml"));
    let ours = format!("{}.{group}", c.ns);
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap().to_string();
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
    let version = crd["spec"]["versions"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    crd["metadata"]["name"] = json!(format!("{plural}.{ours}"));
    crd["spec"]["group"] = json!(ours);
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
    let resource =
        runbook_core::kinds::KindRef::new(format!("{ours}/{version}"), kind).api_resource();
    let api: Api<kube::core::DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &resource);
    eventually("the example's kind served", 60, || async {
        api.list(&Default::default()).await.is_ok()
    })
    .await;
    (ours, api)
}

/// An example's object file as JSON, in the test's namespace, its group
/// `group.0` replaced with `group.1` where one is given.
fn example_json(
    c: &Cluster,
    example: &str,
    file: &str,
    group: Option<(&str, &str)>,
) -> serde_json::Value {
    let mut text = example_file(example, file);
    if let Some((from, to)) = group {
        text = text.replace(from, to);
    }
    let mut v = yaml_document(&text);
    v["metadata"]["namespace"] = json!(c.ns);
    v
}

/// One YAML document as JSON, through Runbook's own YAML reader.
fn yaml_document(text: &str) -> serde_json::Value {
    runbook_core::util::yaml::parse_documents(text)
        .unwrap()
        .into_iter()
        .next()
        .unwrap()
}

/// Metacontroller's service-per-pod: a Service per Pod of an annotated
/// StatefulSet; opting out (an annotation removed) cleans them up before
/// the finalizer goes; opting in again brings them back; deleting the
/// StatefulSet cleans them up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_per_pod() {
    let c = Cluster::new("port-spp").await;
    let op = start_example(&c, "service-per-pod", |t| t).await;
    let sets: Api<StatefulSet> = c.api();
    let services: Api<Service> = c.api();
    sets.create(
        &PostParams::default(),
        &serde_json::from_value(example_json(
            &c,
            "service-per-pod",
            "statefulset.yaml",
            None,
        ))
        .unwrap(),
    )
    .await
    .unwrap();
    let selector_of = |name: &'static str| {
        let services = services.clone();
        async move {
            services
                .get_opt(name)
                .await
                .unwrap()
                .and_then(|s| s.spec?.selector)
                .and_then(|s| s.get("pod-name").cloned())
        }
    };
    eventually("the per-pod Service", 30, || async {
        selector_of("nginx-2").await.as_deref() == Some("nginx-2")
    })
    .await;
    let finalizers = || async {
        sets.get("nginx")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap_or_default()
    };
    assert_eq!(finalizers().await, ["runbook.dev/service-per-pod"]);
    // Opt out without deleting the StatefulSet.
    let annotate = |value: serde_json::Value| {
        let sets = sets.clone();
        async move {
            sets.patch(
                "nginx",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"service-per-pod-label": value}}}),
                ),
            )
            .await
            .unwrap();
        }
    };
    annotate(serde_json::Value::Null).await;
    eventually(
        "the Services cleaned up and the finalizer gone",
        30,
        || async {
            services.get_opt("nginx-2").await.unwrap().is_none() && finalizers().await.is_empty()
        },
    )
    .await;
    // Opt in again.
    annotate(json!("pod-name")).await;
    eventually("the per-pod Service back", 30, || async {
        selector_of("nginx-2").await.as_deref() == Some("nginx-2")
    })
    .await;
    // Delete it: the Services go first, then the StatefulSet.
    sets.delete("nginx", &Default::default()).await.unwrap();
    eventually("the Services and the StatefulSet gone", 30, || async {
        services.get_opt("nginx-2").await.unwrap().is_none()
            && sets.get_opt("nginx").await.unwrap().is_none()
    })
    .await;
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// Kopf's pod killer (`examples/10-builtins`): a Pod is deleted once it
/// has lived its lifetime (2 s here, 30 s as shipped); one its owner
/// deleted first is not deleted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifetime() {
    let c = Cluster::new("port-ttl").await;
    let pods: Api<Pod> = c.api();
    let pod = |name: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}}))
        .unwrap()
    };
    // Made once Runbook runs, so that its authorship webhook records who
    // made them: a Pod is deleted for its author, who may delete it.
    let op = start_example(&c, "pod-lifetime", |t| {
        t.replace("lifetime: 30s", "lifetime: 2s")
    })
    .await;
    pods.create(&PostParams::default(), &pod("web-1"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("web-2"))
        .await
        .unwrap();
    pods.delete("web-2", &Default::default()).await.unwrap();
    let created = std::time::Instant::now();
    eventually("the Pod deleted at the end of its lifetime", 30, || async {
        pods.get_opt("web-1").await.unwrap().is_none()
    })
    .await;
    assert!(
        created.elapsed() >= std::time::Duration::from_millis(500),
        "deleted before its lifetime"
    );
    finish_without_failures(c, op).await;
}

/// Kopf's children (`examples/02-children`): each example object gets a
/// Pod, labelled as it is and owned by it, whose uid its status lists;
/// deleting the example takes the Pod with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_pods() {
    let c = Cluster::new("port-kids").await;
    let (group, examples) = example_crd(&c, "children-pods", "kopf.dev").await;
    let op = start_example(&c, "children-pods", |t| {
        t.replace("kopf.dev/v1", &format!("{group}/v1"))
    })
    .await;
    let example = example_json(
        &c,
        "children-pods",
        "example.yaml",
        Some(("kopf.dev", &group)),
    );
    examples
        .create(
            &PostParams::default(),
            &serde_json::from_value(example).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = c.api();
    eventually("the child's uid in the example's status", 30, || async {
        let Some(pod) = pods.get_opt("kopf-example-1").await.unwrap() else {
            return false;
        };
        let ex = examples.get("kopf-example-1").await.unwrap();
        ex.data["status"]["children"] == json!([pod.metadata.uid])
    })
    .await;
    let pod = pods.get("kopf-example-1").await.unwrap();
    assert_eq!(
        pod.metadata
            .labels
            .unwrap_or_default()
            .get("somelabel")
            .map(String::as_str),
        Some("somevalue")
    );
    let env = &pod.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default()[0];
    assert_eq!(
        (env.name.as_str(), env.value.as_deref()),
        ("FIELD", Some("value"))
    );
    examples
        .delete("kopf-example-1", &Default::default())
        .await
        .unwrap();
    eventually("the Pod gone with its example", 60, || async {
        pods.get_opt("kopf-example-1")
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// Metacontroller's CatSet: Pods made in order, each once the ones before
/// it are Ready; scaled up, then down (the highest first, its volume
/// kept); deleted, scaled to zero before it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catset() {
    let c = Cluster::new("port-catset").await;
    let (group, catsets) = example_crd(&c, "catset", "catset.example.com").await;
    let kubelet = kubelet::Kubelet::start(&c);
    kubelet.ready("nginx-backend-");
    let op = start_example(&c, "catset", |t| t.replace("catset.example.com", &group)).await;
    let cs = example_json(
        &c,
        "catset",
        "nginx-backend.yaml",
        Some(("catset.example.com", &group)),
    );
    catsets
        .create(&PostParams::default(), &serde_json::from_value(cs).unwrap())
        .await
        .unwrap();
    let status = |field: &'static str| {
        let catsets = catsets.clone();
        async move {
            catsets
                .get_opt("nginx-backend")
                .await
                .unwrap()
                .map(|o| o.data["status"][field].clone())
        }
    };
    eventually("3 Pods Ready", 60, || async {
        status("readyReplicas").await == Some(json!(3))
    })
    .await;
    let scale = |n: i64| {
        let catsets = catsets.clone();
        async move {
            catsets
                .patch(
                    "nginx-backend",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": n}})),
                )
                .await
                .unwrap();
        }
    };
    scale(4).await;
    eventually("4 Pods Ready", 60, || async {
        status("readyReplicas").await == Some(json!(4))
    })
    .await;
    scale(2).await;
    let pods: Api<Pod> = c.api();
    eventually("2 Pods, the highest gone", 60, || async {
        status("replicas").await == Some(json!(2))
            && status("readyReplicas").await == Some(json!(2))
            && pods.get_opt("nginx-backend-3").await.unwrap().is_none()
            && pods.get_opt("nginx-backend-2").await.unwrap().is_none()
    })
    .await;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = c.api();
    assert!(
        claims
            .get_opt("www-nginx-backend-3")
            .await
            .unwrap()
            .is_some(),
        "a scaled-down Pod's volume is kept"
    );
    catsets
        .delete("nginx-backend", &Default::default())
        .await
        .unwrap();
    eventually("scaled to zero, then gone", 60, || async {
        catsets.get_opt("nginx-backend").await.unwrap().is_none()
            && pods.get_opt("nginx-backend-0").await.unwrap().is_none()
    })
    .await;
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// shell-operator's schedule hook (`examples/103-schedule`): each
/// binding of one hook runs on its own crontab, its times kept under its
/// name, and each run is told by an Event naming the binding. The crons
/// are shortened to every second and every two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_hooks() {
    use k8s_openapi::api::core::v1::{ConfigMap, Event};
    let c = Cluster::new("port-cron").await;
    let op = start_example(&c, "schedule-hooks", |t| {
        t.replace("*/5 * * * * *", "*/1 * * * * *")
            .replace("*/10 * * * * *", "*/2 * * * * *")
    })
    .await;
    let maps: Api<ConfigMap> = c.api();
    let hook = |name: &str, labelled: bool| -> ConfigMap {
        let labels = if labelled {
            json!({"hooks.example.com/binding": "schedule"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    };
    maps.create(&PostParams::default(), &hook("schedule-hook", true))
        .await
        .unwrap();
    maps.create(&PostParams::default(), &hook("no-binding", false))
        .await
        .unwrap();
    let states = c.runbook_states();
    let times = || async {
        let state = states.get_opt("configmap.schedule-hook").await.unwrap();
        state.map(|s| s.data["status"]["schedules"].clone())
    };
    // Every second's binding runs again and again, each run at a whole
    // second; the two-second one only on even seconds; the five-minute one
    // is waiting for its time.
    let runs = std::sync::Mutex::new(std::collections::BTreeSet::new());
    eventually("three runs of the every-second binding", 30, || async {
        let s = times().await;
        let mut runs = runs.lock().unwrap();
        if let Some(s) = s
            && let Some(last) = s["every 5 sec"]["lastRunTime"].as_str()
        {
            runs.insert(last.to_string());
        }
        runs.len() >= 3
    })
    .await;
    let s = times().await.unwrap();
    let even = s["every 10 sec"]["lastRunTime"]
        .as_str()
        .unwrap_or_default();
    let second: u32 = even.get(17..19).and_then(|n| n.parse().ok()).unwrap_or(1);
    assert_eq!(second % 2, 0, "{s}");
    let next_five = s["every 5 min"]["nextRunTime"].as_str().unwrap_or_default();
    assert!(
        next_five.ends_with(":00Z") && next_five[14..16].parse::<u32>().unwrap() % 5 == 0,
        "{s}"
    );
    // Each run is told by an Event naming its binding, on the hook only.
    let events: Api<Event> = c.api();
    let listed = events.list(&Default::default()).await.unwrap();
    let on = |name: &str| -> Vec<String> {
        listed
            .items
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .filter(|e| e.reason.as_deref() == Some("Schedule"))
            .filter_map(|e| e.message.clone())
            .collect()
    };
    for binding in ["every 5 sec", "every 10 sec"] {
        let want = format!(
            "Message from 'schedule' hook with 6 fields crontab: [{{\"binding\":\"{binding}\"}}]"
        );
        assert!(
            on("schedule-hook").contains(&want),
            "{:?}",
            on("schedule-hook")
        );
    }
    assert!(on("no-binding").is_empty());
    assert!(
        states
            .get_opt("configmap.no-binding")
            .await
            .unwrap()
            .is_none()
    );
    op.shutdown(std::time::Duration::from_secs(5)).await;
    c.cleanup().await;
}

/// shell-operator's secret copier (`examples/104-secret-copier`): a
/// labelled Secret is copied into the other namespaces, into one made
/// later too; a copy deleted by hand comes back; the copies go when the
/// Secret goes. The namespaces written in are the test's own (labelled
/// for it), and the operator watches every namespace, as
/// `--allow-other-namespaces` needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_copier() {
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    let c = Cluster::new("port-copy").await;
    let mark = c.ns.clone();
    let op = start_example_with(
        &c,
        "secret-copier",
        |t| {
            t.replace("from: default", &format!("from: {mark}"))
                .replace(
                    "matchExpressions: [{key: secret-copier, operator: NotIn, values: [\"no\"]}]",
                    &format!("matchLabels: {{copier-test: {mark}}}"),
                )
        },
        runbook_operator::runtime::OperatorConfig {
            namespace: Some(String::new()),
            ..Default::default()
        },
    )
    .await;
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    let made = |suffix: &str, labelled: bool| {
        let labels = if labelled {
            json!({"copier-test": mark})
        } else {
            json!({})
        };
        serde_json::from_value::<Namespace>(
            json!({"metadata": {"name": format!("{mark}-{suffix}"), "labels": labels}}),
        )
        .unwrap()
    };
    for (suffix, labelled) in [("a", true), ("b", true), ("off", false)] {
        namespaces
            .create(&PostParams::default(), &made(suffix, labelled))
            .await
            .unwrap();
    }
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "registry", "labels": {"secret-copier": "yes"}},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": "eyJhdXRocyI6e319"}}))
    .unwrap();
    c.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let in_ns = |suffix: &str| -> Api<Secret> {
        Api::namespaced(c.client.clone(), &format!("{mark}-{suffix}"))
    };
    let copy = |suffix: &str| {
        let api = in_ns(suffix);
        async move { api.get_opt("registry").await.unwrap() }
    };
    eventually("copies in the labelled namespaces", 30, || async {
        copy("a").await.is_some() && copy("b").await.is_some()
    })
    .await;
    let a = copy("a").await.unwrap();
    assert_eq!(
        a.data.as_ref().map(|d| d.len()),
        Some(1),
        "the data is copied: {a:?}"
    );
    assert_eq!(a.type_.as_deref(), Some("kubernetes.io/dockerconfigjson"));
    assert!(
        a.metadata.owner_references.is_none(),
        "no ownerReference crosses namespaces: {a:?}"
    );
    assert!(
        copy("off").await.is_none(),
        "an unlabelled namespace gets none"
    );
    // A namespace made later gets its copy.
    namespaces
        .create(&PostParams::default(), &made("late", true))
        .await
        .unwrap();
    eventually("a copy in the namespace made later", 30, || async {
        copy("late").await.is_some()
    })
    .await;
    // A copy deleted by hand comes back.
    in_ns("a")
        .delete("registry", &Default::default())
        .await
        .unwrap();
    eventually("the deleted copy back", 30, || async {
        copy("a")
            .await
            .is_some_and(|s| s.metadata.deletion_timestamp.is_none())
    })
    .await;
    // A user who may make Secrets only in the test's namespace gets no
    // copy through Runbook where they may not write one, and reads why.
    let user = "copier-user";
    let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(json!({
        "metadata": {"name": user},
        "rules": [{"apiGroups": [""], "resources": ["secrets"],
                   "verbs": ["create", "get", "list", "watch", "patch", "delete"]}]}))
    .unwrap();
    c.api::<k8s_openapi::api::rbac::v1::Role>()
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
    .unwrap();
    c.api::<k8s_openapi::api::rbac::v1::RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let as_user: Api<Secret> =
        Api::namespaced(c.client_as(user, &["system:authenticated"]).await, &c.ns);
    let theirs: Secret = serde_json::from_value(json!({
        "metadata": {"name": "theirs", "labels": {"secret-copier": "yes"}},
        "stringData": {"token": "t"}}))
    .unwrap();
    // A real server's RBAC follows a new binding a moment later.
    eventually("the user's Role in force", 30, || async {
        as_user
            .create(&PostParams::default(), &theirs)
            .await
            .is_ok()
    })
    .await;
    let states = c.runbook_states();
    eventually("the refusal, said on the Secret's state", 30, || async {
        states
            .get_opt("secret.theirs")
            .await
            .unwrap()
            .is_some_and(|s| {
                s.data["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == "Degraded"
                            && c["reason"] == "NotAuthorized"
                            && c["message"]
                                .as_str()
                                .is_some_and(|m| m.contains(user) && m.contains("create secrets"))
                    })
                })
            })
    })
    .await;
    for ns in ["a", "b", "late"] {
        assert!(
            in_ns(ns).get_opt("theirs").await.unwrap().is_none(),
            "no copy where its author may not write one ({ns})"
        );
    }
    as_user.delete("theirs", &Default::default()).await.unwrap();
    // The Secret goes: so do its copies, and then the Secret itself.
    c.api::<Secret>()
        .delete("registry", &Default::default())
        .await
        .unwrap();
    eventually("every copy gone with the Secret", 30, || async {
        copy("a").await.is_none() && copy("b").await.is_none() && copy("late").await.is_none()
    })
    .await;
    eventually("the Secret gone once its copies are", 30, || async {
        c.api::<Secret>()
            .get_opt("registry")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    op.shutdown(std::time::Duration::from_secs(5)).await;
    for suffix in ["a", "b", "off", "late"] {
        let _ = namespaces
            .delete(&format!("{mark}-{suffix}"), &Default::default())
            .await;
    }
    c.cleanup().await;
}

/// shell-operator's pod monitor (`examples/101-monitor-pods`): each Pod
/// is told once, "Pod 'NAME' added", however it changes afterwards; the
/// memory of it is the policy's own status field, which a Pod's status
/// cannot keep, so it is kept in the Pod's RunbookState.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_pods() {
    use k8s_openapi::api::core::v1::Event;
    let c = Cluster::new("port-pods").await;
    let op = start_example(&c, "monitor-pods", |t| t).await;
    let pods: Api<Pod> = c.api();
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web-1"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let events: Api<Event> = c.api();
    let told = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.message.as_deref() == Some("Pod 'web-1' added"))
            .map(|e| e.count.unwrap_or(1))
            .sum::<i32>()
    };
    eventually("the Pod told", 30, || async { told().await >= 1 }).await;
    let states = c.runbook_states();
    eventually("the memory of it in the Pod's RunbookState", 30, || async {
        states
            .get_opt("pod.web-1")
            .await
            .unwrap()
            .is_some_and(|s| s.data["status"]["fields"]["announced"] == true)
    })
    .await;
    let live = pods.get("web-1").await.unwrap();
    let status = serde_json::to_value(&live.status).unwrap();
    assert!(
        status.get("announced").is_none(),
        "not written to the Pod: {status}"
    );
    // The RunbookState CRD served is this release's: nothing said of it.
    let metrics = op.ctx.metrics.render();
    assert!(
        !metrics.contains("runbook_crd_outdated{crd=\"runbookstates.runbook.dev\""),
        "{metrics}"
    );
    // A change of the Pod tells nothing more, once it is reconciled.
    let reconciled = || -> f64 {
        op.ctx
            .metrics
            .render()
            .lines()
            .filter(|l| {
                (l.starts_with("runbook_reconciles_total{")
                    || l.starts_with("runbook_unchanged_reconciles_total{"))
                    && l.contains("monitor-pods")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = reconciled();
    pods.patch(
        "web-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
    )
    .await
    .unwrap();
    eventually("the changed Pod reconciled", 30, || async {
        reconciled() > before
    })
    .await;
    assert_eq!(told().await, 1, "told once");
    finish_without_failures(c, op).await;
}

/// An operator running an example whose policy targets Namespaces, kept
/// to the test's own ones by the label `runbook-port: <the test's
/// namespace>`: it reconciles every namespace (the test's Namespaces are
/// others than its own), and keeps Runbook's state of them in the test's.
async fn start_namespace_example(
    c: &Cluster,
    example: &str,
) -> std::sync::Arc<runbook_operator::runtime::Operator> {
    let mark = c.ns.clone();
    start_example_with(
        c,
        example,
        |t| {
            t.replace(
                "  target: {apiVersion: v1, kind: Namespace}\n",
                &format!(
                    "  target: {{apiVersion: v1, kind: Namespace}}\n  selector: {{matchLabels: {{runbook-port: {mark}}}}}\n"
                ),
            )
        },
        runbook_operator::runtime::OperatorConfig {
            operator_namespace: c.ns.clone(),
            ..support::all_namespaces()
        },
    )
    .await
}

/// A Namespace of the test's own: `{ns}-{suffix}`, labelled for
/// [`start_namespace_example`].
async fn test_namespace(c: &Cluster, suffix: &str) -> String {
    use k8s_openapi::api::core::v1::Namespace;
    let name = format!("{}-{suffix}", c.ns);
    let ns: Namespace = serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"runbook-port": c.ns}}}),
    )
    .unwrap();
    Api::<Namespace>::all(c.client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    name
}

/// Kyverno's add-networkpolicy (`best-practices/add_network_policy`): a
/// new Namespace gets the generated `default-deny`, as Kyverno's own test
/// checks; with its `synchronize: true`, a hand edit of it is taken back
/// and a deleted one comes back. The policy selects the test's own
/// namespaces by a label, so that it leaves the others of the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_network_policy() {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let c = Cluster::new("port-netpol").await;
    let op = start_namespace_example(&c, "add-network-policy").await;
    let name = test_namespace(&c, "team").await;
    let nss: Api<Namespace> = Api::all(c.client.clone());
    let policies: Api<NetworkPolicy> = Api::namespaced(c.client.clone(), &name);
    let types = || async {
        policies
            .get_opt("default-deny")
            .await
            .unwrap()
            .and_then(|p| p.spec)
            .and_then(|s| s.policy_types)
    };
    let both = || Some(vec!["Ingress".to_string(), "Egress".to_string()]);
    eventually("default-deny in the new Namespace", 30, || async {
        types().await == both()
    })
    .await;
    let generated = policies.get("default-deny").await.unwrap();
    assert_eq!(
        serde_json::to_value(&generated.spec.as_ref().unwrap().pod_selector).unwrap(),
        json!({}),
        "it selects every Pod"
    );
    // As `kubectl edit` would: the policy's field is taken back.
    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    policies
        .patch(
            "default-deny",
            &edit,
            &Patch::Merge(json!({"spec": {"policyTypes": ["Ingress"]}})),
        )
        .await
        .unwrap();
    eventually("the hand edit taken back", 30, || async {
        types().await == both()
    })
    .await;
    policies
        .delete("default-deny", &Default::default())
        .await
        .unwrap();
    eventually("a deleted default-deny made again", 30, || async {
        policies
            .get_opt("default-deny")
            .await
            .unwrap()
            .is_some_and(|p| p.metadata.uid != generated.metadata.uid)
    })
    .await;
    // The test's own namespace has no such label: left alone.
    let own: Api<NetworkPolicy> = c.api();
    assert!(own.get_opt("default-deny").await.unwrap().is_none());
    let _ = nss.delete(&name, &Default::default()).await;
    finish_without_failures(c, op).await;
}

/// Kopf's timers (`examples/15-timers`): once the example has been left
/// alone for 5 s its first timer pings every 2 s (the second waits 10 s);
/// a change of its spec silences them until it has been idle again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers() {
    use k8s_openapi::api::core::v1::Event;
    let c = Cluster::new("port-timers").await;
    let (group, examples) = example_crd(&c, "timers", "kopf.dev").await;
    let op = start_example(&c, "timers", |t| {
        t.replace("kopf.dev/v1", &format!("{group}/v1"))
    })
    .await;
    let example = example_json(&c, "timers", "example.yaml", Some(("kopf.dev", &group)));
    let made = std::time::Instant::now();
    examples
        .create(
            &PostParams::default(),
            &serde_json::from_value(example).unwrap(),
        )
        .await
        .unwrap();
    let events: Api<Event> = c.api();
    let pings = |says: &'static str| {
        let events = events.clone();
        async move {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|e| e.message.as_deref() == Some(says))
                .map(|e| e.count.unwrap_or(1))
                .sum::<i32>()
        }
    };
    let sync = "Ping from the sync timer: field=value";
    eventually("the first timer pings", 30, || async {
        pings(sync).await >= 1
    })
    .await;
    assert!(
        made.elapsed() >= std::time::Duration::from_secs(5),
        "it waited for the example to be idle 5 s"
    );
    eventually("the second timer pings, later", 30, || async {
        pings("Ping from the async timer: field=value").await >= 1
    })
    .await;
    let changed = std::time::Instant::now();
    examples
        .patch(
            "kopf-example-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"field": "changed"}})),
        )
        .await
        .unwrap();
    eventually("a ping after the change", 30, || async {
        pings("Ping from the sync timer: field=changed").await >= 1
    })
    .await;
    assert!(
        changed.elapsed() >= std::time::Duration::from_secs(5),
        "the change started the wait again"
    );
    finish_without_failures(c, op).await;
}

/// shell-operator's monitor-namespaces (`examples/102-monitor-namespaces`):
/// a Namespace made, its labels changed and its deletion are each told
/// once; an annotation changed is not; the operator restarted between the
/// label change and the deletion tells nothing again. The policy selects
/// the test's own namespaces by a label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_namespaces() {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::events::v1::Event;
    let c = Cluster::new("port-nsmon").await;
    let op = start_namespace_example(&c, "monitor-namespaces").await;
    let name = test_namespace(&c, "watched").await;
    let nss: Api<Namespace> = Api::all(c.client.clone());
    let events: Api<Event> = Api::all(c.client.clone());
    let told = |says: String| {
        let (events, name) = (events.clone(), name.clone());
        async move {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                        && e.note.as_deref() == Some(says.as_str())
                })
                .map(|e| e.deprecated_count.unwrap_or(1))
                .sum::<i32>()
        }
    };
    let created = format!("Namespace {name} was created");
    eventually("its creation told", 30, || async {
        told(created.clone()).await >= 1
    })
    .await;
    nss.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"owner": "ana"}}})),
    )
    .await
    .unwrap();
    nss.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "ml"}}})),
    )
    .await
    .unwrap();
    let modified = format!("Namespace {name} labels were modified");
    eventually("the label change told", 30, || async {
        told(modified.clone()).await >= 1
    })
    .await;
    op.shutdown(std::time::Duration::from_secs(5)).await;
    // A restart tells nothing again: what was seen is remembered.
    let op = start_namespace_example(&c, "monitor-namespaces").await;
    nss.delete(&name, &Default::default()).await.unwrap();
    let deleted = format!("Namespace {name} was deleted");
    eventually("the deletion told", 60, || async {
        told(deleted.clone()).await >= 1
    })
    .await;
    assert_eq!(told(created).await, 1, "created told once");
    assert_eq!(told(modified).await, 1, "one label change told once");
    assert_eq!(told(deleted).await, 1, "deleted told once");
    finish_without_failures(c, op).await;
}

/// Kopf's filtering handlers (`examples/11-filtering-handlers`), checked
/// as its `test_example_11.py` checks them: the messages of the handlers
/// whose filters hold are there, the others are not, and the update
/// handler runs on the change of `spec.field` from `value` to `changed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtering_handlers() {
    use k8s_openapi::api::core::v1::Event;
    let c = Cluster::new("port-filters").await;
    let (group, examples) = example_crd(&c, "filtering-handlers", "kopf.dev").await;
    let op = start_example(&c, "filtering-handlers", |t| {
        t.replace("kopf.dev/v1", &format!("{group}/v1"))
    })
    .await;
    let example = example_json(
        &c,
        "filtering-handlers",
        "example.yaml",
        Some(("kopf.dev", &group)),
    );
    examples
        .create(
            &PostParams::default(),
            &serde_json::from_value(example).unwrap(),
        )
        .await
        .unwrap();
    let events: Api<Event> = c.api();
    let said = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Handled"))
            .filter_map(|e| e.message)
            .collect::<std::collections::BTreeSet<String>>()
    };
    eventually("the creation handlers", 30, || async {
        said().await.contains("Field presence is satisfied.")
    })
    .await;
    eventually("the daemon", 30, || async {
        said().await.contains("Field daemon is satisfied.")
    })
    .await;
    examples
        .patch(
            "kopf-example-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"field": "changed"}})),
        )
        .await
        .unwrap();
    eventually("the update handler", 30, || async {
        said().await.contains("Field change is satisfied.")
    })
    .await;
    let said = said().await;
    for there in [
        "Label is matching.",
        "Label is present.",
        "Label is absent.",
        "Label callback matching.",
        "Annotation is matching.",
        "Annotation is present.",
        "Annotation is absent.",
        "Filter satisfied.",
        "Field value is satisfied.",
    ] {
        assert!(said.contains(there), "{there:?} missing: {said:?}");
    }
    for absent in [
        "Annotation callback mismatch.",
        "Filter not satisfied.",
        "Field value is not satisfied.",
        "Field presence is not satisfied.",
    ] {
        assert!(!said.contains(absent), "{absent:?} said: {said:?}");
    }
    finish_without_failures(c, op).await;
}

/// kro's web-app graph (`examples/kubernetes/webapp`): a WebApp with only
/// a name becomes a Deployment and a Service with the schema's defaults;
/// the Ingress switched on is made, the Service switched off is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_app() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::networking::v1::Ingress;
    let c = Cluster::new("port-webapp").await;
    let (group, apps) = example_crd(&c, "web-app", "kro.run").await;
    let op = start_example(&c, "web-app", |t| {
        t.replace("kro.run/v1alpha1", &format!("{group}/v1alpha1"))
    })
    .await;
    let app = example_json(&c, "web-app", "web-app.yaml", Some(("kro.run", &group)));
    apps.create(
        &PostParams::default(),
        &serde_json::from_value(app).unwrap(),
    )
    .await
    .unwrap();
    let deployments: Api<Deployment> = c.api();
    let services: Api<Service> = c.api();
    let ingresses: Api<Ingress> = c.api();
    eventually("the Deployment and the Service", 30, || async {
        deployments.get_opt("web").await.unwrap().is_some()
            && services.get_opt("web").await.unwrap().is_some()
    })
    .await;
    let d = deployments.get("web").await.unwrap().spec;
    assert_eq!(d.replicas, Some(1), "the schema's default");
    let container = &d.template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx"));
    assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 8080);
    assert!(ingresses.get_opt("web").await.unwrap().is_none());
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"ingress": {"enabled": true}, "service": {"enabled": false}}}),
        ),
    )
    .await
    .unwrap();
    eventually("the Ingress made and the Service gone", 30, || async {
        ingresses.get_opt("web").await.unwrap().is_some()
            && services
                .get_opt("web")
                .await
                .unwrap()
                .is_none_or(|s| s.metadata.deletion_timestamp.is_some())
    })
    .await;
    finish_without_failures(c, op).await;
}

/// Kyverno's cleanup-bare-pods (a `ClusterCleanupPolicy` every five
/// minutes; here every 2 s): the bare Pod is deleted at the next run, a
/// Pod with an owner stays, and nothing is written per Pod: the sweep's
/// one RunbookState keeps its run times and what it found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_bare_pods() {
    let c = Cluster::new("port-sweep").await;
    let pods: Api<Pod> = c.api();
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = c.api();
    let owner = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let pod = |name: &str, owned: bool| -> Pod {
        let mut p = json!({"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}});
        if owned {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "owner", "uid": owner.metadata.uid, "controller": true}]);
        }
        serde_json::from_value(p).unwrap()
    };
    for (name, owned) in [("debug-shell", false), ("kept", true)] {
        pods.create(&PostParams::default(), &pod(name, owned))
            .await
            .unwrap();
    }
    let op = start_example(&c, "cleanup-bare-pods", |t| {
        t.replace("cron: \"*/5 * * * *\"", "every: 2s")
    })
    .await;
    eventually("the bare Pod deleted at a run", 30, || async {
        pods.get_opt("debug-shell").await.unwrap().is_none()
    })
    .await;
    let states = Api::<kube::core::DynamicObject>::namespaced_with(
        c.client.clone(),
        &c.ns,
        &runbook_core::kinds::KindRef::new("runbook.dev/v1alpha1", "RunbookState").api_resource(),
    );
    // A later run finds nothing bare, and says so in its record.
    eventually("a run that finds no bare Pod", 30, || async {
        let state = states
            .get_opt("sweep.runbook.dev.cleanup-bare-pods")
            .await
            .unwrap();
        state.is_some_and(|s| s.data["status"]["fields"]["found"] == 0)
    })
    .await;
    assert!(pods.get_opt("kept").await.unwrap().is_some());
    let names: Vec<String> = states
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(names, ["sweep.runbook.dev.cleanup-bare-pods"]);
    finish_without_failures(c, op).await;
}
