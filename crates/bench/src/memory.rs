//! Memory: the operator's RSS and live heap with `n` targets and `n`
//! children cached, and the peak while every watch relists. The API server
//! runs in another process, so only the operator is counted; both are this
//! program, started again in a child role.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::operator::{item_kind, populate, runbook_operator};
use runbook_sandbox::Sandbox;

/// A field of this process's /proc status, in KB.
pub fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
}

/// The API server child: `n` Items; prints its kubeconfig, then on each
/// `relist` line on stdin makes a few writes, compacts its history and
/// cuts every watch, so that every client must list again, and answers
/// `relisting`.
pub async fn sandbox_child(n: usize) {
    let sandbox = Sandbox::default();
    populate(&sandbox, "memory", n);
    let served = sandbox.serve(0).await.expect("serving the sandbox");
    let path =
        std::env::temp_dir().join(format!("runbook-bench-{}.kubeconfig", std::process::id()));
    std::fs::write(&path, served.kubeconfig("default")).expect("writing the kubeconfig");
    println!("KUBECONFIG {}", path.display());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let client = sandbox.client();
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let _ = nss
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "churn"}})).expect("ns"),
        )
        .await;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, "churn");
    let mut round = 0;
    while let Some(line) = rx.recv().await {
        if line.trim() == "count" {
            println!("LISTS {}", sandbox.store().lists_served());
            continue;
        }
        if line.trim() != "relist" {
            continue;
        }
        round += 1;
        // Writes, so that every watch's last resourceVersion is older
        // than the compaction.
        for i in 0..10 {
            let cm = serde_json::from_value(json!({"metadata": {"name": format!("c{round}-{i}")}}))
                .expect("cm");
            let _ = cms.create(&Default::default(), &cm).await;
        }
        sandbox.store().compact();
        sandbox.store().cut_watches();
        println!("relisting");
    }
    let _ = std::fs::remove_file(&path);
}

/// A client of the cluster a kubeconfig file names.
pub async fn client_of(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    kube::Client::try_from(config).expect("a client")
}

/// The operator child: reconcile and cache `n` Items and their children,
/// report `STEADY rss heap`, then on `go` (sent once the API server forced
/// a relist) wait for the relist to settle and report `PEAK rss heap`.
pub async fn operator_child(kubeconfig: &Path, n: usize) {
    let client = client_of(kubeconfig).await;
    let op = runbook_operator(client, "memory", 16);
    op.start().await.expect("the operator starts");
    let deadline = Instant::now() + Duration::from_secs(900);
    let kind = item_kind();
    loop {
        let finished = match op.ctx.sources().0.get(&kind) {
            Some(runbook_operator::observe::view::Source::Targets(store, _, _)) => store
                .state()
                .iter()
                .filter(|o| o.json.contains(r#""phase":"Done""#))
                .count(),
            _ => 0,
        };
        if finished >= n || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    op.settle(Duration::from_millis(500), Duration::from_secs(60))
        .await;
    println!(
        "STEADY {} {}",
        status_kb("VmRSS:") * 1024,
        runbook_sys::alloc::live()
    );
    // Peaks from here on.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    runbook_sys::alloc::reset_peak();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    tokio::time::sleep(Duration::from_secs(1)).await;
    op.settle(Duration::from_millis(1000), Duration::from_secs(120))
        .await;
    println!(
        "PEAK {} {}",
        status_kb("VmHWM:") * 1024,
        runbook_sys::alloc::peak()
    );
    op.shutdown(Duration::from_secs(5)).await;
}

#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryFigures {
    pub targets: usize,
    pub rss: u64,
    pub heap: u64,
    pub peak_rss: u64,
    pub peak_heap: u64,
    /// Lists the operator made after the compaction.
    pub relists: u64,
}

fn read_until(child: &mut BufReader<std::process::ChildStdout>, prefix: &str) -> Vec<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if child.read_line(&mut line).unwrap_or(0) == 0 {
            panic!("the child exited before saying {prefix}");
        }
        if let Some(rest) = line.trim().strip_prefix(prefix) {
            return rest.split_whitespace().map(str::to_string).collect();
        }
    }
}

fn spawn(exe: &Path, args: &[String]) -> Child {
    Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting a benchmark child")
}

/// Run both children (`exe` with `args` then the role's arguments).
pub fn measure(exe: &Path, args: &[&str], n: usize) -> MemoryFigures {
    let with = |extra: &[String]| -> Vec<String> {
        args.iter()
            .map(|s| s.to_string())
            .chain(extra.iter().cloned())
            .collect()
    };
    let mut server = spawn(exe, &with(&["sandbox".into(), n.to_string()]));
    let mut server_out = BufReader::new(server.stdout.take().expect("stdout"));
    let kubeconfig = PathBuf::from(read_until(&mut server_out, "KUBECONFIG ").join(" "));
    let mut op = spawn(
        exe,
        &with(&[
            "operator".into(),
            n.to_string(),
            kubeconfig.display().to_string(),
        ]),
    );
    let mut op_out = BufReader::new(op.stdout.take().expect("stdout"));
    let steady = read_until(&mut op_out, "STEADY ");
    let mut server_in = server.stdin.take().expect("stdin");
    let _ = writeln!(server_in, "count");
    let lists_before: u64 = read_until(&mut server_out, "LISTS ")
        .first()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let _ = writeln!(server_in, "relist");
    let _ = read_until(&mut server_out, "relisting");
    let _ = writeln!(op.stdin.take().expect("stdin"), "go");
    let peak = read_until(&mut op_out, "PEAK ");
    let _ = writeln!(server_in, "count");
    let lists_after: u64 = read_until(&mut server_out, "LISTS ")
        .first()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let _ = op.wait();
    let _ = server.kill();
    let _ = server.wait();
    let num = |v: &[String], i: usize| v.get(i).and_then(|s| s.parse().ok()).unwrap_or(0);
    MemoryFigures {
        targets: n,
        rss: num(&steady, 0),
        heap: num(&steady, 1),
        peak_rss: num(&peak, 0),
        peak_heap: num(&peak, 1),
        relists: lists_after.saturating_sub(lists_before),
    }
}
