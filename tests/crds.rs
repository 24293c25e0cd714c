//! `crds/` is exactly what `runbook crds` prints: the committed manifests
//! never drift from the Rust types.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::collections::BTreeSet;

#[test]
fn committed_crds_match_the_generated_ones() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let mut expected = BTreeSet::new();
    for crd in runbook_core::crd::all() {
        let name = runbook_core::crd::file_name(&crd);
        let path = dir.join(&name);
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e}; run `runbook crds --out-dir crds`", path.display())
        });
        assert_eq!(
            committed,
            runbook_core::crd::to_yaml(&crd),
            "{} differs from `runbook crds`; run `runbook crds --out-dir crds`",
            path.display()
        );
        expected.insert(name);
    }
    // The kustomization that deploy/ includes lists exactly these files.
    let kustomization = runbook_core::util::yaml::parse_documents(
        &std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let listed: BTreeSet<String> = kustomization[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed, expected,
        "crds/kustomization.yaml does not list every CRD"
    );
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n != "kustomization.yaml" && n != runbook_core::crd::FIELD_SELECTORS_DIR)
        .collect();
    assert_eq!(
        present, expected,
        "crds/ holds files `runbook crds` does not generate"
    );
}

#[test]
fn the_field_selectors_crds_are_the_generated_ones_and_name_real_fields() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crds")
        .join(runbook_core::crd::FIELD_SELECTORS_DIR);
    let mut files = vec![(
        "kustomization.yaml".to_string(),
        runbook_core::crd::kustomization(true),
    )];
    for crd in runbook_core::crd::all_with_field_selectors() {
        files.push((
            runbook_core::crd::file_name(&crd),
            runbook_core::crd::to_yaml(&crd),
        ));
        // Every selectable field is a string, boolean or integer of the
        // schema, as the API server requires.
        let v = serde_json::to_value(&crd).unwrap();
        for version in v["spec"]["versions"].as_array().unwrap() {
            let fields = version["selectableFields"].as_array().unwrap();
            assert!(!fields.is_empty(), "{}", v["metadata"]["name"]);
            for field in fields {
                let path = field["jsonPath"].as_str().unwrap();
                let mut at = &version["schema"]["openAPIV3Schema"];
                for part in path.trim_start_matches('.').split('.') {
                    at = &at["properties"][part];
                }
                assert!(
                    matches!(at["type"].as_str(), Some("string" | "boolean" | "integer")),
                    "{path} is {at}"
                );
            }
        }
    }
    for (name, text) in files {
        let path = dir.join(&name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            committed,
            text,
            "{} differs from `runbook crds`; run `runbook crds --out-dir crds`",
            path.display()
        );
    }
}

#[test]
fn the_printed_stream_holds_every_crd() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runbook"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let docs = runbook_core::util::yaml::parse_documents(&text).unwrap();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "evaluators.runbook.dev",
            "databasebackups.runbook.dev",
            "aimodels.runbook.dev",
            "runbookstates.runbook.dev"
        ]
    );
    for d in &docs {
        let version = &d["spec"]["versions"][0];
        // The targets' status is their own subresource; a RunbookState is
        // written whole, status and all, in one request.
        let want = match d["spec"]["names"]["kind"].as_str() {
            Some("RunbookState") => serde_json::Value::Null,
            _ => serde_json::json!({}),
        };
        assert_eq!(
            version["subresources"]["status"], want,
            "status subresource"
        );
        assert!(
            d["spec"]["names"]["shortNames"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
        );
    }
}

/// Every short name and plural a standard cluster (Kubernetes 1.28, with
/// the CSI snapshot CRDs) serves, as `kubectl api-resources` lists them.
const BUILT_IN_NAMES: &[&str] = &[
    "cs",
    "cm",
    "ep",
    "ev",
    "limits",
    "ns",
    "no",
    "pvc",
    "pv",
    "po",
    "podtemplates",
    "rc",
    "quota",
    "secret",
    "sa",
    "svc",
    "mutatingwebhookconfigurations",
    "crd",
    "crds",
    "apiservices",
    "controllerrevisions",
    "ds",
    "deploy",
    "rs",
    "sts",
    "tokenreviews",
    "hpa",
    "cj",
    "job",
    "csr",
    "leases",
    "endpointslices",
    "events",
    "flowschemas",
    "prioritylevelconfigurations",
    "ing",
    "ingressclasses",
    "netpol",
    "runtimeclasses",
    "pdb",
    "clusterrolebindings",
    "clusterroles",
    "rolebindings",
    "roles",
    "pc",
    "csidrivers",
    "csinodes",
    "csistoragecapacities",
    "sc",
    "volumeattachments",
    "vs",
    "vsc",
    "vsclass",
    "vsclasses",
];

/// Runbook's short names, plurals and singulars mean Runbook's kinds
/// only: `kubectl get ev` still lists Events.
#[test]
fn short_names_collide_with_nothing_a_standard_cluster_serves() {
    for crd in runbook_core::crd::all() {
        let names = &crd.spec.names;
        let mine = names
            .short_names
            .iter()
            .flatten()
            .map(String::as_str)
            .chain([names.plural.as_str()])
            .chain(names.singular.as_deref());
        for n in mine {
            assert!(
                !BUILT_IN_NAMES.contains(&n),
                "{}: {n:?} is also a built-in resource's name",
                crd.metadata.name.as_deref().unwrap_or("")
            );
        }
    }
}
