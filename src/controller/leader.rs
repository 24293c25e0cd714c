//! Leader election on a `coordination.k8s.io` Lease: only the leader
//! reconciles and writes; a standby keeps its caches warm and takes over
//! within the lease duration after the leader stops renewing. On shutdown
//! the leader releases the Lease so a standby need not wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::sync::watch;

use crate::clock::Clock;

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
}

fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renew) = spec.renew_time.as_ref().map(|t| t.0) else {
        return true;
    };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    renew.as_second() + secs <= now.as_second()
}

impl Elector {
    pub fn new(client: kube::Client, config: LeaseConfig, clock: Clock) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            clock,
        }
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
        if !mine && !holder.is_empty() && !expired(&spec, now) {
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
            tracing::warn!("releasing the leader lease failed: {e}");
        }
    }

    /// Keep trying to lead until `stop` fires; `leading` follows the state.
    pub async fn run(
        self,
        leading: Arc<AtomicBool>,
        changed: watch::Sender<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut last_renewed: Option<Timestamp> = None;
        loop {
            let now = self.clock.now();
            let lead = match self.try_lead().await {
                Ok(l) => {
                    if l {
                        last_renewed = Some(now);
                    }
                    l
                }
                Err(e) => {
                    tracing::warn!("leader election: {e}");
                    // Keep leading only while the last renewal is still valid.
                    last_renewed.is_some_and(|t| {
                        t.as_second() + self.config.duration.as_secs() as i64 > now.as_second()
                    }) && leading.load(Ordering::Acquire)
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
            tokio::select! {
                _ = tokio::time::sleep(self.config.renew_every) => {}
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
