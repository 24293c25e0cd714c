//! Alerts: the routes, matchers and sinks of `runbook_core::alert`, and
//! here their grouping, notification log and delivery to receivers.

pub mod deliver;
pub mod dispatch;
pub mod nflog;
pub mod shared;
