// One fused pass over each token row (model-spec.md §1.3 steps 4, 6, 7): L2-normalise every
// K-wide q and k head of the conv output, β = mult·sigmoid(b), and the fp32 log-decay
// g = −exp(A_log)·softplus(a + dt_bias). GVA needs no copy: the mixer kernels map value head
// j to q/k head j / (HV/H).
#include "common.cuh"
#include "dtype.cuh"

// conv [N, ldc] in TC (f32, or bf16 for a bf16 mixer): q heads at columns [0, qh·K), k heads
// at [k_off, k_off + kh·K). b [N, nb] and a [N, ng] in T with row strides ldb, lda (column
// slices of the fused input projection, read in place). Outputs q [N, qh, K], k [N, kh, K] in
// TC (normalised in fp32, rounded once), beta [N, nb] and g [N, ng] (ng = 0: no gate) f32.
//
// One warp normalises one K-wide head of a row, adding the squares in the order i = lane,
// lane + 32, ... and rounding once. NV = K / 32 when K is 32, 64, 128 or 256 (0: K at run
// time). With K fixed, warp w of the grid (blocks of PREP_THREADS) takes head w % (qh + kh) of
// the PREP_ROWS rows from (w / (qh + kh)) · PREP_ROWS: the lane's NV elements of those rows are
// loaded together, kept in registers and written from them; β and the gate take a thread an
// element of the grid. A run-time K takes one row a block (a warp a head) and loops load, use,
// load again: a round trip to memory an element (the Qwen3.5 layout's 4,096-token prefill spent
// 77 µs a layer in that form at 0.9 TB/s). The same results either way.
#define PREP_ROWS 4
#define PREP_THREADS 256
template <typename TC, int NV>
__device__ __forceinline__ void l2norm_rows(const TC* __restrict__ conv, int ldc, int col, int row0, int N,
                                            TC* __restrict__ out, size_t out_stride, int lane) {
  // Every row's loads first, at rows clamped into the pass (not behind a branch).
  float v[PREP_ROWS][NV];
#pragma unroll
  for (int j = 0; j < PREP_ROWS; ++j) {
    const TC* in = conv + (size_t)min(row0 + j, N - 1) * ldc + col;
#pragma unroll
    for (int e = 0; e < NV; ++e) v[j][e] = to_f32(in[lane + 32 * e]);
  }
#pragma unroll
  for (int j = 0; j < PREP_ROWS; ++j) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < NV; ++e) ss += v[j][e] * v[j][e];
    const float inv = rsqrtf(warp_sum(ss) + 1e-6f);
    if (row0 + j < N) {
#pragma unroll
      for (int e = 0; e < NV; ++e) out[(size_t)j * out_stride + lane + 32 * e] = from_f32<TC>(v[j][e] * inv);
    }
  }
}

template <typename T, typename TC, int NV>
__device__ void prep(const TC* __restrict__ conv, int ldc, int qh, int kh, int K, int k_off, TC* __restrict__ q,
                     TC* __restrict__ k, const T* __restrict__ b, long ldb, float* __restrict__ beta, int nb,
                     float beta_mult, const T* __restrict__ a, long lda, const float* __restrict__ a_log,
                     const float* __restrict__ dt_bias, float* __restrict__ g, int ng, int N) {
  const int lane = threadIdx.x & 31, heads = qh + kh;
  if constexpr (NV > 0) {
    const long w = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (w < (long)((N + PREP_ROWS - 1) / PREP_ROWS) * heads) {
      const int seg = w % heads, row0 = (int)(w / heads) * PREP_ROWS;
      if (seg < qh)
        l2norm_rows<TC, NV>(conv, ldc, seg * K, row0, N, q + ((size_t)row0 * qh + seg) * K, (size_t)qh * K, lane);
      else
        l2norm_rows<TC, NV>(conv, ldc, k_off + (seg - qh) * K, row0, N, k + ((size_t)row0 * kh + seg - qh) * K,
                            (size_t)kh * K, lane);
    }
    const long t0 = (long)blockIdx.x * blockDim.x + threadIdx.x, step = (long)gridDim.x * blockDim.x;
    for (long i = t0; i < (long)N * nb; i += step)
      beta[i] = ds_beta(beta_mult, to_f32(b[(i / nb) * ldb + i % nb]));
    for (long i = t0; i < (long)N * ng; i += step)
      g[i] = ds_log_decay(to_f32(a[(i / ng) * lda + i % ng]), a_log[i % ng], dt_bias[i % ng]);
  } else {
    const int row = blockIdx.x, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const TC* src = conv + (size_t)row * ldc;
    for (int seg = warp; seg < heads; seg += warps) {
      const bool is_q = seg < qh;
      const TC* in = is_q ? src + seg * K : src + k_off + (seg - qh) * K;
      TC* out = is_q ? q + ((size_t)row * qh + seg) * K : k + ((size_t)row * kh + seg - qh) * K;
      float ss = 0.0f;
      for (int i = lane; i < K; i += 32) ss += to_f32(in[i]) * to_f32(in[i]);
      const float inv = rsqrtf(warp_sum(ss) + 1e-6f);
      for (int i = lane; i < K; i += 32) out[i] = from_f32<TC>(to_f32(in[i]) * inv);
    }
    for (int i = threadIdx.x; i < nb; i += blockDim.x)
      beta[(size_t)row * nb + i] = ds_beta(beta_mult, to_f32(b[(size_t)row * ldb + i]));
    for (int i = threadIdx.x; i < ng; i += blockDim.x)
      g[(size_t)row * ng + i] = ds_log_decay(to_f32(a[(size_t)row * lda + i]), a_log[i], dt_bias[i]);
  }
}

// prep_{dtype of a and b}[_narrow: conv, q and k in that dtype too][_k32 .. _k256: K fixed].
#define PREP_ENTRY_NV(T, TC, NAME, NV)                                                                                \
  extern "C" __global__ void prep_##NAME(const TC* conv, int ldc, int qh, int kh, int K, int k_off, TC* q, TC* k,    \
                                         const T* b, long ldb, float* beta, int nb, float beta_mult, const T* a,      \
                                         long lda, const float* a_log, const float* dt_bias, float* g, int ng,        \
                                         int N) {                                                                     \
    pdl_entry();                                                                                                      \
    prep<T, TC, NV>(conv, ldc, qh, kh, K, k_off, q, k, b, ldb, beta, nb, beta_mult, a, lda, a_log, dt_bias, g, ng, N); \
  }
#define PREP_ENTRY(T, TC, NAME)        \
  PREP_ENTRY_NV(T, TC, NAME, 0)        \
  PREP_ENTRY_NV(T, TC, NAME##_k32, 1)  \
  PREP_ENTRY_NV(T, TC, NAME##_k64, 2)  \
  PREP_ENTRY_NV(T, TC, NAME##_k128, 4) \
  PREP_ENTRY_NV(T, TC, NAME##_k256, 8)
PREP_ENTRY(float, float, f32)
PREP_ENTRY(__nv_bfloat16, float, bf16)
PREP_ENTRY(__half, float, f16)
PREP_ENTRY(__nv_bfloat16, __nv_bfloat16, bf16_narrow)
