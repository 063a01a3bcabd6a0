//! The server as an operator runs it: shutdown and its drain, a closed log stream, the metrics
//! (scraped by a real Prometheus where one is installed), host names, memory sizing at start,
//! connection timeouts and a split model.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use super::{model_dir, sample, start, start_with, Server};

#[tokio::test]
async fn sigterm_drains_in_flight_streams_then_exits_zero() {
    let mut srv = start(&["--shutdown-timeout", "30"]).await;
    let mut body = Box::pin(srv.open_stream(json!({"prompt": "a", "max_tokens": 400, "ignore_eos": true, "stream": true})).await);
    let first = body.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    let pid = srv.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // While draining: not ready, and new work is refused with 503.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = srv.client.get(format!("{}/ready", srv.base)).send().await.unwrap();
        if r.status() == 503 {
            break;
        }
        assert!(Instant::now() < deadline, "/ready never turned 503");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (st, v) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 2})).await;
    assert_eq!((st, v["error"]["type"].as_str()), (503, Some("unavailable_error")));
    // The in-flight stream runs to its end.
    let mut rest = String::from_utf8_lossy(&first).into_owned();
    while let Some(chunk) = body.next().await {
        rest.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(rest.trim_end().ends_with("data: [DONE]"), "stream did not finish");
    assert!(rest.contains("\"finish_reason\":\"length\""), "stream cut short");
    let status = srv.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    srv.child = Command::new("true").spawn().unwrap();
}

/// A log pipe whose reader goes away (a crashed log shipper, `deltaserve serve | head`) costs
/// log lines, never requests: refused and served requests both log, and SIGTERM still drains.
#[tokio::test]
async fn closed_log_stream_does_not_stop_the_server() {
    let mut srv = start_with(&[], false).await;
    for _ in 0..3 {
        // Refusals log at info, so each of these writes to the closed pipe.
        let (st, v) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 0})).await;
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some("max_tokens")), "{v}");
    }
    let (st, v) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 3, "ignore_eos": true})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    let m = srv.client.get(format!("{}/metrics", srv.base)).send().await.unwrap().text().await.unwrap();
    assert!(m.contains("deltaserve:state_slots_total"), "{m}");
    let pid = srv.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = srv.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    srv.child = Command::new("true").spawn().unwrap();
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text() {
    let srv = start(&[]).await;
    srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 3, "ignore_eos": true})).await;
    let m = srv.metrics().await;
    let mut families = 0;
    for line in m.lines() {
        if line.starts_with("# TYPE ") {
            families += 1;
            let kind = line.split(' ').nth(3).unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
        } else if !line.starts_with('#') && !line.is_empty() {
            // name{labels} value
            let (name, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
            let bare = name.split('{').next().unwrap();
            assert!(bare.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'), "{line}");
            assert!(bare.starts_with("deltaserve:"), "{line}");
        }
    }
    assert!(families >= 15, "only {families} metric families");
    for name in [
        "deltaserve:time_to_first_token_seconds_bucket",
        "deltaserve:inter_token_latency_seconds_bucket",
        "deltaserve:e2e_request_latency_seconds_bucket",
        "deltaserve:request_queue_time_seconds_bucket",
    ] {
        assert!(m.contains(name), "{name} missing");
    }
    assert_eq!(sample(&m, "deltaserve:generation_tokens_total", ""), 3.0);
    assert_eq!(sample(&m, "deltaserve:time_to_first_token_seconds_count", ""), 1.0);
    assert_eq!(sample(&m, "deltaserve:request_success_total", "finished_reason=\"length\""), 1.0);
    scrape_with_real_prometheus(&srv).await;
    // A request of three choices is one request (vLLM's meaning), not three.
    let (st, _) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 2, "n": 3, "ignore_eos": true})).await;
    assert_eq!(st, 200);
    let m = srv.metrics().await;
    assert_eq!(sample(&m, "deltaserve:request_success_total", "finished_reason=\"length\""), 2.0, "{m}");
}

/// If Debian's `prometheus` is installed, scrape the server for real and query a metric back.
async fn scrape_with_real_prometheus(srv: &Server) {
    let Ok(bin) = which("prometheus") else {
        eprintln!("NOTICE: metrics_parse_as_prometheus_text: no `prometheus` binary on PATH; the real-scrape check did not run");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let target = srv.base.trim_start_matches("http://");
    std::fs::write(dir.path().join("prometheus.yml"), format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: deltaserve\n    static_configs:\n      - targets: ['{target}']\n")).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut prom = Command::new(bin)
        .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/api/v1/query?query=deltaserve:generation_tokens_total");
    let deadline = Instant::now() + Duration::from_secs(40);
    let found = loop {
        if let Ok(r) = srv.client.get(&url).send().await {
            if let Ok(v) = r.json::<Value>().await {
                if let Some(val) = v["data"]["result"][0]["value"][1].as_str() {
                    break Some(val.to_owned());
                }
            }
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let _ = prom.kill();
    let _ = prom.wait();
    assert_eq!(found.as_deref(), Some("3"), "Prometheus did not scrape deltaserve:generation_tokens_total");
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file())).ok_or(())
}

/// `--host` takes a host name, as vLLM's does: `localhost` resolves and serves.
#[tokio::test]
async fn a_host_name_resolves() {
    let srv = start(&["--host", "localhost"]).await;
    let (st, _) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 2})).await;
    assert_eq!(st, 200);
}

/// The CPU state pool is committed at start: the process's resident memory covers the pool it
/// reports (a lazily mapped pool showed 12 GB in the gauge and 53 MB resident, so running out
/// of memory would come under load instead of at start).
#[tokio::test]
async fn the_state_pool_is_resident_from_the_start() {
    let srv = start(&["--max-num-seqs", "6000"]).await;
    let pool = sample(&srv.metrics().await, "deltaserve:state_memory_bytes", "");
    assert!(pool > 100e6, "pool of {pool} bytes: too small to tell");
    let pid = srv.child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc (Linux)");
    let rss_kb: f64 = status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap();
    assert!(rss_kb * 1024.0 >= pool, "resident {} MB below the {} MB pool", rss_kb / 1024.0, pool / 1e6);
}

/// An impossible `--max-num-seqs` is clamped at start to what the memory budget holds (a
/// warning in the log), never reserved lazily and found missing under load.
#[tokio::test]
async fn an_impossible_max_num_seqs_is_clamped_to_the_memory_budget_at_start() {
    let srv = start(&["--max-num-seqs", "1000000000000", "--state-memory-fraction", "0.01"]).await;
    let avail: f64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .unwrap()
        * 1024.0;
    let pool = sample(&srv.metrics().await, "deltaserve:state_memory_bytes", "");
    assert!(pool > 0.0 && pool <= 0.012 * avail, "pool {pool} bytes against 1% of {avail} available");
    let (st, _) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 2})).await;
    assert_eq!(st, 200);
}

/// Slow clients: a connection whose headers stop arriving is closed after
/// `--header-read-timeout`, and a body shorter than its Content-Length gets 408 after
/// `--body-read-timeout`; meanwhile other requests are served.
#[tokio::test]
async fn slow_headers_and_short_bodies_are_cut_off_at_their_timeouts() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let srv = start(&["--header-read-timeout", "1", "--body-read-timeout", "1"]).await;
    let addr = srv.base.trim_start_matches("http://").to_owned();
    let read_all = |mut s: tokio::net::TcpStream| async move {
        let mut out = Vec::new();
        // Bounded: a server that never closes fails here after 10 s (before: 45 s or more).
        let r = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        (r.is_ok(), String::from_utf8_lossy(&out).into_owned())
    };

    // Headers that never finish.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n").await.unwrap();
    let started = Instant::now();
    let slow_headers = tokio::spawn(read_all(s));
    // Another client is served while that one dawdles.
    let (st, _) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 2})).await;
    assert_eq!(st, 200);
    let (closed, text) = slow_headers.await.unwrap();
    assert!(closed, "a connection with unfinished headers stayed open 10 s");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "closed after {waited:?}, before the 1 s timeout");
    assert!(!text.contains("200 OK"), "{text}");

    // A body 10 bytes short of its Content-Length.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = br#"{"prompt": "a", "max_tokens": 2}"#;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len() + 10
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let (closed, text) = read_all(s).await;
    assert!(closed, "a short body held its connection 10 s");
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"body_timeout\"") && text.contains("--body-read-timeout"), "{text}");
    let m = srv.metrics().await;
    assert_eq!(sample(&m, "deltaserve:request_errors_total", "code=\"408\""), 1.0, "{m}");
}

#[tokio::test]
async fn a_server_split_over_two_ranks_answers_as_the_unsplit_one() {
    // `--tensor-parallel-size 2` on the CPU: two rank threads in lockstep, each holding half of
    // every layer's heads and its own states; batched prompts with echoed prompt logprobs.
    let (whole, split) = (start(&[]).await, start(&["--tensor-parallel-size", "2"]).await);
    let body = json!({"prompt": ["def fibonacci(n):\n", "x = 1", "import os\nimport sys\n"], "echo": true, "logprobs": 2,
                      "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let ((s1, a), (s2, b)) = (whole.post("/v1/completions", body.clone()).await, split.post("/v1/completions", body).await);
    assert_eq!((s1, s2), (200, 200), "{a}\n{b}");
    let (ca, cb) = (a["choices"].as_array().unwrap(), b["choices"].as_array().unwrap());
    assert_eq!(ca.len(), 3);
    let mut compared = 0;
    for (x, y) in ca.iter().zip(cb) {
        assert_eq!(x["text"], y["text"], "greedy text");
        assert_eq!(x["logprobs"]["tokens"], y["logprobs"]["tokens"]);
        let (lx, ly) = (x["logprobs"]["token_logprobs"].as_array().unwrap(), y["logprobs"]["token_logprobs"].as_array().unwrap());
        for (p, q) in lx.iter().zip(ly).filter(|(p, _)| !p.is_null()) {
            let (p, q) = (p.as_f64().unwrap(), q.as_f64().unwrap());
            assert!((p - q).abs() <= 1e-4 * p.abs().max(1.0), "logprob {p} against {q}");
            compared += 1;
        }
    }
    assert!(compared > 30, "{compared} logprobs compared");
    // Each rank holds half of every layer's states (2 heads, one a rank): the state memory
    // gauge, per device, is half the unsplit server's.
    let (mw, ms) = (whole.metrics().await, split.metrics().await);
    let (bw, bs) = (sample(&mw, "deltaserve:state_memory_bytes", ""), sample(&ms, "deltaserve:state_memory_bytes", ""));
    assert!(bw > 0.0 && bs * 2.0 == bw, "state memory: split {bs}, unsplit {bw}");
}

#[test]
fn a_split_the_model_cannot_take_stops_the_server_with_the_reason() {
    // The gdn fixture has 2 value heads: they do not split 4 ways.
    let out = Command::new(env!("CARGO_BIN_EXE_deltaserve"))
        .args(["serve", "--model", &model_dir(), "--host", "127.0.0.1", "--port", "0", "--tensor-parallel-size", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {:?}", out.status);
    assert!(err.contains("num_v_heads") && err.contains("multiple of the tensor parallel size 4") && err.contains("got 2"), "{err}");
}

/// A SIGTERM while the model is still loading ends the process within a few seconds, with status
/// 0, whatever the load is doing. Here the load blocks for good: the checkpoint's `config.json`
/// is a FIFO that nothing writes.
#[cfg(unix)]
#[test]
fn sigterm_while_the_model_loads_exits_promptly() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    assert!(Command::new("mkfifo").arg(&config).status().unwrap().success(), "mkfifo");
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltaserve"))
        .args(["--log-json", "serve", "--model", dir.path().to_str().unwrap(), "--host", "127.0.0.1", "--port", "0"])
        .env("DELTASERVE_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn deltaserve");
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = lines.by_ref().map_while(Result::ok).find(|l| l.contains("loading model"));
    assert!(listening.is_some(), "the server never said it was loading");
    let sent = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if sent.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("still running 20 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = sent.elapsed();
    let log: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(status.success(), "exit status {status}; log {log:?}");
    // The wait for the load to stop is 3 s (`START_UP_STOP_WAIT`); the rest is the process's exit.
    assert!(took < Duration::from_secs(6), "exited {took:?} after SIGTERM");
    assert!(log.iter().any(|l| l.contains("exiting without it")), "log {log:?}");
}
