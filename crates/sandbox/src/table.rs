//! What kubectl asks for: `Table` output with printer columns, objects at
//! the version the client asked for, and watch lines.

use std::sync::Arc;

use bytes::Bytes;
use jiff::Timestamp;
use serde_json::{Value, json};

use super::registry::ResourceDef;
use super::store::EventRenderer;
use runbook_core::clock::Clock;

/// Serve an object at `version`: objects are stored at the storage
/// version, and a multi-version kind serves them at others with only the
/// `apiVersion` changed (no conversion webhooks).
pub fn at_version(def: &ResourceDef, version: &str, bytes: Bytes) -> Bytes {
    // An Event is shown in the group it was asked for (it is stored once
    // for both).
    if version == def.storage_version() && !def.is_event() {
        return bytes;
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut v) => {
            let wanted = def.api_version(version);
            if v["apiVersion"] == wanted.as_str() {
                return bytes;
            }
            v["apiVersion"] = json!(wanted);
            Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
        }
        Err(_) => bytes,
    }
}

/// Watch lines as JSON.
pub struct JsonRenderer {
    pub def: Arc<ResourceDef>,
    pub version: String,
}

impl EventRenderer for JsonRenderer {
    fn line(&self, ty: &str, object: &Bytes) -> Bytes {
        let object = at_version(&self.def, &self.version, object.clone());
        let mut out = Vec::with_capacity(object.len() + 32);
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(ty.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        out.extend_from_slice(&object);
        out.extend_from_slice(b"}\n");
        Bytes::from(out)
    }
}

/// Watch lines as one-row Tables, for `kubectl get -w`.
pub struct TableRenderer {
    pub def: Arc<ResourceDef>,
    pub version: String,
    pub clock: Clock,
}

impl EventRenderer for TableRenderer {
    fn line(&self, ty: &str, object: &Bytes) -> Bytes {
        let v: Value = serde_json::from_slice(object).unwrap_or_default();
        let rv = v
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let t = table(
            &self.def,
            &self.version,
            std::slice::from_ref(&v),
            rv,
            self.clock.now(),
            "Metadata",
        );
        Bytes::from(format!("{}\n", json!({"type": ty, "object": t})))
    }
}

/// Age as kubectl prints it: `45s`, `3m12s`, `25m`, `5h3m`, `12h`, `3d4h`, `40d`, `2y`.
pub fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

/// Evaluate the JSONPath subset printer columns use: `.a.b`, `.a[0]`, and
/// `.a[?(@.type=="Ready")].status`.
pub fn jsonpath<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    let mut rest = path.trim().trim_start_matches('{').trim_end_matches('}');
    rest = rest.strip_prefix('$').unwrap_or(rest);
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            cur = cur.get(&r[..end])?;
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                cur = cur
                    .as_array()?
                    .iter()
                    .find(|i| i.get(k.trim()).and_then(Value::as_str) == Some(want))?;
            } else {
                cur = cur.get(inner.trim().parse::<usize>().ok()?)?;
            }
        } else {
            return None;
        }
    }
    Some(cur)
}

fn cell(v: Option<&Value>, ty: &str, now: Timestamp) -> Value {
    match (v, ty) {
        (None, _) | (Some(Value::Null), _) => Value::Null,
        (Some(Value::String(s)), "date") => match s.parse::<Timestamp>() {
            Ok(t) => json!(human_age(now.as_second() - t.as_second())),
            Err(_) => json!(s),
        },
        (Some(v), _) => v.clone(),
    }
}

/// A `meta.k8s.io/v1` Table of objects.
pub fn table(
    def: &ResourceDef,
    version: &str,
    items: &[Value],
    rv: u64,
    now: Timestamp,
    include: &str,
) -> Value {
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    let mut paths: Vec<(String, String)> = Vec::new();
    match def.columns.get(version) {
        Some(cols) if !cols.is_empty() => {
            for c in cols {
                columns.push(json!({
                    "name": c["name"], "type": c["type"], "format": c.get("format").cloned().unwrap_or(json!("")),
                    "description": c.get("description").cloned().unwrap_or(json!("")),
                    "priority": c.get("priority").cloned().unwrap_or(json!(0)),
                }));
                paths.push((
                    c["jsonPath"].as_str().unwrap_or("").to_string(),
                    c["type"].as_str().unwrap_or("string").to_string(),
                ));
            }
        }
        _ => {
            columns.push(json!({"name": "Age", "type": "date", "format": "", "description": "Time since creation.", "priority": 0}));
            paths.push((".metadata.creationTimestamp".into(), "date".into()));
        }
    }
    let rows: Vec<Value> = items
        .iter()
        .map(|item| {
            let mut cells = vec![item["metadata"]["name"].clone()];
            for (p, ty) in &paths {
                cells.push(cell(jsonpath(item, p), ty, now));
            }
            let mut row = json!({"cells": cells});
            match include {
                "None" => {}
                "Object" => row["object"] = item.clone(),
                _ => {
                    row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": item["metadata"]});
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_print_like_kubectl() {
        assert_eq!(human_age(45), "45s");
        assert_eq!(human_age(192), "3m12s");
        assert_eq!(human_age(25 * 60), "25m");
        assert_eq!(human_age(5 * 3600 + 180), "5h3m");
        assert_eq!(human_age(3 * 86_400 + 4 * 3600), "3d4h");
    }

    #[test]
    fn jsonpath_handles_the_printer_column_subset() {
        let v = json!({"status": {"conditions": [{"type": "A", "status": "x"}, {"type": "Ready", "status": "True"}], "n": [5]}});
        assert_eq!(
            jsonpath(&v, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(&json!("True"))
        );
        assert_eq!(jsonpath(&v, ".status.n[0]"), Some(&json!(5)));
        assert_eq!(jsonpath(&v, ".status.missing"), None);
    }
}
