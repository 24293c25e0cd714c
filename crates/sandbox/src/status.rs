//! API errors as the API server returns them: `Status` objects with a code,
//! reason and message, so `kube::Error::Api` and kubectl show them properly.

use serde_json::{Value, json};

use super::registry::ResourceDef;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Value,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: Value::Null,
        }
    }

    fn with_details(mut self, def: &ResourceDef, name: &str) -> Self {
        let mut d = json!({"kind": def.plural});
        if !name.is_empty() {
            d["name"] = json!(name);
        }
        if !def.group.is_empty() {
            d["group"] = json!(def.group);
        }
        self.details = d;
        self
    }

    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", def.qualified()),
        )
        .with_details(def, name)
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
            .with_raw_details(json!({"name": ns, "kind": "namespaces"}))
    }

    pub fn no_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_raw_details(json!({}))
    }

    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", def.qualified()),
        )
        .with_details(def, name)
    }

    pub fn conflict(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                def.qualified()
            ),
        )
        .with_details(def, name)
    }

    pub fn conflict_msg(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                def.qualified()
            ),
        )
        .with_details(def, name)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_raw_details(json!({}))
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// 422 Invalid, with one cause per field, in the API server's wording.
    pub fn invalid(def: &ResourceDef, name: &str, causes: Vec<Cause>) -> Self {
        let parts: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("[{}]", parts.join(", "))
        };
        let qualified = if def.group.is_empty() {
            def.kind.clone()
        } else {
            format!("{}.{}", def.kind, def.group)
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {joined}"),
        );
        let mut details = json!({"name": name, "kind": def.kind});
        if !def.group.is_empty() {
            details["group"] = json!(def.group);
        }
        details["causes"] = Value::Array(
            causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect(),
        );
        e.details = details;
        e
    }

    pub fn with_raw_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        // A real server leaves `reason` out where it has none (an internal error).
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if !self.details.is_null() {
            s["details"] = self.details.clone();
        }
        s
    }
}

/// One field-level problem of an invalid object.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub field: String,
    pub reason: &'static str,
    pub message: String,
}

impl Cause {
    pub fn required(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueRequired",
            message: "Required value".into(),
        }
    }

    pub fn invalid(field: impl Into<String>, value: &Value, why: impl AsRef<str>) -> Self {
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        Self {
            field: field.into(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {shown}: {}", why.as_ref()),
        }
    }

    pub fn unsupported(field: impl Into<String>, value: &Value, allowed: &[Value]) -> Self {
        let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
        Self {
            field: field.into(),
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ),
        }
    }

    pub fn type_error(field: impl Into<String>, value: &Value, want: &str) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueTypeInvalid",
            message: format!(
                "Invalid value: {}: {field_name} in body must be of type {want}: {:?}",
                short(value),
                type_name(value),
                field_name = "field"
            ),
        }
    }

    pub fn forbidden(field: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueForbidden",
            message: format!("Forbidden: {}", why.into()),
        }
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!("{}...", &s[..57])
    } else {
        s
    }
}

pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
