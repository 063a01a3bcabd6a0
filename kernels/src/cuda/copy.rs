//! Many device-to-device copies (or zero fills) in one launch of `copy_many` (copy.cu): one slot
//! of every layer's states for a restore, a snapshot, a fork or a new sequence.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, DType, Tensor};

use super::{alloc_rows, cuda_dev, device_address, first_element_address_any, func, grid, modules, sm_count};
use crate::Result;

/// Copies of at most this many ranges go in one launch of `copy_many` (its parameter block).
const MAX_COPIES: usize = 64;

/// The launch parameters of `copy_many` (copy.cu's `Copies`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Copies {
    src: [u64; MAX_COPIES],
    dst: [u64; MAX_COPIES],
    words: [u64; MAX_COPIES],
}

// SAFETY: plain data with the layout of the kernel's parameter struct.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for Copies {}

/// Copies each `(source address, destination address, 32-bit words)` on `dev`'s stream (a
/// source address of 0 zeroes the destination), up to 64 in one launch. The ranges must be
/// live device memory that no other copy of the call writes.
pub(crate) fn copy_many(dev: &CudaDevice, copies: &[(u64, u64, usize)]) -> Result<()> {
    let f = func(dev, "copy_many", &modules::COPY)?;
    for group in copies.chunks(MAX_COPIES) {
        let mut c = Copies { src: [0; MAX_COPIES], dst: [0; MAX_COPIES], words: [0; MAX_COPIES] };
        for (i, &(s, d, n)) in group.iter().enumerate() {
            (c.src[i], c.dst[i], c.words[i]) = (s, d, n as u64);
        }
        let most = group.iter().map(|g| g.2).max().unwrap_or(0);
        // About 16 KB a block, at most 64 blocks a copy.
        let blocks = most.div_ceil(4096).clamp(1, 64);
        let mut l = f.builder();
        l.arg(&c);
        unsafe { l.launch(grid(blocks, group.len(), 1, 256, 0)) }.w()?;
    }
    Ok(())
}

/// Rows `ids` (`[N]` u32) of `table` (`[V, D]`) in f32: for a contiguous bf16/f16 table with D a
/// multiple of 8, one kernel (`embed_*` in copy.cu) that gathers and widens; otherwise candle's
/// gather and cast. The ids must be below V (the callers check them).
pub fn embedding_f32(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let name = match table.dtype() {
        DType::BF16 => "embed_bf16_f32",
        DType::F16 => "embed_f16_f32",
        _ => return Ok(table.index_select(ids, 0)?.to_dtype(DType::F32)?),
    };
    let (n, d) = (ids.elem_count(), table.dim(1)?);
    let x = first_element_address_any(table)?;
    if !table.is_contiguous()
        || !d.is_multiple_of(8)
        || !x.is_multiple_of(16)
        || ids.dtype() != DType::U32
        || !ids.is_contiguous()
        || n == 0
    {
        return Ok(table.index_select(ids, 0)?.to_dtype(DType::F32)?);
    }
    let dev = cuda_dev(table, "embedding_f32")?;
    let y = alloc_rows(&dev, DType::F32, n, d)?;
    let (ids_at, y_at, d8) = (device_address::<u32>(ids)?, first_element_address_any(&y)?, (d / 8) as u64);
    let f = func(&dev, name, &modules::COPY)?;
    let mut l = f.builder();
    l.arg(&ids_at).arg(&x).arg(&y_at).arg(&d8);
    unsafe { l.launch(grid(n, (d / 8).div_ceil(256), 1, 256, 0)) }.w()?;
    Ok(y.reshape((n, d))?)
}

/// `t` in f32: a contiguous bf16/f16 tensor whose length is a multiple of 8 through one
/// vectorised kernel (`widen_*` in copy.cu; candle's cast runs at a fraction of the copy
/// bandwidth on a batch's logits), anything else through candle's cast.
pub fn to_f32(t: &Tensor) -> Result<Tensor> {
    let Some((name, x)) = widenable(t)? else { return Ok(t.to_dtype(DType::F32)?) };
    let dev = cuda_dev(t, "to_f32")?;
    let y = alloc_rows(&dev, DType::F32, 1, t.elem_count())?;
    widen(&dev, name, x, first_element_address_any(&y)?, t.elem_count())?;
    Ok(y.reshape(t.dims())?)
}

/// [`to_f32`] written into `out`, a contiguous f32 tensor of `t`'s shape (checked by
/// [`crate::ops::to_f32_into`]), with no intermediate copy when `out` is 16-byte aligned too.
pub fn to_f32_into(t: &Tensor, out: &Tensor) -> Result<()> {
    let y = first_element_address_any(out)?;
    match widenable(t)? {
        Some((name, x)) if y.is_multiple_of(16) => widen(&cuda_dev(t, "to_f32_into")?, name, x, y, t.elem_count()),
        _ => Ok(out.slice_set(&t.to_dtype(DType::F32)?, 0, 0)?),
    }
}

/// The widening kernel for `t` and `t`'s address, when it takes `t`: contiguous bf16/f16, a
/// multiple of 8 long, 16-byte aligned.
fn widenable(t: &Tensor) -> Result<Option<(&'static str, u64)>> {
    let name = match t.dtype() {
        DType::BF16 => "widen_bf16_f32",
        DType::F16 => "widen_f16_f32",
        _ => return Ok(None),
    };
    let n = t.elem_count();
    if !t.is_contiguous() || n == 0 || !n.is_multiple_of(8) {
        return Ok(None);
    }
    let x = first_element_address_any(t)?;
    Ok(x.is_multiple_of(16).then_some((name, x)))
}

/// Launches `name` over `n` values from `x` into the f32 values at `y`.
fn widen(dev: &CudaDevice, name: &str, x: u64, y: u64, n: usize) -> Result<()> {
    let f = func(dev, name, &modules::COPY)?;
    let n8 = (n / 8) as u64;
    let blocks = (n / 8).div_ceil(256).clamp(1, 8 * sm_count(dev)?);
    let mut l = f.builder();
    l.arg(&x).arg(&y).arg(&n8);
    unsafe { l.launch(grid(blocks, 1, 1, 256, 0)) }.w()?;
    Ok(())
}
