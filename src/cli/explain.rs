//! `runbook explain KIND/NAME`: print the decision record of an object,
//! read from the cluster (from its status, or from its `RunbookState`
//! for a kind whose schema is not Runbook's).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use kube::Api;
use kube::discovery::{Discovery, Scope};
use serde_json::Value;

use crate::crd::DecisionRecord;
use crate::observe::RawObject;

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The object: KIND/NAME, where KIND is a kind, plural, singular or short name.
    pub object: String,
    /// The object's namespace.
    #[arg(
        long,
        short = 'n',
        env = "RUNBOOK_EXPLAIN_NAMESPACE",
        default_value = "default"
    )]
    pub namespace: String,
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
    if records.is_empty() {
        out.push_str("  no decision recorded yet (is a policy bound to this kind, and is Runbook running?)\n");
    }
    for d in &records {
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
                    a.target.as_deref().unwrap_or("")
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
        for (verb, times) in &d.recent_actions {
            out.push_str(&format!(
                "  recent {verb}s (limited): {}\n",
                times.join(", ")
            ));
        }
        out.push_str(&format!(
            "  error:        {}\n",
            d.error.as_deref().unwrap_or("-")
        ));
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

pub async fn run(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let (kind, name) = args
        .object
        .split_once('/')
        .context("give the object as KIND/NAME")?;
    let client = super::run::client(args.kubeconfig.as_ref()).await?;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("discovering the API")?;
    let wanted = kind.to_ascii_lowercase();
    let mut found = None;
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            let matches = ar.kind.to_ascii_lowercase() == wanted
                || ar.plural == wanted
                || ar.kind.to_ascii_lowercase() + "s" == wanted
                || format!("{}.{}", ar.plural, ar.group) == wanted;
            if matches && found.is_none() {
                found = Some((ar, caps));
            }
        }
    }
    let (ar, caps) =
        found.with_context(|| format!("the API server serves no kind called {kind:?}"))?;
    let dyntype = std::sync::Arc::new(ar.clone());
    let api: Api<RawObject> = if caps.scope == Scope::Namespaced {
        Api::namespaced_with(client.clone(), &args.namespace, &dyntype)
    } else {
        Api::all_with(client.clone(), &dyntype)
    };
    let place = match caps.scope {
        Scope::Namespaced => format!(" in namespace {:?}", args.namespace),
        _ => String::new(),
    };
    let obj = match api.get_opt(name).await {
        Ok(Some(obj)) => obj,
        Ok(None) => anyhow::bail!("{} {name:?} not found{place}", ar.kind),
        Err(e) => anyhow::bail!(
            "reading {} {name:?}{place}: {}",
            ar.kind,
            crate::util::api_error(&e)
        ),
    };
    let mut value = obj.value();
    // A kind whose schema is not Runbook's: its records are in its
    // RunbookState (a cluster-scoped target's in the namespace watched,
    // or the operator's).
    let kind_ref = crate::kinds::KindRef::new(&ar.api_version, &ar.kind);
    if !crate::act::state::owns_schema(&kind_ref) {
        let state = crate::kinds::KindRef::new("runbook.dev/v1alpha1", "RunbookState");
        let state_name = crate::crd::state::name_for(&ar.group, &ar.kind, name);
        let namespaces = match caps.scope {
            Scope::Namespaced => vec![args.namespace.clone()],
            _ => vec![args.namespace.clone(), args.operator_namespace.clone()],
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
                    value = crate::act::state::overlay(&value, found.get("status"));
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
    }
    Ok(ExitCode::SUCCESS)
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
}
