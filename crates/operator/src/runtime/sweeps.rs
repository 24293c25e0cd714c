//! Sweeps (`spec.sweep`): a policy decided once per fire time of its
//! schedule over every target it selects, instead of once per target.
//!
//! Each sweep is decided as one made-up target of the kind
//! `runbook_core::kinds::sweep_kind`, named after its policy, in its
//! policy's namespace (a tenant's own, else the operator's): its run
//! times, decision record, the limits' history and what its script writes
//! with `status` are kept in one `RunbookState`, and no target gets a
//! write of its own. This loop decides each sweep when its schedule fires
//! (the time its decision asks to come back at), when its policy changes,
//! and after a failure on the policy's backoff. A change of a target
//! wakes no sweep: it looks at them all at its next fire time.
//!
//! One replica decides a sweep: the leader, or (sharded) the one the ring
//! places the sweep on, and only once the cache of its kind has filled
//! (a sweep deciding on half a list could delete what it did not see).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::context::Context;
use crate::observe::view::TargetKey;
use runbook_core::kinds::KindRef;
use runbook_core::policy::compile::CompiledPolicy;
use runbook_core::util::lock;

/// How soon a sweep this replica may not decide yet (not leading, its
/// cache filling) is looked at again.
const LOOK_AGAIN: Duration = Duration::from_secs(2);

/// How long a sweep whose decision asks for no return waits at most.
const AT_MOST: Duration = Duration::from_secs(3600);

/// Decide each sweep of the policies in force when it is due, until the
/// operator stops.
pub(super) async fn run(ctx: Arc<Context>) {
    let mut stop = ctx.stop.clone();
    let changed = ctx.running.sweeps_changed.clone();
    // Each sweep's policy version last decided, and when it is due again.
    let mut due: HashMap<String, (String, Instant)> = HashMap::new();
    loop {
        let set = ctx.policies.load_full();
        due.retain(|id, _| set.policies.get(id).is_some_and(|p| p.sweep));
        let mut wake = Instant::now() + AT_MOST;
        for p in set.sweeps() {
            let now = Instant::now();
            let stale = due
                .get(&p.id)
                .is_none_or(|(version, at)| *version != p.version || *at <= now);
            if stale {
                let after = once(&ctx, p).await;
                due.insert(p.id.clone(), (p.version.clone(), Instant::now() + after));
            }
            if let Some((_, at)) = due.get(&p.id) {
                wake = wake.min(*at);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = changed.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Decide one sweep if this replica may now; how long until it is looked
/// at again.
async fn once(ctx: &Context, p: &Arc<CompiledPolicy>) -> Duration {
    let key = ctx.sweep_key(p);
    if !decides_here(ctx, &key) || !cache_filled(ctx, &p.target) {
        return LOOK_AGAIN;
    }
    // Counted while it runs, as a reconcile is (what waits for the
    // operator to settle waits for it too).
    ctx.queue.in_flight.fetch_add(1, Ordering::AcqRel);
    let span = tracing::info_span!("sweep", policy = %p.id, version = %p.version, kind = %p.target);
    let decided = super::reconcile::decide_sweep(ctx, p, &key)
        .instrument(span)
        .await;
    ctx.queue.in_flight.fetch_sub(1, Ordering::AcqRel);
    ctx.queue.activity.fetch_add(1, Ordering::AcqRel);
    let failing = super::records::Failing::Reconcile;
    match decided {
        Ok(next) => {
            ctx.memory.records.succeeded(&key, &failing);
            next.map_or(AT_MOST, |ms| Duration::from_millis(ms.max(1) as u64))
        }
        Err(e) => {
            tracing::warn!(policy = %p.id, "the sweep could not be decided: {e}");
            let n = ctx.memory.records.failed(&key, failing);
            super::reconcile::backoff(
                ctx.config.backoff_base,
                e.cause().longest_backoff(ctx.config.backoff_max),
                n,
                &format!("sweep/{}", p.id),
            )
        }
    }
}

/// Whether this replica decides the sweep: it leads, and (sharded) the
/// ring places the sweep here.
fn decides_here(ctx: &Context, key: &TargetKey) -> bool {
    if !ctx.health.leading.load(Ordering::Acquire) {
        return false;
    }
    if !ctx.config.shards {
        return true;
    }
    let ring_key =
        || runbook_core::shard::key(key.kind.group(), &key.kind.kind, &key.namespace, &key.name);
    ctx.running
        .placement
        .places_here(&ctx.config.identity, ring_key)
}

/// Whether the cache a sweep lists its targets from has filled: an
/// informer's, or the store of a controller of the same kind.
fn cache_filled(ctx: &Context, kind: &KindRef) -> bool {
    if let Some(i) = lock(&ctx.running.informers).get(kind) {
        return i.cache.is_synced();
    }
    lock(&ctx.running.targets).contains_key(kind)
}
