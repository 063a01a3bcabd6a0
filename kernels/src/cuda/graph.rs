//! Captured step graphs with their kernels back to back.
//!
//! A captured step is a chain of kernels with the stream-ordered allocator's nodes between them:
//! an allocation node before each kernel that makes a fresh output, a free node wherever a
//! temporary was dropped. Those nodes do no work on the GPU, yet each kernel waited on them, so
//! no kernel followed another directly, and a kernel's programmatic launch (pdl.rs) had nothing
//! to overlap. [`StepGraph::end_capture`] rewires the captured graph before instantiating it:
//! - every node that followed allocation or free nodes now depends on the work nodes before them
//!   directly, as a kernel of a programmatic launch (whose code waits for its predecessor,
//!   `pdl_wait`) programmatically;
//! - allocation nodes lose their incoming edges (they run at the start; each keeps its edges to
//!   the nodes that use it), and free nodes their outgoing ones (the graph ends after them).
//!
//! Work nodes keep their order, so every access to an allocation still comes after its
//! allocation node and before its free node. `DELTASERVE_GRAPH_REWRITE=0` keeps graphs as
//! captured (for comparison).

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{sys, CudaStream};
use candle_core::cuda_backend::WrapErr;

use super::pdl;
use crate::Result;

/// What the rewrite did to one graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Kernel nodes.
    pub kernels: usize,
    /// Allocation and free nodes taken off the chain.
    pub memory_nodes: usize,
    /// Dependencies on which a kernel may start before the kernel it follows has finished.
    pub programmatic_edges: usize,
}

/// A captured graph and its instantiation, owned.
pub struct StepGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: Arc<CudaStream>,
    stats: GraphStats,
}

// SAFETY: driver handles, not tied to a thread; a StepGraph is used from one thread at a time
// (its owners keep it behind `&mut self` or a mutex).
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Ends the capture the caller began on `stream`, rewrites the graph (module docs) and
    /// instantiates it. `None` when nothing was captured.
    pub fn end_capture(stream: &Arc<CudaStream>) -> Result<Option<Self>> {
        stream.context().bind_to_thread().w()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: `graph` is written by the driver; the stream is live.
        unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) }.result().w()?;
        if graph.is_null() {
            return Ok(None);
        }
        let mut owned = Self { graph, exec: std::ptr::null_mut(), stream: stream.clone(), stats: GraphStats::default() };
        if rewrite_wanted() {
            // SAFETY: the graph is live and not instantiated yet.
            owned.stats = unsafe { rewrite(graph, pdl::programmatic_device(stream)?) }?;
        }
        // SAFETY: as above; `exec` is written by the driver.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut owned.exec, graph, 0) }.result().w()?;
        Ok(Some(owned))
    }

    /// What the rewrite did.
    pub fn stats(&self) -> GraphStats {
        self.stats
    }

    /// Puts the instantiation's resources on the device, so that the first launch is as fast as
    /// the next.
    pub fn upload(&self) -> Result<()> {
        self.stream.context().bind_to_thread().w()?;
        // SAFETY: a live instantiation; the stream belongs to its context.
        unsafe { sys::cuGraphUpload(self.exec, self.stream.cu_stream()) }.result().w()?;
        Ok(())
    }

    /// Replays the graph on its stream.
    pub fn launch(&self) -> Result<()> {
        self.stream.context().bind_to_thread().w()?;
        // SAFETY: as in `upload`.
        unsafe { sys::cuGraphLaunch(self.exec, self.stream.cu_stream()) }.result().w()?;
        Ok(())
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: each handle is destroyed once, the instantiation first.
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// Whether captured graphs are rewritten (`DELTASERVE_GRAPH_REWRITE=0` keeps them as captured).
fn rewrite_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("DELTASERVE_GRAPH_REWRITE").map_or(true, |v| v != "0"))
}

type Node = sys::CUgraphNode;

fn node_type(node: Node) -> Result<sys::CUgraphNodeType> {
    let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: `node` is a node of a live graph; `ty` is written by the driver.
    unsafe { sys::cuGraphNodeGetType(node, &mut ty) }.result().w()?;
    Ok(ty)
}

/// The name of the function a kernel node launches, when the driver tells it.
fn kernel_name(node: Node) -> Option<String> {
    // SAFETY: a kernel node of a live graph; the parameters and name are written by the driver,
    // and the name is a NUL-terminated string the driver owns.
    unsafe {
        let mut params: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        sys::cuGraphKernelNodeGetParams_v2(node, &mut params).result().ok()?;
        if params.func.is_null() {
            return None;
        }
        let mut name: *const std::ffi::c_char = std::ptr::null();
        sys::cuFuncGetName(&mut name, params.func).result().ok()?;
        (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
    }
}

/// Rewires `graph` in place (module docs); `programmatic` says whether edges into waiting
/// kernels may be programmatic on this device.
///
/// # Safety
/// `graph` is live and not instantiated.
unsafe fn rewrite(graph: sys::CUgraph, programmatic: bool) -> Result<GraphStats> {
    use sys::CUgraphNodeType::{CU_GRAPH_NODE_TYPE_KERNEL as KERNEL, CU_GRAPH_NODE_TYPE_MEM_ALLOC as ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE as FREE};
    let mut n = 0usize;
    // SAFETY (the driver calls below): the graph is live; each array holds the count the driver
    // reported.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }.result().w()?;
    let mut nodes = vec![std::ptr::null_mut(); n];
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }.result().w()?;
    let types: HashMap<Node, sys::CUgraphNodeType> = nodes[..n].iter().map(|&v| Ok((v, node_type(v)?))).collect::<Result<_>>()?;
    let mut e = 0usize;
    unsafe { sys::cuGraphGetEdges_v2(graph, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), &mut e) }.result().w()?;
    let (mut from, mut to) = (vec![std::ptr::null_mut(); e], vec![std::ptr::null_mut(); e]);
    let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; e];
    unsafe { sys::cuGraphGetEdges_v2(graph, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut e) }.result().w()?;
    let memory = |v: &Node| matches!(types.get(v), Some(&ALLOC) | Some(&FREE));
    let mut preds: HashMap<Node, Vec<Node>> = HashMap::new();
    let mut existing: HashSet<(Node, Node)> = HashSet::new();
    for i in 0..e {
        preds.entry(to[i]).or_default().push(from[i]);
        existing.insert((from[i], to[i]));
    }
    // Each work node that waited on memory nodes depends on the work nodes before them instead.
    let mut added: Vec<(Node, Node)> = Vec::new();
    for i in 0..e {
        let (m, v) = (from[i], to[i]);
        if !memory(&m) || memory(&v) {
            continue;
        }
        let (mut stack, mut seen) = (vec![m], HashSet::from([m]));
        while let Some(m) = stack.pop() {
            for &p in preds.get(&m).map(Vec::as_slice).unwrap_or_default() {
                if memory(&p) {
                    if seen.insert(p) {
                        stack.push(p);
                    }
                } else if existing.insert((p, v)) {
                    added.push((p, v));
                }
            }
        }
    }
    // Allocation nodes lose what leads to them, free nodes what follows them.
    for i in 0..e {
        if types.get(&to[i]) == Some(&ALLOC) || types.get(&from[i]) == Some(&FREE) {
            unsafe { sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &data[i], 1) }.result().w()?;
        }
    }
    let waiting = pdl::waiting_kernels();
    let mut stats = GraphStats {
        kernels: types.values().filter(|&&t| t == KERNEL).count(),
        memory_nodes: types.values().filter(|&&t| t == ALLOC || t == FREE).count(),
        programmatic_edges: 0,
    };
    let programmatic_edge = sys::CUgraphEdgeData {
        from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
        to_port: 0,
        type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
        reserved: [0; 5],
    };
    // SAFETY: zeroed edge data is the default (full) dependency.
    let full_edge: sys::CUgraphEdgeData = unsafe { std::mem::zeroed() };
    for (p, v) in added {
        let overlap = programmatic
            && types.get(&p) == Some(&KERNEL)
            && types.get(&v) == Some(&KERNEL)
            && kernel_name(v).is_some_and(|name| waiting.contains(name.as_str()));
        let edge = if overlap { &programmatic_edge } else { &full_edge };
        unsafe { sys::cuGraphAddDependencies_v2(graph, &p, &v, edge, 1) }.result().w()?;
        stats.programmatic_edges += overlap as usize;
    }
    Ok(stats)
}
