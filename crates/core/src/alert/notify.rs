//! What a notification says: the group of alerts a route flushes, and the
//! payloads receivers get. The webhook payload is Alertmanager's, version
//! 4, so receivers written for Alertmanager accept it unchanged.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::sink::{Alert, AlertSource};
use crate::util::time;

/// One alert in a notification.
#[derive(Clone, Debug, PartialEq)]
pub struct NotifiedAlert {
    pub alert: Alert,
    pub fingerprint: String,
    pub source: AlertSource,
    /// When it resolved; `None` while it fires.
    pub ends_at: Option<Timestamp>,
}

impl NotifiedAlert {
    pub fn firing(&self) -> bool {
        self.ends_at.is_none()
    }
}

/// The alerts of one aggregation group, as flushed at one time.
#[derive(Clone, Debug, PartialEq)]
pub struct Notification {
    /// The AlertRoutes document and receiver.
    pub routes: String,
    pub receiver: String,
    /// Which of the receiver's integrations (webhook, slack, ...) it is for.
    pub integration: usize,
    /// Alertmanager's group key: `{route key}:{group labels}`.
    pub group_key: String,
    pub group_labels: BTreeMap<String, String>,
    /// Firing alerts first, then resolved ones; each sorted by fingerprint.
    pub alerts: Vec<NotifiedAlert>,
    pub time: Timestamp,
}

impl Notification {
    pub fn firing(&self) -> impl Iterator<Item = &NotifiedAlert> {
        self.alerts.iter().filter(|a| a.firing())
    }

    pub fn status(&self) -> &'static str {
        if self.firing().next().is_some() {
            "firing"
        } else {
            "resolved"
        }
    }
}

/// Alertmanager's zero time, its `endsAt` of an alert still firing.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

fn common<'a>(
    alerts: &'a [NotifiedAlert],
    field: impl Fn(&'a Alert) -> &'a BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut iter = alerts.iter();
    let Some(first) = iter.next() else {
        return BTreeMap::new();
    };
    let mut out = field(&first.alert).clone();
    for a in iter {
        let m = field(&a.alert);
        out.retain(|k, v| m.get(k) == Some(v));
    }
    out
}

/// Where an alert came from, as a URI for Alertmanager's `generatorURL`:
/// the `runbook explain` of the object, `runbook://explain/KIND/NAME`
/// with its namespace (Alertmanager shows it as the alert's source link).
pub fn generator_url(s: &AlertSource) -> String {
    let mut url = format!("runbook://explain/{}/{}", s.kind, s.name);
    if !s.namespace.is_empty() {
        url.push_str(&format!("?namespace={}", s.namespace));
    }
    url
}

/// The body Alertmanager's `POST /api/v2/alerts` takes, as Prometheus sends
/// it: every alert of the notification with its labels and annotations,
/// `startsAt`, and `endsAt` (when it resolved, or, while it fires, four
/// resend intervals from now, so Alertmanager resolves an alert nobody
/// pushes again).
pub fn alertmanager_payload(n: &Notification, resend_ms: i64) -> Value {
    let expires = n
        .time
        .checked_add(jiff::SignedDuration::from_millis(4 * resend_ms))
        .unwrap_or(n.time);
    let precise = |t: Timestamp| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
    let alerts: Vec<Value> = n
        .alerts
        .iter()
        .map(|a| {
            let starts = a.alert.starts_at;
            // Alertmanager refuses the whole batch for an alert that does
            // not end after it starts (one resolved within its millisecond).
            let after = starts
                .checked_add(jiff::SignedDuration::from_millis(1))
                .unwrap_or(starts);
            let ends = a.ends_at.unwrap_or(expires).max(after);
            json!({
                "labels": a.alert.labels,
                "annotations": a.alert.annotations,
                "startsAt": precise(starts),
                "endsAt": precise(ends),
                "generatorURL": generator_url(&a.source),
            })
        })
        .collect();
    Value::Array(alerts)
}

/// The webhook body (Alertmanager's version 4). `max_alerts` > 0 keeps
/// that many alerts and counts the rest in `truncatedAlerts`.
pub fn webhook_payload(n: &Notification, max_alerts: u32) -> Value {
    let keep = if max_alerts == 0 {
        n.alerts.len()
    } else {
        (max_alerts as usize).min(n.alerts.len())
    };
    let alerts: Vec<Value> = n.alerts[..keep]
        .iter()
        .map(|a| {
            json!({
                "status": if a.firing() { "firing" } else { "resolved" },
                "labels": a.alert.labels,
                "annotations": a.alert.annotations,
                "startsAt": time::format(a.alert.starts_at),
                "endsAt": a.ends_at.map(time::format).unwrap_or_else(|| ZERO_TIME.into()),
                "generatorURL": "",
                "fingerprint": a.fingerprint,
            })
        })
        .collect();
    json!({
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": n.alerts.len() - keep,
        "status": n.status(),
        "receiver": n.receiver,
        "groupLabels": n.group_labels,
        "commonLabels": common(&n.alerts, |a| &a.labels),
        "commonAnnotations": common(&n.alerts, |a| &a.annotations),
        "externalURL": "",
        "alerts": alerts,
    })
}

/// A one-line title: `[FIRING:2] EvaluatorRolledBack (team=ml)`.
pub fn title(n: &Notification) -> String {
    let firing = n.firing().count();
    let head = if firing > 0 {
        format!("[FIRING:{firing}]")
    } else {
        "[RESOLVED]".to_string()
    };
    let common = common(&n.alerts, |a| &a.labels);
    let name = common
        .get("alertname")
        .cloned()
        .unwrap_or_else(|| "alerts".into());
    let rest: Vec<String> = n
        .group_labels
        .iter()
        .filter(|(k, _)| k.as_str() != "alertname")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if rest.is_empty() {
        format!("{head} {name}")
    } else {
        format!("{head} {name} ({})", rest.join(" "))
    }
}

/// Readable text for chat: the title, then one line per alert with its
/// summary (or labels), description, and the object that raised it.
pub fn text(n: &Notification) -> String {
    let mut out = title(n);
    for a in &n.alerts {
        let l = &a.alert.labels;
        let summary = a
            .alert
            .annotations
            .get("summary")
            .cloned()
            .unwrap_or_else(|| l.get("alertname").cloned().unwrap_or_default());
        let state = if a.firing() { "" } else { " (resolved)" };
        let severity = l
            .get("severity")
            .map(|s| format!(" [{s}]"))
            .unwrap_or_default();
        out.push_str(&format!("\n• {summary}{severity}{state}"));
        if let Some(d) = a.alert.annotations.get("description") {
            out.push_str(&format!("\n  {d}"));
        }
        out.push_str(&format!(
            "\n  {} {}/{} (policy {})",
            a.source.kind, a.source.namespace, a.source.name, a.source.policy
        ));
    }
    out
}

/// A Slack incoming-webhook body.
pub fn slack_payload(n: &Notification, channel: Option<&str>) -> Value {
    let mut v = json!({"username": "runbook", "text": text(n)});
    if let Some(c) = channel {
        v["channel"] = json!(c);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(name: &str, severity: &str, resolved: bool) -> NotifiedAlert {
        let labels: BTreeMap<String, String> = [
            ("alertname", name),
            ("severity", severity),
            ("namespace", "prod"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let alert = Alert {
            labels,
            annotations: [("summary".to_string(), format!("{name} happened"))].into(),
            starts_at: "2026-11-29T10:00:00Z".parse().unwrap(),
        };
        NotifiedAlert {
            fingerprint: alert.fingerprint(),
            alert,
            source: AlertSource {
                policy: "p".into(),
                api_version: "runbook.dev/v1alpha1".into(),
                kind: "Evaluator".into(),
                namespace: "prod".into(),
                name: "chatbot".into(),
                uid: "u1".into(),
            },
            ends_at: resolved.then(|| "2026-11-29T11:00:00Z".parse().unwrap()),
        }
    }

    fn notification(alerts: Vec<NotifiedAlert>) -> Notification {
        Notification {
            routes: "default".into(),
            receiver: "ml-team".into(),
            integration: 0,
            group_key: "{}/{severity=\"critical\"}:{namespace=\"prod\"}".into(),
            group_labels: [("namespace".to_string(), "prod".to_string())].into(),
            alerts,
            time: "2026-11-29T11:00:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn the_webhook_payload_is_alertmanagers_version_4() {
        let n = notification(vec![
            alert("RolledBack", "critical", false),
            alert("Degraded", "critical", true),
        ]);
        let v = webhook_payload(&n, 0);
        assert_eq!(v["version"], "4");
        assert_eq!(v["status"], "firing");
        assert_eq!(v["receiver"], "ml-team");
        assert_eq!(v["groupLabels"], json!({"namespace": "prod"}));
        assert_eq!(
            v["commonLabels"],
            json!({"namespace": "prod", "severity": "critical"})
        );
        assert_eq!(v["truncatedAlerts"], 0);
        assert_eq!(v["alerts"][0]["status"], "firing");
        assert_eq!(v["alerts"][0]["endsAt"], ZERO_TIME);
        assert_eq!(v["alerts"][0]["startsAt"], "2026-11-29T10:00:00Z");
        assert_eq!(v["alerts"][1]["status"], "resolved");
        assert_eq!(v["alerts"][1]["endsAt"], "2026-11-29T11:00:00Z");
        assert_eq!(
            v["alerts"][0]["fingerprint"].as_str().unwrap().len(),
            16,
            "a 16-hex-digit fingerprint"
        );
        let cut = webhook_payload(&n, 1);
        assert_eq!(cut["alerts"].as_array().unwrap().len(), 1);
        assert_eq!(cut["truncatedAlerts"], 1);
    }

    #[test]
    fn a_notification_of_resolved_alerts_only_is_resolved() {
        let n = notification(vec![alert("Degraded", "warning", true)]);
        assert_eq!(n.status(), "resolved");
        assert!(title(&n).starts_with("[RESOLVED] Degraded"));
    }

    #[test]
    fn slack_text_is_readable() {
        let n = notification(vec![alert("RolledBack", "critical", false)]);
        let v = slack_payload(&n, Some("#ml-alerts"));
        assert_eq!(v["channel"], "#ml-alerts");
        let text = v["text"].as_str().unwrap();
        assert!(
            text.starts_with("[FIRING:1] RolledBack (namespace=prod)"),
            "{text}"
        );
        assert!(text.contains("• RolledBack happened [critical]"), "{text}");
        assert!(text.contains("Evaluator prod/chatbot (policy p)"), "{text}");
    }

    #[test]
    fn alertmanager_gets_each_alert_as_prometheus_sends_it() {
        let mut n = notification(vec![
            alert("Drift", "critical", false),
            alert("Old", "warning", true),
        ]);
        n.time = "2026-11-29T12:00:00Z".parse().unwrap();
        let body = alertmanager_payload(&n, 60_000);
        let [firing, resolved] = body.as_array().unwrap().as_slice() else {
            panic!("two alerts: {body}");
        };
        assert_eq!(firing["labels"]["alertname"], "Drift");
        assert_eq!(firing["annotations"]["summary"], "Drift happened");
        assert_eq!(firing["startsAt"], "2026-11-29T10:00:00.000Z");
        // Firing: it ends four resend intervals from now unless pushed again.
        assert_eq!(firing["endsAt"], "2026-11-29T12:04:00.000Z");
        assert_eq!(resolved["endsAt"], "2026-11-29T11:00:00.000Z");
        assert_eq!(
            firing["generatorURL"],
            "runbook://explain/Evaluator/chatbot?namespace=prod"
        );
    }

    #[test]
    fn an_alert_resolved_as_it_started_still_ends_after_it_starts() {
        let mut quick = alert("Blip", "info", true);
        quick.ends_at = Some(quick.alert.starts_at);
        let body = alertmanager_payload(&notification(vec![quick]), 60_000);
        assert_eq!(body[0]["startsAt"], "2026-11-29T10:00:00.000Z");
        assert_eq!(body[0]["endsAt"], "2026-11-29T10:00:00.001Z");
    }
}
