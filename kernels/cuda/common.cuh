// Shared helpers for deltaserve's kernels. All state and accumulation is fp32.
#pragma once
#include <stdint.h>

// Programmatic dependent launch (kernels/src/cuda/graph.rs): in a rebuilt graph a kernel
// reached by a programmatic edge is launched as the kernel before it ends, without waiting for
// that kernel's completion to be signalled. Each of our kernels waits here, before it touches
// global memory, until every kernel before it has finished and its writes are visible; a no-op
// in any other launch. The one exception: a decode step reads its slot index first (slot_of),
// which is uploaded before the launch or the graph's replay and written by no kernel. Kernels
// do not trigger their dependents early as a rule (pdl_trigger): their blocks then wait
// resident beside the running kernel, and the decode steps of 1–2 rows were slower
// (docs/gpu.md, *Graphs without memory nodes*).
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel after this one start now (in a graph, over a programmatic edge) rather than
// when this one ends; called after pdl_entry, so every kernel before this one has finished. Two
// kinds of kernel do: chunk_tc_prep (the state pass after it loads its states, which the prep
// does not touch, on the multiprocessors a prep of few chunks leaves idle, and then waits for
// it), and, when their launcher says `early`, the row kernels before a decode step's projections
// at 4–64 rows (the norms, SwiGLU, the attention gate): the skinny GEMM after them (skinny.cu)
// streams its first stages of W while they run.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// exp2 and the reciprocal approximated by the special-function unit, ~2 ulp, rather than IEEE
// division (a dozen instructions and a branch), and in their flush-to-zero forms: one
// instruction each, where __expf's and __fdividef's forms without -ftz add range checks and
// scalings for subnormals (~7 instructions an element; the elementwise kernels that apply the
// sigmoid to every element, the prefill's short conv foremost, were instruction-bound on it).
// The value is the same: a subnormal input or exp(−x) adds nothing to 1 + exp(−x), and a
// denominator past 2^126 (x → -∞, up to +∞) gives 0 in either form.
__device__ __forceinline__ float ds_sigmoid(float x) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.44269504088896341f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return r;
}
__device__ __forceinline__ float ds_silu(float x) { return x * ds_sigmoid(x); }
// PyTorch's softplus with threshold 20 (fla's gate matches it).
__device__ __forceinline__ float ds_softplus(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The mixer's per-token inputs (model-spec.md §1.3 steps 4, 6, 7), shared by the prep kernel
// and the fused decode step so that the two agree bit for bit. One warp L2-normalises a K-wide
// head: lane-strided squares, a warp sum, x / sqrt(Σx² + 1e-6) (out may be in).
__device__ __forceinline__ void l2_head(float* out, const float* in, int K, int lane) {
  float ss = 0.0f;
  for (int i = lane; i < K; i += 32) ss += in[i] * in[i];
  const float inv = rsqrtf(warp_sum(ss) + 1e-6f);
  for (int i = lane; i < K; i += 32) out[i] = in[i] * inv;
}
// β = mult · sigmoid(b) (mult 2 with allow_neg_eigval).
__device__ __forceinline__ float ds_beta(float mult, float b) { return mult * ds_sigmoid(b); }
// The fp32 log-decay g = −exp(A_log) · softplus(a + dt_bias).
__device__ __forceinline__ float ds_log_decay(float a, float a_log, float dt_bias) {
  return -__expf(a_log) * ds_softplus(a + dt_bias);
}

// The sequence holding packed row r: the last s with cu[s] <= r (so cu[s+1] > r).
__device__ __forceinline__ int seq_of_row(const int* __restrict__ cu, int S, int r) {
  int lo = 0, hi = S - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Decode steps take up to INLINE_SLOTS slot indices by value (no upload for small batches), or
// all of them from device memory when `rest` is set (larger batches, CUDA graphs).
#define INLINE_SLOTS 64
struct SlotList {
  int s[INLINE_SLOTS];
};
__device__ __forceinline__ int slot_of(const SlotList& inl, const int* __restrict__ rest, int b) {
  return rest ? rest[b] : inl.s[b];
}
