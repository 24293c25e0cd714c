//! Where a kind is watched. A kind that a cluster-wide policy declares is
//! watched in every namespace (or the one the operator reconciles). A kind
//! that only tenants' policies declare is watched in those tenants'
//! namespaces alone, so that the Role `runbook rbac --tenant` prints there
//! is all the operator needs for them: a tenant's own CRD never asks for
//! a right to it cluster-wide.

use runbook_core::kinds::KindRef;
use runbook_core::policy::PolicySet;

use super::context::Context;

/// Where a kind's watch looks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Reach {
    /// Every namespace, or the one the operator reconciles.
    #[default]
    All,
    /// Only these tenants' namespaces, sorted.
    Tenants(Vec<String>),
}

impl Reach {
    /// Where `kind` is watched for `set`. Runbook's own state kind counts
    /// as declared by every policy whose targets keep their state apart.
    pub fn of(ctx: &Context, set: &PolicySet, kind: &KindRef) -> Self {
        if ctx.config.namespace.is_some() {
            return Reach::All;
        }
        let state = *kind == super::reconcile::state_kind();
        let mut tenants: Vec<String> = Vec::new();
        for p in set.policies.values() {
            let declares = p.target == *kind
                || p.kinds.declares(kind)
                || (state && !runbook_core::plan::state::owns_schema(&p.target));
            if !declares {
                continue;
            }
            match &p.tenant {
                None => return Reach::All,
                Some(t) if !tenants.contains(t) => tenants.push(t.clone()),
                Some(_) => {}
            }
        }
        if tenants.is_empty() {
            return Reach::All;
        }
        tenants.sort();
        Reach::Tenants(tenants)
    }

    /// The namespaces to watch (none: all, or the one reconciled).
    pub fn namespaces(&self, ctx: &Context) -> Vec<String> {
        match self {
            Reach::All => ctx.config.namespace.iter().cloned().collect(),
            Reach::Tenants(t) => t.clone(),
        }
    }

    pub fn tenants(&self) -> bool {
        matches!(self, Reach::Tenants(_))
    }
}
