//! Keeping the API server pointed at the webhook: the certificate
//! material in its Secret, and the MutatingWebhookConfiguration whose
//! authorship webhook covers exactly the kinds the loaded policies target,
//! trusting Runbook's CA.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::core::{ApiResource, DynamicObject};
use serde_json::{Value, json};

use super::WebhookError;
use super::tls::Material;

/// The name of the authorship webhook inside its configuration.
pub const AUTHORSHIP_WEBHOOK: &str = "authorship.runbook.dev";
/// Where the authorship webhook is served.
pub const AUTHORSHIP_PATH: &str = "/authorship";
/// The annotation with which cert-manager injects a CA bundle; where it
/// is, the bundle is cert-manager's to keep.
pub const CERT_MANAGER_INJECT: &str = "cert-manager.io/inject-ca-from";

/// Where the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A Service in front of the replicas (in a cluster).
    Service {
        namespace: String,
        name: String,
        port: u16,
    },
    /// A URL (an API server that can reach the operator directly: tests,
    /// an operator run outside the cluster).
    Url(String),
}

impl Endpoint {
    /// The names the serving certificate must carry.
    pub fn hosts(&self) -> Vec<String> {
        match self {
            Endpoint::Service {
                namespace, name, ..
            } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
                format!("{name}.{namespace}"),
                name.clone(),
            ],
            Endpoint::Url(url) => {
                let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
                let authority = rest.split('/').next().unwrap_or(rest);
                let host = match authority.strip_prefix('[') {
                    Some(v6) => v6.split(']').next().unwrap_or(v6),
                    None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
                };
                vec![host.to_string()]
            }
        }
    }

    fn client_config(&self, path: &str, ca_bundle: Option<&str>) -> Value {
        let mut c = match self {
            Endpoint::Service {
                namespace,
                name,
                port,
            } => {
                json!({"service": {"namespace": namespace, "name": name, "port": port, "path": path}})
            }
            Endpoint::Url(url) => json!({"url": format!("{}{path}", url.trim_end_matches('/'))}),
        };
        if let Some(ca) = ca_bundle {
            c["caBundle"] = json!(base64_encode(ca.as_bytes()));
        }
        c
    }
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// What to do with the material a Secret holds.
enum Next {
    /// It is good: use it.
    Keep(Material),
    /// Write this (new, or renewed).
    Write(Material),
}

/// The material to use given what Secret `secret` holds (`data`).
fn next_material(
    data: &BTreeMap<String, Vec<u8>>,
    hosts: &[String],
    now: Timestamp,
    secret: &str,
) -> Result<Next, WebhookError> {
    if data.is_empty() {
        return Ok(Next::Write(Material::generate(hosts, now)?));
    }
    match Material::from_data(data) {
        Ok(m) => match m.due(hosts, now) {
            None => Ok(Next::Keep(m)),
            Some(due) => Ok(Next::Write(m.renewed(due, hosts, now)?)),
        },
        // Unreadable: made anew (author records signed with the old key
        // are then no longer trusted; they are made again at the targets'
        // next edit).
        Err(e) => {
            tracing::warn!(
                "Secret {secret} does not hold webhook material ({e}); making new material"
            );
            Ok(Next::Write(Material::generate(hosts, now)?))
        }
    }
}

/// The Secret holding `next`, over what was `found` (its resourceVersion
/// kept, so that of replicas racing one write wins).
fn material_secret(namespace: &str, name: &str, found: Option<&Secret>, next: &Material) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            resource_version: found.and_then(|s| s.metadata.resource_version.clone()),
            labels: Some([("app.kubernetes.io/name".to_string(), "runbook".to_string())].into()),
            ..found.map(|s| s.metadata.clone()).unwrap_or_default()
        },
        data: Some(
            next.to_data()
                .into_iter()
                .map(|(k, v)| (k, ByteString(v)))
                .collect(),
        ),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The material in Secret `name` of `namespace`, made if the Secret is
/// missing or empty and renewed when due; written guarded by the
/// resourceVersion read, so that of replicas racing one write wins and
/// the others use it.
pub async fn material(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    hosts: &[String],
    now: Timestamp,
) -> Result<Material, WebhookError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = format!("{namespace}/{name}");
    for _ in 0..5 {
        let found = api
            .get_opt(name)
            .await
            .map_err(WebhookError::api("reading Secret", &secret))?;
        let data: BTreeMap<String, Vec<u8>> = found
            .as_ref()
            .and_then(|s| s.data.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        let next = match next_material(&data, hosts, now, &secret)? {
            Next::Keep(m) => return Ok(m),
            Next::Write(m) => m,
        };
        let object = material_secret(namespace, name, found.as_ref(), &next);
        let written = match &found {
            Some(_) => api.replace(name, &PostParams::default(), &object).await,
            None => api.create(&PostParams::default(), &object).await,
        };
        match written {
            Ok(_) => {
                tracing::info!(%secret, not_after = %next.cert_not_after, "webhook certificate written");
                return Ok(next);
            }
            // Another replica wrote first: read what it wrote.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 403 && found.is_none() => {
                return Err(WebhookError::SecretNotCreatable {
                    secret,
                    message: s.message,
                });
            }
            Err(e) => return Err(WebhookError::api("writing Secret", secret)(e)),
        }
    }
    Err(WebhookError::Contended(secret))
}

/// Which kind of webhook configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Configures {
    /// `MutatingWebhookConfiguration` (the authorship webhook).
    Mutating,
    /// `ValidatingWebhookConfiguration` (the policy webhook).
    Validating,
}

impl Configures {
    fn kind(self) -> &'static str {
        match self {
            Configures::Mutating => "MutatingWebhookConfiguration",
            Configures::Validating => "ValidatingWebhookConfiguration",
        }
    }

    fn resource(self) -> ApiResource {
        let kind = self.kind();
        ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
        }
    }
}

/// One rule of the authorship webhook: creates and updates of a kind.
pub fn rule(group: &str, version: &str, plural: &str) -> Value {
    json!({"operations": ["CREATE", "UPDATE"], "apiGroups": [group], "apiVersions": [version],
           "resources": [plural], "scope": "*"})
}

/// The authorship webhook as it should be: its rules and where it is,
/// the rest (failure policy, timeout, selectors) as `live` has it, or the
/// defaults: failures ignored (a target written while no replica answers
/// simply has no author, which refuses what needs one), 5 s.
pub fn authorship_webhook(
    live: Option<&Value>,
    endpoint: &Endpoint,
    ca: Option<&str>,
    rules: &[Value],
) -> Value {
    let mut w = webhook(live, AUTHORSHIP_WEBHOOK, AUTHORSHIP_PATH, endpoint, ca);
    w["rules"] = json!(rules);
    defaults(&mut w, &[("reinvocationPolicy", json!("IfNeeded"))]);
    w
}

/// A webhook named `name`, served at `path` of `endpoint`, over what is
/// `live`: trusting `ca` (without a CA of ours, the live bundle, which
/// cert-manager keeps, stays as it is), reviews v1, no side effects.
fn webhook(
    live: Option<&Value>,
    name: &str,
    path: &str,
    endpoint: &Endpoint,
    ca: Option<&str>,
) -> Value {
    let mut w = live.cloned().unwrap_or_else(|| json!({}));
    let mut client = endpoint.client_config(path, ca);
    if ca.is_none()
        && let Some(b) = live.and_then(|l| l.pointer("/clientConfig/caBundle"))
    {
        client["caBundle"] = b.clone();
    }
    w["name"] = json!(name);
    w["clientConfig"] = client;
    w["admissionReviewVersions"] = json!(["v1"]);
    w["sideEffects"] = json!("None");
    w
}

/// Runbook's defaults for what an administrator may set on a webhook
/// (kept where set): failures ignored, 5 s, equivalent versions matched,
/// and `more`.
fn defaults(w: &mut Value, more: &[(&str, Value)]) {
    let common = [
        ("failurePolicy", json!("Ignore")),
        ("timeoutSeconds", json!(5)),
        ("matchPolicy", json!("Equivalent")),
    ];
    for (k, v) in common.iter().chain(more) {
        if w.get(*k).is_none_or(Value::is_null) {
            w[*k] = v.clone();
        }
    }
}

/// The policy webhook as it should be: creates and updates of ConfigMaps
/// labelled `label=true` in `namespaces` (all when empty), at
/// `endpoint`; failure policy and timeout as `live` has them, or the
/// defaults: failures ignored (the reload checks every version it loads,
/// so a policy written while no replica answers is still refused there),
/// 5 s.
pub fn policies_webhook(
    live: Option<&Value>,
    endpoint: &Endpoint,
    ca: Option<&str>,
    label: &str,
    namespaces: &[String],
) -> Value {
    let (name, path) = (
        super::policies::POLICIES_WEBHOOK,
        super::policies::POLICIES_PATH,
    );
    let mut w = webhook(live, name, path, endpoint, ca);
    w["rules"] = json!([{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                         "apiVersions": ["v1"], "resources": ["configmaps"], "scope": "Namespaced"}]);
    w["objectSelector"] = json!({"matchLabels": {label: "true"}});
    w["namespaceSelector"] = if namespaces.is_empty() {
        json!({})
    } else {
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                     "values": namespaces}]})
    };
    defaults(&mut w, &[]);
    w
}

/// Bring the `configures` configuration `name` in step: its webhook
/// `webhook` as `desired` makes it from the live one (if any) and the CA
/// to trust (`None`: cert-manager injects it, and the live bundle is
/// kept). `created_with` says what a configuration made from nothing
/// carries beside (a namespace selector, say); an existing one keeps its
/// own. Writes only when something differs.
pub async fn keep_in_step(
    client: &kube::Client,
    configures: Configures,
    name: &str,
    webhook: &str,
    material: &Material,
    desired: impl Fn(Option<&Value>, Option<&str>) -> Value,
    created_with: Option<&Value>,
) -> Result<bool, WebhookError> {
    let kind = configures.kind();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &configures.resource());
    let object = format!("{kind} {name}");
    let live = api
        .get_opt(name)
        .await
        .map_err(WebhookError::api("reading", &object))?;
    let Some(live) = live else {
        let mut hook = desired(created_with, Some(&material.ca_bundle));
        if let Some(extra) = created_with.and_then(Value::as_object) {
            for (k, v) in extra {
                if hook.get(k).is_none() {
                    hook[k] = v.clone();
                }
            }
        }
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "runbook"}},
            "webhooks": [hook],
        }))
        .map_err(|source| WebhookError::Build {
            kind,
            name: name.to_string(),
            source,
        })?;
        api.create(&PostParams::default(), &obj)
            .await
            .map_err(WebhookError::api("creating", object))?;
        return Ok(true);
    };
    let injected = live
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CERT_MANAGER_INJECT));
    let ca = (!injected).then_some(material.ca_bundle.as_str());
    let mut webhooks: Vec<Value> = live
        .data
        .get("webhooks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let at = webhooks
        .iter()
        .position(|w| w.get("name").and_then(Value::as_str) == Some(webhook));
    let desired = desired(at.map(|i| &webhooks[i]), ca);
    match at {
        Some(i) if webhooks[i] == desired => return Ok(false),
        Some(i) => webhooks[i] = desired,
        None => webhooks.push(desired),
    }
    let mut updated = live.clone();
    updated.data["webhooks"] = json!(webhooks);
    api.replace(name, &PostParams::default(), &updated)
        .await
        .map_err(WebhookError::api("updating", object))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The material's Secret as the API server fails it: each failure is
    /// told as what it is, with the API server's status kept.
    #[tokio::test]
    async fn the_materials_failures_keep_the_api_servers_answer() {
        use runbook_sandbox::{ApiVerb, Denied, Sandbox};
        let now: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap_or_default();
        let hosts = ["127.0.0.1".to_string()];
        let sandbox = Sandbox::default();
        let client = sandbox.client();
        // The read fails with a 503: the API server's failure, not a
        // missing Secret.
        sandbox
            .faults()
            .fail_next(1, Some(ApiVerb::Get), Some("secrets"), 503);
        match material(&client, "default", "hook", &hosts, now).await {
            Err(
                e @ WebhookError::Api {
                    doing: "reading Secret",
                    ..
                },
            ) => {
                assert!(
                    matches!(&e, WebhookError::Api { source: kube::Error::Api(s), .. } if s.code == 503)
                );
                assert!(
                    e.to_string().starts_with("reading Secret default/hook: "),
                    "{e}"
                );
            }
            other => panic!("expected the read's failure, got {other:?}"),
        }
        // Missing, and Runbook may not create it: says what to do.
        sandbox.faults().deny(Denied {
            verb: ApiVerb::Create,
            group: String::new(),
            resource: "secrets".into(),
            namespace: None,
        });
        match material(&client, "default", "hook", &hosts, now).await {
            Err(e @ WebhookError::SecretNotCreatable { .. }) => {
                assert!(e.to_string().contains("create it empty"), "{e}");
            }
            other => panic!("expected the refusal to create, got {other:?}"),
        }
        sandbox.faults().clear();
        // Then made, and read back as made.
        let made = material(&client, "default", "hook", &hosts, now).await;
        let again = material(&client, "default", "hook", &hosts, now).await;
        assert!(made.is_ok() && made.ok() == again.ok());
    }

    #[test]
    fn an_endpoint_names_the_hosts_its_certificate_needs() {
        let svc = Endpoint::Service {
            namespace: "runbook-system".into(),
            name: "runbook-webhook".into(),
            port: 443,
        };
        assert!(
            svc.hosts()
                .contains(&"runbook-webhook.runbook-system.svc".to_string())
        );
        assert_eq!(
            Endpoint::Url("https://127.0.0.1:9443".into()).hosts(),
            ["127.0.0.1"]
        );
        assert_eq!(
            Endpoint::Url("https://[::1]:9443/x".into()).hosts(),
            ["::1"]
        );
        assert_eq!(
            Endpoint::Url("https://runbook.example".into()).hosts(),
            ["runbook.example"]
        );
    }

    #[test]
    fn the_webhook_keeps_what_an_administrator_set_and_cert_managers_bundle() {
        let url = Endpoint::Url("https://127.0.0.1:9443".into());
        let rules = vec![rule("runbook.dev", "v1alpha1", "evaluators")];
        let fresh = authorship_webhook(None, &url, Some("CA"), &rules);
        assert_eq!(fresh["failurePolicy"], "Ignore");
        assert_eq!(
            fresh["clientConfig"]["url"],
            "https://127.0.0.1:9443/authorship"
        );
        assert_eq!(fresh["clientConfig"]["caBundle"], base64_encode(b"CA"));
        let live = json!({"name": AUTHORSHIP_WEBHOOK, "failurePolicy": "Fail", "timeoutSeconds": 2,
                          "namespaceSelector": {"matchLabels": {"team": "a"}},
                          "clientConfig": {"caBundle": "Y2VydC1tYW5hZ2Vy"}});
        let kept = authorship_webhook(Some(&live), &url, None, &rules);
        assert_eq!(kept["failurePolicy"], "Fail");
        assert_eq!(kept["timeoutSeconds"], 2);
        assert_eq!(kept["namespaceSelector"]["matchLabels"]["team"], "a");
        assert_eq!(kept["clientConfig"]["caBundle"], "Y2VydC1tYW5hZ2Vy");
        assert_eq!(kept["rules"][0]["resources"][0], "evaluators");
    }
}
