// Entry points of the small-batch GEMV (gemv.cuh): rows of x as they lie, or SwiGLU formed on
// the fly.
#include "gemv.cuh"

// The stage of the plain kernels: wait for the kernel before (programmatic launch), then let
// the one after start.
struct Enter {
  __device__ __forceinline__ void operator()() const { pdl_enter(); }
};

// gemv_{dtype}_b{NB}: NB rows of x; gemv_swiglu_{dtype}_b{NB}: NB rows of silu(gate) · up
// (gate and up with one row stride ld). `_pf2`, `_pf4`: with two or four steps of W asked of L2 first (for comparison).
#define GEMV_ENTRY_PRE(T, NAME, NB, PRE, SUFFIX)                                                                     \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      gemv_##NAME##_b##NB##SUFFIX(const T* x, long ldx, const T* w, T* y, int N, int K, int splits) {                \
    gemv<T, NB, PRE>(PlainRows<T>{x, ldx}, w, y, N, K, splits, Enter{});                                             \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      gemv_swiglu_##NAME##_b##NB##SUFFIX(const T* gate, const T* up, long ld, const T* w, T* y, int N, int K,        \
                                         int splits) {                                                               \
    gemv<T, NB, PRE>(SwigluRows<T>{gate, up, ld}, w, y, N, K, splits, Enter{});                                      \
  }
#define GEMV_ENTRY(T, NAME, NB)                        \
  GEMV_ENTRY_PRE(T, NAME, NB, 0, /*none*/) \
  GEMV_ENTRY_PRE(T, NAME, NB, 2, _pf2)                  \
  GEMV_ENTRY_PRE(T, NAME, NB, 4, _pf4)
#define GEMV_ENTRIES(T, NAME) FOR_EACH_GEMV_BATCH(GEMV_ENTRY, T, NAME)
GEMV_ENTRIES(__nv_bfloat16, bf16)
GEMV_ENTRIES(__half, f16)
