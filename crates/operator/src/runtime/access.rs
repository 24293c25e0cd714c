//! The start-up permission check: ask the API server, with
//! SelfSubjectAccessReviews, whether the operator holds every permission
//! its policies need (see `crate::rbac`), and say which are missing.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::rbac::{Need, Scope, Who};
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
    let needs: Vec<Need> = crate::rbac::needs(set, opts, &served)
        .into_iter()
        .filter(|n| n.who == Who::Operator)
        .collect();
    check(client, &needs, watched).await
}

/// What a tenant's bundle may not do, as its account and the operator
/// hold their rights now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantAccess {
    /// What refuses the bundle: a read the account may not make (a
    /// decision reads from the operator's caches, so the API server does
    /// not check it), or what the operator lacks to act as the account
    /// and watch what the policies read.
    pub refusals: Vec<String>,
    /// Writes the account may not make: the API server refuses them when
    /// they come, on the target's conditions; said at load so that the
    /// tenant knows before.
    pub warnings: Vec<String>,
}

/// Ask, for the policies of the tenant `tenant` (a set of one bundle's),
/// whether its account (`user`) may read and write what they declare
/// (SubjectAccessReviews) and whether the operator may act as it and
/// watch those kinds there (SelfSubjectAccessReviews). `Err` when the
/// API server could not answer: the bundle is not loaded then.
pub async fn tenant_access(
    client: &kube::Client,
    set: &PolicySet,
    tenant: &str,
    tenancy: &super::tenants::TenancyConfig,
) -> Result<TenantAccess, kube::Error> {
    let served = served_kinds(client, set).await;
    let opts = crate::rbac::Options {
        tenant: Some(tenant.to_string()),
        tenant_account: tenancy.account(tenant).to_string(),
        ..Default::default()
    };
    let needs = crate::rbac::needs(set, &opts, &served);
    let (account, operator): (Vec<Need>, Vec<Need>) =
        needs.into_iter().partition(|n| n.who == Who::Tenant);
    let user = tenancy.user(tenant);
    let subject = Subject::Named {
        user: user.clone(),
        groups: super::tenants::TenancyConfig::groups(tenant),
    };
    let mut out = TenantAccess::default();
    let hint = format!("see the Role `runbook rbac --tenant {tenant}` prints");
    let (reads, writes): (Vec<Missing>, Vec<Missing>) =
        ask_all(client, &account, Some(tenant), &subject)
            .await?
            .into_iter()
            .partition(|m| {
                ["get ", "list ", "watch "]
                    .iter()
                    .any(|v| m.permission.starts_with(v))
            });
    for line in by_resource(&reads) {
        out.refusals.push(format!(
            "{user} may not {line}: a tenant's policy reads only what its account may read ({hint})"
        ));
    }
    for line in by_resource(&writes) {
        out.warnings.push(format!("{user} may not {line}"));
    }
    if !out.warnings.is_empty() {
        out.warnings.push(format!(
            "the API server refuses those writes when the policies make them ({hint})"
        ));
    }
    let missing = ask_all(client, &operator, Some(tenant), &Subject::Operator).await?;
    for line in by_resource(&missing) {
        out.refusals
            .push(format!("the operator may not {line} ({hint})"));
    }
    Ok(out)
}

/// What is missing, one line per resource with its verbs: `create,
/// delete jobs.batch in namespace team-a (policy p owns batch/v1 Job)`.
pub fn by_resource(missing: &[Missing]) -> Vec<String> {
    let mut lines: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
    for m in missing {
        let (verb, rest) = m
            .permission
            .split_once(' ')
            .unwrap_or((m.permission.as_str(), ""));
        match lines.iter_mut().find(|(r, _, _)| r == rest) {
            Some((_, verbs, why)) => {
                verbs.push(verb.to_string());
                for w in &m.why {
                    if !why.contains(w) {
                        why.push(w.clone());
                    }
                }
            }
            None => lines.push((rest.to_string(), vec![verb.to_string()], m.why.clone())),
        }
    }
    lines
        .into_iter()
        .map(|(rest, verbs, why)| format!("{} {rest} ({})", verbs.join(", "), why.join("; ")))
        .collect()
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

/// Who a question is about.
#[derive(Clone, Debug)]
enum Subject {
    /// The operator itself (SelfSubjectAccessReview).
    Operator,
    /// Someone else (SubjectAccessReview).
    Named { user: String, groups: Vec<String> },
}

/// Whether the API server allows `subject` what `attrs` say.
async fn allowed(
    client: &kube::Client,
    subject: &Subject,
    attrs: &ResourceAttributes,
) -> Result<bool, kube::Error> {
    let status = match subject {
        Subject::Operator => {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(attrs.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
            api.create(&PostParams::default(), &review).await?.status
        }
        Subject::Named { user, groups } => {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.clone()),
                    groups: Some(groups.clone()),
                    resource_attributes: Some(attrs.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<SubjectAccessReview> = Api::all(client.clone());
            api.create(&PostParams::default(), &review).await?.status
        }
    };
    Ok(status.is_some_and(|s| s.allowed))
}

/// Ask one question; `Some` names the permission when it is not allowed.
async fn ask(
    client: &kube::Client,
    subject: &Subject,
    q: Ask,
) -> Result<Option<Missing>, kube::Error> {
    if allowed(client, subject, &q.attrs).await? {
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
    ask_all(client, needs, watched, &Subject::Operator).await
}

/// [`check`] for `subject`.
async fn ask_all(
    client: &kube::Client,
    needs: &[Need],
    watched: Option<&str>,
    subject: &Subject,
) -> Result<Vec<Missing>, kube::Error> {
    let asks: Vec<Ask> = needs.iter().flat_map(|n| asks_of(n, watched)).collect();
    let results: Vec<Result<Option<Missing>, kube::Error>> = futures::stream::iter(asks)
        .map(|q| ask(client, subject, q))
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
