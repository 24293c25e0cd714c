//! kubectl against `runbook sandbox` (or the real cluster RUNBOOK_TEST_KUBECONFIG
//! names): server-side apply of the CRDs, apply of an example, get -o yaml,
//! get -w seeing an update, delete. Skipped when kubectl is not on PATH.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Option<Child>,
    kubeconfig: PathBuf,
    cache: PathBuf,
    namespace: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        match &mut self.child {
            Some(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            // On a real cluster the test's namespace goes, pass or fail.
            None => {
                let _ = kubectl_output(
                    self,
                    &["delete", "namespace", &self.namespace, "--wait=false"],
                );
            }
        }
    }
}

/// A number of its own for each server a test starts: `cargo test` runs
/// this file's tests as threads of one process, each with its server,
/// its directory and (on a real cluster) its namespace.
fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("runbook-kubectl-{name}-{}", unique()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn start() -> Server {
    let dir = tmp("server");
    let cache = dir.join("cache");
    if let Some(k) = std::env::var("RUNBOOK_TEST_KUBECONFIG")
        .ok()
        .filter(|k| !k.is_empty())
    {
        let ns = format!("rbt-kubectl-{}", unique());
        let s = Server {
            child: None,
            kubeconfig: k.into(),
            cache,
            namespace: ns.clone(),
        };
        kubectl(&s, &["create", "namespace", &ns]);
        return s;
    }
    let kubeconfig = dir.join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(["sandbox", "--port", "0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting runbook sandbox");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines.next().expect("runbook sandbox exited").unwrap();
        if line.starts_with("kubeconfig written") {
            break;
        }
    }
    Server {
        child: Some(child),
        kubeconfig,
        cache,
        namespace: "default".into(),
    }
}

fn kubectl_output(s: &Server, args: &[&str]) -> Output {
    Command::new("kubectl")
        .env("KUBECONFIG", &s.kubeconfig)
        .arg("--cache-dir")
        .arg(&s.cache)
        .args(args)
        .output()
        .expect("running kubectl")
}

fn kubectl(s: &Server, args: &[&str]) -> String {
    let out = kubectl_output(s, args);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn have_kubectl() -> bool {
    Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Apply Runbook's CRDs as an install does and wait for the kinds.
fn install_crds(s: &Server, root: &Path, ns: &str) {
    // On a shared control plane another test may have applied the CRDs
    // (its own field manager, an older version): take them over, as an
    // upgrade over someone else's install would.
    let crds = root.join("crds");
    let args = [
        "apply",
        "--server-side",
        "--force-conflicts",
        "-k",
        crds.to_str().unwrap(),
    ];
    // Two tests applying a CRD that does not exist yet both create it, and
    // one is told it already exists: applied again, it is an update.
    let mut tries = 0;
    let out = loop {
        let out = kubectl_output(s, &args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        tries += 1;
        match out.status.success() {
            true => break String::from_utf8_lossy(&out.stdout).into_owned(),
            false if err.contains("AlreadyExists") && tries < 3 => continue,
            false => panic!("kubectl {args:?} failed:\n{err}"),
        }
    };
    assert_eq!(
        out.matches("serverside-applied").count(),
        runbook_core::crd::all().len(),
        "{out}"
    );
    // The kinds are served once the CRDs are established.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubectl_output(s, &["get", "evaluators", "-n", ns])
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "evaluators never became available"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn kubectl_apply_refuses_what_runbook_could_not_act_on() {
    if !have_kubectl() {
        eprintln!("skipped: kubectl is not on PATH");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let s = start();
    let ns = s.namespace.clone();
    install_crds(&s, root, &ns);
    let apply = |name: &str, yaml: &str| -> (bool, String) {
        let file = s.cache.join(format!("{name}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        let out = kubectl_output(&s, &["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let evaluator = |schedule: &str, target: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: Evaluator\nmetadata: {{name: chat}}\nspec:\n  targetRef: {{name: {target}}}\n  benchmark: {{image: bench:1}}\n  threshold: 0.8\n  schedule: \"{schedule}\"\n"
        )
    };
    for (schedule, told) in [
        (
            "61 * * * *",
            "spec.schedule: Invalid value: \"string\": the minute field of a schedule takes 0-59",
        ),
        (
            "0 2 * 13 *",
            "the month field of a schedule takes 1-12 or jan-dec",
        ),
        ("0 9-17/0 * * *", "the hour field of a schedule takes 0-23"),
        (
            "0 2 * * 5-1",
            "a range in a schedule must run upwards (write 1-5, not 5-1)",
        ),
        (
            "0 2 * * funday",
            "the day-of-week field of a schedule takes 0-7 or sun-sat",
        ),
    ] {
        let (ok, err) = apply("bad-schedule", &evaluator(schedule, "chat"));
        assert!(!ok && err.contains(told), "{schedule:?}: {err}");
    }
    let (ok, err) = apply("good", &evaluator("*/15 9-17 * * mon-fri", "chat"));
    assert!(ok, "{err}");
    // The target is fixed: its scores and last good revision are its own.
    let (ok, err) = apply("retarget", &evaluator("*/15 9-17 * * mon-fri", "other"));
    assert!(
        !ok && err.contains("targetRef is fixed once set: create another Evaluator"),
        "{err}"
    );
    let backup = |database: &str, extra: &str| {
        format!(
            "apiVersion: runbook.dev/v1alpha1\nkind: DatabaseBackup\nmetadata: {{name: nightly}}\nspec:\n  database: {database}\n  dump: {{image: dump:1}}\n  pvc: data\n  destination: s3://backups/db\n{extra}"
        )
    };
    let (ok, err) = apply(
        "both",
        &backup("{statefulSet: db, podSelector: {app: db}}", ""),
    );
    assert!(
        !ok && err.contains("spec.database: Invalid value: \"object\": name the database by statefulSet or by podSelector: exactly one of them"),
        "{err}"
    );
    let (ok, err) = apply("neither", &backup("{}", ""));
    assert!(!ok && err.contains("exactly one of them"), "{err}");
    let (ok, err) = apply("everything", &backup("{podSelector: {}}", ""));
    assert!(
        !ok && err.contains("spec.database.podSelector"),
        "an empty selector would match every pod: {err}"
    );
    let (ok, err) = apply(
        "retention",
        &backup("{statefulSet: db}", "  retention: 3\n"),
    );
    assert!(
        !ok && err.contains("spec.retention: Forbidden: retention counts the runs of a schedule"),
        "{err}"
    );
    let (ok, err) = apply(
        "scheduled",
        &backup(
            "{statefulSet: db}",
            "  retention: 3\n  schedule: \"@daily\"\n",
        ),
    );
    assert!(ok, "{err}");
}

/// The server's minor version, as kubectl reports it.
fn server_minor(s: &Server) -> u32 {
    let v: serde_json::Value =
        serde_json::from_str(&kubectl(s, &["version", "-o", "json"])).unwrap_or_default();
    v["serverVersion"]["minor"]
        .as_str()
        .unwrap_or_default()
        .trim_end_matches('+')
        .parse()
        .unwrap_or_else(|_| panic!("a server minor version in {v}"))
}

#[test]
fn field_selectors_find_runbooks_objects_from_v1_31() {
    if !have_kubectl() {
        eprintln!("skipped: kubectl is not on PATH");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let s = start();
    let ns = s.namespace.clone();
    install_crds(&s, root, &ns);
    // A field manager of its own, so that another install of the plain
    // CRDs on a shared control plane leaves the selectable fields alone.
    let overlay = root.join("crds").join("field-selectors");
    // A CRD's `versions` is an atomic list: another test on a shared
    // control plane applying the plain CRDs with force takes the whole
    // list back, selectable fields and all, so the overlay is applied
    // again while the selectors are waited for.
    let apply_overlay = || {
        kubectl_output(
            &s,
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=runbook-field-selectors",
                "-k",
                overlay.to_str().unwrap(),
            ],
        )
    };
    let applied = apply_overlay();
    for (name, target) in [("a", "web"), ("b", "api")] {
        let file = s.cache.join(format!("eval-{name}.yaml"));
        std::fs::write(
            &file,
            format!("apiVersion: runbook.dev/v1alpha1\nkind: Evaluator\nmetadata: {{name: {name}}}\nspec:\n  targetRef: {{name: {target}}}\n  benchmark: {{image: bench:1}}\n  threshold: 0.8\n"),
        )
        .unwrap();
        kubectl(&s, &["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    }
    let select = |selector: &str| {
        kubectl_output(
            &s,
            &[
                "get",
                "evaluators",
                "-n",
                &ns,
                "--field-selector",
                selector,
                "-o",
                "name",
            ],
        )
    };
    if server_minor(&s) < 31 {
        // Releases before v1.31 refuse the overlay, and serve the plain
        // CRDs with metadata field selectors only, as docs/installing.md says.
        let err = String::from_utf8_lossy(&applied.stderr);
        assert!(
            !applied.status.success() && err.contains("selectableFields"),
            "{err}"
        );
        let refused = select("spec.targetRef.name=web");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success()
                && err.contains("field label not supported: spec.targetRef.name"),
            "{err}"
        );
        return;
    }
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = select("spec.targetRef.name=web");
        if out.status.success() {
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "evaluator.runbook.dev/a\n"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "field selectors never served: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
        apply_overlay();
    }
    let not_web = select("spec.targetRef.name!=web");
    assert_eq!(
        String::from_utf8_lossy(&not_web.stdout),
        "evaluator.runbook.dev/b\n"
    );
    // No status yet: the phase reads as "".
    let unphased = select("status.phase=");
    assert_eq!(
        String::from_utf8_lossy(&unphased.stdout),
        "evaluator.runbook.dev/a\nevaluator.runbook.dev/b\n"
    );
    let refused = select("spec.threshold=0.8");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("field label not supported: spec.threshold")
    );
}

#[test]
fn kubectl_drives_the_sandbox() {
    if !have_kubectl() {
        eprintln!("skipped: kubectl is not on PATH");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let s = start();
    let ns = s.namespace.clone();
    install_crds(&s, root, &ns);
    let example = root.join("examples/evaluator-drift/evaluator.yaml");
    let out = kubectl(&s, &["apply", "-n", &ns, "-f", example.to_str().unwrap()]);
    assert!(
        out.contains("evaluator.runbook.dev/chatbot created"),
        "{out}"
    );
    let yaml = kubectl(
        &s,
        &["get", "evaluator", "chatbot", "-n", &ns, "-o", "yaml"],
    );
    assert!(yaml.contains("threshold: 0.85"), "{yaml}");
    assert!(yaml.contains("historyLimit: 24"), "{yaml}");
    // The short names are Runbook's kinds and nothing else's: `ev` stays
    // the Events' (kubectl may say the two Event APIs share it), and no
    // short name is shared with a Runbook kind.
    for short in ["eval", "dbb", "aim", "ev"] {
        let out = kubectl_output(&s, &["get", short, "-n", &ns]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl get {short}: {err}");
        assert!(!err.contains("runbook.dev"), "kubectl get {short}: {err}");
        let shared = err.contains("short name") && short != "ev";
        assert!(!shared, "kubectl get {short}: {err}");
    }
    let by_short = kubectl(&s, &["get", "eval", "chatbot", "-n", &ns, "-o", "name"]);
    assert_eq!(by_short.trim(), "evaluator.runbook.dev/chatbot");
    let table = kubectl(&s, &["get", "evaluators", "-n", &ns]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "TARGET", "THRESHOLD", "LAST-SCORE", "PHASE", "AGE"]
    );

    // A watch sees an update.
    let mut watch = Command::new("kubectl")
        .env("KUBECONFIG", &s.kubeconfig)
        .arg("--cache-dir")
        .arg(&s.cache)
        .args([
            "get",
            "evaluators",
            "-n",
            &ns,
            "-w",
            "--request-timeout=30s",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("NAME"), "{first}");
    let row = lines.next().unwrap().unwrap();
    assert!(row.contains("0.85"), "{row}");
    kubectl(
        &s,
        &[
            "patch",
            "evaluator",
            "chatbot",
            "-n",
            &ns,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"threshold":0.9}}"#,
        ],
    );
    let updated = lines.next().unwrap().unwrap();
    assert!(
        updated.starts_with("chatbot") && updated.contains("0.9"),
        "{updated}"
    );
    let _ = watch.kill();
    let _ = watch.wait();

    // A bad CR is refused by the schema, with the field named.
    let bad = kubectl_output(
        &s,
        &[
            "patch",
            "evaluator",
            "chatbot",
            "-n",
            &ns,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"threshold":1.5}}"#,
        ],
    );
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("spec.threshold"), "{err}");

    // A Deployment rolls out, gets a new revision, and is rolled back, as
    // kubectl users do it (no replicas: no kubelet runs pods on either side).
    let manifest = s.cache.join("web.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 0\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: app, image: \"registry.k8s.io/pause:3.9\"}]}\n",
    )
    .unwrap();
    kubectl(&s, &["apply", "-n", &ns, "-f", manifest.to_str().unwrap()]);
    let rollout = |s: &Server| {
        let out = kubectl(
            s,
            &[
                "rollout",
                "status",
                "deployment/web",
                "-n",
                &ns,
                "--timeout=60s",
            ],
        );
        assert!(out.contains("successfully rolled out"), "{out}");
    };
    rollout(&s);
    kubectl(
        &s,
        &[
            "set",
            "image",
            "deployment/web",
            "-n",
            &ns,
            "app=registry.k8s.io/pause:3.10",
        ],
    );
    rollout(&s);
    let history = kubectl(&s, &["rollout", "history", "deployment/web", "-n", &ns]);
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, ["1", "2"], "{history}");
    let out = kubectl(&s, &["rollout", "undo", "deployment/web", "-n", &ns]);
    assert!(out.contains("rolled back"), "{out}");
    rollout(&s);
    let image = kubectl(
        &s,
        &[
            "get",
            "deployment",
            "web",
            "-n",
            &ns,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
    );
    assert_eq!(image.trim(), "registry.k8s.io/pause:3.9");

    // The generators a newcomer types first. kubectl sends their bodies
    // (and `auth can-i`'s) as protobuf.
    let account = format!("--serviceaccount={ns}:robot");
    let generators: [&[&str]; 9] = [
        &["configmap", "settings", "--from-literal=level=debug"],
        &[
            "secret",
            "generic",
            "creds",
            "--from-literal=password=s3cret",
        ],
        &[
            "deployment",
            "gen",
            "--image=registry.k8s.io/pause:3.9",
            "--replicas=0",
        ],
        &["job", "once", "--image=busybox:1.36", "--", "true"],
        &[
            "cronjob",
            "nightly",
            "--image=busybox:1.36",
            "--schedule=0 1 * * *",
            "--",
            "true",
        ],
        &["service", "clusterip", "web", "--tcp=80:8080"],
        &["serviceaccount", "robot"],
        &["role", "reader", "--verb=get,list", "--resource=pods"],
        &["rolebinding", "robot-reads", "--role=reader", &account],
    ];
    for generator in generators {
        let mut args = vec!["create", "-n", ns.as_str()];
        args.extend(generator);
        let out = kubectl(&s, &args);
        assert!(out.contains("created"), "{args:?}: {out}");
    }
    let get = |what: &[&str]| {
        let mut args = vec!["get"];
        args.extend(what);
        args.extend(["-n", ns.as_str()]);
        kubectl(&s, &args)
    };
    assert_eq!(
        get(&["configmap", "settings", "-o", "jsonpath={.data.level}"]),
        "debug"
    );
    assert_eq!(
        get(&["secret", "creds", "-o", "jsonpath={.data.password}"]),
        "czNjcmV0"
    );
    assert_eq!(
        get(&[
            "deployment",
            "gen",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}"
        ]),
        "registry.k8s.io/pause:3.9"
    );
    assert_eq!(
        get(&["cronjob", "nightly", "-o", "jsonpath={.spec.schedule}"]),
        "0 1 * * *"
    );
    assert_eq!(
        get(&[
            "service",
            "web",
            "-o",
            "jsonpath={.spec.ports[0].targetPort}"
        ]),
        "8080"
    );
    assert_eq!(
        get(&[
            "rolebinding",
            "robot-reads",
            "-o",
            "jsonpath={.subjects[0].name}"
        ]),
        "robot"
    );
    let created = format!("{ns}-created");
    let out = kubectl(&s, &["create", "namespace", &created]);
    assert!(out.contains("created"), "{out}");
    kubectl(&s, &["delete", "namespace", &created, "--wait=false"]);
    assert_eq!(
        kubectl(&s, &["auth", "can-i", "create", "pods", "-n", &ns]).trim(),
        "yes"
    );
    // kubectl scale goes through the scale subresource.
    let out = kubectl(&s, &["scale", "deployment/gen", "--replicas=2", "-n", &ns]);
    assert!(out.contains("scaled"), "{out}");
    assert_eq!(
        get(&["deployment", "gen", "-o", "jsonpath={.spec.replicas}"]),
        "2"
    );

    let out = kubectl(&s, &["delete", "evaluator", "chatbot", "-n", &ns]);
    assert!(out.contains("deleted"), "{out}");
    let gone = kubectl_output(&s, &["get", "evaluator", "chatbot", "-n", &ns]);
    assert!(!gone.status.success());
}
