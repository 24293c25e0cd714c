//! Failover between two `runbook run` processes sharing one Lease: when the
//! leader is killed (`kill -9`, no release), the standby takes the Lease
//! within the lease duration. On the sandbox the test serves it over HTTP
//! for the two processes; on a real cluster they use its kubeconfig.
//!
//! `RUNBOOK_FAILOVER_ROUNDS` (default 2) and `RUNBOOK_FAILOVER_LEASE`
//! (seconds, default 6) set how many kills and the lease duration; each
//! failover time is printed. Each kill comes just after a renewal, the
//! moment that leaves the most of the lease to run out.

#[path = "support/cluster.rs"]
mod cluster;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{Cluster, eventually, real_cluster};
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
    let child = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(["run", "--policy-configmaps=false", "--skip-access-check"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--operator-namespace", ns, "--namespace", ns])
        .args([
            "--identity",
            identity,
            "--lease-duration",
            &lease.to_string(),
        ])
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
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let _served = match (&c.sandbox, real_cluster()) {
        (Some(sandbox), _) => {
            let served = sandbox.serve(0).await.unwrap();
            std::fs::write(&kubeconfig, served.kubeconfig(&c.ns)).unwrap();
            Some(served)
        }
        (None, Some(path)) => {
            std::fs::copy(path, &kubeconfig).unwrap();
            None
        }
        (None, None) => unreachable!("a cluster is either the sandbox or a real one"),
    };
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
