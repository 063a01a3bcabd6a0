//! CUDA graphs of the batched decode step.
//!
//! A decode step is ten or eleven small launches a layer; at small batches the host's work per
//! launch (candle's allocation and argument packing, the launch itself) takes longer than the
//! GPU's. So each batch size's step is captured once into a CUDA graph and then replayed: one
//! launch a step. The graph reads token ids, slot indices and positions from one fixed device
//! buffer that each replay first overwrites in one copy (the kernels read slots from device
//! memory, so one capture serves any slots), and leaves the logits in a fixed buffer: copied
//! out for [`DecodeGraphs::decode`], lent for [`DecodeGraphs::decode_in_place`]. The
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
use crate::{GraphOverlap, LogitsOut};

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
    /// `[3, B]` u32, one upload a replay: the token ids (read by the embedding lookup), the
    /// slots (the conv and recurrent decode kernels) and each row's position (attention), the
    /// last two read as i32.
    inputs: Tensor,
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
        self.decode_agreeing(model, pool, batch, LogitsOut::Copied, &Ok)
    }

    /// [`Self::decode`], but a replayed step's logits are the graph's own output buffer rather
    /// than a copy of it (a `[B, vocab]` f32 copy a step: 64 MB at 64 rows of Qwen3.5's
    /// vocabulary). They stay valid until the next decode step of the same batch size on these
    /// graphs, which overwrites them: work that reads them must be queued on the device's
    /// stream before that step (the server draws each step's tokens before the next launch).
    pub fn decode_in_place(&mut self, model: &CausalLm, pool: &mut StatePool, batch: &[(SlotId, u32)]) -> Result<Tensor> {
        self.decode_agreeing(model, pool, batch, LogitsOut::Lent, &Ok)
    }

    /// [`Self::decode`] or [`Self::decode_in_place`] (`out`) for one rank of a split model: a
    /// capture is kept only if `agree(captured)` (every rank's capture worked).
    pub(crate) fn decode_agreeing(
        &mut self,
        model: &CausalLm,
        pool: &mut StatePool,
        batch: &[(SlotId, u32)],
        out: LogitsOut,
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
        self.step(model, dev, pool, &tokens, &slots, out, agree)
    }

    /// Replays, captures or runs eagerly; `slots` are checked (in range, in use, distinct).
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        model: &CausalLm,
        dev: &CudaDevice,
        pool: &mut StatePool,
        tokens: &[u32],
        slots: &[usize],
        lend: LogitsOut,
        agree: &dyn Fn(bool) -> Result<bool>,
    ) -> Result<Tensor> {
        let b = tokens.len();
        // Slots and positions are below the pool's size and the model's length: they fit an i32.
        let inputs: Vec<u32> = tokens
            .iter()
            .copied()
            .chain(slots.iter().map(|&s| s as u32))
            .chain(slots.iter().map(|&s| pool.seen(SlotId(s)) as u32))
            .collect();
        if let Some(i) = self.entries.iter().position(|e| e.batch == b) {
            let entry = self.entries.remove(i);
            let ones = vec![1; b];
            // Blocks for the new tokens, and their device table entries, before the replay.
            let out = pool.plan(slots, &ones).and_then(|_| replay(&entry, &inputs, lend));
            if out.is_ok() {
                pool.advance(slots, &ones);
            }
            self.entries.push(entry);
            return out;
        }
        let device = Device::Cuda(dev.clone());
        if !self.warm.contains(&b) || self.failed.contains(&b) {
            // The eager run fills candle's parameter cache for the capture to come.
            let _cache = dev.enable_cuda_graph_htod_cache();
            let ids = Tensor::new(tokens, &device)?;
            let logits = model.decode_step(pool, &ids, StepSlots::from(slots), None)?;
            self.warm.insert(b);
            return Ok(logits);
        }
        let dev_inputs = Tensor::from_vec(inputs.clone(), (3, b), &device)?;
        let (dev_ids, dev_slots, dev_positions) = (dev_inputs.get(0)?, dev_inputs.get(1)?, dev_inputs.get(2)?);
        let logits = Tensor::zeros((b, model.config().common.vocab_size), DType::F32, &device)?;
        // The capture may upload nothing: the blocks (and device table entries) come first.
        pool.plan(slots, &vec![1; b])?;
        tracing::debug!(batch = b, "capturing a decode graph");
        // The step reads `dev_inputs`; its logits go into `logits`.
        let captured = record_graph(dev, "decode", &logits, || {
            let step = StepSlots { host: slots, device: Some(&dev_slots) };
            model.decode_step_into(pool, &dev_ids, step, Some(&dev_positions), &logits).map(|()| logits.clone())
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
                let entry = Entry { batch: b, graph, inputs: dev_inputs, logits, _model: model.clone() };
                if self.entries.len() >= MAX_GRAPHS {
                    self.entries.remove(0);
                }
                // The capture ran nothing: this step's work is the first replay (inputs in place).
                entry.graph.launch()?;
                let out = lend.hand_out(&entry.logits)?;
                self.entries.push(entry);
                Ok(out)
            }
            not_kept => {
                // The recording may have counted the step; nothing ran, so it did not happen.
                for (&s, &p) in slots.iter().zip(&inputs[2 * b..]) {
                    pool.set_seen(s, p as usize);
                }
                self.failed.insert(b);
                not_kept?;
                let _cache = dev.enable_cuda_graph_htod_cache();
                model.decode_step(pool, &dev_ids, StepSlots::from(slots), None)
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
/// Writes a step's `[3, B]` inputs (one copy: three cost ~7 µs a step more on the H200) and
/// replays the graph.
fn replay(entry: &Entry, inputs: &[u32], lend: LogitsOut) -> Result<Tensor> {
    deltaserve_kernels::cuda::write_from_host(&entry.inputs, inputs)?;
    entry.graph.launch()?;
    lend.hand_out(&entry.logits)
}
