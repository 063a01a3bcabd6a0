//! Mixture-of-experts channel mixers of Qwen3-Next and Qwen3.5-MoE (hybrid-spec.md §4.1,
//! §4.3): which layers are sparse, and the router and expert sizes.

use serde_json::Value;

use super::hybrid::{bool_or, field, invalid, layer_index, positive, usize_or};
use crate::error::ConfigError;

/// The sparse MoE block of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeSpec {
    /// E, routed experts.
    pub num_experts: usize,
    /// k, experts per token.
    pub top_k: usize,
    /// I of each routed expert's SwiGLU.
    pub expert_intermediate: usize,
    /// I of the shared expert's SwiGLU; 0: no shared expert.
    pub shared_intermediate: usize,
    /// Renormalise the k routing weights to sum to 1.
    pub norm_topk_prob: bool,
}

/// A layer's channel mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpKind {
    /// A dense SwiGLU of this intermediate size.
    Dense {
        /// I.
        intermediate: usize,
    },
    /// A sparse MoE block.
    Sparse(MoeSpec),
}

/// Reads the MoE fields of a transformers text config. `every_layer`: Qwen3.5-MoE (all layers
/// sparse, weights always renormalised); otherwise Qwen3-Next's rule: layer i is sparse iff
/// `i ∉ mlp_only_layers`, `num_experts > 0` and `(i+1) % decoder_sparse_step == 0`.
pub fn parse(text: &Value, layers: usize, dense: usize, every_layer: bool) -> Result<Vec<MlpKind>, ConfigError> {
    let e = usize_or(text, "num_experts", if every_layer { 256 } else { 512 })?;
    if e == 0 {
        if every_layer {
            return Err(invalid("num_experts", "> 0", 0));
        }
        return Ok(vec![MlpKind::Dense { intermediate: dense }; layers]);
    }
    let top_k = positive("num_experts_per_tok", usize_or(text, "num_experts_per_tok", if every_layer { 8 } else { 10 })?)?;
    if top_k > e {
        return Err(invalid("num_experts_per_tok", &format!("at most num_experts ({e})"), top_k));
    }
    let spec = MoeSpec {
        num_experts: e,
        top_k,
        expert_intermediate: positive("moe_intermediate_size", usize_or(text, "moe_intermediate_size", 512)?)?,
        shared_intermediate: usize_or(text, "shared_expert_intermediate_size", 512)?,
        norm_topk_prob: every_layer || bool_or(text, "norm_topk_prob", true)?,
    };
    if every_layer {
        return Ok(vec![MlpKind::Sparse(spec); layers]);
    }
    let step = positive("decoder_sparse_step", usize_or(text, "decoder_sparse_step", 1)?)?;
    let mut dense_only = vec![false; layers];
    if let Some(list) = field(text, "mlp_only_layers") {
        let list = list.as_array().ok_or_else(|| invalid("mlp_only_layers", "a list of layer indices", list))?;
        for i in list {
            dense_only[layer_index(i, layers, "mlp_only_layers")?] = true;
        }
    }
    Ok((0..layers)
        .map(
            |i| if !dense_only[i] && (i + 1).is_multiple_of(step) { MlpKind::Sparse(spec) } else { MlpKind::Dense { intermediate: dense } },
        )
        .collect())
}
