//! Alerts: Alertmanager-style routing from an `AlertRoutes` document.

pub mod matcher;
pub mod routes;

pub use routes::CompiledRoutes;
