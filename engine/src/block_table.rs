//! The pool's block tables in device memory, for the GPU attention kernels: `[slots · width]`
//! i32, slot s's logical block j at `s · width + j`. The pool writes entries as it hands out
//! blocks (outside any CUDA graph), so a captured decode step reads the current tables at each
//! replay.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

/// Block tables of every slot, on a GPU.
#[derive(Debug)]
pub struct DeviceBlockTable {
    table: Tensor,
    width: usize,
}

impl DeviceBlockTable {
    /// Zeroed tables of `width` entries for `slots` slots on `device`; `None` on the CPU, where
    /// the kernels read the pool's host tables.
    pub fn new(slots: usize, width: usize, device: &Device) -> Result<Option<Self>> {
        if device.is_cpu() {
            return Ok(None);
        }
        let table = Tensor::zeros((slots * width).max(1), DType::I32, device)?;
        Ok(Some(Self { table, width }))
    }

    /// Entries per slot.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The `[slots · width]` i32 tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.table
    }

    /// Writes `blocks` as slot `slot`'s entries from logical block `first` on.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub fn write(&self, slot: usize, first: usize, blocks: &[u32]) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        {
            let values: Vec<i32> = blocks.iter().map(|&b| b as i32).collect();
            deltaserve_kernels::cuda::write_at(&self.table, slot * self.width + first, &values)?;
        }
        Ok(())
    }

    /// A copy with its own device memory (a cloned pool must not share tables).
    pub fn deep_copy(&self) -> Result<Self> {
        Ok(Self { table: self.table.copy()?, width: self.width })
    }
}
