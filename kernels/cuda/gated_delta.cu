// Decode steps of the gated delta rule (model-spec.md §1.3 step 8) on the state [HV, K, V] per
// slot, K-major, f32 or bf16 in memory (state_io.cuh), f32 in arithmetic. GVA: value head j
// reads q/k head j / (HV/H). Gated DeltaProduct's n householder steps per token run inside the
// kernel. (Prefill: chunk_prep.cu, then chunk_mma.cu.)
#include <cstddef>

#include "common.cuh"
#include "dtype.cuh"
#include "state_io.cuh"

// The recurrent state's loads and stores are marked streaming (evict first): each element is read
// once and written once a step, and a step's state (megabytes to gigabytes) only passes through
// L2. Against plain ones on the H200, batch-64 steps took 5–6% less on the 1.39B (K = 256) and
// ~1% less on the Qwen3.5 layout, most of it from the stores' hint
// (benches/results/h200-state_hints-2026-11-30/). The state is f32 or bf16 in memory (TS,
// state_io.cuh), f32 in registers.

// CW consecutive floats at p (columns col.. of a row of width V): one 8-, 16- or 32-byte access
// when VEC (V % 4 == 0 and aligned data), else element by element within the row; CS: p is the
// state (streaming accesses).
template <int CW, bool VEC, bool CS = false>
__device__ __forceinline__ void load_cols(float (&d)[CW], const float* p, int col, int V) {
  if constexpr (VEC && CW > 1) {
    if (col < V) {
      state_load<CW, CS>(d, p);
    } else {
#pragma unroll
      for (int c = 0; c < CW; ++c) d[c] = 0.0f;
    }
  } else {
#pragma unroll
    for (int c = 0; c < CW; ++c) d[c] = col + c < V ? state_ld<CS>(p + c) : 0.0f;
  }
}
template <int CW, bool VEC, bool CS = false>
__device__ __forceinline__ void store_cols(float* p, const float (&x)[CW], int col, int V) {
  if constexpr (VEC && CW > 1) {
    if (col < V) state_store<CW, CS>(p, x);
  } else {
#pragma unroll
    for (int c = 0; c < CW; ++c)
      if (col + c < V) state_st<CS>(p + c, x[c]);
  }
}

// This warp's state rows r0.. (R of them, up to RMAX), this lane's CW columns from col, into
// s; rows and columns past the head's K × V are zeros. For up to 8 values a lane (the small
// batches' shapes) every load is in flight at once: the addresses are clamped into the head (a
// row or column past its end reads the last one) and the values zeroed afterwards, because a
// load behind a branch waits for the one before it (a batch-1 step paid a round trip to memory
// a row). Larger tiles keep the branches: there the clamped addresses spilled registers, and
// the many blocks of a large batch hide the round trips (H200: batch 64 as fast either way).
template <int RMAX, int CW, bool VEC>
__device__ __forceinline__ void load_state(float (&s)[RMAX][CW], const float* S, int R, int r0, int K, int col, int V) {
  if constexpr (RMAX * CW > 8) {
#pragma unroll
    for (int r = 0; r < RMAX; ++r) {
      if (r < R && r0 + r < K) {
        load_cols<CW, VEC, true>(s[r], S + (size_t)(r0 + r) * V + col, col, V);
      } else {
#pragma unroll
        for (int c = 0; c < CW; ++c) s[r][c] = 0.0f;
      }
    }
    return;
  }
  const int vc = VEC ? min(col, V - CW) : col;
#pragma unroll
  for (int r = 0; r < RMAX; ++r) {
    const float* row = S + (size_t)min(r0 + r, K - 1) * V;
    if constexpr (VEC && CW > 1) {
      state_load<CW, true>(s[r], row + vc);
    } else {
#pragma unroll
      for (int c = 0; c < CW; ++c) {
        float one[1];
        state_load<1, true>(one, row + min(col + c, V - 1));
        s[r][c] = one[0];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
#pragma unroll
    for (int c = 0; c < CW; ++c)
      if (!(r < R && r0 + r < K && col + c < V)) s[r][c] = 0.0f;
}

// A lane's cells of the state in registers, RMAX rows of CW columns: f32 values for f32 states;
// for bf16 states their bits as they lie in memory (two a word), unpacked where read and rounded
// where written, so that a tile takes half the registers and twice the columns fit: the step is
// bound by the state's bytes in flight, which the registers hold. at(r, c) reads a cell, put(r,
// x) writes row r's, load and store_row move them to and from the state.
template <typename TS, int RMAX, int CW>
struct StateTile;

template <int RMAX, int CW>
struct StateTile<float, RMAX, CW> {
  float v[RMAX][CW];
  template <bool VEC>
  __device__ __forceinline__ void load(const float* S, int R, int r0, int K, int col, int V) {
    load_state<RMAX, CW, VEC>(v, S, R, r0, K, col, V);
  }
  __device__ __forceinline__ float at(int r, int c) const { return v[r][c]; }
  __device__ __forceinline__ void put(int r, const float (&x)[CW]) {
#pragma unroll
    for (int c = 0; c < CW; ++c) v[r][c] = x[c];
  }
  template <bool VEC>
  __device__ __forceinline__ void store_row(float* p, int r, int col, int V) const {
    store_cols<CW, VEC, true>(p, v[r], col, V);
  }
};

template <int RMAX, int CW>
struct StateTile<__nv_bfloat16, RMAX, CW> {
  Bf16Raw<CW> b[RMAX];
  // Every row's loads are issued at clamped addresses before any is used (no branches), then
  // the cells past the head's K rows or V columns are zeroed.
  template <bool VEC>
  __device__ __forceinline__ void load(const __nv_bfloat16* S, int R, int r0, int K, int col, int V) {
    if constexpr (VEC) {
      const int vc = min(col, V - CW);
#pragma unroll
      for (int r = 0; r < RMAX; ++r) load_raw<CW, true>(b[r], S + (size_t)min(r0 + r, K - 1) * V + vc);
#pragma unroll
      for (int r = 0; r < RMAX; ++r)
        if (!(r < R && r0 + r < K && col < V)) b[r] = Bf16Raw<CW>{};
    } else {
#pragma unroll
      for (int r = 0; r < RMAX; ++r) {
        float x[CW];
#pragma unroll
        for (int c = 0; c < CW; ++c) {
          float one[1] = {0.0f};
          if (r < R && r0 + r < K && col + c < V) state_load<1, true>(one, S + (size_t)(r0 + r) * V + col + c);
          x[c] = one[0];
        }
        pack(b[r], x);
      }
    }
  }
  __device__ __forceinline__ float at(int r, int c) const { return raw_at(b[r], c); }
  __device__ __forceinline__ void put(int r, const float (&x)[CW]) { pack(b[r], x); }
  template <bool VEC>
  __device__ __forceinline__ void store_row(__nv_bfloat16* p, int r, int col, int V) const {
    if constexpr (VEC) {
      if (col < V) store_raw<CW, true>(p, b[r]);
    } else {
#pragma unroll
      for (int c = 0; c < CW; ++c)
        if (col + c < V) state_store<1, true>(p + c, {at(r, c)});
    }
  }
};

// The step's products and sums are spelled as explicit fma / rounded multiplies: left to the
// compiler, their contraction into fma varied with the columns a lane (CW), so a sequence's
// state took other bits in a batch large enough for four columns a lane than alone.
//
// This warp's partial Σ_r s[r] · x[r0 + r] over its state rows, into red[warp][·][lane].
template <int NW, int RMAX, int CW, typename Tile>
__device__ __forceinline__ void rows_dot(float (*red)[CW][32], const Tile& s, const float* x, int R, int r0,
                                         int K, int warp, int lane) {
  float acc[CW] = {};
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) {
      const float xr = x[r0 + r];
#pragma unroll
      for (int c = 0; c < CW; ++c) acc[c] = __fmaf_rn(s.at(r, c), xr, acc[c]);
    }
#pragma unroll
  for (int c = 0; c < CW; ++c) red[warp][c][lane] = acc[c];
}

// The warps' partial sums of each of the tile's 32·CW columns, added in warp order by one
// thread a column into sums (thread t < 32·CW: column t of red_k; the next 32·CW threads, when
// `with_q`, those of red_q), for every thread to read after a barrier. Every warp adding every
// column's partials for itself issued NW times the loads and adds: in a chain of a step's
// launches on the H200 that cost 0.03–6.5 µs a launch more at batch 1–64, for the same bits
// (benches/results/h200-decode_sums-2026-11-30/).
template <int NW, int CW>
__device__ __forceinline__ void column_sums(float* sum_k, float* sum_q, const float (*red_k)[CW][32],
                                            const float (*red_q)[CW][32], bool with_q) {
  static_assert(NW * 32 >= 64 * CW, "a thread for every column of k and of q");
  const int t = threadIdx.x, which = t / (32 * CW), tc = t % (32 * CW);
  if (which > (with_q ? 1 : 0)) return;
  const float(*red)[CW][32] = which ? red_q : red_k;
  const int l = tc / CW, c = tc % CW;
  float acc = 0.0f;
#pragma unroll
  for (int w = 0; w < NW; ++w) acc += red[w][c][l];
  (which ? sum_q : sum_k)[tc] = acc;
}

// The decode step's inputs, prepared: q [B, H, K] and k [B·n, H, K] L2-normalised, v
// [B·n, HV, V], beta [B·n, HV], g [B, HV] log-decay or null (applied before each token's first
// step); all f32, contiguous. Row `row` = b·n + j is step j of token b.
struct Prepped {
  const float *q, *k, *v, *beta, *g;
  int H, HV;
  // Element i of q's head hk of token b, and of k's head hk of step j of token b.
  __device__ float q_at(int b, int hk, int i, int K) const { return q[((size_t)b * H + hk) * K + i]; }
  __device__ float k_at(int b, int j, int n, int hk, int i, int K) const { return k[(((size_t)b * n + j) * H + hk) * K + i]; }
  // q and k arrive normalised.
  __device__ void normalise(float*, float*, bool, int, int, int) const {}
  __device__ const float* v_row(int b, int j, int n, int hv, int V) const { return v + (((size_t)b * n + j) * HV + hv) * V; }
  __device__ float beta_of(int b, int j, int n, int hv) const { return beta[((size_t)b * n + j) * HV + hv]; }
  // The first step's β and the log-decay as loaded (first_gates), and what they form.
  struct Gates {
    float beta, g;
  };
  __device__ Gates first_gates(int b, int n, int hv) const { return {beta_of(b, 0, n, hv), g ? g[(size_t)b * HV + hv] : 0.0f}; }
  __device__ float beta_from(const Gates& x) const { return x.beta; }
  __device__ float decay_from(const Gates& x) const { return g ? __expf(x.g) : 1.0f; }
};

// An activation-dtype element (code 0: f32, 1: bf16, 2: f16) as f32.
__device__ __forceinline__ float act_at(const void* p, int code, size_t i) {
  if (code == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (code == 2) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// The inputs as the conv and the input projection leave them, prepared on the way in, as the
// prep kernel (prep.cu) would (the same arithmetic, so the results agree bit for bit): the conv
// output rows [B, ldc] f32 hold q's H heads from column 0, the n·H k heads (step-major) from
// k_off and v's n·HV heads (step-major) from v_off; β = beta_mult·sigmoid(b) with b [B, n·HV]
// (row stride ldb), the gate −exp(A_log)·softplus(a + dt_bias) with a [B, HV] (row stride lda;
// null: no gate), b and a in the activation dtype (codes as act_at). The launcher passes it by
// value; decode.rs's RawArgs mirrors its layout field for field.
struct Raw {
  const float* conv;
  long ldc;
  int k_off, v_off;
  const void* b;
  long ldb;
  int b_code;
  float beta_mult;
  const void* a;
  long lda;
  int a_code;
  const float *a_log, *dt_bias;
  int H, HV;
  // The heads' raw values (normalise() finishes them). H here is the q/k head count; k's heads
  // of step j follow those of step j − 1.
  __device__ float q_at(int b, int hk, int i, int K) const { return conv[(size_t)b * ldc + (size_t)hk * K + i]; }
  __device__ float k_at(int b, int j, int /*n*/, int hk, int i, int K) const {
    return conv[(size_t)b * ldc + k_off + ((size_t)j * H + hk) * K + i];
  }
  // After the loads' barrier: warp 1 normalises k and, on the first step, warp 0 q; then a
  // barrier of its own.
  __device__ void normalise(float* qq, float* kk, bool first, int K, int warp, int lane) const {
    if (warp == 0 && first) l2_head(qq, qq, K, lane);
    if (warp == 1) l2_head(kk, kk, K, lane);
    __syncthreads();
  }
  __device__ const float* v_row(int b, int j, int /*n*/, int hv, int V) const {
    return conv + (size_t)b * ldc + v_off + ((size_t)j * HV + hv) * V;
  }
  __device__ float beta_of(int b, int j, int /*n*/, int hv) const {
    return ds_beta(beta_mult, act_at(this->b, b_code, (size_t)b * ldb + (size_t)j * HV + hv));
  }
  // The first step's b and the gate's a, A_log and dt_bias as loaded (first_gates: loads only,
  // so that they can be issued before the state's), and β and the decay they form.
  struct Gates {
    float b, a, a_log, dt_bias;
  };
  __device__ Gates first_gates(int b, int /*n*/, int hv) const {
    Gates x{act_at(this->b, b_code, (size_t)b * ldb + hv), 0.0f, 0.0f, 0.0f};
    if (a) x.a = act_at(a, a_code, (size_t)b * lda + hv), x.a_log = a_log[hv], x.dt_bias = dt_bias[hv];
    return x;
  }
  __device__ float beta_from(const Gates& x) const { return ds_beta(beta_mult, x.b); }
  __device__ float decay_from(const Gates& x) const { return a ? __expf(ds_log_decay(x.a, x.a_log, x.dt_bias)) : 1.0f; }
};

// One decode step for B sequences. Grid (ceil(V/(32·CW)), HV, B), block 32·NW: lane owns CW
// adjacent value columns, warp w keeps state rows [w·R, (w+1)·R) in registers, R = ceil(K/NW)
// ≤ RMAX; each state element is read once and written once.
//
// One block-wide reduction per householder step: the output needs no pass over the final
// state, because with S_j = d_j S_{j-1} + k_j u_jᵀ (d_0 = e^g, later d_j = 1)
//   o = scale · S_nᵀ q = scale · (e^g S_0ᵀ q + Σ_j u_j (k_j · q)),
// and S_0ᵀ q is reduced together with S_0ᵀ k_0. The state stores then follow the last
// reduction directly.
// Inputs through In (Prepped or Raw); o [B, HV, V].
// Shared memory of one CTA.
template <int NW, int CW>
struct DecodeSmem {
  float kk[256], qq[256];
  float red_k[NW][CW][32], red_q[NW][CW][32];
  float sum_k[32 * CW], sum_q[32 * CW];  // the columns' sums of red_k and red_q (column_sums)
  float v[32 * CW];  // the first step's v columns of the tile
  float beta, decay;  // the first step's β, and the token's decay
};

// A tile's inputs of its first householder step, this thread's part: q, k and v loaded into
// registers, then parked in shared memory (park_inputs) after the state's loads are issued, so
// that they cost one round trip between them. A load whose value is stored to shared memory
// waits for it there, and the compiler may not move a later load above that store: the step
// used to wait for q, then k, then v, each after its tile's state.
//
// β and the decay need arithmetic on their loads, so forming them waits for those. Tiles of
// two or four columns a lane (steps with a CTA or more for every SM) form them here, before
// the state's loads are issued: with that wait first, batch-64 steps took 3–6% less on the
// H200, and with β and the decay formed after the state's loads were issued, nothing less
// (benches/results/h200-decode_inputs-2026-11-30/). Tiles of one column (steps of fewer CTAs
// than SMs) issue their state's loads first, as the wait delayed batch-1 steps by ~1%: thread 0
// issues the loads of β's and the decay's inputs before them (first_gates) and forms the two in
// park_inputs, so that they wait for no round trip after the state's (loaded after it, they cost
// the 1.39B's batch-1 step 0.8–1.1 µs a layer, benches/results/h200-decode_sums-2026-11-30/).
template <int CW>
struct TileInputs {
  float q, k;        // element threadIdx.x of q's and k's head (0 past K)
  float v[CW];       // this lane's columns of v
  float beta, decay; // formed when CW > 1
};

template <int CW, bool VEC, typename In>
__device__ __forceinline__ TileInputs<CW> tile_inputs(const In& in, int tile, int hv, int b, int H, int HV, int K, int V, int n) {
  TileInputs<CW> x;
  const int hk = hv / (HV / H), i = threadIdx.x;
  const int col = (tile * 32 + (threadIdx.x & 31)) * CW;
  x.q = i < K ? in.q_at(b, hk, i, K) : 0.0f;
  x.k = i < K ? in.k_at(b, 0, n, hk, i, K) : 0.0f;
  load_cols<CW, VEC>(x.v, in.v_row(b, 0, n, hv, V) + col, col, V);
  if constexpr (CW > 1) {
    const auto g = in.first_gates(b, n, hv);
    x.beta = in.beta_from(g);
    x.decay = in.decay_from(g);
  }
  return x;
}

// The first step's inputs into shared memory: q and k (all K of them, loading those past this
// thread's), v's columns (warp 0's copy), β and the decay (formed here by thread 0 from `gates`
// when CW = 1); gdr_decode's first barrier publishes them.
template <int NW, int CW, typename In>
__device__ __forceinline__ void park_inputs(DecodeSmem<NW, CW>& sm, const TileInputs<CW>& x, const typename In::Gates& gates,
                                            const In& in, int hv, int b, int H, int HV, int K, int n) {
  const int hk = hv / (HV / H);
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    sm.qq[i] = i == threadIdx.x ? x.q : in.q_at(b, hk, i, K);
    sm.kk[i] = i == threadIdx.x ? x.k : in.k_at(b, 0, n, hk, i, K);
  }
  if (threadIdx.x < 32) {
#pragma unroll
    for (int c = 0; c < CW; ++c) sm.v[threadIdx.x * CW + c] = x.v[c];
  }
  if (threadIdx.x == 0) {
    if constexpr (CW > 1) {
      sm.beta = x.beta, sm.decay = x.decay;
    } else {
      sm.beta = in.beta_from(gates), sm.decay = in.decay_from(gates);
    }
  }
}

// Value tile `tile` of head hv of sequence b, whose state is in slot `slot`. STEPS: 1 for one
// householder step a token, known when compiled (Gated DeltaNet; the `_vec` entries), or 0 for n
// (≥ 1) at run time: in the loop over n, one step held more registers and took up to 4 µs a
// launch longer on the H200 (benches/results/h200-decode_sums-2026-11-30/).
template <int NW, int RMAX, int CW, bool VEC, int STEPS, typename TS, typename In>
__device__ void gdr_decode(DecodeSmem<NW, CW>& sm, int tile, int hv, int b, const In& in, TS* __restrict__ states, int slot,
                           float* __restrict__ o, int H, int HV, int K, int V, int n, float scale) {
  if constexpr (STEPS > 0) n = STEPS;
  float* kk = sm.kk;
  float* qq = sm.qq;
  auto red_k = sm.red_k;
  auto red_q = sm.red_q;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = (tile * 32 + lane) * CW;
  const int hk = hv / (HV / H);
  const int R = (K + NW - 1) / NW, r0 = warp * R;
  TS* S = states + ((size_t)slot * HV + hv) * K * V;
  StateTile<TS, RMAX, CW> s;
  if constexpr (CW > 1) {
    const TileInputs<CW> first = tile_inputs<CW, VEC>(in, tile, hv, b, H, HV, K, V, n);
    s.template load<VEC>(S, R, r0, K, col, V);
    park_inputs(sm, first, typename In::Gates{}, in, hv, b, H, HV, K, n);
  } else {
    typename In::Gates gates{};
    if (threadIdx.x == 0) gates = in.first_gates(b, n, hv);
    s.template load<VEC>(S, R, r0, K, col, V);
    park_inputs(sm, tile_inputs<CW, VEC>(in, tile, hv, b, H, HV, K, V, n), gates, in, hv, b, H, HV, K, n);
  }
  float out[CW] = {};
  for (int j = 0; j < n; ++j) {
    if (j > 0) {
      __syncthreads();  // every warp is done with the last step's kk and red_k
      for (int i = threadIdx.x; i < K; i += blockDim.x) kk[i] = in.k_at(b, j, n, hk, i, K);
    }
    __syncthreads();
    in.normalise(qq, kk, j == 0, K, warp, lane);
    rows_dot<NW, RMAX, CW>(red_k, s, kk, R, r0, K, warp, lane);
    if (j == 0) rows_dot<NW, RMAX, CW>(red_q, s, qq, R, r0, K, warp, lane);
    float kq = 0.0f;  // only warp 0's output uses k · q
    if (warp == 0) {
      for (int i = lane; i < K; i += 32) kq += kk[i] * qq[i];
      kq = warp_sum(kq);
    }
    float vv[CW];
    if (j == 0) {
#pragma unroll
      for (int c = 0; c < CW; ++c) vv[c] = sm.v[lane * CW + c];
    } else {
      load_cols<CW, VEC>(vv, in.v_row(b, j, n, hv, V) + col, col, V);
    }
    const float bt = j == 0 ? sm.beta : in.beta_of(b, j, n, hv);
    const float decay = sm.decay;
    const float d = j == 0 ? decay : 1.0f;
    __syncthreads();
    column_sums<NW, CW>(sm.sum_k, sm.sum_q, red_k, red_q, j == 0);
    __syncthreads();
    float kv[CW], u[CW];
#pragma unroll
    for (int c = 0; c < CW; ++c) kv[c] = sm.sum_k[lane * CW + c];
#pragma unroll
    for (int c = 0; c < CW; ++c) u[c] = __fmul_rn(bt, __fmaf_rn(-d, kv[c], vv[c]));
    if (warp == 0) {
      if (j == 0) {
#pragma unroll
        for (int c = 0; c < CW; ++c) out[c] = decay * sm.sum_q[lane * CW + c];
      }
#pragma unroll
      for (int c = 0; c < CW; ++c) out[c] = __fmaf_rn(u[c], kq, out[c]);
    }
#pragma unroll
    for (int r = 0; r < RMAX; ++r)
      if (r < R && r0 + r < K) {
        const float kr = kk[r0 + r];
        float x[CW];
#pragma unroll
        for (int c = 0; c < CW; ++c) x[c] = __fmaf_rn(kr, u[c], __fmul_rn(d, s.at(r, c)));
        s.put(r, x);
      }
  }
  if (warp == 0) {
#pragma unroll
    for (int c = 0; c < CW; ++c) out[c] *= scale;
    store_cols<CW, VEC>(o + ((size_t)b * HV + hv) * V + col, out, col, V);
  }
#pragma unroll
  for (int r = 0; r < RMAX; ++r)
    if (r < R && r0 + r < K) s.template store_row<VEC>(S + (size_t)(r0 + r) * V + col, r, col, V);
}

// gdr_decode_f32_w{NW}_r{RMAX}_c{CW}_b{MINB}_vec (8/16-byte accesses, one householder step a
// token: n must be 1), _vec_n (8/16-byte accesses, n ≥ 1 steps) and _scalar (element by
// element, n ≥ 1): NW warps, up to RMAX state rows a warp, CW columns a lane, at least MINB
// blocks an SM (which caps the registers a thread at 65536 / (32·NW·MINB)). Grid
// (ceil(V/(32·CW)), HV, B), one value tile of one head of one sequence a CTA. `_sbf16` after
// the name: bf16 states. The slot index is read before pdl_entry: no kernel writes the slot
// list (common.cuh).
#define DECODE_ENTRY_T(NW, RM, CW, MINB, VEC, SUFFIX, TS, SN, STEPS)                                                  \
  extern "C" __global__ void __launch_bounds__(NW * 32, MINB)                                                        \
      gdr_decode_f32_w##NW##_r##RM##_c##CW##_b##MINB##_##SUFFIX##SN(                                                 \
          const float* q, const float* k, const float* v, const float* beta, const float* g, TS* states,             \
          SlotList slots, const int* more_slots, float* o, int H, int HV, int K, int V, int n, float scale) {        \
    const int slot = slot_of(slots, more_slots, blockIdx.z);                                                         \
    pdl_entry();                                                                                                     \
    __shared__ DecodeSmem<NW, CW> sm;                                                                                \
    gdr_decode<NW, RM, CW, VEC, STEPS>(sm, blockIdx.x, blockIdx.y, blockIdx.z, Prepped{q, k, v, beta, g, H, HV}, states, \
                                       slot, o, H, HV, K, V, n, scale);                                              \
  }
#define DECODE_ENTRY(NW, RM, CW, MINB, VEC, SUFFIX) DECODE_ENTRY_T(NW, RM, CW, MINB, VEC, SUFFIX, float, , 1)
// decode.rs's RawArgs has the same fields at the same offsets.
static_assert(sizeof(Raw) == 96 && offsetof(Raw, a_code) == 64 && offsetof(Raw, a_log) == 72 && offsetof(Raw, HV) == 92,
              "struct Raw must match RawArgs in decode.rs");

// gdr_decode_raw_w{NW}_r{RMAX}_c{CW}_b{MINB}_{vec,scalar}: the same step on Raw inputs, passed
// as one __grid_constant__ struct: its fields are read from the parameter bank where used, so
// they hold no registers next to the state's (as locals they spilled under the register cap).
#define DECODE_RAW_ENTRY_T(NW, RM, CW, MINB, VEC, SUFFIX, TS, SN, STEPS)                                              \
  extern "C" __global__ void __launch_bounds__(NW * 32, MINB)                                                        \
      gdr_decode_raw_w##NW##_r##RM##_c##CW##_b##MINB##_##SUFFIX##SN(const __grid_constant__ Raw in, TS* states,      \
                                                                     SlotList slots, const int* more_slots, float* o, \
                                                                     int K, int V, int n, float scale) {             \
    const int slot = slot_of(slots, more_slots, blockIdx.z);                                                         \
    pdl_entry();                                                                                                     \
    __shared__ DecodeSmem<NW, CW> sm;                                                                                \
    gdr_decode<NW, RM, CW, VEC, STEPS>(sm, blockIdx.x, blockIdx.y, blockIdx.z, in, states, slot, o, in.H, in.HV, K, V, n, \
                                       scale);                                                                       \
  }
// The one-step vec entries (Gated DeltaNet's, the common case) apart from the n-step ones, so that
// the loop's registers do not weigh on them; the scalar fallback takes any n.
#define DECODE_ENTRIES_T(NW, RM, CW, MINB, TS, SN)              \
  DECODE_ENTRY_T(NW, RM, CW, MINB, true, vec, TS, SN, 1)         \
  DECODE_ENTRY_T(NW, RM, CW, MINB, true, vec_n, TS, SN, 0)       \
  DECODE_ENTRY_T(NW, RM, CW, MINB, false, scalar, TS, SN, 0)     \
  DECODE_RAW_ENTRY_T(NW, RM, CW, MINB, true, vec, TS, SN, 1)     \
  DECODE_RAW_ENTRY_T(NW, RM, CW, MINB, true, vec_n, TS, SN, 0)   \
  DECODE_RAW_ENTRY_T(NW, RM, CW, MINB, false, scalar, TS, SN, 0)
#define DECODE_ENTRIES(NW, RM, CW, MINB)          \
  DECODE_ENTRIES_T(NW, RM, CW, MINB, float, )     \
  DECODE_ENTRIES_T(NW, RM, CW, MINB, __nv_bfloat16, _sbf16)
// The shapes decode.rs picks by K (vec and scalar, prepared and raw inputs), each with 4, 2 or
// 1 columns a lane: fewer columns give small batches more CTAs (B·HV·V/(32·CW)) to spread over
// the SMs.
#define DECODE_SHAPE(NW, RM, MINB)  \
  DECODE_ENTRIES(NW, RM, 4, MINB) \
  DECODE_ENTRIES(NW, RM, 2, MINB) \
  DECODE_ENTRIES(NW, RM, 1, MINB)
DECODE_SHAPE(8, 4, 4)
DECODE_SHAPE(8, 8, 4)
DECODE_SHAPE(16, 8, 2)
DECODE_SHAPE(32, 8, 1)
// K > 128 at larger batches: half-size blocks, two an SM, so that one block's loads overlap the
// other's reductions and stores (decode.rs's WIDE_K_MANY).
DECODE_ENTRIES(16, 16, 2, 2)
// bf16 states at K > 128 and many CTAs take four columns a lane where f32 ones take two
// (decode.rs's DecodeShape::for_states): the same registers for the tile, the same bytes in
// flight. (Eight where f32 takes four spilled registers, and was slower.)
DECODE_ENTRIES_T(16, 16, 4, 2, __nv_bfloat16, _sbf16)
// Alternatives for K ≤ 128 that the benchmark can pick (DELTASERVE_DECODE_KERNEL), f32 states.
DECODE_ENTRY(8, 16, 4, 2, true, vec)
DECODE_ENTRY(16, 8, 4, 1, true, vec)
DECODE_ENTRY(8, 16, 4, 1, true, vec)
