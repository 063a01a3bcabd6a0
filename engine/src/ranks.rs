//! A loaded model's ranks (one without tensor parallelism) and how a pass runs on all of them
//! at once. Unsplit, the pass runs on the calling thread. Split, rank r runs every pass on
//! thread r of the ranks' own, rank 0 with the scheduler's pool and the others with that
//! pool's replicas. The ranks meet only in their all-reduces, so each must run the same pass
//! with the same inputs; their host work (kernel launches) overlaps.

use candle_core::Tensor;

use crate::error::{EngineError, Result};
use crate::models::CausalLm;
use crate::state::{SlotId, StatePool};
use crate::tensor_parallel::GroupLink;

/// One rank's model and its captured decode steps.
#[derive(Debug)]
pub(crate) struct Rank {
    pub(crate) model: CausalLm,
    /// This rank's link to its group (a split model).
    link: Option<GroupLink>,
    /// Decode steps captured as CUDA graphs (a GPU model with graphs on).
    #[cfg(feature = "cuda")]
    pub(crate) graphs: Option<std::sync::Mutex<crate::decode_graph::DecodeGraphs>>,
    /// Short prefill passes captured as CUDA graphs (an unsplit GPU model whose layers allow it).
    #[cfg(feature = "cuda")]
    prefill_graphs: Option<std::sync::Mutex<crate::prefill_graph::PrefillGraphs>>,
}

impl Rank {
    /// `model` (rank `link.shard` of a split one) with CUDA graphs for its decode steps when
    /// `graphs` (a GPU model only), and for its prefill passes of up to `prefill_tokens`
    /// tokens and mixed passes of up to `mixed_tokens` prompt tokens where the model allows
    /// (unsplit).
    pub(crate) fn new(model: CausalLm, graphs: bool, (prefill_tokens, mixed_tokens): (usize, usize), link: Option<GroupLink>) -> Self {
        #[cfg(feature = "cuda")]
        let prefill_graphs = {
            let buckets = crate::prefill_graph::Buckets::new(prefill_tokens, mixed_tokens);
            let any = !buckets.all().is_empty() || !buckets.mixed().is_empty();
            let on = graphs && link.is_none() && model.prefill_tables_supported() && any;
            on.then(|| std::sync::Mutex::new(crate::prefill_graph::PrefillGraphs::new(buckets)))
        };
        #[cfg(feature = "cuda")]
        let graphs = (graphs && model.device().is_cuda()).then(Default::default);
        #[cfg(not(feature = "cuda"))]
        let _ = (graphs, prefill_tokens, mixed_tokens);
        Self {
            model,
            link,
            #[cfg(feature = "cuda")]
            graphs,
            #[cfg(feature = "cuda")]
            prefill_graphs,
        }
    }

    /// A packed prefill on this rank's `pool`: a CUDA graph's replay (or capture) where the
    /// pass fits one, else eagerly.
    pub(crate) fn prefill_many(
        &self,
        pool: &mut StatePool,
        batch: &[(SlotId, &[u32])],
        algo: deltaserve_kernels::ops::PrefillAlgo,
        snapshots: &[crate::SnapshotAt],
    ) -> Result<Tensor> {
        self.prefill_and_decode(pool, batch, algo, snapshots, &[])
    }

    /// A mixed pass (a packed prefill and a decode step, as
    /// [`CausalLm::prefill_and_decode`]) on this rank's `pool`: a CUDA graph's replay (or
    /// capture) where the pass fits one, else eagerly.
    pub(crate) fn prefill_and_decode(
        &self,
        pool: &mut StatePool,
        batch: &[(SlotId, &[u32])],
        algo: deltaserve_kernels::ops::PrefillAlgo,
        snapshots: &[crate::SnapshotAt],
        step: &[(SlotId, u32)],
    ) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Some(graphs) = &self.prefill_graphs {
            let mut graphs = graphs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(logits) = graphs.prefill_and_decode(&self.model, pool, batch, algo, snapshots, step)? {
                return Ok(logits);
            }
        }
        self.model.prefill_and_decode(pool, batch, algo, snapshots, step)
    }

    /// The row buckets of the prefill graphs (empty without them).
    pub(crate) fn prefill_graph_buckets(&self) -> Vec<usize> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.prefill_graphs {
            return g.lock().unwrap_or_else(|p| p.into_inner()).buckets().all();
        }
        Vec::new()
    }

    /// The prompt row buckets of the mixed-pass graphs (empty without them).
    pub(crate) fn mixed_graph_buckets(&self) -> Vec<usize> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.prefill_graphs {
            return g.lock().unwrap_or_else(|p| p.into_inner()).buckets().mixed();
        }
        Vec::new()
    }

    /// The prefill shapes with a captured graph (empty without them).
    pub(crate) fn prefill_graph_shapes(&self) -> Vec<crate::prefill_graph::Shape> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.prefill_graphs {
            return g.lock().unwrap_or_else(|p| p.into_inner()).captured();
        }
        Vec::new()
    }

    /// Makes this rank's GPU current on the calling thread (a no-op on the CPU).
    fn bind(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let candle_core::Device::Cuda(d) = self.model.device() {
            deltaserve_kernels::cuda::bind_to_thread(d)?;
        }
        Ok(())
    }

    /// `f` on this rank, bound to its device. A failure (or panic) calls off the group's
    /// collectives, so the other ranks return instead of waiting for this one.
    fn run<T>(&self, pool: &mut StatePool, f: &(impl Fn(&Rank, &mut StatePool) -> Result<T> + Sync)) -> Result<T> {
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.bind().and_then(|()| f(self, pool))))
            .unwrap_or_else(|_| Err(crate::tensor_parallel::rank_panicked("a pass")));
        if let (Err(e), Some(link)) = (&out, &self.link) {
            link.group.abort(&format!("rank {} failed: {e}", link.shard.rank));
        }
        out
    }

    /// One decode step on this rank's `pool`: a CUDA graph's replay (or capture) where there
    /// are graphs, else eagerly. A split model's ranks capture a batch size together: each
    /// keeps its graph only if every rank's capture worked, as each graph's all-reduces wait
    /// for the other ranks' graphs. `out` says whether a replay's logits are copied or lent.
    pub(crate) fn decode(&self, pool: &mut StatePool, batch: &[(SlotId, u32)], out: crate::LogitsOut) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let (Some(graphs), false) = (&self.graphs, pool.is_host()) {
            return graphs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .decode_agreeing(&self.model, pool, batch, out, &|ok| self.agree_on_capture(ok));
        }
        let _ = out;
        self.model.decode(pool, batch)
    }

    /// Whether every rank's decode graph capture worked (`ok` here). A rank whose capture
    /// failed may have left the others waiting in an all-reduce of theirs, so it calls the
    /// group's collectives off: the pass fails on every rank, and the engine runs it again.
    #[cfg(feature = "cuda")]
    fn agree_on_capture(&self, ok: bool) -> Result<bool> {
        match &self.link {
            None => Ok(ok),
            Some(link) if ok => link.agree(true),
            Some(link) => {
                let why = format!("rank {}'s decode graph capture failed", link.shard.rank);
                link.group.abort(&why);
                Err(EngineError::Invalid { field: "decode graph", expected: "a capture on every rank".into(), actual: why })
            }
        }
    }

    /// Whether this rank's decode graph capture of batch size `b` failed (it runs eagerly).
    pub(crate) fn capture_failed(&self, b: usize) -> bool {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graphs {
            return g.lock().unwrap_or_else(|p| p.into_inner()).failed(b);
        }
        let _ = b;
        false
    }

    /// The batch sizes with a captured decode graph (empty without graphs).
    pub(crate) fn graph_batches(&self) -> Vec<usize> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graphs {
            return g.lock().unwrap_or_else(|p| p.into_inner()).captured();
        }
        Vec::new()
    }

    /// [`crate::decode_graph::DecodeGraphs::overlap`] of this rank (empty without graphs).
    pub(crate) fn graph_overlap(&self) -> Vec<crate::GraphOverlap> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graphs {
            return g.lock().unwrap_or_else(|p| p.into_inner()).overlap();
        }
        Vec::new()
    }
}

/// A model's ranks; when there are several, each runs every pass on a thread of its own.
#[derive(Debug)]
pub(crate) struct Ranks {
    ranks: Vec<Rank>,
    /// Thread r runs rank r's every pass (a split model). What CUDA keeps per thread stays
    /// with the rank from pass to pass: candle's cache of uploaded launch parameters, filled by
    /// a decode step's eager run, is what that step's graph capture reads.
    workers: Option<rayon::ThreadPool>,
    /// One split pass at a time: two callers' passes taken in different orders by different
    /// rank threads would meet in each other's all-reduces (rayon happens to queue concurrent
    /// broadcasts in one order, but does not promise it).
    one_pass: std::sync::Mutex<()>,
}

impl std::ops::Deref for Ranks {
    type Target = [Rank];

    fn deref(&self) -> &[Rank] {
        &self.ranks
    }
}

impl Ranks {
    /// `ranks` (at least one), with a thread each when there are several.
    pub(crate) fn new(ranks: Vec<Rank>) -> Result<Self> {
        if ranks.is_empty() {
            return Err(EngineError::Invalid { field: "ranks", expected: "at least one".into(), actual: "0".into() });
        }
        let workers = (ranks.len() > 1)
            .then(|| rayon::ThreadPoolBuilder::new().num_threads(ranks.len()).thread_name(|r| format!("rank{r}")).build())
            .transpose()
            .map_err(|e| EngineError::Invalid { field: "tensor parallel rank", expected: "a thread each".into(), actual: e.to_string() })?;
        Ok(Self { ranks, workers, one_pass: std::sync::Mutex::new(()) })
    }

    /// Runs `f` on every rank at once, rank r on `pool`'s replica r − 1 (rank 0 on `pool`).
    /// Returns rank 0's result, or the first error of any rank.
    pub(crate) fn run<T: Send>(&self, pool: &mut StatePool, f: impl Fn(&Rank, &mut StatePool) -> Result<T> + Sync) -> Result<T> {
        let Some(workers) = &self.workers else {
            return f(&self.ranks[0], pool);
        };
        let _one = self.one_pass.lock().unwrap_or_else(|p| p.into_inner());
        let mut replicas = pool.take_replicas();
        if replicas.len() + 1 != self.ranks.len() {
            let found = replicas.len() + 1;
            pool.put_replicas(replicas);
            return Err(EngineError::Invalid {
                field: "pool",
                expected: format!("a pool of {} tensor parallel ranks (from this engine's `new_pool`)", self.ranks.len()),
                actual: format!("{found} ranks"),
            });
        }
        let mut results: Vec<Result<Option<T>>> = {
            let pools: Vec<std::sync::Mutex<&mut StatePool>> =
                std::iter::once(&mut *pool).chain(replicas.iter_mut()).map(std::sync::Mutex::new).collect();
            workers.broadcast(|ctx| {
                let r = ctx.index();
                let mut pool = pools[r].lock().unwrap_or_else(|p| p.into_inner());
                let out = self.ranks[r].run(&mut pool, &f);
                out.map(|t| (r == 0).then_some(t))
            })
        };
        pool.put_replicas(replicas);
        if results.iter().any(Result::is_err) {
            // Every rank has left the pass: a failed one's group can meet again.
            if let Some(link) = &self.ranks[0].link {
                link.group.reset();
            }
            // Rank 0's error first (it names the others' when it was called off by them).
            return Err(results.into_iter().find_map(Result::err).unwrap_or_else(|| crate::tensor_parallel::rank_panicked("a pass")));
        }
        match results.swap_remove(0) {
            Ok(Some(t)) => Ok(t),
            _ => Err(crate::tensor_parallel::rank_panicked("a pass")),
        }
    }
}
