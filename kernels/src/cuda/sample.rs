//! Launcher of the batched sampling kernel (`cuda/sample.cu`).

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{cuda_dev, first_element_address_any, func, grid, modules};
use crate::ops::sample::wire::{pack, unpack, OUT_WORDS};
use crate::ops::sample::{Outcome, SampleBatch};
use crate::Result;

/// Tokens above the nucleus's floor that a top-p search copies to shared memory (the kernel's
/// `CANDIDATES`); `DELTASERVE_SAMPLE_SHARED=0` makes every search run over the whole row (for
/// comparisons).
fn max_candidates() -> i32 {
    static N: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *N.get_or_init(|| if std::env::var("DELTASERVE_SAMPLE_SHARED").is_ok_and(|v| v == "0") { 0 } else { 4096 })
}

/// One block a draw: the rules go up in one copy, the results come back in one.
pub fn sample(logits: &Tensor, batch: &SampleBatch<'_>) -> Result<Vec<Outcome>> {
    let dev = cuda_dev(logits, "sample")?;
    let (_, vocab) = logits.dims2()?;
    let logits = logits.to_dtype(DType::F32)?.contiguous()?;
    let draws = batch.rules.len();
    let (words, adjust_at, masks_at) = pack(batch);
    let stream = dev.cuda_stream();
    let spec = stream.clone_htod(&words).w()?;
    // SAFETY: every draw's block writes its row of `scratch` before reading it, and its result
    // words before they are read back.
    let mut scratch = unsafe { dev.alloc::<f32>(draws * vocab) }?;
    let mut out = unsafe { dev.alloc::<u32>(draws * OUT_WORDS) }?;
    let f = func(&dev, "sample_rows", &modules::SAMPLE)?;
    let in_ptr = first_element_address_any(&logits)?;
    let (v, w, a, m) = (vocab as i32, batch.words as i32, adjust_at as i32, masks_at as i32);
    let candidates = max_candidates();
    let mut l = f.builder();
    l.arg(&in_ptr).arg(&mut scratch).arg(&spec).arg(&mut out).arg(&v).arg(&w).arg(&a).arg(&m).arg(&candidates);
    unsafe { l.launch(grid(draws, 1, 1, 1024, 0)) }.w()?;
    let host = stream.clone_dtoh(&out).w()?;
    Ok(host.chunks(OUT_WORDS).map(unpack).collect())
}
