//! The command line: parsing and dispatch. Errors at this edge are `anyhow`;
//! everything below is typed.

mod alerts;
mod bench;
mod capture;
mod check;
mod explain;
mod rbac;
mod replay;
mod run;
mod sandbox;
mod scenario;
mod schema;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Runbook: a Kubernetes operator whose reconcile behaviour is data.
#[derive(Parser, Debug)]
#[command(name = "runbook", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the operator.
    Run(Box<run::RunArgs>),
    /// Print the decision record of an object (KIND/NAME).
    Explain(explain::ExplainArgs),
    /// Load and compile every policy and script below the paths.
    Check(check::CheckArgs),
    /// Print the CustomResourceDefinitions Runbook ships, as YAML.
    Crds(CrdsArgs),
    /// Serve an in-memory Kubernetes API on 127.0.0.1 (for kubectl and tests).
    Sandbox(sandbox::SandboxArgs),
    /// Alert routing: `alerts route` shows where an alert would go.
    Alerts(alerts::AlertsArgs),
    /// Run scenarios and print the timeline of what the operator did.
    Simulate(scenario::SimulateArgs),
    /// Write a live cluster's policies and the objects they concern as a
    /// scenario directory.
    Capture(capture::CaptureArgs),
    /// Run a scenario under two versions of its policies and print what
    /// the operator would do differently.
    Replay(replay::ReplayArgs),
    /// Run every scenario found; one line each, a diff per failed expectation.
    Test(scenario::TestArgs),
    /// Print the RBAC (roles and bindings) exactly the given policies need.
    Rbac(rbac::RbacArgs),
    /// Run the performance suite and print its table (build with --release).
    Bench(bench::BenchArgs),
    /// Print the JSON Schema of a document kind (for editors), or the
    /// field reference.
    Schema(schema::SchemaArgs),
}

#[derive(clap::Args, Debug)]
pub struct CrdsArgs {
    /// Write one file per CRD into this directory instead of printing, and
    /// the field-selectors overlay (Kubernetes v1.31+) under it.
    #[arg(long, env = "RUNBOOK_CRDS_OUT_DIR")]
    pub out_dir: Option<std::path::PathBuf>,
}

fn crds(args: CrdsArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let Some(dir) = args.out_dir else {
        print!("{}", runbook_core::crd::all_yaml());
        return Ok(ExitCode::SUCCESS);
    };
    let selecting = dir.join(runbook_core::crd::FIELD_SELECTORS_DIR);
    for (dir, crds, field_selectors) in [
        (&dir, runbook_core::crd::all(), false),
        (
            &selecting,
            runbook_core::crd::all_with_field_selectors(),
            true,
        ),
    ] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut files = vec![(
            dir.join("kustomization.yaml"),
            runbook_core::crd::kustomization(field_selectors),
        )];
        files.extend(crds.iter().map(|crd| {
            (
                dir.join(runbook_core::crd::file_name(crd)),
                runbook_core::crd::to_yaml(crd),
            )
        }));
        for (path, text) in files {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

pub fn main() -> ExitCode {
    runbook_sys::process::prefer_small_pages();
    let cli = Cli::parse();
    // Commands that print and exit stop quietly when their reader does;
    // the servers (and the benchmarks, which run servers and hooks) do not.
    if !matches!(
        cli.command,
        Command::Run(_) | Command::Sandbox(_) | Command::Bench(_)
    ) {
        runbook_sys::process::end_quietly_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Run(args) => runtime().and_then(|rt| rt.block_on(run::run(*args))),
        Command::Check(args) => check::run(args),
        Command::Alerts(args) => alerts::run(args),
        Command::Simulate(args) => scenario::simulate(args),
        Command::Capture(args) => capture::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Test(args) => scenario::test(args),
        Command::Rbac(args) => rbac::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Explain(args) => runtime().and_then(|rt| rt.block_on(explain::run(args))),
        Command::Crds(args) => crds(args),
        Command::Schema(args) => schema::run(args),
        Command::Sandbox(args) => runtime().and_then(|rt| rt.block_on(sandbox::run(args))),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
