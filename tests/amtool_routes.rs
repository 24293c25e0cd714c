//! `runbook alerts route` held to Alertmanager's own routing: random route
//! trees (matchers `=`, `!=`, `=~`, `!~`, `continue`, receivers inherited,
//! nesting to depth 3) and random label sets, each asked of the real
//! `amtool config routes test` and of `runbook alerts route`; the receivers
//! must be the same, in the same order. A receiver two matching routes name
//! is listed (and notified) once per route, as Alertmanager does.
//!
//! A fixed seed and a bounded number of cases; skipped, saying so, where
//! amtool cannot be had.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/alertmanager.rs"]
mod alertmanager;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

const LABELS: &[&str] = &["severity", "team", "env"];
const VALUES: &[&str] = &["critical", "warning", "ml", "data", "prod", "dev"];
const PATTERNS: &[&str] = &["crit.*", "ml|data", "pro.", "w.*g", ".*"];
const RECEIVERS: &[&str] = &["r0", "r1", "r2", "r3", "r4"];

struct Route {
    receiver: Option<String>,
    matchers: Vec<String>,
    continue_: bool,
    routes: Vec<Route>,
}

fn matcher(rng: &mut Rng) -> String {
    let label = rng.pick(LABELS);
    match rng.below(4) {
        0 => format!("{label}=\"{}\"", rng.pick(VALUES)),
        1 => format!("{label}!=\"{}\"", rng.pick(VALUES)),
        2 => format!("{label}=~\"{}\"", rng.pick(PATTERNS)),
        _ => format!("{label}!~\"{}\"", rng.pick(PATTERNS)),
    }
}

fn route(rng: &mut Rng, depth: usize) -> Route {
    let children = if depth < 3 { rng.below(4) } else { 0 };
    Route {
        receiver: (rng.below(4) != 0).then(|| rng.pick(RECEIVERS).to_string()),
        matchers: (0..1 + rng.below(2)).map(|_| matcher(rng)).collect(),
        continue_: rng.below(2) == 0,
        routes: (0..children).map(|_| route(rng, depth + 1)).collect(),
    }
}

fn tree(rng: &mut Rng) -> Route {
    Route {
        receiver: Some("r0".into()),
        matchers: Vec::new(),
        continue_: false,
        routes: (0..1 + rng.below(4)).map(|_| route(rng, 1)).collect(),
    }
}

/// The routes as YAML at `indent` (both documents spell a route the same way).
fn write_routes(out: &mut String, routes: &[Route], indent: usize) {
    let pad = " ".repeat(indent);
    for r in routes {
        let _ = writeln!(out, "{pad}- matchers: [{}]", quoted(&r.matchers));
        if let Some(rcv) = &r.receiver {
            let _ = writeln!(out, "{pad}  receiver: {rcv}");
        }
        if r.continue_ {
            let _ = writeln!(out, "{pad}  continue: true");
        }
        if !r.routes.is_empty() {
            let _ = writeln!(out, "{pad}  routes:");
            write_routes(out, &r.routes, indent + 4);
        }
    }
}

fn quoted(matchers: &[String]) -> String {
    matchers
        .iter()
        .map(|m| format!("'{m}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn alertmanager_config(root: &Route) -> String {
    let mut out = String::from("route:\n  receiver: r0\n  routes:\n");
    write_routes(&mut out, &root.routes, 4);
    out.push_str("receivers:\n");
    for r in RECEIVERS {
        let _ = writeln!(out, "  - name: {r}");
    }
    out
}

fn runbook_routes(root: &Route) -> String {
    let mut out = String::from(
        "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: random}\nspec:\n  route:\n    receiver: r0\n    routes:\n",
    );
    write_routes(&mut out, &root.routes, 6);
    out.push_str("  receivers:\n");
    for r in RECEIVERS {
        let _ = writeln!(out, "    - {{name: {r}, log: {{}}}}");
    }
    out
}

/// A random label set (never empty: both tools want one label at least).
fn labels(rng: &mut Rng) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in LABELS {
        if rng.below(3) != 0 {
            out.push(format!("{l}={}", rng.pick(VALUES)));
        }
    }
    if out.is_empty() {
        out.push("alertname=Other".into());
    }
    out
}

/// The receivers one tool prints for an alert (its first line).
fn receivers(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the tool runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

#[test]
fn runbook_routes_alerts_as_amtool_does() {
    let amtool = match alertmanager::amtool() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("skipped: no amtool to compare with: {e}");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("runbook-amtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng(0x5eed_cafe_f00d_0001);
    let (trees, per_tree) = (40, 8);
    let mut compared = 0;
    let mut differ = Vec::new();
    for t in 0..trees {
        let root = tree(&mut rng);
        let am = dir.join(format!("am-{t}.yml"));
        let rb = dir.join(format!("routes-{t}.yaml"));
        std::fs::write(&am, alertmanager_config(&root)).unwrap();
        std::fs::write(&rb, runbook_routes(&root)).unwrap();
        for _ in 0..per_tree {
            let alert = labels(&mut rng);
            let theirs = receivers(
                Command::new(&amtool)
                    .args(["config", "routes", "test"])
                    .arg(format!("--config.file={}", am.display()))
                    .args(&alert),
            );
            let ours = receivers(
                Command::new(env!("CARGO_BIN_EXE_runbook"))
                    .args(["alerts", "route", "--routes"])
                    .arg(&rb)
                    .args(&alert),
            );
            compared += 1;
            if theirs != ours {
                differ.push(format!(
                    "{}: {alert:?}: amtool {theirs}, runbook {ours}",
                    Path::new(&rb).display()
                ));
            }
        }
    }
    eprintln!("compared {compared} alerts over {trees} route trees");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
