//! The fla causal-LM shell around the sequence mixers: embeddings, pre-norm blocks with a
//! SwiGLU MLP, final norm and `lm_head` (model-spec.md §1.3 "Block", `GatedMLP`).

use candle_core::{DType, Device, Tensor};
use candle_nn::{Linear, Module};
use deltaserve_kernels::ops::PrefillAlgo;
use deltaserve_kernels::StepSlots;

use super::autodiff::{self, QkProj};
use super::gated_deltanet::GatedDeltaNet;
use super::gated_deltaproduct::GatedDeltaProduct;
use super::mixer::{linear, project, FusedInput, Packed};
use crate::config::{Architecture, ModelConfig};
use crate::error::{EngineError, Result};
use crate::state::{SlotId, StatePool};
use crate::weights::{Checkpoint, Weights};

/// fla RMSNorm: `x / sqrt(mean(x²) + eps) · w`, computed in fp32.
#[derive(Debug, Clone)]
struct RmsNorm {
    /// `[D]` f32.
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn load(w: &Weights<'_>, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self { weight: w.get_f32(&[dim], "weight")?, eps: eps as f32 })
    }

    /// Normalises an f32 tensor, returning f32.
    fn forward_f32(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }

    /// Completes the residual stream (`r = h + delta`, fp32) and normalises it into the compute
    /// dtype `act`: returns `(r, norm(r) as act)`. One fused kernel on a GPU (for contiguous
    /// inputs, as the blocks' are).
    fn add_forward(&self, res: &Residual, act: DType) -> Result<(Tensor, Tensor)> {
        #[cfg(feature = "cuda")]
        if res.h.device().is_cuda() {
            if let Some(out) = deltaserve_kernels::cuda::add_rms_norm(&res.h, res.delta.as_ref(), &self.weight, self.eps, act)? {
                return Ok(out);
            }
        }
        let r = match &res.delta {
            Some(d) => (d.to_dtype(DType::F32)? + &res.h)?,
            None => res.h.clone(),
        };
        let x = self.forward_f32(&r)?.to_dtype(act)?;
        Ok((r, x))
    }
}

/// The fp32 residual stream `h + delta`, the last sub-block's output `delta` (compute dtype)
/// not yet added: the add runs fused with the next norm.
struct Residual {
    h: Tensor,
    delta: Option<Tensor>,
}

impl Residual {
    /// The same rows of `h` and `delta`, picked by `f`.
    fn rows(&self, f: impl Fn(&Tensor) -> candle_core::Result<Tensor>) -> Result<Self> {
        Ok(Self { h: f(&self.h)?, delta: self.delta.as_ref().map(&f).transpose()? })
    }
}

/// `GatedMLP` with `swish`: `down_proj(silu(gate_proj x) · up_proj x)`, with `gate_proj` and
/// `up_proj` run as one GEMM (one launch, and one pass over x, per step).
#[derive(Debug, Clone)]
struct Mlp {
    /// `[gate | up]`.
    gate_up: FusedInput,
    down_proj: Linear,
}

impl Mlp {
    fn load(w: &Weights<'_>, d: usize, i: usize) -> Result<Self> {
        // Legacy fused layout (§1.5): gate_proj [2I, D] = [gate; up], no up_proj.
        let fused = !w.contains("up_proj.weight") && w.shape("gate_proj.weight") == Some(vec![2 * i, d]);
        let (gate_proj, up_proj) = if fused {
            let both = w.get(&[2 * i, d], "gate_proj.weight")?;
            (Linear::new(both.narrow(0, 0, i)?, None), Linear::new(both.narrow(0, i, i)?, None))
        } else {
            (linear(w, i, d, "gate_proj.weight")?, linear(w, i, d, "up_proj.weight")?)
        };
        let (gate_up, _) = FusedInput::new(&[&gate_proj, &up_proj])?;
        Ok(Self { gate_up, down_proj: linear(w, d, i, "down_proj.weight")? })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.gate_up.forward(x)?;
        let (gate, up) = (y.part(0)?, y.part(1)?);
        // A decode step's few rows: SwiGLU formed inside the down projection's kernel.
        if let Some(out) = deltaserve_kernels::ops::small_batch_swiglu_linear(&gate, &up, self.down_proj.weight())? {
            return Ok(out);
        }
        project(&self.down_proj, &deltaserve_kernels::ops::swiglu(&gate, &up)?)
    }

    /// [`Self::forward`] in differentiable tensor ops (the GPU's fused SwiGLU and small-batch
    /// projection have no backward).
    fn forward_autodiff(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.gate_up.forward_autodiff(x)?;
        let h = (y.part(0)?.silu()? * y.part(1)?)?;
        Ok(self.down_proj.forward(&h)?)
    }
}

/// A layer's sequence mixer.
#[derive(Debug, Clone)]
enum Mixer {
    GatedDeltaNet(GatedDeltaNet),
    GatedDeltaProduct(GatedDeltaProduct),
}

/// One pre-norm block: `r = h + attn(attn_norm h)`, `h = r + mlp(mlp_norm r)`. The residual
/// stream `h` stays fp32 whatever the compute dtype (fla rounds it to bf16 between blocks,
/// model-spec.md §3.6.8; keeping it cuts bf16 logit error by about a third on the fixtures), so
/// `fuse_norm` changes nothing here.
#[derive(Debug, Clone)]
struct Block {
    layer_idx: usize,
    attn_norm: RmsNorm,
    attn: Mixer,
    mlp_norm: RmsNorm,
    mlp: Mlp,
}

/// Observes activations during a prefill (pruning calibration). Implementors use interior
/// mutability; calls come from the engine's thread in layer order.
pub trait Capture {
    /// The mixer's input (the `attn_norm` output, i.e. `q_proj`'s input) `[T, D]`.
    fn mixer_input(&self, layer: usize, x: &Tensor);
    /// q `[T, H·K]` and k `[T, n·H·K]` after the short conv and SiLU, before the L2 norm, f32.
    fn query_key(&self, layer: usize, q: &Tensor, k: &Tensor);
}

/// How a block's mixer consumes its input.
enum Phase<'a> {
    Prefill { seqs: Packed<'a>, algo: PrefillAlgo, capture: Option<&'a dyn Capture> },
    Decode { slots: StepSlots<'a> },
}

impl Block {
    /// `h` is the fp32 residual stream; norms run in fp32 and their outputs are rounded to the
    /// compute dtype `act` for the projections.
    fn forward(&self, res: &Residual, act: DType, pool: &mut StatePool, phase: &Phase<'_>) -> Result<Residual> {
        let _span = tracing::trace_span!("block", layer = self.layer_idx).entered();
        let (h, x) = self.attn_norm.add_forward(res, act)?;
        let state = pool.layer_mut(self.layer_idx);
        if let Phase::Prefill { capture: Some(c), .. } = phase {
            c.mixer_input(self.layer_idx, &x);
        }
        let layer = self.layer_idx;
        let a = match (&self.attn, phase) {
            (Mixer::GatedDeltaNet(m), Phase::Prefill { seqs, algo, capture }) => {
                m.prefill(&x, state, seqs, *algo, capture.map(|c| (c, layer)))?
            }
            (Mixer::GatedDeltaNet(m), Phase::Decode { slots }) => m.decode(&x, state, *slots)?,
            (Mixer::GatedDeltaProduct(m), Phase::Prefill { seqs, algo, capture }) => {
                m.prefill(&x, state, seqs, *algo, capture.map(|c| (c, layer)))?
            }
            (Mixer::GatedDeltaProduct(m), Phase::Decode { slots }) => m.decode(&x, state, *slots)?,
        };
        let (r, x) = self.mlp_norm.add_forward(&Residual { h, delta: Some(a) }, act)?;
        Ok(Residual { h: r, delta: Some(self.mlp.forward(&x)?) })
    }
}

impl Block {
    /// [`Self::forward`] from a zero state in differentiable f32 tensor ops.
    fn forward_autodiff(&self, h: &Tensor, qk: &QkProj) -> Result<Tensor> {
        let x = autodiff::rms_norm(h, &self.attn_norm.weight, self.attn_norm.eps)?;
        let a = match &self.attn {
            Mixer::GatedDeltaNet(m) => m.forward_autodiff(&x, qk)?,
            Mixer::GatedDeltaProduct(m) => m.forward_autodiff(&x, qk)?,
        };
        let r = (h + a)?;
        let x = autodiff::rms_norm(&r, &self.mlp_norm.weight, self.mlp_norm.eps)?;
        Ok((&r + self.mlp.forward_autodiff(&x)?)?)
    }

    fn qk_proj(&self) -> QkProj {
        match &self.attn {
            Mixer::GatedDeltaNet(m) => m.qk_proj(),
            Mixer::GatedDeltaProduct(m) => m.qk_proj(),
        }
    }
}

/// Which logits a prefill returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only after the last token: `[vocab]`.
    Last,
    /// At every position: `[T, vocab]` (perplexity, parity tests).
    All,
}

/// A Gated DeltaNet / Gated DeltaProduct causal LM. Immutable; all state lives in a [`StatePool`].
#[derive(Debug, Clone)]
pub struct CausalLm {
    cfg: ModelConfig,
    /// `model.embeddings.weight` `[vocab, D]`.
    embeddings: Tensor,
    layers: Vec<Block>,
    norm: RmsNorm,
    /// `lm_head.weight` `[vocab, D]`, or the embeddings when tied.
    lm_head: Linear,
    dtype: DType,
    device: Device,
}

impl CausalLm {
    /// Builds the model from a checkpoint, in `dtype` on `device`.
    pub fn load(cfg: &ModelConfig, ckpt: &Checkpoint, dtype: DType, device: &Device, check_weights: bool) -> Result<Self> {
        let root = Weights::new(ckpt, dtype, device, check_weights);
        let (d, vocab) = (cfg.common.hidden_size, cfg.common.vocab_size);
        let m = root.pp("model");
        let embeddings = m.pp("embeddings").get(&[vocab, d], "weight")?;
        let i_size = cfg.intermediate_size();
        let mut layers = Vec::with_capacity(cfg.common.num_hidden_layers);
        for i in 0..cfg.common.num_hidden_layers {
            let l = m.pp("layers").pp(i);
            let attn = match cfg.arch {
                Architecture::GatedDeltaNet(_) => Mixer::GatedDeltaNet(GatedDeltaNet::load(cfg, &l.pp("attn"))?),
                Architecture::GatedDeltaProduct(_) => Mixer::GatedDeltaProduct(GatedDeltaProduct::load(cfg, &l.pp("attn"))?),
            };
            layers.push(Block {
                layer_idx: i,
                attn_norm: RmsNorm::load(&l.pp("attn_norm"), d, cfg.common.norm_eps)?,
                attn,
                mlp_norm: RmsNorm::load(&l.pp("mlp_norm"), d, cfg.common.norm_eps)?,
                mlp: Mlp::load(&l.pp("mlp"), d, i_size)?,
            });
        }
        let lm_head = if cfg.common.tie_word_embeddings { embeddings.clone() } else { root.get(&[vocab, d], "lm_head.weight")? };
        Ok(Self {
            cfg: cfg.clone(),
            embeddings,
            layers,
            norm: RmsNorm::load(&m.pp("norm"), d, cfg.common.norm_eps)?,
            lm_head: Linear::new(lm_head, None),
            dtype,
            device: device.clone(),
        })
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

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.cfg.common.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::Invalid { field: "token id", expected: format!("< vocab_size ({vocab})"), actual: bad.to_string() });
        }
        Ok(())
    }

    fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        self.embed_ids(&Tensor::new(tokens, &self.device)?)
    }

    /// The fp32 embeddings of token ids `[N]` already on the device.
    fn embed_ids(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(self.embeddings.index_select(ids, 0)?.to_dtype(DType::F32)?)
    }

    fn head(&self, res: &Residual) -> Result<Tensor> {
        let (_, x) = self.norm.add_forward(res, self.dtype)?;
        Ok(project(&self.lm_head, &x)?.to_dtype(DType::F32)?)
    }

    /// The blocks over the fp32 embeddings `h`.
    fn blocks(&self, h: Tensor, pool: &mut StatePool, phase: &Phase<'_>) -> Result<Residual> {
        let mut res = Residual { h, delta: None };
        for b in &self.layers {
            res = b.forward(&res, self.dtype, pool, phase)?;
        }
        Ok(res)
    }

    /// Runs `tokens` through the model from `slot`'s current state (empty or an earlier
    /// prefill) and leaves the state after the last token there. Returns f32 logits.
    pub fn prefill(&self, pool: &mut StatePool, slot: SlotId, tokens: &[u32], logits: Logits, algo: PrefillAlgo) -> Result<Tensor> {
        self.prefill_with(pool, slot, tokens, logits, algo, None)
    }

    /// [`Self::prefill`] that also reports activations to `capture` (pruning calibration).
    pub fn prefill_with(
        &self,
        pool: &mut StatePool,
        slot: SlotId,
        tokens: &[u32],
        logits: Logits,
        algo: PrefillAlgo,
        capture: Option<&dyn Capture>,
    ) -> Result<Tensor> {
        pool.check(slot)?;
        if tokens.is_empty() {
            return Err(EngineError::Invalid { field: "tokens", expected: "at least one token".into(), actual: "0 tokens".into() });
        }
        self.check_tokens(tokens)?;
        let _span = tracing::debug_span!("prefill", %slot, tokens = tokens.len()).entered();
        let (cu, slots) = ([0, tokens.len()], [slot.index()]);
        let phase = Phase::Prefill { seqs: Packed { cu: &cu, slots: &slots }, algo, capture };
        let res = self.blocks(self.embed(tokens)?, pool, &phase)?;
        match logits {
            Logits::All => self.head(&res),
            Logits::Last => Ok(self.head(&res.rows(|t| t.narrow(0, tokens.len() - 1, 1))?)?.squeeze(0)?),
        }
    }

    /// Prefills several sequences in one pass: `batch[s]` runs its tokens from its slot's
    /// current state, as [`Self::prefill`] would alone, but every layer's projections and
    /// kernels see all of them at once (one varlen launch on a GPU). Returns the f32 logits
    /// after each sequence's last token, `[S, vocab]`.
    pub fn prefill_many(&self, pool: &mut StatePool, batch: &[(SlotId, &[u32])], algo: PrefillAlgo) -> Result<Tensor> {
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
        let all: Vec<u32> = batch.iter().flat_map(|(_, t)| t.iter().copied()).collect();
        let phase = Phase::Prefill { seqs: Packed { cu: &cu, slots: &slots }, algo, capture: None };
        let res = self.blocks(self.embed(&all)?, pool, &phase)?;
        let last: Vec<u32> = cu[1..].iter().map(|&c| (c - 1) as u32).collect();
        let last = Tensor::new(last.as_slice(), &self.device)?;
        self.head(&res.rows(|t| t.index_select(&last, 0))?)
    }

    /// Every layer's `q_proj` / `k_proj` weights, in layer order.
    pub fn qk_proj(&self) -> Vec<QkProj> {
        self.layers.iter().map(Block::qk_proj).collect()
    }

    /// Logits `[T, vocab]` of `tokens` from a zero state, computed in differentiable tensor ops
    /// with each layer's `q_proj`/`k_proj` taken from `qk` (one per layer). Needs an f32 model.
    pub fn logits_autodiff(&self, tokens: &[u32], qk: &[QkProj]) -> Result<Tensor> {
        if self.dtype != DType::F32 {
            return Err(EngineError::Invalid {
                field: "dtype",
                expected: "f32 for the differentiable forward".into(),
                actual: format!("{:?}", self.dtype),
            });
        }
        if qk.len() != self.layers.len() || tokens.is_empty() {
            return Err(EngineError::Invalid {
                field: "qk / tokens",
                expected: format!("{} layers' weights and at least one token", self.layers.len()),
                actual: format!("{} layers, {} tokens", qk.len(), tokens.len()),
            });
        }
        self.check_tokens(tokens)?;
        let mut h = self.embed(tokens)?;
        for (b, w) in self.layers.iter().zip(qk) {
            h = b.forward_autodiff(&h, w)?;
        }
        let h = autodiff::rms_norm(&h, &self.norm.weight, self.norm.eps)?;
        Ok(self.lm_head.forward(&h)?)
    }

    /// The LM loss of one window (fla's: mean cross-entropy of predicting `tokens[1..]`), as a
    /// differentiable scalar; see [`Self::logits_autodiff`].
    pub fn lm_loss(&self, tokens: &[u32], qk: &[QkProj]) -> Result<Tensor> {
        if tokens.len() < 2 {
            return Err(EngineError::Invalid { field: "tokens", expected: "at least two tokens".into(), actual: tokens.len().to_string() });
        }
        let t = tokens.len();
        let logits = self.logits_autodiff(&tokens[..t - 1], qk)?;
        let targets = Tensor::new(&tokens[1..], &self.device)?;
        Ok(candle_nn::loss::cross_entropy(&logits, &targets)?)
    }

    /// One batched decode step: each `(slot, token)` advances its slot by one token.
    /// Returns f32 logits `[B, vocab]`, row `b` for `batch[b]`.
    pub fn decode(&self, pool: &mut StatePool, batch: &[(SlotId, u32)]) -> Result<Tensor> {
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
        let _span = tracing::debug_span!("decode", batch = batch.len()).entered();
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(dev), true) = (&self.device, pool.graphs.enabled()) {
            return crate::decode_graph::decode(self, dev, pool, &tokens, &slots);
        }
        let ids = Tensor::new(tokens.as_slice(), &self.device)?;
        self.decode_step(pool, &ids, StepSlots::from(&slots))
    }

    /// The decode forward for token ids `[B]` on the device (validated by the caller), row `b`
    /// advancing `slots.host[b]`. Returns `[B, vocab]` f32 logits.
    pub(crate) fn decode_step(&self, pool: &mut StatePool, ids: &Tensor, slots: StepSlots<'_>) -> Result<Tensor> {
        let phase = Phase::Decode { slots };
        let res = self.blocks(self.embed_ids(ids)?, pool, &phase)?;
        self.head(&res)
    }
}
