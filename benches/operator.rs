//! `cargo bench --bench operator`: 10,000 targets reconciled by Runbook and
//! by a hand-written controller, no-op writes, and the operator's memory.
//!
//! The memory figure comes from fresh processes: the API server in one,
//! the operator in another, so neither the sandbox's storage nor what the
//! speed run left in the allocator is counted.

use std::io::BufRead;
use std::process::{Command, Stdio};

use runbook::bench::operator::{child_sandbox, memory, run, spawn_child};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn main() {
    if let Ok(n) = std::env::var("RUNBOOK_BENCH_SANDBOX_CHILD") {
        runtime().block_on(child_sandbox(n.parse().expect("a count")));
        return;
    }
    let n: usize = std::env::var("RUNBOOK_BENCH_TARGETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    if let Ok(kubeconfig) = std::env::var("RUNBOOK_BENCH_MEMORY_CHILD") {
        let rss = runtime().block_on(async move {
            tokio::spawn(async move { memory(std::path::Path::new(&kubeconfig), n).await })
                .await
                .expect("memory task")
        });
        println!("RSS {rss}");
        return;
    }
    let f = runtime().block_on(async move { tokio::spawn(run(n)).await.expect("benchmark task") });
    println!(
        "operator, {} targets each needing one child and one status write (in-process sandbox, concurrency 16)",
        f.targets
    );
    println!(
        "  hand-written kube-rs controller: {:>8.2} s",
        f.hand.as_secs_f64()
    );
    println!(
        "  Runbook (Rhai policy):           {:>8.2} s",
        f.runbook.as_secs_f64()
    );
    println!("  ratio Runbook / hand-written:    {:>8.2}", f.ratio());
    println!(
        "  API writes of a resync of all {} finished targets: {}",
        f.targets, f.noop_writes
    );
    if std::env::var("RUNBOOK_BENCH_ONLY").is_ok() {
        return;
    }
    let exe = std::env::current_exe().expect("this benchmark's path");
    let (mut server, kubeconfig) = spawn_child(&exe, n);
    let mut op = Command::new(&exe)
        .env("RUNBOOK_BENCH_MEMORY_CHILD", &kubeconfig)
        .env("RUNBOOK_BENCH_TARGETS", n.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the operator process");
    let rss: u64 = std::io::BufReader::new(op.stdout.take().expect("stdout"))
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("RSS ").and_then(|v| v.parse().ok()))
        .expect("the operator process reports its RSS");
    let _ = op.wait();
    let _ = server.kill();
    let _ = server.wait();
    println!(
        "  operator RSS with {n} targets and {n} children cached (API server in another process): {:.1} MB",
        rss as f64 / 1048576.0
    );
}

/// The allocator the `runbook` binary uses.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
