//! Delivering notifications: one bounded queue and one worker per receiver
//! integration, so a slow or dead receiver holds up nobody else and a
//! reconcile never waits for one. Each attempt has the receiver's timeout;
//! failures that may pass (connection errors, timeouts, 429 and 5xx) are
//! retried with exponential backoff, up to a number of attempts; a full
//! queue drops the notification and counts it.
//!
//! URLs from Secrets are read at every attempt, so a rotated Secret takes
//! effect at once, and they never appear in a log line, an Event, a
//! metric or an error: errors name the Secret, never its value.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::events::{Event as KubeEvent, EventWriter};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::Api;
use runbook_core::script::action::EventType;
use tokio::sync::mpsc;

use super::dispatch::Outbox;
use crate::telemetry::Metrics;
use runbook_core::alert::notify::{self, Notification};
use runbook_core::alert::routes::{CompiledRoutes, ReceiverKind, Target};

/// How delivery behaves.
#[derive(Clone, Debug)]
pub struct DeliveryConfig {
    /// Notifications waiting per integration before new ones are dropped.
    pub queue_capacity: usize,
    /// Attempts per notification, the first included.
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Where `secretKeyRef`s without a namespace are read when the routes
    /// came from a directory.
    pub secret_namespace: String,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 256,
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            secret_namespace: "runbook-system".into(),
        }
    }
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

struct Job {
    notification: Notification,
    integration: ReceiverKind,
    secret_namespace: String,
}

/// Why an attempt failed: `retry` when trying again may succeed.
#[derive(Debug)]
struct Failure {
    retry: bool,
    /// Never holds a URL or anything read from a Secret.
    message: String,
    /// A problem of configuration (a missing Secret or key, a bad URL).
    config: bool,
}

impl Failure {
    fn transient(message: impl Into<String>) -> Self {
        Self {
            retry: true,
            message: message.into(),
            config: false,
        }
    }
    fn permanent(message: impl Into<String>) -> Self {
        Self {
            retry: false,
            message: message.into(),
            config: false,
        }
    }
    fn config(message: impl Into<String>) -> Self {
        Self {
            retry: false,
            message: message.into(),
            config: true,
        }
    }
}

struct Inner {
    config: DeliveryConfig,
    client: Option<kube::Client>,
    recorder: Option<EventWriter>,
    http: HttpClient<Https, Full<Bytes>>,
    metrics: Arc<Metrics>,
}

/// One delivery queue: by routes document, receiver, integration, and (for
/// Alertmanager) URL.
type QueueKey = (String, String, usize, usize);

/// The delivery queues; the dispatcher's outbox in the operator.
pub struct Delivery {
    inner: Arc<Inner>,
    runtime: tokio::runtime::Handle,
    queues: Mutex<HashMap<QueueKey, mpsc::Sender<Job>>>,
}

impl Delivery {
    /// Must be called inside a tokio runtime; workers run on it.
    pub fn new(
        client: Option<kube::Client>,
        metrics: Arc<Metrics>,
        identity: &str,
        config: DeliveryConfig,
    ) -> Self {
        let recorder = client.clone().map(|c| EventWriter::of_runbook(c, identity));
        Self {
            inner: Arc::new(Inner {
                config,
                client,
                recorder,
                http: crate::util::http_client("alert receivers"),
                metrics,
            }),
            runtime: tokio::runtime::Handle::current(),
            queues: Mutex::new(HashMap::new()),
        }
    }

    fn queue(&self, key: QueueKey) -> mpsc::Sender<Job> {
        let mut queues = runbook_core::util::lock(&self.queues);
        if let Some(tx) = queues.get(&key)
            && !tx.is_closed()
        {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(self.inner.config.queue_capacity.max(1));
        self.runtime
            .spawn(work(self.inner.clone(), key.1.clone(), rx));
        queues.insert(key, tx.clone());
        tx
    }
}

impl Outbox for Delivery {
    fn send(&self, routes: &Arc<CompiledRoutes>, n: Notification) {
        let Some(receiver) = routes.receivers.get(&n.receiver) else {
            return;
        };
        let i = n.integration;
        let Some(kind) = receiver.kinds.get(i) else {
            return;
        };
        if *kind == ReceiverKind::Null {
            return;
        }
        let secret_namespace = routes
            .secret_namespace
            .clone()
            .unwrap_or_else(|| self.inner.config.secret_namespace.clone());
        // Each Alertmanager of an HA pair gets every alert, each on its own
        // queue: one that is down holds up nothing for the other.
        let jobs: Vec<(usize, ReceiverKind)> = match kind {
            ReceiverKind::Alertmanager {
                urls,
                timeout_ms,
                resend_ms,
            } => urls
                .iter()
                .enumerate()
                .map(|(j, url)| {
                    let one = ReceiverKind::Alertmanager {
                        urls: vec![url.clone()],
                        timeout_ms: *timeout_ms,
                        resend_ms: *resend_ms,
                    };
                    (j, one)
                })
                .collect(),
            other => vec![(0, other.clone())],
        };
        for (j, integration) in jobs {
            let job = Job {
                notification: n.clone(),
                integration,
                secret_namespace: secret_namespace.clone(),
            };
            self.enqueue((routes.name.clone(), n.receiver.clone(), i, j), job);
        }
    }
}

impl Delivery {
    fn enqueue(&self, key: QueueKey, job: Job) {
        let receiver = key.1.clone();
        let group = job.notification.group_key.clone();
        match self.queue(key).try_send(job) {
            Ok(()) => self.inner.depth(&receiver, 1),
            Err(_) => {
                self.inner.count(&receiver, "dropped");
                tracing::warn!(receiver = %receiver, group = %group, "alert notification dropped: the receiver's queue is full");
            }
        }
    }
}

async fn work(inner: Arc<Inner>, receiver: String, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.recv().await {
        inner.depth(&receiver, -1);
        inner.deliver(&job).await;
    }
}

/// Where Alertmanager takes alerts, from its base URL (or the endpoint
/// itself, given whole).
fn alerts_endpoint(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/api/v2/alerts") {
        base.to_string()
    } else {
        format!("{base}/api/v2/alerts")
    }
}

/// Take `secret` (a URL) and its path out of `text`.
fn redact(text: &str, secret: &str) -> String {
    let mut out = text.replace(secret, "[redacted]");
    if let Ok(uri) = secret.parse::<http::Uri>()
        && let Some(pq) = uri.path_and_query()
        && pq.as_str().len() > 1
    {
        out = out.replace(pq.as_str(), "[redacted]");
    }
    out
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

impl Inner {
    fn count(&self, receiver: &str, result: &str) {
        self.metrics
            .alerts
            .get_or_create(&Metrics::labels(&[
                ("receiver", receiver),
                ("result", result),
            ]))
            .inc();
    }

    fn depth(&self, receiver: &str, delta: i64) {
        self.metrics
            .alert_queue
            .get_or_create(&Metrics::labels(&[("receiver", receiver)]))
            .inc_by(delta);
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.config
            .backoff_base
            .saturating_mul(factor)
            .min(self.config.backoff_max)
    }

    async fn deliver(&self, job: &Job) {
        let receiver = &job.notification.receiver;
        let max = self.config.max_attempts.max(1);
        for attempt in 1..=max {
            match self.attempt(job).await {
                Ok(()) => {
                    self.count(receiver, "sent");
                    tracing::debug!(receiver = %receiver, group = %job.notification.group_key, attempt, "alert notification sent");
                    return;
                }
                Err(f) if f.config => {
                    self.count(receiver, "error");
                    tracing::error!(receiver = %receiver, group = %job.notification.group_key, "alert notification not sent: {}", f.message);
                    return;
                }
                Err(f) if !f.retry || attempt == max => {
                    self.count(receiver, "failed");
                    tracing::warn!(receiver = %receiver, group = %job.notification.group_key, attempts = attempt, "alert notification failed: {}", f.message);
                    return;
                }
                Err(f) => {
                    self.count(receiver, "retried");
                    let wait = self.backoff(attempt);
                    tracing::info!(receiver = %receiver, attempt, "alert notification failed, retrying in {wait:?}: {}", f.message);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    async fn attempt(&self, job: &Job) -> Result<(), Failure> {
        let n = &job.notification;
        match &job.integration {
            ReceiverKind::Webhook {
                url,
                timeout_ms,
                max_alerts,
                ..
            } => {
                let url = self.resolve(url, &job.secret_namespace).await?;
                let body = notify::webhook_payload(n, *max_alerts);
                self.post(&url, &body, *timeout_ms).await
            }
            ReceiverKind::Slack {
                url,
                channel,
                timeout_ms,
                ..
            } => {
                let url = self.resolve(url, &job.secret_namespace).await?;
                let body = notify::slack_payload(n, channel.as_deref());
                self.post(&url, &body, *timeout_ms).await
            }
            ReceiverKind::Event { reason } => self.events(n, reason).await,
            ReceiverKind::Alertmanager {
                urls,
                timeout_ms,
                resend_ms,
            } => {
                for url in urls {
                    let base = self.resolve(url, &job.secret_namespace).await?;
                    let url = alerts_endpoint(&base);
                    let body = notify::alertmanager_payload(n, *resend_ms);
                    self.post(&url, &body, *timeout_ms).await?;
                }
                Ok(())
            }
            ReceiverKind::Log { level } => {
                let text = notify::text(n);
                match level.as_str() {
                    "error" => {
                        tracing::error!(receiver = %n.receiver, group = %n.group_key, status = n.status(), "{text}")
                    }
                    "info" => {
                        tracing::info!(receiver = %n.receiver, group = %n.group_key, status = n.status(), "{text}")
                    }
                    _ => {
                        tracing::warn!(receiver = %n.receiver, group = %n.group_key, status = n.status(), "{text}")
                    }
                }
                Ok(())
            }
            ReceiverKind::Null => Ok(()),
        }
    }

    /// A Kubernetes Event on each object whose alert is in the notification.
    async fn events(&self, n: &Notification, reason: &str) -> Result<(), Failure> {
        let Some(recorder) = &self.recorder else {
            return Err(Failure::config(
                "an event receiver needs a Kubernetes client",
            ));
        };
        for a in &n.alerts {
            let s = &a.source;
            let reference = ObjectReference {
                api_version: Some(s.api_version.clone()),
                kind: Some(s.kind.clone()),
                name: Some(s.name.clone()),
                namespace: (!s.namespace.is_empty()).then(|| s.namespace.clone()),
                uid: (!s.uid.is_empty()).then(|| s.uid.clone()),
                ..Default::default()
            };
            let l = &a.alert.labels;
            let summary = a
                .alert
                .annotations
                .get("summary")
                .cloned()
                .unwrap_or_default();
            let note = format!(
                "{} [{}]: {}",
                l.get("alertname").map(String::as_str).unwrap_or("alert"),
                l.get("severity").map(String::as_str).unwrap_or("none"),
                summary
            );
            let ev = KubeEvent {
                type_: if a.firing() {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: if a.firing() {
                    reason.to_string()
                } else {
                    format!("{reason}Resolved")
                },
                note: Some(note.chars().take(1024).collect()),
                action: "Alert".into(),
                secondary: None,
            };
            recorder.publish(&ev, &reference).await.map_err(|e| {
                Failure::transient(format!(
                    "recording an Event: {}",
                    crate::util::api_error(&e)
                ))
            })?;
        }
        Ok(())
    }

    async fn resolve(&self, target: &Target, namespace: &str) -> Result<String, Failure> {
        let (key, ns) = match target {
            Target::Inline(url) => return Ok(url.clone()),
            Target::Secret { key, .. } => (key, key.namespace.as_deref().unwrap_or(namespace)),
        };
        let Some(client) = &self.client else {
            return Err(Failure::config(format!(
                "Secret {ns}/{} cannot be read without a Kubernetes client",
                key.name
            )));
        };
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        match api.get_opt(&key.name).await {
            Ok(Some(secret)) => {
                let value = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&key.key))
                    .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
                    .or_else(|| {
                        secret
                            .string_data
                            .as_ref()
                            .and_then(|d| d.get(&key.key))
                            .map(|s| s.trim().to_string())
                    });
                match value {
                    Some(v) if !v.is_empty() => Ok(v),
                    _ => Err(Failure::config(format!(
                        "Secret {ns}/{} has no key {:?}",
                        key.name, key.key
                    ))),
                }
            }
            Ok(None) => Err(Failure::config(format!(
                "Secret {ns}/{} does not exist",
                key.name
            ))),
            Err(e) => Err(Failure::transient(format!(
                "reading Secret {ns}/{}: {}",
                key.name,
                crate::util::api_error(&e)
            ))),
        }
    }

    async fn post(
        &self,
        url: &str,
        body: &serde_json::Value,
        timeout_ms: i64,
    ) -> Result<(), Failure> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| Failure::config("the receiver URL is not a valid URL"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(Failure::config("the receiver URL is not http(s)"));
        }
        if runbook_core::alert::routes::has_credentials(url) {
            return Err(Failure::config(
                runbook_core::alert::routes::CREDENTIALS_IN_URL,
            ));
        }
        let req = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("runbook/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| Failure::permanent(redact(&e.to_string(), url)))?;
        let timeout = Duration::from_millis(timeout_ms.max(1) as u64);
        match tokio::time::timeout(timeout, self.http.request(req)).await {
            Err(_) => Err(Failure::transient(format!("no answer within {timeout:?}"))),
            Ok(Err(e)) => Err(Failure::transient(redact(&error_chain(&e), url))),
            Ok(Ok(resp)) => {
                let code = resp.status();
                if code.is_success() {
                    Ok(())
                } else if code.is_server_error() || code.as_u16() == 429 {
                    Err(Failure::transient(format!("the receiver answered {code}")))
                } else {
                    Err(Failure::permanent(format!("the receiver answered {code}")))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_takes_out_the_url_and_its_token_path() {
        let url = "https://hooks.example.com/services/T000/B000/XXXX?token=abc";
        let text = format!("POST {url} failed; path /services/T000/B000/XXXX?token=abc");
        let r = redact(&text, url);
        assert!(!r.contains("XXXX") && !r.contains("token=abc"), "{r}");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let inner = Inner {
            config: DeliveryConfig {
                backoff_base: Duration::from_millis(100),
                backoff_max: Duration::from_millis(500),
                ..Default::default()
            },
            client: None,
            recorder: None,
            http: crate::util::http_client("alert receivers"),
            metrics: Arc::new(Metrics::new()),
        };
        let waits: Vec<u128> = (1..=5).map(|a| inner.backoff(a).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 500, 500]);
    }
}
