//! Where policy bundles come from at run time: ConfigMaps labelled
//! `runbook.dev/policy=true`.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::ListParams;

use runbook_core::policy::Bundle;

/// The label (`runbook.dev/policy: "true"`) that marks a ConfigMap as a
/// bundle of policies to load; not to be confused with
/// `observe::POLICY_NAME_LABEL`, which names the policy of a child.
pub const BUNDLE_LABEL: &str = "runbook.dev/policy";

/// Every policy ConfigMap in a namespace, as bundles.
pub async fn configmap_bundles(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<Bundle>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let list = match api
        .list(&ListParams::default().labels(&format!("{BUNDLE_LABEL}=true")))
        .await
    {
        Ok(l) => l,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(list
        .items
        .iter()
        .map(|cm| {
            Bundle::from_configmap(
                namespace,
                cm.metadata.name.as_deref().unwrap_or(""),
                &cm.data.clone().unwrap_or_default(),
            )
        })
        .collect())
}
