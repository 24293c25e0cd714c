//! `cargo bench --bench decision`: one evaluator decision, scripted vs native.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

fn main() {
    let policies = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let iters = std::env::var("RUNBOOK_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let f = runbook_bench::decision::run(&policies, iters);
    println!(
        "evaluator decision on a {}-byte Evaluator, {} samples each",
        f.target_bytes, f.scripted.samples
    );
    println!(
        "  rollback decision, scripted (Rhai policy): median {:>8.2} us   p99 {:>8.2} us",
        runbook_bench::us(f.scripted.median),
        runbook_bench::us(f.scripted.p99)
    );
    println!(
        "  rollback decision, native (Rust rule):     median {:>8.2} us   p99 {:>8.2} us",
        runbook_bench::us(f.native.median),
        runbook_bench::us(f.native.p99)
    );
    println!("  ratio scripted/native: {:.1}x", f.ratio());
    println!(
        "  steady state (scripted, nothing due): median {:>8.2} us",
        runbook_bench::us(f.scripted_idle.median)
    );
}

/// The allocator the `runbook` binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
