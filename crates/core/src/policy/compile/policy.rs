//! One `Policy` document compiled: its header and kinds, its body (a
//! script, or steps with their compensation and retention), schedule,
//! limits, params and selector, and the version that covers every file it
//! uses.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use super::pieces::{compile_limits, compile_schedules, compile_status_claim, template};
use super::steps::{StepCx, compile_step, step_nodes};
use super::{Body, CompiledPolicy, CompiledRetention, Ctx, parse_doc, pos_at};
use crate::kinds::{DeclaredKinds, KindRef};
use crate::labels::Selector;
use crate::policy::model::{API_VERSION, OwnsSpec, PolicyDoc, PolicySpec};
use crate::script::engine::Script;
use crate::util::hash::short_hex;
use crate::util::yaml::{Node, Pos};

/// The kinds `spec.deletes` names, each with its label selector.
fn delete_selectors(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    spec: &PolicySpec,
) -> Vec<(crate::kinds::KindRef, Selector)> {
    spec.deletes
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let field = format!("deletes[{i}].selector");
            let selector = label_selector(cx, file, node, &field, d.selector.as_ref());
            (d.kind_ref(), selector)
        })
        .collect()
}

/// The most paths `spec.previous` may name.
const MAX_PATHS: usize = 32;

/// Whether `path` is a field path `spec.previous` may name: dotted
/// segments, none empty.
fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(format!(
            "{path:?} is not a field path: give dotted fields such as spec.replicas or metadata.labels"
        ));
    }
    if path.len() > 253 {
        return Err(format!("{path:?} is longer than 253 characters"));
    }
    Ok(())
}

/// `spec.previous`: field paths, each once, at most `MAX_PATHS`; given
/// when a schedule waits for its target to be idle.
fn previous_paths(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    spec: &PolicySpec,
    schedules: &[crate::policy::compile::Timer],
) -> Vec<String> {
    let idles = schedules.iter().any(|t| {
        matches!(
            t.source,
            crate::policy::compile::ScheduleSource::Every {
                idle_ms: Some(_),
                ..
            }
        )
    });
    if idles && spec.previous.is_empty() {
        let at = node
            .at(&["spec", "schedules"])
            .or(node.at(&["spec", "schedule"]))
            .map(|n| n.pos);
        cx.error(
            file,
            at,
            "idle: a schedule that waits for its target to be left unchanged needs spec.previous, the fields whose change counts (spec.previous: [spec], say)",
        );
    }
    let items: Vec<Pos> = match node.at(&["spec", "previous"]).map(|n| &n.value) {
        Some(crate::util::yaml::NodeValue::Seq(items)) => items.iter().map(|n| n.pos).collect(),
        _ => Vec::new(),
    };
    let whole = pos_at(node, &["spec", "previous"]);
    if spec.previous.len() > MAX_PATHS {
        let n = spec.previous.len();
        cx.error(
            file,
            whole,
            format!("spec.previous: {n} paths; at most {MAX_PATHS}"),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, path) in spec.previous.iter().enumerate() {
        let pos = items.get(i).copied().or(whole);
        if let Err(m) = check_path(path) {
            cx.error(file, pos, format!("spec.previous[{i}]: {m}"));
        } else if !seen.insert(path.as_str()) {
            cx.error(
                file,
                pos,
                format!("spec.previous[{i}]: {path} is named twice"),
            );
        }
    }
    spec.previous.clone()
}

/// `spec.annotationSelector` as a selector over annotations.
fn annotation_selector_of(cx: &mut Ctx, file: &str, node: &Node, spec: &PolicySpec) -> Selector {
    match &spec.annotation_selector {
        Some(sel) => selector_of(
            cx,
            file,
            node,
            ("annotationSelector", "matchAnnotations"),
            &sel.match_annotations,
            &sel.match_expressions,
        ),
        None => Selector::default(),
    }
}

/// Compile a policy document (`None`: its errors are recorded).
pub(super) fn load_policy(
    cx: &mut Ctx,
    file: &str,
    text: &str,
    offset: u32,
) -> Option<CompiledPolicy> {
    let (doc, node) = parse_doc::<PolicyDoc>(cx, file, text, offset)?;
    let errors_before = cx.errors.len();
    let source = cx.bundle.files.get(file).cloned().unwrap_or_default();
    check_header(cx, file, &node, &doc);
    let places = kind_places(&node, &doc.spec);
    cx.declared.push((cx.bundle.display_path(file), places));
    let spec = &doc.spec;
    let kinds = declared_kinds(spec).with_names(reads_by_name(cx, file, &node, spec));
    let mut used: BTreeSet<String> = BTreeSet::from([file.to_string()]);
    let body = match (&spec.script, spec.steps.is_empty()) {
        (Some(_), false) => {
            let m = "spec: give script or steps, not both";
            cx.error(file, pos_at(&node, &["spec", "script"]), m);
            None
        }
        (None, true) => {
            cx.error(
                file,
                pos_at(&node, &["spec"]),
                "spec: give a script or steps",
            );
            None
        }
        (Some(script), true) => script_body(cx, file, &node, spec, script, &mut used),
        (None, false) => steps_body(cx, file, &source, &node, spec, &kinds, &mut used),
    };
    let schedules = compile_schedules(cx, file, &node, spec);
    let limits = compile_limits(cx, file, &node, &spec.limits);
    let params = params_of(cx, file, &node, spec);
    let selector = label_selector(cx, file, &node, "selector", spec.selector.as_ref());
    let deletes = delete_selectors(cx, file, &node, spec);
    let annotation_selector = annotation_selector_of(cx, file, &node, spec);
    let status = compile_status_claim(cx, file, &node, spec);
    let namespaces = other_namespaces(cx, file, &node, spec, body.as_ref());
    let previous = previous_paths(cx, file, &node, spec, &schedules);
    let metrics = super::metrics::compile_all(cx, file, &node, spec);
    if spec.sweep {
        check_sweep(cx, file, &node, spec, body.as_ref());
    }
    if cx.errors.len() > errors_before {
        return None;
    }
    Some(CompiledPolicy {
        name: doc.metadata.name.clone(),
        id: doc.metadata.name.clone(),
        file: cx.bundle.display_path(file),
        origin: cx.bundle.origin.clone(),
        version: version_of(cx, file, text, &used),
        target: spec.target.clone(),
        selector,
        annotation_selector,
        deletes,
        kinds: Arc::new(kinds),
        schedules,
        body: body?,
        params_dyn: crate::script::obj::view(Arc::new(params.clone())),
        params,
        alerts: spec.alerts.clone(),
        alerts_pos: spec
            .alerts
            .as_ref()
            .and_then(|_| node.at(&["spec", "alerts"]).map(|n| n.pos)),
        mode: spec.mode,
        limits,
        priority: spec.priority,
        status,
        tenant: None,
        pods: spec.pods.clone(),
        pods_pos: node.at(&["spec", "pods"]).map(|n| n.pos),
        namespaces,
        forced: spec
            .owns
            .iter()
            .filter(|o| o.force)
            .map(OwnsSpec::kind_ref)
            .collect(),
        previous,
        sweep: spec.sweep,
        metrics,
    })
}

/// What `spec.sweep` rules out: a sweep decides at its schedule's fire
/// times over all its targets at once, so nothing that belongs to one
/// target (children, their clean-up, a field's last value, a schedule
/// read from a target) has a place in it.
fn check_sweep(cx: &mut Ctx, file: &str, node: &Node, spec: &PolicySpec, body: Option<&Body>) {
    let at = |path: &[&str]| pos_at(node, path);
    if spec.schedule.is_none() && spec.schedules.is_empty() {
        let m = "spec.sweep: a sweep decides at its schedule's fire times; give spec.schedule (cron or every)";
        cx.error(file, at(&["spec", "sweep"]), m);
    }
    let scheduled = spec.schedule.iter().chain(&spec.schedules);
    for (i, s) in scheduled.enumerate() {
        let which = match &spec.schedule {
            Some(_) => "spec.schedule".to_string(),
            None => format!("spec.schedules[{i}]"),
        };
        let path: Vec<String> = match &spec.schedule {
            Some(_) => vec!["spec".into(), "schedule".into()],
            None => vec!["spec".into(), "schedules".into(), i.to_string()],
        };
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        if s.from_field.is_some() {
            let m = format!(
                "{which}.fromField: a sweep has no one target whose field could name its schedule; give cron or every"
            );
            cx.error(file, at(&path), m);
        }
        if s.idle.is_some() {
            let m = format!(
                "{which}.idle: a sweep has no one target to wait on; give every alone, or drop spec.sweep"
            );
            cx.error(file, at(&path), m);
        }
    }
    let refused: [(&str, bool, &str); 4] = [
        (
            "owns",
            !spec.owns.is_empty(),
            "spec.owns: a sweep makes no children (no one target would own them); write what it finds to its own status with status(#{...})",
        ),
        (
            "previous",
            !spec.previous.is_empty(),
            "spec.previous: a sweep keeps no values per target; compare the targets it lists itself",
        ),
        (
            "namespaces",
            spec.namespaces.is_some(),
            "spec.namespaces: a sweep makes no children, in any namespace",
        ),
        (
            "steps",
            !spec.steps.is_empty(),
            "spec.steps: a sweep takes a script (fn reconcile(ctx) over ctx.targets)",
        ),
    ];
    for (field, wrong, m) in refused {
        if wrong {
            cx.error(file, at(&["spec", field]), m);
        }
    }
    if let Some(Body::Script { script, .. }) = body {
        for hook in ["finalize", "deleted"] {
            if script.has_fn(hook) {
                let m = format!(
                    "{}: fn {hook}: a sweep holds no target, so it hears of no one target's deletion; drop spec.sweep to decide per target",
                    spec.script.as_deref().unwrap_or(file)
                );
                cx.error(file, at(&["spec", "script"]), m);
            }
        }
    }
}

/// `spec.readsByName`: each kind with its names, which must be object
/// names, for a kind not also read whole.
fn reads_by_name(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    spec: &PolicySpec,
) -> std::collections::BTreeMap<KindRef, std::collections::BTreeSet<String>> {
    let mut out: std::collections::BTreeMap<KindRef, std::collections::BTreeSet<String>> =
        Default::default();
    let pos = pos_at(node, &["spec", "readsByName"]);
    for r in &spec.reads_by_name {
        let k = r.kind_ref();
        if spec.reads.contains(&k) {
            cx.error(
                file,
                pos,
                format!("spec.readsByName: {k} is also in spec.reads; read it whole or by name, not both"),
            );
        }
        if r.names.is_empty() {
            cx.error(
                file,
                pos,
                format!("spec.readsByName: {k}: give the names of the objects it reads"),
            );
        }
        for n in &r.names {
            if !crate::names::is_dns_subdomain(n) {
                cx.error(
                    file,
                    pos,
                    format!("spec.readsByName: {k}: {n:?} is not an object name"),
                );
            }
        }
        out.entry(k).or_default().extend(r.names.iter().cloned());
    }
    out
}

/// The apiVersion, a DNS name, kinds that name something, and a target
/// the policy does not also own.
fn check_header(cx: &mut Ctx, file: &str, node: &Node, doc: &PolicyDoc) {
    if doc.api_version != API_VERSION {
        let m = format!("apiVersion: want {API_VERSION}");
        cx.error(file, pos_at(node, &["apiVersion"]), m);
    }
    let name = &doc.metadata.name;
    if !crate::names::is_dns_subdomain(name) {
        let m = format!(
            "metadata.name {name:?} must be a DNS subdomain (lowercase letters, digits, '-', '.')"
        );
        cx.error(file, pos_at(node, &["metadata", "name"]), m);
    }
    let spec = &doc.spec;
    let owns = spec.owned_kinds();
    for (key, k) in std::iter::once(("target", &spec.target))
        .chain(owns.iter().map(|k| ("owns", k)))
        .chain(spec.reads.iter().map(|k| ("reads", k)))
        .chain(spec.mutates.iter().map(|k| ("mutates", k)))
    {
        if k.kind.is_empty() || k.api_version.is_empty() {
            let m = format!("spec.{key}: apiVersion and kind must not be empty");
            cx.error(file, pos_at(node, &["spec", key]), m);
        }
    }
    // Its children would be its targets; in other namespaces they are
    // not (`selects` leaves them out), so a copier may own its kind.
    if owns.contains(&spec.target) && spec.namespaces.is_none() {
        let m = "spec.owns: a policy cannot own its own target kind (except one that makes its children in other namespaces: spec.namespaces)";
        cx.error(file, pos_at(node, &["spec", "owns"]), m);
    }
}

/// `spec.namespaces`: its selector, and what a policy that writes in
/// other namespaces must have: a script with `fn finalize`, as nothing
/// collects such children with their target.
fn other_namespaces(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    spec: &PolicySpec,
    body: Option<&Body>,
) -> Option<(Selector, Option<Pos>)> {
    let declared = spec.namespaces.as_ref()?;
    let pos = pos_at(node, &["spec", "namespaces"]);
    let selector = label_selector(
        cx,
        file,
        node,
        "namespaces.selector",
        Some(&declared.selector),
    );
    let finalizes = matches!(
        body,
        Some(Body::Script {
            has_finalize: true,
            ..
        })
    );
    if body.is_some() && !finalizes {
        cx.error(
            file,
            pos,
            "spec.namespaces: a policy that makes children in other namespaces needs a script with fn finalize(ctx) that removes them (ctx.sync_children([])): no ownerReference can cross namespaces, so nothing collects them with their target",
        );
    }
    Some((selector, pos))
}

/// Each kind the policy declares, with where and at what position.
/// Every kind the policy declares, by role.
fn declared_kinds(spec: &PolicySpec) -> DeclaredKinds {
    let namespace = KindRef::new("v1", "Namespace");
    // A policy that writes in other namespaces reads their labels.
    let reads_namespaces = spec.namespaces.is_some() && !spec.reads.contains(&namespace);
    let mut reads = spec.reads.clone();
    reads.extend(spec.reads_by_name.iter().map(|r| r.kind_ref()));
    if reads_namespaces {
        reads.push(namespace);
    }
    DeclaredKinds::new(&spec.target, &spec.owned_kinds(), &reads, &spec.mutates)
        .with_deletes(spec.deletes.iter().map(|d| d.kind_ref()))
}

fn kind_places(
    node: &Node,
    spec: &PolicySpec,
) -> Vec<(String, crate::kinds::KindRef, Option<Pos>)> {
    let mut out = vec![(
        "spec.target".to_string(),
        spec.target.clone(),
        pos_at(node, &["spec", "target"]),
    )];
    let deletes: Vec<crate::kinds::KindRef> = spec.deletes.iter().map(|d| d.kind_ref()).collect();
    let owns = spec.owned_kinds();
    for (key, list) in [
        ("owns", &owns),
        ("reads", &spec.reads),
        ("mutates", &spec.mutates),
        ("deletes", &deletes),
    ] {
        let items: Vec<Pos> = match node.at(&["spec", key]).map(|n| &n.value) {
            Some(crate::util::yaml::NodeValue::Seq(items)) => items.iter().map(|n| n.pos).collect(),
            _ => Vec::new(),
        };
        for (i, k) in list.iter().enumerate() {
            let pos = items.get(i).copied().or(pos_at(node, &["spec", key]));
            out.push((format!("spec.{key}[{i}]"), k.clone(), pos));
        }
    }
    out
}

/// A script body: the script in this bundle, defining `reconcile`; what
/// goes with steps only is refused.
fn script_body(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    spec: &PolicySpec,
    script: &str,
    used: &mut BTreeSet<String>,
) -> Option<Body> {
    used.insert(script.to_string());
    let steps_only = [
        (
            !spec.on_failure.is_empty(),
            "onFailure",
            "spec.onFailure goes with steps; a script handles its own failures",
        ),
        (
            spec.retention.is_some(),
            "retention",
            "spec.retention goes with steps; a script deletes its own old children",
        ),
        (
            spec.functions.is_some(),
            "functions",
            "spec.functions goes with steps; a script defines its own functions",
        ),
    ];
    for (given, key, message) in steps_only {
        if given {
            cx.error(file, pos_at(node, &["spec", key]), message);
        }
    }
    if !cx.bundle.files.contains_key(script) {
        let m = format!("spec.script: {script:?} is not in this bundle");
        cx.error(file, pos_at(node, &["spec", "script"]), m);
        return None;
    }
    let s = cx.script(script)?;
    if !s.has_fn("reconcile") {
        let m = "the script defines no fn reconcile(ctx)";
        cx.error(script, Some(Pos { line: 1, col: 1 }), m);
        return None;
    }
    // The functions Runbook calls take `ctx`, and nothing else.
    for hook in ["reconcile", "finalize", "deleted"] {
        let arities = s.arities(hook);
        if !arities.is_empty() && !arities.contains(&1) {
            let n = arities[0];
            let m = format!(
                "fn {hook} takes one argument, ctx (fn {hook}(ctx)); it is defined with {n}"
            );
            cx.error(script, s.fn_pos(hook).or(Some(Pos { line: 1, col: 1 })), m);
        }
    }
    for (name, pos, near) in cx.engine.unknown_calls(&s, None) {
        let hint = near
            .map(|m| format!(" (did you mean {m}?)"))
            .unwrap_or_default();
        let m = format!(
            "no function {name} exists: the script defines none, and it is not a helper or an action{hint}"
        );
        cx.error(script, Some(pos), m);
    }
    for (name, pos, near) in cx.engine.unknown_ctx_properties(&s) {
        let hint = near
            .map(|m| format!(" (did you mean ctx.{m}?)"))
            .unwrap_or_default();
        let m = format!(
            "ctx has no property {name}{hint}: it has {}",
            crate::script::ctx::PROPERTIES.join(", ")
        );
        cx.error(script, Some(pos), m);
    }
    let text = cx.bundle.files[script].clone();
    let kinds = declared_kinds(spec);
    for (name, pos) in super::pieces::literal_kinds(&text) {
        if let Err(e) = kinds.resolve(&crate::kinds::KindName::parse(&name)) {
            let declared: Vec<&str> = kinds.kinds().into_iter().map(|k| k.kind.as_str()).collect();
            let hint = crate::util::suggest::closest(&name, declared.iter().copied())
                .map(|m| format!(" (did you mean {m:?}?)"))
                .unwrap_or_default();
            cx.error(script, Some(pos), format!("{e}{hint}"));
        }
    }
    Some(Body::Script {
        has_finalize: s.has_fn("finalize"),
        source: cx.bundle.files[script].as_str().into(),
        script: s,
    })
}

/// A steps body: the steps, their compensation (which runs once and does
/// not wait), and the retention of old runs.
fn steps_body(
    cx: &mut Ctx,
    file: &str,
    source: &str,
    node: &Node,
    spec: &PolicySpec,
    kinds: &DeclaredKinds,
    used: &mut BTreeSet<String>,
) -> Option<Body> {
    let functions: Option<Arc<Script>> = match &spec.functions {
        None => None,
        Some(f) if !cx.bundle.files.contains_key(f) => {
            let m = format!("spec.functions: {f:?} is not in this bundle");
            cx.error(file, pos_at(node, &["spec", "functions"]), m);
            None
        }
        Some(f) => {
            used.insert(f.clone());
            cx.script(f)
        }
    };
    let mut sx = StepCx {
        file,
        source,
        kinds,
        used,
        functions: functions.as_ref().map(|s| &s.ast),
    };
    let mut all_ok = true;
    let mut names = BTreeSet::new();
    let mut steps = Vec::new();
    let nodes = step_nodes(node, "steps");
    for (i, step) in spec.steps.iter().enumerate() {
        let n = nodes.get(i).copied().unwrap_or(node);
        if !names.insert(step.name.clone()) {
            let m = format!("step name {:?} is used twice", step.name);
            cx.error(file, Some(n.pos), m);
            all_ok = false;
        }
        match compile_step(cx, &mut sx, n, step) {
            Some(s) => steps.push(s),
            None => all_ok = false,
        }
    }
    let mut on_failure = Vec::new();
    let nodes = step_nodes(node, "onFailure");
    for (i, step) in spec.on_failure.iter().enumerate() {
        let n = nodes.get(i).copied().unwrap_or(node);
        if step.ready_when.is_some() || step.failed_when.is_some() || step.timeout.is_some() {
            let m = format!(
                "onFailure step {}: compensation runs once and does not wait; drop readyWhen, failedWhen and timeout",
                step.name
            );
            cx.error(file, Some(n.pos), m);
            all_ok = false;
        }
        match compile_step(cx, &mut sx, n, step) {
            Some(s) => on_failure.push(s),
            None => all_ok = false,
        }
    }
    let retention = match &spec.retention {
        None => None,
        Some(r) => match template(cx, file, source, &r.keep, sx.functions) {
            Some(keep) => Some(CompiledRetention {
                keep,
                label: r.label.clone(),
            }),
            None => {
                all_ok = false;
                None
            }
        },
    };
    all_ok.then_some(Body::Steps {
        steps,
        on_failure,
        retention,
    })
}

/// `spec.params`, a map (empty when absent).
fn params_of(cx: &mut Ctx, file: &str, node: &Node, spec: &PolicySpec) -> Value {
    let params = spec
        .params
        .as_ref()
        .map(Node::to_json)
        .unwrap_or(Value::Object(Default::default()));
    if !params.is_object() {
        let m = "spec.params must be a map";
        cx.error(file, pos_at(node, &["spec", "params"]), m);
    }
    params
}

/// A LabelSelector at `spec.<field>` (none: everything).
fn label_selector(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    field: &str,
    sel: Option<&crate::policy::model::LabelSelectorSpec>,
) -> Selector {
    match sel {
        Some(sel) => selector_of(
            cx,
            file,
            node,
            (field, "matchLabels"),
            &sel.match_labels,
            &sel.match_expressions,
        ),
        None => Selector::default(),
    }
}

/// `spec.selector` (a LabelSelector: its keys and values as labels
/// allow) or `spec.annotationSelector` (its keys as annotations allow, any
/// value): each expression's operator and values as the API server wants
/// them. `names` is the field and the name of its map of pairs.
fn selector_of(
    cx: &mut Ctx,
    file: &str,
    node: &Node,
    names: (&str, &str),
    pairs: &std::collections::BTreeMap<String, String>,
    expressions: &[crate::policy::model::LabelExpression],
) -> Selector {
    use crate::labels::Requirement;
    let (field, map) = names;
    let labels = map == "matchLabels";
    let check_value = |v: &str| {
        if labels {
            crate::labels::check_value(v)
        } else {
            Ok(())
        }
    };
    let mut reqs: Vec<Requirement> = Vec::new();
    let at = |path: &[&str]| pos_at(node, &[&["spec", field][..], path].concat());
    for (k, v) in pairs {
        match crate::labels::check_key(k).and_then(|_| check_value(v)) {
            Ok(()) => reqs.push(Requirement::Eq(k.clone(), v.clone())),
            Err(e) => cx.error(file, at(&[map]), format!("spec.{field}.{map}: {e}")),
        }
    }
    let items: Vec<Option<crate::util::yaml::Pos>> = match node
        .at(&["spec", field, "matchExpressions"])
        .map(|n| &n.value)
    {
        Some(crate::util::yaml::NodeValue::Seq(items)) => {
            items.iter().map(|n| Some(n.pos)).collect()
        }
        _ => Vec::new(),
    };
    for (i, e) in expressions.iter().enumerate() {
        let pos = items
            .get(i)
            .copied()
            .flatten()
            .or(at(&["matchExpressions"]));
        let checked = crate::labels::check_key(&e.key)
            .and_then(|_| e.values.iter().try_for_each(|v| check_value(v)));
        let req = checked.and_then(|_| match (e.operator.as_str(), e.values.is_empty()) {
            ("In", false) => Ok(Requirement::In(e.key.clone(), e.values.clone())),
            ("NotIn", false) => Ok(Requirement::NotIn(e.key.clone(), e.values.clone())),
            ("Exists", true) => Ok(Requirement::Exists(e.key.clone())),
            ("DoesNotExist", true) => Ok(Requirement::NotExists(e.key.clone())),
            ("In" | "NotIn", true) => Err(format!("operator {} needs values", e.operator)),
            ("Exists" | "DoesNotExist", false) => {
                Err(format!("operator {} takes no values", e.operator))
            }
            (op, _) => Err(format!(
                "operator {op:?} is not one of In, NotIn, Exists, DoesNotExist"
            )),
        });
        match req {
            Ok(r) => reqs.push(r),
            Err(m) => cx.error(
                file,
                pos,
                format!("spec.{field}.matchExpressions[{i}]: {m}"),
            ),
        }
    }
    Selector(reqs)
}

/// The version covers every file the policy uses, so editing a script or
/// template changes it as surely as editing the policy.
fn version_of(cx: &Ctx, file: &str, text: &str, used: &BTreeSet<String>) -> String {
    let mut hashed = String::from(text);
    for f in used.iter().filter(|f| *f != file) {
        hashed.push('\u{0}');
        hashed.push_str(f);
        hashed.push('\u{0}');
        hashed.push_str(cx.bundle.files.get(f).map(String::as_str).unwrap_or(""));
    }
    short_hex(hashed.as_bytes(), 12)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_previous_path_is_dotted_fields() {
        assert!(super::check_path("spec.replicas").is_ok());
        assert!(super::check_path("metadata.labels").is_ok());
        for bad in ["", ".spec", "spec.", "spec..x"] {
            assert!(super::check_path(bad).is_err(), "{bad:?}");
        }
    }
    use crate::policy::compile::tests::{errors_in, errors_of, load};

    const HEAD: &str = "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: p}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n";

    /// A sweep needs a schedule of its own and takes nothing that
    /// belongs to one target, each refused where it is written.
    #[test]
    fn a_sweep_takes_a_schedule_and_nothing_of_one_target() {
        let sweep = format!("{HEAD}  sweep: true\n  script: p.rhai\n");
        assert_eq!(
            errors_of(&sweep),
            [
                "p.yaml:6:10: spec.sweep: a sweep decides at its schedule's fire times; give spec.schedule (cron or every)"
            ]
        );
        let fine = format!("{sweep}  schedule: {{every: 1m}}\n");
        assert!(errors_of(&fine).is_empty(), "{:?}", errors_of(&fine));
        let per_target = format!(
            "{sweep}  schedule: {{fromField: spec.when}}\n  owns: [{{apiVersion: v1, kind: Secret}}]\n  previous: [spec]\n"
        );
        let errors = errors_of(&per_target);
        for want in [
            "p.yaml:8:13: spec.schedule.fromField: a sweep has no one target",
            "p.yaml:9:9: spec.owns: a sweep makes no children",
            "p.yaml:10:13: spec.previous: a sweep keeps no values per target",
        ] {
            assert!(
                errors.iter().any(|e| e.starts_with(want)),
                "{want}: {errors:?}"
            );
        }
        let hooks = errors_in(&[
            ("p.yaml", &fine),
            (
                "p.rhai",
                "fn reconcile(ctx) { [] }\nfn deleted(ctx) { [] }\nfn finalize(ctx) { [] }",
            ),
        ]);
        assert_eq!(hooks.len(), 2, "{hooks:?}");
        assert!(
            hooks.iter().all(|e| e.contains("a sweep holds no target")),
            "{hooks:?}"
        );
    }

    #[test]
    fn the_header_names_what_is_wrong_where() {
        let text = "apiVersion: runbook.dev/v1\nkind: Policy\nmetadata: {name: My_Policy}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  owns: [{apiVersion: v1, kind: ConfigMap}]\n  script: p.rhai\n";
        let errors = errors_of(text);
        assert!(
            errors
                .iter()
                .any(|e| e == "p.yaml:1:13: apiVersion: want runbook.dev/v1alpha1"),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e
                .starts_with("p.yaml:3:18: metadata.name \"My_Policy\" must be a DNS subdomain")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("spec.owns: a policy cannot own its own target kind")),
            "{errors:?}"
        );
    }

    #[test]
    fn a_policy_has_a_script_or_steps_and_what_goes_with_each() {
        assert_eq!(
            errors_of(HEAD),
            ["p.yaml:5:3: spec: give a script or steps"]
        );
        let both =
            format!("{HEAD}  script: p.rhai\n  steps: [{{name: a, status: {{phase: x}}}}]\n");
        assert!(errors_of(&both)[0].ends_with("spec: give script or steps, not both"));
        let extras =
            format!("{HEAD}  script: p.rhai\n  functions: f.rhai\n  retention: {{keep: 3}}\n");
        let errors = errors_of(&extras);
        assert!(
            errors
                .iter()
                .any(|e| e.contains("spec.functions goes with steps")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("spec.retention goes with steps")),
            "{errors:?}"
        );
        let missing = format!("{HEAD}  script: gone.rhai\n");
        assert!(
            errors_of(&missing)[0].ends_with("spec.script: \"gone.rhai\" is not in this bundle")
        );
        let no_reconcile = format!("{HEAD}  script: q.rhai\n");
        let errors = errors_in(&[
            ("p.yaml", &no_reconcile),
            ("q.rhai", "fn other(ctx) { [] }"),
        ]);
        assert_eq!(
            errors,
            ["q.rhai:1:1: the script defines no fn reconcile(ctx)"]
        );
    }

    #[test]
    fn the_version_changes_with_every_file_the_policy_uses() {
        let policy = format!("{HEAD}  script: p.rhai\n");
        let one = load(&[("p.yaml", &policy), ("p.rhai", "fn reconcile(ctx) { [] }")]);
        let two = load(&[("p.yaml", &policy), ("p.rhai", "fn reconcile(ctx) { [ ] }")]);
        let unrelated = load(&[
            ("p.yaml", &policy),
            ("p.rhai", "fn reconcile(ctx) { [] }"),
            ("other.rhai", "fn x() { 1 }"),
        ]);
        assert_ne!(one.policies[0].version, two.policies[0].version);
        assert_eq!(one.policies[0].version, unrelated.policies[0].version);
    }

    #[test]
    fn steps_are_named_once_and_compensation_does_not_wait() {
        let steps = format!(
            "{HEAD}  steps:\n    - {{name: a, status: {{phase: x}}}}\n    - {{name: a, status: {{phase: y}}}}\n  onFailure:\n    - {{name: undo, status: {{phase: z}}, timeout: 5m}}\n"
        );
        let errors = errors_of(&steps);
        assert!(
            errors
                .iter()
                .any(|e| e == "p.yaml:8:7: step name \"a\" is used twice"),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("onFailure step undo: compensation runs once")),
            "{errors:?}"
        );
    }

    #[test]
    fn an_annotation_selector_takes_any_value_and_checks_its_keys() {
        let good = format!(
            "{HEAD}  script: p.rhai\n  annotationSelector:\n    matchAnnotations: {{example.com/note: 'any text, spaces and all'}}\n    matchExpressions: [{{key: example.com/opt, operator: Exists}}]\n"
        );
        let loaded = load(&[("p.yaml", &good), ("p.rhai", "fn reconcile(ctx) { [] }")]);
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        let p = &loaded.policies[0];
        let both = serde_json::json!({"metadata": {"annotations": {
            "example.com/note": "any text, spaces and all", "example.com/opt": ""}}});
        let one = serde_json::json!({"metadata": {"annotations": {"example.com/opt": "x"},
            "labels": {"example.com/note": "any text, spaces and all"}}});
        assert!(p.selects(&both));
        assert!(!p.selects(&one), "labels are not annotations");
        let bad = format!(
            "{HEAD}  script: p.rhai\n  annotationSelector:\n    matchExpressions: [{{key: 'bad key!', operator: Exists}}]\n"
        );
        let errors = errors_of(&bad);
        assert!(
            errors.iter().any(
                |e| e.starts_with("p.yaml:8:24: spec.annotationSelector.matchExpressions[0]: ")
            ),
            "{errors:?}"
        );
    }

    /// `spec.deletes` selectors are label selectors: their values are
    /// checked as labels are.
    #[test]
    fn a_deletes_selector_checks_label_values() {
        let text = format!(
            "{HEAD}  script: p.rhai\n  deletes:\n    - {{apiVersion: v1, kind: Pod, selector: {{matchLabels: {{tier: 'not a label value!'}}}}}}\n"
        );
        let errors = errors_of(&text);
        assert!(
            errors
                .iter()
                .any(|e| e.contains("spec.deletes[0].selector.matchLabels: ")),
            "{errors:?}"
        );
    }

    #[test]
    fn params_must_be_a_map_and_selector_labels_valid() {
        let text = format!(
            "{HEAD}  script: p.rhai\n  params: [1, 2]\n  selector: {{matchLabels: {{'bad key!': x}}}}\n"
        );
        let errors = errors_of(&text);
        assert!(
            errors
                .iter()
                .any(|e| e.ends_with("spec.params must be a map")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("spec.selector.matchLabels: ")),
            "{errors:?}"
        );
    }
}
