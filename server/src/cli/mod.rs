//! Subcommands other than `serve`, and the options they share.

pub mod eval;
pub mod generate;
pub mod init_random;
pub mod prune;
pub mod serve;

use std::path::PathBuf;

use clap::Args;
use deltaserve_engine::{parse_device, parse_dtype, Engine, LoadOptions, PrefillAlgo};

/// Writes `text` to `out` and flushes it; `Ok(false)` when the reader went away (a closed pipe,
/// `deltaserve ... | head`), which ends the output quietly: neither an error nor a panic.
pub fn write_out(out: &mut impl std::io::Write, text: &str) -> std::io::Result<bool> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        r => r.map(|()| true),
    }
}

/// Writes `line` and a newline to stdout, quietly doing nothing more once stdout is closed.
pub fn print_line(line: &str) -> anyhow::Result<()> {
    write_out(&mut std::io::stdout().lock(), &format!("{line}\n"))?;
    Ok(())
}

/// Where the demo model lives when `--model` is not given, in order of preference.
pub fn default_model() -> String {
    let candidates = [
        std::env::current_exe().ok().and_then(|e| e.parent().map(|p| p.join("../../models/gdn-demo"))),
        Some(PathBuf::from("models/gdn-demo")),
        Some(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/gdn-demo"))),
        Some(PathBuf::from("/opt/deltaserve/models/gdn-demo")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.join("config.json").exists())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "models/gdn-demo".into())
}

/// Options that pick and load a model.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Checkpoint directory or Hugging Face repo id `org/name[@revision]` (default: the bundled demo model).
    #[arg(long, env = "DELTASERVE_MODEL")]
    pub model: Option<String>,
    /// Compute dtype: f32, bf16 or f16.
    #[arg(long, env = "DELTASERVE_DTYPE", default_value = "f32")]
    pub dtype: String,
    /// Element type of the recurrent states in the pool: f32 (the reference's precision), or
    /// bf16 on a GPU: half the state memory (twice the sequences in the same budget) and half
    /// the state bytes a decode step moves, each state rounded to bf16 after every token (vLLM's
    /// and SGLang's `--mamba-ssm-cache-dtype bfloat16`; accuracy in docs/gpu.md).
    #[arg(long, env = "DELTASERVE_STATE_DTYPE", default_value = "f32")]
    pub state_dtype: String,
    /// Device: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, env = "DELTASERVE_DEVICE", default_value = "cpu")]
    pub device: String,
    /// Scan all weights for NaN/inf while loading.
    #[arg(long, env = "DELTASERVE_CHECK_WEIGHTS")]
    pub check_weights: bool,
    /// Matmul precision of the chunked prefill's mixer: fp32 (near-fp32, bf16 hi + lo operands on
    /// the GPU) or bf16 (q, k, v rounded to bf16: fla's precision, about 5x faster on the GPU).
    /// `auto`: bf16 for bf16/f16 models (as fla computes them), fp32 for f32 ones.
    #[arg(long, env = "DELTASERVE_MIXER_PRECISION", value_enum, default_value_t = MixerPrecision::Auto)]
    pub mixer_precision: MixerPrecision,
    /// Run GPU decode steps, and the prefill and mixed passes that would replay graphs, eagerly
    /// instead of as CUDA graphs (one capture per shape, then one launch a pass). For debugging
    /// and comparison; no effect on the CPU.
    #[arg(long, env = "DELTASERVE_NO_CUDA_GRAPHS")]
    pub no_cuda_graphs: bool,
    /// With CUDA graphs, prefill passes of up to this many tokens (at most 8 sequences) are
    /// padded to 64, 128, 256, 512 rows, then multiples of 128, and replayed from a graph per shape, captured at
    /// start-up: a short pass (a chat turn continued from the prefix cache) costs its GPU time,
    /// not ~300 launches. Every model (a hybrid's KV blocks for the pass, its padding's
    /// included, are taken before the replay), unsplit; 0 turns it off.
    #[arg(long, env = "DELTASERVE_PREFILL_GRAPH_TOKENS", default_value_t = deltaserve_engine::DEFAULT_PREFILL_GRAPH_TOKENS)]
    pub prefill_graph_tokens: usize,
    /// With CUDA graphs, mixed passes (prompt pieces of up to this many tokens in all, at most
    /// 8 sequences, beside up to 256 running sequences' decode rows) are padded to 64, 128,
    /// 256, 512 prompt rows, then multiples of 128, and a decode bucket (1, 2, 4, 8, then multiples of 16) and replayed
    /// from a graph per shape, captured the second time a shape is seen: a prompt's piece beside
    /// running streams costs its GPU time, not ~700 launches. Same models as
    /// `--prefill-graph-tokens`; 0 turns it off. Default: `serve`'s step budget
    /// (`--max-num-batched-tokens`) up to 1024, so its passes replay; 512 elsewhere.
    #[arg(long, env = "DELTASERVE_MIXED_GRAPH_TOKENS")]
    pub mixed_graph_tokens: Option<usize>,
    /// On the GPU, make every sequence's logits the same bits whatever else is in its batch
    /// (so a seed gives the same text under any load), at a cost in speed (docs/performance.md);
    /// bf16/f16 models. The CPU in f32 is batch-invariant without it.
    #[arg(long, env = "DELTASERVE_BATCH_INVARIANT")]
    pub batch_invariant: bool,
    /// Split the model over N GPUs (tensor parallelism, NCCL; a build with `--features nccl`):
    /// `--device cuda:K` and the N-1 GPUs after it, one engine thread each, in lockstep. Each
    /// GPU holds 1/N of every layer's heads and its own states. On the CPU, N threads (for
    /// testing).
    #[arg(long, visible_alias = "tp", env = "DELTASERVE_TENSOR_PARALLEL_SIZE", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub tensor_parallel_size: u16,
    /// With `--tensor-parallel-size N`, how MoE layers are split: `on` gives each GPU E/N whole
    /// experts (vLLM's `--enable-expert-parallel`), `off` every expert's 1/N of its channels,
    /// `auto` whole experts where N divides them (measured as fast or faster).
    #[arg(long, value_enum, env = "DELTASERVE_EXPERT_PARALLEL", default_value_t = ExpertParallel::Auto)]
    pub expert_parallel: ExpertParallel,
}

/// `--expert-parallel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExpertParallel {
    /// Whole experts where the GPUs divide them, channels otherwise.
    Auto,
    /// Whole experts a GPU.
    On,
    /// Every expert's channels cut.
    Off,
}

impl From<ExpertParallel> for deltaserve_engine::tensor_parallel::ExpertSplit {
    fn from(e: ExpertParallel) -> Self {
        match e {
            ExpertParallel::Auto => Self::Auto,
            ExpertParallel::On => Self::Experts,
            ExpertParallel::Off => Self::Channels,
        }
    }
}

/// `--mixer-precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MixerPrecision {
    /// bf16 for bf16/f16 compute dtypes, fp32 for f32.
    Auto,
    /// Near-fp32 matmuls.
    Fp32,
    /// Single bf16 operands, as fla computes bf16 models.
    Bf16,
}

/// The prefill algorithm `--mixer-precision` picks for compute dtype `dtype`.
pub fn prefill_algo(p: MixerPrecision, dtype: deltaserve_engine::DType) -> PrefillAlgo {
    match (p, dtype) {
        (MixerPrecision::Fp32, _) => PrefillAlgo::Chunked,
        (MixerPrecision::Bf16, _) => PrefillAlgo::ChunkedBf16,
        (MixerPrecision::Auto, deltaserve_engine::DType::BF16 | deltaserve_engine::DType::F16) => PrefillAlgo::ChunkedBf16,
        (MixerPrecision::Auto, _) => PrefillAlgo::Chunked,
    }
}

/// `--state-dtype`: f32 or bf16 (the element types the state kernels take).
fn parse_state_dtype(s: &str) -> anyhow::Result<deltaserve_engine::DType> {
    match parse_dtype(s)? {
        d @ (deltaserve_engine::DType::F32 | deltaserve_engine::DType::BF16) => Ok(d),
        _ => anyhow::bail!("invalid `--state-dtype`: expected f32 or bf16, got {s}"),
    }
}

impl ModelArgs {
    /// Loads the engine these options describe.
    pub fn load(&self) -> anyhow::Result<Engine> {
        let device = parse_device(&self.device)?;
        let dtype = parse_dtype(&self.dtype)?;
        let opts = LoadOptions {
            model: self.model.clone().unwrap_or_else(default_model),
            dtype,
            state_dtype: parse_state_dtype(&self.state_dtype)?,
            device,
            check_weights: self.check_weights,
            prefill_algo: prefill_algo(self.mixer_precision, dtype),
            cuda_graphs: !self.no_cuda_graphs,
            prefill_graph_tokens: self.prefill_graph_tokens,
            mixed_graph_tokens: self.mixed_graph_tokens.unwrap_or(deltaserve_engine::DEFAULT_MIXED_GRAPH_TOKENS),
            batch_invariant: self.batch_invariant,
            tensor_parallel_size: self.tensor_parallel_size.into(),
            expert_split: self.expert_parallel.into(),
        };
        Ok(Engine::load(&opts)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltaserve_engine::DType;

    #[test]
    fn state_dtypes_are_f32_or_bf16() {
        assert_eq!(parse_state_dtype("bf16").unwrap(), DType::BF16);
        assert_eq!(parse_state_dtype("float32").unwrap(), DType::F32);
        assert_eq!(parse_state_dtype("f16").unwrap_err().to_string(), "invalid `--state-dtype`: expected f32 or bf16, got f16");
    }

    #[test]
    fn the_mixer_precision_follows_the_compute_dtype_unless_given() {
        assert_eq!(prefill_algo(MixerPrecision::Auto, DType::BF16), PrefillAlgo::ChunkedBf16);
        assert_eq!(prefill_algo(MixerPrecision::Auto, DType::F16), PrefillAlgo::ChunkedBf16);
        assert_eq!(prefill_algo(MixerPrecision::Auto, DType::F32), PrefillAlgo::Chunked);
        assert_eq!(prefill_algo(MixerPrecision::Fp32, DType::BF16), PrefillAlgo::Chunked);
        assert_eq!(prefill_algo(MixerPrecision::Bf16, DType::F32), PrefillAlgo::ChunkedBf16);
    }
}
