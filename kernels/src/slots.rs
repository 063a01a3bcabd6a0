//! A fixed number of equally sized per-sequence state slots in one allocation.

use crate::{KernelError, Result};

/// `slots × per_slot` f32 values; slot `i` is the contiguous range `[i·per_slot, (i+1)·per_slot)`.
#[derive(Debug, Clone)]
pub struct SlotBuffer {
    per_slot: usize,
    data: Vec<f32>,
}

impl SlotBuffer {
    /// Allocates `slots` zeroed slots of `per_slot` values each.
    pub fn zeros(slots: usize, per_slot: usize) -> Self {
        Self { per_slot, data: vec![0.0; slots * per_slot] }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.data.len().checked_div(self.per_slot).unwrap_or(0)
    }

    /// Values per slot.
    pub fn per_slot(&self) -> usize {
        self.per_slot
    }

    /// Bytes held per slot.
    pub fn bytes_per_slot(&self) -> usize {
        self.per_slot * std::mem::size_of::<f32>()
    }

    fn check(&self, slot: usize) -> Result<()> {
        if slot >= self.slots() {
            return Err(KernelError::Slot { slot, slots: self.slots() });
        }
        Ok(())
    }

    /// One slot, read-only.
    pub fn slot(&self, slot: usize) -> Result<&[f32]> {
        self.check(slot)?;
        Ok(&self.data[slot * self.per_slot..(slot + 1) * self.per_slot])
    }

    /// One slot, writable.
    pub fn slot_mut(&mut self, slot: usize) -> Result<&mut [f32]> {
        self.check(slot)?;
        Ok(&mut self.data[slot * self.per_slot..(slot + 1) * self.per_slot])
    }

    /// Zeroes one slot so that nothing of its previous owner survives.
    pub fn zero(&mut self, slot: usize) -> Result<()> {
        self.slot_mut(slot)?.iter_mut().for_each(|x| *x = 0.0);
        Ok(())
    }

    /// Copies slot `src` over slot `dst` (used to fork a prefilled prompt for `n > 1`).
    pub fn copy_slot(&mut self, src: usize, dst: usize) -> Result<()> {
        self.check(src)?;
        self.check(dst)?;
        let p = self.per_slot;
        self.data.copy_within(src * p..(src + 1) * p, dst * p);
        Ok(())
    }

    /// Mutable views of several distinct slots, in the order given.
    pub fn slots_mut(&mut self, slots: &[usize]) -> Result<Vec<&mut [f32]>> {
        let mut seen = vec![false; self.slots()];
        for &s in slots {
            self.check(s)?;
            if std::mem::replace(&mut seen[s], true) {
                return Err(KernelError::Shape {
                    op: "slots_mut",
                    input: "slots",
                    expected: "distinct slot indices".into(),
                    actual: slots.to_vec(),
                });
            }
        }
        let p = self.per_slot;
        let mut by_slot: Vec<Option<&mut [f32]>> = self.data.chunks_mut(p.max(1)).map(Some).collect();
        Ok(slots.iter().map(|&s| by_slot[s].take().unwrap_or_default()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_disjoint_and_checked() {
        let mut b = SlotBuffer::zeros(3, 2);
        b.slot_mut(1).unwrap().copy_from_slice(&[1.0, 2.0]);
        b.copy_slot(1, 2).unwrap();
        assert_eq!(b.slot(2).unwrap(), &[1.0, 2.0]);
        b.zero(1).unwrap();
        assert_eq!(b.slot(1).unwrap(), &[0.0, 0.0]);
        assert!(matches!(b.slot(3), Err(KernelError::Slot { slot: 3, slots: 3 })));
        assert!(b.slots_mut(&[0, 0]).is_err());
        let v = b.slots_mut(&[2, 0]).unwrap();
        assert_eq!(v[0], &[1.0, 2.0]);
    }
}
