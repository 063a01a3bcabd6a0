//! The channel mixer: fla's `GatedMLP` with `swish`, `down_proj(silu(gate_proj x) · up_proj x)`
//! (model-spec.md §1.3 "Block", §1.5 for the legacy fused layout).

use candle_nn::Linear;

use super::linear::{linear, project_delta, FusedInput};
use super::norm::{Delta, SubInput};
use crate::error::Result;
use crate::weights::Weights;

/// Part indices of the fused `[gate | up]` projection.
pub(crate) const GATE: usize = 0;
pub(crate) const UP: usize = 1;

/// SwiGLU MLP with `gate_proj` and `up_proj` run as one GEMM (one launch, and one pass over x,
/// per step).
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `[gate | up]`.
    pub(crate) gate_up: FusedInput,
    pub(crate) down_proj: Linear,
}

impl Mlp {
    /// Loads `gate_proj`, `up_proj` and `down_proj` for hidden size `d` and intermediate `i`.
    pub fn load(w: &Weights<'_>, d: usize, i: usize) -> Result<Self> {
        // Legacy fused layout (§1.5): gate_proj [2I, D] = [gate; up], no up_proj.
        let fused = !w.contains("up_proj.weight") && w.shape("gate_proj.weight") == Some(vec![2 * i, d]);
        let (gate_proj, up_proj) = if fused {
            let both = w.get(&[2 * i, d], "gate_proj.weight")?;
            (Linear::new(both.narrow(0, 0, i)?, None), Linear::new(both.narrow(0, i, i)?, None))
        } else {
            (linear(w, i, d, "gate_proj.weight")?, linear(w, i, d, "up_proj.weight")?)
        };
        Ok(Self { gate_up: FusedInput::new(&[&gate_proj, &up_proj])?, down_proj: linear(w, d, i, "down_proj.weight")? })
    }

    /// The same MLP on `dev`.
    pub fn to_device(&self, dev: &candle_core::Device) -> Result<Self> {
        Ok(Self { gate_up: self.gate_up.to_device(dev)?, down_proj: super::linear::linear_to(&self.down_proj, dev)? })
    }

    /// One tensor parallel rank's slice: its share of the intermediate channels (`gate_proj` and
    /// `up_proj` rows, `down_proj` columns); its output is a partial sum.
    pub fn shard(&self, s: crate::tensor_parallel::Shard) -> Result<Self> {
        let i = self.down_proj.weight().dim(1)?;
        let part = s.part(i, "intermediate_size")?;
        let rows = |p: usize| -> Result<Linear> {
            Ok(Linear::new(crate::tensor_parallel::rows_at(&self.gate_up.weight(p)?, std::slice::from_ref(&part))?, None))
        };
        Ok(Self {
            gate_up: FusedInput::new(&[&rows(GATE)?, &rows(UP)?])?,
            down_proj: Linear::new(crate::tensor_parallel::columns(self.down_proj.weight(), &part)?, None),
        })
    }

    /// `x` `[N, D]` → `[N, D]`; the same for prefill and decode (no per-sequence state).
    pub fn forward(&self, x: &SubInput<'_>) -> Result<Delta> {
        // A one-row decode step: SwiGLU formed by the fused projection's kernel (gate and up rows
        // paired in its blocks), so the down projection is a plain GEMV.
        let i = self.down_proj.weight().dim(1)?;
        if self.gate_up.offset(UP) == i && self.gate_up.offset(UP + 1) == 2 * i {
            if let Some(act) = x.project_swiglu(self.gate_up.linear(), i)? {
                return project_delta(&self.down_proj, &act);
            }
            // A decode step past the GEMV kernels' rows: SwiGLU formed in the epilogue of the
            // skinny GEMM that runs `[gate | up]` (one launch where two ran). Below those rows x
            // is left for the fused kernels to form.
            if x.rows()? > deltaserve_kernels::ops::SMALL_BATCH_LINEAR_MAX_ROWS {
                if let Some(act) = deltaserve_kernels::ops::skinny_swiglu(x.x()?, self.gate_up.linear().weight(), i)? {
                    return project_delta(&self.down_proj, &act);
                }
            }
        }
        let y = self.gate_up.forward_input(x)?;
        let (gate, up) = (y.part(GATE)?, y.part(UP)?);
        // A decode step's few rows: SwiGLU formed inside the down projection's kernel.
        if let Some(out) = deltaserve_kernels::ops::small_batch_swiglu_linear(&gate, &up, self.down_proj.weight())? {
            return Ok(Delta::Rows(out));
        }
        project_delta(&self.down_proj, &deltaserve_kernels::ops::swiglu(&gate, &up)?)
    }
}
