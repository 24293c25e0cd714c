//! Protobuf request bodies, as kubectl sends them for `kubectl create
//! <generator>` (namespace, configmap, secret, deployment, job, cronjob,
//! service, serviceaccount, role, rolebinding, ...) and `kubectl auth
//! can-i`. A real API server accepts them for every built-in kind; the
//! sandbox decodes those kinds with the `k8s-pb` bindings (prost) into the
//! JSON it stores.
//!
//! The body is the `k8s\0` magic, then a `runtime.Unknown` envelope naming
//! the apiVersion and kind around the object's own encoding. Each
//! conversion takes the fields it knows out of the decoded message and
//! then checks that nothing is left: a field it does not know is refused
//! (415, naming the message) rather than silently dropped.

use std::collections::BTreeMap;
use std::mem::take;

use base64::Engine;
use k8s_pb::api::{apps, authorization, batch, core, rbac};
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{Map, Value, json};

use super::status::ApiError;

/// The media type of a protobuf body.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// Why a body could not be read: the message (and what of it) at fault.
type Unread = String;

/// The object a protobuf request body carries, as JSON.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let refuse = |why: String| {
        ApiError::unsupported_media(format!(
            "the sandbox could not read this protobuf body ({why}); send it as JSON (application/json)"
        ))
    };
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| refuse("it does not start with the k8s protobuf magic".into()))?;
    let unknown = Unknown::decode(envelope).map_err(|e| refuse(format!("the envelope: {e}")))?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let raw = unknown.raw.unwrap_or_default();
    let raw = raw.as_slice();
    let decoded = |e: prost::DecodeError| format!("{api_version} {kind}: {e}");
    let object = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => namespace(core::v1::Namespace::decode(raw).map_err(decoded)),
        ("v1", "ConfigMap") => config_map(core::v1::ConfigMap::decode(raw).map_err(decoded)),
        ("v1", "Secret") => secret(core::v1::Secret::decode(raw).map_err(decoded)),
        ("v1", "ServiceAccount") => {
            service_account(core::v1::ServiceAccount::decode(raw).map_err(decoded))
        }
        ("v1", "Service") => service(core::v1::Service::decode(raw).map_err(decoded)),
        ("apps/v1", "Deployment") => deployment(apps::v1::Deployment::decode(raw).map_err(decoded)),
        ("batch/v1", "Job") => job(batch::v1::Job::decode(raw).map_err(decoded)),
        ("batch/v1", "CronJob") => cron_job(batch::v1::CronJob::decode(raw).map_err(decoded)),
        ("rbac.authorization.k8s.io/v1", "Role") => {
            role(rbac::v1::Role::decode(raw).map_err(decoded))
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            cluster_role(rbac::v1::ClusterRole::decode(raw).map_err(decoded))
        }
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
            role_binding(rbac::v1::RoleBinding::decode(raw).map_err(decoded))
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            cluster_role_binding(rbac::v1::ClusterRoleBinding::decode(raw).map_err(decoded))
        }
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => self_subject_access_review(
            authorization::v1::SelfSubjectAccessReview::decode(raw).map_err(decoded),
        ),
        _ => Err(format!(
            "{api_version:?} {kind:?} is not among the kinds it reads from protobuf"
        )),
    }
    .map_err(refuse)?;
    let mut object = object;
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind);
    Ok(object)
}

/// Nothing of `rest` is left unread.
fn done<T: Default + PartialEq + std::fmt::Debug>(rest: T, message: &str) -> Result<(), Unread> {
    if rest == T::default() {
        Ok(())
    } else {
        let debug = format!("{rest:?}");
        let field = first_set_field(&debug).unwrap_or("a field");
        Err(format!("{message}.{field} is set, which it does not read"))
    }
}

/// The first field a message's `Debug` text shows set (`Some(..)`, or a
/// list or map with something in it), to name it in the refusal.
fn first_set_field(debug: &str) -> Option<&str> {
    let body = &debug[debug.find('{')? + 1..];
    body.split(", ").find_map(|part| {
        let (name, value) = part.trim().split_once(": ")?;
        let set = value.starts_with("Some(")
            || (value.starts_with('[') && !value.starts_with("[]"))
            || (value.starts_with('{') && !value.starts_with("{}"));
        set.then_some(name)
    })
}

/// An object of the fields that are set.
fn obj(fields: Vec<(&str, Option<Value>)>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect::<Map<_, _>>(),
    )
}

/// A field Go keeps behind a pointer: set (even to zero) or not.
fn opt<T: Into<Value>>(v: Option<T>) -> Option<Value> {
    v.map(Into::into)
}

/// A Go value field (`string`, `bool`, `int32` with `omitempty`): its
/// protobuf encoding always carries it, and its zero value means unset.
trait GoValue: Into<Value> {
    fn is_zero(&self) -> bool;
}

impl GoValue for String {
    fn is_zero(&self) -> bool {
        self.is_empty()
    }
}

impl GoValue for bool {
    fn is_zero(&self) -> bool {
        !*self
    }
}

impl GoValue for i32 {
    fn is_zero(&self) -> bool {
        *self == 0
    }
}

impl GoValue for i64 {
    fn is_zero(&self) -> bool {
        *self == 0
    }
}

fn val<T: GoValue>(v: Option<T>) -> Option<Value> {
    v.filter(|x| !x.is_zero()).map(Into::into)
}

fn strings(v: Vec<String>) -> Option<Value> {
    (!v.is_empty()).then(|| json!(v))
}

fn string_map(m: BTreeMap<String, String>) -> Option<Value> {
    (!m.is_empty()).then(|| json!(m))
}

fn list<T>(v: Vec<T>, f: impl Fn(T) -> Result<Value, Unread>) -> Result<Option<Value>, Unread> {
    if v.is_empty() {
        return Ok(None);
    }
    v.into_iter()
        .map(f)
        .collect::<Result<Vec<_>, _>>()
        .map(|l| Some(Value::Array(l)))
}

fn message<T>(
    v: Option<T>,
    f: impl FnOnce(T) -> Result<Value, Unread>,
) -> Result<Option<Value>, Unread> {
    v.map(f).transpose()
}

fn int_or_string(v: IntOrString) -> Value {
    match (v.r#type, v.int_val, v.str_val) {
        (Some(1), _, Some(s)) => json!(s),
        (_, Some(i), _) => json!(i),
        (_, _, Some(s)) => json!(s),
        _ => json!(0),
    }
}

fn quantities(
    m: BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>,
) -> Option<Value> {
    (!m.is_empty()).then(|| {
        Value::Object(
            m.into_iter()
                .map(|(k, q)| (k, json!(q.string.unwrap_or_default())))
                .collect(),
        )
    })
}

fn object_meta(mut m: meta::ObjectMeta) -> Result<Value, Unread> {
    // What the server sets itself: a create or replace overwrites it.
    m.creation_timestamp = None;
    m.deletion_timestamp = None;
    m.managed_fields.clear();
    let v = obj(vec![
        ("name", val(take(&mut m.name))),
        ("generateName", val(take(&mut m.generate_name))),
        ("namespace", val(take(&mut m.namespace))),
        ("uid", val(take(&mut m.uid))),
        ("resourceVersion", val(take(&mut m.resource_version))),
        ("generation", val(take(&mut m.generation))),
        ("labels", string_map(take(&mut m.labels))),
        ("annotations", string_map(take(&mut m.annotations))),
        ("finalizers", strings(take(&mut m.finalizers))),
        (
            "ownerReferences",
            list(take(&mut m.owner_references), |mut o| {
                let v = obj(vec![
                    ("apiVersion", val(take(&mut o.api_version))),
                    ("kind", val(take(&mut o.kind))),
                    ("name", val(take(&mut o.name))),
                    ("uid", val(take(&mut o.uid))),
                    ("controller", opt(take(&mut o.controller))),
                    ("blockOwnerDeletion", opt(take(&mut o.block_owner_deletion))),
                ]);
                done(o, "OwnerReference").map(|_| v)
            })?,
        ),
    ]);
    m.self_link = None;
    m.deletion_grace_period_seconds = None;
    done(m, "ObjectMeta").map(|_| v)
}

fn label_selector(mut s: meta::LabelSelector) -> Result<Value, Unread> {
    let v = obj(vec![
        ("matchLabels", string_map(take(&mut s.match_labels))),
        (
            "matchExpressions",
            list(take(&mut s.match_expressions), |mut r| {
                let v = obj(vec![
                    ("key", val(take(&mut r.key))),
                    ("operator", val(take(&mut r.operator))),
                    ("values", strings(take(&mut r.values))),
                ]);
                done(r, "LabelSelectorRequirement").map(|_| v)
            })?,
        ),
    ]);
    done(s, "LabelSelector").map(|_| v)
}

fn metadata(m: Option<meta::ObjectMeta>) -> Result<Option<Value>, Unread> {
    message(m, object_meta)
}

fn namespace(ns: Result<core::v1::Namespace, Unread>) -> Result<Value, Unread> {
    let mut ns = ns?;
    let spec = message(take(&mut ns.spec), |mut s| {
        let v = obj(vec![("finalizers", strings(take(&mut s.finalizers)))]);
        done(s, "NamespaceSpec").map(|_| v)
    })?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut ns.metadata))?),
        ("spec", spec),
    ]);
    ns.status = None;
    done(ns, "Namespace").map(|_| v)
}

fn config_map(cm: Result<core::v1::ConfigMap, Unread>) -> Result<Value, Unread> {
    let mut cm = cm?;
    let binary = take(&mut cm.binary_data);
    let v = obj(vec![
        ("metadata", metadata(take(&mut cm.metadata))?),
        ("immutable", opt(take(&mut cm.immutable))),
        ("data", string_map(take(&mut cm.data))),
        ("binaryData", bytes_map(binary)),
    ]);
    done(cm, "ConfigMap").map(|_| v)
}

/// Bytes as JSON carries them: base64.
fn bytes_map(m: BTreeMap<String, Vec<u8>>) -> Option<Value> {
    (!m.is_empty()).then(|| {
        Value::Object(
            m.into_iter()
                .map(|(k, b)| {
                    (
                        k,
                        json!(base64::engine::general_purpose::STANDARD.encode(b)),
                    )
                })
                .collect(),
        )
    })
}

fn secret(s: Result<core::v1::Secret, Unread>) -> Result<Value, Unread> {
    let mut s = s?;
    let data = take(&mut s.data);
    let v = obj(vec![
        ("metadata", metadata(take(&mut s.metadata))?),
        ("immutable", opt(take(&mut s.immutable))),
        ("type", val(take(&mut s.r#type))),
        ("data", bytes_map(data)),
        ("stringData", string_map(take(&mut s.string_data))),
    ]);
    done(s, "Secret").map(|_| v)
}

fn local_reference(mut r: core::v1::LocalObjectReference) -> Result<Value, Unread> {
    let v = obj(vec![("name", val(take(&mut r.name)))]);
    done(r, "LocalObjectReference").map(|_| v)
}

fn service_account(sa: Result<core::v1::ServiceAccount, Unread>) -> Result<Value, Unread> {
    let mut sa = sa?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut sa.metadata))?),
        (
            "automountServiceAccountToken",
            opt(take(&mut sa.automount_service_account_token)),
        ),
        (
            "imagePullSecrets",
            list(take(&mut sa.image_pull_secrets), local_reference)?,
        ),
        (
            "secrets",
            list(take(&mut sa.secrets), |mut r| {
                let v = obj(vec![
                    ("name", val(take(&mut r.name))),
                    ("namespace", val(take(&mut r.namespace))),
                ]);
                done(r, "ObjectReference").map(|_| v)
            })?,
        ),
    ]);
    done(sa, "ServiceAccount").map(|_| v)
}

fn service(svc: Result<core::v1::Service, Unread>) -> Result<Value, Unread> {
    let mut svc = svc?;
    let spec = message(take(&mut svc.spec), |mut s| {
        let v = obj(vec![
            ("type", val(take(&mut s.r#type))),
            ("selector", string_map(take(&mut s.selector))),
            ("clusterIP", val(take(&mut s.cluster_ip))),
            ("clusterIPs", strings(take(&mut s.cluster_ips))),
            ("externalName", val(take(&mut s.external_name))),
            ("sessionAffinity", val(take(&mut s.session_affinity))),
            ("loadBalancerIP", val(take(&mut s.load_balancer_ip))),
            (
                "externalTrafficPolicy",
                val(take(&mut s.external_traffic_policy)),
            ),
            (
                "healthCheckNodePort",
                val(take(&mut s.health_check_node_port)),
            ),
            (
                "publishNotReadyAddresses",
                val(take(&mut s.publish_not_ready_addresses)),
            ),
            (
                "ports",
                list(take(&mut s.ports), |mut p| {
                    let v = obj(vec![
                        ("name", val(take(&mut p.name))),
                        ("protocol", val(take(&mut p.protocol))),
                        ("port", val(take(&mut p.port))),
                        ("targetPort", take(&mut p.target_port).map(int_or_string)),
                        ("nodePort", val(take(&mut p.node_port))),
                    ]);
                    done(p, "ServicePort").map(|_| v)
                })?,
            ),
        ]);
        done(s, "ServiceSpec").map(|_| v)
    })?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut svc.metadata))?),
        ("spec", spec),
    ]);
    svc.status = None;
    done(svc, "Service").map(|_| v)
}

fn container(mut c: core::v1::Container) -> Result<Value, Unread> {
    let v = obj(vec![
        ("name", val(take(&mut c.name))),
        ("image", val(take(&mut c.image))),
        ("command", strings(take(&mut c.command))),
        ("args", strings(take(&mut c.args))),
        ("workingDir", val(take(&mut c.working_dir))),
        ("imagePullPolicy", val(take(&mut c.image_pull_policy))),
        (
            "terminationMessagePath",
            val(take(&mut c.termination_message_path)),
        ),
        (
            "terminationMessagePolicy",
            val(take(&mut c.termination_message_policy)),
        ),
        ("stdin", val(take(&mut c.stdin))),
        ("stdinOnce", val(take(&mut c.stdin_once))),
        ("tty", val(take(&mut c.tty))),
        (
            "ports",
            list(take(&mut c.ports), |mut p| {
                let v = obj(vec![
                    ("name", val(take(&mut p.name))),
                    ("containerPort", val(take(&mut p.container_port))),
                    ("hostPort", val(take(&mut p.host_port))),
                    ("hostIP", val(take(&mut p.host_ip))),
                    ("protocol", val(take(&mut p.protocol))),
                ]);
                done(p, "ContainerPort").map(|_| v)
            })?,
        ),
        (
            "env",
            list(take(&mut c.env), |mut e| {
                let v = obj(vec![
                    ("name", val(take(&mut e.name))),
                    ("value", val(take(&mut e.value))),
                ]);
                done(e, "EnvVar").map(|_| v)
            })?,
        ),
        (
            "resources",
            message(take(&mut c.resources), |mut r| {
                let v = obj(vec![
                    ("limits", quantities(take(&mut r.limits))),
                    ("requests", quantities(take(&mut r.requests))),
                ]);
                done(r, "ResourceRequirements").map(|_| v)
            })?,
        ),
    ]);
    done(c, "Container").map(|_| v)
}

fn pod_template(mut t: core::v1::PodTemplateSpec) -> Result<Value, Unread> {
    let spec = message(take(&mut t.spec), |mut s| {
        let v = obj(vec![
            ("containers", list(take(&mut s.containers), container)?),
            (
                "initContainers",
                list(take(&mut s.init_containers), container)?,
            ),
            ("restartPolicy", val(take(&mut s.restart_policy))),
            (
                "terminationGracePeriodSeconds",
                opt(take(&mut s.termination_grace_period_seconds)),
            ),
            (
                "activeDeadlineSeconds",
                opt(take(&mut s.active_deadline_seconds)),
            ),
            ("dnsPolicy", val(take(&mut s.dns_policy))),
            ("nodeSelector", string_map(take(&mut s.node_selector))),
            ("serviceAccountName", val(take(&mut s.service_account_name))),
            ("schedulerName", val(take(&mut s.scheduler_name))),
            ("hostNetwork", val(take(&mut s.host_network))),
            ("hostPID", val(take(&mut s.host_pid))),
            ("hostIPC", val(take(&mut s.host_ipc))),
            ("nodeName", val(take(&mut s.node_name))),
            ("serviceAccount", val(take(&mut s.service_account))),
            ("hostname", val(take(&mut s.hostname))),
            ("subdomain", val(take(&mut s.subdomain))),
            ("priorityClassName", val(take(&mut s.priority_class_name))),
            (
                "imagePullSecrets",
                list(take(&mut s.image_pull_secrets), local_reference)?,
            ),
        ]);
        done(s, "PodSpec").map(|_| v)
    })?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut t.metadata))?),
        ("spec", spec),
    ]);
    done(t, "PodTemplateSpec").map(|_| v)
}

fn deployment(d: Result<apps::v1::Deployment, Unread>) -> Result<Value, Unread> {
    let mut d = d?;
    let spec = message(take(&mut d.spec), |mut s| {
        let v = obj(vec![
            ("replicas", opt(take(&mut s.replicas))),
            ("selector", message(take(&mut s.selector), label_selector)?),
            ("template", message(take(&mut s.template), pod_template)?),
            (
                "strategy",
                message(take(&mut s.strategy), |mut st| {
                    let v = obj(vec![
                        ("type", val(take(&mut st.r#type))),
                        (
                            "rollingUpdate",
                            message(take(&mut st.rolling_update), |mut r| {
                                let v = obj(vec![
                                    (
                                        "maxUnavailable",
                                        take(&mut r.max_unavailable).map(int_or_string),
                                    ),
                                    ("maxSurge", take(&mut r.max_surge).map(int_or_string)),
                                ]);
                                done(r, "RollingUpdateDeployment").map(|_| v)
                            })?,
                        ),
                    ]);
                    done(st, "DeploymentStrategy").map(|_| v)
                })?,
            ),
            ("minReadySeconds", val(take(&mut s.min_ready_seconds))),
            (
                "revisionHistoryLimit",
                opt(take(&mut s.revision_history_limit)),
            ),
            ("paused", val(take(&mut s.paused))),
            (
                "progressDeadlineSeconds",
                opt(take(&mut s.progress_deadline_seconds)),
            ),
        ]);
        done(s, "DeploymentSpec").map(|_| v)
    })?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut d.metadata))?),
        ("spec", spec),
    ]);
    d.status = None;
    done(d, "Deployment").map(|_| v)
}

fn job_spec(mut s: batch::v1::JobSpec) -> Result<Value, Unread> {
    let v = obj(vec![
        ("parallelism", opt(take(&mut s.parallelism))),
        ("completions", opt(take(&mut s.completions))),
        (
            "activeDeadlineSeconds",
            opt(take(&mut s.active_deadline_seconds)),
        ),
        ("backoffLimit", opt(take(&mut s.backoff_limit))),
        ("selector", message(take(&mut s.selector), label_selector)?),
        ("manualSelector", opt(take(&mut s.manual_selector))),
        ("template", message(take(&mut s.template), pod_template)?),
        (
            "ttlSecondsAfterFinished",
            opt(take(&mut s.ttl_seconds_after_finished)),
        ),
        ("completionMode", opt(take(&mut s.completion_mode))),
        ("suspend", opt(take(&mut s.suspend))),
    ]);
    done(s, "JobSpec").map(|_| v)
}

fn job(j: Result<batch::v1::Job, Unread>) -> Result<Value, Unread> {
    let mut j = j?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut j.metadata))?),
        ("spec", message(take(&mut j.spec), job_spec)?),
    ]);
    j.status = None;
    done(j, "Job").map(|_| v)
}

fn cron_job(c: Result<batch::v1::CronJob, Unread>) -> Result<Value, Unread> {
    let mut c = c?;
    let spec = message(take(&mut c.spec), |mut s| {
        let v = obj(vec![
            ("schedule", val(take(&mut s.schedule))),
            ("timeZone", opt(take(&mut s.time_zone))),
            (
                "startingDeadlineSeconds",
                opt(take(&mut s.starting_deadline_seconds)),
            ),
            ("concurrencyPolicy", val(take(&mut s.concurrency_policy))),
            ("suspend", opt(take(&mut s.suspend))),
            (
                "successfulJobsHistoryLimit",
                opt(take(&mut s.successful_jobs_history_limit)),
            ),
            (
                "failedJobsHistoryLimit",
                opt(take(&mut s.failed_jobs_history_limit)),
            ),
            (
                "jobTemplate",
                message(take(&mut s.job_template), |mut t| {
                    let v = obj(vec![
                        ("metadata", metadata(take(&mut t.metadata))?),
                        ("spec", message(take(&mut t.spec), job_spec)?),
                    ]);
                    done(t, "JobTemplateSpec").map(|_| v)
                })?,
            ),
        ]);
        done(s, "CronJobSpec").map(|_| v)
    })?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut c.metadata))?),
        ("spec", spec),
    ]);
    c.status = None;
    done(c, "CronJob").map(|_| v)
}

fn policy_rules(rules: Vec<rbac::v1::PolicyRule>) -> Result<Option<Value>, Unread> {
    list(rules, |mut r| {
        let v = obj(vec![
            ("verbs", strings(take(&mut r.verbs))),
            ("apiGroups", strings(take(&mut r.api_groups))),
            ("resources", strings(take(&mut r.resources))),
            ("resourceNames", strings(take(&mut r.resource_names))),
            ("nonResourceURLs", strings(take(&mut r.non_resource_ur_ls))),
        ]);
        done(r, "PolicyRule").map(|_| v)
    })
}

fn role(r: Result<rbac::v1::Role, Unread>) -> Result<Value, Unread> {
    let mut r = r?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut r.metadata))?),
        ("rules", policy_rules(take(&mut r.rules))?),
    ]);
    done(r, "Role").map(|_| v)
}

fn cluster_role(r: Result<rbac::v1::ClusterRole, Unread>) -> Result<Value, Unread> {
    let mut r = r?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut r.metadata))?),
        ("rules", policy_rules(take(&mut r.rules))?),
    ]);
    done(r, "ClusterRole").map(|_| v)
}

fn binding(
    subjects: Vec<rbac::v1::Subject>,
    role_ref: Option<rbac::v1::RoleRef>,
) -> Result<Vec<(&'static str, Option<Value>)>, Unread> {
    Ok(vec![
        (
            "subjects",
            list(subjects, |mut s| {
                let v = obj(vec![
                    ("kind", val(take(&mut s.kind))),
                    ("apiGroup", val(take(&mut s.api_group))),
                    ("name", val(take(&mut s.name))),
                    ("namespace", val(take(&mut s.namespace))),
                ]);
                done(s, "Subject").map(|_| v)
            })?,
        ),
        (
            "roleRef",
            message(role_ref, |mut r| {
                let v = obj(vec![
                    ("apiGroup", val(take(&mut r.api_group))),
                    ("kind", val(take(&mut r.kind))),
                    ("name", val(take(&mut r.name))),
                ]);
                done(r, "RoleRef").map(|_| v)
            })?,
        ),
    ])
}

fn role_binding(b: Result<rbac::v1::RoleBinding, Unread>) -> Result<Value, Unread> {
    let mut b = b?;
    let mut fields = vec![("metadata", metadata(take(&mut b.metadata))?)];
    fields.extend(binding(take(&mut b.subjects), take(&mut b.role_ref))?);
    done(b, "RoleBinding").map(|_| obj(fields))
}

fn cluster_role_binding(b: Result<rbac::v1::ClusterRoleBinding, Unread>) -> Result<Value, Unread> {
    let mut b = b?;
    let mut fields = vec![("metadata", metadata(take(&mut b.metadata))?)];
    fields.extend(binding(take(&mut b.subjects), take(&mut b.role_ref))?);
    done(b, "ClusterRoleBinding").map(|_| obj(fields))
}

fn self_subject_access_review(
    r: Result<authorization::v1::SelfSubjectAccessReview, Unread>,
) -> Result<Value, Unread> {
    let mut r = r?;
    let spec = message(take(&mut r.spec), |mut s| {
        let v = obj(vec![
            (
                "resourceAttributes",
                message(take(&mut s.resource_attributes), |mut a| {
                    let v = obj(vec![
                        ("namespace", val(take(&mut a.namespace))),
                        ("verb", val(take(&mut a.verb))),
                        ("group", val(take(&mut a.group))),
                        ("version", val(take(&mut a.version))),
                        ("resource", val(take(&mut a.resource))),
                        ("subresource", val(take(&mut a.subresource))),
                        ("name", val(take(&mut a.name))),
                    ]);
                    done(a, "ResourceAttributes").map(|_| v)
                })?,
            ),
            (
                "nonResourceAttributes",
                message(take(&mut s.non_resource_attributes), |mut a| {
                    let v = obj(vec![
                        ("path", val(take(&mut a.path))),
                        ("verb", val(take(&mut a.verb))),
                    ]);
                    done(a, "NonResourceAttributes").map(|_| v)
                })?,
            ),
        ]);
        done(s, "SelfSubjectAccessReviewSpec").map(|_| v)
    })?;
    let v = obj(vec![
        ("metadata", metadata(take(&mut r.metadata))?),
        ("spec", spec),
    ]);
    r.status = None;
    done(r, "SelfSubjectAccessReview").map(|_| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        let mut body = MAGIC.to_vec();
        body.extend(unknown.encode_to_vec());
        body
    }

    #[test]
    fn a_deployment_as_kubectl_create_sends_it() {
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let d = apps::v1::Deployment {
            metadata: Some(meta::ObjectMeta {
                name: Some("web".into()),
                labels: labels.clone(),
                creation_timestamp: Some(meta::Time::default()),
                ..Default::default()
            }),
            spec: Some(apps::v1::DeploymentSpec {
                replicas: Some(1),
                selector: Some(meta::LabelSelector {
                    match_labels: labels.clone(),
                    ..Default::default()
                }),
                template: Some(core::v1::PodTemplateSpec {
                    metadata: Some(meta::ObjectMeta {
                        labels,
                        ..Default::default()
                    }),
                    spec: Some(core::v1::PodSpec {
                        containers: vec![core::v1::Container {
                            name: Some("nginx".into()),
                            image: Some("nginx:1".into()),
                            resources: Some(Default::default()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                strategy: Some(Default::default()),
                ..Default::default()
            }),
            status: Some(Default::default()),
        };
        let v = decode(&envelope("apps/v1", "Deployment", d.encode_to_vec())).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "labels": {"app": "web"}},
                   "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "strategy": {},
                            "template": {"metadata": {"labels": {"app": "web"}},
                                         "spec": {"containers": [{"name": "nginx", "image": "nginx:1", "resources": {}}]}}}})
        );
    }

    #[test]
    fn secret_bytes_become_base64() {
        let s = core::v1::Secret {
            metadata: Some(meta::ObjectMeta {
                name: Some("s".into()),
                ..Default::default()
            }),
            data: BTreeMap::from([("k".to_string(), b"hi".to_vec())]),
            r#type: Some("Opaque".into()),
            ..Default::default()
        };
        let v = decode(&envelope("v1", "Secret", s.encode_to_vec())).unwrap();
        assert_eq!(v["data"]["k"], "aGk=");
        assert_eq!(v["type"], "Opaque");
    }

    #[test]
    fn a_field_it_does_not_read_is_refused_not_dropped() {
        let p = core::v1::Pod::default();
        let err = decode(&envelope("v1", "Pod", p.encode_to_vec())).unwrap_err();
        assert_eq!(err.code, 415);
        let d = apps::v1::Deployment {
            spec: Some(apps::v1::DeploymentSpec {
                template: Some(core::v1::PodTemplateSpec {
                    metadata: None,
                    spec: Some(core::v1::PodSpec {
                        tolerations: vec![Default::default()],
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = decode(&envelope("apps/v1", "Deployment", d.encode_to_vec())).unwrap_err();
        assert_eq!(err.code, 415);
        assert!(
            err.message.contains("PodSpec.tolerations is set"),
            "{}",
            err.message
        );
        assert_eq!(decode(b"{not protobuf").unwrap_err().code, 415);
        assert_eq!(decode(b"k8s\0\xff\xff").unwrap_err().code, 415);
    }
}
