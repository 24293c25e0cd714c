//! Turning a bundle's text into compiled policies: parse, validate, compile
//! scripts, expressions and templates once per policy version. Every error
//! names the file, line and column.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use rhai::Dynamic;
use serde_json::Value;

use super::bundle::{Bundle, Origin};
use super::limits::{CircuitBreaker, CompiledLimits, RateLimit, Verb};
use super::model::{API_VERSION, Header, Limits, Mode, PolicyDoc, ScheduleSpec, StepSpec};
use crate::alert::model::AlertRoutesDoc;
use crate::alert::routes::{self, CompiledRoutes};
use crate::kinds::{DeclaredKinds, KindName, KindRef, Role};
use crate::labels::Selector;
use crate::schedule::Schedule;
use crate::script::action::EventType;
use crate::script::engine::{Expr, Script, ScriptEngine};
use crate::script::error::ScriptError;
use crate::script::template::Template;
use crate::util::hash::short_hex;
use crate::util::time::parse_duration_ms;
use crate::util::yaml::{self, Node, Pos};

/// A load error: file, position and message, printed `file:line:col: message`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LoadError {
    pub file: String,
    pub pos: Option<Pos>,
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.col, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for LoadError {}

impl From<ScriptError> for LoadError {
    fn from(e: ScriptError) -> Self {
        Self {
            file: e.file,
            pos: e.pos,
            message: e.message,
        }
    }
}

/// Where a policy's schedule comes from.
#[derive(Clone, Debug)]
pub enum ScheduleSource {
    Fixed(Schedule),
    FromField {
        path: Vec<String>,
        default: Option<Schedule>,
    },
}

/// One compiled declarative step.
#[derive(Clone, Debug)]
pub struct CompiledStep {
    pub name: String,
    pub apply: Option<(KindRef, Template)>,
    pub status: Option<Template>,
    pub delete: Option<(KindRef, Template)>,
    pub alert: Option<Template>,
    pub event: Option<(EventType, String, Template)>,
    pub ready_when: Option<Expr>,
    pub failed_when: Option<Expr>,
    pub timeout_ms: Option<i64>,
    /// Why the step failed, when `failedWhen` holds.
    pub message: Option<Template>,
}

/// A steps policy's retention: a template for the count, and the label
/// that carries a child's run id.
#[derive(Clone, Debug)]
pub struct CompiledRetention {
    pub keep: Template,
    pub label: String,
}

/// How a policy decides.
#[derive(Clone, Debug)]
pub enum Body {
    Script {
        script: Arc<Script>,
        source: Arc<str>,
        has_finalize: bool,
    },
    Steps {
        steps: Vec<CompiledStep>,
        on_failure: Vec<CompiledStep>,
        retention: Option<CompiledRetention>,
    },
}

/// A policy ready to decide.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    pub name: String,
    /// The YAML file it came from, as errors name it.
    pub file: String,
    pub origin: Origin,
    /// Content hash of the policy and everything it uses.
    pub version: String,
    pub target: KindRef,
    pub selector: Selector,
    pub kinds: Arc<DeclaredKinds>,
    pub schedule: Option<ScheduleSource>,
    pub body: Body,
    pub params: Value,
    pub params_dyn: Dynamic,
    pub alerts: Option<String>,
    pub mode: Mode,
    pub limits: CompiledLimits,
    pub priority: i32,
}

impl CompiledPolicy {
    pub fn has_finalizer(&self) -> bool {
        matches!(
            self.body,
            Body::Script {
                has_finalize: true,
                ..
            }
        )
    }

    pub fn owns(&self) -> impl Iterator<Item = &KindRef> {
        self.kinds.with_role(Role::Owns)
    }

    pub fn reads(&self) -> impl Iterator<Item = &KindRef> {
        self.kinds.with_role(Role::Reads)
    }

    pub fn mutates(&self) -> impl Iterator<Item = &KindRef> {
        self.kinds.with_role(Role::Mutates)
    }
}

/// What loading one bundle produced.
#[derive(Default)]
pub struct Loaded {
    pub policies: Vec<CompiledPolicy>,
    pub routes: Vec<CompiledRoutes>,
    /// Script files compiled (whether or not a policy uses them).
    pub scripts: Vec<String>,
    pub errors: Vec<LoadError>,
}

struct Ctx<'a> {
    engine: &'a ScriptEngine,
    bundle: &'a Bundle,
    errors: Vec<LoadError>,
    scripts: BTreeMap<String, Result<Arc<Script>, ()>>,
}

impl Ctx<'_> {
    fn error(&mut self, file: &str, pos: Option<Pos>, message: impl Into<String>) {
        self.errors.push(LoadError {
            file: self.bundle.display_path(file),
            pos,
            message: message.into(),
        });
    }

    fn script(&mut self, name: &str) -> Option<Arc<Script>> {
        if let Some(r) = self.scripts.get(name) {
            return r.clone().ok();
        }
        let text = self.bundle.files.get(name)?;
        let result = match self.engine.compile(&self.bundle.display_path(name), text) {
            Ok(s) => Ok(Arc::new(s)),
            Err(e) => {
                self.errors.push(e.into());
                Err(())
            }
        };
        self.scripts.insert(name.to_string(), result.clone());
        result.ok()
    }
}

fn pos_at(node: &Node, path: &[&str]) -> Option<Pos> {
    node.at(path).map(|n| n.pos).or(Some(node.pos))
}

/// Load every document of a bundle; `focus`, when given, limits policies to
/// those defined in that one file.
pub fn load_bundle(engine: &ScriptEngine, bundle: &Bundle, focus: Option<&str>) -> Loaded {
    let mut cx = Ctx {
        engine,
        bundle,
        errors: Vec::new(),
        scripts: BTreeMap::new(),
    };
    let mut loaded = Loaded::default();
    for (file, text) in &bundle.files {
        if focus.is_some_and(|f| f != file) {
            continue;
        }
        if file.ends_with(".rhai") {
            if cx.script(file).is_some() {
                loaded.scripts.push(bundle.display_path(file));
            }
            continue;
        }
        for (offset, doc_text) in yaml::split_documents(text) {
            let header: Header = match yaml::parse(doc_text) {
                Ok(h) => h,
                Err(e) => {
                    let e = e.offset(offset);
                    cx.error(
                        file,
                        Some(e.pos),
                        e.to_string()
                            .split_once(": ")
                            .map(|(_, m)| m.to_string())
                            .unwrap_or(e.message),
                    );
                    continue;
                }
            };
            let runbook_doc = header
                .api_version
                .as_deref()
                .is_some_and(|v| v.starts_with("runbook.dev/"));
            match header.kind.as_deref() {
                Some("Policy") | Some("AlertRoutes") if !runbook_doc => {
                    cx.error(
                        file,
                        Some(Pos {
                            line: offset + 1,
                            col: 1,
                        }),
                        format!("apiVersion: want {API_VERSION}"),
                    );
                }
                Some("Policy") => {
                    if let Some(p) = load_policy(&mut cx, file, doc_text, offset) {
                        loaded.policies.push(p);
                    }
                }
                Some("AlertRoutes") => {
                    if let Some(r) = load_routes(&mut cx, file, doc_text, offset) {
                        loaded.routes.push(r);
                    }
                }
                Some("Scenario") => {}
                Some(other) if runbook_doc && !is_runbook_resource(other) => {
                    cx.error(
                        file,
                        Some(Pos {
                            line: offset + 1,
                            col: 1,
                        }),
                        format!("unknown kind {other:?}: want Policy, AlertRoutes or Scenario"),
                    );
                }
                // Templates, example objects and anything else: not ours to load.
                _ => {}
            }
        }
    }
    loaded.errors = cx.errors;
    loaded
}

fn is_runbook_resource(kind: &str) -> bool {
    matches!(kind, "Evaluator" | "DatabaseBackup" | "AIModel")
}

fn parse_doc<T: serde::de::DeserializeOwned>(
    cx: &mut Ctx,
    file: &str,
    text: &str,
    offset: u32,
) -> Option<(T, Node)> {
    let typed = match yaml::parse::<T>(text) {
        Ok(t) => t,
        Err(e) => {
            let e = e.offset(offset);
            let msg = if e.path.is_empty() {
                e.message
            } else {
                format!("{}: {}", e.path, e.message)
            };
            cx.error(file, Some(e.pos), msg);
            return None;
        }
    };
    let mut node = yaml::parse_node(text).ok()?;
    node.offset(offset);
    Some((typed, node))
}

fn load_routes(cx: &mut Ctx, file: &str, text: &str, offset: u32) -> Option<CompiledRoutes> {
    let (doc, node) = parse_doc::<AlertRoutesDoc>(cx, file, text, offset)?;
    if doc.api_version != API_VERSION {
        cx.error(
            file,
            pos_at(&node, &["apiVersion"]),
            format!("apiVersion: want {API_VERSION}"),
        );
        return None;
    }
    match routes::compile(&doc, &node) {
        Ok(mut r) => {
            r.version = short_hex(text.as_bytes(), 12);
            r.file = cx.bundle.display_path(file);
            if let crate::policy::Origin::ConfigMap { namespace, .. } = &cx.bundle.origin {
                r.secret_namespace = Some(namespace.clone());
            }
            Some(r)
        }
        Err(errs) => {
            for e in errs {
                cx.error(file, e.pos, e.message);
            }
            None
        }
    }
}

fn compile_schedule(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    spec: &ScheduleSpec,
) -> Option<ScheduleSource> {
    let pos = pos_at(node, &["spec", "schedule"]);
    let parse = |cx: &mut Ctx, text: &str| match Schedule::parse(text) {
        Ok(s) => Some(s),
        Err(e) => {
            cx.error(file, pos, format!("spec.schedule: {e}"));
            None
        }
    };
    match (&spec.cron, &spec.from_field) {
        (Some(_), Some(_)) => {
            cx.error(file, pos, "spec.schedule: give cron or fromField, not both");
            None
        }
        (Some(c), None) => parse(cx, c).map(ScheduleSource::Fixed),
        (None, Some(field)) => {
            let path: Vec<String> = field.split('.').map(str::to_string).collect();
            if path.iter().any(|p| p.is_empty()) {
                cx.error(file, pos, format!("spec.schedule.fromField: {field:?} is not a dotted path such as spec.schedule"));
                return None;
            }
            let default = match &spec.default {
                Some(d) => Some(parse(cx, d)?),
                None => None,
            };
            Some(ScheduleSource::FromField { path, default })
        }
        (None, None) => {
            cx.error(file, pos, "spec.schedule: give cron or fromField");
            None
        }
    }
}

fn compile_limits(cx: &mut Ctx, file: &str, node: &Node, limits: &Limits) -> CompiledLimits {
    let mut out = CompiledLimits::default();
    for (verb, text) in [
        (Verb::Rollback, &limits.rollback),
        (Verb::Delete, &limits.delete),
        (Verb::Patch, &limits.patch),
        (Verb::Apply, &limits.apply),
    ] {
        let key = verb.as_str();
        if let Some(t) = text {
            match RateLimit::parse(t) {
                Ok(l) => *out.slot(verb) = Some(l),
                Err(e) => cx.error(
                    file,
                    pos_at(node, &["spec", "limits", key]),
                    format!("spec.limits.{key}: {e}"),
                ),
            }
        }
    }
    if let Some(cb) = &limits.circuit_breaker {
        let pos = pos_at(node, &["spec", "limits", "circuitBreaker"]);
        if !(cb.error_rate > 0.0 && cb.error_rate <= 1.0) {
            cx.error(
                file,
                pos,
                "spec.limits.circuitBreaker.errorRate must be in (0, 1]",
            );
        }
        match (
            parse_duration_ms(&cb.window),
            parse_duration_ms(&cb.cooldown),
        ) {
            (Ok(window_ms), Ok(cooldown_ms)) => {
                out.circuit_breaker = Some(CircuitBreaker {
                    error_rate: cb.error_rate,
                    window_ms,
                    min_requests: cb.min_requests.max(1),
                    cooldown_ms,
                })
            }
            (Err(e), _) | (_, Err(e)) => {
                cx.error(file, pos, format!("spec.limits.circuitBreaker: {e}"))
            }
        }
    }
    out
}

fn expr(
    cx: &mut Ctx,
    file: &str,
    source: &str,
    node: &Node,
    what: &str,
    functions: Option<&rhai::AST>,
) -> Option<Expr> {
    let Some(text) = node.as_str() else {
        cx.error(
            file,
            Some(node.pos),
            format!("{what} must be a Rhai expression in a string"),
        );
        return None;
    };
    let origin = Pos {
        line: node.pos.line,
        col: node.pos.col + quote_offset(source, node.pos),
    };
    match cx
        .engine
        .compile_expr(&cx.bundle.display_path(file), text, origin, functions)
    {
        Ok(e) => Some(e),
        Err(e) => {
            cx.errors.push(e.into());
            None
        }
    }
}

fn quote_offset(source: &str, pos: Pos) -> u32 {
    let line = source
        .lines()
        .nth(pos.line.saturating_sub(1) as usize)
        .unwrap_or("");
    match line.chars().nth(pos.col.saturating_sub(1) as usize) {
        Some('\'') | Some('"') => 1,
        _ => 0,
    }
}

fn template(
    cx: &mut Ctx,
    file: &str,
    source: &str,
    node: &Node,
    functions: Option<&rhai::AST>,
) -> Option<Template> {
    match Template::compile(
        cx.engine,
        &cx.bundle.display_path(file),
        source,
        node,
        functions,
    ) {
        Ok(t) => Some(t),
        Err(e) => {
            cx.errors.push(e.into());
            None
        }
    }
}

/// Kind named by a template's literal apiVersion/kind.
fn template_kind(t: &Template) -> Option<KindRef> {
    let av = t.literal_at(&["apiVersion"])?.as_str()?;
    let kind = t.literal_at(&["kind"])?.as_str()?;
    Some(KindRef::new(av, kind))
}

#[allow(clippy::too_many_arguments)]
fn compile_step(
    cx: &mut Ctx,
    file: &str,
    source: &str,
    node: &Node,
    step: &StepSpec,
    kinds: &DeclaredKinds,
    used: &mut BTreeSet<String>,
    functions: Option<&rhai::AST>,
) -> Option<CompiledStep> {
    let here = Some(node.pos);
    let name = &step.name;
    if !crate::names::is_dns_label(name) {
        cx.error(
            file,
            pos_at(node, &["name"]),
            format!("step name {name:?} must be a DNS label (lowercase letters, digits, '-')"),
        );
    }
    let actions = [
        step.apply.is_some(),
        step.status.is_some(),
        step.delete.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if actions > 1 {
        cx.error(
            file,
            here,
            format!("step {name}: give one of apply, status or delete"),
        );
        return None;
    }
    if actions == 0 && step.ready_when.is_none() && step.alert.is_none() && step.event.is_none() {
        cx.error(
            file,
            here,
            format!(
                "step {name} does nothing: give apply, status, delete, alert, event or readyWhen"
            ),
        );
        return None;
    }
    let mut ok = true;
    let apply = match &step.apply {
        None => None,
        Some(a) => {
            let (t_file, t_source, t_node) = match (&a.template, &a.object) {
                (Some(t), None) => {
                    used.insert(t.clone());
                    let Some(text) = cx.bundle.files.get(t).cloned() else {
                        cx.error(
                            file,
                            pos_at(node, &["apply", "template"]),
                            format!("step {name}: template {t:?} is not in this bundle"),
                        );
                        return None;
                    };
                    let docs = yaml::split_documents(&text);
                    if docs.len() != 1 {
                        cx.error(
                            t,
                            Some(Pos { line: 1, col: 1 }),
                            format!("a template holds exactly one document, not {}", docs.len()),
                        );
                        return None;
                    }
                    let mut n = match yaml::parse_node(docs[0].1) {
                        Ok(n) => n,
                        Err(e) => {
                            let e = e.offset(docs[0].0);
                            cx.error(t, Some(e.pos), e.message);
                            return None;
                        }
                    };
                    n.offset(docs[0].0);
                    (t.clone(), text, n)
                }
                (None, Some(obj)) => (file.to_string(), source.to_string(), obj.clone()),
                _ => {
                    cx.error(
                        file,
                        pos_at(node, &["apply"]),
                        format!("step {name}: apply needs template or object, not both"),
                    );
                    return None;
                }
            };
            let t = template(cx, &t_file, &t_source, &t_node, functions)?;
            match template_kind(&t) {
                None => {
                    cx.error(
                        &t_file,
                        Some(t_node.pos),
                        "a template must give apiVersion and kind literally",
                    );
                    ok = false;
                    None
                }
                Some(k) if !kinds.has(&k, Role::Owns) => {
                    cx.error(
                        &t_file,
                        pos_at(&t_node, &["kind"]),
                        format!(
                            "step {name} applies {k}, which the policy does not declare in owns"
                        ),
                    );
                    ok = false;
                    None
                }
                Some(k) => {
                    if t_node.at(&["metadata", "name"]).is_none() {
                        cx.error(
                            &t_file,
                            Some(t_node.pos),
                            "a template needs metadata.name (names must be deterministic)",
                        );
                        ok = false;
                    }
                    Some((k, t))
                }
            }
        }
    };
    let status = match &step.status {
        Some(n) => Some(template(cx, file, source, n, functions)?),
        None => None,
    };
    let delete = match &step.delete {
        None => None,
        Some(d) => {
            let kn = KindName {
                api_version: d.api_version.clone(),
                kind: d.kind.clone(),
            };
            match kinds.resolve(&kn) {
                Ok(k) if kinds.has(&k, Role::Owns) => {
                    Some((k, template(cx, file, source, &d.name, functions)?))
                }
                Ok(k) => {
                    cx.error(
                        file,
                        pos_at(node, &["delete", "kind"]),
                        format!(
                            "step {name} deletes {k}, which the policy does not declare in owns"
                        ),
                    );
                    ok = false;
                    None
                }
                Err(e) => {
                    cx.error(
                        file,
                        pos_at(node, &["delete", "kind"]),
                        format!("step {name}: {e}"),
                    );
                    ok = false;
                    None
                }
            }
        }
    };
    let alert = match &step.alert {
        Some(n) => Some(template(cx, file, source, n, functions)?),
        None => None,
    };
    let event = match &step.event {
        Some(e) => {
            let type_ = match e.type_.as_str() {
                "Warning" => EventType::Warning,
                "Normal" => EventType::Normal,
                _ => {
                    cx.error(
                        file,
                        pos_at(node, &["event", "type"]),
                        "event type must be Normal or Warning",
                    );
                    ok = false;
                    EventType::Normal
                }
            };
            Some((
                type_,
                e.reason.clone(),
                template(cx, file, source, &e.message, functions)?,
            ))
        }
        None => None,
    };
    let ready_when = match &step.ready_when {
        Some(n) => Some(expr(cx, file, source, n, "readyWhen", functions)?),
        None => None,
    };
    let failed_when = match &step.failed_when {
        Some(n) => Some(expr(cx, file, source, n, "failedWhen", functions)?),
        None => None,
    };
    let timeout_ms = match &step.timeout {
        Some(t) => match parse_duration_ms(t) {
            Ok(ms) if ms > 0 => Some(ms),
            Ok(_) => {
                cx.error(
                    file,
                    pos_at(node, &["timeout"]),
                    format!("step {name}: timeout must be positive"),
                );
                return None;
            }
            Err(e) => {
                cx.error(
                    file,
                    pos_at(node, &["timeout"]),
                    format!("step {name}: timeout: {e}"),
                );
                return None;
            }
        },
        None => None,
    };
    let message = match &step.message {
        Some(n) => Some(template(cx, file, source, n, functions)?),
        None => None,
    };
    ok.then_some(CompiledStep {
        message,
        name: name.clone(),
        apply,
        status,
        delete,
        alert,
        event,
        ready_when,
        failed_when,
        timeout_ms,
    })
}

fn step_nodes<'a>(node: &'a Node, key: &str) -> Vec<&'a Node> {
    match node.at(&["spec", key]).map(|n| &n.value) {
        Some(yaml::NodeValue::Seq(items)) => items.iter().collect(),
        _ => Vec::new(),
    }
}

fn load_policy(cx: &mut Ctx, file: &str, text: &str, offset: u32) -> Option<CompiledPolicy> {
    let (doc, node) = parse_doc::<PolicyDoc>(cx, file, text, offset)?;
    let errors_before = cx.errors.len();
    let source = cx.bundle.files.get(file).cloned().unwrap_or_default();
    if doc.api_version != API_VERSION {
        cx.error(
            file,
            pos_at(&node, &["apiVersion"]),
            format!("apiVersion: want {API_VERSION}"),
        );
    }
    let name = doc.metadata.name.clone();
    if !crate::names::is_dns_subdomain(&name) {
        cx.error(file, pos_at(&node, &["metadata", "name"]), format!("metadata.name {name:?} must be a DNS subdomain (lowercase letters, digits, '-', '.')"));
    }
    let spec = &doc.spec;
    for (key, k) in std::iter::once(("target", &spec.target))
        .chain(spec.owns.iter().map(|k| ("owns", k)))
        .chain(spec.reads.iter().map(|k| ("reads", k)))
        .chain(spec.mutates.iter().map(|k| ("mutates", k)))
    {
        if k.kind.is_empty() || k.api_version.is_empty() {
            cx.error(
                file,
                pos_at(&node, &["spec", key]),
                format!("spec.{key}: apiVersion and kind must not be empty"),
            );
        }
    }
    if spec.owns.contains(&spec.target) {
        cx.error(
            file,
            pos_at(&node, &["spec", "owns"]),
            "spec.owns: a policy cannot own its own target kind",
        );
    }
    let kinds = DeclaredKinds::new(&spec.target, &spec.owns, &spec.reads, &spec.mutates);
    let mut used_files: BTreeSet<String> = BTreeSet::new();
    used_files.insert(file.to_string());

    let body = match (&spec.script, spec.steps.is_empty()) {
        (Some(_), false) => {
            cx.error(
                file,
                pos_at(&node, &["spec", "script"]),
                "spec: give script or steps, not both",
            );
            None
        }
        (None, true) => {
            cx.error(
                file,
                pos_at(&node, &["spec"]),
                "spec: give a script or steps",
            );
            None
        }
        (Some(script_name), true) => {
            used_files.insert(script_name.clone());
            if !spec.on_failure.is_empty() {
                cx.error(
                    file,
                    pos_at(&node, &["spec", "onFailure"]),
                    "spec.onFailure goes with steps; a script handles its own failures",
                );
            }
            if spec.retention.is_some() {
                cx.error(
                    file,
                    pos_at(&node, &["spec", "retention"]),
                    "spec.retention goes with steps; a script deletes its own old children",
                );
            }
            if spec.functions.is_some() {
                cx.error(
                    file,
                    pos_at(&node, &["spec", "functions"]),
                    "spec.functions goes with steps; a script defines its own functions",
                );
            }
            if !cx.bundle.files.contains_key(script_name) {
                cx.error(
                    file,
                    pos_at(&node, &["spec", "script"]),
                    format!("spec.script: {script_name:?} is not in this bundle"),
                );
                None
            } else {
                let script = cx.script(script_name);
                match script {
                    Some(s) if !s.has_fn("reconcile") => {
                        cx.error(
                            script_name,
                            Some(Pos { line: 1, col: 1 }),
                            "the script defines no fn reconcile(ctx)",
                        );
                        None
                    }
                    Some(s) => Some(Body::Script {
                        has_finalize: s.has_fn("finalize"),
                        source: cx.bundle.files[script_name].as_str().into(),
                        script: s,
                    }),
                    None => None,
                }
            }
        }
        (None, false) => {
            let functions: Option<Arc<Script>> = match &spec.functions {
                None => None,
                Some(f) if !cx.bundle.files.contains_key(f) => {
                    cx.error(
                        file,
                        pos_at(&node, &["spec", "functions"]),
                        format!("spec.functions: {f:?} is not in this bundle"),
                    );
                    None
                }
                Some(f) => {
                    used_files.insert(f.clone());
                    cx.script(f)
                }
            };
            let functions_ast = functions.as_ref().map(|s| &s.ast);
            let mut names = BTreeSet::new();
            let mut steps = Vec::new();
            let step_nodes_main = step_nodes(&node, "steps");
            let step_nodes_fail = step_nodes(&node, "onFailure");
            let mut all_ok = true;
            for (i, step) in spec.steps.iter().enumerate() {
                let n = step_nodes_main.get(i).copied().unwrap_or(&node);
                if !names.insert(step.name.clone()) {
                    cx.error(
                        file,
                        Some(n.pos),
                        format!("step name {:?} is used twice", step.name),
                    );
                    all_ok = false;
                }
                match compile_step(
                    cx,
                    file,
                    &source,
                    n,
                    step,
                    &kinds,
                    &mut used_files,
                    functions_ast,
                ) {
                    Some(s) => steps.push(s),
                    None => all_ok = false,
                }
            }
            let mut on_failure = Vec::new();
            for (i, step) in spec.on_failure.iter().enumerate() {
                let n = step_nodes_fail.get(i).copied().unwrap_or(&node);
                if step.ready_when.is_some() || step.failed_when.is_some() || step.timeout.is_some()
                {
                    cx.error(file, Some(n.pos), format!("onFailure step {}: compensation runs once and does not wait; drop readyWhen, failedWhen and timeout", step.name));
                    all_ok = false;
                }
                match compile_step(
                    cx,
                    file,
                    &source,
                    n,
                    step,
                    &kinds,
                    &mut used_files,
                    functions_ast,
                ) {
                    Some(s) => on_failure.push(s),
                    None => all_ok = false,
                }
            }
            let retention = match &spec.retention {
                Some(r) => match template(cx, file, &source, &r.keep, functions_ast) {
                    Some(keep) => Some(CompiledRetention {
                        keep,
                        label: r.label.clone(),
                    }),
                    None => {
                        all_ok = false;
                        None
                    }
                },
                None => None,
            };
            all_ok.then_some(Body::Steps {
                steps,
                on_failure,
                retention,
            })
        }
    };
    let schedule = match &spec.schedule {
        Some(s) => compile_schedule(cx, file, &node, s),
        None => None,
    };
    let limits = compile_limits(cx, file, &node, &spec.limits);
    let params = spec
        .params
        .as_ref()
        .map(Node::to_json)
        .unwrap_or(Value::Object(Default::default()));
    if !params.is_object() {
        cx.error(
            file,
            pos_at(&node, &["spec", "params"]),
            "spec.params must be a map",
        );
    }
    let mut selector_pairs = Vec::new();
    for (k, v) in &spec.selector {
        if let Err(e) = crate::labels::check_key(k).and_then(|_| crate::labels::check_value(v)) {
            cx.error(
                file,
                pos_at(&node, &["spec", "selector"]),
                format!("spec.selector: {e}"),
            );
        }
        selector_pairs.push((k, v));
    }
    if cx.errors.len() > errors_before {
        return None;
    }
    let body = body?;
    // The version covers every file the policy uses, so editing a script or
    // template changes it as surely as editing the policy.
    let mut hashed = String::new();
    hashed.push_str(text);
    for f in &used_files {
        if f != file {
            hashed.push('\u{0}');
            hashed.push_str(f);
            hashed.push('\u{0}');
            hashed.push_str(cx.bundle.files.get(f).map(String::as_str).unwrap_or(""));
        }
    }
    Some(CompiledPolicy {
        name,
        file: cx.bundle.display_path(file),
        origin: cx.bundle.origin.clone(),
        version: short_hex(hashed.as_bytes(), 12),
        target: spec.target.clone(),
        selector: Selector::from_map(selector_pairs),
        kinds: Arc::new(kinds),
        schedule,
        body,
        params_dyn: crate::script::obj::view(Arc::new(params.clone())),
        params,
        alerts: spec.alerts.clone(),
        mode: spec.mode,
        limits,
        priority: spec.priority,
    })
}
