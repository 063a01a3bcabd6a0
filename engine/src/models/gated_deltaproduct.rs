//! Gated DeltaProduct (Siems et al., "DeltaProduct: Improving State-Tracking in Linear RNNs
//! via Householder Products", arXiv:2502.10297), as implemented by flash-linear-attention's
//! `fla/layers/gated_deltaproduct.py`. Each token takes `n` householder (delta) steps; the
//! mixer runs the gated delta rule on the interleaved sequence of length T·n (model-spec.md
//! §2.3), with the gate on each token's first step and q on its last. Weights: §2.2; legacy
//! per-step lists: §2.4.

use candle_core::Tensor;
use candle_nn::{Linear, Module};
use deltaserve_kernels::ops::{self, PrefillAlgo};
use deltaserve_kernels::StepSlots;

use super::autodiff::{self, QkProj};
use super::causal_lm::Capture;
use super::mixer::{capture_query_key, linear, split_cols, FusedInput, FusedOutput, OutputHead, Packed, Prepared, ShortConv};
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

/// Parts of the fused input projection: q, k, v, b first (a and g follow when present).
const Q: usize = 0;
const B: usize = 3;

/// The Gated DeltaProduct sequence mixer of one layer (`model.layers.{i}.attn`).
#[derive(Debug, Clone)]
pub struct GatedDeltaProduct {
    /// `[q | k | v | b | a | g]` in one GEMM (a and g when present); the projections below are
    /// views of it.
    input: FusedInput,
    /// Part index of `a_proj` and of `g_proj` in `input`.
    a_part: usize,
    g_part: usize,
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
        let (q, k, v, b) = (
            linear(w, key_dim, d, "q_proj.weight")?,
            stepped_linear(w, "k_proj", key_dim, d, n)?,
            stepped_linear(w, "v_proj", value_dim, d, n)?,
            stepped_linear(w, "b_proj", h, d, n)?,
        );
        let a = if cfg.use_forget_gate() { Some(linear(w, h, d, "a_proj.weight")?) } else { None };
        let mut out = OutputHead::load(w, d, h, cfg.head_v_dim(), cfg.use_output_gate(), cfg.common.norm_eps, cfg.gate_activation())?;
        let g = out.g_proj.take();
        let mut parts = vec![&q, &k, &v, &b];
        parts.extend(a.as_ref());
        parts.extend(g.as_ref());
        let (a_part, g_part) = (4, 4 + usize::from(a.is_some()));
        let (input, views) = FusedInput::new(&parts)?;
        let mut views = views.into_iter();
        let mut next = || {
            views.next().ok_or_else(|| crate::error::EngineError::Invalid {
                field: "input projections",
                expected: "one view per part".into(),
                actual: "fewer".into(),
            })
        };
        let (q_proj, k_proj, v_proj, b_proj) = (next()?, next()?, next()?, next()?);
        let forget = match a {
            Some(_) => Some(ForgetGate { a_proj: next()?, a_log: w.get_f32(&[h], "A_log")?, dt_bias: w.get_f32(&[h], "dt_bias")? }),
            None => None,
        };
        if g.is_some() {
            out.g_proj = Some(next()?);
        }
        Ok(Self {
            input,
            a_part,
            g_part,
            q_proj,
            k_proj,
            v_proj,
            b_proj,
            forget,
            conv,
            out,
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

    /// Steps 2–6: interleave to T·n rows (row `t·n + j` = step j of token t), l2norm, β, gate.
    fn prepare(&self, y: &FusedOutput<'_>, conv_out: &Tensor) -> Result<Prepared> {
        let t = conv_out.dim(0)?;
        let (h, k, vd, n) = (self.num_heads, self.head_k_dim, self.head_v_dim, self.num_householder);
        let v = conv_out.narrow(1, h * k + n * h * k, n * h * vd)?.reshape((t * n, h, vd))?;
        // fla takes β = sigmoid(b) in the activation dtype inside the layer (§2.3 step 3); we
        // take it in fp32 from the same projection (one rounding fewer).
        let a = match &self.forget {
            Some(_) => Some(y.part(self.a_part)?),
            None => None,
        };
        let gate_in = match (&self.forget, &a) {
            (Some(f), Some(a)) => Some((a, &f.a_log, &f.dt_bias)),
            _ => None,
        };
        let layout = ops::QkLayout { q_heads: h, k_heads: n * h, head_dim: k };
        let p = ops::prepare(conv_out, layout, &y.part(B)?, self.allow_neg_eigval, gate_in)?;
        // '(n h d)' channels per token → rows (t n), heads h.
        let kk = p.k.reshape((t * n, h, k))?;
        let beta = p.beta.reshape((t * n, h))?;
        Ok(Prepared { q: p.q, k: kk, v, beta, g: p.g })
    }

    /// Prefills packed sequences `x` `[ΣT, D]`, each continuing from its slot's state. Returns
    /// `[ΣT, D]`.
    pub fn prefill(
        &self,
        x: &Tensor,
        state: &mut LayerState,
        seqs: &Packed<'_>,
        algo: PrefillAlgo,
        capture: Option<(&dyn Capture, usize)>,
    ) -> Result<Tensor> {
        let y = self.input.forward(x)?;
        let c = self.conv.prefill(&y.span(Q, B)?, &mut state.conv_state, seqs)?;
        capture_query_key(capture, &c, self.num_heads * self.head_k_dim, self.k_width())?;
        let p = self.prepare(&y, &c)?;
        let o = ops::gated_delta_prefill_packed(
            p.inputs(self.num_householder, self.scale),
            &mut state.recurrent_state,
            seqs.cu,
            seqs.slots,
            algo,
        )?;
        self.out.forward(&o, &y, self.g_part, x.dtype())
    }

    /// The layer's output for `x` `[T, D]` from a zero state, in differentiable f32 tensor
    /// ops, with `q_proj`/`k_proj` replaced by `qk`. Runs the interleaved T·n sequence with q
    /// on each token's last step and the gate on its first (§2.3).
    pub fn forward_autodiff(&self, x: &Tensor, qk: &QkProj) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (h, k, vd, n) = (self.num_heads, self.head_k_dim, self.head_v_dim, self.num_householder);
        let proj = Tensor::cat(&[autodiff::linear(x, &qk.q)?, autodiff::linear(x, &qk.k)?, self.v_proj.forward(x)?], 1)?;
        let c = self.conv.forward_autodiff(&proj)?;
        let parts = split_cols(&c, &[h * k, n * h * k, n * h * vd])?;
        let q = autodiff::l2norm(&parts[0].reshape((t, 1, h, k))?)?;
        let q = if n > 1 { Tensor::cat(&[q.zeros_like()?.repeat((1, n - 1, 1, 1))?, q], 1)? } else { q };
        let q = q.reshape((t * n, h, k))?;
        let kk = autodiff::l2norm(&parts[1].reshape((t * n, h, k))?)?;
        let v = parts[2].reshape((t * n, h, vd))?;
        let beta = autodiff::beta(&self.b_proj.forward(x)?, self.allow_neg_eigval)?.reshape((t * n, h))?;
        let g = match &self.forget {
            Some(f) => {
                let g = autodiff::gate(&f.a_proj.forward(x)?, &f.a_log, &f.dt_bias)?.reshape((t, 1, h))?;
                let g = if n > 1 { Tensor::cat(&[g.clone(), g.zeros_like()?.repeat((1, n - 1, 1))?], 1)? } else { g };
                Some(g.reshape((t * n, h))?)
            }
            None => None,
        };
        let o = autodiff::chunk_gated_delta_rule(&q, &kk, &v, &beta, g.as_ref(), self.scale as f64)?;
        let o = o.reshape((t, n, h, vd))?.narrow(1, n - 1, 1)?.squeeze(1)?;
        self.out.forward_autodiff(&o, x)
    }

    /// `q_proj` and `k_proj` weights.
    pub fn qk_proj(&self) -> QkProj {
        QkProj { q: self.q_proj.weight().clone(), k: self.k_proj.weight().clone() }
    }

    /// One decode step: row `b` of `x` `[B, D]` advances slot `slots.host[b]`. Returns `[B, D]`.
    pub fn decode(&self, x: &Tensor, state: &mut LayerState, slots: StepSlots<'_>) -> Result<Tensor> {
        let y = self.input.forward(x)?;
        let c = self.conv.step(&y.span(Q, B)?, &mut state.conv_state, slots)?;
        let (h, k, vd, n) = (self.num_heads, self.head_k_dim, self.head_v_dim, self.num_householder);
        let a = self.forget.as_ref().map(|_| y.part(self.a_part)).transpose()?;
        let raw = ops::RawStepInputs {
            conv_out: &c,
            layout: ops::QkLayout { q_heads: h, k_heads: n * h, head_dim: k },
            v_offset: h * k + n * h * k,
            v_heads: h,
            v_dim: vd,
            b: &y.part(B)?,
            allow_neg_eigval: self.allow_neg_eigval,
            gate_in: self.forget.as_ref().zip(a.as_ref()).map(|(f, a)| (a, &f.a_log, &f.dt_bias)),
            n,
            scale: self.scale,
        };
        // On a GPU, small batches do prepare's work inside the step's kernel (§2.3 steps 2–6, 7).
        let o = ops::gated_delta_step_raw(raw, &mut state.recurrent_state, slots, ops::StepFusion::Auto)?;
        self.out.forward(&o, &y, self.g_part, x.dtype())
    }
}
