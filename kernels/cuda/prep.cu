// One fused pass over each token row (model-spec.md §1.3 steps 4, 6, 7): L2-normalise every
// K-wide q and k head of the conv output, β = mult·sigmoid(b), and the fp32 log-decay
// g = −exp(A_log)·softplus(a + dt_bias). GVA needs no copy: the mixer kernels map value head
// j to q/k head j / (HV/H).
#include "common.cuh"
#include "dtype.cuh"

// conv [N, ldc] in TC (f32, or bf16 for a bf16 mixer): q heads at columns [0, qh·K), k heads
// at [k_off, k_off + kh·K). b [N, nb] and a [N, ng] in T with row strides ldb, lda (column
// slices of the fused input projection, read in place). Outputs q [N, qh, K], k [N, kh, K] in
// TC (normalised in fp32, rounded once), beta [N, nb] and g [N, ng] (ng = 0: no gate) f32.
template <typename T, typename TC>
__device__ void prep(const TC* __restrict__ conv, int ldc, int qh, int kh, int K, int k_off, TC* __restrict__ q,
                     TC* __restrict__ k, const T* __restrict__ b, long ldb, float* __restrict__ beta, int nb,
                     float beta_mult, const T* __restrict__ a, long lda, const float* __restrict__ a_log,
                     const float* __restrict__ dt_bias, float* __restrict__ g, int ng) {
  const int row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const TC* src = conv + (size_t)row * ldc;
  for (int seg = warp; seg < qh + kh; seg += warps) {
    const bool is_q = seg < qh;
    const TC* in = is_q ? src + seg * K : src + k_off + (seg - qh) * K;
    TC* out = is_q ? q + ((size_t)row * qh + seg) * K : k + ((size_t)row * kh + seg - qh) * K;
    float ss = 0.0f;
    for (int i = lane; i < K; i += 32) ss += to_f32(in[i]) * to_f32(in[i]);
    const float inv = rsqrtf(warp_sum(ss) + 1e-6f);
    for (int i = lane; i < K; i += 32) out[i] = from_f32<TC>(to_f32(in[i]) * inv);
  }
  for (int i = threadIdx.x; i < nb; i += blockDim.x) beta[(size_t)row * nb + i] = ds_beta(beta_mult, to_f32(b[(size_t)row * ldb + i]));
  for (int i = threadIdx.x; i < ng; i += blockDim.x)
    g[(size_t)row * ng + i] = ds_log_decay(to_f32(a[(size_t)row * lda + i]), a_log[i], dt_bias[i]);
}

// prep_{dtype of a and b}[_narrow: conv, q and k in that dtype too].
#define PREP_ENTRY(T, TC, NAME)                                                                                       \
  extern "C" __global__ void prep_##NAME(const TC* conv, int ldc, int qh, int kh, int K, int k_off, TC* q, TC* k,    \
                                         const T* b, long ldb, float* beta, int nb, float beta_mult, const T* a,      \
                                         long lda, const float* a_log, const float* dt_bias, float* g, int ng) { pdl_entry();      \
    prep<T, TC>(conv, ldc, qh, kh, K, k_off, q, k, b, ldb, beta, nb, beta_mult, a, lda, a_log, dt_bias, g, ng);      \
  }
PREP_ENTRY(float, float, f32)
PREP_ENTRY(__nv_bfloat16, float, bf16)
PREP_ENTRY(__half, float, f16)
PREP_ENTRY(__nv_bfloat16, __nv_bfloat16, bf16_narrow)
