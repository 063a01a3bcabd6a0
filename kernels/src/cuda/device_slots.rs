//! State slots in GPU memory ([`DeviceSlots`]: the recurrent, conv and KV states the kernels
//! update in place by slot index) and their pinned host copies ([`PinnedSlots`]).

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, DType};

use crate::{KernelError, Result};

/// A GPU allocation of state slots: f32 values (recurrent and conv states, f32 KV caches), or
/// bf16/f16 values for the KV caches of 16-bit models. The allocation is counted in 32-bit
/// words either way (two 16-bit values a word); the kernels take its address and know its
/// element type from [`Self::dtype`].
#[derive(Debug, Clone)]
pub struct DeviceSlots {
    pub(super) dev: CudaDevice,
    pub(super) data: CudaSlice<f32>,
    pub(super) dtype: DType,
}

/// A 16-bit element type's conversions.
fn to_16(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_bits(),
        _ => half::f16::from_f32(x).to_bits(),
    }
}

fn from_16(dtype: DType, bits: u16) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_bits(bits).to_f32(),
        _ => half::f16::from_bits(bits).to_f32(),
    }
}

impl DeviceSlots {
    /// `len` zeroed f32 values on `dev`.
    pub fn zeros(dev: &CudaDevice, len: usize) -> Result<Self> {
        Self::zeros_as(dev, len, DType::F32)
    }

    /// `len` zeroed values of `dtype` (f32, bf16 or f16; an even `len` for 16-bit types).
    pub fn zeros_as(dev: &CudaDevice, len: usize, dtype: DType) -> Result<Self> {
        let words = match dtype {
            DType::F32 => len,
            DType::BF16 | DType::F16 if len.is_multiple_of(2) => len / 2,
            _ => {
                return Err(KernelError::Shape {
                    op: "DeviceSlots",
                    input: "dtype",
                    expected: "f32, or bf16/f16 with an even length".into(),
                    actual: vec![len],
                })
            }
        };
        Ok(Self { dev: dev.clone(), data: dev.alloc_zeros::<f32>(words.max(1))?, dtype })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The f32 values of a recurrent or conv state (whose kernels take no other type).
    pub(super) fn state_words(&mut self, op: &'static str) -> Result<&mut CudaSlice<f32>> {
        if self.dtype != DType::F32 {
            return Err(KernelError::Shape { op, input: "states", expected: "f32 slots".into(), actual: vec![self.dtype.size_in_bytes()] });
        }
        Ok(&mut self.data)
    }

    /// The f32 or bf16 values of a recurrent state, and the name suffix of the kernels that take
    /// states of that type (`""` for f32, `"_sbf16"`).
    pub(super) fn recurrent_words(&mut self, op: &'static str) -> Result<(&mut CudaSlice<f32>, &'static str)> {
        let suffix = match self.dtype {
            DType::F32 => "",
            DType::BF16 => "_sbf16",
            _ => {
                return Err(KernelError::Unsupported { op, what: format!("{:?} recurrent states (f32 or bf16)", self.dtype) });
            }
        };
        Ok((&mut self.data, suffix))
    }

    /// Values per 32-bit word.
    pub(super) fn per_word(&self) -> usize {
        if self.dtype == DType::F32 {
            1
        } else {
            2
        }
    }

    /// Word range of `len` values at `offset` (both even for 16-bit types: slots are).
    pub(super) fn words(&self, offset: usize, len: usize) -> std::ops::Range<usize> {
        let w = self.per_word();
        offset / w..(offset + len).div_ceil(w)
    }

    /// Copies `len` values at `offset` to the host, as f32.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<f32>> {
        let words = self.dev.cuda_stream().clone_dtoh(&self.data.slice(self.words(offset, len))).w()?;
        if self.dtype == DType::F32 {
            return Ok(words);
        }
        let halves = words.iter().flat_map(|w| {
            let b = w.to_bits();
            [(b & 0xffff) as u16, (b >> 16) as u16]
        });
        Ok(halves.take(len).map(|h| from_16(self.dtype, h)).collect())
    }

    /// Copies `values` from the host to `offset` (rounded to the element type).
    pub fn write(&mut self, offset: usize, values: &[f32]) -> Result<()> {
        let range = self.words(offset, values.len());
        let words: Vec<f32> = if self.dtype == DType::F32 {
            values.to_vec()
        } else {
            let d = self.dtype;
            values
                .chunks(2)
                .map(|p| f32::from_bits(to_16(d, p[0]) as u32 | (to_16(d, p.get(1).copied().unwrap_or(0.0)) as u32) << 16))
                .collect()
        };
        let stream = self.dev.cuda_stream();
        stream.memcpy_htod(&words, &mut self.data.slice_mut(range)).w()?;
        Ok(())
    }

    /// Zeroes `len` values at `offset`.
    pub fn zero(&mut self, offset: usize, len: usize) -> Result<()> {
        let range = self.words(offset, len);
        let stream = self.dev.cuda_stream();
        stream.memset_zeros(&mut self.data.slice_mut(range)).w()?;
        Ok(())
    }

    /// The device addresses of `len` values at `src` and at `dst`, and their 32-bit words
    /// (for [`copy_many`]; with `zero`, `src` is not read and may equal `dst`).
    pub(crate) fn copy_args(&mut self, src: usize, dst: usize, len: usize, zero: bool) -> Result<(u64, u64, usize)> {
        let (from, to) = (self.words(src, len), self.words(dst, len));
        if !zero && from.start < to.end && to.start < from.end {
            return Err(KernelError::Shape {
                op: "copy",
                input: "slots",
                expected: "non-overlapping ranges".into(),
                actual: vec![src, dst, len],
            });
        }
        let stream = self.dev.cuda_stream();
        let (base, _sync) = self.data.device_ptr_mut(&stream);
        Ok((base + 4 * from.start as u64, base + 4 * to.start as u64, from.end - from.start))
    }

    /// The device these slots live on.
    pub(crate) fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Copies `len` values from `src` to `dst` (non-overlapping slots): one copy within the
    /// buffer, straight from slot to slot.
    pub fn copy(&mut self, src: usize, dst: usize, len: usize) -> Result<()> {
        let (from, to, words) = self.copy_args(src, dst, len, false)?;
        let stream = super::bound_stream(&self.dev)?;
        // SAFETY: both ranges lie inside `data` (`words` of checked slots) and do not overlap; the
        // copy is ordered on the stream that orders every use of `data`.
        unsafe { candle_core::cuda_backend::cudarc::driver::result::memcpy_dtod_async(to, from, words * 4, stream.cu_stream()) }.w()?;
        Ok(())
    }
}

/// Page-locked host memory for [`crate::HostSlots`]: copies to and from it are queued on the
/// device's stream without waiting.
pub struct PinnedSlots {
    dev: CudaDevice,
    /// Where the memory starts, taken once at allocation (cudarc's accessors wait for an event
    /// this type never records: the stream orders every copy).
    ptr: *mut f32,
    len: usize,
    _host: candle_core::cuda_backend::cudarc::driver::PinnedHostSlice<f32>,
}

// SAFETY: the pointer is the allocation `_host` owns; it is only handed to copies queued on
// the device's stream, which the owner of this value orders (one engine thread).
unsafe impl Send for PinnedSlots {}
unsafe impl Sync for PinnedSlots {}

impl std::fmt::Debug for PinnedSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedSlots").field("len", &self.len).finish()
    }
}

impl PinnedSlots {
    /// `len` zeroed, page-locked 32-bit words (f32 values, or pairs of 16-bit ones).
    pub fn zeros(slots: &DeviceSlots, len: usize) -> Result<Self> {
        let ctx = slots.dev.cuda_stream().context().clone();
        // SAFETY: zeroed right below, before any use.
        let mut host = unsafe { ctx.alloc_pinned::<f32>(len.max(1)) }.w()?;
        let ptr = host.as_mut_ptr().w()?;
        // SAFETY: `ptr` points at `len.max(1)` f32 values no copy uses yet.
        unsafe { std::ptr::write_bytes(ptr, 0, len.max(1)) };
        Ok(Self { dev: slots.dev.clone(), ptr, len, _host: host })
    }
}

impl Drop for PinnedSlots {
    fn drop(&mut self) {
        // Copies still queued must not outlive the memory.
        let _ = self.dev.cuda_stream().synchronize();
    }
}

impl DeviceSlots {
    /// Queues a copy of `len` 32-bit words at `offset` (f32 values, or pairs of 16-bit ones) into
    /// `host` at `host_offset`.
    pub fn to_pinned(&self, offset: usize, len: usize, host: &mut PinnedSlots, host_offset: usize) -> Result<()> {
        self.pinned_range(offset, len, host, host_offset)?;
        let stream = super::bound_stream(&self.dev)?;
        let view = self.data.slice(offset..offset + len);
        let (src, _sync) = view.device_ptr(&stream);
        // SAFETY: the range is in bounds (checked); the memory lives until the stream is done
        // with it (`PinnedSlots::drop` synchronises).
        let dst = unsafe { std::slice::from_raw_parts_mut(host.ptr.add(host_offset), len) };
        unsafe { candle_core::cuda_backend::cudarc::driver::result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }.w()?;
        Ok(())
    }

    /// Queues a copy of `len` 32-bit words of `host` at `host_offset` to `offset`.
    pub fn from_pinned(&mut self, offset: usize, len: usize, host: &PinnedSlots, host_offset: usize) -> Result<()> {
        self.pinned_range(offset, len, host, host_offset)?;
        let stream = super::bound_stream(&self.dev)?;
        let mut view = self.data.slice_mut(offset..offset + len);
        let (dst, _sync) = view.device_ptr_mut(&stream);
        // SAFETY: as in `to_pinned`.
        let src = unsafe { std::slice::from_raw_parts(host.ptr.add(host_offset), len) };
        unsafe { candle_core::cuda_backend::cudarc::driver::result::memcpy_htod_async(dst, src, stream.cu_stream()) }.w()?;
        Ok(())
    }

    pub(super) fn pinned_range(&self, offset: usize, len: usize, host: &PinnedSlots, host_offset: usize) -> Result<()> {
        if offset + len > self.data.len() || host_offset + len > host.len {
            return Err(KernelError::Shape {
                op: "PinnedSlots",
                input: "copy",
                expected: format!("ranges inside {} device and {} host words", self.data.len(), host.len),
                actual: vec![offset, host_offset, len],
            });
        }
        Ok(())
    }
}
