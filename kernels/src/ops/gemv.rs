//! The MLP's SwiGLU and the small-batch projections of a decode step (GPU kernels that stream
//! each weight once; elsewhere the caller's GEMM runs).

use candle_core::Tensor;

use super::{dims2, expect_dims};
use crate::Result;

/// SwiGLU `silu(gate) · up` for `gate`, `up` `[N, I]`, in their dtype. On the GPU one kernel
/// reads column slices of a fused projection in place and rounds once from fp32 (fla's fused
/// `swiglu`); the CPU runs candle's `silu` and multiply.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    const OP: &str = "swiglu";
    let (n, i) = dims2(OP, "gate", gate)?;
    expect_dims(OP, "up", up, &[n, i])?;
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() {
        return crate::cuda::swiglu(gate, up);
    }
    Ok((gate.silu()? * up.to_dtype(gate.dtype())?)?)
}

/// `x Wᵀ` for `x` `[B, K]` and `w` `[N, K]` when B is small: on the GPU, for B ≤ 8 and bf16
/// or f16 inputs, one kernel that streams `w` once (a decode step's projections, where cuBLAS's
/// GEMV kernels stream the weights at 35–80% of copy bandwidth). `None` where that kernel does
/// not apply (the CPU, larger B, other dtypes or layouts), or when `DELTASERVE_SMALL_BATCH_GEMV=0`
/// turns it off (for comparisons): the caller runs its GEMM.
pub fn small_batch_linear(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && w.device().is_cuda() {
        if small_batch_gemv_off() {
            return Ok(None);
        }
        return crate::cuda::gemv(x, w);
    }
    let _ = (x, w);
    Ok(None)
}

/// `silu(gate) · up` times `w`ᵀ (the MLP's down projection) for `gate`, `up` `[B, I]` with
/// B ≤ [`SWIGLU_LINEAR_MAX_ROWS`]: on the GPU, under the conditions of [`small_batch_linear`]
/// (and gate and up sharing a row stride, as the halves of one projection do), one kernel that
/// forms each row of the product as it streams `w`, rounded as [`swiglu`] would store it, so the
/// result equals `small_batch_linear(&swiglu(gate, up)?, w)`. `None` where it does not apply:
/// the caller runs the two steps.
pub fn small_batch_swiglu_linear(gate: &Tensor, up: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() && w.device().is_cuda() {
        if small_batch_gemv_off() || gate.dim(0)? > SWIGLU_LINEAR_MAX_ROWS {
            return Ok(None);
        }
        return crate::cuda::gemv_swiglu(gate, up, w);
    }
    let _ = (gate, up, w);
    Ok(None)
}

/// Most rows [`small_batch_swiglu_linear`] fuses. Every warp recomputes the SwiGLU of the x
/// elements it reads; with more rows that costs more than the launch it saves (H100, I=5632 →
/// 2048: fused 16.5 / 17.7 µs against 19.3 / 19.6 µs apart at B = 1 / 2, 35.6 against 20.1 µs
/// at B = 4).
pub const SWIGLU_LINEAR_MAX_ROWS: usize = 2;

/// `DELTASERVE_SMALL_BATCH_GEMV=0`: the small-batch kernels stand aside (for comparisons).
#[cfg(feature = "cuda")]
fn small_batch_gemv_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_SMALL_BATCH_GEMV").is_ok_and(|v| v == "0"))
}
