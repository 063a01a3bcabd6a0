// Decode steps of the gated delta rule (model-spec.md §1.3 step 8) on fp32 state [HV, K, V]
// per slot, K-major. GVA: value head j reads q/k head j / (HV/H). Gated DeltaProduct's n
// householder steps per token run inside the kernel. (Prefill: chunk_prep.cu, then
// chunk_mma.cu or chunk_state.cu.)
#include "common.cuh"


// Four consecutive floats at p (columns col.. of a row of width V): one 16-byte access when
// `vec` (V % 4 == 0 and aligned data), else element by element within the row.
__device__ __forceinline__ float4 load4(const float* p, int col, int V, bool vec) {
  if (vec) return col < V ? *reinterpret_cast<const float4*>(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  return make_float4(col < V ? p[0] : 0.0f, col + 1 < V ? p[1] : 0.0f, col + 2 < V ? p[2] : 0.0f, col + 3 < V ? p[3] : 0.0f);
}
__device__ __forceinline__ void store4(float* p, float4 x, int col, int V, bool vec) {
  if (vec) {
    if (col < V) *reinterpret_cast<float4*>(p) = x;
    return;
  }
  if (col < V) p[0] = x.x;
  if (col + 1 < V) p[1] = x.y;
  if (col + 2 < V) p[2] = x.z;
  if (col + 3 < V) p[3] = x.w;
}

// Σ_r s[r] · x[r0 + r] over this warp's state rows.
template <int RMAX>
__device__ __forceinline__ float4 rows_dot(const float4* s, const float* x, int R, int r0, int K) {
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) {
      const float xr = x[r0 + r];
      acc.x += s[r].x * xr, acc.y += s[r].y * xr, acc.z += s[r].z * xr, acc.w += s[r].w * xr;
    }
  return acc;
}

// The warps' partial sums for this lane's columns.
template <int NW>
__device__ __forceinline__ float4 sum_warps(const float4 (*red)[32], int lane) {
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int w = 0; w < NW; ++w) acc.x += red[w][lane].x, acc.y += red[w][lane].y, acc.z += red[w][lane].z, acc.w += red[w][lane].w;
  return acc;
}

// One decode step for B sequences. Grid (ceil(V/128), HV, B), block 32·NW: lane owns 4
// adjacent value columns, warp w keeps state rows [w·R, (w+1)·R) in registers, R = ceil(K/NW)
// ≤ RMAX; each state element is read once and written once. Many warps with few rows each keep
// registers low, so several CTAs share an SM and their loads and stores overlap.
// q [B, H, K]; k [B·n, H, K]; v [B·n, HV, V]; beta [B·n, HV]; g [B, HV] or null (applied
// before each token's first step); o [B, HV, V].
template <int NW, int RMAX, bool VEC>
__device__ void gdr_decode(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                            const float* __restrict__ beta, const float* __restrict__ g, float* __restrict__ states,
                            const SlotList& slots, const int* __restrict__ more_slots, float* __restrict__ o, int H,
                            int HV, int K, int V, int n, float scale) {
  constexpr bool vec = VEC;
  __shared__ float kk[256], qq[256];
  __shared__ float4 red[NW][32];
  const int hv = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = blockIdx.x * 128 + lane * 4;
  const int hk = hv / (HV / H);
  const int R = (K + NW - 1) / NW, r0 = warp * R;
  float* S = states + ((size_t)slot_of(slots, more_slots, b) * HV + hv) * K * V;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 s[RMAX];
#pragma unroll
  for (int r = 0; r < RMAX; ++r) s[r] = (r < R && r0 + r < K) ? load4(S + (size_t)(r0 + r) * V + col, col, V, vec) : zero;
  for (int i = threadIdx.x; i < K; i += blockDim.x) qq[i] = q[((size_t)b * H + hk) * K + i];
  for (int j = 0; j < n; ++j) {
    const size_t row = (size_t)b * n + j;
    __syncthreads();
    for (int i = threadIdx.x; i < K; i += blockDim.x) kk[i] = k[(row * H + hk) * K + i];
    __syncthreads();
    const float decay = (j == 0 && g) ? __expf(g[(size_t)b * HV + hv]) : 1.0f;
    red[warp][lane] = rows_dot<RMAX>(s, kk, R, r0, K);
    __syncthreads();
    const float4 kv = sum_warps<NW>(red, lane);
    const float4 vv = load4(v + (row * HV + hv) * V + col, col, V, vec);
    const float bt = beta[row * HV + hv];
    const float4 u = make_float4(bt * (vv.x - decay * kv.x), bt * (vv.y - decay * kv.y), bt * (vv.z - decay * kv.z),
                                 bt * (vv.w - decay * kv.w));
#pragma unroll
    for (int r = 0; r < RMAX; ++r)
      if (r < R && r0 + r < K) {
        const float kr = kk[r0 + r];
        s[r].x = decay * s[r].x + kr * u.x, s[r].y = decay * s[r].y + kr * u.y;
        s[r].z = decay * s[r].z + kr * u.z, s[r].w = decay * s[r].w + kr * u.w;
      }
  }
  const float4 part = rows_dot<RMAX>(s, qq, R, r0, K);
  __syncthreads();
  red[warp][lane] = part;
  __syncthreads();
  if (warp == 0) {
    const float4 acc = sum_warps<NW>(red, lane);
    store4(o + ((size_t)b * HV + hv) * V + col, make_float4(scale * acc.x, scale * acc.y, scale * acc.z, scale * acc.w), col, V, vec);
  }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) store4(S + (size_t)(r0 + r) * V + col, s[r], col, V, vec);
}

// gdr_decode_f32_w{NW}_r{RMAX}_v4 (16-byte accesses) and _v1 (element by element); at most 64
// registers a thread, so that 1024 threads (two CTAs of 16 warps) fit on an SM.
#define DECODE_ENTRY(NW, RM, VEC, SUFFIX)                                                                             \
  extern "C" __global__ void __launch_bounds__(NW * 32, 1024 / (NW * 32)) gdr_decode_f32_w##NW##_r##RM##_##SUFFIX( \
      const float* q, const float* k, const float* v, const float* beta, const float* g, float* states,               \
      SlotList slots, const int* more_slots, float* o, int H, int HV, int K, int V, int n, float scale) {             \
    gdr_decode<NW, RM, VEC>(q, k, v, beta, g, states, slots, more_slots, o, H, HV, K, V, n, scale);                   \
  }
#define DECODE_ENTRIES(NW, RM)         \
  DECODE_ENTRY(NW, RM, true, v4)       \
  DECODE_ENTRY(NW, RM, false, v1)
DECODE_ENTRIES(8, 4)
DECODE_ENTRIES(8, 8)
DECODE_ENTRIES(16, 8)
DECODE_ENTRIES(32, 8)
