//! Pieces shared by the Gated DeltaNet and Gated DeltaProduct sequence mixers: the short
//! convolution over `[q | k | v]` and the gated output norm + projection (model-spec.md §1.3
//! steps 2 and 9–10).

use candle_core::{DType, Tensor, D};
use candle_nn::{Linear, Module};
use deltaserve_kernels::{ops, ConvActivation, GateActivation, SlotBuffer, StepSlots};

use super::autodiff;
use crate::error::Result;
use crate::weights::Weights;

/// Loads a bias-free linear layer `[out, in]`.
pub fn linear(w: &Weights<'_>, out_dim: usize, in_dim: usize, name: &str) -> Result<Linear> {
    Ok(Linear::new(w.get(&[out_dim, in_dim], name)?, None))
}

/// `l`'s forward for inference: a decode step's few rows go through the small-batch kernel
/// where it applies (GPU, bf16/f16), everything else through candle's GEMM.
pub fn project(l: &Linear, x: &Tensor) -> Result<Tensor> {
    if l.bias().is_none() {
        if let Some(y) = deltaserve_kernels::ops::small_batch_linear(x, l.weight())? {
            return Ok(y);
        }
    }
    Ok(l.forward(x)?)
}

/// A mixer's input projections run as one GEMM: their weights stacked by rows. Each part stays
/// reachable as its own `Linear` over a view of the stacked weight (no copy), for the
/// differentiable forward and pruning.
#[derive(Debug, Clone)]
pub struct FusedInput {
    weight: Linear,
    /// Column offset of each part in the output, and the total width last.
    offsets: Vec<usize>,
}

/// The output of [`FusedInput::forward`]: `[N, Σ widths]`, parts by index.
pub struct FusedOutput<'a> {
    y: Tensor,
    offsets: &'a [usize],
}

impl FusedOutput<'_> {
    /// Parts `i..j` (adjacent columns) as one `[N, width]` view.
    pub fn span(&self, i: usize, j: usize) -> Result<Tensor> {
        Ok(self.y.narrow(1, self.offsets[i], self.offsets[j] - self.offsets[i])?)
    }

    /// Part `i`.
    pub fn part(&self, i: usize) -> Result<Tensor> {
        self.span(i, i + 1)
    }
}

impl FusedInput {
    /// Stacks `parts`; returns the fused projection and each part as a view of it.
    pub fn new(parts: &[&Linear]) -> Result<(Self, Vec<Linear>)> {
        let weight = Tensor::cat(&parts.iter().map(|l| l.weight()).collect::<Vec<_>>(), 0)?;
        let mut offsets = vec![0];
        for l in parts {
            offsets.push(offsets[offsets.len() - 1] + l.weight().dim(0)?);
        }
        let views = offsets.windows(2).map(|w| Ok(Linear::new(weight.narrow(0, w[0], w[1] - w[0])?, None))).collect::<Result<_>>()?;
        Ok((Self { weight: Linear::new(weight, None), offsets }, views))
    }

    /// `x` `[N, D]` through every part at once.
    pub fn forward(&self, x: &Tensor) -> Result<FusedOutput<'_>> {
        Ok(FusedOutput { y: project(&self.weight, x)?, offsets: &self.offsets })
    }

    /// [`Self::forward`] through candle's GEMM only (differentiable; the small-batch kernel has
    /// no backward).
    pub fn forward_autodiff(&self, x: &Tensor) -> Result<FusedOutput<'_>> {
        Ok(FusedOutput { y: self.weight.forward(x)?, offsets: &self.offsets })
    }
}

/// Several sequences packed along the token axis: sequence `s` owns rows `cu[s]..cu[s+1]` and
/// continues from the state of `slots[s]`.
#[derive(Debug, Clone, Copy)]
pub struct Packed<'a> {
    /// Row offsets, `slots.len() + 1` entries from 0 to ΣT.
    pub cu: &'a [usize],
    /// Each sequence's state slot (distinct).
    pub slots: &'a [usize],
}

/// Depthwise causal convolutions of q, k and v, run as one conv over their concatenation.
#[derive(Debug, Clone)]
pub struct ShortConv {
    /// `[C, W]` f32, rows `[q_conv1d | k_conv1d | v_conv1d]`; `None` when `use_short_conv` is off.
    weight: Option<Tensor>,
}

impl ShortConv {
    /// Loads `{q,k,v}_conv1d.weight` (`[C_x, 1, W]` each) as one `[C, W]` f32 tensor, where
    /// `parts` gives each conv's (name, channels). `loaded` replaces a part read another way.
    pub fn load(w: &Weights<'_>, parts: &[(&str, usize, Option<Tensor>)], width: usize, use_short_conv: bool) -> Result<Self> {
        if !use_short_conv {
            return Ok(Self { weight: None });
        }
        let mut ws = Vec::with_capacity(parts.len());
        for (name, c, loaded) in parts {
            let t = match loaded {
                Some(t) => t.clone(),
                None => w.get_f32(&[*c, 1, width], &format!("{name}.weight"))?,
            };
            ws.push(t.to_dtype(DType::F32)?.reshape((*c, width))?);
        }
        Ok(Self { weight: Some(Tensor::cat(&ws, 0)?) })
    }

    /// Prefill over packed sequences `x` `[ΣT, C]` (rows `cu[s]..cu[s+1]` continue the conv
    /// state of `slots[s]`, which they update). Returns `[ΣT, C]` f32.
    pub fn prefill(&self, x: &Tensor, states: &mut SlotBuffer, seqs: &Packed<'_>) -> Result<Tensor> {
        match &self.weight {
            Some(wt) => Ok(ops::conv_prefill_packed(x, wt, states, seqs.cu, seqs.slots, ConvActivation::Silu)?),
            None => Ok(candle_nn::ops::silu(&x.to_dtype(DType::F32)?)?),
        }
    }

    /// Differentiable prefill from a zero conv state (pruning's `grad`): `[T, C]` → `[T, C]`.
    pub fn forward_autodiff(&self, x: &Tensor) -> Result<Tensor> {
        match &self.weight {
            Some(wt) => autodiff::causal_conv_silu(x, wt),
            None => Ok(x.silu()?),
        }
    }

    /// One decode step over `x` `[B, C]` for `slots`. Returns `[B, C]` f32.
    pub fn step(&self, x: &Tensor, states: &mut SlotBuffer, slots: StepSlots<'_>) -> Result<Tensor> {
        match &self.weight {
            Some(wt) => Ok(ops::conv_step(x, wt, states, slots, ConvActivation::Silu)?),
            None => Ok(candle_nn::ops::silu(&x.to_dtype(DType::F32)?)?),
        }
    }
}

/// `o_norm` (gated RMSNorm over each value head) then `o_proj`.
#[derive(Debug, Clone)]
pub struct OutputHead {
    /// `g_proj` `[HV·Vd, D]` when the output is gated.
    pub g_proj: Option<Linear>,
    /// `o_norm.weight` `[Vd]` f32.
    pub o_norm: Tensor,
    /// `o_proj` `[D, HV·Vd]`.
    pub o_proj: Linear,
    /// `norm_eps` (the block passes the config's eps to the layer).
    pub eps: f32,
    /// Gate activation.
    pub act: GateActivation,
    /// HV.
    pub num_v_heads: usize,
    /// Vd.
    pub head_v_dim: usize,
}

impl OutputHead {
    /// Loads `g_proj` (if gated), `o_norm` and `o_proj`.
    pub fn load(
        w: &Weights<'_>,
        hidden: usize,
        num_v_heads: usize,
        head_v_dim: usize,
        gated: bool,
        eps: f64,
        act: GateActivation,
    ) -> Result<Self> {
        let value_dim = num_v_heads * head_v_dim;
        let g_proj = if gated { Some(linear(w, value_dim, hidden, "g_proj.weight")?) } else { None };
        Ok(Self {
            g_proj,
            o_norm: w.get_f32(&[head_v_dim], "o_norm.weight")?,
            o_proj: linear(w, hidden, value_dim, "o_proj.weight")?,
            eps: eps as f32,
            act,
            num_v_heads,
            head_v_dim,
        })
    }

    /// `o` `[N, HV, Vd]` f32 → `[N, D]` in `dtype`, gated by part `g_part` of the fused input
    /// projection `y` (`g_proj`'s output) when the layer has an output gate.
    pub fn forward(&self, o: &Tensor, y: &FusedOutput<'_>, g_part: usize, dtype: DType) -> Result<Tensor> {
        let n = o.dim(0)?;
        // The gate `[N, HV·Vd]` as it sits in the fused projection: the GPU norm reads it in
        // place and writes `dtype` directly (no f32 copy of z, no cast of the output).
        let z = self.g_proj.as_ref().map(|_| y.part(g_part)).transpose()?;
        let y = ops::gated_rms_norm(o, z.as_ref(), &self.o_norm, self.eps, self.act, dtype)?;
        project(&self.o_proj, &y.reshape((n, self.num_v_heads * self.head_v_dim))?)
    }
}

impl OutputHead {
    /// [`Self::forward`] in differentiable tensor ops, f32.
    pub fn forward_autodiff(&self, o: &Tensor, x: &Tensor) -> Result<Tensor> {
        let n = o.dim(0)?;
        let z = match &self.g_proj {
            Some(g) => Some(g.forward(x)?.reshape((n, self.num_v_heads, self.head_v_dim))?),
            None => None,
        };
        let y = autodiff::gated_rms_norm(o, z.as_ref(), &self.o_norm, self.eps, self.act)?;
        Ok(self.o_proj.forward(&y.reshape((n, self.num_v_heads * self.head_v_dim))?)?)
    }
}

/// The mixer's inputs after projections, conv, l2norm, β and gate (model-spec.md §1.3 steps
/// 1–7), f32 as the prepare kernel writes them.
pub struct Prepared {
    /// `[T, H, K]`.
    pub q: Tensor,
    /// `[T·n, H, K]`.
    pub k: Tensor,
    /// `[T·n, HV, V]`.
    pub v: Tensor,
    /// `[T·n, HV]`.
    pub beta: Tensor,
    /// `[T, HV]`, if the layer has a forget gate.
    pub g: Option<Tensor>,
}

impl Prepared {
    /// The kernel inputs for `n` householder steps and read-out `scale`.
    pub fn inputs(&self, n: usize, scale: f32) -> ops::MixerInputs<'_> {
        ops::MixerInputs { q: &self.q, k: &self.k, v: &self.v, beta: &self.beta, g: self.g.as_ref(), n, scale }
    }
}

/// Splits `[N, C]` into consecutive column blocks of the given widths.
pub fn split_cols(x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
    let mut out = Vec::with_capacity(widths.len());
    let mut at = 0;
    for &w in widths {
        out.push(x.narrow(D::Minus1, at, w)?);
        at += w;
    }
    Ok(out)
}

/// Reports q `[N, key_dim]` and k `[N, k_width]` (the first columns of the conv output) to a
/// pruning-calibration capture.
pub fn capture_query_key(capture: Option<(&dyn super::Capture, usize)>, conv_out: &Tensor, key_dim: usize, k_width: usize) -> Result<()> {
    if let Some((cap, layer)) = capture {
        cap.query_key(layer, &conv_out.narrow(1, 0, key_dim)?, &conv_out.narrow(1, key_dim, k_width)?);
    }
    Ok(())
}
