// Chunked gated delta rule on the tensor cores (bf16 operands, fp32 accumulation and state),
// in two launches, as the WY/UT form allows (model-spec.md §3.5). With G the chunk-local
// cumulative log-decay and A[i,j] = β_i (k_i·k_j) e^{G_i−G_j} (j < i):
//
// 1. chunk_tc_prep (this file), every (chunk, value head) at once: T = (I + A)⁻¹ and
//      W = T diag(β e^G) K,   U = T diag(β) V,   P[i,j] = (q_i·k_j) e^{G_i−G_j} (j ≤ i);
//    with bf16 inputs T2 = T diag(β) goes out in U's place and the state pass forms U = T2 V.
//    T is inverted in fp32 by 16×16 blocks: the diagonal blocks by elimination in registers,
//    then the block rows below from the blocks above them.
// 2. one CTA per (sequence, value head, value tile), chunks in order, the state carried
//    through them: V' = U − W S, O = scale (e^G ⊙ Q S + P V'), S ← e^{G_last} S + Kᵀ
//    (e^{G_last−G} ⊙ V'). chunk_state.cu (wmma, split operands) for f32 inputs, chunk_mma.cu
//    (mma.sync, state in registers) for bf16 inputs.
//
// With f32 inputs every operand enters the matmuls as a bf16 hi + lo pair (x ≈ hi + lo, ~16
// mantissa bits; the lo·lo product is dropped), so the result is close to an fp32
// computation: that matters most for V' = U − W S, which cancels when the state already
// predicts v well. With bf16 inputs (TI = bf16) every operand is a single bf16 and W, U and P
// are stored in bf16: fla's precision, a third of the products and half the traffic.
//
// Chunks never cross sequences: chunk c covers rows [crow[c], crow[c] + clen[c]) of one
// packed sequence. Padding rows (beyond clen) load as zeros and carry the last row's G.
#include "tc_common.cuh"

template <typename TI>
__device__ void chunk_tc_prep(const TI* __restrict__ q, const TI* __restrict__ k, const TI* __restrict__ v,
                              const float* __restrict__ beta, const float* __restrict__ g, const int* __restrict__ crow,
                              const int* __restrict__ clen, TI* __restrict__ W, TI* __restrict__ U,
                              TI* __restrict__ P, float* __restrict__ Gout, int H, int HV, int K, int V) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr bool LO = Split<TI>::value;
  const int K16 = round16(K), KP = K16 + 8;
  // With f32 inputs V blocks reuse the q tile once Q Kᵀ is done.
  const int qsize = LO ? max(CH * KP, CH * TP) : CH * KP;
  Smem sm{smem_raw};
  bf16* Kh = sm.take<bf16>(CH * KP);
  bf16* Kl = LO ? sm.take<bf16>(CH * KP) : nullptr;
  bf16* Qh = sm.take<bf16>(qsize);
  bf16* Ql = LO ? sm.take<bf16>(qsize) : nullptr;
  bf16* Vh = Qh;
  bf16* Vl = Ql;
  float* Af = sm.take<float>(CH * AP);
  float* Tf = sm.take<float>(CH * AP);
  // With bf16 inputs T1 overwrites T once it is read and T2 goes straight out (three CTAs per
  // SM instead of two at K = 128); split operands need tiles of their own.
  bf16* T1h = LO ? sm.take<bf16>(CH * TP) : reinterpret_cast<bf16*>(Tf);
  bf16* T1l = LO ? sm.take<bf16>(CH * TP) : nullptr;
  bf16* T2h = LO ? sm.take<bf16>(CH * TP) : nullptr;
  bf16* T2l = LO ? sm.take<bf16>(CH * TP) : nullptr;
  float* G = sm.take<float>(CH);
  float* Bt = sm.take<float>(CH);

  const int c = blockIdx.x, hv = blockIdx.y;
  const int hk = hv / (HV / H);
  const size_t row0 = crow[c];
  const int L = clen[c];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Scratch without buffers of its own: the block inverse's partial products live in T1h until
  // T1 is written (in the q tile, free after Q Kᵀ, with bf16 inputs), and the warps' staging
  // tiles in Af once T is done.
  float* Xs = LO ? reinterpret_cast<float*>(T1h) : reinterpret_cast<float*>(Qh);
  float* stage = Af + warp * 256;

  if constexpr (LO) {
    for_rows8(k + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Kh, Kl, KP));
    for_rows8(q + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Qh, Ql, KP));
  } else {
    tile_async<CH, 0>(Kh, KP, k + (row0 * H + hk) * K, (size_t)H * K, L, K, K16);
    tile_async<CH, 0>(Qh, KP, q + (row0 * H + hk) * K, (size_t)H * K, L, K, K16);
    cp_async_commit();
  }
  if (warp == 0) {
    // Inclusive scan of the log-decay: lane holds rows 2·lane and 2·lane + 1.
    const int r = 2 * lane;
    const float g0 = (g && r < L) ? g[(row0 + r) * HV + hv] : 0.0f;
    const float g1 = (g && r + 1 < L) ? g[(row0 + r + 1) * HV + hv] : 0.0f;
    const float pair = g0 + g1;
    float incl = pair;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    G[r] = incl - pair + g0;
    G[r + 1] = incl;
    if (r < L) Gout[(row0 + r) * HV + hv] = G[r];
    if (r + 1 < L) Gout[(row0 + r + 1) * HV + hv] = G[r + 1];
    Bt[r] = r < L ? beta[(row0 + r) * HV + hv] : 0.0f;
    Bt[r + 1] = r + 1 < L ? beta[(row0 + r + 1) * HV + hv] : 0.0f;
  }
  if constexpr (!LO) cp_async_wait<0>();
  __syncthreads();

  // K Kᵀ into Af and Q Kᵀ into Tf, lower-triangle tiles only: 2 × 10 tiles over 8 warps.
  for (int t = warp; t < 32; t += 8) {
    const int m = t / 16, rt = (t % 16) / 4, ct = t % 4;
    if (ct > rt) continue;
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    const bf16* ah = m ? Qh : Kh;
    const bf16* al = m ? Ql : Kl;
    for (int kk = 0; kk < K16; kk += 16)
      mma_split<FragA, FragBT>(acc, ah + rt * 16 * KP + kk, LO ? al + rt * 16 * KP + kk : nullptr, KP, Kh + ct * 16 * KP + kk,
                               LO ? Kl + ct * 16 * KP + kk : nullptr, KP);
    wmma::store_matrix_sync((m ? Tf : Af) + rt * 16 * AP + ct * 16, acc, AP, wmma::mem_row_major);
  }
  __syncthreads();

  // Decays and masks (exp only where j ≤ i); P goes out now, Tf is reused for T.
  for (int e = tid; e < CH * CH; e += THREADS) {
    const int i = e / CH, j = e % CH;
    const float d = j <= i ? __expf(G[i] - G[j]) : 0.0f;
    Af[i * AP + j] = j < i ? Bt[i] * Af[i * AP + j] * d : 0.0f;
    if (i < L) store_as(P + ((row0 + i) * HV + hv) * CH + j, j <= i ? Tf[i * AP + j] * d : 0.0f);
  }
  __syncthreads();

  // Diagonal 16×16 blocks of T = (I + A)⁻¹, warp b for block b, by right-looking elimination
  // in registers: lane owns column lane % 16, rows 8·(lane / 16) + [0, 8). After step j, row j
  // is final and every later row has subtracted A[i][j]·T[j].
  if (warp < 4) {
    const int b0 = warp * 16, col = lane % 16, r0 = (lane / 16) * 8;
    float t[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) t[e] = (r0 + e == col) ? 1.0f : 0.0f;
#pragma unroll
    for (int j = 0; j < 15; ++j) {
      const float tj = __shfl_sync(0xffffffffu, t[j % 8], (j / 8) * 16 + col);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (r0 + e > j) t[e] -= Af[(b0 + r0 + e) * AP + b0 + j] * tj;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) Tf[(b0 + r0 + e) * AP + b0 + col] = t[e];
  }
  __syncthreads();
  // Block rows 1..3: T_ij = −T_ii Σ_{m=j}^{i−1} A_im T_mj for j < i, warp j for block j, each
  // product on the tensor cores in 3×TF32 (near fp32).
  for (int bi = 1; bi < 4; ++bi) {
    const int bj = warp;
    if (bj < bi) {
      FragC32 acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int m = bj; m < bi; ++m)
        mma_3xtf32(acc, Af + bi * 16 * AP + m * 16, Tf + m * 16 * AP + bj * 16, AP);
      wmma::store_matrix_sync(Xs + bj * 256, acc, 16, wmma::mem_row_major);
    }
    __syncthreads();
    if (bj < bi) {
      FragC32 acc;
      wmma::fill_fragment(acc, 0.0f);
      mma_3xtf32(acc, Tf + bi * 16 * AP + bi * 16, AP, Xs + bj * 256, 16);
#pragma unroll
      for (int e = 0; e < acc.num_elements; ++e) acc.x[e] = -acc.x[e];
      wmma::store_matrix_sync(Tf + bi * 16 * AP + bj * 16, acc, AP, wmma::mem_row_major);
    }
    __syncthreads();
  }
  if constexpr (LO) {
    for (int e = tid; e < CH * CH; e += THREADS) {
      const int i = e / CH, j = e % CH;
      const float t = j <= i ? Tf[i * AP + j] * Bt[j] : 0.0f;
      put(t * __expf(G[j]), T1h, T1l, i * TP + j);
      put(t, T2h, T2l, i * TP + j);
    }
  } else {
    // T1 overwrites T: read all of this thread's values first. T2 goes out (bf16 [rows, HV,
    // 64], in U's place): the state pass forms U = T2 V itself.
    constexpr int PER = CH * CH / THREADS;
    const int j = tid % CH, i0 = tid / CH;
    const float bj = Bt[j], ebj = Bt[j] * __expf(G[j]);
    float t[PER];
#pragma unroll
    for (int n = 0; n < PER; ++n) {
      const int i = i0 + n * (THREADS / CH);
      t[n] = j <= i ? Tf[i * AP + j] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < PER; ++n) {
      const int i = i0 + n * (THREADS / CH);
      T1h[i * TP + j] = __float2bfloat16(t[n] * ebj);
      if (i < L) store_as(U + ((row0 + i) * HV + hv) * CH + j, t[n] * bj);
    }
  }
  __syncthreads();

  // W = T1 K (T1 lower triangular: k-steps up to the row tile).
  for (int t = warp; t < 4 * (K16 / 16); t += 8) {
    const int rt = t / (K16 / 16), ct = t % (K16 / 16);
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk <= rt; ++kk)
      mma_split<FragA, FragB>(acc, T1h + rt * 16 * TP + kk * 16, LO ? T1l + rt * 16 * TP + kk * 16 : nullptr, TP, Kh + kk * 16 * KP + ct * 16,
                              LO ? Kl + kk * 16 * KP + ct * 16 : nullptr, KP);
    store_tile(stage, acc, W + (row0 * HV + hv) * K, (size_t)HV * K, L, rt * 16, ct * 16, K);
  }
  // U = T2 V, 64 value columns at a time (f32 inputs; bf16 ones leave it to the state pass).
  if constexpr (LO) {
    for (int v0 = 0; v0 < V; v0 += 64) {
      const int w = min(64, V - v0);
      __syncthreads();
      for_rows8(v + (row0 * HV + hv) * V + v0, (size_t)HV * V, CH, L, w, 64, to_tile(Vh, Vl, TP));
      __syncthreads();
      for (int t = warp; t < 16; t += 8) {
        const int rt = t / 4, ct = t % 4;
        if (ct * 16 >= w) continue;
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk <= rt; ++kk)
          mma_split<FragA, FragB>(acc, T2h + rt * 16 * TP + kk * 16, T2l + rt * 16 * TP + kk * 16, TP, Vh + kk * 16 * TP + ct * 16,
                                  Vl + kk * 16 * TP + ct * 16, TP);
        store_tile(stage, acc, U + (row0 * HV + hv) * V + v0, (size_t)HV * V, L, rt * 16, ct * 16, w);
      }
    }
  }
}

#define PREP_ENTRY(NAME, TI)                                                                                         \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
      NAME(const TI* q, const TI* k, const TI* v, const float* beta, const float* g, const int* crow, const int* clen, \
           TI* W, TI* U, TI* P, float* Gout, int H, int HV, int K, int V) {                                   \
    chunk_tc_prep<TI>(q, k, v, beta, g, crow, clen, W, U, P, Gout, H, HV, K, V);                                      \
  }
PREP_ENTRY(chunk_tc_prep_bf16, bf16)
PREP_ENTRY(chunk_tc_prep_f32, float)

