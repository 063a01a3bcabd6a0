// One-row decode projections with their prologue folded in (kernels/cuda/gemv_staged.cu: the
// residual add + RMSNorm, the gated output norm; gemv.cu: SwiGLU formed per step) against the
// plain GEMV of the same shape, and against the same kernels with each warp's first PRE steps
// of W loaded into registers before the prologue runs (W is no kernel's output, so its round
// trip can run under the prologue's). Each case runs as a captured chain of 24 launches, each on
// its own copy of W, with programmatic edges as in the engine's decode graphs: µs a launch and
// W's bytes over it. Outputs are compared bit for bit with the engine's kernels.
// Build and run on the device (from the repository root):
//   nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda benches/stage_probe.cu -o stage_probe && ./stage_probe
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>
#include <cuda_runtime.h>

#include "gemv.cu"
#include "gemv_staged.cu"
#include "norm.cu"

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

typedef __nv_bfloat16 bf16;

// A warp's first PRE steps of W for its GEMV_ROWS rows (gemv.cuh's one-row indexing).
template <int PRE>
struct Pre {
  uint4 raw[PRE][GEMV_ROWS];
  __device__ __forceinline__ void load(const bf16* __restrict__ w, int N, int K, int splits) {
    const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31, s = wib % splits;
    const int steps = (K + 255) / 256, per = (steps + splits - 1) / splits;
    const int k_end = min(K, (s + 1) * per * 256), n0 = (blockIdx.y * (8 / splits) + wib / splits) * GEMV_ROWS;
    const int k0 = s * per * 256 + lane * 8;
#pragma unroll
    for (int j = 0; j < PRE; ++j)
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r) {
        const int k = k0 + j * 256;
        raw[j][r] = make_uint4(0, 0, 0, 0);
        if (k < k_end && n0 + r < N) raw[j][r] = __ldg(reinterpret_cast<const uint4*>(w + (size_t)(n0 + r) * K + k));
      }
  }
};

// gemv.cuh's gemv for one row (LOOP off, no epilogue), its first PRE steps from `pre`: the same
// products and sums in the same order.
template <int PRE, typename X>
__device__ void gemv_from(const Pre<PRE>& pre, X x, const bf16* __restrict__ w, bf16* __restrict__ y, int N, int K, int splits) {
  __shared__ float part[8][GEMV_ROWS];
  const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = wib % splits;
  const int steps = (K + 255) / 256, per = (steps + splits - 1) / splits;
  const int k_end = min(K, (s + 1) * per * 256);
  const int n0 = (blockIdx.y * (8 / splits) + wib / splits) * GEMV_ROWS;
  float acc[GEMV_ROWS] = {};
  if (n0 < N) {
    const int k0 = s * per * 256 + lane * 8;
#pragma unroll
    for (int j = 0; j < PRE; ++j) {
      const int k = k0 + j * 256;
      if (k < k_end) {
        float xv[8];
        x.load(xv, 0, k);
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) {
          const bf16* h = reinterpret_cast<const bf16*>(&pre.raw[j][r]);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r] += to_f32(h[i]) * xv[i];
        }
      }
    }
#pragma unroll 4
    for (int k = k0 + PRE * 256; k < k_end; k += 256) {
      float wv[GEMV_ROWS][8];
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r) {
        if (n0 + r < N) {
          load_vec<8>(wv[r], w + (size_t)(n0 + r) * K + k);
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) wv[r][i] = 0.0f;
        }
      }
      float xv[8];
      x.load(xv, 0, k);
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] += wv[r][i] * xv[i];
    }
  }
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; ++r) acc[r] = warp_sum(acc[r]);
  if (splits > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r) part[wib][r] = acc[r];
    __syncthreads();
    if (s == 0)
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r) {
        acc[r] = part[wib][r];
        for (int j = 1; j < splits; ++j) acc[r] += part[wib + j][r];
      }
  }
  if (lane == 0 && s == 0)
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
      if (n0 + r < N) y[n0 + r] = from_f32<bf16>(acc[r]);
}

template <int PRE>
__global__ void __launch_bounds__(256) pre_plain(const bf16* x, long ldx, const bf16* w, bf16* y, int N, int K, int splits) {
  pdl_entry();
  Pre<PRE> p;
  p.load(w, N, K, splits);
  gemv_from<PRE>(p, PlainRows<bf16>{x, ldx}, w, y, N, K, splits);
}
template <int PRE>
__global__ void __launch_bounds__(256) pre_swiglu(const bf16* gate, const bf16* up, long ld, const bf16* w, bf16* y, int N, int K,
                                                  int splits) {
  pdl_entry();
  Pre<PRE> p;
  p.load(w, N, K, splits);
  gemv_from<PRE>(p, SwigluRows<bf16>{gate, up, ld}, w, y, N, K, splits);
}
template <int PRE>
__global__ void __launch_bounds__(256) pre_add_norm(const float* h, const bf16* delta, const float* nw, float eps, float* r,
                                                    const bf16* w, bf16* y, int N, int K, int splits) {
  pdl_entry();
  Pre<PRE> p;
  p.load(w, N, K, splits);
  bf16* xs = reinterpret_cast<bf16*>(gemv_stage);
  stage_add_norm<bf16, 1>(h, delta, nw, r, xs, K, eps, blockIdx.y == 0);
  gemv_from<PRE>(p, StagedRows<bf16>{xs, K}, w, y, N, K, splits);
}
template <int PRE>
__global__ void __launch_bounds__(256) pre_gated(const float* o, const bf16* z, long ldz, int heads, const float* nw, float eps,
                                                 int act_sigmoid, const bf16* w, bf16* y, int N, int K, int splits) {
  pdl_entry();
  Pre<PRE> p;
  p.load(w, N, K, splits);
  bf16* xs = reinterpret_cast<bf16*>(gemv_stage);
  stage_gated_norm<bf16, 1>(o, z, ldz, heads, nw, xs, K / heads, eps, act_sigmoid);
  gemv_from<PRE>(p, StagedRows<bf16>{xs, K}, w, y, N, K, splits);
}

// stage_gated_norm for one row with every load of a warp's head rows issued at once: warp w
// takes rows w, w + 8, ... (RPW of them), lane l elements l, l + 32, ... (C = Vd / 32 a row);
// per row the squares are summed in gated_norm_row's order and the outputs formed with its
// expression, so the bits are the same.
template <int C, int RPW>
__device__ void stage_gated_once(const float* __restrict__ o, const bf16* __restrict__ z, long ldz, int heads,
                                 const float* __restrict__ nw, bf16* xs, int Vd, float eps, int act_sigmoid) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, R = heads;
  float xv[RPW][C], zv[RPW][C], wv[C];
  bf16 zr[RPW][C];
#pragma unroll
  for (int j = 0; j < C; ++j) wv[j] = nw[lane + 32 * j];
#pragma unroll
  for (int q = 0; q < RPW; ++q) {
    const int row = min(warp + 8 * q, R - 1);
#pragma unroll
    for (int j = 0; j < C; ++j) {
      xv[q][j] = o[(size_t)row * Vd + lane + 32 * j];
      if (z) zr[q][j] = z[(size_t)row * Vd + lane + 32 * j];
    }
  }
#pragma unroll
  for (int q = 0; q < RPW; ++q) {
    const int row = warp + 8 * q;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < C; ++j) ss += xv[q][j] * xv[q][j];
    const float inv = rsqrtf(warp_sum(ss) / Vd + eps);
    if (row < R) {
#pragma unroll
      for (int j = 0; j < C; ++j) {
        float v = xv[q][j] * inv * wv[j];
        if (z) {
          const float zi = to_f32(zr[q][j]);
          v *= act_sigmoid ? ds_sigmoid(zi) : ds_silu(zi);
        }
        xs[(size_t)row * Vd + lane + 32 * j] = from_f32<bf16>(v);
      }
    }
  }
  __syncthreads();
}
template <int C, int RPW>
__global__ void __launch_bounds__(256) gated_once(const float* o, const bf16* z, long ldz, int heads, const float* nw, float eps,
                                                  int act_sigmoid, const bf16* w, bf16* y, int N, int K, int splits) {
  pdl_entry();
  bf16* xs = reinterpret_cast<bf16*>(gemv_stage);
  stage_gated_once<C, RPW>(o, z, ldz, heads, nw, xs, K / heads, eps, act_sigmoid);
  gemv<bf16, 1>(StagedRows<bf16>{xs, K}, w, y, N, K, splits);
}

// stage_add_norm for one row with the norm weight's lines prefetched into L1 during the first
// pass (its second pass then reads them from L1 rather than from L2 after the sum).
__device__ void stage_add_norm_pf(const float* __restrict__ h, const bf16* __restrict__ delta, const float* __restrict__ nw,
                                  float* __restrict__ r, bf16* xs, int K, float eps, bool write_r) {
  __shared__ float part[8];
  const int tid = threadIdx.x;
  for (int i = tid; i < K; i += 256) asm volatile("prefetch.global.L1 [%0];" ::"l"(nw + i));
  float ss = 0.0f;
  for (int i = tid; i < K; i += 256) {
    const float v = h[i] + (delta ? to_f32(delta[i]) : 0.0f);
    ss += v * v;
  }
  ss = warp_sum(ss);
  if ((tid & 31) == 0) part[tid >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < 8; ++j) total += part[j];
  const float inv = rsqrtf(total / K + eps);
  for (int i = tid; i < K; i += 256) {
    const float v = h[i] + (delta ? to_f32(delta[i]) : 0.0f);
    if (write_r) r[i] = v;
    xs[i] = from_f32<bf16>(v * inv * nw[i]);
  }
  __syncthreads();
}
__global__ void __launch_bounds__(256) add_norm_pf(const float* h, const bf16* delta, const float* nw, float eps, float* r,
                                                   const bf16* w, bf16* y, int N, int K, int splits) {
  pdl_entry();
  bf16* xs = reinterpret_cast<bf16*>(gemv_stage);
  stage_add_norm_pf(h, delta, nw, r, xs, K, eps, blockIdx.y == 0);
  gemv<bf16, 1>(StagedRows<bf16>{xs, K}, w, y, N, K, splits);
}

static int g_sms;
const int CHAIN = 24;

// kernels/src/cuda/gemv.rs's k_splits for one row.
int engine_splits(int n, int k) {
  const int steps = (k + 255) / 256, cap = 8;
  auto allowed = [&](int s) { return s == 1 || (s <= cap && steps >= 2 * s); };
  auto blocks = [&](int s) { return (n * s + 15) / 16; };
  int s = 1;
  while (blocks(s) < 3 * g_sms && s < 8 && allowed(2 * s)) s *= 2;
  return s;
}

// A captured chain of CHAIN launches (`launch(cfg, i)` for copy i of W), replayed: µs a launch.
float chain_us(const std::function<void(cudaLaunchConfig_t&, int)>& launch, dim3 grid, unsigned smem, cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < CHAIN; ++i) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    static cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    launch(cfg, i);
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e9f;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms / 10);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return best * 1000.0f / CHAIN;
}

template <typename T>
__global__ void fill(T* p, size_t n, unsigned seed, float scale, float offset) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = from_f32<T>(((h & 0xffff) / 65536.0f - 0.5f) * scale + offset);
  }
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  printf("%s, %d SMs; chains of %d launches, one row, bf16 W; µs a launch (W's TB/s)\n\n", prop.name, g_sms, CHAIN);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t max_elems = (size_t)12352 * 2048;
  bf16 *w, *xb, *zb, *y0, *y1;
  float *hf, *nw, *rr;
  CK(cudaMalloc(&w, CHAIN * max_elems * 2));
  CK(cudaMalloc(&xb, 2 * 8192 * 2));
  CK(cudaMalloc(&zb, 8192 * 2));
  CK(cudaMalloc(&hf, 8192 * 4));
  CK(cudaMalloc(&nw, 8192 * 4));
  CK(cudaMalloc(&rr, 8192 * 4));
  CK(cudaMalloc(&y0, 16384 * 2));
  CK(cudaMalloc(&y1, 16384 * 2));
  fill<bf16><<<1024, 256>>>(w, CHAIN * max_elems, 1, 0.1f, 0.0f);
  fill<bf16><<<16, 256>>>(xb, 2 * 8192, 2, 2.0f, 0.0f);
  fill<bf16><<<16, 256>>>(zb, 8192, 3, 4.0f, 0.0f);
  fill<float><<<16, 256>>>(hf, 8192, 4, 2.0f, 0.0f);
  fill<float><<<16, 256>>>(nw, 8192, 5, 0.5f, 1.0f);
  CK(cudaDeviceSynchronize());
  enum Kind { PLAIN, SWIGLU, ADD_NORM, GATED };
  struct Case {
    const char* name;
    Kind kind;
    int n, k, heads;
  } cases[] = {
      {"1.39B in_proj, add + norm", ADD_NORM, 9228, 2048, 0},   {"1.39B o_proj, gated norm (6 × 512)", GATED, 2048, 3072, 6},
      {"1.39B gate_up, add + norm", ADD_NORM, 11264, 2048, 0},  {"1.39B down, SwiGLU", SWIGLU, 2048, 5632, 0},
      {"Qwen3.5 in_proj, add + norm", ADD_NORM, 12352, 2048, 0}, {"Qwen3.5 out_proj, gated norm (32 × 128)", GATED, 2048, 4096, 32},
      {"Qwen3.5 qkv, add + norm", ADD_NORM, 5120, 2048, 0},     {"Qwen3.5 gate_up, add + norm", ADD_NORM, 12288, 2048, 0},
      {"Qwen3.5 down, SwiGLU", SWIGLU, 2048, 6144, 0},
  };
  printf("| projection | N × K | splits | plain GEMV | norm kernel + GEMV | engine's fused | one round trip / nw in L1 | bits |\n|---|---|---|---|---|---|---|---|\n");
  std::vector<bf16> h0(16384), h1(16384);
  bf16* xn;
  CK(cudaMalloc(&xn, 8192 * 2));
  for (const Case& c : cases) {
    if (c.kind == PLAIN || c.kind == SWIGLU) continue;
    const int N = c.n, K = c.k, sp = engine_splits(N, K);
    const dim3 grid(1, (N * sp + 15) / 16);
    const double mb = (double)N * K * 2 / 1e6;
    const float eps = 1e-6f;
    const unsigned smem = K * 2;
    const int vd = c.heads ? K / c.heads : 0;
    // variant 0 plain, 1 separate norm + plain, 2 engine fused, 3 new
    auto run = [&](int variant, bf16* y) {
      return chain_us(
          [&](cudaLaunchConfig_t& cfg, int i) {
            const bf16* wi = w + i * max_elems;
            if (variant == 0) {
              cfg.dynamicSmemBytes = 0;
              CK(cudaLaunchKernelEx(&cfg, gemv_bf16_b1, (const bf16*)xb, (long)K, wi, y, N, K, sp));
            } else if (variant == 1) {
              cudaLaunchConfig_t nc = cfg;
              nc.dynamicSmemBytes = 0;
              if (c.kind == GATED) {
                nc.gridDim = dim3((c.heads + 3) / 4);
                nc.blockDim = dim3(128);
                CK(cudaLaunchKernelEx(&nc, gated_rms_norm_bf16_bf16, (const float*)hf, (const bf16*)zb, (long)K, c.heads, (const float*)nw, xn, c.heads, vd, eps, 0));
              } else {
                nc.gridDim = dim3(1);
                nc.blockDim = dim3(256);
                CK(cudaLaunchKernelEx(&nc, add_rms_norm_bf16, (const float*)hf, (const bf16*)xb, (const float*)nw, rr, xn, K, eps));
              }
              cfg.dynamicSmemBytes = 0;
              CK(cudaLaunchKernelEx(&cfg, gemv_bf16_b1, (const bf16*)xn, (long)K, wi, y, N, K, sp));
            } else if (c.kind == GATED) {
              if (variant == 2) CK(cudaLaunchKernelEx(&cfg, gated_norm_gemv_bf16_b1, (const float*)hf, (const bf16*)zb, (long)K, c.heads, (const float*)nw, eps, 0, wi, y, N, K, sp));
              else if (vd == 512) CK(cudaLaunchKernelEx(&cfg, gated_once<16, 1>, (const float*)hf, (const bf16*)zb, (long)K, c.heads, (const float*)nw, eps, 0, wi, y, N, K, sp));
              else CK(cudaLaunchKernelEx(&cfg, gated_once<4, 4>, (const float*)hf, (const bf16*)zb, (long)K, c.heads, (const float*)nw, eps, 0, wi, y, N, K, sp));
            } else {
              if (variant == 2) CK(cudaLaunchKernelEx(&cfg, add_norm_gemv_bf16_b1, (const float*)hf, (const bf16*)xb, (const float*)nw, eps, rr, wi, y, N, K, sp));
              else CK(cudaLaunchKernelEx(&cfg, add_norm_pf, (const float*)hf, (const bf16*)xb, (const float*)nw, eps, rr, wi, y, N, K, sp));
            }
          },
          grid, smem, s);
    };
    float us[4];
    bool same = true;
    for (int v = 0; v < 4; ++v) {
      CK(cudaMemset(y1, 0, 16384 * 2));
      us[v] = run(v, v == 2 ? y0 : y1);
      if (v == 1 || v == 3) {
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h0.data(), y0, N * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h1.data(), y1, N * 2, cudaMemcpyDeviceToHost));
        if (v == 3) same = same && memcmp(h0.data(), h1.data(), N * 2) == 0;
      }
    }
    // variant 1 ran before the engine's; compare it now
    CK(cudaMemset(y1, 0, 16384 * 2));
    run(1, y1);
    CK(cudaMemcpy(h1.data(), y1, N * 2, cudaMemcpyDeviceToHost));
    const bool same_sep = memcmp(h0.data(), h1.data(), N * 2) == 0;
    printf("| %s | %d × %d | %d | %.2f (%.2f) | %.2f | %.2f (%.2f) | %.2f (%.2f) | new %s, apart %s |\n", c.name, N, K, sp,
           us[0], mb / us[0], us[1], us[2], mb / us[2], us[3], mb / us[3], same ? "equal" : "DIFFER", same_sep ? "equal" : "DIFFER");
  }
  CK(cudaGetLastError());
  return 0;
}
