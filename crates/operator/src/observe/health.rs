//! The health of the operator's watches, and how they back off.
//!
//! Every watch (targets, the kinds policies own or read, policy
//! ConfigMaps) reports its failures and recoveries here. `/readyz` is not
//! ready while a watch has been failing for longer than a moment, and says
//! which and why, so a replica that cannot see the cluster is taken out of
//! rotation and an SRE sees the cause. Watches retry quickly (at most
//! every few seconds), so the operator catches up soon after the API server
//! comes back.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use runbook_core::util::lock;
use tokio::time::Instant;

/// How long a watch fails before the policies using it are told (an Event
/// on their ConfigMap): past a retry or two, well within a user's patience.
pub const TELL_POLICIES_AFTER: Duration = Duration::from_secs(3);

/// How long a watch may fail before the instance stops being ready.
pub const UNREADY_AFTER: Duration = Duration::from_secs(10);

/// A failing watch retries at least every [`LONGEST`]; one that has said
/// nothing for this long is watching again. (A watch that resumed from
/// where it was says nothing until something changes, so a quiet kind
/// would otherwise seem to fail for ever.)
const QUIET: Duration = Duration::from_secs(12);

/// Watches failing now: since when, and the latest error.
#[derive(Default)]
pub struct WatchHealth {
    /// Failing watches: since when, the last error and when it came.
    failing: Mutex<BTreeMap<String, (Instant, String, Instant)>>,
    /// Controllers whose task ended and that wait for their restart.
    ended: Mutex<BTreeMap<String, (Instant, String)>>,
    /// `runbook_watch_failing{watch}`, when metrics are kept.
    metrics: Option<std::sync::Arc<crate::telemetry::Metrics>>,
    /// The watches of a tenant's namespace alone (by name, with the
    /// namespace): one that fails is told on the tenant's ConfigMaps and
    /// beside `/readyz`'s `ok`, and never makes the operator unready.
    tenants: Mutex<BTreeMap<String, String>>,
}

/// The name of a watch of `kind` in the tenant's namespace `namespace`.
pub fn tenant_watch_name(kind: &str, namespace: &str) -> String {
    format!("{kind} in {namespace}")
}

impl WatchHealth {
    /// Health that also sets `runbook_watch_failing{watch}`.
    pub fn with_metrics(metrics: std::sync::Arc<crate::telemetry::Metrics>) -> Self {
        Self {
            metrics: Some(metrics),
            ..Self::default()
        }
    }

    fn gauge(&self, name: &str, value: i64) {
        if let Some(m) = &self.metrics {
            m.watch_failing
                .get_or_create(&crate::telemetry::Metrics::labels(&[("watch", name)]))
                .set(value);
        }
    }

    /// The watch `name` failed with `error`. Returns whether it had been
    /// healthy until now (the first failure of a run, worth a log line at
    /// error level).
    pub fn failed(&self, name: &str, error: &str) -> bool {
        let mut failing = lock(&self.failing);
        match failing.get_mut(name) {
            Some((_, last, at)) => {
                *last = error.to_string();
                *at = Instant::now();
                false
            }
            None => {
                let now = Instant::now();
                failing.insert(name.to_string(), (now, error.to_string(), now));
                self.gauge(name, 1);
                true
            }
        }
    }

    /// The watch `name` delivered again. Returns whether it had been failing.
    pub fn recovered(&self, name: &str) -> bool {
        let was = lock(&self.failing).remove(name).is_some();
        if was {
            self.gauge(name, 0);
        }
        was
    }

    /// The controller `name` is not running, because of `reason`. Returns
    /// how long it has been down (zero the first time it is told).
    pub fn controller_ended(&self, name: &str, reason: &str) -> Duration {
        let mut ended = lock(&self.ended);
        match ended.get(name) {
            Some((since, _)) => since.elapsed(),
            None => {
                ended.insert(name.to_string(), (Instant::now(), reason.to_string()));
                Duration::ZERO
            }
        }
    }

    /// The controller `name` runs again.
    pub fn controller_restarted(&self, name: &str) {
        lock(&self.ended).remove(name);
    }

    /// The controllers down now, each with why: `/readyz` reports them at
    /// once (a kind nobody reconciles is not a moment's hiccup).
    pub fn ended(&self) -> Vec<String> {
        lock(&self.ended)
            .iter()
            .map(|(name, (since, reason))| {
                format!(
                    "the {name} ended {}s ago ({reason}); restarting it",
                    since.elapsed().as_secs()
                )
            })
            .collect()
    }

    /// The watches failing for at least `at_least`: name and latest error.
    pub fn failing_errors(&self, at_least: Duration) -> BTreeMap<String, String> {
        lock(&self.failing)
            .iter()
            .filter(|(_, (since, _, at))| since.elapsed() >= at_least && at.elapsed() < QUIET)
            .map(|(name, (_, error, _))| (name.clone(), error.clone()))
            .collect()
    }

    /// The watch `name` is of the tenant's namespace `namespace` alone.
    pub fn of_tenant(&self, name: &str, namespace: &str) {
        lock(&self.tenants).insert(name.to_string(), namespace.to_string());
    }

    /// The tenant whose namespace alone the watch `name` watches, if any.
    pub fn tenant_of(&self, name: &str) -> Option<String> {
        lock(&self.tenants).get(name).cloned()
    }

    /// The operator's own watches failing for at least `at_least`, each
    /// with its error (a tenant's are [`Self::tenants_failing`]).
    pub fn failing_for(&self, at_least: Duration) -> Vec<String> {
        let now = Instant::now();
        let tenants = lock(&self.tenants).clone();
        lock(&self.failing)
            .iter()
            .filter(|(name, (since, _, at))| {
                now.duration_since(*since) >= at_least
                    && now.duration_since(*at) < QUIET
                    && !tenants.contains_key(*name)
            })
            .map(|(name, (since, error, _))| {
                format!(
                    "watch of {name} failing for {}s: {error}",
                    now.duration_since(*since).as_secs()
                )
            })
            .collect()
    }
}

impl WatchHealth {
    /// The tenants' watches failing for longer than a moment, each said
    /// as `/readyz` says it beside `ok`.
    pub fn tenants_failing(&self) -> Vec<String> {
        let tenants = lock(&self.tenants).clone();
        self.failing_errors(UNREADY_AFTER)
            .into_iter()
            .filter_map(|(name, error)| {
                let ns = tenants.get(&name)?;
                Some(format!(
                    "the watch of {name} (tenant {ns}) fails: {error}; told on the tenant's policy ConfigMaps"
                ))
            })
            .collect()
    }
}

/// Note a watch's failure (`Some`) or delivery (`None`) in `health`, with
/// one log line at error level when it starts failing and one when it
/// recovers.
pub fn report_watch(health: &WatchHealth, name: &str, error: Option<&watcher::Error>) {
    match error {
        Some(e) => {
            let message = watch_error(e);
            if health.failed(name, &message) {
                tracing::error!(watch = %name, "watch failing, retrying with backoff: {message}");
            } else {
                tracing::debug!(watch = %name, "watch still failing: {message}");
            }
        }
        None => {
            if health.recovered(name) {
                tracing::info!(watch = %name, "watch recovered");
            }
        }
    }
}

/// A watch error on one line, with the API server's message where there is one.
fn watch_error(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => crate::util::api_error(k),
        watcher::Error::WatchError(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}

/// Run `attempt` until it succeeds, pausing 1 s doubling to 30 s between
/// tries, with a warning naming `what` and the error each time: for steps
/// that must wait out an API server that is not there yet (start-up during
/// an outage) rather than give up.
pub async fn patiently<T, E, F, Fut>(waiting: &Waiting, what: &str, mut attempt: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut pause = Duration::from_secs(1);
    loop {
        match attempt().await {
            Ok(v) => {
                waiting.set(None);
                return v;
            }
            Err(e) => {
                tracing::warn!("{what}: {e}; trying again in {}s", pause.as_secs());
                waiting.set(Some(format!("{what}: {e}")));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// What start-up is waiting for, with the last answer that held it up:
/// `/readyz` says it while the instance is not ready yet.
#[derive(Default)]
pub struct Waiting(std::sync::Mutex<Option<String>>);

impl Waiting {
    pub fn set(&self, why: Option<String>) {
        *runbook_core::util::lock(&self.0) = why;
    }

    pub fn now(&self) -> Option<String> {
        runbook_core::util::lock(&self.0).clone()
    }

    /// Why start-up is not ready: what it waits for, else `otherwise`.
    pub fn not_ready(&self, otherwise: &str) -> String {
        match self.now() {
            Some(why) => format!("starting: waiting for the API server: {why}"),
            None => format!("starting: {otherwise}"),
        }
    }
}

/// Backoff between watch retries: 250 ms doubling to at most 5 s, back to
/// the start once the watch delivers again. (kube-runtime's default climbs
/// to 30 s, so after an outage of a minute changes waited that long.)
pub struct WatchBackoff {
    next: Duration,
}

const FIRST: Duration = Duration::from_millis(250);
const LONGEST: Duration = Duration::from_secs(5);

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(LONGEST);
        Some(now)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_five_seconds_and_resets() {
        let mut b = WatchBackoff::default();
        let steps: Vec<u64> = (0..7)
            .map(|_| b.next().unwrap().as_millis() as u64)
            .collect();
        assert_eq!(steps, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        b.reset();
        assert_eq!(b.next(), Some(FIRST));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_failing_long_enough_is_reported_until_it_recovers() {
        let h = WatchHealth::default();
        assert!(h.failed("batch/v1 Job", "connection refused"));
        assert!(!h.failed("batch/v1 Job", "503 Service Unavailable"));
        assert!(h.failing_for(UNREADY_AFTER).is_empty(), "a moment is fine");
        tokio::time::advance(UNREADY_AFTER).await;
        assert_eq!(
            h.failing_for(UNREADY_AFTER),
            ["watch of batch/v1 Job failing for 10s: 503 Service Unavailable"]
        );
        assert!(h.recovered("batch/v1 Job"));
        assert!(h.failing_for(Duration::ZERO).is_empty());
    }

    #[test]
    fn the_failing_gauge_follows_the_watch() {
        let metrics = std::sync::Arc::new(crate::telemetry::Metrics::new());
        let h = WatchHealth::with_metrics(metrics.clone());
        h.failed("v1 Pod", "403 Forbidden");
        assert!(
            metrics
                .render()
                .contains("runbook_watch_failing{watch=\"v1 Pod\"} 1")
        );
        h.recovered("v1 Pod");
        assert!(
            metrics
                .render()
                .contains("runbook_watch_failing{watch=\"v1 Pod\"} 0")
        );
    }
}
