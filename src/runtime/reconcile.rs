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

use super::context::{Context, ShadowRecord};
use crate::act::{self, Exec, Mode};
use crate::decide::{self, Observed};
use crate::kinds::KindRef;
use crate::observe::RawObject;
use crate::observe::discovery::Resolved;
use crate::observe::view::{TargetKey, Tracking};
use crate::policy::compile::CompiledPolicy;
use crate::policy::{self, PolicySet};
use crate::telemetry::Metrics;
use crate::util::lock;

/// Why a reconcile failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ReconcileError {
    pub message: String,
    pub label: &'static str,
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
    lock(&ctx.memory.deps).set(key, tracking.take());
    let now_ms = now.as_millisecond();
    let mode = match p.mode {
        policy::Mode::Shadow => Mode::Shadow,
        policy::Mode::Enforce => {
            let open = p.limits.circuit_breaker.as_ref().and_then(|cb| {
                lock(&ctx.memory.breakers)
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
        lock(&ctx.memory.breakers)
            .entry(p.name.clone())
            .or_default()
            .record(cb, now_ms, outcome.error.is_some());
    }
    if mode == Mode::Shadow {
        tracing::info!(policy = %p.name, version = %p.version, target = %format!("{}/{}", key.namespace, key.name), actions = ?outcome.record.actions, "shadow decision");
        let mut log = lock(&ctx.memory.shadow);
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

/// What a caught panic said.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

pub(super) async fn reconcile(
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
        let mut pending = lock(&ctx.queue.pending);
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
        let _ = ctx.queue.changes.send(crate::observe::cache::Change {
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
    ctx.queue.in_flight.fetch_add(1, Ordering::AcqRel);
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
    ctx.queue.in_flight.fetch_sub(1, Ordering::AcqRel);
    ctx.queue.activity.fetch_add(1, Ordering::AcqRel);
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
        match ctx.memory.written.pending(key) {
            Some(before) if before == obj.resource_version() => {
                tracing::debug!(kind = %kind, namespace = %key.namespace, name = %key.name, "waiting for the cache to show the last status write");
                // The watch event of that write reconciles again; the
                // requeue is a backstop.
                return Ok(Action::requeue(Duration::from_secs(30)));
            }
            Some(_) => ctx.memory.written.settled(key),
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
        lock(&ctx.memory.deps).forget(key);
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
            ctx.memory
                .written
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
    lock(&ctx.queue.failures).remove(key);
    Ok(match requeue {
        Some(ms) => Action::requeue(Duration::from_millis(ms.max(1) as u64)),
        None => Action::await_change(),
    })
}

pub(super) fn error_policy(
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
        let mut f = lock(&ctx.queue.failures);
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
