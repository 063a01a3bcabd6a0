//! Start-up warm-up on a GPU: runs once what serving will run, so that no request pays a
//! one-time cost. On the device host the first GEMM of each row bucket costs 3–20 ms (cublasLt's
//! heuristic and loading its kernel), and the first decode step of each batch size runs eagerly
//! and the second captures its CUDA graph; without the warm-up the first requests of a fresh
//! server paid all of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::error::Result;
use crate::{Engine, SnapshotAt, StatePool};

/// What [`Engine::warm_up`] ran.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WarmUp {
    /// Prefill passes (one per row bucket).
    pub passes: usize,
    /// Decode batch sizes run twice (captured when CUDA graphs are on).
    pub batch_sizes: usize,
    /// Prefill graph shapes (bucket, sequences) run twice: once from fixed tables, then
    /// captured.
    pub prefill_graphs: usize,
    /// Mixed pass graph shapes (the largest bucket within the step budget in 1 to 4 pieces,
    /// each decode bucket up to the batch) run twice: once from fixed tables, then captured.
    pub mixed_graphs: usize,
    /// Wall seconds.
    pub secs: f64,
    /// Whether `stop` cut it short.
    pub stopped: bool,
}

/// The token counts of the warm-up's prefill passes: 16, 32 (their GEMMs' buckets), then every
/// multiple of 64 up to `max_pass_tokens` rounded up: the row buckets the GPU's cublasLt GEMMs
/// choose their algorithms for.
pub fn pass_lengths(max_pass_tokens: usize) -> Vec<usize> {
    let top = max_pass_tokens.max(1).div_ceil(64) * 64;
    [16, 32].into_iter().chain((64..=top).step_by(64)).collect()
}

impl Engine {
    /// On a GPU, one eager prefill pass of each length of [`pass_lengths`] (the 64-token one
    /// also writing a snapshot when `pool` has a snapshot slot), two decode steps of every
    /// batch size from 1 to `max_batch`, two passes of every prefill graph shape with up
    /// to `max_batch` sequences, and two of each mixed pass shape that a full step budget in 1
    /// to 4 pieces beside up to `max_batch` decode rows pads to, in free slots of `pool`, all
    /// released after. Nothing on the CPU. Slots it cannot get (or KV blocks it cannot
    /// reserve) shorten it; errors end it. `stop` set (a shutdown during start-up) ends it
    /// before its next pass or step.
    pub fn warm_up(&self, pool: &mut StatePool, max_pass_tokens: usize, max_batch: usize, stop: &AtomicBool) -> Result<WarmUp> {
        let mut done = WarmUp::default();
        if !self.model().device().is_cuda() {
            return Ok(done);
        }
        let halt = || stop.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let vocab = self.model().config().common.vocab_size as u32;
        let lengths = pass_lengths(max_pass_tokens);
        let longest = lengths.last().copied().unwrap_or(64) as u32;
        let tokens: Vec<u32> = (0..longest).map(|i| (i * 7919 + 13) % vocab).collect();
        for t in lengths {
            if halt() {
                break;
            }
            let Some(slot) = pool.allocate() else { break };
            let snap = (t == 64).then(|| pool.take_snapshot()).flatten();
            let ran = match pool.reserve(slot, t) {
                Ok(true) => {
                    let at: Vec<SnapshotAt> = snap.map(|snap| SnapshotAt { seq: 0, tokens: 64, snap }).into_iter().collect();
                    Some(self.prefill_eager(pool, &[(slot, &tokens[..t])], &at))
                }
                _ => None,
            };
            if let Some(s) = snap {
                pool.drop_snapshot(s)?;
            }
            pool.release(slot)?;
            match ran {
                Some(r) => {
                    r?;
                    done.passes += 1;
                }
                None => break,
            }
        }
        for b in 1..=max_batch {
            if halt() {
                break;
            }
            let slots: Vec<_> = (0..b).map_while(|_| pool.allocate()).collect();
            let mut ok = slots.len() == b;
            for &s in &slots {
                ok = ok && matches!(pool.reserve(s, 2), Ok(true));
            }
            let batch: Vec<_> = slots.iter().map(|&s| (s, 1u32.min(vocab - 1))).collect();
            let ran = if ok { self.decode(pool, &batch).and_then(|_| self.decode(pool, &batch)).map(|_| ()) } else { Ok(()) };
            for s in slots {
                pool.release(s)?;
            }
            ran?;
            if !ok {
                break;
            }
            done.batch_sizes += 1;
        }
        done.prefill_graphs = self.warm_prefill_graphs(pool, max_batch, &halt)?;
        done.mixed_graphs = self.warm_mixed_graphs(pool, max_pass_tokens, max_batch, &halt)?;
        done.stopped = halt();
        // Everything queued has run before the first request is timed.
        self.synchronize()?;
        done.secs = t0.elapsed().as_secs_f64();
        Ok(done)
    }

    /// Runs every prefill graph shape twice (captured the second time), with up to
    /// `max_seqs` sequences (and one slot left for the padding): each bucket's rows split over
    /// the sequences. Returns the shapes run; a shape whose slots are not free, or `halt()`,
    /// ends it.
    fn warm_prefill_graphs(&self, pool: &mut StatePool, max_seqs: usize, halt: &dyn Fn() -> bool) -> Result<usize> {
        let mut shapes = 0;
        let vocab = self.model().config().common.vocab_size as u32;
        // A pass's padding needs a free slot of its own.
        let most = crate::prefill_graph::MAX_SEQS.min(max_seqs).min((pool.capacity() - pool.used()).saturating_sub(1));
        for rows in self.prefill_graph_buckets() {
            let tokens: Vec<u32> = (0..rows as u32).map(|i| (i * 7919 + 13) % vocab).collect();
            for seqs in 1..=most {
                if halt() {
                    return Ok(shapes);
                }
                let lens = split_evenly(rows, seqs);
                let slots: Vec<_> = (0..seqs).map_while(|_| pool.allocate()).collect();
                let mut ok = slots.len() == seqs;
                for (&s, &n) in slots.iter().zip(&lens) {
                    ok = ok && matches!(pool.reserve(s, 2 * n), Ok(true));
                }
                let mut ran = Ok(());
                if ok {
                    let batch = pieces(&slots, &lens, &tokens);
                    ran = self.prefill_many(pool, &batch).and_then(|_| self.prefill_many(pool, &batch)).map(|_| ());
                }
                for s in slots {
                    pool.release(s)?;
                }
                ran?;
                if !ok {
                    return Ok(shapes);
                }
                shapes += 1;
            }
        }
        Ok(shapes)
    }

    /// Runs twice (captured the second time) the mixed passes of the largest mixed bucket
    /// within `max_pass_tokens`, split over 1 to [`MIXED_WARM_SEQS`] pieces, beside each decode
    /// bucket's count of rows up to `max_batch` (above 64 rows, one piece only): the shapes a
    /// burst of arrivals meets while the first streams decode. Returns the shapes run; a shape
    /// whose slots are not free ends that piece count, `halt()` all of them.
    fn warm_mixed_graphs(&self, pool: &mut StatePool, max_pass_tokens: usize, max_batch: usize, halt: &dyn Fn() -> bool) -> Result<usize> {
        use crate::prefill_graph::{decode_bucket, MAX_DECODE_ROWS, MAX_SEQS};
        let Some(rows) = self.mixed_graph_buckets().into_iter().rfind(|&r| r <= max_pass_tokens) else { return Ok(0) };
        let vocab = self.model().config().common.vocab_size as u32;
        let tokens: Vec<u32> = (0..rows as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let mut shapes = 0;
        for seqs in 1..=MIXED_WARM_SEQS.min(MAX_SEQS) {
            let lens = split_evenly(rows, seqs);
            let mut d = 1;
            while d <= max_batch.min(MAX_DECODE_ROWS) && (seqs == 1 || d <= 64) {
                if halt() {
                    return Ok(shapes);
                }
                // The pieces, the decode rows, and one free slot for the padding.
                let slots: Vec<_> = (0..seqs + d).map_while(|_| pool.allocate()).collect();
                let mut ok = slots.len() == seqs + d && pool.capacity() > pool.used();
                for (i, &s) in slots.iter().enumerate() {
                    ok = ok && matches!(pool.reserve(s, if i < seqs { 2 * lens[i] } else { 2 }), Ok(true));
                }
                let mut ran = Ok(());
                if ok {
                    let step: Vec<_> = slots[seqs..].iter().map(|&s| (s, 1u32.min(vocab - 1))).collect();
                    let batch = pieces(&slots[..seqs], &lens, &tokens);
                    ran = self
                        .prefill_and_decode(pool, &batch, &[], &step)
                        .and_then(|_| self.prefill_and_decode(pool, &batch, &[], &step))
                        .map(|_| ());
                }
                for s in slots {
                    pool.release(s)?;
                }
                ran?;
                if !ok {
                    break;
                }
                shapes += 1;
                d = decode_bucket(d + 1);
            }
        }
        Ok(shapes)
    }
}

/// `rows` split into `seqs` lengths that differ by one at most.
fn split_evenly(rows: usize, seqs: usize) -> Vec<usize> {
    (0..seqs).map(|i| rows / seqs + usize::from(i < rows % seqs)).collect()
}

/// Consecutive pieces of `tokens`, `lens[i]` long, one for each of `slots`.
fn pieces<'a>(slots: &[crate::SlotId], lens: &[usize], tokens: &'a [u32]) -> Vec<(crate::SlotId, &'a [u32])> {
    let mut from = 0;
    slots
        .iter()
        .zip(lens)
        .map(|(&s, &n)| {
            from += n;
            (s, &tokens[from - n..from])
        })
        .collect()
}

/// Prompt pieces a warmed mixed pass holds at most: a burst of short prompts shares the step
/// budget 2 to 4 ways.
const MIXED_WARM_SEQS: usize = 4;

#[cfg(test)]
mod tests {
    use super::pass_lengths;

    #[test]
    fn pass_lengths_cover_every_row_bucket_up_to_the_budget() {
        assert_eq!(pass_lengths(512), vec![16, 32, 64, 128, 192, 256, 320, 384, 448, 512]);
        assert_eq!(pass_lengths(100), vec![16, 32, 64, 128]);
        assert_eq!(pass_lengths(0), vec![16, 32, 64]);
    }
}
