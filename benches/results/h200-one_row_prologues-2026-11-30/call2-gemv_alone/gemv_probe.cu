// One-row decode projections alone: the engine's GEMV (kernels/cuda/gemv.cuh) against a pure
// read of the same bytes, and against the same GEMV with every load of a group of W's steps
// issued before the first is used (PRE steps a warp). Each shape runs as a captured chain of
// 24 launches, each on its own copy of W (so W comes from memory, not L2), programmatic edges
// as in the engine's decode graphs; µs a launch and W's bytes over it. The variant's outputs are
// compared bit for bit with the engine's (the same products and sums in the same order).
// Build and run on the device (from the repository root):
//   nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda benches/gemv_probe.cu -o gemv_probe && ./gemv_probe
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#include "gemv.cuh"

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

typedef __nv_bfloat16 bf16;

// gemv.cuh's gemv for one row, LOOP off, no epilogue, with each warp's loads of W issued PRE
// steps at a time (raw bits in registers) before any is converted and used.
template <int PRE>
__device__ void gemv_pre(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y, int N, int K, int splits) {
  __shared__ float part[8][GEMV_ROWS];
  const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = wib % splits;
  const int steps = (K + 255) / 256, per = (steps + splits - 1) / splits;
  const int k_end = min(K, (s + 1) * per * 256);
  const int n0 = (blockIdx.y * (8 / splits) + wib / splits) * GEMV_ROWS;
  float acc[GEMV_ROWS] = {};
  if (n0 < N) {
    for (int k0 = s * per * 256 + lane * 8; k0 < k_end; k0 += PRE * 256) {
      uint4 raw[PRE][GEMV_ROWS];
#pragma unroll
      for (int j = 0; j < PRE; ++j)
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) {
          const int k = k0 + j * 256;
          raw[j][r] = make_uint4(0, 0, 0, 0);
          if (k < k_end && n0 + r < N) raw[j][r] = __ldg(reinterpret_cast<const uint4*>(w + (size_t)(n0 + r) * K + k));
        }
#pragma unroll
      for (int j = 0; j < PRE; ++j) {
        const int k = k0 + j * 256;
        if (k < k_end) {
          float xv[8];
          load_vec<8>(xv, x + k);
#pragma unroll
          for (int r = 0; r < GEMV_ROWS; ++r) {
            const bf16* h = reinterpret_cast<const bf16*>(&raw[j][r]);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r] += to_f32(h[i]) * xv[i];
          }
        }
      }
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

__global__ void __launch_bounds__(256) engine_gemv(const bf16* x, const bf16* w, bf16* y, int N, int K, int splits) {
  pdl_entry();
  gemv<bf16, 1>(PlainRows<bf16>{x, 0}, w, y, N, K, splits);
}
template <int PRE>
__global__ void __launch_bounds__(256) pre_gemv(const bf16* x, const bf16* w, bf16* y, int N, int K, int splits) {
  pdl_entry();
  gemv_pre<PRE>(x, w, y, N, K, splits);
}
// The same bytes read as a stream: grid-stride, 8 loads of 16 bytes in flight a thread.
__global__ void __launch_bounds__(256) pure_read(const bf16* x, const bf16* w, bf16* y, int N, int K, int) {
  pdl_entry();
  const uint4* src = reinterpret_cast<const uint4*>(w);
  const size_t n = (size_t)N * K / 8, stride = (size_t)gridDim.x * gridDim.y * blockDim.x;
  const size_t first = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
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
  if (acc == 0x9e3779b9u) y[0] = from_f32<bf16>(1.0f);
}

typedef void (*Kernel)(const bf16*, const bf16*, bf16*, int, int, int);

static int g_sms;

// kernels/src/cuda/gemv.rs's k_splits for one row.
int engine_splits(int n, int k) {
  const int steps = (k + 255) / 256, cap = 8;
  auto allowed = [&](int s) { return s == 1 || (s <= cap && steps >= 2 * s); };
  auto blocks = [&](int s) { return (n * s + 15) / 16; };
  int s = 1;
  while (blocks(s) < 3 * g_sms && s < 8 && allowed(2 * s)) s *= 2;
  return s;
}

const int CHAIN = 24;

// A captured chain of CHAIN launches of `k` (copy i of W each), replayed: µs a launch.
float chain_us(Kernel kern, dim3 grid, const bf16* x, const bf16* w, size_t w_elems, bf16* y, int N, int K, int splits,
               cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < CHAIN; ++i) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kern, x, w + i * w_elems, y, N, K, splits));
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

__global__ void fill(bf16* p, size_t n, unsigned seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = from_f32<bf16>(((h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  printf("%s, %d SMs; chains of %d launches, one row of x, bf16\n\n", prop.name, g_sms, CHAIN);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct Shape {
    const char* name;
    int n, k;
  } shapes[] = {
      {"1.39B in_proj", 9228, 2048},        {"1.39B o_proj", 2048, 3072},        {"1.39B gate_up", 11264, 2048},
      {"1.39B down", 2048, 5632},           {"Qwen3.5 GDN in_proj", 12352, 2048}, {"Qwen3.5 out_proj", 2048, 4096},
      {"Qwen3.5 attention qkv", 5120, 2048}, {"Qwen3.5 o_proj", 2048, 2048},     {"Qwen3.5 gate_up", 12288, 2048},
      {"Qwen3.5 down", 2048, 6144},
  };
  const size_t max_elems = (size_t)12352 * 2048;
  bf16 *w, *x, *y0, *y1;
  CK(cudaMalloc(&w, CHAIN * max_elems * 2));
  CK(cudaMalloc(&x, 8192 * 2));
  CK(cudaMalloc(&y0, 16384 * 2));
  CK(cudaMalloc(&y1, 16384 * 2));
  fill<<<1024, 256>>>(w, CHAIN * max_elems, 1);
  fill<<<16, 256>>>(x, 8192, 2);
  CK(cudaDeviceSynchronize());
  printf("| shape | N × K | MB | splits | pure read µs (TB/s) | engine µs (TB/s) | PRE 2 | PRE 4 | PRE 8 | bits |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<bf16> h0(16384), h1(16384);
  for (const Shape& sh : shapes) {
    const size_t elems = (size_t)sh.n * sh.k;
    const double mb = elems * 2 / 1e6;
    const int eng = engine_splits(sh.n, sh.k);
    const int steps = (sh.k + 255) / 256;
    std::vector<int> splits{eng};
    for (int sp : {1, 2, 4, 8})
      if (sp != eng && (sp == 1 || steps >= 2 * sp)) splits.push_back(sp);
    const float us_read = chain_us(pure_read, dim3(1, g_sms * 4), x, w, max_elems, y0, sh.n, sh.k, 0, s);
    auto tb = [&](float us) { return mb / us; };  // MB a µs = TB/s
    for (int sp : splits) {
      const dim3 grid(1, (sh.n * sp + 15) / 16);
      const float us_eng = chain_us(engine_gemv, grid, x, w, max_elems, y0, sh.n, sh.k, sp, s);
      CK(cudaMemcpy(h0.data(), y0, sh.n * 2, cudaMemcpyDeviceToHost));
      float us_pre[3];
      bool same = true;
      Kernel pre[3] = {pre_gemv<2>, pre_gemv<4>, pre_gemv<8>};
      for (int p = 0; p < 3; ++p) {
        CK(cudaMemset(y1, 0, 16384 * 2));
        us_pre[p] = chain_us(pre[p], grid, x, w, max_elems, y1, sh.n, sh.k, sp, s);
        CK(cudaMemcpy(h1.data(), y1, sh.n * 2, cudaMemcpyDeviceToHost));
        same = same && memcmp(h0.data(), h1.data(), sh.n * 2) == 0;
      }
      printf("| %s | %d × %d | %.1f | %d%s | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %s |\n", sh.name,
             sh.n, sh.k, mb, sp, sp == eng ? " (engine)" : "", us_read, tb(us_read), us_eng, tb(us_eng), us_pre[0], tb(us_pre[0]),
             us_pre[1], tb(us_pre[1]), us_pre[2], tb(us_pre[2]), same ? "equal" : "DIFFER");
    }
  }
  CK(cudaGetLastError());
  return 0;
}
