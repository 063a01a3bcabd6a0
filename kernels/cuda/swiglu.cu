// Gated activations in one pass, inputs read in place from (possibly column slices of) a fused
// projection, computed in fp32 and rounded once to the activation dtype T: SwiGLU, silu(gate) ·
// up (fla's fused `swiglu` does the same; separate silu and multiply kernels would round twice),
// and the attention output's gate, o · sigmoid(gate) (Qwen's gated attention).
#include "common.cuh"
#include "dtype.cuh"

// gate, up [rows, I] with row strides ldg, ldu; out [rows, I] contiguous. Grid
// (ceil(I/(N·blockDim)), ≤ 65535): a thread takes N adjacent columns (one 16-byte access when
// N > 1: the launcher checks alignment) of rows blockIdx.y, + gridDim.y, ...
template <typename T, int N>
__device__ void swiglu(const T* __restrict__ gate, long ldg, const T* __restrict__ up, long ldu, T* __restrict__ out,
                       int rows, int I) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * N;
  if (c >= I) return;
  for (size_t r = blockIdx.y; r < (size_t)rows; r += gridDim.y) {
    float g[N], u[N], o[N];
    load_vec<N>(g, gate + r * ldg + c);
    load_vec<N>(u, up + r * ldu + c);
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = ds_silu(g[i]) * u[i];
    store_vec<N>(out + r * I + c, o);
  }
}

// swiglu_{dtype}: a column a thread; swiglu_{dtype}_vec: 16 bytes a thread (I, the row strides
// and the addresses multiples of 16 / sizeof(T)).
#define SWIGLU_ENTRY(T, NAME, N, SUFFIX)                                                                            \
  extern "C" __global__ void swiglu_##NAME##SUFFIX(const T* gate, long ldg, const T* up, long ldu, T* out, int rows, \
                                                   int I, int early) {                                                           \
    pdl_entry();                                                                                                    \
    if (early) pdl_trigger();                                                                                       \
    swiglu<T, N>(gate, ldg, up, ldu, out, rows, I);                                                                 \
  }
#define SWIGLU_ENTRIES(T, NAME)         \
  SWIGLU_ENTRY(T, NAME, 1, )            \
  SWIGLU_ENTRY(T, NAME, 16 / sizeof(T), _vec)
SWIGLU_ENTRIES(float, f32)
SWIGLU_ENTRIES(__nv_bfloat16, bf16)
SWIGLU_ENTRIES(__half, f16)

// o [rows, D] f32 contiguous, gate [rows, D] in T with row stride ldg; out [rows, D] T
// contiguous: out = o · sigmoid(gate), rounded once. Grid (ceil(D/(N·blockDim)), ≤ 65535 rows,
// each block row striding over rows): a thread takes N adjacent columns (N = 4: o's 16 bytes and
// the gate's 8 at once; the launcher checks D, ldg and the addresses).
template <typename T, int N>
__device__ void sigmoid_gate(const float* __restrict__ o, const T* __restrict__ gate, long ldg, T* __restrict__ out,
                             int rows, int D) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * N;
  if (c >= D) return;
  for (size_t r = blockIdx.y; r < (size_t)rows; r += gridDim.y) {
    float ov[N], gv[N], y[N];
    load_vec<N>(ov, o + r * D + c);
    load_vec<N>(gv, gate + r * ldg + c);
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = ov[i] * ds_sigmoid(gv[i]);
    store_vec<N>(out + r * D + c, y);
  }
}

// sigmoid_gate_{dtype}: a column a thread; _x4: four.
#define SIGMOID_GATE_ENTRY(T, NAME, N, SUFFIX)                                                                      \
  extern "C" __global__ void sigmoid_gate_##NAME##SUFFIX(const float* o, const T* gate, long ldg, T* out, int rows,   \
                                                         int D, int early) {                                         \
    pdl_entry();                                                                                                    \
    if (early) pdl_trigger();                                                                                       \
    sigmoid_gate<T, N>(o, gate, ldg, out, rows, D);                                                                 \
  }
#define SIGMOID_GATE_ENTRIES(T, NAME)  \
  SIGMOID_GATE_ENTRY(T, NAME, 1, )     \
  SIGMOID_GATE_ENTRY(T, NAME, 4, _x4)
SIGMOID_GATE_ENTRIES(float, f32)
SIGMOID_GATE_ENTRIES(__nv_bfloat16, bf16)
SIGMOID_GATE_ENTRIES(__half, f16)
