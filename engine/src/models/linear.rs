//! Projections as the layers run them ([`deltaserve_kernels::ops::linear`]: batch-invariant on
//! the CPU, a decode step's few rows through the small-batch GEMV kernel on the GPU), and
//! several projections of one input stacked into one GEMM.

use candle_core::{Device, Tensor};
use candle_nn::Linear;

use super::batch::Keep;
use super::norm::Delta;
use crate::error::Result;
use crate::weights::Weights;

/// Loads a bias-free linear layer `[out, in]`.
pub fn linear(w: &Weights<'_>, out_dim: usize, in_dim: usize, name: &str) -> Result<Linear> {
    Ok(Linear::new(w.get(&[out_dim, in_dim], name)?, None))
}

/// `l` with its weight (and bias) copied to `dev`.
pub fn linear_to(l: &Linear, dev: &Device) -> Result<Linear> {
    Ok(Linear::new(l.weight().to_device(dev)?, l.bias().map(|b| b.to_device(dev)).transpose()?))
}

/// `l`'s forward for inference, through [`deltaserve_kernels::ops::linear`] (its bias, if any,
/// added after).
pub fn project(l: &Linear, x: &Tensor) -> Result<Tensor> {
    let y = deltaserve_kernels::ops::linear(x, l.weight())?;
    Ok(match l.bias() {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

/// [`project`] for a sub-block's last projection, whose output the next norm adds to the
/// residual stream: where the GPU's GEMM splits K, its f32 slices unsummed ([`Delta::Parts`]:
/// the norm sums them, so the GEMM's reduce launch does not run); else the rows.
pub fn project_delta(l: &Linear, x: &Tensor) -> Result<Delta> {
    if l.bias().is_none() {
        if let Some(parts) = deltaserve_kernels::ops::linear_parts(x, l.weight())? {
            return Ok(Delta::Parts { parts, act: x.dtype() });
        }
    }
    Ok(Delta::Rows(project(l, x)?))
}

/// Rows a fused projection's weight is padded to a multiple of on a GPU.
const GPU_ROW_MULTIPLE: usize = 64;

/// Projections of one input run as one GEMM: their weights stacked by rows.
#[derive(Debug, Clone)]
pub struct FusedInput {
    weight: Linear,
    /// Row offset of each part in the stacked weight, and the total last.
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

    /// Rows `start..start + len` of every part (a view).
    pub fn rows(&self, start: usize, len: usize) -> Result<Self> {
        Ok(Self { y: self.y.narrow(0, start, len)?, offsets: self.offsets })
    }

    /// The `keep` rows of every part (a copy of those rows only).
    pub fn keep(&self, keep: Keep<'_>) -> Result<Self> {
        Ok(Self { y: keep.rows(self.y.clone())?, offsets: self.offsets })
    }
}

impl FusedInput {
    /// Stacks `parts` (each `[out_i, D]`) in order.
    pub fn new(parts: &[&Linear]) -> Result<Self> {
        let weight = Tensor::cat(&parts.iter().map(|l| l.weight()).collect::<Vec<_>>(), 0)?;
        let mut offsets = vec![0];
        for l in parts {
            offsets.push(offsets[offsets.len() - 1] + l.weight().dim(0)?);
        }
        Self::stacked(weight, offsets)
    }

    /// The stacked `weight` (rows `offsets`), padded where it lives on a GPU.
    fn stacked(mut weight: Tensor, offsets: Vec<usize>) -> Result<Self> {
        let (rows, cols) = weight.dims2()?;
        let padded = rows.next_multiple_of(GPU_ROW_MULTIPLE);
        if weight.device().is_cuda() && padded > rows {
            // cuBLAS runs a GEMM whose output rows are not 16-byte aligned on slow kernels: fla's
            // 6-head layers fuse to 9228 rows (q, k, v, g and 6 + 6 for a, b), 3.1× slower at 512
            // tokens than 9280. The zero rows' outputs are never read.
            weight = Tensor::cat(&[weight.clone(), Tensor::zeros((padded - rows, cols), weight.dtype(), weight.device())?], 0)?;
        }
        Ok(Self { weight: Linear::new(weight, None), offsets })
    }

    /// The same projections on `dev` (padded there as [`Self::new`] pads).
    pub fn to_device(&self, dev: &Device) -> Result<Self> {
        let rows = self.offsets[self.offsets.len() - 1];
        Self::stacked(self.weight.weight().narrow(0, 0, rows)?.to_device(dev)?, self.offsets.clone())
    }

    /// `x` `[N, D]` through every part at once.
    pub fn forward(&self, x: &Tensor) -> Result<FusedOutput<'_>> {
        Ok(FusedOutput { y: project(&self.weight, x)?, offsets: &self.offsets })
    }

    /// `x` (formed, or a norm the first projection forms) through every part at once.
    pub fn forward_input(&self, x: &super::norm::SubInput<'_>) -> Result<FusedOutput<'_>> {
        Ok(FusedOutput { y: x.project(&self.weight)?, offsets: &self.offsets })
    }

    /// [`Self::forward_input`] of a decode step whose kernel also runs `conv`, the short conv over
    /// the first columns, where it applies (the fused norm + GEMV of 1–2 rows, the skinny GEMM
    /// past the GEMV kernels' rows): then with the conv's output `[N, C]` f32.
    pub fn forward_input_conv(
        &self,
        x: &super::norm::SubInput<'_>,
        conv: deltaserve_kernels::ops::ConvStepFold<'_, '_>,
    ) -> Result<(FusedOutput<'_>, Option<Tensor>)> {
        let folded = if x.rows()? > deltaserve_kernels::ops::SMALL_BATCH_LINEAR_MAX_ROWS {
            // Past the GEMV kernels' rows: the skinny GEMM's epilogue runs the conv.
            deltaserve_kernels::ops::skinny_conv_linear(x.x()?, self.weight.weight(), conv)?
        } else {
            match x {
                super::norm::SubInput::Normed(n) => n.project_conv(&self.weight, conv)?,
                super::norm::SubInput::Formed(_) => None,
            }
        };
        Ok(match folded {
            Some((y, c)) => (FusedOutput { y, offsets: &self.offsets }, Some(c)),
            None => (self.forward_input(x)?, None),
        })
    }

    /// The stacked projection (padded rows included).
    pub fn linear(&self) -> &Linear {
        &self.weight
    }

    /// Where part `i` starts, in rows of the stacked weight.
    pub fn offset(&self, i: usize) -> usize {
        self.offsets[i]
    }

    /// How many parts are stacked.
    pub fn parts(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Part `i`'s weight `[out_i, D]`, a view of the stacked weight (no copy).
    pub fn weight(&self, i: usize) -> Result<Tensor> {
        Ok(self.weight.weight().narrow(0, self.offsets[i], self.offsets[i + 1] - self.offsets[i])?)
    }
}
