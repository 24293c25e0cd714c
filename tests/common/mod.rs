//! Shared test support: the shipped policies loaded, an in-memory view of
//! the cluster, and a clock the test sets.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use jiff::Timestamp;
use runbook_core::decide::{self, Decision, Observed};
use runbook_core::observe::{CachedObject, MemoryView};
use runbook_core::policy::{self, Bundle, PolicySet};
use runbook_core::script::{Action, ScriptEngine};
use serde_json::Value;

pub struct World {
    pub engine: ScriptEngine,
    pub set: PolicySet,
    pub view: Arc<MemoryView>,
    pub now: Timestamp,
}

/// The shipped `policies/` at the workspace's root, from the root package's
/// tests or a crate's (`crates/NAME`).
pub fn policies_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("policies"))
        .find(|dir| dir.is_dir())
        .expect("policies/ above the package")
}

impl World {
    /// The policies shipped in `policies/`.
    pub fn shipped() -> Self {
        let engine = ScriptEngine::default();
        let bundle = Bundle::from_dir(&policies_dir()).unwrap();
        let (set, errors) = policy::load(&engine, &[bundle]);
        assert!(errors.is_empty(), "shipped policies must load: {errors:?}");
        Self::with_set(engine, set)
    }

    /// Policies from inline files.
    pub fn from_files(files: &[(&str, &str)]) -> Self {
        Self::from_files_on(ScriptEngine::default(), files)
    }

    /// Policies from inline files, run by `engine`.
    pub fn from_files_on(engine: ScriptEngine, files: &[(&str, &str)]) -> Self {
        let bundle = Bundle::new(
            policy::Origin::Inline("test".into()),
            files
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let (set, errors) = policy::load(&engine, &[bundle]);
        assert!(errors.is_empty(), "test policies must load: {errors:?}");
        Self::with_set(engine, set)
    }

    fn with_set(engine: ScriptEngine, set: PolicySet) -> Self {
        Self {
            engine,
            set,
            view: Arc::new(MemoryView::new()),
            now: "2026-11-29T10:00:30Z".parse().unwrap(),
        }
    }

    pub fn at(mut self, now: &str) -> Self {
        self.now = now.parse().unwrap();
        self
    }

    pub fn add(&self, v: Value) -> Arc<CachedObject> {
        self.view.insert(v)
    }

    pub fn try_decide(
        &self,
        policy: &str,
        target: &Value,
    ) -> Result<Decision, decide::DecideError> {
        let p = self
            .set
            .policies
            .get(policy)
            .unwrap_or_else(|| panic!("no policy {policy}"));
        let observed = Observed {
            readings: Default::default(),
            target: CachedObject::new(target.clone()),
            view: self.view.clone(),
            now: self.now,
        };
        decide::decide(&self.engine, p, &observed)
    }

    pub fn decide(&self, policy: &str, target: &Value) -> Decision {
        self.try_decide(policy, target)
            .unwrap_or_else(|e| panic!("decide failed: {e}"))
    }
}

/// The merged status fields of a decision.
pub fn status_of(d: &Decision) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for p in &d.actions {
        if let Action::Status { fields } = &p.action {
            for (k, v) in fields {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

pub fn verbs(d: &Decision) -> Vec<&'static str> {
    d.actions.iter().map(|p| p.action.verb()).collect()
}

pub fn applied(d: &Decision) -> Vec<&Value> {
    d.actions
        .iter()
        .filter_map(|p| match &p.action {
            Action::Apply { object } => Some(object),
            _ => None,
        })
        .collect()
}

pub fn alerts(d: &Decision) -> Vec<&std::collections::BTreeMap<String, String>> {
    d.actions
        .iter()
        .filter_map(|p| match &p.action {
            Action::Alert { labels, .. } => Some(labels),
            _ => None,
        })
        .collect()
}

pub fn rollbacks(d: &Decision) -> Vec<(String, Option<i64>)> {
    d.actions
        .iter()
        .filter_map(|p| match &p.action {
            Action::Rollback {
                deployment,
                revision,
            } => Some((deployment.clone(), *revision)),
            _ => None,
        })
        .collect()
}

pub fn condition<'a>(d: &'a Decision, type_: &str) -> Option<(&'a str, &'a str, &'a str)> {
    d.actions.iter().rev().find_map(|p| match &p.action {
        Action::Condition(c) if c.type_ == type_ => {
            Some((c.status.as_str(), c.reason.as_str(), c.message.as_str()))
        }
        _ => None,
    })
}
