//! Old and new: the fields a policy declares in `spec.previous`, as they
//! were at its last decision that concluded. They ride in the policy's
//! decision record (flat, by path), so they survive restarts and
//! failover and cost no write of their own: the record changes, and is
//! written, only when a declared field did.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::crd::DecisionRecord;

/// A kept value over this much JSON is kept as its hash: enough to say
/// whether it changed, not what it was.
pub const KEEP_WHOLE_BYTES: usize = 1024;

/// The key of a value kept as its hash.
const HASHED: &str = "runbook.dev/hash";

/// The value at `path` in `target`, if there.
fn at<'a>(target: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(target, |v, seg| v.get(seg))
        .filter(|v| !v.is_null())
}

/// A value as a record keeps it: whole, or past `KEEP_WHOLE_BYTES` its
/// hash.
fn kept(v: Option<&Value>) -> Value {
    let Some(v) = v else {
        return Value::Null;
    };
    let text = v.to_string();
    if text.len() <= KEEP_WHOLE_BYTES {
        return v.clone();
    }
    let hash = crate::util::hash::fnv64(text.as_bytes());
    serde_json::json!({ HASHED: format!("{hash:016x}") })
}

/// What a record keeps of `target` for these paths.
pub fn snapshot(paths: &[String], target: &Value) -> BTreeMap<String, Value> {
    paths
        .iter()
        .map(|p| (p.clone(), kept(at(target, p))))
        .collect()
}

/// The declared paths whose value in `target` differs from what the
/// policy's last concluded decision kept: every one when none did.
pub fn changed(
    paths: &[String],
    last: Option<&BTreeMap<String, Value>>,
    target: &Value,
) -> Vec<String> {
    paths
        .iter()
        .filter(|p| last.and_then(|l| l.get(p.as_str())) != Some(&kept(at(target, p))))
        .cloned()
        .collect()
}

/// What the policy's last concluded decision kept, from its record.
pub struct Last {
    /// The declared fields' values; `None` before its first.
    pub kept: Option<BTreeMap<String, Value>>,
    /// When one of them last changed.
    pub changed_at: Option<jiff::Timestamp>,
}

/// [`Last`] from the policy's record on `target` (read once).
pub fn last(target: &Value, policy: &str) -> Last {
    let record = DecisionRecord::of(target, policy);
    Last {
        changed_at: record
            .as_ref()
            .and_then(|r| r.changed_at.as_deref())
            .and_then(crate::util::time::parse),
        kept: record.map(|r| r.previous).filter(|p| !p.is_empty()),
    }
}

/// The kept values as an object shaped like the target (`spec.replicas`
/// under `spec`), those kept as a hash left out.
pub fn as_object(last: &BTreeMap<String, Value>) -> Value {
    let mut root = Map::new();
    for (path, v) in last {
        if v.is_null() || v.get(HASHED).is_some() {
            continue;
        }
        let segs: Vec<&str> = path.split('.').collect();
        put(&mut root, &segs, v);
    }
    Value::Object(root)
}

/// Put `v` at `segs` under `m`, making the maps on the way.
fn put(m: &mut Map<String, Value>, segs: &[&str], v: &Value) {
    match segs {
        [] => {}
        [leaf] => {
            m.insert((*leaf).to_string(), v.clone());
        }
        [first, rest @ ..] => {
            let next = m
                .entry((*first).to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !next.is_object() {
                *next = Value::Object(Map::new());
            }
            if let Value::Object(inner) = next {
                put(inner, rest, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_path_changed_before_the_first_and_only_those_that_differ_after() {
        let paths = vec!["spec.replicas".to_string(), "metadata.labels".to_string()];
        let t1 = json!({"spec": {"replicas": 2}, "metadata": {"labels": {"a": "1"}}});
        assert_eq!(changed(&paths, None, &t1), paths);
        let kept1 = snapshot(&paths, &t1);
        assert!(changed(&paths, Some(&kept1), &t1).is_empty());
        let t2 = json!({"spec": {"replicas": 3}, "metadata": {"labels": {"a": "1"}}});
        assert_eq!(changed(&paths, Some(&kept1), &t2), vec!["spec.replicas"]);
        // Absent and null are one: a field removed is a change, once.
        let kept2 = snapshot(&paths, &t2);
        let t3 = json!({"spec": {"replicas": 3}, "metadata": {}});
        assert_eq!(changed(&paths, Some(&kept2), &t3), vec!["metadata.labels"]);
        let kept3 = snapshot(&paths, &t3);
        assert_eq!(kept3["metadata.labels"], Value::Null);
        assert!(changed(&paths, Some(&kept3), &t3).is_empty());
    }

    #[test]
    fn a_large_value_is_kept_as_a_hash_that_still_tells_a_change() {
        let paths = vec!["spec.blob".to_string()];
        let big = "x".repeat(KEEP_WHOLE_BYTES * 2);
        let t1 = json!({"spec": {"blob": big}});
        let kept = snapshot(&paths, &t1);
        assert!(kept["spec.blob"].to_string().len() < 100);
        assert!(changed(&paths, Some(&kept), &t1).is_empty());
        let t2 = json!({"spec": {"blob": format!("{big}y")}});
        assert_eq!(changed(&paths, Some(&kept), &t2), paths);
        assert_eq!(as_object(&kept), json!({}));
    }

    #[test]
    fn the_kept_values_read_as_the_target_does() {
        let kept = BTreeMap::from([
            ("spec.replicas".to_string(), json!(2)),
            ("metadata.labels".to_string(), json!({"a": "1"})),
            ("spec.gone".to_string(), Value::Null),
        ]);
        assert_eq!(
            as_object(&kept),
            json!({"spec": {"replicas": 2}, "metadata": {"labels": {"a": "1"}}})
        );
    }
}
