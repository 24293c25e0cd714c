//! Small shared pieces: YAML with positions, time formatting, hashing.

// The one exception to no unsafe code: a GlobalAlloc must be unsafe.
#[allow(unsafe_code)]
pub mod alloc;
pub mod hash;
pub mod time;
pub mod yaml;
