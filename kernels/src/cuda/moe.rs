//! Launcher of the sparse MoE kernels (`kernels/cuda/moe.cu`): routing, grouping by expert,
//! the grouped expert projections and the weighted combine, all sized by the batch alone (no
//! host round trip), so a decode step holding them can be captured as a CUDA graph.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::Tensor;

use super::{alloc_rows, cuda_dev, first_element_address_any, func, grid, modules, RowsArg};
use crate::ops::moe::{ExpertWeights, SharedExpert};
use crate::{KernelError, Result};

const THREADS: usize = 256;
const WARPS: usize = THREADS / 32;
/// Output columns a warp computes (`MOE_COLS`).
const COLS: usize = 2;
/// Rows and columns of a tensor-core tile (`TC_M`, `TC_N`).
const TC_TILE: usize = 64;

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
    // Row tiles of the tensor-core path: at most ⌈P / 64⌉ + E, as (expert, first row) pairs.
    let max_tiles = pairs.div_ceil(TC_TILE) + e;
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

    let f = func(&dev, &format!("moe_route_{suffix}"), &modules::MOE)?;
    let mut l = f.builder();
    l.arg(&la.ptr).arg(&la.ld).arg(&alli).arg(&ki).arg(&norm).arg(&first).arg(&ei).arg(&ids).arg(&weights);
    unsafe { l.launch(grid(n, 1, 1, THREADS as u32, (4 * all) as u32)) }.w()?;

    // Prompts (8 or more rows an expert on average) on the tensor cores; decode steps as
    // weight-streaming GEMVs over each expert's few rows.
    // Batch-invariant mode keeps every pair on the GEMVs: a row's sums then never depend on
    // how many rows the batch routes to its expert.
    let tensor_cores =
        !crate::ops::batch_invariant() && suffix != "f32" && pairs >= 8 * all && d.is_multiple_of(32) && i.is_multiple_of(32);
    let f = func(&dev, "moe_sort", &modules::MOE)?;
    let mut l = f.builder();
    let tci = i32::from(tensor_cores);
    l.arg(&ids).arg(&pi).arg(&gi).arg(&ei).arg(&offsets).arg(&order).arg(&pos).arg(&tci);
    l.arg(&tiles).arg(&ntiles).arg(&active).arg(&nactive);
    unsafe { l.launch(grid(1, 1, 1, 1024, (8 * groups) as u32)) }.w()?;

    let (gu, dn) = (first_element_address_any(experts.gate_up)?, first_element_address_any(experts.down)?);
    let (hp, yp, op) = (first_element_address_any(&h)?, first_element_address_any(&y)?, first_element_address_any(&out)?);
    if tensor_cores {
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
        unsafe { l.launch(grid(d.div_ceil(WARPS * COLS), most_active, 1, THREADS as u32, 0)) }.w()?;
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
    unsafe { l.launch(grid(n, 1, 1, THREADS as u32, 0)) }.w()?;
    Ok(out)
}
