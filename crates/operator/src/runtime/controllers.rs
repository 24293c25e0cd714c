//! A controller per target kind: its watch, its reflector and its
//! reconciles, supervised (a controller whose task ends is restarted).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};

use super::context::{Context, TargetController};
use super::reconcile::{error_policy, panic_message, reconcile};
use crate::observe::health::{WatchBackoff, WatchHealth, report_watch};
use crate::observe::index::TargetIndex;
use crate::telemetry::Metrics;
use crate::util::channel;
use runbook_core::kinds::KindRef;
use runbook_core::observe::RawObject;
use runbook_core::util::lock;

/// Start the controller of one target kind: its watch, its reflector and
/// its reconciles. A panic that escapes the controller (anywhere but a
/// reconcile, which catches its own) is caught here and kept as the reason
/// the task ended; the supervisor (`Context::restart_ended`) restarts it.
pub(super) fn spawn_target(
    ctx: &Arc<Context>,
    k: &KindRef,
    selector: Option<String>,
) -> TargetController {
    let (ar, namespaced) = ctx.resources.served_as(k);
    // Shared: every key of the store and the queues holds it.
    let ar = Arc::new(ar);
    let reach = super::reach::Reach::of(ctx, &ctx.policies.load(), k);
    let namespaces = if namespaced {
        reach.namespaces(ctx)
    } else {
        Vec::new()
    };
    let apis = apis_of(ctx, k, &ar, &namespaces, reach.tenants());
    // Targets waiting to be reconciled after a change; past the capacity,
    // one drops and the whole kind is resynced instead.
    let (trigger, trigger_rx) = channel::bounded(ctx.config.queue_capacity);
    // One resync waiting is as good as many.
    let (resync, resync_rx) = channel::bounded(1);
    let mut stop = ctx.stop.clone();
    // The controller's own reflector, fed by a watch whose listed
    // objects take the kind of the watch (see `RawObject::stamp`).
    let writer = reflector::store::Writer::<RawObject>::new(ar.clone());
    let reader = writer.as_reader();
    // Lists of the kind read this index, kept from the same events.
    let index = Arc::new(TargetIndex::default());
    // Sharded, only this replica's own targets; those of gone members
    // by a watch beside it (`shares`).
    let watch = super::shard::watch_selector(ctx, selector.as_deref());
    let config = crate::observe::cache::watch_config(
        watch.as_deref(),
        ctx.config.shards,
        ctx.config.watch_timeout_secs,
    );
    let health = ctx.health.watches.clone();
    let own = watched_all(&health, &apis, &ar, &config);
    let events = match ctx.config.shards {
        true => super::shard::Shares::new(super::shard::Parts {
            me: ctx.config.identity.clone(),
            kind: k.to_string(),
            own,
            start_gone: gone_watch(ctx, apis, &ar, selector.clone()),
            places_here: places_here(ctx, k),
            watched: ctx.running.placement.unheld.subscribe(),
            store: reader.clone(),
            resource: ar.clone(),
        })
        .into_stream()
        .boxed(),
        false => own,
    };
    let objects =
        reflector::reflector(writer, indexed(ctx, k, events, index.clone())).applied_objects();
    let controller = Controller::for_stream_with(objects, reader, ar.clone())
        .trigger_backoff(WatchBackoff::default())
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
        .reconcile_on(trigger_rx.into_stream())
        .reconcile_all_on(resync_rx.into_stream())
        .graceful_shutdown_on(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
    let store = controller.store();
    let ended = Arc::new(Mutex::new(None));
    let task = tokio::spawn(run_controller(
        controller,
        ctx.clone(),
        k.clone(),
        ended.clone(),
    ));
    TargetController {
        resource: ar,
        selector,
        watch,
        namespaces,
        store,
        index,
        trigger,
        resync,
        task,
        ended,
        restarts: 0,
    }
}

/// The APIs a target kind is watched through, each with the name its
/// watch's health is reported under: one of every namespace (or the one
/// reconciled), or one per tenant's namespace.
fn apis_of(
    ctx: &Context,
    k: &KindRef,
    ar: &Arc<kube::core::ApiResource>,
    namespaces: &[String],
    tenants: bool,
) -> Vec<(Api<RawObject>, String)> {
    if namespaces.is_empty() {
        return vec![(Api::all_with(ctx.client.clone(), ar), k.to_string())];
    }
    namespaces
        .iter()
        .map(|ns| {
            let name = if tenants {
                let name = crate::observe::health::tenant_watch_name(&k.to_string(), ns);
                ctx.health.watches.of_tenant(&name, ns);
                name
            } else {
                k.to_string()
            };
            (Api::namespaced_with(ctx.client.clone(), ns, ar), name)
        })
        .collect()
}

/// The watches of a target kind through each of `apis`, as one stream.
fn watched_all(
    health: &Arc<WatchHealth>,
    apis: &[(Api<RawObject>, String)],
    ar: &kube::core::ApiResource,
    config: &watcher::Config,
) -> super::shard::Watch {
    crate::observe::merge::merged(
        apis.iter()
            .map(|(api, name)| {
                watched(
                    health.clone(),
                    name.clone(),
                    api.clone(),
                    ar,
                    config.clone(),
                )
                .boxed()
            })
            .collect(),
    )
}

/// A watch of a target kind: its health reported as `name`, and each
/// listed object stamped with the kind.
fn watched(
    health: Arc<WatchHealth>,
    name: String,
    api: Api<RawObject>,
    ar: &kube::core::ApiResource,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<RawObject>, watcher::Error>> + Send + 'static {
    let typed = ar.clone();
    watcher::watcher(api, config).map(move |e| {
        report_watch(&health, &name, e.as_ref().err());
        e.map(|e| e.modify(|o| o.stamp(&typed)))
    })
}

/// Sharded, the start of the watch of a kind's targets beside this
/// replica's own (`shares::Unheld`: gone members', and unplaced ones while
/// the ring decides for them): retried with its own backoff, its health
/// reported beside the kind's own watch, and cleared when it stops.
fn gone_watch(
    ctx: &Context,
    apis: Vec<(Api<RawObject>, String)>,
    ar: &kube::core::ApiResource,
    selector: Option<String>,
) -> super::shard::StartGone {
    let (health, ar) = (ctx.health.watches.clone(), ar.clone());
    let timeout = ctx.config.watch_timeout_secs;
    let apis: Vec<(Api<RawObject>, String)> = apis
        .into_iter()
        .map(|(api, name)| (api, format!("{name} (gone members' and unplaced targets)")))
        .collect();
    Box::new(move |unheld| {
        let Some(selector) = super::shard::unheld_selector(selector.as_deref(), unheld) else {
            for (_, name) in &apis {
                report_watch(&health, name, None);
            }
            return None;
        };
        // A gone member's share is listed from the API server's watch
        // cache, in one answer; the unplaced targets (every target, at
        // start-up) from storage a page at a time, as each replica lists
        // them all and keeps only its share: one answer of 10,000
        // targets grew each replica by about 6 MB that stayed.
        let from_cache = unheld.ring.is_none();
        let config = crate::observe::cache::watch_config(Some(&selector), from_cache, timeout);
        let watches: Vec<_> = apis
            .iter()
            .map(|(api, name)| {
                watched(
                    health.clone(),
                    name.clone(),
                    api.clone(),
                    &ar,
                    config.clone(),
                )
                .default_backoff()
                .boxed()
            })
            .collect();
        Some(crate::observe::merge::merged(watches))
    })
}

/// Sharded, whether the published ring places a gone member's target of
/// a kind on this replica (`shares` holds only those).
fn places_here(ctx: &Arc<Context>, k: &KindRef) -> super::shard::PlacesHere {
    let (ctx, k) = (ctx.clone(), k.clone());
    Box::new(move |o: &RawObject| {
        let key = || {
            runbook_core::shard::key(
                k.group(),
                &k.kind,
                o.meta.namespace.as_deref().unwrap_or(""),
                o.meta.name.as_deref().unwrap_or(""),
            )
        };
        ctx.running.placement.places_here(&ctx.config.identity, key)
    })
}

/// A target kind's events, after any merging: each kept in the kind's
/// index, a deleted child of another namespace's target told to it, and
/// a deleted target to the policies that hear of deletions.
fn indexed(
    ctx: &Arc<Context>,
    k: &KindRef,
    events: impl Stream<Item = Result<watcher::Event<RawObject>, watcher::Error>> + Send + 'static,
    index: Arc<TargetIndex>,
) -> impl Stream<Item = Result<watcher::Event<RawObject>, watcher::Error>> + Send + 'static {
    let (ctx, kind) = (ctx.clone(), k.clone());
    events.inspect(move |e| {
        if let Ok(event) = e {
            index.observe(event);
            if let watcher::Event::Delete(o) = event {
                gone_elsewhere(&ctx.queue.changes, &kind, o);
                super::deleted::heard(&ctx, &kind, o);
            }
        }
    })
}

/// A deleted object of a target kind that is a policy's child in another
/// namespace than its target's (no reconcile of it follows, as it is
/// gone): the target it was made for hears of it.
fn gone_elsewhere(
    changes: &crate::util::channel::Sender<crate::observe::cache::Change>,
    kind: &KindRef,
    o: &RawObject,
) {
    let owners: Vec<_> = crate::observe::cache::owners_of(o)
        .into_iter()
        .filter(|r| r.namespace.is_some())
        .collect();
    if owners.is_empty() {
        return;
    }
    let _ = changes.send(crate::observe::cache::Change {
        kind: kind.clone(),
        namespace: o.namespace().to_string(),
        name: o.name().to_string(),
        owners,
        version: None,
    });
}

/// Run a target kind's controller until it ends, keeping why in `ended`
/// (a panic outside a reconcile is caught here).
async fn run_controller(
    controller: Controller<RawObject>,
    ctx: Arc<Context>,
    kind: KindRef,
    ended: Arc<Mutex<Option<String>>>,
) {
    // However the task ends (returns, panics, is aborted), the
    // supervisor hears of it.
    struct Told(Arc<tokio::sync::Notify>);
    impl Drop for Told {
        fn drop(&mut self) {
            self.0.notify_one();
        }
    }
    let _told = Told(ctx.running.controller_ended.clone());
    let again = kind.clone();
    let run = controller
        .run(
            move |obj, ctx| reconcile(obj, ctx, kind.clone()),
            move |obj, err, ctx| error_policy(obj, err, ctx, &again),
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
    *lock(&ended) = Some(reason);
}

/// How long a controller that ended waits before its restart: 1 s, doubling
/// with each restart of the same kind, at most 30 s.
fn restart_delay(restarts: u32) -> Duration {
    Duration::from_secs(1u64 << restarts.min(5)).min(Duration::from_secs(30))
}

/// How often ended controllers are looked at again while one waits for
/// its restart (an ended one is told at once).
pub(super) const SUPERVISE_EVERY: Duration = Duration::from_millis(250);

impl Context {
    /// Restart the target controllers whose task ended on its own (a panic
    /// outside a reconcile, a stream that ended, an abort), each after
    /// `restart_delay`; until it runs again `/readyz` names it, and the
    /// restart is counted in `runbook_controller_restarts_total{kind}`.
    /// Whether one is still down, waiting for its restart.
    pub fn restart_ended(self: &Arc<Self>) -> bool {
        if *self.stop.borrow() {
            return false;
        }
        let mut waiting = false;
        let mut targets = lock(&self.running.targets);
        for (k, t) in targets.iter_mut() {
            if !t.task.is_finished() {
                continue;
            }
            let name = format!("controller of {k}");
            let reason = lock(&t.ended)
                .clone()
                .unwrap_or_else(|| "it was stopped".into());
            let down = self.health.watches.controller_ended(&name, &reason);
            if down.is_zero() {
                tracing::error!(kind = %k, "the {name} ended: {reason}; restarting it");
            }
            if down < restart_delay(t.restarts) {
                waiting = true;
                continue;
            }
            let restarts = t.restarts + 1;
            // What changed while it was down reaches its targets as a
            // relist, not as changes: every target is decided again.
            self.queue
                .resyncs
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            *t = spawn_target(self, k, t.selector.clone());
            t.restarts = restarts;
            self.metrics
                .controller_restarts
                .get_or_create(&Metrics::labels(&[("kind", &k.kind)]))
                .inc();
            self.health.watches.controller_restarted(&name);
            tracing::warn!(kind = %k, restarts, "restarted the {name}");
        }
        waiting
    }

    /// End the controller of `kind` as a fault would (for tests of the
    /// supervision): the supervisor restarts it.
    #[doc(hidden)]
    pub fn end_controller(&self, kind: &KindRef) {
        if let Some(t) = lock(&self.running.targets).get(kind) {
            t.task.abort();
        }
    }
}
