// The wgmma state pass for 128 < K ≤ 256 (fla's Gated DeltaNet at head_dim 256): Sᵀ's keys split
// between two consumer warpgroups, beside chunk_wg_ws.cuh's producer (ws_producer). One cannot hold
// a 64 × 256 Sᵀ: 128 accumulator registers a thread, and 64 more for its bf16 copy while Z and Y
// are issued. Here consumer h holds keys [128h, 128h + 128), as the K = 128 consumer holds all of
// them, and a chunk's steps are that consumer's with two exchanges through shared memory:
//   Zᵀ = Sᵀ₀ K₀ᵀ + Sᵀ₁ K₁ᵀ   each adds the other's partial (addition commutes, so both get the
//                            same bits), then both form R and V' (V' feeds both state updates);
//   Yᵀ = Sᵀ₀ Q₀ᵀ + Sᵀ₁ Q₁ᵀ   consumer 1 hands its partial to consumer 0, which alone forms O;
//   Sᵀₕ ← e^{G_last} Sᵀₕ + (V'ᵀ e^{G_last − G}) Kₕ   each its own keys.
// The products and roundings are the K = 128 pass's; only Z and Y's sums over K are split in two.
//
// Hand-offs are named barriers (ids as chunk_wg_ws.cuh's, plus two between the consumers):
//   FULL_A, FULL_T2, FULL_P  producer → both consumers (384 threads)
//   T2_FREE, A_FREE          both consumers → producer (384)
//   O_READY                  consumer 0 → producer (256)
//   ZX                       the consumers' Z partials written (256; both wait)
//   YX                       consumer 1's Y partial written (256; consumer 0 waits)
// Each partial's tile is reused a chunk later only after a barrier that its reader passed after
// reading it (FULL_A for Z's, FULL_T2 for consumer 1's Y, which reuses its Z tile).
#pragma once
#include "chunk_wg_ws.cuh"

#define SPLIT_THREADS 384
enum SplitBarrier { SP_ZX = WS_PRODUCERS + 1, SP_YX };

__device__ __forceinline__ void sp_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// A partial [64, 64] accumulator tile (32 floats a thread) into shared memory and back, in the
// accumulators' own order: thread t's j-th float4 at j·128 + t (no bank conflicts).
__device__ __forceinline__ void sp_put(float4* x, const float (&d)[32], int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j * 128 + t] = make_float4(d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]);
}
__device__ __forceinline__ void sp_add(float (&d)[32], const float4* x, int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 p = x[j * 128 + t];
    d[4 * j] += p.x, d[4 * j + 1] += p.y, d[4 * j + 2] += p.z, d[4 * j + 3] += p.w;
  }
}

// The state pass: grid (⌈V / 64⌉, HV, sequences), SPLIT_THREADS threads, wg_split_smem() bytes of
// dynamic shared memory; arguments as chunk_wg_state's, with 128 < K ≤ 256.
template <typename TS>
__device__ void chunk_wg_state_split(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                     long ldv, const bf16* __restrict__ T2, const bf16* __restrict__ P,
                                     const float* __restrict__ G, TS* __restrict__ states, const int* __restrict__ cu,
                                     const int* __restrict__ slots, const int* __restrict__ snap, int has_snap,
                                     bf16* __restrict__ o, int H, int HV, int K, int V, float scale) {
  constexpr int KT = 16, HALF = 128;
  extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
  const WgTiles<KT> tl(wg_smem_raw);
  // Past the two buffers' decays (ws_decays), the two partial tiles.
  auto Xp = [&](int h) { return reinterpret_cast<float4*>(tl.rest() + 1024 + h * 64 * 64 * 4); };

  const int hv = blockIdx.y, seq = blockIdx.z, v0 = blockIdx.x * 64;
  const int hk = hv / (HV / H);
  const int vw = min(64, V - v0);
  const int t_begin = cu[seq], t_end = cu[seq + 1];
  const int n = (t_end - t_begin + 63) / 64;

  WG_CTA_MARK(0);
  if (threadIdx.x >= 2 * WG_THREADS) {
    ws_producer<KT, 2 * WG_THREADS, SPLIT_THREADS>(tl, q, k, v, ldv, T2, P, G, o, t_begin, t_end, hk, hv, H, HV, K, V);
    return;
  }

  // ---- The consumers: h holds Sᵀ's keys [128h, 128h + 128). ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int h = threadIdx.x >> 7, tid = threadIdx.x & 127, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
  const int kh = min(HALF, K - HALF * h);  // this consumer's keys
  const unsigned koff = h * (HALF / 64) * 8192;  // its keys' atoms in a key or Q tile
  // This consumer's part of a slot's state, formed where used (from the parameters) rather than
  // kept in registers across the chunks.
  auto part = [&](int slot) { return states + ((size_t)slot * HV + hv) * K * V + (size_t)HALF * h * V + v0; };
#ifdef WG_PROFILE
  const bool prof_on = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;
  long long prof_t = clock64();
#endif

  float s[64];
  wg_load_s(s, part(slots[seq]), vw, kh, V, warp, g8, t4);
  pdl_entry();

  for (int i = 0, t0 = t_begin, b = 0; i < n; ++i, t0 += 64, b ^= 1) {
    WG_MARK(0);
    ws_sync(WS_FULL_A, SPLIT_THREADS);
    wg_wait<0>();
    wg_regs(s);
    if (i > 0 && i + 1 < n) sp_arrive(WS_A_FREE, SPLIT_THREADS);
    WG_MARK(1);

    float z[32], y[32];
    wg_issue_zy<8>(z, y, s, tl.k(b) + koff, tl.q(b) + koff);
    const float* Eg = ws_decays(tl, b);
    const float* Dk = Eg + 64;
    WG_MARK(2);

    wg_wait<1>();
    wg_regs(z);
    sp_put(Xp(h), z, tid);
    ws_sync(SP_ZX, 2 * WG_THREADS);
    sp_add(z, Xp(h ^ 1), tid);
    WG_MARK(3);
    unsigned ra[4][4];
    wg_form_r(ra, z, tl.v(b), Eg, lane, warp, t4);
    ws_sync(WS_FULL_T2, SPLIT_THREADS);
    WG_MARK(4);

    float vp[32];
    wg_issue_vp(vp, ra, tl.t2());
    wg_wait<0>();  // V', and Y before it
    wg_regs(vp);
    wg_regs(y);
    if (i + 1 < n) sp_arrive(WS_T2_FREE, SPLIT_THREADS);
    if (h == 1) {
      sp_put(Xp(1), y, tid);
      sp_arrive(SP_YX, 2 * WG_THREADS);
    } else {
      ws_sync(SP_YX, 2 * WG_THREADS);
      sp_add(y, Xp(1), tid);
    }
    // Both consumers' Y are formed: the Q buffer may take O.
    ws_sync(WS_FULL_P, SPLIT_THREADS);
    WG_MARK(5);

    if (h == 0) {
      wg_issue_os<KT / 2>(y, s, vp, Eg, Dk, tl.p(), tl.k(b), t4);
      wg_wait<1>();
      wg_regs(y);
      WG_MARK(6);
      wg_stage_o(tl.qo(b), y, scale, warp, g8, t4);  // the producer stores it
      sp_arrive(WS_O_READY, 2 * WG_THREADS);
    } else {
      wg_issue_os<KT / 2, 64, false>(y, s, vp, Eg, Dk, tl.p(), tl.k(b) + koff, t4);
    }
    WG_MARK(7);
    const int d = has_snap ? snap[t0] : 0;
    if (d > 0) {
      wg_wait<0>();
      wg_regs(s);
      wg_store_s(s, part(d - 1), vw, kh, V, warp, g8, t4);
    }
  }
  wg_wait<0>();
  wg_regs(s);
  wg_store_s(s, part(slots[seq]), vw, kh, V, warp, g8, t4);
  WG_CTA_MARK(1);
}

// Shared memory of chunk_wg_state_split: WgTiles<16>'s buffers, the two buffers' decays, the two
// partial tiles, the swizzle's alignment.
__host__ __device__ constexpr int wg_split_smem() {
  return 4 * (64 * 16 * 16 * 2) + 2 * (64 * 64 * 2) + 2 * (64 * WG_VP * 2) + 512 + 2 * 512 + 2 * 64 * 64 * 4 + 1024;
}
