//! A readable timeline: cycles that repeat (an hourly benchmark that
//! passes fifty times) folded into one line with their count, and a
//! closing summary of what the run did.

use std::collections::BTreeMap;

use serde_json::Value;

use super::report::{Report, offset};
use runbook_operator::telemetry::journal::Entry;

/// Blocks of up to this many lines are looked for.
const LONGEST_CYCLE: usize = 12;
/// A block repeated at least this often is folded.
const FOLD_FROM: usize = 3;

/// A line's shape: what stays the same from one cycle to the next, with
/// times and the hash suffixes of generated names taken out.
fn shape(report: &Report, x: &Entry) -> String {
    let line = report.line(x);
    let body = line.trim_start().split_once(' ').map_or("", |(_, b)| b);
    body.split(' ')
        .map(token_shape)
        .collect::<Vec<_>>()
        .join(" ")
}

fn token_shape(token: &str) -> String {
    match token.split_once('=') {
        Some((k, v)) => format!("{k}={}", value_shape(v)),
        None => value_shape(token),
    }
}

fn value_shape(v: &str) -> String {
    if runbook_core::util::time::parse(v.trim_end_matches([',', ':'])).is_some() {
        return "<time>".into();
    }
    // `default/chatbot-eval-da2d3ac333` → `default/chatbot-eval-*`
    let (head, last) = v.rsplit_once('-').unwrap_or(("", v));
    let hashed = last.len() >= 8
        && last
            .trim_end_matches(':')
            .chars()
            .all(|c| c.is_ascii_hexdigit());
    if hashed && !head.is_empty() {
        format!("{head}-*{}", if last.ends_with(':') { ":" } else { "" })
    } else {
        v.to_string()
    }
}

/// How many times the block of `len` shapes at `i` repeats back to back.
fn repeats(shapes: &[String], i: usize, len: usize) -> usize {
    let block = &shapes[i..i + len];
    let mut k = 1;
    while i + (k + 1) * len <= shapes.len() && &shapes[i + k * len..i + (k + 1) * len] == block {
        k += 1;
    }
    k
}

/// The longest run of one repeated block at `i` (a shorter block wins a
/// tie): its length and count, if it repeats enough to fold.
fn cycle_at(shapes: &[String], i: usize) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for len in 1..=LONGEST_CYCLE.min(shapes.len() - i) {
        let k = repeats(shapes, i, len);
        let better = best.is_none_or(|(l, n)| k * len > l * n);
        if k >= FOLD_FROM && better {
            best = Some((len, k));
        }
    }
    best
}

/// The status fields every repetition of a folded block ends with the
/// same value of (the score, the phase), as `key=value`.
fn steady_fields(cycles: &[&[&Entry]]) -> String {
    // The status a cycle leaves: its status writes merged in order.
    let last_status = |c: &[&Entry]| -> Option<Value> {
        let mut merged = serde_json::Map::new();
        for x in c
            .iter()
            .filter(|x| x.action == "status" && x.result == "ok")
        {
            if let Some(m) = x.fields.as_object() {
                merged.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        (!merged.is_empty()).then_some(Value::Object(merged))
    };
    let Some(Value::Object(first)) = cycles.first().and_then(|c| last_status(c)) else {
        return String::new();
    };
    let all: Vec<Option<Value>> = cycles.iter().map(|c| last_status(c)).collect();
    first
        .iter()
        .filter(|(k, v)| {
            !v.is_null()
                && !v.is_object()
                && !v.is_array()
                && all
                    .iter()
                    .all(|s| s.as_ref().and_then(|s| s.get(*k)) == Some(*v))
        })
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One line for `k` repetitions of a block.
fn folded(report: &Report, block: &[&Entry], cycles: &[&[&Entry]]) -> String {
    let starts: Vec<i64> = cycles
        .iter()
        .map(|c| c[0].time.as_millisecond() - report.start.as_millisecond())
        .collect();
    let gaps: Vec<i64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    let every = match gaps.first() {
        Some(g) if gaps.iter().all(|x| x == g) => {
            format!(", one every {}", offset(*g).trim_start_matches('+'))
        }
        _ => String::new(),
    };
    let actions: Vec<String> = block
        .iter()
        .map(|x| match x.kind.is_empty() || x.action == "world" {
            true => x.action.clone(),
            false => format!("{} {}", x.action, x.kind),
        })
        .collect();
    let steady = steady_fields(cycles);
    let first = starts.first().copied().unwrap_or(0);
    let last = starts.last().copied().unwrap_or(0);
    let mut line = format!(
        "{:>9} … {}  {} cycles{every}: {}",
        offset(first),
        offset(last),
        cycles.len(),
        actions.join(", ")
    );
    if !steady.is_empty() {
        line.push_str(&format!("; {steady}"));
    }
    line
}

/// The timeline with repeated cycles folded.
pub fn folded_timeline(report: &Report) -> String {
    let shown: Vec<&Entry> = report
        .entries
        .iter()
        .filter(|x| x.result != "unchanged")
        .collect();
    let shapes: Vec<String> = shown.iter().map(|x| shape(report, x)).collect();
    let mut out = format!("scenario: {} ({})\n", report.name, report.file);
    if let Some(z) = &report.zone {
        out.push_str(&format!(
            "times: UTC, and in {z} (the policies' schedules) beside each time in status\n"
        ));
    }
    let mut i = 0;
    while i < shown.len() {
        match cycle_at(&shapes, i) {
            Some((len, k)) => {
                let cycles: Vec<&[&Entry]> = (0..k)
                    .map(|c| &shown[i + c * len..i + (c + 1) * len])
                    .collect();
                out.push_str(&folded(report, &shown[i..i + len], &cycles));
                out.push('\n');
                i += len * k;
            }
            None => {
                out.push_str(&report.line(shown[i]));
                out.push('\n');
                i += 1;
            }
        }
    }
    out
}

/// What a run did, in a few lines: expectations, actions by kind, API
/// writes, alerts.
pub fn closing_summary(report: &Report) -> String {
    // Failures with a place are expectations that did not hold; the others
    // (a script's error, a refused action, a load error) are their causes,
    // counted apart so the numbers add up to the expectations checked.
    let failed = report.failures.iter().filter(|f| f.pos.is_some()).count();
    let causes = report.failures.len() - failed;
    let held = report.checked.saturating_sub(failed);
    let besides = match causes {
        0 => String::new(),
        1 => ", and 1 failure besides them".to_string(),
        n => format!(", and {n} failures besides them"),
    };
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    let mut writes = 0;
    let (mut fired, mut resolved) = (0, 0);
    for x in &report.entries {
        if x.action == "world" || x.result == "unchanged" {
            continue;
        }
        let what = match x.kind.is_empty() || x.action == "notify" {
            true => x.action.clone(),
            false => format!("{} {}", x.action, x.kind),
        };
        *by_kind.entry(what).or_default() += 1;
        let writing = matches!(
            x.action.as_str(),
            "apply" | "delete" | "patch" | "status" | "state" | "rollback" | "event"
        );
        if writing && x.result == "ok" {
            writes += 1;
        }
        match x.action.as_str() {
            "alert" => fired += 1,
            "resolve" => resolved += 1,
            _ => {}
        }
    }
    let actions: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    format!(
        "summary: {held} expectations held, {failed} failed{besides}\n  actions: {}\n  API writes: {writes}\n  alerts: {fired} fired, {resolved} resolved\n",
        if actions.is_empty() {
            "none".to_string()
        } else {
            actions.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_hash_suffixes_do_not_change_a_shape() {
        assert_eq!(
            token_shape("default/chatbot-eval-da2d3ac333"),
            "default/chatbot-eval-*"
        );
        assert_eq!(
            token_shape("currentRun=chatbot-eval-bdd98d5566"),
            "currentRun=chatbot-eval-*"
        );
        assert_eq!(
            token_shape("nextRunTime=2026-11-23T01:00:00Z"),
            "nextRunTime=<time>"
        );
        assert_eq!(token_shape("lastScore=0.91"), "lastScore=0.91");
        assert_eq!(token_shape("orders-before-16-4"), "orders-before-16-4");
    }

    #[test]
    fn the_summary_counts_expectations_apart_from_their_causes() {
        use runbook_core::util::yaml::Pos;
        let failure = |pos: Option<Pos>, message: &str| super::super::report::Failure {
            pos,
            message: message.to_string(),
            detail: Vec::new(),
        };
        let mut report = Report {
            name: "s".into(),
            file: "s.yaml".into(),
            start: "2026-11-29T09:00:00Z".parse().unwrap(),
            entries: Vec::new(),
            checked: 3,
            failures: vec![
                failure(Some(Pos { line: 15, col: 11 }), "want a status"),
                failure(None, "policy widgets failed on Widgetry /w1"),
            ],
            load_errors: Vec::new(),
            set_aside: Vec::new(),
            zone: None,
            specs: Default::default(),
            metrics: Vec::new(),
        };
        let first = |r: &Report| closing_summary(r).lines().next().unwrap().to_string();
        assert_eq!(
            first(&report),
            "summary: 2 expectations held, 1 failed, and 1 failure besides them"
        );
        report.failures.remove(1);
        assert_eq!(first(&report), "summary: 2 expectations held, 1 failed");
    }

    #[test]
    fn the_longest_repeated_block_is_found() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let shapes = s(&["x", "a", "b", "a", "b", "a", "b", "a", "b", "y"]);
        assert_eq!(cycle_at(&shapes, 0), None);
        assert_eq!(cycle_at(&shapes, 1), Some((2, 4)));
        // Twice is not enough to fold.
        assert_eq!(cycle_at(&s(&["a", "b", "a", "b"]), 0), None);
        assert_eq!(cycle_at(&s(&["a", "a", "a"]), 0), Some((1, 3)));
    }
}
