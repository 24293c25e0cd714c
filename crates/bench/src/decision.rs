//! One evaluator decision: the shipped Rhai policy against the same rule in
//! native Rust, on the same objects, with every object converted to a Rhai
//! value once (as the watch caches do).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Rounds, Stats, native, samples};
use crate::fixtures::{self, JobState};
use runbook_core::decide::{self, Decision, Observed};
use runbook_core::observe::{CachedObject, MemoryView};
use runbook_core::policy::{self, Bundle, PolicySet};
use runbook_core::script::ScriptEngine;

/// A scored run awaiting its verdict, around a ~1 KB Evaluator.
pub struct Setup {
    pub engine: ScriptEngine,
    pub set: PolicySet,
    pub observed: Observed,
    pub target: Value,
    pub jobs: Vec<Value>,
    pub pods: Vec<Value>,
    pub replicasets: Vec<Value>,
    pub deployment: Value,
}

pub const JOB: &str = "chatbot-eval-5a2b";

impl Setup {
    pub fn new(policies: &std::path::Path, score: f64) -> Self {
        // The budget stops runaway scripts; here it would only turn a
        // thread the machine set aside for a moment into a failed run, so
        // the decisions measured get a generous one (containment has its
        // own benchmark, under the default).
        let engine = ScriptEngine::new(runbook_core::script::ScriptLimits {
            wall_time: std::time::Duration::from_secs(1),
            ..Default::default()
        });
        let bundle = Bundle::from_dir(policies).expect("policies directory");
        let (set, errors) = policy::load(&engine, &[bundle]);
        assert!(errors.is_empty(), "policies must load: {errors:?}");
        let view = Arc::new(MemoryView::new());
        let target = fixtures::with(
            fixtures::evaluator("chatbot", "chatbot", 0.85),
            json!({"status": {"phase": "Running", "currentRun": JOB, "lastRunTime": fixtures::CREATED,
                              "nextRunTime": "2026-11-29T11:00:00Z", "lastGoodRevision": 3}}),
        );
        let jobs = vec![fixtures::job(&target, JOB, 4, JobState::Succeeded)];
        let pods = vec![fixtures::job_pod(JOB, &format!("{{\"score\": {score}}}"))];
        let replicasets: Vec<Value> = (1..=4)
            .map(|r| fixtures::replicaset("chatbot", r))
            .collect();
        let deployment = fixtures::deployment("chatbot", 4);
        view.insert(deployment.clone());
        for o in jobs.iter().chain(&pods).chain(&replicasets) {
            view.insert(o.clone());
        }
        let cached = CachedObject::new(target.clone());
        let observed = Observed {
            readings: Default::default(),
            target: cached,
            view,
            now: "2026-11-29T10:05:00Z"
                .parse()
                .expect("a fixed timestamp parses"),
        };
        Self {
            engine,
            set,
            observed,
            target,
            jobs,
            pods,
            replicasets,
            deployment,
        }
    }

    pub fn scripted(&self) -> Decision {
        decide::decide(
            &self.engine,
            &self.set.policies["evaluator-drift"],
            &self.observed,
        )
        .expect("decision")
    }

    pub fn native(&self) -> Vec<runbook_core::script::Action> {
        let jobs: Vec<&Value> = self.jobs.iter().collect();
        let pods: Vec<&Value> = self.pods.iter().collect();
        let rs: Vec<&Value> = self.replicasets.iter().collect();
        native::decide(&native::Inputs {
            evaluator: &self.target,
            deployment: &self.deployment,
            jobs: &jobs,
            pods: &pods,
            replicasets: &rs,
            now: self.observed.now.as_second(),
            default_team: "ml-platform",
            rollback_allowed: true,
        })
    }

    /// Size of the target as JSON.
    pub fn target_bytes(&self) -> usize {
        serde_json::to_vec(&self.target)
            .map(|v| v.len())
            .unwrap_or(0)
    }
}

/// Figures for one comparison.
#[derive(Clone, Copy, Debug)]
pub struct DecisionFigures {
    pub target_bytes: usize,
    /// A finished run scored below the threshold: the rollback decision.
    pub scripted: Stats,
    pub native: Stats,
    /// The steady state: nothing finished, nothing due.
    pub scripted_idle: Stats,
    /// The lowest and highest round median of the rollback decision.
    pub scripted_spread: (std::time::Duration, std::time::Duration),
    /// Operations Rhai counts for the rollback and the steady-state
    /// decisions (what `max_operations` holds a script to).
    pub operations: Option<u64>,
    pub idle_operations: Option<u64>,
    /// A plain engine's time per operation, measured in the same rounds
    /// (`PlainLoop`).
    pub plain_per_operation: std::time::Duration,
}

impl DecisionFigures {
    pub fn ratio(&self) -> f64 {
        self.scripted.median.as_nanos() as f64 / self.native.median.as_nanos().max(1) as f64
    }

    /// The rollback decision's operations, each at a plain engine's time
    /// per operation: what the interpreter alone would take for that many,
    /// before any of Runbook's functions or a call's own cost.
    pub fn at_plain_cost(&self) -> Option<std::time::Duration> {
        let ops = u32::try_from(self.operations?).ok()?;
        Some(self.plain_per_operation * ops)
    }
}

/// The fewest operations `runs_within(limit)` succeeds under: the count
/// Rhai holds a script to with `max_operations`. `None` past 16 million.
fn least_operations(mut runs_within: impl FnMut(u64) -> bool) -> Option<u64> {
    const MOST: u64 = 1 << 24;
    if !runs_within(MOST) {
        return None;
    }
    let (mut lo, mut hi) = (1, MOST);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if runs_within(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

/// Rhai's time per operation on an engine with nothing of Runbook's (no
/// functions of its own, no limits, no progress callback), running about
/// the simplest script there is: a loop that assigns a constant. A
/// decision's operations at this time each are what the interpreter
/// alone costs it, the yardstick its figures are read against.
pub struct PlainLoop {
    engine: rhai::Engine,
    ast: rhai::AST,
    /// Operations of one call, as Rhai counts them.
    pub operations: u64,
}

impl PlainLoop {
    const SCRIPT: &str = "fn f() { let a = 0; for i in 0..100 { a = 1; } a }";

    pub fn new() -> Self {
        let engine = rhai::Engine::new();
        let ast = engine.compile(Self::SCRIPT).expect("the plain loop");
        let operations = least_operations(|limit| {
            let mut limited = rhai::Engine::new();
            limited.set_max_operations(limit);
            limited
                .call_fn::<rhai::Dynamic>(&mut rhai::Scope::new(), &ast, "f", ())
                .is_ok()
        })
        .expect("the plain loop ends");
        Self {
            engine,
            ast,
            operations,
        }
    }

    pub fn call(&self) -> rhai::Dynamic {
        self.engine
            .call_fn(&mut rhai::Scope::new(), &self.ast, "f", ())
            .expect("the plain loop")
    }
}

impl Default for PlainLoop {
    fn default() -> Self {
        Self::new()
    }
}

impl Setup {
    /// Operations the shipped policy's script takes to decide `observed`.
    pub fn operations(&self, observed: &Observed) -> Option<u64> {
        let policy = &self.set.policies["evaluator-drift"];
        least_operations(|limit| {
            let engine = ScriptEngine::new(runbook_core::script::ScriptLimits {
                max_operations: limit,
                wall_time: std::time::Duration::from_secs(1),
                ..Default::default()
            });
            decide::decide(&engine, policy, observed).is_ok()
        })
    }
}

impl Setup {
    /// The same Evaluator after its run finished and nothing is due.
    pub fn idle(&self) -> Observed {
        let mut t = self.target.clone();
        t["status"]["currentRun"] = Value::Null;
        t["status"]["phase"] = json!("Healthy");
        Observed {
            readings: Default::default(),
            target: CachedObject::new(t),
            view: self.observed.view.clone(),
            now: self.observed.now,
        }
    }
}

/// Rounds each figure is measured in, interleaved: its median is the
/// median of the rounds' medians.
pub const ROUNDS: usize = 5;

pub fn run(policies: &std::path::Path, iters: usize) -> DecisionFigures {
    let setup = Setup::new(policies, 0.72);
    let idle = setup.idle();
    let policy = &setup.set.policies["evaluator-drift"];
    let per = (iters / ROUNDS).max(1);
    let plain = PlainLoop::new();
    let [mut scripted, mut native, mut scripted_idle, mut plain_calls] =
        std::array::from_fn(|_| Rounds::default());
    for _ in 0..ROUNDS {
        scripted.push(samples(per / 10, per, || setup.scripted()));
        native.push(samples(per / 10, per, || setup.native()));
        scripted_idle.push(samples(per / 10, per, || {
            decide::decide(&setup.engine, policy, &idle).expect("decision")
        }));
        plain_calls.push(samples(per / 10, per, || plain.call()));
    }
    DecisionFigures {
        target_bytes: setup.target_bytes(),
        scripted: scripted.stats(),
        native: native.stats(),
        scripted_idle: scripted_idle.stats(),
        scripted_spread: scripted.spread(),
        operations: setup.operations(&setup.observed),
        idle_operations: setup.operations(&idle),
        plain_per_operation: plain_calls.stats().median / plain.operations.max(1) as u32,
    }
}
