//! DeltaNet (Yang, Wang, Zhang, Shen, Kim, "Parallelizing Linear Transformers with the Delta Rule
//! over Sequence Length", NeurIPS 2024, arXiv:2406.06484), as implemented by
//! flash-linear-attention's `fla/layers/delta_net.py`: the delta rule with no decay. Math:
//! hybrid-spec.md §2.3; weights: §2.2. It runs the gated delta rule kernels with no gate (the
//! decay exp(0) = 1 exactly) and one value head per q/k head.

use candle_core::{DType, Tensor, D};
use deltaserve_kernels::ops::{self, PrefillAlgo};
use deltaserve_kernels::{ConvActivation, StepSlots};

use super::batch::Packed;
use super::delta_rule::DeltaRule;
use super::linear::{linear, FusedInput, FusedOutput};
use super::output_head::OutputHead;
use super::short_conv::ShortConv;
use crate::cache::CacheSpec;
use crate::config::{Architecture, ModelConfig};
use crate::error::{EngineError, Result};
use crate::state::LayerState;
use crate::weights::Weights;

/// Parts of the fused input projection: q, k, v, then b (with `use_beta`) and g (with `use_gate`).
pub(crate) const Q: usize = 0;
pub(crate) const K: usize = 1;
pub(crate) const V: usize = 2;

/// fla's `F.normalize(p=1)` eps, outside the norm: `x / max(Σ|x|, eps)`.
const SUM_NORM_EPS: f64 = 1e-6;

/// The activation of q and k (hybrid-spec.md §2.3 steps 2 and 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkActivation {
    /// SiLU, applied with the short conv (as for v).
    Silu,
    /// max(x, 0).
    Relu,
    /// elu(x) + 1.
    Elu,
    /// None.
    Identity,
}

/// How q and k are normalised per head before the delta rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// `x / sqrt(Σx² + 1e-6)`.
    L2,
    /// `x / max(Σ|x|, 1e-6)`.
    Sum,
}

/// The DeltaNet token mixer of one layer (`model.layers.{i}.attn`).
#[derive(Debug, Clone)]
pub struct DeltaNet {
    /// `q_proj | k_proj | v_proj | b_proj | g_proj` in one GEMM (b, g when present).
    pub(crate) input: FusedInput,
    /// Part index of `b_proj` (with `use_beta`) and of `g_proj`.
    b_part: Option<usize>,
    g_part: usize,
    pub(crate) conv: ShortConv,
    pub(crate) out: OutputHead,
    qk_activation: QkActivation,
    qk_norm: QkNorm,
    /// H (= HV).
    pub(crate) num_heads: usize,
    /// K.
    pub(crate) head_k_dim: usize,
    /// V.
    pub(crate) head_v_dim: usize,
    pub(crate) allow_neg_eigval: bool,
    /// K^-0.5.
    pub(crate) scale: f32,
}

impl DeltaNet {
    /// The same layer on `dev`.
    pub fn to_device(&self, dev: &candle_core::Device) -> Result<Self> {
        Ok(Self { input: self.input.to_device(dev)?, conv: self.conv.to_device(dev)?, out: self.out.to_device(dev)?, ..self.clone() })
    }

    /// Loads the layer's weights, checking every shape against `cfg`.
    pub fn load(cfg: &ModelConfig, w: &Weights<'_>) -> Result<Self> {
        let Architecture::DeltaNet(f) = &cfg.arch else {
            return Err(EngineError::Invalid { field: "model_type", expected: "delta_net".into(), actual: cfg.model_type().into() });
        };
        let (d, key_dim, value_dim, h) = (cfg.common.hidden_size, cfg.key_dim(), cfg.value_dim(), cfg.num_heads());
        let qk_activation = match f.qk_activation.as_str() {
            "relu" => QkActivation::Relu,
            "elu" => QkActivation::Elu,
            "identity" => QkActivation::Identity,
            _ => QkActivation::Silu,
        };
        // v always goes through SiLU; with a SiLU q/k activation the whole conv output does.
        let conv_act = if qk_activation == QkActivation::Silu { ConvActivation::Silu } else { ConvActivation::Identity };
        let conv = ShortConv::load(
            w,
            &[("q_conv1d", key_dim, None), ("k_conv1d", key_dim, None), ("v_conv1d", value_dim, None)],
            cfg.common.conv_size,
            cfg.common.use_short_conv,
            conv_act,
        )?;
        let (q, k, v) =
            (linear(w, key_dim, d, "q_proj.weight")?, linear(w, key_dim, d, "k_proj.weight")?, linear(w, value_dim, d, "v_proj.weight")?);
        let b = if cfg.use_beta() { Some(linear(w, h, d, "b_proj.weight")?) } else { None };
        let (out, g) = OutputHead::load(w, d, h, cfg.head_v_dim(), f.use_gate, cfg.common.norm_eps, cfg.gate_activation())?;
        let mut parts = vec![&q, &k, &v];
        parts.extend(b.as_ref());
        parts.extend(g.as_ref());
        Ok(Self {
            input: FusedInput::new(&parts)?,
            b_part: b.as_ref().map(|_| 3),
            g_part: 3 + usize::from(b.is_some()),
            conv,
            out,
            qk_activation,
            qk_norm: if f.qk_norm == "sum" { QkNorm::Sum } else { QkNorm::L2 },
            num_heads: h,
            head_k_dim: cfg.head_k_dim(),
            head_v_dim: cfg.head_v_dim(),
            allow_neg_eigval: cfg.common.allow_neg_eigval,
            scale: (cfg.head_k_dim() as f32).powf(-0.5),
        })
    }

    /// One sequence's cache: the conv state and the `[H, K, V]` recurrent state.
    pub fn cache(&self) -> CacheSpec {
        CacheSpec::Recurrent {
            conv_state: self.conv.state_len(),
            recurrent_state: self.num_heads * self.head_k_dim * self.head_v_dim,
            state_dtype: DType::F32,
        }
    }

    /// Steps 3–7 on the conv output `c` `[N, 2·H·K + H·V]` f32: activated and normalised q, k
    /// `[N, H, K]`, v `[N, H, V]` and β `[N, H]`, all f32.
    fn inputs(&self, y: &FusedOutput<'_>, c: &Tensor) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let n = c.dim(0)?;
        let (h, kd, vd) = (self.num_heads, self.head_k_dim, self.head_v_dim);
        let silu_done = self.qk_activation == QkActivation::Silu;
        let v = c.narrow(1, 2 * h * kd, h * vd)?;
        let v = if silu_done { v } else { candle_nn::ops::silu(&v)? }.reshape((n, h, vd))?;
        let qk = c.narrow(1, 0, 2 * h * kd)?;
        let qk = match self.qk_activation {
            QkActivation::Silu | QkActivation::Identity => qk,
            QkActivation::Relu => qk.relu()?,
            QkActivation::Elu => (qk.elu(1.0)? + 1.0)?,
        };
        let mult = if self.allow_neg_eigval { 2.0 } else { 1.0 };
        let b = self.b_part.map(|i| y.part(i)).transpose()?;
        let (q, k, beta) = match self.qk_norm {
            // The l2norm and β in one pass (one fused kernel on a GPU).
            QkNorm::L2 => {
                let zeros;
                let b_in = match &b {
                    Some(b) => b,
                    None => {
                        zeros = Tensor::zeros((n, h), DType::F32, c.device())?;
                        &zeros
                    }
                };
                let layout = ops::QkLayout { q_heads: h, k_heads: h, head_dim: kd };
                let p = ops::prepare(&qk.contiguous()?, layout, b_in, self.allow_neg_eigval, None)?;
                (p.q, p.k, b.is_some().then_some(p.beta))
            }
            QkNorm::Sum => {
                let qk = qk.reshape((n, 2 * h, kd))?;
                let l1 = qk.abs()?.sum_keepdim(D::Minus1)?.maximum(SUM_NORM_EPS)?;
                let qk = qk.broadcast_div(&l1)?;
                let beta = b.map(|b| candle_nn::ops::sigmoid(&b.to_dtype(DType::F32)?)? * mult).transpose()?;
                (qk.narrow(1, 0, h)?.contiguous()?, qk.narrow(1, h, h)?.contiguous()?, beta)
            }
        };
        // Without `b_proj`, β ≡ 1 (≡ 2 with negative eigenvalues allowed).
        let beta = match beta {
            Some(b) => b,
            None => Tensor::full(mult as f32, (n, h), c.device())?,
        };
        Ok((q, k, v, beta))
    }
}

impl DeltaRule for DeltaNet {
    fn input(&self) -> &FusedInput {
        &self.input
    }

    fn output(&self) -> (&OutputHead, usize) {
        (&self.out, self.g_part)
    }

    fn conv(&self) -> &ShortConv {
        &self.conv
    }

    /// Packed sequences, each continuing from its slot's state.
    fn mix_prefill(
        &self,
        y: &FusedOutput<'_>,
        state: &mut LayerState,
        seqs: &Packed<'_>,
        algo: PrefillAlgo,
        _act: DType,
    ) -> Result<Tensor> {
        let c = self.conv.prefill(&y.span(Q, V + 1)?, &mut state.conv_state, seqs, DType::F32)?;
        let (q, k, v, beta) = self.inputs(y, &c)?;
        let inputs = ops::MixerInputs { q: &q, k: &k, v: &v, beta: &beta, g: None, n: 1, scale: self.scale };
        Ok(ops::gated_delta_prefill_packed(inputs, &mut state.recurrent_state, seqs.cu, seqs.slots, algo, seqs.captures, seqs.tables)?)
    }

    /// One recurrent step per row.
    fn mix_decode(&self, y: &FusedOutput<'_>, conv_out: Option<Tensor>, state: &mut LayerState, slots: StepSlots<'_>) -> Result<Tensor> {
        let c = match conv_out {
            Some(c) => c,
            None => self.conv.decode(&y.span(Q, V + 1)?, &mut state.conv_state, slots)?,
        };
        let (q, k, v, beta) = self.inputs(y, &c)?;
        let inputs = ops::MixerInputs { q: &q, k: &k, v: &v, beta: &beta, g: None, n: 1, scale: self.scale };
        Ok(ops::gated_delta_step(inputs, &mut state.recurrent_state, slots)?)
    }
}
