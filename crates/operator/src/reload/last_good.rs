//! The last version of each policy ConfigMap that loaded, kept in the
//! cluster: a ConfigMap of Runbook's own in the operator's namespace,
//! `runbook-last-good.NAMESPACE.NAME`, labelled `runbook.dev/last-good`
//! and holding the bundle's files as they were. At start-up a bundle whose
//! current version is refused runs that version instead, as it would
//! have after a refused edit had the operator not restarted.
//!
//! ```text
//! kubectl -n runbook-system get configmaps -l runbook.dev/last-good
//! ```

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use runbook_core::policy::{Bundle, Origin};

/// The label every kept copy carries (its value: `true`).
pub const LABEL: &str = "runbook.dev/last-good";
/// The annotation naming the bundle a copy is of (`configmap/NS/NAME`).
pub const OF: &str = "runbook.dev/last-good-of";
/// When the copy was written (RFC 3339).
pub const SAVED_AT: &str = "runbook.dev/saved-at";

/// The most a kept copy holds (the files' bytes): below the API server's
/// limit of an object, with room for its metadata. A bigger bundle is not
/// kept (and said so).
pub const MAX_BYTES: usize = 900 * 1024;

const MANAGER: &str = "runbook-last-good";

/// The name of the copy of `origin`'s bundle; none for bundles that are not
/// ConfigMaps (a directory is kept by whatever mounts it).
pub fn name_of(origin: &Origin) -> Option<String> {
    let Origin::ConfigMap { namespace, name } = origin else {
        return None;
    };
    let readable = format!("runbook-last-good.{namespace}.{name}");
    if readable.len() <= 253 {
        return Some(readable);
    }
    let hash = runbook_core::util::hash::json_hash(&json!([namespace, name]), 16);
    Some(format!("runbook-last-good.{hash}"))
}

/// A version of a bundle, as its files' hash: an unchanged one is not
/// kept again.
pub fn files_hash(bundle: &Bundle) -> String {
    runbook_core::util::hash::json_hash(&json!(bundle.files), 16)
}

/// The bytes a bundle's files hold.
pub fn size_of(bundle: &Bundle) -> usize {
    bundle.files.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// Why a bundle's last good version could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("its files hold {0} bytes, more than the {MAX_BYTES} a kept copy may")]
    TooBig(usize),
    #[error("{}", crate::util::api_error(.0))]
    Api(#[source] kube::Error),
}

/// Keep `bundle` as its origin's last good version, in `namespace`.
pub async fn save(
    client: &kube::Client,
    namespace: &str,
    bundle: &Bundle,
) -> Result<(), SaveError> {
    let Some(name) = name_of(&bundle.origin) else {
        return Ok(());
    };
    let size = size_of(bundle);
    if size > MAX_BYTES {
        return Err(SaveError::TooBig(size));
    }
    let now = runbook_core::util::time::format(jiff::Timestamp::now());
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL: "true", "app.kubernetes.io/managed-by": "runbook"},
            "annotations": {OF: bundle.origin.to_string(), SAVED_AT: now},
        },
        "data": bundle.files,
    });
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .map(|_| ())
    .map_err(SaveError::Api)
}

/// The kept copy of `origin`'s bundle, and when it was written; none when
/// there is none (or it cannot be read: the current version stands alone).
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    origin: &Origin,
) -> Option<(Bundle, String)> {
    let name = name_of(origin)?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = match api.get_opt(&name).await {
        Ok(cm) => cm?,
        Err(e) => {
            tracing::warn!(bundle = %origin, "reading its last good version ({namespace}/{name}): {}", crate::util::api_error(&e));
            return None;
        }
    };
    let annotations = cm.metadata.annotations.unwrap_or_default();
    // A copy of another bundle under this name (a hash collision, or an
    // object someone else made) is not this bundle's.
    if annotations.get(OF) != Some(&origin.to_string()) {
        return None;
    }
    let files: BTreeMap<String, String> = cm.data.unwrap_or_default().into_iter().collect();
    let saved_at = annotations.get(SAVED_AT).cloned().unwrap_or_default();
    Some((Bundle::new(origin.clone(), files), saved_at))
}

/// Remove the kept copy of a bundle that was deleted.
pub async fn forget(client: &kube::Client, namespace: &str, origin: &Origin) {
    let Some(name) = name_of(origin) else { return };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            tracing::warn!(bundle = %origin, "removing its last good version: {}", crate::util::api_error(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_named_after_its_bundle_and_long_names_are_hashed() {
        let o = Origin::ConfigMap {
            namespace: "team-a".into(),
            name: "drift".into(),
        };
        assert_eq!(
            name_of(&o).as_deref(),
            Some("runbook-last-good.team-a.drift")
        );
        let long = Origin::ConfigMap {
            namespace: "team-a".into(),
            name: "x".repeat(250),
        };
        let n = name_of(&long).unwrap();
        assert!(n.len() <= 253 && n.starts_with("runbook-last-good."), "{n}");
        assert_ne!(
            n,
            name_of(&Origin::ConfigMap {
                namespace: "team-b".into(),
                name: "x".repeat(250)
            })
            .unwrap()
        );
        assert_eq!(name_of(&Origin::Dir("/policies".into())), None);
    }
}
