//! Where the rows of one forward pass read and write the paged KV cache: per sequence its slot,
//! first position and block table (host), and for a GPU pool the same in device memory.

use candle_core::Tensor;
use deltaserve_kernels::ops::DevicePages;

/// Where each sequence of one pass reads and writes the KV cache.
#[derive(Debug, Clone, Default)]
pub struct KvPlan {
    /// Tokens per block.
    pub block_size: usize,
    /// Per sequence of the pass: its slot.
    pub slots: Vec<usize>,
    /// Per sequence of the pass: tokens already cached (its first new position).
    pub starts: Vec<usize>,
    /// Per sequence: its block table, covering the pass's new tokens (empty without
    /// attention layers).
    pub tables: Vec<Vec<u32>>,
    /// Row offsets of the sequences in the pass, `starts.len() + 1` entries.
    pub cu: Vec<usize>,
    /// The same in device memory, for a pool on a GPU (set by the model before its layers run).
    pub device: Option<DeviceKv>,
}

/// A GPU pass's view of the KV cache: the pool's device block tables and each row's slot and
/// position, `[N]` i32 each (a decode graph's own input buffers when it replays).
#[derive(Debug, Clone)]
pub struct DeviceKv {
    /// `[slots · width]` i32.
    pub tables: Tensor,
    /// Entries per slot.
    pub width: usize,
    /// `[N]` i32.
    pub row_slot: Tensor,
    /// `[N]` i32.
    pub row_pos: Tensor,
}

impl DeviceKv {
    /// The kernels' view.
    pub fn pages(&self) -> DevicePages<'_> {
        DevicePages { tables: &self.tables, width: self.width, row_slot: &self.row_slot, row_pos: &self.row_pos }
    }
}

impl KvPlan {
    /// Each row's slot and position, in row order.
    pub fn rows(&self) -> (Vec<i32>, Vec<i32>) {
        let mut slots = Vec::with_capacity(self.cu.last().copied().unwrap_or(0));
        let mut pos = Vec::with_capacity(slots.capacity());
        for (s, (&slot, &start)) in self.slots.iter().zip(&self.starts).enumerate() {
            for t in 0..self.cu[s + 1] - self.cu[s] {
                slots.push(slot as i32);
                pos.push((start + t) as i32);
            }
        }
        (slots, pos)
    }
}
