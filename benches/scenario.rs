//! `cargo bench --bench scenario`: a simulated week of hourly evaluations
//! (examples/evaluator-drift/week.yaml) from start to finish.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use runbook_bench::scenario::run;

fn main() {
    let iters: usize = std::env::var("RUNBOOK_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/evaluator-drift/week.yaml");
    let f = match run(&path, iters) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("the scenario failed:\n{e}");
            std::process::exit(1);
        }
    };
    println!("scenario: {} ({})", f.name, path.display());
    println!(
        "  {} h simulated, {} benchmark Jobs, {} actions: wall median {:.3} s, max {:.3} s over {} runs",
        f.simulated.as_secs() / 3600,
        f.jobs,
        f.actions,
        f.wall.median.as_secs_f64(),
        f.wall.p99.as_secs_f64(),
        f.wall.samples
    );
}

/// The allocator the `runbook` binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
