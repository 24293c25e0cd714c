//! Who makes a request, and whether RBAC lets them: the sandbox's
//! authentication and authorization, as a real API server with RBAC on
//! answers them.
//!
//! A request without impersonation headers comes from the sandbox's
//! administrator (`sandbox`, in `system:masters`), as every client did
//! before identities existed here. `Impersonate-User`, `Impersonate-Group`,
//! `Impersonate-Uid` and `Impersonate-Extra-*` (what `kubectl --as` and
//! kube's `impersonate` settings send) make the request someone else's;
//! a ServiceAccount's user name (`system:serviceaccount:NS:NAME`) brings
//! its groups, as token authentication does. Everyone but a member of
//! `system:masters` is then held to the Roles, ClusterRoles and their
//! bindings stored in the sandbox, evaluated as kube-apiserver's RBAC
//! authorizer does (verbs, groups, resources with subresources and
//! `*/sub`, resource names, RoleBindings to ClusterRoles), with the
//! discovery and self-review rights every authenticated user has.
//!
//! A bearer token the sandbox issued through a TokenRequest
//! (`kubectl create token SA`, `serviceaccounts/NAME/token`) authenticates
//! its ServiceAccount; any other request comes from the administrator.
//! Whoever impersonates must hold the `impersonate` verb on what they
//! impersonate (`serviceaccounts` in the account's namespace, `users`,
//! `groups`, `uids`, `userextras/KEY`), as a real server checks it; the
//! administrator holds every right.
//!
//! Simpler than a real server: aggregated ClusterRoles are not aggregated
//! (their own rules count), the default roles (`admin`, `edit`, `view`)
//! do not exist, and issued tokens never expire (they last as long as the
//! sandbox).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::registry::ResourceDef;
use super::store::{Filter, Store};

/// The group whose members RBAC never limits.
pub const MASTERS: &str = "system:masters";

/// Who a request comes from (`userInfo` in reviews and admission).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The sandbox's administrator: whoever sends no impersonation headers.
    pub fn admin() -> Self {
        Self {
            username: "sandbox".into(),
            groups: vec![MASTERS.into(), "system:authenticated".into()],
            ..Default::default()
        }
    }

    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// A ServiceAccount as token authentication names it, with its groups.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            ..Default::default()
        }
    }

    /// The user a request's impersonation headers name (the administrator
    /// when there are none), without checking who may impersonate them.
    pub fn of_request(headers: &http::HeaderMap) -> Self {
        impersonated(headers).unwrap_or_else(Self::admin)
    }
}

/// What impersonation headers ask to act as: `None` without
/// `Impersonate-User`.
fn impersonated(headers: &http::HeaderMap) -> Option<UserInfo> {
    let text = |v: &http::HeaderValue| v.to_str().unwrap_or("").to_string();
    let user = headers.get("impersonate-user").map(text)?;
    let mut groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .map(text)
        .collect();
    let mut extra = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("impersonate-extra-") {
            extra
                .entry(percent_decode(key))
                .or_insert_with(Vec::new)
                .push(text(value));
        }
    }
    // A ServiceAccount authenticates with the groups of its kind.
    if let Some(rest) = user.strip_prefix("system:serviceaccount:")
        && let Some((ns, _)) = rest.split_once(':')
    {
        for g in [
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{ns}"),
        ] {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
    }
    if !groups.iter().any(|g| g == "system:authenticated") {
        groups.push("system:authenticated".into());
    }
    Some(UserInfo {
        username: user,
        uid: headers.get("impersonate-uid").map(text).unwrap_or_default(),
        groups,
        extra,
    })
}

/// The bearer tokens the sandbox issued, and whose they are.
#[derive(Default)]
pub struct Tokens {
    issued: Mutex<HashMap<String, UserInfo>>,
}

impl Tokens {
    /// A new token for the ServiceAccount `namespace/name`.
    pub fn issue(&self, namespace: &str, name: &str) -> String {
        let mut issued = runbook_core::util::lock(&self.issued);
        let token = format!(
            "sandbox.{}",
            runbook_core::util::hash::short_hex(
                format!(
                    "{namespace}/{name}/{}/{:?}",
                    issued.len(),
                    std::time::SystemTime::now()
                )
                .as_bytes(),
                32
            )
        );
        issued.insert(token.clone(), UserInfo::service_account(namespace, name));
        token
    }

    fn user(&self, token: &str) -> Option<UserInfo> {
        let issued = runbook_core::util::lock(&self.issued);
        issued.get(token).cloned()
    }
}

/// Who sent a request: the ServiceAccount of a bearer token the sandbox
/// issued, else the administrator; then, where it impersonates someone,
/// that user, once RBAC lets the sender impersonate them (the refusal
/// reads as the API server's).
pub fn authenticate(
    store: &Store,
    tokens: &Tokens,
    headers: &http::HeaderMap,
) -> Result<UserInfo, String> {
    let sender = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| tokens.user(t.trim()))
        .unwrap_or_else(UserInfo::admin);
    let Some(wanted) = impersonated(headers) else {
        return Ok(sender);
    };
    if sender.is_master() {
        return Ok(wanted);
    }
    for a in impersonation_attributes(&wanted, headers) {
        if !authorize(store, &sender, &a).allowed {
            return Err(a.forbidden_message(&sender.username));
        }
    }
    Ok(wanted)
}

/// What impersonating `wanted` asks RBAC for: the user (a ServiceAccount
/// in its namespace), each group and the uid asked for by header, and
/// each extra value.
fn impersonation_attributes(wanted: &UserInfo, headers: &http::HeaderMap) -> Vec<Attributes> {
    let one = |group: &str, resource: &str, namespace: &str, name: &str| Attributes {
        verb: "impersonate".into(),
        group: group.into(),
        resource: resource.into(),
        subresource: String::new(),
        namespace: namespace.into(),
        name: name.into(),
    };
    let mut out = Vec::new();
    match wanted
        .username
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, name)) => out.push(one("", "serviceaccounts", ns, name)),
        None => out.push(one("", "users", "", &wanted.username)),
    }
    for g in headers.get_all("impersonate-group") {
        out.push(one("", "groups", "", g.to_str().unwrap_or("")));
    }
    if !wanted.uid.is_empty() {
        out.push(one("authentication.k8s.io", "uids", "", &wanted.uid));
    }
    for (key, values) in &wanted.extra {
        for v in values {
            let mut a = one("authentication.k8s.io", "userextras", "", v);
            a.subresource = key.clone();
            out.push(a);
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a request (or an access review) asks to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl Attributes {
    /// `resource` or `resource/subresource`.
    pub fn combined(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The API server's refusal of these attributes for `user`.
    pub fn forbidden_message(&self, user: &str) -> String {
        let full = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        let what = if self.name.is_empty() {
            full
        } else {
            format!("{full} \"{}\"", self.name)
        };
        let whose = if self.namespace.is_empty() {
            " at the cluster scope".to_string()
        } else {
            format!(" in the namespace \"{}\"", self.namespace)
        };
        format!(
            "{what} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\"{whose}",
            self.verb,
            self.combined(),
            self.group
        )
    }
}

/// Whether RBAC allows a request, and the binding that does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub reason: String,
}

/// Rights every authenticated user has on a real server (the
/// `system:basic-user` and discovery roles): reviewing oneself.
fn always_allowed(a: &Attributes) -> bool {
    a.group == "authorization.k8s.io"
        && a.verb == "create"
        && matches!(
            a.resource.as_str(),
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
        )
        || a.group == "authentication.k8s.io"
            && a.verb == "create"
            && a.resource == "selfsubjectreviews"
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

fn text<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(*k))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Whether one rule grants the attributes.
fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let any = |list: &[String], want: &str| list.iter().any(|x| x == "*" || x == want);
    let verbs = strings(rule, "verbs");
    let groups = strings(rule, "apiGroups");
    let resources = strings(rule, "resources");
    let names = strings(rule, "resourceNames");
    let combined = a.combined();
    let resource_ok = resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || (!a.subresource.is_empty()
                && r.strip_prefix("*/").is_some_and(|s| s == a.subresource))
    });
    any(&verbs, &a.verb)
        && any(&groups, &a.group)
        && resource_ok
        && (names.is_empty() || names.iter().any(|n| *n == a.name && !a.name.is_empty()))
}

/// Whether a binding's subject is `user`.
fn subject_is(subject: &Value, user: &UserInfo, binding_ns: &str) -> bool {
    let name = text(subject, &["name"]);
    match text(subject, &["kind"]) {
        "User" => user.username == name,
        "Group" => user.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = match text(subject, &["namespace"]) {
                "" => binding_ns,
                ns => ns,
            };
            user.username == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

/// Every object of a resource, parsed (those of one namespace, or all).
fn all(store: &Store, group: &str, plural: &str, ns: Option<&str>) -> Vec<Value> {
    let Some(def) = store.def(group, plural) else {
        return Vec::new();
    };
    let filter = Filter {
        namespace: ns.map(str::to_string),
        ..Default::default()
    };
    store
        .list(&def, &filter, None, None)
        .map(|l| {
            l.items
                .iter()
                .filter_map(|b| serde_json::from_slice(b).ok())
                .collect()
        })
        .unwrap_or_default()
}

const RBAC: &str = "rbac.authorization.k8s.io";

/// The rules of the role a binding names (a Role in its namespace or a
/// ClusterRole).
fn role_rules(store: &Store, binding: &Value) -> Vec<Value> {
    let kind = text(binding, &["roleRef", "kind"]);
    let name = text(binding, &["roleRef", "name"]);
    let ns = text(binding, &["metadata", "namespace"]);
    let roles = match kind {
        "ClusterRole" => all(store, RBAC, "clusterroles", None),
        "Role" => all(store, RBAC, "roles", Some(ns)),
        _ => return Vec::new(),
    };
    roles
        .into_iter()
        .find(|r| text(r, &["metadata", "name"]) == name)
        .and_then(|r| r.get("rules").and_then(Value::as_array).cloned())
        .unwrap_or_default()
}

/// RBAC's answer for `user` doing `a`.
pub fn authorize(store: &Store, user: &UserInfo, a: &Attributes) -> Verdict {
    if user.is_master() {
        return Verdict {
            allowed: true,
            reason: format!("{} is in {MASTERS}", user.username),
        };
    }
    if always_allowed(a) {
        return Verdict {
            allowed: true,
            reason: "every authenticated user may review itself".into(),
        };
    }
    let grants = |binding: &Value| {
        let ns = text(binding, &["metadata", "namespace"]);
        let subjects = binding.get("subjects").and_then(Value::as_array);
        subjects
            .into_iter()
            .flatten()
            .any(|s| subject_is(s, user, ns))
            && role_rules(store, binding).iter().any(|r| rule_allows(r, a))
    };
    let name_of = |b: &Value| text(b, &["metadata", "name"]).to_string();
    let role_of = |b: &Value| {
        format!(
            "{} {:?}",
            text(b, &["roleRef", "kind"]),
            text(b, &["roleRef", "name"])
        )
    };
    for b in all(store, RBAC, "clusterrolebindings", None) {
        if grants(&b) {
            return Verdict {
                allowed: true,
                reason: format!(
                    "RBAC: allowed by ClusterRoleBinding {:?} of {} to User {:?}",
                    name_of(&b),
                    role_of(&b),
                    user.username
                ),
            };
        }
    }
    if !a.namespace.is_empty() {
        for b in all(store, RBAC, "rolebindings", Some(&a.namespace)) {
            if grants(&b) {
                return Verdict {
                    allowed: true,
                    reason: format!(
                        "RBAC: allowed by RoleBinding {:?} of {} to User {:?}",
                        name_of(&b),
                        role_of(&b),
                        user.username
                    ),
                };
            }
        }
    }
    Verdict {
        allowed: false,
        reason: String::new(),
    }
}

/// The attributes of a request to a resource.
pub fn attributes(
    def: &ResourceDef,
    verb: &str,
    ns: Option<&str>,
    name: Option<&str>,
    sub: Option<&str>,
) -> Attributes {
    Attributes {
        verb: verb.to_string(),
        group: def.group.clone(),
        resource: def.plural.clone(),
        subresource: sub.unwrap_or("").to_string(),
        namespace: ns.unwrap_or("").to_string(),
        name: name.unwrap_or("").to_string(),
    }
}

/// The attributes an access review's `spec.resourceAttributes` names.
pub fn review_attributes(spec: &Value) -> Attributes {
    let a = spec.get("resourceAttributes").cloned().unwrap_or_default();
    let t = |k: &str| text(&a, &[k]).to_string();
    Attributes {
        verb: t("verb"),
        group: t("group"),
        resource: t("resource"),
        subresource: t("subresource"),
        namespace: t("namespace"),
        name: t("name"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_rule_matches_verbs_groups_resources_subresources_and_names() {
        let rule = json!({"apiGroups": ["apps"], "resources": ["deployments", "*/scale"],
                          "verbs": ["get", "patch"], "resourceNames": ["web"]});
        assert!(rule_allows(
            &rule,
            &attrs("get", "apps", "deployments", "", "web")
        ));
        assert!(rule_allows(
            &rule,
            &attrs("patch", "apps", "deployments", "scale", "web")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("get", "apps", "deployments", "", "db")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("list", "apps", "deployments", "", "")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("patch", "apps", "deployments", "status", "web")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("get", "", "deployments", "", "web")
        ));
        let wild = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(rule_allows(
            &wild,
            &attrs("delete", "x.io", "things", "status", "")
        ));
    }

    #[test]
    fn impersonation_headers_name_the_user_and_a_service_account_its_groups() {
        let mut h = http::HeaderMap::new();
        assert!(UserInfo::of_request(&h).is_master());
        h.insert(
            "impersonate-user",
            "system:serviceaccount:ops:runbook".parse().unwrap(),
        );
        h.append("impersonate-group", "extra".parse().unwrap());
        h.insert(
            "impersonate-extra-scopes.example.com%2fx",
            "a".parse().unwrap(),
        );
        let u = UserInfo::of_request(&h);
        assert_eq!(u.username, "system:serviceaccount:ops:runbook");
        assert!(!u.is_master());
        for g in [
            "extra",
            "system:serviceaccounts",
            "system:serviceaccounts:ops",
            "system:authenticated",
        ] {
            assert!(u.groups.iter().any(|x| x == g), "{g} in {:?}", u.groups);
        }
        assert_eq!(u.extra["scopes.example.com/x"], ["a"]);
    }

    #[test]
    fn a_refusal_reads_as_the_api_servers() {
        let a = attrs("patch", "apps", "deployments", "", "web");
        assert_eq!(
            a.forbidden_message("alice"),
            "deployments.apps \"web\" is forbidden: User \"alice\" cannot patch resource \"deployments\" in API group \"apps\" in the namespace \"ns\""
        );
        let mut l = attrs("list", "", "pods", "", "");
        l.namespace.clear();
        assert_eq!(
            l.forbidden_message("bob"),
            "pods is forbidden: User \"bob\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
        );
    }
}
