//! The scenario benchmark: a simulated week of hourly evaluations, run
//! end to end (sandbox, operator, executor, paused clock).

use std::path::Path;
use std::time::{Duration, Instant};

use super::Stats;

pub struct ScenarioFigures {
    pub name: String,
    /// Simulated time the scenario covers.
    pub simulated: Duration,
    /// Benchmark Jobs the operator created.
    pub jobs: usize,
    /// Every action in the timeline.
    pub actions: usize,
    pub wall: Stats,
}

/// Run the scenario at `path` `iters` times; every run must pass.
pub fn run(path: &Path, iters: usize) -> Result<ScenarioFigures, String> {
    let mut samples = Vec::with_capacity(iters);
    let mut last = None;
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        let r = runbook_simulator::run_file(path);
        samples.push(t.elapsed());
        if !r.passed() {
            return Err(format!("{}\n{}", r.summary(), r.diffs()));
        }
        last = Some(r);
    }
    let r = last.expect("at least one run");
    let scenario = runbook_simulator::load(path).map_err(|e| format!("{e:?}"))?;
    Ok(ScenarioFigures {
        name: r.name.clone(),
        simulated: Duration::from_millis(scenario.until_ms as u64),
        jobs: r
            .entries
            .iter()
            .filter(|e| e.action == "apply" && e.kind == "Job" && e.result == "ok")
            .count(),
        actions: r
            .entries
            .iter()
            .filter(|e| e.action != "world" && e.action != "notify")
            .count(),
        wall: Stats::from_samples(samples),
    })
}

/// The CPU seconds (user and system, of the whole process) one run of
/// the scenario at `path` takes, median of `runs`; every run must pass.
pub fn cpu(path: &Path, runs: usize) -> Result<f64, String> {
    let now = || {
        runbook_operator::telemetry::process::sample()
            .cpu_seconds
            .ok_or("the process's CPU time cannot be read (/proc/self/stat)")
    };
    let mut samples = Vec::new();
    for _ in 0..runs.max(1) {
        let before = now()?;
        let r = runbook_simulator::run_file(path);
        samples.push(now()? - before);
        if !r.passed() {
            return Err(format!("{}\n{}", r.summary(), r.diffs()));
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// The API writes a week of evaluations makes, per benchmark run.
pub struct WriteFigures {
    /// Benchmark Jobs applied (one per run).
    pub runs: usize,
    /// Applies, status writes and deletes of the Evaluator and its Jobs.
    pub cycle_writes: usize,
    pub status_writes: usize,
    /// Every write, the rollback and its Event included.
    pub all_writes: usize,
}

impl WriteFigures {
    pub fn per_cycle(&self) -> f64 {
        self.cycle_writes as f64 / self.runs.max(1) as f64
    }

    pub fn status_per_run(&self) -> f64 {
        self.status_writes as f64 / self.runs.max(1) as f64
    }
}

/// Count the writes of one run of the week scenario at `path`.
pub fn writes(path: &Path) -> Result<WriteFigures, String> {
    let r = runbook_simulator::run_file(path);
    if !r.passed() {
        return Err(format!("{}\n{}", r.summary(), r.diffs()));
    }
    let ok = |action: &str, kind: &str| {
        r.entries
            .iter()
            .filter(|e| e.action == action && e.kind == kind && e.result == "ok")
            .count()
    };
    let runs = ok("apply", "Job");
    let status_writes = ok("status", "Evaluator");
    let all_writes = r
        .entries
        .iter()
        .filter(|e| {
            e.result == "ok"
                && matches!(
                    e.action.as_str(),
                    "apply" | "delete" | "patch" | "status" | "rollback" | "event"
                )
        })
        .count();
    Ok(WriteFigures {
        runs,
        cycle_writes: runs + status_writes + ok("delete", "Job"),
        status_writes,
        all_writes,
    })
}
