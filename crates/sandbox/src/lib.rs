//! The sandbox: an in-memory Kubernetes API server.
//!
//! It speaks the REST protocol (discovery, get/list/watch with
//! resourceVersions and bookmarks, create/replace/patch/apply/delete, status
//! subresources, finalizers, garbage collection, label and field selectors,
//! dry runs, tables) as a `tower::Service`, so a `kube::Client` talks to it
//! in-process, and it serves the same over HTTP on 127.0.0.1 for kubectl.
//! Test hooks inject faults and move a manual clock. It knows nothing of
//! policies. Nothing runs containers: tests and scenarios say what the
//! world does by writing objects and their status.

pub mod admission;
pub mod auth;
pub mod cel;
pub mod discovery;
pub mod faults;
pub mod fields;
pub mod http;
pub mod patch;
pub mod protobuf;
pub mod registry;
pub mod schema;
pub mod serve;
pub mod status;
pub mod store;
pub mod stub;
pub mod table;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

pub use self::faults::{ApiVerb, Denied, Faults};
pub use self::http::SandboxBody;
pub use self::store::{Store, StoreConfig};
use runbook_core::clock::Clock;

/// Settings for a new sandbox.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    pub clock: Clock,
    pub store: StoreConfig,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            clock: Clock::real(),
            store: StoreConfig::default(),
            bookmark_interval: Duration::from_secs(1),
        }
    }
}

/// An in-memory API server. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct Sandbox {
    api: Arc<http::Api>,
    clock: Clock,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new(SandboxConfig::default())
    }
}

impl Sandbox {
    pub fn new(config: SandboxConfig) -> Self {
        let store = Arc::new(Store::new(config.clock.clone(), config.store));
        let api = Arc::new(http::Api {
            admission: Arc::new(admission::Admission::new(store.clone())),
            store,
            faults: Arc::new(Faults::default()),
            tokens: Arc::default(),
            traffic: Arc::default(),
            bookmark_interval: config.bookmark_interval,
        });
        Self {
            api,
            clock: config.clock,
        }
    }

    /// A sandbox whose clock the caller moves.
    pub fn with_clock(clock: Clock) -> Self {
        Self::new(SandboxConfig {
            clock,
            ..Default::default()
        })
    }

    pub fn service(&self) -> SandboxService {
        SandboxService {
            api: self.api.clone(),
        }
    }

    /// A client that talks to this sandbox in-process, default namespace `default`.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// A client whose requests come from `user` (with its groups), as
    /// `kubectl --as` makes them: RBAC then holds it to what its bindings
    /// grant.
    pub fn client_as(&self, user: &str, groups: &[&str]) -> kube::Client {
        let mut headers = ::http::HeaderMap::new();
        if let Ok(v) = ::http::HeaderValue::from_str(user) {
            headers.insert("impersonate-user", v);
        }
        for g in groups {
            if let Ok(v) = ::http::HeaderValue::from_str(g) {
                headers.append("impersonate-group", v);
            }
        }
        kube::Client::new(
            Impersonating {
                inner: self.service(),
                headers,
            },
            "default",
        )
    }

    /// A client that sends a bearer token (one a TokenRequest issued
    /// authenticates its ServiceAccount), as a pod's client does.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        let mut headers = ::http::HeaderMap::new();
        if let Ok(v) = ::http::HeaderValue::from_str(&format!("Bearer {token}")) {
            headers.insert(::http::header::AUTHORIZATION, v);
        }
        kube::Client::new(
            Impersonating {
                inner: self.service(),
                headers,
            },
            "default",
        )
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.api.store
    }

    pub fn faults(&self) -> &Arc<Faults> {
        &self.api.faults
    }

    /// The write requests received so far, and their bytes.
    pub fn traffic(&self) -> &Arc<http::Traffic> {
        &self.api.traffic
    }

    /// How the sandbox reaches admission webhooks (HTTPS unless replaced:
    /// a simulation calls the webhook's code in-process).
    pub fn admission(&self) -> &Arc<admission::Admission> {
        &self.api.admission
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Handle one request directly (tests, fuzzing).
    pub async fn handle(&self, req: ::http::Request<Bytes>) -> ::http::Response<SandboxBody> {
        self.api.handle(req).await
    }
}

/// The sandbox as a `tower::Service`.
#[derive(Clone)]
pub struct SandboxService {
    api: Arc<http::Api>,
}

impl<B> tower::Service<::http::Request<B>> for SandboxService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Display,
{
    type Response = ::http::Response<SandboxBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ::http::Request<B>) -> Self::Future {
        let api = self.api.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = match body.collect().await {
                Ok(c) => c.to_bytes(),
                Err(e) => {
                    return Ok(http::error_response(&status::ApiError::bad_request(
                        format!("reading the request body: {e}"),
                    )));
                }
            };
            Ok(api.handle(::http::Request::from_parts(parts, bytes)).await)
        })
    }
}

/// The sandbox's service with impersonation headers on every request.
#[derive(Clone)]
pub struct Impersonating {
    inner: SandboxService,
    headers: ::http::HeaderMap,
}

impl<B> tower::Service<::http::Request<B>> for Impersonating
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Display,
{
    type Response = ::http::Response<SandboxBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<::http::Request<B>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut req: ::http::Request<B>) -> Self::Future {
        for (k, v) in &self.headers {
            req.headers_mut().append(k, v.clone());
        }
        self.inner.call(req)
    }
}
