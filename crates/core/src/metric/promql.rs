//! A query a target chooses (`queryFrom`), bounded before it is sent:
//! read token by token as Prometheus reads it, every metric it names must
//! be one the policy allows, it may not select series by `__name__` or
//! without a metric name, and each of its selectors gets the matcher
//! `<label>="<the target's namespace>"`, so it sees that namespace's
//! series alone. The query sent is rebuilt from the tokens read (one
//! space between each), so what was checked is exactly what is asked.

use super::template::promql_escape;

/// The longest query a target may give.
pub const MAX_QUERY: usize = 2_000;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Num(String),
    Punct(String),
}

impl Tok {
    fn text(&self) -> &str {
        match self {
            Tok::Ident(t) | Tok::Str(t) | Tok::Num(t) | Tok::Punct(t) => t,
        }
    }
    fn is(&self, p: &str) -> bool {
        matches!(self, Tok::Punct(t) if t == p)
    }
}

/// Aggregation operators: followed by `by`, `without` or `(`.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Keywords followed by a list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Keywords that are neither metrics nor functions.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

fn lex(q: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let b = q.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'#' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if matches!(c, b'"' | b'\'' | b'`') {
            let start = i;
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err("a string literal is not closed".into()),
                    Some(b'\\') if c != b'`' => i += 2,
                    Some(&x) if x == c => {
                        i += 1;
                        break;
                    }
                    Some(b'\n') if c != b'`' => {
                        return Err("a string literal runs across a line".into());
                    }
                    Some(_) => i += 1,
                }
            }
            let lexeme = q.get(start..i).ok_or("a string literal is cut")?;
            out.push(Tok::Str(lexeme.to_string()));
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let start = i;
            while i < b.len() {
                let x = b[i];
                let sign = matches!(x, b'+' | b'-') && matches!(b[i - 1], b'e' | b'E');
                if x.is_ascii_alphanumeric() || x == b'.' || x == b'_' || sign {
                    i += 1;
                } else {
                    break;
                }
            }
            out.push(Tok::Num(q[start..i].to_string()));
        } else if c.is_ascii_alphabetic()
            || c == b'_'
            || (c == b':' && !b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            out.push(Tok::Ident(q[start..i].to_string()));
        } else {
            let two = q.get(i..i + 2).unwrap_or("");
            let op = if ["==", "!=", ">=", "<=", "=~", "!~"].contains(&two) {
                two
            } else {
                match c {
                    b'{' | b'}' | b'(' | b')' | b'[' | b']' | b',' | b'@' | b'=' | b'+' | b'-'
                    | b'*' | b'/' | b'%' | b'^' | b'>' | b'<' | b':' => &q[i..i + 1],
                    _ => {
                        let ch = q[i..].chars().next().unwrap_or('?');
                        return Err(format!("{ch:?} has no place in a query"));
                    }
                }
            };
            i += op.len();
            out.push(Tok::Punct(op.to_string()));
        }
    }
    Ok(out)
}

/// Whether `name` matches one of `patterns` (`*` matches any run).
pub fn allowed(name: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|p| glob(p.as_bytes(), name.as_bytes()))
}

fn glob(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((c, rest)) => s
            .split_first()
            .is_some_and(|(x, tail)| x == c && glob(rest, tail)),
    }
}

/// `query` bounded: its metrics checked against `allowed_metrics`, and,
/// with a `label`, each selector confined to `namespace`.
pub fn confine(
    query: &str,
    allowed_metrics: &[String],
    label: Option<&str>,
    namespace: &str,
) -> Result<String, String> {
    if query.trim().is_empty() {
        return Err("the query is empty".into());
    }
    if query.len() > MAX_QUERY {
        return Err(format!("the query is longer than {MAX_QUERY} characters"));
    }
    let toks = lex(query)?;
    let matcher = label.map(|l| format!("{l}=\"{}\"", promql_escape(namespace, '"')));
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    let next_is = |i: usize, p: &str| toks.get(i).is_some_and(|t| t.is(p));
    while i < toks.len() {
        let t = &toks[i];
        match t {
            Tok::Ident(name) => {
                let lower = name.to_ascii_lowercase();
                if LABEL_LISTS.contains(&lower.as_str()) {
                    out.push(name.clone());
                    i += 1;
                    if next_is(i, "(") {
                        i = copy_until(&toks, i, ")", &mut out)?;
                    }
                    continue;
                }
                let call = next_is(i + 1, "(");
                let aggregation = AGGREGATIONS.contains(&lower.as_str())
                    && toks
                        .get(i + 1)
                        .is_some_and(|n| matches!(n, Tok::Ident(k) if ["by", "without"].contains(&k.to_ascii_lowercase().as_str())));
                if call || aggregation || KEYWORDS.contains(&lower.as_str()) {
                    out.push(name.clone());
                    i += 1;
                    continue;
                }
                if !allowed(name, allowed_metrics) {
                    return Err(format!(
                        "metric {name:?} is not one the policy allows ({})",
                        allowed_metrics.join(", ")
                    ));
                }
                out.push(name.clone());
                i += 1;
                if next_is(i, "{") {
                    i = selector(&toks, i, matcher.as_deref(), &mut out)?;
                } else if let Some(m) = &matcher {
                    out.extend(["{".to_string(), m.clone(), "}".to_string()]);
                }
            }
            Tok::Punct(p) if p == "{" => {
                return Err(
                    "a selector without a metric name ({...}) is not allowed: name the metric"
                        .into(),
                );
            }
            Tok::Punct(p) if p == "}" => return Err("an unmatched }".into()),
            Tok::Punct(p) if p == "[" => {
                i = copy_until(&toks, i, "]", &mut out)?;
            }
            _ => {
                out.push(t.text().to_string());
                i += 1;
            }
        }
    }
    Ok(out.join(" "))
}

/// Copy tokens from the opening one at `i` through the first `close`,
/// which must come before any brace; the index after it.
fn copy_until(
    toks: &[Tok],
    mut i: usize,
    close: &str,
    out: &mut Vec<String>,
) -> Result<usize, String> {
    let open = toks[i].text().to_string();
    out.push(open.clone());
    i += 1;
    while let Some(t) = toks.get(i) {
        if t.is(close) {
            out.push(close.to_string());
            return Ok(i + 1);
        }
        if t.is("{") || t.is("}") || t.is("(") || t.is("[") {
            return Err(format!("unexpected {} inside {open}...{close}", t.text()));
        }
        out.push(t.text().to_string());
        i += 1;
    }
    Err(format!("{open} is not closed with {close}"))
}

/// A selector's braces from the `{` at `i`: label matchers, none of
/// `__name__`, then the namespace matcher; the index after the `}`.
fn selector(
    toks: &[Tok],
    mut i: usize,
    matcher: Option<&str>,
    out: &mut Vec<String>,
) -> Result<usize, String> {
    out.push("{".into());
    i += 1;
    let mut last_comma = true;
    while let Some(t) = toks.get(i) {
        match t {
            Tok::Punct(p) if p == "}" => {
                if let Some(m) = matcher {
                    if !last_comma {
                        out.push(",".into());
                    }
                    out.push(m.to_string());
                }
                out.push("}".into());
                return Ok(i + 1);
            }
            Tok::Ident(l) if l == "__name__" => {
                return Err("a matcher on __name__ is not allowed: name the metric".into());
            }
            Tok::Ident(_) | Tok::Str(_) => {}
            Tok::Punct(p) if ["=", "!=", "=~", "!~", ","].contains(&p.as_str()) => {}
            other => return Err(format!("unexpected {} in a selector", other.text())),
        }
        last_comma = t.is(",");
        out.push(t.text().to_string());
        i += 1;
    }
    Err("a selector { is not closed with }".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(q: &str) -> String {
        confine(
            q,
            &["model_*".to_string(), "up".to_string()],
            Some("namespace"),
            "team-a",
        )
        .unwrap()
    }

    fn refused(q: &str) -> String {
        confine(q, &["model_*".to_string()], Some("namespace"), "team-a").unwrap_err()
    }

    #[test]
    fn every_selector_is_confined_to_the_namespace() {
        assert_eq!(
            ok("model_accuracy"),
            r#"model_accuracy { namespace="team-a" }"#
        );
        assert_eq!(
            ok(r#"avg(model_accuracy{deployment="chat"})"#),
            r#"avg ( model_accuracy { deployment = "chat" , namespace="team-a" } )"#
        );
        assert_eq!(
            ok(
                r#"sum by (deployment) (rate(model_errors_total{a="b",}[5m])) / sum without(pod)(rate(model_requests_total[5m:1m]))"#
            ),
            r#"sum by ( deployment ) ( rate ( model_errors_total { a = "b" , namespace="team-a" } [ 5m ] ) ) / sum without ( pod ) ( rate ( model_requests_total { namespace="team-a" } [ 5m : 1m ] ) )"#
        );
        assert_eq!(
            ok("model_a > bool 0.5 and on(pod) group_left model_b offset 5m"),
            r#"model_a { namespace="team-a" } > bool 0.5 and on ( pod ) group_left model_b { namespace="team-a" } offset 5m"#
        );
        // A matcher of the namespace label itself is kept, and both must hold.
        assert_eq!(
            ok(r#"model_a{namespace="team-b"}"#),
            r#"model_a { namespace = "team-b" , namespace="team-a" }"#
        );
    }

    #[test]
    fn what_could_reach_other_series_is_refused() {
        for (q, says) in [
            ("other_metric", "not one the policy allows"),
            ("model_a or other", "\"other\" is not one"),
            (r#"{__name__="model_a"}"#, "without a metric name"),
            (r#"model_a{__name__=~".+"}"#, "__name__"),
            ("model_a{a=\"b\"", "not closed"),
            ("model_a{a=\"b}", "not closed"),
            ("model_a # comment\n or secret_metric", "\"secret_metric\""),
            ("model_a; up", "';' has no place"),
            ("", "empty"),
        ] {
            let e = refused(q);
            assert!(e.contains(says), "{q:?}: {e}");
        }
        assert!(refused(&"model_a + ".repeat(300)).contains("longer than"));
    }

    #[test]
    fn without_a_label_the_query_is_only_checked() {
        let out = confine("model_a{x='y'}", &["model_*".into()], None, "ns").unwrap();
        assert_eq!(out, "model_a { x = 'y' }");
    }

    #[test]
    fn a_namespace_with_quotes_stays_in_its_string() {
        let out = confine(
            "model_a",
            &["model_*".into()],
            Some("namespace"),
            "a\"}or up{b=\"",
        )
        .unwrap();
        assert_eq!(out, r#"model_a { namespace="a\"}or up{b=\"" }"#);
    }

    #[test]
    fn globs_match_runs_of_characters() {
        let p = ["model_*".to_string(), "*:rate5m".to_string()];
        assert!(allowed("model_accuracy", &p));
        assert!(allowed("job:rate5m", &p));
        assert!(!allowed("models", &p));
        assert!(!allowed("up", &p));
    }
}
