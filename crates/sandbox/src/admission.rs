//! Admission webhooks, called as kube-apiserver calls them: the
//! MutatingWebhookConfigurations and ValidatingWebhookConfigurations
//! stored in the sandbox name webhooks; a create or update of an object
//! their rules, namespace selector and object selector match is sent to
//! each as an AdmissionReview (v1) over HTTPS, trusting the CA bundle the
//! configuration carries, within its timeout. A mutating webhook's
//! JSONPatch changes the object before it is validated and stored; a
//! denial refuses the request with the webhook's message; a webhook that
//! cannot be called refuses it too, unless its `failurePolicy` is
//! `Ignore`.
//!
//! A webhook is reached at its URL, or through the Service it names, as
//! kube-apiserver reaches one without aggregator routing: the request goes
//! to `https://<service>.<namespace>.svc:<port><path>`, the certificate
//! must carry that name, and the name is resolved when a connection is
//! made (an `ExternalName` Service to its external name, another to its
//! cluster IP, which nothing answers in the sandbox as no proxy runs).
//! Connections are kept and reused, so an open one outlives its Service,
//! as on a real server.
//!
//! Simpler than a real server: only `admission.k8s.io/v1` reviews are
//! sent, a mutating webhook is called once (no reinvocation), match
//! conditions (CEL) are not evaluated, and subresources and deletions are
//! not sent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::future::BoxFuture;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use serde_json::{Value, json};

use super::auth::UserInfo;
use super::registry::ResourceDef;
use super::status::ApiError;
use super::store::{Filter, Store};
use runbook_core::labels::Selector;

/// One webhook of a configuration.
#[derive(Clone, Debug)]
pub struct Webhook {
    /// The configuration's name and the webhook's.
    pub configuration: String,
    pub name: String,
    pub mutating: bool,
    /// The URL it is called at, or why its client config names none.
    pub url: Result<String, String>,
    /// PEM certificates the server's certificate must chain to.
    pub ca_bundle: Vec<u8>,
    pub ignore_failures: bool,
    pub timeout: Duration,
    rules: Vec<Value>,
    namespace_selector: Selector,
    object_selector: Selector,
}

/// The URL a webhook's client config names: its `url`, or its Service's
/// DNS name (resolved when a connection is made).
fn url_of(client: &Value) -> Result<String, String> {
    if let Some(url) = client.get("url").and_then(Value::as_str) {
        return Ok(url.to_string());
    }
    let svc = client
        .get("service")
        .ok_or("the webhook's clientConfig names neither a url nor a service")?;
    let text = |k: &str| svc.get(k).and_then(Value::as_str).unwrap_or("");
    let port = svc.get("port").and_then(Value::as_u64).unwrap_or(443);
    Ok(format!(
        "https://{}.{}.svc:{port}{}",
        text("name"),
        text("namespace"),
        text("path")
    ))
}

/// The host a name resolves to: a Service's (`<service>.<namespace>.svc`)
/// as the API server resolves it, any other name as it is.
fn resolve_service(store: &Store, name: &str) -> Result<String, String> {
    let Some((service, namespace)) = name
        .strip_suffix(".svc")
        .and_then(|n| n.split_once('.'))
        .filter(|(_, ns)| !ns.contains('.'))
    else {
        return Ok(name.to_string());
    };
    let not_found = || format!("service \"{service}\" not found");
    let def = store.def("", "services").ok_or_else(not_found)?;
    let bytes = store
        .get(&def, namespace, service)
        .map_err(|_| not_found())?;
    let object: Value = serde_json::from_slice(&bytes).map_err(|_| not_found())?;
    let spec = &object["spec"];
    match spec["type"].as_str().unwrap_or("ClusterIP") {
        "ExternalName" => Ok(spec["externalName"].as_str().unwrap_or("").to_string()),
        "ClusterIP" | "NodePort" | "LoadBalancer" => match spec["clusterIP"].as_str() {
            Some(ip) if !ip.is_empty() && ip != "None" => Ok(ip.to_string()),
            ip => Err(format!(
                "cannot route to service with ClusterIP {:?}",
                ip.unwrap_or("")
            )),
        },
        other => Err(format!("unsupported service type {other:?}")),
    }
}

/// Host names resolved at each new connection: a Service's through the
/// sandbox's store, then every name through the system's resolver.
#[derive(Clone)]
struct ServiceNames(Arc<Store>);

impl tower::Service<Name> for ServiceNames {
    type Response = std::vec::IntoIter<std::net::SocketAddr>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let host = resolve_service(&self.0, name.as_str());
        Box::pin(async move {
            let host = host.map_err(std::io::Error::other)?;
            let addrs: Vec<_> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            Ok(addrs.into_iter())
        })
    }
}

/// How the sandbox reaches a webhook: HTTPS by default; a simulation puts
/// the webhook's own code in its place.
pub trait Caller: Send + Sync {
    fn call(&self, hook: &Webhook, review: Value) -> BoxFuture<'static, Result<Value, String>>;
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// Every webhook of the stored configurations of one kind.
pub fn webhooks(store: &Store, mutating: bool) -> Vec<Webhook> {
    let plural = if mutating {
        "mutatingwebhookconfigurations"
    } else {
        "validatingwebhookconfigurations"
    };
    let Some(def) = store.def("admissionregistration.k8s.io", plural) else {
        return Vec::new();
    };
    let Ok(listed) = store.list(&def, &Filter::default(), None, None) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for bytes in listed.items {
        let Ok(config) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        let configuration = config
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        for w in config
            .get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let selector = |k: &str| {
                Selector::from_label_selector(w.get(k).unwrap_or(&Value::Null)).unwrap_or_else(
                    // A selector that cannot be read matches nothing.
                    |_| {
                        Selector(vec![runbook_core::labels::Requirement::Exists(
                            "\u{0}".into(),
                        )])
                    },
                )
            };
            let ca = w
                .pointer("/clientConfig/caBundle")
                .and_then(Value::as_str)
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .unwrap_or_default();
            out.push(Webhook {
                configuration: configuration.clone(),
                name: w
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                mutating,
                url: url_of(w.get("clientConfig").unwrap_or(&Value::Null)),
                ca_bundle: ca,
                ignore_failures: w.get("failurePolicy").and_then(Value::as_str) == Some("Ignore"),
                timeout: Duration::from_secs(
                    w.get("timeoutSeconds")
                        .and_then(Value::as_u64)
                        .unwrap_or(10)
                        .clamp(1, 30),
                ),
                rules: w
                    .get("rules")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                namespace_selector: selector("namespaceSelector"),
                object_selector: selector("objectSelector"),
            });
        }
    }
    out.sort_by(|a, b| (&a.configuration, &a.name).cmp(&(&b.configuration, &b.name)));
    out
}

/// What a request is, for matching webhooks.
pub struct Request<'a> {
    pub def: &'a ResourceDef,
    pub version: &'a str,
    pub operation: &'a str,
    pub namespace: &'a str,
    /// The labels of the request's namespace (namespaced kinds).
    pub namespace_labels: Option<Value>,
    pub object: &'a Value,
    pub old: Option<&'a Value>,
    /// The write's options (`CreateOptions`, `UpdateOptions` or
    /// `PatchOptions`, with its `fieldManager`).
    pub options: Value,
}

impl Webhook {
    /// Whether the webhook is sent this request.
    pub fn matches(&self, r: &Request<'_>) -> bool {
        let has = |list: &[String], want: &str| list.iter().any(|x| x == "*" || x == want);
        let ruled = self.rules.iter().any(|rule| {
            let scope = rule.get("scope").and_then(Value::as_str).unwrap_or("*");
            let scope_ok = match scope {
                "Namespaced" => r.def.namespaced,
                "Cluster" => !r.def.namespaced,
                _ => true,
            };
            scope_ok
                && has(&strings(rule, "operations"), r.operation)
                && has(&strings(rule, "apiGroups"), &r.def.group)
                && has(&strings(rule, "apiVersions"), r.version)
                && strings(rule, "resources")
                    .iter()
                    .any(|res| res == "*" || res == "*/*" || *res == r.def.plural)
        });
        if !ruled {
            return false;
        }
        let ns_ok = match &r.namespace_labels {
            Some(labels) if r.def.namespaced => self
                .namespace_selector
                .matches_object(&json!({"metadata": {"labels": labels}})),
            _ => true,
        };
        let object_ok = self.object_selector.matches_object(r.object)
            || r.old
                .is_some_and(|o| self.object_selector.matches_object(o));
        ns_ok && object_ok
    }

    /// The AdmissionReview the webhook is sent.
    pub fn review(&self, r: &Request<'_>, user: &UserInfo, dry_run: bool, uid: &str) -> Value {
        let name = r
            .object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = json!({"group": r.def.group, "version": r.version, "kind": r.def.kind});
        let resource =
            json!({"group": r.def.group, "version": r.version, "resource": r.def.plural});
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": kind, "requestKind": kind,
                "resource": resource, "requestResource": resource,
                "name": name,
                "namespace": r.namespace,
                "operation": r.operation,
                "userInfo": user,
                "object": r.object,
                "oldObject": r.old.cloned().unwrap_or(Value::Null),
                "dryRun": dry_run,
                "options": r.options,
            }
        })
    }

    /// The refusal of a request this webhook denied or could not answer.
    fn failed(&self, why: &str) -> ApiError {
        ApiError::new(
            500,
            "InternalError",
            format!(
                "Internal error occurred: failed calling webhook \"{}\": {why}",
                self.name
            ),
        )
    }
}

/// What the webhooks made of a request: the JSONPatch operations to apply
/// to the object, and the warnings they gave.
#[derive(Debug, Default)]
pub struct Admitted {
    pub patch: Vec<Value>,
    pub warnings: Vec<String>,
}

/// Send the request to every webhook it matches: mutating ones first,
/// each seeing what the ones before made of the object, then validating
/// ones. `Err` is the API server's refusal.
pub async fn admit(
    caller: &Arc<dyn Caller>,
    hooks: &[Webhook],
    r: &Request<'_>,
    user: &UserInfo,
    dry_run: bool,
) -> Result<Admitted, ApiError> {
    let mut out = Admitted::default();
    let mut object = r.object.clone();
    for hook in hooks.iter().filter(|h| h.mutating) {
        let req = Request {
            object: &object,
            namespace_labels: r.namespace_labels.clone(),
            options: r.options.clone(),
            ..*r
        };
        let Some(response) = ask(caller, hook, &req, user, dry_run, &mut out).await? else {
            continue;
        };
        if let Some(p) = response.get("patch").and_then(Value::as_str) {
            let ops = base64::engine::general_purpose::STANDARD
                .decode(p)
                .ok()
                .and_then(|b| serde_json::from_slice::<Vec<Value>>(&b).ok())
                .ok_or_else(|| hook.failed("the webhook's patch is not a base64 JSONPatch"))?;
            super::patch::json_patch(&mut object, &Value::Array(ops.clone()))
                .map_err(|e| hook.failed(&format!("applying the webhook's patch: {e}")))?;
            out.patch.extend(ops);
        }
    }
    for hook in hooks.iter().filter(|h| !h.mutating) {
        let req = Request {
            object: &object,
            namespace_labels: r.namespace_labels.clone(),
            options: r.options.clone(),
            ..*r
        };
        ask(caller, hook, &req, user, dry_run, &mut out).await?;
    }
    Ok(out)
}

/// One webhook's answer (`None`: it failed and is ignored); a denial or a
/// failure of a webhook that must answer is the request's refusal.
async fn ask(
    caller: &Arc<dyn Caller>,
    hook: &Webhook,
    r: &Request<'_>,
    user: &UserInfo,
    dry_run: bool,
    out: &mut Admitted,
) -> Result<Option<Value>, ApiError> {
    let uid = format!(
        "{:016x}",
        runbook_core::util::hash::fnv64(
            format!("{}{:?}", hook.name, std::time::Instant::now()).as_bytes()
        )
    );
    let review = hook.review(r, user, dry_run, &uid);
    let answer = match tokio::time::timeout(hook.timeout, caller.call(hook, review)).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) if hook.ignore_failures => {
            tracing::debug!(webhook = %hook.name, "ignoring a failed webhook call: {e}");
            return Ok(None);
        }
        Ok(Err(e)) => return Err(hook.failed(&e)),
        Err(_) if hook.ignore_failures => return Ok(None),
        Err(_) => return Err(hook.failed("context deadline exceeded")),
    };
    let Some(response) = answer.get("response").filter(|r| r.is_object()) else {
        let why = "the answer has no response";
        return if hook.ignore_failures {
            Ok(None)
        } else {
            Err(hook.failed(why))
        };
    };
    if response.get("uid").and_then(Value::as_str) != Some(uid.as_str()) {
        let why = format!(
            "expected response.uid={uid:?}, got {:?}",
            response.get("uid")
        );
        return if hook.ignore_failures {
            Ok(None)
        } else {
            Err(hook.failed(&why))
        };
    }
    out.warnings.extend(strings(response, "warnings"));
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        let status = response.get("status").cloned().unwrap_or_default();
        let code = status.get("code").and_then(Value::as_u64).unwrap_or(400) as u16;
        let message = status.get("message").and_then(Value::as_str).unwrap_or("");
        // The reasons a denial carries, as the API server passes them on.
        let reason = match status.get("reason").and_then(Value::as_str) {
            Some("Forbidden") => "Forbidden",
            Some("Invalid") => "Invalid",
            Some("Conflict") => "Conflict",
            _ if code == 403 => "Forbidden",
            _ => "BadRequest",
        };
        return Err(ApiError::new(
            code,
            reason,
            format!(
                "admission webhook \"{}\" denied the request: {message}",
                hook.name
            ),
        ));
    }
    Ok(Some(response.clone()))
}

/// Reviews sent over HTTPS to a webhook's URL, trusting its CA bundle;
/// a client (and its connections) is kept per CA bundle.
pub struct Https {
    names: ServiceNames,
    clients: std::sync::Mutex<HashMap<Vec<u8>, HttpsClient>>,
}

type HttpsClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<HttpConnector<ServiceNames>>,
    http_body_util::Full<bytes::Bytes>,
>;

/// So many kept clients at most; past it, all are dropped and made again.
const KEPT_CLIENTS: usize = 64;

impl Https {
    /// Calls resolving Services in `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            names: ServiceNames(store),
            clients: Default::default(),
        }
    }

    fn client(&self, ca: &[u8]) -> Result<HttpsClient, String> {
        let mut clients = runbook_core::util::lock(&self.clients);
        if let Some(c) = clients.get(ca) {
            return Ok(c.clone());
        }
        let client = https_client(ca, self.names.clone())?;
        if clients.len() >= KEPT_CLIENTS {
            clients.clear();
        }
        clients.insert(ca.to_vec(), client.clone());
        Ok(client)
    }
}

impl Caller for Https {
    fn call(&self, hook: &Webhook, review: Value) -> BoxFuture<'static, Result<Value, String>> {
        let called = hook
            .url
            .clone()
            .and_then(|url| Ok((self.client(&hook.ca_bundle)?, url)));
        Box::pin(async move {
            let (client, url) = called?;
            post(&client, &url, &review).await
        })
    }
}

fn https_client(ca: &[u8], names: ServiceNames) -> Result<HttpsClient, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new_with_resolver(names);
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https),
    )
}

async fn post(client: &HttpsClient, url: &str, review: &Value) -> Result<Value, String> {
    use http_body_util::{BodyExt, Full};
    let body = serde_json::to_vec(review).map_err(|e| e.to_string())?;
    let req = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(bytes::Bytes::from(body)))
        .map_err(|e| format!("Post {url:?}: {e}"))?;
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("failed to call webhook: Post {url:?}: {e:?}"))?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the webhook's answer: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("the webhook answered {status}"));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("the webhook's answer is not JSON: {e}"))
}

/// The webhooks of the sandbox and how it reaches them.
pub struct Admission {
    caller: std::sync::Mutex<Arc<dyn Caller>>,
}

impl Admission {
    /// Webhooks called over HTTPS, their Services resolved in `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            caller: std::sync::Mutex::new(Arc::new(Https::new(store))),
        }
    }

    pub fn caller(&self) -> Arc<dyn Caller> {
        runbook_core::util::lock(&self.caller).clone()
    }

    pub fn set_caller(&self, caller: Arc<dyn Caller>) {
        *runbook_core::util::lock(&self.caller) = caller;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(rules: Value, ns_selector: Value) -> Webhook {
        Webhook {
            configuration: "c".into(),
            name: "w".into(),
            mutating: true,
            url: Err("none".into()),
            ca_bundle: Vec::new(),
            ignore_failures: false,
            timeout: Duration::from_secs(1),
            rules: rules.as_array().cloned().unwrap_or_default(),
            namespace_selector: Selector::from_label_selector(&ns_selector).unwrap(),
            object_selector: Selector::default(),
        }
    }

    #[test]
    fn a_service_is_resolved_as_the_api_server_resolves_it() {
        use super::super::store::WriteOpts;
        let store = super::super::store::tests::store();
        let def = store.def("", "services").unwrap();
        for (name, spec) in [
            (
                "ext",
                json!({"type": "ExternalName", "externalName": "127.0.0.1"}),
            ),
            (
                "ip",
                json!({"clusterIP": "10.0.0.7", "ports": [{"port": 443}]}),
            ),
            (
                "headless",
                json!({"clusterIP": "None", "ports": [{"port": 443}]}),
            ),
        ] {
            let svc = json!({"apiVersion": "v1", "kind": "Service",
                             "metadata": {"name": name, "namespace": "ns"}, "spec": spec});
            store
                .create(&def, "ns", svc, &WriteOpts::default())
                .unwrap();
        }
        let url = url_of(
            &json!({"service": {"namespace": "ops", "name": "ext", "port": 8443, "path": "/p"}}),
        );
        assert_eq!(url.unwrap(), "https://ext.ops.svc:8443/p");
        assert_eq!(
            url_of(&json!({"url": "https://h:1/x"})).unwrap(),
            "https://h:1/x"
        );
        assert!(url_of(&json!({})).is_err());
        assert_eq!(resolve_service(&store, "ext.ns.svc").unwrap(), "127.0.0.1");
        assert_eq!(resolve_service(&store, "ip.ns.svc").unwrap(), "10.0.0.7");
        let headless = resolve_service(&store, "headless.ns.svc").unwrap_err();
        assert!(headless.contains("ClusterIP \"None\""), "{headless}");
        let missing = resolve_service(&store, "gone.ns.svc").unwrap_err();
        assert_eq!(missing, "service \"gone\" not found");
        assert_eq!(
            resolve_service(&store, "example.com").unwrap(),
            "example.com"
        );
    }

    #[test]
    fn a_webhook_matches_by_rule_scope_and_namespace() {
        let def = super::super::registry::builtins()
            .into_iter()
            .find(|d| d.kind == "ConfigMap")
            .unwrap();
        let obj = json!({"metadata": {"name": "a"}});
        let r = |op: &'static str, ns_labels: Value| Request {
            def: &def,
            version: "v1",
            operation: op,
            namespace: "team-a",
            namespace_labels: Some(ns_labels),
            object: &obj,
            old: None,
            options: Value::Null,
        };
        let rules = json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]);
        let team = json!({"kubernetes.io/metadata.name": "team-a"});
        let w = hook(
            rules.clone(),
            json!({"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}),
        );
        assert!(w.matches(&r("CREATE", team.clone())));
        assert!(!w.matches(&r("UPDATE", team.clone())));
        assert!(!w.matches(&r(
            "CREATE",
            json!({"kubernetes.io/metadata.name": "team-b"})
        )));
        let secrets = hook(
            json!([{"operations": ["*"], "apiGroups": [""], "apiVersions": ["*"], "resources": ["secrets"]}]),
            Value::Null,
        );
        assert!(!secrets.matches(&r("CREATE", team.clone())));
        let cluster = hook(
            json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "Cluster"}]),
            Value::Null,
        );
        assert!(!cluster.matches(&r("CREATE", team)));
    }
}
