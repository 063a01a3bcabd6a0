//! Launches with programmatic dependent launch (sm_90): the decode step's kernels.
//!
//! A decode step at small batches is a chain of short kernels, and each one's launch and
//! ramp-up used to sit between the previous kernel's end and its own first load. Launched with
//! the programmatic-stream-serialization attribute, a kernel may be scheduled while the kernel
//! before it still runs; it first loads what no kernel of the step writes (its slice of the
//! weights, its sequence's recurrent state), then waits (`pdl_wait` in
//! `kernels/cuda/common.cuh`) until the kernel before has finished and its writes are visible.
//! In a CUDA graph the capture turns the attribute into programmatic edges.
//!
//! Every kernel launched here calls `pdl_wait` before it touches anything another kernel
//! writes, and `pdl_release` only after it: so when a kernel starts, all kernels two or more
//! before it have finished. Only modules whose PTX has that wait (compiled for sm_90 or newer)
//! get the attribute, and only on devices of compute capability 9.0 or newer;
//! `DELTASERVE_PDL=0` turns it off (for comparison).

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{sys, CudaFunction, CudaStream, DevicePtr, DeviceRepr, LaunchConfig};
use candle_core::cuda_backend::WrapErr;
use candle_core::CudaDevice;

use super::ptx;
use crate::Result;

/// Whether programmatic launches are wanted on `stream`'s device: compute capability 9.0 or
/// newer, and `DELTASERVE_PDL` not 0.
pub(super) fn programmatic_device(stream: &CudaStream) -> Result<bool> {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    use sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR;
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // The device's answer per ordinal (0: not asked yet, 1: before sm_90, 2: sm_90 or newer):
    // a driver call costs the host microseconds, and every decode kernel asks.
    static CAPABLE: [AtomicU8; 16] = [const { AtomicU8::new(0) }; 16];
    if !*ENV.get_or_init(|| std::env::var("DELTASERVE_PDL").map_or(true, |v| v != "0")) {
        return Ok(false);
    }
    let ctx = stream.context();
    let known = CAPABLE.get(ctx.ordinal());
    if let Some(k) = known.map(|k| k.load(Relaxed)).filter(|&k| k > 0) {
        return Ok(k == 2);
    }
    let capable = ctx.attribute(MAJOR).w()? >= 9;
    if let Some(k) = known {
        k.store(1 + capable as u8, Relaxed);
    }
    Ok(capable)
}

/// The kernels, of every module, whose code waits for its predecessor (`pdl_wait`): only edges
/// into these may be programmatic. Read from the PTX itself, entry by entry, so that a module
/// compiled for an older architecture (the wait compiled out) has none.
pub(super) fn waiting_kernels() -> &'static HashSet<&'static str> {
    static WAITING: std::sync::OnceLock<HashSet<&'static str>> = std::sync::OnceLock::new();
    WAITING.get_or_init(|| {
        let mut waiting = HashSet::new();
        for module in ptx::ALL {
            // A function starts at its `.entry` or `.func` line; only entries are kernels.
            let mut current: Option<&'static str> = None;
            for line in module.lines() {
                let l = line.trim_start();
                let head = l.strip_prefix(".visible ").or_else(|| l.strip_prefix(".weak ")).unwrap_or(l);
                if let Some(rest) = head.strip_prefix(".entry ") {
                    current = rest.split(['(', ' ']).next();
                } else if head.starts_with(".func ") {
                    current = None;
                } else if l.starts_with("griddepcontrol.wait") {
                    if let Some(name) = current {
                        waiting.insert(name);
                    }
                }
            }
        }
        waiting
    })
}

/// One kernel launch's arguments, kept by value (the driver copies them at the launch).
pub(super) struct Launch<'a> {
    func: &'a CudaFunction,
    stream: Arc<CudaStream>,
    programmatic: bool,
    /// Each argument's bytes in 8-byte words, so that every argument is aligned.
    args: Vec<Box<[u64]>>,
}

impl<'a> Launch<'a> {
    /// A launch of `func`, loaded from the module whose PTX is `ptx`, on `dev`'s stream.
    pub(super) fn new(dev: &CudaDevice, func: &'a CudaFunction, ptx: &str) -> Result<Self> {
        Ok(Self { func, stream: dev.cuda_stream(), programmatic: programmatic_device(&dev.cuda_stream())? && ptx.contains("griddepcontrol.wait"), args: Vec::with_capacity(16) })
    }

    /// Appends a by-value argument.
    pub(super) fn arg<T: DeviceRepr>(&mut self, v: &T) -> &mut Self {
        let mut words = vec![0u64; size_of::<T>().div_ceil(8)].into_boxed_slice();
        // SAFETY: `words` holds at least size_of::<T>() bytes; T is plain data (DeviceRepr).
        unsafe { std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), words.as_mut_ptr().cast::<u8>(), size_of::<T>()) };
        self.args.push(words);
        self
    }

    /// Appends the address of a device buffer (a slice or a view).
    pub(super) fn buf<T, B: DevicePtr<T>>(&mut self, b: &B) -> &mut Self {
        // cudarc's event tracking is off (one stream a device), so the guard records nothing.
        let stream = self.stream.clone();
        let ptr = b.device_ptr(&stream).0;
        self.arg(&ptr)
    }

    /// Launches on the device's stream, programmatically where [`wanted`].
    ///
    /// # Safety
    /// The arguments match the kernel's parameters, and the kernel calls `pdl_wait` before it
    /// touches memory that another kernel writes.
    pub(super) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<()> {
        self.stream.context().bind_to_thread().w()?;
        let mut params: Vec<*mut c_void> = self.args.iter_mut().map(|a| a.as_mut_ptr().cast()).collect();
        // SAFETY: a zeroed attribute is a valid plain value; the id and union member set match.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: self.programmatic as u32,
        };
        // SAFETY: `params` points at one live value per kernel parameter (the caller's
        // contract); `config` and `attr` outlive the call.
        unsafe { sys::cuLaunchKernelEx(&config, self.func.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }.result().w()?;
        Ok(())
    }
}
