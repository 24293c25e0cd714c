//! Rollback with `kubectl rollout undo` semantics: the pod template of the
//! ReplicaSet at the wanted revision (by default the highest below the
//! current one) is written back to the Deployment.

use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::ExecError;
use runbook_core::kinds::KindRef;
use runbook_core::observe::RawObject;
use runbook_core::script::helpers::{revision_of, without_hash};

/// What a rollback did.
#[derive(Clone, Debug, PartialEq)]
pub enum RolledBack {
    /// The Deployment's template is now revision `to`'s.
    To { from: Option<i64>, to: i64 },
    /// The Deployment already runs that template.
    AlreadyAt(i64),
}

/// Choose the ReplicaSet to roll back to.
pub fn pick<'a>(
    deployment: &Value,
    replicasets: &'a [Value],
    revision: Option<i64>,
) -> Result<&'a Value, String> {
    let name = deployment["metadata"]["name"].as_str().unwrap_or("");
    let uid = deployment["metadata"]["uid"].as_str().unwrap_or("");
    let current = revision_of(deployment);
    let owned: Vec<&Value> = replicasets
        .iter()
        .filter(|rs| runbook_core::observe::owner_uids(rs).any(|u| u == uid))
        .collect();
    match revision {
        Some(r) => owned
            .into_iter()
            .find(|rs| revision_of(rs) == Some(r))
            .ok_or_else(|| format!("Deployment {name} has no ReplicaSet at revision {r}")),
        None => {
            let current = current.ok_or_else(|| {
                format!("Deployment {name} has no revision annotation; nothing to roll back from")
            })?;
            owned
                .into_iter()
                .filter(|rs| revision_of(rs).is_some_and(|r| r < current))
                .max_by_key(|rs| revision_of(rs))
                .ok_or_else(|| {
                    format!("Deployment {name} has no revision before {current} to roll back to")
                })
        }
    }
}

/// Roll `deployment` back. The Deployment and its ReplicaSets are read
/// from the API server: a rollback is rare and must not act on a stale cache.
pub async fn rollback(
    client: &kube::Client,
    namespace: &str,
    deployment: &str,
    revision: Option<i64>,
    manager: &str,
    changed_by: &str,
) -> Result<RolledBack, ExecError> {
    let deploy_kind = KindRef::new("apps/v1", "Deployment");
    let rs_kind = KindRef::new("apps/v1", "ReplicaSet");
    let deployments: Api<RawObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &std::sync::Arc::new(deploy_kind.api_resource()),
    );
    let rsets: Api<RawObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &std::sync::Arc::new(rs_kind.api_resource()),
    );
    let what = format!("rollback apps/v1 Deployment {namespace}/{deployment}");
    let dep = deployments
        .get(deployment)
        .await
        .map_err(|e| ExecError::api(&what, e))?;
    let selector = dep
        .value()
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        });
    let lp = match &selector {
        Some(s) if !s.is_empty() => ListParams::default().labels(s),
        _ => ListParams::default(),
    };
    let list = rsets
        .list(&lp)
        .await
        .map_err(|e| ExecError::api(&what, e))?;
    let all: Vec<Value> = list.items.iter().map(|o| o.value()).collect();
    let dep_value = dep.value();
    let rs = pick(&dep_value, &all, revision)
        .map_err(|m| ExecError::Rollback(format!("{what}: {m}")))?;
    let to = revision_of(rs).unwrap_or_default();
    let template = without_hash(&rs["spec"]["template"]);
    if without_hash(&dep_value["spec"]["template"]) == template {
        return Ok(RolledBack::AlreadyAt(to));
    }
    let from = revision_of(&dep_value);
    let note = match dep_value.pointer("/metadata/annotations") {
        Some(Value::Object(_)) => json!({"op": "add",
            "path": format!("/metadata/annotations/{}", runbook_core::plan::CHANGED_BY.replace('/', "~1")),
            "value": format!("{changed_by}: rollback to revision {to}")}),
        _ => json!({"op": "add", "path": "/metadata/annotations",
            "value": {runbook_core::plan::CHANGED_BY: format!("{changed_by}: rollback to revision {to}")}}),
    };
    let patch = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": dep.meta.resource_version},
        {"op": "replace", "path": "/spec/template", "value": template},
        note,
    ]);
    let ops: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| ExecError::Rollback(e.to_string()))?;
    deployments
        .patch(
            deployment,
            &PatchParams {
                field_manager: Some(manager.to_string()),
                ..Default::default()
            },
            &Patch::<()>::Json(ops),
        )
        .await
        .map_err(|e| ExecError::api(&what, e))?;
    Ok(RolledBack::To { from, to })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revision(n: i64) -> Value {
        json!({"deployment.kubernetes.io/revision": n.to_string()})
    }

    /// A Deployment at `revision`, as the rollback reads it.
    fn deployment(name: &str, revision_now: i64) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "annotations": revision(revision_now)},
            "spec": {"selector": {"matchLabels": {"app": name}}}
        })
    }

    /// A ReplicaSet the Deployment `owner` controls, at `revision`.
    fn replicaset(owner: &str, n: i64) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": format!("{owner}-rs{n}"), "namespace": "ml",
                         "annotations": revision(n), "labels": {"app": owner},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                             "name": owner, "uid": format!("uid-{owner}"), "controller": true}]},
            "spec": {"template": {"metadata": {"labels": {"app": owner}}}}
        })
    }

    #[test]
    fn the_previous_revision_is_the_highest_below_the_current_one() {
        let d = deployment("web", 5);
        let rss: Vec<Value> = [2, 4, 3, 5].iter().map(|r| replicaset("web", *r)).collect();
        assert_eq!(revision_of(pick(&d, &rss, None).unwrap()), Some(4));
        assert_eq!(revision_of(pick(&d, &rss, Some(2)).unwrap()), Some(2));
        assert!(
            pick(&d, &rss, Some(9))
                .unwrap_err()
                .contains("no ReplicaSet at revision 9")
        );
        let only = vec![replicaset("web", 5)];
        assert!(
            pick(&d, &only, None)
                .unwrap_err()
                .contains("no revision before 5")
        );
    }

    #[test]
    fn replicasets_of_other_deployments_do_not_count() {
        let d = deployment("web", 3);
        let rss = vec![replicaset("other", 2), replicaset("web", 1)];
        assert_eq!(revision_of(pick(&d, &rss, None).unwrap()), Some(1));
    }
}
