//! Load generator for a running deltaserve (or any OpenAI-compatible server). Two workloads:
//! `completions` (N concurrent streaming clients sending requests back to back; throughput and
//! TTFT / ITL percentiles) and `chat` (N concurrent conversations of `--turns` streamed chat
//! turns after one shared system prompt, each turn re-sending the conversation so far; TTFT of
//! the first turn and of the later ones, the prefix cache's workload). Only loopback or your
//! own hosts are sensible targets.

use std::time::{Duration, Instant};

use clap::Parser;
use deltaserve_benches::sse::{pct, stream_tokens, Sample};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// Independent completions of one prompt.
    Completions,
    /// Multi-turn chat conversations sharing a system prompt.
    Chat,
}

#[derive(Debug, Clone, Parser)]
#[command(about = "Concurrent streaming load against /v1/completions or /v1/chat/completions")]
struct Args {
    /// What to send.
    #[arg(long, value_enum, default_value_t = Workload::Completions)]
    workload: Workload,
    /// Chat: turns per conversation (`--clients` conversations run at once, `--requests` is
    /// ignored).
    #[arg(long, default_value_t = 5)]
    turns: usize,
    /// Chat: number of the first conversation (their questions name it). A run with other
    /// numbers asks other questions after the same system prompt: a warm-up that shares no
    /// conversation with the measured run.
    #[arg(long, default_value_t = 0)]
    first_conversation: usize,
    /// Chat: approximate length of the shared system prompt in tokens.
    #[arg(long, default_value_t = 2000)]
    system_tokens: usize,
    /// Chat: mean pause in ms between an answer's end and the next turn (a person reading and
    /// typing; 0, the default, is an agent's immediate follow-up). Each pause is drawn uniformly
    /// from 0.5–1.5× the mean, seeded by conversation and turn, so conversations drift apart as
    /// real ones do rather than sending their turns in lockstep.
    #[arg(long, default_value_t = 0)]
    think_ms: u64,
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
    /// Sampling temperature (0: greedy, which keeps the server's per-token sampling cost out of
    /// the TTFT of a large vocabulary).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Completions: start every prompt with its request number, so that no two share a
    /// cacheable prefix (every request misses the prefix cache).
    #[arg(long)]
    distinct: bool,
    /// Stop after this many seconds even if requests remain.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
}

async fn one(client: &reqwest::Client, url: &str, prompt: &str, (max_tokens, temperature): (usize, f64), s: &mut Sample) {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "temperature": temperature, "stream": true, "stream_options": {"include_usage": true}});
    stream_tokens(client, &format!("{url}/v1/completions"), &body, s).await;
}

/// One conversation: `turns` streamed chat turns after `system`, each re-sending the
/// conversation so far (after `--think-ms`); TTFTs go to `first` (turn 1) or `later`.
async fn conversation(client: &reqwest::Client, url: &str, system: &str, id: usize, a: &Args, first: &mut Sample, later: &mut Sample) {
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    for turn in 0..a.turns {
        if turn > 0 && a.think_ms > 0 {
            use rand::{Rng, SeedableRng};
            let mut rng = rand::rngs::StdRng::seed_from_u64((id * 1000 + turn) as u64);
            let ms = a.think_ms as f64 * rng.random_range(0.5..1.5);
            tokio::time::sleep(Duration::from_secs_f64(ms / 1e3)).await;
        }
        let ask = format!("Conversation {id}, question {turn}: write a function that adds {turn} to a number, with a test.");
        messages.push(serde_json::json!({"role": "user", "content": ask}));
        let body = serde_json::json!({"messages": messages, "max_tokens": a.max_tokens, "ignore_eos": true, "temperature": a.temperature, "stream": true, "stream_options": {"include_usage": true}, "logprobs": true});
        let sample = if turn == 0 { &mut *first } else { &mut *later };
        let Some(answer) = stream_tokens(client, &format!("{url}/v1/chat/completions"), &body, sample).await else { return };
        messages.push(serde_json::json!({"role": "assistant", "content": answer}));
    }
}

/// The chat workload: `--clients` conversations at once; one table row per turn group.
async fn chat(a: &Args) {
    let system = format!(
        "You are a careful Python assistant. {}",
        "Answer with code:\ndef add(a, b):\n    return a + b\n\n".repeat((a.system_tokens / 16).max(1))
    );
    let client = reqwest::Client::new();
    let started = Instant::now();
    let tasks = (0..a.clients).map(|id| {
        let (client, url, system) = (client.clone(), a.url.clone(), system.clone());
        let a = a.clone();
        tokio::spawn(async move {
            let (mut first, mut later) = (Sample::default(), Sample::default());
            conversation(&client, &url, &system, a.first_conversation + id, &a, &mut first, &mut later).await;
            (first, later)
        })
    });
    let (mut first, mut later) = (Sample::default(), Sample::default());
    for (f, l) in futures::future::join_all(tasks).await.into_iter().flatten() {
        first.merge(f);
        later.merge(l);
    }
    let secs = started.elapsed().as_secs_f64();
    for (name, s) in [("turn 1", &mut first), ("turns 2+", &mut later)] {
        println!(
            "| {} | {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            a.clients,
            s.ttft.len(),
            1e3 * pct(&mut s.ttft, 0.5),
            1e3 * pct(&mut s.ttft, 0.99),
            1e3 * pct(&mut s.itl, 0.5),
            s.generated() as f64 / secs,
            s.errors
        );
    }
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    if a.workload == Workload::Chat {
        chat(&a).await;
        return;
    }
    let prompt = "def add(a, b):\n    return a + b\n\n".repeat((a.prompt_tokens / 14).max(1));
    let client = reqwest::Client::new();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.timeout_s);
    let per_client = a.requests.div_ceil(a.clients);
    let tasks = (0..a.clients).map(|c| {
        let (client, url, prompt) = (client.clone(), a.url.clone(), prompt.clone());
        let (max_tokens, distinct, temperature) = (a.max_tokens, a.distinct, a.temperature);
        tokio::spawn(async move {
            let mut s = Sample::default();
            for i in 0..per_client {
                if Instant::now() > deadline {
                    break;
                }
                let p = if distinct { format!("# request {c}-{i}\n{prompt}") } else { prompt.clone() };
                one(&client, &url, &p, (max_tokens, temperature), &mut s).await;
            }
            s
        })
    });
    let mut all = Sample::default();
    for t in futures::future::join_all(tasks).await.into_iter().flatten() {
        all.merge(t);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
        a.clients,
        all.ttft.len(),
        all.generated() as f64 / secs,
        1e3 * pct(&mut all.ttft, 0.5),
        1e3 * pct(&mut all.ttft, 0.99),
        1e3 * pct(&mut all.itl, 0.5),
        1e3 * pct(&mut all.itl, 0.99),
        all.errors
    );
}
