//! What each step runs: the prompt chunks of this step (packed into one prefill pass within
//! the token budget) and one batched decode over every running sequence, in the same pass
//! unless mixed batches are off.

use std::time::Instant;

use deltaserve_engine::{Device, Draws, EngineError, Logits, SlotId, Tensor, PREFILL_CHUNK};

use super::sequence::{logprob_entry, send, Seq};
use super::{ms, Active, Event, Scheduler, SchedulerError};

/// Who draws from a logits row: `(request, choice, row)`.
pub(super) type Drawer = (usize, usize, usize);

/// A batch's draws on the host: the `(request, choice)`s that drew, and their results.
type Drawn = (Vec<(usize, usize)>, Vec<Result<deltaserve_engine::Sampled, EngineError>>);

/// Batches of at least this many drawn tokens are emitted on several threads.
const PARALLEL_EMIT_FROM: usize = 8;

/// The prompt chunks of one step: oldest request first, `(request, tokens)` for every request
/// with prompt left (`(done, left)` per request, `left` 0 for none), until `budget` tokens are
/// planned. A chunk that stops short of its prompt's end stops at a multiple of `align`, so a
/// prompt is cut at the same places whatever other requests share the budget and its logits
/// are the bits of prefilling it alone; a request whose next aligned piece does not fit waits
/// for the next step (with `budget` ≥ `align`, the oldest always advances).
pub(super) fn plan_prefill(left: &[(usize, usize)], budget: usize, align: usize) -> Vec<(usize, usize)> {
    plan_prefill_capped(left, &[], budget, 0, align)
}

/// [`plan_prefill`] where the requests marked in `long` share at most `long_budget` of the
/// step's tokens (those past the end of `long` are not long); the others may take the rest.
pub(super) fn plan_prefill_capped(
    left: &[(usize, usize)],
    long: &[bool],
    mut budget: usize,
    mut long_budget: usize,
    align: usize,
) -> Vec<(usize, usize)> {
    let mut plan = Vec::new();
    for (i, &(done, l)) in left.iter().enumerate() {
        if budget == 0 {
            break;
        }
        let is_long = long.get(i).copied().unwrap_or(false);
        let cap = if is_long { budget.min(long_budget) } else { budget };
        if l == 0 || cap == 0 {
            continue;
        }
        let mut take = cap.min(l);
        if take < l {
            take = ((done + take) / align * align).saturating_sub(done);
        }
        if take == 0 {
            continue;
        }
        budget -= take;
        if is_long {
            long_budget -= take;
        }
        plan.push((i, take));
    }
    plan
}

impl Scheduler {
    /// Advances prompts in chunks, oldest first, within `budget` tokens. The chunks run as one
    /// packed prefill (one pass through the model for all of them), except those of requests
    /// that want prompt logprobs, which need every position's logits and run alone. With mixed
    /// batches on, the packed pass also decodes every running sequence's next token. Returns the
    /// tokens it ran, cache re-prefills included, whether the running sequences were decoded,
    /// and the tokens of long prompts among them. While more sequences decode than there are
    /// prompts longer than the step budget (uncached), those share at most `long_budget` tokens.
    pub(super) fn prefill(&mut self, budget: usize, long_budget: usize) -> (usize, bool, usize) {
        let started = Instant::now();
        // Cached prefixes first: restored requests start later in their prompts, and those
        // whose prefix an older request is about to snapshot wait for it.
        let waits = self.use_cache();
        let cached = started.elapsed();
        let left: Vec<(usize, usize)> = self
            .requests
            .iter()
            .zip(&waits)
            .map(|(r, &wait)| (r.prefilled, if wait || r.seqs.iter().all(|s| s.finished) { 0 } else { r.prompt.len() - r.prefilled }))
            .collect();
        // The cap holds the long prompts back for the streams' sake: only while streams
        // outnumber them (one stream must not hold back a burst of long prompts).
        let streams = self.requests.iter().flat_map(|r| &r.seqs).filter(|s| !s.finished && s.pending.is_some()).count();
        let long: Vec<bool> = self
            .requests
            .iter()
            .zip(&left)
            .map(|(r, &(_, l))| l > 0 && if r.started { r.long } else { l > self.cfg.prefill_budget })
            .collect();
        let long = if streams > long.iter().filter(|&&l| l).count() { long } else { Vec::new() };
        let plan = plan_prefill_capped(&left, &long, budget, long_budget, PREFILL_CHUNK);
        let tokens: usize = plan.iter().map(|(_, take)| take).sum();
        let long_tokens: usize = plan.iter().filter(|(i, _)| long.get(*i).copied().unwrap_or(false)).map(|(_, take)| take).sum();
        // Finished chat turns re-prefilled for the cache get what budget is left.
        let now = Instant::now();
        let tail_left: Vec<(usize, usize)> = self.tails.iter().map(|t| (t.done, if t.ready <= now { t.end - t.done } else { 0 })).collect();
        let tails = plan_prefill(&tail_left, budget - tokens, PREFILL_CHUNK);
        if plan.is_empty() && tails.is_empty() {
            return (0, false, 0);
        }
        for &(i, _) in &plan {
            let r = &mut self.requests[i];
            if !r.started {
                r.started = true;
                r.long = r.prompt.len() - r.prefilled > self.cfg.prefill_budget;
                // A query is a request that looked the cache up (echo + logprobs do not).
                if self.cache.is_some() && !r.params.prompt_logprobs {
                    self.metrics.prefix_cache_queries.inc_by(r.prompt.len() as u64);
                    self.metrics.prefix_cache_hits.inc_by(r.prefilled as u64);
                }
            }
        }
        let (alone, packed): (Vec<_>, Vec<_>) = plan.into_iter().partition(|(i, _)| self.requests[*i].params.prompt_logprobs);
        for (i, take) in alone {
            let r = &self.requests[i];
            let ends = r.prefilled + take >= r.prompt.len();
            let step = self.prefill_with_logprobs(i, take).and_then(|last| {
                // Prompt logprobs need every position's logits on the host; the draw after the
                // prompt reads the last of them there.
                let row = match ends {
                    true => Some(Tensor::from_slice(&last, (1, last.len()), &Device::Cpu).map_err(EngineError::from)?),
                    false => None,
                };
                self.finish_chunk(i, take, (!ends).then_some(last))?;
                Ok(row)
            });
            match step {
                Ok(Some(row)) => {
                    let who = self.first_draws(i, 0);
                    let _ = self.draw_and_emit(Ok(row), &who);
                }
                Ok(None) => {}
                Err(e) => self.requests[i].fail(e),
            }
        }
        // Host time to launch the packed pass, then until the first tokens drawn from it are
        // back (waiting for the GPU; nothing waits when no prompt ended in the pass).
        let (mut launch, mut drawn) = Default::default();
        let mut step = Vec::new();
        if !packed.is_empty() || !tails.is_empty() {
            // The running sequences' decode rows follow the pieces' last rows.
            let who;
            (step, who) = if self.cfg.mixed_batches { self.decode_rows(packed.len() + tails.len()) } else { Default::default() };
            let t0 = Instant::now();
            let out = self.prefill_packed(&packed, &tails, &step);
            launch = t0.elapsed();
            match out {
                Ok(lasts) => {
                    // Requests whose prompt is done draw their first tokens, from their rows,
                    // in one draw with the decode rows.
                    let mut draws = Vec::new();
                    for (row, (i, take)) in packed.into_iter().enumerate() {
                        match self.finish_chunk(i, take, None) {
                            Ok(true) => draws.extend(self.first_draws(i, row)),
                            Ok(false) => {}
                            Err(e) => self.requests[i].fail(e),
                        }
                    }
                    draws.extend(who);
                    drawn = self.draw_and_emit(Ok(lasts), &draws);
                }
                Err(e) => {
                    for (i, _) in packed {
                        self.requests[i].fail(e.clone());
                    }
                    for (ri, ..) in who {
                        self.requests[ri].fail(e.clone());
                    }
                    tracing::warn!(error = %e, "prefill failed; cache re-prefills dropped");
                    self.tails.iter_mut().for_each(|t| t.done = t.end);
                }
            }
            self.end_tails(&tails);
        }
        let secs = started.elapsed().as_secs_f64();
        let phase = if step.is_empty() { "prefill" } else { "mixed" };
        self.metrics.step_duration.with_label_values(&[phase]).observe(secs);
        if !step.is_empty() {
            self.metrics.decode_batch_size.observe(step.len() as f64);
        }
        self.metrics.prompt_tokens.inc_by(tokens as u64);
        let tail_tokens: usize = tails.iter().map(|(_, take)| take).sum();
        tracing::debug!(
            tokens,
            tail_tokens,
            decoded = step.len(),
            ms = secs * 1e3,
            cache_ms = ms(cached),
            launch_ms = ms(launch),
            drawn_ms = ms(drawn),
            "prefill step"
        );
        (tokens + tail_tokens, !step.is_empty(), long_tokens)
    }

    /// Every running sequence's pending token: `(slot, token)` rows, and each row's `(request,
    /// choice, row)` with rows numbered from `first`.
    fn decode_rows(&self, first: usize) -> (Vec<(SlotId, u32)>, Vec<Drawer>) {
        let (mut batch, mut who) = (Vec::new(), Vec::new());
        for (ri, r) in self.requests.iter().enumerate() {
            for (si, s) in r.seqs.iter().enumerate() {
                if let (false, Some(t)) = (s.finished, s.pending) {
                    who.push((ri, si, first + batch.len()));
                    batch.push((s.slot, t));
                }
            }
        }
        (batch, who)
    }

    /// The next `take` prompt tokens of each `(request, take)` and of each `(tail, take)` in
    /// one packed prefill, snapshotting every grid point on the way that the cache lacks, and a
    /// decode step of `step` in the same pass; returns the logits after each piece's last token,
    /// then each decode row's, `[pieces + step, vocab]` where the model runs (row `r` is
    /// `plan[r]`'s).
    fn prefill_packed(
        &mut self,
        plan: &[(usize, usize)],
        tails: &[(usize, usize)],
        step: &[(SlotId, u32)],
    ) -> Result<Tensor, SchedulerError> {
        // (slot, the sequence's tokens, where this piece starts, its length)
        let mut pieces: Vec<(SlotId, &[u32], usize, usize)> = Vec::with_capacity(plan.len() + tails.len());
        let at: Vec<(SlotId, usize)> = plan.iter().map(|&(i, _)| (self.requests[i].seqs[0].slot, self.requests[i].prefilled)).collect();
        // The prompts, read by the pass, and the constraints, whose masks are computed while
        // it runs.
        let mut prompts = Vec::with_capacity(self.requests.len());
        let mut constraints = Vec::new();
        for r in self.requests.iter_mut() {
            prompts.push(r.prompt.as_slice());
            constraints.extend(constrained(&mut r.seqs));
        }
        for (&(i, take), &(slot, from)) in plan.iter().zip(&at) {
            pieces.push((slot, prompts[i], from, take));
        }
        for &(i, take) in tails {
            let t = &self.tails[i];
            pieces.push((t.slot, &t.tokens, t.done, take));
        }
        let (snaps, keys) = match self.cache.as_mut() {
            Some(c) => c.plan_snapshots(&mut self.pool, &pieces),
            None => Default::default(),
        };
        let batch: Vec<_> = pieces.iter().map(|&(slot, toks, from, take)| (slot, &toks[from..from + take])).collect();
        let t0 = Instant::now();
        let (engine, pool) = (&self.engine, &mut self.pool);
        let out = with_masks(constraints, || engine.prefill_and_decode(pool, &batch, &snaps, step));
        tracing::debug!(
            launch_ms = ms(t0.elapsed()),
            seqs = batch.len(),
            decode = step.len(),
            tokens = batch.iter().map(|b| b.1.len()).sum::<usize>(),
            snaps = snaps.len(),
            "prefill pass"
        );
        if let Some(c) = self.cache.as_mut() {
            for (s, (seq, len)) in snaps.iter().zip(keys) {
                let done = out.is_ok() && c.insert(&pieces[seq].1[..len], s.snap).is_ok();
                if !done {
                    let _ = self.pool.drop_snapshot(s.snap);
                }
            }
        }
        Ok(out?)
    }

    /// The next `take` prompt tokens of request `i`, sending their prompt logprobs; returns the
    /// logits after the last one.
    fn prefill_with_logprobs(&mut self, i: usize, take: usize) -> Result<Vec<f32>, SchedulerError> {
        let r = &mut self.requests[i];
        let (from, to) = (r.prefilled, r.prefilled + take);
        let chunk = &r.prompt[from..to];
        let all = self
            .engine
            .prefill(&mut self.pool, r.seqs[0].slot, chunk, Logits::All)?
            .to_vec2::<f32>()
            .map_err(|e| SchedulerError::Engine(e.to_string()))?;
        let mut lps = Vec::with_capacity(take);
        let mut prev = r.prev_logits.take();
        for (j, row) in all.iter().enumerate() {
            if let Some(p) = prev.as_ref() {
                lps.push(logprob_entry(p, chunk[j], r.params.logprobs.unwrap_or(0)));
            }
            prev = Some(row.clone());
        }
        if !lps.is_empty() {
            send(&r.events, Event::PromptLogprobs(lps));
        }
        Ok(prev.unwrap_or_default())
    }

    /// Records that request `i` prefilled `take` more tokens (`last`: the logits after them, kept
    /// on the host for the next chunk's prompt logprobs); when its prompt is done, forks its
    /// other choices and returns true: they draw their first tokens next.
    fn finish_chunk(&mut self, i: usize, take: usize, last: Option<Vec<f32>>) -> Result<bool, SchedulerError> {
        let r = &mut self.requests[i];
        let to = r.prefilled + take;
        let slot = r.seqs[0].slot;
        r.prefilled = to;
        if to < r.prompt.len() {
            r.prev_logits = last;
            return Ok(false);
        }
        // Prompt done: fork the other choices from the prefilled slot.
        for choice in 1..r.params.n {
            let slot = self.pool.fork(slot)?.ok_or_else(|| SchedulerError::Engine("reserved slot missing".into()))?;
            self.reserved -= 1;
            r.reserved -= 1;
            let blocks = self.pool.blocks_for(r.kv_tokens);
            self.kv_reserved -= blocks;
            r.kv_reserved -= blocks;
            if !self.pool.reserve(slot, r.kv_tokens)? {
                return Err(SchedulerError::Engine("reserved KV blocks missing".into()));
            }
            r.seqs.push(Seq::new(&r.params, &r.prompt, choice, slot));
        }
        Ok(true)
    }

    /// The draws of request `i`'s first tokens, its prompt done: every choice draws from `row`.
    fn first_draws(&self, i: usize, row: usize) -> Vec<Drawer> {
        (0..self.requests[i].seqs.len()).map(|si| (i, si, row)).collect()
    }

    /// Draws the next token of each `(request, choice, logits row)` in one batch where the logits
    /// are, and emits them; when the batch fails, so do those requests. Returns the time until
    /// the draws were back on the host (which includes waiting for the GPU's forward).
    pub(super) fn draw_and_emit(&mut self, logits: Result<Tensor, SchedulerError>, who: &[Drawer]) -> std::time::Duration {
        // "Requests waiting" keeps any step from going ahead.
        self.draw_launch_emit(logits, who, || true)
    }

    /// [`Self::draw_and_emit`] for a decode step: the next step is launched ahead between the
    /// draw and the emit when the mode is on and nothing else could run first (`arrivals`:
    /// whether requests wait in the engine's channel). Returns the time until the draws were
    /// back.
    pub(super) fn draw_launch_emit(
        &mut self,
        logits: Result<Tensor, SchedulerError>,
        who: &[Drawer],
        arrivals: impl Fn() -> bool,
    ) -> std::time::Duration {
        let (drawn_at, out) = self.draw(logits, who);
        match out {
            Ok((rows, results)) => {
                let ahead = if arrivals() { Ok(()) } else { self.launch_ahead(&rows, &results) };
                self.emit_all(rows, results);
                if let Err((rows, e)) = ahead {
                    self.fail_rows(&rows, e);
                }
            }
            Err(e) => self.fail_rows(who, e),
        }
        drawn_at
    }

    /// Draws the next token of each `(request, choice, logits row)` in one batch where the logits
    /// are: the `(request, choice)`s that drew and their results, on the host. Also returns the
    /// time until the draws were back.
    fn draw(&mut self, logits: Result<Tensor, SchedulerError>, who: &[Drawer]) -> (std::time::Duration, Result<Drawn, SchedulerError>) {
        let started = Instant::now();
        let mut draws = Draws::new();
        let mut drawn = Vec::with_capacity(who.len());
        if logits.is_ok() {
            for &(ri, si, row) in who {
                let r = &mut self.requests[ri];
                if r.seqs[si].draw(&mut draws, row, r.params.logprobs, &r.events, &r.id) {
                    drawn.push((ri, si));
                }
            }
        }
        let out = if draws.is_empty() { logits.map(|_| vec![]) } else { logits.and_then(|l| Ok(draws.run(&l)?)) };
        (started.elapsed(), out.map(|results| (drawn, results)))
    }

    /// Fails the requests of `who`'s rows with `e`.
    fn fail_rows(&mut self, who: &[Drawer], e: SchedulerError) {
        for &(ri, ..) in who {
            self.requests[ri].fail(e.clone());
        }
    }

    /// Emits each drawn `(request, choice)`'s token. Choices are independent (detokenizing, stop
    /// strings, grammar, events), so a large batch spreads them over threads: the GPU idles
    /// while they run.
    fn emit_all(&mut self, drawn: Vec<(usize, usize)>, results: Vec<Result<deltaserve_engine::Sampled, EngineError>>) {
        use rayon::prelude::*;
        let mut results: Vec<Option<_>> = results.into_iter().map(Some).collect();
        // Each request's drawn choices, in order: (choice, result index).
        let mut by_request: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.requests.len()];
        for (k, &(ri, si)) in drawn.iter().enumerate() {
            by_request[ri].push((si, k));
        }
        let (tok, metrics, max_model_len) = (self.engine.tokenizer(), &self.metrics, self.cfg.max_model_len);
        let mut jobs = Vec::with_capacity(drawn.len());
        for (ri, (r, mine)) in self.requests.iter_mut().zip(&by_request).enumerate() {
            let Active { seqs, params, prompt, events, id, arrived, .. } = r;
            let cx = super::sequence::Context { prompt_len: prompt.len(), params, tok, max_model_len };
            let mut mine = mine.iter().peekable();
            for (si, seq) in seqs.iter_mut().enumerate() {
                if let Some(&(_, k)) = mine.next_if(|(s, _)| *s == si) {
                    if let Some(sampled) = results[k].take() {
                        jobs.push((ri, seq, cx.clone(), sampled, &*events, id.as_str(), *arrived));
                    }
                }
            }
        }
        type Job<'a> = (
            usize,
            &'a mut Seq,
            super::sequence::Context<'a>,
            Result<deltaserve_engine::Sampled, EngineError>,
            &'a tokio::sync::mpsc::Sender<Event>,
            &'a str,
            Instant,
        );
        let emit =
            |(ri, seq, cx, sampled, events, id, arrived): Job<'_>| seq.emit(&cx, sampled, events, id, metrics, arrived).map(|e| (ri, e));
        let last: Vec<(usize, Event)> = if jobs.len() >= PARALLEL_EMIT_FROM {
            jobs.into_par_iter().filter_map(emit).collect()
        } else {
            jobs.into_iter().filter_map(emit).collect()
        };
        // A request whose choices are all done gives back its admission place before its last
        // events go out.
        for (ri, e) in last {
            let r = &mut self.requests[ri];
            if r.seqs.iter().all(|s| s.finished) {
                r.ticket = None;
            }
            send(&r.events, e);
        }
    }

    /// One batched decode step over every sequence with a pending token. `arrivals` tells
    /// whether requests wait in the engine's channel (a step launched ahead would delay them).
    pub(super) fn decode(&mut self, arrivals: impl Fn() -> bool) {
        let (batch, who) = self.decode_rows(0);
        if batch.is_empty() {
            return;
        }
        let started = Instant::now();
        let constraints = self.requests.iter_mut().flat_map(|r| constrained(&mut r.seqs)).collect();
        let logits = with_masks(constraints, || self.engine.decode_in_place(&mut self.pool, &batch));
        // Host time to launch the forward; then until the draws are back (the GPU's forward and
        // the draw); then emitting (grammar, detokenizing, events), while the next step, when
        // launched ahead, runs on the GPU.
        let launch = started.elapsed();
        let drawn = self.draw_launch_emit(logits.map_err(SchedulerError::from), &who, arrivals);
        let secs = started.elapsed().as_secs_f64();
        self.metrics.step_duration.with_label_values(&["decode"]).observe(secs);
        self.metrics.decode_batch_size.observe(batch.len() as f64);
        let emit_ms = secs * 1e3 - ms(launch) - ms(drawn);
        tracing::trace!(batch = batch.len(), launch_ms = ms(launch), drawn_ms = ms(drawn), emit_ms, ms = secs * 1e3, "decode step");
    }
}

/// The constraints of the running choices among `seqs`.
fn constrained(seqs: &mut [Seq]) -> impl Iterator<Item = &mut crate::structured::Constraint> {
    seqs.iter_mut().filter(|s| !s.finished).filter_map(|s| s.constraint.as_mut())
}

/// Runs `forward` while the next step's grammar masks of `constraints` are computed on other
/// threads, in parallel (the draw applies them where the logits are).
fn with_masks<T: Send>(mut constraints: Vec<&mut crate::structured::Constraint>, forward: impl FnOnce() -> T + Send) -> T {
    use rayon::prelude::*;
    if constraints.is_empty() {
        return forward();
    }
    std::thread::scope(|scope| {
        let masks = scope.spawn(move || constraints.par_iter_mut().for_each(|c| c.prepare()));
        let out = forward();
        let _ = masks.join();
        out
    })
}

#[cfg(test)]
mod tests {
    use super::{plan_prefill, plan_prefill_capped};

    #[test]
    fn prefill_plan_takes_oldest_first_within_the_budget() {
        let fresh = |l: &[usize]| l.iter().map(|&l| (0, l)).collect::<Vec<_>>();
        assert_eq!(plan_prefill(&fresh(&[100, 0, 30, 500]), 512, 1), vec![(0, 100), (2, 30), (3, 382)]);
        assert_eq!(plan_prefill(&fresh(&[600, 10]), 512, 1), vec![(0, 512)]);
        assert_eq!(plan_prefill(&fresh(&[0, 0]), 512, 1), vec![]);
        assert_eq!(plan_prefill(&fresh(&[5, 5, 5]), 11, 1), vec![(0, 5), (1, 5), (2, 1)]);
    }

    #[test]
    fn prefill_plan_cuts_prompts_only_at_aligned_positions() {
        // 382 tokens of budget left for the third: it takes 320 (a multiple of 64), not 382.
        assert_eq!(plan_prefill(&[(0, 100), (0, 0), (0, 30), (0, 500)], 512, 64), vec![(0, 100), (2, 30), (3, 320)]);
        // A prompt 64 in, with 500 tokens of budget, continues to 512, not 564.
        assert_eq!(plan_prefill(&[(64, 1000)], 500, 64), vec![(0, 448)]);
        // A prompt's last piece needs no alignment; one whose aligned piece does not fit waits.
        assert_eq!(plan_prefill(&[(0, 500), (0, 40), (0, 100)], 600, 64), vec![(0, 500), (1, 40)]);
        assert_eq!(plan_prefill(&[(0, 70), (0, 70)], 100, 64), vec![(0, 70)]);
    }

    #[test]
    fn long_prompts_share_their_cap_and_short_ones_take_the_rest() {
        // Two long prompts (4096 and 3000 tokens) share 256 tokens; the short ones after them
        // take what the budget has left, in order (the last 68 of it: 64, aligned).
        let left = [(0, 4096), (0, 500), (128, 3000), (0, 200), (0, 400)];
        let long = [true, false, true, false, false];
        assert_eq!(plan_prefill_capped(&left, &long, 1024, 256, 64), vec![(0, 256), (1, 500), (3, 200), (4, 64)]);
        // The cap is aligned like the budget: 200 of it left a long prompt 128 in → 192.
        assert_eq!(plan_prefill_capped(&[(128, 3000), (0, 100)], &[true], 1024, 200, 64), vec![(0, 192), (1, 100)]);
        // A long prompt's last piece fits the cap as it is; none left, it waits.
        assert_eq!(plan_prefill_capped(&[(3968, 100), (0, 4096)], &[true, true], 1024, 256, 64), vec![(0, 100), (1, 128)]);
        assert_eq!(plan_prefill_capped(&[(0, 4096), (0, 64)], &[true], 1024, 0, 64), vec![(1, 64)]);
        // Without long marks it is plan_prefill.
        assert_eq!(plan_prefill_capped(&left, &[], 1024, 0, 64), plan_prefill(&left, 1024, 64));
    }
}
