//! Launchers of the small-batch projections with their RMSNorm folded in (gemv_staged.cu): a
//! decode step's block seam (residual add + norm, then the next projection) and the mixer's
//! gated output norm before `o_proj`, each one launch instead of two.

use candle_core::{DType, Tensor};

use candle_core::cuda_backend::cudarc::driver::DevicePtr;

use super::decode::DecodeSlots;
use super::gemv::{accepts_rows, k_splits, launch_rows, launch_rows_into, vector_rows, ConvArgs, XArgs, MAX_STAGED_BYTES};
use super::{alloc_rows, cuda_dev, f32c, first_element_address_any, sm_count, DeviceSlots, RowsArg};
use crate::{Result, StepSlots};

/// `norm(h + delta) Wᵀ` with `r = h + delta` (fp32) for `h` `[B, K]` f32, `delta` `[B, K]` in
/// `w`'s dtype (or none) and the norm's `weight` `[K]`: the same bits as
/// [`super::add_rms_norm`] into `w`'s dtype followed by [`super::gemv`], in one launch. Returns
/// `(r, y)`, or `None` where the kernel does not apply (as [`super::gemv`], or inputs not
/// contiguous, or rows too wide to stage).
pub fn add_norm_gemv(h: &Tensor, delta: Option<&Tensor>, weight: &Tensor, eps: f32, w: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let Some(staged) = AddNormStage::new(h, delta, weight, w)? else { return Ok(None) };
    let y = staged.launch(h, delta, eps, w, None)?;
    Ok(Some((staged.r, y)))
}

/// [`add_norm_gemv`] with `y` written as f32 into `out` `[B, N]`, each value rounded to `w`'s
/// dtype first (the bits of [`super::to_f32_into`] of [`add_norm_gemv`]'s `y`): a decode step's
/// final norm and LM head, its logits written where the sampler reads them, with no launch for
/// the cast. Returns `r`, or `None` (nothing written) where [`add_norm_gemv`] would decline, or
/// for more than two rows, or when `out` is not a contiguous f32 `[B, N]`.
pub fn add_norm_gemv_f32_into(
    h: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
    w: &Tensor,
    out: &Tensor,
) -> Result<Option<Tensor>> {
    let Some(staged) = AddNormStage::new(h, delta, weight, w)? else { return Ok(None) };
    // gemv_staged.cu's f32y entries: one and two rows.
    let fits = out.dtype() == DType::F32 && out.is_contiguous() && out.dims() == [staged.b, staged.n];
    if staged.b > 2 || !fits {
        return Ok(None);
    }
    let name = format!("add_norm_gemv_f32y_{}_b{}", staged.suffix, staged.b);
    launch_rows_into(w, &name, (staged.b, staged.n, staged.k), staged.args(h, delta, eps, None)?, &staged.wa, out)?;
    Ok(Some(staged.r))
}

/// A decode step's short conv, run in [`add_norm_gemv_conv`]'s epilogue: conv.cu's
/// `conv_step` of width 4 over the projection's first C output rows.
pub struct ConvFold<'a, 's> {
    /// `[C, 4]` f32.
    pub weight: &'a Tensor,
    /// The conv states, `[C, 4]` f32 a slot.
    pub states: &'a mut DeviceSlots,
    /// The slot of each row.
    pub slots: StepSlots<'s>,
    /// SiLU after the conv.
    pub silu: bool,
}

/// [`add_norm_gemv`] whose GEMV also runs the decode step's short conv on the projection's first
/// C output rows (`conv`): the same bits as [`add_norm_gemv`] followed by [`super::conv_step`]
/// of `y[:, ..C]`, in one launch. Returns `(r, y, conv output [B, C] f32)`, or `None` where
/// [`add_norm_gemv`] would decline, or the conv is not width 4 with 16-byte aligned windows, or
/// C exceeds the projection's rows.
pub fn add_norm_gemv_conv(
    h: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
    w: &Tensor,
    conv: ConvFold<'_, '_>,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    let Some(staged) = AddNormStage::new(h, delta, weight, w)? else { return Ok(None) };
    let (n, b) = (staged.n, staged.b);
    let (c, width) = conv.weight.dims2()?;
    let cw = f32c(conv.weight)?;
    let cw_ptr = first_element_address_any(&cw)?;
    let states = conv.states.state_words("add_norm_gemv_conv")?;
    let (states_ptr, _sync) = states.device_ptr(states.stream());
    if width != 4 || c == 0 || c > n || conv.slots.host.len() != b || (cw_ptr | states_ptr) % 16 != 0 {
        return Ok(None);
    }
    let dev = cuda_dev(h, "add_norm_gemv_conv")?;
    let slots = DecodeSlots::new(&dev, conv.slots)?;
    let out = alloc_rows(&dev, DType::F32, b, c)?;
    let fold = ConvArgs {
        weight: cw_ptr,
        states: states_ptr,
        slots: &slots,
        out: first_element_address_any(&out)?,
        channels: c as i32,
        silu: conv.silu as i32,
    };
    let y = staged.launch(h, delta, eps, w, Some(fold))?;
    Ok(Some((staged.r, y, out)))
}

/// SwiGLU of the fused `[gate | up]` projection `w` (`I` rows each from row 0 and row `I`, any
/// padding rows after them unread) of `norm(h + delta)`, for one row: `(r, x)` with
/// `x = silu(g) · u` `[1, I]` in `w`'s dtype, the same bits as [`add_norm_gemv`] followed by
/// [`super::swiglu`] on its two halves, in one launch (gemv_staged.cu's `SwigluPairs`). The
/// projection's own output is never stored. `None` where the kernel does not apply (more rows,
/// as [`add_norm_gemv`], or a split of K that leaves a column block fewer than two row slots, or
/// `I` not a multiple of the block's gate rows).
pub fn add_norm_gemv_swiglu(
    h: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
    w: &Tensor,
    i: usize,
) -> Result<Option<(Tensor, Tensor)>> {
    if h.dim(0)? != 1 || w.dim(0)? < 2 * i || i == 0 {
        return Ok(None);
    }
    let Some(staged) = AddNormStage::new(h, delta, weight, w)? else { return Ok(None) };
    let dev = cuda_dev(h, "add_norm_gemv_swiglu")?;
    let (n, k) = (2 * i, staged.k);
    let splits = k_splits(n, k, 1, sm_count(&dev)?);
    if splits > 4 || !i.is_multiple_of(8 / splits) {
        return Ok(None);
    }
    let (hp, dp, nw, r) = staged.addresses(h, delta)?;
    let args = XArgs::AddNormSwiglu { h: hp, delta: dp, nw, eps, r, i: i as i32 };
    let x = alloc_rows(&dev, w.dtype(), 1, i)?;
    launch_rows_into(w, &format!("add_norm_gemv_swiglu_{}_b1", staged.suffix), (1, n, k), args, &staged.wa, &x)?;
    Ok(Some((staged.r, x)))
}

/// What [`add_norm_gemv`] and [`add_norm_gemv_conv`] check and allocate before their launch.
struct AddNormStage {
    b: usize,
    n: usize,
    k: usize,
    suffix: &'static str,
    wa: RowsArg,
    /// The norm's weight, f32.
    nw: Tensor,
    /// `h + delta`, written by the kernel.
    r: Tensor,
}

impl AddNormStage {
    /// `None` where the kernel does not apply.
    fn new(h: &Tensor, delta: Option<&Tensor>, weight: &Tensor, w: &Tensor) -> Result<Option<Self>> {
        let Ok((b, k)) = h.dims2() else { return Ok(None) };
        let Some((_, n, _, suffix)) = accepts_staged(b, k, w)? else { return Ok(None) };
        let fits = |t: &Tensor| t.is_contiguous() && t.dims() == [b, k] && t.dtype() == w.dtype();
        if h.dtype() != DType::F32 || !h.is_contiguous() || !delta.is_none_or(fits) {
            return Ok(None);
        }
        let Some(wa) = vector_rows(w, k)? else { return Ok(None) };
        let dev = cuda_dev(h, "add_norm_gemv")?;
        Ok(Some(Self { b, n, k, suffix, wa, nw: f32c(weight)?, r: alloc_rows(&dev, DType::F32, b, k)? }))
    }

    /// The kernel's leading arguments (with the conv when `conv` is given).
    fn args<'c>(&self, h: &Tensor, delta: Option<&Tensor>, eps: f32, conv: Option<ConvArgs<'c>>) -> Result<XArgs<'c>> {
        let (h, delta, nw, r) = self.addresses(h, delta)?;
        Ok(XArgs::AddNorm { h, delta, nw, eps, r, conv })
    }

    /// The device addresses of `h`, `delta` (0 for none), the norm's weight and `r`.
    fn addresses(&self, h: &Tensor, delta: Option<&Tensor>) -> Result<(u64, u64, u64, u64)> {
        Ok((
            first_element_address_any(h)?,
            delta.map(first_element_address_any).transpose()?.unwrap_or(0),
            first_element_address_any(&self.nw)?,
            first_element_address_any(&self.r)?,
        ))
    }

    /// Launches the kernel (with the conv when `conv` is given); returns `y`.
    fn launch(&self, h: &Tensor, delta: Option<&Tensor>, eps: f32, w: &Tensor, conv: Option<ConvArgs<'_>>) -> Result<Tensor> {
        let name = if conv.is_some() { "add_norm_gemv_conv" } else { "add_norm_gemv" };
        let args = self.args(h, delta, eps, conv)?;
        launch_rows(w, &format!("{name}_{}_b{}", self.suffix, self.b), (self.b, self.n, self.k), args, &self.wa)
    }
}

/// `gated_norm(o, z) Wᵀ` for `o` `[B, H, Vd]` f32, the gate `z` `[B, H·Vd]` in `w`'s dtype (a
/// column slice of the input projection, read in place; or none) and the per-head norm's
/// `weight` `[Vd]`: the same bits as [`super::gated_rms_norm`] into `w`'s dtype followed by
/// [`super::gemv`], in one launch. `None` where the kernel does not apply.
pub fn gated_norm_gemv(o: &Tensor, z: Option<&Tensor>, weight: &Tensor, eps: f32, act_sigmoid: bool, w: &Tensor) -> Result<Option<Tensor>> {
    let Ok((b, heads, vd)) = o.dims3() else { return Ok(None) };
    let k = heads * vd;
    let Some((_, n, _, suffix)) = accepts_staged(b, k, w)? else { return Ok(None) };
    if o.dtype() != DType::F32 || !o.is_contiguous() {
        return Ok(None);
    }
    let za = match z {
        Some(z) if z.dims() == [b, k] && z.dtype() == w.dtype() && z.stride()[1] == 1 => Some(RowsArg::new(z)?),
        Some(_) => return Ok(None),
        None => None,
    };
    let Some(wa) = vector_rows(w, k)? else { return Ok(None) };
    let nw = f32c(weight)?;
    let (z_ptr, ldz) = za.as_ref().map_or((0, 0), |z| (z.ptr, z.ld));
    let args = XArgs::GatedNorm {
        o: first_element_address_any(o)?,
        z: z_ptr,
        ldz,
        heads: heads as i32,
        nw: first_element_address_any(&nw)?,
        eps,
        act_sigmoid: act_sigmoid as i32,
    };
    let name = match once_head_width(b, heads, vd) {
        Some(vd) => format!("gated_norm_gemv_v{vd}_{suffix}_b{b}"),
        None => format!("gated_norm_gemv_{suffix}_b{b}"),
    };
    launch_rows(w, &name, (b, n, k), args, &wa).map(Some)
}

/// The head width of gemv_staged.cu's `gated_norm_gemv_v{Vd}` entries, whose prologue loads each
/// of its at most eight head rows in one round trip (a warp a row), when they take `b` rows of
/// `heads` heads of `vd`: one or two rows, Vd 128, 256 or 512. The same bits as the entries with
/// a row's groups one after another (H200, the 1.39B's `o_proj`, 6 heads of 512, a chain of
/// launches: 6.65 against 8.98 µs; `benches/results/h200-one_row_prologues-2026-11-30/`).
/// `DELTASERVE_GATED_NORM_ONCE=0` leaves every shape to those entries (for comparisons).
fn once_head_width(b: usize, heads: usize, vd: usize) -> Option<usize> {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var("DELTASERVE_GATED_NORM_ONCE").is_ok_and(|v| v == "0"));
    (!off && b <= 2 && b * heads <= 8 && [128, 256, 512].contains(&vd)).then_some(vd)
}

/// [`accepts_rows`] for `b` rows of `k` elements formed in `w`'s dtype, when they fit the stage.
fn accepts_staged(b: usize, k: usize, w: &Tensor) -> Result<Option<(usize, usize, usize, &'static str)>> {
    if b * k * w.dtype().size_in_bytes() > MAX_STAGED_BYTES {
        return Ok(None);
    }
    accepts_rows(b, k, w.dtype(), w)
}
