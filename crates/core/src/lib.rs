//! Runbook's core: everything a decision needs and nothing that talks to a
//! Kubernetes API server. Policies (YAML) and scripts (Rhai) are compiled
//! here, decided against what is observed, and planned into writes; the
//! operator (`runbook-operator`) watches, performs the plan and drives it.
//!
//! The crate has no Kubernetes client in its dependency graph (only the
//! types of `k8s-openapi` and `kube-core`), so "decide is pure" is held by
//! the compiler. Inside it, each module uses only those before it
//! (`tests/layering.rs`):
//!
//! - `util`, `clock`, `names`, `labels`, `kinds`, `schedule`: foundations;
//! - `metric`: metric inputs: their queries, quoted, and their answers read;
//! - `crd`: Runbook's own resource types;
//! - `observe`: the object model a decision reads;
//! - `script`: the hardened Rhai engine, `ctx`, helpers, actions;
//! - `alert`: routes and the alerts raised;
//! - `failure`: the kinds of failure every layer's error names;
//! - `policy`: documents compiled into what decides;
//! - `decide`: from what is observed to a decision;
//! - `plan`: a decision turned into writes, and their conclusion.

pub mod alert;
pub mod clock;
pub mod crd;
pub mod decide;
pub mod failure;
pub mod kinds;
pub mod labels;
pub mod metric;
pub mod names;
pub mod observe;
pub mod plan;
pub mod policy;
pub mod schedule;
pub mod script;
pub mod shard;
pub mod util;
