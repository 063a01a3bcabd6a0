//! The prefill projections' GEMM (`ops::linear` past the GEMV kernels' rows: cuBLAS) against the
//! f32 math on the CPU, at the models' shapes (a fused projection padded to 9280 rows), the
//! unpadded 9228 and an odd one, with x contiguous or a column slice of a wider tensor (16-byte
//! aligned or not), and at several row counts of one bucket: cublasLt runs them all with the
//! algorithm chosen for the bucket's first. The skinny GEMM, which takes 4–64 rows on a Hopper
//! build, is turned off where a test is of cuBLAS's path (tests/gpu/skinny.rs tests it).

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::cuda::{set_skinny_gemm, skinny_gemm_on};
use deltaserve_kernels::ops::linear;
use deltaserve_tests::values;
use rand::{Rng, SeedableRng};

/// The skinny GEMM turned on or off until dropped, then back to what it was: also when a test
/// panics, so that the tests after it still run the default path.
pub struct SkinnySwitch(bool);

impl SkinnySwitch {
    /// Turns the skinny GEMM `on` or off, remembering what it was.
    pub fn set(on: bool) -> Self {
        let was = skinny_gemm_on();
        set_skinny_gemm(on);
        Self(was)
    }
}

impl Drop for SkinnySwitch {
    fn drop(&mut self) {
        set_skinny_gemm(self.0);
    }
}

/// Every element within the output's rounding (2⁻⁸ of its magnitude for bf16, 2⁻¹¹ for f16)
/// plus the accumulation order's error of the f32 sums, of the CPU's f32 product of the same
/// rounded inputs; two calls give the same bits.
pub fn gpu_gemm_matches_cpu(dev: &Device) {
    let _cublas = SkinnySwitch::set(false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    // (M, N, K, the column x starts at in a wider tensor: 0 for x contiguous)
    let cases = [
        (64usize, 9280usize, 2048usize, 0usize),
        (300, 2048, 3072, 0),
        (9, 9228, 264, 24),
        (513, 37, 96, 24),
        (128, 1024, 512, 0),
        (65, 1024, 512, 0),
        (100, 1024, 512, 3),
        (127, 1024, 512, 24),
    ];
    for (m, n, k, from) in cases {
        let sliced = from > 0;
        for dtype in [DType::BF16, DType::F16] {
            let wide = if sliced { k + 40 } else { k };
            let xs: Vec<f32> = (0..m * wide).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let ws: Vec<f32> = (0..n * k).map(|_| rng.random_range(-0.05f32..0.05)).collect();
            let x_all = Tensor::from_vec(xs, (m, wide), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let x = x_all.narrow(1, from, k).unwrap();
            let w = Tensor::from_vec(ws, (n, k), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let (xg, wg) = (x_all.to_device(dev).unwrap().narrow(1, from, k).unwrap(), w.to_device(dev).unwrap());
            let what = format!("{dtype:?} m={m} n={n} k={k} from column {from}");
            let direct = linear(&xg, &wg).unwrap();
            let again = linear(&xg, &wg).unwrap();
            assert_eq!(direct.dims(), &[m, n], "{what}: shape");
            assert_eq!(values(&direct), values(&again), "{what}: the same bits twice");
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = values(&f(&x).matmul(&f(&w).t().unwrap()).unwrap());
            let got = values(&direct);
            let (unit, abs_sum) = (if dtype == DType::BF16 { 2f32.powi(-8) } else { 2f32.powi(-11) }, 0.05 * k as f32);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let tol = unit * w.abs() + 1e-6 * abs_sum;
                assert!((g - w).abs() <= tol, "{what}: element {i}: {g} against {w} (tolerance {tol})");
            }
        }
    }
}

/// Random operands of `x [M, K] · w [N, K]ᵀ` rounded to a dtype, on the GPU, and their product
/// in f32 on the CPU.
struct Operands {
    xg: Tensor,
    wg: Tensor,
    want: Vec<f32>,
}

/// `x` uniform in ±1 and `w` in ±0.05, rounded to `dtype`.
fn operands(rng: &mut impl Rng, (m, n, k): (usize, usize, usize), dtype: DType, dev: &Device) -> Operands {
    let xs: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let ws: Vec<f32> = (0..n * k).map(|_| rng.random_range(-0.05f32..0.05)).collect();
    let x = Tensor::from_vec(xs, (m, k), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
    let w = Tensor::from_vec(ws, (n, k), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let want = values(&f(&x).matmul(&f(&w).t().unwrap()).unwrap());
    Operands { xg: x.to_device(dev).unwrap(), wg: w.to_device(dev).unwrap(), want }
}

/// The LM head's GEMM with f32 output (`ops::linear_f32`, and `linear_f32_into` a given buffer:
/// a decode step's logits from 4 rows): the f32 product of the rounded inputs to f32's
/// accumulation error, far inside the bf16 rounding the widened product carries, the same bits
/// both ways; and none below the GEMM's rows, where the caller widens the GEMV's product.
pub fn gpu_gemm_f32_output_is_the_unrounded_product(dev: &Device) {
    use deltaserve_kernels::ops::{linear_f32, linear_f32_into};
    let mut rng = rand::rngs::StdRng::seed_from_u64(47);
    let restore = SkinnySwitch::set(false);
    // cuBLAS's, then with the skinny GEMM on (it takes the 4-row case; 64 and 70 rows stay cuBLAS's).
    for (skinny, (m, n, k)) in
        [false, true].into_iter().flat_map(|s| [(4usize, 4096usize, 2048usize), (64, 32000, 2048), (70, 1000, 512)].map(|c| (s, c)))
    {
        set_skinny_gemm(skinny);
        for dtype in [DType::BF16, DType::F16] {
            let what = format!("{dtype:?} m={m} n={n} k={k} skinny {skinny}");
            let Operands { xg, wg, want } = operands(&mut rng, (m, n, k), dtype, dev);
            let y = linear_f32(&xg, &wg).unwrap().unwrap_or_else(|| panic!("{what}: no f32 GEMM"));
            assert!(y.dtype() == DType::F32 && y.dims() == [m, n], "{what}: {:?} {:?}", y.dtype(), y.dims());
            let out = Tensor::zeros((m, n), DType::F32, dev).unwrap();
            assert!(linear_f32_into(&xg, &wg, &out).unwrap(), "{what}: into refused");
            assert!(values(&out) == values(&y), "{what}: into and new differ");
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let got = values(&y);
            let abs_sum = 0.05 * k as f32;
            let (mut unrounded, mut worst) = (0usize, 0f32);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let tol = 1e-5 * abs_sum;
                assert!((g - w).abs() <= tol, "{what}: element {i}: {g} against {w} (tolerance {tol})");
                worst = worst.max((g - w).abs());
                unrounded +=
                    usize::from(*g != f(&Tensor::new(*g, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()).to_scalar::<f32>().unwrap());
            }
            println!("{what}: worst abs err {worst:.2e}; {unrounded} of {} not representable in {dtype:?}", got.len());
            assert!(unrounded > got.len() / 2, "{what}: the output looks rounded to {dtype:?}");
        }
    }
    drop(restore);
    let x = Tensor::randn(0f32, 1.0, (2, 2048), dev).unwrap().to_dtype(DType::BF16).unwrap();
    let w = Tensor::randn(0f32, 0.02, (4096, 2048), dev).unwrap().to_dtype(DType::BF16).unwrap();
    assert!(linear_f32(&x, &w).unwrap().is_none(), "two rows: the GEMV's rows, not the GEMM's");
}

/// A decode step's split-K projections as unsummed slices (`ops::linear_parts`, the engine's
/// default from 4 rows where cuBLAS splits K) sum to the product, and the residual norm that
/// sums them as it reads them (`ops::add_rms_norm_parts`) gives the bits of the norm of their
/// sum: the default split, a forced one, none, and the norm's many-row variant.
pub fn gpu_split_projection_slices_sum_to_the_product(dev: &Device) {
    use deltaserve_kernels::cuda::set_split_parts;
    use deltaserve_kernels::ops::{add_rms_norm, add_rms_norm_parts, linear_parts, sum_parts};
    let cublas = SkinnySwitch::set(false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    // (M, N, K, forced slices: None for the default algorithm's split)
    let cases = [
        (64usize, 2048usize, 6144usize, None),
        (64, 2048, 4096, None),
        (16, 2048, 3072, None),
        (64, 2048, 5632, None),
        (8, 2048, 2048, Some(4usize)),
        (300, 1024, 3072, Some(3)),
    ];
    let mut split = 0;
    for (m, n, k, forced) in cases {
        set_split_parts(forced);
        for dtype in [DType::BF16, DType::F16] {
            let what = format!("{dtype:?} m={m} n={n} k={k} forced {forced:?}");
            let Operands { xg, wg, want } = operands(&mut rng, (m, n, k), dtype, dev);
            let Some(parts) = linear_parts(&xg, &wg).unwrap() else {
                assert!(forced.is_none(), "{what}: a forced split ran no slices");
                println!("{what}: the default algorithm does not split K");
                continue;
            };
            split += 1;
            let s = parts.dim(0).unwrap();
            assert!(s >= 2 && k % s == 0 && parts.dims() == [s, m, n] && parts.dtype() == DType::F32, "{what}: {:?}", parts.dims());
            if let Some(f) = forced {
                assert_eq!(s, f, "{what}: the forced count");
            }
            let sum = values(&sum_parts(&parts, dtype).unwrap());
            let (unit, abs_sum) = (if dtype == DType::BF16 { 2f32.powi(-8) } else { 2f32.powi(-11) }, 0.05 * k as f32);
            for (i, (g, w)) in sum.iter().zip(&want).enumerate() {
                let tol = unit * w.abs() + 1e-6 * abs_sum;
                assert!((g - w).abs() <= tol, "{what}: element {i}: {g} against {w} (tolerance {tol})");
            }
            // The norm that sums the slices: the bits of the norm of their rounded sum.
            let h = Tensor::randn(0f32, 1.0, (m, n), dev).unwrap();
            let nw = Tensor::randn(1f32, 0.1, n, dev).unwrap();
            let (r, xn) = add_rms_norm_parts(&h, &parts, &nw, 1e-6, dtype).unwrap();
            let (r2, xn2) = add_rms_norm(&h, Some(&sum_parts(&parts, dtype).unwrap()), &nw, 1e-6, dtype).unwrap();
            assert!(values(&r) == values(&r2), "{what}: the residual differs from the summed slices' norm");
            assert!(values(&xn) == values(&xn2), "{what}: the norm differs from the summed slices' norm");
            println!("{what}: {s} slices");
        }
    }
    set_split_parts(Some(0));
    let x = Tensor::randn(0f32, 1.0, (64, 6144), dev).unwrap().to_dtype(DType::BF16).unwrap();
    let w = Tensor::randn(0f32, 0.02, (2048, 6144), dev).unwrap().to_dtype(DType::BF16).unwrap();
    assert!(linear_parts(&x, &w).unwrap().is_none(), "set_split_parts(Some(0)) still split");
    set_split_parts(None);
    drop(cublas);
    // Qwen3.5's down projection at 64 rows is split by cuBLAS's heuristic on the H100 and H200.
    assert!(split >= 4, "only {split} cases ran as slices");
}

/// A random bf16 model of the 1.39B's layer shapes (two layers), prefilled and decoded at 16
/// sequences four ways: through the skinny GEMM (the default on a Hopper build), through cuBLAS
/// with the split projections' slices summed by the norms, with every projection reduced by its
/// GEMM (`set_split_parts(Some(0))`), and in f32 (the reference). The slices ran only in the
/// second, the skinny GEMM only in the first; each bf16 run repeats to the bit; and the skinny
/// GEMM's and the slices' logits are as close to f32's as the reduced GEMMs' are.
pub fn gpu_split_projections_leave_a_models_logits(dev: &Device) {
    use deltaserve_engine::{CausalLm, Logits, PrefillAlgo};
    use deltaserve_kernels::cuda::{
        set_skinny_swiglu, set_split_parts, skinny_launches, skinny_swiglu_launches, split_parts_count, SkinnyConfig,
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = serde_json::json!({
        "model_type": "gated_deltanet", "architectures": ["GatedDeltaNetForCausalLM"], "hidden_size": 2048,
        "num_hidden_layers": 2, "num_heads": 6, "head_dim": 256, "expand_v": 2, "vocab_size": 4096, "hidden_ratio": 4,
        "conv_size": 4, "use_gate": true, "use_short_conv": true, "norm_eps": 1e-6, "fuse_norm": true,
        "tie_word_embeddings": false
    });
    deltaserve_engine::synth::write_random_checkpoint(&cfg, dir.path(), DType::BF16, 7, None).unwrap();
    let c = deltaserve_engine::read_config(dir.path()).unwrap();
    let ckpt = deltaserve_engine::weights::Checkpoint::open(dir.path()).unwrap();
    let bf16 = CausalLm::load(&c, &ckpt, DType::BF16, dev, false).unwrap();
    let f32 = CausalLm::load(&c, &ckpt, DType::F32, dev, false).unwrap();
    let run = |model: &CausalLm, parts: Option<usize>| -> (Vec<f32>, u64) {
        set_split_parts(parts);
        let before = split_parts_count();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut pool = model.new_pool(16).unwrap();
        let slots: Vec<_> = (0..16).map(|_| pool.allocate().unwrap()).collect();
        for &s in &slots {
            let prompt: Vec<u32> = (0..rng.random_range(5..40)).map(|_| rng.random_range(0..4096)).collect();
            model.prefill(&mut pool, s, &prompt, Logits::Last, PrefillAlgo::Chunked).unwrap();
        }
        let mut out = Vec::new();
        for _ in 0..3 {
            let batch: Vec<_> = slots.iter().map(|&s| (s, rng.random_range(0..4096u32))).collect();
            out.extend(values(&model.decode(&mut pool, &batch).unwrap()));
        }
        (out, split_parts_count() - before)
    };
    let (skinny_before, glu_before) = (skinny_launches(), skinny_swiglu_launches());
    let (skinny, _) = run(&bf16, None);
    let (skinny_again, _) = run(&bf16, None);
    let (skinny_ran, glu_ran) = (skinny_launches() - skinny_before, skinny_swiglu_launches() - glu_before);
    // SwiGLU as its own launch after the skinny GEMM of [gate | up].
    set_skinny_swiglu(false);
    let (glu_apart, _) = run(&bf16, None);
    set_skinny_swiglu(true);
    let cublas = SkinnySwitch::set(false);
    let skinny_off = skinny_launches();
    let (sliced, ran) = run(&bf16, None);
    let (again, _) = run(&bf16, None);
    let (reduced, ran_off) = run(&bf16, Some(0));
    let (reduced_again, _) = run(&bf16, Some(0));
    let (truth, _) = run(&f32, None);
    assert_eq!(skinny_launches(), skinny_off, "the skinny GEMM ran while turned off");
    drop(cublas);
    set_split_parts(None);
    assert!(ran > 0, "no projection ran as slices at 16 rows");
    if deltaserve_kernels::cuda::skinny_gemm_available() {
        assert!(skinny_ran > 0, "no projection ran through the skinny GEMM at 16 rows");
        assert!(skinny == skinny_again, "a skinny run did not repeat to the bit");
        // Two runs of three steps of two layers: SwiGLU in the [gate | up] GEMM's epilogue each
        // time (and in the prefills of 4–16 tokens).
        assert!(glu_ran >= 2 * 3 * 2, "SwiGLU folded into the skinny GEMM only {glu_ran} times");
        // Where the GEMM alone runs [gate | up] unsplit too (its 176 row tiles fill the GPU),
        // the fold has its bits; else it is as close to f32.
        let sms = deltaserve_kernels::cuda::sm_count(dev.as_cuda_device().unwrap()).unwrap();
        let unsplit = SkinnyConfig::choose(16, 11264, 2048, sms, false).is_some_and(|c| c.splits == 1);
        if unsplit {
            assert!(glu_apart == skinny, "SwiGLU folded and apart differ");
        } else {
            let (e_fold, e_apart) = (deltaserve_tests::rel_err(&skinny, &truth), deltaserve_tests::rel_err(&glu_apart, &truth));
            assert!(e_fold <= 1.25 * e_apart, "SwiGLU folded {e_fold:.3e} against f32, apart {e_apart:.3e}");
        }
        let e_skinny = deltaserve_tests::rel_err(&skinny, &truth);
        let e_reduced = deltaserve_tests::rel_err(&reduced, &truth);
        println!("{skinny_ran} skinny GEMMs; their logits against f32: {e_skinny:.2e} (reduced cuBLAS GEMMs {e_reduced:.2e})");
        assert!(e_skinny <= 1.25 * e_reduced, "skinny {e_skinny:.3e} against f32, reduced GEMMs {e_reduced:.3e}");
    }
    assert_eq!(ran_off, 0, "slices ran with the split turned off");
    assert!(sliced == again && reduced == reduced_again, "a bf16 run did not repeat to the bit");
    let (e_sliced, e_reduced, apart) = (
        deltaserve_tests::rel_err(&sliced, &truth),
        deltaserve_tests::rel_err(&reduced, &truth),
        deltaserve_tests::rel_err(&sliced, &reduced),
    );
    println!(
        "{ran} GEMMs as slices; three decode steps' logits against f32: slices {e_sliced:.2e}, reduced GEMMs {e_reduced:.2e}; apart {apart:.2e}"
    );
    assert!(e_sliced <= 1.25 * e_reduced, "slices {e_sliced:.3e} against f32, reduced GEMMs {e_reduced:.3e}");
    assert!(apart <= 1.5 * e_reduced, "slices against reduced GEMMs {apart:.3e}: more than bf16's own error {e_reduced:.3e}");
}

/// A prefill's GEMMs take the fastest of cublasLt's algorithms that gives the heuristic's first
/// one's bits (timed on a bucket's first call): on new operands after that choice, every
/// element equals the heuristic's first algorithm's product bit for bit, at Qwen3.5's and the
/// 1.39B's widest projections and the narrow ones, bf16 and f16, and rows inside a bucket.
pub fn gpu_tuned_gemm_gives_the_heuristics_bits(dev: &Device) {
    use deltaserve_kernels::cuda::{gemm_tuning_counts, linear_lt_pick, LtVariant};
    let mut rng = rand::rngs::StdRng::seed_from_u64(53);
    let before = gemm_tuning_counts();
    // (M of the first call, M after, N, K)
    let cases = [(4096usize, 4090usize, 12352usize, 2048usize), (1024, 1000, 12288, 2048), (700, 704, 2048, 6144), (300, 257, 9280, 2048)];
    for (m1, m2, n, k) in cases {
        for dtype in [DType::BF16, DType::F16] {
            let mut random = |rows: usize, cols: usize, scale: f32| {
                let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-scale..scale)).collect();
                Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap().to_dtype(dtype).unwrap().to_device(dev).unwrap()
            };
            let (x1, w, x2) = (random(m1, k, 1.0), random(n, k, 0.05), random(m2, k, 1.0));
            linear(&x1, &w).unwrap();
            let tuned = values(&linear(&x2, &w).unwrap());
            let (heuristic, algo) = linear_lt_pick(&x2, &w, 0, LtVariant::default()).unwrap().expect("the heuristic offers an algorithm");
            let heuristic = values(&heuristic);
            let differing = tuned.iter().zip(&heuristic).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            println!("{dtype:?} {m1} then {m2} rows, N={n} K={k}: {differing} elements differ from the heuristic's first ({algo})");
            assert_eq!(differing, 0, "{dtype:?} M={m2} N={n} K={k}: the tuned GEMM's bits differ");
            assert!(tuned.iter().any(|x| x.abs() > 0.1), "a product of random operands is not all small");
        }
    }
    let after = gemm_tuning_counts();
    println!("GEMM algorithms timed: {} (another than the heuristic's first: {})", after.0 - before.0, after.1 - before.1);
    assert!(after.0 - before.0 >= 8, "every case's first call times its bucket's algorithms: {before:?} → {after:?}");
}
