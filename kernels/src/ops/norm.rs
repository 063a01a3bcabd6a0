//! The gated output RMSNorm (model-spec.md §1.3 step 9).

use candle_core::{DType, Tensor};

use super::cpu_f32;
use crate::cpu::norm;
use crate::{GateActivation, KernelError, Result};

/// Output RMSNorm over the last dim `D` of `x` (f32), gated by `z` when given (§1.3 step 9),
/// in fp32 and rounded once to `dtype`. `z` is `x`'s shape, or `[N, H·D]` holding `N·H` rows of
/// `x` (`g_proj`'s columns of the fused input projection: the GPU reads them in place).
pub fn gated_rms_norm(x: &Tensor, z: Option<&Tensor>, weight: &Tensor, eps: f32, act: GateActivation, dtype: DType) -> Result<Tensor> {
    const OP: &str = "gated_rms_norm";
    let dim = weight.dims1().map_err(|_| KernelError::Shape {
        op: OP,
        input: "weight",
        expected: "rank 1".into(),
        actual: weight.dims().to_vec(),
    })?;
    if x.dims().last() != Some(&dim) {
        return Err(KernelError::Shape { op: OP, input: "x", expected: format!("last dim {dim}"), actual: x.dims().to_vec() });
    }
    if let Some(z) = z {
        let rows_of_x = z.rank() == 2 && z.elem_count() == x.elem_count() && dim > 0 && z.dim(1)?.is_multiple_of(dim);
        if z.dims() != x.dims() && !rows_of_x {
            return Err(KernelError::Shape {
                op: OP,
                input: "z",
                expected: format!("{:?}, or [N, H·{dim}] with as many elements", x.dims()),
                actual: z.dims().to_vec(),
            });
        }
    }
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return crate::cuda::gated_rms_norm(x, z, weight, eps, act == GateActivation::Sigmoid, dtype)?.to_dtype(dtype).map_err(Into::into);
    }
    let mut v = cpu_f32(OP, x)?;
    let zs = z.map(|z| cpu_f32(OP, z)).transpose()?;
    norm::gated_rms_norm(&mut v, zs.as_deref(), &cpu_f32(OP, weight)?, eps, act);
    Ok(Tensor::from_vec(v, x.shape(), x.device())?.to_dtype(dtype)?)
}

/// The seam between pre-norm sub-blocks (fla's fused add + RMSNorm): `r = h + delta` in fp32
/// and `x = r / sqrt(mean(r²) + eps) · weight` rounded to `dtype`, for `h` `[N, D]` f32 and
/// `delta` `[N, D]` (or none). Returns `(r, x)`. One kernel on the GPU for contiguous inputs with
/// `delta` in `dtype`; candle's ops otherwise.
pub fn add_rms_norm(h: &Tensor, delta: Option<&Tensor>, weight: &Tensor, eps: f32, dtype: DType) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if h.device().is_cuda() {
        if let Some(out) = crate::cuda::add_rms_norm(h, delta, weight, eps, dtype)? {
            return Ok(out);
        }
    }
    let r = match delta {
        Some(d) => (d.to_dtype(DType::F32)? + h)?,
        None => h.clone(),
    };
    let x = candle_nn::ops::rms_norm(&r, weight, eps)?.to_dtype(dtype)?;
    Ok((r, x))
}

/// [`add_rms_norm`] with `delta` given as f32 partial sums `parts` `[S, N, D]` (a split-K GEMM's
/// slices, [`linear_parts`](super::linear_parts)): `delta` is their sum in slice order, rounded
/// to `dtype` as the GEMM's reduce would store it. One kernel on the GPU for contiguous inputs;
/// candle's ops otherwise.
pub fn add_rms_norm_parts(h: &Tensor, parts: &Tensor, weight: &Tensor, eps: f32, dtype: DType) -> Result<(Tensor, Tensor)> {
    let (rows, d) = h.dims2()?;
    if parts.rank() != 3 || parts.dims()[1..] != [rows, d] {
        return Err(KernelError::Shape {
            op: "add_rms_norm_parts",
            input: "parts",
            expected: format!("[S, {rows}, {d}]"),
            actual: parts.dims().to_vec(),
        });
    }
    #[cfg(feature = "cuda")]
    if h.device().is_cuda() {
        if let Some(out) = crate::cuda::add_rms_norm_parts(h, parts, weight, eps, dtype)? {
            return Ok(out);
        }
    }
    let delta = sum_parts(parts, dtype)?;
    add_rms_norm(h, Some(&delta), weight, eps, dtype)
}

/// The sum of `parts` `[S, N, D]` over S in slice order (f32), rounded to `dtype`.
pub fn sum_parts(parts: &Tensor, dtype: DType) -> Result<Tensor> {
    let parts = parts.to_dtype(DType::F32)?;
    let mut sum = parts.get(0)?;
    for s in 1..parts.dim(0)? {
        sum = (sum + parts.get(s)?)?;
    }
    Ok(sum.to_dtype(dtype)?)
}
