//! Writes the API server refuses for lack of permission. A RoleBinding
//! deleted under a running operator leaves its watches open (they were
//! authorized when they began), so only its writes show the loss: every
//! request the operator sends is looked at here, and a write answered 403
//! is counted (`runbook_writes_forbidden_total{verb,resource}`) and keeps
//! `/readyz` failing, naming it, until the same write succeeds again or a
//! minute passes without it being refused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::telemetry::Metrics;
use runbook_core::util::lock;

/// How long a refused write keeps the instance unready without being
/// refused again.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);

/// Writes refused lately, by `verb resource`: since when, how many times,
/// and the last time.
#[derive(Default)]
pub struct Forbidden {
    refused: Mutex<BTreeMap<String, (Instant, u64, Instant)>>,
    metrics: Option<Arc<Metrics>>,
}

impl Forbidden {
    pub fn with_metrics(metrics: Arc<Metrics>) -> Self {
        Self {
            refused: Mutex::default(),
            metrics: Some(metrics),
        }
    }

    /// The answer to a request: `key` from [`write_key`], its status code.
    pub fn answered(&self, key: &(String, String), status: u16) {
        let name = format!("{} {}", key.0, key.1);
        let mut refused = lock(&self.refused);
        if status == 403 {
            let now = Instant::now();
            let e = refused.entry(name).or_insert((now, 0, now));
            e.1 += 1;
            e.2 = now;
            if let Some(m) = &self.metrics {
                m.writes_forbidden
                    .get_or_create(&Metrics::labels(&[("verb", &key.0), ("resource", &key.1)]))
                    .inc();
            }
        } else if status < 400 {
            refused.remove(&name);
        }
    }

    /// The writes refused within [`FORGET_AFTER`], each said on one line.
    pub fn now(&self) -> Vec<String> {
        let mut refused = lock(&self.refused);
        refused.retain(|_, (_, _, last)| last.elapsed() < FORGET_AFTER);
        refused
            .iter()
            .map(|(what, (since, n, _))| {
                format!(
                    "the API server refuses {what} for lack of permission (403, {n} times in {}s): see the operator's RBAC (`runbook rbac`)",
                    since.elapsed().as_secs()
                )
            })
            .collect()
    }
}

/// The verb and resource of a write (`patch`, `batch/jobs`, with its
/// subresource: `runbook.dev/evaluators/status`); `None` for reads.
pub fn write_key(method: &http::Method, path: &str) -> Option<(String, String)> {
    let verb = match *method {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => return None,
    };
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let resource = match rest {
        [resource] | [resource, _] => resource.to_string(),
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
        [] => return None,
    };
    Some((
        verb.to_string(),
        if group.is_empty() {
            resource
        } else {
            format!("{group}/{resource}")
        },
    ))
}

/// `client`, with every answer to its writes noted in `forbidden`.
pub fn observed(client: kube::Client, forbidden: Arc<Forbidden>) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (client, forbidden) = (client.clone(), forbidden.clone());
        let key = write_key(req.method(), req.uri().path());
        async move {
            let answer = client.send(req).await;
            if let (Some(key), Ok(res)) = (&key, &answer) {
                forbidden.answered(key, res.status().as_u16());
            }
            answer
        }
    });
    kube::Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn key(m: Method, path: &str) -> Option<String> {
        write_key(&m, path).map(|(v, r)| format!("{v} {r}"))
    }

    #[test]
    fn a_write_is_named_by_verb_and_resource() {
        assert_eq!(
            key(Method::PATCH, "/apis/batch/v1/namespaces/d/jobs/run-1").as_deref(),
            Some("patch batch/jobs")
        );
        assert_eq!(
            key(
                Method::PATCH,
                "/apis/runbook.dev/v1alpha1/namespaces/d/evaluators/a/status"
            )
            .as_deref(),
            Some("patch runbook.dev/evaluators/status")
        );
        assert_eq!(
            key(Method::POST, "/api/v1/namespaces/d/events").as_deref(),
            Some("create events")
        );
        assert_eq!(
            key(Method::DELETE, "/api/v1/namespaces/d").as_deref(),
            Some("delete namespaces")
        );
        assert_eq!(
            key(Method::PATCH, "/apis/example.com/v1/widgets/w").as_deref(),
            Some("patch example.com/widgets")
        );
        assert_eq!(key(Method::GET, "/api/v1/namespaces/d/pods"), None);
        assert_eq!(key(Method::POST, "/version"), None);
    }

    #[test]
    fn a_refused_write_is_reported_until_it_succeeds_again() {
        let f = Forbidden::default();
        let jobs = ("patch".to_string(), "batch/jobs".to_string());
        let events = ("create".to_string(), "events".to_string());
        f.answered(&jobs, 200);
        assert!(f.now().is_empty());
        f.answered(&jobs, 403);
        f.answered(&jobs, 403);
        f.answered(&events, 404);
        let now = f.now();
        assert_eq!(now.len(), 1, "{now:?}");
        assert!(
            now[0].contains("patch batch/jobs") && now[0].contains("2 times"),
            "{now:?}"
        );
        f.answered(&jobs, 201);
        assert!(f.now().is_empty());
    }
}
