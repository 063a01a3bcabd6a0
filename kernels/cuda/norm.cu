// Fused gated RMSNorm of the mixer output (model-spec.md §1.3 step 9), fp32:
// y = x / sqrt(mean(x²) + eps) · w · act(z), act = swish (z·sigmoid z) or sigmoid.
#include "common.cuh"

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
