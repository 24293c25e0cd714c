//! Runbook: a Kubernetes operator whose reconcile behaviour is data.
//!
//! Policies (YAML) and scripts (Rhai) say what to do; a generic executor
//! does it. The spine, each part using only those before it (held by
//! `tests/layering.rs`):
//!
//! - `observe`: watch caches, the views a decision reads, discovery;
//! - `decide` (with `policy` and `script`): pure, from what is observed to
//!   a decision;
//! - `act`: the decision planned into writes (pure), then the one writer;
//! - `runtime` and `reload`: controllers, queue, leader election, hot reload.
//!
//! `sandbox`, `scenario` and `bench` stay off the operator's path: nothing
//! above uses them.
#![deny(unsafe_code)]

pub mod act;
pub mod admission;
pub mod alert;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod crd;
pub mod decide;
pub mod events;
pub mod kinds;
pub mod labels;
pub mod names;
pub mod observe;
pub mod policy;
pub mod rbac;
pub mod reload;
pub mod runtime;
pub mod sandbox;
pub mod scenario;
pub mod schedule;
pub mod schema;
pub mod script;
pub mod telemetry;
pub mod util;
