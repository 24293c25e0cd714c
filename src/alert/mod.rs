//! Alerts: Alertmanager-style routing from an `AlertRoutes` document, and
//! the sinks raised alerts go to.

pub mod deliver;
pub mod dispatch;
pub mod matcher;
pub mod model;
pub mod nflog;
pub mod notify;
pub mod routes;
pub mod sink;

pub use routes::CompiledRoutes;
pub use sink::{Alert, AlertSink, AlertSource, LogSink};
