//! The documentation holds together: every link in README.md and `docs/`
//! leads to a file that exists and, with a `#fragment`, to a heading in
//! it; and the README stays short enough to read in a first hour (the
//! guide lives in `docs/`).

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files the documentation is made of.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of a page outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The targets of a page's `[text](target)` links.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: lower case, spaces to dashes,
/// punctuation other than dashes and underscores dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_link_in_the_documentation_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            checked += 1;
            let (file, fragment) = match link.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a folder").join(file)
            };
            let name = page
                .strip_prefix(root())
                .unwrap_or(&page)
                .display()
                .to_string();
            if !target.exists() {
                broken.push(format!("{name}: ({link}): no such file"));
                continue;
            }
            if let Some(a) = fragment
                && !anchors(&read(&target)).contains(a)
            {
                broken.push(format!("{name}: ({link}): no heading with that anchor"));
            }
        }
    }
    assert!(
        checked >= 15,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_fits_a_first_hour_and_points_into_the_guide() {
    let readme = read(&root().join("README.md"));
    assert!(
        readme.len() <= 15 * 1024,
        "README.md is {} bytes: the guide belongs in docs/",
        readme.len()
    );
    // The two commands a new user starts with.
    assert!(
        readme.contains("cargo run -- simulate examples/evaluator-drift"),
        "the main command"
    );
    assert!(readme.contains("cargo test"), "the test command");
    // Every page of the guide is reachable from it.
    let linked: BTreeSet<String> = links(&readme).into_iter().collect();
    for page in pages().into_iter().skip(1) {
        let rel = page.strip_prefix(root()).expect("in the repository");
        let rel = rel.to_string_lossy().to_string();
        assert!(linked.contains(&rel), "README.md does not link {rel}");
    }
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(
        anchor("Least privilege: `runbook rbac`"),
        "least-privilege-runbook-rbac"
    );
    assert_eq!(
        anchor("Where Runbook keeps its own state"),
        "where-runbook-keeps-its-own-state"
    );
}

#[test]
fn the_architecture_names_every_runtime_module() {
    let architecture = read(&root().join("docs/architecture.md"));
    let dir = root().join("crates/operator/src/runtime");
    let mut missing = Vec::new();
    // The runtime's modules and, one level down, those of its folders
    // (`shard/`).
    let mut dirs = vec![dir];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = match path.extension().and_then(|e| e.to_str()) {
                Some("rs") => path.file_stem().unwrap().to_string_lossy().to_string(),
                _ if path.is_dir() => {
                    dirs.push(path.clone());
                    path.file_name().unwrap().to_string_lossy().to_string()
                }
                _ => continue,
            };
            if name != "mod"
                && !architecture.contains(&format!("`{name}`"))
                && !architecture.contains(&format!("`runtime::{name}`"))
                && !architecture.contains(&format!("`runtime::shard::{name}`"))
            {
                missing.push(name);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name these runtime modules: {missing:?}"
    );
}
