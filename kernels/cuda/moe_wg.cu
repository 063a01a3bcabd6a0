// The MoE block's prompt projections on Hopper's warpgroup tensor cores (wgmma), for bf16 and
// f16: moe.cu's moe_up_tc / moe_down_tc over moe_sort's list of row tiles of one expert's rows,
// here of 128 rows (a prompt routes ~128 rows to an expert of Qwen3.5-MoE at 4,096 tokens, so an
// expert's weights are mostly read once), with both operands copied by cp.async into the
// 128-byte swizzle that wgmma reads, four stages deep, so that the weights stream while the
// products run. moe.cu's wmma tiles loaded through registers one 32-wide step at a time and
// reached about a tenth of the tensor cores' rate on Qwen3.5-MoE's shapes (docs/performance.md).
//
// A CTA is four warpgroups on one tile of 128 rows: A = the rows (the gathered tokens of x for
// the up projection, rows of h for the down one), B = 256 rows of the expert's weights. Warpgroup
// w takes rows 64·(w % 2) .. and weight rows 128·(w / 2) ..: its D[64, 128] = A_w · B_wᵀ
// accumulates in fp32 over K in steps of 64.
//   moe_up_wg_T    GATED: a warpgroup's 128 weight rows are 64 gate rows and their 64 up rows
//                  (h columns n0 + 64·(w / 2) ..), so a thread holds each gate column beside its
//                  up column: h = silu(g) · u with moe.cu's roundings, in T;
//   moe_down_wg_T  the 128 output columns n0 + 128·(w / 2) .. of y, fp32.
// Only sm_90a builds have wgmma; elsewhere the entries trap, and moe.rs only picks them from a
// SASS image for it.
#include "common.cuh"
#include "cp_async.cuh"
#include "dtype.cuh"
#include "wgmma.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MW_BODY(...) __VA_ARGS__
#else
#define MW_BODY(...) __trap()
#endif

#define MW_THREADS 512
#define MW_STAGES 4
#define MW_ROWS 128
// A stage: A's 128 rows and B's 256, 128 bytes (64 elements of K) each.
#define MW_A_BYTES (MW_ROWS * 128)
#define MW_B_BYTES (256 * 128)
#define MW_STAGE_BYTES (MW_A_BYTES + MW_B_BYTES)

// D[64, 128] += A[64, 16] · B[16, 128], A and B K-major in shared memory (descriptors).
template <typename T>
struct MwMma;
#define MW_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MW_MMA(T, TY)                                                                                                     \
  template <>                                                                                                             \
  struct MwMma<T> {                                                                                                       \
    __device__ __forceinline__ static void run(float (&d)[64], unsigned long long a, unsigned long long b) {              \
      asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                                           \
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                               \
                   " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
                   "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51," \
                   "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"                      \
                   : MW_ACC8(0), MW_ACC8(8), MW_ACC8(16), MW_ACC8(24), MW_ACC8(32), MW_ACC8(40), MW_ACC8(48), MW_ACC8(56) \
                   : "l"(a), "l"(b));                                                                                     \
    }                                                                                                                     \
  };
MW_MMA(__nv_bfloat16, "bf16")
MW_MMA(__half, "f16")

template <int N>
__device__ __forceinline__ void mw_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Tile blockIdx.x of moe_sort's list (expert e, rows m0 .. m0 + 128 of its group); blockIdx.y
// picks 128 h columns (GATED) or 256 output columns. x's rows (ldx apart) are gathered through
// `order` (pair → token = pair / k) when `gather`, else the group's rows of x are read in place.
// w: the experts' weights [E][GATED ? 2N : N][K]. K a multiple of 64, N of 64 (GATED) or 128.
template <typename T, bool GATED>
__device__ __forceinline__ void grouped_wg(const T* __restrict__ x, long ldx, const int* __restrict__ order, int k, int gather,
                                           const int* __restrict__ offsets, const int2* __restrict__ tiles,
                                           const int* __restrict__ ntiles, const T* __restrict__ w, int N, int K, void* out) {
  extern __shared__ unsigned char mw_raw[];
  if ((int)blockIdx.x >= ntiles[0]) return;
  const int2 tile = tiles[blockIdx.x];
  const int e = tile.x, m0 = tile.y, o0 = offsets[e], rows = min(MW_ROWS, offsets[e + 1] - o0 - m0);
  // Columns of the output this CTA writes: warpgroup g's from c0 + g · CW.
  constexpr int CW = GATED ? 64 : 128;
  const int c0 = blockIdx.y * 2 * CW;
  if (c0 >= N) return;
  const unsigned raw = (unsigned)__cvta_generic_to_shared(mw_raw);
  const unsigned base = (raw + 1023u) & ~1023u;
  const int tid = threadIdx.x, piece = tid & 7, r0 = tid >> 3;

  // This thread's copies a stage: A's rows r0 and r0 + 64, B's rows r0 + 64j (j < 4), each its
  // 16-byte piece `piece` of the stage's 128 bytes. Rows past the tile or the weights are zeros.
  const T* a_src[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = r0 + 64 * j;
    const size_t row = r < rows ? (gather ? (size_t)(order[o0 + m0 + r] / k) : (size_t)(o0 + m0 + r)) : 0;
    a_src[j] = r < rows ? x + row * ldx + piece * 8 : nullptr;
  }
  const T* we = w + (size_t)e * (GATED ? 2 * N : N) * K;
  const T* b_src[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = r0 + 64 * j, g = r >> 7, rr = r & 127;
    int n;  // the weight row, or −1 past the weights
    if constexpr (GATED) {
      const int col = c0 + g * CW + (rr & 63);
      n = col < N ? (rr < 64 ? col : N + col) : -1;
    } else {
      const int col = c0 + g * CW + rr;
      n = col < N ? col : -1;
    }
    b_src[j] = n >= 0 ? we + (size_t)n * K + piece * 8 : nullptr;
  }
  auto load = [&](int stage, int kt) {
    const unsigned sa = base + stage * MW_STAGE_BYTES, sb = sa + MW_A_BYTES;
    const int k0 = kt * 64;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = r0 + 64 * j;
      cp_async16(sa + wg_swz(r, piece), a_src[j] ? a_src[j] + k0 : x, a_src[j] != nullptr);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = r0 + 64 * j;
      cp_async16(sb + wg_swz(r, piece), b_src[j] ? b_src[j] + k0 : w, b_src[j] != nullptr);
    }
  };

  // This warpgroup's rows (rh) and weight rows (g).
  const int kts = K / 64, rh = (tid >> 7) & 1, g = tid >> 8;
  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.0f;
  // Two stages ahead of the products: the buffer a copy refills was last read by the products two
  // steps back, which both warpgroups waited for before the barrier the copy follows.
#pragma unroll
  for (int s = 0; s < MW_STAGES - 2; ++s) {
    if (s < kts) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < kts; ++kt) {
    mw_cp_wait<MW_STAGES - 3>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (kt + MW_STAGES - 2 < kts) load((kt + MW_STAGES - 2) % MW_STAGES, kt + MW_STAGES - 2);
    cp_async_commit();
    const unsigned sa = base + (kt % MW_STAGES) * MW_STAGE_BYTES, sb = sa + MW_A_BYTES + g * (128 * 128);
    const unsigned sw = sa + rh * (64 * 128);
    wg_regs(d);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) MwMma<T>::run(d, wg_desc_k(sw + kk * 32), wg_desc_k(sb + kk * 32));
    wg_commit();
    wg_wait<1>();
  }
  wg_wait<0>();
  wg_regs(d);

  // Accumulator i of this thread: row 64·rh + 16·warp + g8 (+ 8 when i % 4 ≥ 2), column
  // 8·(i / 4) + 2·t4 + i % 2 of the warpgroup's 128.
  const int lane = tid & 31, warp = (tid >> 5) & 3, g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = 64 * rh + 16 * warp + g8 + 8 * half;
    if (r >= rows) continue;
    const size_t row = (size_t)(o0 + m0 + r) * N;
    if constexpr (GATED) {
      T* h = static_cast<T*>(out);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = c0 + g * CW + 8 * j + 2 * t4;
        if (col >= N) continue;
        float v[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          // moe.cu's roundings: g and u to T, silu(g) to T, the product to T.
          const float gv = to_f32(from_f32<T>(d[4 * j + 2 * half + q])), uv = to_f32(from_f32<T>(d[4 * (j + 8) + 2 * half + q]));
          v[q] = to_f32(from_f32<T>(gv / (1.0f + expf(-gv)))) * uv;
        }
        // The two columns in one 4-byte store (N and col are even).
        T pair[2] = {from_f32<T>(v[0]), from_f32<T>(v[1])};
        *reinterpret_cast<unsigned*>(h + row + col) = *reinterpret_cast<const unsigned*>(pair);
      }
    } else {
      float* y = static_cast<float*>(out);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = c0 + g * CW + 8 * j + 2 * t4;
        if (col < N) *reinterpret_cast<float2*>(y + row + col) = make_float2(d[4 * j + 2 * half], d[4 * j + 2 * half + 1]);
      }
    }
  }
}

#define MOE_WG_ENTRIES(T, NAME)                                                                                       \
  extern "C" __global__ void __launch_bounds__(MW_THREADS, 1)                                                         \
      moe_up_wg_##NAME(const T* x, long ldx, const int* order, int k, const int* offsets, const int2* tiles,          \
                       const int* ntiles, const T* w, int N, int K, T* out) {                                         \
    pdl_entry();                                                                                                      \
    MW_BODY(grouped_wg<T, true>(x, ldx, order, k, 1, offsets, tiles, ntiles, w, N, K, out));                          \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(MW_THREADS, 1) moe_down_wg_##NAME(                                     \
      const T* h, const int* offsets, const int2* tiles, const int* ntiles, const T* w, int N, int K, float* out) {    \
    pdl_entry();                                                                                                      \
    MW_BODY(grouped_wg<T, false>(h, K, nullptr, 1, 0, offsets, tiles, ntiles, w, N, K, out));                         \
  }
MOE_WG_ENTRIES(__nv_bfloat16, bf16)
MOE_WG_ENTRIES(__half, f16)
