//! Load generator for a running deltaserve (or any OpenAI-compatible server): N concurrent
//! streaming clients, each sending requests back to back; reports throughput and TTFT / ITL
//! percentiles. Only loopback or your own hosts are sensible targets.

use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;

#[derive(Debug, Parser)]
#[command(about = "Concurrent streaming load against /v1/completions")]
struct Args {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Requests in total (spread over the clients).
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// Approximate prompt length in tokens (a repeated code snippet).
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens generated per request (EOS ignored).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Stop after this many seconds even if requests remain.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
}

#[derive(Default)]
struct Sample {
    ttft: Vec<f64>,
    itl: Vec<f64>,
    tokens: usize,
    errors: usize,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn one(client: &reqwest::Client, url: &str, prompt: &str, max_tokens: usize, s: &mut Sample) {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0.8, "stream": true});
    let t0 = Instant::now();
    let Ok(resp) = client.post(format!("{url}/v1/completions")).json(&body).send().await else {
        s.errors += 1;
        return;
    };
    if !resp.status().is_success() {
        s.errors += 1;
        return;
    }
    let mut stream = resp.bytes_stream();
    let mut last: Option<Instant> = None;
    let mut buf = String::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            s.errors += 1;
            return;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                continue;
            }
            // One SSE chunk per generated token (empty texts included).
            let now = Instant::now();
            match last {
                None => s.ttft.push(now.duration_since(t0).as_secs_f64()),
                Some(p) => s.itl.push(now.duration_since(p).as_secs_f64()),
            }
            last = Some(now);
            s.tokens += 1;
        }
    }
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let prompt = "def add(a, b):\n    return a + b\n\n".repeat((a.prompt_tokens / 14).max(1));
    let client = reqwest::Client::new();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.timeout_s);
    let per_client = a.requests.div_ceil(a.clients);
    let tasks = (0..a.clients).map(|_| {
        let (client, url, prompt) = (client.clone(), a.url.clone(), prompt.clone());
        let max_tokens = a.max_tokens;
        tokio::spawn(async move {
            let mut s = Sample::default();
            for _ in 0..per_client {
                if Instant::now() > deadline {
                    break;
                }
                one(&client, &url, &prompt, max_tokens, &mut s).await;
            }
            s
        })
    });
    let mut all = Sample::default();
    for t in futures::future::join_all(tasks).await.into_iter().flatten() {
        all.ttft.extend(t.ttft);
        all.itl.extend(t.itl);
        all.tokens += t.tokens;
        all.errors += t.errors;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
        a.clients,
        all.ttft.len(),
        all.tokens as f64 / secs,
        1e3 * pct(&mut all.ttft, 0.5),
        1e3 * pct(&mut all.ttft, 0.99),
        1e3 * pct(&mut all.itl, 0.5),
        1e3 * pct(&mut all.itl, 0.99),
        all.errors
    );
}
