// RMSNorms: the mixer output's fused gated norm (model-spec.md §1.3 step 9), fp32:
// y = x / sqrt(mean(x²) + eps) · w · act(z), act = swish (z·sigmoid z) or sigmoid; and the
// blocks' residual add + norm (below).
#include "norm.cuh"

// x [rows, D] in TX (f32, or the bf16 mixer's bf16), y [rows, D] in TY; one warp per row
// (norm.cuh). z (TZ, or null) holds `heads` rows of x in each of its rows (row stride ldz): row
// r's gate is z[(r / heads)·ldz + (r % heads)·D ..], so a column slice of the input projection is
// read in place.
template <int KEPT, typename TZ, typename TY, typename TX>
__device__ void gated_rms_norm(const TX* __restrict__ x, const TZ* __restrict__ z, long ldz, int heads,
                               const float* __restrict__ w, TY* __restrict__ y, int rows, int D, float eps,
                               int act_sigmoid) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const TZ* zr = z ? z + (size_t)(row / heads) * ldz + (size_t)(row % heads) * D : nullptr;
  gated_norm_row<KEPT, TZ, TY>(x + (size_t)row * D, zr, w, y + (size_t)row * D, D, eps, act_sigmoid, threadIdx.x & 31);
}

// gated_rms_norm_{x: "" for f32, xbf16_}{z dtype}_{y dtype}: rows up to 512 wide read once (a
// decode step's few rows, where a row's latency is the cost); _lean: two elements a lane kept
// (prefill's many rows, where occupancy is); _k4 / _k8: four or eight kept, so that prefill's
// rows of 128 or 256 are read once too (with two kept, a 128-wide row took three round trips to
// memory). The same results.
#define GATED_NORM_ENTRY(TX, XN, TZ, ZN, TY, YN, SUFFIX, KEPT)                                                       \
  extern "C" __global__ void gated_rms_norm_##XN##ZN##_##YN##SUFFIX(const TX* x, const TZ* z, long ldz, int heads,   \
                                                                    const float* w, TY* y, int rows, int D,          \
                                                                    float eps, int act_sigmoid, int early) {         \
    pdl_entry();                                                                                                      \
    if (early) pdl_trigger();                                                                                         \
    gated_rms_norm<KEPT, TZ, TY>(x, z, ldz, heads, w, y, rows, D, eps, act_sigmoid);                                  \
  }
#define GATED_NORM(TX, XN, TZ, ZN, TY, YN)                  \
  GATED_NORM_ENTRY(TX, XN, TZ, ZN, TY, YN, , 16)            \
  GATED_NORM_ENTRY(TX, XN, TZ, ZN, TY, YN, _lean, 2)        \
  GATED_NORM_ENTRY(TX, XN, TZ, ZN, TY, YN, _k4, 4)          \
  GATED_NORM_ENTRY(TX, XN, TZ, ZN, TY, YN, _k8, 8)
#define GATED_NORMS(TX, XN, TZ, ZN)                 \
  GATED_NORM(TX, XN, TZ, ZN, float, f32)            \
  GATED_NORM(TX, XN, TZ, ZN, __nv_bfloat16, bf16)   \
  GATED_NORM(TX, XN, TZ, ZN, __half, f16)
GATED_NORMS(float, , float, f32)
GATED_NORMS(float, , __nv_bfloat16, bf16)
GATED_NORMS(float, , __half, f16)
GATED_NORMS(__nv_bfloat16, xbf16_, float, f32)
GATED_NORMS(__nv_bfloat16, xbf16_, __nv_bfloat16, bf16)
GATED_NORMS(__nv_bfloat16, xbf16_, __half, f16)

// The seam between two pre-norm sub-blocks (fla's fused add + RMSNorm, §1.3 "Block"), one CTA
// of 256 threads per row:
//   r = h + delta (fp32; delta in the compute dtype T, or null), x = r / sqrt(mean(r²) + eps) · w
// rounded to T. h, r [rows, D] f32; delta, x [rows, D] T; w [D] f32. Each thread keeps its first
// PER elements of r (i = tid, tid + 256, ...) in registers while the block sums; any beyond
// (D > 256·PER) it reads back.
//
// PARTS: delta is instead `parts` (at most PARTS_MAX) f32 slices [parts][rows][D] (`slice`
// elements apart) of a split-K GEMM, summed here in slice order and rounded to T as the GEMM's
// reduce would have stored them.
#define PARTS_MAX 8
template <typename T, int PER, bool PRELOAD_W, bool PARTS>
__device__ void add_rms_norm(const float* __restrict__ h, const T* __restrict__ delta, const float* __restrict__ pd,
                             int parts, size_t slice, const float* __restrict__ w, float* __restrict__ r,
                             T* __restrict__ x, int D, float eps) {
  __shared__ float part[8];
  const size_t row = blockIdx.x;
  const float* hr = h + row * D;
  float* rr = r + row * D;
  const int stride = blockDim.x;
  float kept[PER], wk[PER];
  float ss = 0.0f;
  // The first PER elements unrolled: their loads (and with PRELOAD_W the norm weight's) all
  // issued before any is used, at indices clamped into the row rather than behind branches (a
  // load behind a branch waits for the use of the one before it); any further ones after.
  T draw[PER];
  float psum[PARTS ? PER : 1];
#pragma unroll
  for (int e = 0; e < PER; ++e) {
    const int i = min(threadIdx.x + e * stride, D - 1);
    if (PRELOAD_W) wk[e] = w[i];
    kept[e] = hr[i];
    if constexpr (PARTS) {
      psum[e] = pd[row * D + i];
    } else {
      if (delta) draw[e] = delta[row * D + i];
    }
  }
  if constexpr (PARTS) {
    // Every slice's loads issued before the first add (one round trip to memory, not one a
    // slice), then added in slice order.
    float more[PER][PARTS_MAX - 1];
#pragma unroll
    for (int k = 1; k < PARTS_MAX; ++k) {
#pragma unroll
      for (int e = 0; e < PER; ++e)
        if (k < parts) more[e][k - 1] = pd[k * slice + row * D + min(threadIdx.x + e * stride, D - 1)];
    }
#pragma unroll
    for (int k = 1; k < PARTS_MAX; ++k) {
#pragma unroll
      for (int e = 0; e < PER; ++e)
        if (k < parts) psum[e] += more[e][k - 1];
    }
  }
#pragma unroll
  for (int e = 0; e < PER; ++e) {
    const int i = threadIdx.x + e * stride;
    if (i < D) {
      if constexpr (PARTS) {
        kept[e] += to_f32(from_f32<T>(psum[e]));
      } else {
        kept[e] += delta ? to_f32(draw[e]) : 0.0f;
      }
      rr[i] = kept[e];
      ss += kept[e] * kept[e];
    } else {
      kept[e] = 0.0f;
      wk[e] = 0.0f;
    }
  }
  for (int i = threadIdx.x + PER * stride; i < D; i += stride) {
    float d = 0.0f;
    if constexpr (PARTS) {
      float sum = pd[row * D + i];
      for (int k = 1; k < parts; ++k) sum += pd[k * slice + row * D + i];
      d = to_f32(from_f32<T>(sum));
    } else {
      d = delta ? to_f32(delta[row * D + i]) : 0.0f;
    }
    const float v = hr[i] + d;
    rr[i] = v;
    ss += v * v;
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) total += part[i];
  const float inv = rsqrtf(total / D + eps);
#pragma unroll
  for (int e = 0; e < PER; ++e) {
    const int i = threadIdx.x + e * stride;
    if (i < D) x[row * D + i] = from_f32<T>(kept[e] * inv * (PRELOAD_W ? wk[e] : w[i]));
  }
  // Each thread reads back only the r elements it wrote itself.
  for (int i = threadIdx.x + PER * stride; i < D; i += stride) x[row * D + i] = from_f32<T>(rr[i] * inv * w[i]);
}

// add_rms_norm_{dtype}: the norm weight loaded with r, before the block's sum (a decode step's
// few rows: one round trip to memory fewer); _lean: after it (prefill's many rows: fewer
// registers); _p8: eight elements a thread with the weight loaded with them, prefill's rows up
// to 2,048 wide in one round trip at the lean variant's registers (with 16 a thread, a
// 2,048-wide row's last eight loads only repeated the row's last element). The same results.
// add_rms_norm_parts_{dtype}[_lean]: delta as a split-K GEMM's f32 slices (PARTS above).
#define ADD_RMS_NORM(T, NAME)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) add_rms_norm_##NAME(const float* h, const T* delta, const float* w, \
                                                                        float* r, T* x, int D, float eps, int early) { pdl_entry(); if (early) pdl_trigger();         \
    add_rms_norm<T, 16, true, false>(h, delta, nullptr, 0, 0, w, r, x, D, eps);                                      \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(256) add_rms_norm_##NAME##_lean(const float* h, const T* delta,       \
                                                                              const float* w, float* r, T* x, int D,  \
                                                                              float eps, int early) { pdl_entry(); if (early) pdl_trigger();                            \
    add_rms_norm<T, 16, false, false>(h, delta, nullptr, 0, 0, w, r, x, D, eps);                                     \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(256) add_rms_norm_##NAME##_p8(const float* h, const T* delta,         \
                                                                            const float* w, float* r, T* x, int D,    \
                                                                            float eps, int early) { pdl_entry(); if (early) pdl_trigger();                 \
    add_rms_norm<T, 8, true, false>(h, delta, nullptr, 0, 0, w, r, x, D, eps);                                       \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(256) add_rms_norm_parts_##NAME(                                      \
      const float* h, const float* parts, int S, long slice, const float* w, float* r, T* x, int D, float eps,      \
      int early) {                                                                                                 \
    pdl_entry();                                                                                                   \
    if (early) pdl_trigger();                                                                                      \
    add_rms_norm<T, 8, true, true>(h, nullptr, parts, S, (size_t)slice, w, r, x, D, eps);                         \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(256) add_rms_norm_parts_##NAME##_lean(                               \
      const float* h, const float* parts, int S, long slice, const float* w, float* r, T* x, int D, float eps,      \
      int early) {                                                                                                 \
    pdl_entry();                                                                                                   \
    if (early) pdl_trigger();                                                                                      \
    add_rms_norm<T, 8, false, true>(h, nullptr, parts, S, (size_t)slice, w, r, x, D, eps);                        \
  }
ADD_RMS_NORM(float, f32)
ADD_RMS_NORM(__nv_bfloat16, bf16)
ADD_RMS_NORM(__half, f16)
