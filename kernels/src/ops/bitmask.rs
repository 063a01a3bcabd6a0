//! The token bitmask of structured outputs, applied to a batch's logits where they are.

use candle_core::{DType, Tensor};

use crate::{KernelError, Result};

/// Sets to −∞ every logit of row `rows[r]` of `logits` `[B, V]` whose bit is clear in
/// `masks[r·words..(r+1)·words]` (32 tokens a word, lowest bit first; tokens past the mask are
/// disallowed). Other rows are unchanged. Returns a new f32 tensor on `logits`' device.
pub fn token_bitmask(logits: &Tensor, rows: &[u32], masks: &[u32], words: usize) -> Result<Tensor> {
    const OP: &str = "token_bitmask";
    let (b, _) = super::dims2(OP, "logits", logits)?;
    if masks.len() != rows.len() * words {
        return Err(KernelError::Shape {
            op: OP,
            input: "masks",
            expected: format!("{} words", rows.len() * words),
            actual: vec![masks.len()],
        });
    }
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= b) {
        return Err(KernelError::Shape { op: OP, input: "rows", expected: format!("rows below {b}"), actual: vec![r as usize] });
    }
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() {
        return crate::cuda::token_bitmask(logits, rows, masks, words);
    }
    let mut v = super::cpu_f32(OP, logits)?;
    let vocab = logits.dim(1)?;
    for (r, &row) in rows.iter().enumerate() {
        let row = row as usize;
        crate::cpu::bitmask::apply(&masks[r * words..(r + 1) * words], &mut v[row * vocab..(row + 1) * vocab]);
    }
    Ok(Tensor::from_vec(v, logits.shape(), logits.device())?.to_dtype(DType::F32)?)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    #[test]
    fn only_the_named_rows_are_masked() {
        let logits = Tensor::from_vec((0..3 * 40).map(|i| i as f32).collect::<Vec<_>>(), (3, 40), &Device::Cpu).unwrap();
        // Row 2 keeps tokens 1 and 33; rows 0 and 1 are untouched.
        let out = super::token_bitmask(&logits, &[2], &[0b10, 0b10], 2).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(out[0], (0..40).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(out[1], (40..80).map(|i| i as f32).collect::<Vec<_>>());
        let kept: Vec<(usize, f32)> = out[2].iter().copied().enumerate().filter(|(_, v)| v.is_finite()).collect();
        assert_eq!(kept, vec![(1, 81.0), (33, 113.0)]);
        assert!(super::token_bitmask(&logits, &[3], &[0, 0], 2).is_err());
        assert!(super::token_bitmask(&logits, &[0], &[0], 2).is_err());
    }
}
