//! The start-up permission check: ask the API server, with
//! SelfSubjectAccessReviews, whether the operator holds every permission
//! its policies need (see `crate::rbac`), and say which are missing.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::rbac::{Need, Scope};
use runbook_core::kinds::KindRef;
use runbook_core::policy::PolicySet;

/// A permission the operator lacks, and what needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// `list jobs.batch in namespace default`.
    pub permission: String,
    pub why: Vec<String>,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (needed by {})", self.permission, self.why.join("; "))
    }
}

/// The real plural and scope of each kind the policies declare, from
/// discovery, so the check asks about the resources the server serves.
pub async fn served_kinds(
    client: &kube::Client,
    set: &PolicySet,
) -> BTreeMap<(String, String), (String, bool)> {
    let mut kinds: Vec<KindRef> = set
        .policies
        .values()
        .flat_map(|p| p.kinds.kinds().into_iter().cloned().collect::<Vec<_>>())
        .collect();
    kinds.sort();
    kinds.dedup();
    let mut out = BTreeMap::new();
    for k in kinds {
        let gvk = kube::api::GroupVersionKind::gvk(k.group(), k.version(), &k.kind);
        if let Ok((ar, caps)) = kube::discovery::pinned_kind(client, &gvk).await {
            out.insert(
                (k.group().to_string(), k.kind.clone()),
                (ar.plural, caps.scope == kube::discovery::Scope::Namespaced),
            );
        }
    }
    out
}

/// The permissions the operator's identity lacks to run `set`: the
/// resources as discovery serves them, the needs `runbook rbac` derives
/// with `opts`, each verb asked with a SelfSubjectAccessReview. The one
/// check, at start-up and on every policy edit. `Err` when the API server
/// could not answer.
pub async fn missing_for(
    client: &kube::Client,
    set: &PolicySet,
    opts: &crate::rbac::Options,
    watched: Option<&str>,
) -> Result<Vec<Missing>, kube::Error> {
    let served = served_kinds(client, set).await;
    let needs = crate::rbac::needs(set, opts, &served);
    check(client, &needs, watched).await
}

/// One question to the API server: may this identity do that?
struct Ask {
    /// The permission as `runbook rbac` describes it.
    described: String,
    cluster_scoped: bool,
    why: Vec<String>,
    attrs: ResourceAttributes,
}

/// Every verb on every name of a need, as questions.
fn asks_of(n: &Need, watched: Option<&str>) -> Vec<Ask> {
    let namespace = match &n.scope {
        Scope::Watched => watched.map(str::to_string),
        Scope::Cluster => None,
        Scope::Namespace(ns) => Some(ns.clone()),
    };
    let (resource, sub) = match n.resource.split_once('/') {
        Some((r, s)) => (r.to_string(), Some(s.to_string())),
        None => (n.resource.clone(), None),
    };
    let names: Vec<Option<String>> = if n.names.is_empty() {
        vec![None]
    } else {
        n.names.iter().cloned().map(Some).collect()
    };
    let mut out = Vec::new();
    for verb in &n.verbs {
        for name in &names {
            out.push(Ask {
                described: n.describe(verb),
                cluster_scoped: n.scope == Scope::Cluster,
                why: n.why.iter().cloned().collect(),
                attrs: ResourceAttributes {
                    namespace: namespace.clone(),
                    verb: Some(verb.clone()),
                    group: Some(n.group.clone()),
                    resource: Some(resource.clone()),
                    subresource: sub.clone(),
                    name: name.clone(),
                    ..Default::default()
                },
            });
        }
    }
    out
}

/// Ask one question; `Some` names the permission when it is not allowed.
async fn ask(api: Api<SelfSubjectAccessReview>, q: Ask) -> Result<Option<Missing>, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(q.attrs.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = api.create(&PostParams::default(), &review).await?;
    if answer.status.is_some_and(|s| s.allowed) {
        return Ok(None);
    }
    let mut permission = match &q.attrs.name {
        Some(name) => {
            let what = q.described.split(" named ").next().unwrap_or(&q.described);
            format!("{what} named {name}")
        }
        None => q.described.clone(),
    };
    permission.push_str(&match &q.attrs.namespace {
        Some(ns) => format!(" in namespace {ns}"),
        None if q.cluster_scoped => String::new(),
        None => " in all namespaces".to_string(),
    });
    Ok(Some(Missing {
        permission,
        why: q.why,
    }))
}

/// Ask about every verb of every need; return what is not allowed.
/// `watched` is the namespace the operator reconciles (None: all).
pub async fn check(
    client: &kube::Client,
    needs: &[Need],
    watched: Option<&str>,
) -> Result<Vec<Missing>, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let asks: Vec<Ask> = needs.iter().flat_map(|n| asks_of(n, watched)).collect();
    let results: Vec<Result<Option<Missing>, kube::Error>> = futures::stream::iter(asks)
        .map(|q| ask(api.clone(), q))
        .buffered(16)
        .collect()
        .await;
    let mut missing = Vec::new();
    for r in results {
        if let Some(m) = r? {
            missing.push(m);
        }
    }
    Ok(missing)
}
