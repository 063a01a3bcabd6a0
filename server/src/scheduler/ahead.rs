//! Decode steps launched ahead. When the next engine step can only be another decode step of
//! the same sequences (nothing waits to be admitted or prefilled, nor in the engine's channel; no
//! cache re-prefill is due; no grammar needs the token just drawn), that step is launched on the
//! GPU as soon as this step's tokens are drawn, and this step's tokens are emitted (detokenized,
//! checked against the stop rules, sent) while it runs: the host's work between two steps no
//! longer leaves the GPU idle. The step launched ahead is drawn first thing in the next engine
//! step, and the one after it is launched ahead in turn while those conditions hold, so every
//! step's emit overlaps the next step. A row whose sequence finished or left meanwhile is not
//! drawn; its slot advanced one token more, which nothing reads (a freed slot is zeroed when
//! handed out again, a finished turn's cache re-prefill starts from a snapshot or a zeroed slot,
//! and the KV position written is within the blocks reserved for the request).

use std::collections::HashMap;
use std::time::Instant;

use deltaserve_engine::{EngineError, Sampled, SlotId, Tensor};

use super::batch::Drawer;
use super::{ms, Scheduler, SchedulerError};

/// A decode step on its way: its logits (not yet on the host; on a GPU the decode graph's own
/// buffer, drawn before any other decode step runs) and its `(slot, token)` rows.
pub(super) struct Ahead {
    logits: Tensor,
    rows: Vec<(SlotId, u32)>,
    launched: Instant,
}

impl Scheduler {
    /// Launches the next decode step of the sequences that drew `results` (`rows`: their
    /// `(request, choice)`), fed the tokens just drawn, when the decode-ahead mode is on and the
    /// next engine step could run nothing else first. Not when every row ends now by length
    /// (that step would be wasted, and a client's next request would wait for it). A failed
    /// launch returns the rows whose requests fail (once their tokens are emitted).
    pub(super) fn launch_ahead(
        &mut self,
        rows: &[(usize, usize)],
        results: &[Result<Sampled, EngineError>],
    ) -> Result<(), (Vec<Drawer>, SchedulerError)> {
        if !self.cfg.decode_ahead || !self.waiting.is_empty() || self.a_tail_is_due() {
            return Ok(());
        }
        let busy = |r: &super::Active| r.prefilled < r.prompt.len() || r.seqs.iter().any(|s| !s.finished && s.constraint.is_some());
        if self.requests.iter().any(busy) {
            return Ok(());
        }
        let (mut next, mut who, mut goes_on) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()), false);
        for (&(ri, si), drawn) in rows.iter().zip(results) {
            let Ok(d) = drawn else { continue };
            let r = &self.requests[ri];
            let s = &r.seqs[si];
            goes_on |= !s.ends_by_length_after_one(r.prompt.len(), r.params.max_tokens, self.cfg.max_model_len);
            who.push((ri, si, next.len()));
            next.push((s.slot, d.token));
        }
        if !goes_on {
            return Ok(());
        }
        let launched = Instant::now();
        match self.engine.decode_in_place(&mut self.pool, &next) {
            Ok(logits) => {
                self.ahead = Some(Ahead { logits, rows: next, launched });
                Ok(())
            }
            Err(e) => Err((who, e.into())),
        }
    }

    /// Draws and emits the decode step launched ahead, if any: each row for the sequence in its
    /// slot, when that sequence still runs and was to be fed exactly that token. The next step is
    /// launched ahead before the emit when nothing else could run first (`arrivals`: whether
    /// requests wait in the engine's channel).
    pub(super) fn finish_ahead(&mut self, arrivals: impl Fn() -> bool) {
        let Some(a) = self.ahead.take() else { return };
        let running: HashMap<SlotId, (usize, usize)> = self
            .requests
            .iter()
            .enumerate()
            .flat_map(|(ri, r)| r.seqs.iter().enumerate().filter(|(_, s)| !s.finished).map(move |(si, s)| (s.slot, (ri, si))))
            .collect();
        let who: Vec<Drawer> = a
            .rows
            .iter()
            .enumerate()
            .filter_map(|(row, (slot, token))| {
                let &(ri, si) = running.get(slot)?;
                (self.requests[ri].seqs[si].pending == Some(*token)).then_some((ri, si, row))
            })
            .collect();
        if who.is_empty() {
            return;
        }
        let drawn = self.draw_launch_emit(Ok(a.logits), &who, arrivals);
        let secs = a.launched.elapsed().as_secs_f64();
        self.metrics.step_duration.with_label_values(&["decode"]).observe(secs);
        self.metrics.decode_batch_size.observe(a.rows.len() as f64);
        tracing::trace!(batch = a.rows.len(), drawn_ms = ms(drawn), ms = secs * 1e3, ahead = true, "decode step");
    }
}
