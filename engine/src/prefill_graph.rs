//! CUDA graphs of short prefill passes and of mixed passes.
//!
//! A prefill pass of a few dozen tokens (a chat turn continued from a prefix-cache snapshot, a
//! short prompt) is launch-bound: some 300 launches whose host work takes 3–5 ms on the device
//! host, against about 1 ms of GPU work. So is a mixed pass (a prompt piece of up to the step
//! budget and the running sequences' decode rows, `CausalLm::prefill_and_decode`): its launches
//! take longer than the GPU's work, which sets the inter-token latency of every running stream
//! while prompts arrive. Such a pass is padded to a shape and replayed from a CUDA graph
//! captured once per shape.
//!
//! - **Padding.** Prompt rows pad to a row bucket ([`pad_rows`]: 64, 128, 256, 512, then
//!   multiples of 128, up to a maximum) with one
//!   more sequence, and decode rows to a decode bucket ([`decode_bucket`]) with one more row
//!   each, all in free slots lent for the pass ([`StatePool`]'s scratch), so every kernel sees
//!   an ordinary packing and the real sequences' rows, states and snapshots are computed as in
//!   an eager pass of the same rows.
//! - **Inputs** live in fixed device buffers that a replay overwrites first: the token ids, the
//!   packing's tables ([`PackedTables`]: offsets, slots, chunks, snapshot rows), the decode
//!   rows' slots and the rows whose logits come back. The logits land in a fixed buffer and are
//!   copied out.
//! - **Capture:** as with decode graphs, a shape runs once eagerly from fixed tables (filling
//!   candle's cache of launch parameters, since a capture can upload nothing), is captured the
//!   second time, and replays from then on. A capture that fails leaves the shape eager, with a
//!   warning.
//!
//! - **KV cache** (hybrids): the blocks of every row, the padding's included, are taken on the
//!   host before the pass (the padding's go back with its lent slot), and the attention layers
//!   read each row's slot and position and their prefill tile lists (padded to the shape's
//!   largest count with empty tiles) from a fixed buffer ([`crate::kv_plan::FixedKv`]).
//!
//! - **MoE blocks** route on the device with grids sized by capacities, as in a decode graph;
//!   the padding's rows are routed too and change no real row.
//!
//! Every model on a GPU takes part ([`CausalLm::prefill_tables_supported`]), unsplit. The GEMMs
//! of a padded pass run at the padded row count, so its logits equal an eager pass's within the
//! kernels' rounding, not bit for bit (`--batch-invariant` passes run eagerly).

#[cfg(feature = "cuda")]
pub use graphs::PrefillGraphs;

use deltaserve_kernels::PREFILL_CHUNK;

/// Sequences a captured pass may hold (its padding not counted).
pub const MAX_SEQS: usize = 8;

/// Decode rows a captured mixed pass may hold (padding included).
pub const MAX_DECODE_ROWS: usize = 256;

/// A captured pass's shape: padded prompt rows, real sequences, padded decode rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Prompt rows, padding included ([`pad_rows`]).
    pub rows: usize,
    /// Sequences, padding not included.
    pub seqs: usize,
    /// Decode rows after the prompt rows, padding included ([`decode_bucket`]); 0 for a
    /// prefill pass.
    pub decode: usize,
}

/// The decode rows a mixed pass of `b` running sequences pads to: 1, 2, 4 or 8 up to 8, then
/// the next multiple of 16. (A padded decode row costs one state's read and write, little
/// beside the prompt rows; finer buckets would capture more graphs.)
pub fn decode_bucket(b: usize) -> usize {
    if b <= 8 {
        b.next_power_of_two()
    } else {
        b.div_ceil(16) * 16
    }
}

/// The row buckets passes pad to: 64, 128, 256, … up to a maximum, for prefill passes and for
/// mixed passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    /// Largest padded prefill pass; 0: none.
    max_rows: usize,
    /// Largest padded mixed pass's prompt rows; 0: none.
    max_mixed_rows: usize,
}

/// Largest row bucket that doubles: past it, buckets step by [`ROW_STEP`].
const DOUBLING_UNTIL: usize = 8 * PREFILL_CHUNK;
/// Rows between the buckets past [`DOUBLING_UNTIL`]: the padding (one more sequence, whose
/// chunks the state pass walks one after another like any sequence's) spans at most two chunks.
/// Doubling there (1,024 rows for a 600-token pass) made the pass slower than running it
/// eagerly (`benches/results/h200-chat_graph_tokens-2026-11-29/`).
const ROW_STEP: usize = 2 * PREFILL_CHUNK;

/// The rows a pass of `tokens` prompt tokens pads to: 64, 128, 256 or 512, then the next
/// multiple of 128.
pub fn pad_rows(tokens: usize) -> usize {
    if tokens <= DOUBLING_UNTIL {
        tokens.max(1).next_power_of_two().max(PREFILL_CHUNK)
    } else {
        tokens.div_ceil(ROW_STEP) * ROW_STEP
    }
}

/// The largest bucket of at most `max_tokens` rows (below 64: 0, none).
fn top_bucket(max_tokens: usize) -> usize {
    buckets_up_to(max_tokens).last().copied().unwrap_or(0)
}

/// Every bucket of at most `max_rows` rows: 64, 128, 256, 512, 640, 768, … (each the
/// [`pad_rows`] of one row more than the one before).
fn buckets_up_to(max_rows: usize) -> Vec<usize> {
    let next = |&r: &usize| Some(pad_rows(r + 1)).filter(|&n| n <= max_rows);
    std::iter::successors((max_rows >= PREFILL_CHUNK).then_some(PREFILL_CHUNK), next).collect()
}

impl Buckets {
    /// Buckets for prefill passes of up to `max_tokens` tokens and for mixed passes of up to
    /// `max_mixed_tokens` prompt tokens (each rounded down to a bucket; below 64: none).
    pub fn new(max_tokens: usize, max_mixed_tokens: usize) -> Self {
        Self { max_rows: top_bucket(max_tokens), max_mixed_rows: top_bucket(max_mixed_tokens) }
    }

    /// Every prefill bucket, smallest first.
    pub fn all(&self) -> Vec<usize> {
        buckets_up_to(self.max_rows)
    }

    /// Every mixed pass's prompt row bucket, smallest first.
    pub fn mixed(&self) -> Vec<usize> {
        buckets_up_to(self.max_mixed_rows)
    }

    /// The shape a pass of `seqs` sequences, `tokens` prompt tokens in all and `decode` decode
    /// rows pads to, if any.
    pub fn shape_of(&self, seqs: usize, tokens: usize, decode: usize) -> Option<Shape> {
        let rows = pad_rows(tokens);
        let max = if decode == 0 { self.max_rows } else { self.max_mixed_rows };
        let decode = if decode == 0 { 0 } else { decode_bucket(decode) };
        (rows <= max && (1..=MAX_SEQS).contains(&seqs) && decode <= MAX_DECODE_ROWS).then_some(Shape { rows, seqs, decode })
    }
}

#[cfg(feature = "cuda")]
mod graphs {
    use std::collections::HashSet;

    use candle_core::{CudaDevice, DType, Device, Tensor};
    use deltaserve_kernels::cuda::graph::Graph;
    use deltaserve_kernels::ops::PrefillAlgo;
    use deltaserve_kernels::{Capture, PackedTables, StepSlots};

    use super::{Buckets, Shape};
    use crate::decode_graph::record_graph;
    use crate::error::Result;
    use crate::kv_plan::{FixedKv, KvPlan};
    use crate::models::batch::Packed;
    use crate::models::causal_lm::CheckedPass as Checked;
    use crate::models::CausalLm;
    use crate::state::{SlotId, SnapshotAt, StatePool};

    /// Captured shapes kept at once (least recently used first out).
    const MAX_GRAPHS: usize = 96;

    /// One captured shape and the buffers its graph reads and writes.
    struct Entry {
        shape: Shape,
        graph: Graph,
        /// `[rows + decode]` u32: the prompt rows' tokens, then the decode rows'.
        ids: Tensor,
        tables: PackedTables,
        /// `[decode]` i32, the decode rows' slots (a mixed pass).
        step_slots: Option<Tensor>,
        /// `[seqs + decode]` u32: each sequence's last row, then each decode row.
        last: Tensor,
        /// `[seqs + decode, vocab]` f32.
        logits: Tensor,
        /// The attention layers' rows and tile lists (hybrids).
        kv: Option<FixedKv>,
        /// Keeps the weights the graph reads alive as long as the graph.
        _model: CausalLm,
    }

    /// Captured prefill and mixed passes of one model over one state pool.
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
            f.debug_struct("PrefillGraphs")
                .field("buckets", &self.buckets.all())
                .field("mixed", &self.buckets.mixed())
                .field("captured", &self.captured())
                .finish()
        }
    }

    /// What a pass does with the rows of its fixed buffers.
    struct Inputs {
        /// Offsets and slots, the padding sequence last.
        cu: Vec<usize>,
        slots: Vec<usize>,
        captures: Vec<Capture>,
        /// The decode rows' slots, padding rows last (distinct lent slots).
        step: Vec<usize>,
        /// Real decode rows.
        real_decode: usize,
        /// `[rows + decode]`, the padding's tokens 0.
        ids: Vec<u32>,
        /// Each real sequence's last row, then every decode row.
        last: Vec<u32>,
        /// Each slot's tokens run before the pass: `slots`, then `step`.
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
            self.prefill_and_decode(model, pool, batch, algo, snapshots, &[])
        }

        /// Runs a mixed pass (as [`CausalLm::prefill_and_decode`]; a prefill when `step` is
        /// empty) from a graph when it fits one; `Ok(None)` when it does not, when too few slots
        /// are free for its padding, or when its capture failed: the caller runs it eagerly.
        /// Returns `[S + B, vocab]` f32 logits, owned by the caller.
        pub fn prefill_and_decode(
            &mut self,
            model: &CausalLm,
            pool: &mut StatePool,
            batch: &[(SlotId, &[u32])],
            algo: PrefillAlgo,
            snapshots: &[SnapshotAt],
            step: &[(SlotId, u32)],
        ) -> Result<Option<Tensor>> {
            let Device::Cuda(dev) = model.device() else { return Ok(None) };
            if !model.prefill_tables_supported() || pool.is_host() || deltaserve_kernels::ops::batch_invariant() {
                return Ok(None);
            }
            let checked = model.check_mixed(pool, batch, snapshots, step)?;
            let Some(shape) = self.buckets.shape_of(batch.len(), checked.cu[checked.cu.len() - 1], step.len()) else {
                return Ok(None);
            };
            if self.failed.contains(&shape) {
                return Ok(None);
            }
            if self.pool != Some(pool.id()) {
                *self = Self { pool: Some(pool.id()), ..Self::new(self.buckets) };
            }
            // One lent slot for the prompt rows' padding, one for each padded decode row.
            let mut lent = Vec::with_capacity(1 + shape.decode - step.len());
            while lent.len() < 1 + shape.decode - step.len() {
                match pool.lend_scratch() {
                    Some(s) => lent.push(s),
                    None => break,
                }
            }
            let out = if lent.len() == 1 + shape.decode - step.len() {
                let inputs = Inputs::new(pool, batch, shape, checked, &lent);
                let _span = tracing::debug_span!("prefill_graph", rows = shape.rows, seqs = shape.seqs, decode = shape.decode).entered();
                let out = self.run(model, dev, pool, shape, algo, &inputs);
                if matches!(out, Ok(Some(_))) {
                    for s in snapshots {
                        pool.seal(s.snap, inputs.slots[s.seq], inputs.starts[s.seq] + s.tokens);
                    }
                }
                out
            } else {
                Ok(None)
            };
            for s in lent {
                pool.return_scratch(s);
            }
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
            let (all, lens) = x.advances();
            let real = shape.seqs + x.real_decode;
            // The KV blocks for every row (the padding's too) and their device table entries
            // come first: a capture can upload nothing, and a replay plans nothing. A plan that
            // fails (too few blocks for the padding) leaves the pass to the eager path, which
            // reports what concerns the real sequences.
            let plan = match pool.has_kv() {
                false => None,
                true => match pool.plan(&all, &lens) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        tracing::debug!(error = %e, "no KV blocks for a captured pass's padding; running it eagerly");
                        return Ok(None);
                    }
                },
            };
            if let Some(i) = self.entries.iter().position(|e| e.shape == shape) {
                let entry = self.entries.remove(i);
                let out = replay(&entry, x, plan.as_ref(), real);
                if out.is_ok() {
                    pool.advance(&all, &lens);
                }
                self.entries.push(entry);
                return out.map(Some);
            }
            let device = Device::Cuda(dev.clone());
            let tables = PackedTables::new(shape.rows, shape.seqs + 1, model.config().num_householder(), &device)?;
            tables.fill(&x.cu, &x.slots, &x.captures)?;
            let ids = Tensor::new(x.ids.as_slice(), &device)?;
            let last = Tensor::new(x.last.as_slice(), &device)?;
            let step_slots = match shape.decode {
                0 => None,
                _ => Some(Tensor::new(x.step.iter().map(|&s| s as i32).collect::<Vec<_>>().as_slice(), &device)?),
            };
            let seqs = Packed { cu: &x.cu, slots: &x.slots, captures: &x.captures, tables: Some(&tables), kv: None };
            let kv = match &plan {
                Some(p) => {
                    let kv = FixedKv::new(shape.rows + shape.decode, shape.seqs + 1 + shape.decode, &model.attention_shapes(), &device)?;
                    kv.fill(p)?;
                    Some(kv)
                }
                None => None,
            };
            let seqs = Packed { kv: kv.as_ref(), ..seqs };
            let step = step_slots.as_ref().map(|t| StepSlots { host: &x.step, device: Some(t) });
            if !self.warm.contains(&shape) {
                // The eager run fills candle's parameter cache for the capture to come.
                let _cache = dev.enable_cuda_graph_htod_cache();
                let logits = model.prefill_fixed(pool, &ids, seqs, algo, step, &last)?;
                self.warm.insert(shape);
                return Ok(Some(logits.narrow(0, 0, real)?));
            }
            let logits = Tensor::zeros((shape.seqs + shape.decode, model.config().common.vocab_size), DType::F32, &device)?;
            tracing::debug!(rows = shape.rows, seqs = shape.seqs, decode = shape.decode, "capturing a prefill graph");
            // The pass reads `ids`, the fixed tables, `step_slots` and `last`; its logits go
            // into `logits`.
            match record_graph(dev, "prefill", &logits, || model.prefill_fixed(pool, &ids, seqs, algo, step, &last)) {
                Ok(graph) => {
                    let entry = Entry { shape, graph, ids, tables, step_slots, last, logits, kv, _model: model.clone() };
                    if self.entries.len() >= MAX_GRAPHS {
                        // An evicted shape runs eagerly once again before it is captured anew,
                        // so shapes that take turns cost one capture in two sightings at most.
                        let out = self.entries.remove(0);
                        self.warm.remove(&out.shape);
                    }
                    // The capture ran nothing: this pass's work is the first replay (inputs in place).
                    entry.graph.launch()?;
                    let out = entry.logits.narrow(0, 0, real)?.copy()?;
                    self.entries.push(entry);
                    Ok(Some(out))
                }
                Err(e) => {
                    // The recording counted the pass; nothing ran, so it did not happen.
                    for (&s, &n) in all.iter().zip(&x.starts) {
                        pool.set_seen(s, n);
                    }
                    tracing::warn!(rows = shape.rows, seqs = shape.seqs, decode = shape.decode, error = %e, "prefill graph capture failed; this shape stays eager");
                    self.failed.insert(shape);
                    Ok(None)
                }
            }
        }
    }

    impl Inputs {
        /// The padded packing of `batch` and decode rows in `shape`: the prompt rows' padding in
        /// `lent[0]`, each padded decode row in one of `lent[1..]`.
        fn new(pool: &StatePool, batch: &[(SlotId, &[u32])], shape: Shape, c: Checked, lent: &[usize]) -> Self {
            let Checked { mut cu, mut slots, captures, mut step_tokens, mut step_slots } = c;
            let real_decode = step_slots.len();
            let mut last: Vec<u32> = cu[1..].iter().map(|&c| (c - 1) as u32).collect();
            last.extend((shape.rows..shape.rows + shape.decode).map(|r| r as u32));
            let mut ids: Vec<u32> = batch.iter().flat_map(|(_, t)| t.iter().copied()).collect();
            ids.resize(shape.rows, 0);
            step_tokens.resize(shape.decode, 0);
            ids.extend(step_tokens);
            cu.push(shape.rows);
            slots.push(lent[0]);
            step_slots.extend(&lent[1..]);
            let starts = slots.iter().chain(&step_slots).map(|&s| pool.seen(SlotId(s))).collect();
            Self { cu, slots, captures, step: step_slots, real_decode, ids, last, starts }
        }

        /// Every slot the pass advances (prompt sequences, padding, decode rows) and by how much.
        fn advances(&self) -> (Vec<usize>, Vec<usize>) {
            let lens = self.cu.windows(2).map(|w| w[1] - w[0]).chain(std::iter::repeat_n(1, self.step.len()));
            (self.slots.iter().chain(&self.step).copied().collect(), lens.collect())
        }
    }

    /// Writes this pass's tokens, tables, decode slots, last rows and KV rows (`plan`) into the
    /// graph's inputs, launches it, and copies the first `real` rows of logits out (the next
    /// replay overwrites the graph's buffer).
    fn replay(entry: &Entry, x: &Inputs, plan: Option<&KvPlan>, real: usize) -> Result<Tensor> {
        entry.tables.fill(&x.cu, &x.slots, &x.captures)?;
        if let (Some(kv), Some(plan)) = (&entry.kv, plan) {
            kv.fill(plan)?;
        }
        deltaserve_kernels::cuda::write_from_host(&entry.ids, &x.ids)?;
        deltaserve_kernels::cuda::write_from_host(&entry.last, &x.last)?;
        if let Some(t) = &entry.step_slots {
            let step: Vec<i32> = x.step.iter().map(|&s| s as i32).collect();
            deltaserve_kernels::cuda::write_from_host(t, &step)?;
        }
        entry.graph.launch()?;
        Ok(entry.logits.narrow(0, 0, real)?.copy()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_pad_to_power_of_two_buckets_up_to_the_maximum() {
        let g = Buckets::new(300, 600);
        assert_eq!(g.all(), vec![64, 128, 256]);
        assert_eq!(g.mixed(), vec![64, 128, 256, 512]);
        assert_eq!(g.shape_of(1, 1, 0), Some(Shape { rows: 64, seqs: 1, decode: 0 }));
        assert_eq!(g.shape_of(1, 64, 0), Some(Shape { rows: 64, seqs: 1, decode: 0 }));
        assert_eq!(g.shape_of(2, 65, 0), Some(Shape { rows: 128, seqs: 2, decode: 0 }));
        assert_eq!(g.shape_of(1, 256, 0), Some(Shape { rows: 256, seqs: 1, decode: 0 }));
        assert_eq!(g.shape_of(1, 257, 0), None);
        assert_eq!(g.shape_of(MAX_SEQS + 1, 64, 0), None);
        assert_eq!(Buckets::new(63, 0).all(), Vec::<usize>::new());
        assert_eq!(Buckets::new(0, 0).shape_of(1, 1, 0), None);
    }

    #[test]
    fn past_512_rows_passes_pad_to_multiples_of_128() {
        let g = Buckets::new(1000, 1024);
        assert_eq!(g.all(), vec![64, 128, 256, 512, 640, 768, 896]);
        assert_eq!(g.mixed(), vec![64, 128, 256, 512, 640, 768, 896, 1024]);
        assert_eq!(g.shape_of(7, 513, 1), Some(Shape { rows: 640, seqs: 7, decode: 1 }));
        assert_eq!(g.shape_of(7, 588, 1), Some(Shape { rows: 640, seqs: 7, decode: 1 }));
        assert_eq!(g.shape_of(7, 641, 0), Some(Shape { rows: 768, seqs: 7, decode: 0 }));
        assert_eq!(g.shape_of(1, 1024, 8), Some(Shape { rows: 1024, seqs: 1, decode: 8 }));
        assert_eq!(g.shape_of(1, 897, 0), None, "over the prefill maximum, 896");
        assert_eq!(g.shape_of(1, 1025, 1), None, "over the mixed maximum");
        assert_eq!(Buckets::new(600, 0).all(), vec![64, 128, 256, 512]);
    }

    #[test]
    fn mixed_passes_pad_their_decode_rows_to_a_bucket() {
        let g = Buckets::new(256, 512);
        assert_eq!(g.shape_of(1, 480, 32), Some(Shape { rows: 512, seqs: 1, decode: 32 }));
        assert_eq!(g.shape_of(1, 257, 3), Some(Shape { rows: 512, seqs: 1, decode: 4 }));
        assert_eq!(g.shape_of(2, 100, 33), Some(Shape { rows: 128, seqs: 2, decode: 48 }));
        assert_eq!(g.shape_of(1, 513, 1), None, "over the mixed maximum");
        assert_eq!(g.shape_of(1, 64, MAX_DECODE_ROWS + 1), None);
        assert_eq!(Buckets::new(256, 0).shape_of(1, 64, 1), None, "mixed graphs off");
        let buckets: Vec<usize> = [1, 2, 3, 5, 8, 9, 16, 17, 63, 64, 65].into_iter().map(decode_bucket).collect();
        assert_eq!(buckets, vec![1, 2, 4, 8, 8, 16, 16, 32, 64, 64, 80]);
    }
}
