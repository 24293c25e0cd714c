//! `cargo bench --bench operator`: 10,000 targets reconciled by Runbook and
//! by a hand-written controller, no-op writes, and the operator's memory.
//!
//! The memory figures come from fresh processes (this program again, in
//! the `sandbox` and `operator` child roles): the API server in one, the
//! operator in the other, so neither the sandbox's storage nor what the
//! speed run left in the allocator is counted.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use runbook_bench::memory::{measure, operator_child, sandbox_child};
use runbook_bench::operator::run;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let count = |i: usize| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(10_000);
    match args.first().map(String::as_str) {
        Some("sandbox") => return runtime().block_on(sandbox_child(count(1))),
        Some("operator") => {
            runbook_sys::alloc::enable();
            let (n, kc) = (
                count(1),
                std::path::PathBuf::from(args.get(2).cloned().unwrap_or_default()),
            );
            runtime()
                .block_on(
                    async move { tokio::spawn(async move { operator_child(&kc, n).await }).await },
                )
                .expect("operator child");
            return;
        }
        _ => {}
    }
    let n: usize = std::env::var("RUNBOOK_BENCH_TARGETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let f =
        runtime().block_on(async move { tokio::spawn(run(n, 5)).await.expect("benchmark task") });
    println!(
        "operator, {} targets each needing one child and one status write (in-process sandbox, concurrency 16)",
        f.targets
    );
    println!(
        "  hand-written kube-rs controller: {:>8.2} s (median of 5; owning its ConfigMaps, as Runbook does)",
        f.median_hand()
    );
    println!(
        "  the same without a child watch:  {:>8.2} s (median of 5; ratio {:.2})",
        f.median_hand_unwatched(),
        f.ratio_unwatched()
    );
    println!(
        "  Runbook (Rhai policy):           {:>8.2} s (median of 5)",
        f.median_runbook()
    );
    let (low, high) = f.spread();
    println!(
        "  ratio Runbook / hand-written:    {:>8.2} (rounds {low:.2} to {high:.2})",
        f.ratio()
    );
    println!(
        "  API writes of a resync of all {} finished targets: {}",
        f.targets, f.noop_writes
    );
    if std::env::var("RUNBOOK_BENCH_ONLY").is_ok() {
        return;
    }
    let exe = std::env::current_exe().expect("this benchmark's path");
    let m = measure(&exe, &[], n);
    println!(
        "  operator RSS with {n} targets and {n} children cached (API server in another process): {:.1} MB",
        m.rss as f64 / 1048576.0
    );
    println!(
        "  peak RSS while every watch relists ({} lists): {:.1} MB ({:.2}x)",
        m.relists,
        m.peak_rss as f64 / 1048576.0,
        m.peak_rss as f64 / m.rss.max(1) as f64
    );
}

/// The allocator the `runbook` binary uses.
#[global_allocator]
static ALLOC: runbook_sys::alloc::Counting<mimalloc::MiMalloc> =
    runbook_sys::alloc::Counting(mimalloc::MiMalloc);
