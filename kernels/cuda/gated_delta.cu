// Decode steps of the gated delta rule (model-spec.md §1.3 step 8) on fp32 state [HV, K, V]
// per slot, K-major. GVA: value head j reads q/k head j / (HV/H). Gated DeltaProduct's n
// householder steps per token run inside the kernel. (Prefill: chunk_prep.cu, chunk_state.cu.)
#include "common.cuh"

#define DEC_WARPS 4

// One decode step for B sequences. Grid (ceil(V/32), HV, B), block 128: lane = value column,
// warp w keeps state rows [w·R, (w+1)·R) in registers, R = ceil(K/4) ≤ RMAX. Each state
// element is read once and written once.
// q [B, H, K]; k [B·n, H, K]; v [B·n, HV, V]; beta [B·n, HV]; g [B, HV] or null (applied
// before each token's first step); o [B, HV, V].
template <int RMAX>
__device__ void gdr_decode(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           const float* __restrict__ beta, const float* __restrict__ g, float* __restrict__ states,
                           const SlotList& slots, const int* __restrict__ more_slots, float* __restrict__ o, int H,
                           int HV, int K, int V, int n, float scale) {
  __shared__ float kk[256], qq[256], red[DEC_WARPS][32];
  const int hv = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = blockIdx.x * 32 + lane;
  const bool active = col < V;
  const int hk = hv / (HV / H);
  const int R = (K + DEC_WARPS - 1) / DEC_WARPS, r0 = warp * R;
  float* S = states + ((size_t)slot_of(slots, more_slots, b) * HV + hv) * K * V;
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
      SlotList slots, const int* more_slots, float* o, int H, int HV, int K, int V, int n, float scale) {             \
    gdr_decode<RM>(q, k, v, beta, g, states, slots, more_slots, o, H, HV, K, V, n, scale);                            \
  }
DECODE_ENTRY(8)
DECODE_ENTRY(16)
DECODE_ENTRY(32)
DECODE_ENTRY(64)

// The same step with 16-byte state accesses, for V % 4 == 0 (the common case). Grid
// (ceil(V/128), HV, B), block 32·NW: lane owns 4 adjacent value columns, warp w keeps state
// rows [w·R, (w+1)·R) in registers, R = ceil(K/NW) ≤ RMAX. Many warps with few rows each keep
// registers low, so several CTAs share an SM and their loads and stores overlap.
template <int NW, int RMAX>
__device__ void gdr_decode4(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                            const float* __restrict__ beta, const float* __restrict__ g, float* __restrict__ states,
                            const SlotList& slots, const int* __restrict__ more_slots, float* __restrict__ o, int H,
                            int HV, int K, int V, int n, float scale) {
  __shared__ float kk[256], qq[256];
  __shared__ float4 red[NW][32];
  const int hv = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = blockIdx.x * 128 + lane * 4;
  const bool active = col < V;
  const int hk = hv / (HV / H);
  const int R = (K + NW - 1) / NW, r0 = warp * R;
  float* S = states + ((size_t)slot_of(slots, more_slots, b) * HV + hv) * K * V;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 s[RMAX];
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    s[r] = (r < R && r0 + r < K && active) ? *reinterpret_cast<const float4*>(S + (size_t)(r0 + r) * V + col) : zero;
  for (int i = threadIdx.x; i < K; i += blockDim.x) qq[i] = q[((size_t)b * H + hk) * K + i];
  for (int j = 0; j < n; ++j) {
    const size_t row = (size_t)b * n + j;
    __syncthreads();
    for (int i = threadIdx.x; i < K; i += blockDim.x) kk[i] = k[(row * H + hk) * K + i];
    __syncthreads();
    const float decay = (j == 0 && g) ? __expf(g[(size_t)b * HV + hv]) : 1.0f;
    float4 part = zero;
#pragma unroll
    for (int r = 0; r < RMAX; ++r)
      if (r < R && r0 + r < K) {
        const float kr = kk[r0 + r];
        part.x += s[r].x * kr, part.y += s[r].y * kr, part.z += s[r].z * kr, part.w += s[r].w * kr;
      }
    red[warp][lane] = part;
    __syncthreads();
    float4 kv = zero;
#pragma unroll
    for (int w = 0; w < NW; ++w) kv.x += red[w][lane].x, kv.y += red[w][lane].y, kv.z += red[w][lane].z, kv.w += red[w][lane].w;
    const float4 vv = active ? *reinterpret_cast<const float4*>(v + (row * HV + hv) * V + col) : zero;
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
  float4 part = zero;
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) {
      const float qr = qq[r0 + r];
      part.x += s[r].x * qr, part.y += s[r].y * qr, part.z += s[r].z * qr, part.w += s[r].w * qr;
    }
  __syncthreads();
  red[warp][lane] = part;
  __syncthreads();
  if (warp == 0 && active) {
    float4 acc = zero;
#pragma unroll
    for (int w = 0; w < NW; ++w) acc.x += red[w][lane].x, acc.y += red[w][lane].y, acc.z += red[w][lane].z, acc.w += red[w][lane].w;
    *reinterpret_cast<float4*>(o + ((size_t)b * HV + hv) * V + col) = make_float4(scale * acc.x, scale * acc.y, scale * acc.z, scale * acc.w);
  }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K && active) *reinterpret_cast<float4*>(S + (size_t)(r0 + r) * V + col) = s[r];
}

#define DECODE4_ENTRY(NW, RM)                                                                                         \
  extern "C" __global__ void __launch_bounds__(NW * 32) gdr_decode4_f32_w##NW##_r##RM(                              \
      const float* q, const float* k, const float* v, const float* beta, const float* g, float* states,               \
      SlotList slots, const int* more_slots, float* o, int H, int HV, int K, int V, int n, float scale) {             \
    gdr_decode4<NW, RM>(q, k, v, beta, g, states, slots, more_slots, o, H, HV, K, V, n, scale);                       \
  }
DECODE4_ENTRY(8, 4)
DECODE4_ENTRY(8, 8)
DECODE4_ENTRY(16, 8)
DECODE4_ENTRY(32, 8)
