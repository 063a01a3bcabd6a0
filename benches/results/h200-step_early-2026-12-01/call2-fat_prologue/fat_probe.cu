// One-row projections with the block seam's add + RMSNorm folded in: does the prologue cost less
// when fewer, larger blocks run it, and does a balanced split of W's rows over the blocks help?
// Chains of 24 launches (each on its own copy of W, programmatic edges), µs a launch, W's TB/s.
//   plain      gemv.cu's one-row GEMV of a bf16 x (HEAD);
//   engine     gemv_staged.cu's add_norm_gemv (HEAD): the prologue, then the GEMV;
//   bal-plain  the plain GEMV, blocks of 8 warps, a grid of 6 blocks an SM, each block an equal
//              run of row pairs;
//   keep256    blocks of 8 warps, the prologue's h, delta and nw in registers (one round), the
//              balanced split, 5 blocks an SM;
//   fat512     blocks of 16 warps, threads < 256 run keep256's prologue, 3 blocks an SM, balanced;
//   fat1024    blocks of 32 warps, the same, 1 block an SM (2 a SM where it fits: 2048 threads).
// Every fused variant must give the engine's y and r bit for bit (the same sums in the same order).
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

// The prologue with the norm kernel's order (thread t < 256 sums i = t, t + 256, ... in order,
// then the warp, then the 8 warps in order), its eight elements' h, delta and nw loaded in one
// round and held in registers. K ≤ 2048. Threads ≥ 256 wait at the barriers.
__device__ __forceinline__ void keep_prologue(const float* __restrict__ h, const bf16* __restrict__ delta,
                                              const float* __restrict__ nw, float* __restrict__ r, bf16* xs, int K,
                                              float eps, bool write_r) {
  __shared__ float part[8];
  const int tid = threadIdx.x;
  float v[8], wv[8];
  if (tid < 256) {
    bf16 d[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int i = min(tid + e * 256, K - 1);
      v[e] = h[i];
      d[e] = delta[i];
      wv[e] = nw[i];
    }
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = tid + e * 256 < K ? v[e] + to_f32(d[e]) : 0.0f;
      ss += v[e] * v[e];
    }
    ss = warp_sum(ss);
    if ((tid & 31) == 0) part[tid >> 5] = ss;
  }
  __syncthreads();
  if (tid < 256) {
    float total = 0.0f;
    for (int j = 0; j < 8; ++j) total += part[j];
    const float inv = rsqrtf(total / K + eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int i = tid + e * 256;
      if (i < K) {
        if (write_r) r[i] = v[e];
        xs[i] = from_f32<bf16>(v[e] * inv * wv[e]);
      }
    }
  }
  __syncthreads();
}

// The GEMV over an equal run of row pairs a block (splits = 1): warp j of the block takes pairs
// p0 + j, p0 + j + WARPS, ... The per-row arithmetic is gemv.cuh's (lane k order, warp_sum).
template <int WARPS, typename X>
__device__ __forceinline__ void balanced_gemv(X x, const bf16* __restrict__ w, bf16* __restrict__ y, int N, int K) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long pairs = (N + 1) / 2;
  const int p0 = (int)(pairs * blockIdx.x / gridDim.x), p1 = (int)(pairs * (blockIdx.x + 1) / gridDim.x);
  for (int p = p0 + warp; p < p1; p += WARPS) {
    const int n0 = 2 * p;
    float acc[2] = {0.0f, 0.0f};
#pragma unroll 4
    for (int k = lane * 8; k < K; k += 256) {
      float wv[2][8];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
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
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] += wv[r][i] * xv[i];
    }
    acc[0] = warp_sum(acc[0]);
    acc[1] = warp_sum(acc[1]);
    if (lane == 0) {
      y[n0] = from_f32<bf16>(acc[0]);
      if (n0 + 1 < N) y[n0 + 1] = from_f32<bf16>(acc[1]);
    }
  }
}

__global__ void __launch_bounds__(256) bal_plain(const bf16* x, const bf16* w, bf16* y, int N, int K) {
  pdl_entry();
  balanced_gemv<8>(PlainRows<bf16>{x, K}, w, y, N, K);
}

template <int WARPS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB) fused(const float* h, const bf16* delta, const float* nw, float eps,
                                                          float* r, const bf16* w, bf16* y, int N, int K) {
  pdl_entry();
  bf16* xs = reinterpret_cast<bf16*>(gemv_stage);
  keep_prologue(h, delta, nw, r, xs, K, eps, blockIdx.x == 0);
  balanced_gemv<WARPS>(StagedRows<bf16>{xs, K}, w, y, N, K);
}

static int g_sms;
const int CHAIN = 24;

int engine_splits(int n, int k) {
  const int steps = (k + 255) / 256, cap = 8;
  auto allowed = [&](int s) { return s == 1 || (s <= cap && steps >= 2 * s); };
  auto blocks = [&](int s) { return (n * s + 15) / 16; };
  int s = 1;
  while (blocks(s) < 3 * g_sms && s < 8 && allowed(2 * s)) s *= 2;
  return s;
}

float chain_us(const std::function<void(cudaLaunchConfig_t&, int)>& launch, dim3 grid, dim3 block, unsigned smem,
               cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < CHAIN; ++i) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
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

template <typename K>
int occupancy(K kernel, int threads, int smem) {
  int n = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return n;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t max_elems = (size_t)32768 * 2048;
  const int copies = 8;
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
  const int K = 2048;
  const int occ_engine = occupancy(add_norm_gemv_bf16_b1, 256, K * 2), occ_plain = occupancy(gemv_bf16_b1, 256, 0),
            occ_bal = occupancy(bal_plain, 256, 0), occ_k256 = occupancy(fused<8, 5>, 256, K * 2),
            occ_f512 = occupancy(fused<16, 3>, 512, K * 2), occ_f1024 = occupancy(fused<32, 1>, 1024, K * 2);
  printf("%s, %d SMs; chains of %d launches, one row, bf16 W, K = %d; µs a launch (W's TB/s)\n", prop.name, g_sms, CHAIN, K);
  printf("blocks an SM: plain %d, engine %d, bal-plain %d, keep256 %d, fat512 %d, fat1024 %d\n\n", occ_plain, occ_engine,
         occ_bal, occ_k256, occ_f512, occ_f1024);
  struct Case {
    const char* name;
    int n;
  } cases[] = {{"1.39B in_proj", 9228}, {"1.39B gate_up (rows as they lie)", 11264}, {"Qwen3.5 in_proj", 12352},
               {"1.39B lm_head (v 32000)", 32000}};
  printf("| projection | N | plain | engine | bal-plain | keep256 | fat512 | fat1024 | y, r = engine's |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int rep = 0; rep < 2; ++rep)
    for (const Case& c : cases) {
      const int N = c.n, sp = engine_splits(N, K);
      const bool head = N > 16384;
      const int nchain = head ? copies : CHAIN;
      const size_t stride = head ? max_elems : (size_t)12352 * 2048;
      const double mb = (double)N * K * 2 / 1e6;
      const float eps = 1e-6f;
      std::vector<uint16_t> ys[6];
      std::vector<float> rs[6];
      float us[6];
      auto grab = [&](int v) {
        CK(cudaDeviceSynchronize());
        ys[v].resize(N);
        rs[v].resize(K);
        CK(cudaMemcpy(ys[v].data(), y0, N * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(rs[v].data(), rr, K * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemset(y0, 0, N * 2));
        CK(cudaMemset(rr, 0, K * 4));
      };
      const int pairs = (N + 1) / 2;
      auto grid_for = [&](int warps, int per_sm) { return dim3(std::min(g_sms * per_sm, (pairs + warps - 1) / warps)); };
      us[0] = chain_us([&](cudaLaunchConfig_t& cfg, int i) {
            CK(cudaLaunchKernelEx(&cfg, gemv_bf16_b1, (const bf16*)xb, (long)K, (const bf16*)(w + (size_t)(i % nchain) * stride), y0, N, K, sp));
          }, dim3(1, (N * sp + 15) / 16), dim3(256), 0, s);
      grab(0);
      us[1] = chain_us([&](cudaLaunchConfig_t& cfg, int i) {
            CK(cudaLaunchKernelEx(&cfg, add_norm_gemv_bf16_b1, (const float*)hf, (const bf16*)xb, (const float*)nw, eps, rr,
                                  (const bf16*)(w + (size_t)(i % nchain) * stride), y0, N, K, sp));
          }, dim3(1, (N * sp + 15) / 16), dim3(256), K * 2, s);
      grab(1);
      us[2] = chain_us([&](cudaLaunchConfig_t& cfg, int i) {
            CK(cudaLaunchKernelEx(&cfg, bal_plain, (const bf16*)xb, (const bf16*)(w + (size_t)(i % nchain) * stride), y0, N, K));
          }, grid_for(8, occ_bal), dim3(256), 0, s);
      grab(2);
      us[3] = chain_us([&](cudaLaunchConfig_t& cfg, int i) {
            CK(cudaLaunchKernelEx(&cfg, fused<8, 5>, (const float*)hf, (const bf16*)xb, (const float*)nw, eps, rr,
                                  (const bf16*)(w + (size_t)(i % nchain) * stride), y0, N, K));
          }, grid_for(8, occ_k256), dim3(256), K * 2, s);
      grab(3);
      us[4] = chain_us([&](cudaLaunchConfig_t& cfg, int i) {
            CK(cudaLaunchKernelEx(&cfg, fused<16, 3>, (const float*)hf, (const bf16*)xb, (const float*)nw, eps, rr,
                                  (const bf16*)(w + (size_t)(i % nchain) * stride), y0, N, K));
          }, grid_for(16, occ_f512), dim3(512), K * 2, s);
      grab(4);
      us[5] = chain_us([&](cudaLaunchConfig_t& cfg, int i) {
            CK(cudaLaunchKernelEx(&cfg, fused<32, 1>, (const float*)hf, (const bf16*)xb, (const float*)nw, eps, rr,
                                  (const bf16*)(w + (size_t)(i % nchain) * stride), y0, N, K));
          }, grid_for(32, occ_f1024), dim3(1024), K * 2, s);
      grab(5);
      const bool same = ys[3] == ys[1] && ys[4] == ys[1] && ys[5] == ys[1] && rs[3] == rs[1] && rs[4] == rs[1] && rs[5] == rs[1];
      const bool plain_same = ys[2] == ys[0];
      printf("| %s | %d | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %s; bal-plain = plain: %s |\n",
             c.name, N, us[0], mb / us[0], us[1], mb / us[1], us[2], mb / us[2], us[3], mb / us[3], us[4], mb / us[4], us[5],
             mb / us[5], same ? "equal" : "DIFFER", plain_same ? "equal" : "DIFFER");
    }
  CK(cudaGetLastError());
  return 0;
}
