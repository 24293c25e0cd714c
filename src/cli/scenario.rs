//! `runbook simulate` and `runbook test`: run scenarios offline.

use std::path::PathBuf;
use std::process::ExitCode;

use runbook_simulator as scenario;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// A scenario file, or a directory holding scenarios.
    pub path: PathBuf,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Text, env = "RUNBOOK_OUTPUT")]
    pub output: Output,
    /// Every line of the timeline: no repeated cycles folded into one.
    #[arg(long)]
    pub full: bool,
    /// Also write the run as one self-contained HTML page: per target, its
    /// status fields over time with phases, rollbacks and alerts marked,
    /// and every action on a lane (one scenario only).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct TestArgs {
    /// Scenario files, or directories searched for them.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// text, or json (one document on stdout, for CI).
    #[arg(long, short = 'o', default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

/// Logs only when RUNBOOK_LOG asks for them: the timeline is the output.
pub(super) fn init_logging() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RUNBOOK_LOG") {
        use std::io::IsTerminal;
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .try_init();
    }
}

fn scenarios(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if !p.exists() {
            anyhow::bail!("{}: no such file or directory", p.display());
        }
        out.extend(scenario::find(p)?);
    }
    Ok(out)
}

pub fn simulate(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let files = scenarios(std::slice::from_ref(&args.path))?;
    if files.is_empty() {
        anyhow::bail!("{}: no scenario found", args.path.display());
    }
    let mut code = ExitCode::SUCCESS;
    let mut json = Vec::new();
    let mut reports = Vec::new();
    for f in files {
        let r = scenario::run_file(&f);
        // An expectation that failed fails the command, as `runbook test`.
        if !r.load_errors.is_empty() || !r.passed() {
            code = ExitCode::FAILURE;
        }
        match args.output {
            Output::Json => json.push(r.to_json()),
            Output::Text => {
                if args.full {
                    print!("{}", r.timeline());
                } else {
                    print!("{}", scenario::fold::folded_timeline(&r));
                }
                print!("{}", scenario::fold::closing_summary(&r));
                if !r.passed() {
                    println!("{}", r.summary());
                    print!("{}", r.diffs());
                }
            }
        }
        if args.html.is_some() {
            reports.push(r);
        }
    }
    if let Some(path) = &args.html {
        let page = scenario::html::render(&reports)
            .map_err(|e| anyhow::anyhow!("drawing the HTML report: {e}"))?;
        std::fs::write(path, &page)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        eprintln!("wrote {} ({} bytes)", path.display(), page.len());
    }
    if args.output == Output::Json {
        let v = if json.len() == 1 {
            json.remove(0)
        } else {
            serde_json::Value::Array(json)
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(code)
}

/// One scenario's result as JSON: its verdict, each failed expectation at
/// its place, and the text `runbook test` prints for it.
fn report_json(r: &scenario::Report) -> serde_json::Value {
    serde_json::json!({
        "name": r.name,
        "file": r.file,
        "passed": r.passed(),
        "expectations": r.checked,
        "actions": r.entries.len(),
        "failures": r.failures.iter().map(|f| serde_json::json!({
            "file": r.file,
            "line": f.pos.map(|p| p.line),
            "column": f.pos.map(|p| p.col),
            "message": f.message,
            "detail": f.detail,
        })).collect::<Vec<_>>(),
        "errors": r.load_errors.iter().map(|e| super::check::error_json(&e.file, e.pos, &e.message, e.to_string())).collect::<Vec<_>>(),
        "text": format!("{}\n{}", r.summary(), r.diffs()),
    })
}

pub fn test(args: TestArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let files = scenarios(&args.paths)?;
    if files.is_empty() {
        anyhow::bail!("no scenario found under the given paths");
    }
    let mut failed = 0;
    let json = args.output == "json";
    let mut results = Vec::new();
    for f in &files {
        let r = scenario::run_file(f);
        if !r.passed() {
            failed += 1;
        }
        if json {
            results.push(report_json(&r));
            continue;
        }
        println!("{}", r.summary());
        if !r.passed() {
            print!("{}", r.diffs());
        }
    }
    if json {
        let doc = serde_json::json!({
            "passed": files.len() - failed,
            "failed": failed,
            "scenarios": results,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "{} scenarios: {} passed, {failed} failed",
            files.len(),
            files.len() - failed
        );
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
