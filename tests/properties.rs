//! Properties that must hold for any input: whatever objects a script
//! hands over and whatever an API server answers, nothing panics, and a
//! malformed object is refused with a reason rather than written.

use proptest::prelude::*;
use runbook::act::prepare_child;
use runbook::observe::RawObject;
use runbook::script::action::shape_problem;
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
        let child = prepare_child(&obj, &target(), true);
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
                prop_assert!(meta["name"].as_str().is_some_and(runbook::names::is_dns_subdomain));
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
