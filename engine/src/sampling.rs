//! Logits processing and sampling with a seeded RNG.
//!
//! Order (as vLLM): logit bias, repetition penalty (prompt + output), presence and frequency
//! penalties (output only, OpenAI semantics), temperature, then top-k, top-p and min-p
//! filtering of the distribution. A temperature below [`GREEDY_BELOW`] is greedy (vLLM's
//! rule: dividing by a smaller one overflows).

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::error::{EngineError, Result};

/// Temperatures below this sample greedily: 1/T past ~1e38 overflows to ∞ and turns the
/// probabilities into NaN (vLLM uses the same 1e-5).
pub const GREEDY_BELOW: f32 = 1e-5;

/// What a request asks of the sampler. Neutral values switch a stage off.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Below [`GREEDY_BELOW`] (0 included) → greedy; otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 → off.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p; 1 → off.
    pub top_p: f32,
    /// Drop tokens below `min_p · p_max`; 0 → off.
    pub min_p: f32,
    /// HF-style: positive logits of seen tokens divided by it, negative multiplied; 1 → off.
    pub repetition_penalty: f32,
    /// Subtracted once from every token generated so far.
    pub presence_penalty: f32,
    /// Subtracted per occurrence of a generated token.
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens.
    pub logit_bias: Vec<(u32, f32)>,
    /// RNG seed; `None` draws one from the OS.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: vec![],
            seed: None,
        }
    }
}

fn invalid(field: &'static str, expected: &str, actual: impl ToString) -> EngineError {
    EngineError::Invalid { field, expected: expected.into(), actual: actual.to_string() }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// Checks every field's range; `vocab` bounds the logit-bias ids.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(invalid("temperature", ">= 0 and finite", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid("top_p", "in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(invalid("min_p", "in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(invalid("repetition_penalty", "> 0 and finite", self.repetition_penalty));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(invalid("presence_penalty", "in [-2, 2]", self.presence_penalty));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(invalid("frequency_penalty", "in [-2, 2]", self.frequency_penalty));
        }
        for &(id, b) in &self.logit_bias {
            if id as usize >= vocab {
                return Err(invalid("logit_bias", &format!("token ids < {vocab}"), id));
            }
            if !(-100.0..=100.0).contains(&b) {
                return Err(invalid("logit_bias", "values in [-100, 100]", b));
            }
        }
        Ok(())
    }
}

/// One sampled token with its log-probability under the model's distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// `log p(token)` from the unprocessed logits.
    pub logprob: f32,
}

/// Per-sequence sampler: parameters, RNG and the token history the penalties need.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    /// Occurrences of each generated token.
    generated: HashMap<u32, u32>,
    /// Tokens seen in prompt or output (repetition penalty).
    seen: HashMap<u32, ()>,
}

impl Sampler {
    /// A sampler for a sequence whose prompt is `prompt`.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let rng = match params.seed {
            Some(s) => ChaCha20Rng::seed_from_u64(s),
            None => ChaCha20Rng::from_os_rng(),
        };
        let seen = if params.repetition_penalty != 1.0 { prompt.iter().map(|&t| (t, ())).collect() } else { HashMap::new() };
        Self { params, rng, generated: HashMap::new(), seen }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token that became part of the output.
    pub fn accept(&mut self, token: u32) {
        *self.generated.entry(token).or_default() += 1;
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token, ());
        }
    }

    /// Applies bias and penalties in place.
    pub fn process(&self, logits: &mut [f32]) {
        let p = &self.params;
        for &(id, b) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        if p.repetition_penalty != 1.0 {
            for &t in self.seen.keys() {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &c) in &self.generated {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * c as f32;
                }
            }
        }
    }

    /// Picks the next token from raw logits (they are not modified). Non-finite logits are an
    /// error: any token picked from them would be arbitrary.
    pub fn sample(&mut self, raw: &[f32]) -> Result<Sampled> {
        self.sample_masked(raw, |_| {})
    }

    /// [`Self::sample`] from the tokens `mask` leaves: it sets the logits of the others to −∞
    /// (a grammar's mask, which must leave at least one). The model's logits are checked before
    /// masking, and the returned logprob is the model's.
    pub fn sample_masked(&mut self, raw: &[f32], mask: impl FnOnce(&mut [f32])) -> Result<Sampled> {
        let bad = raw.iter().filter(|l| !l.is_finite()).count();
        if bad > 0 {
            let first = raw.iter().position(|l| !l.is_finite()).unwrap_or(0);
            return Err(EngineError::NonFiniteLogits { count: bad, first });
        }
        let mut logits = raw.to_vec();
        mask(&mut logits);
        self.process(&mut logits);
        let token = if self.params.temperature < GREEDY_BELOW { argmax(&logits) } else { self.sample_stochastic(&logits) };
        Ok(Sampled { token, logprob: log_softmax_at(raw, token as usize) })
    }

    /// [`Self::sample`] from logits a grammar's mask was already applied to (on the device):
    /// −∞ marks a disallowed token; NaN or +∞ is the model's fault and fails as in
    /// [`Self::sample`]. The logprob is taken over the allowed tokens.
    pub fn sample_premasked(&mut self, masked: &[f32]) -> Result<Sampled> {
        let bad = masked.iter().filter(|l| l.is_nan() || **l == f32::INFINITY).count();
        if bad > 0 || masked.iter().all(|l| !l.is_finite()) {
            let first = masked.iter().position(|l| l.is_nan() || *l == f32::INFINITY).unwrap_or(0);
            return Err(EngineError::NonFiniteLogits { count: if bad > 0 { bad } else { masked.len() }, first });
        }
        let mut logits = masked.to_vec();
        self.process(&mut logits);
        let token = if self.params.temperature < GREEDY_BELOW { argmax(&logits) } else { self.sample_stochastic(&logits) };
        Ok(Sampled { token, logprob: log_softmax_at(masked, token as usize) })
    }

    fn sample_stochastic(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        // Candidates sorted by logit, descending; ties keep the lower id first.
        let mut idx: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
        if idx.is_empty() {
            return argmax(logits);
        }
        idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        if p.top_k > 0 && p.top_k < idx.len() {
            idx.truncate(p.top_k);
        }
        let max = logits[idx[0] as usize];
        let mut probs: Vec<f32> = idx.iter().map(|&i| ((logits[i as usize] - max) * inv_t).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        if p.min_p > 0.0 {
            let cut = p.min_p * probs[0];
            let keep = probs.iter().take_while(|&&x| x >= cut).count().max(1);
            probs.truncate(keep);
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, x) in probs.iter().enumerate() {
                acc += x;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut u = self.rng.random::<f32>() * total;
        for (i, x) in probs.iter().enumerate() {
            if u < *x {
                return idx[i];
            }
            u -= x;
        }
        idx[probs.len() - 1]
    }
}

/// Index of the largest logit (lowest index on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// `log softmax(logits)[i]`.
pub fn log_softmax_at(logits: &[f32], i: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln() + max;
    logits.get(i).map_or(f32::NEG_INFINITY, |l| l - lse)
}

/// The `n` most likely tokens with their log-probabilities, most likely first.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln() + max;
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(idx.len());
    if n == 0 {
        return vec![];
    }
    idx.select_nth_unstable_by(n - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    idx.truncate(n);
    idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    idx.into_iter().map(|i| (i, logits[i as usize] - lse)).collect()
}

/// Structured outputs' token masks on a batch's logits `[B, V]` where they are (the GPU when
/// the model runs there): row `rows[r]` keeps only the tokens whose bit is set in
/// `masks[r·words..(r+1)·words]` (32 tokens a word, lowest bit first); the others become −∞.
pub fn mask_logits(logits: &candle_core::Tensor, rows: &[u32], masks: &[u32], words: usize) -> Result<candle_core::Tensor> {
    Ok(deltaserve_kernels::ops::token_bitmask(logits, rows, masks, words)?)
}

/// [`mask_logits`] for one row of host logits.
pub fn mask_row(words: &[u32], logits: &mut [f32]) {
    deltaserve_kernels::cpu::bitmask::apply(words, logits);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(params, &[]);
        (0..n)
            .map(|_| {
                let t = s.sample(logits).unwrap().token;
                s.accept(t);
                t
            })
            .collect()
    }

    #[test]
    fn greedy_takes_argmax_and_lowest_on_ties() {
        assert_eq!(run(SamplingParams::greedy(), &[0.0, 3.0, 3.0, 1.0], 3), vec![1, 1, 1]);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = |seed| SamplingParams { seed: Some(seed), ..SamplingParams::default() };
        assert_eq!(run(p(7), &logits, 40), run(p(7), &logits, 40));
        assert_ne!(run(p(7), &logits, 40), run(p(8), &logits, 40));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.1f32, 2.0, 0.5];
        let p = SamplingParams { top_k: 1, seed: Some(1), ..SamplingParams::default() };
        assert!(run(p, &logits, 20).iter().all(|&t| t == 1));
    }

    #[test]
    fn top_p_and_min_p_restrict_support() {
        // p = [0.7, 0.2, 0.1] roughly: top_p 0.5 keeps only the first.
        let logits = [0.7f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
        let p = SamplingParams { top_p: 0.5, seed: Some(3), ..SamplingParams::default() };
        assert!(run(p, &logits, 50).iter().all(|&t| t == 0));
        let p = SamplingParams { min_p: 0.2, seed: Some(3), ..SamplingParams::default() };
        assert!(run(p, &logits, 200).iter().all(|&t| t != 2));
    }

    #[test]
    fn penalties_and_bias_change_the_choice() {
        let logits = [1.0f32, 0.9];
        let p = SamplingParams { frequency_penalty: 0.5, ..SamplingParams::greedy() };
        assert_eq!(run(p, &logits, 2), vec![0, 1]);
        let p = SamplingParams { logit_bias: vec![(1, 5.0)], ..SamplingParams::greedy() };
        assert_eq!(run(p, &logits, 1), vec![1]);
        let s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..SamplingParams::greedy() }, &[0]);
        let mut l = [1.0f32, 0.9];
        s.process(&mut l);
        assert_eq!(l, [0.5, 0.9]);
    }

    #[test]
    fn validation_names_the_field() {
        let e = SamplingParams { temperature: -1.0, ..SamplingParams::default() }.validate(10).unwrap_err().to_string();
        assert!(e.contains("`temperature`") && e.contains("-1"), "{e}");
        let e = SamplingParams { top_p: 0.0, ..SamplingParams::default() }.validate(10).unwrap_err().to_string();
        assert!(e.contains("`top_p`"), "{e}");
        let e = SamplingParams { logit_bias: vec![(10, 1.0)], ..SamplingParams::default() }.validate(10).unwrap_err().to_string();
        assert!(e.contains("`logit_bias`") && e.contains("10"), "{e}");
    }

    #[test]
    fn logprobs_are_normalised() {
        let l = [1.0f32, 2.0, 3.0];
        let total: f32 = (0..3).map(|i| log_softmax_at(&l, i).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        let top = top_logprobs(&l, 2);
        assert_eq!(top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 1]);
    }

    #[test]
    fn a_tiny_temperature_is_greedy_not_nan() {
        // 1/1e-39 overflows: without the greedy floor every probability was NaN and the walk
        // fell through to the least likely candidate.
        let logits = [0.5, 3.0, -1.0, 2.0];
        for t in [1e-39, 1e-20, 9e-6] {
            let p = SamplingParams { temperature: t, seed: Some(1), ..SamplingParams::default() };
            assert_eq!(run(p, &logits, 5), vec![1; 5], "temperature {t}");
        }
    }

    #[test]
    fn non_finite_logits_are_an_error_not_a_token() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut s = Sampler::new(SamplingParams { seed: Some(3), ..SamplingParams::default() }, &[]);
            let e = s.sample(&[0.0, bad, 1.0, bad]).unwrap_err().to_string();
            assert!(e.contains("2 non-finite logits") && e.contains("token 1"), "{e}");
        }
    }

    #[test]
    fn premasked_logits_sample_only_allowed_tokens_and_still_refuse_nan() {
        let mut s = Sampler::new(SamplingParams { temperature: 0.0, ..SamplingParams::default() }, &[]);
        let ninf = f32::NEG_INFINITY;
        // Only tokens 1 and 3 are allowed.
        assert_eq!(s.sample_premasked(&[ninf, 1.0, ninf, 2.0]).unwrap().token, 3);
        let mut t = Sampler::new(SamplingParams { temperature: 1.0, seed: Some(3), ..SamplingParams::default() }, &[]);
        for _ in 0..20 {
            assert!([1, 3].contains(&t.sample_premasked(&[ninf, 1.0, ninf, 2.0]).unwrap().token));
        }
        assert!(s.sample_premasked(&[f32::NAN, 1.0]).is_err());
        assert!(s.sample_premasked(&[ninf, ninf]).is_err());
    }
}
