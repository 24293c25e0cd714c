//! Strict reads: a field a script reads from an object must be there, unless
//! the script says it may be absent.
//!
//! A typo (`db.spec.verison`) would otherwise read as `()`, interpolate to an
//! empty string and reach the cluster as the image `postgres:`. So reading a
//! field of an object (anything `ctx` gives a script) that is absent or null
//! is an error at the position of the read, except where the script marks
//! the read as one that may find nothing:
//!
//! - `x?.field` or `x?["key"]`;
//! - anywhere in the left side of `??` (`x.spec.field ?? 3`);
//! - compared with `()` (`x.spec.field == ()`, `!= ()`);
//! - asked with `in` or `contains` (`"field" in x.spec`), which reads nothing.
//!
//! Which reads are marked is decided once, when a script compiles, from its
//! syntax tree: the positions of the marked reads. Each call runs with that
//! set in a thread-local, where the object getters look.
//!
//! Turning `()` into text is an error too: an interpolation `${x}` of `()`
//! or `to_string(())` is recorded (Rhai formats interpolations without
//! letting a formatter fail) and fails the call when it returns, naming the
//! position of the first one. (`"a" + ()` keeps Rhai's rule and gives
//! `"a"`: Rhai adds a string and `()` below any function a host registers.)

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::sync::Arc;

use rhai::{
    AST, ASTFlags, ASTNode, Engine, Expr, ImmutableString, NativeCallContext, Position, Stmt,
};

/// The positions of the reads a script marks as possibly absent.
#[derive(Clone, Debug, Default)]
pub struct Guards(HashSet<(usize, usize)>);

fn key(pos: Position) -> Option<(usize, usize)> {
    Some((pos.line()?, pos.position().unwrap_or(0)))
}

impl Guards {
    /// Find the marked reads of a compiled script or expression.
    pub fn of(ast: &AST) -> Self {
        let mut out = HashSet::new();
        ast.walk(&mut |nodes: &[ASTNode]| {
            match nodes.last() {
                Some(ASTNode::Expr(expr)) => mark(expr, &mut out),
                // A call standing as a statement (`x.a == ()` as the value
                // of a block) is a statement node of its own.
                Some(ASTNode::Stmt(Stmt::FnCall(call, _))) => compared(call, &mut out),
                _ => {}
            }
            true
        });
        Self(out)
    }

    fn allows(&self, pos: Position) -> bool {
        key(pos).is_some_and(|k| self.0.contains(&k))
    }
}

/// Record what one node marks.
fn mark(expr: &Expr, out: &mut HashSet<(usize, usize)>) {
    match expr {
        // Rhai reports a read at the operator before it or at the field
        // itself (which, depends on the chain): `x?.field` marks both the
        // `?.` and `field`, `x?[k]` the `?[` and `k`.
        Expr::Dot(b, flags, pos) | Expr::Index(b, flags, pos)
            if flags.contains(ASTFlags::NEGATED) =>
        {
            out.extend(key(*pos));
            if matches!(expr, Expr::Index(..)) {
                out.extend(key(b.rhs.position()));
            } else {
                out.extend(leftmost(&b.rhs).and_then(key));
            }
        }
        // Every operand of `??` but the last may be absent.
        Expr::Coalesce(items, _) => {
            if let Some((_, may_be_absent)) = items.split_last() {
                for item in may_be_absent {
                    chain(item, out);
                }
            }
        }
        Expr::FnCall(call, _) => compared(call, out),
        _ => {}
    }
}

/// `x.field == ()` and `x.field != ()` ask whether it is there.
fn compared(call: &rhai::FnCallExpr, out: &mut HashSet<(usize, usize)>) {
    if !matches!(call.name.as_str(), "==" | "!=") {
        return;
    }
    if let [a, b] = call.args.as_slice() {
        if matches!(b, Expr::Unit(_)) {
            chain(a, out);
        }
        if matches!(a, Expr::Unit(_)) {
            chain(b, out);
        }
    }
}

/// Where the first read of a chain is (`field` in `field.a.b`).
fn leftmost(expr: &Expr) -> Option<Position> {
    match expr {
        Expr::Dot(b, ..) | Expr::Index(b, ..) => leftmost(&b.lhs),
        Expr::Property(_, pos) => Some(*pos),
        _ => None,
    }
}

/// Every read along a chain of `.field` and `[key]`, not inside the keys.
fn chain(expr: &Expr, out: &mut HashSet<(usize, usize)>) {
    match expr {
        Expr::Dot(b, _, pos) => {
            out.extend(key(*pos));
            chain(&b.lhs, out);
            chain(&b.rhs, out);
        }
        Expr::Index(b, _, pos) => {
            out.extend(key(*pos));
            out.extend(key(b.rhs.position()));
            chain(&b.lhs, out);
        }
        Expr::Property(_, pos) => out.extend(key(*pos)),
        _ => {}
    }
}

thread_local! {
    /// The marked reads of the call running on this thread.
    static ACTIVE: RefCell<Option<Arc<Guards>>> = const { RefCell::new(None) };
    /// Where the running call first turned `()` into text.
    static UNIT_TEXT: Cell<Option<Position>> = const { Cell::new(None) };
}

/// Run `f` as a strict call with `guards`; nested calls keep their own.
pub fn with<T>(guards: &Arc<Guards>, f: impl FnOnce() -> T) -> (T, Option<Position>) {
    let previous = ACTIVE.with(|a| a.replace(Some(guards.clone())));
    let previous_text = UNIT_TEXT.take();
    let out = f();
    let unit_text = UNIT_TEXT.replace(previous_text);
    ACTIVE.with(|a| *a.borrow_mut() = previous);
    (out, unit_text)
}

/// Whether the read at `pos` may find nothing: a marked read, or a read
/// outside any strict call (a Rust caller reading a view).
pub fn may_be_absent(pos: Position) -> bool {
    ACTIVE.with(|a| a.borrow().as_ref().is_none_or(|g| g.allows(pos)))
}

/// The message for `()` in text.
pub const UNIT_IN_TEXT: &str = "`()` (nothing: an absent field or a missing value) was turned into text; \
     give a default with `??` or check for it first";

/// Register the conversion that refuses `()`.
pub fn register(engine: &mut Engine) {
    engine.register_fn("to_string", |ctx: NativeCallContext, _: ()| {
        let in_call = ACTIVE.with(|a| a.borrow().is_some());
        if in_call && UNIT_TEXT.get().is_none() {
            UNIT_TEXT.set(Some(ctx.call_position()));
        }
        ImmutableString::new()
    });
}

#[cfg(test)]
mod tests {
    use super::super::{ScriptEngine, ScriptError, obj};
    use serde_json::json;
    use std::sync::Arc;

    /// Call `fn f(x) { <body> }` with `x` a view of a small object; the
    /// body starts on line 2, column 1.
    fn run(body: &str) -> Result<String, ScriptError> {
        let engine = ScriptEngine::default();
        let script = engine
            .compile("t.rhai", &format!("fn f(x) {{\n{body}\n}}"))
            .unwrap();
        let x = obj::view(Arc::new(json!({
            "spec": {"version": "16", "labels": {"app": "db"}, "gone": null}
        })));
        engine.call(&script, "f", (x,)).map(|v| v.to_string())
    }

    fn at(err: ScriptError) -> (u32, u32, String) {
        let p = err.pos.expect("a position");
        (p.line, p.col, err.message)
    }

    #[test]
    fn a_misspelt_field_is_an_error_at_the_read_with_the_name_meant() {
        let (line, col, msg) = at(run("x.spec.verison").unwrap_err());
        // At the `.` before the field.
        assert_eq!((line, col), (2, 7), "{msg}");
        assert!(msg.contains(".spec has no field `verison`"), "{msg}");
        assert!(msg.contains("did you mean `version`?"), "{msg}");
        // A null field is as absent as a missing one; a chain stops at the
        // first absent read.
        let (_, col, _) = at(run("x.spec.gone.deeper").unwrap_err());
        assert_eq!(col, 7);
        let (_, col, msg) = at(run("x.spec.labels[\"team\"]").unwrap_err());
        assert_eq!(col, 14, "{msg}");
        assert!(msg.contains("`team`"), "{msg}");
        assert_eq!(run("x.spec.version").unwrap(), "16");
    }

    #[test]
    fn reads_marked_as_possibly_absent_find_nothing_quietly() {
        assert_eq!(run("x.spec?.verison").unwrap(), "");
        assert_eq!(run("x.spec.verison ?? 3").unwrap(), "3");
        assert_eq!(run("x.spec.verison ?? ()").unwrap(), "");
        assert_eq!(run("x.spec.gone?.deeper ?? 3").unwrap(), "3");
        assert_eq!(run("x.spec.verison == ()").unwrap(), "true");
        assert_eq!(run("() != x.spec.gone").unwrap(), "false");
        assert_eq!(run("\"verison\" in x.spec").unwrap(), "false");
        assert_eq!(run("x.spec.labels?[\"team\"]").unwrap(), "");
        assert_eq!(run("x.spec.labels[\"team\"] ?? \"none\"").unwrap(), "none");
        // Maps a script builds are its own business.
        assert_eq!(run("let m = #{a: 1}; m.b == ()").unwrap(), "true");
    }

    /// Fields of a user's own kind (names no Kubernetes kind has) read
    /// with `.field` as with `["field"]`, and a misspelt one fails at its
    /// `.` like any other, in a script and in an expression alike.
    #[test]
    fn a_users_own_field_names_read_as_any_other() {
        let engine = ScriptEngine::default();
        let script = engine
            .compile(
                "t.rhai",
                "fn f(x) {\n`${x.spec.warpFactor}/${x.spec[\"warpFactor\"]}/${x.spec?.shieldsUp ?? \"none\"}`\n}",
            )
            .unwrap();
        let x = obj::view(Arc::new(json!({"spec": {"warpFactor": 9}})));
        let out = engine.call(&script, "f", (x.clone(),)).unwrap();
        assert_eq!(out.to_string(), "9/9/none");

        let expr = engine
            .compile_expr(
                "p.yaml",
                "it.spec.warpFactr > 1",
                crate::util::yaml::Pos { line: 4, col: 12 },
                None,
            )
            .unwrap();
        let mut scope = rhai::Scope::new();
        scope.push_dynamic("it", x);
        let err = engine.eval(&expr, &mut scope).unwrap_err();
        let p = err.pos.expect("a position");
        // `it.spec.` puts the `.` before the field at column 8 of the
        // expression, which starts at column 12 of line 4.
        assert_eq!((p.line, p.col), (4, 19), "{}", err.message);
        assert!(
            err.message.contains("did you mean `warpFactor`?"),
            "{}",
            err.message
        );
    }

    #[test]
    fn nothing_turned_into_text_is_an_error_at_its_place() {
        let (line, col, msg) = at(run("let v = x.spec?.verison;\n`postgres:${v}`").unwrap_err());
        assert_eq!((line, col), (3, 12), "{msg}");
        assert!(msg.contains("turned into text"), "{msg}");
        let (line, _, _) = at(run("let v = ();\nv.to_string()").unwrap_err());
        assert_eq!(line, 3);
        assert_eq!(run("`postgres:${x.spec.version}`").unwrap(), "postgres:16");
        // Printing nothing is allowed: it is how a script shows a value.
        assert_eq!(run("print(()); 1").unwrap(), "1");
    }
}
