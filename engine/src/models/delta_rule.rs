//! What the delta-rule token mixers (Gated DeltaNet, Gated DeltaProduct, DeltaNet) share: one
//! fused input projection, a core that runs chunkwise over prompt rows and one recurrent step
//! over decode rows, and an output head (model-spec.md §1.3). A mixed pass runs both cores
//! between one projection and one output head, so the weights are read once for both.

use candle_core::{DType, Tensor};
use deltaserve_kernels::ops::PrefillAlgo;
use deltaserve_kernels::StepSlots;

use super::batch::{Keep, Packed, Pass};
use super::linear::{FusedInput, FusedOutput};
use super::norm::{Delta, SubInput};
use super::output_head::OutputHead;
use super::short_conv::ShortConv;
use crate::error::Result;
use crate::state::LayerState;

/// A delta-rule token mixer in its three stages.
pub(crate) trait DeltaRule {
    /// The fused input projection.
    fn input(&self) -> &FusedInput;

    /// The output head, and the input projection's part that gates it.
    fn output(&self) -> (&OutputHead, usize);

    /// Prompt rows: `y`, the input projection of packed sequences `seqs` (activations in
    /// `act`), → `o` `[ΣT, HV, Vd]` (f32, or bf16 from a bf16 mixer), advancing each sequence's state.
    fn mix_prefill(&self, y: &FusedOutput<'_>, state: &mut LayerState, seqs: &Packed<'_>, algo: PrefillAlgo, act: DType) -> Result<Tensor>;

    /// The short conv over the input projection's first columns (`[q | k | v]`).
    fn conv(&self) -> &ShortConv;

    /// Decode rows: row `b` of `y` advances `slots.host[b]` by one token → `o` `[B, HV, Vd]` f32.
    /// `conv_out` is the short conv's step when the input projection's kernel ran it.
    fn mix_decode(&self, y: &FusedOutput<'_>, conv_out: Option<Tensor>, state: &mut LayerState, slots: StepSlots<'_>) -> Result<Tensor>;
}

/// `x` `[N, D]` through `m` for `pass` → `[N, D]` (or its `keep` rows: the output head runs on
/// those alone), reading and updating the slots' states with every row.
pub(crate) fn forward(m: &impl DeltaRule, x: &SubInput<'_>, state: &mut LayerState, pass: &Pass<'_>, keep: Keep<'_>) -> Result<Delta> {
    let act = x.dtype();
    let (y, o) = match pass {
        Pass::Decode { slots, .. } => {
            // A decode step of few rows runs the short conv inside the projection's kernel.
            let (y, c) = match m.conv().fold(&mut state.conv_state, *slots) {
                Some(fold) => m.input().forward_input_conv(x, fold)?,
                None => (m.input().forward_input(x)?, None),
            };
            let o = m.mix_decode(&y, c, state, *slots)?;
            (y, o)
        }
        Pass::Prefill { seqs, algo } => {
            let y = m.input().forward_input(x)?;
            let o = m.mix_prefill(&y, state, seqs, *algo, act)?;
            (y, o)
        }
        Pass::Mixed { seqs, algo, slots } => {
            let y = m.input().forward_input(x)?;
            let p = seqs.rows();
            let prompt = m.mix_prefill(&y.rows(0, p)?, state, seqs, *algo, act)?;
            let step = m.mix_decode(&y.rows(p, slots.host.len())?, None, state, *slots)?;
            // The step's rows are f32; a bf16 mixer's prompt rows widen to them exactly.
            (y, Tensor::cat(&[prompt.to_dtype(step.dtype())?, step], 0)?)
        }
    };
    let (head, g_part) = m.output();
    // The gate `[N, HV·Vd]` as it sits in the fused projection, read in place.
    let z = if head.gated { Some(y.keep(keep)?.part(g_part)?) } else { None };
    head.forward(&keep.rows(o)?, z.as_ref(), act)
}
