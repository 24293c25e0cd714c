//! Properties that must hold for any input: whatever objects a script
//! hands over and whatever an API server answers, nothing panics, and a
//! malformed object is refused with a reason rather than written.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use proptest::prelude::*;
use runbook_core::observe::RawObject;
use runbook_core::plan::prepare_child;
use runbook_core::script::action::shape_problem;
use serde_json::{Map, Value, json};

/// Any JSON value, a few levels deep, with keys that include the ones the
/// executor looks at.
fn any_json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("metadata".to_string()),
        Just("name".to_string()),
        Just("labels".to_string()),
        Just("annotations".to_string()),
        Just("namespace".to_string()),
        Just("ownerReferences".to_string()),
        Just("apiVersion".to_string()),
        Just("kind".to_string()),
        Just("uid".to_string()),
        "[a-zA-Z./-]{0,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-z0-9./-]{0,20}".prop_map(Value::String),
        ".{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An object that looks like what a script applies, with any part of it
/// possibly of the wrong shape.
fn script_object() -> impl Strategy<Value = Value> {
    (any_json(), any_json(), any_json(), any_json(), any_json()).prop_map(
        |(name, labels, annotations, spec, owners)| {
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": labels, "annotations": annotations,
                             "ownerReferences": owners},
                "data": spec,
            })
        },
    )
}

fn target() -> Value {
    json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
           "metadata": {"name": "chatbot", "namespace": "ml", "uid": "u-1"}})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The executor never panics on an object, whatever its shape.
    #[test]
    fn preparing_any_object_never_panics(obj in prop_oneof![any_json(), script_object()]) {
        let child = prepare_child(&obj, &target(), true, "p");
        prop_assert!(child["metadata"]["labels"]["app.kubernetes.io/managed-by"].is_string());
        prop_assert!(child["metadata"]["annotations"]["runbook.dev/applied-hash"].is_string());
    }

    /// An object is either refused with a reason, or well formed enough to
    /// write: a valid name, and labels and annotations maps of strings.
    #[test]
    fn an_object_is_refused_with_a_reason_or_well_formed(obj in script_object()) {
        match shape_problem(&obj) {
            Some(reason) => prop_assert!(!reason.is_empty()),
            None => {
                let meta = &obj["metadata"];
                prop_assert!(meta["name"].as_str().is_some_and(runbook_core::names::is_dns_subdomain));
                for field in ["labels", "annotations"] {
                    let v = &meta[field];
                    prop_assert!(
                        v.is_null() || v.as_object().is_some_and(|m| m.values().all(Value::is_string))
                    );
                }
            }
        }
    }

    /// Any API answer decodes into a cached object (usable or marked
    /// undecodable) without a panic, and takes the kind of its watch.
    #[test]
    fn any_api_answer_is_cached_without_a_panic(answer in any_json()) {
        let mut o: RawObject = serde_json::from_value(answer).unwrap_or_else(|_| RawObject::from_value(Value::Null));
        o.stamp(&kube::core::ApiResource {
            group: "apps".into(), version: "v1".into(), api_version: "apps/v1".into(),
            kind: "StatefulSet".into(), plural: "statefulsets".into(),
        });
        let v = o.value();
        prop_assert!(o.undecodable.is_some() || v["metadata"]["name"].is_string());
    }
}

/// A script that turns whatever its target's spec says into actions: the
/// property test's random action values, as a user's script might build
/// them with every mistake of type and shape.
const ACTOR: &str = r#"
fn reconcile(ctx) {
    let out = [];
    for a in ctx.resource.spec.actions {
        let v = a.verb;
        if v == "apply" { out.push(apply(a.arg)); }
        else if v == "patch" { out.push(patch(a.kind, a.name, a.arg)); }
        else if v == "delete" { out.push(delete(a.kind, a.name)); }
        else if v == "status" { out.push(status(a.arg)); }
        else if v == "condition" { out.push(condition(a.name, a.arg, "Because", "said so")); }
        else if v == "event" { out.push(event(a.name, "Because", "said so")); }
        else if v == "rollback" { out.push(rollback(a.name)); }
        else if v == "alert" { out.push(alert(a.arg)); }
        else if v == "requeue" { out.push(requeue(a.arg)); }
    }
    out
}
"#;

const ACTOR_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: actor}
spec:
  target: {apiVersion: fuzz.example.com/v1, kind: Actor}
  owns: [{apiVersion: v1, kind: ConfigMap}]
  mutates: [{apiVersion: apps/v1, kind: Deployment}]
  script: actor.rhai
  limits: {delete: 2/1h}
"#;

/// An argument a script means well with, for `verb`.
fn good_arg(verb: &'static str) -> BoxedStrategy<Value> {
    let name = prop_oneof![Just("a"), Just("b"), Just("c"), Just("t-1")];
    match verb {
        "apply" => (name, "[a-z]{0,3}")
            .prop_map(|(n, x)| {
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}, "data": {"x": x}})
            })
            .boxed(),
        "patch" => "[a-z]{0,3}"
            .prop_map(|x| json!({"data": {"x": x}}))
            .boxed(),
        "status" => "[A-Za-z]{0,6}"
            .prop_map(|p| json!({"phase": p}))
            .boxed(),
        "condition" => prop_oneof![Just(json!(true)), Just(json!("Unknown"))].boxed(),
        "alert" => Just(json!({"labels": {"severity": "critical"}})).boxed(),
        "requeue" => Just(json!("5m")).boxed(),
        _ => Just(Value::Null).boxed(),
    }
}

/// One action value a script hands over: a verb, and arguments of any
/// shape (mostly the right one).
fn action_value() -> impl Strategy<Value = Value> {
    let verb = prop_oneof![
        Just("apply"),
        Just("patch"),
        Just("delete"),
        Just("status"),
        Just("condition"),
        Just("event"),
        Just("rollback"),
        Just("alert"),
        Just("requeue"),
    ];
    let name = prop_oneof![
        3 => prop_oneof![Just(json!("a")), Just(json!("b")), Just(json!("web")), Just(json!("Warning")), Just(json!("Ready"))],
        1 => any_json(),
    ];
    let kind = prop_oneof![
        3 => prop_oneof![Just(json!("ConfigMap")), Just(json!("v1/ConfigMap")), Just(json!("Deployment"))],
        1 => prop_oneof![Just(json!("Secret")), any_json()],
    ];
    verb.prop_flat_map(move |verb| {
        let arg = prop_oneof![3 => good_arg(verb), 1 => script_object(), 1 => any_json()];
        (
            Just(verb),
            name.clone(),
            kind.clone(),
            arg,
            prop::bool::weighted(0.9),
        )
    })
    .prop_map(|(verb, name, kind, arg, with_kind)| {
        let mut a = json!({"verb": verb, "name": name, "arg": arg});
        if with_kind {
            a["kind"] = kind;
        }
        a
    })
}

/// What the API server may answer a write with, besides success.
fn api_answer() -> impl Strategy<Value = (Option<runbook_sandbox::faults::ApiVerb>, u16)> {
    use runbook_sandbox::faults::ApiVerb;
    let verb = prop_oneof![
        Just(None),
        Just(Some(ApiVerb::Patch)),
        Just(Some(ApiVerb::Delete)),
        Just(Some(ApiVerb::Get)),
        Just(Some(ApiVerb::List)),
        Just(Some(ApiVerb::Create)),
    ];
    let code = prop_oneof![
        Just(404u16),
        Just(409),
        Just(422),
        Just(403),
        Just(500),
        Just(503)
    ];
    (verb, code)
}

/// The sandbox for one case: the Actor kind, and the objects the cache
/// also shows (ConfigMaps `a` and `b`, the Deployment `web`).
async fn world(live: &[Value]) -> runbook_sandbox::Sandbox {
    use kube::api::{DynamicObject, PostParams};
    let sandbox = runbook_sandbox::Sandbox::new(Default::default());
    let client = sandbox.client();
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "actors.fuzz.example.com"},
        "spec": {"group": "fuzz.example.com", "scope": "Namespaced",
                 "names": {"kind": "Actor", "plural": "actors"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    let crds: kube::Api<DynamicObject> = kube::Api::all_with(
        client.clone(),
        &kube::core::ApiResource::erase::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(&()),
    );
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": "ns"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    for v in live {
        let kind = runbook_core::kinds::KindRef::new(
            v["apiVersion"].as_str().unwrap(),
            v["kind"].as_str().unwrap(),
        );
        let api: kube::Api<DynamicObject> =
            kube::Api::namespaced_with(client.clone(), "ns", &kind.api_resource());
        let _ = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(v.clone()).unwrap(),
            )
            .await;
    }
    sandbox
}

fn live_objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"}, "data": {"x": "1"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b", "namespace": "ns"}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "ns",
                            "annotations": {"deployment.kubernetes.io/revision": "2"}},
               "spec": {"selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Whatever action values a script hands over, whatever the caches
    /// show and whatever the API server answers: decide either decides or
    /// fails at a place in the script, and planning and writing carry the
    /// decision out or fail it with one readable line, never a panic.
    #[test]
    fn any_decision_goes_through_decide_plan_and_write_without_a_panic(
        actions in prop::collection::vec(action_value(), 0..6),
        cached in prop::collection::vec(script_object(), 0..3),
        answers in prop::collection::vec(api_answer(), 0..3),
    ) {
        use runbook_core::plan::Acting;
        use runbook_operator::act::{self, Exec, Writer};
        use runbook_core::decide::{self, Observed};
        use runbook_core::observe::{CachedObject, MemoryView};
        use std::sync::Arc;

        let engine = runbook_core::script::ScriptEngine::default();
        let bundle = runbook_core::policy::Bundle::new(
            runbook_core::policy::Origin::Inline("props".into()),
            [("actor.yaml", ACTOR_POLICY), ("actor.rhai", ACTOR)]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let (set, errors) = runbook_core::policy::load(&engine, &[bundle]);
        prop_assert!(errors.is_empty(), "{errors:?}");
        let policy = set.policies["actor"].clone();
        let target = CachedObject::new(json!({
            "apiVersion": "fuzz.example.com/v1", "kind": "Actor",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u-1", "generation": 1, "resourceVersion": "1"},
            "spec": {"actions": actions},
        }));
        let view = Arc::new(MemoryView::new());
        for o in live_objects().into_iter().chain(cached) {
            let mut o = o;
            if o["metadata"].is_object() {
                o["metadata"]["namespace"] = json!("ns");
            }
            view.insert(o);
        }
        let now = "2026-11-29T10:00:00Z".parse().unwrap();
        let observed = Observed { target: target.clone(), view: view.clone(), now, readings: Default::default() };
        let decision = decide::decide(&engine, &policy, &observed);
        if let Err(e) = &decision {
            let m = e.to_string();
            let place = regex::Regex::new(r"^props/actor\.rhai:\d+:\d+: ").unwrap();
            prop_assert!(place.is_match(&m), "a script error names its place: {m}");
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let outcome = rt.block_on(async {
            let sandbox = world(&live_objects()).await;
            let mut target_obj = target.value().clone();
            target_obj["metadata"].as_object_mut().unwrap().remove("uid");
            target_obj["metadata"].as_object_mut().unwrap().remove("resourceVersion");
            let actors: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
                sandbox.client(),
                "ns",
                &runbook_core::kinds::KindRef::new("fuzz.example.com/v1", "Actor").api_resource(),
            );
            actors
                .create(&Default::default(), &serde_json::from_value(target_obj).unwrap())
                .await
                .unwrap();
            for (verb, code) in &answers {
                sandbox.faults().fail_next(1, *verb, None, *code);
            }
            let client = sandbox.client();
            let resources = runbook_operator::observe::discovery::Resources::new(client.clone());
            let kind = resources
                .resolve(&runbook_core::kinds::KindRef::new("fuzz.example.com/v1", "Actor"))
                .await
                .unwrap();
            let applied = runbook_core::plan::Applied::default();
            let sink = runbook_core::alert::LogSink::default();
            let authority = act::authorize::Authority::new(client.clone(), None);
            let exec = Exec {
                writer: Writer { client: &client, recorder: None, journal: None, applied: Some(&applied), now, manager: "runbook/p" },
                resources: &resources,
                view: view.as_ref(),
                alerts: &sink,
                authority: &authority,
                reads: &[],
                state: None,
                state_at: None,
                dropped: &[],
                gone: false,
            };
            act::execute(&exec, &policy, None, &target, &kind, decision.as_ref(), Acting::Enforce).await
        });
        let steps = decision.as_ref().map(|d| d.actions.iter().filter(|p| !matches!(p.action, runbook_core::script::Action::Requeue { .. })).count()).unwrap_or(0);
        prop_assert_eq!(outcome.record.actions.len(), steps, "every action is recorded");
        if let Some(f) = &outcome.failure {
            let e = &f.message;
            prop_assert!(!e.contains('\n') && !e.contains("Status {"), "one line, no Debug dump: {e}");
        }
        for a in &outcome.record.actions {
            if a.result == runbook_core::crd::ActionResult::Failed || a.result == runbook_core::crd::ActionResult::Refused {
                prop_assert!(a.message.as_deref().is_some_and(|m| !m.is_empty()), "{a:?}");
            }
        }
    }
}
