// y = x Wᵀ for a few rows of x (a decode step's projections: every weight is read once, so the
// step is bound by how fast W streams in). W [N, K] row-major, x [B, K] with row stride ldx,
// y [B, N] contiguous, all in the activation dtype T; fp32 accumulation, rounded once.
#include "common.cuh"
#include "dtype.cuh"

// Output rows a warp computes (their loads are in flight together).
#define GEMV_ROWS 2

// Grid (ceil(N / (GEMV_ROWS · warps a block))), blocks of 256 threads: each warp takes
// GEMV_ROWS rows of W and walks K in 16-byte pieces (eight elements a lane, 256 a warp), for
// all NB rows of x at once. K, ldx and the addresses are multiples of 8 elements (checked by the
// launcher).
template <typename T, int NB>
__device__ void gemv(const T* __restrict__ x, long ldx, const T* __restrict__ w, T* __restrict__ y, int N, int K) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  const int n0 = warp * GEMV_ROWS;
  if (n0 >= N) return;
  float acc[GEMV_ROWS][NB] = {};
#pragma unroll 4
  for (int k = lane * 8; k < K; k += 256) {
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
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      float xv[8];
      load_vec<8>(xv, x + (size_t)b * ldx + k);
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][b] += wv[r][i] * xv[i];
    }
  }
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = warp_sum(acc[r][b]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
      if (n0 + r < N)
#pragma unroll
        for (int b = 0; b < NB; ++b) y[(size_t)b * N + n0 + r] = from_f32<T>(acc[r][b]);
  }
}

// gemv_{dtype}_b{NB}: NB rows of x.
#define GEMV_ENTRY(T, NAME, NB)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) gemv_##NAME##_b##NB(const T* x, long ldx, const T* w, T* y, int N, \
                                                                        int K) {                                     \
    gemv<T, NB>(x, ldx, w, y, N, K);                                                                                 \
  }
#define GEMV_ENTRIES(T, NAME) \
  GEMV_ENTRY(T, NAME, 1)      \
  GEMV_ENTRY(T, NAME, 2)      \
  GEMV_ENTRY(T, NAME, 3)      \
  GEMV_ENTRY(T, NAME, 4)      \
  GEMV_ENTRY(T, NAME, 5)      \
  GEMV_ENTRY(T, NAME, 6)      \
  GEMV_ENTRY(T, NAME, 7)      \
  GEMV_ENTRY(T, NAME, 8)
GEMV_ENTRIES(__nv_bfloat16, bf16)
GEMV_ENTRIES(__half, f16)
