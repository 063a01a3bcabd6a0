//! Launcher of a prefill's short conv and its q/k preparation in one pass (`conv_prep.cu`): the
//! conv's q and k columns are normalised where they are computed, with the bits of the conv's
//! launch followed by the prep's.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::conv::ConvTables;
use super::{alloc_rows, cuda_dev, f32c, first_element_address_any, func, grid, modules, wrap, DeviceSlots, GateInputs, RowsArg, Switch};
use crate::ops::{Prepared, QkLayout};
use crate::{Capture, PackedTables, Result};

/// The fused pass on (`DELTASERVE_CONV_PREP=0`: the conv's launch and the prep's, for
/// comparisons).
static CONV_PREP: Switch = Switch::new("DELTASERVE_CONV_PREP");

/// Turns the fused pass on or off for the process (GPU tests compare the two paths).
pub fn set_conv_prep(on: bool) {
    CONV_PREP.set(on);
}

/// Fused launches made by this process (tests check that a path took it).
static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many fused conv + prep launches this process has made.
pub fn conv_prep_launches() -> u64 {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Threads a block (`conv_prep.cu`'s `CP_THREADS`: a warp a group of K columns over a tile of rows).
const THREADS: usize = 128;

/// Rows a warp takes at head dim `k` (128 or 256; `conv_prep.cu` says why these).
fn rows_a_warp(k: usize) -> usize {
    if k == 128 {
        8
    } else {
        4
    }
}

/// What the fused pass computes beside the conv.
pub struct ConvPrepInputs<'a> {
    /// Where q and k sit in the conv's columns; v follows them.
    pub layout: QkLayout,
    /// v's columns, after q's and k's.
    pub v_width: usize,
    /// β's input `[N, nb]`, read in place.
    pub b: &'a Tensor,
    /// β's factor (2 with `allow_neg_eigval`).
    pub beta_mult: f32,
    /// The gate's inputs, if the model has one.
    pub gate: Option<GateInputs<'a>>,
}

/// Causal conv (+ SiLU) of packed sequences `x` `[Σ T, C]` as [`super::conv_prefill`] computes it,
/// with q and k then prepared as [`super::prep`] prepares them, in one launch: returns the
/// [`Prepared`] q, k, β and gate and v `[Σ T, v_width]` (bf16 with `narrow`, else f32), and
/// updates the slots' conv states (and the captures') as the conv does. `None` where the pass
/// does not take the inputs (switched off, a conv width other than 4, K other than 128 or 256,
/// v not whole groups of K, an f32 `x` or one whose rows are not 16-byte aligned, or `b` and the
/// gate's input in another dtype than `x`): the caller runs the two launches.
#[allow(clippy::too_many_arguments)]
pub fn conv_prep(
    x: &Tensor,
    weight: &Tensor,
    states: &mut DeviceSlots,
    cu_seqlens: &[usize],
    slots: &[usize],
    captures: &[Capture],
    silu: bool,
    narrow: bool,
    fixed: Option<&PackedTables>,
    inputs: ConvPrepInputs<'_>,
) -> Result<Option<(Prepared, Tensor)>> {
    let QkLayout { q_heads: qh, k_heads: kh, head_dim: k } = inputs.layout;
    let (rows, c) = x.dims2()?;
    let (vw, w) = (inputs.v_width, weight.dim(1)?);
    let dtypes_agree = inputs.b.dtype() == x.dtype() && inputs.gate.as_ref().is_none_or(|g| g.a.dtype() == x.dtype());
    let takes = CONV_PREP.on()
        && w == 4
        && matches!(k, 128 | 256)
        && vw.is_multiple_of(k)
        && c == (qh + kh) * k + vw
        && matches!(x.dtype(), DType::BF16 | DType::F16)
        && dtypes_agree
        && rows > 0;
    if !takes {
        return Ok(None);
    }
    let dev = cuda_dev(x, "conv_prep")?;
    let (xa, bv) = (RowsArg::new(x)?, RowsArg::new(inputs.b)?);
    let weight = f32c(weight)?;
    // The kernel reads a channel's four weights as one 16-byte access.
    if !first_element_address_any(&weight)?.is_multiple_of(16) {
        return Ok(None);
    }
    // The kernel copies x's rows 16 bytes at a time.
    if !xa.ptr.is_multiple_of(16) || !(xa.ld as usize * xa.elem_bytes).is_multiple_of(16) {
        return Ok(None);
    }
    let tables = ConvTables::new(&dev, "conv_prep", rows, cu_seqlens, slots, captures, fixed)?;
    let narrow = narrow && xa.suffix == "bf16";
    let out = if narrow { DType::BF16 } else { DType::F32 };
    // The kernel writes every element of q, k, v, β and (with a gate) g.
    let (q, kk, v) = (alloc_rows(&dev, out, rows, qh * k)?, alloc_rows(&dev, out, rows, kh * k)?, alloc_rows(&dev, out, rows, vw)?);
    let nb = inputs.b.dim(1)?;
    let (av, al, db, ng) = match &inputs.gate {
        Some(g) => (Some(RowsArg::new(g.a)?), Some(f32c(g.a_log)?), Some(f32c(g.dt_bias)?), g.a.dim(1)?),
        None => (None, None, None, 0),
    };
    // SAFETY: the kernel writes every element it returns.
    let (mut beta, mut g) = unsafe { (dev.alloc::<f32>(rows * nb)?, dev.alloc::<f32>((rows * ng).max(1))?) };
    let tile = rows_a_warp(k);
    let name = format!("conv_prep_{}{}_k{k}", xa.suffix, if narrow { "_narrow" } else { "" });
    let f = func(&dev, &name, &modules::CONV_PREP)?;
    let addr = |t: &Option<Tensor>| t.as_ref().map(first_element_address_any).transpose().map(|a| a.unwrap_or(0));
    let (a_ptr, a_ld) = av.as_ref().map_or((0, 0), |a| (a.ptr, a.ld));
    let (al_ptr, db_ptr) = (addr(&al)?, addr(&db)?);
    let (w_ptr, q_ptr, k_ptr, v_ptr) = (
        first_element_address_any(&weight)?,
        first_element_address_any(&q)?,
        first_element_address_any(&kk)?,
        first_element_address_any(&v)?,
    );
    let ints = [slots.len() as i32, qh as i32, kh as i32, vw as i32, nb as i32, ng as i32, rows as i32, silu as i32];
    let mut l = f.builder();
    l.arg(&xa.ptr).arg(&xa.ld).arg(&w_ptr).arg(states.state_words("conv")?).arg(&tables.cu).arg(&tables.slots);
    l.arg(&ints[0]).arg(&ints[1]).arg(&ints[2]).arg(&ints[3]).arg(&q_ptr).arg(&k_ptr).arg(&v_ptr);
    l.arg(&bv.ptr).arg(&bv.ld).arg(&mut beta).arg(&ints[4]).arg(&inputs.beta_mult);
    l.arg(&a_ptr).arg(&a_ld).arg(&al_ptr).arg(&db_ptr).arg(&mut g).arg(&ints[5]).arg(&ints[6]).arg(&ints[7]);
    // A warp for each group of K columns of each tile of rows.
    let warps = rows.div_ceil(tile) * (qh + kh + vw / k);
    // Each warp's shared tile: its rows and the three before them.
    let smem = (THREADS / 32) * (tile + 3) * k * xa.elem_bytes;
    unsafe { l.launch(grid(warps.div_ceil(THREADS / 32), 1, 1, THREADS as u32, smem as u32)) }.w()?;
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tables.write_states(&dev, &xa, states, c, w)?;
    let prepared = Prepared {
        q: q.reshape((rows, qh, k))?,
        k: kk.reshape((rows, kh, k))?,
        beta: wrap(&dev, beta, (rows, nb)),
        g: (ng > 0).then(|| wrap(&dev, g, (rows, ng))),
    };
    Ok(Some((prepared, v)))
}
