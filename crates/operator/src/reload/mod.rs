//! Hot reload: policy bundles from ConfigMaps (watched through the API) and
//! from directories (watched with notify), each compiled off the hot path
//! into a new immutable PolicySet that is swapped in whole.
//!
//! Every bundle keeps its last good version. A broken edit (bad YAML, a
//! script that does not compile, an undeclared kind, a missing script, a
//! kind the API server does not serve) leaves that version serving; the
//! error, with `file:line:col`, goes to the log, to an Event on the
//! ConfigMap, and to `runbook_policy_reload_total{result="error"}`. Fixing
//! the edit brings the new version in. A refusal the cluster may mend by
//! itself (a Secret or a permission missing, a kind not served yet) is
//! tried again with backoff, without waiting for an edit. Deleting a
//! bundle removes its policies (their controllers stop) and touches none
//! of their objects.

pub mod last_good;
pub mod sources;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::events::{Event as KubeEvent, EventWriter};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use runbook_core::script::action::EventType;

use self::sources::BUNDLE_LABEL;
use crate::admission::policies::{PolicyCheck, Verdict};
use crate::runtime::Operator;
use crate::telemetry::Metrics;
use runbook_core::alert::routes::{ReceiverKind, Target};
use runbook_core::policy::compile::{LoadError, Loaded, load_bundle};
use runbook_core::policy::{Bundle, Origin, PolicySet};
use runbook_core::script::ScriptEngine;
use runbook_core::util::lock;

/// Where bundles come from.
#[derive(Clone, Debug, Default)]
pub struct SourceConfig {
    pub dirs: Vec<PathBuf>,
    /// Namespaces whose `runbook.dev/policy=true` ConfigMaps are bundles.
    pub configmap_namespaces: Vec<String>,
    /// Check those ConfigMaps as they are written too, through the policy
    /// webhook (when this process serves the webhook).
    pub admission: bool,
}

struct BundleState {
    bundle: Bundle,
    good: Option<Arc<Loaded>>,
    /// Set while the bundle's latest version is refused for a reason the
    /// cluster may mend by itself (a Secret or a permission missing, a
    /// kind not served yet): when to try it again, and the pause after.
    retry: Option<Retry>,
    /// The errors of the latest refusal, to report a change only once.
    errors: Vec<String>,
    /// Set when `good` is the copy kept in the cluster (see `last_good`),
    /// loaded at start-up in place of a refused current version: when
    /// that copy was written.
    restored: Option<String>,
}

impl BundleState {
    fn new(bundle: Bundle) -> Self {
        Self {
            bundle,
            good: None,
            retry: None,
            errors: Vec::new(),
            restored: None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Retry {
    at: tokio::time::Instant,
    pause: Duration,
}

/// The first pause before a refused bundle is tried again, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Why a bundle version was refused.
struct Refusal {
    errors: Vec<String>,
    /// Caused by the cluster's state, not the bundle's text: worth trying
    /// again without an edit.
    transient: bool,
    /// Its last good version may not keep serving either: the rights it
    /// runs with are gone (a tenant's account may no longer read what
    /// its policies read).
    revoke: bool,
}

impl Refusal {
    fn content(errors: Vec<String>) -> Self {
        Self {
            errors,
            transient: false,
            revoke: false,
        }
    }

    fn cluster(errors: Vec<String>) -> Self {
        Self {
            errors,
            transient: true,
            revoke: false,
        }
    }

    fn revoking(errors: Vec<String>) -> Self {
        Self {
            errors,
            transient: true,
            revoke: true,
        }
    }
}

/// How often the rights of the tenants' bundles in force are asked again,
/// so that a right revoked stops what needs it.
pub const TENANT_RECHECK: Duration = Duration::from_secs(30);

/// The outcome of one reload.
#[derive(Clone, Debug, PartialEq)]
pub enum Reloaded {
    /// A new set is in force.
    Swapped { version: String },
    /// The bundle's edit was refused; the last good version stays.
    Refused { errors: Vec<String> },
    /// Nothing changed.
    Unchanged,
}

/// Keeps every bundle's last good version and builds the set from them.
pub struct Reloader {
    engine: Arc<ScriptEngine>,
    client: Option<kube::Client>,
    metrics: Arc<Metrics>,
    recorder: Option<EventWriter>,
    bundles: Mutex<BTreeMap<Origin, BundleState>>,
    /// Where alert receivers' Secrets are read when the routes came from a directory.
    secret_namespace: String,
    dangerous_kinds: bool,
    /// Accept policies that make children in other namespaces.
    other_namespaces: bool,
    access_check: bool,
    /// Compile on the calling task rather than a blocking thread (a
    /// simulation, whose clock must not run on while compiling).
    inline: bool,
    /// Serialises reloads: one set is built at a time.
    gate: tokio::sync::Mutex<()>,
    /// Failing watches already told to a bundle: (bundle, watch).
    watch_told: Mutex<std::collections::BTreeSet<(Origin, String)>>,
    /// Whether this replica leads, once `spawn` follows the operator's: a
    /// standby follows edits too (to check policies at admission and to
    /// lead on the set in force) but leaves the Events to the leader.
    leading: std::sync::OnceLock<Arc<std::sync::atomic::AtomicBool>>,
    /// The policies the operator set aside for kinds not served, once
    /// `spawn` follows the operator's; and those already told, by bundle.
    set_aside: std::sync::OnceLock<tokio::sync::watch::Receiver<crate::runtime::SetAside>>,
    told_aside: Mutex<crate::runtime::SetAside>,
    /// The version of each bundle last kept in the cluster (a hash of its
    /// files), so an unchanged one is not written again.
    kept: Mutex<BTreeMap<Origin, String>>,
    /// Who tenants' policies act as, and what their pods may ask for.
    tenancy: crate::runtime::TenancyConfig,
}

fn clone_loaded(l: &Loaded) -> Loaded {
    Loaded {
        policies: l.policies.clone(),
        routes: l.routes.clone(),
        scripts: l.scripts.clone(),
        errors: Vec::new(),
        declared: Vec::new(),
    }
}

impl Reloader {
    pub fn new(
        engine: Arc<ScriptEngine>,
        client: Option<kube::Client>,
        metrics: Arc<Metrics>,
        identity: &str,
    ) -> Self {
        let recorder = client.clone().map(|c| EventWriter::of_runbook(c, identity));
        Self {
            engine,
            client,
            metrics,
            recorder,
            bundles: Mutex::new(BTreeMap::new()),
            secret_namespace: "runbook-system".into(),
            dangerous_kinds: false,
            other_namespaces: false,
            access_check: false,
            inline: false,
            gate: tokio::sync::Mutex::new(()),
            watch_told: Mutex::default(),
            leading: std::sync::OnceLock::new(),
            set_aside: std::sync::OnceLock::new(),
            told_aside: Mutex::default(),
            kept: Mutex::default(),
            tenancy: Default::default(),
        }
    }

    /// Who tenants' policies act as (the operator's `--tenant-*` flags).
    pub fn with_tenancy(mut self, tenancy: crate::runtime::TenancyConfig) -> Self {
        self.tenancy = tenancy;
        self
    }

    /// Compile bundles on the calling task (for simulations).
    pub fn compile_inline(mut self) -> Self {
        self.inline = true;
        self
    }

    /// Read receivers' Secrets without a namespace from `ns` (the operator's).
    /// Before swapping in an edited bundle, ask the API server whether the
    /// operator holds what its policies need (as `runbook run` does at
    /// start-up), and refuse the edit if not.
    pub fn with_access_check(mut self, on: bool) -> Self {
        self.access_check = on;
        self
    }

    /// The namespace a bundle's policies are confined to: that of a
    /// ConfigMap outside the operator's namespace (a tenant's).
    pub fn tenant_of(&self, origin: &Origin) -> Option<String> {
        match origin {
            Origin::ConfigMap { namespace, .. } if *namespace != self.secret_namespace => {
                Some(namespace.clone())
            }
            _ => None,
        }
    }

    async fn check_access(
        &self,
        op: &Operator,
        set: &PolicySet,
        names: &[String],
        tenant: Option<String>,
    ) -> Result<(), Vec<String>> {
        let Some(client) = &self.client else {
            return Ok(());
        };
        let mut only = set.clone();
        only.policies.retain(|n, _| names.contains(n));
        let watch_namespaces: Vec<String> = match &tenant {
            Some(t) => vec![t.clone()],
            None => op.ctx.config.namespace.iter().cloned().collect(),
        };
        let opts = crate::rbac::Options {
            namespace: self.secret_namespace.clone(),
            watch_namespaces: watch_namespaces.clone(),
            tenant,
            // Only what the edited policies need; the webhook's own
            // rights were checked at start-up.
            webhook: None,
            shards: op.ctx.config.shards,
            ..Default::default()
        };
        let watched = watch_namespaces.first().map(String::as_str);
        match crate::runtime::access::missing_for(client, &only, &opts, watched).await {
            Ok(missing) if missing.is_empty() => Ok(()),
            Ok(missing) => Err(crate::runtime::access::by_resource(&missing)
                .into_iter()
                .map(|m| {
                    format!("the operator may not {m}: grant it (`runbook rbac`), then edit again")
                })
                .collect()),
            Err(e) => {
                tracing::warn!("could not check permissions (SelfSubjectAccessReview): {e}");
                Ok(())
            }
        }
    }

    /// Accept policies that make children in other namespaces than their
    /// targets' (`spec.namespaces`) instead of refusing their bundles.
    pub fn with_other_namespaces(mut self, allowed: bool) -> Self {
        self.other_namespaces = allowed;
        self
    }

    /// Accept policies that declare dangerous kinds (Secrets, RBAC
    /// objects, wildcards, ...) instead of refusing their bundles.
    pub fn with_dangerous_kinds(mut self, allowed: bool) -> Self {
        self.dangerous_kinds = allowed;
        self
    }

    pub fn with_secret_namespace(mut self, ns: &str) -> Self {
        self.secret_namespace = ns.to_string();
        self
    }

    /// Every Secret the alert receivers of `loaded` name must exist and
    /// hold its key. A Secret that cannot be checked now (the API server
    /// failing) does not refuse the bundle; delivery reports it later.
    async fn check_secrets(&self, loaded: &Loaded) -> Vec<String> {
        let Some(client) = &self.client else {
            return Vec::new();
        };
        let mut errors = Vec::new();
        for routes in &loaded.routes {
            for receiver in routes.receivers.values() {
                for url in receiver.kinds.iter().flat_map(ReceiverKind::targets) {
                    let Target::Secret { key, pos } = url else {
                        continue;
                    };
                    let ns = key
                        .namespace
                        .as_deref()
                        .or(routes.secret_namespace.as_deref())
                        .unwrap_or(&self.secret_namespace);
                    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
                    let problem = match api.get_opt(&key.name).await {
                        Ok(Some(s)) => {
                            let value = s
                                .data
                                .as_ref()
                                .and_then(|d| d.get(&key.key))
                                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                                .or_else(|| {
                                    s.string_data
                                        .as_ref()
                                        .and_then(|d| d.get(&key.key))
                                        .cloned()
                                });
                            match value {
                                None => Some(format!(
                                    "Secret {ns}/{} has no key {:?}",
                                    key.name, key.key
                                )),
                                Some(url)
                                    if runbook_core::alert::routes::has_credentials(url.trim()) =>
                                {
                                    Some(format!(
                                        "Secret {ns}/{} key {:?}: {}",
                                        key.name,
                                        key.key,
                                        runbook_core::alert::routes::CREDENTIALS_IN_URL
                                    ))
                                }
                                Some(_) => None,
                            }
                        }
                        Ok(None) => Some(format!("Secret {ns}/{} does not exist", key.name)),
                        Err(kube::Error::Api(s)) if s.code == 403 => Some(format!(
                            "Secret {ns}/{} cannot be read: {}",
                            key.name, s.message
                        )),
                        Err(e) => {
                            tracing::warn!("could not check Secret {ns}/{}: {e}", key.name);
                            None
                        }
                    };
                    if let Some(message) = problem {
                        errors.push(
                            LoadError {
                                file: routes.file.clone(),
                                pos: Some(*pos),
                                message: format!("receiver {:?}: {message}", receiver.name),
                            }
                            .to_string(),
                        );
                    }
                }
            }
        }
        errors
    }

    /// Keep `bundle`, which loaded, as its last good version in the
    /// cluster (unless that is already the one kept).
    async fn keep(&self, bundle: &Bundle) {
        let Some(client) = &self.client else { return };
        if last_good::name_of(&bundle.origin).is_none() {
            return;
        }
        let hash = last_good::files_hash(bundle);
        if lock(&self.kept).get(&bundle.origin) == Some(&hash) {
            return;
        }
        match last_good::save(client, &self.secret_namespace, bundle).await {
            Ok(()) => {
                lock(&self.kept).insert(bundle.origin.clone(), hash);
            }
            Err(e) => {
                // Said once per version: the next edit tries again.
                lock(&self.kept).insert(bundle.origin.clone(), hash);
                tracing::warn!(bundle = %bundle.origin, "keeping this version as the last good one: {e}; after a restart that refuses a later version, none of the bundle would run");
            }
        }
    }

    /// At start-up, for a bundle whose current version is refused: load
    /// the version kept in the cluster, if there is one and it still
    /// loads, to serve in its place.
    async fn restore(&self, current: &Bundle) {
        let Some(client) = &self.client else { return };
        let Some((kept, at)) =
            last_good::read(client, &self.secret_namespace, &current.origin).await
        else {
            return;
        };
        if kept.files == current.files {
            return;
        }
        match self.try_bundle(kept.clone(), None).await {
            Ok(_) => {
                let hash = last_good::files_hash(&kept);
                lock(&self.kept).insert(kept.origin.clone(), hash);
                if let Some(state) = lock(&self.bundles).get_mut(&current.origin) {
                    state.restored = Some(at.clone());
                }
                tracing::warn!(bundle = %current.origin, kept_at = %at, "its current version is refused: the last good version, kept in the cluster, serves");
            }
            Err(refusal) => {
                tracing::warn!(bundle = %current.origin, "the last good version kept in the cluster does not load either: {}", refusal.errors.join("; "));
            }
        }
    }

    async fn forget_kept(&self, origin: &Origin) {
        let Some(client) = &self.client else { return };
        lock(&self.kept).remove(origin);
        last_good::forget(client, &self.secret_namespace, origin).await;
    }

    fn count(&self, result: &str) {
        self.metrics
            .policy_reloads
            .get_or_create(&Metrics::labels(&[("result", result)]))
            .inc();
    }

    /// The set built from every bundle's last good version.
    pub fn current_set(&self) -> (PolicySet, Vec<LoadError>) {
        let bundles = lock(&self.bundles);
        let loaded: Vec<Loaded> = bundles
            .values()
            .filter_map(|b| b.good.as_deref().map(clone_loaded))
            .collect();
        PolicySet::build(loaded)
    }

    /// Compile a bundle and decide whether it may replace its last good
    /// version; if so, it does. Returns the errors that refuse it.
    async fn try_bundle(
        &self,
        bundle: Bundle,
        serve_check: Option<&Operator>,
    ) -> Result<Vec<String>, Refusal> {
        let (candidate, notes) = self.check(bundle.clone(), serve_check).await?;
        let mut bundles = lock(&self.bundles);
        let mut state = BundleState::new(bundle);
        state.good = Some(candidate);
        bundles.insert(state.bundle.origin.clone(), state);
        Ok(notes)
    }

    /// What a tenant's bundle may not do with its account's rights and
    /// the operator's: an error for a read the account may not make or
    /// what the operator lacks to act as it (the bundle waits for the
    /// grant), a note for a write the account may not make (the API
    /// server refuses it when it comes).
    async fn check_tenant(&self, tenant: &str, loaded: &Loaded) -> Result<Vec<String>, Refusal> {
        if let Some(why) = &self.tenancy.unable {
            return Err(Refusal::content(vec![format!(
                "policies from ConfigMaps in {tenant} act as {}, and {why}",
                self.tenancy.user(tenant)
            )]));
        }
        let Some(client) = &self.client else {
            return Ok(Vec::new());
        };
        let (set, _) = PolicySet::build(vec![clone_loaded(loaded)]);
        match crate::runtime::access::tenant_access(client, &set, tenant, &self.tenancy).await {
            Ok(found) if found.refusals.is_empty() => Ok(found.warnings),
            Ok(found) => Err(Refusal::cluster(found.refusals)),
            // What the account may do cannot be told: nothing of the
            // bundle runs until it can (tried again with backoff).
            Err(e) => Err(Refusal::cluster(vec![format!(
                "could not ask what {} may do (SubjectAccessReview): {}",
                self.tenancy.user(tenant),
                crate::util::api_error(&e)
            )])),
        }
    }

    /// Every check a bundle must pass to replace its last good version
    /// (compiled, not dangerous, its Secrets there, no conflict with the
    /// other bundles, served and permitted when `serve_check` is given),
    /// changing nothing. On success, the compiled bundle and notes that
    /// are not errors (policies that will stay set aside).
    async fn check(
        &self,
        bundle: Bundle,
        serve_check: Option<&Operator>,
    ) -> Result<(Arc<Loaded>, Vec<String>), Refusal> {
        let engine = self.engine.clone();
        let b = bundle.clone();
        // Compiling (scripts, templates) happens off the async workers.
        let mut loaded = if self.inline {
            load_bundle(&engine, &b, None)
        } else {
            tokio::task::spawn_blocking(move || load_bundle(&engine, &b, None))
                .await
                .map_err(|e| Refusal::cluster(vec![format!("compiling {}: {e}", bundle.origin)]))?
        };
        if let Some(tenant) = self.tenant_of(&bundle.origin) {
            loaded.confine_to(&tenant, &self.tenancy.pod_bounds);
        }
        if !loaded.errors.is_empty() {
            // The rest of the bundle is checked too, so that one answer
            // names every error: kinds not served, and conflicts of the
            // policies that did compile.
            let mut errors: Vec<String> = loaded.errors.iter().map(|e| e.to_string()).collect();
            if let Some(op) = serve_check {
                errors.extend(unserved_places(op, &loaded).await);
            }
            if let Err(more) = self.check_with_the_rest(&bundle, &Arc::new(clone_loaded(&loaded))) {
                errors.extend(more.errors);
            }
            return Err(Refusal::content(errors));
        }
        self.check_dangers(&loaded)?;
        let secret_errors = self.check_secrets(&loaded).await;
        if !secret_errors.is_empty() {
            return Err(Refusal::cluster(secret_errors));
        }
        let candidate = Arc::new(loaded);
        let set = self.check_with_the_rest(&bundle, &candidate)?;
        let mut notes = Vec::new();
        if let Some(tenant) = self.tenant_of(&bundle.origin) {
            notes = self.check_tenant(&tenant, &candidate).await?;
        }
        if let Some(op) = serve_check {
            notes.extend(self.check_serving(op, &bundle, &candidate, &set).await?);
        }
        Ok((candidate, notes))
    }

    /// A bundle declaring a dangerous kind is refused unless allowed; so
    /// is one whose policies make children in other namespaces.
    fn check_dangers(&self, loaded: &Loaded) -> Result<(), Refusal> {
        let mut refused: Vec<String> = Vec::new();
        if !self.dangerous_kinds {
            refused.extend(
                crate::rbac::dangers_of(loaded.policies.iter())
                    .into_iter()
                    .map(|d| {
                        format!("refused: {d} (start with --allow-dangerous-kinds to accept it)")
                    }),
            );
        }
        if !self.other_namespaces {
            for p in &loaded.policies {
                if let Some((_, pos)) = &p.namespaces {
                    let error = runbook_core::policy::LoadError {
                        file: p.file.clone(),
                        pos: *pos,
                        message: format!(
                            "spec.namespaces: policy {:?} makes children in other namespaces than its targets'; start the operator with --allow-other-namespaces to accept it",
                            p.name
                        ),
                    };
                    refused.push(error.to_string());
                }
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(Refusal::content(refused))
        }
    }

    /// Cross-bundle checks: the whole set built with this version in; the
    /// errors about this bundle refuse it.
    fn check_with_the_rest(
        &self,
        bundle: &Bundle,
        candidate: &Arc<Loaded>,
    ) -> Result<PolicySet, Refusal> {
        let (set, errors) = {
            let bundles = lock(&self.bundles);
            let mut loaded: Vec<Loaded> = bundles
                .iter()
                .filter(|(o, _)| **o != bundle.origin)
                .filter_map(|(_, b)| b.good.as_deref().map(clone_loaded))
                .collect();
            loaded.push(clone_loaded(candidate));
            PolicySet::build(loaded)
        };
        let ours: Vec<String> = candidate.policies.iter().map(|p| p.file.clone()).collect();
        let mine: Vec<String> = errors
            .iter()
            .filter(|e| e.file.is_empty() || ours.contains(&e.file))
            .map(|e| e.to_string())
            .collect();
        if mine.is_empty() {
            Ok(set)
        } else {
            Err(Refusal::content(mine))
        }
    }

    /// What the running operator can serve: a policy the edit would stop
    /// (it runs now) or that it adds unable to run is refused; one already
    /// set aside at start-up for a kind the cluster lacks stays set aside
    /// and does not hold up edits of the rest of its bundle. Then the
    /// permissions the new version needs.
    async fn check_serving(
        &self,
        op: &Operator,
        bundle: &Bundle,
        candidate: &Loaded,
        set: &PolicySet,
    ) -> Result<Vec<String>, Refusal> {
        let names: Vec<String> = candidate.policies.iter().map(|p| p.id.clone()).collect();
        let kept = match op.dry_check_kinds(set).await {
            Ok(kept) => kept,
            Err(e) => {
                let placed = unserved_places(op, candidate).await;
                return Err(Refusal::cluster(if placed.is_empty() {
                    vec![e.to_string()]
                } else {
                    placed
                }));
            }
        };
        let serving = op.ctx.policies.load_full();
        let before: Vec<String> = lock(&self.bundles)
            .get(&bundle.origin)
            .and_then(|b| b.good.as_deref())
            .map(|l| l.policies.iter().map(|p| p.id.clone()).collect())
            .unwrap_or_default();
        let refused: Vec<String> = names
            .iter()
            .filter(|n| !kept.policies.contains_key(*n))
            .filter(|n| serving.policies.contains_key(*n) || !before.contains(n))
            .map(|n| format!("policy {n}: a kind it names is not served by the API server"))
            .collect();
        if !refused.is_empty() {
            let placed = unserved_places(op, candidate).await;
            return Err(Refusal::cluster(if placed.is_empty() {
                refused
            } else {
                placed
            }));
        }
        // A tenant's rights, and the operator's for it, were asked in
        // `check_tenant`.
        if self.access_check && self.tenant_of(&bundle.origin).is_none() {
            self.check_access(op, &kept, &names, None)
                .await
                .map_err(Refusal::cluster)?;
        }
        Ok(names
            .iter()
            .filter(|n| !kept.policies.contains_key(*n))
            .map(|n| {
                format!("policy {n} stays set aside until the API server serves the kinds it names")
            })
            .collect())
    }

    /// Note a refused version of a bundle: log it and put an Event on its
    /// ConfigMap when the errors are new, and schedule another try when
    /// the cluster may mend the cause.
    /// `true` when the refusal took its last good version out of force.
    async fn refused(&self, bundle: Bundle, refusal: &Refusal) -> bool {
        let origin = bundle.origin.clone();
        let (serving, repeated, retry, revoked, restored) = {
            let mut bundles = lock(&self.bundles);
            let state = bundles
                .entry(origin.clone())
                .or_insert_with(|| BundleState::new(bundle.clone()));
            let revoked = refusal.revoke && state.good.take().is_some();
            let repeated = state.bundle == bundle && state.errors == refusal.errors && !revoked;
            state.bundle = bundle;
            state.errors = refusal.errors.clone();
            state.retry = refusal.transient.then(|| {
                let pause = match state.retry {
                    Some(r) if repeated => (r.pause * 2).min(RETRY_MAX),
                    _ => RETRY_FIRST,
                };
                Retry {
                    at: tokio::time::Instant::now() + pause,
                    pause,
                }
            });
            (
                state.good.is_some(),
                repeated,
                state.retry,
                revoked,
                state.restored.clone(),
            )
        };
        self.count("error");
        self.publish_states();
        let kept_at;
        let what = if let (true, Some(at)) = (serving, &restored) {
            let name = last_good::name_of(&origin).unwrap_or_default();
            kept_at = format!(
                "the last good version (kept in ConfigMap {}/{name}, written {at}) serves",
                self.secret_namespace
            );
            kept_at.as_str()
        } else if serving {
            "the last good version keeps serving"
        } else if revoked {
            "its policies stopped until it loads again"
        } else {
            "none of its policies run until it loads"
        };
        let again = retry
            .map(|r| format!("; trying again in {}s", r.pause.as_secs()))
            .unwrap_or_default();
        for e in &refusal.errors {
            if repeated {
                tracing::warn!(bundle = %origin, "policy bundle still refused{again}: {e}");
            } else {
                tracing::error!(bundle = %origin, "policy bundle refused, {what}{again}: {e}");
            }
        }
        if !repeated {
            let mut note = refusal.errors.join("\n");
            if restored.is_some() && serving {
                note.push_str(&format!("\n{what}"));
            }
            self.event(&origin, true, "PolicyInvalid", &note).await;
        }
        revoked
    }

    /// The cluster-wide bundles of which no version has loaded yet
    /// (nothing of them runs): `/readyz` is not ready while there are any.
    /// A tenant's never stops the operator being ready (see [`Self::notes`]).
    pub fn never_loaded(&self) -> Vec<String> {
        lock(&self.bundles)
            .iter()
            .filter(|(o, b)| b.good.is_none() && self.tenant_of(o).is_none())
            .map(|(o, _)| o.to_string())
            .collect()
    }

    /// What `/readyz` says beside `ok`: each tenant's bundle that does not
    /// run, and each bundle whose latest version is refused while its last
    /// good one serves.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (o, b) in lock(&self.bundles).iter() {
            match (&b.good, b.errors.is_empty()) {
                (None, _) if self.tenant_of(o).is_some() => out.push(format!(
                    "the tenant's policy bundle {o} does not run (see its PolicyInvalid Events)"
                )),
                (None, _) => out.push(format!(
                    "policy bundle {o} does not run: no version of it has loaded (see its PolicyInvalid Events)"
                )),
                (Some(_), false) if b.restored.is_some() => out.push(format!(
                    "policy bundle {o}: its current version is refused, the last good one kept in the cluster serves (see its PolicyInvalid Events)"
                )),
                (Some(_), false) => out.push(format!(
                    "policy bundle {o}: its latest version is refused, the last good one serves (see its PolicyInvalid Events)"
                )),
                _ => {}
            }
        }
        out
    }

    /// `runbook_bundle_state{bundle,state}`: one series per bundle, at 1;
    /// `runbook_policy_state{bundle,policy,state}`: one per policy of a
    /// bundle's version in force, `loaded`, `set_aside` (a kind it names
    /// is not served) or `refused` (the bundle's latest version is, this
    /// one serves); a bundle none of which runs has one series with an
    /// empty `policy`, `never_loaded`.
    fn publish_states(&self) {
        let aside = self.aside_now();
        let (bundle_gauge, policy_gauge) = (&self.metrics.bundle_state, &self.metrics.policy_state);
        bundle_gauge.clear();
        policy_gauge.clear();
        for (o, b) in lock(&self.bundles).iter() {
            let origin = o.to_string();
            let state = match (&b.good, b.errors.is_empty()) {
                (None, _) => "never_loaded",
                (Some(_), true) => "loaded",
                (Some(_), false) if b.restored.is_some() => "last_good",
                (Some(_), false) => "refused",
            };
            bundle_gauge
                .get_or_create(&Metrics::labels(&[("bundle", &origin), ("state", state)]))
                .set(1);
            let Some(good) = &b.good else {
                policy_gauge
                    .get_or_create(&Metrics::labels(&[
                        ("bundle", &origin),
                        ("policy", ""),
                        ("state", state),
                    ]))
                    .set(1);
                continue;
            };
            for p in &good.policies {
                let state = if aside.contains_key(&p.id) {
                    "set_aside"
                } else {
                    state
                };
                policy_gauge
                    .get_or_create(&Metrics::labels(&[
                        ("bundle", &origin),
                        ("policy", &p.id),
                        ("state", state),
                    ]))
                    .set(1);
            }
        }
    }

    fn aside_now(&self) -> crate::runtime::SetAside {
        self.set_aside
            .get()
            .map(|rx| rx.borrow().clone())
            .unwrap_or_default()
    }

    /// Tell each bundle whose policy the operator set aside for a kind not
    /// served: a Warning Event `PolicyWaitingForKind` on its ConfigMap
    /// naming the kinds and how to serve them, and a Normal
    /// `PolicyKindServed` when it is in force again.
    pub async fn tell_set_aside(&self) {
        let aside = self.aside_now();
        let mut told = lock(&self.told_aside).clone();
        if told == aside {
            return;
        }
        let mut notes: Vec<(Origin, bool, String)> = Vec::new();
        {
            let bundles = lock(&self.bundles);
            let origin_of = |id: &str| {
                bundles.iter().find_map(|(o, b)| {
                    let good = b.good.as_ref()?;
                    good.policies.iter().any(|p| p.id == id).then(|| o.clone())
                })
            };
            for (id, kinds) in &aside {
                if told.get(id) == Some(kinds) {
                    continue;
                }
                let Some(origin) = origin_of(id) else {
                    continue;
                };
                let names: Vec<String> = kinds.iter().map(|k| k.to_string()).collect();
                let fix = if kinds.iter().any(|k| k.group() == "runbook.dev") {
                    "install Runbook's CRDs (runbook crds | kubectl apply --server-side -f -)"
                } else {
                    "install the CustomResourceDefinition that defines it (kubectl apply -f <crd.yaml>)"
                };
                notes.push((
                    origin,
                    true,
                    format!(
                        "policy {id} is set aside: the API server does not serve {}; {fix}, and it loads within seconds, without a restart",
                        names.join(", ")
                    ),
                ));
            }
            for id in told.keys() {
                if aside.contains_key(id) {
                    continue;
                }
                if let Some(origin) = origin_of(id) {
                    notes.push((
                        origin,
                        false,
                        format!("policy {id} is in force: the kinds it names are served now"),
                    ));
                }
            }
        }
        told.clone_from(&aside);
        *lock(&self.told_aside) = told;
        self.publish_states();
        for (origin, warning, message) in notes {
            let reason = if warning {
                crate::runtime::rediscover::WAITING_REASON
            } else {
                "PolicyKindServed"
            };
            self.event(&origin, warning, reason, &message).await;
        }
    }

    /// Ask again whether each tenant's bundle in force may still read what
    /// its policies read (and the operator still act for it): one whose
    /// rights were revoked stops, with its Event, until a grant lets it
    /// load again. An API server that cannot answer changes nothing.
    pub async fn recheck_tenants(&self, op: &Operator) {
        let Some(client) = &self.client else { return };
        let serving: Vec<(Bundle, Arc<Loaded>, String)> = lock(&self.bundles)
            .values()
            .filter_map(|b| {
                let tenant = self.tenant_of(&b.bundle.origin)?;
                Some((b.bundle.clone(), b.good.clone()?, tenant))
            })
            .collect();
        for (bundle, good, tenant) in serving {
            let (set, _) = PolicySet::build(vec![clone_loaded(&good)]);
            let access =
                crate::runtime::access::tenant_access(client, &set, &tenant, &self.tenancy).await;
            let refusals = match access {
                Ok(found) => found.refusals,
                Err(e) => {
                    tracing::warn!(bundle = %bundle.origin, "could not ask again what the tenant's account may do: {}", crate::util::api_error(&e));
                    continue;
                }
            };
            if refusals.is_empty() {
                continue;
            }
            let _gate = self.gate.lock().await;
            if self.refused(bundle, &Refusal::revoking(refusals)).await {
                let (set, _) = self.current_set();
                op.swap_policies(set).await;
            }
        }
    }

    /// Try again the bundles refused for a cause the cluster may have
    /// mended since (a Secret created, a permission granted, a CRD
    /// installed), each after its backoff.
    pub async fn retry_due(&self, op: &Operator) -> Vec<Reloaded> {
        let now = tokio::time::Instant::now();
        let due: Vec<Bundle> = lock(&self.bundles)
            .values()
            .filter(|b| b.retry.is_some_and(|r| r.at <= now))
            .map(|b| b.bundle.clone())
            .collect();
        let mut out = Vec::new();
        for b in due {
            out.push(self.apply(op, b.origin.clone(), Some(b), true).await);
        }
        out
    }

    /// Load bundles at start-up, before the operator exists.
    pub async fn initial(&self, bundles: Vec<Bundle>) -> (PolicySet, Vec<String>) {
        let mut all_errors = Vec::new();
        for b in bundles {
            match self.try_bundle(b.clone(), None).await {
                Err(refusal) => {
                    self.restore(&b).await;
                    self.refused(b, &refusal).await;
                    all_errors.extend(refusal.errors);
                }
                Ok(notes) => {
                    self.count("ok");
                    self.warn(&b.origin, &notes).await;
                    self.keep(&b).await;
                }
            }
        }
        self.publish_states();
        let (set, _) = self.current_set();
        (set, all_errors)
    }

    /// A bundle changed (`Some`) or went away (`None`): rebuild and swap.
    pub async fn update(&self, op: &Operator, origin: Origin, bundle: Option<Bundle>) -> Reloaded {
        self.apply(op, origin, bundle, false).await
    }

    /// `update`, or (`retry`) another try of a refused version.
    async fn apply(
        &self,
        op: &Operator,
        origin: Origin,
        bundle: Option<Bundle>,
        retry: bool,
    ) -> Reloaded {
        let _gate = self.gate.lock().await;
        match bundle {
            None => {
                let removed = lock(&self.bundles).remove(&origin).is_some();
                if !removed {
                    return Reloaded::Unchanged;
                }
                tracing::info!(bundle = %origin, "policy bundle removed");
                self.forget_kept(&origin).await;
            }
            Some(b) => {
                let same = lock(&self.bundles)
                    .get(&origin)
                    .is_some_and(|s| s.bundle == b && (s.good.is_some() || !s.errors.is_empty()));
                if same && !retry {
                    return Reloaded::Unchanged;
                }
                match self.try_bundle(b.clone(), Some(op)).await {
                    Ok(notes) => {
                        self.warn(&origin, &notes).await;
                        self.keep(&b).await;
                    }
                    Err(refusal) => {
                        if self.refused(b, &refusal).await {
                            let (set, _) = self.current_set();
                            op.swap_policies(set).await;
                        }
                        return Reloaded::Refused {
                            errors: refusal.errors,
                        };
                    }
                }
            }
        }
        self.publish_states();
        let (set, _) = self.current_set();
        let version = set.version.clone();
        let requeued = op.swap_policies(set.clone()).await;
        self.count("ok");
        tracing::info!(
            version = %version,
            policies = ?set.policies.values().map(|p| format!("{}@{}", p.id, p.version)).collect::<Vec<_>>(),
            requeued = ?requeued.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
            "policy set swapped in"
        );
        self.event(
            &origin,
            false,
            "PolicyLoaded",
            &format!("policy set version {version} in force"),
        )
        .await;
        Reloaded::Swapped { version }
    }

    /// What a loaded bundle's policies will meet (a write its tenant's
    /// account may not make, a policy set aside until its kind is
    /// served): logged, and a Warning Event `PolicyWarning` on its
    /// ConfigMap.
    async fn warn(&self, origin: &Origin, notes: &[String]) {
        if notes.is_empty() {
            return;
        }
        for n in notes {
            tracing::warn!(bundle = %origin, "{n}");
        }
        self.event(origin, true, "PolicyWarning", &notes.join("\n"))
            .await;
    }

    async fn event(&self, origin: &Origin, warning: bool, reason: &str, message: &str) {
        let (Some(rec), Origin::ConfigMap { namespace, name }) = (&self.recorder, origin) else {
            return;
        };
        let standing_by = self
            .leading
            .get()
            .is_some_and(|l| !l.load(std::sync::atomic::Ordering::Acquire));
        if standing_by {
            return;
        }
        let Some(client) = &self.client else { return };
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let uid = api
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|c| c.metadata.uid);
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            uid,
            ..Default::default()
        };
        let ev = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(message.chars().take(1024).collect()),
            action: "Reload".into(),
            secondary: None,
        };
        if let Err(e) = rec.publish(&ev, &reference).await {
            tracing::warn!("recording an Event on {origin}: {e}");
        }
    }

    /// Tell each bundle whose policies use a kind whose watch fails: a
    /// Warning Event `WatchFailing` on its ConfigMap with the API's answer
    /// (once per failure, after `TELL_POLICIES_AFTER`), and a Normal
    /// `WatchRecovered` when the watch delivers again. The log line and
    /// `runbook_watch_failing` come from the watch itself.
    pub async fn tell_failing_watches(&self, op: &Operator) {
        let failing = op
            .ctx
            .health
            .watches
            .failing_errors(crate::observe::health::TELL_POLICIES_AFTER);
        let mut failed = Vec::new();
        let mut recovered = Vec::new();
        {
            let bundles = lock(&self.bundles);
            let mut told = lock(&self.watch_told);
            for (origin, state) in bundles.iter() {
                let Some(good) = &state.good else { continue };
                for (watch, error) in &failing {
                    // A tenant's namespace's watch concerns its bundles only.
                    let tenant = op.ctx.health.watches.tenant_of(watch);
                    let kind = match &tenant {
                        Some(ns) => {
                            if self.tenant_of(origin).as_ref() != Some(ns) {
                                continue;
                            }
                            watch
                                .strip_suffix(&format!(" in {ns}"))
                                .unwrap_or(watch)
                                .to_string()
                        }
                        None => watch.clone(),
                    };
                    let users: Vec<&str> = good
                        .policies
                        .iter()
                        .filter(|p| {
                            p.target.to_string() == kind
                                || p.kinds.kinds().iter().any(|k| k.to_string() == kind)
                        })
                        .map(|p| p.name.as_str())
                        .collect();
                    if !users.is_empty() && told.insert((origin.clone(), watch.clone())) {
                        failed.push((
                            origin.clone(),
                            watch.clone(),
                            error.clone(),
                            users.join(", "),
                        ));
                    }
                }
            }
            told.retain(|(origin, watch)| {
                let still = failing.contains_key(watch) && bundles.contains_key(origin);
                if !still {
                    recovered.push((origin.clone(), watch.clone()));
                }
                still
            });
        }
        for (origin, watch, error, users) in failed {
            let message = format!(
                "the watch of {watch} fails: {error}; policy {users} sees no change of that kind until it recovers"
            );
            self.event(&origin, true, "WatchFailing", &message).await;
        }
        for (origin, watch) in recovered {
            let message = format!("the watch of {watch} delivers again");
            self.event(&origin, false, "WatchRecovered", &message).await;
        }
    }

    /// The directory bundles as they are on disk now.
    pub fn read_dirs(dirs: &[PathBuf]) -> Vec<Bundle> {
        let mut out = Vec::new();
        for d in dirs {
            match Bundle::discover(d) {
                Ok(b) => out.extend(b),
                Err(e) => tracing::error!(dir = %d.display(), "reading policies: {e}"),
            }
        }
        out
    }

    /// Re-read the directories; apply what changed and what went away.
    pub async fn rescan_dirs(&self, op: &Operator, dirs: &[PathBuf]) -> Vec<Reloaded> {
        let fresh = Self::read_dirs(dirs);
        let mut out = Vec::new();
        let known: Vec<Origin> = lock(&self.bundles)
            .keys()
            .filter(|o| matches!(o, Origin::Dir(p) if dirs.iter().any(|d| p.starts_with(d))))
            .cloned()
            .collect();
        for o in known {
            if !fresh.iter().any(|b| b.origin == o) {
                out.push(self.update(op, o, None).await);
            }
        }
        for b in fresh {
            let origin = b.origin.clone();
            out.push(self.update(op, origin, Some(b)).await);
        }
        out
    }
}

/// Watch the sources and reload on every change until the operator stops.
pub fn spawn(
    reloader: Arc<Reloader>,
    op: Arc<Operator>,
    sources: SourceConfig,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let _ = reloader.leading.set(op.ctx.health.leading.clone());
    let _ = reloader.set_aside.set(op.ctx.health.set_aside.subscribe());
    if let Some(client) = reloader.client.clone() {
        tasks.extend(check_at_admission(&reloader, &op, &client, &sources));
        for ns in sources.configmap_namespaces.clone() {
            let (r, op) = (reloader.clone(), op.clone());
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                watch_configmaps(r, op, client, ns).await
            }));
        }
    }
    if !sources.dirs.is_empty() {
        let (r, op) = (reloader.clone(), op.clone());
        tasks.push(tokio::spawn(async move {
            watch_dirs(r, op, sources.dirs).await
        }));
    }
    // Policies set aside for a kind not served come back when it is.
    tasks.push(tokio::spawn(op.clone().watch_kinds()));
    let (r, op) = (reloader.clone(), op.clone());
    tasks.push(tokio::spawn(async move {
        let mut rechecked = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            r.retry_due(&op).await;
            r.tell_failing_watches(&op).await;
            r.tell_set_aside().await;
            if rechecked.elapsed() >= TENANT_RECHECK {
                rechecked = tokio::time::Instant::now();
                r.recheck_tenants(&op).await;
            }
        }
    }));
    tasks
}

/// Each kind the bundle declares that the API server does not serve, at
/// its place, with the kind meant where one is near: one the kind's
/// group and version serve, or a kind built into Kubernetes.
async fn unserved_places(op: &Operator, candidate: &Loaded) -> Vec<String> {
    let built_in: Vec<String> = runbook_core::kinds::well_known_kinds()
        .iter()
        .map(|k| k.to_string())
        .collect();
    // Each group version is asked once, however many places name it.
    let mut served: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    for (file, places) in &candidate.declared {
        for (place, kind, pos) in places {
            match op.ctx.resources.resolve(kind).await {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(kube::Error::Discovery(_)) => {}
                _ => continue,
            }
            if !served.contains_key(&kind.api_version) {
                let kinds = served_in(&op.ctx.client, &kind.api_version).await;
                served.insert(kind.api_version.clone(), kinds);
            }
            let near = served[&kind.api_version].iter().map(String::as_str);
            let meant = runbook_core::util::suggest::closest(&kind.kind, near)
                .map(|k| format!("{} {k}", kind.api_version))
                .or_else(|| {
                    let known = built_in.iter().map(String::as_str);
                    runbook_core::util::suggest::closest(&kind.to_string(), known)
                        .map(str::to_string)
                });
            let at = pos.map_or(String::new(), |p| format!(":{}:{}", p.line, p.col));
            let hint = meant.map_or(String::new(), |m| format!(" (did you mean {m}?)"));
            out.push(format!(
                "{file}{at}: {place}: the API server serves no {kind}{hint}"
            ));
        }
    }
    out
}

/// Status the bundle's policies declare that their targets' served
/// schemas would drop, each at its place with the field meant where one
/// is near. Not an error: the CRD may gain the field later.
async fn dropped_status_places(op: &Operator, candidate: &Loaded) -> Vec<String> {
    let mut schemas = crate::observe::schemas::ServedSchemas::default();
    let mut out = Vec::new();
    for p in &candidate.policies {
        if !p.status.declared || runbook_core::kinds::built_in(&p.target) {
            continue;
        }
        let Some(status) = schemas.status(&op.ctx.client, &p.target).await else {
            continue;
        };
        for (pos, message) in
            runbook_core::plan::state::unlisted_notes(&p.target.kind, &status, &p.status)
        {
            let at = pos.map_or(String::new(), |p| format!(":{}:{}", p.line, p.col));
            out.push(format!("{}{at}: {message}", p.file));
        }
    }
    out
}

/// The kinds an API group version serves (none when it serves nothing).
async fn served_in(client: &kube::Client, api_version: &str) -> Vec<String> {
    let list = if api_version.contains('/') {
        client.list_api_group_resources(api_version).await
    } else {
        client.list_core_api_resources(api_version).await
    };
    list.map(|l| {
        l.resources
            .into_iter()
            .filter(|r| !r.name.contains('/'))
            .map(|r| r.kind)
            .collect()
    })
    .unwrap_or_default()
}

/// Policy ConfigMaps checked as they are written: the webhook this
/// replica serves (if any) checks them with this reload's checks, and the
/// policy webhook's configuration is pointed at the namespaces watched.
fn check_at_admission(
    reloader: &Arc<Reloader>,
    op: &Arc<Operator>,
    client: &kube::Client,
    sources: &SourceConfig,
) -> Option<tokio::task::JoinHandle<()>> {
    let hook = op.ctx.webhook.get()?.clone();
    if !sources.admission || sources.configmap_namespaces.is_empty() {
        return None;
    }
    let check = Arc::new(AdmissionCheck {
        reloader: reloader.clone(),
        op: op.clone(),
    });
    hook.check_policies(check, BUNDLE_LABEL, &sources.configmap_namespaces);
    let client = client.clone();
    Some(tokio::spawn(async move {
        match hook.keep_policies_in_step(&client).await {
            Ok(true) => tracing::info!("the policy webhook's configuration was brought in step"),
            Ok(false) => {}
            Err(e) => tracing::error!(
                "pointing the policy webhook at this replica: {e}; policy ConfigMaps are checked when loaded only"
            ),
        }
    }))
}

/// The reload's checks, run on a bundle at admission.
struct AdmissionCheck {
    reloader: Arc<Reloader>,
    op: Arc<Operator>,
}

impl PolicyCheck for AdmissionCheck {
    fn check(&self, bundle: Bundle) -> futures::future::BoxFuture<'_, Verdict> {
        Box::pin(async move {
            match self.reloader.check(bundle, Some(&self.op)).await {
                // What the served schemas would drop is told here only:
                // a load makes nothing of notes, and would ask for the
                // schemas on every edit.
                Ok((loaded, mut notes)) => {
                    notes.extend(dropped_status_places(&self.op, &loaded).await);
                    Verdict {
                        errors: Vec::new(),
                        warnings: notes,
                    }
                }
                Err(refusal) => Verdict {
                    errors: refusal.errors,
                    warnings: Vec::new(),
                },
            }
        })
    }
}

/// The newest version of each policy ConfigMap that changed and is not
/// loaded yet (`None`: deleted), and when the last edit came. A burst of
/// edits to one bundle leaves only its last version here, so it is
/// compiled once.
#[derive(Default)]
struct Newest {
    bundles: Mutex<Waiting>,
    arrived: tokio::sync::Notify,
}

/// Bundles waiting to load, and when the last edit came.
type Waiting = (
    BTreeMap<Origin, Option<Bundle>>,
    Option<tokio::time::Instant>,
);

/// Edits are loaded once none has come for this long...
pub const EDIT_QUIET: Duration = Duration::from_millis(150);
/// ...or once the first of them has waited this long: an edit storm loads
/// its newest versions at most once per second, and its last edit is in
/// force at most this long (plus one load) after it arrived.
pub const EDIT_WAIT_MAX: Duration = Duration::from_secs(1);

impl Newest {
    fn put(&self, origin: Origin, bundle: Option<Bundle>) {
        let mut b = lock(&self.bundles);
        b.0.insert(origin, bundle);
        b.1 = Some(tokio::time::Instant::now());
        drop(b);
        self.arrived.notify_one();
    }

    /// Every bundle waiting, once the edits have paused for [`EDIT_QUIET`]
    /// or the first has waited [`EDIT_WAIT_MAX`].
    async fn take(&self) -> BTreeMap<Origin, Option<Bundle>> {
        while lock(&self.bundles).0.is_empty() {
            self.arrived.notified().await;
        }
        let first = tokio::time::Instant::now();
        loop {
            let latest = lock(&self.bundles).1.unwrap_or(first);
            let due = (latest + EDIT_QUIET).min(first + EDIT_WAIT_MAX);
            if tokio::time::Instant::now() >= due {
                return std::mem::take(&mut lock(&self.bundles).0);
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// Watch the policy ConfigMaps of a namespace. Edits are loaded by a task
/// of their own, the newest version of each bundle at a time (see
/// [`EDIT_QUIET`]): edits that arrive meanwhile, or while one loads (a
/// load waits for the caches of new kinds and reconciles the targets of
/// changed policies), replace each other.
async fn watch_configmaps(
    reloader: Arc<Reloader>,
    op: Arc<Operator>,
    client: kube::Client,
    namespace: String,
) {
    let newest = Arc::new(Newest::default());
    let loader = {
        let (newest, reloader, op) = (newest.clone(), reloader.clone(), op.clone());
        tokio::spawn(async move {
            loop {
                for (origin, bundle) in newest.take().await {
                    reloader.update(&op, origin, bundle).await;
                }
            }
        })
    };
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _loader = Abort(loader);
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&format!("{BUNDLE_LABEL}=true"));
    let mut stream = watcher::watcher(api, config)
        .backoff(crate::observe::health::WatchBackoff::default())
        .boxed();
    let watch_name = format!("policy ConfigMaps in {namespace}");
    let mut listed: Vec<Origin> = Vec::new();
    let bundle_of = |cm: &ConfigMap| {
        Bundle::from_configmap(
            &namespace,
            cm.metadata.name.as_deref().unwrap_or(""),
            &cm.data.clone().unwrap_or_default(),
        )
    };
    while let Some(ev) = stream.next().await {
        crate::observe::health::report_watch(
            &op.ctx.health.watches,
            &watch_name,
            ev.as_ref().err(),
        );
        match ev {
            Ok(Event::Apply(cm)) | Ok(Event::InitApply(cm)) => {
                let b = bundle_of(&cm);
                listed.push(b.origin.clone());
                newest.put(b.origin.clone(), Some(b));
            }
            Ok(Event::Delete(cm)) => {
                let b = bundle_of(&cm);
                newest.put(b.origin, None);
            }
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitDone) => {
                // ConfigMaps deleted while the watch was down.
                let known: Vec<Origin> = lock(&reloader.bundles)
                    .keys()
                    .filter(|o| matches!(o, Origin::ConfigMap { namespace: ns, .. } if *ns == namespace))
                    .cloned()
                    .collect();
                for o in known {
                    if !listed.contains(&o) {
                        newest.put(o, None);
                    }
                }
            }
            Err(_) => {}
        }
    }
}

/// How long file events are gathered before the directories are re-read:
/// editors and ConfigMap volume updates write in several steps.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

async fn watch_dirs(reloader: Arc<Reloader>, op: Arc<Operator>, dirs: Vec<PathBuf>) {
    use notify::{RecursiveMode, Watcher};
    // One event waiting is as good as many: the directories are re-read.
    let (tx, mut rx) = crate::util::channel::bounded::<()>(1);
    let mut watcher =
        match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if res.is_ok() {
                let _ = tx.send(());
            }
        }) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!("watching policy directories is not possible: {e}");
                return;
            }
        };
    for d in &dirs {
        if let Err(e) = watcher.watch(d, RecursiveMode::Recursive) {
            tracing::error!(dir = %d.display(), "watching: {e}");
        }
    }
    while rx.recv().await.is_some() {
        // Gather the burst, then read once.
        tokio::time::sleep(DEBOUNCE).await;
        while rx.try_recv().is_some() {}
        reloader.rescan_dirs(&op, &dirs).await;
    }
}

/// What `/readyz` reports for an operator and its reloader: ready once the
/// caches are synced, while none of the operator's own watches has failed
/// for long and every cluster-wide policy bundle has loaded at least once;
/// otherwise why not. A tenant's bundle that does not run, or a tenant's
/// watch that fails, is said beside `ok` and never makes it unready.
pub fn readiness(op: &Arc<Operator>, reloader: &Arc<Reloader>) -> crate::telemetry::Readiness {
    let (op, reloader) = (op.clone(), reloader.clone());
    Arc::new(move || {
        if !op
            .ctx
            .health
            .synced
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(op.ctx.health.waiting.not_ready("filling the watch caches"));
        }
        let mut failing = op.ctx.health.watches.ended();
        failing.extend(
            op.ctx
                .health
                .watches
                .failing_for(crate::observe::health::UNREADY_AFTER),
        );
        failing.extend(op.ctx.health.forbidden.now());
        if !failing.is_empty() {
            return Err(failing.join("\n"));
        }
        // A bundle that does not load is its authors' to mend: said here
        // and on its ConfigMap, it never takes the replica out of the
        // webhook's endpoints (every team's authorship goes through them).
        let mut notes = reloader.notes();
        notes.extend(op.ctx.health.watches.tenants_failing());
        Ok(notes)
    })
}
