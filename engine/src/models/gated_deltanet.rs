//! Gated DeltaNet (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with
//! Delta Rule", ICLR 2025, arXiv:2412.06464), as implemented by flash-linear-attention's
//! `fla/layers/gated_deltanet.py`. Math: model-spec.md §1.3; weights: §1.2; GVA: §1.4.

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::ops::{self, PrefillAlgo};
use deltaserve_kernels::{ConvActivation, StepSlots};

use super::batch::Packed;
use super::delta_rule::DeltaRule;
use super::linear::{linear, FusedInput, FusedOutput};
use super::output_head::{HeadNames, OutputHead};
use super::short_conv::{heads_of, ShortConv};
use crate::cache::CacheSpec;
use crate::config::{Family, ModelConfig};
use crate::error::Result;
use crate::state::LayerState;
use crate::tensor_parallel::{grouped_heads, head_rows, rows_at, Shard};
use crate::weights::Weights;
use candle_nn::Linear;
use std::ops::Range;

/// Parts of the fused input projection, in order (`g` only with an output gate).
pub(crate) const Q: usize = 0;
pub(crate) const K: usize = 1;
pub(crate) const V: usize = 2;
pub(crate) const A: usize = 3;
pub(crate) const B: usize = 4;
pub(crate) const G: usize = 5;

/// The Gated DeltaNet token mixer of one layer (`model.layers.{i}.attn`).
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    /// `q_proj | k_proj | v_proj | a_proj | b_proj | g_proj` in one GEMM.
    pub(crate) input: FusedInput,
    /// `A_log` `[HV]`, upcast to fp32 (§3.6.3).
    pub(crate) a_log: Tensor,
    /// `dt_bias` `[HV]` fp32.
    pub(crate) dt_bias: Tensor,
    pub(crate) conv: ShortConv,
    pub(crate) out: OutputHead,
    /// H.
    pub(crate) num_heads: usize,
    /// HV.
    pub(crate) num_v_heads: usize,
    /// K.
    pub(crate) head_k_dim: usize,
    /// Vd.
    pub(crate) head_v_dim: usize,
    pub(crate) allow_neg_eigval: bool,
    /// K^-0.5.
    pub(crate) scale: f32,
}

/// Qwen3-Next's `in_proj_qkvz` `[HK·(2dk + 2G·dv), D]` and `in_proj_ba` `[HK·2G, D]`, packed
/// per key-head group (hybrid-spec.md §4.2), unpacked into Qwen3.5's flat projections:
/// `[q, k, v, z, b, a]`, value head `g·G + j` belonging to key head g.
fn unpack_qkvz_ba(cfg: &ModelConfig, w: &Weights<'_>) -> Result<[Linear; 6]> {
    let (d, hk, dk, dv) = (cfg.common.hidden_size, cfg.num_heads(), cfg.head_k_dim(), cfg.head_v_dim());
    let g = cfg.num_v_heads() / hk;
    let group = 2 * dk + 2 * g * dv;
    let qkvz = w.get(&[hk * group, d], "in_proj_qkvz.weight")?.reshape((hk, group, d))?;
    let ba = w.get(&[hk * 2 * g, d], "in_proj_ba.weight")?.reshape((hk, 2 * g, d))?;
    let rows = |t: &Tensor, at: usize, n: usize| -> Result<Linear> {
        Ok(Linear::new(t.narrow(1, at, n)?.contiguous()?.reshape((hk * n, d))?, None))
    };
    Ok([
        rows(&qkvz, 0, dk)?,
        rows(&qkvz, dk, dk)?,
        rows(&qkvz, 2 * dk, g * dv)?,
        rows(&qkvz, 2 * dk + g * dv, g * dv)?,
        rows(&ba, 0, g)?,
        rows(&ba, g, g)?,
    ])
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
            ConvActivation::Silu,
        )?;
        let (q, k, v) =
            (linear(w, key_dim, d, "q_proj.weight")?, linear(w, key_dim, d, "k_proj.weight")?, linear(w, value_dim, d, "v_proj.weight")?);
        let (a, b) = (linear(w, hv, d, "a_proj.weight")?, linear(w, hv, d, "b_proj.weight")?);
        let (out, g) = OutputHead::load(w, d, hv, cfg.head_v_dim(), cfg.use_output_gate(), cfg.common.norm_eps, cfg.gate_activation())?;
        Self::assemble(cfg, w, [&q, &k, &v, &a, &b], g.as_ref(), conv, out)
    }

    /// Loads a transformers hybrid's linear-attention layer (`linear_attn`): Qwen3.5's fused
    /// `in_proj_qkv` / `in_proj_z` / `in_proj_b` / `in_proj_a`, one `conv1d`, `norm`, `out_proj`
    /// (hybrid-spec.md §3.2), or OLMo-Hybrid's fla names (§5.2). Same math as fla's layer.
    pub fn load_transformers(cfg: &ModelConfig, w: &Weights<'_>) -> Result<Self> {
        let (d, key_dim, value_dim, hv) = (cfg.common.hidden_size, cfg.key_dim(), cfg.value_dim(), cfg.num_v_heads());
        let conv_dim = 2 * key_dim + value_dim;
        let (q, k, v, a, b, names);
        let mut z = None;
        if cfg.family == Family::Qwen3Next {
            let parts = unpack_qkvz_ba(cfg, w)?;
            (q, k, v, z, b, a) =
                (parts[0].clone(), parts[1].clone(), parts[2].clone(), Some(parts[3].clone()), parts[4].clone(), parts[5].clone());
            names = HeadNames { gate: None, norm: "norm.weight", out: "out_proj.weight" };
        } else if cfg.family == Family::Qwen3_5 {
            let qkv = w.get(&[conv_dim, d], "in_proj_qkv.weight")?;
            let rows = |at: usize, n: usize| -> Result<Linear> { Ok(Linear::new(qkv.narrow(0, at, n)?, None)) };
            (q, k, v) = (rows(0, key_dim)?, rows(key_dim, key_dim)?, rows(2 * key_dim, value_dim)?);
            (a, b) = (linear(w, hv, d, "in_proj_a.weight")?, linear(w, hv, d, "in_proj_b.weight")?);
            names = HeadNames { gate: Some("in_proj_z.weight"), norm: "norm.weight", out: "out_proj.weight" };
        } else {
            (q, k, v) = (
                linear(w, key_dim, d, "q_proj.weight")?,
                linear(w, key_dim, d, "k_proj.weight")?,
                linear(w, value_dim, d, "v_proj.weight")?,
            );
            (a, b) = (linear(w, hv, d, "a_proj.weight")?, linear(w, hv, d, "b_proj.weight")?);
            names = HeadNames { gate: Some("g_proj.weight"), norm: "o_norm.weight", out: "o_proj.weight" };
        }
        let width = cfg.common.conv_size;
        let conv = if w.contains("conv1d.weight") {
            ShortConv::load(w, &[("conv1d", conv_dim, None)], width, true, ConvActivation::Silu)?
        } else {
            // OLMo-Hybrid as transformers 5.17 saves it: `conv1d` cut into q/k/v_conv1d at
            // equal thirds, not at the q/k/v boundaries. Only the concatenation is meaningful.
            let mut parts = Vec::new();
            for name in ["q_conv1d", "k_conv1d", "v_conv1d"] {
                let key = format!("{name}.weight");
                let shape = w.shape(&key).filter(|s| s.len() == 3 && s[1] == 1 && s[2] == width).ok_or_else(|| {
                    crate::error::WeightError::Missing { tensor: w.key("conv1d.weight"), expected: vec![conv_dim, 1, width] }
                })?;
                parts.push((name, shape[0], Some(w.get_f32(&shape, &key)?)));
            }
            let got: usize = parts.iter().map(|p| p.1).sum();
            if got != conv_dim {
                return Err(crate::error::WeightError::Shape {
                    tensor: w.key("{q,k,v}_conv1d.weight"),
                    expected: vec![conv_dim, 1, width],
                    actual: vec![got, 1, width],
                }
                .into());
            }
            ShortConv::load(w, &parts, width, true, ConvActivation::Silu)?
        };
        let (mut out, mut g) = OutputHead::load_named(w, d, (hv, cfg.head_v_dim()), &names, cfg.linear_norm_eps(), cfg.gate_activation())?;
        if z.is_some() {
            (out.gated, g) = (true, z);
        }
        Self::assemble(cfg, w, [&q, &k, &v, &a, &b], g.as_ref(), conv, out)
    }

    /// The layer from its loaded pieces: projections `q, k, v, a, b` (+ `g`) fused into one GEMM.
    fn assemble(
        cfg: &ModelConfig,
        w: &Weights<'_>,
        qkvab: [&Linear; 5],
        g: Option<&Linear>,
        conv: ShortConv,
        out: OutputHead,
    ) -> Result<Self> {
        let hv = cfg.num_v_heads();
        let mut parts = qkvab.to_vec();
        parts.extend(g);
        Ok(Self {
            input: FusedInput::new(&parts)?,
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

    /// The same layer on `dev`.
    pub fn to_device(&self, dev: &Device) -> Result<Self> {
        Ok(Self {
            input: self.input.to_device(dev)?,
            a_log: self.a_log.to_device(dev)?,
            dt_bias: self.dt_bias.to_device(dev)?,
            conv: self.conv.to_device(dev)?,
            out: self.out.to_device(dev)?,
            ..self.clone()
        })
    }

    /// One tensor parallel rank's slice: its share of the value heads with the key heads they
    /// read (a key head read by two ranks is copied to both), their projections, conv channels,
    /// decay parameters and states; `o_proj` by its matching input columns, so the output is a
    /// partial sum.
    pub fn shard(&self, s: Shard) -> Result<Self> {
        let (h, hv, k, vd) = (self.num_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim);
        let (keys, values) = grouped_heads(s, h, hv, "num_v_heads")?;
        let rows = |part: usize, total: usize, heads: &Range<usize>, dim: usize| -> Result<Linear> {
            Ok(Linear::new(head_rows(&self.input.weight(part)?, 1, total, heads, dim)?, None))
        };
        let mut parts = vec![
            rows(Q, h, &keys, k)?,
            rows(K, h, &keys, k)?,
            rows(V, hv, &values, vd)?,
            rows(A, hv, &values, 1)?,
            rows(B, hv, &values, 1)?,
        ];
        if self.input.parts() > G {
            parts.push(rows(G, hv, &values, vd)?);
        }
        let (kk, vv) = (keys.start * k..keys.end * k, values.start * vd..values.end * vd);
        let conv = self.conv.select(&[kk.clone(), h * k + kk.start..h * k + kk.end, 2 * h * k + vv.start..2 * h * k + vv.end])?;
        let heads = |t: &Tensor| rows_at(t, std::slice::from_ref(&values));
        Ok(Self {
            input: FusedInput::new(&parts.iter().collect::<Vec<_>>())?,
            a_log: heads(&self.a_log)?,
            dt_bias: heads(&self.dt_bias)?,
            conv,
            out: self.out.select(&values)?,
            num_heads: keys.len(),
            num_v_heads: values.len(),
            ..self.clone()
        })
    }

    /// One sequence's cache: the conv state and the `[HV, K, Vd]` recurrent state.
    pub fn cache(&self) -> CacheSpec {
        CacheSpec::Recurrent {
            conv_state: self.conv.state_len(),
            recurrent_state: self.num_v_heads * self.head_k_dim * self.head_v_dim,
            state_dtype: DType::F32,
        }
    }

    /// Where q and k sit in the conv output.
    fn qk_layout(&self) -> ops::QkLayout {
        ops::QkLayout { q_heads: self.num_heads, k_heads: self.num_heads, head_dim: self.head_k_dim }
    }

    /// First column of v in the conv output: 2·H·K.
    fn v_offset(&self) -> usize {
        2 * self.num_heads * self.head_k_dim
    }
}

impl DeltaRule for GatedDeltaNet {
    fn input(&self) -> &FusedInput {
        &self.input
    }

    fn output(&self) -> (&OutputHead, usize) {
        (&self.out, G)
    }

    fn conv(&self) -> &ShortConv {
        &self.conv
    }

    /// Packed sequences, each continuing from its slot's state.
    fn mix_prefill(&self, y: &FusedOutput<'_>, state: &mut LayerState, seqs: &Packed<'_>, algo: PrefillAlgo, act: DType) -> Result<Tensor> {
        // Steps 1–2: projections (`y`), short conv + SiLU. A bf16 mixer on the GPU takes the
        // conv's output, and the q and k normalised from it, in bf16 as fla's layer computes
        // them (no casts between).
        let narrow = algo == PrefillAlgo::ChunkedBf16 && act == DType::BF16 && self.conv.on_gpu();
        let out = if narrow { DType::BF16 } else { DType::F32 };
        let (hv, vd) = (self.num_v_heads, self.head_v_dim);
        // Steps 3–7: l2norm of q and k, β and the log-decay in fp32 from the activation-dtype
        // projections (fla ≥ v0.5.1), read in place; on a GPU in the conv's own launch where
        // it takes the shapes.
        let (x, b, a) = (y.span(Q, A)?, y.part(B)?, y.part(A)?);
        let gate_in = Some((&a, &self.a_log, &self.dt_bias));
        let inputs =
            ops::PrepareInputs { layout: self.qk_layout(), v_width: hv * vd, b: &b, allow_neg_eigval: self.allow_neg_eigval, gate_in };
        let (p, v) = match self.conv.prefill_prepared(&x, &mut state.conv_state, seqs, out, inputs)? {
            Some((p, v)) => (p, heads_of(&v, 0, hv, vd)?),
            None => {
                let c = self.conv.prefill(&x, &mut state.conv_state, seqs, out)?;
                let p = ops::prepare(&c, self.qk_layout(), &b, self.allow_neg_eigval, gate_in)?;
                (p, heads_of(&c, self.v_offset(), hv, vd)?)
            }
        };
        // Step 8: the gated delta rule, chunkwise.
        let inputs = ops::MixerInputs { q: &p.q, k: &p.k, v: &v, beta: &p.beta, g: p.g.as_ref(), n: 1, scale: self.scale };
        // Steps 9–10 follow in the output head.
        Ok(ops::gated_delta_prefill_packed(inputs, &mut state.recurrent_state, seqs.cu, seqs.slots, algo, seqs.captures, seqs.tables)?)
    }

    /// One recurrent step per row.
    fn mix_decode(&self, y: &FusedOutput<'_>, conv_out: Option<Tensor>, state: &mut LayerState, slots: StepSlots<'_>) -> Result<Tensor> {
        let c = match conv_out {
            Some(c) => c,
            None => self.conv.decode(&y.span(Q, A)?, &mut state.conv_state, slots)?,
        };
        let a = y.part(A)?;
        let raw = ops::RawStepInputs {
            conv_out: &c,
            layout: self.qk_layout(),
            v_offset: self.v_offset(),
            v_heads: self.num_v_heads,
            v_dim: self.head_v_dim,
            b: &y.part(B)?,
            allow_neg_eigval: self.allow_neg_eigval,
            gate_in: Some((&a, &self.a_log, &self.dt_bias)),
            n: 1,
            scale: self.scale,
        };
        // On a GPU, small batches do steps 4, 6 and 7 inside the step's kernel.
        Ok(ops::gated_delta_step_raw(raw, &mut state.recurrent_state, slots, ops::StepFusion::Auto)?)
    }
}
