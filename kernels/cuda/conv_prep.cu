// A prefill's short conv over [q | k | v] and the preparation of its q and k in one pass
// (model-spec.md §1.3 steps 2, 4, 6, 7): the conv's q and k columns are normalised where they
// are computed, so they never travel to memory and back between conv.cu's prefill and prep.cu
// (about a third of the two kernels' bytes on the Qwen3.5 layout: 200 MB a layer at T = 4,096,
// 130 fused). Each value is the one those two kernels give, bit for bit: the conv's taps summed
// in the same order and rounded to TC, then the squares added in prep.cu's order (element
// lane + 32·e of a head, e ascending, then the warp's butterfly), one rsqrt, one rounding.
//
// x [N, ldx] in T: q heads at columns [0, qh·K), k heads after them, then vw value columns
// (a column slice of the fused input projection, read in place). weight [C, 4] f32 with C =
// (qh + kh)·K + vw (fla's width 4; tap 3 multiplies the current token). Conv states per slot
// [C, 4] f32, only read here (conv.cu's conv_state writes the new ones after this kernel).
// Outputs q [N, qh, K], k [N, kh, K] and v [N, vw] in TC; β [N, nb] and g [N, ng] f32 as in
// prep.cu.
#include "common.cuh"
#include "cp_async.cuh"
#include "dtype.cuh"

#define CP_W 4
#define CP_THREADS 128

// One warp takes one group of K columns (a q head, a k head or K value columns) over R rows
// from r0; lane holds elements lane + 32·e, e < NV = K / 32 (prep.cu's order, so that the
// squares add up as there). The R + 3 input rows are copied into the warp's shared tile with
// 16-byte cp.async (rows outside the pass clamped into it): the copies hold no registers, so
// the kernel keeps many warps resident to cover their latency (rows loaded into registers, as
// conv.cu does, left a quarter of the warps resident and the kernel at ~1.8 TB/s). A lane's
// window of the last three rows then moves down the tile in registers.
template <typename T, typename TC, int NV, int R>
__device__ __forceinline__ void conv_group(const T* __restrict__ x, long ldx, const float* __restrict__ weight,
                                           const float* __restrict__ states, const int* __restrict__ cu,
                                           const int* __restrict__ slots, int S, int C, int col, int r0, int N,
                                           bool normalise, TC* __restrict__ out, size_t out_stride, int silu,
                                           int lane, T* tile) {
  constexpr int K = 32 * NV, PER = 16 / sizeof(T), CHUNKS = K / PER;
  for (int i = lane; i < (R + CP_W - 1) * CHUNKS; i += 32) {
    const int row = i / CHUNKS, c = (i % CHUNKS) * PER;
    const int r = min(max(r0 - (CP_W - 1) + row, 0), N - 1);
    cp_async16((uint32_t)__cvta_generic_to_shared(tile + row * K + c), x + (size_t)r * ldx + col + c, true);
  }
  cp_async_commit();
  float4 w[NV];
#pragma unroll
  for (int e = 0; e < NV; ++e) w[e] = *reinterpret_cast<const float4*>(weight + (size_t)(col + lane + 32 * e) * CP_W);
  const int n = min(R, N - r0);
  int s = seq_of_row(cu, S, r0);
  // Every tap of every row inside one sequence (most tiles): the inputs are the tile alone.
  const bool inside = cu[s] <= r0 - (CP_W - 1) && cu[s + 1] >= r0 + n;
  cp_async_wait_all();
  __syncwarp();
  float win[CP_W - 1][NV];
#pragma unroll
  for (int i = 0; i < CP_W - 1; ++i)
#pragma unroll
    for (int e = 0; e < NV; ++e) win[i][e] = to_f32(tile[i * K + lane + 32 * e]);
#pragma unroll
  for (int j = 0; j < R; ++j) {
    if (j >= n) break;
    const int t = r0 + j;
    float tap[CP_W][NV];
#pragma unroll
    for (int e = 0; e < NV; ++e) {
#pragma unroll
      for (int i = 0; i < CP_W - 1; ++i) tap[i][e] = win[i][e];
      tap[CP_W - 1][e] = to_f32(tile[(j + CP_W - 1) * K + lane + 32 * e]);
    }
    if (!inside) {
      // Taps before the row's sequence starts come from its slot's state (row cu[s] - d is
      // state entry 4 - d), as conv.cu's prefill takes them.
      while (t >= cu[s + 1]) ++s;
      const int t0 = cu[s];
      const float* st = states + (size_t)slots[s] * C * CP_W;
#pragma unroll
      for (int i = 0; i < CP_W - 1; ++i) {
        const int tau = t - (CP_W - 1) + i;
        if (tau < t0) {
#pragma unroll
          for (int e = 0; e < NV; ++e) tap[i][e] = st[(size_t)(col + lane + 32 * e) * CP_W + CP_W - (t0 - tau)];
        }
      }
    }
    float c[NV];
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      const float ws[CP_W] = {w[e].x, w[e].y, w[e].z, w[e].w};
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < CP_W; ++i) acc += ws[i] * tap[i][e];
      c[e] = to_f32(from_f32<TC>(silu ? ds_silu(acc) : acc));
      ss += c[e] * c[e];
    }
    TC* o = out + (size_t)t * out_stride + lane;
    if (normalise) {
      const float inv = rsqrtf(warp_sum(ss) + 1e-6f);
#pragma unroll
      for (int e = 0; e < NV; ++e) o[32 * e] = from_f32<TC>(c[e] * inv);
    } else {
#pragma unroll
      for (int e = 0; e < NV; ++e) o[32 * e] = from_f32<TC>(c[e]);
    }
#pragma unroll
    for (int e = 0; e < NV; ++e) {
#pragma unroll
      for (int i = 0; i < CP_W - 2; ++i) win[i][e] = win[i + 1][e];
      win[CP_W - 2][e] = tap[CP_W - 1][e];
    }
  }
}

// Grid of CP_THREADS-thread blocks, each warp with its shared tile ((R + 3) · K of T): warp w of the grid takes group w % (qh + kh + vw / K) of
// the R rows from (w / groups) · R; β and the gate take a thread an element of the grid.
template <typename T, typename TC, int NV, int R>
__device__ void conv_prep(const T* __restrict__ x, long ldx, const float* __restrict__ weight,
                          const float* __restrict__ states, const int* __restrict__ cu, const int* __restrict__ slots,
                          int S, int qh, int kh, int vw, TC* __restrict__ q, TC* __restrict__ k, TC* __restrict__ v,
                          const T* __restrict__ b, long ldb, float* __restrict__ beta, int nb, float beta_mult,
                          const T* __restrict__ a, long lda, const float* __restrict__ a_log,
                          const float* __restrict__ dt_bias, float* __restrict__ g, int ng, int N, int silu) {
  constexpr int K = 32 * NV;
  extern __shared__ __align__(16) unsigned char cp_smem[];
  const int lane = threadIdx.x & 31, groups = qh + kh + vw / K, C = (qh + kh) * K + vw;
  T* tile = reinterpret_cast<T*>(cp_smem) + (threadIdx.x >> 5) * (R + CP_W - 1) * K;
  const long w = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (w < (long)((N + R - 1) / R) * groups) {
    const int seg = (int)(w % groups), r0 = (int)(w / groups) * R;
    if (seg < qh)
      conv_group<T, TC, NV, R>(x, ldx, weight, states, cu, slots, S, C, seg * K, r0, N, true, q + seg * K,
                               (size_t)qh * K, silu, lane, tile);
    else if (seg < qh + kh)
      conv_group<T, TC, NV, R>(x, ldx, weight, states, cu, slots, S, C, seg * K, r0, N, true, k + (seg - qh) * K,
                               (size_t)kh * K, silu, lane, tile);
    else
      conv_group<T, TC, NV, R>(x, ldx, weight, states, cu, slots, S, C, seg * K, r0, N, false,
                               v + (seg - qh - kh) * K, (size_t)vw, silu, lane, tile);
  }
  const long t0 = (long)blockIdx.x * blockDim.x + threadIdx.x, step = (long)gridDim.x * blockDim.x;
  for (long i = t0; i < (long)N * nb; i += step) beta[i] = ds_beta(beta_mult, to_f32(b[(i / nb) * ldb + i % nb]));
  for (long i = t0; i < (long)N * ng; i += step)
    g[i] = ds_log_decay(to_f32(a[(i / ng) * lda + i % ng]), a_log[i % ng], dt_bias[i % ng]);
}

// conv_prep_{dtype of x, a and b}[_narrow: q, k and v in that dtype, else f32]_k{128,256}: eight
// rows a warp at K = 128, four at 256. More rows a warp were slower at both (the Qwen3.5 layout's
// 4,096-token pass: 71 / 85 / 114 µs a layer at 8 / 16 / 32 rows; the 1.39B's 59 / 73 / 92 at 4
// / 8 / 16), as was capping the registers for more resident warps.
#define CONV_PREP_ENTRY(T, TC, NAME, NV, R)                                                                           \
  extern "C" __global__ void __launch_bounds__(CP_THREADS, 1)                                                          \
      conv_prep_##NAME(const T* x, long ldx, const float* weight, const float* states, const int* cu,              \
                       const int* slots, int S, int qh, int kh, int vw, TC* q, TC* k, TC* v, const T* b, long ldb,  \
                       float* beta, int nb, float beta_mult, const T* a, long lda, const float* a_log,             \
                       const float* dt_bias, float* g, int ng, int N, int silu) {                                   \
    pdl_entry();                                                                                                      \
    conv_prep<T, TC, NV, R>(x, ldx, weight, states, cu, slots, S, qh, kh, vw, q, k, v, b, ldb, beta, nb, beta_mult,  \
                            a, lda, a_log, dt_bias, g, ng, N, silu);                                                  \
  }
#define CONV_PREP_ENTRIES(T, TC, NAME)      \
  CONV_PREP_ENTRY(T, TC, NAME##_k128, 4, 8) \
  CONV_PREP_ENTRY(T, TC, NAME##_k256, 8, 4)
CONV_PREP_ENTRIES(__nv_bfloat16, float, bf16)
CONV_PREP_ENTRIES(__half, float, f16)
CONV_PREP_ENTRIES(__nv_bfloat16, __nv_bfloat16, bf16_narrow)
