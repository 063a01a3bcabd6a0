//! Launchers of the causal conv1d + SiLU: over packed prompts (prefill) and one step for B
//! slots (decode), both updating the slots' conv states in place.

use candle_core::cuda_backend::cudarc::driver::{CudaView, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::Tensor;

use super::decode::DecodeSlots;
use super::{cuda_dev, f32c, grid, index_tables, ptx, wrap, DeviceSlots};
use crate::{Result, StepSlots};

/// Causal conv + SiLU over packed sequences `x` `[Σ T, C]`: sequence `s` owns rows
/// `cu_seqlens[s]..cu_seqlens[s+1]` and the conv state of `slots[s]`. Returns `[Σ T, C]` f32.
pub fn conv_prefill(
    x: &Tensor,
    weight: &Tensor,
    states: &mut DeviceSlots,
    cu_seqlens: &[usize],
    slots: &[usize],
    silu: bool,
) -> Result<Tensor> {
    let dev = cuda_dev(x, "conv_prefill")?;
    let (tables, [o_cu, o_sl]) = index_tables(&dev, [cu_seqlens, slots])?;
    let (cu, sl) = (tables.slice(o_cu..o_cu + cu_seqlens.len()), tables.slice(o_sl..o_sl + slots.len()));
    // cu_seqlens covers every row (checked by ops): the kernel writes each.
    launch("conv_prefill_f32", x, weight, states, silu, slots.len(), ConvSlots::Packed { cu: &cu, slots: &sl })
}

/// One conv step: row `b` of `x` `[B, C]` shifts into the conv state of `slots[b]`.
pub fn conv_step(x: &Tensor, weight: &Tensor, states: &mut DeviceSlots, slots: StepSlots<'_>, silu: bool) -> Result<Tensor> {
    let dev = cuda_dev(x, "conv_step")?;
    let sl = DecodeSlots::new(&dev, slots)?;
    launch("conv_step_f32", x, weight, states, silu, slots.host.len(), ConvSlots::Step(&sl))
}

/// The slot arguments of the two conv kernels.
enum ConvSlots<'a> {
    /// `cu_seqlens`, `slots` (prefill).
    Packed { cu: &'a CudaView<'a, i32>, slots: &'a CudaView<'a, i32> },
    /// `SlotList slots, const int* more_slots` (decode).
    Step(&'a DecodeSlots),
}

/// Launches conv kernel `name` over `x` `[rows, C]` with grid (C/128, `grid_y`):
/// `(x, weight, states, <slot arguments>, y, C, W, silu)`. Returns y `[rows, C]` f32, every
/// element of which the kernels write.
fn launch(
    name: &str,
    x: &Tensor,
    weight: &Tensor,
    states: &mut DeviceSlots,
    silu: bool,
    grid_y: usize,
    slot_args: ConvSlots<'_>,
) -> Result<Tensor> {
    let dev = cuda_dev(x, "conv")?;
    let (rows, c) = x.dims2()?;
    let w = weight.dim(1)?;
    let (x, weight) = (f32c(x)?, f32c(weight)?);
    // SAFETY: the kernels write every element of y.
    let mut y = unsafe { dev.alloc::<f32>(rows * c) }?;
    let f = dev.get_or_load_custom_func(name, "conv", ptx::CONV)?;
    let (ci, wi, si) = (c as i32, w as i32, silu as i32);
    with_view!(x, xv, {
        with_view!(weight, wv, {
            let mut b = f.builder();
            b.arg(&xv).arg(&wv).arg(&mut states.data);
            match &slot_args {
                ConvSlots::Packed { cu, slots } => {
                    b.arg(*cu).arg(*slots);
                }
                ConvSlots::Step(sl) => sl.push(&mut b),
            }
            b.arg(&mut y).arg(&ci).arg(&wi).arg(&si);
            unsafe { b.launch(grid(c.div_ceil(128), grid_y, 1, 128, 0)) }.w()?;
        })
    });
    Ok(wrap(&dev, y, (rows, c)))
}
