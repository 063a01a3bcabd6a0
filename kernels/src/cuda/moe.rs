//! Launcher of the sparse MoE kernels (`kernels/cuda/moe.cu`): routing, grouping by expert,
//! the grouped expert projections and the weighted combine, all sized by the batch alone (no
//! host round trip), so a decode step holding them can be captured as a CUDA graph.

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::Tensor;

use super::{alloc_rows, cuda_dev, first_element_address_any, func, grid, modules, RowsArg, Switch};
use crate::ops::moe::{ExpertWeights, SharedExpert};
use crate::{KernelError, Result};

const THREADS: usize = 256;
const WARPS: usize = THREADS / 32;
/// Output columns a warp computes: the up projection's (`MOE_COLS`), the down projection's
/// (`MOE_DOWN_COLS`).
const COLS: usize = 2;
const DOWN_COLS: usize = 4;
/// Rows and columns of a tensor-core tile (`TC_M`, `TC_N`).
const TC_TILE: usize = 64;
/// Pairs a block of the sort scatters (`moe_count` / `moe_sort`), and its threads
/// (`MOE_SORT_THREADS`).
const SORT_SLICE: usize = 2048;
const SORT_THREADS: u32 = 1024;

/// Rows of a tile of `moe_wg.cu` (`MW_ROWS`), and its threads: four warpgroups.
const WG_TILE: usize = 128;
const WG_THREADS: usize = 512;
/// `moe_wg.cu`'s dynamic shared memory: four stages of A's 128 and B's 256 rows of 128 bytes, and
/// 1 KB for the swizzle's alignment.
const WG_SMEM: usize = 4 * (WG_TILE + 256) * 128 + 1024;

/// Whether a prompt's grouped projections run on the warpgroup tensor cores (`moe_wg.cu`, the
/// same bits as the wmma tiles): from an sm_90a image, with both projections' K (`d` and `i`)
/// multiples of 64 (a K-step is one 128-byte swizzle row). `DELTASERVE_MOE_WG=0` or
/// [`set_moe_warpgroup`] keeps the wmma tiles.
fn warpgroup_tiles(d: usize, i: usize) -> bool {
    d.is_multiple_of(64) && i.is_multiple_of(64) && modules::MOE_WG.is_sass() && MOE_WG.on()
}
static MOE_WG: Switch = Switch::new("DELTASERVE_MOE_WG");

/// Turns the warpgroup MoE tiles on (where eligible) or off for the process: the GPU test compares
/// them with the wmma tiles.
#[doc(hidden)]
pub fn set_moe_warpgroup(on: bool) {
    MOE_WG.set(on);
}

/// Launches of the warpgroup MoE tiles (up and down projections each count) in this process.
static WG_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many warpgroup MoE tile launches this process has made (the GPU test checks that the path
/// it compares did run).
#[doc(hidden)]
pub fn moe_warpgroup_launches() -> usize {
    WG_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

fn shape_err(input: &'static str, expected: String, actual: &[usize]) -> KernelError {
    KernelError::Shape { op: "sparse_moe", input, expected, actual: actual.to_vec() }
}

/// [`crate::ops::sparse_moe`] on the device, shapes already checked by it: route, sort,
/// grouped up (SwiGLU fused), grouped down, combine; five launches. The grouped projections run
/// on the tensor cores for 16-bit prompts, as GEMVs for decode steps.
pub fn sparse_moe(
    x: &Tensor,
    logits: &Tensor,
    experts: ExpertWeights<'_>,
    k: usize,
    normalise: bool,
    shared: Option<SharedExpert<'_>>,
) -> Result<Tensor> {
    let dev = cuda_dev(x, "sparse_moe")?;
    // Shapes and k were checked by the op; what is left is what the kernels need.
    let (n, d) = x.dims2()?;
    // `e` experts held here, the router's `all`: a choice of one not held goes to group `e`,
    // which no kernel computes.
    let (e, two_i, _) = experts.gate_up.dims3()?;
    let all = logits.dims2()?.1;
    let i = two_i / 2;
    if all > 4096 {
        return Err(shape_err("experts", "at most 4096 experts (the routing kernel's shared memory)".into(), &[all]));
    }
    let dtype = x.dtype();
    if [experts.gate_up.dtype(), experts.down.dtype(), logits.dtype()].iter().any(|&t| t != dtype)
        || !experts.gate_up.is_contiguous()
        || !experts.down.is_contiguous()
    {
        return Err(shape_err("experts", format!("contiguous, in x's dtype {dtype:?}"), experts.gate_up.dims()));
    }
    let xa = RowsArg::new(x)?;
    if !xa.vectorisable(8, d) || !i.is_multiple_of(8) {
        return Err(shape_err("x", "rows of a multiple of 8 elements, 16-byte aligned; I a multiple of 8".into(), &[d, i]));
    }
    let la = RowsArg::new(logits)?;
    let suffix = xa.suffix;
    let pairs = n * k;
    // SAFETY (all of them): each is written by the kernel that produces it before any reads (of
    // `tiles` and `active` the sort writes only the list the chosen path reads, its first ntiles
    // or nactive entries, and only those are read).
    let ids = unsafe { dev.alloc::<i32>(pairs) }?;
    let weights = unsafe { dev.alloc::<f32>(pairs) }?;
    let groups = if all > e { e + 1 } else { e };
    let offsets = unsafe { dev.alloc::<i32>(groups + 1) }?;
    let order = unsafe { dev.alloc::<i32>(pairs) }?;
    let pos = unsafe { dev.alloc::<i32>(pairs) }?;
    // Prompts (8 or more rows an expert on average) on the tensor cores; decode steps as
    // weight-streaming GEMVs over each expert's few rows.
    // Batch-invariant mode keeps every pair on the GEMVs: a row's sums then never depend on
    // how many rows the batch routes to its expert.
    let tensor_cores =
        !crate::ops::batch_invariant() && suffix != "f32" && pairs >= 8 * all && d.is_multiple_of(32) && i.is_multiple_of(32);
    let warpgroup = tensor_cores && warpgroup_tiles(d, i);
    let tile_rows = if warpgroup { WG_TILE } else { TC_TILE };
    // Row tiles of the tensor-core path: at most ⌈P / rows⌉ + E, as (expert, first row) pairs.
    let max_tiles = pairs.div_ceil(tile_rows) + e;
    let tiles = unsafe { dev.alloc::<i32>(2 * max_tiles) }?;
    let ntiles = unsafe { dev.alloc::<i32>(1) }?;
    // The held experts with rows (at most one a pair): the GEMVs' grid rows.
    let most_active = e.min(pairs);
    let active = unsafe { dev.alloc::<i32>(most_active) }?;
    let nactive = unsafe { dev.alloc::<i32>(1) }?;
    let h = alloc_rows(&dev, dtype, pairs, i)?;
    let y = alloc_rows(&dev, candle_core::DType::F32, pairs, d)?;
    let out = alloc_rows(&dev, dtype, n, d)?;
    let (ei, ki, ii, di) = (e as i32, k as i32, i as i32, d as i32);
    let (pi, norm, alli, gi, first) = (pairs as i32, i32::from(normalise), all as i32, groups as i32, experts.first as i32);

    // A warp a token, as many warps a block as 48 KB of probabilities hold (up to eight).
    let route_warps = (48 * 1024 / (4 * all)).clamp(1, WARPS);
    let f = func(&dev, &format!("moe_route_{suffix}"), &modules::MOE)?;
    let mut l = f.builder();
    let ni = n as i32;
    l.arg(&la.ptr).arg(&la.ld).arg(&ni).arg(&alli).arg(&ki).arg(&norm).arg(&first).arg(&ei).arg(&ids).arg(&weights);
    unsafe { l.launch(grid(n.div_ceil(route_warps), 1, 1, (32 * route_warps) as u32, (4 * all * route_warps) as u32)) }.w()?;

    // The sort's scatter spread over a block a SORT_SLICE pairs, counted first when there are
    // several (a decode step's pairs take one block, which counts them itself).
    let sort_blocks = pairs.div_ceil(SORT_SLICE).max(1);
    let counted = i32::from(sort_blocks > 1);
    // SAFETY: read by the sort only when counted, after moe_count wrote all of it.
    let counts = unsafe { dev.alloc::<i32>(if sort_blocks > 1 { sort_blocks * groups } else { 1 }) }?;
    if sort_blocks > 1 {
        let f = func(&dev, "moe_count", &modules::MOE)?;
        let mut l = f.builder();
        l.arg(&ids).arg(&pi).arg(&gi).arg(&counts);
        unsafe { l.launch(grid(sort_blocks, 1, 1, SORT_THREADS, (4 * groups) as u32)) }.w()?;
    }
    let f = func(&dev, "moe_sort", &modules::MOE)?;
    let mut l = f.builder();
    let (tci, tri) = (i32::from(tensor_cores), tile_rows as i32);
    l.arg(&ids).arg(&pi).arg(&gi).arg(&ei).arg(&counts).arg(&counted).arg(&offsets).arg(&order).arg(&pos).arg(&tci).arg(&tri);
    l.arg(&tiles).arg(&ntiles).arg(&active).arg(&nactive);
    unsafe { l.launch(grid(sort_blocks, 1, 1, SORT_THREADS, (8 * (groups + 1)) as u32)) }.w()?;

    let (gu, dn) = (first_element_address_any(experts.gate_up)?, first_element_address_any(experts.down)?);
    let (hp, yp, op) = (first_element_address_any(&h)?, first_element_address_any(&y)?, first_element_address_any(&out)?);
    if warpgroup {
        // Four warpgroups a CTA, two on each 64 rows: 128 h columns (64 each, gate and up rows
        // side by side), or 256 output columns of the down projection.
        // Each entry with the dynamic shared memory its stages take.
        let wg_func = |name: &str| -> Result<_> {
            let f = func(&dev, &format!("{name}_{suffix}"), &modules::MOE_WG)?;
            f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, WG_SMEM as i32).w()?;
            Ok(f)
        };
        let f = wg_func("moe_up_wg")?;
        let mut l = f.builder();
        l.arg(&xa.ptr).arg(&xa.ld).arg(&order).arg(&ki).arg(&offsets).arg(&tiles).arg(&ntiles).arg(&gu).arg(&ii).arg(&di).arg(&hp);
        unsafe { l.launch(grid(max_tiles, i.div_ceil(128), 1, WG_THREADS as u32, WG_SMEM as u32)) }.w()?;
        let f = wg_func("moe_down_wg")?;
        let mut l = f.builder();
        l.arg(&hp).arg(&offsets).arg(&tiles).arg(&ntiles).arg(&dn).arg(&di).arg(&ii).arg(&yp);
        unsafe { l.launch(grid(max_tiles, d.div_ceil(256), 1, WG_THREADS as u32, WG_SMEM as u32)) }.w()?;
        WG_LAUNCHES.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
    } else if tensor_cores {
        let f = func(&dev, &format!("moe_up_tc_{suffix}"), &modules::MOE)?;
        let mut l = f.builder();
        l.arg(&xa.ptr).arg(&xa.ld).arg(&order).arg(&ki).arg(&offsets).arg(&tiles).arg(&ntiles).arg(&gu).arg(&ii).arg(&di).arg(&hp);
        unsafe { l.launch(grid(max_tiles, i.div_ceil(TC_TILE), 1, THREADS as u32, 0)) }.w()?;
        let f = func(&dev, &format!("moe_down_tc_{suffix}"), &modules::MOE)?;
        let mut l = f.builder();
        l.arg(&hp).arg(&offsets).arg(&tiles).arg(&ntiles).arg(&dn).arg(&di).arg(&ii).arg(&yp);
        unsafe { l.launch(grid(max_tiles, d.div_ceil(TC_TILE), 1, THREADS as u32, 0)) }.w()?;
    } else {
        let f = func(&dev, &format!("moe_up_{suffix}"), &modules::MOE)?;
        let mut l = f.builder();
        l.arg(&xa.ptr).arg(&xa.ld).arg(&order).arg(&ki).arg(&offsets).arg(&active).arg(&nactive).arg(&gu).arg(&ii).arg(&di).arg(&hp);
        unsafe { l.launch(grid(i.div_ceil(WARPS * COLS), most_active, 1, THREADS as u32, 0)) }.w()?;
        let f = func(&dev, &format!("moe_down_{suffix}"), &modules::MOE)?;
        let mut l = f.builder();
        l.arg(&hp).arg(&offsets).arg(&active).arg(&nactive).arg(&dn).arg(&di).arg(&ii).arg(&yp);
        unsafe { l.launch(grid(d.div_ceil(WARPS * DOWN_COLS), most_active, 1, THREADS as u32, 0)) }.w()?;
    }

    let shared_args = match shared {
        Some(s) => {
            if s.out.dtype() != dtype || s.gate.dtype() != dtype {
                return Err(shape_err("shared", format!("out and gate in x's dtype {dtype:?}"), s.out.dims()));
            }
            Some((RowsArg::new(s.out)?, RowsArg::new(s.gate)?))
        }
        None => None,
    };
    let (sp, sld, gp, gld) = match &shared_args {
        Some((o, g)) => (o.ptr, o.ld, g.ptr, g.ld),
        None => (0u64, 0i64, 0u64, 0i64),
    };
    let f = func(&dev, &format!("moe_combine_{suffix}"), &modules::MOE)?;
    let mut l = f.builder();
    l.arg(&yp).arg(&pos).arg(&weights).arg(&ki).arg(&sp).arg(&sld).arg(&gp).arg(&gld).arg(&op).arg(&di);
    // A decode batch's few tokens spread over column blocks; a prompt's many take a block each
    // (a column block a token slowed the MoE prefill by 2%: each thread loaded the pairs' weights
    // and positions for one column).
    let column_blocks = if n < 256 { d.div_ceil(THREADS) } else { 1 };
    unsafe { l.launch(grid(n, column_blocks, 1, THREADS as u32, 0)) }.w()?;
    Ok(out)
}
