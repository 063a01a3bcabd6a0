//! Gated DeltaProduct (Siems et al., "DeltaProduct: Improving State-Tracking in Linear RNNs
//! via Householder Products", arXiv:2502.10297), as implemented by flash-linear-attention's
//! `fla/layers/gated_deltaproduct.py`. Each token takes `n` householder (delta) steps; the
//! mixer runs the gated delta rule on the interleaved sequence of length T·n (model-spec.md
//! §2.3), with the gate on each token's first step and q on its last. Weights: §2.2; legacy
//! per-step lists: §2.4.

use candle_core::{DType, Tensor};
use candle_nn::{Linear, Module};
use deltaserve_kernels::ops::{self, MixerInputs, PrefillAlgo};

use super::causal_lm::Capture;
use super::mixer::{capture_query_key, linear, split_cols, OutputHead, ShortConv};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::state::LayerState;
use crate::weights::Weights;

/// The forget gate's parameters (`use_forget_gate`).
#[derive(Debug, Clone)]
struct ForgetGate {
    a_proj: Linear,
    /// `A_log` `[H]` fp32.
    a_log: Tensor,
    /// `dt_bias` `[H]` fp32.
    dt_bias: Tensor,
}

/// The Gated DeltaProduct sequence mixer of one layer (`model.layers.{i}.attn`).
#[derive(Debug, Clone)]
pub struct GatedDeltaProduct {
    q_proj: Linear,
    /// `[n·H·K, D]`, channel `j·key_dim + h·K + d` (householder step outermost).
    k_proj: Linear,
    /// `[n·H·Vd, D]`, channel `j·value_dim + h·Vd + d`.
    v_proj: Linear,
    /// `[n·H, D]`, channel `j·H + h`.
    b_proj: Linear,
    forget: Option<ForgetGate>,
    conv: ShortConv,
    out: OutputHead,
    num_heads: usize,
    head_k_dim: usize,
    head_v_dim: usize,
    num_householder: usize,
    allow_neg_eigval: bool,
    /// K^-0.5.
    scale: f32,
}

struct Prepared {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Option<Tensor>,
}

/// Loads a per-step projection in the current layout, or concatenates the legacy list
/// `{name}s.{j}` (§2.4).
fn stepped_linear(w: &Weights<'_>, name: &str, part_out: usize, d: usize, n: usize) -> Result<Linear> {
    let current = format!("{name}.weight");
    if !w.contains(&current) && w.contains(&format!("{name}s.0.weight")) {
        let parts = (0..n).map(|j| w.get(&[part_out, d], &format!("{name}s.{j}.weight"))).collect::<std::result::Result<Vec<_>, _>>()?;
        return Ok(Linear::new(Tensor::cat(&parts, 0)?, None));
    }
    linear(w, n * part_out, d, &current)
}

/// The legacy conv list `{name}s.{j}` concatenated, if the checkpoint uses it; `take` limits
/// how many steps are used (only `q_conv1ds.0` ever was).
fn legacy_conv(w: &Weights<'_>, name: &str, part: usize, width: usize, take: usize) -> Result<Option<Tensor>> {
    if w.contains(&format!("{name}.weight")) || !w.contains(&format!("{name}s.0.weight")) {
        return Ok(None);
    }
    let parts =
        (0..take).map(|j| w.get_f32(&[part, 1, width], &format!("{name}s.{j}.weight"))).collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Some(Tensor::cat(&parts, 0)?))
}

impl GatedDeltaProduct {
    /// Loads the layer's weights (current or legacy layout), checking every shape.
    pub fn load(cfg: &ModelConfig, w: &Weights<'_>) -> Result<Self> {
        let (d, key_dim, value_dim, h, n) =
            (cfg.common.hidden_size, cfg.key_dim(), cfg.value_dim(), cfg.num_heads(), cfg.num_householder());
        let width = cfg.common.conv_size;
        let conv = if cfg.common.use_short_conv {
            ShortConv::load(
                w,
                &[
                    ("q_conv1d", key_dim, legacy_conv(w, "q_conv1d", key_dim, width, 1)?),
                    ("k_conv1d", n * key_dim, legacy_conv(w, "k_conv1d", key_dim, width, n)?),
                    ("v_conv1d", n * value_dim, legacy_conv(w, "v_conv1d", value_dim, width, n)?),
                ],
                width,
                true,
            )?
        } else {
            ShortConv::load(w, &[], width, false)?
        };
        let forget = if cfg.use_forget_gate() {
            Some(ForgetGate {
                a_proj: linear(w, h, d, "a_proj.weight")?,
                a_log: w.get_f32(&[h], "A_log")?,
                dt_bias: w.get_f32(&[h], "dt_bias")?,
            })
        } else {
            None
        };
        Ok(Self {
            q_proj: linear(w, key_dim, d, "q_proj.weight")?,
            k_proj: stepped_linear(w, "k_proj", key_dim, d, n)?,
            v_proj: stepped_linear(w, "v_proj", value_dim, d, n)?,
            b_proj: stepped_linear(w, "b_proj", h, d, n)?,
            forget,
            conv,
            out: OutputHead::load(w, d, h, cfg.head_v_dim(), cfg.use_output_gate(), cfg.common.norm_eps, cfg.gate_activation())?,
            num_heads: h,
            head_k_dim: cfg.head_k_dim(),
            head_v_dim: cfg.head_v_dim(),
            num_householder: n,
            allow_neg_eigval: cfg.common.allow_neg_eigval,
            scale: (cfg.head_k_dim() as f32).powf(-0.5),
        })
    }

    /// Width of k in the conv output: n·H·K.
    fn k_width(&self) -> usize {
        self.num_householder * self.num_heads * self.head_k_dim
    }

    /// Step 1: `[q̃ | k̃ | ṽ]` `[N, C]` pre-conv (the conv runs over real tokens).
    fn projections(&self, x: &Tensor) -> Result<Tensor> {
        Ok(Tensor::cat(&[self.q_proj.forward(x)?, self.k_proj.forward(x)?, self.v_proj.forward(x)?], 1)?)
    }

    /// Steps 2–6: interleave to T·n rows (row `t·n + j` = step j of token t), l2norm, β, gate.
    fn prepare(&self, x: &Tensor, conv_out: &Tensor) -> Result<Prepared> {
        let t = x.dim(0)?;
        let (h, k, vd, n) = (self.num_heads, self.head_k_dim, self.head_v_dim, self.num_householder);
        let parts = split_cols(conv_out, &[h * k, n * h * k, n * h * vd])?;
        let q = ops::l2norm(&parts[0].reshape((t, h, k))?)?;
        // '(n h d)' channels per token → rows (t n), heads h.
        let kk = ops::l2norm(&parts[1].reshape((t * n, h, k))?)?;
        let v = parts[2].reshape((t * n, h, vd))?;
        // β = sigmoid(b) in the activation dtype inside the layer (§2.3 step 3), then fp32.
        let mut beta = candle_nn::ops::sigmoid(&self.b_proj.forward(x)?)?;
        if self.allow_neg_eigval {
            beta = (beta * 2.0)?;
        }
        let beta = beta.to_dtype(DType::F32)?.reshape((t * n, h))?;
        let g = match &self.forget {
            Some(f) => Some(ops::gate(&f.a_proj.forward(x)?.to_dtype(DType::F32)?, &f.a_log, &f.dt_bias)?),
            None => None,
        };
        Ok(Prepared { q, k: kk, v, beta, g })
    }

    fn inputs<'a>(&self, p: &'a Prepared) -> MixerInputs<'a> {
        MixerInputs { q: &p.q, k: &p.k, v: &p.v, beta: &p.beta, g: p.g.as_ref(), n: self.num_householder, scale: self.scale }
    }

    /// Prefills `x` `[T, D]` into `slot`, continuing from its state. Returns `[T, D]`.
    pub fn prefill(
        &self,
        x: &Tensor,
        state: &mut LayerState,
        slot: usize,
        algo: PrefillAlgo,
        capture: Option<(&dyn Capture, usize)>,
    ) -> Result<Tensor> {
        let c = self.conv.prefill(&self.projections(x)?, state.conv_state.slot_mut(slot)?)?;
        capture_query_key(capture, &c, self.num_heads * self.head_k_dim, self.k_width())?;
        let p = self.prepare(x, &c)?;
        let o = ops::gated_delta_prefill(self.inputs(&p), state.recurrent_state.slot_mut(slot)?, algo)?;
        self.out.forward(&o, x)
    }

    /// One decode step: row `b` of `x` `[B, D]` advances `slots[b]`. Returns `[B, D]`.
    pub fn decode(&self, x: &Tensor, state: &mut LayerState, slots: &[usize]) -> Result<Tensor> {
        let c = self.conv.step(&self.projections(x)?, &mut state.conv_state, slots)?;
        let p = self.prepare(x, &c)?;
        let o = ops::gated_delta_step(self.inputs(&p), &mut state.recurrent_state, slots)?;
        self.out.forward(&o, x)
    }
}
