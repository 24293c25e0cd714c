//! The API server goes away for a minute in the middle of a backup and
//! comes back: the operator waits it out and finishes the backup with
//! nothing done twice (the same dump Job, one snapshot).
//!
//! On the real control plane (`../shared/k8s`, the one `.ci/run` starts)
//! this is a real restart: `down.sh` without `--wipe` stops etcd,
//! kube-apiserver and kube-controller-manager, every connection and watch
//! drops, and `up.sh` starts them again on the same data. On the sandbox,
//! or a cluster this test did not start, the operator's connection to its
//! API server is cut for as long instead (tests/support/proxy.rs).
//!
//! This is a test binary of its own: a restart would fail every test
//! running beside it, and cargo runs test binaries one after another.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/kubelet.rs"]
mod kubelet;
#[path = "support/proxy.rs"]
mod proxy;
#[path = "support/operator.rs"]
mod support;
#[path = "support/workflows.rs"]
mod workflows;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{Cluster, eventually};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams};
use kubelet::Kubelet;
use proxy::Proxy;
use runbook_core::alert::LogSink;
use runbook_operator::runtime::OperatorConfig;
use runbook_operator::telemetry::Metrics;
use serde_json::json;
use workflows::*;

/// How long the API server stays away (`RUNBOOK_OUTAGE_SECS`, default 60).
fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("RUNBOOK_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    )
}

/// The scripts that started the test's real control plane, when they did:
/// `../shared/k8s` beside the repository, whose state folder
/// (`RUNBOOK_K8S_DIR`) holds the kubeconfig the tests use.
fn control_plane_scripts() -> Option<PathBuf> {
    let kubeconfig = cluster::real_cluster()?;
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/k8s");
    let state = std::env::var("RUNBOOK_K8S_DIR").unwrap_or_else(|_| {
        format!(
            "{}/runbook-k8s",
            std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into())
        )
    });
    let ours = std::fs::canonicalize(PathBuf::from(state).join("kubeconfig")).ok()?;
    let used = std::fs::canonicalize(kubeconfig).ok()?;
    (ours == used && scripts.join("up.sh").exists()).then_some(scripts)
}

/// Runs one of the control plane's scripts; false, with what it printed,
/// when it fails.
fn script(dir: &std::path::Path, name: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new("bash")
        .arg(dir.join(name))
        .args(args)
        .output()
        .map_err(|e| format!("{name}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{name} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Starts the control plane again. `up.sh` is idempotent (all three
/// running: nothing to do; else it stops what runs and starts all three),
/// and its liveness check has taken a component that was still starting
/// for one that exited (CI: "kube-controller-manager exited" with nothing
/// in its log from the new process); so a failed start is tried again,
/// twice at most, before the test fails.
fn start_again(dir: &std::path::Path) {
    let mut failures = Vec::new();
    for _ in 0..3 {
        match script(dir, "up.sh", &[]) {
            Ok(()) => return,
            Err(e) => {
                eprintln!("{e}\ntrying up.sh again");
                failures.push(e);
            }
        }
    }
    panic!("the control plane did not start: {}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_away_for_a_minute_mid_backup_is_waited_out_and_nothing_is_done_twice() {
    let c = Cluster::new("restart").await;
    install_crds(&c).await;
    let kubelet = Kubelet::start(&c);
    database(&c).await;
    kubelet.ready("db-");
    let proxy = Proxy::start(&c).await;
    let op = support::operator_through(
        &c,
        proxy.client().await,
        shipped_policies(),
        OperatorConfig::default(),
        Arc::new(Metrics::new()),
        Arc::new(LogSink::default()),
    );
    op.start().await.expect("the operator starts");
    let backups = kind_api(&c, "runbook.dev/v1alpha1", "DatabaseBackup");
    create(&c, nightly_backup()).await;
    let jobs: Api<Job> = c.api();
    eventually("the dump Job", 120, || async {
        jobs.get("nightly-once-dump").await.is_ok()
    })
    .await;
    let dump_uid = jobs.get("nightly-once-dump").await.unwrap().metadata.uid;

    // The API server goes away mid-backup, the dump still running.
    let away = outage();
    let began = Instant::now();
    match control_plane_scripts() {
        Some(dir) => {
            eprintln!("restarting the control plane ({})", dir.display());
            script(&dir, "down.sh", &[]).unwrap_or_else(|e| panic!("{e}"));
            tokio::time::sleep(away.saturating_sub(began.elapsed())).await;
            start_again(&dir);
        }
        None => {
            eprintln!(
                "cutting the operator off its API server (no control plane of ours to restart)"
            );
            proxy.cut();
            tokio::time::sleep(away).await;
            proxy.restore();
        }
    }
    eprintln!(
        "the API server was away for {:.0} s",
        began.elapsed().as_secs_f64()
    );
    eventually("the API server to answer", 120, || async {
        jobs.get("nightly-once-dump").await.is_ok()
    })
    .await;
    // The dump finishes after the outage; the backup goes on from there.
    kubelet.exit("nightly-once-dump", 0, None);
    let snapshots = kind_api(&c, "snapshot.storage.k8s.io/v1", "VolumeSnapshot");
    eventually("the snapshot after the outage", 180, || async {
        snapshots.get("nightly-once-snap").await.is_ok()
    })
    .await;
    snapshots
        .patch_status(
            "nightly-once-snap",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"readyToUse": true}})),
        )
        .await
        .unwrap();
    eventually("the backup published", 120, || async {
        let st = status_of(&backups, "nightly").await;
        st["phase"] == "Completed" && st["backupURL"] == "s3://backups/e2e/nightly-once.sql.gz"
    })
    .await;
    let all_jobs = jobs.list(&Default::default()).await.unwrap().items;
    assert_eq!(all_jobs.len(), 1, "one dump Job");
    assert_eq!(
        all_jobs[0].metadata.uid, dump_uid,
        "the dump is not repeated"
    );
    assert_eq!(
        snapshots
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        1,
        "one snapshot"
    );
    op.shutdown(Duration::from_secs(5)).await;
    drop(kubelet);
    c.cleanup().await;
}
