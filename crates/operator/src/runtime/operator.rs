//! The operator: starts the watches and controllers a policy set needs
//! (once it leads), swaps policy sets in, routes cache changes to the
//! targets they concern, and shuts down.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use kube::Client;
use tokio::sync::watch;

use super::context::{Context, Health, Memory, OperatorConfig, Queue, Running, TargetController};
use super::controllers::{SUPERVISE_EVERY, spawn_target};
use super::leader::Elector;
use crate::act;
use crate::events::EventWriter;
use crate::observe::cache::{Change, spawn_informer};
use crate::observe::discovery::Resources;
use crate::observe::health::WatchHealth;
use crate::observe::view::TargetKey;
use crate::telemetry::Metrics;
use crate::util::channel;
use runbook_core::alert::AlertSink;
use runbook_core::clock::Clock;
use runbook_core::kinds::KindRef;
use runbook_core::policy::PolicySet;
use runbook_core::script::ScriptEngine;
use runbook_core::util::lock;

/// How often, and how far apart, start-up asks discovery again for a kind
/// it does not list (a CRD being established): two seconds in all.
const DISCOVERY_RETRIES: u32 = 8;
const DISCOVERY_RETRY_EVERY: Duration = Duration::from_millis(250);

/// Why the operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    MissingKinds(String),
    #[error("discovery failed: {}", crate::util::api_error(.0))]
    Discovery(kube::Error),
    #[error("the authorship webhook: {0}")]
    Webhook(#[source] crate::admission::WebhookError),
}

/// How often the alerts of deleted objects are resolved, and what
/// reconciles remember of deleted targets dropped.
const ALERT_SWEEP: Duration = Duration::from_secs(15);
/// The targets' gauge is counted at least this often, changed or not.
const RECOUNT_EVERY: Duration = Duration::from_secs(300);

/// The operator.
pub struct Operator {
    pub ctx: Arc<Context>,
    stop: watch::Sender<bool>,
    changes_rx: Mutex<Option<channel::Receiver<Change>>>,
    deleted_rx: Mutex<Option<channel::Receiver<super::context::Gone>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    leading_rx: watch::Receiver<bool>,
    leading_tx: Mutex<Option<watch::Sender<bool>>>,
    /// The set last offered (`new`, `swap_policies`), before policies on
    /// kinds not served were set aside: what discovery is checked against
    /// again. Held while a set is swapped in, so swaps take turns.
    pub(super) offered: tokio::sync::Mutex<PolicySet>,
}

/// How often discovery is looked at again while a policy is set aside
/// (besides each change of a CustomResourceDefinition).
pub const REDISCOVER_EVERY: Duration = Duration::from_secs(30);

/// How long start-up and a policy edit wait for the caches to fill.
const SYNC_WAIT: Duration = Duration::from_secs(60);

impl Operator {
    pub fn new(
        client: Client,
        engine: Arc<ScriptEngine>,
        policies: PolicySet,
        clock: Clock,
        alerts: Arc<dyn AlertSink>,
        metrics: Arc<Metrics>,
        config: OperatorConfig,
    ) -> Self {
        let (stop, stop_rx) = watch::channel(false);
        // Changes of watched objects waiting to be routed to the targets
        // they concern; past the capacity, one drops and every target is
        // resynced.
        let (changes, changes_rx) = channel::bounded(config.queue_capacity);
        // Deleted targets waiting for the policies that hear of it.
        let (deleted, deleted_rx) = channel::bounded(config.queue_capacity);
        let (leading_tx, leading_rx) = watch::channel(false);
        // Both queues' overflow counts exist from the start, at 0.
        for queue in ["changes", "trigger", "deleted"] {
            metrics
                .queue_overflows
                .get_or_create(&Metrics::labels(&[("queue", queue)]))
                .inc_by(0);
        }
        let watches = Arc::new(WatchHealth::with_metrics(metrics.clone()));
        // Every write's answer is looked at: a 403 counts, and keeps the
        // instance unready until the same write succeeds.
        let forbidden = Arc::new(super::forbidden::Forbidden::with_metrics(metrics.clone()));
        let tenants =
            super::tenants::Tenants::new(client.clone(), config.tenancy.clone(), &config.identity);
        let client = super::forbidden::observed(client, forbidden.clone());
        let ctx = Arc::new(Context {
            recorder: EventWriter::of_runbook(client.clone(), &config.identity),
            tenants,
            fair: super::fair::FairShare::new(config.fair.clone(), metrics.clone()),
            authority: act::authorize::Authority::new(client.clone(), config.signer.clone()),
            webhook: std::sync::OnceLock::new(),
            resources: Resources::new(client.clone()),
            client,
            engine,
            policies: ArcSwap::from_pointee(policies.clone()),
            clock,
            metrics,
            alerts,
            config,
            health: Health {
                watches,
                forbidden,
                ..Health::default()
            },
            queries: Default::default(),
            skip_differences: Mutex::default(),
            running: Running::default(),
            queue: Queue {
                pending: Default::default(),
                in_flight: Default::default(),
                activity: Default::default(),
                changes,
                deleted,
                resyncs: Default::default(),
            },
            memory: Memory::default(),
            stop: stop_rx,
        });
        Self {
            ctx,
            stop,
            changes_rx: Mutex::new(Some(changes_rx)),
            deleted_rx: Mutex::new(Some(deleted_rx)),
            tasks: Mutex::new(Vec::new()),
            leading_rx,
            leading_tx: Mutex::new(Some(leading_tx)),
            offered: tokio::sync::Mutex::new(policies),
        }
    }

    /// Check that every kind the policies name is served. A missing target
    /// kind stops the start with the command that fixes it; a policy that
    /// only owns or reads a missing kind is set aside (and said so), and
    /// the others run.
    pub async fn check_kinds(&self, set: &PolicySet) -> Result<PolicySet, StartError> {
        self.served_part(set, false).await
    }

    /// What `check_kinds` would keep of `set`, changing nothing and saying
    /// nothing: a policy edit checked before it is loaded (the reload's
    /// checks, the policy webhook's).
    pub async fn dry_check_kinds(&self, set: &PolicySet) -> Result<PolicySet, StartError> {
        self.served_part(set, true).await
    }

    async fn served_part(&self, set: &PolicySet, dry: bool) -> Result<PolicySet, StartError> {
        let mut kinds: Vec<KindRef> = Vec::new();
        for p in set.policies.values() {
            for k in p.kinds.kinds() {
                if !kinds.contains(k) {
                    kinds.push(k.clone());
                }
            }
        }
        // Runbook keeps its state of targets of other kinds' schemas in a
        // kind of its own, which must be served too.
        let state = super::reconcile::state_kind();
        let needs_state = set
            .target_kinds()
            .iter()
            .any(|k| !runbook_core::plan::state::owns_schema(k))
            || set.sweeps().next().is_some();
        if needs_state {
            kinds.push(state.clone());
        }
        let mut missing = self.not_served(kinds).await?;
        // Without RunbookState, Runbook's state of a built-in kind has
        // nowhere to go; of another kind it stays in the status (and a
        // status that prunes it is said so at its first write).
        let served = !missing.contains(&state);
        if !dry {
            self.ctx
                .memory
                .states_served
                .store(needs_state && served, Ordering::Release);
        }
        let built_in_target = set
            .target_kinds()
            .iter()
            .any(runbook_core::plan::state::built_in);
        if needs_state && !served && !built_in_target {
            if !dry {
                tracing::warn!(
                    "the API server does not serve {state}: Runbook's state of targets whose status prunes it has nowhere to go; install Runbook's CRDs (runbook crds | kubectl apply --server-side -f -)"
                );
            }
            missing.retain(|k| *k != state);
        }
        // A tenant's policy on a kind not served is set aside like any
        // other of its policies: what a tenant writes never stops the
        // operator from starting.
        let cluster_wide_targets: Vec<KindRef> = set
            .policies
            .values()
            .filter(|p| p.tenant.is_none())
            .map(|p| p.target.clone())
            .collect();
        let state_needed_by_cluster_wide = set
            .policies
            .values()
            .any(|p| p.tenant.is_none() && !runbook_core::plan::state::owns_schema(&p.target));
        let targets: Vec<KindRef> = missing
            .iter()
            .filter(|k| {
                cluster_wide_targets.contains(k) || (**k == state && state_needed_by_cluster_wide)
            })
            .cloned()
            .collect();
        if !targets.is_empty() {
            let names: Vec<String> = targets.iter().map(|k| k.to_string()).collect();
            let fix = if targets.iter().any(|k| k.group() == "runbook.dev") {
                "install Runbook's CRDs with: runbook crds | kubectl apply --server-side -f -"
            } else {
                "install the CustomResourceDefinitions that define them (kubectl apply -f <crd.yaml>), then start again"
            };
            return Err(StartError::MissingKinds(format!(
                "the policies need {}, which the API server does not serve; {fix}",
                names.join(", ")
            )));
        }
        if dry {
            let mut kept = set.clone();
            kept.policies
                .retain(|_, p| absent_kinds(p, &missing).is_empty());
            return Ok(kept);
        }
        Ok(self.set_aside(set, &missing))
    }

    /// The kinds discovery does not list. A CRD applied a moment ago is
    /// served before discovery lists it: a kind not found is asked for
    /// again for a little while.
    async fn not_served(&self, kinds: Vec<KindRef>) -> Result<Vec<KindRef>, StartError> {
        let mut pending = kinds;
        let mut missing = Vec::new();
        for attempt in 0..=DISCOVERY_RETRIES {
            missing.clear();
            for k in &pending {
                match self.ctx.resources.resolve(k).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => missing.push(k.clone()),
                    Err(kube::Error::Discovery(_)) => missing.push(k.clone()),
                    Err(e) => return Err(StartError::Discovery(e)),
                }
            }
            if missing.is_empty() || attempt == DISCOVERY_RETRIES {
                break;
            }
            tracing::debug!(kinds = ?missing, "not in discovery yet; asking again");
            tokio::time::sleep(DISCOVERY_RETRY_EVERY).await;
            pending = missing.clone();
        }
        Ok(missing)
    }

    /// The policies without those that need a kind in `missing`: each set
    /// aside is said and counted once (not again while it waits), and the
    /// set aside published (`Health::set_aside`).
    fn set_aside(&self, set: &PolicySet, missing: &[KindRef]) -> PolicySet {
        let mut kept = set.clone();
        let mut waiting = super::context::SetAside::new();
        let before = self.ctx.health.set_aside.borrow().clone();
        for (name, p) in &set.policies {
            let absent = absent_kinds(p, missing);
            if absent.is_empty() {
                continue;
            }
            if before.get(name) != Some(&absent) {
                let names: Vec<String> = absent.iter().map(|k| k.to_string()).collect();
                tracing::error!(policy = %name, "set aside: the API server does not serve {}; install the CRDs that define them, and the policy loads by itself", names.join(", "));
                self.ctx
                    .metrics
                    .policy_reloads
                    .get_or_create(&Metrics::labels(&[("result", "missing_kinds")]))
                    .inc();
            }
            waiting.insert(name.clone(), absent);
            kept.policies.remove(name);
        }
        for name in before.keys() {
            if !waiting.contains_key(name) && set.policies.contains_key(name) {
                tracing::info!(policy = %name, "the kinds it names are served now: in force");
            }
        }
        self.ctx
            .health
            .set_aside
            .send_if_modified(|now| std::mem::replace(now, waiting) != *now);
        kept
    }

    fn ensure_informers(&self, set: &PolicySet) {
        let targets: Vec<KindRef> = set.target_kinds();
        let mut wanted: Vec<KindRef> = Vec::new();
        // Runbook's state of targets whose schema is not Runbook's.
        if self.ctx.memory.states_served.load(Ordering::Acquire) {
            wanted.push(super::reconcile::state_kind());
        }
        for p in set.policies.values() {
            for k in p.kinds.kinds() {
                if !targets.contains(k) && !wanted.contains(k) {
                    wanted.push(k.clone());
                }
            }
        }
        let mut informers = lock(&self.ctx.running.informers);
        // Sharded, the kinds that are only ever children are cached for
        // this replica's share only (a child carries its target's label).
        let selector = |k: &KindRef| super::shard::children_selector(&self.ctx, set, k);
        let reach = |k: &KindRef| super::reach::Reach::of(&self.ctx, set, k);
        // A kind every policy declaring it reads by name only is watched
        // by those names alone.
        let names = |k: &KindRef| -> Vec<String> {
            let mut out = std::collections::BTreeSet::new();
            for p in set.policies.values().filter(|p| p.kinds.declares(k)) {
                match p.names_read(k) {
                    Some(n) => out.extend(n.iter().cloned()),
                    None => return Vec::new(),
                }
            }
            out.into_iter().collect()
        };
        // A kind watched with another selector now (a sharded replica's
        // share grew), or in other tenants' namespaces, keeps its cache
        // while it lists again.
        let mut kept: HashMap<KindRef, Arc<crate::observe::cache::KindCache>> = HashMap::new();
        informers.retain(|k, i| {
            let keep = wanted.contains(k)
                && i.selector == selector(k)
                && i.namespaces == reach(k).namespaces(&self.ctx)
                && i.names == names(k);
            if !keep && wanted.contains(k) {
                kept.insert(k.clone(), i.cache.clone());
            }
            keep
        });
        for k in wanted {
            informers.entry(k.clone()).or_insert_with(|| {
                // Plural and scope as discovery found them (a CRD may name
                // its plural anything, and be cluster-scoped).
                let (resource, namespaced) = self.ctx.resources.served_as(&k);
                let reach = reach(&k);
                let scope = crate::observe::cache::Scope {
                    namespaces: reach.namespaces(&self.ctx),
                    tenants: reach.tenants(),
                    namespaced,
                    selector: selector(&k),
                    names: names(&k),
                    timeout_secs: self.ctx.config.watch_timeout_secs,
                    from_cache: self.ctx.config.shards,
                };
                Arc::new(spawn_informer(
                    self.ctx.client.clone(),
                    resource,
                    k.clone(),
                    kept.remove(&k),
                    scope,
                    self.ctx.queue.changes.clone(),
                    self.ctx.health.watches.clone(),
                ))
            });
        }
    }

    /// Wait for the caches to fill, at most [`SYNC_WAIT`]: a kind whose
    /// watch cannot list (a permission revoked, a CRD removed) does not
    /// hold up the others or a policy edit for ever. Reaching the bound is
    /// logged and counted; that kind's targets are decided once it fills
    /// (its watch failing is in `/readyz`).
    async fn wait_informers(&self) {
        let caches: Vec<Arc<crate::observe::cache::KindCache>> = lock(&self.ctx.running.informers)
            .values()
            .map(|i| i.cache.clone())
            .collect();
        let all = futures::future::join_all(caches.iter().map(|c| c.wait_synced()));
        if tokio::time::timeout(SYNC_WAIT, all).await.is_ok() {
            return;
        }
        for c in caches.iter().filter(|c| !c.is_synced()) {
            tracing::warn!(kind = %c.kind, "the cache of this kind did not fill within {}s; going on without it", SYNC_WAIT.as_secs());
            self.ctx
                .metrics
                .cache_waits_ended
                .get_or_create(&Metrics::labels(&[
                    ("kind", &c.kind.kind),
                    ("wait", "fill"),
                ]))
                .inc();
        }
    }

    async fn ensure_controllers(&self, set: &PolicySet) {
        let wanted = set.target_kinds();
        let mut new_stores = Vec::new();
        {
            let mut targets = lock(&self.ctx.running.targets);
            // Gone, or watched with another selector than the policies
            // now ask for: stopped (and started again below).
            let stale: Vec<KindRef> = targets
                .iter()
                .filter(|(k, t)| {
                    let watch =
                        super::shard::watch_selector(&self.ctx, set.watch_selector(k).as_deref());
                    let reach = super::reach::Reach::of(&self.ctx, set, k);
                    let namespaced = self.ctx.resources.served_as(k).1;
                    let namespaces = if namespaced {
                        reach.namespaces(&self.ctx)
                    } else {
                        Vec::new()
                    };
                    !wanted.contains(k) || t.watch != watch || t.namespaces != namespaces
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in stale {
                if let Some(t) = targets.remove(&k) {
                    t.task.abort();
                }
            }
            for k in wanted {
                if targets.contains_key(&k) {
                    continue;
                }
                let t = spawn_target(&self.ctx, &k, set.watch_selector(&k));
                new_stores.push(t.store.clone());
                targets.insert(k, t);
            }
        }
        for s in new_stores {
            // A waiter that arrives while the store is being marked ready
            // can miss the wake-up; polling again finds it ready.
            loop {
                match tokio::time::timeout(Duration::from_millis(100), s.wait_until_ready()).await {
                    Ok(_) => break,
                    Err(_) => continue,
                }
            }
        }
    }

    /// Start: check kinds, fill caches, then (once leading) reconcile.
    pub async fn start(&self) -> Result<(), StartError> {
        // Discovery waits out an API server that is not there (yet); a
        // kind it does not serve is an answer, and fails the start.
        let mut stop = self.ctx.stop.clone();
        let checked = tokio::select! {
            r = crate::observe::health::patiently(&self.ctx.health.waiting, "discovering the policies' kinds", || async {
                match self.check_kinds(&self.ctx.policies.load_full()).await {
                    Err(StartError::Discovery(e)) => Err(crate::util::api_error(&e)),
                    other => Ok(other),
                }
            }) => r,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let set = Arc::new(checked?);
        self.ctx.policies.store(set.clone());
        // One look at each group version's published schema serves both.
        let mut schemas = crate::observe::schemas::ServedSchemas::default();
        self.warn_unlisted_status(&set, &mut schemas).await;
        self.warn_outdated_crds(&mut schemas).await;
        self.learn_identity();
        self.start_webhook().await?;
        self.ensure_informers(&set);
        if let Some(rx) = lock(&self.changes_rx).take() {
            lock(&self.tasks).push(tokio::spawn(dispatch(self.ctx.clone(), rx)));
        }
        if let Some(rx) = lock(&self.deleted_rx).take() {
            let told = super::deleted::run(self.ctx.clone(), rx);
            lock(&self.tasks).push(tokio::spawn(told));
        }
        self.wait_informers().await;
        self.ctx.health.synced.store(true, Ordering::Release);
        self.elect();
        let mut leading = self.leading_rx.clone();
        let mut stop = self.ctx.stop.clone();
        tokio::select! {
            _ = leading.wait_for(|l| *l) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
        self.take_lead().await;
        let sweeper = tokio::spawn(sweep(self.ctx.clone()));
        lock(&self.tasks).push(sweeper);
        let sweeps = tokio::spawn(super::sweeps::run(self.ctx.clone()));
        lock(&self.tasks).push(sweeps);
        self.publish_policy_info(&set);
        Ok(())
    }

    /// Lead: at once without a lease; with one, while holding it (sharded,
    /// a replica leads its own share while it holds its member Lease, and
    /// one of the replicas assigns).
    fn elect(&self) {
        let leading_tx = lock(&self.leading_tx).take().expect("start runs once");
        match self.ctx.config.lease.clone() {
            None => {
                self.ctx.health.leading.store(true, Ordering::Release);
                let _ = leading_tx.send(true);
            }
            Some(lease) => {
                let own = if self.ctx.config.shards {
                    let task = tokio::spawn(super::shard::run(self.ctx.clone(), lease.clone()));
                    lock(&self.tasks).push(task);
                    super::shard::member_lease(&lease)
                } else {
                    lease
                };
                let elector = Elector::new(self.ctx.client.clone(), own, Clock::real());
                let task = tokio::spawn(elector.run(
                    self.ctx.health.leading.clone(),
                    leading_tx,
                    self.ctx.stop.clone(),
                ));
                lock(&self.tasks).push(task);
            }
        }
    }

    /// Status the policies declare that their targets' served schemas
    /// (the API server's OpenAPI v3 documents) would drop: each logged
    /// and set in `runbook_status_unlisted{policy,field}`, so it is seen
    /// before the first write drops it.
    async fn warn_unlisted_status(
        &self,
        set: &PolicySet,
        schemas: &mut crate::observe::schemas::ServedSchemas,
    ) {
        self.ctx.metrics.status_unlisted.clear();
        self.ctx.memory.forget_dropped();
        for p in set.policies.values() {
            let k = &p.target;
            if !p.status.declared || runbook_core::kinds::built_in(k) {
                continue;
            }
            let Some(status) = schemas.status(&self.ctx.client, k).await else {
                continue;
            };
            for (what, _) in runbook_core::plan::state::unlisted(&status, &p.status) {
                tracing::warn!(policy = %p.id, kind = %k, "the policy declares status {what:?}, which the served schema of {k} does not list: the API server will drop it (add it to the CRD's status properties)");
                self.ctx
                    .metrics
                    .status_unlisted
                    .get_or_create(&Metrics::labels(&[("policy", &p.id), ("field", &what)]))
                    .set(1);
                self.ctx.memory.note_dropped(&p.id, k, &[what], &[]);
            }
        }
    }

    /// Runbook's own CRDs as served, against this release's: a status
    /// field this release writes that a served CRD lacks would be dropped
    /// at every write (a schedule's times, a policy's fields of a built-in
    /// kind's target kept in a RunbookState), and a decision would not
    /// remember it. Each is logged as an error with the way to upgrade,
    /// and set in `runbook_crd_outdated{crd,field}`. A CRD not installed
    /// is not checked.
    async fn warn_outdated_crds(&self, schemas: &mut crate::observe::schemas::ServedSchemas) {
        self.ctx.metrics.crd_outdated.clear();
        for crd in runbook_core::crd::all() {
            let Some(version) = crd.spec.versions.first() else {
                continue;
            };
            let kind = KindRef::new(
                format!("{}/{}", crd.spec.group, version.name),
                &crd.spec.names.kind,
            );
            let Some(served) = schemas.status(&self.ctx.client, &kind).await else {
                continue;
            };
            let name = crd.metadata.name.clone().unwrap_or_default();
            for field in outdated_fields(&crd, &served) {
                let what = match field.strip_suffix(" (required)") {
                    Some(f) => format!(
                        "it requires {f:?}, which this release leaves out where it goes without saying: the API server will refuse those writes"
                    ),
                    None => format!("its status lacks {field:?}, which the API server will drop"),
                };
                tracing::error!(crd = %name, field = %field, "the served CRD {name} is older than this operator: {what}; apply this release's CRDs (kubectl apply --server-side -k deploy/, or runbook crds | kubectl apply --server-side -f -)");
                self.ctx
                    .metrics
                    .crd_outdated
                    .get_or_create(&Metrics::labels(&[("crd", &name), ("field", &field)]))
                    .set(1);
            }
        }
    }

    /// Serve the authorship webhook, if configured (every replica does),
    /// and verify author records with its key.
    async fn start_webhook(&self) -> Result<(), StartError> {
        let Some(config) = self.ctx.config.webhook.clone() else {
            return Ok(());
        };
        if self.ctx.webhook.get().is_some() {
            return Ok(());
        }
        let placer = self.ctx.config.shards.then(|| {
            let ctx = Arc::downgrade(&self.ctx);
            let placer: crate::admission::review::Placer =
                Arc::new(move |object| super::shard::place_new(&*ctx.upgrade()?, object));
            placer
        });
        let hook = Arc::new(
            super::webhook::Webhook::start(
                &self.ctx.client,
                config,
                self.ctx.metrics.clone(),
                placer,
            )
            .await
            .map_err(StartError::Webhook)?,
        );
        self.ctx.authority.set_signer(hook.signer());
        lock(&self.tasks).push(hook.spawn_renewal(self.ctx.client.clone(), self.ctx.stop.clone()));
        let _ = self.ctx.webhook.set(hook);
        Ok(())
    }

    /// Point the webhook configurations at this webhook: the authorship
    /// webhook's for the kinds `set` targets, the policy webhook's where
    /// policies are checked here (the leader does).
    async fn keep_webhook_in_step(&self, set: &PolicySet) {
        let Some(hook) = self.ctx.webhook.get() else {
            return;
        };
        match hook
            .keep_in_step(&self.ctx.client, set, &self.ctx.resources)
            .await
        {
            Ok(true) => {
                tracing::info!("the authorship webhook's configuration was brought in step")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!("keeping the authorship webhook's configuration in step: {e}")
            }
        }
        match hook.keep_policies_in_step(&self.ctx.client).await {
            Ok(true) => tracing::info!("the policy webhook's configuration was brought in step"),
            Ok(false) => {}
            Err(e) => tracing::error!("keeping the policy webhook's configuration in step: {e}"),
        }
    }

    /// Learn Runbook's own identity (for targets it writes itself), asking
    /// again until the API server answers; until then no target has an
    /// author it trusts.
    fn learn_identity(&self) {
        let ctx = self.ctx.clone();
        let mut stop = self.ctx.stop.clone();
        lock(&self.tasks).push(tokio::spawn(async move {
            let mut pause = Duration::from_millis(200);
            loop {
                match ctx.authority.learn_identity().await {
                    Ok(me) => {
                        tracing::debug!(user = %me, "the API server knows Runbook as this user");
                        return;
                    }
                    Err(e) => tracing::warn!("{e}; asking again in {}s", pause.as_secs_f32()),
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }));
    }

    /// `runbook_policy_info{policy,version}`: exactly the policies in force.
    fn publish_policy_info(&self, set: &PolicySet) {
        self.ctx.metrics.policy_info.clear();
        for p in set.policies.values() {
            // Each policy's counters exist from its load, at 0, so that
            // rate() and increase() see its first failure.
            let m = &self.ctx.metrics;
            for result in ["ok", "error"] {
                m.reconciles
                    .get_or_create(&Metrics::labels(&[("policy", &p.id), ("result", result)]))
                    .inc_by(0);
            }
            m.circuit_open
                .get_or_create(&Metrics::labels(&[("policy", &p.id)]))
                .inc_by(0);
            self.ctx
                .metrics
                .policy_info
                .get_or_create(&Metrics::labels(&[
                    ("policy", &p.id),
                    ("version", &p.version),
                ]))
                .set(1);
        }
    }

    /// Begin acting as the leader: the alerts notified before, the
    /// controllers of the policies in force, ready.
    async fn take_lead(&self) {
        self.ctx.running.placement.gained();
        let set = self.ctx.policies.load_full();
        self.ctx.metrics.leader.set(1);
        self.keep_webhook_in_step(&set).await;
        // What was notified before this leader, so that nothing is sent twice.
        self.ctx.alerts.restore().await;
        self.ensure_controllers(&set).await;
        self.ctx.health.ready.store(true, Ordering::Release);
    }

    /// Stop acting, having lost the Lease: every controller stopped (its
    /// reconciles in flight dropped before their next write), nothing
    /// queued. The caches stay filled, as a standby's do.
    fn step_down(&self) {
        self.ctx.health.ready.store(false, Ordering::Release);
        self.ctx.metrics.leader.set(0);
        self.ctx.metrics.targets.clear();
        self.ctx.metrics.alerts_firing.clear();
        let controllers: Vec<TargetController> = lock(&self.ctx.running.targets)
            .drain()
            .map(|(_, t)| t)
            .collect();
        for t in controllers {
            t.task.abort();
        }
        lock(&self.ctx.queue.pending).clear();
        self.ctx.metrics.queue_depth.set(0);
    }

    /// After [`Operator::start`]: while the Lease is held, reconcile; when
    /// it is lost (an API server outage, a 403 while the server's RBAC
    /// warms up, a standby that took over), stop acting and stand by,
    /// trying to lead again, and resume once leading. Resolves only when
    /// the operator is told to stop.
    pub async fn follow_leadership(&self) {
        let reselect = &self.ctx.running.placement.reselect;
        // What happened first; the answer to it is awaited outside the
        // select (its futures hold guards that stay on one thread).
        enum Next {
            Lost,
            Led,
            Reselect,
            Stop,
        }
        let stopped = || {
            let mut stop = self.ctx.stop.clone();
            async move {
                let _ = stop.wait_for(|s| *s).await;
            }
        };
        // Resolves once not leading (at once if so already); never,
        // without leader election.
        let lost = || async {
            if !self.until_leading_is(false).await {
                std::future::pending::<()>().await;
            }
        };
        let mut leading = true;
        loop {
            let next = if leading {
                tokio::select! {
                    _ = lost() => Next::Lost,
                    _ = reselect.notified() => Next::Reselect,
                    _ = stopped() => Next::Stop,
                }
            } else {
                tokio::select! {
                    ok = self.until_leading_is(true) => if ok { Next::Led } else { Next::Stop },
                    // A standby's caches follow its share too.
                    _ = reselect.notified() => Next::Reselect,
                    _ = stopped() => Next::Stop,
                }
            };
            let step_down = match next {
                Next::Stop => return,
                // Losing the Lease while the watches start again is not
                // left waiting for them.
                Next::Reselect if leading => tokio::select! {
                    _ = self.reselect() => false,
                    _ = lost() => true,
                },
                Next::Reselect => {
                    self.reselect().await;
                    false
                }
                Next::Lost => true,
                Next::Led => {
                    tracing::info!("leading again: resuming");
                    self.take_lead().await;
                    leading = true;
                    false
                }
            };
            if step_down {
                tracing::warn!("lost the leader lease: stopped acting; standing by to lead again");
                self.step_down();
                leading = false;
            }
        }
    }

    /// Wait until this instance leads (`true`) or not; false if leadership
    /// can no longer change that way (no elector).
    async fn until_leading_is(&self, want: bool) -> bool {
        let mut rx = self.leading_rx.clone();
        rx.wait_for(|l| *l == want).await.is_ok()
    }

    /// Sharded, this replica's share grew to a gone member's targets:
    /// its caches take in their labels, and then its target controllers
    /// watch their targets beside its own (`shares`), so that their
    /// decisions see their children.
    async fn reselect(&self) {
        let began = Instant::now();
        let set = self.ctx.policies.load_full();
        self.ensure_informers(&set);
        self.wait_informers().await;
        let placement = &self.ctx.running.placement;
        let gone = placement.watched();
        placement.unheld.send_modify(|u| u.gone = gone.clone());
        tracing::info!(
            ?gone,
            caches_ms = began.elapsed().as_millis() as u64,
            "watching the gone members' labels too"
        );
    }

    /// Resolves when this instance stops leading (after having led);
    /// never, without leader election.
    pub async fn lost_leadership(&self) {
        let mut rx = self.leading_rx.clone();
        if rx.wait_for(|l| *l).await.is_err() || rx.wait_for(|l| !*l).await.is_err() {
            // No elector: the leadership cannot be lost.
            std::future::pending::<()>().await;
        }
    }

    /// Whether this instance leads, as it changes.
    pub(super) fn leading(&self) -> watch::Receiver<bool> {
        self.leading_rx.clone()
    }

    pub fn is_leading(&self) -> bool {
        self.ctx.health.leading.load(Ordering::Acquire)
    }

    /// Swap in a new policy set: start what it needs, stop what it no
    /// longer needs, and reconcile every target of a changed policy once.
    pub async fn swap_policies(&self, set: PolicySet) -> Vec<KindRef> {
        let mut offered = self.offered.lock().await;
        *offered = set.clone();
        self.swap_in(set).await
    }

    /// `swap_policies`, the offered set's lock held.
    pub(super) async fn swap_in(&self, set: PolicySet) -> Vec<KindRef> {
        // Policies naming a kind the cluster does not serve stay set aside,
        // as at start-up, whichever bundle they come from.
        let set = match self.check_kinds(&set).await {
            Ok(kept) => kept,
            Err(e) => {
                tracing::error!("checking the kinds of the new policy set: {e}");
                set
            }
        };
        let old = self.ctx.policies.load_full();
        let mut changed: Vec<KindRef> = Vec::new();
        for p in set.policies.values() {
            let same = old
                .policies
                .get(&p.id)
                .is_some_and(|q| q.version == p.version);
            if !same && !changed.contains(&p.target) {
                changed.push(p.target.clone());
            }
        }
        for (name, q) in &old.policies {
            if !set.policies.contains_key(name) && !changed.contains(&q.target) {
                changed.push(q.target.clone());
            }
        }
        self.ctx.policies.store(Arc::new(set.clone()));
        self.warn_unlisted_status(&set, &mut Default::default())
            .await;
        self.ensure_informers(&set);
        self.wait_informers().await;
        if self.is_leading() {
            self.keep_webhook_in_step(&set).await;
            self.ensure_controllers(&set).await;
        }
        self.publish_policy_info(&set);
        if self.is_leading() {
            self.ctx.publish_targets();
            self.ctx.publish_firing();
        }
        let still: Vec<KindRef> = changed
            .into_iter()
            .filter(|k| set.target_kinds().contains(k))
            .collect();
        self.ctx.resync(&still);
        self.ctx.running.sweeps_changed.notify_one();
        still
    }

    /// Stop taking work, let reconciles in flight finish (up to `grace`),
    /// release the Lease.
    pub async fn shutdown(&self, grace: Duration) {
        let _ = self.stop.send(true);
        let deadline = Instant::now() + grace;
        while self.ctx.in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tasks: Vec<tokio::task::JoinHandle<()>> = std::mem::take(&mut *lock(&self.tasks));
        for t in tasks {
            let _ = tokio::time::timeout(
                deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1),
                t,
            )
            .await;
        }
        let controllers: Vec<TargetController> = lock(&self.ctx.running.targets)
            .drain()
            .map(|(_, t)| t)
            .collect();
        for t in controllers {
            let _ = tokio::time::timeout(Duration::from_secs(2), t.task).await;
        }
        lock(&self.ctx.running.informers).clear();
        if let Some(hook) = self.ctx.webhook.get() {
            hook.stop();
        }
        self.ctx.health.ready.store(false, Ordering::Release);
        self.ctx.health.synced.store(false, Ordering::Release);
        self.ctx.metrics.leader.set(0);
    }

    /// Wait until nothing is in flight or pending and no reconcile has
    /// finished for `quiet` (tests and simulations use this to settle).
    pub async fn settle(&self, quiet: Duration, max: Duration) {
        let deadline = Instant::now() + max;
        let mut last = self.ctx.activity();
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let now = self.ctx.activity();
            if now != last || self.ctx.in_flight() > 0 || self.ctx.pending() > 0 {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                return;
            }
            if Instant::now() > deadline {
                return;
            }
        }
    }
}

/// The kinds a policy needs that are in `missing`: those it declares, and
/// for a tenant's policy on a built-in kind, Runbook's state kind (its
/// targets' state has nowhere else to go).
fn absent_kinds(p: &runbook_core::policy::CompiledPolicy, missing: &[KindRef]) -> Vec<KindRef> {
    let mut absent: Vec<KindRef> = p
        .kinds
        .kinds()
        .into_iter()
        .filter(|k| missing.contains(k))
        .cloned()
        .collect();
    let state = super::reconcile::state_kind();
    if p.tenant.is_some()
        && missing.contains(&state)
        && runbook_core::plan::state::built_in(&p.target)
    {
        absent.push(state);
    }
    absent
}

/// The status fields of one of Runbook's CRDs, as this release defines
/// it, that the served schema of its status (`served`) does not list;
/// and those the served schema requires that this release may leave out
/// (a write without them would be refused), as `path (required)`.
fn outdated_fields(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    served: &serde_json::Value,
) -> Vec<String> {
    let ours = crd
        .spec
        .versions
        .first()
        .and_then(|v| serde_json::to_value(&v.schema).ok())
        .and_then(|s| s.pointer("/openAPIV3Schema/properties/status").cloned())
        .unwrap_or_default();
    let mut out: Vec<String> = ours["properties"]
        .as_object()
        .into_iter()
        .flat_map(|p| p.keys())
        .filter(|f| served["properties"].get(f.as_str()).is_none())
        .cloned()
        .collect();
    required_beyond(&ours, served, "status", &mut out);
    out
}

/// Fields `served` requires at `at` and below that `ours` does not.
fn required_beyond(
    ours: &serde_json::Value,
    served: &serde_json::Value,
    at: &str,
    out: &mut Vec<String>,
) {
    let names = |s: &serde_json::Value| -> Vec<String> {
        s["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str().map(str::to_string))
            .collect()
    };
    let ours_required = names(ours);
    for r in names(served) {
        if !ours_required.contains(&r) && ours["properties"].get(&r).is_some() {
            out.push(format!("{at}.{r} (required)"));
        }
    }
    if let Some(props) = ours["properties"].as_object() {
        for (k, v) in props {
            if let Some(s) = served["properties"].get(k) {
                required_beyond(v, s, &format!("{at}.{k}"), out);
            }
        }
    }
    if ours["items"].is_object() && served["items"].is_object() {
        required_beyond(&ours["items"], &served["items"], &format!("{at}[]"), out);
    }
}

/// Route cache changes to the targets they concern: owners by their
/// ownerReferences, readers by what their last decision looked up.
async fn dispatch(ctx: Arc<Context>, mut rx: channel::Receiver<Change>) {
    let mut stop = ctx.stop.clone();
    loop {
        let ch = tokio::select! {
            ch = rx.recv() => match ch {
                Some(ch) => ch,
                None => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        // Changes the full queue dropped could have woken any target.
        let lost = rx.take_dropped();
        if lost > 0 {
            ctx.overflowed("changes", lost, true);
            ctx.resync(&[]);
        }
        let set = ctx.policies.load_full();
        let targets = set.target_kinds();
        let mut keys: Vec<TargetKey> = Vec::new();
        // A child's own apply coming back changes nothing its owner's
        // decision did not read (it is what the decision asked for): its
        // owner is not woken for it unless the decision read its children
        // of that kind (it now sees one it did not), only what read it.
        let child = runbook_core::plan::ChildKey::new(&ch.kind, &ch.namespace, &ch.name);
        let own_apply = ctx.memory.applied.seen(&child, ch.version.as_deref());
        if own_apply {
            tracing::debug!(kind = %ch.kind, namespace = %ch.namespace, name = %ch.name, "a child's own apply came back: its owner is woken only if it read its children");
        }
        // A target's state removed: its target is going (or the state
        // was removed by hand); it is not woken for it.
        if ch.version.is_none() && ch.kind == super::reconcile::state_kind() {
            let now = tokio::time::Instant::now();
            let mut gone = lock(&ctx.memory.states_gone);
            gone.retain(|_, at| now.duration_since(*at) < super::reconcile::STATE_GONE_WAIT);
            gone.extend(ch.owners.iter().map(|o| (o.uid.clone(), now)));
            continue;
        }
        for o in &ch.owners {
            let k = KindRef::new(&o.api_version, &o.kind);
            if !targets.contains(&k) {
                continue;
            }
            // An ownerReference names an owner in its child's namespace,
            // or a cluster-scoped one (a Namespace owning what it holds).
            let namespace = match &o.namespace {
                Some(ns) => ns.clone(),
                None if !ctx.resources.served_as(&k).1 => String::new(),
                None => ch.namespace.clone(),
            };
            let owner = TargetKey {
                kind: k,
                namespace,
                name: o.name.clone(),
            };
            if !own_apply || ctx.memory.records.reads_children(&owner, &ch.kind) {
                keys.push(owner);
            }
        }
        keys.extend(
            ctx.memory
                .records
                .readers_of(&ch.kind, &ch.namespace, &ch.name),
        );
        keys.sort();
        keys.dedup();
        for k in keys {
            ctx.trigger(k);
        }
    }
}

/// Every [`ALERT_SWEEP`] while the operator runs: sweep alerts and
/// memory, publish the gauges while leading, and restart controllers
/// that ended (at once, then every [`SUPERVISE_EVERY`] while one waits).
async fn sweep(ctx: Arc<Context>) {
    let mut stop = ctx.stop.clone();
    let mut every = tokio::time::interval(ALERT_SWEEP);
    let ended = ctx.running.controller_ended.clone();
    // When to look at ended controllers again: at once when one
    // ends, then while one waits for its restart.
    let mut look: Option<tokio::time::Instant> = None;
    // The targets' gauge is counted again when a reconcile has
    // finished since (every change of a target's status is one),
    // and at least every few minutes: counting parses every
    // target, and most sweeps find nothing new.
    let mut counted: Option<(u64, tokio::time::Instant)> = None;
    loop {
        let due = async {
            match look {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = every.tick() => {
                ctx.sweep_alerts();
                ctx.prune_memory();
                if ctx.health.leading.load(Ordering::Acquire) {
                    let now = tokio::time::Instant::now();
                    let stale = counted.is_none_or(|(seen, at)| {
                        seen != ctx.activity() || now.duration_since(at) >= RECOUNT_EVERY
                    });
                    if stale {
                        counted = Some((ctx.activity(), now));
                        ctx.publish_targets();
                    }
                    ctx.publish_firing();
                }
            }
            _ = ended.notified() => look = Some(tokio::time::Instant::now()),
            _ = due => {
                // A replica that stepped down restarts nothing,
                // and looks again for when it leads.
                let waiting = !ctx.health.leading.load(Ordering::Acquire)
                    || ctx.restart_ended();
                look = waiting.then(|| tokio::time::Instant::now() + SUPERVISE_EVERY);
            }
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod crd_tests {
    use super::*;

    /// A RunbookState CRD installed by an earlier release, without
    /// `schedules` and `fields`: both are found missing; this release's
    /// finds nothing.
    #[test]
    fn an_older_crd_is_found_by_the_fields_it_lacks() {
        let crd = runbook_core::crd::state::crd();
        let ours = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let current = ours["openAPIV3Schema"]["properties"]["status"].clone();
        assert!(outdated_fields(&crd, &current).is_empty());
        let mut older = current.clone();
        let props = older["properties"].as_object_mut().unwrap();
        props.remove("schedules");
        props.remove("fields");
        let mut missing = outdated_fields(&crd, &older);
        missing.sort();
        assert_eq!(missing, ["fields", "schedules"]);
    }

    /// A CRD from before the compact decision record requires each
    /// action's `result`, which this release leaves out when it is `ok`:
    /// a status write would be refused, so it is found.
    #[test]
    fn an_older_crd_requiring_what_this_release_leaves_out_is_found() {
        use kube::CustomResourceExt as _;
        let crd = runbook_core::crd::Evaluator::crd();
        let ours = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut older = ours["openAPIV3Schema"]["properties"]["status"].clone();
        older["properties"]["decisions"]["items"]["properties"]["actions"]["items"]["required"] =
            serde_json::json!(["action", "result"]);
        assert_eq!(
            outdated_fields(&crd, &older),
            ["status.decisions[].actions[].result (required)"]
        );
    }
}
