//! `crds/` is exactly what `runbook crds` prints: the committed manifests
//! never drift from the Rust types.

use std::collections::BTreeSet;

#[test]
fn committed_crds_match_the_generated_ones() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let mut expected = BTreeSet::new();
    for crd in runbook::crd::all() {
        let name = runbook::crd::file_name(&crd);
        let path = dir.join(&name);
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e}; run `runbook crds --out-dir crds`", path.display())
        });
        assert_eq!(
            committed,
            runbook::crd::to_yaml(&crd),
            "{} differs from `runbook crds`; run `runbook crds --out-dir crds`",
            path.display()
        );
        expected.insert(name);
    }
    // The kustomization that deploy/ includes lists exactly these files.
    let kustomization = runbook::util::yaml::parse_documents(
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
        .filter(|n| n != "kustomization.yaml")
        .collect();
    assert_eq!(
        present, expected,
        "crds/ holds files `runbook crds` does not generate"
    );
}

#[test]
fn the_printed_stream_holds_every_crd() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runbook"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let docs = runbook::util::yaml::parse_documents(&text).unwrap();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "evaluators.runbook.dev",
            "databasebackups.runbook.dev",
            "aimodels.runbook.dev"
        ]
    );
    for d in &docs {
        let version = &d["spec"]["versions"][0];
        assert_eq!(
            version["subresources"]["status"],
            serde_json::json!({}),
            "status subresource"
        );
        assert!(
            d["spec"]["names"]["shortNames"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
        );
    }
}
