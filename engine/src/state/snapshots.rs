//! Snapshot slots: the prefix cache's copies of a sequence's caches at one token. A snapshot
//! is written inside a prefill pass (a [`crate::SnapshotAt`] of `CausalLm::prefill_many_with`)
//! or copied from a live sequence ([`StatePool::save`]), and copied back into a fresh sequence
//! slot by [`StatePool::restore`]. Which tokens a snapshot stands for is the caller's business
//! (the server's radix index); the pool only knows how many.

use super::{LayerCache, StatePool};
use crate::error::{EngineError, Result};

/// Index of a snapshot slot in a [`StatePool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapId(pub(crate) usize);

impl SnapId {
    /// The slot's position in the pool's buffers (after the sequence slots).
    pub fn index(self) -> usize {
        self.0
    }
}

impl std::fmt::Display for SnapId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "snapshot {}", self.0)
    }
}

/// A snapshot to take inside a prefill pass: `snap` receives sequence `seq`'s caches after its
/// first `tokens` tokens of the pass (a positive multiple of [`crate::PREFILL_CHUNK`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotAt {
    /// The sequence's index in the pass's batch.
    pub seq: usize,
    /// Tokens of this pass before the snapshot.
    pub tokens: usize,
    /// The snapshot slot to write (taken with [`StatePool::take_snapshot`]).
    pub snap: SnapId,
}

impl StatePool {
    /// Snapshot slots in all.
    pub fn snapshots_total(&self) -> usize {
        self.in_use.len() - self.seq_slots
    }

    /// Snapshot slots taken.
    pub fn snapshots_used(&self) -> usize {
        self.snapshots_total() - self.free_snaps.len()
    }

    /// Takes a free snapshot slot, empty (no tokens, no blocks) until a pass or [`Self::save`]
    /// writes it.
    pub fn take_snapshot(&mut self) -> Option<SnapId> {
        self.mirrored(|p| p.take_snapshot_here().ok_or(())).ok()
    }

    fn take_snapshot_here(&mut self) -> Option<SnapId> {
        let s = self.free_snaps.pop()?;
        self.in_use[s] = true;
        self.seen[s] = 0;
        Some(SnapId(s))
    }

    /// Frees a snapshot slot and lets go of its KV blocks.
    pub fn drop_snapshot(&mut self, snap: SnapId) -> Result<()> {
        self.mirrored(|p| p.drop_snapshot_here(snap))
    }

    pub(super) fn drop_snapshot_here(&mut self, snap: SnapId) -> Result<()> {
        self.check_snapshot(snap)?;
        self.drop_table(snap.0);
        self.in_use[snap.0] = false;
        self.seen[snap.0] = 0;
        self.free_snaps.push(snap.0);
        Ok(())
    }

    /// Errors unless `snap` is a taken snapshot slot.
    pub fn check_snapshot(&self, snap: SnapId) -> Result<()> {
        if snap.0 < self.seq_slots || self.in_use.get(snap.0).copied() != Some(true) {
            return Err(EngineError::Invalid { field: "snapshot", expected: "a taken snapshot slot".into(), actual: snap.to_string() });
        }
        Ok(())
    }

    /// Tokens `snap` holds.
    pub fn snapshot_tokens(&self, snap: SnapId) -> usize {
        self.seen.get(snap.0).copied().unwrap_or(0)
    }

    /// KV blocks a snapshot of `tokens` tokens holds.
    pub fn snapshot_blocks(&self, snap: SnapId) -> usize {
        self.tables.get(snap.0).map_or(0, Vec::len)
    }

    /// Copies `slot`'s states into `snap` and shares its KV blocks: the snapshot then holds
    /// the sequence as it is now.
    pub fn save(&mut self, slot: crate::SlotId, snap: SnapId) -> Result<()> {
        self.mirrored(|p| p.save_here(slot, snap))
    }

    fn save_here(&mut self, slot: crate::SlotId, snap: SnapId) -> Result<()> {
        self.check(slot)?;
        self.check_snapshot(snap)?;
        self.copy_states(slot.0, snap.0)?;
        self.seal(snap, slot.0, self.seen[slot.0]);
        Ok(())
    }

    /// Records that `snap` holds the first `tokens` tokens of sequence slot `slot` (its states
    /// were written by a pass): shares the blocks that hold them.
    pub(crate) fn seal(&mut self, snap: SnapId, slot: usize, tokens: usize) {
        self.drop_table(snap.0);
        let n = self.blocks_for(tokens).min(self.tables[slot].len());
        let shared: Vec<u32> = self.tables[slot][..n].to_vec();
        for &b in &shared {
            self.refs[b as usize] += 1;
        }
        self.tables[snap.0] = shared;
        self.seen[snap.0] = tokens;
    }

    /// Makes sequence slot `slot` continue from `snap`: its states become the snapshot's, its
    /// table the snapshot's blocks (shared; a partly filled last block is copied, since the
    /// sequence will write the rest of it) and its position the snapshot's. Whatever `slot`
    /// held before is let go. `Ok(false)` (and nothing changed) when the copy of a partial block
    /// finds no block.
    pub fn restore(&mut self, snap: SnapId, slot: crate::SlotId) -> Result<bool> {
        self.mirrored(|p| p.restore_here(snap, slot))
    }

    fn restore_here(&mut self, snap: SnapId, slot: crate::SlotId) -> Result<bool> {
        self.check(slot)?;
        self.check_snapshot(snap)?;
        let tokens = self.seen[snap.0];
        let shared = self.tables[snap.0].clone();
        let partial = !tokens.is_multiple_of(self.block_size) && !shared.is_empty();
        if partial && self.promised(slot.0) + self.kv_blocks_available() == 0 {
            return Ok(false);
        }
        self.drop_table(slot.0);
        let mut table = shared.clone();
        if partial {
            let last = table.len() - 1;
            let copy = self.take_block(1)?;
            for l in &mut self.layers {
                if let LayerCache::Attention(kv) = l {
                    kv.k.copy_slot(shared[last] as usize, copy as usize)?;
                    kv.v.copy_slot(shared[last] as usize, copy as usize)?;
                }
            }
            table[last] = copy;
        }
        // The copy is held once already (take_block); the shared blocks gain this holder.
        for &b in &table[..table.len() - usize::from(partial)] {
            self.refs[b as usize] += 1;
        }
        self.copy_states(snap.0, slot.0)?;
        if let Some(t) = &self.device_tables {
            t.write(slot.0, 0, &table)?;
        }
        self.tables[slot.0] = table;
        self.seen[slot.0] = tokens;
        Ok(true)
    }

    /// Bytes of one snapshot's states (its KV blocks are counted by [`Self::snapshot_kv_blocks`]).
    pub fn bytes_per_snapshot(&self) -> usize {
        self.bytes_per_slot()
    }

    /// Distinct KV blocks held by snapshots.
    pub fn snapshot_kv_blocks(&self) -> usize {
        let mut held = vec![false; self.total_blocks];
        for t in &self.tables[self.seq_slots..] {
            for &b in t {
                held[b as usize] = true;
            }
        }
        held.into_iter().filter(|&h| h).count()
    }
}
