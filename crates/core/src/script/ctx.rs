//! `ctx`: the read-only view a script gets of the world.
//!
//! Everything comes from watch caches through an [`ObjectView`]; a reconcile
//! makes no reads against the API server. Only kinds the policy declared can
//! be looked up: the operator watches nothing else.

use std::sync::Arc;

use rhai::{Array, Dynamic, Engine, EvalAltResult, INT, Map, NativeCallContext};

use crate::kinds::{DeclaredKinds, KindName, KindRef};
use crate::labels::Selector;
use crate::observe::{CachedObject, ObjectView};

/// The data behind `ctx`.
pub struct CtxData {
    pub resource: Dynamic,
    pub params: Dynamic,
    /// What changes with time rather than with the target.
    pub timely: Timely,
    pub policy_name: String,
    pub policy_version: String,
    pub namespace: String,
    pub target_uid: String,
    pub view: Arc<dyn ObjectView>,
    pub kinds: Arc<DeclaredKinds>,
    /// `spec.namespaces`: the other namespaces the policy may make
    /// children in, by their labels.
    pub namespaces: Option<Selector>,
    /// `spec.previous`: the fields declared, those changed since the last
    /// concluded decision, and what that decision saw (`ctx.previous`).
    pub previous: Previous,
    /// A sweep's targets (`ctx.targets`); `None` for a policy that
    /// decides per target.
    pub targets: Option<Vec<Arc<CachedObject>>>,
    /// `spec.metrics`: the readings the runtime gave this decision, and
    /// what the script read and wanted of them.
    pub metrics: Arc<crate::metric::Readings>,
}

/// Old and new for the fields a policy declares in `spec.previous`.
#[derive(Default)]
pub struct Previous {
    pub declared: Vec<String>,
    pub changed: Vec<String>,
    /// The fields as the last concluded decision saw them, shaped like
    /// the target; `()` before the first.
    pub last: Dynamic,
    /// When one of them last changed (unix seconds), as a decision that
    /// concluded saw it.
    pub changed_at: Option<i64>,
}

pub use timely::{Timely, Times};

/// What a decision may know that changes with time rather than with its
/// target: the clock, the schedule and the counts of the blast-radius
/// limits. A decision that reads any of it is made again whatever
/// changed (`obj::TargetReads::clock`); the fields are private to this
/// module so that nothing, a function added later included, can read them
/// without that being written down.
mod timely {
    use crate::script::obj::note_clock;

    pub struct Timely {
        now: i64,
        due: bool,
        fired: Vec<String>,
        next_run: Option<i64>,
        last_run: Option<i64>,
        run: String,
        limited: Vec<String>,
    }

    /// What a decision knows of its schedules: times in unix seconds.
    pub struct Times {
        pub due: bool,
        /// The named schedules that fired.
        pub fired: Vec<String>,
        pub next_run: Option<i64>,
        pub last_run: Option<i64>,
        /// The current scheduled run (its fire time), or "once".
        pub run: String,
    }

    impl Timely {
        /// `now` in unix seconds; `limited`: the verbs whose limit refuses
        /// one more action now.
        pub fn new(now: i64, times: Times, limited: Vec<String>) -> Self {
            Self {
                now,
                due: times.due,
                fired: times.fired,
                next_run: times.next_run,
                last_run: times.last_run,
                run: times.run,
                limited,
            }
        }

        pub fn now(&self) -> i64 {
            note_clock();
            self.now
        }

        pub fn due(&self) -> bool {
            note_clock();
            self.due
        }

        pub fn fired(&self) -> &[String] {
            note_clock();
            &self.fired
        }

        pub fn next_run(&self) -> Option<i64> {
            note_clock();
            self.next_run
        }

        pub fn last_run(&self) -> Option<i64> {
            note_clock();
            self.last_run
        }

        pub fn run(&self) -> &str {
            note_clock();
            &self.run
        }

        /// Whether the limits allow one more action of `verb` now.
        pub fn allows(&self, verb: &str) -> bool {
            note_clock();
            !self.limited.iter().any(|v| v == verb)
        }
    }
}

/// `ctx` as a Rhai value: cheap to clone.
#[derive(Clone)]
pub struct Ctx(pub Arc<CtxData>);

type RhaiResult<T> = Result<T, Box<EvalAltResult>>;

fn fail<T>(call: &NativeCallContext, message: String) -> RhaiResult<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(
        message.into(),
        call.call_position(),
    )))
}

impl Ctx {
    fn kind(&self, call: &NativeCallContext, name: &str) -> RhaiResult<KindRef> {
        match self.0.kinds.resolve(&KindName::parse(name)) {
            Ok(k) => Ok(k),
            Err(e) => fail(call, e),
        }
    }

    fn objects(&self, kind: &KindRef) -> Vec<Arc<CachedObject>> {
        self.named(kind, self.0.view.list(kind, self.namespace_of(kind)))
    }

    /// Where objects of `kind` are looked up: the target's namespace, or
    /// none for a cluster-scoped kind (a Namespace, a Node).
    fn namespace_of(&self, kind: &KindRef) -> &str {
        if kind.namespaced() {
            &self.0.namespace
        } else {
            ""
        }
    }

    /// Of a kind the policy reads by name only, the objects it names.
    fn named(&self, kind: &KindRef, objs: Vec<Arc<CachedObject>>) -> Vec<Arc<CachedObject>> {
        match self.0.kinds.names_of(kind) {
            Some(names) => objs
                .into_iter()
                .filter(|o| names.contains(o.name()))
                .collect(),
            None => objs,
        }
    }

    fn array(objs: impl IntoIterator<Item = Arc<CachedObject>>) -> Array {
        objs.into_iter().map(|o| super::obj::of(&o)).collect()
    }

    /// This policy's children of the target of one kind, sorted by name:
    /// those it made (its labels, a controller ownerReference to the
    /// target); another policy's children, and objects that merely name
    /// the target among their owners, are not.
    pub fn owned(&self, kind: &KindRef) -> Vec<Arc<CachedObject>> {
        let mine = crate::observe::policy_label_value(&self.0.policy_name);
        let mut children = self
            .0
            .view
            .owned_by(kind, &self.0.namespace, &self.0.target_uid);
        if self.0.namespaces.is_some() && kind.namespaced() {
            children.extend(self.0.view.children_elsewhere(kind, &self.0.target_uid));
        }
        children.retain(|c| c.is_child_of(&mine, &self.0.target_uid));
        children
    }

    /// The other namespaces the policy may make children in: those
    /// `spec.namespaces` selects, not being deleted, sorted by name.
    pub fn namespaces(&self) -> Vec<String> {
        let Some(selector) = &self.0.namespaces else {
            return Vec::new();
        };
        let mut names = crate::observe::namespaces_matching(self.0.view.as_ref(), selector);
        names.retain(|n| *n != self.0.namespace);
        names
    }
}

fn selector_of(call: &NativeCallContext, sel: &Dynamic) -> RhaiResult<Selector> {
    if sel.is_unit() {
        return Ok(Selector::default());
    }
    if let Some(map) = sel.read_lock::<Map>() {
        let mut reqs = Vec::new();
        for (k, v) in map.iter() {
            reqs.push(crate::labels::Requirement::Eq(k.to_string(), v.to_string()));
        }
        return Ok(Selector(reqs));
    }
    // A map read from an object (`resource.spec.podSelector`).
    if let Some(obj) = sel.read_lock::<crate::script::obj::Obj>()
        && let Some(map) = obj.value().as_object()
    {
        {
            let reqs = map
                .iter()
                .map(|(k, v)| {
                    let v = v
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string());
                    crate::labels::Requirement::Eq(k.clone(), v)
                })
                .collect();
            return Ok(Selector(reqs));
        }
    }
    if sel.is_string() {
        return match Selector::parse(&sel.to_string()) {
            Ok(s) => Ok(s),
            Err(e) => fail(call, e),
        };
    }
    fail(
        call,
        format!(
            "a selector is a map of labels or a string, not {}",
            sel.type_name()
        ),
    )
}

/// The label selector of a workload: `spec.selector.matchLabels` (and
/// `matchExpressions` with In/NotIn/Exists/DoesNotExist), or a Service's
/// `spec.selector`.
pub fn workload_selector(obj: &serde_json::Value) -> Option<Selector> {
    use crate::labels::Requirement;
    let sel = obj.get("spec")?.get("selector")?;
    let mut reqs = Vec::new();
    let labels = sel.get("matchLabels").or_else(|| {
        // A Service's selector is a plain map.
        if sel.get("matchExpressions").is_none() {
            Some(sel)
        } else {
            None
        }
    });
    if let Some(m) = labels.and_then(|l| l.as_object()) {
        for (k, v) in m {
            reqs.push(Requirement::Eq(k.clone(), v.as_str()?.to_string()));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(|m| m.as_array())
        .into_iter()
        .flatten()
    {
        let key = e.get("key")?.as_str()?.to_string();
        let values: Vec<String> = e
            .get("values")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        reqs.push(match e.get("operator")?.as_str()? {
            "In" => Requirement::In(key, values),
            "NotIn" => Requirement::NotIn(key, values),
            "Exists" => Requirement::Exists(key),
            "DoesNotExist" => Requirement::NotExists(key),
            _ => return None,
        });
    }
    if reqs.is_empty() {
        None
    } else {
        Some(Selector(reqs))
    }
}

/// Register `ctx`'s properties and methods.
pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<Ctx>("Ctx");
    register_properties(engine);
    register_lookups(engine);
}

/// The properties `ctx` has (registered below): a script reading another
/// is refused when it loads, with the one meant.
pub const PROPERTIES: &[&str] = &[
    "resource",
    "params",
    "now",
    "due",
    "fired",
    "next_run",
    "last_run",
    "run",
    "namespace",
    "policy",
    "previous",
    "changed_at",
    "targets",
];

/// `ctx`'s properties: the target, params, the clock and schedule, the policy.
fn register_properties(engine: &mut Engine) {
    engine.register_get("resource", |c: &mut Ctx| c.0.resource.clone());
    engine.register_get("params", |c: &mut Ctx| c.0.params.clone());
    engine.register_get("now", |c: &mut Ctx| c.0.timely.now() as INT);
    engine.register_get("due", |c: &mut Ctx| c.0.timely.due());
    engine.register_get("fired", |c: &mut Ctx| -> Array {
        c.0.timely.fired().iter().map(|n| n.into()).collect()
    });
    engine.register_get("next_run", |c: &mut Ctx| {
        c.0.timely
            .next_run()
            .map_or(Dynamic::UNIT, Dynamic::from_int)
    });
    engine.register_get("last_run", |c: &mut Ctx| {
        c.0.timely
            .last_run()
            .map_or(Dynamic::UNIT, Dynamic::from_int)
    });
    engine.register_get("run", |c: &mut Ctx| c.0.timely.run().to_string());
    engine.register_get("namespace", |c: &mut Ctx| c.0.namespace.clone());
    engine.register_get("targets", |c: &mut Ctx| -> RhaiResult<Array> {
        match &c.0.targets {
            Some(all) => Ok(Ctx::array(all.iter().cloned())),
            None => Err(Box::new(EvalAltResult::ErrorRuntime(
                "ctx.targets: only a sweep (spec.sweep: true) lists its targets; this policy decides for one target, ctx.resource".into(),
                rhai::Position::NONE,
            ))),
        }
    });
    engine.register_get("previous", |c: &mut Ctx| c.0.previous.last.clone());
    engine.register_get("changed_at", |c: &mut Ctx| {
        c.0.previous
            .changed_at
            .map_or(Dynamic::UNIT, Dynamic::from_int)
    });
    engine.register_fn(
        "changed",
        |call: NativeCallContext, c: &mut Ctx, path: &str| -> RhaiResult<bool> {
            let p = &c.0.previous;
            if !p.declared.iter().any(|d| d == path) {
                let declared = if p.declared.is_empty() {
                    "none".to_string()
                } else {
                    p.declared.join(", ")
                };
                return fail(
                    &call,
                    format!(
                        "ctx.changed({path:?}): the policy does not declare {path} in spec.previous (declared: {declared})"
                    ),
                );
            }
            Ok(p.changed.iter().any(|d| d == path))
        },
    );
    engine.register_fn("changed", |c: &mut Ctx| -> Array {
        c.0.previous.changed.iter().map(|p| p.into()).collect()
    });
    engine.register_get("policy", |c: &mut Ctx| {
        let mut m = Map::new();
        m.insert("name".into(), c.0.policy_name.clone().into());
        m.insert("version".into(), c.0.policy_version.clone().into());
        m
    });
}

/// `ctx.metric(name)` and `ctx.metric_error(name)`: the readings of
/// `spec.metrics`. A decision that reads one is made again every time
/// (its value changes with time, not with the target).
fn register_metrics(engine: &mut Engine) {
    use crate::metric::{Found, Reading};
    fn found<'a>(
        call: &NativeCallContext,
        c: &'a Ctx,
        name: &str,
    ) -> RhaiResult<Option<&'a Reading>> {
        crate::script::obj::note_clock();
        match c.0.metrics.get(name) {
            Found::Given(r) => Ok(Some(r)),
            Found::NotGiven => Ok(None),
            Found::Undeclared(declared) => {
                let declared = if declared.is_empty() {
                    "none".to_string()
                } else {
                    declared.join(", ")
                };
                fail(
                    call,
                    format!(
                        "ctx.metric({name:?}): the policy declares no metric {name:?} in spec.metrics (declared: {declared})"
                    ),
                )
            }
        }
    }
    engine.register_fn(
        "metric",
        |call: NativeCallContext, c: &mut Ctx, name: &str| -> RhaiResult<Dynamic> {
            Ok(match found(&call, c, name)? {
                Some(Reading::Value { value, at, samples }) => {
                    let mut m = Map::new();
                    m.insert("value".into(), Dynamic::from_float(*value));
                    m.insert("at".into(), Dynamic::from_int(*at));
                    m.insert("samples".into(), Dynamic::from_int(INT::from(*samples)));
                    m.into()
                }
                _ => Dynamic::UNIT,
            })
        },
    );
    engine.register_fn(
        "metric_error",
        |call: NativeCallContext, c: &mut Ctx, name: &str| -> RhaiResult<Dynamic> {
            Ok(match found(&call, c, name)? {
                Some(Reading::Missing { reason, message }) => {
                    let mut m = Map::new();
                    m.insert("reason".into(), reason.as_str().into());
                    m.insert("message".into(), message.clone().into());
                    m.into()
                }
                _ => Dynamic::UNIT,
            })
        },
    );
}

/// `ctx`'s lookups in the caches: `owned`, `get`, `list`, `pods_of`, and `allowed`.
fn register_lookups(engine: &mut Engine) {
    register_metrics(engine);
    // The limits count actions over a window of time.
    engine.register_fn("allowed", |c: &mut Ctx, verb: &str| c.0.timely.allows(verb));
    engine.register_fn("namespaces", |c: &mut Ctx| -> Array {
        c.namespaces().into_iter().map(Dynamic::from).collect()
    });
    register_reads(engine);
    register_relations(engine);
}

/// `owned`, `get` and `list`: objects of the declared kinds.
fn register_reads(engine: &mut Engine) {
    engine.register_fn(
        "owned",
        |call: NativeCallContext, c: &mut Ctx, kind: &str| -> RhaiResult<Array> {
            super::stop::timed(&call, || {
                let k = c.kind(&call, kind)?;
                Ok(Ctx::array(c.owned(&k)))
            })
        },
    );
    engine.register_fn(
        "get",
        |call: NativeCallContext, c: &mut Ctx, kind: &str, name: &str| -> RhaiResult<Dynamic> {
            super::stop::timed(&call, || {
                let k = c.kind(&call, kind)?;
                if let Some(names) = c.0.kinds.names_of(&k)
                    && !names.contains(name)
                {
                    let list: Vec<&str> = names.iter().map(String::as_str).collect();
                    return fail(
                        &call,
                        format!(
                            "get: the policy reads {k} by name only (spec.readsByName: {}), not {name:?}",
                            list.join(", ")
                        ),
                    );
                }
                Ok(c.0
                    .view
                    .get(&k, c.namespace_of(&k), name)
                    .map(|o| super::obj::of(&o))
                    .unwrap_or(Dynamic::UNIT))
            })
        },
    );
    engine.register_fn(
        "list",
        |call: NativeCallContext, c: &mut Ctx, kind: &str| -> RhaiResult<Array> {
            super::stop::timed(&call, || {
                let k = c.kind(&call, kind)?;
                Ok(Ctx::array(c.objects(&k)))
            })
        },
    );
    engine.register_fn(
        "list",
        |call: NativeCallContext,
         c: &mut Ctx,
         kind: &str,
         selector: Dynamic|
         -> RhaiResult<Array> {
            super::stop::timed(&call, || {
                let k = c.kind(&call, kind)?;
                let sel = selector_of(&call, &selector)?;
                Ok(Ctx::array(
                    c.named(&k, c.0.view.select(&k, c.namespace_of(&k), &sel)),
                ))
            })
        },
    );
}

/// `owned_by` and `pods_of`: objects by their owner or a workload's selector.
fn register_relations(engine: &mut Engine) {
    engine.register_fn(
        "owned_by",
        |call: NativeCallContext, c: &mut Ctx, kind: &str, owner: Dynamic| -> RhaiResult<Array> {
            super::stop::timed(&call, || {
                let k = c.kind(&call, kind)?;
                let uid = match super::convert::with_json(&owner, |j| {
                    j.get("metadata")
                        .and_then(|m| m.get("uid"))
                        .and_then(|u| u.as_str())
                        .map(str::to_string)
                }) {
                    Ok(Some(uid)) => uid,
                    Ok(None) => {
                        return fail(&call, "owned_by: the owner has no metadata.uid".into());
                    }
                    Err(e) => return fail(&call, format!("owned_by: {e}")),
                };
                Ok(Ctx::array(if uid == c.0.target_uid {
                    c.owned(&k)
                } else {
                    c.named(&k, c.0.view.list_owned_by(&k, &c.0.namespace, &uid))
                }))
            })
        },
    );
    engine.register_fn(
        "pods_of",
        |call: NativeCallContext, c: &mut Ctx, obj: Dynamic| -> RhaiResult<Array> {
            super::stop::timed(&call, || pods_of(&call, c, obj))
        },
    );
}

/// `ctx.pods_of(obj)`: the pods a workload's selector picks, or (a Job the
/// server has not defaulted yet) the pods it owns.
fn pods_of(call: &NativeCallContext, c: &Ctx, obj: Dynamic) -> RhaiResult<Array> {
    if obj.is_unit() {
        return Ok(Array::new());
    }
    let pod = c.kind(call, "v1 Pod").map_err(|_| {
        Box::new(EvalAltResult::ErrorRuntime(
            "pods_of needs {apiVersion: v1, kind: Pod} in the policy's reads".into(),
            call.call_position(),
        ))
    })?;
    let mine = crate::observe::policy_label_value(&c.0.policy_name);
    let found = super::convert::with_json(&obj, |j| {
        (
            workload_selector(j),
            j.get("metadata")
                .and_then(|m| m.get("uid"))
                .and_then(|u| u.as_str())
                .map(str::to_string),
            crate::observe::is_child_of(j, &mine, &c.0.target_uid),
        )
    });
    let (sel, uid, child) = match found {
        Ok(f) => f,
        Err(e) => return fail(call, format!("pods_of: {e}")),
    };
    // The pods of one of the policy's own children are read for
    // the child's sake, not with the target author's rights.
    let view = &c.0.view;
    let ns = &c.0.namespace;
    match (sel, uid) {
        (Some(sel), _) if child => Ok(Ctx::array(view.select_for_child(&pod, ns, &sel))),
        (Some(sel), _) => Ok(Ctx::array(view.select(&pod, ns, &sel))),
        // No selector (a Job not yet defaulted by the server): its pods are the ones it owns.
        (None, Some(uid)) => {
            let pods = if child {
                view.list_for_child(&pod, ns)
            } else {
                c.objects(&pod)
            };
            Ok(Ctx::array(pods.into_iter().filter(|p| p.is_owned_by(&uid))))
        }
        (None, None) => fail(
            call,
            "pods_of: the object has neither spec.selector nor a uid".into(),
        ),
    }
}
