//! Requests → [`ValidRequest`], the only form the scheduler accepts. Every refusal names the
//! field, what it must be and what it was.

use deltaserve_engine::{SamplingParams, Tokenizer};
use serde_json::Value;

use super::error::ApiError;
use super::types::{ChatRequest, CommonParams, CompletionRequest};
use crate::api::chat::output::{prompt_opens_thinking, OutputConfig};
use crate::api::chat::tools::{ToolChoice, ToolGrammar, ToolSet};
use crate::api::chat::{parse_messages, short, ChatTemplate, Message};
use crate::scheduler::GenParams;

/// Most stop strings per request.
pub const MAX_STOP: usize = 8;
/// Most logprobs alternatives per token.
pub const MAX_LOGPROBS: usize = 20;
/// `max_tokens` when a completions request gives none (OpenAI's default).
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

/// Server-side limits and identity the validation needs.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The one model name accepted in `model`.
    pub served_model_name: String,
    /// Prompt + generated tokens per sequence.
    pub max_model_len: usize,
    /// Most choices per request (bounded by the pool size).
    pub max_n: usize,
    /// Model vocabulary size.
    pub vocab_size: usize,
    /// KV blocks and tokens per block, for models with attention layers.
    pub kv_capacity: Option<(usize, usize)>,
}

/// A request the scheduler can run.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// One or more tokenized prompts (completions accept a batch).
    pub prompts: Vec<Vec<u32>>,
    /// Generation parameters shared by all prompts.
    pub params: GenParams,
    /// SSE streaming.
    pub stream: bool,
    /// Final usage chunk in streams.
    pub include_usage: bool,
    /// Completions `echo`.
    pub echo: bool,
    /// Chat: how to read the output (reasoning, tool calls) and the tool-call grammar.
    pub chat: Option<ChatOutput>,
}

/// What a chat request needs beyond generation: how its output is read, and the grammar that
/// `tool_choice: "required"` or a named function imposes.
#[derive(Debug, Clone)]
pub struct ChatOutput {
    /// Reasoning and tool-call parsing of every choice.
    pub output: OutputConfig,
    /// The grammar of the tool calls (required ones, or `auto` calls beside a structured
    /// answer).
    pub tool_grammar: Option<ToolGrammar>,
}

/// Errors unless `model` is absent or the served model's name.
pub fn check_model(model: Option<&str>, limits: &Limits) -> Result<(), ApiError> {
    match model {
        Some(m) if m != limits.served_model_name => {
            Err(ApiError::ModelNotFound(format!("model `{}` does not exist; this server serves `{}`", clip(m), limits.served_model_name)))
        }
        _ => Ok(()),
    }
}

/// At most 80 characters of `s` (error messages never echo unbounded input).
fn clip(s: &str) -> String {
    short(&Value::String(s.to_owned())).trim_matches('"').to_owned()
}

fn nonneg(name: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        Some(x) if x < 0 => Err(ApiError::invalid(name, ">= 0", x)),
        Some(x) => Ok(Some(x as usize)),
        None => Ok(None),
    }
}

fn token_id(name: &str, v: i64, vocab: usize) -> Result<u32, ApiError> {
    if v < 0 || v as u64 >= vocab as u64 {
        return Err(ApiError::invalid(name, format!("a token id in [0, {vocab})"), v));
    }
    Ok(v as u32)
}

/// Turns `prompt` into token-id lists: a string, a list of strings, a list of ids, or a list
/// of id lists.
pub fn parse_prompt(v: Option<&Value>, tok: &Tokenizer, vocab: usize) -> Result<Vec<Vec<u32>>, ApiError> {
    let expected = "a string, a list of strings, a list of token ids, or a list of token-id lists";
    let ids = |arr: &[Value], name: &str| -> Result<Vec<u32>, ApiError> {
        arr.iter()
            .enumerate()
            .map(|(i, x)| match x.as_i64() {
                Some(id) => token_id(&format!("{name}[{i}]"), id, vocab),
                None => Err(ApiError::invalid(&format!("{name}[{i}]"), "an integer token id", short(x))),
            })
            .collect()
    };
    let prompts = match v {
        Some(Value::String(s)) => vec![tok.encode(s, true)?],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::invalid("prompt", expected, "[]")),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().map(|s| tok.encode(s.as_str().unwrap_or_default(), true)).collect::<Result<_, _>>()?
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .enumerate()
            .map(|(i, x)| ids(x.as_array().map(Vec::as_slice).unwrap_or_default(), &format!("prompt[{i}]")))
            .collect::<Result<_, _>>()?,
        Some(Value::Array(a)) => vec![ids(a, "prompt")?],
        Some(other) => return Err(ApiError::invalid("prompt", expected, short(other))),
        None => return Err(ApiError::invalid("prompt", expected, "nothing")),
    };
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(ApiError::invalid(&format!("prompt[{i}]"), "at least one token", "an empty prompt"));
    }
    Ok(prompts)
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let stops = match v {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned).ok_or_else(|| ApiError::invalid("stop", "a string or a list of strings", short(x))))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(ApiError::invalid("stop", "a string or a list of strings", short(other))),
    };
    if stops.len() > MAX_STOP {
        return Err(ApiError::invalid("stop", format!("at most {MAX_STOP} strings"), format!("{} strings", stops.len())));
    }
    Ok(stops)
}

/// Fields not served here: a request that asks for them gets a 400 naming the field rather than
/// an answer that silently ignores it. The values that ask for nothing (no tools,
/// `"none"`/`"auto"`) pass. `chat` serves `tools` and `tool_choice` (checked in [`chat`]); the
/// deprecated `functions` / `function_call` are refused everywhere in favour of them.
fn refuse_unserved(c: &CommonParams, chat: bool) -> Result<(), ApiError> {
    let unserved = |field: &str, v: &Value, instead: &str| {
        ApiError::bad_request(format!("`{field}` is not supported {instead}; got {}", short(v)), Some(field), "unsupported_field")
    };
    let empty_list = |v: &Value| v.is_null() || v.as_array().is_some_and(Vec::is_empty);
    let no_choice = |v: &Value| v.is_null() || matches!(v.as_str(), Some("none" | "auto"));
    let tools_instead = if chat { "(use `tools`)" } else { "on /v1/completions (use /v1/chat/completions)" };
    let choice_instead = if chat { "(use `tool_choice`)" } else { tools_instead };
    if let Some(v) = c.functions.as_ref().filter(|v| !empty_list(v)) {
        return Err(unserved("functions", v, tools_instead));
    }
    if let Some(v) = c.function_call.as_ref().filter(|v| !no_choice(v)) {
        return Err(unserved("function_call", v, choice_instead));
    }
    if !chat {
        if let Some(v) = c.tools.as_ref().filter(|v| !empty_list(v)) {
            return Err(unserved("tools", v, tools_instead));
        }
        if let Some(v) = c.tool_choice.as_ref().filter(|v| !no_choice(v)) {
            return Err(unserved("tool_choice", v, tools_instead));
        }
    }
    Ok(())
}

/// What the request calls its prompt and its token limit (chat: `messages`, and
/// `max_completion_tokens` when that was the field given), for the fields errors name.
#[derive(Clone, Copy)]
struct Names {
    prompt: &'static str,
    max_tokens: &'static str,
}

/// Checks the shared fields; `default_max_tokens` gives `max_tokens` from the prompt length
/// when the request has none.
fn common(
    c: &CommonParams,
    prompts: &[Vec<u32>],
    limits: &Limits,
    (max_tokens, names): (Option<i64>, Names),
    default_max_tokens: impl Fn(usize) -> usize,
    logprobs: Option<usize>,
) -> Result<(GenParams, bool, bool), ApiError> {
    refuse_unserved(c, names.prompt == "messages")?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest >= limits.max_model_len {
        return Err(ApiError::bad_request(
            format!("the prompt has {longest} tokens; `max_model_len` is {}, which leaves no room to generate", limits.max_model_len),
            Some(names.prompt),
            "context_length_exceeded",
        ));
    }
    let max_tokens = match nonneg(names.max_tokens, max_tokens)? {
        Some(0) => return Err(ApiError::invalid(names.max_tokens, ">= 1", 0)),
        Some(m) => m,
        None => default_max_tokens(longest).max(1),
    };
    if longest + max_tokens > limits.max_model_len {
        return Err(ApiError::bad_request(
            format!(
                "the prompt ({longest} tokens) plus `{}` ({max_tokens}) exceeds `max_model_len` ({})",
                names.max_tokens, limits.max_model_len
            ),
            Some(names.max_tokens),
            "context_length_exceeded",
        ));
    }
    let n = nonneg("n", c.n)?.unwrap_or(1);
    if n == 0 || n > limits.max_n {
        return Err(ApiError::invalid("n", format!("in [1, {}]", limits.max_n), n));
    }
    if let Some((blocks, block_size)) = limits.kv_capacity {
        let need = n * (longest + max_tokens).div_ceil(block_size);
        if need > blocks {
            return Err(ApiError::bad_request(
                format!(
                    "{n} choices of {longest} prompt tokens plus `{}` ({max_tokens}) need {need} KV-cache blocks of {block_size} tokens; the cache has {blocks}",
                    names.max_tokens
                ),
                Some(names.max_tokens),
                "context_length_exceeded",
            ));
        }
    }
    if let Some(b) = c.best_of {
        if b != n as i64 {
            return Err(ApiError::invalid("best_of", format!("equal to `n` ({n}) or absent: ranking candidates is not supported"), b));
        }
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => return Err(ApiError::invalid("top_k", "-1, 0 (off) or a positive integer", k)),
    };
    let mut logit_bias = Vec::new();
    for (k, &b) in c.logit_bias.iter().flatten() {
        let id = k.parse::<i64>().map_err(|_| ApiError::invalid("logit_bias", "keys that are token ids", format!("{k:?}")))?;
        logit_bias.push((token_id("logit_bias", id, limits.vocab_size)?, b));
    }
    logit_bias.sort_by_key(|x| x.0);
    let sampling = SamplingParams {
        temperature: c.temperature.unwrap_or(1.0),
        top_k,
        top_p: c.top_p.unwrap_or(1.0),
        min_p: c.min_p.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        logit_bias,
        seed: c.seed.map(|s| s as u64),
    };
    sampling.validate(limits.vocab_size).map_err(ApiError::from)?;
    let stop_token_ids =
        c.stop_token_ids.iter().flatten().map(|&t| token_id("stop_token_ids", t, limits.vocab_size)).collect::<Result<_, _>>()?;
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid("stream_options", "given only with `stream: true`", "stream_options without streaming"));
    }
    let include_usage = c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    let params = GenParams {
        n,
        max_tokens,
        sampling,
        stop: parse_stop(c.stop.as_ref())?,
        stop_token_ids,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        logprobs,
        prompt_logprobs: false,
        cache_output: false,
        constraint: None,
    };
    Ok((params, stream, include_usage))
}

/// Refuses text too long to fit `max_model_len` tokens before tokenizing it (a 4 MB prompt took
/// 3.8 s of CPU to tokenize only to be refused): `bytes` needs at least `bytes /
/// max_token_bytes` tokens; twice that bound is allowed, for normalisers that shrink text.
fn check_text_bytes(field: &str, bytes: usize, tok: &Tokenizer, limits: &Limits) -> Result<(), ApiError> {
    let bound = limits.max_model_len.saturating_mul(tok.max_token_bytes()).saturating_mul(2);
    if bytes > bound {
        return Err(ApiError::bad_request(
            format!(
                "the prompt has {bytes} bytes: more than {} tokens at any tokenization, past `max_model_len` ({})",
                limits.max_model_len, limits.max_model_len
            ),
            Some(field),
            "context_length_exceeded",
        ));
    }
    Ok(())
}

/// Validates a completions request.
pub fn completion(req: &CompletionRequest, tok: &Tokenizer, limits: &Limits) -> Result<ValidRequest, ApiError> {
    check_model(req.common.model.as_deref(), limits)?;
    let text_bytes = match req.prompt.as_ref() {
        Some(Value::String(s)) => s.len(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::len).max().unwrap_or(0),
        _ => 0,
    };
    check_text_bytes("prompt", text_bytes, tok, limits)?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(
            "suffix",
            "absent or empty (insertion is not supported)",
            clip(&format!("{:?}", req.suffix.as_deref().unwrap_or_default())),
        ));
    }
    let logprobs = match nonneg("logprobs", req.logprobs)? {
        Some(n) if n > MAX_LOGPROBS => return Err(ApiError::invalid("logprobs", format!("in [0, {MAX_LOGPROBS}]"), n)),
        other => other,
    };
    let prompts = parse_prompt(req.prompt.as_ref(), tok, limits.vocab_size)?;
    let names = Names { prompt: "prompt", max_tokens: "max_tokens" };
    let (mut params, stream, include_usage) =
        common(&req.common, &prompts, limits, (req.common.max_tokens, names), |_| DEFAULT_COMPLETION_MAX_TOKENS, logprobs)?;
    let echo = req.echo.unwrap_or(false);
    params.prompt_logprobs = echo && logprobs.is_some();
    let max_n = limits.max_n;
    if prompts.len() * params.n > max_n {
        return Err(ApiError::invalid(
            "n",
            format!("in [1, {}] for {} prompts (at most {max_n} choices in all)", max_n / prompts.len(), prompts.len()),
            params.n,
        ));
    }
    Ok(ValidRequest { prompts, params, stream, include_usage, echo, chat: None })
}

/// Validates a chat request, rendering its messages (and tools) with `template`.
pub fn chat(req: &ChatRequest, tok: &Tokenizer, template: Option<&ChatTemplate>, limits: &Limits) -> Result<ValidRequest, ApiError> {
    check_model(req.common.model.as_deref(), limits)?;
    let messages = parse_messages(req.messages.as_ref())?;
    check_text_bytes("messages", messages.iter().map(|m| m.content.len()).sum(), tok, limits)?;
    let template = template.ok_or_else(|| {
        ApiError::bad_request(
            "this model's tokenizer_config.json has no `chat_template`; use /v1/completions",
            Some("messages"),
            "no_chat_template",
        )
    })?;
    let tools = ToolSet::parse(req.common.tools.as_ref())?;
    let choice = ToolChoice::parse(req.common.tool_choice.as_ref(), &tools)?;
    let calls_tools = choice != ToolChoice::None;
    let syntax = match (calls_tools, template.tool_syntax) {
        (true, None) => {
            return Err(ApiError::bad_request(
                "this model's chat template shows no tool-call syntax; start the server with `--tool-call-parser`",
                Some("tools"),
                "unsupported_field",
            ))
        }
        (true, s) => s,
        (false, _) => None,
    };
    // `none`: the model is not shown the tools, so it answers in text.
    let shown = calls_tools.then_some(req.common.tools.as_ref()).flatten();
    let rendered = render_chat_prompt(template, tok, &messages, shown, req.chat_template_kwargs.as_ref())?;
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let tools = std::sync::Arc::new(tools);
    let tool_grammar = syntax.map(|syntax| {
        let (only, required) = match &choice {
            ToolChoice::Named(n) => (Some(n.clone()), true),
            other => (None, *other == ToolChoice::Required),
        };
        ToolGrammar { syntax, tools: tools.clone(), parallel: parallel && only.is_none(), only, required }
    });
    let output = OutputConfig {
        reasoning: template.thinks,
        starts_thinking: template.thinks && rendered.opens_thinking,
        tool_syntax: syntax,
        tools,
    };
    let top = nonneg("top_logprobs", req.top_logprobs)?;
    if let Some(n) = top.filter(|&n| n > MAX_LOGPROBS) {
        return Err(ApiError::invalid("top_logprobs", format!("in [0, {MAX_LOGPROBS}]"), n));
    }
    if top.is_some() && req.logprobs != Some(true) {
        return Err(ApiError::invalid("top_logprobs", "given only with `logprobs: true`", "top_logprobs without logprobs"));
    }
    let logprobs = (req.logprobs == Some(true)).then(|| top.unwrap_or(0));
    if req.max_completion_tokens.is_some() && req.common.max_tokens.is_some() && req.max_completion_tokens != req.common.max_tokens {
        return Err(ApiError::invalid(
            "max_completion_tokens",
            "equal to `max_tokens` when both are given",
            req.max_completion_tokens.unwrap_or_default(),
        ));
    }
    let max_tokens = req.max_completion_tokens.or(req.common.max_tokens);
    let names =
        Names { prompt: "messages", max_tokens: if req.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" } };
    let prompts = vec![rendered.ids];
    let max_len = limits.max_model_len;
    let (mut params, stream, include_usage) =
        common(&req.common, &prompts, limits, (max_tokens, names), |len| max_len.saturating_sub(len), logprobs)?;
    // The next turn re-sends this conversation with the answer: keep its state.
    params.cache_output = true;
    Ok(ValidRequest { prompts, params, stream, include_usage, echo: false, chat: Some(ChatOutput { output, tool_grammar }) })
}

/// A rendered, tokenized chat prompt.
#[derive(Debug, Clone)]
pub struct RenderedPrompt {
    /// Its tokens.
    pub ids: Vec<u32>,
    /// It ends inside an open `<think>` block.
    pub opens_thinking: bool,
}

/// Renders messages (and tools) and tokenizes them, adding BOS only if the template did not
/// already.
pub fn render_chat_prompt(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[Message],
    tools: Option<&Value>,
    kwargs: Option<&Value>,
) -> Result<RenderedPrompt, ApiError> {
    let t0 = std::time::Instant::now();
    let text = template.render(messages, tools, kwargs)?;
    let t1 = std::time::Instant::now();
    let has_bos = tok.bos_token.as_deref().is_some_and(|b| !b.is_empty() && text.starts_with(b));
    let ids = tok.encode(&text, !has_bos)?;
    let (render, encode) = (t1 - t0, t1.elapsed());
    tracing::debug!(
        bytes = text.len(),
        tokens = ids.len(),
        render_ms = render.as_secs_f64() * 1e3,
        encode_ms = encode.as_secs_f64() * 1e3,
        "chat prompt"
    );
    Ok(RenderedPrompt { ids, opens_thinking: prompt_opens_thinking(&text) })
}
