//! `AIModel`: serve a model from a URI on GPUs.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{DecisionRecord, conditions_schema, decisions_schema};

fn default_replicas() -> i32 {
    1
}

fn default_gpus() -> i32 {
    1
}

fn default_port() -> i32 {
    8080
}

/// A model served by a Deployment with GPUs and a Service.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "runbook.dev",
    version = "v1alpha1",
    kind = "AIModel",
    namespaced,
    status = "AIModelStatus",
    shortname = "aim",
    category = "runbook",
    derive = "PartialEq",
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.modelUri"),
    printcolumn(name = "GPUs", type_ = "integer", json_path = ".spec.gpusPerReplica"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AIModelSpec {
    /// Where the weights come from: s3://, gs://, https://, hf:// or pvc://.
    #[schemars(regex(pattern = r"^(s3|gs|https?|hf|pvc)://[^\s]+$"))]
    pub model_uri: String,
    /// The serving container image.
    #[schemars(length(min = 1))]
    pub serving_image: String,
    /// Image of the init container that downloads the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downloader_image: Option<String>,
    #[serde(default = "default_gpus")]
    #[schemars(range(min = 1, max = 16))]
    pub gpus_per_replica: i32,
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,
    /// The volume the weights are downloaded into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<WeightsVolume>,
    /// Port the serving container listens on.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// Size and class of the weights volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightsVolume {
    /// A quantity such as `20Gi`.
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"))]
    pub size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// Serving state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AIModelStatus {
    /// Pending, Progressing, Ready or Degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The model URI the running revision serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model_uri: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Each policy's latest decision, keyed by policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "decisions_schema")]
    pub decisions: Vec<DecisionRecord>,
}
