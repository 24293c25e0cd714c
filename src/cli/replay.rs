//! `runbook replay`: what a policy change would have done. A scenario
//! (one `runbook capture` wrote, or any) runs under its own policies (or
//! `--against`) and under the new ones, on the same simulated clock, and
//! the difference of what the operator did is printed object by object.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};

use runbook_simulator as scenario;

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The scenario: a file, or a directory holding `scenario.yaml` (as
    /// `runbook capture` writes it).
    pub path: PathBuf,
    /// The new policies: a directory (repeat for several bundles).
    #[arg(
        long,
        env = "RUNBOOK_REPLAY_POLICIES",
        value_delimiter = ',',
        required = true
    )]
    pub policies: Vec<PathBuf>,
    /// The old policies (default: the scenario's own).
    #[arg(long, env = "RUNBOOK_REPLAY_AGAINST", value_delimiter = ',')]
    pub against: Vec<PathBuf>,
    /// How long to run each version, from the scenario's start.
    #[arg(long = "for", env = "RUNBOOK_REPLAY_FOR", default_value = "24h")]
    pub for_: String,
    /// A scenario whose `rules` and `timeline` say what the world does
    /// meanwhile (Jobs that finish, with what score), added to the
    /// scenario's own.
    #[arg(long, env = "RUNBOOK_REPLAY_WORLD")]
    pub world: Option<PathBuf>,
    /// text or json.
    #[arg(
        long,
        short = 'o',
        env = "RUNBOOK_REPLAY_OUTPUT",
        default_value = "text"
    )]
    pub output: String,
    /// Exit 1 when the versions act differently (for CI).
    #[arg(long, env = "RUNBOOK_REPLAY_EXPECT_SAME")]
    pub expect_same: bool,
    /// How much wall-clock time each version's run may take before it
    /// fails (a day over thousands of targets takes minutes).
    #[arg(long, env = "RUNBOOK_REPLAY_TIMEOUT", default_value = "30m")]
    pub timeout: String,
    /// Also write an HTML page of both runs, side by side.
    #[arg(long, env = "RUNBOOK_REPLAY_HTML")]
    pub html: Option<PathBuf>,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let file = if args.path.is_dir() {
        args.path.join("scenario.yaml")
    } else {
        args.path.clone()
    };
    let loaded = |path: &PathBuf| {
        scenario::load(path).map_err(|errors| {
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            anyhow::anyhow!("{}", text.join("\n"))
        })
    };
    let s = loaded(&file)?;
    let world = args.world.as_ref().map(loaded).transpose()?;
    let for_ms = runbook_core::util::time::parse_duration_ms(&args.for_)
        .map_err(|e| anyhow::anyhow!("--for: {e}"))?;
    if for_ms <= 0 {
        bail!("--for: give a positive duration, such as 24h");
    }
    for dir in args.policies.iter().chain(&args.against) {
        if !dir.is_dir() {
            bail!("{}: not a directory of policies", dir.display());
        }
    }
    let limit = runbook_core::util::time::parse_duration_ms(&args.timeout)
        .ok()
        .filter(|ms| *ms > 0)
        .ok_or_else(|| anyhow::anyhow!("--timeout: give a positive duration, such as 30m"))?;
    let mut old = args.against.clone();
    if old.is_empty() {
        old.push(s.policies.clone());
        old.extend(s.more_policies.iter().cloned());
    }
    let replay = scenario::replay::Replay {
        scenario: s,
        old,
        new: args.policies.clone(),
        for_ms,
        world,
        limit: std::time::Duration::from_millis(limit as u64),
    };
    let started = std::time::Instant::now();
    let done = scenario::replay::replay(&replay);
    for (which, r) in [("old", &done.old), ("new", &done.new)] {
        if let Some(e) = r.load_errors.first() {
            bail!("the {which} version does not run: {e}");
        }
    }
    match args.output.as_str() {
        "json" => println!(
            "{}",
            serde_json::to_string_pretty(&done.to_json()).context("writing JSON")?
        ),
        "text" => print!("{}", done.text()),
        other => bail!("-o {other}: give text or json"),
    }
    if let Some(path) = &args.html {
        let mut old = done.old.clone();
        let mut new = done.new.clone();
        old.name = format!("old: {}", old.name);
        new.name = format!("new: {}", new.name);
        let page = scenario::html::render_side_by_side(&old, &new)
            .map_err(|e| anyhow::anyhow!("drawing the HTML report: {e}"))?;
        std::fs::write(path, &page).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {} ({} bytes)", path.display(), page.len());
    }
    eprintln!(
        "replayed {} of {} under both versions in {:.1}s",
        args.for_,
        file.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(if args.expect_same && !done.same() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
