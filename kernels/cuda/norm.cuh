// One row of the mixer's gated output RMSNorm (model-spec.md §1.3 step 9), shared by norm.cu
// and gemv_staged.cu so that the two agree bit for bit: a warp a row of D,
// y = x / sqrt(mean(x²) + eps) · w · act(z), act = swish (z·sigmoid z) or sigmoid, in fp32.
#pragma once
#include "common.cuh"
#include "dtype.cuh"

// Lane `lane` takes i = lane, lane + 32, ... and sums their squares in that order. x, z and w of
// its first KEPT elements are loaded together up front (a row up to 32 · KEPT wide costs one
// round trip to memory, not one per element); any beyond are read again for the output. KEPT
// changes registers, not results. zr may be null.
template <int KEPT, typename TZ, typename TY>
__device__ __forceinline__ void gated_norm_row(const float* __restrict__ xr, const TZ* __restrict__ zr,
                                               const float* __restrict__ w, TY* __restrict__ yr, int D, float eps,
                                               int act_sigmoid, int lane) {
  float xv[KEPT], zv[KEPT], wv[KEPT];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < KEPT; ++j) {
    const int i = lane + 32 * j;
    xv[j] = 0.0f;
    zv[j] = 0.0f;
    wv[j] = 0.0f;
    if (i < D) {
      xv[j] = xr[i];
      wv[j] = w[i];
      if (zr) zv[j] = to_f32(zr[i]);
    }
  }
#pragma unroll
  for (int j = 0; j < KEPT; ++j) ss += xv[j] * xv[j];
  for (int i = lane + 32 * KEPT; i < D; i += 32) ss += xr[i] * xr[i];
  const float inv = rsqrtf(warp_sum(ss) / D + eps);
  auto out = [&](int i, float x, float wi, float zi) {
    float v = x * inv * wi;
    if (zr) v *= act_sigmoid ? ds_sigmoid(zi) : ds_silu(zi);
    yr[i] = from_f32<TY>(v);
  };
#pragma unroll
  for (int j = 0; j < KEPT; ++j)
    if (lane + 32 * j < D) out(lane + 32 * j, xv[j], wv[j], zv[j]);
  for (int i = lane + 32 * KEPT; i < D; i += 32) out(i, xr[i], w[i], zr ? to_f32(zr[i]) : 0.0f);
}
