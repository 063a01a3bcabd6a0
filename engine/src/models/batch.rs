//! How the rows of one forward pass map to sequences and their cache slots.

use candle_core::Tensor;
use deltaserve_kernels::ops::PrefillAlgo;
use deltaserve_kernels::{Capture, PackedTables, StepSlots};

use crate::kv_plan::FixedKv;

/// Several sequences packed along the token axis: sequence `s` owns rows `cu[s]..cu[s+1]` and
/// continues from the state of `slots[s]`.
#[derive(Debug, Clone, Copy)]
pub struct Packed<'a> {
    /// Row offsets, `slots.len() + 1` entries from 0 to ΣT.
    pub cu: &'a [usize],
    /// Each sequence's state slot (distinct).
    pub slots: &'a [usize],
    /// States to copy into other slots at chunk boundaries inside the pass (prefix-cache
    /// snapshots); recurrent layers honour them, attention layers share KV blocks instead.
    pub captures: &'a [Capture],
    /// The same packing in a fixed device buffer, for a pass captured as a CUDA graph (the
    /// recurrent layers' kernels read it instead of uploading their tables).
    pub tables: Option<&'a PackedTables>,
    /// The attention layers' rows and tile lists in fixed device memory, for such a pass over
    /// a hybrid (read instead of uploaded).
    pub kv: Option<&'a FixedKv>,
}

impl Packed<'_> {
    /// ΣT: the rows the packing covers.
    pub fn rows(&self) -> usize {
        self.cu[self.cu.len() - 1]
    }
}

/// One forward pass: a packed prefill, one decode token for each of B slots, or both at once.
#[derive(Debug, Clone, Copy)]
pub enum Pass<'a> {
    /// Prompt chunks, run chunkwise-parallel at `algo`'s precision.
    Prefill {
        /// Which rows belong to which slot.
        seqs: Packed<'a>,
        /// The mixer's prefill algorithm.
        algo: PrefillAlgo,
    },
    /// Row `b` advances slot `slots.host[b]` by one token.
    Decode {
        /// The step's slots.
        slots: StepSlots<'a>,
        /// The rows' positions in device memory, `[B]` i32, when a CUDA graph replays the step
        /// (with `slots.device`); `None` uploads them from the pool.
        positions: Option<&'a Tensor>,
    },
    /// Prompt chunks in rows `0..seqs.rows()`, then one decode token for each of `slots` in the
    /// rows after: the projections and MLPs read their weights once for both, and each token
    /// mixer runs its prefill on the first rows and its decode step on the others (the same
    /// kernels, and so the same bits, as two passes where the projections are row-invariant).
    Mixed {
        /// Which prompt rows belong to which slot.
        seqs: Packed<'a>,
        /// The mixer's prefill algorithm.
        algo: PrefillAlgo,
        /// The decode rows' slots, row `seqs.rows() + b` advancing `slots.host[b]`.
        slots: StepSlots<'a>,
    },
}

/// The rows of a block's output that the rest of the pass reads.
#[derive(Debug, Clone, Copy)]
pub enum Keep<'a> {
    /// Every row.
    All,
    /// These rows, `[n]` u32 on the device, in this order: a pass's last block, whose output
    /// only the logits' rows read (every row still updates the caches).
    Rows(&'a Tensor),
}

impl Keep<'_> {
    /// `t`'s kept rows (dimension 0), contiguous.
    pub fn rows(&self, t: Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::All => Ok(t),
            Self::Rows(r) if t.is_contiguous() => t.index_select(r, 0),
            Self::Rows(r) => t.contiguous()?.index_select(r, 0),
        }
    }
}
