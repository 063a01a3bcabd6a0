//! How the scheduler uses the prefix cache ([`super::prefix_cache`]): requests about to start
//! continue from their longest cached prefix (or wait for an older request that is about to
//! snapshot a longer one), and a finished chat turn is re-prefilled from its prompt's last
//! snapshot through its answer, so that the next turn, which re-sends both, finds them cached.
//! The re-prefill runs chunkwise like any prompt, so the snapshots it leaves hold the bits an
//! uncached prefill of the next turn computes (a snapshot of the decoded state would not).

use std::time::Instant;

use deltaserve_engine::SlotId;

use super::prefix_cache::{self, common_prefix};
use super::Scheduler;

/// A finished chat turn being prefilled again for the cache: `tokens` (its prompt, the first
/// `prompt` of them, and its answer) run from `done` to `end`, the last grid point, in `slot`,
/// from `ready` on.
#[derive(Debug)]
pub(super) struct Tail {
    pub slot: SlotId,
    pub tokens: Vec<u32>,
    pub prompt: usize,
    pub done: usize,
    pub end: usize,
    pub ready: Instant,
}

impl Scheduler {
    /// Restores cached prefixes into requests that have not started, and says which of them
    /// wait this step: those sharing more than their cached prefix, by a grid step, with an
    /// older request still prefilling that will snapshot it (identical prompts arriving
    /// together are prefilled once).
    pub(super) fn use_cache(&mut self) -> Vec<bool> {
        let mut waits = vec![false; self.requests.len()];
        self.give_up_tails_resent();
        let Some(cache) = self.cache.as_mut() else { return waits };
        let grid = cache.grid;
        for (i, waits_i) in waits.iter_mut().enumerate() {
            let r = &self.requests[i];
            if r.started || r.params.prompt_logprobs || r.seqs.iter().all(|s| s.finished) {
                continue;
            }
            let max = r.prompt.len() - 1;
            let wait = self.requests[..i].iter().any(|o| {
                if o.params.prompt_logprobs || o.prefilled >= o.prompt.len() || o.seqs.iter().all(|s| s.finished) {
                    return false;
                }
                let shared = common_prefix(&r.prompt, &o.prompt).min(max) / grid * grid;
                shared > r.prefilled && o.prefilled < shared
            });
            *waits_i = wait;
            if wait {
                continue;
            }
            if let Some(hit) = cache.lookup(&r.prompt, max).filter(|h| h.tokens > r.prefilled) {
                let slot = r.seqs[0].slot;
                match prefix_cache::restore(&mut self.pool, hit.snap, slot) {
                    Ok(true) => self.requests[i].prefilled = hit.tokens,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, %slot, "restoring a cached prefix failed; prefilling it"),
                }
            }
        }
        waits
    }

    /// Keeps a finished chat turn's slot to re-prefill `tokens` (its prompt and answer) from
    /// the longest cached prefix to the last grid point. False when there is nothing to gain
    /// or it would cost more than the answer plus one grid step (the prompt's snapshots are
    /// gone); the caller then frees the slot.
    pub(super) fn start_tail(&mut self, slot: SlotId, tokens: Vec<u32>, answer: usize) -> bool {
        let Some(cache) = self.cache.as_mut() else { return false };
        let end = tokens.len() / cache.grid * cache.grid;
        let hit = cache.lookup(&tokens, end);
        let start = hit.map_or(0, |h| h.tokens);
        if end <= start || end - start > answer + cache.grid {
            return false;
        }
        let slot = match hit {
            Some(h) => match prefix_cache::restore(&mut self.pool, h.snap, slot) {
                Ok(true) => slot,
                _ => return false,
            },
            None => {
                // A zeroed slot: the same index back from the free list, reserved anew.
                let _ = self.pool.release(slot);
                let Some(fresh) = self.pool.allocate() else { return false };
                if !matches!(self.pool.reserve(fresh, end), Ok(true)) {
                    let _ = self.pool.release(fresh);
                    return false;
                }
                fresh
            }
        };
        let ready = Instant::now() + self.cfg.prefix_cache.answer_delay;
        let prompt = tokens.len() - answer;
        self.tails.push(Tail { slot, tokens, prompt, done: start, end, ready });
        true
    }

    /// Gives up the re-prefills that a request not yet started continues: one that re-sends
    /// the tail through its last grid point prefills those tokens itself, from the same
    /// snapshot on, so to the same bits (and snapshots them on the way), in the pass it runs
    /// anyway; one that re-sends the turn's whole prompt but then parts from the answer (its
    /// text tokenized otherwise, or rendered otherwise by the chat template) is the next turn
    /// of that conversation, which the tail's later snapshots would not serve.
    fn give_up_tails_resent(&mut self) {
        let (requests, pool) = (&self.requests, &mut self.pool);
        self.tails.retain(|t| {
            // The prefix comparison only for requests not yet started: it walks whole prompts,
            // and every step asks.
            let resent = requests.iter().filter(|r| !r.started && !r.params.prompt_logprobs).any(|r| {
                let shared = common_prefix(&r.prompt, &t.tokens);
                shared >= t.end || (shared >= t.prompt && r.prompt.len() > t.prompt)
            });
            if resent {
                tracing::debug!(slot = %t.slot, tokens = t.end - t.done, "re-prefill given up: a new request re-sends or continues it");
                let _ = pool.release(t.slot);
            }
            !resent
        });
    }

    /// Whether a re-prefill is due (it would run in the next prefill pass).
    pub(super) fn a_tail_is_due(&self) -> bool {
        !self.tails.is_empty() && self.until_a_tail_is_ready().is_none()
    }

    /// How long the engine thread may wait for a message when only re-prefills not yet ready
    /// are left: until the first is ready (`None` when one is, or none is waiting).
    pub(super) fn until_a_tail_is_ready(&self) -> Option<std::time::Duration> {
        let first = self.tails.iter().map(|t| t.ready).min()?;
        let now = Instant::now();
        (first > now).then(|| first - now)
    }

    /// Records the tails' pieces of this step and frees the slots of those done.
    pub(super) fn end_tails(&mut self, ran: &[(usize, usize)]) {
        for &(i, take) in ran {
            if let Some(t) = self.tails.get_mut(i) {
                t.done = (t.done + take).min(t.end);
            }
        }
        let pool = &mut self.pool;
        self.tails.retain(|t| {
            let done = t.done >= t.end;
            if done {
                let _ = pool.release(t.slot);
            }
            !done
        });
    }

    /// Gives up the newest tails until `slots` sequence slots are free (requests come first).
    pub(super) fn cancel_tails_for(&mut self, slots: usize) {
        while self.free_slots() < slots {
            let Some(t) = self.tails.pop() else { return };
            let _ = self.pool.release(t.slot);
        }
    }

    /// Makes room for `blocks` KV blocks: tails first, then cached snapshots' blocks.
    pub(super) fn free_kv_for(&mut self, blocks: usize) {
        while self.pool.kv_blocks_available().saturating_sub(self.kv_reserved) < blocks {
            let Some(t) = self.tails.pop() else { break };
            let _ = self.pool.release(t.slot);
        }
        if let Some(c) = self.cache.as_mut() {
            c.free_blocks(&mut self.pool, blocks + self.kv_reserved);
        }
    }

    /// The cache's gauges and eviction count, recounted only when the index changed (counting
    /// the snapshots' KV blocks walks their tables).
    pub(super) fn publish_cache(&mut self) {
        let Some(c) = &self.cache else { return };
        if c.changes == self.cache_published {
            return;
        }
        self.cache_published = c.changes;
        let m = &self.metrics;
        m.prefix_cache_entries.set(c.entries() as i64);
        let bytes =
            self.pool.snapshots_used() * self.pool.bytes_per_snapshot() + self.pool.snapshot_kv_blocks() * self.pool.bytes_per_block();
        m.prefix_cache_memory_bytes.set(bytes as i64);
        let seen = m.prefix_cache_evictions.get();
        if c.evictions > seen {
            m.prefix_cache_evictions.inc_by(c.evictions - seen);
        }
        m.prefix_cache_host_entries.set(c.host_entries() as i64);
        m.prefix_cache_spills.inc_by(c.spills.saturating_sub(m.prefix_cache_spills.get()));
    }
}
