//! The workspace's layering, written once and held by this test.
//!
//! Between crates, the crate graph holds it: `runbook-core` (policies,
//! scripts, decisions, plans) has no Kubernetes client anywhere below it,
//! and each product depends only on the crates listed in `PRODUCTS`
//! (checked here against `cargo metadata`). Inside the core, the operator
//! and the command, every top-level module is listed below with the
//! modules of its own crate it may use (`crate::...` paths anywhere in its
//! non-test code). Read from the top, it is the spine: what a decision can
//! see, the scripts and policies that decide, the plan; then the operator
//! that watches, writes and drives them; the command line over everything.
//!
//! The tests fail when a crate gains a dependency its product may not have,
//! when the core can reach a client, when a module uses one it may not (an
//! upward import), when a module is missing from its table, when a table
//! has a cycle, and when files inside one module use each other in a cycle.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each workspace crate, the workspace crates it may depend on, and the
/// packages that must never be among its dependencies (normal ones, to any
/// depth).
const PRODUCTS: &[(&str, &[&str], &[&str])] = &[
    // The process's unsafe edges: below everything, knowing nothing.
    (
        "runbook-sys",
        &[],
        &["kube", "kube-client", "hyper", "serde", "rhai"],
    ),
    (
        "runbook-core",
        &["runbook-sys"],
        &[
            "kube",
            "kube-client",
            "kube-runtime",
            "hyper",
            "tower",
            "rustls",
            "plotters",
        ],
    ),
    (
        "runbook-operator",
        &["runbook-core"],
        &["plotters", "k8s-pb", "prost"],
    ),
    ("runbook-sandbox", &["runbook-core"], &["plotters"]),
    (
        "runbook-simulator",
        &["runbook-core", "runbook-operator", "runbook-sandbox"],
        &[],
    ),
    (
        "runbook-bench",
        &[
            "runbook-sys",
            "runbook-core",
            "runbook-operator",
            "runbook-sandbox",
            "runbook-simulator",
        ],
        &[],
    ),
];

/// Each module of a crate and the modules of the same crate it may use.
type Layers = &'static [(&'static str, &'static [&'static str])];

/// The core: foundations, then what a decision sees, decides and plans.
const CORE: Layers = &[
    // Foundations: no domain knowledge, used everywhere.
    ("util", &[]),
    ("clock", &["util"]),
    ("names", &["util"]),
    ("labels", &["names"]),
    ("kinds", &[]),
    ("schedule", &["util"]),
    // Which replica decides for which target (the ring of `--shards`).
    ("shard", &["util"]),
    // Metric inputs: queries quoted for PromQL, bounded, answers read.
    ("metric", &["util"]),
    // Runbook's own CRDs (Evaluator, DatabaseBackup, AIModel, RunbookState).
    ("crd", &["schedule", "util"]),
    // The object model a decision reads.
    ("observe", &["kinds", "labels", "util"]),
    // Scripts: the hardened Rhai engine, `ctx`, helpers, actions.
    (
        "script",
        &["kinds", "labels", "metric", "names", "observe", "util"],
    ),
    // Alert routes and the alerts raised.
    ("alert", &["util"]),
    // The kinds of failure and refusal every layer's error names.
    ("failure", &["kinds", "script"]),
    // Policies: documents compiled into what decides.
    (
        "policy",
        &[
            "alert", "crd", "kinds", "labels", "metric", "names", "schedule", "script", "util",
        ],
    ),
    // Decide: from what is observed to a decision.
    (
        "decide",
        &[
            "crd", "failure", "kinds", "metric", "observe", "policy", "schedule", "script", "util",
        ],
    ),
    // The plan: a decision turned into writes, and their conclusion.
    (
        "plan",
        &[
            "alert", "crd", "decide", "failure", "kinds", "metric", "observe", "policy", "script",
            "shard", "util",
        ],
    ),
];

/// The operator, over the core (which it reaches as `runbook_core`).
const OPERATOR: Layers = &[
    ("util", &[]),
    // Metrics, the journal of outcomes, and the health endpoints.
    ("telemetry", &["util"]),
    // Kubernetes Events, as every part of Runbook writes them.
    ("events", &["util"]),
    // Watch caches, views, indexes, discovery, watch health.
    ("observe", &["telemetry", "util"]),
    // Alert grouping, the notification log, delivery.
    ("alert", &["events", "telemetry", "util"]),
    // Least privilege derived from policies.
    ("rbac", &["alert", "util"]),
    // The webhooks Runbook serves, their certificates, author records.
    ("admission", &["util"]),
    // The plan performed: the one writer, authorization, rollbacks.
    (
        "act",
        &[
            "admission",
            "alert",
            "events",
            "observe",
            "telemetry",
            "util",
        ],
    ),
    // Controllers, the queue, leader election, permissions.
    (
        "runtime",
        &[
            "act",
            "admission",
            "alert",
            "events",
            "observe",
            "rbac",
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
            "observe",
            "rbac",
            "runtime",
            "telemetry",
            "util",
        ],
    ),
];

/// The `runbook` command: its own modules (the products it runs are
/// crates, named as `runbook_core::policy`, `runbook_sandbox`, ...; the
/// crate graph holds their order).
const COMMAND: Layers = &[("schema", &[]), ("cli", &["schema"])];

/// The crates whose modules have a table, by source folder.
const TABLES: &[(&str, Layers)] = &[
    ("crates/core/src", CORE),
    ("crates/operator/src", OPERATOR),
    ("src", COMMAND),
];

/// Every source folder of the workspace.
const SOURCES: &[&str] = &[
    "crates/core/src",
    "crates/operator/src",
    "crates/sandbox/src",
    "crates/simulator/src",
    "crates/bench/src",
    "crates/sys/src",
    "src",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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

/// Every Rust file of the products' sources (`SOURCES`), sorted.
fn product_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for folder in SOURCES {
        rust_files(&root().join(folder), &mut files);
    }
    files
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
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
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

fn read_crate(folder: &str) -> Crate {
    let src = root().join(folder);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut uses: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut siblings: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in files {
        let module = module_of(&src, &file);
        if matches!(
            module.first().map(String::as_str),
            Some("lib" | "main") | None
        ) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        let top = module[0].clone();
        let shown = file.strip_prefix(root()).unwrap().display().to_string();
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
                if sibling != module && sibling_exists(&src, &sibling) {
                    siblings.entry(module.clone()).or_default().insert(sibling);
                }
            }
        }
    }
    Crate { uses, siblings }
}

fn sibling_exists(src: &Path, module: &[String]) -> bool {
    let path = src.join(module.join("/"));
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
fn the_layering_tables_have_no_cycle() {
    for (folder, layers) in TABLES {
        let graph: BTreeMap<&str, BTreeSet<&str>> = layers
            .iter()
            .map(|(m, deps)| (*m, deps.iter().copied().collect()))
            .collect();
        assert_eq!(find_cycle(&graph), None, "{folder}");
        assert_eq!(graph.len(), layers.len(), "{folder}: a module listed twice");
        for (m, deps) in *layers {
            for d in *deps {
                assert!(
                    graph.contains_key(d),
                    "{folder}: {m} may use {d}, which is not in the table"
                );
            }
        }
    }
}

#[test]
fn every_module_uses_only_what_its_layer_allows() {
    let mut wrong = Vec::new();
    for (folder, layers) in TABLES {
        let allowed: BTreeMap<&str, &[&str]> = layers.iter().copied().collect();
        let found = read_crate(folder);
        for (module, uses) in &found.uses {
            let Some(may) = allowed.get(module.as_str()) else {
                wrong.push(format!(
                    "{folder}/{module}: not in the layering table (tests/layering.rs): place it"
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
    }
    assert!(wrong.is_empty(), "\n{}\n", wrong.join("\n"));
}

#[test]
fn files_in_one_module_do_not_use_each_other_in_a_cycle() {
    for folder in SOURCES {
        let found = read_crate(folder);
        if let Some(cycle) = find_cycle(&found.siblings) {
            let shown: Vec<String> = cycle.iter().map(|m| m.join("/")).collect();
            panic!("{folder}: a cycle between files: {}", shown.join(" -> "));
        }
    }
}

/// The platform this is built for (`rustc -vV`'s host).
fn host() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = std::process::Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("rustc -vV runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// The workspace's packages and, for each, the packages its normal
/// dependencies reach (to any depth), from `cargo metadata` for this
/// platform: offline, it needs only what the build downloaded (the other
/// platforms' packages a fresh clone has never fetched are left out).
fn crate_graph() -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host()])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let name_of: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    // Package -> its normal (not dev, not build) dependencies.
    let mut normal: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"].as_array().unwrap().iter().filter(|d| {
            d["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null())
        });
        normal.insert(
            node["id"].as_str().unwrap(),
            deps.map(|d| d["pkg"].as_str().unwrap()).collect(),
        );
    }
    let mut graph = BTreeMap::new();
    for member in meta["workspace_members"].as_array().unwrap() {
        let id = member.as_str().unwrap();
        let direct: BTreeSet<String> = normal[id].iter().map(|d| name_of[d].to_string()).collect();
        let mut reached = BTreeSet::new();
        let mut todo: Vec<&str> = normal[id].clone();
        while let Some(d) = todo.pop() {
            if reached.insert(name_of[d].to_string()) {
                todo.extend(normal.get(d).into_iter().flatten());
            }
        }
        graph.insert(name_of[id].to_string(), (direct, reached));
    }
    graph
}

#[test]
fn each_product_depends_only_on_what_it_may() {
    let graph = crate_graph();
    let mut wrong = Vec::new();
    for (name, (direct, reached)) in &graph {
        if name == "runbook" {
            continue;
        }
        let Some((_, may, never)) = PRODUCTS.iter().find(|(p, _, _)| p == name) else {
            wrong.push(format!(
                "{name}: not in PRODUCTS (tests/layering.rs): place it"
            ));
            continue;
        };
        for d in direct.iter().filter(|d| d.starts_with("runbook")) {
            if !may.contains(&d.as_str()) {
                wrong.push(format!("{name} depends on {d}, which its product may not"));
            }
        }
        for n in *never {
            if reached.contains(*n) {
                wrong.push(format!("{name} reaches {n}, which it must never"));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}\n", wrong.join("\n"));
    // The facts the issue of a client-free core rests on, said plainly.
    let (_, core) = &graph["runbook-core"];
    assert!(!core.contains("kube-client"), "{core:?}");
    assert!(
        core.contains("kube-core"),
        "the core uses kube-core's types"
    );
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
/// the scenario world and the benchmarks write as clients do (paths from
/// the workspace's root).
const WRITERS: &[(&str, &str)] = &[
    (
        "crates/operator/src/act/writer.rs",
        "every write a decision makes",
    ),
    (
        "crates/operator/src/act/rollback.rs",
        "the rollback the writer performs",
    ),
    (
        "crates/operator/src/events.rs",
        "Events, written once and counted as a series",
    ),
    ("crates/operator/src/runtime/leader.rs", "the leader Lease"),
    (
        "crates/operator/src/runtime/shard/assign.rs",
        "the shard labels that place targets on replicas, and the ring it publishes",
    ),
    (
        "crates/operator/src/alert/shared.rs",
        "a sharded replica's published alerts",
    ),
    (
        "crates/bench/src/scaleout.rs",
        "the scale-out bench's CRDs and Items on a real cluster",
    ),
    (
        "crates/operator/src/runtime/access.rs",
        "SelfSubjectAccessReviews (a question, stored nowhere)",
    ),
    (
        "crates/operator/src/alert/nflog.rs",
        "the notification log ConfigMap",
    ),
    (
        "crates/operator/src/reload/last_good.rs",
        "the last good version of each policy ConfigMap, kept in the operator's namespace",
    ),
    (
        "crates/operator/src/act/authorize.rs",
        "SubjectAccessReviews and a SelfSubjectReview (questions, stored nowhere)",
    ),
    (
        "crates/operator/src/admission/config.rs",
        "the webhook's certificate Secret and its webhook configuration",
    ),
    (
        "crates/simulator/src/run.rs",
        "the authorship webhook's configuration in a scenario's API server",
    ),
    (
        "crates/simulator/src/world.rs",
        "what a scenario's world does",
    ),
    ("crates/bench/src/operator.rs", "benchmark fixtures"),
    (
        "crates/bench/src/admission.rs",
        "server-side dry runs of the shipped policies (nothing stored)",
    ),
    ("crates/bench/src/reload.rs", "benchmark fixtures"),
    ("crates/bench/src/sandbox.rs", "benchmark fixtures"),
];

/// Writes to the API server take `PatchParams`, `PostParams` or
/// `DeleteParams`: only the files above may build them.
#[test]
fn only_the_writers_write_to_the_api() {
    let files = product_files();
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        if rel.starts_with("crates/sandbox/") || WRITERS.iter().any(|(w, _)| *w == rel) {
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
    let files = product_files();
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

/// One name per thing: no crate re-exports another crate's items, whole
/// (`pub use runbook_core::util::*`) or renamed (`pub use runbook_sandbox
/// as sandbox`), so a reader and a search find each item under the crate
/// that defines it.
#[test]
fn no_crate_gives_another_crates_items_a_second_name() {
    let files = product_files();
    let mut wrong = Vec::new();
    for file in files {
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for stmt in code.split(';') {
            let stmt = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
            let Some(rest) = stmt.split("pub use ").nth(1) else {
                continue;
            };
            if rest.starts_with("runbook_") {
                let rel = file.strip_prefix(root()).unwrap().display();
                wrong.push(format!("{rel}: pub use {rest}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "re-exports of another crate (name the item by its own crate instead):\n{}",
        wrong.join("\n")
    );
}

/// Locks are taken one way: `runbook_core::util::{lock, read, write}`,
/// which take over what a panicking thread left (every lock guards data
/// valid between any two statements) instead of panicking in turn.
#[test]
fn every_lock_is_taken_through_util() {
    let files = product_files();
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        if rel == "crates/core/src/util/mod.rs" || rel.starts_with("crates/bench/") {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        let flat: String = code.split_whitespace().collect();
        for taken in ["lock()", "read()", "write()"] {
            for after in [".expect(", ".unwrap()", ".unwrap_or_else("] {
                if flat.contains(&format!(".{taken}{after}")) {
                    wrong.push(format!("{rel}: .{taken}{after}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "take locks with runbook_core::util::lock/read/write:\n{}",
        wrong.join("\n")
    );
}
