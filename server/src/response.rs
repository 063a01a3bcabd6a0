//! Turns scheduler events into OpenAI responses: one JSON body, or SSE chunks.

use std::collections::HashMap;
use std::sync::Arc;

use deltaserve_engine::Tokenizer;
use serde_json::{json, Value};

use crate::api::types::{
    ChatChoice, ChatLogprobs, ChatMessage, ChatResponse, ChatTokenLogprob, ChatTopLogprob, CompletionChoice, CompletionLogprobs,
    CompletionResponse, Usage,
};
use crate::api::validate::ValidRequest;
use crate::scheduler::{Event, FinishReason, StopCause, TokenLogprob};

/// Per-choice accumulation.
#[derive(Debug, Clone, Default)]
struct Choice {
    text: String,
    tokens: usize,
    finish: Option<FinishReason>,
    lp_tokens: Vec<String>,
    lp_values: Vec<Option<f32>>,
    lp_top: Vec<Option<Vec<(u32, f32)>>>,
    lp_offsets: Vec<usize>,
    lp_ids: Vec<u32>,
}

impl Choice {
    fn push_logprob(&mut self, tok: &Tokenizer, lp: Option<&TokenLogprob>, token: u32, at: usize) {
        self.lp_tokens.push(token_text(tok, token));
        self.lp_values.push(lp.map(|l| l.logprob));
        self.lp_top.push(lp.map(|l| l.top.clone()));
        self.lp_offsets.push(at);
        self.lp_ids.push(token);
    }
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

fn stop_reason(f: &Option<FinishReason>) -> Option<Value> {
    match f {
        Some(FinishReason::Stop(Some(StopCause::Text(s)))) => Some(json!(s)),
        Some(FinishReason::Stop(Some(StopCause::Token(t)))) => Some(json!(t)),
        _ => None,
    }
}

/// What one streamed event added to a choice.
struct Delta {
    index: usize,
    text: String,
    /// First new logprob entry, if any were added.
    lp_from: Option<usize>,
    finish: bool,
}

/// State shared by both response kinds.
struct Common {
    id: String,
    model: String,
    created: u64,
    tok: Arc<Tokenizer>,
    n: usize,
    prompt_tokens: usize,
    logprobs: Option<usize>,
    choices: Vec<Choice>,
}

impl Common {
    fn new(id: String, model: String, created: u64, tok: Arc<Tokenizer>, v: &ValidRequest) -> Self {
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

    fn index(&self, prompt: usize, choice: usize) -> usize {
        prompt * self.n + choice
    }

    fn usage(&self) -> Usage {
        let completion_tokens = self.choices.iter().map(|c| c.tokens).sum();
        Usage { prompt_tokens: self.prompt_tokens, completion_tokens, total_tokens: self.prompt_tokens + completion_tokens }
    }

    fn top_map(&self, top: &Option<Vec<(u32, f32)>>) -> Option<HashMap<String, f32>> {
        top.as_ref().map(|t| t.iter().map(|&(id, lp)| (token_text(&self.tok, id), lp)).collect())
    }

    /// Streaming: applies `e` and returns what it added to its choice, or `None` when it adds
    /// nothing worth a chunk.
    fn delta(&mut self, p: usize, e: &Event) -> Option<Delta> {
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
    fn absorb(&mut self, p: usize, e: &Event) -> Option<usize> {
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

    fn response(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Value {
        serde_json::to_value(CompletionResponse {
            id: self.c.id.clone(),
            object: "text_completion",
            created: self.c.created,
            model: self.c.model.clone(),
            choices,
            usage,
        })
        .unwrap_or(Value::Null)
    }
}

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

    fn response(&self, object: &'static str, choices: Vec<ChatChoice>, usage: Option<Usage>) -> Value {
        serde_json::to_value(ChatResponse {
            id: self.c.id.clone(),
            object,
            created: self.c.created,
            model: self.c.model.clone(),
            choices,
            usage,
        })
        .unwrap_or(Value::Null)
    }
}

/// Either response kind, with the operations the handler needs.
pub enum Kind {
    /// `/v1/completions`.
    Completion(CompletionAssembler),
    /// `/v1/chat/completions`.
    Chat(ChatAssembler),
}

impl Kind {
    /// Non-streaming: take in one event.
    pub fn absorb(&mut self, p: usize, e: Event) {
        match self {
            Kind::Completion(a) => {
                if let Event::PromptLogprobs(lps) = &e {
                    a.absorb_prompt_logprobs(p, lps);
                }
                a.c.absorb(p, &e);
            }
            Kind::Chat(a) => {
                a.c.absorb(p, &e);
            }
        }
    }

    /// Non-streaming: the whole response body.
    pub fn finish(&self) -> Value {
        match self {
            Kind::Completion(a) => {
                let choices =
                    a.c.choices
                        .iter()
                        .enumerate()
                        .map(|(i, c)| CompletionChoice {
                            index: i,
                            text: c.text.clone(),
                            logprobs: a.logprobs_of(c, 0),
                            finish_reason: c.finish.as_ref().map(FinishReason::as_str),
                            stop_reason: stop_reason(&c.finish),
                        })
                        .collect();
                a.response(choices, Some(a.c.usage()))
            }
            Kind::Chat(a) => {
                let choices =
                    a.c.choices
                        .iter()
                        .enumerate()
                        .map(|(i, c)| ChatChoice {
                            index: i,
                            message: Some(ChatMessage { role: Some("assistant"), content: Some(c.text.clone()) }),
                            delta: None,
                            logprobs: a.logprobs_of(c, 0),
                            finish_reason: c.finish.as_ref().map(FinishReason::as_str),
                        })
                        .collect();
                a.response("chat.completion", choices, Some(a.c.usage()))
            }
        }
    }

    /// Streaming: chunks sent before any token (chat role, completions echo).
    pub fn opening(&self) -> Vec<Value> {
        match self {
            Kind::Completion(a) if a.echo => (0..a.c.choices.len())
                .map(|i| {
                    let c = &a.c.choices[i];
                    a.response(
                        vec![CompletionChoice {
                            index: i,
                            text: c.text.clone(),
                            logprobs: a.logprobs_of(c, 0),
                            finish_reason: None,
                            stop_reason: None,
                        }],
                        None,
                    )
                })
                .collect(),
            Kind::Completion(_) => vec![],
            Kind::Chat(a) => (0..a.c.choices.len())
                .map(|i| {
                    let delta = ChatMessage { role: Some("assistant"), content: Some(String::new()) };
                    a.response(
                        "chat.completion.chunk",
                        vec![ChatChoice { index: i, message: None, delta: Some(delta), logprobs: None, finish_reason: None }],
                        None,
                    )
                })
                .collect(),
        }
    }

    /// Streaming: the chunks one event produces (possibly none).
    pub fn chunks(&mut self, p: usize, e: Event) -> Vec<Value> {
        match self {
            Kind::Completion(a) => {
                if let Event::PromptLogprobs(lps) = &e {
                    let before: Vec<usize> = a.c.choices.iter().map(|c| c.lp_tokens.len()).collect();
                    a.absorb_prompt_logprobs(p, lps);
                    return (0..a.c.n)
                        .map(|j| {
                            let i = a.c.index(p, j);
                            let lp = a.logprobs_of(&a.c.choices[i], before[i]);
                            a.response(
                                vec![CompletionChoice {
                                    index: i,
                                    text: String::new(),
                                    logprobs: lp,
                                    finish_reason: None,
                                    stop_reason: None,
                                }],
                                None,
                            )
                        })
                        .collect();
                }
                let Some(Delta { index: i, text, lp_from, finish }) = a.c.delta(p, &e) else {
                    return vec![];
                };
                let c = &a.c.choices[i];
                let logprobs = lp_from.and_then(|from| a.logprobs_of(c, from));
                let choice = CompletionChoice {
                    index: i,
                    text,
                    logprobs,
                    finish_reason: if finish { c.finish.as_ref().map(FinishReason::as_str) } else { None },
                    stop_reason: if finish { stop_reason(&c.finish) } else { None },
                };
                vec![a.response(vec![choice], None)]
            }
            Kind::Chat(a) => {
                let Some(Delta { index: i, text, lp_from, finish }) = a.c.delta(p, &e) else {
                    return vec![];
                };
                let c = &a.c.choices[i];
                let logprobs = lp_from.and_then(|from| a.logprobs_of(c, from));
                let delta = ChatMessage { role: None, content: (!text.is_empty()).then_some(text) };
                let choice = ChatChoice {
                    index: i,
                    message: None,
                    delta: Some(delta),
                    logprobs,
                    finish_reason: if finish { c.finish.as_ref().map(FinishReason::as_str) } else { None },
                };
                vec![a.response("chat.completion.chunk", vec![choice], None)]
            }
        }
    }

    /// Streaming: the final usage chunk (`choices: []`).
    pub fn usage_chunk(&self) -> Value {
        match self {
            Kind::Completion(a) => a.response(vec![], Some(a.c.usage())),
            Kind::Chat(a) => a.response("chat.completion.chunk", vec![], Some(a.c.usage())),
        }
    }
}
