//! One reconcile of one target: every policy bound to it decides, and
//! `act` carries each decision out; finalizers, the read-your-own-writes
//! guard, the circuit breaker, metrics and the backoff of failures.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::FutureExt;
use jiff::Timestamp;
use kube::runtime::controller::Action;
use serde_json::Value;
use tracing::Instrument;

use super::context::{Context, ShadowRecord};
use super::records::Failing;
use crate::act::{self, Exec};
use crate::observe::view::{TargetKey, Tracking};
use crate::telemetry::Metrics;
use runbook_core::decide::{self, Observed};
use runbook_core::failure::{Cause, Failed};
use runbook_core::kinds::KindRef;
use runbook_core::observe::RawObject;
use runbook_core::observe::Resolved;
use runbook_core::plan::Acting;
use runbook_core::policy::compile::CompiledPolicy;
use runbook_core::policy::{self, PolicySet};
use runbook_core::util::lock;

/// Why a reconcile failed before its policies decided (it is retried with
/// backoff). A policy's own failure is its decision's (`Outcome::failure`),
/// retried on that policy's backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Discovery could not say how the target's kind is served.
    #[error("discovering {kind}: {}", crate::util::api_error(.source))]
    Discovery {
        kind: KindRef,
        #[source]
        source: kube::Error,
    },
    /// A finalizer could not be added or removed.
    #[error("{0}")]
    Finalizer(#[source] act::ExecError),
    /// Runbook itself failed: a panic, caught (the message says where).
    #[error("{0}")]
    Panic(String),
    /// Runbook's state of the target could not be read (sharded, one
    /// not in this replica's cache is read from the API server).
    #[error("reading Runbook's state of the target (RunbookState {name}): {}", crate::util::api_error(.source))]
    State {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A sweep keeps its record in a `RunbookState`, which the API server
    /// does not serve.
    #[error(
        "a sweep keeps its run times and decisions in a RunbookState, which the API server does not serve; install Runbook's CRDs (runbook crds | kubectl apply --server-side -f -)"
    )]
    NoStateKind,
}

impl ReconcileError {
    pub fn cause(&self) -> Cause {
        match self {
            ReconcileError::Discovery { .. } => Cause::Discovery,
            ReconcileError::Finalizer(_) => Cause::Finalizer,
            ReconcileError::Panic(_) => Cause::Panic,
            ReconcileError::State { .. } => Cause::Status,
            ReconcileError::NoStateKind => Cause::Discovery,
        }
    }
}

fn finalizer_name(policy: &str) -> String {
    let name = if policy.len() <= 63 {
        policy.to_string()
    } else {
        runbook_core::names::child_name(
            &policy[..50],
            &runbook_core::util::hash::short_hex(policy.as_bytes(), 8),
        )
    };
    format!("runbook.dev/{name}")
}

/// A warning Event on a target.
fn warning(reason: &str, message: String) -> runbook_core::plan::Note {
    runbook_core::plan::Note {
        type_: runbook_core::script::action::EventType::Warning,
        reason: reason.into(),
        message,
    }
}

/// A change to one of a target's finalizers.
#[derive(Clone, Copy, Debug)]
enum Finalizer<'a> {
    Add(&'a str),
    Remove(&'a str),
}

/// Add or remove one of the target's finalizers (counted as a write), as
/// the policy it is for.
async fn finalizers(
    ctx: &Context,
    policy: &CompiledPolicy,
    kind: &Resolved,
    target: &Value,
    change: Finalizer<'_>,
) -> Result<(), ReconcileError> {
    let (add, remove) = match change {
        Finalizer::Add(f) => (Some(f), None),
        Finalizer::Remove(f) => (None, Some(f)),
    };
    ctx.metrics.writes.inc();
    let manager = act::manager_of(&policy.name);
    let acting = ctx.acting_for(policy);
    act::Writer {
        manager: &manager,
        ..ctx.writer_as(acting.as_deref())
    }
    .finalizers(kind, target, add, remove)
    .await
    .map_err(ReconcileError::Finalizer)
}

/// Which of a policy's functions a reconcile runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hook {
    /// `reconcile` (or the steps): the target is alive.
    Reconcile,
    /// `finalize`: the target is being deleted and holds our finalizer.
    Finalize,
    /// `deleted`: the target is gone (see `deleted.rs`); nothing is
    /// written to it and nothing of it is remembered.
    Deleted,
}

/// One policy's decision on one target, carried out.
pub(super) async fn run_policy(
    ctx: &Context,
    p: &CompiledPolicy,
    t: &Target<'_>,
    hook: Hook,
) -> act::Outcome {
    let (set, target, resolved, key) = (&*t.set, &t.cached, &t.resolved, t.key);
    let apart = t.apart.as_ref();
    let now: Timestamp = ctx.clock.now();
    let resyncs = ctx.queue.resyncs.load(Ordering::Acquire);
    let woken = ctx.memory.records.woken();
    let (tracking, mut observed) = tracked(ctx, p, t, now);
    let acting = ctx.acting_for(p);
    let decision = decide_asking(ctx, p, &mut observed, hook, acting.as_deref()).await;
    let read = tracking.take();
    let checked = tracking.take_checked();
    let mode = mode_of(ctx, p, now);
    let reads_target = read.iter().any(|a| a.kind == key.kind);
    if hook != Hook::Deleted {
        ctx.memory.records.read_by(key, &p.name, read);
    }
    let manager = act::manager_of(&p.name);
    let dropped = ctx.memory.dropped_fields(&p.id, &key.kind);
    let exec = Exec {
        writer: act::Writer {
            now,
            manager: &manager,
            ..ctx.writer_as(acting.as_deref())
        },
        resources: &ctx.resources,
        view: &tracking.sources,
        alerts: ctx.alerts.as_ref(),
        authority: &ctx.authority,
        reads: &checked,
        state: apart,
        state_at: state_apart(ctx, key),
        dropped: &dropped,
        gone: hook == Hook::Deleted,
    };
    let routes = set.routes_for(p);
    let decided = decision.as_ref();
    let mut outcome = act::execute(
        &exec,
        p,
        routes.as_ref(),
        target,
        resolved,
        decided,
        mode.clone(),
    )
    .await;
    if let Err(e) = &decision {
        tracing::warn!(policy = %p.id, "{e}");
    }
    if hook == Hook::Reconcile {
        let carried_out = decision.as_ref().ok().filter(|_| outcome.failure.is_none());
        let last = super::unchanged::Made {
            target: target.value(),
            reads_own_kind: reads_target,
            mode: &mode,
            resyncs,
            woken,
            now,
            check: ctx.config.check_skips,
        };
        ctx.memory.records.remember(key, p, carried_out, &last);
    }
    note_dropped(ctx, p, &key.kind, &outcome);
    count(ctx, p, now, &outcome);
    if mode == Acting::Shadow {
        keep_shadow(ctx, p, key, now, &outcome);
    }
    if let Ok(d) = &decision {
        outcome.requeue_ms = d.requeue_after_ms;
    }
    outcome
}

/// A policy's decision, made again with each metric reading its script
/// wanted and was not given, once the runtime has asked for it (each
/// round gives at least one more of the policy's metrics, so this ends).
async fn decide_asking(
    ctx: &Context,
    p: &CompiledPolicy,
    observed: &mut Observed,
    hook: Hook,
    acting: Option<&super::tenants::Acting>,
) -> Result<decide::Decision, decide::DecideError> {
    loop {
        let script = ctx.fair.script(&p.id).await;
        let (decision, wanted) = timed_decision(ctx, p, observed, hook);
        drop(script);
        let wanted: Vec<String> = wanted
            .into_iter()
            .filter(|w| !observed.readings.contains_key(w))
            .collect();
        if wanted.is_empty() || hook != Hook::Reconcile {
            return decision;
        }
        let asker = ctx.asker_for(p, acting);
        for name in wanted {
            let asked = ctx
                .queries
                .ask(&asker, p, observed.target.value(), &name, observed.now)
                .await;
            observed.readings.insert(name, asked);
        }
    }
}

/// What a decision on `t` observes, through a view that records what it
/// reads.
fn tracked(
    ctx: &Context,
    p: &CompiledPolicy,
    t: &Target<'_>,
    now: Timestamp,
) -> (Arc<Tracking>, Observed) {
    let tracking = Arc::new(Tracking::new(
        ctx.sources(),
        ctx.memory.records.clone(),
        t.key.clone(),
        &p.name,
    ));
    let observed = Observed {
        readings: Default::default(),
        target: t.cached.clone(),
        view: tracking.clone(),
        now,
    };
    (tracking, observed)
}

/// A policy's decision (or finalize), its script time measured.
fn timed_decision(
    ctx: &Context,
    p: &CompiledPolicy,
    observed: &Observed,
    hook: Hook,
) -> (Result<decide::Decision, decide::DecideError>, Vec<String>) {
    let started = Instant::now();
    let (decision, wanted) = match hook {
        Hook::Reconcile => decide::decide_wanting(&ctx.engine, p, observed),
        Hook::Finalize => (decide::finalize(&ctx.engine, p, observed), Vec::new()),
        Hook::Deleted => (decide::deleted(&ctx.engine, p, observed), Vec::new()),
    };
    let took = started.elapsed();
    ctx.fair.spent(&p.id, took);
    ctx.metrics
        .script_seconds
        .get_or_create(&Metrics::labels(&[("policy", &p.id)]))
        .observe(took.as_secs_f64());
    (decision, wanted)
}

/// Where Runbook's state of a target is kept apart from it, when it is:
/// a kind whose schema is not Runbook's, once the server serves the
/// state's kind.
fn state_apart(ctx: &Context, key: &TargetKey) -> Option<(String, String)> {
    (!runbook_core::plan::state::owns_schema(&key.kind)
        && ctx
            .memory
            .states_served
            .load(std::sync::atomic::Ordering::Acquire))
    .then(|| state_location(ctx, &key.kind, key))
}

/// Keep which status fields of `kind` the API server dropped from a
/// policy's writes (and which it kept again), for the next write.
fn note_dropped(ctx: &Context, p: &CompiledPolicy, kind: &KindRef, outcome: &act::Outcome) {
    if outcome.dropped.is_empty() && outcome.kept.is_empty() {
        return;
    }
    ctx.memory
        .note_dropped(&p.id, kind, &outcome.dropped, &outcome.kept);
}

/// How a policy may act now: shadow, enforcing, or suspended while its
/// circuit breaker is open.
fn mode_of(ctx: &Context, p: &CompiledPolicy, now: Timestamp) -> Acting {
    let mode = match p.mode {
        policy::Mode::Shadow => Acting::Shadow,
        policy::Mode::Enforce => {
            let open = p
                .limits
                .circuit_breaker
                .as_ref()
                .and_then(|cb| ctx.memory.breaker_open(&p.id, cb, now.as_millisecond()));
            open.map_or(Acting::Enforce, Acting::Suspended)
        }
    };
    ctx.metrics
        .circuit_open
        .get_or_create(&Metrics::labels(&[("policy", &p.id)]))
        .set(matches!(mode, Acting::Suspended(_)) as i64);
    mode
}

/// Count what a decision did (metrics, and the circuit breaker's errors).
fn count(ctx: &Context, p: &CompiledPolicy, now: Timestamp, outcome: &act::Outcome) {
    let m = &ctx.metrics;
    for (verb, result) in &outcome.results {
        let labels = [
            ("policy", p.id.as_str()),
            ("action", verb),
            ("result", result),
        ];
        m.actions.get_or_create(&Metrics::labels(&labels)).inc();
    }
    for (verb, _) in &outcome.refused {
        let labels = [("policy", p.id.as_str()), ("action", verb.as_str())];
        m.refusals.get_or_create(&Metrics::labels(&labels)).inc();
    }
    m.writes.inc_by(u64::from(outcome.writes));
    for field in &outcome.dropped {
        let labels = [("policy", p.id.as_str()), ("field", field.as_str())];
        m.status_dropped
            .get_or_create(&Metrics::labels(&labels))
            .inc();
    }
    if let (Some(cb), policy::Mode::Enforce) = (&p.limits.circuit_breaker, p.mode) {
        let failed = outcome.failure.is_some();
        ctx.memory
            .breaker_record(&p.id, cb, now.as_millisecond(), failed);
    }
}

/// Keep a shadow policy's decision for inspection (the newest thousand).
fn keep_shadow(
    ctx: &Context,
    p: &CompiledPolicy,
    key: &TargetKey,
    now: Timestamp,
    outcome: &act::Outcome,
) {
    tracing::info!(policy = %p.id, version = %p.version, target = %format!("{}/{}", key.namespace, key.name), actions = ?outcome.record.actions, "shadow decision");
    let record = ShadowRecord {
        time: runbook_core::util::time::format(now),
        target: format!("{} {}/{}", key.kind, key.namespace, key.name),
        record: outcome.record.clone(),
    };
    ctx.memory.keep_shadow(record, 1000);
}

/// What a caught panic said.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

fn key_of(kind: &KindRef, obj: &RawObject) -> TargetKey {
    TargetKey {
        kind: kind.clone(),
        namespace: obj.meta.namespace.clone().unwrap_or_default(),
        name: obj.meta.name.clone().unwrap_or_default(),
    }
}

/// Reconcile one target (what the kind's controller calls).
pub(super) async fn reconcile(
    obj: Arc<RawObject>,
    ctx: Arc<Context>,
    kind: KindRef,
) -> Result<Action, ReconcileError> {
    let key = key_of(&kind, &obj);
    {
        let mut pending = lock(&ctx.queue.pending);
        pending.remove(&key);
        ctx.metrics.queue_depth.set(pending.len() as i64);
    }
    let began = tokio::time::Instant::now();
    tracing::debug!(kind = %kind, namespace = %key.namespace, name = %key.name, "reconcile");
    // Sharded: a target moving away, or not this replica's, is left.
    if let Some(action) =
        super::shard::admit(&ctx, &kind, &key.namespace, &key.name, &obj.labels).await
    {
        tracing::debug!(kind = %kind, namespace = %key.namespace, name = %key.name, ?action, "not decided here");
        return Ok(action);
    }
    // Sharded, an unplaced target is decided where the published ring
    // places it (`shard::takeover`), before the assigner labels it for
    // this replica: decided as if labelled so, its children and state
    // carry the label they will keep, and the label's arrival decides
    // nothing again. (One that cannot be used is reported as it came.)
    let shard = runbook_core::shard::SHARD_LABEL;
    let unplaced = obj.label(shard).is_none() && obj.undecodable.is_none();
    let obj = match ctx.config.shards && unplaced {
        true => Arc::new(obj.with_label(shard, &ctx.config.identity)),
        false => obj,
    };
    pass_on_change(&ctx, &kind, &key, &obj);
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
    // Counted while it runs, and uncounted however it ends (a replica
    // that steps down drops its reconciles mid-way).
    struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
    ctx.queue.in_flight.fetch_add(1, Ordering::AcqRel);
    let in_flight = InFlight(&ctx.queue.in_flight);
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
            Err(caught(&ctx, &obj, &key, what).await)
        }
    };
    drop(in_flight);
    ctx.queue.activity.fetch_add(1, Ordering::AcqRel);
    tracing::debug!(kind = %kind, namespace = %key.namespace, name = %key.name, ms = began.elapsed().as_millis() as u64, "reconciled");
    result
}

/// A target kind that other policies own, read or mutate has no cache of
/// its own sending changes (its controller's store serves it), so its
/// changes, which each bring a reconcile here, are passed on: a
/// DatabaseBackup's progress wakes the DatabaseCluster that owns it.
fn pass_on_change(ctx: &Context, kind: &KindRef, key: &TargetKey, obj: &RawObject) {
    let watched_by_others = ctx
        .policies
        .load()
        .policies
        .values()
        // A policy that owns its own target kind (its children in other
        // namespaces) hears of its children's changes too.
        .any(|p| {
            (p.target != *kind && p.kinds.declares(kind))
                || (p.target == *kind && p.kinds.has(kind, runbook_core::kinds::Role::Owns))
        });
    if !watched_by_others {
        return;
    }
    let _ = ctx.queue.changes.send(crate::observe::cache::Change {
        kind: kind.clone(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        owners: crate::observe::cache::owners_of(obj),
        version: Some(obj.resource_version().to_string()),
    });
}

/// A panic caught in a reconcile: counted, logged, told on the target.
async fn caught(ctx: &Context, obj: &RawObject, key: &TargetKey, what: String) -> ReconcileError {
    ctx.metrics
        .panics
        .get_or_create(&Metrics::labels(&[("kind", &key.kind.kind)]))
        .inc();
    let message =
        format!("internal error while reconciling (a bug in Runbook, please report it): {what}");
    tracing::error!(kind = %key.kind, namespace = %key.namespace, name = %key.name, "{message}");
    let note = warning("InternalError", message.clone());
    ctx.writer().event(&obj.value(), &note).await;
    ReconcileError::Panic(message)
}

/// How long a reconcile waits for the cache to show its own status write
/// before it decides on what the cache shows (a watch that lost the
/// event, a write the server turned into something else).
pub const CACHE_WAIT: Duration = Duration::from_secs(30);

/// How long a target whose RunbookState was removed waits before it is
/// decided on without it.
pub(super) const STATE_GONE_WAIT: Duration = Duration::from_secs(30);

/// How much longer to wait before deciding on `obj`, whose RunbookState
/// was just removed: decided now, on the target the cache still holds
/// while its own deletion is on its way, it would be decided as if seen
/// for the first time (`ctx.previous` is `()`, a schedule's first run).
fn state_gone(ctx: &Context, obj: &RawObject) -> Option<Duration> {
    let uid = obj.meta.uid.as_deref()?;
    let gone = lock(&ctx.memory.states_gone);
    let since = gone.get(uid)?.elapsed();
    STATE_GONE_WAIT.checked_sub(since).filter(|d| !d.is_zero())
}

/// Read our own writes: deciding on a status the cache has not caught up
/// with would repeat what the last decision did. The wait is bounded by
/// [`CACHE_WAIT`]; reaching it is logged and counted.
fn cache_lags(ctx: &Context, obj: &RawObject, key: &TargetKey) -> bool {
    match ctx.memory.records.status_written(key) {
        Some((before, since)) if before.iter().any(|rv| rv == obj.resource_version()) => {
            if since.elapsed() < CACHE_WAIT {
                tracing::debug!(kind = %key.kind, namespace = %key.namespace, name = %key.name, "waiting for the cache to show the last status write");
                return true;
            }
            tracing::info!(kind = %key.kind, namespace = %key.namespace, name = %key.name,
                "the cache did not show the last status write within {}s; deciding on what it shows",
                CACHE_WAIT.as_secs());
            ctx.metrics
                .cache_waits_ended
                .get_or_create(&Metrics::labels(&[
                    ("kind", &key.kind.kind),
                    ("wait", "status"),
                ]))
                .inc();
            ctx.memory.records.status_settled(key);
            false
        }
        Some(_) => {
            ctx.memory.records.status_settled(key);
            false
        }
        None => false,
    }
}

/// What the policies of one reconcile leave to do: when to come back, and
/// the last error (each failed policy's backoff is in the requeue).
#[derive(Default)]
struct Next {
    requeue_ms: Option<i64>,
    failure: Option<Failed>,
    /// The versions of the target the status writes replaced: while the
    /// cache shows one of them, it lags behind.
    written_over: Vec<String>,
}

impl Next {
    fn requeue(&mut self, ms: i64) {
        self.requeue_ms = Some(self.requeue_ms.map_or(ms, |r| r.min(ms)));
    }

    /// A policy failed on the target: it comes back after its own
    /// backoff, which grows with its own consecutive failures there.
    fn failed(&mut self, ctx: &Context, key: &TargetKey, policy: &str, failure: Failed) {
        let n = ctx
            .memory
            .records
            .failed(key, Failing::Policy(policy.to_string()));
        let delay = backoff(
            ctx.config.backoff_base,
            failure.cause.longest_backoff(ctx.config.backoff_max),
            n,
            &format!("{}/{}/{}#{policy}", key.kind, key.namespace, key.name),
        );
        self.requeue(delay.as_millis() as i64);
        count_failure(ctx, &key.kind, policy, failure.cause);
        self.failure = Some(failure);
    }

    /// A policy succeeded on the target: its backoff starts over.
    fn succeeded(ctx: &Context, key: &TargetKey, policy: &str) {
        ctx.memory
            .records
            .succeeded(key, &Failing::Policy(policy.to_string()));
    }
}

/// What one target's reconcile shares between its policies.
pub(super) struct Target<'a> {
    /// The target as decisions see it: with Runbook's state laid over its
    /// status where that state is kept apart.
    pub cached: Arc<runbook_core::observe::CachedObject>,
    pub key: &'a TargetKey,
    pub resolved: Resolved,
    pub set: Arc<PolicySet>,
    /// Runbook's state of the target, for a kind whose schema is not
    /// Runbook's.
    pub apart: Option<runbook_core::plan::state::Apart>,
}

/// The kind Runbook keeps its state of targets in.
pub fn state_kind() -> KindRef {
    KindRef::new("runbook.dev/v1alpha1", "RunbookState")
}

/// Where Runbook's state of a target is kept apart: the target's
/// namespace (for a cluster-scoped one, the namespace watched, or else the
/// operator's), and a name from its kind and name.
fn state_location(ctx: &Context, kind: &KindRef, key: &TargetKey) -> (String, String) {
    let namespace = if key.namespace.is_empty() {
        ctx.config
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| ctx.config.operator_namespace.clone())
    } else {
        key.namespace.clone()
    };
    let name = runbook_core::crd::state::name_for(kind.group(), &kind.kind, &key.name);
    (namespace, name)
}

/// Runbook's state of a target whose kind's schema is not Runbook's: the
/// `RunbookState` as the cache shows it, or as this process last wrote it
/// while the cache still shows what that write replaced. A state left by
/// an earlier object of the target's name (another uid) is not its.
pub(super) async fn apart_of(
    ctx: &Context,
    kind: &KindRef,
    key: &TargetKey,
    target: &runbook_core::observe::CachedObject,
) -> Result<Option<runbook_core::plan::state::Apart>, ReconcileError> {
    if runbook_core::plan::state::owns_schema(kind)
        || !ctx
            .memory
            .states_served
            .load(std::sync::atomic::Ordering::Acquire)
    {
        return Ok(None);
    }
    let (namespace, name) = state_location(ctx, kind, key);
    let cache = lock(&ctx.running.informers)
        .get(&state_kind())
        .map(|i| i.cache.clone());
    let mut cached = cache
        .and_then(|c| c.get(&namespace, &name))
        .map(|o| o.shared());
    // Sharded, the cache holds only the states labelled for this
    // replica's share. The state of a target that just moved here still
    // carries its last replica's label (or none, written before running
    // sharded), so one missing is read from the API server; the write
    // that follows the decision labels it for this replica. Not for a
    // target whose own status holds Runbook's records: its kind keeps
    // Runbook's fields there, and it has no state apart.
    // Nor for a target placed here at its creation and here since
    // (`shard::PLACED_ANNOTATION`): any state of it carries this
    // replica's label, and the cache answers.
    let may_be_apart = runbook_core::plan::state::built_in(kind)
        || ctx.memory.is_pruning(kind)
        || target.value().pointer("/status/decisions").is_none();
    if cached.is_none()
        && ctx.config.shards
        && may_be_apart
        && !runbook_core::shard::placed_since_creation(target.value(), &ctx.config.identity)
        && ctx.memory.records.state_written(key).is_none()
    {
        cached = read_state(ctx, &namespace, &name).await?;
    }
    let cached_version = cached
        .as_deref()
        .and_then(|s| s.pointer("/metadata/resourceVersion"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let state = match ctx.memory.records.state_written(key) {
        Some((before, written)) if before == cached_version || cached.is_none() => Some(written),
        Some(_) => {
            ctx.memory.records.state_settled(key);
            cached
        }
        None => cached,
    };
    let state = state
        .filter(|s| s.pointer("/spec/target/uid").and_then(Value::as_str) == Some(target.uid()));
    // Kept in the status while the kind's status keeps what Runbook
    // writes there, and no state of the target exists apart.
    let apart =
        state.is_some() || runbook_core::plan::state::built_in(kind) || ctx.memory.is_pruning(kind);
    if !apart {
        return Ok(None);
    }
    Ok(Some(runbook_core::plan::state::Apart {
        namespace,
        name,
        state,
        target: target.shared(),
    }))
}

/// A `RunbookState` as the API server holds it now; `None` when there is
/// none.
async fn read_state(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<Arc<Value>>, ReconcileError> {
    let api: kube::Api<kube::core::DynamicObject> =
        kube::Api::namespaced_with(ctx.client.clone(), namespace, &state_kind().api_resource());
    let found = api
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::State {
            name: format!("{namespace}/{name}"),
            source,
        })?;
    Ok(found.map(|mut o| {
        o.metadata.managed_fields = None;
        Arc::new(serde_json::to_value(o).unwrap_or_default())
    }))
}

/// Whether the operator reconciles where `key` acts: a Namespace acts
/// in itself, so an operator that reconciles one namespace leaves the
/// other Namespaces.
pub(super) fn within_scope(ctx: &Context, key: &TargetKey) -> bool {
    let acting = runbook_core::observe::acting_namespace_of(&key.kind, &key.namespace, &key.name);
    match ctx.config.namespace.as_deref() {
        Some(only) if !only.is_empty() && key.namespace.is_empty() && !acting.is_empty() => {
            acting == only
        }
        _ => true,
    }
}

async fn reconcile_target(
    obj: &RawObject,
    ctx: &Arc<Context>,
    kind: &KindRef,
    key: &TargetKey,
) -> Result<Action, ReconcileError> {
    if cache_lags(ctx, obj, key) {
        // The watch event of that write reconciles again; the requeue is a
        // backstop, at the end of the wait.
        return Ok(Action::requeue(CACHE_WAIT));
    }
    if let Some(left) = state_gone(ctx, obj) {
        // Its deletion reaching the controller ends this; a state removed
        // by hand is made again after the wait.
        return Ok(Action::requeue(left));
    }
    let set = ctx.policies.load_full();
    let cached = obj.cached();
    let present = runbook_core::observe::finalizers_of(cached.value());
    // The policies that select the target, and those it has left (its
    // labels or annotations no longer match) still holding their
    // finalizer on it: they finalize it and take the finalizer off.
    let mut leaving: Vec<String> = Vec::new();
    let policies: Vec<Arc<CompiledPolicy>> = set
        .for_target(kind)
        .into_iter()
        .filter(|p| {
            let selects = p.selects(cached.value())
                && p.acts_in(&key.namespace)
                && within_scope(ctx, key)
                && !(p.kinds.has(kind, runbook_core::kinds::Role::Owns)
                    && runbook_core::observe::made_by(&p.name, cached.value()));
            let left = !selects && present.contains(&finalizer_name(&p.name));
            if left {
                leaving.push(p.name.clone());
            }
            selects || left
        })
        .collect();
    if policies.is_empty() {
        ctx.memory.records.no_policy_applies(key);
        return Ok(Action::await_change());
    }
    ctx.memory
        .records
        .keep_only(key, policies.iter().map(|p| p.id.as_str()));
    let resolved =
        ctx.resources
            .resolve(kind)
            .await
            .map_err(|source| ReconcileError::Discovery {
                kind: kind.clone(),
                source,
            })?;
    let apart = apart_of(ctx, kind, key, &cached).await?;
    let cached = match &apart {
        Some(a) => runbook_core::observe::CachedObject::new(a.overlaid()),
        None => cached,
    };
    let mut target = Target {
        cached,
        key,
        resolved,
        set,
        apart,
    };
    let deleting = obj.meta.deletion_timestamp.is_some();
    let mut next = Next::default();
    let early = each_policy(ctx, &policies, &mut target, deleting, &leaving, &mut next).await;
    if !next.written_over.is_empty() {
        let over = std::mem::take(&mut next.written_over);
        ctx.memory
            .records
            .wrote_status(key, (over, tokio::time::Instant::now()));
    }
    if let Some(action) = early? {
        return Ok(action);
    }
    if let Some(f) = &next.failure {
        // Each failed policy is retried on its own backoff (in the
        // requeue); the others keep their own times.
        tracing::debug!(error = %f, label = f.cause.label(), delay_ms = next.requeue_ms, "reconcile failed; retrying");
    }
    ctx.memory.records.succeeded(key, &Failing::Reconcile);
    Ok(match next.requeue_ms {
        Some(ms) => Action::requeue(Duration::from_millis(ms.max(1) as u64)),
        None => Action::await_change(),
    })
}

/// A sweep's decision (see `sweeps.rs`) on the target made up for it:
/// its policy's name in its policy's namespace, with what Runbook keeps
/// of it laid over it. `Some(ms)`: decide it again after that long (its
/// next fire time, or a failure's backoff).
pub(super) async fn decide_sweep(
    ctx: &Context,
    p: &Arc<CompiledPolicy>,
    key: &TargetKey,
) -> Result<Option<i64>, ReconcileError> {
    let uid = format!(
        "sweep-{}",
        runbook_core::util::hash::short_hex(p.id.as_bytes(), 16)
    );
    let made_up = |created: &str| {
        runbook_core::observe::CachedObject::new(serde_json::json!({
            "apiVersion": key.kind.api_version,
            "kind": key.kind.kind,
            "metadata": {
                "name": key.name,
                "namespace": key.namespace,
                "uid": uid,
                "creationTimestamp": created,
            },
        }))
    };
    // Its first run belongs to when its record was made (or, before
    // there is one, to now).
    let now = runbook_core::util::time::format(ctx.clock.now());
    let Some(mut apart) = apart_of(ctx, &key.kind, key, &made_up(&now)).await? else {
        return Err(ReconcileError::NoStateKind);
    };
    if let Some(created) = apart
        .state
        .as_deref()
        .and_then(|s| s.pointer("/metadata/creationTimestamp"))
        .and_then(Value::as_str)
    {
        apart.target = made_up(created).shared();
    }
    let mut target = Target {
        cached: runbook_core::observe::CachedObject::new(apart.overlaid()),
        key,
        resolved: sweep_resolved(&key.kind),
        set: ctx.policies.load_full(),
        apart: Some(apart),
    };
    let mut next = Next::default();
    let ended = each_policy(
        ctx,
        std::slice::from_ref(p),
        &mut target,
        false,
        &[],
        &mut next,
    )
    .await?;
    debug_assert!(ended.is_none(), "a sweep adds no finalizer");
    Ok(next.requeue_ms)
}

/// How a sweep's made-up kind would be served: it never is, and nothing
/// is written to it (its record goes to its `RunbookState`).
fn sweep_resolved(kind: &KindRef) -> Resolved {
    Resolved {
        resource: kube::core::ApiResource {
            group: kind.group().to_string(),
            version: kind.version().to_string(),
            api_version: kind.api_version.clone(),
            kind: kind.kind.clone(),
            plural: kind.plural(),
        },
        namespaced: true,
        status_subresource: false,
    }
}

/// Run each policy on the target in turn, each deciding on the status the
/// one before left; `Some` when the reconcile ends early (a finalizer
/// added: its watch event reconciles again).
async fn each_policy(
    ctx: &Context,
    policies: &[Arc<CompiledPolicy>],
    target: &mut Target<'_>,
    deleting: bool,
    leaving: &[String],
    next: &mut Next,
) -> Result<Option<Action>, ReconcileError> {
    let present = runbook_core::observe::finalizers_of(target.cached.value());
    for p in policies {
        let ending = deleting || leaving.contains(&p.name);
        let key = target.key;
        // The span is the decision's future's own: entered only while it
        // runs, on whichever worker thread polls it (a guard held across
        // an await would leave it entered on the thread it left).
        let span = tracing::info_span!("reconcile", policy = %p.id, version = %p.version, kind = %key.kind.kind, namespace = %key.namespace, name = %key.name);
        let early = one_policy(ctx, p, target, ending, &present, next)
            .instrument(span)
            .await?;
        if early.is_some() {
            return Ok(early);
        }
    }
    Ok(None)
}

/// One policy on the target (see `each_policy`): `Some` when the
/// reconcile ends here. `ending`: the target is being deleted, or the
/// policy no longer selects it.
async fn one_policy(
    ctx: &Context,
    p: &Arc<CompiledPolicy>,
    target: &mut Target<'_>,
    ending: bool,
    present: &[String],
    next: &mut Next,
) -> Result<Option<Action>, ReconcileError> {
    let key = target.key;
    let fin = finalizer_name(&p.name);
    if ending {
        if present.contains(&fin) {
            finalize_policy(ctx, p, target, &fin, next).await?;
        }
        return Ok(None);
    }
    if p.has_finalizer()
        && p.mode == policy::Mode::Enforce
        && !present.contains(&fin)
        && writes_elsewhere(ctx, p, target)
    {
        let (kind, value) = (&target.resolved, target.cached.value());
        finalizers(ctx, p, kind, value, Finalizer::Add(&fin)).await?;
        return Ok(Some(Action::await_change()));
    }
    let (after, state_after, pruned) = reconcile_policy(ctx, p, target, next).await;
    if pruned && ctx.memory.mark_pruning(&key.kind) {
        tracing::info!(kind = %key.kind, "the status of this kind prunes what Runbook keeps there: its targets' state is kept in RunbookStates");
    }
    if state_after.is_some() && target.apart.is_none() {
        // Moved apart by this write: the state's place.
        let (namespace, name) = state_location(ctx, &key.kind, key);
        target.apart = Some(runbook_core::plan::state::Apart {
            namespace,
            name,
            state: None,
            target: Arc::new(
                after
                    .clone()
                    .unwrap_or_else(|| target.cached.value().clone()),
            ),
        });
    }
    if let (Some(state), Some(apart)) = (state_after, target.apart.as_mut()) {
        let before = apart
            .state
            .as_deref()
            .and_then(|s| s.pointer("/metadata/resourceVersion"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let state = Arc::new(state);
        ctx.memory.records.wrote_state(key, (before, state.clone()));
        apart.state = Some(state);
        if after.is_none() {
            target.cached = runbook_core::observe::CachedObject::new(apart.overlaid());
        }
    }
    if let Some(after) = after {
        let before = target.cached.value()["metadata"]["resourceVersion"].as_str();
        let now = after["metadata"]["resourceVersion"].as_str();
        // A write the server made nothing of (what it holds already, or
        // what its schema prunes) gets no new version: the cache shows
        // it already, and waiting for a newer one would never end.
        if let Some(before) = before
            && now != Some(before)
        {
            next.written_over.push(before.to_string());
        }
        target.cached = match target.apart.as_mut() {
            Some(apart) => {
                apart.target = Arc::new(after);
                runbook_core::observe::CachedObject::new(apart.overlaid())
            }
            None => runbook_core::observe::CachedObject::new(after),
        };
    }
    Ok(None)
}

/// Whether the policy's decision on the target now writes to another
/// object, so that the target needs the policy's finalizer first: its
/// `finalize` has something to undo only once the policy has made or
/// changed something beside the target. Decided without recording it
/// (the reconcile after the finalizer's write decides again); a
/// decision that would only repeat the last one (which wrote nothing
/// elsewhere, or the finalizer would be there) is not made.
fn writes_elsewhere(ctx: &Context, p: &CompiledPolicy, t: &Target<'_>) -> bool {
    let now = ctx.clock.now();
    if repeats(ctx, p, t, now).is_some() {
        return false;
    }
    let observed = Observed {
        readings: Default::default(),
        target: t.cached.clone(),
        view: Arc::new(ctx.sources()),
        now,
    };
    decide::decide(&ctx.engine, p, &observed)
        .is_ok_and(|d| d.actions.iter().any(|a| a.action.limited_verb().is_some()))
}

/// A policy's `finalize` on a target being deleted, or that the policy no
/// longer selects; once it asks for no more writes, its finalizer is
/// removed.
async fn finalize_policy(
    ctx: &Context,
    p: &CompiledPolicy,
    t: &Target<'_>,
    fin: &str,
    next: &mut Next,
) -> Result<(), ReconcileError> {
    let cached = &t.cached;
    let Some(_turn) = turn(ctx, p, next) else {
        return Ok(());
    };
    let outcome = run_policy(ctx, p, t, Hook::Finalize).await;
    let work_left = !outcome.results.is_empty();
    if let Some(f) = outcome.failure {
        next.failed(ctx, t.key, &p.name, f);
    } else if !work_left && p.mode == policy::Mode::Enforce {
        finalizers(ctx, p, &t.resolved, cached.value(), Finalizer::Remove(fin)).await?;
    } else {
        next.requeue(5_000);
    }
    Ok(())
}

/// `Some` when deciding `p` on `t` at `now` would repeat its last
/// decision there, with how long after now it asked to be made again.
fn repeats(
    ctx: &Context,
    p: &CompiledPolicy,
    t: &Target<'_>,
    now: Timestamp,
) -> Option<Option<i64>> {
    let mode = mode_of(ctx, p, now);
    let at = super::unchanged::Now {
        target: t.cached.value(),
        mode: &mode,
        resyncs: ctx.queue.resyncs.load(Ordering::Acquire),
        now,
    };
    ctx.memory.records.repeats(t.key, p, &at)
}

/// Whether the last decision of `p` on the target would only be made
/// again (nothing it read changed since): then it is not, and the time it
/// asked to come back at still holds.
fn unchanged(ctx: &Context, p: &CompiledPolicy, t: &Target<'_>, next: &mut Next) -> bool {
    let now = ctx.clock.now();
    let Some(requeue) = repeats(ctx, p, t, now) else {
        return false;
    };
    tracing::debug!("nothing the last decision read changed: not decided again");
    if ctx.config.check_skips {
        check_skip(ctx, p, t, now);
    }
    ctx.metrics
        .unchanged
        .get_or_create(&Metrics::labels(&[("policy", &p.id)]))
        .inc();
    if let Some(ms) = requeue {
        next.requeue(ms);
    }
    true
}

/// Check a skip: decide again (nothing is carried out) and compare with the
/// last decision, which the skip takes as what deciding again would give.
/// A difference means the decision read something that was not written
/// down (a function that reads the clock, or the target, unrecorded): it
/// is told and counted, and the skip stands, so that checking changes
/// nothing of what the operator does.
fn check_skip(ctx: &Context, p: &CompiledPolicy, t: &Target<'_>, now: Timestamp) {
    let Some(before) = ctx.memory.records.decided(t.key, p) else {
        return;
    };
    let observed = Observed {
        readings: Default::default(),
        target: t.cached.clone(),
        view: Arc::new(ctx.sources()),
        now,
    };
    let again = match decide::decide(&ctx.engine, p, &observed) {
        Ok(d) => super::unchanged::effects(&d),
        Err(e) => format!("an error: {e}"),
    };
    if *before == *again {
        return;
    }
    let key = t.key;
    let told = format!(
        "policy {} on {} {}/{}: a reconcile skipped as unchanged decides differently \
         (the decision read something that was not recorded); before: {}; now: {}",
        p.name,
        key.kind,
        key.namespace,
        key.name,
        cut(&before),
        cut(&again),
    );
    tracing::error!("{told}");
    ctx.metrics
        .skip_differences
        .get_or_create(&Metrics::labels(&[("policy", &p.id)]))
        .inc();
    lock(&ctx.skip_differences).push(told);
}

/// The first 300 characters of a decision's text.
fn cut(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// The policy's turn to decide, within its fair share; `None` puts its
/// decision off until it has room (the target comes back then).
fn turn<'a>(
    ctx: &'a Context,
    p: &'a CompiledPolicy,
    next: &mut Next,
) -> Option<super::fair::Turn<'a>> {
    let kind_shared = ctx
        .policies
        .load()
        .policies
        .values()
        .any(|q| q.target == p.target && q.id != p.id);
    match ctx.fair.take(&p.id, kind_shared) {
        Ok(turn) => Some(turn),
        Err((wait, limit)) => {
            tracing::debug!(
                limit = limit.label(),
                wait_ms = wait.as_millis() as u64,
                "the policy is at its share: decided later"
            );
            next.requeue(wait.as_millis().max(1) as i64);
            None
        }
    }
}

/// A policy's decision on a live target, counted; the target as its
/// status write left it, if it wrote one, and Runbook's state of it as
/// its write left it, if it wrote that.
async fn reconcile_policy(
    ctx: &Context,
    p: &CompiledPolicy,
    t: &Target<'_>,
    next: &mut Next,
) -> (Option<Value>, Option<Value>, bool) {
    let started = Instant::now();
    if unchanged(ctx, p, t, next) {
        return (None, None, false);
    }
    let Some(_turn) = turn(ctx, p, next) else {
        return (None, None, false);
    };
    let outcome = run_policy(ctx, p, t, Hook::Reconcile).await;
    let result = if outcome.failure.is_some() {
        "error"
    } else {
        "ok"
    };
    ctx.metrics
        .reconciles
        .get_or_create(&Metrics::labels(&[("policy", &p.id), ("result", result)]))
        .inc();
    ctx.metrics
        .reconcile_seconds
        .get_or_create(&Metrics::labels(&[("policy", &p.id)]))
        .observe(started.elapsed().as_secs_f64());
    if let Some(ms) = outcome.requeue_ms {
        next.requeue(ms);
    }
    match outcome.failure {
        Some(f) => {
            tracing::warn!("{f}");
            next.failed(ctx, t.key, &p.name, f);
        }
        None => Next::succeeded(ctx, t.key, &p.name),
    }
    (outcome.target_after, outcome.state_after, outcome.pruned)
}

/// A failure counted by the target's kind, the policy that failed (empty
/// for a failure of the reconcile as a whole) and its cause.
fn count_failure(ctx: &Context, kind: &KindRef, policy: &str, cause: Cause) {
    ctx.metrics
        .failures
        .get_or_create(&Metrics::labels(&[
            ("kind", &kind.kind),
            ("policy", policy),
            ("cause", cause.label()),
        ]))
        .inc();
}

pub(super) fn error_policy(
    obj: Arc<RawObject>,
    err: &ReconcileError,
    ctx: Arc<Context>,
    kind: &KindRef,
) -> Action {
    let key = key_of(kind, &obj);
    let n = ctx.memory.records.failed(&key, Failing::Reconcile);
    let delay = backoff(
        ctx.config.backoff_base,
        ctx.config.backoff_max,
        n,
        &format!("{}/{}/{}", kind, key.namespace, key.name),
    );
    count_failure(&ctx, kind, "", err.cause());
    tracing::debug!(error = %err, label = err.cause().label(), attempt = n, delay_ms = delay.as_millis() as u64, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// Exponential backoff, capped, with ±20% jitter derived from the object
/// (so retries of many objects spread out, and a given object's are
/// reproducible).
pub fn backoff(base: Duration, max: Duration, attempt: u32, seed: &str) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let capped = exp.min(max);
    let h = runbook_core::util::hash::fnv64(format!("{seed}#{attempt}").as_bytes());
    let jitter = 0.8 + (h % 4001) as f64 / 10_000.0;
    capped.mul_f64(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forbidden_write_is_retried_within_half_a_minute() {
        let max = Duration::from_secs(300);
        let forbidden = Cause::Forbidden.longest_backoff(max);
        assert_eq!(forbidden, Duration::from_secs(30));
        assert_eq!(Cause::Conflict.longest_backoff(max), max);
        // Twenty failures in, the retry still comes within the bound
        // (with its jitter of at most +20%).
        let d = backoff(Duration::from_millis(100), forbidden, 20, "t");
        assert!(d <= Duration::from_secs(36), "{d:?}");
    }

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
