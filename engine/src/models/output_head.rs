//! The mixer's output (model-spec.md §1.3 steps 9–10): RMSNorm over each value head, gated by
//! the activated `g_proj` output when the layer has an output gate, then `o_proj`.

use candle_core::{DType, Tensor};
use candle_nn::Linear;
use deltaserve_kernels::{ops, GateActivation};

use super::linear::{linear, project_delta};
use super::norm::Delta;
use crate::error::Result;
use crate::weights::Weights;

/// Tensor names of an output head, relative to the mixer.
#[derive(Debug, Clone, Copy)]
pub struct HeadNames<'a> {
    /// The gate's projection, if the layer has one.
    pub gate: Option<&'a str>,
    /// The norm weight `[Vd]`.
    pub norm: &'a str,
    /// The output projection `[D, HV·Vd]`.
    pub out: &'a str,
}

/// `o_norm` (gated RMSNorm over each value head) then `o_proj`.
#[derive(Debug, Clone)]
pub struct OutputHead {
    /// Whether `g_proj` exists (its weight lives in the mixer's fused input projection).
    pub(crate) gated: bool,
    /// `o_norm.weight` `[Vd]` f32.
    pub(crate) o_norm: Tensor,
    /// `o_proj` `[D, HV·Vd]`.
    pub(crate) o_proj: Linear,
    /// `norm_eps` (the block passes the config's eps to the layer).
    pub(crate) eps: f32,
    /// Gate activation.
    pub(crate) act: GateActivation,
    /// HV.
    pub(crate) num_v_heads: usize,
    /// Vd.
    pub(crate) head_v_dim: usize,
}

impl OutputHead {
    /// The same head on `dev`.
    pub fn to_device(&self, dev: &candle_core::Device) -> Result<Self> {
        Ok(Self { o_norm: self.o_norm.to_device(dev)?, o_proj: super::linear::linear_to(&self.o_proj, dev)?, ..self.clone() })
    }

    /// Loads `o_norm` and `o_proj`, and `g_proj` when `gated` (returned apart: the mixer stacks
    /// it into its input projection).
    pub fn load(
        w: &Weights<'_>,
        hidden: usize,
        num_v_heads: usize,
        head_v_dim: usize,
        gated: bool,
        eps: f64,
        act: GateActivation,
    ) -> Result<(Self, Option<Linear>)> {
        let names = HeadNames { gate: gated.then_some("g_proj.weight"), norm: "o_norm.weight", out: "o_proj.weight" };
        Self::load_named(w, hidden, (num_v_heads, head_v_dim), &names, eps, act)
    }

    /// [`Self::load`] with other tensor names (transformers' Qwen3.5 calls them `in_proj_z`,
    /// `norm` and `out_proj`); `heads` is (HV, Vd).
    pub fn load_named(
        w: &Weights<'_>,
        hidden: usize,
        (num_v_heads, head_v_dim): (usize, usize),
        names: &HeadNames<'_>,
        eps: f64,
        act: GateActivation,
    ) -> Result<(Self, Option<Linear>)> {
        let value_dim = num_v_heads * head_v_dim;
        let g_proj = match names.gate {
            Some(g) => Some(linear(w, value_dim, hidden, g)?),
            None => None,
        };
        let head = Self {
            gated: g_proj.is_some(),
            o_norm: w.get_f32(&[head_v_dim], names.norm)?,
            o_proj: linear(w, hidden, value_dim, names.out)?,
            eps: eps as f32,
            act,
            num_v_heads,
            head_v_dim,
        };
        Ok((head, g_proj))
    }

    /// The head over value heads `heads` only: `o_proj`'s matching input columns (its output
    /// is then one rank's partial sum); the per-head norm is the same for every head.
    pub fn select(&self, heads: &std::ops::Range<usize>) -> Result<Self> {
        let cols = heads.start * self.head_v_dim..heads.end * self.head_v_dim;
        Ok(Self {
            o_proj: Linear::new(crate::tensor_parallel::columns(self.o_proj.weight(), &cols)?, None),
            num_v_heads: heads.len(),
            ..self.clone()
        })
    }

    /// `o` `[N, HV, Vd]` f32 → `[N, D]` in `dtype`, gated by `z` `[N, HV·Vd]` (`g_proj`'s output,
    /// any row stride) when the layer has an output gate. The GPU norm reads z in place and
    /// writes `dtype` directly (no f32 copy of z, no cast of the output).
    pub fn forward(&self, o: &Tensor, z: Option<&Tensor>, dtype: DType) -> Result<Delta> {
        let n = o.dim(0)?;
        // A decode step's few rows: the norm formed inside o_proj's GEMV kernel.
        if self.o_proj.bias().is_none() && self.o_proj.weight().dtype() == dtype && o.rank() == 3 {
            if let Some(out) = ops::small_batch_gated_norm_linear(o, z, &self.o_norm, self.eps, self.act, self.o_proj.weight())? {
                return Ok(Delta::Rows(out));
            }
        }
        let y = ops::gated_rms_norm(o, z, &self.o_norm, self.eps, self.act, dtype)?;
        project_delta(&self.o_proj, &y.reshape((n, self.num_v_heads * self.head_v_dim))?)
    }
}
