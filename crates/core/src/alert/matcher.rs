//! Alertmanager label matchers: `severity = "critical"`, `team =~ "ml|data"`,
//! `env != prod`, `service !~ "db-.*"`. Regexes are anchored at both ends,
//! as in Alertmanager.

use std::collections::BTreeMap;
use std::fmt;

use regex::Regex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    NotEq,
    Re,
    NotRe,
}

#[derive(Clone, Debug)]
pub struct Matcher {
    pub label: String,
    pub op: Op,
    pub value: String,
    regex: Option<Regex>,
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        self.label == other.label && self.op == other.op && self.value == other.value
    }
}

impl Matcher {
    /// Parse one matcher. The error says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let (idx, op, len) = ["=~", "!~", "!=", "="]
            .iter()
            .filter_map(|o| t.find(o).map(|i| (i, *o)))
            .min_by_key(|(i, o)| (*i, std::cmp::Reverse(o.len())))
            .map(|(i, o)| {
                let op = match o {
                    "=~" => Op::Re,
                    "!~" => Op::NotRe,
                    "!=" => Op::NotEq,
                    _ => Op::Eq,
                };
                (i, op, o.len())
            })
            .ok_or_else(|| format!("matcher {t:?} has no operator (=, !=, =~, !~)"))?;
        let label = t[..idx].trim();
        if label.is_empty()
            || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || label.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(format!(
                "matcher {t:?}: {label:?} is not a valid label name"
            ));
        }
        let raw = t[idx + len..].trim();
        let value = unquote(raw).ok_or_else(|| format!("matcher {t:?}: unterminated quote"))?;
        let regex = match op {
            Op::Re | Op::NotRe => Some(Regex::new(&format!("^(?:{value})$")).map_err(|e| {
                format!(
                    "matcher {t:?}: invalid regex: {}",
                    first_line(&e.to_string())
                )
            })?),
            _ => None,
        };
        Ok(Self {
            label: label.to_string(),
            op,
            value,
            regex,
        })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.label).map(String::as_str).unwrap_or("");
        match self.op {
            Op::Eq => v == self.value,
            Op::NotEq => v != self.value,
            Op::Re => self.regex.as_ref().is_some_and(|r| r.is_match(v)),
            Op::NotRe => !self.regex.as_ref().is_some_and(|r| r.is_match(v)),
        }
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or(s)
        .trim()
        .to_string()
}

fn unquote(raw: &str) -> Option<String> {
    if let Some(rest) = raw.strip_prefix('"') {
        let inner = rest.strip_suffix('"')?;
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next()? {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    other => out.push(other),
                }
            } else {
                out.push(c);
            }
        }
        Some(out)
    } else {
        Some(raw.to_string())
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            Op::Eq => "=",
            Op::NotEq => "!=",
            Op::Re => "=~",
            Op::NotRe => "!~",
        };
        write!(f, "{}{}{:?}", self.label, op, self.value)
    }
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
    fn matchers_follow_alertmanager_semantics() {
        let l = labels(&[("severity", "critical"), ("team", "ml")]);
        assert!(
            Matcher::parse(r#"severity = "critical""#)
                .unwrap()
                .matches(&l)
        );
        assert!(Matcher::parse("severity=critical").unwrap().matches(&l));
        assert!(Matcher::parse(r#"team =~ "ml|data""#).unwrap().matches(&l));
        // Anchored: "m" alone does not match "ml".
        assert!(!Matcher::parse(r#"team =~ "m""#).unwrap().matches(&l));
        assert!(Matcher::parse(r#"env != "prod""#).unwrap().matches(&l));
        assert!(Matcher::parse(r#"team !~ "data.*""#).unwrap().matches(&l));
        // A missing label is the empty string.
        assert!(Matcher::parse(r#"env = """#).unwrap().matches(&l));
    }

    #[test]
    fn bad_matchers_are_errors() {
        assert!(
            Matcher::parse("severity critical")
                .unwrap_err()
                .contains("no operator")
        );
        assert!(
            Matcher::parse(r#"team =~ "ml(""#)
                .unwrap_err()
                .contains("invalid regex")
        );
        assert!(Matcher::parse(r#"1x = "a""#).is_err());
        assert!(Matcher::parse(r#"a = "open"#).is_err());
    }
}
