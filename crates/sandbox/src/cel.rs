//! CEL, the language of CRD validation rules (`x-kubernetes-validations`),
//! as far as validation rules use it: literals, `self` and `oldSelf`, field
//! selection and indexing, `has()`, the operators, the conditional, the
//! macros `all`, `exists`, `exists_one`, `map` and `filter`, and the string,
//! list and regex functions Kubernetes adds (`matches`, `find`, `findAll`,
//! `split`, `startsWith`, `size`, `int`, `string`, ...).
//!
//! An expression outside that subset does not compile here; the sandbox
//! then leaves the rule unenforced (a real API server would enforce it), so
//! `compile` is what a test calls to know a CRD's rules are all understood.
//! Evaluation never panics: a type mismatch, a missing key or an overflow
//! is an evaluation error, as it is for the API server.

use std::collections::BTreeMap;

use serde_json::Value;

/// A CEL value.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Null,
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(String),
    List(Vec<Val>),
    Map(BTreeMap<String, Val>),
}

impl Val {
    pub fn from_json(v: &Value) -> Val {
        match v {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Val::Int(i),
                None => Val::Double(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Val::Str(s.clone()),
            Value::Array(a) => Val::List(a.iter().map(Val::from_json).collect()),
            Value::Object(m) => Val::Map(
                m.iter()
                    .map(|(k, v)| (k.clone(), Val::from_json(v)))
                    .collect(),
            ),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Val::Null => "null_type",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Double(_) => "double",
            Val::Str(_) => "string",
            Val::List(_) => "list",
            Val::Map(_) => "map",
        }
    }

    fn num(&self) -> Option<f64> {
        match self {
            Val::Int(i) => Some(*i as f64),
            Val::Double(d) => Some(*d),
            _ => None,
        }
    }

    /// CEL equality: numbers compare across int and double.
    fn equals(&self, other: &Val) -> bool {
        match (self, other) {
            (Val::List(a), Val::List(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.equals(y))
            }
            (Val::Map(a), Val::Map(b)) => {
                a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| v.equals(w)))
            }
            (a, b) => match (a.num(), b.num()) {
                (Some(x), Some(y)) => x == y,
                _ => a == b,
            },
        }
    }

    fn shown(&self) -> String {
        match self {
            Val::Null => "null".into(),
            Val::Bool(b) => b.to_string(),
            Val::Int(i) => i.to_string(),
            Val::Double(d) => d.to_string(),
            Val::Str(s) => s.clone(),
            Val::List(l) => {
                let items: Vec<String> = l.iter().map(Val::shown).collect();
                format!("[{}]", items.join(", "))
            }
            Val::Map(m) => {
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", v.shown()))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Macro {
    All,
    Exists,
    ExistsOne,
    Map,
    Filter,
}

/// A compiled expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Lit(Val),
    Ident(String),
    Field(Box<Expr>, String),
    Has(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    Call(Option<Box<Expr>>, String, Vec<Expr>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    Binary(Op, Box<Expr>, Box<Expr>),
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
    List(Vec<Expr>),
    Map(Vec<(Expr, Expr)>),
    Comprehension(Macro, Box<Expr>, String, Box<Expr>),
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Int(i64),
    Double(f64),
    Str(String),
    Sym(&'static str),
}

const SYMBOLS: [&str; 23] = [
    "||", "&&", "==", "!=", "<=", ">=", "<", ">", "!", "+", "-", "*", "/", "%", "?", ":", ".", ",",
    "(", ")", "[", "]", "{",
];

fn lex(src: &str) -> Result<Vec<(Tok, usize)>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if c.is_ascii_alphabetic() || c == '_' {
            let raw = (c == 'r' || c == 'R') && matches!(chars.get(i + 1), Some('\'' | '"'));
            if raw {
                let (s, next) = string_lit(&chars, i + 1, true)?;
                out.push((Tok::Str(s), start));
                i = next;
                continue;
            }
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), start));
            continue;
        }
        if c.is_ascii_digit() {
            while i < chars.len()
                && (chars[i].is_ascii_digit() || chars[i] == '.' || chars[i] == 'e')
            {
                // `1.size()` is not a double: a dot must be followed by a digit.
                if chars[i] == '.' && !chars.get(i + 1).is_some_and(char::is_ascii_digit) {
                    break;
                }
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            if chars.get(i).is_some_and(|c| *c == 'u' || *c == 'U') {
                i += 1;
            }
            let tok = if text.contains(['.', 'e']) {
                Tok::Double(
                    text.parse()
                        .map_err(|_| format!("bad number {text:?} at {start}"))?,
                )
            } else {
                Tok::Int(
                    text.parse()
                        .map_err(|_| format!("bad number {text:?} at {start}"))?,
                )
            };
            out.push((tok, start));
            continue;
        }
        if c == '\'' || c == '"' {
            let (s, next) = string_lit(&chars, i, false)?;
            out.push((Tok::Str(s), start));
            i = next;
            continue;
        }
        if c == '}' {
            out.push((Tok::Sym("}"), start));
            i += 1;
            continue;
        }
        let rest: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        match SYMBOLS.iter().find(|s| rest.starts_with(**s)) {
            Some(s) => {
                out.push((Tok::Sym(s), start));
                i += s.len();
            }
            None => return Err(format!("unexpected {c:?} at {start}")),
        }
    }
    Ok(out)
}

/// A quoted string starting at `at` (its quote); returns it and the index
/// after its closing quote.
fn string_lit(chars: &[char], at: usize, raw: bool) -> Result<(String, usize), String> {
    let quote = chars[at];
    let triple = chars.get(at + 1) == Some(&quote) && chars.get(at + 2) == Some(&quote);
    let mut i = at + if triple { 3 } else { 1 };
    let mut s = String::new();
    loop {
        let Some(&c) = chars.get(i) else {
            return Err(format!("unterminated string at {at}"));
        };
        if c == quote
            && (!triple || (chars.get(i + 1) == Some(&quote) && chars.get(i + 2) == Some(&quote)))
        {
            return Ok((s, i + if triple { 3 } else { 1 }));
        }
        if c == '\\' && !raw {
            let e = chars.get(i + 1).copied().unwrap_or('\\');
            s.push(match e {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                other => other,
            });
            i += 2;
            continue;
        }
        s.push(c);
        i += 1;
    }
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    at: usize,
    /// The source's length, for errors at its end.
    end: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|(t, _)| t)
    }

    fn pos(&self) -> usize {
        self.toks.get(self.at).map_or(self.end, |(_, p)| *p)
    }

    fn eat(&mut self, sym: &str) -> bool {
        if self.peek() == Some(&Tok::Sym(sym_static(sym))) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, sym: &str) -> Result<(), String> {
        if self.eat(sym) {
            Ok(())
        } else {
            Err(format!("expected {sym:?} at {}", self.pos()))
        }
    }

    fn expr(&mut self) -> Result<Expr, String> {
        let cond = self.binary(0)?;
        if self.eat("?") {
            let yes = self.expr()?;
            self.expect(":")?;
            let no = self.expr()?;
            return Ok(Expr::Cond(Box::new(cond), Box::new(yes), Box::new(no)));
        }
        Ok(cond)
    }

    fn op_at(&self, level: usize) -> Option<Op> {
        let op = match self.peek()? {
            Tok::Sym("||") => Op::Or,
            Tok::Sym("&&") => Op::And,
            Tok::Sym("==") => Op::Eq,
            Tok::Sym("!=") => Op::Ne,
            Tok::Sym("<") => Op::Lt,
            Tok::Sym("<=") => Op::Le,
            Tok::Sym(">") => Op::Gt,
            Tok::Sym(">=") => Op::Ge,
            Tok::Ident(i) if i == "in" => Op::In,
            Tok::Sym("+") => Op::Add,
            Tok::Sym("-") => Op::Sub,
            Tok::Sym("*") => Op::Mul,
            Tok::Sym("/") => Op::Div,
            Tok::Sym("%") => Op::Rem,
            _ => return None,
        };
        let op_level = match op {
            Op::Or => 0,
            Op::And => 1,
            Op::Eq | Op::Ne | Op::Lt | Op::Le | Op::Gt | Op::Ge | Op::In => 2,
            Op::Add | Op::Sub => 3,
            Op::Mul | Op::Div | Op::Rem => 4,
        };
        (op_level == level).then_some(op)
    }

    fn binary(&mut self, level: usize) -> Result<Expr, String> {
        if level > 4 {
            return self.unary();
        }
        let mut left = self.binary(level + 1)?;
        while let Some(op) = self.op_at(level) {
            self.at += 1;
            let right = self.binary(level + 1)?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.eat("-") {
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        self.member()
    }

    fn member(&mut self) -> Result<Expr, String> {
        let mut e = self.primary()?;
        loop {
            if self.eat(".") {
                let name = self.ident()?;
                if self.eat("(") {
                    let args = self.args(")")?;
                    e = method(e, name, args)?;
                } else {
                    e = Expr::Field(Box::new(e), name);
                }
            } else if self.eat("[") {
                let i = self.expr()?;
                self.expect("]")?;
                e = Expr::Index(Box::new(e), Box::new(i));
            } else {
                return Ok(e);
            }
        }
    }

    fn ident(&mut self) -> Result<String, String> {
        match self.peek().cloned() {
            Some(Tok::Ident(name)) => {
                self.at += 1;
                Ok(name)
            }
            _ => Err(format!("expected a name at {}", self.pos())),
        }
    }

    fn args(&mut self, close: &str) -> Result<Vec<Expr>, String> {
        let mut out = Vec::new();
        if self.eat(close) {
            return Ok(out);
        }
        loop {
            out.push(self.expr()?);
            if self.eat(close) {
                return Ok(out);
            }
            self.expect(",")?;
        }
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let pos = self.pos();
        let Some(tok) = self.peek().cloned() else {
            return Err(format!("unexpected end of expression at {pos}"));
        };
        self.at += 1;
        match tok {
            Tok::Int(i) => Ok(Expr::Lit(Val::Int(i))),
            Tok::Double(d) => Ok(Expr::Lit(Val::Double(d))),
            Tok::Str(s) => Ok(Expr::Lit(Val::Str(s))),
            Tok::Sym("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Sym("[") => Ok(Expr::List(self.args("]")?)),
            Tok::Sym("{") => {
                let mut entries = Vec::new();
                if !self.eat("}") {
                    loop {
                        let k = self.expr()?;
                        self.expect(":")?;
                        entries.push((k, self.expr()?));
                        if self.eat("}") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Ok(Expr::Map(entries))
            }
            Tok::Ident(name) => match name.as_str() {
                "true" => Ok(Expr::Lit(Val::Bool(true))),
                "false" => Ok(Expr::Lit(Val::Bool(false))),
                "null" => Ok(Expr::Lit(Val::Null)),
                _ if self.eat("(") => {
                    let args = self.args(")")?;
                    if name == "has" {
                        return match args.as_slice() {
                            [Expr::Field(of, f)] => Ok(Expr::Has(of.clone(), f.clone())),
                            _ => Err(format!("has() wants a field selection, at {pos}")),
                        };
                    }
                    Ok(Expr::Call(None, name, args))
                }
                _ => Ok(Expr::Ident(name)),
            },
            Tok::Sym(s) => Err(format!("unexpected {s:?} at {pos}")),
        }
    }
}

fn sym_static(s: &str) -> &'static str {
    SYMBOLS
        .iter()
        .chain(["}"].iter())
        .find(|x| **x == s)
        .copied()
        .unwrap_or("")
}

/// A receiver-style call: a macro when its first argument is a variable
/// name and it is one of the macros, else a function of the receiver.
fn method(on: Expr, name: String, args: Vec<Expr>) -> Result<Expr, String> {
    let kind = match name.as_str() {
        "all" => Some(Macro::All),
        "exists" => Some(Macro::Exists),
        "exists_one" => Some(Macro::ExistsOne),
        "map" => Some(Macro::Map),
        "filter" => Some(Macro::Filter),
        _ => None,
    };
    match (kind, args.as_slice()) {
        (Some(m), [Expr::Ident(var), body]) => Ok(Expr::Comprehension(
            m,
            Box::new(on),
            var.clone(),
            Box::new(body.clone()),
        )),
        (Some(_), _) => Err(format!("{name}() wants a variable and an expression")),
        (None, _) => Ok(Expr::Call(Some(Box::new(on)), name, args)),
    }
}

/// Compile a rule; the error names the position.
pub fn compile(src: &str) -> Result<Expr, String> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks,
        at: 0,
        end: src.chars().count(),
    };
    let e = p.expr()?;
    if p.at < p.toks.len() {
        return Err(format!("unexpected input at {}", p.pos()));
    }
    Ok(e)
}

/// Check, as the API server does when a CRD is written, that `e` selects
/// only fields the schema of `self` (`this`) declares, following fields,
/// list items and map values down the schema. A field of an object that
/// keeps unknown fields, or of a value whose schema is not known here, is
/// not checked.
pub fn check_fields(e: &Expr, this: &Value) -> Result<(), String> {
    let mut vars = BTreeMap::new();
    vars.insert("self".to_string(), Some(this.clone()));
    vars.insert("oldSelf".to_string(), Some(this.clone()));
    schema_of(e, &vars).map(|_| ())
}

/// The schema of a field `f` of a value of `schema`: `Err` when the schema
/// says there is no such field.
fn field_schema(schema: &Value, f: &str) -> Result<Option<Value>, String> {
    if schema["type"] != "object" || schema["x-kubernetes-preserve-unknown-fields"] == true {
        return Ok(None);
    }
    if let Some(p) = schema.get("properties").and_then(|p| p.get(f)) {
        return Ok(Some(p.clone()));
    }
    match schema.get("additionalProperties") {
        Some(a) if a.is_object() => Ok(Some(a.clone())),
        Some(Value::Bool(true)) => Ok(None),
        _ if schema.get("properties").is_none() => Ok(None),
        _ => Err(format!("undefined field '{f}'")),
    }
}

fn schema_of(e: &Expr, vars: &BTreeMap<String, Option<Value>>) -> Result<Option<Value>, String> {
    Ok(match e {
        Expr::Ident(name) => vars.get(name).cloned().flatten(),
        Expr::Field(of, f) | Expr::Has(of, f) => match schema_of(of, vars)? {
            Some(s) => field_schema(&s, f)?,
            None => None,
        },
        Expr::Index(of, i) => {
            schema_of(i, vars)?;
            match schema_of(of, vars)? {
                Some(s) if s["type"] == "array" => s.get("items").cloned(),
                Some(s) => s
                    .get("additionalProperties")
                    .filter(|a| a.is_object())
                    .cloned(),
                None => None,
            }
        }
        Expr::Comprehension(_, range, var, body) => {
            let item = match schema_of(range, vars)? {
                Some(s) if s["type"] == "array" => s.get("items").cloned(),
                _ => None,
            };
            let mut inner = vars.clone();
            inner.insert(var.clone(), item);
            schema_of(body, &inner)?;
            None
        }
        Expr::Lit(_) => None,
        Expr::Not(x) | Expr::Neg(x) => {
            schema_of(x, vars)?;
            None
        }
        Expr::Binary(_, a, b) => {
            schema_of(a, vars)?;
            schema_of(b, vars)?;
            None
        }
        Expr::Cond(c, a, b) => {
            for x in [c, a, b] {
                schema_of(x, vars)?;
            }
            None
        }
        Expr::List(items) => {
            for x in items {
                schema_of(x, vars)?;
            }
            None
        }
        Expr::Map(entries) => {
            for (k, v) in entries {
                schema_of(k, vars)?;
                schema_of(v, vars)?;
            }
            None
        }
        Expr::Call(on, _, args) => {
            if let Some(o) = on {
                schema_of(o, vars)?;
            }
            for a in args {
                schema_of(a, vars)?;
            }
            None
        }
    })
}

/// Variables in scope: `self`, `oldSelf` and macro variables.
pub type Scope = BTreeMap<String, Val>;

fn bool_of(v: Val) -> Result<bool, String> {
    match v {
        Val::Bool(b) => Ok(b),
        other => Err(format!(
            "no such overload: want bool, got {}",
            other.type_name()
        )),
    }
}

/// Evaluate `e` in `scope`.
pub fn eval(e: &Expr, scope: &Scope) -> Result<Val, String> {
    match e {
        Expr::Lit(v) => Ok(v.clone()),
        Expr::Ident(name) => scope
            .get(name)
            .cloned()
            .ok_or_else(|| format!("undeclared reference to {name:?}")),
        Expr::Field(of, f) => match eval(of, scope)? {
            Val::Map(m) => m.get(f).cloned().ok_or_else(|| format!("no such key: {f}")),
            other => Err(format!("no such field {f:?} on {}", other.type_name())),
        },
        Expr::Has(of, f) => match eval(of, scope)? {
            Val::Map(m) => Ok(Val::Bool(m.get(f).is_some_and(|v| *v != Val::Null))),
            other => Err(format!("has() on {}", other.type_name())),
        },
        Expr::Index(of, i) => index(eval(of, scope)?, eval(i, scope)?),
        Expr::Not(x) => Ok(Val::Bool(!bool_of(eval(x, scope)?)?)),
        Expr::Neg(x) => match eval(x, scope)? {
            Val::Int(i) => i.checked_neg().map(Val::Int).ok_or_else(overflow),
            Val::Double(d) => Ok(Val::Double(-d)),
            other => Err(format!("no such overload: -{}", other.type_name())),
        },
        Expr::Binary(Op::Or, a, b) => logic(eval(a, scope), || eval(b, scope), true),
        Expr::Binary(Op::And, a, b) => logic(eval(a, scope), || eval(b, scope), false),
        Expr::Binary(op, a, b) => binary(*op, eval(a, scope)?, eval(b, scope)?),
        Expr::Cond(c, yes, no) => {
            if bool_of(eval(c, scope)?)? {
                eval(yes, scope)
            } else {
                eval(no, scope)
            }
        }
        Expr::List(items) => Ok(Val::List(
            items
                .iter()
                .map(|i| eval(i, scope))
                .collect::<Result<_, _>>()?,
        )),
        Expr::Map(entries) => {
            let mut m = BTreeMap::new();
            for (k, v) in entries {
                match eval(k, scope)? {
                    Val::Str(k) => m.insert(k, eval(v, scope)?),
                    other => {
                        return Err(format!(
                            "map keys here are strings, not {}",
                            other.type_name()
                        ));
                    }
                };
            }
            Ok(Val::Map(m))
        }
        Expr::Comprehension(m, range, var, body) => {
            comprehension(*m, eval(range, scope)?, var, body, scope)
        }
        Expr::Call(on, name, args) => {
            let on = on.as_ref().map(|o| eval(o, scope)).transpose()?;
            let args = args
                .iter()
                .map(|a| eval(a, scope))
                .collect::<Result<Vec<_>, _>>()?;
            call(on, name, args)
        }
    }
}

fn overflow() -> String {
    "integer overflow".to_string()
}

/// `||` and `&&` are commutative over errors, as in CEL: a decisive side
/// wins whatever the other gives.
fn logic(
    a: Result<Val, String>,
    b: impl FnOnce() -> Result<Val, String>,
    decisive: bool,
) -> Result<Val, String> {
    let a = a.and_then(bool_of);
    if a == Ok(decisive) {
        return Ok(Val::Bool(decisive));
    }
    let b = b().and_then(bool_of);
    match (a, b) {
        (_, Ok(x)) if x == decisive => Ok(Val::Bool(decisive)),
        (Ok(_), Ok(_)) => Ok(Val::Bool(!decisive)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

fn index(of: Val, i: Val) -> Result<Val, String> {
    match (of, i) {
        (Val::List(l), Val::Int(i)) => usize::try_from(i)
            .ok()
            .and_then(|i| l.get(i).cloned())
            .ok_or_else(|| format!("index out of range: {i}")),
        (Val::Map(m), Val::Str(k)) => m
            .get(&k)
            .cloned()
            .ok_or_else(|| format!("no such key: {k}")),
        (of, i) => Err(format!(
            "no such overload: {}[{}]",
            of.type_name(),
            i.type_name()
        )),
    }
}

fn binary(op: Op, a: Val, b: Val) -> Result<Val, String> {
    use std::cmp::Ordering;
    let no = |a: &Val, b: &Val| {
        format!(
            "no such overload: {} {op:?} {}",
            a.type_name(),
            b.type_name()
        )
    };
    let order = |a: &Val, b: &Val| -> Result<Ordering, String> {
        match (a, b) {
            (Val::Str(x), Val::Str(y)) => Ok(x.cmp(y)),
            (Val::Bool(x), Val::Bool(y)) => Ok(x.cmp(y)),
            (Val::Int(x), Val::Int(y)) => Ok(x.cmp(y)),
            _ => match (a.num(), b.num()) {
                (Some(x), Some(y)) => x.partial_cmp(&y).ok_or_else(|| "NaN compared".to_string()),
                _ => Err(no(a, b)),
            },
        }
    };
    Ok(match op {
        Op::Eq => Val::Bool(a.equals(&b)),
        Op::Ne => Val::Bool(!a.equals(&b)),
        Op::Lt => Val::Bool(order(&a, &b)? == Ordering::Less),
        Op::Le => Val::Bool(order(&a, &b)? != Ordering::Greater),
        Op::Gt => Val::Bool(order(&a, &b)? == Ordering::Greater),
        Op::Ge => Val::Bool(order(&a, &b)? != Ordering::Less),
        Op::In => match &b {
            Val::List(l) => Val::Bool(l.iter().any(|x| x.equals(&a))),
            Val::Map(m) => match &a {
                Val::Str(k) => Val::Bool(m.contains_key(k)),
                _ => Val::Bool(false),
            },
            _ => return Err(no(&a, &b)),
        },
        Op::Add => match (a, b) {
            (Val::Int(x), Val::Int(y)) => Val::Int(x.checked_add(y).ok_or_else(overflow)?),
            (Val::Double(x), Val::Double(y)) => Val::Double(x + y),
            (Val::Str(x), Val::Str(y)) => Val::Str(x + y.as_str()),
            (Val::List(mut x), Val::List(y)) => {
                x.extend(y);
                Val::List(x)
            }
            (a, b) => return Err(no(&a, &b)),
        },
        Op::Sub | Op::Mul | Op::Div | Op::Rem => match (a, b) {
            (Val::Int(x), Val::Int(y)) => Val::Int(
                match op {
                    Op::Sub => x.checked_sub(y),
                    Op::Mul => x.checked_mul(y),
                    Op::Div => x.checked_div(y),
                    _ => x.checked_rem(y),
                }
                .ok_or_else(|| {
                    if y == 0 {
                        "division by zero".to_string()
                    } else {
                        overflow()
                    }
                })?,
            ),
            (Val::Double(x), Val::Double(y)) if op != Op::Rem => Val::Double(match op {
                Op::Sub => x - y,
                Op::Mul => x * y,
                _ => x / y,
            }),
            (a, b) => return Err(no(&a, &b)),
        },
        // `eval` hands these to `logic`; kept total all the same.
        Op::Or => Val::Bool(bool_of(a)? || bool_of(b)?),
        Op::And => Val::Bool(bool_of(a)? && bool_of(b)?),
    })
}

fn comprehension(
    m: Macro,
    range: Val,
    var: &str,
    body: &Expr,
    scope: &Scope,
) -> Result<Val, String> {
    let items: Vec<Val> = match range {
        Val::List(l) => l,
        Val::Map(m) => m.into_keys().map(Val::Str).collect(),
        other => return Err(format!("cannot range over {}", other.type_name())),
    };
    let mut inner = scope.clone();
    let mut run = |item: &Val| {
        inner.insert(var.to_string(), item.clone());
        eval(body, &inner)
    };
    match m {
        Macro::All | Macro::Exists => {
            let decisive = m == Macro::Exists;
            let mut err = None;
            for item in &items {
                match run(item).and_then(bool_of) {
                    Ok(b) if b == decisive => return Ok(Val::Bool(decisive)),
                    Ok(_) => {}
                    Err(e) => err = Some(e),
                }
            }
            match err {
                Some(e) => Err(e),
                None => Ok(Val::Bool(!decisive)),
            }
        }
        Macro::ExistsOne => {
            let mut n = 0;
            for item in &items {
                if bool_of(run(item)?)? {
                    n += 1;
                }
            }
            Ok(Val::Bool(n == 1))
        }
        Macro::Map => Ok(Val::List(
            items.iter().map(&mut run).collect::<Result<_, _>>()?,
        )),
        Macro::Filter => {
            let mut out = Vec::new();
            for item in items {
                if bool_of(run(&item)?)? {
                    out.push(item);
                }
            }
            Ok(Val::List(out))
        }
    }
}

/// A compiled regex, kept: the rules of a CRD name the same few patterns
/// on every write. The cache is emptied when it reaches its bound.
fn regex(re: &str) -> Result<std::sync::Arc<regex::Regex>, String> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    static CACHE: LazyLock<Mutex<HashMap<String, Arc<regex::Regex>>>> =
        LazyLock::new(Mutex::default);
    let mut cache = runbook_core::util::lock(&CACHE);
    if let Some(r) = cache.get(re) {
        return Ok(r.clone());
    }
    let compiled =
        Arc::new(regex::Regex::new(re).map_err(|e| format!("invalid regex {re:?}: {e}"))?);
    if cache.len() >= 256 {
        cache.clear();
    }
    cache.insert(re.to_string(), compiled.clone());
    Ok(compiled)
}

fn call(on: Option<Val>, name: &str, args: Vec<Val>) -> Result<Val, String> {
    // Global forms of the functions CEL also has as methods.
    let (on, args) = match (on, name) {
        (None, "size" | "matches" | "int" | "double" | "string" | "bool") => {
            let mut args = args.into_iter();
            (args.next(), args.collect())
        }
        (on, _) => (on, args),
    };
    let Some(on) = on else {
        return Err(format!("undeclared reference to function {name:?}"));
    };
    let a = Args { name, list: &args };
    match (name, &on) {
        ("size", Val::List(l)) => Ok(Val::Int(l.len() as i64)),
        ("size", Val::Map(m)) => Ok(Val::Int(m.len() as i64)),
        ("join", Val::List(l)) => {
            let sep = if a.list.is_empty() {
                String::new()
            } else {
                a.string(0)?
            };
            let parts: Result<Vec<String>, String> = l
                .iter()
                .map(|v| match v {
                    Val::Str(s) => Ok(s.clone()),
                    other => Err(format!("join() of a list holding {}", other.type_name())),
                })
                .collect();
            Ok(Val::Str(parts?.join(&sep)))
        }
        ("int", Val::Int(i)) => Ok(Val::Int(*i)),
        ("int", Val::Double(d)) if d.is_finite() && d.abs() < 9.2e18 => Ok(Val::Int(*d as i64)),
        ("int", Val::Str(s)) => s
            .parse()
            .map(Val::Int)
            .map_err(|_| format!("cannot convert {s:?} to int")),
        ("double", v) => match v {
            Val::Int(i) => Ok(Val::Double(*i as f64)),
            Val::Double(d) => Ok(Val::Double(*d)),
            Val::Str(s) => s
                .parse()
                .map(Val::Double)
                .map_err(|_| format!("cannot convert {s:?} to double")),
            other => Err(format!("cannot convert {} to double", other.type_name())),
        },
        ("string", v) => Ok(Val::Str(v.shown())),
        ("bool", Val::Bool(b)) => Ok(Val::Bool(*b)),
        (_, Val::Str(s)) => string_method(name, s, &a),
        (_, on) => Err(format!("no such overload: {}.{name}()", on.type_name())),
    }
}

/// The string functions: `s.name(args)`.
fn string_method(name: &str, s: &str, a: &Args<'_>) -> Result<Val, String> {
    match name {
        "size" => Ok(Val::Int(s.chars().count() as i64)),
        "matches" => Ok(Val::Bool(regex(&a.string(0)?)?.is_match(s))),
        "startsWith" => Ok(Val::Bool(s.starts_with(&a.string(0)?))),
        "endsWith" => Ok(Val::Bool(s.ends_with(&a.string(0)?))),
        "contains" => Ok(Val::Bool(s.contains(&a.string(0)?))),
        "lowerAscii" => Ok(Val::Str(s.to_ascii_lowercase())),
        "upperAscii" => Ok(Val::Str(s.to_ascii_uppercase())),
        "trim" => Ok(Val::Str(s.trim().to_string())),
        "indexOf" => {
            let needle = a.string(0)?;
            Ok(Val::Int(
                s.find(&needle)
                    .map_or(-1, |b| s[..b].chars().count() as i64),
            ))
        }
        "replace" => Ok(Val::Str(s.replace(&a.string(0)?, &a.string(1)?))),
        "split" => {
            let sep = a.string(0)?;
            Ok(Val::List(
                s.split(sep.as_str())
                    .map(|p| Val::Str(p.to_string()))
                    .collect(),
            ))
        }
        "substring" => {
            let chars: Vec<char> = s.chars().collect();
            let from =
                usize::try_from(a.int(0)?).map_err(|_| "substring: negative index".to_string())?;
            let to = match a.list.get(1) {
                Some(_) => usize::try_from(a.int(1)?)
                    .map_err(|_| "substring: negative index".to_string())?,
                None => chars.len(),
            };
            if from > to || to > chars.len() {
                return Err(format!("substring: index out of range: {from}..{to}"));
            }
            Ok(Val::Str(chars[from..to].iter().collect()))
        }
        "find" => Ok(Val::Str(
            regex(&a.string(0)?)?
                .find(s)
                .map_or(String::new(), |m| m.as_str().to_string()),
        )),
        "findAll" => Ok(Val::List(
            regex(&a.string(0)?)?
                .find_iter(s)
                .map(|m| Val::Str(m.as_str().to_string()))
                .collect(),
        )),
        _ => Err(format!("no such overload: string.{name}()")),
    }
}

/// A call's arguments, for the messages that name them.
struct Args<'a> {
    name: &'a str,
    list: &'a [Val],
}

impl Args<'_> {
    fn string(&self, i: usize) -> Result<String, String> {
        match self.list.get(i) {
            Some(Val::Str(s)) => Ok(s.clone()),
            _ => Err(format!("{}() wants a string argument {}", self.name, i + 1)),
        }
    }

    fn int(&self, i: usize) -> Result<i64, String> {
        match self.list.get(i) {
            Some(Val::Int(n)) => Ok(*n),
            _ => Err(format!("{}() wants an int argument {}", self.name, i + 1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(rule: &str, this: Value) -> Result<Val, String> {
        let e = compile(rule)?;
        let mut scope = Scope::new();
        scope.insert("self".into(), Val::from_json(&this));
        eval(&e, &scope)
    }

    #[test]
    fn the_rules_validation_uses_evaluate() {
        let spec = json!({"a": "x", "n": 3, "items": [1, 2, 3], "s": "1-5 * 9-2"});
        let t = |r: &str| run(r, spec.clone());
        assert_eq!(t("!(has(self.a) && has(self.b))"), Ok(Val::Bool(true)));
        assert_eq!(t("has(self.a) != has(self.b)"), Ok(Val::Bool(true)));
        assert_eq!(t("self.n % 2 == 0"), Ok(Val::Bool(false)));
        assert_eq!(t("self.n >= 1 && self.n <= 3.5"), Ok(Val::Bool(true)));
        assert_eq!(t("self.items.all(i, i > 0)"), Ok(Val::Bool(true)));
        assert_eq!(t("self.items.exists_one(i, i == 2)"), Ok(Val::Bool(true)));
        assert_eq!(t("self.items.map(i, i * 2)[2]"), Ok(Val::Int(6)));
        assert_eq!(t("size(self.items.filter(i, i != 2))"), Ok(Val::Int(2)));
        assert_eq!(t("'b' in ['a', 'b'] && 'a' in self"), Ok(Val::Bool(true)));
        assert_eq!(t("self.a.matches('^x$') ? 1 : 2"), Ok(Val::Int(1)));
        assert_eq!(
            t(
                r"self.s.findAll('[0-9]+-[0-9]+').all(r, int(r.split('-')[0]) <= int(r.split('-')[1]))"
            ),
            Ok(Val::Bool(false))
        );
        assert_eq!(t("'n is ' + string(self.n)"), Ok(Val::Str("n is 3".into())));
        assert_eq!(t(r#"self.s.substring(0, 3) == "1-5""#), Ok(Val::Bool(true)));
    }

    #[test]
    fn errors_are_values_not_panics() {
        let spec = json!({"a": "x", "n": 9223372036854775807i64, "l": []});
        let t = |r: &str| run(r, spec.clone());
        assert_eq!(t("self.b == 'y'"), Err("no such key: b".into()));
        assert!(t("self.n + 1 > 0").is_err());
        assert!(t("self.n / 0 > 0").is_err());
        assert!(t("self.l[3] == 1").is_err());
        assert!(t("self.a.matches('(')").is_err());
        assert!(t("int('x') == 1").is_err());
        assert!(t("self.a.substring(5) == ''").is_err());
        // A decisive side of `||` wins over an error on the other side.
        assert_eq!(t("self.b == 'y' || true"), Ok(Val::Bool(true)));
        assert_eq!(t("false && self.b == 'y'"), Ok(Val::Bool(false)));
        for bad in [
            "self.",
            "(self.a",
            "self.a ==",
            "has(self)",
            "1 +* 2",
            "'open",
            "self.all(x)",
        ] {
            assert!(compile(bad).is_err(), "{bad} compiled");
        }
    }

    #[test]
    fn a_rule_may_select_only_declared_fields() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "string"},
            "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }});
        let check = |r: &str| compile(r).and_then(|e| check_fields(&e, &schema));
        for fine in [
            "self.a == oldSelf.a",
            "self.items.all(i, i.n > 0)",
            "self.labels.team == 'x' && self.labels['a'] == 'b'",
            "has(self.free.anything)",
            "self.items[0].n == 1",
        ] {
            assert_eq!(check(fine), Ok(()), "{fine}");
        }
        assert_eq!(check("self.b == 'x'"), Err("undefined field 'b'".into()));
        assert_eq!(
            check("has(self.missing)"),
            Err("undefined field 'missing'".into())
        );
        assert_eq!(
            check("self.items.exists(i, i.m == 1)"),
            Err("undefined field 'm'".into())
        );
    }
}
