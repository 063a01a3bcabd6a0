// Does a captured graph's alloc/free nodes cost time between kernels? Chains of N kernels,
// captured with fixed buffers or with a cudaMallocAsync'd output and cudaFreeAsync'd input each.
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void k(const float* in, float* out, int n, long long spin) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  long long t0 = clock64();
  while (clock64() - t0 < spin) {}
  if (i < n) out[i] = in[i] + 1.0f;
}

int main() {
  const int N = 180, n = 256 * 132, iters = 200;
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *a, *b; CK(cudaMalloc(&a, n * 4)); CK(cudaMalloc(&b, n * 4));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  long long spins[] = {0, 2000, 6000};
  for (long long spin : spins) {
    for (int variant = 0; variant < 3; ++variant) {
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      float* cur = a;
      for (int j = 0; j < N; ++j) {
        if (variant == 0) {
          float* out = (j % 2) ? a : b;
          k<<<132, 256, 0, s>>>(cur, out, n, spin);
          cur = out;
        } else {
          float* out; CK(cudaMallocAsync(&out, n * 4, s));
          k<<<132, 256, 0, s>>>(cur, out, n, spin);
          if (cur != a) CK(cudaFreeAsync(cur, s));
          cur = out;
          if (variant == 2) { float* extra; CK(cudaMallocAsync(&extra, 4096, s)); CK(cudaFreeAsync(extra, s)); }
        }
      }
      if (cur != a) CK(cudaFreeAsync(cur, s));
      CK(cudaStreamEndCapture(s, &g));
      size_t nodes = 0; cudaGraphGetNodes(g, nullptr, &nodes);
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphUpload(ge, s));
      for (int w = 0; w < 20; ++w) CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      float best = 1e9, sum = 0;
      for (int r = 0; r < 5; ++r) {
        cudaEventRecord(e0, s);
        for (int it = 0; it < iters; ++it) CK(cudaGraphLaunch(ge, s));
        cudaEventRecord(e1, s);
        CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1); ms /= iters;
        if (ms < best) best = ms; sum += ms;
      }
      // Eager reference: the same chain launched without a graph (fixed buffers).
      printf("spin %lld variant %d (%s): %zu nodes, %.4f ms a graph (best of 5), %.3f us a kernel\n", spin, variant,
             variant == 0 ? "fixed buffers" : variant == 1 ? "alloc+free per kernel" : "two allocs+frees per kernel",
             nodes, best, best * 1000 / N);
      cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
    }
    // A single kernel's own time at this spin.
    cudaEventRecord(e0, s);
    for (int it = 0; it < 1000; ++it) k<<<132, 256, 0, s>>>(a, b, n, spin);
    cudaEventRecord(e1, s); CK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    printf("spin %lld: eager stream of 1000 kernels %.3f us a kernel\n", spin, ms);
  }
  return 0;
}
