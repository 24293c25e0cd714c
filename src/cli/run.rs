//! `runbook run`: the operator.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use runbook_core::clock::Clock;
use runbook_core::script::{ScriptEngine, ScriptLimits};
use runbook_operator::alert::deliver::{Delivery, DeliveryConfig};
use runbook_operator::alert::dispatch::Dispatcher;
use runbook_operator::observe::health;
use runbook_operator::reload::{self, Reloader, SourceConfig};
use runbook_operator::runtime::access;
use runbook_operator::runtime::leader::LeaseConfig;
use runbook_operator::runtime::{Operator, OperatorConfig};
use runbook_operator::telemetry::{self, Metrics};

#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "RUNBOOK_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Directories of policy files.
    #[arg(long = "policy-dir", env = "RUNBOOK_POLICY_DIR", value_delimiter = ',')]
    pub policy_dirs: Vec<PathBuf>,
    /// Read policy bundles from ConfigMaps labelled runbook.dev/policy=true.
    #[arg(long, env = "RUNBOOK_POLICY_CONFIGMAPS", default_value_t = true, action = clap::ArgAction::Set)]
    pub policy_configmaps: bool,
    /// Namespace of the policy ConfigMaps and the leader Lease.
    #[arg(
        long,
        env = "RUNBOOK_OPERATOR_NAMESPACE",
        default_value = "runbook-system"
    )]
    pub operator_namespace: String,
    /// Namespaces whose policy ConfigMaps are read (default: the operator's).
    #[arg(long, env = "RUNBOOK_POLICY_NAMESPACES", value_delimiter = ',')]
    pub policy_namespaces: Vec<String>,
    /// Check policy ConfigMaps as they are written (`kubectl apply` is
    /// refused with each error) through the webhook, when it is served.
    #[arg(long, env = "RUNBOOK_POLICY_WEBHOOK", default_value_t = true, action = clap::ArgAction::Set)]
    pub policy_webhook: bool,
    /// Watch and reconcile only this namespace.
    #[arg(
        long,
        short = 'n',
        env = "RUNBOOK_NAMESPACE",
        conflicts_with = "all_namespaces"
    )]
    pub namespace: Option<String>,
    /// Watch and reconcile every namespace (the default).
    #[arg(long, short = 'A', env = "RUNBOOK_ALL_NAMESPACES")]
    pub all_namespaces: bool,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "RUNBOOK_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Log lines as text (coloured only on a terminal, and not with
    /// NO_COLOR set) or as JSON, one object per line; `RUNBOOK_LOG` filters
    /// them (default `info`).
    #[arg(long, env = "RUNBOOK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Reconciles running at once.
    #[arg(long, env = "RUNBOOK_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Take a Lease so that only one instance writes.
    #[arg(long, env = "RUNBOOK_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// The leader Lease, in the operator's namespace (sharded, each
    /// replica's member Lease is named after it).
    #[arg(long, env = "RUNBOOK_LEASE_NAME", default_value = "runbook-leader")]
    pub lease_name: String,
    /// Seconds a Lease stays valid without renewal (at least 2). The holder
    /// renews it every fifth of that and stops acting half of it after
    /// its last renewal; another replica takes over three fifths of it
    /// after it last saw the Lease change.
    /// Takes units as Kubernetes tools do (`15s`, `1m`); a bare number is
    /// seconds.
    #[arg(long, env = "RUNBOOK_LEASE_DURATION", default_value = "15s", value_parser = whole_seconds)]
    pub lease_duration: u64,
    /// This instance's name (default: $POD_NAME or the host name).
    #[arg(long, env = "RUNBOOK_IDENTITY")]
    pub identity: Option<String>,
    /// Wall-clock budget of one script call, in milliseconds.
    #[arg(long, env = "RUNBOOK_SCRIPT_TIMEOUT_MS", default_value_t = 20)]
    pub script_timeout_ms: u64,
    /// How long to let reconciles in flight finish on SIGTERM (`20s`,
    /// `1m`; a bare number is seconds).
    #[arg(long, env = "RUNBOOK_SHUTDOWN_GRACE", default_value = "20s", value_parser = whole_seconds)]
    pub shutdown_grace: u64,
    /// Alert notifications waiting per receiver before new ones are dropped.
    #[arg(long, env = "RUNBOOK_ALERT_QUEUE_CAPACITY", default_value_t = 256)]
    pub alert_queue_capacity: usize,
    /// Attempts per alert notification (with exponential backoff between them).
    #[arg(long, env = "RUNBOOK_ALERT_MAX_ATTEMPTS", default_value_t = 5)]
    pub alert_max_attempts: u32,
    /// Accept policies that declare dangerous kinds (Secrets, RBAC objects,
    /// admission webhooks, wildcards, ...); by default their bundles are refused.
    #[arg(long, env = "RUNBOOK_ALLOW_DANGEROUS_KINDS")]
    pub allow_dangerous_kinds: bool,
    /// Accept policies that make children in other namespaces than their
    /// targets' (`spec.namespaces`, such as a Secret copied into labelled
    /// namespaces); by default their bundles are refused. Needs the
    /// operator to watch every namespace.
    #[arg(
        long,
        env = "RUNBOOK_ALLOW_OTHER_NAMESPACES",
        conflicts_with = "namespace"
    )]
    pub allow_other_namespaces: bool,
    /// Share the targets with the other replicas started so (each holds a
    /// member Lease beside the leader Lease, and decides for the targets
    /// labelled `runbook.dev/shard: <its identity>`); needs leader
    /// election, and an identity that is a label value.
    #[arg(long, env = "RUNBOOK_SHARDS")]
    pub shards: bool,
    /// With --shards: how many replicas start together (set it to the
    /// Deployment's replicas). Once that many are live, the first ring
    /// forms at once instead of after the settling time; a wrong count
    /// costs only that wait or a move of targets.
    #[arg(long, env = "RUNBOOK_SHARD_REPLICAS", requires = "shards")]
    pub shard_replicas: Option<usize>,
    /// Decide again on every reconcile skipped as unchanged, and report
    /// (log, metric `runbook_skip_check_differences_total`) any that would
    /// decide differently: a check of Runbook itself, at the cost of the
    /// decisions the skips save.
    #[arg(long, env = "RUNBOOK_CHECK_SKIPS")]
    pub check_skips: bool,
    /// The ServiceAccount, in each tenant's namespace, that the policies
    /// from its ConfigMaps act as (impersonated: the operator needs
    /// `impersonate` on it there, which `runbook rbac --tenant` prints).
    #[arg(
        long,
        env = "RUNBOOK_TENANT_SERVICE_ACCOUNT",
        default_value = runbook_operator::runtime::tenants::DEFAULT_ACCOUNT
    )]
    pub tenant_service_account: String,
    /// Another ServiceAccount for one tenant's namespace, as NAMESPACE=ACCOUNT
    /// (repeat, or comma-separated).
    #[arg(
        long = "tenant-service-account-for",
        env = "RUNBOOK_TENANT_SERVICE_ACCOUNTS",
        value_delimiter = ',',
        value_parser = namespace_account
    )]
    pub tenant_service_accounts: Vec<(String, String)>,
    /// The most a tenant's policy may allow its pods (`spec.pods`, as YAML:
    /// `{serviceAccounts: [bench]}`); a tenant's bundle that allows more is
    /// refused. Default: nothing.
    #[arg(long, env = "RUNBOOK_TENANT_POD_BOUNDS", default_value = "{}", value_parser = pod_bounds)]
    pub tenant_pod_bounds: runbook_core::policy::model::PodsSpec,
    /// The hosts (HOST or HOST:PORT, comma-separated) a tenant's metric
    /// inputs (`spec.metrics`) may reach, such as the shared Prometheus:
    /// the operator asks from its own place in the network, so a tenant
    /// may point it only where the administrator lets it. Default: none.
    #[arg(long, env = "RUNBOOK_TENANT_METRIC_HOSTS", value_delimiter = ',')]
    pub tenant_metric_hosts: Vec<String>,
    /// Decisions of one policy under way at once where another policy
    /// targets the same kind; more wait, without holding up the other.
    #[arg(long, env = "RUNBOOK_POLICY_CONCURRENCY", default_value_t = 8)]
    pub policy_concurrency: usize,
    /// Milliseconds of script time one policy may use per second while
    /// another policy wants a turn; past it its decisions wait
    /// (`runbook_policy_throttled_total`).
    #[arg(long, env = "RUNBOOK_POLICY_CPU_BUDGET_MS", default_value_t = 100)]
    pub policy_cpu_budget_ms: u64,
    /// Skip the start-up check (SelfSubjectAccessReviews) that the operator
    /// holds every permission its policies need.
    #[arg(long, env = "RUNBOOK_SKIP_ACCESS_CHECK")]
    pub skip_access_check: bool,
    #[command(flatten)]
    pub hook: super::rbac::WebhookObjectsArgs,
    /// Address the webhook's HTTPS server listens on.
    #[arg(long, env = "RUNBOOK_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// The Service (in the operator namespace, port 443) the API server
    /// reaches the webhook through.
    #[arg(
        long,
        env = "RUNBOOK_WEBHOOK_SERVICE",
        default_value = "runbook-webhook"
    )]
    pub webhook_service: String,
    /// Reach the webhook at this URL instead of the Service (an operator
    /// the API server can reach directly, such as one run outside the
    /// cluster): `https://HOST:PORT`.
    #[arg(long, env = "RUNBOOK_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
}

/// `NAMESPACE=ACCOUNT`.
fn namespace_account(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((ns, account)) if !ns.is_empty() && !account.is_empty() => {
            Ok((ns.to_string(), account.to_string()))
        }
        _ => Err(format!("{s:?}: want NAMESPACE=ACCOUNT")),
    }
}

/// A `spec.pods` document, as YAML.
/// A duration in whole seconds: `15s`, `2m`, `1h30m`, or a bare number of
/// seconds.
fn whole_seconds(text: &str) -> Result<u64, String> {
    let ms = runbook_core::util::time::parse_duration_ms(text)?;
    if ms < 0 || ms % 1000 != 0 {
        return Err(format!(
            "{text:?}: give whole seconds, such as 15s, 2m or 15"
        ));
    }
    Ok((ms / 1000) as u64)
}

fn pod_bounds(s: &str) -> Result<runbook_core::policy::model::PodsSpec, String> {
    runbook_core::util::yaml::parse(s).map_err(|e| format!("{s:?}: {e}"))
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

pub fn init_logging(format: LogFormat) {
    let _ = match format {
        LogFormat::Text => {
            use std::io::IsTerminal;
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            tracing::subscriber::set_global_default(telemetry::log::text_with(
                std::io::stderr,
                colour,
            ))
        }
        LogFormat::Json => {
            tracing::subscriber::set_global_default(telemetry::log::json(std::io::stderr))
        }
    };
}

fn identity(args: &RunArgs) -> String {
    args.identity
        .clone()
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("runbook-{}", std::process::id()))
}

pub async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    Ok(kube::Client::try_from(config(kubeconfig).await?)?)
}

/// The connection settings: the kubeconfig given, else $KUBECONFIG,
/// ~/.kube/config, or the pod's own.
pub async fn config(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("finding a kubeconfig or in-cluster config")?,
    })
}

/// Who tenants' policies act as, from the flags; `impersonating`: whom the
/// operator's own credentials already impersonate, if anyone.
fn tenancy(
    args: &RunArgs,
    impersonating: Option<&str>,
) -> runbook_operator::runtime::TenancyConfig {
    runbook_operator::runtime::TenancyConfig {
        service_account: args.tenant_service_account.clone(),
        overrides: args.tenant_service_accounts.iter().cloned().collect(),
        pod_bounds: args.tenant_pod_bounds.clone(),
        metric_hosts: args.tenant_metric_hosts.clone(),
        unable: impersonating.map(|user| {
            format!(
                "the operator's own credentials impersonate {user:?} (the kubeconfig's `as:`), and a request can impersonate one identity only: run the operator with credentials of its own"
            )
        }),
    }
}

/// Whether the operator namespace exists (it holds the Lease and the
/// policy ConfigMaps), waiting out an API server that is not there yet;
/// `None` when told to stop meanwhile.
async fn operator_namespace_exists(
    args: &RunArgs,
    client: &kube::Client,
    waiting: &health::Waiting,
) -> Option<bool> {
    let ns = &args.operator_namespace;
    let what = format!("looking up the operator namespace {ns}");
    tokio::select! {
        found = health::patiently(waiting, &what, || async {
            match kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                .get_opt(ns)
                .await
            {
                Ok(n) => Ok(n.is_some()),
                // Least privilege need not allow reading namespaces: then
                // the Lease will tell.
                Err(kube::Error::Api(s)) if s.code == 403 => Ok(true),
                Err(e) => Err(runbook_operator::util::api_error(&e)),
            }
        }) => Some(found),
        _ = super::shutdown_signal() => None,
    }
}

/// Where policy bundles come from.
fn sources_of(args: &RunArgs) -> SourceConfig {
    let policy_namespaces = if args.policy_namespaces.is_empty() {
        vec![args.operator_namespace.clone()]
    } else {
        args.policy_namespaces.clone()
    };
    SourceConfig {
        dirs: args.policy_dirs.clone(),
        configmap_namespaces: if args.policy_configmaps {
            policy_namespaces
        } else {
            Vec::new()
        },
        admission: args.policy_webhook,
    }
}

/// Every bundle at start-up: the directories, then the ConfigMaps (an API
/// server that is not there yet is waited for); `None` when told to stop.
async fn initial_bundles(
    client: &kube::Client,
    sources: &SourceConfig,
    waiting: &health::Waiting,
) -> Option<Vec<runbook_core::policy::Bundle>> {
    let mut bundles = Reloader::read_dirs(&sources.dirs);
    for ns in &sources.configmap_namespaces {
        let what = format!("reading the policy ConfigMaps in {ns}");
        let read = health::patiently(waiting, &what, || async {
            runbook_operator::reload::sources::configmap_bundles(client, ns)
                .await
                .map_err(|e| runbook_operator::util::api_error(&e))
        });
        tokio::select! {
            found = read => bundles.extend(found),
            _ = super::shutdown_signal() => return None,
        }
    }
    Some(bundles)
}

/// The namespace reconciled (`None`: every namespace).
fn watched(args: &RunArgs) -> Option<String> {
    if args.all_namespaces {
        None
    } else {
        args.namespace.clone()
    }
}

/// The start-up permission check: every permission the policies need, or
/// an error naming the first one missing.
async fn check_access(
    args: &RunArgs,
    client: &kube::Client,
    set: &runbook_core::policy::PolicySet,
    sources: &SourceConfig,
) -> anyhow::Result<()> {
    let watched = watched(args);
    let opts = runbook_operator::rbac::Options {
        namespace: args.operator_namespace.clone(),
        watch_namespaces: watched.iter().cloned().collect(),
        policy_namespaces: sources.configmap_namespaces.clone(),
        policy_configmaps: args.policy_configmaps,
        webhook: args.hook.objects(),
        shards: args.shards,
        ..Default::default()
    };
    // A tenant's policies are checked as their bundles load, with their
    // account's rights: they never stop the operator from starting.
    let mut set = set.clone();
    set.policies.retain(|_, p| p.tenant.is_none());
    match access::missing_for(client, &set, &opts, watched.as_deref()).await {
        Ok(missing) if missing.is_empty() => {
            tracing::info!("the service account holds every permission the policies need")
        }
        Ok(missing) => {
            let lines = access::by_resource(&missing);
            for m in &lines {
                tracing::error!("missing permission: {m}");
            }
            anyhow::bail!(
                "missing permissions on {} resource(s) the policies need, first: {}; grant them with the output of `runbook rbac` (or start with --skip-access-check)",
                lines.len(),
                lines[0]
            );
        }
        Err(e) => tracing::warn!(
            "could not check permissions (SelfSubjectAccessReview): {}",
            runbook_operator::util::api_error(&e)
        ),
    }
    Ok(())
}

/// The authorship webhook's settings, unless it is off.
fn webhook_config(args: &RunArgs) -> Option<runbook_operator::runtime::WebhookConfig> {
    use runbook_operator::admission::config::Endpoint;
    args.hook
        .webhook
        .then(|| runbook_operator::runtime::WebhookConfig {
            listen: args.webhook_addr,
            endpoint: Some(match &args.webhook_url {
                Some(url) => Endpoint::Url(url.clone()),
                None => Endpoint::Service {
                    namespace: args.operator_namespace.clone(),
                    name: args.webhook_service.clone(),
                    port: 443,
                },
            }),
            configuration: args.hook.webhook_configuration.clone(),
            secret: Some((
                args.operator_namespace.clone(),
                args.hook.webhook_secret.clone(),
            )),
            created_with: None,
        })
}

fn operator_config(
    args: &RunArgs,
    tenancy: runbook_operator::runtime::TenancyConfig,
) -> OperatorConfig {
    OperatorConfig {
        tenancy,
        fair: runbook_operator::runtime::fair::FairConfig {
            concurrency: args.policy_concurrency,
            cpu_per_second: Duration::from_millis(args.policy_cpu_budget_ms),
            scripts_at_once: 0,
        },
        webhook: webhook_config(args),
        operator_namespace: args.operator_namespace.clone(),
        namespace: watched(args),
        concurrency: args.concurrency,
        identity: identity(args),
        lease: args.leader_elect.then(|| LeaseConfig {
            namespace: args.operator_namespace.clone(),
            name: args.lease_name.clone(),
            identity: identity(args),
            duration: Duration::from_secs(args.lease_duration),
            renew_every: Duration::from_secs(args.lease_duration) / 5,
        }),
        check_skips: args.check_skips,
        shards: args.shards,
        shard_replicas: args.shard_replicas,
        ..Default::default()
    }
}

/// The alert dispatcher, its notification log in the operator namespace.
fn dispatcher(args: &RunArgs, client: &kube::Client, metrics: &Arc<Metrics>) -> Arc<Dispatcher> {
    let delivery = Delivery::new(
        Some(client.clone()),
        metrics.clone(),
        &identity(args),
        DeliveryConfig {
            queue_capacity: args.alert_queue_capacity,
            max_attempts: args.alert_max_attempts,
            secret_namespace: args.operator_namespace.clone(),
            ..Default::default()
        },
    );
    let log =
        runbook_operator::alert::nflog::ConfigMapLog::new(client.clone(), &args.operator_namespace);
    Arc::new(Dispatcher::new(Arc::new(delivery), Clock::real()).with_store(Arc::new(log)))
}

/// Where the operator's alerts go: its own dispatcher, flushed by the
/// task returned; sharded, published for the replica that notifies for
/// all (`alert::shared`), which makes its dispatcher when it is that one.
fn alert_sink(
    args: &RunArgs,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
) -> (
    Arc<dyn runbook_core::alert::AlertSink>,
    Option<tokio::task::JoinHandle<()>>,
) {
    if !args.shards {
        let dispatcher = dispatcher(args, client, metrics);
        let flusher = dispatcher.spawn();
        return (dispatcher, Some(flusher));
    }
    let ring = runbook_operator::alert::shared::Ring {
        namespace: args.operator_namespace.clone(),
        name: args.lease_name.clone(),
        identity: identity(args),
        duration: Duration::from_secs(args.lease_duration),
    };
    let (args, made_with, m) = (args.clone(), client.clone(), metrics.clone());
    let make = move || dispatcher(&args, &made_with, &m);
    let shared = runbook_operator::alert::shared::SharedAlerts::new(client.clone(), &ring, make);
    (Arc::new(shared), None)
}

/// `/readyz` and `/shadow` before the operator exists: not ready, saying
/// what start-up waits for; the operator's own once it is built.
#[derive(Clone, Default)]
struct Probes {
    startup: Arc<health::Waiting>,
    ready: Arc<std::sync::OnceLock<telemetry::Readiness>>,
    shadow: Arc<std::sync::OnceLock<telemetry::ShadowLog>>,
}

impl Probes {
    fn readiness(&self) -> telemetry::Readiness {
        let me = self.clone();
        Arc::new(move || match me.ready.get() {
            Some(ready) => ready(),
            None => Err(me.startup.not_ready("loading policies")),
        })
    }

    fn shadow(&self) -> telemetry::ShadowLog {
        let me = self.clone();
        Arc::new(move || match me.shadow.get() {
            Some(shadow) => shadow(),
            None => "[]".into(),
        })
    }
}

/// Check that the policy directories are directories and (where the
/// operator keeps a Lease or reads policy ConfigMaps) that its namespace
/// exists; `false`: stopped while waiting for the API server.
async fn where_policies_live(
    args: &RunArgs,
    client: &kube::Client,
    probes: &Probes,
) -> anyhow::Result<bool> {
    for dir in &args.policy_dirs {
        anyhow::ensure!(
            dir.is_dir(),
            "--policy-dir {}: not a directory",
            dir.display()
        );
    }
    if args.leader_elect || args.policy_configmaps {
        let ns = &args.operator_namespace;
        let Some(found) = operator_namespace_exists(args, client, &probes.startup).await else {
            return Ok(false);
        };
        anyhow::ensure!(
            found,
            "the operator namespace {ns:?} does not exist (it holds the leader Lease and the policy ConfigMaps): create it with `kubectl create namespace {ns}`, name another with --operator-namespace, or start with --leader-elect=false --policy-configmaps=false"
        );
    }
    Ok(true)
}

/// What the flags of leader election and sharding must hold together.
fn check_leases(args: &RunArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.leader_elect || args.lease_duration >= 2,
        "--lease-duration {}: a Lease must last at least 2 s (it is renewed every fifth of it)",
        args.lease_duration
    );
    if args.shards {
        anyhow::ensure!(
            args.leader_elect,
            "--shards needs leader election (--leader-elect=true): replicas share targets through Leases"
        );
        let id = identity(args);
        if let Err(why) = runbook_operator::runtime::shard::shard_identity(&id) {
            anyhow::bail!("--shards: {why}; give --identity");
        }
    }
    Ok(())
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    init_logging(args.log_format);
    check_leases(&args)?;
    // Health is served from the first moment: live while start-up waits
    // (for an API server, for ConfigMaps it may not read yet), not ready
    // until the operator is, with the reason.
    let metrics = Arc::new(Metrics::new());
    metrics.set_build(env!("CARGO_PKG_VERSION"), env!("RUNBOOK_COMMIT"));
    let probes = Probes::default();
    let (addr, _server) = telemetry::serve(
        args.metrics_addr,
        metrics.clone(),
        probes.readiness(),
        probes.shadow(),
    )
    .await
    .with_context(|| format!("serving metrics on {}", args.metrics_addr))?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz and /shadow");
    let config = config(args.kubeconfig.as_ref()).await?;
    let tenancy = tenancy(&args, config.auth_info.impersonate.as_deref());
    let client = kube::Client::try_from(config)?;
    let engine = Arc::new(ScriptEngine::new(ScriptLimits {
        wall_time: Duration::from_millis(args.script_timeout_ms),
        ..Default::default()
    }));
    if !where_policies_live(&args, &client, &probes).await? {
        return Ok(ExitCode::SUCCESS);
    }
    let sources = sources_of(&args);
    let reloader = Arc::new(
        Reloader::new(
            engine.clone(),
            Some(client.clone()),
            metrics.clone(),
            &identity(&args),
        )
        .with_secret_namespace(&args.operator_namespace)
        .with_dangerous_kinds(args.allow_dangerous_kinds)
        .with_other_namespaces(args.allow_other_namespaces)
        .with_access_check(!args.skip_access_check)
        .with_tenancy(tenancy.clone()),
    );
    let Some(bundles) = initial_bundles(&client, &sources, &probes.startup).await else {
        return Ok(ExitCode::SUCCESS);
    };
    let (set, errors) = reloader.initial(bundles).await;
    if set.policies.is_empty() {
        tracing::warn!(
            errors = errors.len(),
            "no policy loaded yet; waiting for policy ConfigMaps in {:?} or files in {:?}",
            sources.configmap_namespaces,
            sources.dirs
        );
    }
    if !args.skip_access_check {
        check_access(&args, &client, &set, &sources).await?;
    }
    let (alerts, _flusher) = alert_sink(&args, &client, &metrics);
    let op = Arc::new(Operator::new(
        client,
        engine,
        set,
        Clock::real(),
        alerts,
        metrics.clone(),
        operator_config(&args, tenancy),
    ));
    let shadow_ctx = op.ctx.clone();
    let _ = probes.shadow.set(Arc::new(move || {
        serde_json::to_string_pretty(&shadow_ctx.shadow_records()).unwrap_or_default()
    }));
    let _ = probes.ready.set(reload::readiness(&op, &reloader));
    serve(&args, op, reloader, sources).await
}

/// Start (once leading), reconcile while leading (standing by whenever
/// the Lease is lost), then shut down within the grace period.
async fn serve(
    args: &RunArgs,
    op: Arc<Operator>,
    reloader: Arc<Reloader>,
    sources: SourceConfig,
) -> anyhow::Result<ExitCode> {
    let grace = Duration::from_secs(args.shutdown_grace);
    // Every replica follows policy edits once its caches are filled, the
    // standbys too: each checks policies at admission, and a standby
    // takes the lead on the set in force.
    let watchers = {
        let (op, reloader) = (op.clone(), reloader.clone());
        tokio::spawn(async move {
            while !op
                .ctx
                .health
                .synced
                .load(std::sync::atomic::Ordering::Acquire)
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            reload::spawn(reloader, op, sources)
        })
    };
    tokio::select! {
        r = op.start() => r.map_err(|e| anyhow::anyhow!("{e}"))?,
        _ = super::shutdown_signal() => {
            op.shutdown(grace).await;
            return Ok(ExitCode::SUCCESS);
        }
    }
    let _watchers = watchers.await;
    tracing::info!("reconciling");
    tokio::select! {
        _ = super::shutdown_signal() => {}
        _ = op.follow_leadership() => {}
    }
    op.shutdown(grace).await;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}
