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
            match engine.warm_up(&mut pool, cfg.prefill_budget, cfg.max_num_seqs) {
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
mod tests {
    use super::*;

    fn params() -> GenParams {
        GenParams {
            n: 1,
            max_tokens: 4,
            sampling: Default::default(),
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: false,
            cache_output: false,
            constraint: None,
        }
    }

    /// A scheduler over the compact Gated DeltaNet fixture on the CPU, without the cache.
    fn cpu_scheduler(prefill_budget: usize, mixed_batches: bool, decode_ahead: bool) -> Scheduler {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/compact/gdn");
        let engine = Engine::load(&deltaserve_engine::LoadOptions::cpu(dir)).unwrap();
        let cfg = SchedulerConfig {
            max_num_seqs: 4,
            kv_blocks: 0,
            max_queue: 4,
            max_model_len: 512,
            prefix_cache: PrefixCacheConfig::default(),
            prefill_budget,
            long_prefill_chunk: prefill_budget,
            mixed_batches,
            decode_ahead,
            request_timeout: std::time::Duration::from_secs(600),
            warmup: false,
        };
        Scheduler::new(engine, cfg, Arc::new(Metrics::new("gdn").unwrap()), Arc::new(Shared::default())).unwrap()
    }

    /// Tokens each receiver has seen so far.
    fn tokens(rx: &mut mpsc::Receiver<Event>) -> usize {
        std::iter::from_fn(|| rx.try_recv().ok()).filter(|e| matches!(e, Event::Token { .. })).count()
    }

    #[test]
    fn a_request_arriving_during_a_prefill_pass_starts_before_the_next_decode_step() {
        let long = GenParams { max_tokens: 8, ignore_eos: true, ..params() };
        for mixed in [false, true] {
            for (budget, b_starts) in [(256, true), (99, false)] {
                let case = format!("budget {budget}, mixed batches {mixed}");
                let mut s = cpu_scheduler(budget, mixed, false);
                let (tx, mut rx) = mpsc::channel(4);
                let (a, mut ea) = GenRequest::new("a".into(), (1..100).collect(), long.clone());
                s.enqueue(a);
                // b is in the channel when the step starts, so the engine thread takes it after
                // a's prefill pass, as it would one sent while that pass ran.
                let (b, mut eb) = GenRequest::new("b".into(), (1..20).collect(), long.clone());
                tx.try_send(Msg::Request(Box::new(b))).ok().unwrap();
                assert!(s.step(&mut rx).is_ok());
                // a: its prompt's token and a decode step's (in b's pass, when mixed). b: its
                // prompt's token (and a decode step's, unmixed) when a's 99 tokens left budget
                // for its 19; else nothing yet.
                assert_eq!(tokens(&mut ea), 2, "{case}: a");
                let b_first = match (b_starts, mixed) {
                    (false, _) => 0,
                    (true, true) => 1,
                    (true, false) => 2,
                };
                assert_eq!(tokens(&mut eb), b_first, "{case}: b");
                // The next turn of the loop takes b in before its step in any case.
                assert!(s.receive(&mut rx).is_ok() && s.step(&mut rx).is_ok());
                assert_eq!(tokens(&mut eb), if b_starts || mixed { 1 } else { 2 }, "{case}: b, a step later");
                // Beside running streams the same holds within the budget: c (29 tokens,
                // waiting) and d (29, arriving during c's pass) both fit what a and b leave of
                // it. Mixed, c's second token comes in d's pass, which is the step's decode.
                let (c, mut ec) = GenRequest::new("c".into(), (1..30).collect(), long.clone());
                s.enqueue(c);
                let (d, mut ed) = GenRequest::new("d".into(), (1..30).collect(), long.clone());
                tx.try_send(Msg::Request(Box::new(d))).ok().unwrap();
                assert!(s.step(&mut rx).is_ok());
                assert_eq!((tokens(&mut ec), tokens(&mut ed)), if mixed { (2, 1) } else { (2, 2) }, "{case}: c and d beside streams");
                assert_eq!(tokens(&mut ea), if mixed { 3 } else { 2 }, "{case}: a, two steps later");
            }
        }
    }

    #[test]
    fn long_prompts_advance_by_their_chunk_only_while_streams_outnumber_them() {
        let p = GenParams { max_tokens: 40, ignore_eos: true, ..params() };
        let prefilled = |s: &Scheduler, id: &str| s.requests.iter().find(|r| r.id == id).map(|r| r.prefilled);
        let (_tx, mut rx) = mpsc::channel(4);
        // Nothing decodes: a long prompt (300 > 128 tokens) takes the whole budget a step.
        let mut s = cpu_scheduler(128, true, false);
        s.cfg.long_prefill_chunk = 64;
        let (a, _ea) = GenRequest::new("a".into(), (1..301).collect(), p.clone());
        s.enqueue(a);
        for step in 1..=2 {
            assert!(s.step(&mut rx).is_ok());
            assert_eq!(prefilled(&s, "a"), Some(128 * step), "a alone, step {step}");
        }
        // b and c decode: a long prompt advances by 64 a step, and a short one (50 tokens) that
        // arrived with it takes the rest of the budget in the same step.
        let mut s = cpu_scheduler(128, true, false);
        s.cfg.long_prefill_chunk = 64;
        let (b, mut eb) = GenRequest::new("b".into(), (1..21).collect(), p.clone());
        let (c, _ec) = GenRequest::new("c".into(), (1..31).collect(), p.clone());
        s.enqueue(b);
        s.enqueue(c);
        assert!(s.step(&mut rx).is_ok());
        assert_eq!(tokens(&mut eb), 2, "b: its prompt's token and a decode step's");
        let (a, _ea) = GenRequest::new("a".into(), (1..301).collect(), p.clone());
        let (d, mut ed) = GenRequest::new("d".into(), (1..51).collect(), p.clone());
        s.enqueue(a);
        s.enqueue(d);
        for step in 1..=3 {
            assert!(s.step(&mut rx).is_ok());
            assert_eq!(prefilled(&s, "a"), Some(64 * step), "a beside b and c, step {step}");
        }
        assert_eq!(tokens(&mut ed), 3, "d started in a's first step and decoded in the next two");
        assert_eq!(tokens(&mut eb), 3, "b decoded in each of a's passes");
        // One stream does not hold back two long prompts: streams must outnumber them.
        let mut s = cpu_scheduler(128, true, false);
        s.cfg.long_prefill_chunk = 64;
        let (b, _eb) = GenRequest::new("b".into(), (1..21).collect(), p.clone());
        s.enqueue(b);
        assert!(s.step(&mut rx).is_ok());
        let (a, _ea) = GenRequest::new("a".into(), (1..301).collect(), p.clone());
        let (e, _ee) = GenRequest::new("e".into(), (1..301).collect(), p.clone());
        s.enqueue(a);
        s.enqueue(e);
        for step in 1..=2 {
            assert!(s.step(&mut rx).is_ok());
            assert_eq!((prefilled(&s, "a"), prefilled(&s, "e")), (Some(128 * step), Some(0)), "a and e beside b, step {step}");
        }
    }

    #[test]
    fn mixed_batches_and_decode_ahead_give_the_same_tokens_as_separate_passes() {
        // Greedy requests arriving at different steps, so that prompts are prefilled beside
        // running streams, and ending at different steps (n = 2 for one): on the CPU every row's
        // bits are the same in a mixed pass, and a step launched ahead is the step that would
        // have run next.
        let run = |mixed: bool, ahead: bool| -> Vec<Vec<String>> {
            let mut s = cpu_scheduler(64, mixed, ahead);
            let (_tx, mut rx) = mpsc::channel(4);
            let greedy = deltaserve_engine::SamplingParams { temperature: 0.0, ..Default::default() };
            let p = GenParams { max_tokens: 12, ignore_eos: true, logprobs: Some(0), sampling: greedy, ..params() };
            let mut events = Vec::new();
            for (i, len) in [70usize, 30, 150, 5].into_iter().enumerate() {
                let prompt: Vec<u32> = (0..len as u32).map(|t| (t * 7 + i as u32) % 200 + 1).collect();
                let p = GenParams { max_tokens: 12 - 2 * i, n: 1 + (i == 1) as usize, ..p.clone() };
                let (r, e) = GenRequest::new(format!("r{i}"), prompt, p);
                s.enqueue(r);
                events.push(e);
                assert!(s.step(&mut rx).is_ok());
            }
            while !s.requests.is_empty() || !s.waiting.is_empty() {
                assert!(s.step(&mut rx).is_ok());
            }
            events
                .iter_mut()
                .map(|e| {
                    std::iter::from_fn(|| e.try_recv().ok())
                        .filter_map(|ev| match ev {
                            Event::Token { text, logprob, .. } => Some(format!("{text:?}:{logprob:?}")),
                            _ => None,
                        })
                        .collect()
                })
                .collect()
        };
        let separate = run(false, false);
        assert_eq!(separate.len(), 4);
        for (i, s) in separate.iter().enumerate() {
            let choices = 1 + (i == 1) as usize;
            assert_eq!(s.len(), (12 - 2 * i) * choices, "request {i}: {s:?}");
            assert!(s.iter().all(|t| t.contains("Some(TokenLogprob")), "request {i}: {s:?}");
        }
        for (mixed, ahead) in [(true, false), (false, true), (true, true)] {
            assert_eq!(run(mixed, ahead), separate, "mixed batches {mixed}, decode ahead {ahead}");
        }
    }

    #[test]
    fn a_decode_step_is_launched_ahead_only_when_nothing_else_could_run_first() {
        let (tx, mut rx) = mpsc::channel(4);
        let p = GenParams { ignore_eos: true, ..params() };
        // One stream with tokens to go: its next step is launched ahead, drawn first thing in
        // the next engine step, and the one after it launched ahead in turn.
        let mut s = cpu_scheduler(64, true, true);
        let (a, mut ea) = GenRequest::new("a".into(), (1..20).collect(), GenParams { max_tokens: 6, ..p.clone() });
        s.enqueue(a);
        // Step 1: the prompt's token and a decode step's; the third token's step goes ahead.
        assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "a decode step with tokens to go");
        assert_eq!(tokens(&mut ea), 2);
        // Steps 2-4: the step ahead (3, 4, 5), the next launched before its emit.
        for k in 3..=5 {
            assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "token {k}: the next step goes ahead");
            assert_eq!(tokens(&mut ea), 1, "token {k}");
        }
        // Step 5: the sixth, the last: nothing ahead.
        assert!(s.step(&mut rx).is_ok() && s.ahead.is_none() && s.requests.is_empty());
        assert_eq!(tokens(&mut ea), 1);
        // A request waiting: its prefill must not wait behind a step launched ahead. Nor one in
        // the engine's channel.
        let (b, _eb) = GenRequest::new("b".into(), (1..20).collect(), GenParams { max_tokens: 20, ..p.clone() });
        s.enqueue(b);
        let (d, _ed) = GenRequest::new("d".into(), (1..20).collect(), p.clone());
        assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "b decodes alone");
        s.enqueue(d);
        s.finish_ahead(|| false);
        assert!(s.ahead.is_none(), "d waits: b's step after the one ahead is not launched");
        s.decode(|| false);
        assert!(s.ahead.is_none(), "d waits");
        assert!(s.step(&mut rx).is_ok() && s.ahead.is_none(), "d's prompt in a mixed pass with b");
        assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "d and b decode");
        let (e, _ee) = GenRequest::new("e".into(), (1..20).collect(), p.clone());
        tx.try_send(Msg::Request(Box::new(e))).ok().unwrap();
        s.finish_ahead(|| !rx.is_empty());
        assert!(s.ahead.is_none(), "e is in the channel");
        s.decode(|| !rx.is_empty());
        assert!(s.ahead.is_none(), "e is still in the channel");
        // A request that reaches the channel while a step launched ahead runs is prefilled in
        // the engine step that draws it, before any other decode step.
        assert!(s.receive(&mut rx).is_ok() && s.step(&mut rx).is_ok());
        assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "b, d and e decode");
        let (f, mut ef) = GenRequest::new("f".into(), (1..20).collect(), p.clone());
        tx.try_send(Msg::Request(Box::new(f))).ok().unwrap();
        assert!(s.step(&mut rx).is_ok() && s.ahead.is_none(), "f's prompt in a mixed pass");
        assert_eq!(tokens(&mut ef), 1, "f's first token, in the step that drew the one ahead");
        // Every row ends by length with the tokens just drawn: no step ahead (a chat client's
        // next turn would wait for it).
        let mut s = cpu_scheduler(64, true, true);
        let (c, mut ec) = GenRequest::new("c".into(), (1..20).collect(), GenParams { max_tokens: 2, ..p.clone() });
        s.enqueue(c);
        s.admit();
        assert_eq!(s.prefill(64, 64), (19, false, 0));
        s.decode(|| false);
        assert!(s.ahead.is_none(), "c ended with its second token");
        assert_eq!(tokens(&mut ec), 2);
    }

    #[test]
    fn a_full_channel_is_a_full_queue_and_a_closed_one_a_stopped_engine() {
        let (tx, rx) = mpsc::channel(1);
        let handle = SchedulerHandle { tx, shared: Arc::new(Shared::default()), max_num_seqs: 2, max_queue: 6 };
        let (a, _ra) = GenRequest::new("a".into(), vec![1], params());
        assert_eq!(handle.submit(a), Ok(()));
        let (b, _rb) = GenRequest::new("b".into(), vec![1], params());
        assert_eq!(handle.submit(b), Err(SchedulerError::QueueFull { in_flight: 1, slots: 2, queue: 6 }));
        assert_eq!(handle.in_flight(), 1, "the refused request is not counted");
        drop(rx);
        let (c, _rc) = GenRequest::new("c".into(), vec![1], params());
        assert_eq!(handle.submit(c), Err(SchedulerError::Stopped));
    }

    #[test]
    fn the_event_channel_holds_every_event_a_request_can_produce() {
        let (req, mut rx) = GenRequest::new("r".into(), vec![1, 2, 3], GenParams { n: 2, ..params() });
        // Prompt logprobs for each prompt token, then per choice 4 tokens, a text and a finish,
        // then an error: all fit without a reader.
        for _ in 0..3 {
            req.events.try_send(Event::PromptLogprobs(vec![])).unwrap();
        }
        for choice in 0..2 {
            for _ in 0..4 {
                req.events.try_send(Event::Token { choice, text: String::new(), logprob: None }).unwrap();
            }
            req.events.try_send(Event::Text { choice, text: String::new() }).unwrap();
            req.events.try_send(Event::Finished { choice, reason: FinishReason::Length, tokens: 4 }).unwrap();
        }
        req.events.try_send(Event::Error(SchedulerError::ShutDown)).unwrap();
        assert!(matches!(rx.try_recv(), Ok(Event::PromptLogprobs(_))));
    }
}
