//! The `AlertRoutes` document as written: an Alertmanager-style routing
//! tree with receivers, inhibition rules and time intervals.

use serde::Deserialize;

use crate::util::yaml::{DocMeta, Node};

/// `kind: AlertRoutes`: an Alertmanager-style routing tree.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlertRoutesDoc {
    pub api_version: String,
    pub kind: String,
    pub metadata: DocMeta,
    pub spec: AlertRoutesSpec,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlertRoutesSpec {
    pub route: RouteSpec,
    #[serde(default)]
    pub receivers: Vec<ReceiverSpec>,
    #[serde(default)]
    pub inhibit_rules: Vec<InhibitRuleSpec>,
    #[serde(default)]
    pub time_intervals: Vec<TimeIntervalSpec>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteSpec {
    #[serde(default)]
    pub receiver: Option<Node>,
    /// Matchers such as `severity = "critical"` or `team =~ "ml|data"`.
    #[serde(default)]
    pub matchers: Vec<Node>,
    #[serde(default)]
    pub group_by: Option<Vec<String>>,
    #[serde(default)]
    pub group_wait: Option<String>,
    #[serde(default)]
    pub group_interval: Option<String>,
    #[serde(default)]
    pub repeat_interval: Option<String>,
    #[serde(default, rename = "continue")]
    pub continue_: bool,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    #[serde(default)]
    pub mute_time_intervals: Vec<String>,
    #[serde(default)]
    pub active_time_intervals: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReceiverSpec {
    pub name: String,
    #[serde(default)]
    pub webhook: Option<WebhookSpec>,
    #[serde(default)]
    pub slack: Option<SlackSpec>,
    #[serde(default)]
    pub event: Option<EventReceiverSpec>,
    #[serde(default)]
    pub log: Option<LogReceiverSpec>,
    #[serde(default)]
    pub alertmanager: Option<AlertmanagerSpec>,
}

/// A URL given inline (only for `http://127.0.0.1`-style test receivers is
/// that sensible) or, properly, from a Secret.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretValue {
    #[serde(default)]
    pub secret_key_ref: Option<SecretKeyRef>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
    /// Defaults to the operator's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookSpec {
    pub url: Node,
    #[serde(default)]
    pub timeout: Option<String>,
    /// At most this many alerts per notification (0: all); the rest are
    /// counted in `truncatedAlerts`.
    #[serde(default)]
    pub max_alerts: Option<u32>,
    /// Notify when alerts resolve (default true, as in Alertmanager).
    #[serde(default)]
    pub send_resolved: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SlackSpec {
    pub url: Node,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub timeout: Option<String>,
    /// Notify when alerts resolve (default false, as in Alertmanager).
    #[serde(default)]
    pub send_resolved: Option<bool>,
}

/// Alerts pushed to Prometheus' Alertmanager (`/api/v2/alerts`), as
/// Prometheus pushes them: every alert to every URL (an HA pair gets both).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlertmanagerSpec {
    /// One Alertmanager: its base URL (inline for loopback, else a
    /// `secretKeyRef`).
    #[serde(default)]
    pub url: Option<Node>,
    /// Several Alertmanagers, each getting every alert.
    #[serde(default)]
    pub urls: Vec<Node>,
    #[serde(default)]
    pub timeout: Option<String>,
    /// How often firing alerts are pushed again (default 1m); Alertmanager
    /// resolves an alert that is not pushed again by its `endsAt`, four
    /// resend intervals after the last push.
    #[serde(default)]
    pub resend_interval: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventReceiverSpec {
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogReceiverSpec {
    #[serde(default)]
    pub level: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InhibitRuleSpec {
    #[serde(default)]
    pub source_matchers: Vec<Node>,
    #[serde(default)]
    pub target_matchers: Vec<Node>,
    #[serde(default)]
    pub equal: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeIntervalSpec {
    pub name: String,
    #[serde(default)]
    pub time_intervals: Vec<TimeRangeSpec>,
}

/// A simplified Alertmanager time interval: weekdays and UTC hour ranges.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeRangeSpec {
    #[serde(default)]
    pub weekdays: Vec<String>,
    #[serde(default)]
    pub times: Vec<TimeOfDaySpec>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeOfDaySpec {
    pub start_time: String,
    pub end_time: String,
}
