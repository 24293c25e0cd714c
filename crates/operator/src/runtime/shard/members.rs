//! Who shares the work, when replicas run sharded (`--shards`): each
//! replica holds a Lease of its own, `<ring>-member-<identity>` in the
//! operator namespace, renewed as the leader Lease is (see `leader`); the
//! members whose Leases are live form the ring (`runbook_core::shard`).
//!
//! A member's liveness is judged as a standby judges a leader: by this
//! replica's own monotonic clock, from when it first saw the member's
//! current record (its resourceVersion), never from the `renewTime` the
//! member wrote. A member trusts its Lease for half the duration after it
//! sent its last renewal; another replica calls it gone three fifths of
//! the duration after it first saw that renewal, which is later. So a
//! member is never counted gone while it still acts on its own account,
//! whatever the clocks say, and a member that stops renewing is counted
//! gone about two thirds of the lease duration after its last renewal
//! (given the look every twentieth of it), leaving the rest of the
//! duration to place its targets on the others.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::time::Instant;

use crate::runtime::leader::{LeaseConfig, expires_after, look_every};
use runbook_core::shard::Ring;

/// The name of a member's Lease in ring `ring`.
pub fn lease_name(ring: &str, identity: &str) -> String {
    format!("{ring}-member-{identity}")
}

/// The name of the Lease whose annotations carry the ring the assigner
/// published (`Published`); it holds no lock.
pub fn published_name(ring: &str) -> String {
    format!("{ring}-ring")
}

/// The annotations of the published ring: its members, and the members
/// gone from it whose targets are not all placed elsewhere yet.
pub const MEMBERS_ANNOTATION: &str = "runbook.dev/members";
pub const GONE_ANNOTATION: &str = "runbook.dev/gone";
/// The annotation saying the replicas decide for unplaced targets (those
/// without a shard label) where the published ring places them, before
/// the assigner labels them (`takeover`): `"by-ring"`. Absent (as an
/// assigner that predates it writes the ring), unplaced targets wait for
/// their labels.
pub const UNPLACED_ANNOTATION: &str = "runbook.dev/unplaced";
const BY_RING: &str = "by-ring";

/// The ring as the assigner published it. Every replica places a gone
/// member's targets by it (`takeover`), so that all agree on who decides
/// for each while it is still labelled for the gone member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    pub members: BTreeSet<String>,
    pub gone: BTreeSet<String>,
    /// Whether the members decide for unplaced targets as the ring places
    /// them (`UNPLACED_ANNOTATION`).
    pub open: bool,
    /// The record's resourceVersion: the assigner's next write replaces
    /// exactly this one.
    pub version: Option<String>,
}

impl Published {
    fn of(meta: &kube::api::ObjectMeta) -> Self {
        let set = |key: &str| -> BTreeSet<String> {
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|m| !m.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        Self {
            members: set(MEMBERS_ANNOTATION),
            gone: set(GONE_ANNOTATION),
            open: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(UNPLACED_ANNOTATION))
                .is_some_and(|v| v == BY_RING),
            version: meta.resource_version.clone(),
        }
    }

    /// The annotations that publish it.
    pub fn annotations(&self) -> std::collections::BTreeMap<String, String> {
        let join = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        let mut out: std::collections::BTreeMap<String, String> = [
            (MEMBERS_ANNOTATION.to_string(), join(&self.members)),
            (GONE_ANNOTATION.to_string(), join(&self.gone)),
        ]
        .into();
        if self.open {
            out.insert(UNPLACED_ANNOTATION.to_string(), BY_RING.to_string());
        }
        out
    }

    pub fn ring(&self) -> Ring {
        Ring::new(&self.members)
    }
}

/// One look at the members: who is live by this replica's clock, and the
/// ring published (`None`: never published).
#[derive(Clone, Debug)]
pub struct View {
    pub live: BTreeSet<String>,
    pub published: Option<Published>,
    /// When the Leases were asked for (what they say is at least this
    /// recent).
    pub at: Instant,
}

/// A member's Lease as a leader Lease of its own: held only by it.
pub fn member_lease(ring: &LeaseConfig) -> LeaseConfig {
    LeaseConfig {
        name: lease_name(&ring.name, &ring.identity),
        ..ring.clone()
    }
}

/// What one replica knows of the members of a ring.
pub struct Members {
    api: Api<Lease>,
    ring: String,
    duration: Duration,
    /// Each member's current record and when this replica first saw it.
    sighted: HashMap<String, (String, Instant)>,
}

impl Members {
    pub fn new(client: kube::Client, ring: &LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &ring.namespace),
            ring: ring.name.clone(),
            duration: ring.duration,
            sighted: HashMap::new(),
        }
    }

    /// How often to look, to count a member gone soon after it is.
    pub fn poll(&self) -> Duration {
        look_every(self.duration)
    }

    /// The live members now, by identity.
    pub async fn live(&mut self) -> Result<BTreeSet<String>, kube::Error> {
        Ok(self.look().await?.live)
    }

    /// The live members now and the ring the assigner published, from
    /// one list of the operator namespace's Leases.
    pub async fn look(&mut self) -> Result<View, kube::Error> {
        let asked = Instant::now();
        let leases = self.api.list(&Default::default()).await?.items;
        let prefix = format!("{}-member-", self.ring);
        let ring_lease = published_name(&self.ring);
        let now = Instant::now();
        let mut live = BTreeSet::new();
        let mut published = None;
        let mut seen = HashMap::new();
        for lease in leases {
            let Some(name) = lease.metadata.name.as_deref() else {
                continue;
            };
            if name == ring_lease {
                published = Some(Published::of(&lease.metadata));
                continue;
            }
            let Some(identity) = name.strip_prefix(&prefix) else {
                continue;
            };
            let spec = lease.spec.unwrap_or_default();
            // A member that left released its Lease.
            if spec.holder_identity.as_deref() != Some(identity) {
                continue;
            }
            let record = lease.metadata.resource_version.unwrap_or_default();
            let since = match self.sighted.get(identity) {
                Some((r, at)) if *r == record => *at,
                _ => now,
            };
            let duration = spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(s.max(1) as u64))
                .unwrap_or(self.duration);
            if now.duration_since(since) < expires_after(duration) {
                live.insert(identity.to_string());
            }
            seen.insert(identity.to_string(), (record, since));
        }
        self.sighted = seen;
        Ok(View {
            live,
            published,
            at: asked,
        })
    }

    /// The ring over the live members.
    pub async fn ring(&mut self) -> Result<Ring, kube::Error> {
        Ok(Ring::new(self.live().await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_members_lease_is_named_after_its_ring_and_identity() {
        let ring = LeaseConfig {
            namespace: "runbook-system".into(),
            name: "runbook".into(),
            identity: "runbook-7d9f-x2".into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        };
        let own = member_lease(&ring);
        assert_eq!(own.name, "runbook-member-runbook-7d9f-x2");
        assert_eq!(own.identity, ring.identity);
        assert_eq!(own.namespace, ring.namespace);
    }
}
