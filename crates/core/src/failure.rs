//! Why an action or a reconcile did not go through, as a kind of its own:
//! the label metrics count it under, the reason its `Degraded` condition
//! and Warning Event carry, whether it was held back on purpose (a
//! refusal) or failed, and how soon it is worth trying again. Each layer
//! has its error type (`ScriptError`, `DecideError`, the writer's
//! `ExecError`, the runtime's `ReconcileError`); each says its [`Cause`].

use std::fmt;
use std::time::Duration;

use crate::kinds::KindRef;
use crate::script::ScriptErrorKind;

/// The kind of a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The script failed: it does not parse, raised an error, ran out of
    /// time or hit a limit, or returned something that is not actions.
    Script(ScriptErrorKind),
    /// The policy's schedule could not be read.
    Schedule,
    /// An action the policy may not take as written (a kind it does not
    /// declare or names ambiguously), or an object the API server calls
    /// invalid (422).
    Invalid,
    /// An object the policy may not touch (not a child it made), or pods
    /// asking for more than the policy allows.
    Refused,
    /// Beyond what the target's author may do, or a target with no author
    /// Runbook can trust.
    Unauthorized,
    /// Beyond what Runbook's own RBAC grants (403).
    Forbidden,
    /// Someone else changed the object first (409).
    Conflict,
    /// The object is gone (404).
    NotFound,
    /// The API server failed (5xx).
    Server,
    /// Any other answer of the API server.
    Api,
    /// No answer: the connection failed or timed out.
    Transport,
    /// A rollback with nothing to roll back to.
    Rollback,
    /// Discovery could not say how the API server serves a kind.
    Discovery,
    /// The target's status (or Runbook's state of it) could not be written.
    Status,
    /// A finalizer could not be added or removed.
    Finalizer,
    /// Runbook itself failed (a panic, caught).
    Panic,
}

impl Cause {
    /// The cause of an API server's answer with status `code`.
    pub fn of_status(code: u16) -> Self {
        match code {
            409 => Cause::Conflict,
            422 => Cause::Invalid,
            403 => Cause::Forbidden,
            404 => Cause::NotFound,
            c if c >= 500 => Cause::Server,
            _ => Cause::Api,
        }
    }

    /// The label metrics count it under.
    pub fn label(self) -> &'static str {
        match self {
            Cause::Script(kind) => kind.as_str(),
            Cause::Schedule => "schedule",
            Cause::Invalid => "invalid",
            Cause::Refused => "refused",
            Cause::Unauthorized => "unauthorized",
            Cause::Forbidden => "forbidden",
            Cause::Conflict => "conflict",
            Cause::NotFound => "not_found",
            Cause::Server => "server",
            Cause::Api => "api",
            Cause::Transport => "transport",
            Cause::Rollback => "rollback",
            Cause::Discovery => "discovery",
            Cause::Status => "status",
            Cause::Finalizer => "finalizer",
            Cause::Panic => "panic",
        }
    }

    /// The reason of the target's `Degraded` condition.
    pub fn reason(self) -> &'static str {
        match self {
            Cause::Script(_) => "ScriptError",
            Cause::Schedule => "ScheduleError",
            Cause::Unauthorized => "NotAuthorized",
            Cause::Refused => "ActionRefused",
            // The operator's own RBAC lacks it (not the author's rights).
            Cause::Forbidden => "Forbidden",
            Cause::Panic => "InternalError",
            _ => "ActionFailed",
        }
    }

    /// Held back on purpose (recorded as refused), not failed. Like a
    /// failure it stops the decision's later writes and is tried again
    /// with backoff, so the child is made once what was in its way is gone.
    pub fn is_refusal(self) -> bool {
        matches!(self, Cause::Refused | Cause::Unauthorized)
    }

    /// The longest a failure of this kind waits for its retry: `max`,
    /// except that a write refused for the operator's own lack of
    /// permission is tried again at least every 30 s, since what mends it
    /// (an administrator restoring a RoleBinding, the API server's RBAC
    /// cache warming up after a restart) happens outside and should be
    /// followed soon, not after minutes of doubled backoff.
    pub fn longest_backoff(self, max: Duration) -> Duration {
        match self {
            Cause::Forbidden => max.min(Duration::from_secs(30)),
            _ => max,
        }
    }
}

/// A failure: its cause, and the sentence a person reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Failed {
    pub cause: Cause,
    pub message: String,
}

impl Failed {
    pub fn new(cause: Cause, message: impl Into<String>) -> Self {
        Self {
            cause,
            message: message.into(),
        }
    }

    /// A kind the policy does not declare, or names ambiguously.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Cause::Invalid, message)
    }

    /// An object the policy may not touch: see [`Cause::Refused`].
    pub fn refused(message: impl Into<String>) -> Self {
        Self::new(Cause::Refused, message)
    }

    /// An action beyond what the target's author may take.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(Cause::Unauthorized, message)
    }

    pub fn is_refusal(&self) -> bool {
        self.cause.is_refusal()
    }
}

/// Why a policy may not take an action, found before anything is written:
/// each rule of what a policy may touch that an action can break.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// A kind the policy does not declare in the roles the verb needs.
    Undeclared {
        verb: &'static str,
        kind: KindRef,
        roles: &'static str,
    },
    /// A kind the policy names ambiguously, or not at all.
    UnknownKind { verb: &'static str, error: String },
    /// A cluster-scoped kind: a policy acts only in its target's namespace.
    ClusterScoped { kind: KindRef },
    /// An object in another namespace than the target's.
    OtherNamespace {
        kind: KindRef,
        namespace: String,
        target: String,
    },
    /// A namespaced kind for a target with no namespace (cluster-scoped).
    NoNamespace { verb: &'static str, kind: KindRef },
    /// Status fields outside the policy's `spec.status.fields`.
    StatusFields { fields: Vec<String> },
    /// A condition outside the policy's `spec.status.conditions`.
    Condition { type_: String },
    /// An action on a target already deleted (in `deleted(ctx)`): its
    /// status, a new child of it, or a reconcile of it again.
    TargetGone { verb: &'static str },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Undeclared { verb, kind, roles } => write!(
                f,
                "{verb} of {kind} refused: the policy does not declare it in {roles}"
            ),
            Refused::UnknownKind { verb, error } => write!(f, "{verb} refused: {error}"),
            Refused::ClusterScoped { kind } => write!(
                f,
                "{kind} is cluster-scoped; a policy acts only in its target's namespace"
            ),
            Refused::OtherNamespace {
                kind,
                namespace,
                target,
            } => write!(
                f,
                "{kind} in namespace {namespace:?} refused: a policy acts only in its target's \
                 namespace ({target:?}), and in namespaces its spec.namespaces selector matches"
            ),
            Refused::NoNamespace { verb, kind } => write!(
                f,
                "{verb} of {kind} refused: it is namespaced and the target is cluster-scoped; a \
                 policy acts only in its target's namespace (a Namespace's is itself), and a \
                 cluster-scoped target of another kind has none"
            ),
            Refused::StatusFields { fields } => write!(
                f,
                "status of {} refused: the policy does not declare it in spec.status.fields",
                fields.join(", ")
            ),
            Refused::Condition { type_ } => write!(
                f,
                "condition {type_} refused: the policy does not declare it in \
                 spec.status.conditions"
            ),
            Refused::TargetGone { verb } => write!(
                f,
                "{verb} refused: the target is deleted; deleted(ctx) may raise Events and \
                 alerts, patch, roll back and delete, but not write the target's status, make \
                 it a child or reconcile it again"
            ),
        }
    }
}

/// A refusal, and where the action was made (`file:line:col` of the
/// script, when it came from one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub why: Refused,
    pub origin: Option<String>,
}

impl Refusal {
    pub fn new(why: Refused) -> Self {
        Self { why, origin: None }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.origin {
            Some(o) => write!(f, "{o}: {}", self.why),
            None => self.why.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_answers_map_to_the_causes_metrics_have_always_counted() {
        let labels: Vec<&str> = [409, 422, 403, 404, 500, 503, 400, 413]
            .into_iter()
            .map(|c| Cause::of_status(c).label())
            .collect();
        assert_eq!(
            labels,
            [
                "conflict",
                "invalid",
                "forbidden",
                "not_found",
                "server",
                "server",
                "api",
                "api"
            ]
        );
    }

    #[test]
    fn refusals_and_failures_carry_their_condition_reasons() {
        assert!(Failed::refused("x").is_refusal());
        assert!(Failed::unauthorized("x").is_refusal());
        assert!(!Failed::invalid("x").is_refusal());
        assert_eq!(Cause::Unauthorized.reason(), "NotAuthorized");
        assert_eq!(Cause::Refused.reason(), "ActionRefused");
        assert_eq!(Cause::Forbidden.reason(), "Forbidden");
        assert_eq!(
            Cause::Script(ScriptErrorKind::Timeout).reason(),
            "ScriptError"
        );
        assert_eq!(Cause::Script(ScriptErrorKind::Timeout).label(), "timeout");
        assert_eq!(Cause::Conflict.reason(), "ActionFailed");
    }
}
