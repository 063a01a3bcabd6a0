// The small-batch GEMV (gemv.cu, gemv_staged.cu): y = x Wᵀ for a few rows of x (a decode
// step's projections: every weight is read once, so the step is bound by how fast W streams
// in). W [N, K] row-major, x [B, K] with row stride ldx, y [B, N] contiguous, all in the activation dtype T; fp32 accumulation, rounded once. The
// rows of x come through a loader X (gemv.cu: rows as they lie, or the MLP's x = silu(gate) · up
// formed on the fly from the gate/up halves of the fused projection, rounded to T exactly as
// swiglu.cu would store it; gemv_staged.cu: rows a prologue formed in shared memory).
#pragma once
#include "common.cuh"
#include "dtype.cuh"

// ENTRY(T, NAME, NB) for every batch of rows the GEMV kernels take, 1..8.
#define FOR_EACH_GEMV_BATCH(ENTRY, T, NAME) \
  ENTRY(T, NAME, 1)                         \
  ENTRY(T, NAME, 2)                         \
  ENTRY(T, NAME, 3)                         \
  ENTRY(T, NAME, 4)                         \
  ENTRY(T, NAME, 5)                         \
  ENTRY(T, NAME, 6)                         \
  ENTRY(T, NAME, 7)                         \
  ENTRY(T, NAME, 8)

// Output rows a warp computes (their loads are in flight together).
#define GEMV_ROWS 2

// A finished sum rounded once to T and stored as Y: T itself, or (Y = float) T's value widened,
// the bits a cast of the stored T would give.
template <typename T, typename Y>
__device__ __forceinline__ Y round_to(float acc) {
  if constexpr (std::is_same_v<Y, float>) {
    return to_f32(from_f32<T>(acc));
  } else {
    return from_f32<T>(acc);
  }
}

// x's rows as they are: eight elements of row b from column k.
template <typename T>
struct PlainRows {
  const T* x;
  long ldx;
  __device__ __forceinline__ void load(float (&d)[8], int b, int k) const { load_vec<8>(d, x + (size_t)b * ldx + k); }
  __device__ __forceinline__ void skip(int rows) { x += (size_t)rows * ldx; }
};

// x = silu(gate) · up, rounded to T (swiglu.cu's arithmetic), from rows of gate and up.
template <typename T>
struct SwigluRows {
  const T* gate;
  const T* up;
  long ld;
  __device__ __forceinline__ void skip(int rows) {
    gate += (size_t)rows * ld;
    up += (size_t)rows * ld;
  }
  __device__ __forceinline__ void load(float (&d)[8], int b, int k) const {
    float g[8], u[8];
    load_vec<8>(g, gate + (size_t)b * ld + k);
    load_vec<8>(u, up + (size_t)b * ld + k);
#pragma unroll
    for (int i = 0; i < 8; ++i) d[i] = to_f32(from_f32<T>(ds_silu(g[i]) * u[i]));
  }
};

// Which rows of W a warp takes, and whether the kernel stores y: slot q of the 8 / splits row
// slots of column block `by` takes GEMV_ROWS rows from first_row(by, q, slots), in order
// (gemv_staged.cu's SwigluPairs takes them otherwise and stores no y).
struct RowsInOrder {
  static constexpr bool stores_y = true;
  __device__ __forceinline__ int first_row(int by, int q, int slots) const { return (by * slots + q) * GEMV_ROWS; }
};

// What a warp does with its finished sums besides storing y: nothing, or gemv_staged.cu's
// ConvFold or SwigluPairs. `prefetch` runs before a group's loads of W (its loads are in
// flight under them), `finish` after the sums are complete, in every lane of the warp that
// stores them.
struct NoEpilogue : RowsInOrder {
  template <int NB>
  __device__ __forceinline__ void prefetch(int, int, int) const {}
  template <typename T, int NB>
  __device__ __forceinline__ void finish(const float (&)[GEMV_ROWS][NB], int, int, int) const {}
};

// Blocks of 8 warps. A warp takes GEMV_ROWS rows of W and one of `splits` slices of K (whole
// 256-column steps), walking it in 16-byte pieces (eight elements a lane, 256 a warp) for all
// NB rows of x at once (X loads them); the `splits` warps of a row pair sit side by side in a
// block and add their partial sums through shared memory in a fixed order. Grid
// (row groups, column blocks): blockIdx.x picks NB rows of x (and of y), so the blocks that
// read one slice of W run side by side and share it through L2; blockIdx.y picks the block's
// first 8·GEMV_ROWS/splits rows of W; with LOOP (the staged kernels of two or more rows) a grid
// with fewer column blocks than that takes every gridDim.y-th group after it, its prologue run
// once for them (one row's kernel runs without: the loop's registers cost it more occupancy
// than its repeated prologues). A
// row's sums do not depend on NB, on the other rows or on the grid. Splitting K gives rows few
// enough to leave SMs idle (N = 2048: 128 blocks) more warps to keep loads in flight. K, the row
// strides and the addresses are multiples of 8 elements (checked by the launcher). y is T, or
// f32 holding T's values (the LM head's logits, without a cast's launch).
template <typename T, int NB, bool LOOP = false, typename X, typename Y, typename E = NoEpilogue>
__device__ void gemv(X x, const T* __restrict__ w, Y* __restrict__ y, int N, int K, int splits, E epi = E{}) {
  __shared__ float part[8][GEMV_ROWS][NB];
  const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = wib % splits;
  const int per_block = (8 / splits) * GEMV_ROWS;
  x.skip(blockIdx.x * NB);
  y += (size_t)blockIdx.x * NB * N;
  const int steps = (K + 255) / 256, per = (steps + splits - 1) / splits;
  const int k_end = min(K, (s + 1) * per * 256);
  int by = blockIdx.y;
  do {
    const int n0 = epi.first_row(by, wib / splits, 8 / splits);
    float acc[GEMV_ROWS][NB] = {};
    if (s == 0) epi.template prefetch<NB>(n0, blockIdx.x * NB, lane);
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
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          float xv[8];
          x.load(xv, b, k);
#pragma unroll
          for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r][b] += wv[r][i] * xv[i];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
      for (int b = 0; b < NB; ++b) acc[r][b] = warp_sum(acc[r][b]);
    if (splits > 1) {
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
          for (int b = 0; b < NB; ++b) part[wib][r][b] = acc[r][b];
      }
      __syncthreads();
      if (s == 0) {
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
          for (int b = 0; b < NB; ++b) {
            acc[r][b] = part[wib][r][b];
            for (int j = 1; j < splits; ++j) acc[r][b] += part[wib + j][r][b];
          }
      }
      // part is written again by the next group.
      __syncthreads();
    }
    if (s == 0) epi.template finish<T, NB>(acc, n0, blockIdx.x * NB, lane);
    if (E::stores_y && lane == 0 && s == 0) {
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r)
        if (n0 + r < N)
#pragma unroll
          for (int b = 0; b < NB; ++b) y[(size_t)b * N + n0 + r] = round_to<T, Y>(acc[r][b]);
    }
    by += gridDim.y;
  } while (LOOP && by * per_block < N);
}
