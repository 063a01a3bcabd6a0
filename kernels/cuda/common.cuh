// Shared helpers for deltaserve's kernels. All state and accumulation is fp32.
#pragma once
#include <stdint.h>

// The fast reciprocal (two instructions, ~2 ulp) rather than IEEE division (a dozen and a
// branch): elementwise kernels that apply it to every element were instruction-bound on it.
// For x → -∞ the denominator overflows to +∞ and the result is 0, as it should be.
__device__ __forceinline__ float ds_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
__device__ __forceinline__ float ds_silu(float x) { return x * ds_sigmoid(x); }
// PyTorch's softplus with threshold 20 (fla's gate matches it).
__device__ __forceinline__ float ds_softplus(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Decode steps take up to INLINE_SLOTS slot indices by value (no upload for small batches), or
// all of them from device memory when `rest` is set (larger batches, CUDA graphs).
#define INLINE_SLOTS 64
struct SlotList {
  int s[INLINE_SLOTS];
};
__device__ __forceinline__ int slot_of(const SlotList& inl, const int* __restrict__ rest, int b) {
  return rest ? rest[b] : inl.s[b];
}
