//! Why a webhook could not be served, or its certificate or configuration
//! made or kept in step: one error for the admission code and the
//! runtime's webhook, each keeping its source (an API error stays an API
//! error, with its status code, for whoever retries or reports it).

use std::net::SocketAddr;

/// A webhook's failure.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// Making, signing or reading back a key or certificate.
    #[error("{what}: {source}")]
    Certificate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    /// A PEM block the TLS stack cannot read.
    #[error("{what}: {source}")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The TLS stack refused the configuration.
    #[error("{what}: {source}")]
    Tls {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    /// The material's Secret has a key missing or unreadable.
    #[error("{key}: {why}")]
    Material { key: String, why: String },
    /// A request to the API server failed.
    #[error("{doing} {object}: {}", crate::util::api_error(.source))]
    Api {
        doing: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    /// The material's Secret is missing and Runbook may not create it.
    #[error(
        "Secret {secret} does not exist and Runbook may not create it ({message}): \
         create it empty (deploy/webhook.yaml does), Runbook fills it"
    )]
    SecretNotCreatable { secret: String, message: String },
    /// Replicas kept writing the Secret at once.
    #[error("Secret {0} kept changing under every write")]
    Contended(String),
    /// Listening or serving on the webhook's address.
    #[error("{doing} {addr}: {source}")]
    Io {
        doing: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A webhook configuration Runbook built does not deserialize.
    #[error("building {kind} {name}: {source}")]
    Build {
        kind: &'static str,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

impl WebhookError {
    /// A failed API request, `doing` what to `object`.
    pub fn api(doing: &'static str, object: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let object = object.into();
        move |source| Self::Api {
            doing,
            object,
            source,
        }
    }
}
