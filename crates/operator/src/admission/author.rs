//! Who wrote a target's spec, in a form Runbook can trust: the author
//! record. The authorship webhook writes it into the annotation
//! `runbook.dev/author` of every target created or changed through the
//! API server, from the request's `userInfo`; the operator reads it back
//! before acting for the target on anything the target refers to, and
//! asks the API server whether that author may do it.
//!
//! A record is signed (HMAC-SHA256 with a key only Runbook's replicas
//! hold) over the object it belongs to (group, kind, namespace, name)
//! and a digest of its content (everything but `metadata` and `status`),
//! so it cannot be made up, moved to another object, or kept across a
//! change of the spec made while the webhook was not there to record
//! the new author. Pure: no I/O.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The annotation holding a target's author record.
pub const ANNOTATION: &str = "runbook.dev/author";

/// The field manager of Runbook's own writes; a policy's are
/// `runbook/POLICY`.
pub const MANAGER: &str = "runbook";

/// Whether a field manager is Runbook's (its own, or a policy's).
pub fn is_runbook_manager(manager: &str) -> bool {
    manager == MANAGER || manager.starts_with("runbook/")
}

/// Someone the API server authenticated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Author {
    #[serde(default)]
    pub user: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Author {
    /// The author of an admission request (its `userInfo`).
    pub fn of_user_info(info: &Value) -> Self {
        let text = |k: &str| {
            info.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let mut groups: Vec<String> = info
            .get("groups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect();
        groups.sort();
        groups.dedup();
        Self {
            user: text("username"),
            uid: text("uid"),
            groups,
            extra: serde_json::from_value(info.get("extra").cloned().unwrap_or_default())
                .unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for Author {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.user)
    }
}

/// What an author record is about: one object, at one content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    /// The object's name, or (for an object named by `generateName`, whose
    /// name the API server picks after admission) its prefix and `*`.
    pub name: String,
    pub content: String,
}

impl<'a> Subject<'a> {
    /// The subject of an object as it is (its `apiVersion`'s group).
    pub fn of(object: &'a Value) -> Self {
        let meta = object.get("metadata");
        let text = |k: &str| {
            meta.and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let name = match (text("name"), text("generateName")) {
            ("", prefix) if !prefix.is_empty() => format!("{prefix}*"),
            (name, _) => name.to_string(),
        };
        Self {
            group: api_version.rsplit_once('/').map_or("", |(g, _)| g),
            kind: object.get("kind").and_then(Value::as_str).unwrap_or(""),
            namespace: text("namespace"),
            name,
            content: content_digest(object),
        }
    }
}

/// Whether a record made for `recorded` is about an object named `name` (a
/// `prefix*` record covers the names generated from it).
fn names(recorded: &str, name: &str) -> bool {
    match recorded.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => recorded == name,
    }
}

/// A digest of what an object says apart from its metadata and status:
/// what its author wrote. Fields the API server and controllers change
/// through subresources (a scale's `spec.replicas`, a pod's binding to a
/// node) are left out, so those changes do not unmake the record. Numbers
/// are taken by value, so `1` and `1.0` are one content.
pub fn content_digest(object: &Value) -> String {
    let mut content = match object {
        Value::Object(m) => m
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<serde_json::Map<_, _>>(),
        _ => serde_json::Map::new(),
    };
    if let Some(Value::Object(spec)) = content.get_mut("spec") {
        spec.remove("replicas");
        spec.remove("nodeName");
    }
    let mut text = String::new();
    canonical(&Value::Object(content), &mut text);
    let digest = Sha256::digest(text.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// JSON with sorted keys and numbers by value.
fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                out.push_str(&(f as i64).to_string())
            }
            _ => out.push_str(&n.to_string()),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            // serde_json's Map keeps keys sorted here (no preserve_order).
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(item, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// An author record as the annotation holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    #[serde(flatten)]
    pub author: Author,
    /// The name the record was made for (`prefix*` for a generated one).
    pub name: String,
    /// The content digest it was made for.
    pub content: String,
    /// Whether the write was made with one of Runbook's field managers
    /// (`runbook`, `runbook/POLICY`). Absent from records made before it
    /// was recorded: those tell Runbook's writes by the user alone.
    #[serde(default, rename = "runbook", skip_serializing_if = "Option::is_none")]
    pub by_runbook: Option<bool>,
    /// HMAC-SHA256 of all of the above and the object's group, kind and
    /// namespace, hex.
    pub signature: String,
}

/// A verified author record: who wrote the object, and whether they wrote
/// it with one of Runbook's field managers (`None`: not recorded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub author: Author,
    pub by_runbook: Option<bool>,
}

impl Verified {
    /// Whether the object was written by the Runbook whose user name is
    /// `me`: its user, and (where recorded) one of its field managers.
    /// An operator run with its user's own credentials shares their user
    /// name; the field manager tells its writes from theirs, and nobody
    /// else's write passes for Runbook's by naming Runbook's manager.
    pub fn by(&self, me: &str) -> bool {
        self.author.user == me && self.by_runbook != Some(false)
    }
}

/// The key author records are signed with, shared by every replica.
#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)")
    }
}

impl Signer {
    pub fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    /// A fresh random key (tests, simulations; a cluster's comes from the
    /// Secret the replicas share).
    pub fn random() -> Self {
        let mut key = vec![0u8; 32];
        getrandom_fill(&mut key);
        Self::new(key)
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    fn mac(
        &self,
        subject: &Subject<'_>,
        name: &str,
        author: &Author,
        by_runbook: Option<bool>,
    ) -> String {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            return String::new();
        };
        let mut text = format!(
            "runbook-author-v1\n{}\n{}\n{}\n{name}\n{}\n{}\n{}\n",
            subject.group,
            subject.kind,
            subject.namespace,
            subject.content,
            author.user,
            author.uid
        );
        for g in &author.groups {
            text.push_str(&format!("g:{g}\n"));
        }
        for (k, vs) in &author.extra {
            for v in vs {
                text.push_str(&format!("x:{k}={v}\n"));
            }
        }
        if let Some(b) = by_runbook {
            text.push_str(&format!("m:{b}\n"));
        }
        mac.update(text.as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The record saying `author` wrote `subject`, with the field manager
    /// `manager` (empty: none given).
    pub fn sign(&self, subject: &Subject<'_>, author: &Author, manager: &str) -> Record {
        let mut author = author.clone();
        author.groups.sort();
        author.groups.dedup();
        let by_runbook = Some(is_runbook_manager(manager));
        Record {
            signature: self.mac(subject, &subject.name, &author, by_runbook),
            name: subject.name.clone(),
            content: subject.content.clone(),
            by_runbook,
            author,
        }
    }

    /// The author an object's record names, if the record is this
    /// signer's, about this object, at its current content.
    pub fn verify(&self, object: &Value) -> Result<Author, Unverified> {
        self.verified(object).map(|v| v.author)
    }

    /// [`Signer::verify`], with how the object was written.
    pub fn verified(&self, object: &Value) -> Result<Verified, Unverified> {
        let text = object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(ANNOTATION))
            .and_then(Value::as_str)
            .ok_or(Unverified::Missing)?;
        let record: Record = serde_json::from_str(text).map_err(|_| Unverified::Malformed)?;
        let subject = Subject::of(object);
        if !names(&record.name, &subject.name) {
            return Err(Unverified::OtherObject);
        }
        if record.content != subject.content {
            return Err(Unverified::Changed);
        }
        let expected = self.mac(&subject, &record.name, &record.author, record.by_runbook);
        if !constant_time_eq(expected.as_bytes(), record.signature.as_bytes()) {
            return Err(Unverified::BadSignature);
        }
        Ok(Verified {
            author: record.author,
            by_runbook: record.by_runbook,
        })
    }
}

/// Why an object's author is not known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unverified {
    /// No record: the object was written while no authorship webhook was
    /// there (or before Runbook's), or by a client it does not cover.
    Missing,
    Malformed,
    /// A record made for another object.
    OtherObject,
    /// The content changed since the record was made, without the
    /// webhook recording who changed it.
    Changed,
    /// Not signed with this key (made up, or signed by a Runbook with
    /// another key).
    BadSignature,
}

impl std::error::Error for Unverified {}

impl std::fmt::Display for Unverified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unverified::Missing => "it has no author record (written while the webhook was away)",
            Unverified::Malformed => "its author record is not one Runbook wrote",
            Unverified::OtherObject => "its author record belongs to another object",
            Unverified::Changed => "its spec changed while the webhook was away",
            Unverified::BadSignature => "its author record is not signed with this Runbook's key",
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Fill `buf` from the operating system's random source.
pub fn getrandom_fill(buf: &mut [u8]) {
    use ring::rand::SecureRandom;
    if ring::rand::SystemRandom::new().fill(buf).is_err() {
        // Never on Linux; a key of zeros would be worse than a panic only
        // if it went unnoticed, so say so loudly.
        panic!("the operating system's random source failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn evaluator(spec: Value) -> Value {
        json!({"apiVersion": "runbook.dev/v1alpha1", "kind": "Evaluator",
               "metadata": {"name": "chatbot", "namespace": "team-a", "annotations": {}},
               "spec": spec, "status": {"phase": "Healthy"}})
    }

    fn alice() -> Author {
        Author {
            user: "alice".into(),
            groups: vec!["team-a".into(), "system:authenticated".into()],
            ..Default::default()
        }
    }

    fn recorded(signer: &Signer, mut obj: Value, author: &Author) -> Value {
        let record = signer.sign(&Subject::of(&obj), author, "kubectl-create");
        obj["metadata"]["annotations"][ANNOTATION] = json!(serde_json::to_string(&record).unwrap());
        obj
    }

    #[test]
    fn a_record_names_its_author_only_for_its_own_object_and_content() {
        let signer = Signer::random();
        let ev = recorded(&signer, evaluator(json!({"threshold": 0.85})), &alice());
        assert_eq!(signer.verify(&ev).unwrap().user, "alice");
        // Status and metadata are not what the author wrote.
        let mut later = ev.clone();
        later["status"] = json!({"phase": "RolledBack"});
        later["metadata"]["labels"] = json!({"x": "y"});
        assert!(signer.verify(&later).is_ok());
        // Numbers by value.
        let mut same = ev.clone();
        same["spec"]["threshold"] = json!(0.85);
        assert!(signer.verify(&same).is_ok());
        // A changed spec, another object, another key, a forged author.
        let mut changed = ev.clone();
        changed["spec"]["threshold"] = json!(0.5);
        assert_eq!(signer.verify(&changed), Err(Unverified::Changed));
        let mut moved = ev.clone();
        moved["metadata"]["name"] = json!("other");
        assert_eq!(signer.verify(&moved), Err(Unverified::OtherObject));
        let mut elsewhere = ev.clone();
        elsewhere["metadata"]["namespace"] = json!("team-b");
        assert_eq!(signer.verify(&elsewhere), Err(Unverified::BadSignature));
        assert_eq!(Signer::random().verify(&ev), Err(Unverified::BadSignature));
        let mut forged: Record =
            serde_json::from_str(ev["metadata"]["annotations"][ANNOTATION].as_str().unwrap())
                .unwrap();
        forged.author.groups.push("system:masters".into());
        let mut f = ev.clone();
        f["metadata"]["annotations"][ANNOTATION] = json!(serde_json::to_string(&forged).unwrap());
        assert_eq!(signer.verify(&f), Err(Unverified::BadSignature));
        assert_eq!(
            signer.verify(&evaluator(json!({}))),
            Err(Unverified::Missing)
        );
    }

    #[test]
    fn a_record_from_before_managers_were_recorded_still_verifies() {
        let signer = Signer::random();
        let mut obj = evaluator(json!({"threshold": 0.85}));
        let subject = Subject::of(&obj);
        let record = Record {
            signature: signer.mac(&subject, &subject.name, &alice(), None),
            name: subject.name.clone(),
            content: subject.content.clone(),
            by_runbook: None,
            author: alice(),
        };
        let text = serde_json::to_string(&record).unwrap();
        assert!(!text.contains("runbook"), "{text}");
        obj["metadata"]["annotations"][ANNOTATION] = json!(text);
        let v = signer.verified(&obj).unwrap();
        assert_eq!(v.by_runbook, None);
        // Told by the user alone, as before.
        assert!(v.by("alice"));
        assert!(!v.by("bob"));
    }

    #[test]
    fn a_generated_name_is_covered_by_its_prefix_and_scale_changes_keep_the_record() {
        let signer = Signer::random();
        let mut obj = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                             "metadata": {"generateName": "web-", "namespace": "n"},
                             "spec": {"replicas": 1, "template": {}}});
        obj = recorded(&signer, obj, &alice());
        obj["metadata"]["name"] = json!("web-x7k2");
        obj["spec"]["replicas"] = json!(5);
        assert!(signer.verify(&obj).is_ok());
        obj["metadata"]["name"] = json!("db-x7k2");
        assert_eq!(signer.verify(&obj), Err(Unverified::OtherObject));
    }
}
