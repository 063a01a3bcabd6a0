//! `y = x Wᵀ` whose every output is the same sum in the same order whatever the number of rows,
//! their position in `x` or the threads: the CPU's batch-invariant projection.
//!
//! A GEMM library picks kernels, blockings and splits of the reduction by the problem's shape,
//! so one row's result changes with how many rows come with it (candle's CPU GEMM takes a GEMV
//! kernel for one row and changes kernels with the row count for narrow outputs). Here each
//! output is `Σ_k x[k]·w[k]` accumulated in [`LANES`] partial sums (lane `l` takes `k ≡ l mod
//! LANES` in increasing `k`), the lanes added in one fixed tree, then the tail in order. Tiles
//! only decide which outputs are computed together, never how. Rust never contracts `a*b + c`
//! into a fused multiply-add, so the AVX2 build of the loop gives the same bits as the baseline.

use rayon::prelude::*;

/// Partial sums per output.
pub const LANES: usize = 8;
/// Rows and columns of the register tile.
const TR: usize = 2;
const TC: usize = 4;
/// Rows and columns of the work item one thread takes (a column block stays in cache while the
/// rows pass over it).
const BLOCK_ROWS: usize = 32;
const BLOCK_COLS: usize = 64;

/// `y[m, n] = Σ_k x[m, k] · w[n, k]` for `x` `[rows, k]`, `w` `[cols, k]`, `y` `[rows, cols]`,
/// all row-major.
pub fn linear(x: &[f32], w: &[f32], k: usize, y: &mut [f32]) {
    if k == 0 {
        y.fill(0.0);
        return;
    }
    let (rows, cols) = (x.len() / k, w.len() / k);
    assert!(x.len() == rows * k && w.len() == cols * k && y.len() == rows * cols, "x [rows, k], w [cols, k], y [rows, cols]");
    if rows == 0 || cols == 0 {
        return;
    }
    let (rb, cb) = (rows.div_ceil(BLOCK_ROWS), cols.div_ceil(BLOCK_COLS));
    let blocks: Vec<(usize, usize, Vec<f32>)> = (0..rb * cb)
        .into_par_iter()
        .map(|i| {
            let (r0, c0) = ((i / cb) * BLOCK_ROWS, (i % cb) * BLOCK_COLS);
            let (nr, nc) = (BLOCK_ROWS.min(rows - r0), BLOCK_COLS.min(cols - c0));
            let mut out = vec![0f32; nr * nc];
            block(&x[r0 * k..(r0 + nr) * k], &w[c0 * k..(c0 + nc) * k], k, &mut out);
            (r0, c0, out)
        })
        .collect();
    for (r0, c0, out) in blocks {
        let nc = BLOCK_COLS.min(cols - c0);
        for (r, src) in out.chunks_exact(nc).enumerate() {
            y[(r0 + r) * cols + c0..][..nc].copy_from_slice(src);
        }
    }
}

/// One work item, through the widest vector unit this CPU has (same bits either way).
fn block(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { block_avx2(x, w, k, out) };
        return;
    }
    block_generic(x, w, k, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    block_generic(x, w, k, out);
}

/// `out[r, c]` for the rows of `x` and the columns of `w`: full register tiles, then the edges
/// one output at a time through the same per-output arithmetic.
#[inline(always)]
fn block_generic(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    let (nr, nc) = (x.len() / k, w.len() / k);
    let row = |r: usize| &x[r * k..(r + 1) * k];
    let col = |c: usize| &w[c * k..(c + 1) * k];
    let (full_r, full_c) = (nr - nr % TR, nc - nc % TC);
    for r in (0..full_r).step_by(TR) {
        for c in (0..full_c).step_by(TC) {
            let t = tile::<TR, TC>(std::array::from_fn(|i| row(r + i)), std::array::from_fn(|j| col(c + j)), k);
            for (i, vals) in t.iter().enumerate() {
                out[(r + i) * nc + c..][..TC].copy_from_slice(vals);
            }
        }
    }
    for r in 0..nr {
        let from = if r < full_r { full_c } else { 0 };
        for c in from..nc {
            out[r * nc + c] = tile::<1, 1>([row(r)], [col(c)], k)[0][0];
        }
    }
}

/// The `R × C` outputs of rows `x` and columns `w`, each summed as the module describes.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // indices keep the register tile's shape plain to LLVM (measured)
fn tile<const R: usize, const C: usize>(x: [&[f32]; R], w: [&[f32]; C], k: usize) -> [[f32; C]; R] {
    let body = k - k % LANES;
    assert!(x.iter().all(|r| r.len() >= k) && w.iter().all(|c| c.len() >= k), "rows and columns hold k values");
    let (xp, wp): ([*const f32; R], [*const f32; C]) = (std::array::from_fn(|r| x[r].as_ptr()), std::array::from_fn(|c| w[c].as_ptr()));
    let mut acc = [[[0f32; LANES]; C]; R];
    for b in 0..body / LANES {
        let i = b * LANES;
        for r in 0..R {
            for c in 0..C {
                for l in 0..LANES {
                    // SAFETY: i + l < body ≤ k, and every row and column holds k values (asserted).
                    acc[r][c][l] += unsafe { *xp[r].add(i + l) * *wp[c].add(i + l) };
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let a = &acc[r][c];
            let mut s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
            for j in body..k {
                s += x[r][j] * w[c][j];
            }
            out[r][c] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 20_001) as f32 / 10_000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn equals_the_f64_sum() {
        for (m, n, k) in [(1, 1, 1), (3, 5, 7), (4, 4, 8), (33, 70, 29), (5, 130, 64), (9, 3, 1000)] {
            let (x, w) = (pseudo(m * k, 1), pseudo(n * k, 2));
            let mut y = vec![0f32; m * n];
            linear(&x, &w, k, &mut y);
            for r in 0..m {
                for c in 0..n {
                    let exact: f64 = (0..k).map(|j| x[r * k + j] as f64 * w[c * k + j] as f64).sum();
                    let got = y[r * n + c] as f64;
                    assert!((got - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "[{m},{n},{k}] ({r},{c}): {got} vs {exact}");
                }
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_whatever_rows_come_with_it() {
        let (n, k) = (77, 301);
        let w = pseudo(n * k, 3);
        let x = pseudo(40 * k, 4);
        let mut all = vec![0f32; 40 * n];
        linear(&x, &w, k, &mut all);
        for (start, len) in [(0, 1), (5, 1), (5, 2), (3, 7), (17, 23), (0, 33)] {
            let mut part = vec![0f32; len * n];
            linear(&x[start * k..(start + len) * k], &w, k, &mut part);
            assert_eq!(part, all[start * n..(start + len) * n], "rows {start}..{}", start + len);
        }
        // The same weights as a narrower matrix: a column's outputs do not depend on its neighbours.
        let mut narrow = vec![0f32; 40 * 3];
        linear(&x, &w[10 * k..13 * k], k, &mut narrow);
        for r in 0..40 {
            assert_eq!(narrow[r * 3..r * 3 + 3], all[r * n + 10..r * n + 13], "row {r}");
        }
    }
}
