//! The group's all-reduce on GPUs: NCCL, one communicator per GPU of this process, each
//! queuing its collectives on its GPU's stream (so they sit in a decode step's CUDA graph like
//! any kernel).
//!
//! The ranks' threads meet at every all-reduce (a `Meeting`, as [`ThreadGroup`](super::ThreadGroup)'s do):
//! each leaves its partial, one of them queues every GPU's all-reduce in one NCCL group
//! ([`all_reduce_sum`]), and all go on together. No rank's thread makes another CUDA call while
//! a GPU's all-reduce is queued and another's is not, which could deadlock them.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use deltaserve_kernels::cuda::nccl::{all_reduce_sum, communicators, Communicator};

use super::{AllReduce, Meeting};
use crate::error::{EngineError, Result};

/// NCCL over the GPUs of one process, rank i on the i-th device.
#[derive(Debug)]
pub struct NcclGroup {
    comms: Vec<Communicator>,
    devices: Vec<candle_core::CudaDevice>,
    meeting: Meeting,
}

impl NcclGroup {
    /// A group over `devices` (distinct GPUs).
    pub fn new(devices: &[Device]) -> Result<Arc<Self>> {
        let cuda = devices
            .iter()
            .map(|d| match d {
                Device::Cuda(c) => Ok(c.clone()),
                other => Err(EngineError::Invalid {
                    field: "tensor parallel device",
                    expected: "a CUDA device for every rank".into(),
                    actual: format!("{other:?}"),
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Self { comms: communicators(&cuda)?, meeting: Meeting::new(cuda.len()), devices: cuda }))
    }
}

impl AllReduce for NcclGroup {
    fn sum(&self, rank: usize, t: &Tensor) -> Result<Tensor> {
        self.meeting.exchange(rank, t.contiguous()?, |parts| {
            let totals = all_reduce_sum(&self.comms, &parts)?;
            // This thread queued work on every GPU: its own device is current again.
            deltaserve_kernels::cuda::bind_to_thread(&self.devices[rank])?;
            Ok(totals)
        })
    }
}
