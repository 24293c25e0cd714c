//! `runbook capture`: a live cluster as a scenario. The policies in force
//! (a directory, or the ConfigMaps the operator reads), the objects of
//! every kind they target, own, read, mutate or delete (as the operator's
//! caches would hold them), Runbook's state of them, and the CRDs of the
//! kinds involved, written as a scenario directory `runbook simulate` and
//! `runbook replay` run as it stands, starting at the capture time.
//!
//! What could identify the cluster's secrets never leaves it: a Secret's
//! values are replaced by placeholders naming their key, and the
//! `last-applied-configuration` annotation (which repeats an object
//! whole) is dropped from everything.

use std::collections::BTreeSet;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use kube::Api;
use kube::api::{DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use runbook_core::kinds::KindRef;
use runbook_core::policy::Bundle;

#[derive(clap::Args, Debug)]
pub struct CaptureArgs {
    /// The cluster to read (default: $KUBECONFIG, ~/.kube/config, or the
    /// pod's own).
    #[arg(long, env = "RUNBOOK_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Capture this namespace (default: the kubeconfig context's).
    #[arg(
        long,
        short = 'n',
        env = "RUNBOOK_CAPTURE_NAMESPACE",
        conflicts_with = "all_namespaces"
    )]
    pub namespace: Option<String>,
    /// Capture every namespace.
    #[arg(long, short = 'A', env = "RUNBOOK_CAPTURE_ALL_NAMESPACES")]
    pub all_namespaces: bool,
    /// The policies: a directory of them (its `*.yaml` and `*.rhai`).
    #[arg(
        long,
        env = "RUNBOOK_CAPTURE_POLICIES",
        conflicts_with = "from_cluster"
    )]
    pub policies: Option<PathBuf>,
    /// The policies the operator reads: the ConfigMaps labelled
    /// `runbook.dev/policy=true` in its namespace.
    #[arg(long, env = "RUNBOOK_CAPTURE_FROM_CLUSTER")]
    pub from_cluster: bool,
    /// The operator's namespace (its policy ConfigMaps, and its state of
    /// cluster-scoped targets).
    #[arg(
        long,
        env = "RUNBOOK_OPERATOR_NAMESPACE",
        default_value = "runbook-system"
    )]
    pub operator_namespace: String,
    /// The scenario directory to write (made if absent).
    #[arg(long, short = 'o', env = "RUNBOOK_CAPTURE_OUT")]
    pub out: PathBuf,
    /// Refuse (with the count) when the policies' kinds hold more objects
    /// than this in the namespaces captured.
    #[arg(long, env = "RUNBOOK_CAPTURE_MAX_OBJECTS", default_value_t = 20_000)]
    pub max_objects: usize,
    /// How long the written scenario runs.
    #[arg(long, env = "RUNBOOK_CAPTURE_UNTIL", default_value = "1h")]
    pub until: String,
}

/// What a capture read: the objects (CRDs apart), the policies' bundles,
/// the capture time.
pub struct Captured {
    pub crds: Vec<Value>,
    pub objects: Vec<Value>,
    pub bundles: Vec<Bundle>,
    pub namespace: String,
    pub at: jiff::Timestamp,
}

pub fn run(args: CaptureArgs) -> anyhow::Result<ExitCode> {
    let rt = super::runtime()?;
    let started = std::time::Instant::now();
    let captured = rt.block_on(capture(&args))?;
    let n = captured.objects.len();
    let bytes = write(&args.out, &captured, &args.until)?;
    eprintln!(
        "captured {n} objects, {} CRDs and {} policy bundles into {} ({bytes} bytes) in {:.1}s",
        captured.crds.len(),
        captured.bundles.len(),
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The policies' bundles, from a directory or the operator's ConfigMaps.
async fn bundles(args: &CaptureArgs, client: &kube::Client) -> anyhow::Result<Vec<Bundle>> {
    match (&args.policies, args.from_cluster) {
        (Some(dir), _) => {
            let b = Bundle::from_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
            Ok(vec![b])
        }
        (None, true) => {
            runbook_operator::reload::sources::configmap_bundles(client, &args.operator_namespace)
                .await
                .with_context(|| {
                    format!(
                        "reading the policy ConfigMaps in {}",
                        args.operator_namespace
                    )
                })
        }
        (None, false) => bail!("give the policies: --policies DIR, or --from-cluster"),
    }
}

/// Every kind the policies declare (their targets first), each with the
/// names it is read by when every policy declaring it reads it by name
/// only (the operator watches just those), and Runbook's state kind
/// where one keeps its state apart.
fn kinds_of(bundles: &[Bundle]) -> anyhow::Result<Vec<(KindRef, Option<BTreeSet<String>>)>> {
    let engine = runbook_core::script::ScriptEngine::default();
    let mut kinds: Vec<(KindRef, Option<BTreeSet<String>>)> = Vec::new();
    let mut state = false;
    for b in bundles {
        let loaded = runbook_core::policy::compile::load_bundle(&engine, b, None);
        if let Some(e) = loaded.errors.first() {
            bail!("the policies do not load: {e}");
        }
        for p in &loaded.policies {
            state |= !runbook_core::kinds::owns_schema(&p.target) || p.sweep;
            for k in p.kinds.kinds() {
                let names = p.names_read(k).cloned();
                match kinds.iter_mut().find(|(have, _)| have == k) {
                    Some((_, seen)) => {
                        *seen = match (seen.take(), names) {
                            (Some(mut a), Some(b)) => {
                                a.extend(b);
                                Some(a)
                            }
                            _ => None,
                        }
                    }
                    None => kinds.push((k.clone(), names)),
                }
            }
        }
    }
    if state {
        kinds.push((KindRef::new("runbook.dev/v1alpha1", "RunbookState"), None));
    }
    Ok(kinds)
}

async fn capture(args: &CaptureArgs) -> anyhow::Result<Captured> {
    let config = super::run::config(args.kubeconfig.as_ref()).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config)?;
    let at = jiff::Timestamp::now();
    let bundles = bundles(args, &client).await?;
    let kinds = kinds_of(&bundles)?;
    let scope = (!args.all_namespaces).then_some(namespace.as_str());
    let progress = Progress::new();
    let mut objects: Vec<Value> = Vec::new();
    let mut crds: Vec<Value> = Vec::new();
    for (k, names) in &kinds {
        let (ar, namespaced) = resolve(&client, k).await?;
        if let Some(crd) = crd_of(&client, k, &ar).await? {
            crds.push(crd);
        }
        let api: Api<DynamicObject> = match (namespaced, scope) {
            (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
            _ => Api::all_with(client.clone(), &ar),
        };
        // Read by name where one API holds them all; across every
        // namespace, listed and picked.
        if let Some(names) = names.as_ref().filter(|_| !namespaced || scope.is_some()) {
            for name in names {
                if let Some(o) = api
                    .get_opt(name)
                    .await
                    .with_context(|| format!("reading {k} {name}"))?
                {
                    objects.push(typed(o, &ar)?);
                }
            }
            continue;
        }
        let mut page = ListParams::default().limit(500);
        let mut listed = 0usize;
        loop {
            let list = api
                .list(&page)
                .await
                .with_context(|| format!("listing {k}"))?;
            listed += list.items.len();
            let remaining = list
                .metadata
                .remaining_item_count
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(0);
            for o in list.items {
                let named = o.metadata.name.as_deref().unwrap_or("");
                if names.as_ref().is_none_or(|n| n.contains(named)) {
                    objects.push(typed(o, &ar)?);
                }
            }
            if objects.len() > args.max_objects {
                bail!(
                    "more than --max-objects {} objects of the policies' kinds (at least {} after listing {k}); capture one namespace (-n) or raise the bound",
                    args.max_objects,
                    objects.len()
                );
            }
            progress.show(k, listed, listed + remaining, objects.len());
            match list.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => page = page.continue_token(&c),
                None => break,
            }
        }
    }
    progress.done();
    // What the cluster makes in every namespace by itself, a scenario's
    // cluster makes too.
    objects.retain(|o| !(o["kind"] == "ConfigMap" && o["metadata"]["name"] == "kube-root-ca.crt"));
    objects.extend(namespaces_of(&client, &objects).await?);
    let objects = in_creation_order(objects.into_iter().map(cleaned).collect());
    Ok(Captured {
        crds,
        objects,
        bundles,
        namespace: scope.unwrap_or("default").to_string(),
        at,
    })
}

/// An object listed as JSON, with the kind a list leaves out.
fn typed(o: DynamicObject, ar: &ApiResource) -> anyhow::Result<Value> {
    let mut v = serde_json::to_value(o)?;
    v["apiVersion"] = json!(ar.api_version);
    v["kind"] = json!(ar.kind);
    Ok(v)
}

/// How a kind is served: its resource and whether it is namespaced.
async fn resolve(client: &kube::Client, k: &KindRef) -> anyhow::Result<(ApiResource, bool)> {
    let gvk = GroupVersionKind::gvk(k.group(), k.version(), &k.kind);
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {k}: is it served?"))?;
    Ok((ar, caps.scope == kube::discovery::Scope::Namespaced))
}

/// The CRD that defines a kind, as it could be created again; `None` for
/// a built-in kind and Runbook's own (a scenario installs those).
async fn crd_of(
    client: &kube::Client,
    k: &KindRef,
    ar: &ApiResource,
) -> anyhow::Result<Option<Value>> {
    // Only a group with a dot can be a CRD's (built-in `apps`, `batch`
    // cannot); one the cluster serves by itself has none, and Runbook's
    // own a scenario installs.
    if !k.group().contains('.') || k.group() == "runbook.dev" {
        return Ok(None);
    }
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &KindRef::new("apiextensions.k8s.io/v1", "CustomResourceDefinition").api_resource(),
    );
    let name = format!("{}.{}", ar.plural, ar.group);
    let Some(crd) = crds
        .get_opt(&name)
        .await
        .with_context(|| format!("reading CustomResourceDefinition {name}"))?
    else {
        return Ok(None);
    };
    let mut v = serde_json::to_value(crd)?;
    v["apiVersion"] = json!("apiextensions.k8s.io/v1");
    v["kind"] = json!("CustomResourceDefinition");
    if let Some(m) = v.as_object_mut() {
        m.remove("status");
    }
    Ok(Some(cleaned(v)))
}

/// The Namespaces the objects are in, as the cluster has them (labels a
/// policy may select by).
async fn namespaces_of(client: &kube::Client, objects: &[Value]) -> anyhow::Result<Vec<Value>> {
    let have: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "Namespace")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    let wanted: BTreeSet<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .filter(|ns| !have.contains(ns))
        .collect();
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let mut out = Vec::new();
    for ns in wanted {
        if let Some(n) = api
            .get_opt(ns)
            .await
            .with_context(|| format!("reading Namespace {ns}"))?
        {
            let mut v = serde_json::to_value(n)?;
            v["apiVersion"] = json!("v1");
            v["kind"] = json!("Namespace");
            out.push(v);
        }
    }
    Ok(out)
}

/// The annotation `kubectl apply` keeps a whole copy of an object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What a Secret's value becomes: its key, and how long it was.
fn placeholder(key: &str, encoded: &Value) -> Value {
    use base64::Engine as _;
    let len = encoded
        .as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .map_or(0, |b| b.len());
    let text = format!("<captured: {key}, {len} bytes, value not kept>");
    json!(base64::engine::general_purpose::STANDARD.encode(text))
}

/// An object as a scenario creates it again: what the server made of it
/// (uid, versions, times, managed fields) left out, owners named without
/// their uid (the scenario finds them by name), a Secret's values
/// replaced.
fn cleaned(mut v: Value) -> Value {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "managedFields",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            meta.remove(k);
        }
        if let Some(notes) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            notes.remove(LAST_APPLIED);
        }
        if let Some(refs) = meta
            .get_mut("ownerReferences")
            .and_then(Value::as_array_mut)
        {
            for r in refs.iter_mut().filter_map(Value::as_object_mut) {
                r.remove("uid");
            }
        }
    }
    if v["kind"] == "Secret" && v["apiVersion"] == "v1" {
        if let Some(data) = v.get_mut("data").and_then(Value::as_object_mut) {
            for (k, val) in data.iter_mut() {
                *val = placeholder(k, val);
            }
        }
        if let Some(m) = v.as_object_mut() {
            m.remove("stringData");
        }
    }
    if v["kind"] == "RunbookState"
        && let Some(t) = v.pointer_mut("/spec/target").and_then(Value::as_object_mut)
    {
        // The target's uid in the scenario is a new one.
        t.insert("uid".into(), json!(""));
    }
    v
}

/// Namespaces first, then each object after the owners it names among
/// those captured; an ownerReference to an object not captured is
/// dropped (the scenario could not make it).
fn in_creation_order(objects: Vec<Value>) -> Vec<Value> {
    let key = |kind: &str, ns: &str, name: &str| format!("{kind}|{ns}|{name}");
    let of = |o: &Value| {
        key(
            o["kind"].as_str().unwrap_or(""),
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or(""),
        )
    };
    let present: BTreeSet<String> = objects.iter().map(of).collect();
    let mut waiting: Vec<Value> = objects
        .into_iter()
        .map(|mut o| {
            let ns = o["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if let Some(refs) = o
                .pointer_mut("/metadata/ownerReferences")
                .and_then(Value::as_array_mut)
            {
                refs.retain(|r| {
                    let name = r["name"].as_str().unwrap_or("");
                    let kind = r["kind"].as_str().unwrap_or("");
                    present.contains(&key(kind, &ns, name))
                        || present.contains(&key(kind, "", name))
                });
            }
            o
        })
        .collect();
    waiting.sort_by_key(|o| (o["kind"] != "Namespace", of(o)));
    let mut made: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::with_capacity(waiting.len());
    while !waiting.is_empty() {
        let before = waiting.len();
        let (ready, rest): (Vec<Value>, Vec<Value>) = waiting.into_iter().partition(|o| {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or("");
            o["metadata"]["ownerReferences"]
                .as_array()
                .is_none_or(|refs| {
                    refs.iter().all(|r| {
                        let (kind, name) = (
                            r["kind"].as_str().unwrap_or(""),
                            r["name"].as_str().unwrap_or(""),
                        );
                        made.contains(&key(kind, ns, name)) || made.contains(&key(kind, "", name))
                    })
                })
        });
        made.extend(ready.iter().map(of));
        out.extend(ready);
        waiting = rest;
        if waiting.len() == before {
            // A cycle of owners (which the API server's collector would
            // not keep either): the rest as they come.
            out.append(&mut waiting);
        }
    }
    out
}

/// Write the scenario directory; the bytes written.
pub fn write(dir: &Path, c: &Captured, until: &str) -> anyhow::Result<u64> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut bytes = 0u64;
    let mut put = |name: &str, text: String| -> anyhow::Result<()> {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        bytes += text.len() as u64;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    let yaml = |docs: &[Value]| -> String {
        let mut out = String::new();
        for d in docs {
            out.push_str("---\n");
            out.push_str(&runbook_core::util::yaml::to_string(d));
        }
        out
    };
    put("crds.yaml", yaml(&c.crds))?;
    put("objects.yaml", yaml(&c.objects))?;
    let mut dirs = Vec::new();
    for (i, b) in c.bundles.iter().enumerate() {
        let sub = format!("policies/{i}");
        for (file, text) in &b.files {
            put(&format!("{sub}/{file}"), text.clone())?;
        }
        dirs.push(sub);
    }
    let at = runbook_core::util::time::format(
        jiff::Timestamp::from_second(c.at.as_second()).unwrap_or(c.at),
    );
    let scenario = json!({
        "apiVersion": "runbook.dev/v1alpha1",
        "kind": "Scenario",
        "metadata": {"name": format!("captured at {at}")},
        "spec": {
            "policies": dirs,
            "objects": ["crds.yaml", "objects.yaml"],
            "namespace": c.namespace,
            "start": at,
            "until": until,
        },
    });
    put(
        "scenario.yaml",
        format!(
            "# Captured by runbook capture: runbook simulate {0}, or runbook replay {0} --policies NEW/\n{1}",
            dir.display(),
            runbook_core::util::yaml::to_string(&scenario)
        ),
    )?;
    Ok(bytes)
}

/// One line of progress: a bar of 20 for the kind being listed.
fn bar(kind: &KindRef, done: usize, of: usize, total: usize) -> String {
    let of = of.max(done).max(1);
    let filled = (done * 20 / of).min(20);
    format!(
        "listing {kind} [{}{}] {done}/{of}, {total} objects in all",
        "#".repeat(filled),
        ".".repeat(20 - filled)
    )
}

/// How far the listing is, on standard error when it is a terminal.
struct Progress {
    on: bool,
}

impl Progress {
    fn new() -> Self {
        Self {
            on: std::io::stderr().is_terminal(),
        }
    }

    /// `done` of `of` objects of `kind` listed (the API server's count
    /// of those left), `total` captured so far.
    fn show(&self, kind: &KindRef, done: usize, of: usize, total: usize) {
        if self.on {
            eprint!("\r\x1b[K{}", bar(kind, done, of, total));
        }
    }

    fn done(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secrets_values_and_what_the_server_made_are_left_out() {
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db", "namespace": "shop", "uid": "u1", "resourceVersion": "9",
                "annotations": {LAST_APPLIED: "{\"data\":{\"password\":\"aHVudGVyMg==\"}}", "team": "ml"},
                "managedFields": [{}]},
            "data": {"password": "aHVudGVyMg=="}, "stringData": {"x": "y"}});
        let c = cleaned(secret);
        let text = c.to_string();
        assert!(!text.contains("aHVudGVyMg=="), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(c["metadata"]["annotations"], json!({"team": "ml"}));
        assert!(c["metadata"].get("uid").is_none());
        assert!(c.get("stringData").is_none());
        use base64::Engine as _;
        let shown = base64::engine::general_purpose::STANDARD
            .decode(c["data"]["password"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            String::from_utf8(shown).unwrap(),
            "<captured: password, 7 bytes, value not kept>"
        );
    }

    #[test]
    fn the_bar_fills_with_what_is_listed_of_the_kind() {
        let k = KindRef::new("runbook.dev/v1alpha1", "Evaluator");
        assert_eq!(
            bar(&k, 500, 2000, 700),
            "listing runbook.dev/v1alpha1 Evaluator [#####...............] 500/2000, 700 objects in all"
        );
        assert!(bar(&k, 0, 0, 0).contains("[....................] 0/1"));
        assert!(bar(&k, 9, 3, 9).contains("[####################] 9/9"));
    }

    #[test]
    fn owners_come_first_and_an_owner_not_captured_is_dropped() {
        let o = |kind: &str, name: &str, owner: Option<(&str, &str)>| {
            let mut v = json!({"apiVersion": "v1", "kind": kind,
                "metadata": {"name": name, "namespace": "ns"}});
            if let Some((k, n)) = owner {
                v["metadata"]["ownerReferences"] =
                    json!([{"apiVersion": "v1", "kind": k, "name": n}]);
            }
            v
        };
        let sorted = in_creation_order(vec![
            o("Pod", "p", Some(("Job", "j"))),
            o("Job", "j", Some(("Evaluator", "e"))),
            o("Evaluator", "e", None),
            o("Pod", "orphan", Some(("ReplicaSet", "gone"))),
        ]);
        let names: Vec<&str> = sorted
            .iter()
            .map(|v| v["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["e", "orphan", "j", "p"]);
        assert_eq!(sorted[1]["metadata"]["ownerReferences"], json!([]));
    }
}
