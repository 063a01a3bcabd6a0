//! `/v1/chat/completions` responses: assistant messages with their reasoning and tool calls,
//! role-first streaming deltas, per-token logprobs with their bytes.

use std::sync::Arc;

use deltaserve_engine::Tokenizer;
use serde_json::Value;

use super::{token_text, Assembler, Choice, Common, Delta};
use crate::api::chat::output::{CallDelta, OutputConfig, OutputParser, Parts};
use crate::api::types::{
    ChatChoice, ChatLogprobs, ChatMessage, ChatResponse, ChatTokenLogprob, ChatTopLogprob, FunctionCall, ToolCall, Usage,
};
use crate::api::validate::ValidRequest;
use crate::scheduler::{Event, FinishReason};

/// Builds `/v1/chat/completions` responses.
pub struct ChatAssembler {
    c: Common,
    output: OutputConfig,
    /// One incremental parser per choice (streaming).
    parsers: Vec<OutputParser>,
}

/// The finish reason a client sees: `tool_calls` when the model stopped after calling tools.
fn finish_reason(f: Option<&FinishReason>, calls: usize) -> Option<&'static str> {
    match f {
        Some(FinishReason::Stop(_)) if calls > 0 => Some("tool_calls"),
        other => other.map(FinishReason::as_str),
    }
}

impl ChatAssembler {
    /// Starts a response for `v`.
    pub fn new(id: String, model: String, created: u64, tok: Arc<Tokenizer>, v: &ValidRequest) -> Self {
        let c = Common::new(id, model, created, tok, v);
        let output = v.chat.as_ref().map(|c| c.output.clone()).unwrap_or_default();
        let parsers = (0..c.choices.len()).map(|_| OutputParser::new(output.clone())).collect();
        Self { c, output, parsers }
    }

    /// The id of call `k` of choice `choice`.
    fn call_id(&self, choice: usize, k: usize) -> String {
        let tail = self.c.id.rsplit('-').next().unwrap_or_default();
        format!("call_{tail}{choice:02x}{k:02x}")
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

    /// Stream pieces of calls, consecutive pieces of one call merged.
    fn call_pieces(&self, choice: usize, calls: Vec<CallDelta>) -> Vec<ToolCall> {
        let mut out: Vec<ToolCall> = Vec::new();
        for d in calls {
            match out.last_mut() {
                Some(last) if last.index == Some(d.index) && d.name.is_none() => last.function.arguments.push_str(&d.arguments),
                _ => out.push(ToolCall {
                    index: Some(d.index),
                    id: d.name.is_some().then(|| self.call_id(choice, d.index)),
                    kind: d.name.is_some().then_some("function"),
                    function: FunctionCall { name: d.name, arguments: d.arguments },
                }),
            }
        }
        out
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
            .map(|(i, c)| {
                let parsed = OutputParser::parse_all(self.output.clone(), &c.text);
                let calls: Vec<ToolCall> = parsed
                    .calls
                    .iter()
                    .enumerate()
                    .map(|(k, (name, arguments))| ToolCall {
                        index: None,
                        id: Some(self.call_id(i, k)),
                        kind: Some("function"),
                        function: FunctionCall { name: Some(name.clone()), arguments: arguments.clone() },
                    })
                    .collect();
                // `content: null` beside tool calls or reasoning when there is no text (as OpenAI
                // and vLLM send it); `""` for an empty plain answer.
                let content = (!parsed.content.is_empty() || (calls.is_empty() && parsed.reasoning.is_empty())).then_some(parsed.content);
                ChatChoice {
                    index: i,
                    message: Some(ChatMessage {
                        role: Some("assistant"),
                        content,
                        reasoning_content: (!parsed.reasoning.is_empty()).then_some(parsed.reasoning),
                        tool_calls: (!calls.is_empty()).then_some(calls.clone()),
                    }),
                    delta: None,
                    logprobs: self.logprobs_of(c, 0),
                    finish_reason: finish_reason(c.finish.as_ref(), calls.len()),
                }
            })
            .collect();
        self.response("chat.completion", choices, Some(self.c.usage()))
    }

    fn opening(&self) -> serde_json::Result<Vec<Value>> {
        (0..self.c.choices.len())
            .map(|i| {
                let delta = ChatMessage { role: Some("assistant"), content: Some(String::new()), ..ChatMessage::default() };
                let choice = ChatChoice { index: i, message: None, delta: Some(delta), logprobs: None, finish_reason: None };
                self.response("chat.completion.chunk", vec![choice], None)
            })
            .collect()
    }

    fn chunks(&mut self, p: usize, e: Event) -> serde_json::Result<Vec<Value>> {
        let Some(Delta { index: i, text, lp_from, finish }) = self.c.delta(p, &e) else {
            return Ok(vec![]);
        };
        let mut parts: Parts = self.parsers[i].push(&text);
        if finish {
            parts.extend(self.parsers[i].finish());
        }
        let c = &self.c.choices[i];
        let mut deltas: Vec<ChatMessage> = Vec::new();
        if !parts.reasoning.is_empty() || !parts.content.is_empty() || (parts.calls.is_empty() && (lp_from.is_some() || finish)) {
            deltas.push(ChatMessage {
                content: (!parts.content.is_empty()).then_some(parts.content),
                reasoning_content: (!parts.reasoning.is_empty()).then_some(parts.reasoning),
                ..ChatMessage::default()
            });
        }
        // One call piece per chunk, as OpenAI streams them.
        for piece in self.call_pieces(i, parts.calls) {
            deltas.push(ChatMessage { tool_calls: Some(vec![piece]), ..ChatMessage::default() });
        }
        let last = deltas.len().saturating_sub(1);
        let calls = self.parsers[i].calls();
        let mut out = Vec::with_capacity(deltas.len());
        for (k, delta) in deltas.into_iter().enumerate() {
            let choice = ChatChoice {
                index: i,
                message: None,
                delta: Some(delta),
                logprobs: if k == 0 { lp_from.and_then(|from| self.logprobs_of(c, from)) } else { None },
                finish_reason: if finish && k == last { finish_reason(c.finish.as_ref(), calls) } else { None },
            };
            out.push(self.response("chat.completion.chunk", vec![choice], None)?);
        }
        Ok(out)
    }

    fn usage_chunk(&self) -> serde_json::Result<Value> {
        self.response("chat.completion.chunk", vec![], Some(self.c.usage()))
    }
}
