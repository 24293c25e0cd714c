//! The HTTPS server the API server sends admission reviews to. Every
//! replica serves it (not only the leader): a webhook must answer however
//! leadership moves. The certificate is read afresh for each connection,
//! so a renewal takes effect without a restart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

/// The largest review body read (an object of the largest size the API
/// server stores, with its old version, fits).
const MAX_BODY: usize = 8 * 1024 * 1024;

/// What answers the reviews sent to one path.
pub type Handler = Arc<dyn Fn(Value) -> BoxFuture<'static, Value> + Send + Sync>;

/// The paths served and their handlers.
#[derive(Clone, Default)]
pub struct Routes(pub Vec<(String, Handler)>);

impl Routes {
    pub fn with(mut self, path: &str, handler: Handler) -> Self {
        self.0.push((path.to_string(), handler));
        self
    }

    fn find(&self, path: &str) -> Option<&Handler> {
        self.0.iter().find(|(p, _)| p == path).map(|(_, h)| h)
    }
}

fn respond(code: StatusCode, body: Vec<u8>, json: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    let ctype = if json {
        "application/json"
    } else {
        "text/plain"
    };
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    r
}

async fn handle(routes: &Routes, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    if path == "/healthz" {
        return respond(StatusCode::OK, b"ok".to_vec(), false);
    }
    let Some(handler) = routes.find(&path) else {
        return respond(StatusCode::NOT_FOUND, b"not found".to_vec(), false);
    };
    if req.method() != http::Method::POST {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            b"POST an AdmissionReview".to_vec(),
            false,
        );
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let msg = format!("reading the review: {e}");
            return respond(StatusCode::BAD_REQUEST, msg.into_bytes(), false);
        }
    };
    let review: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let msg = format!("the body is not an AdmissionReview: {e}");
            return respond(StatusCode::BAD_REQUEST, msg.into_bytes(), false);
        }
    };
    let answer = handler(review).await;
    respond(
        StatusCode::OK,
        serde_json::to_vec(&answer).unwrap_or_default(),
        true,
    )
}

/// A server running: stop it to close its listener and every connection
/// it holds (an API server keeps its connections to a webhook open).
pub struct Server {
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Server {
    pub fn stop(&self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}

/// Serve `routes` over HTTPS on `listener` with the configuration `tls`
/// holds at each new connection; returns the address it listens on.
pub fn serve(
    listener: std::net::TcpListener,
    tls: Arc<ArcSwap<rustls::ServerConfig>>,
    routes: Routes,
) -> std::io::Result<(SocketAddr, Server)> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let local = listener.local_addr()?;
    let routes = Arc::new(routes);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            // Answers are small and go at once: without this, Nagle's
            // algorithm meets the client's delayed ACK and each review
            // waits about 40 ms.
            let _ = stream.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.load_full());
            let routes = routes.clone();
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let serving = async {
                    // A client that never finishes its handshake holds nothing.
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
                    let Ok(Ok(stream)) = handshake.await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(move |req| {
                        let routes = routes.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(&routes, req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                };
                tokio::select! {
                    _ = serving => {}
                    _ = stopped.wait_for(|s| *s) => {}
                }
            });
        }
    });
    Ok((local, Server { task, stop }))
}
