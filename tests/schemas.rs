//! The JSON Schemas editors validate with: current in `schemas/` and
//! `docs/reference.md`, accepting every document Runbook ships, and
//! refusing the mistakes the loaders refuse.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::{Path, PathBuf};

use runbook::schema::{self, DocKind};
use runbook_core::policy::compile::load_bundle;
use runbook_core::policy::{Bundle, Origin};
use runbook_core::script::ScriptEngine;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_shipped_schemas_and_reference_are_current() {
    let mut stale = Vec::new();
    for kind in DocKind::ALL {
        let path = root().join("schemas").join(kind.file_name());
        if std::fs::read_to_string(&path).ok() != Some(schema::schema_text(kind)) {
            stale.push(format!(
                "{} is stale: cargo run -q -- schema --out-dir schemas",
                path.display()
            ));
        }
    }
    let reference = root().join("docs/reference.md");
    if std::fs::read_to_string(&reference).ok() != Some(schema::reference()) {
        stale.push(format!(
            "{} is stale: cargo run -q -- schema --reference > docs/reference.md",
            reference.display()
        ));
    }
    let functions = root().join("docs/script-functions.md");
    if std::fs::read_to_string(&functions).ok() != Some(runbook_core::script::reference::markdown())
    {
        stale.push(format!(
            "{} is stale: cargo run -q -- schema --functions > docs/script-functions.md",
            functions.display()
        ));
    }
    assert!(stale.is_empty(), "\n{}\n", stale.join("\n"));
}

/// The kind a YAML file's documents declare, where it is one with a schema.
fn kind_of(text: &str) -> Option<DocKind> {
    let line = text.lines().find(|l| l.starts_with("kind: "))?;
    DocKind::ALL
        .into_iter()
        .find(|k| line.trim_end() == format!("kind: {}", k.name()))
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(p);
        }
    }
}

struct Validator {
    schemas: boon::Schemas,
    index: Vec<(DocKind, boon::SchemaIndex)>,
}

impl Validator {
    fn new() -> Self {
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        let mut index = Vec::new();
        for kind in DocKind::ALL {
            let loc = format!("file:///runbook/{}", kind.file_name());
            compiler
                .add_resource(&loc, schema::schema(kind))
                .expect("schema resource");
            let i = compiler
                .compile(&loc, &mut schemas)
                .unwrap_or_else(|e| panic!("{} does not compile: {e}", kind.name()));
            index.push((kind, i));
        }
        Validator { schemas, index }
    }

    /// The schema's complaint about a document, if any.
    fn check(&self, kind: DocKind, doc: &Value) -> Result<(), String> {
        let (_, i) = self.index.iter().find(|(k, _)| *k == kind).expect("kind");
        self.schemas.validate(doc, *i).map_err(|e| format!("{e:#}"))
    }
}

#[test]
fn every_shipped_policy_routes_and_scenario_file_validates() {
    let v = Validator::new();
    let mut files = Vec::new();
    for dir in ["policies", "examples", "deploy"] {
        yaml_files(&root().join(dir), &mut files);
    }
    files.sort();
    let mut checked = [0usize; 3];
    let mut wrong = Vec::new();
    for f in &files {
        let text = read(f);
        let Some(kind) = kind_of(&text) else {
            continue;
        };
        let docs = runbook_core::util::yaml::parse_documents(&text)
            .unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
        for doc in &docs {
            if let Err(e) = v.check(kind, doc) {
                wrong.push(format!("{}: {e}", f.display()));
            }
        }
        checked[DocKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)] += 1;
        // Where a file names its schema for the editor, it names the
        // right one, and the path leads to it.
        if let Some(line) = text
            .lines()
            .find(|l| l.starts_with("# yaml-language-server: $schema="))
        {
            let named = line.trim_start_matches("# yaml-language-server: $schema=");
            let target = f.parent().unwrap_or(Path::new(".")).join(named);
            if !named.ends_with(&kind.file_name()) || !target.is_file() {
                wrong.push(format!(
                    "{}: names the schema {named}, want a path to schemas/{}",
                    f.display(),
                    kind.file_name()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}\n", wrong.join("\n"));
    let [policies, routes, scenarios] = checked;
    assert!(
        policies >= 6 && routes >= 1 && scenarios >= 14,
        "found too few documents: {policies} policies, {routes} routes, {scenarios} scenarios"
    );
}

fn yaml(text: &str) -> Value {
    runbook_core::util::yaml::parse_documents(text)
        .expect("yaml")
        .remove(0)
}

const POLICY: &str = "\
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: p}
spec:
  target: {apiVersion: runbook.dev/v1alpha1, kind: Evaluator}
  script: p.rhai
";

#[test]
fn the_schema_refuses_what_the_loader_refuses_and_says_where() {
    let v = Validator::new();
    assert_eq!(v.check(DocKind::Policy, &yaml(POLICY)), Ok(()));
    let cases = [
        // A misspelt key.
        (POLICY.replace("  script:", "  scirpt:"), "scirpt"),
        // A mode that is not one.
        (format!("{POLICY}  mode: enforcing\n"), "/spec/mode"),
        // The old plain-map selector.
        (format!("{POLICY}  selector: {{team: ml}}\n"), "team"),
        // A step without its name.
        (
            format!("{POLICY}  steps:\n  - apply: {{template: job.yaml}}\n"),
            "name",
        ),
        // A LabelSelector expression without an operator.
        (
            format!("{POLICY}  selector: {{matchExpressions: [{{key: team}}]}}\n"),
            "operator",
        ),
        // Another document's kind.
        (POLICY.replace("kind: Policy", "kind: Policies"), "/kind"),
    ];
    for (text, says) in cases {
        let e = v
            .check(DocKind::Policy, &yaml(&text))
            .expect_err(&format!("accepted:\n{text}"));
        assert!(e.contains(says), "want {says:?} in:\n{e}\nfor:\n{text}");
        // The loader refuses it too (no schema is stricter than Runbook).
        let files = [
            ("p.yaml".to_string(), text.clone()),
            (
                "p.rhai".to_string(),
                "fn reconcile(ctx) { #{} }".to_string(),
            ),
        ];
        let bundle = Bundle::new(Origin::Inline("schema test".into()), files.into());
        let loaded = load_bundle(&ScriptEngine::default(), &bundle, None);
        assert!(
            !loaded.errors.is_empty(),
            "the loader accepts what the schema refuses:\n{text}"
        );
    }
    // Scenarios: an unknown world event, an expectation's unknown key.
    let scenario = "apiVersion: runbook.dev/v1alpha1\nkind: Scenario\nmetadata: {name: s}\nspec:\n  timeline:\n  - at: 1m\n";
    assert_eq!(v.check(DocKind::Scenario, &yaml(scenario)), Ok(()));
    for (tail, says) in [
        ("    world: [{explode: {}}]\n", "world"),
        ("    expect: [{action: apply, knid: Job}]\n", "knid"),
        (
            "    world: [{complete: {name: a, succeded: true}}]\n",
            "succeded",
        ),
    ] {
        let e = v
            .check(DocKind::Scenario, &yaml(&format!("{scenario}{tail}")))
            .expect_err(tail);
        assert!(e.contains(says), "want {says:?} in:\n{e}");
    }
    // Routes: a receiver with a misspelt kind of delivery.
    let routes = "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: r}\nspec:\n  route: {receiver: x}\n  receivers:\n  - name: x\n    slak: {url: 'http://127.0.0.1:1'}\n";
    let e = v
        .check(DocKind::AlertRoutes, &yaml(routes))
        .expect_err("slak");
    assert!(e.contains("slak"), "{e}");
}
