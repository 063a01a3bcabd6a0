//! The batched-state cache: a fixed pool of per-sequence slots that replaces a KV cache, with
//! a paged KV cache beside it for the attention layers of hybrid models.
//!
//! Per recurrent layer a slot holds:
//! - `conv_state` `[C, W]` f32: the last W pre-conv inputs of the concatenated `[q | k | v]`
//!   projections, oldest first (model-spec.md §3.2, W not W−1). Kept in f32 on the CPU: the
//!   values are exact copies of the activation-dtype projections.
//! - `recurrent_state` `[HV, K, V]` fp32 (bf16 on a GPU when asked), K-major: the rank-1 write
//!   and the read-out then stream contiguous V-rows. fla stores GDN's state V-first
//!   (`state_v_first`); that only matters for cache interchange, which we do not do.
//!
//! Attention layers keep keys and values in fixed-size blocks of `block_size` tokens. A slot
//! owns a block table (logical block → physical block) shared by every attention layer, and a
//! count of the tokens it has seen (its next position). Blocks can be *reserved* for a slot
//! ahead of use, so that a sequence admitted with room for its whole output never runs short.
//!
//! Beside the sequence slots the pool keeps *snapshot* slots, the prefix cache's storage: a
//! copy of a sequence's recurrent and conv states at some token, and references to the KV
//! blocks before it. Blocks are reference-counted; a block a snapshot shares is never written
//! again (sequences only append), so sharing needs no copy except for a partly filled last
//! block, which is copied when a snapshot is restored.

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device};
use deltaserve_kernels::SlotBuffer;

use crate::block_table::DeviceBlockTable;
use crate::cache::CacheSpec;
use crate::error::{EngineError, Result};
pub use crate::kv_plan::{DeviceKv, KvPlan};

/// Index of a slot in a [`StatePool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub(crate) usize);

impl SlotId {
    /// The slot's position in the pool.
    pub fn index(self) -> usize {
        self.0
    }
}

impl std::fmt::Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "slot {}", self.0)
    }
}

/// One recurrent layer's states for every slot.
#[derive(Debug, Clone)]
pub struct LayerState {
    /// `[slots, C, W]` f32, C = H·K + n·(H·K + HV·Vd).
    pub conv_state: SlotBuffer,
    /// `[slots, HV, K, V]`, f32 (or bf16 on a GPU: [`CacheSpec::Recurrent`]'s `state_dtype`).
    pub recurrent_state: SlotBuffer,
}

/// One attention layer's paged keys and values: `[blocks, block_size, HKV, hd]` f32 each.
#[derive(Debug, Clone)]
pub struct KvLayer {
    /// Keys after RoPE.
    pub k: SlotBuffer,
    /// Values.
    pub v: SlotBuffer,
}

/// One layer's cache for every slot.
#[derive(Debug, Clone)]
pub enum LayerCache {
    /// A recurrent layer's conv and recurrent states.
    Recurrent(LayerState),
    /// An attention layer's KV blocks.
    Attention(KvLayer),
}

impl LayerCache {
    /// The recurrent states, if this is a recurrent layer.
    pub fn recurrent(&self) -> Option<&LayerState> {
        match self {
            Self::Recurrent(s) => Some(s),
            Self::Attention(_) => None,
        }
    }

    /// The recurrent states, writable.
    pub fn recurrent_mut(&mut self) -> Result<&mut LayerState> {
        match self {
            Self::Recurrent(s) => Ok(s),
            Self::Attention(_) => Err(mismatch("a recurrent layer's cache", "an attention layer's")),
        }
    }

    /// The KV blocks, writable.
    pub fn kv_mut(&mut self) -> Result<&mut KvLayer> {
        match self {
            Self::Attention(s) => Ok(s),
            Self::Recurrent(_) => Err(mismatch("an attention layer's cache", "a recurrent layer's")),
        }
    }
}

fn mismatch(expected: &str, actual: &str) -> EngineError {
    EngineError::Invalid { field: "pool", expected: expected.into(), actual: actual.into() }
}

/// Tokens per KV block.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// A fixed number of sequence slots, each with every recurrent layer's state, and a paged KV
/// cache for the attention layers. Plain data: the model reads and writes it, the engine
/// decides how a step runs.
#[derive(Debug)]
pub struct StatePool {
    id: u64,
    layers: Vec<LayerCache>,
    /// Sequence slots are `0..seq_slots`; snapshot slots follow.
    seq_slots: usize,
    in_use: Vec<bool>,
    free: Vec<usize>,
    /// Free snapshot slots.
    free_snaps: Vec<usize>,
    /// Tokens each slot has run through the model (a snapshot: the tokens it holds).
    seen: Vec<usize>,
    block_size: usize,
    /// KV blocks in all (0 without attention layers).
    total_blocks: usize,
    free_blocks: Vec<u32>,
    /// Per block: the slots (sequences and snapshots) whose tables hold it.
    refs: Vec<u32>,
    /// Per slot: its physical blocks in logical order.
    tables: Vec<Vec<u32>>,
    /// Per slot: blocks promised to it (held ones included).
    reserved: Vec<usize>,
    /// Blocks one slot may hold (its table's capacity).
    max_blocks: usize,
    /// The tables in device memory, for a pool on a GPU with attention layers.
    device_tables: Option<DeviceBlockTable>,
    /// The prefix cache's host-memory tier, if added ([`Self::add_host_tier`]).
    host: Option<Box<host::HostTier>>,
    /// The other tensor parallel ranks' pools (their devices, their slices of every layer's
    /// states), kept in step with this one: every public change is made to each of them too.
    replicas: Vec<StatePool>,
}

/// Identifies a pool's buffers (a clone gets a new id: its buffers are its own).
fn next_pool_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Clone for StatePool {
    fn clone(&self) -> Self {
        Self {
            id: next_pool_id(),
            layers: self.layers.clone(),
            seq_slots: self.seq_slots,
            in_use: self.in_use.clone(),
            free: self.free.clone(),
            free_snaps: self.free_snaps.clone(),
            seen: self.seen.clone(),
            block_size: self.block_size,
            total_blocks: self.total_blocks,
            free_blocks: self.free_blocks.clone(),
            refs: self.refs.clone(),
            tables: self.tables.clone(),
            reserved: self.reserved.clone(),
            max_blocks: self.max_blocks,
            // A copy that fails (out of device memory) leaves the clone without tables: its
            // GPU attention then refuses to run rather than write another pool's.
            device_tables: self.device_tables.as_ref().and_then(|t| t.deep_copy().ok()),
            // A clone is a scratch copy of the sequences; the host tier stays with the original.
            host: None,
            replicas: self.replicas.clone(),
        }
    }
}

/// Sizes of the pool's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSize {
    /// Sequence slots.
    pub slots: usize,
    /// Snapshot slots of the prefix cache (recurrent and conv states only; KV blocks are
    /// shared with the sequences').
    pub snapshots: usize,
    /// KV blocks shared by all slots (ignored without attention layers).
    pub kv_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Tokens one sequence may cache (its block table's capacity).
    pub max_seq_len: usize,
}

impl PoolSize {
    /// `slots` slots with room for `tokens_per_slot` cached tokens each.
    pub fn for_tokens(slots: usize, tokens_per_slot: usize) -> Self {
        Self {
            slots,
            snapshots: 0,
            kv_blocks: slots * tokens_per_slot.div_ceil(DEFAULT_BLOCK_SIZE),
            block_size: DEFAULT_BLOCK_SIZE,
            max_seq_len: tokens_per_slot,
        }
    }
}

impl StatePool {
    /// Allocates `slots` zeroed slots for layers that declare `specs`, in host memory, without
    /// KV blocks (recurrent models).
    pub fn new(specs: &[CacheSpec], slots: usize) -> Self {
        let size = PoolSize { slots, snapshots: 0, kv_blocks: 0, block_size: DEFAULT_BLOCK_SIZE, max_seq_len: 0 };
        let Ok(layers) = Self::layers(specs, size, |n, per, _| Ok::<_, std::convert::Infallible>(SlotBuffer::zeros(n, per)));
        Self::from_layers(layers, size, None)
    }

    /// Allocates the pool on `device` (GPU memory for CUDA, where kernels update slots in place).
    pub fn new_on(specs: &[CacheSpec], size: PoolSize, device: &Device) -> Result<Self> {
        if size.block_size == 0 {
            return Err(EngineError::Invalid { field: "block_size", expected: "> 0".into(), actual: "0".into() });
        }
        let layers = Self::layers(specs, size, |n, per, dtype| SlotBuffer::zeros_on_as(n, per, device, dtype))?;
        let has_kv = specs.iter().any(|s| matches!(s, CacheSpec::Attention { .. }));
        let tables = if has_kv { DeviceBlockTable::new(size.slots, Self::max_blocks(size), device)? } else { None };
        Ok(Self::from_layers(layers, size, tables))
    }

    /// Blocks one slot may hold: its share of `max_seq_len`, within the whole cache.
    fn max_blocks(size: PoolSize) -> usize {
        size.max_seq_len.div_ceil(size.block_size.max(1)).min(size.kv_blocks)
    }

    /// Every layer's buffers, made by `zeros(count, values each, element type)`.
    fn layers<E>(
        specs: &[CacheSpec],
        size: PoolSize,
        mut zeros: impl FnMut(usize, usize, DType) -> std::result::Result<SlotBuffer, E>,
    ) -> std::result::Result<Vec<LayerCache>, E> {
        specs
            .iter()
            .map(|s| match *s {
                CacheSpec::Recurrent { conv_state, recurrent_state, state_dtype } => Ok(LayerCache::Recurrent(LayerState {
                    conv_state: zeros(size.slots + size.snapshots, conv_state, DType::F32)?,
                    recurrent_state: zeros(size.slots + size.snapshots, recurrent_state, state_dtype)?,
                })),
                CacheSpec::Attention { kv_heads, head_dim, dtype } => {
                    let per_block = size.block_size * kv_heads * head_dim;
                    let (k, v) = (zeros(size.kv_blocks, per_block, dtype)?, zeros(size.kv_blocks, per_block, dtype)?);
                    Ok(LayerCache::Attention(KvLayer { k, v }))
                }
            })
            .collect()
    }

    fn from_layers(layers: Vec<LayerCache>, size: PoolSize, device_tables: Option<DeviceBlockTable>) -> Self {
        let has_kv = layers.iter().any(|l| matches!(l, LayerCache::Attention(_)));
        let total_blocks = if has_kv { size.kv_blocks } else { 0 };
        let (slots, all) = (size.slots, size.slots + size.snapshots);
        // Lowest index first, so slot order is predictable in logs.
        Self {
            id: next_pool_id(),
            layers,
            seq_slots: slots,
            in_use: vec![false; all],
            free: (0..slots).rev().collect(),
            free_snaps: (slots..all).rev().collect(),
            seen: vec![0; all],
            block_size: size.block_size,
            total_blocks,
            free_blocks: (0..total_blocks as u32).rev().collect(),
            refs: vec![0; total_blocks],
            tables: vec![Vec::new(); all],
            reserved: vec![0; all],
            max_blocks: Self::max_blocks(size),
            device_tables,
            host: None,
            replicas: Vec::new(),
        }
    }

    /// The block tables in device memory (a GPU pool with attention layers).
    pub fn device_tables(&self) -> Option<&DeviceBlockTable> {
        self.device_tables.as_ref()
    }

    /// This pool's identity (decode graphs are bound to one pool's buffers).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether the buffers live in host memory.
    pub fn is_host(&self) -> bool {
        self.layers.iter().all(|l| match l {
            LayerCache::Recurrent(s) => s.recurrent_state.is_host(),
            LayerCache::Attention(kv) => kv.k.is_host(),
        })
    }

    /// Layers in the pool.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether any layer keeps a KV cache.
    pub fn has_kv(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerCache::Attention(_)))
    }

    /// Sequence slots in all.
    pub fn capacity(&self) -> usize {
        self.seq_slots
    }

    /// Slots currently owned by a sequence.
    pub fn used(&self) -> usize {
        self.capacity() - self.free.len()
    }

    /// Bytes of fixed-size state per slot across all layers.
    pub fn bytes_per_slot(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Recurrent(s) => s.conv_state.bytes_per_slot() + s.recurrent_state.bytes_per_slot(),
                LayerCache::Attention(_) => 0,
            })
            .sum()
    }

    /// Bytes of one KV block across all attention layers.
    pub fn bytes_per_block(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Recurrent(_) => 0,
                LayerCache::Attention(kv) => kv.k.bytes_per_slot() + kv.v.bytes_per_slot(),
            })
            .sum()
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// KV blocks in all.
    pub fn kv_blocks_total(&self) -> usize {
        self.total_blocks
    }

    /// KV blocks held by sequences.
    pub fn kv_blocks_used(&self) -> usize {
        self.total_blocks - self.free_blocks.len()
    }

    /// KV blocks neither held nor promised to a slot.
    pub fn kv_blocks_available(&self) -> usize {
        let promised: usize = (0..self.capacity()).map(|s| self.promised(s)).sum();
        self.free_blocks.len().saturating_sub(promised)
    }

    /// Blocks that hold `tokens` tokens (0 without attention layers).
    pub fn blocks_for(&self, tokens: usize) -> usize {
        if self.total_blocks == 0 && !self.has_kv() {
            return 0;
        }
        tokens.div_ceil(self.block_size)
    }

    /// Blocks promised to `slot` beyond those it holds.
    fn promised(&self, slot: usize) -> usize {
        self.reserved[slot].saturating_sub(self.tables[slot].len())
    }

    /// Tokens `slot` has run through the model (its next position).
    pub fn seen(&self, slot: SlotId) -> usize {
        self.seen.get(slot.0).copied().unwrap_or(0)
    }

    /// Promises `slot` room for `tokens` cached tokens in all. Returns false (and promises
    /// nothing) when the unpromised free blocks do not cover it.
    pub fn reserve(&mut self, slot: SlotId, tokens: usize) -> Result<bool> {
        self.mirrored(|p| p.reserve_here(slot, tokens))
    }

    fn reserve_here(&mut self, slot: SlotId, tokens: usize) -> Result<bool> {
        self.check(slot)?;
        let want = self.blocks_for(tokens);
        if want > self.max_blocks {
            return Err(EngineError::Invalid {
                field: "tokens",
                expected: format!("at most {} cached tokens a sequence", self.max_blocks * self.block_size),
                actual: tokens.to_string(),
            });
        }
        let extra = want.saturating_sub(self.reserved[slot.0].max(self.tables[slot.0].len()));
        if extra > self.kv_blocks_available() {
            return Ok(false);
        }
        self.reserved[slot.0] = self.reserved[slot.0].max(want);
        Ok(true)
    }

    /// Makes `slot`'s table cover `tokens` tokens, from its promise or the unpromised blocks.
    fn ensure_blocks(&mut self, slot: usize, tokens: usize) -> Result<()> {
        let want = self.blocks_for(tokens);
        let need = want.saturating_sub(self.tables[slot].len());
        if need == 0 {
            return Ok(());
        }
        if want > self.max_blocks {
            return Err(EngineError::Invalid {
                field: "tokens",
                expected: format!("at most {} cached tokens a sequence", self.max_blocks * self.block_size),
                actual: tokens.to_string(),
            });
        }
        if need > self.promised(slot) + self.kv_blocks_available() {
            return Err(EngineError::KvCacheFull {
                needed: need,
                available: self.promised(slot) + self.kv_blocks_available(),
                block_size: self.block_size,
            });
        }
        let first = self.tables[slot].len();
        for _ in 0..need {
            let b = self.take_block(need)?;
            self.tables[slot].push(b);
        }
        if let Some(t) = &self.device_tables {
            t.write(slot, first, &self.tables[slot][first..])?;
        }
        Ok(())
    }

    /// Plans a pass in which `slots[s]` runs `lens[s]` new tokens: takes the blocks they need
    /// and returns where each starts and its table.
    pub(crate) fn plan(&mut self, slots: &[usize], lens: &[usize]) -> Result<KvPlan> {
        let mut plan = KvPlan {
            block_size: self.block_size,
            slots: slots.to_vec(),
            starts: Vec::with_capacity(slots.len()),
            tables: Vec::new(),
            cu: vec![0],
            device: None,
        };
        let kv = self.has_kv();
        for (&s, &n) in slots.iter().zip(lens) {
            plan.starts.push(self.seen[s]);
            plan.cu.push(plan.cu[plan.cu.len() - 1] + n);
            if kv {
                self.ensure_blocks(s, self.seen[s] + n)?;
                plan.tables.push(self.tables[s].clone());
            }
        }
        Ok(plan)
    }

    /// Records that `slots[s]` ran `lens[s]` more tokens.
    pub(crate) fn advance(&mut self, slots: &[usize], lens: &[usize]) {
        for (&s, &n) in slots.iter().zip(lens) {
            self.seen[s] += n;
        }
    }

    /// Sets the tokens `slot` has run (undoes an [`Self::advance`] whose work never ran).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn set_seen(&mut self, slot: usize, tokens: usize) {
        if let Some(s) = self.seen.get_mut(slot) {
            *s = tokens;
        }
    }

    /// Takes a free slot and zeroes it, so nothing of its previous owner survives.
    pub fn allocate(&mut self) -> Option<SlotId> {
        self.mirrored(|p| p.allocate_here().ok_or(())).ok()
    }

    fn allocate_here(&mut self) -> Option<SlotId> {
        let s = self.free.pop()?;
        let mut bufs: Vec<&mut SlotBuffer> = Vec::with_capacity(2 * self.layers.len());
        for l in &mut self.layers {
            if let LayerCache::Recurrent(l) = l {
                bufs.push(&mut l.conv_state);
                bufs.push(&mut l.recurrent_state);
            }
        }
        // Cannot fail for a slot of this pool's free list, but a failed launch must not hand
        // out a slot holding its previous owner's state.
        if SlotBuffer::zero_all(&mut bufs, s).is_err() {
            self.free.push(s);
            return None;
        }
        self.in_use[s] = true;
        self.seen[s] = 0;
        Some(SlotId(s))
    }

    /// Takes a free slot holding a copy of `src`'s state and KV blocks (sharing one prompt's
    /// prefill). `None` when no slot, or not enough unpromised KV blocks, is free.
    pub fn fork(&mut self, src: SlotId) -> Result<Option<SlotId>> {
        self.mirrored(|p| p.fork_here(src))
    }

    fn fork_here(&mut self, src: SlotId) -> Result<Option<SlotId>> {
        self.check(src)?;
        let blocks = self.tables[src.0].len();
        if self.free.is_empty() || blocks > self.kv_blocks_available() {
            return Ok(None);
        }
        let Some(s) = self.free.pop() else { return Ok(None) };
        let mut table = Vec::with_capacity(blocks);
        for _ in 0..blocks {
            table.push(self.take_block(blocks)?);
        }
        self.copy_states(src.0, s)?;
        for l in &mut self.layers {
            match l {
                LayerCache::Recurrent(_) => {}
                LayerCache::Attention(kv) => {
                    for (&from, &to) in self.tables[src.0].iter().zip(&table) {
                        kv.k.copy_slot(from as usize, to as usize)?;
                        kv.v.copy_slot(from as usize, to as usize)?;
                    }
                }
            }
        }
        if let Some(t) = &self.device_tables {
            t.write(s, 0, &table)?;
        }
        self.tables[s] = table;
        self.reserved[s] = blocks;
        self.seen[s] = self.seen[src.0];
        self.in_use[s] = true;
        Ok(Some(SlotId(s)))
    }

    /// Returns a slot and its KV blocks to the pool. Releasing a free slot is an error, not a
    /// double free.
    pub fn release(&mut self, slot: SlotId) -> Result<()> {
        self.mirrored(|p| p.release_here(slot))
    }

    fn release_here(&mut self, slot: SlotId) -> Result<()> {
        self.check(slot)?;
        self.in_use[slot.0] = false;
        self.free.push(slot.0);
        self.drop_table(slot.0);
        self.reserved[slot.0] = 0;
        self.seen[slot.0] = 0;
        Ok(())
    }

    /// A free block, now held once. `needed` is for the error.
    fn take_block(&mut self, needed: usize) -> Result<u32> {
        let b = self.free_blocks.pop().ok_or(EngineError::KvCacheFull { needed, available: 0, block_size: self.block_size })?;
        self.refs[b as usize] = 1;
        Ok(b)
    }

    /// Lets go of slot `i`'s blocks; those no other table holds become free.
    fn drop_table(&mut self, i: usize) {
        for b in std::mem::take(&mut self.tables[i]).into_iter().rev() {
            let r = &mut self.refs[b as usize];
            *r = r.saturating_sub(1);
            if *r == 0 {
                self.free_blocks.push(b);
            }
        }
    }

    /// Errors unless `slot` is an allocated sequence slot.
    pub fn check(&self, slot: SlotId) -> Result<()> {
        if slot.0 >= self.seq_slots || self.in_use.get(slot.0).copied() != Some(true) {
            return Err(EngineError::Invalid { field: "slot", expected: "an allocated slot".into(), actual: slot.to_string() });
        }
        Ok(())
    }

    /// Layer `i`'s cache.
    pub fn layer_mut(&mut self, i: usize) -> &mut LayerCache {
        &mut self.layers[i]
    }

    /// Layer `i`'s cache, read-only.
    pub fn layer(&self, i: usize) -> &LayerCache {
        &self.layers[i]
    }
}

mod host;
mod replicas;
mod slot_copies;
mod snapshots;
#[cfg(test)]
mod tests;

pub use host::HostSnapId;
pub use snapshots::{SnapId, SnapshotAt};
