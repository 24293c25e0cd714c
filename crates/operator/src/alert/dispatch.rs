//! The alert dispatcher: Alertmanager's aggregation, inhibition and
//! deduplication over the alerts policies raise, on a clock the caller
//! controls.
//!
//! Every reconcile reports the complete set of alerts a (policy, object)
//! raises now. An alert new to that set joins an aggregation group on
//! each route it matches (one group per route and `groupBy` label values).
//! A new group is flushed `groupWait` after it formed, then every
//! `groupInterval`; a flush notifies when alerts were added or resolved
//! since the last notification, or when `repeatInterval` has passed.
//! Alerts the source no longer raises are resolved, included once in the
//! next notification, then dropped. Inhibition is applied at flush time.
//! `tick` does the flushing; `spawn` calls it as time passes. With a
//! notification log store, what was last sent per group survives the
//! process (see `nflog`): `restore` reads it back before alerts are
//! reported, and `spawn` writes it after every flush that notified.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;

use super::nflog::{LogStore, NotificationLog, SentRecord};
use runbook_core::alert::notify::{Notification, NotifiedAlert};
use runbook_core::alert::routes::{CompiledRoutes, ReceiverKind, Route};
use runbook_core::alert::sink::{Alert, AlertSink, AlertSource};
use runbook_core::clock::Clock;

/// Where flushed notifications go (the delivery queues, or a recorder in
/// tests and simulations). Must not block.
pub trait Outbox: Send + Sync {
    fn send(&self, routes: &Arc<CompiledRoutes>, notification: Notification);
}

/// Keeps every notification, for tests and `runbook simulate`.
#[derive(Default)]
pub struct RecordingOutbox {
    pub sent: Mutex<Vec<Notification>>,
}

impl RecordingOutbox {
    pub fn take(&self) -> Vec<Notification> {
        std::mem::take(&mut *runbook_core::util::lock(&self.sent))
    }
}

impl Outbox for RecordingOutbox {
    fn send(&self, _routes: &Arc<CompiledRoutes>, n: Notification) {
        runbook_core::util::lock(&self.sent).push(n);
    }
}

struct Raised {
    routes: Option<Arc<CompiledRoutes>>,
    alerts: BTreeMap<String, Alert>,
}

struct Member {
    alert: Alert,
    source: AlertSource,
    resolved_at: Option<Timestamp>,
}

/// What the last notification of a group said.
struct Sent {
    at: Timestamp,
    firing: BTreeSet<String>,
    resolved: BTreeSet<String>,
}

impl Sent {
    fn record(&self) -> SentRecord {
        SentRecord {
            at: self.at.as_millisecond(),
            firing: self.firing.iter().cloned().collect(),
            resolved: self.resolved.iter().cloned().collect(),
        }
    }

    fn from_record(r: &SentRecord) -> Option<Self> {
        Some(Self {
            at: Timestamp::from_millisecond(r.at).ok()?,
            firing: r.firing.iter().cloned().collect(),
            resolved: r.resolved.iter().cloned().collect(),
        })
    }
}

/// How long a notification log entry of a group that has not formed again
/// is kept (longer than any sensible repeat interval).
const LOG_KEPT_MS: i64 = 7 * 24 * 3600 * 1000;

struct Group {
    routes: Arc<CompiledRoutes>,
    route_id: String,
    receiver: String,
    key: String,
    labels: BTreeMap<String, String>,
    interval_ms: i64,
    repeat_ms: i64,
    members: BTreeMap<String, Member>,
    next_flush: Timestamp,
    /// Per integration of the receiver.
    last: BTreeMap<usize, Sent>,
}

#[derive(Default)]
struct State {
    raised: HashMap<AlertSource, Raised>,
    /// Keyed by routes name, route key, group labels.
    groups: BTreeMap<String, Group>,
    /// The notification log as last read or written: groups that form
    /// again take what they last sent from here.
    log: NotificationLog,
    /// The log changed since it was last written.
    log_dirty: bool,
}

pub struct Dispatcher {
    state: Mutex<State>,
    outbox: Arc<dyn Outbox>,
    clock: Clock,
    /// Wakes the flushing task when a group forms.
    wake: tokio::sync::Notify,
    store: Option<Arc<dyn LogStore>>,
}

fn add_ms(t: Timestamp, ms: i64) -> Timestamp {
    t.checked_add(jiff::SignedDuration::from_millis(ms))
        .unwrap_or(t)
}

fn group_labels(route: &Route, labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    if route.group_by.iter().any(|g| g == "...") {
        return labels.clone();
    }
    route
        .group_by
        .iter()
        .filter_map(|g| labels.get(g).map(|v| (g.clone(), v.clone())))
        .collect()
}

fn render_labels(labels: &BTreeMap<String, String>) -> String {
    let parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", parts.join(", "))
}

impl Dispatcher {
    pub fn new(outbox: Arc<dyn Outbox>, clock: Clock) -> Self {
        Self {
            state: Mutex::new(State::default()),
            outbox,
            clock,
            wake: tokio::sync::Notify::new(),
            store: None,
        }
    }

    /// Keep the notification log in `store`, so a restart or a new leader
    /// does not notify again what was already sent.
    pub fn with_store(mut self, store: Arc<dyn LogStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Read the notification log back (before alerts are reported: at
    /// start-up, or when this instance becomes the leader).
    pub async fn restore(&self) {
        let Some(store) = &self.store else { return };
        match store.load().await {
            Ok(log) => {
                let mut st = self.lock();
                for (key, g) in st.groups.iter_mut() {
                    if g.last.is_empty()
                        && let Some(entry) = log.get(key)
                    {
                        g.last = restored(entry);
                    }
                }
                tracing::info!(groups = log.len(), "notification log restored");
                st.log = log;
            }
            Err(e) => tracing::warn!(
                "reading the notification log failed; alerts still firing may be notified again: {e}"
            ),
        }
    }

    /// Write the notification log if it changed.
    async fn persist(&self) {
        let Some(store) = &self.store else { return };
        let log = {
            let mut st = self.lock();
            if !st.log_dirty {
                return;
            }
            st.log_dirty = false;
            let oldest = self.clock.now().as_millisecond() - LOG_KEPT_MS;
            st.log
                .retain(|_, by_integration| by_integration.values().any(|r| r.at >= oldest));
            st.log.clone()
        };
        if let Err(e) = store.save(log).await {
            self.lock().log_dirty = true;
            tracing::warn!(
                "writing the notification log failed (trying again after the next flush): {e}"
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        runbook_core::util::lock(&self.state)
    }

    /// Put `alert` into the groups of every route it reaches (and take it
    /// out of groups it no longer reaches, after a routes change).
    fn place(
        st: &mut State,
        routes: &Arc<CompiledRoutes>,
        source: &AlertSource,
        fp: &str,
        alert: &Alert,
        now: Timestamp,
    ) -> bool {
        let mut formed = false;
        let mut keys = BTreeSet::new();
        for route in routes.routes_for(&alert.labels) {
            let labels = group_labels(route, &alert.labels);
            // Keyed by the route's path: two sibling routes with the same
            // matchers are still two routes.
            let key = format!(
                "{}\u{0}{}\u{0}{}",
                routes.name,
                route.id,
                render_labels(&labels)
            );
            keys.insert(key.clone());
            let last = st.log.get(&key).map(restored).unwrap_or_default();
            let group = st.groups.entry(key).or_insert_with(|| {
                formed = true;
                Group {
                    routes: routes.clone(),
                    route_id: route.id.clone(),
                    receiver: route.receiver.clone(),
                    key: format!("{}:{}", route.key, render_labels(&labels)),
                    labels,
                    // Alertmanager expects firing alerts pushed again every
                    // resend interval: its groups flush that often.
                    interval_ms: resend_of(routes, &route.receiver)
                        .map_or(route.group_interval_ms, |r| r.min(route.group_interval_ms)),
                    repeat_ms: route.repeat_interval_ms,
                    members: BTreeMap::new(),
                    next_flush: add_ms(now, route.group_wait_ms),
                    last,
                }
            });
            group.routes = routes.clone();
            group.members.insert(
                fp.to_string(),
                Member {
                    alert: alert.clone(),
                    source: source.clone(),
                    resolved_at: None,
                },
            );
        }
        for (key, g) in st.groups.iter_mut() {
            if !keys.contains(key)
                && g.members
                    .get(fp)
                    .is_some_and(|m| &m.source == source && m.resolved_at.is_none())
            {
                g.members.remove(fp);
            }
        }
        formed
    }

    fn resolve(st: &mut State, source: &AlertSource, fp: &str, now: Timestamp) {
        for g in st.groups.values_mut() {
            if let Some(m) = g.members.get_mut(fp)
                && &m.source == source
                && m.resolved_at.is_none()
            {
                m.resolved_at = Some(now);
            }
        }
    }

    /// Flush every group that is due at `now`; the number of notifications sent.
    pub fn tick(&self) -> usize {
        let now = self.clock.now();
        let mut out: Vec<(Arc<CompiledRoutes>, Notification)> = Vec::new();
        {
            let mut st = self.lock();
            let firing: Vec<(String, Alert)> = st
                .raised
                .values()
                .filter_map(|r| r.routes.as_ref().map(|x| (x, &r.alerts)))
                .flat_map(|(x, alerts)| alerts.values().map(move |a| (x.name.clone(), a.clone())))
                .collect();
            let mut empty = Vec::new();
            let mut logged: Vec<(String, BTreeMap<usize, SentRecord>)> = Vec::new();
            for (key, g) in st.groups.iter_mut() {
                if g.next_flush > now {
                    continue;
                }
                g.next_flush = add_ms(now, g.interval_ms);
                let sent = flush(g, &firing, now);
                g.members.retain(|_, m| m.resolved_at.is_none());
                if g.members.is_empty() {
                    empty.push(key.clone());
                } else if !sent.is_empty() {
                    logged.push((
                        key.clone(),
                        g.last.iter().map(|(i, s)| (*i, s.record())).collect(),
                    ));
                }
                out.extend(sent.into_iter().map(|n| (g.routes.clone(), n)));
            }
            for k in empty {
                st.groups.remove(&k);
                // Its resolution went out: nothing of it is left to remember.
                st.log_dirty |= st.log.remove(&k).is_some();
            }
            for (k, entry) in logged {
                st.log.insert(k, entry);
                st.log_dirty = true;
            }
        }
        let count = out.len();
        for (routes, n) in out {
            self.outbox.send(&routes, n);
        }
        count
    }

    /// When the next group is due, if any.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.lock().groups.values().map(|g| g.next_flush).min()
    }

    /// Flush groups as time passes (real clock), until the task is dropped.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let d = self.clone();
        tokio::spawn(async move {
            loop {
                d.tick();
                d.persist().await;
                match d.next_due() {
                    Some(t) => {
                        let ms = t.as_millisecond() - d.clock.now().as_millisecond();
                        let wait = Duration::from_millis(ms.max(10) as u64);
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = d.wake.notified() => {}
                        }
                    }
                    // Nothing to flush until a group forms.
                    None => d.wake.notified().await,
                }
            }
        })
    }

    /// The aggregation groups: receiver, group key, number of alerts.
    pub fn active_groups(&self) -> Vec<(String, String, usize)> {
        self.lock()
            .groups
            .values()
            .map(|g| (g.receiver.clone(), g.key.clone(), g.members.len()))
            .collect()
    }
}

/// Whether an inhibit rule of `routes` mutes `alert`, given the firing
/// alerts routed by the same document.
fn inhibited(routes: &CompiledRoutes, alert: &Alert, firing: &[(String, Alert)]) -> bool {
    routes.inhibit_rules.iter().any(|rule| {
        rule.target.iter().all(|m| m.matches(&alert.labels))
            && firing.iter().any(|(doc, src)| {
                doc == &routes.name
                    && src.labels != alert.labels
                    && rule.source.iter().all(|m| m.matches(&src.labels))
                    && rule
                        .equal
                        .iter()
                        .all(|l| src.labels.get(l) == alert.labels.get(l))
            })
    })
}

/// A group's notifications at `now`, one per integration of its receiver
/// that has news (Alertmanager's deduplication, per integration:
/// something new fired, something it wants to hear of resolved, or the
/// repeat interval passed).
/// Whether an integration must hear of a group now, as Alertmanager
/// decides: an alert it has not heard of firing, the last firing one
/// resolved, a new resolution, or the repeat interval gone by.
fn news(
    last: Option<&Sent>,
    firing: &BTreeSet<String>,
    resolved: &BTreeSet<String>,
    now: Timestamp,
    repeat_ms: i64,
) -> bool {
    let Some(last) = last else {
        return !firing.is_empty();
    };
    if !firing.is_subset(&last.firing) {
        true
    } else if firing.is_empty() {
        !last.firing.is_empty() && !resolved.is_empty()
    } else if !resolved.is_empty() && !resolved.is_subset(&last.resolved) {
        true
    } else {
        now.as_millisecond() - last.at.as_millisecond() >= repeat_ms
    }
}

fn flush(g: &mut Group, firing_all: &[(String, Alert)], now: Timestamp) -> Vec<Notification> {
    let route = find_route(&g.routes.root, &g.route_id);
    if route.is_some_and(|r| r.muted_at(&g.routes, now)) {
        return Vec::new();
    }
    let mut alerts: Vec<NotifiedAlert> = g
        .members
        .iter()
        .filter(|(_, m)| !inhibited(&g.routes, &m.alert, firing_all))
        .map(|(fp, m)| NotifiedAlert {
            alert: m.alert.clone(),
            fingerprint: fp.clone(),
            source: m.source.clone(),
            ends_at: m.resolved_at,
        })
        .collect();
    alerts.sort_by(|a, b| (!a.firing(), &a.fingerprint).cmp(&(!b.firing(), &b.fingerprint)));
    let kinds: Vec<ReceiverKind> = g
        .routes
        .receivers
        .get(&g.receiver)
        .map(|r| r.kinds.clone())
        .unwrap_or_else(|| vec![ReceiverKind::Null]);
    let mut out = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let send_resolved = kind.send_resolved();
        let list: Vec<NotifiedAlert> = alerts
            .iter()
            .filter(|a| send_resolved || a.firing())
            .cloned()
            .collect();
        let set = |firing: bool| -> BTreeSet<String> {
            list.iter()
                .filter(|a| a.firing() == firing)
                .map(|a| a.fingerprint.clone())
                .collect()
        };
        let (firing, resolved) = (set(true), set(false));
        // Alertmanager is told again every resend interval, or it expires
        // the alerts; a notification's other receivers every repeat interval.
        let repeat_ms = match kind {
            ReceiverKind::Alertmanager { resend_ms, .. } => *resend_ms,
            _ => g.repeat_ms,
        };
        let needed = news(g.last.get(&i), &firing, &resolved, now, repeat_ms);
        if firing.is_empty() && resolved.is_empty() {
            // Nothing this integration hears of: the next alert is news.
            g.last.remove(&i);
        }
        if !needed {
            continue;
        }
        g.last.insert(
            i,
            Sent {
                at: now,
                firing,
                resolved,
            },
        );
        out.push(Notification {
            routes: g.routes.name.clone(),
            receiver: g.receiver.clone(),
            integration: i,
            group_key: g.key.clone(),
            group_labels: g.labels.clone(),
            alerts: list,
            time: now,
        });
    }
    out
}

/// The shortest resend interval of a receiver's Alertmanager integrations.
fn resend_of(routes: &CompiledRoutes, receiver: &str) -> Option<i64> {
    routes
        .receivers
        .get(receiver)?
        .kinds
        .iter()
        .filter_map(|k| match k {
            ReceiverKind::Alertmanager { resend_ms, .. } => Some(*resend_ms),
            _ => None,
        })
        .min()
}

/// A group's last notifications, as the log kept them.
fn restored(entry: &BTreeMap<usize, SentRecord>) -> BTreeMap<usize, Sent> {
    entry
        .iter()
        .filter_map(|(i, r)| Some((*i, Sent::from_record(r)?)))
        .collect()
}

fn find_route<'a>(r: &'a Route, id: &str) -> Option<&'a Route> {
    if r.id == id {
        return Some(r);
    }
    r.routes.iter().find_map(|c| find_route(c, id))
}

impl AlertSink for Dispatcher {
    fn firing(&self) -> BTreeMap<String, usize> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for g in self.lock().groups.values() {
            let firing = g
                .members
                .iter()
                .filter(|(_, m)| m.resolved_at.is_none())
                .map(|(fp, _)| fp.clone());
            out.entry(g.receiver.clone()).or_default().extend(firing);
        }
        out.into_iter().map(|(r, fps)| (r, fps.len())).collect()
    }

    fn report(
        &self,
        source: &AlertSource,
        routes: Option<&Arc<CompiledRoutes>>,
        alerts: Vec<Alert>,
    ) {
        let now = self.clock.now();
        let mut formed = false;
        {
            let mut st = self.lock();
            let before = st.raised.remove(source);
            let mut current: BTreeMap<String, Alert> = BTreeMap::new();
            for a in alerts {
                let fp = a.fingerprint();
                // An alert keeps the time it started firing.
                let starts_at = before
                    .as_ref()
                    .and_then(|b| b.alerts.get(&fp))
                    .map(|p| p.starts_at)
                    .unwrap_or(a.starts_at);
                current.insert(fp, Alert { starts_at, ..a });
            }
            if let Some(b) = &before {
                for fp in b.alerts.keys() {
                    if !current.contains_key(fp) {
                        Self::resolve(&mut st, source, fp, now);
                    }
                }
            }
            if let Some(r) = routes {
                for (fp, a) in &current {
                    formed |= Self::place(&mut st, r, source, fp, a, now);
                }
            } else if !current.is_empty() {
                tracing::debug!(policy = %source.policy, "alerts raised by a policy without alert routes are only logged");
            }
            if !current.is_empty() {
                st.raised.insert(
                    source.clone(),
                    Raised {
                        routes: routes.cloned(),
                        alerts: current,
                    },
                );
            }
        }
        if formed {
            self.wake.notify_one();
        }
    }

    fn restore(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(Dispatcher::restore(self))
    }

    fn retain(&self, keep: &dyn Fn(&AlertSource) -> bool) {
        let gone: Vec<AlertSource> = self
            .lock()
            .raised
            .keys()
            .filter(|s| !keep(s))
            .cloned()
            .collect();
        for s in gone {
            self.report(&s, None, Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runbook_core::policy::{Bundle, Origin};

    const ROUTES: &str = r#"
apiVersion: runbook.dev/v1alpha1
kind: AlertRoutes
metadata: {name: team}
spec:
  route:
    receiver: log
    groupBy: [alertname, namespace]
    groupWait: 30s
    groupInterval: 5m
    repeatInterval: 4h
    routes:
      - matchers: ['severity = "critical"']
        receiver: pager
        continue: true
      - matchers: ['team =~ "ml|data"']
        receiver: ml
  inhibitRules:
    - sourceMatchers: ['alertname = "RolledBack"']
      targetMatchers: ['severity = "warning"']
      equal: [namespace, name]
  receivers:
    - name: log
      log: {}
    - name: pager
      log: {}
    - name: ml
      log: {}
"#;

    fn routes() -> Arc<CompiledRoutes> {
        routes_from(ROUTES)
    }

    fn routes_from(yaml: &str) -> Arc<CompiledRoutes> {
        let bundle = Bundle::new(
            Origin::Inline("t".into()),
            [("routes.yaml".to_string(), yaml.to_string())].into(),
        );
        let engine = runbook_core::script::ScriptEngine::default();
        let mut loaded = runbook_core::policy::compile::load_bundle(&engine, &bundle, None);
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        Arc::new(loaded.routes.remove(0))
    }

    fn source(name: &str) -> AlertSource {
        AlertSource {
            policy: "p".into(),
            api_version: "runbook.dev/v1alpha1".into(),
            kind: "Evaluator".into(),
            namespace: "prod".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn alert(name: &str, pairs: &[(&str, &str)], now: Timestamp) -> Alert {
        let mut labels: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.insert("namespace".into(), "prod".into());
        labels.insert("name".into(), name.into());
        Alert {
            labels,
            annotations: BTreeMap::new(),
            starts_at: now,
        }
    }

    struct World {
        clock: Clock,
        outbox: Arc<RecordingOutbox>,
        d: Dispatcher,
        routes: Arc<CompiledRoutes>,
    }

    impl World {
        fn new() -> Self {
            Self::with(routes())
        }
        fn with(routes: Arc<CompiledRoutes>) -> Self {
            let clock = Clock::manual("2026-11-29T10:00:00Z".parse().unwrap());
            let outbox = Arc::new(RecordingOutbox::default());
            let d = Dispatcher::new(outbox.clone(), clock.clone());
            Self {
                clock,
                outbox,
                d,
                routes,
            }
        }
        fn raise(&self, name: &str, alerts: &[&[(&str, &str)]]) {
            let now = self.clock.now();
            let list = alerts.iter().map(|a| alert(name, a, now)).collect();
            self.d.report(&source(name), Some(&self.routes), list);
        }
        fn at(&self, secs: u64) -> Vec<Notification> {
            self.clock.set(add_ms(
                "2026-11-29T10:00:00Z".parse().unwrap(),
                secs as i64 * 1000,
            ));
            self.d.tick();
            self.outbox.take()
        }
    }

    fn summary(ns: &[Notification]) -> Vec<(String, String, usize, usize)> {
        let mut v: Vec<_> = ns
            .iter()
            .map(|n| {
                (
                    n.receiver.clone(),
                    n.status().to_string(),
                    n.firing().count(),
                    n.alerts.len() - n.firing().count(),
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_group_waits_then_notifies_then_batches_by_interval() {
        let w = World::new();
        w.raise("a", &[&[("alertname", "Drift"), ("team", "ml")]]);
        assert!(w.at(29).is_empty(), "held for groupWait");
        let first = w.at(30);
        assert_eq!(summary(&first), [("ml".into(), "firing".into(), 1, 0)]);
        assert_eq!(
            first[0].group_key,
            r#"{}/{team=~"ml|data"}:{alertname="Drift", namespace="prod"}"#
        );
        // A second alert in the same group waits for the group interval.
        w.clock.set(add_ms(w.clock.now(), 10_000));
        w.raise("b", &[&[("alertname", "Drift"), ("team", "ml")]]);
        assert!(w.at(60).is_empty());
        assert!(w.at(329).is_empty());
        let second = w.at(330);
        assert_eq!(summary(&second), [("ml".into(), "firing".into(), 2, 0)]);
        // Nothing new: silent until the repeat interval.
        assert!(w.at(630).is_empty());
        assert!(w.at(4 * 3600 + 30).is_empty(), "not yet 4h since 330s");
        let repeat = w.at(4 * 3600 + 330 + 300);
        assert_eq!(summary(&repeat), [("ml".into(), "firing".into(), 2, 0)]);
    }

    #[test]
    fn a_cleared_alert_is_sent_resolved_once_and_its_group_ends() {
        let w = World::new();
        w.raise("a", &[&[("alertname", "Drift"), ("team", "ml")]]);
        assert_eq!(w.at(30).len(), 1);
        let started = w.d.lock().raised[&source("a")]
            .alerts
            .values()
            .next()
            .unwrap()
            .starts_at;
        w.clock.set(add_ms(w.clock.now(), 60_000));
        w.raise("a", &[&[("alertname", "Drift"), ("team", "ml")]]);
        assert_eq!(
            w.d.lock().raised[&source("a")]
                .alerts
                .values()
                .next()
                .unwrap()
                .starts_at,
            started,
            "a re-raised alert keeps its start"
        );
        w.raise("a", &[]);
        let resolved = w.at(330);
        assert_eq!(summary(&resolved), [("ml".into(), "resolved".into(), 0, 1)]);
        assert!(resolved[0].alerts[0].ends_at.is_some());
        assert!(w.d.active_groups().is_empty(), "the group is gone");
        assert!(w.at(630).is_empty());
    }

    #[test]
    fn continue_sends_to_every_matching_route_and_groups_split_by_labels() {
        let w = World::new();
        w.raise(
            "a",
            &[&[
                ("alertname", "Drift"),
                ("severity", "critical"),
                ("team", "ml"),
            ]],
        );
        w.raise("b", &[&[("alertname", "Other"), ("severity", "info")]]);
        let sent = w.at(30);
        assert_eq!(
            summary(&sent),
            [
                ("log".into(), "firing".into(), 1, 0),
                ("ml".into(), "firing".into(), 1, 0),
                ("pager".into(), "firing".into(), 1, 0),
            ]
        );
    }

    #[test]
    fn a_receiver_two_matching_routes_name_is_notified_once_per_route() {
        // As Alertmanager does (and `amtool config routes test` lists it twice).
        let w = World::with(routes_from(
            r#"
apiVersion: runbook.dev/v1alpha1
kind: AlertRoutes
metadata: {name: twice}
spec:
  route:
    receiver: log
    groupWait: 0s
    routes:
      - matchers: ['severity = "critical"']
        receiver: pager
        continue: true
      - matchers: ['team = "ml"']
        receiver: pager
  receivers:
    - {name: log, log: {}}
    - {name: pager, log: {}}
"#,
        ));
        w.raise(
            "a",
            &[&[
                ("alertname", "Drift"),
                ("severity", "critical"),
                ("team", "ml"),
            ]],
        );
        let sent = w.at(1);
        assert_eq!(
            summary(&sent),
            [
                ("pager".into(), "firing".into(), 1, 0),
                ("pager".into(), "firing".into(), 1, 0),
            ]
        );
        assert_ne!(sent[0].group_key, sent[1].group_key, "one group per route");
    }

    #[test]
    fn a_firing_source_alert_inhibits_matching_targets_with_equal_labels() {
        let w = World::new();
        w.raise(
            "a",
            &[
                &[("alertname", "RolledBack"), ("severity", "critical")],
                &[("alertname", "Degraded"), ("severity", "warning")],
            ],
        );
        // Same alert name on another object: not inhibited (name differs).
        w.raise(
            "b",
            &[&[("alertname", "Degraded"), ("severity", "warning")]],
        );
        let sent = w.at(30);
        let names: Vec<(String, Vec<String>)> = sent
            .iter()
            .map(|n| {
                (
                    n.receiver.clone(),
                    n.alerts
                        .iter()
                        .map(|a| {
                            format!("{}/{}", a.alert.labels["alertname"], a.alert.labels["name"])
                        })
                        .collect(),
                )
            })
            .collect();
        assert!(
            names
                .iter()
                .all(|(_, a)| !a.contains(&"Degraded/a".to_string())),
            "the warning of the rolled-back object is muted: {names:?}"
        );
        assert!(
            names
                .iter()
                .any(|(_, a)| a.contains(&"Degraded/b".to_string())),
            "{names:?}"
        );
        assert!(
            names
                .iter()
                .any(|(r, a)| r == "pager" && a == &["RolledBack/a".to_string()])
        );
    }

    #[test]
    fn retain_resolves_the_alerts_of_deleted_objects() {
        let w = World::new();
        w.raise("a", &[&[("alertname", "Drift"), ("team", "ml")]]);
        assert_eq!(w.at(30).len(), 1);
        w.d.retain(&|s| s.name != "a");
        let sent = w.at(330);
        assert_eq!(summary(&sent), [("ml".into(), "resolved".into(), 0, 1)]);
    }

    /// Alertmanager resolves an alert nobody pushes again: the dispatcher
    /// pushes firing alerts to it every resend interval, however long the
    /// route's repeat interval, and the resolution once.
    #[test]
    fn alertmanager_hears_of_firing_alerts_every_resend_interval() {
        let text = ROUTES
            .replace("receiver: log\n    groupBy", "receiver: am\n    groupBy")
            .replace(
                "    - name: log\n      log: {}",
                "    - name: log\n      log: {}\n    - name: am\n      alertmanager: {url: \"http://127.0.0.1:9093\", resendInterval: 1m}",
            );
        let bundle = Bundle::new(
            Origin::Inline("t".into()),
            [("routes.yaml".to_string(), text)].into(),
        );
        let engine = runbook_core::script::ScriptEngine::default();
        let mut loaded = runbook_core::policy::compile::load_bundle(&engine, &bundle, None);
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        let w = World {
            routes: Arc::new(loaded.routes.remove(0)),
            ..World::new()
        };
        w.raise("a", &[&[("alertname", "Drift")]]);
        assert_eq!(summary(&w.at(30)), [("am".into(), "firing".into(), 1, 0)]);
        // The group flushes every minute (not every 5m) and tells again.
        assert!(w.at(60).is_empty(), "not a minute yet");
        assert_eq!(summary(&w.at(90)), [("am".into(), "firing".into(), 1, 0)]);
        assert_eq!(summary(&w.at(150)), [("am".into(), "firing".into(), 1, 0)]);
        w.raise("a", &[]);
        assert_eq!(
            summary(&w.at(210)),
            [("am".into(), "resolved".into(), 0, 1)]
        );
        assert!(w.at(270).is_empty(), "resolved once, then gone");
    }
}
