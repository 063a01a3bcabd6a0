//! `deltaserve prune`: state-size pruning of key/query channels.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use deltaserve_pruning::{prune, Method, PruneOptions};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MethodArg {
    /// Seeded random subset per head.
    Rand,
    /// Row L1 norms of q_proj + k_proj (data-free).
    L1,
    /// Structured Wanda: |W| weighted by the mixer input's per-feature RMS (calibrated).
    Swanda,
    /// First-order Taylor |W ⊙ ΣG| over the calibration LM loss, by backprop (calibrated; host
    /// memory grows with --seq-len, about 10-15 GB for a 1.3B model at 2048).
    Grad,
    /// Strong rank-revealing QR of post-conv [Q; K] activations (calibrated; the paper's method).
    Drrqr,
}

/// Remove key/query channels per head and write a smaller checkpoint (smaller recurrent state).
///
/// Example: `deltaserve prune --method drrqr --ratio 0.5 ckpt/` writes `ckpt-drrqr-0.5/`
/// beside the input, calibrated on the bundled text.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Selection method.
    #[arg(long, value_enum)]
    method: MethodArg,
    /// Fraction of key/query channels removed per head: d_new = max(1, floor(d·(1 − ratio))).
    #[arg(long)]
    ratio: f64,
    /// Input checkpoint directory.
    ckpt: PathBuf,
    /// Output directory (default: beside the input, named after method and ratio, e.g.
    /// `ckpt-drrqr-0.5`).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Calibration text for swanda, grad and drrqr (default: the bundled 331 kB of Python
    /// standard-library modules; use text like the model's own training data).
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Calibration windows (default: drrqr 16, swanda and grad 128; capped by the text's length).
    #[arg(long)]
    samples: Option<usize>,
    /// Tokens per calibration window.
    #[arg(long, default_value_t = 2048)]
    seq_len: usize,
    /// Seed for rand's subsets and drrqr's row sample.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// No progress (a bar on a terminal, log lines otherwise).
    #[arg(long)]
    quiet: bool,
    /// Where calibration runs (forward passes for swanda/drrqr, gradients for grad): cpu,
    /// cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
}

/// Runs the subcommand.
pub fn run(a: PruneArgs) -> anyhow::Result<()> {
    let method = match a.method {
        MethodArg::Rand => Method::Rand,
        MethodArg::L1 => Method::L1,
        MethodArg::Swanda => Method::Swanda,
        MethodArg::Grad => Method::Grad,
        MethodArg::Drrqr => Method::Drrqr,
    };
    anyhow::ensure!(a.seq_len >= 1, "invalid `--seq-len`: expected >= 1, got 0");
    let opts = PruneOptions {
        method,
        ratio: a.ratio,
        input: a.ckpt,
        output: a.output,
        calibration: a.calibration,
        samples: a.samples,
        seq_len: a.seq_len,
        seed: a.seed,
        progress: !a.quiet,
        device: deltaserve_engine::parse_device(&a.device)?,
    };
    let r = prune(&opts)?;
    let (before, after) = r.state_bytes_per_sequence;
    super::print_line(&format!(
        "pruned {} -> {}: head_dim {} -> {}; state per sequence {} -> {} bytes ({:.1}% smaller); report: {}",
        opts.input.display(),
        r.output.display(),
        r.head_dim.0,
        r.head_dim.1,
        before,
        after,
        100.0 * (1.0 - after as f64 / before.max(1) as f64),
        r.output.join("pruning_report.json").display()
    ))
}
