// The chunked prefill on Hopper's warpgroup tensor cores for bf16 inputs: its prep for K ≤ 256
// (chunk_wg_prep.cuh) and its state pass for K ≤ 128 on one warpgroup (chunk_wg.cuh) or two
// (chunk_wg_ws.cuh), and for 128 < K ≤ 256 on three (chunk_wg_split.cuh), each for f32 and for
// bf16 states (`_sbf16`). Only sm_90a builds have wgmma; elsewhere the entries trap, and
// prefill.rs only picks them from a SASS image for it.
#include "chunk_wg_prep.cuh"
#include "chunk_wg_split.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_BODY(...) __VA_ARGS__
#else
#define WG_BODY(...) __trap()
#endif

// A state pass's entry: PASS (chunk_wg_state or chunk_wg_state_ws) with THREADS threads, two
// CTAs an SM. The two-warpgroup pass launches at 128 registers a thread, which setmaxnreg then
// gives unequally.
#define STATE_ENTRY(NAME, PASS, THREADS, KT, TS)                                                                    \
  extern "C" __global__ void __launch_bounds__(THREADS, 2)                                                          \
      NAME(const bf16* q, const bf16* k, const bf16* v, long ldv, const bf16* T2, const bf16* P, const float* G,    \
           TS* states, const int* cu, const int* slots, const int* snap, int has_snap, bf16* o, int H, int HV,      \
           int K, int V, float scale) {                                                                             \
    WG_BODY(PASS<KT, TS>(q, k, v, ldv, T2, P, G, states, cu, slots, snap, has_snap, o, H, HV, K, V, scale));        \
  }
STATE_ENTRY(chunk_wg_state_k4, chunk_wg_state, WG_THREADS, 4, float)
STATE_ENTRY(chunk_wg_state_k8, chunk_wg_state, WG_THREADS, 8, float)
STATE_ENTRY(chunk_wg_state_k4_sbf16, chunk_wg_state, WG_THREADS, 4, __nv_bfloat16)
STATE_ENTRY(chunk_wg_state_k8_sbf16, chunk_wg_state, WG_THREADS, 8, __nv_bfloat16)
STATE_ENTRY(chunk_wg_ws_k4, chunk_wg_state_ws, WS_THREADS, 4, float)
STATE_ENTRY(chunk_wg_ws_k8, chunk_wg_state_ws, WS_THREADS, 8, float)
STATE_ENTRY(chunk_wg_ws_k4_sbf16, chunk_wg_state_ws, WS_THREADS, 4, __nv_bfloat16)
STATE_ENTRY(chunk_wg_ws_k8_sbf16, chunk_wg_state_ws, WS_THREADS, 8, __nv_bfloat16)

// 128 < K ≤ 256: one CTA an SM (its three warpgroups launch at 168 registers a thread, which
// setmaxnreg then gives unequally; ~197 KB of shared memory).
#define KEY_SPLIT_ENTRY(NAME, TS)                                                                                       \
  extern "C" __global__ void __launch_bounds__(SPLIT_THREADS, 1)                                                        \
      NAME(const bf16* q, const bf16* k, const bf16* v, long ldv, const bf16* T2, const bf16* P, const float* G,        \
           TS* states, const int* cu, const int* slots, const int* snap, int has_snap, bf16* o, int H, int HV,          \
           int K, int V, float scale) {                                                                                 \
    WG_BODY(chunk_wg_state_split<TS>(q, k, v, ldv, T2, P, G, states, cu, slots, snap, has_snap, o, H, HV, K, V, scale)); \
  }
KEY_SPLIT_ENTRY(chunk_wg_split_k16, float)
KEY_SPLIT_ENTRY(chunk_wg_split_k16_sbf16, __nv_bfloat16)

// Five CTAs an SM fit at K ≤ 128 (38 KB of shared memory each): 102 registers a thread at most.
#define WG_PREP_ENTRY(NAME, KT)                                                                                      \
  extern "C" __global__ void __launch_bounds__(WG_THREADS, 5)                                                        \
      NAME(const bf16* q, const bf16* k, const float* beta, const float* g, const int* crow, const int* clen, bf16* T2, \
           bf16* P, float* Gout, int H, int HV, int K) {                                                            \
    pdl_entry();                                                                                                     \
    pdl_trigger();                                                                                                   \
    WG_BODY(chunk_wg_prep<KT>(q, k, beta, g, crow, clen, T2, P, Gout, H, HV, K));                                    \
  }
WG_PREP_ENTRY(chunk_wg_prep_k4, 4)
WG_PREP_ENTRY(chunk_wg_prep_k8, 8)
WG_PREP_ENTRY(chunk_wg_prep_k16, 16)
