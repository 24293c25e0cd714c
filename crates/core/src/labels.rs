//! Kubernetes label selectors: parsing the string form
//! (`app=web,tier in (a,b),!canary`) and matching label maps.

use std::collections::BTreeMap;
use std::fmt;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed selector: every requirement must hold. Empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

impl Selector {
    /// Parse the string form. The error says which part is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top_level(text)? {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            reqs.push(parse_requirement(p)?);
        }
        Ok(Selector(reqs))
    }

    /// A selector requiring each label to equal its value.
    pub fn from_map<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        Selector(
            labels
                .into_iter()
                .map(|(k, v)| Requirement::Eq(k.clone(), v.clone()))
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A Kubernetes `LabelSelector` object (`matchLabels`,
    /// `matchExpressions` with In, NotIn, Exists, DoesNotExist).
    pub fn from_label_selector(v: &serde_json::Value) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if v.is_null() {
            return Ok(Selector(reqs));
        }
        if let Some(m) = v.get("matchLabels").and_then(|m| m.as_object()) {
            for (k, val) in m {
                let val = val
                    .as_str()
                    .ok_or_else(|| format!("matchLabels.{k}: not a string"))?;
                reqs.push(Requirement::Eq(k.clone(), val.to_string()));
            }
        }
        for e in v
            .get("matchExpressions")
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(|k| k.as_str())
                .unwrap_or("")
                .to_string();
            let values: Vec<String> = e
                .get("values")
                .and_then(|v| v.as_array())
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            reqs.push(match e.get("operator").and_then(|o| o.as_str()) {
                Some("In") => Requirement::In(key, values),
                Some("NotIn") => Requirement::NotIn(key, values),
                Some("Exists") => Requirement::Exists(key),
                Some("DoesNotExist") => Requirement::NotExists(key),
                other => return Err(format!("matchExpressions: unknown operator {other:?}")),
            });
        }
        Ok(Selector(reqs))
    }

    /// Whether labels, looked up by `get`, satisfy every requirement.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Requirement::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }

    /// Match the labels of a JSON object's metadata.
    pub fn matches_object(&self, obj: &serde_json::Value) -> bool {
        self.matches_field(obj, "labels")
    }

    /// Match the annotations of a JSON object's metadata.
    pub fn matches_annotations(&self, obj: &serde_json::Value) -> bool {
        self.matches_field(obj, "annotations")
    }

    fn matches_field(&self, obj: &serde_json::Value, field: &str) -> bool {
        let map = obj.get("metadata").and_then(|m| m.get(field));
        self.matches_with(|k| map.and_then(|l| l.get(k)).and_then(|v| v.as_str()))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|r| match r {
                Requirement::Eq(k, v) => format!("{k}={v}"),
                Requirement::NotEq(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::NotExists(k) => format!("!{k}"),
                Requirement::Gt(k, n) => format!("{k}>{n}"),
                Requirement::Lt(k, n) => format!("{k}<{n}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Split on commas that are not inside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unbalanced ')' in selector {text:?}"));
                }
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in selector {text:?}"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(p: &str) -> Result<Requirement, String> {
    if let Some(key) = p.strip_prefix('!') {
        let key = key.trim();
        check_key(key)?;
        return Ok(Requirement::NotExists(key.to_string()));
    }
    for (op, ctor) in [(" notin ", true), (" in ", false)] {
        if let Some(i) = p.find(op) {
            let key = p[..i].trim();
            check_key(key)?;
            let rest = p[i + op.len()..].trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| format!("{p:?}: values must be in parentheses"))?;
            let values: Vec<String> = inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            if values.is_empty() {
                return Err(format!("{p:?}: at least one value is required"));
            }
            for v in &values {
                check_value(v)?;
            }
            return Ok(if ctor {
                Requirement::NotIn(key.to_string(), values)
            } else {
                Requirement::In(key.to_string(), values)
            });
        }
    }
    for op in ["!=", "==", "=", ">", "<"] {
        if let Some(i) = p.find(op) {
            let key = p[..i].trim();
            let value = p[i + op.len()..].trim();
            check_key(key)?;
            return match op {
                "!=" => {
                    check_value(value)?;
                    Ok(Requirement::NotEq(key.into(), value.into()))
                }
                "=" | "==" => {
                    check_value(value)?;
                    Ok(Requirement::Eq(key.into(), value.into()))
                }
                _ => {
                    let n: i64 = value
                        .parse()
                        .map_err(|_| format!("{p:?}: {op} needs an integer"))?;
                    Ok(if op == ">" {
                        Requirement::Gt(key.into(), n)
                    } else {
                        Requirement::Lt(key.into(), n)
                    })
                }
            };
        }
    }
    check_key(p)?;
    Ok(Requirement::Exists(p.to_string()))
}

/// A label key: optional DNS-subdomain prefix and a name of at most 63
/// characters of alphanumerics, `-`, `_`, `.`, starting and ending
/// alphanumeric.
pub fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !crate::names::is_dns_subdomain(p))
    {
        return Err(format!(
            "invalid label key {key:?}: the prefix must be a DNS subdomain"
        ));
    }
    if !is_label_name(name) {
        return Err(format!(
            "invalid label key {key:?}: name part must be 63 characters or less, alphanumeric, '-', '_' or '.', starting and ending with an alphanumeric character"
        ));
    }
    Ok(())
}

/// A label value: empty, or like a key's name part.
pub fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value {value:?}: must be 63 characters or less, alphanumeric, '-', '_' or '.', starting and ending with an alphanumeric character"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_operator_matches_as_kubernetes_does() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("n", "5")]);
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("tier in (front,back)", true),
            ("tier notin (front)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("!app", false),
            ("!canary", true),
            ("n>4", true),
            ("n<5", false),
            ("app=web,tier in (back)", false),
            ("", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn malformed_selectors_are_errors() {
        assert!(Selector::parse("tier in front").is_err());
        assert!(Selector::parse("tier in (a").is_err());
        assert!(Selector::parse("bad key=x").is_err());
        assert!(Selector::parse("app=has space").is_err());
        assert!(Selector::parse("n>x").is_err());
    }
}
