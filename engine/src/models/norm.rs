//! fla's RMSNorm and the fp32 residual stream it closes (model-spec.md §1.3 "Block").

use candle_core::{DType, Tensor};

use crate::error::Result;
use crate::weights::Weights;

/// fla RMSNorm: `x / sqrt(mean(x²) + eps) · w`, computed in fp32.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `[D]` f32.
    pub(crate) weight: Tensor,
    pub(crate) eps: f32,
}

impl RmsNorm {
    /// Loads `weight` `[dim]`.
    pub fn load(w: &Weights<'_>, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self { weight: w.get_f32(&[dim], "weight")?, eps: eps as f32 })
    }

    /// Loads a zero-centred norm (`x̂·(1 + w)`, transformers' Qwen3.5): `1 + w` in fp32 once.
    pub fn load_zero_centred(w: &Weights<'_>, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self { weight: (w.get_f32(&[dim], "weight")? + 1.0)?, eps: eps as f32 })
    }

    /// `norm(x)` in fp32, returned f32 (post-norm blocks normalise a sub-block's output).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(&x.to_dtype(DType::F32)?.contiguous()?, &self.weight, self.eps)?)
    }

    /// Completes the residual stream (`r = h + delta`, fp32) and normalises it into the compute
    /// dtype `act`: returns `(r, norm(r) as act)`. One fused kernel on a GPU (for contiguous
    /// inputs, as the blocks' are).
    pub fn add_forward(&self, res: &Residual, act: DType) -> Result<(Tensor, Tensor)> {
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
        let x = candle_nn::ops::rms_norm(&r, &self.weight, self.eps)?.to_dtype(act)?;
        Ok((r, x))
    }
}

/// The fp32 residual stream `h + delta`, the last sub-block's output `delta` (compute dtype)
/// not yet added: the add runs fused with the next norm.
pub struct Residual {
    /// The stream so far, f32.
    pub h: Tensor,
    /// The last sub-block's output, to be added.
    pub delta: Option<Tensor>,
}

impl Residual {
    /// `h + delta` in fp32.
    pub fn sum(&self) -> Result<Tensor> {
        Ok(match &self.delta {
            Some(d) => (d.to_dtype(DType::F32)? + &self.h)?,
            None => self.h.clone(),
        })
    }

    /// The same rows of `h` and `delta`, picked by `f`.
    pub fn rows(&self, f: impl Fn(&Tensor) -> candle_core::Result<Tensor>) -> Result<Self> {
        Ok(Self { h: f(&self.h)?, delta: self.delta.as_ref().map(&f).transpose()? })
    }
}
