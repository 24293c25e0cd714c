//! Helpers every script and expression can call: readiness of common kinds,
//! Job outcomes, termination messages, JSON, durations, revisions, hashes.
//! They read JSON directly, so a cached object is never copied for them.

use rhai::{Dynamic, Engine, EvalAltResult, INT, Map, NativeCallContext};
use serde_json::Value;

use super::convert::{to_dynamic, to_json, with_json};

type RhaiResult<T> = Result<T, Box<EvalAltResult>>;

/// Follow a path of keys (cheaper than `Value::pointer`, which allocates).
fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn int(v: &Value, path: &[&str]) -> Option<i64> {
    let x = at(v, path)?;
    x.as_i64().or_else(|| x.as_f64().map(|f| f as i64))
}

fn conditions(v: &Value) -> impl Iterator<Item = &Value> {
    at(v, &["status", "conditions"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// Whether a condition of this type has this status.
pub fn condition_is(v: &Value, type_: &str, status: &str) -> bool {
    conditions(v).any(|c| c["type"] == type_ && c["status"] == status)
}

pub fn job_failed(job: &Value) -> bool {
    condition_is(job, "Failed", "True") || condition_is(job, "FailureTarget", "True")
}

pub fn job_succeeded(job: &Value) -> bool {
    if condition_is(job, "Complete", "True") || condition_is(job, "SuccessCriteriaMet", "True") {
        return true;
    }
    let completions = int(job, &["spec", "completions"]).unwrap_or(1).max(1);
    int(job, &["status", "succeeded"]).unwrap_or(0) >= completions && !job_failed(job)
}

/// Readiness by kind: Pods by their Ready condition, Deployments and
/// StatefulSets by available/ready replicas at the current generation, Jobs
/// by completion, VolumeSnapshots by readyToUse, PVCs by Bound, anything
/// else by a Ready condition.
pub fn is_ready(obj: &Value) -> bool {
    if !obj.is_object() {
        return false;
    }
    let generation_seen = || {
        int(obj, &["status", "observedGeneration"]).unwrap_or(0)
            >= int(obj, &["metadata", "generation"]).unwrap_or(0)
    };
    let want = || int(obj, &["spec", "replicas"]).unwrap_or(1);
    match obj["kind"].as_str().unwrap_or("") {
        "Pod" => condition_is(obj, "Ready", "True"),
        "Deployment" => {
            generation_seen()
                && int(obj, &["status", "updatedReplicas"]).unwrap_or(0) >= want()
                && int(obj, &["status", "availableReplicas"]).unwrap_or(0) >= want()
        }
        "StatefulSet" | "ReplicaSet" => {
            generation_seen() && int(obj, &["status", "readyReplicas"]).unwrap_or(0) >= want()
        }
        "Job" => job_succeeded(obj),
        "VolumeSnapshot" => at(obj, &["status", "readyToUse"])
            .and_then(Value::as_bool)
            .unwrap_or(false),
        "PersistentVolumeClaim" => {
            at(obj, &["status", "phase"]).and_then(Value::as_str) == Some("Bound")
        }
        _ => condition_is(obj, "Ready", "True"),
    }
}

/// The first non-empty termination message of a pod's containers.
pub fn termination_message(pod: &Value) -> Option<String> {
    let statuses = at(pod, &["status", "containerStatuses"]).and_then(Value::as_array)?;
    for state in ["state", "lastState"] {
        for cs in statuses {
            if let Some(msg) = at(cs, &[state, "terminated", "message"]).and_then(Value::as_str)
                && !msg.trim().is_empty()
            {
                return Some(msg.to_string());
            }
        }
    }
    None
}

/// A pod template without the `pod-template-hash` label the Deployment
/// controller adds: templates compare equal as the Deployment wrote them.
pub fn without_hash(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(labels) = t
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove("pod-template-hash");
    }
    t
}

pub fn revision_of(obj: &Value) -> Option<i64> {
    at(
        obj,
        &[
            "metadata",
            "annotations",
            "deployment.kubernetes.io/revision",
        ],
    )
    .and_then(Value::as_str)
    .and_then(|r| r.parse().ok())
}

fn runtime<T>(ctx: &NativeCallContext, message: String) -> RhaiResult<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(
        message.into(),
        ctx.call_position(),
    )))
}

/// Apply `f` to the JSON of an object argument; `()` gives `default`.
fn on<R>(
    ctx: &NativeCallContext,
    d: &Dynamic,
    default: R,
    f: impl FnOnce(&Value) -> R,
) -> RhaiResult<R> {
    if d.is_unit() {
        return Ok(default);
    }
    match with_json(d, f) {
        Ok(r) => Ok(r),
        Err(e) => runtime(ctx, format!("{}: {e}", ctx.fn_name())),
    }
}

/// Register the helpers.
pub fn register(engine: &mut Engine) {
    register_readiness(engine);
    register_values(engine);
}

/// What objects say of themselves: readiness, Jobs, conditions, termination messages, revisions.
fn register_readiness(engine: &mut Engine) {
    engine.register_fn("is_ready", |c: NativeCallContext, obj: Dynamic| {
        on(&c, &obj, false, is_ready)
    });
    engine.register_fn("job_succeeded", |c: NativeCallContext, obj: Dynamic| {
        on(&c, &obj, false, job_succeeded)
    });
    engine.register_fn("job_failed", |c: NativeCallContext, obj: Dynamic| {
        on(&c, &obj, false, job_failed)
    });
    // The status in the forms `condition(...)` takes: a bool or a string.
    engine.register_fn(
        "condition_is",
        |c: NativeCallContext, obj: Dynamic, t: &str, s: Dynamic| -> RhaiResult<bool> {
            let status = super::action::ConditionStatus::of_script(&s).map_err(|e| {
                Box::new(rhai::EvalAltResult::ErrorRuntime(
                    format!("condition_is: {e}").into(),
                    c.call_position(),
                ))
            })?;
            on(&c, &obj, false, |v| condition_is(v, t, status.as_str()))
        },
    );
    engine.register_fn(
        "all_ready",
        |c: NativeCallContext, objs: rhai::Array| -> RhaiResult<bool> {
            if objs.is_empty() {
                return Ok(false);
            }
            for o in &objs {
                if !on(&c, o, false, is_ready)? {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    );
    engine.register_fn(
        "termination_message",
        |c: NativeCallContext, pod: Dynamic| -> RhaiResult<Dynamic> {
            Ok(on(&c, &pod, None, termination_message)?
                .map(Dynamic::from)
                .unwrap_or(Dynamic::UNIT))
        },
    );
    engine.register_fn(
        "revision_of",
        |c: NativeCallContext, obj: Dynamic| -> RhaiResult<Dynamic> {
            Ok(on(&c, &obj, None, revision_of)?
                .map(Dynamic::from_int)
                .unwrap_or(Dynamic::UNIT))
        },
    );
}

/// Values: JSON, durations, hashes, times, label matching.
fn register_values(engine: &mut Engine) {
    engine.register_fn(
        "parse_json",
        |ctx: NativeCallContext, text: &str| -> RhaiResult<Dynamic> {
            match serde_json::from_str::<Value>(text) {
                Ok(v) => Ok(to_dynamic(&v)),
                Err(e) => runtime(
                    &ctx,
                    format!("parse_json: not JSON ({e}): {:?}", truncate(text, 80)),
                ),
            }
        },
    );
    engine.register_fn(
        "to_json",
        |ctx: NativeCallContext, v: Dynamic| -> RhaiResult<String> {
            match to_json(&v, "value") {
                Ok(j) => Ok(j.to_string()),
                Err(e) => runtime(&ctx, format!("to_json: {e}")),
            }
        },
    );
    engine.register_fn(
        "duration",
        |ctx: NativeCallContext, text: &str| -> RhaiResult<INT> {
            match crate::util::time::parse_duration_ms(text) {
                Ok(ms) => Ok(ms / 1000),
                Err(e) => runtime(&ctx, e),
            }
        },
    );
    engine.register_fn(
        "hash",
        |ctx: NativeCallContext, v: Dynamic| -> RhaiResult<String> {
            match to_json(&v, "value") {
                Ok(j) => Ok(crate::util::hash::json_hash(&j, 10)),
                Err(e) => runtime(&ctx, format!("hash: {e}")),
            }
        },
    );
    engine.register_fn("child_name", |prefix: &str, suffix: &str| {
        crate::names::child_name(prefix, suffix)
    });
    engine.register_fn("child_name", |prefix: &str, suffix: INT| {
        crate::names::child_name(prefix, &suffix.to_string())
    });
    engine.register_fn("short_name", |text: &str| crate::names::short_name(text));
    engine.register_fn("format_time", |secs: INT| {
        crate::util::time::format_secs(secs)
    });
    engine.register_fn("parse_time", |text: &str| -> Dynamic {
        crate::util::time::parse(text)
            .map(|t| Dynamic::from_int(t.as_second()))
            .unwrap_or(Dynamic::UNIT)
    });
    engine.register_fn("parse_time", |_: ()| Dynamic::UNIT);
    engine.register_fn(
        "labels_match",
        |c: NativeCallContext, obj: Dynamic, selector: Map| {
            on(&c, &obj, false, |v| {
                selector.iter().all(|(k, want)| {
                    at(v, &["metadata", "labels", k.as_str()]).and_then(Value::as_str)
                        == Some(want.to_string().as_str())
                })
            })
        },
    );
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let cut: String = text.chars().take(max).collect();
        format!("{cut}...")
    }
}

#[cfg(test)]
mod condition_tests {
    use crate::script::ScriptEngine;
    use crate::script::obj::view;
    use serde_json::json;
    use std::sync::Arc;

    /// `condition_is` takes the status as `condition` does: a bool or the
    /// API's string; anything else is an error naming the forms.
    #[test]
    fn condition_is_takes_the_forms_condition_takes() {
        let engine = ScriptEngine::default();
        let job = view(Arc::new(json!({"status": {"conditions": [
            {"type": "Complete", "status": "True"}, {"type": "Failed", "status": "False"}]}})));
        let run = |body: &str| {
            let script = engine
                .compile("t.rhai", &format!("fn f(j) {{ {body} }}"))
                .expect("compiles");
            engine
                .call(&script, "f", (job.clone(),))
                .map_err(|e| e.to_string())
        };
        for (body, want) in [
            (r#"condition_is(j, "Complete", true)"#, true),
            (r#"condition_is(j, "Complete", "True")"#, true),
            (r#"condition_is(j, "Failed", false)"#, true),
            (r#"condition_is(j, "Failed", true)"#, false),
        ] {
            assert_eq!(run(body).unwrap().as_bool().unwrap(), want, "{body}");
        }
        let err = run(r#"condition_is(j, "Complete", "yes")"#).unwrap_err();
        assert!(err.contains("true, false, \"True\""), "{err}");
    }
}
