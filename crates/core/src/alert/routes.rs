//! The routing tree of an `AlertRoutes` document, compiled: matchers parsed,
//! durations parsed, receivers checked, settings inherited down the tree as
//! Alertmanager does.

use std::collections::BTreeMap;

use super::matcher::Matcher;
use super::model::{AlertRoutesDoc, AlertmanagerSpec, ReceiverSpec, RouteSpec, SecretKeyRef};
use crate::util::time::parse_duration_ms;
use crate::util::yaml::{Node, NodeValue, Pos};

/// An error in a routes document, positioned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteError {
    pub pos: Option<Pos>,
    pub message: String,
}

/// One route, with inherited settings filled in.
#[derive(Clone, Debug)]
pub struct Route {
    /// Path in the tree, such as `root.routes[1]`, for display.
    pub id: String,
    /// Alertmanager's route key: the matchers on the path from the root,
    /// such as `{}/{severity="critical"}`; part of a notification's groupKey.
    pub key: String,
    pub receiver: String,
    pub matchers: Vec<Matcher>,
    pub group_by: Vec<String>,
    pub group_wait_ms: i64,
    pub group_interval_ms: i64,
    pub repeat_interval_ms: i64,
    pub continue_: bool,
    pub routes: Vec<Route>,
    pub mute_time_intervals: Vec<String>,
    pub active_time_intervals: Vec<String>,
}

/// Where a receiver sends.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// A URL written in the document: allowed only for receivers on the
    /// loopback interface (local testing); anything else comes from a Secret.
    Inline(String),
    /// A URL read from a Secret when a notification is sent. `pos` is where
    /// the reference is written, for errors.
    Secret { key: SecretKeyRef, pos: Pos },
}

#[derive(Clone, Debug, PartialEq)]
pub enum ReceiverKind {
    Webhook {
        url: Target,
        timeout_ms: i64,
        max_alerts: u32,
        send_resolved: bool,
    },
    Slack {
        url: Target,
        channel: Option<String>,
        timeout_ms: i64,
        send_resolved: bool,
    },
    Event {
        reason: String,
    },
    Log {
        level: String,
    },
    /// Prometheus' Alertmanager: every alert pushed to each URL, firing ones
    /// again every `resend_ms`.
    Alertmanager {
        urls: Vec<Target>,
        timeout_ms: i64,
        resend_ms: i64,
    },
    /// A receiver with no integration: alerts routed to it are dropped
    /// (Alertmanager's "null" receiver).
    Null,
}

impl ReceiverKind {
    /// Whether notifications of resolved alerts go to this integration
    /// (webhook: yes unless told otherwise; Slack: no unless told; Events
    /// and logs: always).
    pub fn send_resolved(&self) -> bool {
        match self {
            ReceiverKind::Webhook { send_resolved, .. }
            | ReceiverKind::Slack { send_resolved, .. } => *send_resolved,
            _ => true,
        }
    }

    /// The URLs an integration sends to (inline or from Secrets).
    pub fn targets(&self) -> Vec<&Target> {
        match self {
            ReceiverKind::Webhook { url, .. } | ReceiverKind::Slack { url, .. } => vec![url],
            ReceiverKind::Alertmanager { urls, .. } => urls.iter().collect(),
            _ => Vec::new(),
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            ReceiverKind::Webhook { .. } => "webhook",
            ReceiverKind::Slack { .. } => "slack",
            ReceiverKind::Event { .. } => "event",
            ReceiverKind::Log { .. } => "log",
            ReceiverKind::Alertmanager { .. } => "alertmanager",
            ReceiverKind::Null => "none",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Receiver {
    pub name: String,
    pub kinds: Vec<ReceiverKind>,
}

#[derive(Clone, Debug)]
pub struct InhibitRule {
    pub source: Vec<Matcher>,
    pub target: Vec<Matcher>,
    pub equal: Vec<String>,
}

/// A compiled `AlertRoutes` document.
#[derive(Clone, Debug)]
pub struct CompiledRoutes {
    pub name: String,
    /// What names it in the set: its name, or `NAMESPACE/NAME` for a
    /// tenant's routes.
    pub id: String,
    /// Content hash of the document.
    pub version: String,
    /// The file it came from, for errors.
    pub file: String,
    /// Where it is named (`metadata.name`), for errors.
    pub pos: Option<Pos>,
    /// Where its `secretKeyRef`s without a namespace are read: the
    /// namespace of the ConfigMap it came from, else the operator's.
    pub secret_namespace: Option<String>,
    /// Routes of a tenant's bundle (see `CompiledPolicy::tenant`): only
    /// that namespace's policies may send alerts through them.
    pub tenant: Option<String>,
    pub root: Route,
    pub receivers: BTreeMap<String, Receiver>,
    pub inhibit_rules: Vec<InhibitRule>,
    pub time_intervals: BTreeMap<String, TimeInterval>,
}

/// One named time interval: any of its ranges (weekdays and times of day,
/// UTC) contains the instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimeInterval {
    pub ranges: Vec<TimeRange>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimeRange {
    /// Bit i set: weekday i (Monday = 0) is in; 0 means every day.
    pub weekdays: u8,
    /// Minutes since midnight, start inclusive, end exclusive; empty means all day.
    pub times: Vec<(u32, u32)>,
}

impl TimeInterval {
    pub fn contains(&self, t: jiff::Timestamp) -> bool {
        let dt = t.to_zoned(jiff::tz::TimeZone::UTC);
        let day = dt.weekday().to_monday_zero_offset() as u8;
        let minute = dt.hour() as u32 * 60 + dt.minute() as u32;
        self.ranges.iter().any(|r| {
            (r.weekdays == 0 || r.weekdays & (1 << day) != 0)
                && (r.times.is_empty() || r.times.iter().any(|(s, e)| minute >= *s && minute < *e))
        })
    }
}

const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

fn weekday_bits(spec: &str) -> Result<u8, String> {
    let day = |s: &str| {
        WEEKDAYS
            .iter()
            .position(|d| *d == s.trim().to_ascii_lowercase())
            .ok_or_else(|| format!("{s:?} is not a weekday (monday ... sunday)"))
    };
    let (a, b) = match spec.split_once(':') {
        Some((a, b)) => (day(a)?, day(b)?),
        None => {
            let d = day(spec)?;
            (d, d)
        }
    };
    if a > b {
        return Err(format!("weekday range {spec:?} runs backwards"));
    }
    Ok((a..=b).fold(0u8, |bits, d| bits | (1 << d)))
}

fn minutes(text: &str) -> Result<u32, String> {
    let bad = || format!("{text:?} is not a time of day (HH:MM, 00:00 to 24:00)");
    let (h, m) = text.split_once(':').ok_or_else(bad)?;
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if m >= 60 || h > 24 || (h == 24 && m != 0) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

fn time_interval(
    spec: &super::model::TimeIntervalSpec,
    pos: Option<Pos>,
    errors: &mut Vec<RouteError>,
) -> TimeInterval {
    let mut out = TimeInterval::default();
    for r in &spec.time_intervals {
        let mut range = TimeRange::default();
        for w in &r.weekdays {
            match weekday_bits(w) {
                Ok(bits) => range.weekdays |= bits,
                Err(e) => errors.push(err(pos, format!("timeIntervals {:?}: {e}", spec.name))),
            }
        }
        for t in &r.times {
            match (minutes(&t.start_time), minutes(&t.end_time)) {
                (Ok(s), Ok(e)) if s < e => range.times.push((s, e)),
                (Ok(_), Ok(_)) => errors.push(err(
                    pos,
                    format!(
                        "timeIntervals {:?}: startTime must come before endTime",
                        spec.name
                    ),
                )),
                (Err(e), _) | (_, Err(e)) => {
                    errors.push(err(pos, format!("timeIntervals {:?}: {e}", spec.name)))
                }
            }
        }
        out.ranges.push(range);
    }
    out
}

const DEFAULT_GROUP_WAIT_MS: i64 = 30_000;
const DEFAULT_GROUP_INTERVAL_MS: i64 = 300_000;
const DEFAULT_REPEAT_INTERVAL_MS: i64 = 4 * 3_600_000;
const DEFAULT_TIMEOUT_MS: i64 = 10_000;
/// How often Prometheus pushes firing alerts to Alertmanager again.
const DEFAULT_RESEND_MS: i64 = 60_000;

fn err(pos: Option<Pos>, message: impl Into<String>) -> RouteError {
    RouteError {
        pos,
        message: message.into(),
    }
}

fn duration(
    text: &Option<String>,
    inherited: i64,
    what: &str,
    pos: Option<Pos>,
    errors: &mut Vec<RouteError>,
) -> i64 {
    match text {
        None => inherited,
        Some(t) => match parse_duration_ms(t) {
            Ok(ms) if ms > 0 => ms,
            // As in Alertmanager, a group may notify at once.
            Ok(0) if what == "groupWait" => 0,
            Ok(_) => {
                errors.push(err(pos, format!("{what} must be positive")));
                inherited
            }
            Err(e) => {
                errors.push(err(pos, format!("{what}: {e}")));
                inherited
            }
        },
    }
}

/// Whether a URL carries credentials before its host (`user:pass@`),
/// which an HTTP client does not send.
pub fn has_credentials(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#'])
        .next()
        .is_some_and(|authority| authority.contains('@'))
}

/// What is said of a receiver URL holding `user:pass@`.
pub const CREDENTIALS_IN_URL: &str = "the URL holds credentials (user:password@), which are never sent: put the receiver's token in the URL's path or query instead (a URL from a Secret is kept out of logs and Events whole)";

/// Whether a URL's host is the loopback interface.
fn loopback(url: &str) -> bool {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or("");
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    let host = if host.starts_with('[') {
        host.split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default()
    } else {
        host.split(':').next().unwrap_or("").to_string()
    };
    host == "localhost"
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn target_of(node: &Node, what: &str, errors: &mut Vec<RouteError>) -> Option<Target> {
    match &node.value {
        NodeValue::Str(url) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                errors.push(err(
                    Some(node.pos),
                    format!("{what}: {url:?} is not an http(s) URL"),
                ));
                return None;
            }
            if has_credentials(url) {
                errors.push(err(Some(node.pos), format!("{what}: {CREDENTIALS_IN_URL}")));
                return None;
            }
            if !loopback(url) {
                // Not echoing the URL: it may hold a token.
                errors.push(err(
                    Some(node.pos),
                    format!(
                        "{what}: receiver URLs come from Secrets ({{secretKeyRef: {{name, key}}}}); only loopback URLs may be written inline"
                    ),
                ));
                return None;
            }
            Some(Target::Inline(url.clone()))
        }
        NodeValue::Map(_) => {
            let Some(r) = node.get("secretKeyRef") else {
                errors.push(err(
                    Some(node.pos),
                    format!("{what}: expected a URL or {{secretKeyRef: {{name, key}}}}"),
                ));
                return None;
            };
            let name = r.get("name").and_then(Node::as_str);
            let key = r.get("key").and_then(Node::as_str);
            match (name, key) {
                (Some(name), Some(key)) if !name.is_empty() && !key.is_empty() => {
                    Some(Target::Secret {
                        key: SecretKeyRef {
                            name: name.to_string(),
                            key: key.to_string(),
                            namespace: r
                                .get("namespace")
                                .and_then(Node::as_str)
                                .map(str::to_string),
                        },
                        pos: r.pos,
                    })
                }
                _ => {
                    errors.push(err(
                        Some(r.pos),
                        format!("{what}.secretKeyRef needs name and key"),
                    ));
                    None
                }
            }
        }
        _ => {
            errors.push(err(
                Some(node.pos),
                format!("{what}: expected a URL or {{secretKeyRef: {{name, key}}}}"),
            ));
            None
        }
    }
}

fn receiver(
    spec: &ReceiverSpec,
    doc: &Node,
    index: usize,
    errors: &mut Vec<RouteError>,
) -> Receiver {
    let pos = doc.at(&["spec", "receivers"]).and_then(|r| match &r.value {
        NodeValue::Seq(items) => items.get(index).map(|n| n.pos),
        _ => None,
    });
    let mut kinds = Vec::new();
    if let Some(w) = &spec.webhook
        && let Some(url) = target_of(&w.url, &format!("receivers[{index}].webhook.url"), errors)
    {
        kinds.push(ReceiverKind::Webhook {
            url,
            timeout_ms: duration(
                &w.timeout,
                DEFAULT_TIMEOUT_MS,
                "webhook timeout",
                pos,
                errors,
            ),
            max_alerts: w.max_alerts.unwrap_or(0),
            send_resolved: w.send_resolved.unwrap_or(true),
        });
    }
    if let Some(s) = &spec.slack
        && let Some(url) = target_of(&s.url, &format!("receivers[{index}].slack.url"), errors)
    {
        kinds.push(ReceiverKind::Slack {
            url,
            channel: s.channel.clone(),
            timeout_ms: duration(&s.timeout, DEFAULT_TIMEOUT_MS, "slack timeout", pos, errors),
            send_resolved: s.send_resolved.unwrap_or(false),
        });
    }
    if let Some(e) = &spec.event {
        kinds.push(ReceiverKind::Event {
            reason: e.reason.clone().unwrap_or_else(|| "Alert".into()),
        });
    }
    if let Some(l) = &spec.log {
        let level = l.level.clone().unwrap_or_else(|| "warn".into());
        if !["error", "warn", "info"].contains(&level.as_str()) {
            errors.push(err(
                pos,
                format!("receivers[{index}].log.level must be error, warn or info, not {level:?}"),
            ));
        }
        kinds.push(ReceiverKind::Log { level });
    }
    if let Some(a) = &spec.alertmanager
        && let Some(am) = alertmanager(a, index, pos, errors)
    {
        kinds.push(am);
    }
    if kinds.is_empty() {
        kinds.push(ReceiverKind::Null);
    }
    Receiver {
        name: spec.name.clone(),
        kinds,
    }
}

/// An `alertmanager` receiver: one URL or several, each checked as a
/// webhook's is.
fn alertmanager(
    a: &AlertmanagerSpec,
    index: usize,
    pos: Option<Pos>,
    errors: &mut Vec<RouteError>,
) -> Option<ReceiverKind> {
    let what = format!("receivers[{index}].alertmanager");
    let nodes: Vec<&Node> = a.url.iter().chain(&a.urls).collect();
    if nodes.is_empty() {
        errors.push(err(pos, format!("{what}: give url or urls")));
        return None;
    }
    let urls: Vec<Target> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| target_of(n, &format!("{what}.urls[{i}]"), errors))
        .collect();
    let resend_ms = duration(
        &a.resend_interval,
        DEFAULT_RESEND_MS,
        "alertmanager resendInterval",
        pos,
        errors,
    );
    if resend_ms <= 0 {
        errors.push(err(pos, format!("{what}.resendInterval must be positive")));
    }
    (urls.len() == nodes.len()).then(|| ReceiverKind::Alertmanager {
        urls,
        timeout_ms: duration(
            &a.timeout,
            DEFAULT_TIMEOUT_MS,
            "alertmanager timeout",
            pos,
            errors,
        ),
        resend_ms: resend_ms.max(1),
    })
}

fn matchers(nodes: &[Node], what: &str, errors: &mut Vec<RouteError>) -> Vec<Matcher> {
    nodes
        .iter()
        .filter_map(|n| match n.as_str() {
            Some(text) => match Matcher::parse(text) {
                Ok(m) => Some(m),
                Err(e) => {
                    errors.push(err(Some(n.pos), format!("{what}: {e}")));
                    None
                }
            },
            None => {
                errors.push(err(
                    Some(n.pos),
                    format!("{what}: a matcher is a string such as 'severity = \"critical\"'"),
                ));
                None
            }
        })
        .collect()
}

/// What every route of a tree is checked against.
struct Defined<'a> {
    receivers: &'a BTreeMap<String, Receiver>,
    intervals: &'a BTreeMap<String, TimeInterval>,
}

/// A route's receiver: its own (defined in receivers), else its parent's;
/// the root must name one.
fn receiver_of(
    spec: &RouteSpec,
    id: &str,
    parent: Option<&Route>,
    defined: &Defined<'_>,
    pos: Option<Pos>,
    errors: &mut Vec<RouteError>,
) -> String {
    match (&spec.receiver, parent) {
        (Some(n), _) => {
            let name = n.as_str().unwrap_or_default().to_string();
            if !defined.receivers.contains_key(&name) {
                let m = format!("{id}: receiver {name:?} is not defined in receivers");
                errors.push(err(Some(n.pos), m));
            }
            name
        }
        (None, Some(p)) => p.receiver.clone(),
        (None, None) => {
            errors.push(err(pos, "the root route needs a receiver"));
            String::new()
        }
    }
}

/// The root matches everything; time intervals must be defined.
fn check_route(
    spec: &RouteSpec,
    id: &str,
    is_root: bool,
    defined: &Defined<'_>,
    pos: Option<Pos>,
    errors: &mut Vec<RouteError>,
) {
    if is_root && !spec.matchers.is_empty() {
        let m = "the root route matches every alert; it cannot have matchers";
        errors.push(err(pos, m));
    }
    let named = spec
        .mute_time_intervals
        .iter()
        .chain(&spec.active_time_intervals);
    for name in named {
        if !defined.intervals.contains_key(name) {
            let m = format!("{id}: time interval {name:?} is not defined in timeIntervals");
            errors.push(err(pos, m));
        }
    }
}

/// Compile a route and its children; what a route does not say it takes
/// from its parent (or Alertmanager's defaults, for the root).
fn route(
    spec: &RouteSpec,
    id: String,
    parent: Option<&Route>,
    defined: &Defined<'_>,
    pos: Option<Pos>,
    errors: &mut Vec<RouteError>,
) -> Route {
    let receiver = receiver_of(spec, &id, parent, defined, pos, errors);
    check_route(spec, &id, parent.is_none(), defined, pos, errors);
    let own = matchers(&spec.matchers, &id, errors);
    let key = match parent {
        None => "{}".to_string(),
        Some(p) => {
            let own: Vec<String> = own.iter().map(|m| m.to_string()).collect();
            format!("{}/{{{}}}", p.key, own.join(","))
        }
    };
    let mut timing = |given: &Option<String>, inherited: Option<i64>, default, what| {
        duration(given, inherited.unwrap_or(default), what, pos, errors)
    };
    let group_wait_ms = timing(
        &spec.group_wait,
        parent.map(|p| p.group_wait_ms),
        DEFAULT_GROUP_WAIT_MS,
        "groupWait",
    );
    let group_interval_ms = timing(
        &spec.group_interval,
        parent.map(|p| p.group_interval_ms),
        DEFAULT_GROUP_INTERVAL_MS,
        "groupInterval",
    );
    let repeat_interval_ms = timing(
        &spec.repeat_interval,
        parent.map(|p| p.repeat_interval_ms),
        DEFAULT_REPEAT_INTERVAL_MS,
        "repeatInterval",
    );
    let group_by = spec
        .group_by
        .clone()
        .or_else(|| parent.map(|p| p.group_by.clone()));
    let mut r = Route {
        id: id.clone(),
        key,
        receiver,
        matchers: own,
        group_by: group_by.unwrap_or_default(),
        group_wait_ms,
        group_interval_ms,
        repeat_interval_ms,
        continue_: spec.continue_,
        routes: Vec::new(),
        mute_time_intervals: spec.mute_time_intervals.clone(),
        active_time_intervals: spec.active_time_intervals.clone(),
    };
    let mut children = Vec::with_capacity(spec.routes.len());
    for (i, child) in spec.routes.iter().enumerate() {
        let child_pos = child.receiver.as_ref().map(|n| n.pos).or(pos);
        let child_id = format!("{id}.routes[{i}]");
        children.push(route(child, child_id, Some(&r), defined, child_pos, errors));
    }
    r.routes = children;
    r
}

/// Compile a document; `node` is the same document as a positioned tree.
pub fn compile(doc: &AlertRoutesDoc, node: &Node) -> Result<CompiledRoutes, Vec<RouteError>> {
    let mut errors = Vec::new();
    let mut receivers = BTreeMap::new();
    for (i, spec) in doc.spec.receivers.iter().enumerate() {
        let r = receiver(spec, node, i, &mut errors);
        if receivers.insert(spec.name.clone(), r).is_some() {
            errors.push(err(
                node.at(&["spec", "receivers"]).map(|n| n.pos),
                format!("receiver {:?} is defined twice", spec.name),
            ));
        }
    }
    let intervals_pos = node.at(&["spec", "timeIntervals"]).map(|n| n.pos);
    let intervals: BTreeMap<_, _> = doc
        .spec
        .time_intervals
        .iter()
        .map(|t| (t.name.clone(), time_interval(t, intervals_pos, &mut errors)))
        .collect();
    let root_pos = node.at(&["spec", "route"]).map(|n| n.pos);
    let defined = Defined {
        receivers: &receivers,
        intervals: &intervals,
    };
    let root = route(
        &doc.spec.route,
        "route".into(),
        None,
        &defined,
        root_pos,
        &mut errors,
    );
    let inhibit_rules = doc
        .spec
        .inhibit_rules
        .iter()
        .enumerate()
        .map(|(i, r)| InhibitRule {
            source: matchers(
                &r.source_matchers,
                &format!("inhibitRules[{i}].sourceMatchers"),
                &mut errors,
            ),
            target: matchers(
                &r.target_matchers,
                &format!("inhibitRules[{i}].targetMatchers"),
                &mut errors,
            ),
            equal: r.equal.clone(),
        })
        .collect();
    if errors.is_empty() {
        Ok(CompiledRoutes {
            name: doc.metadata.name.clone(),
            id: doc.metadata.name.clone(),
            version: String::new(),
            file: String::new(),
            pos: node.at(&["metadata", "name"]).map(|n| n.pos),
            secret_namespace: None,
            tenant: None,
            root,
            receivers,
            inhibit_rules,
            time_intervals: intervals,
        })
    } else {
        Err(errors)
    }
}

impl Route {
    /// Whether notifications of this route are held at `now` by its mute
    /// or active time intervals.
    pub fn muted_at(&self, routes: &CompiledRoutes, now: jiff::Timestamp) -> bool {
        let within = |names: &[String]| {
            names.iter().any(|n| {
                routes
                    .time_intervals
                    .get(n)
                    .is_some_and(|t| t.contains(now))
            })
        };
        within(&self.mute_time_intervals)
            || (!self.active_time_intervals.is_empty() && !within(&self.active_time_intervals))
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matchers.iter().all(|m| m.matches(labels))
    }

    /// The routes an alert with these labels ends at, Alertmanager's way:
    /// depth first, the first matching child wins unless it says `continue`,
    /// and a node none of whose children match is itself the match.
    pub fn find<'a>(&'a self, labels: &BTreeMap<String, String>, out: &mut Vec<&'a Route>) {
        let mut matched_child = false;
        for child in &self.routes {
            if child.matches(labels) {
                matched_child = true;
                child.find(labels, out);
                if !child.continue_ {
                    break;
                }
            }
        }
        if !matched_child {
            out.push(self);
        }
    }
}

impl CompiledRoutes {
    /// The routes (and so receivers) an alert with these labels reaches.
    pub fn routes_for(&self, labels: &BTreeMap<String, String>) -> Vec<&Route> {
        let mut out = Vec::new();
        self.root.find(labels, &mut out);
        out
    }

    /// The receiver of each route an alert reaches, in routing order: a
    /// receiver named by two matching routes is notified twice, once per
    /// route, as Alertmanager does (what `runbook alerts route` prints, and
    /// what `amtool config routes test` prints).
    pub fn receivers_per_route(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        self.routes_for(labels)
            .into_iter()
            .map(|r| r.receiver.clone())
            .collect()
    }

    /// The receiver names an alert reaches, in routing order, deduplicated.
    pub fn receivers_for(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self.routes_for(labels) {
            if !out.contains(&r.receiver) {
                out.push(r.receiver.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_intervals_hold_weekday_and_time_ranges_in_utc() {
        let spec = crate::alert::model::TimeIntervalSpec {
            name: "office".into(),
            time_intervals: vec![crate::alert::model::TimeRangeSpec {
                weekdays: vec!["monday:friday".into()],
                times: vec![crate::alert::model::TimeOfDaySpec {
                    start_time: "09:00".into(),
                    end_time: "17:30".into(),
                }],
            }],
        };
        let mut errors = Vec::new();
        let t = time_interval(&spec, None, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        let at = |s: &str| t.contains(s.parse().unwrap());
        assert!(at("2026-11-30T09:00:00Z"), "Monday 09:00");
        assert!(at("2026-11-30T17:29:00Z"));
        assert!(!at("2026-11-30T17:30:00Z"), "the end is exclusive");
        assert!(!at("2026-11-29T12:00:00Z"), "Sunday");
        let bad = crate::alert::model::TimeIntervalSpec {
            name: "bad".into(),
            time_intervals: vec![crate::alert::model::TimeRangeSpec {
                weekdays: vec!["funday".into()],
                times: vec![crate::alert::model::TimeOfDaySpec {
                    start_time: "18:00".into(),
                    end_time: "25:00".into(),
                }],
            }],
        };
        time_interval(&bad, None, &mut errors);
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    #[test]
    fn credentials_in_a_url_are_found_before_its_host_only() {
        assert!(has_credentials("http://user:pass@127.0.0.1:9093/hook"));
        assert!(has_credentials("https://token@hooks.example.com/x"));
        assert!(!has_credentials("https://hooks.example.com/x?user=a@b"));
        assert!(!has_credentials("https://hooks.example.com/a@b"));
        let text = format!(
            "{HEAD}    - name: am\n      webhook: {{url: 'http://bot:hunter2@127.0.0.1:9/x'}}\n"
        );
        let errors = compile_text(&text).unwrap_err();
        assert!(
            errors[0].message.contains("holds credentials")
                && errors[0].message.contains("path or query")
                && !errors[0].message.contains("hunter2"),
            "{errors:?}"
        );
        assert_eq!(errors[0].pos.map(|p| p.line), Some(8));
    }

    #[test]
    fn only_loopback_hosts_count_as_loopback() {
        assert!(loopback("http://127.0.0.1:9093/hook"));
        assert!(loopback("http://localhost/x"));
        assert!(loopback("http://[::1]:80/x"));
        assert!(!loopback("https://hooks.example.com/x"));
        assert!(
            !loopback("http://127.0.0.1.evil.com/x"),
            "a name, not an address"
        );
        assert!(!loopback("http://user@example.com/"));
    }

    fn compile_text(text: &str) -> Result<CompiledRoutes, Vec<RouteError>> {
        let doc: AlertRoutesDoc = crate::util::yaml::parse(text).unwrap();
        let node = crate::util::yaml::parse_node(text).unwrap();
        compile(&doc, &node)
    }

    const HEAD: &str = "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: t}\nspec:\n  route: {receiver: am}\n  receivers:\n";

    #[test]
    fn an_alertmanager_receiver_takes_urls_as_a_webhook_does() {
        let pair = format!(
            "{HEAD}    - name: am\n      alertmanager:\n        urls: ['http://127.0.0.1:9093', {{secretKeyRef: {{name: s, key: k}}}}]\n        resendInterval: 30s\n"
        );
        let routes = compile_text(&pair).unwrap();
        let [
            ReceiverKind::Alertmanager {
                urls,
                resend_ms,
                timeout_ms,
            },
        ] = routes.receivers["am"].kinds.as_slice()
        else {
            panic!("an alertmanager integration");
        };
        assert_eq!(urls.len(), 2);
        assert_eq!((*resend_ms, *timeout_ms), (30_000, DEFAULT_TIMEOUT_MS));
        assert_eq!(
            routes.receivers["am"].kinds[0].targets().len(),
            2,
            "rbac and the Secret check see both"
        );

        let none = format!("{HEAD}    - name: am\n      alertmanager: {{resendInterval: 1m}}\n");
        let errors = compile_text(&none).unwrap_err();
        assert_eq!(
            errors[0].message,
            "receivers[0].alertmanager: give url or urls"
        );
        assert_eq!(errors[0].pos.map(|p| p.line), Some(7));

        let public = format!(
            "{HEAD}    - name: am\n      alertmanager: {{url: 'http://alertmanager.monitoring:9093'}}\n"
        );
        let errors = compile_text(&public).unwrap_err();
        assert!(
            errors[0]
                .message
                .contains("only loopback URLs may be written inline"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_receiver_two_routes_name_is_listed_once_per_route() {
        let text = "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: t}\nspec:\n  route:\n    receiver: r0\n    routes:\n      - {matchers: ['severity=\"critical\"'], receiver: r1, continue: true}\n      - {matchers: ['team=\"ml\"'], receiver: r1}\n  receivers: [{name: r0}, {name: r1}]\n";
        let routes = compile_text(text).unwrap();
        let labels: BTreeMap<String, String> = [
            ("severity".into(), "critical".into()),
            ("team".into(), "ml".into()),
        ]
        .into();
        assert_eq!(routes.receivers_per_route(&labels), ["r1", "r1"]);
        assert_eq!(routes.receivers_for(&labels), ["r1"]);
    }
}
