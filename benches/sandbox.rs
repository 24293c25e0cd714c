//! `cargo bench --bench sandbox`: the in-process API server's speed and memory.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use runbook_bench::sandbox::{ms, run};
use runbook_bench::us;

fn main() {
    let scale = std::env::var("RUNBOOK_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Run on a worker thread, where a controller's requests run, not on the
    // thread that blocks on the runtime.
    let f = rt.block_on(async move { tokio::spawn(run(scale)).await.expect("benchmark task") });
    println!("sandbox, in-process through kube::Client");
    println!(
        "  get round trip:            median {:>9.2} us   p99 {:>9.2} us",
        us(f.get.median),
        us(f.get.p99)
    );
    println!(
        "  patch round trip:          median {:>9.2} us   p99 {:>9.2} us",
        us(f.patch.median),
        us(f.patch.p99)
    );
    println!(
        "  list of 10,000 objects:    median {:>9.2} ms   p99 {:>9.2} ms",
        ms(f.list_10k.median),
        ms(f.list_10k.p99)
    );
    println!(
        "  one write to 100 watches:  median {:>9.2} ms   p99 {:>9.2} ms",
        ms(f.fanout_100.median),
        ms(f.fanout_100.p99)
    );
    println!(
        "  {} stored 1 KB objects:  process RSS {:.1} MB (grew {:.1} MB while storing them)",
        f.objects,
        f.rss_bytes as f64 / 1048576.0,
        f.rss_delta_bytes as f64 / 1048576.0
    );
}

/// The allocator the `runbook` binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
