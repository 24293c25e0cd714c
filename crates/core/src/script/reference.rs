//! Every function Runbook gives a script, as its users read them: written
//! here once, held by a test to what the engine registers (a function
//! without an entry, or an entry for nothing, fails it), and printed as
//! `docs/script-functions.md` by `runbook schema --functions`.

use std::collections::BTreeSet;

use rhai::Engine;

/// One function (all its overloads of one arity).
pub struct Entry {
    /// The section it is listed under.
    pub group: Group,
    /// Its name as Rhai registers it (`get$field` for a property).
    pub name: &'static str,
    /// How many arguments it takes, the receiver of a method included.
    pub arity: usize,
    /// How it is called.
    pub call: &'static str,
    /// What it does.
    pub text: &'static str,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Group {
    Ctx,
    Lookups,
    Helpers,
    Views,
    Actions,
}

impl Group {
    const ALL: [Group; 5] = [
        Group::Ctx,
        Group::Lookups,
        Group::Helpers,
        Group::Views,
        Group::Actions,
    ];

    fn title(self) -> &'static str {
        match self {
            Group::Ctx => "What `ctx` tells",
            Group::Lookups => "Lookups in the caches",
            Group::Helpers => "Helpers",
            Group::Views => "Object views",
            Group::Actions => "Actions",
        }
    }

    fn intro(self) -> &'static str {
        match self {
            Group::Ctx => {
                "Properties of the `ctx` a script's `reconcile(ctx)` and `finalize(ctx)` receive."
            }
            Group::Lookups => {
                "Objects of the kinds the policy declares (`owns`, `reads`, `mutates`), from \
                 the operator's watch caches; a kind not declared is an error at the call. \
                 Each read is recorded, so a change of what was read wakes the target."
            }
            Group::Helpers => "Functions of their arguments only.",
            Group::Views => {
                "Objects from `ctx` are read-only views sharing the watch cache: read them as \
                 maps (`obj.spec.replicas`, `obj[\"metadata\"]`); a missing field is an \
                 error at its position (`?.` and `?? default` where it may be absent)."
            }
            Group::Actions => {
                "What a script returns: an array of these. Each is checked against what the \
                 policy declares before anything is written."
            }
        }
    }
}

macro_rules! entry {
    ($group:ident, $name:literal, $arity:literal, $call:literal, $text:literal) => {
        Entry {
            group: Group::$group,
            name: $name,
            arity: $arity,
            call: $call,
            text: $text,
        }
    };
}

/// The functions, in the order the reference lists them.
pub const FUNCTIONS: &[Entry] = &[
    entry!(
        Ctx,
        "get$resource",
        1,
        "ctx.resource",
        "The target, as a view."
    ),
    entry!(
        Ctx,
        "get$params",
        1,
        "ctx.params",
        "The policy's `params`, as a map."
    ),
    entry!(
        Ctx,
        "get$now",
        1,
        "ctx.now",
        "The time of the decision, in unix seconds."
    ),
    entry!(
        Ctx,
        "get$due",
        1,
        "ctx.due",
        "Whether a scheduled policy's run is due."
    ),
    entry!(
        Ctx,
        "get$next_run",
        1,
        "ctx.next_run",
        "When the schedule fires next (unix seconds), or `()`."
    ),
    entry!(
        Ctx,
        "get$last_run",
        1,
        "ctx.last_run",
        "When the schedule fired last (unix seconds), or `()`."
    ),
    entry!(
        Ctx,
        "get$run",
        1,
        "ctx.run",
        "The current run's id, from its fire time."
    ),
    entry!(
        Ctx,
        "get$namespace",
        1,
        "ctx.namespace",
        "The target's namespace (`\"\"` for a cluster-scoped target)."
    ),
    entry!(
        Ctx,
        "get$policy",
        1,
        "ctx.policy",
        "`#{name, version}` of the policy deciding."
    ),
    entry!(
        Lookups,
        "owned",
        2,
        "ctx.owned(kind)",
        "The policy's own children of a kind (its label and a controller ownerReference to the target), sorted by name."
    ),
    entry!(
        Lookups,
        "get",
        3,
        "ctx.get(kind, name)",
        "One object of the target's namespace, or `()`."
    ),
    entry!(
        Lookups,
        "list",
        2,
        "ctx.list(kind)",
        "Every object of a kind in the target's namespace, sorted by name."
    ),
    entry!(
        Lookups,
        "list",
        3,
        "ctx.list(kind, selector)",
        "Those whose labels match a selector (`#{app: \"web\"}` or `\"app=web,tier!=db\"`), from the label index."
    ),
    entry!(
        Lookups,
        "owned_by",
        3,
        "ctx.owned_by(kind, owner)",
        "Objects of a kind with an ownerReference to `owner`."
    ),
    entry!(
        Lookups,
        "pods_of",
        2,
        "ctx.pods_of(obj)",
        "The pods a workload or Job selects (its `spec.selector`, else the pods it owns); needs Pods in `reads`."
    ),
    entry!(
        Lookups,
        "allowed",
        2,
        "ctx.allowed(verb)",
        "Whether the policy's limits allow one more `\"rollback\"`, `\"delete\"`, `\"patch\"` or `\"apply\"` now."
    ),
    entry!(
        Helpers,
        "is_ready",
        1,
        "is_ready(obj)",
        "Whether an object is ready, as its kind says: a Pod's `Ready` condition; a Deployment's updated and available replicas, a StatefulSet's or ReplicaSet's ready ones (its generation observed); a Job succeeded; a VolumeSnapshot ready to use; a PersistentVolumeClaim bound."
    ),
    entry!(
        Helpers,
        "all_ready",
        1,
        "all_ready(objs)",
        "Whether every object of an array is ready (false for none)."
    ),
    entry!(
        Helpers,
        "job_succeeded",
        1,
        "job_succeeded(job)",
        "Whether a Job has succeeded."
    ),
    entry!(
        Helpers,
        "job_failed",
        1,
        "job_failed(job)",
        "Whether a Job has failed."
    ),
    entry!(
        Helpers,
        "condition_is",
        3,
        "condition_is(obj, type, status)",
        "Whether an object's condition `type` has `status`: `true`, `false`, or `\"True\"`, `\"False\"`, `\"Unknown\"`, as `condition` takes it."
    ),
    entry!(
        Helpers,
        "termination_message",
        1,
        "termination_message(pod)",
        "The first non-empty termination message of a pod's containers (their current state, then their last), or `()`."
    ),
    entry!(
        Helpers,
        "revision_of",
        1,
        "revision_of(obj)",
        "The `deployment.kubernetes.io/revision` of a Deployment or ReplicaSet, as a number, or `()`."
    ),
    entry!(
        Helpers,
        "labels_match",
        2,
        "labels_match(obj, selector)",
        "Whether an object's labels match a map of labels."
    ),
    entry!(
        Helpers,
        "parse_json",
        1,
        "parse_json(text)",
        "A value from JSON text; an error naming the fault otherwise."
    ),
    entry!(
        Helpers,
        "to_json",
        1,
        "to_json(value)",
        "A value as compact JSON text."
    ),
    entry!(
        Helpers,
        "hash",
        1,
        "hash(value)",
        "A short stable hash of a value's JSON."
    ),
    entry!(
        Helpers,
        "duration",
        1,
        "duration(text)",
        "Seconds in a duration such as `\"90s\"`, `\"5m\"`, `\"1h30m\"`."
    ),
    entry!(
        Helpers,
        "format_time",
        1,
        "format_time(secs)",
        "Unix seconds as RFC 3339 text."
    ),
    entry!(
        Helpers,
        "parse_time",
        1,
        "parse_time(text)",
        "RFC 3339 text as unix seconds; `()` for `()` or text that is not a time."
    ),
    entry!(
        Helpers,
        "to_map",
        1,
        "to_map(obj)",
        "A copy of a view (or a map) that the script can change."
    ),
    entry!(
        Views,
        "len",
        1,
        "obj.len()",
        "How many fields (or items) a view holds."
    ),
    entry!(
        Views,
        "is_empty",
        1,
        "obj.is_empty()",
        "Whether it holds none."
    ),
    entry!(
        Views,
        "contains",
        2,
        "obj.contains(key)",
        "Whether it has the field `key`."
    ),
    entry!(Views, "keys", 1, "obj.keys()", "Its field names."),
    entry!(Views, "values", 1, "obj.values()", "Its field values."),
    entry!(
        Views,
        "to_string",
        1,
        "obj.to_string()",
        "Its JSON text (also what `${obj}` in a string gives); `()` made text is an error."
    ),
    entry!(
        Views,
        "to_debug",
        1,
        "obj.to_debug()",
        "The same, for `debug(obj)`."
    ),
    entry!(
        Views,
        "==",
        2,
        "a == b",
        "Equal content (a view and a view, or a view and a map)."
    ),
    entry!(Views, "!=", 2, "a != b", "Different content."),
    entry!(
        Actions,
        "apply",
        1,
        "apply(obj)",
        "Server-side apply of an object the policy owns (labelled and owner-referenced for it)."
    ),
    entry!(
        Actions,
        "sync_children",
        2,
        "ctx.sync_children(want)",
        "The complete set of children the policy wants: an `apply` for each (in order), then a `delete` for each of its own children of the kinds it owns that `want` does not name, the highest name first. Terminating children are not deleted again."
    ),
    entry!(
        Actions,
        "sync_children",
        3,
        "ctx.sync_children(want, kinds)",
        "The same, deleting only children of `kinds` (an array of owned kinds)."
    ),
    entry!(
        Actions,
        "delete",
        1,
        "delete(obj)",
        "Delete one of the policy's own children, or an object `spec.deletes` lets it delete (its target included, where it names the target's kind)."
    ),
    entry!(
        Actions,
        "delete",
        2,
        "delete(kind, name)",
        "The same, by kind and name."
    ),
    entry!(
        Actions,
        "patch",
        2,
        "patch(obj, merge_patch)",
        "Merge-patch an object of a kind the policy `mutates`."
    ),
    entry!(
        Actions,
        "patch",
        3,
        "patch(kind, name, merge_patch)",
        "The same, by kind and name."
    ),
    entry!(
        Actions,
        "status",
        1,
        "status(map)",
        "Fields of the target's status (those the policy declares)."
    ),
    entry!(
        Actions,
        "condition",
        4,
        "condition(type, status, reason, message)",
        "A condition of the target (`status` a bool or `\"True\"`/`\"False\"`/`\"Unknown\"`)."
    ),
    entry!(
        Actions,
        "rollback",
        1,
        "rollback(name)",
        "Roll the Deployment `name` (a mutated kind) back to its previous revision."
    ),
    entry!(
        Actions,
        "rollback",
        2,
        "rollback(name, revision)",
        "Roll it back to a revision (`()`: the previous one)."
    ),
    entry!(
        Actions,
        "alert",
        1,
        "alert(#{labels, annotations})",
        "Raise an alert, routed by the policy's AlertRoutes."
    ),
    entry!(
        Actions,
        "alert",
        2,
        "alert(severity, summary)",
        "The same, with a severity and a summary."
    ),
    entry!(
        Actions,
        "event",
        3,
        "event(type, reason, message)",
        "A Kubernetes Event on the target (`\"Normal\"` or `\"Warning\"`)."
    ),
    entry!(
        Actions,
        "get$verb",
        1,
        "action.verb",
        "What an action does (`\"apply\"`, `\"delete\"`, `\"rollback\"`, ...), as limits count it."
    ),
    entry!(
        Actions,
        "requeue",
        1,
        "requeue(after)",
        "Decide again after a duration (`\"30s\"`, or a number of seconds)."
    ),
];

/// Names Rhai registers that are not functions a user calls: a view's
/// indexers (what `obj["key"]` and `obj.key` use).
const NOT_CALLED: &[&str] = &["index$get$", "index$set$"];

/// What the engine registers of Runbook's own (Rhai's standard functions
/// aside), as (name, arity).
pub fn registered(engine: &Engine) -> BTreeSet<(String, usize)> {
    engine
        .collect_fn_metadata(
            None,
            |f| Some((f.metadata.name.to_string(), f.metadata.num_params)),
            false,
        )
        .into_iter()
        .filter(|(name, _)| !NOT_CALLED.contains(&name.as_str()))
        .collect()
}

/// The reference, as Markdown.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Script functions\n\n\
         Every function Runbook gives a script, beside Rhai's own (strings, arrays, maps, \
         numbers: see the Rhai book). Generated by `runbook schema --functions` from the \
         table in `crates/core/src/script/reference.rs`, which a test holds to what the engine \
         registers; regenerate with\n\n    \
         cargo run -q -- schema --functions > docs/script-functions.md\n",
    );
    for group in Group::ALL {
        out.push_str(&format!("\n## {}\n\n{}\n\n", group.title(), group.intro()));
        out.push_str("| call | what it does |\n|---|---|\n");
        for e in FUNCTIONS.iter().filter(|e| e.group == group) {
            out.push_str(&format!(
                "| `{}` | {} |\n",
                e.call,
                e.text.replace('|', "\\|")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_function_has_an_entry_and_every_entry_a_function() {
        let engine = crate::script::ScriptEngine::default();
        let registered = registered(engine.rhai());
        assert!(registered.len() > 40, "{registered:?}");
        let documented: BTreeSet<(String, usize)> = FUNCTIONS
            .iter()
            .map(|e| (e.name.to_string(), e.arity))
            .collect();
        let missing: Vec<_> = registered.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&registered).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "registered without an entry in crates/core/src/script/reference.rs: {missing:?}; \
             entries for nothing registered: {extra:?}"
        );
    }
}
