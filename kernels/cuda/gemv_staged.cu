// A decode step's projection with the RMSNorm before it folded in (the block seam's residual
// add + norm, the mixer's gated output norm): every block first forms the step's normalised
// rows of x in shared memory, then streams its rows of W as gemv.cu does. One launch and one
// round trip of x fewer per norm; each norm of a decode step was a latency-bound launch of its
// own. The prologues compute what norm.cu's kernels compute, in the same order, so y equals
// their output fed to gemv.cu bit for bit.
#include "gemv.cuh"
#include "norm.cuh"

// NB rows of x, [NB, K] in T, formed by the prologue in dynamic shared memory.
template <typename T>
struct StagedRows {
  const T* x;
  int K;
  __device__ __forceinline__ void load(float (&d)[8], int b, int k) const { load_vec<8>(d, x + (size_t)b * K + k); }
  __device__ __forceinline__ void skip(int) {}
};

extern __shared__ __align__(16) unsigned char gemv_stage[];

// N elements of row b of r = h + delta (fp32) at i0, i0 + 256, ...; zero past K. Every load is
// issued before any is used, at indices clamped into the row rather than behind branches (a load
// behind a branch waits for the use of the one before it: a round trip to memory an element).
template <typename T, int N>
__device__ __forceinline__ void residual_group(float (&v)[N], const float* __restrict__ h, const T* __restrict__ delta,
                                               int b, int K, int i0) {
  T d[N];
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const size_t at = (size_t)b * K + min(i0 + e * 256, K - 1);
    v[e] = h[at];
    if (delta) d[e] = delta[at];
  }
#pragma unroll
  for (int e = 0; e < N; ++e) v[e] = i0 + e * 256 < K ? v[e] + (delta ? to_f32(d[e]) : 0.0f) : 0.0f;
}

// Elements a thread of a staged prologue handles together past its kept ones.
#define STAGE_GROUP 4

// add_rms_norm's arithmetic (norm.cu: a row over 256 threads, thread t summing r² over
// i = t, t + 256, ... in order, then the warp, then the 8 warps in order): r = h + delta in fp32,
// x = r / sqrt(mean(r²) + eps) · nw rounded to T. h [NB, K] f32, delta [NB, K] T (or null);
// writes r [NB, K] when `write_r` (one block column does). With two rows a thread keeps its
// first KEEP elements of r, and of nw, in registers from one round of loads (both rows' h and
// delta and the norm weight issued together) until x is formed after the block's sum: one round
// trip to L2 before the block's first load of W where K ≤ 256 · KEEP (three before: a row's
// loads after the other's use, nw's after the sum; batch-2 steps 8% faster,
// benches/results/h200-seam_prologue-2026-11-30/). One row keeps none: its kernel's grid is a
// full wave of blocks, and the registers cost it a block an SM (the Qwen3.5 layout's batch-1
// step 1.54 → 1.59 ms; held at six by its launch bounds it spilled, ±1%). Two or more rows take
// the rest in groups of STAGE_GROUP (residual_group); one row reads them one by one, which was
// faster there (H200, batch-1 steps 1.23–1.24 against 1.26–1.28 ms).
template <typename T, int NB>
__device__ void stage_add_norm(const float* __restrict__ h, const T* __restrict__ delta, const float* __restrict__ nw,
                               float* __restrict__ r, T* xs, int K, float eps, bool write_r) {
  constexpr int KEEP = NB == 2 ? 8 : 0;
  constexpr int K1 = KEEP > 0 ? KEEP : 1;
  __shared__ float part[8][NB];
  const int tid = threadIdx.x;
  float ss[NB], kept[NB][K1], wk[K1];
  if constexpr (KEEP > 0) {
    // Every load issued before any use, at indices clamped into the row (residual_group's form).
    T draw[NB][K1];
#pragma unroll
    for (int e = 0; e < KEEP; ++e) wk[e] = nw[min(tid + e * 256, K - 1)];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int e = 0; e < KEEP; ++e) {
        const size_t at = (size_t)b * K + min(tid + e * 256, K - 1);
        kept[b][e] = h[at];
        if (delta) draw[b][e] = delta[at];
      }
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int e = 0; e < KEEP; ++e)
        kept[b][e] = tid + e * 256 < K ? kept[b][e] + (delta ? to_f32(draw[b][e]) : 0.0f) : 0.0f;
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    ss[b] = 0.0f;
#pragma unroll
    for (int e = 0; e < KEEP; ++e) ss[b] += kept[b][e] * kept[b][e];
    if constexpr (NB == 1) {
      for (int i = tid; i < K; i += 256) {
        const float v = h[i] + (delta ? to_f32(delta[i]) : 0.0f);
        ss[b] += v * v;
      }
    } else {
      for (int i0 = tid + KEEP * 256; i0 < K; i0 += STAGE_GROUP * 256) {
        float v[STAGE_GROUP];
        residual_group<T, STAGE_GROUP>(v, h, delta, b, K, i0);
#pragma unroll
        for (int e = 0; e < STAGE_GROUP; ++e)
          if (i0 + e * 256 < K) ss[b] += v[e] * v[e];
      }
    }
    ss[b] = warp_sum(ss[b]);
    if ((tid & 31) == 0) part[tid >> 5][b] = ss[b];
  }
  __syncthreads();
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    float total = 0.0f;
    for (int j = 0; j < 8; ++j) total += part[j][b];
    const float inv = rsqrtf(total / K + eps);
#pragma unroll
    for (int e = 0; e < KEEP; ++e) {
      const int i = tid + e * 256;
      if (i < K) {
        const size_t at = (size_t)b * K + i;
        if (write_r) r[at] = kept[b][e];
        xs[at] = from_f32<T>(kept[b][e] * inv * wk[e]);
      }
    }
    if constexpr (NB == 1) {
      for (int i = tid; i < K; i += 256) {
        const float v = h[i] + (delta ? to_f32(delta[i]) : 0.0f);
        if (write_r) r[i] = v;
        xs[i] = from_f32<T>(v * inv * nw[i]);
      }
      continue;
    }
    for (int i0 = tid + KEEP * 256; i0 < K; i0 += STAGE_GROUP * 256) {
      float v[STAGE_GROUP], wv[STAGE_GROUP];
      residual_group<T, STAGE_GROUP>(v, h, delta, b, K, i0);
#pragma unroll
      for (int e = 0; e < STAGE_GROUP; ++e) wv[e] = nw[min(i0 + e * 256, K - 1)];
#pragma unroll
      for (int e = 0; e < STAGE_GROUP; ++e) {
        const int i = i0 + e * 256;
        if (i < K) {
          const size_t at = (size_t)b * K + i;
          if (write_r) r[at] = v[e];
          xs[at] = from_f32<T>(v[e] * inv * wv[e]);
        }
      }
    }
  }
  __syncthreads();
}

// gated_rms_norm's arithmetic (norm.cuh's gated_norm_row, a warp a head row; few elements kept
// in registers, which the GEMV after it needs for its occupancy): o [NB·heads, Vd] f32, gate z (T, or null) with `heads` rows of o in each of its rows
// (row stride ldz), x = o / sqrt(mean(o²) + eps) · nw · act(z) rounded to T, [NB, heads·Vd].
template <typename T, int NB>
__device__ void stage_gated_norm(const float* __restrict__ o, const T* __restrict__ z, long ldz, int heads,
                                 const float* __restrict__ nw, T* xs, int Vd, float eps, int act_sigmoid) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int row = warp; row < NB * heads; row += 8) {
    const T* zr = z ? z + (size_t)(row / heads) * ldz + (size_t)(row % heads) * Vd : nullptr;
    gated_norm_row<2, T, T>(o + (size_t)row * Vd, zr, nw, xs + (size_t)row * Vd, Vd, eps, act_sigmoid, lane);
  }
  __syncthreads();
}

// stage_gated_norm for at most eight head rows of Vd = 32 · C (a warp a row): each lane loads
// its C elements of o, the gate and the norm weight at once, so the prologue is one round trip
// to L2 where gated_norm_row's groups take one each (the 1.39B's 6 heads of 512: seven). The
// squares are summed and the outputs formed as gated_norm_row sums and forms them, so the bits
// are the same. Warps past the rows wait at the barrier.
template <typename T, int NB, int C>
__device__ void stage_gated_norm_once(const float* __restrict__ o, const T* __restrict__ z, long ldz, int heads,
                                      const float* __restrict__ nw, T* xs, float eps, int act_sigmoid) {
  constexpr int Vd = 32 * C;
  const int row = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (row < NB * heads) {
    const T* zr = z ? z + (size_t)(row / heads) * ldz + (size_t)(row % heads) * Vd : nullptr;
    const float* xr = o + (size_t)row * Vd;
    float xv[C], wv[C];
    T zraw[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      xv[j] = xr[lane + 32 * j];
      wv[j] = nw[lane + 32 * j];
      if (zr) zraw[j] = zr[lane + 32 * j];
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < C; ++j) ss += xv[j] * xv[j];
    const float inv = rsqrtf(warp_sum(ss) / Vd + eps);
#pragma unroll
    for (int j = 0; j < C; ++j) {
      float v = xv[j] * inv * wv[j];
      if (zr) {
        const float zi = to_f32(zraw[j]);
        v *= act_sigmoid ? ds_sigmoid(zi) : ds_silu(zi);
      }
      xs[(size_t)row * Vd + lane + 32 * j] = from_f32<T>(v);
    }
  }
  __syncthreads();
}

// A decode step's short conv (conv.cu's conv_step at width 4, fla's) on the projection's
// first C output rows, [q | k | v]: the lane r · NB + b of the warp that stores rows n0, n0 + 1
// shifts y[b][n0 + r], rounded to T as the GEMV stores it, into the conv state of its slot and
// writes the conv's output, with conv_step's arithmetic in its order. The window and the conv's
// weights are copied into shared memory (cp.async) before the warp's loads of W, so their round
// trip hides under them without holding registers. One launch a layer fewer, and the conv's
// input is never read back.
struct ConvFold : RowsInOrder {
  const float* weight;  // [C, 4]
  float* states;        // [slots, C, 4]
  int slot;             // of this lane's row of x
  float* cy;            // [B, C]
  int C, silu;

  // This lane's window and weights: [warp][lane][window, weights].
  template <int NB>
  __device__ __forceinline__ static float4* staged(int lane) {
    __shared__ __align__(16) float4 fold[8][GEMV_ROWS * NB][2];
    return fold[threadIdx.x >> 5][lane];
  }
  __device__ __forceinline__ float* state(int n) const { return states + (size_t)slot * C * 4 + (size_t)n * 4; }

  template <int NB>
  __device__ __forceinline__ void prefetch(int n0, int, int lane) const {
    const int n = n0 + lane / NB;
    if (lane < GEMV_ROWS * NB && n < C) {
      float4* d = staged<NB>(lane);
      asm volatile(
          "cp.async.ca.shared.global [%0], [%1], 16;\n"
          "cp.async.ca.shared.global [%2], [%3], 16;\n"
          "cp.async.commit_group;\n" ::"r"((unsigned)__cvta_generic_to_shared(d)),
          "l"(state(n)), "r"((unsigned)__cvta_generic_to_shared(d + 1)), "l"(weight + (size_t)n * 4)
          : "memory");
    }
  }

  template <typename T, int NB>
  __device__ __forceinline__ void finish(const float (&acc)[GEMV_ROWS][NB], int n0, int b0, int lane) const {
    const int n = n0 + lane / NB;
    if (lane >= GEMV_ROWS * NB || n >= C) return;
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
      for (int b = 0; b < NB; ++b)
        if (lane == r * NB + b) mine = acc[r][b];
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    const float4* d = staged<NB>(lane);
    const float4 win = d[0], wt = d[1];
    const float4 v = make_float4(win.y, win.z, win.w, to_f32(from_f32<T>(mine)));
    *reinterpret_cast<float4*>(state(n)) = v;
    float c = 0.0f;
    c += wt.x * v.x;
    c += wt.y * v.y;
    c += wt.z * v.z;
    c += wt.w * v.w;
    cy[(size_t)(b0 + lane % NB) * C + n] = silu ? ds_silu(c) : c;
  }
};

// SwiGLU on the fused [gate | up] projection's output inside it (one row of x): a column block
// of P = 8 / splits row slots takes gate rows P·by .. P·by + P − 1 in its first P / 2 slots and
// the up rows I + P·by .. in the rest, so each gate value meets its up value in the block. Each
// finished row is rounded to T as the projection would store it and put in shared memory; after
// the block's barrier, `store` writes x = silu(gate) · up rounded to T (swiglu.cu's arithmetic:
// the bits SwigluRows forms from the stored projection). Needs I a multiple of P and splits ≤ 4.
struct SwigluPairs {
  int I, P;
  static constexpr bool stores_y = false;
  __device__ __forceinline__ static float* vals() {
    __shared__ float v[2][8];
    return &v[0][0];
  }
  __device__ __forceinline__ int first_row(int by, int q, int) const {
    const int half = P / 2;
    return q < half ? P * by + GEMV_ROWS * q : I + P * by + GEMV_ROWS * (q - half);
  }
  template <int NB>
  __device__ __forceinline__ void prefetch(int, int, int) const {}
  template <typename T, int NB>
  __device__ __forceinline__ void finish(const float (&acc)[GEMV_ROWS][NB], int n0, int, int lane) const {
    static_assert(NB == 1, "one row of x");
    const int up = n0 >= I, local = (up ? n0 - I : n0) % P;
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; ++r) vals()[up * 8 + local + r] = to_f32(from_f32<T>(acc[r][0]));
  }
  // After the block's barrier: x[P·by + i] for i < P.
  template <typename T>
  __device__ __forceinline__ void store(T* x, int by) const {
    const int i = threadIdx.x;
    if (i < P) x[P * by + i] = from_f32<T>(ds_silu(vals()[i]) * vals()[8 + i]);
  }
};

// add_norm_gemv_{dtype}_b{NB}: y = norm(h + delta) Wᵀ and r = h + delta (written by the blocks
// of column 0). gated_norm_gemv_{dtype}_b{NB}: y = gated_norm(o, z) Wᵀ, K = heads · Vd.
// One group of NB rows (gridDim.x = 1); dynamic shared memory NB · K elements of T.
#define STAGED_GEMV_ENTRY(T, NAME, NB)                                                                                 \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      add_norm_gemv_##NAME##_b##NB(const float* h, const T* delta, const float* nw, float eps, float* r, const T* w,  \
                                   T* y, int N, int K, int splits) { pdl_entry();                                                 \
    T* xs = reinterpret_cast<T*>(gemv_stage);                                                                   \
    stage_add_norm<T, NB>(h, delta, nw, r, xs, K, eps, blockIdx.y == 0);                                             \
    gemv<T, NB, (NB > 1)>(StagedRows<T>{xs, K}, w, y, N, K, splits);                                                           \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      add_norm_gemv_conv_##NAME##_b##NB(const float* h, const T* delta, const float* nw, float eps, float* r,         \
                                        const float* cw, float* states, SlotList slots, const int* more_slots,        \
                                        float* cy, int C, int silu, const T* w, T* y, int N, int K, int splits) {     \
    pdl_entry();                                                                                                     \
    T* xs = reinterpret_cast<T*>(gemv_stage);                                                                        \
    stage_add_norm<T, NB>(h, delta, nw, r, xs, K, eps, blockIdx.y == 0);                                             \
    const int slot = slot_of(slots, more_slots, blockIdx.x * NB + (threadIdx.x & 31) % NB);                          \
    gemv<T, NB, (NB > 1)>(StagedRows<T>{xs, K}, w, y, N, K, splits,                                                  \
                          ConvFold{{}, cw, states, slot, cy, C, silu});                                 \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      gated_norm_gemv_##NAME##_b##NB(const float* o, const T* z, long ldz, int heads, const float* nw, float eps,    \
                                     int act_sigmoid, const T* w, T* y, int N, int K, int splits) { pdl_entry();                  \
    T* xs = reinterpret_cast<T*>(gemv_stage);                                                                   \
    stage_gated_norm<T, NB>(o, z, ldz, heads, nw, xs, K / heads, eps, act_sigmoid);                                  \
    gemv<T, NB, (NB > 1)>(StagedRows<T>{xs, K}, w, y, N, K, splits);                                                           \
  }
#define STAGED_GEMV_ENTRIES(T, NAME) FOR_EACH_GEMV_BATCH(STAGED_GEMV_ENTRY, T, NAME)
STAGED_GEMV_ENTRIES(__nv_bfloat16, bf16)
STAGED_GEMV_ENTRIES(__half, f16)

// add_norm_gemv_swiglu_{dtype}_b1: x = silu(g) · u for [g | u] = norm(h + delta) Wᵀ with W the
// fused [gate | up] projection (I rows each, N = 2I), and r = h + delta; x [1, I].
#define SWIGLU_PAIRS_ENTRY(T, NAME)                                                                               \
  extern "C" __global__ void __launch_bounds__(256)                                                             \
      add_norm_gemv_swiglu_##NAME##_b1(const float* h, const T* delta, const float* nw, float eps, float* r,      \
                                       int I, const T* w, T* x, int N, int K, int splits) {                       \
    pdl_entry();                                                                                                \
    T* xs = reinterpret_cast<T*>(gemv_stage);                                                                   \
    stage_add_norm<T, 1>(h, delta, nw, r, xs, K, eps, blockIdx.y == 0);                                         \
    const SwigluPairs pairs{I, 8 / splits};                                                                     \
    gemv<T, 1>(StagedRows<T>{xs, K}, w, x, N, K, splits, pairs);                                                \
    __syncthreads();                                                                                            \
    pairs.store<T>(x, blockIdx.y);                                                                              \
  }
SWIGLU_PAIRS_ENTRY(__nv_bfloat16, bf16)
SWIGLU_PAIRS_ENTRY(__half, f16)

// gated_norm_gemv_v{Vd}_{dtype}_b{NB}: gated_norm_gemv for NB · heads ≤ 8 head rows of Vd = 128,
// 256 or 512, its prologue stage_gated_norm_once.
#define GATED_ONCE_ENTRY(T, NAME, NB, VD)                                                                            \
  extern "C" __global__ void __launch_bounds__(256)                                                                \
      gated_norm_gemv_v##VD##_##NAME##_b##NB(const float* o, const T* z, long ldz, int heads, const float* nw,        \
                                            float eps, int act_sigmoid, const T* w, T* y, int N, int K, int splits) { \
    pdl_entry();                                                                                                   \
    T* xs = reinterpret_cast<T*>(gemv_stage);                                                                      \
    stage_gated_norm_once<T, NB, (VD) / 32>(o, z, ldz, heads, nw, xs, eps, act_sigmoid);                           \
    gemv<T, NB, (NB > 1)>(StagedRows<T>{xs, K}, w, y, N, K, splits);                                                       \
  }
#define GATED_ONCE_ENTRIES(T, NAME) \
  GATED_ONCE_ENTRY(T, NAME, 1, 128) \
  GATED_ONCE_ENTRY(T, NAME, 1, 256) \
  GATED_ONCE_ENTRY(T, NAME, 1, 512) \
  GATED_ONCE_ENTRY(T, NAME, 2, 128) \
  GATED_ONCE_ENTRY(T, NAME, 2, 256) \
  GATED_ONCE_ENTRY(T, NAME, 2, 512)
GATED_ONCE_ENTRIES(__nv_bfloat16, bf16)
GATED_ONCE_ENTRIES(__half, f16)

// add_norm_gemv_f32y_{dtype}_b{NB}: add_norm_gemv with y stored as f32 (each value rounded to T
// first): a decode step's final norm and LM head, the logits written where the sampler reads
// them. The add + norm fuses at most two rows (ops::ADD_NORM_LINEAR_MAX_ROWS).
#define STAGED_F32Y_ENTRY(T, NAME, NB)                                                                        \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      add_norm_gemv_f32y_##NAME##_b##NB(const float* h, const T* delta, const float* nw, float eps, float* r, \
                                        const T* w, float* y, int N, int K, int splits) {                     \
    pdl_entry();                                                                                             \
    T* xs = reinterpret_cast<T*>(gemv_stage);                                                                \
    stage_add_norm<T, NB>(h, delta, nw, r, xs, K, eps, blockIdx.y == 0);                                     \
    gemv<T, NB, (NB > 1)>(StagedRows<T>{xs, K}, w, y, N, K, splits);                                         \
  }
STAGED_F32Y_ENTRY(__nv_bfloat16, bf16, 1)
STAGED_F32Y_ENTRY(__nv_bfloat16, bf16, 2)
STAGED_F32Y_ENTRY(__half, f16, 1)
STAGED_F32Y_ENTRY(__half, f16, 2)
