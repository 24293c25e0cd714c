//! The small pieces of a policy: its schedule, its limits, and the Rhai
//! expressions and templates its steps are made of, each compiled once
//! with its position in the file.

use super::{Ctx, ScheduleSource, Timer, pos_at};
use crate::kinds::KindRef;
use crate::policy::claim::StatusClaim;
use crate::policy::limits::{CircuitBreaker, CompiledLimits, RateLimit, Verb};
use crate::policy::model::{Limits, ScheduleSpec};
use crate::schedule::Schedule;
use crate::script::engine::Expr;
use crate::script::template::{Template, quote_offset};
use crate::util::time::parse_duration_ms;
use crate::util::yaml::{Node, Pos};

/// `spec.schedule`, or each entry of `spec.schedules` with its name.
pub(super) fn compile_schedules(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    spec: &crate::policy::model::PolicySpec,
) -> Vec<Timer> {
    if let Some(s) = &spec.schedule {
        if !spec.schedules.is_empty() {
            let pos = pos_at(node, &["spec", "schedules"]);
            cx.error(
                file,
                pos,
                "spec.schedules: give schedule or schedules, not both",
            );
        }
        let pos = pos_at(node, &["spec", "schedule"]);
        if s.name.is_some() {
            cx.error(
                file,
                pos,
                "spec.schedule.name: only the entries of spec.schedules are named",
            );
        }
        return compile_schedule(cx, file, pos, "spec.schedule", s)
            .map(|source| Timer {
                name: None,
                source,
                first_run: s.first_run,
            })
            .into_iter()
            .collect();
    }
    let items: Vec<Pos> = match node.at(&["spec", "schedules"]).map(|n| &n.value) {
        Some(crate::util::yaml::NodeValue::Seq(items)) => items.iter().map(|n| n.pos).collect(),
        _ => Vec::new(),
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (i, named) in spec.schedules.iter().enumerate() {
        let pos = items.get(i).copied().or(Some(node.pos));
        let field = format!("spec.schedules[{i}]");
        let Some(name) = named.name.as_deref().filter(|n| !n.trim().is_empty()) else {
            cx.error(
                file,
                pos,
                format!("{field}.name: give each schedule a name"),
            );
            continue;
        };
        if !seen.insert(name) {
            cx.error(
                file,
                pos,
                format!("{field}.name: {name:?} names two schedules"),
            );
            continue;
        }
        if let Some(source) = compile_schedule(cx, file, pos, &field, named) {
            out.push(Timer {
                name: Some(name.to_string()),
                source,
                first_run: named.first_run,
            });
        }
    }
    out
}

fn compile_schedule(
    cx: &mut Ctx,
    file: &str,
    pos: Option<Pos>,
    field: &str,
    spec: &ScheduleSpec,
) -> Option<ScheduleSource> {
    let zone = spec.time_zone.as_deref();
    if let Some(z) = zone
        && let Err(e) = crate::schedule::time_zone(z)
    {
        cx.error(file, pos, format!("{field}.timeZone: {e}"));
        return None;
    }
    let parse = |cx: &mut Ctx, text: &str| match Schedule::parse_in(text, zone) {
        Ok(s) => Some(s),
        Err(e) => {
            cx.error(file, pos, format!("{field}: {e}"));
            None
        }
    };
    if let Some(every) = &spec.every {
        return every_source(cx, file, pos, field, spec, every);
    }
    if spec.idle.is_some() {
        cx.error(file, pos, format!("{field}.idle: give it with every"));
        return None;
    }
    match (&spec.cron, &spec.from_field) {
        (Some(_), Some(_)) => {
            cx.error(
                file,
                pos,
                format!("{field}: give cron or fromField, not both"),
            );
            None
        }
        (Some(c), None) => parse(cx, c).map(ScheduleSource::Fixed),
        (None, Some(path_text)) => {
            let path: Vec<String> = path_text.split('.').map(str::to_string).collect();
            if path.iter().any(|p| p.is_empty()) {
                cx.error(file, pos, format!("{field}.fromField: {path_text:?} is not a dotted path such as spec.schedule"));
                return None;
            }
            let default = match &spec.default {
                Some(d) => Some(parse(cx, d)?),
                None => None,
            };
            Some(ScheduleSource::FromField {
                path,
                default,
                parsed: crate::schedule::ParsedSchedules::in_zone(spec.time_zone.clone()),
            })
        }
        (None, None) => {
            cx.error(file, pos, format!("{field}: give cron or fromField"));
            None
        }
    }
}

/// A schedule of `every` (and `idle`): an interval, alone.
fn every_source(
    cx: &mut Ctx,
    file: &str,
    pos: Option<Pos>,
    field: &str,
    spec: &ScheduleSpec,
    every: &str,
) -> Option<ScheduleSource> {
    if spec.cron.is_some() || spec.from_field.is_some() {
        let m = format!("{field}: give cron, fromField or every, one of them");
        cx.error(file, pos, m);
        return None;
    }
    let ms = |cx: &mut Ctx, what: &str, text: &str| match crate::util::time::parse_duration_ms(text)
    {
        Ok(ms) if ms >= 1_000 => Some(ms),
        Ok(_) => {
            let m = format!(
                "{field}.{what}: {text:?} is under a second, the least a schedule may wait"
            );
            cx.error(file, pos, m);
            None
        }
        Err(e) => {
            cx.error(file, pos, format!("{field}.{what}: {e}"));
            None
        }
    };
    let every_ms = ms(cx, "every", every)?;
    let idle_ms = match &spec.idle {
        Some(text) => Some(ms(cx, "idle", text)?),
        None => None,
    };
    Some(ScheduleSource::Every { every_ms, idle_ms })
}

pub(super) fn compile_limits(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    limits: &Limits,
) -> CompiledLimits {
    let mut out = CompiledLimits::default();
    for (verb, text) in [
        (Verb::Rollback, &limits.rollback),
        (Verb::Delete, &limits.delete),
        (Verb::Patch, &limits.patch),
        (Verb::Apply, &limits.apply),
    ] {
        let key = verb.as_str();
        if let Some(t) = text {
            match RateLimit::parse(t) {
                Ok(l) => *out.slot(verb) = Some(l),
                Err(e) => cx.error(
                    file,
                    pos_at(node, &["spec", "limits", key]),
                    format!("spec.limits.{key}: {e}"),
                ),
            }
        }
    }
    if let Some(cb) = &limits.circuit_breaker {
        let pos = pos_at(node, &["spec", "limits", "circuitBreaker"]);
        if !(cb.error_rate > 0.0 && cb.error_rate <= 1.0) {
            cx.error(
                file,
                pos,
                "spec.limits.circuitBreaker.errorRate must be in (0, 1]",
            );
        }
        match (
            parse_duration_ms(&cb.window),
            parse_duration_ms(&cb.cooldown),
        ) {
            (Ok(window_ms), Ok(cooldown_ms)) => {
                out.circuit_breaker = Some(CircuitBreaker {
                    error_rate: cb.error_rate,
                    window_ms,
                    min_requests: cb.min_requests.max(1),
                    cooldown_ms,
                })
            }
            (Err(e), _) | (_, Err(e)) => {
                cx.error(file, pos, format!("spec.limits.circuitBreaker: {e}"))
            }
        }
    }
    out
}

pub(super) fn expr(
    cx: &mut Ctx,
    file: &str,
    source: &str,
    node: &Node,
    what: &str,
    functions: Option<&rhai::AST>,
) -> Option<Expr> {
    let Some(text) = node.as_str() else {
        cx.error(
            file,
            Some(node.pos),
            format!("{what} must be a Rhai expression in a string"),
        );
        return None;
    };
    let origin = Pos {
        line: node.pos.line,
        col: node.pos.col + quote_offset(source, node.pos),
    };
    match cx
        .engine
        .compile_expr(&cx.bundle.display_path(file), text, origin, functions)
    {
        Ok(e) => Some(e),
        Err(e) => {
            cx.errors.push(e.into());
            None
        }
    }
}

pub(super) fn template(
    cx: &mut Ctx,
    file: &str,
    source: &str,
    node: &Node,
    functions: Option<&rhai::AST>,
) -> Option<Template> {
    match Template::compile(
        cx.engine,
        &cx.bundle.display_path(file),
        source,
        node,
        functions,
    ) {
        Ok(t) => Some(t),
        Err(e) => {
            cx.errors.push(e.into());
            None
        }
    }
}

/// Kind named by a template's literal apiVersion/kind.
pub(super) fn template_kind(t: &Template) -> Option<KindRef> {
    let av = t.literal_at(&["apiVersion"])?.as_str()?;
    let kind = t.literal_at(&["kind"])?.as_str()?;
    Some(KindRef::new(av, kind))
}

/// `spec.status` as a claim, each name with its position; a policy that
/// does not declare one claims the whole status. A schedule's own fields
/// are part of a declared claim.
pub(super) fn compile_status_claim(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    spec: &crate::policy::model::PolicySpec,
) -> StatusClaim {
    use crate::policy::claim::{
        NAMED_SCHEDULE_FIELD, RUNBOOK_CONDITION, RUNBOOK_FIELDS, SCHEDULE_FIELDS,
    };
    let Some(declared) = &spec.status else {
        return StatusClaim::everything(pos_at(node, &["spec", "target"]));
    };
    let mut claim = StatusClaim {
        declared: true,
        pos: pos_at(node, &["spec", "status"]),
        ..StatusClaim::default()
    };
    let items = |key: &str| -> Vec<Option<Pos>> {
        match node.at(&["spec", "status", key]).map(|n| &n.value) {
            Some(crate::util::yaml::NodeValue::Seq(items)) => {
                items.iter().map(|n| Some(n.pos)).collect()
            }
            _ => Vec::new(),
        }
    };
    let (field_pos, condition_pos) = (items("fields"), items("conditions"));
    for (i, f) in declared.fields.iter().enumerate() {
        let pos = field_pos.get(i).copied().flatten().or(claim.pos);
        let problem = if f.is_empty() || f.contains(['.', '/', ' ']) {
            Some(format!(
                "spec.status.fields: {f:?} is not a top-level status field name such as lastScore"
            ))
        } else if RUNBOOK_FIELDS.contains(&f.as_str()) {
            Some(format!(
                "spec.status.fields: Runbook keeps status.{f} itself; do not declare it"
            ))
        } else if claim.fields.contains_key(f) {
            Some(format!("spec.status.fields: {f:?} is declared twice"))
        } else {
            None
        };
        match problem {
            Some(m) => cx.error(file, pos, m),
            None => {
                claim.fields.insert(f.clone(), pos);
            }
        }
    }
    for (i, c) in declared.conditions.iter().enumerate() {
        let pos = condition_pos.get(i).copied().flatten().or(claim.pos);
        let problem = if c.is_empty() || c.contains(char::is_whitespace) {
            Some(format!(
                "spec.status.conditions: {c:?} is not a condition type such as Ready"
            ))
        } else if c == RUNBOOK_CONDITION {
            Some(format!(
                "spec.status.conditions: Runbook sets {c} itself when a decision goes wrong; do not declare it"
            ))
        } else if claim.conditions.contains_key(c) {
            Some(format!("spec.status.conditions: {c:?} is declared twice"))
        } else {
            None
        };
        match problem {
            Some(m) => cx.error(file, pos, m),
            None => {
                claim.conditions.insert(c.clone(), pos);
            }
        }
    }
    if spec.schedule.is_some() {
        let pos = pos_at(node, &["spec", "schedule"]);
        for f in SCHEDULE_FIELDS {
            claim.fields.entry(f.to_string()).or_insert(pos);
        }
    }
    if !spec.schedules.is_empty() {
        let pos = pos_at(node, &["spec", "schedules"]);
        claim
            .fields
            .entry(NAMED_SCHEDULE_FIELD.to_string())
            .or_insert(pos);
    }
    claim
}

/// The kinds a script names as literals in `ctx` lookups
/// (`ctx.get("StatefulSet", ...)`, `ctx.list`, `ctx.owned`,
/// `ctx.owned_by`), each with the position of its string;
/// lines commented out are skipped.
pub(super) fn literal_kinds(text: &str) -> Vec<(String, Pos)> {
    const CALLS: &[&str] = &["get", "list", "owned", "owned_by"];
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("ctx.") {
            let after = &rest[at + 4..];
            let name_end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            let call = &after[..name_end];
            let args = after[name_end..].trim_start();
            if CALLS.contains(&call)
                && let Some(quoted) = args.strip_prefix('(').map(str::trim_start)
                && let Some(body) = quoted.strip_prefix('"')
                && let Some(close) = body.find('"')
            {
                let col = code.len() - quoted.len() + 1;
                out.push((
                    body[..close].to_string(),
                    Pos {
                        line: n as u32 + 1,
                        col: col as u32,
                    },
                ));
            }
            rest = after;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::policy::compile::tests::errors_of;

    const HEAD: &str = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  script: p.rhai\n";

    #[test]
    fn a_schedule_takes_cron_or_a_field_and_names_its_mistakes() {
        let both = format!("{HEAD}  schedule: {{cron: '@hourly', fromField: spec.every}}\n");
        assert_eq!(
            errors_of(&both),
            ["p.yaml:7:13: spec.schedule: give cron or fromField, not both"]
        );
        let neither = format!("{HEAD}  schedule: {{}}\n");
        assert_eq!(
            errors_of(&neither),
            ["p.yaml:7:13: spec.schedule: give cron or fromField"]
        );
        let path = format!("{HEAD}  schedule: {{fromField: spec..every}}\n");
        assert!(
            errors_of(&path)[0].contains("is not a dotted path"),
            "{:?}",
            errors_of(&path)
        );
        let cron = format!("{HEAD}  schedule: {{cron: 'every tuesday'}}\n");
        assert!(errors_of(&cron)[0].starts_with("p.yaml:7:13: spec.schedule: "));
        let good = format!("{HEAD}  schedule: {{fromField: spec.every, default: '@daily'}}\n");
        assert!(errors_of(&good).is_empty());
    }

    #[test]
    fn limits_and_the_circuit_breaker_are_checked_where_they_are_written() {
        let rate = format!("{HEAD}  limits: {{rollback: 'often'}}\n");
        assert!(
            errors_of(&rate)[0].starts_with("p.yaml:7:22: spec.limits.rollback: "),
            "{:?}",
            errors_of(&rate)
        );
        let breaker = format!(
            "{HEAD}  limits:\n    circuitBreaker: {{errorRate: 1.5, window: 1m, cooldown: soon, minRequests: 3}}\n"
        );
        let errors = errors_of(&breaker);
        assert!(
            errors[0].ends_with("spec.limits.circuitBreaker.errorRate must be in (0, 1]"),
            "{errors:?}"
        );
        assert!(
            errors[1].contains("spec.limits.circuitBreaker: "),
            "{errors:?}"
        );
    }
}
