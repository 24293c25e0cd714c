//! Kubernetes Events (`events.k8s.io/v1`) as Runbook writes them: on
//! targets (decisions), on policy ConfigMaps (reloads) and for alerts.
//!
//! A repeat of the same Event (same object, type, reason, action and
//! message) within a few minutes bumps the Event's `series` instead of
//! writing a new object, as Kubernetes' own recorders do. Unlike
//! kube-runtime's `Recorder`, which keys repeats without the message (a new
//! error would show up as `(x2)` of the old one), the message is part of
//! what makes an Event the same: `kubectl describe` always shows the
//! current error and the current version.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use runbook_core::util::lock;

pub use kube::runtime::events::Reporter;
use runbook_core::script::action::EventType;

/// One Event to write about an object.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub type_: EventType,
    /// Why, in UpperCamelCase (`ActionRefused`).
    pub reason: String,
    /// What happened, for a person (at most 1 KB).
    pub note: Option<String>,
    /// What Runbook was doing (`Reconcile`, `Reload`).
    pub action: String,
    /// A second object the Event concerns.
    pub secondary: Option<ObjectReference>,
}

/// How long a written Event takes repeats into its series.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    warning: bool,
    reason: String,
    action: String,
    note: Option<String>,
    /// apiVersion, kind, namespace, name and uid of the object.
    regarding: String,
}

impl Key {
    fn of(ev: &Event, regarding: &ObjectReference) -> Self {
        let r = regarding;
        Self {
            warning: ev.type_ == EventType::Warning,
            reason: ev.reason.clone(),
            action: ev.action.clone(),
            note: ev.note.clone(),
            regarding: format!(
                "{:?}/{:?}/{:?}/{:?}/{:?}",
                r.api_version, r.kind, r.namespace, r.name, r.uid
            ),
        }
    }
}

#[derive(Clone, Debug)]
struct Written {
    name: String,
    namespace: String,
    count: i32,
    last: Timestamp,
}

/// Writes Events for one reporting controller and instance.
pub struct EventWriter {
    client: Client,
    reporter: Reporter,
    written: Mutex<HashMap<Key, Written>>,
}

impl EventWriter {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            written: Mutex::new(HashMap::new()),
        }
    }

    /// Events written by Runbook, as the instance `identity`.
    pub fn of_runbook(client: Client, identity: &str) -> Self {
        let reporter = Reporter {
            controller: "runbook".into(),
            instance: Some(identity.to_string()),
        };
        Self::new(client, reporter)
    }

    /// Write `ev` about `regarding`, or count it as a repeat.
    pub async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Key::of(ev, regarding);
        let repeat = {
            let mut written = lock(&self.written);
            let window = jiff::SignedDuration::try_from(SERIES_WINDOW).unwrap_or_default();
            written.retain(|_, w| w.last.saturating_add(window).is_ok_and(|end| end > now));
            written.get(&key).cloned()
        };
        if let Some(w) = repeat
            && self.bump(&key, w, now).await?
        {
            return Ok(());
        }
        self.create(key, ev, regarding, now).await
    }

    /// Count a repeat in the series of the Event already written; `false`
    /// when that Event is gone (it expired, or was deleted).
    async fn bump(&self, key: &Key, w: Written, now: Timestamp) -> Result<bool, kube::Error> {
        let series = EventSeries {
            count: w.count + 1,
            last_observed_time: MicroTime(now),
        };
        let patch = serde_json::json!({"series": series});
        let patched = Api::<K8sEvent>::namespaced(self.client.clone(), &w.namespace)
            .patch(&w.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        match patched {
            Ok(_) => {
                let count = w.count + 1;
                self.remember(
                    key.clone(),
                    Written {
                        count,
                        last: now,
                        ..w
                    },
                );
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Write a new Event.
    async fn create(
        &self,
        key: Key,
        ev: &Event,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let controller = &self.reporter.controller;
        let about = regarding.name.as_deref().unwrap_or(controller);
        let name = format!("{about}.{:x}", now.as_nanosecond());
        let instance = self.reporter.instance.clone();
        let event = K8sEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            type_: Some(if key.warning { "Warning" } else { "Normal" }.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(instance.unwrap_or_else(|| controller.clone())),
            ..Default::default()
        };
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        events.create(&PostParams::default(), &event).await?;
        let written = Written {
            name,
            namespace,
            count: 1,
            last: now,
        };
        self.remember(key, written);
        Ok(())
    }

    fn remember(&self, key: Key, w: Written) {
        lock(&self.written).insert(key, w);
    }
}
