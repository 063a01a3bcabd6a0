//! Launcher of the prefill's chunked gated delta rule on the tensor cores.

use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Tensor};

use super::{check_head_dim, cuda_dev, f32c, grid, ptx, push_gate, sm_count, table_addrs, wrap, DeviceSlots, GatePtr, CHUNK};
use crate::ops::MixerInputs;
use crate::packing::Part;
use crate::{Capture, PackedTables, Result};

/// Shared memory of the tensor-core kernels, in bytes (each buffer rounded up to 128 bytes, as
/// the kernels' allocator does).
fn tc_smem(parts: &[usize]) -> usize {
    parts.iter().map(|b| b.div_ceil(128) * 128).sum()
}

/// `chunk_tc_prep`: K and Q tiles, A and T (fp32), G and β. With `lo` (f32 inputs) every bf16
/// tile has a lo half, V blocks reuse the q tiles and T1, T2 have tiles of their own; with bf16
/// inputs T1 overwrites T and T2 goes straight to global memory.
fn tc_prep_smem(k: usize, lo: bool) -> usize {
    let kp = k.div_ceil(16) * 16 + 8;
    let (tile16, tile32) = (2 * CHUNK * 72, 4 * CHUNK * 72);
    let kt = 2 * CHUNK * kp;
    let mut parts = vec![tile32, tile32, 4 * CHUNK, 4 * CHUNK, kt];
    if lo {
        let qt = kt.max(tile16);
        parts.extend([kt, qt, qt, tile16, tile16, tile16, tile16]);
    } else {
        parts.push(kt);
    }
    tc_smem(&parts)
}

/// `chunk_tc_state` (f32 inputs): S (fp32 and bf16), W, Q, P, two fp32 [64, BV] results, V'
/// and G; every bf16 tile with its lo half.
fn tc_state_smem(k: usize, bv: usize) -> usize {
    let k16 = k.div_ceil(16) * 16;
    let kt = 2 * CHUNK * (k16 + 8);
    let (sp, sb) = (bv + 4, bv + 8);
    let mut parts = vec![4 * k16 * sp, 4 * CHUNK * sp, 4 * CHUNK * sp, 4 * CHUNK];
    for t in [2 * k16 * sb, kt, kt, 2 * CHUNK * 72, 2 * CHUNK * sb] {
        parts.extend([t, t]);
    }
    tc_smem(&parts)
}

/// `chunk_mma_state` (bf16 inputs): W, Q and K tiles (K padded to the kernel's 16·KT), P, the
/// bf16 S, T2, V and V' (all bf16), G and the chunk's two decay vectors; with K ≤ 64 (KT = 4)
/// a second K, P, T2, V and G for the double-buffered load group.
fn mma_state_smem(k: usize, bv: usize) -> usize {
    let kt_tiles = mma_row_tiles(k);
    let k16 = 16 * kt_tiles;
    let kt = 2 * CHUNK * (k16 + 8);
    let sb = 2 * (bv + 8);
    let mut parts = vec![kt, kt, kt, 2 * CHUNK * 72, k16 * sb, 2 * CHUNK * 72, CHUNK * sb, CHUNK * sb, 12 * CHUNK];
    if kt_tiles <= 4 {
        parts.extend([kt, 2 * CHUNK * 72, 2 * CHUNK * 72, CHUNK * sb, 4 * CHUNK]);
    }
    tc_smem(&parts)
}

/// 16-row tiles of K `chunk_mma_state` is instantiated for: the smallest of 4, 8, 16 that holds K.
fn mma_row_tiles(k: usize) -> usize {
    [4, 8, 16].into_iter().find(|&kt| 16 * kt >= k).unwrap_or(16)
}

/// Largest dynamic shared memory per block on sm_90.
const MAX_SMEM: usize = 227 * 1024;

/// Value-tile width of the state pass, from `widths` (widest first): `DELTASERVE_TC_BV` when
/// set, offered and its shared memory (`smem(bv)`) fits; else the widest that fits and still
/// gives `ctas_per_tile × V/BV` CTAs enough to cover the `sms` multiprocessors (few long
/// sequences want narrow tiles for parallelism, many want wide ones for less recomputation);
/// else the narrowest that fits.
fn value_tile(widths: &[usize], smem: impl Fn(usize) -> usize, v: usize, ctas_per_tile: usize, sms: usize) -> usize {
    let fits = |bv: usize| smem(bv) <= MAX_SMEM;
    // Read once per process, not on every prefill call.
    let wanted = env_count!("DELTASERVE_TC_BV");
    if let Some(bv) = wanted.filter(|bv| widths.contains(bv) && fits(*bv)) {
        return bv;
    }
    let fitting: Vec<usize> = widths.iter().copied().filter(|&bv| fits(bv)).collect();
    let last = widths.last().copied().unwrap_or(16);
    fitting.iter().copied().find(|&bv| ctas_per_tile * v.div_ceil(bv) >= sms).or(fitting.last().copied()).unwrap_or(last)
}

/// Chunked prefill on the tensor cores (fp32 accumulation and state) of packed sequences:
/// sequence `s` owns rows `cu_seqlens[s]..cu_seqlens[s+1]` (one row per interleaved step; the
/// caller interleaves Gated DeltaProduct) and the state of `slots[s]`, read at the start and
/// written at the end. One launch computes every chunk's W, U, P and G in parallel, a second
/// carries the state through each sequence's chunks and writes `o` `[rows, HV, V]`. q's dtype
/// picks the precision: f32 splits every matmul operand into bf16 hi + lo (near fp32; the
/// engine's path), bf16 (k and v converted to it) uses single bf16 operands, as fla does.
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
    // The bf16 state pass reads v's rows at a stride: the value columns of the conv output are
    // taken where they lie when their rows are 16-byte aligned (no copy).
    let v_stride = |t: &Tensor| -> Result<Option<usize>> {
        let st = t.stride();
        let in_place = !lo
            && t.dtype() == DType::BF16
            && st[2] == 1
            && st[1] == v
            && st[0] >= hv * v
            && st[0].is_multiple_of(8)
            && v.is_multiple_of(8);
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
        return Ok(wrap(&dev, dev.alloc_zeros::<f32>(rows * hv * v)?, (rows, hv, v)));
    }
    // SAFETY: the state pass writes every row of every chunk.
    let mut o = unsafe { dev.alloc::<f32>(rows * hv * v) }?;
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

    let prep = dev.get_or_load_custom_func(&format!("chunk_tc_prep_{suffix}"), "chunk_prep", ptx::CHUNK_PREP)?;
    let smem = tc_prep_smem(k, lo);
    prep.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
    let sms = sm_count(&dev)?;
    // f32 inputs: the split-operand wmma state pass; bf16: the mma.sync one (state in registers).
    let (state, bv, state_smem) = if lo {
        let bv = value_tile(&[64, 32, 16], |bv| tc_state_smem(k, bv), v, slots.len() * hv, sms);
        let f = dev.get_or_load_custom_func(&format!("chunk_tc_state_f32_bv{bv}"), "chunk_state", ptx::CHUNK_STATE)?;
        (f, bv, tc_state_smem(k, bv))
    } else {
        let bv = value_tile(&[64, 32], |bv| mma_state_smem(k, bv), v, slots.len() * hv, sms);
        let kt = mma_row_tiles(k);
        let f = dev.get_or_load_custom_func(&format!("chunk_mma_state_k{kt}_bv{bv}"), "chunk_mma", ptx::CHUNK_MMA)?;
        (f, bv, mma_state_smem(k, bv))
    };
    state.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, state_smem as i32).w()?;
    // W, U (bf16: T2 in its place) and P are kept in the inputs' type (bf16 for bf16 inputs, as
    // fla keeps them).
    let u_cols = if lo { v } else { CHUNK };
    macro_rules! launch {
        ($ty:ty) => {{
            // Every row of W, U, P and G is written by the first launch before the second reads it.
            let mut w = unsafe { dev.alloc::<$ty>(rows * hv * k) }?;
            let mut u = unsafe { dev.alloc::<$ty>(rows * hv * u_cols) }?;
            let mut p = unsafe { dev.alloc::<$ty>(rows * hv * CHUNK) }?;
            with_view!(q, qv, $ty, {
                with_view!(kk, kv, $ty, {
                    with_view!(vv, vv_, $ty, {
                        with_view!(beta, bv_, {
                            with_mixer_gate!(g, gp, {
                                let mut l = prep.builder();
                                l.arg(&qv).arg(&kv).arg(&vv_).arg(&bv_);
                                push_gate(&mut l, &gp);
                                l.arg(&crow_d).arg(&clen_d).arg(&mut w).arg(&mut u).arg(&mut p).arg(&mut gc);
                                for i in &ints {
                                    l.arg(i);
                                }
                                unsafe { l.launch(grid(chunks, hv, 1, 256, smem as u32)) }.w()?;
                            });
                            let mut l = state.builder();
                            l.arg(&qv).arg(&kv);
                            if !lo {
                                l.arg(&vv_).arg(&ldv);
                            }
                            l.arg(&w)
                                .arg(&u)
                                .arg(&p)
                                .arg(&gc)
                                .arg(states.state_words("gated_delta_prefill")?)
                                .arg(&cu)
                                .arg(&sl)
                                .arg(&snap_d)
                                .arg(&has_snap)
                                .arg(&mut o);
                            for i in &ints {
                                l.arg(i);
                            }
                            l.arg(&x.scale);
                            unsafe { l.launch(grid(v.div_ceil(bv), hv, slots.len(), 256, state_smem as u32)) }.w()?;
                        })
                    })
                })
            })
        }};
    }
    if lo {
        launch!(f32)
    } else {
        launch!(bf16)
    }
    Ok(wrap(&dev, o, (rows, hv, v)))
}
