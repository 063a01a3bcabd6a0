//! The skinny GEMM (a decode step's projections at 4–64 rows, W and x streamed by the tensor
//! memory accelerator into the warpgroup tensor cores) against the f32 math on the CPU, in every
//! block shape compiled and every x-row tile, at the models' narrow and wide shapes, an odd N and
//! x a column slice; its f32 output the unrounded accumulators of its rounded one; each row the
//! same bits whatever rows come with it; the ops taking it exactly where they should; and the
//! shapes it declines.

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::cuda::{skinny_gemm, skinny_launches, SkinnyConfig, SkinnyOut, SKINNY_MAX_ROWS};
use deltaserve_kernels::ops::{linear, linear_f32_into, linear_parts, skinny_linear, SKINNY_LINEAR_MAX_ROWS, SMALL_BATCH_LINEAR_MAX_ROWS};
use deltaserve_tests::values;
use rand::{Rng, SeedableRng};

/// Within the output's rounding (2⁻⁸ of its magnitude for bf16, 2⁻¹¹ for f16) plus the f32
/// sums' order, as `gpu_gemm_matches_cpu` bounds cuBLAS; for an f32 output, the sums' order only.
fn assert_close(got: &Tensor, want: &[f32], dtype: DType, k: usize, what: &str) {
    let unit = match (got.dtype(), dtype) {
        (DType::F32, _) => 0.0,
        (_, DType::BF16) => 2f32.powi(-8),
        _ => 2f32.powi(-11),
    };
    let abs_sum = 0.05 * k as f32;
    for (i, (g, w)) in values(got).iter().zip(want).enumerate() {
        let tol = unit * w.abs() + 1e-5 * abs_sum;
        assert!((g - w).abs() <= tol, "{what}: element {i}: {g} against {w} (tolerance {tol})");
    }
}

/// The tests' random source, seeded; panics on a build without the skinny GEMM's sm_90a code.
fn hopper_rng(seed: u64) -> rand::rngs::StdRng {
    if !deltaserve_kernels::cuda::skinny_gemm_available() {
        panic!("the skinny GEMM needs an sm_90a build (a Hopper GPU): this build has none");
    }
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A CPU f32 tensor of `dims` uniform in (-r, r).
fn uniform_in(rng: &mut rand::rngs::StdRng, dims: &[usize], r: f32) -> Tensor {
    let v: Vec<f32> = (0..dims.iter().product::<usize>()).map(|_| rng.random_range(-r..r)).collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

/// Every block shape the kernel compiles, each stage count's extremes, and W's eviction hint.
fn configs() -> Vec<SkinnyConfig> {
    let mut all = Vec::new();
    for warpgroups in [1, 2] {
        for splits in [1, 2, 4, 8] {
            for stages in [2, 5] {
                all.push(SkinnyConfig { warpgroups, splits, stages, evict_first: false });
            }
        }
    }
    all.push(SkinnyConfig { warpgroups: 2, splits: 4, stages: 8, evict_first: true });
    all
}

pub fn gpu_skinny_gemm_matches_cpu(dev: &Device) {
    let mut rng = hopper_rng(47);
    let mut uniform = |dims: &[usize], r: f32| uniform_in(&mut rng, dims, r);
    // (N, K, the column x starts at in a wider tensor: 0 for x contiguous): the narrow
    // projections, an odd N, a fused projection padded to 64 rows and one not.
    let shapes = [(2048usize, 4096usize, 0usize), (2048, 6144, 8), (2048, 5632, 0), (1000, 2048, 24), (9280, 2048, 0), (12352, 1024, 8)];
    for (n, k, from) in shapes {
        for dtype in [DType::BF16, DType::F16] {
            let wide = k + if from > 0 { 40 } else { 0 };
            let x_all = uniform(&[SKINNY_MAX_ROWS, wide], 1.0).to_dtype(dtype).unwrap();
            let w = uniform(&[n, k], 0.05).to_dtype(dtype).unwrap();
            let (xg_all, wg) = (x_all.to_device(dev).unwrap().narrow(1, from, k).unwrap(), w.to_device(dev).unwrap());
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = values(&f(&x_all.narrow(1, from, k).unwrap()).matmul(&f(&w).t().unwrap()).unwrap());
            for cfg in configs().into_iter().map(Some).chain([None]) {
                let what = format!("{dtype:?} n={n} k={k} from column {from} {cfg:?}");
                let Some(full) = skinny_gemm(&xg_all, &wg, SkinnyOut::Rows, cfg).unwrap() else {
                    assert!(cfg.is_some_and(|c| !c.takes(k)), "{what}: declined a shape it takes");
                    continue;
                };
                assert!(cfg.is_none_or(|c| c.takes(k)), "{what}: took K not in whole tiles a slice");
                assert_eq!((full.dims(), full.dtype()), (&[SKINNY_MAX_ROWS, n][..], dtype), "{what}: shape");
                assert_close(&full, &want, dtype, k, &what);
                // The f32 output: the accumulators the rounded output was rounded from.
                let acc = skinny_gemm(&xg_all, &wg, SkinnyOut::F32, cfg).unwrap().expect("the same shape in f32");
                assert_close(&acc, &want, dtype, k, &format!("{what} (f32)"));
                assert_eq!(values(&acc.to_dtype(dtype).unwrap()), values(&full), "{what}: the f32 output rounds to the rounded one");
                // As slices (no cluster): their sum is the product, each row's slices the same
                // bits whatever rows come with it.
                if let Some(c) = cfg.filter(|c| c.splits > 1) {
                    let parts = skinny_gemm(&xg_all, &wg, SkinnyOut::Parts, Some(c)).unwrap().expect("the same shape as slices");
                    assert_eq!(parts.dims(), &[c.splits, SKINNY_MAX_ROWS, n], "{what}: slices' shape");
                    assert_close(&parts.sum(0).unwrap(), &want, dtype, k, &format!("{what} (slices)"));
                    let few = skinny_gemm(&xg_all.narrow(0, 3, 30).unwrap(), &wg, SkinnyOut::Parts, Some(c)).unwrap().expect("slices");
                    assert_eq!(values(&few), values(&parts.narrow(1, 3, 30).unwrap()), "{what}: rows 3..33's slices alone");
                }
                // Every x-row tile (16, 32, 64 rows) and partial ones: each row the bits it has
                // among all 64.
                for (start, len) in [(0usize, 1usize), (5, 4), (3, 16), (20, 17), (31, 32), (1, 33), (0, 64)] {
                    let part =
                        skinny_gemm(&xg_all.narrow(0, start, len).unwrap(), &wg, SkinnyOut::Rows, cfg).unwrap().expect("the same shape");
                    assert_eq!(values(&part), values(&full.narrow(0, start, len).unwrap()), "{what}: rows {start}..{} alone", start + len);
                }
            }
            // The ops: from SMALL_BATCH_LINEAR_MAX_ROWS + 1 rows to SKINNY_LINEAR_MAX_ROWS the
            // kernel's result; `linear` runs it there, `linear_parts` gives its f32 output as one
            // slice and `linear_f32_into` writes it.
            let (first, last) = (SMALL_BATCH_LINEAR_MAX_ROWS + 1, SKINNY_LINEAR_MAX_ROWS);
            for m in [first - 1, first, 16, last, last + 1] {
                let xg = if m <= SKINNY_MAX_ROWS {
                    xg_all.narrow(0, 0, m).unwrap()
                } else {
                    Tensor::cat(&[&xg_all, &xg_all.narrow(0, 0, 1).unwrap()], 0).unwrap()
                };
                let what = format!("{dtype:?} n={n} k={k} m={m}");
                let by_op = skinny_linear(&xg, &wg).unwrap();
                assert_eq!(by_op.is_some(), (first..=last).contains(&m), "{what}: the op's rows");
                let Some(y) = by_op else { continue };
                assert_eq!(values(&linear(&xg, &wg).unwrap()), values(&y), "{what}: ops::linear runs it");
                let acc = skinny_gemm(&xg, &wg, SkinnyOut::F32, None).unwrap().expect("the same shape in f32");
                let parts = linear_parts(&xg, &wg).unwrap().expect("slices");
                let s = parts.dim(0).unwrap();
                assert!(s >= 2 && parts.dims() == [s, m, n], "{what}: linear_parts' slices {:?}", parts.dims());
                assert_close(&parts.sum(0).unwrap(), &want[..m * n], dtype, k, &format!("{what}: linear_parts' sum"));
                let out = Tensor::zeros((m, n), DType::F32, dev).unwrap();
                assert!(linear_f32_into(&xg, &wg, &out).unwrap(), "{what}: linear_f32_into refused");
                assert_eq!(values(&out), values(&acc), "{what}: linear_f32_into writes the f32 output");
            }
        }
        println!("GPU skinny GEMM n={n} k={k}: within the output's rounding of the CPU in every block shape; rows independent of M");
    }
    let on = |t: Tensor| t.to_device(dev).unwrap();
    let bf = |t: Tensor| on(t.to_dtype(DType::BF16).unwrap());
    let (x, w) = (bf(uniform(&[8, 264], 1.0)), bf(uniform(&[64, 264], 1.0)));
    assert!(skinny_gemm(&x, &w, SkinnyOut::Rows, None).unwrap().is_none(), "K = 264 is not whole 64-wide tiles");
    let (x, w) = (bf(uniform(&[65, 512], 1.0)), bf(uniform(&[64, 512], 1.0)));
    assert!(skinny_gemm(&x, &w, SkinnyOut::Rows, None).unwrap().is_none(), "65 rows exceed the n64 tile");
    let (x, w) = (on(uniform(&[8, 512], 1.0)), on(uniform(&[64, 512], 1.0)));
    assert!(skinny_gemm(&x, &w, SkinnyOut::Rows, None).unwrap().is_none(), "f32 is left to cuBLAS");
    let (x, w) = (bf(uniform(&[8, 512], 1.0)), bf(uniform(&[64, 512], 1.0)));
    let one_tile = SkinnyConfig { warpgroups: 1, splits: 8, stages: 2, evict_first: false };
    assert!(skinny_gemm(&x, &w, SkinnyOut::Rows, Some(one_tile)).unwrap().is_none(), "one k tile a slice");
    let before = skinny_launches();
    let off = super::gemm::SkinnySwitch::set(false);
    assert!(skinny_linear(&x, &w).unwrap().is_none(), "turned off, the op still took the kernel");
    linear(&x, &w).unwrap();
    drop(off);
    assert_eq!(skinny_launches(), before, "turned off, a launch ran");
    assert!(skinny_linear(&x, &w).unwrap().is_some(), "turned back on, the op declined");
}

/// SwiGLU in the skinny GEMM's epilogue (an MLP's `[gate | up]` at 4–16 rows): equal bit for bit
/// to the GEMM at one K slice followed by the swiglu kernel, at the 1.39B's and Qwen3.5's MLP
/// shapes, an I that leaves a block part gate rows and a padded weight, x a column slice, every
/// stage count's extremes and W's eviction hint, bf16 and f16; each row the same bits whatever
/// rows come with it; within bf16's rounding of the CPU's f32 math; the op taking it at exactly
/// the skinny GEMM's rows and standing aside when turned off; and the shapes it declines.
pub fn gpu_skinny_swiglu_equals_gemm_then_swiglu(dev: &Device) {
    use deltaserve_kernels::cuda::{set_skinny_swiglu, skinny_swiglu};
    use deltaserve_kernels::ops::{skinny_swiglu as op, swiglu};
    let mut rng = hopper_rng(61);
    let mut uniform = |dims: &[usize], r: f32| uniform_in(&mut rng, dims, r);
    // (I, K, W's padding rows, the column x starts at in a wider tensor)
    for (i, k, pad, from) in [(5632usize, 2048usize, 0usize, 0usize), (6144, 2048, 0, 8), (200, 1024, 48, 0), (128, 512, 0, 24)] {
        for dtype in [DType::BF16, DType::F16] {
            let x_all = uniform(&[SKINNY_MAX_ROWS, k + 40], 1.0).to_dtype(dtype).unwrap();
            let w = uniform(&[2 * i + pad, k], 0.05).to_dtype(dtype).unwrap();
            let (xg_all, wg) = (x_all.to_device(dev).unwrap().narrow(1, from, k).unwrap(), w.to_device(dev).unwrap());
            let what = format!("{dtype:?} I={i} K={k} padding {pad} from column {from}");
            let mut shapes: Vec<Option<SkinnyConfig>> =
                [2, 8].iter().map(|&stages| Some(SkinnyConfig { warpgroups: 1, splits: 1, stages, evict_first: false })).collect();
            shapes.push(Some(SkinnyConfig { warpgroups: 1, splits: 1, stages: 5, evict_first: true }));
            shapes.push(None);
            for cfg in shapes {
                let what = format!("{what} {cfg:?}");
                let gemm_cfg = cfg.unwrap_or(SkinnyConfig { warpgroups: 1, splits: 1, stages: 4, evict_first: false });
                let y = skinny_gemm(&xg_all, &wg, SkinnyOut::Rows, Some(gemm_cfg)).unwrap().expect("the GEMM takes the shape");
                let two = swiglu(&y.narrow(1, 0, i).unwrap(), &y.narrow(1, i, i).unwrap()).unwrap();
                let full = skinny_swiglu(&xg_all, &wg, i, cfg).unwrap().expect("the kernel takes the shape");
                assert_eq!((full.dims(), full.dtype()), (&[SKINNY_MAX_ROWS, i][..], dtype), "{what}: shape");
                assert_eq!(values(&full), values(&two), "{what}: against the GEMM then swiglu");
                for (start, len) in [(0usize, 1usize), (5, 4), (3, 16), (20, 17), (1, 33), (0, 64)] {
                    let part = skinny_swiglu(&xg_all.narrow(0, start, len).unwrap(), &wg, i, cfg).unwrap().expect("the same shape");
                    assert_eq!(values(&part), values(&full.narrow(0, start, len).unwrap()), "{what}: rows {start}..{} alone", start + len);
                }
            }
            // A sanity bound against the CPU's f32 math (the bits are pinned above).
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let yc = f(&x_all.narrow(1, from, k).unwrap()).matmul(&f(&w.narrow(0, 0, 2 * i).unwrap()).t().unwrap()).unwrap();
            let want = (yc.narrow(1, 0, i).unwrap().silu().unwrap() * yc.narrow(1, i, i).unwrap()).unwrap();
            let got = skinny_swiglu(&xg_all, &wg, i, None).unwrap().unwrap();
            let e = deltaserve_tests::rel_err(&values(&got), &values(&want));
            println!("GPU skinny SwiGLU {what}: bit for bit the GEMM then swiglu; {e:.2e} from the CPU");
            assert!(e <= 2e-2, "{what}: {e:.3e} from the CPU");
            // The op: the skinny GEMM's rows only, the kernel's result there, nothing when off.
            for m in [SMALL_BATCH_LINEAR_MAX_ROWS, SMALL_BATCH_LINEAR_MAX_ROWS + 1, SKINNY_LINEAR_MAX_ROWS, SKINNY_LINEAR_MAX_ROWS + 1] {
                let x = xg_all.narrow(0, 0, m).unwrap();
                let by_op = op(&x, &wg, i).unwrap();
                let takes = (SMALL_BATCH_LINEAR_MAX_ROWS + 1..=SKINNY_LINEAR_MAX_ROWS).contains(&m);
                assert_eq!(by_op.is_some(), takes, "{what} m={m}: the op's rows");
                if let Some(a) = by_op {
                    assert_eq!(values(&a), values(&skinny_swiglu(&x, &wg, i, None).unwrap().unwrap()), "{what} m={m}: the op's result");
                }
            }
        }
    }
    let on = |t: Tensor| t.to_device(dev).unwrap();
    let bf = |t: Tensor| on(t.to_dtype(DType::BF16).unwrap());
    let (x, w) = (bf(uniform(&[8, 512], 1.0)), bf(uniform(&[256, 512], 1.0)));
    let split = SkinnyConfig { warpgroups: 1, splits: 2, stages: 2, evict_first: false };
    assert!(skinny_swiglu(&x, &w, 128, Some(split)).unwrap().is_none(), "a split of K");
    let two_wg = SkinnyConfig { warpgroups: 2, splits: 1, stages: 2, evict_first: false };
    assert!(skinny_swiglu(&x, &w, 128, Some(two_wg)).unwrap().is_none(), "two warpgroups");
    assert!(skinny_swiglu(&x, &w, 129, None).unwrap().is_none(), "W shorter than 2I");
    assert!(skinny_swiglu(&on(uniform(&[8, 512], 1.0)), &on(uniform(&[256, 512], 1.0)), 128, None).unwrap().is_none(), "f32");
    assert!(skinny_swiglu(&bf(uniform(&[8, 264], 1.0)), &bf(uniform(&[256, 264], 1.0)), 128, None).unwrap().is_none(), "K = 264");
    set_skinny_swiglu(false);
    let off = op(&x, &w, 128).unwrap();
    set_skinny_swiglu(true);
    assert!(off.is_none(), "turned off, the op still took the kernel");
    assert!(op(&x, &w, 128).unwrap().is_some(), "turned back on, the op declined");
}

/// The decode step's short conv in the skinny GEMM's epilogue (a delta-rule layer's input
/// projection at 4–16 rows): y equal bit for bit to the GEMM at one K slice, the conv's output and
/// every slot's conv state to `conv_step` on y's first C columns, at the 1.39B's and Qwen3.5's
/// input projections and a C that ends inside a block, 4–33 rows, slots inline and from device
/// memory, SiLU and none, bf16 and f16; the conv within f32 rounding of the CPU's conv step; the
/// op taking it at exactly the skinny GEMM's rows; and the calls it declines leaving the states
/// as they were.
pub fn gpu_skinny_conv_equals_gemm_then_conv_step(dev: &Device) {
    use deltaserve_kernels::cuda::skinny_conv_launches;
    use deltaserve_kernels::ops::{conv_step, skinny_conv_linear, ConvStepFold};
    use deltaserve_kernels::{ConvActivation, SlotBuffer, StepSlots};
    let mut rng = hopper_rng(67);
    let mut uniform = |dims: &[usize], r: f32| uniform_in(&mut rng, dims, r);
    let pool = 40usize;
    let one_slice = SkinnyConfig { warpgroups: 1, splits: 1, stages: 4, evict_first: false };
    // (N, K, C)
    for (n, k, c) in [(9280usize, 2048usize, 6144usize), (12352, 2048, 8192), (520, 512, 200)] {
        let (x_all, w, cw) = (uniform(&[33, k], 1.0), uniform(&[n, k], 0.05), uniform(&[c, 4], 1.0));
        let init: Vec<Vec<f32>> = (0..pool).map(|_| values(&uniform(&[c, 4], 2.0))).collect();
        let fresh = |device: &Device| deltaserve_tests::slots_holding(&init, c * 4, device);
        let all = |states: &SlotBuffer| deltaserve_tests::every_slot(states, pool);
        for dtype in [DType::BF16, DType::F16] {
            let on = |t: &Tensor| t.to_device(dev).unwrap();
            let (xg, wg, cwg) = (on(&x_all.to_dtype(dtype).unwrap()), on(&w.to_dtype(dtype).unwrap()), on(&cw));
            for (b, act, device_slots) in [
                (4usize, ConvActivation::Silu, false),
                (9, ConvActivation::Identity, true),
                (16, ConvActivation::Silu, true),
                (33, ConvActivation::Silu, false),
            ] {
                // Distinct slots in a shuffled order.
                let slots: Vec<usize> = (0..b).map(|i| (i * 7 + 3) % pool).collect();
                let ids: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
                let dev_ids = Tensor::from_vec(ids, b, dev).unwrap();
                let step = StepSlots { host: &slots, device: device_slots.then_some(&dev_ids) };
                let what = format!("{dtype:?} N={n} K={k} C={c} B={b} {act:?} device slots {device_slots}");
                let x = xg.narrow(0, 0, b).unwrap();
                let mut folded = fresh(dev);
                let states = folded.device_slots().expect("GPU states");
                let fold = deltaserve_kernels::cuda::ConvFold { weight: &cwg, states, slots: step, silu: act == ConvActivation::Silu };
                let (y, cy) =
                    deltaserve_kernels::cuda::skinny_conv(&x, &wg, fold, None).unwrap().unwrap_or_else(|| panic!("{what}: declined"));
                let mut apart = fresh(dev);
                let y2 = skinny_gemm(&x, &wg, SkinnyOut::Rows, Some(one_slice)).unwrap().expect("the GEMM takes the shape");
                let c2 = conv_step(&y2.narrow(1, 0, c).unwrap(), &cwg, &mut apart, step, act).unwrap();
                assert_eq!((cy.dims(), cy.dtype()), (&[b, c][..], DType::F32), "{what}: conv output shape");
                assert_eq!(values(&y), values(&y2), "{what}: y against the GEMM's");
                assert_eq!(values(&cy), values(&c2), "{what}: the conv against conv_step on y");
                assert_eq!(all(&folded), all(&apart), "{what}: every slot's conv state");
                let mut cpu = fresh(&Device::Cpu);
                let want = conv_step(&y2.narrow(1, 0, c).unwrap().to_device(&Device::Cpu).unwrap(), &cw, &mut cpu, &slots, act).unwrap();
                let e = deltaserve_tests::rel_err(&values(&cy), &values(&want));
                assert!(e <= 1e-6, "{what}: {e:.3e} from the CPU's conv step");
                assert_eq!(all(&folded), all(&cpu), "{what}: conv states against the CPU's");
                // The op: the skinny GEMM's rows only.
                let mut by_op = fresh(dev);
                let before = skinny_conv_launches();
                let fold = ConvStepFold { weight: &cwg, states: &mut by_op, slots: step, act };
                let got = skinny_conv_linear(&x, &wg, fold).unwrap();
                let takes = (SMALL_BATCH_LINEAR_MAX_ROWS + 1..=SKINNY_LINEAR_MAX_ROWS).contains(&b);
                assert_eq!(got.is_some(), takes, "{what}: the op's rows");
                assert_eq!(skinny_conv_launches() - before, u64::from(takes), "{what}: the op's launches");
                match got {
                    Some((yo, co)) => {
                        assert_eq!((values(&yo), values(&co)), (values(&y), values(&cy)), "{what}: the op's result");
                        assert_eq!(all(&by_op), all(&folded), "{what}: the op's states");
                    }
                    None => assert_eq!(all(&by_op), init, "{what}: declined by the op, the states stay"),
                }
            }
            println!(
                "GPU short conv in the skinny GEMM {dtype:?} N={n} C={c}: equal bit for bit to the GEMM then conv_step (B = 4, 9, 16, 33)"
            );
            // Declined: width 3, C past N; the states stay as they were.
            let slots = [0usize, 1, 2, 3];
            let x4 = xg.narrow(0, 0, 4).unwrap();
            let mut narrow3 = SlotBuffer::zeros_on(pool, c * 3, dev).unwrap();
            let cw3 = on(&cw.narrow(1, 0, 3).unwrap().contiguous().unwrap());
            let fold = ConvStepFold { weight: &cw3, states: &mut narrow3, slots: (&slots).into(), act: ConvActivation::Silu };
            assert!(skinny_conv_linear(&x4, &wg, fold).unwrap().is_none(), "width 3 is left to the two steps");
            let mut states = fresh(dev);
            let w_short = on(&w.narrow(0, 0, c - 8).unwrap().to_dtype(dtype).unwrap());
            let fold = ConvStepFold { weight: &cwg, states: &mut states, slots: (&slots).into(), act: ConvActivation::Silu };
            assert!(skinny_conv_linear(&x4, &w_short, fold).unwrap().is_none(), "C past N is declined");
            assert_eq!(all(&states), init, "declined calls leave the states untouched");
        }
    }
}
