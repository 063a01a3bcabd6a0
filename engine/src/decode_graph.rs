//! CUDA graphs of the batched decode step.
//!
//! A decode step is ten or eleven small launches a layer; at small batches the host's work per
//! launch (candle's allocation and argument packing, the launch itself) takes longer than the
//! GPU's. So each batch size's step is captured once into a CUDA graph and then replayed: one
//! launch a step. The graph reads token ids, slot indices and positions from fixed device
//! buffers that each replay first overwrites (the kernels read slots from device memory, so one
//! capture serves any slots), and leaves the logits in a fixed buffer that is copied out. The
//! attention layers of hybrids read the pool's device block tables, which the pool updates
//! before the replay when a sequence enters a new block.
//!
//! A batch size runs eagerly the first time it is seen, which also fills candle's cache of
//! layout parameters (a capture can upload nothing), is captured the second time, and replays
//! from then on. A capture that fails leaves that size eager, with a warning. A split model's
//! ranks capture the same step together, each graph holding its rank's all-reduces, which wait
//! for the other ranks' graphs: a batch size has a graph on every rank or on none. The graphs write
//! one pool's buffers: a step on another pool drops them and starts over.

use std::collections::HashSet;

use candle_core::{CudaDevice, DType, Device, Tensor};
use deltaserve_kernels::cuda::graph::{self, Graph};
use deltaserve_kernels::StepSlots;

use crate::error::{EngineError, Result};
use crate::models::CausalLm;
use crate::state::{SlotId, StatePool};
use crate::GraphOverlap;

/// Captured batch sizes kept at once (least recently used first out). The server's warm-up
/// captures every batch size up to `--max-num-seqs`: with fewer kept, a closed loop's ramp and
/// tail at 64 streams re-captured each smaller size it met, 7–9 ms a step on the H200
/// (`benches/results/h200-mixed_graphs-2026-11-28/`). Graphs share one arena, so each costs
/// only its nodes.
const MAX_GRAPHS: usize = 512;

/// One captured batch size.
struct Entry {
    batch: usize,
    graph: Graph,
    /// `[B]` u32, read by the graph's embedding lookup.
    tokens: Tensor,
    /// `[B]` i32, read by the conv and recurrent decode kernels.
    slots: Tensor,
    /// `[B]` i32, each row's position, read by the attention kernels.
    positions: Tensor,
    /// `[B, vocab]` f32, written by the graph's last node.
    logits: Tensor,
    /// Keeps the weights the graph reads alive as long as the graph.
    _model: CausalLm,
}

/// Captured decode steps of one model over one state pool.
#[derive(Default)]
pub struct DecodeGraphs {
    /// The pool whose buffers the captured graphs write.
    pool: Option<u64>,
    /// Most recently used last.
    entries: Vec<Entry>,
    /// Batch sizes run once eagerly (ready to capture).
    warm: HashSet<usize>,
    /// Batch sizes whose capture failed (stay eager).
    failed: HashSet<usize>,
}

impl std::fmt::Debug for DecodeGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeGraphs").field("pool", &self.pool).field("captured", &self.captured()).finish()
    }
}

impl DecodeGraphs {
    /// Batch sizes with a captured graph.
    pub fn captured(&self) -> Vec<usize> {
        self.entries.iter().map(|e| e.batch).collect()
    }

    /// Each captured batch size's graph: its kernel nodes, programmatic edges, and why it was
    /// not rebuilt with them if it was not.
    pub fn overlap(&self) -> Vec<GraphOverlap> {
        self.entries
            .iter()
            .map(|e| {
                let shape = e.graph.shape();
                GraphOverlap {
                    batch: e.batch,
                    kernels: shape.kernels,
                    programmatic: shape.programmatic,
                    note: e.graph.note().map(String::from),
                }
            })
            .collect()
    }

    /// One decode step of `model` (unsplit) on a CUDA `pool`: replays the graph of this batch
    /// size when there is one, captures it when the size ran before, else runs eagerly.
    /// Returns `[B, vocab]` f32 logits, owned by the caller.
    pub fn decode(&mut self, model: &CausalLm, pool: &mut StatePool, batch: &[(SlotId, u32)]) -> Result<Tensor> {
        self.decode_agreeing(model, pool, batch, &Ok)
    }

    /// [`Self::decode`] for one rank of a split model: a capture is kept only if
    /// `agree(captured)` (every rank's capture worked).
    pub(crate) fn decode_agreeing(
        &mut self,
        model: &CausalLm,
        pool: &mut StatePool,
        batch: &[(SlotId, u32)],
        agree: &dyn Fn(bool) -> Result<bool>,
    ) -> Result<Tensor> {
        let (tokens, slots) = model.check_decode(pool, batch)?;
        let Device::Cuda(dev) = model.device() else {
            let ids = Tensor::new(tokens.as_slice(), model.device())?;
            return model.decode_step(pool, &ids, StepSlots::from(&slots), None);
        };
        if self.pool != Some(pool.id()) {
            *self = Self { pool: Some(pool.id()), ..Self::default() };
        }
        let _span = tracing::debug_span!("decode", batch = batch.len(), graph = true).entered();
        self.step(model, dev, pool, &tokens, &slots, agree)
    }

    /// Replays, captures or runs eagerly; `slots` are checked (in range, in use, distinct).
    fn step(
        &mut self,
        model: &CausalLm,
        dev: &CudaDevice,
        pool: &mut StatePool,
        tokens: &[u32],
        slots: &[usize],
        agree: &dyn Fn(bool) -> Result<bool>,
    ) -> Result<Tensor> {
        let b = tokens.len();
        let slot_ids: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
        let positions: Vec<i32> = slots.iter().map(|&s| pool.seen(SlotId(s)) as i32).collect();
        if let Some(i) = self.entries.iter().position(|e| e.batch == b) {
            let entry = self.entries.remove(i);
            let ones = vec![1; b];
            // Blocks for the new tokens, and their device table entries, before the replay.
            let out = pool.plan(slots, &ones).and_then(|_| replay(&entry, tokens, &slot_ids, &positions));
            if out.is_ok() {
                pool.advance(slots, &ones);
            }
            self.entries.push(entry);
            return out;
        }
        let device = Device::Cuda(dev.clone());
        let ids = Tensor::new(tokens, &device)?;
        if !self.warm.contains(&b) || self.failed.contains(&b) {
            // The eager run fills candle's parameter cache for the capture to come.
            let _cache = dev.enable_cuda_graph_htod_cache();
            let logits = model.decode_step(pool, &ids, StepSlots::from(slots), None)?;
            self.warm.insert(b);
            return Ok(logits);
        }
        let dev_slots = Tensor::new(slot_ids.as_slice(), &device)?;
        let dev_positions = Tensor::new(positions.as_slice(), &device)?;
        let logits = Tensor::zeros((b, model.config().common.vocab_size), DType::F32, &device)?;
        // The capture may upload nothing: the blocks (and device table entries) come first.
        pool.plan(slots, &vec![1; b])?;
        tracing::debug!(batch = b, "capturing a decode graph");
        // The step reads `ids`, `dev_slots` and `dev_positions`; its logits go into `logits`.
        let captured = record_graph(dev, "decode", &logits, || {
            let step = StepSlots { host: slots, device: Some(&dev_slots) };
            model.decode_step_into(pool, &ids, step, Some(&dev_positions), &logits).map(|()| logits.clone())
        });
        // A split model's ranks keep their graphs only together: `agree(false)` there calls the
        // pass off on every rank (the engine retries it eagerly), `agree(true)` fails if
        // another rank did so.
        let kept = match captured {
            Ok(graph) => agree(true).map(|all| all.then_some(graph)),
            Err(e) => {
                tracing::warn!(batch = b, error = %e, "decode graph capture failed; this batch size stays eager");
                agree(false).map(|_| None)
            }
        };
        match kept {
            Ok(Some(graph)) => {
                tracing::debug!(batch = b, "captured a decode graph");
                let entry =
                    Entry { batch: b, graph, tokens: ids, slots: dev_slots, positions: dev_positions, logits, _model: model.clone() };
                if self.entries.len() >= MAX_GRAPHS {
                    self.entries.remove(0);
                }
                // The capture ran nothing: this step's work is the first replay (inputs in place).
                entry.graph.launch()?;
                let out = entry.logits.copy()?;
                self.entries.push(entry);
                Ok(out)
            }
            not_kept => {
                // The recording may have counted the step; nothing ran, so it did not happen.
                for (&s, &p) in slots.iter().zip(&positions) {
                    pool.set_seen(s, p as usize);
                }
                self.failed.insert(b);
                not_kept?;
                let _cache = dev.enable_cuda_graph_htod_cache();
                model.decode_step(pool, &ids, StepSlots::from(slots), None)
            }
        }
    }

    /// Whether batch size `b`'s capture failed (it runs eagerly).
    pub fn failed(&self, b: usize) -> bool {
        self.failed.contains(&b)
    }
}

/// Records what `record` queues on `dev`'s stream into a graph, with a copy of its result into
/// `out` (none when the result is `out` itself); nothing runs. The graph is rebuilt for
/// overlapping launches where it can be (`deltaserve_kernels::cuda::graph`) and uploaded, ready
/// to launch. `what` names it in errors.
pub(crate) fn record_graph(dev: &CudaDevice, what: &str, out: &Tensor, record: impl FnOnce() -> Result<Tensor>) -> Result<Graph> {
    let _cache = dev.enable_cuda_graph_htod_cache();
    let graph = graph::capture(dev, || {
        let t = record()?;
        if t.id() != out.id() {
            out.slice_set(&t, 0, 0)?;
        }
        Ok::<(), EngineError>(())
    })?;
    let graph = graph.ok_or_else(|| candle_core::Error::Msg(format!("empty {what} graph")))?;
    tracing::debug!(what, shape = ?graph.shape(), "graph ready");
    Ok(graph)
}

/// Writes this step's tokens, slots and positions into the graph's inputs, launches it, and
/// copies the logits out (the next replay overwrites the graph's buffer).
fn replay(entry: &Entry, tokens: &[u32], slots: &[i32], positions: &[i32]) -> Result<Tensor> {
    deltaserve_kernels::cuda::write_from_host(&entry.tokens, tokens)?;
    deltaserve_kernels::cuda::write_from_host(&entry.slots, slots)?;
    deltaserve_kernels::cuda::write_from_host(&entry.positions, positions)?;
    entry.graph.launch()?;
    Ok(entry.logits.copy()?)
}
