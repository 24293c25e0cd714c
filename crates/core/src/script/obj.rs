//! `Obj`: a read-only view of a cached object, or of a map inside one.
//!
//! Scripts read objects far more than they change them, and Rhai copies a
//! map every time it is assigned or passed. An `Obj` shares the cached JSON
//! instead: reading `ev.spec.threshold` walks the JSON and copies only the
//! number. Arrays come out as ordinary Rhai arrays (of `Obj`s and scalars),
//! so `for`, `filter`, `push` and the rest work. Writing to an `Obj` is an
//! error that says to take a copy with `to_map(x)`; that keeps a script from
//! changing the cache every other reconcile reads.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use rhai::{
    AST, ASTNode, Array, Dynamic, Engine, EvalAltResult, INT, ImmutableString, Module,
    NativeCallContext, Position,
};
use serde_json::Value;

use crate::util::hash::{Fnv64, hash_value};

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

    /// The JSON this view shows, taken as a whole (converted, compared,
    /// printed): a decision that does so depends on all of it.
    pub fn value(&self) -> &Value {
        self.note(None);
        self.json()
    }

    /// The JSON this view shows, for a read the caller notes itself.
    fn json(&self) -> &Value {
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

    /// The value under `key`, written down as read when this view is of
    /// the target a decision is being recorded for.
    fn lookup(&self, key: &str) -> Option<&Value> {
        let found = self.json().get(key);
        self.note(Some((key, found)));
        found
    }

    /// Write down, when this view is of the target a decision is being
    /// recorded for, what of it is read: `key` under this view (with what
    /// was found there), or (`None`) the view as a whole. Views two or
    /// more keys deep are inside a field already written down whole, and
    /// note nothing.
    fn note(&self, read: Option<(&str, Option<&Value>)>) {
        if self.path.len() > 1 {
            return;
        }
        let watched = WATCHED.get();
        if watched.is_null() || !std::ptr::eq(watched, Arc::as_ptr(&self.root)) {
            return;
        }
        READS.with_borrow_mut(|r| match (self.path.first(), read) {
            (None, None) => r.whole = true,
            // A map read at the top is a view the script reads on from:
            // its keys are noted as they are read; here only whether it is
            // there (and a map).
            (None, Some((k, Some(Value::Object(_))))) => r.add(k, Some("")),
            (None, Some((k, _))) => r.add(k, None),
            (Some(Seg::Key(top)), None) => r.add(top, None),
            (Some(Seg::Key(top)), Some((k, _))) => r.add(top, Some(k)),
            // The elements of an array at the top were noted with it.
            (Some(Seg::Index(_)), _) => {}
        });
    }

    /// The value under `key`, as a Rhai value; `()` when absent.
    pub fn get(&self, key: &str) -> Dynamic {
        match self.lookup(key) {
            None => Dynamic::UNIT,
            Some(v) => wrap(v, &|| self.child(Seg::Key(key.into()))),
        }
    }

    /// A script's read of `key`: an error at the read when the field is
    /// absent (or null) and the script did not mark the read as one that
    /// may find nothing (see `strict`).
    fn read(&self, ctx: &NativeCallContext, key: &str) -> Result<Dynamic, Box<EvalAltResult>> {
        let pos = ctx.call_position();
        match self.lookup(key) {
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
            .json()
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

/// What a decision read of its own target, so that a later change to
/// fields it did not read (its own status write coming back, another
/// policy's status fields, a label) need not be decided again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetReads {
    /// The target was taken as a whole (converted, compared, printed,
    /// handed to a helper): any change may matter.
    pub whole: bool,
    /// The script asked for the time or the schedule (`ctx.now`,
    /// `ctx.due`, ...): the same target may be decided differently later.
    pub clock: bool,
    /// Fields read, by the key at the top and, for a map there, the key
    /// under it (`Some("")`: only whether the map is there), sorted.
    pub fields: Vec<(String, Option<String>)>,
}

impl TargetReads {
    fn add(&mut self, top: &str, under: Option<&str>) {
        let found = self
            .fields
            .binary_search_by(|(t, u)| (t.as_str(), u.as_deref()).cmp(&(top, under)));
        if let Err(at) = found {
            self.fields
                .insert(at, (top.to_string(), under.map(str::to_string)));
        }
    }

    /// A dotted field path read (its first two fields, as reads are kept).
    pub fn note_path(&mut self, path: &str) {
        let mut segs = path.split('.');
        if let Some(top) = segs.next() {
            self.add(top, segs.next());
        }
    }

    /// Whether a later decision on the same inputs could differ from the
    /// one these reads were made for only through the fields read.
    pub fn fields_only(&self) -> bool {
        !self.whole && !self.clock
    }

    /// A hash of what these reads found in `target` (with its uid and
    /// generation, which the runtime's own writes depend on): equal hashes
    /// mean the reads would find the same again.
    pub fn fingerprint(&self, target: &Value) -> u64 {
        use std::hash::Hasher;
        let mut h = Fnv64::default();
        let meta = &target["metadata"];
        hash_value(&meta["uid"], &mut h);
        hash_value(&meta["generation"], &mut h);
        for (top, under) in &self.fields {
            h.write(top.as_bytes());
            h.write_u8(0xff);
            let v = target.get(top.as_str());
            match under.as_deref() {
                None => match v {
                    Some(v) => hash_value(v, &mut h),
                    None => h.write_u8(0),
                },
                Some(key) => {
                    h.write(key.as_bytes());
                    h.write_u8(0xfe);
                    match v {
                        Some(Value::Object(m)) => {
                            h.write_u8(1);
                            if !key.is_empty() {
                                match m.get(key) {
                                    Some(v) => hash_value(v, &mut h),
                                    None => h.write_u8(0),
                                }
                            }
                        }
                        Some(other) => {
                            h.write_u8(2);
                            hash_value(other, &mut h);
                        }
                        None => h.write_u8(0),
                    }
                }
            }
        }
        h.finish()
    }
}

thread_local! {
    /// The target whose reads are being recorded on this thread, if any.
    static WATCHED: Cell<*const Value> = const { Cell::new(std::ptr::null()) };
    static READS: RefCell<TargetReads> = RefCell::new(TargetReads::default());
}

/// Run `f` (a decision) recording what it reads of `target`.
pub fn recording<T>(target: &Arc<Value>, f: impl FnOnce() -> T) -> (T, TargetReads) {
    let outer_target = WATCHED.replace(Arc::as_ptr(target));
    let outer = READS.take();
    let out = f();
    WATCHED.set(outer_target);
    let reads = READS.replace(outer);
    (out, reads)
}

/// The script asked for the time or the schedule.
pub fn note_clock() {
    if !WATCHED.get().is_null() {
        READS.with_borrow_mut(|r| r.clock = true);
    }
}

/// Getters for views of every field a script reads as `.field`, to add to
/// its compiled form.
///
/// Rhai reads `x.field` of a custom type through a getter named for the
/// field; where there is none it formats an error, drops it and goes to
/// the indexer: a few thousand instructions on every read of a field of
/// an object. The names a script reads are known once it compiles, so it
/// carries a getter for each (they do what the indexer does).
pub fn field_getters(ast: &AST) -> AST {
    let mut names = std::collections::BTreeSet::new();
    ast.walk(&mut |nodes: &[ASTNode]| {
        if let Some(ASTNode::Expr(rhai::Expr::Property(p, _))) = nodes.last() {
            names.insert(p.2.clone());
        }
        true
    });
    let mut module = Module::new();
    for name in names {
        let getter = name.clone();
        module.set_getter_fn(
            getter.as_str(),
            move |ctx: NativeCallContext, o: &mut Obj| -> Result<Dynamic, Box<EvalAltResult>> {
                o.read(&ctx, &name).map_err(at_dot)
            },
        );
    }
    AST::new_from_module(module)
}

/// A failed `.field` read through a getter, placed where Rhai places one
/// through the indexer: at the `.` before the field.
fn at_dot(mut err: Box<EvalAltResult>) -> Box<EvalAltResult> {
    if let EvalAltResult::ErrorRuntime(_, pos) = err.as_mut()
        && let (Some(line), Some(col)) = (pos.line(), pos.position())
        && col > 1
    {
        *pos = Position::new(line as u16, col as u16 - 1);
    }
    err
}

/// Whether a script value is the JSON value `v` (as a view of it, or as
/// equal plain values).
fn same(d: &Dynamic, v: &Value) -> bool {
    if let Some(o) = d.read_lock::<Obj>() {
        return o.json() == v;
    }
    match v {
        Value::Null => d.is_unit(),
        Value::Bool(b) => d.as_bool() == Ok(*b),
        Value::String(s) => d
            .read_lock::<ImmutableString>()
            .is_some_and(|x| x.as_str() == s),
        Value::Number(n) => match (n.as_i64(), d.as_int(), n.as_f64(), d.as_float()) {
            (Some(a), Ok(b), _, _) => a == b,
            (_, _, Some(a), Ok(b)) => a == b,
            _ => false,
        },
        Value::Array(xs) => d.read_lock::<Array>().is_some_and(|ys| {
            xs.len() == ys.len() && xs.iter().zip(ys.iter()).all(|(x, y)| same(y, x))
        }),
        Value::Object(m) => d.read_lock::<rhai::Map>().is_some_and(|ys| {
            m.len() == ys.len()
                && m.iter()
                    .all(|(k, x)| ys.get(k.as_str()).is_some_and(|y| same(y, x)))
        }),
    }
}

const READ_ONLY: &str = "objects from ctx are read-only; take a copy you can change with to_map(x)";

/// Register `Obj` with the engine.
pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<Obj>("object");
    engine.register_indexer_get(|ctx: NativeCallContext, o: &mut Obj, key: &str| o.read(&ctx, key));
    engine.register_indexer_set(
        |ctx: NativeCallContext,
         o: &mut Obj,
         key: &str,
         value: Dynamic|
         -> Result<(), Box<EvalAltResult>> {
            // A method called on a field (`o.spec.schedule.split(" ")`)
            // has Rhai write the field back after the call: the same value
            // changes nothing, and is let through.
            if same(&value, o.lookup(key).unwrap_or(&Value::Null)) {
                return Ok(());
            }
            Err(Box::new(EvalAltResult::ErrorRuntime(
                format!("cannot set {key:?}: {READ_ONLY}").into(),
                ctx.call_position(),
            )))
        },
    );
    engine.register_fn("contains", |o: &mut Obj, key: &str| {
        o.lookup(key).is_some_and(|v| !v.is_null())
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

#[cfg(test)]
mod method_tests {
    use super::*;
    use crate::script::ScriptEngine;
    use serde_json::json;

    fn run(body: &str) -> Result<Dynamic, String> {
        let engine = ScriptEngine::default();
        let script = engine
            .compile("t.rhai", &format!("fn f(t) {{ {body} }}"))
            .expect("compiles");
        let t = view(Arc::new(
            json!({"spec": {"crontab": "*/5 * * * *", "tags": ["a", "b"]}}),
        ));
        engine.call(&script, "f", (t,)).map_err(|e| e.to_string())
    }

    /// A method on a field reads it; Rhai's write-back of the unchanged
    /// value is let through, and a real change is still refused.
    #[test]
    fn methods_on_fields_read_them_and_changes_are_refused() {
        let parts = run(r#"t.spec.crontab.split(" ")"#).unwrap().cast::<Array>();
        assert_eq!(parts.len(), 5);
        assert_eq!(run("t.spec.tags.len()").unwrap().as_int().unwrap(), 2);
        let err = run("t.spec.tags.push(\"c\"); 1").unwrap_err();
        assert!(err.contains("cannot set \"tags\""), "{err}");
        let err = run("t.spec.crontab = \"x\"; 1").unwrap_err();
        assert!(err.contains("read-only"), "{err}");
    }
}

#[cfg(test)]
mod reads_tests {
    use super::*;
    use crate::script::ScriptEngine;
    use serde_json::json;

    /// What `f(target)` in `body` reads of the target.
    fn reads_of(body: &str, target: &Value) -> TargetReads {
        let engine = ScriptEngine::default();
        let script = engine
            .compile("t.rhai", &format!("fn f(t, other) {{ {body} }}"))
            .expect("compiles");
        let root = Arc::new(target.clone());
        let other = view(Arc::new(target.clone()));
        let (out, reads) = recording(&root, || {
            engine.call(&script, "f", (view(root.clone()), other))
        });
        let _ = out.expect("runs");
        reads
    }

    fn target() -> Value {
        json!({"metadata": {"name": "w", "uid": "u1", "generation": 1, "labels": {"a": "b"}},
               "spec": {"size": 3, "tags": ["x"]}, "status": {"phase": "Ready"}})
    }

    fn fields(r: &TargetReads) -> Vec<(&str, Option<&str>)> {
        r.fields
            .iter()
            .map(|(t, u)| (t.as_str(), u.as_deref()))
            .collect()
    }

    #[test]
    fn the_fields_a_script_reads_of_its_target_are_recorded_two_keys_deep() {
        let r = reads_of(
            r#"let n = t.metadata.name; let s = t.spec.size; let x = t.spec.tags[0];
               let p = t.status?.missing; "size" in t.spec; [n, s, x, p]"#,
            &target(),
        );
        assert!(r.fields_only(), "{r:?}");
        assert_eq!(
            fields(&r),
            [
                ("metadata", Some("")),
                ("metadata", Some("name")),
                ("spec", Some("")),
                ("spec", Some("size")),
                ("spec", Some("tags")),
                ("status", Some("")),
                ("status", Some("missing")),
            ]
        );
    }

    #[test]
    fn taking_the_target_whole_is_recorded() {
        assert!(reads_of("to_map(t)", &target()).whole);
        assert!(reads_of("t.to_string()", &target()).whole);
        let spec = reads_of("to_map(t.spec)", &target());
        assert!(!spec.whole);
        assert_eq!(fields(&spec), [("spec", None), ("spec", Some(""))]);
        // Another object is not the target, however alike.
        let other = reads_of("to_map(other); other.status.phase", &target());
        assert_eq!(other, TargetReads::default());
        assert!(reads_of("to_map(t.metadata); 1", &target()).fields_only());
    }

    #[test]
    fn the_fingerprint_moves_only_with_what_was_read() {
        let r = reads_of("[t.metadata.name, t.spec.size, t.status?.gone]", &target());
        let before = r.fingerprint(&target());
        let mut echo = target();
        echo["status"]["phase"] = json!("Done");
        echo["status"]["decisions"] = json!([{"policy": "p"}]);
        echo["metadata"]["resourceVersion"] = json!("42");
        echo["metadata"]["labels"]["c"] = json!("d");
        assert_eq!(r.fingerprint(&echo), before, "nothing read changed");
        for (path, value) in [
            ("/spec/size", json!(4)),
            ("/metadata/generation", json!(2)),
            ("/metadata/uid", json!("u2")),
            ("/status/gone", json!("here")),
        ] {
            let mut changed = target();
            *changed.pointer_mut(path).unwrap_or(&mut Value::Null) = value.clone();
            if changed.pointer(path).is_none() {
                changed["status"]["gone"] = value;
            }
            assert_ne!(r.fingerprint(&changed), before, "{path} changed");
        }
        // A map read from that is no longer there, or no longer a map.
        let mut gone = target();
        gone.as_object_mut().unwrap().remove("status");
        assert_ne!(r.fingerprint(&gone), before);
        gone["status"] = json!("text");
        assert_ne!(r.fingerprint(&gone), before);
    }
}
