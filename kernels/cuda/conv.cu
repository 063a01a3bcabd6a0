// Causal depthwise conv1d + SiLU over [q | k | v] projections (model-spec.md §1.3 step 2).
// Layouts: x, y [rows, C] token-major f32; weight [C, W] (tap W-1 multiplies the current
// token); conv state per slot [C, W], the last W raw inputs, oldest first.
#include "common.cuh"

#define MAX_W 8

// Prefill of S packed sequences: sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]) and
// slot slots[s]. One thread per (channel, sequence) walks the sequence with a register window,
// so the conv state is read once and written once.
extern "C" __global__ void conv_prefill_f32(const float* __restrict__ x, const float* __restrict__ weight,
                                            float* __restrict__ states, const int* __restrict__ cu_seqlens,
                                            const int* __restrict__ slots, float* __restrict__ y, int C, int W,
                                            int silu) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  const int s = blockIdx.y;
  if (ch >= C) return;
  float* st = states + (size_t)slots[s] * C * W + (size_t)ch * W;
  float win[MAX_W], w[MAX_W];
#pragma unroll
  for (int i = 0; i < MAX_W; ++i) {
    win[i] = i < W ? st[i] : 0.0f;
    w[i] = i < W ? weight[ch * W + i] : 0.0f;
  }
  const int t0 = cu_seqlens[s], t1 = cu_seqlens[s + 1];
  for (int t = t0; t < t1; ++t) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_W - 1; ++i)
      if (i < W - 1) win[i] = win[i + 1];
    const float xt = x[(size_t)t * C + ch];
#pragma unroll
    for (int i = 0; i < MAX_W; ++i) {
      if (i == W - 1) win[i] = xt;
      if (i < W) acc += w[i] * win[i];
    }
    y[(size_t)t * C + ch] = silu ? ds_silu(acc) : acc;
  }
#pragma unroll
  for (int i = 0; i < MAX_W; ++i)
    if (i < W) st[i] = win[i];
}

// One decode step for B sequences: row b shifts x[b] into the state of slot b in place.
extern "C" __global__ void conv_step_f32(const float* __restrict__ x, const float* __restrict__ weight,
                                         float* __restrict__ states, SlotList slots, const int* __restrict__ more_slots,
                                         float* __restrict__ y, int C, int W, int silu) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  const int b = blockIdx.y;
  if (ch >= C) return;
  float* st = states + (size_t)slot_of(slots, more_slots, b) * C * W + (size_t)ch * W;
  const float xt = x[(size_t)b * C + ch];
  float acc = 0.0f;
  for (int i = 0; i < W; ++i) {
    const float v = i + 1 < W ? st[i + 1] : xt;
    st[i] = v;
    acc += weight[ch * W + i] * v;
  }
  y[(size_t)b * C + ch] = silu ? ds_silu(acc) : acc;
}
