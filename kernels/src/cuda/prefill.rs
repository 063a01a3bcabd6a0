//! Launcher of the prefill's chunked gated delta rule on the tensor cores.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{
    check_head_dim, cuda_dev, f32c, func, grid, modules, push_gate, sm_count, table_addrs, wrap, DeviceSlots, GatePtr, Switch, CHUNK,
};
use crate::ops::MixerInputs;
use crate::packing::Part;
use crate::{Capture, PackedTables, Result};

/// Shared memory of the tensor-core kernels, in bytes (each buffer rounded up to 128 bytes, as
/// the kernels' allocator does).
fn tc_smem(parts: &[usize]) -> usize {
    parts.iter().map(|b| b.div_ceil(128) * 128).sum()
}

/// `chunk_tc_prep`: K and Q tiles, A and T (fp32), G and β. With `lo` (f32 inputs) every bf16
/// tile has a lo half and the q tiles are at least a V block and the eight warps' 256-float
/// staging tiles (T1 and T2 take A's and T's tiles as bf16 pairs); with bf16 inputs T2 goes
/// straight to global memory.
fn tc_prep_smem(k: usize, lo: bool) -> usize {
    let kp = k.div_ceil(16) * 16 + 8;
    let tile32 = 4 * CHUNK * 72;
    let kt = 2 * CHUNK * kp;
    let mut parts = vec![tile32, tile32, 4 * CHUNK, 4 * CHUNK, kt];
    if lo {
        let qt = kt.max(2 * CHUNK * 72 + 8 * 256 * 4);
        parts.extend([kt, qt, qt]);
    } else {
        parts.push(kt);
    }
    tc_smem(&parts)
}

/// `chunk_tc_prep_bf16_pairs` (two value heads of one key head): A and T of the first, G and β
/// of both, then room for the K and Q tiles (two bf16 tiles of pitch `kp`) that the second
/// head's A and T take once read.
fn tc_prep_pair_smem(k: usize) -> usize {
    let kp = k.div_ceil(16) * 16 + 8;
    let tile32 = 4 * CHUNK * 72;
    tc_smem(&[tile32, tile32, 8 * CHUNK, 8 * CHUNK, (4 * CHUNK * kp).max(2 * tile32)])
}

/// Whether the bf16 prep takes value heads two at a time (`chunk_tc_prep_bf16_pairs`: each key
/// head's K Kᵀ and Q Kᵀ formed once for both): with an even number of value heads to each key
/// head, unless `DELTASERVE_PREP_PAIRS=0` or [`set_prep_pairs`] turned it off.
fn prep_pairs(lo: bool, h: usize, hv: usize) -> bool {
    !lo && h > 0 && hv.is_multiple_of(h) && (hv / h).is_multiple_of(2) && PREP_PAIRS.on()
}
static PREP_PAIRS: Switch = Switch::new("DELTASERVE_PREP_PAIRS");

/// Turns the paired bf16 prep on or off for the process (the GPU test compares the two bit for
/// bit).
#[doc(hidden)]
pub fn set_prep_pairs(on: bool) {
    PREP_PAIRS.set(on);
}

/// The warpgroup state pass (`wg_state_smem` in `chunk_wg.cuh`): two buffers each of the key
/// and Q tiles (K padded to 16·KT, 128-byte swizzled), V's padded tile and G; one each of T2 and
/// P; the decays (each warp's copy, or on two warpgroups (`two`) one a buffer); O's bf16 staging
/// tile at K = 64, one or (`two`) two (K = 128 stages it in a Q buffer); 1 KB for the swizzle's
/// alignment.
fn wg_state_smem(kt: usize, two: bool) -> usize {
    let stages = if kt > 4 {
        0
    } else if two {
        2
    } else {
        1
    };
    let decays = if two { 2 * 512 } else { 4 * 512 };
    4 * (CHUNK * 16 * kt * 2) + 2 * (CHUNK * CHUNK * 2) + 2 * (CHUNK * 72 * 2) + 512 + decays + stages * CHUNK * CHUNK * 2 + 1024
}

/// The warpgroup state pass for 128 < K ≤ 256 (`chunk_wg_split.cuh`, `wg_split_smem`): WgTiles'
/// buffers at K = 256 (key and Q tiles of 32 KB), the two buffers' decays, the two consumers'
/// partial 64 × 64 fp32 tiles, 1 KB for the swizzle's alignment.
fn wg_split_smem() -> usize {
    4 * (CHUNK * 16 * 16 * 2) + 2 * (CHUNK * CHUNK * 2) + 2 * (CHUNK * 72 * 2) + 512 + 2 * 512 + 2 * CHUNK * CHUNK * 4 + 1024
}

/// Launches of the split-key warpgroup state pass (128 < K ≤ 256) in this process (the GPU test
/// checks that the pass it compares did run).
static SPLIT_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many split-key warpgroup state passes (128 < K ≤ 256) this process has launched.
#[doc(hidden)]
pub fn split_key_pass_launches() -> usize {
    SPLIT_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Chunks a sequence must span for the warpgroup state pass to run on two warpgroups
/// (`chunk_wg_ws.cuh`: a producer issuing the copies beside the consumer's products). Its start
/// costs about 2 µs more, which a single chunk pays and four already repay
/// (`docs/performance.md`).
const TWO_WARPGROUP_CHUNKS: usize = 4;

/// Whether the warpgroup state pass (`wg`) runs on two warpgroups: the longest sequence spans
/// [`TWO_WARPGROUP_CHUNKS`] chunks (for a pass replayed from a graph with other packings of its
/// rows: its rows do). Both give the same bits, so the choice may depend on the batch.
/// `DELTASERVE_TC_WS=0` or [`set_two_warpgroup_pass`] turns it off.
fn two_warpgroup_pass(wg: bool, longest_chunks: usize) -> bool {
    wg && longest_chunks >= TWO_WARPGROUP_CHUNKS && WS_PASS.on()
}
static WS_PASS: Switch = Switch::new("DELTASERVE_TC_WS");

/// Turns the two-warpgroup state pass on (where chosen) or off for the process: the GPU test
/// compares it with the one-warpgroup pass bit for bit.
#[doc(hidden)]
pub fn set_two_warpgroup_pass(on: bool) {
    WS_PASS.set(on);
}

/// Launches of the two-warpgroup state pass in this process (the GPU test checks that the pass
/// it compares did run).
static WS_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many two-warpgroup state passes this process has launched.
#[doc(hidden)]
pub fn two_warpgroup_launches() -> usize {
    WS_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the bf16 state pass runs on the warpgroup tensor cores (`chunk_wg_state_*`,
/// `chunk_wg.cuh`; for 128 < K ≤ 256 `chunk_wg_split_*`, `chunk_wg_split.cuh`): bf16 inputs with
/// K ≤ 256, K, V and v's row stride multiples of 8, and q, k and v 16-byte aligned (`aligned`),
/// from an sm_90a image; faster than the mma.sync pass at every shape measured
/// (`docs/performance.md`). All of that is the model's, not the batch's, so a sequence takes the
/// same pass, and the same bits, whatever it is packed with. `DELTASERVE_TC_WG=0` or
/// [`set_warpgroup_pass`] turns it off.
fn warpgroup_pass(lo: bool, k: usize, v: usize, ldv: usize, aligned: bool) -> bool {
    let eligible = !lo && k <= 256 && k.is_multiple_of(8) && v.is_multiple_of(8) && ldv.is_multiple_of(8) && aligned;
    eligible && super::modules::CHUNK_WG.is_sass() && WG_PASS.on()
}
static WG_PASS: Switch = Switch::new("DELTASERVE_TC_WG");

/// `chunk_wg_prep`: the key and query tiles (128-byte swizzled, K padded to 16·KT), which A and
/// T (fp32, pitch 72) take once read; G and β; 1 KB for the swizzle's alignment.
fn wg_prep_smem(kt: usize) -> usize {
    (2 * CHUNK * 16 * kt * 2).max(2 * 4 * CHUNK * 72) + 512 + 1024
}

/// Whether the bf16 prep runs on the warpgroup tensor cores (`chunk_wg_prep_*`,
/// `chunk_wg_prep.cuh`): bf16 inputs with K ≤ 256 and a multiple of 8, q and k 16-byte aligned
/// (`aligned`), from an sm_90a image, unless `DELTASERVE_TC_WG_PREP=0` or [`set_warpgroup_prep`]
/// turned it off. Its T2, P and G are `chunk_tc_prep`'s bit for bit, in about 60% of the time,
/// for either state pass; like the pass's, its eligibility is the model's, not the batch's.
fn warpgroup_prep(lo: bool, k: usize, aligned: bool) -> bool {
    !lo && k <= 256 && k.is_multiple_of(8) && aligned && super::modules::CHUNK_WG.is_sass() && WG_PREP.on()
}
static WG_PREP: Switch = Switch::new("DELTASERVE_TC_WG_PREP");

/// The near-fp32 prep reads v in place in the conv output (`DELTASERVE_F32_V_IN_PLACE=0`: a
/// contiguous copy first, for comparison).
static F32_V_IN_PLACE: Switch = Switch::new("DELTASERVE_F32_V_IN_PLACE");

/// Turns the warpgroup prep on (where eligible) or off for the process: GPU tests compare it
/// with `chunk_tc_prep` bit for bit.
#[doc(hidden)]
pub fn set_warpgroup_prep(on: bool) {
    WG_PREP.set(on);
}

/// Turns the warpgroup state pass on (where eligible) or off for the process: GPU tests compare
/// it with the mma.sync pass.
#[doc(hidden)]
pub fn set_warpgroup_pass(on: bool) {
    WG_PASS.set(on);
}

/// `chunk_mma_state`: Q and key tiles (K padded to the kernel's 16·KT), P, the bf16 S, then
/// two key tiles (the next chunk's arrives early), T2 and V (bf16 inputs) or a W tile and an
/// fp32 U tile (f32 inputs), V', and G with the chunk's two decay vectors. With `lo` (f32
/// inputs) every bf16 tile has a lo half, and with K > 128 the keys share W's tile; with `db`
/// (the double-buffered entry) or bf16 inputs at K ≤ 64, a second P, T2, V and G.
fn mma_state_smem(k: usize, bv: usize, lo: bool, db: bool) -> usize {
    let kt_tiles = mma_row_tiles(k);
    let k16 = 16 * kt_tiles;
    let halves = if lo { 2 } else { 1 };
    let kt = 2 * CHUNK * (k16 + 8);
    let pt = 2 * CHUNK * 72;
    let sb = 2 * (bv + 8);
    // Q and the keys' tile; then W's (f32 inputs, unless the keys take it) or the second keys'.
    let mut parts = vec![halves * kt, halves * kt];
    if !(lo && kt_tiles > 8) {
        parts.push(halves * kt);
    }
    parts.extend([halves * pt, halves * k16 * sb]);
    if lo {
        parts.push(4 * CHUNK * (bv + 4));
    } else {
        parts.extend([pt, CHUNK * sb]);
    }
    parts.extend([halves * CHUNK * sb, 12 * CHUNK]);
    if db || (kt_tiles <= 4 && !lo) {
        parts.extend([pt, pt, CHUNK * sb, 4 * CHUNK]);
    }
    tc_smem(&parts)
}

/// 16-row tiles of K `chunk_mma_state` is instantiated for: the smallest of 4, 8, 16 that holds K.
fn mma_row_tiles(k: usize) -> usize {
    [4, 8, 16].into_iter().find(|&kt| 16 * kt >= k).unwrap_or(16)
}

/// Largest dynamic shared memory per block on sm_90.
const MAX_SMEM: usize = 227 * 1024;

/// How the state pass's value-tile width is chosen when not forced.
#[derive(Clone, Copy)]
enum TilePick {
    /// The widest that still gives enough CTAs to cover the multiprocessors, else the narrowest
    /// (bf16 operands: two CTAs an SM at K ≤ 128).
    Cover,
    /// The least `waves × (BV + SPLIT_FIXED_COLS)` at one CTA an SM, the wider on a tie (split
    /// operands: a partial second wave costs a whole CTA's time).
    Waves,
}

/// A split-operand CTA's per-chunk cost that does not scale with its value columns (the K-wide
/// W, Q and key pairs and their products), in value columns: on the H200 at K = 256 a 16-column
/// tile took 0.86 of a 32-column one's time.
const SPLIT_FIXED_COLS: usize = 80;

/// Value-tile width of the state pass, from `widths` (widest first): `DELTASERVE_TC_BV` when
/// set, offered and its shared memory (`smem(bv)`) fits; else by `pick` among those that fit,
/// with `ctas_per_tile × V/BV` CTAs (few long sequences want narrow tiles for parallelism, many
/// want wide ones for less recomputation); else the narrowest offered.
fn value_tile(widths: &[usize], smem: impl Fn(usize) -> usize, v: usize, ctas_per_tile: usize, sms: usize, pick: TilePick) -> usize {
    let fits = |bv: usize| smem(bv) <= MAX_SMEM;
    // Read once per process, not on every prefill call.
    let wanted = env_count!("DELTASERVE_TC_BV");
    if let Some(bv) = wanted.filter(|bv| widths.contains(bv) && fits(*bv)) {
        return bv;
    }
    let fitting: Vec<usize> = widths.iter().copied().filter(|&bv| fits(bv)).collect();
    let last = widths.last().copied().unwrap_or(16);
    let ctas = |bv: usize| ctas_per_tile * v.div_ceil(bv);
    let chosen = match pick {
        TilePick::Cover => fitting.iter().copied().find(|&bv| ctas(bv) >= sms).or(fitting.last().copied()),
        // min_by_key keeps the first of equal keys: the wider.
        TilePick::Waves => fitting.iter().copied().min_by_key(|&bv| ctas(bv).div_ceil(sms.max(1)) * (bv + SPLIT_FIXED_COLS)),
    };
    chosen.unwrap_or(last)
}

/// Whether the bf16 state pass at K > 64 takes its double-buffered entry
/// (`chunk_mma_state_db_*`; at K ≤ 64 the plain one double-buffers already): when its grid runs
/// one CTA an SM anyway (`ctas` ≤ `sms`) and the second buffers fit (`smem` with them).
/// `DELTASERVE_TC_DB` = 0 or 1 overrides where the buffers fit.
fn double_buffered(lo: bool, kt: usize, ctas: usize, sms: usize, smem: usize) -> bool {
    if lo || kt <= 4 || smem > MAX_SMEM {
        return false;
    }
    env_count!("DELTASERVE_TC_DB").map_or(ctas <= sms, |d| d != 0)
}

/// The prep launch a prefill takes, with its dynamic shared memory.
enum Prep {
    /// `chunk_wg_prep_k*`: one value head a warpgroup (bf16, K ≤ 256).
    Warpgroup(super::modules::Func, usize),
    /// `chunk_tc_prep_bf16_pairs`: two value heads of a key head a CTA.
    Pairs(super::modules::Func, usize),
    /// `chunk_tc_prep_{bf16,f32}`: one value head a CTA.
    OneHead(super::modules::Func, usize),
}

/// Chunked prefill on the tensor cores (fp32 accumulation and state) of packed sequences:
/// sequence `s` owns rows `cu_seqlens[s]..cu_seqlens[s+1]` (one row per interleaved step; the
/// caller interleaves Gated DeltaProduct) and the state of `slots[s]`, read at the start and
/// written at the end. One launch computes every chunk's T2 (or W and U), P and G in parallel, a second
/// carries the state through each sequence's chunks and writes `o` `[rows, HV, V]`. q's dtype
/// picks the precision: f32 splits every matmul operand into bf16 hi + lo (near fp32:
/// `--mixer-precision fp32`) and writes o in f32; bf16 (k and v converted to it) uses single bf16
/// operands and writes o rounded to bf16, as fla does. bf16 inputs with K ≤ 128 take the state
/// pass on the warpgroup tensor cores (`chunk_wg.cu`; `warpgroup_pass` says when); the others run
/// it on mma.sync (`chunk_mma.cu`), with three products for one where operands are split.
/// Each capture also copies its sequence's state, at the end of the chunk it ends on, into its
/// slot. With `fixed`, the tables are read from its buffer (filled with this packing), the
/// grids sized by its capacities, and nothing is uploaded.
pub fn gated_delta_chunk_tc(
    x: &MixerInputs<'_>,
    states: &mut DeviceSlots,
    cu_seqlens: &[usize],
    slots: &[usize],
    captures: &[Capture],
    fixed: Option<&PackedTables>,
) -> Result<Tensor> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
    use half::bf16;
    let dev = cuda_dev(x.q, "gated_delta_chunk_tc")?;
    let (rows, h, k) = x.q.dims3()?;
    let (_, hv, v) = x.v.dims3()?;
    check_head_dim("gated_delta_chunk_tc", k)?;
    let lo = !matches!(x.q.dtype(), DType::BF16);
    let dtype = if lo { DType::F32 } else { DType::BF16 };
    let cast = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(dtype)?.contiguous()?) };
    // v's rows are read at a stride, the value columns of the conv output taken where they lie
    // (no copy): by the bf16 state pass when its rows are 16-byte aligned, and by the f32 prep
    // (which alone reads v there, to form U) at any stride.
    let v_stride = |t: &Tensor| -> Result<Option<usize>> {
        let st = t.stride();
        let rows_view = st[2] == 1 && st[1] == v && st[0] >= hv * v;
        if lo {
            return Ok((t.dtype() == DType::F32 && rows_view && F32_V_IN_PLACE.on()).then_some(st[0]));
        }
        let in_place = t.dtype() == DType::BF16 && rows_view && st[0].is_multiple_of(8) && v.is_multiple_of(8);
        Ok((in_place && super::first_element_address::<bf16>(t)?.is_multiple_of(16)).then_some(st[0]))
    };
    let (vv, ldv) = match v_stride(x.v)? {
        Some(ld) => (x.v.clone(), ld as i64),
        None => (cast(x.v)?, (hv * v) as i64),
    };
    let (q, kk, beta) = (cast(x.q)?, cast(x.k)?, f32c(x.beta)?);
    let g = x.g.map(f32c).transpose()?;
    // The chunk table: chunks never cross sequences.
    let (mut crow, mut clen) = (Vec::new(), Vec::new());
    for s in 0..slots.len() {
        let (t0, t1) = (cu_seqlens[s], cu_seqlens[s + 1]);
        for c0 in (t0..t1).step_by(CHUNK) {
            crow.push(c0);
            clen.push(CHUNK.min(t1 - c0));
        }
    }
    if crow.is_empty() {
        return Ok(Tensor::zeros((rows, hv, v), dtype, x.q.device())?);
    }
    // Per row: 1 + the slot that takes the state after the chunk starting there, or 0 (an
    // empty table when nothing is captured: the kernels then skip the lookup).
    let mut snap = vec![0usize; if captures.is_empty() || fixed.is_some() { 0 } else { rows }];
    for c in captures.iter().filter(|_| fixed.is_none()) {
        snap[cu_seqlens[c.seq] + c.tokens - CHUNK] = c.slot + 1;
    }
    if let Some(t) = fixed {
        t.check("gated_delta_prefill", rows, slots)?;
    }
    let parts = fixed.map(|t| (t, [Part::ChunkRow, Part::ChunkLen, Part::Cu, Part::Slots, Part::Snap]));
    let (_tables, [crow_d, clen_d, cu, sl, snap_d]) = table_addrs(&dev, [&crow, &clen, cu_seqlens, slots, &snap], parts)?;
    // Fixed tables always carry the snapshot rows (zeros when nothing is captured).
    let has_snap = (!captures.is_empty() || fixed.is_some()) as i32;
    let chunks = fixed.map_or(crow.len(), PackedTables::chunks);
    let mut gc = unsafe { dev.alloc::<f32>(rows * hv) }?;
    let ints = [h as i32, hv as i32, k as i32, v as i32];
    let suffix = if lo { "f32" } else { "bf16" };

    let sms = sm_count(&dev)?;
    let kt = mma_row_tiles(k);
    let aligned16 = |t: &Tensor| super::first_element_address::<bf16>(t).is_ok_and(|a| a.is_multiple_of(16));
    let qk_aligned = !lo && aligned16(&q) && aligned16(&kk);
    let wg = warpgroup_pass(lo, k, v, ldv as usize, qk_aligned && aligned16(&vv));
    let prep = if warpgroup_prep(lo, k, qk_aligned) {
        let f = func(&dev, &format!("chunk_wg_prep_k{kt}"), &modules::CHUNK_WG)?;
        let smem = wg_prep_smem(kt);
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
        Prep::Warpgroup(f, smem)
    } else if prep_pairs(lo, h, hv) {
        let f = func(&dev, "chunk_tc_prep_bf16_pairs", &modules::CHUNK_PREP)?;
        let smem = tc_prep_pair_smem(k);
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
        Prep::Pairs(f, smem)
    } else {
        let f = func(&dev, &format!("chunk_tc_prep_{suffix}"), &modules::CHUNK_PREP)?;
        let smem = tc_prep_smem(k, lo);
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
        Prep::OneHead(f, smem)
    };
    // The mma.sync pass's tiles (the warpgroup pass always takes 64 columns); split operands
    // (f32 inputs) take more shared memory, so narrower value tiles at K > 128.
    let widths: &[usize] = if lo && kt > 8 { &[32, 16] } else { &[64, 32] };
    let pick = if lo { TilePick::Waves } else { TilePick::Cover };
    let bv = value_tile(widths, |bv| mma_state_smem(k, bv, lo, false), v, slots.len() * hv, sms, pick);
    let db = double_buffered(lo, kt, slots.len() * hv * v.div_ceil(bv), sms, mma_state_smem(k, bv, lo, true));
    let (words, sfx) = states.recurrent_words("gated_delta_prefill")?;
    // A captured pass decides by its rows, the same for every packing it replays.
    let longest = match fixed {
        Some(t) => t.rows().div_ceil(CHUNK),
        None => (0..slots.len()).map(|s| (cu_seqlens[s + 1] - cu_seqlens[s]).div_ceil(CHUNK)).max().unwrap_or(0),
    };
    // Above K = 128 the warpgroup pass always splits Sᵀ's keys between two consumers.
    let split = wg && kt > 8;
    let ws = two_warpgroup_pass(wg && !split, longest);
    let (bv, threads) = match (wg, split, ws) {
        (true, true, _) => (64, 384),
        (true, false, true) => (64, 256),
        (true, false, false) => (64, 128),
        (false, ..) => (bv, 256),
    };
    let name = match (lo, db, wg) {
        (false, _, true) if split => format!("chunk_wg_split_k{kt}{sfx}"),
        (false, _, true) if ws => format!("chunk_wg_ws_k{kt}{sfx}"),
        (false, _, true) => format!("chunk_wg_state_k{kt}{sfx}"),
        (true, _, _) => format!("chunk_split_state_k{kt}_bv{bv}{sfx}"),
        (false, true, false) => format!("chunk_mma_state_db_k{kt}_bv{bv}{sfx}"),
        (false, false, false) => format!("chunk_mma_state_k{kt}_bv{bv}{sfx}"),
    };
    let state = func(&dev, &name, if wg { &modules::CHUNK_WG } else { &modules::CHUNK_MMA })?;
    let state_smem = match (wg, split) {
        (true, true) => wg_split_smem(),
        (true, false) => wg_state_smem(kt, ws),
        (false, _) => mma_state_smem(k, bv, lo, db),
    };
    state.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, state_smem as i32).w()?;
    // P is bf16 (with a lo half for f32 inputs); U is fp32 for f32 inputs, and T2 (bf16) in its
    // place for bf16 ones; only f32 inputs have a W (bf16 pairs).
    let u_cols = if lo { v } else { CHUNK };
    let null = 0u64;
    // SAFETY (every allocation below): the first launch writes every row of W, U, P, G and the
    // pairs before the second reads them (rows past a chunk's length are never read: the state
    // pass zero-fills them).
    let bf16_rows = |n: usize| -> Result<_> { Ok(unsafe { dev.alloc::<bf16>(rows * n) }?) };
    let mut p = bf16_rows(hv * CHUNK)?;
    // f32 inputs only: W, W's and P's lo halves, q's pairs and the decayed keys' pairs.
    let mut pairs = if lo {
        Some([
            bf16_rows(hv * k)?,
            bf16_rows(hv * k)?,
            bf16_rows(hv * CHUNK)?,
            bf16_rows(h * k)?,
            bf16_rows(h * k)?,
            bf16_rows(hv * k)?,
            bf16_rows(hv * k)?,
        ])
    } else {
        None
    };
    // o is in the inputs' dtype: f32, or bf16 as fla returns it for bf16 inputs.
    macro_rules! launch {
        ($ty:ty) => {{
            let mut u = unsafe { dev.alloc::<$ty>(rows * hv * u_cols) }?;
            // SAFETY: the state pass writes every row of every chunk.
            let mut o = unsafe { dev.alloc::<$ty>(rows * hv * v) }?;
            with_view!(q, qv, $ty, {
                with_view!(kk, kv, $ty, {
                    with_view!(vv, vv_, $ty, {
                        with_view!(beta, bv_, {
                            with_mixer_gate!(g, gp, {
                                match &prep {
                                    Prep::Warpgroup(f, smem) | Prep::Pairs(f, smem) => {
                                        let mut l = f.builder();
                                        l.arg(&qv).arg(&kv).arg(&bv_);
                                        push_gate(&mut l, &gp);
                                        l.arg(&crow_d).arg(&clen_d).arg(&mut u).arg(&mut p).arg(&mut gc);
                                        for i in &ints[..3] {
                                            l.arg(i);
                                        }
                                        let (heads, threads) = if matches!(prep, Prep::Pairs(..)) { (hv / 2, 256) } else { (hv, 128) };
                                        unsafe { l.launch(grid(chunks, heads, 1, threads, *smem as u32)) }.w()?;
                                    }
                                    Prep::OneHead(f, smem) => {
                                        let mut l = f.builder();
                                        l.arg(&qv).arg(&kv).arg(&vv_).arg(&bv_);
                                        push_gate(&mut l, &gp);
                                        l.arg(&crow_d).arg(&clen_d);
                                        match &mut pairs {
                                            Some([w, wl, pl, qh, ql, kd, kdl]) => {
                                                l.arg(w).arg(wl).arg(&mut u).arg(&mut p).arg(pl).arg(qh).arg(ql).arg(kd).arg(kdl);
                                            }
                                            None => {
                                                l.arg(&null).arg(&null).arg(&mut u).arg(&mut p);
                                                for _ in 0..5 {
                                                    l.arg(&null);
                                                }
                                            }
                                        }
                                        l.arg(&mut gc);
                                        for i in &ints {
                                            l.arg(i);
                                        }
                                        l.arg(&ldv);
                                        unsafe { l.launch(grid(chunks, hv, 1, 256, *smem as u32)) }.w()?;
                                    }
                                }
                            });
                            let mut l = state.builder();
                            match &pairs {
                                Some([w, wl, pl, qh, ql, kd, kdl]) => {
                                    l.arg(qh).arg(ql).arg(kd).arg(kdl).arg(&u).arg(w).arg(wl).arg(&p).arg(pl);
                                }
                                None => {
                                    l.arg(&qv).arg(&kv).arg(&vv_).arg(&ldv).arg(&u).arg(&p);
                                }
                            }
                            l.arg(&gc).arg(&mut *words).arg(&cu).arg(&sl).arg(&snap_d).arg(&has_snap).arg(&mut o);
                            for i in &ints {
                                l.arg(i);
                            }
                            l.arg(&x.scale);
                            unsafe { l.launch(grid(v.div_ceil(bv), hv, slots.len(), threads, state_smem as u32)) }.w()?;
                            if ws {
                                WS_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            if split {
                                SPLIT_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        })
                    })
                })
            });
            wrap(&dev, o, (rows, hv, v))
        }};
    }
    Ok(if lo { launch!(f32) } else { launch!(bf16) })
}
