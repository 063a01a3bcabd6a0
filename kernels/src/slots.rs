//! A fixed number of equally sized per-sequence state slots in one allocation, in host memory
//! or (with the `cuda` feature) in GPU memory, where the kernels update slots in place.

use candle_core::{DType, Device, Tensor};

use crate::{KernelError, Result};

/// The slots of one decode step, row `b` advancing `host[b]`. A CUDA graph that replays the
/// step also passes a device copy (`device`, `[B]` of an [`index_dtype`]): the kernels then read
/// the slots from there, so one captured launch serves whatever slots the next replay writes
/// into it.
#[derive(Debug, Clone, Copy)]
pub struct StepSlots<'a> {
    /// The slot indices, checked on the host.
    pub host: &'a [usize],
    /// The same indices in device memory, `[B]` of an [`index_dtype`], or `None`.
    pub device: Option<&'a Tensor>,
}

impl<'a> From<&'a [usize]> for StepSlots<'a> {
    fn from(host: &'a [usize]) -> Self {
        Self { host, device: None }
    }
}

impl<'a, const N: usize> From<&'a [usize; N]> for StepSlots<'a> {
    fn from(host: &'a [usize; N]) -> Self {
        Self { host, device: None }
    }
}

impl<'a> From<&'a Vec<usize>> for StepSlots<'a> {
    fn from(host: &'a Vec<usize>) -> Self {
        Self { host, device: None }
    }
}

impl StepSlots<'_> {
    /// Checks that the device copy, if any, is `[B]` of an [`index_dtype`] for `B` host indices.
    pub(crate) fn check(&self, op: &'static str) -> Result<()> {
        if let Some(d) = self.device {
            if d.dims() != [self.host.len()] || !index_dtype(d.dtype()) {
                return Err(KernelError::Shape {
                    op,
                    input: "device slots",
                    expected: format!("[{}] i32 (got {:?})", self.host.len(), d.dtype()),
                    actual: d.dims().to_vec(),
                });
            }
        }
        Ok(())
    }
}

/// Whether the kernels read device index lists (slots, positions) of dtype `d`, as i32: i32, or
/// u32 holding values below 2³¹ (a decode graph keeps them in one u32 buffer with its token ids,
/// written by one copy a step).
pub fn index_dtype(d: DType) -> bool {
    matches!(d, DType::I32 | DType::U32)
}

/// Where the slots live.
#[derive(Debug, Clone)]
enum Store {
    Host(Vec<f32>),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::DeviceSlots),
}

/// `slots × per_slot` values; slot `i` is the contiguous range `[i·per_slot, (i+1)·per_slot)`.
/// f32 in host memory; f32, bf16 or f16 in GPU memory (16-bit for the KV caches of 16-bit
/// models). Reads and writes through this type are in f32 whatever the element type.
#[derive(Debug, Clone)]
pub struct SlotBuffer {
    per_slot: usize,
    slots: usize,
    store: Store,
}

impl SlotBuffer {
    /// Allocates `slots` zeroed slots of `per_slot` values each in host memory, committed: every
    /// page is written now, so that a pool the machine cannot hold fails (or is clamped) at
    /// start, not under load when a sequence first touches its slot.
    pub fn zeros(slots: usize, per_slot: usize) -> Self {
        let mut v = vec![0.0f32; slots * per_slot];
        // A zeroed allocation is mapped lazily; one write a 4 KiB page commits it.
        for i in (0..v.len()).step_by(1024) {
            // SAFETY: `i` is in bounds; a volatile write is not optimised away.
            unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 0.0) };
        }
        Self { per_slot, slots, store: Store::Host(v) }
    }

    /// Allocates zeroed slots on `device` (host memory for the CPU).
    pub fn zeros_on(slots: usize, per_slot: usize, device: &Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Self::zeros(slots, per_slot)),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Ok(Self { per_slot, slots, store: Store::Cuda(crate::cuda::DeviceSlots::zeros(d, slots * per_slot)?) }),
            other => Err(KernelError::UnsupportedDevice { op: "SlotBuffer::zeros_on", device: format!("{other:?}") }),
        }
    }

    /// Allocates zeroed slots of `dtype` values on `device`: f32 anywhere, bf16/f16 (an even
    /// `per_slot`) on a GPU only.
    pub fn zeros_on_as(slots: usize, per_slot: usize, device: &Device, dtype: DType) -> Result<Self> {
        match (device, dtype) {
            (_, DType::F32) => Self::zeros_on(slots, per_slot, device),
            #[cfg(feature = "cuda")]
            (Device::Cuda(d), DType::BF16 | DType::F16) if per_slot.is_multiple_of(2) => {
                Ok(Self { per_slot, slots, store: Store::Cuda(crate::cuda::DeviceSlots::zeros_as(d, slots * per_slot, dtype)?) })
            }
            (device, dtype) => Err(KernelError::UnsupportedDevice {
                op: "SlotBuffer::zeros_on_as",
                device: format!("{dtype:?} slots of {per_slot} values on {device:?} (f32 anywhere; bf16/f16, even sizes, on a GPU)"),
            }),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.store {
            Store::Host(_) => DType::F32,
            #[cfg(feature = "cuda")]
            Store::Cuda(d) => d.dtype(),
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Values per slot.
    pub fn per_slot(&self) -> usize {
        self.per_slot
    }

    /// Bytes held per slot.
    pub fn bytes_per_slot(&self) -> usize {
        self.per_slot * self.dtype().size_in_bytes()
    }

    /// Whether the slots are in host memory (slices can be borrowed).
    pub fn is_host(&self) -> bool {
        matches!(self.store, Store::Host(_))
    }

    fn check(&self, slot: usize) -> Result<()> {
        if slot >= self.slots {
            return Err(KernelError::Slot { slot, slots: self.slots });
        }
        Ok(())
    }

    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub(crate) fn host(&self, op: &'static str) -> Result<&Vec<f32>> {
        match &self.store {
            Store::Host(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Store::Cuda(_) => Err(KernelError::UnsupportedDevice { op, device: "cuda (use slot_to_vec)".into() }),
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub(crate) fn host_mut(&mut self, op: &'static str) -> Result<&mut Vec<f32>> {
        match &mut self.store {
            Store::Host(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Store::Cuda(_) => Err(KernelError::UnsupportedDevice { op, device: "cuda".into() }),
        }
    }

    /// The GPU allocation, if the slots live on a GPU.
    #[cfg(feature = "cuda")]
    pub fn device_slots(&mut self) -> Option<&mut crate::cuda::DeviceSlots> {
        match &mut self.store {
            Store::Cuda(d) => Some(d),
            Store::Host(_) => None,
        }
    }

    /// One host slot, read-only.
    pub fn slot(&self, slot: usize) -> Result<&[f32]> {
        self.check(slot)?;
        let p = self.per_slot;
        Ok(&self.host("SlotBuffer::slot")?[slot * p..(slot + 1) * p])
    }

    /// One slot copied out, wherever it lives.
    pub fn slot_to_vec(&self, slot: usize) -> Result<Vec<f32>> {
        self.check(slot)?;
        match &self.store {
            Store::Host(v) => Ok(v[slot * self.per_slot..(slot + 1) * self.per_slot].to_vec()),
            #[cfg(feature = "cuda")]
            Store::Cuda(d) => d.read(slot * self.per_slot, self.per_slot),
        }
    }

    /// Overwrites one slot with `values` (`per_slot` of them), wherever it lives.
    pub fn write_slot(&mut self, slot: usize, values: &[f32]) -> Result<()> {
        self.check(slot)?;
        if values.len() != self.per_slot {
            return Err(KernelError::Shape {
                op: "write_slot",
                input: "values",
                expected: format!("{} values", self.per_slot),
                actual: vec![values.len()],
            });
        }
        let p = self.per_slot;
        match &mut self.store {
            Store::Host(v) => v[slot * p..(slot + 1) * p].copy_from_slice(values),
            #[cfg(feature = "cuda")]
            Store::Cuda(d) => d.write(slot * p, values)?,
        }
        Ok(())
    }

    /// One host slot, writable.
    pub fn slot_mut(&mut self, slot: usize) -> Result<&mut [f32]> {
        self.check(slot)?;
        let p = self.per_slot;
        Ok(&mut self.host_mut("SlotBuffer::slot_mut")?[slot * p..(slot + 1) * p])
    }

    /// Zeroes one slot so that nothing of its previous owner survives.
    pub fn zero(&mut self, slot: usize) -> Result<()> {
        self.check(slot)?;
        let p = self.per_slot;
        match &mut self.store {
            Store::Host(v) => v[slot * p..(slot + 1) * p].iter_mut().for_each(|x| *x = 0.0),
            #[cfg(feature = "cuda")]
            Store::Cuda(d) => d.zero(slot * p, p)?,
        }
        Ok(())
    }

    /// Copies slot `src` over slot `dst` in every buffer of `bufs` (a sequence's states in
    /// all its layers): on a GPU one launch for all of them when they share a device, else one
    /// copy a buffer.
    pub fn copy_slot_all(bufs: &mut [&mut SlotBuffer], src: usize, dst: usize) -> Result<()> {
        if Self::batched(bufs, Some(src), dst)? {
            return Ok(());
        }
        for b in bufs.iter_mut() {
            b.copy_slot(src, dst)?;
        }
        Ok(())
    }

    /// Zeroes `slot` in every buffer of `bufs` (on a GPU one launch for all of them).
    pub fn zero_all(bufs: &mut [&mut SlotBuffer], slot: usize) -> Result<()> {
        if Self::batched(bufs, None, slot)? {
            return Ok(());
        }
        for b in bufs.iter_mut() {
            b.zero(slot)?;
        }
        Ok(())
    }

    /// Copies `src` (or zeros) over `dst` in every buffer in one launch, when all of them live
    /// on one GPU; false (nothing done) otherwise.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn batched(bufs: &mut [&mut SlotBuffer], src: Option<usize>, dst: usize) -> Result<bool> {
        #[cfg(feature = "cuda")]
        {
            let mut copies = Vec::with_capacity(bufs.len());
            let mut dev = None;
            for b in bufs.iter_mut() {
                if let Some(s) = src {
                    b.check(s)?;
                }
                b.check(dst)?;
                let p = b.per_slot;
                let Store::Cuda(d) = &mut b.store else { return Ok(false) };
                if dev.get_or_insert_with(|| d.device().clone()).cuda_stream().cu_stream() != d.device().cuda_stream().cu_stream() {
                    return Ok(false);
                }
                let (from, to, words) = d.copy_args(src.unwrap_or(dst) * p, dst * p, p, src.is_none())?;
                copies.push((if src.is_some() { from } else { 0 }, to, words));
            }
            if let Some(dev) = dev {
                crate::cuda::copy_many(&dev, &copies)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Copies slot `src` over slot `dst` (used to fork a prefilled prompt for `n > 1`).
    pub fn copy_slot(&mut self, src: usize, dst: usize) -> Result<()> {
        self.check(src)?;
        self.check(dst)?;
        let p = self.per_slot;
        match &mut self.store {
            Store::Host(v) => v.copy_within(src * p..(src + 1) * p, dst * p),
            #[cfg(feature = "cuda")]
            Store::Cuda(d) => d.copy(src * p, dst * p, p)?,
        }
        Ok(())
    }

    /// Checks that `slots` are distinct and in range (kernels write each slot once).
    pub fn check_distinct(&self, slots: &[usize]) -> Result<()> {
        let mut seen = vec![false; self.slots];
        for &s in slots {
            self.check(s)?;
            if std::mem::replace(&mut seen[s], true) {
                return Err(KernelError::Shape {
                    op: "slots",
                    input: "slots",
                    expected: "distinct slot indices".into(),
                    actual: slots.to_vec(),
                });
            }
        }
        Ok(())
    }

    /// Mutable views of several distinct host slots, in the order given.
    pub fn slots_mut(&mut self, slots: &[usize]) -> Result<Vec<&mut [f32]>> {
        self.check_distinct(slots)?;
        let p = self.per_slot;
        let data = self.host_mut("SlotBuffer::slots_mut")?;
        let mut by_slot: Vec<Option<&mut [f32]>> = data.chunks_mut(p.max(1)).map(Some).collect();
        Ok(slots.iter().map(|&s| by_slot[s].take().unwrap_or_default()).collect())
    }
}

/// Slots in host memory that a [`SlotBuffer`]'s slots (f32, or 16-bit on a GPU) are copied out
/// to and back from (the prefix cache's second tier). Page-locked on a GPU, where the copies are
/// queued on the device's one stream, ordered with every kernel and copy before and after them,
/// so nothing waits; a plain vector for a CPU buffer.
#[derive(Debug)]
pub struct HostSlots {
    per_slot: usize,
    /// 32-bit words a slot: `per_slot` f32 values, or half as many words of 16-bit values.
    words: usize,
    dtype: DType,
    slots: usize,
    store: HostStore,
}

#[derive(Debug)]
enum HostStore {
    Vec(Vec<f32>),
    #[cfg(feature = "cuda")]
    Pinned(crate::cuda::PinnedSlots),
}

impl HostSlots {
    /// `slots` zeroed host slots shaped like `buf`'s (f32) slots, page-locked when `buf` is on
    /// a GPU.
    pub fn for_buffer(buf: &SlotBuffer, slots: usize) -> Result<Self> {
        // Host buffers are f32; GPU ones f32 or 16-bit (an even `per_slot`), copied as words.
        let dtype = buf.dtype();
        let words = if dtype == DType::F32 { buf.per_slot } else { buf.per_slot / 2 };
        let len = slots * words;
        let store = match &buf.store {
            Store::Host(_) => HostStore::Vec(vec![0.0; len]),
            #[cfg(feature = "cuda")]
            Store::Cuda(d) => HostStore::Pinned(crate::cuda::PinnedSlots::zeros(d, len)?),
        };
        Ok(Self { per_slot: buf.per_slot, words, dtype, slots, store })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    fn check(&self, slot: usize, buf: &SlotBuffer, buf_slot: usize) -> Result<()> {
        buf.check(buf_slot)?;
        if slot >= self.slots {
            return Err(KernelError::Slot { slot, slots: self.slots });
        }
        if buf.per_slot != self.per_slot || buf.dtype() != self.dtype {
            return Err(KernelError::Shape {
                op: "HostSlots",
                input: "slot size",
                expected: format!("{} values of {:?}", self.per_slot, self.dtype),
                actual: vec![buf.per_slot, buf.dtype().size_in_bytes()],
            });
        }
        Ok(())
    }

    /// Copies `buf`'s slot `src` into host slot `dst`.
    pub fn save(&mut self, buf: &SlotBuffer, src: usize, dst: usize) -> Result<()> {
        self.check(dst, buf, src)?;
        let p = self.words;
        match (&mut self.store, &buf.store) {
            (HostStore::Vec(v), Store::Host(b)) => v[dst * p..(dst + 1) * p].copy_from_slice(&b[src * p..(src + 1) * p]),
            #[cfg(feature = "cuda")]
            (HostStore::Pinned(h), Store::Cuda(d)) => d.to_pinned(src * p, p, h, dst * p)?,
            #[cfg(feature = "cuda")]
            _ => return Err(KernelError::UnsupportedDevice { op: "HostSlots::save", device: "a buffer on another device".into() }),
        }
        Ok(())
    }

    /// Copies host slot `src` into `buf`'s slot `dst`.
    pub fn load(&self, buf: &mut SlotBuffer, src: usize, dst: usize) -> Result<()> {
        self.check(src, buf, dst)?;
        let p = self.words;
        match (&self.store, &mut buf.store) {
            (HostStore::Vec(v), Store::Host(b)) => b[dst * p..(dst + 1) * p].copy_from_slice(&v[src * p..(src + 1) * p]),
            #[cfg(feature = "cuda")]
            (HostStore::Pinned(h), Store::Cuda(d)) => d.from_pinned(dst * p, p, h, src * p)?,
            #[cfg(feature = "cuda")]
            _ => return Err(KernelError::UnsupportedDevice { op: "HostSlots::load", device: "a buffer on another device".into() }),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_slots_round_trip_a_slot_and_check_their_arguments() {
        let mut b = SlotBuffer::zeros(3, 2);
        b.write_slot(1, &[1.0, 2.0]).unwrap();
        let mut h = HostSlots::for_buffer(&b, 2).unwrap();
        h.save(&b, 1, 1).unwrap();
        b.zero(1).unwrap();
        h.load(&mut b, 1, 2).unwrap();
        assert_eq!(b.slot(2).unwrap(), &[1.0, 2.0]);
        assert_eq!(b.slot(1).unwrap(), &[0.0, 0.0]);
        assert!(matches!(h.save(&b, 0, 2), Err(KernelError::Slot { slot: 2, slots: 2 })));
        assert!(matches!(h.load(&mut b, 0, 3), Err(KernelError::Slot { slot: 3, slots: 3 })));
        assert!(h.save(&SlotBuffer::zeros(1, 3), 0, 0).is_err(), "another slot size");
    }

    #[test]
    fn slots_are_disjoint_and_checked() {
        let mut b = SlotBuffer::zeros(3, 2);
        b.slot_mut(1).unwrap().copy_from_slice(&[1.0, 2.0]);
        b.copy_slot(1, 2).unwrap();
        assert_eq!(b.slot(2).unwrap(), &[1.0, 2.0]);
        assert_eq!(b.slot_to_vec(2).unwrap(), vec![1.0, 2.0]);
        b.zero(1).unwrap();
        assert_eq!(b.slot(1).unwrap(), &[0.0, 0.0]);
        assert!(matches!(b.slot(3), Err(KernelError::Slot { slot: 3, slots: 3 })));
        assert!(b.slots_mut(&[0, 0]).is_err());
        let v = b.slots_mut(&[2, 0]).unwrap();
        assert_eq!(v[0], &[1.0, 2.0]);
    }

    #[test]
    fn host_slots_are_f32_only() {
        let f = SlotBuffer::zeros_on_as(2, 4, &Device::Cpu, DType::F32).unwrap();
        assert_eq!((f.dtype(), f.bytes_per_slot()), (DType::F32, 16));
        let err = SlotBuffer::zeros_on_as(2, 4, &Device::Cpu, DType::BF16).unwrap_err().to_string();
        assert!(err.contains("BF16") && err.contains("on a GPU"), "{err}");
    }
}
