//! Per-token preprocessing of the mixer inputs (model-spec.md §1.3 steps 4, 6, 7).

/// eps inside the sqrt of fla's l2norm (§3.6.7: not `F.normalize`).
pub const L2NORM_EPS: f32 = 1e-6;
/// `F.softplus`'s linear threshold, which fla's gate matches.
pub const SOFTPLUS_THRESHOLD: f32 = 20.0;

/// L2-normalises each row of `dim` values in place: `x / sqrt(Σx² + 1e-6)`.
pub fn l2norm_rows(x: &mut [f32], dim: usize) {
    for row in x.chunks_mut(dim) {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() + L2NORM_EPS).sqrt();
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

/// softplus with PyTorch's threshold: `x` for x > 20, else `ln(1 + e^x)`.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > SOFTPLUS_THRESHOLD {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// β = sigmoid(b), doubled when negative eigenvalues are allowed; in place over `[T, HV]`.
pub fn beta_in_place(b: &mut [f32], allow_neg_eigval: bool) {
    let m = if allow_neg_eigval { 2.0 } else { 1.0 };
    b.iter_mut().for_each(|x| *x = m * sigmoid(*x));
}

/// Log-decay `g = −exp(A_log)·softplus(a + dt_bias)` in place over `a` `[T, HV]`, in fp32.
pub fn gate_in_place(a: &mut [f32], a_log: &[f32], dt_bias: &[f32]) {
    let hv = a_log.len();
    for row in a.chunks_mut(hv) {
        for ((x, &al), &db) in row.iter_mut().zip(a_log).zip(dt_bias) {
            *x = -al.exp() * softplus(*x + db);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2norm_puts_eps_inside_sqrt() {
        let mut x = vec![3.0f32, 4.0];
        l2norm_rows(&mut x, 2);
        let n = (25.0f32 + 1e-6).sqrt();
        assert!((x[0] - 3.0 / n).abs() < 1e-7 && (x[1] - 4.0 / n).abs() < 1e-7);
        let mut z = vec![0.0f32; 4];
        l2norm_rows(&mut z, 4);
        assert!(z.iter().all(|v| *v == 0.0));
    }

    #[test]
    fn gate_matches_formula_and_threshold() {
        let mut a = vec![0.0f32, 30.0];
        gate_in_place(&mut a, &[0.5, 0.5], &[1.0, 1.0]);
        let e = 0.5f32.exp();
        assert!((a[0] + e * (1.0f32 + 1.0f32.exp()).ln()).abs() < 1e-5);
        assert!((a[1] + e * 31.0).abs() < 1e-4);
    }
}
