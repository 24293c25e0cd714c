//! Runbook: a Kubernetes operator whose reconcile behaviour is data.
//!
//! Policies (YAML) and scripts (Rhai) say what to do; the executor does it.
//! The layering is strict: `policy`, `script` and `decide` never touch the
//! network; `executor` and `controller` are the only writers; `sandbox` knows
//! nothing of policies.
#![deny(unsafe_code)]

pub mod alert;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod controller;
pub mod crd;
pub mod decide;
pub mod events;
pub mod executor;
pub mod fixtures;
pub mod journal;
pub mod kinds;
pub mod labels;
pub mod names;
pub mod observe;
pub mod policy;
pub mod rbac;
pub mod sandbox;
pub mod scenario;
pub mod schedule;
pub mod script;
pub mod telemetry;
pub mod util;
