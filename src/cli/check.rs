//! `runbook check PATH...`: load and compile everything, print one line per
//! policy, or every error as `file:line:col: message` and exit 1.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use runbook_core::kinds::KindRef;
use runbook_core::policy::compile::{KindPlaces, LoadError};
use runbook_core::policy::{self, Body, Bundle};
use runbook_core::script::{ScriptEngine, ScriptLimits};

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Directories (searched recursively) or single policy files.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Accept policies that declare dangerous kinds, as `runbook run
    /// --allow-dangerous-kinds` does (without it they are errors here,
    /// as they are for `runbook rbac`, the webhook and `runbook run`).
    #[arg(long, env = "RUNBOOK_ALLOW_DANGEROUS_KINDS")]
    pub allow_dangerous_kinds: bool,
    /// Accept policies that make children in other namespaces, as `runbook
    /// run --allow-other-namespaces` does.
    #[arg(long, env = "RUNBOOK_ALLOW_OTHER_NAMESPACES")]
    pub allow_other_namespaces: bool,
    /// text, or json (one document on stdout, for CI and editors).
    #[arg(long, short = 'o', default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

/// A positioned error as JSON: file, line, column, message, and the line
/// the text output prints.
pub fn error_json(
    file: &str,
    pos: Option<runbook_core::util::yaml::Pos>,
    message: &str,
    text: String,
) -> serde_json::Value {
    serde_json::json!({
        "file": file,
        "line": pos.map(|p| p.line),
        "column": pos.map(|p| p.col),
        "message": message,
        "text": text,
    })
}

/// The bundle of the directory a single file is in, and the file's name
/// within it; `what` names the file in the error when it is missing.
pub fn bundle_of_file(path: &std::path::Path, what: &str) -> anyhow::Result<(Bundle, String)> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let file = path
        .file_name()
        .with_context(|| format!("{} is not a file", path.display()))?
        .to_string_lossy()
        .to_string();
    let bundle = Bundle::from_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !bundle.files.contains_key(&file) {
        anyhow::bail!("{}: no such {what}", path.display());
    }
    Ok((bundle, file))
}

/// Load every bundle below the paths (or single files); the compiled set,
/// its errors, the number of scripts, and the bundles read.
pub fn load_paths(
    paths: &[PathBuf],
) -> anyhow::Result<(
    policy::PolicySet,
    Vec<policy::LoadError>,
    usize,
    Vec<Bundle>,
)> {
    let engine = ScriptEngine::new(ScriptLimits::default());
    let mut loaded = Vec::new();
    let mut bundles = Vec::new();
    for path in paths {
        if !path.exists() {
            anyhow::bail!("{}: no such file or directory", path.display());
        }
        if path.is_dir() {
            for bundle in
                Bundle::discover(path).with_context(|| format!("reading {}", path.display()))?
            {
                loaded.push(policy::load_bundle(&engine, &bundle, None));
                bundles.push(bundle);
            }
        } else {
            let (bundle, file) = bundle_of_file(path, "policy or script file")?;
            loaded.push(policy::load_bundle(&engine, &bundle, Some(&file)));
            bundles.push(bundle);
        }
    }
    let scripts: usize = loaded.iter().map(|l| l.scripts.len()).sum();
    let declared: Vec<(String, KindPlaces)> = loaded
        .iter_mut()
        .flat_map(|l| std::mem::take(&mut l.declared))
        .collect();
    let (set, mut errors) = policy::PolicySet::build(loaded);
    let docs = crd_docs(&bundles);
    errors.extend(unserved_kinds(&declared, &crd_kinds(&docs)));
    errors.extend(pruned_status(&set, &docs));
    errors.sort();
    errors.dedup();
    Ok((set, errors, scripts, bundles))
}

/// CRD documents in the bundles' YAML files.
pub fn crd_docs(bundles: &[runbook_core::policy::Bundle]) -> Vec<serde_json::Value> {
    bundles
        .iter()
        .flat_map(|b| b.files.iter())
        .filter(|(name, _)| name.ends_with(".yaml") || name.ends_with(".yml"))
        .filter_map(|(_, text)| runbook_core::util::yaml::parse_documents(text).ok())
        .flatten()
        .chain(
            runbook_core::crd::all()
                .into_iter()
                .filter_map(|c| serde_json::to_value(c).ok()),
        )
        .collect()
}

/// The kinds the CRD documents define, at each version they serve.
fn crd_kinds(docs: &[serde_json::Value]) -> Vec<KindRef> {
    let mut out = Vec::new();
    for d in docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
    {
        let spec = &d["spec"];
        let (Some(group), Some(kind)) = (spec["group"].as_str(), spec["names"]["kind"].as_str())
        else {
            continue;
        };
        for v in spec["versions"].as_array().into_iter().flatten() {
            if let Some(v) = v["name"].as_str() {
                out.push(KindRef::new(format!("{group}/{v}"), kind));
            }
        }
    }
    out
}

/// Declared kinds no API serves: neither built into Kubernetes nor
/// defined by a CRD among the paths, where that is surely a mistake (a
/// built-in group, or a near miss of a kind that is served), each at its
/// position with what was meant. A kind of a group nothing here knows
/// stays a note (`rbac::guesses`): its CRD may be in the cluster only.
fn unserved_kinds(declared: &[(String, KindPlaces)], crds: &[KindRef]) -> Vec<LoadError> {
    let mut known = runbook_core::kinds::well_known_kinds();
    known.extend(crds.iter().cloned());
    let names: Vec<String> = known.iter().map(|k| k.to_string()).collect();
    let mut out = Vec::new();
    for (file, places) in declared {
        for (place, k, pos) in places {
            if known.contains(k) {
                continue;
            }
            let wanted = k.to_string();
            // A near miss, or the kind right and its apiVersion wrong.
            let meant =
                runbook_core::util::suggest::closest(&wanted, names.iter().map(String::as_str))
                    .map(str::to_string)
                    .or_else(|| {
                        let same_kind = known.iter().find(|c| c.kind == k.kind);
                        same_kind.map(|c| c.to_string())
                    });
            let built_in_group = !runbook_core::kinds::well_known_versions(k.group()).is_empty();
            if meant.is_none() && !built_in_group {
                continue;
            }
            let hint = meant
                .map(|m| format!(" (did you mean {m}?)"))
                .unwrap_or_default();
            out.push(LoadError {
                file: file.clone(),
                pos: *pos,
                message: format!(
                    "{place}: no API serves {wanted}: it is neither built into Kubernetes nor defined by a CRD among the paths{hint}"
                ),
            });
        }
    }
    out
}

/// Status a policy declares that its target's CRD (among the paths)
/// would prune: a field its status schema does not list, or conditions
/// where it has none, each at the position it is declared. (A status
/// schema that keeps any field, or a target whose CRD is not among the
/// paths, is not checked.)
fn pruned_status(
    set: &runbook_core::policy::PolicySet,
    docs: &[serde_json::Value],
) -> Vec<LoadError> {
    let mut out = Vec::new();
    for p in set.policies.values() {
        let Some(status) = status_schema(docs, &p.target) else {
            continue;
        };
        let notes = runbook_core::plan::state::unlisted_notes(&p.target.kind, &status, &p.status);
        for (pos, message) in notes {
            out.push(LoadError {
                file: p.file.clone(),
                pos,
                message,
            });
        }
    }
    out
}

/// The status schema a CRD among `docs` gives `kind` at its version:
/// `Some(Null)` when it declares no status at all.
fn status_schema(docs: &[serde_json::Value], kind: &KindRef) -> Option<serde_json::Value> {
    let crd = docs.iter().find(|d| {
        d["kind"] == "CustomResourceDefinition"
            && d["spec"]["group"] == kind.group()
            && d["spec"]["names"]["kind"] == kind.kind.as_str()
    })?;
    let version = crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == kind.version())?;
    let root = version.pointer("/schema/openAPIV3Schema")?;
    if root["x-kubernetes-preserve-unknown-fields"] == true {
        return None;
    }
    Some(root["properties"]["status"].clone())
}

/// What a policy does, in a few words: its script, or its steps.
fn body_of(p: &runbook_core::policy::compile::CompiledPolicy) -> String {
    match &p.body {
        Body::Script {
            script,
            has_finalize,
            ..
        } => format!(
            "script {}{}{}",
            script.file.rsplit('/').next().unwrap_or(&script.file),
            if *has_finalize {
                " (with finalize)"
            } else {
                ""
            },
            if script.has_fn("deleted") {
                " (with deleted)"
            } else {
                ""
            }
        ),
        Body::Steps {
            steps,
            on_failure,
            retention,
        } => format!(
            "{} steps, {} on failure{}",
            steps.len(),
            on_failure.len(),
            if retention.is_some() {
                ", retention"
            } else {
                ""
            }
        ),
    }
}

/// What `runbook run` would refuse the loaded policies for, without its
/// overrides: dangerous kinds, children in other namespaces, each at the
/// policy's file.
fn refusals(set: &policy::PolicySet, args: &CheckArgs) -> Vec<LoadError> {
    let mut out = Vec::new();
    for p in set.policies.values() {
        let one = std::iter::once(&**p);
        if !args.allow_dangerous_kinds {
            for why in runbook_operator::rbac::dangers_of(one) {
                out.push(LoadError {
                    file: p.file.clone(),
                    pos: None,
                    message: format!(
                        "refused: {why} (runbook run, rbac and the webhook refuse it too; give --allow-dangerous-kinds to all of them, or read by name: spec.readsByName)"
                    ),
                });
            }
        }
        if !args.allow_other_namespaces && p.namespaces.is_some() {
            out.push(LoadError {
                file: p.file.clone(),
                pos: p.namespaces.as_ref().and_then(|(_, pos)| *pos),
                message: format!(
                    "refused: policy {}: spec.namespaces: it makes children in other namespaces than its targets' (give --allow-other-namespaces here and to runbook run and rbac)",
                    p.name
                ),
            });
        }
    }
    out
}

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let (set, mut errors, scripts, bundles) = load_paths(&args.paths)?;
    errors.extend(refusals(&set, &args));
    let docs = crd_docs(&bundles);
    if args.output == "json" {
        let crds = runbook_operator::rbac::crd_plurals(&docs);
        let doc = serde_json::json!({
            "ok": errors.is_empty(),
            "policies": set.policies.values().map(|p| serde_json::json!({
                "name": p.name, "file": p.file, "target": p.target.to_string(),
                "mode": p.mode.as_str(), "version": p.version,
            })).collect::<Vec<_>>(),
            "alertRoutes": set.routes.values().map(|r| serde_json::json!({
                "name": r.name, "receivers": r.receivers.len(), "version": r.version,
            })).collect::<Vec<_>>(),
            "scripts": scripts,
            "notes": runbook_operator::rbac::guesses(&set, &crds),
            "errors": errors.iter().map(|e| error_json(&e.file, e.pos, &e.message, e.to_string())).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(if errors.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    for p in set.policies.values() {
        println!(
            "ok  policy {} ({}) targets {} [{}] mode {} version {}",
            p.name,
            p.file,
            p.target,
            body_of(p),
            p.mode.as_str(),
            p.version
        );
    }
    for r in set.routes.values() {
        println!(
            "ok  alert routes {} ({} receivers) version {}",
            r.name,
            r.receivers.len(),
            r.version
        );
    }
    let crds = runbook_operator::rbac::crd_plurals(&docs);
    // A kind already an error needs no note.
    let unserved = |g: &String| {
        errors.iter().any(|e| {
            e.message.contains(&format!(
                "no API serves {}:",
                g.split(" (policy").next().unwrap_or("")
            ))
        })
    };
    for guess in runbook_operator::rbac::guesses(&set, &crds)
        .iter()
        .filter(|g| !unserved(g))
    {
        println!("note {guess}");
    }
    if errors.is_empty() {
        println!(
            "{} policies, {} alert routes, {} scripts: no errors",
            set.policies.len(),
            set.routes.len(),
            scripts
        );
        Ok(ExitCode::SUCCESS)
    } else {
        for e in &errors {
            eprintln!("{e}");
        }
        eprintln!(
            "{} error{}",
            errors.len(),
            if errors.len() == 1 { "" } else { "s" }
        );
        Ok(ExitCode::FAILURE)
    }
}
