//! kubectl against `runbook sandbox` (or the real cluster RUNBOOK_TEST_KUBECONFIG
//! names): server-side apply of the CRDs, apply of an example, get -o yaml,
//! get -w seeing an update, delete. Skipped when kubectl is not on PATH.

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

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("runbook-kubectl-{name}-{}", std::process::id()));
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
        let ns = format!("rbt-kubectl-{}", std::process::id());
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

#[test]
fn kubectl_drives_the_sandbox() {
    if !have_kubectl() {
        eprintln!("skipped: kubectl is not on PATH");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let s = start();
    let ns = s.namespace.clone();
    // On a shared control plane another test may have applied the CRDs
    // (its own field manager, an older version): take them over, as an
    // upgrade over someone else's install would.
    let out = kubectl(
        &s,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            root.join("crds").to_str().unwrap(),
        ],
    );
    assert_eq!(
        out.matches("serverside-applied").count(),
        runbook::crd::all().len(),
        "{out}"
    );
    // The kinds are served once the CRDs are established.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubectl_output(&s, &["get", "evaluators", "-n", &ns])
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "evaluators never became available"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
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
