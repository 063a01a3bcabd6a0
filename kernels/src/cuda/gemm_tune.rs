//! cublasLt's algorithm for a prefill's GEMMs, timed rather than taken from its heuristic.
//!
//! At a prefill's row counts the heuristic's first algorithm is often not the fastest it offers:
//! on the H200 at 4,096 rows another tile shape ran Qwen3.5's `in_proj` and `gate_up` 10–18%
//! faster (`gpu_bench --gemm-algos --gemm-algos-rows 4096`). Timing them per process would let a
//! restart change the projections' rounding, so only algorithms whose product equals the
//! heuristic's first bit for bit, on the call's own operands, may win: those without split-K
//! sum each output over K in the same order whatever their tiles (every one the heuristic
//! offered at these shapes did). The first call of each row bucket pays the timing (a few ms at
//! 4,096 rows); the start-up warm-up runs every bucket once, so requests do not.

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::cuda_backend::cudarc::cublaslt::sys;
use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
use candle_core::cuda_backend::cudarc::driver::sys::CUstreamCaptureStatus;
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::CudaDevice;

use super::gemm::{split_of, Descs, Lt};
use super::{copy::copy_many, func, grid, modules, Switch};
use crate::Result;

/// Algorithms the heuristic is asked for.
pub(super) const CANDIDATES: usize = 8;
/// Row buckets from which a GEMM's algorithm is timed: a prefill's (decode steps and short
/// passes keep the heuristic's first, and run inside CUDA graphs, where nothing can be timed).
const MIN_ROWS: usize = 256;
/// Timing rounds, every candidate once a round (interleaved, so that a clock change between
/// rounds touches them all), two GEMMs a timing; a candidate's time is its fastest round.
const ROUNDS: usize = 3;
const CALLS: usize = 2;
/// Largest output timed, in bytes: the check keeps a copy of it (a prompt's logits over a whole
/// vocabulary, were they ever a 16-bit GEMM, keep the heuristic's first).
const MAX_OUTPUT_BYTES: usize = 256 << 20;

static TUNE: Switch = Switch::new("DELTASERVE_GEMM_TUNE");
/// Algorithms timed since start, and how many of them chose another than the heuristic's first.
static TIMED: AtomicU64 = AtomicU64::new(0);
static MOVED: AtomicU64 = AtomicU64::new(0);

/// `(timed, moved)`: GEMM algorithm choices timed since start, and those whose fastest was not
/// the heuristic's first.
pub fn gemm_tuning_counts() -> (u64, u64) {
    (TIMED.load(Ordering::Relaxed), MOVED.load(Ordering::Relaxed))
}

/// Whether a GEMM of `bucket` rows (`parts` slices of K, f32 output or not, `elems` outputs of
/// `ty`) has its algorithm timed: prefill rows, one GEMM (not K's slices), a 16-bit output
/// whose bytes are whole 32-bit words and at most [`MAX_OUTPUT_BYTES`], `dev`'s stream not
/// capturing, unless
/// `DELTASERVE_GEMM_TUNE=0` or [`set_gemm_tuning`] said otherwise.
pub(super) fn applies(dev: &CudaDevice, bucket: usize, parts: usize, out_f32: bool, ty: sys::cudaDataType, elems: usize) -> bool {
    let sixteen_bit = matches!(ty, sys::cudaDataType::CUDA_R_16BF | sys::cudaDataType::CUDA_R_16F);
    bucket >= MIN_ROWS
        && parts == 1
        && !out_f32
        && sixteen_bit
        && elems.is_multiple_of(2)
        && elems * 2 <= MAX_OUTPUT_BYTES
        && TUNE.on()
        && matches!(dev.cuda_stream().capture_status(), Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE))
}

/// Turns the timing of prefill GEMMs' algorithms on or off for the process (those already
/// chosen stay).
#[doc(hidden)]
pub fn set_gemm_tuning(on: bool) {
    TUNE.set(on);
}

/// The fastest of `cands` (the heuristic's order) whose product, `elems` 16-bit outputs at `yp`,
/// equals the first's bit for bit on these operands: the first itself where it splits K, where
/// it is alone, or where the timing fails (a buffer it cannot allocate: the GEMM still runs).
/// Leaves `y` holding some candidate's product (the caller's GEMM overwrites it).
pub(super) fn fastest_same_bits(
    dev: &CudaDevice,
    state: &mut Lt,
    d: &Descs,
    ptrs: [u64; 3],
    elems: usize,
    cands: &[sys::cublasLtMatmulAlgo_t],
) -> Option<sys::cublasLtMatmulAlgo_t> {
    let first = *cands.first()?;
    if split_of(&first) > 1 || cands.len() < 2 {
        return Some(first);
    }
    match time_same_bits(dev, state, d, ptrs, elems, cands) {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::warn!(error = %e, "timing a prefill GEMM's algorithms failed; the heuristic's first runs");
            Some(first)
        }
    }
}

/// [`fastest_same_bits`] past its checks.
fn time_same_bits(
    dev: &CudaDevice,
    state: &mut Lt,
    d: &Descs,
    ptrs: [u64; 3],
    elems: usize,
    cands: &[sys::cublasLtMatmulAlgo_t],
) -> Result<sys::cublasLtMatmulAlgo_t> {
    let first = cands[0];
    let run = |state: &mut Lt, a: &sys::cublasLtMatmulAlgo_t| super::gemm::matmul(dev, state, d, a, ptrs).is_ok();
    // The first's product, kept to compare the others' with.
    let words = elems / 2;
    let stream = dev.cuda_stream();
    // SAFETY: copy_many writes every word before anything reads it.
    let reference = unsafe { stream.alloc::<u32>(words) }.w()?;
    let reference_at = {
        let (p, _sync) = reference.device_ptr(&stream);
        p
    };
    if !run(state, &first) {
        return Ok(first);
    }
    copy_many(dev, &[(ptrs[2], reference_at, words)])?;
    let mut same = vec![first];
    for a in cands[1..].iter().filter(|a| split_of(a) == 1) {
        if run(state, a) && differing_words(dev, ptrs[2], reference_at, words)? == 0 {
            same.push(*a);
        }
    }
    let mut best = vec![f32::INFINITY; same.len()];
    for _ in 0..ROUNDS {
        for (i, a) in same.iter().enumerate() {
            let start = stream.record_event(Some(CU_EVENT_DEFAULT)).w()?;
            let ok = (0..CALLS).all(|_| run(state, a));
            let end = stream.record_event(Some(CU_EVENT_DEFAULT)).w()?;
            let ms = if ok { start.elapsed_ms(&end).w()? } else { f32::INFINITY };
            best[i] = best[i].min(ms);
        }
    }
    // The first of the fastest: the heuristic's order breaks ties.
    let i = (0..same.len()).fold(0, |b, i| if best[i] < best[b] { i } else { b });
    TIMED.fetch_add(1, Ordering::Relaxed);
    if i > 0 {
        MOVED.fetch_add(1, Ordering::Relaxed);
    }
    tracing::debug!(candidates = cands.len(), same_bits = same.len(), chosen = i, ms = ?best, "prefill GEMM algorithm timed");
    Ok(same[i])
}

/// How many of the `words` 32-bit words at `a` and `b` differ (`count_differing_words` in
/// copy.cu; waits for the stream).
fn differing_words(dev: &CudaDevice, a: u64, b: u64, words: usize) -> Result<u64> {
    let stream = dev.cuda_stream();
    let mut count = stream.alloc_zeros::<u64>(1).w()?;
    let f = func(dev, "count_differing_words", &modules::COPY)?;
    let n = words as u64;
    let mut l = f.builder();
    l.arg(&a).arg(&b).arg(&n).arg(&mut count);
    // Four blocks an SM (the count is cached per device), fewer for a small output.
    let blocks = (4 * super::sm_count(dev)?).min(words.div_ceil(256)).max(1);
    unsafe { l.launch(grid(blocks, 1, 1, 256, 0)) }.w()?;
    Ok(stream.clone_dtoh(&count).w()?[0])
}
