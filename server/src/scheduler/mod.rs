//! The engine thread: continuous batching over the state pool.
//!
//! Each step (1) takes new requests and drops cancelled or timed-out ones, (2) admits waiting
//! requests first-come-first-served into free slots ([`admission`]), (3) advances prefills in
//! chunks under a per-step token budget and (4) decodes every running sequence once, in the
//! prefill's pass when there is one ([`batch`]; [`ahead`] for `--decode-ahead`), sampling,
//! detokenizing and checking stop rules per sequence ([`sequence`]), and (5) frees the slots of
//! finished sequences in the same step. HTTP handlers talk to it only through
//! [`SchedulerHandle`] ([`handle`]) and per-request bounded event channels.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use deltaserve_engine::state::{PoolSize, DEFAULT_BLOCK_SIZE};
use deltaserve_engine::{Engine, StatePool};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

mod admission;
mod ahead;
mod batch;
mod caching;
mod error;
mod handle;
mod prefix_cache;
mod request;
mod sequence;

pub use error::SchedulerError;
use handle::{Msg, Shared};
pub use handle::{SchedulerHandle, Ticket};
pub use request::{Event, FinishReason, GenParams, GenRequest, PrefixCacheConfig, SchedulerConfig, StopCause, TokenLogprob, ANSWER_DELAY};
use sequence::{send, Seq};

/// Starts the engine thread. The pool is sized by `cfg.max_num_seqs`.
pub fn spawn(
    engine: Engine,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
) -> std::io::Result<(SchedulerHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel((cfg.max_num_seqs + cfg.max_queue).max(1));
    let shared = Arc::new(Shared { alive: AtomicBool::new(true), ..Shared::default() });
    let handle = SchedulerHandle { tx, shared: shared.clone(), max_num_seqs: cfg.max_num_seqs, max_queue: cfg.max_queue };
    let mut s = Scheduler::new(engine, cfg, metrics, shared.clone())?;
    let thread = std::thread::Builder::new().name("engine".into()).spawn(move || {
        let _ = shared.engine_thread.set(std::thread::current());
        s.run(rx);
        // The engine goes before the thread says it is gone (see `SchedulerHandle::shut_down`).
        drop(s);
        shared.alive.store(false, Ordering::SeqCst);
    })?;
    Ok((handle, thread))
}

/// A request once admitted: its choices share the prompt.
struct Active {
    id: String,
    prompt: Vec<u32>,
    params: GenParams,
    events: mpsc::Sender<Event>,
    arrived: Instant,
    deadline: Instant,
    /// Prompt tokens prefilled so far (into `seqs[0]`'s slot), a cached prefix included.
    prefilled: usize,
    /// Whether a chunk of the prompt has run (after that, no cached prefix is looked up).
    started: bool,
    /// Whether the prompt, past its cached prefix, was longer than the step budget when its
    /// first chunk ran: while sequences decode, it shares `long_prefill_chunk` tokens a step.
    long: bool,
    /// Logits after the last prefilled token, kept for prompt logprobs across chunks.
    prev_logits: Option<Vec<f32>>,
    seqs: Vec<Seq>,
    /// Slots promised to this request's forks but not yet taken.
    reserved: usize,
    /// KV blocks each choice may fill (prompt + `max_tokens`, within `max_model_len`).
    kv_tokens: usize,
    /// KV blocks promised to this request's forks but not yet taken.
    kv_reserved: usize,
    /// Held while the request is alive: it counts against admission until dropped (or given
    /// back just before its last choice's `Finished` event goes out).
    ticket: Option<Ticket>,
    /// The finish reason of the choice that finished last, and whether any choice failed:
    /// `request_success_total` counts the request once, by that reason, when none failed.
    finished_reason: Option<&'static str>,
    failed: bool,
}

impl Active {
    /// Ends the request with an error event; its slots are freed at the next retire.
    fn fail(&mut self, e: SchedulerError) {
        if !self.seqs.iter().all(|s| s.finished) {
            send(&self.events, Event::Error(e));
        }
        for s in &mut self.seqs {
            s.finished = true;
        }
        self.failed = true;
    }
}

struct Scheduler {
    engine: Engine,
    pool: StatePool,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
    waiting: VecDeque<GenRequest>,
    requests: Vec<Active>,
    /// Slots reserved for forks of requests still prefilling.
    reserved: usize,
    /// KV blocks reserved for those forks.
    kv_reserved: usize,
    /// The prefix cache's index (`None` when off).
    cache: Option<prefix_cache::PrefixCache>,
    /// Finished chat turns being re-prefilled for the cache, oldest first.
    tails: Vec<caching::Tail>,
    /// The cache's `changes` when its gauges were last published.
    cache_published: u64,
    /// The decode step launched ahead of this step's emit, if any.
    ahead: Option<ahead::Ahead>,
}

/// A stop message came: the engine thread ends.
struct Stopped;

/// A duration in milliseconds, for the debug trace.
fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Scheduler {
    /// A scheduler over `engine` with its state pool allocated up front, so that running out of
    /// (GPU) memory fails the start-up, and warmed up when `cfg` says so.
    fn new(engine: Engine, cfg: SchedulerConfig, metrics: Arc<Metrics>, shared: Arc<Shared>) -> std::io::Result<Self> {
        let size = PoolSize {
            slots: cfg.max_num_seqs,
            snapshots: cfg.prefix_cache.snapshots,
            kv_blocks: cfg.kv_blocks,
            block_size: DEFAULT_BLOCK_SIZE,
            max_seq_len: cfg.max_model_len,
        };
        let mut pool = engine.new_pool_sized(size).map_err(std::io::Error::other)?;
        if cfg.prefix_cache.snapshots > 0 && cfg.prefix_cache.host_snapshots > 0 {
            pool.add_host_tier(cfg.prefix_cache.host_snapshots).map_err(std::io::Error::other)?;
        }
        if cfg.warmup {
            match engine.warm_up(&mut pool, cfg.prefill_budget, cfg.max_num_seqs, &cfg.stop_warm_up) {
                Ok(w) if w.stopped => tracing::info!(secs = w.secs, "warm-up stopped: shutting down"),
                Ok(w) if w.passes + w.batch_sizes > 0 => {
                    tracing::info!(
                        prefill_passes = w.passes,
                        decode_batch_sizes = w.batch_sizes,
                        prefill_graph_shapes = w.prefill_graphs,
                        mixed_graph_shapes = w.mixed_graphs,
                        secs = w.secs,
                        "warmed up"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "warm-up failed; the first requests pay its one-time costs"),
            }
        }
        metrics.state_slots_total.set(pool.capacity() as i64);
        metrics.state_memory_bytes.set((pool.capacity() * pool.bytes_per_slot()) as i64);
        metrics.kv_blocks_total.set(pool.kv_blocks_total() as i64);
        metrics.kv_memory_bytes.set((pool.kv_blocks_total() * pool.bytes_per_block()) as i64);
        metrics.prefix_cache_snapshots_total.set(pool.snapshots_total() as i64);
        metrics.prefix_cache_host_snapshots_total.set(pool.host_snapshots_total() as i64);
        metrics.prefix_cache_host_memory_bytes.set((pool.host_snapshots_total() * pool.bytes_per_snapshot()) as i64);
        let cache = (pool.snapshots_total() > 0).then(|| prefix_cache::PrefixCache::new(cfg.prefix_cache.grid));
        Ok(Scheduler {
            engine,
            pool,
            cfg,
            metrics,
            shared,
            waiting: VecDeque::new(),
            requests: Vec::new(),
            reserved: 0,
            kv_reserved: 0,
            cache,
            tails: Vec::new(),
            cache_published: 0,
            ahead: None,
        })
    }

    fn run(&mut self, mut rx: mpsc::Receiver<Msg>) {
        loop {
            if self.waiting.is_empty() && self.requests.is_empty() {
                if self.tails.is_empty() {
                    match rx.blocking_recv() {
                        Some(Msg::Request(r)) => self.enqueue(*r),
                        Some(Msg::Stop) | None => return,
                    }
                } else if let Some(wait) = self.until_a_tail_is_ready() {
                    // Only re-prefills not yet due: run no step until a message comes (its
                    // sender unparks this thread) or a re-prefill is due.
                    if rx.is_empty() {
                        std::thread::park_timeout(wait);
                    }
                    if rx.is_empty() && self.until_a_tail_is_ready().is_some() {
                        continue;
                    }
                }
            }
            if self.receive(&mut rx).is_err() {
                return;
            }
            if self.shared.abort.load(Ordering::SeqCst) {
                self.fail_all(SchedulerError::ShutDown);
            }
            // An engine panic must not take the server down: fail what was running.
            let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step(&mut rx)));
            match step {
                Ok(Ok(())) => {}
                Ok(Err(Stopped)) => return,
                Err(_) => {
                    tracing::error!("engine step panicked; failing all running requests");
                    self.fail_all(SchedulerError::Engine("engine step panicked".into()));
                }
            }
            self.publish_gauges();
        }
    }

    /// Queues the requests that arrived; on a stop message, fails everything and says so.
    fn receive(&mut self, rx: &mut mpsc::Receiver<Msg>) -> Result<(), Stopped> {
        while let Ok(m) = rx.try_recv() {
            match m {
                Msg::Request(r) => self.enqueue(*r),
                Msg::Stop => {
                    self.fail_all(SchedulerError::ShutDown);
                    return Err(Stopped);
                }
            }
        }
        Ok(())
    }

    fn enqueue(&mut self, r: GenRequest) {
        tracing::debug!(request = %r.id, prompt = r.prompt.len(), ms = ms(r.arrived.elapsed()), "received");
        self.waiting.push_back(r);
    }

    fn step(&mut self, rx: &mut mpsc::Receiver<Msg>) -> Result<(), Stopped> {
        // A decode step launched ahead is this step's first: every running sequence then has
        // its next token, as the rest of the step expects. When the step after it went ahead
        // too, nothing else could run (nothing waiting, no prompt or re-prefill left), and the
        // running sequences' next step is already on the GPU: the engine step ends there.
        let had_ahead = self.ahead.is_some();
        self.finish_ahead(|| !rx.is_empty());
        if self.ahead.is_some() {
            self.drop_cancelled();
            self.retire_all();
            if self.requests.is_empty() {
                self.ahead = None;
            }
            return Ok(());
        }
        // Requests that came while that step ran (the reason the next one did not go ahead)
        // start now, not after another decode step.
        if had_ahead {
            self.receive(rx)?;
        }
        self.drop_cancelled();
        self.admit();
        let (used, mut decoded, long) = self.prefill(self.cfg.prefill_budget, self.cfg.long_prefill_chunk);
        // Requests that arrived while that pass ran start before the next decode step, within
        // what is left of the step's token budget: chat turns that end together send their
        // next turns together, and all but the first would otherwise wait for a decode step as
        // well as the pass. Running sequences still see at most a budget of prompt tokens
        // between two steps.
        if used > 0 && used < self.cfg.prefill_budget {
            self.receive(rx)?;
            let running = self.requests.len();
            self.admit();
            if self.requests.len() > running {
                decoded |= self.prefill(self.cfg.prefill_budget - used, self.cfg.long_prefill_chunk.saturating_sub(long)).1;
            }
        }
        // A pass that decoded the running sequences was their step.
        if !decoded {
            // Asked once the step's tokens are drawn: requests that came while it ran.
            self.decode(|| !rx.is_empty());
        }
        self.retire_all();
        if self.requests.is_empty() {
            // Every row of a step launched ahead ended: nothing to draw.
            self.ahead = None;
        }
        Ok(())
    }

    fn publish_gauges(&mut self) {
        self.metrics.num_requests_waiting.set(self.waiting.len() as i64);
        self.metrics.num_requests_running.set(self.requests.len() as i64);
        self.metrics.state_slots_used.set(self.pool.used() as i64);
        let (used, total) = (self.pool.kv_blocks_used(), self.pool.kv_blocks_total());
        self.metrics.kv_blocks_used.set(used as i64);
        self.metrics.kv_cache_usage_perc.set(if total == 0 { 0.0 } else { used as f64 / total as f64 });
        self.publish_cache();
    }

    fn fail_all(&mut self, e: SchedulerError) {
        self.ahead = None;
        for r in self.waiting.drain(..) {
            send(&r.events, Event::Error(e.clone()));
        }
        for r in &mut self.requests {
            r.fail(e.clone());
        }
        self.retire_all();
        for t in std::mem::take(&mut self.tails) {
            let _ = self.pool.release(t.slot);
        }
    }

    /// Frees finished sequences' slots and drops finished requests, in the same step.
    fn retire_all(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.requests.len() {
            let r = &mut self.requests[i];
            let (finished, running): (Vec<_>, Vec<_>) = std::mem::take(&mut r.seqs).into_iter().partition(|s| s.finished);
            r.seqs = running;
            let keep_answer = r.params.cache_output && r.params.n == 1;
            let prompt = if keep_answer { r.prompt.clone() } else { Vec::new() };
            for s in finished {
                match s.finish_reason {
                    Some(reason) => self.requests[i].finished_reason = Some(reason),
                    None => self.requests[i].failed = true,
                }
                let tail = keep_answer && s.finish_reason.is_some() && {
                    let tokens = [prompt.as_slice(), &s.ids].concat();
                    self.start_tail(s.slot, tokens, s.ids.len())
                };
                if !tail {
                    // Cannot fail: every seq owns an allocated slot until it is retired here.
                    let _ = self.pool.release(s.slot);
                }
            }
            let r = &mut self.requests[i];
            // Forks are only made from a live first sequence, so no sequences left means done.
            if r.seqs.is_empty() {
                self.reserved -= r.reserved;
                self.kv_reserved -= r.kv_reserved;
                self.metrics.e2e_latency.observe(now.duration_since(r.arrived).as_secs_f64());
                if let (false, Some(reason)) = (r.failed, r.finished_reason) {
                    self.metrics.request_success.with_label_values(&[reason]).inc();
                }
                self.requests.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
