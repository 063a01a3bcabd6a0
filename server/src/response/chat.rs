//! `/v1/chat/completions` responses: assistant messages, role-first streaming deltas,
//! per-token logprobs with their bytes.

use std::sync::Arc;

use deltaserve_engine::Tokenizer;
use serde_json::Value;

use super::{token_text, Assembler, Choice, Common, Delta};
use crate::api::types::{ChatChoice, ChatLogprobs, ChatMessage, ChatResponse, ChatTokenLogprob, ChatTopLogprob, Usage};
use crate::api::validate::ValidRequest;
use crate::scheduler::{Event, FinishReason};

/// Builds `/v1/chat/completions` responses.
pub struct ChatAssembler {
    c: Common,
}

impl ChatAssembler {
    /// Starts a response for `v`.
    pub fn new(id: String, model: String, created: u64, tok: Arc<Tokenizer>, v: &ValidRequest) -> Self {
        Self { c: Common::new(id, model, created, tok, v) }
    }

    fn logprobs_of(&self, c: &Choice, from: usize) -> Option<ChatLogprobs> {
        self.c.logprobs?;
        let content = (from..c.lp_tokens.len())
            .map(|k| ChatTokenLogprob {
                token: c.lp_tokens[k].clone(),
                logprob: c.lp_values[k].unwrap_or(f32::NEG_INFINITY),
                bytes: c.lp_tokens[k].as_bytes().to_vec(),
                top_logprobs: c.lp_top[k]
                    .iter()
                    .flatten()
                    .map(|&(id, lp)| {
                        let t = token_text(&self.c.tok, id);
                        ChatTopLogprob { bytes: t.as_bytes().to_vec(), token: t, logprob: lp }
                    })
                    .collect(),
            })
            .collect();
        Some(ChatLogprobs { content })
    }

    fn response(&self, object: &'static str, choices: Vec<ChatChoice>, usage: Option<Usage>) -> serde_json::Result<Value> {
        serde_json::to_value(ChatResponse {
            id: self.c.id.clone(),
            object,
            created: self.c.created,
            model: self.c.model.clone(),
            choices,
            usage,
        })
    }
}

impl Assembler for ChatAssembler {
    fn absorb(&mut self, p: usize, e: Event) {
        self.c.absorb(p, &e);
    }

    fn finish(&self) -> serde_json::Result<Value> {
        let choices = self
            .c
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| ChatChoice {
                index: i,
                message: Some(ChatMessage { role: Some("assistant"), content: Some(c.text.clone()) }),
                delta: None,
                logprobs: self.logprobs_of(c, 0),
                finish_reason: c.finish.as_ref().map(FinishReason::as_str),
            })
            .collect();
        self.response("chat.completion", choices, Some(self.c.usage()))
    }

    fn opening(&self) -> serde_json::Result<Vec<Value>> {
        (0..self.c.choices.len())
            .map(|i| {
                let delta = ChatMessage { role: Some("assistant"), content: Some(String::new()) };
                let choice = ChatChoice { index: i, message: None, delta: Some(delta), logprobs: None, finish_reason: None };
                self.response("chat.completion.chunk", vec![choice], None)
            })
            .collect()
    }

    fn chunks(&mut self, p: usize, e: Event) -> serde_json::Result<Vec<Value>> {
        let Some(Delta { index: i, text, lp_from, finish }) = self.c.delta(p, &e) else {
            return Ok(vec![]);
        };
        let c = &self.c.choices[i];
        let choice = ChatChoice {
            index: i,
            message: None,
            delta: Some(ChatMessage { role: None, content: (!text.is_empty()).then_some(text) }),
            logprobs: lp_from.and_then(|from| self.logprobs_of(c, from)),
            finish_reason: if finish { c.finish.as_ref().map(FinishReason::as_str) } else { None },
        };
        Ok(vec![self.response("chat.completion.chunk", vec![choice], None)?])
    }

    fn usage_chunk(&self) -> serde_json::Result<Value> {
        self.response("chat.completion.chunk", vec![], Some(self.c.usage()))
    }
}
