//! The crate's layering, written once and held by this test.
//!
//! Every top-level module of `src/` is listed below with the modules it may
//! use (`crate::...` paths anywhere in its non-test code). Read from the
//! top, it is the operator's spine: what a decision can see (observe), the
//! scripts and policies that decide, the executor that acts, and the
//! runtime that drives them; then what stays off the operator's path (the
//! sandbox, scenarios, benchmarks) and the command line over everything.
//!
//! The test fails when a module uses one it may not (an upward import, or
//! the operator reaching into the sandbox), when a module is missing from
//! the table, when the table itself has a cycle, and when files inside one
//! module use each other in a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module and what it may use, lower layers first.
const LAYERS: &[(&str, &[&str])] = &[
    // Foundations: no domain knowledge, used everywhere.
    ("util", &[]),
    ("clock", &[]),
    ("names", &[]),
    ("labels", &["names"]),
    ("kinds", &[]),
    ("schedule", &[]),
    // Metrics, the journal of outcomes, and the health endpoints.
    ("telemetry", &["util"]),
    // Kubernetes Events, as every part of Runbook writes them.
    ("events", &["util"]),
    // Runbook's own CRDs (Evaluator, DatabaseBackup, AIModel, RunbookState).
    ("crd", &["schedule", "util"]),
    // Observe: watch caches, the views a decision reads, the dependencies
    // that wake targets, discovery, watch health.
    ("observe", &["kinds", "labels", "telemetry", "util"]),
    // Scripts: the hardened Rhai engine, `ctx`, helpers, actions.
    ("script", &["kinds", "labels", "names", "observe", "util"]),
    // Alerts: routing, grouping, delivery.
    ("alert", &["clock", "events", "telemetry", "util"]),
    // Policies: documents compiled into what decides.
    (
        "policy",
        &[
            "alert", "crd", "kinds", "labels", "names", "schedule", "script", "util",
        ],
    ),
    // Least privilege derived from policies.
    ("rbac", &["alert", "kinds", "policy", "util"]),
    // Admission: the webhooks Runbook serves, their certificates, and the
    // author records they write.
    ("admission", &["kinds", "observe", "policy", "util"]),
    // Decide: pure, from what is observed to a decision.
    (
        "decide",
        &[
            "crd", "kinds", "observe", "policy", "schedule", "script", "util",
        ],
    ),
    // Act: a decision planned into writes (pure), and the one writer that
    // performs them.
    (
        "act",
        &[
            "admission",
            "alert",
            "crd",
            "decide",
            "events",
            "kinds",
            "names",
            "observe",
            "policy",
            "script",
            "telemetry",
            "util",
        ],
    ),
    // Runtime: controllers, the queue, leader election, permissions.
    (
        "runtime",
        &[
            "act",
            "admission",
            "alert",
            "clock",
            "crd",
            "decide",
            "events",
            "kinds",
            "names",
            "observe",
            "policy",
            "rbac",
            "script",
            "telemetry",
            "util",
        ],
    ),
    // Hot reload: bundles from ConfigMaps and directories swapped in whole.
    (
        "reload",
        &[
            "admission",
            "alert",
            "events",
            "kinds",
            "observe",
            "policy",
            "rbac",
            "runtime",
            "script",
            "telemetry",
            "util",
        ],
    ),
    // Off the operator's path: the in-memory API server, scenarios, and
    // the benchmarks with their fixtures. Nothing above may use them.
    ("sandbox", &["clock", "labels", "names", "observe", "util"]),
    (
        "scenario",
        &[
            "admission",
            "alert",
            "clock",
            "crd",
            "kinds",
            "observe",
            "policy",
            "reload",
            "runtime",
            "sandbox",
            "script",
            "telemetry",
            "util",
        ],
    ),
    (
        "bench",
        &[
            "admission",
            "alert",
            "clock",
            "crd",
            "decide",
            "kinds",
            "labels",
            "observe",
            "policy",
            "reload",
            "runtime",
            "sandbox",
            "scenario",
            "script",
            "telemetry",
            "util",
        ],
    ),
    // The documents' JSON Schemas and the reference made from them.
    ("schema", &["alert", "policy", "scenario", "util"]),
    // The command line, over everything.
    (
        "cli",
        &[
            "act",
            "admission",
            "alert",
            "bench",
            "clock",
            "crd",
            "kinds",
            "observe",
            "policy",
            "rbac",
            "reload",
            "runtime",
            "sandbox",
            "scenario",
            "schema",
            "script",
            "telemetry",
            "util",
        ],
    ),
];

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// A file's code without comments and without its test module (which
/// clippy keeps last in the file).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string (a URL) is rare next to a path; a
            // comment is cut.
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of every `prefix` path in `code`: `crate::a::b` and
/// `crate::{a::b, c}` give `a` and `c`.
fn paths_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices(prefix) {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.insert(ident(item.trim()));
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("");
    out.remove("self");
    out
}

/// `src/a/b.rs` -> ["a", "b"]; `src/a/mod.rs` -> ["a"]; `src/a.rs` -> ["a"].
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

struct Crate {
    /// Top-level module -> the top-level modules it uses.
    uses: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// Module path of a file (not a `mod.rs`) -> sibling modules it uses.
    siblings: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn read_crate() -> Crate {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut uses: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut siblings: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in files {
        let module = module_of(&file);
        if matches!(
            module.first().map(String::as_str),
            Some("lib" | "main") | None
        ) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        let top = module[0].clone();
        let shown = file.strip_prefix(src()).unwrap().display().to_string();
        for used in paths_after(&code, "crate::") {
            if used != top {
                uses.entry(top.clone())
                    .or_default()
                    .entry(used)
                    .or_default()
                    .insert(shown.clone());
            }
        }
        uses.entry(top.clone()).or_default();
        // Files beside each other in one folder: `super::x` from `a/b.rs`,
        // or `crate::a::x`, names the sibling `a/x`.
        let is_mod = file.file_name().is_some_and(|f| f == "mod.rs");
        if module.len() >= 2 && !is_mod {
            let parent = &module[..module.len() - 1];
            let mut named = paths_after(&code, "super::");
            let own = format!("crate::{}::", parent.join("::"));
            named.extend(paths_after(&code, &own));
            for s in named {
                let mut sibling = parent.to_vec();
                sibling.push(s);
                if sibling != module && sibling_exists(&sibling) {
                    siblings.entry(module.clone()).or_default().insert(sibling);
                }
            }
        }
    }
    Crate { uses, siblings }
}

fn sibling_exists(module: &[String]) -> bool {
    let path = src().join(module.join("/"));
    path.with_extension("rs").exists() || path.join("mod.rs").exists()
}

/// A cycle in `graph`, if it has one, as the nodes along it.
fn find_cycle<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        n: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        path: &mut Vec<N>,
        done: &mut BTreeSet<N>,
    ) -> Option<Vec<N>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.clone());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.clone());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_layering_table_has_no_cycle() {
    let graph: BTreeMap<&str, BTreeSet<&str>> = LAYERS
        .iter()
        .map(|(m, deps)| (*m, deps.iter().copied().collect()))
        .collect();
    assert_eq!(find_cycle(&graph), None);
    for (m, deps) in LAYERS {
        for d in *deps {
            assert!(
                graph.contains_key(d),
                "{m} may use {d}, which is not in the table"
            );
        }
    }
}

#[test]
fn every_module_uses_only_what_its_layer_allows() {
    let allowed: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let found = read_crate();
    let mut wrong = Vec::new();
    for (module, uses) in &found.uses {
        let Some(may) = allowed.get(module.as_str()) else {
            wrong.push(format!(
                "src/{module}: not in the layering table (tests/layering.rs): place it"
            ));
            continue;
        };
        for (used, files) in uses {
            if !may.contains(&used.as_str()) {
                let files: Vec<&str> = files.iter().map(String::as_str).collect();
                wrong.push(format!(
                    "{module} uses {used} ({}), which its layer does not allow",
                    files.join(", ")
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}\n", wrong.join("\n"));
}

#[test]
fn files_in_one_module_do_not_use_each_other_in_a_cycle() {
    let found = read_crate();
    if let Some(cycle) = find_cycle(&found.siblings) {
        let shown: Vec<String> = cycle.iter().map(|m| m.join("/")).collect();
        panic!("a cycle between files: {}", shown.join(" -> "));
    }
}

#[test]
fn the_reader_sees_grouped_and_nested_paths() {
    let code = "use crate::{alert::{A, B}, policy::C};\nfn f() { crate::util::x(); }";
    let got: Vec<String> = paths_after(code, "crate::").into_iter().collect();
    assert_eq!(got, ["alert", "policy", "util"]);
    assert_eq!(
        code_of("use crate::a; // crate::b\n#[cfg(test)]\nmod tests { use crate::c; }"),
        "use crate::a; "
    );
}

/// The files that may write to the API server, and why. A decision's
/// writes all go through `act` (its writer, and the rollback it performs);
/// the rest is the operator's own bookkeeping. Off the operator's path,
/// the scenario world and the benchmarks write as clients do.
const WRITERS: &[(&str, &str)] = &[
    ("act/writer.rs", "every write a decision makes"),
    ("act/rollback.rs", "the rollback the writer performs"),
    ("events.rs", "Events, written once and counted as a series"),
    ("runtime/leader.rs", "the leader Lease"),
    (
        "runtime/access.rs",
        "SelfSubjectAccessReviews (a question, stored nowhere)",
    ),
    ("alert/nflog.rs", "the notification log ConfigMap"),
    (
        "act/authorize.rs",
        "SubjectAccessReviews and a SelfSubjectReview (questions, stored nowhere)",
    ),
    (
        "admission/config.rs",
        "the webhook's certificate Secret and its webhook configuration",
    ),
    (
        "scenario/run.rs",
        "the authorship webhook's configuration in a scenario's API server",
    ),
    ("scenario/world.rs", "what a scenario's world does"),
    ("bench/operator.rs", "benchmark fixtures"),
    ("bench/reload.rs", "benchmark fixtures"),
    ("bench/sandbox.rs", "benchmark fixtures"),
];

/// Writes to the API server take `PatchParams`, `PostParams` or
/// `DeleteParams`: only the files above may build them.
#[test]
fn only_the_writers_write_to_the_api() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src()).unwrap().display().to_string();
        if rel.starts_with("sandbox/") || WRITERS.iter().any(|(w, _)| *w == rel) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for params in ["PatchParams", "PostParams", "DeleteParams"] {
            if code.contains(params) {
                wrong.push(format!(
                    "{rel} uses {params}: write through act::Writer, or list it in WRITERS with why"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}\n", wrong.join("\n"));
}

/// No span guard is held in async code: a guard kept across an `.await`
/// stays entered on the worker thread the future left, and a reconcile
/// resumed on another thread corrupts the subscriber's span stacks (it
/// once crashed a controller at 5,000 targets). Futures carry their span
/// with `.instrument(span)`.
#[test]
fn no_span_guard_is_held_in_async_code() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.contains(".enter()") && !line.trim_start().starts_with("//") {
                wrong.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "span guards (use .instrument(span) instead):\n{}",
        wrong.join("\n")
    );
}
