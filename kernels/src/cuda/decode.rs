//! Launcher of the decode step of the gated delta rule over B slots, and the slot lists that
//! the decode kernels (this one and the conv step) take.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, DType, Tensor};

use super::{
    check_head_dim, cuda_dev, f32c, first_element_address_any, func, grid, index_address, indices, modules, push_gate, sm_count, wrap,
    DeviceSlots, GatePtr, RowsArg,
};
use crate::ops::{MixerInputs, RawStepInputs};
use crate::{Result, StepSlots};

/// Slot indices a decode kernel takes by value (`SlotList` in common.cuh); longer batches pass
/// the rest through device memory.
const INLINE_SLOTS: usize = 64;

#[repr(C)]
#[derive(Clone, Copy)]
struct SlotList {
    s: [i32; INLINE_SLOTS],
}

// SAFETY: plain `#[repr(C)]` integers, laid out as the kernels' `struct SlotList`.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for SlotList {}

/// A decode step's slots: the first [`INLINE_SLOTS`] by value when the batch is small (no
/// host-to-device copy), else all of them through device memory: uploaded here, or the
/// caller's device copy (a CUDA graph's, which the next replay rewrites).
pub(super) struct DecodeSlots {
    inline: SlotList,
    uploaded: Option<CudaSlice<i32>>,
    /// The device list's address, 0 when the slots are inline.
    ptr: u64,
}

impl DecodeSlots {
    pub(super) fn new(dev: &CudaDevice, slots: StepSlots<'_>) -> Result<Self> {
        let mut inline = SlotList { s: [0; INLINE_SLOTS] };
        if let Some(t) = slots.device {
            return Ok(Self { inline, uploaded: None, ptr: index_address(t)? });
        }
        for (d, &s) in inline.s.iter_mut().zip(slots.host) {
            *d = s as i32;
        }
        let uploaded = if slots.host.len() > INLINE_SLOTS { Some(indices(dev, slots.host)?) } else { None };
        Ok(Self { inline, uploaded, ptr: 0 })
    }

    /// Pushes the two kernel arguments (`SlotList slots, const int* more_slots`).
    pub(super) fn push<'a>(&'a self, l: &mut candle_core::cuda_backend::cudarc::driver::LaunchArgs<'a>) {
        l.arg(&self.inline);
        match &self.uploaded {
            Some(m) => l.arg(m),
            None => l.arg(&self.ptr),
        };
    }
}

/// A decode kernel's shape (`gdr_decode_f32_w{warps}_r{rows}_c{cols}_b{min_blocks}` in
/// gated_delta.cu): `warps` warps of `rows` state rows each (warps · rows ≥ K), `cols` value
/// columns a lane, and at least `min_blocks` blocks an SM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DecodeShape {
    warps: usize,
    rows: usize,
    cols: usize,
    min_blocks: usize,
}

impl DecodeShape {
    /// The shapes compiled for every K range (vec and scalar, with 4, 2 or 1 columns a lane);
    /// few rows a warp keeps registers low, so more warps are in flight on an SM.
    const BY_K: [(usize, DecodeShape); 4] = [
        (32, DecodeShape { warps: 8, rows: 4, cols: 4, min_blocks: 4 }),
        (64, DecodeShape { warps: 8, rows: 8, cols: 4, min_blocks: 4 }),
        (128, DecodeShape { warps: 16, rows: 8, cols: 4, min_blocks: 2 }),
        (256, DecodeShape { warps: 32, rows: 8, cols: 4, min_blocks: 1 }),
    ];

    /// K > 128 when two columns a lane still give every SM two blocks: 16 warps of 16 rows,
    /// half a block of [`Self::BY_K`]'s one an SM, so two share an SM and one's loads overlap
    /// the other's reductions and stores (H200, 1.39B model: batch-16 and batch-64 steps −5%
    /// and −6%; `benches/results/h200-decode_shapes-2026-11-28/`).
    const WIDE_K_MANY: DecodeShape = DecodeShape { warps: 16, rows: 16, cols: 2, min_blocks: 2 };

    /// The shape for key head dim `k` (≤ 256, checked by the caller) and `heads` (rows ×
    /// value heads) of width `v` on `sms` SMs. In the batch-invariant mode K > 128 always takes
    /// [`Self::WIDE_K_MANY`]: [`Self::BY_K`]'s shape adds a column's rows in other groups, so a
    /// sequence's bits would depend on how many others share its step.
    fn pick(k: usize, heads: usize, v: usize, sms: usize) -> Self {
        let ctas = |cols: usize| heads * v.div_ceil(32 * cols);
        if k > 128 && (ctas(2) >= 2 * sms || crate::ops::batch_invariant()) {
            return Self::WIDE_K_MANY;
        }
        Self::for_key_dim(k).with_cols_for(ctas(4), sms)
    }

    /// The shape for key head dim `k` (≤ 256, checked by the caller), four columns a lane.
    fn for_key_dim(k: usize) -> Self {
        Self::BY_K.iter().find(|(max_k, _)| k <= *max_k).map_or(Self::BY_K[3].1, |(_, s)| *s)
    }

    /// The shape `DELTASERVE_DECODE_KERNEL` names, if any (for benchmarks, e.g. `w8_r16_c4_b2`:
    /// a shape of the `DECODE_ENTR*` lists in gated_delta.cu; the alternatives for K ≤ 128 exist
    /// only as one-step `vec` entries, and a shape without the entry a step needs fails to load).
    /// It replaces the choice by K and batch wherever it covers K.
    fn wanted() -> Option<Self> {
        static WANTED: std::sync::OnceLock<Option<DecodeShape>> = std::sync::OnceLock::new();
        *WANTED.get_or_init(|| std::env::var("DELTASERVE_DECODE_KERNEL").ok().and_then(|s| Self::parse(&s)))
    }

    /// Parses `w{warps}_r{rows}_c{cols}_b{min_blocks}`.
    fn parse(s: &str) -> Option<Self> {
        let mut it = s.split('_');
        let mut field = |p: char| it.next()?.strip_prefix(p)?.parse::<usize>().ok();
        Some(Self { warps: field('w')?, rows: field('r')?, cols: field('c')?, min_blocks: field('b')? })
    }

    /// Columns a lane for a step of `ctas_at_4` CTAs with four columns a lane: four (the
    /// widest accesses, fewest CTAs) while that fills every SM, else two or one, so that small
    /// batches spread their state over more SMs.
    fn with_cols_for(self, ctas_at_4: usize, sms: usize) -> Self {
        let cols = if ctas_at_4 >= sms {
            4
        } else if 2 * ctas_at_4 >= sms {
            2
        } else {
            1
        };
        Self { cols, ..self }
    }

    /// The shape for states of `bf16` bits: [`Self::WIDE_K_MANY`] takes four columns a lane
    /// instead of two (V a multiple of four). A bf16 tile holds its cells' bits, two a register,
    /// so the same registers carry the same bytes in flight, which bound the step (H200, the
    /// 1.39B at batch 64: the step kernel 108 µs with f32 states, 93 µs with bf16 ones at two
    /// columns, 76–78 µs at four). Four where f32 takes four would be eight, whose registers
    /// spill (slower on the Qwen3.5 layout: 3.76 against 3.21 ms at batch 64;
    /// `benches/results/h200-state_dtype-2026-11-30/`).
    fn for_states(self, bf16: bool, v: usize) -> Self {
        if bf16 && self == Self::WIDE_K_MANY && v.is_multiple_of(4) {
            return Self { cols: 4, ..self };
        }
        self
    }

    fn name(&self) -> String {
        format!("w{}_r{}_c{}_b{}", self.warps, self.rows, self.cols, self.min_blocks)
    }
}

/// The entry's access suffix (gated_delta.cu): `vec` (16-byte accesses, one householder step a
/// token, compiled apart from the loop over n), `vec_n` (16-byte accesses, n steps) or `scalar`
/// (element by element, n steps).
fn entry_access(vectorised: bool, n: usize) -> &'static str {
    match (vectorised, n) {
        (true, 1) => "vec",
        (true, _) => "vec_n",
        (false, _) => "scalar",
    }
}

/// One decode step for `B = slots.len()` sequences, `x.n` householder steps each, reading and
/// writing the states of `slots` in place. Returns `o` `[B, HV, V]` f32.
pub fn gated_delta_step(x: &MixerInputs<'_>, states: &mut DeviceSlots, slots: StepSlots<'_>) -> Result<Tensor> {
    let dev = cuda_dev(x.q, "gated_delta_step")?;
    let (b, h, k) = x.q.dims3()?;
    let (_, hv, v) = x.v.dims3()?;
    check_head_dim("gated_delta_step", k)?;
    // 16-byte state and value accesses when V allows (and v's data is, or will be copied to,
    // an aligned buffer); element by element otherwise.
    let aligned = x.v.dtype() != DType::F32 || !x.v.is_contiguous() || x.v.layout().start_offset().is_multiple_of(4);
    let access = entry_access(v.is_multiple_of(4) && aligned, x.n.max(1));
    let (words, sfx) = states.recurrent_words("gated_delta_step")?;
    let (shape, cfg) = step_kernel(&dev, k, b, hv, v, !sfx.is_empty())?;
    let f = func(&dev, &format!("gdr_decode_f32_{}_{access}{sfx}", shape.name()), &modules::GATED_DELTA)?;
    let sl = DecodeSlots::new(&dev, slots)?;
    // SAFETY: the kernel writes every element of o.
    let mut o = unsafe { dev.alloc::<f32>(b * hv * v) }?;
    let ints = [h as i32, hv as i32, k as i32, v as i32, x.n.max(1) as i32];
    with_mixer_views!(x, qv, kv, vv, bv, gp, {
        let mut l = f.builder();
        l.arg(&qv).arg(&kv).arg(&vv).arg(&bv);
        push_gate(&mut l, &gp);
        launch_with_state(l, words, &sl, &mut o, &ints, &x.scale, cfg)?;
    });
    Ok(wrap(&dev, o, (b, hv, v)))
}

/// The step kernel's shape for key dim `k` and `b` rows of `hv` heads of width `v` (by K and
/// batch and the states' type, or as `DELTASERVE_DECODE_KERNEL` says), and its grid.
fn step_kernel(dev: &CudaDevice, k: usize, b: usize, hv: usize, v: usize, bf16: bool) -> Result<(DecodeShape, LaunchConfig)> {
    let shape = match DecodeShape::wanted().filter(|w| w.warps * w.rows >= k) {
        Some(w) => w,
        None => DecodeShape::pick(k, b * hv, v, sm_count(dev)?).for_states(bf16, v),
    };
    Ok((shape, grid(v.div_ceil(32 * shape.cols), hv, b, 32 * shape.warps as u32, 0)))
}

/// Pushes the arguments every step kernel ends with (states, slots, o, `ints`, scale) after
/// the inputs already in `l`, and launches.
fn launch_with_state<'a>(
    mut l: LaunchArgs<'a>,
    states: &'a mut CudaSlice<f32>,
    sl: &'a DecodeSlots,
    o: &'a mut CudaSlice<f32>,
    ints: &'a [i32],
    scale: &'a f32,
    cfg: LaunchConfig,
) -> Result<()> {
    l.arg(states);
    sl.push(&mut l);
    l.arg(o);
    for i in ints {
        l.arg(i);
    }
    l.arg(scale);
    unsafe { l.launch(cfg) }.w()?;
    Ok(())
}

/// The raw decode kernels' first argument, field for field `struct Raw` in gated_delta.cu
/// (passed by value as a `__grid_constant__` parameter).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawArgs {
    conv: u64,
    ldc: i64,
    k_off: i32,
    v_off: i32,
    b: u64,
    ldb: i64,
    b_code: i32,
    beta_mult: f32,
    a: u64,
    lda: i64,
    a_code: i32,
    /// The C++ struct's padding before the next pointer, spelled out.
    _pad: i32,
    a_log: u64,
    dt_bias: u64,
    h: i32,
    hv: i32,
}

// gated_delta.cu asserts the same size and offsets for `struct Raw`.
const _: () = assert!(std::mem::size_of::<RawArgs>() == 96 && std::mem::offset_of!(RawArgs, a_log) == 72);

// SAFETY: plain `#[repr(C)]` integers and floats, laid out as the kernels' `struct Raw`.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for RawArgs {}

/// A decode step on the inputs as the conv and the input projection leave them
/// ([`crate::ops::gated_delta_step_raw`], which checked the shapes): q and k normalised and β
/// and the gate formed inside the step's kernel, v, b and a read in place. Returns `o`
/// `[B, HV, V]` f32.
pub fn gated_delta_step_raw(x: &RawStepInputs<'_>, states: &mut DeviceSlots, slots: StepSlots<'_>) -> Result<Tensor> {
    let dev = cuda_dev(x.conv_out, "gated_delta_step_raw")?;
    let b = x.conv_out.dim(0)?;
    let (h, k, n) = (x.layout.q_heads, x.layout.head_dim, x.n.max(1));
    let (hv, v) = (x.v_heads, x.v_dim);
    check_head_dim("gated_delta_step_raw", k)?;
    let conv = RowsArg::new(&f32c(x.conv_out)?)?;
    let braw = RowsArg::new(x.b)?;
    let gate = x.gate_in.map(|(a, a_log, dt_bias)| -> Result<_> { Ok((RowsArg::new(a)?, f32c(a_log)?, f32c(dt_bias)?)) }).transpose()?;
    // 16-byte state and value accesses when every v row starts 16-byte aligned.
    let aligned = conv.vectorisable(4, v) && x.v_offset.is_multiple_of(4);
    let access = entry_access(aligned, n);
    let (words, sfx) = states.recurrent_words("gated_delta_step_raw")?;
    let (shape, cfg) = step_kernel(&dev, k, b, hv, v, !sfx.is_empty())?;
    let f = func(&dev, &format!("gdr_decode_raw_{}_{access}{sfx}", shape.name()), &modules::GATED_DELTA)?;
    let sl = DecodeSlots::new(&dev, slots)?;
    // SAFETY: the kernel writes every element of o.
    let mut o = unsafe { dev.alloc::<f32>(b * hv * v) }?;
    let code = |r: &RowsArg| match r.suffix {
        "bf16" => 1i32,
        "f16" => 2,
        _ => 0,
    };
    let (a, lda, a_code) = gate.as_ref().map_or((0, 0, 0), |(a, _, _)| (a.ptr, a.ld, code(a)));
    let (a_log, dt_bias) = match &gate {
        Some((_, al, db)) => (first_element_address_any(al)?, first_element_address_any(db)?),
        None => (0, 0),
    };
    let args = RawArgs {
        conv: conv.ptr,
        ldc: conv.ld,
        k_off: (h * k) as i32,
        v_off: x.v_offset as i32,
        b: braw.ptr,
        ldb: braw.ld,
        b_code: code(&braw),
        beta_mult: if x.allow_neg_eigval { 2.0 } else { 1.0 },
        a,
        lda,
        a_code,
        _pad: 0,
        a_log,
        dt_bias,
        h: h as i32,
        hv: hv as i32,
    };
    let ints = [k as i32, v as i32, n as i32];
    let mut l = f.builder();
    l.arg(&args);
    launch_with_state(l, words, &sl, &mut o, &ints, &x.scale, cfg)?;
    Ok(wrap(&dev, o, (b, hv, v)))
}
