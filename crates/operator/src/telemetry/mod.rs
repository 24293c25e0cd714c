//! Prometheus metrics, and the HTTP endpoint that serves them with
//! `/healthz` and `/readyz`.

pub mod journal;
pub mod log;
pub mod process;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

type Labels = Vec<(String, String)>;

fn histogram() -> Histogram {
    // 50 µs to about 26 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 20))
}

/// Every metric Runbook exports.
pub struct Metrics {
    registry: Registry,
    /// What every Prometheus client exports, unprefixed: the process.
    process: Registry,
    /// 1, labelled with the release and the commit it is built from.
    pub build_info: Family<Labels, Gauge>,
    /// Targets by kind, policy, condition and its status.
    pub targets: Family<Labels, Gauge>,
    /// Alerts firing, by receiver.
    pub alerts_firing: Family<Labels, Gauge>,
    /// Admission reviews answered, by webhook and result.
    pub webhook_reviews: Family<Labels, Counter>,
    pub reconciles: Family<Labels, Counter>,
    /// Reconciles of a policy on a target that changed nothing its last
    /// decision read, so were not decided again.
    pub unchanged: Family<Labels, Counter>,
    /// Items a full queue dropped (made up by a resync), by queue.
    pub queue_overflows: Family<Labels, Counter>,
    /// Reconciles skipped as unchanged that decided differently when
    /// checked (a read that was not recorded), by policy.
    pub skip_differences: Family<Labels, Counter>,
    pub reconcile_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    pub script_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// Requests for metric inputs (`spec.metrics`), by policy and result
    /// (`value`, `no_data`, `timeout`, `nan`, `error`, `refused`).
    pub metric_queries: Family<Labels, Counter>,
    /// Time per metric request, by policy.
    pub metric_query_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    pub actions: Family<Labels, Counter>,
    pub refusals: Family<Labels, Counter>,
    pub writes: Counter,
    pub queue_depth: Gauge,
    pub leader: Gauge,
    pub circuit_open: Family<Labels, Gauge>,
    pub policy_reloads: Family<Labels, Counter>,
    pub policy_info: Family<Labels, Gauge>,
    pub alerts: Family<Labels, Counter>,
    pub alert_queue: Family<Labels, Gauge>,
    pub skipped: Family<Labels, Counter>,
    /// Reconciles that panicked (a bug, caught: that reconcile fails alone).
    pub panics: Family<Labels, Counter>,
    /// Failed decisions and reconciles, by target kind and cause
    /// (`runbook_core::failure::Cause::label`).
    pub failures: Family<Labels, Counter>,
    /// 1 while a watch fails (by watch), 0 once it recovers.
    pub watch_failing: Family<Labels, Gauge>,
    /// Target controllers restarted after their task ended, by kind.
    pub controller_restarts: Family<Labels, Counter>,
    /// Waits for the cache to show a status write that reached their
    /// bound, by kind.
    pub cache_waits_ended: Family<Labels, Counter>,
    /// Status fields a policy wrote that the API server dropped, by
    /// policy and field.
    pub status_dropped: Family<Labels, Counter>,
    /// 1 for each status field (or `conditions`) a policy declares that
    /// its target's served schema does not list.
    pub status_unlisted: Family<Labels, Gauge>,
    /// 1 for each status field this release writes that one of Runbook's
    /// own CRDs, as served, lacks (the CRD is older than the operator).
    pub crd_outdated: Family<Labels, Gauge>,
    /// Writes the API server refused for lack of permission (403), by
    /// verb and resource.
    pub writes_forbidden: Family<Labels, Counter>,
    /// Decisions put off because their policy was at its share, by
    /// policy and limit (`concurrency`, `cpu`).
    pub policy_throttled: Family<Labels, Counter>,
    /// 1 for each policy bundle, by its state: `loaded` (its latest
    /// version in force), `refused` (its latest version refused, the last
    /// good one in force), `never_loaded` (none of it runs).
    pub bundle_state: Family<Labels, Gauge>,
    /// 1 for each policy of a bundle's version in force, by state:
    /// `loaded`, `set_aside`, `refused`; `never_loaded` with an empty
    /// `policy` for a bundle none of which runs.
    pub policy_state: Family<Labels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("runbook");
        let m = Self {
            reconciles: Family::default(),
            unchanged: Family::default(),
            queue_overflows: Family::default(),
            skip_differences: Family::default(),
            reconcile_seconds: Family::new_with_constructor(histogram as fn() -> Histogram),
            script_seconds: Family::new_with_constructor(histogram as fn() -> Histogram),
            metric_queries: Family::default(),
            metric_query_seconds: Family::new_with_constructor(histogram as fn() -> Histogram),
            actions: Family::default(),
            refusals: Family::default(),
            writes: Counter::default(),
            queue_depth: Gauge::default(),
            leader: Gauge::default(),
            circuit_open: Family::default(),
            policy_reloads: Family::default(),
            policy_info: Family::default(),
            alerts: Family::default(),
            alert_queue: Family::default(),
            skipped: Family::default(),
            panics: Family::default(),
            failures: Family::default(),
            watch_failing: Family::default(),
            controller_restarts: Family::default(),
            cache_waits_ended: Family::default(),
            status_dropped: Family::default(),
            status_unlisted: Family::default(),
            crd_outdated: Family::default(),
            writes_forbidden: Family::default(),
            policy_throttled: Family::default(),
            bundle_state: Family::default(),
            policy_state: Family::default(),
            build_info: Family::default(),
            targets: Family::default(),
            alerts_firing: Family::default(),
            webhook_reviews: Family::default(),
            registry: Registry::default(),
            process: Registry::default(),
        };
        m.register(&mut registry);
        m.set_build(env!("CARGO_PKG_VERSION"), "unknown");
        let mut process = Registry::default();
        process.register_collector(Box::new(process::ProcessCollector));
        Self {
            registry,
            process,
            ..m
        }
    }

    /// Register every metric under its name, with its help text.
    #[allow(clippy::too_many_lines)] // A table: one registration per metric.
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "reconciles",
            "Reconciles by policy and result",
            self.reconciles.clone(),
        );
        registry.register(
            "unchanged_reconciles",
            "Reconciles that were not decided again: nothing the last decision read had changed, by policy",
            self.unchanged.clone(),
        );
        registry.register(
            "queue_overflows",
            "Items a full queue dropped, by queue: changes and trigger (made up by a resync), deleted (deletions not told)",
            self.queue_overflows.clone(),
        );
        registry.register(
            "skip_check_differences",
            "Reconciles skipped as unchanged that decided differently when decided again to check (a read that was not recorded), by policy",
            self.skip_differences.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time per reconcile, by policy",
            self.reconcile_seconds.clone(),
        );
        registry.register(
            "script_duration_seconds",
            "Time in the decision (script or steps), by policy",
            self.script_seconds.clone(),
        );
        registry.register(
            "metric_queries",
            "Requests for metric inputs (spec.metrics; answers shared from the cache are not counted), by policy and result: value, no_data, timeout, nan, error (the source failed or answered something unreadable), refused (nothing sent: a field missing, a query out of the policy's bounds)",
            self.metric_queries.clone(),
        );
        registry.register(
            "metric_query_duration_seconds",
            "Time per request for a metric input, by policy",
            self.metric_query_seconds.clone(),
        );
        registry.register(
            "actions",
            "Actions by policy, type and result",
            self.actions.clone(),
        );
        registry.register(
            "refusals",
            "Actions refused by the permission check, by policy and type",
            self.refusals.clone(),
        );
        registry.register(
            "api_writes",
            "Write requests made to the API server",
            self.writes.clone(),
        );
        registry.register(
            "queue_depth",
            "Targets waiting to be reconciled after a change",
            self.queue_depth.clone(),
        );
        registry.register(
            "leader",
            "1 while this instance holds the leader lease",
            self.leader.clone(),
        );
        registry.register(
            "circuit_open",
            "1 while a policy's writes are suspended by its circuit breaker",
            self.circuit_open.clone(),
        );
        registry.register(
            "policy_reload",
            "Policy loads by result",
            self.policy_reloads.clone(),
        );
        registry.register(
            "watch_failing",
            "1 while a watch fails, by watch (its error is in the log and /readyz)",
            self.watch_failing.clone(),
        );
        registry.register(
            "controller_restarts",
            "Target controllers restarted after their task ended, by kind",
            self.controller_restarts.clone(),
        );
        registry.register(
            "status_unlisted",
            "1 for each status field a policy declares that its target's served schema does not list, by policy and field",
            self.status_unlisted.clone(),
        );
        registry.register(
            "crd_outdated",
            "1 for each status field this release writes that one of Runbook's own CRDs, as served, lacks, by CRD and field",
            self.crd_outdated.clone(),
        );
        registry.register(
            "writes_forbidden",
            "Writes the API server refused for lack of permission (403), by verb and resource",
            self.writes_forbidden.clone(),
        );
        registry.register(
            "policy_throttled",
            "Decisions put off because their policy was at its share (--policy-concurrency, --policy-cpu-budget), by policy and limit",
            self.policy_throttled.clone(),
        );
        registry.register(
            "bundle_state",
            "1 for each policy bundle, by state: loaded, refused (the last good version in force), never_loaded",
            self.bundle_state.clone(),
        );
        registry.register(
            "policy_state",
            "1 for each policy of a bundle's version in force, by bundle, policy and state: loaded, set_aside (a kind it names is not served), refused (the bundle's latest version is; this one serves); never_loaded (policy empty) for a bundle none of which runs",
            self.policy_state.clone(),
        );
        registry.register(
            "status_dropped",
            "Status fields a policy wrote that the API server dropped (its status schema does not list them), by policy and field",
            self.status_dropped.clone(),
        );
        registry.register(
            "cache_waits_ended",
            "Waits for a cache that reached their bound, by kind and wait: a reconcile for its last status write to show (30 s), or start-up and policy edits for a kind's cache to fill (60 s)",
            self.cache_waits_ended.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Failed decisions and reconciles (each retried with backoff), by target kind and cause: a script's error kind (syntax, runtime, timeout, limit, bad_result), schedule, refused, unauthorized, forbidden, invalid, conflict, not_found, server, api, transport, rollback, discovery, status, finalizer, panic",
            self.failures.clone(),
        );
        registry.register(
            "panics",
            "Reconciles that panicked, by kind: each failed alone and was retried",
            self.panics.clone(),
        );
        registry.register(
            "policy_info",
            "The policy versions in force",
            self.policy_info.clone(),
        );
        registry.register(
            "alerts",
            "Alert notifications by receiver and result",
            self.alerts.clone(),
        );
        registry.register(
            "skipped_objects",
            "Targets skipped because their metadata cannot be used, by kind",
            self.skipped.clone(),
        );
        registry.register(
            "alert_queue_depth",
            "Notifications waiting, by receiver",
            self.alert_queue.clone(),
        );
        registry.register(
            "targets",
            "Targets each policy selects, by kind, policy, condition (Ready, Degraded, Reconciling, Stalled) and its status (True, False, Unknown, None without it); said by the replica reconciling them",
            self.targets.clone(),
        );
        registry.register(
            "alerts_firing",
            "Alerts firing now, by receiver",
            self.alerts_firing.clone(),
        );
        registry.register(
            "webhook_reviews",
            "Admission reviews answered, by webhook (authorship, policies) and result (allowed, denied)",
            self.webhook_reviews.clone(),
        );
        registry.register(
            "build_info",
            "1, labelled with the release (version) and the commit it is built from",
            self.build_info.clone(),
        );
    }

    /// Say which release and commit this is (`runbook_build_info`).
    pub fn set_build(&self, version: &str, commit: &str) {
        self.build_info.clear();
        self.build_info
            .get_or_create(&Self::labels(&[("version", version), ("commit", commit)]))
            .set(1);
    }

    pub fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The text exposition: Runbook's metrics, then the process's.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &self.process);
        let _ = encode_eof(&mut out);
        out
    }
}

/// Renders the recent shadow decisions as JSON.
pub type ShadowLog = Arc<dyn Fn() -> String + Send + Sync>;

/// Whether the instance is ready, with notes said beside `ok` (what does
/// not keep it from being ready: a tenant's bundle that does not run), or
/// why not (the `/readyz` body).
pub type Readiness = Arc<dyn Fn() -> Result<Vec<String>, String> + Send + Sync>;

/// Readiness from one flag, with the reason given while it is down.
pub fn ready_when(flag: Arc<AtomicBool>, otherwise: &'static str) -> Readiness {
    Arc::new(move || {
        if flag.load(Ordering::Acquire) {
            Ok(Vec::new())
        } else {
            Err(otherwise.to_string())
        }
    })
}

/// Serve `/metrics`, `/healthz`, `/readyz` and `/shadow` (the recent
/// decisions of shadow policies, JSON) until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Readiness,
    shadow: ShadowLog,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (metrics, ready, shadow) = (metrics.clone(), ready.clone(), shadow.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (metrics, ready, shadow) = (metrics.clone(), ready.clone(), shadow.clone());
                    async move {
                        let (code, ctype, body) = match req.uri().path() {
                            "/metrics" => (
                                StatusCode::OK,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                metrics.render(),
                            ),
                            "/healthz" | "/livez" => {
                                (StatusCode::OK, "text/plain", "ok".to_string())
                            }
                            "/readyz" => match ready() {
                                Ok(notes) => {
                                    let mut body = "ok".to_string();
                                    for n in notes {
                                        body.push('\n');
                                        body.push_str(&n);
                                    }
                                    (StatusCode::OK, "text/plain", body)
                                }
                                Err(why) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", why),
                            },
                            "/shadow" => (StatusCode::OK, "application/json", shadow()),
                            _ => (StatusCode::NOT_FOUND, "text/plain", "not found".to_string()),
                        };
                        let mut r = Response::new(Full::new(Bytes::from(body)));
                        *r.status_mut() = code;
                        r.headers_mut().insert(
                            hyper::header::CONTENT_TYPE,
                            hyper::header::HeaderValue::from_static(ctype),
                        );
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> String {
        use std::io::{Read, Write};
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn the_server_answers_probes_metrics_and_shadow_decisions() {
        let metrics = Arc::new(Metrics::new());
        metrics
            .policy_reloads
            .get_or_create(&Metrics::labels(&[("result", "ok")]))
            .inc();
        let ready = Arc::new(AtomicBool::new(false));
        let shadow: ShadowLog = Arc::new(|| r#"[{"target":"default/w1"}]"#.to_string());
        let (addr, task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            metrics,
            ready_when(ready.clone(), "caches not synced yet"),
            shadow,
        )
        .await
        .unwrap();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let not_ready = get(addr, "/readyz").await;
        assert!(
            not_ready.starts_with("HTTP/1.1 503") && not_ready.ends_with("caches not synced yet"),
            "not ready before the caches sync: {not_ready}"
        );
        ready.store(true, Ordering::Release);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        let m = get(addr, "/metrics").await;
        assert!(
            m.contains("runbook_policy_reload_total{result=\"ok\"} 1"),
            "{m}"
        );
        let s = get(addr, "/shadow").await;
        assert!(
            s.contains("application/json") && s.ends_with(r#"[{"target":"default/w1"}]"#),
            "{s}"
        );
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        task.abort();
    }
}
