//! Launchers of the paged-attention kernels (`kernels/cuda/attention.cu`, the tiles in
//! `attention_tiles.cu`): RoPE and the append into the cache (f32, bf16 or f16), then either the
//! fp32 row kernel (decode; prefill of f32 models) with its split combine, or a tensor-core
//! tile kernel (prefill of bf16/f16 models whose cache is in their own type): on the warpgroup
//! tensor cores (`attention_wg.cu`) where the shape allows, else on mma.sync.

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{
    alloc_rows, cuda_dev, device_address, f32c, first_element_address_any, func, grid, index_address, modules, sm_count, wrap, DeviceSlots,
    RowsArg, Switch,
};
use crate::cpu::attention::{AttentionShape, Paged};
use crate::ops::attention::{AttnOutput, DevicePages, QkNorms, RopeArgs};
use crate::{KernelError, Result};

/// Key splits a query row is cut into by the row kernel at most (`MAX_SPLITS` in attention.cu).
const MAX_SPLITS: usize = 16;
/// Row-kernel blocks an SM a launch aims at when it picks its split count: a few an SM keep
/// enough loads in flight, and each split more adds its partial result's write and read.
const TARGET_BLOCKS_PER_SM: usize = 4;

/// The row kernel's split count for `blocks` (row, head group) pairs: all of them in
/// batch-invariant mode (a row's result must not depend on the launch), else enough for
/// [`TARGET_BLOCKS_PER_SM`]; `DELTASERVE_ATTN_SPLITS` fixes it (for comparisons).
fn row_splits(blocks: usize, sms: usize) -> usize {
    let forced = env_count!("DELTASERVE_ATTN_SPLITS");
    if crate::ops::batch_invariant() {
        return MAX_SPLITS;
    }
    if let Some(s) = forced {
        return s.clamp(1, MAX_SPLITS);
    }
    (TARGET_BLOCKS_PER_SM * sms).div_ceil(blocks.max(1)).clamp(1, MAX_SPLITS)
}

/// Whether a decode step's attention runs its append inside the row kernel (`attn_decode_*`):
/// on unless `DELTASERVE_ATTN_FUSED_DECODE=0` (for comparisons) or [`set_fused_decode`] says
/// otherwise.
fn fused_decode_on() -> bool {
    FUSED_DECODE.on()
}
static FUSED_DECODE: Switch = Switch::new("DELTASERVE_ATTN_FUSED_DECODE");

/// Turns the fused decode kernel on or off for the process (the GPU test compares the two paths
/// bit for bit).
#[doc(hidden)]
pub fn set_fused_decode(on: bool) {
    FUSED_DECODE.set(on);
}

/// Whether a prefill's attention at d = 256 takes two query heads of one KV head a block
/// (`attn_tiles_*_d256_h2`, the key and value tiles copied once for both): where the query
/// heads of a KV head are even in number, unless `DELTASERVE_ATTN_HEAD_PAIRS=0` or
/// [`set_attn_head_pairs`] turned it off.
fn head_pairs(hd: usize, hq: usize, hkv: usize) -> bool {
    hd == 256 && hkv > 0 && hq.is_multiple_of(hkv) && (hq / hkv).is_multiple_of(2) && HEAD_PAIRS.on()
}
static HEAD_PAIRS: Switch = Switch::new("DELTASERVE_ATTN_HEAD_PAIRS");

/// Turns the two-head prefill attention blocks on or off for the process (the GPU test compares
/// the two bit for bit).
#[doc(hidden)]
pub fn set_attn_head_pairs(on: bool) {
    HEAD_PAIRS.set(on);
}

/// Whether a prefill's attention runs on the warpgroup tensor cores (`attn_wg_*`,
/// attention_wg.cu): head dims 128 and 256 with an even number of query heads to each KV head,
/// from an sm_90a image, unless `DELTASERVE_ATTN_WG=0` or [`set_attn_warpgroup`] turned it off.
/// All of that is the model's, so a sequence takes the same kernel whatever it is packed with.
fn warpgroup_tiles(hd: usize, hq: usize, hkv: usize) -> bool {
    let even_groups = hkv > 0 && hq.is_multiple_of(hkv) && (hq / hkv).is_multiple_of(2);
    matches!(hd, 128 | 256) && even_groups && modules::ATTENTION_WG.is_sass() && WG_TILES.on()
}
static WG_TILES: Switch = Switch::new("DELTASERVE_ATTN_WG");

/// Turns the warpgroup prefill attention on or off for the process (the GPU test compares it with
/// the mma.sync tile kernel).
#[doc(hidden)]
pub fn set_attn_warpgroup(on: bool) {
    WG_TILES.set(on);
}

/// Launches of the warpgroup prefill attention in this process (the GPU test checks that the
/// kernel it compares did run).
static WG_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many warpgroup prefill attention launches this process has made.
#[doc(hidden)]
pub fn attn_warpgroup_launches() -> usize {
    WG_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Dynamic shared memory of `attn_wg_*_d{hd}` (`AwSmem` in attention_wg.cu): Q of two heads and
/// two buffers each of K and V, `[64, hd]` 16-bit tiles, two tiles' key offsets and counts, four
/// mbarriers, and 1 KB for the swizzle's alignment.
fn wg_smem(hd: usize) -> usize {
    6 * TILE_M * hd * 2 + 2 * TILE_N * std::mem::size_of::<u64>() + 16 + 32 + 1024
}

/// Warps a block of the append kernel, one a (row, head) pair (attention.cu's `APPEND_WARPS`).
const APPEND_WARPS: usize = 8;

/// Query rows of one row-kernel launch (bounds its partial-result buffer).
const ROWS_PER_LAUNCH: usize = 1024;
/// Query rows of one tile of the tensor-core kernel (`TILE_M`).
const TILE_M: usize = crate::ops::ATTENTION_TILE_ROWS;
const TILE_N: usize = 64;
const TILE_THREADS: u32 = 128;

/// Dynamic shared memory of `attn_tiles_*_d{hd}` with `hp` query heads a block (`TileSmem` in
/// attention_tiles.cu): a Q tile a head, K and V tiles of 16-bit values, rows padded by 8
/// values, and two tiles' key offsets.
fn tile_smem(hd: usize, hp: usize) -> usize {
    (hp * TILE_M + 2 * TILE_N) * (hd + 8) * 2 + 2 * TILE_N * std::mem::size_of::<u64>()
}

/// The kernels' name for a cache element type.
fn type_name(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        DType::F16 => Ok("f16"),
        other => Err(KernelError::Shape {
            op: "paged_attention",
            input: "cache",
            expected: "f32, bf16 or f16".into(),
            actual: vec![other.size_in_bytes()],
        }),
    }
}

fn address<T>(s: &candle_core::cuda_backend::cudarc::driver::CudaSlice<T>) -> u64 {
    let (ptr, _sync) = s.device_ptr(s.stream());
    ptr
}

/// Blocks of the tile kernel an SM holds: the warpgroup kernel and two query heads a block hold
/// one, one head two.
fn tiles_per_sm(hd: usize, hq: usize, hkv: usize) -> (usize, usize) {
    if warpgroup_tiles(hd, hq, hkv) || head_pairs(hd, hq, hkv) {
        (2, 1)
    } else {
        (1, 2)
    }
}

/// Tiles a block of the tile kernel takes for a list of `count` entries: two (long tiles paired
/// with short ones) where one a block would take more than one wave.
fn tiles_per_block(count: usize, hd: usize, hq: usize, hkv: usize, sms: usize) -> usize {
    let (hp, per_sm) = tiles_per_sm(hd, hq, hkv);
    if count * (hq / hp) > per_sm * sms {
        2
    } else {
        1
    }
}

/// The tile kernel's list for `pass`, flattened (first row, rows, first position, slot), and the
/// tiles a block takes: tiles of up to 64 rows, never across sequences, those with the most keys
/// first so that the short ones fill the last wave, paired long with short where a block takes
/// two. With `capacity` (a fixed buffer's), the blocks for it, empty ones (rows 0) after the
/// pass's own.
fn tile_list(shape: &AttentionShape, pass: &Paged<'_>, sms: usize, capacity: Option<usize>) -> Result<(Vec<i32>, usize)> {
    let mut tiles: Vec<[i32; 4]> = Vec::new();
    for (s, seq) in pass.seqs.iter().enumerate() {
        for n0 in (pass.cu[s]..pass.cu[s + 1]).step_by(TILE_M) {
            let cnt = TILE_M.min(pass.cu[s + 1] - n0);
            tiles.push([n0 as i32, cnt as i32, (seq.start + n0 - pass.cu[s]) as i32, seq.slot as i32]);
        }
    }
    let keys = |t: &[i32; 4]| {
        let last = t[2] + t[1];
        shape.window.map_or(last, |w| last.min(w as i32 + t[1]))
    };
    tiles.sort_by_key(|t| std::cmp::Reverse(keys(t)));
    let (hd, hq, hkv) = (shape.head_dim, shape.q_heads, shape.kv_heads);
    if let Some(cap) = capacity {
        if tiles.len() > cap {
            return Err(KernelError::Shape {
                op: "paged_attention",
                input: "tiles",
                expected: format!("at most {cap} tiles (the fixed list's capacity)"),
                actual: vec![tiles.len()],
            });
        }
    }
    let per_block = tiles_per_block(capacity.unwrap_or(tiles.len()), hd, hq, hkv, sms);
    let mut flat: Vec<i32> = if per_block == 2 {
        let half = tiles.len().div_ceil(2);
        let (long, short) = tiles.split_at(half);
        let mut short = short.iter().rev();
        long.iter().flat_map(|l| [*l, short.next().copied().unwrap_or([0; 4])]).flatten().collect()
    } else {
        tiles.into_iter().flatten().collect()
    };
    if let Some(cap) = capacity {
        flat.resize(cap * 4, 0);
    }
    Ok((flat, per_block))
}

/// A fixed tile list's device address and entries: `[capacity · 4]` i32 for an even capacity,
/// starting at a 16-byte boundary (the kernels read each tile as one int4).
fn fixed_list(buf: &Tensor) -> Result<(u64, usize)> {
    let n = buf.elem_count();
    if buf.dtype() != DType::I32 || !n.is_multiple_of(8) || n == 0 {
        return Err(KernelError::Shape {
            op: "paged_attention",
            input: "tiles",
            expected: "[capacity · 4] i32 for an even capacity".into(),
            actual: buf.dims().to_vec(),
        });
    }
    let ptr = device_address::<i32>(buf)?;
    if ptr % 16 != 0 {
        return Err(KernelError::Shape {
            op: "paged_attention",
            input: "tiles",
            expected: "a list starting at a 16-byte boundary".into(),
            actual: vec![(ptr % 16) as usize],
        });
    }
    Ok((ptr, n / 4))
}

/// The tile kernel's list for `pass` at `shape` in a fixed buffer's layout: `[capacity · 4]`
/// i32, the blocks a launch of that capacity takes, empty tiles after the pass's own.
pub fn fixed_tiles(shape: &AttentionShape, pass: &Paged<'_>, capacity: usize, dev: &candle_core::Device) -> Result<Vec<i32>> {
    let candle_core::Device::Cuda(d) = dev else {
        return Err(KernelError::UnsupportedDevice { op: "attention tiles", device: format!("{dev:?}") });
    };
    if !capacity.is_multiple_of(2) {
        return Err(KernelError::Shape {
            op: "attention tiles",
            input: "capacity",
            expected: "an even count".into(),
            actual: vec![capacity],
        });
    }
    Ok(tile_list(shape, pass, sm_count(d)?, Some(capacity))?.0)
}

/// Whether the tensor-core kernel takes this pass: bf16/f16 operands with the cache in the same
/// type, a head dim it was compiled for, and some sequence with more than one new row.
fn tiles_apply(operands: DType, cache: DType, pass: &Paged<'_>, hd: usize) -> bool {
    let multi_row = pass.cu.windows(2).any(|w| w[1] - w[0] > 1);
    matches!(operands, DType::BF16 | DType::F16) && cache == operands && multi_row && matches!(hd, 64 | 128 | 256)
}

/// The append kernel's inputs (`struct QkvRows` in attention.cu), passed by value as a
/// `__grid_constant__` parameter.
#[repr(C)]
#[derive(Clone, Copy)]
struct QkvArgs {
    q: u64,
    k: u64,
    v: u64,
    ldq: i64,
    ldk: i64,
    ldv: i64,
    q_norm: u64,
    k_norm: u64,
    eps: f32,
    /// The C++ struct's tail padding, spelled out.
    _pad: i32,
}

// attention.cu asserts the same size and offsets for `struct QkvRows`.
const _: () = assert!(std::mem::size_of::<QkvArgs>() == 72 && std::mem::offset_of!(QkvArgs, q_norm) == 48);

// SAFETY: plain `#[repr(C)]` integers and floats, laid out as the kernels' `struct QkvRows`.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for QkvArgs {}

/// `t` (`[N, H, hd]` or `[N, H·hd]`) as rows the append kernel reads in place, in `dtype`.
fn qkv_rows(t: &Tensor, dtype: DType) -> Result<RowsArg> {
    let n = t.dim(0)?;
    let t = t.to_dtype(dtype)?;
    let t = if t.rank() == 2 { t } else { t.contiguous()?.reshape((n, ()))? };
    RowsArg::new(&t)
}

/// Appends `k`, `v` (RoPE on k, after its per-head RMSNorm when `norms` has one) at each row's
/// position and attends with `q` (likewise). `q`, `k`, `v` are `[N, H, hd]` or `[N, H·hd]` in
/// f32, bf16 or f16, rows read in place (column slices of the layer's projection). Returns `[N,
/// HQ, hd]` as `output` says (the row kernel's combine gates and rounds as it writes). Shapes
/// were checked by the caller.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    norms: Option<QkNorms<'_>>,
    shape: &AttentionShape,
    rope: Option<RopeArgs<'_>>,
    pass: &Paged<'_>,
    pages: &DevicePages<'_>,
    (k_cache, v_cache): (&mut DeviceSlots, &mut DeviceSlots),
    output: AttnOutput<'_>,
) -> Result<Tensor> {
    const OP: &str = "paged_attention";
    let dev = cuda_dev(q, OP)?;
    let (hq, hkv, hd) = (shape.q_heads, shape.kv_heads, shape.head_dim);
    let n = q.dim(0)?;
    if hd > 256 {
        return Err(KernelError::Shape { op: OP, input: "q", expected: "head dim ≤ 256".into(), actual: vec![hd] });
    }
    if n == 0 {
        return Ok(Tensor::zeros((n, hq, hd), output.dtype, q.device())?);
    }
    // One input type for the three (they are slices of one projection); any other → f32.
    let input = if q.dtype() == k.dtype() && k.dtype() == v.dtype() && matches!(q.dtype(), DType::BF16 | DType::F16) {
        q.dtype()
    } else {
        DType::F32
    };
    let (qa, ka, va) = (qkv_rows(q, input)?, qkv_rows(k, input)?, qkv_rows(v, input)?);
    let norm_weights = norms.map(|n| -> Result<_> { Ok((f32c(n.q)?, f32c(n.k)?, n.eps)) }).transpose()?;
    let (q_norm, k_norm, eps) = match &norm_weights {
        Some((qn, kn, eps)) => (device_address::<f32>(qn)?, device_address::<f32>(kn)?, *eps),
        None => (0, 0, 0.0),
    };
    let qkv = QkvArgs { q: qa.ptr, k: ka.ptr, v: va.ptr, ldq: qa.ld, ldk: ka.ld, ldv: va.ld, q_norm, k_norm, eps, _pad: 0 };
    let inv_freq = rope.map(|r| f32c(r.inv_freq)).transpose()?;
    let (rot, freq_ptr) = match (&rope, &inv_freq) {
        (Some(r), Some(f)) => (r.rotary_dim as i32, device_address::<f32>(f)?),
        _ => (0, 0u64),
    };
    let (tables, slot_ptr, pos_ptr) = (device_address::<i32>(pages.tables)?, index_address(pages.row_slot)?, index_address(pages.row_pos)?);
    let (width, bs) = (pages.width as i32, pass.block_size as i32);
    let (hqi, hkvi, hdi) = (hq as i32, hkv as i32, hd as i32);
    let window = shape.window.map_or(0, |w| w as i32);
    if k_cache.dtype() != v_cache.dtype() {
        return Err(KernelError::Shape {
            op: OP,
            input: "v cache",
            expected: format!("{:?} as the k cache", k_cache.dtype()),
            actual: vec![],
        });
    }
    let cache = type_name(k_cache.dtype())?;
    let (kc, vc) = (address(&k_cache.data), address(&v_cache.data));
    let tiles = tiles_apply(shape.operands, k_cache.dtype(), pass, hd);
    // A decode step (one new row a sequence, q, k and v in the cache's type): the row kernel's
    // blocks do the append's work, one launch fewer.
    let fused = !tiles && input == k_cache.dtype() && pass.cu.windows(2).all(|w| w[1] - w[0] == 1) && fused_decode_on();
    // SAFETY: the append kernel writes every element.
    let q_rot = if fused { None } else { Some(unsafe { dev.alloc::<f32>(n * hq * hd) }?) };
    let q_rot_ptr = q_rot.as_ref().map_or(0, address);
    if !fused {
        let append = func(&dev, &format!("attn_append_{cache}_{}", qa.suffix), &modules::ATTENTION)?;
        // A warp for each (row, head), APPEND_WARPS a block (attention.cu).
        let ni = n as i32;
        let mut l = append.builder();
        l.arg(&qkv).arg(&q_rot_ptr).arg(&kc).arg(&vc).arg(&tables).arg(&width).arg(&bs);
        l.arg(&slot_ptr).arg(&pos_ptr).arg(&freq_ptr).arg(&rot).arg(&hqi).arg(&hkvi).arg(&hdi).arg(&ni);
        unsafe { l.launch(grid((n * (hq + hkv)).div_ceil(APPEND_WARPS), 1, 1, 32 * APPEND_WARPS as u32, 0)) }.w()?;
    }

    if tiles {
        // SAFETY: every element is written by the tile kernel.
        let out = unsafe { dev.alloc::<f32>(n * hq * hd) }?;
        let out_ptr = address(&out);
        let sms = sm_count(&dev)?;
        // A CUDA graph's pass reads its list from a fixed buffer filled before each replay; an
        // eager pass uploads its own (kept alive until the launch is enqueued).
        let (_listed, tiles_ptr, entries, per_block) = match pages.tiles {
            Some(buf) => {
                let (ptr, cap) = fixed_list(buf)?;
                (None, ptr, cap, tiles_per_block(cap, hd, hq, hkv, sms))
            }
            None => {
                let (list, per_block) = tile_list(shape, pass, sms, None)?;
                let d = dev.cuda_stream().clone_htod(&list).w()?;
                let ptr = address(&d);
                (Some(d), ptr, list.len() / 4, per_block)
            }
        };
        let wg = warpgroup_tiles(hd, hq, hkv);
        let hp = tiles_per_sm(hd, hq, hkv).0;
        let (name, module, smem, threads) = if wg {
            (format!("attn_wg_{cache}_d{hd}"), &modules::ATTENTION_WG, wg_smem(hd), 3 * TILE_THREADS)
        } else {
            let name = format!("attn_tiles_{cache}_d{hd}{}", if hp == 2 { "_h2" } else { "" });
            (name, &modules::ATTENTION_TILES, tile_smem(hd, hp), TILE_THREADS * hp as u32)
        };
        let f = func(&dev, &name, module)?;
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
        let mut l = f.builder();
        let per_block_i = per_block as i32;
        l.arg(&q_rot_ptr).arg(&kc).arg(&vc).arg(&tables).arg(&width).arg(&bs).arg(&tiles_ptr).arg(&per_block_i);
        l.arg(&hqi).arg(&hkvi).arg(&window).arg(&shape.scale).arg(&out_ptr);
        unsafe { l.launch(grid(entries / per_block, hq / hp, 1, threads, smem as u32)) }.w()?;
        if wg {
            WG_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        return output.finish(wrap(&dev, out, (n, hq, hd)));
    }

    let group = hq / hkv;
    let gc = match group {
        1 => 1,
        2 => 2,
        _ => 4,
    };
    let kernel = if fused { "decode" } else { "rows" };
    let rows_fn = func(&dev, &format!("attn_{kernel}_{cache}_g{gc}"), &modules::ATTENTION)?;
    // The combine writes the output: gated and in its dtype (checked by the caller).
    let out = alloc_rows(&dev, output.dtype, n, hq * hd)?;
    let out_ptr = first_element_address_any(&out)?;
    let out_bytes = output.dtype.size_in_bytes() as u64;
    let gate = output.gate.map(RowsArg::new).transpose()?;
    let (gate_ptr, ldg, gate_bytes) = gate.as_ref().map_or((0, 0, 0), |g| (g.ptr, g.ld, g.elem_bytes as u64));
    let combine = func(&dev, &format!("attn_combine_{}", type_name(output.dtype)?), &modules::ATTENTION)?;
    let chunk = n.min(ROWS_PER_LAUNCH);
    let head_groups = hkv * group.div_ceil(gc);
    let splits = row_splits(chunk * head_groups, sm_count(&dev)?);
    let splits_i = splits as i32;
    // SAFETY: the row kernel writes every split's (max, sum) and every non-empty split's output
    // before the combine reads them; the combine loads an empty split's output slot but never uses it.
    let part = unsafe { dev.alloc::<f32>(chunk * hq * splits * hd) }?;
    let ml = unsafe { dev.alloc::<f32>(chunk * hq * splits * 2) }?;
    let (part_ptr, ml_ptr) = (address(&part), address(&ml));
    let f32b = std::mem::size_of::<f32>() as u64;
    for r0 in (0..n).step_by(ROWS_PER_LAUNCH) {
        let rows = ROWS_PER_LAUNCH.min(n - r0);
        let q_at = q_rot_ptr + (r0 * hq * hd) as u64 * f32b;
        let (slot_at, pos_at) = (slot_ptr + r0 as u64 * 4, pos_ptr + r0 as u64 * 4);
        // The fused kernel's rows of q, k and v from row r0 on.
        let elem = input.size_in_bytes() as u64;
        let at = |ptr: u64, ld: i64| ptr + r0 as u64 * ld as u64 * elem;
        let qkv_at = QkvArgs { q: at(qkv.q, qkv.ldq), k: at(qkv.k, qkv.ldk), v: at(qkv.v, qkv.ldv), ..qkv };
        let mut l = rows_fn.builder();
        if fused {
            l.arg(&qkv_at);
        } else {
            l.arg(&q_at);
        }
        l.arg(&kc).arg(&vc).arg(&tables).arg(&width).arg(&bs).arg(&slot_at).arg(&pos_at);
        if fused {
            l.arg(&freq_ptr).arg(&rot);
        }
        l.arg(&hqi).arg(&hkvi).arg(&hdi).arg(&window).arg(&shape.scale).arg(&splits_i).arg(&part_ptr).arg(&ml_ptr);
        unsafe { l.launch(grid(rows, head_groups, splits, 128, 0)) }.w()?;
        let out_at = out_ptr + (r0 * hq * hd) as u64 * out_bytes;
        let gate_at = if gate_ptr == 0 { 0 } else { gate_ptr + r0 as u64 * ldg as u64 * gate_bytes };
        let mut l = combine.builder();
        l.arg(&part_ptr).arg(&ml_ptr).arg(&out_at).arg(&gate_at).arg(&ldg).arg(&hqi).arg(&hdi).arg(&splits_i);
        unsafe { l.launch(grid(rows * hq, 1, 1, hd.next_multiple_of(32).min(256) as u32, 0)) }.w()?;
    }
    Ok(out.reshape((n, hq, hd))?)
}
