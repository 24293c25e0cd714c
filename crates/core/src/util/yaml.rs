//! YAML in and out, with positions.
//!
//! Every parse error carries the line and column the parser stopped at and,
//! for type errors, the path of the field (`spec.target.kind`), so that the
//! message a person reads points at the place to fix.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};

/// Where something is in a source text (1-based).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A YAML error: position, field path (may be empty) and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YamlError {
    pub pos: Pos,
    pub path: String,
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.pos, self.message)
        } else {
            write!(f, "{}: {}: {}", self.pos, self.path, self.message)
        }
    }
}

fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    // YAML 1.2 booleans only: a key `n` or a value `no` stays a string.
    options.strict_booleans = true;
    options
}

fn convert(err: &serde_saphyr::Error, path: String) -> YamlError {
    let err = err.without_snippet();
    let pos = err
        .location()
        .map(|l| Pos {
            line: l.line() as u32,
            col: l.column() as u32,
        })
        .unwrap_or_default();
    let rendered = err.to_string();
    // The rendering starts with "error: line L column C: "; keep the message.
    let message = match rendered.find(": ") {
        Some(i) if rendered.starts_with("error: line ") => {
            let rest = &rendered[i + 2..];
            rest.strip_prefix(|_: char| false)
                .unwrap_or(rest)
                .to_string()
        }
        _ => rendered.clone(),
    };
    let message = strip_line_column(&message);
    // A path that ends in "?" means the parser failed before a field began:
    // a syntax error, where the path adds nothing.
    let path = if path.ends_with('?') || path == "." {
        String::new()
    } else {
        path
    };
    YamlError { pos, path, message }
}

fn strip_line_column(message: &str) -> String {
    // serde appends " at line L, column C" to some messages; the position is ours to print.
    let message = match message.rfind(" at line ") {
        Some(i) if message[i..].contains(", column ") => &message[..i],
        _ => message,
    };
    // "line 4 column 5: missing field `kind`" -> "missing field `kind`"
    if let Some(rest) = message.strip_prefix("line ")
        && let Some(i) = rest.find(": ")
        && rest[..i].contains(" column ")
    {
        return rest[i + 2..].trim().to_string();
    }
    message.trim().to_string()
}

/// Parse one YAML document into `T`, tracking the field path for errors.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let mut path = String::new();
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        let mut track = serde_path_to_error::Track::new();
        let tracked = serde_path_to_error::Deserializer::new(de, &mut track);
        let r = T::deserialize(tracked);
        if r.is_err() {
            path = track.path().to_string();
        }
        r
    });
    result.map_err(|e| convert(&e, path))
}

/// Parse a stream of YAML documents (separated by `---`) into JSON values,
/// skipping empty documents.
pub fn parse_documents(text: &str) -> Result<Vec<serde_json::Value>, YamlError> {
    let docs: Vec<Option<serde_json::Value>> =
        serde_saphyr::from_str_multiple_with_options(text, options())
            .map_err(|e| convert(&e, String::new()))?;
    Ok(docs.into_iter().flatten().collect())
}

/// Serialise a value as block-style YAML.
pub fn to_string<T: serde::Serialize>(value: &T) -> String {
    serde_saphyr::to_string(value).expect("serialising a plain value to YAML cannot fail")
}

/// A YAML tree that remembers where every node came from. Templates and
/// expressions embedded in YAML use it to point errors at the exact scalar.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub pos: Pos,
    pub value: NodeValue,
}

#[derive(Clone, Debug, PartialEq)]
pub enum NodeValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    /// The tree as plain JSON, positions dropped.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match &self.value {
            NodeValue::Null => Value::Null,
            NodeValue::Bool(b) => Value::Bool(*b),
            NodeValue::Int(i) => Value::from(*i),
            NodeValue::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            NodeValue::Str(s) => Value::String(s.clone()),
            NodeValue::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeValue::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The value under `key` of a map node.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            NodeValue::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// In a JSON Schema a node is any value: the field that holds it says more
/// (see `crate::schema`).
impl schemars::JsonSchema for Node {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AnyValue".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::Schema::from(true)
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = serde_saphyr::Spanned::<NodeValue>::deserialize(deserializer)?;
        Ok(Node {
            pos: Pos {
                line: spanned.referenced.line() as u32,
                col: spanned.referenced.column() as u32,
            },
            value: spanned.value,
        })
    }
}

impl<'de> Deserialize<'de> for NodeValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = NodeValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Null)
    }
    fn visit_none<E>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<NodeValue, D::Error> {
        NodeValue::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<NodeValue, E> {
        Ok(NodeValue::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<NodeValue, E> {
        Ok(NodeValue::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<NodeValue, E> {
        i64::try_from(v)
            .map(NodeValue::Int)
            .or(Ok(NodeValue::Float(v as f64)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<NodeValue, E> {
        Ok(NodeValue::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<NodeValue, E> {
        Ok(NodeValue::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<NodeValue, E> {
        Ok(NodeValue::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NodeValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(NodeValue::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeValue, A::Error> {
        let mut entries: Vec<(String, Node)> = Vec::new();
        while let Some(key) = map.next_key::<KeyString>()? {
            let value = map.next_value::<Node>()?;
            entries.push((key.0, value));
        }
        Ok(NodeValue::Map(entries))
    }
}

/// Map keys as strings, whatever scalar type YAML gave them.
struct KeyString(String);

impl<'de> Deserialize<'de> for KeyString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeyString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a scalar map key")
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// The shapes a JSON Schema gives to fields kept as positioned [`Node`]s
/// (which deserialize from anything): never used to parse, only to
/// describe.
pub mod shape {
    use schemars::JsonSchema;

    /// A Rhai expression, or `true`/`false`.
    #[derive(JsonSchema)]
    #[serde(untagged)]
    #[allow(dead_code)]
    pub enum Expression {
        Rhai(String),
        Constant(bool),
    }

    /// A count, or a template (in backticks) that evaluates to one.
    #[derive(JsonSchema)]
    #[serde(untagged)]
    #[allow(dead_code)]
    pub enum Count {
        Count(u64),
        Template(String),
    }

    /// A mapping whose strings may hold templates in backticks.
    pub type Object = serde_json::Map<String, serde_json::Value>;
}

/// Parse a document into a positioned tree.
pub fn parse_node(text: &str) -> Result<Node, YamlError> {
    parse::<Node>(text)
}

/// The `metadata` of one of Runbook's own YAML documents (a policy, alert
/// routes): a name, and labels and annotations for people and tools.
#[derive(
    Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct DocMeta {
    /// The document's name, unique among documents of its kind.
    pub name: String,
    /// Labels for people and tools; Runbook does not read them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Annotations for people and tools; Runbook does not read them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        spec: Spec,
    }
    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Spec {
        kind: String,
        count: Option<u32>,
    }

    #[test]
    fn a_missing_field_names_its_path_and_position() {
        let err = parse::<Doc>("spec:\n  count: 1\n").unwrap_err();
        assert_eq!(err.pos, Pos { line: 2, col: 3 });
        assert_eq!(err.path, "spec");
        assert!(err.message.contains("missing field `kind`"), "{err}");
    }

    #[test]
    fn an_unknown_field_is_an_error_at_its_key() {
        let err = parse::<Doc>("spec:\n  kind: X\n  cuont: 1\n").unwrap_err();
        assert_eq!(err.pos, Pos { line: 3, col: 3 });
        assert!(err.message.contains("unknown field `cuont`"), "{err}");
    }

    #[test]
    fn only_yaml_1_2_spellings_are_booleans() {
        // A params key `n` must not turn into `false`, nor `no` into a bool.
        let node = parse_node("n: 0\ny: no\nflag: true\n").unwrap();
        assert_eq!(
            node.to_json(),
            serde_json::json!({"n": 0, "y": "no", "flag": true})
        );
        let docs = parse_documents("on: off\n").unwrap();
        assert_eq!(docs, vec![serde_json::json!({"on": "off"})]);
    }

    #[test]
    fn a_wrong_type_names_the_field() {
        let err = parse::<Doc>("spec:\n  kind: X\n  count: many\n").unwrap_err();
        assert_eq!(err.path, "spec.count");
        assert_eq!(err.pos.line, 3);
    }

    #[test]
    fn a_syntax_error_has_a_position_and_no_path() {
        let err = parse::<Doc>("spec: {kind: X\n  count: 1\n").unwrap_err();
        assert_eq!(err.path, "");
        assert_eq!(err.pos.line, 2);
    }

    #[test]
    fn nodes_remember_where_each_scalar_is() {
        let node = parse_node("a:\n  b: '`${x}`'\n  c: [1, 2.5, true, null]\n").unwrap();
        let b = node.get("a").unwrap().get("b").unwrap();
        assert_eq!(b.pos, Pos { line: 2, col: 6 });
        assert_eq!(b.value, NodeValue::Str("`${x}`".into()));
        let json = node.to_json();
        assert_eq!(json["a"]["c"], serde_json::json!([1, 2.5, true, null]));
    }
}

/// Split a multi-document stream on `---` lines. Each part comes with the
/// number of lines before it, so positions can be made absolute again.
pub fn split_documents(text: &str) -> Vec<(u32, &str)> {
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut start_line = 0u32;
    let mut offset = 0usize;
    for (line_no, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") || trimmed == "..." {
            if offset > start {
                out.push((start_line, &text[start..offset]));
            }
            start = offset + line.len();
            start_line = line_no as u32 + 1;
        }
        offset += line.len();
    }
    if start < text.len() {
        out.push((start_line, &text[start..]));
    }
    out.retain(|(_, doc)| {
        doc.lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
    });
    out
}

impl YamlError {
    /// Shift the position by the lines before this document.
    pub fn offset(mut self, lines: u32) -> Self {
        if self.pos.line > 0 {
            self.pos.line += lines;
        }
        self
    }
}

impl Node {
    /// Shift every position by the lines before this document.
    pub fn offset(&mut self, lines: u32) {
        self.pos.line += lines;
        match &mut self.value {
            NodeValue::Seq(items) => items.iter_mut().for_each(|n| n.offset(lines)),
            NodeValue::Map(entries) => entries.iter_mut().for_each(|(_, n)| n.offset(lines)),
            _ => {}
        }
    }

    /// The node at a path of map keys.
    pub fn at(&self, path: &[&str]) -> Option<&Node> {
        path.iter().try_fold(self, |n, k| n.get(k))
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            NodeValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod split_tests {
    use super::*;

    #[test]
    fn documents_split_on_separator_lines_with_their_offsets() {
        let text = "a: 1\n---\n# comment only\n---\nb: 2\nc: 3\n";
        let docs = split_documents(text);
        assert_eq!(docs, vec![(0, "a: 1\n"), (4, "b: 2\nc: 3\n")]);
        let err = parse::<std::collections::BTreeMap<String, String>>("b: [1\n")
            .unwrap_err()
            .offset(4);
        assert_eq!(err.pos.line, 5);
    }
}
