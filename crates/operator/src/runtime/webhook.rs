//! The webhooks as the operator runs them: every replica serves them over
//! HTTPS with the material in the shared Secret (renewed when due, the new
//! certificate served from the next connection on). The leader keeps the
//! authorship webhook's configuration in step with the policies loaded
//! (their target kinds) and the CA; the policy webhook checks policy
//! ConfigMaps as they are written, once the reload has registered its
//! check (`check_policies`).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use jiff::Timestamp;
use serde_json::Value;

use crate::admission::config::{self, AUTHORSHIP_PATH, AUTHORSHIP_WEBHOOK, Configures, Endpoint};
use crate::admission::policies::{self, POLICIES_PATH, POLICIES_WEBHOOK, PolicyCheck};
use crate::admission::tls::Material;
use crate::admission::{Authorship, Signer, WebhookError};
use crate::observe::discovery::Resources;
use runbook_core::policy::PolicySet;

/// How the webhook is served and announced.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Where the HTTPS server listens (port 0: any free port).
    pub listen: SocketAddr,
    /// How the API server reaches it; `None`: `https://` the address
    /// bound (an API server on the same host: tests, local runs).
    pub endpoint: Option<Endpoint>,
    /// The MutatingWebhookConfiguration kept in step.
    pub configuration: String,
    /// The Secret (namespace, name) holding the material the replicas
    /// share; `None`: made in memory for this process only.
    pub secret: Option<(String, String)>,
    /// What a configuration made from nothing carries beside the webhook
    /// (a namespace selector, say).
    pub created_with: Option<Value>,
}

/// How often the material is checked for renewal (and read again, to
/// pick up what another replica renewed).
const RENEW_EVERY: Duration = Duration::from_secs(3600);

/// The webhook this process serves.
pub struct Webhook {
    config: WebhookConfig,
    endpoint: Endpoint,
    material: ArcSwap<Material>,
    tls: Arc<ArcSwap<rustls::ServerConfig>>,
    /// What checks policy ConfigMaps, once the reload registered it.
    policy_check: Arc<OnceLock<Arc<dyn PolicyCheck>>>,
    /// The policy ConfigMaps it checks: their label and namespaces.
    policy_scope: OnceLock<(String, Vec<String>)>,
    pub addr: SocketAddr,
    server: crate::admission::server::Server,
}

/// `runbook_webhook_reviews_total{webhook,result}`'s series.
fn reviewed<'a>(
    metrics: &'a crate::telemetry::Metrics,
    webhook: &str,
    result: &str,
) -> impl std::ops::Deref<Target = prometheus_client::metrics::counter::Counter> + 'a {
    metrics
        .webhook_reviews
        .get_or_create(&crate::telemetry::Metrics::labels(&[
            ("webhook", webhook),
            ("result", result),
        ]))
}

/// Count a review answered, by whether it allowed the request.
fn count_review(metrics: &crate::telemetry::Metrics, webhook: &str, answer: &Value) {
    let allowed = answer["response"]["allowed"].as_bool().unwrap_or(false);
    reviewed(metrics, webhook, if allowed { "allowed" } else { "denied" }).inc();
}

impl Webhook {
    /// Read (or make) the material and start serving; `placer` places
    /// new targets, running sharded.
    pub async fn start(
        client: &kube::Client,
        config: WebhookConfig,
        metrics: Arc<crate::telemetry::Metrics>,
        placer: Option<crate::admission::review::Placer>,
    ) -> Result<Self, WebhookError> {
        let listening = |source| WebhookError::Io {
            doing: "listening on",
            addr: config.listen,
            source,
        };
        let listener = std::net::TcpListener::bind(config.listen).map_err(listening)?;
        let addr = listener.local_addr().map_err(listening)?;
        let endpoint = config
            .endpoint
            .clone()
            .unwrap_or_else(|| Endpoint::Url(format!("https://{addr}")));
        let material = load(client, &config, &endpoint).await?;
        let tls = Arc::new(ArcSwap::from_pointee(material.server_config()?));
        let hook = Authorship {
            signer: Signer::new(material.signing_key.clone()),
            placer,
        };
        let policy_check: Arc<OnceLock<Arc<dyn PolicyCheck>>> = Arc::default();
        let check = policy_check.clone();
        for webhook in ["authorship", "policies"] {
            for result in ["allowed", "denied"] {
                reviewed(&metrics, webhook, result).inc_by(0);
            }
        }
        let counted = metrics.clone();
        let routes = crate::admission::server::Routes::default()
            .with(
                AUTHORSHIP_PATH,
                Arc::new(move |review: Value| {
                    let answer = hook.review(&review);
                    count_review(&counted, "authorship", &answer);
                    Box::pin(async move { answer })
                }),
            )
            .with(
                POLICIES_PATH,
                Arc::new(move |review: Value| {
                    let check = check.get().cloned();
                    let metrics = metrics.clone();
                    Box::pin(async move {
                        let answer = policies::review(check.as_deref(), &review).await;
                        count_review(&metrics, "policies", &answer);
                        answer
                    })
                }),
            );
        let (addr, server) = crate::admission::server::serve(listener, tls.clone(), routes)
            .map_err(|source| WebhookError::Io {
                doing: "serving the webhook on",
                addr,
                source,
            })?;
        tracing::info!(%addr, "serving the authorship webhook");
        Ok(Self {
            config,
            endpoint,
            material: ArcSwap::from_pointee(material),
            tls,
            policy_check,
            policy_scope: OnceLock::new(),
            addr,
            server,
        })
    }

    /// The key author records are signed with.
    pub fn signer(&self) -> Signer {
        Signer::new(self.material.load().signing_key.clone())
    }

    /// Check the material (another replica may have renewed it, or it is
    /// due); serve what is current. Whether it changed.
    pub async fn renew(&self, client: &kube::Client) -> Result<bool, WebhookError> {
        if self.config.secret.is_none() {
            // Material made in memory lives as long as the process.
            return Ok(false);
        }
        let fresh = load(client, &self.config, &self.endpoint).await?;
        if **self.material.load() == fresh {
            return Ok(false);
        }
        self.tls.store(Arc::new(fresh.server_config()?));
        self.material.store(Arc::new(fresh));
        Ok(true)
    }

    /// Bring the webhook configuration in step with `set`: one rule per
    /// kind its policies target, as discovery serves them.
    pub async fn keep_in_step(
        &self,
        client: &kube::Client,
        set: &PolicySet,
        resources: &Resources,
    ) -> Result<bool, WebhookError> {
        let mut rules = Vec::new();
        for kind in set.target_kinds() {
            match resources.resolve(&kind).await {
                Ok(r) => rules.push(config::rule(
                    &r.resource.group,
                    &r.resource.version,
                    &r.resource.plural,
                )),
                Err(e) => tracing::warn!(
                    "the authorship webhook cannot cover {kind}: {}",
                    crate::util::api_error(&e)
                ),
            }
        }
        let material = self.material.load_full();
        config::keep_in_step(
            client,
            Configures::Mutating,
            &self.config.configuration,
            AUTHORSHIP_WEBHOOK,
            &material,
            |live, ca| config::authorship_webhook(live, &self.endpoint, ca, &rules),
            self.config.created_with.as_ref(),
        )
        .await
    }

    /// Stop accepting reviews (the process is shutting down): the API
    /// server then finds no replica here and applies the failure policy.
    pub fn stop(&self) {
        self.server.stop();
    }

    /// Check the ConfigMaps labelled `label=true` in `namespaces` with
    /// `check` from now on (once; the reload registers its own).
    pub fn check_policies(&self, check: Arc<dyn PolicyCheck>, label: &str, namespaces: &[String]) {
        let _ = self.policy_check.set(check);
        let _ = self
            .policy_scope
            .set((label.to_string(), namespaces.to_vec()));
    }

    /// Bring the policy webhook's ValidatingWebhookConfiguration (named as
    /// the authorship webhook's) in step with this webhook and its CA, once
    /// policies are checked here (`false` until then). The reload does it
    /// when it starts, the leader whenever it keeps the authorship
    /// webhook's in step (so a new leader points both at itself).
    pub async fn keep_policies_in_step(&self, client: &kube::Client) -> Result<bool, WebhookError> {
        let Some((label, namespaces)) = self.policy_scope.get() else {
            return Ok(false);
        };
        let material = self.material.load_full();
        config::keep_in_step(
            client,
            Configures::Validating,
            &self.config.configuration,
            POLICIES_WEBHOOK,
            &material,
            |live, ca| config::policies_webhook(live, &self.endpoint, ca, label, namespaces),
            None,
        )
        .await
    }

    /// Renew the material when due, every [`RENEW_EVERY`], until `stop`.
    pub fn spawn_renewal(
        self: &Arc<Self>,
        client: kube::Client,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let hook = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(RENEW_EVERY) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                match hook.renew(&client).await {
                    Ok(true) => tracing::info!("the webhook's certificate was renewed"),
                    Ok(false) => {}
                    Err(e) => tracing::error!("renewing the webhook's certificate: {e}"),
                }
            }
        })
    }
}

/// The material: from the Secret when one is named, else made here.
async fn load(
    client: &kube::Client,
    config: &WebhookConfig,
    endpoint: &Endpoint,
) -> Result<Material, WebhookError> {
    let hosts = endpoint.hosts();
    let now = Timestamp::now();
    match &config.secret {
        Some((ns, name)) => config::material(client, ns, name, &hosts, now).await,
        None => Material::generate(&hosts, now),
    }
}
