//! Launchers for the CUDA kernels of `kernels/cuda/*.cu` (compiled to PTX by build.rs and
//! loaded through candle's custom-module cache). Inputs are converted to contiguous f32;
//! states are updated in place in a [`DeviceSlots`] allocation, by slot index.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DevicePtr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaStorage, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, DType, Shape, Storage, Tensor};

use crate::ops::MixerInputs;
use crate::{KernelError, Result, StepSlots};

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

/// Largest key head dim the decode and chunk kernels take.
pub const MAX_HEAD_K: usize = 256;
const CHUNK: usize = 64;

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

/// A GPU allocation of f32 state slots.
#[derive(Debug, Clone)]
pub struct DeviceSlots {
    dev: CudaDevice,
    data: CudaSlice<f32>,
}

impl DeviceSlots {
    /// `len` zeroed f32 values on `dev`.
    pub fn zeros(dev: &CudaDevice, len: usize) -> Result<Self> {
        Ok(Self { dev: dev.clone(), data: dev.alloc_zeros::<f32>(len.max(1))? })
    }

    /// Copies `len` values at `offset` to the host.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<f32>> {
        Ok(self.dev.cuda_stream().clone_dtoh(&self.data.slice(offset..offset + len)).w()?)
    }

    /// Copies `values` from the host to `offset`.
    pub fn write(&mut self, offset: usize, values: &[f32]) -> Result<()> {
        let stream = self.dev.cuda_stream();
        stream.memcpy_htod(values, &mut self.data.slice_mut(offset..offset + values.len())).w()?;
        Ok(())
    }

    /// Zeroes `len` values at `offset`.
    pub fn zero(&mut self, offset: usize, len: usize) -> Result<()> {
        let stream = self.dev.cuda_stream();
        stream.memset_zeros(&mut self.data.slice_mut(offset..offset + len)).w()?;
        Ok(())
    }

    /// Copies `len` values from `src` to `dst` (non-overlapping slots).
    pub fn copy(&mut self, src: usize, dst: usize, len: usize) -> Result<()> {
        let stream = self.dev.cuda_stream();
        let tmp = stream.clone_dtod(&self.data.slice(src..src + len)).w()?;
        stream.memcpy_dtod(&tmp, &mut self.data.slice_mut(dst..dst + len)).w()?;
        Ok(())
    }
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
        let Storage::Cuda(cs) = &*guard else {
            return Err(KernelError::UnsupportedDevice { op: "cuda view", device: "non-cuda storage".into() });
        };
        let $v: CudaView<'_, $ty> = cs.as_cuda_slice::<$ty>()?.slice(layout.start_offset()..);
        $body
    }};
}

fn wrap<T: candle_core::cuda_backend::CudaDType>(dev: &CudaDevice, data: CudaSlice<T>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(CudaStorage::wrap_cuda_slice(data, dev.clone())), shape, BackpropOp::none(), false)
}

fn indices(dev: &CudaDevice, xs: &[usize]) -> Result<CudaSlice<i32>> {
    let v: Vec<i32> = xs.iter().map(|&x| x as i32).collect();
    Ok(dev.cuda_stream().clone_htod(&v).w()?)
}

/// Slot indices a decode kernel takes by value (`SlotList` in common.cuh); longer batches pass
/// the rest through device memory.
const INLINE_SLOTS: usize = 64;

#[repr(C)]
#[derive(Clone, Copy)]
struct SlotList {
    s: [i32; INLINE_SLOTS],
}

// SAFETY: plain `#[repr(C)]` integers, laid out as the kernels' `struct SlotList`.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for SlotList {}

/// A decode step's slots: the first [`INLINE_SLOTS`] by value when the batch is small (no
/// host-to-device copy), else all of them through device memory: uploaded here, or the
/// caller's device copy (a CUDA graph's, which the next replay rewrites).
struct DecodeSlots {
    inline: SlotList,
    uploaded: Option<CudaSlice<i32>>,
    /// The device list's address, 0 when the slots are inline.
    ptr: u64,
}

impl DecodeSlots {
    fn new(dev: &CudaDevice, slots: StepSlots<'_>) -> Result<Self> {
        let mut inline = SlotList { s: [0; INLINE_SLOTS] };
        if let Some(t) = slots.device {
            return Ok(Self { inline, uploaded: None, ptr: device_address::<i32>(t)? });
        }
        for (d, &s) in inline.s.iter_mut().zip(slots.host) {
            *d = s as i32;
        }
        let uploaded = if slots.host.len() > INLINE_SLOTS { Some(indices(dev, slots.host)?) } else { None };
        Ok(Self { inline, uploaded, ptr: 0 })
    }

    /// Pushes the two kernel arguments (`SlotList slots, const int* more_slots`).
    fn push<'a>(&'a self, l: &mut candle_core::cuda_backend::cudarc::driver::LaunchArgs<'a>) {
        l.arg(&self.inline);
        match &self.uploaded {
            Some(m) => l.arg(m),
            None => l.arg(&self.ptr),
        };
    }
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
    let (guard, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*guard else {
        return Err(KernelError::UnsupportedDevice { op: "device_address", device: "non-cuda storage".into() });
    };
    let slice = cs.as_cuda_slice::<T>()?;
    let (ptr, _sync) = slice.device_ptr(slice.stream());
    Ok(ptr + (layout.start_offset() * std::mem::size_of::<T>()) as u64)
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
    let dev = cuda_dev(t, "write_from_host")?;
    let dst = device_address::<T>(t)?;
    // SAFETY: dst spans `values.len()` elements of T (checked above) in memory that `t` keeps
    // alive; a pageable source is staged before the call returns.
    unsafe { candle_core::cuda_backend::cudarc::driver::result::memcpy_htod_async(dst, values, dev.cuda_stream().cu_stream()) }.w()?;
    Ok(())
}

fn grid(x: usize, y: usize, z: usize, block: u32, smem: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (x as u32, y as u32, z as u32), block_dim: (block, 1, 1), shared_mem_bytes: smem }
}

/// Causal conv + SiLU over packed sequences `x` `[Σ T, C]`: sequence `s` owns rows
/// `cu_seqlens[s]..cu_seqlens[s+1]` and the conv state of `slots[s]`. Returns `[Σ T, C]` f32.
pub fn conv_prefill(
    x: &Tensor,
    weight: &Tensor,
    states: &mut DeviceSlots,
    cu_seqlens: &[usize],
    slots: &[usize],
    silu: bool,
) -> Result<Tensor> {
    let dev = cuda_dev(x, "conv_prefill")?;
    let (rows, c) = x.dims2()?;
    let w = weight.dim(1)?;
    let (x, weight) = (f32c(x)?, f32c(weight)?);
    let (cu, sl) = (indices(&dev, cu_seqlens)?, indices(&dev, slots)?);
    // SAFETY: cu_seqlens covers every row (checked by ops), and the kernel writes each.
    let mut y = unsafe { dev.alloc::<f32>(rows * c) }?;
    let f = dev.get_or_load_custom_func("conv_prefill_f32", "conv", ptx::CONV)?;
    let (ci, wi, si) = (c as i32, w as i32, silu as i32);
    with_view!(x, xv, {
        with_view!(weight, wv, {
            let mut b = f.builder();
            b.arg(&xv).arg(&wv).arg(&mut states.data).arg(&cu).arg(&sl).arg(&mut y).arg(&ci).arg(&wi).arg(&si);
            unsafe { b.launch(grid(c.div_ceil(128), slots.len(), 1, 128, 0)) }.w()?;
        })
    });
    Ok(wrap(&dev, y, (rows, c)))
}

/// One conv step: row `b` of `x` `[B, C]` shifts into the conv state of `slots[b]`.
pub fn conv_step(x: &Tensor, weight: &Tensor, states: &mut DeviceSlots, slots: StepSlots<'_>, silu: bool) -> Result<Tensor> {
    let dev = cuda_dev(x, "conv_step")?;
    let (rows, c) = x.dims2()?;
    let w = weight.dim(1)?;
    let (x, weight) = (f32c(x)?, f32c(weight)?);
    let sl = DecodeSlots::new(&dev, slots)?;
    // SAFETY: the kernel writes every element of y.
    let mut y = unsafe { dev.alloc::<f32>(rows * c) }?;
    let f = dev.get_or_load_custom_func("conv_step_f32", "conv", ptx::CONV)?;
    let (ci, wi, si) = (c as i32, w as i32, silu as i32);
    with_view!(x, xv, {
        with_view!(weight, wv, {
            let mut b = f.builder();
            b.arg(&xv).arg(&wv).arg(&mut states.data);
            sl.push(&mut b);
            b.arg(&mut y).arg(&ci).arg(&wi).arg(&si);
            unsafe { b.launch(grid(c.div_ceil(128), rows, 1, 128, 0)) }.w()?;
        })
    });
    Ok(wrap(&dev, y, (rows, c)))
}

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
/// `[N, D]` in `dtype` (or none) and `weight` `[D]`. Returns `(r, x)`. Inputs in other layouts
/// or dtypes take the same math in candle's ops.
pub fn add_rms_norm(h: &Tensor, delta: Option<&Tensor>, weight: &Tensor, eps: f32, dtype: DType) -> Result<(Tensor, Tensor)> {
    let dev = cuda_dev(h, "add_rms_norm")?;
    let (rows, d) = h.dims2()?;
    let name = match dtype {
        DType::F32 => "add_rms_norm_f32",
        DType::BF16 => "add_rms_norm_bf16",
        DType::F16 => "add_rms_norm_f16",
        _ => "",
    };
    let fits = |t: &Tensor| t.is_contiguous() && t.dims() == [rows, d] && t.dtype() == dtype;
    if name.is_empty() || h.dtype() != DType::F32 || !h.is_contiguous() || !delta.is_none_or(fits) {
        let r = match delta {
            Some(x) => (x.to_dtype(DType::F32)? + h)?,
            None => h.clone(),
        };
        let ms = (r.sqr()?.mean_keepdim(1)? + eps as f64)?;
        let x = r.broadcast_div(&ms.sqrt()?)?.broadcast_mul(&weight.to_dtype(DType::F32)?)?.to_dtype(dtype)?;
        return Ok((r, x));
    }
    let w = f32c(weight)?;
    // SAFETY (both): the kernel writes every element of r and x.
    let x = match dtype {
        DType::BF16 => wrap(&dev, unsafe { dev.alloc::<half::bf16>(rows * d) }?, (rows, d)),
        DType::F16 => wrap(&dev, unsafe { dev.alloc::<half::f16>(rows * d) }?, (rows, d)),
        _ => wrap(&dev, unsafe { dev.alloc::<f32>(rows * d) }?, (rows, d)),
    };
    let mut r = unsafe { dev.alloc::<f32>(rows * d) }?;
    let f = dev.get_or_load_custom_func(name, "norm", ptx::NORM)?;
    let cfg = grid(rows, 1, 1, 256, 0);
    let di = d as i32;
    let (x_ptr, delta_ptr) = (device_address_any(&x)?, delta.map(device_address_any).transpose()?.unwrap_or(0));
    with_view!(h, hv, {
        with_view!(w, wv, {
            let mut l = f.builder();
            l.arg(&hv).arg(&delta_ptr).arg(&wv).arg(&mut r).arg(&x_ptr).arg(&di).arg(&eps);
            unsafe { l.launch(cfg) }.w()?;
        })
    });
    Ok((wrap(&dev, r, (rows, d)), x))
}

/// [`device_address`] for f32, bf16 and f16 tensors.
fn device_address_any(t: &Tensor) -> Result<u64> {
    match t.dtype() {
        DType::F32 => device_address::<f32>(t),
        DType::BF16 => device_address::<half::bf16>(t),
        DType::F16 => device_address::<half::f16>(t),
        other => Err(KernelError::Shape {
            op: "device_address",
            input: "tensor",
            expected: format!("f32, bf16 or f16, not {other:?}"),
            actual: t.dims().to_vec(),
        }),
    }
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

/// A decode kernel's shape (`gdr_decode_f32_w{warps}_r{rows}_c{cols}_b{min_blocks}` in
/// gated_delta.cu): `warps` warps of `rows` state rows each (warps · rows ≥ K), `cols` value
/// columns a lane, and at least `min_blocks` blocks an SM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DecodeShape {
    warps: usize,
    rows: usize,
    cols: usize,
    min_blocks: usize,
}

impl DecodeShape {
    /// The shapes compiled for every K range (vec and scalar); few rows a warp keeps
    /// registers low, so more warps are in flight on an SM.
    const BY_K: [(usize, DecodeShape); 4] = [
        (32, DecodeShape { warps: 8, rows: 4, cols: 4, min_blocks: 4 }),
        (64, DecodeShape { warps: 8, rows: 8, cols: 4, min_blocks: 4 }),
        (128, DecodeShape { warps: 16, rows: 8, cols: 4, min_blocks: 2 }),
        (256, DecodeShape { warps: 32, rows: 8, cols: 4, min_blocks: 1 }),
    ];

    /// The shape for key head dim `k` (≤ 256, checked by the caller), or the one named by
    /// `DELTASERVE_DECODE_KERNEL` (e.g. `w16_r8_c2_b3`, for benchmarks: only vec variants
    /// of a few shapes are compiled) when it covers `k`.
    fn for_key_dim(k: usize) -> Self {
        static WANTED: std::sync::OnceLock<Option<DecodeShape>> = std::sync::OnceLock::new();
        let wanted = *WANTED.get_or_init(|| std::env::var("DELTASERVE_DECODE_KERNEL").ok().and_then(|s| Self::parse(&s)));
        if let Some(w) = wanted.filter(|w| w.warps * w.rows >= k) {
            return w;
        }
        Self::BY_K.iter().find(|(max_k, _)| k <= *max_k).map_or(Self::BY_K[3].1, |(_, s)| *s)
    }

    /// Parses `w{warps}_r{rows}_c{cols}_b{min_blocks}`.
    fn parse(s: &str) -> Option<Self> {
        let mut it = s.split('_');
        let mut field = |p: char| it.next()?.strip_prefix(p)?.parse::<usize>().ok();
        Some(Self { warps: field('w')?, rows: field('r')?, cols: field('c')?, min_blocks: field('b')? })
    }

    fn name(&self) -> String {
        format!("w{}_r{}_c{}_b{}", self.warps, self.rows, self.cols, self.min_blocks)
    }
}

/// One decode step for `B = slots.len()` sequences, `x.n` householder steps each, reading and
/// writing the states of `slots` in place. Returns `o` `[B, HV, V]` f32.
pub fn gated_delta_step(x: &MixerInputs<'_>, states: &mut DeviceSlots, slots: StepSlots<'_>) -> Result<Tensor> {
    let dev = cuda_dev(x.q, "gated_delta_step")?;
    let (b, h, k) = x.q.dims3()?;
    let (_, hv, v) = x.v.dims3()?;
    check_head_dim("gated_delta_step", k)?;
    // 16-byte state and value accesses when V allows (and v's data is, or will be copied to,
    // an aligned buffer); element by element otherwise.
    let aligned = x.v.dtype() != DType::F32 || !x.v.is_contiguous() || x.v.layout().start_offset().is_multiple_of(4);
    let access = if v.is_multiple_of(4) && aligned { "vec" } else { "scalar" };
    let shape = DecodeShape::for_key_dim(k);
    let name = format!("gdr_decode_f32_{}_{access}", shape.name());
    let cfg = grid(v.div_ceil(32 * shape.cols), hv, b, 32 * shape.warps as u32, 0);
    let sl = DecodeSlots::new(&dev, slots)?;
    // SAFETY: the kernel writes every element of o.
    let mut o = unsafe { dev.alloc::<f32>(b * hv * v) }?;
    let f = dev.get_or_load_custom_func(&name, "gated_delta", ptx::GATED_DELTA)?;
    let ints = [h as i32, hv as i32, k as i32, v as i32, x.n.max(1) as i32];
    with_mixer_views!(x, qv, kv, vv, bv, gp, {
        let mut l = f.builder();
        l.arg(&qv).arg(&kv).arg(&vv).arg(&bv);
        push_gate(&mut l, &gp);
        l.arg(&mut states.data);
        sl.push(&mut l);
        l.arg(&mut o);
        for i in &ints {
            l.arg(i);
        }
        l.arg(&x.scale);
        unsafe { l.launch(cfg) }.w()?;
    });
    Ok(wrap(&dev, o, (b, hv, v)))
}

/// Shared memory of the tensor-core kernels, in bytes (each buffer rounded up to 128 bytes, as
/// the kernels' allocator does).
fn tc_smem(parts: &[usize]) -> usize {
    parts.iter().map(|b| b.div_ceil(128) * 128).sum()
}

/// `chunk_tc_prep`: K and Q tiles, A and T (fp32), G and β. With `lo` (f32 inputs) every bf16
/// tile has a lo half, V blocks reuse the q tiles and T1, T2 have tiles of their own; with bf16
/// inputs T1 overwrites T and T2 goes straight to global memory.
fn tc_prep_smem(k: usize, lo: bool) -> usize {
    let kp = k.div_ceil(16) * 16 + 8;
    let (tile16, tile32) = (2 * CHUNK * 72, 4 * CHUNK * 72);
    let kt = 2 * CHUNK * kp;
    let mut parts = vec![tile32, tile32, 4 * CHUNK, 4 * CHUNK, kt];
    if lo {
        let qt = kt.max(tile16);
        parts.extend([kt, qt, qt, tile16, tile16, tile16, tile16]);
    } else {
        parts.push(kt);
    }
    tc_smem(&parts)
}

/// `chunk_tc_state` (f32 inputs): S (fp32 and bf16), W, Q, P, two fp32 [64, BV] results, V'
/// and G; every bf16 tile with its lo half.
fn tc_state_smem(k: usize, bv: usize) -> usize {
    let k16 = k.div_ceil(16) * 16;
    let kt = 2 * CHUNK * (k16 + 8);
    let (sp, sb) = (bv + 4, bv + 8);
    let mut parts = vec![4 * k16 * sp, 4 * CHUNK * sp, 4 * CHUNK * sp, 4 * CHUNK];
    for t in [2 * k16 * sb, kt, kt, 2 * CHUNK * 72, 2 * CHUNK * sb] {
        parts.extend([t, t]);
    }
    tc_smem(&parts)
}

/// `chunk_mma_state` (bf16 inputs): W, Q and K tiles (K padded to the kernel's 16·KT), P, the
/// bf16 S, T2, V and V' (all bf16), and G.
fn mma_state_smem(k: usize, bv: usize) -> usize {
    let k16 = 16 * mma_row_tiles(k);
    let kt = 2 * CHUNK * (k16 + 8);
    let sb = 2 * (bv + 8);
    tc_smem(&[kt, kt, kt, 2 * CHUNK * 72, k16 * sb, 2 * CHUNK * 72, CHUNK * sb, CHUNK * sb, 4 * CHUNK])
}

/// 16-row tiles of K `chunk_mma_state` is instantiated for: the smallest of 4, 8, 16 that holds K.
fn mma_row_tiles(k: usize) -> usize {
    [4, 8, 16].into_iter().find(|&kt| 16 * kt >= k).unwrap_or(16)
}

/// Largest dynamic shared memory per block on sm_90.
const MAX_SMEM: usize = 227 * 1024;

/// Value-tile width of the state pass, from `widths` (widest first): `DELTASERVE_TC_BV` when
/// set, offered and its shared memory (`smem(bv)`) fits; else the widest that fits and still
/// gives `ctas_per_tile × V/BV` CTAs enough to cover the `sms` multiprocessors (few long
/// sequences want narrow tiles for parallelism, many want wide ones for less recomputation);
/// else the narrowest that fits.
fn value_tile(widths: &[usize], smem: impl Fn(usize) -> usize, v: usize, ctas_per_tile: usize, sms: usize) -> usize {
    let fits = |bv: usize| smem(bv) <= MAX_SMEM;
    // Read once per process, not on every prefill call.
    static WANTED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let wanted = *WANTED.get_or_init(|| std::env::var("DELTASERVE_TC_BV").ok().and_then(|v| v.parse::<usize>().ok()));
    if let Some(bv) = wanted.filter(|bv| widths.contains(bv) && fits(*bv)) {
        return bv;
    }
    let fitting: Vec<usize> = widths.iter().copied().filter(|&bv| fits(bv)).collect();
    let last = widths.last().copied().unwrap_or(16);
    fitting.iter().copied().find(|&bv| ctas_per_tile * v.div_ceil(bv) >= sms).or(fitting.last().copied()).unwrap_or(last)
}

/// Chunked prefill on the tensor cores (fp32 accumulation and state) of packed sequences:
/// sequence `s` owns rows `cu_seqlens[s]..cu_seqlens[s+1]` (one row per interleaved step; the
/// caller interleaves Gated DeltaProduct) and the state of `slots[s]`, read at the start and
/// written at the end. One launch computes every chunk's W, U, P and G in parallel, a second
/// carries the state through each sequence's chunks and writes `o` `[rows, HV, V]`. q's dtype
/// picks the precision: f32 splits every matmul operand into bf16 hi + lo (near fp32; the
/// engine's path), bf16 (k and v converted to it) uses single bf16 operands, as fla does.
pub fn gated_delta_chunk_tc(x: &MixerInputs<'_>, states: &mut DeviceSlots, cu_seqlens: &[usize], slots: &[usize]) -> Result<Tensor> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
    use half::bf16;
    let dev = cuda_dev(x.q, "gated_delta_chunk_tc")?;
    let (rows, h, k) = x.q.dims3()?;
    let (_, hv, v) = x.v.dims3()?;
    check_head_dim("gated_delta_chunk_tc", k)?;
    let lo = !matches!(x.q.dtype(), DType::BF16);
    let dtype = if lo { DType::F32 } else { DType::BF16 };
    let cast = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(dtype)?.contiguous()?) };
    let (q, kk, vv, beta) = (cast(x.q)?, cast(x.k)?, cast(x.v)?, f32c(x.beta)?);
    let g = x.g.map(f32c).transpose()?;
    // The chunk table: chunks never cross sequences.
    let (mut crow, mut clen) = (Vec::new(), Vec::new());
    for s in 0..slots.len() {
        let (t0, t1) = (cu_seqlens[s], cu_seqlens[s + 1]);
        for c0 in (t0..t1).step_by(CHUNK) {
            crow.push(c0);
            clen.push(CHUNK.min(t1 - c0));
        }
    }
    if crow.is_empty() {
        return Ok(wrap(&dev, dev.alloc_zeros::<f32>(rows * hv * v)?, (rows, hv, v)));
    }
    // SAFETY: the state pass writes every row of every chunk.
    let mut o = unsafe { dev.alloc::<f32>(rows * hv * v) }?;
    let (crow_d, clen_d) = (indices(&dev, &crow)?, indices(&dev, &clen)?);
    let (cu, sl) = (indices(&dev, cu_seqlens)?, indices(&dev, slots)?);
    let mut gc = unsafe { dev.alloc::<f32>(rows * hv) }?;
    let ints = [h as i32, hv as i32, k as i32, v as i32];
    let suffix = if lo { "f32" } else { "bf16" };

    let prep = dev.get_or_load_custom_func(&format!("chunk_tc_prep_{suffix}"), "chunk_prep", ptx::CHUNK_PREP)?;
    let smem = tc_prep_smem(k, lo);
    prep.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as SM_COUNT;
    let sms = dev.cuda_stream().context().attribute(SM_COUNT).w()?.max(1) as usize;
    // f32 inputs: the split-operand wmma state pass; bf16: the mma.sync one (state in registers).
    let (state, bv, state_smem) = if lo {
        let bv = value_tile(&[64, 32, 16], |bv| tc_state_smem(k, bv), v, slots.len() * hv, sms);
        let f = dev.get_or_load_custom_func(&format!("chunk_tc_state_f32_bv{bv}"), "chunk_state", ptx::CHUNK_STATE)?;
        (f, bv, tc_state_smem(k, bv))
    } else {
        let bv = value_tile(&[64, 32], |bv| mma_state_smem(k, bv), v, slots.len() * hv, sms);
        let name = format!("chunk_mma_state_k{}_bv{bv}", mma_row_tiles(k));
        (dev.get_or_load_custom_func(&name, "chunk_mma", ptx::CHUNK_MMA)?, bv, mma_state_smem(k, bv))
    };
    state.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, state_smem as i32).w()?;
    // W, U (bf16: T2 in its place) and P are kept in the inputs' type (bf16 for bf16 inputs, as
    // fla keeps them).
    let u_cols = if lo { v } else { CHUNK };
    macro_rules! launch {
        ($ty:ty) => {{
            // Every row of W, U, P and G is written by the first launch before the second reads it.
            let mut w = unsafe { dev.alloc::<$ty>(rows * hv * k) }?;
            let mut u = unsafe { dev.alloc::<$ty>(rows * hv * u_cols) }?;
            let mut p = unsafe { dev.alloc::<$ty>(rows * hv * CHUNK) }?;
            with_view!(q, qv, $ty, {
                with_view!(kk, kv, $ty, {
                    with_view!(vv, vv_, $ty, {
                        with_view!(beta, bv_, {
                            with_mixer_gate!(g, gp, {
                                let mut l = prep.builder();
                                l.arg(&qv).arg(&kv).arg(&vv_).arg(&bv_);
                                push_gate(&mut l, &gp);
                                l.arg(&crow_d).arg(&clen_d).arg(&mut w).arg(&mut u).arg(&mut p).arg(&mut gc);
                                for i in &ints {
                                    l.arg(i);
                                }
                                unsafe { l.launch(grid(crow.len(), hv, 1, 256, smem as u32)) }.w()?;
                            });
                            let mut l = state.builder();
                            l.arg(&qv).arg(&kv);
                            if !lo {
                                l.arg(&vv_);
                            }
                            l.arg(&w).arg(&u).arg(&p).arg(&gc).arg(&mut states.data).arg(&cu).arg(&sl).arg(&mut o);
                            for i in &ints {
                                l.arg(i);
                            }
                            l.arg(&x.scale);
                            unsafe { l.launch(grid(v.div_ceil(bv), hv, slots.len(), 256, state_smem as u32)) }.w()?;
                        })
                    })
                })
            })
        }};
    }
    if lo {
        launch!(f32)
    } else {
        launch!(bf16)
    }
    Ok(wrap(&dev, o, (rows, hv, v)))
}
