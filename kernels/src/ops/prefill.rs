//! The chunkwise-parallel prefill of the gated delta rule / product (model-spec.md §3.5) over
//! packed sequences, each continuing from its slot's recurrent state.

use candle_core::{DType, Tensor};

use super::{check_captures, check_packing, cpu_f32, expect_dims};
use crate::cpu::gated_delta as gd;
use crate::{Capture, KernelError, PackedTables, Result, SlotBuffer};

/// Which algorithm runs a multi-token prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillAlgo {
    /// Chunkwise-parallel WY/UT form, chunk 64 (§3.5); near-fp32 matmuls on the GPU.
    Chunked,
    /// [`Chunked`](Self::Chunked) with q, k and v rounded to bf16 and single-bf16 matmul
    /// operands: fla's precision for bf16 models, and on the GPU about 5× faster than `Chunked`.
    /// The CPU runs `Chunked` on the rounded inputs.
    ChunkedBf16,
    /// Token-by-token recurrence (§3.4); the reference.
    Recurrent,
}

/// Inputs of the gated delta rule / product for `T` tokens and `n` householder steps.
#[derive(Debug, Clone, Copy)]
pub struct MixerInputs<'a> {
    /// `[T, H, K]`, L2-normalised.
    pub q: &'a Tensor,
    /// `[T·n, H, K]`, L2-normalised; row `t·n + j` is step `j` of token `t`.
    pub k: &'a Tensor,
    /// `[T·n, HV, V]`.
    pub v: &'a Tensor,
    /// `[T·n, HV]`.
    pub beta: &'a Tensor,
    /// `[T, HV]` log-decay, applied before a token's first step; `None` for no forget gate.
    pub g: Option<&'a Tensor>,
    /// Householder steps per token (1 for Gated DeltaNet).
    pub n: usize,
    /// Read-out scale, normally `K^-0.5`.
    pub scale: f32,
}

/// Mixer inputs read out to host memory (f32, contiguous).
pub(super) struct Flat {
    pub(super) d: gd::Dims,
    pub(super) t: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Option<Vec<f32>>,
}

impl Flat {
    /// Borrowed as the CPU kernels take them.
    pub(super) fn inputs(&self) -> gd::Inputs<'_> {
        gd::Inputs { q: &self.q, k: &self.k, v: &self.v, beta: &self.beta, g: self.g.as_deref() }
    }
}

impl MixerInputs<'_> {
    /// Validates the shapes; returns `(T, dims of the interleaved sequence)`.
    pub(super) fn dims(&self, op: &'static str) -> Result<(usize, gd::Dims)> {
        let (t, h, kd) = self.q.dims3().map_err(|_| KernelError::Shape {
            op,
            input: "q",
            expected: "[T, H, K]".into(),
            actual: self.q.dims().to_vec(),
        })?;
        let n = self.n.max(1);
        let (tn, hv, vd) = self.v.dims3().map_err(|_| KernelError::Shape {
            op,
            input: "v",
            expected: "[T·n, HV, V]".into(),
            actual: self.v.dims().to_vec(),
        })?;
        if tn != t * n {
            return Err(KernelError::Shape { op, input: "v", expected: format!("[{}, HV, V]", t * n), actual: self.v.dims().to_vec() });
        }
        if h == 0 || !hv.is_multiple_of(h) {
            return Err(KernelError::Shape { op, input: "v", expected: format!("HV a multiple of H={h}"), actual: self.v.dims().to_vec() });
        }
        expect_dims(op, "k", self.k, &[t * n, h, kd])?;
        expect_dims(op, "beta", self.beta, &[t * n, hv])?;
        if let Some(g) = self.g {
            expect_dims(op, "g", g, &[t, hv])?;
        }
        Ok((t, gd::Dims { t: t * n, h, hv, k: kd, v: vd }))
    }

    pub(super) fn flatten(&self, op: &'static str) -> Result<Flat> {
        let (t, d) = self.dims(op)?;
        let g = self.g.map(|g| cpu_f32(op, g)).transpose()?;
        Ok(Flat { d, t, q: cpu_f32(op, self.q)?, k: cpu_f32(op, self.k)?, v: cpu_f32(op, self.v)?, beta: cpu_f32(op, self.beta)?, g })
    }

    /// Rows `t0..t0+len` (tokens) of every input.
    fn rows(&self, t0: usize, len: usize) -> Result<(Tensor, Tensor, Tensor, Tensor, Option<Tensor>)> {
        let n = self.n.max(1);
        Ok((
            self.q.narrow(0, t0, len)?,
            self.k.narrow(0, t0 * n, len * n)?,
            self.v.narrow(0, t0 * n, len * n)?,
            self.beta.narrow(0, t0 * n, len * n)?,
            self.g.map(|g| g.narrow(0, t0, len)).transpose()?,
        ))
    }
}

pub(super) fn check_state(op: &'static str, d: gd::Dims, per_slot: usize) -> Result<()> {
    if per_slot != d.hv * d.k * d.v {
        return Err(KernelError::Shape { op, input: "state", expected: format!("[{}, {}, {}]", d.hv, d.k, d.v), actual: vec![per_slot] });
    }
    Ok(())
}

/// Runs the mixer over one sequence from the recurrent state `[HV, K, V]` of `slot` (updated
/// in place). Returns `o` `[T, HV, V]`: f32, or bf16 where the mixer ran in bf16
/// ([`PrefillAlgo::ChunkedBf16`], or bf16 q/k/v on a GPU), as fla returns it.
pub fn gated_delta_prefill(x: MixerInputs<'_>, states: &mut SlotBuffer, slot: usize, algo: PrefillAlgo) -> Result<Tensor> {
    let t = x.q.dim(0)?;
    gated_delta_prefill_packed(x, states, &[0, t], &[slot], algo, &[], None)
}

/// [`gated_delta_prefill`] over several sequences packed along the token axis: sequence `s`
/// owns tokens `cu_seqlens[s]..cu_seqlens[s+1]` and the state of `slots[s]`. On a GPU all
/// sequences go through the tensor-core chunked kernels at once (varlen; `Recurrent` runs as
/// `Chunked` there); the CPU runs them one after another. `captures` copy states at chunk
/// boundaries inside the pass into other slots. On a GPU, `fixed` tables (filled with this
/// packing, and for several householder steps a token the interleaved packing) replace the
/// uploaded ones, so that the pass can be captured as a CUDA graph; the CPU ignores them.
pub fn gated_delta_prefill_packed(
    x: MixerInputs<'_>,
    states: &mut SlotBuffer,
    cu_seqlens: &[usize],
    slots: &[usize],
    algo: PrefillAlgo,
    captures: &[Capture],
    fixed: Option<&PackedTables>,
) -> Result<Tensor> {
    const OP: &str = "gated_delta_prefill";
    let (t, d) = x.dims(OP)?;
    check_packing(OP, t, cu_seqlens, slots)?;
    check_state(OP, d, states.per_slot())?;
    check_captures(OP, cu_seqlens, slots, captures, states)?;
    if algo == PrefillAlgo::ChunkedBf16 {
        // bf16 q/k/v select the single-bf16 kernels on the GPU; the CPU computes on their values.
        let on_host = states.is_host();
        let round = |t: &Tensor| -> Result<Tensor> {
            let b = t.to_dtype(DType::BF16)?;
            Ok(if on_host { b.to_dtype(DType::F32)? } else { b })
        };
        let (q, k, v) = (round(x.q)?, round(x.k)?, round(x.v)?);
        let rounded = MixerInputs { q: &q, k: &k, v: &v, ..x };
        let o = gated_delta_prefill_packed(rounded, states, cu_seqlens, slots, PrefillAlgo::Chunked, captures, fixed)?;
        // The GPU's bf16 kernels write o in bf16 (fla's output dtype); the host rounds it the same.
        return Ok(o.to_dtype(DType::BF16)?);
    }
    let n = x.n.max(1);
    if n > 1 {
        // Gated DeltaProduct = the gated delta rule on the interleaved sequence (§2.3).
        let (q, g) = interleave_householder(x.q, x.g, n)?;
        let cu: Vec<usize> = cu_seqlens.iter().map(|c| c * n).collect();
        let one_step = MixerInputs { q: &q, g: g.as_ref(), n: 1, ..x };
        // A token's n steps are n rows: a capture after `tokens` tokens comes after tokens·n rows.
        let caps: Vec<Capture> = captures.iter().map(|c| Capture { tokens: c.tokens * n, ..*c }).collect();
        // Fixed tables hold the interleaved packing's too (a GPU pass captured as a graph).
        let inner = match fixed.filter(|_| !states.is_host()) {
            Some(t) if t.steps() == n => t.interleaved(),
            Some(t) => {
                return Err(KernelError::Shape {
                    op: OP,
                    input: "packed tables",
                    expected: format!("tables interleaved {n} rows a token"),
                    actual: vec![t.steps()],
                })
            }
            None => None,
        };
        return last_householder_step(&gated_delta_prefill_packed(one_step, states, &cu, slots, algo, &caps, inner.as_ref())?, n);
    }
    #[cfg(feature = "cuda")]
    if let Some(dev) = states.device_slots() {
        return crate::cuda::gated_delta_chunk_tc(&x, dev, cu_seqlens, slots, captures, fixed);
    }
    let mut outs = Vec::with_capacity(slots.len());
    for (s, &slot) in slots.iter().enumerate() {
        let (t0, len) = (cu_seqlens[s], cu_seqlens[s + 1] - cu_seqlens[s]);
        // Runs the sequence in pieces ending at its captures: pieces of whole chunks, so the
        // same chunks and the same bits as one piece.
        let mut cuts: Vec<(usize, Option<usize>)> = captures.iter().filter(|c| c.seq == s).map(|c| (c.tokens, Some(c.slot))).collect();
        cuts.sort_unstable();
        cuts.push((len, None));
        let mut from = 0;
        for (to, copy) in cuts {
            if to > from {
                let (q, k, v, beta, g) = x.rows(t0 + from, to - from)?;
                let one = MixerInputs { q: &q, k: &k, v: &v, beta: &beta, g: g.as_ref(), ..x };
                outs.push(prefill_host(one, states.slot_mut(slot)?, algo)?);
                from = to;
            }
            if let Some(dst) = copy {
                states.copy_slot(slot, dst)?;
            }
        }
    }
    if outs.is_empty() {
        return Ok(Tensor::zeros((0, d.hv, d.v), DType::F32, x.q.device())?);
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// Gated DeltaProduct's interleaved sequence (model-spec.md §2.3): `q` `[T, H, K]` and the
/// log-decay `g` `[T, HV]` become `[T·n, H, K]` and `[T·n, HV]`, where row `t·n + j` is
/// householder step `j` of token `t`; q sits on each token's last step only (the read-out comes
/// after all n writes) and the gate on its first (one decay per token). Zeros elsewhere.
pub fn interleave_householder(q: &Tensor, g: Option<&Tensor>, n: usize) -> Result<(Tensor, Option<Tensor>)> {
    let (t, h, kd) = q.dims3()?;
    if n <= 1 {
        return Ok((q.clone(), g.cloned()));
    }
    let q = Tensor::cat(&[Tensor::zeros((t, n - 1, h, kd), q.dtype(), q.device())?, q.unsqueeze(1)?], 1)?.reshape((t * n, h, kd))?;
    let g = match g {
        Some(g) => {
            let hv = g.dim(1)?;
            let first = g.to_dtype(DType::F32)?.unsqueeze(1)?;
            Some(Tensor::cat(&[first, Tensor::zeros((t, n - 1, hv), DType::F32, g.device())?], 1)?.reshape((t * n, hv))?)
        }
        None => None,
    };
    Ok((q, g))
}

/// The outputs of every token's last householder step: `o` `[T·n, HV, V]` of the interleaved
/// sequence → `[T, HV, V]`.
pub fn last_householder_step(o: &Tensor, n: usize) -> Result<Tensor> {
    if n <= 1 {
        return Ok(o.clone());
    }
    let (tn, hv, vd) = o.dims3()?;
    Ok(o.reshape((tn / n, n, hv, vd))?.narrow(1, n - 1, 1)?.squeeze(1)?.contiguous()?)
}

/// The host prefill of one sequence of one householder step a token.
fn prefill_host(x: MixerInputs<'_>, state: &mut [f32], algo: PrefillAlgo) -> Result<Tensor> {
    let f = x.flatten("gated_delta_prefill")?;
    let inputs = f.inputs();
    let mut o = vec![0f32; f.d.t * f.d.hv * f.d.v];
    match algo {
        PrefillAlgo::Chunked | PrefillAlgo::ChunkedBf16 => gd::chunk_gated_delta_rule(f.d, inputs, x.scale, state, &mut o),
        PrefillAlgo::Recurrent => gd::recurrent_gated_delta_rule(f.d, inputs, x.scale, state, &mut o),
    }
    Ok(Tensor::from_vec(o, (f.t, f.d.hv, f.d.v), x.q.device())?)
}

/// Turns the GPU's warpgroup (wgmma) state pass of the bf16 chunked prefill on (where eligible)
/// or off for the process: GPU tests compare it with the mma.sync pass. Nothing changes on the
/// CPU.
#[doc(hidden)]
pub fn set_warpgroup_state_pass(on: bool) {
    #[cfg(feature = "cuda")]
    crate::cuda::set_warpgroup_pass(on);
    let _ = on;
}

/// Turns the GPU's two-warpgroup state pass (a producer warpgroup issuing the copies beside the
/// products) on (where chosen: sequences of four chunks or more) or off for the process: the GPU
/// test compares it with the one-warpgroup pass bit for bit. Nothing changes on the CPU.
#[doc(hidden)]
pub fn set_two_warpgroup_pass(on: bool) {
    #[cfg(feature = "cuda")]
    crate::cuda::set_two_warpgroup_pass(on);
    let _ = on;
}

/// How many two-warpgroup state passes this process has launched (0 without CUDA): the GPU
/// test checks that the pass it compares ran.
#[doc(hidden)]
pub fn two_warpgroup_launches() -> usize {
    #[cfg(feature = "cuda")]
    let launches = crate::cuda::two_warpgroup_launches();
    #[cfg(not(feature = "cuda"))]
    let launches = 0;
    launches
}

/// How many split-key warpgroup state passes (128 < K ≤ 256: Sᵀ's keys split between two
/// consumer warpgroups) this process has launched (0 without CUDA): the GPU test checks that the
/// pass it compares ran.
#[doc(hidden)]
pub fn split_key_pass_launches() -> usize {
    #[cfg(feature = "cuda")]
    let launches = crate::cuda::split_key_pass_launches();
    #[cfg(not(feature = "cuda"))]
    let launches = 0;
    launches
}

/// Turns the GPU's warpgroup (wgmma) chunk prep of the bf16 chunked prefill on (where eligible:
/// K ≤ 256) or off for the process: GPU tests compare it with the wmma prep bit for bit. Nothing
/// changes on the CPU.
#[doc(hidden)]
pub fn set_warpgroup_prep(on: bool) {
    #[cfg(feature = "cuda")]
    crate::cuda::set_warpgroup_prep(on);
    let _ = on;
}

/// Turns the GPU's paired bf16 chunk prep (two value heads of a key head a CTA) on or off for
/// the process: the GPU test compares it with one head a CTA. Nothing changes on the CPU.
#[doc(hidden)]
pub fn set_paired_prep(on: bool) {
    #[cfg(feature = "cuda")]
    crate::cuda::set_prep_pairs(on);
    let _ = on;
}
