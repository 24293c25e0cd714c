//! The `AlertRoutes` document as written: an Alertmanager-style routing
//! tree with receivers, inhibition rules and time intervals.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::util::yaml::{DocMeta, Node};

/// `kind: AlertRoutes`: an Alertmanager-style routing tree.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlertRoutesDoc {
    pub api_version: String,
    pub kind: String,
    pub metadata: DocMeta,
    /// The routing tree and what it routes to.
    pub spec: AlertRoutesSpec,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlertRoutesSpec {
    /// The root route: every alert enters here.
    pub route: RouteSpec,
    /// Where notifications go, by name.
    #[serde(default)]
    pub receivers: Vec<ReceiverSpec>,
    /// Rules that mute alerts while another alert fires.
    #[serde(default)]
    pub inhibit_rules: Vec<InhibitRuleSpec>,
    /// Named times routes can be muted or active in.
    #[serde(default)]
    pub time_intervals: Vec<TimeIntervalSpec>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteSpec {
    /// The receiver of alerts this route matches (inherited from the parent when absent).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub receiver: Option<Node>,
    /// Matchers such as `severity = "critical"` or `team =~ "ml|data"`.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub matchers: Vec<Node>,
    /// Labels that group alerts into one notification (`[...]` for all labels).
    #[serde(default)]
    pub group_by: Option<Vec<String>>,
    /// How long a new group waits for more alerts before its first notification (default 30s).
    #[serde(default)]
    pub group_wait: Option<String>,
    /// How long a group waits before notifying of alerts added to it (default 5m).
    #[serde(default)]
    pub group_interval: Option<String>,
    /// How long before a notification still firing is sent again (default 4h).
    #[serde(default)]
    pub repeat_interval: Option<String>,
    /// Go on matching the sibling routes after this one matched.
    #[serde(default, rename = "continue")]
    pub continue_: bool,
    /// Child routes, tried in order; the first that matches takes the alert (unless it continues).
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// Names of time intervals in which this route sends nothing.
    #[serde(default)]
    pub mute_time_intervals: Vec<String>,
    /// Names of time intervals outside which this route sends nothing.
    #[serde(default)]
    pub active_time_intervals: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReceiverSpec {
    /// The receiver's name, which routes name.
    pub name: String,
    /// POST Alertmanager's webhook payload to a URL.
    #[serde(default)]
    pub webhook: Option<WebhookSpec>,
    /// Post to a Slack incoming webhook.
    #[serde(default)]
    pub slack: Option<SlackSpec>,
    /// Record a Kubernetes Event on the alerting object.
    #[serde(default)]
    pub event: Option<EventReceiverSpec>,
    /// Write the notification to the operator's log.
    #[serde(default)]
    pub log: Option<LogReceiverSpec>,
    #[serde(default)]
    pub alertmanager: Option<AlertmanagerSpec>,
}

/// A receiver URL as a schema describes it: a loopback URL inline, or a
/// Secret's key.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum UrlShape {
    Inline(String),
    Secret(SecretValue),
}

/// A URL given inline (only for `http://127.0.0.1`-style test receivers is
/// that sensible) or, properly, from a Secret.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretValue {
    /// The Secret and key holding the value.
    #[serde(default)]
    pub secret_key_ref: Option<SecretKeyRef>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in the Secret's data.
    pub key: String,
    /// Defaults to the operator's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookSpec {
    /// The URL: inline for loopback only, else a `secretKeyRef`.
    #[schemars(with = "UrlShape")]
    pub url: Node,
    /// How long one delivery may take (default 10s).
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

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SlackSpec {
    /// The incoming-webhook URL: inline for loopback only, else a `secretKeyRef`.
    #[schemars(with = "UrlShape")]
    pub url: Node,
    /// The channel to post in (default: the webhook's own).
    #[serde(default)]
    pub channel: Option<String>,
    /// How long one delivery may take (default 10s).
    #[serde(default)]
    pub timeout: Option<String>,
    /// Notify when alerts resolve (default false, as in Alertmanager).
    #[serde(default)]
    pub send_resolved: Option<bool>,
}

/// Alerts pushed to Prometheus' Alertmanager (`/api/v2/alerts`), as
/// Prometheus pushes them: every alert to every URL (an HA pair gets both).
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlertmanagerSpec {
    /// One Alertmanager: its base URL (inline for loopback, else a
    /// `secretKeyRef`).
    #[serde(default)]
    #[schemars(with = "Option<UrlShape>")]
    pub url: Option<Node>,
    /// Several Alertmanagers, each getting every alert.
    #[serde(default)]
    #[schemars(with = "Vec<UrlShape>")]
    pub urls: Vec<Node>,
    /// How long one push may take (default 10s).
    #[serde(default)]
    pub timeout: Option<String>,
    /// How often firing alerts are pushed again (default 1m); Alertmanager
    /// resolves an alert that is not pushed again by its `endsAt`, four
    /// resend intervals after the last push.
    #[serde(default)]
    pub resend_interval: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventReceiverSpec {
    /// The Event's reason (default: the alert's name).
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogReceiverSpec {
    /// `info` (default), `warn` or `error`.
    #[serde(default)]
    pub level: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InhibitRuleSpec {
    /// Matchers an alert must meet to mute others while it fires.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub source_matchers: Vec<Node>,
    /// Matchers of the alerts it mutes.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub target_matchers: Vec<Node>,
    /// Labels whose values must be equal in the muting and the muted alert.
    #[serde(default)]
    pub equal: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeIntervalSpec {
    /// The interval's name, which routes name.
    pub name: String,
    /// The times it covers (any of them).
    #[serde(default)]
    pub time_intervals: Vec<TimeRangeSpec>,
}

/// A simplified Alertmanager time interval: weekdays and UTC hour ranges.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeRangeSpec {
    /// Days such as `monday` or ranges such as `monday:friday` (default: every day).
    #[serde(default)]
    pub weekdays: Vec<String>,
    /// Ranges of UTC time of day (default: the whole day).
    #[serde(default)]
    pub times: Vec<TimeOfDaySpec>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeOfDaySpec {
    /// `HH:MM`, UTC, inclusive.
    pub start_time: String,
    /// `HH:MM`, UTC, exclusive.
    pub end_time: String,
}
