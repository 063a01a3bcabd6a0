//! Projections `x Wᵀ` (batch-invariant on the CPU, small-batch GEMV kernels on the GPU) and
//! the MLP's SwiGLU.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

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

/// `t` in f32 (a 16-bit model's logits for the sampler): on the GPU one vectorised kernel for a
/// contiguous bf16/f16 tensor, elsewhere candle's cast.
pub fn to_f32(t: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if t.device().is_cuda() {
        return crate::cuda::to_f32(t);
    }
    Ok(t.to_dtype(candle_core::DType::F32)?)
}

/// Rows `ids` (`[N]` u32, each below V) of `table` (`[V, D]`) in f32 (a step's embeddings): on
/// the GPU one kernel gathers and widens a bf16/f16 table; elsewhere candle's gather and cast.
pub fn embedding_f32(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if table.device().is_cuda() && !embed_kernel_off() {
        return crate::cuda::embedding_f32(table, ids);
    }
    Ok(table.index_select(ids, 0)?.to_dtype(DType::F32)?)
}

/// [`to_f32`] written into `out`, a contiguous f32 tensor of `t`'s shape (a CUDA graph's fixed
/// output buffer): on the GPU one kernel, no intermediate copy.
pub fn to_f32_into(t: &Tensor, out: &Tensor) -> Result<()> {
    if out.dims() != t.dims() || out.dtype() != DType::F32 || !out.is_contiguous() {
        return Err(crate::KernelError::Shape {
            op: "to_f32_into",
            input: "out",
            expected: format!("contiguous f32 {:?}", t.dims()),
            actual: out.dims().to_vec(),
        });
    }
    #[cfg(feature = "cuda")]
    if t.device().is_cuda() {
        return crate::cuda::to_f32_into(t, out);
    }
    Ok(out.slice_set(&t.to_dtype(DType::F32)?, 0, 0)?)
}

/// Qwen's attention output gate, `o · sigmoid(gate)` in fp32 rounded once to `gate`'s dtype,
/// for `o` `[N, D]` (f32) and `gate` `[N, D]` (a column slice of the layer's projection). On
/// the GPU one kernel reads the gate in place; the CPU runs candle's sigmoid and product.
pub fn sigmoid_gate(o: &Tensor, gate: &Tensor) -> Result<Tensor> {
    const OP: &str = "sigmoid_gate";
    let (n, d) = dims2(OP, "gate", gate)?;
    expect_dims(OP, "o", o, &[n, d])?;
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() {
        return crate::cuda::sigmoid_gate(o, gate);
    }
    let gate_f32 = gate.to_dtype(candle_core::DType::F32)?;
    Ok((o.to_dtype(candle_core::DType::F32)? * candle_nn::ops::sigmoid(&gate_f32)?)?.to_dtype(gate.dtype())?)
}

static BATCH_INVARIANT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the GPU's batch-invariant mode on or off for this process (the CPU is always
/// batch-invariant in f32). On, every GPU projection runs [`crate::cuda::gemv_invariant`]'s
/// kernel (a row's result never depends on the rows beside it), the MLP's fused SwiGLU-GEMV and
/// the MoE's tensor-core tiles stand aside, and only bf16/f16 projections are taken.
pub fn set_batch_invariant(on: bool) {
    BATCH_INVARIANT.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`set_batch_invariant`] turned the GPU's batch-invariant mode on.
pub fn batch_invariant() -> bool {
    BATCH_INVARIANT.load(std::sync::atomic::Ordering::Relaxed)
}

/// `x Wᵀ` for `x` `[.., K]` and `w` `[N, K]`. On the CPU in f32, every output row is computed
/// the same way whatever rows come with it ([`crate::cpu::linear`]): a sequence's logits do not
/// depend on its batch. On the GPU a few rows go through [`small_batch_linear`], the rest through
/// candle's GEMM, or all through the batch-invariant kernel ([`set_batch_invariant`]); other CPU
/// dtypes run candle's GEMM.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "linear";
    let (n, k) = dims2(OP, "w", w)?;
    let dims = x.dims().to_vec();
    if dims.last() != Some(&k) {
        return Err(crate::KernelError::Shape { op: OP, input: "x", expected: format!("[.., {k}]"), actual: dims });
    }
    let rows = dims[..dims.len() - 1].iter().product::<usize>();
    let mut out_dims = dims.clone();
    *out_dims.last_mut().expect("rank ≥ 1") = n;
    if matches!(x.device(), Device::Cpu) && x.dtype() == DType::F32 && w.dtype() == DType::F32 {
        let (x, w) = (x.contiguous()?, w.contiguous()?);
        let mut y = vec![0f32; rows * n];
        with_cpu_f32(&x, |xs| with_cpu_f32(&w, |ws| crate::cpu::linear::linear(xs, ws, k, &mut y)))??;
        return Ok(Tensor::from_vec(y, out_dims, &Device::Cpu)?);
    }
    // A 2-D x (a column slice of a fused projection, say) is read where it lies.
    let x2 = if dims.len() == 2 { x.clone() } else { x.reshape((rows, k))? };
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && batch_invariant() {
        return Ok(crate::cuda::gemv_invariant(&x2, w)?.reshape(out_dims)?);
    }
    let y = match small_batch_linear(&x2, w)? {
        Some(y) => y,
        None => match skinny_linear(&x2, w)? {
            Some(y) => y,
            None => large_batch_linear(&x2, w)?,
        },
    };
    Ok(y.reshape(out_dims)?)
}

/// `x Wᵀ` for `x` `[M, K]` as the f32 partial products of `S` slices of K, `[S, M, N]`, whose
/// sum is the product: on the GPU, where [`linear`] would run a GEMM that splits K (a decode
/// step's 2,048-wide projections from 4 rows on), the same split without its reduce launch, for
/// a reader that sums the slices as it reads them ([`add_rms_norm_parts`](super::add_rms_norm_parts));
/// up to [`SKINNY_LINEAR_MAX_ROWS`] the skinny GEMM's slices, past them cuBLAS's. `None` where
/// [`linear`] runs something else (the CPU, the GEMV kernels' rows, the batch-invariant mode, a
/// GEMM that does not split K): the caller runs [`linear`].
pub fn linear_parts(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if skinny_rows(x, w)? {
        if let Some(parts) = crate::cuda::skinny_gemm(x, w, crate::cuda::SkinnyOut::Parts, None)? {
            return Ok(Some(parts));
        }
    }
    #[cfg(feature = "cuda")]
    if gpu_gemm(x, w)? {
        return crate::cuda::linear_lt_parts(x, w);
    }
    let _ = (x, w);
    Ok(None)
}

/// `x Wᵀ` in f32 written into `out` `[M, N]` (contiguous f32; a decode step's logits in a CUDA
/// graph's buffer): on the GPU, where [`linear`] would run a GEMM (past the GEMV kernels' rows,
/// bf16/f16, not the batch-invariant mode), the GEMM's f32 accumulators stored as they are,
/// not rounded to `x`'s dtype first; one pass where the product and [`to_f32_into`] were two.
/// False (nothing written) elsewhere, or when `DELTASERVE_HEAD_GEMM_F32=0` turns it off (for
/// comparisons): the caller runs the two.
pub fn linear_f32_into(x: &Tensor, w: &Tensor, out: &Tensor) -> Result<bool> {
    #[cfg(feature = "cuda")]
    if !head_gemm_f32_off() && skinny_rows(x, w)? && crate::cuda::skinny_gemm(x, w, crate::cuda::SkinnyOut::F32Into(out), None)?.is_some() {
        return Ok(true);
    }
    #[cfg(feature = "cuda")]
    if !head_gemm_f32_off() && gpu_gemm(x, w)? {
        return crate::cuda::linear_lt_f32_into(x, w, out);
    }
    let _ = (x, w, out);
    Ok(false)
}

/// [`linear`] in f32 where [`linear_f32_into`] applies (its f32 accumulators, in a new tensor);
/// `None` elsewhere: the caller widens [`linear`]'s product.
pub fn linear_f32(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if !head_gemm_f32_off() && skinny_rows(x, w)? {
        if let Some(y) = crate::cuda::skinny_gemm(x, w, crate::cuda::SkinnyOut::F32, None)? {
            return Ok(Some(y));
        }
    }
    #[cfg(feature = "cuda")]
    if !head_gemm_f32_off() && gpu_gemm(x, w)? {
        return crate::cuda::linear_lt_f32(x, w);
    }
    let _ = (x, w);
    Ok(None)
}

/// Runs `f` on a contiguous f32 CPU tensor's values where they lie (weights are not copied).
fn with_cpu_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some((from, to))) => Ok(f(&v[from..to])),
        _ => Err(crate::KernelError::Shape {
            op: "linear",
            input: "operand",
            expected: "a contiguous f32 tensor on the CPU".into(),
            actual: t.dims().to_vec(),
        }),
    }
}

/// `x Wᵀ` for `x` `[M, K]` and `w` `[N, K]` as a GEMM: on the GPU, bf16/f16 through cublasLt
/// with one algorithm per row bucket ([`crate::cuda::linear_lt`]: a new prompt length loads no
/// new kernel), else candle's.
fn large_batch_linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        if let Some(y) = crate::cuda::linear_lt(x, w)? {
            return Ok(y);
        }
    }
    Ok(x.contiguous()?.matmul(&w.t()?)?)
}

/// `x Wᵀ` for `x` `[B, K]` and `w` `[N, K]` when B is small: on the GPU, for B ≤
/// [`SMALL_BATCH_LINEAR_MAX_ROWS`] and bf16 or f16 inputs, one kernel that streams `w` once (a
/// decode step's projections, where cuBLAS's GEMV kernels stream the weights at 35–80% of copy
/// bandwidth). `None` where that kernel does not apply (the CPU, larger B, other dtypes or
/// layouts), or when `DELTASERVE_SMALL_BATCH_GEMV=0` turns it off (for comparisons): the caller
/// runs its GEMM.
pub fn small_batch_linear(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && w.device().is_cuda() {
        if small_batch_gemv_off() || x.dim(0)? > small_batch_linear_max_rows() {
            return Ok(None);
        }
        return crate::cuda::gemv(x, w);
    }
    let _ = (x, w);
    Ok(None)
}

/// `x Wᵀ` for `x` `[M, K]` with more rows than the GEMV kernels take and at most
/// [`SKINNY_LINEAR_MAX_ROWS`] (a decode step of a few dozen sequences): on a Hopper GPU, bf16 or
/// f16 with K whole 64-wide tiles a slice, one kernel that has the tensor memory accelerator
/// stream W and x into shared memory for the warpgroup tensor cores and adds K's slices across a
/// cluster in a fixed order ([`crate::cuda::skinny_gemm`]). Each row of the result is the same
/// bits whatever M. `None` where it does not apply, or when `DELTASERVE_SKINNY_GEMM=0` turns it
/// off (for comparisons): the caller runs its GEMM.
pub fn skinny_linear(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if skinny_rows(x, w)? {
        return crate::cuda::skinny_gemm(x, w, crate::cuda::SkinnyOut::Rows, None);
    }
    let _ = (x, w);
    Ok(None)
}

/// `silu(x W_gᵀ) · (x W_uᵀ)` `[M, i]` for `w` an MLP's stacked `[gate | up]` (`[2i + padding,
/// K]`) and the rows [`skinny_linear`] takes: on a Hopper GPU one launch that forms SwiGLU in the
/// skinny GEMM's epilogue ([`crate::cuda::skinny_swiglu`]; the GEMM at one K slice then
/// [`swiglu`], bit for bit). `None` where it does not apply, or when `DELTASERVE_SKINNY_GLU=0`
/// turns it off (for comparisons): the caller runs the two.
pub fn skinny_swiglu(x: &Tensor, w: &Tensor, i: usize) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if crate::cuda::skinny_swiglu_on() && skinny_rows(x, w)? {
        return crate::cuda::skinny_swiglu(x, w, i, None);
    }
    let _ = (x, w, i);
    Ok(None)
}

/// [`skinny_linear`] of a decode step's rows whose kernel also runs the step's short conv on the
/// product's first C columns (a delta-rule layer's `[q | k | v]`): `(y, c)` with `c` `[B, C]`
/// f32 equal, bit for bit, to [`super::conv_step`] of `y[:, ..C]`, and the conv states updated as
/// it updates them ([`crate::cuda::skinny_conv`]; y as the skinny GEMM at one K slice gives it).
/// One launch a layer fewer. `None` where it does not apply (as [`skinny_linear`], a conv width
/// other than fla's 4, or `DELTASERVE_CONV_FOLD=0`): the caller runs the two.
pub fn skinny_conv_linear(x: &Tensor, w: &Tensor, conv: ConvStepFold<'_, '_>) -> Result<Option<(Tensor, Tensor)>> {
    #[cfg(feature = "cuda")]
    if !conv_fold_off() && skinny_rows(x, w)? {
        const OP: &str = "skinny_conv";
        let shape = dims2(OP, "conv weight", conv.weight)?;
        super::conv::check_step_states(OP, x.dim(0)?, shape, conv.states, &conv.slots)?;
        let Some(states) = conv.states.device_slots() else { return Ok(None) };
        let silu = conv.act == crate::ConvActivation::Silu;
        let fold = crate::cuda::ConvFold { weight: conv.weight, states, slots: conv.slots, silu };
        return crate::cuda::skinny_conv(x, w, fold, None);
    }
    let _ = (x, w, conv);
    Ok(None)
}

/// Most rows [`skinny_linear`] (and the f32 and split products of a decode step) take. The
/// kernel takes up to 64, but past 16 rows x's tiles, which every block copies from L2, cost
/// more than the early start gains: H200 decode steps, against cuBLAS in the same call, 1.7–3.5%
/// faster at 4–8 rows and 0.3–2% at 16, but 1–2.5% slower at 32 and 4–6% at 64
/// (`benches/results/h200-skinny_tma-2026-12-01/`).
pub const SKINNY_LINEAR_MAX_ROWS: usize = 16;

/// `silu(gate) · up` times `w`ᵀ (the MLP's down projection) for `gate`, `up` `[B, I]` with
/// B ≤ [`SWIGLU_LINEAR_MAX_ROWS`]: on the GPU, under the conditions of [`small_batch_linear`]
/// (and gate and up sharing a row stride, as the halves of one projection do), one kernel that
/// forms each row of the product as it streams `w`, rounded as [`swiglu`] would store it, so the
/// result equals `small_batch_linear(&swiglu(gate, up)?, w)`. `None` where it does not apply:
/// the caller runs the two steps.
pub fn small_batch_swiglu_linear(gate: &Tensor, up: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() && w.device().is_cuda() {
        if small_batch_gemv_off() || batch_invariant() || gate.dim(0)? > SWIGLU_LINEAR_MAX_ROWS {
            return Ok(None);
        }
        return crate::cuda::gemv_swiglu(gate, up, w);
    }
    let _ = (gate, up, w);
    Ok(None)
}

/// `norm(h + delta) Wᵀ` and `r = h + delta` for the rows of a decode step (a pre-norm block's
/// seam into its next projection): `h` `[B, K]` f32, `delta` `[B, K]` in `w`'s dtype or none,
/// `norm_weight` `[K]` (fla's RMSNorm, fp32, rounded to `w`'s dtype). On the GPU for B ≤
/// [`ADD_NORM_LINEAR_MAX_ROWS`], under the conditions of [`small_batch_linear`], one kernel whose
/// `(r, y)` equal the norm kernel's `r` and `small_batch_linear` of its output bit for bit.
/// `None` where it does not apply, or when `DELTASERVE_FUSED_NORM=0` turns it off (for
/// comparisons): the caller runs the two steps.
pub fn small_batch_add_norm_linear(
    h: &Tensor,
    delta: Option<&Tensor>,
    norm_weight: &Tensor,
    eps: f32,
    w: &Tensor,
) -> Result<Option<(Tensor, Tensor)>> {
    #[cfg(feature = "cuda")]
    if h.device().is_cuda() && w.device().is_cuda() {
        if small_batch_gemv_off() || fused_norm_off() || batch_invariant() || h.dim(0)? > ADD_NORM_LINEAR_MAX_ROWS {
            return Ok(None);
        }
        return crate::cuda::add_norm_gemv(h, delta, norm_weight, eps, w);
    }
    let _ = (h, delta, norm_weight, eps, w);
    Ok(None)
}

/// `silu(g) · u` for `[g | u] = norm(h + delta) wᵀ`, `w` the fused `[gate | up]` projection
/// (`i` rows each, from row 0 and row `i`): the MLP's SwiGLU input to its down projection, for a
/// decode step of one row on the GPU, one kernel whose `(r, x)` equal
/// [`small_batch_add_norm_linear`] followed by [`swiglu`] bit for bit (the down projection then
/// runs as a plain GEMV, not one forming SwiGLU per step). `None` where it does not apply, or
/// when `DELTASERVE_SWIGLU_PAIRS=0` turns it off (for comparisons).
pub fn small_batch_add_norm_swiglu(
    h: &Tensor,
    delta: Option<&Tensor>,
    norm_weight: &Tensor,
    eps: f32,
    w: &Tensor,
    i: usize,
) -> Result<Option<(Tensor, Tensor)>> {
    #[cfg(feature = "cuda")]
    if h.device().is_cuda() && w.device().is_cuda() {
        if small_batch_gemv_off() || fused_norm_off() || batch_invariant() || swiglu_pairs_off() || h.dim(0)? != 1 {
            return Ok(None);
        }
        return crate::cuda::add_norm_gemv_swiglu(h, delta, norm_weight, eps, w, i);
    }
    let _ = (h, delta, norm_weight, eps, w, i);
    Ok(None)
}

/// [`small_batch_add_norm_linear`] with `y` widened to f32 into `out` `[B, N]` (a decode step's
/// logits, in a CUDA graph's fixed buffer): the bits of [`to_f32_into`] of its `y`, without the
/// cast's launch. Returns `r`, or `None` (nothing written) where it does not apply, or when
/// `DELTASERVE_HEAD_F32=0` turns it off (for comparisons): the caller runs the steps apart.
pub fn small_batch_add_norm_linear_f32_into(
    h: &Tensor,
    delta: Option<&Tensor>,
    norm_weight: &Tensor,
    eps: f32,
    w: &Tensor,
    out: &Tensor,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if h.device().is_cuda() && w.device().is_cuda() && out.device().is_cuda() {
        let off = small_batch_gemv_off() || fused_norm_off() || head_f32_off() || batch_invariant();
        if off || h.dim(0)? > ADD_NORM_LINEAR_MAX_ROWS {
            return Ok(None);
        }
        return crate::cuda::add_norm_gemv_f32_into(h, delta, norm_weight, eps, w, out);
    }
    let _ = (h, delta, norm_weight, eps, w, out);
    Ok(None)
}

/// A decode step's short conv over the first C columns of a projection ([`super::conv_step`]'s
/// inputs but `x`), for [`small_batch_add_norm_conv_linear`].
pub struct ConvStepFold<'a, 's> {
    /// `[C, W]` f32.
    pub weight: &'a Tensor,
    /// The conv states, `[C, W]` a slot.
    pub states: &'a mut crate::SlotBuffer,
    /// The slot of each row.
    pub slots: crate::StepSlots<'s>,
    /// What follows the conv.
    pub act: crate::ConvActivation,
}

/// [`small_batch_add_norm_linear`] whose kernel also runs the decode step's short conv on the
/// projection's first C output columns (a Gated DeltaNet layer's `[q | k | v]`): `(r, y, c)`
/// with `c` `[B, C]` f32 equal, bit for bit, to [`super::conv_step`] of `y[:, ..C]`, and the
/// conv states updated as it updates them. One launch and one round trip of those columns fewer
/// a layer. `None` where it does not apply (as [`small_batch_add_norm_linear`], or a conv width
/// other than fla's 4, or `DELTASERVE_CONV_FOLD=0`): the caller runs the steps apart.
pub fn small_batch_add_norm_conv_linear(
    h: &Tensor,
    delta: Option<&Tensor>,
    norm_weight: &Tensor,
    eps: f32,
    w: &Tensor,
    conv: ConvStepFold<'_, '_>,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    #[cfg(feature = "cuda")]
    if h.device().is_cuda() && w.device().is_cuda() {
        let rows = h.dim(0)?;
        let off = small_batch_gemv_off() || fused_norm_off() || conv_fold_off() || batch_invariant();
        // Declined before the checks, so that the conv step that then runs checks only once.
        if off || rows > ADD_NORM_LINEAR_MAX_ROWS || !matches!(w.dtype(), DType::BF16 | DType::F16) {
            return Ok(None);
        }
        const OP: &str = "add_norm_gemv_conv";
        let shape = dims2(OP, "conv weight", conv.weight)?;
        super::conv::check_step_states(OP, rows, shape, conv.states, &conv.slots)?;
        let Some(states) = conv.states.device_slots() else { return Ok(None) };
        let silu = conv.act == crate::ConvActivation::Silu;
        let fold = crate::cuda::ConvFold { weight: conv.weight, states, slots: conv.slots, silu };
        return crate::cuda::add_norm_gemv_conv(h, delta, norm_weight, eps, w, fold);
    }
    let _ = (h, delta, norm_weight, eps, w, conv);
    Ok(None)
}

/// [`super::gated_rms_norm`] of `o` `[B, H, Vd]` (gated by `z` `[B, H·Vd]`, a column slice of
/// the input projection) into `w`'s dtype, times `w`ᵀ: the mixer's output norm and `o_proj` of
/// a decode step. On the GPU for B·H ≤ [`GATED_NORM_LINEAR_MAX_HEAD_ROWS`], under the
/// conditions of [`small_batch_add_norm_linear`], one kernel with the two steps' bits; `None`
/// where it does not apply.
pub fn small_batch_gated_norm_linear(
    o: &Tensor,
    z: Option<&Tensor>,
    norm_weight: &Tensor,
    eps: f32,
    act: crate::GateActivation,
    w: &Tensor,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if o.device().is_cuda() && w.device().is_cuda() {
        let head_rows = o.dims().iter().rev().skip(1).product::<usize>();
        if small_batch_gemv_off() || fused_norm_off() || batch_invariant() || head_rows > GATED_NORM_LINEAR_MAX_HEAD_ROWS {
            return Ok(None);
        }
        return crate::cuda::gated_norm_gemv(o, z, norm_weight, eps, act == crate::GateActivation::Sigmoid, w);
    }
    let _ = (o, z, norm_weight, eps, act, w);
    Ok(None)
}

/// Most rows [`small_batch_linear`] runs through the GEMV kernel; cublasLt takes more. Each lane
/// of the kernel loads every row of x for each 16 bytes of W it streams, and from four rows on
/// the whole decode step is faster through cuBLAS (H100, graphs, ms at B = 3 / 4 / 6 / 8: the
/// Qwen3.5-layout 2.1B 2.48 / 2.67 / 2.83 / 3.38 with the kernel against 2.51 / 2.58 / 2.67 /
/// 2.75; the 1.39B Gated DeltaNet 2.09–2.12 / 2.24–2.29 / 2.47 / 2.88 against 2.08 / 2.12 / 2.30
/// / 2.40; `benches/results/h100-gemv_rows-2026-11-28/`). Four rows of W a warp instead of two,
/// to halve those loads, was slower still (3.81 ms at B = 8).
pub const SMALL_BATCH_LINEAR_MAX_ROWS: usize = 3;

/// Most rows [`small_batch_add_norm_linear`] fuses. Every block of the projection forms the
/// rows' norm itself, which costs more than the launch it saves past two rows (H100, into the
/// input projection, 9228 × 2048: 24.4 / 26.1 µs fused against 29.6 / 29.7 µs apart at B = 1 / 2,
/// 34.5 against 33.3 µs at B = 3, 51.6 against 41.9 µs at B = 8).
pub const ADD_NORM_LINEAR_MAX_ROWS: usize = 2;

/// Most head rows (B · H) [`small_batch_gated_norm_linear`] fuses: a warp of each block
/// normalises one head row, and more than one a warp puts them one after another ahead of the
/// weights (H100, into `o_proj` 2048 × 3072: 6 heads of 512 at B = 1 16.9 µs fused against 21.8
/// µs apart, at B = 2 22.2 against 22.0; 32 heads of 128 at B = 1 23.9 against 18.1). Loading a
/// warp's four rows of 128 together did not pay either: the Qwen3.5-layout decode step at B = 1
/// took 2.14 ms with it against 2.08–2.11 ms without
/// (`benches/results/h100-hybrid_attention-2026-11-27/`); on the H200, in chains of launches,
/// 7.97 µs against 7.94 apart (`benches/results/h200-one_row_prologues-2026-11-30/call4-prologues/`).
pub const GATED_NORM_LINEAR_MAX_HEAD_ROWS: usize = 8;

/// Most rows [`small_batch_swiglu_linear`] fuses. Every warp recomputes the SwiGLU of the x
/// elements it reads; with more rows that costs more than the launch it saves (H100, I=5632 →
/// 2048: fused 16.5 / 18.0 µs against 19.5 / 19.6 µs apart at B = 1 / 2, 30.6 against 23.4 µs
/// at B = 4). Forming it once a block in shared memory instead was slower at B = 1 and 8
/// (18.0 and 30.6 µs) and even at B = 4.
pub const SWIGLU_LINEAR_MAX_ROWS: usize = 2;

/// [`SMALL_BATCH_LINEAR_MAX_ROWS`], or `DELTASERVE_SMALL_BATCH_GEMV_ROWS` (for comparisons; the
/// kernel takes at most 8).
#[cfg(feature = "cuda")]
fn small_batch_linear_max_rows() -> usize {
    env_count!("DELTASERVE_SMALL_BATCH_GEMV_ROWS").unwrap_or(SMALL_BATCH_LINEAR_MAX_ROWS)
}

/// `DELTASERVE_SMALL_BATCH_GEMV=0`: the small-batch kernels stand aside (for comparisons).
#[cfg(feature = "cuda")]
fn small_batch_gemv_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_SMALL_BATCH_GEMV").is_ok_and(|v| v == "0"))
}

/// Whether the skinny GEMM may take `x` `[M, K]`: a GEMM on the GPU ([`gpu_gemm`]) of at most
/// [`SKINNY_LINEAR_MAX_ROWS`] rows (or `DELTASERVE_SKINNY_ROWS`), unless
/// [`crate::cuda::set_skinny_gemm`] or `DELTASERVE_SKINNY_GEMM=0` turned it off.
#[cfg(feature = "cuda")]
fn skinny_rows(x: &Tensor, w: &Tensor) -> Result<bool> {
    Ok(crate::cuda::skinny_gemm_on() && gpu_gemm(x, w)? && x.dim(0)? <= skinny_max_rows())
}

/// [`SKINNY_LINEAR_MAX_ROWS`], or `DELTASERVE_SKINNY_ROWS` (for comparisons; the kernel takes at
/// most 64).
#[cfg(feature = "cuda")]
pub(crate) fn skinny_max_rows() -> usize {
    env_count!("DELTASERVE_SKINNY_ROWS").unwrap_or(SKINNY_LINEAR_MAX_ROWS).min(crate::cuda::SKINNY_MAX_ROWS)
}

/// Whether [`linear`] runs `x` `[M, K]` through a GEMM on the GPU: both operands there, past the
/// GEMV kernels' rows, not the batch-invariant mode.
#[cfg(feature = "cuda")]
fn gpu_gemm(x: &Tensor, w: &Tensor) -> Result<bool> {
    let on_gpu = x.device().is_cuda() && w.device().is_cuda() && x.rank() == 2 && !batch_invariant();
    Ok(on_gpu && (small_batch_gemv_off() || x.dim(0)? > small_batch_linear_max_rows()))
}

/// `DELTASERVE_HEAD_GEMM_F32=0`: [`linear_f32_into`] stands aside (for comparisons).
#[cfg(feature = "cuda")]
fn head_gemm_f32_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_HEAD_GEMM_F32").is_ok_and(|v| v == "0"))
}

/// `DELTASERVE_HEAD_F32=0`: a decode step's logits are cast to f32 by a launch of their own
/// (for comparisons).
#[cfg(feature = "cuda")]
fn head_f32_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_HEAD_F32").is_ok_and(|v| v == "0"))
}

/// `DELTASERVE_CONV_FOLD=0`: a decode step's short conv runs as a kernel of its own after the
/// input projection (for comparisons).
#[cfg(feature = "cuda")]
fn conv_fold_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_CONV_FOLD").is_ok_and(|v| v == "0"))
}

/// `DELTASERVE_EMBED_KERNEL=0`: a step's embeddings through candle's gather and cast (for
/// comparisons).
#[cfg(feature = "cuda")]
fn embed_kernel_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_EMBED_KERNEL").is_ok_and(|v| v == "0"))
}

/// `DELTASERVE_SWIGLU_PAIRS=0`: a one-row decode step's SwiGLU is formed by its down
/// projection's kernel (for comparisons).
#[cfg(feature = "cuda")]
fn swiglu_pairs_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_SWIGLU_PAIRS").is_ok_and(|v| v == "0"))
}

/// `DELTASERVE_FUSED_NORM=0`: the norms run as kernels of their own before the projections (for
/// comparisons).
#[cfg(feature = "cuda")]
fn fused_norm_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_FUSED_NORM").is_ok_and(|v| v == "0"))
}
