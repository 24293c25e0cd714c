//! Small shared pieces: YAML with positions, time formatting, hashing.

#[allow(unsafe_code)]
pub mod hash;
pub mod suggest;
pub mod time;
pub mod yaml;

/// An API error as a person reads it, on one line: the server's message,
/// code and reason (never a Debug dump).
pub fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}
