//! The cluster an end-to-end test runs against: the in-process sandbox by
//! default, or a real cluster when RUNBOOK_TEST_KUBECONFIG names a
//! kubeconfig. Each test gets a namespace of its own and removes it after.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use runbook::sandbox::{Sandbox, SandboxConfig};

pub struct Cluster {
    pub client: Client,
    pub ns: String,
    pub sandbox: Option<Sandbox>,
}

fn unique(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let short: String = test
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(20)
        .collect::<String>()
        .to_lowercase();
    format!(
        "rbt-{short}-{:x}{:x}",
        std::process::id() % 0xfff,
        nanos % 0xfffff
    )
}

/// Whether the tests run against a real cluster.
pub fn real_cluster() -> Option<String> {
    std::env::var("RUNBOOK_TEST_KUBECONFIG")
        .ok()
        .filter(|p| !p.is_empty())
}

impl Cluster {
    pub async fn new(test: &str) -> Self {
        Self::with_config(test, SandboxConfig::default()).await
    }

    /// As `new`, with sandbox settings (ignored on a real cluster).
    pub async fn with_config(test: &str, config: SandboxConfig) -> Self {
        let (client, sandbox) = match real_cluster() {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(&path)
                    .expect("reading RUNBOOK_TEST_KUBECONFIG");
                let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .expect("kubeconfig");
                (Client::try_from(config).expect("client"), None)
            }
            None => {
                let s = Sandbox::new(config);
                (s.client(), Some(s))
            }
        };
        let ns = unique(test);
        let nss: Api<Namespace> = Api::all(client.clone());
        let mut n = Namespace::default();
        n.metadata.name = Some(ns.clone());
        nss.create(&PostParams::default(), &n)
            .await
            .expect("creating the test namespace");
        // A real cluster publishes its CA bundle into a new namespace a
        // moment later; a test starts once it is there, on either side.
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
        eventually("the namespace's kube-root-ca.crt", 60, || async {
            cms.get_opt("kube-root-ca.crt")
                .await
                .ok()
                .flatten()
                .is_some()
        })
        .await;
        Self {
            client,
            ns,
            sandbox,
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn cleanup(self) {
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let _ = nss.delete(&self.ns, &DeleteParams::default()).await;
    }
}

/// Poll `check` until it returns true, or fail after `secs` seconds.
pub async fn eventually<F, Fut>(what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The API error code of a result.
pub fn code<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> u16 {
    match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub fn reason<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}
