//! One choice of a request as it generates: sample the next token from its logits, turn it into
//! text, check the stop rules, and send the events.

use std::time::Instant;

use deltaserve_engine::sampling::{log_softmax_at, top_logprobs};
use deltaserve_engine::{Draws, EngineError, IncrementalDecoder, Sampled, Sampler, SlotId, Tokenizer};
use tokio::sync::mpsc;

use super::{Event, FinishReason, GenParams, StopCause, TokenLogprob};
use crate::metrics::Metrics;
use crate::stop::StopMatcher;

/// Sends an event. The channel is sized for every event a request can produce, so a failure
/// means the client went away; the request is then dropped at the next step.
pub(super) fn send(events: &mpsc::Sender<Event>, e: Event) {
    let _ = events.try_send(e);
}

/// `token`'s log-probability under `logits` and the `top_n` most likely tokens.
pub(super) fn logprob_entry(logits: &[f32], token: u32, top_n: usize) -> TokenLogprob {
    TokenLogprob { token, logprob: log_softmax_at(logits, token as usize), top: top_logprobs(logits, top_n) }
}

/// What a sequence needs to know of its request.
#[derive(Clone)]
pub(super) struct Context<'a> {
    pub prompt_len: usize,
    pub params: &'a GenParams,
    pub tok: &'a Tokenizer,
    pub max_model_len: usize,
}

/// One choice: its slot, sampler, detokenizer and stop matcher.
pub(super) struct Seq {
    pub choice: usize,
    pub slot: SlotId,
    sampler: Sampler,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    generated: usize,
    /// Every token sampled, in order (the prefix cache snapshots prompt + these).
    pub ids: Vec<u32>,
    /// The last sampled token, not yet fed to the model.
    pub pending: Option<u32>,
    pub finished: bool,
    /// Why the choice finished, when it finished normally (not by an error).
    pub finish_reason: Option<&'static str>,
    last_token: Option<Instant>,
    /// The grammar this choice follows, if any.
    pub constraint: Option<crate::structured::Constraint>,
}

impl Seq {
    /// Choice `choice` of a request, in `slot`; with a seed, choice `i` samples with `seed + i`.
    pub fn new(params: &GenParams, prompt: &[u32], choice: usize, slot: SlotId) -> Self {
        let mut sampling = params.sampling.clone();
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(choice as u64));
        Self {
            choice,
            slot,
            sampler: Sampler::new(sampling, prompt),
            decoder: IncrementalDecoder::new(),
            stops: StopMatcher::new(params.stop.clone()),
            generated: 0,
            ids: Vec::new(),
            pending: None,
            finished: false,
            finish_reason: None,
            last_token: None,
            constraint: params.constraint.clone(),
        }
    }

    /// Whether the next token emitted ends this choice by length (`max_tokens`, or the context).
    pub fn ends_by_length_after_one(&self, prompt_len: usize, max_tokens: usize, max_model_len: usize) -> bool {
        self.generated + 1 >= max_tokens || prompt_len + self.generated + 1 >= max_model_len
    }

    /// Ends this choice with an error event.
    fn fail(&mut self, events: &mpsc::Sender<Event>, id: &str, e: super::SchedulerError) {
        tracing::error!(request = %id, error = %e, "choice failed");
        send(events, Event::Error(e));
        self.finished = true;
        self.pending = None;
    }

    /// Adds this choice's next draw, from logits row `row`, to `draws`, restricted by its
    /// grammar. A grammar that cannot go on fails the choice instead: returns whether a draw
    /// was added.
    pub fn draw(&mut self, draws: &mut Draws, row: usize, top_logprobs: Option<usize>, events: &mpsc::Sender<Event>, id: &str) -> bool {
        if self.finished {
            return false;
        }
        let mask = match self.constraint.as_mut().map(|c| c.mask()) {
            Some(Err(e)) => {
                self.fail(events, id, super::SchedulerError::Engine(format!("structured output: {e}")));
                return false;
            }
            Some(Ok(m)) => m,
            None => None,
        };
        draws.push(row, &mut self.sampler, top_logprobs.unwrap_or(0), mask);
        true
    }

    /// Takes the token drawn for this choice, sends it with the text it completes, and ends the
    /// choice when a stop rule fires (EOS, a stop token or string, `max_tokens`, the context).
    /// The choice's `Finished` event is returned, not sent: the caller sends it once the
    /// request's admission place is given back, so a client that saw its answer finds the room.
    #[must_use]
    pub fn emit(
        &mut self,
        cx: &Context<'_>,
        sampled: Result<Sampled, EngineError>,
        events: &mpsc::Sender<Event>,
        id: &str,
        metrics: &Metrics,
        arrived: Instant,
    ) -> Option<Event> {
        if self.finished {
            return None;
        }
        let p = cx.params;
        let sampled = match sampled {
            Ok(s) => s,
            Err(e) => {
                self.fail(events, id, e.into());
                return None;
            }
        };
        let t = sampled.token;
        let mut grammar_done = false;
        if let Some(c) = self.constraint.as_mut() {
            let eos = cx.tok.eos_token_ids.contains(&t);
            if !eos {
                if let Err(e) = c.accept(t) {
                    self.fail(events, id, super::SchedulerError::Engine(format!("structured output: {e}")));
                    return None;
                }
            }
            grammar_done = eos || c.is_stopped();
        }
        self.sampler.accept(t);
        self.generated += 1;
        self.ids.push(t);
        metrics.generation_tokens.inc();
        let now = Instant::now();
        match self.last_token {
            None => {
                let ttft = now.duration_since(arrived).as_secs_f64();
                metrics.time_to_first_token.observe(ttft);
                tracing::debug!(request = %id, ms = ttft * 1e3, "first token");
            }
            Some(prev) => metrics.inter_token_latency.observe(now.duration_since(prev).as_secs_f64()),
        }
        self.last_token = Some(now);
        let logprob = p.logprobs.map(|_| TokenLogprob { token: t, logprob: sampled.logprob, top: sampled.top });

        // Under a grammar EOS is only allowed once the output is complete, so it always stops.
        let eos = cx.tok.eos_token_ids.contains(&t);
        let mut finish = if eos && (!p.ignore_eos || self.constraint.is_some()) {
            Some(FinishReason::Stop(None))
        } else if p.stop_token_ids.contains(&t) {
            Some(FinishReason::Stop(Some(StopCause::Token(t))))
        } else {
            None
        };
        // The EOS / stop token's own text is not part of the output.
        let mut text = String::new();
        if finish.is_none() {
            match self.decoder.push(cx.tok, t) {
                Ok(Some(delta)) => {
                    if let Some(c) = self.constraint.as_mut() {
                        c.observe(&delta);
                    }
                    let rel = self.stops.push(&delta);
                    text = rel.text;
                    if let Some(m) = rel.matched {
                        finish = Some(FinishReason::Stop(Some(StopCause::Text(m))));
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(request = %id, error = %e, "detokenization failed"),
            }
        }
        if finish.is_none() && grammar_done {
            finish = Some(FinishReason::Stop(None));
        }
        if finish.is_none() && (self.generated >= p.max_tokens || cx.prompt_len + self.generated >= cx.max_model_len) {
            finish = Some(FinishReason::Length);
        }
        send(events, Event::Token { choice: self.choice, text, logprob });
        match finish {
            Some(reason) => {
                if !matches!(reason, FinishReason::Stop(Some(StopCause::Text(_)))) {
                    // Release held-back text: an incomplete character or a stop-string prefix.
                    let mut tail = self.decoder.flush(cx.tok).ok().flatten().map(|d| self.stops.push(&d).text).unwrap_or_default();
                    tail.push_str(&self.stops.flush());
                    if !tail.is_empty() {
                        send(events, Event::Text { choice: self.choice, text: tail });
                    }
                }
                self.finish_reason = Some(reason.as_str());
                self.finished = true;
                self.pending = None;
                Some(Event::Finished { choice: self.choice, reason, tokens: self.generated })
            }
            None => {
                self.pending = Some(t);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltaserve_engine::SamplingParams;

    fn tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/compact/gdn");
        Tokenizer::from_dir(&dir, Some(1), &[2]).unwrap()
    }

    fn params(max_tokens: usize, stop: &[&str]) -> GenParams {
        GenParams {
            sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..GenParams::new(max_tokens)
        }
    }

    /// Logits with `token` far ahead of the rest.
    fn peaked(vocab: usize, token: u32) -> Vec<f32> {
        let mut l = vec![0.0; vocab];
        l[token as usize] = 10.0;
        l
    }

    /// Runs `tokens` through a sequence greedily; returns its events.
    fn run(p: &GenParams, tokens: &[u32]) -> (Vec<Event>, Seq) {
        let tok = tokenizer();
        let metrics = Metrics::new("test").unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        let mut s = Seq::new(p, &[1], 0, deltaserve_engine::StatePool::new(&[], 1).allocate().unwrap());
        let cx = Context { prompt_len: 1, params: p, tok: &tok, max_model_len: 1000 };
        let vocab = tok.vocab_size();
        for &t in tokens {
            let mut draws = Draws::new();
            if !s.draw(&mut draws, 0, p.logprobs, &tx, "r") {
                continue;
            }
            let logits = deltaserve_engine::Tensor::from_vec(peaked(vocab, t), (1, vocab), &deltaserve_engine::Device::Cpu).unwrap();
            let sampled = draws.run(&logits).unwrap().pop().unwrap();
            if let Some(last) = s.emit(&cx, sampled, &tx, "r", &metrics, Instant::now()) {
                send(&tx, last);
            }
        }
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            out.push(e);
        }
        (out, s)
    }

    fn text_of(events: &[Event]) -> String {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Token { text, .. } | Event::Text { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn greedy_tokens_become_text_and_stop_at_max_tokens() {
        let tok = tokenizer();
        let ids = tok.encode("hello world", false).unwrap();
        let (events, s) = run(&params(ids.len(), &[]), &ids);
        assert_eq!(text_of(&events), "hello world");
        assert!(s.finished && s.pending.is_none());
        assert!(matches!(events.last(), Some(Event::Finished { reason: FinishReason::Length, tokens, .. }) if *tokens == ids.len()));
    }

    #[test]
    fn eos_ends_the_choice_without_its_text() {
        let tok = tokenizer();
        let mut ids = tok.encode("abc", false).unwrap();
        ids.push(2);
        let (events, _) = run(&params(100, &[]), &ids);
        assert_eq!(text_of(&events), "abc");
        assert!(matches!(events.last(), Some(Event::Finished { reason: FinishReason::Stop(None), .. })));
    }

    #[test]
    fn a_stop_string_ends_the_choice_and_is_not_sent() {
        let tok = tokenizer();
        let ids = tok.encode("one two three", false).unwrap();
        let (events, s) = run(&params(100, &[" two"]), &ids);
        assert_eq!(text_of(&events), "one");
        assert!(s.finished);
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::Finished { reason: FinishReason::Stop(Some(StopCause::Text(m))), .. } if m == " two")));
    }

    #[test]
    fn an_unfinished_sequence_keeps_its_token_pending() {
        let tok = tokenizer();
        let ids = tok.encode("x", false).unwrap();
        let (events, s) = run(&params(100, &[]), &ids);
        assert!(!s.finished);
        assert_eq!(s.pending, ids.last().copied());
        assert!(!events.iter().any(|e| matches!(e, Event::Finished { .. })));
    }
}
