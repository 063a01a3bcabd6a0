//! What flows between the HTTP layer and the engine thread: limits, a request's generation
//! parameters, and the events streamed back for it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deltaserve_engine::SamplingParams;
use tokio::sync::mpsc;

use super::SchedulerError;

/// Scheduler limits (`deltaserve serve` flags).
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Slots in the state pool (after clamping to memory).
    pub max_num_seqs: usize,
    /// KV blocks of [`deltaserve_engine::state::DEFAULT_BLOCK_SIZE`] tokens beside the pool
    /// (0 for models without attention layers).
    pub kv_blocks: usize,
    /// Requests allowed to wait for a slot; more get 429.
    pub max_queue: usize,
    /// Prompt + generated tokens allowed per sequence.
    pub max_model_len: usize,
    /// The prefix cache: snapshot slots in the pool and the grid they are taken on.
    pub prefix_cache: PrefixCacheConfig,
    /// Prompt tokens prefilled per step across all sequences.
    pub prefill_budget: usize,
    /// While sequences decode, the prompt tokens a step gives prompts longer than
    /// `prefill_budget` (all of them together; equal to the budget: no cap). A long prompt's
    /// passes then hold the running streams about as long as their own steps.
    pub long_prefill_chunk: usize,
    /// A pass that prefills also decodes the running sequences (`--no-mixed-batches` turns it
    /// off): the weights are read once for both, and a running stream waits one pass between
    /// two tokens while prompts arrive, not a prefill pass and a decode step.
    pub mixed_batches: bool,
    /// Launch the next decode step before this one's tokens are emitted, when nothing else
    /// could run first (GPUs, unless `--no-decode-ahead`: the emit then overlaps the GPU's step).
    pub decode_ahead: bool,
    /// Wall-clock limit per request.
    pub request_timeout: Duration,
    /// On a GPU, warm up before serving ([`deltaserve_engine::Engine::warm_up`]).
    pub warmup: bool,
    /// Set by a shutdown during start-up: the warm-up ends before its next pass.
    pub stop_warm_up: Arc<AtomicBool>,
}

/// The prefix cache's size (`--prefix-cache-memory`, `--prefix-cache-grid`); 0 snapshots turns
/// it off.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefixCacheConfig {
    /// Snapshot slots in the pool.
    pub snapshots: usize,
    /// Tokens between snapshots, a multiple of the prefill chunk.
    pub grid: usize,
    /// Host-memory snapshot slots that evicted snapshots move to (0: none).
    pub host_snapshots: usize,
    /// How long a finished chat turn waits before its answer is re-prefilled for the cache
    /// (`deltaserve serve`: [`ANSWER_DELAY`]). A follow-up that re-sends the turn within it,
    /// as an agent's does, gives the re-prefill up and prefills the answer in its own pass,
    /// instead of waiting for a pass of its own first.
    pub answer_delay: Duration,
}

/// [`PrefixCacheConfig::answer_delay`] of `deltaserve serve`: long enough for a client on the
/// same host to send its next turn, short beside a person's.
pub const ANSWER_DELAY: Duration = Duration::from_millis(25);

/// What a request asks the scheduler for, already validated.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Choices sharing the prompt's prefill.
    pub n: usize,
    /// Tokens to generate at most per choice.
    pub max_tokens: usize,
    /// Sampling; choice `i` uses `seed + i` when a seed is given.
    pub sampling: SamplingParams,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// Token ids that end a choice, besides EOS.
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at EOS.
    pub ignore_eos: bool,
    /// Top-N logprobs per generated token (`Some(0)`: only the chosen token's).
    pub logprobs: Option<usize>,
    /// Also return logprobs of the prompt tokens (completions `echo` + `logprobs`).
    pub prompt_logprobs: bool,
    /// Snapshot the prompt and the answer for the prefix cache when the request ends (a chat
    /// turn, whose next turn re-sends both).
    pub cache_output: bool,
    /// The grammar every choice's output follows (structured outputs), in its start state.
    pub constraint: Option<crate::structured::Constraint>,
}

impl GenParams {
    /// One choice of at most `max_tokens` tokens: default sampling, no stops but EOS, no
    /// logprobs, nothing cached for the next turn, no grammar.
    pub fn new(max_tokens: usize) -> Self {
        Self {
            n: 1,
            max_tokens,
            sampling: SamplingParams::default(),
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: false,
            cache_output: false,
            constraint: None,
        }
    }
}

/// The log-probability of one token and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// log p(token).
    pub logprob: f32,
    /// Top alternatives, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Why a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop(Option<StopCause>),
    /// `max_tokens` or `max_model_len`.
    Length,
}

/// What stopped a choice.
#[derive(Debug, Clone, PartialEq)]
pub enum StopCause {
    /// A stop string.
    Text(String),
    /// A stop token id (EOS ids are reported as no cause).
    Token(u32),
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Stop(_) => "stop",
            Self::Length => "length",
        }
    }
}

/// Events a request receives, in order per choice.
#[derive(Debug, Clone)]
pub enum Event {
    /// Logprobs of prompt tokens 1.. (token 0 has none).
    PromptLogprobs(Vec<TokenLogprob>),
    /// A generated token of `choice` and the text it completes (may be empty).
    Token {
        /// Choice index within the request.
        choice: usize,
        /// Newly released text.
        text: String,
        /// Logprobs when asked for.
        logprob: Option<TokenLogprob>,
    },
    /// Trailing text released at the end (held-back partial characters or stop prefixes).
    Text {
        /// Choice.
        choice: usize,
        /// Text.
        text: String,
    },
    /// `choice` ended after `tokens` generated tokens.
    Finished {
        /// Choice.
        choice: usize,
        /// Why.
        reason: FinishReason,
        /// Generated tokens.
        tokens: usize,
    },
    /// The request failed; no more events follow.
    Error(SchedulerError),
}

/// A validated request on its way to the engine thread.
#[derive(Debug)]
pub struct GenRequest {
    /// Request id (for logs).
    pub id: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation parameters.
    pub params: GenParams,
    /// Where events go; a closed receiver cancels the request.
    pub events: mpsc::Sender<Event>,
    /// When the HTTP layer accepted it.
    pub arrived: Instant,
    /// Its place in the admission count (set by `submit`), held until the request is dropped.
    pub(crate) ticket: Option<super::Ticket>,
}

impl GenRequest {
    /// A request and the receiver of its events. The channel is bounded by the most events the
    /// request can produce (a token event per generated token, a text and a finish event per
    /// choice, prompt logprobs at most once per prompt token, one error), so the engine thread
    /// never waits on a slow client and never drops an event.
    pub fn new(id: String, prompt: Vec<u32>, params: GenParams) -> (Self, mpsc::Receiver<Event>) {
        let cap = params.n.saturating_mul(params.max_tokens.saturating_add(2)).saturating_add(prompt.len()).saturating_add(2);
        let (events, rx) = mpsc::channel(cap.clamp(1, MAX_EVENTS));
        (Self { id, prompt, params, events, arrived: Instant::now(), ticket: None }, rx)
    }
}

/// tokio's limit on a bounded channel's capacity.
const MAX_EVENTS: usize = usize::MAX >> 4;
