//! Turning a bundle's text into compiled policies: parse, validate, compile
//! scripts, expressions and templates once per policy version. Every error
//! names the file, line and column.

mod metrics;
mod pieces;
mod policy;
mod steps;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use rhai::Dynamic;
use serde_json::Value;

use self::policy::load_policy;
use super::bundle::{Bundle, Origin};
use super::claim::StatusClaim;
use super::limits::CompiledLimits;
use super::model::{API_VERSION, Header, Mode};
use crate::alert::model::AlertRoutesDoc;
use crate::alert::routes::{self, CompiledRoutes};
use crate::kinds::{DeclaredKinds, KindRef, Role};
use crate::labels::Selector;
use crate::schedule::Schedule;
use crate::script::action::EventType;
use crate::script::engine::{Expr, Script, ScriptEngine};
use crate::script::error::ScriptError;
use crate::script::template::Template;
use crate::util::hash::short_hex;
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
    /// `every` (and `idle`), in milliseconds.
    Every {
        every_ms: i64,
        idle_ms: Option<i64>,
    },
    FromField {
        path: Vec<String>,
        default: Option<Schedule>,
        /// The expressions targets gave, each parsed once.
        parsed: crate::schedule::ParsedSchedules,
    },
}

/// One of a policy's schedules: `spec.schedule` (no name) or an entry
/// of `spec.schedules`.
#[derive(Clone, Debug)]
pub struct Timer {
    pub name: Option<String>,
    pub source: ScheduleSource,
    /// When a new target's first run of it is.
    pub first_run: super::model::FirstRun,
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
    /// What names it in the set, the metrics and Runbook's memory: its
    /// name, or `NAMESPACE/NAME` for a tenant's policy, so that two
    /// tenants may each have a policy of the same name.
    pub id: String,
    /// The YAML file it came from, as errors name it.
    pub file: String,
    pub origin: Origin,
    /// Content hash of the policy and everything it uses.
    pub version: String,
    pub target: KindRef,
    pub selector: Selector,
    /// `spec.annotationSelector`, over the target's annotations.
    pub annotation_selector: Selector,
    /// `spec.deletes`: kinds whose objects the policy may delete though
    /// it did not make them, each with the selector they must match.
    pub deletes: Vec<(KindRef, Selector)>,
    pub kinds: Arc<DeclaredKinds>,
    /// `spec.schedule` alone, or the entries of `spec.schedules`.
    pub schedules: Vec<Timer>,
    pub body: Body,
    pub params: Value,
    pub params_dyn: Dynamic,
    pub alerts: Option<String>,
    /// Where `spec.alerts` names its routes.
    pub alerts_pos: Option<Pos>,
    pub mode: Mode,
    pub limits: CompiledLimits,
    pub priority: i32,
    /// The status fields and conditions it writes.
    pub status: StatusClaim,
    /// A tenant's policy (loaded from a ConfigMap in a namespace other
    /// than the operator's) acts only in that namespace: on its targets
    /// there, with children there, alerts through routes of that
    /// namespace and Secrets read there. `None`: a cluster-wide policy.
    pub tenant: Option<String>,
    /// What its children's pods may ask for (`spec.pods`), and where.
    pub pods: super::model::PodsSpec,
    pub pods_pos: Option<Pos>,
    /// `spec.namespaces`: the other namespaces it may make children in,
    /// by their labels, and where that is declared.
    pub namespaces: Option<(Selector, Option<Pos>)>,
    /// `spec.owns` kinds with `force`: a field of its child somebody else
    /// changed is taken back.
    pub forced: Vec<KindRef>,
    /// `spec.previous`: target fields whose last concluded values a
    /// decision reads back (`ctx.previous`, `ctx.changed`).
    pub previous: Vec<String>,
    /// `spec.sweep`: one decision per fire time over every target it
    /// selects (`ctx.targets`), none per target.
    pub sweep: bool,
    /// `spec.metrics`: what `ctx.metric(name)` reads, asked by the runtime.
    pub metrics: Vec<crate::metric::CompiledMetric>,
}

/// Each kind a policy document declares, with where (`spec.owns[0]`) and
/// at what position.
pub type KindPlaces = Vec<(String, KindRef, Option<Pos>)>;

impl CompiledPolicy {
    /// Whether `spec.deletes` lets the policy delete `object` of `kind`.
    pub fn may_delete(&self, kind: &KindRef, object: &Value) -> bool {
        self.deletes
            .iter()
            .any(|(k, sel)| k == kind && (sel.is_empty() || sel.matches_object(object)))
    }

    /// Whether the policy selects `target`: its labels and annotations
    /// match its selectors.
    pub fn selects(&self, target: &Value) -> bool {
        (self.selector.is_empty() || self.selector.matches_object(target))
            && (self.annotation_selector.is_empty()
                || self.annotation_selector.matches_annotations(target))
    }

    /// Whether its script defines `fn deleted(ctx)`, run once (at most)
    /// when a target it selects is deleted.
    pub fn hears_deletions(&self) -> bool {
        matches!(&self.body, Body::Script { script, .. } if script.has_fn("deleted"))
    }

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

    /// The names of the objects of `kind` the policy reads, when it reads
    /// only those (`spec.readsByName`); `None`: any it declares.
    pub fn names_read(&self, kind: &KindRef) -> Option<&std::collections::BTreeSet<String>> {
        self.kinds.names_of(kind)
    }

    pub fn mutates(&self) -> impl Iterator<Item = &KindRef> {
        self.kinds.with_role(Role::Mutates)
    }

    /// Whether the policy may act on a target in `namespace`: a tenant's
    /// only in its own.
    pub fn acts_in(&self, namespace: &str) -> bool {
        self.tenant.as_deref().is_none_or(|t| t == namespace)
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
    /// The kinds of every policy document read (compiled or not), by file,
    /// for `runbook check`.
    pub declared: Vec<(String, KindPlaces)>,
}

impl Loaded {
    /// Confine a tenant's bundle (a ConfigMap in `namespace`, not the
    /// operator's) to its namespace: its policies act only there (their
    /// names and its routes' are its namespace's), its alert receivers
    /// may read Secrets only there (a `secretKeyRef` naming another
    /// namespace is an error at its place), and its policies' `spec.pods`
    /// may allow no more than `bounds`, the administrator's for tenants.
    pub fn confine_to(&mut self, namespace: &str, bounds: &super::model::PodsSpec) {
        for p in &mut self.policies {
            p.tenant = Some(namespace.to_string());
            p.id = format!("{namespace}/{}", p.name);
            if let Some((_, pos)) = &p.namespaces {
                self.errors.push(LoadError {
                    file: p.file.clone(),
                    pos: *pos,
                    message: format!(
                        "spec.namespaces: a policy ConfigMap in namespace {namespace:?} acts only in {namespace:?} (cluster-wide policies come from the operator's namespace or --policy-dir)"
                    ),
                });
            }
            for m in &p.metrics {
                if let Some(why) = metrics::tenant_refusal(m, namespace) {
                    self.errors.push(LoadError {
                        file: p.file.clone(),
                        pos: m.pos,
                        message: why,
                    });
                }
            }
            for wider in p.pods.beyond(bounds) {
                self.errors.push(LoadError {
                    file: p.file.clone(),
                    pos: p.pods_pos,
                    message: format!(
                        "spec.pods: {wider}: a policy ConfigMap in namespace {namespace:?} may allow its pods only what the administrator allows tenants ({}; runbook run --tenant-pod-bounds)",
                        bounds.describe()
                    ),
                });
            }
        }
        for r in &mut self.routes {
            r.tenant = Some(namespace.to_string());
            r.id = format!("{namespace}/{}", r.name);
            for receiver in r.receivers.values() {
                for target in receiver
                    .kinds
                    .iter()
                    .flat_map(routes::ReceiverKind::targets)
                {
                    let routes::Target::Secret { key, pos } = target else {
                        continue;
                    };
                    if let Some(other) = key.namespace.as_deref().filter(|n| *n != namespace) {
                        self.errors.push(LoadError {
                            file: r.file.clone(),
                            pos: Some(*pos),
                            message: format!(
                                "receiver {:?}: secretKeyRef.namespace {other:?}: a policy ConfigMap in namespace {namespace:?} may read Secrets only in {namespace:?} (cluster-wide policies and their routes come from the operator's namespace or --policy-dir)",
                                receiver.name
                            ),
                        });
                    }
                }
            }
        }
    }
}

/// What loading one bundle carries along: the engine, the bundle, the
/// errors so far, and each script compiled once.
struct Ctx<'a> {
    engine: &'a ScriptEngine,
    bundle: &'a Bundle,
    errors: Vec<LoadError>,
    scripts: BTreeMap<String, Result<Arc<Script>, ()>>,
    declared: Vec<(String, KindPlaces)>,
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
        declared: Vec::new(),
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
    loaded.declared = cx.declared;
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

#[cfg(test)]
pub(crate) mod tests {
    //! Helpers for the parts' tests: load files as one bundle, read the
    //! errors as `file:line:col: message`.
    use super::*;

    pub fn load(files: &[(&str, &str)]) -> Loaded {
        let engine = ScriptEngine::default();
        let bundle = Bundle::new(
            Origin::Inline("test".into()),
            files
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        load_bundle(&engine, &bundle, None)
    }

    /// The errors of loading these files, named as in the bundle.
    pub fn errors_in(files: &[(&str, &str)]) -> Vec<String> {
        let errors = load(files).errors;
        let named = |e: &LoadError| e.to_string().trim_start_matches("test/").to_string();
        errors.iter().map(named).collect()
    }

    /// The errors of a policy `p.yaml` with a script `p.rhai` that works.
    pub fn errors_of(policy: &str) -> Vec<String> {
        errors_in(&[("p.yaml", policy), ("p.rhai", "fn reconcile(ctx) { [] }")])
    }

    #[test]
    fn a_bundle_loads_its_policies_and_routes_and_names_strange_kinds() {
        let routes = "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: default}\nspec:\n  route: {receiver: log}\n  receivers: [{name: log, log: {}}]\n";
        let policy = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  script: p.rhai\n";
        let loaded = load(&[
            ("p.yaml", policy),
            ("p.rhai", "fn reconcile(ctx) { [] }"),
            ("routes.yaml", routes),
        ]);
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        assert_eq!(loaded.policies[0].name, "p");
        assert_eq!(loaded.routes[0].name, "default");
        assert_eq!(loaded.scripts, ["test/p.rhai"]);
        let strange = "apiVersion: runbook.dev/v1alpha1\nkind: Polcy\n";
        assert_eq!(
            errors_in(&[("x.yaml", strange)]),
            ["x.yaml:1:1: unknown kind \"Polcy\": want Policy, AlertRoutes or Scenario"]
        );
        let foreign = "apiVersion: v1\nkind: Policy\n";
        assert_eq!(
            errors_in(&[("x.yaml", foreign)]),
            ["x.yaml:1:1: apiVersion: want runbook.dev/v1alpha1"]
        );
        // Other documents are not ours to load.
        assert!(errors_in(&[("x.yaml", "apiVersion: v1\nkind: ConfigMap\n")]).is_empty());
    }
}
