//! The resource types the sandbox serves: the built-in kinds, and whatever
//! CustomResourceDefinitions are created at run time.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One served resource type.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceDef {
    pub group: String,
    /// Served versions; the first is the storage version.
    pub versions: Vec<String>,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status_subresource: bool,
    /// Whether writes maintain `metadata.generation`.
    pub has_generation: bool,
    /// Object names must be DNS labels (not just subdomains).
    pub dns_label_names: bool,
    /// OpenAPI v3 schemas by version (CRDs only).
    pub schemas: BTreeMap<String, Value>,
    /// Printer columns by version (CRDs only).
    pub columns: BTreeMap<String, Vec<Value>>,
    /// Set for kinds that come from a CRD.
    pub crd: Option<String>,
    /// Fields a field selector may name besides `metadata.name` and
    /// `metadata.namespace` (a CRD's `selectableFields`, without the
    /// leading dot).
    pub selectable: Vec<String>,
}

/// How a resource type is keyed in the store: group and plural.
pub type ResKey = (String, String);

impl ResourceDef {
    /// Whether the kind serves the `scale` subresource (autoscaling/v1
    /// Scale), as the built-in workloads do.
    pub fn has_scale(&self) -> bool {
        self.group == "apps"
            && matches!(
                self.kind.as_str(),
                "Deployment" | "ReplicaSet" | "StatefulSet"
            )
    }

    pub fn key(&self) -> ResKey {
        (self.group.clone(), self.plural.clone())
    }

    /// Where its objects are kept. Core `v1` Events and `events.k8s.io/v1`
    /// Events are one resource served in two groups, as on a real server.
    pub fn storage(&self) -> ResKey {
        if self.is_event() {
            ("events.k8s.io".into(), "events".into())
        } else {
            self.key()
        }
    }

    /// One of the two Event resources.
    pub fn is_event(&self) -> bool {
        self.plural == "events" && (self.group.is_empty() || self.group == "events.k8s.io")
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    pub fn storage_version(&self) -> &str {
        &self.versions[0]
    }

    /// `deployments.apps`, as error messages name a resource.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }
}

/// The kinds every sandbox serves from the start, one per line:
/// `group/version Kind plural`, then the words that apply: `namespaced`,
/// `status` (a status subresource), `generation` (writes keep
/// `metadata.generation`) and `short=a,b` (short names).
const BUILTINS: &[&str] = &[
    "v1 Namespace namespaces status short=ns",
    "v1 Pod pods namespaced status short=po",
    "v1 ConfigMap configmaps namespaced short=cm",
    "v1 Secret secrets namespaced",
    "v1 Service services namespaced status short=svc",
    "v1 ServiceAccount serviceaccounts namespaced short=sa",
    "v1 Event events namespaced short=ev",
    "v1 PersistentVolumeClaim persistentvolumeclaims namespaced status short=pvc",
    "apps/v1 Deployment deployments namespaced status generation short=deploy",
    "apps/v1 ReplicaSet replicasets namespaced status generation short=rs",
    "apps/v1 StatefulSet statefulsets namespaced status generation short=sts",
    "batch/v1 Job jobs namespaced status generation",
    "batch/v1 CronJob cronjobs namespaced status generation short=cj",
    "coordination.k8s.io/v1 Lease leases namespaced",
    "networking.k8s.io/v1 NetworkPolicy networkpolicies namespaced generation short=netpol",
    "networking.k8s.io/v1 Ingress ingresses namespaced status generation short=ing",
    "networking.k8s.io/v1 IngressClass ingressclasses generation",
    "events.k8s.io/v1 Event events namespaced short=ev",
    "apiextensions.k8s.io/v1 CustomResourceDefinition customresourcedefinitions status generation short=crd,crds",
    "policy/v1 PodDisruptionBudget poddisruptionbudgets namespaced status generation short=pdb",
    "rbac.authorization.k8s.io/v1 ClusterRole clusterroles",
    "rbac.authorization.k8s.io/v1 ClusterRoleBinding clusterrolebindings",
    "rbac.authorization.k8s.io/v1 Role roles namespaced",
    "rbac.authorization.k8s.io/v1 RoleBinding rolebindings namespaced",
    "authorization.k8s.io/v1 SelfSubjectAccessReview selfsubjectaccessreviews",
    "authorization.k8s.io/v1 SubjectAccessReview subjectaccessreviews",
    "authentication.k8s.io/v1 SelfSubjectReview selfsubjectreviews",
    "admissionregistration.k8s.io/v1 MutatingWebhookConfiguration mutatingwebhookconfigurations generation",
    "admissionregistration.k8s.io/v1 ValidatingWebhookConfiguration validatingwebhookconfigurations generation",
];

/// A built-in kind from its line of [`BUILTINS`].
fn builtin(line: &str) -> ResourceDef {
    let mut words = line.split_whitespace();
    let api_version = words.next().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = words.next().unwrap_or_default();
    let plural = words.next().unwrap_or_default();
    let flags: Vec<&str> = words.collect();
    let has = |w: &str| flags.contains(&w);
    let short_names = flags
        .iter()
        .find_map(|w| w.strip_prefix("short="))
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    ResourceDef {
        group: group.into(),
        versions: vec![version.into()],
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        namespaced: has("namespaced"),
        short_names,
        categories: if matches!(
            kind,
            "Pod" | "Service" | "Deployment" | "ReplicaSet" | "StatefulSet" | "Job" | "CronJob"
        ) {
            vec!["all".into()]
        } else {
            vec![]
        },
        status_subresource: has("status"),
        has_generation: has("generation"),
        dns_label_names: matches!(kind, "Namespace" | "Service"),
        schemas: BTreeMap::new(),
        columns: BTreeMap::new(),
        crd: None,
        selectable: Vec::new(),
    }
}

/// The kinds every sandbox serves from the start.
pub fn builtins() -> Vec<ResourceDef> {
    BUILTINS.iter().map(|line| builtin(line)).collect()
}

impl ResourceDef {
    /// A review the API server answers without storing it (access and
    /// identity reviews): `create` is its only verb.
    pub fn is_review(&self) -> bool {
        matches!(
            self.kind.as_str(),
            "SelfSubjectAccessReview" | "SubjectAccessReview" | "SelfSubjectReview"
        )
    }
}

/// Build a resource type from a CustomResourceDefinition, or say why it is
/// not a valid one.
/// The annotation a CRD in a protected group must carry.
const API_APPROVED: &str = "api-approved.kubernetes.io";

/// kube-apiserver refuses a CRD in a group the Kubernetes community owns
/// (`k8s.io`, `kubernetes.io` and their subdomains) unless it names the
/// approval of its API (a URL) or says it is unapproved.
fn api_approval(group: &str, annotation: &Value) -> Option<String> {
    let protected = ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|p| group == *p || group.ends_with(&format!(".{p}")));
    if !protected {
        return None;
    }
    let why = format!(
        "protected groups must have approval annotation {API_APPROVED:?}, see https://github.com/kubernetes/enhancements/pull/1111"
    );
    match annotation.as_str() {
        None => Some(format!("Required value: {why}")),
        Some(v) if v.starts_with("unapproved") => None,
        Some(v)
            if v.split_once("://")
                .is_some_and(|(scheme, rest)| !scheme.is_empty() && !rest.is_empty()) =>
        {
            None
        }
        Some(v) => Some(format!("Invalid value: {v:?}: {why}")),
    }
}

/// What the API server refuses in a CustomResourceDefinition: a group
/// that is not a domain, a plural that is not a label, no kind, a protected
/// group without approval, a name that is not `plural.group`, an unknown
/// scope, not exactly one storage version.
fn crd_problems(crd: &Value) -> Vec<(String, String)> {
    let mut errors: Vec<(String, String)> = Vec::new();
    let spec = &crd["spec"];
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let (group, plural, kind) = (
        s(&spec["group"]),
        s(&spec["names"]["plural"]),
        s(&spec["names"]["kind"]),
    );
    let name = s(&crd["metadata"]["name"]);
    let mut problem = |field: &str, message: String| errors.push((field.to_string(), message));
    if group.is_empty() || !runbook_core::names::is_dns_subdomain(&group) || !group.contains('.') {
        let m = format!("Invalid value: {group:?}: should be a domain with at least one dot");
        problem("spec.group", m);
    }
    if plural.is_empty() || !runbook_core::names::is_dns_label(&plural) {
        let m = format!("Invalid value: {plural:?}: a lowercase RFC 1123 label is required");
        problem("spec.names.plural", m);
    }
    if kind.is_empty() {
        problem("spec.names.kind", "Required value".into());
    }
    if let Some(e) = api_approval(&group, &crd["metadata"]["annotations"][API_APPROVED]) {
        problem(&format!("metadata.annotations[{API_APPROVED}]"), e);
    }
    if name != format!("{plural}.{group}") {
        let m = format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group");
        problem("metadata.name", m);
    }
    let scope = s(&spec["scope"]);
    if scope != "Namespaced" && scope != "Cluster" {
        let m =
            format!("Unsupported value: {scope:?}: supported values: \"Cluster\", \"Namespaced\"");
        problem("spec.scope", m);
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage = versions.iter().filter(|v| v["storage"] == true).count();
    let one_storage = "Invalid value: must have exactly one version marked as storage version";
    if versions.is_empty() {
        problem("spec.versions", one_storage.into());
    }
    if !versions.is_empty() && storage != 1 {
        problem("spec.versions", one_storage.into());
    }
    rule_problems(&versions, &mut errors);
    selectable_problems(&versions, &mut errors);
    errors
}

/// `selectableFields` that name no field of the schema, or one that is not
/// a string, boolean or integer, or a metadata field, worded as the API
/// server words them.
fn selectable_problems(versions: &[Value], errors: &mut Vec<(String, String)>) {
    let single = versions.len() == 1;
    for (i, v) in versions.iter().enumerate() {
        let schema = v.pointer("/schema/openAPIV3Schema").unwrap_or(&Value::Null);
        for (j, f) in v["selectableFields"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let path = f["jsonPath"].as_str().unwrap_or_default();
            let field = match single {
                true => format!("spec.selectableFields[{j}].jsonPath"),
                false => format!("spec.versions[{i}].selectableFields[{j}].jsonPath"),
            };
            let Some(rest) = path.strip_prefix('.') else {
                let first = path.split(['.', '[']).next().unwrap_or_default();
                errors.push((field, format!("Invalid value: {path:?}: is an invalid path: expected [ or . but got: {first}")));
                continue;
            };
            let mut at = Some(schema);
            for part in rest.split('.') {
                at = at.and_then(|s| s["properties"].get(part));
            }
            let found = at.filter(|_| !rest.starts_with("metadata"));
            match found.and_then(|s| s["type"].as_str()) {
                None => errors.push((field, format!("Invalid value: {path:?}: is an invalid path: does not refer to a valid field"))),
                Some("string" | "boolean" | "integer") => {}
                Some(_) => errors.push((field, format!("Invalid value: {path:?}: must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed."))),
            }
        }
    }
}

/// CEL rules that select a field their schema does not declare, as the API
/// server refuses them ("compilation failed"). A rule outside what the
/// sandbox's CEL compiles is let through (and left unenforced).
fn rule_problems(versions: &[Value], errors: &mut Vec<(String, String)>) {
    let schemas: Vec<Option<&Value>> = versions
        .iter()
        .map(|v| v.pointer("/schema/openAPIV3Schema"))
        .collect();
    // One schema for every version is reported as the CRD's validation.
    let shared = schemas.windows(2).all(|w| w[0] == w[1]);
    for (i, schema) in schemas.iter().enumerate() {
        let Some(schema) = schema else { continue };
        let base = if shared {
            "spec.validation.openAPIV3Schema".to_string()
        } else {
            format!("spec.versions[{i}].schema.openAPIV3Schema")
        };
        walk_rules(schema, &base, errors);
        if shared {
            break;
        }
    }
}

fn walk_rules(schema: &Value, path: &str, errors: &mut Vec<(String, String)>) {
    for (j, rule) in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let text = rule["rule"].as_str().unwrap_or_default();
        if let Ok(expr) = crate::cel::compile(text)
            && let Err(e) = crate::cel::check_fields(&expr, schema)
        {
            errors.push((
                format!("{path}.x-kubernetes-validations[{j}].rule"),
                format!("Invalid value: {text:?}: compilation failed: ERROR: {e}"),
            ));
        }
    }
    if let Some(props) = schema["properties"].as_object() {
        for (k, s) in props {
            walk_rules(s, &format!("{path}.properties[{k}]"), errors);
        }
    }
    for key in ["items", "additionalProperties"] {
        if schema[key].is_object() {
            walk_rules(&schema[key], &format!("{path}.{key}"), errors);
        }
    }
}

/// The kind a valid CustomResourceDefinition serves.
pub fn from_crd(crd: &Value) -> Result<ResourceDef, Vec<(String, String)>> {
    let errors = crd_problems(crd);
    if !errors.is_empty() {
        return Err(errors);
    }
    let spec = &crd["spec"];
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let names = &spec["names"];
    let kind = s(&names["kind"]);
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage_name = versions
        .iter()
        .find(|v| v["storage"] == true)
        .map(|v| s(&v["name"]))
        .unwrap_or_default();
    let mut served: Vec<String> = vec![storage_name.clone()];
    let mut schemas = BTreeMap::new();
    let mut columns = BTreeMap::new();
    let mut status = false;
    let mut selectable = Vec::new();
    for v in &versions {
        if s(&v["name"]) == storage_name {
            selectable = v["selectableFields"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["jsonPath"].as_str())
                .map(|p| p.trim_start_matches('.').to_string())
                .collect();
        }
        let vn = s(&v["name"]);
        if v["served"] != false && vn != storage_name {
            served.push(vn.clone());
        }
        if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
            schemas.insert(vn.clone(), schema.clone());
        }
        if let Some(cols) = v["additionalPrinterColumns"].as_array() {
            columns.insert(vn.clone(), cols.clone());
        }
        status |= v.pointer("/subresources/status").is_some();
    }
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    let or = |v: &Value, default: String| v.as_str().map(str::to_string).unwrap_or(default);
    Ok(ResourceDef {
        group: s(&spec["group"]),
        versions: served,
        list_kind: or(&names["listKind"], format!("{kind}List")),
        singular: or(&names["singular"], kind.to_ascii_lowercase()),
        plural: s(&names["plural"]),
        kind,
        namespaced: s(&spec["scope"]) == "Namespaced",
        short_names: strings(&names["shortNames"]),
        categories: strings(&names["categories"]),
        status_subresource: status,
        has_generation: true,
        dns_label_names: false,
        schemas,
        columns,
        crd: Some(s(&crd["metadata"]["name"])),
        selectable,
    })
}

/// The status a CRD gets once its kind is served.
pub fn crd_status(crd: &Value, now: &str) -> Value {
    json!({
        "acceptedNames": crd["spec"]["names"],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now}
        ],
        "storedVersions": crd["spec"]["versions"].as_array().into_iter().flatten()
            .filter(|v| v["storage"] == true).map(|v| v["name"].clone()).collect::<Vec<_>>()
    })
}
