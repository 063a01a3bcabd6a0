//! The group's all-reduce on GPUs: NCCL, one communicator per GPU of this process, each
//! queuing its collectives on its GPU's stream (so they sit in a decode step's CUDA graph like
//! any kernel).
//!
//! The ranks' threads meet at every all-reduce (a [`Meeting`], as
//! [`ThreadGroup`](super::ThreadGroup)'s do): each leaves its partial, and the last to arrive
//! queues every GPU's all-reduce in one NCCL group ([`all_reduce_sum`]). No GPU's all-reduce is
//! queued while another's is not, so no CUDA call of one thread can wait on an all-reduce that
//! another thread has yet to queue. (Each rank's thread queuing its own, NCCL's one thread per
//! GPU, hung on 2 H200s once its decode steps were CUDA graphs.) In a decode step's graph the
//! meetings happen once, at the capture; replays run without the host.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use deltaserve_kernels::cuda::nccl::{all_reduce_sum, communicators, Communicator};

use super::{AllReduce, Meetings};
use crate::error::{EngineError, Result};

/// NCCL over the GPUs of one process, rank i on the i-th device.
#[derive(Debug)]
pub struct NcclGroup {
    comms: Vec<Communicator>,
    devices: Vec<candle_core::CudaDevice>,
    meetings: Meetings,
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
        tracing::info!(gpus = cuda.len(), "NCCL group");
        let n = cuda.len();
        Ok(Arc::new(Self { comms: communicators(&cuda)?, meetings: Meetings::new(n), devices: cuda }))
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        for (rank, c) in self.comms.iter_mut().enumerate() {
            if let Err(e) = c.close() {
                tracing::warn!(rank, error = %e, "freeing an NCCL communicator failed");
            }
        }
    }
}

impl AllReduce for NcclGroup {
    fn sum(&self, rank: usize, t: &Tensor) -> Result<Tensor> {
        self.meetings.sums.exchange(rank, t.contiguous()?, |parts| {
            let totals = all_reduce_sum(&self.comms, &parts)?;
            // This thread queued work on every GPU: its own device is current again.
            deltaserve_kernels::cuda::bind_to_thread(&self.devices[rank])?;
            Ok(totals)
        })
    }

    fn meetings(&self) -> &Meetings {
        &self.meetings
    }
}
