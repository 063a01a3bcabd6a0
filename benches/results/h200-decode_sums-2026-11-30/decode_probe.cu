// What the decode step's recurrent kernel costs inside a step, against the state's own bytes.
// The chain of benches/chain_probe.cu (one read-only kernel a projection, programmatic launches,
// a CUDA graph) is run with its state piece replaced by: a copy of the same bytes (the bound),
// HEAD's recurrent kernel, this commit's (gated_delta.cu, Raw inputs, slots from device memory
// as in the engine's graphs) and the probe's own variants (decode_y). Each layer has its own
// state, so every state comes from memory as in a real step. Also the chains of the state
// kernels alone. Before timing, every variant runs once from the same state and inputs and its
// state and output are compared with HEAD's kernel, bit for bit.
//
// This is call 5's version. Build, from the repository root at the commit that added it:
//   git show d08fafc:kernels/cuda/gated_delta.cu \
//     | sed 's/gdr_decode_f32_w/old_gdr_decode_f32_w/g; s/gdr_decode_raw_w/old_gdr_decode_raw_w/g' > /tmp/decode_probe_old.cu
//   nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda $R/decode_probe.cu /tmp/decode_probe_old.cu -o decode_probe
// (R = benches/results/h200-decode_sums-2026-11-30).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "gated_delta.cu"

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

// HEAD's kernels (/tmp/decode_probe_old.cu: gated_delta.cu before the change, entries renamed).
extern "C" __global__ void old_gdr_decode_raw_w32_r8_c1_b1_vec(const __grid_constant__ Raw, float*, SlotList, const int*, float*, int,
                                                               int, int, float);
extern "C" __global__ void old_gdr_decode_raw_w16_r8_c1_b2_vec(const __grid_constant__ Raw, float*, SlotList, const int*, float*, int,
                                                               int, int, float);
extern "C" __global__ void old_gdr_decode_raw_w16_r16_c2_b2_vec(const __grid_constant__ Raw, float*, SlotList, const int*, float*,
                                                                int, int, int, float);
extern "C" __global__ void old_gdr_decode_raw_w16_r8_c4_b2_vec(const __grid_constant__ Raw, float*, SlotList, const int*, float*, int,
                                                               int, int, float);

// ---- the weights' pieces: read-only streams (chain_probe.cu's `pdl` kernel, 8 loads a thread)
__global__ void __launch_bounds__(256) read_piece(const uint4* __restrict__ src, size_t n, unsigned* sink) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (size_t i = first; i < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const size_t k = i + j * stride;
      v[j] = __ldg(src + (k < n ? k : i));
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// ---- the bound: the state's bytes read and written in place, 16-byte streaming accesses, 4 loads
// a thread in flight
__global__ void __launch_bounds__(256) state_copy(float4* s, size_t n, float f) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
    float4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const size_t k = i + j * stride;
      v[j] = __ldcs(s + (k < n ? k : i));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const size_t k = i + j * stride;
      if (k < n) __stcs(s + k, make_float4(v[j].x * f, v[j].y * f, v[j].z * f, v[j].w * f));
    }
  }
}

// ---- an in-place copy in the recurrent kernel's tile layout (grid (V/(32·CW), HV, B))
template <int NW, int RM, int CW>
__global__ void __launch_bounds__(NW * 32, 1) tile_copy(float* states, int HV, int K, int V, float f) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = (blockIdx.x * 32 + lane) * CW;
  const int R = (K + NW - 1) / NW, r0 = warp * R;
  float* S = states + ((size_t)blockIdx.z * HV + blockIdx.y) * K * V;
  StateTile<float, RM, CW> s;
  s.template load<true>(S, R, r0, K, col, V);
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    float x[CW];
#pragma unroll
    for (int c = 0; c < CW; ++c) x[c] = s.at(r, c) * f;
    s.put(r, x);
  }
#pragma unroll
  for (int r = 0; r < RM; ++r)
    if (r < R && r0 + r < K) s.template store_row<true>(S + (size_t)(r0 + r) * V + col, r, col, V);
}

// HEAD's per-warp sums (every warp adds every column's partials of its lanes).
template <int NW, int CW>
__device__ __forceinline__ void sum_warps(float (&acc)[CW], const float (*red)[CW][32], int lane) {
#pragma unroll
  for (int c = 0; c < CW; ++c) acc[c] = 0.0f;
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int c = 0; c < CW; ++c) acc[c] += red[w][c][lane];
}

// ---- variant X1: the step of gdr_decode for one column a lane, with β's and the decay's raw
// loads issued by thread 0 before its state loads (formed after them)
template <int NW, int RMAX, int CW>
__global__ void __launch_bounds__(NW * 32, 1) decode_x1(const __grid_constant__ Raw in, float* states, float* o, int K, int V,
                                                        float scale) {
  static_assert(CW == 1, "one column a lane");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  __shared__ DecodeSmem<NW, CW> sm;
  const int tile = blockIdx.x, hv = blockIdx.y, b = blockIdx.z, H = in.H, HV = in.HV, n = 1;
  float* kk = sm.kk;
  float* qq = sm.qq;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = (tile * 32 + lane) * CW;
  const int R = (K + NW - 1) / NW, r0 = warp * R;
  float* S = states + ((size_t)b * HV + hv) * K * V;
  // thread 0's raw β and gate inputs first
  float braw = 0.f, araw = 0.f, alog = 0.f, dtb = 0.f;
  if (threadIdx.x == 0) {
    braw = act_at(in.b, in.b_code, (size_t)b * in.ldb + hv);
    if (in.a) {
      araw = act_at(in.a, in.a_code, (size_t)b * in.lda + hv);
      alog = in.a_log[hv];
      dtb = in.dt_bias[hv];
    }
  }
  StateTile<float, RMAX, CW> s;
  s.template load<true>(S, R, r0, K, col, V);
  const TileInputs<CW> x = tile_inputs<CW, true>(in, tile, hv, b, H, HV, K, V, n);
  const int hk = hv / (HV / H);
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    sm.qq[i] = i == threadIdx.x ? x.q : in.q_at(b, hk, i, K);
    sm.kk[i] = i == threadIdx.x ? x.k : in.k_at(b, 0, n, hk, i, K);
  }
  if (threadIdx.x < 32) sm.v[threadIdx.x] = x.v[0];
  if (threadIdx.x == 0) {
    sm.beta = ds_beta(in.beta_mult, braw);
    sm.decay = in.a ? __expf(ds_log_decay(araw, alog, dtb)) : 1.0f;
  }
  __syncthreads();
  in.normalise(qq, kk, true, K, warp, lane);
  rows_dot<NW, RMAX, CW>(sm.red_k, s, kk, R, r0, K, warp, lane);
  rows_dot<NW, RMAX, CW>(sm.red_q, s, qq, R, r0, K, warp, lane);
  float kq = 0.0f;
  for (int i = lane; i < K; i += 32) kq += kk[i] * qq[i];
  kq = warp_sum(kq);
  const float vv = sm.v[lane], bt = sm.beta, d = sm.decay;
  __syncthreads();
  float kv[CW], u[CW], out[CW] = {};
  sum_warps<NW, CW>(kv, sm.red_k, lane);
  u[0] = __fmul_rn(bt, __fmaf_rn(-d, kv[0], vv));
  if (warp == 0) {
    float sq[CW];
    sum_warps<NW, CW>(sq, sm.red_q, lane);
    out[0] = __fmaf_rn(u[0], kq, d * sq[0]) * scale;
    store_cols<CW, true>(o + ((size_t)b * HV + hv) * V + col, out, col, V);
  }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) {
      const float kr = kk[r0 + r];
      float y[CW];
      y[0] = __fmaf_rn(kr, u[0], __fmul_rn(d, s.at(r, 0)));
      s.put(r, y);
    }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) s.template store_row<true>(S + (size_t)(r0 + r) * V + col, r, col, V);
}

// ---- variant Y: the step (one householder step) with
//   • for one column a lane, β's and the decay's raw loads issued by thread 0 before its state
//     loads (formed after them); for more columns, the engine's order (inputs formed first);
//   • k · q by warp 0 only (only its output uses it);
//   • SUMS: the warps' partial sums of each column added by one thread a column (the same order
//     as sum_warps, so the same bits) rather than by every warp, and read back after a barrier.
// EARLY: the slot (from device memory, as in the engine's graphs) and the state's loads before
// griddepcontrol.wait (no kernel of the step writes either), the inputs after it.
template <int NW, int RMAX, int CW, bool SUMS, bool EARLY = false>
__global__ void __launch_bounds__(NW * 32, NW == 32 ? 1 : 2) decode_y(const __grid_constant__ Raw in, float* states, float* o,
                                                                     int K, int V, float scale, const int* slots) {
  if (!EARLY) asm volatile("griddepcontrol.wait;" ::: "memory");
  __shared__ DecodeSmem<NW, CW> sm;
  __shared__ float sums_k[32 * CW], sums_q[32 * CW];
  const int tile = blockIdx.x, hv = blockIdx.y, b = blockIdx.z, H = in.H, HV = in.HV, n = 1;
  float* kk = sm.kk;
  float* qq = sm.qq;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = (tile * 32 + lane) * CW;
  const int R = (K + NW - 1) / NW, r0 = warp * R;
  float* S = states + ((size_t)(slots ? slots[b] : b) * HV + hv) * K * V;
  StateTile<float, RMAX, CW> s;
  TileInputs<CW> x;
  float braw = 0.f, araw = 0.f, alog = 0.f, dtb = 0.f;
  if constexpr (EARLY) {
    s.template load<true>(S, R, r0, K, col, V);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (CW == 1 && threadIdx.x == 0) {
      braw = act_at(in.b, in.b_code, (size_t)b * in.ldb + hv);
      if (in.a) {
        araw = act_at(in.a, in.a_code, (size_t)b * in.lda + hv);
        alog = in.a_log[hv];
        dtb = in.dt_bias[hv];
      }
    }
    x = tile_inputs<CW, true>(in, tile, hv, b, H, HV, K, V, n);
  } else if constexpr (CW == 1) {
    if (threadIdx.x == 0) {
      braw = act_at(in.b, in.b_code, (size_t)b * in.ldb + hv);
      if (in.a) {
        araw = act_at(in.a, in.a_code, (size_t)b * in.lda + hv);
        alog = in.a_log[hv];
        dtb = in.dt_bias[hv];
      }
    }
    s.template load<true>(S, R, r0, K, col, V);
    x = tile_inputs<CW, true>(in, tile, hv, b, H, HV, K, V, n);
  } else {
    x = tile_inputs<CW, true>(in, tile, hv, b, H, HV, K, V, n);
    s.template load<true>(S, R, r0, K, col, V);
  }
  const int hk = hv / (HV / H);
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    sm.qq[i] = i == threadIdx.x ? x.q : in.q_at(b, hk, i, K);
    sm.kk[i] = i == threadIdx.x ? x.k : in.k_at(b, 0, n, hk, i, K);
  }
  if (threadIdx.x < 32) {
#pragma unroll
    for (int c = 0; c < CW; ++c) sm.v[threadIdx.x * CW + c] = x.v[c];
  }
  if (threadIdx.x == 0) {
    if constexpr (CW == 1) {
      sm.beta = ds_beta(in.beta_mult, braw);
      sm.decay = in.a ? __expf(ds_log_decay(araw, alog, dtb)) : 1.0f;
    } else {
      sm.beta = x.beta, sm.decay = x.decay;
    }
  }
  __syncthreads();
  in.normalise(qq, kk, true, K, warp, lane);
  rows_dot<NW, RMAX, CW>(sm.red_k, s, kk, R, r0, K, warp, lane);
  rows_dot<NW, RMAX, CW>(sm.red_q, s, qq, R, r0, K, warp, lane);
  float kq = 0.0f;
  if (warp == 0) {
    for (int i = lane; i < K; i += 32) kq += kk[i] * qq[i];
    kq = warp_sum(kq);
  }
  float vv[CW];
#pragma unroll
  for (int c = 0; c < CW; ++c) vv[c] = sm.v[lane * CW + c];
  const float bt = sm.beta, d = sm.decay;
  __syncthreads();
  float kv[CW], u[CW], out[CW] = {};
  if constexpr (SUMS) {
    // Thread t < 32·CW adds column t's partials of k (lanes' column c = t % CW of lane t / CW);
    // the next 32·CW threads those of q.
    const int t = threadIdx.x;
    if (t < 64 * CW) {
      const int which = t / (32 * CW), tc = t % (32 * CW), l = tc / CW, c = tc % CW;
      const float(*red)[CW][32] = which ? sm.red_q : sm.red_k;
      float acc = 0.0f;
#pragma unroll
      for (int w = 0; w < NW; ++w) acc += red[w][c][l];
      (which ? sums_q : sums_k)[tc] = acc;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < CW; ++c) kv[c] = sums_k[lane * CW + c];
  } else {
    sum_warps<NW, CW>(kv, sm.red_k, lane);
  }
#pragma unroll
  for (int c = 0; c < CW; ++c) u[c] = __fmul_rn(bt, __fmaf_rn(-d, kv[c], vv[c]));
  if (warp == 0) {
    float sq[CW];
    if constexpr (SUMS) {
#pragma unroll
      for (int c = 0; c < CW; ++c) sq[c] = sums_q[lane * CW + c];
    } else {
      sum_warps<NW, CW>(sq, sm.red_q, lane);
    }
#pragma unroll
    for (int c = 0; c < CW; ++c) out[c] = __fmaf_rn(u[c], kq, d * sq[c]) * scale;
    store_cols<CW, true>(o + ((size_t)b * HV + hv) * V + col, out, col, V);
  }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) {
      const float kr = kk[r0 + r];
      float y[CW];
#pragma unroll
      for (int c = 0; c < CW; ++c) y[c] = __fmaf_rn(kr, u[c], __fmul_rn(d, s.at(r, c)));
      s.put(r, y);
    }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) s.template store_row<true>(S + (size_t)(r0 + r) * V + col, r, col, V);
}

// ---- a head shape and batch, and its buffers
struct Shape {
  const char* name;
  int H, HV, K, V, B;
  int NW, RM, CW;  // the engine's pick for this batch
};

struct Buffers {
  float* conv;  // [B, 2·H·K + HV·V]
  __nv_bfloat16 *b, *a;
  float *a_log, *dt_bias, *o;
  int* slots;  // 0, 1, …, B − 1
};

static int g_sms;
static unsigned* g_sink;

template <typename... A>
void launch(void (*k)(A...), dim3 grid, dim3 block, cudaStream_t s, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, k, args...));
}

float time_graph(cudaGraphExec_t ge, cudaStream_t s) {
  for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e9f;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms / 20);
  }
  CK(cudaGetLastError());
  return best;
}

float capture_ms(cudaStream_t s, const std::function<void()>& body) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  const float ms = time_graph(ge, s);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return ms;
}

using StateKernel = std::function<void(float* state, const Buffers&, const Shape&, cudaStream_t)>;

StateKernel bound() {
  return [](float* st, const Buffers&, const Shape& sh, cudaStream_t s) {
    const size_t n = (size_t)sh.B * sh.HV * sh.K * sh.V / 4;
    const unsigned blocks = (unsigned)std::min<size_t>((size_t)g_sms * 4, (n + 255) / 256);
    launch(state_copy, dim3(blocks), dim3(256), s, (float4*)st, n, 1.0f);
  };
}

template <int NW, int RM, int CW>
StateKernel tiles() {
  return [](float* st, const Buffers&, const Shape& sh, cudaStream_t s) {
    launch(tile_copy<NW, RM, CW>, dim3(sh.V / (32 * CW), sh.HV, sh.B), dim3(NW * 32), s, st, sh.HV, sh.K, sh.V, 1.0f);
  };
}

Raw raw_of(const Buffers& bu, const Shape& sh) {
  Raw r = {};
  r.conv = bu.conv;
  r.ldc = 2 * sh.H * sh.K + sh.HV * sh.V;
  r.k_off = sh.H * sh.K;
  r.v_off = 2 * sh.H * sh.K;
  r.b = bu.b;
  r.ldb = sh.HV;
  r.b_code = 1;
  r.beta_mult = 1.0f;
  r.a = bu.a;
  r.lda = sh.HV;
  r.a_code = 1;
  r.a_log = bu.a_log;
  r.dt_bias = bu.dt_bias;
  r.H = sh.H;
  r.HV = sh.HV;
  return r;
}

using EngineEntry = void (*)(const Raw, float*, SlotList, const int*, float*, int, int, int, float);

// The slots from device memory, as the engine's graphs pass them.
StateKernel engine(EngineEntry k, int NW, int CW) {
  return [=](float* st, const Buffers& bu, const Shape& sh, cudaStream_t s) {
    SlotList sl;
    for (int i = 0; i < INLINE_SLOTS; ++i) sl.s[i] = i;
    launch(k, dim3(sh.V / (32 * CW), sh.HV, sh.B), dim3(NW * 32), s, raw_of(bu, sh), st, sl, (const int*)bu.slots, bu.o, sh.K,
           sh.V, 1, 1.0f / sqrtf((float)sh.K));
  };
}

template <int NW, int RM>
StateKernel x1() {
  return [](float* st, const Buffers& bu, const Shape& sh, cudaStream_t s) {
    launch(decode_x1<NW, RM, 1>, dim3(sh.V / 32, sh.HV, sh.B), dim3(NW * 32), s, raw_of(bu, sh), st, bu.o, sh.K, sh.V,
           1.0f / sqrtf((float)sh.K));
  };
}

template <int NW, int RM, int CW, bool SUMS, bool EARLY = false>
StateKernel ys(bool device_slots = false) {
  return [=](float* st, const Buffers& bu, const Shape& sh, cudaStream_t s) {
    launch(decode_y<NW, RM, CW, SUMS, EARLY>, dim3(sh.V / (32 * CW), sh.HV, sh.B), dim3(NW * 32), s, raw_of(bu, sh), st, bu.o,
           sh.K, sh.V, 1.0f / sqrtf((float)sh.K), (const int*)(device_slots ? bu.slots : nullptr));
  };
}

__global__ void fill(float* p, size_t n, float lo, float hi, unsigned seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = lo + (hi - lo) * (h & 0xffffff) / 16777216.0f;
  }
}
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, float x) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16(x);
}

struct Variant {
  std::string name;
  StateKernel k;
};

void run_shape(const Shape& sh, int layers, const std::vector<size_t>& weight_pieces, const std::vector<Variant>& vs,
               double copy_bw, cudaStream_t s) {
  const size_t state = (size_t)sh.B * sh.HV * sh.K * sh.V;
  float* states;
  CK(cudaMalloc(&states, state * 4 * layers));
  fill<<<1024, 256>>>(states, state * layers, -0.01f, 0.01f, 7);
  Buffers bu;
  const size_t ldc = 2 * sh.H * sh.K + sh.HV * sh.V;
  CK(cudaMalloc(&bu.conv, ldc * sh.B * 4));
  fill<<<64, 256>>>(bu.conv, ldc * sh.B, -1.f, 1.f, 11);
  CK(cudaMalloc(&bu.b, sh.B * sh.HV * 2));
  CK(cudaMalloc(&bu.a, sh.B * sh.HV * 2));
  fill_bf16<<<4, 256>>>(bu.b, sh.B * sh.HV, 0.3f);
  fill_bf16<<<4, 256>>>(bu.a, sh.B * sh.HV, -0.2f);
  CK(cudaMalloc(&bu.a_log, sh.HV * 4));
  CK(cudaMalloc(&bu.dt_bias, sh.HV * 4));
  fill<<<1, 64>>>(bu.a_log, sh.HV, -1.f, 0.f, 3);
  fill<<<1, 64>>>(bu.dt_bias, sh.HV, -0.5f, 0.5f, 5);
  CK(cudaMalloc(&bu.o, (size_t)sh.B * sh.HV * sh.V * 4));
  {
    std::vector<int> ids(sh.B);
    for (int i = 0; i < sh.B; ++i) ids[i] = i;
    CK(cudaMalloc(&bu.slots, sh.B * 4));
    CK(cudaMemcpy(bu.slots, ids.data(), sh.B * 4, cudaMemcpyHostToDevice));
  }
  size_t wtot = 0;
  for (size_t p : weight_pieces) wtot += (p + 255) / 256 * 256;
  char* w = nullptr;
  if (wtot) {
    CK(cudaMalloc(&w, wtot * layers));
    CK(cudaMemset(w, 1, wtot * layers));
  }
  CK(cudaDeviceSynchronize());
  const double state_bytes = 2.0 * state * 4 * layers;
  const double alone_roof = state_bytes / copy_bw * 1e3;
  printf("## %s, batch %d (H %d, HV %d, K %d, V %d), %d layers; the engine's tile w%d_r%d_c%d\n\n", sh.name, sh.B, sh.H, sh.HV,
         sh.K, sh.V, layers, sh.NW, sh.RM, sh.CW);
  // Every variant from the same state and inputs, once: its state and output against the
  // engine's (the second variant), bit for bit.
  {
    std::vector<float> ref_s, ref_o;
    for (size_t i = 1; i < vs.size(); ++i) {
      // On the probe's stream: it does not wait for the legacy default stream.
      fill<<<1024, 256, 0, s>>>(states, state, -0.01f, 0.01f, 7);
      CK(cudaMemsetAsync(bu.o, 0, (size_t)sh.B * sh.HV * sh.V * 4, s));
      vs[i].k(states, bu, sh, s);
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      std::vector<float> hs(state), ho((size_t)sh.B * sh.HV * sh.V);
      CK(cudaMemcpy(hs.data(), states, state * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(ho.data(), bu.o, ho.size() * 4, cudaMemcpyDeviceToHost));
      if (i == 1) {
        ref_s = hs, ref_o = ho;
        continue;
      }
      size_t ds = 0, dobits = 0;
      double mx = 0;
      for (size_t j = 0; j < state; ++j)
        if (memcmp(&hs[j], &ref_s[j], 4)) ++ds, mx = std::max(mx, (double)fabsf(hs[j] - ref_s[j]));
      for (size_t j = 0; j < ho.size(); ++j)
        if (memcmp(&ho[j], &ref_o[j], 4)) ++dobits, mx = std::max(mx, (double)fabsf(ho[j] - ref_o[j]));
      printf("check %s: %zu state and %zu output elements differ from the engine's (max |diff| %.3g)\n", vs[i].name.c_str(), ds,
             dobits, mx);
    }
    printf("\n");
  }
  printf("| state kernel | alone: µs a launch | alone: %% of copy BW | in the step's chain: ms | over the bound µs a layer |\n");
  printf("|---|---|---|---|---|\n");
  float bound_chain = 0;
  for (const Variant& v : vs) {
    const float alone = capture_ms(s, [&] {
      for (int l = 0; l < layers; ++l) v.k(states + state * l, bu, sh, s);
    });
    float chain = 0;
    if (wtot) {
      chain = capture_ms(s, [&] {
        size_t off = 0;
        for (int l = 0; l < layers; ++l) {
          for (size_t i = 0; i < weight_pieces.size(); ++i) {
            const size_t n = weight_pieces[i] / 16;
            const unsigned blocks = (unsigned)std::min<size_t>((size_t)g_sms * 4, (n + 255) / 256);
            launch(read_piece, dim3(blocks), dim3(256), s, (const uint4*)(w + off), n, g_sink);
            off += (weight_pieces[i] + 255) / 256 * 256;
            if (i == 0) v.k(states + state * l, bu, sh, s);
          }
        }
      });
    }
    if (bound_chain == 0) bound_chain = chain;
    printf("| %s | %.2f | %.1f%% | %.4f | %+.2f |\n", v.name.c_str(), alone * 1e3 / layers, 100.0 * alone_roof / alone, chain,
           (chain - bound_chain) * 1e3 / layers);
  }
  printf("\n");
  CK(cudaFree(states));
  CK(cudaFree(bu.conv));
  CK(cudaFree(bu.b));
  CK(cudaFree(bu.a));
  CK(cudaFree(bu.a_log));
  CK(cudaFree(bu.dt_bias));
  CK(cudaFree(bu.o));
  CK(cudaFree(bu.slots));
  if (w) CK(cudaFree(w));
}

__global__ void copy_kernel(const uint4* src, uint4* dst, size_t n) {
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) dst[k] = src[k];
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  printf("%s, %d SMs\n", prop.name, g_sms);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc(&g_sink, 16));
  const size_t copy_n = (1ull << 30) / 16;
  uint4 *csrc, *cdst;
  CK(cudaMalloc(&csrc, copy_n * 16));
  CK(cudaMalloc(&cdst, copy_n * 16));
  CK(cudaMemset(csrc, 1, copy_n * 16));
  std::vector<float> ct;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 18; ++i) {
    CK(cudaEventRecord(a, s));
    copy_kernel<<<g_sms * 8, 256, 0, s>>>(csrc, cdst, copy_n);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) ct.push_back(ms);
  }
  std::sort(ct.begin(), ct.end());
  const double copy_bw = 2.0 * copy_n * 16 / (ct[ct.size() / 2] * 1e-3);
  printf("copy bandwidth (1 GiB read + written): %.0f GB/s\n\n", copy_bw / 1e9);
  CK(cudaFree(csrc));
  CK(cudaFree(cdst));

  // The 1.39B: in_proj (with b, a), then the state, then o_proj, [gate | up], down (bf16 W).
  const size_t D = 2048;
  const std::vector<size_t> gdn_w = {(2 * 6 * 256 + 2 * 6 * 512 + 2 * 6) * D * 2, 6 * 512 * D * 2, 2 * 5632 * D * 2, 5632 * D * 2};
  const std::vector<size_t> q35_w = {(2 * 16 * 128 + 2 * 32 * 128 + 2 * 32) * D * 2, 32 * 128 * D * 2, 2 * 6144 * D * 2,
                                     6144 * D * 2};
  {
    const Shape sh{"1.39B", 6, 6, 256, 512, 1, 32, 8, 1};
    run_shape(sh, 21, gdn_w,
              {{"bound: copy of the bytes", bound()},
               {"HEAD's w32_r8_c1", engine(old_gdr_decode_raw_w32_r8_c1_b1_vec, 32, 1)},
               {"new engine w32_r8_c1", engine(gdr_decode_raw_w32_r8_c1_b1_vec, 32, 1)},
               {"probe y + sums, slots inline", ys<32, 8, 1, true>()},
               {"probe y + sums, slot from memory", ys<32, 8, 1, true>(true)},
               {"probe y + sums, slot and state before the wait", ys<32, 8, 1, true, true>(true)},
               {"HEAD's w32_r8_c1 (again)", engine(old_gdr_decode_raw_w32_r8_c1_b1_vec, 32, 1)},
               {"new engine w32_r8_c1 (again)", engine(gdr_decode_raw_w32_r8_c1_b1_vec, 32, 1)}},
              copy_bw, s);
  }
  {
    const Shape sh{"Qwen3.5 GDN", 16, 32, 128, 128, 1, 16, 8, 1};
    run_shape(sh, 18, q35_w,
              {{"bound: copy of the bytes", bound()},
               {"HEAD's w16_r8_c1_b2", engine(old_gdr_decode_raw_w16_r8_c1_b2_vec, 16, 1)},
               {"new engine w16_r8_c1_b2", engine(gdr_decode_raw_w16_r8_c1_b2_vec, 16, 1)},
               {"probe y + sums, slot from memory", ys<16, 8, 1, true>(true)},
               {"probe y + sums, slot and state before the wait", ys<16, 8, 1, true, true>(true)}},
              copy_bw, s);
  }
  for (int B : {16, 64}) {
    const Shape sh{"1.39B", 6, 6, 256, 512, B, 16, 16, 2};
    run_shape(sh, B == 16 ? 21 : 8, gdn_w,
              {{"bound: copy of the bytes", bound()},
               {"HEAD's w16_r16_c2_b2", engine(old_gdr_decode_raw_w16_r16_c2_b2_vec, 16, 2)},
               {"new engine w16_r16_c2_b2", engine(gdr_decode_raw_w16_r16_c2_b2_vec, 16, 2)},
               {"probe y + sums, slot from memory", ys<16, 16, 2, true>(true)},
               {"probe y + sums, slot and state before the wait", ys<16, 16, 2, true, true>(true)}},
              copy_bw, s);
  }
  for (int B : {16, 64}) {
    const Shape sh{"Qwen3.5 GDN", 16, 32, 128, 128, B, 16, 8, 4};
    run_shape(sh, 18, q35_w,
              {{"bound: copy of the bytes", bound()},
               {"HEAD's w16_r8_c4_b2", engine(old_gdr_decode_raw_w16_r8_c4_b2_vec, 16, 4)},
               {"new engine w16_r8_c4_b2", engine(gdr_decode_raw_w16_r8_c4_b2_vec, 16, 4)},
               {"probe y + sums, slot from memory", ys<16, 8, 4, true>(true)},
               {"probe y + sums, slot and state before the wait", ys<16, 8, 4, true, true>(true)}},
              copy_bw, s);
  }
  return 0;
}
