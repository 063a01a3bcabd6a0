//! Launchers of the causal conv1d + SiLU: over packed prompts (prefill) and one step for B
//! slots (decode), both updating the slots' conv states in place. Inputs are read where they lie
//! (a column slice of the fused projection, f32, bf16 or f16); outputs are contiguous f32.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::decode::DecodeSlots;
use super::{alloc_rows, cuda_dev, f32c, func, grid, modules, table_addrs, wrap, DeviceSlots, RowsArg};
use crate::packing::{capture_packing, Part};
use crate::{Capture, KernelError, PackedTables, Result, StepSlots};

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
/// then the new states (the last W inputs of each sequence); a third writes the captures'
/// states when there are any (or `fixed` tables, whose capture entries may be unused). With
/// `fixed`, the tables are read from its buffer (filled with this packing) and nothing is
/// uploaded.
#[allow(clippy::too_many_arguments)]
pub fn conv_prefill(
    x: &Tensor,
    weight: &Tensor,
    states: &mut DeviceSlots,
    cu_seqlens: &[usize],
    slots: &[usize],
    captures: &[Capture],
    silu: bool,
    narrow: bool,
    fixed: Option<&PackedTables>,
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
    let tables = ConvTables::new(&dev, "conv_prefill", rows, cu_seqlens, slots, captures, fixed)?;
    // Four channels a thread (8- or 16-byte loads) when the rows allow it.
    let (x4, ch, tile) = if xa.vectorisable(4, c) { ("_x4", 4, CONV_ROWS[1]) } else { ("", 1, CONV_ROWS[0]) };
    // fla's default width 4 has kernels with the width compiled in (see conv.cu).
    let w4 = if w == 4 { "_w4" } else { "" };
    let out = if narrow { "_narrow" } else { "" };
    let outputs = func(&dev, &format!("conv_prefill_{}{x4}{w4}{out}", xa.suffix), &modules::CONV)?;
    let y_ptr = super::first_element_address_any(&y)?;
    let (si, ri, ci, wi, act) = (slots.len() as i32, rows as i32, c as i32, w as i32, silu as i32);
    with_view!(weight, wv, {
        let mut b = outputs.builder();
        b.arg(&xa.ptr).arg(&xa.ld).arg(&wv).arg(states.state_words("conv")?).arg(&tables.cu).arg(&tables.slots).arg(&si);
        b.arg(&y_ptr).arg(&ri).arg(&ci).arg(&wi).arg(&act);
        unsafe { b.launch(grid(c.div_ceil(ch * BLOCK), rows.div_ceil(tile), 1, BLOCK as u32, 0)) }.w()?;
    });
    tables.write_states(&dev, &xa, states, c, w)?;
    Ok(y)
}

/// A packed prefill's tables on the device (sequence starts, slots, and the captures' own),
/// for the launch of a conv's outputs and the state writes after it.
pub(super) struct ConvTables {
    /// The upload, alive while the launches may read it (none with fixed tables).
    _upload: Option<candle_core::cuda_backend::cudarc::driver::CudaSlice<i32>>,
    /// Device address of `cu_seqlens`.
    pub(super) cu: u64,
    /// Device address of `slots`.
    pub(super) slots: u64,
    /// The captures' sequence starts and slots.
    captures: (u64, u64),
    /// Sequences whose states the launch after the outputs writes.
    sequences: usize,
    /// Captured states to write (a fixed table's count, whose entries may be unused).
    copies: usize,
}

impl ConvTables {
    /// Uploads the packing's tables, or (`fixed`) points into its buffer, checked against `rows`.
    pub(super) fn new(
        dev: &candle_core::cuda_backend::CudaDevice,
        op: &'static str,
        rows: usize,
        cu_seqlens: &[usize],
        slots: &[usize],
        captures: &[Capture],
        fixed: Option<&PackedTables>,
    ) -> Result<Self> {
        if let Some(t) = fixed {
            t.check(op, rows, slots)?;
        }
        let (cap_cu, cap_slots) = capture_packing(cu_seqlens, captures);
        let fixed_parts = fixed.map(|t| (t, [Part::Cu, Part::Slots, Part::CaptureCu, Part::CaptureSlot]));
        let (upload, [cu, sl, ccu, csl]) = table_addrs(dev, [cu_seqlens, slots, &cap_cu, &cap_slots], fixed_parts)?;
        let copies = fixed.map_or(cap_slots.len(), PackedTables::captures);
        Ok(Self { _upload: upload, cu, slots: sl, captures: (ccu, csl), sequences: slots.len(), copies })
    }

    /// The conv states after the outputs' launch: each slot takes its sequence's last W inputs
    /// of `xa`, then each capture its own (from rows no launch writes).
    pub(super) fn write_states(
        &self,
        dev: &candle_core::cuda_backend::CudaDevice,
        xa: &RowsArg,
        states: &mut DeviceSlots,
        c: usize,
        w: usize,
    ) -> Result<()> {
        write_states(dev, xa, states, (self.cu, self.slots), self.sequences, c, w)?;
        if self.copies > 0 {
            write_states(dev, xa, states, self.captures, self.copies, c, w)?;
        }
        Ok(())
    }
}

/// The `conv_state_*` launch: one block row for each of the `n` sequences of the tables at
/// `cu` and `slots` (device addresses): slot `slots[s]` takes the last W rows of sequence s.
fn write_states(
    dev: &candle_core::cuda_backend::CudaDevice,
    xa: &RowsArg,
    states: &mut DeviceSlots,
    (cu, sl): (u64, u64),
    n: usize,
    c: usize,
    w: usize,
) -> Result<()> {
    let f = func(dev, &format!("conv_state_{}", xa.suffix), &modules::CONV)?;
    let (ci, wi) = (c as i32, w as i32);
    let mut b = f.builder();
    b.arg(&xa.ptr).arg(&xa.ld).arg(states.state_words("conv")?).arg(&cu).arg(&sl).arg(&ci).arg(&wi);
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
    let f = func(&dev, &format!("conv_step_{}", xa.suffix), &modules::CONV)?;
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
