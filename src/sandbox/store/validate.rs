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
                    if let Err(e) = crate::labels::check_key(k) {
                        causes.push(Cause::invalid("metadata.labels", &json!(k), e));
                    }
                    match v.as_str() {
                        Some(s) => {
                            if let Err(e) = crate::labels::check_value(s) {
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
pub(super) fn default_builtin(def: &ResourceDef, obj: &mut Value, uid: &str) {
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
pub(super) fn workload_status_causes(kind: &str, status: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let count = |f: &str| status.get(f).and_then(Value::as_i64);
    let counts: &[&str] = match kind {
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
    };
    for f in counts {
        if let Some(n) = count(f).filter(|n| *n < 0) {
            causes.push(Cause::invalid(
                format!("status.{f}"),
                &json!(n),
                "must be greater than or equal to 0",
            ));
        }
    }
    let (bounded, above_replicas, above_ready): (&[&str], &str, &str) = match kind {
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
    };
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
    if let Some(n) = count("availableReplicas").filter(|n| *n > count("readyReplicas").unwrap_or(0))
    {
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
    let check_pod_spec =
        |spec: &Value, path: &str, causes: &mut Vec<Cause>, restart_never_or_onfailure: bool| {
            match spec.get("containers").and_then(Value::as_array) {
                Some(cs) if !cs.is_empty() => {
                    for (i, c) in cs.iter().enumerate() {
                        match c.get("name").and_then(Value::as_str) {
                            None | Some("") => {
                                causes.push(Cause::required(format!("{path}.containers[{i}].name")))
                            }
                            Some(n) if !names::is_dns_label(n) => causes.push(Cause::invalid(
                                format!("{path}.containers[{i}].name"),
                                &json!(n),
                                "must be a DNS label",
                            )),
                            _ => {}
                        }
                        if c.get("image")
                            .and_then(Value::as_str)
                            .is_none_or(str::is_empty)
                        {
                            causes.push(Cause::required(format!("{path}.containers[{i}].image")));
                        }
                    }
                }
                _ => causes.push(Cause::required(format!("{path}.containers"))),
            }
            if restart_never_or_onfailure {
                let rp = spec
                    .get("restartPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or("Always");
                if rp != "Never" && rp != "OnFailure" {
                    causes.push(Cause::unsupported(
                        format!("{path}.restartPolicy"),
                        &json!(rp),
                        &[json!("OnFailure"), json!("Never")],
                    ));
                }
            }
        };
    let workload_selector = |causes: &mut Vec<Cause>| {
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
            Some(_) => {}
            None => {}
        }
    };
    match (def.group.as_str(), def.kind.as_str()) {
        ("", "Pod") => check_pod_spec(&obj["spec"], "spec", &mut causes, false),
        ("apps", "Deployment") | ("apps", "ReplicaSet") | ("apps", "StatefulSet") => {
            workload_selector(&mut causes);
            causes.extend(workload_status_causes(def.kind.as_str(), &obj["status"]));
            check_pod_spec(
                &obj["spec"]["template"]["spec"],
                "spec.template.spec",
                &mut causes,
                false,
            );
        }
        ("batch", "Job") => check_pod_spec(
            &obj["spec"]["template"]["spec"],
            "spec.template.spec",
            &mut causes,
            true,
        ),
        ("", "ConfigMap") | ("", "Secret") => {
            for field in ["data", "binaryData", "stringData"] {
                for k in obj
                    .get(field)
                    .and_then(Value::as_object)
                    .into_iter()
                    .flat_map(|m| m.keys())
                {
                    if k.is_empty()
                        || !k
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    {
                        causes.push(Cause::invalid(format!("{field}[{k}]"), &json!(k), "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"));
                    }
                }
            }
        }
        ("", "Service") => {
            for (i, p) in obj
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
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
        _ => {}
    }
    causes
}

impl Inner {
    /// Schema (for custom resources) and built-in validation.
    pub(super) fn validate_content(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        opts: &WriteOpts,
        warnings: &mut Vec<String>,
        name: &str,
    ) -> Result<(), ApiError> {
        let mut causes = validate_builtin(def, obj);
        if def.crd.is_some() {
            let version = obj["apiVersion"]
                .as_str()
                .and_then(|a| a.rsplit('/').next())
                .unwrap_or("")
                .to_string();
            if let Some(schema) = def
                .schemas
                .get(&version)
                .or_else(|| def.schemas.values().next())
            {
                let out = schema::apply(schema, obj);
                causes.extend(out.causes);
                match opts.field_validation {
                    FieldValidation::Strict => {
                        causes.extend(out.unknown.iter().map(|u| Cause::unknown(format!(".{u}"))))
                    }
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
