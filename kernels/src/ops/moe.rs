//! The sparse mixture-of-experts block's routed part (hybrid-spec.md §4.3): a softmax router's
//! top-k experts per token, each a SwiGLU, weighted and summed, plus a sigmoid-gated shared
//! expert computed by the caller.

use candle_core::{DType, Device, IndexOp, Tensor};

use super::{dims2, expect_dims};
use crate::{KernelError, Result};

/// A layer's routed experts, or the run of them one expert parallel rank holds: `gate_up`
/// `[E, 2I, D]` (rows `[0, I)` of expert e its gate, rows `[I, 2I)` its up projection) and
/// `down` `[E, D, I]`, in the activation dtype, for the router's experts `first .. first + E`.
#[derive(Debug, Clone, Copy)]
pub struct ExpertWeights<'a> {
    /// `[E, 2I, D]`.
    pub gate_up: &'a Tensor,
    /// `[E, D, I]`.
    pub down: &'a Tensor,
    /// The router's index of expert 0 here (0 unless the experts are spread over ranks).
    pub first: usize,
}

/// The shared expert's output `[N, D]` and its gate logit `[N, 1]` (before the sigmoid).
#[derive(Debug, Clone, Copy)]
pub struct SharedExpert<'a> {
    /// `[N, D]`.
    pub out: &'a Tensor,
    /// `[N, 1]`.
    pub gate: &'a Tensor,
}

/// One token's routing: `(expert, weight)` for its k experts, highest probability first.
pub type Route = Vec<(usize, f32)>;

/// The top-k of one token's router probabilities `p` `[E]` (fp32, as the references compute
/// them): the k largest, an exact tie going to the lower expert index (as `torch.topk` chose in
/// the reference fixtures), weights renormalised to sum to 1 when `normalise`.
pub fn top_k(p: &[f32], k: usize, normalise: bool) -> Route {
    let mut order: Vec<usize> = (0..p.len()).collect();
    // Stable: equal probabilities keep ascending expert order.
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let mut route: Route = order[..k.min(p.len())].iter().map(|&e| (e, p[e])).collect();
    if normalise {
        let sum: f32 = route.iter().map(|r| r.1).sum();
        for r in &mut route {
            r.1 /= sum;
        }
    }
    route
}

/// Turns the GPU's warpgroup tiles for a prompt's expert projections (`moe_wg.cu`) on (where
/// eligible) or off for the process, which then takes the wmma tiles: the GPU test compares the
/// two. Nothing changes on the CPU.
#[doc(hidden)]
pub fn set_moe_warpgroup(on: bool) {
    #[cfg(feature = "cuda")]
    crate::cuda::set_moe_warpgroup(on);
    let _ = on;
}

/// How many warpgroup expert-projection launches this process has made (0 without CUDA): the
/// GPU test checks that the path it compares ran.
#[doc(hidden)]
pub fn moe_warpgroup_launches() -> usize {
    #[cfg(feature = "cuda")]
    let launches = crate::cuda::moe_warpgroup_launches();
    #[cfg(not(feature = "cuda"))]
    let launches = 0;
    launches
}

/// `x` `[N, D]` through the routed experts whose router gave `logits` `[N, E]` (x's dtype):
/// each token's top-`k` experts by fp32 softmax probability, weights renormalised when
/// `normalise` and rounded to x's dtype (as the references round them), `Σ w_e ·
/// down_e(silu(gate_e x) ⊙ up_e x)` summed in fp32, plus `σ(shared.gate) · shared.out`.
/// Where `experts` holds only some of the router's experts (expert parallelism), the sum runs
/// over the chosen experts it holds: the ranks' outputs add up to the whole.
/// Returns `[N, D]` in x's dtype. On a GPU everything stays on the device (no host round trip:
/// decode graphs can hold it); the CPU runs each chosen expert over the rows that chose it.
pub fn sparse_moe(
    x: &Tensor,
    logits: &Tensor,
    experts: ExpertWeights<'_>,
    k: usize,
    normalise: bool,
    shared: Option<SharedExpert<'_>>,
) -> Result<Tensor> {
    const OP: &str = "sparse_moe";
    let (n, d) = dims2(OP, "x", x)?;
    let (held, two_i, _) = experts.gate_up.dims3().map_err(|_| shape(OP, "gate_up", "[E, 2I, D]", experts.gate_up))?;
    let i = two_i / 2;
    expect_dims(OP, "gate_up", experts.gate_up, &[held, 2 * i, d])?;
    expect_dims(OP, "down", experts.down, &[held, d, i])?;
    let e = logits.dims().last().copied().unwrap_or(0);
    expect_dims(OP, "logits", logits, &[n, e])?;
    if experts.first + held > e {
        return Err(KernelError::Shape {
            op: OP,
            input: "experts",
            expected: format!("experts {}..{} within the router's {e}", experts.first, experts.first + held),
            actual: vec![experts.first, held],
        });
    }
    if k == 0 || k > e {
        return Err(KernelError::Shape { op: OP, input: "top_k", expected: format!("1..={e}"), actual: vec![k] });
    }
    if let Some(s) = &shared {
        expect_dims(OP, "shared.out", s.out, &[n, d])?;
        expect_dims(OP, "shared.gate", s.gate, &[n, 1])?;
    }
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return crate::cuda::sparse_moe(x, logits, experts, k, normalise, shared);
    }
    // torch's fp32 softmax: exp(x − max) / Σ.
    let mut p = logits.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.to_vec2::<f32>()?;
    for row in &mut p {
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        row.iter_mut().for_each(|v| *v = (*v - m).exp());
        let s: f32 = row.iter().sum();
        row.iter_mut().for_each(|v| *v /= s);
    }
    let mut routes: Vec<Route> = p.iter().map(|p| top_k(p, k, normalise)).collect();
    if x.dtype() != DType::F32 {
        let flat: Vec<f32> = routes.iter().flatten().map(|r| r.1).collect();
        let rounded = Tensor::new(flat, &Device::Cpu)?.to_dtype(x.dtype())?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        for (r, w) in routes.iter_mut().flatten().zip(rounded) {
            r.1 = w;
        }
    }
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); held];
    let mut weights: Vec<Vec<f32>> = vec![Vec::new(); held];
    for (t, route) in routes.iter().enumerate() {
        for &(x, w) in route.iter().filter(|r| (experts.first..experts.first + held).contains(&r.0)) {
            rows[x - experts.first].push(t as u32);
            weights[x - experts.first].push(w);
        }
    }
    let mut out = Tensor::zeros((n, d), DType::F32, x.device())?;
    for (ex, (rows, weights)) in rows.iter().zip(&weights).enumerate().filter(|(_, (r, _))| !r.is_empty()) {
        let idx = Tensor::new(rows.as_slice(), x.device())?;
        let w = Tensor::new(weights.as_slice(), x.device())?.reshape((rows.len(), 1))?;
        let xs = x.index_select(&idx, 0)?;
        let y = super::linear(&xs, &experts.gate_up.i(ex)?)?;
        let h = super::swiglu(&y.narrow(1, 0, i)?, &y.narrow(1, i, i)?)?;
        let y = super::linear(&h, &experts.down.i(ex)?)?.to_dtype(DType::F32)?.broadcast_mul(&w)?;
        out = out.index_add(&idx, &y, 0)?;
    }
    if let Some(s) = shared {
        let g = (s.gate.to_dtype(DType::F32)?.neg()?.exp()? + 1.0)?.recip()?;
        out = (out + s.out.to_dtype(DType::F32)?.broadcast_mul(&g)?)?;
    }
    Ok(out.to_dtype(x.dtype())?)
}

fn shape(op: &'static str, input: &'static str, expected: &str, t: &Tensor) -> KernelError {
    KernelError::Shape { op, input, expected: expected.into(), actual: t.dims().to_vec() }
}

#[cfg(test)]
mod tests {
    use super::top_k;

    #[test]
    fn top_k_breaks_exact_ties_towards_the_lower_expert() {
        // Experts 1 and 3 tie for the second place: 1 wins.
        let p = [0.1, 0.25, 0.4, 0.25];
        assert_eq!(top_k(&p, 2, false), vec![(2, 0.4), (1, 0.25)]);
        // A tie for first keeps both, lower index first.
        assert_eq!(top_k(&[0.3, 0.3, 0.4], 3, false).iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 0, 1]);
        // Renormalised: 0.4 / 0.65 and 0.25 / 0.65.
        let r = top_k(&p, 2, true);
        assert!((r[0].1 - 0.615_384_6).abs() < 1e-6 && (r[1].1 - 0.384_615_4).abs() < 1e-6, "{r:?}");
    }
}
