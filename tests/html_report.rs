//! `runbook simulate --html`: the page of the README's week, read as a
//! file and loaded in a real (headless) browser.

// A test's failed unwrap is its failure, and a test reads top to bottom:
// the workspace's unwrap and function-length lints are for the product.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("runbook-html-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// The week's page, and what `-o json` says of the same run.
fn week(dir: &Path) -> (String, Value) {
    let page = dir.join("week.html");
    let out = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .current_dir(root())
        .args([
            "simulate",
            "examples/evaluator-drift",
            "-o",
            "json",
            "--html",
        ])
        .arg(&page)
        .output()
        .expect("runbook simulate");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(
        out.status.success(),
        "{}\nfailures: {}\nload errors: {}",
        String::from_utf8_lossy(&out.stderr),
        json["failures"],
        json["loadErrors"]
    );
    (std::fs::read_to_string(&page).expect("the page"), json)
}

/// The `<g>` of every marker of a class, with its hover text.
fn markers<'a>(page: &'a str, class: &str) -> Vec<&'a str> {
    let open = format!(r#"<g class="marker {class}""#);
    page.match_indices(&open)
        .map(|(i, _)| {
            let end = page[i..].find("</g>").map_or(page.len(), |e| i + e);
            &page[i..end]
        })
        .collect()
}

#[test]
fn the_weeks_page_shows_the_rollback_the_alert_and_every_action() {
    let dir = scratch("content");
    let (page, json) = week(&dir);
    // One file, nothing fetched: no scripts, stylesheets, images or fonts
    // from anywhere.
    for outside in [
        "<script", "<link", "<img", "@import", "url(", "src=", "href=",
    ] {
        assert!(!page.contains(outside), "the page refers out: {outside}");
    }
    assert!(page.len() < 1_000_000, "the page is {} bytes", page.len());
    // The rollback of the week, on the Evaluator's charts (the whole week
    // and the close-up), with what it did in its hover text.
    let rollbacks = markers(&page, "rollback");
    assert_eq!(
        rollbacks.len(),
        4,
        "two score charts and two revision charts"
    );
    for m in &rollbacks {
        assert!(m.contains("data-at=\"+51h05m\""), "{m}");
        assert!(
            m.contains("rollback apps/v1 Deployment default/chatbot  revision 2 -&gt; 1"),
            "{m}"
        );
    }
    let alerts = markers(&page, "alert");
    assert!(!alerts.is_empty() && alerts.iter().all(|m| m.contains("EvaluatorRolledBack")));
    let resolves = markers(&page, "resolve");
    assert!(resolves.iter().all(|m| m.contains("data-at=\"+52h05m\"")));
    assert!(!resolves.is_empty());
    // The score against its threshold, and the phases as bands.
    assert!(page.contains("status.lastScore</h3>"));
    assert!(page.contains(">spec.threshold 0.85</text>"));
    assert!(page.contains("phase RolledBack"));
    assert!(
        page.contains("lastScore = 0.62"),
        "the bad score is a point"
    );
    // Every action is on the lane: as many marks as the run has entries.
    let entries = json["entries"].as_array().expect("entries");
    let count = |action: &str| entries.iter().filter(|e| e["action"] == action).count();
    for action in [
        "apply", "delete", "status", "rollback", "alert", "resolve", "notify",
    ] {
        let marks = page
            .matches(&format!(r#"<rect class="action {action} "#))
            .count();
        assert_eq!(marks, count(action), "{action} marks on the lane");
    }
    assert_eq!(
        count("status"),
        page.matches(r#"class="action status result-ok""#).count()
    );
}

/// A Chromium (Debian's `chromium`, or another of its names).
fn browser() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for name in [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// What the page, as the browser laid it out, says about itself: the
/// probe runs after every element is parsed and asks for the layout.
const CATCH: &str = "<script>window.__errors = []; window.addEventListener('error', function (e) { window.__errors.push(String(e.message || e.type)); }, true);</script>";
const PROBE: &str = r#"<script>
(function () {
  var out = {errors: window.__errors, svgs: document.querySelectorAll('svg').length};
  var m = document.querySelector('.marker.rollback');
  if (m) {
    var r = m.querySelector('path').getBoundingClientRect();
    out.rollback = {x: r.x, y: r.y, w: r.width, h: r.height};
    var hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height * 0.4);
    out.onTop = !!hit && m.contains(hit);
    out.fill = window.getComputedStyle(m.querySelector('path')).fill;
    out.title = m.querySelector('title').textContent;
    var svg = m.ownerSVGElement.getBoundingClientRect();
    out.inside = r.x >= svg.x && r.right <= svg.right && r.y >= svg.y && r.bottom <= svg.bottom;
  }
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"#;

#[test]
fn a_real_browser_loads_the_page_without_error_and_draws_the_rollback_marker() {
    let Some(chromium) = browser() else {
        eprintln!(
            "SKIPPED: no Chromium on this machine (.ci/run installs Debian's chromium where apt works)"
        );
        return;
    };
    let dir = scratch("browser");
    let (page, _) = week(&dir);
    let probed = page
        .replacen("<head>", &format!("<head>{CATCH}"), 1)
        .replacen("</body>", &format!("{PROBE}</body>"), 1);
    let file = dir.join("probed.html");
    std::fs::write(&file, probed).expect("write");
    let mut child = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--enable-logging=stderr",
            "--v=0",
            // Nothing leaves the machine: a page that fetched anything
            // would log a failed load.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--window-size=1200,2400",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("file://{}", file.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    // Both pipes are drained while it runs (its log can outgrow a pipe).
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let dom = stdout.join().expect("stdout");
    let log = stderr.join().expect("stderr");
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE(")).collect();
    assert!(
        console.is_empty(),
        "console messages:\n{}",
        console.join("\n")
    );
    let start = dom
        .find(r#"<pre id="probe">"#)
        .unwrap_or_else(|| panic!("no probe in the DOM (chromium: {log})"));
    let text = &dom[start + r#"<pre id="probe">"#.len()..];
    let text = &text[..text.find("</pre>").expect("probe end")];
    let probe: Value = serde_json::from_str(
        &text
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&gt;", ">")
            .replace("&lt;", "<"),
    )
    .unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(probe["errors"], serde_json::json!([]), "{probe}");
    assert!(probe["svgs"].as_u64() >= Some(5), "{probe}");
    let r = &probe["rollback"];
    assert!(
        r["w"].as_f64() > Some(8.0) && r["h"].as_f64() > Some(8.0),
        "{probe}"
    );
    assert_eq!(
        probe["inside"], true,
        "the marker is inside its chart: {probe}"
    );
    assert_eq!(probe["onTop"], true, "nothing covers the marker: {probe}");
    assert_eq!(probe["fill"], "rgb(214, 60, 50)", "{probe}");
    assert!(
        probe["title"]
            .as_str()
            .is_some_and(|t| t.contains("revision 2 -> 1")),
        "{probe}"
    );
}

/// A policy that scales a Deployment it does not own (a night shift: down
/// at 20:00, up at 07:00): the page charts the Deployment's replicas as
/// the policy set them, with whole-number ticks only.
#[test]
fn a_deployment_a_policy_scales_is_charted_too() {
    let dir = scratch("night-shift");
    std::fs::create_dir_all(dir.join("policy")).unwrap();
    std::fs::write(
        dir.join("policy/night-shift.yaml"),
        "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {name: night-shift}\nspec:\n  target: {apiVersion: v1, kind: ConfigMap}\n  selector: {matchLabels: {shift: night}}\n  mutates: [{apiVersion: apps/v1, kind: Deployment}]\n  schedules:\n    - {name: evening, cron: \"0 20 * * *\", firstRun: schedule}\n    - {name: morning, cron: \"0 7 * * *\", firstRun: schedule}\n  status: {fields: [], conditions: []}\n  script: night-shift.rhai\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("policy/night-shift.rhai"),
        "fn reconcile(ctx) {\n    if !ctx.due { return []; }\n    let n = if ctx.fired.contains(\"evening\") { 0 } else { 3 };\n    [patch(\"Deployment\", ctx.resource.data.deployment, #{ spec: #{ replicas: n } })]\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("objects.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shift, namespace: default, labels: {shift: night}}\ndata: {deployment: web}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 3\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: nginx}]}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("days.yaml"),
        "apiVersion: runbook.dev/v1alpha1\nkind: Scenario\nmetadata: {name: night shift}\nspec:\n  policies: policy\n  objects: [objects.yaml]\n  start: \"2026-12-01T12:00:00Z\"\n  until: 48h\n  timeline:\n    - at: 0s\n      expect:\n        - {action: patch, kind: Deployment, name: web, count: 4}\n",
    )
    .unwrap();
    let page = dir.join("days.html");
    let out = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(["simulate"])
        .arg(dir.join("days.yaml"))
        .arg("--html")
        .arg(&page)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The timeline line says what the patch set.
    assert!(stdout.contains(r#"{"spec":{"replicas":0}}"#), "{stdout}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("changed by the policies"),
        "no section for the Deployment"
    );
    assert!(html.contains(">spec.replicas</h3>"), "no replicas panel");
    // Whole numbers only on the replicas' axis (no 1.5 tick).
    let panel = &html[html.find(">spec.replicas</h3>").unwrap()..];
    let panel = &panel[..panel.find("</svg>").unwrap()];
    assert!(
        !panel.contains(">1.5<") && !panel.contains(">0.5<"),
        "fractional ticks"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An Evaluator judged by a metric: the page charts the world's series
/// against the Evaluator's threshold, and says when there was no data.
#[test]
fn a_metric_series_is_charted_against_the_threshold() {
    let dir = scratch("metric");
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("metric.html");
    let out = Command::new(env!("CARGO_BIN_EXE_runbook"))
        .args(["simulate"])
        .arg(root().join("policies/scenarios/evaluator-metric.yaml"))
        .arg("--html")
        .arg(&page)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let at = html
        .find("<h2>metric quality <small>(the world's metric)</small></h2>")
        .expect("a section for the metric");
    let section = &html[at..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(section.contains(">threshold 0.85<"), "no threshold line");
    for value in [
        "metric quality = 0.93",
        "metric quality = 0.71",
        "metric quality = 0.92",
    ] {
        assert!(section.contains(value), "{value} not drawn");
    }
    assert!(
        section.contains("no data from +3.5h"),
        "the gap is not said"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
