//! The sparse mixture-of-experts block of Qwen3-Next and Qwen3.5-MoE (hybrid-spec.md §4.3):
//! a softmax router picks k of E SwiGLU experts per token, and a shared SwiGLU expert, gated by
//! a sigmoid, is added to their weighted sum.

use candle_core::Tensor;
use candle_nn::Linear;
use deltaserve_kernels::ops::{self, ExpertWeights, SharedExpert};

use super::linear::{linear, linear_to, project};
use super::mlp::Mlp;
use super::norm::SubInput;
use crate::config::MoeSpec;
use crate::error::{Result, WeightError};
use crate::tensor_parallel::{ExpertSplit, Shard};
use crate::weights::Weights;

/// The routed experts of one layer, packed as transformers keeps them in memory (or the run of
/// them an expert parallel rank holds).
#[derive(Debug, Clone)]
pub struct Experts {
    /// `[E, 2I, D]`: rows `[0, I)` of expert e are its `gate_proj`, rows `[I, 2I)` its `up_proj`.
    pub(crate) gate_up: Tensor,
    /// `[E, D, I]`.
    pub(crate) down: Tensor,
    /// The router's index of expert 0 here.
    pub(crate) first: usize,
}

impl Experts {
    /// Loads packed `experts.gate_up_proj` / `experts.down_proj` (either axis order of the last
    /// two: `down_proj`'s shape tells which), or `experts.{e}.{gate,up,down}_proj.weight` one by
    /// one, stacked here (one layer's experts at a time, so loading never holds twice the model).
    pub fn load(w: &Weights<'_>, spec: &MoeSpec, d: usize) -> Result<Self> {
        let (e, i) = (spec.num_experts, spec.expert_intermediate);
        if w.contains("experts.gate_up_proj") {
            let transposed = w.shape("experts.down_proj") == Some(vec![e, i, d]) && i != d;
            return Ok(if transposed {
                Self {
                    gate_up: w.get(&[e, d, 2 * i], "experts.gate_up_proj")?.transpose(1, 2)?.contiguous()?,
                    down: w.get(&[e, i, d], "experts.down_proj")?.transpose(1, 2)?.contiguous()?,
                    first: 0,
                }
            } else {
                Self { gate_up: w.get(&[e, 2 * i, d], "experts.gate_up_proj")?, down: w.get(&[e, d, i], "experts.down_proj")?, first: 0 }
            });
        }
        if !w.contains("experts.0.gate_proj.weight") {
            return Err(WeightError::Missing { tensor: w.key("experts.gate_up_proj"), expected: vec![e, 2 * i, d] }.into());
        }
        let (mut gate_up, mut down) = (Vec::with_capacity(e), Vec::with_capacity(e));
        for x in 0..e {
            let p = w.pp("experts").pp(x);
            gate_up.push(Tensor::cat(&[p.get(&[i, d], "gate_proj.weight")?, p.get(&[i, d], "up_proj.weight")?], 0)?);
            down.push(p.get(&[d, i], "down_proj.weight")?);
        }
        Ok(Self { gate_up: Tensor::stack(&gate_up, 0)?, down: Tensor::stack(&down, 0)?, first: 0 })
    }
}

/// The sparse MoE block of one layer (`mlp`).
#[derive(Debug, Clone)]
pub struct SparseMoe {
    /// `gate` `[E, D]`.
    pub(crate) router: Linear,
    pub(crate) experts: Experts,
    /// `shared_expert` and `shared_expert_gate` `[1, D]`.
    pub(crate) shared: Option<(Mlp, Linear)>,
    pub(crate) spec: MoeSpec,
}

impl SparseMoe {
    /// Loads the router, the experts and the shared expert of a layer's `mlp`.
    pub fn load(w: &Weights<'_>, spec: &MoeSpec, d: usize) -> Result<Self> {
        let shared = if spec.shared_intermediate > 0 {
            Some((Mlp::load(&w.pp("shared_expert"), d, spec.shared_intermediate)?, linear(w, 1, d, "shared_expert_gate.weight")?))
        } else {
            None
        };
        Ok(Self { router: linear(w, spec.num_experts, d, "gate.weight")?, experts: Experts::load(w, spec, d)?, shared, spec: *spec })
    }

    /// The same block on `dev`.
    pub fn to_device(&self, dev: &candle_core::Device) -> Result<Self> {
        let shared = match &self.shared {
            Some((mlp, gate)) => Some((mlp.to_device(dev)?, linear_to(gate, dev)?)),
            None => None,
        };
        Ok(Self {
            router: linear_to(&self.router, dev)?,
            experts: Experts {
                gate_up: self.experts.gate_up.to_device(dev)?,
                down: self.experts.down.to_device(dev)?,
                first: self.experts.first,
            },
            shared,
            spec: self.spec,
        })
    }

    /// One tensor parallel rank's slice: every expert (and the shared expert) cut to the rank's
    /// share of its intermediate channels, or the rank's E/N whole experts (the shared expert
    /// still cut), as `s.experts` says; the router and the shared expert's gate are copied, so
    /// every rank routes alike and its output is a partial sum.
    pub fn shard(&self, s: Shard) -> Result<Self> {
        let shared = match &self.shared {
            Some((mlp, gate)) => Some((mlp.shard(s)?, gate.clone())),
            None => None,
        };
        let shared_intermediate = self.spec.shared_intermediate / s.size;
        let whole = match s.experts {
            ExpertSplit::Experts => true,
            ExpertSplit::Channels => false,
            ExpertSplit::Auto => self.spec.num_experts.is_multiple_of(s.size),
        };
        if whole {
            let held = s.part(self.spec.num_experts, "num_experts")?;
            let experts = Experts {
                gate_up: self.experts.gate_up.narrow(0, held.start, held.len())?.contiguous()?,
                down: self.experts.down.narrow(0, held.start, held.len())?.contiguous()?,
                first: self.experts.first + held.start,
            };
            return Ok(Self { router: self.router.clone(), experts, shared, spec: MoeSpec { shared_intermediate, ..self.spec } });
        }
        let i = self.spec.expert_intermediate;
        let part = s.part(i, "moe_intermediate_size")?;
        let gate_up = Tensor::cat(
            &[self.experts.gate_up.narrow(1, part.start, part.len())?, self.experts.gate_up.narrow(1, i + part.start, part.len())?],
            1,
        )?
        .contiguous()?;
        let down = self.experts.down.narrow(2, part.start, part.len())?.contiguous()?;
        let spec = MoeSpec { expert_intermediate: part.len(), shared_intermediate, ..self.spec };
        Ok(Self { router: self.router.clone(), experts: Experts { gate_up, down, first: self.experts.first }, shared, spec })
    }

    /// The router's experts held here.
    pub fn experts_held(&self) -> std::ops::Range<usize> {
        let held = self.experts.gate_up.dims().first().copied().unwrap_or(0);
        self.experts.first..self.experts.first + held
    }

    /// `x` `[N, D]` → `[N, D]` in x's dtype: router logits in the compute dtype, then
    /// [`ops::sparse_moe`] (routing, experts and the gated shared expert; grouped kernels on a
    /// GPU).
    pub fn forward(&self, x: &SubInput<'_>) -> Result<Tensor> {
        // Read by the router, the shared expert and the experts: formed once.
        let x = x.x()?;
        let logits = project(&self.router, x)?;
        let shared = match &self.shared {
            Some((mlp, gate)) => Some((mlp.forward(&SubInput::Formed(x.clone()))?.into_rows()?, project(gate, x)?)),
            None => None,
        };
        let experts = ExpertWeights { gate_up: &self.experts.gate_up, down: &self.experts.down, first: self.experts.first };
        let shared = shared.as_ref().map(|(out, gate)| SharedExpert { out, gate });
        Ok(ops::sparse_moe(x, &logits, experts, self.spec.top_k, self.spec.norm_topk_prob, shared)?)
    }
}
