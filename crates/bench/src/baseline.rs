//! The floor of a webhook-per-sync design: an HTTP round trip per sync (to
//! a loopback server that answers at once), with no work in it. The
//! hook-per-process designs are measured doing the real decision (`hooks`).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use super::{Stats, measure_async};

/// POST `body` to a loopback HTTP server that answers a fixed decision,
/// over a kept-alive connection, `iters` times.
pub async fn http_round_trip(body: Bytes, iters: usize) -> Stats {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("binding 127.0.0.1");
    let addr = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    // Read the whole request, as a webhook must.
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                        br#"{"status":{"phase":"RolledBack"},"children":[]}"#,
                    ))))
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let uri: hyper::Uri = format!("http://{addr}/sync").parse().expect("uri");
    let stats = measure_async(iters / 10, iters, || {
        let req = hyper::Request::post(uri.clone())
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .expect("request");
        let client = client.clone();
        async move {
            let resp = client.request(req).await.expect("round trip");
            resp.into_body().collect().await.expect("body").to_bytes()
        }
    })
    .await;
    server.abort();
    stats
}
