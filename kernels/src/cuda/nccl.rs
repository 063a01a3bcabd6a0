//! NCCL communicators over the GPUs of one process (cudarc's bindings; libnccl.so.2 is taken
//! from the host at run time, as cuBLAS is). Each GPU's communicator queues its collectives on
//! that GPU's one stream, so they are ordered with every kernel around them and can be captured
//! into a CUDA graph.

use candle_core::cuda_backend::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::cudarc::nccl::{result, sys};
use candle_core::{CudaDevice, DType, Tensor};

use super::wrap;
use crate::{KernelError, Result};

/// One GPU's member of a group made by [`communicators`]. Ours rather than cudarc's `Comm`,
/// whose drop panics when NCCL's abort fails (at a process's exit, say): this one's
/// [`Communicator::close`] returns the error, and its drop ignores it.
#[derive(Debug)]
pub struct Communicator {
    /// Null once closed.
    comm: sys::ncclComm_t,
    stream: std::sync::Arc<CudaStream>,
    dev: CudaDevice,
}

// SAFETY: an NCCL communicator may be used from any thread as long as one thread at a time
// calls it; each rank's communicator is used only by the thread running that rank's pass
// (the engine runs every rank's pass on its own thread, in lockstep).
unsafe impl Send for Communicator {}
// SAFETY: as above; `&self` methods only enqueue work on this communicator's stream.
unsafe impl Sync for Communicator {}

fn nccl_err(e: impl std::fmt::Debug) -> KernelError {
    KernelError::Unsupported { op: "nccl", what: format!("{e:?}") }
}

/// One communicator per device, rank `i` on `devices[i]` (`ncclCommInitAll`). The devices must
/// be distinct GPUs.
pub fn communicators(devices: &[CudaDevice]) -> Result<Vec<Communicator>> {
    let ordinals: Vec<i32> = devices.iter().map(|d| d.cuda_stream().context().ordinal() as i32).collect();
    let mut comms = vec![std::ptr::null_mut(); devices.len()];
    // SAFETY: `comms` has room for one communicator per ordinal.
    unsafe { result::comm_init_all(comms.as_mut_ptr(), ordinals.len() as i32, ordinals.as_ptr()) }.map_err(nccl_err)?;
    Ok(comms.into_iter().zip(devices).map(|(comm, dev)| Communicator { comm, stream: dev.cuda_stream(), dev: dev.clone() }).collect())
}

/// The sum over the group of `parts[r]`, each on member r's device (same shape and dtype: f32,
/// bf16 or f16): member r's copy of the total in `out[r]`, new tensors. Every member's
/// all-reduce is queued by this one thread inside one NCCL group, on each device's stream.
///
/// One thread queues them all because NCCL kernels wait for each other: if one GPU's all-reduce
/// were queued and its thread went on while another rank's thread had not queued its own yet, a
/// CUDA call that waits for the first (a kernel module loaded lazily, say) could keep the second
/// from ever being queued (NCCL's "concurrency between NCCL and CUDA calls").
pub fn all_reduce_sum(comms: &[Communicator], parts: &[Tensor]) -> Result<Vec<Tensor>> {
    if comms.len() != parts.len() {
        return Err(KernelError::Unsupported { op: "all_reduce", what: format!("{} parts for {} members", parts.len(), comms.len()) });
    }
    let parts = parts.iter().map(|t| t.contiguous()).collect::<candle_core::Result<Vec<_>>>()?;
    let mut out = Vec::with_capacity(parts.len());
    candle_core::cuda_backend::cudarc::nccl::group_start().map_err(nccl_err)?;
    let queued = (|| -> Result<()> {
        for (c, t) in comms.iter().zip(&parts) {
            out.push(c.sum(t)?);
        }
        Ok(())
    })();
    // The group ends whatever happened, so NCCL leaves group mode.
    let ended = candle_core::cuda_backend::cudarc::nccl::group_end().map_err(nccl_err);
    queued?;
    ended?;
    Ok(out)
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Communicator {
    /// Frees this member (`ncclCommAbort`: nothing of it is queued that another member waits
    /// for, since every all-reduce is queued for all members at once). Later calls do nothing.
    pub fn close(&mut self) -> Result<()> {
        let comm = std::mem::replace(&mut self.comm, std::ptr::null_mut());
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a live communicator made by `comm_init_all`, freed once (it is null after).
        unsafe { result::comm_abort(comm) }.map(|_| ()).map_err(nccl_err)
    }

    /// Queues this member's part of a grouped all-reduce of `t` (contiguous) on its GPU's
    /// stream; the new output.
    fn sum(&self, t: &Tensor) -> Result<Tensor> {
        let n = t.elem_count();
        let (guard, layout) = t.storage_and_layout();
        let candle_core::Storage::Cuda(cs) = &*guard else {
            return Err(KernelError::UnsupportedDevice { op: "all_reduce", device: "non-cuda storage".into() });
        };
        let start = layout.start_offset();
        macro_rules! reduce {
            ($ty:ty, $nccl:expr) => {{
                if self.comm.is_null() {
                    return Err(KernelError::Unsupported { op: "all_reduce", what: "a closed communicator".into() });
                }
                let src = cs.as_cuda_slice::<$ty>()?.slice(start..start + n);
                // SAFETY: the all-reduce writes all n elements before anything reads them.
                let mut dst = unsafe { self.dev.alloc::<$ty>(n) }?;
                {
                    let (sp, _s) = src.device_ptr(&self.stream);
                    let (dp, _d) = dst.device_ptr_mut(&self.stream);
                    // SAFETY: both buffers hold n elements of the type named, on this member's
                    // device, and the all-reduce is queued on the stream that owns them.
                    unsafe {
                        result::all_reduce(
                            sp as *const _,
                            dp as *mut _,
                            n,
                            $nccl,
                            sys::ncclRedOp_t::ncclSum,
                            self.comm,
                            self.stream.cu_stream() as _,
                        )
                    }
                    .map_err(nccl_err)?;
                }
                wrap(&self.dev, dst, t.shape().clone())
            }};
        }
        let out = match t.dtype() {
            DType::F32 => reduce!(f32, sys::ncclDataType_t::ncclFloat32),
            DType::BF16 => reduce!(half::bf16, sys::ncclDataType_t::ncclBfloat16),
            DType::F16 => reduce!(half::f16, sys::ncclDataType_t::ncclFloat16),
            other => return Err(KernelError::Unsupported { op: "all_reduce", what: format!("dtype {other:?} (f32, bf16 or f16)") }),
        };
        drop(guard);
        Ok(out)
    }
}
