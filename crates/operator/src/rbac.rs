//! Least privilege from policies: every kind a policy touches is declared
//! (target, owns, reads, mutates), so the exact RBAC the operator needs can
//! be derived from them, and kinds that would make it cluster-admin in
//! all but name are refused.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::ObjectMeta;
use serde_json::Value;

use runbook_core::alert::routes::{ReceiverKind, Target};
use runbook_core::kinds::{KindRef, Role as KindRole};
use runbook_core::policy::PolicySet;

const READ: &[&str] = &["get", "list", "watch"];

/// The ServiceAccount a tenant's policies act as, unless told otherwise.
pub const DEFAULT_TENANT_ACCOUNT: &str = "runbook-tenant";
const WRITE: &[&str] = &["create", "delete", "patch", "update"];

/// Where a permission is needed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The namespaces the operator reconciles (every namespace when it
    /// watches them all).
    Watched,
    /// Cluster-scoped resources.
    Cluster,
    /// One namespace: the operator's own (leases, policy ConfigMaps) or
    /// where alert Secrets live.
    Namespace(String),
}

/// Whose a permission is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Who {
    /// The operator's own ServiceAccount.
    #[default]
    Operator,
    /// The ServiceAccount a tenant's policies act as, in its namespace.
    Tenant,
}

/// One permission: verbs on a resource, and why it is needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    pub who: Who,
    pub scope: Scope,
    pub group: String,
    /// A plural, or `plural/subresource`.
    pub resource: String,
    pub verbs: BTreeSet<String>,
    /// Only these objects (empty: any).
    pub names: BTreeSet<String>,
    pub why: BTreeSet<String>,
}

impl Need {
    /// `list jobs.batch` as `kubectl auth can-i` spells it.
    pub fn describe(&self, verb: &str) -> String {
        let res = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        let names = if self.names.is_empty() {
            String::new()
        } else {
            format!(
                " named {}",
                self.names.iter().cloned().collect::<Vec<_>>().join(",")
            )
        };
        format!("{verb} {res}{names}")
    }
}

/// How the operator is deployed, which decides where roles go.
#[derive(Clone, Debug)]
pub struct Options {
    /// The name of the roles and bindings.
    pub name: String,
    /// The operator's namespace: its ServiceAccount, Lease and policy
    /// ConfigMaps live there.
    pub namespace: String,
    pub service_account: String,
    /// The namespaces it reconciles; empty for all.
    pub watch_namespaces: Vec<String>,
    /// Namespaces whose labelled ConfigMaps are policy bundles (default:
    /// the operator's).
    pub policy_namespaces: Vec<String>,
    /// Whether policies come from ConfigMaps at all (`--policy-configmaps`).
    pub policy_configmaps: bool,
    /// The policies are a tenant's, loaded from ConfigMaps in this
    /// namespace: they act only there, as the tenant's account, which
    /// needs a Role there; the operator needs one there too, to act as
    /// that account and to watch what the policies read (its other needs
    /// come with the cluster-wide policies).
    pub tenant: Option<String>,
    /// The ServiceAccount a tenant's policies act as (`runbook run
    /// --tenant-service-account`).
    pub tenant_account: String,
    /// The authorship webhook's objects, when the operator serves it
    /// (`runbook run --webhook`, the default).
    pub webhook: Option<WebhookObjects>,
    /// Replicas share the targets (`--shards`): they label targets for
    /// their places, list each other's Leases and publish their alerts.
    pub shards: bool,
}

/// What the operator keeps of its authorship webhook. Both are shipped in
/// `deploy/` (the Secret empty), so the operator is granted only `get` and
/// `update` on them by name, never `create` (which RBAC cannot limit to a
/// name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookObjects {
    /// Its MutatingWebhookConfiguration.
    pub configuration: String,
    /// The Secret in the operator's namespace holding its CA, certificate
    /// and signing key.
    pub secret: String,
}

impl Default for WebhookObjects {
    fn default() -> Self {
        Self {
            configuration: "runbook".into(),
            secret: "runbook-webhook-tls".into(),
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            name: "runbook".into(),
            namespace: "runbook-system".into(),
            service_account: "runbook".into(),
            watch_namespaces: Vec::new(),
            policy_namespaces: Vec::new(),
            policy_configmaps: true,
            tenant: None,
            tenant_account: DEFAULT_TENANT_ACCOUNT.into(),
            webhook: Some(WebhookObjects::default()),
            shards: false,
        }
    }
}

/// A kind a policy may not touch without an explicit override, and why.
pub fn danger(kind: &KindRef, role: KindRole) -> Option<&'static str> {
    let group = kind.group();
    let writes = matches!(
        role,
        KindRole::Owns | KindRole::Mutates | KindRole::Target | KindRole::Deletes
    );
    if kind.kind == "*" || kind.api_version == "*" || group == "*" {
        return Some("a wildcard kind grants every resource");
    }
    if group == "rbac.authorization.k8s.io" {
        return Some("RBAC objects let the operator grant itself any permission");
    }
    if group.is_empty() && kind.kind == "Secret" {
        return Some(
            "Secrets hold every credential in the namespace; alert receivers name the ones they need",
        );
    }
    if group == "admissionregistration.k8s.io" {
        return Some("admission webhooks see and can change every request to the API server");
    }
    if group == "certificates.k8s.io" {
        return Some("certificate signing requests can mint cluster credentials");
    }
    if writes && group == "apiextensions.k8s.io" {
        return Some("writing CustomResourceDefinitions changes the API every client sees");
    }
    if writes && group.is_empty() && matches!(kind.kind.as_str(), "Node" | "Namespace") {
        return Some("writing Nodes or Namespaces is cluster administration");
    }
    if writes && group.is_empty() && kind.kind == "ServiceAccount" {
        return Some("ServiceAccounts can be used to mint tokens for other identities");
    }
    None
}

/// Every dangerous kind the policies declare: `policy P: owns v1 Secret: why`.
pub fn dangers(set: &PolicySet) -> Vec<String> {
    dangers_of(set.policies.values().map(|p| &**p))
}

/// [`dangers`] over any policies.
pub fn dangers_of<'a>(
    policies: impl Iterator<Item = &'a runbook_core::policy::CompiledPolicy>,
) -> Vec<String> {
    let mut out = Vec::new();
    for p in policies {
        for role in KindRole::ALL {
            for k in p.kinds.with_role(role) {
                // Read by name only: granted on those objects alone.
                if role == KindRole::Reads && p.names_read(k).is_some() {
                    continue;
                }
                // A built-in target is written only for its finalizer
                // (its state is kept apart, in a RunbookState).
                let judged = match role {
                    KindRole::Target if runbook_core::kinds::built_in(k) && !p.has_finalizer() => {
                        KindRole::Reads
                    }
                    r => r,
                };
                if let Some(why) = danger(k, judged) {
                    out.push(format!(
                        "policy {} ({}): {} {k}: {why}",
                        p.name,
                        p.file,
                        role.as_str()
                    ));
                }
            }
        }
    }
    out
}

fn resource_of(
    kind: &KindRef,
    crd_plurals: &BTreeMap<(String, String), (String, bool)>,
) -> (String, bool) {
    crd_plurals
        .get(&(kind.group().to_string(), kind.kind.clone()))
        .cloned()
        .unwrap_or_else(|| (kind.plural(), kind.namespaced()))
}

/// The plural and scope of each kind the given CRDs define, so kinds
/// users add (their own CRDs beside their policies) get exact names.
pub fn crd_plurals(docs: &[Value]) -> BTreeMap<(String, String), (String, bool)> {
    let mut out = BTreeMap::new();
    for d in docs {
        if d["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let spec = &d["spec"];
        if let (Some(g), Some(k), Some(p)) = (
            spec["group"].as_str(),
            spec["names"]["kind"].as_str(),
            spec["names"]["plural"].as_str(),
        ) {
            out.insert(
                (g.to_string(), k.to_string()),
                (p.to_string(), spec["scope"] != "Cluster"),
            );
        }
    }
    out
}

/// The kinds these policies declare whose resource name is a guess: not
/// built into Kubernetes and defined by none of the given CRDs. Each note
/// names the policy, the kind, and what was assumed.
pub fn guesses(set: &PolicySet, crds: &BTreeMap<(String, String), (String, bool)>) -> Vec<String> {
    let mut out = Vec::new();
    for p in set.policies.values() {
        for k in p.kinds.kinds() {
            let known = runbook_core::kinds::well_known(k.group(), &k.kind).is_some()
                || crds.contains_key(&(k.group().to_string(), k.kind.clone()));
            if known {
                continue;
            }
            let note = format!(
                "{k} (policy {}): no CRD for it among the paths, so its resource is taken to be \
                 `{}`, namespaced; put its CRD file among the paths if it names another plural \
                 or is cluster-scoped",
                p.name,
                k.plural()
            );
            if !out.contains(&note) {
                out.push(note);
            }
        }
    }
    out
}

/// Every Secret alert receivers read outside the namespace they belong
/// in (the tenant's, else the operator's), as `receiver R of routes X
/// reads Secret NS/NAME`: a Secret of another team that the operator
/// would be granted, worth a second look (and, for a tenant, refused).
pub fn secrets_elsewhere(set: &PolicySet, opts: &Options) -> Vec<String> {
    let home = opts.tenant.as_deref().unwrap_or(&opts.namespace);
    let mut out = Vec::new();
    for routes in set.routes.values() {
        for (rname, receiver) in &routes.receivers {
            for url in receiver.kinds.iter().flat_map(ReceiverKind::targets) {
                let Target::Secret { key, .. } = url else {
                    continue;
                };
                let ns = key
                    .namespace
                    .as_deref()
                    .or(routes.secret_namespace.as_deref())
                    .unwrap_or(home);
                if ns != home {
                    out.push(format!(
                        "receiver {rname} of AlertRoutes {} ({}) reads Secret {ns}/{}, outside {home}",
                        routes.name, routes.file, key.name
                    ));
                }
            }
        }
    }
    out
}

/// Needs as they are found, the same (whose, scope, group, resource,
/// names) merged into one; each is `who`'s.
#[derive(Default)]
struct Needs {
    found: Vec<Need>,
    who: Who,
}

impl Needs {
    fn add(
        &mut self,
        scope: Scope,
        group: &str,
        resource: &str,
        verbs: &[&str],
        names: &[String],
        why: String,
    ) {
        let who = self.who;
        let same = |n: &&mut Need| {
            n.who == who
                && n.scope == scope
                && n.group == group
                && n.resource == resource
                && n.names.iter().cloned().collect::<Vec<_>>() == names
        };
        if let Some(n) = self.found.iter_mut().find(same) {
            n.verbs.extend(verbs.iter().map(|v| v.to_string()));
            n.why.insert(why);
        } else {
            self.found.push(Need {
                who,
                scope,
                group: group.to_string(),
                resource: resource.to_string(),
                verbs: verbs.iter().map(|v| v.to_string()).collect(),
                names: names.iter().cloned().collect(),
                why: [why].into(),
            });
        }
    }

    /// Every kind a policy declares, by its role: read all; targets get
    /// finalizers and status, owned kinds are written, mutated ones
    /// patched, those in `deletes` deleted.
    /// A tenant's policies see nothing outside their namespace, so they
    /// need nothing of cluster-scoped kinds.
    fn kinds(
        &mut self,
        set: &PolicySet,
        opts: &Options,
        crds: &BTreeMap<(String, String), (String, bool)>,
    ) {
        for p in set.policies.values() {
            for role in KindRole::ALL {
                for k in p.kinds.with_role(role) {
                    let (plural, namespaced) = resource_of(k, crds);
                    // Children made in other namespaces (`spec.namespaces`)
                    // may be in any namespace its selector comes to match.
                    let elsewhere = role == KindRole::Owns && p.namespaces.is_some();
                    let scope = match (&opts.tenant, namespaced) {
                        (Some(_), false) => continue,
                        (Some(t), true) => Scope::Namespace(t.clone()),
                        (None, true) if elsewhere => Scope::Cluster,
                        (None, true) => Scope::Watched,
                        (None, false) => Scope::Cluster,
                    };
                    let why = format!("policy {} {} {k}", p.name, role.as_str());
                    let g = k.group();
                    // Read by name only: get, list and watch of those
                    // objects alone (a list or watch of one name is
                    // authorized by its resourceName).
                    let names: Vec<String> = match (role, p.names_read(k)) {
                        (KindRole::Reads, Some(n)) => n.iter().cloned().collect(),
                        _ => Vec::new(),
                    };
                    self.add(scope.clone(), g, &plural, READ, &names, why.clone());
                    match role {
                        // Finalizers are patched onto targets; status goes
                        // through the status subresource, and only where
                        // the policy writes some: Runbook's own state of a
                        // kind whose schema is not Runbook's is kept
                        // apart (a RunbookState).
                        KindRole::Target => {
                            if opts.shards {
                                let place = format!("{why}: its replica's label (--shards)");
                                self.add(scope.clone(), g, &plural, &["patch"], &[], place);
                            }
                            let target = TargetKind {
                                kind: k,
                                scope: &scope,
                                namespaced,
                                plural: &plural,
                            };
                            self.target_rights(p, target, opts, &why)
                        }
                        KindRole::Owns => self.add(scope, g, &plural, WRITE, &[], why),
                        KindRole::Mutates => {
                            self.add(scope, g, &plural, &["patch", "update"], &[], why)
                        }
                        KindRole::Deletes => self.add(scope, g, &plural, &["delete"], &[], why),
                        KindRole::Reads => {}
                    }
                }
            }
        }
    }

    /// The rights on a policy's target kind beyond reading it: its
    /// finalizers, its status where the policy writes some, and Runbook's
    /// state of it where that is kept apart (a RunbookState in its
    /// namespace; for a cluster-scoped one, in the namespace watched, or
    /// else the operator's).
    fn target_rights(
        &mut self,
        p: &runbook_core::policy::CompiledPolicy,
        target: TargetKind<'_>,
        opts: &Options,
        why: &str,
    ) {
        let TargetKind {
            kind: k,
            scope,
            namespaced,
            plural,
        } = target;
        let g = k.group();
        if p.has_finalizer() {
            self.add(
                scope.clone(),
                g,
                plural,
                &["patch", "update"],
                &[],
                why.to_string(),
            );
        }
        // A built-in kind's status is never written: Runbook's state of
        // it is kept apart.
        let writes_status = !runbook_core::kinds::built_in(k)
            && (runbook_core::kinds::owns_schema(k)
                || !p.status.declared
                || !p.status.fields.is_empty()
                || !p.status.conditions.is_empty());
        if writes_status {
            let status = format!("{plural}/status");
            let verbs = &["get", "patch", "update"];
            self.add(scope.clone(), g, &status, verbs, &[], why.to_string());
        }
        if runbook_core::kinds::owns_schema(k) {
            return;
        }
        let at = match (scope, namespaced) {
            (_, true) | (Scope::Namespace(_), _) => scope.clone(),
            _ => Scope::Namespace(
                opts.watch_namespaces
                    .first()
                    .cloned()
                    .unwrap_or_else(|| opts.namespace.clone()),
            ),
        };
        let states = "Runbook's state of targets whose schema is not Runbook's (RunbookState)";
        self.add(
            at,
            "runbook.dev",
            "runbookstates",
            &["create", "get", "list", "patch", "watch"],
            &[],
            format!("{why}: {states}"),
        );
    }

    /// Events on targets, the leader Lease, and the notification log.
    fn operator(&mut self, set: &PolicySet, opts: &Options) {
        if !set.policies.is_empty() {
            let scope = match &opts.tenant {
                Some(t) => Scope::Namespace(t.clone()),
                None => Scope::Watched,
            };
            for group in ["", "events.k8s.io"] {
                let why = "Events on the objects policies reconcile".to_string();
                self.add(
                    scope.clone(),
                    group,
                    "events",
                    &["create", "patch"],
                    &[],
                    why,
                );
            }
        }
        if opts.tenant.is_some() {
            return;
        }
        if !set.policies.is_empty() || opts.policy_configmaps {
            self.add(
                Scope::Cluster,
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                &["list", "watch"],
                &[],
                "a policy set aside for a kind not served loads when its CRD is installed".into(),
            );
        }
        let own = Scope::Namespace(opts.namespace.clone());
        let lease = ["create", "get", "patch", "update"];
        self.add(
            own.clone(),
            "coordination.k8s.io",
            "leases",
            &lease,
            &[],
            "leader election".into(),
        );
        if opts.shards {
            let why = "the live replicas, by their Leases (--shards)";
            self.add(
                own.clone(),
                "coordination.k8s.io",
                "leases",
                &["list"],
                &[],
                why.into(),
            );
            // Each replica publishes its alerts in its own ConfigMap; the
            // notifying one reads them all and deletes a gone replica's.
            let why = "the replicas' published alerts (--shards)";
            let verbs = ["create", "get", "list", "patch", "delete"];
            self.add(own.clone(), "", "configmaps", &verbs, &[], why.into());
        }
        if !set.routes.is_empty() {
            let why = "the notification log, so alerts are not sent twice across restarts";
            let log = [crate::alert::nflog::CONFIGMAP.to_string()];
            self.add(own.clone(), "", "configmaps", &["create"], &[], why.into());
            self.add(own, "", "configmaps", &["get", "patch"], &log, why.into());
        }
    }

    /// Policy ConfigMaps, and Events on those that fail to load.
    /// The authorship webhook: its certificates, its configuration, and the
    /// SubjectAccessReviews asked for the authors it records.
    fn webhook(&mut self, opts: &Options) {
        let Some(w) = &opts.webhook else {
            return;
        };
        if opts.tenant.is_some() {
            return;
        }
        self.add(
            Scope::Namespace(opts.namespace.clone()),
            "",
            "secrets",
            &["get", "update"],
            std::slice::from_ref(&w.secret),
            "the authorship webhook's CA, certificate and signing key, shared by the replicas"
                .into(),
        );
        self.add(
            Scope::Cluster,
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            &["get", "update"],
            std::slice::from_ref(&w.configuration),
            "the authorship webhook's configuration: its CA bundle and target kinds".into(),
        );
        if opts.policy_configmaps {
            self.add(
                Scope::Cluster,
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
                &["get", "update"],
                std::slice::from_ref(&w.configuration),
                "the policy webhook's configuration: its CA bundle and the namespaces of policy \
                 ConfigMaps"
                    .into(),
            );
        }
        self.add(
            Scope::Cluster,
            "authorization.k8s.io",
            "subjectaccessreviews",
            &["create"],
            &[],
            "asking whether a target's author may do what Runbook would do for them".into(),
        );
    }

    fn policy_sources(&mut self, opts: &Options) {
        let namespaces = if let Some(t) = &opts.tenant {
            vec![t.clone()]
        } else if !opts.policy_configmaps {
            Vec::new()
        } else if opts.policy_namespaces.is_empty() {
            vec![opts.namespace.clone()]
        } else {
            opts.policy_namespaces.clone()
        };
        if opts.tenant.is_none() && namespaces.iter().any(|ns| *ns != opts.namespace) {
            self.add(
                Scope::Cluster,
                "authorization.k8s.io",
                "subjectaccessreviews",
                &["create"],
                &[],
                "asking what the account a tenant's policies act as may do".into(),
            );
        }
        if opts.tenant.is_none() && !namespaces.is_empty() {
            let why = "the last good version of each policy ConfigMap (runbook-last-good.*), loaded at start-up in place of a refused one";
            self.add(
                Scope::Namespace(opts.namespace.clone()),
                "",
                "configmaps",
                &["create", "delete", "get", "patch"],
                &[],
                why.into(),
            );
        }
        for ns in &namespaces {
            let scope = Scope::Namespace(ns.clone());
            let why = "policy bundles (ConfigMaps labelled runbook.dev/policy=true)";
            self.add(scope.clone(), "", "configmaps", READ, &[], why.into());
            for group in ["", "events.k8s.io"] {
                let why = "Events on policy ConfigMaps that fail to load".to_string();
                self.add(
                    scope.clone(),
                    group,
                    "events",
                    &["create", "patch"],
                    &[],
                    why,
                );
            }
        }
    }

    /// Secrets: only those alert receivers name, only to read them.
    fn secrets(&mut self, set: &PolicySet, opts: &Options) {
        let mut secrets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut secret_why: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for routes in set.routes.values() {
            for (rname, receiver) in &routes.receivers {
                for url in receiver.kinds.iter().flat_map(ReceiverKind::targets) {
                    let Target::Secret { key, .. } = url else {
                        continue;
                    };
                    let ns = key
                        .namespace
                        .clone()
                        .or_else(|| routes.secret_namespace.clone())
                        .or_else(|| opts.tenant.clone())
                        .unwrap_or_else(|| opts.namespace.clone());
                    secrets
                        .entry(ns.clone())
                        .or_default()
                        .insert(key.name.clone());
                    let why = format!("alert routes {} receiver {rname}", routes.name);
                    secret_why.entry(ns).or_default().insert(why);
                }
            }
        }
        // What metric inputs read: their addresses and credentials, in
        // the policy's namespace.
        for p in set.policies.values() {
            let ns = p
                .tenant
                .clone()
                .or_else(|| opts.tenant.clone())
                .unwrap_or_else(|| opts.namespace.clone());
            for m in &p.metrics {
                for k in m.key_refs() {
                    let why = format!("policy {} metric {}", p.name, m.name);
                    if k.secret {
                        secrets
                            .entry(ns.clone())
                            .or_default()
                            .insert(k.name.clone());
                        secret_why.entry(ns.clone()).or_default().insert(why);
                    } else {
                        self.add(
                            Scope::Namespace(ns.clone()),
                            "",
                            "configmaps",
                            &["get"],
                            std::slice::from_ref(&k.name),
                            why,
                        );
                    }
                }
            }
        }
        for (ns, names) in secrets {
            let names: Vec<String> = names.into_iter().collect();
            for why in secret_why.remove(&ns).unwrap_or_default() {
                self.add(
                    Scope::Namespace(ns.clone()),
                    "",
                    "secrets",
                    &["get"],
                    &names,
                    why,
                );
            }
        }
    }
}

impl Needs {
    /// What the operator needs in a tenant's namespace for its policies:
    /// to act as the tenant's account, and to watch every namespaced kind
    /// they declare there (and Runbook's state of their targets), since
    /// the decisions read from the operator's caches.
    fn tenant_operator(
        &mut self,
        set: &PolicySet,
        tenant: &str,
        account: &str,
        crds: &BTreeMap<(String, String), (String, bool)>,
    ) {
        let scope = Scope::Namespace(tenant.to_string());
        self.add(
            scope.clone(),
            "",
            "serviceaccounts",
            &["impersonate"],
            &[account.to_string()],
            format!("acting as {account}, which the policies from ConfigMaps in {tenant} act as"),
        );
        for p in set.policies.values() {
            for role in KindRole::ALL {
                for k in p.kinds.with_role(role) {
                    let (plural, namespaced) = resource_of(k, crds);
                    if namespaced {
                        let why =
                            format!("watching what policy {} {} ({k})", p.name, role.as_str());
                        self.add(scope.clone(), k.group(), &plural, READ, &[], why);
                    }
                }
            }
            if !runbook_core::kinds::owns_schema(&p.target) {
                let why = format!(
                    "watching Runbook's state of policy {}'s targets (RunbookState)",
                    p.name
                );
                self.add(
                    scope.clone(),
                    "runbook.dev",
                    "runbookstates",
                    READ,
                    &[],
                    why,
                );
            }
        }
    }
}

/// What running these policies needs: the operator's permissions, and for
/// a tenant's policies (`opts.tenant`) those of the account they act as.
pub fn needs(
    set: &PolicySet,
    opts: &Options,
    crds: &BTreeMap<(String, String), (String, bool)>,
) -> Vec<Need> {
    let mut needs = Needs::default();
    if let Some(tenant) = &opts.tenant {
        // The account: every write and read of the policies, Events on
        // their targets, and the Secrets their receivers name (the
        // operator reads those for them, only where the account may).
        needs.who = Who::Tenant;
        needs.kinds(set, opts, crds);
        needs.operator(set, opts);
        needs.secrets(set, opts);
        needs.who = Who::Operator;
        needs.tenant_operator(set, tenant, &opts.tenant_account, crds);
        needs.policy_sources(opts);
        needs.secrets(set, opts);
        return needs.found;
    }
    needs.kinds(set, opts, crds);
    needs.operator(set, opts);
    needs.policy_sources(opts);
    needs.secrets(set, opts);
    needs.webhook(opts);
    let why = "the start-up permission check".to_string();
    needs.add(
        Scope::Cluster,
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        &["create"],
        &[],
        why,
    );
    needs.found
}

fn rules(needs: &[&Need]) -> Vec<PolicyRule> {
    // One rule per (group, verbs, names), resources merged, all sorted.
    let mut merged: BTreeMap<(String, Vec<String>, Vec<String>), BTreeSet<String>> =
        BTreeMap::new();
    for n in needs {
        merged
            .entry((
                n.group.clone(),
                n.verbs.iter().cloned().collect(),
                n.names.iter().cloned().collect(),
            ))
            .or_default()
            .insert(n.resource.clone());
    }
    merged
        .into_iter()
        .map(|((group, verbs, names), resources)| PolicyRule {
            api_groups: Some(vec![group]),
            resources: Some(resources.into_iter().collect()),
            verbs,
            resource_names: (!names.is_empty()).then_some(names),
            non_resource_urls: None,
        })
        .collect()
}

fn labels() -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name".to_string(), "runbook".to_string()),
        (
            "app.kubernetes.io/component".to_string(),
            "rbac".to_string(),
        ),
    ]
    .into()
}

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: ns.map(str::to_string),
        labels: Some(labels()),
        ..Default::default()
    }
}

/// A role (`ClusterRole` or `Role`) and its binding to `who`'s
/// ServiceAccount, as JSON: the operator's, or (in a tenant's namespace)
/// the account the tenant's policies act as, each under its own name.
fn role_and_binding(opts: &Options, who: Who, ns: Option<&str>, needs: &[&Need]) -> [Value; 2] {
    let (name, subject) = match (who, ns) {
        (Who::Tenant, Some(ns)) => (
            opts.tenant_account.clone(),
            Subject {
                kind: "ServiceAccount".into(),
                name: opts.tenant_account.clone(),
                namespace: Some(ns.to_string()),
                api_group: None,
            },
        ),
        // The operator's own Role in a tenant's namespace has a name of
        // its own: the Role `runbook rbac` grants there for reading the
        // policy ConfigMaps keeps `opts.name`.
        (Who::Operator, Some(_)) if opts.tenant.is_some() => (
            format!("{}-for-tenant", opts.name),
            Subject {
                kind: "ServiceAccount".into(),
                name: opts.service_account.clone(),
                namespace: Some(opts.namespace.clone()),
                api_group: None,
            },
        ),
        _ => (
            opts.name.clone(),
            Subject {
                kind: "ServiceAccount".into(),
                name: opts.service_account.clone(),
                namespace: Some(opts.namespace.clone()),
                api_group: None,
            },
        ),
    };
    let kind = if ns.is_some() { "Role" } else { "ClusterRole" };
    let role_ref = RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: name.clone(),
    };
    let metadata = meta(&name, ns);
    let rules = Some(rules(needs));
    let (role, binding) = match ns {
        None => (
            serde_json::to_value(ClusterRole {
                metadata: metadata.clone(),
                rules,
                aggregation_rule: None,
            }),
            serde_json::to_value(ClusterRoleBinding {
                metadata,
                role_ref,
                subjects: Some(vec![subject]),
            }),
        ),
        Some(_) => (
            serde_json::to_value(Role {
                metadata: metadata.clone(),
                rules,
            }),
            serde_json::to_value(RoleBinding {
                metadata,
                role_ref,
                subjects: Some(vec![subject]),
            }),
        ),
    };
    [role.unwrap_or_default(), binding.unwrap_or_default()]
}

/// The ClusterRole, Roles and bindings, as one YAML stream.
pub fn render(needs: &[Need], opts: &Options) -> String {
    let all_namespaces = opts.watch_namespaces.is_empty();
    // Cluster-wide: cluster-scoped kinds, and watched ones when every
    // namespace is watched.
    let cluster: Vec<&Need> = needs
        .iter()
        .filter(|n| n.scope == Scope::Cluster || (all_namespaces && n.scope == Scope::Watched))
        .collect();
    // A tenant's rights are Roles in its namespace (the account's, and
    // the operator's there), nothing more.
    let mut docs: Vec<Value> = if opts.tenant.is_some() && cluster.is_empty() {
        Vec::new()
    } else {
        role_and_binding(opts, Who::Operator, None, &cluster).into()
    };
    let mut per_ns: BTreeMap<(Who, String), Vec<&Need>> = BTreeMap::new();
    for n in needs {
        match &n.scope {
            Scope::Namespace(ns) => per_ns.entry((n.who, ns.clone())).or_default().push(n),
            Scope::Watched if !all_namespaces => {
                for ns in &opts.watch_namespaces {
                    per_ns.entry((n.who, ns.clone())).or_default().push(n);
                }
            }
            _ => {}
        }
    }
    // The tenant's account first: what a tenant's administrator grants.
    let mut per_ns: Vec<_> = per_ns.into_iter().collect();
    per_ns.sort_by_key(|((who, ns), _)| (*who != Who::Tenant, ns.clone()));
    for ((who, ns), ns_needs) in per_ns {
        docs.extend(role_and_binding(opts, who, Some(&ns), &ns_needs));
    }
    let mut out =
        String::from("# Generated by `runbook rbac`: exactly the permissions the policies need.\n");
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        // Keys come out sorted, which puts apiVersion and kind first.
        out.push_str(&runbook_core::util::yaml::to_string(d));
    }
    out
}

/// A policy's target kind, where its rights are granted.
#[derive(Clone, Copy)]
struct TargetKind<'a> {
    kind: &'a KindRef,
    /// Where the rights hold.
    scope: &'a Scope,
    /// The kind is namespaced.
    namespaced: bool,
    plural: &'a str,
}
