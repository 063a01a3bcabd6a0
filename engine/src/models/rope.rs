//! Rotary position embedding, half-split (GPT-NeoX) over the first `rotary_dim` channels of
//! each head (hybrid-spec.md §1.4, §3.5 step 4, §5.4 step 3): pairs `(i, i + rot/2)`,
//! `inv_freq[i] = θ^(-2i/rot)`, angles and cos/sin in fp32.

use candle_core::{DType, Device, Tensor};

use crate::config::RopeSpec;
use crate::error::Result;

/// One layer's rotary embedding.
#[derive(Debug, Clone)]
pub struct Rope {
    /// `θ^(-2i/rot)`, i < rot/2, f32 as the references compute it.
    inv_freq: Vec<f32>,
    /// rot.
    rotary_dim: usize,
}

impl Rope {
    /// The embedding `spec` describes.
    pub fn new(spec: &RopeSpec) -> Self {
        let rot = spec.rotary_dim;
        let inv_freq = (0..rot / 2).map(|i| 1.0 / (spec.theta as f32).powf((2 * i) as f32 / rot as f32)).collect();
        Self { inv_freq, rotary_dim: rot }
    }

    /// `(cos, sin)` `[N, 1, rot/2]` f32 for the rows' absolute positions.
    pub fn tables(&self, positions: &[usize], device: &Device) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * half), Vec::with_capacity(positions.len() * half));
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let shape = (positions.len(), 1, half);
        Ok((Tensor::from_vec(cos, shape, device)?, Tensor::from_vec(sin, shape, device)?))
    }

    /// Rotates `x` `[N, H, hd]` (f32) by `tables`' angles; channels past rot pass through.
    pub fn apply(&self, x: &Tensor, (cos, sin): &(Tensor, Tensor)) -> Result<Tensor> {
        let (hd, half) = (x.dim(2)?, self.rotary_dim / 2);
        let x = x.to_dtype(DType::F32)?;
        let (x1, x2) = (x.narrow(2, 0, half)?, x.narrow(2, half, half)?);
        let y1 = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
        let y2 = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
        let mut parts = vec![y1, y2];
        if hd > self.rotary_dim {
            parts.push(x.narrow(2, self.rotary_dim, hd - self.rotary_dim)?);
        }
        Ok(Tensor::cat(&parts, 2)?)
    }
}
