//! How the rows of one forward pass map to sequences and their cache slots.

use candle_core::Tensor;
use deltaserve_kernels::ops::PrefillAlgo;
use deltaserve_kernels::{Capture, PackedTables, StepSlots};

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
}

/// One forward pass: a packed prefill, or one decode token for each of B slots.
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
}
