//! Helpers every script and expression can call: readiness of common kinds,
//! Job outcomes, termination messages, JSON, durations, revisions, hashes.

use rhai::{Array, Dynamic, Engine, EvalAltResult, INT, Map, NativeCallContext};

use super::convert::{to_dynamic, to_json};

type RhaiResult<T> = Result<T, Box<EvalAltResult>>;

/// Follow a path of map keys.
pub fn path(d: &Dynamic, keys: &[&str]) -> Option<Dynamic> {
    let mut cur = d.clone();
    for key in keys {
        let next = {
            let map = cur.read_lock::<Map>()?;
            map.get(*key)?.clone()
        };
        cur = next;
    }
    if cur.is_unit() { None } else { Some(cur) }
}

fn path_str(d: &Dynamic, keys: &[&str]) -> Option<String> {
    path(d, keys).and_then(|v| v.into_string().ok())
}

fn path_int(d: &Dynamic, keys: &[&str]) -> Option<INT> {
    let v = path(d, keys)?;
    v.as_int().ok().or_else(|| v.as_float().ok().map(|f| f as INT))
}

fn conditions(d: &Dynamic) -> Vec<Dynamic> {
    path(d, &["status", "conditions"])
        .and_then(|c| c.try_cast::<Array>())
        .unwrap_or_default()
}

/// Whether a condition of this type has this status.
pub fn condition_is(d: &Dynamic, type_: &str, status: &str) -> bool {
    conditions(d).iter().any(|c| {
        path_str(c, &["type"]).as_deref() == Some(type_)
            && path_str(c, &["status"]).as_deref() == Some(status)
    })
}

pub fn job_succeeded(job: &Dynamic) -> bool {
    if condition_is(job, "Complete", "True") || condition_is(job, "SuccessCriteriaMet", "True") {
        return true;
    }
    let completions = path_int(job, &["spec", "completions"]).unwrap_or(1);
    path_int(job, &["status", "succeeded"]).unwrap_or(0) >= completions.max(1)
        && !job_failed(job)
}

pub fn job_failed(job: &Dynamic) -> bool {
    condition_is(job, "Failed", "True") || condition_is(job, "FailureTarget", "True")
}

/// Readiness by kind: Pods by their Ready condition, Deployments and
/// StatefulSets by available/ready replicas at the current generation, Jobs
/// by completion, VolumeSnapshots by readyToUse, anything else by a Ready
/// condition.
pub fn is_ready(obj: &Dynamic) -> bool {
    if obj.is_unit() {
        return false;
    }
    let kind = path_str(obj, &["kind"]).unwrap_or_default();
    let generation_seen = || {
        let generation = path_int(obj, &["metadata", "generation"]).unwrap_or(0);
        path_int(obj, &["status", "observedGeneration"]).unwrap_or(0) >= generation
    };
    match kind.as_str() {
        "Pod" => condition_is(obj, "Ready", "True"),
        "Deployment" => {
            let want = path_int(obj, &["spec", "replicas"]).unwrap_or(1);
            generation_seen()
                && path_int(obj, &["status", "updatedReplicas"]).unwrap_or(0) >= want
                && path_int(obj, &["status", "availableReplicas"]).unwrap_or(0) >= want
        }
        "StatefulSet" | "ReplicaSet" => {
            let want = path_int(obj, &["spec", "replicas"]).unwrap_or(1);
            generation_seen() && path_int(obj, &["status", "readyReplicas"]).unwrap_or(0) >= want
        }
        "Job" => job_succeeded(obj),
        "VolumeSnapshot" => path(obj, &["status", "readyToUse"])
            .and_then(|v| v.as_bool().ok())
            .unwrap_or(false),
        "PersistentVolumeClaim" => path_str(obj, &["status", "phase"]).as_deref() == Some("Bound"),
        _ => condition_is(obj, "Ready", "True"),
    }
}

/// The first non-empty termination message of a pod's containers.
pub fn termination_message(pod: &Dynamic) -> Option<String> {
    let statuses = path(pod, &["status", "containerStatuses"])?.try_cast::<Array>()?;
    for state in ["state", "lastState"] {
        for cs in &statuses {
            if let Some(msg) = path_str(cs, &[state, "terminated", "message"])
                && !msg.trim().is_empty()
            {
                return Some(msg);
            }
        }
    }
    None
}

fn runtime<T>(ctx: &NativeCallContext, message: String) -> RhaiResult<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(message.into(), ctx.call_position())))
}

/// Register the helpers.
pub fn register(engine: &mut Engine) {
    engine.register_fn("is_ready", |obj: Dynamic| is_ready(&obj));
    engine.register_fn("job_succeeded", |obj: Dynamic| job_succeeded(&obj));
    engine.register_fn("job_failed", |obj: Dynamic| job_failed(&obj));
    engine.register_fn("condition_is", |obj: Dynamic, t: &str, s: &str| condition_is(&obj, t, s));
    engine.register_fn("termination_message", |pod: Dynamic| -> Dynamic {
        termination_message(&pod).map(Dynamic::from).unwrap_or(Dynamic::UNIT)
    });
    engine.register_fn("parse_json", |ctx: NativeCallContext, text: &str| -> RhaiResult<Dynamic> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) => Ok(to_dynamic(&v)),
            Err(e) => runtime(&ctx, format!("parse_json: not JSON ({e}): {:?}", truncate(text, 80))),
        }
    });
    engine.register_fn("to_json", |ctx: NativeCallContext, v: Dynamic| -> RhaiResult<String> {
        match to_json(&v, "value") {
            Ok(j) => Ok(j.to_string()),
            Err(e) => runtime(&ctx, format!("to_json: {e}")),
        }
    });
    engine.register_fn("duration", |ctx: NativeCallContext, text: &str| -> RhaiResult<INT> {
        match crate::util::time::parse_duration_ms(text) {
            Ok(ms) => Ok(ms / 1000),
            Err(e) => runtime(&ctx, e),
        }
    });
    engine.register_fn("revision_of", |obj: Dynamic| -> Dynamic {
        path_str(&obj, &["metadata", "annotations", "deployment.kubernetes.io/revision"])
            .and_then(|r| r.parse::<INT>().ok())
            .map(Dynamic::from_int)
            .unwrap_or(Dynamic::UNIT)
    });
    engine.register_fn("hash", |ctx: NativeCallContext, v: Dynamic| -> RhaiResult<String> {
        match to_json(&v, "value") {
            Ok(j) => Ok(crate::util::hash::json_hash(&j, 10)),
            Err(e) => runtime(&ctx, format!("hash: {e}")),
        }
    });
    engine.register_fn("format_time", |secs: INT| crate::util::time::format_secs(secs));
    engine.register_fn("parse_time", |text: &str| -> Dynamic {
        crate::util::time::parse(text)
            .map(|t| Dynamic::from_int(t.as_second()))
            .unwrap_or(Dynamic::UNIT)
    });
    engine.register_fn("labels_match", |obj: Dynamic, selector: Map| -> bool {
        let labels = path(&obj, &["metadata", "labels"]);
        selector.iter().all(|(k, v)| {
            labels
                .as_ref()
                .and_then(|l| path_str(l, &[k.as_str()]))
                .is_some_and(|have| have == v.to_string())
        })
    });
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let cut: String = text.chars().take(max).collect();
        format!("{cut}...")
    }
}
