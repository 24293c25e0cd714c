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

impl PolicySet {
    /// Combine loaded bundles, checking what only the whole set can show:
    /// duplicate names, alert routes that do not exist, and two enforcing
    /// policies that could both write to the same object.
    pub fn build(loaded: Vec<Loaded>) -> (PolicySet, Vec<LoadError>) {
        let mut errors = Vec::new();
        let mut set = PolicySet::default();
        let mut all_policies = Vec::new();
        for l in loaded {
            errors.extend(l.errors);
            for r in l.routes {
                if set.routes.contains_key(&r.name) {
                    errors.push(LoadError {
                        file: String::new(),
                        pos: None,
                        message: format!("AlertRoutes {:?} is defined twice", r.name),
                    });
                    continue;
                }
                set.routes.insert(r.name.clone(), Arc::new(r));
            }
            all_policies.extend(l.policies);
        }
        for p in all_policies {
            if let Some(existing) = set.policies.get(&p.name) {
                errors.push(LoadError {
                    file: p.file.clone(),
                    pos: None,
                    message: format!(
                        "policy {:?} is already defined in {}",
                        p.name, existing.file
                    ),
                });
                continue;
            }
            if let Some(r) = &p.alerts
                && !set.routes.contains_key(r)
            {
                errors.push(LoadError {
                    file: p.file.clone(),
                    pos: None,
                    message: format!("spec.alerts: no AlertRoutes named {r:?} is loaded"),
                });
                continue;
            }
            let clash = set.policies.values().find(|q| {
                q.target == p.target
                    && q.mode == Mode::Enforce
                    && p.mode == Mode::Enforce
                    && !disjoint(&q.selector, &p.selector)
            });
            if let Some(q) = clash {
                errors.push(LoadError {
                    file: p.file.clone(),
                    pos: None,
                    message: format!(
                        "policies {:?} and {:?} both enforce on {}: give them disjoint selectors, or set mode: shadow on one",
                        q.name, p.name, p.target
                    ),
                });
                continue;
            }
            set.policies.insert(p.name.clone(), Arc::new(p));
        }
        set.version = set.compute_version();
        (set, errors)
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

    /// Every kind any policy targets.
    pub fn target_kinds(&self) -> Vec<KindRef> {
        let mut out: Vec<KindRef> = self.policies.values().map(|p| p.target.clone()).collect();
        out.sort();
        out.dedup();
        out
    }
}
