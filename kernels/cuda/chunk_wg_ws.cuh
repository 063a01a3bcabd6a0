// The wgmma state pass (chunk_wg.cuh's products, the same bits) split between two warpgroups:
// a consumer that holds Sᵀ and runs the chain of products, and a producer that issues every
// copy the chain waits on (the keys, Q, V, G, T2 and P into shared memory, O out of it) and the
// chunk's decays. A lone warpgroup issued those copies between its products, one warp a
// scheduler: a chunk took ~4,400 cycles, ~1,000 of them the products at the tensor cores' peak
// (docs/performance.md, *Where a chunk's time goes now*). The producer gives its registers to the
// consumer (setmaxnreg), so two CTAs still fit an SM. Chosen for sequences of four chunks or more
// (prefill.rs): its start costs about 2 µs more than one warpgroup's.
//
// Hand-offs are named barriers of both warpgroups (256 threads; one side arrives, the other
// waits), each passed once a chunk in a fixed order, so no side can lap the other on one:
//   FULL_A   producer → consumer  chunk i's keys, Q, V, G and decays are in buffer i % 2
//   FULL_T2  producer → consumer  chunk i's T2 is in its (one) buffer
//   FULL_P   producer → consumer  chunk i's P is in its buffer
//   T2_FREE  consumer → producer  V'(i) is formed: T2's buffer may take chunk i + 1's
//   O_READY  consumer → producer  O(i) is staged (and formed: P's buffer is free)
//   A_FREE   consumer → producer  the state update of chunk i, the last reader of buffer i % 2,
//                                 has completed: it may take chunk i + 2
// A writer's copies are complete (cp.async.wait_group) and fenced for the async proxy before it
// arrives, as chunk_wg_state's threads do before their CTA barrier.
#pragma once
#include "chunk_wg.cuh"

#define WS_THREADS 256
enum WsBarrier { WS_FULL_A = 1, WS_FULL_T2, WS_FULL_P, WS_T2_FREE, WS_O_READY, WS_A_FREE, WS_PRODUCERS };

__device__ __forceinline__ void ws_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void ws_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(WS_THREADS) : "memory");
}
// A hand-off's wait: both warpgroups.
__device__ __forceinline__ void ws_wait(int id) { ws_sync(id, WS_THREADS); }

// A buffer's decays: e^G at [0, 64), e^{G_last − G} at [64, 128).
template <int KT>
__device__ __forceinline__ float* ws_decays(const WgTiles<KT>& tl, int b) {
  return reinterpret_cast<float*>(tl.rest() + b * 512);
}
// O's staging tile of a chunk in buffer b: its Q buffer at K ≥ 128 (free once Y is formed).
template <int KT>
__device__ __forceinline__ bf16* ws_o_stage(const WgTiles<KT>& tl, int b) {
  return KT >= 8 ? tl.qo(b) : reinterpret_cast<bf16*>(tl.rest() + 1024) + b * 64 * 64;
}

// The producer warpgroup (threads TB .. TB + 127) of the two- and three-warpgroup passes: every
// copy the consumers' chain waits on, in the order they need it, and each chunk's decays.
// HANDOFF counts the threads of the full and free hand-offs (the producer and every consumer);
// O_READY is the producer's and one consumer's. Each step waits only for what it hands on.
// Three cp.async groups a chunk, committed even when empty so that the waits' counts hold:
// T2(i + 1), P(i + 1), A(i + 2).
template <int KT, int TB, int HANDOFF>
__device__ __forceinline__ void ws_producer(const WgTiles<KT>& tl, const bf16* __restrict__ q, const bf16* __restrict__ k,
                                            const bf16* __restrict__ v, long ldv, const bf16* __restrict__ T2,
                                            const bf16* __restrict__ P, const float* __restrict__ G, bf16* __restrict__ o,
                                            int t_begin, int t_end, int hk, int hv, int H, int HV, int K, int V) {
  constexpr int ATOMS = 16 * KT / 64;
  asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
  pdl_entry();
  const int v0 = blockIdx.x * 64, vw = min(64, V - v0), n = (t_end - t_begin + 63) / 64;
  const int pt = threadIdx.x - TB;
  auto len = [&](int i) { return min(64, t_end - (t_begin + 64 * i)); };
  auto load_a = [&](int i) {  // chunk i's keys, Q, V and G into buffer i % 2
    const int t0 = t_begin + 64 * i, L = len(i), b = i & 1;
    wg_tile<ATOMS, TB>(tl.k(b), k + ((size_t)t0 * H + hk) * K, (size_t)H * K, L, K);
    wg_tile<ATOMS, TB>(tl.q(b), q + ((size_t)t0 * H + hk) * K, (size_t)H * K, L, K);
    wg_tile_v(tl.v(b), tl.g(b), v + (size_t)t0 * ldv + (size_t)hv * V + v0, ldv, G + (size_t)t0 * HV + hv, HV, L, vw, TB);
  };
  auto load_t2 = [&](int i) {
    const int t0 = t_begin + 64 * i;
    wg_tile<1, TB>(tl.t2(), T2 + ((size_t)t0 * HV + hv) * 64, (size_t)HV * 64, len(i), 64);
  };
  auto load_p = [&](int i) {
    const int t0 = t_begin + 64 * i;
    wg_tile<1, TB>(tl.p(), P + ((size_t)t0 * HV + hv) * 64, (size_t)HV * 64, len(i), 64);
  };
  auto landed_arrive = [&](int id) {  // the producer's copies landed and visible to wgmma
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(HANDOFF) : "memory");
  };
  // Chunk i's decays from its G (landed), then FULL_A.
  auto decays_arrive = [&](int i) {
    ws_sync(WS_PRODUCERS, WG_THREADS);  // every producer's G copy landed
    if (pt < 64) {
      const float* Gc = tl.g(i & 1);
      const float g = Gc[pt];
      float* D = ws_decays(tl, i & 1);
      D[pt] = __expf(g);
      D[64 + pt] = __expf(Gc[63] - g);
    }
    landed_arrive(WS_FULL_A);
  };
  if (n == 0) return;
  load_a(0);
  cp_async_commit();
  load_t2(0);
  cp_async_commit();
  load_p(0);
  cp_async_commit();
  if (n > 1) load_a(1);
  cp_async_commit();
  cp_async_wait<3>();
  decays_arrive(0);
  cp_async_wait<2>();
  landed_arrive(WS_FULL_T2);
  cp_async_wait<1>();
  landed_arrive(WS_FULL_P);
  for (int i = 0; i < n; ++i) {
    const bool more = i + 1 < n;
    if (more) {
      ws_sync(WS_T2_FREE, HANDOFF);
      load_t2(i + 1);
    }
    cp_async_commit();
    if (more) {
      cp_async_wait<1>();  // A(i + 1), issued a chunk ago
      decays_arrive(i + 1);
    }
    ws_sync(WS_O_READY, 2 * WG_THREADS);
    if (more) load_p(i + 1);
    cp_async_commit();
    // O(i) out of its staging tile.
    wg_store_o(ws_o_stage(tl, i & 1), o, t_begin + 64 * i, len(i), hv, HV, V, v0, vw, wg_tid() - TB);
    if (i + 2 < n) {
      // Every producer has read O(i) out of the Q buffer before the next keys and Q go in.
      ws_sync(WS_A_FREE, HANDOFF);
      load_a(i + 2);
    }
    cp_async_commit();
    if (more) {
      cp_async_wait<2>();  // T2(i + 1)
      landed_arrive(WS_FULL_T2);
      cp_async_wait<1>();  // P(i + 1)
      landed_arrive(WS_FULL_P);
    }
  }
  cp_async_wait<0>();
}

// The state pass: grid (⌈V / 64⌉, HV, sequences), WS_THREADS threads, wg_state_smem(KT, true)
// bytes of dynamic shared memory; arguments as chunk_wg_state's.
template <int KT, typename TS>
__device__ void chunk_wg_state_ws(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                  long ldv, const bf16* __restrict__ T2, const bf16* __restrict__ P,
                                  const float* __restrict__ G, TS* __restrict__ states, const int* __restrict__ cu,
                                  const int* __restrict__ slots, const int* __restrict__ snap, int has_snap,
                                  bf16* __restrict__ o, int H, int HV, int K, int V, float scale) {
  static_assert(KT == 4 || KT == 8, "K up to 128: Sᵀ's accumulators are 2·KT·4 registers a thread");
  constexpr int K16 = 16 * KT, NS = K16 / 8 * 4, KS = K16 / 16;
  extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
  const WgTiles<KT> tl(wg_smem_raw);

  const int hv = blockIdx.y, seq = blockIdx.z, v0 = blockIdx.x * 64;
  const int hk = hv / (HV / H);
  const int vw = min(64, V - v0);
  const int t_begin = cu[seq], t_end = cu[seq + 1];
  const int n = (t_end - t_begin + 63) / 64;

  WG_CTA_MARK(0);
  if (threadIdx.x >= WG_THREADS) {
    ws_producer<KT, WG_THREADS, WS_THREADS>(tl, q, k, v, ldv, T2, P, G, o, t_begin, t_end, hk, hv, H, HV, K, V);
    return;
  }

  // ---- The consumer. ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n" ::: "memory");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
  TS* Sg = states + ((size_t)slots[seq] * HV + hv) * K * V + v0;
#ifdef WG_PROFILE
  const bool prof_on = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0;
  long long prof_t = clock64();
#endif

  float s[NS];
  wg_load_s(s, Sg, vw, K, V, warp, g8, t4);
  pdl_entry();

  for (int i = 0, t0 = t_begin, b = 0; i < n; ++i, t0 += 64, b ^= 1) {
    WG_MARK(0);
    ws_wait(WS_FULL_A);
    // The previous chunk's state update, the last reader of the other buffer (waited for on
    // every chunk: a wait under a condition makes ptxas serialize every product).
    wg_wait<0>();
    wg_regs(s);
    if (i > 0 && i + 1 < n) ws_arrive(WS_A_FREE);
    WG_MARK(1);

    float z[32], y[32];
    wg_issue_zy<KS>(z, y, s, tl.k(b), tl.q(b));
    const float* Eg = ws_decays(tl, b);
    const float* Dk = Eg + 64;
    WG_MARK(2);

    wg_wait<1>();
    wg_regs(z);
    WG_MARK(3);
    unsigned ra[4][4];
    wg_form_r(ra, z, tl.v(b), Eg, lane, warp, t4);
    ws_wait(WS_FULL_T2);
    WG_MARK(4);

    float vp[32];
    wg_issue_vp(vp, ra, tl.t2());
    wg_wait<0>();  // V', and Y before it
    wg_regs(vp);
    wg_regs(y);
    if (i + 1 < n) ws_arrive(WS_T2_FREE);
    // Every consumer's Y is formed (this is a barrier of all of them): the Q buffer may take O.
    ws_wait(WS_FULL_P);
    WG_MARK(5);

    wg_issue_os<KT>(y, s, vp, Eg, Dk, tl.p(), tl.k(b), t4);
    wg_wait<1>();
    wg_regs(y);
    WG_MARK(6);
    wg_stage_o(ws_o_stage(tl, b), y, scale, warp, g8, t4);  // the producer stores it
    ws_arrive(WS_O_READY);
    WG_MARK(7);
    const int d = has_snap ? snap[t0] : 0;
    if (d > 0) {
      wg_wait<0>();
      wg_regs(s);
      wg_store_s(s, states + ((size_t)(d - 1) * HV + hv) * K * V + v0, vw, K, V, warp, g8, t4);
    }
  }
  wg_wait<0>();
  wg_regs(s);
  wg_store_s(s, Sg, vw, K, V, warp, g8, t4);
  WG_CTA_MARK(1);
}
