//! `runbook simulate --html FILE`: one self-contained HTML page of a run.
//! Per target, a chart of each numeric status field over the simulated
//! time (a step line: a value holds until the next write), the target's
//! numeric spec fields that fall in the chart's range as dashed reference
//! lines (an Evaluator's `threshold`), `status.phase` as coloured bands,
//! and markers for its rollbacks, alerts, resolutions and Events; below,
//! every action on a lane of its own. Hovering any point, marker or action
//! shows its details. Axes, grid and lines are drawn by `plotters`; the
//! markers are SVG elements placed with the chart's own coordinate mapping,
//! so each carries a class (`marker rollback`) and a `<title>`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use super::report::{Report, offset};
use runbook_operator::telemetry::journal::Entry;

const WIDTH: u32 = 1100;
const PANEL_HEIGHT: u32 = 230;
const PHASE_HEIGHT: u32 = 110;
const LEFT: u32 = 70;
const PHASES: [(&str, RGBColor); 10] = [
    ("Healthy", RGBColor(46, 160, 67)),
    ("Ready", RGBColor(46, 160, 67)),
    ("Succeeded", RGBColor(46, 160, 67)),
    ("Completed", RGBColor(46, 160, 67)),
    ("Running", RGBColor(56, 132, 230)),
    ("Progressing", RGBColor(56, 132, 230)),
    ("Pending", RGBColor(150, 150, 150)),
    ("RolledBack", RGBColor(214, 60, 50)),
    ("Failed", RGBColor(214, 60, 50)),
    ("Degraded", RGBColor(230, 140, 20)),
];
/// Colours of phases not named above, in order of first appearance.
const MORE: [RGBColor; 4] = [
    RGBColor(140, 90, 200),
    RGBColor(20, 160, 160),
    RGBColor(190, 120, 60),
    RGBColor(200, 80, 150),
];
const LINE: RGBColor = RGBColor(30, 60, 140);
const REFERENCE: RGBColor = RGBColor(214, 60, 50);

/// What the page is drawn from: a run's entries, as times in the unit of
/// the x axis.
struct Frame<'a> {
    report: &'a Report,
    /// Milliseconds per x unit (an hour, or a minute for short runs).
    unit_ms: f64,
    unit: &'static str,
    end: f64,
}

impl Frame<'_> {
    fn x(&self, e: &Entry) -> f64 {
        (e.time.as_millisecond() - self.report.start.as_millisecond()) as f64 / self.unit_ms
    }

    fn label(&self, x: f64) -> String {
        format!("+{}{}", trim(x), self.unit)
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

/// A target: an object the operator wrote status to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
}

impl Target {
    fn of(e: &Entry) -> Target {
        Target {
            api_version: e.api_version.clone(),
            kind: e.kind.clone(),
            namespace: e.namespace.clone(),
            name: e.name.clone(),
        }
    }

    fn shown(&self) -> String {
        match self.namespace.is_empty() {
            true => format!("{} {}", self.kind, self.name),
            false => format!("{} {}/{}", self.kind, self.namespace, self.name),
        }
    }

    fn key(&self) -> String {
        format!(
            "{}|{}|{}|{}",
            self.api_version, self.kind, self.namespace, self.name
        )
    }
}

/// Each target's status after every write that landed.
fn statuses(report: &Report) -> BTreeMap<Target, Vec<(usize, Value)>> {
    let mut out: BTreeMap<Target, Vec<(usize, Value)>> = BTreeMap::new();
    for (i, e) in report.entries.iter().enumerate() {
        if e.action != "status" || e.result != "ok" {
            continue;
        }
        let history = out.entry(Target::of(e)).or_default();
        let mut now = history
            .last()
            .map_or_else(|| Value::Object(Default::default()), |(_, v)| v.clone());
        // RFC 7386, as the status writes are merged.
        json_patch::merge(&mut now, &e.fields);
        history.push((i, now));
    }
    out
}

/// The numbers the operator's patches set on objects it does not own (a
/// Deployment's `spec.replicas` a schedule scales): per object, per
/// field path, each value with the entry that set it.
fn patched(report: &Report) -> BTreeMap<Target, BTreeMap<String, Vec<(usize, f64)>>> {
    fn leaves(v: &Value, path: &str, out: &mut Vec<(String, f64)>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "metadata" && path.is_empty() {
                        continue;
                    }
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(x, &p, out);
                }
            }
            Value::Number(n) => out.extend(n.as_f64().map(|f| (path.to_string(), f))),
            _ => {}
        }
    }
    let mut out: BTreeMap<Target, BTreeMap<String, Vec<(usize, f64)>>> = BTreeMap::new();
    for (i, e) in report.entries.iter().enumerate() {
        if e.action != "patch" || e.result != "ok" {
            continue;
        }
        let mut found = Vec::new();
        leaves(&e.fields, "", &mut found);
        for (path, value) in found {
            out.entry(Target::of(e))
                .or_default()
                .entry(path)
                .or_default()
                .push((i, value));
        }
    }
    out
}

/// The policies that wrote each target's status: an action of such a
/// policy on another object in the namespace belongs to the target when
/// it is the only one the policy wrote there.
fn sole_target_of(report: &Report, targets: &[Target]) -> BTreeMap<(String, String), Target> {
    let mut seen: BTreeMap<(String, String), Vec<&Target>> = BTreeMap::new();
    for e in &report.entries {
        if e.action == "status" && !e.policy.is_empty() {
            let t = targets.iter().find(|t| **t == Target::of(e));
            if let Some(t) = t {
                let v = seen
                    .entry((e.policy.clone(), e.namespace.clone()))
                    .or_default();
                if !v.contains(&t) {
                    v.push(t);
                }
            }
        }
    }
    seen.into_iter()
        .filter(|(_, v)| v.len() == 1)
        .map(|(k, v)| (k, v[0].clone()))
        .collect()
}

/// The numbers of a status worth a line: top-level, not bookkeeping.
fn numeric_fields(history: &[(usize, Value)]) -> Vec<String> {
    let mut fields: Vec<(bool, String)> = Vec::new();
    for (_, s) in history {
        let Some(m) = s.as_object() else { continue };
        for (k, v) in m {
            if k == "observedGeneration" || !v.is_number() {
                continue;
            }
            let fractional = v.as_f64().is_some_and(|f| f.fract() != 0.0);
            match fields.iter_mut().find(|(_, n)| n == k) {
                Some(f) => f.0 |= fractional,
                None => fields.push((fractional, k.clone())),
            }
        }
    }
    // Scores (fractions) first, counters and revisions after.
    fields.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    fields.into_iter().map(|(_, n)| n).collect()
}

fn phase_colour(phase: &str, others: &mut Vec<String>) -> RGBColor {
    if let Some((_, c)) = PHASES.iter().find(|(p, _)| *p == phase) {
        return *c;
    }
    let i = match others.iter().position(|p| p == phase) {
        Some(i) => i,
        None => {
            others.push(phase.to_string());
            others.len() - 1
        }
    };
    MORE[i % MORE.len()]
}

/// `phase` over time: (from, to, phase).
fn phase_bands(frame: &Frame, history: &[(usize, Value)]) -> Vec<(f64, f64, String)> {
    let mut bands: Vec<(f64, f64, String)> = Vec::new();
    for (i, s) in history {
        let Some(p) = s["phase"].as_str() else {
            continue;
        };
        let x = frame.x(&frame.report.entries[*i]);
        match bands.last_mut() {
            Some(last) if last.2 == p => {}
            Some(last) => {
                last.1 = x;
                bands.push((x, frame.end, p.to_string()));
            }
            None => bands.push((x, frame.end, p.to_string())),
        }
    }
    bands
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn colour(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// What a marker on a target's chart shows, by action.
fn marker_kind(e: &Entry) -> Option<(&'static str, RGBColor)> {
    match e.action.as_str() {
        "rollback" => Some(("rollback", RGBColor(214, 60, 50))),
        "alert" => Some(("alert", RGBColor(230, 140, 20))),
        "resolve" => Some(("resolve", RGBColor(46, 160, 67))),
        "event" => Some(("event", RGBColor(110, 110, 110))),
        "refusal" | "error" => Some(("problem", RGBColor(140, 30, 30))),
        _ => None,
    }
}

/// Where the markers are, when they gather in a small part of the run:
/// that part and some hours (or minutes) either side.
fn close_up(frame: &Frame, markers: &[&Entry]) -> Option<(f64, f64)> {
    let xs: Vec<f64> = markers.iter().map(|e| frame.x(e)).collect();
    let first = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let last = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if xs.is_empty() || last - first > frame.end * 0.3 {
        return None;
    }
    let margin = ((last - first) * 0.5).max(frame.end * 0.02).max(1.0);
    let (from, to) = ((first - margin).max(0.0), (last + margin).min(frame.end));
    (to - from < frame.end * 0.5).then_some((from, to))
}

/// Which marker is drawn on top at one instant (the highest).
fn marker_rank(e: &Entry) -> u8 {
    match e.action.as_str() {
        "rollback" => 0,
        "refusal" | "error" => 1,
        "alert" => 2,
        "resolve" => 3,
        _ => 4,
    }
}

/// The hover text of an entry: its timeline line, and what it wrote.
fn hover(report: &Report, e: &Entry) -> String {
    let mut t = report.line(e).trim().to_string();
    if !e.policy.is_empty() {
        let _ = write!(t, "\npolicy {}", e.policy);
    }
    if e.result != "ok" {
        let _ = write!(t, "\nresult {}", e.result);
    }
    if !e.fields.is_null() && e.action != "apply" {
        let f = e.fields.to_string();
        let f: String = f.chars().take(600).collect();
        let _ = write!(t, "\n{f}");
    }
    t
}

/// An action's hover text on the lane: its line, its policy and result.
fn lane_hover(report: &Report, e: &Entry) -> String {
    let mut t = report.line(e).trim().to_string();
    if !e.policy.is_empty() {
        let _ = write!(t, "\npolicy {}", e.policy);
    }
    t
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A panel's chart: time across, a status number up.
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One chart: a numeric status field over time, bands, references,
/// markers. Returns the SVG.
struct Panel<'a> {
    frame: &'a Frame<'a>,
    field: &'a str,
    points: Vec<(f64, f64, usize)>,
    references: Vec<(String, f64)>,
    bands: &'a [(f64, f64, String)],
    markers: &'a [&'a Entry],
    /// The x range shown: the whole run, or a close-up.
    from: f64,
    to: f64,
    caption: String,
}

/// The y range a panel shows (its values and references, padded) and its
/// height; with no number to draw (phases alone), a band lane.
fn y_range(p: &Panel) -> (f64, f64, u32, bool) {
    let mut lo = p.points.iter().map(|q| q.1).fold(f64::INFINITY, f64::min);
    let mut hi = p
        .points
        .iter()
        .map(|q| q.1)
        .fold(f64::NEG_INFINITY, f64::max);
    for (_, v) in &p.references {
        lo = lo.min(*v);
        hi = hi.max(*v);
    }
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0, PHASE_HEIGHT, true);
    }
    let pad = ((hi - lo) * 0.15).max(0.05 * hi.abs().max(1.0));
    (lo - pad, hi + pad, PANEL_HEIGHT, false)
}

/// A step line through a panel's values: each value holds until the next
/// write (a close-up starts from the value its first instant holds).
fn step_line(p: &Panel) -> Vec<(f64, f64)> {
    let mut steps: Vec<(f64, f64)> = Vec::new();
    let mut held: Option<f64> = None;
    for (x, y, _) in &p.points {
        if *x < p.from {
            held = Some(*y);
            continue;
        }
        if *x > p.to {
            break;
        }
        match (held, steps.is_empty()) {
            (Some(h), true) => steps.extend([(p.from, h), (*x, h)]),
            (Some(h), false) => steps.push((*x, h)),
            (None, _) => {}
        }
        steps.push((*x, *y));
        held = Some(*y);
    }
    if let Some(h) = held {
        if steps.is_empty() {
            steps.push((p.from, h));
        }
        steps.push((p.to, h));
    }
    steps
}

/// A point where the value changed, with what was written (`at`: where a
/// value is drawn).
fn value_points(p: &Panel, at: impl Fn(f64, f64) -> (i32, i32), overlay: &mut String) {
    let frame = p.frame;
    let mut last: Option<f64> = None;
    for (x, y, i) in &p.points {
        if last == Some(*y) {
            continue;
        }
        last = Some(*y);
        if !(p.from..=p.to).contains(x) {
            continue;
        }
        let (px, py) = at(*x, *y);
        // A point of the world's (a metric series) has no entry.
        let told = match frame.report.entries.get(*i) {
            Some(e) => hover(frame.report, e),
            None => format!("from the world's series at {}", frame.label(*x)),
        };
        let _ = write!(
            overlay,
            r#"<circle class="point" cx="{px}" cy="{py}" r="4" fill="{}"><title>{} = {}&#10;{}</title></circle>"#,
            colour(LINE),
            esc(p.field),
            trim_y(*y),
            esc(&told)
        );
    }
}

/// The markers (rollbacks, alerts, ...): those at one instant stand side
/// by side, the rollback (drawn last, so on top) at the line itself.
fn markers(p: &Panel, at: impl Fn(f64, f64) -> (i32, i32), lo: f64, hi: f64, overlay: &mut String) {
    let frame = p.frame;
    let mut markers: Vec<&&Entry> = p.markers.iter().collect();
    markers.sort_by_key(|e| (e.time, marker_rank(e)));
    markers.retain(|e| (p.from..=p.to).contains(&frame.x(e)));
    let mut beside: BTreeMap<i32, i32> = BTreeMap::new();
    for e in markers {
        let Some((class, c)) = marker_kind(e) else {
            continue;
        };
        let x = frame.x(e);
        let (line_x, top) = at(x, hi);
        let (_, bottom) = at(x, lo);
        let n = beside.entry(line_x).or_insert(0);
        let px = line_x + 15 * *n;
        *n += 1;
        let _ = write!(
            overlay,
            r#"<g class="marker {class}" data-at="{}"><title>{}</title><line x1="{line_x}" y1="{top}" x2="{line_x}" y2="{bottom}" stroke="{col}" stroke-width="2" stroke-dasharray="3 2"/><path d="M{} {} l14 0 l-7 12 z" fill="{col}"/></g>"#,
            esc(&offset(
                e.time.as_millisecond() - frame.report.start.as_millisecond()
            )),
            esc(&hover(frame.report, e)),
            px - 7,
            top - 13,
            col = colour(c),
        );
    }
}

/// A panel's phases as bands (named on a band lane, where they fit).
fn draw_bands(
    chart: &mut Chart,
    p: &Panel,
    lo: f64,
    hi: f64,
    phases_only: bool,
    others: &mut Vec<String>,
    overlay: &mut String,
) -> Result<(), String> {
    for (from, to, phase) in p.bands {
        let c = phase_colour(phase, others);
        let (from, to) = (from.max(p.from), to.min(p.to));
        if from >= to {
            continue;
        }
        let (left, mid) = chart.backend_coord(&(from, 0.5));
        let (right, _) = chart.backend_coord(&(to, 0.5));
        if phases_only && right - left > 8 * phase.len() as i32 {
            let _ = write!(
                overlay,
                r#"<text class="phase" x="{}" y="{}" font-size="12" fill="{}">{}</text>"#,
                left + 4,
                mid + 4,
                colour(c),
                esc(phase)
            );
        }
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(from, lo), (to, hi)],
                c.mix(0.13).filled(),
            )))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A panel's references (spec numbers) as dashed lines, named.
fn draw_references(chart: &mut Chart, p: &Panel, overlay: &mut String) -> Result<(), String> {
    for (name, v) in &p.references {
        chart
            .draw_series(DashedLineSeries::new(
                [(p.from, *v), (p.to, *v)],
                6,
                4,
                REFERENCE.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?
            .label(name.clone());
        let (x, y) = chart.backend_coord(&(p.to, *v));
        let _ = write!(
            overlay,
            r#"<text class="reference" x="{}" y="{}" text-anchor="end" font-size="12" fill="{}">{} {}</text>"#,
            x - 4,
            y - 4,
            colour(REFERENCE),
            esc(name),
            trim_y(*v)
        );
    }
    Ok(())
}

fn draw_panel(p: &Panel, others: &mut Vec<String>) -> Result<String, String> {
    let frame = p.frame;
    let (lo, hi, height, phases_only) = y_range(p);
    let whole = p
        .points
        .iter()
        .map(|q| q.1)
        .chain(p.references.iter().map(|r| r.1))
        .all(|v| v.fract() == 0.0);
    let mut svg = String::new();
    let mut overlay = String::new();
    {
        let root: Area = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(26)
            .margin_right(20)
            .x_label_area_size(28)
            .y_label_area_size(LEFT)
            .build_cartesian_2d(p.from..p.to, lo..hi)
            .map_err(|e| e.to_string())?;
        draw_bands(&mut chart, p, lo, hi, phases_only, others, &mut overlay)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 12))
            .light_line_style(RGBColor(235, 235, 235))
            .x_labels(14)
            .x_label_formatter(&|x| frame.label(*x))
            .y_labels(if phases_only { 0 } else { 10 })
            // Whole numbers (revisions, replicas) get whole ticks only.
            .y_label_formatter(&|y| match whole && y.fract().abs() > 1e-9 {
                true => String::new(),
                false => trim_y(*y),
            })
            .draw()
            .map_err(|e| e.to_string())?;
        draw_references(&mut chart, p, &mut overlay)?;
        chart
            .draw_series(LineSeries::new(step_line(p), LINE.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        let at = |x: f64, y: f64| chart.backend_coord(&(x, y));
        value_points(p, at, &mut overlay);
        markers(p, at, lo, hi, &mut overlay);
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(format!(
        "<h3 class=\"panel\">{}</h3>\n{}",
        esc(&p.caption),
        with_overlay(svg, &overlay)
    ))
}

/// A panel over the whole run into `body`, and over the close-up (when
/// there is one) into `close_ups`.
fn draw_with_close_up(
    panel: &mut Panel,
    close_up: Option<(f64, f64)>,
    body: &mut String,
    close_ups: &mut String,
    others: &mut Vec<String>,
) -> Result<(), String> {
    body.push_str(&draw_panel(panel, others)?);
    body.push('\n');
    if let Some((from, to)) = close_up {
        panel.from = from;
        panel.to = to;
        panel.caption = format!(
            "{}, close-up {} … {}",
            panel.caption,
            panel.frame.label(from),
            panel.frame.label(to)
        );
        close_ups.push_str(&draw_panel(panel, others)?);
        close_ups.push('\n');
    }
    Ok(())
}

fn trim_y(y: f64) -> String {
    let s = format!("{y:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

fn with_overlay(mut svg: String, overlay: &str) -> String {
    if let Some(i) = svg.rfind("</svg>") {
        svg.insert_str(i, overlay);
    }
    svg
}

/// The lane chart: every action the operator took (and what the world
/// did), a row per action, a mark per entry.
fn draw_lanes(frame: &Frame) -> Result<String, String> {
    const ORDER: [&str; 13] = [
        "world", "apply", "patch", "delete", "status", "state", "rollback", "event", "refusal",
        "error", "alert", "resolve", "notify",
    ];
    let rows: Vec<&str> = ORDER
        .into_iter()
        .filter(|a| frame.report.entries.iter().any(|e| e.action == *a))
        .collect();
    let height = 60 + 26 * rows.len() as u32;
    let mut svg = String::new();
    let mut overlay = String::new();
    {
        let root: Area = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let n = rows.len() as f64;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(26)
            .margin_right(20)
            .x_label_area_size(28)
            .y_label_area_size(LEFT)
            .build_cartesian_2d(0f64..frame.end, -0.5..n - 0.5)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 12))
            .disable_y_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .x_labels(14)
            .x_label_formatter(&|x| frame.label(*x))
            .y_labels(rows.len())
            .y_label_formatter(&|y| {
                let i = y.round();
                match (i - y).abs() < 0.01 && i >= 0.0 {
                    true => rows
                        .get(rows.len().saturating_sub(1 + i as usize))
                        .map_or(String::new(), |r| r.to_string()),
                    false => String::new(),
                }
            })
            .draw()
            .map_err(|e| e.to_string())?;
        for e in &frame.report.entries {
            let Some(row) = rows.iter().position(|r| *r == e.action) else {
                continue;
            };
            let y = (rows.len() - 1 - row) as f64;
            let (px, py) = chart.backend_coord(&(frame.x(e), y));
            let fill = match e.result.as_str() {
                "ok" => "#3a6ea5",
                "unchanged" => "#b0b0b0",
                "failed" | "refused" => "#b02020",
                _ => "#e08c14",
            };
            let _ = write!(
                overlay,
                r#"<rect class="action {} result-{}" x="{}" y="{}" width="3" height="16" fill="{fill}"><title>{}</title></rect>"#,
                esc(&e.action),
                esc(&e.result),
                px - 1,
                py - 8,
                esc(&lane_hover(frame.report, e))
            );
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(with_overlay(svg, &overlay))
}

const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1140px; }
h1 { font-size: 20px; margin-bottom: 4px; }
h2 { font-size: 16px; margin: 28px 0 6px; }
h3.panel { font-size: 13px; font-weight: 500; margin: 14px 0 0 70px; color: #333; }
.meta { color: #555; margin: 0 0 12px; }
.passed { color: #2e7d32; font-weight: 600; }
.failed { color: #b02020; font-weight: 600; }
pre { background: #f6f6f6; padding: 10px; overflow-x: auto; font-size: 12px; }
.legend span { display: inline-block; margin-right: 14px; font-size: 13px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
svg { display: block; }
.marker, .point, .action { cursor: help; }
";

/// One scenario's part of the page.
/// The time axis of a scenario's charts (hours past three hours, minutes
/// below), and how long the run lasted in milliseconds.
fn frame_of(report: &Report) -> (Frame<'_>, i64) {
    let last = report
        .entries
        .iter()
        .map(|e| e.time.as_millisecond() - report.start.as_millisecond())
        .max()
        .unwrap_or(0)
        .max(60_000);
    let (unit_ms, unit) = if last > 3 * 3_600_000 {
        (3_600_000.0, "h")
    } else {
        (60_000.0, "m")
    };
    let frame = Frame {
        report,
        unit_ms,
        unit,
        end: (last as f64 / unit_ms) * 1.01,
    };
    (frame, last)
}

/// The numbers of a target's spec drawn as references beside a status
/// field: those of its sort (fractions for fractions, counts for counts)
/// near its range, as an Evaluator's threshold beside its score.
fn references(spec: Option<&Value>, points: &[(f64, f64, usize)]) -> Vec<(String, f64)> {
    let (lo, hi) = points
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), p| {
            (l.min(p.1), h.max(p.1))
        });
    let span = (hi - lo).max(hi.abs() * 0.1);
    let fractional = |v: f64| v.fract() != 0.0;
    let field_fractional = points.iter().any(|p| fractional(p.1));
    spec.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((format!("spec.{k}"), v.as_f64()?)))
        .filter(|(_, v)| fractional(*v) == field_fractional)
        .filter(|(_, v)| *v >= lo - span && *v <= hi + span)
        .collect()
}

/// A target's legend: its phases, and the markers it has, counted.
fn legend(bands: &[(f64, f64, String)], markers: &[&Entry], others: &mut Vec<String>) -> String {
    let mut legend = String::from(r#"<p class="legend">"#);
    let mut shown: Vec<&str> = Vec::new();
    for (_, _, phase) in bands {
        if shown.contains(&phase.as_str()) {
            continue;
        }
        shown.push(phase);
        let c = phase_colour(phase, others);
        let _ = write!(
            legend,
            r#"<span><i style="background:{}; opacity:0.45"></i>phase {}</span>"#,
            colour(c),
            esc(phase)
        );
    }
    for (class, c) in [
        ("rollback", RGBColor(214, 60, 50)),
        ("alert", RGBColor(230, 140, 20)),
        ("resolve", RGBColor(46, 160, 67)),
        ("event", RGBColor(110, 110, 110)),
    ] {
        let n = markers
            .iter()
            .filter(|e| marker_kind(e).map(|m| m.0) == Some(class))
            .count();
        if n > 0 {
            let _ = write!(
                legend,
                r#"<span><i style="background:{}"></i>{class} ({n})</span>"#,
                colour(c)
            );
        }
    }
    legend.push_str("</p></section>\n");
    legend
}

/// What one target's panels are drawn from.
struct TargetView<'a> {
    history: &'a [(usize, Value)],
    spec: Option<&'a Value>,
    bands: &'a [(f64, f64, String)],
    markers: &'a [&'a Entry],
}

/// One target's panels: a chart per numeric status field (or its phases
/// alone), with close-ups of the markers.
fn panels(
    frame: &Frame,
    view: &TargetView,
    body: &mut String,
    others: &mut Vec<String>,
) -> Result<(), String> {
    let report = frame.report;
    let fields = numeric_fields(view.history);
    let close_up = close_up(frame, view.markers);
    let mut close_ups = String::new();
    for field in &fields {
        let points: Vec<(f64, f64, usize)> = view
            .history
            .iter()
            .filter_map(|(i, s)| Some((frame.x(&report.entries[*i]), s[field].as_f64()?, *i)))
            .collect();
        let references = references(view.spec, &points);
        let mut panel = Panel {
            frame,
            field,
            points,
            references,
            bands: view.bands,
            markers: view.markers,
            from: 0.0,
            to: frame.end,
            caption: format!("status.{field}"),
        };
        draw_with_close_up(&mut panel, close_up, body, &mut close_ups, others)?;
    }
    if fields.is_empty() && !view.bands.is_empty() {
        let mut panel = Panel {
            frame,
            field: "phase",
            points: Vec::new(),
            references: Vec::new(),
            bands: view.bands,
            markers: view.markers,
            from: 0.0,
            to: frame.end,
            caption: "status.phase".into(),
        };
        draw_with_close_up(&mut panel, close_up, body, &mut close_ups, others)?;
    }
    if !close_ups.is_empty() {
        let _ = write!(
            body,
            r#"<details class="close-up" open><summary>Close-up of the markers</summary>{close_ups}</details>"#
        );
    }
    if fields.is_empty() && view.bands.is_empty() {
        let _ = writeln!(
            body,
            "<p class=\"meta\">no numeric status field and no phase</p>"
        );
    }
    Ok(())
}

/// A section per object the policies patched (not a target), with a
/// panel for each numeric field they changed.
fn patched_sections(
    report: &Report,
    frame: &Frame,
    body: &mut String,
    others: &mut Vec<String>,
) -> Result<(), String> {
    for (object, history) in patched(report) {
        let markers: Vec<&Entry> = report
            .entries
            .iter()
            .filter(|e| e.action == "patch" && Target::of(e) == object)
            .collect();
        let _ = writeln!(
            body,
            r#"<section class="target" data-target="{}"><h2>{} <small>({}, changed by the policies)</small></h2>"#,
            esc(&object.shown()),
            esc(&object.shown()),
            esc(&object.api_version)
        );
        for (field, values) in history {
            let points: Vec<(f64, f64, usize)> = values
                .iter()
                .map(|(i, v)| (frame.x(&report.entries[*i]), *v, *i))
                .collect();
            let panel = Panel {
                frame,
                field: &field,
                points,
                references: Vec::new(),
                bands: &[],
                markers: &markers,
                from: 0.0,
                to: frame.end,
                caption: field.clone(),
            };
            body.push_str(&draw_panel(&panel, others)?);
            body.push('\n');
        }
    }
    Ok(())
}

/// A section per metric series of the world, its values over time
/// against the threshold: the series' own, or the one the targets'
/// `spec.metric.threshold` agree on. A stretch of no data is said below.
fn metric_sections(
    report: &Report,
    frame: &Frame,
    body: &mut String,
    others: &mut Vec<String>,
) -> Result<(), String> {
    let thresholds: std::collections::BTreeSet<String> = report
        .specs
        .values()
        .filter_map(|s| s.pointer("/metric/threshold")?.as_f64())
        .map(|t| t.to_string())
        .collect();
    let shared = match thresholds.len() {
        1 => thresholds.iter().next().and_then(|t| t.parse::<f64>().ok()),
        _ => None,
    };
    for series in &report.metrics {
        let label = series.label();
        let _ = writeln!(
            body,
            r#"<section class="target metric" data-target="{}"><h2>{} <small>(the world's metric)</small></h2>"#,
            esc(&label),
            esc(&label)
        );
        let x = |ms: i64| ms as f64 / frame.unit_ms;
        let points: Vec<(f64, f64, usize)> = series
            .points
            .iter()
            .filter_map(|(t, v)| Some((x(*t), (*v)?, usize::MAX)))
            .collect();
        let references = series
            .threshold
            .or(shared)
            .map(|t| vec![("threshold".to_string(), t)])
            .unwrap_or_default();
        let panel = Panel {
            frame,
            field: &label,
            points,
            references,
            bands: &[],
            markers: &[],
            from: 0.0,
            to: frame.end,
            caption: label.clone(),
        };
        body.push_str(&draw_panel(&panel, others)?);
        let gaps: Vec<String> = series
            .points
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(t, _)| frame.label(x(*t)))
            .collect();
        if !gaps.is_empty() {
            let _ = writeln!(
                body,
                "<p class=\"meta\">no data from {}</p>",
                esc(&gaps.join(", "))
            );
        }
        body.push_str("</section>\n");
    }
    Ok(())
}

fn article(report: &Report) -> Result<String, String> {
    let (frame, last) = frame_of(report);
    let statuses = statuses(report);
    let targets: Vec<Target> = statuses.keys().cloned().collect();
    let sole = sole_target_of(report, &targets);
    let mut others = Vec::new();
    let mut body = String::new();
    for (target, history) in &statuses {
        let markers: Vec<&Entry> = report
            .entries
            .iter()
            .filter(|e| marker_kind(e).is_some())
            .filter(|e| {
                Target::of(e) == *target
                    || sole.get(&(e.policy.clone(), e.namespace.clone())) == Some(target)
            })
            .collect();
        let bands = phase_bands(&frame, history);
        let _ = writeln!(
            body,
            r#"<section class="target" data-target="{}"><h2>{} <small>({})</small></h2>"#,
            esc(&target.shown()),
            esc(&target.shown()),
            esc(&target.api_version)
        );
        let spec = report.specs.get(&target.key());
        let view = TargetView {
            history,
            spec,
            bands: &bands,
            markers: &markers,
        };
        panels(&frame, &view, &mut body, &mut others)?;
        let legend = legend(&bands, &markers, &mut others);
        body.push_str(&legend);
    }
    patched_sections(report, &frame, &mut body, &mut others)?;
    metric_sections(report, &frame, &mut body, &mut others)?;
    let lanes = draw_lanes(&frame)?;
    let verdict = match report.passed() {
        true => r#"<span class="passed">passed</span>"#.to_string(),
        false => format!(
            r#"<span class="failed">failed</span> ({} problems)"#,
            report.failures.len() + report.load_errors.len()
        ),
    };
    Ok(format!(
        "<article class=\"scenario\">\n<h1>{name}</h1>\n<p class=\"meta\">{file} · from {start} over {span} · {verdict}</p>\n{body}<section class=\"lanes\"><h2>Every action</h2>\n{lanes}\n<p class=\"legend\"><span><i style=\"background:#3a6ea5\"></i>ok</span><span><i style=\"background:#b0b0b0\"></i>unchanged</span><span><i style=\"background:#e08c14\"></i>limited, shadow, suspended, skipped</span><span><i style=\"background:#b02020\"></i>failed, refused</span></p></section>\n<h2>Summary</h2>\n<pre>{summary}</pre>\n</article>\n",
        name = esc(&report.name),
        file = esc(&report.file),
        start = report.start,
        span = offset(last),
        summary = esc(&super::fold::closing_summary(report)),
    ))
}

/// Two runs of one scenario (a replay's old and new policies) side by
/// side, each in its own column, scrolled on its own where it is wider.
pub fn render_side_by_side(old: &Report, new: &Report) -> Result<String, String> {
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>{} — runbook replay</title>\n<style>{STYLE}\n.versions{{display:grid;grid-template-columns:1fr 1fr;gap:1em}}\n.versions>article{{min-width:0;overflow-x:auto}}</style></head>\n<body>\n<div class=\"versions\">\n{}{}</div>\n</body></html>\n",
        esc(&old.name),
        article(old)?,
        article(new)?
    ))
}

/// The whole page: one article per scenario run, nothing fetched.
pub fn render(reports: &[Report]) -> Result<String, String> {
    let title = match reports {
        [one] => one.name.clone(),
        _ => format!("{} scenarios", reports.len()),
    };
    let mut page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>{} — runbook simulate</title>\n<style>{STYLE}</style></head>\n<body>\n",
        esc(&title)
    );
    for r in reports {
        page.push_str(&article(r)?);
    }
    page.push_str("</body></html>\n");
    Ok(page)
}
