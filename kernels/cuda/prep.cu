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
// time): the lane's NV elements of PREP_ROWS rows are loaded together, kept in registers and
// written from them, block b taking rows [b·PREP_ROWS, b·PREP_ROWS + PREP_ROWS). A run-time K
// takes one row a block and loops load, use, load again: a round trip to memory an element,
// with two 1,024-thread blocks an SM (the Qwen3.5 layout's 4,096-token prefill spent 77 µs a
// layer in that form at 0.9 TB/s). The same results either way.
#define PREP_ROWS 4
template <typename T, typename TC, int NV>
__device__ void prep(const TC* __restrict__ conv, int ldc, int qh, int kh, int K, int k_off, TC* __restrict__ q,
                     TC* __restrict__ k, const T* __restrict__ b, long ldb, float* __restrict__ beta, int nb,
                     float beta_mult, const T* __restrict__ a, long lda, const float* __restrict__ a_log,
                     const float* __restrict__ dt_bias, float* __restrict__ g, int ng, int N) {
  constexpr int R = NV > 0 ? PREP_ROWS : 1;
  const int row0 = blockIdx.x * R;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int seg = warp; seg < qh + kh; seg += warps) {
    const bool is_q = seg < qh;
    const int col = is_q ? seg * K : k_off + (seg - qh) * K;
    if constexpr (NV > 0) {
      // Every row's loads first, at rows clamped into the pass (not behind a branch).
      float v[R][NV];
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const TC* in = conv + (size_t)min(row0 + j, N - 1) * ldc + col;
#pragma unroll
        for (int e = 0; e < NV; ++e) v[j][e] = to_f32(in[lane + 32 * e]);
      }
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int row = row0 + j;
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < NV; ++e) ss += v[j][e] * v[j][e];
        const float inv = rsqrtf(warp_sum(ss) + 1e-6f);
        TC* out = is_q ? q + ((size_t)row * qh + seg) * K : k + ((size_t)row * kh + seg - qh) * K;
        if (row < N) {
#pragma unroll
          for (int e = 0; e < NV; ++e) out[lane + 32 * e] = from_f32<TC>(v[j][e] * inv);
        }
      }
    } else {
      const int row = row0;
      const TC* in = conv + (size_t)row * ldc + col;
      TC* out = is_q ? q + ((size_t)row * qh + seg) * K : k + ((size_t)row * kh + seg - qh) * K;
      float ss = 0.0f;
      for (int i = lane; i < K; i += 32) ss += to_f32(in[i]) * to_f32(in[i]);
      const float inv = rsqrtf(warp_sum(ss) + 1e-6f);
      for (int i = lane; i < K; i += 32) out[i] = from_f32<TC>(to_f32(in[i]) * inv);
    }
  }
  // β and the gate of the block's rows, a thread an element.
  const int rows = min(R, N - row0);
  for (int i = threadIdx.x; i < rows * nb; i += blockDim.x) {
    const int row = row0 + i / nb, c = i % nb;
    beta[(size_t)row * nb + c] = ds_beta(beta_mult, to_f32(b[(size_t)row * ldb + c]));
  }
  for (int i = threadIdx.x; i < rows * ng; i += blockDim.x) {
    const int row = row0 + i / ng, c = i % ng;
    g[(size_t)row * ng + c] = ds_log_decay(to_f32(a[(size_t)row * lda + c]), a_log[c], dt_bias[c]);
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
