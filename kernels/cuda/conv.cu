// Causal depthwise conv1d + SiLU over [q | k | v] projections (model-spec.md §1.3 step 2).
// Layouts: x [rows, C] token-major in the activation dtype T, row stride ldx (a column slice
// of the fused input projection is read in place); y [rows, C] contiguous, f32 or (prefill,
// `_narrow`) in T as fla's conv outputs it for a bf16 mixer; weight [C, W]
// f32 (tap W-1 multiplies the current token); conv state per slot [C, W] f32, the last W raw
// inputs, oldest first. Accumulation is fp32.
#include "common.cuh"
#include "dtype.cuh"

#define MAX_W 8

// Prefill outputs of S packed sequences: sequence s owns rows [cu[s], cu[s+1]) and continues
// the conv state of slot slots[s]. Grid (ceil(C/(CH·blockDim)), ceil(rows/ROWS)): a thread
// takes CH adjacent channels (one 8- or 16-byte access a row when CH > 1: the launcher checks
// C, ldx and the alignment) over ROWS rows, whose loads it issues together. States are only
// read here (conv_state_* writes them, after every read of the old ones). WC: the width when
// fixed at compile time (0: W ≤ MAX_W at run time). A fixed width turns the window's shifts
// into register renames; with a run-time one every element pays MAX_W compares and selects,
// which made the kernel instruction-bound.
template <typename T, typename TO, int CH, int ROWS, int WC>
__device__ void conv_prefill(const T* __restrict__ x, long ldx, const float* __restrict__ weight,
                             const float* __restrict__ states, const int* __restrict__ cu,
                             const int* __restrict__ slots, int S, TO* __restrict__ y, int rows, int C, int W_,
                             int silu) {
  constexpr int MW = WC ? WC : MAX_W;
  const int W = WC ? WC : W_;
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * CH;
  const int r0 = blockIdx.y * ROWS;
  if (c0 >= C || r0 >= rows) return;
  const int n = min(ROWS, rows - r0);
  float xs[ROWS][CH];
#pragma unroll
  for (int j = 0; j < ROWS; ++j) {
    if (j < n) load_vec<CH>(xs[j], x + (size_t)(r0 + j) * ldx + c0);
  }
  // The rows before r0 from x too, at rows clamped to 0, issued with the tile's own: whether
  // they or the slot's state hold the window is known only once cu has arrived, and loading
  // them after that cost a second round trip to memory a thread.
  float xw[MW - 1][CH];
#pragma unroll
  for (int i = 0; i < MW - 1; ++i) {
    if (i < W - 1) load_vec<CH>(xw[i], x + (size_t)max(r0 - (W - 1) + i, 0) * ldx + c0);
  }
  float w[CH][MW];
#pragma unroll
  for (int k = 0; k < CH; ++k)
#pragma unroll
    for (int i = 0; i < MW; ++i) w[k][i] = i < W ? weight[(c0 + k) * W + i] : 0.0f;
  int s = seq_of_row(cu, S, r0);
  int next = cu[s + 1];  // the first row of the next sequence
  // win[k][i] = input of row t-(W-1)+i while computing row t. Rows before the sequence's first
  // come from its slot's state (row cu[s]-j is state entry W-j); rows before r0 of the same
  // sequence from x.
  float win[CH][MW];
  {
    const int t0 = cu[s];
    const float* st = states + (size_t)slots[s] * C * W + (size_t)c0 * W;
#pragma unroll
    for (int i = 0; i < MW - 1; ++i) {
      const int tau = r0 - (W - 1) + i;
      if (i < W - 1) {
        if (tau >= t0) {
#pragma unroll
          for (int k = 0; k < CH; ++k) win[k][i] = xw[i][k];
        } else {
#pragma unroll
          for (int k = 0; k < CH; ++k) win[k][i] = st[k * W + W - (t0 - tau)];
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < ROWS; ++j) {
    if (j < n) {
      const int t = r0 + j;
      if (t >= next) {
        // A new sequence starts at row t: its earlier inputs are all in its state.
        do ++s;
        while (t >= cu[s + 1]);
        next = cu[s + 1];
        const float* st = states + (size_t)slots[s] * C * W + (size_t)c0 * W;
#pragma unroll
        for (int k = 0; k < CH; ++k)
#pragma unroll
          for (int i = 0; i < MW - 1; ++i)
            if (i < W - 1) win[k][i] = st[k * W + i + 1];
      }
      float out[CH];
#pragma unroll
      for (int k = 0; k < CH; ++k) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < MW; ++i) {
          if (i == W - 1) win[k][i] = xs[j][k];  // compile-time indices keep win in registers
          if (i < W) acc += w[k][i] * win[k][i];
        }
        out[k] = silu ? ds_silu(acc) : acc;
#pragma unroll
        for (int i = 0; i < MW - 1; ++i)
          if (i < W - 1) win[k][i] = win[k][i + 1];
      }
      store_vec<CH>(y + (size_t)t * C + c0, out);
    }
  }
}

// The conv states after the prefill: slot slots[s] keeps the last W inputs of sequence s,
// taking the older ones from its previous state when the sequence is shorter than W. Grid
// (ceil(C/blockDim), S).
template <typename T>
__device__ void conv_state(const T* __restrict__ x, long ldx, float* __restrict__ states, const int* __restrict__ cu,
                           const int* __restrict__ slots, int C, int W) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  const int s = blockIdx.y;
  if (ch >= C) return;
  const int t0 = cu[s], t1 = cu[s + 1], len = t1 - t0;
  // An empty sequence keeps its state (and may be an unused entry of a fixed-size table).
  if (len == 0) return;
  float* st = states + (size_t)slots[s] * C * W + (size_t)ch * W;
  float next[MAX_W];
#pragma unroll
  for (int i = 0; i < MAX_W; ++i) {
    if (i < W) {
      const int tau = t1 - W + i;
      next[i] = tau >= t0 ? to_f32(x[(size_t)tau * ldx + ch]) : st[len + i];
    }
  }
#pragma unroll
  for (int i = 0; i < MAX_W; ++i)
    if (i < W) st[i] = next[i];
}

// One decode step for B sequences: row b shifts x[b] into the state of slot b in place.
template <typename T>
__device__ void conv_step(const T* __restrict__ x, long ldx, const float* __restrict__ weight,
                          float* __restrict__ states, const SlotList& slots, const int* __restrict__ more_slots,
                          float* __restrict__ y, int C, int W, int silu) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  const int b = blockIdx.y;
  if (ch >= C) return;
  float* st = states + (size_t)slot_of(slots, more_slots, b) * C * W + (size_t)ch * W;
  const float xt = to_f32(x[(size_t)b * ldx + ch]);
  // fla's width 4 with aligned rows: the window, the weights and the new window as one 16-byte
  // access each (the loop below: eight 4-byte loads and four stores a channel, adjacent
  // threads 16 bytes apart). The same arithmetic in the same order.
  if (W == 4 && ((reinterpret_cast<uintptr_t>(st) | reinterpret_cast<uintptr_t>(weight)) & 15) == 0) {
    // The window's load and store marked streaming (evict first), as the recurrent state's in
    // gated_delta.cu: read once and written once a step (the Qwen3.5 layout's batch-64 step
    // ~0.2% faster on the H200).
    const float4 s = __ldcs(reinterpret_cast<const float4*>(st));
    const float4 w = *reinterpret_cast<const float4*>(weight + (size_t)ch * 4);
    const float4 v = make_float4(s.y, s.z, s.w, xt);
    __stcs(reinterpret_cast<float4*>(st), v);
    float acc = 0.0f;
    acc += w.x * v.x;
    acc += w.y * v.y;
    acc += w.z * v.z;
    acc += w.w * v.w;
    y[(size_t)b * C + ch] = silu ? ds_silu(acc) : acc;
    return;
  }
  // Every load before the first store (indices clamped into the window, not branched around):
  // a loop that loads, stores and loads again waits a round trip to memory a tap.
  float sv[MAX_W], wv[MAX_W];
#pragma unroll
  for (int i = 0; i < MAX_W; ++i) {
    sv[i] = st[min(i + 1, W - 1)];
    wv[i] = weight[ch * W + min(i, W - 1)];
  }
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < MAX_W; ++i) {
    if (i < W) {
      const float v = i + 1 < W ? sv[i] : xt;
      st[i] = v;
      acc += wv[i] * v;
    }
  }
  y[(size_t)b * C + ch] = silu ? ds_silu(acc) : acc;
}

// conv_prefill_{dtype}: a channel a thread over 32 rows; _x4: four channels over 16 rows;
// _w4: conv width 4 (fla's default) fixed at compile time.
#define CONV_PREFILL_ENTRY(T, TO, NAME, CH, ROWS, WC)                                                              \
  extern "C" __global__ void conv_prefill_##NAME(const T* x, long ldx, const float* weight, const float* states,   \
                                                 const int* cu, const int* slots, int S, TO* y, int rows, int C,    \
                                                 int W, int silu) { pdl_entry();                                                \
    conv_prefill<T, TO, CH, ROWS, WC>(x, ldx, weight, states, cu, slots, S, y, rows, C, W, silu);                  \
  }
#define CONV_PREFILL_ENTRIES(T, TO, NAME, SUFFIX)                                                                    \
  CONV_PREFILL_ENTRY(T, TO, NAME##SUFFIX, 1, 32, 0)                                                                  \
  CONV_PREFILL_ENTRY(T, TO, NAME##_w4##SUFFIX, 1, 32, 4)                                                             \
  CONV_PREFILL_ENTRY(T, TO, NAME##_x4##SUFFIX, 4, 16, 0)                                                             \
  CONV_PREFILL_ENTRY(T, TO, NAME##_x4_w4##SUFFIX, 4, 16, 4)
#define CONV_ENTRIES(T, NAME)                                                                                        \
  CONV_PREFILL_ENTRIES(T, float, NAME, )                                                                             \
  extern "C" __global__ void conv_state_##NAME(const T* x, long ldx, float* states, const int* cu, const int* slots, \
                                               int C, int W) { pdl_entry();                                                       \
    conv_state<T>(x, ldx, states, cu, slots, C, W);                                                                  \
  }                                                                                                                  \
  extern "C" __global__ void conv_step_##NAME(const T* x, long ldx, const float* weight, float* states,              \
                                              SlotList slots, const int* more_slots, float* y, int C, int W,         \
                                              int silu) { pdl_entry();                                                            \
    conv_step<T>(x, ldx, weight, states, slots, more_slots, y, C, W, silu);                                          \
  }
CONV_ENTRIES(float, f32)
CONV_ENTRIES(__nv_bfloat16, bf16)
CONV_ENTRIES(__half, f16)
CONV_PREFILL_ENTRIES(__nv_bfloat16, __nv_bfloat16, bf16, _narrow)
