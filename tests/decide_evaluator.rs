//! The shipped evaluator-drift policy, decision by decision: given these
//! objects at this time, expect these actions.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use common::*;
use runbook_bench::fixtures::{
    self, JobState, deployment, evaluator, job, job_pod, replicaset, with,
};
use serde_json::json;

const JOB: &str = "chatbot-eval-5a2b";

fn world_at_revision(rev: i64) -> World {
    let w = World::shipped();
    w.add(deployment("chatbot", rev));
    for r in 1..=rev {
        w.add(replicaset("chatbot", r));
    }
    w
}

fn first_job_name(w: &World, ev: &serde_json::Value) -> String {
    let d = w.decide("evaluator-drift", ev);
    applied(&d)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string()
}

/// An evaluator whose run `job_name` is in progress.
fn running(job_name: &str) -> serde_json::Value {
    with(
        evaluator("chatbot", "chatbot", 0.85),
        json!({"status": {"phase": "Running", "currentRun": job_name, "lastRunTime": fixtures::CREATED}}),
    )
}

#[test]
fn a_new_evaluator_starts_a_benchmark_job_at_once() {
    let w = world_at_revision(3);
    let ev = evaluator("chatbot", "chatbot", 0.85);
    let d = w.decide("evaluator-drift", &ev);
    let jobs = applied(&d);
    assert_eq!(jobs.len(), 1);
    let j = jobs[0];
    assert_eq!(j["kind"], "Job");
    assert!(
        j["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("chatbot-eval-")
    );
    assert_eq!(j["metadata"]["annotations"]["runbook.dev/revision"], "3");
    let c = &j["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "registry.example.com/ml/bench:1.4");
    assert_eq!(
        c["env"][0],
        json!({"name": "TARGET_DEPLOYMENT", "value": "chatbot"})
    );
    let st = status_of(&d);
    assert_eq!(st["phase"], "Running");
    assert_eq!(st["currentRun"], j["metadata"]["name"]);
    assert_eq!(st["lastRunTime"], fixtures::CREATED);
    assert_eq!(st["nextRunTime"], "2026-11-29T11:00:00Z");
    assert!(d.due);
}

#[test]
fn the_job_name_is_the_same_on_every_retry() {
    let w = world_at_revision(3);
    let ev = evaluator("chatbot", "chatbot", 0.85);
    let a = first_job_name(&w, &ev);
    let later = World::shipped().at("2026-11-29T10:07:00Z");
    later.add(deployment("chatbot", 3));
    assert_eq!(
        a,
        first_job_name(&later, &ev),
        "a stale cache must name the same run"
    );
}

/// The API allows 253 characters in an Evaluator's name; its Job's name
/// (and the pod label the Job controller makes of it) allows 63. A long
/// name is shortened with a hash, the same on every retry, distinct from
/// another long name that starts the same way.
#[test]
fn a_long_evaluator_name_still_gets_a_valid_job_name() {
    let w = world_at_revision(3);
    let name =
        |tail: &str| format!("chatbot-regression-suite-for-the-eu-west-production-cluster-{tail}");
    let a = first_job_name(&w, &evaluator(&name("one"), "chatbot", 0.85));
    let b = first_job_name(&w, &evaluator(&name("two"), "chatbot", 0.85));
    assert!(name("one").len() >= 60);
    for n in [&a, &b] {
        assert!(
            n.len() <= 63 && runbook_core::names::is_dns_label(n),
            "{n} ({} characters)",
            n.len()
        );
    }
    assert_ne!(a, b);
    assert_eq!(
        a,
        first_job_name(&w, &evaluator(&name("one"), "chatbot", 0.85))
    );
    let d = w.decide("evaluator-drift", &evaluator(&name("one"), "chatbot", 0.85));
    let label = applied(&d)[0]["metadata"]["labels"]["runbook.dev/evaluator"].clone();
    assert!(label.as_str().unwrap().len() <= 63, "{label}");
}

#[test]
fn a_passing_score_marks_the_evaluator_healthy_and_remembers_the_revision() {
    let w = world_at_revision(3);
    let ev = running(JOB);
    w.add(job(&ev, JOB, 3, JobState::Succeeded));
    w.add(job_pod(JOB, r#"{"score": 0.91}"#));
    let d = w.decide("evaluator-drift", &ev);
    let st = status_of(&d);
    assert_eq!(st["phase"], "Healthy");
    assert_eq!(st["lastScore"], 0.91);
    assert_eq!(st["lastGoodRevision"], 3);
    assert_eq!(st["currentRun"], serde_json::Value::Null, "the run is over");
    assert_eq!(st["scoreHistory"][0]["score"], 0.91);
    assert!(rollbacks(&d).is_empty());
    assert!(alerts(&d).is_empty());
    assert_eq!(condition(&d, "Ready").unwrap().0, "True");
}

#[test]
fn a_plain_number_is_a_score_too() {
    let w = world_at_revision(3);
    let ev = running(JOB);
    w.add(job(&ev, JOB, 3, JobState::Succeeded));
    w.add(job_pod(JOB, "0.93\n"));
    assert_eq!(
        status_of(&w.decide("evaluator-drift", &ev))["lastScore"],
        0.93
    );
}

#[test]
fn a_low_score_rolls_back_to_the_last_good_revision_and_pages_the_team() {
    let w = world_at_revision(5);
    let ev = with(running(JOB), json!({"status": {"lastGoodRevision": 3}}));
    w.add(job(&ev, JOB, 5, JobState::Succeeded));
    w.add(job_pod(JOB, r#"{"score": 0.72}"#));
    let d = w.decide("evaluator-drift", &ev);
    assert_eq!(rollbacks(&d), vec![("chatbot".to_string(), Some(3))]);
    let st = status_of(&d);
    assert_eq!(st["phase"], "RolledBack");
    assert_eq!(st["lastRollback"]["fromRevision"], 5);
    assert_eq!(st["lastRollback"]["toRevision"], 3);
    let a = alerts(&d);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0]["severity"], "critical");
    assert_eq!(a[0]["team"], "ml");
    assert!(
        d.refused().next().is_none(),
        "rollback is declared in mutates"
    );
}

/// The decision on a run of revision 5 that scored 0.72 (revision 3 was
/// the last good one), its Evaluator changed by `patch`.
fn low_score(patch: serde_json::Value) -> runbook_core::decide::Decision {
    let w = world_at_revision(5);
    let ev = with(
        with(running(JOB), json!({"status": {"lastGoodRevision": 3}})),
        patch,
    );
    w.add(job(&ev, JOB, 5, JobState::Succeeded));
    w.add(job_pod(JOB, r#"{"score": 0.72}"#));
    w.decide("evaluator-drift", &ev)
}

#[test]
fn an_evaluator_without_alert_labels_pages_the_policys_team() {
    let d = low_score(json!({"spec": {"alert": null}}));
    assert_eq!(rollbacks(&d), vec![("chatbot".to_string(), Some(3))]);
    let a = alerts(&d);
    assert_eq!(a.len(), 1, "{:?}", d.actions);
    let label = |k: &str| a[0].get(k).map(String::as_str);
    assert_eq!(
        (label("team"), label("alertname"), label("severity")),
        (
            Some("ml-platform"),
            Some("EvaluatorRolledBack"),
            Some("critical")
        )
    );
    assert_eq!(
        (label("evaluator"), label("deployment")),
        (Some("chatbot"), Some("chatbot"))
    );
}

#[test]
fn an_evaluators_alert_labels_add_to_the_alert_but_never_rename_it() {
    let d = low_score(
        json!({"spec": {"alert": {"labels": {"team": "search", "alertname": "Mine", "severity": "info", "tier": "gold"}}}}),
    );
    let a = alerts(&d);
    let label = |k: &str| a[0].get(k).map(String::as_str);
    assert_eq!(
        (label("team"), label("tier")),
        (Some("search"), Some("gold"))
    );
    assert_eq!(
        (label("alertname"), label("severity")),
        (Some("EvaluatorRolledBack"), Some("critical"))
    );
}

#[test]
fn without_a_known_good_revision_the_previous_one_is_used() {
    let w = world_at_revision(4);
    let ev = running(JOB);
    w.add(job(&ev, JOB, 4, JobState::Succeeded));
    w.add(job_pod(JOB, r#"{"score": 0.5}"#));
    assert_eq!(
        rollbacks(&w.decide("evaluator-drift", &ev)),
        vec![("chatbot".to_string(), Some(3))]
    );
}

#[test]
fn the_same_bad_revision_is_never_rolled_back_twice() {
    let w = world_at_revision(5);
    let ev = with(
        running(JOB),
        json!({"status": {"lastRollback": {"fromRevision": 5, "toRevision": 4, "time": fixtures::CREATED}}}),
    );
    w.add(job(&ev, JOB, 5, JobState::Succeeded));
    w.add(job_pod(JOB, r#"{"score": 0.6}"#));
    let d = w.decide("evaluator-drift", &ev);
    assert!(rollbacks(&d).is_empty());
    assert_eq!(status_of(&d)["phase"], "RolledBack");
}

#[test]
fn a_breach_with_no_earlier_revision_alerts_without_rolling_back() {
    let w = world_at_revision(1);
    let ev = running(JOB);
    w.add(job(&ev, JOB, 1, JobState::Succeeded));
    w.add(job_pod(JOB, r#"{"score": 0.2}"#));
    let d = w.decide("evaluator-drift", &ev);
    assert!(rollbacks(&d).is_empty());
    assert_eq!(condition(&d, "Ready").unwrap().1, "NoRollbackTarget");
    assert_eq!(alerts(&d)[0]["severity"], "warning");
}

#[test]
fn a_failed_benchmark_is_not_a_low_score() {
    let w = world_at_revision(3);
    let ev = running(JOB);
    w.add(job(&ev, JOB, 3, JobState::Failed));
    let d = w.decide("evaluator-drift", &ev);
    assert!(rollbacks(&d).is_empty());
    assert_eq!(status_of(&d)["phase"], "Degraded");
    assert_eq!(alerts(&d)[0]["severity"], "warning");
    assert_eq!(condition(&d, "Ready").unwrap().1, "BenchmarkFailed");
}

#[test]
fn a_message_that_is_not_json_degrades_without_rolling_back() {
    let w = world_at_revision(3);
    let ev = running(JOB);
    w.add(job(&ev, JOB, 3, JobState::Succeeded));
    w.add(job_pod(JOB, "score: excellent"));
    let d = w.decide("evaluator-drift", &ev);
    assert!(rollbacks(&d).is_empty());
    let (status, reason, message) = condition(&d, "Ready").unwrap();
    assert_eq!((status, reason), ("False", "NoScore"));
    assert!(message.contains("not JSON"), "{message}");
}

#[test]
fn the_rollback_limit_withholds_a_second_rollback_within_its_window() {
    let w = world_at_revision(5).at("2026-11-29T12:00:30Z");
    let ev = with(
        running(JOB),
        json!({"status": {"decisions": [{"policy": "evaluator-drift", "policyVersion": "x", "inputsHash": "y",
               "recentActions": {"rollback": ["2026-11-29T09:00:00Z"]}}]}}),
    );
    w.add(job(&ev, JOB, 5, JobState::Succeeded));
    w.add(job_pod(JOB, r#"{"score": 0.6}"#));
    let d = w.decide("evaluator-drift", &ev);
    assert!(rollbacks(&d).is_empty());
    assert_eq!(condition(&d, "Ready").unwrap().1, "RollbackLimited");
}

#[test]
fn a_missing_target_deployment_is_reported_on_the_evaluator() {
    let w = World::shipped();
    let ev = evaluator("chatbot", "nope", 0.85);
    let d = w.decide("evaluator-drift", &ev);
    let (status, reason, message) = condition(&d, "Ready").unwrap();
    assert_eq!((status, reason), ("False", "TargetNotFound"));
    assert!(message.contains("nope"));
    assert!(applied(&d).is_empty(), "no benchmark against nothing");
    assert!(verbs(&d).contains(&"event"));
}

#[test]
fn no_second_run_starts_while_one_is_in_progress() {
    let w = world_at_revision(3).at("2026-11-29T11:00:05Z");
    let ev = running(JOB);
    let mut j = job(&ev, JOB, 3, JobState::Running);
    j["metadata"]["creationTimestamp"] = json!("2026-11-29T10:50:00Z");
    w.add(j);
    let d = w.decide("evaluator-drift", &ev);
    assert!(d.due, "the hourly schedule fired");
    assert!(applied(&d).is_empty(), "{:?}", d.actions);
}

#[test]
fn a_run_past_its_deadline_is_failed_and_alerted() {
    let w = world_at_revision(3).at("2026-11-29T10:40:00Z");
    let ev = running(JOB);
    w.add(job(&ev, JOB, 3, JobState::Running));
    let d = w.decide("evaluator-drift", &ev);
    assert_eq!(condition(&d, "Ready").unwrap().1, "BenchmarkOverran");
    assert!(verbs(&d).contains(&"delete"));
    assert_eq!(alerts(&d)[0]["severity"], "warning");
    assert!(rollbacks(&d).is_empty());
}

#[test]
fn old_finished_jobs_are_cleaned_up() {
    let w = world_at_revision(3).at("2026-11-29T10:20:00Z");
    let ev = with(
        evaluator("chatbot", "chatbot", 0.85),
        json!({"status": {"phase": "Healthy", "lastRunTime": "2026-11-29T10:00:00Z"}}),
    );
    for i in 0..5 {
        let mut j = job(&ev, &format!("chatbot-eval-{i}"), 3, JobState::Succeeded);
        j["metadata"]["creationTimestamp"] = json!(format!("2026-11-29T0{i}:00:00Z"));
        w.add(j);
    }
    let d = w.decide("evaluator-drift", &ev);
    let deleted: Vec<String> = d
        .actions
        .iter()
        .filter_map(|p| match &p.action {
            runbook_core::script::Action::Delete { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, ["chatbot-eval-0", "chatbot-eval-1"]);
}

#[test]
fn fire_times_missed_while_down_run_once_not_as_a_burst() {
    let w = world_at_revision(3).at("2026-11-29T10:30:00Z");
    let ev = with(
        evaluator("chatbot", "chatbot", 0.85),
        json!({"status": {"phase": "Healthy", "lastRunTime": "2026-11-29T07:00:00Z"}}),
    );
    let d = w.decide("evaluator-drift", &ev);
    assert!(d.due);
    assert_eq!(
        applied(&d).len(),
        1,
        "one run for the three missed fire times"
    );
    let st = status_of(&d);
    assert_eq!(
        st["lastRunTime"], "2026-11-29T10:00:00Z",
        "the run belongs to the latest fire time"
    );
    assert_eq!(st["nextRunTime"], "2026-11-29T11:00:00Z");
    // After that run is recorded, nothing is due until 11:00.
    let after = with(
        ev.clone(),
        json!({"status": {"lastRunTime": "2026-11-29T10:00:00Z", "currentRun": null}}),
    );
    let d = w.decide("evaluator-drift", &after);
    assert!(!d.due);
    assert!(applied(&d).is_empty());
    assert_eq!(
        d.requeue_after_ms,
        Some(30 * 60 * 1000),
        "requeued for the next fire time"
    );
}

/// The chatbot Deployment just after a release or a rollback was written:
/// its controller has not seen generation 4 yet, so its revision
/// annotation still names revision 3.
fn world_rolling_out() -> World {
    let w = World::shipped().at("2026-11-29T10:30:00Z");
    w.add(with(
        deployment("chatbot", 3),
        json!({"metadata": {"generation": 4}}),
    ));
    for r in 1..=3 {
        w.add(replicaset("chatbot", r));
    }
    w
}

/// The same Deployment once its controller rolled revision 4 out.
fn world_rolled_out() -> World {
    world_at_revision(4).at("2026-11-29T10:30:05Z")
}

#[test]
fn a_scheduled_run_that_fires_during_a_rollout_waits_and_is_credited_to_the_new_revision() {
    let ev = with(
        evaluator("chatbot", "chatbot", 0.85),
        json!({"status": {"phase": "Healthy", "lastRunTime": "2026-11-29T09:00:00Z"}}),
    );
    let d = world_rolling_out().decide("evaluator-drift", &ev);
    assert!(d.due);
    assert!(applied(&d).is_empty(), "no benchmark of a revision in flux");
    assert_eq!(
        condition(&d, "Progressing").unwrap(),
        (
            "True",
            "WaitingForRollout",
            "run 20261129-100000 waits until Deployment chatbot has rolled out its latest change"
        )
    );
    let st = status_of(&d);
    assert_eq!(st["waitingRun"], "20261129-100000", "the fire time is kept");
    assert_eq!(st["lastRunTime"], "2026-11-29T10:00:00Z");
    // The rollout observed, the waiting run starts, on revision 4, under
    // the name the fire time gives it.
    let waiting = with(ev.clone(), json!({"status": st}));
    let w = world_rolled_out();
    let d = w.decide("evaluator-drift", &waiting);
    assert!(!d.due);
    let jobs = applied(&d);
    assert_eq!(jobs.len(), 1, "{:?}", d.actions);
    assert_eq!(
        jobs[0]["metadata"]["annotations"]["runbook.dev/revision"],
        "4"
    );
    assert_eq!(
        jobs[0]["metadata"]["annotations"]["runbook.dev/run"],
        "20261129-100000"
    );
    let st = status_of(&d);
    assert_eq!(st["currentRun"], jobs[0]["metadata"]["name"]);
    assert_eq!(
        st["waitingRun"],
        serde_json::Value::Null,
        "no longer waiting"
    );
    assert_eq!(
        jobs[0]["metadata"]["name"],
        first_job_name(&w, &ev),
        "the same Job a run without the wait would have applied"
    );
}

#[test]
fn a_run_asked_for_during_a_rollout_waits_on_its_annotation() {
    let ev = with(
        evaluator("chatbot", "chatbot", 0.85),
        json!({"metadata": {"annotations": {"runbook.dev/run-now": "7"}},
               "status": {"phase": "RolledBack", "lastRunTime": "2026-11-29T10:00:00Z"}}),
    );
    let d = world_rolling_out().decide("evaluator-drift", &ev);
    assert!(!d.due);
    assert!(applied(&d).is_empty());
    let st = status_of(&d);
    assert!(
        !st.contains_key("lastManualRun") && !st.contains_key("waitingRun"),
        "the annotation still asks: {st:?}"
    );
    assert_eq!(condition(&d, "Progressing").unwrap().1, "WaitingForRollout");
    let d = world_rolled_out().decide("evaluator-drift", &ev);
    let jobs = applied(&d);
    assert_eq!(jobs.len(), 1, "{:?}", d.actions);
    assert_eq!(
        jobs[0]["metadata"]["annotations"]["runbook.dev/revision"],
        "4"
    );
    assert_eq!(status_of(&d)["lastManualRun"], "7");
}

#[test]
fn a_run_asked_for_before_the_cache_shows_the_rollback_waits_for_it() {
    // Revision 5 was rolled back a moment ago; the cached Deployment still
    // shows it, settled.
    let w = world_at_revision(5).at("2026-11-29T10:30:00Z");
    let ev = with(
        evaluator("chatbot", "chatbot", 0.85),
        json!({"metadata": {"annotations": {"runbook.dev/run-now": "2"}},
               "status": {"phase": "RolledBack", "lastRunTime": "2026-11-29T10:00:00Z",
                          "lastRollback": {"fromRevision": 5, "toRevision": 3}}}),
    );
    let d = w.decide("evaluator-drift", &ev);
    assert!(
        applied(&d).is_empty(),
        "revision 5 is not benchmarked again"
    );
    assert_eq!(condition(&d, "Progressing").unwrap().1, "WaitingForRollout");
    // The rollback shows as revision 6; the run starts on it.
    let w = world_at_revision(6).at("2026-11-29T10:30:01Z");
    let d = w.decide("evaluator-drift", &ev);
    assert_eq!(
        applied(&d)[0]["metadata"]["annotations"]["runbook.dev/revision"],
        "6"
    );
}

/// A Job its controller marked complete at 10:00:20, and its pod as a
/// cache that has not caught up with the pod's end still shows it.
fn completed_before_its_pod_is_seen(w: &World) -> serde_json::Value {
    let ev = running(JOB);
    w.add(with(
        job(&ev, JOB, 3, JobState::Succeeded),
        json!({"status": {"completionTime": "2026-11-29T10:00:20Z"}}),
    ));
    let mut pod = job_pod(JOB, "");
    pod["status"] = json!({"phase": "Running"});
    w.add(pod);
    ev
}

#[test]
fn a_succeeded_job_whose_pod_the_cache_shows_running_waits_for_the_pod() {
    let w = world_at_revision(3);
    let ev = completed_before_its_pod_is_seen(&w);
    let d = w.decide("evaluator-drift", &ev);
    assert_eq!(condition(&d, "Ready"), None, "no verdict without the pod");
    let st = status_of(&d);
    assert_eq!(st["phase"], "Running");
    assert!(!st.contains_key("currentRun"), "the run goes on: {st:?}");
    // Woken by the pod's change; at the latest when the minute from the
    // Job's completion is over (10:01:20, 50 s from now, and a second).
    assert_eq!(d.requeue_after_ms, Some(51_000));
}

#[test]
fn a_succeeded_job_whose_pod_never_shows_finished_has_no_score_after_a_minute() {
    let w = world_at_revision(3).at("2026-11-29T10:01:30Z");
    let ev = completed_before_its_pod_is_seen(&w);
    let d = w.decide("evaluator-drift", &ev);
    let (status, reason, message) = condition(&d, "Ready").unwrap();
    assert_eq!((status, reason), ("False", "NoScore"));
    assert!(message.contains("no termination message"), "{message}");
    assert!(status_of(&d)["currentRun"].is_null());
}

/// The benchmark pod takes of the Evaluator its container's image,
/// command, arguments, environment and resources, nothing else (a pod
/// template admitted by an older schema is ignored); it runs with no
/// ServiceAccount token unless the administrator names an account in the
/// policy's parameters.
#[test]
fn the_benchmark_pod_takes_only_the_containers_fields_of_the_evaluator() {
    let w = world_at_revision(3);
    let ev = with(
        evaluator("chatbot", "chatbot", 0.85),
        json!({"spec": {"benchmark": {
            "image": "bench:2", "args": ["--quick"],
            "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "bench-token", "key": "token"}}}],
            "resources": {"limits": {"memory": "1Gi"}},
            "template": {"spec": {"serviceAccountName": "admin", "hostPID": true,
                                  "containers": [{"name": "x", "image": "evil", "securityContext": {"privileged": true}}]}}
        }}}),
    );
    let d = w.decide("evaluator-drift", &ev);
    let pod = &applied(&d)[0]["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(pod.get("serviceAccountName").is_none(), "{pod}");
    assert!(pod.get("hostPID").is_none(), "{pod}");
    let c = &pod["containers"][0];
    assert_eq!(pod["containers"].as_array().unwrap().len(), 1);
    assert_eq!(c["image"], "bench:2");
    assert_eq!(c["args"], json!(["--quick"]));
    assert_eq!(c["resources"], json!({"limits": {"memory": "1Gi"}}));
    assert!(c.get("securityContext").is_none(), "{c}");
    assert_eq!(
        c["env"][2]["valueFrom"]["secretKeyRef"]["name"],
        "bench-token"
    );
    // An administrator's account, from the policy's parameters.
    let dir = common::policies_dir();
    let files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap();
            (e.file_name().to_string_lossy().to_string(), text)
        })
        .map(|(k, v)| {
            let v = v.replace(
                "benchmarkServiceAccount: \"\"",
                "benchmarkServiceAccount: bench-runner",
            );
            (k, v)
        })
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let admin = World::from_files(&refs);
    admin.add(deployment("chatbot", 3));
    let d = admin.decide("evaluator-drift", &evaluator("chatbot", "chatbot", 0.85));
    let pod = &applied(&d)[0]["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "bench-runner");
    assert_eq!(pod["automountServiceAccountToken"], true);
}

/// What a benchmark printed never reaches the Evaluator: a message that
/// is not a score is reported by its shape and length only.
#[test]
fn a_message_that_is_not_a_score_is_reported_without_its_content() {
    for (message, error) in [
        (
            "password=hunter2",
            "benchmark message is not JSON or a number (16 characters)",
        ),
        (
            r#"{"token": "hunter2"}"#,
            "benchmark message has no numeric score (a JSON object without a numeric score)",
        ),
        (
            r#""hunter2""#,
            "benchmark message has no numeric score (a JSON string)",
        ),
    ] {
        let w = world_at_revision(3);
        let ev = running(JOB);
        w.add(job(&ev, JOB, 3, JobState::Succeeded));
        w.add(job_pod(JOB, message));
        let d = w.decide("evaluator-drift", &ev);
        assert_eq!(status_of(&d)["lastError"], error);
        let said = format!("{:?}", d.actions);
        assert!(!said.contains("hunter2"), "{said}");
    }
}

/// A busy namespace: the scored run's pod among 5,000 others, as the watch
/// caches hold them (JSON text, indexed). The decision reads the run's pod
/// through the Job's selector and the Deployment's ReplicaSets through
/// their owner, and decides within the default script budget (20 ms).
#[test]
fn the_drift_policy_decides_within_its_budget_beside_5000_pods() {
    use runbook_bench::lookup::{busy_pods, caches};
    let ev = with(running(JOB), json!({"status": {"lastGoodRevision": 3}}));
    let mut objects: Vec<serde_json::Value> = busy_pods(5_000).collect();
    objects.push(deployment("chatbot", 5));
    objects.extend((1..=5).map(|r| replicaset("chatbot", r)));
    objects.push(job(&ev, JOB, 5, JobState::Succeeded));
    objects.push(job_pod(JOB, r#"{"score": 0.72}"#));
    let w = World::shipped();
    let observed = runbook_core::decide::Observed {
        readings: Default::default(),
        target: runbook_core::observe::CachedObject::new(ev.clone()),
        view: std::sync::Arc::new(caches(objects)),
        now: w.now,
    };
    let d = runbook_core::decide::decide(&w.engine, &w.set.policies["evaluator-drift"], &observed)
        .unwrap_or_else(|e| panic!("the decision beside 5,000 pods failed: {e}"));
    assert_eq!(rollbacks(&d), vec![("chatbot".to_string(), Some(3))]);
    assert_eq!(status_of(&d)["lastScore"], 0.72);
}

#[test]
fn a_target_kind_is_listed_and_selected_as_a_watched_kind_is() {
    use runbook_bench::lookup::{busy_pods, caches, target_store};
    use runbook_core::observe::ObjectView;
    let pod = runbook_core::kinds::KindRef::new("v1", "Pod");
    let watched = caches(busy_pods(600).collect::<Vec<_>>());
    let targets = target_store(busy_pods(600).collect::<Vec<_>>());
    let names = |v: Vec<std::sync::Arc<runbook_core::observe::CachedObject>>| {
        v.iter().map(|o| o.name().to_string()).collect::<Vec<_>>()
    };
    let ns = runbook_bench::fixtures::NS;
    let sel = runbook_core::labels::Selector::parse("app=web-7").expect("a selector");
    let picked = names(targets.select(&pod, ns, &sel));
    assert_eq!(picked, names(watched.select(&pod, ns, &sel)));
    assert_eq!(picked.len(), 3, "{picked:?}");
    let all = names(targets.list(&pod, ns));
    assert_eq!(all, names(watched.list(&pod, ns)));
    assert_eq!(all.len(), 600);
    assert!(all.windows(2).all(|w| w[0] <= w[1]), "sorted by name");
    assert!(targets.list(&pod, "elsewhere").is_empty());
}
