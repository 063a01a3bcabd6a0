// Copy bandwidth of one GPU with and without streaming cache hints: does a copy kernel move
// more than the roofline's (gpu_bench times copy.cu's copy_many, plain loads and stores)?
// 64 ranges of 16 MB, copy_many's grid (64 blocks a range, 256 threads, 16 bytes a move), and
// one grid-stride launch over all 1 GiB; median of 15 after 3 warm-ups. Build on the device:
//   nvcc -O3 -arch=sm_90a copy_probe.cu -o copy_probe && ./copy_probe
#include <algorithm>
#include <cstdio>
#include <vector>

template <int MODE>  // 0 plain, 1 ld.cs + st.cs, 2 plain load + st.cs, 3 ld.cs + plain store
__global__ void ranges(const uint4* src, uint4* dst, size_t per) {
  const uint4* s = src + blockIdx.y * per;
  uint4* d = dst + blockIdx.y * per;
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < per; k += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = (MODE == 1 || MODE == 3) ? __ldcs(s + k) : s[k];
    if (MODE == 1 || MODE == 2) __stcs(d + k, v);
    else d[k] = v;
  }
}

template <int MODE>
float time_ms(const uint4* src, uint4* dst, size_t per, int nranges, dim3 grid) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < 18; ++i) {
    cudaEventRecord(a);
    ranges<MODE><<<grid, 256>>>(src, dst, per);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  const int nranges = 64;
  const size_t per = (16u << 20) / 16;  // uint4s a range
  const size_t total = per * nranges;
  uint4 *src, *dst;
  cudaMalloc(&src, total * 16);
  cudaMalloc(&dst, total * 16);
  cudaMemset(src, 1, total * 16);
  cudaMemset(dst, 0, total * 16);
  const double bytes = 2.0 * total * 16;
  const char* names[] = {"plain", "ld.cs + st.cs", "plain load, st.cs", "ld.cs, plain store"};
  for (int round = 0; round < 2; ++round) {
    for (int layout = 0; layout < 2; ++layout) {
      // copy_many's grid, or one grid-stride launch over the whole buffer (8 blocks an SM).
      const dim3 g = layout == 0 ? dim3(64, nranges) : dim3(132 * 8, 1);
      const size_t p = layout == 0 ? per : total;
      float ms[4] = {time_ms<0>(src, dst, p, nranges, g), time_ms<1>(src, dst, p, nranges, g),
                     time_ms<2>(src, dst, p, nranges, g), time_ms<3>(src, dst, p, nranges, g)};
      for (int m = 0; m < 4; ++m)
        printf("round %d, %s grid, %s: %.4f ms, %.0f GB/s\n", round + 1, layout == 0 ? "copy_many's" : "grid-stride",
               names[m], ms[m], bytes / (ms[m] * 1e-3) / 1e9);
    }
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    printf("CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
