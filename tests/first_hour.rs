//! What a newcomer types in their first hour, as they type it: the
//! command-line's flags and outputs (issue: "the first hour, again").

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn runbook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("runbook runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A kubeconfig whose server never answers (nothing listens on the port).
fn unreachable_kubeconfig(name: &str) -> PathBuf {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let path =
        std::env::temp_dir().join(format!("runbook-{name}-{}.kubeconfig", std::process::id()));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\nusers: [{{name: u, user: {{token: t}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}

/// `runbook run` for `secs` seconds against a server that never answers:
/// what it printed.
fn run_for(secs: u64, extra: &[&str]) -> String {
    let kubeconfig = unreachable_kubeconfig("first-hour");
    let mut child = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(["run", "--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--metrics-addr", "127.0.0.1:0", "--webhook=false"])
        .args(["--policy-configmaps=false", "--skip-access-check"])
        .args(extra)
        .env("RUNBOOK_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runbook run");
    std::thread::sleep(Duration::from_secs(secs));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&kubeconfig);
    text(&out)
}

#[test]
fn durations_take_units_as_kubernetes_tools_do() {
    // Accepted: it runs (and waits for the API server) rather than
    // stopping at the flag.
    for d in ["15s", "1m", "15"] {
        let out = run_for(1, &["--lease-duration", d, "--shutdown-grace", "5s"]);
        assert!(
            !out.contains("invalid value"),
            "--lease-duration {d}: {out}"
        );
    }
    let out = runbook(&["run", "--lease-duration", "15x"]);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("invalid value '15x' for '--lease-duration") && t.contains("unknown unit 'x'"),
        "{t}"
    );
    let out = runbook(&["run", "--shutdown-grace", "1500ms"]);
    assert!(text(&out).contains("give whole seconds"), "{}", text(&out));
}

#[test]
fn text_logs_have_no_colours_off_a_terminal() {
    let out = run_for(2, &[]);
    assert!(
        out.contains("INFO") || out.contains("WARN"),
        "it logged: {out}"
    );
    assert!(!out.contains('\u{1b}'), "escape codes in: {out:?}");
}

#[test]
fn every_flag_of_run_says_what_it_is() {
    for (command, flags) in [
        (
            &["run", "--help"][..],
            &[
                "--log-format",
                "--lease-name",
                "--lease-duration",
                "--shutdown-grace",
            ][..],
        ),
        (
            &["explain", "--help"][..],
            &["--namespace", "--kubeconfig"][..],
        ),
        (&["bench", "--help"][..], &["--output"][..]),
    ] {
        said_for(command, flags);
    }
    let rbac = text(&runbook(&["rbac", "--help"]));
    assert!(
        !rbac.contains("Serve the authorship webhook"),
        "rbac's --webhook speaks of what run does: {rbac}"
    );
}

/// Each of `flags` in `command`'s help has a line of its own saying what it is.
fn said_for(command: &[&str], flags: &[&str]) {
    let out = runbook(command);
    let help = text(&out);
    for flag in flags {
        let at = help
            .find(&format!("{flag} <"))
            .unwrap_or_else(|| panic!("{flag} in {help}"));
        let line_end = help[at..].find('\n').map_or(help.len(), |e| at + e);
        let next = &help[line_end..];
        // The line after the flag's is its help text, not the next flag.
        let said = next.trim_start_matches('\n').trim_start();
        assert!(
            !said.starts_with('-') && !said.starts_with('['),
            "{flag} has no help: {}",
            &help[at..line_end]
        );
    }
}

#[test]
fn an_alert_with_no_labels_goes_where_the_root_route_sends_it() {
    let out = runbook(&["alerts", "route", "--routes", "policies/alert-routes.yaml"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "log");
}
