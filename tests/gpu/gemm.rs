//! The prefill projections' GEMM (`ops::linear` past the GEMV kernels' rows: cuBLAS) against the
//! f32 math on the CPU, at the models' shapes (a fused projection padded to 9280 rows), the
//! unpadded 9228 and an odd one, with x contiguous or a column slice of a wider tensor (16-byte
//! aligned or not), and at several row counts of one bucket: cublasLt runs them all with the
//! algorithm chosen for the bucket's first.

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::ops::linear;
use deltaserve_tests::values;
use rand::{Rng, SeedableRng};

/// Every element within the output's rounding (2⁻⁸ of its magnitude for bf16, 2⁻¹¹ for f16)
/// plus the accumulation order's error of the f32 sums, of the CPU's f32 product of the same
/// rounded inputs; two calls give the same bits.
pub fn gpu_gemm_matches_cpu(dev: &Device) {
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
