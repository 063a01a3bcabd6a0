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
//!   a MoE block gives each rank E/N whole experts or cuts every expert so ([`ExpertSplit`]),
//!   cuts the shared expert so, and copies the router;
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
use std::sync::Arc;

use candle_core::Tensor;

use crate::error::{EngineError, Result};

mod meeting;
#[cfg(feature = "nccl")]
mod nccl;

pub(crate) use meeting::Meeting;

#[cfg(feature = "nccl")]
pub use nccl::NcclGroup;

/// The error for a rank's thread that panicked while doing `what`.
pub(crate) fn rank_panicked(what: &str) -> EngineError {
    EngineError::Invalid { field: "tensor parallel rank", expected: format!("{what} to finish"), actual: "its thread panicked".into() }
}

/// How MoE layers are split over the ranks of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertSplit {
    /// Whole experts where the group size divides the experts, channels otherwise (whole
    /// experts measured as fast or faster on Qwen3-Next's shapes: docs/performance.md).
    #[default]
    Auto,
    /// Each rank holds E/N whole experts (expert parallelism).
    Experts,
    /// Each rank holds every expert's 1/N of its intermediate channels.
    Channels,
}

/// One rank's place in a group of `size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..size`.
    pub rank: usize,
    /// Ranks in the group.
    pub size: usize,
    /// How MoE layers are split.
    pub experts: ExpertSplit,
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
        Ok(Self { rank, size, experts: ExpertSplit::Auto })
    }

    /// This shard with MoE layers split as `experts` says.
    pub fn with_experts(self, experts: ExpertSplit) -> Self {
        Self { experts, ..self }
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
/// same total back. Every rank must make the same calls in the same order.
pub trait AllReduce: Send + Sync + Debug {
    /// The sum of every rank's `t` (same shape and dtype on each), in rank order.
    fn sum(&self, rank: usize, t: &Tensor) -> Result<Tensor>;

    /// Where the group's rank threads meet.
    fn meetings(&self) -> &Meetings;

    /// Whether every rank's `ok` is true: how the ranks take one decision together (a decode
    /// step captured as a CUDA graph on every rank, or on none).
    fn agree(&self, rank: usize, ok: bool) -> Result<bool> {
        self.meetings().votes.exchange(rank, ok, |all| {
            let every = all.iter().all(|&v| v);
            Ok(vec![every; all.len()])
        })
    }

    /// Calls off the collectives in progress and to come (a rank's pass failed): ranks waiting
    /// in one, or arriving later, get an error instead of waiting for it.
    fn abort(&self, why: &str) {
        self.meetings().sums.abort(why);
        self.meetings().votes.abort(why);
    }

    /// Makes the group usable again after [`abort`](Self::abort), once no rank is in a pass.
    fn reset(&self) {
        self.meetings().sums.reset();
        self.meetings().votes.reset();
    }
}

/// Where a group's rank threads meet: for sums, and for votes.
#[derive(Debug)]
pub struct Meetings {
    pub(crate) sums: Meeting<Tensor>,
    votes: Meeting<bool>,
}

impl Meetings {
    /// The meetings of `size` ranks.
    pub(crate) fn new(size: usize) -> Self {
        Self { sums: Meeting::new(size), votes: Meeting::new(size) }
    }
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

    /// Whether every rank's `ok` is true.
    pub fn agree(&self, ok: bool) -> Result<bool> {
        self.group.agree(self.shard.rank, ok)
    }
}

/// The ranks of a group as threads of one process (CPU tensors, or any device's: the sum runs
/// where the tensors are). Every rank must call [`AllReduce::sum`] the same number of times.
#[derive(Debug)]
pub struct ThreadGroup {
    meetings: Meetings,
}

impl ThreadGroup {
    /// A group of `size` ranks.
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(Self { meetings: Meetings::new(size) })
    }
}

impl AllReduce for ThreadGroup {
    fn sum(&self, rank: usize, t: &Tensor) -> Result<Tensor> {
        self.meetings.sums.exchange(rank, t.clone(), |parts| {
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

    fn meetings(&self) -> &Meetings {
        &self.meetings
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
