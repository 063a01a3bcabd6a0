//! Gated DeltaNet (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with
//! Delta Rule", ICLR 2025, arXiv:2412.06464), as implemented by flash-linear-attention's
//! `fla/layers/gated_deltanet.py`. Math: model-spec.md §1.3; weights: §1.2; GVA: §1.4.

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

/// Parts of the fused input projection, in order.
const Q: usize = 0;
const A: usize = 3;
const B: usize = 4;
const G: usize = 5;

/// The Gated DeltaNet sequence mixer of one layer (`model.layers.{i}.attn`).
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    /// `[q | k | v | a | b | g]` in one GEMM; the fields below are views of it.
    input: FusedInput,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    a_proj: Linear,
    b_proj: Linear,
    /// `A_log` `[HV]`, upcast to fp32 (§3.6.3).
    a_log: Tensor,
    /// `dt_bias` `[HV]` fp32.
    dt_bias: Tensor,
    conv: ShortConv,
    out: OutputHead,
    num_heads: usize,
    num_v_heads: usize,
    head_k_dim: usize,
    head_v_dim: usize,
    allow_neg_eigval: bool,
    /// K^-0.5.
    scale: f32,
}

impl GatedDeltaNet {
    /// Loads the layer's weights, checking every shape against `cfg`.
    pub fn load(cfg: &ModelConfig, w: &Weights<'_>) -> Result<Self> {
        let (d, key_dim, value_dim, hv) = (cfg.common.hidden_size, cfg.key_dim(), cfg.value_dim(), cfg.num_v_heads());
        let conv = ShortConv::load(
            w,
            &[("q_conv1d", key_dim, None), ("k_conv1d", key_dim, None), ("v_conv1d", value_dim, None)],
            cfg.common.conv_size,
            cfg.common.use_short_conv,
        )?;
        let (q, k, v) =
            (linear(w, key_dim, d, "q_proj.weight")?, linear(w, key_dim, d, "k_proj.weight")?, linear(w, value_dim, d, "v_proj.weight")?);
        let (a, b) = (linear(w, hv, d, "a_proj.weight")?, linear(w, hv, d, "b_proj.weight")?);
        let mut out = OutputHead::load(w, d, hv, cfg.head_v_dim(), cfg.use_output_gate(), cfg.common.norm_eps, cfg.gate_activation())?;
        let mut parts = vec![&q, &k, &v, &a, &b];
        let g = out.g_proj.take();
        parts.extend(g.as_ref());
        let (input, mut views) = FusedInput::new(&parts)?;
        if g.is_some() {
            out.g_proj = views.pop();
        }
        let [q_proj, k_proj, v_proj, a_proj, b_proj]: [Linear; 5] = views.try_into().map_err(|_| crate::error::EngineError::Invalid {
            field: "input projections",
            expected: "five parts".into(),
            actual: "another count".into(),
        })?;
        Ok(Self {
            input,
            q_proj,
            k_proj,
            v_proj,
            a_proj,
            b_proj,
            a_log: w.get_f32(&[hv], "A_log")?,
            dt_bias: w.get_f32(&[hv], "dt_bias")?,
            conv,
            out,
            num_heads: cfg.num_heads(),
            num_v_heads: hv,
            head_k_dim: cfg.head_k_dim(),
            head_v_dim: cfg.head_v_dim(),
            allow_neg_eigval: cfg.common.allow_neg_eigval,
            scale: (cfg.head_k_dim() as f32).powf(-0.5),
        })
    }

    /// Width of k in the conv output: H·K.
    fn k_width(&self) -> usize {
        self.num_heads * self.head_k_dim
    }

    /// Steps 3–7 on the conv output `[N, C]` f32, with `a_proj`/`b_proj`'s parts of `y`.
    fn prepare(&self, y: &FusedOutput<'_>, conv_out: &Tensor) -> Result<Prepared> {
        let n = conv_out.dim(0)?;
        let (h, hv, k, vd) = (self.num_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim);
        let v = conv_out.narrow(1, 2 * h * k, hv * vd)?.reshape((n, hv, vd))?;
        // β and g in fp32 from the activation-dtype projections (fla ≥ v0.5.1, §1.3 steps 6–7),
        // read in place.
        let a = y.part(A)?;
        let layout = ops::QkLayout { q_heads: h, k_heads: h, head_dim: k };
        let p = ops::prepare(conv_out, layout, &y.part(B)?, self.allow_neg_eigval, Some((&a, &self.a_log, &self.dt_bias)))?;
        let g = p.g.ok_or_else(|| crate::error::EngineError::Invalid {
            field: "gate",
            expected: "a log-decay from prepare".into(),
            actual: "none".into(),
        })?;
        Ok(Prepared { q: p.q, k: p.k, v, beta: p.beta, g: Some(g) })
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
        let c = self.conv.prefill(&y.span(Q, A)?, &mut state.conv_state, seqs)?;
        capture_query_key(capture, &c, self.num_heads * self.head_k_dim, self.k_width())?;
        let p = self.prepare(&y, &c)?;
        let o = ops::gated_delta_prefill_packed(p.inputs(1, self.scale), &mut state.recurrent_state, seqs.cu, seqs.slots, algo)?;
        self.out.forward(&o, &y, G, x.dtype())
    }

    /// The layer's output for `x` `[T, D]` from a zero state, in differentiable f32 tensor
    /// ops, with `q_proj`/`k_proj` replaced by `qk` (autograd variables for pruning's `grad`).
    pub fn forward_autodiff(&self, x: &Tensor, qk: &QkProj) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (h, hv, k, vd) = (self.num_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim);
        let proj = Tensor::cat(&[autodiff::linear(x, &qk.q)?, autodiff::linear(x, &qk.k)?, self.v_proj.forward(x)?], 1)?;
        let c = self.conv.forward_autodiff(&proj)?;
        let parts = split_cols(&c, &[h * k, h * k, hv * vd])?;
        let q = autodiff::l2norm(&parts[0].reshape((t, h, k))?)?;
        let kk = autodiff::l2norm(&parts[1].reshape((t, h, k))?)?;
        let v = parts[2].reshape((t, hv, vd))?;
        let beta = autodiff::beta(&self.b_proj.forward(x)?, self.allow_neg_eigval)?;
        let g = autodiff::gate(&self.a_proj.forward(x)?, &self.a_log, &self.dt_bias)?;
        let o = autodiff::chunk_gated_delta_rule(&q, &kk, &v, &beta, Some(&g), self.scale as f64)?;
        self.out.forward_autodiff(&o, x)
    }

    /// `q_proj` and `k_proj` weights.
    pub fn qk_proj(&self) -> QkProj {
        QkProj { q: self.q_proj.weight().clone(), k: self.k_proj.weight().clone() }
    }

    /// One decode step: row `b` of `x` `[B, D]` advances slot `slots.host[b]`. Returns `[B, D]`.
    pub fn decode(&self, x: &Tensor, state: &mut LayerState, slots: StepSlots<'_>) -> Result<Tensor> {
        let y = self.input.forward(x)?;
        let c = self.conv.step(&y.span(Q, A)?, &mut state.conv_state, slots)?;
        let (h, k) = (self.num_heads, self.head_k_dim);
        let a = y.part(A)?;
        let raw = ops::RawStepInputs {
            conv_out: &c,
            layout: ops::QkLayout { q_heads: h, k_heads: h, head_dim: k },
            v_offset: 2 * h * k,
            v_heads: self.num_v_heads,
            v_dim: self.head_v_dim,
            b: &y.part(B)?,
            allow_neg_eigval: self.allow_neg_eigval,
            gate_in: Some((&a, &self.a_log, &self.dt_bias)),
            n: 1,
            scale: self.scale,
        };
        // On a GPU, small batches do prepare's work (steps 4, 6, 7) inside the step's kernel.
        let o = ops::gated_delta_step_raw(raw, &mut state.recurrent_state, slots, ops::StepFusion::Auto)?;
        self.out.forward(&o, &y, G, x.dtype())
    }
}
