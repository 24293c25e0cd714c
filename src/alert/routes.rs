//! The routing tree of an `AlertRoutes` document, compiled: matchers parsed,
//! durations parsed, receivers checked, settings inherited down the tree as
//! Alertmanager does.

use std::collections::BTreeMap;

use super::matcher::Matcher;
use crate::policy::model::{AlertRoutesDoc, ReceiverSpec, RouteSpec, SecretKeyRef};
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
    /// A URL written in the document (allowed for loopback test receivers only).
    Inline(String),
    Secret(SecretKeyRef),
}

#[derive(Clone, Debug, PartialEq)]
pub enum ReceiverKind {
    Webhook {
        url: Target,
        timeout_ms: i64,
        max_alerts: u32,
    },
    Slack {
        url: Target,
        channel: Option<String>,
        timeout_ms: i64,
    },
    Event {
        reason: String,
    },
    Log {
        level: String,
    },
    /// A receiver with no integration: alerts routed to it are dropped
    /// (Alertmanager's "null" receiver).
    Null,
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
    /// Content hash of the document.
    pub version: String,
    pub root: Route,
    pub receivers: BTreeMap<String, Receiver>,
    pub inhibit_rules: Vec<InhibitRule>,
    pub time_intervals: BTreeMap<String, Vec<crate::policy::model::TimeRangeSpec>>,
}

const DEFAULT_GROUP_WAIT_MS: i64 = 30_000;
const DEFAULT_GROUP_INTERVAL_MS: i64 = 300_000;
const DEFAULT_REPEAT_INTERVAL_MS: i64 = 4 * 3_600_000;
const DEFAULT_TIMEOUT_MS: i64 = 10_000;

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
                    Some(Target::Secret(SecretKeyRef {
                        name: name.to_string(),
                        key: key.to_string(),
                        namespace: r
                            .get("namespace")
                            .and_then(Node::as_str)
                            .map(str::to_string),
                    }))
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
        });
    }
    if let Some(s) = &spec.slack
        && let Some(url) = target_of(&s.url, &format!("receivers[{index}].slack.url"), errors)
    {
        kinds.push(ReceiverKind::Slack {
            url,
            channel: s.channel.clone(),
            timeout_ms: duration(&s.timeout, DEFAULT_TIMEOUT_MS, "slack timeout", pos, errors),
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
    if kinds.is_empty() {
        kinds.push(ReceiverKind::Null);
    }
    Receiver {
        name: spec.name.clone(),
        kinds,
    }
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

#[allow(clippy::too_many_arguments)]
fn route(
    spec: &RouteSpec,
    id: String,
    parent: Option<&Route>,
    receivers: &BTreeMap<String, Receiver>,
    intervals: &BTreeMap<String, Vec<crate::policy::model::TimeRangeSpec>>,
    pos: Option<Pos>,
    errors: &mut Vec<RouteError>,
) -> Route {
    let receiver = match &spec.receiver {
        Some(n) => {
            let name = n.as_str().unwrap_or_default().to_string();
            if !receivers.contains_key(&name) {
                errors.push(err(
                    Some(n.pos),
                    format!("{id}: receiver {name:?} is not defined in receivers"),
                ));
            }
            name
        }
        None => match parent {
            Some(p) => p.receiver.clone(),
            None => {
                errors.push(err(pos, "the root route needs a receiver"));
                String::new()
            }
        },
    };
    if parent.is_none() && !spec.matchers.is_empty() {
        errors.push(err(
            pos,
            "the root route matches every alert; it cannot have matchers",
        ));
    }
    for name in spec
        .mute_time_intervals
        .iter()
        .chain(&spec.active_time_intervals)
    {
        if !intervals.contains_key(name) {
            errors.push(err(
                pos,
                format!("{id}: time interval {name:?} is not defined in timeIntervals"),
            ));
        }
    }
    let mut r = Route {
        id: id.clone(),
        receiver,
        matchers: matchers(&spec.matchers, &id, errors),
        group_by: spec
            .group_by
            .clone()
            .or_else(|| parent.map(|p| p.group_by.clone()))
            .unwrap_or_default(),
        group_wait_ms: duration(
            &spec.group_wait,
            parent.map_or(DEFAULT_GROUP_WAIT_MS, |p| p.group_wait_ms),
            "groupWait",
            pos,
            errors,
        ),
        group_interval_ms: duration(
            &spec.group_interval,
            parent.map_or(DEFAULT_GROUP_INTERVAL_MS, |p| p.group_interval_ms),
            "groupInterval",
            pos,
            errors,
        ),
        repeat_interval_ms: duration(
            &spec.repeat_interval,
            parent.map_or(DEFAULT_REPEAT_INTERVAL_MS, |p| p.repeat_interval_ms),
            "repeatInterval",
            pos,
            errors,
        ),
        continue_: spec.continue_,
        routes: Vec::new(),
        mute_time_intervals: spec.mute_time_intervals.clone(),
        active_time_intervals: spec.active_time_intervals.clone(),
    };
    let children: Vec<Route> = spec
        .routes
        .iter()
        .enumerate()
        .map(|(i, child)| {
            let child_pos = child.receiver.as_ref().map(|n| n.pos).or(pos);
            route(
                child,
                format!("{id}.routes[{i}]"),
                Some(&r),
                receivers,
                intervals,
                child_pos,
                errors,
            )
        })
        .collect();
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
    let intervals: BTreeMap<_, _> = doc
        .spec
        .time_intervals
        .iter()
        .map(|t| (t.name.clone(), t.time_intervals.clone()))
        .collect();
    let root_pos = node.at(&["spec", "route"]).map(|n| n.pos);
    let root = route(
        &doc.spec.route,
        "route".into(),
        None,
        &receivers,
        &intervals,
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
            version: String::new(),
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
