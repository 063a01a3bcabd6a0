//! The short convolution over `[q | k | v]` (model-spec.md §1.3 step 2): depthwise, causal,
//! followed by SiLU (or nothing, for DeltaNet's non-SiLU q/k); run as one conv over the
//! concatenated projections.

use candle_core::{DType, Tensor};
use deltaserve_kernels::{ops, ConvActivation, SlotBuffer, StepSlots};

use super::batch::Packed;
use crate::error::Result;
use crate::weights::Weights;

/// Depthwise causal convolutions of q, k and v, run as one conv over their concatenation.
#[derive(Debug, Clone)]
pub struct ShortConv {
    /// `[C, W]` f32, rows `[q_conv1d | k_conv1d | v_conv1d]`; `None` when `use_short_conv` is off.
    pub(crate) weight: Option<Tensor>,
    /// C.
    channels: usize,
    /// W.
    width: usize,
    /// What follows the conv (and stands in for it without one).
    act: ConvActivation,
}

impl ShortConv {
    /// Loads `{q,k,v}_conv1d.weight` (`[C_x, 1, W]` each) as one `[C, W]` f32 tensor, where
    /// `parts` gives each conv's (name, channels). `loaded` replaces a part read another way.
    /// `act` follows the conv (SiLU for the gated models).
    pub fn load(
        w: &Weights<'_>,
        parts: &[(&str, usize, Option<Tensor>)],
        width: usize,
        use_short_conv: bool,
        act: ConvActivation,
    ) -> Result<Self> {
        let channels = parts.iter().map(|p| p.1).sum();
        if !use_short_conv {
            return Ok(Self { weight: None, channels, width, act });
        }
        let mut ws = Vec::with_capacity(parts.len());
        for (name, c, loaded) in parts {
            let t = match loaded {
                Some(t) => t.clone(),
                None => w.get_f32(&[*c, 1, width], &format!("{name}.weight"))?,
            };
            ws.push(t.to_dtype(DType::F32)?.reshape((*c, width))?);
        }
        Ok(Self { weight: Some(Tensor::cat(&ws, 0)?), channels, width, act })
    }

    /// The same convolution over the channels `ranges` only, in that order (one tensor
    /// parallel rank's q, k and v channels).
    pub fn select(&self, ranges: &[std::ops::Range<usize>]) -> Result<Self> {
        let channels = ranges.iter().map(|r| r.len()).sum();
        let weight = self.weight.as_ref().map(|w| crate::tensor_parallel::rows_at(w, ranges)).transpose()?;
        Ok(Self { weight, channels, width: self.width, act: self.act })
    }

    /// The same convolution on `dev`.
    pub fn to_device(&self, dev: &candle_core::Device) -> Result<Self> {
        Ok(Self { weight: self.weight.as_ref().map(|w| w.to_device(dev)).transpose()?, ..self.clone() })
    }

    /// Whether the conv's weights live on a GPU (no conv: false).
    pub fn on_gpu(&self) -> bool {
        self.weight.as_ref().is_some_and(|w| w.device().is_cuda())
    }

    /// Values of conv state per sequence: the last W inputs of each channel, `[C, W]`.
    pub fn state_len(&self) -> usize {
        self.channels * self.width
    }

    /// Prefill over packed sequences `x` `[ΣT, C]` (rows `cu[s]..cu[s+1]` continue the conv
    /// state of `slots[s]`, which they update). Returns `[ΣT, C]` in `out` (f32, or bf16 for a
    /// bf16 mixer).
    pub fn prefill(&self, x: &Tensor, states: &mut SlotBuffer, seqs: &Packed<'_>, out: DType) -> Result<Tensor> {
        match &self.weight {
            Some(wt) => Ok(ops::conv_prefill_packed(x, wt, states, seqs.cu, seqs.slots, self.act, seqs.captures, out, seqs.tables)?),
            None => Ok(self.without_conv(x)?.to_dtype(out)?),
        }
    }

    /// [`Self::prefill`] with the q and k of its output prepared in the same launch, where the
    /// GPU's fused pass takes these inputs ([`ops::conv_prepare_packed`]); `None` (nothing
    /// touched) elsewhere, and without a conv.
    pub fn prefill_prepared(
        &self,
        x: &Tensor,
        states: &mut SlotBuffer,
        seqs: &Packed<'_>,
        out: DType,
        inputs: ops::PrepareInputs<'_>,
    ) -> Result<Option<(ops::Prepared, Tensor)>> {
        let Some(wt) = &self.weight else { return Ok(None) };
        Ok(ops::conv_prepare_packed(x, wt, states, seqs.cu, seqs.slots, self.act, seqs.captures, out, seqs.tables, inputs)?)
    }

    /// One decode step over `x` `[B, C]` for `slots`. Returns `[B, C]` f32.
    pub fn decode(&self, x: &Tensor, states: &mut SlotBuffer, slots: StepSlots<'_>) -> Result<Tensor> {
        match &self.weight {
            Some(wt) => Ok(ops::conv_step(x, wt, states, slots, self.act)?),
            None => self.without_conv(x),
        }
    }

    /// A decode step of this conv over the first C columns of a projection, for the projection's
    /// kernel to run ([`ops::small_batch_add_norm_conv_linear`]); `None` without a conv.
    pub fn fold<'a, 's>(&'a self, states: &'a mut SlotBuffer, slots: StepSlots<'s>) -> Option<ops::ConvStepFold<'a, 's>> {
        Some(ops::ConvStepFold { weight: self.weight.as_ref()?, states, slots, act: self.act })
    }

    /// `use_short_conv: false`: the activation alone, f32.
    fn without_conv(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to_dtype(DType::F32)?;
        Ok(match self.act {
            ConvActivation::Silu => candle_nn::ops::silu(&x)?,
            ConvActivation::Identity => x,
        })
    }
}

/// Columns `offset..offset + heads·dim` of the conv output `c` `[N, C]` as `[N, heads, dim]`:
/// a strided view when `offset` and `C` are multiples of `dim` (no copy; the kernels that read
/// it convert or copy it once anyway), a copy otherwise.
pub fn heads_of(c: &Tensor, offset: usize, heads: usize, dim: usize) -> Result<Tensor> {
    let (n, channels) = c.dims2()?;
    if dim > 0 && offset.is_multiple_of(dim) && channels.is_multiple_of(dim) && c.is_contiguous() {
        return Ok(c.reshape((n, channels / dim, dim))?.narrow(1, offset / dim, heads)?);
    }
    Ok(c.narrow(1, offset, heads * dim)?.reshape((n, heads, dim))?)
}
