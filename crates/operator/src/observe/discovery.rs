//! What the API server calls each kind: plural, scope, status subresource,
//! found by discovery once and remembered.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Scope;

use runbook_core::kinds::KindRef;
use runbook_core::util::lock;

use runbook_core::observe::Resolved;

/// Discovery results, by kind.
pub struct Resources {
    client: kube::Client,
    known: Mutex<HashMap<KindRef, Resolved>>,
}

impl Resources {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// Resolve a kind, asking the API server the first time.
    pub async fn resolve(&self, kind: &KindRef) -> Result<Resolved, kube::Error> {
        if let Some(r) = lock(&self.known).get(kind) {
            return Ok(r.clone());
        }
        let gvk = GroupVersionKind::gvk(kind.group(), kind.version(), &kind.kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk).await?;
        let r = Resolved {
            resource,
            namespaced: caps.scope == Scope::Namespaced,
            status_subresource: caps.subresources.iter().any(|(s, _)| s.plural == "status"),
        };
        lock(&self.known).insert(kind.clone(), r.clone());
        Ok(r)
    }

    /// What discovery said of a kind already resolved, without asking.
    pub fn known(&self, kind: &KindRef) -> Option<Resolved> {
        lock(&self.known).get(kind).cloned()
    }

    /// The API resource (plural included) and scope of a kind: from
    /// discovery when it has been resolved, else the usual naming rule.
    pub fn served_as(&self, kind: &KindRef) -> (ApiResource, bool) {
        self.known(kind)
            .map(|r| (r.resource, r.namespaced))
            .unwrap_or_else(|| (kind.api_resource(), kind.namespaced()))
    }

    /// Forget what discovery said (a CRD may have changed).
    pub fn forget(&self, kind: &KindRef) {
        lock(&self.known).remove(kind);
    }
}
