//! A loaded model's ranks (one without tensor parallelism) and how a pass runs on all of them
//! at once: rank 0 on the calling thread with the scheduler's pool, every other rank on a
//! thread of its own with that pool's replica for it. The ranks meet only in their
//! all-reduces, so each must run the same pass with the same inputs; their host work (kernel
//! launches) overlaps.

use candle_core::Tensor;

use crate::error::{EngineError, Result};
use crate::models::CausalLm;
use crate::state::{SlotId, StatePool};

/// One rank's model and its captured decode steps.
#[derive(Debug)]
pub(crate) struct Rank {
    pub(crate) model: CausalLm,
    /// Decode steps captured as CUDA graphs (a GPU model with graphs on).
    #[cfg(feature = "cuda")]
    pub(crate) graphs: Option<std::sync::Mutex<crate::decode_graph::DecodeGraphs>>,
}

impl Rank {
    /// `model` with CUDA graphs for its decode steps when `graphs` (a GPU model only).
    pub(crate) fn new(model: CausalLm, graphs: bool) -> Self {
        #[cfg(feature = "cuda")]
        let graphs = (graphs && model.device().is_cuda()).then(Default::default);
        #[cfg(not(feature = "cuda"))]
        let _ = graphs;
        Self {
            model,
            #[cfg(feature = "cuda")]
            graphs,
        }
    }

    /// Makes this rank's GPU current on the calling thread (a no-op on the CPU).
    fn bind(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let candle_core::Device::Cuda(d) = self.model.device() {
            deltaserve_kernels::cuda::bind_to_thread(d)?;
        }
        Ok(())
    }

    /// One decode step on this rank's `pool`: a CUDA graph's replay (or capture) where there
    /// are graphs, else eagerly.
    pub(crate) fn decode(&self, pool: &mut StatePool, batch: &[(SlotId, u32)]) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let (Some(graphs), false) = (&self.graphs, pool.is_host()) {
            return graphs.lock().unwrap_or_else(|p| p.into_inner()).decode(&self.model, pool, batch);
        }
        self.model.decode(pool, batch)
    }

    /// The batch sizes with a captured decode graph (empty without graphs).
    pub(crate) fn graph_batches(&self) -> Vec<usize> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graphs {
            return g.lock().unwrap_or_else(|p| p.into_inner()).captured();
        }
        Vec::new()
    }
}

/// Runs `f` on every rank at once: rank 0 here on `pool`, rank r > 0 on its own thread on
/// `pool`'s replica r − 1. Returns rank 0's result, or the first error of any rank.
pub(crate) fn on_ranks<T>(ranks: &[Rank], pool: &mut StatePool, f: impl Fn(&Rank, &mut StatePool) -> Result<T> + Sync) -> Result<T> {
    let Some((first, rest)) = ranks.split_first() else {
        return Err(EngineError::Invalid { field: "ranks", expected: "at least one".into(), actual: "0".into() });
    };
    if rest.is_empty() {
        return f(first, pool);
    }
    let mut replicas = pool.take_replicas();
    if replicas.len() != rest.len() {
        let found = replicas.len() + 1;
        pool.put_replicas(replicas);
        return Err(EngineError::Invalid {
            field: "pool",
            expected: format!("a pool of {} tensor parallel ranks (from this engine's `new_pool`)", ranks.len()),
            actual: format!("{found} ranks"),
        });
    }
    let (out, others) = std::thread::scope(|s| {
        let f = &f;
        let jobs: Vec<_> = rest
            .iter()
            .zip(replicas.iter_mut())
            .map(|(rank, pool)| s.spawn(move || rank.bind().and_then(|()| f(rank, pool).map(drop))))
            .collect();
        let out = first.bind().and_then(|()| f(first, pool));
        let others: Vec<Result<()>> =
            jobs.into_iter().map(|j| j.join().unwrap_or_else(|_| Err(crate::tensor_parallel::rank_panicked("a pass")))).collect();
        (out, others)
    });
    pool.put_replicas(replicas);
    let out = out?;
    others.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(out)
}
