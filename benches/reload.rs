//! `cargo bench --bench reload`: policy ConfigMap edit to the first reconcile
//! on the new version, and the time to move 10,000 targets to it.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use runbook_bench::reload::run;
use runbook_bench::us;

fn main() {
    let edits: usize = std::env::var("RUNBOOK_BENCH_EDITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let targets: usize = std::env::var("RUNBOOK_BENCH_TARGETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let f = rt.block_on(async move {
        tokio::spawn(run(edits, targets))
            .await
            .expect("benchmark task")
    });
    println!("hot reload through a policy ConfigMap (in-process sandbox)");
    println!(
        "  edit -> first reconcile on the new version, {} edits: p50 {:.2} ms, p99 {:.2} ms",
        f.edits,
        us(f.latency.median) / 1000.0,
        us(f.latency.p99) / 1000.0
    );
    println!(
        "  edit -> all {} targets reconciled on the new version: {:.2} s",
        f.targets,
        f.requeue_all.as_secs_f64()
    );
}

/// The allocator the `runbook` binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
