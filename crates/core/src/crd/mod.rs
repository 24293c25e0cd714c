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
pub use common::{ActionRecord, ActionResult, DecisionRecord, MetricRecord, StepState, StepStatus};
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

/// Fields `kubectl get --field-selector` may name, by CRD: which Evaluator
/// watches a Deployment, the backups of one database or volume, the
/// objects in a phase, the state of one target. Kubernetes serves them from
/// v1.31 (`selectableFields`); v1.28 to v1.30 refuse a CRD that declares
/// them, so they are an overlay of the CRDs rather than part of them.
pub fn selectable_fields(crd_name: &str) -> &'static [&'static str] {
    match crd_name {
        "evaluators.runbook.dev" => &[".spec.targetRef.name", ".status.phase"],
        "databasebackups.runbook.dev" => {
            &[".spec.database.statefulSet", ".spec.pvc", ".status.phase"]
        }
        "aimodels.runbook.dev" => &[".status.phase"],
        "runbookstates.runbook.dev" => &[
            ".spec.target.kind",
            ".spec.target.name",
            ".status.last.policy",
            ".status.last.result",
        ],
        _ => &[],
    }
}

/// Directory under `crds/` of the CRDs with their selectable fields (a
/// kustomize base of its own: `kubectl apply --server-side -k
/// crds/field-selectors`).
pub const FIELD_SELECTORS_DIR: &str = "field-selectors";

/// Every CRD with its selectable fields, for Kubernetes v1.31 and later.
pub fn all_with_field_selectors() -> Vec<CustomResourceDefinition> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::SelectableField;
    all()
        .into_iter()
        .map(|mut crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let fields: Vec<SelectableField> = selectable_fields(&name)
                .iter()
                .map(|p| SelectableField {
                    json_path: p.to_string(),
                })
                .collect();
            for v in &mut crd.spec.versions {
                v.selectable_fields = Some(fields.clone()).filter(|f| !f.is_empty());
            }
            crd
        })
        .collect()
}

/// The `kustomization.yaml` of `crds/` or of its field-selectors directory.
pub fn kustomization(field_selectors: bool) -> String {
    let head = match field_selectors {
        false => "# Runbook's CRDs as a kustomize base (deploy/ includes it). The CRD files\n\
                  # are generated: runbook crds --out-dir crds\n"
            .to_string(),
        true => "# Runbook's CRDs with field selectors, for Kubernetes v1.31 and later\n\
                 # (earlier releases refuse selectableFields: apply crds/ there):\n\
                 #   kubectl apply --server-side -k crds/field-selectors\n\
                 #   kubectl get evaluators --field-selector spec.targetRef.name=chatbot\n\
                 # Generated: runbook crds --out-dir crds\n"
            .to_string(),
    };
    let files: String = all()
        .iter()
        .map(|c| format!("  - {}\n", file_name(c)))
        .collect();
    format!(
        "{head}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{files}"
    )
}

/// All CRDs as one multi-document YAML stream, as `runbook crds` prints it.
pub fn all_yaml() -> String {
    all().iter().map(to_yaml).collect::<Vec<_>>().join("---\n")
}
