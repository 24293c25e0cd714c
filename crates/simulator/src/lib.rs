//! Scenarios: see and test what policies will do, offline. A scenario is
//! initial objects, a timeline of world events on a simulated clock, and
//! the actions expected; running one runs the real operator against the
//! in-process sandbox (see `run`).

pub mod fold;
pub mod html;
pub mod model;
pub mod replay;
pub mod report;
pub mod run;
pub mod world;

pub use model::{Scenario, ScenarioError, is_scenario, load};
pub use report::Report;

use std::path::{Path, PathBuf};

/// Every scenario file below `path` (or `path` itself), in name order.
pub fn find(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let p = entry?.path();
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            if name.starts_with('.') {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if (name.ends_with(".yaml") || name.ends_with(".yml"))
                && std::fs::read_to_string(&p).is_ok_and(|t| is_scenario(&t))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Load and run one scenario file.
pub fn run_file(path: &Path) -> Report {
    match load(path) {
        Ok(s) => run::run(&s),
        Err(errors) => Report {
            name: path
                .file_stem()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default(),
            file: path.display().to_string(),
            start: jiff::Timestamp::UNIX_EPOCH,
            entries: Vec::new(),
            checked: 0,
            failures: Vec::new(),
            load_errors: errors,
            specs: Default::default(),
            metrics: Vec::new(),
            set_aside: Vec::new(),
            zone: None,
        },
    }
}
