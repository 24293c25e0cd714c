//! The commit this binary is built from, for `runbook_build_info`:
//! `git rev-parse` where the source is a clone,
//! `RUNBOOK_COMMIT` where a packager sets it, else `unknown`.

fn main() {
    println!("cargo:rerun-if-env-changed=RUNBOOK_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let commit = std::env::var("RUNBOOK_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
                .filter(|c| !c.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=RUNBOOK_COMMIT={commit}");
}
