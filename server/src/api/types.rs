//! OpenAI request and response bodies. Requests keep loosely typed fields (`Value`, `i64`)
//! where a precise error message needs the raw value; `validate` turns them into
//! [`super::validate::ValidRequest`].

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A body field of the wrong JSON type: its path (`None` for the body itself) and the message.
#[derive(Debug)]
pub struct TypeError {
    /// The field's path, e.g. `max_tokens` or `stream_options.include_usage`.
    pub path: Option<String>,
    /// What was wrong.
    pub message: String,
}

/// A request body built from parsed JSON, with the failing field's path in type errors.
pub trait FromBody: Sized {
    /// Deserializes `v`.
    fn from_body(v: &Value) -> Result<Self, TypeError>;
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, TypeError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            TypeError { path: None, message: e.inner().to_string() }
        } else {
            TypeError { message: format!("`{path}`: {}", e.inner()), path: Some(path) }
        }
    })
}

macro_rules! from_body {
    ($t:ty) => {
        impl FromBody for $t {
            fn from_body(v: &Value) -> Result<Self, TypeError> {
                typed(v)
            }
        }
    };
    ($t:ty, common) => {
        impl FromBody for $t {
            fn from_body(v: &Value) -> Result<Self, TypeError> {
                let mut r: Self = typed(v)?;
                // Shared fields live in the same JSON object; a flattened struct would lose
                // the field path in error messages.
                r.common = typed(v)?;
                Ok(r)
            }
        }
    };
}

from_body!(CompletionRequest, common);
from_body!(ChatRequest, common);
from_body!(TokenizeRequest);
from_body!(DetokenizeRequest);

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling and stopping fields shared by completions and chat.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    /// Must name the served model when given.
    pub model: Option<String>,
    /// Tokens to generate at most.
    pub max_tokens: Option<i64>,
    /// 0 → greedy.
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1].
    pub top_p: Option<f32>,
    /// -1 or 0 → off.
    pub top_k: Option<i64>,
    /// In [0, 1].
    pub min_p: Option<f32>,
    /// Choices per prompt.
    pub n: Option<i64>,
    /// Accepted only as equal to `n`.
    pub best_of: Option<i64>,
    /// A string or a list of up to 8 strings.
    pub stop: Option<Value>,
    /// Extra token ids that end generation.
    pub stop_token_ids: Option<Vec<i64>>,
    /// RNG seed.
    pub seed: Option<i64>,
    /// In [-2, 2].
    pub presence_penalty: Option<f32>,
    /// In [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// > 0; 1 → off.
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) → bias in [-100, 100].
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Generate past EOS.
    pub ignore_eos: Option<bool>,
    /// Stream SSE chunks.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// End-user id (logged only).
    pub user: Option<String>,
    /// Structured output (OpenAI): `text`, `json_object` or `json_schema`.
    pub response_format: Option<Value>,
    /// vLLM's structured outputs: one of `json`, `regex`, `choice`, `grammar`, `json_object`.
    pub structured_outputs: Option<Value>,
    /// Tool definitions (chat only).
    pub tools: Option<Value>,
    /// `none`, `auto`, `required` or a named function (chat only).
    pub tool_choice: Option<Value>,
    /// The deprecated `functions`: refused unless empty.
    pub functions: Option<Value>,
    /// The deprecated `function_call`: refused unless `"none"` or `"auto"`.
    pub function_call: Option<Value>,
    /// vLLM's older guided decoding: a JSON schema.
    pub guided_json: Option<Value>,
    /// A regular expression the output matches.
    pub guided_regex: Option<Value>,
    /// Strings, one of which is the output.
    pub guided_choice: Option<Value>,
    /// A Lark grammar.
    pub guided_grammar: Option<Value>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// String, list of strings, list of token ids, or list of such lists.
    pub prompt: Option<Value>,
    /// Top-N logprobs per token, ≤ 20.
    pub logprobs: Option<i64>,
    /// Prepend the prompt to the output.
    pub echo: Option<bool>,
    /// Not supported (insertion); refused when non-empty.
    pub suffix: Option<String>,
    /// Shared fields (read from the same object, see [`FromBody`]).
    #[serde(skip)]
    pub common: CommonParams,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// `[{role, content}]`; content a string or a list of text parts.
    pub messages: Option<Value>,
    /// Alias of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Return logprobs of the chosen tokens.
    pub logprobs: Option<bool>,
    /// Top-N alternatives per token, ≤ 20 (needs `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Extra variables for the chat template (vLLM's field, e.g. `{"enable_thinking": false}`).
    pub chat_template_kwargs: Option<Value>,
    /// Allow more than one tool call per answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Shared fields (read from the same object, see [`FromBody`]).
    #[serde(skip)]
    pub common: CommonParams,
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// Must name the served model when given.
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// Or chat messages, rendered with the chat template.
    pub messages: Option<Value>,
    /// Add BOS as the checkpoint does (default true).
    pub add_special_tokens: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// Must name the served model when given.
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<i64>,
}

/// `usage`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens (all prompts).
    pub prompt_tokens: usize,
    /// Generated tokens (all choices).
    pub completion_tokens: usize,
    /// Sum of both.
    pub total_tokens: usize,
}

/// Legacy completions `logprobs` object.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities (null for the first prompt token).
    pub token_logprobs: Vec<Option<f32>>,
    /// Top-N alternatives per token.
    pub top_logprobs: Vec<Option<HashMap<String, f32>>>,
    /// Character offset of each token in the choice text.
    pub text_offset: Vec<usize>,
}

/// One completions choice.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// Position among all choices.
    pub index: usize,
    /// Generated (or echoed + generated) text.
    pub text: String,
    /// Logprobs when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; null while streaming.
    pub finish_reason: Option<&'static str>,
    /// The stop string or token id that ended the choice (vLLM's extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Value>,
}

/// A completions response or stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    /// `cmpl-…`.
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// Choices.
    pub choices: Vec<CompletionChoice>,
    /// Usage; in streams only on the final usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Chat logprob entry of one token.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    /// Token text.
    pub token: String,
    /// log p.
    pub logprob: f32,
    /// UTF-8 bytes of the token text.
    pub bytes: Vec<u8>,
    /// Alternatives.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// One alternative.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTopLogprob {
    /// Token text.
    pub token: String,
    /// log p.
    pub logprob: f32,
    /// UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// Chat `logprobs` object.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// Assistant message or stream delta.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatMessage {
    /// `assistant` (first delta and full messages only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// Text (null in a full message that only calls tools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The text of the model's `<think>` block (vLLM's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls: whole in a message, in pieces (by `index`) in stream deltas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A tool call, or a streamed piece of one.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCall {
    /// Position among the choice's calls (stream deltas only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// `call_…` (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first piece only).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name and arguments.
    pub function: FunctionCall,
}

/// The function of a [`ToolCall`].
#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    /// Function name (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The arguments as JSON text (or a fragment of it).
    pub arguments: String,
}

/// One chat choice (non-streaming: `message`; streaming: `delta`).
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Choice index.
    pub index: usize,
    /// Full message (non-streaming).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatMessage>,
    /// Delta (streaming).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChatMessage>,
    /// Logprobs when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`; null while streaming.
    pub finish_reason: Option<&'static str>,
}

/// A chat response or stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    /// `chatcmpl-…`.
    pub id: String,
    /// `chat.completion` or `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// Choices.
    pub choices: Vec<ChatChoice>,
    /// Usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}
