//! The device-dispatching interface: candle tensors in, candle tensors out, states in slots.
//!
//! The mixer's ops (conv, prep, step, prefill) return f32 tensors: the mixer computes in fp32
//! whatever the activation dtype (model-spec.md "numerics"). The norm, SwiGLU and GEMV write the
//! dtype they are asked for or were given.
//!
//! One file per op family, mirroring `cpu/` and `cuda/`: [`conv`], [`prep`], [`norm`],
//! [`gemv`], [`step`], [`prefill`], [`attention`], [`moe`] and [`sample`] (batched sampling). The dispatchers check shapes and pick the device's
//! implementation; the CPU loops live in `cpu/`.

use candle_core::{DType, Device, Tensor};

use crate::{KernelError, Result, SlotBuffer};

pub mod attention;
pub mod conv;
pub mod gemv;
pub mod moe;
pub mod norm;
pub mod prefill;
pub mod prep;
pub mod sample;
pub mod step;

#[cfg(feature = "cuda")]
pub use attention::attention_tiles;
pub use attention::{
    attention_tile_capacity, attention_warpgroup_launches, paged_attention, set_attention_head_pairs, set_attention_warpgroup,
    set_fused_decode_attention, AttentionShape, AttnOutput, DevicePages, Paged, PagedSeq, QkNorms, RopeArgs, TileKey, ATTENTION_TILE_ROWS,
};
pub use conv::{conv_prefill, conv_prefill_packed, conv_prepare_packed, conv_step, PrepareInputs};
pub use gemv::{
    batch_invariant, embedding_f32, linear, linear_f32, linear_f32_into, linear_parts, set_batch_invariant, sigmoid_gate,
    skinny_conv_linear, skinny_linear, skinny_swiglu, small_batch_add_norm_conv_linear, small_batch_add_norm_linear,
    small_batch_add_norm_linear_f32_into, small_batch_add_norm_swiglu, small_batch_gated_norm_linear, small_batch_linear,
    small_batch_swiglu_linear, swiglu, to_f32, to_f32_into, ConvStepFold, ADD_NORM_LINEAR_MAX_ROWS, GATED_NORM_LINEAR_MAX_HEAD_ROWS,
    SKINNY_LINEAR_MAX_ROWS, SMALL_BATCH_LINEAR_MAX_ROWS, SWIGLU_LINEAR_MAX_ROWS,
};
pub use moe::{moe_warpgroup_launches, set_moe_warpgroup, sparse_moe, top_k, ExpertWeights, Route, SharedExpert};
pub use norm::{add_rms_norm, add_rms_norm_parts, gated_rms_norm, sum_parts};
pub use prefill::{
    gated_delta_prefill, gated_delta_prefill_packed, interleave_householder, last_householder_step, set_paired_prep,
    set_two_warpgroup_pass, set_warpgroup_prep, set_warpgroup_state_pass, split_key_pass_launches, two_warpgroup_launches, MixerInputs,
    PrefillAlgo,
};
pub use prep::{beta, gate, l2norm, prepare, Prepared, QkLayout};
pub use step::{gated_delta_step, gated_delta_step_raw, RawStepInputs, StepFusion, FUSED_STEP_MAX_BATCH};

/// Reads a tensor as contiguous f32 values on the CPU, refusing other devices.
pub(crate) fn cpu_f32(op: &'static str, t: &Tensor) -> Result<Vec<f32>> {
    match t.device() {
        Device::Cpu => Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
        d => Err(KernelError::UnsupportedDevice { op, device: format!("{d:?}") }),
    }
}

pub(crate) fn expect_dims(op: &'static str, input: &'static str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.dims() != want {
        return Err(KernelError::Shape { op, input, expected: format!("{want:?}"), actual: t.dims().to_vec() });
    }
    Ok(())
}

pub(crate) fn dims2(op: &'static str, input: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    t.dims2().map_err(|_| KernelError::Shape { op, input, expected: "a rank-2 tensor".into(), actual: t.dims().to_vec() })
}

/// Checks a packing: `cu_seqlens` starts at 0, is non-decreasing, ends at `rows`, and has one
/// more entry than `slots`.
pub(crate) fn check_packing(op: &'static str, rows: usize, cu_seqlens: &[usize], slots: &[usize]) -> Result<()> {
    let ok = cu_seqlens.len() == slots.len() + 1
        && cu_seqlens.first() == Some(&0)
        && cu_seqlens.last() == Some(&rows)
        && cu_seqlens.windows(2).all(|w| w[0] <= w[1]);
    if !ok {
        return Err(KernelError::Shape {
            op,
            input: "cu_seqlens",
            expected: format!("{} offsets from 0 to {rows}, non-decreasing", slots.len() + 1),
            actual: cu_seqlens.to_vec(),
        });
    }
    Ok(())
}

/// Checks captures against a packing: each on a chunk boundary inside its sequence, into a
/// distinct slot of the buffer that no sequence of the pass owns.
pub(crate) fn check_captures(
    op: &'static str,
    cu_seqlens: &[usize],
    slots: &[usize],
    captures: &[crate::Capture],
    buffer: &SlotBuffer,
) -> Result<()> {
    let mut all: Vec<usize> = slots.to_vec();
    for c in captures {
        let len = cu_seqlens.get(c.seq + 1).zip(cu_seqlens.get(c.seq)).map(|(b, a)| b - a);
        let ok = matches!(len, Some(len) if c.tokens > 0 && c.tokens <= len && c.tokens.is_multiple_of(crate::PREFILL_CHUNK));
        if !ok {
            return Err(KernelError::Shape {
                op,
                input: "captures",
                expected: format!("a positive multiple of {} tokens within sequence {}'s {len:?}", crate::PREFILL_CHUNK, c.seq),
                actual: vec![c.tokens],
            });
        }
        all.push(c.slot);
    }
    buffer.check_distinct(&all)
}

pub(crate) fn check_rows(op: &'static str, rows: usize, slots: &[usize]) -> Result<()> {
    if rows != slots.len() {
        return Err(KernelError::Shape { op, input: "slots", expected: format!("{rows} slot indices"), actual: vec![slots.len()] });
    }
    Ok(())
}
