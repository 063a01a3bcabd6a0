// Chunked gated delta rule on the tensor cores (bf16 operands, fp32 accumulation and state),
// in three launches, as the WY/UT form allows (model-spec.md §3.5). With G the chunk-local
// cumulative log-decay and A[i,j] = β_i (k_i·k_j) e^{G_i−G_j} (j < i):
//
// 1. chunk_tc_prep (this file), every (chunk, value head) at once: T = (I + A)⁻¹ and
//      W = T diag(β e^G) K,   U = T diag(β) V,   P[i,j] = (q_i·k_j) e^{G_i−G_j} (j ≤ i).
//    T is inverted in fp32 by 16×16 blocks: the diagonal blocks by elimination in registers,
//    then the block rows below from the blocks above them.
// 2. chunk_tc_state (chunk_state.cu), one CTA per (sequence, value head, value tile), chunks in
//    order: snapshot S_c, V' = U − W S_c, S ← e^{G_last} S + Kᵀ (e^{G_last−G} ⊙ V').
// 3. chunk_tc_out (chunk_state.cu), every (chunk, value head, value tile) at once:
//      O = scale ((e^G ⊙ Q) S_c + P V').
//
// With f32 inputs every operand enters the matmuls as a bf16 hi + lo pair (x ≈ hi + lo, ~16
// mantissa bits; the lo·lo product is dropped), so the result is close to an fp32
// computation: that matters most for V' = U − W S, which cancels when the state already
// predicts v well. With bf16 inputs (TI = bf16) every operand is a single bf16, fla's
// precision: a third of the products and less shared memory.
//
// Chunks never cross sequences: chunk c covers rows [crow[c], crow[c] + clen[c]) of one
// packed sequence. Padding rows (beyond clen) load as zeros and carry the last row's G.
#include "tc_common.cuh"

template <typename TI>
__device__ void chunk_tc_prep(const TI* __restrict__ q, const TI* __restrict__ k, const TI* __restrict__ v,
                              const float* __restrict__ beta, const float* __restrict__ g, const int* __restrict__ crow,
                              const int* __restrict__ clen, float* __restrict__ W, float* __restrict__ U,
                              float* __restrict__ P, float* __restrict__ Gout, int H, int HV, int K, int V) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr bool LO = Split<TI>::value;
  const int K16 = round16(K), KP = K16 + 8;
  // V blocks reuse the q tiles once Q Kᵀ is done.
  const int qsize = max(CH * KP, CH * TP);
  Smem sm{smem_raw};
  bf16* Kh = sm.take<bf16>(CH * KP);
  bf16* Kl = LO ? sm.take<bf16>(CH * KP) : nullptr;
  bf16* Qh = sm.take<bf16>(qsize);
  bf16* Ql = LO ? sm.take<bf16>(qsize) : nullptr;
  bf16* Vh = Qh;
  bf16* Vl = Ql;
  float* Af = sm.take<float>(CH * AP);
  float* Tf = sm.take<float>(CH * AP);
  bf16* T1h = sm.take<bf16>(CH * TP);
  bf16* T1l = LO ? sm.take<bf16>(CH * TP) : nullptr;
  bf16* T2h = sm.take<bf16>(CH * TP);
  bf16* T2l = LO ? sm.take<bf16>(CH * TP) : nullptr;
  float* G = sm.take<float>(CH);
  float* Bt = sm.take<float>(CH);

  const int c = blockIdx.x, hv = blockIdx.y;
  const int hk = hv / (HV / H);
  const size_t row0 = crow[c];
  const int L = clen[c];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Scratch without buffers of its own: the block inverse's partial products live in T1h until
  // T1 is written, and the warps' staging tiles in Af once T is done.
  float* Xs = reinterpret_cast<float*>(T1h);
  float* stage = Af + warp * 256;

  for_rows8(k + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Kh, Kl, KP));
  for_rows8(q + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Qh, Ql, KP));
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
    if (i < L) P[((row0 + i) * HV + hv) * CH + j] = j <= i ? Tf[i * AP + j] * d : 0.0f;
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
  // Block rows 1..3: T_ij = −T_ii Σ_{m=j}^{i−1} A_im T_mj for j < i.
  for (int bi = 1; bi < 4; ++bi) {
    for (int e = tid; e < bi * 256; e += THREADS) {
      const int bj = e / 256, r = (e % 256) / 16, cc = e % 16;
      float acc = 0.0f;
      for (int m = bj; m < bi; ++m)
        for (int x = 0; x < 16; ++x) acc += Af[(bi * 16 + r) * AP + m * 16 + x] * Tf[(m * 16 + x) * AP + bj * 16 + cc];
      Xs[e] = acc;
    }
    __syncthreads();
    for (int e = tid; e < bi * 256; e += THREADS) {
      const int bj = e / 256, r = (e % 256) / 16, cc = e % 16;
      float acc = 0.0f;
      for (int x = 0; x <= r; ++x) acc -= Tf[(bi * 16 + r) * AP + bi * 16 + x] * Xs[bj * 256 + x * 16 + cc];
      Tf[(bi * 16 + r) * AP + bj * 16 + cc] = acc;
    }
    __syncthreads();
  }
  for (int e = tid; e < CH * CH; e += THREADS) {
    const int i = e / CH, j = e % CH;
    const float t = j <= i ? Tf[i * AP + j] * Bt[j] : 0.0f;
    put(t * __expf(G[j]), T1h, T1l, i * TP + j);
    put(t, T2h, T2l, i * TP + j);
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
  // U = T2 V, 64 value columns at a time.
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
        mma_split<FragA, FragB>(acc, T2h + rt * 16 * TP + kk * 16, LO ? T2l + rt * 16 * TP + kk * 16 : nullptr, TP,
                                Vh + kk * 16 * TP + ct * 16, LO ? Vl + kk * 16 * TP + ct * 16 : nullptr, TP);
      store_tile(stage, acc, U + (row0 * HV + hv) * V + v0, (size_t)HV * V, L, rt * 16, ct * 16, w);
    }
  }
}

#define PREP_ENTRY(NAME, TI)                                                                                         \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
      NAME(const TI* q, const TI* k, const TI* v, const float* beta, const float* g, const int* crow, const int* clen, \
           float* W, float* U, float* P, float* Gout, int H, int HV, int K, int V) {                                   \
    chunk_tc_prep<TI>(q, k, v, beta, g, crow, clen, W, U, P, Gout, H, HV, K, V);                                      \
  }
PREP_ENTRY(chunk_tc_prep_bf16, bf16)
PREP_ENTRY(chunk_tc_prep_f32, float)

