//! Actions: what a decision asks the executor to do. Scripts build them with
//! `apply(obj)`, `status(map)`, `rollback(name)` and friends; declarative
//! steps build the same values. Each remembers where in the script it was
//! made, so a refusal can point at the line.

use std::collections::BTreeMap;

use rhai::{Array, Dynamic, Engine, EvalAltResult, INT, NativeCallContext};
use serde_json::Value;

use super::convert::to_json;
use super::ctx::Ctx;
pub use crate::kinds::KindName;
use crate::kinds::{KindRef, Role};
use crate::util::yaml::Pos;

/// One thing a decision wants done.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Server-side apply a child object (ownerReference added by the executor).
    Apply { object: Value },
    /// Delete an object: in the target's namespace, or (`namespace`) a
    /// child in another namespace the policy may make children in.
    Delete {
        kind: KindName,
        name: String,
        namespace: Option<String>,
    },
    /// JSON merge patch a declared object: in the target's namespace, or
    /// (`namespace`, from the object patched) the one it names, which a
    /// sweep may and any other policy is refused.
    Patch {
        kind: KindName,
        name: String,
        patch: Value,
        namespace: Option<String>,
    },
    /// Merge fields into the target's status.
    Status {
        fields: serde_json::Map<String, Value>,
    },
    /// Set one standard condition on the target.
    Condition(Condition),
    /// `kubectl rollout undo` a Deployment, to a revision or the previous one.
    Rollback {
        deployment: String,
        revision: Option<i64>,
    },
    /// Raise an alert (routed by the policy's AlertRoutes).
    Alert {
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
    },
    /// Record a Kubernetes Event on the target.
    Event {
        type_: EventType,
        reason: String,
        message: String,
    },
    /// Reconcile again after this long.
    Requeue { after_ms: i64 },
}

impl Action {
    /// The verb, as decision records and metrics name it.
    pub fn verb(&self) -> &'static str {
        match self {
            Action::Apply { .. } => "apply",
            Action::Delete { .. } => "delete",
            Action::Patch { .. } => "patch",
            Action::Status { .. } => "status",
            Action::Condition { .. } => "condition",
            Action::Rollback { .. } => "rollback",
            Action::Alert { .. } => "alert",
            Action::Event { .. } => "event",
            Action::Requeue { .. } => "requeue",
        }
    }

    /// The verb of an action that writes to another object than the
    /// target: the ones limits count.
    pub fn limited_verb(&self) -> Option<Verb> {
        match self {
            Action::Apply { .. } => Some(Verb::Apply),
            Action::Delete { .. } => Some(Verb::Delete),
            Action::Patch { .. } => Some(Verb::Patch),
            Action::Rollback { .. } => Some(Verb::Rollback),
            _ => None,
        }
    }
}

/// The actions that write to objects other than the target, which rate
/// limits count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    Rollback,
    Delete,
    Patch,
    Apply,
}

impl Verb {
    /// Every limited verb, in the order records list them.
    pub const ALL: [Verb; 4] = [Verb::Rollback, Verb::Delete, Verb::Patch, Verb::Apply];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Rollback => "rollback",
            Verb::Delete => "delete",
            Verb::Patch => "patch",
            Verb::Apply => "apply",
        }
    }

    /// The verb an action or a script names, if it is a limited one.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == text)
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The status of a standard condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Self::True, Self::False, Self::Unknown]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

impl ConditionStatus {
    /// A status as scripts give one: `true`, `false`, or `"True"`,
    /// `"False"`, `"Unknown"`; the error says what is wanted.
    pub fn of_script(status: &Dynamic) -> Result<Self, String> {
        if let Ok(b) = status.as_bool() {
            return Ok(Self::from(b));
        }
        let s = status.to_string();
        Self::parse(&s).ok_or_else(|| {
            format!(
                "a condition status is true, false, \"True\", \"False\" or \"Unknown\", not {s:?}"
            )
        })
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

/// One standard condition (`type`, `status`, `reason`, `message`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub type_: String,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

/// The type of an Event: `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

/// An Event type as scripts and records write it.
pub fn event_type_str(t: &EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// An action as a Rhai value, with the place it was made.
#[derive(Clone, Debug)]
pub struct ActionValue {
    pub action: Action,
    pub pos: Option<Pos>,
}

type RhaiResult<T> = Result<T, Box<EvalAltResult>>;

fn here(ctx: &NativeCallContext) -> Option<Pos> {
    let p = ctx.call_position();
    Some(Pos {
        line: p.line()? as u32,
        col: p.position().unwrap_or(1) as u32,
    })
}

fn make(ctx: &NativeCallContext, action: Action) -> ActionValue {
    ActionValue {
        action,
        pos: here(ctx),
    }
}

fn fail<T>(ctx: &NativeCallContext, message: String) -> RhaiResult<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(
        message.into(),
        ctx.call_position(),
    )))
}

/// The JSON of a map or object argument; anything else is an error.
fn map_json(ctx: &NativeCallContext, what: &str, m: Dynamic) -> RhaiResult<Value> {
    match to_json(&m, what) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => fail(
            ctx,
            format!("{what}: expected a map, not a {}", m.type_name()),
        ),
        Err(e) => fail(ctx, e),
    }
}

/// An object to apply, checked: apiVersion, kind, a name, a sound shape.
fn applied(ctx: &NativeCallContext, what: &str, object: Value) -> RhaiResult<Action> {
    if KindName::of(&object).is_none_or(|k| k.api_version.is_none()) {
        return fail(ctx, format!("{what}: the object needs apiVersion and kind"));
    }
    if name_of(&object).is_none_or(|n| n.is_empty()) {
        return fail(
            ctx,
            format!("{what}: the object needs metadata.name (names must be deterministic)"),
        );
    }
    if let Some(problem) = shape_problem(&object) {
        return fail(ctx, format!("{what}: {problem}"));
    }
    Ok(Action::Apply { object })
}

/// `ctx.sync_children(want[, kinds])`: the complete set of children the
/// policy wants for its target. Each is applied, in the order given; then
/// each of the policy's own children of the kinds it owns (or of `kinds`)
/// that the set does not name is deleted, the highest name first (`web-10`
/// before `web-9`), so a numbered set shrinks from its end.
fn sync_children(
    call: &NativeCallContext,
    c: &Ctx,
    want: Array,
    kinds: Option<Array>,
) -> RhaiResult<Array> {
    let what = "ctx.sync_children";
    let declared = &c.0.kinds;
    let owned_kind = |name: &KindName| -> RhaiResult<KindRef> {
        match declared.resolve(name) {
            Ok(k) if declared.has(&k, Role::Owns) => Ok(k),
            Ok(k) => fail(
                call,
                format!("{what}: {k} is not a kind the policy owns (spec.owns)"),
            ),
            Err(e) => fail(call, format!("{what}: {e}")),
        }
    };
    let mut out = Array::with_capacity(want.len());
    // Each wanted child by kind, namespace and name.
    let mut wanted: Vec<(KindRef, String, String)> = Vec::with_capacity(want.len());
    for (i, item) in want.into_iter().enumerate() {
        let object = map_json(call, &format!("{what}: item {i}"), item)?;
        let action = applied(call, &format!("{what}: item {i}"), object)?;
        if let Action::Apply { object } = &action
            && let (Some(kind), Some(name)) = (KindName::of(object), name_of(object))
        {
            let ns = object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or(&c.0.namespace)
                .to_string();
            wanted.push((owned_kind(&kind)?, ns, name));
        }
        out.push(Dynamic::from(make(call, action)));
    }
    let pruned: Vec<KindRef> = match kinds {
        None => declared.with_role(Role::Owns).cloned().collect(),
        Some(names) => names
            .iter()
            .map(|n| owned_kind(&KindName::parse(&n.to_string())))
            .collect::<RhaiResult<_>>()?,
    };
    for kind in pruned {
        let mut stale: Vec<(String, String)> = c
            .owned(&kind)
            .iter()
            .map(|o| (o.namespace().to_string(), o.name().to_string()))
            .filter(|(ns, n)| {
                !wanted
                    .iter()
                    .any(|(k, wn, w)| *k == kind && wn == ns && w == n)
            })
            .collect();
        // Within a namespace, the highest name first.
        stale.sort_by(|(an, a), (bn, b)| an.cmp(bn).then((b.len(), b).cmp(&(a.len(), a))));
        for (ns, name) in stale {
            let kind = KindName {
                api_version: Some(kind.api_version.clone()),
                kind: kind.kind.clone(),
            };
            let namespace = (ns != c.0.namespace).then_some(ns);
            out.push(Dynamic::from(make(
                call,
                Action::Delete {
                    kind,
                    name,
                    namespace,
                },
            )));
        }
    }
    Ok(out)
}

/// What is wrong with the shape of an object a script hands over to be
/// written, if anything: checked where the script made it, so the error
/// names that place (and nothing malformed reaches the executor).
pub fn shape_problem(obj: &Value) -> Option<String> {
    let kind_of = |v: &Value| match v {
        Value::Null => "nothing",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "map",
    };
    let Some(meta) = obj.get("metadata").and_then(Value::as_object) else {
        return Some("metadata must be a map".into());
    };
    match meta.get("name").and_then(Value::as_str) {
        Some(n) if crate::names::is_dns_subdomain(n) => {}
        Some(n) => {
            return Some(format!(
                "metadata.name {n:?} is not a valid name (lowercase letters, digits, '-' and '.', at most 253 characters)"
            ));
        }
        None => return Some("metadata.name must be a string".into()),
    }
    for field in ["labels", "annotations"] {
        match meta.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                if let Some((k, v)) = m.iter().find(|(_, v)| !v.is_string()) {
                    return Some(format!(
                        "metadata.{field}.{k} must be a string, not a {}",
                        kind_of(v)
                    ));
                }
            }
            Some(other) => {
                return Some(format!(
                    "metadata.{field} must be a map of strings, not a {}",
                    kind_of(other)
                ));
            }
        }
    }
    if let Some(ns) = meta.get("namespace")
        && !ns.is_string()
        && !ns.is_null()
    {
        return Some(format!(
            "metadata.namespace must be a string, not a {}",
            kind_of(ns)
        ));
    }
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let version_ok = version.starts_with('v')
        && version.len() > 1
        && version
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !version_ok || (api_version.contains('/') && !crate::names::is_dns_subdomain(group)) {
        return Some(format!(
            "apiVersion {api_version:?} is not GROUP/VERSION or VERSION (like apps/v1 or v1)"
        ));
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if !kind.starts_with(|c: char| c.is_ascii_uppercase())
        || !kind.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return Some(format!(
            "kind {kind:?} is not a kind name (like Deployment)"
        ));
    }
    None
}

fn name_of(obj: &Value) -> Option<String> {
    obj.get("metadata")?
        .get("name")?
        .as_str()
        .map(str::to_string)
}

fn string_map(
    ctx: &NativeCallContext,
    what: &str,
    v: Option<&Value>,
) -> RhaiResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => continue,
                    other => other.to_string(),
                };
                out.insert(k.clone(), text);
            }
        }
        Some(other) => return fail(ctx, format!("{what} must be a map, not {other}")),
    }
    Ok(out)
}

fn duration_ms(ctx: &NativeCallContext, d: &Dynamic) -> RhaiResult<i64> {
    if let Ok(secs) = d.as_int() {
        return Ok(secs.saturating_mul(1000));
    }
    if let Ok(secs) = d.as_float() {
        return Ok((secs * 1000.0) as i64);
    }
    if d.is_string() {
        let text = d.clone().into_string().unwrap_or_default();
        return match crate::util::time::parse_duration_ms(&text) {
            Ok(ms) => Ok(ms),
            Err(e) => fail(ctx, e),
        };
    }
    fail(
        ctx,
        format!(
            "a duration must be seconds or a string like \"5m\", not {}",
            d.type_name()
        ),
    )
}

/// Register the action builders.
pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<ActionValue>("Action");
    engine.register_fn("to_string", |a: &mut ActionValue| format!("{:?}", a.action));
    engine.register_get("verb", |a: &mut ActionValue| a.action.verb().to_string());
    register_children(engine);
    register_target(engine);
    register_others(engine);
}

/// `delete(obj)`: the object by its kind, name and namespace.
fn delete_object(ctx: NativeCallContext, obj: Dynamic) -> RhaiResult<ActionValue> {
    let object = map_json(&ctx, "delete(obj)", obj)?;
    let (Some(kind), Some(name)) = (KindName::of(&object), name_of(&object)) else {
        return fail(
            &ctx,
            "delete: the object needs kind and metadata.name".into(),
        );
    };
    let namespace = namespace_of(&object);
    Ok(make(
        &ctx,
        Action::Delete {
            kind,
            name,
            namespace,
        },
    ))
}

/// The namespace an object names, if it names one.
fn namespace_of(object: &Value) -> Option<String> {
    object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

/// `patch(obj, merge_patch)`: the object by its kind and name.
fn patch_object(ctx: NativeCallContext, obj: Dynamic, patch: Dynamic) -> RhaiResult<ActionValue> {
    let object = map_json(&ctx, "patch(obj)", obj)?;
    let patch = map_json(&ctx, "patch(_, merge_patch)", patch)?;
    let (Some(kind), Some(name)) = (KindName::of(&object), name_of(&object)) else {
        return fail(
            &ctx,
            "patch: the object needs kind and metadata.name".into(),
        );
    };
    let namespace = namespace_of(&object);
    Ok(make(
        &ctx,
        Action::Patch {
            kind,
            name,
            patch,
            namespace,
        },
    ))
}

/// `apply`, `delete` and `patch`: objects other than the target.
fn register_children(engine: &mut Engine) {
    engine.register_fn(
        "apply",
        |ctx: NativeCallContext, obj: Dynamic| -> RhaiResult<ActionValue> {
            let object = map_json(&ctx, "apply(obj)", obj)?;
            Ok(make(&ctx, applied(&ctx, "apply", object)?))
        },
    );
    engine.register_fn(
        "sync_children",
        |call: NativeCallContext, c: &mut Ctx, want: Array| -> RhaiResult<Array> {
            super::stop::timed(&call, || sync_children(&call, c, want, None))
        },
    );
    engine.register_fn(
        "sync_children",
        |call: NativeCallContext, c: &mut Ctx, want: Array, kinds: Array| -> RhaiResult<Array> {
            super::stop::timed(&call, || sync_children(&call, c, want, Some(kinds)))
        },
    );

    engine.register_fn("delete", delete_object);
    engine.register_fn(
        "delete",
        |ctx: NativeCallContext, kind: &str, name: &str| -> RhaiResult<ActionValue> {
            Ok(make(
                &ctx,
                Action::Delete {
                    kind: KindName::parse(kind),
                    name: name.to_string(),
                    namespace: None,
                },
            ))
        },
    );

    engine.register_fn("patch", patch_object);
    engine.register_fn(
        "patch",
        |ctx: NativeCallContext,
         kind: &str,
         name: &str,
         patch: Dynamic|
         -> RhaiResult<ActionValue> {
            let patch = map_json(&ctx, "patch(_, _, merge_patch)", patch)?;
            Ok(make(
                &ctx,
                Action::Patch {
                    kind: KindName::parse(kind),
                    name: name.to_string(),
                    patch,
                    namespace: None,
                },
            ))
        },
    );
}

/// `status` and `condition`: the target itself.
fn register_target(engine: &mut Engine) {
    engine.register_fn(
        "status",
        |ctx: NativeCallContext, fields: Dynamic| -> RhaiResult<ActionValue> {
            match map_json(&ctx, "status(map)", fields)? {
                Value::Object(fields) => Ok(make(&ctx, Action::Status { fields })),
                _ => unreachable!("a map converts to an object"),
            }
        },
    );

    engine.register_fn(
        "condition",
        |ctx: NativeCallContext,
         type_: &str,
         status: Dynamic,
         reason: &str,
         message: &str|
         -> RhaiResult<ActionValue> {
            let status = match ConditionStatus::of_script(&status) {
                Ok(s) => s,
                Err(e) => return fail(&ctx, format!("condition: {e}")),
            };
            Ok(make(
                &ctx,
                Action::Condition(Condition {
                    type_: type_.to_string(),
                    status,
                    reason: reason.to_string(),
                    message: message.to_string(),
                }),
            ))
        },
    );
}

/// `rollback`, `alert`, `event` and `requeue`.
fn register_others(engine: &mut Engine) {
    register_rollback(engine);
    register_signals(engine);
}

/// `rollback`, to the previous revision or a given one.
fn register_rollback(engine: &mut Engine) {
    engine.register_fn(
        "rollback",
        |ctx: NativeCallContext, name: &str| -> RhaiResult<ActionValue> {
            Ok(make(
                &ctx,
                Action::Rollback {
                    deployment: name.to_string(),
                    revision: None,
                },
            ))
        },
    );
    engine.register_fn(
        "rollback",
        |ctx: NativeCallContext, name: &str, revision: INT| -> RhaiResult<ActionValue> {
            if revision <= 0 {
                return fail(
                    &ctx,
                    format!("rollback: revision must be positive, not {revision}"),
                );
            }
            Ok(make(
                &ctx,
                Action::Rollback {
                    deployment: name.to_string(),
                    revision: Some(revision),
                },
            ))
        },
    );
    engine.register_fn(
        "rollback",
        |ctx: NativeCallContext, name: &str, _revision: ()| -> RhaiResult<ActionValue> {
            Ok(make(
                &ctx,
                Action::Rollback {
                    deployment: name.to_string(),
                    revision: None,
                },
            ))
        },
    );
}

/// `alert`, `event` and `requeue`.
fn register_signals(engine: &mut Engine) {
    engine.register_fn(
        "alert",
        |ctx: NativeCallContext, spec: Dynamic| -> RhaiResult<ActionValue> {
            let spec = map_json(&ctx, "alert(map)", spec)?;
            for key in spec.as_object().into_iter().flat_map(|m| m.keys()) {
                if key != "labels" && key != "annotations" {
                    return fail(
                        &ctx,
                        format!("alert: unknown key {key:?} (use labels and annotations)"),
                    );
                }
            }
            let labels = string_map(&ctx, "alert labels", spec.get("labels"))?;
            let annotations = string_map(&ctx, "alert annotations", spec.get("annotations"))?;
            Ok(make(
                &ctx,
                Action::Alert {
                    labels,
                    annotations,
                },
            ))
        },
    );
    engine.register_fn(
        "alert",
        |ctx: NativeCallContext, severity: &str, summary: &str| -> RhaiResult<ActionValue> {
            let labels = BTreeMap::from([("severity".to_string(), severity.to_string())]);
            let annotations = BTreeMap::from([("summary".to_string(), summary.to_string())]);
            Ok(make(
                &ctx,
                Action::Alert {
                    labels,
                    annotations,
                },
            ))
        },
    );

    engine.register_fn(
        "event",
        |ctx: NativeCallContext,
         type_: &str,
         reason: &str,
         message: &str|
         -> RhaiResult<ActionValue> {
            let type_ = match type_ {
                "Normal" => EventType::Normal,
                "Warning" => EventType::Warning,
                other => {
                    return fail(
                        &ctx,
                        format!("event type must be \"Normal\" or \"Warning\", not {other:?}"),
                    );
                }
            };
            Ok(make(
                &ctx,
                Action::Event {
                    type_,
                    reason: reason.into(),
                    message: message.into(),
                },
            ))
        },
    );

    engine.register_fn(
        "requeue",
        |ctx: NativeCallContext, after: Dynamic| -> RhaiResult<ActionValue> {
            let after_ms = duration_ms(&ctx, &after)?;
            if after_ms <= 0 {
                return fail(&ctx, "requeue: the delay must be positive".into());
            }
            Ok(make(&ctx, Action::Requeue { after_ms }))
        },
    );
}
