//! Whole-slot work over every layer's states at once: copies (restore, snapshot, fork), and
//! the scratch slot a prefill graph's padding borrows.

use deltaserve_kernels::SlotBuffer;

use super::{LayerCache, StatePool};
use crate::error::Result;

impl StatePool {
    /// Copies slot `src`'s conv and recurrent states in every layer over slot `dst`'s (one
    /// launch on a GPU).
    pub(crate) fn copy_states(&mut self, src: usize, dst: usize) -> Result<()> {
        let mut bufs: Vec<&mut SlotBuffer> = Vec::with_capacity(2 * self.layers.len());
        for l in &mut self.layers {
            if let LayerCache::Recurrent(l) = l {
                bufs.push(&mut l.conv_state);
                bufs.push(&mut l.recurrent_state);
            }
        }
        Ok(SlotBuffer::copy_slot_all(&mut bufs, src, dst)?)
    }

    /// Lends a free sequence slot as scratch, without zeroing it, for work whose results are
    /// thrown away (the padding of a prefill pass run as a CUDA graph); [`Self::allocate`]
    /// zeroes it before anyone owns it. `None` when no slot is free, or for a split model's
    /// pool (its replicas would need the same slot).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn lend_scratch(&mut self) -> Option<usize> {
        if !self.replicas.is_empty() {
            return None;
        }
        let s = self.free.pop()?;
        self.in_use[s] = true;
        Some(s)
    }

    /// Takes back a slot lent by [`Self::lend_scratch`].
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn return_scratch(&mut self, s: usize) {
        if self.in_use.get(s) == Some(&true) && s < self.seq_slots {
            self.in_use[s] = false;
            self.seen[s] = 0;
            // KV blocks a captured pass took for its padding rows.
            self.drop_table(s);
            self.reserved[s] = 0;
            self.free.push(s);
        }
    }
}
