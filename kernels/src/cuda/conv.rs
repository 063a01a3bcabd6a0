//! Launchers of the causal conv1d + SiLU: over packed prompts (prefill) and one step for B
//! slots (decode), both updating the slots' conv states in place. Inputs are read where they lie
//! (a column slice of the fused projection, f32, bf16 or f16); outputs are contiguous f32.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::decode::DecodeSlots;
use super::{alloc_rows, cuda_dev, f32c, grid, index_tables, ptx, wrap, DeviceSlots, RowsArg};
use crate::{KernelError, Result, StepSlots};

/// Rows a thread of `conv_prefill_*` walks, with one channel a thread and (`_x4`) four.
const CONV_ROWS: [usize; 2] = [32, 16];
/// Threads a block of the conv kernels, one channel each.
const BLOCK: usize = 128;
/// The largest y dimension of a launch grid.
const MAX_GRID_Y: usize = 65535;

/// Causal conv + SiLU over packed sequences `x` `[Σ T, C]`: sequence `s` owns rows
/// `cu_seqlens[s]..cu_seqlens[s+1]` and the conv state of `slots[s]`. Returns `[Σ T, C]` f32,
/// or with `narrow` (bf16 `x`) bf16.
///
/// Two launches: the outputs, parallel over channels and row tiles, reading the old states;
/// then the new states (the last W inputs of each sequence).
pub fn conv_prefill(
    x: &Tensor,
    weight: &Tensor,
    states: &mut DeviceSlots,
    cu_seqlens: &[usize],
    slots: &[usize],
    silu: bool,
    narrow: bool,
) -> Result<Tensor> {
    let dev = cuda_dev(x, "conv_prefill")?;
    let (rows, c) = x.dims2()?;
    let w = weight.dim(1)?;
    for (input, n, max) in [("x", rows, MAX_GRID_Y * CONV_ROWS[1]), ("cu_seqlens", slots.len(), MAX_GRID_Y)] {
        if n > max {
            return Err(KernelError::Shape {
                op: "conv_prefill",
                input,
                expected: format!("at most {max} rows or sequences"),
                actual: vec![n],
            });
        }
    }
    let xa = RowsArg::new(x)?;
    let narrow = narrow && xa.suffix == "bf16";
    // The kernel writes every element of y (cu_seqlens covers every row, checked by ops).
    let y = alloc_rows(&dev, if narrow { DType::BF16 } else { DType::F32 }, rows, c)?;
    if rows == 0 || c == 0 {
        return Ok(y);
    }
    let weight = f32c(weight)?;
    let (tables, [r_cu, r_sl]) = index_tables(&dev, [cu_seqlens, slots])?;
    let (cu, sl) = (tables.slice(r_cu), tables.slice(r_sl));
    // Four channels a thread (8- or 16-byte loads) when the rows allow it.
    let (x4, ch, tile) = if xa.vectorisable(4, c) { ("_x4", 4, CONV_ROWS[1]) } else { ("", 1, CONV_ROWS[0]) };
    // fla's default width 4 has kernels with the width compiled in (see conv.cu).
    let w4 = if w == 4 { "_w4" } else { "" };
    let out = if narrow { "_narrow" } else { "" };
    let outputs = dev.get_or_load_custom_func(&format!("conv_prefill_{}{x4}{w4}{out}", xa.suffix), "conv", ptx::CONV)?;
    let y_ptr = super::first_element_address_any(&y)?;
    let (si, ri, ci, wi, act) = (slots.len() as i32, rows as i32, c as i32, w as i32, silu as i32);
    with_view!(weight, wv, {
        let mut b = outputs.builder();
        b.arg(&xa.ptr).arg(&xa.ld).arg(&wv).arg(states.state_words("conv")?).arg(&cu).arg(&sl).arg(&si);
        b.arg(&y_ptr).arg(&ri).arg(&ci).arg(&wi).arg(&act);
        unsafe { b.launch(grid(c.div_ceil(ch * BLOCK), rows.div_ceil(tile), 1, BLOCK as u32, 0)) }.w()?;
    });
    write_states(&dev, &xa, states, &cu, &sl, slots.len(), c, w)?;
    Ok(y)
}

/// Writes into `slots[s]` the conv state after rows `cu_seqlens[s]..cu_seqlens[s+1]` of `x`
/// `[rows, C]` (their last W rows; the slot's old values where a sequence is shorter).
pub fn conv_states(x: &Tensor, states: &mut DeviceSlots, cu_seqlens: &[usize], slots: &[usize], w: usize) -> Result<()> {
    let dev = cuda_dev(x, "conv_states")?;
    let c = x.dim(1)?;
    if slots.is_empty() || c == 0 {
        return Ok(());
    }
    let xa = RowsArg::new(x)?;
    let (tables, [r_cu, r_sl]) = index_tables(&dev, [cu_seqlens, slots])?;
    write_states(&dev, &xa, states, &tables.slice(r_cu), &tables.slice(r_sl), slots.len(), c, w)
}

/// The `conv_state_*` launch: one block row a sequence.
#[allow(clippy::too_many_arguments)]
fn write_states(
    dev: &candle_core::cuda_backend::CudaDevice,
    xa: &RowsArg,
    states: &mut DeviceSlots,
    cu: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, i32>,
    sl: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, i32>,
    n: usize,
    c: usize,
    w: usize,
) -> Result<()> {
    let f = dev.get_or_load_custom_func(&format!("conv_state_{}", xa.suffix), "conv", ptx::CONV)?;
    let (ci, wi) = (c as i32, w as i32);
    let mut b = f.builder();
    b.arg(&xa.ptr).arg(&xa.ld).arg(states.state_words("conv")?).arg(cu).arg(sl).arg(&ci).arg(&wi);
    unsafe { b.launch(grid(c.div_ceil(BLOCK), n, 1, BLOCK as u32, 0)) }.w()?;
    Ok(())
}

/// One conv step: row `b` of `x` `[B, C]` shifts into the conv state of `slots[b]`. Returns
/// `[B, C]` f32.
pub fn conv_step(x: &Tensor, weight: &Tensor, states: &mut DeviceSlots, slots: StepSlots<'_>, silu: bool) -> Result<Tensor> {
    let dev = cuda_dev(x, "conv_step")?;
    let (b, c) = x.dims2()?;
    let w = weight.dim(1)?;
    if b > MAX_GRID_Y {
        return Err(KernelError::Shape { op: "conv_step", input: "x", expected: format!("at most {MAX_GRID_Y} rows"), actual: vec![b, c] });
    }
    // SAFETY: the kernel writes every element of y.
    let mut y = unsafe { dev.alloc::<f32>(b * c) }?;
    if b == 0 || c == 0 {
        return Ok(wrap(&dev, y, (b, c)));
    }
    let sl = DecodeSlots::new(&dev, slots)?;
    let xa = RowsArg::new(x)?;
    let weight = f32c(weight)?;
    let f = dev.get_or_load_custom_func(&format!("conv_step_{}", xa.suffix), "conv", ptx::CONV)?;
    let (ci, wi, act) = (c as i32, w as i32, silu as i32);
    with_view!(weight, wv, {
        let mut l = f.builder();
        l.arg(&xa.ptr).arg(&xa.ld).arg(&wv).arg(states.state_words("conv")?);
        sl.push(&mut l);
        l.arg(&mut y).arg(&ci).arg(&wi).arg(&act);
        unsafe { l.launch(grid(c.div_ceil(BLOCK), b, 1, BLOCK as u32, 0)) }.w()?;
    });
    Ok(wrap(&dev, y, (b, c)))
}
