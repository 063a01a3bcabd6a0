//! Launchers of the row-wise kernels: the fused q/k/β/gate preparation and the RMSNorms.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{alloc_rows, cuda_dev, f32c, first_element_address_any, func, grid, modules, wrap, RowsArg};
use crate::ops::Prepared;
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

/// One fused pass over conv output rows `[N, C]`: L2-normalises the q heads (columns from 0)
/// and the k heads (right after them), β = `beta_mult`·sigmoid(`b`), and the gate. `b` and the
/// gate's `a` are read in place in their dtype (column slices of the input projection). q and
/// k are f32, or bf16 when the conv output and `b` are bf16 (a bf16 mixer's inputs, with no
/// cast between).
pub fn prep(conv: &Tensor, layout: crate::ops::QkLayout, b: &Tensor, beta_mult: f32, gate: Option<GateInputs<'_>>) -> Result<Prepared> {
    let (qh, kh, k) = (layout.q_heads, layout.k_heads, layout.head_dim);
    let k_off = qh * k;
    let dev = cuda_dev(conv, "prep")?;
    let (n, ldc) = conv.dims2()?;
    let nb = b.dim(1)?;
    // a and b share one kernel type: both as they are when their dtypes agree, else both f32.
    let same = gate.as_ref().is_none_or(|g| g.a.dtype() == b.dtype());
    let as_kernel = |t: &Tensor| if same { RowsArg::new(t) } else { RowsArg::new(&t.to_dtype(DType::F32)?) };
    let bv = as_kernel(b)?;
    // A bf16 conv output (a bf16 mixer's) with bf16 a and b: q and k stay bf16 (`_narrow`).
    let narrow = conv.dtype() == DType::BF16 && bv.suffix == "bf16";
    let (conv, qk_dtype) = if narrow { (conv.contiguous()?, DType::BF16) } else { (f32c(conv)?, DType::F32) };
    let (av, al, db, ng) = match &gate {
        Some(g) => (Some(as_kernel(g.a)?), Some(f32c(g.a_log)?), Some(f32c(g.dt_bias)?), g.a.dim(1)?),
        None => (None, None, None, 0),
    };
    // The kernel writes every element of q, k, beta and (when ng > 0) g.
    let (q, kk) = (alloc_rows(&dev, qk_dtype, n, qh * k)?, alloc_rows(&dev, qk_dtype, n, kh * k)?);
    // SAFETY: as above.
    let (mut beta, mut g) = unsafe { (dev.alloc::<f32>(n * nb)?, dev.alloc::<f32>((n * ng).max(1))?) };
    // K of 32–256 has entries with its loads unrolled (prep.cu); any other K loops.
    let fixed = match k {
        32 | 64 | 128 | 256 => format!("_k{k}"),
        _ => String::new(),
    };
    let name = if narrow { format!("prep_bf16_narrow{fixed}") } else { format!("prep_{}{fixed}", bv.suffix) };
    let f = func(&dev, &name, &modules::PREP)?;
    let ints = [ldc as i32, qh as i32, kh as i32, k as i32, k_off as i32, nb as i32, ng as i32, n as i32];
    let (a_ptr, a_ld) = av.as_ref().map_or((0, 0), |a| (a.ptr, a.ld));
    let (al_ptr, db_ptr) = (
        al.as_ref().map(first_element_address_any).transpose()?.unwrap_or(0),
        db.as_ref().map(first_element_address_any).transpose()?.unwrap_or(0),
    );
    let (conv_ptr, q_ptr, k_ptr) = (first_element_address_any(&conv)?, first_element_address_any(&q)?, first_element_address_any(&kk)?);
    let mut l = f.builder();
    l.arg(&conv_ptr).arg(&ints[0]).arg(&ints[1]).arg(&ints[2]).arg(&ints[3]).arg(&ints[4]);
    l.arg(&q_ptr).arg(&k_ptr).arg(&bv.ptr).arg(&bv.ld).arg(&mut beta).arg(&ints[5]).arg(&beta_mult);
    l.arg(&a_ptr).arg(&a_ld).arg(&al_ptr).arg(&db_ptr).arg(&mut g).arg(&ints[6]).arg(&ints[7]);
    let cfg = if fixed.is_empty() {
        // A row a block, a warp a q/k head (up to 32 warps): a decode step's one row is then one
        // pass of its heads in parallel, not several heads a warp one after another.
        grid(n, 1, 1, (32 * (qh + kh)).clamp(64, 1024) as u32, 0)
    } else {
        // A warp for each head of each PREP_ROWS rows, in blocks of PREP_THREADS (prep.cu).
        let warps = n.div_ceil(PREP_ROWS) * (qh + kh);
        grid(warps.div_ceil(PREP_THREADS / 32), 1, 1, PREP_THREADS as u32, 0)
    };
    unsafe { l.launch(cfg) }.w()?;
    Ok(Prepared {
        q: q.reshape((n, qh, k))?,
        k: kk.reshape((n, kh, k))?,
        beta: wrap(&dev, beta, (n, nb)),
        g: (ng > 0).then(|| wrap(&dev, g, (n, ng))),
    })
}

/// Rows a warp and threads a block of the prep kernel's fixed-K entries (prep.cu's `PREP_ROWS`
/// and `PREP_THREADS`).
const PREP_ROWS: usize = 4;
const PREP_THREADS: usize = 256;

/// Most tokens for which the norms take their latency variants (more registers, fewer round
/// trips to memory; norm.cu): a decode step's rows. Prefill's many rows take the lean ones,
/// whose occupancy matters more (H100: the latency variants made a 4096-token prefill of the
/// 1.39B model 2.6% slower and its decode steps at batch 16 and 64 about 0.1 ms faster).
const LATENCY_ROWS: usize = 256;

/// Gated RMSNorm over the last dim `D` of `x` `[.., D]` (f32, or bf16 as the bf16 mixer writes
/// it; other dtypes are converted to f32), rounded once to `dtype` (f32, bf16 or f16; any other
/// dtype gets f32). `z` is `x`'s shape, or `[N, H·D]` with `N·H` rows of
/// `x` (a column slice of the input projection, read in place in its dtype). `act_sigmoid`
/// picks sigmoid over swish.
pub fn gated_rms_norm(x: &Tensor, z: Option<&Tensor>, weight: &Tensor, eps: f32, act_sigmoid: bool, dtype: DType) -> Result<Tensor> {
    let dev = cuda_dev(x, "gated_rms_norm")?;
    let d = x.dim(candle_core::D::Minus1)?;
    let rows = x.elem_count() / d.max(1);
    let (x, x_prefix) = match x.dtype() {
        DType::BF16 => (x.contiguous()?, "xbf16_"),
        _ => (f32c(x)?, ""),
    };
    let w = f32c(weight)?;
    // z as [rows / heads, heads · D] rows: a 2-D slice as it is, any other shape contiguous
    // (ops::gated_rms_norm checked the shapes).
    let (z, heads) = match z {
        Some(z) if z.rank() == 2 && d > 0 && z.dim(1)?.is_multiple_of(d) => (Some(RowsArg::new(z)?), z.dim(1)? / d),
        Some(z) => (Some(RowsArg::new(&z.contiguous()?.reshape((rows, d))?)?), 1),
        None => (None, 1),
    };
    let y = alloc_rows(&dev, dtype, rows, d)?;
    let y_suffix = match y.dtype() {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    };
    let z_suffix = z.as_ref().map_or("f32", |z| z.suffix);
    let tokens = if x.rank() == 3 { x.dim(0)? } else { rows / heads.max(1) };
    // Prefill's many rows: rows of 128 or 256 read once (four or eight elements a lane kept);
    // 512-wide rows keep eight too (three round trips, not nine); wider ones two.
    // `DELTASERVE_GATED_NORM_KEPT` = 2, 4 or 8 overrides, for measuring.
    let lean = match (tokens > LATENCY_ROWS, env_count!("DELTASERVE_GATED_NORM_KEPT")) {
        (false, _) => "",
        (true, Some(4)) => "_k4",
        (true, Some(8)) => "_k8",
        (true, Some(_)) => "_lean",
        (true, None) if d <= 128 => "_k4",
        (true, None) if d <= 512 => "_k8",
        (true, None) => "_lean",
    };
    let f = func(&dev, &format!("gated_rms_norm_{x_prefix}{z_suffix}_{y_suffix}{lean}"), &modules::NORM)?;
    let (ri, di, hi, ai) = (rows as i32, d as i32, heads as i32, act_sigmoid as i32);
    let (z_ptr, z_ld) = z.as_ref().map_or((0, 0), |z| (z.ptr, z.ld));
    let y_ptr = first_element_address_any(&y)?;
    let x_ptr = first_element_address_any(&x)?;
    with_view!(w, wv, {
        let mut l = f.builder();
        let early = super::skinny::early_trigger(tokens);
        l.arg(&x_ptr).arg(&z_ptr).arg(&z_ld).arg(&hi).arg(&wv).arg(&y_ptr).arg(&ri).arg(&di).arg(&eps).arg(&ai).arg(&early);
        unsafe { l.launch(grid(rows.div_ceil(4), 1, 1, 128, 0)) }.w()?;
    });
    Ok(y.reshape(x.shape())?)
}

/// The seam between pre-norm sub-blocks in one launch: `r = h + delta` (fp32) and
/// `x = r / sqrt(mean(r²) + eps) · weight` rounded to `dtype`, for `h` `[N, D]` f32, `delta`
/// `[N, D]` in `dtype` (or none) and `weight` `[D]`. Returns `(r, x)`, or `None` when the inputs'
/// layouts or dtypes are not the kernel's (the caller then runs the same math in tensor ops).
pub fn add_rms_norm(h: &Tensor, delta: Option<&Tensor>, weight: &Tensor, eps: f32, dtype: DType) -> Result<Option<(Tensor, Tensor)>> {
    add_norm(h, NormDelta::Rows(delta), weight, eps, dtype)
}

/// [`add_rms_norm`] with `delta` as a split-K GEMM's f32 slices `parts` `[S, N, D]`, summed in
/// slice order and rounded to `dtype` by the same launch. `None` when the inputs' layouts or
/// dtypes are not the kernel's.
pub fn add_rms_norm_parts(h: &Tensor, parts: &Tensor, weight: &Tensor, eps: f32, dtype: DType) -> Result<Option<(Tensor, Tensor)>> {
    add_norm(h, NormDelta::Parts(parts), weight, eps, dtype)
}

/// What the add + norm adds to `h`.
#[derive(Clone, Copy)]
enum NormDelta<'a> {
    /// `[N, D]` in the output dtype, or nothing.
    Rows(Option<&'a Tensor>),
    /// `[S, N, D]` f32 slices (at most 8: the kernel's `PARTS_MAX`).
    Parts(&'a Tensor),
}

fn add_norm(h: &Tensor, delta: NormDelta<'_>, weight: &Tensor, eps: f32, dtype: DType) -> Result<Option<(Tensor, Tensor)>> {
    let dev = cuda_dev(h, "add_rms_norm")?;
    let (rows, d) = h.dims2()?;
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => return Ok(None),
    };
    let (kind, fits, s) = match delta {
        NormDelta::Rows(t) => ("", t.is_none_or(|t| t.is_contiguous() && t.dims() == [rows, d] && t.dtype() == dtype), 0),
        NormDelta::Parts(p) => {
            let s = p.dim(0)?;
            ("parts_", p.is_contiguous() && p.dims() == [s, rows, d] && p.dtype() == DType::F32 && (1..=8).contains(&s), s)
        }
    };
    if h.dtype() != DType::F32 || !h.is_contiguous() || !fits {
        return Ok(None);
    }
    let w = f32c(weight)?;
    let x = alloc_rows(&dev, dtype, rows, d)?;
    // SAFETY: the kernel writes every element of r.
    let mut r = unsafe { dev.alloc::<f32>(rows * d) }?;
    // Prefill's rows up to 2,048 wide: eight a thread with the weight (one round trip).
    let lean = match (rows > LATENCY_ROWS, kind) {
        (false, _) => "",
        (true, "") if d <= 2048 && env_count!("DELTASERVE_ADD_NORM_P8") != Some(0) => "_p8",
        (true, _) => "_lean",
    };
    let f = func(&dev, &format!("add_rms_norm_{kind}{suffix}{lean}"), &modules::NORM)?;
    let cfg = grid(rows, 1, 1, 256, 0);
    let (di, si, slice) = (d as i32, s as i32, (rows * d) as i64);
    let delta_ptr = match delta {
        NormDelta::Rows(t) => t.map(first_element_address_any).transpose()?.unwrap_or(0),
        NormDelta::Parts(p) => first_element_address_any(p)?,
    };
    let x_ptr = first_element_address_any(&x)?;
    with_view!(h, hv, {
        with_view!(w, wv, {
            let mut l = f.builder();
            l.arg(&hv).arg(&delta_ptr);
            if let NormDelta::Parts(_) = delta {
                l.arg(&si).arg(&slice);
            }
            let early = super::skinny::early_trigger(rows);
            l.arg(&wv).arg(&mut r).arg(&x_ptr).arg(&di).arg(&eps).arg(&early);
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
    let f = func(&dev, &format!("swiglu_{}{vec}", g.suffix), &modules::SWIGLU)?;
    let out_ptr = first_element_address_any(&out)?;
    let (ri, ii) = (rows as i32, i as i32);
    let mut l = f.builder();
    let early = super::skinny::early_trigger(rows);
    l.arg(&g.ptr).arg(&g.ld).arg(&u.ptr).arg(&u.ld).arg(&out_ptr).arg(&ri).arg(&ii).arg(&early);
    unsafe { l.launch(grid(i.div_ceil(per_thread * 256), rows.min(65535), 1, 256, 0)) }.w()?;
    Ok(out)
}

/// `o · sigmoid(gate)` rounded once to `gate`'s dtype, for `o` `[N, D]` (any float dtype; f32
/// read as it is) and `gate` `[N, D]` (rows read in place). Returns `[N, D]` in `gate`'s dtype.
pub fn sigmoid_gate(o: &Tensor, gate: &Tensor) -> Result<Tensor> {
    let dev = cuda_dev(gate, "sigmoid_gate")?;
    let (rows, d) = gate.dims2()?;
    let g = RowsArg::new(gate)?;
    // RowsArg reads any other dtype as f32.
    let dtype = match gate.dtype() {
        DType::BF16 | DType::F16 => gate.dtype(),
        _ => DType::F32,
    };
    let o = f32c(o)?;
    let out = alloc_rows(&dev, dtype, rows, d)?;
    if rows == 0 || d == 0 {
        return Ok(out);
    }
    let (o_ptr, out_ptr) = (first_element_address_any(&o)?, first_element_address_any(&out)?);
    // Four columns a thread when o's and the gate's rows allow it (out is contiguous and fresh).
    let (x4, per_thread) = if g.vectorisable(4, d) && o_ptr.is_multiple_of(16) { ("_x4", 4) } else { ("", 1) };
    let f = func(&dev, &format!("sigmoid_gate_{}{x4}", g.suffix), &modules::SWIGLU)?;
    let (ri, di) = (rows as i32, d as i32);
    let mut l = f.builder();
    let early = super::skinny::early_trigger(rows);
    l.arg(&o_ptr).arg(&g.ptr).arg(&g.ld).arg(&out_ptr).arg(&ri).arg(&di).arg(&early);
    unsafe { l.launch(grid(d.div_ceil(per_thread * 256), rows.min(65535), 1, 256, 0)) }.w()?;
    Ok(out)
}
