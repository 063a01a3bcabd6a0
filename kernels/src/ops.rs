//! The device-dispatching interface: candle tensors in, candle tensors out, states in slots.
//!
//! Every op returns f32 tensors: the mixer computes in fp32 whatever the activation dtype
//! (model-spec.md "numerics"); callers cast back.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use crate::cpu::{conv, gated_delta as gd, norm, prep};
use crate::{ConvActivation, GateActivation, KernelError, Result, SlotBuffer, StepSlots};

/// Reads a tensor as contiguous f32 values on the CPU, refusing other devices.
fn cpu_f32(op: &'static str, t: &Tensor) -> Result<Vec<f32>> {
    match t.device() {
        Device::Cpu => Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
        d => Err(KernelError::UnsupportedDevice { op, device: format!("{d:?}") }),
    }
}

fn expect_dims(op: &'static str, input: &'static str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.dims() != want {
        return Err(KernelError::Shape { op, input, expected: format!("{want:?}"), actual: t.dims().to_vec() });
    }
    Ok(())
}

fn dims2(op: &'static str, input: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    t.dims2().map_err(|_| KernelError::Shape { op, input, expected: "a rank-2 tensor".into(), actual: t.dims().to_vec() })
}

/// Causal depthwise conv over a prompt chunk `x` `[T, C]` with `weight` `[C, W]`, continuing
/// from and updating the conv state `[C, W]` of `slot`. Returns `[T, C]` f32.
pub fn conv_prefill(x: &Tensor, weight: &Tensor, states: &mut SlotBuffer, slot: usize, act: ConvActivation) -> Result<Tensor> {
    let t = dims2("conv_prefill", "x", x)?.0;
    conv_prefill_packed(x, weight, states, &[0, t], &[slot], act)
}

/// [`conv_prefill`] over several sequences packed in `x` `[Σ T, C]`: sequence `s` owns rows
/// `cu_seqlens[s]..cu_seqlens[s+1]` and the conv state of `slots[s]`.
pub fn conv_prefill_packed(
    x: &Tensor,
    weight: &Tensor,
    states: &mut SlotBuffer,
    cu_seqlens: &[usize],
    slots: &[usize],
    act: ConvActivation,
) -> Result<Tensor> {
    const OP: &str = "conv_prefill";
    let (t, c) = dims2(OP, "x", x)?;
    let (_, w) = dims2(OP, "weight", weight)?;
    expect_dims(OP, "weight", weight, &[c, w])?;
    check_packing(OP, t, cu_seqlens, slots)?;
    states.check_distinct(slots)?;
    if states.per_slot() != c * w {
        return Err(KernelError::Shape { op: OP, input: "state", expected: format!("[{c}, {w}]"), actual: vec![states.per_slot()] });
    }
    #[cfg(feature = "cuda")]
    if let Some(d) = states.device_slots() {
        if w > 8 {
            return Err(KernelError::Shape { op: OP, input: "weight", expected: "conv width ≤ 8".into(), actual: vec![c, w] });
        }
        return crate::cuda::conv_prefill(x, weight, d, cu_seqlens, slots, act == ConvActivation::Silu);
    }
    let (xs, ws) = (cpu_f32(OP, x)?, cpu_f32(OP, weight)?);
    let mut y = vec![0f32; t * c];
    for (s, &slot) in slots.iter().enumerate() {
        let (a, b) = (cu_seqlens[s] * c, cu_seqlens[s + 1] * c);
        conv::causal_conv1d_prefill(&xs[a..b], &ws, states.slot_mut(slot)?, c, w, act, &mut y[a..b]);
    }
    Ok(Tensor::from_vec(y, (t, c), x.device())?)
}

/// Checks a packing: `cu_seqlens` starts at 0, is non-decreasing, ends at `rows`, and has one
/// more entry than `slots`.
fn check_packing(op: &'static str, rows: usize, cu_seqlens: &[usize], slots: &[usize]) -> Result<()> {
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
    step.check(OP)?;
    let slots = step.host;
    let (b, c) = dims2(OP, "x", x)?;
    let (_, w) = dims2(OP, "weight", weight)?;
    expect_dims(OP, "weight", weight, &[c, w])?;
    check_rows(OP, b, slots)?;
    if states.per_slot() != c * w {
        return Err(KernelError::Shape {
            op: OP,
            input: "states",
            expected: format!("[{c}, {w}] per slot"),
            actual: vec![states.per_slot()],
        });
    }
    states.check_distinct(slots)?;
    #[cfg(feature = "cuda")]
    if let Some(d) = states.device_slots() {
        return crate::cuda::conv_step(x, weight, d, step, act == ConvActivation::Silu);
    }
    let (xs, ws) = (cpu_f32(OP, x)?, cpu_f32(OP, weight)?);
    let mut y = vec![0f32; b * c];
    let views = states.slots_mut(slots)?;
    y.par_chunks_mut(c).zip(views).enumerate().for_each(|(i, (yr, s))| {
        conv::causal_conv1d_step(&xs[i * c..(i + 1) * c], &ws, s, w, act, yr);
    });
    Ok(Tensor::from_vec(y, (b, c), x.device())?)
}

fn check_rows(op: &'static str, rows: usize, slots: &[usize]) -> Result<()> {
    if rows != slots.len() {
        return Err(KernelError::Shape { op, input: "slots", expected: format!("{rows} slot indices"), actual: vec![slots.len()] });
    }
    Ok(())
}

/// L2-normalises the last dim of `x` in fp32 (`x / sqrt(Σx² + 1e-6)`). Returns f32.
pub fn l2norm(x: &Tensor) -> Result<Tensor> {
    let dim = x.dims().last().copied().unwrap_or(1);
    let mut v = cpu_f32("l2norm", x)?;
    prep::l2norm_rows(&mut v, dim);
    Ok(Tensor::from_vec(v, x.shape(), x.device())?)
}

/// β = sigmoid(b) (×2 with `allow_neg_eigval`), in fp32. Returns f32 of `b`'s shape.
pub fn beta(b: &Tensor, allow_neg_eigval: bool) -> Result<Tensor> {
    let mut v = cpu_f32("beta", b)?;
    prep::beta_in_place(&mut v, allow_neg_eigval);
    Ok(Tensor::from_vec(v, b.shape(), b.device())?)
}

/// Log-decay `g = −exp(A_log)·softplus(a + dt_bias)` in fp32 for `a` `[T, HV]`.
pub fn gate(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    const OP: &str = "gate";
    let (_, hv) = dims2(OP, "a", a)?;
    expect_dims(OP, "A_log", a_log, &[hv])?;
    expect_dims(OP, "dt_bias", dt_bias, &[hv])?;
    let mut v = cpu_f32(OP, a)?;
    prep::gate_in_place(&mut v, &cpu_f32(OP, a_log)?, &cpu_f32(OP, dt_bias)?);
    Ok(Tensor::from_vec(v, a.shape(), a.device())?)
}

/// Where q and k heads sit in the conv output, for [`prepare`].
#[derive(Debug, Clone, Copy)]
pub struct QkLayout {
    /// q heads, from column 0.
    pub q_heads: usize,
    /// k heads (n·H for Gated DeltaProduct), from column `q_heads·head_dim`.
    pub k_heads: usize,
    /// Key head dim.
    pub head_dim: usize,
}

/// The mixer's per-token inputs after the conv (model-spec.md §1.3 steps 4, 6, 7), f32.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// `[N, q_heads, K]` L2-normalised.
    pub q: Tensor,
    /// `[N, k_heads, K]` L2-normalised.
    pub k: Tensor,
    /// β `[N, b's width]`.
    pub beta: Tensor,
    /// Log-decay `[N, HV]`.
    pub g: Option<Tensor>,
}

/// L2-normalises the q and k heads of `conv_out` `[N, C]`, computes β from `b` (×2 with
/// `allow_neg_eigval`) and the fp32 gate from `(a, A_log, dt_bias)`. One fused kernel on a GPU.
pub fn prepare(
    conv_out: &Tensor,
    l: QkLayout,
    b: &Tensor,
    allow_neg_eigval: bool,
    gate_in: Option<(&Tensor, &Tensor, &Tensor)>,
) -> Result<Prepared> {
    const OP: &str = "prepare";
    let (n, c) = dims2(OP, "conv_out", conv_out)?;
    let (q_w, k_w) = (l.q_heads * l.head_dim, l.k_heads * l.head_dim);
    if c < q_w + k_w {
        return Err(KernelError::Shape {
            op: OP,
            input: "conv_out",
            expected: format!("at least {} columns", q_w + k_w),
            actual: vec![n, c],
        });
    }
    #[cfg(feature = "cuda")]
    if conv_out.device().is_cuda() {
        let gi = gate_in.map(|(a, a_log, dt_bias)| crate::cuda::GateInputs { a, a_log, dt_bias });
        let mult = if allow_neg_eigval { 2.0 } else { 1.0 };
        let p = crate::cuda::prep(conv_out, l, b, mult, gi)?;
        return Ok(Prepared { q: p.q, k: p.k, beta: p.beta, g: p.g });
    }
    let q = l2norm(&conv_out.narrow(1, 0, q_w)?.reshape((n, l.q_heads, l.head_dim))?)?;
    let k = l2norm(&conv_out.narrow(1, q_w, k_w)?.reshape((n, l.k_heads, l.head_dim))?)?;
    let g = gate_in.map(|(a, a_log, dt_bias)| gate(a, a_log, dt_bias)).transpose()?;
    Ok(Prepared { q, k, beta: beta(b, allow_neg_eigval)?, g })
}

/// Output RMSNorm over the last dim `D` of `x` (f32), gated by `z` when given (§1.3 step 9),
/// in fp32 and rounded once to `dtype`. `z` is `x`'s shape, or `[N, H·D]` holding `N·H` rows of
/// `x` (`g_proj`'s columns of the fused input projection: the GPU reads them in place).
pub fn gated_rms_norm(x: &Tensor, z: Option<&Tensor>, weight: &Tensor, eps: f32, act: GateActivation, dtype: DType) -> Result<Tensor> {
    const OP: &str = "gated_rms_norm";
    let dim = weight.dims1().map_err(|_| KernelError::Shape {
        op: OP,
        input: "weight",
        expected: "rank 1".into(),
        actual: weight.dims().to_vec(),
    })?;
    if x.dims().last() != Some(&dim) {
        return Err(KernelError::Shape { op: OP, input: "x", expected: format!("last dim {dim}"), actual: x.dims().to_vec() });
    }
    if let Some(z) = z {
        let rows_of_x = z.rank() == 2 && z.elem_count() == x.elem_count() && dim > 0 && z.dim(1)?.is_multiple_of(dim);
        if z.dims() != x.dims() && !rows_of_x {
            return Err(KernelError::Shape {
                op: OP,
                input: "z",
                expected: format!("{:?}, or [N, H·{dim}] with as many elements", x.dims()),
                actual: z.dims().to_vec(),
            });
        }
    }
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return crate::cuda::gated_rms_norm(x, z, weight, eps, act == GateActivation::Sigmoid, dtype)?.to_dtype(dtype).map_err(Into::into);
    }
    let mut v = cpu_f32(OP, x)?;
    let zs = z.map(|z| cpu_f32(OP, z)).transpose()?;
    norm::gated_rms_norm(&mut v, zs.as_deref(), &cpu_f32(OP, weight)?, eps, act);
    Ok(Tensor::from_vec(v, x.shape(), x.device())?.to_dtype(dtype)?)
}

/// SwiGLU `silu(gate) · up` for `gate`, `up` `[N, I]`, in their dtype. On the GPU one kernel
/// reads column slices of a fused projection in place and rounds once from fp32 (fla's fused
/// `swiglu`); the CPU runs candle's `silu` and multiply.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    const OP: &str = "swiglu";
    let (n, i) = dims2(OP, "gate", gate)?;
    expect_dims(OP, "up", up, &[n, i])?;
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() {
        return crate::cuda::swiglu(gate, up);
    }
    Ok((gate.silu()? * up.to_dtype(gate.dtype())?)?)
}

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
    /// [`Fused`](Self::Fused) up to [`FUSED_STEP_MAX_BATCH`] rows, [`Apart`](Self::Apart)
    /// beyond.
    Auto,
    /// One kernel launch that normalises q and k and forms β and the gate as it loads them.
    Fused,
    /// [`prepare`]'s kernel, then the step's.
    Apart,
}

/// Most rows [`StepFusion::Auto`] fuses. The fused step saves a launch a layer but adds a
/// barrier and a normalisation pass to each of its CTAs, so it pays while the step is a few
/// waves of CTAs (H100, 1.39B model, graph steps: batch 1 1.84 → 1.81 ms, batch 16 3.27 → 3.23
/// ms) and not at batch 64 (5.84 → 5.97 ms); sizes in between were not measured.
pub const FUSED_STEP_MAX_BATCH: usize = 16;

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
        StepFusion::Auto => bsz <= FUSED_STEP_MAX_BATCH,
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

/// `x Wᵀ` for `x` `[B, K]` and `w` `[N, K]` when B is small: on the GPU, for B ≤ 8 and bf16
/// or f16 inputs, one kernel that streams `w` once (a decode step's projections, where cuBLAS's
/// GEMV kernels stream the weights at 35–80% of copy bandwidth). `None` where that kernel does
/// not apply (the CPU, larger B, other dtypes or layouts), or when `DELTASERVE_SMALL_BATCH_GEMV=0`
/// turns it off (for comparisons): the caller runs its GEMM.
pub fn small_batch_linear(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && w.device().is_cuda() {
        if small_batch_gemv_off() {
            return Ok(None);
        }
        return crate::cuda::gemv(x, w);
    }
    let _ = (x, w);
    Ok(None)
}

/// `silu(gate) · up` times `w`ᵀ (the MLP's down projection) for `gate`, `up` `[B, I]` with
/// B ≤ [`SWIGLU_LINEAR_MAX_ROWS`]: on the GPU, under the conditions of [`small_batch_linear`]
/// (and gate and up sharing a row stride, as the halves of one projection do), one kernel that
/// forms each row of the product as it streams `w`, rounded as [`swiglu`] would store it, so the
/// result equals `small_batch_linear(&swiglu(gate, up)?, w)`. `None` where it does not apply:
/// the caller runs the two steps.
pub fn small_batch_swiglu_linear(gate: &Tensor, up: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() && w.device().is_cuda() {
        if small_batch_gemv_off() || gate.dim(0)? > SWIGLU_LINEAR_MAX_ROWS {
            return Ok(None);
        }
        return crate::cuda::gemv_swiglu(gate, up, w);
    }
    let _ = (gate, up, w);
    Ok(None)
}

/// Most rows [`small_batch_swiglu_linear`] fuses. Every warp recomputes the SwiGLU of the x
/// elements it reads; with more rows that costs more than the launch it saves (H100, I=5632 →
/// 2048: fused 16.5 / 17.7 µs against 19.3 / 19.6 µs apart at B = 1 / 2, 35.6 against 20.1 µs
/// at B = 4).
pub const SWIGLU_LINEAR_MAX_ROWS: usize = 2;

/// `DELTASERVE_SMALL_BATCH_GEMV=0`: the small-batch kernels stand aside (for comparisons).
#[cfg(feature = "cuda")]
fn small_batch_gemv_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_SMALL_BATCH_GEMV").is_ok_and(|v| v == "0"))
}

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

struct Flat {
    d: gd::Dims,
    t: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Option<Vec<f32>>,
}

impl MixerInputs<'_> {
    /// Validates the shapes; returns `(T, dims of the interleaved sequence)`.
    fn dims(&self, op: &'static str) -> Result<(usize, gd::Dims)> {
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

    fn flatten(&self, op: &'static str) -> Result<Flat> {
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

/// A decode step's slots against its `rows` and the pool: one distinct slot a row, and states of
/// `d`'s shape.
fn check_step(op: &'static str, step: &StepSlots<'_>, rows: usize, d: gd::Dims, states: &SlotBuffer) -> Result<()> {
    step.check(op)?;
    check_rows(op, rows, step.host)?;
    check_state(op, d, states.per_slot())?;
    states.check_distinct(step.host)
}

fn check_state(op: &'static str, d: gd::Dims, per_slot: usize) -> Result<()> {
    if per_slot != d.hv * d.k * d.v {
        return Err(KernelError::Shape { op, input: "state", expected: format!("[{}, {}, {}]", d.hv, d.k, d.v), actual: vec![per_slot] });
    }
    Ok(())
}

/// Runs the mixer over one sequence from the recurrent state `[HV, K, V]` of `slot` (updated
/// in place). Returns `o` `[T, HV, V]` f32.
pub fn gated_delta_prefill(x: MixerInputs<'_>, states: &mut SlotBuffer, slot: usize, algo: PrefillAlgo) -> Result<Tensor> {
    let t = x.q.dim(0)?;
    gated_delta_prefill_packed(x, states, &[0, t], &[slot], algo)
}

/// [`gated_delta_prefill`] over several sequences packed along the token axis: sequence `s`
/// owns tokens `cu_seqlens[s]..cu_seqlens[s+1]` and the state of `slots[s]`. On a GPU all
/// sequences go through the tensor-core chunked kernels at once (varlen; `Recurrent` runs as
/// `Chunked` there); the CPU runs them one after another.
pub fn gated_delta_prefill_packed(
    x: MixerInputs<'_>,
    states: &mut SlotBuffer,
    cu_seqlens: &[usize],
    slots: &[usize],
    algo: PrefillAlgo,
) -> Result<Tensor> {
    const OP: &str = "gated_delta_prefill";
    let (t, d) = x.dims(OP)?;
    check_packing(OP, t, cu_seqlens, slots)?;
    check_state(OP, d, states.per_slot())?;
    states.check_distinct(slots)?;
    if algo == PrefillAlgo::ChunkedBf16 {
        // bf16 q/k/v select the single-bf16 kernels on the GPU; the CPU computes on their values.
        let on_host = states.is_host();
        let round = |t: &Tensor| -> Result<Tensor> {
            let b = t.to_dtype(DType::BF16)?;
            Ok(if on_host { b.to_dtype(DType::F32)? } else { b })
        };
        let (q, k, v) = (round(x.q)?, round(x.k)?, round(x.v)?);
        let rounded = MixerInputs { q: &q, k: &k, v: &v, ..x };
        return gated_delta_prefill_packed(rounded, states, cu_seqlens, slots, PrefillAlgo::Chunked);
    }
    #[cfg(feature = "cuda")]
    if !states.is_host() {
        return cuda_prefill(x, states, cu_seqlens, slots);
    }
    let mut outs = Vec::with_capacity(slots.len());
    for (s, &slot) in slots.iter().enumerate() {
        let (t0, len) = (cu_seqlens[s], cu_seqlens[s + 1] - cu_seqlens[s]);
        if len == 0 {
            continue;
        }
        let (q, k, v, beta, g) = x.rows(t0, len)?;
        let one = MixerInputs { q: &q, k: &k, v: &v, beta: &beta, g: g.as_ref(), ..x };
        outs.push(prefill_host(one, states.slot_mut(slot)?, algo)?);
    }
    if outs.is_empty() {
        return Ok(Tensor::zeros((0, d.hv, d.v), DType::F32, x.q.device())?);
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// The GPU prefill: Gated DeltaProduct's interleaved sequence is built on the device (q on each
/// token's last step, the gate on its first) and the chunk kernel runs every sequence at once.
#[cfg(feature = "cuda")]
fn cuda_prefill(x: MixerInputs<'_>, states: &mut SlotBuffer, cu_seqlens: &[usize], slots: &[usize]) -> Result<Tensor> {
    let n = x.n.max(1);
    let (t, h, kd) = x.q.dims3()?;
    let hv = x.v.dim(1)?;
    let (q, g) = if n > 1 {
        let q = x.q.unsqueeze(1)?;
        let q = Tensor::cat(&[Tensor::zeros((t, n - 1, h, kd), x.q.dtype(), x.q.device())?, q], 1)?.reshape((t * n, h, kd))?;
        let g = match x.g {
            Some(g) => {
                let g = g.to_dtype(DType::F32)?.unsqueeze(1)?;
                Some(Tensor::cat(&[g, Tensor::zeros((t, n - 1, hv), DType::F32, x.q.device())?], 1)?.reshape((t * n, hv))?)
            }
            None => None,
        };
        (q, g)
    } else {
        (x.q.clone(), x.g.cloned())
    };
    let cu: Vec<usize> = cu_seqlens.iter().map(|c| c * n).collect();
    let args = MixerInputs { q: &q, g: g.as_ref(), ..x };
    let dev = states.device_slots().ok_or(KernelError::UnsupportedDevice { op: "gated_delta_prefill", device: "host states".into() })?;
    let o = crate::cuda::gated_delta_chunk_tc(&args, dev, &cu, slots)?;
    if n == 1 {
        return Ok(o);
    }
    let vd = o.dim(2)?;
    Ok(o.reshape((t, n, hv, vd))?.narrow(1, n - 1, 1)?.squeeze(1)?.contiguous()?)
}

/// The host prefill of one sequence.
fn prefill_host(x: MixerInputs<'_>, state: &mut [f32], algo: PrefillAlgo) -> Result<Tensor> {
    let f = x.flatten("gated_delta_prefill")?;
    let n = x.n.max(1);
    // Gated DeltaProduct = the GDN recurrence on the interleaved sequence (§2.3).
    let (q, g) = if n > 1 { gd::interleave_product(f.t, n, f.d.h, f.d.hv, f.d.k, &f.q, f.g.as_deref()) } else { (f.q, f.g) };
    let inputs = gd::Inputs { q: &q, k: &f.k, v: &f.v, beta: &f.beta, g: g.as_deref() };
    let mut o = vec![0f32; f.d.t * f.d.hv * f.d.v];
    match algo {
        PrefillAlgo::Chunked | PrefillAlgo::ChunkedBf16 => gd::chunk_gated_delta_rule(f.d, inputs, x.scale, state, &mut o),
        PrefillAlgo::Recurrent => gd::recurrent_gated_delta_rule(f.d, inputs, x.scale, state, &mut o),
    }
    let o = if n > 1 { gd::take_last_steps(f.t, n, f.d.hv * f.d.v, &o) } else { o };
    Ok(Tensor::from_vec(o, (f.t, f.d.hv, f.d.v), x.q.device())?)
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
    let n = x.n.max(1);
    let (kd, vd, grp) = (d.k, d.v, d.hv / d.h);
    let mut o = vec![0f32; f.t * d.hv * vd];
    let views = states.slots_mut(slots)?;
    o.par_chunks_mut(d.hv * vd).zip(views).enumerate().for_each(|(b, (ob, s))| {
        for (j, (sh, oj)) in s.chunks_mut(kd * vd).zip(ob.chunks_mut(vd)).enumerate() {
            let hk = j / grp;
            for step in 0..n {
                let row = b * n + step;
                let kk = (row * d.h + hk) * kd;
                let vv = (row * d.hv + j) * vd;
                let g = if step == 0 { f.g.as_ref().map_or(0.0, |g| g[b * d.hv + j]) } else { 0.0 };
                let last = step + 1 == n;
                let qq = (b * d.h + hk) * kd;
                let step = gd::HeadStep { k: &f.k[kk..kk + kd], v: &f.v[vv..vv + vd], beta: f.beta[row * d.hv + j], g };
                let read = last.then(|| gd::ReadOut { q: &f.q[qq..qq + kd], scale: x.scale, o: &mut *oj });
                gd::recurrent_head_step(sh, step, read);
            }
        }
    });
    Ok(Tensor::from_vec(o, (f.t, d.hv, vd), x.q.device())?)
}
