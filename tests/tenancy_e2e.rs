//! Tenants sharing one operator: a policy from a ConfigMap in a team's
//! namespace acts with that team's account, fails alone, and names only
//! what is its namespace's.
//!
//! The operator runs as its ServiceAccount, authenticated by a token (so
//! that it can impersonate, as a pod's operator does), with exactly the
//! RBAC `runbook rbac` derives: cluster-wide for itself, and in each
//! tenant's namespace what `runbook rbac --tenant` prints (the account's
//! Role, and the operator's there). People act as users holding only
//! their Roles. Every attack a user who may only write ConfigMaps in a
//! team's namespace could try through Runbook is refused, by Runbook's
//! bounds or by the API server for the tenant's account, on the sandbox
//! (RBAC and impersonation from the four RBAC kinds) and on a real
//! control plane.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use cluster::{Cluster, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use runbook_core::alert::LogSink;
use runbook_core::clock::Clock;
use runbook_core::script::ScriptEngine;
use runbook_operator::reload::{self, Reloader, SourceConfig};
use runbook_operator::runtime::{Operator, OperatorConfig};
use runbook_operator::telemetry::Metrics;
use serde_json::{Value, json};
use support::{crd_resource, grant_tenant};

/// The tenants' own kind, with a plural no rule would guess.
fn gadgets_of(c: &Cluster) -> ApiResource {
    let group = format!("{}.tenant.dev", c.ns);
    ApiResource {
        api_version: format!("{group}/v1"),
        group,
        version: "v1".into(),
        kind: "Gadget".into(),
        plural: "gadgetries".into(),
    }
}

async fn install_gadget_crd(c: &Cluster) {
    let g = gadgets_of(c);
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("gadgetries.{}", g.group)},
        "spec": {
            "group": g.group, "scope": "Namespaced",
            "names": {"kind": "Gadget", "plural": "gadgetries", "singular": "gadget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}}
            }]
        }
    }))
    .unwrap();
    let crds: Api<DynamicObject> = Api::all_with(c.client.clone(), &crd_resource());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let gadgets: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), &c.ns, &g);
    eventually("the Gadget kind served", 60, || async {
        gadgets.list(&Default::default()).await.is_ok()
    })
    .await;
}

/// A team's sanctioned policy on its Gadgets: a ConfigMap child and a
/// status field.
fn gadgets_policy(c: &Cluster, name: &str) -> Vec<(String, String)> {
    let policy = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: {name}}}\nspec:\n  target: {{apiVersion: {}, kind: Gadget}}\n  selector: {{matchLabels: {{kind: plain}}}}\n  owns: [{{apiVersion: v1, kind: ConfigMap}}]\n  script: gadgets.rhai\n  status: {{fields: [made]}}\n",
        gadgets_of(c).api_version
    );
    let script = r#"
fn reconcile(ctx) {
    let n = ctx.resource.metadata.name;
    [apply(#{ apiVersion: "v1", kind: "ConfigMap", metadata: #{ name: `${n}-made` }, data: #{ by: "runbook" } }),
     status(#{ made: `${n}-made` })]
}
"#;
    vec![
        (format!("{name}.yaml"), policy),
        ("gadgets.rhai".into(), script.into()),
    ]
}

/// Alice's policy: what a user who may only write ConfigMaps would like
/// Runbook to do for her, one attack per Gadget (`spec.attack`). With
/// `pods`, it also asks for pods beyond any bound.
fn pwn_policy(c: &Cluster, pods: bool) -> Vec<(String, String)> {
    let widen = if pods {
        "  pods: {privileged: true, hostNamespaces: true, hostPath: true, serviceAccounts: [powerful]}\n"
    } else {
        ""
    };
    let policy = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: pwn}}\nspec:\n  target: {{apiVersion: {}, kind: Gadget}}\n  selector: {{matchLabels: {{kind: attack}}}}\n  owns: [{{apiVersion: batch/v1, kind: Job}}]\n  mutates: [{{apiVersion: apps/v1, kind: Deployment}}]\n  deletes: [{{apiVersion: apps/v1, kind: Deployment}}]\n  script: pwn.rhai\n  status: {{fields: [pwned]}}\n{widen}",
        gadgets_of(c).api_version
    );
    let script = r#"
fn job(name, privileged) {
    let pod = #{ restartPolicy: "Never", containers: [#{ name: "x", image: "busybox", command: ["sh", "-c", "true"] }] };
    if privileged {
        pod = #{
            restartPolicy: "Never", hostNetwork: true, hostPID: true, serviceAccountName: "powerful",
            containers: [#{ name: "x", image: "busybox", securityContext: #{ privileged: true },
                            volumeMounts: [#{ name: "root", mountPath: "/host" }, #{ name: "db", mountPath: "/db" }] }],
            volumes: [#{ name: "root", hostPath: #{ path: "/" } }, #{ name: "db", secret: #{ secretName: "db-root" } }]
        };
    }
    apply(#{ apiVersion: "batch/v1", kind: "Job", metadata: #{ name: name },
             spec: #{ template: #{ spec: pod } } })
}

fn reconcile(ctx) {
    switch ctx.resource.spec.attack {
        "privileged" => [job("alice-pwn", true)],
        "job" => [job("alice-job", false)],
        "patch" => [patch("Deployment", "payments", #{ spec: #{ replicas: 0, template: #{ spec: #{ containers: [#{ name: "app", image: "evil/miner:latest" }] } } } })],
        "delete" => [delete("Deployment", "ledger")],
        _ => []
    }
}
"#;
    vec![
        ("pwn.yaml".into(), policy),
        ("pwn.rhai".into(), script.into()),
    ]
}

fn configmap(name: &str, files: &[(String, String)]) -> ConfigMap {
    let data: serde_json::Map<String, Value> =
        files.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"runbook.dev/policy": "true"}},
        "data": data
    }))
    .unwrap()
}

/// Create `docs` in `ns` as the administrator (409 is fine).
async fn create_in(c: &Cluster, ns: &str, docs: Vec<Value>) {
    for d in docs {
        let kind = runbook_core::kinds::KindRef::new(
            d["apiVersion"].as_str().unwrap(),
            d["kind"].as_str().unwrap(),
        );
        let ns = d["metadata"]["namespace"].as_str().unwrap_or(ns);
        let api: Api<DynamicObject> = if kind.namespaced() {
            Api::namespaced_with(c.client.clone(), ns, &kind.api_resource())
        } else {
            Api::all_with(c.client.clone(), &kind.api_resource())
        };
        let obj: DynamicObject = serde_json::from_value(d.clone()).unwrap();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        let apply = kube::api::PatchParams::apply("runbook-test-admin").force();
        api.patch(name, &apply, &kube::api::Patch::Apply(&obj))
            .await
            .unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
    }
}

/// A shared installation: the operator's namespace (the test's), two
/// teams' namespaces, the teams' own CRD, and the operator's cluster-wide
/// RBAC as `runbook rbac` derives it with no cluster-wide policy (its
/// Lease, the policy ConfigMaps of both teams, the access reviews).
struct Shared {
    c: Cluster,
    a: String,
    b: String,
}

impl Shared {
    async fn new(test: &str) -> Self {
        let c = Cluster::new(test).await;
        let a = c.extra_namespace("a").await;
        let b = c.extra_namespace("b").await;
        install_gadget_crd(&c).await;
        let opts = runbook_operator::rbac::Options {
            name: format!("runbook-{}", c.ns),
            namespace: c.ns.clone(),
            policy_namespaces: vec![a.clone(), b.clone()],
            webhook: None,
            ..Default::default()
        };
        let none = runbook_core::policy::PolicySet::default();
        let rbac = runbook_operator::rbac::render(
            &runbook_operator::rbac::needs(&none, &opts, &Default::default()),
            &opts,
        );
        let docs = runbook_core::util::yaml::parse_documents(&rbac).unwrap();
        create_in(&c, &c.ns, docs).await;
        Self { c, a, b }
    }

    fn gadgets(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.c.client.clone(), ns, &gadgets_of(&self.c))
    }

    /// A team's sanctioned policies, with the RBAC `runbook rbac --tenant`
    /// prints for them in the team's namespace.
    async fn sanction(&self, ns: &str, name: &str, files: &[(String, String)]) {
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let set = support::policies(&self.c, &refs);
        grant_tenant(&self.c, ns, &set, (&self.c.ns, "runbook")).await;
        let cms: Api<ConfigMap> = Api::namespaced(self.c.client.clone(), ns);
        cms.create(&PostParams::default(), &configmap(name, files))
            .await
            .unwrap();
    }

    async fn gadget(&self, ns: &str, name: &str, labels: Value, spec: Value) {
        let g = gadgets_of(&self.c);
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": g.api_version, "kind": "Gadget",
            "metadata": {"name": name, "labels": labels}, "spec": spec
        }))
        .unwrap();
        self.gadgets(ns)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap();
    }

    /// The operator, as its ServiceAccount, reading policy ConfigMaps in
    /// both teams' namespaces, started.
    async fn operator(&self) -> (Arc<Operator>, Arc<Reloader>, Vec<String>) {
        if let Ok(filter) = std::env::var("RUNBOOK_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let me = self
            .c
            .client_of_service_account(&self.c.ns, "runbook")
            .await;
        let engine = Arc::new(ScriptEngine::default());
        let metrics = Arc::new(Metrics::new());
        let reloader = Arc::new(
            Reloader::new(engine.clone(), Some(me.clone()), metrics.clone(), "test")
                .with_secret_namespace(&self.c.ns),
        );
        let sources = SourceConfig {
            dirs: vec![],
            configmap_namespaces: vec![self.a.clone(), self.b.clone()],
            admission: false,
        };
        let mut bundles = Vec::new();
        for ns in &sources.configmap_namespaces {
            bundles.extend(
                runbook_operator::reload::sources::configmap_bundles(&me, ns)
                    .await
                    .unwrap(),
            );
        }
        let (set, errors) = reloader.initial(bundles).await;
        let op = Arc::new(Operator::new(
            me,
            engine,
            set,
            Clock::real(),
            Arc::new(LogSink::default()),
            metrics,
            OperatorConfig {
                operator_namespace: self.c.ns.clone(),
                backoff_base: Duration::from_millis(50),
                backoff_max: Duration::from_secs(2),
                ..Default::default()
            },
        ));
        op.start().await.expect("the operator starts");
        reload::spawn(reloader.clone(), op.clone(), sources);
        (op, reloader, errors)
    }

    /// Whether an Event of `reason` on the ConfigMap `name` in `ns` has a
    /// note `note` accepts.
    async fn event_on(
        &self,
        ns: &str,
        name: &str,
        reason: &str,
        note: impl Fn(&str) -> bool,
    ) -> bool {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.c.client.clone(), ns);
        events
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.note.as_deref().is_some_and(&note)
            })
    }
}

/// Condition `type_` of a Gadget: (status, reason, message).
async fn condition(api: &Api<DynamicObject>, name: &str, type_: &str) -> Option<[String; 3]> {
    let g = api.get(name).await.ok()?;
    let c = g.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    let text = |k: &str| c[k].as_str().unwrap_or("").to_string();
    Some([text("status"), text("reason"), text("message")])
}

/// A user who may only write ConfigMaps in team a writes a policy there.
/// Its `spec.pods` beyond the administrator's bounds refuses it at load;
/// without them it loads (warned of the writes its account may not make),
/// and then: its privileged Job is refused by Runbook's bounds, its plain
/// Job, its patch of another team's Deployment and its delete of another
/// one are refused by the API server for the tenant's account. Nothing of
/// them exists or changed; each Gadget says why. The team's sanctioned
/// policy on its own CRD works meanwhile with exactly the printed Roles,
/// and the second team's policy of the same name runs in its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_policy_gets_only_what_its_account_may_do() {
    let s = Shared::new("tenancy").await;
    let (c, a, b) = (&s.c, s.a.clone(), s.b.clone());
    // Another team's workloads in team a, whose owner lets any target act
    // on them (so only the account's rights stand in the way).
    for name in ["payments", "ledger"] {
        create_in(c, &a, vec![json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {"app": name},
                         "annotations": {"runbook.dev/allow-targets": "*"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": "payments:1"}]}}}
        })])
        .await;
    }
    create_in(
        c,
        &a,
        vec![
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "powerful"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-root"},
               "stringData": {"password": "hunter2"}}),
        ],
    )
    .await;
    s.sanction(&a, "gadgets", &gadgets_policy(c, "gadgets"))
        .await;
    s.sanction(&b, "gadgets", &gadgets_policy(c, "gadgets"))
        .await;
    // The team's administrator also lets its account read its workloads.
    create_in(c, &a, vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "workload-viewer"},
               "rules": [{"apiGroups": ["apps", "batch"], "resources": ["deployments", "jobs"],
                          "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "runbook-tenant-views"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workload-viewer"},
               "subjects": [{"kind": "ServiceAccount", "name": "runbook-tenant", "namespace": a},
                            {"kind": "ServiceAccount", "name": "runbook", "namespace": c.ns}]}),
        // Alice: ConfigMaps in team a, nothing else.
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "configmap-writer"},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                          "verbs": ["get", "list", "create", "update", "patch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "alice-writes-configmaps"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-writer"},
               "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]}),
    ])
    .await;
    s.gadget(&a, "plain", json!({"kind": "plain"}), json!({}))
        .await;
    s.gadget(&b, "plain", json!({"kind": "plain"}), json!({}))
        .await;
    for attack in ["privileged", "job", "patch", "delete"] {
        s.gadget(
            &a,
            attack,
            json!({"kind": "attack"}),
            json!({"attack": attack}),
        )
        .await;
    }
    let (op, reloader, errors) = s.operator().await;
    assert!(errors.is_empty(), "{errors:?}");
    // Both teams' sanctioned policies of the same name run, each in its
    // own namespace, on the tenants' own kind watched there alone.
    let cms = |ns: &str| Api::<ConfigMap>::namespaced(c.client.clone(), ns);
    for ns in [&a, &b] {
        eventually("the sanctioned policy's child", 30, || async {
            cms(ns).get_opt("plain-made").await.ok().flatten().is_some()
        })
        .await;
    }
    let ready = reload::readiness(&op, &reloader);
    assert_eq!(ready(), Ok(Vec::new()));
    // With exactly the printed Roles, no watch is refused: the tenants'
    // own kind and Runbook's state are watched in their namespaces only.
    let failing: Vec<String> = op
        .ctx
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("runbook_watch_failing{") && l.ends_with(" 1"))
        .map(str::to_string)
        .collect();
    assert!(failing.is_empty(), "{failing:?}");
    // Alice writes her policy, as herself.
    let alice = c.client_as("alice", &[]).await;
    let hers: Api<ConfigMap> = Api::namespaced(alice, &a);
    hers.create(
        &PostParams::default(),
        &configmap("pwn", &pwn_policy(c, true)),
    )
    .await
    .unwrap();
    eventually("the pod bounds refusing the bundle", 30, || {
        s.event_on(&a, "pwn", "PolicyInvalid", |n| {
            n.contains("spec.pods: privileged: true") && n.contains("allows tenants (nothing;")
        })
    })
    .await;
    hers.patch(
        "pwn",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"pwn.yaml": pwn_policy(c, false)[0].1}})),
    )
    .await
    .unwrap();
    let tenant = format!("system:serviceaccount:{a}:runbook-tenant");
    eventually("the writes its account may not make, warned", 30, || {
        s.event_on(&a, "pwn", "PolicyWarning", |n| {
            n.contains(&format!(
                "{tenant} may not create, delete, patch, update jobs.batch in namespace {a}"
            )) && n.contains("delete, patch, update deployments.apps")
        })
    })
    .await;
    let gadgets = s.gadgets(&a);
    eventually(
        "the privileged Job refused by the pod bounds",
        30,
        || async {
            condition(&gadgets, "privileged", "Degraded")
                .await
                .is_some_and(|[st, reason, m]| {
                    st == "True" && reason == "ActionRefused" && m.contains("spec.pods")
                })
        },
    )
    .await;
    for (attack, what) in [
        ("job", "cannot patch resource \"jobs\""),
        ("patch", "cannot patch resource \"deployments\""),
        ("delete", "cannot delete resource \"deployments\""),
    ] {
        eventually(
            &format!("the {attack} refused by the API server"),
            30,
            || async {
                condition(&gadgets, attack, "Degraded")
                    .await
                    .is_some_and(|[st, reason, m]| {
                        st == "True"
                            && reason == "Forbidden"
                            && m.contains(&format!("User \"{tenant}\""))
                            && m.contains(what)
                    })
            },
        )
        .await;
    }
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &a);
    for name in ["alice-pwn", "alice-job"] {
        assert!(jobs.get_opt(name).await.unwrap().is_none(), "{name}");
    }
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), &a);
    let payments = serde_json::to_value(deployments.get("payments").await.unwrap()).unwrap();
    assert_eq!(payments["spec"]["replicas"], 1);
    assert_eq!(
        payments["spec"]["template"]["spec"]["containers"][0]["image"],
        "payments:1"
    );
    assert!(deployments.get_opt("ledger").await.unwrap().is_some());
    // A tenant's refused writes are the tenant's: the operator stays ready.
    assert!(ready().is_ok(), "{:?}", ready());
    op.shutdown(Duration::from_secs(5)).await;
    s.c.cleanup().await;
}

/// What a tenant writes never stops the operator: with team b's bundles
/// written while no operator ran (one reading what its account may not
/// read, one that does not compile, one on a kind nobody serves), the
/// operator starts, is ready (saying which of team b's bundles do not
/// run), team a's policy works, and each of team b's ConfigMaps says why.
/// Granting the missing right loads that bundle without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_bundle_that_cannot_run_stops_only_itself() {
    let s = Shared::new("tenantdos").await;
    let (c, a, b) = (&s.c, s.a.clone(), s.b.clone());
    s.sanction(&a, "gadgets", &gadgets_policy(c, "gadgets"))
        .await;
    s.gadget(&a, "plain", json!({"kind": "plain"}), json!({}))
        .await;
    // Team b: sanctioned for its gadgets, then three bundles the operator
    // cannot run, written while it is down.
    let sanctioned = gadgets_policy(c, "nosy");
    let refs: Vec<(&str, &str)> = sanctioned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    grant_tenant(c, &b, &support::policies(c, &refs), (&c.ns, "runbook")).await;
    let mut reads_pods = sanctioned.clone();
    reads_pods[0]
        .1
        .push_str("  reads: [{apiVersion: v1, kind: Pod}]\n");
    let cms_b: Api<ConfigMap> = Api::namespaced(c.client.clone(), &b);
    cms_b
        .create(&PostParams::default(), &configmap("nosy", &reads_pods))
        .await
        .unwrap();
    let broken = vec![
        (
            "broken.yaml".to_string(),
            gadgets_policy(c, "broken")[0]
                .1
                .replace("gadgets.rhai", "broken.rhai"),
        ),
        (
            "broken.rhai".to_string(),
            "fn reconcile(ctx) { [".to_string(),
        ),
    ];
    cms_b
        .create(&PostParams::default(), &configmap("broken", &broken))
        .await
        .unwrap();
    let unserved = vec![
        ("ghost.yaml".to_string(), "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: ghost}\nspec:\n  target: {apiVersion: ghosts.example.com/v1, kind: Ghost}\n  script: ghost.rhai\n".to_string()),
        ("ghost.rhai".to_string(), "fn reconcile(ctx) { [] }".to_string()),
    ];
    cms_b
        .create(&PostParams::default(), &configmap("ghost", &unserved))
        .await
        .unwrap();
    let (op, reloader, errors) = s.operator().await;
    assert!(!errors.is_empty(), "team b's bundles refused at start-up");
    eventually("team a's policy at work", 30, || async {
        Api::<ConfigMap>::namespaced(c.client.clone(), &a)
            .get_opt("plain-made")
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
    let ready = reload::readiness(&op, &reloader);
    let notes = ready().expect("ready whatever team b wrote");
    for bundle in ["nosy", "broken"] {
        assert!(
            notes
                .iter()
                .any(|n| n.contains(&format!("configmap/{b}/{bundle}"))),
            "{notes:?}"
        );
    }
    let tenant = format!("system:serviceaccount:{b}:runbook-tenant");
    eventually("why the nosy bundle does not run", 30, || {
        s.event_on(&b, "nosy", "PolicyInvalid", |n| {
            n.contains(&format!(
                "{tenant} may not get, list, watch pods in namespace {b}"
            ))
        })
    })
    .await;
    eventually("why the broken bundle does not run", 30, || {
        s.event_on(&b, "broken", "PolicyInvalid", |n| {
            n.contains("broken.rhai:1:")
        })
    })
    .await;
    // The right granted: the bundle loads by itself.
    create_in(c, &b, vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "pod-viewer"},
               "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "runbook-tenant-views-pods"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-viewer"},
               "subjects": [{"kind": "ServiceAccount", "name": "runbook-tenant", "namespace": b}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "runbook-views-pods"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-viewer"},
               "subjects": [{"kind": "ServiceAccount", "name": "runbook", "namespace": c.ns}]}),
    ])
    .await;
    eventually("the nosy bundle loaded once granted", 90, || async {
        op.ctx
            .policies
            .load()
            .policies
            .contains_key(&format!("{b}/nosy"))
    })
    .await;
    assert!(ready().is_ok());
    op.shutdown(Duration::from_secs(5)).await;
    s.c.cleanup().await;
}

/// Whether the ConfigMap `name` exists in `ns`.
async fn made(c: &Cluster, ns: &str, name: &str) -> bool {
    Api::<ConfigMap>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .is_some()
}

/// Operator down, a tenant's bundle broken meanwhile, operator up: the
/// version of that bundle that last loaded, kept in the operator's
/// namespace, runs in its place (a new target of it is reconciled), the
/// other team's targets are reconciled throughout, the operator is ready
/// and names the broken bundle, which its ConfigMap's Event and the
/// gauges say runs its last good version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_broken_while_the_operator_was_down_runs_its_last_good_version() {
    let s = Shared::new("lastgood").await;
    let (c, a, b) = (&s.c, s.a.clone(), s.b.clone());
    s.sanction(&a, "gadgets", &gadgets_policy(c, "gadgets"))
        .await;
    s.sanction(&b, "nosy", &gadgets_policy(c, "nosy")).await;
    s.gadget(&a, "a1", json!({"kind": "plain"}), json!({}))
        .await;
    s.gadget(&b, "b1", json!({"kind": "plain"}), json!({}))
        .await;
    let (op, _reloader, errors) = s.operator().await;
    assert!(errors.is_empty(), "{errors:?}");
    for (ns, name) in [(&a, "a1-made"), (&b, "b1-made")] {
        eventually(&format!("{ns}/{name}"), 30, || made(c, ns, name)).await;
    }
    // The version that loaded is kept where kubectl finds it.
    let kept = format!("runbook-last-good.{b}.nosy");
    let own: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    eventually(
        "team b's bundle kept in the operator's namespace",
        30,
        || async {
            own.list(&kube::api::ListParams::default().labels("runbook.dev/last-good"))
                .await
                .is_ok_and(|l| {
                    l.items.iter().any(|cm| {
                        cm.metadata.name.as_deref() == Some(kept.as_str())
                            && cm
                                .data
                                .as_ref()
                                .is_some_and(|d| d.contains_key("nosy.yaml"))
                    })
                })
        },
    )
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    drop(op);

    // While no operator runs, team b's script is broken (failurePolicy
    // Ignore lets it through).
    let cms_b: Api<ConfigMap> = Api::namespaced(c.client.clone(), &b);
    let patch = json!({"data": {"gadgets.rhai": "fn reconcile(ctx) { ["}});
    cms_b
        .patch("nosy", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    let (op, reloader, errors) = s.operator().await;
    assert!(
        errors.iter().any(|e| e.contains("gadgets.rhai:1:")),
        "the broken version is refused: {errors:?}"
    );
    assert!(
        op.ctx
            .policies
            .load()
            .policies
            .contains_key(&format!("{b}/nosy")),
        "the last good version of team b's bundle is in force"
    );
    let ready = reload::readiness(&op, &reloader);
    let notes = ready().expect("ready whatever team b's bundle holds");
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&format!("configmap/{b}/nosy")) && n.contains("last good")),
        "{notes:?}"
    );
    s.gadget(&b, "b2", json!({"kind": "plain"}), json!({}))
        .await;
    s.gadget(&a, "a2", json!({"kind": "plain"}), json!({}))
        .await;
    for (ns, name) in [(&b, "b2-made"), (&a, "a2-made")] {
        eventually(&format!("{ns}/{name} after the restart"), 30, || {
            made(c, ns, name)
        })
        .await;
    }
    eventually("the PolicyInvalid Event names the kept version", 30, || {
        s.event_on(&b, "nosy", "PolicyInvalid", |n| {
            n.contains("gadgets.rhai:1:") && n.contains(&kept)
        })
    })
    .await;
    let metrics = op.ctx.metrics.render();
    let bundle = format!("configmap/{b}/nosy");
    for series in [
        format!("runbook_bundle_state{{bundle=\"{bundle}\",state=\"last_good\"}} 1"),
        format!(
            "runbook_policy_state{{bundle=\"{bundle}\",policy=\"{b}/nosy\",state=\"last_good\"}} 1"
        ),
    ] {
        assert!(metrics.contains(&series), "{series} in:\n{metrics}");
    }
    // The kept copy is still the good version, not the broken one.
    let copy = own.get(&kept).await.unwrap();
    assert!(
        copy.data.unwrap_or_default()["gadgets.rhai"].contains("apply("),
        "the kept copy is the version that loaded"
    );
    // Fixed: the new version loads and is kept in turn.
    let fixed = json!({"data": {"gadgets.rhai": gadgets_policy(c, "nosy")[1].1.replace("runbook", "runbook-2")}});
    cms_b
        .patch("nosy", &PatchParams::default(), &Patch::Merge(&fixed))
        .await
        .unwrap();
    eventually("the fixed version kept", 30, || async {
        own.get(&kept)
            .await
            .is_ok_and(|cm| cm.data.unwrap_or_default()["gadgets.rhai"].contains("runbook-2"))
    })
    .await;
    // Deleted: its kept copy goes too.
    cms_b.delete("nosy", &Default::default()).await.unwrap();
    eventually("the kept copy removed with its bundle", 30, || async {
        own.get_opt(&kept).await.is_ok_and(|cm| cm.is_none())
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    s.c.cleanup().await;
}

/// A team's sweep over Pods sees and deletes only its own namespace's:
/// the other team's bare Pod is not among its targets, and naming it
/// outright is refused. Its record is in the team's namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_sweep_reaches_only_its_own_namespace() {
    let s = Shared::new("tenantsweep").await;
    let (c, a, b) = (&s.c, s.a.clone(), s.b.clone());
    let policy = format!(
        "apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {{name: tidy}}
spec:
  target: {{apiVersion: v1, kind: Pod}}
  sweep: true
  schedule: {{every: 1s}}
  deletes: [{{apiVersion: v1, kind: Pod}}]
  params: {{other: {b}}}
  script: tidy.rhai
"
    );
    // Every bare Pod it lists, and the other team's by name.
    let script = "fn reconcile(ctx) {
    if !ctx.due { return []; }
    let bare = ctx.targets.filter(|p| p.metadata.ownerReferences == ());
    let out = bare.map(|p| delete(p));
    out.push(delete(#{apiVersion: \"v1\", kind: \"Pod\", metadata: #{name: \"debug\", namespace: ctx.params.other}}));
    out.push(status(#{found: bare.len()}));
    out
}
";
    let files = [
        ("tidy.yaml".to_string(), policy),
        ("tidy.rhai".to_string(), script.to_string()),
    ];
    s.sanction(&a, "tidy", &files).await;
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "debug"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}
    }))
    .unwrap();
    for ns in [&a, &b] {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), ns);
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let (op, _reloader, errors) = s.operator().await;
    assert!(errors.is_empty(), "{errors:?}");
    let pods_a: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), &a);
    let pods_b: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), &b);
    eventually("team a's bare Pod deleted", 30, || async {
        pods_a.get_opt("debug").await.unwrap().is_none()
    })
    .await;
    let state_kind = runbook_core::kinds::KindRef::new("runbook.dev/v1alpha1", "RunbookState");
    let states: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &a, &state_kind.api_resource());
    // A later run finds none left in team a: team b's was never listed,
    // and its delete by name was refused each time.
    eventually("a run that finds nothing left", 30, || async {
        let state = states.get_opt("sweep.runbook.dev.tidy").await.unwrap();
        state.is_some_and(|s| {
            let last = &s.data["status"]["decisions"][0];
            s.data["status"]["fields"]["found"] == 0
                && last["actions"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x["result"] == "refused"))
        })
    })
    .await;
    assert!(pods_b.get_opt("debug").await.unwrap().is_some());
    op.shutdown(Duration::from_secs(5)).await;
    s.c.cleanup().await;
}
