//! The REST protocol: paths, verbs, query parameters, content types,
//! discovery, tables and watch streams, mapped onto the store.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::auth::{self, UserInfo};
use super::faults::{ApiVerb, Faults};
use super::registry::ResourceDef;
use super::status::ApiError;
use super::store::{
    DeleteOpts, Deleted, EventRenderer, FieldSelector, FieldValidation, Filter, Part, PatchBody,
    PatchKind, Propagation, Store, WriteOpts,
};
use super::{patch, table};
use runbook_core::labels::Selector;

/// A response body: whole, or a stream of watch lines.
pub enum SandboxBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl http_body::Body for SandboxBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SandboxBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            SandboxBody::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SandboxBody::Full(None))
    }
}

/// Everything a request needs.
pub struct Api {
    pub store: Arc<Store>,
    pub faults: Arc<Faults>,
    pub bookmark_interval: Duration,
    pub admission: Arc<super::admission::Admission>,
    /// The ServiceAccount tokens issued (`serviceaccounts/NAME/token`).
    pub tokens: Arc<auth::Tokens>,
    /// The writes received, and their bytes.
    pub traffic: Arc<Traffic>,
}

/// The write requests (POST, PUT, PATCH, DELETE) the sandbox received and
/// the bytes of their bodies: what a client sent to change the cluster.
#[derive(Debug, Default)]
pub struct Traffic {
    writes: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
}

impl Traffic {
    fn note(&self, method: &Method, body: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if matches!(
            *method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        ) {
            self.writes.fetch_add(1, Relaxed);
            self.bytes.fetch_add(body as u64, Relaxed);
        }
    }

    /// Write requests received so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of their bodies.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

type Resp = Response<SandboxBody>;

fn json_response(code: StatusCode, body: Bytes) -> Resp {
    let mut r = Response::new(SandboxBody::Full(Some(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn value_response(code: StatusCode, v: &Value) -> Resp {
    json_response(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

pub fn error_response(e: &ApiError) -> Resp {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    value_response(code, &e.to_status())
}

fn with_warnings(mut r: Resp, warnings: &[String]) -> Resp {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

/// Decode `%XX` escapes and `+`.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = hex {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b == b'+' { b' ' } else { b });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_params(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

/// Where a request points.
#[derive(Clone, Debug)]
struct Target {
    def: Arc<ResourceDef>,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Api {
    /// Handle one request.
    pub async fn handle(&self, req: Request<Bytes>) -> Resp {
        let latency = self.faults.latency();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let (parts, body) = req.into_parts();
        self.traffic.note(&parts.method, body.len());
        let path = parts.uri.path().to_string();
        let query = query_params(parts.uri.query());
        match self
            .route(&parts.method, &path, &query, &parts.headers, body)
            .await
        {
            Ok(r) => r,
            Err(e) => error_response(&e),
        }
    }

    async fn route(
        &self,
        method: &Method,
        path: &str,
        q: &BTreeMap<String, String>,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Result<Resp, ApiError> {
        let segs: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(answer) = self.meta_path(&segs, headers) {
            if method != Method::GET {
                return Err(ApiError::method_not_allowed());
            }
            return answer;
        }
        let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
            ["api", v, rest @ ..] => ("", v, rest),
            ["apis", g, v, rest @ ..] => (g, v, rest),
            _ => return Err(ApiError::no_resource()),
        };
        let target = self.target(group, version, rest)?;
        self.resource(method, target, q, headers, body).await
    }

    /// The paths that are not resources: version, health, discovery,
    /// OpenAPI (`None` for a resource path).
    fn meta_path(
        &self,
        segs: &[&str],
        headers: &http::HeaderMap,
    ) -> Option<Result<Resp, ApiError>> {
        use super::discovery as d;
        let ok = |v: Value| Ok(value_response(StatusCode::OK, &v));
        let found = |v: Option<Value>| {
            v.map(|v| value_response(StatusCode::OK, &v))
                .ok_or_else(ApiError::no_resource)
        };
        let defs = || self.store.defs();
        Some(match segs {
            ["version"] => ok(d::version()),
            ["healthz"] | ["readyz"] | ["livez"] => {
                let mut r = Response::new(SandboxBody::Full(Some(Bytes::from_static(b"ok"))));
                r.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                Ok(r)
            }
            ["api"] => ok(d::core_versions()),
            ["apis"] => ok(d::groups(&defs())),
            ["apis", group] => found(d::group(&defs(), group)),
            ["api", "v1"] => found(d::resources(&defs(), "", "v1")),
            ["apis", group, version] => found(d::resources(&defs(), group, version)),
            ["openapi", "v2"] => {
                let accept = headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if !accept.contains("protobuf") {
                    return Some(ok(d::openapi_v2()));
                }
                // The same empty document as protobuf, as kubectl asks:
                // every field at its default encodes as no bytes.
                let mut r = Response::new(SandboxBody::Full(Some(Bytes::new())));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                    ),
                );
                Ok(r)
            }
            ["openapi", "v3"] => ok(d::openapi_root(&defs())),
            ["openapi", "v3", "api", version] => found(d::openapi_gv(&defs(), "", version)),
            ["openapi", "v3", "apis", group, version] => {
                found(d::openapi_gv(&defs(), group, version))
            }
            _ => return None,
        })
    }

    fn lookup(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<Arc<ResourceDef>, ApiError> {
        match self.store.def(group, plural) {
            Some(d) if d.serves(version) => Ok(d),
            _ => Err(ApiError::no_resource()),
        }
    }

    fn target(&self, group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
        let namespaced_resource = |plural: &str| {
            self.store
                .def(group, plural)
                .is_some_and(|d| d.namespaced && d.serves(version))
        };
        let t = |def: Arc<ResourceDef>, ns: Option<&str>, name: Option<&str>, sub: Option<&str>| {
            Target {
                def,
                version: version.to_string(),
                namespace: ns.map(str::to_string),
                name: name.map(str::to_string),
                sub: sub.map(str::to_string),
            }
        };
        let target = match rest {
            // /api/v1/namespaces/{ns}/{plural}[/{name}[/{sub}]]
            ["namespaces", ns, plural, tail @ ..]
                if group.is_empty() && namespaced_resource(plural)
                    || !group.is_empty() && namespaced_resource(plural) =>
            {
                let def = self.lookup(group, version, plural)?;
                match tail {
                    [] => t(def, Some(ns), None, None),
                    [name] => t(def, Some(ns), Some(name), None),
                    [name, sub] => t(def, Some(ns), Some(name), Some(sub)),
                    _ => return Err(ApiError::no_resource()),
                }
            }
            [plural] => t(self.lookup(group, version, plural)?, None, None, None),
            [plural, name] => t(self.lookup(group, version, plural)?, None, Some(name), None),
            [plural, name, sub] => t(
                self.lookup(group, version, plural)?,
                None,
                Some(name),
                Some(sub),
            ),
            _ => return Err(ApiError::no_resource()),
        };
        if target.def.namespaced && target.namespace.is_none() && target.name.is_some() {
            return Err(ApiError::no_resource());
        }
        if !target.def.namespaced && target.namespace.is_some() {
            return Err(ApiError::no_resource());
        }
        match target.sub.as_deref() {
            None => {}
            Some("status") if target.def.status_subresource => {}
            Some("scale") if target.def.has_scale() => {}
            Some("finalize")
                if target.def.plural == "namespaces" && target.def.group.is_empty() => {}
            Some("token")
                if target.def.plural == "serviceaccounts" && target.def.group.is_empty() => {}
            Some(_) => return Err(ApiError::no_resource()),
        }
        Ok(target)
    }

    fn verb(
        method: &Method,
        t: &Target,
        q: &BTreeMap<String, String>,
    ) -> Result<ApiVerb, ApiError> {
        let collection = t.name.is_none();
        Ok(match (method.as_str(), collection) {
            ("GET", true) if is_true(q.get("watch")) => ApiVerb::Watch,
            ("GET", true) => ApiVerb::List,
            ("GET", false) => ApiVerb::Get,
            ("POST", true) => ApiVerb::Create,
            // A TokenRequest is made on its ServiceAccount.
            ("POST", false) if t.sub.as_deref() == Some("token") => ApiVerb::Create,
            ("PUT", false) => ApiVerb::Update,
            ("PATCH", false) => ApiVerb::Patch,
            ("DELETE", false) => ApiVerb::Delete,
            ("DELETE", true) => ApiVerb::DeleteCollection,
            _ => return Err(ApiError::method_not_allowed()),
        })
    }

    /// Whether `user` may make this request (RBAC, as stored).
    fn authorized(&self, user: &UserInfo, verb: ApiVerb, t: &Target) -> Result<(), ApiError> {
        if user.is_master() {
            return Ok(());
        }
        let a = auth::attributes(
            &t.def,
            verb.as_str(),
            t.namespace.as_deref(),
            t.name.as_deref(),
            t.sub.as_deref(),
        );
        if !auth::authorize(&self.store, user, &a).allowed {
            return Err(ApiError::forbidden(a.forbidden_message(&user.username)));
        }
        Ok(())
    }

    /// Authorize a request. As the API server does, a list or watch of one
    /// name (a `metadata.name=` field selector) is authorized for that
    /// name, so RBAC `resourceNames` can grant it.
    fn authorized_as_asked(
        &self,
        user: &UserInfo,
        verb: ApiVerb,
        t: &Target,
        q: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        let by_name = match verb {
            ApiVerb::List | ApiVerb::Watch if t.name.is_none() => q
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name="))
                .filter(|n| !n.is_empty() && !n.contains(','))
                .map(str::to_string),
            _ => None,
        };
        match by_name {
            Some(name) => {
                let named = Target {
                    name: Some(name),
                    ..t.clone()
                };
                self.authorized(user, verb, &named)
            }
            None => self.authorized(user, verb, t),
        }
    }

    async fn resource(
        &self,
        method: &Method,
        t: Target,
        q: &BTreeMap<String, String>,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Result<Resp, ApiError> {
        let verb = Self::verb(method, &t, q)?;
        if let Some(answer) = self.fault(verb, &t) {
            return answer;
        }
        let user =
            auth::authenticate(&self.store, &self.tokens, headers).map_err(ApiError::forbidden)?;
        self.authorized_as_asked(&user, verb, &t, q)?;
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let c = Call {
            ns: t.namespace.clone().unwrap_or_default(),
            part: if t.sub.as_deref() == Some("status") {
                Part::Status
            } else {
                Part::Main
            },
            opts: write_opts(q, headers)?,
            table: accept.contains("as=Table"),
            t: &t,
            q,
            headers,
            body,
        };
        if t.def.is_review() {
            return self.review(verb, &c, &user);
        }
        if t.sub.as_deref() == Some("scale") {
            return self.scale(verb, &t, &c.ns, headers, &c.body, &c.opts);
        }
        if t.sub.as_deref() == Some("token") {
            return self.token_request(verb, &c);
        }
        match verb {
            ApiVerb::Get => self.get(&c),
            ApiVerb::List => self.list(&c),
            ApiVerb::Watch => self.watch(&t, q, c.table),
            ApiVerb::Create => {
                if t.sub.is_some() {
                    return Err(ApiError::method_not_allowed());
                }
                let obj = parse_body(headers, &c.body)?;
                let w = self
                    .admitted(&c, &user, |opts| {
                        self.store.create(&t.def, &c.ns, obj.clone(), opts)
                    })
                    .await?;
                Ok(c.written(StatusCode::CREATED, w))
            }
            ApiVerb::Update => {
                let obj = parse_body(headers, &c.body)?;
                let name = t.name.as_deref().unwrap_or_default();
                let w = self
                    .admitted(&c, &user, |opts| {
                        self.store
                            .update(&t.def, &c.ns, name, obj.clone(), c.part, opts)
                    })
                    .await?;
                Ok(c.written(StatusCode::OK, w))
            }
            ApiVerb::Patch => self.patch(&c, &user).await,
            ApiVerb::Delete => self.delete(&c),
            ApiVerb::DeleteCollection => self.delete_collection(&c),
        }
    }

    /// A request the sandbox was told to refuse (403) or fail (an injected
    /// status code), answered as the real server would.
    fn fault(&self, verb: ApiVerb, t: &Target) -> Option<Result<Resp, ApiError>> {
        let resource = match &t.sub {
            Some(sub) => format!("{}/{sub}", t.def.plural),
            None => t.def.plural.clone(),
        };
        if self
            .faults
            .is_denied(verb, &t.def.group, &resource, t.namespace.as_deref())
        {
            let full = if t.def.group.is_empty() {
                t.def.plural.clone()
            } else {
                format!("{}.{}", t.def.plural, t.def.group)
            };
            let whose = match &t.namespace {
                Some(ns) => format!(" in the namespace \"{ns}\""),
                None => " at the cluster scope".to_string(),
            };
            return Some(Err(ApiError::forbidden(format!(
                "{full} is forbidden: User \"sandbox\" cannot {} resource \"{resource}\" in API group \"{}\"{whose}",
                verb.as_str(),
                t.def.group
            ))));
        }
        let code = self.faults.take(verb, &resource)?;
        let reason = match code {
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            409 => "Conflict",
            _ => "InternalError",
        };
        let message = format!("injected fault: {} {resource} failed", verb.as_str());
        let mut r = error_response(&ApiError::new(code, reason, message));
        if code == 429 {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        Some(Ok(r))
    }

    /// An access or identity review, answered for whoever it names: a
    /// SelfSubjectAccessReview for the requester, a SubjectAccessReview
    /// for its `spec` (user, groups), both by RBAC and the permissions a
    /// test denied; a SelfSubjectReview says who the requester is.
    fn review(&self, verb: ApiVerb, c: &Call<'_>, requester: &UserInfo) -> Result<Resp, ApiError> {
        if verb != ApiVerb::Create {
            return Err(ApiError::method_not_allowed());
        }
        let mut review = parse_body(c.headers, &c.body)?;
        if c.t.def.kind == "SelfSubjectReview" {
            review["status"] = json!({"userInfo": requester});
            return Ok(value_response(StatusCode::CREATED, &review));
        }
        let spec = review.get("spec").cloned().unwrap_or_default();
        let who = if c.t.def.kind == "SubjectAccessReview" {
            let text = |k: &str| {
                spec.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let named = UserInfo {
                username: text("user"),
                uid: text("uid"),
                groups: serde_json::from_value(spec.get("groups").cloned().unwrap_or(json!([])))
                    .unwrap_or_default(),
                extra: serde_json::from_value(spec.get("extra").cloned().unwrap_or(json!({})))
                    .unwrap_or_default(),
            };
            if named.username.is_empty() && named.groups.is_empty() {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "SubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified",
                ));
            }
            named
        } else {
            requester.clone()
        };
        let a = auth::review_attributes(&spec);
        let ns = Some(a.namespace.as_str()).filter(|s| !s.is_empty());
        let denied = ApiVerb::parse(&a.verb)
            .is_some_and(|v| self.faults.is_denied(v, &a.group, &a.combined(), ns));
        let verdict = auth::authorize(&self.store, &who, &a);
        review["status"] = if denied {
            json!({"allowed": false, "reason": "the sandbox was told to deny it"})
        } else if verdict.allowed {
            json!({"allowed": true, "reason": verdict.reason})
        } else {
            json!({"allowed": false})
        };
        Ok(value_response(StatusCode::CREATED, &review))
    }

    /// A TokenRequest for a ServiceAccount that exists: a bearer token
    /// that authenticates as it from then on.
    fn token_request(&self, verb: ApiVerb, c: &Call<'_>) -> Result<Resp, ApiError> {
        if verb != ApiVerb::Create {
            return Err(ApiError::method_not_allowed());
        }
        let name = c.t.name.as_deref().unwrap_or_default();
        self.store.get(&c.t.def, &c.ns, name)?;
        let mut request = parse_body(c.headers, &c.body).unwrap_or_else(|_| json!({}));
        let seconds = request
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(3600);
        let expires = self
            .store
            .clock()
            .now()
            .checked_add(jiff::SignedDuration::from_secs(seconds))
            .unwrap_or_else(|_| self.store.clock().now());
        request["apiVersion"] = json!("authentication.k8s.io/v1");
        request["kind"] = json!("TokenRequest");
        request["metadata"] = json!({"name": name, "namespace": c.ns, "creationTimestamp": null});
        request["status"] = json!({
            "token": self.tokens.issue(&c.ns, name),
            "expirationTimestamp": runbook_core::util::time::format(expires),
        });
        Ok(value_response(StatusCode::CREATED, &request))
    }

    fn get(&self, c: &Call<'_>) -> Result<Resp, ApiError> {
        let t = c.t;
        let bytes = self
            .store
            .get(&t.def, &c.ns, t.name.as_deref().unwrap_or_default())?;
        let bytes = table::at_version(&t.def, &t.version, bytes);
        if !c.table {
            return Ok(json_response(StatusCode::OK, bytes));
        }
        let now = self.store.clock().now();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let rv = self.store.current_rv();
        let tv = table::table(
            &t.def,
            &t.version,
            std::slice::from_ref(&v),
            rv,
            now,
            include_object(c.q),
        );
        Ok(value_response(StatusCode::OK, &tv))
    }

    fn list(&self, c: &Call<'_>) -> Result<Resp, ApiError> {
        let (t, q) = (c.t, c.q);
        let filter = filter(t, q)?;
        resource_version(q, false)?;
        let limit = q
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let cont = q
            .get("continue")
            .map(String::as_str)
            .filter(|c| !c.is_empty());
        let listed = self.store.list(&t.def, &filter, limit, cont)?;
        if c.table {
            let now = self.store.clock().now();
            let items: Vec<Value> = listed
                .items
                .iter()
                .map(|b| serde_json::from_slice(b).unwrap_or_default())
                .collect();
            let mut tv = table::table(
                &t.def,
                &t.version,
                &items,
                listed.rv,
                now,
                include_object(q),
            );
            if let Some(c) = &listed.continue_token {
                tv["metadata"]["continue"] = json!(c);
            }
            return Ok(value_response(StatusCode::OK, &tv));
        }
        let mut meta = json!({"resourceVersion": listed.rv.to_string()});
        if let Some(c) = &listed.continue_token {
            meta["continue"] = json!(c);
        }
        if let Some(r) = listed.remaining {
            meta["remainingItemCount"] = json!(r);
        }
        let items = listed
            .items
            .into_iter()
            .map(|item| without_type_meta(&table::at_version(&t.def, &t.version, item)));
        Ok(list_response(t, &meta, items))
    }

    /// A create or update, through the admission webhooks it matches: the
    /// write is first made as a dry run to learn the object it would
    /// store, that object is reviewed, and the write is then made with
    /// what the mutating webhooks changed.
    async fn admitted(
        &self,
        c: &Call<'_>,
        user: &UserInfo,
        write: impl Fn(&WriteOpts) -> Result<super::store::Written, ApiError>,
    ) -> Result<super::store::Written, ApiError> {
        use super::admission;
        let t = c.t;
        let mut hooks = admission::webhooks(&self.store, true);
        hooks.extend(admission::webhooks(&self.store, false));
        if t.sub.is_some() || hooks.is_empty() {
            return write(&c.opts);
        }
        let parse = |b: &Bytes| serde_json::from_slice::<Value>(b).unwrap_or_default();
        let old = t
            .name
            .as_deref()
            .and_then(|n| self.store.get(&t.def, &c.ns, n).ok())
            .map(|b| parse(&b));
        let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
        let dry = WriteOpts {
            dry_run: true,
            admit: None,
            ..c.opts.clone()
        };
        let mut object = parse(&write(&dry)?.bytes);
        if operation == "CREATE"
            && let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut)
        {
            // What the API server sets only once admission is over.
            for k in ["uid", "creationTimestamp", "resourceVersion", "generation"] {
                meta.remove(k);
            }
            if t.name.is_none() && meta.contains_key("generateName") {
                meta.remove("name");
            }
        }
        let namespace_labels = t
            .def
            .namespaced
            .then(|| self.store.def("", "namespaces"))
            .flatten()
            .and_then(|d| self.store.get(&d, "", &c.ns).ok())
            .map(|b| parse(&b)["metadata"]["labels"].clone());
        let options = review_options(c, operation);
        let request = admission::Request {
            def: &t.def,
            version: &t.version,
            operation,
            namespace: &c.ns,
            namespace_labels,
            object: &object,
            old: old.as_ref(),
            options,
        };
        hooks.retain(|h| h.matches(&request));
        if hooks.is_empty() {
            return write(&c.opts);
        }
        let caller = self.admission.caller();
        let admitted = admission::admit(&caller, &hooks, &request, user, c.opts.dry_run).await?;
        let mut opts = c.opts.clone();
        if !admitted.patch.is_empty() {
            let ops = Value::Array(admitted.patch);
            opts.admit = Some(super::store::Admit(Arc::new(move |o: &mut Value| {
                patch::json_patch(o, &ops).map_err(|e| {
                    ApiError::internal(format!("applying the admission webhooks' patch: {e}"))
                })
            })));
        }
        let mut w = write(&opts)?;
        w.warnings.extend(admitted.warnings);
        Ok(w)
    }

    async fn patch(&self, c: &Call<'_>, user: &UserInfo) -> Result<Resp, ApiError> {
        let ct = c
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let kind = match ct.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => PatchKind::Merge,
            "application/json-patch+json" => PatchKind::Json,
            "application/strategic-merge-patch+json" => PatchKind::Strategic,
            "application/apply-patch+yaml" | "application/apply-patch+json" => PatchKind::Apply,
            other => {
                return Err(ApiError::unsupported_media(format!(
                    "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                )));
            }
        };
        let patch_body = match kind {
            PatchKind::Apply => parse_yaml_or_json(&c.body)?,
            _ => parse_json(&c.body)?,
        };
        match kind {
            PatchKind::Json if !patch_body.is_array() => {
                return Err(ApiError::bad_request(
                    "a JSON patch must be an array of operations",
                ));
            }
            PatchKind::Merge | PatchKind::Strategic | PatchKind::Apply
                if !patch_body.is_object() =>
            {
                return Err(ApiError::bad_request("the patch must be a JSON object"));
            }
            _ => {}
        }
        let t = c.t;
        let name = t.name.as_deref().unwrap_or_default();
        let w = self
            .admitted(c, user, |opts| {
                self.store.patch(
                    &t.def,
                    &c.ns,
                    name,
                    PatchBody {
                        kind,
                        body: patch_body.clone(),
                    },
                    c.part,
                    opts,
                )
            })
            .await?;
        let code = if w.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok(c.written(code, w))
    }

    fn delete(&self, c: &Call<'_>) -> Result<Resp, ApiError> {
        let t = c.t;
        if t.sub.is_some() {
            return Err(ApiError::method_not_allowed());
        }
        let d = delete_opts(c.q, &c.body)?;
        let name = t.name.clone().unwrap_or_default();
        match self.store.delete(&t.def, &c.ns, &name, &d)? {
            Deleted::Pending(b) => Ok(json_response(
                StatusCode::OK,
                table::at_version(&t.def, &t.version, b),
            )),
            Deleted::Gone(b) => {
                let v: Value = serde_json::from_slice(&b).unwrap_or_default();
                let mut details =
                    json!({"name": name, "kind": t.def.plural, "uid": v["metadata"]["uid"]});
                if !t.def.group.is_empty() {
                    details["group"] = json!(t.def.group);
                }
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success", "details": details});
                Ok(value_response(StatusCode::OK, &status))
            }
        }
    }

    fn delete_collection(&self, c: &Call<'_>) -> Result<Resp, ApiError> {
        let d = delete_opts(c.q, &c.body)?;
        let f = filter(c.t, c.q)?;
        let items = self.store.delete_collection(&c.t.def, &f, &d)?;
        let meta = json!({"resourceVersion": self.store.current_rv().to_string()});
        Ok(list_response(
            c.t,
            &meta,
            items.into_iter().map(|b| b.to_vec()),
        ))
    }

    /// The `scale` subresource: the object's replicas as an autoscaling/v1
    /// Scale, read and written (`kubectl scale`, autoscalers).
    fn scale(
        &self,
        verb: ApiVerb,
        t: &Target,
        ns: &str,
        headers: &http::HeaderMap,
        body: &Bytes,
        opts: &WriteOpts,
    ) -> Result<Resp, ApiError> {
        let name = t.name.as_deref().unwrap_or_default();
        let current: Value =
            serde_json::from_slice(&self.store.get(&t.def, ns, name)?).unwrap_or_default();
        let mut scale = scale_of(&current);
        match verb {
            ApiVerb::Get => return Ok(value_response(StatusCode::OK, &scale)),
            ApiVerb::Update => scale = parse_body(headers, body)?,
            ApiVerb::Patch => {
                let media = headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|ct| ct.split(';').next())
                    .unwrap_or("")
                    .trim();
                let p = parse_json(body)?;
                match media {
                    "application/merge-patch+json" => patch::merge_patch(&mut scale, &p),
                    "application/strategic-merge-patch+json" => {
                        patch::strategic_merge(&mut scale, &p)
                    }
                    "application/json-patch+json" => patch::json_patch(&mut scale, &p)
                        .map_err(|e| ApiError::new(422, "Invalid", e))?,
                    other => {
                        return Err(ApiError::unsupported_media(format!(
                            "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
                        )));
                    }
                }
            }
            _ => return Err(ApiError::method_not_allowed()),
        }
        let invalid = |why: &str, value: &Value| {
            ApiError::new(
                422,
                "Invalid",
                format!("Scale.autoscaling \"{name}\" is invalid: spec.replicas: {why}{value}"),
            )
        };
        let replicas = match scale.pointer("/spec/replicas") {
            None | Some(Value::Null) => 0,
            Some(v) => match v.as_i64() {
                Some(n) if n >= 0 => n,
                _ => return Err(invalid("Invalid value: ", v)),
            },
        };
        let w = self.store.patch(
            &t.def,
            ns,
            name,
            PatchBody {
                kind: PatchKind::Merge,
                body: json!({"spec": {"replicas": replicas}}),
            },
            Part::Main,
            opts,
        )?;
        let updated: Value = serde_json::from_slice(&w.bytes).unwrap_or_default();
        Ok(value_response(StatusCode::OK, &scale_of(&updated)))
    }

    fn watch(
        &self,
        t: &Target,
        q: &BTreeMap<String, String>,
        table_mode: bool,
    ) -> Result<Resp, ApiError> {
        let filter = filter(t, q)?;
        let rv = resource_version(q, true)?;
        let send_initial = is_true(q.get("sendInitialEvents"));
        if send_initial && q.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan")
        {
            return Err(ApiError::new(
                422,
                "Invalid",
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        let bookmarks = is_true(q.get("allowWatchBookmarks"));
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(1800));
        let renderer: Arc<dyn EventRenderer> = if table_mode {
            Arc::new(table::TableRenderer {
                def: t.def.clone(),
                version: t.version.clone(),
                clock: self.store.clock().clone(),
            })
        } else {
            Arc::new(table::JsonRenderer {
                def: t.def.clone(),
                version: t.version.clone(),
            })
        };
        let bookmark = bookmarker(t.def.api_version(&t.version), t.def.kind.clone());
        let initial: Option<Box<dyn Fn(u64) -> Bytes + Send>> = if send_initial {
            let b = bookmark.clone();
            Some(Box::new(move |rv| b(rv, true)))
        } else {
            None
        };
        let stream = self
            .store
            .watch(&t.def, filter, rv, send_initial, renderer, initial)?;
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let feed = Feed {
            store: self.store.clone(),
            def: t.def.clone(),
            timeout,
            bookmarks: (bookmarks && !table_mode).then_some(self.bookmark_interval),
        };
        tokio::spawn(feed.run(stream, tx, bookmark));
        let mut r = Response::new(SandboxBody::Stream(rx));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r.headers_mut().insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        Ok(r)
    }
}

/// A BOOKMARK event of a kind, at a resourceVersion (marking the end of
/// the initial events when asked).
fn bookmarker(api_version: String, kind: String) -> impl Fn(u64, bool) -> Bytes + Clone + Send {
    move |rv: u64, initial_end: bool| -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
        Bytes::from(format!(
            "{}\n",
            json!({"type": "BOOKMARK", "object": object})
        ))
    }
}

/// What feeds one watch's response: its events, bookmarks every interval
/// when asked, until its timeout or until the client goes.
struct Feed {
    store: Arc<Store>,
    def: Arc<ResourceDef>,
    timeout: Duration,
    bookmarks: Option<Duration>,
}

impl Feed {
    async fn run(
        self,
        mut stream: super::store::WatchStream,
        tx: mpsc::Sender<Bytes>,
        bookmark: impl Fn(u64, bool) -> Bytes + Send,
    ) {
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(self.bookmarks.unwrap_or(Duration::from_secs(3600)));
        tick.tick().await;
        loop {
            tokio::select! {
                biased;
                line = stream.rx.recv() => match line {
                    Some(l) => {
                        stream.queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                        if tx.send(l).await.is_err() { break; }
                    }
                    None => break,
                },
                _ = &mut deadline => break,
                _ = tick.tick(), if self.bookmarks.is_some() => {
                    if !self.store.send_to_watch(&self.def, stream.id, |rv| bookmark(rv, false)) { break; }
                }
                _ = tx.closed() => break,
            }
        }
        self.store.stop_watch(&self.def, stream.id);
    }
}

/// One request on a resource, parsed.
struct Call<'a> {
    t: &'a Target,
    ns: String,
    q: &'a BTreeMap<String, String>,
    headers: &'a http::HeaderMap,
    body: Bytes,
    part: Part,
    opts: WriteOpts,
    /// Asked as a Table (what `kubectl get` prints).
    table: bool,
}

impl Call<'_> {
    /// The answer to a write: the object at the version asked, with the
    /// server's warnings.
    fn written(&self, code: StatusCode, w: super::store::Written) -> Resp {
        let bytes = table::at_version(&self.t.def, &self.t.version, w.bytes);
        with_warnings(json_response(code, bytes), &w.warnings)
    }
}

/// A list of the target's kind, written out from items already serialised.
fn list_response(t: &Target, meta: &Value, items: impl Iterator<Item = Vec<u8>>) -> Resp {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(
        format!(
            "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            t.def.list_kind,
            t.def.api_version(&t.version),
            meta
        )
        .as_bytes(),
    );
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&item);
    }
    out.extend_from_slice(b"]}");
    json_response(StatusCode::OK, Bytes::from(out))
}

fn is_true(v: Option<&String>) -> bool {
    matches!(v.map(String::as_str), Some("true") | Some("1"))
}

/// The options an admission review carries: the write's kind of options
/// (create, patch or update) and its field manager.
fn review_options(c: &Call<'_>, operation: &str) -> Value {
    let patched = c
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("patch"));
    let options_kind = match (operation, patched) {
        ("CREATE", _) => "CreateOptions",
        (_, true) => "PatchOptions",
        _ => "UpdateOptions",
    };
    let mut options = json!({"apiVersion": "meta.k8s.io/v1", "kind": options_kind});
    if let Some(m) = c.opts.field_manager.as_deref().filter(|m| !m.is_empty()) {
        options["fieldManager"] = json!(m);
    }
    options
}

fn include_object(q: &BTreeMap<String, String>) -> &str {
    q.get("includeObject")
        .map(String::as_str)
        .unwrap_or("Metadata")
}

fn filter(t: &Target, q: &BTreeMap<String, String>) -> Result<Filter, ApiError> {
    let labels = match q.get("labelSelector") {
        Some(s) if !s.is_empty() => Selector::parse(s)
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
        _ => Selector::default(),
    };
    let fields = match q.get("fieldSelector") {
        Some(s) if !s.is_empty() => FieldSelector::parse(s, &t.def.selectable)?,
        _ => FieldSelector::default(),
    };
    Ok(Filter {
        namespace: t.namespace.clone(),
        labels,
        fields,
    })
}

fn write_opts(
    q: &BTreeMap<String, String>,
    headers: &http::HeaderMap,
) -> Result<WriteOpts, ApiError> {
    let dry_run = match q.get("dryRun").map(String::as_str) {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    };
    let field_validation = match q.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            )));
        }
    };
    // As the API server does, an update without a field manager is
    // attributed to the client's user agent.
    let field_manager = q
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .cloned()
        .or_else(|| {
            headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .map(|ua| ua.split('/').next().unwrap_or(ua).to_string())
                .filter(|m| !m.is_empty())
        });
    Ok(WriteOpts {
        dry_run,
        field_validation,
        field_manager,
        force: is_true(q.get("force")),
        admit: None,
    })
}

fn delete_opts(q: &BTreeMap<String, String>, body: &Bytes) -> Result<DeleteOpts, ApiError> {
    let mut d = DeleteOpts::default();
    let parse_prop = |s: &str| match s {
        "Background" => Ok(Propagation::Background),
        "Foreground" => Ok(Propagation::Foreground),
        "Orphan" => Ok(Propagation::Orphan),
        other => Err(ApiError::bad_request(format!(
            "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
        ))),
    };
    if let Some(p) = q.get("propagationPolicy").filter(|p| !p.is_empty()) {
        d.propagation = Some(parse_prop(p)?);
    }
    if q.get("dryRun").map(String::as_str) == Some("All") {
        d.dry_run = true;
    }
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v = parse_json(body)?;
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            d.propagation = Some(parse_prop(p)?);
        }
        if v.get("orphanDependents") == Some(&Value::Bool(true)) {
            d.propagation = Some(Propagation::Orphan);
        }
        if v.get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"))
        {
            d.dry_run = true;
        }
        d.precondition_uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        d.precondition_rv = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    Ok(d)
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("json parse error: {e}")))
}

fn parse_yaml_or_json(body: &Bytes) -> Result<Value, ApiError> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(v);
    }
    let text =
        std::str::from_utf8(body).map_err(|_| ApiError::bad_request("the body is not UTF-8"))?;
    runbook_core::util::yaml::parse::<Value>(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

fn parse_body(headers: &http::HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let media = ct.split(';').next().unwrap_or("").trim();
    match media {
        "application/json" | "" | "*/*" => parse_json(body),
        "application/yaml" | "application/x-yaml" => parse_yaml_or_json(body),
        super::protobuf::MEDIA_TYPE => super::protobuf::decode(body),
        other => Err(ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        ))),
    }
}

/// The `resourceVersion` of a list or watch. One that is not a number is
/// refused as kube-apiserver v1.33 refuses it: a list with a 400
/// (`BadRequest`, "invalid resource version: ..."; v1.28 answered 500), a
/// watch still with a 500 and the parser's message alone.
fn resource_version(q: &BTreeMap<String, String>, watch: bool) -> Result<Option<u64>, ApiError> {
    match q.get("resourceVersion").map(String::as_str) {
        None | Some("") => Ok(None),
        Some(s) => s.parse::<u64>().map(Some).map_err(|_| {
            let parser = format!(
                "resourceVersion: Invalid value: {s:?}: strconv.ParseUint: parsing {s:?}: invalid syntax"
            );
            match watch {
                true => ApiError::new(500, "", parser),
                false => ApiError::bad_request(format!("invalid resource version: {parser}")),
            }
        }),
    }
}

/// A list item as kube-apiserver sends it: without `apiVersion` and
/// `kind`, which only the list itself carries.
fn without_type_meta(item: &[u8]) -> Vec<u8> {
    match serde_json::from_slice::<serde_json::Map<String, Value>>(item) {
        Ok(mut m) => {
            m.remove("apiVersion");
            m.remove("kind");
            serde_json::to_vec(&m).unwrap_or_else(|_| item.to_vec())
        }
        Err(_) => item.to_vec(),
    }
}

/// A workload's replicas as an autoscaling/v1 Scale.
fn scale_of(obj: &Value) -> Value {
    let meta = &obj["metadata"];
    let selector: Vec<String> = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                     "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"]},
        // `replicas` is an omitempty int32 there: zero replicas is `{}`.
        "spec": match obj["spec"]["replicas"].as_i64().unwrap_or(0) {
            0 => json!({}),
            n => json!({"replicas": n}),
        },
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector.join(",")},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_are_decoded() {
        let q = query_params(Some("labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1&x"));
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["x"], "");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
