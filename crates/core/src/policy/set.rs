//! `PolicySet`: every compiled policy and routing tree of one version,
//! immutable, swapped in whole.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::compile::{CompiledPolicy, LoadError, Loaded};
use super::model::Mode;
use crate::alert::routes::CompiledRoutes;
use crate::kinds::KindRef;
use crate::labels::{Requirement, Selector};
use crate::util::hash::short_hex;
use crate::util::yaml::Pos;

#[derive(Clone, Debug, Default)]
pub struct PolicySet {
    /// Content hash over every policy and routes version.
    pub version: String,
    /// By id: the name, or `NAMESPACE/NAME` for a tenant's.
    pub policies: BTreeMap<String, Arc<CompiledPolicy>>,
    /// By id, as policies.
    pub routes: BTreeMap<String, Arc<CompiledRoutes>>,
}

/// The id of routes or a policy named `name` for `tenant` (`None`:
/// cluster-wide).
pub fn id_of(tenant: Option<&str>, name: &str) -> String {
    match tenant {
        Some(t) => format!("{t}/{name}"),
        None => name.to_string(),
    }
}

/// Two selectors that cannot both match one object: some key is required
/// to equal different values.
fn disjoint(a: &Selector, b: &Selector) -> bool {
    a.0.iter().any(|ra| {
        b.0.iter().any(|rb| match (ra, rb) {
            (Requirement::Eq(ka, va), Requirement::Eq(kb, vb)) => ka == kb && va != vb,
            _ => false,
        })
    })
}

/// `file:line:col`, as errors name a place.
fn place(file: &str, pos: Option<Pos>) -> String {
    match pos {
        Some(p) => format!("{file}:{}:{}", p.line, p.col),
        None => file.to_string(),
    }
}

impl PolicySet {
    /// Combine loaded bundles, checking what only the whole set can show:
    /// duplicate names (a tenant's are its namespace's, but none may take
    /// a cluster-wide policy's or routes' name, since those act in every
    /// namespace), alert routes that do not exist, and two enforcing
    /// policies on the same targets that would write the same part of
    /// their status.
    pub fn build(mut loaded: Vec<Loaded>) -> (PolicySet, Vec<LoadError>) {
        let mut errors = Vec::new();
        let mut set = PolicySet::default();
        let mut all_policies = Vec::new();
        // Cluster-wide bundles first: a tenant's policy or routes can
        // never take a name, or a part of a status, from them.
        loaded.sort_by_key(|l| {
            l.policies.iter().any(|p| p.tenant.is_some())
                || l.routes.iter().any(|r| r.tenant.is_some())
        });
        for l in loaded {
            errors.extend(l.errors);
            for r in l.routes {
                if let Some(first) = set.routes.get(&r.id) {
                    errors.push(LoadError {
                        file: r.file.clone(),
                        pos: r.pos,
                        message: format!(
                            "AlertRoutes {:?} is already defined at {}",
                            r.name,
                            place(&first.file, first.pos)
                        ),
                    });
                    continue;
                }
                set.routes.insert(r.id.clone(), Arc::new(r));
            }
            all_policies.extend(l.policies);
        }
        for p in all_policies {
            if let Some(error) = set.refusal(&p) {
                errors.push(error);
                continue;
            }
            set.policies.insert(p.id.clone(), Arc::new(p));
        }
        set.version = set.compute_version();
        (set, errors)
    }

    /// Why a policy cannot join the set, if it cannot.
    fn refusal(&self, p: &CompiledPolicy) -> Option<LoadError> {
        let error = |pos: Option<Pos>, message: String| LoadError {
            file: p.file.clone(),
            pos,
            message,
        };
        let existing = self.policies.get(&p.id).or_else(|| {
            self.policies
                .get(&p.name)
                .filter(|q| q.tenant.is_none() && p.tenant.is_some())
        });
        if let Some(existing) = existing {
            return Some(error(
                None,
                format!(
                    "policy {:?} is already defined in {}",
                    p.name, existing.file
                ),
            ));
        }
        if let (Some(r), Some(tenant)) = (&p.alerts, &p.tenant)
            && !self.routes.contains_key(&id_of(Some(tenant), r))
            && let Some(routes) = self.routes.get(r)
        {
            return Some(error(
                p.alerts_pos,
                format!(
                    "spec.alerts: AlertRoutes {r:?} ({}) is not of namespace {tenant:?}: a policy from a ConfigMap in {tenant:?} sends alerts only through routes loaded from {tenant:?}",
                    routes.file
                ),
            ));
        }
        if let Some(r) = &p.alerts
            && !self.routes.contains_key(&id_of(p.tenant.as_deref(), r))
        {
            let known: Vec<&str> = self
                .routes
                .values()
                .filter(|x| x.tenant == p.tenant)
                .map(|x| x.name.as_str())
                .collect();
            let hint = match crate::util::suggest::closest(r, known.iter().copied()) {
                Some(m) => format!(" (did you mean {m:?}?)"),
                None if known.is_empty() => " (no AlertRoutes document is loaded)".into(),
                None => format!(" (loaded: {})", known.join(", ")),
            };
            return Some(error(
                p.alerts_pos,
                format!("spec.alerts: no AlertRoutes named {r:?} is loaded{hint}"),
            ));
        }
        if p.mode != Mode::Enforce {
            return None;
        }
        self.policies
            .values()
            .filter(|q| {
                q.target == p.target
                    && !q.sweep
                    && !p.sweep
                    && q.mode == Mode::Enforce
                    && !disjoint(&q.selector, &p.selector)
                    && !(q.tenant.is_some() && p.tenant.is_some() && q.tenant != p.tenant)
            })
            .find_map(|q| {
                let o = q.status.overlap(&p.status)?;
                Some(error(
                    o.second,
                    format!(
                        "policies {:?} ({}) and {:?} both write {} of {}: each policy on a kind declares the status it writes (spec.status: {{fields: [...], conditions: [...]}}) and no two declare the same, or one is mode: shadow",
                        q.name,
                        place(&q.file, o.first),
                        p.name,
                        o.what,
                        p.target
                    ),
                ))
            })
    }

    fn compute_version(&self) -> String {
        let mut text = String::new();
        for (name, p) in &self.policies {
            text.push_str(&format!("p:{name}={}\n", p.version));
        }
        for (name, r) in &self.routes {
            text.push_str(&format!("r:{name}={}\n", r.version));
        }
        short_hex(text.as_bytes(), 12)
    }

    /// Policies that decide for each target of a kind, in the order they
    /// run (priority, then name); a sweep over the kind is not one.
    pub fn for_target(&self, kind: &KindRef) -> Vec<Arc<CompiledPolicy>> {
        let mut out: Vec<_> = self
            .policies
            .values()
            .filter(|p| &p.target == kind && !p.sweep)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        out
    }

    /// The sweeps (`spec.sweep`), by id.
    pub fn sweeps(&self) -> impl Iterator<Item = &Arc<CompiledPolicy>> {
        self.policies.values().filter(|p| p.sweep)
    }

    /// The routing tree a policy's alerts go through: its own, else the one
    /// named `default`.
    pub fn routes_for(&self, policy: &CompiledPolicy) -> Option<Arc<CompiledRoutes>> {
        let name = policy.alerts.as_deref().unwrap_or("default");
        self.routes
            .get(&id_of(policy.tenant.as_deref(), name))
            .filter(|r| r.tenant == policy.tenant)
            .cloned()
    }

    /// The label selector a watch of `kind`'s targets can ask the API
    /// server for: that of its policies when every one has the same
    /// non-empty selector, no policy declares the kind otherwise (owns,
    /// reads, mutates: it sees every object of it) and none has a
    /// `finalize` (a target that stops matching must still be seen, to
    /// finalize it and take its finalizer off). `None`: watch all.
    pub fn watch_selector(&self, kind: &KindRef) -> Option<String> {
        let targeting = self.for_target(kind);
        let first = &targeting.first()?.selector;
        // A sweep over the kind lists its targets from the same cache.
        let same = targeting
            .iter()
            .chain(self.sweeps().filter(|p| &p.target == kind))
            .all(|p| &p.selector == first && !p.has_finalizer());
        let declared_elsewhere = self
            .policies
            .values()
            .any(|p| &p.target != kind && p.kinds.declares(kind));
        (!first.is_empty() && same && !declared_elsewhere).then(|| first.to_string())
    }

    /// Every kind a policy decides for target by target (a kind only
    /// swept is cached, not reconciled).
    pub fn target_kinds(&self) -> Vec<KindRef> {
        let mut out: Vec<KindRef> = self
            .policies
            .values()
            .filter(|p| !p.sweep)
            .map(|p| p.target.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Bundle, Origin, load_bundle};
    use crate::script::ScriptEngine;

    const ROUTES: &str = "apiVersion: runbook.dev/v1alpha1\nkind: AlertRoutes\nmetadata: {name: NAME}\nspec:\n  route: {receiver: hook}\n  receivers:\n    - name: hook\n      webhook: {url: {secretKeyRef: {SECRET}}}\n";

    fn policy(name: &str, alerts: &str) -> String {
        format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: {name}}}\nspec:\n  target: {{apiVersion: runbook.dev/v1alpha1, kind: Evaluator}}\n  script: p.rhai\n  status: {{fields: [{name}]}}\n{alerts}"
        )
    }

    /// A bundle from a ConfigMap in `ns`, confined there unless `ns` is
    /// the operator's (`runbook-system`).
    fn loaded(ns: &str, files: &[(&str, String)]) -> Loaded {
        let mut files: std::collections::BTreeMap<String, String> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        files.insert("p.rhai".into(), "fn reconcile(ctx) { [] }".into());
        let origin = Origin::ConfigMap {
            namespace: ns.into(),
            name: "policies".into(),
        };
        let mut l = load_bundle(&ScriptEngine::default(), &Bundle::new(origin, files), None);
        if ns != "runbook-system" {
            l.confine_to(ns, &Default::default());
        }
        l
    }

    fn routes(name: &str, secret: &str) -> String {
        ROUTES.replace("NAME", name).replace("SECRET", secret)
    }

    /// The server-side label selector of a watch of targets, unless a
    /// policy on the kind has a `finalize`: then every object is watched,
    /// so that one leaving the selector is finalized.
    #[test]
    fn a_policy_with_finalize_watches_every_object_of_its_kind() {
        let evaluator = KindRef::new("runbook.dev/v1alpha1", "Evaluator");
        for (script, watched) in [
            ("fn reconcile(ctx) { [] }", Some("team=a".to_string())),
            ("fn reconcile(ctx) { [] }\nfn finalize(ctx) { [] }", None),
        ] {
            let mut files: std::collections::BTreeMap<String, String> = Default::default();
            files.insert(
                "p.yaml".into(),
                format!(
                    "{}  selector: {{matchLabels: {{team: a}}}}\n",
                    policy("p", "")
                ),
            );
            files.insert("p.rhai".into(), script.into());
            let origin = Origin::Inline("t".into());
            let l = load_bundle(&ScriptEngine::default(), &Bundle::new(origin, files), None);
            assert!(l.errors.is_empty(), "{:?}", l.errors);
            let (set, errors) = PolicySet::build(vec![l]);
            assert!(errors.is_empty(), "{errors:?}");
            assert_eq!(set.watch_selector(&evaluator), watched, "{script}");
        }
    }

    #[test]
    fn a_tenants_policy_acts_in_its_namespace_and_alerts_through_its_own_routes() {
        let ops = loaded(
            "runbook-system",
            &[
                ("drift.yaml", policy("drift", "")),
                ("routes.yaml", routes("default", "name: ops, key: url")),
            ],
        );
        let team = loaded(
            "team-a",
            &[
                ("notes.yaml", policy("notes", "  alerts: team-a\n")),
                ("routes.yaml", routes("team-a", "name: hooks, key: url")),
            ],
        );
        assert!(team.errors.is_empty(), "{:?}", team.errors);
        let (set, errors) = PolicySet::build(vec![team, ops]);
        assert!(errors.is_empty(), "{errors:?}");
        let notes = &set.policies["team-a/notes"];
        assert!(notes.acts_in("team-a") && !notes.acts_in("team-b"));
        assert!(set.policies["drift"].acts_in("team-b"));
        assert_eq!(set.routes_for(notes).unwrap().name, "team-a");
        // Without `alerts:`, a tenant's policy does not fall back to the
        // operator's default routes.
        let quiet = loaded("team-a", &[("quiet.yaml", policy("quiet", ""))]);
        let (set, _) = PolicySet::build(vec![quiet]);
        assert!(set.routes_for(&set.policies["team-a/quiet"]).is_none());
    }

    #[test]
    fn a_tenant_may_not_reach_other_namespaces_secrets_routes_or_names() {
        // A Secret in the operator's namespace, named from a tenant's routes.
        let team = loaded(
            "team-a",
            &[(
                "routes.yaml",
                routes("team-a", "name: ops, key: url, namespace: runbook-system"),
            )],
        );
        let e = team
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("configmap/team-a/policies/routes.yaml:8:"),
            "{e:?}"
        );
        assert!(
            e[0].contains("may read Secrets only in \"team-a\""),
            "{e:?}"
        );
        // The operator's routes, named from a tenant's policy.
        let ops = loaded(
            "runbook-system",
            &[("routes.yaml", routes("default", "name: ops, key: url"))],
        );
        let team = loaded(
            "team-a",
            &[("p.yaml", policy("notes", "  alerts: default\n"))],
        );
        let (set, errors) = PolicySet::build(vec![team, ops]);
        assert!(!set.policies.contains_key("team-a/notes"));
        assert!(
            errors[0]
                .message
                .contains("sends alerts only through routes loaded from \"team-a\""),
            "{errors:?}"
        );
        // A tenant's policy named like a cluster-wide one never displaces
        // it, whatever the order the bundles come in.
        let ops = loaded("runbook-system", &[("drift.yaml", policy("drift", ""))]);
        let squat = loaded("aaa", &[("drift.yaml", policy("drift", ""))]);
        let (set, errors) = PolicySet::build(vec![squat, ops]);
        assert_eq!(set.policies["drift"].tenant, None);
        assert!(errors[0].file.starts_with("configmap/aaa/"), "{errors:?}");
    }
}
