//! Projections with many rows as cublasLt GEMMs whose algorithm is chosen once per row bucket.
//!
//! cuBLAS picks a kernel for every new row count, and the first call of a kernel the process
//! has not run yet costs 3–5 ms of host time on the device host (its heuristic and the kernel's
//! loading; `gpu_bench --new-shapes`). A server's prefill passes rarely repeat a row count,
//! so each new prompt length paid that on its first layer. Here the algorithm is asked for at
//! the row count rounded up to a bucket (16, 32, 64, then multiples of 64) and reused for every
//! row count in it: a bounded set of kernels, each loaded once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::cublaslt::{result as lt, sys};
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, DType, Tensor};

use super::{first_element_address, gemm_tune, wrap};
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
    /// K's slices run as a strided batch ([`linear_lt_parts`]); 1 for one GEMM.
    parts: usize,
}

/// An f32 output, any split-K reduction.
const F32_OUT: LtVariant = LtVariant { out_f32: true, reduction_mask: None };

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
pub(super) struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// `None` where the heuristic found nothing or the call failed: candle's GEMM runs those.
    algos: HashMap<Key, Option<sys::cublasLtMatmulAlgo_t>>,
    /// The heuristic's n-th algorithm for `key`, for [`linear_lt_pick`].
    picked: HashMap<(Key, usize), Option<sys::cublasLtMatmulAlgo_t>>,
    /// How many slices of K the default algorithm for `key` sums (1: no split-K).
    splits: HashMap<Key, usize>,
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
pub(super) struct Descs {
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
/// buffer read transposed, B is `x`'s with leading dimension `lda`. With `parts` > 1, K's
/// `parts` equal slices run as a strided batch: slice `s` reads columns `s·K/parts..` of `w`
/// and `x` and writes output `s` of `[parts, M, N]`.
fn descs(
    ty: sys::cudaDataType,
    out_f32: bool,
    n: usize,
    k: usize,
    m: usize,
    lda: usize,
    parts: usize,
) -> std::result::Result<Descs, lt::CublasError> {
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
    let slice = k / parts;
    for (t, rows, cols, ld, offset) in [(ty, slice, n, k, slice), (ty, slice, m, lda, slice), (out_ty, n, m, n, n * m)] {
        let layout = lt::create_matrix_layout(t, rows as u64, cols as u64, ld as i64)?;
        d.layouts.push(layout);
        if parts > 1 {
            let (count, offset) = (parts as i32, offset as i64);
            use sys::cublasLtMatrixLayoutAttribute_t as L;
            // SAFETY: BATCH_COUNT is an i32 and STRIDED_BATCH_OFFSET an i64, as cublasLt expects.
            unsafe {
                lt::set_matrix_layout_attribute(layout, L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, (&count as *const i32).cast(), 4)?;
                lt::set_matrix_layout_attribute(layout, L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, (&offset as *const i64).cast(), 8)?;
            }
        }
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
    let Ok(d) = descs(ty, key.variant.out_f32, key.n, key.k, key.bucket, key.lda, key.parts) else { return Vec::new() };
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
    Ok(dispatch(x, w, None, LtVariant::default(), false, None)?.map(|(y, _)| y))
}

/// [`linear_lt`] with the heuristic's `pick`-th algorithm (0 is the one [`linear_lt`] runs),
/// for benchmarks that time the alternatives: the product and the algorithm's configuration
/// (`id/tile/stages/split-K`); `None` also where the heuristic offers fewer.
pub fn linear_lt_pick(x: &Tensor, w: &Tensor, pick: usize, variant: LtVariant) -> Result<Option<(Tensor, String)>> {
    Ok(dispatch(x, w, Some(pick), variant, false, None)?.map(|(y, algo)| (y, algo.map(|a| describe(&a)).unwrap_or_default())))
}

/// `x [M, K] · w [N, K]ᵀ` as the f32 partial products of `S` equal slices of K, `[S, M, N]`,
/// whose sum is the product: where [`linear_lt`]'s algorithm splits K, the same split run as a
/// strided batch with its reduce left to the reader (the residual norm that adds a block's
/// output sums them, so the GEMM's reduce launch does not run). `S` is [`auto_parts`]'s count,
/// moved to a divisor of K whose slices stay 16-byte aligned, or as [`set_split_parts`] says. `None` where K is not split or this path does not apply: the
/// caller runs [`linear_lt`].
pub fn linear_lt_parts(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    Ok(dispatch(x, w, None, F32_OUT, true, None)?.map(|(y, _)| y))
}

/// [`linear_lt`] with the GEMM's f32 accumulators stored as they are (a new `[M, N]` f32
/// tensor), not rounded to the operands' type.
pub fn linear_lt_f32(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    Ok(dispatch(x, w, None, F32_OUT, false, None)?.map(|(y, _)| y))
}

/// `x [M, K] · w [N, K]ᵀ` written into `out` `[M, N]` f32 (contiguous): the GEMM's f32
/// accumulators stored as they are, not rounded to the operands' type (a decode step's logits
/// straight into a CUDA graph's buffer, where the bf16 product and a widening launch were two
/// passes). False (nothing written) where this path does not apply.
pub fn linear_lt_f32_into(x: &Tensor, w: &Tensor, out: &Tensor) -> Result<bool> {
    Ok(dispatch(x, w, None, F32_OUT, false, Some(out))?.is_some())
}

/// [`set_split_parts`]'s setting: `UNSET` until set (then `DELTASERVE_SPLIT_PARTS` rules), `AUTO`
/// for [`auto_parts`], `CUBLAS` for the default algorithm's own split, else the slice count (0:
/// never).
static SPLIT_PARTS: AtomicUsize = AtomicUsize::new(UNSET);
const UNSET: usize = usize::MAX;
const AUTO: usize = usize::MAX - 1;
const CUBLAS: usize = usize::MAX - 2;
/// GEMMs [`linear_lt_parts`] ran as slices, since start.
static SPLIT_RAN: AtomicU64 = AtomicU64::new(0);

/// How [`linear_lt_parts`] splits K for this process: `None` as [`auto_parts`] says, `Some(0)`
/// never (every projection reduced by its GEMM), `Some(s)` in `s` slices where K allows. Unset,
/// `DELTASERVE_SPLIT_PARTS` says: `0`, a count, `cublas` (the default algorithm's own split, for
/// comparisons), or absent for `None`.
pub fn set_split_parts(parts: Option<usize>) {
    SPLIT_PARTS.store(parts.map_or(AUTO, |s| s.min(8)), Ordering::Relaxed);
}

/// GEMMs run as unsummed slices by [`linear_lt_parts`] since start.
pub fn split_parts_count() -> u64 {
    SPLIT_RAN.load(Ordering::Relaxed)
}

/// The setting, read from the environment on first use if nothing set it.
fn split_setting() -> usize {
    let v = SPLIT_PARTS.load(Ordering::Relaxed);
    if v != UNSET {
        return v;
    }
    let env = std::env::var("DELTASERVE_SPLIT_PARTS").ok();
    let v = match env.as_deref() {
        Some("cublas") => CUBLAS,
        Some(n) => n.parse::<usize>().map_or(AUTO, |s| s.min(8)),
        None => AUTO,
    };
    let _ = SPLIT_PARTS.compare_exchange(UNSET, v, Ordering::Relaxed, Ordering::Relaxed);
    v
}

/// Rows up to which a GEMM is a decode step's (or a short pass's), whose few output tiles leave
/// most SMs idle unless K is split.
const DECODE_ROWS: usize = 64;

/// The slices for a GEMM of `m` rows whose default algorithm splits K `split` ways: at least 4
/// up to [`DECODE_ROWS`] rows, else `split`. Four slices timed within 2% of the best count for
/// each 2,048-row projection of the 1.39B and Qwen3.5 at 16 and 64 rows on the H200, and
/// faster than the default algorithm's split where that was 1–3
/// (`benches/results/h200-split_parts-2026-11-30/`).
fn auto_parts(split: usize, m: usize) -> usize {
    if m <= DECODE_ROWS {
        split.max(4)
    } else {
        split
    }
}

/// The slice count nearest `split` (up to 8, larger first) that divides `k` into slices of a
/// multiple of 8 elements (16 bytes of bf16, as cublasLt's fast kernels want), or 1.
fn parts_near(split: usize, k: usize) -> usize {
    let fits = |s: usize| s >= 2 && k.is_multiple_of(s) && (k / s).is_multiple_of(8);
    if split < 2 {
        return 1;
    }
    (split..=8).chain((2..split).rev()).find(|&s| fits(s)).unwrap_or(1)
}

/// The product and, for a pick, the algorithm that ran.
type Ran = (Tensor, Option<sys::cublasLtMatmulAlgo_t>);

fn dispatch(x: &Tensor, w: &Tensor, pick: Option<usize>, variant: LtVariant, parts: bool, into: Option<&Tensor>) -> Result<Option<Ran>> {
    match (x.dtype(), w.dtype(), variant.out_f32) {
        (DType::BF16, DType::BF16, false) => {
            typed::<half::bf16, half::bf16>(x, w, sys::cudaDataType::CUDA_R_16BF, pick, variant, parts, into)
        }
        (DType::F16, DType::F16, false) => typed::<half::f16, half::f16>(x, w, sys::cudaDataType::CUDA_R_16F, pick, variant, parts, into),
        (DType::BF16, DType::BF16, true) => typed::<half::bf16, f32>(x, w, sys::cudaDataType::CUDA_R_16BF, pick, variant, parts, into),
        (DType::F16, DType::F16, true) => typed::<half::f16, f32>(x, w, sys::cudaDataType::CUDA_R_16F, pick, variant, parts, into),
        _ => Ok(None),
    }
}

/// Operands `T`, output `O` (`T`, or f32 for [`LtVariant::out_f32`]); with `parts`, K's slices
/// as a strided batch of f32 outputs ([`linear_lt_parts`]); written `into` a given `[M, N]`
/// contiguous tensor of `O`, or a new one.
fn typed<T, O>(
    x: &Tensor,
    w: &Tensor,
    ty: sys::cudaDataType,
    pick: Option<usize>,
    variant: LtVariant,
    parts: bool,
    into: Option<&Tensor>,
) -> Result<Option<Ran>>
where
    T: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
    O: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr + candle_core::WithDType,
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
    let size = std::mem::size_of::<T>() as u64;
    let align_of = |addrs: &[u64]| addrs.iter().map(|&a| 1u64 << a.trailing_zeros().min(4)).min().unwrap_or(2);
    let mut key = Key { dtype: x.dtype(), n, k, bucket: bucket(m), lda, align: align_of(&[xp, wp, lda as u64 * size]), variant, parts: 1 };
    if parts {
        // Each output of the batch starts 16-byte aligned.
        if !(m * n).is_multiple_of(4) {
            return Ok(None);
        }
        let setting = split_setting();
        let s = if setting == AUTO || setting == CUBLAS {
            let split = lt_of(dev)?.lock().unwrap_or_else(|p| p.into_inner()).split(Key { variant: LtVariant::default(), ..key }, ty);
            parts_near(if setting == AUTO { auto_parts(split, m) } else { split }, k)
        } else {
            parts_near(setting, k)
        };
        if s < 2 {
            return Ok(None);
        }
        key.parts = s;
    }
    let (mut out, yp) = match into {
        Some(t) => {
            if t.dims() != [m, n] || !t.is_contiguous() || t.dtype() != O::DTYPE || key.parts > 1 {
                return Ok(None);
            }
            (None, first_element_address::<O>(t)?)
        }
        None => {
            // SAFETY: the GEMM writes every element (beta = 0) before anything reads it.
            let mut out = unsafe { dev.alloc::<O>(key.parts * m * n) }?;
            let p = {
                let stream = dev.cuda_stream();
                let (p, _sync) = out.device_ptr_mut(&stream);
                p
            };
            (Some(out), p)
        }
    };
    key.align = key.align.min(align_of(&[yp]));
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
    if key.parts > 1 {
        SPLIT_RAN.fetch_add(1, Ordering::Relaxed);
    }
    let y = match (out.take(), into) {
        (Some(out), _) if key.parts > 1 => wrap(dev, out, (key.parts, m, n)),
        (Some(out), _) => wrap(dev, out, (m, n)),
        (None, Some(t)) => t.clone(),
        (None, None) => unreachable!("an output is allocated unless given"),
    };
    Ok(Some((y, pick.map(|_| algo))))
}

/// This device stream's cublasLt state, made on first use.
fn lt_of(dev: &CudaDevice) -> Result<Arc<Mutex<Lt>>> {
    let stream = dev.cuda_stream();
    let id = stream.cu_stream() as usize;
    let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    Ok(match reg.entry(id) {
        std::collections::hash_map::Entry::Occupied(e) => e.get().clone(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let handle = lt::create_handle()
                .map_err(|e| crate::KernelError::Unsupported { op: "linear_lt", what: format!("cublasLtCreate: {e}") })?;
            // SAFETY: a workspace is scratch for cublasLt; nothing reads it before a GEMM writes it.
            let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }.w()?;
            let lt_ = Lt { handle, workspace, algos: HashMap::new(), picked: HashMap::new(), splits: HashMap::new() };
            e.insert(Arc::new(Mutex::new(lt_))).clone()
        }
    })
}

impl Lt {
    /// How many slices of K the heuristic's first algorithm for `key` sums (1 where it does not
    /// split).
    fn split(&mut self, key: Key, ty: sys::cudaDataType) -> usize {
        if let Some(&s) = self.splits.get(&key) {
            return s;
        }
        let s = choose(self, key, ty).map_or(1, |a| split_of(&a));
        self.splits.insert(key, s);
        s
    }
}

/// An algorithm's split-K slice count (1 where it does not split, or cublasLt does not say).
pub(super) fn split_of(algo: &sys::cublasLtMatmulAlgo_t) -> usize {
    let (mut v, mut written) = (0u32, 0usize);
    // SAFETY: `v` holds the 4 bytes of the 32-bit attribute.
    let r = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
            (&mut v as *mut u32).cast(),
            4,
            &mut written,
        )
    };
    if r == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        (v as usize).max(1)
    } else {
        1
    }
}

/// Queues the GEMM with `key`'s algorithm (chosen on first use: the heuristic's first, or for
/// a prefill's rows the fastest that gives its bits, [`gemm_tune::fastest_same_bits`]), or the
/// heuristic's `pick`-th; returns the algorithm, `None` when there is none or cublasLt refused
/// it (then never tried again for `key`).
fn run(
    dev: &CudaDevice,
    key: Key,
    ty: sys::cudaDataType,
    m: usize,
    ptrs: [u64; 3],
    pick: Option<usize>,
) -> Result<Option<sys::cublasLtMatmulAlgo_t>> {
    let entry = lt_of(dev)?;
    let mut guard = entry.lock().unwrap_or_else(|p| p.into_inner());
    let state = &mut *guard;
    let Ok(d) = descs(ty, key.variant.out_f32, key.n, key.k, m, key.lda, key.parts) else { return Ok(None) };
    let algo = match pick {
        Some(i) => match state.picked.get(&(key, i)) {
            Some(a) => *a,
            None => {
                let a = candidates(state, key, ty, i + 1).get(i).copied();
                state.picked.insert((key, i), a);
                a
            }
        },
        None => match state.algos.get(&key) {
            Some(a) => *a,
            None => {
                let a = if gemm_tune::applies(dev, key.bucket, key.parts, key.variant.out_f32, ty, m * key.n) {
                    let cands = candidates(state, key, ty, gemm_tune::CANDIDATES);
                    gemm_tune::fastest_same_bits(dev, state, &d, ptrs, key.n * m, &cands)
                } else {
                    choose(state, key, ty)
                };
                state.algos.insert(key, a);
                a
            }
        },
    };
    let Some(algo) = algo else { return Ok(None) };
    if matmul(dev, state, &d, &algo, ptrs).is_err() {
        match pick {
            Some(i) => state.picked.insert((key, i), None),
            None => state.algos.insert(key, None),
        };
        return Ok(None);
    }
    Ok(Some(algo))
}

/// Queues `y = w · x` (the layouts of `d`) with `algo` on `dev`'s stream, in `state`'s workspace.
pub(super) fn matmul(
    dev: &CudaDevice,
    state: &mut Lt,
    d: &Descs,
    algo: &sys::cublasLtMatmulAlgo_t,
    [wp, xp, yp]: [u64; 3],
) -> std::result::Result<(), lt::CublasError> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtrMut;
    let stream = dev.cuda_stream();
    let (alpha, beta) = (1f32, 0f32);
    let (wsp, _sync) = state.workspace.device_ptr_mut(&stream);
    // SAFETY: the pointers address live buffers of the sizes the layouts describe (the caller
    // checked the shapes and strides), the workspace is this stream's, and the GEMM is queued
    // on the stream that owns all of them.
    unsafe {
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
            algo,
            wsp as *mut _,
            WORKSPACE_BYTES,
            stream.cu_stream() as _,
        )
        .result()
    }
}
