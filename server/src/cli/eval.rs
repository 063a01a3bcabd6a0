//! `deltaserve eval ppl`: perplexity of a model on a text file.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use deltaserve_engine::{Engine, Logits, Result as EngineResult};
use deltaserve_pruning::progress::Progress;

use super::ModelArgs;

/// Evaluate a model.
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    what: EvalCommand,
}

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// Perplexity on a text file, over windows of `--seq-len` tokens.
    Ppl(PplArgs),
}

#[derive(Debug, Args)]
struct PplArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// UTF-8 text to score.
    #[arg(long)]
    text: PathBuf,
    /// Tokens per window.
    #[arg(long, default_value_t = 2048)]
    seq_len: usize,
    /// Tokens between window starts (default: seq-len, i.e. disjoint windows). With a smaller
    /// stride, each window only scores the tokens the previous one did not.
    #[arg(long)]
    stride: Option<usize>,
    /// Score at most this many tokens.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// No progress (a bar on a terminal, log lines otherwise).
    #[arg(long)]
    quiet: bool,
}

/// Result of a perplexity run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Perplexity {
    /// exp(mean NLL).
    pub ppl: f64,
    /// Mean negative log-likelihood in nats.
    pub nll: f64,
    /// Tokens scored.
    pub tokens: usize,
}

/// Sliding-window perplexity of `ids`: each window starts from a fresh state. `progress`
/// shows how many windows are done.
pub fn perplexity(engine: &Engine, ids: &[u32], seq_len: usize, stride: usize, progress: bool) -> EngineResult<Perplexity> {
    let mut pool = engine.new_pool(1)?;
    let windows = ids.len().saturating_sub(seq_len).div_ceil(stride) + 1;
    let mut bar = Progress::new(progress, windows, "scoring", "windows");
    let (mut nll, mut count, mut scored_to) = (0f64, 0usize, 1usize);
    let mut begin = 0;
    while scored_to < ids.len() {
        let end = (begin + seq_len).min(ids.len());
        let slot = pool.allocate().ok_or(deltaserve_engine::EngineError::Invalid {
            field: "pool",
            expected: "a free slot".into(),
            actual: "none".into(),
        })?;
        let logits = engine.prefill(&mut pool, slot, &ids[begin..end], Logits::All)?;
        pool.release(slot)?;
        let rows = logits.to_vec2::<f32>()?;
        // Position p predicts ids[p + 1]; score targets in [scored_to, end).
        for target in scored_to.max(begin + 1)..end {
            let row = &rows[target - 1 - begin];
            nll -= deltaserve_engine::sampling::log_softmax_at(row, ids[target] as usize) as f64;
            count += 1;
        }
        scored_to = end;
        bar.inc();
        if end == ids.len() {
            break;
        }
        begin += stride;
    }
    bar.finish();
    let mean = nll / count.max(1) as f64;
    Ok(Perplexity { ppl: mean.exp(), nll: mean, tokens: count })
}

impl EvalArgs {
    /// The model's arguments.
    pub fn model(&self) -> &ModelArgs {
        let EvalCommand::Ppl(a) = &self.what;
        &a.model
    }
}

/// Runs the subcommand.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    let EvalCommand::Ppl(a) = args.what;
    anyhow::ensure!(a.seq_len >= 2, "invalid `--seq-len`: expected >= 2, got {}", a.seq_len);
    let stride = a.stride.unwrap_or(a.seq_len);
    anyhow::ensure!(stride >= 1 && stride <= a.seq_len, "invalid `--stride`: expected 1..={}, got {stride}", a.seq_len);
    let engine = a.model.load()?;
    let text = std::fs::read_to_string(&a.text).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", a.text.display()))?;
    let mut ids = engine.encode(&text)?;
    if let Some(m) = a.max_tokens {
        ids.truncate(m + 1);
    }
    let p = perplexity(&engine, &ids, a.seq_len, stride, !a.quiet)?;
    super::print_line(&serde_json::to_string(&p)?)
}
