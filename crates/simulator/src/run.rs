//! Running a scenario: the real operator (controllers, executor, alert
//! dispatcher) against the in-process sandbox, on a paused tokio clock that
//! jumps from one timer to the next, so an hour of schedules, requeues and
//! backoffs passes in milliseconds and every run is the same.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::model::{Scenario, ScenarioError, WorldEvent};
use super::report::{self, Failure, Report};
use super::world::{Kinds, World};
use runbook_core::alert::notify::{self, Notification};
use runbook_core::alert::sink::ActiveAlerts;
use runbook_core::alert::{Alert, AlertSink, AlertSource, CompiledRoutes};
use runbook_core::clock::Clock;
use runbook_core::policy::Bundle;
use runbook_core::script::ScriptEngine;
use runbook_core::util::lock;
use runbook_operator::alert::dispatch::{Dispatcher, Outbox};
use runbook_operator::reload::{Reloaded, Reloader};
use runbook_operator::runtime::{Operator, OperatorConfig};
use runbook_operator::telemetry::Metrics;
use runbook_operator::telemetry::journal::{Entry, Journal, MemoryJournal};
use runbook_sandbox::{Sandbox, SandboxConfig};

/// Alerts as the journal sees them: when each starts and stops firing,
/// and the receivers its routes reach; then on to the dispatcher.
struct JournalSink {
    inner: Arc<Dispatcher>,
    journal: Arc<MemoryJournal>,
    clock: Clock,
    active: ActiveAlerts,
}

fn alert_entry(
    clock: &Clock,
    action: &str,
    s: &AlertSource,
    a: &Alert,
    receivers: &[String],
) -> Entry {
    let name = a.labels.get("alertname").cloned().unwrap_or_default();
    let severity = a.labels.get("severity").cloned().unwrap_or_default();
    let detail = if action == "alert" {
        format!("{name} severity={severity} -> {}", receivers.join(","))
    } else {
        name
    };
    Entry::new(clock.now(), action, "ok")
        .policy(&s.policy)
        .object(&s.api_version, &s.kind, &s.namespace, &s.name)
        .fields(json!({"labels": a.labels, "annotations": a.annotations, "receivers": receivers}))
        .detail(detail)
}

impl AlertSink for JournalSink {
    fn report(
        &self,
        source: &AlertSource,
        routes: Option<&Arc<CompiledRoutes>>,
        alerts: Vec<Alert>,
    ) {
        let (started, resolved) = self.active.update(source, &alerts);
        for a in &started {
            let receivers = routes
                .map(|r| r.receivers_for(&a.labels))
                .unwrap_or_default();
            self.journal
                .record(alert_entry(&self.clock, "alert", source, a, &receivers));
        }
        for a in &resolved {
            self.journal
                .record(alert_entry(&self.clock, "resolve", source, a, &[]));
        }
        self.inner.report(source, routes, alerts);
    }

    fn retain(&self, keep: &dyn Fn(&AlertSource) -> bool) {
        for s in self.active.gone(keep) {
            self.report(&s, None, Vec::new());
        }
    }
}

/// Notifications as the journal sees them (nothing is sent anywhere).
struct JournalOutbox {
    journal: Arc<MemoryJournal>,
    clock: Clock,
}

impl Outbox for JournalOutbox {
    fn send(&self, routes: &Arc<CompiledRoutes>, n: Notification) {
        let integration = routes
            .receivers
            .get(&n.receiver)
            .and_then(|r| r.kinds.get(n.integration))
            .map(|k| k.kind_name())
            .unwrap_or("none");
        self.journal.record(
            Entry::new(self.clock.now(), "notify", "ok")
                .fields(json!({
                    "receiver": n.receiver,
                    "integration": integration,
                    "status": n.status(),
                    "groupKey": n.group_key,
                    "alerts": n.alerts.len(),
                }))
                .detail(format!(
                    "{} ({integration}) {}",
                    n.receiver,
                    notify::title(&n)
                )),
        );
    }
}

/// Wall-clock seconds a scenario may run (`RUNBOOK_SCENARIO_TIMEOUT`), so
/// that one that cannot finish fails instead of hanging the command.
/// The wall-clock budget of a script call in a scenario.
const SCENARIO_WALL_TIME: std::time::Duration = std::time::Duration::from_secs(1);

fn wall_clock_limit() -> std::time::Duration {
    std::time::Duration::from_secs(
        std::env::var("RUNBOOK_SCENARIO_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(120),
    )
}

/// Run a scenario to its end and check it.
pub fn run(s: &Scenario) -> Report {
    run_within(s, wall_clock_limit())
}

/// [`run`], failing once `limit` of wall-clock time has passed.
pub fn run_within(s: &Scenario, limit: std::time::Duration) -> Report {
    let scenario = s.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::Builder::new()
        .name(format!("scenario {}", s.name))
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("a tokio runtime");
            let _ = tx.send(rt.block_on(run_async(&scenario)));
        });
    let outcome = match runner {
        Ok(_) => rx.recv_timeout(limit).ok(),
        Err(_) => None,
    };
    outcome.unwrap_or_else(|| {
        // The runner is left behind; the command reports and goes on.
        let mut r = Report::new(s);
        r.load_errors.push(ScenarioError {
            file: s.file.clone(),
            pos: None,
            message: format!(
                "the scenario did not finish within {}s of wall-clock time (RUNBOOK_SCENARIO_TIMEOUT, or replay's --timeout); something it waits for never happens, or it is too long for that: run with RUNBOOK_LOG=runbook=debug to see what the operator is waiting on",
                limit.as_secs()
            ),
        });
        r
    })
}

fn is_crd(o: &Value) -> bool {
    o["kind"] == "CustomResourceDefinition"
}

/// Kinds named by rules, world events, expectations and final checks
/// that the API does not serve: such an expectation could never match.
fn unknown_kinds(s: &Scenario, kinds: &Kinds) -> Vec<ScenarioError> {
    // Read only when a kind is unknown: most scenarios have none.
    let late = std::cell::OnceCell::new();
    let mut errors = Vec::new();
    let mut faults = Vec::new();
    let mut check = |api_version: Option<&str>, kind: &str, pos| {
        if kinds.find(api_version, kind).is_none() {
            let created = late.get_or_init(|| timeline_crds(s));
            let message = match created.iter().find(|(k, _, _)| k == kind) {
                Some((_, name, at)) => format!(
                    "unknown kind {kind:?}: its CustomResourceDefinition {name} is created in the timeline (line {}), \
                     after the scenario's kinds are set; list its file under spec.objects instead",
                    at.line
                ),
                None => match kinds.nearest(kind) {
                    Some(near) => format!(
                        "unknown kind {kind:?}: the sandbox serves no such kind (did you mean {near}?)"
                    ),
                    None => format!(
                        "unknown kind {kind:?}: the sandbox serves no such kind; add the \
                         CustomResourceDefinition that defines it to spec.objects"
                    ),
                },
            };
            errors.push(ScenarioError {
                file: s.file.clone(),
                pos: Some(pos),
                message,
            });
        }
    };
    for r in &s.rules {
        check(r.api_version.as_deref(), &r.kind, r.pos);
    }
    for step in &s.steps {
        for (w, pos) in &step.world {
            match w {
                WorldEvent::Update(u) => check(u.api_version.as_deref(), &u.kind, *pos),
                WorldEvent::Delete(d) => check(d.api_version.as_deref(), &d.kind, *pos),
                WorldEvent::SnapshotReady(_) => check(None, "VolumeSnapshot", *pos),
                WorldEvent::Fail(f) => faults.extend(unserved_resource(s, f, kinds, *pos)),
                _ => {}
            }
        }
        for (e, pos) in &step.expect {
            // A sweep's record is written as its made-up kind's.
            let sweep = |k: &str| {
                let v = e.api_version.as_deref();
                runbook_core::kinds::is_sweep(&runbook_core::kinds::KindRef::new(
                    v.unwrap_or("runbook.dev/v1alpha1"),
                    k,
                ))
            };
            if let Some(k) = e.kind.as_deref().filter(|k| !sweep(k)) {
                check(e.api_version.as_deref(), k, *pos);
            }
        }
    }
    for (f, pos) in &s.final_ {
        check(f.api_version.as_deref(), &f.kind, *pos);
    }
    errors.extend(faults);
    errors
}

/// A `fail` event whose resource the API does not serve would never
/// fire, and the scenario would pass without the failure it is about.
fn unserved_resource(
    s: &Scenario,
    f: &super::model::FailSpec,
    kinds: &Kinds,
    pos: runbook_core::util::yaml::Pos,
) -> Option<ScenarioError> {
    let r = f.resource.as_deref()?;
    let plural = r.split('/').next().unwrap_or(r);
    if kinds.serves_plural(plural) {
        return None;
    }
    let hint = kinds
        .plural_for(plural)
        .map(|p| format!(" (did you mean {p}?)"))
        .unwrap_or_default();
    Some(ScenarioError {
        file: s.file.clone(),
        pos: Some(pos),
        message: format!(
            "fail: no resource {r:?} is served{hint}; name it by its plural, as in the API's paths (jobs, configmaps, or plural/status)"
        ),
    })
}

/// CustomResourceDefinitions the timeline creates: the kind each
/// defines, its name, and where the step creating it is.
fn timeline_crds(s: &Scenario) -> Vec<(String, String, runbook_core::util::yaml::Pos)> {
    let mut out = Vec::new();
    for step in &s.steps {
        for (w, pos) in &step.world {
            let WorldEvent::Create(c) = w else { continue };
            // A file that cannot be read is a load error of its own.
            let objects = created_objects(c, s).unwrap_or_default();
            for o in objects.iter().filter(|o| is_crd(o)) {
                if let Some(kind) = o["spec"]["names"]["kind"].as_str() {
                    let name = o["metadata"]["name"].as_str().unwrap_or(kind);
                    out.push((kind.to_string(), name.to_string(), *pos));
                }
            }
        }
    }
    out
}

fn load_error(file: &str, message: String) -> ScenarioError {
    ScenarioError {
        file: file.to_string(),
        pos: None,
        message,
    }
}

/// The cluster a scenario starts with: Runbook's CRDs and the scenario's,
/// its namespace, its objects. What cannot be made is a load error.
async fn build_cluster(s: &Scenario, world: Arc<World>, report: &mut Report) -> Arc<World> {
    let runbook = runbook_core::crd::all().into_iter().map(|c| {
        (
            "runbook crds".to_string(),
            serde_json::to_value(c).unwrap_or_default(),
        )
    });
    let mut crds: Vec<(String, Value)> = runbook.collect();
    let mut others: Vec<(String, Value)> = Vec::new();
    for (file, docs) in &s.objects {
        for d in docs {
            let list = if is_crd(d) { &mut crds } else { &mut others };
            list.push((file.clone(), d.clone()));
        }
    }
    for (file, crd) in crds {
        if let Err(e) = world.create(crd).await {
            report.load_errors.push(load_error(&file, e));
        }
    }
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(world.client.clone());
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.namespace}});
    let exists = namespaces
        .get_opt(&s.namespace)
        .await
        .ok()
        .flatten()
        .is_some();
    let given = others
        .iter()
        .any(|(_, o)| o["kind"] == "Namespace" && o["metadata"]["name"] == s.namespace.as_str());
    if !exists
        && !given
        && let Err(e) = world.create(ns).await
    {
        report.load_errors.push(load_error(&s.file, e));
    }
    let world = world.with_kinds();
    report.load_errors.extend(unknown_kinds(s, &world.kinds));
    others.sort_by_key(|(_, o)| o["kind"] != "Namespace");
    for (file, o) in others {
        if let Err(e) = world.create(o).await {
            report.load_errors.push(load_error(&file, e));
        }
    }
    world
}

/// The scenario's policy bundles: the first (which `editPolicy` edits)
/// and the others.
fn bundles_of(s: &Scenario) -> Result<Vec<Bundle>, ScenarioError> {
    std::iter::once(&s.policies)
        .chain(&s.more_policies)
        .map(|dir| {
            Bundle::from_dir(dir).map_err(|e| load_error(&dir.display().to_string(), e.to_string()))
        })
        .collect()
}

/// The authorship webhook, answering the sandbox in-process (no network:
/// the scenario's clock must not run on while a review is in flight).
struct InProcess(runbook_operator::admission::Authorship);

impl runbook_sandbox::admission::Caller for InProcess {
    fn call(
        &self,
        _: &runbook_sandbox::admission::Webhook,
        review: Value,
    ) -> futures::future::BoxFuture<'static, Result<Value, String>> {
        let answer = self.0.review(&review);
        Box::pin(async move { Ok(answer) })
    }
}

/// Runbook's authorship webhook in the scenario's API server, for every
/// kind: what the world writes is recorded as written by its author.
async fn install_authorship(
    sandbox: &Sandbox,
    signer: &runbook_operator::admission::Signer,
) -> Result<(), String> {
    sandbox.admission().set_caller(Arc::new(InProcess(
        runbook_operator::admission::Authorship {
            signer: signer.clone(),
            placer: None,
        },
    )));
    let config: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "runbook"},
        "webhooks": [runbook_operator::admission::config::authorship_webhook(
            None,
            &runbook_operator::admission::config::Endpoint::Url("https://runbook.scenario".into()),
            None,
            &[runbook_operator::admission::config::rule("*", "*", "*")],
        )],
    }))
    .map_err(|e| e.to_string())?;
    let resource = kube::core::ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: "MutatingWebhookConfiguration".into(),
        plural: "mutatingwebhookconfigurations".into(),
    };
    kube::Api::<kube::core::DynamicObject>::all_with(sandbox.client(), &resource)
        .create(&Default::default(), &config)
        .await
        .map(|_| ())
        .map_err(|e| runbook_operator::util::api_error(&e))
}

/// The operator a scenario runs: the real one, its alerts and actions
/// written to the journal. It acts as the sandbox's own administrator, a
/// user apart from the world's.
fn operator_for(
    world: &World,
    signer: runbook_operator::admission::Signer,
    engine: Arc<ScriptEngine>,
    set: runbook_core::policy::PolicySet,
    metrics: Arc<Metrics>,
    journal: &Arc<MemoryJournal>,
    clock: &Clock,
) -> Arc<Operator> {
    let outbox = JournalOutbox {
        journal: journal.clone(),
        clock: clock.clone(),
    };
    let dispatcher = Arc::new(Dispatcher::new(Arc::new(outbox), clock.clone()));
    let _flusher = dispatcher.spawn();
    let sink = Arc::new(JournalSink {
        inner: dispatcher,
        journal: journal.clone(),
        clock: clock.clone(),
        active: ActiveAlerts::default(),
    });
    let config = OperatorConfig {
        namespace: None,
        concurrency: 4,
        identity: "runbook".into(),
        lease: None,
        backoff_base: Duration::from_secs(1),
        backoff_max: Duration::from_secs(300),
        signer: Some(signer),
        webhook: None,
        // Runbook's state of cluster-scoped targets: a scenario's world
        // has the default namespace.
        operator_namespace: "default".into(),
        // A scenario also checks that every reconcile the operator skips
        // as unchanged would decide the same.
        check_skips: true,
        // Its clock stands still while scripts run: a share of script
        // time per second of it would put decisions off by how fast the
        // machine is, and the timeline must not depend on that.
        fair: runbook_operator::runtime::fair::FairConfig::unlimited(),
        // The clock jumps from one thing to do to the next: watches kept
        // open a day are remade 7 times in a week, not 2,000.
        watch_timeout_secs: 86_400,
        ..OperatorConfig::default()
    };
    let op = Operator::new(
        world.sandbox.client(),
        engine,
        set,
        clock.clone(),
        sink,
        metrics,
        config,
    );
    op.ctx.set_journal(journal.clone());
    Arc::new(op)
}

/// Metric inputs answered from the world's series, at the simulated time
/// asked (the fire time of a scheduled run, or now).
struct WorldMetrics {
    series: Vec<crate::model::Series>,
    start: jiff::Timestamp,
}

impl runbook_operator::runtime::queries::MetricSource for WorldMetrics {
    fn answer<'a>(
        &'a self,
        q: runbook_operator::runtime::queries::Question<'a>,
    ) -> futures::future::BoxFuture<'a, runbook_core::metric::Reading> {
        use runbook_core::metric::{Reading, Reason};
        let at = q.time.unwrap_or(q.now);
        let ms = at * 1000 - self.start.as_millisecond();
        let reading = match self.series.iter().find(|s| s.answers(q.name, q.text)) {
            None => Reading::missing(
                Reason::NoData,
                format!(
                    "the scenario's world has no series for metric {:?} ({})",
                    q.name, q.text
                ),
            ),
            Some(s) => match s.at(ms) {
                None => Reading::missing(
                    Reason::NoData,
                    "no value at this time in the world's series",
                ),
                Some((set, value)) => Reading::Value {
                    value,
                    at: (self.start.as_millisecond() + set) / 1000,
                    samples: 1,
                },
            },
        };
        Box::pin(std::future::ready(reading))
    }

    fn needs_address(&self) -> bool {
        false
    }
}

/// The scenario's policies as the operator loads them, and the bundle
/// `editPolicy` edits; their errors are load errors.
async fn policies(
    s: &Scenario,
    reloader: &Reloader,
    report: &mut Report,
) -> Option<(Bundle, runbook_core::policy::PolicySet)> {
    let bundles = match bundles_of(s) {
        Ok(b) => b,
        Err(e) => {
            report.load_errors.push(e);
            return None;
        }
    };
    let bundle = bundles[0].clone();
    let (set, errors) = reloader.initial(bundles).await;
    if !errors.is_empty() {
        let errors = errors.into_iter().map(|e| load_error("", e));
        report.load_errors.extend(errors);
        return None;
    }
    Some((bundle, set))
}

/// The one time zone the policies' schedules name (their `timeZone`, or
/// a `CRON_TZ=` of a fixed expression); none when they name none or
/// several.
fn schedules_zone(set: &runbook_core::policy::PolicySet) -> Option<String> {
    use runbook_core::policy::compile::ScheduleSource;
    let mut zones = std::collections::BTreeSet::new();
    for p in set.policies.values() {
        for t in &p.schedules {
            let zone = match &t.source {
                ScheduleSource::Fixed(s) => s.zone().map(str::to_string),
                ScheduleSource::FromField {
                    default, parsed, ..
                } => parsed
                    .zone()
                    .map(str::to_string)
                    .or_else(|| default.as_ref().and_then(|d| d.zone().map(str::to_string))),
                ScheduleSource::Every { .. } => None,
            };
            zones.extend(zone);
        }
    }
    (zones.len() == 1)
        .then(|| zones.into_iter().next())
        .flatten()
}

/// A policy the operator set aside (a kind it declares is not served)
/// does nothing: harmless where the scenario is about another policy, the
/// first thing to say where an expectation then fails.
fn set_aside(
    op: &Operator,
    world: &World,
    declared: &[(String, String, Vec<runbook_core::kinds::KindRef>)],
    report: &mut Report,
) {
    let running = op.ctx.policies.load();
    for (name, file, kinds) in declared {
        if running.policies.contains_key(name) {
            continue;
        }
        let absent: Vec<String> = kinds
            .iter()
            .filter(|k| world.served(Some(&k.api_version), &k.kind).is_err())
            .map(|k| k.to_string())
            .collect();
        report.set_aside.push(format!(
            "policy {name} ({file}) was set aside: the sandbox does not serve {}; add the CustomResourceDefinition that defines it to the scenario's objects",
            absent.join(", ")
        ));
    }
}

/// What the operator itself found wrong over the run: a watch that could
/// not run (a kind at a URL the API does not serve, a refusal) makes every
/// expectation about its objects meaningless, so it fails the scenario,
/// named, rather than passing by silence; and a reconcile skipped as
/// unchanged that would have decided differently.
fn operator_failures(op: &Operator) -> Vec<Failure> {
    let watches = op.ctx.health.watches.failing_for(Duration::ZERO);
    let skips = lock(&op.ctx.skip_differences).drain(..).collect::<Vec<_>>();
    watches
        .into_iter()
        .chain(skips)
        .map(|message| Failure {
            pos: None,
            message,
            detail: Vec::new(),
        })
        .collect()
}

/// The scenario's API server on its clock, with the authorship webhook
/// installed (and the key it signs with).
async fn sandbox_for(
    s: &Scenario,
    clock: &Clock,
    report: &mut Report,
) -> Option<(Sandbox, runbook_operator::admission::Signer)> {
    let sandbox = Sandbox::new(SandboxConfig {
        clock: clock.clone(),
        bookmark_interval: Duration::from_secs(3600),
        ..Default::default()
    });
    // A key of the scenario's own, not a random one: the authorship record
    // is among a decision's inputs (its hash is in every decision record),
    // and two runs of one scenario must report alike. Nothing outside this
    // process writes to its API server, so nobody can forge with it.
    let signer = runbook_operator::admission::Signer::new(
        format!("runbook simulation: {}", s.name).into_bytes(),
    );
    if let Err(e) = install_authorship(&sandbox, &signer).await {
        report.load_errors.push(load_error(
            &s.file,
            format!("installing the authorship webhook: {e}"),
        ));
        return None;
    }
    Some((sandbox, signer))
}

async fn run_async(s: &Scenario) -> Report {
    let t0 = tokio::time::Instant::now();
    let clock = Clock::tokio(s.start);
    let journal = Arc::new(MemoryJournal::default());
    let mut report = Report::new(s);
    let Some((sandbox, signer)) = sandbox_for(s, &clock, &mut report).await else {
        return report;
    };
    let world = World::new(sandbox.clone(), &s.namespace, journal.clone());
    let world = build_cluster(s, world, &mut report).await;
    if !report.load_errors.is_empty() {
        return report;
    }
    // The policies, loaded the way the operator loads them.
    // A scenario's verdict must not depend on how busy the machine is:
    // its scripts get a wall-clock budget of a second, not the operator's
    // 20 ms (a runaway script is still stopped, by the operation count).
    let engine = Arc::new(ScriptEngine::new(runbook_core::script::ScriptLimits {
        wall_time: SCENARIO_WALL_TIME,
        ..Default::default()
    }));
    let metrics = Arc::new(Metrics::new());
    let reloader = Reloader::new(
        engine.clone(),
        Some(world.client.clone()),
        metrics.clone(),
        "runbook",
    )
    .compile_inline()
    .with_secret_namespace(&s.namespace)
    .with_dangerous_kinds(s.operator.allow_dangerous_kinds)
    .with_other_namespaces(s.operator.allow_other_namespaces);
    let Some((mut bundle, set)) = policies(s, &reloader, &mut report).await else {
        return report;
    };
    let declared: Vec<(String, String, Vec<runbook_core::kinds::KindRef>)> = set
        .policies
        .values()
        .map(|p| {
            (
                p.name.clone(),
                p.file.clone(),
                p.kinds.kinds().into_iter().cloned().collect(),
            )
        })
        .collect();
    let op = operator_for(&world, signer, engine, set, metrics, &journal, &clock);
    op.ctx.queries.set_source(Arc::new(WorldMetrics {
        series: s.metrics.clone(),
        start: s.start,
    }));
    let _world = world.spawn(s.rules.clone());
    if let Err(e) = op.start().await {
        report.load_errors.push(load_error(&s.file, e.to_string()));
        return report;
    }
    set_aside(&op, &world, &declared, &mut report);
    report.zone = schedules_zone(&op.ctx.policies.load());
    for step in &s.steps {
        tokio::time::sleep_until(t0 + Duration::from_millis(step.at_ms as u64)).await;
        for (ev, pos) in &step.world {
            if let Err(m) = apply(ev, &world, &op, &reloader, &mut bundle, s).await {
                report.failures.push(Failure {
                    pos: Some(*pos),
                    message: format!("{}: {m}", ev.name()),
                    detail: Vec::new(),
                });
            }
        }
    }
    tokio::time::sleep_until(t0 + Duration::from_millis(s.until_ms as u64)).await;
    for (f, pos) in &s.final_ {
        if let Some(failure) = report::check_final(f, *pos, &world).await {
            report.failures.push(failure);
        }
    }
    report.failures.extend(operator_failures(&op));
    op.shutdown(Duration::from_secs(1)).await;
    let entries = journal.entries();
    report.specs = target_specs(&world, &entries).await;
    report.finish(s, entries);
    report
}

/// The spec, at the end, of every object the operator wrote status to
/// (the HTML report draws its numbers as reference lines).
async fn target_specs(
    world: &World,
    entries: &[runbook_operator::telemetry::journal::Entry],
) -> std::collections::BTreeMap<String, Value> {
    let mut out = std::collections::BTreeMap::new();
    for e in entries.iter().filter(|e| e.action == "status") {
        let key = format!("{}|{}|{}|{}", e.api_version, e.kind, e.namespace, e.name);
        if out.contains_key(&key) {
            continue;
        }
        let Ok(served) = world.served(Some(&e.api_version), &e.kind) else {
            continue;
        };
        if let Ok(Some(o)) = world.api(&served, &e.namespace).get_opt(&e.name).await {
            out.insert(key, o.data["spec"].clone());
        }
    }
    out
}

/// Carry out one world event of the timeline.
async fn apply(
    ev: &WorldEvent,
    world: &Arc<World>,
    op: &Operator,
    reloader: &Reloader,
    bundle: &mut Bundle,
    s: &Scenario,
) -> Result<(), String> {
    match ev {
        WorldEvent::Create(c) => create(c, world, s).await?,
        WorldEvent::Update(u) => {
            let (av, ns) = (u.api_version.as_deref(), u.namespace.as_deref());
            world
                .update(av, &u.kind, ns, &u.name, &u.patch, u.status)
                .await?;
            world.note(format!("updated {} {}: {}", u.kind, u.name, u.patch), None);
        }
        WorldEvent::Delete(d) => {
            let (av, ns) = (d.api_version.as_deref(), d.namespace.as_deref());
            world.delete(av, &d.kind, ns, &d.name).await?;
            world.note(format!("deleted {} {}", d.kind, d.name), None);
        }
        WorldEvent::Complete(_) | WorldEvent::PodReady(_) | WorldEvent::SnapshotReady(_) => {
            world.on_objects(ev, None).await?;
        }
        WorldEvent::Fail(f) => fail_requests(f, world),
        WorldEvent::EditPolicy(e) => edit_policy(e, world, op, reloader, bundle).await?,
    }
    Ok(())
}

/// Create the objects of a file, or one given inline.
/// The objects a `create` event makes: its file's documents, or the one
/// object given inline.
fn created_objects(c: &super::model::CreateSpec, s: &Scenario) -> Result<Vec<Value>, String> {
    Ok(match (&c.file, &c.object) {
        (Some(f), _) => {
            let text = std::fs::read_to_string(s.dir.join(f)).map_err(|e| e.to_string())?;
            runbook_core::util::yaml::parse_documents(&text).map_err(|e| e.to_string())?
        }
        (None, Some(o)) => vec![o.clone()],
        _ => Vec::new(),
    })
}

async fn create(c: &super::model::CreateSpec, world: &World, s: &Scenario) -> Result<(), String> {
    for o in created_objects(c, s)? {
        let kind = o["kind"].as_str().unwrap_or("").to_string();
        let name = o["metadata"]["name"].as_str().unwrap_or("").to_string();
        world.create(o).await?;
        world.note(format!("created {kind} {name}"), None);
    }
    Ok(())
}

/// The API server fails the next requests.
fn fail_requests(f: &super::model::FailSpec, world: &World) {
    let verb = f
        .verb
        .as_deref()
        .and_then(runbook_sandbox::faults::ApiVerb::parse);
    let faults = world.sandbox.faults();
    faults.fail_next(f.count, verb, f.resource.as_deref(), f.code);
    world.note(
        format!(
            "the API fails the next {} {} {} with {}",
            f.count,
            f.verb.as_deref().unwrap_or("request(s)"),
            f.resource.as_deref().unwrap_or("of any resource"),
            f.code
        ),
        None,
    );
}

/// Edit a file of the policy bundle and reload it as the operator would.
async fn edit_policy(
    e: &super::model::EditPolicySpec,
    world: &World,
    op: &Operator,
    reloader: &Reloader,
    bundle: &mut Bundle,
) -> Result<(), String> {
    if e.delete {
        bundle.files.remove(&e.file);
    } else if let Some(c) = &e.content {
        bundle.files.insert(e.file.clone(), c.clone());
    } else if let Some(r) = &e.replace {
        let text = bundle
            .files
            .get(&e.file)
            .ok_or_else(|| format!("{} is not in the policy directory", e.file))?;
        if !text.contains(&r.from) {
            return Err(format!("{} does not contain {:?}", e.file, r.from));
        }
        let new = text.replacen(&r.from, &r.to, 1);
        bundle.files.insert(e.file.clone(), new);
    }
    let outcome = reloader
        .update(op, bundle.origin.clone(), Some(bundle.clone()))
        .await;
    let detail = match outcome {
        Reloaded::Swapped { version } => {
            format!("policy {} edited: version {version} in force", e.file)
        }
        Reloaded::Refused { errors } => format!(
            "policy {} edit refused, the last good version keeps serving: {}",
            e.file,
            errors.join("; ")
        ),
        Reloaded::Unchanged => format!("policy {} unchanged", e.file),
    };
    world.note(detail, None);
    Ok(())
}
