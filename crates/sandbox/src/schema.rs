//! Structural-schema handling for custom resources, as the API server does
//! it: defaults applied, unknown fields pruned (or refused under strict
//! field validation), values checked against types, ranges, lengths,
//! patterns, enums and required fields, and CEL rules
//! (`x-kubernetes-validations`, see `cel`) with the API server's messages.
//! An update ratchets as v1.33 does: a rule on a value the update left
//! unchanged is not evaluated again, so an object stored before a rule was
//! added can still have its status, labels and finalizers written.

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

/// Apply defaults, prune and validate `obj` against `schema`; `old` is the
/// stored object of an update. The root's `apiVersion`, `kind` and
/// `metadata` are the API server's own and left alone.
pub fn apply(schema: &Value, obj: &mut Value, old: Option<&Value>) -> Outcome {
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
    // The API server checks the rules after the schema, a node's own
    // before its children's, and none of them when a value has the wrong
    // type.
    if has_rules(schema) {
        if out
            .causes
            .iter()
            .any(|c| c.reason == "FieldValueTypeInvalid")
        {
            out.causes.push(Cause {
                field: "<nil>".into(),
                reason: "FieldValueInvalid",
                message: "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into(),
            });
        } else {
            cel_pass(schema, obj, "", old, &mut out);
        }
    }
    out
}

fn has_rules(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => m.contains_key("x-kubernetes-validations") || m.values().any(has_rules),
        Value::Array(a) => a.iter().any(has_rules),
        _ => false,
    }
}

/// The CEL rules of `schema` and of the schemas under it, against `v`.
fn cel_pass(schema: &Value, v: &Value, path: &str, old: Option<&Value>, out: &mut Outcome) {
    if v.is_null() {
        return;
    }
    rules(schema, v, path, old, out);
    match v {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child) in map {
                if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(s) = props.and_then(|p| p.get(key)).or(additional) {
                    let was = old.and_then(|o| o.get(key));
                    cel_pass(s, child, &join(path, key), was, out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    cel_pass(s, item, &format!("{path}[{i}]"), None, out);
                }
            }
        }
        _ => {}
    }
}

/// The node's CEL rules against `v`. On an update a rule that does not
/// read `oldSelf` is skipped when the value is unchanged (ratcheting); a
/// rule that reads `oldSelf` runs only on an update that has the old value.
/// A rule outside what `cel` compiles is left unenforced.
fn rules(schema: &Value, v: &Value, path: &str, old: Option<&Value>, out: &mut Outcome) {
    let Some(list) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    else {
        return;
    };
    let ty = match schema.get("type").and_then(Value::as_str) {
        Some(t) => t,
        None => type_name(v),
    };
    for rule in list {
        let Some(text) = rule.get("rule").and_then(Value::as_str) else {
            continue;
        };
        let Ok(expr) = crate::cel::compile(text) else {
            continue;
        };
        let transition = text.contains("oldSelf");
        let mut scope = crate::cel::Scope::new();
        scope.insert("self".into(), crate::cel::Val::from_json(v));
        match (transition, old) {
            (true, None) => continue,
            (true, Some(o)) => {
                scope.insert("oldSelf".into(), crate::cel::Val::from_json(o));
            }
            (false, Some(o)) if o == v => continue,
            (false, _) => {}
        }
        let message = match crate::cel::eval(&expr, &scope) {
            Ok(crate::cel::Val::Bool(true)) => continue,
            Ok(crate::cel::Val::Bool(false)) => failed_message(rule, text, &scope),
            Ok(other) => {
                format!("rule did not evaluate to a bool: {other:?} evaluating rule: {text}")
            }
            Err(e) => format!("{e} evaluating rule: {text}"),
        };
        let sub = rule.get("fieldPath").and_then(Value::as_str).unwrap_or("");
        let field = format!("{path}{sub}");
        let field = field.strip_prefix('.').unwrap_or(&field).to_string();
        let reason = rule.get("reason").and_then(Value::as_str).unwrap_or("");
        out.causes.push(match reason {
            "FieldValueForbidden" => Cause {
                field,
                reason: "FieldValueForbidden",
                message: format!("Forbidden: {message}"),
            },
            "FieldValueRequired" => Cause {
                field,
                reason: "FieldValueRequired",
                message: format!("Required value: {message}"),
            },
            "FieldValueDuplicate" => Cause {
                field,
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: \"{ty}\""),
            },
            _ => Cause {
                field,
                reason: "FieldValueInvalid",
                message: format!("Invalid value: \"{ty}\": {message}"),
            },
        });
    }
}

/// A failed rule's message: its `messageExpression` when that gives a
/// string, else its `message`, else "failed rule: RULE".
fn failed_message(rule: &Value, text: &str, scope: &crate::cel::Scope) -> String {
    let from_expression = rule
        .get("messageExpression")
        .and_then(Value::as_str)
        .and_then(|m| crate::cel::compile(m).ok())
        .and_then(|e| match crate::cel::eval(&e, scope) {
            Ok(crate::cel::Val::Str(s)) if !s.is_empty() => Some(s),
            _ => None,
        });
    from_expression
        .or_else(|| {
            rule.get("message")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("failed rule: {text}"))
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
#[allow(clippy::too_many_lines)] // A test reads top to bottom.
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
        let out = apply(&schema(), &mut o, None);
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
        let out = apply(&schema(), &mut o, None);
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
        let out = apply(&schema(), &mut o, None);
        let fields: Vec<&str> = out.causes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"spec.threshold"));
        assert!(fields.contains(&"spec.schedule"));
    }

    /// The schedule schema of Runbook's CRDs (pattern and CEL rules).
    fn schedule_schema() -> Value {
        let crds = serde_json::to_value(runbook_core::crd::all()).unwrap_or_default();
        let spec =
            &crds[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        json!({"type": "object", "properties": {"s": spec["properties"]["schedule"].clone()}})
    }

    fn refusals(schema: &Value, expr: &str) -> Vec<String> {
        let mut o = json!({"s": expr});
        apply(schema, &mut o, None)
            .causes
            .into_iter()
            .map(|c| c.message)
            .collect()
    }

    #[test]
    fn the_crds_refuse_exactly_the_schedules_runbook_cannot_parse() {
        let schema = schedule_schema();
        assert!(schema["properties"]["s"]["x-kubernetes-validations"].is_array());
        let words = [
            "*",
            "?",
            "0",
            "00",
            "5",
            "07",
            "7",
            "8",
            "12",
            "13",
            "23",
            "24",
            "31",
            "32",
            "59",
            "60",
            "1-5",
            "5-1",
            "0-7",
            "3-3",
            "*/15",
            "*/0",
            "*/59",
            "*/60",
            "5/10",
            "1-10/3",
            "1,2,3",
            "1,,2",
            "mon",
            "MON",
            "Sunday",
            "mon-fri",
            "mon-fri/2",
            "mon/2",
            "jan",
            "jan-mar",
            "JAN-Dec",
            "foo",
            "1-",
            "-1",
            ",",
            "L",
            "1#2",
            "5-",
            "x-y",
        ];
        let mut checked = 0;
        for word in words {
            for at in 0..5 {
                let mut fields = ["*"; 5];
                fields[at] = word;
                for prefix in ["", "CRON_TZ=Europe/Paris "] {
                    let expr = format!("{prefix}{}", fields.join(" "));
                    let parsed = runbook_core::schedule::Schedule::parse(&expr);
                    let refused = refusals(&schema, &expr);
                    assert_eq!(
                        refused.is_empty(),
                        parsed.is_ok(),
                        "{expr:?}: the CRD says {refused:?}, Runbook says {:?}",
                        parsed.err()
                    );
                    assert!(
                        refused.len() <= 1,
                        "{expr:?} told more than once: {refused:?}"
                    );
                    checked += 1;
                }
            }
        }
        // Seconds are a policy's, never a custom resource's.
        assert!(runbook_core::schedule::Schedule::parse("* * * * * *").is_ok());
        assert_eq!(refusals(&schema, "* * * * * *").len(), 1);
        for whole in [
            "@hourly",
            "@every 5m",
            "* * * *",
            "0 2 * * * extra more",
            "",
        ] {
            let parsed = runbook_core::schedule::Schedule::parse(whole);
            let refused = refusals(&schema, whole);
            assert_eq!(refused.is_empty(), parsed.is_ok(), "{whole:?}: {refused:?}");
            assert!(
                refused.len() <= 1,
                "{whole:?} told more than once: {refused:?}"
            );
        }
        assert_eq!(checked, words.len() * 10);
        // What only Runbook checks: the CRD lets these through.
        for only_runbook in ["0 2 * * fri-mon", "CRON_TZ=Mars/Olympus 0 2 * * *"] {
            assert!(refusals(&schema, only_runbook).is_empty());
            assert!(runbook_core::schedule::Schedule::parse(only_runbook).is_err());
        }
        let told = refusals(&schema, "61 * * * *");
        assert_eq!(
            told,
            [
                "Invalid value: \"string\": the minute field of a schedule takes 0-59: a value, a range or *, with an optional /step within that range, or a comma-separated list of them"
            ]
        );
    }
}
