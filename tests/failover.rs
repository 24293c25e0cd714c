//! `runbook run` as a process: start-up on a cluster without its
//! namespace, and failover between two processes sharing one Lease (when
//! the leader is killed, `kill -9`, no release, the standby takes the Lease
//! within the lease duration). On the sandbox the test serves it over HTTP
//! for the processes; on a real cluster they use its kubeconfig.
//!
//! `RUNBOOK_FAILOVER_ROUNDS` (default 2) and `RUNBOOK_FAILOVER_LEASE`
//! (seconds, default 6) set how many kills and the lease duration; each
//! failover time is printed. Each kill comes just after a renewal, the
//! moment that leaves the most of the lease to run out.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/operator.rs"]
mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{Cluster, eventually, have_kubectl, kubectl};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

struct Operator {
    identity: String,
    child: Child,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn start(kubeconfig: &PathBuf, ns: &str, identity: &str, lease: u64) -> Operator {
    let mut run = Command::new(env!("CARGO_BIN_EXE_runbook"));
    run.args(["run", "--policy-configmaps=false", "--skip-access-check"])
        // No policies: nothing to record authors for.
        .arg("--webhook=false")
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--operator-namespace", ns, "--namespace", ns])
        .args([
            "--identity",
            identity,
            "--lease-duration",
            &lease.to_string(),
        ]);
    launch(run, kubeconfig, identity)
}

/// `run` started against the cluster of `kubeconfig`, its output quiet.
fn launch(mut run: Command, kubeconfig: &PathBuf, identity: &str) -> Operator {
    let child = run
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("RUNBOOK_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting runbook run");
    Operator {
        identity: identity.into(),
        child,
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("runbook-leader")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_within_the_lease_duration() {
    let c = Cluster::new("failover").await;
    let dir = std::env::temp_dir().join(format!("runbook-failover-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    let rounds = env_or("RUNBOOK_FAILOVER_ROUNDS", 2);
    let lease = env_or("RUNBOOK_FAILOVER_LEASE", 6);
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.ns);
    let mut operators = vec![
        start(&kubeconfig, &c.ns, "a", lease),
        start(&kubeconfig, &c.ns, "b", lease),
    ];
    eventually("a leader", 60, || async { holder(&leases).await.is_some() }).await;
    let mut times = Vec::new();
    for round in 0..rounds {
        // The worst moment: just after the leader renewed, so the whole
        // lease runs out before anyone may take it.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let seen = leases
            .get("runbook-leader")
            .await
            .unwrap()
            .metadata
            .resource_version;
        eventually("a renewal", 2 * lease, || async {
            leases
                .get("runbook-leader")
                .await
                .unwrap()
                .metadata
                .resource_version
                != seen
        })
        .await;
        let leader = holder(&leases).await.expect("a holder");
        let i = operators
            .iter()
            .position(|o| o.identity == leader)
            .expect("the holder is one of ours");
        let killed = operators.remove(i);
        drop(killed); // SIGKILL: no release, the Lease must run out.
        let killed_at = Instant::now();
        let standby = operators[0].identity.clone();
        eventually("the standby to take over", 3 * lease, || async {
            holder(&leases).await.as_deref() == Some(standby.as_str())
        })
        .await;
        let took = killed_at.elapsed();
        eprintln!("failover {}: {:.2} s", round + 1, took.as_secs_f64());
        times.push(took);
        operators.push(start(&kubeconfig, &c.ns, &leader, lease));
    }
    times.sort();
    eprintln!(
        "failover over {rounds} kills with a {lease} s lease: median {:.2} s, max {:.2} s",
        times[times.len() / 2].as_secs_f64(),
        times[times.len() - 1].as_secs_f64()
    );
    for t in &times {
        assert!(
            *t < Duration::from_secs(lease),
            "a failover took {t:?}, longer than the {lease} s lease"
        );
    }
    drop(operators);
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

/// `runbook run` serving the policy webhook on `addr`, reached at `url`
/// (the same for every replica, as a Service is), checking the policy
/// ConfigMaps of `ns`.
fn start_checking(
    kubeconfig: &PathBuf,
    ns: &str,
    identity: &str,
    addr: &str,
    url: &str,
) -> Operator {
    let mut run = Command::new(env!("CARGO_BIN_EXE_runbook"));
    run.args([
        "run",
        "--skip-access-check",
        "--metrics-addr",
        "127.0.0.1:0",
    ])
    .args([
        "--operator-namespace",
        ns,
        "--namespace",
        ns,
        "--policy-namespaces",
        ns,
    ])
    .args(["--identity", identity, "--lease-duration", "6"])
    .args(["--webhook-addr", addr, "--webhook-url", url])
    .args(["--webhook-configuration", &format!("runbook-{ns}")]);
    launch(run, kubeconfig, identity)
}

/// Every replica checks policy edits, a standby too, against the policies
/// in force: with the webhook pointed at the standby only (the leader
/// listens on 127.0.0.1, the standby on 127.0.0.2), a policy the leader
/// and the standby have both loaded makes the standby refuse one that
/// clashes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_checks_policy_edits_against_the_policies_in_force() {
    if !have_kubectl() {
        return;
    }
    let c = Cluster::new("standby-check").await;
    support::install_widget_crd(&c).await;
    let dir = std::env::temp_dir().join(format!("runbook-standby-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.ns);
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let url = format!("https://127.0.0.2:{port}");
    let _leader = start_checking(&kubeconfig, &c.ns, "a", &format!("127.0.0.1:{port}"), &url);
    eventually("a leading", 60, || async {
        holder(&leases).await.as_deref() == Some("a")
    })
    .await;
    let _standby = start_checking(&kubeconfig, &c.ns, "b", &format!("127.0.0.2:{port}"), &url);
    let policy = |name: &str| {
        let yaml = format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: {name}}}\nspec:\n  target: {{apiVersion: {}/v1, kind: Widget}}\n  script: {name}.rhai\n",
            support::widget_group(&c)
        );
        let file = dir.join(format!("{name}.json"));
        let script = "fn reconcile(ctx) {\n    []\n}\n";
        std::fs::write(
            &file,
            support::policy_configmap(
                name,
                &[
                    (&format!("{name}.yaml"), &yaml),
                    (&format!("{name}.rhai"), script),
                ],
            ),
        )
        .unwrap();
        file.to_str().unwrap().to_string()
    };
    let first = policy("first");
    let (ok, out, err) = kubectl(&kubeconfig, &c.ns, &["apply", "-f", &first]);
    assert!(ok, "{out}{err}");
    // Both write the whole status of the widgets: once the standby has
    // loaded the first, it refuses the second.
    let second = policy("second");
    let mut last = String::new();
    eventually("the standby to refuse a clashing policy", 60, || {
        let (ok, _, err) = kubectl(
            &kubeconfig,
            &c.ns,
            &["apply", "--dry-run=server", "-f", &second],
        );
        last = err.clone();
        async move { !ok && err.contains("both write the whole status") }
    })
    .await;
    let (ok, _, err) = kubectl(&kubeconfig, &c.ns, &["apply", "-f", &second]);
    assert!(
        !ok && err.contains("configmap/") && err.contains("first.yaml"),
        "{err} ({last})"
    );
    assert_eq!(
        holder(&leases).await.as_deref(),
        Some("a"),
        "the answer came from the standby"
    );
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

/// `runbook run` as the README shows it, on a cluster without the operator
/// namespace: one line naming the namespace and the ways out, exit 1, at
/// once (it used to retry leader election every five seconds, forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_operator_namespace_stops_start_up_with_the_way_out() {
    let c = Cluster::new("nons").await;
    let dir = std::env::temp_dir().join(format!("runbook-nons-{}", c.ns));
    let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
    let missing = format!("{}-missing", c.ns);
    let mut child = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args([
            "run",
            "--skip-access-check",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .args(["--operator-namespace", &missing, "--namespace", &c.ns])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("RUNBOOK_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("runbook run did not stop on a missing operator namespace");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ")
            && last.contains(&format!("{missing:?} does not exist"))
            && last.contains(&format!("kubectl create namespace {missing}"))
            && last.contains("--operator-namespace")
            && last.contains("--leader-elect=false"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

/// One HTTP GET on loopback: the status code and the body.
fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Some((code, body))
}

/// While start-up waits for an API server that is not there, the health
/// port answers at once: live (a restart would not bring the API server
/// back), not ready, saying what it waits for. It used to serve nothing
/// until start-up was done, so the shipped liveness probe killed a pod
/// that was waiting correctly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_served_while_start_up_waits_for_the_api_server() {
    let dir = std::env::temp_dir().join(format!("runbook-waiting-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An API server address nothing listens on.
    let away = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = away.local_addr().unwrap();
    drop(away);
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://{api}'}}}}]\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let health = port.local_addr().unwrap().to_string();
    drop(port);
    let child = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(["run", "--skip-access-check", "--metrics-addr", &health])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("RUNBOOK_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _running = Operator {
        identity: "waiting".into(),
        child,
    };
    let started = Instant::now();
    let live = loop {
        if let Some(answer) = http_get(&health, "/healthz") {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nothing served on {health} while start-up waits"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(live.0, 200, "{live:?}");
    eventually("readiness to say what start-up waits for", 30, || async {
        http_get(&health, "/readyz").is_some_and(|(code, body)| {
            code == 503
                && body.contains("waiting for the API server")
                && body.contains("operator namespace")
        })
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Members of a sharded ring (`runbook_operator::runtime::members`): each holds a
/// Lease of its own; every replica sees the live ones. One that stops
/// renewing (its process killed: no release) is counted gone once its
/// record has gone unrenewed for four fifths of the lease duration; one
/// that leaves releases its Lease and is gone at the next look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_a_ring_see_who_is_live() {
    use runbook_operator::runtime::leader::{Elector, LeaseConfig};
    use runbook_operator::runtime::shard::{Members, member_lease};
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    let c = Cluster::new("members").await;
    let ring = |identity: &str| LeaseConfig {
        namespace: c.ns.clone(),
        name: "runbook".into(),
        identity: identity.into(),
        duration: Duration::from_secs(2),
        renew_every: Duration::from_millis(300),
    };
    let member = |identity: &str| {
        let (changed, _) = tokio::sync::watch::channel(false);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let elector = Elector::new(
            c.operator_client.clone(),
            member_lease(&ring(identity)),
            runbook_core::clock::Clock::real(),
        );
        let task = tokio::spawn(elector.run(Arc::new(AtomicBool::new(false)), changed, stopped));
        (stop, task)
    };
    let (_stop_a, _a) = member("a");
    let (_stop_b, b) = member("b");
    let (stop_c, c_task) = member("c");
    let mut seen = Members::new(c.operator_client.clone(), &ring("a"));
    let live = |names: &[&str]| {
        names
            .iter()
            .map(|n| n.to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let mut last = Default::default();
    for _ in 0..100 {
        last = seen.live().await.unwrap();
        if last == live(&["a", "b", "c"]) {
            break;
        }
        tokio::time::sleep(seen.poll()).await;
    }
    assert_eq!(last, live(&["a", "b", "c"]));
    let ring_now = seen.ring().await.unwrap();
    assert_eq!(ring_now.members(), ["a", "b", "c"]);
    // c leaves: it releases its Lease.
    let _ = stop_c.send(true);
    c_task.await.unwrap();
    assert_eq!(seen.live().await.unwrap(), live(&["a", "b"]));
    // b is killed: no release; still counted until its record is stale.
    b.abort();
    let killed = Instant::now();
    assert!(seen.live().await.unwrap().contains("b"), "not gone at once");
    for _ in 0..300 {
        last = seen.live().await.unwrap();
        if last == live(&["a"]) {
            break;
        }
        tokio::time::sleep(seen.poll()).await;
    }
    assert_eq!(last, live(&["a"]));
    eprintln!("a killed member counted gone after {:?}", killed.elapsed());
    c.cleanup().await;
}

/// `runbook run --shards` as users may mistype it: without leader
/// election, or with an identity that cannot be a label value, it stops
/// at once saying which and what to give.
#[test]
fn shards_need_leader_election_a_label_identity_and_a_lease() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_runbook"))
            .args(["run", "--shards", "--metrics-addr", "127.0.0.1:0"])
            .args(args)
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&["--leader-elect=false"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--shards needs leader election"), "{err}");
    let (code, err) = run(&["--identity", "Replica One"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("invalid label value \"Replica One\"") && err.contains("give --identity"),
        "{err}"
    );
    // A Lease too short to renew (every fifth of it) is refused.
    let (code, err) = run(&["--lease-duration", "1", "--identity", "r1"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--lease-duration 1: a Lease must last at least 2 s"),
        "{err}"
    );
}

/// A policy deciding for ConfigMaps labelled `shard-test: "yes"`: it
/// keeps their `data.gen` as `seen` in Runbook's state of each.
fn seen_policy(dir: &std::path::Path) -> PathBuf {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(
        policies.join("seen.yaml"),
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: seen}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  selector: {matchLabels: {shard-test: \"yes\"}}\n  status: {fields: [seen], conditions: []}\n  script: seen.rhai\n",
    )
    .unwrap();
    std::fs::write(
        policies.join("seen.rhai"),
        "fn reconcile(ctx) { [status(#{seen: ctx.resource.data.gen})] }\n",
    )
    .unwrap();
    policies
}

/// What a test of `runbook run --shards` processes starts from: its
/// cluster, a folder of its own, a kubeconfig there for the processes
/// (the sandbox served while `_served` lives), and the `seen` policy.
struct Sharded {
    c: Cluster,
    dir: PathBuf,
    kubeconfig: PathBuf,
    _served: Option<runbook_sandbox::serve::Served>,
    policies: PathBuf,
}

impl Sharded {
    async fn new(test: &str) -> Self {
        let c = Cluster::new(test).await;
        let dir = std::env::temp_dir().join(format!("runbook-{test}-{}", c.ns));
        let (kubeconfig, _served) = c.kubeconfig_file(&dir).await;
        let policies = seen_policy(&dir);
        Self {
            c,
            dir,
            kubeconfig,
            _served,
            policies,
        }
    }
}

/// `runbook run --shards` in the cluster's namespace with `policies`.
fn sharded(
    c: &Cluster,
    kubeconfig: &PathBuf,
    policies: &std::path::Path,
    identity: &str,
    lease: u64,
) -> Operator {
    let mut run = Command::new(env!("CARGO_BIN_EXE_runbook"));
    run.args([
        "run",
        "--policy-configmaps=false",
        "--skip-access-check",
        "--shards",
    ])
    .arg("--policy-dir")
    .arg(policies)
    .arg("--webhook=false")
    .args(["--metrics-addr", "127.0.0.1:0"])
    .args(["--operator-namespace", &c.ns, "--namespace", &c.ns])
    .args([
        "--identity",
        identity,
        "--lease-duration",
        &lease.to_string(),
    ]);
    launch(run, kubeconfig, identity)
}

/// What the `seen` policy kept of ConfigMap `name`, if it decided.
async fn seen(states: &Api<kube::core::DynamicObject>, name: &str) -> Option<serde_json::Value> {
    states
        .get_opt(&format!("configmap.{name}"))
        .await
        .unwrap()
        .map(|s| s.data["status"]["fields"]["seen"].clone())
}

/// The test takes the ring's Lease (`runbook-leader`, held as `the-test`)
/// and keeps it until `stop` is sent, so that no replica assigns and the
/// test publishes the ring itself. Returns once it holds it.
async fn hold_the_ring(
    c: &Cluster,
    lease: u64,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    use runbook_operator::runtime::leader::{Elector, LeaseConfig};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let assigning = Arc::new(AtomicBool::new(false));
    let (changed, _) = tokio::sync::watch::channel(false);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let elector = Elector::new(
        c.client.clone(),
        LeaseConfig {
            namespace: c.ns.clone(),
            name: "runbook-leader".into(),
            identity: "the-test".into(),
            duration: Duration::from_secs(lease),
            renew_every: Duration::from_secs(1),
        },
        runbook_core::clock::Clock::real(),
    );
    let election = tokio::spawn(elector.run(assigning.clone(), changed, stopped));
    eventually("the test holds the ring's Lease", 10, || {
        let assigning = assigning.clone();
        async move { assigning.load(Ordering::Acquire) }
    })
    .await;
    (stop, election)
}

/// A gone member's targets are decided by the replica the published ring
/// places them on while they still carry the gone member's label (no
/// write per target stands between a dead replica and its targets being
/// decided again). Here the test holds the ring's Lease, so that the
/// replica never assigns, and publishes the ring itself: members `a`,
/// gone `x`. Replica `a` decides for `x`'s targets, follows their
/// changes, and leaves alone a target labelled for a member nobody
/// published gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_members_targets_are_decided_before_they_are_labelled_again() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams, PostParams};
    use runbook_core::shard::SHARD_LABEL;
    use runbook_operator::runtime::shard::{GONE_ANNOTATION, MEMBERS_ANNOTATION, published_name};
    let Sharded {
        c,
        dir,
        kubeconfig,
        _served,
        policies,
    } = Sharded::new("shardgone").await;
    let lease = 6u64;
    // The test assigns: it holds the ring's Lease for the whole test.
    let (stop, election) = hold_the_ring(&c, lease).await;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.ns);
    let ring: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": published_name("runbook-leader"), "annotations": {
            MEMBERS_ANNOTATION: "a", GONE_ANNOTATION: "x"}},
        "spec": {"holderIdentity": "the-test"}}))
    .unwrap();
    leases.create(&PostParams::default(), &ring).await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let target = |name: &str, shard: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"shard-test": "yes", SHARD_LABEL: shard}},
            "data": {"gen": "1"}}))
        .unwrap()
    };
    let gone: Vec<String> = (0..5).map(|i| format!("g{i}")).collect();
    for n in &gone {
        maps.create(&PostParams::default(), &target(n, "x"))
            .await
            .unwrap();
    }
    maps.create(&PostParams::default(), &target("unknown", "y"))
        .await
        .unwrap();
    let _a = sharded(&c, &kubeconfig, &policies, "a", lease);
    let states = c.runbook_states();
    eventually("x's targets decided by a", 60, || async {
        for n in &gone {
            if seen(&states, n).await != Some(serde_json::json!("1")) {
                return false;
            }
        }
        true
    })
    .await;
    // Still labelled for x: decided without being labelled again.
    for n in &gone {
        let labels = maps.get(n).await.unwrap().metadata.labels.unwrap();
        assert_eq!(
            labels.get(SHARD_LABEL).map(String::as_str),
            Some("x"),
            "{n}"
        );
    }
    assert_eq!(
        seen(&states, "unknown").await,
        None,
        "a target labelled for a member not published gone was decided"
    );
    // Their changes are followed.
    maps.patch(
        "g0",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"gen": "2"}})),
    )
    .await
    .unwrap();
    eventually("a change of x's target decided", 30, || async {
        seen(&states, "g0").await == Some(serde_json::json!("2"))
    })
    .await;
    let _ = stop.send(true);
    let _ = election.await;
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

/// Targets without a shard label (there before the replicas, or made
/// without the authorship webhook) are decided where the published ring
/// places them, before any label is written: each by the one member the
/// ring places it on, whose label its state carries. Once the ring is
/// published closed (as before a member joins) and a lease has passed,
/// a change to one is not decided until it is labelled. Here the test
/// holds the ring's Lease and publishes the ring itself (members `a`
/// and `b`), so no replica assigns or labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplaced_targets_are_decided_where_the_ring_places_them() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams, PostParams};
    use runbook_core::shard::{Ring, SHARD_LABEL, key};
    use runbook_operator::runtime::shard::{
        MEMBERS_ANNOTATION, UNPLACED_ANNOTATION, published_name,
    };
    let Sharded {
        c,
        dir,
        kubeconfig,
        _served,
        policies,
    } = Sharded::new("shardnew").await;
    let lease = 6u64;
    let (stop, election) = hold_the_ring(&c, lease).await;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.ns);
    let ring = |open: bool| -> Lease {
        let mut annotations = serde_json::json!({MEMBERS_ANNOTATION: "a,b"});
        if open {
            annotations[UNPLACED_ANNOTATION] = "by-ring".into();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": published_name("runbook-leader"), "annotations": annotations},
            "spec": {"holderIdentity": "the-test"}}))
        .unwrap()
    };
    leases
        .create(&PostParams::default(), &ring(true))
        .await
        .unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let names: Vec<String> = (0..8).map(|i| format!("u{i}")).collect();
    for n in &names {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": n, "labels": {"shard-test": "yes"}}, "data": {"gen": "1"}}))
        .unwrap();
        maps.create(&PostParams::default(), &cm).await.unwrap();
    }
    let _a = sharded(&c, &kubeconfig, &policies, "a", lease);
    let _b = sharded(&c, &kubeconfig, &policies, "b", lease);
    let states = c.runbook_states();
    eventually("every unplaced target decided", 60, || async {
        for n in &names {
            if seen(&states, n).await != Some(serde_json::json!("1")) {
                return false;
            }
        }
        true
    })
    .await;
    let ab = Ring::new(["a", "b"]);
    let mut by = std::collections::BTreeMap::<String, usize>::new();
    for n in &names {
        let labels = maps.get(n).await.unwrap().metadata.labels.unwrap();
        assert_eq!(labels.get(SHARD_LABEL), None, "{n} was labelled");
        let state = states.get(&format!("configmap.{n}")).await.unwrap();
        let decided_by = state.metadata.labels.unwrap_or_default()[SHARD_LABEL].clone();
        assert_eq!(
            Some(decided_by.as_str()),
            ab.owner(&key("", "ConfigMap", &c.ns, n)),
            "{n} decided by another replica than the ring places it on"
        );
        *by.entry(decided_by).or_default() += 1;
    }
    eprintln!("unplaced targets decided by: {by:?}");
    // Closed: once no replica's look says otherwise, a change waits.
    let published = leases.get(&published_name("runbook-leader")).await.unwrap();
    let mut closed = ring(false);
    closed.metadata.resource_version = published.metadata.resource_version;
    leases
        .replace(
            &published_name("runbook-leader"),
            &PostParams::default(),
            &closed,
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(lease + 1)).await;
    maps.patch(
        "u0",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"gen": "2"}})),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        seen(&states, "u0").await,
        Some(serde_json::json!("1")),
        "a change of an unplaced target decided while the ring was closed"
    );
    let _ = stop.send(true);
    let _ = election.await;
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}

/// Two `runbook run --shards` processes share ten targets; one is killed
/// (`kill -9`: no Lease released) just after it renewed its member Lease.
/// A change to every target is decided by the other within the lease
/// duration (seen in each one's state), and the killed one's targets are
/// then labelled for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_targets_are_taken_over() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams, PostParams};
    use runbook_core::shard::SHARD_LABEL;
    let Sharded {
        c,
        dir,
        kubeconfig,
        _served,
        policies,
    } = Sharded::new("shardkill").await;
    let lease = 6u64;
    let replica = |identity: &str| sharded(&c, &kubeconfig, &policies, identity, lease);
    let mut replicas = vec![replica("a"), replica("b")];
    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let names: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    for n in &names {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": n, "labels": {"shard-test": "yes"}}, "data": {"gen": "1"}}))
        .unwrap();
        maps.create(&PostParams::default(), &cm).await.unwrap();
    }
    let states = c.runbook_states();
    let all_seen = |generation: &'static str| {
        let (states, names) = (states.clone(), names.clone());
        async move {
            for n in &names {
                if seen(&states, n).await != Some(serde_json::json!(generation)) {
                    return false;
                }
            }
            true
        }
    };
    eventually("every target decided", 60, || all_seen("1")).await;
    let shard_of = |n: String| {
        let maps = maps.clone();
        async move {
            maps.get(&n)
                .await
                .unwrap()
                .metadata
                .labels
                .unwrap_or_default()
                .get(SHARD_LABEL)
                .cloned()
        }
    };
    // Decided where the ring places them first; labelled a lease later.
    eventually("every target labelled", 6 * lease, || async {
        for n in &names {
            if shard_of(n.clone()).await.is_none() {
                return false;
            }
        }
        true
    })
    .await;
    let mut held = std::collections::BTreeMap::<String, usize>::new();
    for n in &names {
        *held.entry(shard_of(n.clone()).await.unwrap()).or_default() += 1;
    }
    eprintln!("placed: {held:?}");
    // Kill a replica that holds some, just after it renewed its Lease.
    let victim = held.keys().next().unwrap().clone();
    let survivor = if victim == "a" { "b" } else { "a" };
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.ns);
    let member = format!("runbook-leader-member-{victim}");
    let seen = leases.get(&member).await.unwrap().metadata.resource_version;
    eventually("a renewal", 2 * lease, || async {
        leases.get(&member).await.unwrap().metadata.resource_version != seen
    })
    .await;
    let i = replicas.iter().position(|r| r.identity == victim).unwrap();
    drop(replicas.remove(i));
    let killed_at = Instant::now();
    // A change to every target right after the kill: the survivor decides
    // for the killed one's as soon as it counts it gone, before their
    // labels follow.
    for n in &names {
        maps.patch(
            n,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"gen": "2"}})),
        )
        .await
        .unwrap();
    }
    eventually("every target decided by the survivor", 6 * lease, || {
        all_seen("2")
    })
    .await;
    let decided = killed_at.elapsed();
    eventually("every target placed on the survivor", 6 * lease, || async {
        for n in &names {
            if shard_of(n.clone()).await.as_deref() != Some(survivor) {
                return false;
            }
        }
        true
    })
    .await;
    eprintln!(
        "a killed replica's targets decided again by the survivor {:.2} s after the kill, placed on it {:.2} s after ({lease} s lease)",
        decided.as_secs_f64(),
        killed_at.elapsed().as_secs_f64()
    );
    assert!(
        decided < Duration::from_secs(lease),
        "took {decided:?}, longer than the {lease} s lease"
    );
    drop(replicas);
    let _ = std::fs::remove_dir_all(&dir);
    c.cleanup().await;
}
