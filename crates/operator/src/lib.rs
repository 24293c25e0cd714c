//! The Runbook operator: what turns `runbook-core`'s decisions into a
//! running controller.
//!
//! - `observe`: watch caches, the views a decision reads, discovery;
//! - `act`: the plan of `runbook_core::plan` performed by the one writer;
//! - `runtime` and `reload`: controllers, queue, leader election, hot reload;
//! - `alert`: grouping and delivery of the alerts policies raise;
//! - `admission`: the webhooks Runbook serves and the author records;
//! - `telemetry`, `events`, `rbac`: metrics and the journal, Kubernetes
//!   Events, least privilege derived from policies.

pub mod act;
pub mod admission;
pub mod alert;
pub mod events;
pub mod observe;
pub mod rbac;
pub mod reload;
pub mod runtime;
pub mod telemetry;
pub mod util;
