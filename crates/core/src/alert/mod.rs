//! Alerts as policies declare them: Alertmanager-style routing from an
//! `AlertRoutes` document, matchers, the alerts raised and how they read in
//! a notification. Delivery is the operator's (`runbook_operator::alert`).

pub mod matcher;
pub mod model;
pub mod notify;
pub mod routes;
pub mod sink;

pub use routes::CompiledRoutes;
pub use sink::{Alert, AlertSink, AlertSource, LogSink};
