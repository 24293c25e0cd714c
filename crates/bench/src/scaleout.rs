//! Scale-out: the Item workload shared by sharded replicas (`--shards`),
//! each a process of its own, against one replica holding every target.
//!
//! The API server is a sandbox in a child process, or a real cluster
//! (`runbook bench --only scale-out --kubeconfig ...`). Each replica
//! prints a line for every action its decisions took (`J <ms> <result>
//! <item>`), from which this side tells when a target was decided again
//! after a takeover or a move, and whether two replicas decided or wrote
//! one target within the same second.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::{Api, Client};
use serde_json::json;

use super::operator::{item, item_crd, item_resource};
use runbook_core::shard::{DRAIN_LABEL, Ring, SHARD_LABEL, key};
use runbook_operator::runtime::OperatorConfig;
use runbook_operator::runtime::leader::LeaseConfig;
use runbook_operator::runtime::shard::none_match;
use runbook_operator::telemetry::journal::{Entry, Journal};

/// The namespaces of the run: one replica's, the shared targets', and an
/// empty one (what a replica costs with no target).
const ONE: &str = "scale-one";
const SHARED: &str = "scale-shards";
const EMPTY: &str = "scale-empty";
/// Where Items are created while the replicas run: one replica's, and
/// the sharded replicas'.
const ONE_NEW: &str = "scale-one-new";
const SHARED_NEW: &str = "scale-shards-new";
/// The ring's Lease, in the shared namespace.
const RING: &str = "bench-ring";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Prints every action on an Item (or its child) as a line. A reconcile
/// only queues the line: a thread of its own writes them, so that a
/// reader slow to drain the pipe (the bench, sharing the cores with the
/// API server) never holds up the decisions it measures. Each line
/// carries the time of its action, not the time it was read.
struct Printer {
    lines: std::sync::mpsc::Sender<String>,
    /// Lines queued and not yet written out.
    queued: Arc<std::sync::atomic::AtomicUsize>,
}

impl Printer {
    fn new() -> Self {
        use std::sync::atomic::Ordering;
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let written = queued.clone();
        std::thread::spawn(move || {
            let mut out = std::io::BufWriter::new(std::io::stdout());
            while let Ok(line) = rx.recv() {
                let mut n = 1;
                let _ = out.write_all(line.as_bytes());
                // Written out as soon as nothing more is waiting.
                while let Ok(line) = rx.try_recv() {
                    let _ = out.write_all(line.as_bytes());
                    n += 1;
                }
                let _ = out.flush();
                written.fetch_sub(n, Ordering::AcqRel);
            }
        });
        Self { lines: tx, queued }
    }

    /// Wait (a few seconds at most) until every line queued is written.
    async fn drained(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.queued.load(std::sync::atomic::Ordering::Acquire) > 0
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Journal for Printer {
    fn record(&self, e: Entry) {
        let (item, what) = match e.kind.as_str() {
            "Item" => (e.name.as_str(), "status"),
            "ConfigMap" => match e.name.strip_suffix("-child") {
                Some(n) => (n, "child"),
                None => return,
            },
            _ => return,
        };
        let line = format!("J {} {} {item} {what}\n", e.time.as_millisecond(), e.result);
        self.queued
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let _ = self.lines.send(line);
    }
}

/// The sandbox child: the Item CRD and `n` Items in each of the one
/// replica's and the shared namespace; prints its kubeconfig and serves
/// until its stdin closes.
pub async fn sandbox_child(n: usize) {
    let sandbox = runbook_sandbox::Sandbox::default();
    super::operator::populate(&sandbox, ONE, n);
    super::operator::populate(&sandbox, SHARED, n);
    for ns in [EMPTY, ONE_NEW, SHARED_NEW] {
        super::operator::populate(&sandbox, ns, 0);
    }
    let served = sandbox.serve(0).await.expect("serving the sandbox");
    let path = std::env::temp_dir().join(format!(
        "runbook-bench-scaleout-{}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(&path, served.kubeconfig("default")).expect("writing the kubeconfig");
    println!("KUBECONFIG {}", path.display());
    let _ = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        while std::io::stdin().lock().read_line(&mut line).unwrap_or(0) > 0 {
            line.clear();
        }
    })
    .await;
    let _ = std::fs::remove_file(&path);
}

/// A replica child: `kubeconfig namespace identity lease-seconds shards
/// webhook replicas` (`shards`, `webhook`: 1 or 0; `replicas`: how many
/// sharded replicas start together; with `webhook`, it serves the
/// authorship webhook on loopback for its namespace's Items, its
/// material shared with the namespace's other replicas). Prints `LEADING` once it acts, `J` lines as it
/// decides; answers `rss` with `RSS <rss> <live heap>`; `stop` shuts it
/// down gracefully (its Lease released).
pub async fn replica_child(args: &[String]) {
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let client = super::memory::client_of(Path::new(&arg(0))).await;
    let namespace = arg(1);
    let identity = arg(2);
    let lease: u64 = arg(3).parse().unwrap_or(10);
    let shards = arg(4) == "1";
    // How many replicas start together (`--shard-replicas`).
    let expected: Option<usize> = arg(6).parse().ok();
    let webhook = (arg(5) == "1").then(|| runbook_operator::runtime::WebhookConfig {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        endpoint: None,
        configuration: format!("runbook-bench-{namespace}"),
        secret: Some((namespace.clone(), "runbook-bench-webhook".into())),
        created_with: Some(json!({"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": namespace.clone()}}})),
    });
    let config = OperatorConfig {
        webhook,
        namespace: Some(namespace.clone()),
        concurrency: 16,
        identity: identity.clone(),
        shards,
        shard_replicas: expected.filter(|_| shards),
        lease: shards.then(|| LeaseConfig {
            namespace: namespace.clone(),
            name: RING.into(),
            identity: identity.clone(),
            duration: Duration::from_secs(lease),
            renew_every: Duration::from_secs(lease) / 5,
        }),
        ..Default::default()
    };
    let op = Arc::new(super::operator::runbook_operator_configured(
        client,
        config,
        &[],
    ));
    let printer = Arc::new(Printer::new());
    op.ctx.set_journal(printer.clone());
    let started = op.clone();
    // As `runbook run` does: start, then follow the Lease (and, sharded,
    // the ring's gone members) until stopped.
    tokio::spawn(async move {
        started.start().await.expect("the replica starts");
        println!("LEADING");
        started.follow_leadership().await;
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    while let Some(line) = rx.recv().await {
        match line.trim() {
            "rss" => println!(
                "RSS {} {}",
                super::memory::status_kb("VmRSS:") * 1024,
                runbook_sys::alloc::live()
            ),
            "stop" => break,
            _ => {}
        }
    }
    op.shutdown(Duration::from_secs(10)).await;
    printer.drained().await;
    println!("STOPPED");
}

/// Per Item: (ms since the epoch, wrote) of each action on it.
type Actions = HashMap<String, Vec<(i64, bool)>>;

/// What one replica child said.
#[derive(Default)]
struct Heard {
    leading: bool,
    rss: Option<(u64, u64)>,
    stopped: bool,
    actions: Actions,
    /// Items whose status it wrote.
    done: std::collections::HashSet<String>,
}

struct Replica {
    id: String,
    child: Child,
    stdin: Option<ChildStdin>,
    heard: Arc<Mutex<Heard>>,
}

impl Replica {
    fn start(
        exe: &Path,
        args: &[String],
        kubeconfig: &Path,
        ns: &str,
        id: &str,
        (lease, expected): (u64, usize),
        (shards, webhook): (bool, bool),
    ) -> Self {
        let flag = |on: bool| if on { "1" } else { "0" };
        let mut child = Command::new(exe)
            .args(args)
            .args([
                "replica",
                &kubeconfig.display().to_string(),
                ns,
                id,
                &lease.to_string(),
                flag(shards),
                flag(webhook),
                &expected.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting a replica");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let heard = Arc::new(Mutex::new(Heard::default()));
        let h = heard.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let mut h = runbook_core::util::lock(&h);
                let mut w = line.split_whitespace();
                match w.next() {
                    Some("J") => {
                        let (Some(ms), Some(result), Some(item)) = (w.next(), w.next(), w.next())
                        else {
                            continue;
                        };
                        let ms: i64 = ms.parse().unwrap_or(0);
                        if result == "ok" && w.next() == Some("status") {
                            h.done.insert(item.to_string());
                        }
                        h.actions
                            .entry(item.to_string())
                            .or_default()
                            .push((ms, result == "ok"));
                    }
                    Some("LEADING") => h.leading = true,
                    Some("RSS") => {
                        let mut num = || w.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                        h.rss = Some((num(), num()));
                    }
                    Some("STOPPED") => h.stopped = true,
                    _ => {}
                }
            }
        });
        Self {
            id: id.into(),
            stdin: child.stdin.take(),
            child,
            heard,
        }
    }

    fn heard(&self) -> std::sync::MutexGuard<'_, Heard> {
        runbook_core::util::lock(&self.heard)
    }

    fn say(&mut self, what: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{what}");
        }
    }

    /// Its RSS and live heap, asked now.
    async fn rss(&mut self) -> (u64, u64) {
        self.heard().rss = None;
        self.say("rss");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(r) = self.heard().rss {
                return r;
            }
            if Instant::now() > deadline {
                return (0, 0);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Leave gracefully and wait for the process to end.
    async fn stop(&mut self) {
        self.say("stop");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.heard().stopped && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stdin = None;
        let _ = self.child.wait();
    }

    /// When it first acted on `item` after `ms`.
    fn first_after(&self, item: &str, ms: i64) -> Option<i64> {
        self.heard()
            .actions
            .get(item)
            .and_then(|a| a.iter().map(|(t, _)| *t).filter(|t| *t > ms).min())
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The figures of one run.
#[derive(Clone, Debug, Default)]
pub struct ScaleOutFigures {
    pub targets: usize,
    pub replicas: usize,
    pub lease_secs: u64,
    /// One replica holding every target: seconds until all reconciled,
    /// steady RSS and live heap.
    pub one_secs: f64,
    pub one_rss: u64,
    pub one_heap: u64,
    /// A replica with no target at all.
    pub empty_rss: u64,
    pub empty_heap: u64,
    /// The sharded replicas: seconds until all reconciled, until all
    /// labelled for their places too, and each one's targets, RSS and
    /// live heap.
    pub shared_secs: f64,
    pub shared_placed_secs: f64,
    /// Of that, until the ring of every replica was published.
    pub ring_secs: f64,
    pub each: Vec<(String, usize, u64, u64)>,
    /// The killed replica's targets, and the seconds from its last renewal
    /// (and from the kill) until each was decided again by another.
    pub killed_targets: usize,
    /// From its last renewal until its targets were all placed on others.
    pub placed_secs: f64,
    pub takeover_secs: f64,
    pub takeover_after_kill_secs: f64,
    /// From its last renewal until the first of its targets, and half of
    /// them, were decided again (the spread of the takeover).
    pub takeover_first_secs: f64,
    pub takeover_half_secs: f64,
    /// 2 -> 4 and 4 -> 2 replicas: targets moved, seconds until settled.
    pub up_moved: usize,
    pub up_secs: f64,
    pub down_moved: usize,
    pub down_secs: f64,
    /// Targets decided (and written) by two replicas within one second.
    pub overlapping_decisions: usize,
    pub overlapping_writes: usize,
    /// Items created while the replicas run (the authorship webhook on):
    /// seconds until one replica, and the sharded ones, decided each; and
    /// how many of the sharded ones' were placed at admission.
    pub one_new_secs: f64,
    pub shared_new_secs: f64,
    pub placed_at_admission: usize,
    /// CPU seconds the replicas (all of them together) spent meanwhile.
    pub one_new_cpu: f64,
    pub shared_new_cpu: f64,
    /// Where it ran.
    pub cluster: bool,
}

/// The Items of a namespace, by their metadata (a list of what the
/// replicas hold costs the API server little): name, shard label,
/// draining.
async fn items(client: &Client, ns: &str) -> Vec<(String, Option<String>, bool)> {
    metas(client, ns)
        .await
        .into_iter()
        .map(|m| {
            let labels = m.labels.unwrap_or_default();
            (
                m.name.unwrap_or_default(),
                labels.get(SHARD_LABEL).cloned(),
                labels.contains_key(DRAIN_LABEL),
            )
        })
        .collect()
}

/// The metadata of every Item of `ns`, 5,000 a page (as far as the API
/// server answers).
async fn metas(client: &Client, ns: &str) -> Vec<kube::api::ObjectMeta> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &item_resource());
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(5_000);
    loop {
        let Ok(page) = api.list_metadata(&params).await else {
            return out;
        };
        out.extend(page.items.into_iter().map(|o| o.metadata));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return out,
        }
    }
}

/// Wait (up to `limit`) until every replica together wrote the status of
/// `n` Items (their first reconcile), as their journals say.
async fn reconciled(replicas: &[Replica], n: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let mut done = std::collections::HashSet::new();
        for r in replicas {
            done.extend(r.heard().done.iter().cloned());
        }
        if done.len() >= n {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait (up to `limit`) until every Item of the shared namespace is
/// placed on the ring of `live`. Only once none is unplaced, draining or
/// held by a member not in `live` (each asked for one at a time, cheap
/// for the API server) are they all listed to check each one's place.
async fn placed_on(
    client: &Client,
    (ns, live): (&str, &[&str]),
    limit: Duration,
    every: Duration,
) -> bool {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &item_resource());
    let waiting = [
        format!("!{SHARD_LABEL}"),
        DRAIN_LABEL.to_string(),
        format!("{SHARD_LABEL} notin ({})", live.join(",")),
    ];
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let mut none_wait = true;
        for selector in &waiting {
            if !none_match(&api, selector).await {
                none_wait = false;
                break;
            }
        }
        if none_wait && placed(&items(client, ns).await, ns, live) {
            return true;
        }
        tokio::time::sleep(every).await;
    }
    false
}

/// Wait (up to `limit`) until no Item of the shared namespace is labelled
/// for `member`.
async fn none_labelled(client: &Client, member: &str, limit: Duration) -> bool {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), SHARED, &item_resource());
    let selector = format!("{SHARD_LABEL}={member}");
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if none_match(&api, &selector).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Every Item of `ns` labelled for its place among `live`, none draining.
fn placed(items: &[(String, Option<String>, bool)], ns: &str, live: &[&str]) -> bool {
    let ring = Ring::new(live.iter().copied());
    items.iter().all(|(name, shard, draining)| {
        let want = ring.owner(&key(super::operator::GROUP, "Item", ns, name));
        !draining && shard.as_deref() == want
    })
}

/// Install the CRDs and `n` Items in each namespace of a real cluster.
async fn populate_cluster(client: &Client, n: usize) {
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource {
            group: "apiextensions.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            plural: "customresourcedefinitions".into(),
        },
    );
    let state = serde_json::to_value(runbook_core::crd::state::crd()).expect("a CRD");
    for crd in [item_crd(), state] {
        let name = crd["metadata"]["name"].as_str().unwrap_or("").to_string();
        let crd: DynamicObject = serde_json::from_value(crd).expect("a CRD");
        crds.patch(
            &name,
            &PatchParams::apply("runbook-bench").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("installing CRD {name}: {e}"));
    }
    let items_api = |ns: &str| -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), ns, &item_resource())
    };
    // Served once established.
    let deadline = Instant::now() + Duration::from_secs(60);
    while items_api(ONE)
        .list(&ListParams::default().limit(1))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the Item CRD is not served");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for ns in NAMESPACES {
        let body = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns");
        let _ = nss.create(&Default::default(), &body).await;
        if [ONE, SHARED].contains(&ns) {
            create_items(client, ns, n).await;
        }
    }
}

/// Every namespace of the run.
const NAMESPACES: [&str; 5] = [ONE, SHARED, EMPTY, ONE_NEW, SHARED_NEW];

/// Create `n` Items in `ns`, 32 at a time, each tried up to 5 times.
async fn create_items(client: &Client, ns: &str, n: usize) {
    use futures::StreamExt;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &item_resource());
    futures::stream::iter(0..n)
        .for_each_concurrent(32, |i| {
            let api = api.clone();
            async move {
                let obj: DynamicObject = serde_json::from_value(item(ns, i)).expect("an Item");
                for _ in 0..5 {
                    match api.create(&Default::default(), &obj).await {
                        Ok(_) => return,
                        Err(kube::Error::Api(s)) if s.code == 409 => return,
                        Err(e) => {
                            eprintln!("scale-out: creating an Item in {ns}: {e}");
                            tokio::time::sleep(Duration::from_millis(200)).await
                        }
                    }
                }
            }
        })
        .await;
}

/// CPU seconds the replica processes have spent so far, together.
fn cpu(replicas: &[Replica]) -> f64 {
    let ticks = super::peers::ticks_per_second();
    replicas
        .iter()
        .map(|r| super::peers::cpu_of(r.child.id(), ticks).as_secs_f64())
        .sum()
}

/// How many members the ring published in `ns` holds.
async fn published_members(client: &Client, ns: &str) -> usize {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    leases
        .get(&runbook_operator::runtime::shard::published_name(RING))
        .await
        .ok()
        .and_then(|l| {
            let members = l.metadata.annotations?;
            let members = members.get(runbook_operator::runtime::shard::MEMBERS_ANNOTATION)?;
            Some(members.split(',').filter(|m| !m.is_empty()).count())
        })
        .unwrap_or(0)
}

/// How many Items of `ns` carry the mark of a placement at admission.
async fn placed_at_admission(client: &Client, ns: &str) -> usize {
    metas(client, ns)
        .await
        .iter()
        .filter(|m| {
            m.annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(runbook_core::shard::PLACED_ANNOTATION))
        })
        .count()
}

/// Delete what a real-cluster run made.
async fn clean_cluster(client: &Client) {
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let hooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(client.clone());
    for ns in NAMESPACES {
        let _ = nss.delete(ns, &Default::default()).await;
        let _ = hooks
            .delete(&format!("runbook-bench-{ns}"), &Default::default())
            .await;
    }
}

/// The last renewal of a member's Lease, in ms since the epoch.
async fn last_renewal(client: &Client, member: &str) -> Option<i64> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), SHARED);
    let name = format!("{RING}-member-{member}");
    for _ in 0..5 {
        match leases.get(&name).await {
            Ok(l) => return Some(l.spec?.renew_time?.0.as_millisecond()),
            Err(e) => {
                eprintln!("scale-out: reading the Lease {name}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    None
}

/// Wait until every Item in `moved` was acted on after `ms` by one of
/// `replicas` (only the replica holding a target decides for it); the
/// time (ms since the epoch) each was first acted on, sorted. The figures
/// come from the times the replicas recorded, not from when this side
/// read them.
async fn decided_again(
    replicas: &[Replica],
    moved: &BTreeSet<String>,
    ms: i64,
    limit: Duration,
) -> Option<Vec<i64>> {
    let deadline = Instant::now() + limit;
    loop {
        let firsts: Option<Vec<i64>> = moved
            .iter()
            .map(|n| replicas.iter().filter_map(|r| r.first_after(n, ms)).min())
            .collect();
        if let Some(mut firsts) = firsts {
            firsts.sort_unstable();
            return Some(firsts);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Once the targets are placed on the ring of `running`, those whose
/// label changed since `before`, each decided by its new replica.
/// The longest a wait may take, and how often it looks.
#[derive(Clone, Copy)]
struct Bounds {
    limit: Duration,
    poll: Duration,
}

async fn moved_and_decided(
    client: &Client,
    running: &[Replica],
    before: &BTreeMap<String, Option<String>>,
    since: i64,
    bounds: Bounds,
) -> Result<(BTreeSet<String>, i64), String> {
    let Bounds { limit, poll } = bounds;
    let ids: Vec<String> = running.iter().map(|r| r.id.clone()).collect();
    let live: Vec<&str> = ids.iter().map(String::as_str).collect();
    if !placed_on(client, (SHARED, &live), limit, poll).await {
        return Err(format!("{live:?} did not share the targets"));
    }
    let moved: BTreeSet<String> = labels(client)
        .await
        .into_iter()
        .filter(|(n, s)| before.get(n) != Some(s))
        .map(|(n, _)| n)
        .collect();
    let Some(firsts) = decided_again(running, &moved, since, limit).await else {
        return Err("the targets moved were not decided by their new replicas".into());
    };
    Ok((moved, firsts.last().copied().unwrap_or(since)))
}

/// The labels of the shared Items now.
async fn labels(client: &Client) -> BTreeMap<String, Option<String>> {
    items(client, SHARED)
        .await
        .into_iter()
        .map(|(n, s, _)| (n, s))
        .collect()
}

/// Targets acted on by two replicas within one second: (any action,
/// writes only).
fn overlaps(all: &[(String, Actions)]) -> (usize, usize) {
    let mut by_item: HashMap<&str, Vec<(i64, bool, usize)>> = HashMap::new();
    for (r, (_, actions)) in all.iter().enumerate() {
        for (item, list) in actions {
            for (t, wrote) in list {
                by_item
                    .entry(item.as_str())
                    .or_default()
                    .push((*t, *wrote, r));
            }
        }
    }
    let (mut decided, mut wrote) = (0, 0);
    for list in by_item.values_mut() {
        list.sort();
        let close = |only_writes: bool| {
            let l: Vec<&(i64, bool, usize)> =
                list.iter().filter(|(_, w, _)| *w || !only_writes).collect();
            l.windows(2)
                .any(|w| w[0].2 != w[1].2 && w[1].0 - w[0].0 < 1_000)
        };
        let both = close(false);
        if both && decided < 3 {
            let told: Vec<String> = list
                .iter()
                .map(|(t, w, r)| format!("{}@{t}{}", all[*r].0, if *w { "+" } else { "" }))
                .collect();
            eprintln!(
                "scale-out: acted on by two replicas within a second: {}",
                told.join(" ")
            );
        }
        decided += usize::from(both);
        wrote += usize::from(close(true));
    }
    (decided, wrote)
}

/// Where each target is placed: its shard label, by target name.
type Held = BTreeMap<String, Option<String>>;

/// What every phase of the measurement uses: how to start a replica, the
/// cluster's client, and the bounds of each wait.
struct Bench<'a> {
    exe: &'a Path,
    args: &'a [String],
    kubeconfig: PathBuf,
    client: Client,
    lease_secs: u64,
    /// The sharded replicas started together (each told so, as
    /// `--shard-replicas` tells it).
    replicas: usize,
    /// How often the bench looks (cheap looks, see `placed_on`, so as
    /// often on a real cluster).
    poll: Duration,
    /// The longest any step may take.
    limit: Duration,
    /// Quiet time before a step starts: a target written just before its
    /// replica leaves is otherwise written by the next one less than a
    /// second later, one after the other.
    settle: Duration,
}

impl Bench<'_> {
    fn start(&self, ns: &str, id: &str, shards: bool) -> Replica {
        self.start_with(ns, id, (shards, false))
    }

    /// A replica; `(shards, webhook)`: sharded, serving the authorship
    /// webhook.
    fn start_with(&self, ns: &str, id: &str, flags: (bool, bool)) -> Replica {
        Replica::start(
            self.exe,
            self.args,
            &self.kubeconfig,
            ns,
            id,
            (self.lease_secs, self.replicas),
            flags,
        )
    }

    /// Items created while the replicas run, each replica serving the
    /// authorship webhook: one replica, then the sharded replicas once
    /// their ring is published (the webhook places each new Item). From
    /// the first creation until each Item was decided.
    async fn created_while_running(&self, f: &mut ScaleOutFigures) -> Result<(), String> {
        let mut one = self.start_with(ONE_NEW, "one-new", (false, true));
        while !one.heard().leading {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(self.settle).await;
        let cpu0 = cpu(std::slice::from_ref(&one));
        let t0 = Instant::now();
        create_items(&self.client, ONE_NEW, f.targets).await;
        eprintln!(
            "scale-out: {} Items created while one replica runs, in {:.1} s",
            f.targets,
            t0.elapsed().as_secs_f64()
        );
        if !reconciled(std::slice::from_ref(&one), f.targets, self.limit).await {
            return Err("one replica did not decide every Item created".into());
        }
        f.one_new_secs = t0.elapsed().as_secs_f64();
        f.one_new_cpu = cpu(std::slice::from_ref(&one)) - cpu0;
        one.stop().await;
        let mut running: Vec<Replica> = (0..f.replicas)
            .map(|i| self.start_with(SHARED_NEW, &format!("n{i}"), (true, true)))
            .collect();
        let deadline = Instant::now() + self.limit;
        while published_members(&self.client, SHARED_NEW).await != f.replicas {
            if Instant::now() > deadline {
                return Err("the sharded replicas published no ring of them all".into());
            }
            tokio::time::sleep(self.poll).await;
        }
        // Each replica reads the published ring at its next look.
        tokio::time::sleep(self.settle).await;
        let cpu0 = cpu(&running);
        let t0 = Instant::now();
        create_items(&self.client, SHARED_NEW, f.targets).await;
        eprintln!(
            "scale-out: {} Items created while {} replicas run, in {:.1} s",
            f.targets,
            f.replicas,
            t0.elapsed().as_secs_f64()
        );
        let ids: Vec<String> = running.iter().map(|r| r.id.clone()).collect();
        let live: Vec<&str> = ids.iter().map(String::as_str).collect();
        if !reconciled(&running, f.targets, self.limit).await {
            return Err("the sharded replicas did not decide every Item created".into());
        }
        f.shared_new_secs = t0.elapsed().as_secs_f64();
        f.shared_new_cpu = cpu(&running) - cpu0;
        if !placed_on(&self.client, (SHARED_NEW, &live), self.limit, self.poll).await {
            return Err("the Items created were not placed on the ring".into());
        }
        f.placed_at_admission = placed_at_admission(&self.client, SHARED_NEW).await;
        for r in running.iter_mut() {
            r.stop().await;
        }
        Ok(())
    }

    /// A replica with nothing to hold (the fixed part of a replica's
    /// memory), then one replica holding every target.
    async fn alone(&self, f: &mut ScaleOutFigures) -> Result<(), String> {
        let mut empty = self.start(EMPTY, "empty", false);
        while !empty.heard().leading {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(self.settle).await;
        (f.empty_rss, f.empty_heap) = empty.rss().await;
        empty.stop().await;
        let t0 = Instant::now();
        let mut one = self.start(ONE, "one", false);
        if !reconciled(std::slice::from_ref(&one), f.targets, self.limit).await {
            return Err("one replica did not reconcile every target".into());
        }
        f.one_secs = t0.elapsed().as_secs_f64();
        tokio::time::sleep(self.settle).await;
        (f.one_rss, f.one_heap) = one.rss().await;
        one.stop().await;
        Ok(())
    }

    /// The replicas sharing the targets: until all are reconciled and
    /// placed, and what each then holds.
    async fn shared(&self, f: &mut ScaleOutFigures) -> Result<(Vec<Replica>, Held), String> {
        let t0 = Instant::now();
        let mut running: Vec<Replica> = (0..f.replicas)
            .map(|i| self.start(SHARED, &format!("r{i}"), true))
            .collect();
        let ids: Vec<String> = running.iter().map(|r| r.id.clone()).collect();
        let live: Vec<&str> = ids.iter().map(String::as_str).collect();
        // Where the time goes: until the ring of them all is published
        // (the replicas join, then settle), then the labels and decisions.
        let deadline = Instant::now() + self.limit;
        while published_members(&self.client, SHARED).await < f.replicas
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        f.ring_secs = t0.elapsed().as_secs_f64();
        // Decided where the ring places them first; their labels follow.
        if !reconciled(&running, f.targets, self.limit).await {
            return Err("the replicas did not reconcile every target".into());
        }
        f.shared_secs = t0.elapsed().as_secs_f64();
        if !placed_on(&self.client, (SHARED, &live), self.limit, self.poll).await {
            return Err("the replicas did not place every target".into());
        }
        f.shared_placed_secs = t0.elapsed().as_secs_f64();
        tokio::time::sleep(self.settle).await;
        let held = labels(&self.client).await;
        for r in running.iter_mut() {
            let (rss, heap) = r.rss().await;
            let count = held
                .values()
                .filter(|s| s.as_deref() == Some(&r.id))
                .count();
            f.each.push((r.id.clone(), count, rss, heap));
        }
        Ok((running, held))
    }

    /// kill -9 of a replica that does not assign (`assigner` does): until
    /// its targets (as `held` places them) are decided again by the
    /// others, and placed on them.
    async fn kill_one(
        &self,
        f: &mut ScaleOutFigures,
        running: &mut Vec<Replica>,
        held: &Held,
        assigner: &str,
    ) -> Result<Replica, String> {
        let victim = running
            .iter()
            .position(|r| r.id != assigner)
            .ok_or("no replica but the assigner")?;
        let victim_id = running[victim].id.clone();
        let theirs: BTreeSet<String> = held
            .iter()
            .filter(|(_, s)| s.as_deref() == Some(&victim_id))
            .map(|(n, _)| n.clone())
            .collect();
        f.killed_targets = theirs.len();
        // Its last renewal is no older than the one read just before the
        // kill; read again after it, as it may have renewed meanwhile.
        let before = last_renewal(&self.client, &victim_id).await;
        let _ = running[victim].child.kill();
        let killed_at = now_ms();
        let renewed = match last_renewal(&self.client, &victim_id).await.or(before) {
            Some(t) => t,
            None => {
                eprintln!(
                    "scale-out: {victim_id}'s last renewal unknown; the takeover is timed from the kill"
                );
                killed_at
            }
        };
        let mut dead = running.remove(victim);
        let _ = dead.child.wait();
        // Decided by the others (before they are labelled for them: the
        // published ring places a gone member's targets).
        let Some(firsts) = decided_again(running, &theirs, killed_at, self.limit).await else {
            return Err(format!("the targets of {victim_id} were not taken over"));
        };
        let since = |from: i64, t: Option<&i64>| t.map_or(0.0, |t| (t - from) as f64 / 1000.0);
        f.takeover_after_kill_secs = since(killed_at, firsts.last());
        f.takeover_secs = since(renewed, firsts.last());
        f.takeover_first_secs = since(renewed, firsts.first());
        f.takeover_half_secs = since(renewed, firsts.get(firsts.len() / 2));
        // Placed on the others: no target labelled for it any more (asked
        // for one at a time, so that looking costs the API server next to
        // nothing while it carries the move).
        if !none_labelled(&self.client, &victim_id, self.limit).await {
            return Err(format!("the targets of {victim_id} were not placed again"));
        }
        f.placed_secs = (now_ms() - renewed) as f64 / 1000.0;
        tokio::time::sleep(self.settle).await;
        Ok(dead)
    }

    /// Down to two replicas, then up to four and down to two again: the
    /// targets each move moved, and until each was decided by its new
    /// replica. The replicas stopped go to `gone`.
    async fn resize(
        &self,
        f: &mut ScaleOutFigures,
        running: &mut Vec<Replica>,
        gone: &mut Vec<Replica>,
        assigner: &str,
    ) -> Result<(), String> {
        while running.len() > 2 {
            let i = running
                .iter()
                .position(|r| r.id != assigner)
                .unwrap_or(running.len() - 1);
            let mut r = running.remove(i);
            r.stop().await;
            gone.push(r);
        }
        let now_ids: Vec<String> = running.iter().map(|r| r.id.clone()).collect();
        let live: Vec<&str> = now_ids.iter().map(String::as_str).collect();
        if !placed_on(&self.client, (SHARED, &live), self.limit, self.poll).await {
            return Err("two replicas did not take every target".into());
        }
        tokio::time::sleep(self.settle).await;
        let before = labels(&self.client).await;
        let since = now_ms();
        for i in 0..2 {
            running.push(self.start(SHARED, &format!("r{}", f.replicas + i), true));
        }
        let (moved, last) = self
            .moved_and_decided(running, &before, since)
            .await
            .map_err(|e| format!("2 -> 4 replicas: {e}"))?;
        f.up_moved = moved.len();
        f.up_secs = (last - since) as f64 / 1000.0;
        tokio::time::sleep(self.settle).await;
        let before = labels(&self.client).await;
        let since = now_ms();
        for _ in 0..2 {
            if let Some(mut r) = running.pop() {
                r.stop().await;
                gone.push(r);
            }
        }
        let (moved, last) = self
            .moved_and_decided(running, &before, since)
            .await
            .map_err(|e| format!("4 -> 2 replicas: {e}"))?;
        f.down_moved = moved.len();
        f.down_secs = (last - since) as f64 / 1000.0;
        Ok(())
    }

    async fn moved_and_decided(
        &self,
        running: &[Replica],
        before: &BTreeMap<String, Option<String>>,
        since: i64,
    ) -> Result<(BTreeSet<String>, i64), String> {
        let bounds = Bounds {
            limit: self.limit,
            poll: self.poll,
        };
        moved_and_decided(&self.client, running, before, since, bounds).await
    }
}

/// Start the sandbox the replicas share (this program in its
/// `scaleout-sandbox` role), and read the kubeconfig it serves.
fn start_sandbox(exe: &Path, args: &[String], n: usize) -> Result<(Child, PathBuf), String> {
    let mut child = Command::new(exe)
        .args(args)
        .args(["scaleout-sandbox", &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the sandbox: {e}"))?;
    let stdout = child.stdout.take().ok_or("the sandbox has no stdout")?;
    let mut out = BufReader::new(stdout);
    let mut line = String::new();
    while !line.starts_with("KUBECONFIG ") {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            return Err("the sandbox exited before serving".into());
        }
    }
    Ok((
        child,
        PathBuf::from(line.trim().trim_start_matches("KUBECONFIG ")),
    ))
}

/// Empty a real cluster of an earlier run and make the targets.
async fn prepare_cluster(client: &Client, n: usize) {
    clean_cluster(client).await;
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    // Namespaces from an earlier run are gone before this one starts.
    let deadline = Instant::now() + Duration::from_secs(600);
    for ns in NAMESPACES {
        while nss.get_opt(ns).await.ok().flatten().is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    populate_cluster(client, n).await;
}

/// Run the whole measurement: `exe args` starts this program in a child
/// role; `cluster`, a real cluster's kubeconfig, instead of a sandbox.
pub async fn measure(
    exe: &Path,
    args: &[String],
    n: usize,
    replicas: usize,
    lease_secs: u64,
    cluster: Option<&Path>,
) -> Result<ScaleOutFigures, String> {
    let mut f = ScaleOutFigures {
        targets: n,
        replicas,
        lease_secs,
        cluster: cluster.is_some(),
        ..Default::default()
    };
    let (server, kubeconfig) = match cluster {
        Some(path) => (None, path.to_path_buf()),
        None => {
            let (child, kubeconfig) = start_sandbox(exe, args, n)?;
            (Some(child), kubeconfig)
        }
    };
    let client = super::memory::client_of(&kubeconfig).await;
    if cluster.is_some() {
        prepare_cluster(&client, n).await;
    }
    let bench = Bench {
        exe,
        args,
        kubeconfig,
        client: client.clone(),
        lease_secs,
        replicas,
        poll: Duration::from_millis(250),
        limit: Duration::from_secs(1800),
        settle: Duration::from_secs(3),
    };
    bench.alone(&mut f).await?;
    let (mut running, held) = bench.shared(&mut f).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), SHARED);
    let assigner = leases
        .get(RING)
        .await
        .ok()
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_default();
    let dead = bench
        .kill_one(&mut f, &mut running, &held, &assigner)
        .await?;
    let mut gone = vec![dead];
    bench
        .resize(&mut f, &mut running, &mut gone, &assigner)
        .await?;
    for r in running.iter_mut() {
        r.stop().await;
    }
    bench.created_while_running(&mut f).await?;
    let all: Vec<(String, Actions)> = running
        .iter()
        .chain(gone.iter())
        .map(|r| (r.id.clone(), std::mem::take(&mut r.heard().actions)))
        .collect();
    (f.overlapping_decisions, f.overlapping_writes) = overlaps(&all);
    if cluster.is_some() {
        clean_cluster(&client).await;
    }
    if let Some(mut s) = server {
        let _ = s.kill();
        let _ = s.wait();
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_replicas_acting_on_a_target_within_a_second_are_counted() {
        let actions = |list: &[(&str, i64, bool)]| -> Actions {
            let mut m: Actions = HashMap::new();
            for (item, t, w) in list {
                m.entry(item.to_string()).or_default().push((*t, *w));
            }
            m
        };
        let all = vec![
            (
                "a".to_string(),
                actions(&[("x", 1_000, true), ("y", 1_000, false), ("z", 1_000, true)]),
            ),
            (
                "b".to_string(),
                // x: written by both 0.5 s apart; y: decided (not written)
                // by both; z: taken over 5 s later.
                actions(&[("x", 1_500, true), ("y", 1_200, false), ("z", 6_000, true)]),
            ),
        ];
        assert_eq!(overlaps(&all), (2, 1));
    }
}
