//! The cluster an end-to-end test runs against: the in-process sandbox by
//! default, or a real cluster when RUNBOOK_TEST_KUBECONFIG names a
//! kubeconfig. Each test gets a namespace of its own and removes it after.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use runbook_sandbox::{Sandbox, SandboxConfig};

pub struct Cluster {
    /// The test's own client: an administrator (in `system:masters`),
    /// but a user apart from the operator, as people and Runbook are.
    pub client: Client,
    /// The client operators run with (the kubeconfig's own identity).
    pub operator_client: Client,
    pub ns: String,
    pub sandbox: Option<Sandbox>,
    /// Set once `cleanup` has run; otherwise dropping the cluster (a test
    /// that failed) tears the test's objects down.
    cleaned: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let (Some(path), ns) = (real_cluster(), self.ns.clone()) else {
            return;
        };
        // A failing test unwinds inside its runtime: tear down on a thread
        // of its own, with a client of its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(client) = client_for(&path).await {
                    teardown(&client, &ns).await;
                }
            });
        })
        .join();
    }
}

/// The CustomResourceDefinition kind, for tests that define kinds.
pub fn crd_resource() -> kube::core::ApiResource {
    kube::core::ApiResource {
        group: "apiextensions.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        plural: "customresourcedefinitions".into(),
    }
}

async fn client_for(path: &str) -> Result<Client, String> {
    client_impersonating(path, None).await
}

/// A client from the kubeconfig at `path`, acting as `user` (with its
/// groups) through impersonation when one is given.
async fn client_impersonating(path: &str, user: Option<(&str, &[&str])>) -> Result<Client, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    if let Some((name, groups)) = user {
        config.auth_info.impersonate = Some(name.to_string());
        config.auth_info.impersonate_groups =
            (!groups.is_empty()).then(|| groups.iter().map(|g| g.to_string()).collect());
    }
    Client::try_from(config).map_err(|e| e.to_string())
}

/// A client from the kubeconfig at `path` that authenticates with `token`
/// instead of the kubeconfig's own credentials.
async fn client_with_token(path: &str, token: &str) -> Result<Client, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    config.auth_info =
        serde_json::from_value(serde_json::json!({"token": token})).map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// Remove what a test made on a real cluster: the kinds it defined (groups
/// named after its namespace), the finalizers that would hold its objects
/// once no operator runs to remove them (its own kinds' and Runbook's),
/// and its namespace.
async fn teardown(client: &Client, ns: &str) {
    use kube::core::{ApiResource, DynamicObject};
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &crd_resource());
    let own_group = format!("{ns}.");
    for crd in crds
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let spec = &crd.data["spec"];
        let group = spec["group"].as_str().unwrap_or_default().to_string();
        let ours = group.starts_with(&own_group);
        if !ours && group != "runbook.dev" {
            continue;
        }
        let Some(version) = spec["versions"][0]["name"].as_str() else {
            continue;
        };
        let ar = ApiResource {
            group: group.clone(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: spec["names"]["kind"].as_str().unwrap_or_default().into(),
            plural: spec["names"]["plural"].as_str().unwrap_or_default().into(),
        };
        let namespaced = spec["scope"] == "Namespaced";
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(client.clone(), ns, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        for o in api
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            if o.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
            {
                let name = o.metadata.name.clone().unwrap_or_default();
                let _ = api
                    .patch(
                        &name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(
                            serde_json::json!({"metadata": {"finalizers": null}}),
                        ),
                    )
                    .await;
            }
        }
        if ours {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let _ = crds.delete(&name, &DeleteParams::default()).await;
        }
    }
    // Cluster-scoped objects a test made are named after its namespace.
    for (group, plural, kind) in [
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
        ),
        ("rbac.authorization.k8s.io", "clusterroles", "ClusterRole"),
        (
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "ClusterRoleBinding",
        ),
    ] {
        let ar = ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: format!("{group}/v1"),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        for o in api
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let name = o.metadata.name.clone().unwrap_or_default();
            if name.starts_with(ns) || name.ends_with(ns) {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    let _ = nss.delete(ns, &DeleteParams::default()).await;
    // And the namespaces it made beside its own (`extra_namespace`).
    let extra = format!("{ns}-");
    for n in nss
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let name = n.metadata.name.unwrap_or_default();
        if name.starts_with(&extra) {
            let _ = nss.delete(&name, &DeleteParams::default()).await;
        }
    }
}

/// Who a test's own writes come from.
pub const TEST_ADMIN: &str = "runbook-test-admin";

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

/// The kind Runbook keeps its state of other kinds' targets in, served
/// (as an install of Runbook has it): made if absent, left for the next
/// test on a real cluster.
async fn install_state_crd(client: &Client, ns: &str) {
    use kube::core::DynamicObject;
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &crd_resource());
    let crd: DynamicObject =
        serde_json::from_value(serde_json::to_value(runbook_core::crd::state::crd()).unwrap())
            .unwrap();
    let name = crd.metadata.name.clone().unwrap_or_default();
    match crds.get_opt(&name).await.ok().flatten() {
        None => match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("installing {name}: {e}"),
        },
        // One an earlier build installed on a kept cluster is upgraded,
        // as an install's `kubectl apply -f crds/` would.
        Some(old) if old.data["spec"]["versions"] != crd.data["spec"]["versions"] => {
            let mut new = crd.clone();
            new.metadata.resource_version = old.metadata.resource_version.clone();
            match crds.replace(&name, &PostParams::default(), &new).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!("upgrading {name}: {e}"),
            }
        }
        Some(_) => {}
    }
    let states = states_in(client, ns);
    eventually("RunbookState to be served", 60, || async {
        states.list(&Default::default()).await.is_ok()
    })
    .await;
}

/// The RunbookStates of namespace `ns`.
fn states_in(client: &Client, ns: &str) -> Api<kube::core::DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &runbook_core::kinds::KindRef::new("runbook.dev/v1alpha1", "RunbookState").api_resource(),
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
        let (client, operator_client, sandbox) = match real_cluster() {
            Some(path) => {
                let operator = client_for(&path)
                    .await
                    .unwrap_or_else(|e| panic!("RUNBOOK_TEST_KUBECONFIG={path}: {e}"));
                let own = client_impersonating(&path, Some((TEST_ADMIN, &["system:masters"])))
                    .await
                    .unwrap_or_else(|e| panic!("RUNBOOK_TEST_KUBECONFIG={path}: {e}"));
                (own, operator, None)
            }
            None => {
                let s = Sandbox::new(config);
                let own = s.client_as(TEST_ADMIN, &["system:masters"]);
                (own, s.client(), Some(s))
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
        install_state_crd(&client, &ns).await;
        Self {
            client,
            operator_client,
            ns,
            sandbox,
            cleaned: false,
        }
    }

    /// A kubeconfig file for a process (`runbook run`) to reach this
    /// cluster: the sandbox served on loopback for as long as the returned
    /// handle lives, or a copy of the real cluster's.
    pub async fn kubeconfig_file(
        &self,
        dir: &std::path::Path,
    ) -> (std::path::PathBuf, Option<runbook_sandbox::serve::Served>) {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("kubeconfig");
        let served = match (&self.sandbox, real_cluster()) {
            (Some(sandbox), _) => {
                let served = sandbox.serve(0).await.unwrap();
                std::fs::write(&path, served.kubeconfig(&self.ns)).unwrap();
                Some(served)
            }
            (None, Some(real)) => {
                std::fs::copy(real, &path).unwrap();
                None
            }
            (None, None) => unreachable!("a cluster is either the sandbox or a real one"),
        };
        (path, served)
    }

    /// The RunbookStates of the test's namespace (Runbook's state of
    /// targets whose schema is not Runbook's).
    pub fn runbook_states(&self) -> Api<kube::core::DynamicObject> {
        states_in(&self.client, &self.ns)
    }

    /// A client whose requests are `user`'s (with `groups`): RBAC holds it
    /// to what its bindings grant, on the sandbox as on a real cluster.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Client {
        match (&self.sandbox, real_cluster()) {
            (Some(s), _) => s.client_as(user, groups),
            (None, Some(path)) => client_impersonating(&path, Some((user, groups)))
                .await
                .unwrap_or_else(|e| panic!("a client as {user}: {e}")),
            (None, None) => unreachable!("a cluster is either the sandbox or a real one"),
        }
    }

    /// A client that authenticates as the ServiceAccount `namespace/name`
    /// (made if missing) with a token the API server issued for it, as a
    /// pod's client does: RBAC holds it to its bindings, and it may
    /// impersonate whom they let it.
    pub async fn client_of_service_account(&self, namespace: &str, name: &str) -> Client {
        use k8s_openapi::api::core::v1::ServiceAccount;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let mut sa = ServiceAccount::default();
        sa.metadata.name = Some(name.to_string());
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating ServiceAccount {namespace}/{name}: {e}"),
        }
        let request = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [], "expirationSeconds": 3600}
        });
        let answer: serde_json::Value = sas
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("a token for {namespace}/{name}: {e}"));
        let token = answer["status"]["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in {answer}"))
            .to_string();
        match (&self.sandbox, real_cluster()) {
            (Some(s), _) => s.client_with_token(&token),
            (None, Some(path)) => client_with_token(&path, &token)
                .await
                .unwrap_or_else(|e| panic!("a client with a token of {name}: {e}")),
            (None, None) => unreachable!("a cluster is either the sandbox or a real one"),
        }
    }

    /// A namespace besides the test's, removed with it: `{ns}-{suffix}`.
    pub async fn extra_namespace(&self, suffix: &str) -> String {
        let name = format!("{}-{suffix}", self.ns);
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let mut n = Namespace::default();
        n.metadata.name = Some(name.clone());
        nss.create(&PostParams::default(), &n)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        name
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

    /// Remove everything the test made (see `teardown`). A test that
    /// fails before it gets here is cleaned up when its cluster drops.
    pub async fn cleanup(mut self) {
        self.cleaned = true;
        if self.sandbox.is_none() {
            teardown(&self.client, &self.ns).await;
        }
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

/// `kubectl` with the cluster's kubeconfig in the test's namespace, its
/// exit status, stdout and stderr.
pub fn kubectl(kubeconfig: &std::path::Path, ns: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("running kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether kubectl is on PATH; a test that drives it skips, saying so,
/// where it is not.
pub fn have_kubectl() -> bool {
    let found = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok();
    if !found {
        eprintln!("skipped: kubectl is not on PATH");
    }
    found
}

/// A child process (`runbook run`, Prometheus) killed when the test lets
/// go of it.
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
