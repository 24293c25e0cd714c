//! The journal: every action the operator carried out (or refused, or
//! held back), every alert that started or stopped firing, every
//! notification sent, as structured entries. Scenarios read it to print a
//! timeline and to check expectations; nothing else needs one.

use std::sync::Mutex;

use jiff::Timestamp;
use runbook_core::util::lock;
use serde::Serialize;
use serde_json::Value;

/// One thing that happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub time: Timestamp,
    /// apply, delete, patch, status, rollback, event, refusal, error,
    /// alert, resolve, notify, or world (something the scenario did).
    pub action: String,
    /// ok, unchanged, refused, limited, shadow, suspended, skipped or failed.
    pub result: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub policy: String,
    pub api_version: String,
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    /// What expectations match against: the applied object, the status
    /// fields set, the rollback's revisions, the alert's labels, ...
    #[serde(skip_serializing_if = "Value::is_null")]
    pub fields: Value,
    /// One readable line of detail.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Entry {
    pub fn new(time: Timestamp, action: &str, result: &str) -> Self {
        Self {
            time,
            action: action.into(),
            result: result.into(),
            policy: String::new(),
            api_version: String::new(),
            kind: String::new(),
            namespace: String::new(),
            name: String::new(),
            fields: Value::Null,
            detail: String::new(),
        }
    }

    pub fn object(mut self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Self {
        self.api_version = api_version.into();
        self.kind = kind.into();
        self.namespace = namespace.into();
        self.name = name.into();
        self
    }

    pub fn policy(mut self, policy: &str) -> Self {
        self.policy = policy.into();
        self
    }

    pub fn fields(mut self, fields: Value) -> Self {
        self.fields = fields;
        self
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }
}

/// Where entries go. Must not block.
pub trait Journal: Send + Sync {
    fn record(&self, entry: Entry);
}

/// Keeps entries in memory.
#[derive(Default)]
pub struct MemoryJournal {
    entries: Mutex<Vec<Entry>>,
}

impl MemoryJournal {
    pub fn entries(&self) -> Vec<Entry> {
        lock(&self.entries).clone()
    }
}

impl Journal for MemoryJournal {
    fn record(&self, entry: Entry) {
        lock(&self.entries).push(entry);
    }
}
