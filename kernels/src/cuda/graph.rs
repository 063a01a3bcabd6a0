//! CUDA graphs of captured passes, rebuilt as a chain of kernels launched programmatically.
//!
//! A captured pass (candle allocates every op's output on the stream) is a chain in which each
//! kernel follows its output's allocation node, so no edge is kernel to kernel and programmatic
//! dependent launch cannot apply. The rebuild keeps the capture's kernels, copies and memsets in
//! order, drops its allocation and free nodes, and points every address of a graph allocation
//! into one arena laid out by the allocations' lifetimes. An edge from a kernel into one of ours
//! becomes programmatic: ours is launched as the one before it ends, without waiting for that
//! kernel's completion to be signalled, and waits in `pdl_entry` (common.cuh) until its writes
//! are visible. Anything the rebuild does not handle (host or event nodes, child graphs, NCCL's
//! kernels, which keep addresses in device memory) keeps the capture as it was.
//! `DELTASERVE_GRAPH_REBUILD=0` keeps every capture as it was and `DELTASERVE_GRAPH_PDL=0`
//! rebuilds without programmatic edges (for comparisons). `docs/gpu.md`, *Graphs without memory
//! nodes*, has the measurements.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use candle_core::cuda_backend::cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use candle_core::cuda_backend::WrapErr;
use candle_core::CudaDevice;

use crate::arena::{grown, place, Lifetime};
use crate::{KernelError, Result};

/// Alignment of each allocation's place in the arena (that of the driver's allocations).
const ARENA_ALIGN: u64 = 512;

/// A captured pass, instantiated and uploaded; replays on the stream it was captured on.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: Arc<CudaStream>,
    /// The rebuilt graph's allocations (shared with the stream's other rebuilt graphs).
    _arena: Option<Arc<CudaSlice<u8>>>,
    shape: GraphShape,
    /// Why the capture was kept as it was (or was rebuilt without programmatic edges).
    note: Option<String>,
}

// SAFETY: two driver handles, used by one thread at a time (the engine's graph caches take
// `&mut self`); the handles are not tied to a thread.
unsafe impl Send for Graph {}

/// What a capture became.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphShape {
    /// Kernel nodes.
    pub kernels: usize,
    /// Edges made programmatic (0 when not rebuilt).
    pub programmatic: usize,
    /// Allocation and free nodes of the capture (dropped when rebuilt).
    pub memory_nodes: usize,
    /// Bytes of the arena the rebuilt graph's allocations need (0 when not rebuilt).
    pub arena_bytes: usize,
    /// Whether the graph is the rebuild rather than the capture as it was.
    pub rebuilt: bool,
}

impl Graph {
    /// Launches one replay on the capture's stream.
    pub fn launch(&self) -> Result<()> {
        // A raw call acts on the thread's current context.
        self.stream.context().bind_to_thread().w()?;
        // SAFETY: `exec` is a live executable graph of this stream's context.
        unsafe { sys::cuGraphLaunch(self.exec, self.stream.cu_stream()).result() }.w()?;
        Ok(())
    }

    /// What the capture became.
    pub fn shape(&self) -> GraphShape {
        self.shape
    }

    /// Why the capture was not rebuilt with programmatic edges, when it was not.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles are ours and destroyed once; errors cannot be reported from drop.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// Whether captures are rebuilt, and with programmatic edges (module doc).
fn modes() -> (bool, bool) {
    let on = |name: &str| std::env::var(name).map(|v| v != "0").unwrap_or(true);
    (on("DELTASERVE_GRAPH_REBUILD"), on("DELTASERVE_GRAPH_PDL"))
}

/// Records what `record` queues on `dev`'s stream (nothing runs), rebuilds it (module doc) and
/// instantiates and uploads it. `Ok(None)` for a capture with no work; `record`'s error as it
/// is (the stream has left capture mode).
pub fn capture<E: From<KernelError>>(
    dev: &CudaDevice,
    record: impl FnOnce() -> std::result::Result<(), E>,
) -> std::result::Result<Option<Graph>, E> {
    let stream = dev.cuda_stream();
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).w().map_err(KernelError::from)?;
    let recorded = record();
    let mut captured: sys::CUgraph = std::ptr::null_mut();
    // End the capture whatever happened, so the stream leaves capture mode.
    // SAFETY: the stream is capturing; `captured` is written by the driver.
    let ended = unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut captured).result() };
    if let Err(e) = recorded {
        destroy(captured);
        return Err(e);
    }
    ended.w().map_err(KernelError::from)?;
    if captured.is_null() {
        return Ok(None);
    }
    Ok(Some(finish(captured, stream)?))
}

/// The captured graph rebuilt where it can be, else as it is, instantiated and uploaded.
fn finish(captured: sys::CUgraph, stream: Arc<CudaStream>) -> Result<Graph> {
    let (rebuild_on, pdl) = modes();
    let mut tries: Vec<bool> = if rebuild_on { vec![pdl, false] } else { vec![] };
    tries.dedup();
    let mut notes: Vec<String> = Vec::new();
    if rebuild_on && !pdl {
        notes.push("DELTASERVE_GRAPH_PDL=0".into());
    }
    for pdl in tries {
        match rebuild(captured, &stream, pdl) {
            Ok(r) => match instantiate(r.graph, &stream) {
                Ok(exec) => {
                    destroy(captured);
                    tracing::debug!(shape = ?r.shape, "rebuilt a captured graph");
                    let note = (!notes.is_empty()).then(|| notes.join("; "));
                    return Ok(Graph { graph: r.graph, exec, stream, _arena: Some(r.arena), shape: r.shape, note });
                }
                Err(e) => {
                    destroy(r.graph);
                    notes.push(format!("the rebuild (programmatic edges: {pdl}) did not instantiate: {e}"));
                }
            },
            Err(why) => {
                notes.push(format!("not rebuilt: {why}"));
                break;
            }
        }
    }
    if !rebuild_on {
        notes.push("DELTASERVE_GRAPH_REBUILD=0".into());
    }
    let shape = count(captured).unwrap_or_else(|e| {
        notes.push(format!("not counted: {e}"));
        GraphShape::default()
    });
    let note = Some(notes.join("; "));
    tracing::debug!(?note, "graph kept as captured");
    match instantiate(captured, &stream) {
        Ok(exec) => Ok(Graph { graph: captured, exec, stream, _arena: None, shape, note }),
        Err(e) => {
            destroy(captured);
            Err(e)
        }
    }
}

fn destroy(graph: sys::CUgraph) {
    if !graph.is_null() {
        // SAFETY: a graph we own, destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
    }
}

fn instantiate(graph: sys::CUgraph, stream: &Arc<CudaStream>) -> Result<sys::CUgraphExec> {
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: `graph` is a live graph; `exec` is written by the driver and destroyed on failure.
    unsafe {
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).result().w()?;
        if let Err(e) = sys::cuGraphUpload(exec, stream.cu_stream()).result() {
            let _ = sys::cuGraphExecDestroy(exec);
            return Err(KernelError::Candle(candle_core::Error::wrap(e)));
        }
    }
    Ok(exec)
}

/// A driver call's failure as the rebuild reports it.
fn check(r: sys::CUresult, what: &str) -> std::result::Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

/// The graph's nodes in an order that respects its edges (a capture's own order).
fn ordered_nodes(graph: sys::CUgraph) -> std::result::Result<Vec<sys::CUgraphNode>, String> {
    let mut n = 0usize;
    // SAFETY: counting, then filling a buffer of that many nodes.
    check(unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }, "cuGraphGetNodes")?;
    let mut nodes = vec![std::ptr::null_mut(); n];
    check(unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }, "cuGraphGetNodes")?;
    nodes.truncate(n);
    let index: HashMap<usize, usize> = nodes.iter().enumerate().map(|(i, &p)| (p as usize, i)).collect();
    let mut e = 0usize;
    // SAFETY: counting, then filling buffers of that many edges (their data too: a query
    // without it fails on edges that are not default ones).
    check(
        unsafe { sys::cuGraphGetEdges_v2(graph, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), &mut e) },
        "cuGraphGetEdges",
    )?;
    let (mut from, mut to) = (vec![std::ptr::null_mut(); e], vec![std::ptr::null_mut(); e]);
    // SAFETY: zeroed edge data the driver overwrites.
    let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; e];
    if e > 0 {
        check(unsafe { sys::cuGraphGetEdges_v2(graph, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut e) }, "cuGraphGetEdges")?;
    }
    let mut waiting = vec![0usize; n];
    let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (&f, &t) in from.iter().zip(&to).take(e) {
        let (Some(&j), Some(&i)) = (index.get(&(f as usize)), index.get(&(t as usize))) else {
            return Err("an edge outside the graph".into());
        };
        after[j].push(i);
        waiting[i] += 1;
    }
    // Kahn's order, lowest index first among the ready (a chain has one at a time).
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(nodes[i]);
        for &j in &after[i] {
            waiting[j] -= 1;
            if waiting[j] == 0 {
                ready.insert(j);
            }
        }
    }
    if order.len() != n {
        return Err("the graph has a cycle".into());
    }
    Ok(order)
}

fn node_type(node: sys::CUgraphNode) -> std::result::Result<sys::CUgraphNodeType, String> {
    let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: `t` is written by the driver.
    check(unsafe { sys::cuGraphNodeGetType(node, &mut t) }, "cuGraphNodeGetType")?;
    Ok(t)
}

/// The kernel and memory node counts of a graph kept as captured.
fn count(graph: sys::CUgraph) -> std::result::Result<GraphShape, String> {
    let mut shape = GraphShape::default();
    for node in ordered_nodes(graph)? {
        match node_type(node)? {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => shape.kernels += 1,
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC | sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                shape.memory_nodes += 1
            }
            _ => {}
        }
    }
    Ok(shape)
}

/// One graph allocation: its address, size, the positions (in node order) of its allocation and
/// free nodes, and its place in the arena.
struct Allocation {
    dptr: u64,
    size: u64,
    start: usize,
    end: usize,
    offset: u64,
}

/// The graph's allocations, each freed within it, placed in an arena ([`place`]). Returns them
/// and the arena's size.
fn plan(order: &[sys::CUgraphNode], types: &[sys::CUgraphNodeType]) -> std::result::Result<(Vec<Allocation>, u64), String> {
    let mut allocs: Vec<Allocation> = Vec::new();
    for (pos, (&node, &t)) in order.iter().zip(types).enumerate() {
        match t {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                let mut p = std::mem::MaybeUninit::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>::uninit();
                // SAFETY: `p` is written by the driver on success and read only then.
                check(unsafe { sys::cuGraphMemAllocNodeGetParams(node, p.as_mut_ptr()) }, "cuGraphMemAllocNodeGetParams")?;
                let p = unsafe { p.assume_init() };
                allocs.push(Allocation { dptr: p.dptr, size: p.bytesize as u64, start: pos, end: usize::MAX, offset: 0 });
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                let mut dptr: sys::CUdeviceptr = 0;
                // SAFETY: `dptr` is written by the driver.
                check(unsafe { sys::cuGraphMemFreeNodeGetParams(node, &mut dptr) }, "cuGraphMemFreeNodeGetParams")?;
                let a = allocs
                    .iter_mut()
                    .rev()
                    .find(|a| a.dptr == dptr && a.end == usize::MAX)
                    .ok_or("a free node of no allocation of the graph")?;
                a.end = pos;
            }
            _ => {}
        }
    }
    if allocs.iter().any(|a| a.end == usize::MAX) {
        return Err("an allocation outlives the graph".into());
    }
    let lifetimes: Vec<Lifetime> = allocs.iter().map(|a| Lifetime { size: a.size, start: a.start, end: a.end }).collect();
    let (offsets, total) = place(&lifetimes, ARENA_ALIGN);
    for (a, offset) in allocs.iter_mut().zip(offsets) {
        a.offset = offset;
    }
    Ok((allocs, total))
}

/// `v`'s address in the arena when it points into one of the `live` allocations.
fn relocate(live: &[&Allocation], base: u64, v: u64) -> Option<u64> {
    live.iter().find(|a| a.dptr <= v && v < a.dptr + a.size).map(|a| base + a.offset + (v - a.dptr))
}

/// Entries of our PTX modules that wait on `griddepcontrol.wait` (common.cuh's `pdl_entry`).
fn waiting_entries() -> &'static HashSet<&'static str> {
    static SET: OnceLock<HashSet<&'static str>> = OnceLock::new();
    SET.get_or_init(|| pdl::PDL_ENTRIES.iter().copied().collect())
}

mod pdl {
    include!(concat!(env!("OUT_DIR"), "/pdl_entries.rs"));
}

/// The stream's arena of at least `bytes`: rebuilt graphs replay one at a time on their stream,
/// so they share one. A larger one ([`grown`]) replaces it for later graphs; earlier ones keep
/// theirs. The graphs own it: the last one dropped frees it.
fn arena(stream: &Arc<CudaStream>, bytes: u64) -> std::result::Result<Arc<CudaSlice<u8>>, String> {
    static ARENAS: OnceLock<Mutex<HashMap<usize, Weak<CudaSlice<u8>>>>> = OnceLock::new();
    let mut arenas = ARENAS.get_or_init(Default::default).lock().map_err(|_| "arena registry poisoned")?;
    arenas.retain(|_, a| a.strong_count() > 0);
    let key = stream.cu_stream() as usize;
    let current = arenas.get(&key).and_then(Weak::upgrade);
    if let Some(a) = current.as_ref().filter(|a| a.len() as u64 >= bytes) {
        return Ok(a.clone());
    }
    let size = grown(current.map(|a| a.len() as u64), bytes);
    // SAFETY: the arena's contents are scratch, written by a graph before it reads them.
    let slice = unsafe { stream.alloc::<u8>(size as usize) }.map_err(|e| format!("arena of {size} bytes: {e}"))?;
    let a = Arc::new(slice);
    arenas.insert(key, Arc::downgrade(&a));
    Ok(a)
}

struct Rebuilt {
    graph: sys::CUgraph,
    arena: Arc<CudaSlice<u8>>,
    shape: GraphShape,
}

/// The capture as a chain of its kernel, copy and memset nodes over an arena (module doc).
fn rebuild(captured: sys::CUgraph, stream: &Arc<CudaStream>, pdl: bool) -> std::result::Result<Rebuilt, String> {
    use sys::CUgraphNodeType as T;
    let order = ordered_nodes(captured)?;
    let types = order.iter().map(|&n| node_type(n)).collect::<std::result::Result<Vec<_>, _>>()?;
    if let Some(t) = types.iter().find(|t| {
        !matches!(
            t,
            T::CU_GRAPH_NODE_TYPE_KERNEL
                | T::CU_GRAPH_NODE_TYPE_MEMCPY
                | T::CU_GRAPH_NODE_TYPE_MEMSET
                | T::CU_GRAPH_NODE_TYPE_EMPTY
                | T::CU_GRAPH_NODE_TYPE_MEM_ALLOC
                | T::CU_GRAPH_NODE_TYPE_MEM_FREE
        )
    }) {
        return Err(format!("a {t:?} node"));
    }
    let (allocs, bytes) = plan(&order, &types)?;
    let arena = arena(stream, bytes)?;
    let base = arena.device_ptr(stream).0;
    stream.context().bind_to_thread().map_err(|e| e.to_string())?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is written by the driver.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a new empty graph, destroyed below on failure.
    check(unsafe { sys::cuGraphCreate(&mut graph, 0) }, "cuGraphCreate")?;
    let mut shape = GraphShape {
        memory_nodes: types.iter().filter(|t| matches!(t, T::CU_GRAPH_NODE_TYPE_MEM_ALLOC | T::CU_GRAPH_NODE_TYPE_MEM_FREE)).count(),
        arena_bytes: bytes as usize,
        rebuilt: true,
        ..Default::default()
    };
    let built = (|| {
        // The node before, and whether it is a kernel.
        let mut prev: Option<(sys::CUgraphNode, bool)> = None;
        // The allocations alive at this node (allocated before it, freed after it), kept as
        // the walk goes: a few dozen, where the graph has hundreds.
        let (mut live, mut next): (Vec<&Allocation>, usize) = (Vec::new(), 0);
        for (pos, (&node, &t)) in order.iter().zip(&types).enumerate() {
            live.retain(|a| pos < a.end);
            while let Some(a) = allocs.get(next).filter(|a| a.start < pos) {
                if pos < a.end {
                    live.push(a);
                }
                next += 1;
            }
            let reloc = |v| relocate(&live, base, v);
            let (new, waits) = match t {
                T::CU_GRAPH_NODE_TYPE_KERNEL => copy_kernel(graph, node, reloc)?,
                T::CU_GRAPH_NODE_TYPE_MEMCPY => (copy_memcpy(graph, node, ctx, reloc)?, false),
                T::CU_GRAPH_NODE_TYPE_MEMSET => (copy_memset(graph, node, ctx, reloc)?, false),
                _ => continue,
            };
            let kernel = t == T::CU_GRAPH_NODE_TYPE_KERNEL;
            shape.kernels += usize::from(kernel);
            if let Some((p, p_kernel)) = prev {
                // SAFETY: zero is the default edge.
                let mut edge: sys::CUgraphEdgeData = unsafe { std::mem::zeroed() };
                if pdl && p_kernel && waits {
                    edge.type_ = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
                    edge.from_port = sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8;
                    shape.programmatic += 1;
                }
                // SAFETY: both nodes belong to `graph`.
                check(unsafe { sys::cuGraphAddDependencies_v2(graph, &p, &new, &edge, 1) }, "cuGraphAddDependencies_v2")?;
            }
            prev = Some((new, kernel));
        }
        Ok::<(), String>(())
    })();
    match built {
        Ok(()) => Ok(Rebuilt { graph, arena, shape }),
        Err(e) => {
            destroy(graph);
            Err(e)
        }
    }
}

/// Adds a copy of kernel node `node` to `graph`, with addresses relocated by `reloc`; returns it
/// and whether the kernel is one of ours that waits on its predecessors.
fn copy_kernel(
    graph: sys::CUgraph,
    node: sys::CUgraphNode,
    reloc: impl Fn(u64) -> Option<u64>,
) -> std::result::Result<(sys::CUgraphNode, bool), String> {
    let mut p = std::mem::MaybeUninit::<sys::CUDA_KERNEL_NODE_PARAMS_v2>::uninit();
    // SAFETY: `p` is written by the driver on success and read only then; its `kernelParams`
    // point at the node's own copies of the arguments, alive while the captured graph is.
    check(unsafe { sys::cuGraphKernelNodeGetParams_v2(node, p.as_mut_ptr()) }, "cuGraphKernelNodeGetParams")?;
    let p = unsafe { p.assume_init() };
    let mut c: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver returns a NUL-terminated name it owns (of the function, or of the
    // library kernel when the node holds one instead).
    let r = unsafe {
        if p.func.is_null() {
            sys::cuKernelGetName(&mut c, p.kern)
        } else {
            sys::cuFuncGetName(&mut c, p.func)
        }
    };
    check(r, "the kernel's name")?;
    if c.is_null() {
        return Err("a kernel without a name".into());
    }
    let name = unsafe { CStr::from_ptr(c) }.to_string_lossy().into_owned();
    if name.to_ascii_lowercase().contains("nccl") {
        return Err(format!("NCCL kernel {name}"));
    }
    let waits = waiting_entries().contains(name.as_str());
    let mut args: Vec<Vec<u8>> = Vec::new();
    // Arguments one pointer each (else packed, below).
    for i in (0..).take_while(|_| !p.kernelParams.is_null()) {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: out-parameters; an index past the last parameter returns an error.
        let r = unsafe {
            if p.func.is_null() {
                sys::cuKernelGetParamInfo(p.kern, i, &mut offset, &mut size)
            } else {
                sys::cuFuncGetParamInfo(p.func, i, &mut offset, &mut size)
            }
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            break;
        }
        // SAFETY: parameter i of the node is `size` bytes at kernelParams[i].
        let mut bytes = unsafe { std::slice::from_raw_parts(*p.kernelParams.add(i) as *const u8, size) }.to_vec();
        relocate_words(&mut bytes, offset, &reloc);
        args.push(bytes);
    }
    let mut ptrs: Vec<*mut c_void> = args.iter_mut().map(|a| a.as_mut_ptr().cast()).collect();
    let mut q = p;
    q.kernelParams = if ptrs.is_empty() { std::ptr::null_mut() } else { ptrs.as_mut_ptr() };
    // Arguments packed in one buffer (cuBLASLt launches its kernels so).
    let mut packed: Vec<u8>;
    let mut packed_size: usize;
    let mut extra: Vec<*mut c_void> = Vec::new();
    if p.kernelParams.is_null() && !p.extra.is_null() {
        let (mut buf, mut len): (*const u8, Option<usize>) = (std::ptr::null(), None);
        // SAFETY: `extra` is the driver's key/value list, ended by CU_LAUNCH_PARAM_END (0).
        unsafe {
            let mut at = 0;
            loop {
                let key = *p.extra.add(at) as usize;
                if key == sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize {
                    buf = *p.extra.add(at + 1) as *const u8;
                } else if key == sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize {
                    len = Some(*(*p.extra.add(at + 1) as *const usize));
                } else {
                    break;
                }
                at += 2;
            }
            let (false, Some(len)) = (buf.is_null(), len) else {
                return Err(format!("kernel {name}: packed arguments without a buffer and its size"));
            };
            packed = std::slice::from_raw_parts(buf, len).to_vec();
        }
        relocate_words(&mut packed, 0, &reloc);
        packed_size = packed.len();
        extra = vec![
            sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
            packed.as_mut_ptr().cast(),
            sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
            (&mut packed_size as *mut usize).cast(),
            std::ptr::null_mut(),
        ];
    }
    q.extra = if extra.is_empty() { std::ptr::null_mut() } else { extra.as_mut_ptr() };
    let mut new: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: the driver copies the arguments when adding the node; `args`, `packed` and
    // `packed_size` outlive the call.
    check(unsafe { sys::cuGraphAddKernelNode_v2(&mut new, graph, std::ptr::null(), 0, &q) }, "cuGraphAddKernelNode")?;
    check(unsafe { sys::cuGraphKernelNodeCopyAttributes(new, node) }, "cuGraphKernelNodeCopyAttributes")?;
    Ok((new, waits))
}

/// Rewrites each 8-byte word of `bytes` (at `offset` in the argument buffer) that `reloc` maps:
/// addresses come as pointer parameters or inside structs (ours: the attention append's and the
/// decode step's inputs; cuBLAS's), so every aligned word is checked. A word is rewritten only
/// when it lies inside a graph allocation alive at this node, which only an address into it
/// does (the inline slot lists, the one int array passed by value, go unread in a graph: its
/// kernels read the slots from device memory).
fn relocate_words(bytes: &mut [u8], offset: usize, reloc: &impl Fn(u64) -> Option<u64>) {
    for j in (0..bytes.len().saturating_sub(7)).filter(|j| (offset + j).is_multiple_of(8)) {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[j..j + 8]);
        if let Some(to) = reloc(u64::from_ne_bytes(word)) {
            bytes[j..j + 8].copy_from_slice(&to.to_ne_bytes());
        }
    }
}

fn copy_memcpy(
    graph: sys::CUgraph,
    node: sys::CUgraphNode,
    ctx: sys::CUcontext,
    reloc: impl Fn(u64) -> Option<u64>,
) -> std::result::Result<sys::CUgraphNode, String> {
    // The driver fills in every field (some are enums with no zero value).
    let mut c = std::mem::MaybeUninit::<sys::CUDA_MEMCPY3D>::uninit();
    // SAFETY: `c` is written by the driver on success and read only then.
    check(unsafe { sys::cuGraphMemcpyNodeGetParams(node, c.as_mut_ptr()) }, "cuGraphMemcpyNodeGetParams")?;
    let mut c = unsafe { c.assume_init() };
    let device = |t: sys::CUmemorytype| matches!(t, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE | sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED);
    if device(c.srcMemoryType) {
        c.srcDevice = reloc(c.srcDevice).unwrap_or(c.srcDevice);
    }
    if device(c.dstMemoryType) {
        c.dstDevice = reloc(c.dstDevice).unwrap_or(c.dstDevice);
    }
    let mut new: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: a copy of the node's own parameters, relocated.
    check(unsafe { sys::cuGraphAddMemcpyNode(&mut new, graph, std::ptr::null(), 0, &c, ctx) }, "cuGraphAddMemcpyNode")?;
    Ok(new)
}

fn copy_memset(
    graph: sys::CUgraph,
    node: sys::CUgraphNode,
    ctx: sys::CUcontext,
    reloc: impl Fn(u64) -> Option<u64>,
) -> std::result::Result<sys::CUgraphNode, String> {
    let mut m = std::mem::MaybeUninit::<sys::CUDA_MEMSET_NODE_PARAMS>::uninit();
    // SAFETY: `m` is written by the driver on success and read only then.
    check(unsafe { sys::cuGraphMemsetNodeGetParams(node, m.as_mut_ptr()) }, "cuGraphMemsetNodeGetParams")?;
    let mut m = unsafe { m.assume_init() };
    m.dst = reloc(m.dst).unwrap_or(m.dst);
    let mut new: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: a copy of the node's own parameters, relocated.
    check(unsafe { sys::cuGraphAddMemsetNode(&mut new, graph, std::ptr::null(), 0, &m, ctx) }, "cuGraphAddMemsetNode")?;
    Ok(new)
}
