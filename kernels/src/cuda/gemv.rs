//! Launcher of the small-batch projection `y = x Wᵀ` (a decode step's projections).

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{alloc_rows, cuda_dev, first_element_address_any, func, grid, modules, sm_count, RowsArg};
use crate::{KernelError, Result};

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
    launch_rows(x, &format!("gemv_{suffix}_b{b}"), (b, n, k), XArgs::Plain { x: xa.ptr, ld: xa.ld }, &wa).map(Some)
}

/// `x` `[M, K]` times `w` `[N, K]`ᵀ for any M, bf16 or f16, each row of the result the same bits
/// whatever M and wherever the row sits in `x`: rows in groups of 8 through the GEMV kernel (a
/// row's sums never depend on the rows beside it) with the K split chosen for 8 rows, whatever
/// M. The batch-invariant mode's projection; errors name what the kernel cannot take.
pub fn gemv_invariant(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "linear (batch-invariant)";
    let (m, k) = x.dims2()?;
    let (n, kw) = w.dims2()?;
    let suffix = match (x.dtype(), w.dtype()) {
        (DType::BF16, DType::BF16) => "bf16",
        (DType::F16, DType::F16) => "f16",
        (a, b) => return Err(KernelError::Unsupported { op: OP, what: format!("x {a:?} with w {b:?} (bf16 or f16 both)") }),
    };
    if kw != k || !k.is_multiple_of(8) || n == 0 {
        return Err(KernelError::Shape {
            op: OP,
            input: "w",
            expected: format!("[N ≥ 1, {k}] with {k} a multiple of 8"),
            actual: vec![n, kw],
        });
    }
    let w = if w.is_contiguous() { w.clone() } else { w.contiguous()? };
    let Some(wa) = vector_rows(&w, k)? else {
        return Err(KernelError::Unsupported { op: OP, what: "weight rows not 16-byte aligned".into() });
    };
    let x = if RowsArg::new(x)?.vectorisable(8, k) { x.clone() } else { x.contiguous()? };
    let xa = RowsArg::new(&x)?;
    let dev = cuda_dev(&x, "gemv")?;
    let y = alloc_rows(&dev, x.dtype(), m, n)?;
    let splits = k_splits(n, k, GEMV_MAX_ROWS, sm_count(&dev)?);
    let (full, tail) = (m / GEMV_MAX_ROWS, m % GEMV_MAX_ROWS);
    let elem = x.dtype().size_in_bytes();
    if full > 0 {
        let name = format!("gemv_{suffix}_b{GEMV_MAX_ROWS}");
        launch(&x, &name, (full, GEMV_MAX_ROWS, n, k), splits, XArgs::Plain { x: xa.ptr, ld: xa.ld }, &wa, &y, 0)?;
    }
    if tail > 0 {
        let rows = full * GEMV_MAX_ROWS;
        let at = xa.ptr + (rows as u64) * (xa.ld as u64) * elem as u64;
        launch(
            &x,
            &format!("gemv_{suffix}_b{tail}"),
            (1, tail, n, k),
            splits,
            XArgs::Plain { x: at, ld: xa.ld },
            &wa,
            &y,
            rows * n * elem,
        )?;
    }
    Ok(y)
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
    let args = XArgs::Swiglu { gate: ga.ptr, up: ua.ptr, ld: ga.ld };
    launch_rows(gate, &format!("gemv_swiglu_{suffix}_b{b}"), (b, n, k), args, &wa).map(Some)
}

/// `(B, N, K, dtype suffix)` when `x` `[B, K]` and `w` `[N, K]` suit the kernels' shapes and
/// dtypes.
pub(super) fn accepts(x: &Tensor, w: &Tensor) -> Result<Option<(usize, usize, usize, &'static str)>> {
    let Ok((b, k)) = x.dims2() else { return Ok(None) };
    accepts_rows(b, k, x.dtype(), w)
}

/// [`accepts`] for `b` rows of `k` elements of `dtype`.
pub(super) fn accepts_rows(b: usize, k: usize, dtype: DType, w: &Tensor) -> Result<Option<(usize, usize, usize, &'static str)>> {
    let Ok((n, kw)) = w.dims2() else { return Ok(None) };
    let suffix = match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => return Ok(None),
    };
    let fits = w.dtype() == dtype && kw == k && b > 0 && b <= GEMV_MAX_ROWS && n > 0 && w.is_contiguous() && k.is_multiple_of(8);
    Ok(fits.then_some((b, n, k, suffix)))
}

/// `w`'s rows when every one starts 16-byte aligned.
pub(super) fn vector_rows(w: &Tensor, k: usize) -> Result<Option<RowsArg>> {
    let wa = RowsArg::new(w)?;
    Ok(wa.vectorisable(8, k).then_some(wa))
}

/// Slices of K (1, 2, 4 or 8) for `n` output rows and `b` rows of x: the fewest that make at
/// least three blocks an SM, keeping two or more 256-column steps a warp, and at most two when
/// `b` > 4 (more rows of x already keep a warp's loads busy; on the H100, I=5632 → 2048:
/// B=1..4 fastest at 4 slices, B=8 at 2). `DELTASERVE_GEMV_SPLITS` fixes it (for benchmarks).
pub(super) fn k_splits(n: usize, k: usize, b: usize, sms: usize) -> usize {
    let wanted = env_count!("DELTASERVE_GEMV_SPLITS");
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

/// The kernels' leading arguments: where x's rows come from (the last two: a gemv_staged.cu
/// kernel's prologue forms them).
pub(super) enum XArgs<'a> {
    /// `(x, ldx)`.
    Plain { x: u64, ld: i64 },
    /// `(gate, up, ld)`.
    Swiglu { gate: u64, up: u64, ld: i64 },
    /// `(h, delta, norm weight, eps, r)`: gemv_staged.cu's residual add + RMSNorm, with a
    /// decode step's short conv on the first output rows when `conv` is given.
    AddNorm { h: u64, delta: u64, nw: u64, eps: f32, r: u64, conv: Option<ConvArgs<'a>> },
    /// `(h, delta, norm weight, eps, r, I)`: gemv_staged.cu's residual add + RMSNorm before the
    /// fused `[gate | up]` projection whose epilogue forms SwiGLU (`SwigluPairs`).
    AddNormSwiglu { h: u64, delta: u64, nw: u64, eps: f32, r: u64, i: i32 },
    /// `(o, z, ldz, heads, norm weight, eps, act_sigmoid)`: gemv_staged.cu's gated RMSNorm.
    GatedNorm { o: u64, z: u64, ldz: i64, heads: i32, nw: u64, eps: f32, act_sigmoid: i32 },
}

/// gemv_staged.cu's `ConvFold`: `(conv weight [C, 4], conv states, the rows' slots, conv output
/// [B, C], C, silu)`.
pub(super) struct ConvArgs<'a> {
    pub(super) weight: u64,
    pub(super) states: u64,
    pub(super) slots: &'a super::decode::DecodeSlots,
    pub(super) out: u64,
    pub(super) channels: i32,
    pub(super) silu: i32,
}

/// One launch of `name` over the `b` rows of `x_args` (K split for `b` rows); returns `y` `[B, N]`.
pub(super) fn launch_rows(x: &Tensor, name: &str, (b, n, k): (usize, usize, usize), x_args: XArgs<'_>, wa: &RowsArg) -> Result<Tensor> {
    let y = alloc_rows(&cuda_dev(x, "gemv")?, x.dtype(), b, n)?;
    launch_rows_into(x, name, (b, n, k), x_args, wa, &y)?;
    Ok(y)
}

/// [`launch_rows`] into `y`, a contiguous `[B, N]` tensor of the kernel's output dtype.
pub(super) fn launch_rows_into(
    x: &Tensor,
    name: &str,
    (b, n, k): (usize, usize, usize),
    x_args: XArgs<'_>,
    wa: &RowsArg,
    y: &Tensor,
) -> Result<()> {
    let splits = k_splits(n, k, b, sm_count(&cuda_dev(x, "gemv")?)?);
    launch(x, name, (1, b, n, k), splits, x_args, wa, y, 0)
}

/// Most bytes of normalised rows a gemv_staged.cu block stages in shared memory: two blocks an
/// SM still fit (8 rows of K = 6144 in bf16); wider rows take two kernels.
pub(super) const MAX_STAGED_BYTES: usize = 104 * 1024;

/// Launches `name` over `groups` groups of `nb` rows with `x_args`, then `(w, y, N, K, splits)`,
/// writing `y` from `y_offset` bytes on; `x`'s dtype is that of the rows.
#[allow(clippy::too_many_arguments)]
fn launch(
    x: &Tensor,
    name: &str,
    (groups, nb, n, k): (usize, usize, usize, usize),
    splits: usize,
    x_args: XArgs<'_>,
    wa: &RowsArg,
    y: &Tensor,
    y_offset: usize,
) -> Result<()> {
    // The staged kernels (gemv_staged.cu) form their `nb` rows of x, in x's dtype, in dynamic
    // shared memory.
    let staged = matches!(x_args, XArgs::AddNorm { .. } | XArgs::AddNormSwiglu { .. } | XArgs::GatedNorm { .. });
    let (module, smem) = if staged { (&modules::GEMV_STAGED, nb * k * x.dtype().size_in_bytes()) } else { (&modules::GEMV, 0) };
    let dev = cuda_dev(x, "gemv")?;
    let f = func(&dev, name, module)?;
    // Past 48 KiB with the static arrays (under 1 KiB) the launch needs the opt-in; a decode
    // step's 1–2 rows stay under it, so the hot path makes no driver call for it.
    if smem + 1024 > 48 * 1024 {
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
    }
    let y_ptr = first_element_address_any(y)? + y_offset as u64;
    let (ni, ki, si) = (n as i32, k as i32, splits as i32);
    let mut l = f.builder();
    match &x_args {
        XArgs::Plain { x, ld } => l.arg(x).arg(ld),
        XArgs::Swiglu { gate, up, ld } => l.arg(gate).arg(up).arg(ld),
        XArgs::AddNorm { h, delta, nw, eps, r, conv } => {
            l.arg(h).arg(delta).arg(nw).arg(eps).arg(r);
            if let Some(c) = conv {
                l.arg(&c.weight).arg(&c.states);
                c.slots.push(&mut l);
                l.arg(&c.out).arg(&c.channels).arg(&c.silu)
            } else {
                &mut l
            }
        }
        XArgs::AddNormSwiglu { h, delta, nw, eps, r, i } => l.arg(h).arg(delta).arg(nw).arg(eps).arg(r).arg(i),
        XArgs::GatedNorm { o, z, ldz, heads, nw, eps, act_sigmoid } => {
            l.arg(o).arg(z).arg(ldz).arg(heads).arg(nw).arg(eps).arg(act_sigmoid)
        }
    };
    l.arg(&wa.ptr).arg(&y_ptr).arg(&ni).arg(&ki).arg(&si);
    let mut blocks = (n * splits).div_ceil(ROWS_PER_WARP * WARPS);
    if nb > GEMV_MAX_ROWS || blocks > 65_535 {
        return Err(KernelError::Unsupported {
            op: "gemv",
            what: format!("{nb} rows a group, {blocks} column blocks (at most 8 and 65535)"),
        });
    }
    // Two or more staged rows loop over W's row groups on a capped grid (gemv.cuh's LOOP).
    if let Some(per_sm) = (staged && nb > 1).then(staged_blocks_per_sm).flatten() {
        blocks = blocks.min(per_sm.saturating_mul(sm_count(&dev)?));
    }
    unsafe { l.launch(grid(groups, blocks, 1, (32 * WARPS) as u32, smem as u32)) }.w()?;
    Ok(())
}

/// Column blocks an SM a gemv_staged.cu launch of two or more rows runs at most: each forms the
/// normalised rows once and then streams every gridDim.y-th group of W's rows, rather than every
/// block of a full grid repeating the prologue. `DELTASERVE_STAGED_GEMV_BLOCKS` sets it (0: a
/// full grid, `None`), for comparisons.
fn staged_blocks_per_sm() -> Option<usize> {
    match env_count!("DELTASERVE_STAGED_GEMV_BLOCKS") {
        Some(0) => None,
        Some(b) => Some(b),
        None => Some(STAGED_BLOCKS_PER_SM),
    }
}

/// [`staged_blocks_per_sm`]'s default (H100: 3 and 4 equally fast at two rows, 2 and 6 slower).
const STAGED_BLOCKS_PER_SM: usize = 3;
