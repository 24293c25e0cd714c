//! Small shared pieces: YAML with positions, time formatting, hashing.

pub mod hash;
pub mod time;
pub mod yaml;
