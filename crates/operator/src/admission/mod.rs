//! Admission: the webhooks Runbook serves to the API server, over HTTPS
//! with certificates it makes itself, and what they record.
//!
//! - [`author`]: the author record of a target (who wrote its spec),
//!   signed so that nobody can make one up;
//! - [`review`]: the answers to admission reviews (the authorship
//!   webhook writes author records);
//! - [`policies`]: the policy webhook, which checks a policy ConfigMap as
//!   it is written;
//! - [`tls`]: the CA, serving certificate and signing key, in a Secret
//!   the replicas share;
//! - [`server`]: the HTTPS server every replica runs;
//! - [`config`]: the material's Secret and the webhook configurations,
//!   kept in step with the policies loaded;
//! - [`error`]: [`WebhookError`], what each of them fails with.

pub mod author;
pub mod config;
pub mod error;
pub mod policies;
pub mod review;
pub mod server;
pub mod tls;

pub use author::{Author, Signer, Unverified, Verified, is_runbook_manager};
pub use error::WebhookError;
pub use review::Authorship;
