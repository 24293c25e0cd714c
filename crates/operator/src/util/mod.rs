//! The shared pieces of `runbook_core::util`, and here those that need the
//! API client or the async runtime.

pub mod channel;

/// An API error as a person reads it, on one line: the server's message,
/// code and reason (never a Debug dump).
pub fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}

/// An HTTPS (and HTTP) client that checks servers' certificates against
/// the system's roots, never follows a redirect, and speaks HTTP/1.1; `who`
/// names its users in the warning when there are no roots.
pub fn http_client(
    who: &str,
) -> hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<bytes::Bytes>,
> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match builder.with_native_roots() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("no CA certificates found ({e}); https {who} will fail");
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
        }
    };
    let https = builder.https_or_http().enable_http1().build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https)
}
