//! One decoder block: `r = h + token_mixer(attn_norm h)`, `h = r + channel_mixer(mlp_norm r)`
//! (model-spec.md §1.3 "Block"). The residual stream `h` stays fp32 whatever the compute dtype
//! (fla rounds it to bf16 between blocks, §3.6.8; keeping it cuts bf16 logit error by about a
//! third on the fixtures), so `fuse_norm` changes nothing here.

use candle_core::{DType, Tensor};

use super::batch::Pass;
use super::delta_net::DeltaNet;
use super::gated_deltanet::GatedDeltaNet;
use super::gated_deltaproduct::GatedDeltaProduct;
use super::mlp::Mlp;
use super::norm::{Residual, RmsNorm};
use crate::cache::CacheSpec;
use crate::error::Result;
use crate::state::LayerState;

/// A layer's token mixer: mixes along the sequence, with a per-sequence cache.
#[derive(Debug, Clone)]
pub enum TokenMixer {
    /// [`GatedDeltaNet`].
    GatedDeltaNet(GatedDeltaNet),
    /// [`GatedDeltaProduct`].
    GatedDeltaProduct(GatedDeltaProduct),
    /// [`DeltaNet`].
    DeltaNet(DeltaNet),
}

impl TokenMixer {
    /// What one sequence keeps in this layer's cache.
    pub fn cache(&self) -> CacheSpec {
        match self {
            Self::GatedDeltaNet(m) => m.cache(),
            Self::GatedDeltaProduct(m) => m.cache(),
            Self::DeltaNet(m) => m.cache(),
        }
    }

    /// `x` `[N, D]` (compute dtype) → `[N, D]`, reading and updating the slots' caches.
    pub fn forward(&self, x: &Tensor, cache: &mut LayerState, pass: &Pass<'_>) -> Result<Tensor> {
        match (self, pass) {
            (Self::GatedDeltaNet(m), Pass::Prefill { seqs, algo }) => m.prefill(x, cache, seqs, *algo),
            (Self::GatedDeltaNet(m), Pass::Decode { slots }) => m.decode(x, cache, *slots),
            (Self::GatedDeltaProduct(m), Pass::Prefill { seqs, algo }) => m.prefill(x, cache, seqs, *algo),
            (Self::GatedDeltaProduct(m), Pass::Decode { slots }) => m.decode(x, cache, *slots),
            (Self::DeltaNet(m), Pass::Prefill { seqs, algo }) => m.prefill(x, cache, seqs, *algo),
            (Self::DeltaNet(m), Pass::Decode { slots }) => m.decode(x, cache, *slots),
        }
    }
}

/// A layer's channel mixer: mixes within each token, no per-sequence state.
#[derive(Debug, Clone)]
pub enum ChannelMixer {
    /// [`Mlp`].
    Mlp(Mlp),
}

impl ChannelMixer {
    /// `x` `[N, D]` → `[N, D]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Mlp(m) => m.forward(x),
        }
    }
}

/// One pre-norm block.
#[derive(Debug, Clone)]
pub struct Block {
    pub(crate) layer_idx: usize,
    pub(crate) attn_norm: RmsNorm,
    pub(crate) attn: TokenMixer,
    pub(crate) mlp_norm: RmsNorm,
    pub(crate) mlp: ChannelMixer,
}

impl Block {
    /// `res` is the fp32 residual stream; norms run in fp32 and their outputs are rounded to the
    /// compute dtype `act` for the projections.
    pub fn forward(&self, res: &Residual, act: DType, cache: &mut LayerState, pass: &Pass<'_>) -> Result<Residual> {
        let _span = tracing::trace_span!("block", layer = self.layer_idx).entered();
        let (h, x) = self.attn_norm.add_forward(res, act)?;
        let a = self.attn.forward(&x, cache, pass)?;
        let (r, x) = self.mlp_norm.add_forward(&Residual { h, delta: Some(a) }, act)?;
        Ok(Residual { h: r, delta: Some(self.mlp.forward(&x)?) })
    }
}
