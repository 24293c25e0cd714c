//! `runbook explain KIND/NAME`: print the decision record of an object,
//! read from the cluster (from its status, or from its `RunbookState`
//! for a kind whose schema is not Runbook's).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use kube::Api;
use kube::discovery::{Discovery, Scope};
use serde_json::Value;

use runbook_core::crd::{ActionRecord, DecisionRecord};
use runbook_core::observe::RawObject;

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The object: KIND/NAME, where KIND is a kind, plural, singular or
    /// short name, with its group if need be (`deployment.apps/web`).
    pub object: String,
    /// The object's namespace (default: the kubeconfig context's, as
    /// kubectl's).
    #[arg(long, short = 'n', env = "RUNBOOK_EXPLAIN_NAMESPACE")]
    pub namespace: Option<String>,
    /// The cluster to read it from (default: $KUBECONFIG, ~/.kube/config,
    /// or the pod's own).
    #[arg(long, env = "RUNBOOK_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Where Runbook keeps its state of cluster-scoped targets when it
    /// watches every namespace (`runbook run --operator-namespace`).
    #[arg(
        long,
        env = "RUNBOOK_OPERATOR_NAMESPACE",
        default_value = "runbook-system"
    )]
    pub operator_namespace: String,
    /// text or json.
    #[arg(
        long,
        short = 'o',
        env = "RUNBOOK_EXPLAIN_OUTPUT",
        default_value = "text"
    )]
    pub output: String,
}

/// Render a decision record and conditions as text.
pub fn render(kind: &str, obj: &Value) -> String {
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
    let name = obj["metadata"]["name"].as_str().unwrap_or("");
    let mut out = format!(
        "{kind} {}{name}\n",
        if ns.is_empty() {
            String::new()
        } else {
            format!("{ns}/")
        }
    );
    let status = &obj["status"];
    let records = DecisionRecord::all(obj);
    let changed = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(runbook_core::plan::CHANGED_BY))
        .and_then(Value::as_str);
    if let Some(by) = changed {
        out.push_str(&format!("  changed by:   {by}\n"));
    }
    if records.is_empty() && changed.is_none() {
        out.push_str("  no decision recorded yet (is a policy bound to this kind, and is Runbook running?)\n");
    }
    for d in &records {
        render_record(d, &mut out);
    }
    if !records.is_empty() {
        render_status(status, &mut out);
    }
    if let Some(conds) = status.get("conditions").and_then(Value::as_array) {
        out.push_str("  conditions:\n");
        for c in conds {
            out.push_str(&format!(
                "    {}={} ({}) {}\n",
                c["type"].as_str().unwrap_or(""),
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            ));
        }
    }
    out
}

/// One decision record: its policy, time, actions and error.
fn render_record(d: &DecisionRecord, out: &mut String) {
    out.push_str(&format!(
        "  policy:       {} (version {}, {})\n",
        d.policy,
        d.policy_version,
        d.mode.as_deref().unwrap_or("enforce")
    ));
    out.push_str(&format!(
        "  decided:      {}\n",
        d.time.as_deref().unwrap_or("-")
    ));
    out.push_str(&format!("  inputs hash:  {}\n", d.inputs_hash));
    if d.actions.is_empty() {
        out.push_str("  actions:      none\n");
    } else {
        out.push_str("  actions:\n");
        for a in &d.actions {
            out.push_str(&format!(
                "    {:<9} {:<9} {}",
                a.result,
                a.action,
                match &a.target {
                    Some(t) => t.as_str(),
                    None if ActionRecord::on_itself(&a.action) => "(this object)",
                    None => "",
                }
            ));
            if let Some(m) = &a.message {
                out.push_str(&format!("\n              {m}"));
            }
            out.push('\n');
        }
    }
    if !d.alert_routes.is_empty() {
        out.push_str(&format!("  alerts to:    {}\n", d.alert_routes.join(", ")));
    }
    for (name, m) in &d.metrics {
        let read = match (m.value, &m.reason) {
            (Some(v), _) => format!(
                "{v} (sampled {}, {} series)",
                m.at.as_deref().unwrap_or("?"),
                m.samples.unwrap_or(1)
            ),
            (None, reason) => format!(
                "none: {} ({})",
                reason.as_deref().unwrap_or("?"),
                m.message.as_deref().unwrap_or("")
            ),
        };
        out.push_str(&format!(
            "  metric {name}: {read}\n    query: {}\n",
            m.query
        ));
    }
    for (verb, times) in &d.recent_actions {
        out.push_str(&format!(
            "  recent {} (limited): {}\n",
            plural(verb),
            times.join(", ")
        ));
    }
    out.push_str(&format!(
        "  error:        {}\n",
        d.error.as_deref().unwrap_or("-")
    ));
}

/// The status fields a policy wrote (not its conditions and records),
/// each cut at 100 characters.
fn render_status(status: &Value, out: &mut String) {
    let written: Vec<String> = status
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "conditions" | "decisions"))
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let cut: String = text.chars().take(100).collect();
            let more = if cut.len() < text.len() { "..." } else { "" };
            format!("    {k}: {cut}{more}")
        })
        .collect();
    if !written.is_empty() {
        out.push_str("  status:\n");
        for line in written {
            out.push_str(&line);
            out.push('\n');
        }
    }
}

/// A verb's plural in a heading: `patches`, `deletes`, `rollbacks`.
fn plural(verb: &str) -> String {
    if verb.ends_with('h') || verb.ends_with('s') {
        format!("{verb}es")
    } else {
        format!("{verb}s")
    }
}

/// The last Events about an object, oldest first, as lines.
pub fn history(events: &[Value], limit: usize) -> Vec<String> {
    let mut lines: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let when = [text("eventTime"), text("deprecatedLastTimestamp")]
                .into_iter()
                .find(|t| !t.is_empty())
                .or_else(|| {
                    e.pointer("/series/lastObservedTime")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .unwrap_or_default();
            let count = e
                .pointer("/series/count")
                .and_then(Value::as_i64)
                .map(|n| format!(" (x{n})"))
                .unwrap_or_default();
            (
                when.clone(),
                format!(
                    "    {when}  {:<7} {}: {}{count}",
                    text("type"),
                    text("reason"),
                    text("note")
                ),
            )
        })
        .collect();
    lines.sort();
    let skip = lines.len().saturating_sub(limit);
    lines.into_iter().skip(skip).map(|(_, l)| l).collect()
}

/// Whether discovery's resource is what `wanted` (lower case) names: its
/// kind, plural or singular, alone or with its group (`deployment.apps`).
fn names_resource(ar: &kube::discovery::ApiResource, wanted: &str) -> bool {
    let kind = ar.kind.to_ascii_lowercase();
    let names = [kind.clone(), ar.plural.clone(), format!("{kind}s")];
    names
        .iter()
        .any(|n| n == wanted || (!ar.group.is_empty() && format!("{n}.{}", ar.group) == wanted))
}

/// The kind a user named (`deploy`, `deployments.apps`, `Evaluator`),
/// as discovery serves it.
fn find_kind(
    discovery: &Discovery,
    kind: &str,
) -> anyhow::Result<(
    kube::discovery::ApiResource,
    kube::discovery::ApiCapabilities,
)> {
    let wanted = kind.to_ascii_lowercase();
    discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| names_resource(ar, &wanted))
        .with_context(|| format!("the API server serves no kind called {kind:?}"))
}

/// The object's last Events (among the first 500 of its namespace).
async fn print_history(client: &kube::Client, scope: &Scope, namespace: &str, value: &Value) {
    let uid = value.pointer("/metadata/uid").and_then(Value::as_str);
    let events: Api<RawObject> = match scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            namespace,
            &std::sync::Arc::new(events_resource()),
        ),
        _ => Api::all_with(client.clone(), &std::sync::Arc::new(events_resource())),
    };
    let lp = kube::api::ListParams::default().limit(500);
    if let (Some(uid), Ok(list)) = (uid, events.list(&lp).await) {
        let about: Vec<Value> = list
            .items
            .iter()
            .map(|e| e.value())
            .filter(|e| e.pointer("/regarding/uid").and_then(Value::as_str) == Some(uid))
            .collect();
        let lines = history(&about, 10);
        if !lines.is_empty() {
            println!("  history (last Events):");
            for l in lines {
                println!("{l}");
            }
        }
    }
}

pub async fn run(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let (kind, name) = args
        .object
        .split_once('/')
        .context("give the object as KIND/NAME")?;
    let client = super::run::client(args.kubeconfig.as_ref()).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("discovering the API")?;
    let (ar, caps) = find_kind(&discovery, kind)?;
    let dyntype = std::sync::Arc::new(ar.clone());
    let api: Api<RawObject> = if caps.scope == Scope::Namespaced {
        Api::namespaced_with(client.clone(), &namespace, &dyntype)
    } else {
        Api::all_with(client.clone(), &dyntype)
    };
    let place = match caps.scope {
        Scope::Namespaced => format!(" in namespace {namespace:?}"),
        _ => String::new(),
    };
    let obj = match api.get_opt(name).await {
        Ok(Some(obj)) => obj,
        Ok(None) => anyhow::bail!("{} {name:?} not found{place}", ar.kind),
        Err(e) => anyhow::bail!(
            "reading {} {name:?}{place}: {}",
            ar.kind,
            runbook_operator::util::api_error(&e)
        ),
    };
    let mut value = obj.value();
    // A kind whose schema is not Runbook's: its records are in its
    // RunbookState (a cluster-scoped target's in the namespace watched,
    // or the operator's).
    let kind_ref = runbook_core::kinds::KindRef::new(&ar.api_version, &ar.kind);
    if !runbook_core::plan::state::owns_schema(&kind_ref) {
        let state = runbook_core::kinds::KindRef::new("runbook.dev/v1alpha1", "RunbookState");
        let state_name = runbook_core::crd::state::name_for(&ar.group, &ar.kind, name);
        let namespaces = match caps.scope {
            Scope::Namespaced => vec![namespace.clone()],
            _ => vec![namespace.clone(), args.operator_namespace.clone()],
        };
        let uid = value
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        for ns in namespaces {
            let states: Api<RawObject> = Api::namespaced_with(
                client.clone(),
                &ns,
                &std::sync::Arc::new(state.api_resource()),
            );
            if let Ok(Some(found)) = states.get_opt(&state_name).await {
                let found = found.value();
                if found.pointer("/spec/target/uid").and_then(Value::as_str) == uid.as_deref() {
                    value = runbook_core::plan::state::overlay(&value, found.get("status"));
                    break;
                }
            }
        }
    }
    if args.output == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&value["status"]["decisions"])?
        );
    } else {
        print!("{}", render(&ar.kind, &value));
        print_history(&client, &caps.scope, &namespace, &value).await;
    }
    Ok(ExitCode::SUCCESS)
}

fn events_resource() -> kube::discovery::ApiResource {
    runbook_core::kinds::KindRef::new("events.k8s.io/v1", "Event").api_resource()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_record_renders_with_each_action_and_its_result() {
        let obj = json!({"metadata": {"name": "chatbot", "namespace": "ml"}, "status": {
            "decisions": [{"policy": "evaluator-drift", "policyVersion": "abc", "inputsHash": "h", "time": "t", "mode": "enforce",
                "actions": [{"action": "rollback", "target": "apps/v1 Deployment ml/chatbot", "result": "ok"},
                            {"action": "apply", "target": "v1 Secret ml/x", "result": "refused", "message": "not declared"}],
                "alertRoutes": ["default/events"]},
                {"policy": "retrain-on-drift", "policyVersion": "def", "inputsHash": "i", "time": "t2",
                "actions": [{"action": "apply", "target": "batch/v1 Job ml/chatbot-collect-1", "result": "ok"}]}],
            "conditions": [{"type": "Ready", "status": "False", "reason": "RolledBack", "message": "score low"}]}});
        let text = render("Evaluator", &obj);
        assert!(text.starts_with("Evaluator ml/chatbot\n"));
        assert!(text.contains("evaluator-drift (version abc, enforce)"));
        assert!(text.contains("refused   apply"));
        assert!(text.contains("not declared"));
        assert!(text.contains("Ready=False (RolledBack) score low"));
        let drift = text
            .find("policy:       evaluator-drift")
            .expect("first section");
        let retrain = text
            .find("policy:       retrain-on-drift (version def, enforce)")
            .expect("a section per policy");
        assert!(drift < retrain, "{text}");
        assert!(
            text[retrain..].contains("ok        apply     batch/v1 Job ml/chatbot-collect-1"),
            "{text}"
        );
    }

    /// A compact record, as this release writes it: what goes without
    /// saying is printed all the same.
    #[test]
    fn a_compact_record_renders_the_mode_results_and_own_object() {
        let obj = json!({"metadata": {"name": "w", "namespace": "ns"}, "status": {
            "decisions": [{"policy": "widget", "policyVersion": "abc", "inputsHash": "h", "time": "t",
                "actions": [{"action": "apply", "target": "v1 ConfigMap ns/w-child"},
                            {"action": "status"}, {"action": "requeue"}]}]}});
        let text = render("Widget", &obj);
        assert!(text.contains("widget (version abc, enforce)"), "{text}");
        assert!(
            text.contains("ok        apply     v1 ConfigMap ns/w-child"),
            "{text}"
        );
        assert!(text.contains("ok        status    (this object)"), "{text}");
        assert!(text.contains("ok        requeue   \n"), "{text}");
    }

    #[test]
    fn a_changed_object_says_by_whom_and_verbs_are_plural_in_english() {
        let obj = json!({"metadata": {"name": "chatbot", "namespace": "ml", "annotations": {
            "runbook.dev/changed-by": "policy evaluator-drift for Evaluator ml/chatbot: rollback to revision 1"}}});
        let text = render("Deployment", &obj);
        assert!(
            text.contains("changed by:   policy evaluator-drift for Evaluator ml/chatbot: rollback to revision 1"),
            "{text}"
        );
        assert!(!text.contains("no decision recorded yet"), "{text}");
        assert_eq!(plural("patch"), "patches");
        assert_eq!(plural("rollback"), "rollbacks");
        let ar = runbook_core::kinds::KindRef::new("apps/v1", "Deployment").api_resource();
        for typed in [
            "deployment",
            "deployments",
            "deployment.apps",
            "deployments.apps",
        ] {
            assert!(names_resource(&ar, typed), "{typed}");
        }
        assert!(!names_resource(&ar, "deployment.batch"));
    }

    #[test]
    fn history_is_the_last_events_oldest_first() {
        let ev = |t: &str, reason: &str| json!({"eventTime": t, "type": "Normal", "reason": reason, "note": "n"});
        let lines = history(
            &[
                ev("2026-01-02T00:00:00Z", "B"),
                ev("2026-01-01T00:00:00Z", "A"),
                ev("2026-01-03T00:00:00Z", "C"),
            ],
            2,
        );
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].contains("B: n") && lines[1].contains("C: n"),
            "{lines:?}"
        );
    }
}
