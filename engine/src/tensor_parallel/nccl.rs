//! The group's all-reduce on GPUs: NCCL, one communicator per GPU of this process, each
//! queuing its collectives on its GPU's stream (so they sit in a decode step's CUDA graph like
//! any kernel).
//!
//! The ranks' threads meet at every all-reduce, as [`ThreadGroup`](super::ThreadGroup)'s do:
//! each leaves its partial, one of them queues every GPU's all-reduce in one NCCL group
//! ([`all_reduce_sum`]), and all go on together. No rank's thread makes another CUDA call while
//! a GPU's all-reduce is queued and another's is not, which could deadlock them.

use std::sync::{Arc, Barrier, Mutex};

use candle_core::{Device, Tensor};
use deltaserve_kernels::cuda::nccl::{all_reduce_sum, communicators, Communicator};

use super::AllReduce;
use crate::error::{EngineError, Result};

/// NCCL over the GPUs of one process, rank i on the i-th device.
#[derive(Debug)]
pub struct NcclGroup {
    comms: Vec<Communicator>,
    devices: Vec<candle_core::CudaDevice>,
    barrier: Barrier,
    /// Each rank's partial of the current sum, then its total.
    slots: Mutex<Vec<Option<Tensor>>>,
    /// The error of a sum NCCL could not queue (every later sum fails too).
    failed: Mutex<Option<String>>,
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
        Ok(Arc::new(Self {
            comms: communicators(&cuda)?,
            barrier: Barrier::new(cuda.len()),
            slots: Mutex::new(vec![None; cuda.len()]),
            failed: Mutex::new(None),
            devices: cuda,
        }))
    }
}

impl AllReduce for NcclGroup {
    fn sum(&self, rank: usize, t: &Tensor) -> Result<Tensor> {
        if rank >= self.comms.len() {
            return Err(EngineError::Invalid {
                field: "tensor parallel rank",
                expected: format!("a rank below the group size {}", self.comms.len()),
                actual: rank.to_string(),
            });
        }
        self.slots.lock().unwrap_or_else(|p| p.into_inner())[rank] = Some(t.clone());
        if self.barrier.wait().is_leader() {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let parts: Option<Vec<Tensor>> = slots.iter_mut().map(Option::take).collect();
            let outcome = match parts {
                Some(parts) => all_reduce_sum(&self.comms, &parts).map_err(|e| e.to_string()),
                None => Err("a rank's partial is missing".to_owned()),
            };
            match outcome {
                Ok(totals) => slots.iter_mut().zip(totals).for_each(|(s, t)| *s = Some(t)),
                Err(e) => *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e),
            }
            // This thread queued work on every GPU: its own device is current again.
            deltaserve_kernels::cuda::bind_to_thread(&self.devices[rank])?;
        }
        self.barrier.wait();
        let total = self.slots.lock().unwrap_or_else(|p| p.into_inner())[rank].take();
        // A failed group stays failed: its ranks' states no longer agree.
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match (total, failed) {
            (Some(t), None) => Ok(t),
            (_, e) => Err(EngineError::Invalid {
                field: "all-reduce",
                expected: "NCCL to queue every rank's all-reduce".into(),
                actual: e.unwrap_or_else(|| "no total".into()),
            }),
        }
    }
}
