//! The policy webhook: a policy ConfigMap checked when it is written
//! (`kubectl apply`, `--dry-run=server`) as the operator's reload would
//! check it, and refused with each error at its place
//! (`configmap/NS/NAME/file:line:col: message`). Notes that are not
//! errors come back as admission warnings, which kubectl prints.
//!
//! The reload stays the guard: a ConfigMap written while no replica
//! answers (the webhook's failures are ignored) is checked when it is
//! loaded, and refused there as before.

use futures::future::BoxFuture;
use runbook_core::policy::Bundle;
use serde_json::{Value, json};

/// Where the policy webhook is served.
pub const POLICIES_PATH: &str = "/policies";
/// The name of the policy webhook inside its configuration.
pub const POLICIES_WEBHOOK: &str = "policies.runbook.dev";

/// What a bundle would come to if it were loaded now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Each error that refuses it, with its place.
    pub errors: Vec<String>,
    /// Notes that do not refuse it.
    pub warnings: Vec<String>,
}

/// Checks a bundle as the reload would, changing nothing.
pub trait PolicyCheck: Send + Sync {
    fn check(&self, bundle: Bundle) -> BoxFuture<'_, Verdict>;
}

/// The answer to an AdmissionReview of a policy ConfigMap. A deletion,
/// and anything that is not a ConfigMap, is allowed: a ConfigMap's
/// removal takes its policies out, which the reload does whatever it is.
pub async fn review(check: Option<&dyn PolicyCheck>, review: &Value) -> Value {
    let request = &review["request"];
    let uid = request["uid"].clone();
    let answer = |allowed: bool, message: Option<String>, warnings: Vec<String>| {
        let mut response = json!({"uid": uid, "allowed": allowed});
        if let Some(m) = message {
            response["status"] = json!({"code": 422, "reason": "Invalid", "message": m});
        }
        if !warnings.is_empty() {
            response["warnings"] = json!(warnings);
        }
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
    };
    let object = &request["object"];
    if request["operation"] == "DELETE" || object["kind"] != "ConfigMap" {
        return answer(true, None, Vec::new());
    }
    let Some(check) = check else {
        let note = "Runbook did not check this policy: the replica that answered is still \
                    loading its policies; the operator checks it when it loads it";
        return answer(true, None, vec![note.to_string()]);
    };
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .or(request["namespace"].as_str())
        .unwrap_or_default();
    let name = object["metadata"]["name"]
        .as_str()
        .or(request["name"].as_str())
        .unwrap_or_default();
    let data = object["data"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
        .collect();
    let verdict = check
        .check(Bundle::from_configmap(namespace, name, &data))
        .await;
    if verdict.errors.is_empty() {
        return answer(true, None, verdict.warnings);
    }
    let n = verdict.errors.len();
    let message = format!(
        "Runbook refuses this policy ({n} error{}):\n{}",
        if n == 1 { "" } else { "s" },
        verdict.errors.join("\n")
    );
    answer(false, Some(message), verdict.warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Verdict);

    impl PolicyCheck for Fixed {
        fn check(&self, bundle: Bundle) -> BoxFuture<'_, Verdict> {
            let mut v = self.0.clone();
            v.warnings.push(format!("checked {}", bundle.origin));
            Box::pin(async move { v })
        }
    }

    fn request(operation: &str, data: Value) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u1", "operation": operation, "namespace": "team", "name": "p",
            "object": {"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "p", "namespace": "team"}, "data": data}}})
    }

    #[tokio::test]
    async fn errors_refuse_with_their_places_and_notes_are_warnings() {
        let bad = Fixed(Verdict {
            errors: vec![
                "configmap/team/p/p.rhai:3:7: syntax error".into(),
                "configmap/team/p/p.yaml:5:11: unknown kind".into(),
            ],
            warnings: Vec::new(),
        });
        let a = review(Some(&bad), &request("CREATE", json!({"p.yaml": "x"}))).await;
        let r = &a["response"];
        assert_eq!(r["uid"], "u1");
        assert_eq!(r["allowed"], false);
        let message = r["status"]["message"].as_str().unwrap();
        assert!(message.contains("(2 errors)"), "{message}");
        assert!(message.contains("\nconfigmap/team/p/p.rhai:3:7: syntax error\n"));
        assert_eq!(r["warnings"], json!(["checked configmap/team/p"]));
        let good = Fixed(Verdict::default());
        let a = review(Some(&good), &request("UPDATE", json!({}))).await;
        assert_eq!(a["response"]["allowed"], true);
        assert!(a["response"].get("status").is_none());
    }

    #[tokio::test]
    async fn deletions_and_an_unready_operator_are_allowed() {
        let bad = Fixed(Verdict {
            errors: vec!["e".into()],
            warnings: Vec::new(),
        });
        let a = review(Some(&bad), &request("DELETE", json!({}))).await;
        assert_eq!(a["response"]["allowed"], true);
        let a = review(None, &request("CREATE", json!({}))).await;
        assert_eq!(a["response"]["allowed"], true);
        let warning = a["response"]["warnings"][0].as_str().unwrap();
        assert!(warning.contains("did not check this policy"), "{warning}");
    }
}
