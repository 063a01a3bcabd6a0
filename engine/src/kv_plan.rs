//! Where the rows of one forward pass read and write the paged KV cache: per sequence its slot,
//! first position and block table (host), and for a GPU pool the same in device memory.

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::ops::{attention_tile_capacity, AttentionShape, DevicePages, PagedSeq, TileKey};

use crate::block_table::DeviceBlockTable;
use crate::error::Result;

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
/// position, `[N]` i32 each (a CUDA graph's own input buffers when it replays).
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
    /// A captured prefill's fixed tile lists, one per attention tile key (empty: each layer
    /// uploads its own).
    pub tiles: Vec<(TileKey, Tensor)>,
}

impl DeviceKv {
    /// The rows' slots and positions `[N]` i32 over the pool's device `tables`, no fixed tile
    /// lists.
    pub fn new(tables: &DeviceBlockTable, row_slot: Tensor, row_pos: Tensor) -> Self {
        Self { tables: tables.tensor().clone(), width: tables.width(), row_slot, row_pos, tiles: Vec::new() }
    }

    /// The kernels' view for a layer whose tile lists have `key`.
    pub fn pages(&self, key: TileKey) -> DevicePages<'_> {
        let tiles = self.tiles.iter().find(|(k, _)| *k == key).map(|(_, t)| t);
        DevicePages { tables: &self.tables, width: self.width, row_slot: &self.row_slot, row_pos: &self.row_pos, tiles }
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

    /// Each sequence's start, slot and block table, as the attention kernels take them.
    pub fn seqs(&self) -> Vec<PagedSeq<'_>> {
        (self.starts.iter().zip(&self.slots).zip(&self.tables)).map(|((&start, &slot), table)| PagedSeq { start, slot, table }).collect()
    }
}

/// A captured pass's KV inputs in fixed device memory, written before each replay in one copy:
/// each row's slot and position, and the prefill tile list of each distinct attention layer
/// shape of the model.
#[derive(Debug)]
pub struct FixedKv {
    /// `[keys · capacity · 4 + 2·rows]` i32: the tile lists (first: the kernels read them as
    /// 16-byte `int4`s), then the rows' slots and positions.
    buf: Tensor,
    rows: usize,
    capacity: usize,
    shapes: Vec<AttentionShape>,
}

impl FixedKv {
    /// Buffers for passes of `rows` rows in at most `seqs` sequences, over attention layers of
    /// `shapes` (one per tile key).
    pub fn new(rows: usize, seqs: usize, shapes: &[AttentionShape], device: &Device) -> Result<Self> {
        let capacity = attention_tile_capacity(rows, seqs);
        let buf = Tensor::zeros(shapes.len() * capacity * 4 + 2 * rows, DType::I32, device)?;
        Ok(Self { buf, rows, capacity, shapes: shapes.to_vec() })
    }

    /// Writes `plan`'s rows (which must cover exactly this buffer's rows) and tile lists.
    #[cfg(feature = "cuda")]
    pub fn fill(&self, plan: &KvPlan) -> Result<()> {
        let (slots, pos) = plan.rows();
        if slots.len() != self.rows {
            return Err(crate::error::EngineError::Invalid {
                field: "KV plan",
                expected: format!("{} rows (the captured pass's)", self.rows),
                actual: slots.len().to_string(),
            });
        }
        let seqs = plan.seqs();
        let pass = deltaserve_kernels::ops::Paged { seqs: &seqs, cu: &plan.cu, block_size: plan.block_size };
        let mut all = Vec::with_capacity(self.buf.elem_count());
        for shape in &self.shapes {
            all.extend(deltaserve_kernels::ops::attention_tiles(shape, &pass, self.capacity, self.buf.device())?);
        }
        all.extend(slots);
        all.extend(pos);
        Ok(deltaserve_kernels::cuda::write_from_host(&self.buf, &all)?)
    }

    /// The pass's view of the cache over the pool's device `tables`.
    pub fn device_kv(&self, tables: &DeviceBlockTable) -> Result<DeviceKv> {
        let (n, len) = (self.rows, self.capacity * 4);
        let tiles =
            (self.shapes.iter().enumerate()).map(|(i, s)| Ok((s.tile_key(), self.buf.narrow(0, i * len, len)?))).collect::<Result<_>>()?;
        let at = self.shapes.len() * len;
        Ok(DeviceKv { tiles, ..DeviceKv::new(tables, self.buf.narrow(0, at, n)?, self.buf.narrow(0, at + n, n)?) })
    }
}
