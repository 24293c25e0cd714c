//! The custom resources Runbook ships: `Evaluator`, `DatabaseBackup` and
//! `AIModel`, group `runbook.dev`, version `v1alpha1`, and `RunbookState`,
//! where Runbook keeps what it remembers of targets of other kinds.
//!
//! The Rust types are the source of truth; `runbook crds` prints the YAML the
//! cluster needs and `crds/` holds exactly that output. Validation that a real
//! API server can enforce (ranges, required fields, enums, patterns) lives in
//! the schemas, so a bad CR is refused at `kubectl apply`.
#![allow(clippy::duplicated_attributes)] // printcolumn(...) attributes share `type_`

mod aimodel;
mod backup;
mod common;
mod evaluator;
pub mod state;

pub use aimodel::{AIModel, AIModelSpec, AIModelStatus, WeightsVolume};
pub use backup::{DatabaseBackup, DatabaseBackupSpec, DatabaseBackupStatus, DatabaseRef, DumpSpec};
pub use common::{ActionRecord, ActionResult, DecisionRecord, StepState, StepStatus};
pub use evaluator::{
    Benchmark, Evaluator, EvaluatorAlert, EvaluatorSpec, EvaluatorStatus, RollbackRecord,
    ScoreSample, TargetRef,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;

/// Every CRD Runbook ships, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        Evaluator::crd(),
        DatabaseBackup::crd(),
        AIModel::crd(),
        state::crd(),
    ]
}

/// File name under `crds/` for one CRD.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// The YAML text for one CRD, as written to `crds/`.
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    let value = serde_json::to_value(crd).expect("a CRD always serialises");
    crate::util::yaml::to_string(&value)
}

/// All CRDs as one multi-document YAML stream, as `runbook crds` prints it.
pub fn all_yaml() -> String {
    all().iter().map(to_yaml).collect::<Vec<_>>().join("---\n")
}
