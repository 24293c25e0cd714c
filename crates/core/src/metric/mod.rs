//! Metric inputs (`spec.metrics`): numbers read from Prometheus or an HTTP
//! endpoint answering JSON, for a decision to judge by.
//!
//! The runtime asks, never a script: a script's `ctx.metric(name)` finds
//! the reading the runtime was given, or says it wants one, and the
//! runtime then asks and decides again with it (a decision stays a
//! function of its inputs, and each reading is kept in the decision
//! record). What is asked is built here, from the policy's template and
//! the target, quoted so that no field of a target changes its shape
//! (`template`), or from a query the target chooses within the policy's
//! bounds (`promql`). The answers are read here too, so that the operator
//! and the simulator read them alike.

pub mod jsonpath;
pub mod promql;
pub mod template;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use serde_json::Value;

use crate::util::yaml::Pos;
use jsonpath::JsonPath;
use template::Template;

/// The longest a metric's answer may take.
pub const MAX_TIMEOUT_MS: i64 = 60_000;
/// The most bytes of an answer read; a longer one is an error.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// The longest query or path asked: a target's field that makes one
/// longer is refused rather than sent.
pub const MAX_ASKED: usize = 8 * 1024;

/// Why a reading has no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The query matched no series (or the path found nothing).
    NoData,
    /// No answer within the metric's timeout.
    Timeout,
    /// The value is not a number (NaN).
    NaN,
    /// The source failed, refused, or answered something unreadable; or
    /// the query could not be made (a field missing, a bound broken).
    Error,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoData => "NoData",
            Reason::Timeout => "Timeout",
            Reason::NaN => "NaN",
            Reason::Error => "Error",
        }
    }
}

/// What a metric read.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    Value {
        value: f64,
        /// When the value was sampled, in unix seconds.
        at: i64,
        /// How many series (or values) the answer held; `value` is the first's.
        samples: u32,
    },
    Missing {
        reason: Reason,
        message: String,
    },
}

impl Reading {
    pub fn missing(reason: Reason, message: impl Into<String>) -> Self {
        Reading::Missing {
            reason,
            message: message.into(),
        }
    }

    /// The label `runbook_metric_queries_total` counts it under.
    pub fn result(&self) -> &'static str {
        match self {
            Reading::Value { .. } => "value",
            Reading::Missing { reason, .. } => match reason {
                Reason::NoData => "no_data",
                Reason::Timeout => "timeout",
                Reason::NaN => "nan",
                Reason::Error => "error",
            },
        }
    }
}

/// A reading and what was asked for it (the query text, or the path).
#[derive(Clone, Debug, PartialEq)]
pub struct Asked {
    pub asked: String,
    pub reading: Reading,
}

/// A value kept in a key of a ConfigMap or Secret of the policy's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyRef {
    pub secret: bool,
    pub name: String,
    pub key: String,
}

impl KeyRef {
    pub fn describe(&self, namespace: &str) -> String {
        let kind = if self.secret { "Secret" } else { "ConfigMap" };
        format!("{kind} {namespace}/{} key {:?}", self.name, self.key)
    }
}

/// Where a source is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Address {
    Inline(String),
    From(KeyRef),
}

/// Credentials, each from a key of a Secret of the policy's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Auth {
    pub bearer: Option<KeyRef>,
    /// The Secret's name, its user name key and its password key.
    pub basic: Option<(String, String, String)>,
}

/// The query of a Prometheus metric.
#[derive(Clone, Debug, PartialEq)]
pub enum Query {
    Template(Template),
    /// A target's field, bounded (`promql::confine`).
    Field {
        path: Vec<String>,
        allowed: Vec<String>,
        label: Option<String>,
    },
}

/// Where a metric reads from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Prometheus { query: Query },
    Web { path: Template, json_path: JsonPath },
}

/// One `spec.metrics` entry, compiled.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledMetric {
    pub name: String,
    pub source: Source,
    pub address: Address,
    pub auth: Auth,
    pub every_ms: i64,
    pub on_schedule: bool,
    pub timeout_ms: i64,
    /// Where it is written, for errors found later (a tenant's address).
    pub pos: Option<Pos>,
}

impl CompiledMetric {
    /// `prometheus` or `web`.
    pub fn kind(&self) -> &'static str {
        match self.source {
            Source::Prometheus { .. } => "prometheus",
            Source::Web { .. } => "web",
        }
    }

    /// What to ask for `target`: the query text, or the web path. An
    /// error says why nothing can be asked (a field missing, a query the
    /// target chose outside the policy's bounds).
    pub fn ask(&self, target: &Value) -> Result<String, String> {
        let text = self.render(target)?;
        if text.len() > MAX_ASKED {
            return Err(format!(
                "the {} made from the target is {} bytes, over {MAX_ASKED}",
                if matches!(self.source, Source::Web { .. }) {
                    "path"
                } else {
                    "query"
                },
                text.len()
            ));
        }
        Ok(text)
    }

    fn render(&self, target: &Value) -> Result<String, String> {
        match &self.source {
            Source::Prometheus {
                query: Query::Template(t),
            } => t.render(target),
            Source::Prometheus {
                query:
                    Query::Field {
                        path,
                        allowed,
                        label,
                    },
            } => {
                let dotted = path.join(".");
                let text = path
                    .iter()
                    .try_fold(target, |v, seg| v.get(seg))
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("{dotted} is not set on the target"))?;
                let namespace = target
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                promql::confine(text, allowed, label.as_deref(), namespace)
                    .map_err(|e| format!("{dotted}: {e}"))
            }
            Source::Web { path, .. } => path.render(target),
        }
    }

    /// The Secrets and ConfigMaps it reads, with whether each is a Secret.
    pub fn key_refs(&self) -> Vec<KeyRef> {
        let mut refs = Vec::new();
        if let Address::From(k) = &self.address {
            refs.push(k.clone());
        }
        refs.extend(self.auth.bearer.clone());
        if let Some((name, user, pass)) = &self.auth.basic {
            for key in [user, pass] {
                refs.push(KeyRef {
                    secret: true,
                    name: name.clone(),
                    key: key.clone(),
                });
            }
        }
        refs
    }
}

/// The authority (`host:port`) of an http(s) URL; `None` for another scheme.
pub fn host_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    rest.split('/').next()
}

/// Whether `url` may be a source's base URL: http(s), no credentials, no
/// query string.
pub fn check_base_url(url: &str) -> Result<(), String> {
    let host = host_of(url).ok_or("address: give an http:// or https:// URL")?;
    if host.is_empty() {
        return Err("address: the URL names no host".into());
    }
    if host.contains('@') {
        return Err("address: no credentials in the URL; give auth from a Secret".into());
    }
    if url.contains(['?', '#']) || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("address: a base URL, without a query string, fragment or spaces".into());
    }
    Ok(())
}

/// A Prometheus instant query's answer (`/api/v1/query`) read.
pub fn prometheus_answer(body: &[u8]) -> Reading {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Reading::missing(Reason::Error, format!("the answer is not JSON ({e})")),
    };
    if v.get("status").and_then(Value::as_str) != Some("success") {
        let said = v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no error given");
        return Reading::missing(Reason::Error, format!("Prometheus: {}", cut(said, 300)));
    }
    let data = &v["data"];
    let sample = |pair: &Value| -> Option<(f64, String)> {
        let at = pair.get(0)?.as_f64()?;
        let text = pair.get(1)?.as_str()?.to_string();
        Some((at, text))
    };
    let (pair, samples) = match data.get("resultType").and_then(Value::as_str) {
        Some("vector") => {
            let result = data["result"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            match result.first() {
                None => return Reading::missing(Reason::NoData, "the query matched no series"),
                Some(first) => (sample(&first["value"]), result.len()),
            }
        }
        Some("scalar") => (sample(&data["result"]), 1),
        other => {
            return Reading::missing(
                Reason::Error,
                format!(
                    "the query answers a {}; give one that answers an instant vector or a scalar",
                    other.unwrap_or("nothing")
                ),
            );
        }
    };
    let Some((at, text)) = pair else {
        return Reading::missing(
            Reason::Error,
            "the answer's sample is not [time, \"value\"]",
        );
    };
    number(&text, at as i64, samples)
}

/// The value at `path` of a JSON answer, read at `now` (unix seconds).
pub fn web_answer(body: &[u8], path: &JsonPath, now: i64) -> Reading {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Reading::missing(Reason::Error, format!("the answer is not JSON ({e})")),
    };
    match path.find(&v) {
        None | Some(Value::Null) => Reading::missing(
            Reason::NoData,
            format!("the answer has nothing at {}", path.as_str()),
        ),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) => number(&x.to_string(), now, 1),
            None => Reading::missing(Reason::Error, "the number is out of range"),
        },
        Some(Value::String(s)) => number(s, now, 1),
        Some(other) => Reading::missing(
            Reason::Error,
            format!(
                "{} holds {}, not a number",
                path.as_str(),
                match other {
                    Value::Bool(_) => "a boolean",
                    Value::Array(_) => "an array",
                    _ => "an object",
                }
            ),
        ),
    }
}

fn number(text: &str, at: i64, samples: usize) -> Reading {
    match text.trim().parse::<f64>() {
        Ok(x) if x.is_nan() => Reading::missing(Reason::NaN, "the value is NaN"),
        Ok(value) => Reading::Value {
            value,
            at,
            samples: u32::try_from(samples).unwrap_or(u32::MAX),
        },
        Err(_) => Reading::missing(
            Reason::Error,
            format!("the value {:?} is not a number", cut(text, 40)),
        ),
    }
}

/// At most `n` characters of `text`.
pub fn cut(text: &str, n: usize) -> String {
    match text.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// The readings a decision is given, and what its script asks of them:
/// the names it read, and those it wanted that it was not given.
#[derive(Debug, Default)]
pub struct Readings {
    given: BTreeMap<String, Asked>,
    declared: Vec<String>,
    asked: Mutex<(BTreeSet<String>, BTreeSet<String>)>,
}

/// What `ctx.metric(name)` finds.
pub enum Found<'a> {
    /// The policy declares no metric of that name.
    Undeclared(&'a [String]),
    /// Declared, not given: wanted.
    NotGiven,
    Given(&'a Reading),
}

impl Readings {
    pub fn new(declared: Vec<String>, given: BTreeMap<String, Asked>) -> Self {
        Self {
            given,
            declared,
            asked: Mutex::default(),
        }
    }

    /// The reading of `name`, noted as read (or as wanted).
    pub fn get(&self, name: &str) -> Found<'_> {
        if !self.declared.iter().any(|d| d == name) {
            return Found::Undeclared(&self.declared);
        }
        let mut asked = crate::util::lock(&self.asked);
        match self.given.get(name) {
            Some(a) => {
                asked.0.insert(name.to_string());
                Found::Given(&a.reading)
            }
            None => {
                asked.1.insert(name.to_string());
                Found::NotGiven
            }
        }
    }

    /// The readings the script read, and the names it wanted.
    pub fn take(&self) -> (Vec<(String, Asked)>, Vec<String>) {
        let asked = crate::util::lock(&self.asked);
        let read = asked
            .0
            .iter()
            .filter_map(|n| self.given.get(n).map(|a| (n.clone(), a.clone())))
            .collect();
        (read, asked.1.iter().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_answers_are_read_with_their_reasons() {
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000.5,"0.91"]},{"metric":{},"value":[1700000000.5,"0.5"]}]}}"#;
        assert_eq!(
            prometheus_answer(vector),
            Reading::Value {
                value: 0.91,
                at: 1_700_000_000,
                samples: 2
            }
        );
        let scalar =
            br#"{"status":"success","data":{"resultType":"scalar","result":[1700000000,"3"]}}"#;
        assert!(matches!(prometheus_answer(scalar), Reading::Value { value, .. } if value == 3.0));
        let cases: [(&[u8], &str); 5] = [
            (br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#, "no_data"),
            (br#"{"status":"success","data":{"resultType":"vector","result":[{"value":[1,"NaN"]}]}}"#, "nan"),
            (br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#, "error"),
            (br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#, "error"),
            (b"<html>", "error"),
        ];
        for (body, result) in cases {
            assert_eq!(
                prometheus_answer(body).result(),
                result,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn web_answers_take_numbers_and_numeric_strings() {
        let p = JsonPath::parse("$.data.score").unwrap();
        assert_eq!(
            web_answer(br#"{"data":{"score":"0.8"}}"#, &p, 5),
            Reading::Value {
                value: 0.8,
                at: 5,
                samples: 1
            }
        );
        assert_eq!(web_answer(br#"{"data":{}}"#, &p, 5).result(), "no_data");
        assert_eq!(
            web_answer(br#"{"data":{"score":true}}"#, &p, 5).result(),
            "error"
        );
    }

    #[test]
    fn a_field_too_long_makes_no_query() {
        let m = CompiledMetric {
            name: "m".into(),
            source: Source::Prometheus {
                query: Query::Template(
                    Template::parse("m{a={{ .data.x }}}", template::Quoting::PromQl).unwrap(),
                ),
            },
            address: Address::Inline("http://p".into()),
            auth: Auth::default(),
            every_ms: 60_000,
            on_schedule: false,
            timeout_ms: 10_000,
            pos: None,
        };
        let short = serde_json::json!({"data": {"x": "y"}});
        assert_eq!(m.ask(&short).unwrap(), r#"m{a="y"}"#);
        let long = serde_json::json!({"data": {"x": "y".repeat(MAX_ASKED)}});
        assert!(m.ask(&long).unwrap_err().contains("over 8192"));
    }

    #[test]
    fn base_urls_carry_no_credentials_or_query() {
        assert!(check_base_url("http://prometheus.monitoring:9090").is_ok());
        for bad in [
            "ftp://x",
            "http://",
            "http://u:p@x",
            "http://x/?q=1",
            "http://x y",
        ] {
            assert!(check_base_url(bad).is_err(), "{bad}");
        }
    }
}
