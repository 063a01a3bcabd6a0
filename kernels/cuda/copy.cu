// Many device-to-device copies (or zero fills) in one launch: a prefix-cache restore, a
// snapshot or a fork copies one slot of every layer's states, 2 × layers buffers, and a new
// sequence's slot is zeroed in each; one launch replaces a driver call for each (4–10 µs of
// host time apiece on the device host). The ranges travel by value in the launch parameters,
// so nothing is uploaded.
#include "common.cuh"
#include "dtype.cuh"

#define MAX_COPIES 64

struct Copies {
  unsigned long long src[MAX_COPIES];  // 0: fill with zeros
  unsigned long long dst[MAX_COPIES];
  unsigned long long words[MAX_COPIES];  // 32-bit words
};

// Grid (blocks a copy, copies): copy blockIdx.y, strided over its blocks' threads, 16 bytes a
// move when both ends are 16-byte aligned (the tail word by word).
extern "C" __global__ void copy_many(const Copies c) { pdl_entry();
  const int i = blockIdx.y;
  const unsigned* __restrict__ s = reinterpret_cast<const unsigned*>(c.src[i]);
  unsigned* __restrict__ d = reinterpret_cast<unsigned*>(c.dst[i]);
  const size_t n = c.words[i];
  const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  size_t done = 0;
  if (c.src[i] == 0) {
    if ((c.dst[i] & 15) == 0) {
      uint4* __restrict__ d4 = reinterpret_cast<uint4*>(d);
      for (size_t k = t; k < n / 4; k += stride) d4[k] = make_uint4(0, 0, 0, 0);
      done = n / 4 * 4;
    }
    for (size_t k = done + t; k < n; k += stride) d[k] = 0;
    return;
  }
  if (((c.src[i] | c.dst[i]) & 15) == 0) {
    const size_t n4 = n / 4;
    const uint4* __restrict__ s4 = reinterpret_cast<const uint4*>(s);
    uint4* __restrict__ d4 = reinterpret_cast<uint4*>(d);
    for (size_t k = t; k < n4; k += stride) d4[k] = s4[k];
    done = n4 * 4;
  }
  for (size_t k = done + t; k < n; k += stride) d[k] = s[k];
}

// x [n] in a 16-bit T → y [n] f32 (a bf16 model's logits for the sampler): 8 elements a thread
// a step, one 16-byte load and two 16-byte stores (n8 = n / 8 steps; the launcher checks that n
// is a multiple of 8 and both ends are aligned), grid-stride.
template <typename T>
__device__ void widen(const T* __restrict__ x, float* __restrict__ y, size_t n8) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
    float v[8];
    load_vec<8>(v, x + i * 8);
    *reinterpret_cast<float4*>(y + i * 8) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(y + i * 8 + 4) = make_float4(v[4], v[5], v[6], v[7]);
  }
}
extern "C" __global__ void widen_bf16_f32(const __nv_bfloat16* x, float* y, unsigned long long n8) { pdl_entry(); widen(x, y, n8); }
extern "C" __global__ void widen_f16_f32(const __half* x, float* y, unsigned long long n8) { pdl_entry(); widen(x, y, n8); }

// y [N, D] f32 = rows ids[n] of table [V, D] in a 16-bit T, widened (a step's embeddings: one
// launch where a gather and a cast were two). Grid (N, blocks a row); 8 elements a thread a step
// (d8 = D / 8; the launcher checks D and the table's address). The ids may be the previous
// kernel's output (a step fed on the device), so the gather waits for it.
template <typename T>
__device__ void embed(const unsigned* __restrict__ ids, const T* __restrict__ table, float* __restrict__ y, size_t d8) {
  const T* x = table + (size_t)ids[blockIdx.x] * d8 * 8;
  float* out = y + (size_t)blockIdx.x * d8 * 8;
  for (size_t i = (size_t)blockIdx.y * blockDim.x + threadIdx.x; i < d8; i += (size_t)gridDim.y * blockDim.x) {
    float v[8];
    load_vec<8>(v, x + i * 8);
    *reinterpret_cast<float4*>(out + i * 8) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(out + i * 8 + 4) = make_float4(v[4], v[5], v[6], v[7]);
  }
}
extern "C" __global__ void embed_bf16_f32(const unsigned* ids, const __nv_bfloat16* table, float* y, unsigned long long d8) { pdl_entry(); embed(ids, table, y, d8); }
extern "C" __global__ void embed_f16_f32(const unsigned* ids, const __half* table, float* y, unsigned long long d8) { pdl_entry(); embed(ids, table, y, d8); }

// How many of the n 32-bit words at a and b differ, added into *count (zeroed by the caller):
// the GEMM tuning's check that an algorithm gives the default's bits.
extern "C" __global__ void count_differing_words(const unsigned* __restrict__ a, const unsigned* __restrict__ b,
                                                 unsigned long long n, unsigned long long* count) {
  unsigned long long c = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) c += a[i] != b[i];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}
