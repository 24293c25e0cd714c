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
        let r = crate::scenario::run_file(path);
        samples.push(t.elapsed());
        if !r.passed() {
            return Err(format!("{}\n{}", r.summary(), r.diffs()));
        }
        last = Some(r);
    }
    let r = last.expect("at least one run");
    let scenario = crate::scenario::load(path).map_err(|e| format!("{e:?}"))?;
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
