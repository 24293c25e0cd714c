//! Structural-schema handling for custom resources, as the API server does
//! it: defaults applied, unknown fields pruned (or refused under strict
//! field validation), values checked against types, ranges, lengths,
//! patterns, enums and required fields. CEL rules (`x-kubernetes-validations`)
//! are not evaluated.

use serde_json::{Map, Value};

use super::status::{Cause, type_name};

/// What checking an object against its schema found.
#[derive(Default, Debug)]
pub struct Outcome {
    pub causes: Vec<Cause>,
    /// Paths of fields the schema does not know (they were pruned).
    pub unknown: Vec<String>,
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn fmt_num(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// Apply defaults, prune and validate `obj` against `schema`. The root's
/// `apiVersion`, `kind` and `metadata` are the API server's own and left alone.
pub fn apply(schema: &Value, obj: &mut Value) -> Outcome {
    let mut out = Outcome::default();
    if let (Some(props), Some(map)) = (
        schema.get("properties").and_then(Value::as_object),
        obj.as_object_mut(),
    ) {
        let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match props.get(&key) {
                Some(s) => {
                    if let Some(v) = map.get_mut(&key) {
                        walk(s, v, &key, &mut out);
                    }
                }
                None if !preserve => {
                    map.remove(&key);
                    out.unknown.push(key);
                }
                None => {}
            }
        }
        apply_defaults_and_required(schema, map, "", &mut out);
    }
    out
}

fn apply_defaults_and_required(
    schema: &Value,
    map: &mut Map<String, Value>,
    path: &str,
    out: &mut Outcome,
) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            if !map.contains_key(k)
                && let Some(d) = s.get("default")
            {
                let mut d = d.clone();
                walk(s, &mut d, &join(path, k), &mut Outcome::default());
                map.insert(k.clone(), d);
            }
        }
    }
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(r) = r.as_str()
            && !map.contains_key(r)
        {
            out.causes.push(Cause::required(join(path, r)));
        }
    }
}

fn type_cause(path: &str, v: &Value, want: &str) -> Cause {
    let t = type_name(v);
    Cause {
        field: path.to_string(),
        reason: "FieldValueTypeInvalid",
        message: format!("Invalid value: \"{t}\": {path} in body must be of type {want}: \"{t}\""),
    }
}

/// Check `v` against `schema` at `path`, pruning unknown fields and
/// applying defaults, as the API server does for a custom resource.
fn walk(schema: &Value, v: &mut Value, path: &str, out: &mut Outcome) {
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
    if v.is_null() {
        if schema["nullable"] != true && !preserve {
            // The API server drops nulls for fields that are not nullable.
            *v = Value::Null;
        }
        return;
    }
    if schema["x-kubernetes-int-or-string"] == true {
        if !(v.is_i64() || v.is_u64() || v.is_string()) {
            out.causes.push(type_cause(path, v, "integer or string"));
        }
        return;
    }
    let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
    let ok = match ty {
        "" => true,
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        _ => true,
    };
    if !ok {
        out.causes.push(type_cause(path, v, ty));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        out.causes.push(Cause::unsupported(path, v, allowed));
    }
    match v {
        Value::Number(_) => number(schema, v, path, out),
        Value::String(s) => string(schema, &s.clone(), path, out),
        Value::Array(items) => array(schema, items, path, out),
        Value::Object(map) => object(schema, map, path, out),
        _ => {}
    }
}

/// `minimum` and `maximum`, exclusive or not.
fn number(schema: &Value, v: &Value, path: &str, out: &mut Outcome) {
    let x = num(v).unwrap_or(0.0);
    let bound = |key: &str, exclusive_key: &str, beyond: &dyn Fn(f64) -> bool| {
        let exclusive = schema[exclusive_key] == true;
        let limit = schema.get(key).and_then(num)?;
        (beyond(limit) || (exclusive && x == limit)).then_some((limit, exclusive))
    };
    if let Some((max, excl)) = bound("maximum", "exclusiveMaximum", &|m| x > m) {
        let rel = if excl {
            "less than"
        } else {
            "less than or equal to"
        };
        let m = format!("{path} in body should be {rel} {}", fmt_num(max));
        out.causes.push(Cause::invalid(path, v, m));
    }
    if let Some((min, excl)) = bound("minimum", "exclusiveMinimum", &|m| x < m) {
        let rel = if excl {
            "greater than"
        } else {
            "greater than or equal to"
        };
        let m = format!("{path} in body should be {rel} {}", fmt_num(min));
        out.causes.push(Cause::invalid(path, v, m));
    }
}

/// `maxLength`, `minLength` and `pattern`.
fn string(schema: &Value, s: &str, path: &str, out: &mut Outcome) {
    let shown = Value::String(s.to_string());
    let len = s.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        out.causes.push(Cause {
            field: path.into(),
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {max} bytes"),
        });
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        let m = format!("{path} in body should be at least {min} chars long");
        out.causes.push(Cause::invalid(path, &shown, m));
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str)
        && regex::Regex::new(p).is_ok_and(|re| !re.is_match(s))
    {
        let m = format!("{path} in body should match '{p}'");
        out.causes.push(Cause::invalid(path, &shown, m));
    }
}

/// `maxItems`, `minItems`, and each item against `items`.
fn array(schema: &Value, items: &mut [Value], path: &str, out: &mut Outcome) {
    let n = items.len() as u64;
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
        && n > max
    {
        out.causes.push(Cause {
            field: path.into(),
            reason: "FieldValueTooMany",
            message: format!("Too many: {n}: must have at most {max} items"),
        });
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && n < min
    {
        let m = format!("{path} in body should have at least {min} items");
        out.causes.push(Cause::invalid(path, &Value::from(n), m));
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter_mut().enumerate() {
            walk(item_schema, item, &format!("{path}[{i}]"), out);
        }
    }
}

/// Each field against its property (or `additionalProperties`), unknown
/// fields pruned unless preserved, defaults and required fields, and the
/// property count.
fn object(schema: &Value, map: &mut serde_json::Map<String, Value>, path: &str, out: &mut Outcome) {
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        let child = join(path, &key);
        let s = props.and_then(|p| p.get(&key)).or(match additional {
            Some(a) if a.is_object() => Some(a),
            _ => None,
        });
        match s {
            Some(s) => {
                if let Some(c) = map.get_mut(&key) {
                    walk(s, c, &child, out);
                }
            }
            None if preserve || additional == Some(&Value::Bool(true)) => {}
            None => {
                map.remove(&key);
                out.unknown.push(child);
            }
        }
    }
    // A null produced above for a non-nullable field is dropped.
    map.retain(|_, v| !v.is_null() || preserve);
    apply_defaults_and_required(schema, map, path, out);
    let n = map.len() as u64;
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && n > max
    {
        let m = format!("{path} in body should have at most {max} properties");
        out.causes.push(Cause::invalid(path, &Value::from(n), m));
    }
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
        && n < min
    {
        let m = format!("{path} in body should have at least {min} properties");
        out.causes.push(Cause::invalid(path, &Value::from(n), m));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["threshold"], "properties": {
                "threshold": {"type": "number", "minimum": 0, "maximum": 1},
                "schedule": {"type": "string", "default": "@hourly", "pattern": "^@"},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}}
            }},
            "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
        }})
    }

    #[test]
    fn defaults_are_applied_and_unknown_fields_pruned() {
        let mut o = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a", "whatever": 1},
                           "spec": {"threshold": 0.5, "bogus": true, "free": {"anything": [1]}}});
        let out = apply(&schema(), &mut o);
        assert!(out.causes.is_empty(), "{:?}", out.causes);
        assert_eq!(out.unknown, ["spec.bogus"]);
        assert_eq!(o["spec"]["schedule"], "@hourly");
        assert_eq!(o["spec"]["free"]["anything"], json!([1]));
        assert_eq!(
            o["metadata"]["whatever"], 1,
            "metadata is the server's, not the schema's"
        );
    }

    #[test]
    fn violations_are_reported_per_field_in_api_server_wording() {
        let mut o = json!({"spec": {"threshold": 1.5, "schedule": "hourly", "mode": "c", "tags": ["a", "b", "c"]}});
        let out = apply(&schema(), &mut o);
        let msgs: Vec<String> = out
            .causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert!(msgs.contains(&"spec.threshold: Invalid value: 1.5: spec.threshold in body should be less than or equal to 1".to_string()), "{msgs:?}");
        assert!(
            msgs.iter()
                .any(|m| m.starts_with("spec.schedule: Invalid value: \"hourly\"")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .any(|m| m.starts_with("spec.mode: Unsupported value: \"c\"")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter().any(|m| m.starts_with("spec.tags: Too many: 3")),
            "{msgs:?}"
        );
    }

    #[test]
    fn required_fields_and_types_are_checked() {
        let mut o = json!({"spec": {"schedule": 5}});
        let out = apply(&schema(), &mut o);
        let fields: Vec<&str> = out.causes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"spec.threshold"));
        assert!(fields.contains(&"spec.schedule"));
    }
}
