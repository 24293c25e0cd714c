//! The one shared, hardened Rhai engine.
//!
//! Built once per process (building one costs as much as ~50 decisions),
//! hardened in one place, and shared behind an `Arc`. Every call runs under
//! a wall-clock budget enforced through `on_progress`, on top of operation,
//! call-depth, expression-depth and size limits, so a runaway script fails
//! its own reconcile and nothing else.

use std::collections::BTreeSet;
use std::time::Duration;

use rhai::{AST, Caches, Dynamic, Engine, EvalContext, FuncArgs, OptimizationLevel, Scope};

use std::sync::{Arc, Mutex};

use super::error::{FILE_START, ScriptError, ScriptErrorKind};
use super::stop;
use super::strict::{self, Guards};
use crate::util::yaml::Pos;

/// The limits every script call runs under.
#[derive(Clone, Debug)]
pub struct ScriptLimits {
    /// Wall-clock budget per call.
    pub wall_time: Duration,
    /// Operations per call (a backstop under the wall-clock budget).
    pub max_operations: u64,
    pub max_call_levels: usize,
    pub max_expr_depth: usize,
    pub max_fn_expr_depth: usize,
    /// Bytes.
    pub max_string_size: usize,
    pub max_array_size: usize,
    pub max_map_size: usize,
    pub max_variables: usize,
    /// Bytes a call may hold at once, all its values together (enforced
    /// where the binary's counting allocator runs: `runbook`).
    pub max_memory: usize,
}

impl Default for ScriptLimits {
    fn default() -> Self {
        Self {
            wall_time: Duration::from_millis(20),
            max_operations: 5_000_000,
            max_call_levels: 48,
            max_expr_depth: 64,
            max_fn_expr_depth: 48,
            max_string_size: 1 << 20,
            max_array_size: 100_000,
            max_map_size: 20_000,
            max_variables: 1_000,
            max_memory: 32 << 20,
        }
    }
}

/// Function-resolution caches kept per script: as many as calls into one
/// script usually run at once.
const RESOLUTION_CACHES_KEPT: usize = 8;

/// A compiled script: one per policy version.
#[derive(Clone, Debug)]
pub struct Script {
    pub file: String,
    pub ast: AST,
    functions: BTreeSet<String>,
    /// Where each function is defined.
    fn_positions: std::collections::BTreeMap<String, Pos>,
    origin: Pos,
    guards: Arc<Guards>,
    /// Rhai's function-resolution caches for calls into this script, kept
    /// between calls (Rhai starts each call with an empty one, so every
    /// decision resolved each function it calls again). One per call
    /// running at once; valid for as long as the script and the engine's
    /// functions are the same, which is the script's whole life.
    resolved: Arc<Mutex<Vec<Caches>>>,
}

impl Script {
    /// Whether the script defines a function of that name.
    pub fn has_fn(&self, name: &str) -> bool {
        self.functions.contains(name)
    }

    /// How many parameters each function of that name takes (Rhai
    /// functions may be defined once per count).
    pub fn arities(&self, name: &str) -> Vec<usize> {
        self.ast
            .iter_functions()
            .filter(|f| f.name == name)
            .map(|f| f.params.len())
            .collect()
    }

    /// Where a function is defined, for errors about what it returned.
    pub fn fn_pos(&self, name: &str) -> Option<Pos> {
        self.fn_positions.get(name).copied()
    }

    /// The first loop (`loop`, `while`, `do`, `for`) in the body of
    /// function `name`, if it has one.
    pub fn loop_in(&self, name: &str) -> Option<Pos> {
        let start = self.fn_pos(name)?;
        let end = self
            .fn_positions
            .values()
            .map(|p| (p.line, p.col))
            .filter(|p| *p > (start.line, start.col))
            .min();
        let mut first: Option<Pos> = None;
        self.ast.walk(&mut |nodes: &[rhai::ASTNode]| {
            if let Some(rhai::ASTNode::Stmt(
                s @ (rhai::Stmt::While(..) | rhai::Stmt::Do(..) | rhai::Stmt::For(..)),
            )) = nodes.last()
                && let Some(p) = super::error::pos_of(s.position(), self.origin)
            {
                let at = (p.line, p.col);
                let inside = at > (start.line, start.col) && end.is_none_or(|e| at < e);
                if inside && first.is_none_or(|f| at < (f.line, f.col)) {
                    first = Some(p);
                }
            }
            true
        });
        first
    }
}

/// A compiled expression (`readyWhen`, a template interpolation).
#[derive(Clone, Debug)]
pub struct Expr {
    pub file: String,
    pub ast: AST,
    origin: Pos,
    guards: Arc<Guards>,
}

/// The shared engine.
pub struct ScriptEngine {
    engine: Engine,
    limits: ScriptLimits,
}

impl std::fmt::Debug for ScriptEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptEngine")
            .field("limits", &self.limits)
            .finish()
    }
}

/// Names every expression may use; declared up front so strict-variable
/// checking catches typos when a policy loads, not when it runs.
pub const EXPR_VARIABLES: &[&str] = &["it", "resource", "ctx", "params", "run"];

impl ScriptEngine {
    pub fn new(limits: ScriptLimits) -> Self {
        let mut engine = Engine::new();
        engine
            // Scripts run as written: Rhai's optimizer drops the `()` of
            // `x.field ?? ()`, and with it the mark of a read that may
            // find nothing (see `strict`).
            .set_optimization_level(OptimizationLevel::None)
            .set_strict_variables(true)
            // Runbook stops a call at its limits itself (`stop`); Rhai's
            // own, a little further out, are the backstop.
            .set_max_operations(limits.max_operations + stop::GRACE)
            .set_max_call_levels(limits.max_call_levels + stop::DEPTH_GRACE)
            .set_max_expr_depths(limits.max_expr_depth, limits.max_fn_expr_depth)
            .set_max_string_size(limits.max_string_size)
            .set_max_array_size(limits.max_array_size)
            .set_max_map_size(limits.max_map_size)
            .set_max_variables(limits.max_variables);
        engine.disable_symbol("eval");
        // No string interner: once its table is full, every new string (the
        // name of each of thousands of targets) made it scan the whole
        // table under a lock shared by every reconcile.
        engine.set_max_strings_interned(0);
        let max_operations = limits.max_operations;
        engine.on_progress(move |ops| stop::progress(ops, max_operations));
        let max_call_levels = limits.max_call_levels;
        // Marked deprecated only as "volatile": Rhai is pinned to one
        // version in Cargo.toml for this and the `internals` it uses.
        #[allow(deprecated)]
        engine.on_var(move |_, _, context| stop::on_var(&context, max_call_levels));
        engine.on_print(|text| tracing::info!(target: "runbook::script", "{text}"));
        engine.on_debug(|text, source, pos| {
            tracing::debug!(
                target: "runbook::script",
                script = source.unwrap_or("?"),
                line = pos.line().unwrap_or(0),
                "{text}"
            )
        });
        super::obj::register(&mut engine);
        super::convert::register(&mut engine);
        strict::register(&mut engine);
        super::helpers::register(&mut engine);
        super::ctx::register(&mut engine);
        super::action::register(&mut engine);
        Self { engine, limits }
    }

    pub fn limits(&self) -> &ScriptLimits {
        &self.limits
    }

    pub fn rhai(&self) -> &Engine {
        &self.engine
    }

    /// The engine, to register more functions on (a program embedding
    /// Runbook's engine). Register before compiling: a script is checked
    /// against the functions there are when it loads.
    pub fn rhai_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Calls in a script of functions that exist nowhere: not defined in
    /// it or in `more` (a steps policy's `functions:` file), not a
    /// helper, action or standard function. Each with its position, and
    /// the known function nearest its name.
    pub fn unknown_calls(
        &self,
        script: &Script,
        more: Option<&AST>,
    ) -> Vec<(String, Pos, Option<String>)> {
        // Names the language compiles itself rather than calls.
        const KEYWORDS: &[&str] = &[
            "Fn",
            "call",
            "curry",
            "type_of",
            "print",
            "debug",
            "is_def_var",
            "is_def_fn",
            "is_shared",
            "eval",
            "throw",
        ];
        let mut known: BTreeSet<String> = self
            .engine
            .collect_fn_metadata(None, |f| Some(f.metadata.name.to_string()), true)
            .into_iter()
            .collect();
        known.extend(script.functions.iter().cloned());
        if let Some(m) = more {
            known.extend(m.iter_functions().map(|f| f.name.to_string()));
        }
        let mut out = Vec::new();
        script.ast.walk(&mut |path: &[rhai::ASTNode]| {
            if let Some(rhai::ASTNode::Expr(rhai::Expr::FnCall(call, pos))) = path.last() {
                let name = call.name.as_str();
                let plain = call.op_token.is_none()
                    && name.chars().all(|c| c.is_alphanumeric() || c == '_');
                if plain && !KEYWORDS.contains(&name) && !known.contains(name) {
                    let near =
                        crate::util::suggest::closest(name, known.iter().map(String::as_str));
                    out.push((name.to_string(), pos_of(*pos), near.map(str::to_string)));
                }
            }
            true
        });
        out
    }

    /// Properties read on `ctx` that it does not have (`ctx.dew`), each
    /// with its position and the property nearest its name. A method
    /// call on it is a function, which `unknown_calls` checks.
    pub fn unknown_ctx_properties(&self, script: &Script) -> Vec<(String, Pos, Option<String>)> {
        /// The property a chain on `ctx` reads first.
        fn first(e: &rhai::Expr) -> Option<(&str, rhai::Position)> {
            match e {
                rhai::Expr::Property(p, pos) => Some((p.2.as_str(), *pos)),
                rhai::Expr::Dot(b, ..) | rhai::Expr::Index(b, ..) => first(&b.lhs),
                _ => None,
            }
        }
        let mut out = Vec::new();
        script.ast.walk(&mut |path: &[rhai::ASTNode]| {
            if let Some(rhai::ASTNode::Expr(rhai::Expr::Dot(b, ..))) = path.last()
                && let rhai::Expr::Variable(v, ..) = &b.lhs
                && v.1.as_str() == "ctx"
                && let Some((name, pos)) = first(&b.rhs)
                && !super::ctx::PROPERTIES.contains(&name)
            {
                let near =
                    crate::util::suggest::closest(name, super::ctx::PROPERTIES.iter().copied());
                out.push((name.to_string(), pos_of(pos), near.map(str::to_string)));
            }
            true
        });
        out
    }

    /// Compile a script file.
    pub fn compile(&self, file: &str, text: &str) -> Result<Script, ScriptError> {
        let mut ast = self
            .engine
            .compile(text)
            .map_err(|e| ScriptError::from_parse(file, &e, FILE_START))?;
        ast += super::obj::field_getters(&ast);
        ast.set_source(file);
        let functions: BTreeSet<String> =
            ast.iter_functions().map(|f| f.name.to_string()).collect();
        let mut fn_positions = std::collections::BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if let Some(rest) = trimmed
                .strip_prefix("fn ")
                .or_else(|| trimmed.strip_prefix("private fn "))
            {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let col = (line.len() - trimmed.len()) as u32 + 1;
                fn_positions.entry(name).or_insert(Pos {
                    line: i as u32 + 1,
                    col,
                });
            }
        }
        Ok(Script {
            file: file.to_string(),
            guards: Arc::new(Guards::of(&ast)),
            ast,
            functions,
            fn_positions,
            origin: FILE_START,
            resolved: Arc::default(),
        })
    }

    /// Compile an expression found at `origin` in `file`. `functions`, when
    /// given, is a script whose functions the expression may call.
    pub fn compile_expr(
        &self,
        file: &str,
        text: &str,
        origin: Pos,
        functions: Option<&AST>,
    ) -> Result<Expr, ScriptError> {
        let mut scope = Scope::new();
        for name in EXPR_VARIABLES {
            scope.push_dynamic(*name, Dynamic::UNIT);
        }
        let mut ast = self
            .engine
            .compile_expression_with_scope(&scope, text)
            .map_err(|e| ScriptError::from_parse(file, &e, origin))?;
        // The functions script was compiled with its own getters.
        ast += super::obj::field_getters(&ast);
        if let Some(f) = functions {
            ast = f.merge(&ast);
        }
        ast.set_source(file);
        Ok(Expr {
            file: file.to_string(),
            guards: Arc::new(Guards::of(&ast)),
            ast,
            origin,
        })
    }

    /// Call a script function under the budget.
    pub fn call(
        &self,
        script: &Script,
        name: &str,
        args: impl FuncArgs,
    ) -> Result<Dynamic, ScriptError> {
        let mut values = Vec::new();
        args.parse(&mut values);
        let mut caches = script
            .resolved
            .lock()
            .ok()
            .and_then(|mut pool| pool.pop())
            .unwrap_or_default();
        let out = self.with_budget(&script.guards, || {
            let mut global = self.engine.new_global_runtime_state();
            global.source = script.ast.source().map(rhai::ImmutableString::from);
            global.lib.push(script.ast.shared_lib().clone());
            let mut scope = Scope::new();
            let mut args: Vec<&mut Dynamic> = values.iter_mut().collect();
            EvalContext::new(&self.engine, &mut global, &mut caches, &mut scope, None)
                .call_fn_raw(name, false, false, &mut args)
                .or_else(|err| match *err {
                    rhai::EvalAltResult::Exit(out, ..) => Ok(out),
                    // The call itself, as Rhai's own `call_fn` leaves it.
                    rhai::EvalAltResult::ErrorInFunctionCall(called, _, inner, _)
                        if called == name =>
                    {
                        Err(inner)
                    }
                    _ => Err(err),
                })
        });
        if let Ok(mut pool) = script.resolved.lock()
            && pool.len() < RESOLUTION_CACHES_KEPT
        {
            pool.push(caches);
        }
        out.map_err(|e| {
            let mut err = ScriptError::from_eval(
                &script.file,
                &e,
                script.origin,
                self.limits.wall_time.as_millis(),
            );
            // Limits can trip where Rhai keeps no position. A script out of
            // time is almost always in a loop: point at the loop of the
            // function (or, failing that, at the function).
            if err.pos.is_none() {
                match script
                    .loop_in(name)
                    .filter(|_| err.kind == ScriptErrorKind::Timeout)
                {
                    Some(at) => {
                        err.pos = Some(at);
                        err.message = format!("{} (in a loop of fn {name})", err.message);
                    }
                    None => {
                        err.pos = script.fn_pos(name);
                        err.message = format!("{} (in fn {name})", err.message);
                    }
                }
            }
            err
        })
    }

    /// Evaluate an expression with the given variables.
    pub fn eval(&self, expr: &Expr, scope: &mut Scope) -> Result<Dynamic, ScriptError> {
        self.with_budget(&expr.guards, || {
            self.engine.eval_ast_with_scope::<Dynamic>(scope, &expr.ast)
        })
        .map_err(|e| {
            ScriptError::from_eval(
                &expr.file,
                &e,
                expr.origin,
                self.limits.wall_time.as_millis(),
            )
        })
    }

    /// Run one strict call under the wall-clock budget. `()` turned into
    /// text anywhere in the call fails it, at the first place it happened.
    fn with_budget<T>(
        &self,
        guards: &Arc<Guards>,
        f: impl FnOnce() -> Result<T, Box<rhai::EvalAltResult>>,
    ) -> Result<T, Box<rhai::EvalAltResult>> {
        let budget = stop::Budget::enter(self.limits.wall_time, self.limits.max_memory);
        let (out, unit_text) = strict::with(guards, f);
        drop(budget);
        match (out, unit_text) {
            (Ok(_), Some(pos)) => Err(Box::new(rhai::EvalAltResult::ErrorRuntime(
                strict::UNIT_IN_TEXT.into(),
                pos,
            ))),
            (out, _) => out,
        }
    }
}

impl Default for ScriptEngine {
    fn default() -> Self {
        Self::new(ScriptLimits::default())
    }
}

/// Whether an error is a limit or timeout (the script is at fault, not the data).
pub fn is_containment(err: &ScriptError) -> bool {
    matches!(err.kind, ScriptErrorKind::Timeout | ScriptErrorKind::Limit)
}

/// Where a Rhai position is, as file positions are said (1-based).
fn pos_of(p: rhai::Position) -> Pos {
    Pos {
        line: p.line().unwrap_or(1) as u32,
        col: p.position().unwrap_or(1) as u32,
    }
}
