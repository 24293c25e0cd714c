//! The context every reconcile shares, in cohesive parts: the shared
//! services (client, engine, policies, clock, discovery, metrics, alerts,
//! Events), what health reports, the watches running, the work queue, and
//! what reconciles remember from one to the next.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use crate::util::channel::{self, Sent};
use runbook_core::observe::RawObject;

use super::leader::LeaseConfig;
use crate::act;
use crate::events::EventWriter;
use crate::observe::cache::{Change, Informer};
use crate::observe::discovery::Resources;
use crate::observe::health::WatchHealth;
use crate::observe::view::{Source, Sources, TargetKey, target_ref};
use crate::telemetry::Metrics;
use crate::telemetry::journal::Journal;
use runbook_core::alert::AlertSink;
use runbook_core::clock::Clock;
use runbook_core::crd::DecisionRecord;
use runbook_core::kinds::KindRef;
use runbook_core::policy::PolicySet;
use runbook_core::policy::limits::Breaker;
use runbook_core::script::ScriptEngine;
use runbook_core::util::lock;

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Watch and reconcile only this namespace (None: every namespace).
    pub namespace: Option<String>,
    pub concurrency: u16,
    /// Names this instance in the Lease and in Events.
    pub identity: String,
    /// Leader election; None runs as the only instance.
    pub lease: Option<LeaseConfig>,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// The key of the author records the authorship webhook writes
    /// (`None`: no webhook, so no target has an author Runbook trusts).
    pub signer: Option<crate::admission::Signer>,
    /// Serve the authorship webhook (and, leading, keep its configuration
    /// in step); its key then signs the author records.
    pub webhook: Option<super::webhook::WebhookConfig>,
    /// The operator's namespace: where Runbook's state of cluster-scoped
    /// targets is kept when every namespace is watched.
    pub operator_namespace: String,
    /// Decide again on every reconcile skipped as unchanged and report a
    /// different decision (`Context::skip_differences`): what scenario
    /// runs and the test suite turn on.
    pub check_skips: bool,
    /// How many items each of the operator's queues (changes to route,
    /// targets to reconcile) holds before a full one drops and a resync
    /// makes up for it.
    pub queue_capacity: usize,
    /// Share the targets with the other replicas of the ring (the
    /// `lease`'s), each deciding for its own (see `runtime::assign`).
    pub shards: bool,
    /// How many replicas of the ring start together (the Deployment's
    /// `replicas`): once that many are live and none holds a place yet,
    /// they join the ring at once instead of waiting to settle. Only a
    /// hint: a wrong count costs a wait or a move, never a decision.
    pub shard_replicas: Option<usize>,
    /// Who tenants' policies act as, and what their pods may ask for.
    pub tenancy: super::tenants::TenancyConfig,
    /// How much of the operator one policy may take.
    pub fair: super::fair::FairConfig,
    /// How long each watch asks the API server to keep it open before it
    /// is made again (kube's 290 s; a simulated week, whose clock jumps,
    /// asks for longer, or it spends its time remaking watches).
    pub watch_timeout_secs: u32,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            concurrency: 16,
            identity: "runbook".into(),
            lease: None,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            signer: None,
            webhook: None,
            operator_namespace: "runbook-system".into(),
            check_skips: false,
            queue_capacity: 65_536,
            shards: false,
            shard_replicas: None,
            tenancy: Default::default(),
            fair: Default::default(),
            watch_timeout_secs: crate::observe::cache::WATCH_TIMEOUT_SECS,
        }
    }
}

/// A decision of a shadow policy, kept for inspection.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ShadowRecord {
    pub time: String,
    pub target: String,
    pub record: DecisionRecord,
}

/// Everything a reconcile shares: no globals. The shared services first,
/// then four parts, each with one job.
pub struct Context {
    pub client: Client,
    pub engine: Arc<ScriptEngine>,
    pub policies: ArcSwap<PolicySet>,
    pub clock: Clock,
    pub resources: Resources,
    pub metrics: Arc<Metrics>,
    pub alerts: Arc<dyn AlertSink>,
    pub recorder: EventWriter,
    /// Who each tenant's policies act as.
    pub tenants: super::tenants::Tenants,
    /// Each policy's share of the operator: reconciles at once, and
    /// script time per second.
    pub fair: super::fair::FairShare,
    pub config: OperatorConfig,
    /// Who targets are acted for, and what they may do.
    pub authority: act::authorize::Authority,
    /// The authorship webhook this process serves, once started.
    pub webhook: std::sync::OnceLock<Arc<super::webhook::Webhook>>,
    /// What `/readyz` and the leader's metrics report.
    pub health: Health,
    /// The source of metric inputs (`spec.metrics`) and its answers.
    pub queries: super::queries::Queries,
    /// Reconciles skipped as unchanged that decided differently when
    /// decided again (`OperatorConfig::check_skips`), each told in a line.
    pub skip_differences: Mutex<Vec<String>>,
    /// The watches and controllers running.
    pub(super) running: Running,
    /// Work waiting, failing and in flight.
    pub(super) queue: Queue,
    /// What reconciles remember from one to the next.
    pub(super) memory: Memory,
    pub(super) stop: watch::Receiver<bool>,
}

/// What `/readyz` and the leader's metrics report.
#[derive(Default)]
pub struct Health {
    /// Controllers are running (on the leader).
    pub ready: Arc<AtomicBool>,
    /// Policies loaded and watch caches filled: what `/readyz` reports, on
    /// the leader and on standbys alike, so rolling updates of a
    /// leader-elected Deployment are not held up by the standby.
    pub synced: Arc<AtomicBool>,
    pub leading: Arc<AtomicBool>,
    /// Which watches fail, since when: `/readyz` reports them.
    pub watches: Arc<WatchHealth>,
    /// What start-up waits for (discovery during an outage), and why.
    pub waiting: Arc<crate::observe::health::Waiting>,
    /// Writes the API server refused lately for lack of permission.
    pub forbidden: Arc<super::forbidden::Forbidden>,
    /// The policies set aside for a kind the API server does not serve,
    /// each with those kinds: they load by themselves once served.
    pub set_aside: watch::Sender<SetAside>,
}

/// Policies set aside, by id, each with the kinds it names that are not
/// served.
pub type SetAside = std::collections::BTreeMap<String, Vec<KindRef>>;

/// The watches running: an informer per kind policies own or read, a
/// controller per target kind.
#[derive(Default)]
pub(super) struct Running {
    pub informers: Mutex<HashMap<KindRef, Arc<Informer>>>,
    pub targets: Mutex<HashMap<KindRef, TargetController>>,
    /// Sharded: what this replica knows of the ring.
    pub placement: super::shard::Placement,
    /// Told when a target controller's task ends, so the supervisor
    /// looks at once instead of polling (a simulated week has no
    /// idle wake-ups).
    pub controller_ended: Arc<tokio::sync::Notify>,
    /// Told when the policies change, so the sweeps (`sweeps.rs`) look
    /// at once at those that are new or edited.
    pub sweeps_changed: Arc<tokio::sync::Notify>,
}

/// A target deleted, as its watch last saw it, waiting for the policies
/// that hear of deletions (`deleted.rs`).
pub(super) struct Gone {
    pub kind: KindRef,
    pub object: runbook_core::observe::RawObject,
}

/// Work waiting, failing and in flight.
pub(super) struct Queue {
    /// Targets triggered and not reconciled yet.
    pub pending: Mutex<HashSet<TargetKey>>,
    pub in_flight: AtomicUsize,
    /// Moves whenever a reconcile finishes.
    pub activity: AtomicU64,
    /// Changes of cached objects, to route to the targets they concern.
    pub changes: channel::Sender<Change>,
    /// Targets deleted, for the policies that hear of it (`deleted.rs`).
    pub deleted: channel::Sender<Gone>,
    /// Moves with every resync asked for (and every controller restart):
    /// a decision made before one is made again.
    pub resyncs: AtomicU64,
}

/// What reconciles remember from one to the next. Everything kept per
/// target is here, and [`Memory::prune`] drops all of it for targets no
/// longer cached (deleted, even while a watch was down).
#[derive(Default)]
pub(super) struct Memory {
    /// One record per target: its last decisions and what they looked up
    /// (shared with each decision's `Tracking`, which notes reads into
    /// it), its failures in a row, and its status and state as this
    /// process wrote them.
    pub records: Arc<super::records::Records>,
    /// Targets (by uid) whose RunbookState was just removed, and when:
    /// the garbage collector removes it as its target goes, often before
    /// the target's own deletion reaches its controller (`states_gone`).
    pub states_gone: Mutex<HashMap<String, tokio::time::Instant>>,
    breakers: Mutex<HashMap<String, Breaker>>,
    /// Children this process applied that the cache may not show yet.
    pub applied: runbook_core::plan::Applied,
    /// Kinds whose status a write showed to prune Runbook's fields: their
    /// targets' state is kept apart from then on.
    pruning: Mutex<HashSet<KindRef>>,
    /// Status fields a policy writes that a target kind's schema drops
    /// (from its served schema, or a write's answer), by policy and kind.
    dropped: Mutex<HashMap<(String, KindRef), std::collections::BTreeSet<String>>>,
    /// Whether the API server serves `RunbookState` (checked at start).
    pub states_served: std::sync::atomic::AtomicBool,
    shadow: Mutex<VecDeque<ShadowRecord>>,
    /// The alerts of deleted targets that keep firing a while, until when
    /// (see `deleted.rs`).
    pub held_alerts: Mutex<HashMap<runbook_core::alert::AlertSource, jiff::Timestamp>>,
    /// Where action outcomes are written down, when someone listens (scenarios).
    pub journal: std::sync::OnceLock<Arc<dyn Journal>>,
}

impl Memory {
    /// Keep what is remembered of the targets `alive` only.
    pub fn prune(&self, alive: &HashSet<TargetKey>) {
        self.records.retain(alive);
    }

    /// How many targets have something of each kind remembered, by kind.
    pub fn remembered(&self) -> [(&'static str, usize); 5] {
        self.records.counts()
    }

    /// Whether `kind`'s status was seen to prune Runbook's fields.
    pub fn is_pruning(&self, kind: &KindRef) -> bool {
        lock(&self.pruning).contains(kind)
    }

    /// `kind`'s status was seen to prune Runbook's fields: whether that is
    /// news.
    pub fn mark_pruning(&self, kind: &KindRef) -> bool {
        lock(&self.pruning).insert(kind.clone())
    }

    /// The status fields of `policy`'s writes on `kind` the API server
    /// drops.
    pub fn dropped_fields(&self, policy: &str, kind: &KindRef) -> Vec<String> {
        lock(&self.dropped)
            .get(&(policy.to_string(), kind.clone()))
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// A write of `policy` on `kind` showed these fields `dropped` and
    /// these `kept` (again).
    pub fn note_dropped(&self, policy: &str, kind: &KindRef, dropped: &[String], kept: &[String]) {
        let mut d = lock(&self.dropped);
        let known = d.entry((policy.to_string(), kind.clone())).or_default();
        known.extend(dropped.iter().cloned());
        for k in kept {
            known.remove(k);
        }
    }

    /// Forget every dropped field (the served schemas are read again).
    pub fn forget_dropped(&self) {
        lock(&self.dropped).clear();
    }

    /// Whether `policy`'s circuit breaker is open at `now_ms` (why, if so).
    pub fn breaker_open(
        &self,
        policy: &str,
        cb: &runbook_core::policy::limits::CircuitBreaker,
        now_ms: i64,
    ) -> Option<String> {
        lock(&self.breakers)
            .entry(policy.to_string())
            .or_default()
            .open(cb, now_ms)
    }

    /// Count a decision of `policy` at `now_ms` in its circuit breaker.
    pub fn breaker_record(
        &self,
        policy: &str,
        cb: &runbook_core::policy::limits::CircuitBreaker,
        now_ms: i64,
        failed: bool,
    ) {
        lock(&self.breakers)
            .entry(policy.to_string())
            .or_default()
            .record(cb, now_ms, failed);
    }

    /// Keep a shadow decision, with the newest `keep` only.
    pub fn keep_shadow(&self, record: ShadowRecord, keep: usize) {
        let mut log = lock(&self.shadow);
        log.push_back(record);
        while log.len() > keep {
            log.pop_front();
        }
    }

    /// Shadow decisions, newest last.
    pub fn shadow_records(&self) -> Vec<ShadowRecord> {
        lock(&self.shadow).iter().cloned().collect()
    }
}

impl Context {
    /// Write every action's outcome to `journal` from now on (once).
    pub fn set_journal(&self, journal: Arc<dyn Journal>) {
        let _ = self.memory.journal.set(journal);
    }

    /// Who asks for `p`'s metric inputs: its client, and where its
    /// addresses and credentials are read.
    pub fn asker_for<'a>(
        &'a self,
        p: &'a runbook_core::policy::CompiledPolicy,
        acting: Option<&'a super::tenants::Acting>,
    ) -> super::queries::Asker<'a> {
        super::queries::Asker {
            client: acting.map_or(&self.client, |a| &a.client),
            namespace: p
                .tenant
                .as_deref()
                .unwrap_or(&self.config.operator_namespace),
            tenant_hosts: p
                .tenant
                .as_ref()
                .map(|_| self.config.tenancy.metric_hosts.as_slice()),
            metrics: &self.metrics,
        }
    }

    /// The caches a reconcile reads, by kind.
    pub fn sources(&self) -> Sources {
        let mut map = HashMap::new();
        for (k, i) in lock(&self.running.informers).iter() {
            map.insert(k.clone(), Source::Informer(i.cache.clone()));
        }
        for (k, t) in lock(&self.running.targets).iter() {
            map.insert(
                k.clone(),
                Source::Targets(t.store.clone(), t.resource.clone(), t.index.clone()),
            );
        }
        Sources(map)
    }

    /// The writer of this process, at the clock's time.
    pub fn writer(&self) -> act::Writer<'_> {
        self.writer_as(None)
    }

    /// How `p` acts: as its tenant's account (`Some`), or as the operator.
    pub fn acting_for(
        &self,
        p: &runbook_core::policy::CompiledPolicy,
    ) -> Option<Arc<super::tenants::Acting>> {
        p.tenant.as_deref().map(|t| self.tenants.acting(t))
    }

    /// The writer of a policy that acts as `acting` (`None`: the
    /// operator), at the clock's time.
    pub fn writer_as<'a>(&'a self, acting: Option<&'a super::tenants::Acting>) -> act::Writer<'a> {
        act::Writer {
            client: acting.map_or(&self.client, |a| &a.client),
            recorder: Some(acting.map_or(&self.recorder, |a| &a.recorder)),
            journal: self.memory.journal.get().map(|j| j.as_ref()),
            applied: Some(&self.memory.applied),
            now: self.clock.now(),
            manager: act::MANAGER,
        }
    }

    /// Shadow decisions, newest last.
    pub fn shadow_records(&self) -> Vec<ShadowRecord> {
        self.memory.shadow_records()
    }

    pub(super) fn trigger(&self, key: TargetKey) {
        let targets = lock(&self.running.targets);
        if let Some(t) = targets.get(&key.kind) {
            let r = target_ref(&t.resource, &key.namespace, &key.name);
            // Woken before it is sent: the reconcile it starts decides
            // again, however unchanged the target itself is.
            self.memory.records.wake(&key);
            match t.trigger.send(r) {
                Sent::Queued => {
                    let mut pending = lock(&self.queue.pending);
                    pending.insert(key);
                    self.metrics.queue_depth.set(pending.len() as i64);
                }
                // Too many waiting: the kind is reconciled whole instead
                // (the target was woken above, so it decides again).
                Sent::Dropped => {
                    let resync = t.resync.send(());
                    // Told once per resync it asks for, not per drop.
                    self.overflowed("trigger", 1, resync == Sent::Queued);
                }
                Sent::Closed => {}
            }
        }
    }

    /// Count `n` items a full queue dropped (`tell`: say so in the log).
    pub(super) fn overflowed(&self, queue: &str, n: u64, tell: bool) {
        if tell {
            tracing::warn!(
                queue,
                dropped = n,
                "a queue was full: what it dropped is made up by a resync"
            );
        }
        self.metrics
            .queue_overflows
            .get_or_create(&Metrics::labels(&[("queue", queue)]))
            .inc_by(n);
    }

    /// Resolve the alerts of objects that are gone (or were replaced by a
    /// new object of the same name) and of policies no longer loaded.
    /// Only the leader's caches are complete enough to say so.
    pub fn sweep_alerts(&self) {
        if !self.health.leading.load(Ordering::Acquire)
            || !self.health.ready.load(Ordering::Acquire)
        {
            return;
        }
        let set = self.policies.load_full();
        let mut held = lock(&self.memory.held_alerts);
        let now = self.clock.now();
        held.retain(|_, until| *until > now);
        let targets = lock(&self.running.targets);
        let alive = |s: &runbook_core::alert::AlertSource| {
            if !set.policies.contains_key(&s.policy) {
                return false;
            }
            if held.contains_key(s) {
                return true;
            }
            let kind = KindRef::new(s.api_version.clone(), s.kind.clone());
            // A sweep's alerts are its policy's while it sweeps.
            if runbook_core::kinds::is_sweep(&kind) {
                return set.policies.get(&s.policy).is_some_and(|p| p.sweep);
            }
            let Some(t) = targets.get(&kind) else {
                return false;
            };
            let r = target_ref(&t.resource, &s.namespace, &s.name);
            t.store
                .get(&r)
                .is_some_and(|o| o.meta.uid.as_deref().unwrap_or("") == s.uid)
        };
        self.alerts.retain(&alive);
    }

    /// Reconcile every target of these kinds (all kinds if empty) again.
    pub fn resync(&self, kinds: &[KindRef]) {
        self.queue.resyncs.fetch_add(1, Ordering::AcqRel);
        for (k, t) in lock(&self.running.targets).iter() {
            if kinds.is_empty() || kinds.contains(k) {
                let _ = t.resync.send(());
            }
        }
    }

    /// Where a sweep (`sweeps.rs`) is decided: its made-up target, named
    /// after its policy in its policy's namespace (a tenant's, else the
    /// one the operator reconciles or its own).
    pub(super) fn sweep_key(&self, p: &runbook_core::policy::compile::CompiledPolicy) -> TargetKey {
        let namespace = p
            .tenant
            .clone()
            .or_else(|| self.config.namespace.clone().filter(|n| !n.is_empty()))
            .unwrap_or_else(|| self.config.operator_namespace.clone());
        TargetKey {
            kind: runbook_core::kinds::sweep_kind(),
            namespace,
            name: p.name.clone(),
        }
    }

    /// Drop what reconciles remember of targets no longer cached (the
    /// operator does it every 15 s).
    pub fn prune_memory(&self) {
        let kinds: Vec<KindRef> = lock(&self.running.targets).keys().cloned().collect();
        let mut alive: HashSet<TargetKey> = self.target_keys(&kinds).into_iter().collect();
        let set = self.policies.load_full();
        alive.extend(set.sweeps().map(|p| self.sweep_key(p)));
        self.memory.prune(&alive);
    }

    /// What reconciles remember, by per-target store: how many targets
    /// each holds something of.
    pub fn remembered(&self) -> [(&'static str, usize); 5] {
        self.memory.remembered()
    }

    /// Reconcile these targets again.
    pub fn requeue(&self, keys: impl IntoIterator<Item = TargetKey>) {
        for k in keys {
            self.trigger(k);
        }
    }

    /// Every target currently cached, of the given kinds.
    pub fn target_keys(&self, kinds: &[KindRef]) -> Vec<TargetKey> {
        let targets = lock(&self.running.targets);
        let mut out = Vec::new();
        for (k, t) in targets.iter().filter(|(k, _)| kinds.contains(k)) {
            for o in t.store.state() {
                out.push(TargetKey {
                    kind: k.clone(),
                    namespace: o.meta.namespace.clone().unwrap_or_default(),
                    name: o.meta.name.clone().unwrap_or_default(),
                });
            }
        }
        out
    }

    /// Reconciles running right now.
    pub fn in_flight(&self) -> usize {
        self.queue.in_flight.load(Ordering::Acquire)
    }

    /// A counter that moves whenever a reconcile finishes.
    pub fn activity(&self) -> u64 {
        self.queue.activity.load(Ordering::Acquire)
    }

    /// Targets waiting after a change.
    pub fn pending(&self) -> usize {
        lock(&self.queue.pending).len()
    }
}

pub(super) struct TargetController {
    /// The kind as served, shared by the keys of the store.
    pub resource: Arc<kube::core::ApiResource>,
    pub store: Store<RawObject>,
    /// Where the store's objects are, by namespace, label and owner.
    pub index: Arc<crate::observe::index::TargetIndex>,
    pub trigger: channel::Sender<ObjectRef<RawObject>>,
    pub resync: channel::Sender<()>,
    pub task: tokio::task::JoinHandle<()>,
    /// Why the task ended, when it ended on its own.
    pub ended: Arc<Mutex<Option<String>>>,
    /// How many times this kind's controller was restarted.
    pub restarts: u32,
    /// The policies' label selector, if any.
    pub selector: Option<String>,
    /// What its watch asks the API server for: the policies' selector
    /// and, sharded, the shard labels this replica watches.
    pub watch: Option<String>,
    /// The namespaces it watches (none: all, or the one reconciled).
    pub namespaces: Vec<String>,
}
