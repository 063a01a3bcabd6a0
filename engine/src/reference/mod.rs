//! The reference forward: the whole model from a zero state in plain, differentiable candle
//! tensor ops over the serving model's weights. Pruning runs it, not the serving path: its
//! calibration watches activations through an [`Observer`], and its `grad` method
//! differentiates [`lm_loss`] with respect to the q/k projections ([`QkProj`]).
//!
//! It computes what [`CausalLm::prefill`] computes (a parity test checks it) but keeps every
//! intermediate, so its memory grows with the window: see [`ops`].

pub mod ops;

use candle_core::{DType, Tensor};
use candle_nn::Module;
use deltaserve_kernels::ops::{interleave_householder, last_householder_step};

use crate::error::{EngineError, Result};
use crate::models::block::{ChannelMixer, TokenMixer};
use crate::models::delta_net as dn;
use crate::models::gated_deltanet::{self as gdn, GatedDeltaNet};
use crate::models::gated_deltaproduct::{self as gdp, GatedDeltaProduct};
use crate::models::mlp::{Mlp, GATE, UP};
use crate::models::output_head::OutputHead;
use crate::models::short_conv::ShortConv;
use crate::models::CausalLm;

/// One layer's `q_proj` / `k_proj` weights, possibly autograd variables.
#[derive(Debug, Clone)]
pub struct QkProj {
    /// `q_proj.weight` `[H·K, D]`.
    pub q: Tensor,
    /// `k_proj.weight` `[n·H·K, D]`.
    pub k: Tensor,
}

/// Watches activations of a reference forward, layer by layer.
pub trait Observer {
    /// The token mixer's input (the `attn_norm` output, `q_proj`'s input) `[T, D]`.
    fn mixer_input(&mut self, layer: usize, x: &Tensor);
    /// q `[T, H·K]` and k `[T, n·H·K]` after the short conv and SiLU, before the L2 norm, f32.
    fn query_key(&mut self, layer: usize, q: &Tensor, k: &Tensor);
}

/// Every layer's `q_proj` / `k_proj` weights, in layer order.
pub fn qk_proj(model: &CausalLm) -> Result<Vec<QkProj>> {
    refuse_hybrids(model)?;
    model
        .layers
        .iter()
        .map(|b| match &b.attn {
            TokenMixer::GatedDeltaNet(m) => Ok(QkProj { q: m.input.weight(gdn::Q)?, k: m.input.weight(gdn::K)? }),
            TokenMixer::GatedDeltaProduct(m) => Ok(QkProj { q: m.input.weight(gdp::Q)?, k: m.input.weight(gdp::K)? }),
            TokenMixer::DeltaNet(m) => Ok(QkProj { q: m.input.weight(dn::Q)?, k: m.input.weight(dn::K)? }),
            TokenMixer::Attention(_) => Err(hybrid_error(model)),
        })
        .collect()
}

fn hybrid_error(model: &CausalLm) -> EngineError {
    EngineError::Invalid {
        field: "model_type",
        expected: "an fla model without attention layers for the reference forward".into(),
        actual: format!(
            "`{}` with {} attention layers",
            model.config().model_type(),
            model.config().layers.len() - model.config().num_linear_layers()
        ),
    }
}

/// The reference forward follows fla's pure models only.
fn refuse_hybrids(model: &CausalLm) -> Result<()> {
    if model.config().is_hybrid() || model.config().family != crate::config::Family::Fla {
        return Err(hybrid_error(model));
    }
    Ok(())
}

/// Logits `[T, vocab]` of `tokens` from a zero state, with each layer's `q_proj`/`k_proj`
/// taken from `qk` (one per layer), reporting activations to `observer`. Needs an f32 model.
pub fn logits(model: &CausalLm, tokens: &[u32], qk: &[QkProj], mut observer: Option<&mut dyn Observer>) -> Result<Tensor> {
    if model.dtype() != DType::F32 {
        return Err(EngineError::Invalid {
            field: "dtype",
            expected: "f32 for the reference forward".into(),
            actual: format!("{:?}", model.dtype()),
        });
    }
    if qk.len() != model.layers.len() || tokens.is_empty() {
        return Err(EngineError::Invalid {
            field: "qk / tokens",
            expected: format!("{} layers' weights and at least one token", model.layers.len()),
            actual: format!("{} layers, {} tokens", qk.len(), tokens.len()),
        });
    }
    refuse_hybrids(model)?;
    model.check_tokens(tokens)?;
    let mut h = model.embed(tokens)?;
    for (b, w) in model.layers.iter().zip(qk) {
        let x = ops::rms_norm(&h, &b.attn_norm.weight, b.attn_norm.eps)?;
        if let Some(o) = observer.as_deref_mut() {
            o.mixer_input(b.layer_idx, &x);
        }
        let obs = Watch { observer: &mut observer, layer: b.layer_idx };
        let a = match &b.attn {
            TokenMixer::GatedDeltaNet(m) => gated_deltanet(m, &x, w, obs)?,
            TokenMixer::GatedDeltaProduct(m) => gated_deltaproduct(m, &x, w, obs)?,
            TokenMixer::Attention(_) => return Err(hybrid_error(model)),
            TokenMixer::DeltaNet(_) => {
                return Err(EngineError::Invalid {
                    field: "model_type",
                    expected: "gated_deltanet or gated_deltaproduct for the reference forward".into(),
                    actual: "delta_net".into(),
                })
            }
        };
        let r = (h + a)?;
        let x = ops::rms_norm(&r, &b.mlp_norm.weight, b.mlp_norm.eps)?;
        let ChannelMixer::Mlp(mlp_) = &b.mlp else { return Err(hybrid_error(model)) };
        h = (&r + mlp(mlp_, &x)?)?;
    }
    let h = ops::rms_norm(&h, &model.norm.weight, model.norm.eps)?;
    Ok(model.lm_head.forward(&h)?)
}

/// The LM loss of one window (fla's: mean cross-entropy of predicting `tokens[1..]`), as a
/// differentiable scalar; see [`logits`].
pub fn lm_loss(model: &CausalLm, tokens: &[u32], qk: &[QkProj]) -> Result<Tensor> {
    if tokens.len() < 2 {
        return Err(EngineError::Invalid { field: "tokens", expected: "at least two tokens".into(), actual: tokens.len().to_string() });
    }
    let t = tokens.len();
    let logits = logits(model, &tokens[..t - 1], qk, None)?;
    let targets = Tensor::new(&tokens[1..], model.device())?;
    Ok(candle_nn::loss::cross_entropy(&logits, &targets)?)
}

/// `x @ wᵀ` for part `i` of a fused projection.
fn part(x: &Tensor, input: &crate::models::linear::FusedInput, i: usize) -> Result<Tensor> {
    ops::linear(x, &input.weight(i)?)
}

/// The short conv + SiLU from a zero conv state.
fn short_conv(conv: &ShortConv, x: &Tensor) -> Result<Tensor> {
    match &conv.weight {
        Some(wt) => ops::causal_conv_silu(x, wt),
        None => Ok(x.silu()?),
    }
}

/// The observer, if any, and the layer it is watching.
struct Watch<'a, 'o> {
    observer: &'a mut Option<&'o mut dyn Observer>,
    layer: usize,
}

impl Watch<'_, '_> {
    /// Reports q (the first `key_dim` columns of the conv output) and k (the next `k_width`).
    fn query_key(self, c: &Tensor, key_dim: usize, k_width: usize) -> Result<()> {
        if let Some(o) = self.observer.as_deref_mut() {
            o.query_key(self.layer, &c.narrow(1, 0, key_dim)?, &c.narrow(1, key_dim, k_width)?);
        }
        Ok(())
    }
}

/// [`GatedDeltaNet`] over `x` `[T, D]` (model-spec.md §1.3), q/k projections from `qk`.
fn gated_deltanet(m: &GatedDeltaNet, x: &Tensor, qk: &QkProj, obs: Watch<'_, '_>) -> Result<Tensor> {
    let t = x.dim(0)?;
    let (h, hv, k, vd) = (m.num_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim);
    let proj = Tensor::cat(&[ops::linear(x, &qk.q)?, ops::linear(x, &qk.k)?, part(x, &m.input, gdn::V)?], 1)?;
    let c = short_conv(&m.conv, &proj)?;
    obs.query_key(&c, h * k, h * k)?;
    let q = ops::l2norm(&c.narrow(1, 0, h * k)?.reshape((t, h, k))?)?;
    let kk = ops::l2norm(&c.narrow(1, h * k, h * k)?.reshape((t, h, k))?)?;
    let v = c.narrow(1, 2 * h * k, hv * vd)?.reshape((t, hv, vd))?;
    let beta = ops::beta(&part(x, &m.input, gdn::B)?, m.allow_neg_eigval)?;
    let g = ops::gate(&part(x, &m.input, gdn::A)?, &m.a_log, &m.dt_bias)?;
    let o = ops::chunk_gated_delta_rule(&q, &kk, &v, &beta, Some(&g), m.scale as f64)?;
    let z = if m.out.gated { Some(part(x, &m.input, gdn::G)?) } else { None };
    output_head(&m.out, &o, z)
}

/// [`GatedDeltaProduct`] over `x` `[T, D]`: the interleaved T·n sequence (model-spec.md §2.3),
/// q/k projections from `qk`.
fn gated_deltaproduct(m: &GatedDeltaProduct, x: &Tensor, qk: &QkProj, obs: Watch<'_, '_>) -> Result<Tensor> {
    let t = x.dim(0)?;
    let (h, k, vd, n) = (m.num_heads, m.head_k_dim, m.head_v_dim, m.num_householder);
    let proj = Tensor::cat(&[ops::linear(x, &qk.q)?, ops::linear(x, &qk.k)?, part(x, &m.input, gdp::V)?], 1)?;
    let c = short_conv(&m.conv, &proj)?;
    obs.query_key(&c, h * k, n * h * k)?;
    let q = ops::l2norm(&c.narrow(1, 0, h * k)?.reshape((t, h, k))?)?;
    let kk = ops::l2norm(&c.narrow(1, h * k, n * h * k)?.reshape((t * n, h, k))?)?;
    let v = c.narrow(1, (1 + n) * h * k, n * h * vd)?.reshape((t * n, h, vd))?;
    let beta = ops::beta(&part(x, &m.input, gdp::B)?, m.allow_neg_eigval)?.reshape((t * n, h))?;
    let g = match &m.forget {
        Some(f) => Some(ops::gate(&part(x, &m.input, m.a_part)?, &f.a_log, &f.dt_bias)?),
        None => None,
    };
    let (q, g) = interleave_householder(&q, g.as_ref(), n)?;
    let o = ops::chunk_gated_delta_rule(&q, &kk, &v, &beta, g.as_ref(), m.scale as f64)?;
    let o = last_householder_step(&o, n)?;
    let z = if m.out.gated { Some(part(x, &m.input, m.g_part)?) } else { None };
    output_head(&m.out, &o, z)
}

/// Gated RMSNorm of `o` `[T, HV, Vd]` by the `g_proj` output `z` `[T, HV·Vd]`, then `o_proj`.
fn output_head(out: &OutputHead, o: &Tensor, z: Option<Tensor>) -> Result<Tensor> {
    let n = o.dim(0)?;
    let z = z.map(|z| z.reshape((n, out.num_v_heads, out.head_v_dim))).transpose()?;
    let y = ops::gated_rms_norm(o, z.as_ref(), &out.o_norm, out.eps, out.act)?;
    Ok(out.o_proj.forward(&y.reshape((n, out.num_v_heads * out.head_v_dim))?)?)
}

/// The SwiGLU MLP in tensor ops.
fn mlp(m: &Mlp, x: &Tensor) -> Result<Tensor> {
    let h = (part(x, &m.gate_up, GATE)?.silu()? * part(x, &m.gate_up, UP)?)?;
    Ok(m.down_proj.forward(&h)?)
}
