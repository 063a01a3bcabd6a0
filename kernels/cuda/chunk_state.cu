// Launch 2 of the tensor-core chunked prefill for f32 inputs (see chunk_prep.cu; bf16 inputs
// take chunk_mma.cu): one CTA per (sequence, value head, BV-column tile) walks the sequence's
// chunks in order, carrying S in shared memory:
//   V' = U − W S,   O = scale (e^G ⊙ Q S + P V'),   S ← e^{G_last} S + (e^{G_last−G} ⊙ K)ᵀ V'.
// The next chunk's rows are prefetched into L2 while the current one computes, so the loads
// that open each chunk wait on L2 rather than DRAM.
#include "tc_common.cuh"

template <typename TI, int BV>
__device__ void chunk_tc_state(const TI* __restrict__ q, const TI* __restrict__ k, const float* __restrict__ W,
                               const float* __restrict__ U, const float* __restrict__ P, const float* __restrict__ Gin,
                               float* __restrict__ states, const int* __restrict__ cu, const int* __restrict__ slots,
                               const int* __restrict__ snap, int has_snap, float* __restrict__ o, int H, int HV, int K,
                               int V, float scale) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr int SP = BV + 4;  // fp32 [.., BV] tiles, padded
  constexpr int SB = BV + 8;  // bf16 [.., BV] tiles, padded
  constexpr int NT = BV / 16;
  const int K16 = round16(K), KP = K16 + 8;
  Smem sm{smem_raw};
  float* Sf = sm.take<float>(K16 * SP);
  bf16* Sh = sm.take<bf16>(K16 * SB);
  constexpr bool LO = Split<TI>::value;
  bf16* Sl = LO ? sm.take<bf16>(K16 * SB) : nullptr;
  bf16* Wh = sm.take<bf16>(CH * KP);  // W hi, then e^{G_last − G} ⊙ K
  bf16* Wl = LO ? sm.take<bf16>(CH * KP) : nullptr;
  bf16* Qh = sm.take<bf16>(CH * KP);
  bf16* Ql = LO ? sm.take<bf16>(CH * KP) : nullptr;
  bf16* Ph = sm.take<bf16>(CH * TP);
  bf16* Pl = LO ? sm.take<bf16>(CH * TP) : nullptr;
  float* C1 = sm.take<float>(CH * SP);
  float* C2 = sm.take<float>(CH * SP);
  bf16* Vh = sm.take<bf16>(CH * SB);
  bf16* Vl = LO ? sm.take<bf16>(CH * SB) : nullptr;
  float* G = sm.take<float>(CH);

  const int hv = blockIdx.y, seq = blockIdx.z, v0 = blockIdx.x * BV;
  const int hk = hv / (HV / H);
  const int tid = threadIdx.x, warp = tid >> 5;
  const int vw = min(BV, V - v0);
  float* Sg = states + ((size_t)slots[seq] * HV + hv) * K * V + v0;
  for_rows8(Sg, (size_t)V, K16, K, vw, BV, [&](int r, int cc, const float* x) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      Sf[r * SP + cc + e] = x[e];
      put(x[e], Sh, Sl, r * SB + cc + e);
    }
  });
  const int t_begin = cu[seq], t_end = cu[seq + 1];
  for (int t0 = t_begin; t0 < t_end; t0 += CH) {
    const int L = min(CH, t_end - t0);
    const size_t row0 = t0;
    __syncthreads();
    for_rows8(W + (row0 * HV + hv) * K, (size_t)HV * K, CH, L, K, K16, to_tile(Wh, Wl, KP));
    for_rows8(q + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Qh, Ql, KP));
    for_rows8(P + (row0 * HV + hv) * CH, (size_t)HV * CH, CH, L, CH, CH, to_tile(Ph, Pl, TP));
    if (tid < CH) G[tid] = Gin[(row0 + min(tid, L - 1)) * HV + hv];
    if (t0 + CH < t_end) {
      const size_t r1 = row0 + CH;
      const int L1 = min(CH, t_end - (t0 + CH));
      prefetch_l2<4 * 256>(W + (r1 * HV + hv) * K, (size_t)HV * K * 4, L1, K * 4);
      prefetch_l2<4 * 256>(q + (r1 * H + hk) * K, (size_t)H * K * sizeof(TI), L1, K * (int)sizeof(TI));
      prefetch_l2<4 * 256>(k + (r1 * H + hk) * K, (size_t)H * K * sizeof(TI), L1, K * (int)sizeof(TI));
      prefetch_l2<4 * CH>(P + (r1 * HV + hv) * CH, (size_t)HV * CH * 4, L1, CH * 4);
      prefetch_l2<4 * BV>(U + (r1 * HV + hv) * V + v0, (size_t)HV * V * 4, L1, vw * 4);
    }
    __syncthreads();

    // C1 = W S (warps 0–3), C2 = Q S (warps 4–7); a warp owns one 16-row band.
    {
      const int m = warp / 4, rt = warp % 4;
      FragC acc[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) wmma::fill_fragment(acc[j], 0.0f);
      const bf16* a_hi = (m ? Qh : Wh) + rt * 16 * KP;
      const bf16* a_lo = LO ? (m ? Ql : Wl) + rt * 16 * KP : nullptr;
      for (int kk = 0; kk < K16; kk += 16) {
        // The band's A fragments once per k-step, for all NT column tiles.
        FragA ah, al;
        wmma::load_matrix_sync(ah, a_hi + kk, KP);
        if (LO) wmma::load_matrix_sync(al, a_lo + kk, KP);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          FragB bh;
          wmma::load_matrix_sync(bh, Sh + kk * SB + j * 16, SB);
          wmma::mma_sync(acc[j], ah, bh, acc[j]);
          if (LO) {
            FragB bl;
            wmma::load_matrix_sync(bl, Sl + kk * SB + j * 16, SB);
            wmma::mma_sync(acc[j], al, bh, acc[j]);
            wmma::mma_sync(acc[j], ah, bl, acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < NT; ++j)
        wmma::store_matrix_sync((m ? C2 : C1) + rt * 16 * SP + j * 16, acc[j], SP, wmma::mem_row_major);
    }
    __syncthreads();

    // V' = U − W S; then Wh/Wl take e^{G_last − G} ⊙ K.
    for_rows8(U + (row0 * HV + hv) * V + v0, (size_t)HV * V, CH, L, vw, BV, [&](int r, int cc, const float* x) {
#pragma unroll
      for (int e = 0; e < 8; ++e) put(r < L ? x[e] - C1[r * SP + cc + e] : 0.0f, Vh, Vl, r * SB + cc + e);
    });
    const float g_last = G[CH - 1];
    for_rows8(k + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, [&](int r, int cc, const float* x) {
      const float d = __expf(g_last - G[r]);
#pragma unroll
      for (int e = 0; e < 8; ++e) put(x[e] * d, Wh, Wl, r * KP + cc + e);
    });
    __syncthreads();

    // C1 = P V' (P lower triangular), and S ← e^{G_last} S + Kdᵀ V'.
    for (int t = warp; t < 4 * NT; t += 8) {
      const int rt = t / NT, ct = t % NT;
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk <= rt; ++kk)
        mma_split<FragA, FragB>(acc, Ph + rt * 16 * TP + kk * 16, LO ? Pl + rt * 16 * TP + kk * 16 : nullptr, TP, Vh + kk * 16 * SB + ct * 16,
                                LO ? Vl + kk * 16 * SB + ct * 16 : nullptr, SB);
      wmma::store_matrix_sync(C1 + rt * 16 * SP + ct * 16, acc, SP, wmma::mem_row_major);
    }
    const float el = __expf(g_last);
    for (int t = warp; t < (K16 / 16) * NT; t += 8) {
      const int xt = t / NT, ct = t % NT;
      FragC acc;
      wmma::load_matrix_sync(acc, Sf + xt * 16 * SP + ct * 16, SP, wmma::mem_row_major);
#pragma unroll
      for (int e = 0; e < acc.num_elements; ++e) acc.x[e] *= el;
      for (int kk = 0; kk < CH; kk += 16)
        mma_split<FragAT, FragB>(acc, Wh + kk * KP + xt * 16, LO ? Wl + kk * KP + xt * 16 : nullptr, KP, Vh + kk * SB + ct * 16,
                                 LO ? Vl + kk * SB + ct * 16 : nullptr, SB);
      wmma::store_matrix_sync(Sf + xt * 16 * SP + ct * 16, acc, SP, wmma::mem_row_major);
    }
    __syncthreads();

    for (int i = tid; i < CH * BV; i += THREADS) {
      const int r = i / BV, cc = i % BV;
      if (r < L && cc < vw)
        o[((row0 + r) * HV + hv) * V + v0 + cc] = scale * (__expf(G[r]) * C2[r * SP + cc] + C1[r * SP + cc]);
    }
    for (int i = tid; i < K16 * BV; i += THREADS) {
      const int r = i / BV, cc = i % BV;
      put(Sf[r * SP + cc], Sh, Sl, r * SB + cc);
    }
    // A capture after this chunk: the state so far into snapshot slot snap − 1.
    const int d = has_snap ? snap[t0] : 0;
    if (d > 0) {
      float* Sd = states + ((size_t)(d - 1) * HV + hv) * K * V + v0;
      for (int i = tid; i < K * BV; i += THREADS) {
        const int r = i / BV, cc = i % BV;
        if (cc < vw) Sd[(size_t)r * V + cc] = Sf[r * SP + cc];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < K * BV; i += THREADS) {
    const int r = i / BV, cc = i % BV;
    if (cc < vw) Sg[(size_t)r * V + cc] = Sf[r * SP + cc];
  }
}

#define STATE_ENTRY(NAME, TI, BVV)                                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
      NAME(const TI* q, const TI* k, const float* W, const float* U, const float* P, const float* G, float* states,  \
           const int* cu, const int* slots, const int* snap, int has_snap, float* o, int H, int HV, int K, int V,     \
           float scale) { pdl_entry();                                                                                            \
    chunk_tc_state<TI, BVV>(q, k, W, U, P, G, states, cu, slots, snap, has_snap, o, H, HV, K, V, scale);            \
  }
STATE_ENTRY(chunk_tc_state_f32_bv64, float, 64)
STATE_ENTRY(chunk_tc_state_f32_bv32, float, 32)
STATE_ENTRY(chunk_tc_state_f32_bv16, float, 16)
