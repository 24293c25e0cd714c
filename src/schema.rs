//! JSON Schemas of the documents people write — Policy, AlertRoutes and
//! Scenario — made from the very types their loaders deserialize into, so
//! an editor validates and completes exactly what Runbook accepts; and the
//! field reference (`docs/reference.md`) made from the same schemas.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use runbook_core::alert::model::AlertRoutesDoc;
use runbook_core::policy::model::{API_VERSION, PolicyDoc};
use runbook_simulator::model::{ACTIONS, RESULTS, ScenarioDoc};

/// A document kind that has a schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocKind {
    Policy,
    AlertRoutes,
    Scenario,
}

impl DocKind {
    pub const ALL: [DocKind; 3] = [DocKind::Policy, DocKind::AlertRoutes, DocKind::Scenario];

    pub fn name(self) -> &'static str {
        match self {
            DocKind::Policy => "Policy",
            DocKind::AlertRoutes => "AlertRoutes",
            DocKind::Scenario => "Scenario",
        }
    }

    /// The file `runbook schema --out-dir` writes, and the shipped copy in
    /// `schemas/`.
    pub fn file_name(self) -> String {
        format!("{}.schema.json", self.name().to_ascii_lowercase())
    }

    /// A kind as typed: any case, `policies`/`alertroutes` too.
    pub fn parse(text: &str) -> Result<DocKind, String> {
        let t = text.to_ascii_lowercase();
        let t = t.trim_end_matches('s');
        let t = t
            .strip_suffix("ie")
            .map_or(t.to_string(), |s| format!("{s}y"));
        DocKind::ALL
            .into_iter()
            .find(|k| {
                let n = k.name().to_ascii_lowercase();
                n.trim_end_matches('s') == t
            })
            .ok_or_else(|| {
                let names: Vec<&str> = DocKind::ALL.iter().map(|k| k.name()).collect();
                format!("no schema for {text:?}: want one of {}", names.join(", "))
            })
    }

    fn summary(self) -> &'static str {
        match self {
            DocKind::Policy => {
                "What a policy acts on, what it may touch, and how it decides: a script or steps."
            }
            DocKind::AlertRoutes => {
                "An Alertmanager-style routing tree: routes, receivers, inhibition rules, time intervals."
            }
            DocKind::Scenario => {
                "A simulated world over time: initial objects, standing rules, a timeline of world events and expectations, the final state."
            }
        }
    }
}

/// The JSON Schema (draft-07, which every YAML editor reads) of a document.
pub fn schema(kind: DocKind) -> Value {
    let generator = SchemaSettings::draft07().into_generator();
    let mut s = match kind {
        DocKind::Policy => generator.into_root_schema_for::<PolicyDoc>(),
        DocKind::AlertRoutes => generator.into_root_schema_for::<AlertRoutesDoc>(),
        DocKind::Scenario => generator.into_root_schema_for::<ScenarioDoc>(),
    }
    .to_value();
    s["title"] = json!(kind.name());
    s["description"] = json!(kind.summary());
    s["properties"]["apiVersion"] = json!({
        "description": "The document's API version.",
        "const": API_VERSION,
    });
    s["properties"]["kind"] = json!({
        "description": "The document's kind.",
        "const": kind.name(),
    });
    s
}

/// The schema as the shipped file holds it (pretty, ending in a newline).
pub fn schema_text(kind: DocKind) -> String {
    let mut t = serde_json::to_string_pretty(&schema(kind)).unwrap_or_default();
    t.push('\n');
    t
}

/// Follow a `$ref` into the root's definitions.
fn resolve<'a>(root: &'a Value, s: &'a Value) -> (&'a Value, Option<String>) {
    // A reference with siblings (a default, a description) is written
    // `allOf: [{$ref}]` in draft-07.
    if let Some([only]) = s.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
        return resolve(root, only);
    }
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or(r).to_string();
            let target = root
                .get("definitions")
                .and_then(|d| d.get(&name))
                .unwrap_or(&Value::Null);
            (target, Some(name))
        }
        None => (s, None),
    }
}

/// The alternatives of a schema that is one of several (`anyOf`/`oneOf`).
fn alternatives(s: &Value) -> Option<&Vec<Value>> {
    s.get("anyOf")
        .or_else(|| s.get("oneOf"))
        .and_then(Value::as_array)
}

/// A type as a person reads it: `string`, `list of string`, `integer or
/// string`, `map of string`, `"Policy"`.
fn type_name(root: &Value, s: &Value) -> String {
    let (s, named) = resolve(root, s);
    if let Some(c) = s.get("const") {
        return c.to_string();
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        let v: Vec<String> = e.iter().map(Value::to_string).collect();
        return format!("one of {}", v.join(", "));
    }
    if let Some(alts) = alternatives(s) {
        let names: Vec<String> = alts
            .iter()
            .map(|a| type_name(root, a))
            .filter(|n| !n.is_empty())
            .collect();
        return names.join(" or ");
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if s == &Value::Bool(true) => return "any".into(),
        _ => return named.unwrap_or_else(|| "any".into()),
    };
    let types: Vec<String> = types
        .into_iter()
        .filter(|t| *t != "null")
        .map(|t| match t {
            "array" => format!(
                "list of {}",
                type_name(root, s.get("items").unwrap_or(&Value::Bool(true)))
            ),
            "object" if s.get("properties").is_none() => match s.get("additionalProperties") {
                Some(v @ Value::Object(_)) => format!("map of {}", type_name(root, v)),
                _ => "mapping".into(),
            },
            "object" => "mapping".into(),
            other => other.into(),
        })
        .collect();
    types.join(" or ")
}

/// One field of the reference.
struct Row {
    path: String,
    type_: String,
    required: bool,
    default: Option<String>,
    description: String,
}

/// The fields below `s` (an object schema), depth first, in declared order.
fn rows(root: &Value, s: &Value, prefix: &str, seen: &mut Vec<String>, out: &mut Vec<Row>) {
    let (s, named) = resolve(root, s);
    if let Some(n) = &named {
        if seen.contains(n) {
            return;
        }
        seen.push(n.clone());
    }
    let required: BTreeSet<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (key, p) in props {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            let description = description_of(root, p);
            out.push(Row {
                path: path.clone(),
                type_: type_name(root, p),
                required: required.contains(key.as_str()),
                default: p
                    .get("default")
                    .filter(|d| !d.is_null() && d != &&json!([]) && d != &&json!({}))
                    .map(Value::to_string),
                description,
            });
            for (child, child_path) in children(root, p, &path) {
                rows(root, child, &child_path, seen, out);
            }
        }
    }
    if named.is_some() {
        seen.pop();
    }
}

/// Where the fields of a field's value are: itself, its items, or the
/// object among its alternatives.
fn children<'a>(root: &'a Value, p: &'a Value, path: &str) -> Vec<(&'a Value, String)> {
    let (r, _) = resolve(root, p);
    if r.get("properties").is_some() {
        return vec![(p, path.to_string())];
    }
    if let Some(items) = r.get("items") {
        let (i, _) = resolve(root, items);
        if i.get("properties").is_some() {
            return vec![(items, format!("{path}[]"))];
        }
    }
    if let Some(alts) = alternatives(r) {
        return alts
            .iter()
            .filter(|a| resolve(root, a).0.get("properties").is_some())
            .map(|a| (a, path.to_string()))
            .collect();
    }
    Vec::new()
}

/// A field's own description, else its type's (through `$ref` and the
/// alternatives of an optional value).
fn description_of(root: &Value, p: &Value) -> String {
    let own = p.get("description").and_then(Value::as_str);
    let (r, _) = resolve(root, p);
    let theirs = r.get("description").and_then(Value::as_str).or_else(|| {
        alternatives(r)?
            .iter()
            .find_map(|a| resolve(root, a).0.get("description")?.as_str())
    });
    own.or(theirs).unwrap_or("").replace('\n', " ")
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn table(out: &mut String, rows: &[Row]) {
    out.push_str("| Field | Type | | Description |\n|---|---|---|---|\n");
    for r in rows {
        let mut d = cell(&r.description);
        if let Some(def) = r.default.as_ref().filter(|_| !d.contains("default")) {
            let _ = write!(d, " Default: `{}`.", cell(def));
        }
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            r.path,
            cell(&r.type_),
            if r.required { "required" } else { "" },
            d
        );
    }
}

/// Every field of a document, `spec` first level and below.
fn fields_of(kind: DocKind) -> Vec<Row> {
    let s = schema(kind);
    let mut out = Vec::new();
    if kind == DocKind::Scenario {
        // World events have their own section.
        let mut spec = s.clone();
        if let Some(world) = spec.pointer_mut("/definitions/StepSpec/properties/world") {
            *world = json!({"description": world["description"], "type": "array", "items": {"type": "object"}});
        }
        rows(&spec, &spec, "", &mut Vec::new(), &mut out);
    } else {
        rows(&s, &s, "", &mut Vec::new(), &mut out);
    }
    out
}

/// The world events of a scenario: name, description, fields.
fn world_events() -> Vec<(String, String, Vec<Row>)> {
    let s = schema(DocKind::Scenario);
    let Some(alts) = s.pointer("/definitions/WorldEvent").and_then(alternatives) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in alts {
        let Some((name, body)) = a
            .get("properties")
            .and_then(Value::as_object)
            .and_then(|p| p.iter().next())
        else {
            continue;
        };
        let mut rows_ = Vec::new();
        rows(&s, body, name, &mut Vec::new(), &mut rows_);
        let description = a
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| description_of(&s, body));
        out.push((name.clone(), description.replace('\n', " "), rows_));
    }
    out
}

const HEAD: &str = "\
# Reference

Every field of the documents Runbook reads, every world event and
expectation action of a scenario. Generated by `runbook schema --reference`
from the same schemas `runbook schema KIND` prints (and `schemas/` ships);
a test fails when this file is stale. Regenerate with

    cargo run -q -- schema --reference > docs/reference.md

## Editors

Each document kind has a JSON Schema: `runbook schema Policy`,
`runbook schema AlertRoutes`, `runbook schema Scenario` print them, and the
repository ships them in `schemas/`. With the YAML language server (VS Code's
YAML extension, Neovim, Helix, Emacs lsp-mode), a first line naming the schema
makes the editor validate the file and complete its fields as you type:

    # yaml-language-server: $schema=../schemas/policy.schema.json
    apiVersion: runbook.dev/v1alpha1
    kind: Policy

The path is relative to the file (a URL works too). Fields are strict: a key
the schema does not list is an error, in the editor and in `runbook check`.

";

const GLOBS: &str = "\
## Globs

Names in expectations (`name`) and in the world events `complete`,
`podReady`, `snapshotReady`, `update` and `delete` are globs: `*` matches any
run of characters (none included), `?` exactly one, everything else itself.
`chatbot-eval-*` matches every benchmark Job of the Evaluator `chatbot`.
A world event whose glob matches nothing fails the scenario at its position
(an event that does nothing is a mistake, not a no-op); a glob matching
several objects acts on each. An absent name in `complete`, `podReady` and
`snapshotReady` means `*`.

## `update` with `status: true`

`update` merge-patches an object (RFC 7386: maps merge, `null` deletes a key,
anything else replaces). With `status: true` the patch is of the object's
**status**, written through the status subresource as a controller writes it:
`patch: {phase: Ready}` sets `.status.phase`. Do not wrap it in `status:`;
`patch: {status: {phase: Ready}}` would set `.status.status.phase`. Without
`status: true` the patch is of the whole object (`patch: {spec: {...}}`),
and a status in it is dropped where the kind has a status subresource, as
the API server drops it.
";

/// The Markdown reference of every document.
pub fn reference() -> String {
    let mut out = String::from(HEAD);
    for kind in DocKind::ALL {
        let _ = writeln!(out, "## {}\n\n{}\n", kind.name(), kind.summary());
        table(&mut out, &fields_of(kind));
        out.push('\n');
        if kind == DocKind::Scenario {
            out.push_str("### World events\n\nEach item of a step's `world` is one of these.\n\n");
            for (name, description, rows_) in world_events() {
                let _ = writeln!(out, "#### `{name}`\n\n{description}\n");
                if !rows_.is_empty() {
                    table(&mut out, &rows_);
                    out.push('\n');
                }
            }
            out.push_str(
                "### Expectation actions\n\nAn expectation's `action` (or `none`) is one of:\n\n",
            );
            for (action, what) in ACTIONS {
                let _ = writeln!(out, "- `{action}`: {what}");
            }
            out.push_str("\nIts `result` is one of:\n\n");
            for (result, what) in RESULTS {
                let _ = writeln!(out, "- `{result}`: {what}");
            }
            out.push('\n');
        }
    }
    out.push_str(GLOBS);
    out
}

/// Fields whose schema says nothing about them (the reference would show
/// an empty description): `Kind path` each.
pub fn undocumented() -> Vec<String> {
    let mut out = Vec::new();
    for kind in DocKind::ALL {
        for r in fields_of(kind) {
            if r.description.trim().is_empty() {
                out.push(format!("{} {}", kind.name(), r.path));
            }
        }
    }
    for (name, description, rows_) in world_events() {
        if description.trim().is_empty() {
            out.push(format!("Scenario world event {name}"));
        }
        for r in rows_ {
            if r.description.trim().is_empty() {
                out.push(format!("Scenario world event {}", r.path));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_found_as_people_type_them() {
        assert_eq!(DocKind::parse("policy"), Ok(DocKind::Policy));
        assert_eq!(DocKind::parse("Policies"), Ok(DocKind::Policy));
        assert_eq!(DocKind::parse("alertroutes"), Ok(DocKind::AlertRoutes));
        assert_eq!(DocKind::parse("SCENARIO"), Ok(DocKind::Scenario));
        let e = DocKind::parse("Evaluator").unwrap_err();
        assert!(e.contains("Policy, AlertRoutes, Scenario"), "{e}");
    }

    #[test]
    fn a_schema_pins_its_kind_and_forbids_unknown_fields() {
        let s = schema(DocKind::Policy);
        assert_eq!(s["properties"]["kind"]["const"], "Policy");
        assert_eq!(s["additionalProperties"], false);
        let spec = &s["definitions"]["PolicySpec"];
        assert_eq!(spec["additionalProperties"], false);
        assert!(spec["properties"]["selector"].is_object());
    }

    #[test]
    fn every_field_of_every_document_is_described() {
        let missing = undocumented();
        assert!(
            missing.is_empty(),
            "fields without a doc comment (the reference shows nothing for them):\n{}",
            missing.join("\n")
        );
    }
}
