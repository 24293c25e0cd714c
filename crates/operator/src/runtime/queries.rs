//! Metric inputs asked for decisions (`spec.metrics`).
//!
//! A script's `ctx.metric(name)` finds the reading its decision was
//! given; a decision that wanted one it was not given is made again once
//! the runtime has asked (`reconcile::run_policy`). Asking is here: the
//! query or path the policy builds for the target, the address and
//! credentials read from the policy's namespace (as the policy's tenant,
//! for a tenant's policy), the request itself, and a cache of answers per
//! query text and period (`every`, or the fire time of a run the schedule
//! fired), in which
//! every decision that wants the same answer waits for the one request
//! that gets it: 1,000 targets sharing a query make one request a period.
//!
//! Requests follow no redirect, check certificates against the system's
//! roots, read at most `MAX_ANSWER_BYTES`, and each has the metric's
//! timeout. Nothing read from a ConfigMap or Secret (an address, a token)
//! is in a reading, a log line or a metric.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use serde_json::Value;

use crate::telemetry::Metrics;
use runbook_core::metric::jsonpath::JsonPath;
use runbook_core::metric::template::percent_encode;
use runbook_core::metric::{
    Address, Asked, CompiledMetric, KeyRef, MAX_ANSWER_BYTES, Reading, Reason, Source,
};
use runbook_core::policy::CompiledPolicy;
use runbook_core::util::lock;

/// What a source is asked.
pub struct Question<'a> {
    /// The metric's name in its policy.
    pub name: &'a str,
    /// `prometheus` or `web`.
    pub kind: &'static str,
    /// The base URL (none in a simulation, whose world answers by query).
    pub base: &'a str,
    /// The query, or the web path.
    pub text: &'a str,
    /// Asked as of this time (unix seconds), or now.
    pub time: Option<i64>,
    pub timeout: Duration,
    /// The `Authorization` header's value, if any.
    pub authorization: Option<String>,
    pub json_path: Option<&'a JsonPath>,
    /// Now, in unix seconds (a web answer's time).
    pub now: i64,
}

/// Where answers come from: HTTP in the operator, the world's series in
/// a simulation.
pub trait MetricSource: Send + Sync {
    fn answer<'a>(&'a self, q: Question<'a>) -> BoxFuture<'a, Reading>;
    /// Whether it needs an address (a simulation's world does not).
    fn needs_address(&self) -> bool {
        true
    }
}

type Http = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// Prometheus' HTTP API and JSON endpoints, over HTTP(S).
pub struct HttpSource {
    http: Http,
}

impl Default for HttpSource {
    fn default() -> Self {
        Self {
            http: crate::util::http_client("metric sources"),
        }
    }
}

impl HttpSource {
    fn url(q: &Question<'_>) -> String {
        match q.kind {
            "prometheus" => {
                let time = q.time.map(|t| format!("&time={t}")).unwrap_or_default();
                format!(
                    "{}/api/v1/query?query={}{time}",
                    q.base,
                    percent_encode(q.text)
                )
            }
            _ if q.text.is_empty() || q.text.starts_with('/') => format!("{}{}", q.base, q.text),
            _ => format!("{}/{}", q.base, q.text),
        }
    }

    async fn get(&self, q: &Question<'_>) -> Result<(http::StatusCode, Bytes), Reading> {
        let error = |m: String| Reading::missing(Reason::Error, m);
        let uri: http::Uri = Self::url(q)
            .parse()
            .map_err(|_| error("the address and path do not make a valid URL".into()))?;
        let mut req = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("runbook/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(a) = &q.authorization {
            req = req.header(http::header::AUTHORIZATION, a);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|_| error("the request could not be made".into()))?;
        let resp = self.http.request(req).await.map_err(|e| {
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain.push_str(": ");
                chain.push_str(&s.to_string());
                source = s.source();
            }
            error(format!("no answer: {}", chain.replace(q.base, "<address>")))
        })?;
        let code = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|_| {
                error(format!(
                    "the answer is larger than {} KiB, or was cut off",
                    MAX_ANSWER_BYTES / 1024
                ))
            })?
            .to_bytes();
        Ok((code, body))
    }
}

impl MetricSource for HttpSource {
    fn answer<'a>(&'a self, q: Question<'a>) -> BoxFuture<'a, Reading> {
        Box::pin(async move {
            let (code, body) = match tokio::time::timeout(q.timeout, self.get(&q)).await {
                Err(_) => {
                    return Reading::missing(
                        Reason::Timeout,
                        format!("no answer within {}s", q.timeout.as_secs_f64()),
                    );
                }
                Ok(Err(reading)) => return reading,
                Ok(Ok(answer)) => answer,
            };
            if code.is_redirection() {
                return Reading::missing(
                    Reason::Error,
                    format!("the source answered {code}; redirects are not followed"),
                );
            }
            match q.kind {
                // Prometheus says what is wrong with a query in its body.
                "prometheus" if code.is_success() || code.is_client_error() => {
                    runbook_core::metric::prometheus_answer(&body)
                }
                _ if !code.is_success() => {
                    Reading::missing(Reason::Error, format!("the source answered {code}"))
                }
                _ => match q.json_path {
                    Some(path) => runbook_core::metric::web_answer(&body, path, q.now),
                    None => Reading::missing(Reason::Error, "no JSON path to read"),
                },
            }
        })
    }
}

/// Who asks, and where what it reads is kept.
pub struct Asker<'a> {
    /// The policy's client: the operator's, or its tenant's account.
    pub client: &'a kube::Client,
    /// Where `addressFrom` and credentials are read: the operator's
    /// namespace, or the tenant's.
    pub namespace: &'a str,
    /// For a tenant's policy: the hosts it may reach.
    pub tenant_hosts: Option<&'a [String]>,
    pub metrics: &'a Metrics,
}

struct Entry {
    until_ms: i64,
    answer: Arc<tokio::sync::OnceCell<Reading>>,
}

/// The metric source and its answers, shared by every decision.
pub struct Queries {
    source: RwLock<Arc<dyn MetricSource>>,
    cache: Mutex<HashMap<String, Entry>>,
    pruned_ms: AtomicI64,
}

impl Default for Queries {
    fn default() -> Self {
        Self {
            source: RwLock::new(Arc::new(HttpSource::default())),
            cache: Mutex::default(),
            pruned_ms: AtomicI64::new(0),
        }
    }
}

/// How long an answer per fire time is kept.
const FIRE_KEPT_MS: i64 = 10 * 60_000;

impl Queries {
    /// Answer from `source` instead (a simulation's world).
    pub fn set_source(&self, source: Arc<dyn MetricSource>) {
        *runbook_core::util::write(&self.source) = source;
        lock(&self.cache).clear();
    }

    /// Answers kept now (their count).
    pub fn cached(&self) -> usize {
        lock(&self.cache).len()
    }

    /// The reading of `p`'s metric `name` for `target` at `now`.
    pub async fn ask(
        &self,
        asker: &Asker<'_>,
        p: &CompiledPolicy,
        target: &Value,
        name: &str,
        now: Timestamp,
    ) -> Asked {
        let Some(m) = p.metrics.iter().find(|m| m.name == name) else {
            return Asked {
                asked: String::new(),
                reading: Reading::missing(Reason::Error, format!("no metric {name:?}")),
            };
        };
        let asked = match m.ask(target) {
            Ok(text) => text,
            Err(e) => {
                let labels = [("policy", p.id.as_str()), ("result", "refused")];
                asker
                    .metrics
                    .metric_queries
                    .get_or_create(&Metrics::labels(&labels))
                    .inc();
                return Asked {
                    asked: String::new(),
                    reading: Reading::missing(Reason::Error, e),
                };
            }
        };
        let now_ms = now.as_millisecond();
        // A run the schedule fired shares its answer with every target of
        // that fire time; anything else, per period.
        let fire = m
            .on_schedule
            .then(|| {
                runbook_core::decide::schedule_state(p, target, now)
                    .ok()
                    .flatten()
            })
            .flatten()
            .filter(|s| s.due)
            .and_then(|s| s.fire)
            .map(|t| t.as_second());
        let (bucket, time, until_ms) = match fire {
            Some(f) => (f, Some(f), now_ms + FIRE_KEPT_MS),
            None => {
                let b = now_ms.div_euclid(m.every_ms);
                (b, None, (b + 1) * m.every_ms)
            }
        };
        let key = format!(
            "{}\0{}\0{:?}\0{:?}\0{asked}\0{bucket}\0{}",
            m.kind(),
            asker.namespace,
            m.address,
            m.auth,
            fire.is_some()
        );
        let answer = self.entry(key, until_ms, now_ms);
        let reading = answer
            .get_or_init(|| self.request(asker, p, m, &asked, time, now))
            .await
            .clone();
        Asked { asked, reading }
    }

    /// The cache entry of `key`, made if there is none; expired ones go.
    fn entry(
        &self,
        key: String,
        until_ms: i64,
        now_ms: i64,
    ) -> Arc<tokio::sync::OnceCell<Reading>> {
        let mut cache = lock(&self.cache);
        if now_ms - self.pruned_ms.load(Ordering::Relaxed) > 10_000 {
            cache.retain(|_, e| e.until_ms > now_ms);
            self.pruned_ms.store(now_ms, Ordering::Relaxed);
        }
        cache
            .entry(key)
            .or_insert_with(|| Entry {
                until_ms,
                answer: Arc::default(),
            })
            .answer
            .clone()
    }

    async fn request(
        &self,
        asker: &Asker<'_>,
        p: &CompiledPolicy,
        m: &CompiledMetric,
        text: &str,
        time: Option<i64>,
        now: Timestamp,
    ) -> Reading {
        let source = runbook_core::util::read(&self.source).clone();
        let started = Instant::now();
        let reading = match self.prepare(asker, m, source.needs_address()).await {
            Err(e) => Reading::missing(Reason::Error, e),
            Ok((base, authorization)) => {
                let json_path = match &m.source {
                    Source::Web { json_path, .. } => Some(json_path),
                    Source::Prometheus { .. } => None,
                };
                source
                    .answer(Question {
                        name: &m.name,
                        kind: m.kind(),
                        base: &base,
                        text,
                        time,
                        timeout: Duration::from_millis(m.timeout_ms.max(1) as u64),
                        authorization,
                        json_path,
                        now: now.as_second(),
                    })
                    .await
            }
        };
        let policy = [("policy", p.id.as_str())];
        asker
            .metrics
            .metric_query_seconds
            .get_or_create(&Metrics::labels(&policy))
            .observe(started.elapsed().as_secs_f64());
        let labels = [("policy", p.id.as_str()), ("result", reading.result())];
        asker
            .metrics
            .metric_queries
            .get_or_create(&Metrics::labels(&labels))
            .inc();
        reading
    }

    /// The base URL and the `Authorization` header, read where the
    /// policy keeps them; an error names the object, never a value.
    async fn prepare(
        &self,
        asker: &Asker<'_>,
        m: &CompiledMetric,
        needs_address: bool,
    ) -> Result<(String, Option<String>), String> {
        if !needs_address {
            return Ok((String::new(), None));
        }
        let base = match &m.address {
            Address::Inline(url) => url.clone(),
            Address::From(k) => {
                let url = key_value(asker, k).await?;
                runbook_core::metric::check_base_url(&url)
                    .map_err(|e| format!("{}: {e}", k.describe(asker.namespace)))?;
                url.trim_end_matches('/').to_string()
            }
        };
        if let Some(hosts) = asker.tenant_hosts {
            let host = runbook_core::metric::host_of(&base).unwrap_or("");
            let bare = host.rsplit_once(':').map_or(host, |(h, _)| h);
            if !hosts.iter().any(|h| h == host || h == bare) {
                return Err(format!(
                    "host {host} is not one the administrator lets tenants' metrics reach (runbook run --tenant-metric-hosts)"
                ));
            }
        }
        let authorization = if let Some(k) = &m.auth.bearer {
            Some(format!("Bearer {}", key_value(asker, k).await?))
        } else if let Some((name, user, pass)) = &m.auth.basic {
            let key = |key: &String| KeyRef {
                secret: true,
                name: name.clone(),
                key: key.clone(),
            };
            let user = key_value(asker, &key(user)).await?;
            let pass = key_value(asker, &key(pass)).await?;
            use base64::Engine as _;
            let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
            Some(format!("Basic {pair}"))
        } else {
            None
        };
        Ok((base, authorization))
    }
}

/// The value of a key of a ConfigMap or Secret of the asker's namespace,
/// trimmed; an error names the object and key.
async fn key_value(asker: &Asker<'_>, k: &KeyRef) -> Result<String, String> {
    let what = k.describe(asker.namespace);
    let found = if k.secret {
        Api::<Secret>::namespaced(asker.client.clone(), asker.namespace)
            .get_opt(&k.name)
            .await
            .map(|s| {
                s.map(|s| {
                    s.data.and_then(|d| {
                        d.get(&k.key)
                            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    })
                })
            })
    } else {
        Api::<ConfigMap>::namespaced(asker.client.clone(), asker.namespace)
            .get_opt(&k.name)
            .await
            .map(|c| c.map(|c| c.data.and_then(|d| d.get(&k.key).cloned())))
    };
    match found {
        Err(e) => Err(format!("reading {what}: {}", crate::util::api_error(&e))),
        Ok(None) => Err(format!("{what}: the object does not exist")),
        Ok(Some(None)) => Err(format!("{what}: the key is not there")),
        Ok(Some(Some(v))) if v.trim().is_empty() => Err(format!("{what}: the value is empty")),
        Ok(Some(Some(v))) => Ok(v.trim().to_string()),
    }
}

#[cfg(test)]
mod tests {
    // A test reads top to bottom.
    #![allow(clippy::unwrap_used, clippy::too_many_lines)]
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    use serde_json::json;

    /// A source on loopback that keeps every request's head and answers
    /// by path: a query, a JSON score, a redirect, 2 MiB, or nothing for 5 s.
    async fn source() -> (u16, Arc<Mutex<Vec<String>>>) {
        use runbook_sandbox::stub::Answer;
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = heads.clone();
        let (port, _task) = runbook_sandbox::stub::serve(move |head: String| {
            lock(&kept).push(head.clone());
            async move {
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                let json = "application/json";
                if path.starts_with("/api/v1/query") {
                    Answer::ok(json, r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"0.91"]}]}}"#)
                } else if path.starts_with("/web/") {
                    Answer::ok(json, r#"{"score": "0.5"}"#)
                } else if path == "/redirect" {
                    Answer {
                        status: "302 Found\r\nLocation: http://169.254.169.254/".into(),
                        ..Answer::ok(json, "")
                    }
                } else if path == "/big" {
                    Answer::ok(json, "x".repeat(2 << 20))
                } else {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Answer::ok(json, "{}")
                }
            }
        })
        .await
        .unwrap();
        (port, heads)
    }

    fn policy(port: u16) -> CompiledPolicy {
        let yaml = format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: p}}\nspec:\n  target: {{apiVersion: v1, kind: ConfigMap}}\n  script: p.rhai\n  metrics:\n  - name: prom\n    prometheus:\n      addressFrom: {{secretKeyRef: {{name: prom, key: url}}}}\n      auth: {{bearerToken: {{name: prom, key: token}}}}\n      query: 'up{{job=\"{{{{ .metadata.name }}}}\"}}'\n  - name: web\n    web:\n      address: http://127.0.0.1:{port}\n      path: /web/{{{{ .metadata.name }}}}\n      jsonPath: $.score\n      auth: {{basicAuth: {{name: basic}}}}\n  - name: redirect\n    web: {{address: 'http://127.0.0.1:{port}', path: /redirect, jsonPath: $.x}}\n  - name: big\n    web: {{address: 'http://127.0.0.1:{port}', path: /big, jsonPath: $.x}}\n  - name: slow\n    timeout: 1s\n    web: {{address: 'http://127.0.0.1:{port}', path: /slow, jsonPath: $.x}}\n"
        );
        let bundle = runbook_core::policy::Bundle::new(
            runbook_core::policy::Origin::Inline("t".into()),
            [
                ("p.yaml".to_string(), yaml),
                ("p.rhai".to_string(), "fn reconcile(ctx) { [] }".to_string()),
            ]
            .into(),
        );
        let (set, errors) =
            runbook_core::policy::load(&runbook_core::script::ScriptEngine::default(), &[bundle]);
        assert!(errors.is_empty(), "{errors:?}");
        set.policies.values().next().unwrap().as_ref().clone()
    }

    /// Credentials come from the policy's namespace and go in the header;
    /// redirects are not followed, long answers are cut, slow ones time
    /// out; one request serves every decision of its period; a tenant
    /// reaches only the hosts it is let.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_source_is_asked_once_per_period_within_its_guards() {
        let (port, heads) = source().await;
        let sandbox = runbook_sandbox::Sandbox::default();
        let client = sandbox.client();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
        for (name, data) in [
            (
                "prom",
                json!({"url": format!("http://127.0.0.1:{port}/"), "token": "s3cret"}),
            ),
            ("basic", json!({"username": "reader", "password": "pw"})),
        ] {
            let data: serde_json::Map<String, Value> = data
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| {
                    use base64::Engine as _;
                    let b = base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap());
                    (k.clone(), json!(b))
                })
                .collect();
            let s = json!({"metadata": {"name": name}, "data": data});
            secrets
                .create(&PostParams::default(), &serde_json::from_value(s).unwrap())
                .await
                .unwrap();
        }
        let p = policy(port);
        let metrics = Metrics::new();
        let asker = Asker {
            client: &client,
            namespace: "default",
            tenant_hosts: None,
            metrics: &metrics,
        };
        let queries = Queries::default();
        let target = json!({"metadata": {"name": "chat\"bot", "namespace": "default"}});
        let now = Timestamp::now();
        let prom = queries.ask(&asker, &p, &target, "prom", now).await;
        assert_eq!(prom.asked, r#"up{job="chat\"bot"}"#);
        assert_eq!(
            prom.reading,
            Reading::Value {
                value: 0.91,
                at: 1_700_000_000,
                samples: 1
            }
        );
        let again = queries.ask(&asker, &p, &target, "prom", now).await;
        assert_eq!(again.reading, prom.reading);
        let asked: Vec<String> = lock(&heads).clone();
        assert_eq!(asked.len(), 1, "one request for the period: {asked:?}");
        assert!(
            asked[0].contains("authorization: Bearer s3cret")
                || asked[0].contains("Authorization: Bearer s3cret"),
            "{}",
            asked[0]
        );
        assert!(
            asked[0].starts_with("GET /api/v1/query?query=up%7Bjob%3D%22chat%5C%22bot%22%7D "),
            "{}",
            asked[0]
        );

        let web = queries.ask(&asker, &p, &target, "web", now).await;
        assert_eq!(web.asked, "/web/chat%22bot");
        assert!(matches!(web.reading, Reading::Value { value, .. } if value == 0.5));
        let basic = lock(&heads).last().cloned().unwrap();
        // reader:pw
        assert!(
            basic
                .to_lowercase()
                .contains("authorization: basic cmvhzgvyonb3"),
            "{basic}"
        );

        for (name, reason, says) in [
            ("redirect", Reason::Error, "redirects are not followed"),
            ("big", Reason::Error, "larger than 1024 KiB"),
            ("slow", Reason::Timeout, "no answer within 1s"),
        ] {
            let got = queries.ask(&asker, &p, &target, name, now).await;
            match got.reading {
                Reading::Missing { reason: r, message } => {
                    assert_eq!(r, reason, "{name}: {message}");
                    assert!(message.contains(says), "{name}: {message}");
                    assert!(
                        !message.contains("s3cret") && !message.contains(&port.to_string()),
                        "{message}"
                    );
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        let text = metrics.render();
        for line in [
            r#"runbook_metric_queries_total{policy="p",result="value"} 2"#,
            r#"runbook_metric_queries_total{policy="p",result="timeout"} 1"#,
            r#"runbook_metric_queries_total{policy="p",result="error"} 2"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }

        // A tenant's policy reaches only the hosts it is let.
        let none: Vec<String> = Vec::new();
        let tenant = Asker {
            tenant_hosts: Some(&none),
            ..asker
        };
        let refused = Queries::default()
            .ask(&tenant, &p, &target, "web", now)
            .await;
        assert!(
            matches!(&refused.reading, Reading::Missing { message, .. } if message.contains("--tenant-metric-hosts")),
            "{refused:?}"
        );
        let let_in = vec!["127.0.0.1".to_string()];
        let tenant = Asker {
            tenant_hosts: Some(&let_in),
            ..tenant
        };
        let fine = Queries::default()
            .ask(&tenant, &p, &target, "web", now)
            .await;
        assert!(matches!(fine.reading, Reading::Value { .. }), "{fine:?}");
    }
}
