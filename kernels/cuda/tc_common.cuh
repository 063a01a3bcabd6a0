// Helpers of the tensor-core chunk kernels (chunk_prep.cu, chunk_mma.cu): tile loaders, bf16
// hi + lo splitting and split matmuls on wmma fragments.
#pragma once
#include <cuda_bf16.h>
#include <mma.h>

#include <type_traits>

#include "common.cuh"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define CH 64
#define THREADS 256
#define AP 72  // fp32 [64, 64] tiles, padded (two bf16 [64, TP] tiles fit in one)
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

// Eight values to p, 16-byte aligned: two float4 stores, or one of eight bf16.
__device__ __forceinline__ void store8(float* p, const float* x) {
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
}
__device__ __forceinline__ void store8(bf16* p, const float* x) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = __floats2bfloat162_rn(x[2 * e], x[2 * e + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// Eight values as bf16 to hi and, when lo is non-null, their remainders x − hi to lo (both
// 16-byte aligned).
__device__ __forceinline__ void store8_split(bf16* hi, bf16* lo, const float* x) {
  store8(hi, x);
  if (lo) {
    float rem[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) rem[e] = x[e] - __bfloat162float(__float2bfloat16(x[e]));
    store8(lo, rem);
  }
}

// A loader callback writing 8 values into a bf16 tile (hi) and, when lo is non-null, their
// remainders; tile pitches are multiples of 8, so each group is one 16-byte store.
__device__ __forceinline__ auto to_tile(bf16* hi, bf16* lo, int ld) {
  return [=](int r, int cc, const float* x) { store8_split(hi + r * ld + cc, lo ? lo + r * ld + cc : nullptr, x); };
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

// x stored as T (float, or rounded to bf16).
__device__ __forceinline__ void store_as(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_as(bf16* p, float x) { *p = __float2bfloat16(x); }

// Stores a warp's 16×16 fp32 accumulator into rows (< L) and columns (< cmax) of a row-major
// matrix (row r at dst + r·stride): each lane writes eight consecutive values of one row. With
// bf16 `dst` and a non-null `lo`, the remainders x − bf16(x) go to the same place in lo.
template <typename TO>
__device__ void store_tile(float* stage, const FragC& acc, TO* dst, size_t stride, int L, int r0, int c0, int cmax,
                           bf16* lo = nullptr) {
  const int lane = threadIdx.x & 31;
  wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
  __syncwarp();
  const int r = r0 + lane / 2, c = c0 + (lane % 2) * 8;
  const float* x = stage + (lane / 2) * 16 + (lane % 2) * 8;
  const size_t at = r * stride + c;
  TO* p = dst + at;
  if (r < L) {
    if (c + 8 <= cmax && reinterpret_cast<uintptr_t>(p) % 16 == 0) {
      if constexpr (std::is_same<TO, bf16>::value) {
        store8_split(p, lo ? lo + at : nullptr, x);
      } else {
        store8(p, x);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (c + e < cmax) {
          store_as(p + e, x[e]);
          if (lo) lo[at + e] = __float2bfloat16(x[e] - __bfloat162float(__float2bfloat16(x[e])));
        }
    }
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


typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> FragA32;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> FragB32;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> FragC32;

// x ≈ hi + lo, both tf32, in place on a fragment (hi) and its copy (lo).
template <typename F>
__device__ __forceinline__ void split_tf32(F& hi, F& lo) {
#pragma unroll
  for (int e = 0; e < hi.num_elements; ++e) {
    const float x = hi.x[e];
    hi.x[e] = wmma::__float_to_tf32(x);
    lo.x[e] = wmma::__float_to_tf32(x - hi.x[e]);
  }
}

// acc += a b for fp32 16×16 row-major tiles in shared memory, on the tensor cores as three
// tf32 products (hi·hi + hi·lo + lo·hi): close to an fp32 product.
__device__ __forceinline__ void mma_3xtf32(FragC32& acc, const float* a, int lda, const float* b, int ldb) {
#pragma unroll
  for (int kk = 0; kk < 16; kk += 8) {
    FragA32 ah, al;
    FragB32 bh, bl;
    wmma::load_matrix_sync(ah, a + kk, lda);
    wmma::load_matrix_sync(bh, b + kk * ldb, ldb);
    split_tf32(ah, al);
    split_tf32(bh, bl);
    wmma::mma_sync(acc, al, bh, acc);
    wmma::mma_sync(acc, ah, bl, acc);
    wmma::mma_sync(acc, ah, bh, acc);
  }
}
__device__ __forceinline__ void mma_3xtf32(FragC32& acc, const float* a, const float* b, int ld) { mma_3xtf32(acc, a, ld, b, ld); }

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes global → shared, zero-filled when !ok.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0)
               : "memory");
}
// 4 bytes global → shared.
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// tile_async's cp.async path, for sources known to be 16-byte aligned (rows, stride and W
// multiples of 8 elements; callers that check that once a pass call it directly): with the
// width W16C a compile-time constant, each thread keeps one column group and walks its rows RS
// apart, so a copy costs a pointer add instead of an index division and a 64-bit multiply
// (and, where ld is a constant too, its shared address is an immediate offset from the first).
template <int R, int W16C>
__device__ __forceinline__ void tile_rows(bf16* dst, int ld, const bf16* src, size_t stride, int L, int W) {
  constexpr int G = W16C / 8, RS = THREADS / G, ITEMS = (R + RS - 1) / RS;
  static_assert(W16C % 8 == 0 && THREADS % G == 0, "whole column groups, every thread one of them");
  const int c = (threadIdx.x % G) * 8, r0 = threadIdx.x / G;
  const bool cok = c < W;
  const bf16* p = src + (size_t)r0 * stride + c;
  const size_t step = (size_t)RS * stride;
  const unsigned d = smem_addr(dst + r0 * ld + c);
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int r = r0 + j * RS;
    const bool ok = cok && r < L;
    if (R % RS == 0 || r < R)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + j * RS * ld * 2), "l"(ok ? p : src),
                   "r"(ok ? 16 : 0)
                   : "memory");
    p += step;
  }
}

// An [R, W16] bf16 tile (row r of the source at src + r·stride; zeros in rows ≥ L and columns
// ≥ W) into shared memory with row pitch ld: by cp.async when rows are 16-byte aligned, else
// by plain loads (the caller synchronises before use either way). With W16 a template
// argument the index arithmetic is shifts and the loop unrolls; W16C = 0 takes it at run time.
template <int R, int W16C>
__device__ __forceinline__ void tile_async(bf16* dst, int ld, const bf16* src, size_t stride, int L, int W, int w16 = W16C) {
  const int W16 = W16C > 0 ? W16C : w16;
  const int GPR = W16 / 8, N = R * GPR;
  if (W % 8 == 0 && stride % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    if constexpr (W16C > 0 && THREADS % (W16C > 0 ? W16C / 8 : 1) == 0) {
      tile_rows<R, W16C>(dst, ld, src, stride, L, W);
    } else {
#pragma unroll 4
      for (int i0 = 0; i0 < N; i0 += THREADS) {
        const int i = i0 + threadIdx.x;
        if (i0 + THREADS <= N || i < N) {
          const int r = i / GPR, c = (i % GPR) * 8;
          const bool ok = r < L && c < W;
          cp_async16(dst + r * ld + c, ok ? src + r * stride + c : src, ok);
        }
      }
    }
  } else {
    for (int i = threadIdx.x; i < R * W16; i += THREADS) {
      const int r = i / W16, c = i % W16;
      dst[r * ld + c] = (r < L && c < W) ? src[(size_t)r * stride + c] : __float2bfloat16(0.0f);
    }
  }
}

// Asks L2 for rows [0, L) of `bytes` (≤ MAXB) bytes each, `stride` bytes apart.
template <int MAXB>
__device__ __forceinline__ void prefetch_l2(const void* base, size_t stride, int L, int bytes) {
  constexpr int LINES = (MAXB + 127) / 128;
  for (int i = threadIdx.x; i < L * LINES; i += THREADS) {
    const int r = i / LINES, line = i % LINES;
    if (line * 128 < bytes) {
      const char* p = reinterpret_cast<const char*>(base) + r * stride + line * 128;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
  }
}


