// Loads and stores of the activation dtypes (f32, bf16, f16) through fp32 registers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

template <typename T>
__device__ __forceinline__ float to_f32(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T from_f32(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return v;
}

// N consecutive elements as one aligned access (8 or 16 bytes), converted through fp32.
template <int N, typename T>
struct alignas(N * sizeof(T)) Packed {
  T v[N];
};
template <int N, typename T>
__device__ __forceinline__ void load_vec(float (&d)[N], const T* p) {
  const Packed<N, T> x = *reinterpret_cast<const Packed<N, T>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) d[i] = to_f32(x.v[i]);
}
template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&d)[N]) {
  Packed<N, T> x;
#pragma unroll
  for (int i = 0; i < N; ++i) x.v[i] = from_f32<T>(d[i]);
  *reinterpret_cast<Packed<N, T>*>(p) = x;
}
