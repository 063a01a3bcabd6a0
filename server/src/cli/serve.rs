//! `deltaserve serve`: bind, load the model in the background, serve, and drain on SIGTERM.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::Args;

use crate::cli::ModelArgs;
use deltaserve::api::chat::output::ToolSyntax;
use deltaserve::api::chat::ChatTemplate;
use deltaserve::api::validate::Limits;
use deltaserve::metrics::Metrics;
use deltaserve::routes::{app, unix_now, AppState, Serving};
use deltaserve::scheduler::{self, PrefixCacheConfig, SchedulerConfig};
use deltaserve_engine::state::DEFAULT_BLOCK_SIZE;
use deltaserve_engine::PREFILL_CHUNK;
use shutdown::{drain, exit_now, ShutdownSignals, START_UP_STOP_WAIT};

mod shutdown;

/// Serve the OpenAI-compatible HTTP API.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Address to listen on.
    #[arg(long, env = "DELTASERVE_HOST", default_value = "0.0.0.0")]
    host: String,
    /// Port to listen on (0 picks a free one; the bound address is logged).
    #[arg(long, env = "DELTASERVE_PORT", default_value_t = 8000)]
    port: u16,
    /// Name clients use in `model` (default: the checkpoint directory's name).
    #[arg(long, env = "DELTASERVE_SERVED_MODEL_NAME", value_parser = non_empty)]
    served_model_name: Option<String>,
    /// Sequences decoded together: slots in the state pool (clamped to what fits in memory).
    #[arg(long, env = "DELTASERVE_MAX_NUM_SEQS", default_value_t = 64)]
    max_num_seqs: usize,
    /// Requests allowed to wait when every slot is taken; further ones get 429 (0: no waiting
    /// line, requests run while a slot is free).
    #[arg(long, env = "DELTASERVE_MAX_QUEUE", default_value_t = 256)]
    max_queue: usize,
    /// Prompt + generated tokens per sequence.
    #[arg(long, env = "DELTASERVE_MAX_MODEL_LEN", default_value_t = 32768)]
    max_model_len: usize,
    /// Prompt tokens prefilled per engine step, shared by all prefilling requests [default:
    /// 1024 on a GPU, 512 on the CPU]. Larger favours throughput and TTFT under load, smaller
    /// the streams' ITL (docs/serving.md). At least 64: prompts are cut at multiples of 64
    /// tokens, so a prompt's logits do not depend on what shares the budget.
    #[arg(long, env = "DELTASERVE_MAX_NUM_BATCHED_TOKENS")]
    max_num_batched_tokens: Option<usize>,
    /// While more streams decode than there are prompts longer than one step's budget, those
    /// prompts advance by at most this many tokens a step, all of them together [default: 128 on
    /// a GPU, half the step budget on the CPU]; shorter prompts still take the rest of the
    /// budget. Smaller keeps the streams' inter-token latency nearer their bare step's and makes
    /// long prompts wait longer (docs/serving.md). 0 turns the cap off.
    #[arg(long, env = "DELTASERVE_LONG_PREFILL_CHUNK")]
    long_prefill_chunk: Option<usize>,
    /// Require `Authorization: Bearer KEY` on /v1 and tokenize routes.
    #[arg(long, env = "DELTASERVE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Seconds to let in-flight requests finish after SIGTERM.
    #[arg(long, env = "DELTASERVE_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    shutdown_timeout: u64,
    /// Seconds a request may run in total.
    #[arg(long, env = "DELTASERVE_REQUEST_TIMEOUT", default_value_t = 600)]
    request_timeout: u64,
    /// Seconds a client may take to send a request's headers before its connection is closed
    /// (slow clients hold a connection each).
    #[arg(long, env = "DELTASERVE_HEADER_READ_TIMEOUT", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout: u64,
    /// Seconds a client may take to send a request's body (408 after).
    #[arg(long, env = "DELTASERVE_BODY_READ_TIMEOUT", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    body_read_timeout: u64,
    /// Largest accepted request body in bytes.
    #[arg(long, env = "DELTASERVE_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Fraction of available memory the state pool and the KV cache (hybrid models) may take.
    #[arg(long, env = "DELTASERVE_STATE_MEMORY_FRACTION", default_value_t = 0.5)]
    state_memory_fraction: f64,
    /// Memory for prefix-cache snapshots (recurrent states of cached prefixes): bytes (`512MiB`,
    /// `4GB`, `1000000`) or a fraction of the memory free at start (`0.1`). The default, 0.1, is
    /// capped at 256 MiB on the CPU.
    #[arg(long, env = "DELTASERVE_PREFIX_CACHE_MEMORY", default_value = "0.1", value_parser = parse_memory)]
    prefix_cache_memory: Memory,
    /// Host memory that snapshots evicted from the prefix cache move to instead of being
    /// dropped (page-locked on a GPU; recurrent models only, not hybrids): bytes (`8GiB`);
    /// 0, the default, keeps no host tier.
    #[arg(long, env = "DELTASERVE_PREFIX_CACHE_HOST_MEMORY", default_value = "0", value_parser = parse_bytes)]
    prefix_cache_host_memory: usize,
    /// Memory for the token ids of long prompts' segments, so that a chat turn re-sending its
    /// conversation tokenizes only what is new: bytes (`32MiB`, `0` turns it off).
    #[arg(long, env = "DELTASERVE_TOKENIZER_CACHE_MEMORY", default_value = "32MiB", value_parser = parse_bytes)]
    tokenizer_cache_memory: usize,
    /// Prompt tokens between prefix-cache snapshots: a multiple of 64 (the prefill's chunk).
    #[arg(long, env = "DELTASERVE_PREFIX_CACHE_GRID", default_value_t = PREFILL_CHUNK)]
    prefix_cache_grid: usize,
    /// Turn the prefix cache off.
    #[arg(long, env = "DELTASERVE_NO_PREFIX_CACHE")]
    no_prefix_cache: bool,
    /// Run prompt chunks and decode steps as separate passes. By default a pass that prefills
    /// also decodes the running sequences (weights read once for both; a running stream waits
    /// one pass between two tokens while prompts arrive, not a prefill pass and a decode step).
    #[arg(long, env = "DELTASERVE_NO_MIXED_BATCHES")]
    no_mixed_batches: bool,
    /// Wait for each decode step's tokens to be sent before launching the next. By default, on a
    /// GPU, the next decode step is launched as soon as a step's tokens are drawn when nothing
    /// else could run first (no request waiting or on its way in, no prompt or cache re-prefill
    /// left), and the tokens are detokenized and sent while it runs (H200, 1.39B, 64 streams:
    /// 6–7% more output tokens/s, the same TTFT).
    #[arg(long, env = "DELTASERVE_NO_DECODE_AHEAD")]
    no_decode_ahead: bool,
    /// Skip the GPU warm-up before /ready (a prefill pass per GEMM row bucket up to
    /// `--max-num-batched-tokens`, and every decode batch size's CUDA graph): a faster start,
    /// but the first requests pay those one-time costs (3–20 ms a new bucket).
    #[arg(long, env = "DELTASERVE_NO_WARMUP")]
    no_warmup: bool,
    /// A Jinja chat template file used instead of the checkpoint's `chat_template`.
    #[arg(long, env = "DELTASERVE_CHAT_TEMPLATE")]
    chat_template: Option<std::path::PathBuf>,
    /// How tool calls are read from the output (`auto`: the syntax the chat template teaches).
    #[arg(long, env = "DELTASERVE_TOOL_CALL_PARSER", value_enum, default_value_t = ToolCallParser::Auto)]
    tool_call_parser: ToolCallParser,
    /// Whether `<think>` blocks become `reasoning_content` (`auto`: when the chat template
    /// has them).
    #[arg(long, env = "DELTASERVE_REASONING_PARSER", value_enum, default_value_t = ReasoningParser::Auto)]
    reasoning_parser: ReasoningParser,
}

/// `--tool-call-parser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolCallParser {
    /// The syntax the chat template teaches (`<function=` → qwen3_xml, `<tool_call>` → hermes).
    Auto,
    /// JSON objects inside `<tool_call>` tags (Qwen3, Hermes).
    Hermes,
    /// `<tool_call><function=NAME><parameter=P>…` (Qwen3.5, Qwen3-Coder).
    Qwen3Xml,
    /// No tool calls: requests with tools are refused.
    None,
}

/// `--reasoning-parser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParser {
    /// When the chat template has `<think>` blocks.
    Auto,
    /// Always split out `<think>…</think>`.
    Qwen3,
    /// Never: reasoning stays in `content`.
    None,
}

/// An amount of memory: bytes, or a fraction of what is free.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Memory {
    /// Bytes.
    Bytes(usize),
    /// A fraction in (0, 1] of the memory free at start.
    Fraction(f64),
}

/// Parses `512MiB`, `4GB`, `1000000` (bytes) or `0.1` (a fraction).
fn parse_memory(s: &str) -> Result<Memory, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim().to_ascii_lowercase());
    let scale: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return Err(format!("expected bytes (e.g. 512MiB, 4GB) or a fraction in (0, 1], got `{s}`")),
    };
    if unit.is_empty() && num.contains('.') {
        let f: f64 = num.parse().map_err(|_| format!("expected a fraction in (0, 1], got `{s}`"))?;
        return if f > 0.0 && f <= 1.0 { Ok(Memory::Fraction(f)) } else { Err(format!("expected a fraction in (0, 1], got `{s}`")) };
    }
    let n: f64 = num.parse().map_err(|_| format!("expected bytes (e.g. 512MiB, 4GB) or a fraction in (0, 1], got `{s}`"))?;
    if n < 0.0 {
        return Err(format!("expected a non-negative size, got `{s}`"));
    }
    Ok(Memory::Bytes((n * scale as f64) as usize))
}

/// A size in bytes, as [`parse_memory`] reads it, but not a fraction.
fn parse_bytes(s: &str) -> Result<usize, String> {
    match parse_memory(s)? {
        Memory::Bytes(b) => Ok(b),
        Memory::Fraction(_) => Err(format!("expected bytes (e.g. 32MiB), got the fraction `{s}`")),
    }
}

/// The CPU's default prefix-cache size: 0.1 of free memory, at most this.
const CPU_DEFAULT_CACHE_CAP: usize = 256 << 20;

/// Runs the server until SIGTERM / ctrl-c and the drain finish.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.max_num_seqs >= 1, "invalid `--max-num-seqs`: expected >= 1, got 0");
    let budget = step_budget(&args);
    anyhow::ensure!(
        budget >= PREFILL_CHUNK,
        "invalid `--max-num-batched-tokens`: expected >= {PREFILL_CHUNK} (the prefill's chunk length), got {budget}"
    );
    if let Some(chunk) = args.long_prefill_chunk.filter(|&c| c != 0 && c < PREFILL_CHUNK) {
        anyhow::bail!("invalid `--long-prefill-chunk`: expected 0 (off) or >= {PREFILL_CHUNK} (the prefill's chunk length), got {chunk}");
    }
    anyhow::ensure!(args.max_model_len >= 2, "invalid `--max-model-len`: expected >= 2, got {}", args.max_model_len);
    anyhow::ensure!(
        args.prefix_cache_grid >= PREFILL_CHUNK && args.prefix_cache_grid.is_multiple_of(PREFILL_CHUNK),
        "invalid `--prefix-cache-grid`: expected a positive multiple of {PREFILL_CHUNK} (the prefill's chunk), got {}",
        args.prefix_cache_grid
    );
    anyhow::ensure!(
        args.state_memory_fraction > 0.0 && args.state_memory_fraction <= 1.0,
        "invalid `--state-memory-fraction`: expected in (0, 1], got {}",
        args.state_memory_fraction
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(serve(args))
}

/// Refuses an empty value (a model name clients could not send).
fn non_empty(v: &str) -> Result<String, String> {
    if v.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(v.to_owned())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let model_spec = args.model.model.clone().unwrap_or_else(crate::cli::default_model);
    let model_name: Arc<str> = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| {
            std::path::Path::new(&model_spec).file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| model_spec.clone())
        })
        .into();
    let metrics = Arc::new(Metrics::new(&model_name)?);
    let state = AppState {
        serving: Arc::new(OnceLock::new()),
        metrics: metrics.clone(),
        api_key: args.api_key.as_deref().map(Arc::from),
        draining: Arc::new(AtomicBool::new(false)),
        model_name: model_name.clone(),
        body_limit: args.max_body_bytes,
        body_timeout: Duration::from_secs(args.body_read_timeout),
        created: unix_now(),
        next_id: Arc::new(AtomicU64::new(0)),
    };
    // Host names (`localhost`) resolve; the first address is bound.
    let addr: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot resolve `--host` {}: {e}", args.host))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("`--host` {} resolves to no address", args.host))?;
    // Before anything says the server is starting: a stop signal from then on is a shutdown.
    let signals = ShutdownSignals::install();
    // Bind before loading so /health answers and /ready says "loading" meanwhile.
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    tracing::info!(address = %listener.local_addr()?, model = %model_spec, "listening; loading model");

    // Set when a shutdown comes while loading: the load ends at its next check (the warm-up's
    // next pass) rather than finishing first.
    let starting_stop = Arc::new(AtomicBool::new(false));
    let mut loader = {
        let (args, state, metrics, stop) = (args.clone(), state.clone(), metrics.clone(), starting_stop.clone());
        let mixed_graph_tokens = Some(mixed_graph_tokens(&args));
        let model_args = ModelArgs { model: Some(model_spec.clone()), mixed_graph_tokens, ..args.model.clone() };
        tokio::task::spawn_blocking(move || load(args, model_args, state, metrics, stop))
    };

    let shutdown_state = state.clone();
    let shutdown_timeout = Duration::from_secs(args.shutdown_timeout);
    let stop = async move {
        signals.recv().await;
        drain(&shutdown_state, shutdown_timeout).await;
    };
    // After the drain, connections get a moment to close, then the process exits regardless.
    let header_timeout = Duration::from_secs(args.header_read_timeout);
    let mut server = tokio::spawn(deltaserve::listen::serve(listener, app(state.clone()), header_timeout, stop, Duration::from_secs(5)));

    // A failed load ends the process with the error. A shutdown while loading (the listener
    // stops at once: nothing is in flight) tells the load to stop, then waits for it.
    let loaded = tokio::select! {
        loaded = &mut loader => loaded,
        served = &mut server => {
            starting_stop.store(true, Ordering::SeqCst);
            tracing::info!("shutdown during start-up; stopping the load");
            let Ok(loaded) = tokio::time::timeout(START_UP_STOP_WAIT, &mut loader).await else {
                tracing::info!(
                    waited_s = START_UP_STOP_WAIT.as_secs(),
                    "the load is still reading weights or compiling a kernel; exiting without it"
                );
                // 1 where the listener's task panicked rather than stopped.
                exit_now(if served.is_ok() { 0 } else { 1 });
            };
            served?;
            server = tokio::spawn(async {});
            loaded
        }
    };
    match loaded {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(e) => anyhow::bail!("model loading panicked: {e}"),
    }
    let served = server.await;
    // The engine is dropped here, not raced by the process's exit (its GPU memory and NCCL
    // communicators are released while CUDA is still up), also when the serving task panicked.
    if let Some(s) = state.serving.get() {
        if !s.scheduler.shut_down(Duration::from_secs(30)).await {
            tracing::warn!("the engine thread did not stop within 30 s");
        }
    }
    served?;
    tracing::info!("shut down");
    Ok(())
}

/// Most prompt tokens of a mixed pass that `serve` captures as CUDA graphs unless told: its
/// step budget up to here (measured on an H200: at a budget of 1024, graphs of 1024 tokens gave
/// 64 streams 0.8–3.1% more tokens/s than eager passes); each captured shape keeps buffers sized
/// to its rows, so larger budgets replay the passes that fit and run the rest eagerly.
const AUTO_MIXED_GRAPH_TOKENS_MAX: usize = 1024;

/// `--mixed-graph-tokens`, or by default the step budget up to [`AUTO_MIXED_GRAPH_TOKENS_MAX`]:
/// the passes the budget makes replay as graphs.
fn mixed_graph_tokens(args: &ServeArgs) -> usize {
    args.model.mixed_graph_tokens.unwrap_or(step_budget(args).min(AUTO_MIXED_GRAPH_TOKENS_MAX))
}

/// The step budget on a GPU unless `--max-num-batched-tokens` says otherwise. Measured on an
/// H200 with 64 streams of 512-token prompts: 81–82% of the bare decode step's throughput at
/// 1024 against 78% at 512; long prompts are kept from the streams' latency by
/// `--long-prefill-chunk` instead (docs/serving.md).
const GPU_STEP_BUDGET: usize = 1024;
/// The step budget on the CPU, whose passes are slower: a step of 1024 prompt tokens would hold
/// running streams twice as long.
const CPU_STEP_BUDGET: usize = 512;

/// `--max-num-batched-tokens`, or the device's default.
fn step_budget(args: &ServeArgs) -> usize {
    let gpu = args.model.device.starts_with("cuda");
    args.max_num_batched_tokens.unwrap_or(if gpu { GPU_STEP_BUDGET } else { CPU_STEP_BUDGET })
}

/// The long prompts' tokens a step on a GPU unless `--long-prefill-chunk` says otherwise. On an
/// H200 with 32 streams of the 1.39B under 4,096-token prompts at 2 a second, 128 (about half the
/// streams' step) kept their ITL p99 at 1.7–1.9× the bare step in eight runs (2.1× once, on a
/// noisier host), 256 at 2.0×, 512 at 2.6–2.9×, while those prompts' TTFT p99 was 147–176 ms
/// against 60–82 at 512
/// (`benches/results/h200-long_prefill_chunk-2026-11-29/`, `h200-split_parts-2026-11-30/`).
const GPU_LONG_PREFILL_CHUNK: usize = 128;

/// The long prompts' tokens a step while streams outnumber them: `--long-prefill-chunk` (0: the
/// whole budget), else [`GPU_LONG_PREFILL_CHUNK`] on a GPU and half the budget in whole chunks on
/// the CPU; never past the budget.
fn long_prefill_chunk(args: &ServeArgs) -> usize {
    let budget = step_budget(args);
    let gpu = args.model.device.starts_with("cuda");
    match args.long_prefill_chunk {
        Some(0) => budget,
        Some(chunk) => chunk.min(budget),
        None if gpu => GPU_LONG_PREFILL_CHUNK.min(budget),
        None => (budget / 2 / PREFILL_CHUNK * PREFILL_CHUNK).max(PREFILL_CHUNK),
    }
}

fn load(args: ServeArgs, model_args: ModelArgs, state: AppState, metrics: Arc<Metrics>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let engine = model_args.load()?;
    if stop.load(Ordering::SeqCst) {
        return Ok(());
    }
    let cfg = engine.config().clone();
    // Per rank: each tensor parallel rank holds its slice of every slot and block on its own
    // device, and the fullest device bounds them all.
    let specs = engine.model().cache_specs();
    let per_slot = specs.iter().map(|s| s.bytes_per_sequence()).sum::<usize>().max(1);
    let per_block = specs.iter().map(|s| s.bytes_per_token()).sum::<usize>() * DEFAULT_BLOCK_SIZE;
    let free = engine.free_memory();
    let budget = free.map(|avail| (avail as f64 * args.state_memory_fraction) as usize);
    let mut slots = args.max_num_seqs;
    if let Some(budget) = budget {
        let fit = (budget / per_slot).max(1);
        if slots > fit {
            tracing::warn!(requested = slots, fits = fit, bytes_per_slot = per_slot, "--max-num-seqs does not fit in memory; clamped");
            slots = fit;
        }
    }
    // Attention layers: KV blocks for every slot's `max_model_len` tokens, or what the rest
    // of the budget holds; `max_model_len` shrinks to what one sequence can get.
    let mut max_model_len = args.max_model_len;
    let mut kv_blocks = 0;
    if per_block > 0 {
        let per_seq = max_model_len.div_ceil(DEFAULT_BLOCK_SIZE);
        kv_blocks = slots * per_seq;
        if let Some(budget) = budget {
            let fit = budget.saturating_sub(slots * per_slot).checked_div(per_block).unwrap_or(0);
            if kv_blocks > fit {
                tracing::warn!(
                    wanted = kv_blocks,
                    fits = fit,
                    bytes_per_block = per_block,
                    "KV blocks for --max-num-seqs × --max-model-len do not fit in memory; clamped"
                );
                kv_blocks = fit;
            }
        }
        if kv_blocks < per_seq {
            max_model_len = kv_blocks * DEFAULT_BLOCK_SIZE;
            tracing::warn!(requested = args.max_model_len, fits = max_model_len, "--max-model-len does not fit in the KV cache; clamped");
            anyhow::ensure!(max_model_len >= 2, "the KV cache holds {max_model_len} tokens; raise --state-memory-fraction or free memory");
        }
        tracing::info!(
            kv_blocks,
            block_size = DEFAULT_BLOCK_SIZE,
            bytes_per_block = per_block,
            tokens = kv_blocks * DEFAULT_BLOCK_SIZE,
            "paged KV cache"
        );
    }
    let tokenizer = engine.tokenizer_arc();
    tokenizer.set_segment_cache_bytes(args.tokenizer_cache_memory);
    let template =
        chat_template(&args, tokenizer.chat_template.as_deref(), tokenizer.bos_token.as_deref(), tokenizer.eos_token.as_deref())?;
    let limits = Limits {
        served_model_name: state.model_name.to_string(),
        max_model_len,
        max_n: slots.min(64),
        vocab_size: cfg.common.vocab_size,
        kv_capacity: (per_block > 0).then_some((kv_blocks, DEFAULT_BLOCK_SIZE)),
    };
    let snapshots = if args.no_prefix_cache {
        0
    } else {
        let bytes = match args.prefix_cache_memory {
            Memory::Bytes(b) => b,
            Memory::Fraction(f) => {
                let b = (free.unwrap_or(0) as f64 * f) as usize;
                if engine.model().device().is_cpu() && args.prefix_cache_memory == Memory::Fraction(0.1) {
                    b.min(CPU_DEFAULT_CACHE_CAP)
                } else {
                    b
                }
            }
        };
        bytes / per_slot
    };
    let host_snapshots = if snapshots > 0 { args.prefix_cache_host_memory / per_slot } else { 0 };
    tracing::info!(snapshots, grid = args.prefix_cache_grid, bytes = snapshots * per_slot, host_snapshots, "prefix cache");
    let sched_cfg = SchedulerConfig {
        max_num_seqs: slots,
        kv_blocks,
        max_queue: args.max_queue,
        max_model_len,
        prefix_cache: PrefixCacheConfig { snapshots, grid: args.prefix_cache_grid, host_snapshots, answer_delay: scheduler::ANSWER_DELAY },
        prefill_budget: step_budget(&args),
        long_prefill_chunk: long_prefill_chunk(&args),
        mixed_batches: !args.no_mixed_batches,
        // On the CPU the step launched ahead would run before the tokens go out: no overlap.
        decode_ahead: !args.no_decode_ahead && engine.model().device().is_cuda(),
        request_timeout: Duration::from_secs(args.request_timeout),
        warmup: !args.no_warmup,
        stop_warm_up: stop.clone(),
    };
    let grammars = match deltaserve::structured::Grammars::new(&tokenizer, cfg.common.vocab_size) {
        Ok(g) => Some(Arc::new(g)),
        Err(e) => {
            tracing::warn!(error = %e, "structured outputs off");
            None
        }
    };
    let (scheduler, _thread) = scheduler::spawn(engine, sched_cfg, metrics)?;
    // Set even when stopping: the shutdown path stops the engine thread through it.
    let _ = state.serving.set(Serving { scheduler, tokenizer, template, limits, grammars });
    if !stop.load(Ordering::SeqCst) {
        tracing::info!(slots, bytes_per_slot = per_slot, model_type = cfg.model_type(), "ready");
    }
    Ok(())
}

/// The chat template (`--chat-template` or the checkpoint's) with the tool-call and reasoning
/// parsers the flags choose. A checkpoint template that does not compile makes chat answer
/// with its error; a `--chat-template` file that does not compile stops the server.
fn chat_template(args: &ServeArgs, own: Option<&str>, bos: Option<&str>, eos: Option<&str>) -> anyhow::Result<Option<Arc<ChatTemplate>>> {
    let file = match &args.chat_template {
        Some(p) => Some(anyhow::Context::with_context(std::fs::read_to_string(p), || format!("--chat-template {}", p.display()))?),
        None => None,
    };
    let mut template = match (file.as_deref(), own) {
        (Some(t), _) => ChatTemplate::new(t, bos, eos).map_err(|e| anyhow::anyhow!("--chat-template: {e}"))?,
        (None, Some(t)) => ChatTemplate::new(t, bos, eos).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "chat template unusable; /v1/chat/completions will answer with this error");
            ChatTemplate::unusable(e)
        }),
        (None, None) => return Ok(None),
    };
    template.tool_syntax = match args.tool_call_parser {
        ToolCallParser::Auto => template.tool_syntax,
        ToolCallParser::Hermes => Some(ToolSyntax::Json),
        ToolCallParser::Qwen3Xml => Some(ToolSyntax::Xml),
        ToolCallParser::None => None,
    };
    template.thinks = match args.reasoning_parser {
        ReasoningParser::Auto => template.thinks,
        ReasoningParser::Qwen3 => true,
        ReasoningParser::None => false,
    };
    tracing::info!(tool_call_parser = template.tool_syntax.map_or("none", ToolSyntax::name), reasoning = template.thinks, "chat template");
    Ok(Some(Arc::new(template)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `deltaserve serve ARGS` as clap parses it.
    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parsed(flags: &[&str]) -> ServeArgs {
        Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()))
            .map(|s| s.args)
            .unwrap_or_else(|e| panic!("{flags:?}: {e}"))
    }

    #[test]
    fn the_step_budget_defaults_to_the_device_s() {
        assert_eq!(step_budget(&parsed(&[])), 512, "the CPU's");
        assert_eq!(step_budget(&parsed(&["--device", "cuda"])), 1024, "a GPU's");
        assert_eq!(step_budget(&parsed(&["--device", "cuda:1"])), 1024, "a GPU's");
        assert_eq!(step_budget(&parsed(&["--device", "cuda", "--max-num-batched-tokens", "256"])), 256, "given");
        assert_eq!(long_prefill_chunk(&parsed(&[])), 256, "half the CPU's budget");
        assert_eq!(long_prefill_chunk(&parsed(&["--device", "cuda"])), 128, "a GPU's");
        assert_eq!(long_prefill_chunk(&parsed(&["--device", "cuda", "--max-num-batched-tokens", "64"])), 64, "at most the budget");
        assert_eq!(long_prefill_chunk(&parsed(&["--max-num-batched-tokens", "2048"])), 1024, "half of what is given");
        assert_eq!(long_prefill_chunk(&parsed(&["--max-num-batched-tokens", "100"])), 64, "whole chunks, at least one");
        assert_eq!(long_prefill_chunk(&parsed(&["--long-prefill-chunk", "128"])), 128, "given");
        assert_eq!(long_prefill_chunk(&parsed(&["--long-prefill-chunk", "0"])), 512, "off: the whole budget");
        assert_eq!(long_prefill_chunk(&parsed(&["--long-prefill-chunk", "4096"])), 512, "at most the budget");
    }

    #[test]
    fn mixed_graphs_follow_the_step_budget_up_to_1024_unless_given() {
        assert_eq!(mixed_graph_tokens(&parsed(&[])), 512, "the CPU's default budget");
        assert_eq!(mixed_graph_tokens(&parsed(&["--device", "cuda"])), 1024, "a GPU's default budget");
        assert_eq!(mixed_graph_tokens(&parsed(&["--max-num-batched-tokens", "1024"])), 1024);
        assert_eq!(mixed_graph_tokens(&parsed(&["--max-num-batched-tokens", "256"])), 256);
        assert_eq!(mixed_graph_tokens(&parsed(&["--max-num-batched-tokens", "4096"])), 1024, "capped");
        let given = parsed(&["--max-num-batched-tokens", "1024", "--mixed-graph-tokens", "0"]);
        assert_eq!(mixed_graph_tokens(&given), 0, "an explicit value (0: off) wins");
    }
}
