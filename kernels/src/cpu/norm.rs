//! Output RMSNorm with an optional gate (model-spec.md §1.3 step 9), all in fp32.

use super::prep::sigmoid;

/// Activation applied to the output gate `z` (`output_gate_activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateActivation {
    /// `y · z · sigmoid(z)` (fla's `swish` / `silu`).
    Swish,
    /// `y · sigmoid(z)`.
    Sigmoid,
}

/// Per row of `dim` values: `y = x / sqrt(mean(x²) + eps) · w`, then times the gate when
/// `z` is given. `x` is overwritten with `y`.
pub fn gated_rms_norm(x: &mut [f32], z: Option<&[f32]>, weight: &[f32], eps: f32, act: GateActivation) {
    let dim = weight.len();
    for (r, row) in x.chunks_mut(dim).enumerate() {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            let mut y = *v * inv * weight[i];
            if let Some(z) = z {
                let zi = z[r * dim + i];
                y *= match act {
                    GateActivation::Swish => zi * sigmoid(zi),
                    GateActivation::Sigmoid => sigmoid(zi),
                };
            }
            *v = y;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_then_gates() {
        let mut x = vec![1.0f32, -1.0];
        gated_rms_norm(&mut x, Some(&[0.0, 2.0]), &[2.0, 3.0], 0.0, GateActivation::Swish);
        // rms = 1 → [2, -3]; swish(0) = 0, swish(2) = 2·σ(2).
        assert_eq!(x[0], 0.0);
        assert!((x[1] + 3.0 * 2.0 * sigmoid(2.0)).abs() < 1e-6);
    }
}
