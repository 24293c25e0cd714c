//! Gauges recomputed from what the operator holds, for alerts to page on:
//! its targets by policy and condition, the alerts firing by receiver.
//! The leader (each sharded replica, for its share) says them; a standby
//! says none, so a sum over replicas counts each target once.

use std::collections::BTreeMap;

use serde_json::Value;

use super::context::Context;
use crate::telemetry::Metrics;

/// The conditions counted, as kstatus and Runbook's own kinds name them.
pub const CONDITIONS: [&str; 4] = ["Ready", "Degraded", "Reconciling", "Stalled"];

/// The status of condition `type_` in `obj`'s status, if it has one.
fn condition_status<'a>(obj: &'a Value, type_: &str) -> Option<&'a str> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .get("status")?
        .as_str()
}

impl Context {
    /// `runbook_targets{kind,policy,condition,status}`: the targets each
    /// policy selects, by the status of each of `CONDITIONS` (`True`,
    /// `False`, `Unknown`, or `None` without it); each policy's series
    /// exist at 0 from its load.
    pub(super) fn publish_targets(&self) {
        let set = self.policies.load_full();
        let mut counts: BTreeMap<(String, String, &str, String), i64> = BTreeMap::new();
        for p in set.policies.values() {
            for c in CONDITIONS {
                for s in ["True", "False"] {
                    counts.insert((p.target.kind.clone(), p.id.clone(), c, s.into()), 0);
                }
            }
        }
        let stores: Vec<_> = runbook_core::util::lock(&self.running.targets)
            .iter()
            .map(|(k, t)| (k.clone(), t.store.clone()))
            .collect();
        for (kind, store) in stores {
            let policies = set.for_target(&kind);
            if policies.is_empty() {
                continue;
            }
            for obj in store.state() {
                let value = obj.cached();
                let value = value.value();
                for p in &policies {
                    if !p.acts_in(obj.namespace()) || !p.selects(value) {
                        continue;
                    }
                    for c in CONDITIONS {
                        let status = condition_status(value, c).unwrap_or("None");
                        *counts
                            .entry((kind.kind.clone(), p.id.clone(), c, status.to_string()))
                            .or_default() += 1;
                    }
                }
            }
        }
        let family = &self.metrics.targets;
        family.clear();
        for ((kind, policy, condition, status), n) in counts {
            family
                .get_or_create(&Metrics::labels(&[
                    ("kind", &kind),
                    ("policy", &policy),
                    ("condition", condition),
                    ("status", &status),
                ]))
                .set(n);
        }
    }

    /// `runbook_alerts_firing{receiver}`: the alerts firing, by receiver;
    /// each receiver of the routes in force has a series from their load.
    pub(super) fn publish_firing(&self) {
        let set = self.policies.load_full();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for routes in set.routes.values() {
            for r in routes.receivers.keys() {
                counts.insert(r.clone(), 0);
            }
        }
        counts.extend(self.alerts.firing());
        let family = &self.metrics.alerts_firing;
        family.clear();
        for (receiver, n) in counts {
            family
                .get_or_create(&Metrics::labels(&[("receiver", &receiver)]))
                .set(n as i64);
        }
    }
}
