//! `deltaserve init-random`: write a randomly initialised checkpoint of any shape, in any
//! supported family's layout (fla's, or transformers' Qwen3.5, Qwen3.5-MoE, Qwen3-Next and
//! OLMo-Hybrid).

use std::path::PathBuf;

use clap::Args;
use deltaserve_engine::{parse_dtype, synth::write_random_checkpoint};

/// Write a randomly initialised checkpoint (for benchmarks and tests): fla's Gated DeltaNet,
/// Gated DeltaProduct and DeltaNet, with or without `attn` layers; Qwen3.5 and Qwen3.5-MoE (their
/// text layouts, `Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM`), Qwen3-Next or OLMo-Hybrid, each
/// in the names and shapes its library saves.
#[derive(Debug, Args)]
pub struct InitRandomArgs {
    /// A config.json (fla's or transformers' fields; unspecified fields take the library's
    /// defaults).
    #[arg(long)]
    config: PathBuf,
    /// Output directory.
    #[arg(short, long)]
    output: PathBuf,
    /// On-disk dtype: f32, bf16 or f16.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Copy tokenizer files from this checkpoint directory.
    #[arg(long)]
    tokenizer_from: Option<PathBuf>,
}

/// Runs the subcommand.
pub fn run(args: InitRandomArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.config).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.config.display()))?;
    let cfg: serde_json::Value = serde_json::from_str(&text)?;
    let c = write_random_checkpoint(&cfg, &args.output, parse_dtype(&args.dtype)?, args.seed, args.tokenizer_from.as_deref())?;
    super::print_line(&format!(
        "wrote {} ({}, {} layers, state {} bytes per sequence)",
        args.output.display(),
        c.model_type(),
        c.common.num_hidden_layers,
        c.state_bytes_per_sequence()
    ))
}
