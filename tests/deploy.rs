//! Deployment artefacts stay consistent with the code: every metric (and step phase) the alerts
//! and the dashboard use is exported by the real server, and the CPU image builds with the
//! README's own build command.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Every `deltaserve:...` metric name in a text.
fn metric_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("deltaserve:") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn alerts_and_dashboard_use_only_exported_metrics() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltaserve"))
        .args([
            "--log-json",
            "serve",
            "--model",
            &repo().join("tests/fixtures/compact/gdn").to_string_lossy(),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // Keep reading the log after the address: the test is about metrics, not about a closed pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if let Some(a) = v["fields"]["address"].as_str() {
                    let _ = tx.send(a.to_owned());
                }
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(120)).ok();
    let addr = addr.expect("server address");
    // A liveness deadline, generous for loaded 2-core CI machines (the server loads in well under a second when idle).
    let deadline = Instant::now() + Duration::from_secs(120);
    let exposition = loop {
        let body = std::net::TcpStream::connect(&addr).ok().and_then(|mut s| {
            use std::io::{Read, Write};
            s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
            let mut b = String::new();
            s.read_to_string(&mut b).ok()?;
            Some(b)
        });
        if let Some(b) = body.filter(|b| b.contains("deltaserve:state_slots_total")) {
            break b;
        }
        assert!(Instant::now() < deadline, "no metrics");
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    let exported: Vec<String> = exposition
        .lines()
        .filter(|l| l.starts_with("deltaserve:"))
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect();
    for file in ["deploy/prometheus/alerts.yml", "deploy/grafana/deltaserve.json", "deploy/k8s/prometheus-adapter-rules.yaml.example"] {
        let text = std::fs::read_to_string(repo().join(file)).unwrap();
        let used = metric_names(&text);
        assert!(!used.is_empty(), "{file} uses no metric");
        for name in used {
            assert!(exported.contains(&name), "{file} uses `{name}`, which the server does not export");
        }
        // The step phases it selects are exported too (each from the start, before any step).
        for phase in text.split("phase=").skip(1).filter_map(|t| t.trim_start_matches(['\\', '"']).split(['\\', '"']).next()) {
            assert!(exposition.contains(&format!("phase=\"{phase}\"")), "{file} selects phase `{phase}`, which the server does not export");
        }
    }
}

#[test]
fn cpu_image_builds_with_the_readme_build_command() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let build = readme.lines().map(str::trim).find(|l| l.starts_with("cargo build --release")).expect("README has a build command");
    let build = build.split('#').next().unwrap().trim();
    let dockerfile = std::fs::read_to_string(repo().join("deploy/docker/Dockerfile.cpu")).unwrap();
    assert!(
        dockerfile.lines().any(|l| l.trim().strip_prefix("RUN ").is_some_and(|r| r.starts_with(build))),
        "Dockerfile.cpu does not run `{build}`"
    );
}
