//! A real Prometheus in tests: the program (Debian's `prometheus`
//! package, which `.ci/run` installs; without it a test says it skips),
//! started on loopback over a config of the test's, its HTTP API asked
//! over plain HTTP/1.0, and a small exporter whose values the test sets.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::cluster::Running;

/// The program `name` on the PATH, or a line saying the test skips.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        eprintln!("skipping: {name} is not installed (apt-get install prometheus)");
    }
    found
}

/// A free port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// `GET path` of `addr` over HTTP/1.0 (no chunking): the status code and
/// the body; none when nothing answers.
pub async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let (addr, req) = (
        addr.to_string(),
        format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n"),
    );
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.write_all(req.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_string()))
    })
    .await
    .ok()
    .flatten()
}

/// `text` as a URL's query component.
pub fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query: the result, or Prometheus's error.
pub async fn query(addr: &str, q: &str) -> Result<Vec<Value>, String> {
    let (_, body) = get(addr, &format!("/api/v1/query?query={}", encoded(q)))
        .await
        .ok_or_else(|| "Prometheus did not answer".to_string())?;
    let answer: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if answer["status"] != "success" {
        return Err(format!("{}: {}", answer["errorType"], answer["error"]));
    }
    Ok(answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Prometheus on `127.0.0.1:port`, with `config` (YAML) and its data in
/// `dir`; stopped when dropped.
pub fn start(prometheus: &Path, dir: &Path, port: u16, config: &str) -> Running {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    Running(
        Command::new(prometheus)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus"),
    )
}

/// An exporter on loopback: `GET /metrics` answers the text it holds now.
pub struct Exporter {
    pub port: u16,
    text: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Exporter {
    pub async fn start() -> Self {
        let text: Arc<Mutex<String>> = Arc::default();
        let serving = text.clone();
        let (port, task) = runbook_sandbox::stub::serve(move |_head| {
            let body = serving.lock().unwrap().clone();
            std::future::ready(runbook_sandbox::stub::Answer::ok(
                "text/plain; version=0.0.4",
                body,
            ))
        })
        .await
        .unwrap();
        Self { port, text, task }
    }

    /// What the next scrape reads (the exposition format).
    pub fn set(&self, text: &str) {
        *self.text.lock().unwrap() = text.to_string();
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The queries Prometheus logged (`query_log_file`), each as sent.
pub fn logged_queries(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["params"]["query"].as_str().map(str::to_string))
        .collect()
}
