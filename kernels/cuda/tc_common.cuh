// Helpers of the tensor-core chunk kernels (chunk_prep.cu, chunk_state.cu): tile loaders,
// bf16 hi + lo splitting and split matmuls on wmma fragments.
#pragma once
#include <cuda_bf16.h>
#include <mma.h>

#include "common.cuh"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define CH 64
#define THREADS 256
#define AP 68  // fp32 [64, 64] tiles, padded
#define TP 72  // bf16 [64, 64] tiles, padded

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> FragAT;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBT;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

__device__ __forceinline__ int round16(int x) { return (x + 15) / 16 * 16; }

// x ≈ hi + lo with both halves bf16.
__device__ __forceinline__ void split(float x, bf16& hi, bf16& lo) {
  hi = __float2bfloat16(x);
  lo = __float2bfloat16(x - __bfloat162float(hi));
}

// x into hi[i], and its remainder into lo[i] when lo is non-null.
__device__ __forceinline__ void put(float x, bf16* hi, bf16* lo, int i) {
  if (lo)
    split(x, hi[i], lo[i]);
  else
    hi[i] = __float2bfloat16(x);
}

// Whether inputs of type T need a lo half (and so whether the kernels split their operands).
template <typename T>
struct Split {
  static constexpr bool value = true;
};
template <>
struct Split<bf16> {
  static constexpr bool value = false;
};

// A loader callback writing 8 values into a bf16 tile (hi) and, when lo is non-null, their
// remainders.
__device__ __forceinline__ auto to_tile(bf16* hi, bf16* lo, int ld) {
  return [=](int r, int cc, const float* x) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (lo)
        split(x[e], hi[r * ld + cc + e], lo[r * ld + cc + e]);
      else
        hi[r * ld + cc + e] = __float2bfloat16(x[e]);
    }
  };
}


// Bump allocator over dynamic shared memory; every buffer starts 128-byte aligned (wmma needs 32).
struct Smem {
  unsigned char* p;
  template <typename T>
  __device__ T* take(int n) {
    T* r = reinterpret_cast<T*>(p);
    p += ((size_t)n * sizeof(T) + 127) / 128 * 128;
    return r;
  }
};

// Eight consecutive elements as floats (zeros where !ok or past `valid` columns).
__device__ __forceinline__ void load8(float* v, const bf16* p, bool ok, int valid, bool vec) {
  if (ok && vec && valid >= 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      v[2 * e] = f.x;
      v[2 * e + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = (ok && e < valid) ? __bfloat162float(p[e]) : 0.0f;
  }
}
__device__ __forceinline__ void load8(float* v, const float* p, bool ok, int valid, bool vec) {
  if (ok && vec && valid >= 8) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = (ok && e < valid) ? p[e] : 0.0f;
  }
}

// Visits an [R, W16] block of a row-major matrix (row r at base + r·stride) in groups of 8
// columns, calling f(r, c, v[8]); values are zero in rows ≥ L and columns ≥ W. The loads of
// four groups per thread are issued before any is used, so they overlap in flight.
template <typename TI, typename F>
__device__ __forceinline__ void for_rows8(const TI* base, size_t stride, int R, int L, int W, int W16, F f) {
  const int gpr = W16 / 8, ng = R * gpr;
  const bool vec = W % 8 == 0 && stride % 8 == 0 && (reinterpret_cast<uintptr_t>(base) % 16) == 0;
  for (int g0 = 0; g0 < ng; g0 += 4 * THREADS) {
    float v[4][8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = g0 + threadIdx.x + j * THREADS;
      const int r = i / gpr, c = (i % gpr) * 8;
      load8(v[j], base + (size_t)r * stride + c, i < ng && r < L, W - c, vec);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = g0 + threadIdx.x + j * THREADS;
      if (i < ng) f(i / gpr, (i % gpr) * 8, v[j]);
    }
  }
}

// Stores a warp's 16×16 fp32 accumulator into rows (< L) and columns (< cmax) of a row-major
// matrix (row r at dst + r·stride).
__device__ void store_tile(float* stage, const FragC& acc, float* dst, size_t stride, int L, int r0, int c0, int cmax) {
  const int lane = threadIdx.x & 31;
  wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 256; e += 32) {
    const int r = r0 + e / 16, c = c0 + e % 16;
    if (r < L && c < cmax) dst[r * stride + c] = stage[e];
  }
  __syncwarp();
}

// acc += (a_hi + a_lo)(b_hi + b_lo) without the lo·lo term; null lo pointers are skipped.
template <typename FA, typename FB>
__device__ __forceinline__ void mma_split(FragC& acc, const bf16* a_hi, const bf16* a_lo, int lda, const bf16* b_hi,
                                          const bf16* b_lo, int ldb) {
  FA ah;
  FB bh;
  wmma::load_matrix_sync(ah, a_hi, lda);
  wmma::load_matrix_sync(bh, b_hi, ldb);
  wmma::mma_sync(acc, ah, bh, acc);
  if (a_lo) {
    FA al;
    wmma::load_matrix_sync(al, a_lo, lda);
    wmma::mma_sync(acc, al, bh, acc);
  }
  if (b_lo) {
    FB bl;
    wmma::load_matrix_sync(bl, b_lo, ldb);
    wmma::mma_sync(acc, ah, bl, acc);
  }
}


// Asks L2 to fetch L rows of `bytes` bytes each, `stride` bytes apart (one prefetch per
// 128-byte line, spread over the block's threads).
__device__ __forceinline__ void prefetch_rows_l2(const void* base, size_t stride, int L, int bytes) {
  const int lines = (bytes + 127) / 128;
  for (int i = threadIdx.x; i < L * lines; i += THREADS) {
    const char* p = reinterpret_cast<const char*>(base) + (i / lines) * stride + (i % lines) * 128;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  }
}
