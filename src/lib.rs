//! Runbook: a Kubernetes operator whose reconcile behaviour is data.
//!
//! Policies (YAML) and scripts (Rhai) say what to do; a generic executor
//! does it. The `runbook` command puts the workspace's products in one
//! binary; this library is its command line (`cli`) and the JSON Schemas
//! it writes (`schema`). The products are crates, named by their own
//! names everywhere (one name per thing):
//!
//! - `runbook_core` (no Kubernetes client): `policy`, `script`, `decide`,
//!   `plan` and their foundations;
//! - `runbook_operator`: `observe`, `act`, `runtime`, `reload`, `alert`,
//!   `admission`, `telemetry`, `events`, `rbac`;
//! - `runbook_sandbox`, `runbook_simulator` (scenarios) and
//!   `runbook_bench`, off the operator's path.

pub mod cli;
pub mod schema;
