// Launch 2 of the chunked prefill (chunk_prep.cu has launch 1), on raw mma.sync m16n8k16 with
// the state in registers. One CTA (8 warps) per (sequence, value head, BV-column tile) walks
// the sequence's chunks in order:
//   X = W S, Y = Q S                      (warps 0–3: W rows, warps 4–7: Q rows, 16 each)
//   V' = U − X                            (warps 0–3, from their X registers; meanwhile warps
//                                          4–7 compute the chunk's decays once)
//   O = scale (e^G ⊙ Y + P V')            (warps 4–7, from their Y registers)
//   S ← e^{G_last} S + (e^{G_last − G} ⊙ K)ᵀ V'   (every warp, on its own rows of S)
// S stays in fp32 accumulator registers; a bf16 copy in shared memory feeds the next chunk's
// products.
//
// bf16 inputs need no W: since W = T diag(β e^G) K and U = T2 V with T2 = T diag(β),
// V' = T2 (V − e^G ⊙ K S). Warps 0–3 form Z = K S from the key tile the state update reads
// anyway, write R = V − e^G ⊙ Z over the V tile and take V' = T2 R: a 64-wide product in place
// of a K-wide tile per chunk from L2, which every value tile of a head reads again. The keys
// arrive a chunk ahead into a second buffer; Q after X and Y are formed; P, T2, V and G in a
// second group at the chunk's end, or double-buffered and issued a whole chunk ahead: with
// K ≤ 64, where shared memory allows it at two CTAs per SM, and in the _db entries, for grids
// of one CTA an SM (a single long prompt), which also unroll every k-step of X and Y. f32
// inputs load W and Q after X and Y, the decayed keys, P, U and G at the chunk's end. The rows
// the next loads will want are prefetched into L2 a chunk ahead (the tiles every value tile
// reads by one CTA of the head only). bf16 tiles from aligned sources come by cp.async alone
// (tile_rows: the alignment checked once a pass, not per tile).
//
// Precision (LO): bf16 inputs use single bf16 operands and round R and V' to bf16 (fla rounds
// U, W and V'); the decay scales K's fragments in registers for the state update. f32 inputs
// take every operand as a bf16 hi + lo pair (chunk_prep.cu), three products in place of one
// (the lo·lo term dropped), so that V' = U − W S, which cancels when the state already predicts
// v well, keeps ~16 mantissa bits; the keys come decayed from the prep launch. Each split tile
// keeps its lo half right after its hi half. With K > 128 the split tiles leave no room for a
// key tile of its own: the decayed keys are loaded into W's buffer once X is formed, and the
// next W after the state update.
//
// KT: 16-row tiles of K the kernel is built for (4, 8 or 16; K is zero-padded up to 16·KT, so
// tile shapes and loops are compile-time).
#pragma once
#include "dtype.cuh"
#include "state_io.cuh"
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
// row (pitch lda), B row-major from its first row (pitch ldb). With LO both are hi + lo pairs,
// the lo halves alo and blo elements after the hi ones: hi·hi + hi·lo + lo·hi.
// U: k-steps unrolled together (their loads issued ahead of their products).
template <int NB, bool LO = false, int U = 2>
__device__ __forceinline__ void band_mma(float (&acc)[NB][4], const bf16* a, int lda, const bf16* b, int ldb, int nk,
                                         int alo = 0, int blo = 0) {
  const int lane = threadIdx.x & 31;
  a += (lane & 15) * lda + (lane >> 4) * 8;
  b += (lane & 15) * ldb + (lane >> 4) * 8;
#pragma unroll U
  for (int kk = 0; kk < nk; ++kk) {
    unsigned af[4], al[4];
    ldsm4(af, a + kk * 16);
    if constexpr (LO) ldsm4(al, a + alo + kk * 16);
#pragma unroll
    for (int jp = 0; jp < NB / 2; ++jp) {
      unsigned bf[4];
      ldsm4_t(bf, b + kk * 16 * ldb + jp * 16);
      mma_bf16(acc[2 * jp], af, bf[0], bf[1]);
      mma_bf16(acc[2 * jp + 1], af, bf[2], bf[3]);
      if constexpr (LO) {
        unsigned bl[4];
        ldsm4_t(bl, b + blo + kk * 16 * ldb + jp * 16);
        mma_bf16(acc[2 * jp], af, bl[0], bl[1]);
        mma_bf16(acc[2 * jp + 1], af, bl[2], bl[3]);
        mma_bf16(acc[2 * jp], al, bf[0], bf[1]);
        mma_bf16(acc[2 * jp + 1], al, bf[2], bf[3]);
      }
    }
  }
}

// The state pass's global inputs. bf16 inputs: q, k per key head ([rows, H, K]), v's rows ldv
// apart, T2, P (no W). f32 inputs (the lo pointers set): q per key head and the decayed keys per
// value head ([rows, HV, K]) as hi + lo pairs, U in fp32 [rows, HV, V], W and P as pairs.
struct ChunkIn {
  const bf16 *q, *ql, *k, *kl, *v;
  long ldv;
  const float* U;
  const bf16 *W, *Wl, *T2, *P, *Pl;
  const float* G;
};

template <int KT, int BV, bool LO, bool DBUF = false, typename TS = float, typename TO = float>
__device__ void chunk_mma_state(const ChunkIn& in, TS* __restrict__ states, const int* __restrict__ cu,
                                const int* __restrict__ slots, const int* __restrict__ snap, int has_snap,
                                TO* __restrict__ o, int H, int HV, int K, int V, float scale) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr int SB = BV + 8, NB = BV / 8, UP = BV + 4;
  // Rows of S per warp: KT ≥ 8 gives each warp KT/8 whole row tiles; KT = 4 splits each row
  // tile's columns between 8/KT warps.
  constexpr int RPW = KT > 8 ? KT / 8 : 1;
  constexpr int CS = KT < 8 ? 8 / KT : 1;
  constexpr int NBW = NB / CS;
  static_assert(NBW % 2 == 0, "S column groups come in pairs of n8 tiles");
  constexpr int K16 = KT * 16, KP = K16 + 8;
  // Elements of each tile kind: a split tile holds its lo half this far after its hi half.
  constexpr int KTILE = CH * KP, PTILE = CH * TP, STILE = K16 * SB, VTILE = CH * SB;
  constexpr int NS = LO ? 2 : 1;
  // With K ≤ 64 and bf16 inputs the tiles are small enough for two CTAs per SM to
  // double-buffer the second load group (P, T2, V, G): the next chunk's copy starts a whole
  // chunk ahead, at the top of this one, instead of after this chunk's state update. DBUF asks
  // for it at any K, for grids of one CTA an SM, where the shared memory is there anyway.
  static_assert(!(DBUF && LO), "split operands have no room for a second load group");
  constexpr bool DB = (KT <= 4 && !LO) || DBUF;
  // Split tiles with K > 128: the decayed keys take W's buffer (see the header).
  constexpr bool KW = LO && KT > 8;
  Smem sm{smem_raw};
  bf16* Wt = LO ? sm.take<bf16>(NS * KTILE) : nullptr;
  bf16* Qt = sm.take<bf16>(NS * KTILE);
  bf16* K0 = KW ? Wt : sm.take<bf16>(NS * KTILE);
  bf16* P0 = sm.take<bf16>(NS * PTILE);
  bf16* Sb = sm.take<bf16>(NS * STILE);
  bf16* T20 = LO ? nullptr : sm.take<bf16>(PTILE);
  bf16* V0 = LO ? nullptr : sm.take<bf16>(VTILE);
  float* U0 = LO ? sm.take<float>(CH * UP) : nullptr;
  bf16* Vp = sm.take<bf16>(NS * VTILE);
  // The chunk's decays e^{G_last − G} and e^G (computed once per chunk), then its G.
  float* Dk = sm.take<float>(3 * CH);
  float* Eg = Dk + CH;
  float* G0 = Dk + 2 * CH;
  // bf16 inputs: the keys, needed first, arrive a chunk ahead into a second buffer.
  bf16* K1 = LO ? K0 : sm.take<bf16>(KTILE);
  bf16* P1 = DB ? sm.take<bf16>(PTILE) : P0;
  bf16* T21 = DB ? sm.take<bf16>(PTILE) : T20;
  bf16* V1 = DB ? sm.take<bf16>(VTILE) : V0;
  float* G1 = DB ? sm.take<float>(CH) : G0;

  const int hv = blockIdx.y, seq = blockIdx.z, v0 = blockIdx.x * BV;
  const int hk = hv / (HV / H);
  // bf16 inputs' keys are per key head; f32 inputs' decayed keys per value head.
  const int kh = LO ? hv : hk, KH = LO ? HV : H;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
  const int vw = min(BV, V - v0);
  TS* Sg = states + ((size_t)slots[seq] * HV + hv) * K * V + v0;

  // Two values into a tile as bf16 (and, for split operands, their remainders a tile later).
  auto put2 = [&](bf16* tile, int plane, int at, float a, float b) {
    const unsigned hi = pack_bf16(a, b);
    *reinterpret_cast<unsigned*>(tile + at) = hi;
    if constexpr (LO) {
      const float2 h = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi));
      *reinterpret_cast<unsigned*>(tile + plane + at) = pack_bf16(a - h.x, b - h.y);
    }
  };

  // This warp's part of S: row tiles srt[r], n8 tiles sn0 .. sn0 + NBW.
  float s[RPW][NBW][4];
  int srt[RPW];
  const int sn0 = (warp % CS) * NBW;
#pragma unroll
  for (int r = 0; r < RPW; ++r) srt[r] = KT >= 8 ? warp + 8 * r : warp / CS;
  // Writes the bf16 copy (or pair) of this warp's part of S.
  auto publish_s = [&]() {
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
#pragma unroll
      for (int j = 0; j < NBW; ++j) {
        const int row = srt[r] * 16 + g8, col = (sn0 + j) * 8 + 2 * t4;
        put2(Sb, STILE, row * SB + col, s[r][j][0], s[r][j][1]);
        put2(Sb, STILE, (row + 8) * SB + col, s[r][j][2], s[r][j][3]);
      }
    }
  };
  // Visits this warp's S entries with their address in the state `base` (Sg, or a snapshot's);
  // inside K × vw only. One access an entry: the fallback of issue_s / store_s.
  auto for_s_in = [&](TS* base, auto f) {
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
  // S moves to and from memory 16 bytes at a time where rows of four columns are aligned: lanes
  // t4 and t4 ^ 1 trade half their entries of each n8 tile, so that an even t4 holds four
  // columns of row g8 and an odd one the same four of row g8 + 8. A single-chunk pass (a chat
  // turn, a short prompt) spends most of its time loading and storing S, and 4-byte accesses
  // filled the load/store queue (Nsight Compute: lg throttle on 27% of the samples).
  const bool odd = t4 & 1;
  const int row4 = g8 + (odd ? 8 : 0), col4 = (t4 >> 1) * 4;
  auto vec4_ok = [&](const TS* base) { return V % 4 == 0 && reinterpret_cast<uintptr_t>(base) % (4 * sizeof(TS)) == 0; };
  // S from `base` in two steps: issue_s puts every load in flight (rows of four columns as they
  // lie), trade_s, once they are needed, makes them the accumulator layout.
  const bool s_vec4 = vec4_ok(Sg);
  // bf16 states: the loads' bits, unpacked by trade_s (state_io.cuh's Bf16Raw).
  constexpr bool S16 = !std::is_same_v<TS, float>;
  Bf16Raw<4> sraw[S16 ? RPW : 1][S16 ? NBW : 1];
  auto issue_s = [&]() {
    if (!s_vec4) {
#pragma unroll
      for (int r = 0; r < RPW; ++r)
#pragma unroll
        for (int j = 0; j < NBW; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[r][j][e] = 0.0f;
      for_s_in(Sg, [](float& x, const TS* g) {
        float one[1];
        state_load<1, false>(one, g);
        x = one[0];
      });
      return;
    }
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int j = 0; j < NBW; ++j) {
        const int row = srt[r] * 16 + row4, col = (sn0 + j) * 8 + col4;
        if constexpr (S16) {
          sraw[r][j] = Bf16Raw<4>{};
          if (row < K && col < vw) load_raw<4, false>(sraw[r][j], Sg + (size_t)row * V + col);
        } else {
          float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if (row < K && col < vw) state_load<4, false>(x, Sg + (size_t)row * V + col);
          s[r][j][0] = x[0], s[r][j][1] = x[1], s[r][j][2] = x[2], s[r][j][3] = x[3];
        }
      }
  };
  auto trade_s = [&]() {
    if (!s_vec4) return;
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int j = 0; j < NBW; ++j) {
        if constexpr (S16) unpack(s[r][j], sraw[S16 ? r : 0][S16 ? j : 0]);
        float* x = s[r][j];
        // Even lanes keep row g8 (their e = 0, 1, then the partner's), odd ones row g8 + 8.
        const float a = __shfl_xor_sync(0xffffffffu, odd ? x[0] : x[2], 1);
        const float b = __shfl_xor_sync(0xffffffffu, odd ? x[1] : x[3], 1);
        if (odd) {
          x[0] = a, x[1] = b;
        } else {
          x[2] = a, x[3] = b;
        }
      }
  };
  // Nothing before this pass's prep launch writes S (the prep launch triggers this one early in a
  // graph, programmatic edges): its loads go out before the wait for the prep's outputs, while
  // the prep runs on the other multiprocessors.
  issue_s();
  pdl_entry();

  // S to `base`; S itself unchanged.
  auto store_s = [&](TS* base) {
    if (!vec4_ok(base)) {
      for_s_in(base, [](float& x, TS* g) { state_store<1, false>(g, {x}); });
      return;
    }
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int j = 0; j < NBW; ++j) {
        const float* x = s[r][j];
        const float a = __shfl_xor_sync(0xffffffffu, odd ? x[0] : x[2], 1);
        const float b = __shfl_xor_sync(0xffffffffu, odd ? x[1] : x[3], 1);
        const float y[4] = {odd ? a : x[0], odd ? b : x[1], odd ? x[2] : a, odd ? x[3] : b};
        const int row = srt[r] * 16 + row4, col = (sn0 + j) * 8 + col4;
        if (row < K && col < vw) state_store<4, false>(base + (size_t)row * V + col, y);
      }
  };

  const int t_begin = cu[seq], t_end = cu[seq + 1];
  // bf16 inputs: which sources the cp.async-only loader takes (checked once, not per tile).
  const auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool fast_qk = !LO && K % 8 == 0 && al16(in.q) && al16(in.k);
  const bool fast_v = !LO && V % 8 == 0 && in.ldv % 8 == 0 && al16(in.v);
  const bool fast_p = !LO && al16(in.P) && al16(in.T2);
  // A [64, K16] tile of rows t0.. of a [rows, heads, K] matrix (and its lo half).
  auto load_k16 = [&](bf16* dst, const bf16* hi, const bf16* lo, int heads, int head, int t0, int L) {
    const size_t at = ((size_t)t0 * heads + head) * K;
    if (fast_qk) {
      tile_rows<CH, K16>(dst, KP, hi + at, (size_t)heads * K, L, K);
    } else {
      tile_async<CH, K16>(dst, KP, hi + at, (size_t)heads * K, L, K);
    }
    if constexpr (LO) tile_async<CH, K16>(dst + KTILE, KP, lo + at, (size_t)heads * K, L, K);
  };
  // A [64, 64] tile of rows t0.. of P or T2 ([rows, HV, 64], bf16).
  auto load_p = [&](bf16* dst, const bf16* src, size_t prow, int L) {
    if (fast_p) {
      tile_rows<CH, CH>(dst, TP, src + prow, (size_t)HV * CH, L, CH);
    } else {
      tile_async<CH, CH>(dst, TP, src + prow, (size_t)HV * CH, L, CH);
    }
  };
  auto load_w = [&](int t0, int L) { load_k16(Wt, in.W, in.Wl, HV, hv, t0, L); };
  auto load_q = [&](int t0, int L) { load_k16(Qt, in.q, in.ql, H, hk, t0, L); };
  auto load_k = [&](bf16* dst, int t0, int L) { load_k16(dst, in.k, in.kl, KH, kh, t0, L); };
  // The second group: K (unless it waits for W's buffer), P, U's inputs and G.
  auto load_kpug = [&](int t0, int L, int buf) {
    if constexpr (LO && !KW) load_k(K0, t0, L);
    const size_t prow = ((size_t)t0 * HV + hv) * CH;
    load_p((buf ? P1 : P0), in.P, prow, L);
    if constexpr (LO) {
      tile_async<CH, CH>((buf ? P1 : P0) + PTILE, TP, in.Pl + prow, (size_t)HV * CH, L, CH);
      // fp32 rows copied as twice as many bf16 (bytes are bytes).
      tile_async<CH, 2 * BV>(reinterpret_cast<bf16*>(U0), 2 * UP,
                             reinterpret_cast<const bf16*>(in.U + ((size_t)t0 * HV + hv) * V + v0), (size_t)2 * HV * V, L,
                             2 * vw);
    } else {
      load_p((buf ? T21 : T20), in.T2, prow, L);
      const bf16* vrows = in.v + (size_t)t0 * in.ldv + (size_t)hv * V + v0;
      if (fast_v) {
        tile_rows<CH, BV>((buf ? V1 : V0), SB, vrows, (size_t)in.ldv, L, vw);
      } else {
        tile_async<CH, BV>((buf ? V1 : V0), SB, vrows, (size_t)in.ldv, L, vw);
      }
    }
    if (tid < CH) cp_async4((buf ? G1 : G0) + tid, in.G + ((size_t)t0 + min(tid, L - 1)) * HV + hv);
  };
  if (t_begin < t_end) {
    const int L = min(CH, t_end - t_begin);
    if constexpr (LO) {
      load_w(t_begin, L);
    } else {
      load_k(K0, t_begin, L);
    }
    load_q(t_begin, L);
    cp_async_commit();
    load_kpug(t_begin, L, 0);
    cp_async_commit();
  }
  // S's loads and the first chunk's copies are in flight together.
  trade_s();
  publish_s();
  // m = 0: X = W S (f32 inputs) or Z = K S (bf16 inputs), m = 1: Y = Q S; rt: 16-row band.
  const int m = warp >> 2, rt = warp & 3;
  for (int t0 = t_begin, buf = 0, kb = 0; t0 < t_end; t0 += CH, buf ^= DB, kb ^= !LO) {
    const int L = min(CH, t_end - t0);
    const bool more = t0 + CH < t_end;
    const int L1 = more ? min(CH, t_end - (t0 + CH)) : 0;
    const bf16 *Kt = (kb ? K1 : K0), *Pt = (buf ? P1 : P0), *T2t = (buf ? T21 : T20);
    bf16* Vt = (buf ? V1 : V0);
    const float* G = (buf ? G1 : G0);
    if constexpr (DB || KW) {
      cp_async_wait<0>();  // W or K, and Q, and the second group (DB: issued a chunk ago)
    } else {
      cp_async_wait<1>();  // W or K, and Q; the second group may still be in flight
    }
    __syncthreads();
    if (more) {
      const size_t r1 = t0 + CH;
      if constexpr (!LO) {
        // The other buffers' chunk finished before the barrier above.
        load_k(kb ? K0 : K1, t0 + CH, L1);
        if constexpr (DB) load_kpug(t0 + CH, L1, buf ^ 1);
        cp_async_commit();
      }
      if (blockIdx.x == 0) {  // the tiles every value tile reads: one CTA asks for them
        prefetch_l2<2 * K16>(in.q + (r1 * H + hk) * K, (size_t)H * K * 2, L1, K * 2);
        if constexpr (LO) {
          prefetch_l2<2 * K16>(in.W + (r1 * HV + hv) * K, (size_t)HV * K * 2, L1, K * 2);
          prefetch_l2<2 * K16>(in.Wl + (r1 * HV + hv) * K, (size_t)HV * K * 2, L1, K * 2);
          prefetch_l2<2 * K16>(in.ql + (r1 * H + hk) * K, (size_t)H * K * 2, L1, K * 2);
          prefetch_l2<2 * K16>(in.k + (r1 * KH + kh) * K, (size_t)KH * K * 2, L1, K * 2);
        }
        if constexpr (!DB) {
          prefetch_l2<2 * CH>(in.P + (r1 * HV + hv) * CH, (size_t)HV * CH * 2, L1, CH * 2);
          if constexpr (LO) {
            prefetch_l2<2 * K16>(in.kl + (r1 * KH + kh) * K, (size_t)KH * K * 2, L1, K * 2);
            prefetch_l2<2 * CH>(in.Pl + (r1 * HV + hv) * CH, (size_t)HV * CH * 2, L1, CH * 2);
          } else {
            prefetch_l2<2 * CH>(in.T2 + (r1 * HV + hv) * CH, (size_t)HV * CH * 2, L1, CH * 2);
          }
        }
      }
      if constexpr (LO) {
        prefetch_l2<4 * BV>(in.U + (r1 * HV + hv) * V + v0, (size_t)HV * V * 4, L1, vw * 4);
      } else if constexpr (!DB) {
        prefetch_l2<2 * BV>(in.v + r1 * in.ldv + (size_t)hv * V + v0, (size_t)in.ldv * 2, L1, vw * 2);
      }
    }

    float acc[NB][4];
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    // One CTA an SM (DBUF) leaves the registers to unroll every k-step.
    band_mma<NB, LO, DBUF ? KT : 2>(acc, (m ? Qt : LO ? Wt : Kt) + rt * 16 * KP, KP, Sb, SB, KT, KTILE, STILE);
    if constexpr (LO && !KW) {
      cp_async_wait<0>();
    } else if constexpr (!LO && !DB) {
      // The second group is older than the next chunk's keys, which may stay in flight.
      if (more) {
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
    }
    __syncthreads();  // the second group is in; W, Q and the bf16 S are consumed
    if constexpr (KW) {
      load_k(Wt, t0, L);  // this chunk's decayed keys, into W's buffer
      if (more) load_q(t0 + CH, L1);
      cp_async_commit();
    } else if (more) {
      if constexpr (LO) load_w(t0 + CH, L1);
      load_q(t0 + CH, L1);
      cp_async_commit();
    }

    const float g_last = G[CH - 1];
    if (m == 0) {
      if constexpr (LO) {
        // V' = U − X.
#pragma unroll
        for (int j = 0; j < NB; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = rt * 16 + g8 + (e >> 1) * 8, col = j * 8 + 2 * t4 + (e & 1);
            acc[j][e] = U0[r * UP + col] - acc[j][e];
          }
      } else {
        // V' = U − W S = T2 (V − e^G ⊙ K S): R = V − e^G ⊙ Z over V in place (each lane its
        // own entries), then V' = T2 R (T2 lower triangular: k-steps up to the band) once the
        // four bands are written.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = rt * 16 + g8 + 8 * h;
          const float eg = __expf(G[r]);
#pragma unroll
          for (int j = 0; j < NB; ++j) {
            unsigned* at = reinterpret_cast<unsigned*>(Vt + r * SB + j * 8 + 2 * t4);
            const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at));
            *at = pack_bf16(x.x - eg * acc[j][2 * h], x.y - eg * acc[j][2 * h + 1]);
          }
        }
        asm volatile("bar.sync 1, 128;" ::: "memory");  // warps 0–3 only
#pragma unroll
        for (int j = 0; j < NB; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
        band_mma<NB>(acc, T2t + rt * 16 * TP, TP, Vt, SB, rt + 1);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rt * 16 + g8 + 8 * h;
#pragma unroll
        for (int j = 0; j < NB; ++j) put2(Vp, VTILE, r * SB + j * 8 + 2 * t4, acc[j][2 * h], acc[j][2 * h + 1]);
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
      band_mma<NB, LO>(acc, Pt + rt * 16 * TP, TP, Vp, SB, rt + 1, PTILE, VTILE);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rt * 16 + g8 + 8 * h;
        if (r >= L) continue;
        TO* dst = o + ((size_t)(t0 + r) * HV + hv) * V + v0;
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const int col = j * 8 + 2 * t4;
          const float a = scale * acc[j][2 * h], b = scale * acc[j][2 * h + 1];
          if (V % 2 == 0 && col + 1 < vw) {
            if constexpr (std::is_same_v<TO, float>) {
              *reinterpret_cast<float2*>(dst + col) = make_float2(a, b);
            } else {
              *reinterpret_cast<__nv_bfloat162*>(dst + col) = __floats2bfloat162_rn(a, b);
            }
          } else {
            if (col < vw) dst[col] = from_f32<TO>(a);
            if (col + 1 < vw) dst[col + 1] = from_f32<TO>(b);
          }
        }
      }
    }
    if constexpr (KW) {
      cp_async_wait<0>();  // the decayed keys (and the next Q)
      __syncthreads();
    }

    // S ← e^{G_last} S + (e^{G_last − G} ⊙ K)ᵀ V': A = Kᵀ (ldmatrix.trans of the row-major K
    // tile; bf16 inputs scale each column t by its decay in registers), B = V'.
    const float el = Eg[CH - 1];
    __nv_bfloat162 dk[CH / 16][2];  // decays of columns 2·t4 (+1) and 8 + 2·t4 (+1) per k-step
    if constexpr (!LO) {
#pragma unroll
      for (int kk = 0; kk < CH / 16; ++kk)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int t = kk * 16 + 8 * h + 2 * t4;
          dk[kk][h] = __floats2bfloat162_rn(Dk[t], Dk[t + 1]);
        }
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
        unsigned a[4], al[4];
        ldsm4_t(a, a_base + kk * 16 * KP);
        if constexpr (LO) {
          ldsm4_t(al, a_base + KTILE + kk * 16 * KP);
        } else {
          // a0, a1 hold columns 2·t4 (+1) of the k-step; a2, a3 columns 8 + 2·t4 (+1).
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a[e]);
            x = __hmul2(x, dk[kk][e >> 1]);
            a[e] = *reinterpret_cast<unsigned*>(&x);
          }
        }
#pragma unroll
        for (int jp = 0; jp < NBW / 2; ++jp) {
          const int at = (kk * 16 + (lane & 15)) * SB + (sn0 + 2 * jp) * 8 + (lane >> 4) * 8;
          unsigned b[4];
          ldsm4_t(b, Vp + at);
          mma_bf16(s[r][2 * jp], a, b[0], b[1]);
          mma_bf16(s[r][2 * jp + 1], a, b[2], b[3]);
          if constexpr (LO) {
            unsigned bl[4];
            ldsm4_t(bl, Vp + VTILE + at);
            mma_bf16(s[r][2 * jp], a, bl[0], bl[1]);
            mma_bf16(s[r][2 * jp + 1], a, bl[2], bl[3]);
            mma_bf16(s[r][2 * jp], al, b[0], b[1]);
            mma_bf16(s[r][2 * jp + 1], al, b[2], b[3]);
          }
        }
      }
    }
    publish_s();
    // A capture after this chunk: this warp's part of the state into snapshot slot snap − 1.
    const int d = has_snap ? snap[t0] : 0;
    if (d > 0) store_s(states + ((size_t)(d - 1) * HV + hv) * K * V + v0);
    __syncthreads();  // K, P, U's inputs, G and V' consumed; the bf16 S is complete
    if (!DB && more) {
      if constexpr (KW) load_w(t0 + CH, L1);
      load_kpug(t0 + CH, L1, 0);
      cp_async_commit();
    }
  }

  store_s(Sg);
}
