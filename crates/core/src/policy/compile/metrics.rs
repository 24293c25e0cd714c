//! `spec.metrics` compiled: each entry's source, address, credentials and
//! query (a template, or a target's field within bounds), with errors that
//! name the field.

use crate::metric::jsonpath::JsonPath;
use crate::metric::template::{Quoting, Template};
use crate::metric::{
    Address, Auth, CompiledMetric, KeyRef, MAX_TIMEOUT_MS, Query, Source, check_base_url,
};
use crate::util::yaml::Pos;

/// Compile one entry; errors name the field (`prometheus.query`) and say
/// what is wrong.
pub(super) fn compile(
    spec: &crate::policy::model::MetricSpec,
    pos: Option<Pos>,
) -> Result<CompiledMetric, Vec<(String, String)>> {
    let mut errors = Vec::new();
    let mut err = |field: &str, m: String| errors.push((field.to_string(), m));
    let name_ok = !spec.name.is_empty()
        && spec.name.len() <= 63
        && spec
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        err(
            "name",
            format!(
                "{:?} is not a metric name (1-63 letters, digits, _ or -)",
                spec.name
            ),
        );
    }
    let duration =
        |field: &str, text: Option<&str>, default: i64, err: &mut dyn FnMut(&str, String)| {
            match text.map(crate::util::time::parse_duration_ms) {
                None => default,
                Some(Ok(ms)) if ms > 0 => ms,
                Some(Ok(_)) => {
                    err(field, "give a duration above zero".into());
                    default
                }
                Some(Err(e)) => {
                    err(field, e);
                    default
                }
            }
        };
    let every_ms = duration("every", spec.every.as_deref(), 60_000, &mut err);
    let timeout_ms = duration("timeout", spec.timeout.as_deref(), 10_000, &mut err);
    if timeout_ms > MAX_TIMEOUT_MS {
        err("timeout", format!("at most {}s", MAX_TIMEOUT_MS / 1000));
    }
    let compiled = match source_of(spec) {
        Ok(c) => Some(c),
        Err(found) => {
            for (field, message) in found {
                err(field, message);
            }
            None
        }
    };
    match compiled {
        Some((source, address, auth)) if errors.is_empty() => Ok(CompiledMetric {
            name: spec.name.clone(),
            source,
            address,
            auth,
            every_ms,
            on_schedule: spec.on_schedule,
            timeout_ms,
            pos,
        }),
        _ => Err(errors),
    }
}

/// Every error of a part, each with its field.
type Found = Vec<(&'static str, String)>;

/// The source, address and credentials of an entry.
fn source_of(spec: &crate::policy::model::MetricSpec) -> Result<(Source, Address, Auth), Found> {
    match (&spec.prometheus, &spec.web) {
        (Some(p), None) => prometheus_of(p),
        (None, Some(w)) => web_of(w),
        _ => Err(vec![(
            "name",
            format!(
                "metric {:?}: give prometheus or web, one of them",
                spec.name
            ),
        )]),
    }
}

fn prometheus_of(
    p: &crate::policy::model::PrometheusSpec,
) -> Result<(Source, Address, Auth), Found> {
    let query = match (&p.query, &p.query_from) {
        (Some(q), None) => Template::parse(q, Quoting::PromQl)
            .map(Query::Template)
            .map_err(|e| ("prometheus.query", e)),
        (None, Some(from)) => query_from(from).map_err(|e| ("prometheus.queryFrom", e)),
        _ => Err((
            "prometheus",
            "give query (a template) or queryFrom (a target's field), one of them".into(),
        )),
    };
    let address =
        address(p.address.as_deref(), p.address_from.as_ref()).map_err(|e| ("prometheus", e));
    let auth = auth_of(p.auth.as_ref()).map_err(|e| ("prometheus.auth", e));
    match (query, address, auth) {
        (Ok(query), Ok(address), Ok(auth)) => Ok((Source::Prometheus { query }, address, auth)),
        (q, a, au) => Err([q.err(), a.err(), au.err()].into_iter().flatten().collect()),
    }
}

fn web_of(w: &crate::policy::model::WebSpec) -> Result<(Source, Address, Auth), Found> {
    let path =
        Template::parse(w.path.as_deref().unwrap_or(""), Quoting::Url).map_err(|e| ("web.path", e));
    let json_path = JsonPath::parse(&w.json_path).map_err(|e| ("web.jsonPath", e));
    let address = address(w.address.as_deref(), w.address_from.as_ref()).map_err(|e| ("web", e));
    let auth = auth_of(w.auth.as_ref()).map_err(|e| ("web.auth", e));
    match (path, json_path, address, auth) {
        (Ok(path), Ok(json_path), Ok(address), Ok(auth)) => {
            Ok((Source::Web { path, json_path }, address, auth))
        }
        (p, j, a, au) => Err([p.err(), j.err(), a.err(), au.err()]
            .into_iter()
            .flatten()
            .collect()),
    }
}

fn query_from(from: &crate::policy::model::QueryFromSpec) -> Result<Query, String> {
    let path: Vec<String> = from.field.split('.').map(str::to_string).collect();
    if path.iter().any(String::is_empty) {
        return Err(format!(
            "field: {:?} is not a dotted field path",
            from.field
        ));
    }
    if from.allowed_metrics.is_empty() || from.allowed_metrics.iter().any(|m| m.trim().is_empty()) {
        return Err(
            "allowedMetrics: list the metric names a target's query may use (model_*)".into(),
        );
    }
    let label = from
        .namespace_label
        .clone()
        .unwrap_or_else(|| "namespace".into());
    let label_ok = label
        .chars()
        .enumerate()
        .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit()));
    if !label_ok {
        return Err(format!("namespaceLabel: {label:?} is not a label name"));
    }
    Ok(Query::Field {
        path,
        allowed: from.allowed_metrics.clone(),
        label: (!label.is_empty()).then_some(label),
    })
}

fn key_ref(secret: bool, k: &crate::policy::model::KeyRefSpec) -> Result<KeyRef, String> {
    if k.name.is_empty() || k.key.is_empty() {
        return Err("name and key are both needed".into());
    }
    Ok(KeyRef {
        secret,
        name: k.name.clone(),
        key: k.key.clone(),
    })
}

fn address(
    inline: Option<&str>,
    from: Option<&crate::policy::model::ValueFrom>,
) -> Result<Address, String> {
    match (inline, from) {
        (Some(url), None) => {
            check_base_url(url)?;
            Ok(Address::Inline(url.trim_end_matches('/').to_string()))
        }
        (None, Some(f)) => match (&f.config_map_key_ref, &f.secret_key_ref) {
            (Some(k), None) => key_ref(false, k).map(Address::From),
            (None, Some(k)) => key_ref(true, k).map(Address::From),
            _ => Err("addressFrom: give configMapKeyRef or secretKeyRef, one of them".into()),
        },
        _ => Err("give address or addressFrom, one of them".into()),
    }
}

fn auth_of(a: Option<&crate::policy::model::AuthSpec>) -> Result<Auth, String> {
    let Some(a) = a else {
        return Ok(Auth::default());
    };
    if a.bearer_token.is_some() && a.basic_auth.is_some() {
        return Err("give bearerToken or basicAuth, not both".into());
    }
    Ok(Auth {
        bearer: a
            .bearer_token
            .as_ref()
            .map(|k| key_ref(true, k))
            .transpose()?,
        basic: a.basic_auth.as_ref().map(|b| {
            (
                b.name.clone(),
                b.username_key.clone(),
                b.password_key.clone(),
            )
        }),
    })
}

/// Every `spec.metrics` entry, each error placed at its entry.
pub(super) fn compile_all(
    cx: &mut super::Ctx,
    file: &str,
    node: &crate::util::yaml::Node,
    spec: &crate::policy::model::PolicySpec,
) -> Vec<CompiledMetric> {
    let items: Vec<Pos> = match node.at(&["spec", "metrics"]).map(|n| &n.value) {
        Some(crate::util::yaml::NodeValue::Seq(items)) => items.iter().map(|n| n.pos).collect(),
        _ => Vec::new(),
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (i, m) in spec.metrics.iter().enumerate() {
        let pos = items.get(i).copied();
        if !seen.insert(m.name.as_str()) {
            cx.error(
                file,
                pos,
                format!("spec.metrics[{i}].name: {:?} names two metrics", m.name),
            );
            continue;
        }
        match compile(m, pos) {
            Ok(c) => out.push(c),
            Err(errors) => {
                for (field, message) in errors {
                    cx.error(file, pos, format!("spec.metrics[{i}].{field}: {message}"));
                }
            }
        }
    }
    out
}

/// Why a tenant's policy (loaded from `namespace`) may not have `m`: an
/// address only an administrator may give, or a query left unconfined.
pub(super) fn tenant_refusal(m: &CompiledMetric, namespace: &str) -> Option<String> {
    if let Address::Inline(_) = &m.address {
        return Some(format!(
            "spec.metrics: metric {:?}: a policy ConfigMap in namespace {namespace:?} names its {} address with addressFrom, a ConfigMap or Secret of {namespace:?} (an inline address is the administrator's)",
            m.name,
            m.kind()
        ));
    }
    if let Source::Prometheus {
        query: Query::Field { label: None, .. },
    } = &m.source
    {
        return Some(format!(
            "spec.metrics: metric {:?}: a policy ConfigMap in namespace {namespace:?} confines the queries its targets choose to their namespace (queryFrom.namespaceLabel may not be empty)",
            m.name
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::policy::compile::tests::{errors_of, load};

    const HEAD: &str = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  script: p.rhai\n";

    #[test]
    fn a_metric_names_one_source_an_address_and_a_query() {
        let good = format!(
            "{HEAD}  metrics:\n  - name: accuracy\n    every: 30s\n    prometheus:\n      addressFrom: {{configMapKeyRef: {{name: runbook-metrics, key: prometheus}}}}\n      query: 'avg(model_accuracy{{namespace=\"{{{{ .metadata.namespace }}}}\"}})'\n"
        );
        let loaded = load(&[("p.yaml", &good), ("p.rhai", "fn reconcile(ctx) { [] }")]);
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        assert_eq!(loaded.policies[0].metrics[0].every_ms, 30_000);
        let bad = format!(
            "{HEAD}  metrics:\n  - name: a\n    prometheus: {{address: 'http://u:p@x', query: 'm{{a=`{{{{ .metadata.name }}}}`}}'}}\n  - name: a\n    web: {{address: 'http://x', jsonPath: data}}\n  - name: b\n    timeout: 5m\n    prometheus: {{address: 'http://x', queryFrom: {{field: spec.q, allowedMetrics: []}}}}\n"
        );
        let errors = errors_of(&bad);
        let want = [
            "p.yaml:8:5: spec.metrics[0].prometheus.query: byte 5: {{ .metadata.name }} is inside a raw (backtick) string",
            "p.yaml:8:5: spec.metrics[0].prometheus: address: no credentials in the URL",
            "p.yaml:10:5: spec.metrics[1].name: \"a\" names two metrics",
            "p.yaml:12:5: spec.metrics[2].timeout: at most 60s",
            "p.yaml:12:5: spec.metrics[2].prometheus.queryFrom: allowedMetrics: list the metric names",
        ];
        assert_eq!(errors.len(), want.len(), "{errors:#?}");
        for w in want {
            assert!(errors.iter().any(|e| e.starts_with(w)), "{w}\n{errors:#?}");
        }
    }

    #[test]
    fn a_tenant_names_its_address_in_its_namespace_and_confines_queries() {
        let inline = format!(
            "{HEAD}  metrics:\n  - name: a\n    prometheus: {{address: 'http://prometheus:9090', query: up}}\n  - name: b\n    prometheus: {{addressFrom: {{secretKeyRef: {{name: s, key: k}}}}, queryFrom: {{field: spec.q, allowedMetrics: [m], namespaceLabel: ''}}}}\n"
        );
        let mut loaded = load(&[("p.yaml", &inline), ("p.rhai", "fn reconcile(ctx) { [] }")]);
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        loaded.confine_to("team-a", &Default::default());
        let errors: Vec<String> = loaded.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 2, "{errors:#?}");
        assert!(
            errors[0].contains("an inline address is the administrator's"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].contains("namespaceLabel may not be empty"),
            "{}",
            errors[1]
        );
    }
}
