//! How `gpu_bench` times: medians of wall-clock or CUDA-event timings, and the copy bandwidth
//! that every roofline divides by, measured once in the run.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::SlotBuffer;

/// The device's copy bandwidth in bytes (read + written) a second, measured once in this run:
/// the median of ten copies of 1 GiB by the engine's 16-byte-vector copy kernel (`copy_many`,
/// 64 ranges of 16 MiB in one launch). Every "% of roofline" and "% of copy bandwidth" divides by
/// it, so a ratio never mixes two GPUs or two days. The driver's own device-to-device copy of
/// the same bytes is printed beside it: on the H200 it ran at half the kernel's rate.
pub(super) fn copy_bw(dev: &Device) -> anyhow::Result<f64> {
    static BW: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    if let Some(bw) = BW.get() {
        return Ok(*bw);
    }
    let (ranges, per) = (64usize, 4usize << 20);
    let bytes = 2.0 * (ranges * per * 4) as f64;
    let mut bufs = (0..ranges).map(|_| SlotBuffer::zeros_on(2, per, dev)).collect::<Result<Vec<_>, _>>()?;
    // Timed with the GPU busy when the launch arrives (DoBench), so that the host's time to issue
    // it is not counted: from an idle GPU the copy measured ~1% slower than the kernel itself
    // (benches/results/h200-state_hints-2026-11-30/: 3,921 against 3,955–3,962 GB/s), and the
    // roofline with it.
    let kernel_ms = median_gpu_ms(dev, 10, Timing::DoBench, || {
        let mut refs: Vec<&mut SlotBuffer> = bufs.iter_mut().collect();
        SlotBuffer::copy_slot_all(&mut refs, 0, 1)?;
        Ok(())
    })?;
    drop(bufs);
    let n = ranges * per;
    let (src, dst) = (Tensor::zeros(n, DType::F32, dev)?, Tensor::zeros(n, DType::F32, dev)?);
    let memcpy_ms = median_gpu_ms(dev, 10, Timing::IdleGpu, || {
        dst.slice_set(&src, 0, 0)?;
        Ok(())
    })?;
    let (bw, memcpy) = (bytes / (kernel_ms * 1e-3), bytes / (memcpy_ms * 1e-3));
    println!(
        "(copy bandwidth of this GPU, measured in this run: {:.0} GB/s read + written by a copy kernel, the roofline's; {:.0} GB/s by the driver's memcpy)",
        bw / 1e9,
        memcpy / 1e9
    );
    Ok(*BW.get_or_init(|| bw))
}

/// Median of `reps` timings (ms) of `time_one`, after three warm-up calls of `f`.
fn median_of(
    reps: usize,
    f: &mut impl FnMut() -> anyhow::Result<()>,
    mut time_one: impl FnMut(&mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64>,
) -> anyhow::Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    let mut times = (0..reps).map(|_| time_one(f)).collect::<anyhow::Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Median wall-clock time of `f` in ms, the host synchronising after each call.
pub(super) fn median_ms(dev: &Device, reps: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    median_of(reps, &mut f, |f| {
        dev.synchronize()?;
        let t0 = Instant::now();
        f()?;
        dev.synchronize()?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    })
}

/// How a GPU timing starts: what the GPU is doing when the start event is recorded.
#[derive(Debug, Clone, Copy)]
pub(super) enum Timing {
    /// As triton's `do_bench` times fla for anchors.md: each call follows a 256 MB memset
    /// that evicts the L2 cache, and the GPU is still busy with it while the host issues the
    /// start event and the call, so the figure is the GPU's time for the call alone.
    DoBench,
    /// The GPU idles before each call: the host's time to issue the call's launches (after
    /// the start event reaches the GPU) is counted too.
    IdleGpu,
}

/// Median GPU time of `f` in ms between CUDA events recorded on the device's stream around each
/// call, started as `timing` says; the host's synchronisation after each call is not counted
/// (it is in [`median_ms`], which the whole-model table keeps).
pub(super) fn median_gpu_ms(dev: &Device, reps: usize, timing: Timing, f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = dev {
        return median_event_ms(cuda, reps, timing, f);
    }
    let _ = timing;
    median_ms(dev, reps, f)
}

#[cfg(feature = "cuda")]
fn median_event_ms(
    cuda: &candle_core::CudaDevice,
    reps: usize,
    timing: Timing,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    let stream = cuda.cuda_stream();
    // do_bench's cache buffer: 256 MB, five times the H100's 50 MB L2.
    let mut flush = match timing {
        Timing::DoBench => Some(stream.alloc_zeros::<u32>(64 << 20)?),
        Timing::IdleGpu => None,
    };
    median_of(reps, &mut f, |f| {
        if let Some(buf) = flush.as_mut() {
            stream.memset_zeros(buf)?;
        } else {
            stream.synchronize()?;
        }
        let start = stream.record_event(Some(CU_EVENT_DEFAULT))?;
        f()?;
        let end = stream.record_event(Some(CU_EVENT_DEFAULT))?;
        Ok(start.elapsed_ms(&end)? as f64)
    })
}
