//! Tenants: who a policy acts as.
//!
//! A policy loaded from a ConfigMap in a namespace other than the
//! operator's is a tenant's. Everything it writes (children, status,
//! patches, deletes, finalizers, Runbook's state, Events) is written as a
//! ServiceAccount of that namespace, which the administrator chooses
//! (`--tenant-service-account`, with a per-namespace override the tenant
//! cannot set), through impersonation: the API server itself then bounds
//! what the policy gets (RBAC, Pod Security admission, quotas), never the
//! operator's own rights. A cluster-wide policy acts as the operator.
//!
//! Reads come from the operator's shared caches, which the API server does
//! not check per request; the reload asks once per kind, with
//! SubjectAccessReviews, whether the tenant's account may read what its
//! policies read (`access::missing_for_tenant`), and refuses the bundle
//! otherwise.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use http::HeaderValue;
use kube::Client;

use crate::events::EventWriter;
use runbook_core::policy::model::PodsSpec;
use runbook_core::util::lock;

pub use crate::rbac::DEFAULT_TENANT_ACCOUNT as DEFAULT_ACCOUNT;

/// How tenants' policies act, as the administrator set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenancyConfig {
    /// The ServiceAccount, in each tenant's namespace, its policies act as.
    pub service_account: String,
    /// Another account for some namespaces: namespace -> account.
    pub overrides: BTreeMap<String, String>,
    /// The most a tenant's `spec.pods` may allow its pods.
    pub pod_bounds: PodsSpec,
    /// Why tenants' policies cannot run at all: the operator's own
    /// credentials already impersonate someone (a kubeconfig's `as:`), and
    /// a request impersonates one identity only.
    pub unable: Option<String>,
    /// The hosts (`host` or `host:port`) a tenant's metric inputs may
    /// reach; none: tenants' policies read no metrics.
    pub metric_hosts: Vec<String>,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        Self {
            service_account: DEFAULT_ACCOUNT.into(),
            overrides: BTreeMap::new(),
            pod_bounds: PodsSpec::default(),
            unable: None,
            metric_hosts: Vec::new(),
        }
    }
}

impl TenancyConfig {
    /// The account a tenant's policies act as in `namespace`.
    pub fn account(&self, namespace: &str) -> &str {
        self.overrides
            .get(namespace)
            .map_or(self.service_account.as_str(), String::as_str)
    }

    /// That account's user name, as the API server authenticates it.
    pub fn user(&self, namespace: &str) -> String {
        format!(
            "system:serviceaccount:{namespace}:{}",
            self.account(namespace)
        )
    }

    /// The groups a ServiceAccount of `namespace` is in.
    pub fn groups(namespace: &str) -> Vec<String> {
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".into(),
        ]
    }
}

/// A tenant's identity on the wire: a client whose every request
/// impersonates the tenant's account, and the Event writer over it.
pub struct Acting {
    pub namespace: String,
    pub user: String,
    pub client: Client,
    pub recorder: EventWriter,
}

/// The tenants' identities, made once per namespace.
pub struct Tenants {
    /// The operator's own client, before anything looks at its answers:
    /// a tenant's refusals are the tenant's, not the operator's.
    base: Client,
    config: TenancyConfig,
    identity: String,
    acting: Mutex<HashMap<String, Arc<Acting>>>,
}

impl Tenants {
    pub fn new(base: Client, config: TenancyConfig, identity: &str) -> Self {
        Self {
            base,
            config,
            identity: identity.to_string(),
            acting: Mutex::default(),
        }
    }

    pub fn config(&self) -> &TenancyConfig {
        &self.config
    }

    /// How the policies of the tenant `namespace` act.
    pub fn acting(&self, namespace: &str) -> Arc<Acting> {
        let mut acting = lock(&self.acting);
        if let Some(a) = acting.get(namespace) {
            return a.clone();
        }
        let user = self.config.user(namespace);
        let client = impersonating(&self.base, &user);
        let a = Arc::new(Acting {
            namespace: namespace.to_string(),
            recorder: EventWriter::of_runbook(client.clone(), &self.identity),
            client,
            user,
        });
        acting.insert(namespace.to_string(), a.clone());
        a
    }
}

/// A client whose requests are `user`'s, as `kubectl --as` makes them: the
/// API server checks that the operator may impersonate that user, then
/// answers as it would answer them. A ServiceAccount's groups come with it.
pub fn impersonating(client: &Client, user: &str) -> Client {
    let namespace = client.default_namespace().to_string();
    let value = HeaderValue::from_str(user).ok();
    let inner = client.clone();
    let service = tower::service_fn(move |mut req: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        let value = value.clone();
        async move {
            // A user name no header can carry is no one: the request goes
            // as the anonymous user, whom RBAC grants nothing.
            let header = value.unwrap_or_else(|| HeaderValue::from_static("system:anonymous"));
            req.headers_mut().insert("impersonate-user", header);
            inner.send(req).await
        }
    });
    Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_acts_as_its_override_or_the_default_account() {
        let config = TenancyConfig {
            overrides: [("team-b".to_string(), "deployer".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            config.user("team-a"),
            "system:serviceaccount:team-a:runbook-tenant"
        );
        assert_eq!(
            config.user("team-b"),
            "system:serviceaccount:team-b:deployer"
        );
        assert_eq!(
            TenancyConfig::groups("team-a"),
            [
                "system:serviceaccounts",
                "system:serviceaccounts:team-a",
                "system:authenticated"
            ]
        );
    }
}
