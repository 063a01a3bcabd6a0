//! The batched recurrent decode step (model-spec.md §3.4): one token for each of B slots, the
//! recurrent state read and written in place.

use candle_core::Tensor;

use super::prefill::{check_state, MixerInputs};
use super::prep::{prepare, QkLayout};
use super::{check_rows, dims2, expect_dims};
use crate::cpu::gated_delta as gd;
use crate::{KernelError, Result, SlotBuffer, StepSlots};

/// A decode step's mixer inputs as the short conv and the input projection leave them (what
/// [`prepare`] takes), for [`gated_delta_step_raw`].
#[derive(Debug, Clone, Copy)]
pub struct RawStepInputs<'a> {
    /// Conv output `[B, C]`: q's heads from column 0, then the n·H k heads (step-major), as
    /// `layout` says; v's n·HV heads (step-major) from `v_offset`.
    pub conv_out: &'a Tensor,
    /// Where the q and k heads sit (`k_heads` = n·`q_heads`).
    pub layout: QkLayout,
    /// First column of v in `conv_out`.
    pub v_offset: usize,
    /// HV.
    pub v_heads: usize,
    /// Value head dim.
    pub v_dim: usize,
    /// β logits `[B, n·HV]` (step-major), e.g. a column slice of the input projection.
    pub b: &'a Tensor,
    /// β ∈ (0, 2) instead of (0, 1).
    pub allow_neg_eigval: bool,
    /// `(a [B, HV], A_log [HV], dt_bias [HV])` when the layer has a forget gate.
    pub gate_in: Option<(&'a Tensor, &'a Tensor, &'a Tensor)>,
    /// Householder steps per token (1 for Gated DeltaNet).
    pub n: usize,
    /// Read-out scale, normally `K^-0.5`.
    pub scale: f32,
}

/// How [`gated_delta_step_raw`] runs on a GPU (elsewhere it is always [`StepFusion::Apart`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepFusion {
    /// [`Fused`](Self::Fused) up to [`FUSED_STEP_MAX_BATCH`] rows or for value heads up to
    /// [`FUSED_STEP_ANY_BATCH_MAX_V`] wide, [`Apart`](Self::Apart) otherwise.
    Auto,
    /// One kernel launch that normalises q and k and forms β and the gate as it loads them.
    Fused,
    /// [`prepare`]'s kernel, then the step's.
    Apart,
}

/// Most rows [`StepFusion::Auto`] fuses. The fused step saves two launches a layer (the prep
/// kernel and v's copy) but adds a barrier and a normalisation pass to each of its CTAs. On the
/// H100 it paid at batch 1–16 and lost at 64 (1.39B model: 5.84 → 5.97 ms). On the H200, with
/// the state's loads and stores streaming, the 1.39B's batch-64 step took 3.74–3.78 ms fused
/// against 3.90–3.93 apart, and batch 16 2.02–2.04 against 2.12–2.14 (fused only up to 8
/// rows); batches past 64 were not measured (benches/results/h200-state_hints-2026-11-30/).
pub const FUSED_STEP_MAX_BATCH: usize = 64;

/// Widest value head [`StepFusion::Auto`] fuses at every batch size. The fused step's extra
/// cost is each CTA normalising its head's q and k again; a value head this narrow is one CTA
/// (Qwen3.5's 128), so nothing is repeated and the prep kernel and its copy are saved.
pub const FUSED_STEP_ANY_BATCH_MAX_V: usize = 128;

/// [`FUSED_STEP_MAX_BATCH`], or `DELTASERVE_FUSED_STEP_MAX_BATCH` where set (for comparisons).
fn fused_max_batch() -> usize {
    #[cfg(feature = "cuda")]
    return env_count!("DELTASERVE_FUSED_STEP_MAX_BATCH").unwrap_or(FUSED_STEP_MAX_BATCH);
    #[cfg(not(feature = "cuda"))]
    FUSED_STEP_MAX_BATCH
}

/// [`prepare`] then [`gated_delta_step`], optionally as one GPU kernel (`fusion`): the fused
/// kernel does the prep kernel's arithmetic as it loads q, k, β and the gate (so the two agree
/// bit for bit) and reads v, b and a in place. Returns `o` `[B, HV, V]` f32.
pub fn gated_delta_step_raw<'s>(
    x: RawStepInputs<'_>,
    states: &mut SlotBuffer,
    slots: impl Into<StepSlots<'s>>,
    fusion: StepFusion,
) -> Result<Tensor> {
    const OP: &str = "gated_delta_step_raw";
    let step = slots.into();
    let (bsz, c) = dims2(OP, "conv_out", x.conv_out)?;
    let (l, n) = (x.layout, x.n.max(1));
    if l.k_heads != n * l.q_heads || l.q_heads == 0 || !x.v_heads.is_multiple_of(l.q_heads) {
        return Err(KernelError::Shape {
            op: OP,
            input: "layout",
            expected: format!("{} k heads (n·H) and a multiple of {} value heads", n * l.q_heads, l.q_heads),
            actual: vec![l.q_heads, l.k_heads, x.v_heads],
        });
    }
    let need = ((l.q_heads + l.k_heads) * l.head_dim).max(x.v_offset + n * x.v_heads * x.v_dim);
    if c < need {
        return Err(KernelError::Shape { op: OP, input: "conv_out", expected: format!("at least {need} columns"), actual: vec![bsz, c] });
    }
    expect_dims(OP, "b", x.b, &[bsz, n * x.v_heads])?;
    if let Some((a, a_log, dt_bias)) = x.gate_in {
        expect_dims(OP, "a", a, &[bsz, x.v_heads])?;
        expect_dims(OP, "A_log", a_log, &[x.v_heads])?;
        expect_dims(OP, "dt_bias", dt_bias, &[x.v_heads])?;
    }
    let fused = match fusion {
        StepFusion::Auto => bsz <= fused_max_batch() || x.v_dim <= FUSED_STEP_ANY_BATCH_MAX_V,
        StepFusion::Fused => true,
        StepFusion::Apart => false,
    };
    #[cfg(feature = "cuda")]
    if fused && states.device_slots().is_some() {
        check_step(OP, &step, bsz, gd::Dims { t: bsz, h: l.q_heads, hv: x.v_heads, k: l.head_dim, v: x.v_dim }, states)?;
        if let Some(dev) = states.device_slots() {
            return crate::cuda::gated_delta_step_raw(&x, dev, step);
        }
    }
    let _ = fused;
    let p = prepare(x.conv_out, l, x.b, x.allow_neg_eigval, x.gate_in)?;
    let k = p.k.reshape((bsz * n, l.q_heads, l.head_dim))?;
    let beta = p.beta.reshape((bsz * n, x.v_heads))?;
    let v = x.conv_out.narrow(1, x.v_offset, n * x.v_heads * x.v_dim)?.reshape((bsz * n, x.v_heads, x.v_dim))?;
    gated_delta_step(MixerInputs { q: &p.q, k: &k, v: &v, beta: &beta, g: p.g.as_ref(), n, scale: x.scale }, states, step)
}

/// A decode step's slots against its `rows` and the pool: one distinct slot a row, and states of
/// `d`'s shape.
fn check_step(op: &'static str, step: &StepSlots<'_>, rows: usize, d: gd::Dims, states: &SlotBuffer) -> Result<()> {
    step.check(op)?;
    check_rows(op, rows, step.host)?;
    check_state(op, d, states.per_slot())?;
    states.check_distinct(step.host)
}

/// One decode step for `B` sequences (`T = B` rows, one token each), each reading and
/// writing the recurrent state of its slot in place. Returns `o` `[B, HV, V]` f32.
pub fn gated_delta_step<'s>(x: MixerInputs<'_>, states: &mut SlotBuffer, slots: impl Into<StepSlots<'s>>) -> Result<Tensor> {
    const OP: &str = "gated_delta_step";
    let step = slots.into();
    let slots = step.host;
    let (rows, d) = x.dims(OP)?;
    check_step(OP, &step, rows, d, states)?;
    #[cfg(feature = "cuda")]
    if let Some(dev) = states.device_slots() {
        return crate::cuda::gated_delta_step(&x, dev, step);
    }
    let f = x.flatten(OP)?;
    let mut o = vec![0f32; f.t * d.hv * d.v];
    gd::step_batch(d, x.n.max(1), f.inputs(), x.scale, states.slots_mut(slots)?, &mut o);
    Ok(Tensor::from_vec(o, (f.t, d.hv, d.v), x.q.device())?)
}
