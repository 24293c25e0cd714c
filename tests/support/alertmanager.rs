//! Prometheus' Alertmanager, the real one (Debian's `prometheus-alertmanager`,
//! installed where it is missing and apt can), started on 127.0.0.1 with a
//! throw-away configuration and storage, and read through its API.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BINARY: &str = "prometheus-alertmanager";
const AMTOOL: &str = "amtool";

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The Debian package, installed if it is missing and apt-get is there (as
/// root, as on CI); `Err` says why it cannot be had.
pub fn installed(name: &str) -> Result<PathBuf, String> {
    if let Some(p) = on_path(name) {
        return Ok(p);
    }
    if on_path("apt-get").is_none() {
        return Err(format!("{name} is not installed and apt-get is not here"));
    }
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "prometheus-alertmanager"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => {
            on_path(name).ok_or(format!("{name} still not found after apt-get"))
        }
        Ok(s) => Err(format!(
            "apt-get install prometheus-alertmanager failed ({s})"
        )),
        Err(e) => Err(format!("apt-get install prometheus-alertmanager: {e}")),
    }
}

/// `amtool`, from the same package.
pub fn amtool() -> Result<PathBuf, String> {
    installed(AMTOOL)
}

/// A running Alertmanager, stopped when dropped.
pub struct Alertmanager {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One HTTP/1.0 exchange (the server closes the connection, nothing is
/// chunked): the status code and the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((code, body.to_string()))
}

impl Alertmanager {
    /// Start one; `Err` says why none could be started (the test then
    /// skips, saying so).
    pub fn start() -> Result<Self, String> {
        let binary = installed(BINARY)?;
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("runbook-am-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let config = dir.join("alertmanager.yml");
        std::fs::write(
            &config,
            "route:\n  receiver: nobody\n  group_wait: 1s\nreceivers:\n  - name: nobody\n",
        )
        .map_err(|e| e.to_string())?;
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // No gossip: one process, nothing else on the network.
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {BINARY}: {e}"))?;
        let am = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok((200, _)) = http(port, "GET", "/-/ready", "") {
                return Ok(am);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("{BINARY} did not get ready on port {port}"))
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The alerts it holds (resolved ones drop out of this list).
    pub fn alerts(&self) -> Vec<Value> {
        http(self.port, "GET", "/api/v2/alerts", "")
            .ok()
            .and_then(|(_, body)| serde_json::from_str::<Vec<Value>>(&body).ok())
            .unwrap_or_default()
    }

    /// Its alert with these label values, if it holds one.
    pub fn alert(&self, labels: &[(&str, &str)]) -> Option<Value> {
        self.alerts()
            .into_iter()
            .find(|a| labels.iter().all(|(k, v)| a["labels"][k] == *v))
    }
}
