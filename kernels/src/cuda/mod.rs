//! Launchers for the CUDA kernels of `kernels/cuda/*.cu` (compiled by build.rs, embedded as
//! SASS and loaded once per context by [`modules`]). The mixer's inputs are converted to
//! contiguous f32; the conv, SwiGLU and small-batch GEMV read their activations where they lie
//! (`RowsArg`: column slices of a fused projection, f32/bf16/f16). States are updated in place
//! in a [`DeviceSlots`] allocation, by slot index.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DevicePtr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaStorage, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, DType, Shape, Storage, Tensor};

use crate::{KernelError, Result};

mod modules;
use modules::func;

/// Largest key head dim the decode and chunk kernels take.
pub const MAX_HEAD_K: usize = 256;
use crate::PREFILL_CHUNK as CHUNK;

/// A kernel path that is on unless its environment variable says `0` (for comparisons on the
/// device); GPU tests flip it with [`Switch::set`] to compare the two paths bit for bit.
pub(crate) struct Switch {
    env: &'static str,
    init: std::sync::Once,
    on: std::sync::atomic::AtomicBool,
}

impl Switch {
    pub(crate) const fn new(env: &'static str) -> Self {
        Self { env, init: std::sync::Once::new(), on: std::sync::atomic::AtomicBool::new(true) }
    }

    /// Whether the path is on (the environment is read on first use).
    pub(crate) fn on(&self) -> bool {
        self.init.call_once(|| {
            if std::env::var(self.env).is_ok_and(|v| v == "0") {
                self.on.store(false, std::sync::atomic::Ordering::Relaxed);
            }
        });
        self.on.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns the path on or off for the process, over the environment.
    pub(crate) fn set(&self, on: bool) {
        self.on();
        self.on.store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Bytes of `dev`'s memory free now (for sizing caches).
pub fn free_memory(dev: &CudaDevice) -> Result<usize> {
    Ok(dev.cuda_stream().context().mem_get_info().w()?.0)
}

/// Makes `dev`'s context current on the calling thread (a tensor parallel rank's pass runs on a
/// worker thread; some library calls expect the context already current).
pub fn bind_to_thread(dev: &CudaDevice) -> Result<()> {
    bound_stream(dev).map(|_| ())
}

/// `dev`'s stream, its context made current on the calling thread first: a raw driver call
/// (cudarc's safe calls bind for themselves) acts on the current context, and a split model's
/// pool mirrors every rank's copy from one thread.
pub(crate) fn bound_stream(dev: &CudaDevice) -> Result<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>> {
    let stream = dev.cuda_stream();
    stream.context().bind_to_thread().w()?;
    Ok(stream)
}

/// Keeps memory freed on `dev` in its stream-ordered allocation pool instead of handing it back
/// to the driver at every synchronisation (the pool's default release threshold is 0). Without
/// it each prefill maps its scratch buffers (hundreds of MB for long prompts) afresh; with it
/// the pool behaves as PyTorch's caching allocator does.
pub fn retain_freed_memory(dev: &CudaDevice) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let cu_dev = dev.cuda_stream().context().cu_device();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: `pool` is written by the driver before use; `threshold` outlives the call.
    unsafe {
        sys::cuDeviceGetMemPool(&mut pool, cu_dev).result().w()?;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        sys::cuMemPoolSetAttribute(pool, attr, (&mut threshold as *mut u64).cast()).result().w()?;
    }
    Ok(())
}

fn cuda_dev(t: &Tensor, op: &'static str) -> Result<CudaDevice> {
    match t.device() {
        candle_core::Device::Cuda(d) => Ok(d.clone()),
        other => Err(KernelError::UnsupportedDevice { op, device: format!("{other:?} (expected cuda)") }),
    }
}

/// Contiguous f32 copy (or the tensor itself when it already is one).
fn f32c(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.contiguous()?)
}

/// Borrows a contiguous CUDA tensor's device memory (element type `$ty`, f32 unless given) for
/// the duration of `$body`.
macro_rules! with_view {
    ($t:expr, $v:ident, $body:block) => {
        with_view!($t, $v, f32, $body)
    };
    ($t:expr, $v:ident, $ty:ty, $body:block) => {{
        let (guard, layout) = $t.storage_and_layout();
        let candle_core::Storage::Cuda(cs) = &*guard else {
            return Err($crate::KernelError::UnsupportedDevice { op: "cuda view", device: "non-cuda storage".into() });
        };
        let $v: candle_core::cuda_backend::cudarc::driver::CudaView<'_, $ty> = cs.as_cuda_slice::<$ty>()?.slice(layout.start_offset()..);
        $body
    }};
}

fn wrap<T: candle_core::cuda_backend::CudaDType>(dev: &CudaDevice, data: CudaSlice<T>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(CudaStorage::wrap_cuda_slice(data, dev.clone())), shape, BackpropOp::none(), false)
}

/// An uninitialised `[rows, cols]` tensor in `dtype` (f32 for any dtype but bf16 and f16), for
/// a kernel that writes every element.
fn alloc_rows(dev: &CudaDevice, dtype: DType, rows: usize, cols: usize) -> Result<Tensor> {
    let n = rows * cols;
    // SAFETY (all three): the caller's kernel writes every element before anything reads it.
    Ok(match dtype {
        DType::BF16 => wrap(dev, unsafe { dev.alloc::<half::bf16>(n) }?, (rows, cols)),
        DType::F16 => wrap(dev, unsafe { dev.alloc::<half::f16>(n) }?, (rows, cols)),
        _ => wrap(dev, unsafe { dev.alloc::<f32>(n) }?, (rows, cols)),
    })
}

/// The device's multiprocessor count.
pub fn sm_count(dev: &CudaDevice) -> Result<usize> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as SM_COUNT;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    // Asked of the driver once per device ordinal: eager decode steps pick their kernel by it.
    static KNOWN: [AtomicUsize; 16] = [const { AtomicUsize::new(0) }; 16];
    let ctx = dev.cuda_stream().context().clone();
    let known = KNOWN.get(ctx.ordinal());
    if let Some(n) = known.map(|k| k.load(Relaxed)).filter(|&n| n > 0) {
        return Ok(n);
    }
    let n = ctx.attribute(SM_COUNT).w()?.max(1) as usize;
    if let Some(k) = known {
        k.store(n, Relaxed);
    }
    Ok(n)
}

fn indices(dev: &CudaDevice, xs: &[usize]) -> Result<CudaSlice<i32>> {
    Ok(index_tables(dev, [xs])?.0)
}

/// Several index tables in one upload (each host-to-device copy is a gap in the stream, so a
/// prefill pays one, not four): the buffer and each table's range in it.
fn index_tables<const N: usize>(dev: &CudaDevice, tables: [&[usize]; N]) -> Result<(CudaSlice<i32>, [std::ops::Range<usize>; N])> {
    let mut ranges = [(); N].map(|_| 0..0);
    let mut v: Vec<i32> = Vec::with_capacity(tables.iter().map(|t| t.len()).sum());
    for (t, range) in tables.iter().zip(&mut ranges) {
        let start = v.len();
        v.extend(t.iter().map(|&x| x as i32));
        *range = start..v.len();
    }
    Ok((dev.cuda_stream().clone_htod(&v).w()?, ranges))
}

/// A launch's index tables by address: `host` uploaded in one copy, or with `fixed` the
/// matching parts of a pass's fixed buffer (a pass captured as a CUDA graph reads its tables
/// there; a replay writes them first). Returns the upload (keep it alive while the kernels
/// may read it) and each table's address.
fn table_addrs<const N: usize>(
    dev: &CudaDevice,
    host: [&[usize]; N],
    fixed: Option<(&crate::PackedTables, [crate::packing::Part; N])>,
) -> Result<(Option<CudaSlice<i32>>, [u64; N])> {
    if let Some((t, parts)) = fixed {
        let base = device_address::<i32>(t.tensor())?;
        return Ok((None, parts.map(|p| base + 4 * t.range(p).start as u64)));
    }
    let (buf, ranges) = index_tables(dev, host)?;
    let base = {
        let (base, _sync) = buf.device_ptr(buf.stream());
        base
    };
    Ok((Some(buf), ranges.map(|r| base + 4 * r.start as u64)))
}

/// The device address of a contiguous CUDA tensor's first element. The caller keeps the tensor
/// alive for as long as a kernel may read through the address.
fn device_address<T: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr>(
    t: &Tensor,
) -> Result<u64> {
    if !t.is_contiguous() {
        return Err(KernelError::Shape {
            op: "device_address",
            input: "tensor",
            expected: "a contiguous tensor".into(),
            actual: t.dims().to_vec(),
        });
    }
    first_element_address::<T>(t)
}

/// The device address of a contiguous index list the kernels read as i32 (slots, positions): an
/// [`crate::slots::index_dtype`] tensor.
fn index_address(t: &Tensor) -> Result<u64> {
    match t.dtype() {
        DType::U32 => device_address::<u32>(t),
        _ => device_address::<i32>(t),
    }
}

/// The device address of a CUDA tensor's first element, whatever its strides.
fn first_element_address<T: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr>(
    t: &Tensor,
) -> Result<u64> {
    let (guard, layout) = t.storage_and_layout();
    let candle_core::Storage::Cuda(cs) = &*guard else {
        return Err(KernelError::UnsupportedDevice { op: "device_address", device: "non-cuda storage".into() });
    };
    let slice = cs.as_cuda_slice::<T>()?;
    let (ptr, _sync) = slice.device_ptr(slice.stream());
    Ok(ptr + (layout.start_offset() * std::mem::size_of::<T>()) as u64)
}

/// [`first_element_address`] for f32, bf16 and f16 tensors.
fn first_element_address_any(t: &Tensor) -> Result<u64> {
    match t.dtype() {
        DType::F32 => first_element_address::<f32>(t),
        DType::BF16 => first_element_address::<half::bf16>(t),
        DType::F16 => first_element_address::<half::f16>(t),
        other => Err(KernelError::Shape {
            op: "device_address",
            input: "tensor",
            expected: format!("f32, bf16 or f16, not {other:?}"),
            actual: t.dims().to_vec(),
        }),
    }
}

/// A rank-2 input that a kernel reads row by row where it lies: a column slice of a wider
/// tensor (one part of a fused projection) needs no copy. Other layouts are made contiguous
/// first and dtypes other than f32, bf16 and f16 converted to f32.
struct RowsArg {
    /// The tensor read (the copy, when one was made): alive until the launch is queued, and
    /// candle frees device memory in stream order after that.
    _t: Tensor,
    /// Address of element [0, 0].
    ptr: u64,
    /// Row stride in elements (`long` in the kernels).
    ld: i64,
    /// The kernel-name suffix of its dtype.
    suffix: &'static str,
    /// Bytes an element.
    elem_bytes: usize,
}

impl RowsArg {
    fn new(t: &Tensor) -> Result<Self> {
        let (_, cols) = t.dims2()?;
        let t = match t.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => t.clone(),
            _ => t.to_dtype(DType::F32)?,
        };
        let t = if t.stride()[1] == 1 || cols <= 1 { t } else { t.contiguous()? };
        let ld = if t.dim(0)? <= 1 { cols } else { t.stride()[0] };
        let suffix = match t.dtype() {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            _ => "f32",
        };
        Ok(Self { ptr: first_element_address_any(&t)?, ld: ld as i64, suffix, elem_bytes: t.dtype().size_in_bytes(), _t: t })
    }

    /// Whether every row of `cols` columns splits into aligned groups of `n` elements (one
    /// vector access each).
    fn vectorisable(&self, n: usize, cols: usize) -> bool {
        cols.is_multiple_of(n) && (self.ld as usize).is_multiple_of(n) && self.ptr.is_multiple_of((n * self.elem_bytes) as u64)
    }
}

/// Overwrites a contiguous CUDA tensor's elements with `values` (as many), in stream order.
/// For buffers a CUDA graph reads at fixed addresses (its inputs between replays); the caller
/// owns the tensor and lets no other tensor share its storage.
pub fn write_from_host<T>(t: &Tensor, values: &[T]) -> Result<()>
where
    T: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
{
    if t.elem_count() != values.len() {
        return Err(KernelError::Shape {
            op: "write_from_host",
            input: "tensor",
            expected: format!("{} elements", values.len()),
            actual: t.dims().to_vec(),
        });
    }
    write_at(t, 0, values)
}

/// Overwrites `values.len()` elements of a contiguous CUDA tensor from element `offset` on, in
/// stream order (see [`write_from_host`]).
pub fn write_at<T>(t: &Tensor, offset: usize, values: &[T]) -> Result<()>
where
    T: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
{
    if offset + values.len() > t.elem_count() {
        return Err(KernelError::Shape {
            op: "write_at",
            input: "tensor",
            expected: format!("at least {} elements", offset + values.len()),
            actual: t.dims().to_vec(),
        });
    }
    if values.is_empty() {
        return Ok(());
    }
    let dev = cuda_dev(t, "write_at")?;
    let dst = device_address::<T>(t)? + (offset * std::mem::size_of::<T>()) as u64;
    // SAFETY: dst spans `values.len()` elements of T inside `t` (checked above), in memory that
    // `t` keeps alive; a pageable source is staged before the call returns.
    let stream = bound_stream(&dev)?;
    unsafe { candle_core::cuda_backend::cudarc::driver::result::memcpy_htod_async(dst, values, stream.cu_stream()) }.w()?;
    Ok(())
}

fn grid(x: usize, y: usize, z: usize, block: u32, smem: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (x as u32, y as u32, z as u32), block_dim: (block, 1, 1), shared_mem_bytes: smem }
}

fn check_head_dim(op: &'static str, k: usize) -> Result<()> {
    if k == 0 || k > MAX_HEAD_K {
        return Err(KernelError::Shape { op, input: "k", expected: format!("head dim in 1..={MAX_HEAD_K}"), actual: vec![k] });
    }
    Ok(())
}

/// Runs `$body` with the optional f32 gate tensor `$g` borrowed as a kernel pointer (null when
/// absent).
macro_rules! with_mixer_gate {
    ($g:expr, $gp:ident, $body:block) => {{
        match &$g {
            Some(g) => with_view!(g, gv, {
                let $gp = GatePtr::View(&gv);
                $body
            }),
            None => {
                let $gp = GatePtr::Null(0u64);
                $body
            }
        }
    }};
}

/// Runs `launch` with every mixer input borrowed as a device view (g as a null pointer when
/// absent).
macro_rules! with_mixer_views {
    ($x:expr, $q:ident, $k:ident, $v:ident, $b:ident, $g:ident, $body:block) => {{
        let (q, k, v, beta) = (f32c($x.q)?, f32c($x.k)?, f32c($x.v)?, f32c($x.beta)?);
        let g = $x.g.map(f32c).transpose()?;
        with_view!(q, $q, { with_view!(k, $k, { with_view!(v, $v, { with_view!(beta, $b, { with_mixer_gate!(g, $g, $body) }) }) }) })
    }};
}

/// An optional kernel pointer argument.
enum GatePtr<'a, 'b> {
    View(&'a CudaView<'b, f32>),
    Null(u64),
}

fn push_gate<'a>(l: &mut candle_core::cuda_backend::cudarc::driver::LaunchArgs<'a>, g: &'a GatePtr<'a, '_>) {
    match g {
        GatePtr::View(v) => {
            l.arg(*v);
        }
        GatePtr::Null(n) => {
            l.arg(n);
        }
    }
}

pub(crate) mod attention;
mod conv;
mod conv_prep;
mod copy;
mod decode;
mod device_slots;
mod gemm;
mod gemm_tune;
mod gemv;
pub mod graph;
mod moe;
mod norm_gemv;
mod prefill;
mod rows;
mod sample;
mod skinny;

#[cfg(feature = "nccl")]
pub mod nccl;
pub use attention::{attn_warpgroup_launches, paged_attention, set_attn_head_pairs, set_attn_warpgroup, set_fused_decode};
pub use conv::{conv_prefill, conv_step};
pub use conv_prep::{conv_prep, conv_prep_launches, set_conv_prep, ConvPrepInputs};
pub(crate) use copy::copy_many;
pub use copy::{embedding_f32, to_f32, to_f32_into};
pub use decode::{gated_delta_step, gated_delta_step_raw};
pub use device_slots::{DeviceSlots, PinnedSlots};
pub use gemm::{
    linear_lt, linear_lt_counts, linear_lt_f32, linear_lt_f32_into, linear_lt_parts, linear_lt_pick, set_split_parts, split_parts_count,
    LtVariant,
};
pub use gemm_tune::{gemm_tuning_counts, set_gemm_tuning};
pub use gemv::{gemv, gemv_invariant, gemv_swiglu};
pub use moe::{moe_warpgroup_launches, set_moe_warpgroup, sparse_moe};
pub use norm_gemv::{add_norm_gemv, add_norm_gemv_conv, add_norm_gemv_f32_into, add_norm_gemv_swiglu, gated_norm_gemv, ConvFold};
pub use prefill::{
    gated_delta_chunk_tc, set_prep_pairs, set_two_warpgroup_pass, set_warpgroup_pass, set_warpgroup_prep, split_key_pass_launches,
    two_warpgroup_launches,
};
pub use rows::{add_rms_norm, add_rms_norm_parts, gated_rms_norm, prep, sigmoid_gate, swiglu, GateInputs};
pub use sample::sample;
pub use skinny::{
    set_skinny_gemm, set_skinny_swiglu, skinny_conv, skinny_conv_launches, skinny_gemm, skinny_gemm_available, skinny_gemm_on,
    skinny_launches, skinny_swiglu, skinny_swiglu_launches, skinny_swiglu_on, SkinnyConfig, SkinnyOut, SKINNY_MAX_ROWS,
};
