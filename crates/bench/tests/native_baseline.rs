//! The native Rust rule used as the benchmark baseline makes the same
//! decision as the shipped Rhai policy, so the speed comparison is fair.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use runbook_bench::decision::Setup;
use runbook_core::script::Action;

fn scripted_actions(s: &Setup) -> Vec<String> {
    let d = s.scripted();
    let mut out: Vec<String> = d
        .actions
        .iter()
        .filter(|p| match &p.action {
            // The schedule bookkeeping is the executor's, not the rule's.
            Action::Status { fields } => !fields.contains_key("nextRunTime"),
            _ => true,
        })
        .map(|p| format!("{:?}", p.action))
        .collect();
    out.sort();
    out
}

fn native_actions(s: &Setup) -> Vec<String> {
    let mut out: Vec<String> = s.native().iter().map(|a| format!("{a:?}")).collect();
    out.sort();
    out
}

#[test]
fn both_roll_back_on_a_low_score_with_the_same_actions() {
    let s = Setup::new(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies"),
        0.72,
    );
    let native = native_actions(&s);
    assert!(
        native.iter().any(|a| a.starts_with("Rollback")),
        "{native:?}"
    );
    assert_eq!(scripted_actions(&s), native);
}

#[test]
fn both_pass_a_high_score_with_the_same_actions() {
    let s = Setup::new(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies"),
        0.93,
    );
    let native = native_actions(&s);
    assert!(
        native.iter().any(|a| a.contains("ScoreAboveThreshold")),
        "{native:?}"
    );
    assert_eq!(scripted_actions(&s), native);
}
