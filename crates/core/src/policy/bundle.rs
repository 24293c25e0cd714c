//! Bundles: the unit policies are loaded in. A bundle is a map of file name
//! to text, filled from a directory or from a ConfigMap's `data`; scripts and
//! templates are looked up by name within the same bundle.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where a bundle came from; decides how errors name its files.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    Dir(PathBuf),
    ConfigMap {
        namespace: String,
        name: String,
    },
    /// Text given directly (tests, scenarios).
    Inline(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Dir(p) => write!(f, "{}", p.display()),
            Origin::ConfigMap { namespace, name } => write!(f, "configmap/{namespace}/{name}"),
            Origin::Inline(name) => f.write_str(name),
        }
    }
}

/// Files of one bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub origin: Origin,
    pub files: BTreeMap<String, String>,
}

/// File names a bundle takes: YAML documents and Rhai scripts.
pub fn is_bundle_file(name: &str) -> bool {
    !name.starts_with('.')
        && (name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".rhai"))
}

impl Bundle {
    pub fn new(origin: Origin, files: BTreeMap<String, String>) -> Self {
        Self { origin, files }
    }

    /// How errors name a file of this bundle.
    pub fn display_path(&self, file: &str) -> String {
        match &self.origin {
            Origin::Dir(p) => p.join(file).display().to_string(),
            Origin::ConfigMap { .. } | Origin::Inline(_) => format!("{}/{file}", self.origin),
        }
    }

    /// Read a directory's `*.yaml`, `*.yml` and `*.rhai` files (not its
    /// subdirectories). Hidden names, such as the `..data` link of a mounted
    /// ConfigMap, are skipped; the files they link to are read through the
    /// visible names.
    pub fn from_dir(dir: &Path) -> std::io::Result<Self> {
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            if !is_bundle_file(&name) {
                continue;
            }
            let path = entry.path();
            // Follows symlinks: a mounted ConfigMap's keys are links.
            if !path.is_file() {
                continue;
            }
            files.insert(name, std::fs::read_to_string(&path)?);
        }
        Ok(Self::new(Origin::Dir(dir.to_path_buf()), files))
    }

    /// A bundle from a ConfigMap's data.
    pub fn from_configmap(namespace: &str, name: &str, data: &BTreeMap<String, String>) -> Self {
        let files = data
            .iter()
            .filter(|(k, _)| is_bundle_file(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Self::new(
            Origin::ConfigMap {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            files,
        )
    }

    /// Every directory at or below `root` that holds bundle files, each as a
    /// bundle of its own, in path order.
    pub fn discover(root: &Path) -> std::io::Result<Vec<Self>> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        let mut dirs = Vec::new();
        while let Some(dir) = stack.pop() {
            dirs.push(dir.clone());
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().to_string();
                if entry.path().is_dir() && !name.starts_with('.') {
                    stack.push(entry.path());
                }
            }
        }
        dirs.sort();
        for dir in dirs {
            let b = Self::from_dir(&dir)?;
            if !b.files.is_empty() {
                out.push(b);
            }
        }
        Ok(out)
    }
}
