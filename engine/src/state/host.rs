//! The prefix cache's second tier: snapshots moved out of the pool's (GPU) memory into host
//! memory instead of being dropped, and restored from there into a sequence slot. Only the
//! recurrent layers' states move; a snapshot holding KV blocks (a hybrid's) stays where it is.
//! On a GPU the host memory is page-locked and every copy is queued on the device's stream, so
//! a spill costs no wait and a restore is ordered before the pass that reads it.

use deltaserve_kernels::HostSlots;

use super::{LayerCache, StatePool};
use crate::error::{EngineError, Result};

/// Index of a host snapshot slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostSnapId(pub(crate) usize);

impl std::fmt::Display for HostSnapId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host snapshot {}", self.0)
    }
}

/// Host slots for every recurrent layer's conv and recurrent states.
#[derive(Debug)]
pub(crate) struct HostTier {
    /// Per layer: `(conv, recurrent)` host slots, `None` for attention layers.
    layers: Vec<Option<(HostSlots, HostSlots)>>,
    /// Tokens each host slot holds.
    seen: Vec<usize>,
    in_use: Vec<bool>,
    free: Vec<usize>,
}

impl StatePool {
    /// Adds `slots` host snapshot slots. Refused for pools with attention layers, whose
    /// snapshots hold KV blocks that would have to move too.
    pub fn add_host_tier(&mut self, slots: usize) -> Result<()> {
        self.mirrored(|p| p.add_host_tier_here(slots))
    }

    fn add_host_tier_here(&mut self, slots: usize) -> Result<()> {
        if self.total_blocks > 0 || self.layers.iter().any(|l| matches!(l, LayerCache::Attention(_))) {
            return Err(EngineError::Invalid {
                field: "prefix_cache_host_memory",
                expected: "a model without attention layers (a hybrid's snapshots hold KV blocks)".into(),
                actual: format!("{} attention layers", self.layers.iter().filter(|l| matches!(l, LayerCache::Attention(_))).count()),
            });
        }
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                LayerCache::Recurrent(s) => {
                    Ok(Some((HostSlots::for_buffer(&s.conv_state, slots)?, HostSlots::for_buffer(&s.recurrent_state, slots)?)))
                }
                LayerCache::Attention(_) => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        self.host = Some(Box::new(HostTier { layers, seen: vec![0; slots], in_use: vec![false; slots], free: (0..slots).rev().collect() }));
        Ok(())
    }

    /// Host snapshot slots in all (0 without a host tier).
    pub fn host_snapshots_total(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.seen.len())
    }

    /// Host snapshot slots free.
    pub fn host_snapshots_free(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.free.len())
    }

    /// Tokens host slot `h` holds.
    pub fn host_snapshot_tokens(&self, h: HostSnapId) -> usize {
        self.host.as_ref().and_then(|t| t.seen.get(h.0)).copied().unwrap_or(0)
    }

    /// Moves snapshot `snap` into a free host slot and frees `snap`. `Ok(None)` (nothing
    /// changed) when no host slot is free or the snapshot holds KV blocks.
    pub fn spill(&mut self, snap: crate::SnapId) -> Result<Option<HostSnapId>> {
        self.mirrored(|p| p.spill_here(snap))
    }

    fn spill_here(&mut self, snap: crate::SnapId) -> Result<Option<HostSnapId>> {
        self.check_snapshot(snap)?;
        if self.snapshot_blocks(snap) > 0 {
            return Ok(None);
        }
        let tokens = self.seen[snap.0];
        let Some(host) = self.host.as_deref_mut() else { return Ok(None) };
        let Some(h) = host.free.pop() else { return Ok(None) };
        for (l, slots) in self.layers.iter().zip(&mut host.layers) {
            if let (LayerCache::Recurrent(s), Some((conv, rec))) = (l, slots) {
                conv.save(&s.conv_state, snap.0, h)?;
                rec.save(&s.recurrent_state, snap.0, h)?;
            }
        }
        host.in_use[h] = true;
        host.seen[h] = tokens;
        self.drop_snapshot_here(snap)?;
        Ok(Some(HostSnapId(h)))
    }

    /// Makes sequence slot `slot` continue from host snapshot `h` (whatever it held is let go).
    pub fn restore_host(&mut self, h: HostSnapId, slot: crate::SlotId) -> Result<()> {
        self.mirrored(|p| p.restore_host_here(h, slot))
    }

    fn restore_host_here(&mut self, h: HostSnapId, slot: crate::SlotId) -> Result<()> {
        self.check(slot)?;
        let tokens = self.check_host(h)?;
        self.drop_table(slot.0);
        let host = self.host.as_deref().ok_or_else(|| no_host(h))?;
        for (l, slots) in self.layers.iter_mut().zip(&host.layers) {
            if let (LayerCache::Recurrent(s), Some((conv, rec))) = (l, slots) {
                conv.load(&mut s.conv_state, h.0, slot.0)?;
                rec.load(&mut s.recurrent_state, h.0, slot.0)?;
            }
        }
        self.seen[slot.0] = tokens;
        Ok(())
    }

    /// Frees host slot `h`.
    pub fn drop_host(&mut self, h: HostSnapId) -> Result<()> {
        self.mirrored(|p| p.drop_host_here(h))
    }

    fn drop_host_here(&mut self, h: HostSnapId) -> Result<()> {
        self.check_host(h)?;
        if let Some(host) = self.host.as_deref_mut() {
            host.in_use[h.0] = false;
            host.seen[h.0] = 0;
            host.free.push(h.0);
        }
        Ok(())
    }

    /// The tokens `h` holds, or an error unless it is a taken host slot.
    fn check_host(&self, h: HostSnapId) -> Result<usize> {
        match self.host.as_deref() {
            Some(t) if t.in_use.get(h.0).copied() == Some(true) => Ok(t.seen[h.0]),
            _ => Err(no_host(h)),
        }
    }
}

fn no_host(h: HostSnapId) -> EngineError {
    EngineError::Invalid { field: "host snapshot", expected: "a taken host snapshot slot".into(), actual: h.to_string() }
}
