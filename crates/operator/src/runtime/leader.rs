//! Leader election on a `coordination.k8s.io` Lease: only the leader
//! reconciles and writes; a standby keeps its caches warm and takes over
//! within the lease duration after the leader stops renewing. On shutdown
//! the leader releases the Lease so a standby need not wait.
//!
//! No instance compares its clock with another's: the `renewTime` a holder
//! writes is never read as a time. A leader trusts its lease for half the
//! duration after it *sent* its last successful renewal (a renewal that
//! has not answered by then counts as failed); a standby waits three
//! fifths of the duration after it first *saw* the holder's current
//! record (a new resourceVersion) by its own monotonic clock. That
//! sighting comes after the renewal was sent, so the two never lead at
//! once, whatever the clock skew between them, and the tenth of the
//! duration between the two bounds is left for a write the old leader
//! sent just before it stopped. A standby looks every twentieth of the
//! duration, so it takes over within about two thirds of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use runbook_core::clock::Clock;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
    pub renew_every: Duration,
}

pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    clock: Clock,
    /// Another holder's lease record (its resourceVersion) and when this
    /// instance first saw it.
    sighted: Mutex<Option<(String, Instant)>>,
}

/// How long a holder trusts its own renewal: half the lease duration
/// after it sent it.
fn trusted(duration: Duration) -> Duration {
    duration / 2
}

/// How long another replica waits, after it first saw a holder's current
/// record, before counting the holder gone: three fifths of the lease
/// duration, a tenth more than the holder trusts it.
pub fn expires_after(duration: Duration) -> Duration {
    duration.mul_f64(0.6)
}

/// How often a replica looks at another's Lease: a twentieth of the
/// duration, between 100 ms and 1 s.
pub fn look_every(duration: Duration) -> Duration {
    (duration / 20).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

impl Elector {
    pub fn new(client: kube::Client, config: LeaseConfig, clock: Clock) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            clock,
            sighted: Mutex::new(None),
        }
    }

    /// Whether the other holder's current record has gone unrenewed for
    /// longer than it is trusted, by this instance's own clock.
    fn expired(&self, lease: &Lease, spec: &LeaseSpec) -> bool {
        let record = lease.metadata.resource_version.clone().unwrap_or_default();
        let now = Instant::now();
        let mut sighted = runbook_core::util::lock(&self.sighted);
        let since = match &*sighted {
            Some((seen, at)) if *seen == record => *at,
            _ => {
                *sighted = Some((record, now));
                now
            }
        };
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64))
            .unwrap_or(self.config.duration);
        now.duration_since(since) >= expires_after(duration)
    }

    fn spec(&self, now: Timestamp, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One round: take or keep the Lease. True while this instance leads.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let now = self.clock.now();
        let existing = match self.api.get_opt(&self.config.name).await? {
            Some(l) => l,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(now, 0, None)),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                };
            }
        };
        let spec = existing.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.config.identity;
        if !mine && !holder.is_empty() && !self.expired(&existing, &spec) {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + if mine { 0 } else { 1 };
        let acquired = if mine {
            spec.acquire_time.clone()
        } else {
            None
        };
        let mut lease = existing;
        lease.spec = Some(self.spec(now, transitions, acquired));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            // Someone else renewed or took it first.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Give the Lease up, if held.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let held = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(self.config.identity.as_str());
        if !held {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = None;
            spec.acquire_time = None;
        }
        if let Err(e) = self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(
                "releasing the leader lease failed: {}",
                crate::util::api_error(&e)
            );
        }
    }

    /// Keep trying to lead until `stop` fires; `leading` follows the state.
    pub async fn run(
        self,
        leading: Arc<AtomicBool>,
        changed: watch::Sender<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut last_renewed: Option<Instant> = None;
        let trust = trusted(self.config.duration);
        loop {
            let sent = Instant::now();
            // A renewal that hangs must not keep a leader acting past its
            // trust: it is given only the time the last one has left.
            let wait = match last_renewed.filter(|_| leading.load(Ordering::Acquire)) {
                Some(t) => trust.saturating_sub(t.elapsed()),
                None => self.config.duration,
            };
            let attempt = match tokio::time::timeout(wait, self.try_lead()).await {
                Ok(answer) => answer.map_err(|e| crate::util::api_error(&e)),
                Err(_) => Err("the API server did not answer in time".to_string()),
            };
            let renewed = matches!(attempt, Ok(true));
            let lead = match attempt {
                Ok(true) => {
                    last_renewed = Some(sent);
                    true
                }
                Ok(false) => false,
                Err(why) => {
                    tracing::warn!("leader election: {why}");
                    // Keep leading only while the last renewal is trusted.
                    last_renewed.is_some_and(|t| t.elapsed() < trust)
                        && leading.load(Ordering::Acquire)
                }
            };
            if lead != leading.swap(lead, Ordering::AcqRel) {
                if lead {
                    tracing::info!(identity = %self.config.identity, "became the leader");
                } else {
                    tracing::warn!(identity = %self.config.identity, "lost the leader lease");
                }
                let _ = changed.send(lead);
            }
            // A leader whose renewal failed tries again soon, while its
            // last one is still trusted.
            let look = look_every(self.config.duration);
            let pause = match (lead, renewed) {
                (true, true) => self.config.renew_every,
                (true, false) => look.min(self.config.renew_every),
                (false, _) => look,
            };
            let pause = match last_renewed.filter(|_| lead) {
                // Wake in time to stop leading when the trust runs out.
                Some(t) => pause.min(trust.saturating_sub(t.elapsed())),
                None => pause,
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => break,
            }
        }
        if leading.load(Ordering::Acquire) {
            self.release().await;
            leading.store(false, Ordering::Release);
            let _ = changed.send(false);
        }
    }
}
