// RMSNorms: the mixer output's fused gated norm (model-spec.md §1.3 step 9), fp32:
// y = x / sqrt(mean(x²) + eps) · w · act(z), act = swish (z·sigmoid z) or sigmoid; and the
// blocks' residual add + norm (below).
#include "common.cuh"
#include "dtype.cuh"

// x, z, y [rows, D]; one warp per row.
extern "C" __global__ void gated_rms_norm_f32(const float* __restrict__ x, const float* __restrict__ z,
                                              const float* __restrict__ w, float* __restrict__ y, int rows, int D,
                                              float eps, int act_sigmoid) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + (size_t)row * D;
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) ss += xr[i] * xr[i];
  const float inv = rsqrtf(warp_sum(ss) / D + eps);
  for (int i = lane; i < D; i += 32) {
    float v = xr[i] * inv * w[i];
    if (z) {
      const float zi = z[(size_t)row * D + i];
      v *= act_sigmoid ? ds_sigmoid(zi) : ds_silu(zi);
    }
    y[(size_t)row * D + i] = v;
  }
}

// The seam between two pre-norm sub-blocks (fla's fused add + RMSNorm, §1.3 "Block"), one CTA
// of 256 threads per row:
//   r = h + delta (fp32; delta in the compute dtype T, or null), x = r / sqrt(mean(r²) + eps) · w
// rounded to T. h, r [rows, D] f32; delta, x [rows, D] T; w [D] f32.
template <typename T>
__device__ void add_rms_norm(const float* __restrict__ h, const T* __restrict__ delta, const float* __restrict__ w,
                             float* __restrict__ r, T* __restrict__ x, int D, float eps) {
  __shared__ float part[8];
  const size_t row = blockIdx.x;
  const float* hr = h + row * D;
  float* rr = r + row * D;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = hr[i] + (delta ? to_f32(delta[row * D + i]) : 0.0f);
    rr[i] = v;
    ss += v * v;
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) total += part[i];
  const float inv = rsqrtf(total / D + eps);
  // Each thread reads back only the r elements it wrote itself.
  for (int i = threadIdx.x; i < D; i += blockDim.x) x[row * D + i] = from_f32<T>(rr[i] * inv * w[i]);
}

#define ADD_RMS_NORM(T, NAME)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) add_rms_norm_##NAME(const float* h, const T* delta, const float* w, \
                                                                        float* r, T* x, int D, float eps) {         \
    add_rms_norm<T>(h, delta, w, r, x, D, eps);                                                                    \
  }
ADD_RMS_NORM(float, f32)
ADD_RMS_NORM(__nv_bfloat16, bf16)
ADD_RMS_NORM(__half, f16)
