//! The admission reviews Runbook answers. `authorship` is a mutating
//! webhook on the kinds policies target: it writes the author record of
//! every target created or changed and, running sharded, places each new
//! target on its replica; it never refuses a request.

use std::sync::Arc;

use base64::Engine as _;
use runbook_core::shard::{PLACED_ANNOTATION, SHARD_LABEL};
use serde_json::{Map, Value, json};

use super::author::{ANNOTATION, Author, Signer, Subject};

/// Where a new target goes, running sharded: the member the published
/// ring places it on, or `None` (not sharded, no ring yet, no policy
/// selects it, a generated name).
pub type Placer = Arc<dyn Fn(&Value) -> Option<String> + Send + Sync>;

/// The authorship webhook: who wrote a target, recorded as the API server
/// authenticated them, and whether with one of Runbook's field managers
/// (the request's `options.fieldManager`). A target Runbook itself
/// writes, a child that another policy targets, is recorded as Runbook's;
/// the operator then acts for the author of the target it was made for.
///
/// With a `placer` (sharded replicas), a target created without a shard
/// label is given its label here, with [`PLACED_ANNOTATION`] beside it,
/// so that the assigner need not write it again; the annotation is kept
/// only by writes that keep both as they were.
#[derive(Clone)]
pub struct Authorship {
    pub signer: Signer,
    pub placer: Option<Placer>,
}

impl std::fmt::Debug for Authorship {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorship")
            .field("signer", &self.signer)
            .field("placing", &self.placer.is_some())
            .finish()
    }
}

/// The answer to one AdmissionReview: allowed, with the patch (if any).
fn answer(uid: &Value, patch: Option<Value>, warning: Option<String>) -> Value {
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(p) = patch {
        let text = serde_json::to_vec(&p).unwrap_or_default();
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
    if let Some(w) = warning {
        response["warnings"] = json!([w]);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

fn annotation(object: &Value) -> Option<&str> {
    text_in(object, "annotations", ANNOTATION)
}

/// A string of `metadata.<field>` (labels, annotations) of an object.
fn text_in<'a>(object: &'a Value, field: &str, key: &str) -> Option<&'a str> {
    object
        .pointer(&format!("/metadata/{field}"))
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
}

impl Authorship {
    /// Answer an AdmissionReview (v1) for a create or update of a target.
    pub fn review(&self, review: &Value) -> Value {
        let request = review.get("request").cloned().unwrap_or_default();
        let uid = request.get("uid").cloned().unwrap_or(Value::Null);
        let Some(object) = request.get("object").filter(|o| o.is_object()) else {
            return answer(&uid, None, None);
        };
        let requester = Author::of_user_info(&request.get("userInfo").cloned().unwrap_or_default());
        let old = request.get("oldObject").filter(|o| o.is_object());
        let manager = request
            .pointer("/options/fieldManager")
            .and_then(Value::as_str)
            .unwrap_or("");
        let record = self.record_for(object, old, &requester, manager);
        let text = serde_json::to_string(&record).unwrap_or_default();
        let map = |field: &str| {
            object
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_object)
                .cloned()
        };
        let (was_annotated, was_labelled) = (map("annotations"), map("labels"));
        let mut annotations = was_annotated.clone().unwrap_or_default();
        let mut labels = was_labelled.clone().unwrap_or_default();
        annotations.insert(ANNOTATION.into(), json!(text));
        self.place(object, old, &mut labels, &mut annotations);
        let mut patch = Vec::new();
        for (field, was, now) in [
            ("annotations", was_annotated, annotations),
            ("labels", was_labelled, labels),
        ] {
            if was.as_ref() != Some(&now) && !(was.is_none() && now.is_empty()) {
                // `add` of the whole map: the new one, or in place of the old.
                patch
                    .push(json!({"op": "add", "path": format!("/metadata/{field}"), "value": now}));
            }
        }
        answer(&uid, (!patch.is_empty()).then(|| json!(patch)), None)
    }

    /// The shard label and placement mark the object leaves admission
    /// with. Created without a label: the placer's member, marked. The
    /// mark is Runbook's own: brought by a creation, or kept by an update
    /// that changes the label or the mark, it is dropped.
    fn place(
        &self,
        object: &Value,
        old: Option<&Value>,
        labels: &mut Map<String, Value>,
        annotations: &mut Map<String, Value>,
    ) {
        let kept = match old {
            None => {
                let member = match labels.contains_key(SHARD_LABEL) {
                    true => None,
                    false => self.placer.as_ref().and_then(|p| p(object)),
                };
                if let Some(member) = member {
                    labels.insert(SHARD_LABEL.into(), json!(member));
                    annotations.insert(PLACED_ANNOTATION.into(), json!(member));
                    return;
                }
                false
            }
            Some(old) => {
                let same = |field: &str, key: &str| {
                    text_in(old, field, key) == text_in(object, field, key)
                };
                same("labels", SHARD_LABEL) && same("annotations", PLACED_ANNOTATION)
            }
        };
        if !kept {
            annotations.remove(PLACED_ANNOTATION);
        }
    }

    /// The record the object leaves admission with: the one it had,
    /// while its content is what that record was made for (whoever
    /// changes only its metadata, or tries to write the record itself);
    /// otherwise the requester's.
    fn record_for(
        &self,
        object: &Value,
        old: Option<&Value>,
        requester: &Author,
        manager: &str,
    ) -> super::author::Record {
        let subject = Subject::of(object);
        let kept = old
            .filter(|o| Subject::of(o).content == subject.content)
            .filter(|o| self.signer.verify(o).is_ok());
        if let Some(o) = kept
            && let Some(text) = annotation(o)
            && let Ok(record) = serde_json::from_str(text)
        {
            return record;
        }
        self.signer.sign(&subject, requester, manager)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: &str, user: &str, object: Value, old: Option<Value>) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "r-1", "operation": op,
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": object, "oldObject": old.unwrap_or(Value::Null)}})
    }

    /// The object as it leaves admission: the answer's patch applied.
    fn admitted(object: &Value, answer: &Value) -> Value {
        let mut o = object.clone();
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["uid"], "r-1");
        if let Some(p) = answer["response"]["patch"].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
            json_patch::patch(&mut o, &patch).unwrap();
        }
        o
    }

    fn evaluator(target: &str, annotations: Value) -> Value {
        json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
               "metadata": {"name": "chatbot", "namespace": "team-a", "annotations": annotations},
               "spec": {"targetRef": {"name": target}}})
    }

    #[test]
    fn the_author_is_whoever_last_changed_the_spec() {
        let hook = Authorship {
            signer: Signer::random(),
            placer: None,
        };
        let created = evaluator("web", json!(null));
        let mut bare = created.clone();
        bare["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        let a1 = admitted(
            &bare,
            &hook.review(&request("CREATE", "admin", bare.clone(), None)),
        );
        assert_eq!(hook.signer.verify(&a1).unwrap().user, "admin");
        // Someone else edits only metadata (or forges the annotation):
        // the admin's record stays.
        let mut forged = a1.clone();
        forged["metadata"]["labels"] = json!({"x": "y"});
        forged["metadata"]["annotations"][ANNOTATION] = json!("{\"user\": \"admin\"}");
        let a2 = admitted(
            &forged,
            &hook.review(&request(
                "UPDATE",
                "mallory",
                forged.clone(),
                Some(a1.clone()),
            )),
        );
        assert_eq!(hook.signer.verify(&a2).unwrap().user, "admin");
        // ... but a change of the spec is theirs.
        let mut retargeted = a2.clone();
        retargeted["spec"]["targetRef"]["name"] = json!("db");
        let a3 = admitted(
            &retargeted,
            &hook.review(&request(
                "UPDATE",
                "mallory",
                retargeted.clone(),
                Some(a2.clone()),
            )),
        );
        assert_eq!(hook.signer.verify(&a3).unwrap().user, "mallory");
        // Nothing to change: no patch.
        let again = hook.review(&request("UPDATE", "admin", a3.clone(), Some(a3.clone())));
        assert!(again["response"].get("patch").is_none());
    }

    fn request_by(user: &str, manager: &str, object: Value) -> Value {
        let mut r = request("CREATE", user, object, None);
        r["request"]["options"] = json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": manager});
        r
    }

    #[test]
    fn runbooks_writes_are_told_by_user_and_field_manager_together() {
        let hook = Authorship {
            signer: Signer::random(),
            placer: None,
        };
        let obj = evaluator("web", json!({}));
        let verified = |user: &str, manager: &str| {
            let a = admitted(&obj, &hook.review(&request_by(user, manager, obj.clone())));
            hook.signer.verified(&a).unwrap()
        };
        // An operator run with its user's own kubeconfig: the same user
        // name, told apart by the field manager.
        assert!(!verified("admin", "kubectl-client-side-apply").by("admin"));
        assert!(!verified("admin", "").by("admin"));
        assert!(verified("admin", "runbook/evaluator").by("admin"));
        assert!(verified("admin", "runbook").by("admin"));
        // Naming Runbook's manager does not make anyone else Runbook.
        assert!(!verified("mallory", "runbook/evaluator").by("admin"));
        // The manager is signed with the rest.
        let mut legacy = admitted(&obj, &hook.review(&request_by("admin", "x", obj.clone())));
        let text = legacy["metadata"]["annotations"][ANNOTATION]
            .as_str()
            .unwrap();
        let mut record: crate::admission::author::Record = serde_json::from_str(text).unwrap();
        assert_eq!(record.by_runbook, Some(false));
        record.by_runbook = Some(true);
        legacy["metadata"]["annotations"][ANNOTATION] =
            json!(serde_json::to_string(&record).unwrap());
        assert!(
            hook.signer.verified(&legacy).is_err(),
            "the manager is signed: it cannot be changed afterwards"
        );
    }

    /// Sharded, a new target leaves admission labelled for its member and
    /// marked so; the mark lasts while label and mark stay as they were,
    /// and nobody brings one of their own.
    #[test]
    fn a_new_target_is_placed_at_admission_and_the_mark_is_runbooks_own() {
        let hook = Authorship {
            signer: Signer::random(),
            placer: Some(Arc::new(|o: &Value| {
                (o.pointer("/metadata/name")? == "chatbot").then(|| "r2".to_string())
            })),
        };
        let review = |op: &str, object: &Value, old: Option<&Value>| {
            admitted(
                object,
                &hook.review(&request(op, "admin", object.clone(), old.cloned())),
            )
        };
        let created = review("CREATE", &evaluator("web", json!(null)), None);
        assert_eq!(created["metadata"]["labels"][SHARD_LABEL], "r2");
        assert_eq!(created["metadata"]["annotations"][PLACED_ANNOTATION], "r2");
        assert!(runbook_core::shard::placed_since_creation(&created, "r2"));
        assert_eq!(hook.signer.verify(&created).unwrap().user, "admin");
        // A change of the spec keeps both.
        let mut changed = created.clone();
        changed["spec"]["targetRef"]["name"] = json!("db");
        let changed = review("UPDATE", &changed, Some(&created));
        assert!(runbook_core::shard::placed_since_creation(&changed, "r2"));
        // A move (the label taken off, or set by hand) drops the mark.
        let mut moved = changed.clone();
        moved["metadata"]["labels"][SHARD_LABEL] = json!("r0");
        let moved = review("UPDATE", &moved, Some(&changed));
        assert!(
            moved["metadata"]["annotations"]
                .get(PLACED_ANNOTATION)
                .is_none()
        );
        // ... and it cannot be brought back by hand.
        let mut forged = moved.clone();
        forged["metadata"]["annotations"][PLACED_ANNOTATION] = json!("r0");
        let forged = review("UPDATE", &forged, Some(&moved));
        assert!(!runbook_core::shard::placed_since_creation(&forged, "r0"));
        // A target created with a label of its own, or one the placer
        // does not place, is left to the assigner, and no mark it brings
        // stays.
        let own = evaluator("web", json!({PLACED_ANNOTATION: "r0"}));
        let mut own = own.clone();
        own["metadata"]["labels"] = json!({SHARD_LABEL: "r0"});
        let own = review("CREATE", &own, None);
        assert_eq!(own["metadata"]["labels"][SHARD_LABEL], "r0");
        assert!(
            own["metadata"]["annotations"]
                .get(PLACED_ANNOTATION)
                .is_none()
        );
        let mut other = evaluator("web", json!(null));
        other["metadata"]["name"] = json!("other");
        let other = review("CREATE", &other, None);
        assert!(other["metadata"].get("labels").is_none());
        assert!(hook.signer.verify(&other).is_ok());
    }

    #[test]
    fn a_request_without_an_object_is_allowed_unchanged() {
        let hook = Authorship {
            signer: Signer::random(),
            placer: None,
        };
        let a = hook.review(&json!({"request": {"uid": "r-1", "operation": "DELETE"}}));
        assert_eq!(a["response"]["allowed"], true);
        assert!(a["response"].get("patch").is_none());
        let a = hook.review(&json!("garbage"));
        assert_eq!(a["response"]["allowed"], true);
    }
}
