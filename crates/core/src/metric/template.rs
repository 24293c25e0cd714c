//! Metric templates: `{{ .metadata.namespace }}` in a query or a path is
//! replaced by the target's field, quoted for where it lands, so that no
//! value can change the shape of what is asked:
//!
//! - in PromQL, a value inside a string literal is escaped for it; one
//!   outside any string becomes a string literal of its own (a number
//!   stays a number); inside a raw (backtick) string, where nothing can be
//!   escaped, a placeholder is refused when the policy loads;
//! - in a URL path or query string, a value is percent-encoded.

use serde_json::Value;

/// Where a template's values land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quoting {
    PromQl,
    Url,
}

/// A compiled template: literal text and the target's fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
    quoting: Quoting,
}

#[derive(Clone, Debug, PartialEq)]
enum Part {
    Lit(String),
    Field {
        path: Vec<String>,
        /// The PromQL string the placeholder sits in (`"` or `'`), if any.
        quote: Option<char>,
    },
}

impl Template {
    /// Parse `text`; an error says what is wrong and at which byte.
    pub fn parse(text: &str, quoting: Quoting) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        let mut offset = 0;
        // The PromQL string the text so far ends inside.
        let mut open: Option<char> = None;
        while let Some(start) = rest.find("{{") {
            let lit = &rest[..start];
            if quoting == Quoting::PromQl {
                open = string_state(lit, open);
            }
            parts.push(Part::Lit(lit.to_string()));
            let after = &rest[start + 2..];
            let Some(end) = after.find("}}") else {
                return Err(format!(
                    "byte {}: {{{{ is not closed with }}}}",
                    offset + start
                ));
            };
            let inner = after[..end].trim();
            let path = field_path(inner)
                .map_err(|e| format!("byte {}: {{{{ {inner} }}}}: {e}", offset + start))?;
            if open == Some('`') {
                return Err(format!(
                    "byte {}: {{{{ {inner} }}}} is inside a raw (backtick) string, where a value cannot be escaped; use double quotes",
                    offset + start
                ));
            }
            parts.push(Part::Field { path, quote: open });
            let consumed = start + 2 + end + 2;
            offset += consumed;
            rest = &rest[consumed..];
        }
        if quoting == Quoting::PromQl && string_state(rest, open).is_some() {
            return Err("a string literal is not closed".into());
        }
        parts.push(Part::Lit(rest.to_string()));
        parts.retain(|p| !matches!(p, Part::Lit(l) if l.is_empty()));
        Ok(Self { parts, quoting })
    }

    /// Whether the template has any placeholder.
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// The text for `target`; an error names the field that is missing
    /// or is not a single value.
    pub fn render(&self, target: &Value) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Lit(l) => out.push_str(l),
                Part::Field { path, quote } => {
                    let value = lookup(target, path)
                        .ok_or_else(|| format!(".{} is not set on the target", path.join(".")))?;
                    let text = scalar(value).ok_or_else(|| {
                        format!(
                            ".{} is not a string, number or boolean on the target",
                            path.join(".")
                        )
                    })?;
                    match (self.quoting, quote) {
                        (Quoting::Url, _) => out.push_str(&percent_encode(&text)),
                        (Quoting::PromQl, Some(q)) => out.push_str(&promql_escape(&text, *q)),
                        (Quoting::PromQl, None) if value.is_number() => out.push_str(&text),
                        (Quoting::PromQl, None) => {
                            out.push('"');
                            out.push_str(&promql_escape(&text, '"'));
                            out.push('"');
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The field a placeholder names: `.spec.name`, `.metadata.labels["app.kubernetes.io/name"]`.
fn field_path(inner: &str) -> Result<Vec<String>, String> {
    let Some(mut rest) = inner.strip_prefix('.') else {
        return Err("name a field of the target, starting with a dot (.metadata.name)".into());
    };
    let mut path = Vec::new();
    loop {
        if let Some(r) = rest.strip_prefix("[\"") {
            let end = r.find("\"]").ok_or("a [\"key\"] is not closed")?;
            path.push(r[..end].to_string());
            rest = &r[end + 2..];
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            let seg = &rest[..end];
            if seg.is_empty()
                || !seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!(
                    "{seg:?} is not a field name (letters, digits, _ and -; [\"key\"] for others)"
                ));
            }
            path.push(seg.to_string());
            rest = &rest[end..];
        }
        if rest.is_empty() {
            return Ok(path);
        }
        if let Some(r) = rest.strip_prefix('.') {
            rest = r;
        } else if !rest.starts_with('[') {
            return Err(format!("unexpected {rest:?}"));
        }
    }
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(v, |v, seg| match v {
            Value::Object(m) => m.get(seg),
            Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        })
        .filter(|v| !v.is_null())
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The PromQL string (`"`, `'` or a backtick) `text` ends inside, having
/// started inside `open`.
pub fn string_state(text: &str, mut open: Option<char>) -> Option<char> {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match open {
            Some('`') if c == '`' => open = None,
            Some('`') => {}
            Some(_) if c == '\\' => {
                chars.next();
            }
            Some(q) if c == q => open = None,
            Some(_) => {}
            None if matches!(c, '"' | '\'' | '`') => open = Some(c),
            None => {}
        }
    }
    open
}

/// `text` as the inside of a PromQL string quoted with `quote`: its
/// backslashes, quotes and control characters escaped.
pub fn promql_escape(text: &str, quote: char) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Every byte but the unreserved ones of RFC 3986 percent-encoded.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn promql(t: &str, target: &Value) -> Result<String, String> {
        Template::parse(t, Quoting::PromQl)?.render(target)
    }

    #[test]
    fn a_value_lands_quoted_where_it_is_placed() {
        let t = json!({"metadata": {"namespace": "team-a", "name": "chat", "labels": {"app.kubernetes.io/name": "bot"}}, "spec": {"n": 3}});
        assert_eq!(
            promql(r#"m{namespace="{{ .metadata.namespace }}"}"#, &t).unwrap(),
            r#"m{namespace="team-a"}"#
        );
        assert_eq!(
            promql("m{namespace={{ .metadata.namespace }}}", &t).unwrap(),
            r#"m{namespace="team-a"}"#
        );
        assert_eq!(promql("topk({{ .spec.n }}, m)", &t).unwrap(), "topk(3, m)");
        assert_eq!(
            promql(
                r#"m{app='{{ .metadata.labels["app.kubernetes.io/name"] }}'}"#,
                &t
            )
            .unwrap(),
            "m{app='bot'}"
        );
    }

    /// Quotes, braces, backslashes and newlines in a field stay inside
    /// the one string literal they are placed in.
    #[test]
    fn no_field_changes_the_shape_of_the_query() {
        for evil in [
            r#"x"} or vector(1) or m{a=""#,
            "x'} or up{a='",
            "x\\\"} or up",
            "x\n} or up",
            "x\\",
            "}}{{",
        ] {
            let t = json!({"metadata": {"name": evil}});
            for q in [
                r#"m{n="{{ .metadata.name }}"}"#,
                "m{n='{{ .metadata.name }}'}",
                "m{n={{ .metadata.name }}}",
            ] {
                let out = promql(q, &t).unwrap();
                // One string literal from the first quote to the last.
                let open = out.find(['"', '\'']).unwrap();
                let quote = out[open..].chars().next().unwrap();
                assert_eq!(string_state(&out[..open + 1], None), Some(quote));
                let close = out.rfind(quote).unwrap();
                let inside = &out[open + 1..close];
                assert_eq!(string_state(inside, Some(quote)), Some(quote), "{out}");
                assert_eq!(&out[close..], &format!("{quote}}}"), "{out}");
                assert!(!inside.contains('\n'));
            }
        }
    }

    #[test]
    fn bad_templates_are_refused_when_parsed() {
        for (t, says) in [
            ("m{a=`{{ .metadata.name }}`}", "raw (backtick)"),
            ("m{a={{ metadata.name }}}", "starting with a dot"),
            ("m{a={{ .metadata.name }", "not closed"),
            ("m{a=\"x}", "not closed"),
        ] {
            let e = Template::parse(t, Quoting::PromQl).unwrap_err();
            assert!(e.contains(says), "{t}: {e}");
        }
        let missing = promql("m{a={{ .spec.gone }}}", &json!({})).unwrap_err();
        assert_eq!(missing, ".spec.gone is not set on the target");
        let map = promql("m{a={{ .spec }}}", &json!({"spec": {}})).unwrap_err();
        assert!(map.contains("not a string"), "{map}");
    }

    #[test]
    fn a_path_value_is_percent_encoded() {
        let t = Template::parse("/v1/models/{{ .metadata.name }}/q?x=1", Quoting::Url).unwrap();
        let out = t
            .render(&json!({"metadata": {"name": "a/../b?c=d&e"}}))
            .unwrap();
        assert_eq!(out, "/v1/models/a%2F..%2Fb%3Fc%3Dd%26e/q?x=1");
    }
}
