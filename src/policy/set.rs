//! `PolicySet`: every compiled policy and routing tree of one version,
//! immutable, swapped in whole.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::compile::{CompiledPolicy, LoadError, Loaded};
use super::model::Mode;
use crate::alert::routes::CompiledRoutes;
use crate::kinds::KindRef;
use crate::labels::{Requirement, Selector};
use crate::util::hash::short_hex;
use crate::util::yaml::Pos;

#[derive(Clone, Debug, Default)]
pub struct PolicySet {
    /// Content hash over every policy and routes version.
    pub version: String,
    pub policies: BTreeMap<String, Arc<CompiledPolicy>>,
    pub routes: BTreeMap<String, Arc<CompiledRoutes>>,
}

/// Two selectors that cannot both match one object: some key is required
/// to equal different values.
fn disjoint(a: &Selector, b: &Selector) -> bool {
    a.0.iter().any(|ra| {
        b.0.iter().any(|rb| match (ra, rb) {
            (Requirement::Eq(ka, va), Requirement::Eq(kb, vb)) => ka == kb && va != vb,
            _ => false,
        })
    })
}

/// `file:line:col`, as errors name a place.
fn place(file: &str, pos: Option<Pos>) -> String {
    match pos {
        Some(p) => format!("{file}:{}:{}", p.line, p.col),
        None => file.to_string(),
    }
}

impl PolicySet {
    /// Combine loaded bundles, checking what only the whole set can show:
    /// duplicate names, alert routes that do not exist (routes are shared
    /// by every bundle), and two enforcing policies on the same targets
    /// that would write the same part of their status.
    pub fn build(loaded: Vec<Loaded>) -> (PolicySet, Vec<LoadError>) {
        let mut errors = Vec::new();
        let mut set = PolicySet::default();
        let mut all_policies = Vec::new();
        for l in loaded {
            errors.extend(l.errors);
            for r in l.routes {
                if let Some(first) = set.routes.get(&r.name) {
                    errors.push(LoadError {
                        file: r.file.clone(),
                        pos: r.pos,
                        message: format!(
                            "AlertRoutes {:?} is already defined at {}",
                            r.name,
                            place(&first.file, first.pos)
                        ),
                    });
                    continue;
                }
                set.routes.insert(r.name.clone(), Arc::new(r));
            }
            all_policies.extend(l.policies);
        }
        for p in all_policies {
            if let Some(error) = set.refusal(&p) {
                errors.push(error);
                continue;
            }
            set.policies.insert(p.name.clone(), Arc::new(p));
        }
        set.version = set.compute_version();
        (set, errors)
    }

    /// Why a policy cannot join the set, if it cannot.
    fn refusal(&self, p: &CompiledPolicy) -> Option<LoadError> {
        let error = |pos: Option<Pos>, message: String| LoadError {
            file: p.file.clone(),
            pos,
            message,
        };
        if let Some(existing) = self.policies.get(&p.name) {
            return Some(error(
                None,
                format!(
                    "policy {:?} is already defined in {}",
                    p.name, existing.file
                ),
            ));
        }
        if let Some(r) = &p.alerts
            && !self.routes.contains_key(r)
        {
            let known: Vec<&str> = self.routes.keys().map(String::as_str).collect();
            let hint = match crate::util::suggest::closest(r, known.iter().copied()) {
                Some(m) => format!(" (did you mean {m:?}?)"),
                None if known.is_empty() => " (no AlertRoutes document is loaded)".into(),
                None => format!(" (loaded: {})", known.join(", ")),
            };
            return Some(error(
                p.alerts_pos,
                format!("spec.alerts: no AlertRoutes named {r:?} is loaded{hint}"),
            ));
        }
        if p.mode != Mode::Enforce {
            return None;
        }
        self.policies
            .values()
            .filter(|q| {
                q.target == p.target
                    && q.mode == Mode::Enforce
                    && !disjoint(&q.selector, &p.selector)
            })
            .find_map(|q| {
                let o = q.status.overlap(&p.status)?;
                Some(error(
                    o.second,
                    format!(
                        "policies {:?} ({}) and {:?} both write {} of {}: each policy on a kind declares the status it writes (spec.status: {{fields: [...], conditions: [...]}}) and no two declare the same, or one is mode: shadow",
                        q.name,
                        place(&q.file, o.first),
                        p.name,
                        o.what,
                        p.target
                    ),
                ))
            })
    }

    fn compute_version(&self) -> String {
        let mut text = String::new();
        for (name, p) in &self.policies {
            text.push_str(&format!("p:{name}={}\n", p.version));
        }
        for (name, r) in &self.routes {
            text.push_str(&format!("r:{name}={}\n", r.version));
        }
        short_hex(text.as_bytes(), 12)
    }

    /// Policies that target a kind, in the order they run (priority, then name).
    pub fn for_target(&self, kind: &KindRef) -> Vec<Arc<CompiledPolicy>> {
        let mut out: Vec<_> = self
            .policies
            .values()
            .filter(|p| &p.target == kind)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        out
    }

    /// The routing tree a policy's alerts go through: its own, else the one
    /// named `default`.
    pub fn routes_for(&self, policy: &CompiledPolicy) -> Option<Arc<CompiledRoutes>> {
        let name = policy.alerts.as_deref().unwrap_or("default");
        self.routes.get(name).cloned()
    }

    /// The label selector a watch of `kind`'s targets can ask the API
    /// server for: that of its policies when every one has the same
    /// non-empty selector and no policy declares the kind otherwise (owns,
    /// reads, mutates: it sees every object of it). `None`: watch all.
    pub fn watch_selector(&self, kind: &KindRef) -> Option<String> {
        let targeting = self.for_target(kind);
        let first = &targeting.first()?.selector;
        let same = targeting.iter().all(|p| &p.selector == first);
        let declared_elsewhere = self
            .policies
            .values()
            .any(|p| &p.target != kind && p.kinds.declares(kind));
        (!first.is_empty() && same && !declared_elsewhere).then(|| first.to_string())
    }

    /// Every kind any policy targets.
    pub fn target_kinds(&self) -> Vec<KindRef> {
        let mut out: Vec<KindRef> = self.policies.values().map(|p| p.target.clone()).collect();
        out.sort();
        out.dedup();
        out
    }
}
