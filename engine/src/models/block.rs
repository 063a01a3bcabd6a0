//! One decoder block. Pre-norm (fla, Qwen3.5, OLMo-Hybrid's linear layers):
//! `r = h + token_mixer(attn_norm h)`, `h = r + channel_mixer(mlp_norm r)` (model-spec.md §1.3
//! "Block"). Post-norm (OLMo-Hybrid's attention layers, hybrid-spec.md §5.3):
//! `r = h + attn_norm(token_mixer h)`, `h = r + mlp_norm(channel_mixer r)`. The residual stream
//! `h` stays fp32 whatever the compute dtype (fla rounds it to bf16 between blocks, §3.6.8;
//! keeping it cuts bf16 logit error by about a third on the fixtures), so `fuse_norm` changes
//! nothing here.

use candle_core::DType;

use super::attention::Attention;
use super::batch::{Keep, Pass};
use super::delta_net::DeltaNet;
use super::delta_rule;
use super::gated_deltanet::GatedDeltaNet;
use super::gated_deltaproduct::GatedDeltaProduct;
use super::mlp::Mlp;
use super::moe::SparseMoe;
use super::norm::{Delta, NormedInput, Residual, RmsNorm, SubInput};
use crate::cache::CacheSpec;
use crate::error::{EngineError, Result};
use crate::state::{KvPlan, LayerCache};
use crate::tensor_parallel::GroupLink;

/// A layer's token mixer: mixes along the sequence, with a per-sequence cache.
#[derive(Debug, Clone)]
pub enum TokenMixer {
    /// [`GatedDeltaNet`].
    GatedDeltaNet(GatedDeltaNet),
    /// [`GatedDeltaProduct`].
    GatedDeltaProduct(GatedDeltaProduct),
    /// [`DeltaNet`].
    DeltaNet(DeltaNet),
    /// Softmax [`Attention`] (hybrid models).
    Attention(Attention),
}

impl TokenMixer {
    /// What one sequence keeps in this layer's cache.
    pub fn cache(&self) -> CacheSpec {
        match self {
            Self::GatedDeltaNet(m) => m.cache(),
            Self::GatedDeltaProduct(m) => m.cache(),
            Self::DeltaNet(m) => m.cache(),
            Self::Attention(m) => m.cache(),
        }
    }

    /// `x` `[N, D]` (compute dtype) → `[N, D]`, or the `keep` rows of it `[n, D]`, reading and
    /// updating the slots' caches with every row; `kv` says where each sequence sits in the KV
    /// cache.
    pub fn forward(&self, x: &SubInput<'_>, cache: &mut LayerCache, pass: &Pass<'_>, kv: &KvPlan, keep: Keep<'_>) -> Result<Delta> {
        if let Self::Attention(m) = self {
            return m.forward(x, cache.kv_mut()?, kv, keep);
        }
        let cache = cache.recurrent_mut()?;
        match self {
            Self::GatedDeltaNet(m) => delta_rule::forward(m, x, cache, pass, keep),
            Self::GatedDeltaProduct(m) => delta_rule::forward(m, x, cache, pass, keep),
            Self::DeltaNet(m) => delta_rule::forward(m, x, cache, pass, keep),
            Self::Attention(_) => unreachable!("handled above"),
        }
    }
}

/// A layer's channel mixer: mixes within each token, no per-sequence state.
#[derive(Debug, Clone)]
pub enum ChannelMixer {
    /// [`Mlp`].
    Mlp(Mlp),
    /// [`SparseMoe`] (Qwen3-Next, Qwen3.5-MoE).
    Moe(SparseMoe),
}

impl ChannelMixer {
    /// `x` `[N, D]` → `[N, D]`.
    pub fn forward(&self, x: &SubInput<'_>) -> Result<Delta> {
        match self {
            Self::Mlp(m) => m.forward(x),
            Self::Moe(m) => Ok(Delta::Rows(m.forward(x)?)),
        }
    }
}

/// Where a block's norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before each sub-block, on its input.
    Pre,
    /// After each sub-block, on its output (no input norm).
    Post,
}

/// One decoder block.
#[derive(Debug, Clone)]
pub struct Block {
    pub(crate) layer_idx: usize,
    pub(crate) placement: NormPlacement,
    pub(crate) attn_norm: RmsNorm,
    pub(crate) attn: TokenMixer,
    pub(crate) mlp_norm: RmsNorm,
    pub(crate) mlp: ChannelMixer,
    /// The tensor parallel group of a split model: both mixers' outputs are partial sums.
    pub(crate) tp: Option<GroupLink>,
}

impl Block {
    /// The same block on `dev` (its link, if split, kept).
    pub fn to_device(&self, dev: &candle_core::Device) -> Result<Self> {
        let attn = match &self.attn {
            TokenMixer::GatedDeltaNet(m) => TokenMixer::GatedDeltaNet(m.to_device(dev)?),
            TokenMixer::GatedDeltaProduct(m) => TokenMixer::GatedDeltaProduct(m.to_device(dev)?),
            TokenMixer::Attention(m) => TokenMixer::Attention(m.to_device(dev)?),
            TokenMixer::DeltaNet(m) => TokenMixer::DeltaNet(m.to_device(dev)?),
        };
        let mlp = match &self.mlp {
            ChannelMixer::Mlp(m) => ChannelMixer::Mlp(m.to_device(dev)?),
            ChannelMixer::Moe(m) => ChannelMixer::Moe(m.to_device(dev)?),
        };
        Ok(Self { attn, mlp, attn_norm: self.attn_norm.to_device(dev)?, mlp_norm: self.mlp_norm.to_device(dev)?, ..self.clone() })
    }

    /// One tensor parallel rank's slice of this block (token mixer and MLP split, norms copied),
    /// adding its partial sums over `link`'s group.
    pub fn shard(&self, link: GroupLink) -> Result<Self> {
        let s = link.shard;
        let attn = match &self.attn {
            TokenMixer::GatedDeltaNet(m) => TokenMixer::GatedDeltaNet(m.shard(s)?),
            TokenMixer::GatedDeltaProduct(m) => TokenMixer::GatedDeltaProduct(m.shard(s)?),
            TokenMixer::Attention(m) => TokenMixer::Attention(m.shard(s)?),
            TokenMixer::DeltaNet(_) => {
                return Err(EngineError::Invalid {
                    field: "tensor parallel",
                    expected: "Gated DeltaNet, Gated DeltaProduct and attention layers".into(),
                    actual: format!("layer {}: a DeltaNet layer", self.layer_idx),
                })
            }
        };
        let mlp = match &self.mlp {
            ChannelMixer::Mlp(m) => ChannelMixer::Mlp(m.shard(s)?),
            ChannelMixer::Moe(m) => ChannelMixer::Moe(m.shard(s)?),
        };
        Ok(Self { attn, mlp, tp: Some(link), ..self.clone() })
    }

    /// A sub-block's output: this rank's partial summed over the group when split.
    fn reduce(&self, partial: Delta) -> Result<Delta> {
        match &self.tp {
            Some(link) => Ok(Delta::Rows(link.sum(&partial.into_rows()?)?)),
            None => Ok(partial),
        }
    }

    /// `res` is the fp32 residual stream; norms run in fp32 and their outputs are rounded to the
    /// compute dtype `act` for the projections. Every row updates the caches; the output has the
    /// `keep` rows only, so that a pass's last block runs its output projection and channel
    /// mixer just for the rows whose logits are read.
    pub fn forward(
        &self,
        res: &Residual,
        act: DType,
        cache: &mut LayerCache,
        pass: &Pass<'_>,
        kv: &KvPlan,
        keep: Keep<'_>,
    ) -> Result<Residual> {
        let _span = tracing::trace_span!("block", layer = self.layer_idx).entered();
        if self.placement == NormPlacement::Post {
            let h = res.sum()?;
            let a = self.reduce(self.attn.forward(&SubInput::Formed(h.to_dtype(act)?), cache, pass, kv, keep)?)?.into_rows()?;
            let r = (keep.rows(h)? + self.attn_norm.forward(&a)?)?;
            let m = self.reduce(self.mlp.forward(&SubInput::Formed(r.to_dtype(act)?))?)?.into_rows()?;
            return Ok(Residual { delta: Some(Delta::Rows(self.mlp_norm.forward(&m)?)), h: r });
        }
        // Each norm is formed by the projection that first reads it (inside its GEMV kernel in a
        // decode step).
        let x = NormedInput::new(res, &self.attn_norm, act);
        let a = self.reduce(self.attn.forward(&SubInput::Normed(&x), cache, pass, kv, keep)?)?;
        let mid = Residual { h: keep.rows(x.residual()?)?, delta: Some(a) };
        let x = NormedInput::new(&mid, &self.mlp_norm, act);
        let m = self.reduce(self.mlp.forward(&SubInput::Normed(&x))?)?;
        Ok(Residual { h: x.residual()?, delta: Some(m) })
    }
}
