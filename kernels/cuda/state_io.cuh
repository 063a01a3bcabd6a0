// The recurrent state's element type in memory: f32 (the reference's), or bf16 (`--state-dtype
// bf16`: half the bytes a step, rounded to nearest on every store; the kernels compute in f32
// either way). N consecutive elements (N = 1, 2 or 4, one access of 4·N or 2·N bytes, aligned
// by the caller) to and from f32 registers; CS marks the accesses streaming (evict first), as the
// decode step's are: each element is read and written once a step.
#pragma once
#include <cuda_bf16.h>

#include <type_traits>

template <bool CS, typename X>
__device__ __forceinline__ X state_ld(const X* p) {
  if constexpr (CS) return __ldcs(p);
  else return *p;
}
template <bool CS, typename X>
__device__ __forceinline__ void state_st(X* p, X v) {
  if constexpr (CS) __stcs(p, v);
  else *p = v;
}

__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
// Two floats as bf16 (round to nearest even), the first in the low half.
__device__ __forceinline__ unsigned bf16_pair(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}

template <int N, bool CS, typename TS>
__device__ __forceinline__ void state_load(float (&d)[N], const TS* p) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "1, 2, 4 or 8 elements");
  if constexpr (N == 8 && std::is_same_v<TS, float>) {
    float a[4], b[4];
    state_load<4, CS>(a, p);
    state_load<4, CS>(b, p + 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = a[i], d[4 + i] = b[i];
  } else if constexpr (std::is_same_v<TS, float>) {
    if constexpr (N == 4) {
      const float4 x = state_ld<CS>(reinterpret_cast<const float4*>(p));
      d[0] = x.x, d[1] = x.y, d[2] = x.z, d[3] = x.w;
    } else if constexpr (N == 2) {
      const float2 x = state_ld<CS>(reinterpret_cast<const float2*>(p));
      d[0] = x.x, d[1] = x.y;
    } else {
      d[0] = state_ld<CS>(p);
    }
  } else {
    static_assert(std::is_same_v<TS, __nv_bfloat16>, "f32 or bf16 states");
    if constexpr (N == 8) {
      const uint4 x = state_ld<CS>(reinterpret_cast<const uint4*>(p));
      const unsigned w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) d[2 * i] = bf16_lo(w[i]), d[2 * i + 1] = bf16_hi(w[i]);
    } else if constexpr (N == 4) {
      const uint2 x = state_ld<CS>(reinterpret_cast<const uint2*>(p));
      d[0] = bf16_lo(x.x), d[1] = bf16_hi(x.x), d[2] = bf16_lo(x.y), d[3] = bf16_hi(x.y);
    } else if constexpr (N == 2) {
      const unsigned x = state_ld<CS>(reinterpret_cast<const unsigned*>(p));
      d[0] = bf16_lo(x), d[1] = bf16_hi(x);
    } else {
      d[0] = bf16_lo(state_ld<CS>(reinterpret_cast<const unsigned short*>(p)));
    }
  }
}

template <int N, bool CS, typename TS>
__device__ __forceinline__ void state_store(TS* p, const float (&x)[N]) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "1, 2, 4 or 8 elements");
  if constexpr (N == 8 && std::is_same_v<TS, float>) {
    state_st<CS>(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
    state_st<CS>(reinterpret_cast<float4*>(p + 4), make_float4(x[4], x[5], x[6], x[7]));
  } else if constexpr (std::is_same_v<TS, float>) {
    if constexpr (N == 4) {
      state_st<CS>(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
    } else if constexpr (N == 2) {
      state_st<CS>(reinterpret_cast<float2*>(p), make_float2(x[0], x[1]));
    } else {
      state_st<CS>(p, x[0]);
    }
  } else {
    if constexpr (N == 8) {
      state_st<CS>(reinterpret_cast<uint4*>(p), make_uint4(bf16_pair(x[0], x[1]), bf16_pair(x[2], x[3]),
                                                           bf16_pair(x[4], x[5]), bf16_pair(x[6], x[7])));
    } else if constexpr (N == 4) {
      state_st<CS>(reinterpret_cast<uint2*>(p), make_uint2(bf16_pair(x[0], x[1]), bf16_pair(x[2], x[3])));
    } else if constexpr (N == 2) {
      state_st<CS>(reinterpret_cast<unsigned*>(p), bf16_pair(x[0], x[1]));
    } else {
      const __nv_bfloat16 h = __float2bfloat16_rn(x[0]);
      state_st<CS>(reinterpret_cast<unsigned short*>(p), *reinterpret_cast<const unsigned short*>(&h));
    }
  }
}

// N bf16 state elements as their bits, two a word (the low half first): loaded and stored as
// they lie in memory, unpacked where used. A load whose value is used at once inside a branch
// waits for memory before the next branch's load is issued; bits kept as loaded are not used
// until every row's load is in flight, and take half the registers of f32 values.
template <int N>
struct Bf16Raw {
  unsigned w[(N + 1) / 2];
};

template <int N, bool CS>
__device__ __forceinline__ void load_raw(Bf16Raw<N>& r, const __nv_bfloat16* p) {
  if constexpr (N == 8) {
    const uint4 x = state_ld<CS>(reinterpret_cast<const uint4*>(p));
    r.w[0] = x.x, r.w[1] = x.y, r.w[2] = x.z, r.w[3] = x.w;
  } else if constexpr (N == 4) {
    const uint2 x = state_ld<CS>(reinterpret_cast<const uint2*>(p));
    r.w[0] = x.x, r.w[1] = x.y;
  } else if constexpr (N == 2) {
    r.w[0] = state_ld<CS>(reinterpret_cast<const unsigned*>(p));
  } else {
    r.w[0] = state_ld<CS>(reinterpret_cast<const unsigned short*>(p));
  }
}

template <int N, bool CS>
__device__ __forceinline__ void store_raw(__nv_bfloat16* p, const Bf16Raw<N>& r) {
  if constexpr (N == 8) {
    state_st<CS>(reinterpret_cast<uint4*>(p), make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]));
  } else if constexpr (N == 4) {
    state_st<CS>(reinterpret_cast<uint2*>(p), make_uint2(r.w[0], r.w[1]));
  } else if constexpr (N == 2) {
    state_st<CS>(reinterpret_cast<unsigned*>(p), r.w[0]);
  } else {
    state_st<CS>(reinterpret_cast<unsigned short*>(p), (unsigned short)r.w[0]);
  }
}

// Element i of the bits, as f32.
template <int N>
__device__ __forceinline__ float raw_at(const Bf16Raw<N>& r, int i) {
  return (i & 1) ? bf16_hi(r.w[i / 2]) : bf16_lo(r.w[i / 2]);
}

template <int N>
__device__ __forceinline__ void unpack(float (&d)[N], const Bf16Raw<N>& r) {
#pragma unroll
  for (int i = 0; i < N; ++i) d[i] = raw_at(r, i);
}

// N f32 values rounded to bf16 (to nearest even) as bits.
template <int N>
__device__ __forceinline__ void pack(Bf16Raw<N>& r, const float (&x)[N]) {
  if constexpr (N == 1) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x[0]);
    r.w[0] = *reinterpret_cast<const unsigned short*>(&h);
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) r.w[i] = bf16_pair(x[2 * i], x[2 * i + 1]);
  }
}
