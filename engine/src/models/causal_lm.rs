//! The causal LM: embeddings, a stack of [`Block`]s, the final norm and `lm_head`
//! (model-spec.md §1.3). Each family's checkpoint names are mapped here (fla; transformers'
//! Qwen3.5 and OLMo-Hybrid, hybrid-spec.md §3.2, §5.2); the math lives in the layers.

use candle_core::{DType, Device, Tensor};
use candle_nn::Linear;
use deltaserve_kernels::ops::{self, PrefillAlgo};
use deltaserve_kernels::{Capture, StepSlots, PREFILL_CHUNK};

use super::batch::{Keep, Packed, Pass};
use super::block::{Block, ChannelMixer, TokenMixer};
use super::norm::{NormedInput, Residual, RmsNorm};
use crate::cache::CacheSpec;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::state::{DeviceKv, PoolSize, SlotId, SnapshotAt, StatePool};
use crate::tensor_parallel::GroupLink;

mod load;

/// Whether a pass's last block runs its output head and channel mixer for the logits' rows
/// only (`DELTASERVE_LAST_ROWS=0` runs them on every row, for comparison).
fn last_rows_cut() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*OFF.get_or_init(|| std::env::var("DELTASERVE_LAST_ROWS").is_ok_and(|v| v == "0"))
}

/// Which logits a prefill returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only after the last token: `[vocab]`.
    Last,
    /// At every position: `[T, vocab]` (perplexity, parity tests).
    All,
}

/// A mixed pass checked by [`CausalLm::check_mixed`].
pub(crate) struct CheckedPass {
    /// The prompt pieces' row offsets.
    pub(crate) cu: Vec<usize>,
    /// Each piece's slot.
    pub(crate) slots: Vec<usize>,
    /// Snapshots taken inside the pieces.
    pub(crate) captures: Vec<Capture>,
    /// The decode rows' tokens.
    pub(crate) step_tokens: Vec<u32>,
    /// The decode rows' slots.
    pub(crate) step_slots: Vec<usize>,
}

/// A Gated DeltaNet / Gated DeltaProduct / DeltaNet causal LM. Immutable; all state lives in a [`StatePool`].
#[derive(Debug, Clone)]
pub struct CausalLm {
    cfg: ModelConfig,
    /// `model.embeddings.weight` `[vocab, D]`.
    pub(crate) embeddings: Tensor,
    pub(crate) layers: Vec<Block>,
    pub(crate) norm: RmsNorm,
    /// `lm_head.weight` `[vocab, D]`, or the embeddings when tied.
    pub(crate) lm_head: Linear,
    dtype: DType,
    device: Device,
    /// The recurrent states' element type in this model's pools.
    state_dtype: DType,
}

impl CausalLm {
    /// One tensor parallel rank's copy of this model (`link.shard` of its group): every block
    /// split as [`Block::shard`] says, embeddings, norms and the LM head copied. Its pool
    /// ([`Self::new_pool`]) holds only this rank's states; every rank of the group must run the
    /// same passes in the same order, and each returns the whole logits.
    pub fn shard(&self, link: &GroupLink) -> Result<Self> {
        let layers = self.layers.iter().map(|b| b.shard(link.clone())).collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, ..self.clone() })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Compute dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The router's experts this model's MoE layers hold (all of them unless split by whole
    /// experts), or `None` for a dense model.
    pub fn experts_held(&self) -> Option<std::ops::Range<usize>> {
        self.layers.iter().find_map(|b| match &b.mlp {
            ChannelMixer::Moe(m) => Some(m.experts_held()),
            ChannelMixer::Mlp(_) => None,
        })
    }

    /// What one sequence keeps in each layer's cache, in layer order (the pool is built from it).
    pub fn cache_specs(&self) -> Vec<CacheSpec> {
        let with_state_dtype = |spec| match spec {
            CacheSpec::Recurrent { conv_state, recurrent_state, .. } => {
                CacheSpec::Recurrent { conv_state, recurrent_state, state_dtype: self.state_dtype }
            }
            other => other,
        };
        self.layers.iter().map(|b| with_state_dtype(b.attn.cache())).collect()
    }

    /// Keeps the recurrent states of this model's pools as `dtype`: f32, or bf16 on a GPU
    /// (half the memory and the bytes a decode step moves; each state stored rounded to bf16
    /// after every token). Checked here, not when a pool is made.
    pub fn set_state_dtype(&mut self, dtype: DType) -> Result<()> {
        let fits = dtype == DType::F32 || (dtype == DType::BF16 && self.device.is_cuda());
        if !fits {
            let on = if self.device.is_cuda() { "the GPU" } else { "the CPU" };
            return Err(EngineError::Invalid {
                field: "state_dtype",
                expected: "f32, or bf16 on a GPU".into(),
                actual: format!("{dtype:?} on {on}"),
            });
        }
        self.state_dtype = dtype;
        Ok(())
    }

    /// The recurrent states' element type in this model's pools.
    pub fn state_dtype(&self) -> DType {
        self.state_dtype
    }

    /// A state pool of `slots` sequences for this model, on its device; hybrids get KV blocks
    /// for `max_position_embeddings` tokens per slot.
    pub fn new_pool(&self, slots: usize) -> Result<StatePool> {
        self.new_pool_sized(PoolSize::for_tokens(slots, self.cfg.common.max_position_embeddings))
    }

    /// A state pool of the given size, on this model's device.
    pub fn new_pool_sized(&self, size: PoolSize) -> Result<StatePool> {
        StatePool::new_on(&self.cache_specs(), size, &self.device)
    }

    /// Errors unless every token id is below `vocab_size`.
    pub(crate) fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.cfg.common.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::Invalid { field: "token id", expected: format!("< vocab_size ({vocab})"), actual: bad.to_string() });
        }
        Ok(())
    }

    /// The fp32 embeddings of `tokens` `[N]`.
    pub(crate) fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        self.embed_ids(&Tensor::new(tokens, &self.device)?)
    }

    /// The fp32 embeddings of token ids `[N]` already on the device.
    fn embed_ids(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(ops::embedding_f32(&self.embeddings, ids)?)
    }

    /// The final norm and the LM head: f32 logits.
    fn head(&self, res: &Residual) -> Result<Tensor> {
        NormedInput::new(res, &self.norm, self.dtype).project_f32(&self.lm_head)
    }

    /// The blocks over the fp32 embeddings `h`: the residual stream after the last block at its
    /// `keep` rows. Every row updates the caches; only the last block's output head and channel
    /// mixer are cut to the kept rows (`DELTASERVE_LAST_ROWS=0`: they run on every row, and the
    /// rows are picked after).
    fn blocks(&self, h: Tensor, pool: &mut StatePool, pass: &Pass<'_>, keep: Keep<'_>) -> Result<Residual> {
        if pool.num_layers() != self.layers.len() {
            return Err(EngineError::Invalid {
                field: "pool",
                expected: format!("a pool of {} layers (from this model's `cache_specs`)", self.layers.len()),
                actual: format!("{} layers", pool.num_layers()),
            });
        }
        let (slots, lens): (Vec<usize>, Vec<usize>) = match pass {
            Pass::Prefill { seqs, .. } => (seqs.slots.to_vec(), seqs.cu.windows(2).map(|w| w[1] - w[0]).collect()),
            Pass::Decode { slots, .. } => (slots.host.to_vec(), vec![1; slots.host.len()]),
            Pass::Mixed { seqs, slots, .. } => (
                [seqs.slots, slots.host].concat(),
                seqs.cu.windows(2).map(|w| w[1] - w[0]).chain(std::iter::repeat_n(1, slots.host.len())).collect(),
            ),
        };
        let mut kv = pool.plan(&slots, &lens)?;
        if let Some(tables) = pool.device_tables() {
            let fixed = match pass {
                Pass::Prefill { seqs, .. } | Pass::Mixed { seqs, .. } => seqs.kv,
                Pass::Decode { .. } => None,
            };
            kv.device = Some(match (fixed, pass) {
                (Some(f), _) => f.device_kv(tables)?,
                (None, Pass::Decode { slots: StepSlots { device: Some(s), .. }, positions: Some(p) }) => {
                    DeviceKv::new(tables, (*s).clone(), (*p).clone())
                }
                (None, _) => {
                    // One upload for both index lists.
                    let (s, p) = kv.rows();
                    let n = s.len();
                    let both = Tensor::from_vec([s, p].concat(), (2, n), &self.device)?;
                    DeviceKv::new(tables, both.get(0)?, both.get(1)?)
                }
            });
        }
        let mut res = Residual { h, delta: None };
        // At trace level: the host time to launch each layer (a slow layer points at an
        // allocation or a synchronisation, uniformly slow layers at the launches themselves).
        let timed = tracing::enabled!(tracing::Level::TRACE);
        let mut host_us = Vec::with_capacity(if timed { self.layers.len() } else { 0 });
        let (last_keep, after) = if last_rows_cut() { (keep, Keep::All) } else { (Keep::All, keep) };
        for (i, b) in self.layers.iter().enumerate() {
            let t0 = timed.then(std::time::Instant::now);
            let keep = if i + 1 == self.layers.len() { last_keep } else { Keep::All };
            res = b.forward(&res, self.dtype, pool.layer_mut(b.layer_idx), pass, &kv, keep)?;
            if let Some(t0) = t0 {
                host_us.push(t0.elapsed().as_micros() as u64);
            }
        }
        if timed {
            tracing::trace!(total_us = host_us.iter().sum::<u64>(), layers_us = ?host_us, "host time launching the layers");
        }
        pool.advance(&slots, &lens);
        match after {
            Keep::All => Ok(res),
            Keep::Rows(r) => res.rows(|t| t.index_select(r, 0)),
        }
    }

    /// Runs `tokens` through the model from `slot`'s current state (empty or an earlier
    /// prefill) and leaves the state after the last token there. Returns f32 logits.
    pub fn prefill(&self, pool: &mut StatePool, slot: SlotId, tokens: &[u32], logits: Logits, algo: PrefillAlgo) -> Result<Tensor> {
        pool.check(slot)?;
        if tokens.is_empty() {
            return Err(EngineError::Invalid { field: "tokens", expected: "at least one token".into(), actual: "0 tokens".into() });
        }
        self.check_tokens(tokens)?;
        let _span = tracing::debug_span!("prefill", %slot, tokens = tokens.len()).entered();
        let (cu, slots) = ([0, tokens.len()], [slot.index()]);
        let pass = Pass::Prefill { seqs: Packed { cu: &cu, slots: &slots, captures: &[], tables: None, kv: None }, algo };
        let h = self.embed(tokens)?;
        match logits {
            Logits::All => self.head(&self.blocks(h, pool, &pass, Keep::All)?),
            Logits::Last => {
                let last = Tensor::new(&[tokens.len() as u32 - 1], &self.device)?;
                Ok(self.head(&self.blocks(h, pool, &pass, Keep::Rows(&last))?)?.squeeze(0)?)
            }
        }
    }

    /// Prefills several sequences in one pass: `batch[s]` runs its tokens from its slot's
    /// current state, as [`Self::prefill`] would alone, but every layer's projections and
    /// kernels see all of them at once (one varlen launch on a GPU). Returns the f32 logits
    /// after each sequence's last token, `[S, vocab]`.
    pub fn prefill_many(&self, pool: &mut StatePool, batch: &[(SlotId, &[u32])], algo: PrefillAlgo) -> Result<Tensor> {
        self.prefill_many_with(pool, batch, algo, &[])
    }

    /// [`Self::prefill_many`] that also writes `snapshots`: each receives its sequence's caches
    /// after its first `tokens` tokens of the pass (recurrent states copied at that chunk
    /// boundary, KV blocks shared), as a pass that stopped there would have left them.
    pub fn prefill_many_with(
        &self,
        pool: &mut StatePool,
        batch: &[(SlotId, &[u32])],
        algo: PrefillAlgo,
        snapshots: &[SnapshotAt],
    ) -> Result<Tensor> {
        self.prefill_and_decode(pool, batch, algo, snapshots, &[])
    }

    /// [`Self::prefill_many_with`] and a decode step of `step` (as [`Self::decode`]) in one pass:
    /// the prompts' rows first, then one row per `(slot, token)` of `step`, each layer's
    /// projections reading their weights once for all of them. A slot is in `batch` or in
    /// `step`, not both. Returns `[S + B, vocab]` f32: the logits after each prompt piece's last
    /// token, then each decode row's.
    pub fn prefill_and_decode(
        &self,
        pool: &mut StatePool,
        batch: &[(SlotId, &[u32])],
        algo: PrefillAlgo,
        snapshots: &[SnapshotAt],
        step: &[(SlotId, u32)],
    ) -> Result<Tensor> {
        let CheckedPass { cu, slots, captures, step_tokens, step_slots } = self.check_mixed(pool, batch, snapshots, step)?;
        let prompt_rows = cu[cu.len() - 1];
        let _span = tracing::debug_span!("prefill_many", seqs = batch.len(), tokens = prompt_rows, decode = step.len()).entered();
        let starts: Vec<usize> = batch.iter().map(|(slot, _)| pool.seen(*slot)).collect();
        let all: Vec<u32> = batch.iter().flat_map(|(_, t)| t.iter().copied()).chain(step_tokens).collect();
        let seqs = Packed { cu: &cu, slots: &slots, captures: &captures, tables: None, kv: None };
        let pass = match step.is_empty() {
            true => Pass::Prefill { seqs, algo },
            false => Pass::Mixed { seqs, algo, slots: StepSlots::from(&step_slots) },
        };
        let rows: Vec<u32> = cu[1..].iter().map(|&c| c - 1).chain(prompt_rows..prompt_rows + step.len()).map(|r| r as u32).collect();
        let rows = Tensor::new(rows.as_slice(), &self.device)?;
        let res = self.blocks(self.embed(&all)?, pool, &pass, Keep::Rows(&rows))?;
        for s in snapshots {
            pool.seal(s.snap, slots[s.seq], starts[s.seq] + s.tokens);
        }
        self.head(&res)
    }

    /// Checks a mixed pass: the packed prefill (as [`Self::check_prefill`]), the decode rows
    /// (as [`Self::check_decode`], none allowed) and that no slot is in both.
    pub(crate) fn check_mixed(
        &self,
        pool: &StatePool,
        batch: &[(SlotId, &[u32])],
        snapshots: &[SnapshotAt],
        step: &[(SlotId, u32)],
    ) -> Result<CheckedPass> {
        let (cu, slots, captures) = self.check_prefill(pool, batch, snapshots)?;
        let (step_tokens, step_slots) = if step.is_empty() { Default::default() } else { self.check_decode(pool, step)? };
        if let Some(s) = step_slots.iter().find(|s| slots.contains(s)) {
            return Err(EngineError::Invalid {
                field: "batch",
                expected: "each slot in the prefill or in the decode step, not both".into(),
                actual: format!("slot {s} in both"),
            });
        }
        Ok(CheckedPass { cu, slots, captures, step_tokens, step_slots })
    }

    /// Checks a packed prefill (sequences with tokens, in distinct allocated slots, snapshots
    /// taken and on chunk boundaries); returns its row offsets, slots and captures.
    pub(crate) fn check_prefill(
        &self,
        pool: &StatePool,
        batch: &[(SlotId, &[u32])],
        snapshots: &[SnapshotAt],
    ) -> Result<(Vec<usize>, Vec<usize>, Vec<Capture>)> {
        if batch.is_empty() || batch.iter().any(|(_, t)| t.is_empty()) {
            return Err(EngineError::Invalid {
                field: "batch",
                expected: "at least one sequence, each with at least one token".into(),
                actual: format!("{} sequences, token counts {:?}", batch.len(), batch.iter().map(|(_, t)| t.len()).collect::<Vec<_>>()),
            });
        }
        let mut slots = Vec::with_capacity(batch.len());
        let mut cu = vec![0];
        for (slot, tokens) in batch {
            pool.check(*slot)?;
            self.check_tokens(tokens)?;
            if slots.contains(&slot.index()) {
                return Err(EngineError::Invalid { field: "batch", expected: "distinct slots".into(), actual: format!("{slot} twice") });
            }
            slots.push(slot.index());
            cu.push(cu[cu.len() - 1] + tokens.len());
        }
        let _span = tracing::debug_span!("prefill_many", seqs = batch.len(), tokens = cu[cu.len() - 1]).entered();
        let mut captures = Vec::with_capacity(snapshots.len());
        for s in snapshots {
            pool.check_snapshot(s.snap)?;
            let len = batch.get(s.seq).map(|(_, t)| t.len());
            if !matches!(len, Some(len) if s.tokens > 0 && s.tokens <= len && s.tokens.is_multiple_of(PREFILL_CHUNK)) {
                return Err(EngineError::Invalid {
                    field: "snapshots",
                    expected: format!("a positive multiple of {PREFILL_CHUNK} tokens within sequence {}'s {len:?}", s.seq),
                    actual: s.tokens.to_string(),
                });
            }
            captures.push(Capture { seq: s.seq, tokens: s.tokens, slot: s.snap.index() });
        }
        Ok((cu, slots, captures))
    }

    /// Whether this model's prefill passes can read their tables from a fixed
    /// [`deltaserve_kernels::PackedTables`] buffer (and its attention layers their rows and tile
    /// lists from a [`crate::kv_plan::FixedKv`]), and so be captured as CUDA graphs: on a GPU,
    /// every model (the MoE blocks route on the device, their grids sized by capacities, as in
    /// a decode step's graph).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn prefill_tables_supported(&self) -> bool {
        self.device.is_cuda()
    }

    /// One shape of each distinct tile key among the attention layers (none for a pure
    /// delta-rule stack): the tile lists a captured pass fills.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn attention_shapes(&self) -> Vec<ops::AttentionShape> {
        let mut shapes: Vec<ops::AttentionShape> = Vec::new();
        for b in &self.layers {
            if let TokenMixer::Attention(a) = &b.attn {
                let s = a.shape(self.dtype);
                if !shapes.iter().any(|t| t.tile_key() == s.tile_key()) {
                    shapes.push(s);
                }
            }
        }
        shapes
    }

    /// The prefill (or, with `step`, mixed) forward of a packing that covers every row of its
    /// fixed `seqs.tables` (padding included, as a sequence of its own): token ids
    /// `[rows + B]` (the decode rows' after the prompt rows), the decode rows' slots with their
    /// device copy, and the rows whose logits to return, `last` `[S + B]` u32, all on the
    /// device. Uploads nothing, so it can be captured. Every slot of `seqs` and `step`
    /// advances; snapshots are the caller's to seal.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn prefill_fixed(
        &self,
        pool: &mut StatePool,
        ids: &Tensor,
        seqs: Packed<'_>,
        algo: PrefillAlgo,
        step: Option<StepSlots<'_>>,
        last: &Tensor,
    ) -> Result<Tensor> {
        let pass = match step {
            None => Pass::Prefill { seqs, algo },
            Some(slots) => Pass::Mixed { seqs, algo, slots },
        };
        let res = self.blocks(self.embed_ids(ids)?, pool, &pass, Keep::Rows(last))?;
        self.head(&res)
    }

    /// Checks a decode batch (non-empty, allocated and distinct slots, ids in the vocabulary);
    /// returns its tokens and slot indices.
    pub(crate) fn check_decode(&self, pool: &StatePool, batch: &[(SlotId, u32)]) -> Result<(Vec<u32>, Vec<usize>)> {
        if batch.is_empty() {
            return Err(EngineError::Invalid { field: "batch", expected: "at least one sequence".into(), actual: "0".into() });
        }
        let slots: Vec<usize> = batch.iter().map(|(s, _)| s.index()).collect();
        for (s, _) in batch {
            pool.check(*s)?;
        }
        let mut distinct = slots.clone();
        distinct.sort_unstable();
        if let Some(w) = distinct.windows(2).find(|w| w[0] == w[1]) {
            return Err(EngineError::Invalid { field: "batch", expected: "distinct slots".into(), actual: format!("slot {} twice", w[0]) });
        }
        let tokens: Vec<u32> = batch.iter().map(|(_, t)| *t).collect();
        self.check_tokens(&tokens)?;
        Ok((tokens, slots))
    }

    /// One batched decode step, run eagerly: each `(slot, token)` advances its slot by one
    /// token. Returns f32 logits `[B, vocab]`, row `b` for `batch[b]`.
    pub fn decode(&self, pool: &mut StatePool, batch: &[(SlotId, u32)]) -> Result<Tensor> {
        let (tokens, slots) = self.check_decode(pool, batch)?;
        let _span = tracing::debug_span!("decode", batch = batch.len()).entered();
        let ids = Tensor::new(tokens.as_slice(), &self.device)?;
        self.decode_step(pool, &ids, StepSlots::from(&slots), None)
    }

    /// The decode forward for token ids `[B]` on the device (validated by the caller), row `b`
    /// advancing `slots.host[b]`. Returns `[B, vocab]` f32 logits.
    pub(crate) fn decode_step(
        &self,
        pool: &mut StatePool,
        ids: &Tensor,
        slots: StepSlots<'_>,
        positions: Option<&Tensor>,
    ) -> Result<Tensor> {
        let res = self.blocks(self.embed_ids(ids)?, pool, &Pass::Decode { slots, positions }, Keep::All)?;
        self.head(&res)
    }

    /// [`Self::decode_step`] with the logits written into `out` `[B, vocab]` f32 (a CUDA graph's
    /// fixed output): by the LM head's kernel itself where it can, else widened there by one
    /// kernel rather than into a tensor then copied.
    #[cfg(feature = "cuda")]
    pub(crate) fn decode_step_into(
        &self,
        pool: &mut StatePool,
        ids: &Tensor,
        slots: StepSlots<'_>,
        positions: Option<&Tensor>,
        out: &Tensor,
    ) -> Result<()> {
        let res = self.blocks(self.embed_ids(ids)?, pool, &Pass::Decode { slots, positions }, Keep::All)?;
        let normed = NormedInput::new(&res, &self.norm, self.dtype);
        if normed.project_f32_into(&self.lm_head, out)? {
            return Ok(());
        }
        Ok(ops::to_f32_into(&normed.project(&self.lm_head)?, out)?)
    }
}
