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
