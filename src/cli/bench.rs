//! `runbook bench`: the performance suite (see `runbook_bench::suite`).

use std::path::PathBuf;
use std::process::ExitCode;

use runbook_bench::suite::{self, Options};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Fewer samples and 2,000 targets instead of 10,000 (a minute or two).
    #[arg(long, env = "RUNBOOK_BENCH_QUICK")]
    pub quick: bool,
    /// Only these sections: decision, lookup, writes, operator, reload,
    /// admission, memory, scale, containment, fairness, scale-out, peers.
    #[arg(long, value_delimiter = ',', env = "RUNBOOK_BENCH_ONLY_SECTIONS")]
    pub only: Vec<String>,
    /// The shipped policies (the decision benchmark uses evaluator-drift).
    #[arg(long, default_value = "policies", env = "RUNBOOK_BENCH_POLICIES")]
    pub policies: PathBuf,
    /// The table as text (Markdown rows), or every figure as JSON.
    #[arg(long, short, value_enum, default_value_t = Output::Text, env = "RUNBOOK_BENCH_OUTPUT")]
    pub output: Output,
    /// Run the admission and scale-out sections through this cluster's
    /// API server instead of a sandbox (admission: it must reach
    /// `runbook` on 127.0.0.1; scale-out: it makes and deletes the
    /// namespaces scale-one, scale-shards, scale-empty, scale-one-new and
    /// scale-shards-new, and the MutatingWebhookConfigurations
    /// runbook-bench-<namespace>, its replicas' webhooks served on
    /// 127.0.0.1); the other sections ignore it.
    #[arg(long, env = "RUNBOOK_BENCH_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Targets of the scale-out section (default: 2,000 with --quick,
    /// else 10,000).
    #[arg(long, env = "RUNBOOK_BENCH_SCALE_OUT_TARGETS")]
    pub scale_out_targets: Option<usize>,
    /// The Python that runs Kopf in the peers section (default: python3).
    /// Without Kopf and the Kubernetes client the section is skipped,
    /// saying how to install them.
    #[arg(long, env = "RUNBOOK_BENCH_KOPF_PYTHON")]
    pub kopf_python: Option<PathBuf>,
    /// Internal: run as a child process of the memory benchmark.
    #[arg(long, hide = true, num_args = 1..)]
    pub child: Vec<String>,
}

/// Run as one of the benchmarks' child processes (`--child ROLE N ...`).
fn child(rt: &tokio::runtime::Runtime, child: &[String]) -> anyhow::Result<()> {
    let n: usize = child.get(1).and_then(|v| v.parse().ok()).unwrap_or(10_000);
    match child[0].as_str() {
        "sandbox" => rt.block_on(runbook_bench::memory::sandbox_child(n)),
        "operator" => {
            let kc = PathBuf::from(child.get(2).cloned().unwrap_or_default());
            rt.block_on(async move {
                tokio::spawn(async move { runbook_bench::memory::operator_child(&kc, n).await })
                    .await
            })?;
        }
        "scaleout-sandbox" => rt.block_on(runbook_bench::scaleout::sandbox_child(n)),
        "replica" => {
            // A replica's own logs, on stderr, where RUNBOOK_LOG asks.
            super::scenario::init_logging();
            let rest = child[1..].to_vec();
            rt.block_on(async move {
                tokio::spawn(async move { runbook_bench::scaleout::replica_child(&rest).await })
                    .await
            })?;
        }
        other => anyhow::bail!("unknown child role {other}"),
    }
    Ok(())
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if matches!(
        args.child.first().map(String::as_str),
        Some("operator" | "replica")
    ) {
        runbook_sys::alloc::enable();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if !args.child.is_empty() {
        child(&rt, &args.child)?;
        return Ok(ExitCode::SUCCESS);
    }
    for s in &args.only {
        anyhow::ensure!(
            suite::SECTIONS.contains(&s.as_str()),
            "--only {s}: want one of {}",
            suite::SECTIONS.join(", ")
        );
    }
    anyhow::ensure!(
        args.policies.is_dir(),
        "--policies {}: not a directory (run from the repository, or point it at policies/)",
        args.policies.display()
    );
    if let Some(path) = &args.kubeconfig {
        kube::config::Kubeconfig::read_from(path)
            .map_err(|e| anyhow::anyhow!("--kubeconfig {}: {e}", path.display()))?;
    }
    if cfg!(debug_assertions) {
        eprintln!(
            "note: a debug build; run `cargo run --release -- bench` for figures worth recording"
        );
    }
    let opts = Options {
        quick: args.quick,
        sections: args.only,
        policies: args.policies,
        exe: std::env::current_exe()?,
        child_args: vec!["bench".into(), "--child".into()],
        cluster: args.kubeconfig,
        scale_out_targets: args.scale_out_targets,
        kopf_python: args.kopf_python.clone(),
    };
    let rows = rt.block_on(suite::run(&opts));
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "machine": suite::machine(), "quick": opts.quick, "figures": suite::to_json(&rows)
            }))?
        ),
        Output::Text => {
            println!(
                "machine: {}{}",
                suite::machine(),
                if opts.quick { " (quick run)" } else { "" }
            );
            print!("{}", suite::table(&rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}
