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
    /// inputs, as the blocks' are), which also sums a split projection's slices.
    pub fn add_forward(&self, res: &Residual, act: DType) -> Result<(Tensor, Tensor)> {
        Ok(match &res.delta {
            Some(Delta::Parts { parts, act: rounded }) if *rounded == act => {
                ops::add_rms_norm_parts(&res.h, parts, &self.weight, self.eps, act)?
            }
            Some(d) => ops::add_rms_norm(&res.h, Some(&d.clone().into_rows()?), &self.weight, self.eps, act)?,
            None => ops::add_rms_norm(&res.h, None, &self.weight, self.eps, act)?,
        })
    }
}

/// A sub-block's output `[N, D]`, to be added to the residual stream.
#[derive(Debug, Clone)]
pub enum Delta {
    /// The rows themselves, in the compute dtype.
    Rows(Tensor),
    /// A split-K projection's f32 slices `[S, N, D]` ([`ops::linear_parts`]), whose sum rounded
    /// to `act` is the rows: the next norm sums them as it reads them (one launch fewer).
    Parts {
        /// `[S, N, D]` f32.
        parts: Tensor,
        /// The compute dtype the sum is rounded to.
        act: DType,
    },
}

impl Delta {
    /// The rows `[N, D]` (a split projection's slices summed and rounded).
    pub fn into_rows(self) -> Result<Tensor> {
        match self {
            Self::Rows(t) => Ok(t),
            Self::Parts { parts, act } => Ok(ops::sum_parts(&parts, act)?),
        }
    }
}

/// The fp32 residual stream `h + delta`, the last sub-block's output `delta` (compute dtype)
/// not yet added: the add runs fused with the next norm.
pub struct Residual {
    /// The stream so far, f32.
    pub h: Tensor,
    /// The last sub-block's output, to be added.
    pub delta: Option<Delta>,
}

impl Residual {
    /// `h + delta` in fp32.
    pub fn sum(&self) -> Result<Tensor> {
        Ok(match &self.delta {
            Some(d) => (d.clone().into_rows()?.to_dtype(DType::F32)? + &self.h)?,
            None => self.h.clone(),
        })
    }

    /// `delta` as rows, if any (a split projection's slices summed).
    fn delta_rows(&self) -> Result<Option<Tensor>> {
        self.delta.clone().map(Delta::into_rows).transpose()
    }

    /// The same rows of `h` and `delta`, picked by `f`.
    pub fn rows(&self, f: impl Fn(&Tensor) -> candle_core::Result<Tensor>) -> Result<Self> {
        Ok(Self { h: f(&self.h)?, delta: self.delta_rows()?.as_ref().map(&f).transpose()?.map(Delta::Rows) })
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

    /// See [`NormedInput::project_swiglu`]; `None` for a formed `x`.
    pub fn project_swiglu(&self, l: &Linear, i: usize) -> Result<Option<Tensor>> {
        match self {
            Self::Formed(_) => Ok(None),
            Self::Normed(n) => n.project_swiglu(l, i),
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
        if let Some(delta) = self.fusable_delta(l) {
            if let Some((r, y)) = ops::small_batch_add_norm_linear(&self.res.h, delta, &self.norm.weight, self.norm.eps, l.weight())? {
                let _ = self.r.set(r);
                return Ok(y);
            }
        }
        super::linear::project(l, self.x()?)
    }

    /// SwiGLU of the fused `[gate | up]` projection `l` (`i` rows each) for a one-row decode
    /// step, formed inside that projection's kernel with the norm
    /// ([`ops::small_batch_add_norm_swiglu`]): `silu(g) · u` `[1, i]`, or `None` where it does not
    /// apply (nothing run).
    pub fn project_swiglu(&self, l: &Linear, i: usize) -> Result<Option<Tensor>> {
        let Some(delta) = self.fusable_delta(l) else { return Ok(None) };
        let Some((r, x)) = ops::small_batch_add_norm_swiglu(&self.res.h, delta, &self.norm.weight, self.norm.eps, l.weight(), i)? else {
            return Ok(None);
        };
        let _ = self.r.set(r);
        Ok(Some(x))
    }

    /// [`Self::project`] in f32 (the logits): where the GPU runs `l` as a GEMM, its f32
    /// accumulators as they are ([`ops::linear_f32`]); else the projection widened, whose bits
    /// the fused norm + GEMV kernel's f32 output also has.
    pub fn project_f32(&self, l: &Linear) -> Result<Tensor> {
        if l.bias().is_none() && self.res.h.dim(0)? > ops::ADD_NORM_LINEAR_MAX_ROWS {
            if let Some(y) = ops::linear_f32(self.x()?, l.weight())? {
                return Ok(y);
            }
        }
        Ok(ops::to_f32(&self.project(l)?)?)
    }

    /// [`Self::project_f32`] written into `out` (a decode step's logits in a CUDA graph's fixed
    /// buffer) by the projection's own kernel: the fused norm + GEMV kernel for a few rows, the
    /// GEMM from more; false where neither applies (nothing written).
    #[cfg(feature = "cuda")]
    pub fn project_f32_into(&self, l: &Linear, out: &Tensor) -> Result<bool> {
        if l.bias().is_none() && self.res.h.dim(0)? > ops::ADD_NORM_LINEAR_MAX_ROWS {
            return Ok(ops::linear_f32_into(self.x()?, l.weight(), out)?);
        }
        let Some(delta) = self.fusable_delta(l) else { return Ok(false) };
        let Some(r) = ops::small_batch_add_norm_linear_f32_into(&self.res.h, delta, &self.norm.weight, self.norm.eps, l.weight(), out)?
        else {
            return Ok(false);
        };
        let _ = self.r.set(r);
        Ok(true)
    }

    /// [`Self::project`] through the fused norm + GEMV kernel that also runs the decode step's
    /// short conv on the first columns ([`ops::small_batch_add_norm_conv_linear`]): `(y, conv
    /// output)`, or `None` where that kernel does not apply (nothing run, `conv` unused).
    pub fn project_conv(&self, l: &Linear, conv: ops::ConvStepFold<'_, '_>) -> Result<Option<(Tensor, Tensor)>> {
        let Some(delta) = self.fusable_delta(l) else { return Ok(None) };
        let Some((r, y, c)) =
            ops::small_batch_add_norm_conv_linear(&self.res.h, delta, &self.norm.weight, self.norm.eps, l.weight(), conv)?
        else {
            return Ok(None);
        };
        let _ = self.r.set(r);
        Ok(Some((y, c)))
    }

    /// `delta` for a kernel that forms the norm inside `l`'s projection: while nothing has
    /// formed it yet, `l` has no bias and its weight is in the compute dtype, and `delta` is
    /// rows (`Some(None)`: no delta). A split projection's slices come only from rows the
    /// fused kernels do not take.
    fn fusable_delta(&self, l: &Linear) -> Option<Option<&Tensor>> {
        if self.r.get().is_some() || l.bias().is_some() || l.weight().dtype() != self.act {
            return None;
        }
        match &self.res.delta {
            None => Some(None),
            Some(Delta::Rows(d)) => Some(Some(d)),
            Some(Delta::Parts { .. }) => None,
        }
    }

    /// The residual stream `h + delta` (f32).
    pub fn residual(&self) -> Result<Tensor> {
        match self.r.get() {
            Some(r) => Ok(r.clone()),
            None => self.res.sum(),
        }
    }
}
