//! deltaserve's engine: fla Gated DeltaNet / Gated DeltaProduct checkpoints → logits.
//!
//! [`Engine::load`] reads a checkpoint (`config.json`, safetensors, `tokenizer.json`).
//! Sequences live in the slots of a [`StatePool`]: [`Engine::prefill`] runs a prompt (or a
//! chunk of one) into a slot with the chunkwise algorithm, [`Engine::decode`] advances many
//! slots by one token each, and [`sampling`] turns logits into tokens. No HTTP, no async.

pub mod block_table;
pub mod cache;
pub mod config;
#[cfg(feature = "cuda")]
pub mod decode_graph;
pub mod error;
pub mod hub;
pub mod inventory;
pub mod kv_plan;
pub mod models;
pub mod prefill_graph;
mod ranks;
pub mod reference;
pub mod sampling;
pub mod state;
pub mod synth;
pub mod tensor_parallel;
pub mod tokenizer;
pub mod warmup;
pub mod weights;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use cache::CacheSpec;
pub use candle_core::{DType, Device, Tensor};
pub use config::ModelConfig;
pub use deltaserve_kernels::ops::PrefillAlgo;
pub use deltaserve_kernels::PREFILL_CHUNK;
pub use error::{ConfigError, EngineError, Result, WeightError};
pub use models::{CausalLm, Logits};
pub use sampling::{Draws, Sampled, Sampler, SamplingParams};
pub use state::{HostSnapId, SlotId, SnapId, SnapshotAt, StatePool};
pub use tokenizer::{IncrementalDecoder, Tokenizer};
pub use warmup::WarmUp;

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// A checkpoint directory or a Hugging Face repo id `org/name[@revision]`.
    pub model: String,
    /// Compute dtype of weights and activations.
    pub dtype: DType,
    /// Element type of the recurrent states in the pool: f32 (the reference's), or bf16 on a
    /// GPU ([`CausalLm::set_state_dtype`]).
    pub state_dtype: DType,
    /// Where to run.
    pub device: Device,
    /// Scan every tensor for NaN/inf at load.
    pub check_weights: bool,
    /// How prompts are prefilled: [`PrefillAlgo::Chunked`] (near-fp32 mixer matmuls) or
    /// [`PrefillAlgo::ChunkedBf16`] (fla's bf16 precision, faster on the GPU).
    pub prefill_algo: PrefillAlgo,
    /// Run GPU decode steps as CUDA graphs (one capture per batch size, then one launch a
    /// step, on every rank of a split model); no effect on the CPU.
    pub cuda_graphs: bool,
    /// With `cuda_graphs`, prefill passes of up to this many tokens in all (at most
    /// [`prefill_graph::MAX_SEQS`] sequences) are padded to a power-of-two bucket of at least
    /// 64 rows and run as CUDA graphs too, on models whose every layer allows it (Gated
    /// DeltaNet, Gated DeltaProduct or DeltaNet mixers, dense MLPs), unsplit. 0: off.
    pub prefill_graph_tokens: usize,
    /// With `cuda_graphs`, mixed passes (prompt pieces of up to this many tokens in all, at
    /// most [`prefill_graph::MAX_SEQS`] of them, beside up to [`prefill_graph::MAX_DECODE_ROWS`]
    /// running sequences' decode rows) are padded to a shape and run as CUDA graphs, on the
    /// same models as `prefill_graph_tokens`. 0: off.
    pub mixed_graph_tokens: usize,
    /// On the GPU, make a sequence's logits independent of its batch (bf16/f16 models; the CPU
    /// in f32 always is): sets the process-wide [`deltaserve_kernels::ops::set_batch_invariant`].
    pub batch_invariant: bool,
    /// Ranks to split the model over ([`tensor_parallel`]): on a GPU, `device` and the GPUs
    /// after it (NCCL, the `nccl` feature); on the CPU, threads of this process. 1: unsplit.
    pub tensor_parallel_size: usize,
    /// When split, how MoE layers are cut: whole experts a rank, or every expert's channels
    /// ([`tensor_parallel::ExpertSplit`]). No effect on dense models or unsplit.
    pub expert_split: tensor_parallel::ExpertSplit,
}

impl LoadOptions {
    /// f32 on the CPU, no weight scan, near-fp32 chunked prefill.
    pub fn cpu(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            dtype: DType::F32,
            state_dtype: DType::F32,
            device: Device::Cpu,
            check_weights: false,
            prefill_algo: PrefillAlgo::Chunked,
            cuda_graphs: true,
            prefill_graph_tokens: DEFAULT_PREFILL_GRAPH_TOKENS,
            mixed_graph_tokens: DEFAULT_MIXED_GRAPH_TOKENS,
            batch_invariant: false,
            tensor_parallel_size: 1,
            expert_split: tensor_parallel::ExpertSplit::Auto,
        }
    }
}

/// [`LoadOptions::prefill_graph_tokens`]'s default: a chat turn continued from the prefix
/// cache, or a short prompt, pads to 64–256 rows.
pub const DEFAULT_PREFILL_GRAPH_TOKENS: usize = 256;

/// [`LoadOptions::mixed_graph_tokens`]'s default: the server's default step budget
/// (`--max-num-batched-tokens`), so a prompt's pieces beside running streams replay.
pub const DEFAULT_MIXED_GRAPH_TOKENS: usize = 512;

/// A loaded model with its tokenizer.
#[derive(Debug)]
pub struct Engine {
    /// The model's tensor parallel ranks (one when unsplit); rank 0's logits are returned.
    ranks: ranks::Ranks,
    tokenizer: Arc<Tokenizer>,
    model_dir: PathBuf,
    prefill_algo: PrefillAlgo,
}

/// Parses a dtype name as given on the command line (`f32`, `bf16`, `f16`).
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" | "half" => Ok(DType::F16),
        other => Err(EngineError::Invalid { field: "dtype", expected: "f32, bf16 or f16".into(), actual: other.into() }),
    }
}

/// Parses a device name: `cpu`, `cuda` (GPU 0) or `cuda:N`. CUDA needs a build with the
/// `cuda` feature.
pub fn parse_device(s: &str) -> Result<Device> {
    let lower = s.to_ascii_lowercase();
    let ordinal = match lower.as_str() {
        "cpu" => return Ok(Device::Cpu),
        "cuda" | "gpu" => Some(0),
        other => other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()),
    };
    let Some(ordinal) = ordinal else {
        return Err(EngineError::Invalid { field: "device", expected: "cpu, cuda or cuda:N".into(), actual: s.into() });
    };
    if !cfg!(feature = "cuda") {
        return Err(EngineError::Invalid {
            field: "device",
            expected: "cpu (this binary was built without the `cuda` feature)".into(),
            actual: s.into(),
        });
    }
    // One stream of its own (candle's `new_cuda` takes the per-thread default stream): every
    // thread that works on this GPU (a tensor parallel rank's, the one that queues the ranks'
    // all-reduces, the engine's) must queue on the same stream, or their work is unordered.
    #[cfg(feature = "cuda")]
    let dev = candle_core::CudaDevice::new_with_stream(ordinal).map(Device::Cuda);
    #[cfg(not(feature = "cuda"))]
    let dev = Device::new_cuda(ordinal);
    let dev = dev.map_err(|e| EngineError::Invalid {
        field: "device",
        expected: format!("a usable CUDA device {ordinal}"),
        actual: e.to_string(),
    })?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = &dev {
        deltaserve_kernels::cuda::retain_freed_memory(d)?;
        // cudarc gives every allocation two CUDA events to order its use across streams; the
        // engine runs one stream a device, and creating and destroying them was 30% of a short
        // prefill pass's host time (5.2 against 3.6 ms for 64 tokens of the 1.39B model).
        // SAFETY: no other stream is created on this context, so there is nothing to order.
        unsafe { d.disable_event_tracking() };
    }
    Ok(dev)
}

/// Bytes of memory free on `device` now: the GPU's free memory, or the host's `MemAvailable`
/// (`None` where it cannot be read).
pub fn free_memory(device: &Device) -> Option<usize> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => deltaserve_kernels::cuda::free_memory(d).ok(),
        _ => {
            let text = std::fs::read_to_string("/proc/meminfo").ok()?;
            let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        }
    }
}

/// Has CUDA load each kernel module's kernels when the module loads, not at their first launch,
/// when a model is split over `tensor_parallel_size` > 1 GPUs and the user has not chosen
/// (`CUDA_MODULE_LOADING`). A lazy load waits for its GPU to go idle while it holds a lock the
/// other ranks' launches need; a GPU whose all-reduce waits for another rank's launch never goes
/// idle, so the ranks would hang. Call it before the first CUDA call, while the process has one
/// thread.
pub fn load_kernels_eagerly_for(tensor_parallel_size: usize) {
    if tensor_parallel_size > 1 && std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        std::env::set_var("CUDA_MODULE_LOADING", "EAGER");
    }
}

/// Reads and validates `DIR/config.json`.
pub fn read_config(dir: &Path) -> Result<ModelConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| EngineError::Io { path: path.clone(), message: e.to_string() })?;
    Ok(ModelConfig::from_json_str(&text)?)
}

impl Engine {
    /// Resolves, reads and checks a checkpoint, then builds the model.
    pub fn load(opts: &LoadOptions) -> Result<Self> {
        if opts.batch_invariant && opts.device.is_cuda() && opts.dtype == DType::F32 {
            return Err(EngineError::Invalid {
                field: "batch_invariant",
                expected: "a bf16 or f16 model on the GPU (the CPU is batch-invariant in f32 without it)".into(),
                actual: "f32 on the GPU".into(),
            });
        }
        deltaserve_kernels::ops::set_batch_invariant(opts.batch_invariant && opts.device.is_cuda());
        let dir = hub::resolve_model(&opts.model)?;
        let cfg = read_config(&dir)?;
        let ckpt = weights::Checkpoint::open(&dir)?;
        let (mut models, links) = match opts.tensor_parallel_size {
            0 => return Err(EngineError::Invalid { field: "tensor_parallel_size", expected: "at least 1".into(), actual: "0".into() }),
            1 => (vec![CausalLm::load(&cfg, &ckpt, opts.dtype, &opts.device, opts.check_weights)?], vec![None]),
            n => {
                let devices = rank_devices(&opts.device, n)?;
                let group = all_reduce_group(&devices)?;
                let ranks = devices
                    .into_iter()
                    .enumerate()
                    .map(|(r, d)| {
                        Ok((
                            tensor_parallel::GroupLink {
                                shard: tensor_parallel::Shard::new(r, n)?.with_experts(opts.expert_split),
                                group: group.clone(),
                            },
                            d,
                        ))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let models = CausalLm::load_ranks(&cfg, &ckpt, opts.dtype, &ranks, opts.check_weights)?;
                (models, ranks.into_iter().map(|(link, _)| Some(link)).collect())
            }
        };
        for m in &mut models {
            m.set_state_dtype(opts.state_dtype)?;
        }
        let tokenizer = Tokenizer::from_dir(&dir, cfg.common.bos_token_id, &cfg.eos_token_ids())?;
        if tokenizer.vocab_size() > cfg.common.vocab_size {
            return Err(EngineError::Tokenizer(format!(
                "tokenizer.json has {} tokens but config.json `vocab_size` is {}",
                tokenizer.vocab_size(),
                cfg.common.vocab_size
            )));
        }
        tracing::info!(model = %dir.display(), model_type = cfg.model_type(), layers = cfg.common.num_hidden_layers, dtype = ?opts.dtype, state_dtype = ?opts.state_dtype, prefill = ?opts.prefill_algo, tensor_parallel = opts.tensor_parallel_size, "model loaded");
        Ok(Self {
            ranks: ranks::Ranks::new(
                models
                    .into_iter()
                    .zip(links)
                    .map(|(m, link)| ranks::Rank::new(m, opts.cuda_graphs, (opts.prefill_graph_tokens, opts.mixed_graph_tokens), link))
                    .collect(),
            )?,
            tokenizer: Arc::new(tokenizer),
            model_dir: dir,
            prefill_algo: opts.prefill_algo,
        })
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        self.model().config()
    }

    /// The model (rank 0's slice of it when split over tensor parallel ranks).
    pub fn model(&self) -> &CausalLm {
        &self.ranks[0].model
    }

    /// Tensor parallel ranks the model is split over (1: unsplit).
    pub fn tensor_parallel_size(&self) -> usize {
        self.ranks.len()
    }

    /// Bytes free now on the fullest of the ranks' devices (see [`free_memory`]): what a pool
    /// of equal per-rank buffers may take.
    pub fn free_memory(&self) -> Option<usize> {
        self.ranks.iter().map(|r| free_memory(r.model.device())).min().flatten()
    }

    /// Waits until every rank's device has run all the work queued on it.
    pub fn synchronize(&self) -> Result<()> {
        for r in self.ranks.iter() {
            r.model.device().synchronize()?;
        }
        Ok(())
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// A shared handle on the tokenizer (for threads other than the engine's).
    pub fn tokenizer_arc(&self) -> Arc<Tokenizer> {
        self.tokenizer.clone()
    }

    /// The resolved checkpoint directory.
    pub fn model_dir(&self) -> &Path {
        &self.model_dir
    }

    /// A state pool of `slots` sequences for this model (hybrids: KV blocks for
    /// `max_position_embeddings` tokens each).
    pub fn new_pool(&self, slots: usize) -> Result<StatePool> {
        self.new_pool_sized(state::PoolSize::for_tokens(slots, self.config().common.max_position_embeddings))
    }

    /// A state pool of the given size (with a replica on every other tensor parallel rank's
    /// device, holding that rank's slices of the states).
    pub fn new_pool_sized(&self, size: state::PoolSize) -> Result<StatePool> {
        let mut pool = self.model().new_pool_sized(size)?;
        for r in &self.ranks[1..] {
            pool.add_replica(r.model.new_pool_sized(size)?);
        }
        Ok(pool)
    }

    /// Chunked prefill of `tokens` into `slot` (continuing from its state), at the precision
    /// the engine was loaded with.
    pub fn prefill(&self, pool: &mut StatePool, slot: SlotId, tokens: &[u32], logits: Logits) -> Result<Tensor> {
        self.ranks.run(pool, |r, pool| r.model.prefill(pool, slot, tokens, logits, self.prefill_algo))
    }

    /// Prefills several sequences together (see [`CausalLm::prefill_many`]); returns the f32
    /// logits after each one's last token, `[S, vocab]`.
    pub fn prefill_many(&self, pool: &mut StatePool, batch: &[(SlotId, &[u32])]) -> Result<Tensor> {
        self.prefill_many_with(pool, batch, &[])
    }

    /// [`Self::prefill_many`], also writing `snapshots` on the way (see
    /// [`CausalLm::prefill_many_with`]).
    pub fn prefill_many_with(&self, pool: &mut StatePool, batch: &[(SlotId, &[u32])], snapshots: &[SnapshotAt]) -> Result<Tensor> {
        self.ranks.run(pool, |r, pool| r.prefill_many(pool, batch, self.prefill_algo, snapshots))
    }

    /// [`Self::prefill_many_with`] and a decode step of `step` in one pass (see
    /// [`CausalLm::prefill_and_decode`]): `[S + B, vocab]` f32 logits, the prompts' rows then
    /// the decode rows. With `step` empty it is [`Self::prefill_many_with`]; on a GPU with
    /// mixed graphs on, a pass that fits one replays a CUDA graph.
    pub fn prefill_and_decode(
        &self,
        pool: &mut StatePool,
        batch: &[(SlotId, &[u32])],
        snapshots: &[SnapshotAt],
        step: &[(SlotId, u32)],
    ) -> Result<Tensor> {
        if step.is_empty() {
            return self.prefill_many_with(pool, batch, snapshots);
        }
        self.ranks.run(pool, |r, pool| r.prefill_and_decode(pool, batch, self.prefill_algo, snapshots, step))
    }

    /// [`Self::prefill_many_with`] run eagerly, never from a CUDA graph.
    pub(crate) fn prefill_eager(&self, pool: &mut StatePool, batch: &[(SlotId, &[u32])], snapshots: &[SnapshotAt]) -> Result<Tensor> {
        self.ranks.run(pool, |r, pool| r.model.prefill_many_with(pool, batch, self.prefill_algo, snapshots))
    }

    /// The row buckets short prefill passes pad to, to run as CUDA graphs (empty when they
    /// do not).
    pub fn prefill_graph_buckets(&self) -> Vec<usize> {
        self.ranks[0].prefill_graph_buckets()
    }

    /// The prompt row buckets of mixed passes run as CUDA graphs (empty when they are not).
    pub fn mixed_graph_buckets(&self) -> Vec<usize> {
        self.ranks[0].mixed_graph_buckets()
    }

    /// The prefill and mixed pass shapes (padded rows, sequences, padded decode rows) with a
    /// captured CUDA graph.
    pub fn prefill_graph_shapes(&self) -> Vec<prefill_graph::Shape> {
        self.ranks[0].prefill_graph_shapes()
    }

    /// One batched decode step; returns `[B, vocab]` f32 logits.
    /// On a GPU with CUDA graphs on (the default) each batch size is captured once and replayed
    /// after that; otherwise the step runs eagerly.
    pub fn decode(&self, pool: &mut StatePool, batch: &[(SlotId, u32)]) -> Result<Tensor> {
        self.decode_as(pool, batch, LogitsOut::Copied)
    }

    /// [`Self::decode`], but a replayed CUDA graph's logits are its own output buffer, not a copy
    /// (`DecodeGraphs::decode_in_place` in `decode_graph`): valid until the next decode step of the
    /// same batch size, so whatever reads them must be queued on the device before that step.
    pub fn decode_in_place(&self, pool: &mut StatePool, batch: &[(SlotId, u32)]) -> Result<Tensor> {
        self.decode_as(pool, batch, LogitsOut::Lent)
    }

    fn decode_as(&self, pool: &mut StatePool, batch: &[(SlotId, u32)], out: LogitsOut) -> Result<Tensor> {
        let step = |pool: &mut StatePool| self.ranks.run(pool, |r, pool| r.decode(pool, batch, out));
        if self.ranks.len() == 1 {
            // Unsplit, a failed capture falls back to an eager step in place.
            return step(pool);
        }
        let b = batch.len();
        let failed_before = self.ranks[0].capture_failed(b);
        let out = step(pool);
        // A split model's failed capture fails the pass on every rank, having run nothing:
        // the step runs again, eagerly on every rank now.
        if out.is_err() && !failed_before && self.ranks.iter().all(|r| r.capture_failed(b)) {
            return step(pool);
        }
        out
    }

    /// The batch sizes with a captured decode graph (empty without graphs).
    pub fn cuda_graph_batches(&self) -> Vec<usize> {
        self.ranks[0].graph_batches()
    }

    /// Each captured decode graph's kernel nodes and programmatic edges (launches that overlap
    /// the kernel before them; empty without graphs).
    pub fn cuda_graph_overlap(&self) -> Vec<GraphOverlap> {
        self.ranks[0].graph_overlap()
    }

    /// Encodes a prompt with the checkpoint's BOS convention.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text, true)
    }
}

/// A captured decode graph, as [`Engine::cuda_graph_overlap`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphOverlap {
    /// Its batch size.
    pub batch: usize,
    /// Kernel nodes.
    pub kernels: usize,
    /// Edges into a kernel that starts while the one before it finishes.
    pub programmatic: usize,
    /// Why it was not rebuilt with programmatic edges, if it was not.
    pub note: Option<String>,
}

/// The devices of `n` tensor parallel ranks starting at `first`: the GPUs `cuda:k..k+n`, or
/// the CPU `n` times.
fn rank_devices(first: &Device, n: usize) -> Result<Vec<Device>> {
    match first {
        Device::Cpu => Ok(vec![Device::Cpu; n]),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let k = d.cuda_stream().context().ordinal();
            let mut devices = vec![first.clone()];
            for i in k + 1..k + n {
                devices.push(parse_device(&format!("cuda:{i}")).map_err(|e| EngineError::Invalid {
                    field: "tensor_parallel_size",
                    expected: format!("{n} GPUs from cuda:{k} on"),
                    actual: format!("cuda:{i} is not usable: {e}"),
                })?);
            }
            Ok(devices)
        }
        other => Err(EngineError::Invalid { field: "device", expected: "cpu or cuda".into(), actual: format!("{other:?}") }),
    }
}

/// The all-reduce for ranks on `devices`: threads adding CPU tensors, or NCCL over GPUs.
fn all_reduce_group(devices: &[Device]) -> Result<Arc<dyn tensor_parallel::AllReduce>> {
    if devices.iter().all(Device::is_cpu) {
        return Ok(tensor_parallel::ThreadGroup::new(devices.len()));
    }
    #[cfg(feature = "nccl")]
    {
        Ok(tensor_parallel::NcclGroup::new(devices)?)
    }
    #[cfg(not(feature = "nccl"))]
    Err(EngineError::Invalid {
        field: "tensor_parallel_size",
        expected: "1 on GPUs (this binary was built without the `nccl` feature)".into(),
        actual: devices.len().to_string(),
    })
}

/// How a decode step replayed from a CUDA graph hands back the logits in the graph's fixed
/// buffer (an eager step's are always the caller's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogitsOut {
    /// A copy, owned by the caller.
    Copied,
    /// The buffer itself, valid until the next decode step of its batch size.
    Lent,
}

impl LogitsOut {
    /// `logits` (a graph's buffer) as this says; copied whatever it says under
    /// `DELTASERVE_DECODE_COPY=1` (for comparisons).
    #[cfg(feature = "cuda")]
    pub(crate) fn hand_out(self, logits: &Tensor) -> Result<Tensor> {
        static COPY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let copy = *COPY.get_or_init(|| std::env::var("DELTASERVE_DECODE_COPY").is_ok_and(|v| v == "1"));
        Ok(match self {
            Self::Lent if !copy => logits.clone(),
            _ => logits.copy()?,
        })
    }
}
