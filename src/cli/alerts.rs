//! `runbook alerts route`: which receivers an alert with given labels
//! reaches under an AlertRoutes document, like `amtool config routes test`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use runbook_core::alert::CompiledRoutes;
use runbook_core::policy;
use runbook_core::script::ScriptEngine;
use runbook_core::util::time::render_duration_ms;

#[derive(clap::Args, Debug)]
pub struct AlertsArgs {
    #[command(subcommand)]
    pub command: AlertsCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum AlertsCommand {
    /// Print the receivers an alert with these labels reaches.
    Route(RouteArgs),
}

#[derive(clap::Args, Debug)]
pub struct RouteArgs {
    /// The file holding the AlertRoutes document.
    #[arg(long, env = "RUNBOOK_ROUTES")]
    pub routes: PathBuf,
    /// Which AlertRoutes document of the file (default: the only one).
    #[arg(long)]
    pub name: Option<String>,
    /// Also print each matching route: its path, grouping and timers.
    #[arg(long, short)]
    pub verbose: bool,
    /// Exit 1 unless the receivers are exactly these (comma-separated, in order).
    #[arg(long, value_delimiter = ',')]
    pub verify_receivers: Option<Vec<String>>,
    /// Alert labels as name=value (none: the empty label set, which goes
    /// where the root route sends it, as with amtool).
    pub labels: Vec<String>,
}

pub fn run(args: AlertsArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        AlertsCommand::Route(a) => route(a),
    }
}

fn load(
    path: &std::path::Path,
    name: Option<&str>,
) -> anyhow::Result<Result<CompiledRoutes, Vec<String>>> {
    let (bundle, file) = super::check::bundle_of_file(path, "file")?;
    let loaded = policy::load_bundle(&ScriptEngine::default(), &bundle, Some(&file));
    if !loaded.errors.is_empty() {
        return Ok(Err(loaded.errors.iter().map(|e| e.to_string()).collect()));
    }
    let mut found: Vec<CompiledRoutes> = loaded
        .routes
        .into_iter()
        .filter(|r| name.is_none_or(|n| r.name == n))
        .collect();
    match (found.len(), name) {
        (1, _) => Ok(Ok(found.remove(0))),
        (0, Some(n)) => anyhow::bail!("{}: no AlertRoutes named {n:?}", path.display()),
        (0, None) => anyhow::bail!("{}: no AlertRoutes document", path.display()),
        (_, _) => anyhow::bail!(
            "{}: several AlertRoutes documents; choose one with --name",
            path.display()
        ),
    }
}

fn route(args: RouteArgs) -> anyhow::Result<ExitCode> {
    let mut labels = BTreeMap::new();
    for l in &args.labels {
        let (k, v) = l
            .split_once('=')
            .with_context(|| format!("{l:?}: labels are name=value"))?;
        labels.insert(k.trim().to_string(), v.trim().trim_matches('"').to_string());
    }
    let routes = match load(&args.routes, args.name.as_deref())? {
        Ok(r) => r,
        Err(errors) => {
            for e in errors {
                eprintln!("{e}");
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let receivers = routes.receivers_per_route(&labels);
    println!("{}", receivers.join(","));
    if args.verbose {
        for r in routes.routes_for(&labels) {
            println!(
                "  {}  {}  groupBy [{}]  groupWait {}  groupInterval {}  repeatInterval {}{}",
                r.receiver,
                r.id,
                r.group_by.join(" "),
                render_duration_ms(r.group_wait_ms),
                render_duration_ms(r.group_interval_ms),
                render_duration_ms(r.repeat_interval_ms),
                if r.continue_ { "  continue" } else { "" }
            );
        }
    }
    if let Some(want) = args.verify_receivers
        && want != receivers
    {
        eprintln!(
            "receivers differ: want {}, got {}",
            want.join(","),
            receivers.join(",")
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
