// Launch 2 of the chunked prefill for bf16 inputs (fla's precision), on raw mma.sync
// m16n8k16 with the state in registers. One CTA (8 warps) per (sequence, value head, BV-column
// tile) walks the sequence's chunks in order:
//   X = W S, Y = Q S                      (warps 0–3: W rows, warps 4–7: Q rows, 16 each)
//   V' = T2 V − X                         (warps 0–3, from their X registers; bf16 into shared
//                                          memory, as fla rounds it; U = T2 V is never stored;
//                                          meanwhile warps 4–7 compute the chunk's decays once)
//   O = scale (e^G ⊙ Y + P V')            (warps 4–7, from their Y registers)
//   S ← e^{G_last} S + (e^{G_last − G} ⊙ K)ᵀ V'   (every warp, on its own rows of S; the
//                                          decay scales the Kᵀ fragments in registers)
// S stays in fp32 accumulator registers; a bf16 copy in shared memory feeds the next chunk's
// X and Y. Chunk inputs arrive by cp.async in two groups: W and Q (needed first) into single
// buffers, refilled after X and Y; K, P, T2, V and G either into single buffers refilled at
// the chunk's end, their wait deferred until after X and Y, or (K ≤ 64, where shared memory
// allows it at two CTAs per SM) double-buffered and issued a whole chunk ahead. The rows the
// next loads will want are prefetched into L2 a chunk ahead (the tiles every value tile reads
// by one CTA of the head only), and with two CTAs per SM one CTA's loads overlap the other's
// work.
//
// KT: 16-row tiles of K the kernel is built for (4, 8 or 16; K is zero-padded up to 16·KT, so
// tile shapes and loops are compile-time).
#include "tc_common.cuh"

// Four 8×8 bf16 matrices; lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldsm4(unsigned (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldsm4_t(unsigned (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// d += a b (m16n8k16, bf16 operands, fp32 accumulators).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}

// acc (16 rows, NB·8 columns) += A B over nk k-steps of 16: A row-major from the band's first
// row (pitch lda), B row-major from its first row (pitch ldb).
template <int NB>
__device__ __forceinline__ void band_mma(float (&acc)[NB][4], const bf16* a, int lda, const bf16* b, int ldb, int nk) {
  const int lane = threadIdx.x & 31;
  a += (lane & 15) * lda + (lane >> 4) * 8;
  b += (lane & 15) * ldb + (lane >> 4) * 8;
#pragma unroll 2
  for (int kk = 0; kk < nk; ++kk) {
    unsigned af[4];
    ldsm4(af, a + kk * 16);
#pragma unroll
    for (int jp = 0; jp < NB / 2; ++jp) {
      unsigned bf[4];
      ldsm4_t(bf, b + kk * 16 * ldb + jp * 16);
      mma_bf16(acc[2 * jp], af, bf[0], bf[1]);
      mma_bf16(acc[2 * jp + 1], af, bf[2], bf[3]);
    }
  }
}

template <int KT, int BV>
__device__ void chunk_mma_state(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                long ldv, const bf16* __restrict__ W, const bf16* __restrict__ T2, const bf16* __restrict__ P,
                                const float* __restrict__ Gin,
                                float* __restrict__ states, const int* __restrict__ cu, const int* __restrict__ slots,
                                const int* __restrict__ snap, int has_snap, float* __restrict__ o, int H, int HV, int K,
                                int V, float scale) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr int SB = BV + 8, NB = BV / 8;
  // Rows of S per warp: KT ≥ 8 gives each warp KT/8 whole row tiles; KT = 4 splits each row
  // tile's columns between 8/KT warps.
  constexpr int RPW = KT > 8 ? KT / 8 : 1;
  constexpr int CS = KT < 8 ? 8 / KT : 1;
  constexpr int NBW = NB / CS;
  static_assert(NBW % 2 == 0, "S column groups come in pairs of n8 tiles");
  constexpr int K16 = KT * 16, KP = K16 + 8;
  Smem sm{smem_raw};
  bf16* Wt = sm.take<bf16>(CH * KP);
  bf16* Qt = sm.take<bf16>(CH * KP);
  bf16* K0 = sm.take<bf16>(CH * KP);
  bf16* P0 = sm.take<bf16>(CH * TP);
  bf16* Sb = sm.take<bf16>(K16 * SB);
  bf16* T20 = sm.take<bf16>(CH * TP);
  bf16* V0 = sm.take<bf16>(CH * SB);
  bf16* Vp = sm.take<bf16>(CH * SB);
  // The chunk's decays e^{G_last − G} and e^G (computed once per chunk), then its G.
  float* Dk = sm.take<float>(3 * CH);
  float* Eg = Dk + CH;
  float* G0 = Dk + 2 * CH;
  // With K ≤ 64 the tiles are small enough for two CTAs per SM to double-buffer the second
  // load group (K, P, T2, V, G): the next chunk's copy starts a whole chunk ahead, at the top of
  // this one, instead of after this chunk's state update.
  constexpr bool DB = KT <= 4;
  bf16* K1 = DB ? sm.take<bf16>(CH * KP) : K0;
  bf16* P1 = DB ? sm.take<bf16>(CH * TP) : P0;
  bf16* T21 = DB ? sm.take<bf16>(CH * TP) : T20;
  bf16* V1 = DB ? sm.take<bf16>(CH * SB) : V0;
  float* G1 = DB ? sm.take<float>(CH) : G0;

  const int hv = blockIdx.y, seq = blockIdx.z, v0 = blockIdx.x * BV;
  const int hk = hv / (HV / H);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
  const int vw = min(BV, V - v0);
  float* Sg = states + ((size_t)slots[seq] * HV + hv) * K * V + v0;

  // This warp's part of S: row tiles srt[r], n8 tiles sn0 .. sn0 + NBW.
  float s[RPW][NBW][4];
  int srt[RPW];
  const int sn0 = (warp % CS) * NBW;
#pragma unroll
  for (int r = 0; r < RPW; ++r) srt[r] = KT >= 8 ? warp + 8 * r : warp / CS;
  // Writes the bf16 copy of this warp's part of S.
  auto publish_s = [&]() {
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
#pragma unroll
      for (int j = 0; j < NBW; ++j) {
        const int row = srt[r] * 16 + g8, col = (sn0 + j) * 8 + 2 * t4;
        *reinterpret_cast<unsigned*>(Sb + row * SB + col) = pack_bf16(s[r][j][0], s[r][j][1]);
        *reinterpret_cast<unsigned*>(Sb + (row + 8) * SB + col) = pack_bf16(s[r][j][2], s[r][j][3]);
      }
    }
  };
  // Visits this warp's S entries with their address in the state `base` (Sg, or a snapshot's);
  // inside K × vw only.
  auto for_s_in = [&](float* base, auto f) {
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int j = 0; j < NBW; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = srt[r] * 16 + g8 + (e >> 1) * 8, col = (sn0 + j) * 8 + 2 * t4 + (e & 1);
          if (row < K && col < vw) f(s[r][j][e], base + (size_t)row * V + col);
        }
  };
  auto for_s = [&](auto f) { for_s_in(Sg, f); };
#pragma unroll
  for (int r = 0; r < RPW; ++r)
#pragma unroll
    for (int j = 0; j < NBW; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[r][j][e] = 0.0f;
  for_s([](float& x, const float* g) { x = *g; });
  publish_s();

  const int t_begin = cu[seq], t_end = cu[seq + 1];
  auto load_wq = [&](int t0, int L) {
    tile_async<CH, K16>(Wt, KP, W + ((size_t)t0 * HV + hv) * K, (size_t)HV * K, L, K);
    tile_async<CH, K16>(Qt, KP, q + ((size_t)t0 * H + hk) * K, (size_t)H * K, L, K);
  };
  auto load_kpug = [&](int t0, int L, int buf) {
    tile_async<CH, K16>((buf ? K1 : K0), KP, k + ((size_t)t0 * H + hk) * K, (size_t)H * K, L, K);
    tile_async<CH, CH>((buf ? P1 : P0), TP, P + ((size_t)t0 * HV + hv) * CH, (size_t)HV * CH, L, CH);
    tile_async<CH, CH>((buf ? T21 : T20), TP, T2 + ((size_t)t0 * HV + hv) * CH, (size_t)HV * CH, L, CH);
    tile_async<CH, BV>((buf ? V1 : V0), SB, v + (size_t)t0 * ldv + (size_t)hv * V + v0, (size_t)ldv, L, vw);
    if (tid < CH) cp_async4((buf ? G1 : G0) + tid, Gin + ((size_t)t0 + min(tid, L - 1)) * HV + hv);
  };
  if (t_begin < t_end) {
    load_wq(t_begin, min(CH, t_end - t_begin));
    cp_async_commit();
    load_kpug(t_begin, min(CH, t_end - t_begin), 0);
    cp_async_commit();
  }
  const int m = warp >> 2, rt = warp & 3;  // m = 0: X = W S, m = 1: Y = Q S; rt: 16-row band
  for (int t0 = t_begin, buf = 0; t0 < t_end; t0 += CH, buf ^= DB) {
    const int L = min(CH, t_end - t0);
    const bool more = t0 + CH < t_end;
    const int L1 = more ? min(CH, t_end - (t0 + CH)) : 0;
    const bf16 *Kt = (buf ? K1 : K0), *Pt = (buf ? P1 : P0), *T2t = (buf ? T21 : T20), *Vt = (buf ? V1 : V0);
    const float* G = (buf ? G1 : G0);
    if constexpr (DB) {
      cp_async_wait<0>();  // this chunk's W and Q, and its second group (issued a chunk ago)
    } else {
      cp_async_wait<1>();  // W and Q; K, P, T2, V and G may still be in flight
    }
    __syncthreads();
    if (more) {
      const size_t r1 = t0 + CH;
      if constexpr (DB) {
        // The other buffer's chunk finished before the barrier above.
        load_kpug(t0 + CH, L1, buf ^ 1);
        cp_async_commit();
      }
      if (blockIdx.x == 0) {  // the tiles every value tile reads: one CTA asks for them
        prefetch_l2<2 * K16>(W + (r1 * HV + hv) * K, (size_t)HV * K * 2, L1, K * 2);
        prefetch_l2<2 * K16>(q + (r1 * H + hk) * K, (size_t)H * K * 2, L1, K * 2);
        if constexpr (!DB) {
          prefetch_l2<2 * K16>(k + (r1 * H + hk) * K, (size_t)H * K * 2, L1, K * 2);
          prefetch_l2<2 * CH>(P + (r1 * HV + hv) * CH, (size_t)HV * CH * 2, L1, CH * 2);
          prefetch_l2<2 * CH>(T2 + (r1 * HV + hv) * CH, (size_t)HV * CH * 2, L1, CH * 2);
        }
      }
      if constexpr (!DB) prefetch_l2<2 * BV>(v + r1 * ldv + (size_t)hv * V + v0, (size_t)ldv * 2, L1, vw * 2);
    }

    float acc[NB][4];
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    band_mma<NB>(acc, (m ? Qt : Wt) + rt * 16 * KP, KP, Sb, SB, KT);
    if constexpr (!DB) cp_async_wait<0>();
    __syncthreads();  // K, P, T2, V and G are in; W, Q and the bf16 S are consumed
    if (more) {
      load_wq(t0 + CH, L1);
      cp_async_commit();
    }

    const float g_last = G[CH - 1];
    if (m == 0) {
      // V' = T2 V − X (T2 lower triangular: k-steps up to the band).
#pragma unroll
      for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = -acc[j][e];
      band_mma<NB>(acc, T2t + rt * 16 * TP, TP, Vt, SB, rt + 1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rt * 16 + g8 + 8 * h;
#pragma unroll
        for (int j = 0; j < NB; ++j)
          *reinterpret_cast<unsigned*>(Vp + r * SB + j * 8 + 2 * t4) = pack_bf16(acc[j][2 * h], acc[j][2 * h + 1]);
      }
    } else {
      // Meanwhile the Y warps work out the chunk's decays, once for every warp.
      const int t = tid - 128;
      if (t < CH) Dk[t] = __expf(g_last - G[t]);
      else Eg[t - CH] = __expf(G[t - CH]);
    }
    __syncthreads();

    if (m == 1) {
      // O = scale (e^G ⊙ Y + P V'); P is lower triangular, so k-steps stop at the band.
      const float e0 = Eg[rt * 16 + g8], e1 = Eg[rt * 16 + g8 + 8];
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        acc[j][0] *= e0, acc[j][1] *= e0, acc[j][2] *= e1, acc[j][3] *= e1;
      }
      band_mma<NB>(acc, Pt + rt * 16 * TP, TP, Vp, SB, rt + 1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rt * 16 + g8 + 8 * h;
        if (r >= L) continue;
        float* dst = o + ((size_t)(t0 + r) * HV + hv) * V + v0;
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const int col = j * 8 + 2 * t4;
          const float a = scale * acc[j][2 * h], b = scale * acc[j][2 * h + 1];
          if (V % 2 == 0 && col + 1 < vw) {
            *reinterpret_cast<float2*>(dst + col) = make_float2(a, b);
          } else {
            if (col < vw) dst[col] = a;
            if (col + 1 < vw) dst[col + 1] = b;
          }
        }
      }
    }

    // S ← e^{G_last} S + (e^{G_last − G} ⊙ K)ᵀ V': A = Kᵀ (ldmatrix.trans of the row-major K
    // tile), each column t scaled by its decay in registers; B = V'.
    const float el = Eg[CH - 1];
    __nv_bfloat162 dk[CH / 16][2];  // decays of columns 2·t4 (+1) and 8 + 2·t4 (+1) per k-step
#pragma unroll
    for (int kk = 0; kk < CH / 16; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = kk * 16 + 8 * h + 2 * t4;
        dk[kk][h] = __floats2bfloat162_rn(Dk[t], Dk[t + 1]);
      }
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
#pragma unroll
      for (int j = 0; j < NBW; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[r][j][e] *= el;
      const int mx = lane >> 3;
      const bf16* a_base = Kt + ((mx >> 1) * 8 + (lane & 7)) * KP + srt[r] * 16 + (mx & 1) * 8;
#pragma unroll
      for (int kk = 0; kk < CH / 16; ++kk) {
        unsigned a[4];
        ldsm4_t(a, a_base + kk * 16 * KP);
        // a0, a1 hold columns 2·t4 (+1) of the k-step; a2, a3 columns 8 + 2·t4 (+1).
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a[e]);
          x = __hmul2(x, dk[kk][e >> 1]);
          a[e] = *reinterpret_cast<unsigned*>(&x);
        }
#pragma unroll
        for (int jp = 0; jp < NBW / 2; ++jp) {
          unsigned b[4];
          ldsm4_t(b, Vp + (kk * 16 + (lane & 15)) * SB + (sn0 + 2 * jp) * 8 + (lane >> 4) * 8);
          mma_bf16(s[r][2 * jp], a, b[0], b[1]);
          mma_bf16(s[r][2 * jp + 1], a, b[2], b[3]);
        }
      }
    }
    publish_s();
    // A capture after this chunk: this warp's part of the state into snapshot slot snap − 1.
    const int d = has_snap ? snap[t0] : 0;
    if (d > 0) for_s_in(states + ((size_t)(d - 1) * HV + hv) * K * V + v0, [](float& x, float* g) { *g = x; });
    __syncthreads();  // K, P, T2, V, G and V' consumed; the bf16 S is complete
    if (!DB && more) {
      load_kpug(t0 + CH, L1, 0);
      cp_async_commit();
    }
  }

  for_s([](float& x, float* g) { *g = x; });
}

// Two CTAs per SM where KT ≤ 8 (registers ≤ 128 per thread), one at KT = 16.
#define MMA_ENTRY(KT, BV, MINB)                                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                                        \
      chunk_mma_state_k##KT##_bv##BV(const bf16* q, const bf16* k, const bf16* v, long ldv, const bf16* W,           \
                                     const bf16* T2, const bf16* P, const float* G, float* states, const int* cu, const int* slots,  \
                                     const int* snap, int has_snap, float* o, int H, int HV, int K, int V,          \
                                     float scale) { pdl_entry();                                                                  \
    chunk_mma_state<KT, BV>(q, k, v, ldv, W, T2, P, G, states, cu, slots, snap, has_snap, o, H, HV, K, V, scale);   \
  }
MMA_ENTRY(4, 32, 2)
MMA_ENTRY(4, 64, 2)
MMA_ENTRY(8, 32, 2)
MMA_ENTRY(8, 64, 2)
MMA_ENTRY(16, 32, 1)
MMA_ENTRY(16, 64, 1)
