//! A model is embeddings, a stack of blocks and a head; a block is a token mixer (one file per
//! layer kind: [`gated_deltanet`], [`gated_deltaproduct`], [`delta_net`], and the softmax
//! [`attention`] of hybrid models; the delta rules share `delta_rule`'s stages) and a channel
//! mixer ([`mlp`]). Each token mixer declares the
//! per-sequence cache it needs ([`crate::cache::CacheSpec`]).

pub mod attention;
pub mod batch;
pub mod block;
pub mod causal_lm;
pub mod delta_net;
mod delta_rule;
pub mod gated_deltanet;
pub mod gated_deltaproduct;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod output_head;
pub mod rope;
pub mod short_conv;

pub use causal_lm::{CausalLm, Logits};
