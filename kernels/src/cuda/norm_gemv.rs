//! Launchers of the small-batch projections with their RMSNorm folded in (gemv_staged.cu): a
//! decode step's block seam (residual add + norm, then the next projection) and the mixer's
//! gated output norm before `o_proj`, each one launch instead of two.

use candle_core::{DType, Tensor};

use super::gemv::{accepts_rows, launch_rows, vector_rows, XArgs, MAX_STAGED_BYTES};
use super::{alloc_rows, cuda_dev, f32c, first_element_address_any, RowsArg};
use crate::Result;

/// `norm(h + delta) Wᵀ` with `r = h + delta` (fp32) for `h` `[B, K]` f32, `delta` `[B, K]` in
/// `w`'s dtype (or none) and the norm's `weight` `[K]`: the same bits as
/// [`super::add_rms_norm`] into `w`'s dtype followed by [`super::gemv`], in one launch. Returns
/// `(r, y)`, or `None` where the kernel does not apply (as [`super::gemv`], or inputs not
/// contiguous, or rows too wide to stage).
pub fn add_norm_gemv(h: &Tensor, delta: Option<&Tensor>, weight: &Tensor, eps: f32, w: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let Ok((b, k)) = h.dims2() else { return Ok(None) };
    let Some((_, n, _, suffix)) = accepts_staged(b, k, w)? else { return Ok(None) };
    let fits = |t: &Tensor| t.is_contiguous() && t.dims() == [b, k] && t.dtype() == w.dtype();
    if h.dtype() != DType::F32 || !h.is_contiguous() || !delta.is_none_or(fits) {
        return Ok(None);
    }
    let Some(wa) = vector_rows(w, k)? else { return Ok(None) };
    let dev = cuda_dev(h, "add_norm_gemv")?;
    let nw = f32c(weight)?;
    let r = alloc_rows(&dev, DType::F32, b, k)?;
    let args = XArgs::AddNorm {
        h: first_element_address_any(h)?,
        delta: delta.map(first_element_address_any).transpose()?.unwrap_or(0),
        nw: first_element_address_any(&nw)?,
        eps,
        r: first_element_address_any(&r)?,
    };
    let y = launch_rows(w, &format!("add_norm_gemv_{suffix}_b{b}"), (b, n, k), args, &wa)?;
    Ok(Some((r, y)))
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
    launch_rows(w, &format!("gated_norm_gemv_{suffix}_b{b}"), (b, n, k), args, &wa).map(Some)
}

/// [`accepts_rows`] for `b` rows of `k` elements formed in `w`'s dtype, when they fit the stage.
fn accepts_staged(b: usize, k: usize, w: &Tensor) -> Result<Option<(usize, usize, usize, &'static str)>> {
    if b * k * w.dtype().size_in_bytes() > MAX_STAGED_BYTES {
        return Ok(None);
    }
    accepts_rows(b, k, w.dtype(), w)
}
