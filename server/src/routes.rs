//! axum handlers: OpenAI completions and chat (JSON or SSE), models, tokenize, health,
//! readiness and metrics.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use deltaserve_engine::Tokenizer;
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::api::chat::ChatTemplate;
use crate::api::error::ApiError;
use crate::api::structured::Requested;
use crate::api::types::{ChatRequest, CompletionRequest, DetokenizeRequest, FromBody, TokenizeRequest};
use crate::api::validate::{self, Limits, ValidRequest};
use crate::metrics::Metrics;
use crate::response::{Assembler, ChatAssembler, CompletionAssembler};
use crate::scheduler::{Event, GenRequest, SchedulerError, SchedulerHandle};

/// What exists once the model is loaded.
pub struct Serving {
    /// The engine thread.
    pub scheduler: SchedulerHandle,
    /// Tokenizer shared with the engine.
    pub tokenizer: Arc<Tokenizer>,
    /// Compiled chat template, if the checkpoint has one.
    pub template: Option<Arc<ChatTemplate>>,
    /// Validation limits.
    pub limits: Limits,
    /// The structured-output grammar compiler (`None` when the tokenizer cannot have one).
    pub grammars: Option<Arc<crate::structured::Grammars>>,
}

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    /// Set once the model has loaded.
    pub serving: Arc<OnceLock<Serving>>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// `--api-key`.
    pub api_key: Option<Arc<str>>,
    /// Set on SIGTERM: no new work.
    pub draining: Arc<AtomicBool>,
    /// Served model name (known before loading).
    pub model_name: Arc<str>,
    /// Body size limit in bytes.
    pub body_limit: usize,
    /// Longest a request body may take to arrive (`--body-read-timeout`).
    pub body_timeout: std::time::Duration,
    /// Unix time the server started.
    pub created: u64,
    /// Request-id counter.
    pub next_id: Arc<AtomicU64>,
}

impl AppState {
    fn serving(&self) -> Result<&Serving, ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::Unavailable("the server is shutting down".into()));
        }
        self.serving.get().ok_or_else(|| ApiError::Unavailable("the model is still loading".into()))
    }

    fn request_id(&self, prefix: &str) -> String {
        format!("{prefix}-{:x}{:06x}", self.created, self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The router. Layers, inside out: body limit, auth (for /v1 and tokenize), error counting.
pub fn app(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), count_errors))
        .with_state(state)
}

/// JSON body extractor whose rejections use the OpenAI error envelope.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: FromBody,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = req.extensions().get::<BodyLimit>().map_or(0, |l| l.0);
        let within = req.extensions().get::<BodyTimeout>().map_or(std::time::Duration::MAX, |t| t.0);
        // A body shorter than its Content-Length, or dripped in, would hold the request forever.
        let read = tokio::time::timeout(within, Json::<Value>::from_request(req, state)).await;
        let Ok(read) = read else { return Err(ApiError::BodyTimeout(within.as_secs())) };
        let value = match read {
            Ok(Json(v)) => v,
            Err(rej) if rej.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(ApiError::PayloadTooLarge { limit }),
            Err(JsonRejection::MissingJsonContentType(_)) => return Err(ApiError::UnsupportedMediaType),
            Err(rej) => return Err(ApiError::bad_request(rej.body_text(), None, "invalid_json")),
        };
        if !value.is_object() {
            return Err(ApiError::bad_request(
                format!("the request body must be a JSON object; got {}", crate::api::chat::short(&value)),
                None,
                "invalid_json",
            ));
        }
        T::from_body(&value).map(Self).map_err(|e| {
            ApiError::bad_request(format!("invalid request body: {}", clip(&e.message, 200)), e.path.as_deref(), "invalid_type")
        })
    }
}

/// At most `n` bytes of `s` (serde's messages quote the offending value whole).
fn clip(s: &str, n: usize) -> String {
    match (0..=n.min(s.len())).rev().find(|&i| s.is_char_boundary(i)) {
        Some(cut) if cut < s.len() => format!("{}…", &s[..cut]),
        _ => s.to_owned(),
    }
}

#[derive(Clone, Copy)]
struct BodyLimit(usize);

#[derive(Clone, Copy)]
struct BodyTimeout(std::time::Duration);

async fn count_errors(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(BodyLimit(state.body_limit));
    req.extensions_mut().insert(BodyTimeout(state.body_timeout));
    let path = req.uri().path().to_owned();
    let res = next.run(req).await;
    let status = res.status();
    // Liveness and readiness probes answer 503 by design while loading or draining: not errors.
    let probe = path == "/health" || path == "/ready";
    if (status.is_client_error() || status.is_server_error()) && !probe {
        state.metrics.request_errors.with_label_values(&[status.as_str()]).inc();
        if let Some(e) = res.extensions().get::<crate::api::error::ErrorLogged>() {
            tracing::info!(%path, status = status.as_u16(), error = %e.0, "request refused");
        }
    }
    res
}

async fn auth(State(state): State<AppState>, headers: HeaderMap, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        // Two Authorization headers are ambiguous: refuse rather than pick one.
        if headers.get_all(header::AUTHORIZATION).iter().count() > 1 {
            return ApiError::Unauthorized.into_response();
        }
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_ref()) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::NotFound(format!("no route for {} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

async fn ready(State(state): State<AppState>) -> Response {
    match state.serving() {
        Ok(s) if s.scheduler.alive() => Json(json!({"status": "ready"})).into_response(),
        Ok(_) => ApiError::Unavailable("the engine thread has stopped".into()).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    if let Some(stats) = state.serving().ok().and_then(|s| s.tokenizer.segment_stats()) {
        state.metrics.sync_tokenizer_cache(&stats);
    }
    let text = state.metrics.render().map_err(|e| ApiError::Internal(format!("cannot encode the metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

async fn models(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let s = state.serving()?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": &*state.model_name, "object": "model", "created": state.created, "owned_by": "deltaserve",
            "root": &*state.model_name, "max_model_len": s.limits.max_model_len
        }]
    })))
}

async fn tokenize(State(state): State<AppState>, ApiJson(req): ApiJson<TokenizeRequest>) -> Result<Json<Value>, ApiError> {
    let s = state.serving()?;
    validate::check_model(req.model.as_deref(), &s.limits)?;
    let (tok, template) = (s.tokenizer.clone(), s.template.clone());
    let tokens = blocking(move || match (&req.prompt, &req.messages) {
        (Some(p), None) => Ok(tok.encode(p, req.add_special_tokens.unwrap_or(true))?),
        (None, Some(m)) => {
            let msgs = crate::api::chat::parse_messages(Some(m))?;
            let t = template
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("this model has no `chat_template`", Some("messages"), "no_chat_template"))?;
            Ok(validate::render_chat_prompt(t, &tok, &msgs, None, None)?.ids)
        }
        _ => Err(ApiError::invalid("prompt", "exactly one of `prompt` or `messages`", "both or neither")),
    })
    .await?;
    Ok(Json(json!({"count": tokens.len(), "max_model_len": s.limits.max_model_len, "tokens": tokens})))
}

async fn detokenize(State(state): State<AppState>, ApiJson(req): ApiJson<DetokenizeRequest>) -> Result<Json<Value>, ApiError> {
    let s = state.serving()?;
    validate::check_model(req.model.as_deref(), &s.limits)?;
    let vocab = s.limits.vocab_size;
    let ids = req
        .tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if t < 0 || t as u64 >= vocab as u64 {
                Err(ApiError::invalid(&format!("tokens[{i}]"), format!("a token id in [0, {vocab})"), t))
            } else {
                Ok(t as u32)
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tok = s.tokenizer.clone();
    let text = blocking(move || Ok(tok.decode(&ids, false)?)).await?;
    Ok(Json(json!({"prompt": text})))
}

/// Sends every prompt of a valid request to the scheduler; one event stream per prompt.
fn submit(state: &AppState, s: &Serving, id: &str, v: &ValidRequest) -> Result<Vec<mpsc::Receiver<Event>>, ApiError> {
    let mut rxs = Vec::with_capacity(v.prompts.len());
    for (i, prompt) in v.prompts.iter().enumerate() {
        let (req, rx) = GenRequest::new(format!("{id}-{i}"), prompt.clone(), v.params.clone());
        if let Err(e) = s.scheduler.submit(req) {
            if matches!(e, SchedulerError::QueueFull { .. }) {
                state.metrics.requests_rejected.with_label_values(&["queue_full"]).inc();
            }
            // Earlier prompts of this request are cancelled by dropping their receivers.
            return Err(e.into());
        }
        rxs.push(rx);
    }
    Ok(rxs)
}

/// Validation runs on a blocking thread: tokenizing a long prompt must not stall the runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::Internal(format!("validation task failed: {e}")))?
}

/// Stack of a grammar-compiling thread (address space; pages are touched only as used).
const GRAMMAR_STACK_BYTES: usize = 1 << 30;

/// Longest a grammar may take to compile before the request is refused.
const GRAMMAR_COMPILE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Compiles a request's grammar on a thread of its own, bounded in time: a schema too large or
/// too slow to compile gets a 400 naming its field, never a stuck engine.
async fn compile_grammar(s: &Serving, requested: Option<Requested>) -> Result<Option<crate::structured::Constraint>, ApiError> {
    let Some(r) = requested else { return Ok(None) };
    let Some(grammars) = s.grammars.clone() else {
        return Err(ApiError::bad_request(
            "structured outputs are not available for this model's tokenizer",
            Some(&r.field),
            "unsupported_field",
        ));
    };
    let field = r.field.clone();
    // Its own thread with a deep stack: llguidance compiles recursively, and a deeply nested
    // grammar overflowed a runtime thread's stack (which aborts the process).
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("grammar-compile".into())
        .stack_size(GRAMMAR_STACK_BYTES)
        .spawn(move || {
            let c = grammars.compile(r.grammar);
            let _ = tx
                .send(c.map_err(|e| ApiError::bad_request(format!("`{}` cannot be used: {e}", r.field), Some(&r.field), "invalid_value")));
        })
        .map_err(|e| ApiError::Internal(format!("cannot start a grammar compiler thread: {e}")))?;
    match tokio::time::timeout(GRAMMAR_COMPILE_TIMEOUT, rx).await {
        Ok(Ok(c)) => Ok(Some(c?)),
        Ok(Err(_)) => Err(ApiError::Internal("the grammar compiler thread failed".into())),
        Err(_) => Err(ApiError::bad_request(
            format!("`{field}` took longer than {} s to compile; simplify it", GRAMMAR_COMPILE_TIMEOUT.as_secs()),
            Some(&field),
            "invalid_value",
        )),
    }
}

async fn completions(State(state): State<AppState>, ApiJson(req): ApiJson<CompletionRequest>) -> Result<Response, ApiError> {
    let s = state.serving()?;
    let tok = s.tokenizer.clone();
    let limits = s.limits.clone();
    let v_user = req.common.user.clone();
    let grammar = crate::api::structured::requested_grammar(&req.common)?;
    let mut v = blocking(move || validate::completion(&req, &tok, &limits)).await?;
    v.params.constraint = compile_grammar(s, grammar).await?;
    let id = state.request_id("cmpl");
    tracing::debug!(request = %id, user = v_user.as_deref().unwrap_or(""), prompts = v.prompts.len(), stream = v.stream, "completion");
    let rxs = submit(&state, s, &id, &v)?;
    let asm = CompletionAssembler::new(id, state.model_name.to_string(), unix_now(), s.tokenizer.clone(), &v);
    run(state.clone(), Box::new(asm), v, rxs).await
}

async fn chat_completions(State(state): State<AppState>, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response, ApiError> {
    let s = state.serving()?;
    let (tok, template, limits) = (s.tokenizer.clone(), s.template.clone(), s.limits.clone());
    let user = req.common.user.clone();
    let grammar = crate::api::structured::requested_grammar(&req.common)?;
    let mut v = blocking(move || validate::chat(&req, &tok, template.as_deref(), &limits)).await?;
    let chat = v.chat.clone().unwrap_or_else(|| validate::ChatOutput { output: Default::default(), tool_grammar: None });
    let grammar = match (grammar, chat.tool_grammar) {
        (Some(g), Some(t)) if t.required => {
            return Err(ApiError::bad_request(
                format!("`{}` cannot be combined with a `tool_choice` that requires a call", g.field),
                Some(&g.field),
                "invalid_value",
            ))
        }
        // `auto` with a structured answer: tool calls, or the answer.
        (Some(g), Some(t)) => match &g.answer {
            Some(a) => Some(Requested { grammar: llguidance::api::TopLevelGrammar::from_lark(t.lark(Some(a))), ..g }),
            None => Some(g),
        },
        (None, Some(t)) if t.required => {
            Some(Requested { field: "tools".into(), grammar: llguidance::api::TopLevelGrammar::from_lark(t.lark(None)), answer: None })
        }
        (g, _) => g,
    };
    v.params.constraint = compile_grammar(s, grammar).await?;
    if chat.output.starts_thinking {
        // The grammar holds for the answer, after the reasoning the prompt opened.
        if let Some(c) = v.params.constraint.as_mut() {
            c.wait_for(crate::api::chat::output::THINK_CLOSE);
        }
    }
    let id = state.request_id("chatcmpl");
    tracing::debug!(request = %id, user = user.as_deref().unwrap_or(""), stream = v.stream, "chat completion");
    let rxs = submit(&state, s, &id, &v)?;
    let asm = ChatAssembler::new(id, state.model_name.to_string(), unix_now(), s.tokenizer.clone(), &v);
    run(state.clone(), Box::new(asm), v, rxs).await
}

/// Merges the prompts' event streams, tagging each event with its prompt index.
fn merged(rxs: Vec<mpsc::Receiver<Event>>) -> BoxStream<'static, (usize, Event)> {
    stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| ReceiverStream::new(rx).map(move |e| (i, e)).boxed())).boxed()
}

/// A response body that failed to serialize.
fn serialization(e: serde_json::Error) -> ApiError {
    ApiError::Internal(format!("cannot serialize the response: {e}"))
}

/// SSE events of JSON chunks.
fn sse(chunks: Vec<Value>) -> Vec<Result<SseEvent, Infallible>> {
    chunks.into_iter().map(|c| Ok(SseEvent::default().data(c.to_string()))).collect()
}

/// The SSE error event and `[DONE]` that end a stream.
fn sse_error(err: &ApiError) -> Vec<Result<SseEvent, Infallible>> {
    vec![Ok(SseEvent::default().data(err.to_json())), Ok(SseEvent::default().data("[DONE]"))]
}

async fn run(state: AppState, mut asm: Box<dyn Assembler>, v: ValidRequest, rxs: Vec<mpsc::Receiver<Event>>) -> Result<Response, ApiError> {
    let mut events = merged(rxs);
    if !v.stream {
        // Dropping this future (client gone) drops the receivers, which cancels the work.
        while let Some((p, e)) = events.next().await {
            if let Event::Error(err) = e {
                return Err(err.into());
            }
            asm.absorb(p, e);
        }
        return Ok(Json(asm.finish().map_err(serialization)?).into_response());
    }
    let include_usage = v.include_usage;
    let metrics = state.metrics.clone();
    // First chunks (chat role, completions echo) go out before any token.
    let opening = sse(asm.opening().map_err(serialization)?);
    let body = stream::unfold(Some((events, asm)), move |st| {
        let metrics = metrics.clone();
        async move {
            let (mut events, mut asm) = st?;
            let fail = |err: ApiError| {
                metrics.request_errors.with_label_values(&[err.status().as_str()]).inc();
                Some((stream::iter(sse_error(&err)), None))
            };
            loop {
                match events.next().await {
                    Some((_, Event::Error(err))) => return fail(err.into()),
                    Some((p, e)) => match asm.chunks(p, e) {
                        Ok(chunks) if chunks.is_empty() => {}
                        Ok(chunks) => return Some((stream::iter(sse(chunks)), Some((events, asm)))),
                        Err(e) => return fail(serialization(e)),
                    },
                    None => {
                        let mut out = Vec::new();
                        if include_usage {
                            match asm.usage_chunk() {
                                Ok(c) => out.extend(sse(vec![c])),
                                Err(e) => return fail(serialization(e)),
                            }
                        }
                        out.push(Ok(SseEvent::default().data("[DONE]")));
                        return Some((stream::iter(out), None));
                    }
                }
            }
        }
    })
    .flatten();
    let all = stream::iter(opening).chain(body);
    Ok(Sse::new(all).keep_alive(KeepAlive::default()).into_response())
}
