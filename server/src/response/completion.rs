//! `/v1/completions` responses: text choices, `echo` with prompt logprobs, `stop_reason`.

use std::sync::Arc;

use deltaserve_engine::Tokenizer;
use serde_json::Value;

use super::{stop_reason, Assembler, Choice, Common, Delta};
use crate::api::types::{CompletionChoice, CompletionLogprobs, CompletionResponse, Usage};
use crate::api::validate::ValidRequest;
use crate::scheduler::{Event, FinishReason, TokenLogprob};

/// Builds `/v1/completions` responses.
pub struct CompletionAssembler {
    c: Common,
    echo: bool,
    prompt_texts: Vec<String>,
    prompts: Vec<Vec<u32>>,
}

impl CompletionAssembler {
    /// Starts a response for `v`.
    pub fn new(id: String, model: String, created: u64, tok: Arc<Tokenizer>, v: &ValidRequest) -> Self {
        let prompt_texts = if v.echo { v.prompts.iter().map(|p| tok.decode(p, true).unwrap_or_default()).collect() } else { vec![] };
        let mut a = Self { c: Common::new(id, model, created, tok, v), echo: v.echo, prompt_texts, prompts: v.prompts.clone() };
        if a.echo {
            for p in 0..a.prompts.len() {
                for j in 0..a.c.n {
                    let i = a.c.index(p, j);
                    a.c.choices[i].text = a.prompt_texts[p].clone();
                    if a.c.logprobs.is_some() {
                        // The first prompt token has no logprob; later ones arrive as events.
                        let first = a.prompts[p][0];
                        let tok = a.c.tok.clone();
                        a.c.choices[i].push_logprob(&tok, None, first, 0);
                    }
                }
            }
        }
        a
    }

    fn absorb_prompt_logprobs(&mut self, p: usize, lps: &[TokenLogprob]) {
        let tok = self.c.tok.clone();
        for j in 0..self.c.n {
            let i = self.c.index(p, j);
            let c = &mut self.c.choices[i];
            for lp in lps {
                // Offsets of echoed prompt tokens: the decoded length so far.
                let at = tok.decode(&c.lp_ids, true).map(|s| s.len()).unwrap_or(0);
                c.push_logprob(&tok, Some(lp), lp.token, at);
            }
        }
    }

    fn logprobs_of(&self, c: &Choice, from: usize) -> Option<CompletionLogprobs> {
        self.c.logprobs?;
        Some(CompletionLogprobs {
            tokens: c.lp_tokens[from..].to_vec(),
            token_logprobs: c.lp_values[from..].to_vec(),
            top_logprobs: c.lp_top[from..].iter().map(|t| self.c.top_map(t)).collect(),
            text_offset: c.lp_offsets[from..].to_vec(),
        })
    }

    fn response(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> serde_json::Result<Value> {
        serde_json::to_value(CompletionResponse {
            id: self.c.id.clone(),
            object: "text_completion",
            created: self.c.created,
            model: self.c.model.clone(),
            choices,
            usage,
        })
    }
}

impl Assembler for CompletionAssembler {
    fn absorb(&mut self, p: usize, e: Event) {
        if let Event::PromptLogprobs(lps) = &e {
            self.absorb_prompt_logprobs(p, lps);
        }
        self.c.absorb(p, &e);
    }

    fn finish(&self) -> serde_json::Result<Value> {
        let choices = self
            .c
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| CompletionChoice {
                index: i,
                text: c.text.clone(),
                logprobs: self.logprobs_of(c, 0),
                finish_reason: c.finish.as_ref().map(FinishReason::as_str),
                stop_reason: stop_reason(&c.finish),
            })
            .collect();
        self.response(choices, Some(self.c.usage()))
    }

    fn opening(&self) -> serde_json::Result<Vec<Value>> {
        if !self.echo {
            return Ok(vec![]);
        }
        (0..self.c.choices.len())
            .map(|i| {
                let c = &self.c.choices[i];
                let choice = CompletionChoice {
                    index: i,
                    text: c.text.clone(),
                    logprobs: self.logprobs_of(c, 0),
                    finish_reason: None,
                    stop_reason: None,
                };
                self.response(vec![choice], None)
            })
            .collect()
    }

    fn chunks(&mut self, p: usize, e: Event) -> serde_json::Result<Vec<Value>> {
        if let Event::PromptLogprobs(lps) = &e {
            let before: Vec<usize> = self.c.choices.iter().map(|c| c.lp_tokens.len()).collect();
            self.absorb_prompt_logprobs(p, lps);
            return (0..self.c.n)
                .map(|j| {
                    let i = self.c.index(p, j);
                    let logprobs = self.logprobs_of(&self.c.choices[i], before[i]);
                    let choice = CompletionChoice { index: i, text: String::new(), logprobs, finish_reason: None, stop_reason: None };
                    self.response(vec![choice], None)
                })
                .collect();
        }
        let Some(Delta { index: i, text, lp_from, finish }) = self.c.delta(p, &e) else {
            return Ok(vec![]);
        };
        let c = &self.c.choices[i];
        let choice = CompletionChoice {
            index: i,
            text,
            logprobs: lp_from.and_then(|from| self.logprobs_of(c, from)),
            finish_reason: if finish { c.finish.as_ref().map(FinishReason::as_str) } else { None },
            stop_reason: if finish { stop_reason(&c.finish) } else { None },
        };
        Ok(vec![self.response(vec![choice], None)?])
    }

    fn usage_chunk(&self) -> serde_json::Result<Value> {
        self.response(vec![], Some(self.c.usage()))
    }
}
