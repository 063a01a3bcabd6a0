//! Launchers for the CUDA kernels of `kernels/cuda/*.cu` (compiled to PTX by build.rs and
//! loaded through candle's custom-module cache). Inputs are converted to contiguous f32;
//! states are updated in place in a [`DeviceSlots`] allocation, by slot index.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaStorage, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, DType, Shape, Storage, Tensor};

use crate::ops::MixerInputs;
use crate::{KernelError, Result};

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

/// Largest key head dim the decode and chunk kernels take.
pub const MAX_HEAD_K: usize = 256;
const CHUNK: usize = 64;

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

/// Borrows a contiguous f32 CUDA tensor's device memory for the duration of `$body`.
macro_rules! with_view {
    ($t:expr, $v:ident, $body:block) => {{
        let (guard, layout) = $t.storage_and_layout();
        let Storage::Cuda(cs) = &*guard else {
            return Err(KernelError::UnsupportedDevice { op: "cuda view", device: "non-cuda storage".into() });
        };
        let $v: CudaView<'_, f32> = cs.as_cuda_slice::<f32>()?.slice(layout.start_offset()..);
        $body
    }};
}

fn wrap(dev: &CudaDevice, data: CudaSlice<f32>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(CudaStorage::wrap_cuda_slice(data, dev.clone())), shape, BackpropOp::none(), false)
}

fn indices(dev: &CudaDevice, xs: &[usize]) -> Result<CudaSlice<i32>> {
    let v: Vec<i32> = xs.iter().map(|&x| x as i32).collect();
    Ok(dev.cuda_stream().clone_htod(&v).w()?)
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
    let mut y = dev.alloc_zeros::<f32>(rows * c)?;
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
pub fn conv_step(x: &Tensor, weight: &Tensor, states: &mut DeviceSlots, slots: &[usize], silu: bool) -> Result<Tensor> {
    let dev = cuda_dev(x, "conv_step")?;
    let (rows, c) = x.dims2()?;
    let w = weight.dim(1)?;
    let (x, weight) = (f32c(x)?, f32c(weight)?);
    let sl = indices(&dev, slots)?;
    let mut y = dev.alloc_zeros::<f32>(rows * c)?;
    let f = dev.get_or_load_custom_func("conv_step_f32", "conv", ptx::CONV)?;
    let (ci, wi, si) = (c as i32, w as i32, silu as i32);
    with_view!(x, xv, {
        with_view!(weight, wv, {
            let mut b = f.builder();
            b.arg(&xv).arg(&wv).arg(&mut states.data).arg(&sl).arg(&mut y).arg(&ci).arg(&wi).arg(&si);
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
    let mut q = dev.alloc_zeros::<f32>(n * qh * k)?;
    let mut kk = dev.alloc_zeros::<f32>(n * kh * k)?;
    let mut beta = dev.alloc_zeros::<f32>(n * nb)?;
    let mut g = dev.alloc_zeros::<f32>((n * ng).max(1))?;
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
    let mut y = dev.alloc_zeros::<f32>(rows * d)?;
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

fn check_head_dim(op: &'static str, k: usize) -> Result<()> {
    if k == 0 || k > MAX_HEAD_K {
        return Err(KernelError::Shape { op, input: "k", expected: format!("head dim in 1..={MAX_HEAD_K}"), actual: vec![k] });
    }
    Ok(())
}

/// Runs `launch` with every mixer input borrowed as a device view (g as a null pointer when
/// absent).
macro_rules! with_mixer_views {
    ($x:expr, $q:ident, $k:ident, $v:ident, $b:ident, $g:ident, $body:block) => {{
        let (q, k, v, beta) = (f32c($x.q)?, f32c($x.k)?, f32c($x.v)?, f32c($x.beta)?);
        let g = $x.g.map(f32c).transpose()?;
        with_view!(q, $q, {
            with_view!(k, $k, {
                with_view!(v, $v, {
                    with_view!(beta, $b, {
                        match &g {
                            Some(g) => with_view!(g, gv, {
                                let $g = GatePtr::View(&gv);
                                $body
                            }),
                            None => {
                                let $g = GatePtr::Null(0u64);
                                $body
                            }
                        }
                    })
                })
            })
        })
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

/// One decode step for `B = slots.len()` sequences, `x.n` householder steps each, reading and
/// writing the states of `slots` in place. Returns `o` `[B, HV, V]` f32.
pub fn gated_delta_step(x: &MixerInputs<'_>, states: &mut DeviceSlots, slots: &[usize]) -> Result<Tensor> {
    let dev = cuda_dev(x.q, "gated_delta_step")?;
    let (b, h, k) = x.q.dims3()?;
    let (_, hv, v) = x.v.dims3()?;
    check_head_dim("gated_delta_step", k)?;
    let r = k.div_ceil(4);
    let name = match r {
        0..=8 => "gdr_decode_f32_r8",
        9..=16 => "gdr_decode_f32_r16",
        17..=32 => "gdr_decode_f32_r32",
        _ => "gdr_decode_f32_r64",
    };
    let sl = indices(&dev, slots)?;
    let mut o = dev.alloc_zeros::<f32>(b * hv * v)?;
    let f = dev.get_or_load_custom_func(name, "gated_delta", ptx::GATED_DELTA)?;
    let ints = [h as i32, hv as i32, k as i32, v as i32, x.n.max(1) as i32];
    let cfg = grid(v.div_ceil(32), hv, b, 128, 0);
    with_mixer_views!(x, qv, kv, vv, bv, gp, {
        let mut l = f.builder();
        l.arg(&qv).arg(&kv).arg(&vv).arg(&bv);
        push_gate(&mut l, &gp);
        l.arg(&mut states.data).arg(&sl).arg(&mut o);
        for i in &ints {
            l.arg(i);
        }
        l.arg(&x.scale);
        unsafe { l.launch(cfg) }.w()?;
    });
    Ok(wrap(&dev, o, (b, hv, v)))
}

/// Shared memory of the chunk kernel, in bytes.
fn chunk_smem(k: usize, bv: usize) -> usize {
    4 * (k * bv + 2 * CHUNK * (k + 1) + 2 * CHUNK * 65 + CHUNK * (bv + 1) + 3 * CHUNK)
}

/// Chunked prefill of packed sequences (rows `cu_seqlens[s]..cu_seqlens[s+1]` with the state of
/// `slots[s]`), all inputs with one row per (interleaved) step (`x.n` is not used: the
/// caller interleaves). Returns `o` `[rows, HV, V]`.
pub fn gated_delta_chunk(x: &MixerInputs<'_>, states: &mut DeviceSlots, cu_seqlens: &[usize], slots: &[usize]) -> Result<Tensor> {
    let dev = cuda_dev(x.q, "gated_delta_chunk")?;
    let (rows, h, k) = x.q.dims3()?;
    let (_, hv, v) = x.v.dims3()?;
    check_head_dim("gated_delta_chunk", k)?;
    // Wider value tiles halve the per-tile recomputation of A and P when they fit.
    let bv = if chunk_smem(k, 64) <= 227 * 1024 && v >= 64 { 64 } else { 32 };
    let smem = chunk_smem(k, bv);
    let name = if bv == 64 { "gdr_chunk_f32_bv64" } else { "gdr_chunk_f32_bv32" };
    let f = dev.get_or_load_custom_func(name, "gated_delta", ptx::GATED_DELTA)?;
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
    f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
    let (cu, sl) = (indices(&dev, cu_seqlens)?, indices(&dev, slots)?);
    let mut o = dev.alloc_zeros::<f32>(rows * hv * v)?;
    let ints = [h as i32, hv as i32, k as i32, v as i32];
    let cfg = grid(v.div_ceil(bv), hv, slots.len(), 256, smem as u32);
    with_mixer_views!(x, qv, kv, vv, bv_, gp, {
        let mut l = f.builder();
        l.arg(&qv).arg(&kv).arg(&vv).arg(&bv_);
        push_gate(&mut l, &gp);
        l.arg(&mut states.data).arg(&cu).arg(&sl).arg(&mut o);
        for i in &ints {
            l.arg(i);
        }
        l.arg(&x.scale);
        unsafe { l.launch(cfg) }.w()?;
    });
    Ok(wrap(&dev, o, (rows, hv, v)))
}
