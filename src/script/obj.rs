//! `Obj`: a read-only view of a cached object, or of a map inside one.
//!
//! Scripts read objects far more than they change them, and Rhai copies a
//! map every time it is assigned or passed. An `Obj` shares the cached JSON
//! instead: reading `ev.spec.threshold` walks the JSON and copies only the
//! number. Arrays come out as ordinary Rhai arrays (of `Obj`s and scalars),
//! so `for`, `filter`, `push` and the rest work. Writing to an `Obj` is an
//! error that says to take a copy with `to_map(x)`; that keeps a script from
//! changing the cache every other reconcile reads.

use std::sync::Arc;

use rhai::{Array, Dynamic, Engine, EvalAltResult, INT, ImmutableString, NativeCallContext};
use serde_json::Value;

/// One step from an object to a value inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(ImmutableString),
    Index(usize),
}

/// A read-only view of a JSON object.
#[derive(Clone, Debug)]
pub struct Obj {
    root: Arc<Value>,
    path: Vec<Seg>,
}

impl Obj {
    /// A view of a whole value.
    pub fn new(root: Arc<Value>) -> Self {
        Self {
            root,
            path: Vec::new(),
        }
    }

    /// The JSON this view shows.
    pub fn value(&self) -> &Value {
        let mut v: &Value = &self.root;
        for seg in &self.path {
            v = match seg {
                Seg::Key(k) => v.get(k.as_str()).unwrap_or(&Value::Null),
                Seg::Index(i) => v.get(*i).unwrap_or(&Value::Null),
            };
        }
        v
    }

    fn child(&self, seg: Seg) -> Self {
        let mut path = Vec::with_capacity(self.path.len() + 1);
        path.extend_from_slice(&self.path);
        path.push(seg);
        Self {
            root: self.root.clone(),
            path,
        }
    }

    /// The value under `key`, as a Rhai value; `()` when absent.
    pub fn get(&self, key: &str) -> Dynamic {
        match self.value().get(key) {
            None => Dynamic::UNIT,
            Some(v) => wrap(v, &|| self.child(Seg::Key(key.into()))),
        }
    }

    /// A script's read of `key`: an error at the read when the field is
    /// absent (or null) and the script did not mark the read as one that
    /// may find nothing (see `strict`).
    fn read(&self, ctx: &NativeCallContext, key: &str) -> Result<Dynamic, Box<EvalAltResult>> {
        let pos = ctx.call_position();
        match self.value().get(key) {
            Some(v) if !v.is_null() => Ok(wrap(v, &|| self.child(Seg::Key(key.into())))),
            _ if super::strict::may_be_absent(pos) => Ok(Dynamic::UNIT),
            _ => Err(Box::new(EvalAltResult::ErrorRuntime(
                self.absent(key).into(),
                pos,
            ))),
        }
    }

    /// Where this view is, as `.spec.containers[0]`, or `the object`.
    fn place(&self) -> String {
        if self.path.is_empty() {
            return "the object".to_string();
        }
        let mut out = String::new();
        for seg in &self.path {
            match seg {
                Seg::Key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Seg::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }

    /// Why reading `key` failed, with the nearest field name there is.
    fn absent(&self, key: &str) -> String {
        let here = self.place();
        let fields: Vec<&str> = self
            .value()
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, _)| k.as_str())
                    .collect()
            })
            .unwrap_or_default();
        let hint = crate::util::suggest::closest(key, fields.iter().copied())
            .map(|k| format!(" (did you mean `{k}`?)"))
            .unwrap_or_default();
        format!(
            "{here} has no field `{key}`{hint}; if it may be absent, read it as `?.{key}`, \
             give a default with `?? value`, or ask first with `\"{key}\" in ...`"
        )
    }
}

/// Turn a JSON value into a Rhai value, sharing maps as `Obj` views made by
/// `view` and arrays as arrays of shared elements.
fn wrap(v: &Value, view: &dyn Fn() -> Obj) -> Dynamic {
    match v {
        Value::Object(_) => Dynamic::from(view()),
        Value::Array(items) => {
            let base = view();
            let arr: Array = items
                .iter()
                .enumerate()
                .map(|(i, item)| wrap(item, &|| base.child(Seg::Index(i))))
                .collect();
            Dynamic::from_array(arr)
        }
        scalar => self::scalar(scalar),
    }
}

/// A JSON scalar as a Rhai value: null is `()`, integers stay integers
/// (maps and arrays are the caller's to convert; they give `()` here).
pub fn scalar(v: &Value) -> Dynamic {
    match v {
        Value::Bool(b) => Dynamic::from_bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Dynamic::from_int(i),
            None => Dynamic::from_float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Dynamic::from(ImmutableString::from(s.as_str())),
        Value::Null | Value::Object(_) | Value::Array(_) => Dynamic::UNIT,
    }
}

/// A cached object as a script sees it: a read-only view, no copy.
pub fn of(object: &crate::observe::CachedObject) -> Dynamic {
    view(object.shared())
}

/// Wrap a whole object.
pub fn view(root: Arc<Value>) -> Dynamic {
    let v = root.clone();
    wrap(&v, &|| Obj::new(root.clone()))
}

/// Field names common across Kubernetes objects and Runbook's kinds.
const COMMON_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "status",
    "name",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "generation",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "finalizers",
    "ownerReferences",
    "controller",
    "conditions",
    "type",
    "reason",
    "message",
    "lastTransitionTime",
    "observedGeneration",
    "phase",
    "replicas",
    "readyReplicas",
    "availableReplicas",
    "updatedReplicas",
    "selector",
    "matchLabels",
    "template",
    "containers",
    "initContainers",
    "containerStatuses",
    "initContainerStatuses",
    "image",
    "command",
    "args",
    "env",
    "value",
    "ports",
    "volumes",
    "volumeMounts",
    "state",
    "lastState",
    "terminated",
    "waiting",
    "running",
    "exitCode",
    "restartCount",
    "ready",
    "active",
    "succeeded",
    "failed",
    "startTime",
    "completionTime",
    "readyToUse",
    "error",
    "source",
    "data",
    "items",
    "time",
    "score",
    "revision",
    "targetRef",
    "benchmark",
    "threshold",
    "schedule",
    "alert",
    "historyLimit",
    "suspend",
    "activeDeadlineSeconds",
    "lastRunTime",
    "nextRunTime",
    "currentRun",
    "lastScore",
    "scoreHistory",
    "lastGoodRevision",
    "lastRollback",
    "fromRevision",
    "toRevision",
    "lastError",
    "decisions",
    "database",
    "statefulSet",
    "podSelector",
    "dump",
    "pvc",
    "volumeSnapshotClassName",
    "destination",
    "retention",
    "modelUri",
    "servingImage",
    "downloaderImage",
    "gpusPerReplica",
    "weights",
    "size",
    "storageClassName",
    "port",
    "team",
    "severity",
];

const READ_ONLY: &str = "objects from ctx are read-only; take a copy you can change with to_map(x)";

/// Register `Obj` with the engine.
pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<Obj>("object");
    engine.register_indexer_get(|ctx: NativeCallContext, o: &mut Obj, key: &str| o.read(&ctx, key));
    // Property access on a custom type tries a getter first and falls back
    // to the indexer only after building an error; naming the common
    // Kubernetes fields skips that detour for most reads.
    for name in COMMON_FIELDS {
        engine.register_get(name, move |ctx: NativeCallContext, o: &mut Obj| {
            o.read(&ctx, name)
        });
    }
    engine.register_indexer_set(
        |ctx: NativeCallContext,
         _: &mut Obj,
         key: &str,
         _: Dynamic|
         -> Result<(), Box<EvalAltResult>> {
            Err(Box::new(EvalAltResult::ErrorRuntime(
                format!("cannot set {key:?}: {READ_ONLY}").into(),
                ctx.call_position(),
            )))
        },
    );
    engine.register_fn("contains", |o: &mut Obj, key: &str| {
        o.value().get(key).is_some_and(|v| !v.is_null())
    });
    engine.register_fn("keys", |o: &mut Obj| -> Array {
        o.value()
            .as_object()
            .map(|m| {
                m.keys()
                    .map(|k| Dynamic::from(ImmutableString::from(k.as_str())))
                    .collect()
            })
            .unwrap_or_default()
    });
    engine.register_fn("values", |o: &mut Obj| -> Array {
        let keys: Vec<String> = o
            .value()
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        keys.iter().map(|k| o.get(k)).collect()
    });
    engine.register_fn("len", |o: &mut Obj| {
        o.value().as_object().map_or(0, |m| m.len()) as INT
    });
    engine.register_fn("is_empty", |o: &mut Obj| {
        o.value().as_object().is_none_or(|m| m.is_empty())
    });
    engine.register_fn("to_string", |o: &mut Obj| o.value().to_string());
    engine.register_fn("to_debug", |o: &mut Obj| o.value().to_string());
    engine.register_fn("==", |a: &mut Obj, b: Obj| a.value() == b.value());
    engine.register_fn("!=", |a: &mut Obj, b: Obj| a.value() != b.value());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn views_share_the_json_and_read_nested_values() {
        let root = Arc::new(json!({"spec": {"n": 3, "xs": [{"a": 1}, 2], "s": "x"}}));
        let d = view(root.clone());
        let o = d.read_lock::<Obj>().unwrap().clone();
        let spec = o.get("spec").cast::<Obj>();
        assert_eq!(spec.get("n").as_int().unwrap(), 3);
        let xs = spec.get("xs").cast::<Array>();
        assert_eq!(xs[0].clone().cast::<Obj>().get("a").as_int().unwrap(), 1);
        assert_eq!(xs[1].as_int().unwrap(), 2);
        assert!(spec.get("missing").is_unit());
        assert!(
            Arc::strong_count(&root) >= 3,
            "views share, never copy, the root"
        );
    }
}
