//! The schemas the API server publishes for the kinds it serves (its
//! OpenAPI v3 documents, one per group version), read to tell a policy's
//! author what the server would drop of what the policy writes.

use std::collections::HashMap;

use runbook_core::kinds::KindRef;
use serde_json::Value;

/// Published schemas, each group version's document asked for once.
#[derive(Default)]
pub struct ServedSchemas {
    documents: HashMap<String, Option<Value>>,
}

impl ServedSchemas {
    /// The schema of `kind`'s status as served: `None` when the server
    /// publishes none for it or its schema keeps any field; `Some(Null)`
    /// when it declares no status.
    pub async fn status(&mut self, client: &kube::Client, kind: &KindRef) -> Option<Value> {
        let path = match kind.group() {
            "" => format!("/openapi/v3/api/{}", kind.version()),
            g => format!("/openapi/v3/apis/{g}/{}", kind.version()),
        };
        if !self.documents.contains_key(&path) {
            let doc = match http::Request::get(&path).body(Vec::new()) {
                Ok(req) => client.request::<Value>(req).await.ok(),
                Err(_) => None,
            };
            self.documents.insert(path.clone(), doc);
        }
        let doc = self.documents.get(&path)?.as_ref()?;
        // Components are named by the group reversed, as Java packages are.
        let reversed: Vec<&str> = kind.group().split('.').rev().collect();
        let key = format!("{}.{}.{}", reversed.join("."), kind.version(), kind.kind);
        let schema = doc.pointer(&format!("/components/schemas/{}", key.replace('/', "~1")))?;
        if schema["x-kubernetes-preserve-unknown-fields"] == true {
            return None;
        }
        Some(schema["properties"]["status"].clone())
    }
}
