//! Launcher of the small-batch projection `y = x Wᵀ` (a decode step's projections).

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{alloc_rows, cuda_dev, first_element_address_any, grid, ptx, sm_count, RowsArg};
use crate::Result;

/// Most rows of x the kernels take (`gemv_{dtype}_b1` .. `_b8` in gemv.cu).
const GEMV_MAX_ROWS: usize = 8;
/// Output rows a warp computes (`GEMV_ROWS`), warps a block (`part`'s first dim).
const ROWS_PER_WARP: usize = 2;
const WARPS: usize = 8;

/// `x` `[B, K]` (rows may be a column slice) times `w` `[N, K]`ᵀ, both bf16 or both f16, with
/// B ≤ [`GEMV_MAX_ROWS`], in one pass over `w`. Returns `[B, N]` in their dtype, or `None` when
/// the inputs are not the kernel's (other dtypes, B, layouts, or K not a multiple of 8).
pub fn gemv(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    let Some((b, n, k, suffix)) = accepts(x, w)? else { return Ok(None) };
    let xa = RowsArg::new(x)?;
    let Some(wa) = vector_rows(w, k)?.filter(|_| xa.vectorisable(8, k)) else { return Ok(None) };
    launch(x, &format!("gemv_{suffix}_b{b}"), (b, n, k), XArgs::Plain { x: xa.ptr, ld: xa.ld }, &wa)
}

/// [`gemv`] of `silu(gate) · up` (rounded to their dtype, as [`super::swiglu`] stores it) for
/// `gate`, `up` `[B, I]` with one row stride (the halves of the MLP's fused projection): the
/// down projection of a decode step without materialising its input. `None` where [`gemv`]
/// would decline, or when the row strides differ.
pub fn gemv_swiglu(gate: &Tensor, up: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    let Some((b, n, k, suffix)) = accepts(gate, w)? else { return Ok(None) };
    if up.dims() != gate.dims() || up.dtype() != gate.dtype() {
        return Ok(None);
    }
    let (ga, ua) = (RowsArg::new(gate)?, RowsArg::new(up)?);
    if ga.ld != ua.ld || !ga.vectorisable(8, k) || !ua.vectorisable(8, k) {
        return Ok(None);
    }
    let Some(wa) = vector_rows(w, k)? else { return Ok(None) };
    launch(gate, &format!("gemv_swiglu_{suffix}_b{b}"), (b, n, k), XArgs::Swiglu { gate: ga.ptr, up: ua.ptr, ld: ga.ld }, &wa)
}

/// `(B, N, K, dtype suffix)` when `x` `[B, K]` and `w` `[N, K]` suit the kernels' shapes and
/// dtypes.
fn accepts(x: &Tensor, w: &Tensor) -> Result<Option<(usize, usize, usize, &'static str)>> {
    let (Ok((b, k)), Ok((n, kw))) = (x.dims2(), w.dims2()) else { return Ok(None) };
    let suffix = match x.dtype() {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => return Ok(None),
    };
    let fits = w.dtype() == x.dtype() && kw == k && b > 0 && b <= GEMV_MAX_ROWS && n > 0 && w.is_contiguous() && k.is_multiple_of(8);
    Ok(fits.then_some((b, n, k, suffix)))
}

/// `w`'s rows when every one starts 16-byte aligned.
fn vector_rows(w: &Tensor, k: usize) -> Result<Option<RowsArg>> {
    let wa = RowsArg::new(w)?;
    Ok(wa.vectorisable(8, k).then_some(wa))
}

/// Slices of K (1, 2, 4 or 8) for `n` output rows and `b` rows of x: the fewest that make at
/// least three blocks an SM, keeping two or more 256-column steps a warp, and at most two when
/// `b` > 4 (more rows of x already keep a warp's loads busy; on the H100, I=5632 → 2048:
/// B=1..4 fastest at 4 slices, B=8 at 2). `DELTASERVE_GEMV_SPLITS` fixes it (for benchmarks).
fn k_splits(n: usize, k: usize, b: usize, sms: usize) -> usize {
    static WANTED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let wanted = *WANTED.get_or_init(|| std::env::var("DELTASERVE_GEMV_SPLITS").ok().and_then(|v| v.parse().ok()));
    if let Some(s) = wanted.filter(|s| [1, 2, 4, 8].contains(s)) {
        return s;
    }
    let (steps, cap) = (k.div_ceil(256), if b > 4 { 2 } else { 8 });
    let allowed = |s: usize| s == 1 || (s <= cap && steps >= 2 * s);
    let blocks = |s: usize| (n * s).div_ceil(ROWS_PER_WARP * WARPS);
    // The allowed splits rise in powers of two; past three blocks an SM stop there, and rows too
    // few for that at any split take the most slices allowed.
    let mut s = 1;
    while blocks(s) < 3 * sms && s < 8 && allowed(2 * s) {
        s *= 2;
    }
    s
}

/// The kernels' leading arguments: where x's rows come from.
enum XArgs {
    /// `(x, ldx)`.
    Plain { x: u64, ld: i64 },
    /// `(gate, up, ld)`.
    Swiglu { gate: u64, up: u64, ld: i64 },
}

/// Launches `name` with `x_args`, then `(w, y, N, K, splits)`; returns `y` `[B, N]`.
fn launch(x: &Tensor, name: &str, (b, n, k): (usize, usize, usize), x_args: XArgs, wa: &RowsArg) -> Result<Option<Tensor>> {
    let dev = cuda_dev(x, "gemv")?;
    let y = alloc_rows(&dev, x.dtype(), b, n)?;
    let f = dev.get_or_load_custom_func(name, "gemv", ptx::GEMV)?;
    let y_ptr = first_element_address_any(&y)?;
    let splits = k_splits(n, k, b, sm_count(&dev)?);
    let (ni, ki, si) = (n as i32, k as i32, splits as i32);
    let mut l = f.builder();
    match &x_args {
        XArgs::Plain { x, ld } => l.arg(x).arg(ld),
        XArgs::Swiglu { gate, up, ld } => l.arg(gate).arg(up).arg(ld),
    };
    l.arg(&wa.ptr).arg(&y_ptr).arg(&ni).arg(&ki).arg(&si);
    let blocks = (n * splits).div_ceil(ROWS_PER_WARP * WARPS);
    unsafe { l.launch(grid(blocks, 1, 1, (32 * WARPS) as u32, 0)) }.w()?;
    Ok(Some(y))
}
