//! `runbook rbac PATH...`: the ClusterRole, Roles and bindings that exactly
//! the given policies need.

use std::path::PathBuf;
use std::process::ExitCode;

use runbook_operator::rbac::{self, Options};

#[derive(clap::Args, Debug)]
pub struct RbacArgs {
    /// Policy directories (searched recursively) or files. CRDs found
    /// among them give the exact resource names of their kinds.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The operator's namespace (its ServiceAccount, Lease and policy
    /// ConfigMaps), as `runbook run --operator-namespace`.
    #[arg(
        long = "operator-namespace",
        default_value = "runbook-system",
        env = "RUNBOOK_RBAC_NAMESPACE"
    )]
    pub namespace: String,
    /// The operator's ServiceAccount.
    #[arg(long, default_value = "runbook", env = "RUNBOOK_RBAC_SERVICE_ACCOUNT")]
    pub service_account: String,
    /// Name of the roles and bindings.
    #[arg(long, default_value = "runbook", env = "RUNBOOK_RBAC_NAME")]
    pub name: String,
    /// Namespaces the operator reconciles (repeat; default: all, with a
    /// ClusterRole), as `runbook run --namespace`.
    #[arg(
        long = "watch-namespace",
        short = 'n',
        visible_alias = "namespace",
        env = "RUNBOOK_RBAC_WATCH_NAMESPACES",
        value_delimiter = ','
    )]
    pub watch_namespaces: Vec<String>,
    /// Namespaces whose labelled ConfigMaps are policy bundles (default: the operator's).
    #[arg(
        long = "policy-namespace",
        env = "RUNBOOK_RBAC_POLICY_NAMESPACES",
        value_delimiter = ','
    )]
    pub policy_namespaces: Vec<String>,
    /// Grant what dangerous kinds need (Secrets, RBAC objects, wildcards, ...)
    /// instead of refusing the policies that declare them.
    #[arg(long, env = "RUNBOOK_ALLOW_DANGEROUS_KINDS")]
    pub allow_dangerous_kinds: bool,
    /// Grant what policies that make children in other namespaces need
    /// (`spec.namespaces`: their owned kinds in every namespace) instead
    /// of refusing them.
    #[arg(long, env = "RUNBOOK_ALLOW_OTHER_NAMESPACES")]
    pub allow_other_namespaces: bool,
    /// The policies are a tenant's, loaded from ConfigMaps in this
    /// namespace: print the Role its account needs there (what the
    /// policies read and write, as that account), then the Role the
    /// operator needs there (to act as the account, to watch what the
    /// policies read, to read the policy ConfigMaps), and nothing
    /// cluster-wide.
    #[arg(long, env = "RUNBOOK_RBAC_TENANT")]
    pub tenant: Option<String>,
    /// The ServiceAccount a tenant's policies act as (`runbook run
    /// --tenant-service-account`, or its override for the namespace).
    #[arg(
        long,
        env = "RUNBOOK_TENANT_SERVICE_ACCOUNT",
        default_value = runbook_operator::runtime::tenants::DEFAULT_ACCOUNT
    )]
    pub tenant_service_account: String,
    /// Grant what replicas sharing the targets need (`runbook run
    /// --shards`): patching targets' labels, listing the replicas'
    /// Leases, their published alerts.
    #[arg(long, env = "RUNBOOK_SHARDS")]
    pub shards: bool,
    #[command(flatten)]
    pub webhook: WebhookObjectsArgs,
}

/// The authorship webhook's objects, as `runbook run` keeps them and
/// `runbook rbac` grants them.
#[derive(clap::Args, Clone, Debug)]
pub struct WebhookObjectsArgs {
    /// Whether the operator serves the authorship webhook, which records
    /// who wrote each target (`runbook run` serves it; `runbook rbac`
    /// grants what it needs: its Secret, its configuration and
    /// SubjectAccessReviews). Without it no target has an author, and
    /// nothing a target refers to is acted on unless its owner allows it
    /// (see docs/security.md).
    #[arg(long, env = "RUNBOOK_WEBHOOK", default_value_t = true, action = clap::ArgAction::Set)]
    pub webhook: bool,
    /// The MutatingWebhookConfiguration kept in step (its CA bundle, its
    /// rules for the policies' target kinds).
    #[arg(long, env = "RUNBOOK_WEBHOOK_CONFIGURATION", default_value = "runbook")]
    pub webhook_configuration: String,
    /// The Secret in the operator namespace holding the webhook's CA,
    /// certificate and signing key, shared by the replicas.
    #[arg(
        long,
        env = "RUNBOOK_WEBHOOK_SECRET",
        default_value = "runbook-webhook-tls"
    )]
    pub webhook_secret: String,
}

impl WebhookObjectsArgs {
    /// The objects, unless the webhook is off.
    pub fn objects(&self) -> Option<rbac::WebhookObjects> {
        self.webhook.then(|| rbac::WebhookObjects {
            configuration: self.webhook_configuration.clone(),
            secret: self.webhook_secret.clone(),
        })
    }
}

pub fn run(args: RbacArgs) -> anyhow::Result<ExitCode> {
    let (set, errors, _, bundles) = super::check::load_paths(&args.paths)?;
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{e}");
        }
        eprintln!(
            "{} errors: fix them (runbook check) before deriving RBAC",
            errors.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    let dangers = rbac::dangers(&set);
    if !dangers.is_empty() && !args.allow_dangerous_kinds {
        for d in &dangers {
            eprintln!("refused: {d}");
        }
        eprintln!(
            "these policies would make the operator cluster-admin in all but name; \
             pass --allow-dangerous-kinds to grant it anyway"
        );
        return Ok(ExitCode::FAILURE);
    }
    let elsewhere: Vec<&str> = set
        .policies
        .values()
        .filter(|p| p.namespaces.is_some())
        .map(|p| p.name.as_str())
        .collect();
    if !elsewhere.is_empty() && !args.allow_other_namespaces {
        for p in &elsewhere {
            eprintln!(
                "refused: policy {p}: spec.namespaces: it makes children in other namespaces than its targets'"
            );
        }
        eprintln!(
            "these policies need their owned kinds written in every namespace; \
             pass --allow-other-namespaces to grant it (and start the operator with it)"
        );
        return Ok(ExitCode::FAILURE);
    }
    let opts = Options {
        name: args.name,
        namespace: args.namespace,
        service_account: args.service_account,
        watch_namespaces: args.watch_namespaces,
        policy_namespaces: args.policy_namespaces,
        policy_configmaps: true,
        tenant: args.tenant,
        tenant_account: args.tenant_service_account,
        webhook: args.webhook.objects(),
        shards: args.shards,
    };
    let elsewhere = rbac::secrets_elsewhere(&set, &opts);
    if let Some(t) = &opts.tenant
        && !elsewhere.is_empty()
    {
        for e in &elsewhere {
            eprintln!("refused: {e}");
        }
        eprintln!(
            "a tenant's policies read Secrets only in their own namespace ({t}); the operator refuses these routes when it loads them from there"
        );
        return Ok(ExitCode::FAILURE);
    }
    for e in &elsewhere {
        eprintln!(
            "warning: {e}: the operator is granted `get` on it; make sure that Secret is meant for Runbook"
        );
    }
    let crds = rbac::crd_plurals(&super::check::crd_docs(&bundles));
    for guess in rbac::guesses(&set, &crds) {
        eprintln!("note: {guess}");
    }
    print!("{}", rbac::render(&rbac::needs(&set, &opts, &crds), &opts));
    Ok(ExitCode::SUCCESS)
}
