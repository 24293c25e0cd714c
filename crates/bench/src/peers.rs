//! Peers: the operator benchmark's workload (each Item gets an owned
//! ConfigMap and `status.phase: Done`) under Kopf, the framework users
//! pick for operators in Python, against `runbook run`, each its own
//! process, one after the other on a sandbox API server served on
//! loopback (a fresh one per run, so that no run inherits another's
//! objects). Rounds are interleaved, so that a machine getting slower or
//! faster weighs on every contender alike; each figure of a contender is
//! taken from its own process: wall time from its start until the last
//! Item is Done, CPU time (user and system, every thread) and peak RSS.
//!
//! Kopf runs twice: as `pip install kopf` gives it (no uvloop, Kubernetes
//! events posted, progress in annotations, the default thread pool), and
//! tuned as its documentation suggests (`--quiet`, 16 workers for the
//! synchronous handler, progress kept in the status, uvloop).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::operator::{GROUP, done, populate};

/// The namespace of the Items.
const NS: &str = "peers";

/// How long after the work is done a contender's steady RSS is read.
const SETTLE: Duration = Duration::from_secs(2);

/// The Kopf operator a Kopf user writes for the workload: a creation
/// handler that makes the child with the Kubernetes client, adopted by
/// the Item, and sets the phase through Kopf's patch. Items that exist
/// when it starts are handled as created.
pub const KOPF_OPERATOR: &str = r#"import os

import kopf
import kubernetes

TUNED = os.environ.get("BENCH_KOPF_TUNED") == "1"
core = None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    global core
    kubernetes.config.load_kube_config()
    core = kubernetes.client.CoreV1Api()
    if TUNED:
        settings.execution.max_workers = 16
        settings.persistence.progress_storage = kopf.StatusProgressStorage()


@kopf.on.create("GROUP", "v1", "items")
def make_child(body, spec, name, namespace, patch, **_):
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-child"},
        "data": {"size": str(spec.get("size"))},
    }
    kopf.adopt(child, owner=body)
    try:
        core.create_namespaced_config_map(namespace, child)
    except kubernetes.client.ApiException as e:
        if e.status != 409:
            raise
    patch.status["phase"] = "Done"
"#;

/// Starts Kopf's command line; `BENCH_KOPF_NO_UVLOOP=1` hides uvloop, as
/// a plain `pip install kopf` has none.
const KOPF_LAUNCHER: &str = r#"import os, sys
if os.environ.get("BENCH_KOPF_NO_UVLOOP") == "1":
    sys.modules["uvloop"] = None
from kopf.cli import main
sys.argv[0] = "kopf"
main()
"#;

/// How to get Kopf, printed when it cannot be found.
pub const HOW_TO_INSTALL: &str = "python3 -m venv target/kopf && target/kopf/bin/pip install kopf kubernetes uvloop (found there from the workspace; elsewhere, give --kopf-python)";

/// Who runs the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Runbook,
    Kopf,
    KopfTuned,
}

impl Who {
    pub const ALL: [Who; 3] = [Who::Runbook, Who::Kopf, Who::KopfTuned];

    pub fn label(self) -> &'static str {
        match self {
            Who::Runbook => "Runbook",
            Who::Kopf => "Kopf defaults",
            Who::KopfTuned => "Kopf tuned",
        }
    }
}

/// One contender's run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Run {
    pub wall: Duration,
    pub cpu: Duration,
    pub peak_rss: u64,
    /// RSS a moment (`SETTLE`) after the last Item was Done.
    pub rss: u64,
}

/// Every run of one size, round by round, in `Who::ALL` order.
#[derive(Clone, Debug, Default)]
pub struct PeersFigures {
    pub items: usize,
    pub rounds: Vec<[Run; 3]>,
    /// The tuned Kopf ran without uvloop (not installed).
    pub tuned_without_uvloop: bool,
}

/// A figure of a run.
#[derive(Clone, Copy, Debug)]
pub enum Measure {
    Wall,
    Cpu,
    Rss,
}

impl Measure {
    fn of(self, r: &Run) -> f64 {
        match self {
            Measure::Wall => r.wall.as_secs_f64(),
            Measure::Cpu => r.cpu.as_secs_f64(),
            Measure::Rss => r.peak_rss as f64,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

impl PeersFigures {
    fn index(who: Who) -> usize {
        Who::ALL.iter().position(|w| *w == who).unwrap_or(0)
    }

    /// The median over the rounds of one contender's figure.
    pub fn median(&self, who: Who, m: Measure) -> f64 {
        let i = Self::index(who);
        median(self.rounds.iter().map(|r| m.of(&r[i])).collect())
    }

    /// Per round, `who`'s figure over Runbook's: the median, the lowest
    /// and the highest.
    pub fn ratio(&self, who: Who, m: Measure) -> (f64, f64, f64) {
        let i = Self::index(who);
        let per: Vec<f64> = self
            .rounds
            .iter()
            .map(|r| m.of(&r[i]) / m.of(&r[0]).max(1e-9))
            .collect();
        let low = per.iter().copied().fold(f64::INFINITY, f64::min);
        let high = per.iter().copied().fold(0.0, f64::max);
        (median(per), low, high)
    }
}

/// Where [`HOW_TO_INSTALL`] puts the Python with Kopf, relative to the
/// workspace (the directory `cargo run` runs in).
pub const KOPF_VENV_PYTHON: &str = "target/kopf/bin/python";

/// The Python to run Kopf with: `given`, else the one [`HOW_TO_INSTALL`]
/// makes (`target/kopf/bin/python`), else `python3`, the first with Kopf
/// and the Kubernetes client. `Err` says why none and how to install them.
pub fn kopf_python(given: Option<&Path>) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match given {
        Some(p) => vec![p.to_path_buf()],
        None => vec![PathBuf::from(KOPF_VENV_PYTHON), PathBuf::from("python3")],
    };
    let mut why = Vec::new();
    for python in candidates {
        let out = Command::new(&python)
            .args(["-c", "import kopf, kubernetes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match out {
            Ok(s) if s.success() => return Ok(python),
            Ok(_) => why.push(format!(
                "{} has no Kopf or no Kubernetes client",
                python.display()
            )),
            Err(e) => why.push(format!("{}: {e}", python.display())),
        }
    }
    Err(format!(
        "{}; install them: {HOW_TO_INSTALL}",
        why.join("; ")
    ))
}

fn has_uvloop(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import uvloop"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Clock ticks per second of `/proc/<pid>/stat` (asked once).
pub(crate) fn ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPU time of a process so far, every thread, user and system.
pub(crate) fn cpu_of(pid: u32, ticks: f64) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name, in parentheses, may hold spaces: fields are
    // counted after its closing one (utime and stime are the 14th and
    // 15th fields, the 12th and 13th after it).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let t = f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0);
    Duration::from_secs_f64(t / ticks)
}

/// A memory figure of a process (`VmHWM`, `VmRSS`), in bytes.
fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Where a run's files go: the kubeconfig, the policy, the Kopf operator.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("runbook-bench-peers-{}", std::process::id()));
        let policies = dir.join("policies");
        std::fs::create_dir_all(&policies).map_err(|e| format!("{}: {e}", dir.display()))?;
        let write = |path: PathBuf, text: &str| {
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
        };
        write(policies.join("item.yaml"), super::operator::POLICY)?;
        write(policies.join("item.rhai"), super::operator::SCRIPT)?;
        write(
            dir.join("kopf_items.py"),
            &KOPF_OPERATOR.replace("\"GROUP\"", &format!("\"{GROUP}\"")),
        )?;
        write(dir.join("kopf_launch.py"), KOPF_LAUNCHER)?;
        Ok(Self { dir })
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(who: Who, exe: &Path, python: &Path, files: &Files, kubeconfig: &Path) -> Child {
    let mut cmd = match who {
        Who::Runbook => {
            let mut c = Command::new(exe);
            c.args(["run", "--namespace", NS, "--leader-elect=false"])
                .args(["--policy-configmaps=false", "--webhook=false"])
                .args(["--metrics-addr", "127.0.0.1:0"])
                .arg("--policy-dir")
                .arg(files.dir.join("policies"));
            c
        }
        Who::Kopf | Who::KopfTuned => {
            let mut c = Command::new(python);
            c.arg(files.dir.join("kopf_launch.py"))
                .args(["run", "--standalone", "--namespace", NS])
                .arg(files.dir.join("kopf_items.py"));
            if who == Who::KopfTuned {
                c.arg("--quiet").env("BENCH_KOPF_TUNED", "1");
            } else {
                c.env("BENCH_KOPF_NO_UVLOOP", "1");
            }
            c
        }
    };
    // Its log goes to a file, read only if it fails: a pipe nobody reads
    // while it runs would stop it once full.
    let log = std::fs::File::create(files.dir.join("log")).expect("the contender's log");
    cmd.env("KUBECONFIG", kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting a contender")
}

/// The last lines a contender wrote, to say why it failed.
fn tail_of(files: &Files) -> String {
    let mut err = String::new();
    if let Ok(mut f) = std::fs::File::open(files.dir.join("log")) {
        let _ = f.read_to_string(&mut err);
    }
    let lines: Vec<&str> = err.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// One run of `who` over `n` Items on a fresh sandbox.
async fn run_one(
    who: Who,
    n: usize,
    exe: &Path,
    python: &Path,
    files: &Files,
) -> Result<Run, String> {
    let sandbox = runbook_sandbox::Sandbox::default();
    populate(&sandbox, NS, n);
    let served = sandbox
        .serve(0)
        .await
        .map_err(|e| format!("serving the sandbox: {e}"))?;
    let kubeconfig = files.dir.join("kubeconfig");
    std::fs::write(&kubeconfig, served.kubeconfig(NS))
        .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
    let ticks = ticks_per_second();
    let started = Instant::now();
    let mut child = start(who, exe, python, files, &kubeconfig);
    let pid = child.id();
    let limit = Duration::from_secs(120 + n as u64 / 10);
    let outcome = loop {
        let counting = Instant::now();
        if done(&sandbox, NS) >= n {
            break Ok(started.elapsed());
        }
        // Counting reads every Item, in this process, on the same cores:
        // at most a tenth of one, so that it does not slow the contender
        // more at 50,000 Items than at 1,000.
        let pause = (counting.elapsed() * 9).max(Duration::from_millis(20));
        if let Ok(Some(status)) = child.try_wait() {
            break Err(format!(
                "{} exited ({status}) before every Item was Done: {}",
                who.label(),
                tail_of(files)
            ));
        }
        if started.elapsed() > limit {
            break Err(format!(
                "{}: {} of {n} Items Done after {limit:?}",
                who.label(),
                done(&sandbox, NS)
            ));
        }
        tokio::time::sleep(pause).await;
    };
    let cpu = cpu_of(pid, ticks);
    let peak_rss = memory_of(pid, "VmHWM");
    // What it holds once the work is done and its allocator has given
    // back what the work took for a while.
    if outcome.is_ok() {
        tokio::time::sleep(SETTLE).await;
    }
    let rss = memory_of(pid, "VmRSS");
    let _ = child.kill();
    let _ = child.wait();
    let wall = outcome?;
    let children = children_made(&sandbox, n);
    if children < n {
        return Err(format!(
            "{}: every Item Done but only {children} of {n} children made",
            who.label()
        ));
    }
    Ok(Run {
        wall,
        cpu,
        peak_rss,
        rss,
    })
}

/// One run of `runbook run` (`exe run`) over `n` Items on a fresh sandbox.
pub async fn runbook_run(n: usize, exe: &Path) -> Result<Run, String> {
    let files = Files::new()?;
    run_one(Who::Runbook, n, exe, Path::new("python3"), &files).await
}

/// The Items' children in the namespace, owned by their Item.
fn children_made(sandbox: &runbook_sandbox::Sandbox, n: usize) -> usize {
    let store = sandbox.store();
    let Some(def) = store.def("", "configmaps") else {
        return 0;
    };
    let filter = runbook_sandbox::store::Filter {
        namespace: Some(NS.into()),
        ..Default::default()
    };
    let owned = memchr::memmem::Finder::new(br#""kind":"Item""#);
    let listed = store.list(&def, &filter, None, None);
    listed
        .map(|l| {
            l.items
                .iter()
                .filter(|b| owned.find(b).is_some())
                .count()
                .min(n)
        })
        .unwrap_or(0)
}

/// `rounds` interleaved rounds at `n` Items (the contenders' order turns
/// each round).
pub async fn measure(
    n: usize,
    rounds: usize,
    exe: &Path,
    python: &Path,
) -> Result<PeersFigures, String> {
    let files = Files::new()?;
    let mut f = PeersFigures {
        items: n,
        tuned_without_uvloop: !has_uvloop(python),
        ..Default::default()
    };
    for round in 0..rounds {
        let mut runs = [None; 3];
        for k in 0..3 {
            let i = (round + k) % 3;
            runs[i] = Some(run_one(Who::ALL[i], n, exe, python, &files).await?);
        }
        f.rounds.push(runs.map(|r| r.expect("every contender ran")));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(wall: f64, cpu: f64, rss: u64) -> Run {
        Run {
            wall: Duration::from_secs_f64(wall),
            cpu: Duration::from_secs_f64(cpu),
            peak_rss: rss,
            rss,
        }
    }

    #[test]
    fn ratios_are_taken_per_round_then_their_median() {
        let f = PeersFigures {
            items: 10,
            rounds: vec![
                [run(1.0, 1.0, 10), run(10.0, 20.0, 30), run(5.0, 9.0, 40)],
                [run(2.0, 1.0, 10), run(10.0, 10.0, 20), run(5.0, 9.0, 40)],
                [run(1.0, 2.0, 10), run(30.0, 60.0, 25), run(5.0, 9.0, 40)],
            ],
            tuned_without_uvloop: false,
        };
        // Kopf's CPU over Runbook's per round: 20, 10, 30.
        assert_eq!(f.ratio(Who::Kopf, Measure::Cpu), (20.0, 10.0, 30.0));
        assert_eq!(f.ratio(Who::Kopf, Measure::Rss), (2.5, 2.0, 3.0));
        assert_eq!(f.median(Who::Runbook, Measure::Wall), 1.0);
        assert_eq!(f.median(Who::KopfTuned, Measure::Cpu), 9.0);
        // Of an even count, the middle two's mean.
        let two = PeersFigures {
            rounds: f.rounds[..2].to_vec(),
            ..f.clone()
        };
        assert_eq!(two.ratio(Who::Kopf, Measure::Cpu), (15.0, 10.0, 20.0));
    }

    #[test]
    fn a_processs_cpu_and_peak_memory_are_read_from_proc() {
        let me = std::process::id();
        // Burn a little CPU, so that it shows.
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(cpu_of(me, ticks_per_second()) > Duration::ZERO);
        assert!(memory_of(me, "VmHWM") > 1024 * 1024);
        assert!(memory_of(me, "VmRSS") > 1024 * 1024);
        assert_eq!(memory_of(me, "VmNothing"), 0);
    }

    #[test]
    fn a_python_without_kopf_is_refused_with_how_to_install() {
        let err = kopf_python(Some(Path::new("/nonexistent/python"))).unwrap_err();
        assert!(err.contains("pip install kopf"), "{err}");
    }
}
