//! The webhook server's certificates, made and rotated by Runbook itself:
//! a certificate authority of its own (ten years), a serving certificate
//! it signs for the webhook Service's names (one year, renewed once a
//! third of that is left or when the names change), and the key author
//! records are signed with. All of it lives in one Secret in the
//! operator's namespace that every replica reads, so each serves the same
//! certificate and verifies the same records; whichever replica finds it
//! missing or due makes the new one (a write guarded by resourceVersion:
//! the others read what won). A CA within a year of its end is replaced,
//! and the bundle the API server trusts carries the old one beside the new
//! until the old one expires.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use super::WebhookError;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// How long a CA is valid, and how long a serving certificate is.
const CA_LIFETIME: SignedDuration = SignedDuration::from_hours(24 * 3650);
const CERT_LIFETIME: SignedDuration = SignedDuration::from_hours(24 * 365);
/// A CA with less than this left is replaced.
const CA_RENEW_BEFORE: SignedDuration = SignedDuration::from_hours(24 * 365);

/// The keys of the Secret.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
const SIGNING_KEY: &str = "signing.key";
const CA_NOT_AFTER: &str = "ca.not-after";
const CERT_NOT_AFTER: &str = "tls.not-after";
const HOSTS: &str = "tls.hosts";

/// Everything the webhook server and the author records need.
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    /// The CAs the API server should trust, PEM (the current one first).
    pub ca_bundle: String,
    ca_key: String,
    pub cert: String,
    pub key: String,
    /// The key author records are signed with.
    pub signing_key: Vec<u8>,
    pub ca_not_after: Timestamp,
    pub cert_not_after: Timestamp,
    /// The names the serving certificate is for.
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("hosts", &self.hosts)
            .field("ca_not_after", &self.ca_not_after)
            .field("cert_not_after", &self.cert_not_after)
            .finish_non_exhaustive()
    }
}

/// What is due of the material.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// A new serving certificate from the same CA.
    Cert,
    /// A new CA, and a serving certificate from it.
    Ca,
}

fn offset(t: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t.as_second())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn cert(what: &'static str) -> impl FnOnce(rcgen::Error) -> WebhookError {
    move |source| WebhookError::Certificate { what, source }
}

fn pem(what: &'static str) -> impl FnOnce(rustls::pki_types::pem::Error) -> WebhookError {
    move |source| WebhookError::Pem { what, source }
}

fn tls(what: &'static str) -> impl FnOnce(rustls::Error) -> WebhookError {
    move |source| WebhookError::Tls { what, source }
}

/// The parameters of Runbook's CA; the same every time, so the CA's
/// issuer can be rebuilt from its key alone when a serving certificate is
/// renewed.
fn ca_params(not_before: Timestamp, not_after: Timestamp) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "runbook-webhook-ca");
    dn.push(DnType::OrganizationName, "runbook");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = offset(not_before);
    p.not_after = offset(not_after);
    p
}

fn serving_cert(
    ca_key: &KeyPair,
    hosts: &[String],
    now: Timestamp,
) -> Result<(String, String, Timestamp), WebhookError> {
    let issuer = Issuer::new(ca_params(now, now), ca_key);
    let mut p = CertificateParams::new(hosts.to_vec()).map_err(cert("certificate names"))?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        hosts
            .first()
            .map(String::as_str)
            .unwrap_or("runbook-webhook"),
    );
    p.distinguished_name = dn;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.use_authority_key_identifier_extension = true;
    let not_after = now.saturating_add(CERT_LIFETIME).unwrap_or(now);
    // A minute back, for clocks a little behind the one that issued it.
    p.not_before = offset(
        now.saturating_sub(SignedDuration::from_mins(1))
            .unwrap_or(now),
    );
    p.not_after = offset(not_after);
    let key = KeyPair::generate().map_err(cert("a serving key"))?;
    let cert = p
        .signed_by(&key, &issuer)
        .map_err(cert("signing the serving certificate"))?;
    Ok((cert.pem(), key.serialize_pem(), not_after))
}

impl Material {
    /// A new CA, serving certificate and signing key.
    pub fn generate(hosts: &[String], now: Timestamp) -> Result<Self, WebhookError> {
        let ca_key = KeyPair::generate().map_err(cert("a CA key"))?;
        let ca_not_after = now.saturating_add(CA_LIFETIME).unwrap_or(now);
        let before = now
            .saturating_sub(SignedDuration::from_mins(1))
            .unwrap_or(now);
        let ca = ca_params(before, ca_not_after)
            .self_signed(&ca_key)
            .map_err(cert("the CA certificate"))?;
        let (cert, key, cert_not_after) = serving_cert(&ca_key, hosts, now)?;
        let mut signing_key = vec![0u8; 32];
        super::author::getrandom_fill(&mut signing_key);
        Ok(Self {
            ca_bundle: ca.pem(),
            ca_key: ca_key.serialize_pem(),
            cert,
            key,
            signing_key,
            ca_not_after,
            cert_not_after,
            hosts: hosts.to_vec(),
        })
    }

    /// What is due at `now` for a server answering to `hosts`.
    pub fn due(&self, hosts: &[String], now: Timestamp) -> Option<Due> {
        if self.ca_not_after.duration_since(now) < CA_RENEW_BEFORE {
            return Some(Due::Ca);
        }
        let third = CERT_LIFETIME / 3;
        if self.cert_not_after.duration_since(now) < third || self.hosts != hosts {
            return Some(Due::Cert);
        }
        None
    }

    /// The material with what is due renewed; the signing key is kept (a
    /// new one would unmake every author record).
    pub fn renewed(
        &self,
        due: Due,
        hosts: &[String],
        now: Timestamp,
    ) -> Result<Self, WebhookError> {
        match due {
            Due::Cert => {
                let ca_key = KeyPair::from_pem(&self.ca_key).map_err(cert("the CA key"))?;
                let (cert, key, cert_not_after) = serving_cert(&ca_key, hosts, now)?;
                Ok(Self {
                    cert,
                    key,
                    cert_not_after,
                    hosts: hosts.to_vec(),
                    ..self.clone()
                })
            }
            Due::Ca => {
                let mut fresh = Self::generate(hosts, now)?;
                // The old CA stays trusted beside the new one until it
                // ends: a replica still serving a certificate it signed
                // keeps working meanwhile.
                let old_first = self.ca_bundle.split("-----END CERTIFICATE-----").next();
                if let Some(old) = old_first.filter(|_| self.ca_not_after > now) {
                    fresh.ca_bundle.push_str(old.trim_start());
                    fresh.ca_bundle.push_str("-----END CERTIFICATE-----\n");
                }
                fresh.signing_key = self.signing_key.clone();
                Ok(fresh)
            }
        }
    }

    /// The Secret's data.
    pub fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        let text = |s: &str| s.as_bytes().to_vec();
        [
            (CA_CERT, text(&self.ca_bundle)),
            (CA_KEY, text(&self.ca_key)),
            (CERT, text(&self.cert)),
            (KEY, text(&self.key)),
            (SIGNING_KEY, self.signing_key.clone()),
            (CA_NOT_AFTER, text(&self.ca_not_after.to_string())),
            (CERT_NOT_AFTER, text(&self.cert_not_after.to_string())),
            (HOSTS, text(&self.hosts.join(","))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Read the material back from the Secret's data.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Self, WebhookError> {
        let bad = |key: &str, why: String| WebhookError::Material {
            key: key.to_string(),
            why,
        };
        let bytes = |k: &str| {
            data.get(k)
                .cloned()
                .ok_or_else(|| bad(k, "the Secret has no such key".into()))
        };
        let text = |k: &str| {
            bytes(k).and_then(|b| String::from_utf8(b).map_err(|_| bad(k, "not text".into())))
        };
        let time = |k: &str| {
            text(k)?
                .trim()
                .parse::<Timestamp>()
                .map_err(|e| bad(k, e.to_string()))
        };
        let signing_key = bytes(SIGNING_KEY)?;
        if signing_key.len() < 32 {
            return Err(bad(SIGNING_KEY, "shorter than 32 bytes".into()));
        }
        Ok(Self {
            ca_bundle: text(CA_CERT)?,
            ca_key: text(CA_KEY)?,
            cert: text(CERT)?,
            key: text(KEY)?,
            signing_key,
            ca_not_after: time(CA_NOT_AFTER)?,
            cert_not_after: time(CERT_NOT_AFTER)?,
            hosts: text(HOSTS)?
                .split(',')
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect(),
        })
    }

    /// A TLS server configuration serving this certificate.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, WebhookError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(pem("the serving certificate"))?;
        let key =
            PrivateKeyDer::from_pem_slice(self.key.as_bytes()).map_err(pem("the serving key"))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls("TLS versions"))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(tls("the serving certificate"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        vec![
            "runbook-webhook.runbook-system.svc".into(),
            "127.0.0.1".into(),
        ]
    }

    #[test]
    fn material_round_trips_through_the_secret_and_renews_when_due() {
        let now: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
        let m = Material::generate(&hosts(), now).unwrap();
        assert!(m.ca_bundle.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(Material::from_data(&m.to_data()).unwrap(), m);
        assert!(m.server_config().is_ok());
        assert_eq!(m.due(&hosts(), now), None);
        // A third of the certificate's year left: a new certificate, same CA and key.
        let later = now
            .saturating_add(SignedDuration::from_hours(24 * 250))
            .unwrap();
        assert_eq!(m.due(&hosts(), later), Some(Due::Cert));
        let r = m.renewed(Due::Cert, &hosts(), later).unwrap();
        assert_ne!(r.cert, m.cert);
        assert_eq!(
            (r.ca_bundle.as_str(), &r.signing_key),
            (m.ca_bundle.as_str(), &m.signing_key)
        );
        assert!(r.cert_not_after > m.cert_not_after);
        // Other names: a new certificate.
        assert_eq!(m.due(&["other.svc".to_string()], now), Some(Due::Cert));
        // A CA in its last year: a new CA, the old one still trusted, the
        // records' key kept.
        let old = now
            .saturating_add(SignedDuration::from_hours(24 * 3400))
            .unwrap();
        assert_eq!(m.due(&hosts(), old), Some(Due::Ca));
        let c = m.renewed(Due::Ca, &hosts(), old).unwrap();
        assert_eq!(c.ca_bundle.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(
            c.ca_bundle.ends_with(m.ca_bundle.as_str()),
            "the old CA follows the new one"
        );
        assert_eq!(c.signing_key, m.signing_key);
        assert!(Material::from_data(&BTreeMap::new()).is_err());
    }
}
