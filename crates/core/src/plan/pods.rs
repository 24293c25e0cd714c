//! The pods inside a child: what they ask of the node (refused unless the
//! policy's `spec.pods` allows it) and what other objects of the
//! namespace they take in (Secrets, ConfigMaps, volume claims, a
//! ServiceAccount), which only someone who may use those objects may have
//! Runbook put there. Pure: JSON in, findings out.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::policy::model::PodsSpec;

/// Every pod spec an object holds: a Pod's own, the template of a Job,
/// Deployment, StatefulSet, ReplicaSet, DaemonSet or any kind with
/// `spec.template.spec`, and a CronJob's job template.
pub fn pod_specs(object: &Value) -> Vec<&Value> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let mut out = Vec::new();
    let is_pod = |v: &Value| v.get("containers").is_some_and(Value::is_array);
    if kind == "Pod" {
        out.extend(object.get("spec"));
        return out;
    }
    for path in [
        "/spec/template/spec",
        "/spec/jobTemplate/spec/template/spec",
    ] {
        if let Some(spec) = object.pointer(path).filter(|s| is_pod(s)) {
            out.push(spec);
        }
    }
    out
}

fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .filter_map(|k| spec.get(k).and_then(Value::as_array))
        .flatten()
}

fn name_of(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("?")
}

fn truthy(v: Option<&Value>) -> bool {
    v.and_then(Value::as_bool) == Some(true)
}

/// The ServiceAccount a pod spec runs as (`None`: the namespace's default).
fn service_account(spec: &Value) -> Option<&str> {
    ["serviceAccountName", "serviceAccount"]
        .iter()
        .filter_map(|k| spec.get(*k).and_then(Value::as_str))
        .find(|s| !s.is_empty() && *s != "default")
}

/// What a child's pods ask for that `allowed` does not allow, as a
/// sentence naming the first such thing and the field that would allow
/// it; `None` when they ask for nothing more than an ordinary pod.
pub fn refusal(object: &Value, allowed: &PodsSpec) -> Option<String> {
    for spec in pod_specs(object) {
        if !allowed.host_namespaces {
            for key in ["hostNetwork", "hostPID", "hostIPC"] {
                if truthy(spec.get(key)) {
                    return Some(format!(
                        "its pod asks for {key}, which the policy does not allow (spec.pods.hostNamespaces)"
                    ));
                }
            }
            for c in containers(spec) {
                let ports = c
                    .get("ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten();
                if ports
                    .into_iter()
                    .any(|p| p.get("hostPort").is_some_and(|h| !h.is_null()))
                {
                    return Some(format!(
                        "its pod asks for a hostPort (container {}), which the policy does not allow (spec.pods.hostNamespaces)",
                        name_of(c)
                    ));
                }
            }
        }
        if !allowed.host_path {
            let volumes = spec
                .get("volumes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten();
            if let Some(v) = volumes.into_iter().find(|v| v.get("hostPath").is_some()) {
                return Some(format!(
                    "its pod mounts the host's files (hostPath volume {}), which the policy does not allow (spec.pods.hostPath)",
                    name_of(v)
                ));
            }
        }
        if !allowed.privileged {
            for c in containers(spec) {
                let sc = c.get("securityContext");
                let added = sc
                    .and_then(|s| s.pointer("/capabilities/add"))
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty());
                if truthy(sc.and_then(|s| s.get("privileged"))) || added {
                    let what = if added {
                        "added capabilities"
                    } else {
                        "privileged"
                    };
                    return Some(format!(
                        "its pod asks for {what} (container {}), which the policy does not allow (spec.pods.privileged)",
                        name_of(c)
                    ));
                }
            }
        }
        if let Some(sa) = service_account(spec)
            && !allowed.service_accounts.iter().any(|a| a == sa)
        {
            return Some(format!(
                "its pod runs as ServiceAccount {sa:?}, which the policy does not allow (spec.pods.serviceAccounts)"
            ));
        }
    }
    None
}

/// The objects of the child's namespace that its pods (or, for a
/// VolumeSnapshot, its source) take in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct References {
    pub secrets: BTreeSet<String>,
    pub config_maps: BTreeSet<String>,
    pub claims: BTreeSet<String>,
    pub service_accounts: BTreeSet<String>,
}

impl References {
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
            && self.config_maps.is_empty()
            && self.claims.is_empty()
            && self.service_accounts.is_empty()
    }
}

fn names_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// What a child takes in of its namespace.
pub fn references(object: &Value) -> References {
    let mut r = References::default();
    let add = |set: &mut BTreeSet<String>, name: Option<&str>| {
        if let Some(n) = name {
            set.insert(n.to_string());
        }
    };
    if object.get("kind").and_then(Value::as_str) == Some("VolumeSnapshot") {
        add(
            &mut r.claims,
            names_at(object, "/spec/source/persistentVolumeClaimName"),
        );
    }
    for spec in pod_specs(object) {
        if let Some(sa) = service_account(spec) {
            r.service_accounts.insert(sa.to_string());
        }
        for s in spec
            .get("imagePullSecrets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            add(&mut r.secrets, names_at(s, "/name"));
        }
        for v in spec
            .get("volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            add(&mut r.secrets, names_at(v, "/secret/secretName"));
            add(&mut r.config_maps, names_at(v, "/configMap/name"));
            add(
                &mut r.claims,
                names_at(v, "/persistentVolumeClaim/claimName"),
            );
            let sources = v.pointer("/projected/sources").and_then(Value::as_array);
            for s in sources.into_iter().flatten() {
                add(&mut r.secrets, names_at(s, "/secret/name"));
                add(&mut r.config_maps, names_at(s, "/configMap/name"));
            }
        }
        for c in containers(spec) {
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                add(&mut r.secrets, names_at(e, "/valueFrom/secretKeyRef/name"));
                add(
                    &mut r.config_maps,
                    names_at(e, "/valueFrom/configMapKeyRef/name"),
                );
            }
            for e in c
                .get("envFrom")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                add(&mut r.secrets, names_at(e, "/secretRef/name"));
                add(&mut r.config_maps, names_at(e, "/configMapRef/name"));
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(pod: Value) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"template": {"spec": pod}}})
    }

    #[test]
    fn an_ordinary_pod_passes_and_each_escalation_is_named() {
        let plain = job(json!({"containers": [{"name": "b", "image": "x"}]}));
        assert_eq!(refusal(&plain, &PodsSpec::default()), None);
        for (pod, says, allow) in [
            (
                json!({"hostPID": true, "containers": [{"name": "b"}]}),
                "hostPID",
                PodsSpec {
                    host_namespaces: true,
                    ..Default::default()
                },
            ),
            (
                json!({"containers": [{"name": "b", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
                "hostPort",
                PodsSpec {
                    host_namespaces: true,
                    ..Default::default()
                },
            ),
            (
                json!({"containers": [{"name": "b"}], "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
                "hostPath volume root",
                PodsSpec {
                    host_path: true,
                    ..Default::default()
                },
            ),
            (
                json!({"containers": [{"name": "b", "securityContext": {"privileged": true}}]}),
                "privileged (container b)",
                PodsSpec {
                    privileged: true,
                    ..Default::default()
                },
            ),
            (
                json!({"initContainers": [{"name": "i", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}], "containers": []}),
                "added capabilities (container i)",
                PodsSpec {
                    privileged: true,
                    ..Default::default()
                },
            ),
            (
                json!({"serviceAccountName": "deployer", "containers": [{"name": "b"}]}),
                "ServiceAccount \"deployer\"",
                PodsSpec {
                    service_accounts: vec!["deployer".into()],
                    ..Default::default()
                },
            ),
        ] {
            let why = refusal(&job(pod.clone()), &PodsSpec::default()).unwrap_or_default();
            assert!(why.contains(says), "{says}: {why}");
            assert_eq!(refusal(&job(pod), &allow), None, "{says} allowed");
        }
        // A CronJob's job template and a bare Pod are pods too.
        let cron = json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {"hostNetwork": true, "containers": []}}}}}});
        assert!(refusal(&cron, &PodsSpec::default()).is_some());
        let pod = json!({"kind": "Pod", "spec": {"serviceAccount": "admin", "containers": []}});
        assert!(refusal(&pod, &PodsSpec::default()).is_some());
        let default =
            json!({"kind": "Pod", "spec": {"serviceAccountName": "default", "containers": []}});
        assert_eq!(refusal(&default, &PodsSpec::default()), None);
    }

    #[test]
    fn the_objects_a_pod_takes_in_are_found_wherever_it_names_them() {
        let j = job(json!({
            "serviceAccountName": "robot",
            "imagePullSecrets": [{"name": "pull"}],
            "volumes": [{"name": "a", "secret": {"secretName": "tls"}},
                        {"name": "b", "configMap": {"name": "settings"}},
                        {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "d", "projected": {"sources": [{"secret": {"name": "token"}}]}}],
            "containers": [{"name": "x", "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                                                  {"name": "V", "value": "plain"}],
                            "envFrom": [{"configMapRef": {"name": "more"}}]}]
        }));
        let r = references(&j);
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(r.secrets, set(&["db", "pull", "tls", "token"]));
        assert_eq!(r.config_maps, set(&["more", "settings"]));
        assert_eq!(r.claims, set(&["data"]));
        assert_eq!(r.service_accounts, set(&["robot"]));
        let snap = json!({"kind": "VolumeSnapshot", "spec": {"source": {"persistentVolumeClaimName": "data"}}});
        assert_eq!(references(&snap).claims, set(&["data"]));
        assert!(references(&job(json!({"containers": [{"name": "x"}]}))).is_empty());
    }
}
