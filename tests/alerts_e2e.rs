//! Alert delivery end to end: real HTTP receivers on 127.0.0.1, URLs in
//! Secrets on the cluster (the sandbox, or RUNBOOK_TEST_KUBECONFIG), and
//! the dispatcher driven on a controlled clock.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/alertmanager.rs"]
mod alertmanager;
#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod operator;
#[path = "support/receiver.rs"]
mod receiver;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cluster::{Cluster, eventually};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use receiver::{Behaviour, Receiver};
use runbook_core::alert::{Alert, AlertSink, AlertSource, CompiledRoutes};
use runbook_core::clock::Clock;
use runbook_core::policy::{Bundle, Origin};
use runbook_operator::alert::deliver::{Delivery, DeliveryConfig};
use runbook_operator::alert::dispatch::Dispatcher;
use runbook_operator::telemetry::Metrics;
use serde_json::json;

/// Routes `team` to one webhook receiver, `hook`, with the given
/// grouping and timing lines.
fn hook_routes(hook: &Receiver, route: &str) -> String {
    format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {{name: team}}\nspec:\n  route:\n    receiver: hook\n{route}  receivers:\n    - name: hook\n      webhook: {{url: \"{}\"}}\n",
        hook.url("/hook")
    )
}

/// A dispatcher delivering for real, its notification log kept in the
/// test's namespace as the operator keeps it.
fn logged_dispatcher(client: &kube::Client, ns: &str, metrics: &Arc<Metrics>) -> Arc<Dispatcher> {
    let delivery = Delivery::new(Some(client.clone()), metrics.clone(), "test", fast());
    let log = runbook_operator::alert::nflog::ConfigMapLog::new(client.clone(), ns);
    Arc::new(Dispatcher::new(Arc::new(delivery), Clock::real()).with_store(Arc::new(log)))
}

/// Everything every test logs, at debug level, to look for leaks.
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        let writer = move || Capture(b.clone());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_writer(writer)
            .with_ansi(false)
            .try_init();
        buf
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).to_string()
}

fn routes(c: &Cluster, yaml: &str) -> Arc<CompiledRoutes> {
    let bundle = Bundle::new(
        Origin::ConfigMap {
            namespace: c.ns.clone(),
            name: "routes".into(),
        },
        [("routes.yaml".to_string(), yaml.to_string())].into(),
    );
    let engine = runbook_core::script::ScriptEngine::default();
    let mut loaded = runbook_core::policy::load_bundle(&engine, &bundle, None);
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    Arc::new(loaded.routes.remove(0))
}

async fn secret(c: &Cluster, name: &str, data: &[(&str, &str)]) {
    let api: Api<Secret> = Api::namespaced(c.client.clone(), &c.ns);
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name},
        "stringData": data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
    }))
    .unwrap();
    api.create(&PostParams::default(), &s).await.unwrap();
}

struct World {
    c: Cluster,
    clock: Clock,
    metrics: Arc<Metrics>,
    d: Dispatcher,
    routes: Arc<CompiledRoutes>,
}

impl World {
    async fn new(test: &str, yaml: impl Fn(&Cluster) -> String, config: DeliveryConfig) -> Self {
        logs();
        let c = Cluster::new(test).await;
        let clock = Clock::manual("2026-11-29T10:00:00Z".parse().unwrap());
        let metrics = Arc::new(Metrics::new());
        let delivery = Delivery::new(Some(c.client.clone()), metrics.clone(), "test", config);
        let d = Dispatcher::new(Arc::new(delivery), clock.clone());
        let routes = routes(&c, &yaml(&c));
        Self {
            c,
            clock,
            metrics,
            d,
            routes,
        }
    }

    fn source(&self, name: &str) -> AlertSource {
        AlertSource {
            policy: "evaluator-drift".into(),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: self.c.ns.clone(),
            name: name.into(),
            uid: String::new(),
        }
    }

    fn raise(&self, name: &str, alerts: &[&[(&str, &str)]]) {
        let list = alerts
            .iter()
            .map(|pairs| {
                let mut labels: BTreeMap<String, String> = pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                labels.insert("namespace".into(), self.c.ns.clone());
                labels.insert("name".into(), name.into());
                Alert {
                    labels,
                    annotations: [
                        ("summary".to_string(), format!("{name} needs attention")),
                        ("description".to_string(), "score 0.70 < 0.85".to_string()),
                    ]
                    .into(),
                    starts_at: self.clock.now(),
                }
            })
            .collect();
        self.d.report(&self.source(name), Some(&self.routes), list);
    }

    /// Move the clock `secs` forward and flush what is due.
    fn after(&self, secs: u64) -> usize {
        self.clock.advance(Duration::from_secs(secs));
        self.d.tick()
    }

    fn count(&self, receiver: &str, result: &str) -> u64 {
        self.metrics
            .alerts
            .get_or_create(&Metrics::labels(&[
                ("receiver", receiver),
                ("result", result),
            ]))
            .get()
    }

    async fn done(self) {
        self.c.cleanup().await;
    }
}

fn fast() -> DeliveryConfig {
    DeliveryConfig {
        max_attempts: 3,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receivers_get_alertmanager_payloads_grouped_on_the_clock() {
    let hook = Receiver::start(Behaviour::Accept);
    let slack = Receiver::start(Behaviour::Accept);
    let w = World::new(
        "alerts-payloads",
        |_| {
            r##"
apiVersion: runbook.dev/v1alpha1
kind: AlertRoutes
metadata: {name: team}
spec:
  route:
    receiver: quiet
    groupBy: [alertname, namespace]
    groupWait: 30s
    groupInterval: 5m
    repeatInterval: 1h
    routes:
      - matchers: ['team = "ml"', 'severity = "critical"']
        receiver: ml
  receivers:
    - name: quiet
    - name: ml
      webhook: {url: {secretKeyRef: {name: hooks, key: ml}}}
      slack: {url: {secretKeyRef: {name: hooks, key: slack}}, channel: "#ml"}
"##
            .to_string()
        },
        fast(),
    )
    .await;
    secret(
        &w.c,
        "hooks",
        &[
            ("ml", &hook.url("/hook/ml-token-5f1e")),
            ("slack", &slack.url("/services/T0/B0/slack-token-77aa")),
        ],
    )
    .await;
    w.raise(
        "chatbot",
        &[&[
            ("alertname", "EvaluatorRolledBack"),
            ("severity", "critical"),
            ("team", "ml"),
        ]],
    );
    w.raise(
        "search",
        &[&[
            ("alertname", "EvaluatorRolledBack"),
            ("severity", "critical"),
            ("team", "ml"),
        ]],
    );
    w.raise(
        "other",
        &[&[
            ("alertname", "EvaluatorDegraded"),
            ("severity", "warning"),
            ("team", "ml"),
        ]],
    );
    assert_eq!(w.after(29), 0, "held for groupWait");
    assert_eq!(
        w.after(1),
        3,
        "the ml group to its webhook and Slack, the quiet root group"
    );
    eventually("the webhook and Slack receivers are called", 30, || async {
        hook.count() == 1 && slack.count() == 1
    })
    .await;
    let body = &hook.requests()[0].body;
    assert_eq!(hook.requests()[0].path, "/hook/ml-token-5f1e");
    assert_eq!(body["version"], "4");
    assert_eq!(body["status"], "firing");
    assert_eq!(body["receiver"], "ml");
    assert_eq!(
        body["groupLabels"],
        json!({"alertname": "EvaluatorRolledBack", "namespace": w.c.ns})
    );
    assert_eq!(body["commonLabels"]["severity"], "critical");
    let names: Vec<&str> = body["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["labels"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "both objects in one notification");
    assert!(names.contains(&"chatbot") && names.contains(&"search"));
    let text = slack.requests()[0].body["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.starts_with("[FIRING:2] EvaluatorRolledBack"), "{text}");
    assert!(
        text.contains("chatbot needs attention [critical]"),
        "{text}"
    );
    assert_eq!(slack.requests()[0].body["channel"], "#ml");

    // Nothing new: no notification at the next interval.
    assert_eq!(w.after(300), 0);
    // One object recovers: the webhook hears it resolved; Slack (no
    // sendResolved) hears nothing, the other alert still firing is not news.
    w.raise("search", &[]);
    assert_eq!(w.after(300), 1);
    eventually("the resolved notification", 30, || async {
        hook.count() == 2
    })
    .await;
    let body = &hook.requests()[1].body;
    assert_eq!(body["status"], "firing", "one alert still fires");
    let resolved: Vec<&serde_json::Value> = body["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["status"] == "resolved")
        .collect();
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0]["labels"]["name"], "search");
    assert_ne!(resolved[0]["endsAt"], "0001-01-01T00:00:00Z");
    // The repeat interval re-sends what still fires: both groups, to both
    // integrations of ml.
    assert_eq!(w.after(300), 0);
    assert_eq!(w.after(3600), 3);
    eventually("the repeat", 30, || async {
        hook.count() == 3 && slack.count() == 2
    })
    .await;
    eventually("five deliveries to ml count as sent", 30, || async {
        w.count("ml", "sent") == 5
    })
    .await;
    w.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_deliveries_are_retried_with_backoff_and_given_up() {
    let flaky = Receiver::start(Behaviour::FailFirst(2));
    let broken = Receiver::start(Behaviour::Fail);
    let w = World::new(
        "alerts-retries",
        |_| {
            r#"
apiVersion: runbook.dev/v1alpha1
kind: AlertRoutes
metadata: {name: team}
spec:
  route:
    receiver: flaky
    groupWait: 1s
    routes:
      - matchers: ['team = "data"']
        receiver: broken
  receivers:
    - name: flaky
      webhook: {url: {secretKeyRef: {name: hooks, key: flaky}}}
    - name: broken
      webhook: {url: {secretKeyRef: {name: hooks, key: broken}}}
"#
            .to_string()
        },
        fast(),
    )
    .await;
    secret(
        &w.c,
        "hooks",
        &[
            ("flaky", &flaky.url("/flaky-token-0a1b")),
            ("broken", &broken.url("/broken-token-9c8d")),
        ],
    )
    .await;
    w.raise("a", &[&[("alertname", "X")]]);
    w.raise("b", &[&[("alertname", "Y"), ("team", "data")]]);
    assert_eq!(w.after(1), 2);
    eventually(
        "the flaky receiver accepts on the third try",
        30,
        || async { w.count("flaky", "sent") == 1 },
    )
    .await;
    assert_eq!(flaky.count(), 3);
    assert_eq!(w.count("flaky", "retried"), 2);
    eventually("the broken receiver is given up on", 30, || async {
        w.count("broken", "failed") == 1
    })
    .await;
    assert_eq!(broken.count(), 3, "max_attempts 3");
    assert_eq!(w.count("broken", "retried"), 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(broken.count(), 3, "and no more after giving up");
    assert!(
        log_text().contains("alert notification failed: the receiver answered 500"),
        "the give-up is logged"
    );
    w.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_receiver_delays_nothing_else_and_its_queue_is_bounded() {
    let hang = Receiver::start(Behaviour::Hang);
    let ok = Receiver::start(Behaviour::Accept);
    let w = World::new(
        "alerts-hang",
        |_| {
            r#"
apiVersion: runbook.dev/v1alpha1
kind: AlertRoutes
metadata: {name: team}
spec:
  route:
    receiver: ok
    groupBy: [alertname]
    groupWait: 1s
    routes:
      - matchers: ['severity = "critical"']
        receiver: stuck
        continue: true
      - matchers: ['severity = "critical"']
        receiver: ok
  receivers:
    - name: ok
      webhook: {url: {secretKeyRef: {name: hooks, key: ok}}}
    - name: stuck
      webhook: {url: {secretKeyRef: {name: hooks, key: hang}}, timeout: 1h}
"#
            .to_string()
        },
        DeliveryConfig {
            queue_capacity: 1,
            ..fast()
        },
    )
    .await;
    secret(
        &w.c,
        "hooks",
        &[("ok", &ok.url("/ok")), ("hang", &hang.url("/hang-token"))],
    )
    .await;
    // Three groups reach both receivers, one after the other. The stuck
    // receiver holds the first; the second waits in its queue of one; the
    // third is dropped. The healthy receiver gets each at once.
    for (i, name) in ["A", "B", "C"].into_iter().enumerate() {
        w.raise(
            &name.to_lowercase(),
            &[&[("alertname", name), ("severity", "critical")]],
        );
        assert_eq!(w.after(1), 2);
        eventually("the healthy receiver gets it", 30, || async {
            ok.count() == i + 1
        })
        .await;
        eventually("the stuck receiver holds the first", 30, || async {
            hang.count() == 1
        })
        .await;
    }
    assert_eq!(
        w.count("stuck", "sent"),
        0,
        "the stuck request is still open"
    );
    assert_eq!(w.count("stuck", "dropped"), 1);
    assert_eq!(
        w.metrics
            .alert_queue
            .get_or_create(&Metrics::labels(&[("receiver", "stuck")]))
            .get(),
        1,
        "one notification waits"
    );
    eventually(
        "the healthy receiver's deliveries count as sent",
        30,
        || async { w.count("ok", "sent") == 3 },
    )
    .await;
    w.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_reread_when_rotated_and_never_leak() {
    let first = Receiver::start(Behaviour::Accept);
    let second = Receiver::start(Behaviour::Accept);
    let failing = Receiver::start(Behaviour::Fail);
    let w = World::new(
        "alerts-secrets",
        |_| {
            r#"
apiVersion: runbook.dev/v1alpha1
kind: AlertRoutes
metadata: {name: team}
spec:
  route:
    receiver: main
    groupBy: [alertname]
    groupWait: 1s
    groupInterval: 1m
    routes:
      - matchers: ['alertname = "Refused"']
        receiver: refused
      - matchers: ['alertname = "Failing"']
        receiver: failing
      - matchers: ['alertname = "Missing"']
        receiver: missing
  receivers:
    - name: main
      webhook: {url: {secretKeyRef: {name: hooks, key: main}}}
    - name: refused
      slack: {url: {secretKeyRef: {name: hooks, key: refused}}, timeout: 2s}
    - name: failing
      webhook: {url: {secretKeyRef: {name: hooks, key: failing}}}
    - name: missing
      webhook: {url: {secretKeyRef: {name: not-there, key: url}}}
"#
            .to_string()
        },
        fast(),
    )
    .await;
    // A port nothing listens on: connection refused.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let tokens = [
        "first-token-31d4",
        "second-token-8e2f",
        "refused-token-c0de",
        "failing-token-b3e7",
    ];
    secret(
        &w.c,
        "hooks",
        &[
            ("main", &first.url(&format!("/x/{}", tokens[0]))),
            (
                "refused",
                &format!("http://127.0.0.1:{closed}/x/{}", tokens[2]),
            ),
            ("failing", &failing.url(&format!("/x/{}", tokens[3]))),
        ],
    )
    .await;
    w.raise("a", &[&[("alertname", "Drift"), ("severity", "critical")]]);
    w.raise("b", &[&[("alertname", "Refused")]]);
    w.raise("c", &[&[("alertname", "Failing")]]);
    w.raise("d", &[&[("alertname", "Missing")]]);
    assert_eq!(w.after(1), 4);
    eventually("the first URL is used", 30, || async { first.count() == 1 }).await;
    eventually("every delivery has ended", 30, || async {
        w.count("refused", "failed") == 1
            && w.count("failing", "failed") == 1
            && w.count("missing", "error") == 1
    })
    .await;
    assert!(
        log_text().contains(&format!("Secret {}/not-there does not exist", w.c.ns)),
        "a missing Secret is a log line naming it"
    );

    // Rotate the Secret: the next notification goes to the new URL.
    let api: Api<Secret> = Api::namespaced(w.c.client.clone(), &w.c.ns);
    api.patch(
        "hooks",
        &PatchParams::default(),
        &Patch::Merge(json!({"stringData": {"main": second.url(&format!("/x/{}", tokens[1]))}})),
    )
    .await
    .unwrap();
    w.raise("e", &[&[("alertname", "Drift"), ("severity", "critical")]]);
    assert_eq!(w.after(60), 1);
    eventually("the rotated URL is used", 30, || async {
        second.count() == 1
    })
    .await;
    assert_eq!(first.count(), 1);
    assert!(second.requests()[0].path.ends_with(tokens[1]));

    // No token anywhere: logs (at debug), metrics, Events.
    let logs = log_text();
    let metrics = w.metrics.render();
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(w.c.client.clone(), &w.c.ns);
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|e| format!("{:?}", e))
        .collect();
    for t in tokens {
        assert!(!logs.contains(t), "{t} leaked into the logs");
        assert!(!metrics.contains(t), "{t} leaked into the metrics");
        assert!(
            notes.iter().all(|n| !n.contains(t)),
            "{t} leaked into an Event"
        );
    }
    w.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_receiver_records_on_the_object_that_raised_the_alert() {
    let w = World::new(
        "alerts-events",
        |_| {
            r#"
apiVersion: runbook.dev/v1alpha1
kind: AlertRoutes
metadata: {name: team}
spec:
  route:
    receiver: events
    groupWait: 1s
    groupInterval: 1m
  receivers:
    - name: events
      event: {reason: RunbookAlert}
"#
            .to_string()
        },
        fast(),
    )
    .await;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(w.c.client.clone(), &w.c.ns);
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "chatbot"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    w.raise(
        "chatbot",
        &[&[
            ("alertname", "EvaluatorRolledBack"),
            ("severity", "critical"),
        ]],
    );
    assert_eq!(w.after(1), 1);
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(w.c.client.clone(), &w.c.ns);
    let find = |reason: &'static str| {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("chatbot")
                })
        }
    };
    eventually("a Warning Event on the object", 30, || async {
        find("RunbookAlert").await.is_some()
    })
    .await;
    let e = find("RunbookAlert").await.unwrap();
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(
        e.note.as_deref(),
        Some("EvaluatorRolledBack [critical]: chatbot needs attention")
    );
    w.raise("chatbot", &[]);
    assert_eq!(w.after(60), 1);
    eventually("a Normal Event when it resolves", 30, || async {
        find("RunbookAlertResolved")
            .await
            .is_some_and(|e| e.type_.as_deref() == Some("Normal"))
    })
    .await;
    w.done().await;
}

const ALERTING_POLICY: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: Policy
metadata: {name: widget-size}
spec:
  target: {apiVersion: GROUP/v1, kind: Widget}
  script: size.rhai
  alerts: team
"#;

const ALERTING_SCRIPT: &str = r#"
fn reconcile(ctx) {
    let w = ctx.resource;
    let actions = [status(#{ size: w.spec.size })];
    if w.spec.size > 10 {
        actions.push(alert(#{
            labels: #{ alertname: "WidgetTooBig", team: "ml" },
            annotations: #{ summary: `${w.metadata.name} is too big` },
        }));
    }
    actions
}
"#;

/// The alerting widget policy, its alerts routed by `routes`.
fn alerting_policies(c: &Cluster, routes: &str) -> runbook_core::policy::PolicySet {
    operator::policies(
        c,
        &[
            ("size.yaml", ALERTING_POLICY),
            ("size.rhai", ALERTING_SCRIPT),
            ("routes.yaml", routes),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_fires_and_resolves_alerts_as_objects_change() {
    logs();
    let hook = Receiver::start(Behaviour::Accept);
    let c = Cluster::new("alerts-operator").await;
    operator::install_widget_crd(&c).await;
    let routes = hook_routes(
        &hook,
        "    groupBy: ['...']\n    groupWait: 50ms\n    groupInterval: 100ms\n",
    );
    let set = alerting_policies(&c, &routes);
    let metrics = Arc::new(Metrics::new());
    let delivery = Delivery::new(Some(c.client.clone()), metrics.clone(), "test", fast());
    let dispatcher = Arc::new(Dispatcher::new(Arc::new(delivery), Clock::real()));
    let _flusher = dispatcher.spawn();
    let op = operator::operator_with_sink(
        &c,
        set,
        runbook_operator::runtime::OperatorConfig::default(),
        metrics,
        dispatcher,
    );
    op.start().await.unwrap();
    let widgets: Api<kube::core::DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &operator::widget_resource(&c));
    let alerts_of = |name: &'static str, status: &'static str| {
        let hook = &hook;
        move || {
            let found = hook.requests().iter().any(|r| {
                r.body["alerts"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|a| a["labels"]["name"] == name && a["status"] == status)
                })
            });
            async move { found }
        }
    };
    operator::create_widget(&c, &widgets, "big", json!({"size": 20})).await;
    eventually("the alert fires", 30, alerts_of("big", "firing")).await;
    let fired = hook.requests()[0].body["alerts"][0]["labels"].clone();
    assert_eq!(fired["policy"], "widget-size");
    assert_eq!(fired["kind"], "Widget");
    assert_eq!(fired["namespace"], json!(c.ns));
    assert_eq!(fired["severity"], "warning", "the default severity");
    assert_eq!(fired["team"], "ml");
    assert_eq!(
        hook.requests()[0].body["alerts"][0]["annotations"]["summary"],
        "big is too big"
    );

    // The condition clears: the next reconcile no longer raises it.
    widgets
        .patch(
            "big",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 1}})),
        )
        .await
        .unwrap();
    eventually("the alert resolves", 30, alerts_of("big", "resolved")).await;

    // An object deleted while its alert fires: the sweep resolves it.
    operator::create_widget(&c, &widgets, "gone", json!({"size": 50})).await;
    eventually("the second alert fires", 30, alerts_of("gone", "firing")).await;
    widgets.delete("gone", &Default::default()).await.unwrap();
    eventually("the deleted object's alert resolves", 30, || {
        op.ctx.sweep_alerts();
        alerts_of("gone", "resolved")()
    })
    .await;
    op.shutdown(Duration::from_secs(5)).await;
    operator::remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// One firing alert, one notification, whatever happens to the operator in
/// between: the notification log survives a restart (and so a failover),
/// and the resolution still goes out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_is_not_sent_again_after_a_restart() {
    logs();
    let hook = Receiver::start(Behaviour::Accept);
    let c = Cluster::new("alerts-restart").await;
    operator::install_widget_crd(&c).await;
    // A repeat interval far longer than the test: a second notification of
    // the firing alert can only come from forgetting the first.
    let routes = hook_routes(
        &hook,
        "    groupBy: ['...']\n    groupWait: 50ms\n    groupInterval: 100ms\n    repeatInterval: 4h\n",
    );
    let start = || async {
        let set = alerting_policies(&c, &routes);
        let metrics = Arc::new(Metrics::new());
        let dispatcher = logged_dispatcher(&c.client, &c.ns, &metrics);
        let flusher = dispatcher.spawn();
        let op = operator::operator_with_sink(
            &c,
            set,
            runbook_operator::runtime::OperatorConfig::default(),
            metrics,
            dispatcher,
        );
        op.start().await.unwrap();
        (op, flusher)
    };
    let notified = |status: &'static str| {
        hook.requests()
            .iter()
            .filter(|r| {
                r.body["alerts"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|a| a["status"] == status))
            })
            .count()
    };
    let (op, flusher) = start().await;
    let widgets: Api<kube::core::DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &operator::widget_resource(&c));
    operator::create_widget(&c, &widgets, "big", json!({"size": 20})).await;
    eventually("the alert fires", 30, || async { notified("firing") == 1 }).await;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    eventually("the notification log written", 30, || async {
        cms.get_opt(runbook_operator::alert::nflog::CONFIGMAP)
            .await
            .unwrap()
            .is_some()
    })
    .await;
    // The operator goes away and a new one starts; the alert still fires.
    op.shutdown(Duration::from_secs(5)).await;
    flusher.abort();
    let (op, _flusher) = start().await;
    operator::settle(&op).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(notified("firing"), 1, "the firing alert was not sent again");
    // It clears: the resolution goes out, once.
    widgets
        .patch(
            "big",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 1}})),
        )
        .await
        .unwrap();
    eventually("the alert resolves", 30, || async {
        notified("resolved") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((notified("firing"), notified("resolved")), (1, 1));
    op.shutdown(Duration::from_secs(5)).await;
    operator::remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// Replicas sharing the targets (`--shards`) notify a group once, with
/// the alerts of every replica's targets in it, whichever replica holds
/// them; the replica that notifies going away neither notifies again what
/// was sent nor loses what is still firing, and the resolution goes out
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_notify_a_group_once() {
    use runbook_operator::alert::shared::{Ring, SharedAlerts};
    logs();
    let hook = Receiver::start(Behaviour::Accept);
    let c = Cluster::new("alerts-shards").await;
    operator::install_widget_crd(&c).await;
    // One group for every widget; a wait long enough to hear from both
    // replicas, a repeat far longer than the test.
    let routes = hook_routes(
        &hook,
        "    groupBy: [alertname]\n    groupWait: 3s\n    groupInterval: 1s\n    repeatInterval: 4h\n",
    );
    let replica = |id: &str| {
        let set = alerting_policies(&c, &routes);
        let metrics = Arc::new(Metrics::new());
        let ring = Ring {
            namespace: c.ns.clone(),
            name: "runbook-ring".into(),
            identity: id.into(),
            duration: Duration::from_secs(2),
        };
        let (client, m) = (c.client.clone(), metrics.clone());
        let ns = c.ns.clone();
        let sink = SharedAlerts::new(c.client.clone(), &ring, move || {
            logged_dispatcher(&client, &ns, &m)
        });
        let op = operator::operator_with_sink(
            &c,
            set,
            operator::sharded(&c, id),
            metrics,
            Arc::new(sink),
        );
        let started = op.clone();
        // As `runbook run` does: start, then follow the Lease and the ring.
        tokio::spawn(async move {
            started.start().await.unwrap();
            started.follow_leadership().await
        });
        op
    };
    // Each notification: (firing names, resolved names).
    let notified = || -> Vec<(Vec<String>, Vec<String>)> {
        hook.requests()
            .iter()
            .map(|r| {
                let names = |status: &str| {
                    let mut v: Vec<String> = r.body["alerts"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|a| a["status"] == status)
                        .map(|a| a["labels"]["name"].as_str().unwrap_or("").to_string())
                        .collect();
                    v.sort();
                    v
                };
                (names("firing"), names("resolved"))
            })
            .collect()
    };
    let a = replica("a");
    let b = replica("b");
    let widgets: Api<kube::core::DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &operator::widget_resource(&c));
    // Three for each replica: the ring places by namespace and name, and
    // the test's namespace is new each run.
    let ring = runbook_core::shard::Ring::new(["a", "b"]);
    let group = operator::widget_resource(&c).group;
    let mut names: Vec<String> = Vec::new();
    for want in ["a", "b"] {
        names.extend(
            (0..)
                .map(|i| format!("big{i}"))
                .filter(|n| {
                    ring.owner(&runbook_core::shard::key(&group, "Widget", &c.ns, n)) == Some(want)
                })
                .take(3),
        );
    }
    names.sort();
    for n in &names {
        operator::create_widget(&c, &widgets, n, json!({"size": 20})).await;
    }
    // Both replicas hold some of them.
    eventually("the widgets placed on both replicas", 60, || async {
        let mut on = std::collections::BTreeSet::new();
        for w in widgets.list(&ListParams::default()).await.unwrap() {
            if let Some(s) = w
                .metadata
                .labels
                .unwrap_or_default()
                .get(runbook_core::shard::SHARD_LABEL)
            {
                on.insert(s.clone());
            }
        }
        on.len() == 2
    })
    .await;
    eventually("the group notified", 60, || async {
        !notified().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        notified(),
        vec![(names.clone(), vec![])],
        "one notification, with every replica's alerts"
    );
    // The replica that notifies goes away; the other takes its targets
    // and notifies from now on, without telling again what was told.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.client.clone(), &c.ns);
    let holder = leases
        .get("runbook-ring")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap();
    let (gone, stays) = if holder == "a" { (a, b) } else { (b, a) };
    gone.shutdown(Duration::from_secs(5)).await;
    let stays_id = if holder == "a" { "b" } else { "a" };
    eventually("every widget on the replica that stays", 60, || async {
        widgets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|w| {
                w.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(runbook_core::shard::SHARD_LABEL))
                    == Some(&stays_id.to_string())
            })
    })
    .await;
    // Past the gone replica's lease duration and a group interval.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        notified().len(),
        1,
        "nothing notified again: {:?}",
        notified()
    );
    for n in &names {
        widgets
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"size": 1}})),
            )
            .await
            .unwrap();
    }
    eventually("the resolution notified", 60, || async {
        notified().iter().map(|(_, r)| r.len()).sum::<usize>() == names.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let told = notified();
    let firing: usize = told.iter().map(|(f, _)| f.len()).sum();
    let resolved: usize = told.iter().map(|(_, r)| r.len()).sum();
    assert_eq!((firing, resolved), (names.len(), names.len()), "{told:?}");
    stays.shutdown(Duration::from_secs(5)).await;
    operator::remove_widget_crd(&c).await;
    c.cleanup().await;
}

/// The operator's alerts in a team's own Alertmanager (two of them, an HA
/// pair): firing with their labels, source link and times, pushed again
/// while they fire so Alertmanager does not expire them, resolved when the
/// object no longer raises them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_reach_a_real_alertmanager_pair_and_resolve_there() {
    let pair = (
        alertmanager::Alertmanager::start(),
        alertmanager::Alertmanager::start(),
    );
    let (a, b) = match pair {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("skipped: no Alertmanager to run: {e}");
            return;
        }
    };
    let c = Cluster::new("alerts-am").await;
    operator::install_widget_crd(&c).await;
    let routes = format!(
        "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {{name: team}}\nspec:\n  route:\n    receiver: am\n    groupBy: ['...']\n    groupWait: 0s\n    groupInterval: 200ms\n  receivers:\n    - name: am\n      alertmanager:\n        urls: [\"{}\", \"{}\"]\n        resendInterval: 2s\n",
        a.url(),
        b.url()
    );
    let set = alerting_policies(&c, &routes);
    let metrics = Arc::new(Metrics::new());
    let delivery = Delivery::new(Some(c.client.clone()), metrics.clone(), "test", fast());
    let dispatcher = Arc::new(Dispatcher::new(Arc::new(delivery), Clock::real()));
    let _flusher = dispatcher.spawn();
    let config = runbook_operator::runtime::OperatorConfig::default();
    let op = operator::operator_with_sink(&c, set, config, metrics, dispatcher);
    op.start().await.unwrap();
    let widgets: Api<kube::core::DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.ns, &operator::widget_resource(&c));
    operator::create_widget(&c, &widgets, "big", json!({"size": 20})).await;
    let ours = [("alertname", "WidgetTooBig"), ("name", "big")];
    for am in [&a, &b] {
        eventually("the alert is active in Alertmanager", 30, || async {
            am.alert(&ours)
                .is_some_and(|x| x["status"]["state"] == "active")
        })
        .await;
    }
    let held = a.alert(&ours).unwrap();
    assert_eq!(held["labels"]["policy"], "widget-size");
    assert_eq!(held["labels"]["kind"], "Widget");
    assert_eq!(held["labels"]["namespace"], json!(c.ns));
    assert_eq!(held["labels"]["team"], "ml");
    assert_eq!(held["labels"]["severity"], "warning");
    assert_eq!(held["annotations"]["summary"], "big is too big");
    assert_eq!(
        held["generatorURL"],
        json!(format!("runbook://explain/Widget/big?namespace={}", c.ns))
    );
    // Pushed again while it fires: Alertmanager's copy keeps being updated.
    let updated = |x: &serde_json::Value| x["updatedAt"].as_str().unwrap_or("").to_string();
    let first = updated(&held);
    eventually("the alert is pushed again", 20, || async {
        a.alert(&ours).is_some_and(|x| updated(&x) != first)
    })
    .await;

    // The condition clears: resolved in both, well before Alertmanager
    // would have let it expire by itself (its endsAt, 8 s after a push).
    let expires = a.alert(&ours).unwrap()["endsAt"]
        .as_str()
        .unwrap()
        .to_string();
    widgets
        .patch(
            "big",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 1}})),
        )
        .await
        .unwrap();
    for am in [&a, &b] {
        eventually("the alert resolves in Alertmanager", 30, || async {
            am.alert(&ours).is_none()
        })
        .await;
    }
    let gone_at = jiff::Timestamp::now();
    let expires: jiff::Timestamp = expires.parse().unwrap();
    assert!(
        gone_at < expires,
        "resolved by Runbook at {gone_at}, not expired at {expires}"
    );
    op.shutdown(Duration::from_secs(5)).await;
    operator::remove_widget_crd(&c).await;
    c.cleanup().await;
}
