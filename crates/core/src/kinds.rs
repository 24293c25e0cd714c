//! Naming kinds: `apiVersion` + `kind` as policies write them, and the
//! REST names (group, version, plural) the API server serves them under.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A kind as a policy names it: `{apiVersion: batch/v1, kind: Job}`.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KindRef {
    /// The kind's API group and version, such as `batch/v1` (`v1` for the core group).
    pub api_version: String,
    /// The kind, as the API server spells it (`Job`, `StatefulSet`).
    pub kind: String,
}

impl KindRef {
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }

    /// API group; empty for the core group.
    pub fn group(&self) -> &str {
        match self.api_version.split_once('/') {
            Some((g, _)) => g,
            None => "",
        }
    }

    pub fn version(&self) -> &str {
        match self.api_version.split_once('/') {
            Some((_, v)) => v,
            None => &self.api_version,
        }
    }

    /// The lowercase plural resource name, from the table of well-known
    /// kinds or by the API server's default rule.
    pub fn plural(&self) -> String {
        well_known(self.group(), &self.kind)
            .map(|w| w.plural.to_string())
            .unwrap_or_else(|| default_plural(&self.kind))
    }

    /// Whether objects of this kind live in namespaces. Unknown kinds are
    /// taken to be namespaced; discovery corrects this at run time.
    pub fn namespaced(&self) -> bool {
        well_known(self.group(), &self.kind)
            .map(|w| w.namespaced)
            .unwrap_or(true)
    }

    /// Whether an object's `apiVersion` and `kind` fields name this kind.
    pub fn matches(&self, obj: &serde_json::Value) -> bool {
        obj.get("kind").and_then(|k| k.as_str()) == Some(self.kind.as_str())
            && obj.get("apiVersion").and_then(|k| k.as_str()) == Some(self.api_version.as_str())
    }

    /// `kube`'s API resource description for dynamic clients.
    pub fn api_resource(&self) -> kube_core::ApiResource {
        kube_core::ApiResource {
            group: self.group().to_string(),
            version: self.version().to_string(),
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            plural: self.plural(),
        }
    }
}

impl fmt::Display for KindRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.api_version, self.kind)
    }
}

/// A kind as an action names it: fully (`batch/v1` + `Job`) or by `Job`
/// alone, resolved against the policy's declared kinds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KindName {
    pub api_version: Option<String>,
    pub kind: String,
}

impl KindName {
    /// Parse `Job`, `batch/v1/Job` or `batch/v1 Job`.
    pub fn parse(text: &str) -> Self {
        let t = text.trim();
        if let Some((av, k)) = t.rsplit_once([' ', '/'])
            && !av.is_empty()
        {
            return Self {
                api_version: Some(av.trim().to_string()),
                kind: k.to_string(),
            };
        }
        Self {
            api_version: None,
            kind: t.to_string(),
        }
    }

    pub fn of(obj: &serde_json::Value) -> Option<Self> {
        Some(Self {
            api_version: obj
                .get("apiVersion")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            kind: obj
                .get("kind")
                .and_then(serde_json::Value::as_str)?
                .to_string(),
        })
    }
}

impl std::fmt::Display for KindName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.api_version {
            Some(av) => write!(f, "{av} {}", self.kind),
            None => f.write_str(&self.kind),
        }
    }
}

/// The part a kind plays in a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Target,
    Owns,
    Reads,
    Mutates,
    /// Objects the policy may delete though it did not make them (a
    /// clean-up, its own target at the end of a TTL).
    Deletes,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Target,
        Role::Owns,
        Role::Reads,
        Role::Mutates,
        Role::Deletes,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Target => "target",
            Role::Owns => "owns",
            Role::Reads => "reads",
            Role::Mutates => "mutates",
            Role::Deletes => "deletes",
        }
    }
}

/// The kinds a policy declared, by role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeclaredKinds {
    entries: Vec<(KindRef, Role)>,
    /// Kinds read by name only (`spec.readsByName`), with the names.
    names: std::collections::BTreeMap<KindRef, std::collections::BTreeSet<String>>,
}

impl DeclaredKinds {
    pub fn new(target: &KindRef, owns: &[KindRef], reads: &[KindRef], mutates: &[KindRef]) -> Self {
        let mut entries = vec![(target.clone(), Role::Target)];
        entries.extend(owns.iter().map(|k| (k.clone(), Role::Owns)));
        entries.extend(reads.iter().map(|k| (k.clone(), Role::Reads)));
        entries.extend(mutates.iter().map(|k| (k.clone(), Role::Mutates)));
        Self {
            entries,
            names: Default::default(),
        }
    }

    /// With kinds read by name only, and their names.
    pub fn with_names(
        mut self,
        names: std::collections::BTreeMap<KindRef, std::collections::BTreeSet<String>>,
    ) -> Self {
        self.names = names;
        self
    }

    /// The names of the objects of `kind` the policy reads, when it reads
    /// only those; `None`: any of the kind.
    pub fn names_of(&self, kind: &KindRef) -> Option<&std::collections::BTreeSet<String>> {
        self.names.get(kind)
    }

    /// With kinds the policy may delete though it did not make them.
    pub fn with_deletes(mut self, deletes: impl IntoIterator<Item = KindRef>) -> Self {
        self.entries
            .extend(deletes.into_iter().map(|k| (k, Role::Deletes)));
        self
    }

    pub fn has(&self, kind: &KindRef, role: Role) -> bool {
        self.entries.iter().any(|(k, r)| k == kind && *r == role)
    }

    /// Whether the kind is declared in any role.
    pub fn declares(&self, kind: &KindRef) -> bool {
        self.entries.iter().any(|(k, _)| k == kind)
    }

    /// Every distinct kind, in declaration order.
    pub fn kinds(&self) -> Vec<&KindRef> {
        let mut out: Vec<&KindRef> = Vec::new();
        for (k, _) in &self.entries {
            if !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    pub fn with_role(&self, role: Role) -> impl Iterator<Item = &KindRef> {
        self.entries
            .iter()
            .filter(move |(_, r)| *r == role)
            .map(|(k, _)| k)
    }

    /// Resolve a kind name against the declared kinds: `Job` must match
    /// exactly one declared kind; `batch/v1 Job` must be declared.
    pub fn resolve(&self, name: &KindName) -> Result<KindRef, String> {
        let mut found = self.entries.iter().map(|(k, _)| k).filter(|k| {
            k.kind == name.kind
                && name
                    .api_version
                    .as_deref()
                    .is_none_or(|av| av == k.api_version)
        });
        let Some(first) = found.next() else {
            return Err(format!(
                "kind {name} is not declared by this policy (declare it in owns, reads, mutates or deletes)"
            ));
        };
        // A kind declared in two roles is still one kind.
        match found.find(|k| *k != first) {
            None => Ok(first.clone()),
            Some(_) => Err(format!(
                "kind {name} is ambiguous: name it with its apiVersion, as \"{} {}\"",
                first.api_version, first.kind
            )),
        }
    }
}

/// Built-in kinds: their status is decoded into fixed types, so it keeps
/// nothing of Runbook's. A sweep's record counts as one: it has no object
/// of its own, and all of it is kept in its `RunbookState`.
pub fn built_in(kind: &KindRef) -> bool {
    (kind.group() != "runbook.dev" && well_known(kind.group(), &kind.kind).is_some())
        || is_sweep(kind)
}

/// The kind a sweep (`spec.sweep`) is decided as: one object per policy,
/// made up by the runtime and never served, whose status is kept in a
/// `RunbookState` named after it (`sweep.runbook.dev.POLICY`).
pub fn sweep_kind() -> KindRef {
    KindRef::new("runbook.dev/v1alpha1", "Sweep")
}

pub fn is_sweep(kind: &KindRef) -> bool {
    kind.group() == "runbook.dev" && kind.kind == "Sweep"
}

/// The kinds whose schema is Runbook's: their status declares Runbook's
/// fields, so their state stays there.
pub fn owns_schema(kind: &KindRef) -> bool {
    kind.group() == "runbook.dev"
        && matches!(
            kind.kind.as_str(),
            "Evaluator" | "DatabaseBackup" | "AIModel"
        )
}

/// A kind the table knows without asking an API server.
pub struct WellKnown {
    pub group: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

const WELL_KNOWN: &[WellKnown] = &[
    wk("", "Pod", "pods", true),
    wk("", "ConfigMap", "configmaps", true),
    wk("", "Secret", "secrets", true),
    wk("", "Service", "services", true),
    wk("", "ServiceAccount", "serviceaccounts", true),
    wk("", "Event", "events", true),
    wk("", "PersistentVolumeClaim", "persistentvolumeclaims", true),
    wk("", "PersistentVolume", "persistentvolumes", false),
    wk("", "Namespace", "namespaces", false),
    wk("", "Node", "nodes", false),
    wk("", "Endpoints", "endpoints", true),
    wk("apps", "Deployment", "deployments", true),
    wk("apps", "ReplicaSet", "replicasets", true),
    wk("apps", "StatefulSet", "statefulsets", true),
    wk("apps", "DaemonSet", "daemonsets", true),
    wk("batch", "Job", "jobs", true),
    wk("batch", "CronJob", "cronjobs", true),
    wk("coordination.k8s.io", "Lease", "leases", true),
    wk("events.k8s.io", "Event", "events", true),
    wk(
        "apiextensions.k8s.io",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    ),
    wk(
        "snapshot.storage.k8s.io",
        "VolumeSnapshot",
        "volumesnapshots",
        true,
    ),
    wk(
        "snapshot.storage.k8s.io",
        "VolumeSnapshotClass",
        "volumesnapshotclasses",
        false,
    ),
    wk("networking.k8s.io", "Ingress", "ingresses", true),
    wk(
        "networking.k8s.io",
        "NetworkPolicy",
        "networkpolicies",
        true,
    ),
    wk(
        "policy",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
    ),
    wk(
        "autoscaling",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        true,
    ),
    wk("rbac.authorization.k8s.io", "Role", "roles", true),
    wk(
        "rbac.authorization.k8s.io",
        "RoleBinding",
        "rolebindings",
        true,
    ),
    wk(
        "rbac.authorization.k8s.io",
        "ClusterRole",
        "clusterroles",
        false,
    ),
    wk(
        "rbac.authorization.k8s.io",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
    ),
    wk(
        "admissionregistration.k8s.io",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        false,
    ),
    wk(
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        false,
    ),
    wk("runbook.dev", "Evaluator", "evaluators", true),
    wk("runbook.dev", "DatabaseBackup", "databasebackups", true),
    wk("runbook.dev", "AIModel", "aimodels", true),
];

const fn wk(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
) -> WellKnown {
    WellKnown {
        group,
        kind,
        plural,
        namespaced,
    }
}

/// The versions a standard cluster serves the well-known kinds of a
/// group at.
pub fn well_known_versions(group: &str) -> &'static [&'static str] {
    match group {
        "autoscaling" => &["v1", "v2"],
        "runbook.dev" => &["v1alpha1"],
        g if WELL_KNOWN.iter().any(|w| w.group == g) => &["v1"],
        _ => &[],
    }
}

/// Every well-known kind at each version served, as `apiVersion Kind`.
pub fn well_known_kinds() -> Vec<KindRef> {
    WELL_KNOWN
        .iter()
        .flat_map(|w| {
            well_known_versions(w.group).iter().map(move |v| {
                let av = if w.group.is_empty() {
                    v.to_string()
                } else {
                    format!("{}/{v}", w.group)
                };
                KindRef::new(&av, w.kind)
            })
        })
        .collect()
}

/// Look a kind up in the table of well-known kinds.
pub fn well_known(group: &str, kind: &str) -> Option<&'static WellKnown> {
    WELL_KNOWN
        .iter()
        .find(|w| w.group == group && w.kind == kind)
}

/// The plural the API server derives for a kind without an explicit one:
/// lowercase, then English plural rules.
pub fn default_plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with('s')
        || lower.ends_with("sh")
        || lower.ends_with("ch")
        || lower.ends_with('x')
        || lower.ends_with('z')
    {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_follow_the_table_then_the_default_rule() {
        assert_eq!(
            KindRef::new("apps/v1", "Deployment").plural(),
            "deployments"
        );
        assert_eq!(
            KindRef::new("networking.k8s.io/v1", "Ingress").plural(),
            "ingresses"
        );
        assert_eq!(
            KindRef::new("example.com/v1", "DatabaseCluster").plural(),
            "databaseclusters"
        );
        assert_eq!(
            KindRef::new("example.com/v1", "Policy").plural(),
            "policies"
        );
        assert_eq!(
            KindRef::new("example.com/v1", "Gateway").plural(),
            "gateways"
        );
    }

    #[test]
    fn kind_names_parse_in_every_form() {
        assert_eq!(
            KindName::parse("Job"),
            KindName {
                api_version: None,
                kind: "Job".into()
            }
        );
        for text in ["batch/v1/Job", "batch/v1 Job"] {
            assert_eq!(
                KindName::parse(text),
                KindName {
                    api_version: Some("batch/v1".into()),
                    kind: "Job".into()
                }
            );
        }
        assert_eq!(
            KindName::parse("v1/Pod"),
            KindName {
                api_version: Some("v1".into()),
                kind: "Pod".into()
            }
        );
    }

    #[test]
    fn declared_kinds_resolve_short_names_and_refuse_undeclared_ones() {
        let d = DeclaredKinds::new(
            &KindRef::new("runbook.dev/v1alpha1", "Evaluator"),
            &[KindRef::new("batch/v1", "Job")],
            &[KindRef::new("v1", "Pod")],
            &[KindRef::new("apps/v1", "Deployment")],
        );
        assert_eq!(
            d.resolve(&KindName::parse("Job")).unwrap(),
            KindRef::new("batch/v1", "Job")
        );
        assert!(
            d.resolve(&KindName::parse("Secret"))
                .unwrap_err()
                .contains("not declared")
        );
        assert!(d.resolve(&KindName::parse("batch/v2 Job")).is_err());
        assert!(d.has(&KindRef::new("apps/v1", "Deployment"), Role::Mutates));
    }

    #[test]
    fn group_and_version_split_the_api_version() {
        let k = KindRef::new("v1", "Pod");
        assert_eq!((k.group(), k.version()), ("", "v1"));
        let k = KindRef::new("batch/v1", "Job");
        assert_eq!((k.group(), k.version()), ("batch", "v1"));
    }
}
