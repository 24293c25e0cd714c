//! Templates: YAML trees whose strings in backticks are Rhai interpolated
//! strings (`` `${resource.metadata.name}-dump` ``). Each `${...}` is
//! compiled once when the policy loads, with its position in the YAML file,
//! and evaluated in Rust so that an interpolation of a missing field is an
//! error that names the place, not an empty string.

use rhai::{Dynamic, Scope};
use serde_json::Value;

use super::convert::to_json;
use super::engine::{Expr, ScriptEngine};
use super::error::{ScriptError, ScriptErrorKind};
use crate::util::yaml::{Node, NodeValue, Pos};

/// A compiled template.
#[derive(Clone, Debug)]
pub enum Template {
    Lit(Value),
    /// A backtick string: literal parts and expressions.
    Interp {
        parts: Vec<Part>,
        /// The string is exactly one `${expr}`: keep the expression's type.
        typed: bool,
        pos: Pos,
    },
    Seq(Vec<Template>),
    Map(Vec<(String, Template)>),
}

#[derive(Clone, Debug)]
pub enum Part {
    Lit(String),
    Expr {
        expr: Box<Expr>,
        text: String,
        pos: Pos,
        /// The expression says a value may be missing (`??`, `?.`, `?[`):
        /// as a whole value it then renders as null and its key is dropped.
        optional: bool,
    },
}

/// Column offset of a scalar's content: 1 when the scalar is quoted.
pub fn quote_offset(source: &str, pos: Pos) -> u32 {
    let line = source
        .lines()
        .nth(pos.line.saturating_sub(1) as usize)
        .unwrap_or("");
    match line.chars().nth(pos.col.saturating_sub(1) as usize) {
        Some('\'') | Some('"') => 1,
        _ => 0,
    }
}

impl Template {
    /// Compile a positioned YAML tree. `source` is the file's text, used to
    /// place errors exactly.
    pub fn compile(
        engine: &ScriptEngine,
        file: &str,
        source: &str,
        node: &Node,
        functions: Option<&rhai::AST>,
    ) -> Result<Self, ScriptError> {
        Ok(match &node.value {
            NodeValue::Null => Template::Lit(Value::Null),
            NodeValue::Bool(b) => Template::Lit(Value::Bool(*b)),
            NodeValue::Int(_) | NodeValue::Float(_) => Template::Lit(node.to_json()),
            NodeValue::Str(s) => {
                let trimmed = s.trim();
                if trimmed.len() >= 2 && trimmed.starts_with('`') && trimmed.ends_with('`') {
                    let content_col = node.pos.col + quote_offset(source, node.pos) + 1;
                    let origin = Pos {
                        line: node.pos.line,
                        col: content_col,
                    };
                    compile_interp(
                        engine,
                        file,
                        &trimmed[1..trimmed.len() - 1],
                        origin,
                        functions,
                    )?
                } else {
                    Template::Lit(Value::String(s.clone()))
                }
            }
            NodeValue::Seq(items) => Template::Seq(
                items
                    .iter()
                    .map(|n| Template::compile(engine, file, source, n, functions))
                    .collect::<Result<_, _>>()?,
            ),
            NodeValue::Map(entries) => Template::Map(
                entries
                    .iter()
                    .map(|(k, n)| {
                        Ok((
                            k.clone(),
                            Template::compile(engine, file, source, n, functions)?,
                        ))
                    })
                    .collect::<Result<_, ScriptError>>()?,
            ),
        })
    }

    /// Whether the template has no expressions.
    pub fn is_literal(&self) -> bool {
        match self {
            Template::Lit(_) => true,
            Template::Interp { .. } => false,
            Template::Seq(items) => items.iter().all(Template::is_literal),
            Template::Map(entries) => entries.iter().all(|(_, t)| t.is_literal()),
        }
    }

    /// The literal value at a path of map keys, if it is one (for load-time
    /// checks such as "which kind does this template apply?").
    pub fn literal_at(&self, path: &[&str]) -> Option<&Value> {
        match (self, path.split_first()) {
            (Template::Lit(v), None) => Some(v),
            (Template::Lit(v), Some(_)) => path.iter().try_fold(v, |v, k| v.get(*k)),
            (Template::Map(entries), Some((first, rest))) => entries
                .iter()
                .find(|(k, _)| k == first)
                .and_then(|(_, t)| t.literal_at(rest)),
            _ => None,
        }
    }

    /// Render with the given variables.
    pub fn render(&self, engine: &ScriptEngine, scope: &mut Scope) -> Result<Value, ScriptError> {
        Ok(match self {
            Template::Lit(v) => v.clone(),
            Template::Seq(items) => Value::Array(
                items
                    .iter()
                    .map(|t| t.render(engine, scope))
                    .collect::<Result<_, _>>()?,
            ),
            Template::Map(entries) => {
                let mut out = serde_json::Map::new();
                for (k, t) in entries {
                    let v = t.render(engine, scope)?;
                    // An optional value that is missing leaves its key out.
                    if v.is_null() && !matches!(t, Template::Lit(_)) {
                        continue;
                    }
                    out.insert(k.clone(), v);
                }
                Value::Object(out)
            }
            Template::Interp { parts, typed, .. } => {
                if *typed
                    && let [
                        Part::Expr {
                            expr,
                            text,
                            pos,
                            optional,
                        },
                    ] = parts.as_slice()
                {
                    let v = engine.eval(expr, scope)?;
                    if v.is_unit() && *optional {
                        return Ok(Value::Null);
                    }
                    let v = check_present(v, expr, text, *pos)?;
                    return to_json(&v, &format!("`${{{text}}}`")).map_err(|m| ScriptError {
                        file: expr.file.clone(),
                        pos: Some(*pos),
                        kind: ScriptErrorKind::Runtime,
                        message: m,
                    });
                }
                let mut out = String::new();
                for part in parts {
                    match part {
                        Part::Lit(s) => out.push_str(s),
                        Part::Expr {
                            expr, text, pos, ..
                        } => {
                            let v = check_present(engine.eval(expr, scope)?, expr, text, *pos)?;
                            out.push_str(&display(&v));
                        }
                    }
                }
                Value::String(out)
            }
        })
    }
}

fn check_present(v: Dynamic, expr: &Expr, text: &str, pos: Pos) -> Result<Dynamic, ScriptError> {
    if v.is_unit() {
        return Err(ScriptError {
            file: expr.file.clone(),
            pos: Some(pos),
            kind: ScriptErrorKind::Runtime,
            message: format!(
                "`${{{text}}}` has no value: a missing field? (write `?? default` where a value may be absent)"
            ),
        });
    }
    Ok(v)
}

fn display(v: &Dynamic) -> String {
    if v.is_string() {
        return v.clone().into_string().unwrap_or_default();
    }
    if v.is_map() || v.is_array() {
        return to_json(v, "value")
            .map(|j| j.to_string())
            .unwrap_or_else(|_| v.to_string());
    }
    v.to_string()
}

/// Where the `${` expression starting at `start` ends: the index of its
/// closing brace (braces inside quotes do not count), and whether there is
/// one.
fn closing_brace(chars: &[char], start: usize) -> (usize, bool) {
    let mut depth = 1;
    let mut quote: Option<char> = None;
    for (j, &c) in chars.iter().enumerate().skip(start) {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '"' | '\'' => quote = Some(c),
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return (j, true);
                    }
                }
                _ => {}
            },
        }
    }
    (chars.len(), false)
}

/// Split `text` (the inside of the backticks) into literal parts and
/// `${...}` expressions, compiling each expression at its own position.
fn compile_interp(
    engine: &ScriptEngine,
    file: &str,
    text: &str,
    origin: Pos,
    functions: Option<&rhai::AST>,
) -> Result<Template, ScriptError> {
    let mut parts = Vec::new();
    let mut lit = String::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '$' && chars.get(i + 1) == Some(&'{') {
            let start = i + 2;
            let (j, closed) = closing_brace(&chars, start);
            let pos = Pos {
                line: origin.line,
                col: origin.col + start as u32,
            };
            let syntax = |col: u32, message: &str| ScriptError {
                file: file.to_string(),
                pos: Some(Pos {
                    line: origin.line,
                    col,
                }),
                kind: ScriptErrorKind::Syntax,
                message: message.into(),
            };
            if !closed {
                let m = "unclosed `${` in template string";
                return Err(syntax(origin.col + i as u32, m));
            }
            let expr_text: String = chars[start..j].iter().collect();
            if expr_text.trim().is_empty() {
                return Err(syntax(pos.col, "empty `${}` in template string"));
            }
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            let expr = engine.compile_expr(file, &expr_text, pos, functions)?;
            let optional =
                expr_text.contains("??") || expr_text.contains("?.") || expr_text.contains("?[");
            parts.push(Part::Expr {
                expr: Box::new(expr),
                text: expr_text.trim().to_string(),
                pos,
                optional,
            });
            i = j + 1;
        } else {
            lit.push(chars[i]);
            i += 1;
        }
    }
    if !lit.is_empty() {
        parts.push(Part::Lit(lit));
    }
    let typed = matches!(parts.as_slice(), [Part::Expr { .. }]);
    Ok(Template::Interp {
        parts,
        typed,
        pos: origin,
    })
}

/// A scope with the variables templates and expressions may use.
pub fn scope_with<'a>(vars: &[(&'static str, Dynamic)]) -> Scope<'a> {
    let mut scope = Scope::new();
    for name in super::engine::EXPR_VARIABLES {
        let value = vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or(Dynamic::UNIT);
        scope.push_dynamic(*name, value);
    }
    scope
}
