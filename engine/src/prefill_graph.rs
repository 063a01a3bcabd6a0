//! CUDA graphs of short prefill passes.
//!
//! A prefill pass of a few dozen tokens (a chat turn continued from a prefix-cache snapshot, a
//! short prompt) is launch-bound: some 300 launches whose host work takes 3–5 ms on the device
//! host, against about 1 ms of GPU work. Such a pass is padded to a row bucket (64, 128, 256, …
//! up to a maximum) and replayed from a CUDA graph captured once per bucket and sequence count.
//!
//! - **Padding** is one more sequence, in a free slot lent for the pass ([`StatePool`]'s
//!   scratch), so every kernel sees an ordinary packing and the real sequences' rows, states
//!   and snapshots are computed as in an eager pass of the same rows.
//! - **Inputs** live in fixed device buffers that a replay overwrites first: the token ids, the
//!   packing's tables ([`PackedTables`]: offsets, slots, chunks, snapshot rows) and the rows
//!   whose logits come back. The logits land in a fixed buffer and are copied out.
//! - **Capture:** as with decode graphs, a shape runs once eagerly from fixed tables (filling
//!   candle's cache of launch parameters, since a capture can upload nothing), is captured the
//!   second time, and replays from then on. A capture that fails leaves the shape eager, with a
//!   warning.
//!
//! Only models whose every layer has a fixed-table path take part
//! ([`CausalLm::prefill_tables_supported`]), unsplit. The GEMMs of a padded pass run at the
//! bucket's row count, so its logits equal an eager pass's within the kernels' rounding, not
//! bit for bit (`--batch-invariant` passes run eagerly).

#[cfg(feature = "cuda")]
pub use graphs::PrefillGraphs;

use deltaserve_kernels::PREFILL_CHUNK;

/// Sequences a captured pass may hold (its padding not counted).
pub const MAX_SEQS: usize = 8;

/// A captured pass's shape: padded rows and real sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Rows, padding included: a power of two times 64.
    pub rows: usize,
    /// Sequences, padding not included.
    pub seqs: usize,
}

/// The row buckets passes pad to: 64, 128, 256, … up to a maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    /// Largest padded pass; 0: none.
    max_rows: usize,
}

impl Buckets {
    /// Buckets for passes of up to `max_tokens` tokens (rounded down to a bucket; below 64:
    /// none).
    pub fn new(max_tokens: usize) -> Self {
        let max_rows = if max_tokens < PREFILL_CHUNK { 0 } else { PREFILL_CHUNK << (max_tokens / PREFILL_CHUNK).ilog2() };
        Self { max_rows }
    }

    /// Every bucket, smallest first.
    pub fn all(&self) -> Vec<usize> {
        std::iter::successors((self.max_rows > 0).then_some(PREFILL_CHUNK), |&r| (r < self.max_rows).then_some(2 * r)).collect()
    }

    /// The shape a pass of `seqs` sequences and `tokens` tokens in all pads to, if any.
    pub fn shape_of(&self, seqs: usize, tokens: usize) -> Option<Shape> {
        let rows = tokens.max(1).next_power_of_two().max(PREFILL_CHUNK);
        (rows <= self.max_rows && (1..=MAX_SEQS).contains(&seqs)).then_some(Shape { rows, seqs })
    }
}

#[cfg(feature = "cuda")]
mod graphs {
    use std::collections::HashSet;

    use candle_core::{CudaDevice, DType, Device, Tensor};
    use deltaserve_kernels::cuda::graph::Graph;
    use deltaserve_kernels::ops::PrefillAlgo;
    use deltaserve_kernels::{Capture, PackedTables};

    use super::{Buckets, Shape};
    use crate::decode_graph::record_graph;
    use crate::error::Result;
    use crate::models::batch::Packed;
    use crate::models::CausalLm;
    use crate::state::{SlotId, SnapshotAt, StatePool};

    /// Captured shapes kept at once (least recently used first out).
    const MAX_GRAPHS: usize = 64;

    /// One captured shape and the buffers its graph reads and writes.
    struct Entry {
        shape: Shape,
        graph: Graph,
        /// `[rows]` u32.
        ids: Tensor,
        tables: PackedTables,
        /// `[seqs]` u32: each sequence's last row.
        last: Tensor,
        /// `[seqs, vocab]` f32.
        logits: Tensor,
        /// Keeps the weights the graph reads alive as long as the graph.
        _model: CausalLm,
    }

    /// Captured short prefill passes of one model over one state pool.
    pub struct PrefillGraphs {
        buckets: Buckets,
        /// The pool whose buffers the captured graphs write.
        pool: Option<u64>,
        /// Most recently used last.
        entries: Vec<Entry>,
        /// Shapes run once from fixed tables (ready to capture).
        warm: HashSet<Shape>,
        /// Shapes whose capture failed (stay eager).
        failed: HashSet<Shape>,
    }

    impl std::fmt::Debug for PrefillGraphs {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("PrefillGraphs").field("buckets", &self.buckets.all()).field("captured", &self.captured()).finish()
        }
    }

    /// What a pass does with the rows of its fixed buffers.
    struct Inputs {
        /// Offsets and slots, the padding sequence last.
        cu: Vec<usize>,
        slots: Vec<usize>,
        captures: Vec<Capture>,
        /// `[rows]`, the padding's tokens 0.
        ids: Vec<u32>,
        /// Each real sequence's last row.
        last: Vec<u32>,
        /// Each slot's tokens run before the pass, padding included.
        starts: Vec<usize>,
    }

    impl PrefillGraphs {
        /// Graphs for passes that pad to one of `buckets`.
        pub fn new(buckets: Buckets) -> Self {
            Self { buckets, pool: None, entries: Vec::new(), warm: HashSet::new(), failed: HashSet::new() }
        }

        /// The buckets passes pad to.
        pub fn buckets(&self) -> Buckets {
            self.buckets
        }

        /// The shapes with a captured graph.
        pub fn captured(&self) -> Vec<Shape> {
            self.entries.iter().map(|e| e.shape).collect()
        }

        /// Runs a packed prefill (as [`CausalLm::prefill_many_with`]) from a graph when it fits
        /// one; `Ok(None)` when it does not, or when no slot is free for its padding or its capture
        /// failed: the caller runs it eagerly. Returns `[S, vocab]` f32 logits, owned by the caller.
        pub fn prefill(
            &mut self,
            model: &CausalLm,
            pool: &mut StatePool,
            batch: &[(SlotId, &[u32])],
            algo: PrefillAlgo,
            snapshots: &[SnapshotAt],
        ) -> Result<Option<Tensor>> {
            let Device::Cuda(dev) = model.device() else { return Ok(None) };
            if !model.prefill_tables_supported() || pool.is_host() || deltaserve_kernels::ops::batch_invariant() {
                return Ok(None);
            }
            let (cu, slots, captures) = model.check_prefill(pool, batch, snapshots)?;
            let Some(shape) = self.buckets.shape_of(batch.len(), cu[cu.len() - 1]) else { return Ok(None) };
            if self.failed.contains(&shape) {
                return Ok(None);
            }
            if self.pool != Some(pool.id()) {
                *self = Self { pool: Some(pool.id()), ..Self::new(self.buckets) };
            }
            let Some(pad) = pool.lend_scratch() else { return Ok(None) };
            let inputs = Inputs::new(pool, batch, shape, (cu, slots, captures), pad);
            let _span = tracing::debug_span!("prefill_graph", rows = shape.rows, seqs = shape.seqs).entered();
            let out = self.run(model, dev, pool, shape, algo, &inputs);
            if matches!(out, Ok(Some(_))) {
                for s in snapshots {
                    pool.seal(s.snap, inputs.slots[s.seq], inputs.starts[s.seq] + s.tokens);
                }
            }
            pool.return_scratch(pad);
            out
        }

        /// Replays, runs eagerly from fixed tables, or captures `shape`.
        fn run(
            &mut self,
            model: &CausalLm,
            dev: &CudaDevice,
            pool: &mut StatePool,
            shape: Shape,
            algo: PrefillAlgo,
            x: &Inputs,
        ) -> Result<Option<Tensor>> {
            let lens: Vec<usize> = x.cu.windows(2).map(|w| w[1] - w[0]).collect();
            if let Some(i) = self.entries.iter().position(|e| e.shape == shape) {
                let entry = self.entries.remove(i);
                let out = replay(&entry, x);
                if out.is_ok() {
                    pool.advance(&x.slots, &lens);
                }
                self.entries.push(entry);
                return out.map(Some);
            }
            let device = Device::Cuda(dev.clone());
            let tables = PackedTables::new(shape.rows, shape.seqs + 1, model.config().num_householder(), &device)?;
            tables.fill(&x.cu, &x.slots, &x.captures)?;
            let ids = Tensor::new(x.ids.as_slice(), &device)?;
            let last = Tensor::new(x.last.as_slice(), &device)?;
            let seqs = Packed { cu: &x.cu, slots: &x.slots, captures: &x.captures, tables: Some(&tables) };
            if !self.warm.contains(&shape) {
                // The eager run fills candle's parameter cache for the capture to come.
                let _cache = dev.enable_cuda_graph_htod_cache();
                let logits = model.prefill_fixed(pool, &ids, seqs, algo, &last)?;
                self.warm.insert(shape);
                return Ok(Some(logits));
            }
            let logits = Tensor::zeros((shape.seqs, model.config().common.vocab_size), DType::F32, &device)?;
            tracing::debug!(rows = shape.rows, seqs = shape.seqs, "capturing a prefill graph");
            // The pass reads `ids`, the fixed tables and `last`; its logits go into `logits`.
            match record_graph(dev, "prefill", &logits, || model.prefill_fixed(pool, &ids, seqs, algo, &last)) {
                Ok(graph) => {
                    let entry = Entry { shape, graph, ids, tables, last, logits, _model: model.clone() };
                    if self.entries.len() >= MAX_GRAPHS {
                        self.entries.remove(0);
                    }
                    // The capture ran nothing: this pass's work is the first replay (inputs in place).
                    entry.graph.launch()?;
                    let out = entry.logits.copy()?;
                    self.entries.push(entry);
                    Ok(Some(out))
                }
                Err(e) => {
                    // The recording counted the pass; nothing ran, so it did not happen.
                    for (&s, &n) in x.slots.iter().zip(&x.starts) {
                        pool.set_seen(s, n);
                    }
                    tracing::warn!(rows = shape.rows, seqs = shape.seqs, error = %e, "prefill graph capture failed; this shape stays eager");
                    self.failed.insert(shape);
                    Ok(None)
                }
            }
        }
    }

    impl Inputs {
        /// The padded packing of `batch` in `shape`, its padding in slot `pad`.
        fn new(
            pool: &StatePool,
            batch: &[(SlotId, &[u32])],
            shape: Shape,
            (mut cu, mut slots, captures): (Vec<usize>, Vec<usize>, Vec<Capture>),
            pad: usize,
        ) -> Self {
            let last = cu[1..].iter().map(|&c| (c - 1) as u32).collect();
            let mut ids: Vec<u32> = batch.iter().flat_map(|(_, t)| t.iter().copied()).collect();
            ids.resize(shape.rows, 0);
            cu.push(shape.rows);
            slots.push(pad);
            let starts = slots.iter().map(|&s| pool.seen(SlotId(s))).collect();
            Self { cu, slots, captures, ids, last, starts }
        }
    }

    /// Writes this pass's tokens, tables and last rows into the graph's inputs, launches it, and
    /// copies the logits out (the next replay overwrites the graph's buffer).
    fn replay(entry: &Entry, x: &Inputs) -> Result<Tensor> {
        entry.tables.fill(&x.cu, &x.slots, &x.captures)?;
        deltaserve_kernels::cuda::write_from_host(&entry.ids, &x.ids)?;
        deltaserve_kernels::cuda::write_from_host(&entry.last, &x.last)?;
        entry.graph.launch()?;
        Ok(entry.logits.copy()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_pad_to_power_of_two_buckets_up_to_the_maximum() {
        let g = Buckets::new(300);
        assert_eq!(g.all(), vec![64, 128, 256]);
        assert_eq!(g.shape_of(1, 1), Some(Shape { rows: 64, seqs: 1 }));
        assert_eq!(g.shape_of(1, 64), Some(Shape { rows: 64, seqs: 1 }));
        assert_eq!(g.shape_of(2, 65), Some(Shape { rows: 128, seqs: 2 }));
        assert_eq!(g.shape_of(1, 256), Some(Shape { rows: 256, seqs: 1 }));
        assert_eq!(g.shape_of(1, 257), None);
        assert_eq!(g.shape_of(MAX_SEQS + 1, 64), None);
        assert_eq!(Buckets::new(63).all(), Vec::<usize>::new());
        assert_eq!(Buckets::new(0).shape_of(1, 1), None);
    }
}
