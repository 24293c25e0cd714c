//! What the API server refuses or fills in: the identity a body must
//! carry, metadata rules, the defaults and checks of built-in kinds, and
//! CRD schemas.

use super::*;

/// Two objects equal but for `managedFields` times and the resourceVersion,
/// compared without copying either.
pub(super) fn same_content(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    if a.len() != b.len() {
        return false;
    }
    a.iter().all(|(k, av)| {
        let Some(bv) = b.get(k) else { return false };
        if k != "metadata" {
            return av == bv;
        }
        let (Some(am), Some(bm)) = (av.as_object(), bv.as_object()) else {
            return av == bv;
        };
        let keys = |m: &Map<String, Value>| m.keys().filter(|k| *k != "resourceVersion").count();
        keys(am) == keys(bm)
            && am
                .iter()
                .filter(|(k, _)| *k != "resourceVersion")
                .all(|(k, x)| match (k.as_str(), bm.get(k)) {
                    (_, None) => false,
                    ("managedFields", Some(y)) => same_managed(x, y),
                    (_, Some(y)) => x == y,
                })
    })
}

pub(super) fn same_managed(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_array(), b.as_array()) else {
        return a == b;
    };
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| match (x.as_object(), y.as_object()) {
                (Some(x), Some(y)) => {
                    x.len() == y.len() && x.iter().all(|(k, v)| k == "time" || y.get(k) == Some(v))
                }
                _ => x == y,
            })
}

/// The body must name the kind and version the URL serves, and the same
/// namespace and name.
pub(super) fn check_identity(
    def: &ResourceDef,
    obj: &Value,
    ns: &str,
    name: Option<&str>,
) -> Result<(), ApiError> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if kind.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Object 'Kind' is missing in '{}'",
            truncate(&obj.to_string(), 200)
        )));
    }
    if kind != def.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            def.kind
        )));
    }
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    if group != def.group || !def.serves(version) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version(def.storage_version())
        )));
    }
    if let Some(body_ns) = meta_str(obj, "namespace")
        && def.namespaced
        && !body_ns.is_empty()
        && body_ns != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if let (Some(url_name), Some(body_name)) = (name, meta_str(obj, "name"))
        && !body_name.is_empty()
        && body_name != url_name
    {
        return Err(ApiError::bad_request(
            "the name of the object (".to_string()
                + body_name
                + ") does not match the name on the URL ("
                + url_name
                + ")",
        ));
    }
    Ok(())
}

pub(super) fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        format!("{}...", &s[..n])
    }
}

pub(super) fn validate_meta(def: &ResourceDef, obj: &Value, name: &str) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let ok = if def.dns_label_names {
        names::is_dns_label(name)
    } else {
        names::is_dns_subdomain(name)
    };
    if !ok {
        let what = if def.dns_label_names {
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
        } else {
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        };
        causes.push(Cause::invalid("metadata.name", &json!(name), what));
    }
    if let Some(labels) = obj.pointer("/metadata/labels") {
        match labels.as_object() {
            Some(m) => {
                for (k, v) in m {
                    if let Err(e) = runbook_core::labels::check_key(k) {
                        causes.push(Cause::invalid("metadata.labels", &json!(k), e));
                    }
                    match v.as_str() {
                        Some(s) => {
                            if let Err(e) = runbook_core::labels::check_value(s) {
                                causes.push(Cause::invalid(format!("metadata.labels.{k}"), v, e));
                            }
                        }
                        None => causes.push(Cause::invalid(
                            format!("metadata.labels.{k}"),
                            v,
                            "label values must be strings",
                        )),
                    }
                }
            }
            None if labels.is_null() => {}
            None => causes.push(Cause::invalid(
                "metadata.labels",
                labels,
                "must be a map of strings",
            )),
        }
    }
    if let Some(ann) = obj.pointer("/metadata/annotations")
        && !ann.is_null()
        && !ann
            .as_object()
            .is_some_and(|m| m.values().all(Value::is_string))
    {
        causes.push(Cause::invalid(
            "metadata.annotations",
            ann,
            "must be a map of strings",
        ));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def, name, causes))
    }
}

/// What the API server fills in for built-in kinds that the sandbox's
/// clients rely on.
/// The label every namespace carries with its own name, as the API
/// server sets it (and sets again when it is removed).
pub(super) fn label_namespace(def: &ResourceDef, obj: &mut Value) {
    if !(def.group.is_empty() && def.kind == "Namespace") {
        return;
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let meta = &mut obj["metadata"];
    if !meta["labels"].is_object() {
        meta["labels"] = json!({});
    }
    meta["labels"]["kubernetes.io/metadata.name"] = json!(name);
}

/// A Secret's `stringData`, as the API server keeps it: merged into `data`
/// (base64, over any key `data` already has) and not stored itself.
pub(super) fn secret_string_data(def: &ResourceDef, obj: &mut Value) {
    use base64::Engine as _;
    if !(def.group.is_empty() && def.kind == "Secret") {
        return;
    }
    let Some(m) = obj.as_object_mut() else { return };
    let Some(Value::Object(strings)) = m.remove("stringData") else {
        return;
    };
    let data = m.entry("data").or_insert_with(|| json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    for (k, v) in strings {
        let text = v.as_str().unwrap_or_default();
        data[k.as_str()] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

pub(super) fn default_builtin(def: &ResourceDef, obj: &mut Value, uid: &str) {
    label_namespace(def, obj);
    secret_string_data(def, obj);
    match (def.group.as_str(), def.kind.as_str()) {
        ("batch", "Job") => {
            let spec = &mut obj["spec"];
            if spec.is_object() && spec.get("selector").is_none() && spec["manualSelector"] != true
            {
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let labels = json!({
                    "batch.kubernetes.io/controller-uid": uid,
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": uid,
                    "job-name": name,
                });
                let spec = &mut obj["spec"];
                spec["selector"] =
                    json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
                if !spec["template"]["metadata"].is_object() {
                    spec["template"]["metadata"] = json!({});
                }
                let tl = &mut spec["template"]["metadata"]["labels"];
                if !tl.is_object() {
                    *tl = json!({});
                }
                for (k, v) in labels.as_object().into_iter().flatten() {
                    tl[k] = v.clone();
                }
            }
            let spec = &mut obj["spec"];
            if spec.is_object() {
                for (k, v) in [
                    ("backoffLimit", json!(6)),
                    ("completions", json!(1)),
                    ("parallelism", json!(1)),
                    ("suspend", json!(false)),
                    ("completionMode", json!("NonIndexed")),
                ] {
                    if spec.get(k).is_none() {
                        spec[k] = v;
                    }
                }
            }
        }
        ("apps", "Deployment") => {
            let spec = &mut obj["spec"];
            if spec.is_object() {
                for (k, v) in [
                    ("replicas", json!(1)),
                    ("revisionHistoryLimit", json!(10)),
                    ("progressDeadlineSeconds", json!(600)),
                    (
                        "strategy",
                        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
                    ),
                ] {
                    if spec.get(k).is_none() {
                        spec[k] = v;
                    }
                }
            }
        }
        _ => {}
    }
}

/// Checks of built-in kinds the sandbox's users meet most: a Pod template
/// needs containers with names and images; a workload's selector must match
/// its template's labels.
/// The counts a workload's status must keep consistent, as kube-apiserver's
/// apps validation checks them on every status write: none negative, none
/// above `replicas`, and no more available replicas than ready ones.
/// The counts of a workload kind's status (none may be negative).
fn status_counts(kind: &str) -> &'static [&'static str] {
    match kind {
        "Deployment" => &[
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "unavailableReplicas",
            "observedGeneration",
            "collisionCount",
        ],
        "ReplicaSet" => &[
            "replicas",
            "fullyLabeledReplicas",
            "readyReplicas",
            "availableReplicas",
            "observedGeneration",
        ],
        _ => &[
            "replicas",
            "readyReplicas",
            "currentReplicas",
            "updatedReplicas",
            "availableReplicas",
            "observedGeneration",
            "collisionCount",
        ],
    }
}

/// The counts no larger than `replicas`, and the messages the API server
/// gives for one above `replicas` and for more available than ready.
fn status_bounds(kind: &str) -> (&'static [&'static str], &'static str, &'static str) {
    match kind {
        "Deployment" => (
            &["updatedReplicas", "readyReplicas", "availableReplicas"],
            "cannot be greater than status.replicas",
            "cannot be greater than readyReplicas",
        ),
        "ReplicaSet" => (
            &["fullyLabeledReplicas", "readyReplicas", "availableReplicas"],
            "cannot be greater than the number of replicas",
            "cannot be greater than readyReplicas",
        ),
        _ => (
            &[
                "readyReplicas",
                "currentReplicas",
                "updatedReplicas",
                "availableReplicas",
            ],
            "cannot be greater than status.replicas",
            "cannot be greater than status.readyReplicas",
        ),
    }
}

pub(super) fn workload_status_causes(kind: &str, status: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let count = |f: &str| status.get(f).and_then(Value::as_i64);
    for f in status_counts(kind) {
        if let Some(n) = count(f).filter(|n| *n < 0) {
            let m = "must be greater than or equal to 0";
            causes.push(Cause::invalid(format!("status.{f}"), &json!(n), m));
        }
    }
    let (bounded, above_replicas, above_ready) = status_bounds(kind);
    let replicas = count("replicas").unwrap_or(0);
    for f in bounded {
        if let Some(n) = count(f).filter(|n| *n > replicas) {
            causes.push(Cause::invalid(
                format!("status.{f}"),
                &json!(n),
                above_replicas,
            ));
        }
    }
    let ready = count("readyReplicas").unwrap_or(0);
    if let Some(n) = count("availableReplicas").filter(|n| *n > ready) {
        causes.push(Cause::invalid(
            "status.availableReplicas",
            &json!(n),
            above_ready,
        ));
    }
    causes
}

pub(super) fn validate_builtin(def: &ResourceDef, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let template = &obj["spec"]["template"]["spec"];
    match (def.group.as_str(), def.kind.as_str()) {
        ("", "Pod") => pod_spec_causes(&obj["spec"], "spec", false, &mut causes),
        ("apps", "Deployment") | ("apps", "ReplicaSet") | ("apps", "StatefulSet") => {
            selector_causes(obj, &mut causes);
            causes.extend(workload_status_causes(def.kind.as_str(), &obj["status"]));
            pod_spec_causes(template, "spec.template.spec", false, &mut causes);
        }
        ("batch", "Job") => pod_spec_causes(template, "spec.template.spec", true, &mut causes),
        ("", "ConfigMap") | ("", "Secret") => config_key_causes(obj, &mut causes),
        ("", "Service") => port_causes(obj, &mut causes),
        _ => {}
    }
    causes
}

/// A Pod spec needs containers, each with a DNS-label name and an image;
/// a Job's restarts only on failure or never.
fn pod_spec_causes(spec: &Value, path: &str, job: bool, causes: &mut Vec<Cause>) {
    match spec.get("containers").and_then(Value::as_array) {
        Some(cs) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                let at = format!("{path}.containers[{i}]");
                match c.get("name").and_then(Value::as_str) {
                    None | Some("") => causes.push(Cause::required(format!("{at}.name"))),
                    Some(n) if !names::is_dns_label(n) => causes.push(Cause::invalid(
                        format!("{at}.name"),
                        &json!(n),
                        "must be a DNS label",
                    )),
                    _ => {}
                }
                if c.get("image")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push(Cause::required(format!("{at}.image")));
                }
            }
        }
        _ => causes.push(Cause::required(format!("{path}.containers"))),
    }
    let restart = spec
        .get("restartPolicy")
        .and_then(Value::as_str)
        .unwrap_or("Always");
    if job && restart != "Never" && restart != "OnFailure" {
        causes.push(Cause::unsupported(
            format!("{path}.restartPolicy"),
            &json!(restart),
            &[json!("OnFailure"), json!("Never")],
        ));
    }
}

/// A workload's selector must be given and match its template's labels.
fn selector_causes(obj: &Value, causes: &mut Vec<Cause>) {
    let sel = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object);
    let labels = obj
        .pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object);
    match sel {
        None if obj.pointer("/spec/selector/matchExpressions").is_none() => {
            causes.push(Cause::required("spec.selector"))
        }
        Some(sel)
            if !sel
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)) =>
        {
            causes.push(Cause::invalid(
                "spec.template.metadata.labels",
                &Value::Object(labels.cloned().unwrap_or_default()),
                "`selector` does not match template `labels`",
            ));
        }
        _ => {}
    }
}

/// ConfigMap and Secret keys: alphanumerics, '-', '_' and '.'.
fn config_key_causes(obj: &Value, causes: &mut Vec<Cause>) {
    let valid = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    for field in ["data", "binaryData", "stringData"] {
        let keys = obj
            .get(field)
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|m| m.keys());
        for k in keys.filter(|k| !valid(k)) {
            causes.push(Cause::invalid(
                format!("{field}[{k}]"),
                &json!(k),
                "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            ));
        }
    }
}

/// A Service's ports are between 1 and 65535.
fn port_causes(obj: &Value, causes: &mut Vec<Cause>) {
    let ports = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for (i, p) in ports.enumerate() {
        if p.get("port")
            .and_then(Value::as_i64)
            .is_none_or(|n| !(1..=65535).contains(&n))
        {
            causes.push(Cause::invalid(
                format!("spec.ports[{i}].port"),
                &p["port"],
                "must be between 1 and 65535, inclusive",
            ));
        }
    }
}

/// The schema a custom resource is checked against: its version's, or
/// the first one.
pub(super) fn schema_of<'a>(def: &'a ResourceDef, obj: &Value) -> Option<&'a Value> {
    let version = obj["apiVersion"]
        .as_str()
        .and_then(|a| a.rsplit('/').next())
        .unwrap_or("");
    def.schemas
        .get(version)
        .or_else(|| def.schemas.values().next())
}

/// The API server's answer to unknown fields under strict field
/// validation: the object cannot be decoded.
fn strict_decoding(kind: &str, version: &str, unknown: &[String]) -> ApiError {
    let fields: Vec<String> = unknown
        .iter()
        .map(|u| format!("unknown field \"{u}\""))
        .collect();
    ApiError::bad_request(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        fields.join(", ")
    ))
}

impl Inner {
    /// Unknown fields (pruned, warned of or refused, as `fieldValidation`
    /// says), then schema (for custom resources) and built-in validation.
    pub(super) fn validate_content(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        old: Option<&Value>,
        opts: &WriteOpts,
        warnings: &mut Vec<String>,
        name: &str,
    ) -> Result<(), ApiError> {
        if def.crd.is_none() {
            let unknown = super::typed::prune(&def.group, &def.kind, obj);
            match opts.field_validation {
                FieldValidation::Strict if !unknown.is_empty() => {
                    let version = def.versions.first().map(String::as_str).unwrap_or("v1");
                    return Err(strict_decoding(&def.kind, version, &unknown));
                }
                FieldValidation::Warn => {
                    warnings.extend(unknown.iter().map(|u| format!("unknown field \"{u}\"")))
                }
                _ => {}
            }
        }
        let mut causes = validate_builtin(def, obj);
        if def.crd.is_some() {
            let version = obj["apiVersion"]
                .as_str()
                .and_then(|a| a.rsplit('/').next())
                .unwrap_or("")
                .to_string();
            if let Some(schema) = schema_of(def, obj) {
                let out = schema::apply(schema, obj, old);
                causes.extend(out.causes);
                match opts.field_validation {
                    // Strict decoding fails before any validation.
                    FieldValidation::Strict if !out.unknown.is_empty() => {
                        let kind = obj["kind"].as_str().unwrap_or_default();
                        return Err(strict_decoding(kind, &version, &out.unknown));
                    }
                    FieldValidation::Strict => {}
                    FieldValidation::Warn => warnings
                        .extend(out.unknown.iter().map(|u| format!("unknown field \"{u}\""))),
                    FieldValidation::Ignore => {}
                }
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(def, name, causes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{def, store};
    use super::*;

    fn fields(causes: &[Cause]) -> Vec<&str> {
        causes.iter().map(|c| c.field.as_str()).collect()
    }

    #[test]
    fn a_pod_template_needs_named_containers_with_images() {
        let s = store();
        let jobs = def(&s, "batch", "jobs");
        let job = json!({"spec": {"template": {"spec": {"containers": [{"name": "Bad_Name"}]}}}});
        assert_eq!(
            fields(&validate_builtin(&jobs, &job)),
            [
                "spec.template.spec.containers[0].name",
                "spec.template.spec.containers[0].image",
                "spec.template.spec.restartPolicy"
            ]
        );
        let pods = def(&s, "", "pods");
        assert_eq!(
            fields(&validate_builtin(&pods, &json!({"spec": {}}))),
            ["spec.containers"]
        );
    }

    #[test]
    fn a_workload_selector_matches_its_template_and_its_counts_hold() {
        let s = store();
        let sets = def(&s, "apps", "statefulsets");
        let set = json!({"spec": {"selector": {"matchLabels": {"app": "db"}},
                                  "template": {"metadata": {"labels": {"app": "web"}},
                                               "spec": {"containers": [{"name": "c", "image": "x"}]}}},
                         "status": {"replicas": 1, "readyReplicas": 2, "availableReplicas": -1}});
        assert_eq!(
            fields(&validate_builtin(&sets, &set)),
            [
                "spec.template.metadata.labels",
                "status.availableReplicas",
                "status.readyReplicas"
            ]
        );
        let counts = workload_status_causes(
            "Deployment",
            &json!({"replicas": 2, "readyReplicas": 1, "availableReplicas": 2}),
        );
        assert_eq!(
            counts[0].message,
            "Invalid value: 2: cannot be greater than readyReplicas"
        );
    }

    #[test]
    fn config_keys_and_service_ports_are_checked() {
        let s = store();
        let cms = def(&s, "", "configmaps");
        let bad = json!({"data": {"ok.key": "1", "no/slash": "2"}});
        assert_eq!(fields(&validate_builtin(&cms, &bad)), ["data[no/slash]"]);
        let svcs = def(&s, "", "services");
        let svc = json!({"spec": {"ports": [{"port": 80}, {"port": 70000}]}});
        assert_eq!(
            fields(&validate_builtin(&svcs, &svc)),
            ["spec.ports[1].port"]
        );
    }
}
