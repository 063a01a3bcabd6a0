//! Sampling parameters, per-sequence samplers and batched draws.
//!
//! Order (as vLLM): logit bias, repetition penalty (prompt + output), presence and frequency
//! penalties (output only, OpenAI semantics), a grammar's mask, temperature, then the top-k,
//! min-p and top-p cuts. A temperature below [`GREEDY_BELOW`] is greedy (vLLM's rule: dividing
//! by a smaller one overflows). The draws of a step run as one batch where the logits are
//! (`deltaserve_kernels::ops::sample`): on the GPU only the drawn tokens come back.

use std::collections::{BTreeMap, HashMap};

use candle_core::Tensor;
use deltaserve_kernels::ops::sample::{Adjust, Outcome, RowRule, SampleBatch, MAX_TOP};

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

/// One drawn token: its log-probability and the most likely tokens under the model's logits.
pub use deltaserve_kernels::ops::sample::Drawn as Sampled;

/// Per-sequence sampler: parameters, its random stream and the token history the penalties
/// need. Draws themselves run batched, where the logits are ([`Draws`]).
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    /// The random stream's seed (the request's, or one drawn from the OS).
    seed: u64,
    /// Draws made so far: draw `i` uses the stream's `i`-th random numbers.
    draws: u64,
    /// Occurrences of each generated token.
    generated: HashMap<u32, u32>,
    /// The logit bias and penalties as one adjustment per token, kept up to date as tokens are
    /// accepted (a draw copies them; rebuilding them from a long prompt every step would not).
    adjust: BTreeMap<u32, Adjust>,
}

/// `token`'s adjustment in `m`, neutral when new.
fn adjustment(m: &mut BTreeMap<u32, Adjust>, token: u32) -> &mut Adjust {
    m.entry(token).or_insert(Adjust { token, bias: 0.0, repetition: 1.0, subtract: 0.0 })
}

impl Sampler {
    /// A sampler for a sequence whose prompt is `prompt`.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        let mut adjust = BTreeMap::new();
        // Biases of a repeated id add up.
        for &(t, b) in &params.logit_bias {
            adjustment(&mut adjust, t).bias += b;
        }
        if params.repetition_penalty != 1.0 {
            for &t in prompt {
                adjustment(&mut adjust, t).repetition = params.repetition_penalty;
            }
        }
        Self { params, seed, draws: 0, generated: HashMap::new(), adjust }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token that became part of the output.
    pub fn accept(&mut self, token: u32) {
        let count = self.generated.entry(token).or_default();
        *count += 1;
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            adjustment(&mut self.adjust, token).repetition = p.repetition_penalty;
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            adjustment(&mut self.adjust, token).subtract = p.presence_penalty + p.frequency_penalty * *count as f32;
        }
    }

    /// This draw's rule (without its place in a batch) and the next draw's number.
    fn rule(&mut self, row: u32, top_logprobs: usize) -> RowRule {
        let p = &self.params;
        let draw = self.draws;
        self.draws += 1;
        RowRule {
            row,
            temperature: if p.temperature < GREEDY_BELOW { 0.0 } else { p.temperature },
            top_k: p.top_k.min(u32::MAX as usize) as u32,
            top_p: p.top_p,
            ln_min_p: if p.min_p > 0.0 { p.min_p.ln() } else { f32::NEG_INFINITY },
            seed: self.seed,
            draw,
            top_logprobs: top_logprobs.min(MAX_TOP) as u32,
            ..RowRule::default()
        }
    }

    /// The logit bias and penalties, one adjustment per token.
    fn adjustments(&self, out: &mut Vec<Adjust>) {
        out.extend(self.adjust.values().copied());
    }
}

/// A batch of draws over one logits tensor `[rows, vocab]`, run where the logits are: on the
/// GPU only the drawn tokens (and requested log-probabilities) cross to the host.
#[derive(Debug, Clone, Default)]
pub struct Draws {
    rules: Vec<RowRule>,
    adjust: Vec<Adjust>,
    masks: Vec<u32>,
    words: usize,
}

impl Draws {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Draws added so far.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether no draw was added.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Adds `sampler`'s next draw from logits row `row`, reporting the `top_logprobs` most
    /// likely tokens, restricted to the tokens whose bit is set in `mask` (a grammar's, 32
    /// tokens a word; every mask of a batch has the same length).
    pub fn push(&mut self, row: usize, sampler: &mut Sampler, top_logprobs: usize, mask: Option<&[u32]>) {
        let mut rule = sampler.rule(row as u32, top_logprobs);
        let from = self.adjust.len();
        sampler.adjustments(&mut self.adjust);
        rule.adjust_from = from as u32;
        rule.adjust_len = (self.adjust.len() - from) as u32;
        if let Some(m) = mask {
            self.words = m.len();
            rule.mask = Some((self.masks.len() / m.len().max(1)) as u32);
            self.masks.extend_from_slice(m);
        }
        self.rules.push(rule);
    }

    /// Runs every draw; one result per [`Self::push`], in order. A draw fails alone (non-finite
    /// logits, nothing allowed); the batch fails only when the op does.
    pub fn run(&self, logits: &Tensor) -> Result<Vec<Result<Sampled>>> {
        let batch = SampleBatch { rules: &self.rules, adjust: &self.adjust, masks: &self.masks, words: self.words };
        let out = deltaserve_kernels::ops::sample::sample(logits, &batch)?;
        Ok(out
            .into_iter()
            .map(|o| match o {
                Outcome::Token(d) => Ok(d),
                Outcome::NonFinite { count, first } => Err(EngineError::NonFiniteLogits { count, first }),
                Outcome::NothingAllowed => Err(EngineError::NothingAllowed),
            })
            .collect())
    }
}

/// Draws one token from one row of host logits (the CLI's loop, prompt-logprob requests).
pub fn draw_one(sampler: &mut Sampler, logits: &[f32], top_logprobs: usize, mask: Option<&[u32]>) -> Result<Sampled> {
    let mut d = Draws::new();
    d.push(0, sampler, top_logprobs, mask);
    let t = Tensor::from_slice(logits, (1, logits.len()), &candle_core::Device::Cpu)?;
    d.run(&t)?.pop().unwrap_or(Err(EngineError::NothingAllowed))
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// `n` draws of one sampler from fixed logits, each accepted.
    fn run(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(params, &[]);
        (0..n)
            .map(|_| {
                let t = draw_one(&mut s, logits, 0, None).unwrap().token;
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
        // Each draw moves the stream on: 40 draws from the same logits are not all one token.
        assert!(run(p(7), &logits, 40).windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn penalties_and_bias_follow_the_history() {
        let logits = [1.0f32, 0.9];
        // Frequency 0.5: token 0 drops to 0.5 after it was generated once.
        let p = SamplingParams { frequency_penalty: 0.5, ..SamplingParams::greedy() };
        assert_eq!(run(p, &logits, 3), vec![0, 1, 0]);
        let p = SamplingParams { logit_bias: vec![(1, 5.0)], ..SamplingParams::greedy() };
        assert_eq!(run(p, &logits, 1), vec![1]);
        // Repetition 2 on the prompt's token 0: 1.0 / 2 < 0.9.
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..SamplingParams::greedy() }, &[0]);
        assert_eq!(draw_one(&mut s, &logits, 0, None).unwrap().token, 1);
        // Two biases of one id add up.
        let p = SamplingParams { logit_bias: vec![(1, 0.06), (1, 0.06)], ..SamplingParams::greedy() };
        assert_eq!(run(p, &logits, 1), vec![1]);
    }

    #[test]
    fn a_batch_draws_each_row_with_its_own_rule() {
        let logits = Tensor::from_vec(vec![0.0f32, 2.0, 1.0, 3.0, 0.0, 0.0], (2, 3), &Device::Cpu).unwrap();
        let (mut g, mut masked) = (Sampler::new(SamplingParams::greedy(), &[]), Sampler::new(SamplingParams::greedy(), &[]));
        let mut d = Draws::new();
        d.push(1, &mut g, 2, None);
        d.push(0, &mut masked, 0, Some(&[0b101]));
        d.push(0, &mut g, 0, Some(&[0]));
        let out = d.run(&logits).unwrap();
        let first = out[0].as_ref().unwrap();
        assert_eq!((first.token, first.top.len()), (0, 2));
        assert_eq!(out[1].as_ref().unwrap().token, 2, "the mask leaves tokens 0 and 2");
        assert!(matches!(out[2], Err(EngineError::NothingAllowed)));
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
            let e = draw_one(&mut s, &[0.0, bad, 1.0, bad], 0, None).unwrap_err().to_string();
            assert!(e.contains("2 non-finite logits") && e.contains("token 1"), "{e}");
        }
    }
}
