//! Batched sampling where the logits are: one rule per row (temperature, top-k, top-p, min-p,
//! sparse logit adjustments, an optional token bitmask, the top-n log-probabilities to report),
//! and only the drawn tokens come back. The rule is [`crate::cpu::sample`]'s; the GPU runs the
//! same rule with the same random numbers (`cuda/sample.cu`).

use candle_core::{DType, Tensor};

use crate::{KernelError, Result};

/// Most log-probabilities a row can ask for (OpenAI's limit).
pub const MAX_TOP: usize = 20;

/// How one row draws its token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowRule {
    /// Which row of the logits this draw reads (several draws may read one row).
    pub row: u32,
    /// 0 → greedy (largest logit, lowest id on ties); otherwise the logits are divided by it.
    pub temperature: f32,
    /// Keep the tokens whose scaled logit is at least the k-th largest (ties kept); 0 → off.
    pub top_k: u32,
    /// Keep the smallest set of most likely tokens whose probability reaches p (ties at the
    /// cut kept); 1 → off.
    pub top_p: f32,
    /// `ln(min_p)`: keep tokens with `p ≥ min_p · p_max`; −∞ → off.
    pub ln_min_p: f32,
    /// The random stream's seed and which draw of it this is (the draw counter of a sequence).
    pub seed: u64,
    /// See `seed`.
    pub draw: u64,
    /// How many of the most likely tokens (under the model's own logits) to report, ≤ [`MAX_TOP`].
    pub top_logprobs: u32,
    /// `adjust[adjust_from..adjust_from + adjust_len]` of the batch apply to this row.
    pub adjust_from: u32,
    /// See `adjust_from`.
    pub adjust_len: u32,
    /// The row's token bitmask: `masks[m·words..(m+1)·words]` of the batch for `Some(m)`.
    pub mask: Option<u32>,
}

impl Default for RowRule {
    /// Row 0 at temperature 1 with no cut, adjustment, mask or top log-probabilities; seed 0,
    /// draw 0.
    fn default() -> Self {
        Self {
            row: 0,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            ln_min_p: f32::NEG_INFINITY,
            seed: 0,
            draw: 0,
            top_logprobs: 0,
            adjust_from: 0,
            adjust_len: 0,
            mask: None,
        }
    }
}

/// A change to one token's logit before the draw, in this order: `+ bias`; then, when
/// `repetition ≠ 1`, a positive logit divided by it and a negative one multiplied; then
/// `− subtract` (presence and frequency penalties).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adjust {
    /// The token.
    pub token: u32,
    /// Added first.
    pub bias: f32,
    /// HF-style repetition penalty; 1 → none.
    pub repetition: f32,
    /// Subtracted last.
    pub subtract: f32,
}

/// A batch of draws over one logits tensor.
#[derive(Debug, Clone, Copy)]
pub struct SampleBatch<'a> {
    /// One rule per draw.
    pub rules: &'a [RowRule],
    /// The adjustments the rules point into.
    pub adjust: &'a [Adjust],
    /// Token bitmasks, `words` each (32 tokens a word, lowest bit first; tokens past a mask are
    /// disallowed).
    pub masks: &'a [u32],
    /// Words per mask.
    pub words: usize,
}

/// A drawn token.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    /// The token.
    pub token: u32,
    /// Its log-probability under the model's own logits (before adjustments, mask and
    /// temperature).
    pub logprob: f32,
    /// The most likely tokens under the model's own logits with their log-probabilities, most
    /// likely first (lower id first on ties).
    pub top: Vec<(u32, f32)>,
}

/// What a draw gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A token.
    Token(Drawn),
    /// The row's logits hold NaN or ±∞ (any token drawn from them would be arbitrary).
    NonFinite {
        /// How many.
        count: usize,
        /// The first such token id.
        first: usize,
    },
    /// The mask and adjustments left no token.
    NothingAllowed,
}

impl SampleBatch<'_> {
    /// Checks every rule against a `[rows, vocab]` logits tensor.
    fn check(&self, rows: usize) -> Result<()> {
        let bad = |input: &'static str, expected: String, actual: usize| {
            Err(KernelError::Shape { op: "sample", input, expected, actual: vec![actual] })
        };
        if !self.masks.len().is_multiple_of(self.words.max(1)) || (self.words == 0 && !self.masks.is_empty()) {
            return bad("masks", format!("a multiple of {} words", self.words), self.masks.len());
        }
        let masks = self.masks.len().checked_div(self.words).unwrap_or(0);
        for r in self.rules {
            if r.row as usize >= rows {
                return bad("rules.row", format!("rows below {rows}"), r.row as usize);
            }
            if r.top_logprobs as usize > MAX_TOP {
                return bad("rules.top_logprobs", format!("at most {MAX_TOP}"), r.top_logprobs as usize);
            }
            if (r.adjust_from as usize).saturating_add(r.adjust_len as usize) > self.adjust.len() {
                return bad("rules.adjust", format!("within {} adjustments", self.adjust.len()), (r.adjust_from + r.adjust_len) as usize);
            }
            if r.mask.is_some_and(|m| m as usize >= masks) {
                return bad("rules.mask", format!("masks below {masks}"), r.mask.unwrap_or_default() as usize);
            }
            let valid = r.temperature >= 0.0 && r.temperature.is_finite() && r.top_p > 0.0 && r.top_p <= 1.0 && r.ln_min_p <= 0.0;
            if !valid {
                return bad("rules", "temperature ≥ 0, top_p in (0, 1], ln_min_p ≤ 0".into(), r.row as usize);
            }
        }
        Ok(())
    }
}

/// The device's word layout of rules, adjustments and results (`cuda/sample.cu` reads it).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod wire {
    use super::{Drawn, Outcome, SampleBatch, MAX_TOP};

    /// Words of a rule on the device (`cuda/sample.cu` reads them in this order).
    pub(crate) const RULE_WORDS: usize = 13;
    /// Words of an adjustment on the device.
    pub(crate) const ADJUST_WORDS: usize = 4;
    /// Words of a draw's result on the device: status, token or first, logprob or count, top
    /// count, then (token, logprob) pairs.
    pub(crate) const OUT_WORDS: usize = 4 + 2 * MAX_TOP;
    /// No mask, in a rule's mask word.
    pub(crate) const NO_MASK: u32 = u32::MAX;

    /// The rules, adjustments and masks as one buffer of 32-bit words (one upload), and where
    /// the adjustments and masks start in it.
    pub(crate) fn pack(batch: &SampleBatch<'_>) -> (Vec<u32>, usize, usize) {
        let adjust_at = batch.rules.len() * RULE_WORDS;
        let masks_at = adjust_at + batch.adjust.len() * ADJUST_WORDS;
        let mut w = Vec::with_capacity(masks_at + batch.masks.len());
        for r in batch.rules {
            w.extend_from_slice(&[
                r.row,
                r.temperature.to_bits(),
                r.top_k,
                r.top_p.to_bits(),
                r.ln_min_p.to_bits(),
                r.seed as u32,
                (r.seed >> 32) as u32,
                r.draw as u32,
                (r.draw >> 32) as u32,
                r.top_logprobs,
                r.adjust_from,
                r.adjust_len,
                r.mask.unwrap_or(NO_MASK),
            ]);
        }
        for a in batch.adjust {
            w.extend_from_slice(&[a.token, a.bias.to_bits(), a.repetition.to_bits(), a.subtract.to_bits()]);
        }
        w.extend_from_slice(batch.masks);
        (w, adjust_at, masks_at)
    }

    /// Reads one draw's result words (`OUT_WORDS` of them).
    pub(crate) fn unpack(w: &[u32]) -> Outcome {
        match w[0] {
            0 => {
                let n = (w[3] as usize).min(MAX_TOP);
                let top = (0..n).map(|j| (w[4 + 2 * j], f32::from_bits(w[5 + 2 * j]))).collect();
                Outcome::Token(Drawn { token: w[1], logprob: f32::from_bits(w[2]), top })
            }
            1 => Outcome::NonFinite { count: w[2] as usize, first: w[1] as usize },
            _ => Outcome::NothingAllowed,
        }
    }
}

/// Draws one token per rule from `logits` `[rows, vocab]` where they are; only the results
/// cross to the host.
pub fn sample(logits: &Tensor, batch: &SampleBatch<'_>) -> Result<Vec<Outcome>> {
    let (rows, vocab) = super::dims2("sample", "logits", logits)?;
    batch.check(rows)?;
    if batch.rules.is_empty() {
        return Ok(vec![]);
    }
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() {
        return crate::cuda::sample(logits, batch);
    }
    let v = super::cpu_f32("sample", &logits.to_dtype(DType::F32)?)?;
    use rayon::prelude::*;
    Ok(batch
        .rules
        .par_iter()
        .map(|r| {
            let row = &v[r.row as usize * vocab..(r.row as usize + 1) * vocab];
            let adjust = &batch.adjust[r.adjust_from as usize..(r.adjust_from + r.adjust_len) as usize];
            let mask = r.mask.map(|m| &batch.masks[m as usize * batch.words..(m as usize + 1) * batch.words]);
            crate::cpu::sample::draw(row, r, adjust, mask)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::wire::{ADJUST_WORDS, RULE_WORDS};
    use super::*;
    use candle_core::Device;

    fn rule(row: u32) -> RowRule {
        RowRule { row, temperature: 0.0, seed: 1, ..RowRule::default() }
    }

    #[test]
    fn rows_are_read_by_index_and_bad_rules_are_refused() {
        let logits = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 5.0, 1.0, 0.0], (2, 3), &Device::Cpu).unwrap();
        let rules = [rule(1), rule(0), rule(1)];
        let b = SampleBatch { rules: &rules, adjust: &[], masks: &[], words: 0 };
        let got: Vec<u32> = sample(&logits, &b)
            .unwrap()
            .into_iter()
            .map(|o| match o {
                Outcome::Token(d) => d.token,
                o => panic!("{o:?}"),
            })
            .collect();
        assert_eq!(got, vec![0, 2, 0]);
        let e = sample(&logits, &SampleBatch { rules: &[rule(2)], ..b }).unwrap_err().to_string();
        assert!(e.contains("rules.row") && e.contains("rows below 2"), "{e}");
        let many = RowRule { top_logprobs: 21, ..rule(0) };
        assert!(sample(&logits, &SampleBatch { rules: &[many], ..b }).is_err());
        let masked = RowRule { mask: Some(0), ..rule(0) };
        assert!(sample(&logits, &SampleBatch { rules: &[masked], ..b }).is_err());
    }

    #[test]
    fn packed_words_round_trip_the_fields_the_device_reads() {
        let r = RowRule { seed: 0x1234_5678_9abc_def0, draw: 7, top_k: 5, mask: Some(0), ..rule(0) };
        let a = Adjust { token: 9, bias: 1.5, repetition: 2.0, subtract: 0.25 };
        let (w, adjust_at, masks_at) = wire::pack(&SampleBatch { rules: &[r], adjust: &[a], masks: &[3], words: 1 });
        assert_eq!((adjust_at, masks_at, w.len()), (RULE_WORDS, RULE_WORDS + ADJUST_WORDS, RULE_WORDS + ADJUST_WORDS + 1));
        assert_eq!((w[5], w[6], w[7], w[2], w[12]), (0x9abc_def0, 0x1234_5678, 7, 5, 0));
        assert_eq!(f32::from_bits(w[adjust_at + 2]), 2.0);
        assert_eq!(w[masks_at], 3);
    }
}
