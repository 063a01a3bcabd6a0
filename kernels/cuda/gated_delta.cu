// The gated delta rule (model-spec.md §1.3 step 8, §3.5) on fp32 state [HV, K, V] per slot,
// K-major. GVA: value head j reads q/k head j / (HV/H). Gated DeltaProduct reaches these
// kernels as its interleaved sequence (the host interleaves), except in decode, which takes
// the n householder steps of each token itself.
#include "common.cuh"

#define CHUNK 64
#define DEC_WARPS 4

// One decode step for B sequences. Grid (ceil(V/32), HV, B), block 128: lane = value column,
// warp w keeps state rows [w·R, (w+1)·R) in registers, R = ceil(K/4) ≤ RMAX. Each state
// element is read once and written once.
// q [B, H, K]; k [B·n, H, K]; v [B·n, HV, V]; beta [B·n, HV]; g [B, HV] or null (applied
// before each token's first step); o [B, HV, V].
template <int RMAX>
__device__ void gdr_decode(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           const float* __restrict__ beta, const float* __restrict__ g, float* __restrict__ states,
                           const int* __restrict__ slots, float* __restrict__ o, int H, int HV, int K, int V, int n,
                           float scale) {
  __shared__ float kk[256], qq[256], red[DEC_WARPS][32];
  const int hv = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = blockIdx.x * 32 + lane;
  const bool active = col < V;
  const int hk = hv / (HV / H);
  const int R = (K + DEC_WARPS - 1) / DEC_WARPS, r0 = warp * R;
  float* S = states + ((size_t)slots[b] * HV + hv) * K * V;
  float s[RMAX];
#pragma unroll
  for (int r = 0; r < RMAX; ++r) s[r] = (r < R && r0 + r < K && active) ? S[(size_t)(r0 + r) * V + col] : 0.0f;
  for (int i = threadIdx.x; i < K; i += blockDim.x) qq[i] = q[((size_t)b * H + hk) * K + i];
  for (int j = 0; j < n; ++j) {
    const size_t row = (size_t)b * n + j;
    __syncthreads();
    for (int i = threadIdx.x; i < K; i += blockDim.x) kk[i] = k[(row * H + hk) * K + i];
    __syncthreads();
    const float decay = (j == 0 && g) ? __expf(g[(size_t)b * HV + hv]) : 1.0f;
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < RMAX; ++r)
      if (r < R && r0 + r < K) part += s[r] * kk[r0 + r];
    red[warp][lane] = part;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) kv += red[w][lane];
    const float vv = active ? v[(row * HV + hv) * V + col] : 0.0f;
    const float u = beta[row * HV + hv] * (vv - decay * kv);
#pragma unroll
    for (int r = 0; r < RMAX; ++r)
      if (r < R && r0 + r < K) s[r] = decay * s[r] + kk[r0 + r] * u;
  }
  float part = 0.0f;
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) part += s[r] * qq[r0 + r];
  __syncthreads();
  red[warp][lane] = part;
  __syncthreads();
  if (warp == 0 && active) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) acc += red[w][lane];
    o[((size_t)b * HV + hv) * V + col] = scale * acc;
  }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K && active) S[(size_t)(r0 + r) * V + col] = s[r];
}

#define DECODE_ENTRY(RM)                                                                                              \
  extern "C" __global__ void __launch_bounds__(128) gdr_decode_f32_r##RM(                                          \
      const float* q, const float* k, const float* v, const float* beta, const float* g, float* states,               \
      const int* slots, float* o, int H, int HV, int K, int V, int n, float scale) {                                  \
    gdr_decode<RM>(q, k, v, beta, g, states, slots, o, H, HV, K, V, n, scale);                                        \
  }
DECODE_ENTRY(8)
DECODE_ENTRY(16)
DECODE_ENTRY(32)
DECODE_ENTRY(64)

// Chunked prefill (chunk 64, WY/UT form) of S packed sequences. Grid (ceil(V/BV), HV, S),
// block 256. Sequence s owns rows [cu[s], cu[s+1]) and slot slots[s]; its state is read at the
// start and written at the end. Per chunk, with G the chunk-local cumulative log-decay:
//   A[i,j]  = β_i (k_i·k_j) e^{G_i−G_j}, j < i;      P[i,j] = (q_i·k_j) e^{G_i−G_j}, j ≤ i
//   U       = (I + A)⁻¹ (β ⊙ (V − e^{G} ⊙ K S))      (forward substitution per column)
//   O       = scale (e^{G} ⊙ Q S + P U)
//   S      ← e^{G_last} S + (e^{G_last−G} ⊙ K)ᵀ U
// Shared memory (floats): S [K, BV], Kc and Qc [64, K+1], A and P [64, 65], U [64, BV+1],
// G, β, decay-to-end [64 each].
template <int BV>
__device__ void gdr_chunk(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                          const float* __restrict__ beta, const float* __restrict__ g, float* __restrict__ states,
                          const int* __restrict__ cu, const int* __restrict__ slots, float* __restrict__ o, int H,
                          int HV, int K, int V, float scale) {
  extern __shared__ float sm[];
  const int KP = K + 1, UP = BV + 1;
  float* Ss = sm;
  float* Kc = Ss + K * BV;
  float* Qc = Kc + CHUNK * KP;
  float* A = Qc + CHUNK * KP;
  float* P = A + CHUNK * 65;
  float* U = P + CHUNK * 65;
  float* G = U + CHUNK * UP;
  float* Bt = G + CHUNK;
  float* Dl = Bt + CHUNK;
  constexpr int ROWS = CHUNK * BV / 256;  // (row, column) pairs per thread in the [64, BV] steps
  constexpr int RSTEP = 256 / BV;

  const int hv = blockIdx.y, seq = blockIdx.z;
  const int v0 = blockIdx.x * BV;
  const int tid = threadIdx.x, lane = tid & 31;
  const int hk = hv / (HV / H);
  const int c = tid % BV, rbase = tid / BV;
  float* Sg = states + ((size_t)slots[seq] * HV + hv) * K * V;
  for (int i = tid; i < K * BV; i += 256) {
    const int kr = i / BV, cc = i % BV;
    Ss[i] = v0 + cc < V ? Sg[(size_t)kr * V + v0 + cc] : 0.0f;
  }
  const int t_begin = cu[seq], t_end = cu[seq + 1];
  for (int t0 = t_begin; t0 < t_end; t0 += CHUNK) {
    const int L = min(CHUNK, t_end - t0);
    __syncthreads();
    for (int i = tid; i < CHUNK * K; i += 256) {
      const int r = i / K, cc = i % K;
      const bool in = r < L;
      Kc[r * KP + cc] = in ? k[((size_t)(t0 + r) * H + hk) * K + cc] : 0.0f;
      Qc[r * KP + cc] = in ? q[((size_t)(t0 + r) * H + hk) * K + cc] : 0.0f;
    }
    for (int i = tid; i < CHUNK * BV; i += 256) {
      const int r = i / BV, cc = i % BV;
      U[r * UP + cc] = (r < L && v0 + cc < V) ? v[((size_t)(t0 + r) * HV + hv) * V + v0 + cc] : 0.0f;
    }
    if (tid < 32) {
      // Inclusive scan of the log-decay over the chunk: lane holds rows 2·lane, 2·lane+1.
      const int r = 2 * lane;
      const float g0 = (g && r < L) ? g[(size_t)(t0 + r) * HV + hv] : 0.0f;
      const float g1 = (g && r + 1 < L) ? g[(size_t)(t0 + r + 1) * HV + hv] : 0.0f;
      float pair = g0 + g1, incl = pair;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      G[r] = incl - pair + g0;
      G[r + 1] = incl;
      Bt[r] = r < L ? beta[(size_t)(t0 + r) * HV + hv] : 0.0f;
      Bt[r + 1] = r + 1 < L ? beta[(size_t)(t0 + r + 1) * HV + hv] : 0.0f;
    }
    __syncthreads();
    if (tid < CHUNK) Dl[tid] = __expf(G[CHUNK - 1] - G[tid]);
    // A and P: a warp shares row i and spans 32 consecutive j (conflict-free with the K+1 pad).
    for (int idx = tid; idx < CHUNK * CHUNK; idx += 256) {
      const int i = idx / CHUNK, j = idx % CHUNK;
      float a = 0.0f, p = 0.0f;
      if (j <= i && i < L) {
        const float* ki = Kc + i * KP;
        const float* qi = Qc + i * KP;
        const float* kj = Kc + j * KP;
        for (int x = 0; x < K; ++x) {
          a += ki[x] * kj[x];
          p += qi[x] * kj[x];
        }
        const float e = __expf(G[i] - G[j]);
        a = j < i ? Bt[i] * a * e : 0.0f;
        p *= e;
      }
      A[i * 65 + j] = a;
      P[i * 65 + j] = p;
    }
    // K S and Q S against the state at the chunk start.
    float ks[ROWS], qs[ROWS];
#pragma unroll
    for (int m = 0; m < ROWS; ++m) ks[m] = qs[m] = 0.0f;
    for (int x = 0; x < K; ++x) {
      const float sv = Ss[x * BV + c];
#pragma unroll
      for (int m = 0; m < ROWS; ++m) {
        const int r = rbase + m * RSTEP;
        ks[m] += Kc[r * KP + x] * sv;
        qs[m] += Qc[r * KP + x] * sv;
      }
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const int r = rbase + m * RSTEP;
      U[r * UP + c] = Bt[r] * (U[r * UP + c] - __expf(G[r]) * ks[m]);
    }
    __syncthreads();
    // Forward substitution, one column per thread: U ← (I + A)⁻¹ U.
    if (tid < BV) {
      for (int i = 1; i < L; ++i) {
        float acc = U[i * UP + tid];
        const float* ai = A + i * 65;
        for (int j = 0; j < i; ++j) acc -= ai[j] * U[j * UP + tid];
        U[i * UP + tid] = acc;
      }
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const int r = rbase + m * RSTEP;
      if (r < L && v0 + c < V) {
        float acc = __expf(G[r]) * qs[m];
        const float* pr = P + r * 65;
        for (int j = 0; j <= r; ++j) acc += pr[j] * U[j * UP + c];
        o[((size_t)(t0 + r) * HV + hv) * V + v0 + c] = scale * acc;
      }
    }
    const float el = __expf(G[CHUNK - 1]);
    for (int x = rbase; x < K; x += RSTEP) {
      float acc = 0.0f;
      for (int r = 0; r < L; ++r) acc += Kc[r * KP + x] * Dl[r] * U[r * UP + c];
      Ss[x * BV + c] = el * Ss[x * BV + c] + acc;
    }
  }
  __syncthreads();
  for (int i = tid; i < K * BV; i += 256) {
    const int kr = i / BV, cc = i % BV;
    if (v0 + cc < V) Sg[(size_t)kr * V + v0 + cc] = Ss[i];
  }
}

#define CHUNK_ENTRY(BVV)                                                                                              \
  extern "C" __global__ void __launch_bounds__(256) gdr_chunk_f32_bv##BVV(                                         \
      const float* q, const float* k, const float* v, const float* beta, const float* g, float* states,               \
      const int* cu, const int* slots, float* o, int H, int HV, int K, int V, float scale) {                          \
    gdr_chunk<BVV>(q, k, v, beta, g, states, cu, slots, o, H, HV, K, V, scale);                                       \
  }
CHUNK_ENTRY(32)
CHUNK_ENTRY(64)
