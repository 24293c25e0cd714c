//! The operator: a kube-runtime Controller per target kind, shared watch
//! caches for every other declared kind, the reconcile that runs each
//! policy's decision through the executor, per-object backoff, circuit
//! breakers, leader election and metrics.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::events::{EventWriter, Reporter};
use arc_swap::ArcSwap;
use futures::{FutureExt, Stream, StreamExt};
use jiff::Timestamp;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::leader::{Elector, LeaseConfig};
use crate::act::{self, Exec, Mode};
use crate::alert::AlertSink;
use crate::clock::Clock;
use crate::crd::DecisionRecord;
use crate::decide::{self, Observed};
use crate::kinds::KindRef;
use crate::observe::RawObject;
use crate::observe::cache::{Change, Informer, spawn_informer};
use crate::observe::discovery::{Resolved, Resources};
use crate::observe::health::{WatchBackoff, WatchHealth, report_watch};
use crate::observe::view::{Dependencies, Source, Sources, TargetKey, Tracking, target_ref};
use crate::policy::compile::CompiledPolicy;
use crate::policy::limits::Breaker;
use crate::policy::{self, PolicySet};
use crate::script::ScriptEngine;
use crate::telemetry::Metrics;
use crate::util::lock;

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Watch and reconcile only this namespace (None: every namespace).
    pub namespace: Option<String>,
    pub concurrency: u16,
    /// Names this instance in the Lease and in Events.
    pub identity: String,
    /// Leader election; None runs as the only instance.
    pub lease: Option<LeaseConfig>,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            concurrency: 16,
            identity: "runbook".into(),
            lease: None,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
        }
    }
}

/// Why the operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    MissingKinds(String),
    #[error("discovery failed: {}", crate::util::api_error(.0))]
    Discovery(kube::Error),
}

/// Why a reconcile failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ReconcileError {
    pub message: String,
    pub label: &'static str,
}

/// A decision of a shadow policy, kept for inspection.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ShadowRecord {
    pub time: String,
    pub target: String,
    pub record: DecisionRecord,
}

struct TargetController {
    store: Store<RawObject>,
    trigger: mpsc::UnboundedSender<ObjectRef<RawObject>>,
    resync: mpsc::UnboundedSender<()>,
    task: tokio::task::JoinHandle<()>,
    /// Why the task ended, when it ended on its own.
    ended: Arc<Mutex<Option<String>>>,
    /// How many times this kind's controller was restarted.
    restarts: u32,
}

/// Start the controller of one target kind: its watch, its reflector and
/// its reconciles. A panic that escapes the controller (anywhere but a
/// reconcile, which catches its own) is caught here and kept as the reason
/// the task ended; the supervisor (`Context::restart_ended`) restarts it.
fn spawn_target(ctx: &Arc<Context>, k: &KindRef) -> TargetController {
    let k = k.clone();
    let (ar, namespaced) = ctx.resources.served_as(&k);
    let api: Api<RawObject> = match (&ctx.config.namespace, namespaced) {
        (Some(ns), true) => Api::namespaced_with(ctx.client.clone(), ns, &ar),
        _ => Api::all_with(ctx.client.clone(), &ar),
    };
    let (trigger, trigger_rx) = mpsc::unbounded_channel();
    let (resync, resync_rx) = mpsc::unbounded_channel();
    let mut stop = ctx.stop.clone();
    // The controller's own reflector, fed by a watch whose listed
    // objects take the kind of the watch (see `RawObject::stamp`).
    let writer = reflector::store::Writer::<RawObject>::new(ar.clone());
    let reader = writer.as_reader();
    let typed = ar.clone();
    let (health, watch_name) = (ctx.watches.clone(), k.to_string());
    let objects = reflector::reflector(
        writer,
        watcher::watcher(api, watcher::Config::default().page_size(500)).map(move |e| {
            report_watch(&health, &watch_name, e.as_ref().err());
            e.map(|e| e.modify(|o| o.stamp(&typed)))
        }),
    )
    .applied_objects();
    let controller = Controller::for_stream_with(objects, reader, ar)
        .trigger_backoff(WatchBackoff::default())
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
        .reconcile_on(channel_stream(trigger_rx))
        .reconcile_all_on(channel_stream(resync_rx))
        .graceful_shutdown_on(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
    let store = controller.store();
    let ctx = ctx.clone();

    let kind = k.clone();
    let kind2 = k.clone();
    let ended = Arc::new(Mutex::new(None));
    let why = ended.clone();
    let task = tokio::spawn(async move {
        let run = controller
            .run(
                move |obj, ctx| reconcile(obj, ctx, kind.clone()),
                move |obj, err, ctx| error_policy(obj, err, ctx, &kind2),
                ctx,
            )
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!("controller: {e}");
                }
            });
        let reason = match std::panic::AssertUnwindSafe(run).catch_unwind().await {
            Ok(()) => "its event stream ended".to_string(),
            Err(panic) => format!("it panicked: {}", panic_message(&*panic)),
        };
        *lock(&why) = Some(reason);
    });
    TargetController {
        store,
        trigger,
        resync,
        task,
        ended,
        restarts: 0,
    }
}

/// What a caught panic said.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// How long a controller that ended waits before its restart: 1 s, doubling
/// with each restart of the same kind, at most 30 s.
fn restart_delay(restarts: u32) -> Duration {
    Duration::from_secs(1u64 << restarts.min(5)).min(Duration::from_secs(30))
}

/// How often ended controllers are looked for.
const SUPERVISE_EVERY: Duration = Duration::from_millis(250);

/// How often the alerts of deleted objects are resolved.
const ALERT_SWEEP: Duration = Duration::from_secs(15);

/// Everything a reconcile shares: no globals.
pub struct Context {
    pub client: Client,
    pub engine: Arc<ScriptEngine>,
    pub policies: ArcSwap<PolicySet>,
    pub clock: Clock,
    pub resources: Resources,
    pub metrics: Arc<Metrics>,
    pub alerts: Arc<dyn AlertSink>,
    pub recorder: EventWriter,
    pub config: OperatorConfig,
    /// Controllers are running (on the leader).
    pub ready: Arc<AtomicBool>,
    /// Policies loaded and watch caches filled: what `/readyz` reports, on
    /// the leader and on standbys alike, so rolling updates of a
    /// leader-elected Deployment are not held up by the standby.
    pub synced: Arc<AtomicBool>,
    pub leading: Arc<AtomicBool>,
    /// Which watches fail, since when: `/readyz` reports them.
    pub watches: Arc<WatchHealth>,
    pub applied: act::Applied,
    informers: Mutex<HashMap<KindRef, Arc<Informer>>>,
    targets: Mutex<HashMap<KindRef, TargetController>>,
    deps: Mutex<Dependencies>,
    failures: Mutex<HashMap<TargetKey, u32>>,
    breakers: Mutex<HashMap<String, Breaker>>,
    pending: Mutex<HashSet<TargetKey>>,
    shadow: Mutex<VecDeque<ShadowRecord>>,
    /// Targets whose status this process wrote, with the resourceVersion
    /// they had before: until the cache shows a newer version, a reconcile
    /// would decide on a status that no longer is.
    written: crate::observe::OwnWrites<TargetKey, String>,
    /// Where action outcomes are written down, when someone listens (scenarios).
    journal: std::sync::OnceLock<Arc<dyn crate::telemetry::journal::Journal>>,
    in_flight: AtomicUsize,
    activity: AtomicU64,
    changes: mpsc::UnboundedSender<Change>,
    stop: watch::Receiver<bool>,
}

impl Context {
    /// Write every action's outcome to `journal` from now on (once).
    pub fn set_journal(&self, journal: Arc<dyn crate::telemetry::journal::Journal>) {
        let _ = self.journal.set(journal);
    }

    /// The caches a reconcile reads, by kind.
    pub fn sources(&self) -> Sources {
        let mut map = HashMap::new();
        for (k, i) in lock(&self.informers).iter() {
            map.insert(k.clone(), Source::Informer(i.cache.clone()));
        }
        for (k, t) in lock(&self.targets).iter() {
            map.insert(
                k.clone(),
                Source::Targets(t.store.clone(), self.resources.served_as(k).0),
            );
        }
        Sources(map)
    }

    /// The writer of this process, at the clock's time.
    pub fn writer(&self) -> act::Writer<'_> {
        act::Writer {
            client: &self.client,
            recorder: Some(&self.recorder),
            journal: self.journal.get().map(|j| j.as_ref()),
            applied: Some(&self.applied),
            now: self.clock.now(),
        }
    }

    /// Shadow decisions, newest last.
    pub fn shadow_records(&self) -> Vec<ShadowRecord> {
        lock(&self.shadow).iter().cloned().collect()
    }

    fn trigger(&self, key: TargetKey) {
        let targets = lock(&self.targets);
        if let Some(t) = targets.get(&key.kind) {
            let r = target_ref(
                &self.resources.served_as(&key.kind).0,
                &key.namespace,
                &key.name,
            );
            if t.trigger.send(r).is_ok() {
                let mut pending = lock(&self.pending);
                pending.insert(key);
                self.metrics.queue_depth.set(pending.len() as i64);
            }
        }
    }

    /// Restart the target controllers whose task ended on its own (a panic
    /// outside a reconcile, a stream that ended, an abort), each after
    /// `restart_delay`; until it runs again `/readyz` names it, and the
    /// restart is counted in `runbook_controller_restarts_total{kind}`.
    pub fn restart_ended(self: &Arc<Self>) {
        if *self.stop.borrow() {
            return;
        }
        let mut targets = lock(&self.targets);
        for (k, t) in targets.iter_mut() {
            if !t.task.is_finished() {
                continue;
            }
            let name = format!("controller of {k}");
            let reason = lock(&t.ended)
                .clone()
                .unwrap_or_else(|| "it was stopped".into());
            let down = self.watches.controller_ended(&name, &reason);
            if down.is_zero() {
                tracing::error!(kind = %k, "the {name} ended: {reason}; restarting it");
            }
            if down < restart_delay(t.restarts) {
                continue;
            }
            let restarts = t.restarts + 1;
            *t = spawn_target(self, k);
            t.restarts = restarts;
            self.metrics
                .controller_restarts
                .get_or_create(&Metrics::labels(&[("kind", &k.kind)]))
                .inc();
            self.watches.controller_restarted(&name);
            tracing::warn!(kind = %k, restarts, "restarted the {name}");
        }
    }

    /// End the controller of `kind` as a fault would (for tests of the
    /// supervision): the supervisor restarts it.
    #[doc(hidden)]
    pub fn end_controller(&self, kind: &KindRef) {
        if let Some(t) = lock(&self.targets).get(kind) {
            t.task.abort();
        }
    }

    /// Resolve the alerts of objects that are gone (or were replaced by a
    /// new object of the same name) and of policies no longer loaded.
    /// Only the leader's caches are complete enough to say so.
    pub fn sweep_alerts(&self) {
        if !self.leading.load(Ordering::Acquire) || !self.ready.load(Ordering::Acquire) {
            return;
        }
        let set = self.policies.load_full();
        let targets = lock(&self.targets);
        let alive = |s: &crate::alert::AlertSource| {
            if !set.policies.contains_key(&s.policy) {
                return false;
            }
            let kind = KindRef::new(s.api_version.clone(), s.kind.clone());
            let Some(t) = targets.get(&kind) else {
                return false;
            };
            let r = target_ref(&self.resources.served_as(&kind).0, &s.namespace, &s.name);
            t.store
                .get(&r)
                .is_some_and(|o| o.meta.uid.as_deref().unwrap_or("") == s.uid)
        };
        self.alerts.retain(&alive);
    }

    /// Reconcile every target of these kinds (all kinds if empty) again.
    pub fn resync(&self, kinds: &[KindRef]) {
        for (k, t) in lock(&self.targets).iter() {
            if kinds.is_empty() || kinds.contains(k) {
                let _ = t.resync.send(());
            }
        }
    }

    /// Reconcile these targets again.
    pub fn requeue(&self, keys: impl IntoIterator<Item = TargetKey>) {
        for k in keys {
            self.trigger(k);
        }
    }

    /// Every target currently cached, of the given kinds.
    pub fn target_keys(&self, kinds: &[KindRef]) -> Vec<TargetKey> {
        let targets = lock(&self.targets);
        let mut out = Vec::new();
        for (k, t) in targets.iter().filter(|(k, _)| kinds.contains(k)) {
            for o in t.store.state() {
                out.push(TargetKey {
                    kind: k.clone(),
                    namespace: o.meta.namespace.clone().unwrap_or_default(),
                    name: o.meta.name.clone().unwrap_or_default(),
                });
            }
        }
        out
    }

    /// Reconciles running right now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// A counter that moves whenever a reconcile finishes.
    pub fn activity(&self) -> u64 {
        self.activity.load(Ordering::Acquire)
    }

    /// Targets waiting after a change.
    pub fn pending(&self) -> usize {
        lock(&self.pending).len()
    }
}

fn finalizer_name(policy: &str) -> String {
    let name = if policy.len() <= 63 {
        policy.to_string()
    } else {
        crate::names::child_name(
            &policy[..50],
            &crate::util::hash::short_hex(policy.as_bytes(), 8),
        )
    };
    format!("runbook.dev/{name}")
}

/// A warning Event on a target.
fn warning(reason: &str, message: String) -> act::plan::Note {
    act::plan::Note {
        type_: crate::events::EventType::Warning,
        reason: reason.into(),
        message,
    }
}

/// Add or remove one of the target's finalizers (counted as a write).
async fn finalizers(
    ctx: &Context,
    kind: &Resolved,
    target: &Value,
    add: Option<&str>,
    remove: Option<&str>,
) -> Result<(), ReconcileError> {
    ctx.metrics.writes.inc();
    ctx.writer()
        .finalizers(kind, target, add, remove)
        .await
        .map_err(|e| ReconcileError {
            message: e.to_string(),
            label: "finalizer",
        })
}

async fn run_policy(
    ctx: &Context,
    p: &CompiledPolicy,
    set: &PolicySet,
    target: &Arc<crate::observe::CachedObject>,
    resolved: &Resolved,
    key: &TargetKey,
    finalizing: bool,
) -> act::Outcome {
    let now: Timestamp = ctx.clock.now();
    let tracking = Arc::new(Tracking::new(ctx.sources()));
    let observed = Observed {
        target: target.clone(),
        view: tracking.clone(),
        now,
    };
    let started = Instant::now();
    let decision = if finalizing {
        decide::finalize(&ctx.engine, p, &observed)
    } else {
        decide::decide(&ctx.engine, p, &observed)
    };
    let policy_label = Metrics::labels(&[("policy", &p.name)]);
    ctx.metrics
        .script_seconds
        .get_or_create(&policy_label)
        .observe(started.elapsed().as_secs_f64());
    lock(&ctx.deps).set(key, tracking.take());
    let now_ms = now.as_millisecond();
    let mode = match p.mode {
        policy::Mode::Shadow => Mode::Shadow,
        policy::Mode::Enforce => {
            let open = p.limits.circuit_breaker.as_ref().and_then(|cb| {
                lock(&ctx.breakers)
                    .entry(p.name.clone())
                    .or_default()
                    .open(cb, now_ms)
            });
            match open {
                Some(why) => Mode::Suspended(why),
                None => Mode::Enforce,
            }
        }
    };
    ctx.metrics
        .circuit_open
        .get_or_create(&policy_label)
        .set(matches!(mode, Mode::Suspended(_)) as i64);
    let routes = set.routes_for(p);
    let exec = Exec {
        writer: act::Writer {
            now,
            ..ctx.writer()
        },
        resources: &ctx.resources,
        view: &tracking.sources,
        alerts: ctx.alerts.as_ref(),
    };
    let outcome = act::execute(
        &exec,
        p,
        routes.as_ref(),
        target,
        resolved,
        decision.as_ref(),
        mode.clone(),
    )
    .await;
    if let Err(e) = &decision {
        tracing::warn!(policy = %p.name, "{e}");
    }
    for (verb, result) in &outcome.results {
        ctx.metrics
            .actions
            .get_or_create(&Metrics::labels(&[
                ("policy", &p.name),
                ("action", verb),
                ("result", result),
            ]))
            .inc();
    }
    for (verb, _) in &outcome.refused {
        ctx.metrics
            .refusals
            .get_or_create(&Metrics::labels(&[("policy", &p.name), ("action", verb)]))
            .inc();
    }
    ctx.metrics.writes.inc_by(u64::from(outcome.writes));
    if let (Some(cb), policy::Mode::Enforce) = (&p.limits.circuit_breaker, p.mode) {
        lock(&ctx.breakers)
            .entry(p.name.clone())
            .or_default()
            .record(cb, now_ms, outcome.error.is_some());
    }
    if mode == Mode::Shadow {
        tracing::info!(policy = %p.name, version = %p.version, target = %format!("{}/{}", key.namespace, key.name), actions = ?outcome.record.actions, "shadow decision");
        let mut log = lock(&ctx.shadow);
        log.push_back(ShadowRecord {
            time: crate::util::time::format(now),
            target: format!("{} {}/{}", key.kind, key.namespace, key.name),
            record: outcome.record.clone(),
        });
        while log.len() > 1000 {
            log.pop_front();
        }
    }
    let mut outcome = outcome;
    if let Ok(d) = &decision {
        outcome.requeue_ms = d.requeue_after_ms;
    }
    outcome
}

async fn reconcile(
    obj: Arc<RawObject>,
    ctx: Arc<Context>,
    kind: KindRef,
) -> Result<Action, ReconcileError> {
    let key = TargetKey {
        kind: kind.clone(),
        namespace: obj.meta.namespace.clone().unwrap_or_default(),
        name: obj.meta.name.clone().unwrap_or_default(),
    };
    {
        let mut pending = lock(&ctx.pending);
        pending.remove(&key);
        ctx.metrics.queue_depth.set(pending.len() as i64);
    }
    tracing::debug!(kind = %kind, namespace = %key.namespace, name = %key.name, "reconcile");
    // A target kind that other policies own, read or mutate has no cache
    // of its own sending changes (its controller's store serves it), so
    // its changes, which each bring a reconcile here, are passed on: a
    // DatabaseBackup's progress wakes the DatabaseCluster that owns it.
    let watched_by_others = ctx
        .policies
        .load()
        .policies
        .values()
        .any(|p| p.target != kind && p.kinds.declares(&kind));
    if watched_by_others {
        let _ = ctx.changes.send(crate::observe::cache::Change {
            kind: kind.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            owners: obj
                .meta
                .owner_references
                .iter()
                .flatten()
                .map(|o| crate::observe::cache::OwnerRef {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                })
                .collect(),
        });
    }
    if let Some(why) = &obj.undecodable {
        tracing::warn!(kind = %kind, namespace = %key.namespace, name = %key.name, "skipping a target that cannot be used: {why}");
        ctx.metrics
            .skipped
            .get_or_create(&Metrics::labels(&[("kind", &kind.kind)]))
            .inc();
        if obj.meta.name.is_some() {
            let note = warning("Undecodable", format!("Runbook skips this object: {why}"));
            ctx.writer().event(&obj.value(), &note).await;
        }
        return Ok(Action::await_change());
    }
    ctx.in_flight.fetch_add(1, Ordering::AcqRel);
    // A panic is a bug; it fails this reconcile only (retried with
    // backoff, counted, reported on the target), never the controller of
    // the whole kind.
    let result = match std::panic::AssertUnwindSafe(reconcile_target(&obj, &ctx, &kind, &key))
        .catch_unwind()
        .await
    {
        Ok(r) => r,
        Err(panic) => {
            let what = panic_message(&*panic);
            ctx.metrics
                .panics
                .get_or_create(&Metrics::labels(&[("kind", &kind.kind)]))
                .inc();
            let message = format!(
                "internal error while reconciling (a bug in Runbook, please report it): {what}"
            );
            tracing::error!(kind = %kind, namespace = %key.namespace, name = %key.name, "{message}");
            let note = warning("InternalError", message.clone());
            ctx.writer().event(&obj.value(), &note).await;
            Err(ReconcileError {
                message,
                label: "panic",
            })
        }
    };
    ctx.in_flight.fetch_sub(1, Ordering::AcqRel);
    ctx.activity.fetch_add(1, Ordering::AcqRel);
    result
}

async fn reconcile_target(
    obj: &RawObject,
    ctx: &Arc<Context>,
    kind: &KindRef,
    key: &TargetKey,
) -> Result<Action, ReconcileError> {
    {
        // Read our own writes: deciding on a status the cache has not
        // caught up with would repeat what the last decision did.
        match ctx.written.pending(key) {
            Some(before) if before == obj.resource_version() => {
                tracing::debug!(kind = %kind, namespace = %key.namespace, name = %key.name, "waiting for the cache to show the last status write");
                // The watch event of that write reconciles again; the
                // requeue is a backstop.
                return Ok(Action::requeue(Duration::from_secs(30)));
            }
            Some(_) => ctx.written.settled(key),
            None => {}
        }
    }
    let set = ctx.policies.load_full();
    let target = obj.cached();
    let t = target.value();
    let policies: Vec<Arc<CompiledPolicy>> = set
        .for_target(kind)
        .into_iter()
        .filter(|p| p.selector.is_empty() || p.selector.matches_object(t))
        .collect();
    if policies.is_empty() {
        lock(&ctx.deps).forget(key);
        return Ok(Action::await_change());
    }
    let resolved = ctx
        .resources
        .resolve(kind)
        .await
        .map_err(|e| ReconcileError {
            message: format!("discovering {kind}: {}", crate::util::api_error(&e)),
            label: "discovery",
        })?;
    let started = Instant::now();
    let deleting = t.pointer("/metadata/deletionTimestamp").is_some();
    let present = act::writer::finalizers_of(t);
    let mut requeue: Option<i64> = None;
    let mut error: Option<(String, &'static str)> = None;
    for p in &policies {
        let span = tracing::info_span!("reconcile", policy = %p.name, version = %p.version, kind = %kind.kind, namespace = %key.namespace, name = %key.name);
        let _enter = span.enter();
        let fin = finalizer_name(&p.name);
        let writes_allowed = p.mode == policy::Mode::Enforce;
        if deleting {
            if !present.contains(&fin) {
                continue;
            }
            let outcome = run_policy(ctx, p, &set, &target, &resolved, key, true).await;
            // Finalize is done when it asks for no more writes.
            let work_left = !outcome.results.is_empty();
            if let Some(e) = outcome.error {
                error = Some((e, outcome.error_label.unwrap_or("finalize")));
            } else if !work_left && writes_allowed {
                finalizers(ctx, &resolved, t, None, Some(&fin)).await?;
            } else {
                requeue = Some(requeue.map_or(5_000, |r| r.min(5_000)));
            }
            continue;
        }
        if p.has_finalizer() && writes_allowed && !present.contains(&fin) {
            // The watch event of this write reconciles again.
            finalizers(ctx, &resolved, t, Some(&fin), None).await?;
            return Ok(Action::await_change());
        }
        let outcome = run_policy(ctx, p, &set, &target, &resolved, key, false).await;
        if outcome.status_written {
            ctx.written
                .remember(key.clone(), obj.resource_version().to_string());
        }
        let result = if outcome.error.is_some() {
            "error"
        } else {
            "ok"
        };
        ctx.metrics
            .reconciles
            .get_or_create(&Metrics::labels(&[("policy", &p.name), ("result", result)]))
            .inc();
        ctx.metrics
            .reconcile_seconds
            .get_or_create(&Metrics::labels(&[("policy", &p.name)]))
            .observe(started.elapsed().as_secs_f64());
        if let Some(ms) = outcome.requeue_ms {
            requeue = Some(requeue.map_or(ms, |r| r.min(ms)));
        }
        if let Some(e) = outcome.error {
            tracing::warn!("{e}");
            error = Some((e, outcome.error_label.unwrap_or("error")));
        }
    }
    if let Some((message, label)) = error {
        return Err(ReconcileError { message, label });
    }
    lock(&ctx.failures).remove(key);
    Ok(match requeue {
        Some(ms) => Action::requeue(Duration::from_millis(ms.max(1) as u64)),
        None => Action::await_change(),
    })
}

fn error_policy(
    obj: Arc<RawObject>,
    err: &ReconcileError,
    ctx: Arc<Context>,
    kind: &KindRef,
) -> Action {
    let key = TargetKey {
        kind: kind.clone(),
        namespace: obj.meta.namespace.clone().unwrap_or_default(),
        name: obj.meta.name.clone().unwrap_or_default(),
    };
    let n = {
        let mut f = lock(&ctx.failures);
        let n = f.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let delay = backoff(
        ctx.config.backoff_base,
        ctx.config.backoff_max,
        n,
        &format!("{}/{}/{}", kind, key.namespace, key.name),
    );
    tracing::debug!(error = %err, label = err.label, attempt = n, delay_ms = delay.as_millis() as u64, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// Exponential backoff, capped, with ±20% jitter derived from the object
/// (so retries of many objects spread out, and a given object's are
/// reproducible).
pub fn backoff(base: Duration, max: Duration, attempt: u32, seed: &str) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let capped = exp.min(max);
    let h = crate::util::hash::fnv64(format!("{seed}#{attempt}").as_bytes());
    let jitter = 0.8 + (h % 4001) as f64 / 10_000.0;
    capped.mul_f64(jitter)
}

fn channel_stream<T: Send + 'static>(
    rx: mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}

/// The operator.
pub struct Operator {
    pub ctx: Arc<Context>,
    stop: watch::Sender<bool>,
    changes_rx: Mutex<Option<mpsc::UnboundedReceiver<Change>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    leading_rx: watch::Receiver<bool>,
    leading_tx: Mutex<Option<watch::Sender<bool>>>,
}

impl Operator {
    pub fn new(
        client: Client,
        engine: Arc<ScriptEngine>,
        policies: PolicySet,
        clock: Clock,
        alerts: Arc<dyn AlertSink>,
        metrics: Arc<Metrics>,
        config: OperatorConfig,
    ) -> Self {
        let (stop, stop_rx) = watch::channel(false);
        let (changes, changes_rx) = mpsc::unbounded_channel();
        let (leading_tx, leading_rx) = watch::channel(false);
        let reporter = Reporter {
            controller: "runbook".into(),
            instance: Some(config.identity.clone()),
        };
        let watches = Arc::new(WatchHealth::with_metrics(metrics.clone()));
        let ctx = Arc::new(Context {
            recorder: EventWriter::new(client.clone(), reporter),
            resources: Resources::new(client.clone()),
            client,
            engine,
            policies: ArcSwap::from_pointee(policies),
            clock,
            metrics,
            alerts,
            config,
            ready: Arc::new(AtomicBool::new(false)),
            synced: Arc::new(AtomicBool::new(false)),
            leading: Arc::new(AtomicBool::new(false)),
            watches,
            applied: act::Applied::default(),
            informers: Mutex::new(HashMap::new()),
            targets: Mutex::new(HashMap::new()),
            deps: Mutex::new(Dependencies::default()),
            failures: Mutex::new(HashMap::new()),
            breakers: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashSet::new()),
            shadow: Mutex::new(VecDeque::new()),
            journal: std::sync::OnceLock::new(),
            written: Default::default(),
            in_flight: AtomicUsize::new(0),
            activity: AtomicU64::new(0),
            changes,
            stop: stop_rx,
        });
        Self {
            ctx,
            stop,
            changes_rx: Mutex::new(Some(changes_rx)),
            tasks: Mutex::new(Vec::new()),
            leading_rx,
            leading_tx: Mutex::new(Some(leading_tx)),
        }
    }

    /// Check that every kind the policies name is served. A missing target
    /// kind stops the start with the command that fixes it; a policy that
    /// only owns or reads a missing kind is set aside (and said so), and
    /// the others run.
    pub async fn check_kinds(&self, set: &PolicySet) -> Result<PolicySet, StartError> {
        let mut missing: Vec<KindRef> = Vec::new();
        let mut kinds: Vec<KindRef> = Vec::new();
        for p in set.policies.values() {
            for k in p.kinds.kinds() {
                if !kinds.contains(k) {
                    kinds.push(k.clone());
                }
            }
        }
        for k in &kinds {
            match self.ctx.resources.resolve(k).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => missing.push(k.clone()),
                Err(kube::Error::Discovery(_)) => missing.push(k.clone()),
                Err(e) => return Err(StartError::Discovery(e)),
            }
        }
        let targets: Vec<KindRef> = missing
            .iter()
            .filter(|k| set.target_kinds().contains(k))
            .cloned()
            .collect();
        if !targets.is_empty() {
            let names: Vec<String> = targets.iter().map(|k| k.to_string()).collect();
            let fix = if targets.iter().any(|k| k.group() == "runbook.dev") {
                "install Runbook's CRDs with: runbook crds | kubectl apply --server-side -f -"
            } else {
                "install the CustomResourceDefinitions that define them (kubectl apply -f <crd.yaml>), then start again"
            };
            return Err(StartError::MissingKinds(format!(
                "the policies target {}, which the API server does not serve; {fix}",
                names.join(", ")
            )));
        }
        let mut kept = set.clone();
        for (name, p) in &set.policies {
            let absent: Vec<String> = p
                .kinds
                .kinds()
                .into_iter()
                .filter(|k| missing.contains(k))
                .map(|k| k.to_string())
                .collect();
            if !absent.is_empty() {
                tracing::error!(policy = %name, "set aside: the API server does not serve {}; install the CRDs that define them", absent.join(", "));
                self.ctx
                    .metrics
                    .policy_reloads
                    .get_or_create(&Metrics::labels(&[("result", "missing_kinds")]))
                    .inc();
                kept.policies.remove(name);
            }
        }
        Ok(kept)
    }

    fn ensure_informers(&self, set: &PolicySet) {
        let targets: Vec<KindRef> = set.target_kinds();
        let mut wanted: Vec<KindRef> = Vec::new();
        for p in set.policies.values() {
            for k in p.kinds.kinds() {
                if !targets.contains(k) && !wanted.contains(k) {
                    wanted.push(k.clone());
                }
            }
        }
        let mut informers = lock(&self.ctx.informers);
        informers.retain(|k, _| wanted.contains(k));
        for k in wanted {
            informers.entry(k.clone()).or_insert_with(|| {
                // Plural and scope as discovery found them (a CRD may name
                // its plural anything, and be cluster-scoped).
                let (resource, namespaced) = self.ctx.resources.served_as(&k);
                Arc::new(spawn_informer(
                    self.ctx.client.clone(),
                    resource,
                    k.clone(),
                    self.ctx.config.namespace.clone(),
                    self.ctx.changes.clone(),
                    self.ctx.watches.clone(),
                    namespaced,
                ))
            });
        }
    }

    async fn wait_informers(&self) {
        let caches: Vec<Arc<crate::observe::cache::KindCache>> = lock(&self.ctx.informers)
            .values()
            .map(|i| i.cache.clone())
            .collect();
        for c in caches {
            c.wait_synced().await;
        }
    }

    async fn ensure_controllers(&self, set: &PolicySet) {
        let wanted = set.target_kinds();
        let mut new_stores = Vec::new();
        {
            let mut targets = lock(&self.ctx.targets);
            let stale: Vec<KindRef> = targets
                .keys()
                .filter(|k| !wanted.contains(k))
                .cloned()
                .collect();
            for k in stale {
                if let Some(t) = targets.remove(&k) {
                    t.task.abort();
                }
            }
            for k in wanted {
                if targets.contains_key(&k) {
                    continue;
                }
                let t = spawn_target(&self.ctx, &k);
                new_stores.push(t.store.clone());
                targets.insert(k, t);
            }
        }
        for s in new_stores {
            // A waiter that arrives while the store is being marked ready
            // can miss the wake-up; polling again finds it ready.
            loop {
                match tokio::time::timeout(Duration::from_millis(100), s.wait_until_ready()).await {
                    Ok(_) => break,
                    Err(_) => continue,
                }
            }
        }
    }

    /// Start: check kinds, fill caches, then (once leading) reconcile.
    pub async fn start(&self) -> Result<(), StartError> {
        // Discovery waits out an API server that is not there (yet); a
        // kind it does not serve is an answer, and fails the start.
        let mut stop = self.ctx.stop.clone();
        let checked = tokio::select! {
            r = crate::observe::health::patiently("discovering the policies' kinds", || async {
                match self.check_kinds(&self.ctx.policies.load_full()).await {
                    Err(StartError::Discovery(e)) => Err(crate::util::api_error(&e)),
                    other => Ok(other),
                }
            }) => r,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let set = Arc::new(checked?);
        self.ctx.policies.store(set.clone());
        self.ensure_informers(&set);
        if let Some(rx) = lock(&self.changes_rx).take() {
            lock(&self.tasks).push(tokio::spawn(dispatch(self.ctx.clone(), rx)));
        }
        self.wait_informers().await;
        self.ctx.synced.store(true, Ordering::Release);
        let leading_tx = lock(&self.leading_tx).take().expect("start runs once");
        match self.ctx.config.lease.clone() {
            None => {
                self.ctx.leading.store(true, Ordering::Release);
                let _ = leading_tx.send(true);
            }
            Some(lease) => {
                let elector = Elector::new(self.ctx.client.clone(), lease, Clock::real());
                let task = tokio::spawn(elector.run(
                    self.ctx.leading.clone(),
                    leading_tx,
                    self.ctx.stop.clone(),
                ));
                lock(&self.tasks).push(task);
            }
        }
        let mut leading = self.leading_rx.clone();
        let mut stop = self.ctx.stop.clone();
        tokio::select! {
            _ = leading.wait_for(|l| *l) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
        self.ctx.metrics.leader.set(1);
        // What was notified before this leader, so that nothing is sent twice.
        self.ctx.alerts.restore().await;
        self.ensure_controllers(&set).await;
        self.ctx.ready.store(true, Ordering::Release);
        let ctx = self.ctx.clone();
        let mut stop = self.ctx.stop.clone();
        lock(&self.tasks).push(tokio::spawn(async move {
            let mut every = tokio::time::interval(ALERT_SWEEP);
            let mut supervise = tokio::time::interval(SUPERVISE_EVERY);
            loop {
                tokio::select! {
                    _ = every.tick() => ctx.sweep_alerts(),
                    _ = supervise.tick() => ctx.restart_ended(),
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }));
        self.publish_policy_info(&set);
        Ok(())
    }

    /// `runbook_policy_info{policy,version}`: exactly the policies in force.
    fn publish_policy_info(&self, set: &PolicySet) {
        self.ctx.metrics.policy_info.clear();
        for p in set.policies.values() {
            self.ctx
                .metrics
                .policy_info
                .get_or_create(&Metrics::labels(&[
                    ("policy", &p.name),
                    ("version", &p.version),
                ]))
                .set(1);
        }
    }

    /// Resolves when this instance stops leading (after having led);
    /// never, without leader election.
    pub async fn lost_leadership(&self) {
        let mut rx = self.leading_rx.clone();
        if rx.wait_for(|l| *l).await.is_err() || rx.wait_for(|l| !*l).await.is_err() {
            // No elector: the leadership cannot be lost.
            std::future::pending::<()>().await;
        }
    }

    pub fn is_leading(&self) -> bool {
        self.ctx.leading.load(Ordering::Acquire)
    }

    /// Swap in a new policy set: start what it needs, stop what it no
    /// longer needs, and reconcile every target of a changed policy once.
    pub async fn swap_policies(&self, set: PolicySet) -> Vec<KindRef> {
        // Policies naming a kind the cluster does not serve stay set aside,
        // as at start-up, whichever bundle they come from.
        let set = match self.check_kinds(&set).await {
            Ok(kept) => kept,
            Err(e) => {
                tracing::error!("checking the kinds of the new policy set: {e}");
                set
            }
        };
        let old = self.ctx.policies.load_full();
        let mut changed: Vec<KindRef> = Vec::new();
        for p in set.policies.values() {
            let same = old
                .policies
                .get(&p.name)
                .is_some_and(|q| q.version == p.version);
            if !same && !changed.contains(&p.target) {
                changed.push(p.target.clone());
            }
        }
        for (name, q) in &old.policies {
            if !set.policies.contains_key(name) && !changed.contains(&q.target) {
                changed.push(q.target.clone());
            }
        }
        self.ctx.policies.store(Arc::new(set.clone()));
        self.ensure_informers(&set);
        self.wait_informers().await;
        if self.is_leading() {
            self.ensure_controllers(&set).await;
        }
        self.publish_policy_info(&set);
        let still: Vec<KindRef> = changed
            .into_iter()
            .filter(|k| set.target_kinds().contains(k))
            .collect();
        self.ctx.resync(&still);
        still
    }

    /// Stop taking work, let reconciles in flight finish (up to `grace`),
    /// release the Lease.
    pub async fn shutdown(&self, grace: Duration) {
        let _ = self.stop.send(true);
        let deadline = Instant::now() + grace;
        while self.ctx.in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tasks: Vec<tokio::task::JoinHandle<()>> = std::mem::take(&mut *lock(&self.tasks));
        for t in tasks {
            let _ = tokio::time::timeout(
                deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1),
                t,
            )
            .await;
        }
        let controllers: Vec<TargetController> =
            lock(&self.ctx.targets).drain().map(|(_, t)| t).collect();
        for t in controllers {
            let _ = tokio::time::timeout(Duration::from_secs(2), t.task).await;
        }
        lock(&self.ctx.informers).clear();
        self.ctx.ready.store(false, Ordering::Release);
        self.ctx.synced.store(false, Ordering::Release);
        self.ctx.metrics.leader.set(0);
    }

    /// Wait until nothing is in flight or pending and no reconcile has
    /// finished for `quiet` (tests and simulations use this to settle).
    pub async fn settle(&self, quiet: Duration, max: Duration) {
        let deadline = Instant::now() + max;
        let mut last = self.ctx.activity();
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let now = self.ctx.activity();
            if now != last || self.ctx.in_flight() > 0 || self.ctx.pending() > 0 {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                return;
            }
            if Instant::now() > deadline {
                return;
            }
        }
    }
}

/// Route cache changes to the targets they concern: owners by their
/// ownerReferences, readers by what their last decision looked up.
async fn dispatch(ctx: Arc<Context>, mut rx: mpsc::UnboundedReceiver<Change>) {
    let mut stop = ctx.stop.clone();
    loop {
        let ch = tokio::select! {
            ch = rx.recv() => match ch {
                Some(ch) => ch,
                None => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        let set = ctx.policies.load_full();
        let targets = set.target_kinds();
        let mut keys: Vec<TargetKey> = Vec::new();
        for o in &ch.owners {
            let k = KindRef::new(&o.api_version, &o.kind);
            if targets.contains(&k) {
                keys.push(TargetKey {
                    kind: k,
                    namespace: ch.namespace.clone(),
                    name: o.name.clone(),
                });
            }
        }
        keys.extend(lock(&ctx.deps).readers_of(&ch.kind, &ch.namespace, &ch.name));
        keys.sort();
        keys.dedup();
        for k in keys {
            ctx.trigger(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jitters() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(10);
        let d1 = backoff(base, max, 1, "a");
        let d4 = backoff(base, max, 4, "a");
        assert!(
            d1 >= Duration::from_millis(80) && d1 <= Duration::from_millis(120),
            "{d1:?}"
        );
        assert!(
            d4 >= Duration::from_millis(640) && d4 <= Duration::from_millis(960),
            "{d4:?}"
        );
        assert!(backoff(base, max, 30, "a") <= Duration::from_secs(12));
        assert_ne!(
            backoff(base, max, 3, "a"),
            backoff(base, max, 3, "b"),
            "objects spread out"
        );
    }
}
