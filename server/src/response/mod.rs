//! Turns scheduler events into OpenAI responses: one JSON body, or SSE chunks. One file per
//! format ([`completion`], [`chat`]) behind [`Assembler`]; the per-choice bookkeeping they
//! share lives here.

use std::collections::HashMap;
use std::sync::Arc;

use deltaserve_engine::Tokenizer;
use serde_json::{json, Value};

use crate::api::types::Usage;
use crate::api::validate::ValidRequest;
use crate::scheduler::{Event, FinishReason, StopCause, TokenLogprob};

pub mod chat;
pub mod completion;

pub use chat::ChatAssembler;
pub use completion::CompletionAssembler;

/// Builds one response format from a request's events. Serialization failures are errors.
pub trait Assembler: Send {
    /// Non-streaming: take in one event.
    fn absorb(&mut self, p: usize, e: Event);
    /// Non-streaming: the whole response body.
    fn finish(&self) -> serde_json::Result<Value>;
    /// Streaming: chunks sent before any token (chat role, completions echo).
    fn opening(&self) -> serde_json::Result<Vec<Value>>;
    /// Streaming: the chunks one event produces (possibly none).
    fn chunks(&mut self, p: usize, e: Event) -> serde_json::Result<Vec<Value>>;
    /// Streaming: the final usage chunk (`choices: []`).
    fn usage_chunk(&self) -> serde_json::Result<Value>;
}

/// Per-choice accumulation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Choice {
    pub(crate) text: String,
    pub(crate) tokens: usize,
    pub(crate) finish: Option<FinishReason>,
    pub(crate) lp_tokens: Vec<String>,
    pub(crate) lp_values: Vec<Option<f32>>,
    pub(crate) lp_top: Vec<Option<Vec<(u32, f32)>>>,
    pub(crate) lp_offsets: Vec<usize>,
    pub(crate) lp_ids: Vec<u32>,
}

impl Choice {
    pub(crate) fn push_logprob(&mut self, tok: &Tokenizer, lp: Option<&TokenLogprob>, token: u32, at: usize) {
        self.lp_tokens.push(token_text(tok, token));
        self.lp_values.push(lp.map(|l| l.logprob));
        self.lp_top.push(lp.map(|l| l.top.clone()));
        self.lp_offsets.push(at);
        self.lp_ids.push(token);
    }
}

pub(crate) fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

pub(crate) fn stop_reason(f: &Option<FinishReason>) -> Option<Value> {
    match f {
        Some(FinishReason::Stop(Some(StopCause::Text(s)))) => Some(json!(s)),
        Some(FinishReason::Stop(Some(StopCause::Token(t)))) => Some(json!(t)),
        _ => None,
    }
}

/// What one streamed event added to a choice.
pub(crate) struct Delta {
    pub(crate) index: usize,
    pub(crate) text: String,
    /// First new logprob entry, if any were added.
    pub(crate) lp_from: Option<usize>,
    pub(crate) finish: bool,
}

/// State shared by both response kinds.
pub(crate) struct Common {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) tok: Arc<Tokenizer>,
    pub(crate) n: usize,
    prompt_tokens: usize,
    pub(crate) logprobs: Option<usize>,
    pub(crate) choices: Vec<Choice>,
}

impl Common {
    pub(crate) fn new(id: String, model: String, created: u64, tok: Arc<Tokenizer>, v: &ValidRequest) -> Self {
        let n = v.params.n;
        Self {
            id,
            model,
            created,
            tok,
            n,
            prompt_tokens: v.prompts.iter().map(Vec::len).sum(),
            logprobs: v.params.logprobs,
            choices: vec![Choice::default(); v.prompts.len() * n],
        }
    }

    pub(crate) fn index(&self, prompt: usize, choice: usize) -> usize {
        prompt * self.n + choice
    }

    pub(crate) fn usage(&self) -> Usage {
        let completion_tokens = self.choices.iter().map(|c| c.tokens).sum();
        Usage { prompt_tokens: self.prompt_tokens, completion_tokens, total_tokens: self.prompt_tokens + completion_tokens }
    }

    pub(crate) fn top_map(&self, top: &Option<Vec<(u32, f32)>>) -> Option<HashMap<String, f32>> {
        top.as_ref().map(|t| t.iter().map(|&(id, lp)| (token_text(&self.tok, id), lp)).collect())
    }

    /// Streaming: applies `e` and returns what it added to its choice, or `None` when it adds
    /// nothing worth a chunk.
    pub(crate) fn delta(&mut self, p: usize, e: &Event) -> Option<Delta> {
        let (lp_before, text_before) = match e {
            Event::Token { choice, .. } | Event::Text { choice, .. } | Event::Finished { choice, .. } => {
                let c = &self.choices[self.index(p, *choice)];
                (c.lp_tokens.len(), c.text.len())
            }
            Event::PromptLogprobs(_) | Event::Error(_) => return None,
        };
        let index = self.absorb(p, e)?;
        let c = &self.choices[index];
        let text = c.text[text_before..].to_owned();
        let lp_from = (c.lp_tokens.len() > lp_before).then_some(lp_before);
        let finish = matches!(e, Event::Finished { .. });
        (!text.is_empty() || lp_from.is_some() || finish).then_some(Delta { index, text, lp_from, finish })
    }

    /// Applies an event to the choice it belongs to; returns that choice's index.
    pub(crate) fn absorb(&mut self, p: usize, e: &Event) -> Option<usize> {
        match e {
            Event::Token { choice, text, logprob } => {
                let i = self.index(p, *choice);
                let tok = self.tok.clone();
                let c = &mut self.choices[i];
                c.tokens += 1;
                if let Some(lp) = logprob {
                    let at = c.text.len();
                    c.push_logprob(&tok, Some(lp), lp.token, at);
                }
                c.text.push_str(text);
                Some(i)
            }
            Event::Text { choice, text } => {
                let i = self.index(p, *choice);
                self.choices[i].text.push_str(text);
                Some(i)
            }
            Event::Finished { choice, reason, tokens } => {
                let i = self.index(p, *choice);
                self.choices[i].finish = Some(reason.clone());
                self.choices[i].tokens = *tokens;
                Some(i)
            }
            Event::PromptLogprobs(_) | Event::Error(_) => None,
        }
    }
}
