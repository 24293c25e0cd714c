//! `cargo bench --bench operator`: 10,000 targets reconciled by Runbook and
//! by a hand-written controller, no-op writes, and the operator's memory.

use std::time::Duration;

use runbook::bench::operator::{child_sandbox, memory, run, spawn_child};

fn main() {
    if std::env::var("RUNBOOK_LOG").is_ok() {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_env("RUNBOOK_LOG")).try_init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    if let Ok(n) = std::env::var("RUNBOOK_BENCH_SANDBOX_CHILD") {
        rt.block_on(child_sandbox(n.parse().expect("a count")));
        return;
    }
    let n: usize = std::env::var("RUNBOOK_BENCH_TARGETS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let f = rt.block_on(async move { tokio::spawn(run(n)).await.expect("benchmark task") });
    println!("operator, {} targets each needing one child and one status write (in-process sandbox, concurrency 16)", f.targets);
    println!("  hand-written kube-rs controller: {:>8.2} s", f.hand.as_secs_f64());
    println!("  Runbook (Rhai policy):           {:>8.2} s", f.runbook.as_secs_f64());
    println!("  ratio Runbook / hand-written:    {:>8.2}", f.ratio());
    println!("  API writes of a resync of all {} finished targets: {}", f.targets, f.noop_writes);
    drop(rt);
    let exe = std::env::current_exe().expect("this benchmark's path");
    let (mut child, kubeconfig) = spawn_child(&exe, n);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let rss = rt.block_on(async move { tokio::spawn(async move { memory(&kubeconfig, n).await }).await.expect("memory task") });
    let _ = child.kill();
    let _ = child.wait();
    rt.shutdown_timeout(Duration::from_secs(1));
    println!(
        "  operator RSS with {n} targets and {n} children cached (API server in another process): {:.1} MB",
        rss as f64 / 1048576.0
    );
}
