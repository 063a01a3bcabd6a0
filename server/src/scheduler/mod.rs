//! The engine thread: continuous batching over the state pool.
//!
//! Each step (1) takes new requests and drops cancelled or timed-out ones, (2) admits waiting
//! requests first-come-first-served into free slots, (3) advances prefills in chunks under a
//! per-step token budget, (4) runs one batched decode over every running sequence, and
//! (5) frees the slots of finished sequences in the same step. HTTP handlers talk to it only
//! through [`SchedulerHandle`] and per-request event channels.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use deltaserve_engine::sampling::top_logprobs;
use deltaserve_engine::{Engine, IncrementalDecoder, Logits, Sampler, SlotId, StatePool};
use tokio::sync::mpsc;

use crate::api::error::ApiError;
use crate::metrics::Metrics;
use crate::stop::StopMatcher;

mod request;
pub use request::{Event, FinishReason, GenParams, GenRequest, SchedulerConfig, StopCause, TokenLogprob};

enum Command {
    Submit(GenRequest),
    AbortAll(ApiError),
}

/// Counters the HTTP layer reads without locking.
#[derive(Debug, Default)]
struct Shared {
    waiting: AtomicUsize,
    running: AtomicUsize,
    alive: AtomicBool,
}

/// Cheap, cloneable handle on the scheduler thread.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
    max_queue: usize,
}

impl SchedulerHandle {
    /// Queues a request, or refuses it at once with 429 when `max_queue` requests wait.
    pub fn submit(&self, req: GenRequest) -> Result<(), ApiError> {
        let limit = self.max_queue;
        let prev = self.shared.waiting.fetch_add(1, Ordering::SeqCst);
        if prev >= limit {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::QueueFull { waiting: prev, limit });
        }
        if self.tx.send(Command::Submit(req)).is_err() {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::Unavailable("the engine thread has stopped".into()));
        }
        Ok(())
    }

    /// Requests waiting or running.
    pub fn in_flight(&self) -> usize {
        self.shared.waiting.load(Ordering::SeqCst) + self.shared.running.load(Ordering::SeqCst)
    }

    /// Whether the engine thread is still running.
    pub fn alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Fails every waiting and running request with `err` (shutdown past its deadline).
    pub fn abort_all(&self, err: ApiError) {
        // A closed channel means the thread is gone and nothing is left to abort.
        let _ = self.tx.send(Command::AbortAll(err));
    }
}

/// Starts the engine thread. The pool is sized by `cfg.max_num_seqs`.
pub fn spawn(
    engine: Engine,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
) -> std::io::Result<(SchedulerHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared { alive: AtomicBool::new(true), ..Shared::default() });
    let handle = SchedulerHandle { tx, shared: shared.clone(), max_queue: cfg.max_queue };
    // The pool is allocated up front so that running out of (GPU) memory fails the start-up.
    let pool = engine.new_pool(cfg.max_num_seqs).map_err(std::io::Error::other)?;
    let thread = std::thread::Builder::new().name("engine".into()).spawn(move || {
        metrics.state_slots_total.set(pool.capacity() as i64);
        metrics.state_memory_bytes.set((pool.capacity() * pool.bytes_per_slot()) as i64);
        let mut s =
            Scheduler { engine, pool, cfg, metrics, shared: shared.clone(), waiting: VecDeque::new(), requests: Vec::new(), reserved: 0 };
        s.run(rx);
        shared.alive.store(false, Ordering::SeqCst);
    })?;
    Ok((handle, thread))
}

/// A request once admitted: its choices share the prompt.
struct Active {
    id: String,
    prompt: Vec<u32>,
    params: GenParams,
    events: mpsc::UnboundedSender<Event>,
    arrived: Instant,
    deadline: Instant,
    /// Prompt tokens prefilled so far (into `seqs[0]`'s slot).
    prefilled: usize,
    /// Logits after the last prefilled token, kept for prompt logprobs across chunks.
    prev_logits: Option<Vec<f32>>,
    seqs: Vec<Seq>,
    /// Slots promised to this request's forks but not yet taken.
    reserved: usize,
}

struct Seq {
    choice: usize,
    slot: SlotId,
    sampler: Sampler,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    generated: usize,
    /// The last sampled token, not yet fed to the model.
    pending: Option<u32>,
    finished: bool,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
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
}

impl Scheduler {
    fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.waiting.is_empty() && self.requests.is_empty() {
                match rx.blocking_recv() {
                    Some(c) => self.command(c),
                    None => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.command(c);
            }
            // An engine panic must not take the server down: fail what was running.
            let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step()));
            if step.is_err() {
                tracing::error!("engine step panicked; failing all running requests");
                self.fail_all(ApiError::Internal("engine step panicked".into()));
            }
            self.publish_gauges();
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit(r) => self.waiting.push_back(r),
            Command::AbortAll(e) => self.fail_all(e),
        }
    }

    fn step(&mut self) {
        self.drop_cancelled();
        self.admit();
        self.prefill();
        self.decode();
        self.retire_all();
    }

    fn publish_gauges(&self) {
        self.shared.waiting.store(self.waiting.len(), Ordering::SeqCst);
        self.shared.running.store(self.requests.len(), Ordering::SeqCst);
        self.metrics.num_requests_waiting.set(self.waiting.len() as i64);
        self.metrics.num_requests_running.set(self.requests.len() as i64);
        self.metrics.state_slots_used.set(self.pool.used() as i64);
    }

    fn fail_all(&mut self, e: ApiError) {
        for r in self.waiting.drain(..) {
            let _ = r.events.send(Event::Error(e.clone()));
        }
        for r in &mut self.requests {
            let _ = r.events.send(Event::Error(e.clone()));
            for s in &mut r.seqs {
                s.finished = true;
            }
        }
        self.retire_all();
    }

    /// Frees requests whose client went away or whose deadline passed, and drops waiting
    /// requests whose client already left.
    fn drop_cancelled(&mut self) {
        let now = Instant::now();
        let metrics = &self.metrics;
        self.waiting.retain(|r| {
            let gone = r.events.is_closed();
            if gone {
                metrics.client_disconnects.inc();
            }
            !gone
        });
        for r in &mut self.requests {
            let gone = r.events.is_closed();
            let late = now >= r.deadline;
            if gone || late {
                if gone {
                    self.metrics.client_disconnects.inc();
                    tracing::info!(request = %r.id, "client disconnected; request cancelled");
                } else {
                    let _ = r.events.send(Event::Error(ApiError::Timeout(self.cfg.request_timeout.as_secs())));
                }
                for s in &mut r.seqs {
                    s.finished = true;
                }
            }
        }
        self.retire_all();
    }

    fn free_slots(&self) -> usize {
        self.pool.capacity() - self.pool.used() - self.reserved
    }

    /// First come, first served: the head waits until all its `n` slots are free.
    fn admit(&mut self) {
        while let Some(head) = self.waiting.front() {
            if head.params.n > self.free_slots() {
                break;
            }
            let Some(r) = self.waiting.pop_front() else {
                break;
            };
            let Some(slot) = self.pool.allocate() else {
                self.waiting.push_front(r);
                break;
            };
            let now = Instant::now();
            self.metrics.request_queue_time.observe(now.duration_since(r.arrived).as_secs_f64());
            let reserved = r.params.n - 1;
            self.reserved += reserved;
            let seq0 = new_seq_for(&r, 0, slot);
            tracing::debug!(request = %r.id, %slot, prompt = r.prompt.len(), n = r.params.n, "admitted");
            self.requests.push(Active {
                id: r.id,
                deadline: r.arrived + self.cfg.request_timeout,
                prompt: r.prompt,
                params: r.params,
                events: r.events,
                arrived: r.arrived,
                prefilled: 0,
                prev_logits: None,
                seqs: vec![seq0],
                reserved,
            });
        }
    }

    /// Advances prompts in chunks, oldest first, within the per-step token budget. The chunks
    /// run as one packed prefill (one pass through the model for all of them), except those of
    /// requests that want prompt logprobs, which need every position's logits and run alone.
    fn prefill(&mut self) {
        let mut budget = self.cfg.prefill_budget;
        let started = Instant::now();
        let mut plan = Vec::new();
        for i in 0..self.requests.len() {
            if budget == 0 {
                break;
            }
            let r = &self.requests[i];
            if r.prefilled >= r.prompt.len() || r.seqs.iter().all(|s| s.finished) {
                continue;
            }
            let take = budget.min(r.prompt.len() - r.prefilled);
            budget -= take;
            plan.push((i, take));
        }
        if plan.is_empty() {
            return;
        }
        let tokens: usize = plan.iter().map(|(_, take)| take).sum();
        let (alone, packed): (Vec<_>, Vec<_>) = plan.into_iter().partition(|(i, _)| self.requests[*i].params.prompt_logprobs);
        for (i, take) in alone {
            if let Err(e) = self.prefill_with_logprobs(i, take).and_then(|last| self.finish_chunk(i, take, last)) {
                self.fail(i, e);
            }
        }
        if !packed.is_empty() {
            match self.prefill_packed(&packed) {
                Ok(lasts) => {
                    for ((i, take), last) in packed.into_iter().zip(lasts) {
                        if let Err(e) = self.finish_chunk(i, take, last) {
                            self.fail(i, e);
                        }
                    }
                }
                Err(e) => {
                    for (i, _) in packed {
                        self.fail(i, e.clone());
                    }
                }
            }
        }
        self.metrics.step_duration.with_label_values(&["prefill"]).observe(started.elapsed().as_secs_f64());
        self.metrics.prompt_tokens.inc_by(tokens as u64);
    }

    /// Ends request `i` with an error event.
    fn fail(&mut self, i: usize, e: ApiError) {
        let r = &mut self.requests[i];
        let _ = r.events.send(Event::Error(e));
        for s in &mut r.seqs {
            s.finished = true;
        }
    }

    /// The next `take` prompt tokens of each `(request, take)` in one packed prefill; returns
    /// each one's logits after its last token.
    fn prefill_packed(&mut self, plan: &[(usize, usize)]) -> Result<Vec<Vec<f32>>, ApiError> {
        let batch: Vec<_> = plan
            .iter()
            .map(|&(i, take)| {
                let r = &self.requests[i];
                (r.seqs[0].slot, &r.prompt[r.prefilled..r.prefilled + take])
            })
            .collect();
        self.engine.prefill_many(&mut self.pool, &batch)?.to_vec2::<f32>().map_err(|e| ApiError::Internal(e.to_string()))
    }

    /// The next `take` prompt tokens of request `i`, sending their prompt logprobs; returns the
    /// logits after the last one.
    fn prefill_with_logprobs(&mut self, i: usize, take: usize) -> Result<Vec<f32>, ApiError> {
        let r = &mut self.requests[i];
        let (from, to) = (r.prefilled, r.prefilled + take);
        let chunk = &r.prompt[from..to];
        let all = self
            .engine
            .prefill(&mut self.pool, r.seqs[0].slot, chunk, Logits::All)?
            .to_vec2::<f32>()
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let mut lps = Vec::with_capacity(take);
        let mut prev = r.prev_logits.take();
        for (j, row) in all.iter().enumerate() {
            if let Some(p) = prev.as_ref() {
                lps.push(logprob_entry(p, chunk[j], r.params.logprobs.unwrap_or(0)));
            }
            prev = Some(row.clone());
        }
        if !lps.is_empty() {
            let _ = r.events.send(Event::PromptLogprobs(lps));
        }
        Ok(prev.unwrap_or_default())
    }

    /// Records that request `i` prefilled `take` more tokens with `last` the logits after them;
    /// when its prompt is done, forks its other choices and samples each one's first token.
    fn finish_chunk(&mut self, i: usize, take: usize, last: Vec<f32>) -> Result<(), ApiError> {
        let r = &mut self.requests[i];
        let to = r.prefilled + take;
        let slot = r.seqs[0].slot;
        r.prefilled = to;
        if to < r.prompt.len() {
            r.prev_logits = Some(last);
            return Ok(());
        }
        // Prompt done: fork the other choices from the prefilled slot, then sample each.
        for choice in 1..r.params.n {
            let slot = self.pool.fork(slot)?.ok_or_else(|| ApiError::Internal("reserved slot missing".into()))?;
            self.reserved -= 1;
            r.reserved -= 1;
            let req = GenRequest {
                id: r.id.clone(),
                prompt: r.prompt.clone(),
                params: r.params.clone(),
                events: r.events.clone(),
                arrived: r.arrived,
            };
            let seq = new_seq_for(&req, choice, slot);
            r.seqs.push(seq);
        }
        let tok = self.engine.tokenizer();
        let max_model_len = self.cfg.max_model_len;
        for s in 0..r.seqs.len() {
            emit(r, s, &last, tok, &self.metrics, max_model_len);
        }
        Ok(())
    }

    /// One batched decode step over every sequence with a pending token.
    fn decode(&mut self) {
        let mut batch = Vec::new();
        let mut owners = Vec::new();
        for (ri, r) in self.requests.iter().enumerate() {
            for (si, s) in r.seqs.iter().enumerate() {
                if let (false, Some(t)) = (s.finished, s.pending) {
                    batch.push((s.slot, t));
                    owners.push((ri, si));
                }
            }
        }
        if batch.is_empty() {
            return;
        }
        let started = Instant::now();
        let result = self.engine.decode(&mut self.pool, &batch).and_then(|l| Ok(l.to_vec2::<f32>()?));
        self.metrics.step_duration.with_label_values(&["decode"]).observe(started.elapsed().as_secs_f64());
        self.metrics.decode_batch_size.observe(batch.len() as f64);
        tracing::trace!(batch = batch.len(), "decode step");
        match result {
            Ok(rows) => {
                let tok = self.engine.tokenizer();
                for ((ri, si), row) in owners.into_iter().zip(rows) {
                    emit(&mut self.requests[ri], si, &row, tok, &self.metrics, self.cfg.max_model_len);
                }
            }
            Err(e) => {
                let err = ApiError::from(e);
                for (ri, _) in owners {
                    let r = &mut self.requests[ri];
                    if !r.seqs.iter().all(|s| s.finished) {
                        let _ = r.events.send(Event::Error(err.clone()));
                    }
                    for s in &mut r.seqs {
                        s.finished = true;
                    }
                }
            }
        }
    }

    /// Frees finished sequences' slots and drops finished requests, in the same step.
    fn retire_all(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.requests.len() {
            let r = &mut self.requests[i];
            for s in r.seqs.iter().filter(|s| s.finished) {
                // Cannot fail: every seq owns an allocated slot until it is retired here.
                let _ = self.pool.release(s.slot);
            }
            r.seqs.retain(|s| !s.finished);
            // Forks are only made from a live first sequence, so no sequences left means done.
            if r.seqs.is_empty() {
                self.reserved -= r.reserved;
                self.metrics.e2e_latency.observe(now.duration_since(r.arrived).as_secs_f64());
                self.requests.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
}

fn new_seq_for(r: &GenRequest, choice: usize, slot: SlotId) -> Seq {
    let mut sampling = r.params.sampling.clone();
    sampling.seed = sampling.seed.map(|s| s.wrapping_add(choice as u64));
    Seq {
        choice,
        slot,
        sampler: Sampler::new(sampling, &r.prompt),
        decoder: IncrementalDecoder::new(),
        stops: StopMatcher::new(r.params.stop.clone()),
        generated: 0,
        pending: None,
        finished: false,
        first_token: None,
        last_token: None,
    }
}

fn logprob_entry(logits: &[f32], token: u32, top_n: usize) -> TokenLogprob {
    TokenLogprob { token, logprob: deltaserve_engine::sampling::log_softmax_at(logits, token as usize), top: top_logprobs(logits, top_n) }
}

/// Samples the next token of `r.seqs[si]` from `logits`, sends it, and checks stop rules.
fn emit(r: &mut Active, si: usize, logits: &[f32], tok: &deltaserve_engine::Tokenizer, metrics: &Metrics, max_model_len: usize) {
    let prompt_len = r.prompt.len();
    let p = &r.params;
    let s = &mut r.seqs[si];
    if s.finished {
        return;
    }
    let sampled = s.sampler.sample(logits);
    let t = sampled.token;
    s.sampler.accept(t);
    s.generated += 1;
    metrics.generation_tokens.inc();
    let now = Instant::now();
    match s.last_token {
        None => metrics.time_to_first_token.observe(now.duration_since(r.arrived).as_secs_f64()),
        Some(prev) => metrics.inter_token_latency.observe(now.duration_since(prev).as_secs_f64()),
    }
    s.first_token.get_or_insert(now);
    s.last_token = Some(now);
    let logprob = p.logprobs.map(|n| TokenLogprob { token: t, logprob: sampled.logprob, top: top_logprobs(logits, n) });

    let is_eos = !p.ignore_eos && tok.eos_token_ids.contains(&t);
    let stop_id = p.stop_token_ids.contains(&t);
    let mut finish = if is_eos {
        Some(FinishReason::Stop(None))
    } else if stop_id {
        Some(FinishReason::Stop(Some(StopCause::Token(t))))
    } else {
        None
    };
    // The EOS / stop token's own text is not part of the output.
    let mut text = String::new();
    if finish.is_none() {
        match s.decoder.push(tok, t) {
            Ok(Some(delta)) => {
                let rel = s.stops.push(&delta);
                text = rel.text;
                if let Some(m) = rel.matched {
                    finish = Some(FinishReason::Stop(Some(StopCause::Text(m))));
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(request = %r.id, error = %e, "detokenization failed"),
        }
    }
    if finish.is_none() && (s.generated >= p.max_tokens || prompt_len + s.generated >= max_model_len) {
        finish = Some(FinishReason::Length);
    }
    let _ = r.events.send(Event::Token { choice: s.choice, text, logprob });
    match finish {
        Some(reason) => {
            if !matches!(reason, FinishReason::Stop(Some(StopCause::Text(_)))) {
                // Release held-back text: an incomplete character or a stop-string prefix.
                let mut tail = s.decoder.flush(tok).ok().flatten().map(|d| s.stops.push(&d).text).unwrap_or_default();
                tail.push_str(&s.stops.flush());
                if !tail.is_empty() {
                    let _ = r.events.send(Event::Text { choice: s.choice, text: tail });
                }
            }
            metrics.request_success.with_label_values(&[reason.as_str()]).inc();
            let _ = r.events.send(Event::Finished { choice: s.choice, reason, tokens: s.generated });
            s.finished = true;
            s.pending = None;
        }
        None => s.pending = Some(t),
    }
}
