//! Deletions heard without a finalizer: a policy whose script defines
//! `fn deleted(ctx)` runs it once, at most, when a target it selects is
//! deleted, on the last state of the target the watch saw. Nothing waits
//! on it: a deletion this process did not see (it was down, its watch
//! was cut and listed again, the queue was full) is not heard, which the
//! docs say. A policy that must act on every deletion holds a finalizer
//! (`fn finalize`) instead.
//!
//! A watch's delete event is not always a deletion: an object that stops
//! matching the watch's label selector (the policies' selector, or the
//! shard label when another replica takes it) leaves it the same way.
//! So the object is looked up first, and one still there with its uid is
//! no deletion.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use tracing::Instrument;

use super::context::{Context, Gone};
use super::reconcile::{Hook, Target, apart_of, run_policy};
use crate::observe::view::TargetKey;
use crate::util::channel;
use runbook_core::alert::AlertSource;
use runbook_core::kinds::KindRef;
use runbook_core::observe::RawObject;
use runbook_core::policy::compile::CompiledPolicy;
use runbook_core::util::lock;

/// How long the alerts a `deleted` handler raises keep firing: their
/// target is gone, so nothing decides them again to resolve them, and
/// the sweep would resolve them before their group is first sent.
pub const DELETED_ALERTS_FIRE_FOR: Duration = Duration::from_secs(300);

/// The policies on `kind` that hear of `o`'s deletion.
fn hearing(ctx: &Context, kind: &KindRef, o: &RawObject) -> Vec<Arc<CompiledPolicy>> {
    let set = ctx.policies.load();
    let ns = o.meta.namespace.as_deref().unwrap_or("");
    let key = TargetKey {
        kind: kind.clone(),
        namespace: ns.to_string(),
        name: o.meta.name.clone().unwrap_or_default(),
    };
    if !super::reconcile::within_scope(ctx, &key) {
        return Vec::new();
    }
    let mut value = None;
    set.for_target(kind)
        .into_iter()
        .filter(|p| p.hears_deletions() && p.acts_in(ns))
        .filter(|p| p.selects(value.get_or_insert_with(|| o.value())))
        .collect()
}

/// A target kind's watch told of `o`'s deletion: queued for the policies
/// that hear of it, if any does.
pub(super) fn heard(ctx: &Context, kind: &KindRef, o: &RawObject) {
    if !ctx
        .policies
        .load()
        .for_target(kind)
        .iter()
        .any(|p| p.hears_deletions())
        || hearing(ctx, kind, o).is_empty()
    {
        return;
    }
    let gone = Gone {
        kind: kind.clone(),
        object: o.clone(),
    };
    if ctx.queue.deleted.send(gone) == channel::Sent::Dropped {
        tracing::warn!(kind = %kind, namespace = ?o.meta.namespace, name = ?o.meta.name, "the queue of deletions to tell is full: this one is not told");
        ctx.overflowed("deleted", 1, false);
    }
}

/// Tell the policies of each deletion queued, a few at a time, until the
/// queue closes or the operator stops.
pub(super) async fn run(ctx: Arc<Context>, rx: channel::Receiver<Gone>) {
    let mut stop = ctx.stop.clone();
    let at_once = usize::from(ctx.config.concurrency.max(1));
    let told = rx
        .into_stream()
        .for_each_concurrent(at_once, |g| tell(&ctx, g));
    tokio::select! {
        () = told => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

/// Whether `o` is still there with its uid (it left the watch's selector
/// and was not deleted); `None` when the API server could not say.
async fn still_there(ctx: &Context, kind: &KindRef, o: &RawObject) -> Option<bool> {
    let (ar, _) = ctx.resources.served_as(kind);
    let name = o.meta.name.as_deref().unwrap_or("");
    let api: kube::Api<kube::core::DynamicObject> = match o.meta.namespace.as_deref() {
        Some(ns) => kube::Api::namespaced_with(ctx.client.clone(), ns, &ar),
        None => kube::Api::all_with(ctx.client.clone(), &ar),
    };
    let mut wait = Duration::from_millis(200);
    for _ in 0..3 {
        match api.get_metadata_opt(name).await {
            Ok(found) => {
                return Some(found.is_some_and(|f| f.metadata.uid == o.meta.uid));
            }
            Err(e) => {
                tracing::debug!(kind = %kind, name, "looking up a deleted target: {e}");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
    None
}

/// Run each hearing policy's `deleted` on one deleted target.
async fn tell(ctx: &Context, g: Gone) {
    let (kind, o) = (&g.kind, &g.object);
    let policies = hearing(ctx, kind, o);
    if policies.is_empty() {
        return;
    }
    match still_there(ctx, kind, o).await {
        Some(false) => {}
        Some(true) => return,
        None => {
            tracing::warn!(kind = %kind, namespace = ?o.meta.namespace, name = ?o.meta.name, "could not tell whether this target was deleted or left the watch: its deleted handlers do not run");
            return;
        }
    }
    let resolved = match ctx.resources.resolve(kind).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(kind = %kind, "a deletion is not told: {e}");
            return;
        }
    };
    let key = TargetKey {
        kind: kind.clone(),
        namespace: o.meta.namespace.clone().unwrap_or_default(),
        name: o.meta.name.clone().unwrap_or_default(),
    };
    let cached = o.cached();
    // Runbook's state of the target, where it is kept apart, is laid over
    // it as a reconcile sees it; nothing is written to it.
    let cached = match apart_of(ctx, kind, &key, &cached).await {
        Ok(Some(a)) => runbook_core::observe::CachedObject::new(a.overlaid()),
        _ => cached,
    };
    let target = Target {
        cached,
        key: &key,
        resolved,
        set: ctx.policies.load_full(),
        apart: None,
    };
    for p in &policies {
        let span = tracing::info_span!("deleted", policy = %p.id, version = %p.version, kind = %kind.kind, namespace = %key.namespace, name = %key.name);
        let outcome = run_policy(ctx, p, &target, Hook::Deleted)
            .instrument(span)
            .await;
        hold_alerts(ctx, p, &key, o);
        if let Some(f) = &outcome.failure {
            tracing::warn!(policy = %p.id, kind = %kind, namespace = %key.namespace, name = %key.name, "deleted failed, and is not run again: {f}");
        }
    }
}

/// Keep the alerts `p`'s `deleted` raised on `o` firing a while.
fn hold_alerts(ctx: &Context, p: &CompiledPolicy, key: &TargetKey, o: &RawObject) {
    let source = AlertSource {
        policy: p.id.clone(),
        api_version: key.kind.api_version.clone(),
        kind: key.kind.kind.clone(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        uid: o.meta.uid.clone().unwrap_or_default(),
    };
    let until = ctx
        .clock
        .now()
        .checked_add(DELETED_ALERTS_FIRE_FOR)
        .unwrap_or(Timestamp::MAX);
    lock(&ctx.memory.held_alerts).insert(source, until);
}
