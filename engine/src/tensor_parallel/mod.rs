//! Tensor parallelism: one model split over the ranks of a group, each rank holding a slice of
//! every layer's heads and channels and its own state pool, the ranks' partial sums added by an
//! all-reduce after each token mixer's output projection and each MLP's down projection.
//!
//! How a layer splits (the Megatron layout, as vLLM splits these models):
//! - a Gated DeltaNet layer: each rank owns HV/N value heads with the key heads they read
//!   (shared key heads are copied when N exceeds the key heads), their slices of the fused
//!   input projection and of the short conv, their `A_log` / `dt_bias` and their recurrent
//!   states; `o_proj` is split by its input columns (row-parallel), so each rank's output is a
//!   partial sum;
//! - a Gated DeltaProduct layer: the same by head, in every householder step's block;
//! - an attention layer: Hq/N query heads with the KV heads they read (copied likewise), their
//!   KV cache, `o_proj` by input columns with its bias on rank 0 only;
//! - the MLP: `gate_proj` / `up_proj` split by rows (column-parallel), `down_proj` by columns;
//!   a MoE block cuts every expert (and the shared expert) so, and copies the router;
//! - embeddings, norms and the LM head are copied to every rank.
//!
//! Each layer's `shard` lives in its own file; [`GroupLink`] is what a split block adds its
//! partial sums over.
//!
//! [`ThreadGroup`] adds the ranks' partial sums on the CPU (ranks as threads of one process: the
//! sharding math is tested there against the unsplit model); `NcclGroup` (the `nccl` feature)
//! on GPUs. [`CausalLm::load_ranks`](crate::CausalLm::load_ranks) reads each rank's slices, and
//! the engine runs every pass on all ranks at once (`crate::ranks`), each on its own replica of
//! the state pool.

use std::fmt::Debug;
use std::ops::Range;
use std::sync::{Arc, Barrier, Mutex};

use candle_core::Tensor;

use crate::error::{EngineError, Result};

#[cfg(feature = "nccl")]
mod nccl;

#[cfg(feature = "nccl")]
pub use nccl::NcclGroup;

/// The error for a rank's thread that panicked while doing `what`.
pub(crate) fn rank_panicked(what: &str) -> EngineError {
    EngineError::Invalid { field: "tensor parallel rank", expected: format!("{what} to finish"), actual: "its thread panicked".into() }
}

/// One rank's place in a group of `size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..size`.
    pub rank: usize,
    /// Ranks in the group.
    pub size: usize,
}

impl Shard {
    /// Rank `rank` of `size`; errors unless `rank < size`.
    pub fn new(rank: usize, size: usize) -> Result<Self> {
        if size == 0 || rank >= size {
            return Err(EngineError::Invalid {
                field: "tensor parallel rank",
                expected: format!("a rank below the group size {size}"),
                actual: rank.to_string(),
            });
        }
        Ok(Self { rank, size })
    }

    /// This rank's equal share of `n` items (`what` names them in the error when `n` does not
    /// divide by the group size).
    pub fn part(&self, n: usize, what: &'static str) -> Result<Range<usize>> {
        if !n.is_multiple_of(self.size) {
            return Err(EngineError::Invalid {
                field: what,
                expected: format!("a multiple of the tensor parallel size {}", self.size),
                actual: n.to_string(),
            });
        }
        let per = n / self.size;
        Ok(self.rank * per..(self.rank + 1) * per)
    }
}

/// Adds a tensor over the ranks of a group: every rank passes its partial sum and gets the
/// same total back.
pub trait AllReduce: Send + Sync + Debug {
    /// The sum of every rank's `t` (same shape and dtype on each), in rank order.
    fn sum(&self, rank: usize, t: &Tensor) -> Result<Tensor>;
}

/// A rank's link to its group, kept by each block of a split model.
#[derive(Debug, Clone)]
pub struct GroupLink {
    /// This rank.
    pub shard: Shard,
    /// The group's all-reduce.
    pub group: Arc<dyn AllReduce>,
}

impl GroupLink {
    /// The group's sum of this rank's partial `t`.
    pub fn sum(&self, t: &Tensor) -> Result<Tensor> {
        self.group.sum(self.shard.rank, t)
    }
}

/// Where a group's ranks meet for one collective: each leaves its part, the last to arrive
/// turns all the parts into every rank's result, and each takes its own. Every rank must meet
/// the same number of times.
#[derive(Debug)]
pub(crate) struct Meeting {
    barrier: Barrier,
    /// Each rank's part, then its result.
    slots: Mutex<Vec<Slot>>,
}

#[derive(Debug, Clone, Default)]
enum Slot {
    #[default]
    Empty,
    Part(Tensor),
    Done(std::result::Result<Tensor, String>),
}

impl Meeting {
    /// A meeting of `size` ranks.
    pub(crate) fn new(size: usize) -> Self {
        Self { barrier: Barrier::new(size), slots: Mutex::new(vec![Slot::Empty; size]) }
    }

    /// Leaves `part` for rank `rank` and returns its result; `combine` (run by one rank, with
    /// the parts in rank order) makes every rank's result.
    pub(crate) fn exchange(&self, rank: usize, part: Tensor, combine: impl FnOnce(Vec<Tensor>) -> Result<Vec<Tensor>>) -> Result<Tensor> {
        let lock = || self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let size = lock().len();
        if rank >= size {
            return Err(EngineError::Invalid {
                field: "tensor parallel rank",
                expected: format!("a rank below the group size {size}"),
                actual: rank.to_string(),
            });
        }
        lock()[rank] = Slot::Part(part);
        if self.barrier.wait().is_leader() {
            let mut slots = lock();
            let parts: Option<Vec<Tensor>> =
                slots.iter_mut().map(|s| if let Slot::Part(t) = std::mem::take(s) { Some(t) } else { None }).collect();
            let results = match parts {
                Some(parts) => combine(parts).map_err(|e| e.to_string()),
                None => Err(format!("a partial from each of {size} ranks; one was missing")),
            };
            match results {
                Ok(r) if r.len() == size => slots.iter_mut().zip(r).for_each(|(s, t)| *s = Slot::Done(Ok(t))),
                Ok(r) => slots.fill(Slot::Done(Err(format!("{size} results; got {}", r.len())))),
                Err(e) => slots.fill(Slot::Done(Err(e))),
            }
        }
        // Every result is in place; a rank leaves its next part only after taking this one.
        self.barrier.wait();
        let failed = |actual: String| EngineError::Invalid { field: "all-reduce", expected: "every rank's sum".into(), actual };
        match std::mem::take(&mut lock()[rank]) {
            Slot::Done(Ok(t)) => Ok(t),
            Slot::Done(Err(e)) => Err(failed(e)),
            _ => Err(failed("no result".into())),
        }
    }
}

/// The ranks of a group as threads of one process (CPU tensors, or any device's: the sum runs
/// where the tensors are). Every rank must call [`AllReduce::sum`] the same number of times.
#[derive(Debug)]
pub struct ThreadGroup {
    meeting: Meeting,
}

impl ThreadGroup {
    /// A group of `size` ranks.
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(Self { meeting: Meeting::new(size) })
    }
}

impl AllReduce for ThreadGroup {
    fn sum(&self, rank: usize, t: &Tensor) -> Result<Tensor> {
        self.meeting.exchange(rank, t.clone(), |parts| {
            // Added once, in rank order: every rank gets the same total.
            let n = parts.len();
            let mut parts = parts.into_iter();
            let none = || EngineError::Invalid { field: "all-reduce", expected: "a partial from a rank".into(), actual: "none".into() };
            let mut total = parts.next().ok_or_else(none)?;
            for p in parts {
                total = (total + p)?;
            }
            Ok(vec![total; n])
        })
    }
}

/// A rank's share of `inner` heads that read `outer` shared heads in groups (value heads and
/// their key heads; query heads and their KV heads), and the outer heads that share reads:
/// `(outer range, inner range)`. When the ranks outnumber the outer heads, ranks that read the
/// same outer head each hold a copy of it.
pub(crate) fn grouped_heads(s: Shard, outer: usize, inner: usize, what: &'static str) -> Result<(Range<usize>, Range<usize>)> {
    let mine = s.part(inner, what)?;
    let group = inner / outer.max(1);
    if group == 0 || !(mine.len().is_multiple_of(group) || group.is_multiple_of(mine.len())) {
        return Err(EngineError::Invalid {
            field: "tensor parallel size",
            expected: format!("{what} per rank ({}) a multiple or a divisor of the {group} that share one head", mine.len()),
            actual: s.size.to_string(),
        });
    }
    Ok((mine.start / group..(mine.end - 1) / group + 1, mine))
}

/// Rows `ranges` of `t` (first dim), in that order, copied into one tensor.
pub(crate) fn rows_at(t: &Tensor, ranges: &[Range<usize>]) -> Result<Tensor> {
    let parts = ranges.iter().map(|r| t.narrow(0, r.start, r.len())).collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Tensor::cat(&parts, 0)?.contiguous()?)
}

/// Rows `heads·dim` of each of `reps` stacked blocks of `total·dim` rows of `w` `[reps·total·dim, ..]`
/// (a projection's output channels grouped by head, repeated per householder step), copied.
pub(crate) fn head_rows(w: &Tensor, reps: usize, total: usize, heads: &Range<usize>, dim: usize) -> Result<Tensor> {
    let blocks: Vec<_> = (0..reps).map(|r| (r * total + heads.start) * dim..(r * total + heads.end) * dim).collect();
    rows_at(w, &blocks)
}

/// Columns `cols` of `w` `[rows, C]`, copied.
pub(crate) fn columns(w: &Tensor, cols: &Range<usize>) -> Result<Tensor> {
    Ok(w.narrow(1, cols.start, cols.len())?.contiguous()?)
}
