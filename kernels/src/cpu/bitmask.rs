//! The token bitmask over one row of logits.

/// Sets to −∞ every logit whose bit in `words` (32 tokens a word, lowest bit first) is clear,
/// and every logit past the mask. Word by word: a grammar usually allows few tokens, so most
/// words are zero and become a fill.
pub fn apply(words: &[u32], logits: &mut [f32]) {
    for (chunk, &w) in logits.chunks_mut(32).zip(words) {
        match w {
            u32::MAX => {}
            0 => chunk.fill(f32::NEG_INFINITY),
            _ => {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if (w >> b) & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
    if logits.len() > words.len() * 32 {
        logits[words.len() * 32..].fill(f32::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mask_words_apply_bit_by_bit() {
        let mut logits = vec![1.0f32; 70];
        // Word 0 allows tokens 0 and 31, word 1 none, word 2 (tokens 64..95) all; the logits
        // stop at 70.
        super::apply(&[1 | (1 << 31), 0, u32::MAX], &mut logits);
        let allowed: Vec<usize> = (0..70).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(allowed, vec![0, 31, 64, 65, 66, 67, 68, 69]);
        let mut longer = vec![1.0f32; 40];
        super::apply(&[u32::MAX], &mut longer);
        assert!(longer[..32].iter().all(|l| l.is_finite()) && longer[32..].iter().all(|l| l.is_infinite()));
    }
}
