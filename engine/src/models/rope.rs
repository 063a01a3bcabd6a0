//! Rotary position embedding, half-split (GPT-NeoX) over the first `rotary_dim` channels of
//! each head (hybrid-spec.md §1.4, §3.5 step 4, §5.4 step 3): pairs `(i, i + rot/2)`,
//! `inv_freq[i] = θ^(-2i/rot)`, angles and cos/sin in fp32. The attention op rotates q and k
//! at the rows' positions (on the GPU inside its append kernel, so a CUDA graph replays it).

use candle_core::{Device, Tensor};
use deltaserve_kernels::ops::RopeArgs;

use crate::config::RopeSpec;
use crate::error::Result;

/// One layer's rotary embedding.
#[derive(Debug, Clone)]
pub struct Rope {
    /// `θ^(-2i/rot)`, i < rot/2, f32 as the references compute it, on the model's device.
    inv_freq: Tensor,
    /// rot.
    rotary_dim: usize,
}

impl Rope {
    /// The embedding `spec` describes, with its frequencies on `device`.
    pub fn new(spec: &RopeSpec, device: &Device) -> Result<Self> {
        let rot = spec.rotary_dim;
        let inv_freq: Vec<f32> = (0..rot / 2).map(|i| 1.0 / (spec.theta as f32).powf((2 * i) as f32 / rot as f32)).collect();
        Ok(Self { inv_freq: Tensor::from_vec(inv_freq, rot / 2, device)?, rotary_dim: rot })
    }

    /// The same embedding on `dev`.
    pub fn to_device(&self, dev: &Device) -> Result<Self> {
        Ok(Self { inv_freq: self.inv_freq.to_device(dev)?, rotary_dim: self.rotary_dim })
    }

    /// The op's view of it.
    pub fn args(&self) -> RopeArgs<'_> {
        RopeArgs { inv_freq: &self.inv_freq, rotary_dim: self.rotary_dim }
    }
}
