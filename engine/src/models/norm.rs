//! fla's RMSNorm and the fp32 residual stream it closes (model-spec.md §1.3 "Block").

use candle_core::{DType, Tensor};
use candle_nn::Linear;
use deltaserve_kernels::ops;

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

    /// The same norm on `dev`.
    pub fn to_device(&self, dev: &candle_core::Device) -> Result<Self> {
        Ok(Self { weight: self.weight.to_device(dev)?, eps: self.eps })
    }

    /// `norm(x)` in fp32, returned f32 (post-norm blocks normalise a sub-block's output).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(&x.to_dtype(DType::F32)?.contiguous()?, &self.weight, self.eps)?)
    }

    /// Completes the residual stream (`r = h + delta`, fp32) and normalises it into the compute
    /// dtype `act`: returns `(r, norm(r) as act)`. One fused kernel on a GPU (for contiguous
    /// inputs, as the blocks' are).
    pub fn add_forward(&self, res: &Residual, act: DType) -> Result<(Tensor, Tensor)> {
        Ok(ops::add_rms_norm(&res.h, res.delta.as_ref(), &self.weight, self.eps, act)?)
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

/// A sub-block's input `x` `[N, D]` in the compute dtype: formed already, or a pre-norm block's
/// `norm(h + delta)` not formed yet ([`NormedInput`]).
pub enum SubInput<'a> {
    /// `x` itself.
    Formed(Tensor),
    /// `x` to be formed by its first reader.
    Normed(&'a NormedInput<'a>),
}

impl SubInput<'_> {
    /// The compute dtype of `x`.
    pub fn dtype(&self) -> DType {
        match self {
            Self::Formed(x) => x.dtype(),
            Self::Normed(n) => n.act,
        }
    }

    /// `N`.
    pub fn rows(&self) -> Result<usize> {
        Ok(match self {
            Self::Formed(x) => x.dim(0)?,
            Self::Normed(n) => n.res.h.dim(0)?,
        })
    }

    /// `x`, formed now if it was not.
    pub fn x(&self) -> Result<&Tensor> {
        match self {
            Self::Formed(x) => Ok(x),
            Self::Normed(n) => n.x(),
        }
    }

    /// `x Wᵀ` (and `l`'s bias); see [`NormedInput::project`].
    pub fn project(&self, l: &Linear) -> Result<Tensor> {
        match self {
            Self::Formed(x) => super::linear::project(l, x),
            Self::Normed(n) => n.project(l),
        }
    }
}

/// A pre-norm sub-block's input `norm(h + delta)` and the residual `r = h + delta` it closes,
/// formed when first read. A decode step's first projection forms both inside its GEMV kernel
/// ([`ops::small_batch_add_norm_linear`]: one launch and one round trip of `x` fewer per norm,
/// the same bits); anything else forms them once with [`RmsNorm::add_forward`].
pub struct NormedInput<'a> {
    res: &'a Residual,
    norm: &'a RmsNorm,
    act: DType,
    x: std::cell::OnceCell<Tensor>,
    /// `h + delta` (f32), once the norm has run.
    r: std::cell::OnceCell<Tensor>,
}

impl<'a> NormedInput<'a> {
    /// `norm(res.h + res.delta)` in `act`.
    pub fn new(res: &'a Residual, norm: &'a RmsNorm, act: DType) -> Self {
        Self { res, norm, act, x: std::cell::OnceCell::new(), r: std::cell::OnceCell::new() }
    }

    /// `x`, formed now if it was not.
    pub fn x(&self) -> Result<&Tensor> {
        if let Some(x) = self.x.get() {
            return Ok(x);
        }
        let (r, x) = self.norm.add_forward(self.res, self.act)?;
        let _ = self.r.set(r);
        Ok(self.x.get_or_init(|| x))
    }

    /// `x Wᵀ` (and `l`'s bias): through the fused norm + GEMV kernel while nothing has formed
    /// the norm yet and the rows are a decode step's, else through [`super::linear::project`].
    pub fn project(&self, l: &Linear) -> Result<Tensor> {
        if self.r.get().is_none() && l.bias().is_none() && l.weight().dtype() == self.act {
            let (h, delta) = (&self.res.h, self.res.delta.as_ref());
            if let Some((r, y)) = ops::small_batch_add_norm_linear(h, delta, &self.norm.weight, self.norm.eps, l.weight())? {
                let _ = self.r.set(r);
                return Ok(y);
            }
        }
        super::linear::project(l, self.x()?)
    }

    /// [`Self::project`] widened to f32 into `out` (a decode step's logits in a CUDA graph's
    /// fixed buffer) by the fused norm + GEMV kernel itself, the bits of the projection then
    /// [`ops::to_f32_into`]; false where that kernel does not apply (nothing written).
    #[cfg(feature = "cuda")]
    pub fn project_f32_into(&self, l: &Linear, out: &Tensor) -> Result<bool> {
        if self.r.get().is_some() || l.bias().is_some() || l.weight().dtype() != self.act {
            return Ok(false);
        }
        let (h, delta) = (&self.res.h, self.res.delta.as_ref());
        let Some(r) = ops::small_batch_add_norm_linear_f32_into(h, delta, &self.norm.weight, self.norm.eps, l.weight(), out)? else {
            return Ok(false);
        };
        let _ = self.r.set(r);
        Ok(true)
    }

    /// [`Self::project`] through the fused norm + GEMV kernel that also runs the decode step's
    /// short conv on the first columns ([`ops::small_batch_add_norm_conv_linear`]): `(y, conv
    /// output)`, or `None` where that kernel does not apply (nothing run, `conv` unused).
    pub fn project_conv(&self, l: &Linear, conv: ops::ConvStepFold<'_, '_>) -> Result<Option<(Tensor, Tensor)>> {
        if self.r.get().is_some() || l.bias().is_some() || l.weight().dtype() != self.act {
            return Ok(None);
        }
        let (h, delta) = (&self.res.h, self.res.delta.as_ref());
        let Some((r, y, c)) = ops::small_batch_add_norm_conv_linear(h, delta, &self.norm.weight, self.norm.eps, l.weight(), conv)? else {
            return Ok(None);
        };
        let _ = self.r.set(r);
        Ok(Some((y, c)))
    }

    /// The residual stream `h + delta` (f32).
    pub fn residual(&self) -> Result<Tensor> {
        match self.r.get() {
            Some(r) => Ok(r.clone()),
            None => self.res.sum(),
        }
    }
}
