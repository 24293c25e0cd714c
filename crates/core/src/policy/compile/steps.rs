//! Declarative steps: each compiled once (its template, its expressions,
//! its timeout), checked against the kinds its policy declares.
//!
//! A part of a step that is wrong is reported and the rest of the step is
//! still checked, so one load names every mistake; a step whose shape is
//! wrong (two actions, none at all, a missing template file) stops there.

use std::collections::BTreeSet;

use super::pieces::{expr, template, template_kind};
use super::{CompiledStep, Ctx, pos_at};
use crate::kinds::{DeclaredKinds, KindName, KindRef, Role};
use crate::policy::model::{ApplySpec, DeleteSpec, EventSpec, StepSpec};
use crate::script::action::EventType;
use crate::script::engine::Expr;
use crate::script::template::Template;
use crate::util::time::parse_duration_ms;
use crate::util::yaml::{self, Node, NodeValue, Pos};

/// What a step is compiled in: its policy's file and kinds, the files it
/// uses, the `functions:` script its templates may call.
pub(super) struct StepCx<'a> {
    pub file: &'a str,
    pub source: &'a str,
    pub kinds: &'a DeclaredKinds,
    pub used: &'a mut BTreeSet<String>,
    pub functions: Option<&'a rhai::AST>,
}

/// The nodes of `spec.<key>`'s items, for positions.
pub(super) fn step_nodes<'a>(node: &'a Node, key: &str) -> Vec<&'a Node> {
    match node.at(&["spec", key]).map(|n| &n.value) {
        Some(NodeValue::Seq(items)) => items.iter().collect(),
        _ => Vec::new(),
    }
}

/// Compile one step (`None`: its errors are recorded).
pub(super) fn compile_step(
    cx: &mut Ctx,
    sx: &mut StepCx<'_>,
    node: &Node,
    step: &StepSpec,
) -> Option<CompiledStep> {
    if !shape_is_right(cx, sx.file, node, step) {
        return None;
    }
    let mut ok = true;
    let apply = match &step.apply {
        Some(a) => step_apply(cx, sx, node, &step.name, a, &mut ok)?,
        None => None,
    };
    let delete = match &step.delete {
        Some(d) => step_delete(cx, sx, node, &step.name, d, &mut ok)?,
        None => None,
    };
    let event = match &step.event {
        Some(e) => Some(step_event(cx, sx, node, e, &mut ok)?),
        None => None,
    };
    let compiled = CompiledStep {
        name: step.name.clone(),
        apply,
        status: optional_template(cx, sx, step.status.as_ref())?,
        delete,
        alert: optional_template(cx, sx, step.alert.as_ref())?,
        event,
        ready_when: optional_expr(cx, sx, step.ready_when.as_ref(), "readyWhen")?,
        failed_when: optional_expr(cx, sx, step.failed_when.as_ref(), "failedWhen")?,
        timeout_ms: step_timeout(cx, sx.file, node, step)?,
        message: optional_template(cx, sx, step.message.as_ref())?,
    };
    ok.then_some(compiled)
}

/// A DNS-label name, and exactly one of apply, status or delete (or only
/// an alert, an Event or a readyWhen).
fn shape_is_right(cx: &mut Ctx, file: &str, node: &Node, step: &StepSpec) -> bool {
    let here = Some(node.pos);
    let name = &step.name;
    if !crate::names::is_dns_label(name) {
        cx.error(
            file,
            pos_at(node, &["name"]),
            format!("step name {name:?} must be a DNS label (lowercase letters, digits, '-')"),
        );
    }
    let actions = [
        step.apply.is_some(),
        step.status.is_some(),
        step.delete.is_some(),
    ];
    let actions = actions.iter().filter(|b| **b).count();
    if actions > 1 {
        let m = format!("step {name}: give one of apply, status or delete");
        cx.error(file, here, m);
        return false;
    }
    if actions == 0 && step.ready_when.is_none() && step.alert.is_none() && step.event.is_none() {
        let m = format!(
            "step {name} does nothing: give apply, status, delete, alert, event or readyWhen"
        );
        cx.error(file, here, m);
        return false;
    }
    true
}

fn optional_template(
    cx: &mut Ctx,
    sx: &StepCx<'_>,
    node: Option<&Node>,
) -> Option<Option<Template>> {
    match node {
        Some(n) => Some(Some(template(cx, sx.file, sx.source, n, sx.functions)?)),
        None => Some(None),
    }
}

fn optional_expr(
    cx: &mut Ctx,
    sx: &StepCx<'_>,
    node: Option<&Node>,
    what: &str,
) -> Option<Option<Expr>> {
    match node {
        Some(n) => Some(Some(expr(cx, sx.file, sx.source, n, what, sx.functions)?)),
        None => Some(None),
    }
}

/// Where an apply's object is written: (file, its text, its node).
fn apply_source(
    cx: &mut Ctx,
    sx: &mut StepCx<'_>,
    node: &Node,
    name: &str,
    a: &ApplySpec,
) -> Option<(String, String, Node)> {
    match (&a.template, &a.object) {
        (Some(t), None) => {
            sx.used.insert(t.clone());
            let Some(text) = cx.bundle.files.get(t).cloned() else {
                let m = format!("step {name}: template {t:?} is not in this bundle");
                cx.error(sx.file, pos_at(node, &["apply", "template"]), m);
                return None;
            };
            let docs = yaml::split_documents(&text);
            if docs.len() != 1 {
                let m = format!("a template holds exactly one document, not {}", docs.len());
                cx.error(t, Some(Pos { line: 1, col: 1 }), m);
                return None;
            }
            let mut n = match yaml::parse_node(docs[0].1) {
                Ok(n) => n,
                Err(e) => {
                    let e = e.offset(docs[0].0);
                    cx.error(t, Some(e.pos), e.message);
                    return None;
                }
            };
            n.offset(docs[0].0);
            Some((t.clone(), text, n))
        }
        (None, Some(obj)) => Some((sx.file.to_string(), sx.source.to_string(), obj.clone())),
        _ => {
            let m = format!("step {name}: apply needs template or object, not both");
            cx.error(sx.file, pos_at(node, &["apply"]), m);
            None
        }
    }
}

/// An apply: a template of a kind the policy owns, with a literal
/// apiVersion and kind and a name.
fn step_apply(
    cx: &mut Ctx,
    sx: &mut StepCx<'_>,
    node: &Node,
    name: &str,
    a: &ApplySpec,
    ok: &mut bool,
) -> Option<Option<(KindRef, Template)>> {
    let (t_file, t_source, t_node) = apply_source(cx, sx, node, name, a)?;
    let t = template(cx, &t_file, &t_source, &t_node, sx.functions)?;
    let problem = match template_kind(&t) {
        None => Some((
            Some(t_node.pos),
            "a template must give apiVersion and kind literally".to_string(),
        )),
        Some(k) if !sx.kinds.has(&k, Role::Owns) => Some((
            pos_at(&t_node, &["kind"]),
            format!("step {name} applies {k}, which the policy does not declare in owns"),
        )),
        Some(k) => {
            if t_node.at(&["metadata", "name"]).is_none() {
                let m = "a template needs metadata.name (names must be deterministic)";
                cx.error(&t_file, Some(t_node.pos), m);
                *ok = false;
            }
            return Some(Some((k, t)));
        }
    };
    if let Some((pos, m)) = problem {
        cx.error(&t_file, pos, m);
    }
    *ok = false;
    Some(None)
}

/// A delete: of a kind the policy owns, by a templated name.
fn step_delete(
    cx: &mut Ctx,
    sx: &StepCx<'_>,
    node: &Node,
    name: &str,
    d: &DeleteSpec,
    ok: &mut bool,
) -> Option<Option<(KindRef, Template)>> {
    let kn = KindName {
        api_version: d.api_version.clone(),
        kind: d.kind.clone(),
    };
    let pos = pos_at(node, &["delete", "kind"]);
    match sx.kinds.resolve(&kn) {
        Ok(k) if sx.kinds.has(&k, Role::Owns) => {
            let t = template(cx, sx.file, sx.source, &d.name, sx.functions)?;
            return Some(Some((k, t)));
        }
        Ok(k) => {
            let m = format!("step {name} deletes {k}, which the policy does not declare in owns");
            cx.error(sx.file, pos, m);
        }
        Err(e) => cx.error(sx.file, pos, format!("step {name}: {e}")),
    }
    *ok = false;
    Some(None)
}

/// An Event: Normal or Warning, a reason, a templated message.
fn step_event(
    cx: &mut Ctx,
    sx: &StepCx<'_>,
    node: &Node,
    e: &EventSpec,
    ok: &mut bool,
) -> Option<(EventType, String, Template)> {
    let type_ = match e.type_.as_str() {
        "Warning" => EventType::Warning,
        "Normal" => EventType::Normal,
        _ => {
            let m = "event type must be Normal or Warning";
            cx.error(sx.file, pos_at(node, &["event", "type"]), m);
            *ok = false;
            EventType::Normal
        }
    };
    let message = template(cx, sx.file, sx.source, &e.message, sx.functions)?;
    Some((type_, e.reason.clone(), message))
}

/// A positive duration, if given (`None`: an error stops the step).
fn step_timeout(cx: &mut Ctx, file: &str, node: &Node, step: &StepSpec) -> Option<Option<i64>> {
    let Some(t) = &step.timeout else {
        return Some(None);
    };
    let name = &step.name;
    let pos = pos_at(node, &["timeout"]);
    match parse_duration_ms(t) {
        Ok(ms) if ms > 0 => Some(Some(ms)),
        Ok(_) => {
            cx.error(file, pos, format!("step {name}: timeout must be positive"));
            None
        }
        Err(e) => {
            cx.error(file, pos, format!("step {name}: timeout: {e}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::compile::tests::{errors_in, errors_of};

    const HEAD: &str = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  owns: [{apiVersion: batch/v1, kind: Job}]\n  steps:\n";

    #[test]
    fn a_step_does_one_thing_and_has_a_label_for_a_name() {
        let two = format!(
            "{HEAD}    - name: both\n      status: {{phase: x}}\n      delete: {{kind: Job, name: j}}\n"
        );
        assert_eq!(
            errors_of(&two),
            ["p.yaml:8:7: step both: give one of apply, status or delete"]
        );
        let none = format!("{HEAD}    - name: idle\n");
        assert!(errors_of(&none)[0].ends_with(
            "step idle does nothing: give apply, status, delete, alert, event or readyWhen"
        ));
        let upper = format!("{HEAD}    - name: Dump\n      status: {{phase: x}}\n");
        assert!(
            errors_of(&upper)[0].starts_with("p.yaml:8:13: step name \"Dump\" must be a DNS label"),
            "{:?}",
            errors_of(&upper)
        );
    }

    #[test]
    fn an_applied_template_needs_an_owned_kind_a_literal_kind_and_a_name() {
        let secret = format!("{HEAD}    - name: s\n      apply: {{template: s.yaml}}\n");
        let errors = errors_in(&[
            ("p.yaml", &secret),
            (
                "s.yaml",
                "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n",
            ),
        ]);
        assert_eq!(
            errors,
            ["s.yaml:2:7: step s applies v1 Secret, which the policy does not declare in owns"]
        );
        let nameless = errors_in(&[
            ("p.yaml", &secret),
            (
                "s.yaml",
                "apiVersion: batch/v1\nkind: Job\nmetadata: {labels: {a: b}}\n",
            ),
        ]);
        assert_eq!(
            nameless,
            ["s.yaml:1:1: a template needs metadata.name (names must be deterministic)"]
        );
        let missing = errors_in(&[("p.yaml", &secret)]);
        assert!(missing[0].ends_with("step s: template \"s.yaml\" is not in this bundle"));
        let two_docs = errors_in(&[
            ("p.yaml", &secret),
            ("s.yaml", "kind: Job\n---\nkind: Job\n"),
        ]);
        assert_eq!(
            two_docs,
            ["s.yaml:1:1: a template holds exactly one document, not 2"]
        );
    }

    #[test]
    fn deletes_events_and_timeouts_are_checked_in_one_pass() {
        let bad = format!(
            "{HEAD}    - name: tidy\n      delete: {{kind: Secret, name: x}}\n      event: {{type: Loud, reason: R, message: m}}\n    - name: wait\n      readyWhen: 'true'\n      timeout: -5m\n"
        );
        let errors = errors_of(&bad);
        assert!(
            errors
                .iter()
                .any(|e| e.contains("step tidy: ") && e.contains("Secret")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.ends_with("event type must be Normal or Warning")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.contains("step wait: timeout")),
            "{errors:?}"
        );
    }
}
