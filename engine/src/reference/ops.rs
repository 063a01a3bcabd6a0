//! The layers' math in plain candle tensor ops, so candle's autograd can differentiate the LM
//! loss (pruning's `grad` method, pruning-spec.md §2.4). It computes the same function as the
//! kernels of `deltaserve-kernels` (model-spec.md §1.3, §3.5) but keeps every intermediate for
//! the backward pass, so it is for calibration, not serving.
//!
//! Memory: the graph holds every activation of a window. Per layer and token that is a few
//! times `(D + 2·H·K + 2·HV·V)` floats plus, per 64-token chunk and value head, four 64×64
//! matrices; the logits add `3·T·vocab` floats. A 1.3B-shape model at T = 2048 needs roughly
//! 10–15 GB of host memory; shorter `--seq-len` scales it down linearly.

use candle_core::{DType, Device, Tensor, D};
use deltaserve_kernels::GateActivation;

use crate::error::Result;

/// Chunk length of the WY/UT form (model-spec.md §3.5).
const CHUNK: usize = 64;
/// fla's l2norm eps, inside the sqrt (§3.6.7).
const L2NORM_EPS: f64 = 1e-6;

/// One layer's `q_proj` / `k_proj` weights, possibly autograd variables.
#[derive(Debug, Clone)]
pub struct QkProj {
    /// `q_proj.weight` `[H·K, D]`.
    pub q: Tensor,
    /// `k_proj.weight` `[n·H·K, D]`.
    pub k: Tensor,
}

/// `x @ wᵀ` for `x` `[T, D]`, `w` `[out, D]`.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(x.matmul(&w.t()?)?)
}

/// Depthwise causal conv over time then SiLU: `x` `[T, C]`, `w` `[C, W]` → `[T, C]`,
/// starting from a zero conv state.
pub fn causal_conv_silu(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (t, _) = x.dims2()?;
    let width = w.dim(1)?;
    let padded = x.pad_with_zeros(0, width - 1, 0)?;
    let mut acc: Option<Tensor> = None;
    for i in 0..width {
        // Tap i multiplies x[t − (W−1) + i].
        let term = padded.narrow(0, i, t)?.broadcast_mul(&w.narrow(1, i, 1)?.t()?)?;
        acc = Some(match acc {
            None => term,
            Some(a) => (a + term)?,
        });
    }
    let y = acc.ok_or_else(|| candle_core::Error::Msg("conv width 0".into()))?;
    Ok(y.silu()?)
}

/// `x / sqrt(Σx² + 1e-6)` over the last dim.
pub fn l2norm(x: &Tensor) -> Result<Tensor> {
    Ok(x.broadcast_div(&(x.sqr()?.sum_keepdim(D::Minus1)? + L2NORM_EPS)?.sqrt()?)?)
}

/// `x / sqrt(mean(x²) + eps) · w` over the last dim.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    Ok(x.broadcast_div(&(ms + eps as f64)?.sqrt()?)?.broadcast_mul(w)?)
}

/// `o_norm`: RMSNorm of each value head `o` `[T, HV, V]`, times the activated gate `z`.
pub fn gated_rms_norm(o: &Tensor, z: Option<&Tensor>, w: &Tensor, eps: f32, act: GateActivation) -> Result<Tensor> {
    let y = rms_norm(o, w, eps)?;
    Ok(match (z, act) {
        (None, _) => y,
        (Some(z), GateActivation::Swish) => (y * z.silu()?)?,
        (Some(z), GateActivation::Sigmoid) => (y * candle_nn::ops::sigmoid(z)?)?,
    })
}

/// `softplus(x) = relu(x) + ln(1 + e^−|x|)`: equal to PyTorch's thresholded softplus within
/// e^−20 and free of overflow in the backward pass.
fn softplus(x: &Tensor) -> Result<Tensor> {
    Ok((x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?)?)
}

/// Log-decay `g = −exp(A_log) · softplus(a + dt_bias)`; `a` `[T, HV]`.
pub fn gate(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    Ok(softplus(&a.broadcast_add(dt_bias)?)?.broadcast_mul(&a_log.exp()?.neg()?)?)
}

/// β = sigmoid(b), doubled when negative eigenvalues are allowed.
pub fn beta(b: &Tensor, allow_neg_eigval: bool) -> Result<Tensor> {
    let s = candle_nn::ops::sigmoid(b)?;
    Ok(if allow_neg_eigval { (s * 2.0)? } else { s })
}

/// Repeats each of H heads `g` times along dim 1: `[T, H, K]` → `[T, H·g, K]` (GVA).
fn repeat_heads(x: &Tensor, g: usize) -> Result<Tensor> {
    if g == 1 {
        return Ok(x.clone());
    }
    let (t, h, k) = x.dims3()?;
    Ok(x.unsqueeze(2)?.broadcast_as((t, h, g, k))?.reshape((t, h * g, k))?)
}

/// `[T, HV, X]` → `[HV, N, C, X]`, zero-padded to N·C rows.
fn chunked(x: &Tensor, pad: usize, n: usize) -> Result<Tensor> {
    let x = x.transpose(0, 1)?.pad_with_zeros(1, 0, pad)?;
    let (hv, _, w) = x.dims3()?;
    Ok(x.reshape((hv, n, CHUNK, w))?.contiguous()?)
}

/// `(I + A)⁻¹` for strictly lower-triangular `A` `[.., C, C]`, as the finite Neumann
/// product `(I − A)(I + A²)(I + A⁴)…`, which is exact because `A^C = 0`.
fn unit_lower_inverse(a: &Tensor, device: &Device) -> Result<Tensor> {
    let eye = Tensor::eye(CHUNK, DType::F32, device)?;
    let mut p = eye.broadcast_sub(a)?;
    let mut pow = a.clone();
    let mut span = 2;
    while span < CHUNK {
        pow = pow.matmul(&pow)?;
        p = p.matmul(&pow.broadcast_add(&eye)?)?;
        span *= 2;
    }
    Ok(p)
}

/// The chunkwise gated delta rule from a zero state (§3.5): `q`, `k` `[T, H, K]` (L2-normed),
/// `v` `[T, HV, V]`, `beta` `[T, HV]`, `g` `[T, HV]` or none. Returns `o` `[T, HV, V]`.
pub fn chunk_gated_delta_rule(q: &Tensor, k: &Tensor, v: &Tensor, beta: &Tensor, g: Option<&Tensor>, scale: f64) -> Result<Tensor> {
    let (t, h, kd) = q.dims3()?;
    let (_, hv, vd) = v.dims3()?;
    let dev = q.device().clone();
    let n = t.div_ceil(CHUNK);
    let pad = n * CHUNK - t;
    let q = chunked(&repeat_heads(q, hv / h)?, pad, n)?;
    let k = chunked(&repeat_heads(k, hv / h)?, pad, n)?;
    let v = chunked(v, pad, n)?;
    let beta = chunked(&beta.unsqueeze(2)?, pad, n)?; // [HV, N, C, 1]
    let gcum = match g {
        Some(g) => chunked(&g.unsqueeze(2)?, pad, n)?.cumsum(2)?,
        None => Tensor::zeros((hv, n, CHUNK, 1), DType::F32, &dev)?,
    };
    // decay[i, j] = exp(G_i − G_j) for j ≤ i, else 0.
    let incl = Tensor::tril2(CHUNK, DType::F32, &dev)?;
    let strict = (&incl - Tensor::eye(CHUNK, DType::F32, &dev)?)?;
    let diff = gcum.broadcast_sub(&gcum.transpose(2, 3)?)?;
    let decay = diff.broadcast_mul(&incl)?.exp()?.broadcast_mul(&incl)?;
    let kt = k.transpose(2, 3)?;
    let a = k.matmul(&kt)?.mul(&decay)?.broadcast_mul(&strict)?.broadcast_mul(&beta)?;
    let tinv = unit_lower_inverse(&a, &dev)?;
    let gamma = gcum.exp()?;
    let u_tilde = tinv.matmul(&v.broadcast_mul(&beta)?)?;
    let w = tinv.matmul(&k.broadcast_mul(&(&beta * &gamma)?)?)?;
    let attn = q.matmul(&kt)?.mul(&decay)?;
    let q_gamma = q.broadcast_mul(&gamma)?;
    let g_last = gcum.narrow(2, CHUNK - 1, 1)?; // [HV, N, 1, 1]
    let k_to_end = k.broadcast_mul(&g_last.broadcast_sub(&gcum)?.exp()?)?;
    let mut s = Tensor::zeros((hv, kd, vd), DType::F32, &dev)?;
    let mut outs = Vec::with_capacity(n);
    for c in 0..n {
        let at = |x: &Tensor| -> Result<Tensor> { Ok(x.narrow(1, c, 1)?.squeeze(1)?) };
        let u = (at(&u_tilde)? - at(&w)?.matmul(&s)?)?;
        outs.push(((at(&q_gamma)?.matmul(&s)? + at(&attn)?.matmul(&u)?)? * scale)?);
        s = at(&g_last)?.exp()?.broadcast_mul(&s)?.add(&at(&k_to_end)?.transpose(1, 2)?.matmul(&u)?)?;
    }
    let o = Tensor::cat(&outs, 1)?.narrow(1, 0, t)?; // [HV, T, V]
    Ok(o.transpose(0, 1)?.contiguous()?)
}
