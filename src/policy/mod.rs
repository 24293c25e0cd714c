//! policy
pub mod model;
