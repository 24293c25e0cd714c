//! JSON <-> Rhai values. Objects enter scripts as object maps and leave as
//! JSON; anything that has no JSON form (a function pointer, an action, a
//! NaN) is an error rather than a silent `null`.

use rhai::{Array, Dynamic, Engine, Map};
use serde_json::{Number, Value};

use super::obj::Obj;

/// Convert a JSON value into a Rhai value.
pub fn to_dynamic(v: &Value) -> Dynamic {
    match v {
        Value::Array(items) => {
            let arr: Array = items.iter().map(to_dynamic).collect();
            Dynamic::from_array(arr)
        }
        Value::Object(map) => {
            let mut m = Map::new();
            for (k, v) in map {
                m.insert(k.as_str().into(), to_dynamic(v));
            }
            Dynamic::from_map(m)
        }
        scalar => super::obj::scalar(scalar),
    }
}

/// Convert a Rhai value into JSON. `path` names the value in errors.
pub fn to_json(v: &Dynamic, path: &str) -> Result<Value, String> {
    convert(v, &Place::Root(path))
}

/// Where a value sits inside the one being converted; spelt out only for
/// an error, so a conversion that succeeds builds no names.
enum Place<'a> {
    Root(&'a str),
    Index(&'a Place<'a>, usize),
    Key(&'a Place<'a>, &'a str),
}

impl std::fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Root(p) => f.write_str(p),
            Place::Index(parent, i) => write!(f, "{parent}[{i}]"),
            Place::Key(parent, k) => write!(f, "{parent}.{k}"),
        }
    }
}

fn convert(v: &Dynamic, at: &Place<'_>) -> Result<Value, String> {
    if v.is_unit() {
        return Ok(Value::Null);
    }
    if let Ok(b) = v.as_bool() {
        return Ok(Value::Bool(b));
    }
    if let Ok(i) = v.as_int() {
        return Ok(Value::from(i));
    }
    if let Ok(f) = v.as_float() {
        return Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| format!("{at} is {f}, which JSON cannot hold"));
    }
    if let Ok(c) = v.as_char() {
        return Ok(Value::String(c.to_string()));
    }
    if let Some(s) = v.read_lock::<rhai::ImmutableString>() {
        return Ok(Value::String(s.as_str().to_string()));
    }
    if v.is_array() {
        let arr = v.read_lock::<Array>().expect("checked is_array");
        let mut out = Vec::with_capacity(arr.len());
        for (i, item) in arr.iter().enumerate() {
            out.push(convert(item, &Place::Index(at, i))?);
        }
        return Ok(Value::Array(out));
    }
    if let Some(o) = v.read_lock::<Obj>() {
        return Ok(o.value().clone());
    }
    if v.is_map() {
        let map = v.read_lock::<Map>().expect("checked is_map");
        let mut out = serde_json::Map::new();
        for (k, item) in map.iter() {
            out.insert(k.to_string(), convert(item, &Place::Key(at, k))?);
        }
        return Ok(Value::Object(out));
    }
    Err(format!(
        "{at} is a {}, which has no JSON form",
        v.type_name()
    ))
}

/// Run `f` on the JSON behind a Rhai value: directly for an `Obj`, through
/// a conversion for anything else.
pub fn with_json<R>(d: &Dynamic, f: impl FnOnce(&Value) -> R) -> Result<R, String> {
    if let Some(o) = d.read_lock::<Obj>() {
        return Ok(f(o.value()));
    }
    let v = to_json(d, "value")?;
    Ok(f(&v))
}

/// Register the conversions between views and maps: `to_map` (a copy a
/// script may change) and comparing a view with a map.
pub fn register(engine: &mut Engine) {
    engine.register_fn("to_map", |o: &mut Obj| -> Dynamic { to_dynamic(o.value()) });
    engine.register_fn("to_map", |m: Map| m);
    engine.register_fn("to_map", |_: ()| Dynamic::UNIT);
    engine.register_fn("==", |a: &mut Obj, b: Map| {
        with_json(&Dynamic::from_map(b), |v| v == a.value()).unwrap_or(false)
    });
    engine.register_fn("!=", |a: &mut Obj, b: Map| {
        !with_json(&Dynamic::from_map(b), |v| v == a.value()).unwrap_or(false)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_survives_a_round_trip_through_rhai() {
        let v = json!({"a": 1, "b": [true, null, 2.5, "x"], "c": {"d": -3}});
        let d = to_dynamic(&v);
        assert_eq!(to_json(&d, "v").unwrap(), v);
    }

    #[test]
    fn values_without_json_form_are_errors_naming_the_path() {
        let mut m = Map::new();
        m.insert("bad".into(), Dynamic::from_float(f64::NAN));
        let err = to_json(&Dynamic::from_map(m), "obj").unwrap_err();
        assert!(err.starts_with("obj.bad is NaN"), "{err}");
        let deep = to_dynamic(&json!({"spec": {"ports": [1, 2]}}));
        let mut outer = Map::new();
        outer.insert("obj".into(), deep);
        outer.insert("f".into(), Dynamic::from(rhai::FnPtr::new("f").unwrap()));
        let err = to_json(&Dynamic::from_map(outer), "status(map)").unwrap_err();
        assert_eq!(err, "status(map).f is a Fn, which has no JSON form");
        let arr = Dynamic::from_array(vec![
            Dynamic::from_int(1),
            Dynamic::from_float(f64::INFINITY),
        ]);
        let err = to_json(&arr, "xs").unwrap_err();
        assert!(err.starts_with("xs[1] is inf"), "{err}");
    }
}
