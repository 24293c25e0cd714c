//! Acting for a target's author, never for more than they may do. Runbook
//! acts with its own ServiceAccount's rights; before it acts on what a
//! target refers to (a Deployment to roll back, a Secret or volume put
//! into a child, objects read to decide), it asks the API server, with a
//! SubjectAccessReview, whether the target's author may do that
//! themselves, unless the object's owner allowed the target with the
//! annotation `runbook.dev/allow-targets`. The author comes from the
//! target's author record, which only Runbook's authorship webhook writes;
//! a target without a record Runbook can trust has no author, and only
//! what an owner allowed is done for it.
//!
//! Answers are remembered for [`TTL`] per author and question, so a
//! permission revoked takes effect within that time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::plan::{Access, Failed, Plan, Todo};
use crate::admission::{Author, Signer};
use crate::observe::discovery::Resources;
use crate::observe::view::AccessKey;
use runbook_core::kinds::{KindRef, Role};
use runbook_core::observe::CachedObject;
use runbook_core::policy::compile::CompiledPolicy;
use runbook_core::util::lock;

/// Why a target has no author Runbook trusts; said in the refusal of what
/// needed the author's rights.
#[derive(Debug, thiserror::Error)]
pub enum NoAuthor {
    #[error("Runbook runs without its authorship webhook, so no target has an author it can trust")]
    NoWebhook,
    #[error("Runbook has not learned its own identity from the API server yet")]
    IdentityUnknown,
    #[error(transparent)]
    Unverified(#[from] crate::admission::Unverified),
    #[error("it was written by Runbook itself, for no target")]
    NoOwner,
    #[error("it was written by Runbook for {kind} {name}, which Runbook does not see")]
    OwnerUnseen { kind: String, name: String },
    #[error("it was written by Runbook for a chain of targets too long to follow")]
    TooDeep,
}

/// Why Runbook could not learn its own user name (asked again later).
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "asking the API server who Runbook is (SelfSubjectReview): {}",
        crate::util::api_error(.0)
    )]
    Api(#[source] kube::Error),
    #[error("the SelfSubjectReview named no user")]
    NoUser,
}

/// How long an answer of the API server is trusted.
pub const TTL: Duration = Duration::from_secs(30);
/// Answers remembered at most (beyond, the memory starts over).
const REMEMBERED: usize = 20_000;

/// One question to the authorizer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Ask {
    verb: &'static str,
    group: String,
    resource: String,
    namespace: String,
    name: String,
}

/// Who targets are acted for, and what the API server says they may do.
pub struct Authority {
    client: kube::Client,
    signer: std::sync::OnceLock<Signer>,
    /// Runbook's own user name, as the API server authenticates it: a
    /// target Runbook wrote is acted on for the author of the target it
    /// was made for, never with Runbook's own rights.
    runbook: std::sync::OnceLock<String>,
    answers: Mutex<HashMap<(Author, Ask), (bool, tokio::time::Instant)>>,
}

/// How many targets made by Runbook for targets made by Runbook are
/// followed to a person.
const OWNER_DEPTH: usize = 4;

impl Authority {
    /// `signer` verifies author records; `None`: Runbook runs without its
    /// authorship webhook, so no target has an author.
    pub fn new(client: kube::Client, signer: Option<Signer>) -> Self {
        let cell = std::sync::OnceLock::new();
        if let Some(s) = signer {
            let _ = cell.set(s);
        }
        Self {
            client,
            signer: cell,
            runbook: std::sync::OnceLock::new(),
            answers: Mutex::new(HashMap::new()),
        }
    }

    pub fn signer(&self) -> Option<&Signer> {
        self.signer.get()
    }

    /// Verify author records with `signer` from now on (once: the webhook
    /// started after the operator was made).
    pub fn set_signer(&self, signer: Signer) {
        let _ = self.signer.set(signer);
    }

    /// Learn Runbook's own user name from the API server (a
    /// SelfSubjectReview, which every identity may make).
    pub async fn learn_identity(&self) -> Result<String, IdentityError> {
        if let Some(me) = self.runbook.get() {
            return Ok(me.clone());
        }
        let api: Api<k8s_openapi::api::authentication::v1::SelfSubjectReview> =
            Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &Default::default())
            .await
            .map_err(IdentityError::Api)?;
        let me = answer
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .filter(|u| !u.is_empty())
            .ok_or(IdentityError::NoUser)?;
        Ok(self.runbook.get_or_init(|| me).clone())
    }

    /// The author of a target, or why it has none. A target Runbook wrote
    /// itself (a child another policy targets) is acted on for the author
    /// of the target it was made for (its controller, which `view` holds).
    pub fn author_of(
        &self,
        target: &serde_json::Value,
        view: &dyn runbook_core::observe::ObjectView,
    ) -> Result<Author, NoAuthor> {
        let Some(signer) = self.signer.get() else {
            return Err(NoAuthor::NoWebhook);
        };
        let Some(me) = self.runbook.get() else {
            return Err(NoAuthor::IdentityUnknown);
        };
        let mut object = std::sync::Arc::new(target.clone());
        for _ in 0..OWNER_DEPTH {
            let verified = signer.verified(&object)?;
            if !verified.by(me) {
                return Ok(verified.author);
            }
            let owner = object
                .pointer("/metadata/ownerReferences")
                .and_then(serde_json::Value::as_array)
                .and_then(|refs| refs.iter().find(|r| r["controller"] == true))
                .cloned()
                .ok_or(NoAuthor::NoOwner)?;
            let text = |k: &str| owner[k].as_str().unwrap_or("").to_string();
            let kind = KindRef::new(text("apiVersion"), text("kind"));
            let ns = object
                .pointer("/metadata/namespace")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("");
            let found = view
                .get(&kind, ns, &text("name"))
                .filter(|o| o.uid() == text("uid"))
                .ok_or_else(|| NoAuthor::OwnerUnseen {
                    kind: kind.kind.clone(),
                    name: text("name"),
                })?;
            object = found.shared();
        }
        Err(NoAuthor::TooDeep)
    }

    /// Whether `author` may do what `ask` says (asked once per [`TTL`]).
    /// A review that could not be asked is the API server's failure (a
    /// transport error or a 5xx), never a refusal.
    async fn may(&self, author: &Author, ask: &Ask) -> Result<bool, super::ExecError> {
        let key = (author.clone(), ask.clone());
        let now = tokio::time::Instant::now();
        if let Some((allowed, at)) = lock(&self.answers).get(&key)
            && now.duration_since(*at) < TTL
        {
            return Ok(*allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(author.user.clone()),
                uid: (!author.uid.is_empty()).then(|| author.uid.clone()),
                groups: (!author.groups.is_empty()).then(|| author.groups.clone()),
                extra: (!author.extra.is_empty())
                    .then(|| author.extra.clone().into_iter().collect()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(ask.verb.to_string()),
                    group: Some(ask.group.clone()),
                    resource: Some(ask.resource.clone()),
                    namespace: Some(ask.namespace.clone()),
                    name: (!ask.name.is_empty()).then(|| ask.name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| super::ExecError::api("asking the API server (SubjectAccessReview)", e))?;
        let allowed = answer
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true));
        let mut answers = lock(&self.answers);
        if answers.len() >= REMEMBERED {
            answers.clear();
        }
        answers.insert(key, (allowed, now));
        Ok(allowed)
    }
}

/// `apps/v1 Deployment` as `deployments.apps`, the way refusals name it.
fn resource_name(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// The reads of a decision its author must be allowed: those of kinds the
/// policy reads or mutates (not the target's own kind, not its children's
/// kinds), each a `get` of one object or a `list` of the namespace.
pub fn reads_to_check(
    policy: &CompiledPolicy,
    target: &CachedObject,
    reads: &[AccessKey],
    view: &dyn runbook_core::observe::ObjectView,
) -> Vec<Access> {
    // An object whose owner allowed the target (`runbook.dev/allow-targets`)
    // is read for it whoever its author is, as it is acted on.
    let allowed = |kind: &KindRef, ns: &str, name: &str| {
        view.get(kind, ns, name)
            .is_some_and(|o| super::plan::allows_target(o.value(), target))
    };
    let kinds = &policy.kinds;
    reads
        .iter()
        .filter(|r| r.kind != policy.target && !kinds.has(&r.kind, Role::Owns))
        .filter(|r| {
            kinds.has(&r.kind, Role::Reads)
                || kinds.has(&r.kind, Role::Mutates)
                || kinds.has(&r.kind, Role::Deletes)
        })
        // A list of a kind read by name only reads those objects.
        .flat_map(|r| match (&r.name, policy.names_read(&r.kind)) {
            (None, Some(names)) => names
                .iter()
                .map(|n| (r, Some(n.clone())))
                .collect::<Vec<_>>(),
            _ => vec![(r, r.name.clone())],
        })
        .map(|(r, name)| Access {
            verb: if name.is_some() { "get" } else { "list" },
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            why: match &name {
                Some(n) => format!("read {} {}/{n}", r.kind.kind, r.namespace),
                None => format!("read the {} of {}", r.kind.plural(), r.namespace),
            },
            opted_in: name
                .as_deref()
                .is_some_and(|n| allowed(&r.kind, &r.namespace, n)),
            name,
        })
        .filter(|a| !(a.namespace.is_empty() && target.namespace().is_empty() && a.name.is_none()))
        .collect()
}

/// The annotation a `kubectl annotate` writes to have a target's author
/// recorded again (any write through the API server does it; this one
/// changes nothing else).
pub const TOUCHED: &str = "runbook.dev/touched";

/// A command that has the authorship webhook record who runs it as the
/// author of `target`: `kubectl apply` of an unchanged file sends
/// nothing, an annotation is always written.
pub fn touch_command(target: &serde_json::Value) -> String {
    let text = |p: &str| {
        target
            .pointer(p)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
    };
    let kind = text("/kind").to_lowercase();
    let group = text("/apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
    let resource = if group.is_empty() {
        kind
    } else {
        format!("{kind}.{group}")
    };
    let ns = match text("/metadata/namespace") {
        "" => String::new(),
        ns => format!(" -n {ns}"),
    };
    format!(
        "kubectl annotate {resource}/{}{ns} --overwrite {TOUCHED}=\"$(date +%s)\"",
        text("/metadata/name")
    )
}

/// Why `access` may not be used for `target`, if it may not: a refusal
/// (`Unauthorized`), or the failure that kept it from being checked.
async fn refusal(
    authority: &Authority,
    resources: &Resources,
    target: &CachedObject,
    author: &Result<Author, NoAuthor>,
    access: &Access,
) -> Option<Failed> {
    if access.opted_in {
        return None;
    }
    let tkind = target
        .value()
        .get("kind")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("target");
    let (ns, tname) = (target.namespace(), target.name());
    let allow = |kind: &KindRef| match &access.name {
        Some(_) => format!(
            "; or the {}'s owner annotates it {}={tkind}/{tname}",
            kind.kind,
            super::plan::ALLOW_TARGETS
        ),
        None => String::new(),
    };
    let author = match author {
        Ok(a) => a,
        Err(why) => {
            return Some(Failed::unauthorized(format!(
                "to {} Runbook needs its author's rights, and {why}; run `{}`{}",
                access.why,
                touch_command(target.value()),
                allow(&access.kind)
            )));
        }
    };
    let (group, resource) = match resources.resolve(&access.kind).await {
        Ok(r) => (r.resource.group, r.resource.plural),
        Err(_) => (access.kind.group().to_string(), access.kind.plural()),
    };
    let ask = Ask {
        verb: access.verb,
        group: group.clone(),
        resource: resource.clone(),
        namespace: access.namespace.clone(),
        name: access.name.clone().unwrap_or_default(),
    };
    let what = match &access.name {
        Some(n) => format!("{} {} {n:?}", access.verb, resource_name(&group, &resource)),
        None => format!("{} {}", access.verb, resource_name(&group, &resource)),
    };
    match authority.may(author, &ask).await {
        Ok(true) => None,
        Ok(false) => Some(Failed::unauthorized(format!(
            "{tkind} {ns}/{tname} was written by {author}, who may not {what} in namespace {:?}, and Runbook does for a target only what its author may do (to {}){}",
            access.namespace,
            access.why,
            allow(&access.kind)
        ))),
        Err(e) => Some(Failed::new(
            e.cause(),
            format!(
                "whether {author} may {what} in namespace {:?} could not be checked: {e}",
                access.namespace
            ),
        )),
    }
}

/// Refuse every write of the plan its target's author may not have made
/// (see the module). A read the author may not make refuses the whole
/// decision: nothing it concluded from what its author may not see is
/// written, not even to the target's status.
pub async fn authorize(
    authority: &Authority,
    resources: &Resources,
    view: &dyn runbook_core::observe::ObjectView,
    target: &CachedObject,
    plan: &mut Plan,
    reads: &[Access],
) {
    let any = !reads.is_empty() || plan.steps.iter().any(|s| !s.needs.is_empty());
    if !any {
        return;
    }
    let author = authority.author_of(target.value(), view);
    for access in reads {
        if let Some(failed) = refusal(authority, resources, target, &author, access).await {
            // The reason is said once, on the first step; the others
            // point to it. A check that could not be made fails with its
            // own cause (retried as the API server's failure), not as a
            // refusal.
            let (said, read) = match failed.is_refusal() {
                true => ("refused", "refused"),
                false => ("not taken", "not checked"),
            };
            let mut first = true;
            for step in &mut plan.steps {
                if matches!(step.todo, Todo::Refused(_)) {
                    continue;
                }
                let message = if first {
                    format!("{} {said}: {}", step.action.verb(), failed.message)
                } else {
                    format!(
                        "not taken: a read this decision needs was {read} (see the first action)"
                    )
                };
                first = false;
                step.todo = Todo::Fail(Failed::new(failed.cause, message));
            }
            plan.fields.clear();
            plan.conditions.clear();
            plan.events.clear();
            plan.alerts.clear();
            return;
        }
    }
    for step in &mut plan.steps {
        if !matches!(step.todo, Todo::Write(_)) {
            continue;
        }
        for access in &step.needs {
            if let Some(failed) = refusal(authority, resources, target, &author, access).await {
                let on = step
                    .target
                    .as_deref()
                    .map(|t| format!(" of {t}"))
                    .unwrap_or_default();
                let said = if failed.is_refusal() {
                    "refused"
                } else {
                    "not taken"
                };
                step.todo = Todo::Fail(Failed::new(
                    failed.cause,
                    format!("{}{on} {said}: {}", step.action.verb(), failed.message),
                ));
                break;
            }
        }
    }
}
