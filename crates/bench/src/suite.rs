//! `runbook bench`: every figure of the performance suite in one run, as a
//! table or JSON, each with its goal and whether it was met.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::us;

/// A goal a figure is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    AtMost(f64),
    AtLeast(f64),
}

/// One figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub section: &'static str,
    pub figure: String,
    pub value: f64,
    pub unit: &'static str,
    pub goal: Option<Goal>,
}

impl Row {
    fn new(
        section: &'static str,
        figure: impl Into<String>,
        value: f64,
        unit: &'static str,
    ) -> Self {
        Self {
            section,
            figure: figure.into(),
            value,
            unit,
            goal: None,
        }
    }

    /// A section (or one size of it) that could not be measured: said on
    /// stderr and shown in the table as a missed goal.
    fn failed(section: &'static str, what: impl std::fmt::Display, why: &str) -> Self {
        eprintln!("{section}: {why}");
        Self::new(section, format!("{what}failed: {why}"), 0.0, "").goal(Goal::AtLeast(1.0))
    }

    fn goal(mut self, g: Goal) -> Self {
        self.goal = Some(g);
        self
    }

    pub fn met(&self) -> Option<bool> {
        self.goal.map(|g| match g {
            Goal::AtMost(x) => self.value <= x,
            Goal::AtLeast(x) => self.value >= x,
        })
    }

    fn goal_text(&self) -> String {
        match self.goal {
            Some(Goal::AtMost(x)) => format!("<= {}", trim(x)),
            Some(Goal::AtLeast(x)) => format!(">= {}", trim(x)),
            None => String::new(),
        }
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// What to run and how long.
#[derive(Clone, Debug)]
pub struct Options {
    /// Fewer samples and 2,000 targets instead of 10,000.
    pub quick: bool,
    pub sections: Vec<String>,
    pub policies: PathBuf,
    /// This program and the arguments that start it in a child role
    /// (for the memory figures).
    pub exe: PathBuf,
    pub child_args: Vec<String>,
    /// The kubeconfig of a cluster to measure the sections that can run on
    /// one (admission) against, instead of a sandbox.
    pub cluster: Option<PathBuf>,
    /// Targets of the scale-out section, instead of `targets()`.
    pub scale_out_targets: Option<usize>,
    /// The Python with Kopf for the peers section (default: `python3`).
    pub kopf_python: Option<PathBuf>,
}

pub const SECTIONS: &[&str] = &[
    "decision",
    "lookup",
    "writes",
    "operator",
    "reload",
    "admission",
    "memory",
    "scale",
    "containment",
    "fairness",
    "metrics",
    "scale-out",
    "peers",
];

impl Options {
    fn wants(&self, s: &str) -> bool {
        self.sections.is_empty() || self.sections.iter().any(|x| x == s)
    }

    fn targets(&self) -> usize {
        if self.quick { 2_000 } else { 10_000 }
    }
}

/// The same decision as the hooks users write instead: a process per
/// event, deciding with jq or Python (`rhai`: the Rhai decision's seconds).
fn hook_rows(
    s: &'static str,
    shell: Result<super::hooks::HookFigures, String>,
    python: Result<super::hooks::HookFigures, String>,
    rhai: f64,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (figures, what, label, goal) in [
        (
            shell,
            "shell-operator-style hook (bash + jq)",
            "shell hook",
            Some(1000.0),
        ),
        (python, "Python hook process", "Python hook", None),
    ] {
        match figures {
            Ok(f) if f.to_revision == Some(3) => {
                rows.push(Row::new(
                    s,
                    format!("{what}: rollback decision, median"),
                    ms(f.wall.median),
                    "ms",
                ));
                if let Some(cpu) = f.cpu {
                    rows.push(Row::new(
                        s,
                        format!("{what}: CPU per decision"),
                        ms(cpu),
                        "ms",
                    ));
                    let ratio = Row::new(
                        s,
                        format!("{label} CPU / Rhai"),
                        cpu.as_secs_f64() / rhai,
                        "x",
                    );
                    rows.push(match goal {
                        Some(g) => ratio.goal(Goal::AtLeast(g)),
                        None => ratio,
                    });
                }
                rows.push(Row::new(
                    s,
                    format!("{label} wall / Rhai"),
                    f.wall.median.as_secs_f64() / rhai,
                    "x",
                ));
            }
            Ok(f) => eprintln!(
                "{what}: decided {:?}, not the rollback to revision 3; not reported",
                f.to_revision
            ),
            Err(e) => eprintln!("{what}: not measured: {e}"),
        }
    }
    rows
}

/// What the Rhai interpreter alone costs the decisions: their operations
/// as Rhai counts them, and the rollback decision's at a plain engine's
/// time per operation.
fn interpreter_rows(s: &'static str, f: &super::decision::DecisionFigures) -> Vec<Row> {
    let mut rows = Vec::new();
    for (what, ops) in [
        ("rollback decision", f.operations),
        ("steady state", f.idle_operations),
    ] {
        if let Some(ops) = ops {
            rows.push(Row::new(
                s,
                format!("Rhai policy: {what}, script operations"),
                ops as f64,
                "ops",
            ));
        }
    }
    if let Some(ops) = f.operations.filter(|o| *o > 0) {
        rows.push(Row::new(
            s,
            "Rhai policy: rollback decision, time per script operation",
            f.scripted.median.as_secs_f64() * 1e9 / ops as f64,
            "ns",
        ));
    }
    rows.push(Row::new(
        s,
        "plain Rhai engine, a loop assigning a constant: time per operation, median of 5 rounds",
        f.plain_per_operation.as_secs_f64() * 1e9,
        "ns",
    ));
    if let Some(plain) = f.at_plain_cost() {
        rows.push(Row::new(
            s,
            "the rollback decision's operations at that time each",
            us(plain),
            "us",
        ));
        rows.push(Row::new(
            s,
            "rollback decision / its operations at that time each",
            f.scripted.median.as_secs_f64() / plain.as_secs_f64().max(1e-12),
            "x",
        ));
    }
    rows
}

fn decision(policies: &Path, quick: bool) -> Vec<Row> {
    let iters = if quick { 2_000 } else { 20_000 };
    let f = super::decision::run(policies, iters);
    let setup = super::decision::Setup::new(policies, 0.72);
    let body = bytes::Bytes::from(serde_json::to_vec(&setup.target).unwrap_or_default());
    let hook_iters = if quick { 10 } else { 30 };
    let shell = super::hooks::measure(super::hooks::Hook::Shell, &setup, hook_iters);
    let python = super::hooks::measure(super::hooks::Hook::Python, &setup, hook_iters);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let http = rt.block_on(super::baseline::http_round_trip(
        body,
        if quick { 1_000 } else { 5_000 },
    ));
    let rhai = f.scripted.median.as_secs_f64();
    let s = "decision";
    let mut rows = vec![
        // No absolute goal: its cost is its operations (below), each at
        // close to the interpreter's cheapest.
        Row::new(
            s,
            "Rhai policy: rollback decision, median of 5 rounds",
            us(f.scripted.median),
            "us",
        ),
        Row::new(
            s,
            "Rhai policy: rollback decision, lowest round",
            us(f.scripted_spread.0),
            "us",
        ),
        Row::new(
            s,
            "Rhai policy: rollback decision, highest round",
            us(f.scripted_spread.1),
            "us",
        ),
        Row::new(
            s,
            "Rhai policy: rollback decision, p99",
            us(f.scripted.p99),
            "us",
        ),
        Row::new(
            s,
            "native Rust: the same decision, median",
            us(f.native.median),
            "us",
        ),
        Row::new(s, "Rhai / native", f.ratio(), "x").goal(Goal::AtMost(50.0)),
        Row::new(
            s,
            "Rhai policy: steady state (nothing due), median of 5 rounds",
            us(f.scripted_idle.median),
            "us",
        )
        .goal(Goal::AtMost(15.0)),
    ];
    rows.extend(interpreter_rows(s, &f));
    rows.extend([
        Row::new(
            s,
            "HTTP round trip on loopback (webhook floor), median",
            us(http.median),
            "us",
        ),
        Row::new(
            s,
            "HTTP round trip / Rhai",
            http.median.as_secs_f64() / rhai,
            "x",
        ),
    ]);
    rows.extend(hook_rows(s, shell, python, rhai));
    rows
}

/// Reads in a busy namespace: lookups among 5,000 pods, and the drift
/// policy's decision beside them.
fn lookup(policies: &Path, quick: bool) -> Vec<Row> {
    let f = super::lookup::run(policies, 5_000, if quick { 1_000 } else { 10_000 });
    let s = "lookup";
    let n = f.pods;
    vec![
        Row::new(
            s,
            format!("one workload's pods by selector among {n} pods, median"),
            us(f.select.median),
            "us",
        )
        .goal(Goal::AtMost(1000.0)),
        Row::new(
            s,
            format!("the same, first read (the pods it returns parsed), among {n} pods"),
            ms(f.select_first),
            "ms",
        ),
        Row::new(
            s,
            format!("every pod of the namespace ({n}), median"),
            ms(f.list_all.median),
            "ms",
        ),
        Row::new(
            s,
            format!("the same, first read (each of the {n} pods parsed)"),
            ms(f.list_first),
            "ms",
        ),
        Row::new(
            s,
            format!("drift policy's rollback decision beside {n} pods, median"),
            us(f.decision.median),
            "us",
        )
        .goal(Goal::AtMost(20_000.0)),
        Row::new(
            s,
            format!("one workload's pods by selector among {n} pods of a target kind, median"),
            us(f.target_select.median),
            "us",
        )
        .goal(Goal::AtMost(1000.0)),
    ]
}

/// The writes of the README's week: each must change something a reader
/// can see, so a benchmark run costs the four the workflow needs (apply
/// its Job, status running, status done, delete the oldest Job).
fn writes(policies: &Path) -> Vec<Row> {
    let week = policies.join("../examples/evaluator-drift/week.yaml");
    let s = "writes";
    let mut rows = Vec::new();
    match super::scenario::cpu(&week, 3) {
        Ok(cpu) => rows.push(
            Row::new(
                s,
                "the README's week (runbook simulate examples/evaluator-drift), CPU, median of 3",
                cpu,
                "s",
            )
            .goal(Goal::AtMost(1.0)),
        ),
        Err(e) => rows.push(Row::failed(s, "the README's week, CPU: ", &e)),
    }
    rows.extend(match super::scenario::writes(&week) {
        Ok(f) => vec![
            Row::new(
                s,
                format!("writes per evaluation cycle (the week: {} runs)", f.runs),
                f.per_cycle(),
                "writes",
            )
            .goal(Goal::AtMost(4.0)),
            Row::new(
                s,
                "status writes per benchmark run",
                f.status_per_run(),
                "writes",
            )
            .goal(Goal::AtMost(2.0)),
            Row::new(
                s,
                "API writes of the whole week",
                f.all_writes as f64,
                "writes",
            ),
        ],
        Err(e) => {
            eprintln!("the week scenario failed ({}): {e}", week.display());
            Vec::new()
        }
    });
    rows
}

async fn operator(n: usize, rounds: usize) -> Vec<Row> {
    // Under the log subscriber `runbook run` installs (its filter, its
    // span bookkeeping, every line formatted), writing to nowhere so the
    // table stays readable: logging's cost is in the figures.
    let _ = tracing::subscriber::set_global_default(runbook_operator::telemetry::log::text(
        std::io::sink,
    ));
    let f = tokio::spawn(super::operator::run(n, rounds))
        .await
        .expect("operator benchmark");
    let s = "operator";
    let (low, high) = f.spread();
    let mut rows = vec![
        Row::new(
            s,
            format!(
                "hand-written kube-rs controller owning its ConfigMaps (as Runbook does), {n} targets, median of {rounds}"
            ),
            f.median_hand(),
            "s",
        ),
        Row::new(
            s,
            format!("Runbook (Rhai policy), {n} targets, median of {rounds}"),
            f.median_runbook(),
            "s",
        ),
        Row::new(
            s,
            format!("Runbook / hand-written, median of {rounds} interleaved rounds"),
            f.ratio(),
            "x",
        )
        .goal(Goal::AtMost(1.3)),
        Row::new(s, "Runbook / hand-written, lowest round", low, "x"),
        Row::new(s, "Runbook / hand-written, highest round", high, "x"),
        Row::new(
            s,
            format!(
                "the hand-written controller without a watch on its ConfigMaps, median of {rounds}"
            ),
            f.median_hand_unwatched(),
            "s",
        ),
        Row::new(
            s,
            format!("Runbook / that controller, median of {rounds} interleaved rounds"),
            f.ratio_unwatched(),
            "x",
        ),
        Row::new(
            s,
            "Runbook decisions per target, from new to done (most of the rounds)",
            f.decisions as f64 / n.max(1) as f64,
            "decisions",
        ),
        Row::new(
            s,
            "API writes of a no-op resync of every target",
            f.noop_writes as f64,
            "writes",
        ),
        Row::new(
            s,
            "API writes per reconcile, steady state",
            f.noop_writes as f64 / n.max(1) as f64,
            "writes",
        )
        .goal(Goal::AtMost(0.0)),
    ];
    rows.extend(written_rows(s, n, &f));
    rows
}

/// What each controller wrote to finish a target, and what a finished
/// target and its child weigh as the API server stores them.
fn written_rows(s: &'static str, n: usize, f: &super::operator::OperatorFigures) -> Vec<Row> {
    let per = |v: u64| v as f64 / n.max(1) as f64;
    let mut rows = Vec::new();
    for (who, w) in [
        ("Runbook", &f.runbook_written),
        ("hand-written", &f.hand_written),
    ] {
        for (what, value, unit) in [
            ("API writes per target, new to done", w.writes, "writes"),
            ("bytes of those writes per target", w.bytes, "B"),
            ("a finished Item as stored", w.item_bytes, "B"),
            ("its child ConfigMap as stored", w.child_bytes, "B"),
        ] {
            rows.push(Row::new(s, format!("{who}: {what}"), per(value), unit));
        }
    }
    rows
}

async fn reload(quick: bool, n: usize) -> Vec<Row> {
    let edits = if quick { 30 } else { 100 };
    let f = tokio::spawn(super::reload::run(edits, n))
        .await
        .expect("reload benchmark");
    let s = "reload";
    vec![
        Row::new(
            s,
            format!("ConfigMap edit -> first reconcile on the new version, p50 ({edits} edits)"),
            ms(f.latency.median),
            "ms",
        ),
        Row::new(
            s,
            format!("ConfigMap edit -> first reconcile on the new version, p99 ({edits} edits)"),
            ms(f.latency.p99),
            "ms",
        )
        .goal(Goal::AtMost(200.0)),
        Row::new(
            s,
            format!("edit -> all {n} targets on the new version"),
            f.requeue_all.as_secs_f64(),
            "s",
        ),
        Row::new(
            s,
            format!(
                "{} edits over {} s beside {} targets: last edit -> every target on it",
                f.storm.edits,
                f.storm.over.as_secs(),
                f.storm.targets
            ),
            f.storm.converged.as_secs_f64(),
            "s",
        )
        .goal(Goal::AtMost(2.0)),
        Row::new(s, "the storm's API writes", f.storm.writes as f64, "writes"),
        Row::new(s, "the storm's policy loads", f.storm.loads as f64, "loads"),
    ]
}

fn memory(opts: &Options) -> Vec<Row> {
    let n = opts.targets();
    let args: Vec<&str> = opts.child_args.iter().map(String::as_str).collect();
    let f = super::memory::measure(&opts.exe, &args, n);
    let s = "memory";
    vec![
        Row::new(
            s,
            format!("operator RSS, {n} targets and {n} children cached"),
            mb(f.rss),
            "MB",
        )
        .goal(Goal::AtMost(100.0)),
        Row::new(s, "operator live heap, same", mb(f.heap), "MB"),
        Row::new(
            s,
            format!(
                "peak RSS while every watch relists ({} lists after a compaction)",
                f.relists
            ),
            mb(f.peak_rss),
            "MB",
        ),
        Row::new(
            s,
            "peak RSS during relist / steady RSS",
            f.peak_rss as f64 / f.rss.max(1) as f64,
            "x",
        )
        .goal(Goal::AtMost(2.0)),
        Row::new(
            s,
            "peak live heap during relist / steady heap",
            f.peak_heap as f64 / f.heap.max(1) as f64,
            "x",
        ),
    ]
}

/// Time and RSS of `runbook run`, its own process, as the targets grow
/// (each with one child): the cost per target, and whether it stays flat.
async fn scale(opts: &Options) -> Vec<Row> {
    let sizes: &[usize] = if opts.quick {
        &[500, 2_000]
    } else {
        &[1_000, 10_000, 50_000]
    };
    let s = "scale";
    let mut rows = Vec::new();
    let mut points: Vec<(usize, f64, u64)> = Vec::new();
    for &n in sizes {
        let run = match super::peers::runbook_run(n, &opts.exe).await {
            Ok(r) => r,
            Err(e) => {
                rows.push(Row::failed(s, format!("{n} targets: "), &e));
                continue;
            }
        };
        let per = run.wall.as_secs_f64() * 1e6 / n as f64;
        rows.push(Row::new(
            s,
            format!("runbook run, {n} targets: from its start until every one is done, per target"),
            per,
            "us",
        ));
        rows.push(Row::new(
            s,
            format!("runbook run, {n} targets: CPU per target"),
            run.cpu.as_secs_f64() * 1e6 / n as f64,
            "us",
        ));
        rows.push(Row::new(
            s,
            format!("runbook run, {n} targets: RSS 2 s after every one is done"),
            mb(run.rss),
            "MB",
        ));
        points.push((n, per, run.rss));
    }
    if let (Some(first), Some(last)) = (points.first(), points.last())
        && last.0 > first.0
    {
        let kb = (last.2 as f64 - first.2 as f64) / 1024.0 / (last.0 - first.0) as f64;
        rows.push(
            Row::new(
                s,
                format!(
                    "RSS per further target with its child ({} to {})",
                    first.0, last.0
                ),
                kb,
                "KB",
            )
            .goal(Goal::AtMost(8.0)),
        );
        rows.push(
            Row::new(
                s,
                format!("time per target at {} / at {}", last.0, first.0),
                last.1 / first.1.max(1e-9),
                "x",
            )
            .goal(Goal::AtMost(1.3)),
        );
    }
    rows
}

async fn containment(quick: bool) -> Vec<Row> {
    let items = if quick { 1_000 } else { 3_000 };
    let f = super::containment::run(items, 4, if quick { 10 } else { 30 }).await;
    let s = "containment";
    vec![
        Row::new(
            s,
            "runaway script: start -> terminated, median",
            ms(f.runaway.median),
            "ms",
        ),
        Row::new(
            s,
            "runaway script: start -> terminated, max",
            ms(f.runaway.p99),
            "ms",
        )
        .goal(Goal::AtMost(50.0)),
        Row::new(
            s,
            format!("{items} targets reconciled alone"),
            f.alone.as_secs_f64(),
            "s",
        ),
        Row::new(
            s,
            format!(
                "the same beside {} runaway targets ({} stopped)",
                f.runaways, f.runaway_errors
            ),
            f.beside_runaways.as_secs_f64(),
            "s",
        ),
        Row::new(s, "slowdown beside runaways", f.slowdown(), "x"),
    ]
}

/// 1,000 Evaluators judged by one shared Prometheus query (the shipped
/// policy): the requests one schedule tick makes, and how long deciding
/// them all takes.
async fn metrics(opts: &Options) -> Vec<Row> {
    let s = "metrics";
    let n = 1_000;
    let f = match super::metrics::run(&opts.policies, n).await {
        Ok(f) => f,
        Err(e) => return vec![Row::failed(s, "", &e)],
    };
    vec![
        Row::new(
            s,
            format!(
                "{n} Evaluators on one query: requests for their first runs (each its own creation time)"
            ),
            f.creation_requests as f64,
            "",
        ),
        Row::new(
            s,
            format!("{n} Evaluators on one query: requests at one schedule tick"),
            f.tick_requests as f64,
            "",
        )
        .goal(Goal::AtMost(1.0)),
        Row::new(
            s,
            format!(
                "one tick: until every decision is written ({} of {n})",
                f.decided
            ),
            ms(f.tick_decided),
            "ms",
        ),
    ]
}

/// A quiet policy's reaction beside a noisy one, as a ratio to the same
/// reaction alone.
async fn fairness(quick: bool) -> Vec<Row> {
    let rounds = if quick { 40 } else { 200 };
    let f = super::fairness::run(300, rounds).await;
    let s = "fairness";
    let beside = format!(
        "beside a policy whose {} targets run past their budget ({} of its decisions put off)",
        f.noisy_targets, f.throttled
    );
    vec![
        Row::new(
            s,
            "quiet policy: change -> status, alone, p50",
            ms(f.alone.median),
            "ms",
        ),
        Row::new(
            s,
            "quiet policy: change -> status, alone, p99",
            ms(f.alone.p99),
            "ms",
        ),
        Row::new(
            s,
            format!("the same {beside}, p50"),
            ms(f.beside.median),
            "ms",
        ),
        Row::new(s, format!("the same {beside}, p99"), ms(f.beside.p99), "ms"),
        Row::new(s, "beside / alone, p50", f.p50_ratio(), "x").goal(Goal::AtMost(1.5)),
        Row::new(s, "beside / alone, p99", f.p99_ratio(), "x").goal(Goal::AtMost(2.0)),
        Row::new(
            s,
            "without shares (every policy takes what it needs; 20 changes, each wait cut at 10 s): beside / alone, p50",
            f.unshared_ratios().0,
            "x",
        ),
        Row::new(
            s,
            "without shares: beside / alone, p99",
            f.unshared_ratios().1,
            "x",
        ),
    ]
}

async fn admission(opts: &Options) -> Vec<Row> {
    let reviews = if opts.quick { 50 } else { 300 };
    let p = opts.policies.clone();
    let cluster = match &opts.cluster {
        Some(path) => Some(super::memory::client_of(path).await),
        None => None,
    };
    let real = cluster.is_some();
    let f = tokio::spawn(async move { super::admission::run(&p, reviews, cluster).await })
        .await
        .expect("admission benchmark");
    let s = "admission";
    let what = format!(
        "policy webhook: kubectl apply --dry-run=server of the shipped policies ({} files, {} reviews{})",
        f.files,
        f.reviews,
        if real { ", the given cluster" } else { "" }
    );
    vec![
        Row::new(s, format!("{what}, p50"), ms(f.latency.median), "ms"),
        Row::new(s, format!("{what}, p99"), ms(f.latency.p99), "ms").goal(Goal::AtMost(100.0)),
    ]
}

/// Replicas sharing the targets (`--shards`), each its own process,
/// against one replica holding them all: memory, time, takeover of a
/// killed replica, moves when replicas join and leave, and whether two
/// ever acted on one target at once.
async fn scale_out(opts: &Options) -> Vec<Row> {
    const REPLICAS: usize = 4;
    const LEASE_SECS: u64 = 10;
    let n = opts.scale_out_targets.unwrap_or(opts.targets());
    let o = opts.clone();
    let run = tokio::spawn(async move {
        super::scaleout::measure(
            &o.exe,
            &o.child_args,
            n,
            REPLICAS,
            LEASE_SECS,
            o.cluster.as_deref(),
        )
        .await
    })
    .await
    .expect("scale-out benchmark");
    let s = "scale-out";
    let f = match run {
        Ok(f) => f,
        Err(e) => return vec![Row::failed(s, "", &e)],
    };
    let mut rows = scale_out_times(&f, n, REPLICAS);
    rows.extend(scale_out_memory(&f, REPLICAS));
    rows.extend(scale_out_moves(&f, LEASE_SECS));
    rows
}

/// The scale-out rows of time: one replica against `replicas`, for
/// targets there before they start and targets created while they run.
fn scale_out_times(f: &super::scaleout::ScaleOutFigures, n: usize, replicas: usize) -> Vec<Row> {
    let s = "scale-out";
    let on = if f.cluster {
        "the given cluster"
    } else {
        "a sandbox"
    };
    vec![
        Row::new(
            s,
            format!("one replica: {n} targets (a child each) on {on} reconciled in"),
            f.one_secs,
            "s",
        ),
        Row::new(
            s,
            format!("{replicas} replicas: the same reconciled in"),
            f.shared_secs,
            "s",
        ),
        Row::new(
            s,
            "and each labelled for its replica (a lease after the ring, as labels follow decisions) in",
            f.shared_placed_secs,
            "s",
        ),
        Row::new(
            s,
            format!("of that, until the ring of all {replicas} was published"),
            f.ring_secs,
            "s",
        ),
        // Sharding must not make start-up slower than one replica (on one
        // machine the replicas share its CPUs, so it cannot be faster).
        Row::new(
            s,
            format!("start-up, targets there before the replicas: {replicas} replicas / one"),
            ratio(f.shared_secs, f.one_secs),
            "x",
        )
        .goal(Goal::AtMost(1.3)),
        Row::new(
            s,
            format!("{n} targets created while one replica runs (webhook on): decided in"),
            f.one_new_secs,
            "s",
        ),
        Row::new(
            s,
            format!("the same created while {replicas} replicas run: decided in"),
            f.shared_new_secs,
            "s",
        ),
        Row::new(s, "CPU of the replica meanwhile: one", f.one_new_cpu, "s"),
        Row::new(
            s,
            format!("CPU of the replicas meanwhile: {replicas}, together"),
            f.shared_new_cpu,
            "s",
        ),
        Row::new(
            s,
            "of those, placed at admission (labelled by the webhook, not the assigner)",
            f.placed_at_admission as f64,
            "targets",
        )
        .goal(Goal::AtLeast(n as f64)),
        Row::new(
            s,
            format!("targets created while the replicas run: {replicas} replicas / one"),
            ratio(f.shared_new_secs, f.one_new_secs),
            "x",
        )
        .goal(Goal::AtMost(1.0)),
    ]
}

/// The scale-out rows of memory: one replica against `replicas`, and the
/// largest replica against its bound.
fn scale_out_memory(f: &super::scaleout::ScaleOutFigures, replicas: usize) -> Vec<Row> {
    let s = "scale-out";
    let r = replicas as f64;
    let mut rows = vec![
        Row::new(s, "one replica holding them all: RSS", mb(f.one_rss), "MB"),
        Row::new(
            s,
            "one replica holding them all: live heap",
            mb(f.one_heap),
            "MB",
        ),
        Row::new(
            s,
            "a replica holding no target: RSS (the fixed part F)",
            mb(f.empty_rss),
            "MB",
        ),
    ];
    for (id, count, rss, heap) in &f.each {
        rows.push(Row::new(
            s,
            format!(
                "replica {id}, {count} targets: RSS (live heap {:.1} MB)",
                mb(*heap)
            ),
            mb(*rss),
            "MB",
        ));
    }
    let largest = f.each.iter().map(|e| e.2).max().unwrap_or(0);
    let bound = 1.2 * mb(f.one_rss) / r + mb(f.empty_rss);
    rows.push(
        Row::new(
            s,
            format!("largest replica's RSS (goal: 1.2/{replicas} of one + F)"),
            mb(largest),
            "MB",
        )
        .goal(Goal::AtMost((bound * 100.0).round() / 100.0)),
    );
    rows
}

/// `a / b`, or 0 where `b` is not measured.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The scale-out rows of the takeover and the moves, and whether two
/// replicas ever acted on one target at once.
fn scale_out_moves(f: &super::scaleout::ScaleOutFigures, lease_secs: u64) -> Vec<Row> {
    let s = "scale-out";
    vec![
        Row::new(
            s,
            format!(
                "kill -9 of a replica holding {} targets: from its last renewal until each was decided again by another (lease {lease_secs} s)",
                f.killed_targets
            ),
            f.takeover_secs,
            "s",
        )
        .goal(Goal::AtMost(lease_secs as f64)),
        Row::new(
            s,
            "the same, until the first of them was decided again",
            f.takeover_first_secs,
            "s",
        ),
        Row::new(
            s,
            "the same, until half of them were decided again",
            f.takeover_half_secs,
            "s",
        ),
        Row::new(
            s,
            "the same, until each was labelled for another",
            f.placed_secs,
            "s",
        ),
        Row::new(s, "decided again by another, from the kill", f.takeover_after_kill_secs, "s"),
        Row::new(s, "2 -> 4 replicas: targets moved", f.up_moved as f64, "targets"),
        Row::new(s, "2 -> 4 replicas: until each moved target was decided by its new replica", f.up_secs, "s"),
        Row::new(s, "4 -> 2 replicas: targets moved", f.down_moved as f64, "targets"),
        Row::new(s, "4 -> 2 replicas: until each moved target was decided by its new replica", f.down_secs, "s"),
        Row::new(
            s,
            "targets decided by two replicas within one second (whole run)",
            f.overlapping_decisions as f64,
            "targets",
        )
        .goal(Goal::AtMost(0.0)),
        Row::new(
            s,
            "targets written by two replicas within one second (whole run)",
            f.overlapping_writes as f64,
            "targets",
        )
        .goal(Goal::AtMost(0.0)),
    ]
}

/// The operator workload under Kopf against `runbook run`, each its own
/// process: wall, CPU and peak RSS, and Kopf / Runbook per round.
async fn peers(opts: &Options) -> Vec<Row> {
    use super::peers::{Measure, Who};
    let s = "peers";
    let python = match super::peers::kopf_python(opts.kopf_python.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("peers: not measured: {e}");
            return Vec::new();
        }
    };
    let (sizes, rounds): (&[usize], usize) = if opts.quick {
        (&[1_000], 2)
    } else {
        (&[1_000, 5_000], 5)
    };
    let mut rows = Vec::new();
    for &n in sizes {
        let f = match super::peers::measure(n, rounds, &opts.exe, &python).await {
            Ok(f) => f,
            Err(e) => {
                rows.push(Row::failed(s, format!("{n} Items: "), &e));
                continue;
            }
        };
        for who in Who::ALL {
            let label = match (who, f.tuned_without_uvloop) {
                (Who::KopfTuned, true) => "Kopf tuned (no uvloop installed)",
                _ => who.label(),
            };
            let what = format!("{label}, {n} Items, median of {rounds}");
            rows.push(Row::new(
                s,
                format!("{what}: until every Item Done"),
                f.median(who, Measure::Wall),
                "s",
            ));
            rows.push(Row::new(
                s,
                format!("{what}: CPU"),
                f.median(who, Measure::Cpu),
                "s",
            ));
            rows.push(Row::new(
                s,
                format!("{what}: peak RSS"),
                mb(f.median(who, Measure::Rss) as u64),
                "MB",
            ));
        }
        for who in [Who::Kopf, Who::KopfTuned] {
            for (m, name, goal) in [
                (Measure::Wall, "wall", None),
                (Measure::Cpu, "CPU", Some(20.0)),
                (Measure::Rss, "peak RSS", Some(2.0)),
            ] {
                let (median, low, high) = f.ratio(who, m);
                let row = Row::new(
                    s,
                    format!(
                        "{} / Runbook, {name}, {n} Items, median of {rounds} rounds (rounds {low:.1}-{high:.1})",
                        who.label()
                    ),
                    median,
                    "x",
                );
                // The goals hold against Kopf's defaults at 5,000 Items.
                rows.push(match goal {
                    Some(g) if who == Who::Kopf && n == 5_000 => row.goal(Goal::AtLeast(g)),
                    _ => row,
                });
            }
        }
    }
    rows
}

/// Run the chosen sections.
pub async fn run(opts: &Options) -> Vec<Row> {
    let mut rows = Vec::new();
    if opts.wants("decision") {
        let (p, q) = (opts.policies.clone(), opts.quick);
        rows.extend(
            tokio::task::spawn_blocking(move || decision(&p, q))
                .await
                .expect("decision benchmark"),
        );
    }
    if opts.wants("lookup") {
        let (p, q) = (opts.policies.clone(), opts.quick);
        rows.extend(
            tokio::task::spawn_blocking(move || lookup(&p, q))
                .await
                .expect("lookup benchmark"),
        );
    }
    if opts.wants("writes") {
        let p = opts.policies.clone();
        rows.extend(
            tokio::task::spawn_blocking(move || writes(&p))
                .await
                .expect("writes benchmark"),
        );
    }
    if opts.wants("operator") {
        rows.extend(operator(opts.targets(), if opts.quick { 1 } else { 5 }).await);
    }
    if opts.wants("reload") {
        rows.extend(reload(opts.quick, opts.targets()).await);
    }
    if opts.wants("admission") {
        rows.extend(admission(opts).await);
    }
    if opts.wants("memory") {
        let o = opts.clone();
        rows.extend(
            tokio::task::spawn_blocking(move || memory(&o))
                .await
                .expect("memory benchmark"),
        );
    }
    if opts.wants("scale") {
        rows.extend(scale(opts).await);
    }
    if opts.wants("containment") {
        rows.extend(containment(opts.quick).await);
    }
    if opts.wants("fairness") {
        rows.extend(fairness(opts.quick).await);
    }
    if opts.wants("metrics") {
        rows.extend(metrics(opts).await);
    }
    if opts.wants("scale-out") {
        rows.extend(scale_out(opts).await);
    }
    if opts.wants("peers") {
        rows.extend(peers(opts).await);
    }
    rows
}

/// The rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut out =
        String::from("| section | figure | value | goal | met |\n|---|---|---:|---|---|\n");
    for r in rows {
        let value = if r.value.abs() >= 100.0 || r.value == r.value.trunc() {
            format!("{:.0} {}", r.value, r.unit)
        } else {
            format!("{:.2} {}", r.value, r.unit)
        };
        let met = match r.met() {
            Some(true) => "yes",
            Some(false) => "**MISSED**",
            None => "",
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.section,
            r.figure,
            value,
            r.goal_text(),
            met
        ));
    }
    out
}

pub fn to_json(rows: &[Row]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "section": r.section, "figure": r.figure, "value": r.value, "unit": r.unit,
                    "goal": r.goal_text(), "met": r.met(),
                })
            })
            .collect(),
    )
}

/// The machine, for the record.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| format!("{:.0} GiB", kb as f64 / 1_048_576.0))
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, {mem}")
}
