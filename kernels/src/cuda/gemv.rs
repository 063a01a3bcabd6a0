//! Launcher of the small-batch projection `y = x Wᵀ` (a decode step's projections).

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{alloc_rows, cuda_dev, first_element_address_any, grid, ptx, RowsArg};
use crate::Result;

/// Most rows of x the kernels take (`gemv_{dtype}_b1` .. `_b8` in gemv.cu).
const GEMV_MAX_ROWS: usize = 8;
/// Output rows a warp computes (`GEMV_ROWS`), warps a block.
const ROWS_PER_WARP: usize = 2;
const WARPS: usize = 8;

/// `x` `[B, K]` (rows may be a column slice) times `w` `[N, K]`ᵀ, both bf16 or both f16, with
/// B ≤ [`GEMV_MAX_ROWS`], in one pass over `w`. Returns `[B, N]` in their dtype, or `None` when
/// the inputs are not the kernel's (other dtypes, B, layouts, or K not a multiple of 8).
pub fn gemv(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    let (Ok((b, k)), Ok((n, kw))) = (x.dims2(), w.dims2()) else { return Ok(None) };
    let suffix = match x.dtype() {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => return Ok(None),
    };
    if w.dtype() != x.dtype() || kw != k || b == 0 || b > GEMV_MAX_ROWS || n == 0 || !w.is_contiguous() || !k.is_multiple_of(8) {
        return Ok(None);
    }
    let (xa, wa) = (RowsArg::new(x)?, RowsArg::new(w)?);
    if !xa.vectorisable(8, k) || !wa.vectorisable(8, k) {
        return Ok(None);
    }
    let dev = cuda_dev(x, "gemv")?;
    let y = alloc_rows(&dev, x.dtype(), b, n)?;
    let f = dev.get_or_load_custom_func(&format!("gemv_{suffix}_b{b}"), "gemv", ptx::GEMV)?;
    let y_ptr = first_element_address_any(&y)?;
    let (ni, ki) = (n as i32, k as i32);
    let mut l = f.builder();
    l.arg(&xa.ptr).arg(&xa.ld).arg(&wa.ptr).arg(&y_ptr).arg(&ni).arg(&ki);
    unsafe { l.launch(grid(n.div_ceil(ROWS_PER_WARP * WARPS), 1, 1, (32 * WARPS) as u32, 0)) }.w()?;
    Ok(Some(y))
}
