//! Gated DeltaProduct (Siems et al., "DeltaProduct: Improving State-Tracking in Linear RNNs
//! via Householder Products", arXiv:2502.10297), as implemented by flash-linear-attention's
//! `fla/layers/gated_deltaproduct.py`. Each token takes `n` householder (delta) steps; the
//! kernels run the gated delta rule on the interleaved sequence of length T·n (model-spec.md
//! §2.3; `ops::interleave_householder`). Weights: §2.2; legacy per-step lists: §2.4.

use candle_core::{DType, Device, Tensor};
use candle_nn::Linear;
use deltaserve_kernels::ops::{self, PrefillAlgo};
use deltaserve_kernels::{ConvActivation, StepSlots};

use super::batch::Packed;
use super::delta_rule::DeltaRule;
use super::linear::{linear, FusedInput, FusedOutput};
use super::output_head::OutputHead;
use super::short_conv::ShortConv;
use crate::cache::CacheSpec;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::state::LayerState;
use crate::tensor_parallel::{head_rows, rows_at, Shard};
use crate::weights::Weights;

/// Parts of the fused input projection: q, k, v, b first (a and g follow when present).
pub(crate) const Q: usize = 0;
pub(crate) const K: usize = 1;
pub(crate) const V: usize = 2;
pub(crate) const B: usize = 3;

/// The forget gate's parameters (`use_forget_gate`); `a_proj` is part `a_part` of the fused
/// input projection.
#[derive(Debug, Clone)]
pub struct ForgetGate {
    /// `A_log` `[H]` fp32.
    pub(crate) a_log: Tensor,
    /// `dt_bias` `[H]` fp32.
    pub(crate) dt_bias: Tensor,
}

/// The Gated DeltaProduct token mixer of one layer (`model.layers.{i}.attn`).
#[derive(Debug, Clone)]
pub struct GatedDeltaProduct {
    /// `q_proj | k_proj | v_proj | b_proj | a_proj | g_proj` in one GEMM (a and g when present).
    /// `k_proj` is `[n·H·K, D]`, channel `j·key_dim + h·K + d` (householder step outermost);
    /// `v_proj` `[n·H·Vd, D]` and `b_proj` `[n·H, D]` likewise.
    pub(crate) input: FusedInput,
    /// Part index of `a_proj` and of `g_proj` in `input`.
    pub(crate) a_part: usize,
    pub(crate) g_part: usize,
    pub(crate) forget: Option<ForgetGate>,
    pub(crate) conv: ShortConv,
    pub(crate) out: OutputHead,
    /// H (= HV).
    pub(crate) num_heads: usize,
    /// K.
    pub(crate) head_k_dim: usize,
    /// Vd.
    pub(crate) head_v_dim: usize,
    /// n.
    pub(crate) num_householder: usize,
    pub(crate) allow_neg_eigval: bool,
    /// K^-0.5.
    pub(crate) scale: f32,
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
        let legacy = |name, part, take| if cfg.common.use_short_conv { legacy_conv(w, name, part, width, take) } else { Ok(None) };
        let conv = ShortConv::load(
            w,
            &[
                ("q_conv1d", key_dim, legacy("q_conv1d", key_dim, 1)?),
                ("k_conv1d", n * key_dim, legacy("k_conv1d", key_dim, n)?),
                ("v_conv1d", n * value_dim, legacy("v_conv1d", value_dim, n)?),
            ],
            width,
            cfg.common.use_short_conv,
            ConvActivation::Silu,
        )?;
        let (q, k, v, b) = (
            linear(w, key_dim, d, "q_proj.weight")?,
            stepped_linear(w, "k_proj", key_dim, d, n)?,
            stepped_linear(w, "v_proj", value_dim, d, n)?,
            stepped_linear(w, "b_proj", h, d, n)?,
        );
        let a = if cfg.use_forget_gate() { Some(linear(w, h, d, "a_proj.weight")?) } else { None };
        let (out, g) = OutputHead::load(w, d, h, cfg.head_v_dim(), cfg.use_output_gate(), cfg.common.norm_eps, cfg.gate_activation())?;
        let mut parts = vec![&q, &k, &v, &b];
        parts.extend(a.as_ref());
        parts.extend(g.as_ref());
        let forget = match a {
            Some(_) => Some(ForgetGate { a_log: w.get_f32(&[h], "A_log")?, dt_bias: w.get_f32(&[h], "dt_bias")? }),
            None => None,
        };
        Ok(Self {
            input: FusedInput::new(&parts)?,
            a_part: 4,
            g_part: 4 + usize::from(forget.is_some()),
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

    /// The same layer on `dev`.
    pub fn to_device(&self, dev: &Device) -> Result<Self> {
        let forget = match &self.forget {
            Some(f) => Some(ForgetGate { a_log: f.a_log.to_device(dev)?, dt_bias: f.dt_bias.to_device(dev)? }),
            None => None,
        };
        Ok(Self {
            input: self.input.to_device(dev)?,
            forget,
            conv: self.conv.to_device(dev)?,
            out: self.out.to_device(dev)?,
            ..self.clone()
        })
    }

    /// One tensor parallel rank's slice: its share of the heads in every projection (each
    /// householder step's block alike), conv channels, forget gate and states; `o_proj` by its
    /// matching input columns, so the output is a partial sum.
    pub fn shard(&self, s: Shard) -> Result<Self> {
        let (h, k, vd, n) = (self.num_heads, self.head_k_dim, self.head_v_dim, self.num_householder);
        let heads = s.part(h, "num_heads")?;
        let rows = |part: usize, reps: usize, dim: usize| -> Result<Linear> {
            Ok(Linear::new(head_rows(&self.input.weight(part)?, reps, h, &heads, dim)?, None))
        };
        let mut parts = vec![rows(Q, 1, k)?, rows(K, n, k)?, rows(V, n, vd)?, rows(B, n, 1)?];
        if self.forget.is_some() {
            parts.push(rows(self.a_part, 1, 1)?);
        }
        if self.input.parts() > self.g_part {
            parts.push(rows(self.g_part, 1, vd)?);
        }
        // Conv channels: q, then n blocks of k, then n blocks of v, each head-major.
        let (key_dim, value_dim) = (h * k, h * vd);
        let at = |base: usize, dim: usize| base + heads.start * dim..base + heads.end * dim;
        let mut channels = vec![at(0, k)];
        channels.extend((0..n).map(|j| at(key_dim + j * key_dim, k)));
        channels.extend((0..n).map(|j| at((1 + n) * key_dim + j * value_dim, vd)));
        let narrow = |t: &Tensor| rows_at(t, std::slice::from_ref(&heads));
        let forget = match &self.forget {
            Some(f) => Some(ForgetGate { a_log: narrow(&f.a_log)?, dt_bias: narrow(&f.dt_bias)? }),
            None => None,
        };
        Ok(Self {
            input: FusedInput::new(&parts.iter().collect::<Vec<_>>())?,
            forget,
            conv: self.conv.select(&channels)?,
            out: self.out.select(&heads)?,
            num_heads: heads.len(),
            ..self.clone()
        })
    }

    /// One sequence's cache: the conv state and the `[H, K, Vd]` recurrent state.
    pub fn cache(&self) -> CacheSpec {
        CacheSpec::Recurrent {
            conv_state: self.conv.state_len(),
            recurrent_state: self.num_heads * self.head_k_dim * self.head_v_dim,
            state_dtype: DType::F32,
        }
    }

    /// Where q and the n·H k heads (step-major) sit in the conv output.
    fn qk_layout(&self) -> ops::QkLayout {
        ops::QkLayout { q_heads: self.num_heads, k_heads: self.num_householder * self.num_heads, head_dim: self.head_k_dim }
    }

    /// First column of v in the conv output: H·K + n·H·K.
    fn v_offset(&self) -> usize {
        (1 + self.num_householder) * self.num_heads * self.head_k_dim
    }

    /// `a_proj`'s output and the gate's parameters, when the layer has a forget gate.
    fn gate_input(&self, y: &FusedOutput<'_>) -> Result<Option<(Tensor, &ForgetGate)>> {
        self.forget.as_ref().map(|f| Ok((y.part(self.a_part)?, f))).transpose()
    }
}

impl DeltaRule for GatedDeltaProduct {
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
    fn mix_prefill(&self, y: &FusedOutput<'_>, state: &mut LayerState, seqs: &Packed<'_>, algo: PrefillAlgo, act: DType) -> Result<Tensor> {
        // As Gated DeltaNet's: a bf16 mixer on the GPU takes the conv output and q, k in bf16.
        let narrow = algo == PrefillAlgo::ChunkedBf16 && act == DType::BF16 && self.conv.on_gpu();
        let out = if narrow { DType::BF16 } else { DType::F32 };
        let c = self.conv.prefill(&y.span(Q, B)?, &mut state.conv_state, seqs, out)?;
        let (t, h, k, vd, n) = (c.dim(0)?, self.num_heads, self.head_k_dim, self.head_v_dim, self.num_householder);
        // fla takes β = sigmoid(b) in the activation dtype inside the layer (§2.3 step 3); we
        // take it in fp32 from the same projection (one rounding fewer).
        let gate = self.gate_input(y)?;
        let gate_in = gate.as_ref().map(|(a, f)| (a, &f.a_log, &f.dt_bias));
        let p = ops::prepare(&c, self.qk_layout(), &y.part(B)?, self.allow_neg_eigval, gate_in)?;
        // '(n h d)' channels per token → rows (t n), heads h: row t·n + j is step j of token t.
        let kk = p.k.reshape((t * n, h, k))?;
        let beta = p.beta.reshape((t * n, h))?;
        let v = c.narrow(1, self.v_offset(), n * h * vd)?.reshape((t * n, h, vd))?;
        let inputs = ops::MixerInputs { q: &p.q, k: &kk, v: &v, beta: &beta, g: p.g.as_ref(), n, scale: self.scale };
        Ok(ops::gated_delta_prefill_packed(inputs, &mut state.recurrent_state, seqs.cu, seqs.slots, algo, seqs.captures, seqs.tables)?)
    }

    /// One recurrent step per row.
    fn mix_decode(&self, y: &FusedOutput<'_>, conv_out: Option<Tensor>, state: &mut LayerState, slots: StepSlots<'_>) -> Result<Tensor> {
        let c = match conv_out {
            Some(c) => c,
            None => self.conv.decode(&y.span(Q, B)?, &mut state.conv_state, slots)?,
        };
        let gate = self.gate_input(y)?;
        let raw = ops::RawStepInputs {
            conv_out: &c,
            layout: self.qk_layout(),
            v_offset: self.v_offset(),
            v_heads: self.num_heads,
            v_dim: self.head_v_dim,
            b: &y.part(B)?,
            allow_neg_eigval: self.allow_neg_eigval,
            gate_in: gate.as_ref().map(|(a, f)| (a, &f.a_log, &f.dt_bias)),
            n: self.num_householder,
            scale: self.scale,
        };
        // On a GPU, small batches do prepare's work inside the step's kernel (§2.3 steps 2–7).
        Ok(ops::gated_delta_step_raw(raw, &mut state.recurrent_state, slots, ops::StepFusion::Auto)?)
    }
}
