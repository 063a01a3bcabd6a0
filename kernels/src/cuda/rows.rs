//! Launchers of the row-wise kernels: the fused q/k/β/gate preparation and the RMSNorms.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{alloc_rows, cuda_dev, f32c, first_element_address_any, grid, ptx, wrap, RowsArg};
use crate::Result;

/// The gate's inputs: raw `a` `[N, HV]`, `A_log` and `dt_bias` `[HV]`.
pub struct GateInputs<'a> {
    /// `a_proj` output.
    pub a: &'a Tensor,
    /// `A_log`.
    pub a_log: &'a Tensor,
    /// `dt_bias`.
    pub dt_bias: &'a Tensor,
}

/// Prepared mixer inputs.
pub struct Prepared {
    /// `[N, qh, K]` L2-normalised.
    pub q: Tensor,
    /// `[N, kh, K]` L2-normalised.
    pub k: Tensor,
    /// `[N, nb]`.
    pub beta: Tensor,
    /// `[N, HV]` log-decay.
    pub g: Option<Tensor>,
}

/// One fused pass over conv output rows `[N, C]`: L2-normalises the q heads (columns from 0)
/// and the k heads (right after them), β = `beta_mult`·sigmoid(`b`), and the gate.
pub fn prep(conv: &Tensor, layout: crate::ops::QkLayout, b: &Tensor, beta_mult: f32, gate: Option<GateInputs<'_>>) -> Result<Prepared> {
    let (qh, kh, k) = (layout.q_heads, layout.k_heads, layout.head_dim);
    let k_off = qh * k;
    let dev = cuda_dev(conv, "prep")?;
    let (n, ldc) = conv.dims2()?;
    let nb = b.dim(1)?;
    let conv = f32c(conv)?;
    let b = f32c(b)?;
    let (a, al, db, ng) = match &gate {
        Some(g) => (Some(f32c(g.a)?), Some(f32c(g.a_log)?), Some(f32c(g.dt_bias)?), g.a.dim(1)?),
        None => (None, None, None, 0),
    };
    // SAFETY: the kernel writes every element of q, k, beta and (when ng > 0) g.
    let (mut q, mut kk, mut beta, mut g) = unsafe {
        (dev.alloc::<f32>(n * qh * k)?, dev.alloc::<f32>(n * kh * k)?, dev.alloc::<f32>(n * nb)?, dev.alloc::<f32>((n * ng).max(1))?)
    };
    let f = dev.get_or_load_custom_func("prep_f32", "prep", ptx::PREP)?;
    let ints = [ldc as i32, qh as i32, kh as i32, k as i32, k_off as i32, nb as i32, ng as i32];
    let cfg = grid(n, 1, 1, 128, 0);
    with_view!(conv, cv, {
        with_view!(b, bv, {
            match (&a, &al, &db) {
                (Some(a), Some(al), Some(db)) => with_view!(a, av, {
                    with_view!(al, alv, {
                        with_view!(db, dbv, {
                            let mut l = f.builder();
                            l.arg(&cv).arg(&ints[0]).arg(&ints[1]).arg(&ints[2]).arg(&ints[3]).arg(&ints[4]);
                            l.arg(&mut q).arg(&mut kk).arg(&bv).arg(&mut beta).arg(&ints[5]).arg(&beta_mult);
                            l.arg(&av).arg(&alv).arg(&dbv).arg(&mut g).arg(&ints[6]);
                            unsafe { l.launch(cfg) }.w()?;
                        })
                    })
                }),
                _ => {
                    let null = 0u64;
                    let mut l = f.builder();
                    l.arg(&cv).arg(&ints[0]).arg(&ints[1]).arg(&ints[2]).arg(&ints[3]).arg(&ints[4]);
                    l.arg(&mut q).arg(&mut kk).arg(&bv).arg(&mut beta).arg(&ints[5]).arg(&beta_mult);
                    l.arg(&null).arg(&null).arg(&null).arg(&mut g).arg(&ints[6]);
                    unsafe { l.launch(cfg) }.w()?;
                }
            }
        })
    });
    Ok(Prepared {
        q: wrap(&dev, q, (n, qh, k)),
        k: wrap(&dev, kk, (n, kh, k)),
        beta: wrap(&dev, beta, (n, nb)),
        g: (ng > 0).then(|| wrap(&dev, g, (n, ng))),
    })
}

/// Gated RMSNorm over the last dim of `x` `[.., D]`; `act_sigmoid` picks sigmoid over swish.
pub fn gated_rms_norm(x: &Tensor, z: Option<&Tensor>, weight: &Tensor, eps: f32, act_sigmoid: bool) -> Result<Tensor> {
    let dev = cuda_dev(x, "gated_rms_norm")?;
    let d = x.dim(candle_core::D::Minus1)?;
    let rows = x.elem_count() / d.max(1);
    let x = f32c(x)?;
    let w = f32c(weight)?;
    let z = z.map(f32c).transpose()?;
    // SAFETY: the kernel writes every element of y.
    let mut y = unsafe { dev.alloc::<f32>(rows * d) }?;
    let f = dev.get_or_load_custom_func("gated_rms_norm_f32", "norm", ptx::NORM)?;
    let (ri, di, ai) = (rows as i32, d as i32, act_sigmoid as i32);
    let cfg = grid(rows.div_ceil(4), 1, 1, 128, 0);
    with_view!(x, xv, {
        with_view!(w, wv, {
            let mut l = f.builder();
            match &z {
                Some(z) => with_view!(z, zv, {
                    l.arg(&xv).arg(&zv).arg(&wv).arg(&mut y).arg(&ri).arg(&di).arg(&eps).arg(&ai);
                    unsafe { l.launch(cfg) }.w()?;
                }),
                None => {
                    let null = 0u64;
                    l.arg(&xv).arg(&null).arg(&wv).arg(&mut y).arg(&ri).arg(&di).arg(&eps).arg(&ai);
                    unsafe { l.launch(cfg) }.w()?;
                }
            }
        })
    });
    Ok(wrap(&dev, y, x.shape().clone()))
}

/// The seam between pre-norm sub-blocks in one launch: `r = h + delta` (fp32) and
/// `x = r / sqrt(mean(r²) + eps) · weight` rounded to `dtype`, for `h` `[N, D]` f32, `delta`
/// `[N, D]` in `dtype` (or none) and `weight` `[D]`. Returns `(r, x)`, or `None` when the inputs'
/// layouts or dtypes are not the kernel's (the caller then runs the same math in tensor ops).
pub fn add_rms_norm(h: &Tensor, delta: Option<&Tensor>, weight: &Tensor, eps: f32, dtype: DType) -> Result<Option<(Tensor, Tensor)>> {
    let dev = cuda_dev(h, "add_rms_norm")?;
    let (rows, d) = h.dims2()?;
    let name = match dtype {
        DType::F32 => "add_rms_norm_f32",
        DType::BF16 => "add_rms_norm_bf16",
        DType::F16 => "add_rms_norm_f16",
        _ => return Ok(None),
    };
    let fits = |t: &Tensor| t.is_contiguous() && t.dims() == [rows, d] && t.dtype() == dtype;
    if h.dtype() != DType::F32 || !h.is_contiguous() || !delta.is_none_or(fits) {
        return Ok(None);
    }
    let w = f32c(weight)?;
    let x = alloc_rows(&dev, dtype, rows, d)?;
    // SAFETY: the kernel writes every element of r.
    let mut r = unsafe { dev.alloc::<f32>(rows * d) }?;
    let f = dev.get_or_load_custom_func(name, "norm", ptx::NORM)?;
    let cfg = grid(rows, 1, 1, 256, 0);
    let di = d as i32;
    let (x_ptr, delta_ptr) = (first_element_address_any(&x)?, delta.map(first_element_address_any).transpose()?.unwrap_or(0));
    with_view!(h, hv, {
        with_view!(w, wv, {
            let mut l = f.builder();
            l.arg(&hv).arg(&delta_ptr).arg(&wv).arg(&mut r).arg(&x_ptr).arg(&di).arg(&eps);
            unsafe { l.launch(cfg) }.w()?;
        })
    });
    Ok(Some((wrap(&dev, r, (rows, d)), x)))
}

/// SwiGLU `silu(gate) · up` for `gate`, `up` `[N, I]` (column slices of a fused projection are
/// read in place), in fp32 rounded once to their dtype. Returns `[N, I]` contiguous.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let dev = cuda_dev(gate, "swiglu")?;
    let (rows, i) = gate.dims2()?;
    let dtype = gate.dtype();
    if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        // A dtype the kernel lacks: the same math in tensor ops.
        return Ok((gate.silu()? * up.to_dtype(dtype)?)?);
    }
    let (g, u) = (RowsArg::new(gate)?, RowsArg::new(&up.to_dtype(dtype)?)?);
    let out = alloc_rows(&dev, dtype, rows, i)?;
    if rows == 0 || i == 0 {
        return Ok(out);
    }
    // 16 bytes a thread when both inputs' rows allow it (the output is contiguous and fresh).
    let n = 16 / g.elem_bytes;
    let (vec, per_thread) = if g.vectorisable(n, i) && u.vectorisable(n, i) { ("_vec", n) } else { ("", 1) };
    let f = dev.get_or_load_custom_func(&format!("swiglu_{}{vec}", g.suffix), "swiglu", ptx::SWIGLU)?;
    let out_ptr = first_element_address_any(&out)?;
    let (ri, ii) = (rows as i32, i as i32);
    let mut l = f.builder();
    l.arg(&g.ptr).arg(&g.ld).arg(&u.ptr).arg(&u.ld).arg(&out_ptr).arg(&ri).arg(&ii);
    unsafe { l.launch(grid(i.div_ceil(per_thread * 256), rows.min(65535), 1, 256, 0)) }.w()?;
    Ok(out)
}
