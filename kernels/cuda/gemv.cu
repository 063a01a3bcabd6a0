// Entry points of the small-batch GEMV (gemv.cuh): rows of x as they lie, or SwiGLU formed on
// the fly.
#include "gemv.cuh"

// gemv_{dtype}_b{NB}: NB rows of x; gemv_swiglu_{dtype}_b{NB}: NB rows of silu(gate) · up
// (gate and up with one row stride ld).
#define GEMV_ENTRY(T, NAME, NB)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) gemv_##NAME##_b##NB(const T* x, long ldx, const T* w, T* y, int N, \
                                                                        int K, int splits) { pdl_entry();                                     \
    gemv<T, NB>(PlainRows<T>{x, ldx}, w, y, N, K, splits);                                                                   \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      gemv_swiglu_##NAME##_b##NB(const T* gate, const T* up, long ld, const T* w, T* y, int N, int K, int splits) { pdl_entry();              \
    gemv<T, NB>(SwigluRows<T>{gate, up, ld}, w, y, N, K, splits);                                                            \
  }
#define GEMV_ENTRIES(T, NAME) FOR_EACH_GEMV_BATCH(GEMV_ENTRY, T, NAME)
GEMV_ENTRIES(__nv_bfloat16, bf16)
GEMV_ENTRIES(__half, f16)
