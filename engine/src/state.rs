//! The batched-state cache: a fixed pool of per-sequence slots that replaces a KV cache.
//!
//! Per layer a slot holds:
//! - `conv_state` `[C, W]` f32: the last W pre-conv inputs of the concatenated `[q | k | v]`
//!   projections, oldest first (model-spec.md §3.2, W not W−1). Kept in f32 on the CPU: the
//!   values are exact copies of the activation-dtype projections.
//! - `recurrent_state` `[HV, K, V]` fp32, K-major, for both architectures: the rank-1 write
//!   and the read-out then stream contiguous V-rows. fla stores GDN's state V-first
//!   (`state_v_first`); that only matters for cache interchange, which we do not do.

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::Device;
use deltaserve_kernels::SlotBuffer;

use crate::cache::CacheSpec;
use crate::error::{EngineError, Result};

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

/// One layer's states for every slot.
#[derive(Debug, Clone)]
pub struct LayerState {
    /// `[slots, C, W]` f32, C = H·K + n·(H·K + HV·Vd).
    pub conv_state: SlotBuffer,
    /// `[slots, HV, K, V]` fp32.
    pub recurrent_state: SlotBuffer,
}

/// A fixed number of sequence slots, each with every layer's conv and recurrent state. Plain
/// data: the model reads and writes it, the engine decides how a step runs.
#[derive(Debug)]
pub struct StatePool {
    id: u64,
    layers: Vec<LayerState>,
    in_use: Vec<bool>,
    free: Vec<usize>,
}

/// Identifies a pool's buffers (a clone gets a new id: its buffers are its own).
fn next_pool_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Clone for StatePool {
    fn clone(&self) -> Self {
        Self { id: next_pool_id(), layers: self.layers.clone(), in_use: self.in_use.clone(), free: self.free.clone() }
    }
}

impl StatePool {
    /// Allocates `slots` zeroed slots for layers that declare `specs`, in host memory.
    pub fn new(specs: &[CacheSpec], slots: usize) -> Self {
        let Ok(layers) = Self::layers(specs, |per_slot| Ok::<_, std::convert::Infallible>(SlotBuffer::zeros(slots, per_slot)));
        Self::from_layers(layers, slots)
    }

    /// Allocates the pool on `device` (GPU memory for CUDA, where kernels update slots in place).
    pub fn new_on(specs: &[CacheSpec], slots: usize, device: &Device) -> Result<Self> {
        let layers = Self::layers(specs, |per_slot| SlotBuffer::zeros_on(slots, per_slot, device))?;
        Ok(Self::from_layers(layers, slots))
    }

    /// Every layer's buffers, made by `zeros(values per slot)`.
    fn layers<E>(
        specs: &[CacheSpec],
        mut zeros: impl FnMut(usize) -> std::result::Result<SlotBuffer, E>,
    ) -> std::result::Result<Vec<LayerState>, E> {
        specs
            .iter()
            .map(|s| match *s {
                CacheSpec::Recurrent { conv_state, recurrent_state } => {
                    Ok(LayerState { conv_state: zeros(conv_state)?, recurrent_state: zeros(recurrent_state)? })
                }
            })
            .collect()
    }

    fn from_layers(layers: Vec<LayerState>, slots: usize) -> Self {
        // Lowest index first, so slot order is predictable in logs.
        Self { id: next_pool_id(), layers, in_use: vec![false; slots], free: (0..slots).rev().collect() }
    }

    /// This pool's identity (decode graphs are bound to one pool's buffers).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether the buffers live in host memory.
    pub fn is_host(&self) -> bool {
        self.layers.first().is_none_or(|l| l.recurrent_state.is_host())
    }

    /// Layers in the pool.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.in_use.len()
    }

    /// Slots currently owned by a sequence.
    pub fn used(&self) -> usize {
        self.capacity() - self.free.len()
    }

    /// Bytes of state per slot across all layers.
    pub fn bytes_per_slot(&self) -> usize {
        self.layers.iter().map(|l| l.conv_state.bytes_per_slot() + l.recurrent_state.bytes_per_slot()).sum()
    }

    /// Takes a free slot and zeroes it, so nothing of its previous owner survives.
    pub fn allocate(&mut self) -> Option<SlotId> {
        let s = self.free.pop()?;
        for l in &mut self.layers {
            // Cannot fail: `s` comes from the free list of this pool.
            let _ = l.conv_state.zero(s);
            let _ = l.recurrent_state.zero(s);
        }
        self.in_use[s] = true;
        Some(SlotId(s))
    }

    /// Takes a free slot holding a copy of `src`'s state (sharing one prompt's prefill).
    pub fn fork(&mut self, src: SlotId) -> Result<Option<SlotId>> {
        self.check(src)?;
        let Some(s) = self.free.pop() else {
            return Ok(None);
        };
        for l in &mut self.layers {
            l.conv_state.copy_slot(src.0, s)?;
            l.recurrent_state.copy_slot(src.0, s)?;
        }
        self.in_use[s] = true;
        Ok(Some(SlotId(s)))
    }

    /// Returns a slot to the pool. Releasing a free slot is an error, not a double free.
    pub fn release(&mut self, slot: SlotId) -> Result<()> {
        self.check(slot)?;
        self.in_use[slot.0] = false;
        self.free.push(slot.0);
        Ok(())
    }

    /// Errors unless `slot` is allocated.
    pub fn check(&self, slot: SlotId) -> Result<()> {
        if self.in_use.get(slot.0).copied() != Some(true) {
            return Err(EngineError::Invalid { field: "slot", expected: "an allocated slot".into(), actual: slot.to_string() });
        }
        Ok(())
    }

    /// Layer `i`'s states.
    pub fn layer_mut(&mut self, i: usize) -> &mut LayerState {
        &mut self.layers[i]
    }

    /// Layer `i`'s states, read-only.
    pub fn layer(&self, i: usize) -> &LayerState {
        &self.layers[i]
    }
}
