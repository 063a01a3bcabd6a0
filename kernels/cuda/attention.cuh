// What the paged-attention kernels share (attention.cu: append, rows, combine;
// attention_tiles.cu and attention_wg.cu: prefill on the tensor cores): where a key position's
// row lies in a cache buffer of blocks [block_size, HKV, hd], found through the sequence's row of
// the block table; the tensor-core kernels' softmax step.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <cstddef>

// Offset (in elements) of key position `pos`'s [HKV, hd] row in a cache buffer.
__device__ __forceinline__ size_t kv_offset(const int* __restrict__ table, int pos, int bs, int row) {
  return ((size_t)table[pos / bs] * bs + pos % bs) * row;
}

// Two fp32 values as one register of two T (x in the low half: the lower column), rounded to
// nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float x, float y) {
  __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// The tensor-core prefill kernels' online softmax over one 64-key tile, for a warp's 16 query
// rows in the mma fragment layout: s[4j + e] is row g + 8·(e / 2) against key kt + 8j + 2·i4 +
// e % 2 (lane 4g + i4). Both kernels take these two steps, so that they give a row the same bits.
struct TileRows {
  int qpos[2];   // the lane's two rows' positions
  bool live[2];  // whether each is a row of the tile (not past its count)
  int i4, window;
  float sl2;  // the scale in log2 units: exp(x·scale) = 2^(x·sl2)
};
// 2^x by the multi-function unit alone: exp2f's own instruction, without the scaling exp2f
// wraps around it for results below 2^-126 (here flushed to zero; a probability that small is
// zero in bf16's and f16's sums anyway).
__device__ __forceinline__ float tile_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Masks (causal, window, rows not live) unless the tile is `whole`, scales, and updates each
// row's running max m and this lane's share of its sum l; gives the output rows' factor corr and
// the new max m_new.
__device__ __forceinline__ void tile_softmax_max(float (&s)[32], bool whole, int kt, const TileRows& r, float (&m)[2],
                                                 float (&l)[2], float (&corr)[2], float (&m_new)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
  if (whole) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[4 * j + e] *= r.sl2;
        mx[e / 2] = fmaxf(mx[e / 2], s[4 * j + e]);
      }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hr = e / 2, kpos = kt + 8 * j + 2 * r.i4 + e % 2;
        const bool ok = r.live[hr] && kpos <= r.qpos[hr] && (r.window <= 0 || kpos > r.qpos[hr] - r.window);
        s[4 * j + e] = ok ? s[4 * j + e] * r.sl2 : -INFINITY;
        mx[hr] = fmaxf(mx[hr], s[4 * j + e]);
      }
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
    m_new[hr] = fmaxf(m[hr], mx[hr]);
    corr[hr] = m_new[hr] == -INFINITY ? 1.0f : tile_exp2(m[hr] - m_new[hr]);
    m[hr] = m_new[hr];
    l[hr] *= corr[hr];
  }
}
// The probabilities, added to l and packed as P·V's A operand (k-step kk: n8 blocks 2kk and
// 2kk + 1).
template <typename T>
__device__ __forceinline__ void tile_softmax_probs(const float (&s)[32], const float (&m_new)[2], float (&l)[2],
                                                   uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[e] = s[4 * j + e] == -INFINITY ? 0.0f : tile_exp2(s[4 * j + e] - m_new[e / 2]);
      l[e / 2] += p[e];
    }
    pa[j / 2][(j % 2) * 2] = pack2<T>(p[0], p[1]);
    pa[j / 2][(j % 2) * 2 + 1] = pack2<T>(p[2], p[3]);
  }
}
// Each row's sum over its lane quad (the four lanes' shares added in a fixed order), before the
// output rows are normalised.
__device__ __forceinline__ void tile_softmax_sums(float (&l)[2]) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
  }
}
