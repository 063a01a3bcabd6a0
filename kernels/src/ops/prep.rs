//! The mixer's per-token inputs after the conv: L2-normalised q and k, β and the fp32 gate
//! (model-spec.md §1.3 steps 4, 6, 7).

use candle_core::Tensor;

use super::{cpu_f32, dims2, expect_dims};
use crate::cpu::prep;
use crate::{KernelError, Result};

/// L2-normalises the last dim of `x` in fp32 (`x / sqrt(Σx² + 1e-6)`). Returns f32.
pub fn l2norm(x: &Tensor) -> Result<Tensor> {
    let dim = x.dims().last().copied().unwrap_or(1);
    let mut v = cpu_f32("l2norm", x)?;
    prep::l2norm_rows(&mut v, dim);
    Ok(Tensor::from_vec(v, x.shape(), x.device())?)
}

/// β = sigmoid(b) (×2 with `allow_neg_eigval`), in fp32. Returns f32 of `b`'s shape.
pub fn beta(b: &Tensor, allow_neg_eigval: bool) -> Result<Tensor> {
    let mut v = cpu_f32("beta", b)?;
    prep::beta_in_place(&mut v, allow_neg_eigval);
    Ok(Tensor::from_vec(v, b.shape(), b.device())?)
}

/// Log-decay `g = −exp(A_log)·softplus(a + dt_bias)` in fp32 for `a` `[T, HV]`.
pub fn gate(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    const OP: &str = "gate";
    let (_, hv) = dims2(OP, "a", a)?;
    expect_dims(OP, "A_log", a_log, &[hv])?;
    expect_dims(OP, "dt_bias", dt_bias, &[hv])?;
    let mut v = cpu_f32(OP, a)?;
    prep::gate_in_place(&mut v, &cpu_f32(OP, a_log)?, &cpu_f32(OP, dt_bias)?);
    Ok(Tensor::from_vec(v, a.shape(), a.device())?)
}

/// Where q and k heads sit in the conv output, for [`prepare`].
#[derive(Debug, Clone, Copy)]
pub struct QkLayout {
    /// q heads, from column 0.
    pub q_heads: usize,
    /// k heads (n·H for Gated DeltaProduct), from column `q_heads·head_dim`.
    pub k_heads: usize,
    /// Key head dim.
    pub head_dim: usize,
}

/// The mixer's per-token inputs after the conv (model-spec.md §1.3 steps 4, 6, 7), f32.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// `[N, q_heads, K]` L2-normalised.
    pub q: Tensor,
    /// `[N, k_heads, K]` L2-normalised.
    pub k: Tensor,
    /// β `[N, b's width]`.
    pub beta: Tensor,
    /// Log-decay `[N, HV]`.
    pub g: Option<Tensor>,
}

/// L2-normalises the q and k heads of `conv_out` `[N, C]`, computes β from `b` (×2 with
/// `allow_neg_eigval`) and the fp32 gate from `(a, A_log, dt_bias)`. One fused kernel on a GPU,
/// which keeps q and k in bf16 when `conv_out` and `b` are bf16; f32 otherwise.
pub fn prepare(
    conv_out: &Tensor,
    l: QkLayout,
    b: &Tensor,
    allow_neg_eigval: bool,
    gate_in: Option<(&Tensor, &Tensor, &Tensor)>,
) -> Result<Prepared> {
    const OP: &str = "prepare";
    let (n, c) = dims2(OP, "conv_out", conv_out)?;
    let (q_w, k_w) = (l.q_heads * l.head_dim, l.k_heads * l.head_dim);
    if c < q_w + k_w {
        return Err(KernelError::Shape {
            op: OP,
            input: "conv_out",
            expected: format!("at least {} columns", q_w + k_w),
            actual: vec![n, c],
        });
    }
    #[cfg(feature = "cuda")]
    if conv_out.device().is_cuda() {
        let gi = gate_in.map(|(a, a_log, dt_bias)| crate::cuda::GateInputs { a, a_log, dt_bias });
        let mult = if allow_neg_eigval { 2.0 } else { 1.0 };
        return crate::cuda::prep(conv_out, l, b, mult, gi);
    }
    let q = l2norm(&conv_out.narrow(1, 0, q_w)?.reshape((n, l.q_heads, l.head_dim))?)?;
    let k = l2norm(&conv_out.narrow(1, q_w, k_w)?.reshape((n, l.k_heads, l.head_dim))?)?;
    let g = gate_in.map(|(a, a_log, dt_bias)| gate(a, a_log, dt_bias)).transpose()?;
    Ok(Prepared { q, k, beta: beta(b, allow_neg_eigval)?, g })
}
