// The chunked prefill on Hopper's warpgroup tensor cores for bf16 inputs: its prep for K ≤ 256
// (chunk_wg_prep.cuh) and its state pass for K ≤ 128 (chunk_wg.cuh), the latter for f32 and for
// bf16 states (`_sbf16`). Only sm_90a builds have wgmma; elsewhere the entries trap, and prefill.rs only
// picks them from a SASS image for it.
#include "chunk_wg_prep.cuh"

#define WG_ENTRY(NAME, KT, TS)                                                                                      \
  extern "C" __global__ void __launch_bounds__(WG_THREADS, 2)                                                       \
      NAME(const bf16* q, const bf16* k, const bf16* v, long ldv, const bf16* T2, const bf16* P, const float* G,    \
           TS* states, const int* cu, const int* slots, const int* snap, int has_snap, float* o, int H, int HV,     \
           int K, int V, float scale) {                                                                             \
    WG_BODY(chunk_wg_state<KT, TS>(q, k, v, ldv, T2, P, G, states, cu, slots, snap, has_snap, o, H, HV, K, V, scale)); \
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_BODY(...) __VA_ARGS__
#else
#define WG_BODY(...) __trap()
#endif
WG_ENTRY(chunk_wg_state_k4, 4, float)
WG_ENTRY(chunk_wg_state_k8, 8, float)
WG_ENTRY(chunk_wg_state_k4_sbf16, 4, __nv_bfloat16)
WG_ENTRY(chunk_wg_state_k8_sbf16, 8, __nv_bfloat16)

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
