//! Launcher of the skinny GEMM (skinny.cu): a decode step's projections at 4–64 rows, W's and
//! x's tiles copied into shared memory by the tensor memory accelerator and multiplied on
//! Hopper's warpgroup tensor cores, K split across a cluster whose blocks add their parts in
//! distributed shared memory; and its two epilogue forms, which also run an MLP's SwiGLU
//! ([`skinny_swiglu`]) or a delta-rule layer's short conv ([`skinny_conv`]) in the same launch.

use candle_core::cuda_backend::cudarc::driver::{sys, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{alloc_rows, cuda_dev, first_element_address_any, func, grid, modules, sm_count, RowsArg, Switch};
use crate::{KernelError, Result};

/// Whether the ops take the skinny GEMM where it applies (`DELTASERVE_SKINNY_GEMM=0`: cuBLAS).
static SKINNY: Switch = Switch::new("DELTASERVE_SKINNY_GEMM");
/// Launches of the skinny GEMM since start.
static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Launches of its SwiGLU form since start.
static GLU_LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Launches of its short-conv form since start.
static CONV_LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether the row kernels before a projection let it start at their entry.
static EARLY: Switch = Switch::new("DELTASERVE_PDL_EARLY");
/// Whether an MLP's `[gate | up]` projection forms SwiGLU in the skinny GEMM's epilogue
/// (`DELTASERVE_SKINNY_GLU=0`: the GEMM, then the swiglu kernel).
static GLU: Switch = Switch::new("DELTASERVE_SKINNY_GLU");

/// The `early` argument of the row kernels that come before a decode step's projections (the
/// norms, SwiGLU, the attention gate) for `tokens` rows: 1 (trigger the dependents at entry, so
/// that the skinny GEMM after them streams its first stages of W while they run) for the rows
/// the skinny GEMM takes (past the GEMV kernels', whose blocks would only wait resident) on a
/// build that has it, unless `DELTASERVE_PDL_EARLY=0`; else 0.
pub(super) fn early_trigger(tokens: usize) -> i32 {
    let rows = tokens > crate::ops::SMALL_BATCH_LINEAR_MAX_ROWS && tokens <= crate::ops::gemv::skinny_max_rows();
    i32::from(rows && modules::SKINNY.is_sass() && SKINNY.on() && EARLY.on())
}

/// Turns the ops' use of the skinny GEMM on or off for the process (tests of the cuBLAS path).
pub fn set_skinny_gemm(on: bool) {
    SKINNY.set(on);
}

/// Whether the ops take the skinny GEMM where it applies.
pub fn skinny_gemm_on() -> bool {
    SKINNY.on()
}

/// Whether this build has the skinny GEMM: its entries exist only in sm_90a machine code.
pub fn skinny_gemm_available() -> bool {
    modules::SKINNY.is_sass()
}

/// Turns [`skinny_swiglu`]'s use by the ops on or off for the process (tests of the two-launch
/// path).
pub fn set_skinny_swiglu(on: bool) {
    GLU.set(on);
}

/// Whether the ops take [`skinny_swiglu`] where it applies.
pub fn skinny_swiglu_on() -> bool {
    GLU.on()
}

/// Launches of [`skinny_swiglu`] since start.
pub fn skinny_swiglu_launches() -> u64 {
    GLU_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Launches of [`skinny_conv`] since start.
pub fn skinny_conv_launches() -> u64 {
    CONV_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Launches of [`skinny_gemm`], [`skinny_swiglu`] and [`skinny_conv`] since start.
pub fn skinny_launches() -> u64 {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Most rows of x: wgmma's widest tile here (n64).
pub const SKINNY_MAX_ROWS: usize = 64;
/// k a tile (`SK_BK`): one 128-byte swizzle row of 16-bit elements.
const BK: usize = 64;
/// Shared memory a block's stages may take: two blocks an SM.
const STAGE_BUDGET: usize = 100 * 1024;

/// A block's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkinnyConfig {
    /// Consumer warpgroups a block, 64 rows of W each (1 or 2).
    pub warpgroups: usize,
    /// K slices, blocks a cluster (1, 2, 4 or 8).
    pub splits: usize,
    /// Shared-memory stages of k tiles a block (2–8).
    pub stages: usize,
    /// W's copies marked to leave L2 first.
    pub evict_first: bool,
}

impl SkinnyConfig {
    /// Whether K splits into whole k tiles, at least two a block, and the shape is one compiled.
    pub fn takes(self, k: usize) -> bool {
        [1, 2].contains(&self.warpgroups)
            && [1, 2, 4, 8].contains(&self.splits)
            && (2..=8).contains(&self.stages)
            && k.is_multiple_of(BK * self.splits)
            && k / (BK * self.splits) >= 2
    }

    /// The shape's name, `w{warpgroups}s{splits}r{stages}` and `e` for `evict_first`.
    pub fn name(self) -> String {
        format!("w{}s{}r{}{}", self.warpgroups, self.splits, self.stages, if self.evict_first { "e" } else { "" })
    }

    /// The shape for `n` × `k` at `m` rows on `sms` multiprocessors, as rows or as slices
    /// ([`SkinnyOut::Parts`]): one warpgroup a block; the fewest K slices (at least two as
    /// slices) that give every multiprocessor a block; as many stages as two blocks an SM leave
    /// room for. `DELTASERVE_SKINNY_WG`, `_SPLITS`, `_STAGES` and `_EVICT` override each (for
    /// comparisons). `None` when K does not split into whole tiles.
    pub fn choose(m: usize, n: usize, k: usize, sms: usize, parts: bool) -> Option<Self> {
        let warpgroups = env_count!("DELTASERVE_SKINNY_WG").filter(|w| [1, 2].contains(w)).unwrap_or(1);
        let tiles = n.div_ceil(64 * warpgroups);
        let whole = |s: usize| k.is_multiple_of(BK * s) && k / (BK * s) >= 2;
        let splits = match env_count!("DELTASERVE_SKINNY_SPLITS") {
            Some(s) => s,
            None => {
                let least = if parts { 2 } else { 1 };
                let valid: Vec<usize> = [1, 2, 4, 8].into_iter().filter(|&s| s >= least && whole(s)).collect();
                valid.iter().copied().find(|&s| tiles * s >= sms).or(valid.last().copied())?
            }
        };
        // Slices of a narrow projection have few k tiles each: four stages cover them.
        let stage = (64 * warpgroups + rows_tile(m)) * BK * 2;
        let stages = env_count!("DELTASERVE_SKINNY_STAGES").unwrap_or(if parts { 4 } else { (STAGE_BUDGET / stage).clamp(2, 8) });
        let evict_first = env_count!("DELTASERVE_SKINNY_EVICT").is_some_and(|e| e == 1);
        let c = Self { warpgroups, splits, stages, evict_first };
        c.takes(k).then_some(c)
    }
}

/// The shape [`skinny_swiglu`] and [`skinny_conv`] run at `m` rows: one warpgroup (32 gate rows and their 32 up
/// rows a block), K unsplit, stages as [`SkinnyConfig::choose`] gives a block of rows
/// (`DELTASERVE_SKINNY_STAGES` and `_EVICT` override them).
fn one_slice_config(m: usize) -> SkinnyConfig {
    let stage = (64 + rows_tile(m)) * BK * 2;
    let stages = env_count!("DELTASERVE_SKINNY_STAGES").unwrap_or((STAGE_BUDGET / stage).clamp(2, 8));
    let evict_first = env_count!("DELTASERVE_SKINNY_EVICT").is_some_and(|e| e == 1);
    SkinnyConfig { warpgroups: 1, splits: 1, stages, evict_first }
}

/// Bytes of shared memory past the stages that the conv form's windows and weights take, for
/// x-row tiles of `nb` rows (64 channels a block).
fn conv_smem(nb: usize) -> usize {
    (nb * 64 + 64) * 16
}

/// When [`skinny_swiglu`] lets the kernel after it start: 0 at its end, 1 at its entry (the
/// default: the down projection after it then streams its first stages of W while it runs, as
/// it did beside the swiglu kernel this one replaces), 2 once a block's products are done;
/// `DELTASERVE_GLU_TRIGGER` overrides it (for comparisons).
fn glu_trigger() -> i32 {
    env_count!("DELTASERVE_GLU_TRIGGER").map_or(1, |t| t.min(2) as i32)
}

/// x's rows a block takes (wgmma's n): 16, 32 or 64.
fn rows_tile(m: usize) -> usize {
    match m {
        0..=16 => 16,
        17..=32 => 32,
        _ => 64,
    }
}

/// Where [`skinny_gemm`] writes the product.
#[derive(Clone, Copy)]
pub enum SkinnyOut<'a> {
    /// A new `[M, N]` tensor in the operands' dtype.
    Rows,
    /// A new `[M, N]` f32 tensor: the accumulators as they are.
    F32,
    /// A given contiguous `[M, N]` f32 tensor.
    F32Into(&'a Tensor),
    /// A new `[S, M, N]` f32 tensor: K in `S` = the config's `splits` slices, each slice's
    /// partial product apart (no cluster), for a reader that sums them in slice order.
    Parts,
}

/// A TMA descriptor (`CUtensorMap`), passed to a kernel by value (`__grid_constant__`).
#[repr(transparent)]
#[derive(Clone, Copy)]
struct TensorMap(sys::CUtensorMap);

// SAFETY: a CUtensorMap is plain bytes the kernel receives as its 128-byte parameter.
unsafe impl DeviceRepr for TensorMap {}

/// The map of a `[rows, cols]` 16-bit matrix at `ptr` (row stride `ld` elements) read in boxes of
/// `box_rows` × 64 columns, in the 128-byte swizzle, zeros past its edges.
fn tensor_map(ptr: u64, dtype: DType, rows: usize, cols: usize, ld: usize, box_rows: usize) -> Result<TensorMap> {
    use sys::CUtensorMapDataType as D;
    let data = match dtype {
        DType::BF16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        _ => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    };
    let dims = [cols as u64, rows as u64];
    let strides = [ld as u64 * 2];
    let boxes = [BK as u32, box_rows as u32];
    let unit = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer is to a live local array of the rank's length; the driver only
    // encodes the descriptor (it does not touch device memory).
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            unit.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(KernelError::Unsupported { op: "skinny_gemm", what: format!("cuTensorMapEncodeTiled: {status:?}") });
    }
    // SAFETY: the call succeeded, so it wrote the descriptor.
    Ok(TensorMap(unsafe { map.assume_init() }))
}

/// Lets `f` (the entry `name`) launch with `smem` bytes of dynamic shared memory: the driver
/// call only when a context's entry needs more than it was last allowed, so that eager launches
/// on the hot path make none after their first.
fn opt_in_smem(dev: &candle_core::CudaDevice, name: &str, f: &super::modules::Func, smem: usize) -> Result<()> {
    use std::collections::BTreeMap;
    use sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SMEM;
    static ALLOWED: std::sync::Mutex<BTreeMap<(usize, String), usize>> = std::sync::Mutex::new(BTreeMap::new());
    let key = (dev.cuda_stream().context().cu_ctx() as usize, name.to_string());
    // A panic elsewhere while the lock was held leaves the map itself whole.
    let mut allowed = ALLOWED.lock().unwrap_or_else(|p| p.into_inner());
    if allowed.get(&key).is_some_and(|&a| a >= smem) {
        return Ok(());
    }
    f.set_attribute(MAX_SMEM, smem as i32).w()?;
    allowed.insert(key, smem);
    Ok(())
}

/// The operands of a skinny launch as its kernels take them.
struct Operands {
    /// The entries' type name: `bf16` or `f16`.
    suffix: &'static str,
    m: usize,
    n: usize,
    k: usize,
    xa: RowsArg,
    wa: RowsArg,
}

impl Operands {
    /// `x` `[M, K]` and `w` `[N, K]` where the kernel takes them: both bf16 or both f16, 1 ≤ M ≤
    /// [`SKINNY_MAX_ROWS`], N ≥ 1, W contiguous, rows 16-byte aligned, on a build with the
    /// kernel; `None` elsewhere.
    fn of(x: &Tensor, w: &Tensor) -> Result<Option<Self>> {
        let (Ok((m, k)), Ok((n, kw))) = (x.dims2(), w.dims2()) else { return Ok(None) };
        let suffix = match (x.dtype(), w.dtype()) {
            (DType::BF16, DType::BF16) => "bf16",
            (DType::F16, DType::F16) => "f16",
            _ => return Ok(None),
        };
        if !modules::SKINNY.is_sass() || m == 0 || m > SKINNY_MAX_ROWS || n == 0 || kw != k || !w.is_contiguous() {
            return Ok(None);
        }
        let (xa, wa) = (RowsArg::new(x)?, RowsArg::new(w)?);
        if !xa.vectorisable(8, k) || !wa.vectorisable(8, k) {
            return Ok(None);
        }
        Ok(Some(Self { suffix, m, n, k, xa, wa }))
    }

    /// The shape of the epilogue forms ([`skinny_swiglu`], [`skinny_conv`]): `config` or the
    /// default for M rows, if it has one warpgroup and one K slice and takes K.
    fn one_slice(&self, config: Option<SkinnyConfig>) -> Option<SkinnyConfig> {
        let cfg = config.unwrap_or_else(|| one_slice_config(self.m));
        (cfg.warpgroups == 1 && cfg.splits == 1 && cfg.takes(self.k)).then_some(cfg)
    }
}

/// `x` `[M, K]` (rows may be a column slice) times `w` `[N, K]`ᵀ for 1 ≤ M ≤ [`SKINNY_MAX_ROWS`],
/// both bf16 or both f16, with rows 16-byte aligned and K whole 64-wide tiles a slice, on a
/// Hopper build (its wgmma entries exist only in sm_90a machine code). Each row of the result
/// has the same bits whatever M. `config` fixes the block's shape; `None` lets
/// [`SkinnyConfig::choose`] pick it. `None` where the kernel does not apply.
pub fn skinny_gemm(x: &Tensor, w: &Tensor, out: SkinnyOut<'_>, config: Option<SkinnyConfig>) -> Result<Option<Tensor>> {
    let Some(Operands { suffix, m, n, k, xa, wa }) = Operands::of(x, w)? else { return Ok(None) };
    let dev = cuda_dev(x, "skinny_gemm")?;
    let chosen = match config {
        Some(c) => c.takes(k).then_some(c),
        None => SkinnyConfig::choose(m, n, k, sm_count(&dev)?, matches!(out, SkinnyOut::Parts)),
    };
    let Some(cfg) = chosen else { return Ok(None) };
    let y = match out {
        SkinnyOut::Rows => alloc_rows(&dev, x.dtype(), m, n)?,
        SkinnyOut::F32 => alloc_rows(&dev, DType::F32, m, n)?,
        SkinnyOut::Parts => alloc_rows(&dev, DType::F32, cfg.splits * m, n)?,
        SkinnyOut::F32Into(t) => {
            if t.dims() != [m, n] || !t.is_contiguous() || t.dtype() != DType::F32 {
                return Ok(None);
            }
            t.clone()
        }
    };
    let out_name = if matches!(out, SkinnyOut::Rows) { suffix } else { "f32" };
    let (bm, nb) = (64 * cfg.warpgroups, rows_tile(m));
    let tw = tensor_map(wa.ptr, w.dtype(), n, k, wa.ld as usize, bm)?;
    let tx = tensor_map(xa.ptr, x.dtype(), m, k, xa.ld as usize, nb)?;
    let smem = cfg.stages * ((bm + nb) * BK * 2 + 16) + 1024;
    // Parts: the unclustered entry over a grid of K slices.
    let (cluster, part_stride) = match out {
        SkinnyOut::Parts => (1, (m * n) as i64),
        _ => (cfg.splits, 0),
    };
    let name = format!("skinny_{suffix}_{out_name}_w{}_n{nb}_s{cluster}", cfg.warpgroups);
    let f = func(&dev, &name, &modules::SKINNY)?;
    opt_in_smem(&dev, &name, &f, smem)?;
    let y_ptr = first_element_address_any(&y)?;
    let (ldy, mi, ni, ki) = (n as i32, m as i32, n as i32, k as i32);
    let (stages, hint) = (cfg.stages as i32, i32::from(cfg.evict_first));
    let mut l = f.builder();
    l.arg(&tw).arg(&tx).arg(&y_ptr).arg(&ldy).arg(&mi).arg(&ni).arg(&ki).arg(&stages).arg(&hint).arg(&part_stride);
    let launch = grid(cfg.splits, n.div_ceil(bm), 1, 128 * cfg.warpgroups as u32 + 32, smem as u32);
    // SAFETY: the arguments match skinny.cu's entry (tw, tx, y, ldy, M, N, K, stages, hint,
    // part_stride); the maps cover x and W as they lie (rows 16-byte aligned, checked above) and
    // outlive the launch as its parameters; the grid is the cluster's multiple along x; K is
    // whole k tiles a slice; y holds [M, N] (a slice each for parts) and is written only there.
    unsafe { l.launch(launch) }.w()?;
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(match out {
        SkinnyOut::Parts => y.reshape((cfg.splits, m, n))?,
        _ => y,
    }))
}

/// `silu(x W_gᵀ) · (x W_uᵀ)` `[M, i]` in x's dtype for `w` an MLP's stacked `[gate | up]`
/// (`[2i + padding, K]`, gate rows `0..i`, up rows `i..2i`), under [`skinny_gemm`]'s conditions:
/// one launch whose blocks pair 32 gate rows with their up rows and round g and u to x's dtype
/// before `silu(g) · u`, so each row equals [`skinny_gemm`] at one K slice (`splits: 1`) followed
/// by the swiglu kernel, bit for bit, whatever M. `config` must have one warpgroup and one
/// slice (`None`: [`SkinnyConfig`]'s stages for M rows). `None` where it does not apply.
pub fn skinny_swiglu(x: &Tensor, w: &Tensor, i: usize, config: Option<SkinnyConfig>) -> Result<Option<Tensor>> {
    let Some(ops) = Operands::of(x, w)?.filter(|o| i > 0 && o.n >= 2 * i) else { return Ok(None) };
    let Some(cfg) = ops.one_slice(config) else { return Ok(None) };
    let Operands { suffix, m, n, k, xa, wa } = ops;
    let dev = cuda_dev(x, "skinny_swiglu")?;
    let y = alloc_rows(&dev, x.dtype(), m, i)?;
    let nb = rows_tile(m);
    let tw = tensor_map(wa.ptr, w.dtype(), n, k, wa.ld as usize, 32)?;
    let tx = tensor_map(xa.ptr, x.dtype(), m, k, xa.ld as usize, nb)?;
    let smem = cfg.stages * ((64 + nb) * BK * 2 + 16) + 1024;
    let name = format!("skinny_glu_{suffix}_n{nb}");
    let f = func(&dev, &name, &modules::SKINNY)?;
    opt_in_smem(&dev, &name, &f, smem)?;
    let y_ptr = first_element_address_any(&y)?;
    let (mi, ii, ki) = (m as i32, i as i32, k as i32);
    let (stages, hint, trigger) = (cfg.stages as i32, i32::from(cfg.evict_first), glu_trigger());
    let mut l = f.builder();
    l.arg(&tw).arg(&tx).arg(&y_ptr).arg(&mi).arg(&ii).arg(&ki).arg(&stages).arg(&hint).arg(&trigger);
    // SAFETY: the arguments match skinny.cu's `skinny_glu_*` entry (tw, tx, y, M, I, K, stages,
    // hint, trigger); the maps cover x and W as they lie (rows 16-byte aligned, checked above;
    // W's up rows i..2i within its n rows) and outlive the launch as its parameters; K is whole
    // k tiles; y holds [M, i] and is written only there.
    unsafe { l.launch(grid(1, i.div_ceil(32), 1, 160, smem as u32)) }.w()?;
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    GLU_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(y))
}

/// `x` `[M, K]` times `w` `[N, K]`ᵀ as [`skinny_gemm`] at one K slice and one warpgroup (rows in
/// x's dtype), with the decode step's short conv (width 4) run on the product's first C columns
/// (`conv.weight` `[C, 4]`, row m shifting into `conv.slots`' m-th slot): `(y, c)` with `c`
/// `[M, C]` f32 equal, bit for bit, to [`super::conv_step`] of `y[:, ..C]`, and the conv states
/// updated as it updates them. One launch where two ran. `None` where it does not apply (as
/// [`skinny_gemm`], or a conv width other than 4, C past N, a row count other than the slots').
pub fn skinny_conv(
    x: &Tensor,
    w: &Tensor,
    conv: super::ConvFold<'_, '_>,
    config: Option<SkinnyConfig>,
) -> Result<Option<(Tensor, Tensor)>> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let (c, width) = conv.weight.dims2()?;
    let fits = |o: &Operands| width == 4 && c > 0 && c <= o.n && conv.slots.host.len() == o.m;
    let Some(ops) = Operands::of(x, w)?.filter(fits) else { return Ok(None) };
    let Some(cfg) = ops.one_slice(config) else { return Ok(None) };
    let Operands { suffix, m, n, k, xa, wa } = ops;
    let dev = cuda_dev(x, "skinny_conv")?;
    let cw = super::f32c(conv.weight)?;
    let cw_ptr = first_element_address_any(&cw)?;
    let states = conv.states.state_words("skinny_conv")?;
    let (states_ptr, _sync) = states.device_ptr(states.stream());
    if (cw_ptr | states_ptr) % 16 != 0 {
        return Ok(None);
    }
    let slots = super::decode::DecodeSlots::new(&dev, conv.slots)?;
    let y = alloc_rows(&dev, x.dtype(), m, n)?;
    let cy = alloc_rows(&dev, DType::F32, m, c)?;
    let nb = rows_tile(m);
    let tw = tensor_map(wa.ptr, w.dtype(), n, k, wa.ld as usize, 64)?;
    let tx = tensor_map(xa.ptr, x.dtype(), m, k, xa.ld as usize, nb)?;
    let smem = cfg.stages * ((64 + nb) * BK * 2 + 16) + 1024 + conv_smem(nb);
    let name = format!("skinny_conv_{suffix}_n{nb}");
    let f = func(&dev, &name, &modules::SKINNY)?;
    opt_in_smem(&dev, &name, &f, smem)?;
    let (y_ptr, cy_ptr) = (first_element_address_any(&y)?, first_element_address_any(&cy)?);
    let (mi, ni, ki, ci) = (m as i32, n as i32, k as i32, c as i32);
    let (stages, hint, silu) = (cfg.stages as i32, i32::from(cfg.evict_first), i32::from(conv.silu));
    let mut l = f.builder();
    l.arg(&tw).arg(&tx).arg(&y_ptr).arg(&mi).arg(&ni).arg(&ki).arg(&stages).arg(&hint).arg(&cw_ptr).arg(&states_ptr);
    slots.push(&mut l);
    l.arg(&cy_ptr).arg(&ci).arg(&silu);
    // SAFETY: the arguments match skinny.cu's `skinny_conv_*` entry (tw, tx, y, M, N, K, stages,
    // hint, cw, states, slots, more_slots, cy, C, silu); the maps cover x and W as they lie (rows
    // 16-byte aligned, checked above) and outlive the launch as its parameters; K is whole k
    // tiles; y holds [M, N], cy [M, C]; the conv weights [C, 4] and every slot's [C, 4] window
    // are 16-byte aligned (checked above), and the slots are distinct (the op checked them).
    unsafe { l.launch(grid(1, n.div_ceil(64), 1, 160, smem as u32)) }.w()?;
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CONV_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(Some((y, cy)))
}
