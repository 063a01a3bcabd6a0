//! Model architectures, one file each, plus the block and causal-LM shell they share.

pub mod autodiff;
pub mod causal_lm;
pub mod gated_deltanet;
pub mod gated_deltaproduct;
pub mod mixer;

pub use causal_lm::{Capture, CausalLm, Logits};
