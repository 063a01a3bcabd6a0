//! A serving benchmark shaped like vLLM's `benchmark_serving`: requests of seeded random
//! lengths (prompts as token ids, so lengths are exact), sent at a Poisson rate or all at once
//! under a concurrency cap, streamed, with EOS ignored. Reports request and token throughput,
//! TTFT, ITL (the gap between streamed chunks, one a token unless a token's text is empty) and
//! end-to-end latency (mean, p50, p90, p99), as a
//! markdown row and, with `--json`, a JSON object; from a deltaserve server's `/metrics`, also
//! what its engine ran meanwhile (decode steps and their mean batch, prefill passes: in the
//! JSON's `engine`, and a line on stderr). `benches/serving_sweep.sh` sweeps the
//! concurrency on the GPU and plots the results.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use deltaserve_benches::engine_metrics::{summary, Scrape};
use deltaserve_benches::sse::{pct, stream_tokens, Sample};
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Dataset {
    /// Prompt and output lengths uniform in `len · (1 ± --range-ratio)`.
    Random,
    /// A chat mix: prompts of 128–2,048 tokens, outputs of 64–512.
    Chat,
}

#[derive(Debug, Clone, Parser)]
#[command(about = "Serving benchmark (vLLM benchmark_serving's shape) against /v1/completions")]
struct Args {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Request lengths.
    #[arg(long, value_enum, default_value_t = Dataset::Random)]
    dataset: Dataset,
    /// Requests in all.
    #[arg(long, default_value_t = 200)]
    num_prompts: usize,
    /// Random dataset: prompt tokens.
    #[arg(long, default_value_t = 512)]
    input_len: usize,
    /// Random dataset: output tokens.
    #[arg(long, default_value_t = 256)]
    output_len: usize,
    /// Random dataset: lengths vary uniformly within ± this fraction.
    #[arg(long, default_value_t = 0.0)]
    range_ratio: f64,
    /// Poisson arrivals at this many requests a second (default: all at once).
    #[arg(long)]
    request_rate: Option<f64>,
    /// At most this many requests in flight.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Prompt token ids are drawn from [10, vocab).
    #[arg(long, default_value_t = 500)]
    vocab: u32,
    /// Seed of lengths, prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the results here as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// A name for this run in the outputs.
    #[arg(long, default_value = "deltaserve")]
    label: String,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Nucleus sampling's p (1: off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Ask for this many top log-probabilities a token (0: the chosen token's only), so that
    /// every token sends a chunk even when its text is held back (a random model's partial
    /// UTF-8 bytes): TTFT and ITL then time tokens, not text.
    #[arg(long)]
    logprobs: Option<usize>,
    /// Time the gaps between tokens only from this many seconds after the run starts (the
    /// ITL columns then say so): a steady state, without the streams' own start-up, as while
    /// other requests arrive from then on.
    #[arg(long)]
    itl_after_s: Option<f64>,
}

/// SplitMix64: a small seeded generator (the benchmark needs no crate for it).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in [lo, hi].
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.unit() * (hi - lo + 1) as f64) as usize
    }
}

/// One request: its prompt ids and output length.
struct Request {
    prompt: Vec<u32>,
    output: usize,
}

fn requests(a: &Args) -> Vec<Request> {
    let mut rng = Rng(a.seed);
    (0..a.num_prompts)
        .map(|_| {
            let (input, output) = match a.dataset {
                Dataset::Random => {
                    let span = |len: usize| {
                        let d = (len as f64 * a.range_ratio) as usize;
                        (len.saturating_sub(d).max(1), len + d)
                    };
                    let ((il, ih), (ol, oh)) = (span(a.input_len), span(a.output_len));
                    (rng.between(il, ih), rng.between(ol, oh))
                }
                Dataset::Chat => (rng.between(128, 2048), rng.between(64, 512)),
            };
            let prompt = (0..input).map(|_| 10 + (rng.next() % u64::from(a.vocab.max(11) - 10)) as u32).collect();
            Request { prompt, output }
        })
        .collect()
}

/// Mean and percentiles of `v` in milliseconds.
fn stats(v: &mut [f64]) -> serde_json::Value {
    let mean = if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    json!({"mean": mean * 1e3, "p50": pct(v, 0.5) * 1e3, "p90": pct(v, 0.9) * 1e3, "p99": pct(v, 0.99) * 1e3})
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let reqs = requests(&a);
    let (input_tokens, wanted): (usize, usize) = (reqs.iter().map(|r| r.prompt.len()).sum(), reqs.iter().map(|r| r.output).sum());
    let client = reqwest::Client::builder().pool_max_idle_per_host(1024).build()?;
    let limit = Arc::new(tokio::sync::Semaphore::new(a.max_concurrency.unwrap_or(usize::MAX >> 4)));
    let mut arrivals = Rng(a.seed ^ 0x5EED);
    let before = Scrape::read(&client, &a.url).await;
    let started = Instant::now();
    let mut next = Duration::ZERO;
    let mut tasks = Vec::with_capacity(reqs.len());
    for r in reqs {
        if let Some(rate) = a.request_rate {
            // Exponential gaps: a Poisson process of `rate` requests a second.
            next += Duration::from_secs_f64(-(1.0 - arrivals.unit()).ln() / rate);
            tokio::time::sleep_until((started + next).into()).await;
        }
        let permit = limit.clone().acquire_owned().await?;
        let (client, url) = (client.clone(), format!("{}/v1/completions", a.url));
        let (temperature, top_p, logprobs) = (a.temperature, a.top_p, a.logprobs);
        tasks.push(tokio::spawn(async move {
            let mut body = json!({
                "prompt": r.prompt, "max_tokens": r.output, "ignore_eos": true, "temperature": temperature, "top_p": top_p,
                "stream": true, "stream_options": {"include_usage": true}
            });
            if let Some(n) = logprobs {
                body["logprobs"] = json!(n);
            }
            let mut s = Sample::default();
            stream_tokens(&client, &url, &body, &mut s).await;
            drop(permit);
            s
        }));
    }
    let mut all = Sample::default();
    for t in futures::future::join_all(tasks).await {
        all.merge(t?);
    }
    let secs = started.elapsed().as_secs_f64();
    let engine = match (before, Scrape::read(&client, &a.url).await) {
        (Some(b), Some(after)) => after.since(&b),
        _ => None,
    };
    let engine_line = engine.as_ref().map(summary);
    let done = all.e2e.len();
    // Tokens as the server counted them (a token whose text is empty sends no chunk).
    let tokens = all.generated();
    // Before `stats` sorts the gaps (and parts them from their end times).
    let mut window = a.itl_after_s.map(|t| all.itl_since(started + Duration::from_secs_f64(t)));
    let result = json!({
        "label": a.label,
        "dataset": format!("{:?}", a.dataset).to_lowercase(),
        "num_prompts": a.num_prompts,
        "request_rate": a.request_rate,
        "max_concurrency": a.max_concurrency,
        "temperature": a.temperature,
        "top_p": a.top_p,
        "duration_s": secs,
        "completed": done,
        "failed": all.errors,
        "input_tokens": input_tokens,
        "output_tokens": tokens,
        "output_chunks": all.tokens,
        "output_tokens_wanted": wanted,
        "request_throughput": done as f64 / secs,
        "output_throughput": tokens as f64 / secs,
        "total_token_throughput": (input_tokens + tokens) as f64 / secs,
        "ttft_ms": stats(&mut all.ttft),
        "itl_ms": stats(&mut all.itl),
        "itl_after_s": a.itl_after_s,
        "itl_window_ms": window.as_mut().map(|w| stats(w)),
        "e2el_ms": stats(&mut all.e2e),
        "engine": engine,
    });
    let f = |k: &str, q: &str| result[k][q].as_f64().unwrap_or(f64::NAN);
    println!(
        "| label | concurrency | rate | req/s | out tok/s | total tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | E2E p50 ms | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let row = |label: &str, itl: &str| {
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.1} / {:.1} | {:.2} / {:.2} | {:.0} | {} |",
            label,
            a.max_concurrency.map_or("∞".into(), |c| c.to_string()),
            a.request_rate.map_or("∞".into(), |r| format!("{r}")),
            done as f64 / secs,
            tokens as f64 / secs,
            (input_tokens + tokens) as f64 / secs,
            f("ttft_ms", "p50"),
            f("ttft_ms", "p99"),
            f(itl, "p50"),
            f(itl, "p99"),
            f("e2el_ms", "p50"),
            all.errors
        )
    };
    row(&a.label, "itl_ms");
    // Then the same run with the ITL of the window only.
    if let Some(t) = a.itl_after_s {
        row(&format!("{} (ITL after {t} s)", a.label), "itl_window_ms");
    }
    // On stderr: scripts take the table's last rows from stdout.
    if let Some(line) = engine_line {
        eprintln!("{line}");
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&result)?)?;
    }
    Ok(())
}
