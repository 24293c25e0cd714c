//! The JSONPath subset a web metric names its number with: the root `$`,
//! then fields (`.data`, `['quality score']`) and array indexes (`[0]`).

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
}

/// A parsed path.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonPath {
    text: String,
    steps: Vec<Step>,
}

impl JsonPath {
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some(mut rest) = text.trim().strip_prefix('$') else {
            return Err(format!(
                "{text:?}: a path starts at the root, $ ($.data.value)"
            ));
        };
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix('.') {
                let end = r.find(['.', '[']).unwrap_or(r.len());
                let name = &r[..end];
                if name.is_empty() || name == "*" {
                    return Err(format!(
                        "{text:?}: a field name after each dot (no wildcards)"
                    ));
                }
                steps.push(Step::Field(name.to_string()));
                rest = &r[end..];
            } else if let Some(r) = rest.strip_prefix('[') {
                let end = r
                    .find(']')
                    .ok_or_else(|| format!("{text:?}: [ is not closed"))?;
                let inner = r[..end].trim();
                let quoted = inner
                    .strip_prefix('\'')
                    .and_then(|s| s.strip_suffix('\''))
                    .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')));
                match (quoted, inner.parse::<usize>()) {
                    (Some(name), _) => steps.push(Step::Field(name.to_string())),
                    (None, Ok(n)) => steps.push(Step::Index(n)),
                    _ => {
                        return Err(format!(
                            "{text:?}: [{inner}] is neither an index nor a quoted field"
                        ));
                    }
                }
                rest = &r[end + 1..];
            } else {
                return Err(format!("{text:?}: unexpected {rest:?}"));
            }
        }
        Ok(Self {
            text: text.trim().to_string(),
            steps,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value at the path, if there is one.
    pub fn find<'a>(&self, v: &'a Value) -> Option<&'a Value> {
        self.steps.iter().try_fold(v, |v, s| match (s, v) {
            (Step::Field(f), Value::Object(m)) => m.get(f),
            (Step::Index(i), Value::Array(a)) => a.get(*i),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_path_reaches_fields_and_items() {
        let v = json!({"data": {"items": [{"v": 1}, {"v": 0.5}], "quality score": "0.9"}});
        let at = |p: &str| JsonPath::parse(p).unwrap().find(&v).cloned();
        assert_eq!(at("$.data.items[1].v"), Some(json!(0.5)));
        assert_eq!(at("$['data']['quality score']"), Some(json!("0.9")));
        assert_eq!(at("$.data.items[5]"), None);
        assert_eq!(at("$"), Some(v.clone()));
        for bad in ["data.v", "$.", "$.a[x]", "$.a[0", "$.*"] {
            assert!(JsonPath::parse(bad).is_err(), "{bad}");
        }
    }
}
