// The chunked prefill's state pass (chunk_mma.cuh) instantiated: the bf16 and split-operand
// (f32 input) entries that prefill.rs launches, each for f32 and for bf16 states.
#include "chunk_mma.cuh"

// bf16 entries: NAME runs chunk_mma_state<KT, BV, false, DBUF> at MINB CTAs an SM on states of
// type TS (the name's `_sbf16`: bf16), writing O in bf16 (fla's output dtype for bf16 inputs).
// The state entries wait for the launch before them inside chunk_mma_state, once S's loads are
// issued.
#define MMA_ENTRY_NAMED(NAME, KT, BV, MINB, DBUF, TS)                                                                \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                                        \
      NAME(const bf16* q, const bf16* k, const bf16* v, long ldv, const bf16* T2, const bf16* P, const float* G,     \
           TS* states, const int* cu, const int* slots, const int* snap, int has_snap, bf16* o, int H, int HV,       \
           int K, int V, float scale) {                                                                              \
    const ChunkIn in{q, nullptr, k, nullptr, v, ldv, nullptr, nullptr, nullptr, T2, P, nullptr, G};                 \
    chunk_mma_state<KT, BV, false, DBUF>(in, states, cu, slots, snap, has_snap, o, H, HV, K, V, scale);             \
  }
// Two CTAs per SM where KT ≤ 8 (registers ≤ 128 per thread), one at KT = 16.
#define MMA_ENTRY(KT, BV, MINB)                                                             \
  MMA_ENTRY_NAMED(chunk_mma_state_k##KT##_bv##BV, KT, BV, MINB, false, float)               \
  MMA_ENTRY_NAMED(chunk_mma_state_k##KT##_bv##BV##_sbf16, KT, BV, MINB, false, __nv_bfloat16)
// The second load group double-buffered at K > 64, for grids of one CTA an SM.
#define MMA_DB_ENTRY(KT, BV)                                                              \
  MMA_ENTRY_NAMED(chunk_mma_state_db_k##KT##_bv##BV, KT, BV, 1, true, float)              \
  MMA_ENTRY_NAMED(chunk_mma_state_db_k##KT##_bv##BV##_sbf16, KT, BV, 1, true, __nv_bfloat16)
MMA_ENTRY(4, 32, 2)
MMA_ENTRY(4, 64, 2)
MMA_ENTRY(8, 32, 2)
MMA_ENTRY(8, 64, 2)
MMA_ENTRY(16, 32, 1)
MMA_ENTRY(16, 64, 1)
MMA_DB_ENTRY(8, 32)
MMA_DB_ENTRY(8, 64)
MMA_DB_ENTRY(16, 32)
MMA_DB_ENTRY(16, 64)

// f32 inputs (split operands): q and the decayed keys as pairs, U in fp32, W and P as pairs.
#define SPLIT_ENTRY_T(NAME, KT, BV, MINB, TS)                                                                        \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                                        \
      NAME(const bf16* q, const bf16* ql, const bf16* kd, const bf16* kdl, const float* U, const bf16* W,            \
           const bf16* Wl, const bf16* P, const bf16* Pl, const float* G, TS* states, const int* cu,                 \
           const int* slots, const int* snap, int has_snap, float* o, int H, int HV, int K, int V, float scale) {    \
    const ChunkIn in{q, ql, kd, kdl, nullptr, 0, U, W, Wl, nullptr, P, Pl, G};                                       \
    chunk_mma_state<KT, BV, true>(in, states, cu, slots, snap, has_snap, o, H, HV, K, V, scale);                    \
  }
#define SPLIT_ENTRY(KT, BV, MINB)                                                    \
  SPLIT_ENTRY_T(chunk_split_state_k##KT##_bv##BV, KT, BV, MINB, float)               \
  SPLIT_ENTRY_T(chunk_split_state_k##KT##_bv##BV##_sbf16, KT, BV, MINB, __nv_bfloat16)
SPLIT_ENTRY(4, 32, 2)
SPLIT_ENTRY(4, 64, 1)
SPLIT_ENTRY(8, 32, 1)
SPLIT_ENTRY(8, 64, 1)
SPLIT_ENTRY(16, 16, 1)
SPLIT_ENTRY(16, 32, 1)
