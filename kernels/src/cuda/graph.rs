//! Captured step graphs replayed with programmatic dependent launch (sm_90).
//!
//! A decode step at small batches is some two hundred short kernels, and each one's launch and
//! ramp-up sat between the previous kernel's end and its own first useful load. A programmatic
//! edge lets a kernel be scheduled once every block of its predecessor has started waiting its
//! turn: it runs `await_predecessor()` (kernels/cuda/common.cuh), which holds it until the
//! predecessor has finished and its writes are visible. The GEMVs start pulling their weights
//! into L2 before that wait. Only the kernels in [`AWAITING`] make that call, so only edges into
//! them are changed; every other edge keeps full serialisation.

use std::ffi::CStr;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph, CudaStream};
use candle_core::cuda_backend::WrapErr;

use crate::Result;

/// Name prefixes of the kernels that call `await_predecessor()` before touching memory.
const AWAITING: [&str; 5] = ["gemv_", "add_rms_norm_", "gated_rms_norm_", "conv_step_", "gdr_decode_"];

/// Whether programmatic edges are wanted: `DELTASERVE_PDL=0` turns them off (for comparison).
fn wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("DELTASERVE_PDL").map_or(true, |v| v != "0"))
}

/// A captured graph and, when some of its edges could be made programmatic, a second
/// instantiation with them, which [`Self::launch`] replays.
pub struct StepGraph {
    /// The instantiation with programmatic edges (destroyed before `graph`).
    programmatic: Option<sys::CUgraphExec>,
    /// How many edges are programmatic.
    edges: usize,
    stream: Arc<CudaStream>,
    graph: CudaGraph,
}

// SAFETY: the exec handle is a driver handle, not tied to a thread; StepGraph is used from one
// thread at a time, as CudaGraph is.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Takes a graph captured on `stream`, replayed as captured.
    pub fn new(graph: CudaGraph, stream: Arc<CudaStream>) -> Self {
        Self { programmatic: None, edges: 0, stream, graph }
    }

    /// Makes the edges into [`AWAITING`] kernels programmatic and replays that instantiation
    /// from now on; returns how many edges changed (0 with `DELTASERVE_PDL=0`). On an error the
    /// graph still replays as captured.
    pub fn make_programmatic(&mut self) -> Result<usize> {
        if !wanted() || self.programmatic.is_some() {
            return Ok(self.edges);
        }
        if let Some((exec, edges)) = programmatic(self.graph.cu_graph(), &self.stream)? {
            (self.programmatic, self.edges) = (Some(exec), edges);
        }
        Ok(self.edges)
    }

    /// Edges replayed as programmatic launches.
    pub fn programmatic_edges(&self) -> usize {
        self.edges
    }

    /// Puts the replayed instantiation's resources on the device.
    pub fn upload(&self) -> Result<()> {
        match self.programmatic {
            // SAFETY: `exec` is a live instantiation; the stream belongs to its context.
            Some(exec) => unsafe { sys::cuGraphUpload(exec, self.stream.cu_stream()).result().w()? },
            None => self.graph.upload().w()?,
        }
        Ok(())
    }

    /// Replays the graph on its stream.
    pub fn launch(&self) -> Result<()> {
        match self.programmatic {
            Some(exec) => {
                self.stream.context().bind_to_thread().w()?;
                // SAFETY: as in `upload`.
                unsafe { sys::cuGraphLaunch(exec, self.stream.cu_stream()).result().w()? }
            }
            None => self.graph.launch().w()?,
        }
        Ok(())
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        if let Some(exec) = self.programmatic.take() {
            // SAFETY: destroyed once, before the graph it came from.
            let _ = unsafe { sys::cuGraphExecDestroy(exec) };
        }
    }
}

/// The kernel a graph node launches, by name; `None` for other nodes.
///
/// # Safety
/// `node` is a node of a live graph.
unsafe fn kernel_name(node: sys::CUgraphNode) -> Option<String> {
    let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    unsafe { sys::cuGraphNodeGetType(node, &mut ty) }.result().ok()?;
    if ty != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
        return None;
    }
    let mut params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut params) }.result().ok()?;
    if params.func.is_null() {
        return None;
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    unsafe { sys::cuFuncGetName(&mut name, params.func) }.result().ok()?;
    (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
}

/// Rewrites the kernel-to-kernel edges of `graph` that end at an [`AWAITING`] kernel as
/// programmatic edges and instantiates the result; `None` when there is no such edge.
fn programmatic(graph: sys::CUgraph, stream: &CudaStream) -> Result<Option<(sys::CUgraphExec, usize)>> {
    stream.context().bind_to_thread().w()?;
    let mut n = 0usize;
    // SAFETY: the graph is live; the arrays hold `n` entries as the driver reported.
    unsafe { sys::cuGraphGetEdges_v2(graph, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), &mut n) }.result().w()?;
    let mut from = vec![std::ptr::null_mut(); n];
    let mut to = vec![std::ptr::null_mut(); n];
    let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; n];
    unsafe { sys::cuGraphGetEdges_v2(graph, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut n) }.result().w()?;
    let mut changed = 0;
    for i in 0..n {
        let default = data[i].type_ == sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8 && data[i].from_port == 0;
        // SAFETY: both are nodes of `graph`.
        let (src, dst) = unsafe { (kernel_name(from[i]), kernel_name(to[i])) };
        let awaits = dst.is_some_and(|d| AWAITING.iter().any(|p| d.starts_with(p)));
        if !default || src.is_none() || !awaits {
            continue;
        }
        let edge = sys::CUgraphEdgeData {
            from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
            to_port: 0,
            type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
            reserved: [0; 5],
        };
        // SAFETY: the edge exists (read above) and is replaced by one between the same nodes.
        unsafe {
            sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &data[i], 1).result().w()?;
            sys::cuGraphAddDependencies_v2(graph, &from[i], &to[i], &edge, 1).result().w()?;
        }
        changed += 1;
    }
    if changed == 0 {
        return Ok(None);
    }
    let mut exec = std::ptr::null_mut();
    // SAFETY: `exec` is written by the driver; the graph is live.
    unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result().w()?;
    Ok(Some((exec, changed)))
}
