//! Projections with many rows as cublasLt GEMMs whose algorithm is chosen once per row bucket.
//!
//! cuBLAS picks a kernel for every new row count, and the first call of a kernel the process
//! has not run yet costs 3–5 ms of host time on the device host (its heuristic and the kernel's
//! loading; `gpu_bench --new-shapes`). A server's prefill passes rarely repeat a row count,
//! so each new prompt length paid that on its first layer. Here the algorithm is asked for at
//! the row count rounded up to a bucket (16, 32, 64, then multiples of 64) and reused for every
//! row count in it: a bounded set of kernels, each loaded once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::cublaslt::{result as lt, sys};
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, DType, Tensor};

use super::{first_element_address, wrap};
use crate::Result;

/// Workspace for split-K algorithms (NVIDIA's recommendation for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// What an algorithm is chosen for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    dtype: DType,
    n: usize,
    k: usize,
    bucket: usize,
    lda: usize,
    /// The smallest alignment (bytes, up to 16) of the three matrices' first elements and of
    /// x's row stride.
    align: u64,
    /// The output's type and the split-K reduction schemes allowed.
    variant: LtVariant,
}

/// How a GEMM's output is produced: its type, and which split-K reduction schemes the heuristic
/// may offer (`cublasLtReductionScheme_t` bits; `None`: any). The engine runs the default;
/// `gpu_bench --gemm-algos` times the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LtVariant {
    /// f32 output (the operands' type otherwise).
    pub out_f32: bool,
    /// `CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK`.
    pub reduction_mask: Option<u32>,
}

/// GEMMs run through cublasLt and those handed back to candle (no algorithm, or refused), since
/// start: `(ran, handed back)`.
pub fn linear_lt_counts() -> (u64, u64) {
    (RAN.load(Ordering::Relaxed), HANDED_BACK.load(Ordering::Relaxed))
}

static RAN: AtomicU64 = AtomicU64::new(0);
static HANDED_BACK: AtomicU64 = AtomicU64::new(0);

/// One stream's cublasLt handle, workspace and chosen algorithms.
struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// `None` where the heuristic found nothing or the call failed: candle's GEMM runs those.
    algos: HashMap<Key, Option<sys::cublasLtMatmulAlgo_t>>,
    /// The heuristic's n-th algorithm for `key`, for [`linear_lt_pick`].
    picked: HashMap<(Key, usize), Option<sys::cublasLtMatmulAlgo_t>>,
}

// SAFETY: the handle is only used under its stream's lock, by one thread at a time.
unsafe impl Send for Lt {}

/// Per stream (keyed by its address): GEMMs on one stream are ordered, so its workspace is
/// never used by two at once. Each stream has its own lock, so tensor parallel ranks (one
/// stream each, launching from their own threads) do not wait on each other.
fn registry() -> &'static Mutex<HashMap<usize, Arc<Mutex<Lt>>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<Mutex<Lt>>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The row count an algorithm is chosen at.
fn bucket(rows: usize) -> usize {
    match rows {
        0..=16 => 16,
        17..=32 => 32,
        _ => rows.div_ceil(64) * 64,
    }
}

/// Whether `DELTASERVE_CUBLASLT=0` turned this path off (for comparisons).
fn disabled() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var("DELTASERVE_CUBLASLT").is_ok_and(|v| v == "0"))
}

/// Descriptors of one call, destroyed on drop.
struct Descs {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each was created once and is destroyed once, here.
        unsafe {
            for &l in &self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// Row-major `y [M, N] = x [M, K] · w [N, K]ᵀ` is column-major `yᵀ = op(w)ᵀ · x`: A is `w`'s
/// buffer read transposed, B is `x`'s with leading dimension `lda`.
fn descs(ty: sys::cudaDataType, out_f32: bool, n: usize, k: usize, m: usize, lda: usize) -> std::result::Result<Descs, lt::CublasError> {
    let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)?;
    let mut d = Descs { desc, layouts: Vec::with_capacity(3) };
    let trans: i32 = 1;
    // SAFETY: the attribute is an i32 as cublasLt expects for TRANSA.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            (&trans as *const i32).cast(),
            std::mem::size_of::<i32>(),
        )?;
    }
    let out_ty = if out_f32 { sys::cudaDataType::CUDA_R_32F } else { ty };
    for (t, rows, cols, ld) in [(ty, k, n, k), (ty, k, m, lda), (out_ty, n, m, n)] {
        d.layouts.push(lt::create_matrix_layout(t, rows as u64, cols as u64, ld as i64)?);
    }
    Ok(d)
}

/// An algorithm's configuration as `id/tile/stages/split-K/reduction`, for benchmark logs.
fn describe(algo: &sys::cublasLtMatmulAlgo_t) -> String {
    use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
    // Each attribute read here is a 32-bit integer (cublasLt checks the size).
    let get = |attr: A| -> Option<u32> {
        let mut v = 0u32;
        let mut written = 0usize;
        // SAFETY: `v` holds the 4 bytes asked for.
        let r = unsafe { sys::cublasLtMatmulAlgoConfigGetAttribute(algo, attr, (&mut v as *mut u32).cast(), 4, &mut written) };
        (r == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v)
    };
    let show = |attr: A| get(attr).map_or_else(|| "?".to_string(), |v| v.to_string());
    format!(
        "id {} tile {} stages {} splitK {} reduction {}",
        show(A::CUBLASLT_ALGO_CONFIG_ID),
        show(A::CUBLASLT_ALGO_CONFIG_TILE_ID),
        show(A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
        show(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
        show(A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)
    )
}

/// The heuristic's first algorithm for `key`, or `None`.
fn choose(lt_: &Lt, key: Key, ty: sys::cudaDataType) -> Option<sys::cublasLtMatmulAlgo_t> {
    candidates(lt_, key, ty, 1).into_iter().next()
}

/// Up to `count` algorithms for `key`, in the heuristic's order.
fn candidates(lt_: &Lt, key: Key, ty: sys::cudaDataType, count: usize) -> Vec<sys::cublasLtMatmulAlgo_t> {
    let Ok(d) = descs(ty, key.variant.out_f32, key.n, key.k, key.bucket, key.lda) else { return Vec::new() };
    let Ok(pref) = lt::create_matmul_pref() else { return Vec::new() };
    let ws = WORKSPACE_BYTES;
    // SAFETY: a plain C struct for which all-zero bytes are a valid value.
    let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; count];
    let mut found = 0i32;
    // SAFETY: the descriptors and the preference are valid until dropped/destroyed below; the
    // result buffer holds the `count` results asked for.
    let ok = unsafe {
        let set = lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&ws as *const usize).cast(),
            std::mem::size_of::<usize>(),
        );
        let align = key.align as u32;
        let mut set_align = Ok(());
        for attr in [
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ] {
            set_align = set_align.and(lt::set_matmul_pref_attribute(pref, attr, (&align as *const u32).cast(), 4));
        }
        let set_mask = match key.variant.reduction_mask {
            Some(mask) => lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                (&mask as *const u32).cast(),
                4,
            ),
            None => Ok(()),
        };
        let r = set.and(set_align).and(set_mask).and_then(|_| {
            sys::cublasLtMatmulAlgoGetHeuristic(
                lt_.handle,
                d.desc,
                d.layouts[0],
                d.layouts[1],
                d.layouts[2],
                d.layouts[2],
                pref,
                count as i32,
                results.as_mut_ptr(),
                &mut found,
            )
            .result()
        });
        let _ = lt::destroy_matmul_pref(pref);
        r.is_ok()
    };
    let found = if ok { (found.max(0) as usize).min(count) } else { 0 };
    results.truncate(found);
    results.into_iter().map(|r| r.algo).collect()
}

/// `x [M, K] · w [N, K]ᵀ` through cublasLt for bf16/f16 operands on a CUDA device, `x` read
/// where it lies when its rows are contiguous (`w` contiguous). `None` where this path does
/// not apply or found no algorithm: the caller runs candle's GEMM.
pub fn linear_lt(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    Ok(dispatch(x, w, None, LtVariant::default())?.map(|(y, _)| y))
}

/// [`linear_lt`] with the heuristic's `pick`-th algorithm (0 is the one [`linear_lt`] runs),
/// for benchmarks that time the alternatives: the product and the algorithm's configuration
/// (`id/tile/stages/split-K`); `None` also where the heuristic offers fewer.
pub fn linear_lt_pick(x: &Tensor, w: &Tensor, pick: usize, variant: LtVariant) -> Result<Option<(Tensor, String)>> {
    Ok(dispatch(x, w, Some(pick), variant)?.map(|(y, algo)| (y, algo.map(|a| describe(&a)).unwrap_or_default())))
}

/// The product and, for a pick, the algorithm that ran.
type Ran = (Tensor, Option<sys::cublasLtMatmulAlgo_t>);

fn dispatch(x: &Tensor, w: &Tensor, pick: Option<usize>, variant: LtVariant) -> Result<Option<Ran>> {
    match (x.dtype(), w.dtype(), variant.out_f32) {
        (DType::BF16, DType::BF16, false) => typed::<half::bf16, half::bf16>(x, w, sys::cudaDataType::CUDA_R_16BF, pick, variant),
        (DType::F16, DType::F16, false) => typed::<half::f16, half::f16>(x, w, sys::cudaDataType::CUDA_R_16F, pick, variant),
        (DType::BF16, DType::BF16, true) => typed::<half::bf16, f32>(x, w, sys::cudaDataType::CUDA_R_16BF, pick, variant),
        (DType::F16, DType::F16, true) => typed::<half::f16, f32>(x, w, sys::cudaDataType::CUDA_R_16F, pick, variant),
        _ => Ok(None),
    }
}

/// Operands `T`, output `O` (`T`, or f32 for [`LtVariant::out_f32`]).
fn typed<T, O>(x: &Tensor, w: &Tensor, ty: sys::cudaDataType, pick: Option<usize>, variant: LtVariant) -> Result<Option<Ran>>
where
    T: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
    O: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
{
    use candle_core::cuda_backend::cudarc::driver::DevicePtrMut;
    let (Ok((m, k)), Ok((n, wk))) = (x.dims2(), w.dims2()) else { return Ok(None) };
    let (xs, ws) = (x.stride(), w.stride());
    if disabled() || wk != k || m == 0 || n == 0 || xs[1] != 1 || xs[0] < k || ws != [k, 1] {
        return Ok(None);
    }
    let candle_core::Device::Cuda(dev) = x.device() else { return Ok(None) };
    let lda = xs[0];
    let (xp, wp) = (first_element_address::<T>(x)?, first_element_address::<T>(w)?);
    // SAFETY: the GEMM writes every element (beta = 0) before anything reads it.
    let mut out = unsafe { dev.alloc::<O>(m * n) }?;
    let yp = {
        let stream = dev.cuda_stream();
        let (p, _sync) = out.device_ptr_mut(&stream);
        p
    };
    let size = std::mem::size_of::<T>() as u64;
    let align = [xp, wp, yp, lda as u64 * size].iter().map(|&a| 1u64 << a.trailing_zeros().min(4)).min().unwrap_or(2);
    let key = Key { dtype: x.dtype(), n, k, bucket: bucket(m), lda, align, variant };
    // The counters count the engine's calls, not a benchmark's picks.
    let counter = |c: &AtomicU64| {
        if pick.is_none() {
            c.fetch_add(1, Ordering::Relaxed);
        }
    };
    let Some(algo) = run(dev, key, ty, m, [wp, xp, yp], pick)? else {
        counter(&HANDED_BACK);
        return Ok(None);
    };
    counter(&RAN);
    Ok(Some((wrap(dev, out, (m, n)), pick.map(|_| algo))))
}

/// Queues the GEMM with `key`'s algorithm (chosen on first use), or the heuristic's `pick`-th;
/// returns the algorithm, `None` when there is none or cublasLt refused it (then never tried
/// again for `key`).
fn run(
    dev: &CudaDevice,
    key: Key,
    ty: sys::cudaDataType,
    m: usize,
    [wp, xp, yp]: [u64; 3],
    pick: Option<usize>,
) -> Result<Option<sys::cublasLtMatmulAlgo_t>> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtrMut;
    let stream = dev.cuda_stream();
    let id = stream.cu_stream() as usize;
    let entry = {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        match reg.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.get().clone(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let handle = lt::create_handle()
                    .map_err(|e| crate::KernelError::Unsupported { op: "linear_lt", what: format!("cublasLtCreate: {e}") })?;
                // SAFETY: a workspace is scratch for cublasLt; nothing reads it before a GEMM writes it.
                let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }.w()?;
                e.insert(Arc::new(Mutex::new(Lt { handle, workspace, algos: HashMap::new(), picked: HashMap::new() }))).clone()
            }
        }
    };
    let mut guard = entry.lock().unwrap_or_else(|p| p.into_inner());
    let state = &mut *guard;
    let algo = match (pick, state.algos.get(&key)) {
        (Some(i), _) => match state.picked.get(&(key, i)) {
            Some(a) => *a,
            None => {
                let a = candidates(state, key, ty, i + 1).get(i).copied();
                state.picked.insert((key, i), a);
                a
            }
        },
        (None, Some(a)) => *a,
        (None, None) => {
            let a = choose(state, key, ty);
            state.algos.insert(key, a);
            a
        }
    };
    let Some(algo) = algo else { return Ok(None) };
    let Ok(d) = descs(ty, key.variant.out_f32, key.n, key.k, m, key.lda) else { return Ok(None) };
    let (alpha, beta) = (1f32, 0f32);
    let (wsp, _sync) = state.workspace.device_ptr_mut(&stream);
    // SAFETY: the pointers address live buffers of the sizes the layouts describe (the caller
    // checked the shapes and strides), the workspace is this stream's, and the GEMM is queued
    // on the stream that owns all of them.
    let r = unsafe {
        sys::cublasLtMatmul(
            state.handle,
            d.desc,
            (&alpha as *const f32).cast(),
            wp as *const _,
            d.layouts[0],
            xp as *const _,
            d.layouts[1],
            (&beta as *const f32).cast(),
            yp as *const _,
            d.layouts[2],
            yp as *mut _,
            d.layouts[2],
            &algo,
            wsp as *mut _,
            WORKSPACE_BYTES,
            stream.cu_stream() as _,
        )
        .result()
    };
    if r.is_err() {
        match pick {
            Some(i) => state.picked.insert((key, i), None),
            None => state.algos.insert(key, None),
        };
        return Ok(None);
    }
    Ok(Some(algo))
}
