//! One evaluator decision: the shipped Rhai policy against the same rule in
//! native Rust, on the same objects, with every object converted to a Rhai
//! value once (as the watch caches do).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Rounds, Stats, native, samples};
use crate::bench::fixtures::{self, JobState};
use crate::decide::{self, Decision, Observed};
use crate::observe::{CachedObject, MemoryView};
use crate::policy::{self, Bundle, PolicySet};
use crate::script::ScriptEngine;

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
        let engine = ScriptEngine::new(crate::script::ScriptLimits {
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
            target: cached,
            view,
            now: "2026-11-29T10:05:00Z".parse().unwrap(),
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

    pub fn native(&self) -> Vec<crate::script::Action> {
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
}

impl DecisionFigures {
    pub fn ratio(&self) -> f64 {
        self.scripted.median.as_nanos() as f64 / self.native.median.as_nanos().max(1) as f64
    }
}

impl Setup {
    /// The same Evaluator after its run finished and nothing is due.
    pub fn idle(&self) -> Observed {
        let mut t = self.target.clone();
        t["status"]["currentRun"] = Value::Null;
        t["status"]["phase"] = json!("Healthy");
        Observed {
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
    let (mut scripted, mut native, mut scripted_idle) =
        (Rounds::default(), Rounds::default(), Rounds::default());
    for _ in 0..ROUNDS {
        scripted.push(samples(per / 10, per, || setup.scripted()));
        native.push(samples(per / 10, per, || setup.native()));
        scripted_idle.push(samples(per / 10, per, || {
            decide::decide(&setup.engine, policy, &idle).expect("decision")
        }));
    }
    DecisionFigures {
        target_bytes: setup.target_bytes(),
        scripted: scripted.stats(),
        native: native.stats(),
        scripted_idle: scripted_idle.stats(),
        scripted_spread: scripted.spread(),
    }
}
