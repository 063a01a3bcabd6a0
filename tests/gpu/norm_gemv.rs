//! The norms folded into a decode step's projections (gemv_staged.cu) against the two kernels
//! they replace: the kernels at every B they take, and the ops that pick them where they win;
//! the short conv folded into the input projection against the projection and the conv step;
//! and SwiGLU formed by the fused `[gate | up]` projection against the projection and SwiGLU.

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::cuda::{add_norm_gemv, add_norm_gemv_f32_into, add_norm_gemv_swiglu, gated_norm_gemv, gemv};
use deltaserve_kernels::ops::{
    add_rms_norm, conv_step, gated_rms_norm, small_batch_add_norm_conv_linear, small_batch_add_norm_linear, small_batch_add_norm_swiglu,
    small_batch_gated_norm_linear, swiglu, ConvStepFold, ADD_NORM_LINEAR_MAX_ROWS, GATED_NORM_LINEAR_MAX_HEAD_ROWS,
};
use deltaserve_kernels::{ConvActivation, GateActivation, SlotBuffer, StepSlots};
use deltaserve_tests::{rel_err, values};
use rand::{Rng, SeedableRng};

/// Uniform random values on the CPU.
fn uniform(rng: &mut rand::rngs::StdRng, dims: &[usize], lo: f32, hi: f32) -> Tensor {
    let v: Vec<f32> = (0..dims.iter().product::<usize>()).map(|_| rng.random_range(lo..hi)).collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

/// The block seam folded into the next projection: `(r, y)` equal the add + RMSNorm kernel
/// followed by the small-batch projection bit for bit, for B = 1..8, bf16 and f16, with and
/// without a delta, at a model's width (K = 2048, N split over warps; at B = 2..4 on an H100 more
/// column blocks than the launch's grid, so blocks loop over groups of W's rows) and a narrow odd one; r
/// equals h + delta computed on the CPU exactly, and y the f32 math on the CPU rounded once; the
/// LM head's form (one and two rows) writes the same y widened to f32 into a given buffer. The
/// op takes the kernel up to `ADD_NORM_LINEAR_MAX_ROWS` rows and leaves more to the two steps;
/// rows past what the stage holds, and B = 9, are declined.
pub fn gpu_norm_folded_into_gemv_equals_two_kernels(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let eps = 1e-6f32;
    for (n, k) in [(3072usize, 2048usize), (37, 264)] {
        let (w, h, delta) =
            (uniform(&mut rng, &[n, k], -1.0, 1.0), uniform(&mut rng, &[8, k], -4.0, 4.0), uniform(&mut rng, &[8, k], -2.0, 2.0));
        let nw = uniform(&mut rng, &[k], 0.5, 1.5);
        for dtype in [DType::BF16, DType::F16] {
            let on = |t: &Tensor| t.to_device(dev).unwrap();
            let (wg, nwg) = (on(&w.to_dtype(dtype).unwrap()), on(&nw));
            for b in 1..=8 {
                for with_delta in [true, false] {
                    let hb = h.narrow(0, 0, b).unwrap();
                    let db = delta.narrow(0, 0, b).unwrap().to_dtype(dtype).unwrap();
                    let (hg, dg) = (on(&hb), on(&db));
                    let dg = with_delta.then_some(&dg);
                    let (r, y) = add_norm_gemv(&hg, dg, &nwg, eps, &wg).unwrap().expect("the fused kernel takes this input");
                    let op = small_batch_add_norm_linear(&hg, dg, &nwg, eps, &wg).unwrap();
                    assert_eq!(op.is_some(), b <= ADD_NORM_LINEAR_MAX_ROWS, "B={b}: fused by the op up to {ADD_NORM_LINEAR_MAX_ROWS} rows");
                    if let Some((r_op, y_op)) = op {
                        assert_eq!((values(&r_op), values(&y_op)), (values(&r), values(&y)), "B={b}: the op's fused result");
                    }
                    // The LM head's form: y widened to f32 in place, one and two rows.
                    let out = Tensor::zeros((b, n), DType::F32, dev).unwrap();
                    match add_norm_gemv_f32_into(&hg, dg, &nwg, eps, &wg, &out).unwrap() {
                        Some(r_f32) => {
                            assert_eq!(values(&r_f32), values(&r), "B={b}: r of the f32 form");
                            assert_eq!(values(&out), values(&y), "B={b}: y widened to f32 in the kernel against y");
                        }
                        None => assert!(b > 2, "B={b}: the f32 form takes one and two rows"),
                    }
                    let (r2, x2) = add_rms_norm(&hg, dg, &nwg, eps, dtype).unwrap();
                    let y2 = gemv(&x2, &wg).unwrap().unwrap();
                    let what = format!("{dtype:?} B={b} N={n} K={k} delta={with_delta}");
                    assert_eq!((y.dims(), y.dtype(), r.dims()), (&[b, n][..], dtype, &[b, k][..]), "{what}: shapes");
                    assert_eq!(values(&r), values(&r2), "{what}: r against the norm kernel's");
                    assert_eq!(values(&y), values(&y2), "{what}: y against the two kernels'");
                    // Against the CPU: r exactly, y from the f32 math rounded once.
                    let r_cpu = if with_delta { (db.to_dtype(DType::F32).unwrap() + &hb).unwrap() } else { hb.clone() };
                    assert_eq!(values(&r), values(&r_cpu), "{what}: r = h + delta");
                    let ms = r_cpu.sqr().unwrap().mean_keepdim(1).unwrap();
                    let x = r_cpu.broadcast_div(&(ms + eps as f64).unwrap().sqrt().unwrap()).unwrap().broadcast_mul(&nw).unwrap();
                    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
                    let want = f(&x.to_dtype(dtype).unwrap()).matmul(&f(&w.to_dtype(dtype).unwrap()).t().unwrap()).unwrap();
                    let e = rel_err(&values(&y), &values(&want.to_dtype(dtype).unwrap()));
                    assert!(e <= 1e-2, "{what}: {e:.3e} from the CPU");
                    if b == 8 && with_delta {
                        println!("GPU add + RMSNorm folded into the projection {dtype:?} N={n} K={k}: equal bit for bit to the two kernels (B = 1..8); {e:.2e} from the CPU at B=8");
                    }
                }
            }
        }
    }
    let on = |t: Tensor| t.to_device(dev).unwrap();
    let (nine, wide) = (on(uniform(&mut rng, &[9, 64], -1.0, 1.0)), on(uniform(&mut rng, &[8, 8192], -1.0, 1.0)));
    let w64 = on(uniform(&mut rng, &[16, 64], -1.0, 1.0).to_dtype(DType::BF16).unwrap());
    let w_wide = on(uniform(&mut rng, &[16, 8192], -1.0, 1.0).to_dtype(DType::BF16).unwrap());
    let (nw64, nw_wide) =
        (on(Tensor::ones(64, DType::F32, &Device::Cpu).unwrap()), on(Tensor::ones(8192, DType::F32, &Device::Cpu).unwrap()));
    assert!(add_norm_gemv(&nine, None, &nw64, eps, &w64).unwrap().is_none(), "B = 9 is left to the two steps");
    let one = nine.narrow(0, 0, 1).unwrap();
    let wrong = on(Tensor::zeros((1, 15), DType::F32, &Device::Cpu).unwrap());
    assert!(add_norm_gemv_f32_into(&one, None, &nw64, eps, &w64, &wrong).unwrap().is_none(), "an output of the wrong shape is declined");
    assert!(add_norm_gemv(&wide, None, &nw_wide, eps, &w_wide).unwrap().is_none(), "8 rows of 8192 exceed the stage");
}

/// SwiGLU formed inside a one-row decode step's fused `[gate | up]` projection (with the norm
/// before it): `(r, x)` equal the fused norm + projection followed by the SwiGLU kernel on its two
/// halves bit for bit, bf16 and f16, with and without a delta, at the 1.39B's MLP (I = 5632: a
/// column block of 4 gate and 4 up row pairs), at shapes whose split of K leaves 4 and 2 row
/// slots a block, and with padding rows after the two halves (as the engine pads fused weights);
/// a sanity bound against the CPU's f32 math. Two rows, and an `I` the block's gate rows do not
/// divide, are declined.
pub fn gpu_swiglu_folded_into_gate_up_equals_two_kernels(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let eps = 1e-6f32;
    for (i, k, pad) in [(5632usize, 2048usize, 0usize), (200, 1024, 48), (128, 2048, 0)] {
        let (w, h, delta) =
            (uniform(&mut rng, &[2 * i + pad, k], -0.1, 0.1), uniform(&mut rng, &[2, k], -4.0, 4.0), uniform(&mut rng, &[2, k], -2.0, 2.0));
        let nw = uniform(&mut rng, &[k], 0.5, 1.5);
        for dtype in [DType::BF16, DType::F16] {
            let on = |t: &Tensor| t.to_device(dev).unwrap();
            let (wg, nwg) = (on(&w.to_dtype(dtype).unwrap()), on(&nw));
            let hg = on(&h.narrow(0, 0, 1).unwrap());
            let dg = on(&delta.narrow(0, 0, 1).unwrap().to_dtype(dtype).unwrap());
            for dg in [Some(&dg), None] {
                let (r, x) = add_norm_gemv_swiglu(&hg, dg, &nwg, eps, &wg, i).unwrap().expect("the kernel takes one row");
                let (r2, y) = add_norm_gemv(&hg, dg, &nwg, eps, &wg).unwrap().unwrap();
                let x2 = swiglu(&y.narrow(1, 0, i).unwrap(), &y.narrow(1, i, i).unwrap()).unwrap();
                assert_eq!((x.dims(), x.dtype()), (&[1, i][..], dtype), "shape and dtype");
                assert_eq!(values(&r), values(&r2), "{dtype:?} I={i} K={k}: r");
                assert_eq!(values(&x), values(&x2), "{dtype:?} I={i} K={k} delta={}: against the two kernels", dg.is_some());
                let op = small_batch_add_norm_swiglu(&hg, dg, &nwg, eps, &wg, i).unwrap().expect("the op takes one row");
                assert_eq!(values(&op.1), values(&x), "the op's result");
            }
            // A sanity bound against the CPU's f32 math (the bits are pinned above).
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
            let (r, x) = add_norm_gemv_swiglu(&hg, Some(&dg), &nwg, eps, &wg, i).unwrap().unwrap();
            let rn = f(&r);
            let inv = (rn.sqr().unwrap().mean_all().unwrap().to_scalar::<f32>().unwrap() + eps).sqrt().recip();
            let xn = (rn * inv as f64).unwrap().broadcast_mul(&nw.unsqueeze(0).unwrap()).unwrap();
            let y = xn.matmul(&f(&wg).narrow(0, 0, 2 * i).unwrap().t().unwrap()).unwrap();
            let (g, u) = (y.narrow(1, 0, i).unwrap(), y.narrow(1, i, i).unwrap());
            let want = (g.silu().unwrap() * u).unwrap();
            let e = rel_err(&values(&x), &values(&want));
            println!("GPU SwiGLU folded into gate_up {dtype:?} I={i} K={k}: equal bit for bit to the two kernels; {e:.2e} from the CPU");
            assert!(e <= 2e-2, "{dtype:?} I={i}: {e:.3e} from the CPU");
        }
        let two = on_dev(dev, &h);
        let w2 = on_dev(dev, &w.to_dtype(DType::BF16).unwrap());
        assert!(add_norm_gemv_swiglu(&two, None, &on_dev(dev, &nw), eps, &w2, i).unwrap().is_none(), "two rows are declined");
    }
    // I = 131 with a split of K that leaves 2 gate rows a block (N = 262, K = 2048): declined.
    let w = on_dev(dev, &uniform(&mut rng, &[262, 2048], -0.1, 0.1).to_dtype(DType::BF16).unwrap());
    let (h, nw) = (on_dev(dev, &uniform(&mut rng, &[1, 2048], -1.0, 1.0)), on_dev(dev, &uniform(&mut rng, &[2048], 0.5, 1.5)));
    assert!(add_norm_gemv_swiglu(&h, None, &nw, eps, &w, 131).unwrap().is_none(), "I = 131 is not a multiple of the block's gate rows");
}

/// `t` on `dev`.
fn on_dev(dev: &Device, t: &Tensor) -> Tensor {
    t.to_device(dev).unwrap()
}

/// The mixer's gated output norm folded into `o_proj`: equal bit for bit to the gated norm
/// kernel followed by the small-batch projection, for B = 1..8, bf16 and f16, swish and sigmoid
/// gates read in place from a wider projection, and no gate, at the 1.39B model's head shape
/// (6 heads of 512), Qwen3.5's (32 of 128), and 4 of 256 and 2 of 128 (where one or two rows
/// take the entries whose prologue loads each head row at once, as the 1.39B's one row does).
/// The op takes the kernel while B · H ≤ `GATED_NORM_LINEAR_MAX_HEAD_ROWS` and leaves more to
/// the two steps.
pub fn gpu_gated_norm_folded_into_gemv_equals_two_kernels(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let eps = 1e-5f32;
    for (heads, vd, n) in [(6usize, 512usize, 2048usize), (32, 128, 200), (4, 256, 520), (2, 128, 136)] {
        let k = heads * vd;
        let (w, o, proj) = (
            uniform(&mut rng, &[n, k], -1.0, 1.0),
            uniform(&mut rng, &[8, heads, vd], -1.0, 1.0),
            uniform(&mut rng, &[8, k + 40], -3.0, 3.0),
        );
        let nw = uniform(&mut rng, &[vd], 0.5, 1.5);
        for dtype in [DType::BF16, DType::F16] {
            let on = |t: &Tensor| t.to_device(dev).unwrap();
            let (wg, nwg, pg) = (on(&w.to_dtype(dtype).unwrap()), on(&nw), on(&proj.to_dtype(dtype).unwrap()));
            for b in 1..=8 {
                let og = on(&o.narrow(0, 0, b).unwrap());
                let z = pg.narrow(0, 0, b).unwrap().narrow(1, 40, k).unwrap();
                for (act, gated) in [(GateActivation::Swish, true), (GateActivation::Sigmoid, true), (GateActivation::Swish, false)] {
                    let z = gated.then_some(&z);
                    let y = gated_norm_gemv(&og, z, &nwg, eps, act == GateActivation::Sigmoid, &wg)
                        .unwrap()
                        .expect("the fused kernel takes this input");
                    let op = small_batch_gated_norm_linear(&og, z, &nwg, eps, act, &wg).unwrap();
                    assert_eq!(op.is_some(), b * heads <= GATED_NORM_LINEAR_MAX_HEAD_ROWS, "B={b} H={heads}: the op's choice");
                    if let Some(y_op) = op {
                        assert_eq!(values(&y_op), values(&y), "B={b} H={heads}: the op's fused result");
                    }
                    let x = gated_rms_norm(&og, z, &nwg, eps, act, dtype).unwrap().reshape((b, k)).unwrap();
                    let y2 = gemv(&x, &wg).unwrap().unwrap();
                    assert_eq!((y.dims(), y.dtype()), (&[b, n][..], dtype), "shape and dtype");
                    assert_eq!(values(&y), values(&y2), "{dtype:?} B={b} {heads}x{vd} {act:?} gated={gated}: against the two kernels");
                }
            }
            // A sanity bound against the CPU op at B = 8 (the bits are pinned above).
            let z = proj.narrow(1, 40, k).unwrap().to_dtype(dtype).unwrap();
            let x = gated_rms_norm(&o, Some(&z), &nw, eps, GateActivation::Swish, dtype).unwrap().reshape((8, k)).unwrap();
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = f(&x).matmul(&f(&w.to_dtype(dtype).unwrap()).t().unwrap()).unwrap().to_dtype(dtype).unwrap();
            let got = gated_norm_gemv(&on(&o), Some(&pg.narrow(1, 40, k).unwrap()), &nwg, eps, false, &wg).unwrap().unwrap();
            let e = rel_err(&values(&got), &values(&want));
            println!("GPU gated norm folded into o_proj {dtype:?} {heads}x{vd}: equal bit for bit to the two kernels (B = 1..8); {e:.2e} from the CPU at B=8");
            assert!(e <= 1e-2, "{dtype:?} {heads}x{vd}: {e:.3e} from the CPU");
        }
    }
}

/// The decode step's short conv folded into the input projection's kernel: `(r, y, conv output)`
/// and every slot's conv state after it equal, bit for bit, the fused norm + projection followed
/// by the conv step on `y`'s first C columns, for B = 1 and 2 (the rows the op fuses), bf16 and
/// f16, SiLU and no activation, slots given on the host and in device memory (a captured step's
/// form), out of order in a pool, at a Gated DeltaNet layer's width (C = 1536 of N = 3104
/// rows: q, k, v, then the gates) and at a narrow odd one (C = 20 of 37). The output of
/// `conv_step` on the CPU pins the conv's arithmetic. Three rows, a conv of width 3, or C past
/// the projection's rows are declined and leave the states untouched.
pub fn gpu_conv_folded_into_projection_equals_two_kernels(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let (eps, pool) = (1e-6f32, 7usize);
    for (n, k, c) in [(3104usize, 2048usize, 1536usize), (37, 264, 20)] {
        let (w, h, delta) =
            (uniform(&mut rng, &[n, k], -1.0, 1.0), uniform(&mut rng, &[3, k], -4.0, 4.0), uniform(&mut rng, &[3, k], -2.0, 2.0));
        let (nw, cw) = (uniform(&mut rng, &[k], 0.5, 1.5), uniform(&mut rng, &[c, 4], -1.0, 1.0));
        let init: Vec<Vec<f32>> = (0..pool).map(|_| values(&uniform(&mut rng, &[c, 4], -2.0, 2.0))).collect();
        let fresh = |device: &Device| deltaserve_tests::slots_holding(&init, c * 4, device);
        let all = |states: &SlotBuffer| deltaserve_tests::every_slot(states, pool);
        for dtype in [DType::BF16, DType::F16] {
            let on = |t: &Tensor| t.to_device(dev).unwrap();
            let (wg, nwg, cwg, dg) = (on(&w.to_dtype(dtype).unwrap()), on(&nw), on(&cw), on(&delta.to_dtype(dtype).unwrap()));
            for (slots, act, device_slots) in [
                (vec![5usize], ConvActivation::Silu, false),
                (vec![4, 1], ConvActivation::Silu, false),
                (vec![4, 1], ConvActivation::Identity, true),
                (vec![2], ConvActivation::Identity, true),
            ] {
                let b = slots.len();
                let (hg, db) = (on(&h.narrow(0, 0, b).unwrap()), dg.narrow(0, 0, b).unwrap());
                let ids: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
                let dev_ids = Tensor::from_vec(ids, b, dev).unwrap();
                let step = StepSlots { host: &slots, device: device_slots.then_some(&dev_ids) };
                let what = format!("{dtype:?} N={n} K={k} C={c} B={b} {act:?} device slots {device_slots}");
                let mut folded = fresh(dev);
                let fold = ConvStepFold { weight: &cwg, states: &mut folded, slots: step, act };
                let (r, y, cy) = small_batch_add_norm_conv_linear(&hg, Some(&db), &nwg, eps, &wg, fold)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{what}: the op folds the conv"));
                let mut apart = fresh(dev);
                let (r2, y2) = small_batch_add_norm_linear(&hg, Some(&db), &nwg, eps, &wg).unwrap().expect("the fused norm applies");
                let c2 = conv_step(&y2.narrow(1, 0, c).unwrap(), &cwg, &mut apart, step, act).unwrap();
                assert_eq!((cy.dims(), cy.dtype()), (&[b, c][..], DType::F32), "{what}: conv output shape");
                assert_eq!((values(&r), values(&y)), (values(&r2), values(&y2)), "{what}: r and y against the fused norm's");
                assert_eq!(values(&cy), values(&c2), "{what}: the conv against conv_step on y");
                assert_eq!(all(&folded), all(&apart), "{what}: every slot's conv state");
                // The conv step on the CPU, from y's columns, pins the arithmetic.
                let mut cpu = fresh(&Device::Cpu);
                let want = conv_step(&y2.narrow(1, 0, c).unwrap().to_device(&Device::Cpu).unwrap(), &cw, &mut cpu, &slots, act).unwrap();
                let e = rel_err(&values(&cy), &values(&want));
                assert!(e <= 1e-6, "{what}: {e:.3e} from the CPU's conv step");
                assert_eq!(all(&folded), all(&cpu), "{what}: conv states against the CPU's");
                if b == 2 && device_slots {
                    println!("GPU short conv folded into the input projection {dtype:?} N={n} C={c}: equal bit for bit to the two kernels (B = 1, 2); {e:.2e} from the CPU's conv");
                }
            }
            // Declined: three rows, width 3, C past the rows; the states stay as they were.
            let mut states = fresh(dev);
            let hg = on(&h);
            let three = [0usize, 3, 6];
            let fold = ConvStepFold { weight: &cwg, states: &mut states, slots: (&three).into(), act: ConvActivation::Silu };
            assert!(small_batch_add_norm_conv_linear(&hg, None, &nwg, eps, &wg, fold).unwrap().is_none(), "B = 3 is left to the two steps");
            let (h1, one) = (on(&h.narrow(0, 0, 1).unwrap()), [3usize]);
            let cw3 = on(&cw.narrow(1, 0, 3).unwrap().contiguous().unwrap());
            let mut narrow3 = SlotBuffer::zeros_on(pool, c * 3, dev).unwrap();
            let fold = ConvStepFold { weight: &cw3, states: &mut narrow3, slots: (&one).into(), act: ConvActivation::Silu };
            assert!(
                small_batch_add_norm_conv_linear(&h1, None, &nwg, eps, &wg, fold).unwrap().is_none(),
                "width 3 is left to the two steps"
            );
            let w_short = on(&w.narrow(0, 0, c - 1).unwrap().to_dtype(dtype).unwrap());
            let fold = ConvStepFold { weight: &cwg, states: &mut states, slots: (&one).into(), act: ConvActivation::Silu };
            assert!(small_batch_add_norm_conv_linear(&h1, None, &nwg, eps, &w_short, fold).unwrap().is_none(), "C past N is declined");
            assert_eq!(all(&states), init, "declined calls leave the states untouched");
        }
    }
}
