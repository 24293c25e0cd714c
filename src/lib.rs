//! Runbook: a Kubernetes operator whose reconcile behaviour is data.
//!
//! Policies (YAML) and scripts (Rhai) say what to do; a generic executor
//! does it. The `runbook` command puts the workspace's products in one
//! binary; this library is its command line, with each product's modules
//! under the names the command and the tests use:
//!
//! - `runbook-core` (no Kubernetes client): `policy`, `script`, `decide`,
//!   `plan` and their foundations;
//! - `runbook-operator`: `observe`, `act`, `runtime`, `reload`, `alert`,
//!   `admission`, `telemetry`, `events`, `rbac`;
//! - `runbook-sandbox` (`sandbox`), `runbook-simulator` (`scenario`) and
//!   `runbook-bench` (`bench`), off the operator's path.

pub mod cli;
pub mod schema;

pub use runbook_bench as bench;
pub use runbook_core::{
    clock, crd, decide, failure, kinds, labels, names, plan, policy, schedule, script, shard,
};
pub use runbook_operator::{
    act, admission, alert, events, observe, rbac, reload, runtime, telemetry, util,
};
pub use runbook_sandbox as sandbox;
pub use runbook_simulator as scenario;
