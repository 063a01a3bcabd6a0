// One row of the mixer's gated output RMSNorm (model-spec.md §1.3 step 9), shared by norm.cu
// and gemv_staged.cu so that the two agree bit for bit: a warp a row of D,
// y = x / sqrt(mean(x²) + eps) · w · act(z), act = swish (z·sigmoid z) or sigmoid, in fp32.
#pragma once
#include "common.cuh"
#include "dtype.cuh"

// Lane `lane` takes i = lane, lane + 32, ... and sums their squares in that order. x, z and w of
// its first KEPT elements are loaded together up front (a row up to 32 · KEPT wide costs one
// round trip to memory, not one per element); any beyond are read again for the output, in
// groups of GNR_GROUP. Every group's loads are issued before any of them is used, at addresses
// clamped into the row rather than behind branches (a load behind a branch waits for the use
// of the one before it: a round trip an element). KEPT changes registers, not results. zr may
// be null; x is f32, or bf16 (the bf16 mixer's output, as fla's layer norms it).
#define GNR_GROUP 4
template <int N, typename TZ, typename TX>
__device__ __forceinline__ void gnr_load(float (&xv)[N], float (&zv)[N], float (&wv)[N], const TX* __restrict__ xr,
                                         const TZ* __restrict__ zr, const float* __restrict__ w, int i0, int D) {
  TZ zraw[N];
  TX xraw[N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int i = min(i0 + 32 * j, D - 1);
    xraw[j] = xr[i];
    wv[j] = w[i];
    if (zr) zraw[j] = zr[i];
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const bool in = i0 + 32 * j < D;
    xv[j] = in ? to_f32(xraw[j]) : 0.0f;
    zv[j] = zr && in ? to_f32(zraw[j]) : 0.0f;
    wv[j] = in ? wv[j] : 0.0f;
  }
}
template <int KEPT, typename TZ, typename TY, typename TX>
__device__ __forceinline__ void gated_norm_row(const TX* __restrict__ xr, const TZ* __restrict__ zr,
                                               const float* __restrict__ w, TY* __restrict__ yr, int D, float eps,
                                               int act_sigmoid, int lane) {
  float xv[KEPT], zv[KEPT], wv[KEPT];
  gnr_load<KEPT, TZ>(xv, zv, wv, xr, zr, w, lane, D);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < KEPT; ++j) ss += xv[j] * xv[j];
  for (int i0 = lane + 32 * KEPT; i0 < D; i0 += 32 * GNR_GROUP) {
    float x[GNR_GROUP];
#pragma unroll
    for (int j = 0; j < GNR_GROUP; ++j) x[j] = to_f32(xr[min(i0 + 32 * j, D - 1)]);
#pragma unroll
    for (int j = 0; j < GNR_GROUP; ++j)
      if (i0 + 32 * j < D) ss += x[j] * x[j];
  }
  const float inv = rsqrtf(warp_sum(ss) / D + eps);
  auto out = [&](int i, float x, float wi, float zi) {
    float v = x * inv * wi;
    if (zr) v *= act_sigmoid ? ds_sigmoid(zi) : ds_silu(zi);
    yr[i] = from_f32<TY>(v);
  };
#pragma unroll
  for (int j = 0; j < KEPT; ++j)
    if (lane + 32 * j < D) out(lane + 32 * j, xv[j], wv[j], zv[j]);
  for (int i0 = lane + 32 * KEPT; i0 < D; i0 += 32 * GNR_GROUP) {
    float x[GNR_GROUP], z[GNR_GROUP], wg[GNR_GROUP];
    gnr_load<GNR_GROUP, TZ>(x, z, wg, xr, zr, w, i0, D);
#pragma unroll
    for (int j = 0; j < GNR_GROUP; ++j)
      if (i0 + 32 * j < D) out(i0 + 32 * j, x[j], wg[j], z[j]);
  }
}
