//! The shipped backup-ordering policy: steps run strictly in order, progress
//! lives in status, failures compensate.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use common::*;
use runbook_bench::fixtures::{backup, child_of, pvc, statefulset, with};
use runbook_core::script::Action;
use serde_json::{Value, json};

fn ready_world() -> World {
    let w = World::shipped();
    w.add(pvc("data-db-0"));
    for o in statefulset("db", 2, 2) {
        w.add(o);
    }
    w
}

fn steps(d: &runbook_core::decide::Decision) -> Vec<(String, String)> {
    status_of(d)["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn deleted(d: &runbook_core::decide::Decision) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|p| match &p.action {
            Action::Delete { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// The status a decision would leave, merged onto the backup.
fn after(b: &Value, d: &runbook_core::decide::Decision) -> Value {
    with(b.clone(), json!({"status": Value::Object(status_of(d))}))
}

#[test]
fn the_dump_waits_until_every_database_pod_is_ready() {
    let w = World::shipped();
    w.add(pvc("data-db-0"));
    for o in statefulset("db", 3, 2) {
        w.add(o);
    }
    let d = w.decide("backup-ordering", &backup("nightly"));
    assert!(
        applied(&d).is_empty(),
        "no dump before the database is ready"
    );
    let st = status_of(&d);
    assert_eq!(st["phase"], "Running");
    assert_eq!(st["currentStep"], "wait-database");
    assert_eq!(
        steps(&d),
        [
            ("check-volume", "Succeeded"),
            ("wait-database", "Running"),
            ("dump", "Pending"),
            ("snapshot", "Pending"),
            ("publish", "Pending")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(
        d.requeue_after_ms,
        Some(15 * 60 * 1000),
        "wakes up at the step's timeout"
    );
}

#[test]
fn a_ready_database_starts_the_dump_job_and_nothing_after_it() {
    let w = ready_world();
    let d = w.decide("backup-ordering", &backup("nightly"));
    let objs = applied(&d);
    assert_eq!(objs.len(), 1);
    assert_eq!(objs[0]["kind"], "Job");
    assert_eq!(objs[0]["metadata"]["name"], "nightly-once-dump");
    assert_eq!(
        objs[0]["spec"]["template"]["spec"]["containers"][0]["image"],
        "postgres:16"
    );
    assert_eq!(
        objs[0]["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "data-db-0"
    );
    assert_eq!(status_of(&d)["currentStep"], "dump");
}

#[test]
fn the_snapshot_follows_a_successful_dump_and_the_dump_is_not_repeated() {
    let w = ready_world();
    let b0 = backup("nightly");
    let b1 = after(&b0, &w.decide("backup-ordering", &b0));
    w.add(child_of(
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "nightly-once-dump", "namespace": "default", "uid": "u-dump", "resourceVersion": "40"},
               "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}),
        &b0,
        "backup-ordering",
    ));
    let d = w.decide("backup-ordering", &b1);
    let objs = applied(&d);
    assert_eq!(objs.len(), 1, "only the snapshot: {objs:?}");
    assert_eq!(objs[0]["kind"], "VolumeSnapshot");
    assert_eq!(objs[0]["metadata"]["name"], "nightly-once-snap");
    assert_eq!(
        objs[0]["spec"]["source"]["persistentVolumeClaimName"],
        "data-db-0"
    );
    assert_eq!(objs[0]["spec"]["volumeSnapshotClassName"], "csi-snapclass");
    assert_eq!(status_of(&d)["currentStep"], "snapshot");
}

/// A backup without the optional `volumeSnapshotClassName` gets its
/// snapshot (the cluster's default class), and one with a long name gets
/// children whose names are valid and still its own.
#[test]
fn an_optional_class_and_a_long_name_do_not_stop_the_backup() {
    let w = ready_world();
    let long = "orders-primary-database-in-the-eu-west-region-nightly-full";
    assert!(long.len() > 55);
    let mut b0 = backup(long);
    b0["spec"]
        .as_object_mut()
        .unwrap()
        .remove("volumeSnapshotClassName");
    let d = w.decide("backup-ordering", &b0);
    let job = applied(&d).remove(0);
    let job_name = job["metadata"]["name"].as_str().unwrap().to_string();
    assert!(
        job_name.len() <= 63 && job_name.ends_with("-once-dump"),
        "{job_name}"
    );
    let label = job["metadata"]["labels"]["runbook.dev/backup"]
        .as_str()
        .unwrap();
    assert!(label.len() <= 63, "{label}");
    let b1 = after(&b0, &d);
    w.add(child_of(
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": job_name, "namespace": "default", "uid": "u-dump", "resourceVersion": "40"},
               "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}),
        &b0,
        "backup-ordering",
    ));
    let d = w.decide("backup-ordering", &b1);
    let snap = applied(&d).remove(0);
    assert_eq!(snap["kind"], "VolumeSnapshot");
    let snap_name = snap["metadata"]["name"].as_str().unwrap();
    assert!(
        snap_name.len() <= 63 && snap_name.ends_with("-once-snap"),
        "{snap_name}"
    );
    assert!(
        snap["spec"]
            .get("volumeSnapshotClassName")
            .is_none_or(Value::is_null),
        "{snap}"
    );
}

#[test]
fn a_ready_snapshot_publishes_the_url_and_completes() {
    let w = ready_world();
    let mut b = backup("nightly");
    b["status"] = json!({"run": "once", "phase": "Running", "currentStep": "snapshot", "steps": [
        {"name": "check-volume", "state": "Succeeded"}, {"name": "wait-database", "state": "Succeeded"},
        {"name": "dump", "state": "Succeeded"}, {"name": "snapshot", "state": "Running", "startTime": "2026-11-29T10:00:10Z"},
        {"name": "publish", "state": "Pending"}]});
    w.add(child_of(
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
               "metadata": {"name": "nightly-once-snap", "namespace": "default", "uid": "u-snap", "resourceVersion": "50"},
               "status": {"readyToUse": true}}),
        &b,
        "backup-ordering",
    ));
    let d = w.decide("backup-ordering", &b);
    let st = status_of(&d);
    assert_eq!(st["phase"], "Completed");
    assert_eq!(st["backupURL"], "s3://backups/prod/nightly-once.sql.gz");
    assert_eq!(st["snapshotName"], "nightly-once-snap");
    assert_eq!(condition(&d, "Ready").unwrap().0, "True");
    // Finished steps' objects are left alone.
    assert!(applied(&d).is_empty());
    // And a completed backup is left alone afterwards.
    let done = after(&b, &d);
    assert!(w.decide("backup-ordering", &done).actions.is_empty());
}

#[test]
fn a_failed_dump_runs_the_compensation_and_fails_the_backup() {
    let w = ready_world();
    let mut b = backup("nightly");
    b["status"] = json!({"run": "once", "phase": "Running", "currentStep": "dump", "steps": [
        {"name": "check-volume", "state": "Succeeded"}, {"name": "wait-database", "state": "Succeeded"},
        {"name": "dump", "state": "Running", "startTime": "2026-11-29T10:00:10Z"}]});
    w.add(child_of(
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "nightly-once-dump", "namespace": "default", "uid": "u-dump", "resourceVersion": "40"},
               "status": {"failed": 2, "conditions": [{"type": "Failed", "status": "True"}]}}),
        &b,
        "backup-ordering",
    ));
    let d = w.decide("backup-ordering", &b);
    let st = status_of(&d);
    assert_eq!(st["phase"], "Failed");
    assert_eq!(deleted(&d), ["nightly-once-snap"]);
    assert_eq!(alerts(&d)[0]["alertname"], "DatabaseBackupFailed");
    let (status, reason, message) = condition(&d, "Ready").unwrap();
    assert_eq!(
        (status, reason, message),
        ("False", "StepFailed", "dump Job nightly-once-dump failed")
    );
    assert!(
        applied(&d).iter().all(|o| o["kind"] != "VolumeSnapshot"),
        "no snapshot after a failed dump"
    );
}

#[test]
fn a_step_that_overruns_its_timeout_fails() {
    let w = ready_world().at("2026-11-29T12:30:00Z");
    let mut b = backup("nightly");
    b["status"] = json!({"run": "once", "phase": "Running", "currentStep": "dump", "steps": [
        {"name": "check-volume", "state": "Succeeded"}, {"name": "wait-database", "state": "Succeeded"},
        {"name": "dump", "state": "Running", "startTime": "2026-11-29T10:00:10Z"}]});
    let d = w.decide("backup-ordering", &b);
    assert_eq!(status_of(&d)["phase"], "Failed");
    assert!(
        condition(&d, "Ready")
            .unwrap()
            .2
            .contains("timed out after 2h")
    );
}

#[test]
fn a_missing_volume_fails_at_once_with_a_clear_message() {
    let w = World::shipped();
    for o in statefulset("db", 1, 1) {
        w.add(o);
    }
    let d = w.decide("backup-ordering", &backup("nightly"));
    assert_eq!(status_of(&d)["phase"], "Failed");
    let (_, _, message) = condition(&d, "Ready").unwrap();
    assert_eq!(
        message,
        "PersistentVolumeClaim data-db-0 not found in default"
    );
    assert!(verbs(&d).contains(&"event"));
    assert!(applied(&d).is_empty());
}

#[test]
fn a_scheduled_backup_names_each_run_after_its_fire_time() {
    let w = ready_world().at("2026-11-30T02:00:05Z");
    let b = with(
        backup("nightly"),
        json!({"spec": {"schedule": "0 2 * * *"},
               "status": {"run": "20261129-100000", "phase": "Completed", "lastRunTime": "2026-11-29T10:00:00Z"}}),
    );
    let d = w.decide("backup-ordering", &b);
    assert!(d.due);
    assert_eq!(
        applied(&d)[0]["metadata"]["name"],
        "nightly-20261130-020000-dump"
    );
    assert_eq!(status_of(&d)["run"], "20261130-020000");
}
