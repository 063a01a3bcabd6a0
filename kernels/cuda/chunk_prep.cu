// Chunked gated delta rule on the tensor cores (bf16 operands, fp32 accumulation and state),
// in two launches, as the WY/UT form allows (model-spec.md §3.5). With G the chunk-local
// cumulative log-decay and A[i,j] = β_i (k_i·k_j) e^{G_i−G_j} (j < i):
//
// 1. chunk_tc_prep (this file), every (chunk, value head) at once: T = (I + A)⁻¹ and
//      W = T diag(β e^G) K,   U = T diag(β) V,   P[i,j] = (q_i·k_j) e^{G_i−G_j} (j ≤ i);
//    with bf16 inputs only T2 = T diag(β) and P go out: the state pass forms
//    V' = U − W S = T2 (V − e^G ⊙ K S) itself.
//    T is inverted in fp32 by 16×16 blocks: the diagonal blocks by elimination in registers,
//    then the blocks below it from the two 32×32 halves (three dependent products).
// 2. chunk_mma.cu: one CTA per (sequence, value head, value tile), chunks in order, the state
//    carried through them: V' = U − W S, O = scale (e^G ⊙ Q S + P V'), S ← e^{G_last} S + Kᵀ
//    (e^{G_last−G} ⊙ V').
//
// With f32 inputs every operand enters the matmuls as a bf16 hi + lo pair (x ≈ hi + lo, ~16
// mantissa bits; the lo·lo product is dropped), so the result is close to an fp32
// computation: that matters most for V' = U − W S, which cancels when the state already
// predicts v well. This launch then writes W, P, q and the decayed keys e^{G_last−G} ⊙ k as
// such pairs (U in fp32), so that the state pass copies its tiles in with cp.async and splits
// nothing. With bf16 inputs (TI = bf16) every operand is a single bf16 and W, T2 and P are
// stored in bf16: fla's precision, a third of the products and half the traffic.
//
// Chunks never cross sequences: chunk c covers rows [crow[c], crow[c] + clen[c]) of one
// packed sequence. Padding rows (beyond clen) load as zeros and carry the last row's G.
#include "chunk_prep.cuh"

// What chunk_tc_prep writes, row-major by (row, head): P [rows, HV, 64] in bf16; T2 [rows, HV,
// 64] in U's place (bf16 inputs), or U [rows, HV, V] and W [rows, HV, K] (f32 inputs). W, the
// lo halves and Q, Kd are for f32 inputs only (null otherwise): Wl, Pl the remainders of W, P;
// Q, Ql the query rows [rows, H, K]; Kd, Kdl the keys scaled by e^{G_last − G} [rows, HV, K].
template <typename TI>
struct PrepOut {
  bf16 *W, *Wl;
  TI* U;
  bf16 *P, *Pl, *Q, *Ql, *Kd, *Kdl;
};

// n ≤ 8 values at hi (and their remainders at lo, when non-null): one 16-byte store each when
// whole and aligned.
__device__ __forceinline__ void store_row8(bf16* hi, bf16* lo, const float* x, int n) {
  if (n >= 8 && reinterpret_cast<uintptr_t>(hi) % 16 == 0 && (!lo || reinterpret_cast<uintptr_t>(lo) % 16 == 0)) {
    store8_split(hi, lo, x);
  } else {
    for (int e = 0; e < n; ++e) {
      hi[e] = __float2bfloat16(x[e]);
      if (lo) lo[e] = __float2bfloat16(x[e] - __bfloat162float(hi[e]));
    }
  }
}

// A [64, K16] tile of key or query rows (bf16), with the usual head sizes' widths known at
// compile time: a copy then costs a pointer add, where the run-time width's index arithmetic
// made issuing the two tiles a quarter of a one-chunk launch's time (~1,200 instructions a warp).
__device__ __forceinline__ void k16_tile(bf16* dst, int ld, const bf16* src, size_t stride, int L, int K, int K16) {
  switch (K16) {
    case 64:
      tile_async<CH, 64>(dst, ld, src, stride, L, K);
      break;
    case 128:
      tile_async<CH, 128>(dst, ld, src, stride, L, K);
      break;
    case 256:
      tile_async<CH, 256>(dst, ld, src, stride, L, K);
      break;
    default:
      tile_async<CH, 0>(dst, ld, src, stride, L, K, K16);
  }
}

// K Kᵀ into Af and Q Kᵀ into Tf (fp32, pitch AP) from [64, K16] tiles of pitch KP (with their
// lo halves with LO), lower-triangle tiles only: 2 × 10 tiles over 8 warps, at most three
// a warp (numbered over the triangle, not the square, which gave some warps four and others
// none).
template <bool LO>
__device__ __forceinline__ void gram_tiles(const bf16* Kh, const bf16* Kl, const bf16* Qh, const bf16* Ql, int KP, int K16, float* Af,
                                           float* Tf, int warp) {
  for (int t = warp; t < 20; t += 8) {
    const int m = t / 10, d = t % 10;
    const int rt = d < 1 ? 0 : d < 3 ? 1 : d < 6 ? 2 : 3, ct = d - rt * (rt + 1) / 2;
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    const bf16* ah = m ? Qh : Kh;
    const bf16* al = m ? Ql : Kl;
    for (int kk = 0; kk < K16; kk += 16)
      mma_split<FragA, FragBT>(acc, ah + rt * 16 * KP + kk, LO ? al + rt * 16 * KP + kk : nullptr, KP, Kh + ct * 16 * KP + kk,
                               LO ? Kl + ct * 16 * KP + kk : nullptr, KP);
    wmma::store_matrix_sync((m ? Tf : Af) + rt * 16 * AP + ct * 16, acc, AP, wmma::mem_row_major);
  }
}

template <typename TI>
__device__ void chunk_tc_prep(const TI* __restrict__ q, const TI* __restrict__ k, const TI* __restrict__ v,
                              const float* __restrict__ beta, const float* __restrict__ g, const int* __restrict__ crow,
                              const int* __restrict__ clen, const PrepOut<TI> out, float* __restrict__ Gout, int H, int HV,
                              int K, int V, long ldv) {
  // An unused entry of a fixed-size chunk table (a pass captured as a CUDA graph).
  if (clen[blockIdx.x] == 0) return;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr bool LO = Split<TI>::value;
  const int K16 = round16(K), KP = K16 + 8;
  // The warps' staging tiles for W and U: 256 floats each.
  constexpr int STAGE = 256;
  // With f32 inputs, once Q Kᵀ is done, the q tiles hold V blocks (hi in Qh, lo in Ql) and,
  // after the hi block, the warps' staging tiles.
  const int qsize = LO ? max(CH * KP, CH * TP + 2 * STAGE * (THREADS / 32)) : CH * KP;
  Smem sm{smem_raw};
  bf16* Kh = sm.take<bf16>(CH * KP);
  bf16* Kl = LO ? sm.take<bf16>(CH * KP) : nullptr;
  bf16* Qh = sm.take<bf16>(qsize);
  bf16* Ql = LO ? sm.take<bf16>(qsize) : nullptr;
  bf16* Vh = Qh;
  bf16* Vl = Ql;
  float* Af = sm.take<float>(CH * AP);
  float* Tf = sm.take<float>(CH * AP);
  // f32 inputs: once T is read, T1's hi + lo pair goes over A's tile and T2's over T's (an fp32
  // tile holds two bf16 ones), so two CTAs fit an SM at K = 128. bf16 inputs need no T1 and
  // send T2 straight out (three CTAs an SM at K = 128).
  bf16* T1h = LO ? reinterpret_cast<bf16*>(Af) : nullptr;
  bf16* T1l = LO ? T1h + CH * TP : nullptr;
  bf16* T2h = LO ? reinterpret_cast<bf16*>(Tf) : nullptr;
  bf16* T2l = LO ? T2h + CH * TP : nullptr;
  float* G = sm.take<float>(CH);
  float* Bt = sm.take<float>(CH);

  const int c = blockIdx.x, hv = blockIdx.y;
  const int hk = hv / (HV / H);
  const size_t row0 = crow[c];
  const int L = clen[c];
  const int tid = threadIdx.x, warp = tid >> 5;
  // The staging tiles (f32 inputs only: W and U) take the q tiles' room after a V block.
  float* stage = reinterpret_cast<float*>(Qh + CH * TP) + warp * STAGE;

  if constexpr (LO) {
    for_rows8(k + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Kh, Kl, KP));
    // The first value head of each key head also writes the query rows' pairs out.
    const bool own_q = hv % (HV / H) == 0;
    const auto qtile = to_tile(Qh, Ql, KP);
    for_rows8(q + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, [&](int r, int cc, const float* x) {
      qtile(r, cc, x);
      const size_t at = ((row0 + r) * H + hk) * K + cc;
      if (own_q && r < L && cc < K) store_row8(out.Q + at, out.Ql + at, x, min(8, K - cc));
    });
  } else {
    k16_tile(Kh, KP, k + (row0 * H + hk) * K, (size_t)H * K, L, K, K16);
    k16_tile(Qh, KP, q + (row0 * H + hk) * K, (size_t)H * K, L, K, K16);
    cp_async_commit();
  }
  if (warp == 0) scan_decay(g, beta, row0, L, hv, HV, G, Bt, Gout);
  if constexpr (!LO) cp_async_wait<0>();
  __syncthreads();

  gram_tiles<LO>(Kh, Kl, Qh, Ql, KP, K16, Af, Tf, warp);
  __syncthreads();

  // Decays and masks (exp only where j ≤ i), eight columns a thread at a time; P goes out now,
  // Tf is reused for T.
  for (int e = tid; e < CH * CH / 8; e += THREADS) {
    const int i = e / (CH / 8), j0 = (e % (CH / 8)) * 8;
    float* a = Af + i * AP + j0;
    const float* qk = Tf + i * AP + j0;
    const float gi = G[i], bi = Bt[i];
    float pa[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const int j = j0 + c;
      const float d = j <= i ? __expf(gi - G[j]) : 0.0f;
      a[c] = j < i ? bi * a[c] * d : 0.0f;
      pa[c] = j <= i ? qk[c] * d : 0.0f;  // upper tiles of Q Kᵀ were never computed
    }
    const size_t at = ((row0 + i) * HV + hv) * CH + j0;
    if (i < L) store8_split(out.P + at, LO ? out.Pl + at : nullptr, pa);
  }
  __syncthreads();

  invert_unit_lower(Af, Tf, warp);
  {
    // T1 = T diag(β e^G) and T2 = T diag(β) (f32 inputs), or T2 alone (bf16). Every thread
    // reads its values of T before T2's pair goes over it; eight columns a group.
    constexpr int PER = CH * CH / 8 / THREADS;
    const int j0 = (tid % (CH / 8)) * 8, i0 = tid / (CH / 8);
    float t[PER][8];
#pragma unroll
    for (int n = 0; n < PER; ++n) {
      const int i = i0 + n * (THREADS * 8 / CH);
#pragma unroll
      for (int c = 0; c < 8; ++c) t[n][c] = j0 + c <= i ? Tf[i * AP + j0 + c] : 0.0f;
    }
    __syncthreads();
    float bj[8], eg[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) bj[c] = Bt[j0 + c], eg[c] = __expf(G[j0 + c]);
#pragma unroll
    for (int n = 0; n < PER; ++n) {
      const int i = i0 + n * (THREADS * 8 / CH);
      float t1[8], t2[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        t2[c] = t[n][c] * bj[c];
        t1[c] = t2[c] * eg[c];
      }
      if constexpr (LO) {
        store8_split(T1h + i * TP + j0, T1l + i * TP + j0, t1);
        store8_split(T2h + i * TP + j0, T2l + i * TP + j0, t2);
      } else if (i < L) {
        // T2 goes out (bf16 [rows, HV, 64], in U's place) for the state pass.
        store8(out.U + ((row0 + i) * HV + hv) * CH + j0, t2);
      }
    }
  }
  __syncthreads();

  // W = T1 K (T1 lower triangular: k-steps up to the row tile); f32 inputs only: the bf16 state
  // pass forms V' = T2 (V − e^G ⊙ K S) and needs no W.
  for (int t = warp; LO && t < 4 * (K16 / 16); t += 8) {
    const int rt = t / (K16 / 16), ct = t % (K16 / 16);
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk <= rt; ++kk)
      mma_split<FragA, FragB>(acc, T1h + rt * 16 * TP + kk * 16, LO ? T1l + rt * 16 * TP + kk * 16 : nullptr, TP, Kh + kk * 16 * KP + ct * 16,
                              LO ? Kl + kk * 16 * KP + ct * 16 : nullptr, KP);
    const size_t at = (row0 * HV + hv) * K;
    store_tile(stage, acc, out.W + at, (size_t)HV * K, L, rt * 16, ct * 16, K, LO ? out.Wl + at : nullptr);
  }
  // U = T2 V, 64 value columns at a time (f32 inputs; bf16 ones leave it to the state pass).
  if constexpr (LO) {
    for (int v0 = 0; v0 < V; v0 += 64) {
      const int w = min(64, V - v0);
      __syncthreads();
      for_rows8(v + (size_t)row0 * ldv + (size_t)hv * V + v0, (size_t)ldv, CH, L, w, 64, to_tile(Vh, Vl, TP));
      __syncthreads();
      for (int t = warp; t < 16; t += 8) {
        const int rt = t / 4, ct = t % 4;
        if (ct * 16 >= w) continue;
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk <= rt; ++kk)
          mma_split<FragA, FragB>(acc, T2h + rt * 16 * TP + kk * 16, T2l + rt * 16 * TP + kk * 16, TP, Vh + kk * 16 * TP + ct * 16,
                                  Vl + kk * 16 * TP + ct * 16, TP);
        store_tile(stage, acc, out.U + (row0 * HV + hv) * V + v0, (size_t)HV * V, L, rt * 16, ct * 16, w);
      }
    }
    // The keys as the state update takes them, e^{G_last − G} ⊙ k (G_last: row 63's G, which
    // padding rows carry), split once here rather than by every value tile of the state pass.
    const float g_last = G[CH - 1];
    for_rows8(k + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, [&](int r, int cc, const float* x) {
      if (r >= L || cc >= K) return;
      const float d = __expf(g_last - G[r]);
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = x[e] * d;
      const size_t at = ((row0 + r) * HV + hv) * K + cc;
      store_row8(out.Kd + at, out.Kdl + at, y, min(8, K - cc));
    });
  }
}

// chunk_tc_prep for bf16 inputs and two value heads of one key head (GVA, HV/H even): K Kᵀ and
// Q Kᵀ are the same for both, so one CTA forms them once and inverts the two heads' T side by
// side (warps 0–3 the first, 4–7 the second). Outputs, bits and layout as chunk_tc_prep<bf16>.
// Once the products are done, the K and Q tiles' room takes the second head's A and T.
__device__ void chunk_tc_prep_pair(const bf16* __restrict__ q, const bf16* __restrict__ k, const float* __restrict__ beta,
                                   const float* __restrict__ g, const int* __restrict__ crow, const int* __restrict__ clen,
                                   bf16* __restrict__ T2out, bf16* __restrict__ Pout, float* __restrict__ Gout, int H, int HV, int K) {
  if (clen[blockIdx.x] == 0) return;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int K16 = round16(K), KP = K16 + 8;
  Smem sm{smem_raw};
  float* A[2];
  float* T[2];
  A[0] = sm.take<float>(CH * AP);
  T[0] = sm.take<float>(CH * AP);
  float* G = sm.take<float>(2 * CH);
  float* Bt = sm.take<float>(2 * CH);
  // The key and query tiles, then the second head's A and T.
  unsigned char* shared_room = reinterpret_cast<unsigned char*>(sm.take<float>(max(CH * KP, 2 * CH * AP)));
  bf16* Kh = reinterpret_cast<bf16*>(shared_room);
  bf16* Qh = Kh + CH * KP;
  A[1] = reinterpret_cast<float*>(shared_room);
  T[1] = A[1] + CH * AP;

  const int c = blockIdx.x, hv0 = 2 * blockIdx.y;
  const int hk = hv0 / (HV / H);
  const size_t row0 = crow[c];
  const int L = clen[c];
  const int tid = threadIdx.x, warp = tid >> 5;

  k16_tile(Kh, KP, k + (row0 * H + hk) * K, (size_t)H * K, L, K, K16);
  k16_tile(Qh, KP, q + (row0 * H + hk) * K, (size_t)H * K, L, K, K16);
  cp_async_commit();
  if (warp < 2) scan_decay(g, beta, row0, L, hv0 + warp, HV, G + warp * CH, Bt + warp * CH, Gout);
  cp_async_wait<0>();
  __syncthreads();
  gram_tiles<false>(Kh, nullptr, Qh, nullptr, KP, K16, A[0], T[0], warp);
  __syncthreads();

  // Both heads' decays and masks from the one K Kᵀ and Q Kᵀ: head 0's A in place, head 1's into
  // the tiles' room (free now); both P out.
  for (int e = tid; e < CH * CH / 8; e += THREADS) {
    const int i = e / (CH / 8), j0 = (e % (CH / 8)) * 8;
    float kk[8], qk[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) kk[c] = A[0][i * AP + j0 + c], qk[c] = T[0][i * AP + j0 + c];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* Gh = G + h * CH;
      const float gi = Gh[i], bi = Bt[h * CH + i];
      float a[8], pa[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int j = j0 + c;
        const float d = j <= i ? __expf(gi - Gh[j]) : 0.0f;
        a[c] = j < i ? bi * kk[c] * d : 0.0f;
        pa[c] = j <= i ? qk[c] * d : 0.0f;
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) A[h][i * AP + j0 + c] = a[c];
      if (i < L) store8(Pout + ((row0 + i) * HV + hv0 + h) * CH + j0, pa);
    }
  }
  __syncthreads();
  invert_unit_lower(warp < 4 ? A[0] : A[1], warp < 4 ? T[0] : T[1], warp % 4);

  // T2 = T diag(β) out, both heads, eight columns a group.
  for (int e = tid; e < 2 * CH * CH / 8; e += THREADS) {
    const int h = e / (CH * CH / 8), i = e / (CH / 8) % CH, j0 = (e % (CH / 8)) * 8;
    if (i >= L) continue;
    float t2[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) t2[c] = j0 + c <= i ? (h ? T[1] : T[0])[i * AP + j0 + c] * Bt[h * CH + j0 + c] : 0.0f;
    store8(T2out + ((row0 + i) * HV + hv0 + h) * CH + j0, t2);
  }
}

// f32 inputs: two CTAs an SM at K ≤ 128 (their shared memory allows it), so 128 registers at most.
#define PREP_ENTRY(NAME, TI, MINB)                                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                                        \
      NAME(const TI* q, const TI* k, const TI* v, const float* beta, const float* g, const int* crow, const int* clen, \
           bf16* W, bf16* Wl, TI* U, bf16* P, bf16* Pl, bf16* Q, bf16* Ql, bf16* Kd, bf16* Kdl, float* Gout, int H,    \
           int HV, int K, int V, long ldv) {                                                                         \
    pdl_entry();                                                                                                     \
    pdl_trigger();                                                                                                   \
    chunk_tc_prep<TI>(q, k, v, beta, g, crow, clen, PrepOut<TI>{W, Wl, U, P, Pl, Q, Ql, Kd, Kdl}, Gout, H, HV, K, V, \
                      ldv);                                                                                          \
  }
PREP_ENTRY(chunk_tc_prep_bf16, bf16, 1)
PREP_ENTRY(chunk_tc_prep_f32, float, 2)


// grid (chunks, HV / 2): value heads 2y and 2y + 1 (one key head's).
extern "C" __global__ void __launch_bounds__(THREADS, 1)
    chunk_tc_prep_bf16_pairs(const bf16* q, const bf16* k, const float* beta, const float* g, const int* crow, const int* clen, bf16* T2,
                             bf16* P, float* Gout, int H, int HV, int K) {
  pdl_entry();
  pdl_trigger();
  chunk_tc_prep_pair(q, k, beta, g, crow, clen, T2, P, Gout, H, HV, K);
}
