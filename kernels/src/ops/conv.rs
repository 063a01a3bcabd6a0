//! The causal depthwise conv1d + SiLU over `[q | k | v]` (model-spec.md §3.2): packed prefill
//! and the batched decode step, each updating per-slot conv states.

use candle_core::{DType, Tensor};

use super::{check_captures, check_packing, check_rows, cpu_f32, dims2, expect_dims, Prepared, QkLayout};
use crate::cpu::conv;
use crate::{Capture, ConvActivation, KernelError, PackedTables, Result, SlotBuffer, StepSlots};

/// Causal depthwise conv over a prompt chunk `x` `[T, C]` with `weight` `[C, W]`, continuing
/// from and updating the conv state `[C, W]` of `slot`. Returns `[T, C]` f32.
pub fn conv_prefill(x: &Tensor, weight: &Tensor, states: &mut SlotBuffer, slot: usize, act: ConvActivation) -> Result<Tensor> {
    let t = dims2("conv_prefill", "x", x)?.0;
    conv_prefill_packed(x, weight, states, &[0, t], &[slot], act, &[], DType::F32, None)
}

/// [`conv_prefill`] over several sequences packed in `x` `[Σ T, C]`: sequence `s` owns rows
/// `cu_seqlens[s]..cu_seqlens[s+1]` and the conv state of `slots[s]`. Each capture also writes
/// the state its sequence has after `tokens` tokens (the W inputs before) into its slot. The
/// output is in `out`: f32, or bf16 for a bf16 mixer (as fla's conv outputs a bf16 model's
/// activations; on the GPU the kernel writes bf16 from bf16 inputs, elsewhere the f32 result is
/// rounded). On a GPU, `fixed` tables (filled with this packing) replace the uploaded ones, so
/// that the pass can be captured as a CUDA graph; the CPU ignores them.
#[allow(clippy::too_many_arguments)]
pub fn conv_prefill_packed(
    x: &Tensor,
    weight: &Tensor,
    states: &mut SlotBuffer,
    cu_seqlens: &[usize],
    slots: &[usize],
    act: ConvActivation,
    captures: &[Capture],
    out: DType,
    fixed: Option<&PackedTables>,
) -> Result<Tensor> {
    const OP: &str = "conv_prefill";
    let (t, c, w) = check_conv_prefill(OP, x, weight, states, cu_seqlens, slots, captures)?;
    #[cfg(feature = "cuda")]
    if let Some(d) = states.device_slots() {
        if w > 8 {
            return Err(KernelError::Shape { op: OP, input: "weight", expected: "conv width ≤ 8".into(), actual: vec![c, w] });
        }
        let narrow = out == DType::BF16 && x.dtype() == DType::BF16;
        let silu = act == ConvActivation::Silu;
        let y = crate::cuda::conv_prefill(x, weight, d, cu_seqlens, slots, captures, silu, narrow, fixed)?;
        return Ok(y.to_dtype(out)?);
    }
    // Host buffers: the tables are the host slices themselves.
    let _ = fixed;
    let (xs, ws) = (cpu_f32(OP, x)?, cpu_f32(OP, weight)?);
    let mut y = vec![0f32; t * c];
    conv::causal_conv1d_prefill_packed(&xs, &ws, w, act, states.slots_mut(slots)?, cu_seqlens, &mut y);
    if !captures.is_empty() && w > crate::PREFILL_CHUNK {
        return Err(KernelError::Shape {
            op: OP,
            input: "weight",
            expected: format!("conv width ≤ {} with captures", crate::PREFILL_CHUNK),
            actual: vec![c, w],
        });
    }
    for cap in captures {
        // The state after `tokens` tokens: the W inputs before, oldest first, per channel.
        let end = cu_seqlens[cap.seq] + cap.tokens;
        let st = states.slot_mut(cap.slot)?;
        for ch in 0..c {
            for i in 0..w {
                st[ch * w + i] = xs[(end - w + i) * c + ch];
            }
        }
    }
    Ok(Tensor::from_vec(y, (t, c), x.device())?.to_dtype(out)?)
}

/// A packed conv prefill's inputs against each other: `x` `[T, C]`, `weight` `[C, W]`, the
/// packing, the captures and the states' `[C, W]` a slot. Returns (T, C, W).
fn check_conv_prefill(
    op: &'static str,
    x: &Tensor,
    weight: &Tensor,
    states: &SlotBuffer,
    cu_seqlens: &[usize],
    slots: &[usize],
    captures: &[Capture],
) -> Result<(usize, usize, usize)> {
    let (t, c) = dims2(op, "x", x)?;
    let (_, w) = dims2(op, "weight", weight)?;
    expect_dims(op, "weight", weight, &[c, w])?;
    check_packing(op, t, cu_seqlens, slots)?;
    check_captures(op, cu_seqlens, slots, captures, states)?;
    if states.per_slot() != c * w {
        return Err(KernelError::Shape { op, input: "state", expected: format!("[{c}, {w}]"), actual: vec![states.per_slot()] });
    }
    Ok((t, c, w))
}

/// What [`conv_prepare_packed`] prepares beside the conv: q and k's layout in its columns, v's
/// width after them, β's input and the gate's (as [`super::prepare`] takes them).
pub struct PrepareInputs<'a> {
    /// Where q and k sit in the conv's columns.
    pub layout: QkLayout,
    /// v's columns, right after k's.
    pub v_width: usize,
    /// β's input `[N, nb]`.
    pub b: &'a Tensor,
    /// β = 2·sigmoid(b) rather than sigmoid(b).
    pub allow_neg_eigval: bool,
    /// `(a, A_log, dt_bias)` of the gate, if any.
    pub gate_in: Option<(&'a Tensor, &'a Tensor, &'a Tensor)>,
}

/// [`conv_prefill_packed`] followed by [`super::prepare`] of its q and k, in one launch on a GPU:
/// returns the prepared q, k, β and gate and v `[Σ T, v_width]` in `out` (the conv output's
/// columns after k's), equal bit for bit to what the two ops give, and updates the states as
/// the conv does. `None` (nothing touched) where that launch does not take the inputs: any
/// device but a GPU, a conv width other than 4, K other than 128 or 256, v not whole heads of
/// K, f32 inputs, rows not 16-byte aligned, or `out` in bf16 from f16 inputs. The caller then
/// runs the two ops.
#[allow(clippy::too_many_arguments)]
pub fn conv_prepare_packed(
    x: &Tensor,
    weight: &Tensor,
    states: &mut SlotBuffer,
    cu_seqlens: &[usize],
    slots: &[usize],
    act: ConvActivation,
    captures: &[Capture],
    out: DType,
    fixed: Option<&PackedTables>,
    inputs: PrepareInputs<'_>,
) -> Result<Option<(Prepared, Tensor)>> {
    const OP: &str = "conv_prepare";
    let (_, c, _) = check_conv_prefill(OP, x, weight, states, cu_seqlens, slots, captures)?;
    let l = inputs.layout;
    if c != (l.q_heads + l.k_heads) * l.head_dim + inputs.v_width {
        return Err(KernelError::Shape {
            op: OP,
            input: "x",
            expected: format!("{} columns: q, k and v", (l.q_heads + l.k_heads) * l.head_dim + inputs.v_width),
            actual: x.dims().to_vec(),
        });
    }
    #[cfg(feature = "cuda")]
    if let Some(d) = states.device_slots() {
        let narrow = out == DType::BF16 && x.dtype() == DType::BF16;
        if !narrow && out != DType::F32 {
            return Ok(None);
        }
        let gate = inputs.gate_in.map(|(a, a_log, dt_bias)| crate::cuda::GateInputs { a, a_log, dt_bias });
        let fused = crate::cuda::ConvPrepInputs {
            layout: l,
            v_width: inputs.v_width,
            b: inputs.b,
            beta_mult: if inputs.allow_neg_eigval { 2.0 } else { 1.0 },
            gate,
        };
        return crate::cuda::conv_prep(x, weight, d, cu_seqlens, slots, captures, act == ConvActivation::Silu, narrow, fixed, fused);
    }
    let _ = (act, out, fixed, inputs);
    Ok(None)
}

/// A conv decode step's `rows` against its slots and `states` (`[C, W]` a slot, one distinct slot
/// a row).
pub(crate) fn check_step_states(
    op: &'static str,
    rows: usize,
    (c, w): (usize, usize),
    states: &SlotBuffer,
    step: &StepSlots<'_>,
) -> Result<()> {
    step.check(op)?;
    check_rows(op, rows, step.host)?;
    if states.per_slot() != c * w {
        return Err(KernelError::Shape { op, input: "states", expected: format!("[{c}, {w}] per slot"), actual: vec![states.per_slot()] });
    }
    states.check_distinct(step.host)
}

/// One decode step of the causal conv for `B` sequences: `x` `[B, C]`, the conv states of
/// `slots` (one per row, `[C, W]` each) shift in place. Returns `[B, C]` f32.
pub fn conv_step<'s>(
    x: &Tensor,
    weight: &Tensor,
    states: &mut SlotBuffer,
    slots: impl Into<StepSlots<'s>>,
    act: ConvActivation,
) -> Result<Tensor> {
    const OP: &str = "conv_step";
    let step = slots.into();
    let slots = step.host;
    let (b, c) = dims2(OP, "x", x)?;
    let (_, w) = dims2(OP, "weight", weight)?;
    expect_dims(OP, "weight", weight, &[c, w])?;
    check_step_states(OP, b, (c, w), states, &step)?;
    #[cfg(feature = "cuda")]
    if let Some(d) = states.device_slots() {
        return crate::cuda::conv_step(x, weight, d, step, act == ConvActivation::Silu);
    }
    let (xs, ws) = (cpu_f32(OP, x)?, cpu_f32(OP, weight)?);
    let mut y = vec![0f32; b * c];
    conv::causal_conv1d_step_batch(&xs, &ws, states.slots_mut(slots)?, c, w, act, &mut y);
    Ok(Tensor::from_vec(y, (b, c), x.device())?)
}
