//! Faults a test injects: fail the next requests that match, slow every
//! request down, cut every open watch.

use std::sync::Mutex;
use std::time::Duration;

/// The verbs of the Kubernetes API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiVerb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl ApiVerb {
    /// A verb by name (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == text)
    }

    pub const ALL: [ApiVerb; 8] = [
        ApiVerb::Get,
        ApiVerb::List,
        ApiVerb::Watch,
        ApiVerb::Create,
        ApiVerb::Update,
        ApiVerb::Patch,
        ApiVerb::Delete,
        ApiVerb::DeleteCollection,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiVerb::Get => "get",
            ApiVerb::List => "list",
            ApiVerb::Watch => "watch",
            ApiVerb::Create => "create",
            ApiVerb::Update => "update",
            ApiVerb::Patch => "patch",
            ApiVerb::Delete => "delete",
            ApiVerb::DeleteCollection => "deletecollection",
        }
    }

    pub fn is_write(self) -> bool {
        !matches!(self, ApiVerb::Get | ApiVerb::List | ApiVerb::Watch)
    }
}

#[derive(Clone, Debug)]
struct Rule {
    verb: Option<ApiVerb>,
    resource: Option<String>,
    remaining: u32,
    code: u16,
}

/// A permission the sandbox's user lacks, as RBAC would word it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    pub verb: ApiVerb,
    /// API group; empty for the core group.
    pub group: String,
    /// A plural, or `plural/subresource`.
    pub resource: String,
    /// Only in this namespace (None: everywhere).
    pub namespace: Option<String>,
}

/// The fault plan, shared by every request.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    denied: Mutex<Vec<Denied>>,
    latency: Mutex<Duration>,
    failed: Mutex<u64>,
}

impl Faults {
    /// Fail the next `n` requests of `verb` (any, if None) on `resource`
    /// (a plural such as "deployments"; any, if None) with `code`.
    pub fn fail_next(&self, n: u32, verb: Option<ApiVerb>, resource: Option<&str>, code: u16) {
        runbook_core::util::lock(&self.rules).push(Rule {
            verb,
            resource: resource.map(str::to_string),
            remaining: n,
            code,
        });
    }

    /// Take a permission away: requests that need it are Forbidden (403)
    /// and SelfSubjectAccessReviews for it say not allowed, as they would
    /// for a user whose RBAC lacks it.
    pub fn deny(&self, d: Denied) {
        runbook_core::util::lock(&self.denied).push(d);
    }

    /// Whether a request with these attributes is denied.
    pub fn is_denied(
        &self,
        verb: ApiVerb,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> bool {
        runbook_core::util::lock(&self.denied).iter().any(|d| {
            d.verb == verb
                && d.group == group
                && d.resource == resource
                && d.namespace
                    .as_deref()
                    .is_none_or(|ns| namespace == Some(ns))
        })
    }

    /// Delay every request by this much.
    pub fn set_latency(&self, d: Duration) {
        *runbook_core::util::lock(&self.latency) = d;
    }

    pub fn latency(&self) -> Duration {
        *runbook_core::util::lock(&self.latency)
    }

    /// Clear every rule and the latency.
    pub fn clear(&self) {
        runbook_core::util::lock(&self.rules).clear();
        runbook_core::util::lock(&self.denied).clear();
        self.set_latency(Duration::ZERO);
    }

    /// Requests failed on purpose so far.
    pub fn failed(&self) -> u64 {
        *runbook_core::util::lock(&self.failed)
    }

    /// The code to fail this request with, if a rule matches (and uses it
    /// up). `resource` is the request's plural, or `plural/subresource`; a
    /// rule on a plural matches its subresources too, a rule on
    /// `plural/subresource` only that subresource.
    pub fn take(&self, verb: ApiVerb, resource: &str) -> Option<u16> {
        let plural = resource.split('/').next().unwrap_or(resource);
        let mut rules = runbook_core::util::lock(&self.rules);
        let idx = rules.iter().position(|r| {
            r.remaining > 0
                && r.verb.is_none_or(|v| v == verb)
                && r.resource
                    .as_deref()
                    .is_none_or(|res| res == resource || res == plural)
        })?;
        rules[idx].remaining -= 1;
        let code = rules[idx].code;
        if rules[idx].remaining == 0 {
            rules.remove(idx);
        }
        *runbook_core::util::lock(&self.failed) += 1;
        Some(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_on_a_plural_covers_its_subresources_and_one_on_a_subresource_only_it() {
        let f = Faults::default();
        f.fail_next(1, Some(ApiVerb::Patch), Some("evaluators/status"), 503);
        assert_eq!(
            f.take(ApiVerb::Patch, "evaluators"),
            None,
            "the object itself"
        );
        assert_eq!(f.take(ApiVerb::Patch, "evaluators/scale"), None);
        assert_eq!(f.take(ApiVerb::Patch, "evaluators/status"), Some(503));
        assert_eq!(f.take(ApiVerb::Patch, "evaluators/status"), None, "used up");
        f.fail_next(2, None, Some("jobs"), 500);
        assert_eq!(f.take(ApiVerb::Patch, "jobs/status"), Some(500));
        assert_eq!(f.take(ApiVerb::Get, "jobs"), Some(500));
        assert_eq!(f.take(ApiVerb::Get, "jobs"), None);
        assert_eq!(f.failed(), 3);
    }
}
