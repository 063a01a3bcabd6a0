//! Which requests run: cancellation and timeouts first, then first come, first served into
//! free slots (a request's `n` choices need `n` slots).

use std::time::Instant;

use super::sequence::Seq;
use super::{Active, Scheduler, SchedulerError};

impl Scheduler {
    /// Frees requests whose client went away or whose deadline passed, and drops waiting
    /// requests whose client already left.
    pub(super) fn drop_cancelled(&mut self) {
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
            if r.events.is_closed() {
                self.metrics.client_disconnects.inc();
                tracing::info!(request = %r.id, "client disconnected; request cancelled");
                for s in &mut r.seqs {
                    s.finished = true;
                }
            } else if now >= r.deadline {
                r.fail(SchedulerError::Timeout(self.cfg.request_timeout.as_secs()));
            }
        }
        self.retire_all();
    }

    /// Slots neither in use nor promised to a prefilling request's other choices.
    pub(super) fn free_slots(&self) -> usize {
        self.pool.capacity() - self.pool.used() - self.reserved
    }

    /// KV tokens one choice of a request may fill: its prompt and `max_tokens`.
    fn kv_tokens(&self, prompt: usize, max_tokens: usize) -> usize {
        (prompt + max_tokens).min(self.cfg.max_model_len)
    }

    /// First come, first served: the head waits until all its `n` slots are free and, for
    /// hybrid models, until KV blocks for every choice's prompt and `max_tokens` can be
    /// promised to it; so a running sequence never runs short of blocks.
    pub(super) fn admit(&mut self) {
        while let Some(head) = self.waiting.front() {
            let (n, kv_tokens) = (head.params.n, self.kv_tokens(head.prompt.len(), head.params.max_tokens));
            // Cache re-prefills and cached KV blocks give way to requests.
            self.cancel_tails_for(n);
            if n > self.free_slots() {
                break;
            }
            let kv_blocks = self.pool.blocks_for(kv_tokens);
            if n * kv_blocks > self.pool.kv_blocks_available().saturating_sub(self.kv_reserved) {
                self.free_kv_for(n * kv_blocks);
            }
            if n * kv_blocks > self.pool.kv_blocks_available().saturating_sub(self.kv_reserved) {
                break;
            }
            let Some(r) = self.waiting.pop_front() else {
                break;
            };
            let Some(slot) = self.pool.allocate() else {
                self.waiting.push_front(r);
                break;
            };
            // Cannot fail: the blocks were counted above.
            if !matches!(self.pool.reserve(slot, kv_tokens), Ok(true)) {
                let _ = self.pool.release(slot);
                self.waiting.push_front(r);
                break;
            }
            let kv_reserved = (r.params.n - 1) * kv_blocks;
            self.kv_reserved += kv_reserved;
            let now = Instant::now();
            self.metrics.request_queue_time.observe(now.duration_since(r.arrived).as_secs_f64());
            let reserved = r.params.n - 1;
            self.reserved += reserved;
            let seq0 = Seq::new(&r.params, &r.prompt, 0, slot);
            tracing::debug!(request = %r.id, %slot, prompt = r.prompt.len(), n = r.params.n, "admitted");
            self.requests.push(Active {
                id: r.id,
                deadline: r.arrived + self.cfg.request_timeout,
                prompt: r.prompt,
                params: r.params,
                events: r.events,
                arrived: r.arrived,
                prefilled: 0,
                long: false,
                started: false,
                prev_logits: None,
                seqs: vec![seq0],
                reserved,
                kv_tokens,
                kv_reserved,
                ticket: r.ticket,
                finished_reason: None,
                failed: false,
            });
        }
    }
}
