// One-row decode projections with the block seam's residual add + RMSNorm folded in, the norm's
// 1/rms applied to the finished sums instead of to x: y = (Σ_k w_k · r_k · nw_k) / rms(r), with
// r = h + delta. The weights' stream then waits for no block-wide reduction. Variants, each a
// captured chain of 24 launches (each on its own copy of W, programmatic edges as in the engine's
// decode graphs), µs a launch and W's bytes over it:
//   plain   gemv.cu's one-row GEMV of a bf16 x (the floor);
//   engine  gemv_staged.cu's add_norm_gemv (two passes over r, two barriers, bf16 x staged);
//   fly     no prologue: every warp reads h, delta and nw for its k's beside W, sums r² as it
//           goes (a warp covers all of K when splits = 1; the split warps' sums are added in
//           order otherwise) and scales its sums at the end;
//   st32    one pass: r · nw staged in fp32 with the blocks' r² sums, one barrier;
//   st16    as st32 with r · nw staged in bf16.
// Each variant's y is compared with a double-precision host reference of the unrounded norm:
// the largest error in units of the reference's bf16 ulp, and the engine's beside it.
// Build and run on the device (from the repository root):
//   nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda benches/defer_probe.cu -o defer_probe && ./defer_probe
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>
#include <cuda_runtime.h>

#include "gemv.cu"
#include "gemv_staged.cu"

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

typedef __nv_bfloat16 bf16;

// r = h + delta and u = r · nw for eight elements at k.
__device__ __forceinline__ void seam8(float (&rv)[8], float (&u)[8], const float* __restrict__ h, const bf16* __restrict__ delta,
                                      const float* __restrict__ nw, int k) {
  float hv[8], dv[8], wv[8];
  load_vec<8>(hv, h + k);
  load_vec<8>(dv, delta + k);
  load_vec<8>(wv, nw + k);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    rv[i] = hv[i] + dv[i];
    u[i] = rv[i] * wv[i];
  }
}

// The one-row GEMV over x from X (load(xv, k, ss) also adds r² of its eight elements to ss),
// its sums scaled by 1/rms at the end. `ss_pre` (staged variants) is the block's finished Σ r²:
// the warps then sum none.
template <bool FLY, typename X>
__device__ void gemv_defer(X x, float ss_pre, const bf16* __restrict__ w, bf16* __restrict__ y, int N, int K, int splits, float eps) {
  __shared__ float part[8][GEMV_ROWS + 1];
  const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = wib % splits;
  const int steps = (K + 255) / 256, per = (steps + splits - 1) / splits;
  const int k_end = min(K, (s + 1) * per * 256);
  const int n0 = (blockIdx.y * (8 / splits) + wib / splits) * GEMV_ROWS;
  float acc[GEMV_ROWS] = {}, ss = 0.0f;
  if (n0 < N) {
#pragma unroll 4
    for (int k = s * per * 256 + lane * 8; k < k_end; k += 256) {
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
      x.load(xv, k, ss);
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] += wv[r][i] * xv[i];
    }
  }
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; ++r) acc[r] = warp_sum(acc[r]);
  if (FLY) ss = warp_sum(ss);
  if (splits > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r) part[wib][r] = acc[r];
      part[wib][GEMV_ROWS] = ss;
    }
    __syncthreads();
    if (s == 0) {
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r) {
        acc[r] = part[wib][r];
        for (int j = 1; j < splits; ++j) acc[r] += part[wib + j][r];
      }
      if (FLY) {
        ss = part[wib][GEMV_ROWS];
        for (int j = 1; j < splits; ++j) ss += part[wib + j][GEMV_ROWS];
      }
    }
  }
  if (!FLY) ss = ss_pre;
  const float inv = rsqrtf(ss / K + eps);
  if (lane == 0 && s == 0)
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
      if (n0 + r < N) y[n0 + r] = from_f32<bf16>(acc[r] * inv);
}

// x = r · nw formed from h, delta and nw where the warp reads W; the warps of block row 0's
// first row slot (which together cover K) write r.
struct FlyRows {
  const float* h;
  const bf16* delta;
  const float* nw;
  float* r;
  __device__ __forceinline__ void load(float (&d)[8], int k, float& ss) const {
    float rv[8];
    seam8(rv, d, h, delta, nw, k);
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += rv[i] * rv[i];
    if (r) {
      *reinterpret_cast<float4*>(r + k) = make_float4(rv[0], rv[1], rv[2], rv[3]);
      *reinterpret_cast<float4*>(r + k + 4) = make_float4(rv[4], rv[5], rv[6], rv[7]);
    }
  }
};
__global__ void __launch_bounds__(256) defer_fly(const float* h, const bf16* delta, const float* nw, float eps, float* r, const bf16* w,
                                                 bf16* y, int N, int K, int splits) {
  pdl_entry();
  const bool writes = blockIdx.y == 0 && (threadIdx.x >> 5) < splits;
  gemv_defer<true>(FlyRows{h, delta, nw, writes ? r : nullptr}, 0.0f, w, y, N, K, splits, eps);
}

// Staged u = r · nw in U (float or bf16), read eight at a time.
template <typename U>
struct StagedU {
  const U* u;
  __device__ __forceinline__ void load(float (&d)[8], int k, float&) const { load_vec<8>(d, u + k); }
};

// One pass over r: each thread's K / 256 groups of... r at i = 8·t + 2048·e (eight elements a
// thread a group), all loads issued before any use; one barrier.
template <typename U>
__global__ void __launch_bounds__(256) defer_staged(const float* h, const bf16* delta, const float* nw, float eps, float* r,
                                                    const bf16* w, bf16* y, int N, int K, int splits) {
  pdl_entry();
  U* us = reinterpret_cast<U*>(gemv_stage);
  __shared__ float sp[8];
  const int tid = threadIdx.x;
  float ss = 0.0f;
  for (int k = tid * 8; k < K; k += 2048) {
    float rv[8], u[8];
    seam8(rv, u, h, delta, nw, k);
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += rv[i] * rv[i];
    store_vec<8>(us + k, u);
    if (blockIdx.y == 0) {
      *reinterpret_cast<float4*>(r + k) = make_float4(rv[0], rv[1], rv[2], rv[3]);
      *reinterpret_cast<float4*>(r + k + 4) = make_float4(rv[4], rv[5], rv[6], rv[7]);
    }
  }
  ss = warp_sum(ss);
  if ((tid & 31) == 0) sp[tid >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < 8; ++j) total += sp[j];
  gemv_defer<false>(StagedU<U>{us}, total, w, y, N, K, splits, eps);
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
  for (int r = 0; r < 7; ++r) {
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

static float bf(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  printf("%s, %d SMs; chains of %d launches, one row, bf16 W; µs a launch (W's TB/s); error: largest |y − ref| in the "
         "reference's bf16 ulps\n\n",
         prop.name, g_sms, CHAIN);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t max_elems = (size_t)32768 * 2048;
  const int copies = 8;  // the LM heads' 134 MB copies; the projections take CHAIN
  bf16 *w, *xb, *y0;
  float *hf, *nw, *rr;
  const size_t wbytes = std::max((size_t)CHAIN * 12352 * 2048, (size_t)copies * max_elems) * 2;
  CK(cudaMalloc(&w, wbytes));
  CK(cudaMalloc(&xb, 8192 * 2));
  CK(cudaMalloc(&hf, 8192 * 4));
  CK(cudaMalloc(&nw, 8192 * 4));
  CK(cudaMalloc(&rr, 8192 * 4));
  CK(cudaMalloc(&y0, 32768 * 2));
  fill<bf16><<<1024, 256>>>(w, wbytes / 2, 1, 0.1f, 0.0f);
  fill<bf16><<<16, 256>>>(xb, 8192, 2, 2.0f, 0.0f);
  fill<float><<<16, 256>>>(hf, 8192, 4, 2.0f, 0.0f);
  fill<float><<<16, 256>>>(nw, 8192, 5, 0.5f, 1.0f);
  CK(cudaDeviceSynchronize());
  struct Case {
    const char* name;
    int n, k;
  } cases[] = {
      {"1.39B in_proj", 9228, 2048},  {"1.39B gate_up", 11264, 2048}, {"Qwen3.5 in_proj", 12352, 2048},
      {"Qwen3.5 qkv", 5120, 2048},    {"Qwen3.5 gate_up", 12288, 2048}, {"1.39B lm_head (v 32000)", 32000, 2048},
  };
  printf("| projection | N × K | splits | plain | engine | fly | st32 | st16 | error engine / fly / st32 / st16 |\n|---|---|---|---|---|---|---|---|---|\n");
  std::vector<uint16_t> yh(32768), wh;
  std::vector<float> hh(2048), nwh(2048);
  std::vector<uint16_t> dh(2048);
  CK(cudaMemcpy(hh.data(), hf, 2048 * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(nwh.data(), nw, 2048 * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dh.data(), xb, 2048 * 2, cudaMemcpyDeviceToHost));
  for (int rep = 0; rep < 2; ++rep)
    for (const Case& c : cases) {
      const int N = c.n, K = c.k, sp = engine_splits(N, K);
      const bool head = N > 16384;
      const int nchain = head ? copies : CHAIN;
      const size_t stride = head ? max_elems : (size_t)12352 * 2048;
      const dim3 grid(1, (N * sp + 15) / 16);
      const double mb = (double)N * K * 2 / 1e6;
      const float eps = 1e-6f;
      // reference, from copy 0 of W
      wh.resize((size_t)N * K);
      CK(cudaMemcpy(wh.data(), w, (size_t)N * K * 2, cudaMemcpyDeviceToHost));
      std::vector<double> u(K), ref(N);
      double ssd = 0;
      for (int k = 0; k < K; ++k) {
        const double r = (double)hh[k] + (double)bf(dh[k]);
        ssd += r * r;
        u[k] = r * nwh[k];
      }
      const double inv = 1.0 / std::sqrt(ssd / K + eps);
      for (int n = 0; n < N; ++n) {
        double a = 0;
        for (int k = 0; k < K; ++k) a += (double)bf(wh[(size_t)n * K + k]) * u[k];
        ref[n] = a * inv;
      }
      auto err = [&]() {
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(yh.data(), y0, N * 2, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int n = 0; n < N; ++n) {
          const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref[n]), 1e-30)) - 7);
          worst = std::max(worst, std::fabs(bf(yh[n]) - ref[n]) / ulp);
        }
        return worst;
      };
      auto run = [&](int variant) {
        const unsigned smem = variant == 1 || variant == 4 ? K * 2 : variant == 3 ? K * 4 : 0;
        if (variant == 3) CK(cudaFuncSetAttribute(defer_staged<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, K * 4));
        return chain_us(
            [&](cudaLaunchConfig_t& cfg, int i) {
              const bf16* wi = w + (size_t)(i % nchain) * stride;
              const float* h = hf;
              if (variant == 0) CK(cudaLaunchKernelEx(&cfg, gemv_bf16_b1, (const bf16*)xb, (long)K, wi, y0, N, K, sp));
              else if (variant == 1) CK(cudaLaunchKernelEx(&cfg, add_norm_gemv_bf16_b1, h, (const bf16*)xb, (const float*)nw, eps, rr, wi, y0, N, K, sp));
              else if (variant == 2) CK(cudaLaunchKernelEx(&cfg, defer_fly, h, (const bf16*)xb, (const float*)nw, eps, rr, wi, y0, N, K, sp));
              else if (variant == 3) CK(cudaLaunchKernelEx(&cfg, defer_staged<float>, h, (const bf16*)xb, (const float*)nw, eps, rr, wi, y0, N, K, sp));
              else CK(cudaLaunchKernelEx(&cfg, defer_staged<bf16>, h, (const bf16*)xb, (const float*)nw, eps, rr, wi, y0, N, K, sp));
            },
            grid, smem, s);
      };
      float us[5];
      double e[5];
      for (int v = 0; v < 5; ++v) {
        us[v] = run(v);
        e[v] = err();
      }
      printf("| %s | %d × %d | %d | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f / %.2f / %.2f / %.2f |\n",
             c.name, N, K, sp, us[0], mb / us[0], us[1], mb / us[1], us[2], mb / us[2], us[3], mb / us[3], us[4], mb / us[4], e[1], e[2],
             e[3], e[4]);
    }
  // r written by the fly variant equals h + delta
  std::vector<float> rh(2048);
  CK(cudaMemcpy(rh.data(), rr, 2048 * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int k = 0; k < 2048; ++k) bad += rh[k] != hh[k] + bf(dh[k]);
  printf("\nr = h + delta: %s\n", bad ? "DIFFERS" : "equal");
  CK(cudaGetLastError());
  return 0;
}
