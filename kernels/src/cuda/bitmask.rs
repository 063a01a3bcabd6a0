//! Launcher of the token-bitmask kernel (`cuda/bitmask.cu`).

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{alloc_rows, cuda_dev, first_element_address_any, grid, ptx};
use crate::Result;

/// `logits` `[B, V]` (f32) with rows `rows[r]` masked by `masks[r·words..(r+1)·words]`.
pub fn token_bitmask(logits: &Tensor, rows: &[u32], masks: &[u32], words: usize) -> Result<Tensor> {
    let dev = cuda_dev(logits, "token_bitmask")?;
    let (b, v) = logits.dims2()?;
    let logits = logits.to_dtype(DType::F32)?.contiguous()?;
    let out = alloc_rows(&dev, DType::F32, b, v)?;
    if b == 0 || v == 0 {
        return Ok(out);
    }
    let rows_dev = dev.cuda_stream().clone_htod(rows).w()?;
    let masks_dev = dev.cuda_stream().clone_htod(masks).w()?;
    let f = dev.get_or_load_custom_func("token_bitmask_f32", "bitmask", ptx::BITMASK)?;
    let (in_ptr, out_ptr) = (first_element_address_any(&logits)?, first_element_address_any(&out)?);
    let (ci, bi, wi, vi) = (rows.len() as i32, b as i32, words as i32, v as i32);
    let mut l = f.builder();
    l.arg(&in_ptr).arg(&out_ptr).arg(&rows_dev).arg(&masks_dev).arg(&ci).arg(&bi).arg(&wi).arg(&vi);
    // A few blocks a row: the pass is a copy, memory-bound.
    unsafe { l.launch(grid(v.div_ceil(1024).min(32), b.min(65535), 1, 256, 0)) }.w()?;
    Ok(out)
}
