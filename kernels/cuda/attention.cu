// Softmax attention over a paged KV cache (hybrid-spec.md §1.3–1.4, §3.5, §5.4). The cache of
// one layer is two buffers of blocks, [block_size, HKV, hd] each, in C = f32 (f32 models) or
// the model's bf16/f16 (as the references keep it); a sequence finds its blocks through its
// row of a [slots, width] block table that lives on the device (so a CUDA graph of the decode
// step reads whatever table the pool holds when it is replayed).
//
// attn_append_C_I   q, k and v read in place from the rows of the qkv projection (in I = f32,
//                   bf16 or f16), per-head RMSNorm on q and k (optional), RoPE on q and k,
//                   then k and v into their blocks at each row's position.
// attn_rows_C_g*    one query row per block row of the grid, fp32 arithmetic: decode, and
//                   prefill of f32 models. Each row is cut into the launch's number of key
//                   splits, each a contiguous key range that depends only on the row's own
//                   position and that number, so a CUDA graph captures one grid for every later
//                   context length, and in batch-invariant mode (always MAX_SPLITS) a row's
//                   result does not depend on which rows share the launch.
// attn_combine      the splits' partial softmaxes into the output.
// attn_tiles_T_d*   prefill of bf16/f16 models (cache in T): 64 query rows of one sequence and
//                   one head against 64-key tiles with mma.sync on the tensor cores, keys and
//                   values copied asynchronously into shared memory while the previous
//                   product runs; scores, softmax and the output stay in registers, in fp32
//                   (operands rounded to T, as flash-attention rounds them).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include <cstddef>

#include "common.cuh"

#define MAX_SPLITS 16  // key splits per query row at most (attn_rows); cuda/attention.rs knows it too
#define MIN_SPLIT 16   // keys a split takes at least, so short rows use few splits
#define ROW_THREADS 128

// Cache elements to and from fp32.
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename C>
__device__ __forceinline__ C from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

// Four consecutive cache elements as fp32 (one 16- or 8-byte load; p aligned to 4 elements).
__device__ __forceinline__ float4 load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
template <typename C>
__device__ __forceinline__ float4 load4(const C* p) {
  union {
    uint2 u;
    C h[4];
  } x;
  x.u = __ldg(reinterpret_cast<const uint2*>(p));
  return make_float4(to_f(x.h[0]), to_f(x.h[1]), to_f(x.h[2]), to_f(x.h[3]));
}

// Two consecutive cache elements as fp32 (one 8- or 4-byte load; p aligned to 2 elements).
__device__ __forceinline__ float2 load2(const float* p) { return __ldg(reinterpret_cast<const float2*>(p)); }
template <typename C>
__device__ __forceinline__ float2 load2(const C* p) {
  union {
    unsigned u;
    C h[2];
  } x;
  x.u = __ldg(reinterpret_cast<const unsigned*>(p));
  return make_float2(to_f(x.h[0]), to_f(x.h[1]));
}

// Offset (in elements) of key position `pos`'s [HKV, hd] row in a cache buffer.
__device__ __forceinline__ size_t kv_offset(const int* __restrict__ table, int pos, int bs, int row) {
  return ((size_t)table[pos / bs] * bs + pos % bs) * row;
}

// One (row, head) vector: rotated by the row's position over its first `rot` channels
// (half-split pairs (i, i + rot/2), angle pos · inv_freq[i] in fp32), the rest copied.
template <typename D>
__device__ __forceinline__ void rope_copy(D* dst, const float* src, int hd, int pos, const float* inv_freq, int rot) {
  const int half = rot / 2;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float y = src[i];
    if (i < rot) {
      const int j = i < half ? i : i - half;
      float s, c;
      sincosf((float)pos * inv_freq[j], &s, &c);
      y = i < half ? src[i] * c - src[i + half] * s : src[i] * c + src[i - half] * s;
    }
    dst[i] = from_f<D>(y);
  }
}

// The new rows' q, k and v as the layer's projection leaves them: row n of q at q + n·ldq (in
// elements of I), head h from column h·hd (likewise k, v); per-head RMSNorm weights [hd] for q
// and k (f32, or null: no norm). The launcher passes it by value; attention.rs's QkvArgs
// mirrors its layout field for field.
struct QkvRows {
  const void *q, *k, *v;
  long ldq, ldk, ldv;
  const float *q_norm, *k_norm;
  float eps;
};

// Head `h` of row n of `src` (row stride ld) into x_s as fp32; with a norm weight, RMSNorm'd:
// x / sqrt(mean(x²) + eps) · w, the squares summed by each thread in order, then by warp, then
// the warps in order. Ends with the block synchronised.
template <typename I>
__device__ void head_in(float* x_s, const void* src, long ld, int n, int h, int hd, const float* __restrict__ w,
                        float eps) {
  __shared__ float part[32];
  const I* row = static_cast<const I*>(src) + (size_t)n * ld + (size_t)h * hd;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    const float x = to_f(row[i]);
    x_s[i] = x;
    ss += x * x;
  }
  if (w) {
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int j = 0; j < (int)(blockDim.x >> 5); ++j) total += part[j];
    const float inv = rsqrtf(total / hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) x_s[i] = x_s[i] * inv * w[i];
  }
  __syncthreads();
}

// grid (N, HQ + HKV): blocks below HQ rotate a query head into q_out (f32), the others rotate
// a key head into the cache and copy its value head beside it. inv_freq may be null (no RoPE).
template <typename C, typename I>
__device__ void attn_append(const QkvRows& in, float* __restrict__ q_out, C* __restrict__ kc, C* __restrict__ vc,
                            const int* __restrict__ tables, int width, int bs, const int* __restrict__ row_slot,
                            const int* __restrict__ row_pos, const float* __restrict__ inv_freq, int rot, int HQ, int HKV,
                            int hd) {
  __shared__ float x_s[256];
  const int n = blockIdx.x, h = blockIdx.y, pos = row_pos[n];
  const int r = inv_freq ? rot : 0;
  if (h < HQ) {
    head_in<I>(x_s, in.q, in.ldq, n, h, hd, in.q_norm, in.eps);
    rope_copy(q_out + ((size_t)n * HQ + h) * hd, x_s, hd, pos, inv_freq, r);
    return;
  }
  const int kh = h - HQ;
  head_in<I>(x_s, in.k, in.ldk, n, kh, hd, in.k_norm, in.eps);
  const size_t dst = kv_offset(tables + (size_t)row_slot[n] * width, pos, bs, HKV * hd) + (size_t)kh * hd;
  rope_copy(kc + dst, x_s, hd, pos, inv_freq, r);
  const I* vr = static_cast<const I*>(in.v) + (size_t)n * in.ldv + (size_t)kh * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) vc[dst + i] = from_f<C>(to_f(vr[i]));
}

// attn_append_{cache}_{input}.
#define APPEND_KERNEL(NAME, C, INAME, I)                                                                            \
  extern "C" __global__ void attn_append_##NAME##_##INAME(const __grid_constant__ QkvRows in, float* q_out, C* kc,   \
                                                         C* vc, const int* tables, int width, int bs,                \
                                                         const int* row_slot, const int* row_pos,                    \
                                                         const float* inv_freq, int rot, int HQ, int HKV, int hd) {  \
    attn_append<C, I>(in, q_out, kc, vc, tables, width, bs, row_slot, row_pos, inv_freq, rot, HQ, HKV, hd);          \
  }
static_assert(sizeof(QkvRows) == 72 && offsetof(QkvRows, q_norm) == 48 && offsetof(QkvRows, eps) == 64,
              "struct QkvRows must match QkvArgs in attention.rs");

// grid (N, HKV · ⌈G/GC⌉, splits), ROW_THREADS threads: GC query heads of one KV head over one
// key split of one row, in chunks of ROW_THREADS / tpk keys. The launcher picks `splits` (≤
// MAX_SPLITS) once per launch shape: many for a few rows (more blocks in flight), few for many
// (each block's fixed cost, q in and the partial result out, over more keys). Scores: tpk
// adjacent threads a key (tpk = 8, 4, 2 or 1: the most threads a key whose chunk still holds the
// whole split, so that a short split is one chunk of few round trips and a long one few
// chunks), each summing every tpk-th group of four channels (the key row's loads in flight
// together, q broadcast from shared memory), then the key's partial sums in a fixed butterfly. Then the chunk's max and sum per head, and P·V with a
// thread per two adjacent output channels (rows read coalesced in pairs, the chunk's keys
// unrolled). tpk depends only on the row's own position and `splits`. Writes the split's
// unnormalised output and its (max, sum) for attn_combine (an empty split only the latter).
template <int GC, typename C>
__device__ void attn_rows(const float* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc,
                          const int* __restrict__ tables, int width, int bs, const int* __restrict__ row_slot,
                          const int* __restrict__ row_pos, int HQ, int HKV, int hd, int window, float scale,
                          int splits, float* __restrict__ part, float* __restrict__ ml) {
  __shared__ __align__(16) float q_s[GC][256];
  __shared__ float p_s[GC][ROW_THREADS];
  __shared__ size_t off_s[ROW_THREADS];
  __shared__ float red[GC][ROW_THREADS / 32];
  const int n = blockIdx.x, G = HQ / HKV, chunks = (G + GC - 1) / GC;
  const int kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * GC, split = blockIdx.z;
  const int pos = row_pos[n];
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int span = max(MIN_SPLIT, (pos + 1 - lo + splits - 1) / splits);
  const int a = lo + split * span, b = min(a + span, pos + 1);
  const int tpk = span <= ROW_THREADS / 8 ? 8 : span <= ROW_THREADS / 4 ? 4 : span <= ROW_THREADS / 2 ? 2 : 1;
  const int chunk_keys = ROW_THREADS / tpk;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, key = t / tpk, sub = t % tpk;
  const int* table = tables + (size_t)row_slot[n] * width;
  const int row = HKV * hd;
  {
    // Every load of q in flight before the first store (a decode step's row is latency-bound).
    constexpr int QN = GC * 256 / ROW_THREADS;
    float qv[QN];
#pragma unroll
    for (int e = 0; e < QN; ++e) {
      const int i = t + e * ROW_THREADS, g = i / 256, d = i % 256;
      qv[e] = g0 + g < G && d < hd ? q[((size_t)n * HQ + kvh * G + g0 + g) * hd + d] * scale : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < QN; ++e) q_s[(t + e * ROW_THREADS) / 256][(t + e * ROW_THREADS) % 256] = qv[e];
  }
  float m[GC], l[GC], acc[GC][2];
#pragma unroll
  for (int g = 0; g < GC; ++g) m[g] = -INFINITY, l[g] = 0.0f, acc[g][0] = acc[g][1] = 0.0f;
  const bool vec = hd % 4 == 0;
  // Output channels d0 and d0 + 1 (a pair load where hd is even).
  const int d0 = 2 * t;
  const bool pairs = hd % 2 == 0;
  __syncthreads();
  for (int c0 = a; c0 < b; c0 += chunk_keys) {
    const int j = c0 + key;
    float s[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) s[g] = 0.0f;
    if (j < b) {
      const size_t off = kv_offset(table, j, bs, row) + (size_t)kvh * hd;
      if (sub == 0) off_s[key] = off;
      const C* kr = kc + off;
      if (vec) {
#pragma unroll 16
        for (int d = sub * 4; d < hd; d += 4 * tpk) {
          const float4 k4 = load4(kr + d);
#pragma unroll
          for (int g = 0; g < GC; ++g) {
            const float4 q4 = *reinterpret_cast<const float4*>(&q_s[g][d]);
            s[g] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
          }
        }
      } else {
        for (int d = sub; d < hd; d += tpk) {
          const float k1 = to_f(kr[d]);
#pragma unroll
          for (int g = 0; g < GC; ++g) s[g] += q_s[g][d] * k1;
        }
      }
    }
    // The key's partial sums (its tpk threads are adjacent lanes), then the chunk's max per
    // head across the block.
#pragma unroll
    for (int g = 0; g < GC; ++g) {
#pragma unroll
      for (int o = tpk / 2; o > 0; o >>= 1) s[g] += __shfl_xor_sync(0xffffffffu, s[g], o);
      if (j >= b) s[g] = -INFINITY;
      float x = s[g];
#pragma unroll
      for (int o = 16; o >= tpk; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
      if (lane == 0) red[g][warp] = x;
    }
    __syncthreads();
    float corr[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float mx = red[g][0];
      for (int w = 1; w < ROW_THREADS / 32; ++w) mx = fmaxf(mx, red[g][w]);
      const float m_new = fmaxf(m[g], mx);
      corr[g] = expf(m[g] - m_new);  // 0 when m was −∞
      m[g] = m_new;
      if (sub == 0) p_s[g][key] = j < b ? expf(s[g] - m_new) : 0.0f;
    }
    __syncthreads();
    // Sums in a fixed order (keys in order), outputs per channel.
    const int keys = min(chunk_keys, b - c0);
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float sum = 0.0f;
      for (int i = 0; i < keys; ++i) sum += p_s[g][i];
      l[g] = l[g] * corr[g] + sum;
      acc[g][0] *= corr[g];
      acc[g][1] *= corr[g];
    }
    if (d0 < hd) {
#pragma unroll 16
      for (int i = 0; i < keys; ++i) {
        const C* vr = vc + off_s[i] + d0;
        const float2 v = pairs ? load2(vr) : make_float2(to_f(vr[0]), d0 + 1 < hd ? to_f(vr[1]) : 0.0f);
#pragma unroll
        for (int g = 0; g < GC; ++g) {
          acc[g][0] += p_s[g][i] * v.x;
          acc[g][1] += p_s[g][i] * v.y;
        }
      }
    }
    __syncthreads();
  }
  for (int g = 0; g < GC && g0 + g < G; ++g) {
    const size_t at = ((size_t)n * HQ + kvh * G + g0 + g) * splits + split;
    // attn_combine weighs an empty split (m = −∞) by 0 and never reads its output.
    if (a < b && d0 < hd) {
      part[at * hd + d0] = acc[g][0];
      if (d0 + 1 < hd) part[at * hd + d0 + 1] = acc[g][1];
    }
    if (t == 0) {
      ml[2 * at] = m[g];
      ml[2 * at + 1] = l[g];
    }
  }
}

#define ROWS_KERNEL(NAME, C, GC)                                                                                    \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS)                                                         \
      attn_rows_##NAME##_g##GC(const float* q, const C* kc, const C* vc, const int* tables, int width, int bs,         \
                               const int* row_slot, const int* row_pos, int HQ, int HKV, int hd, int window,          \
                               float scale, int splits, float* part, float* ml) {                                   \
    attn_rows<GC, C>(q, kc, vc, tables, width, bs, row_slot, row_pos, HQ, HKV, hd, window, scale, splits, part, ml); \
  }
// The append (from each input type) and the row kernels for each cache type (GC = 1, 2, 4
// query heads a block).
#define CACHE_KERNELS(NAME, C)                \
  APPEND_KERNEL(NAME, C, f32, float)          \
  APPEND_KERNEL(NAME, C, bf16, __nv_bfloat16) \
  APPEND_KERNEL(NAME, C, f16, __half)         \
  ROWS_KERNEL(NAME, C, 1)      \
  ROWS_KERNEL(NAME, C, 2)      \
  ROWS_KERNEL(NAME, C, 4)
CACHE_KERNELS(f32, float)
CACHE_KERNELS(bf16, __nv_bfloat16)
CACHE_KERNELS(f16, __half)

// grid (N · HQ): out = Σ_s part_s · e^(m_s − M) / Σ_s l_s · e^(m_s − M), splits in order, in
// fp32, then (Qwen's gated attention, gate non-null) times sigmoid(gate), rounded once to T.
// out [N, HQ·hd] contiguous; gate [N, HQ·hd] in T with row stride ldg (a column slice of the
// layer's projection, read in place). The same arithmetic as attn_combine into f32 followed by
// sigmoid_gate (swiglu.cu) or a cast, so the fused and the separate paths agree bit for bit.
template <typename T>
__device__ void attn_combine(const float* __restrict__ part, const float* __restrict__ ml, T* __restrict__ out,
                             const T* __restrict__ gate, long ldg, int HQ, int hd, int splits) {
  const size_t nh = blockIdx.x;
  const float* mls = ml + nh * splits * 2;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, mls[2 * s]);
  float w[MAX_SPLITS], sum = 0.0f;
#pragma unroll
  for (int s = 0; s < MAX_SPLITS; ++s) {
    w[s] = s < splits && mls[2 * s] > -INFINITY ? expf(mls[2 * s] - mx) : 0.0f;
    if (s < splits) sum += mls[2 * s + 1] * w[s];
  }
  const float inv = 1.0f / sum;
  const T* g = gate ? gate + (nh / HQ) * ldg + (nh % HQ) * hd : nullptr;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int s = 0; s < MAX_SPLITS; ++s)
      if (w[s] != 0.0f) o += part[(nh * splits + s) * hd + d] * w[s];
    o *= inv;
    out[nh * hd + d] = from_f<T>(g ? o * ds_sigmoid(to_f(g[d])) : o);
  }
}

// attn_combine_{out dtype}.
#define COMBINE_KERNEL(T, NAME)                                                                                     \
  extern "C" __global__ void attn_combine_##NAME(const float* part, const float* ml, T* out, const T* gate, long ldg, \
                                                 int HQ, int hd, int splits) {                                      \
    attn_combine<T>(part, ml, out, gate, ldg, HQ, hd, splits);                                                      \
  }
COMBINE_KERNEL(float, f32)
COMBINE_KERNEL(__nv_bfloat16, bf16)
COMBINE_KERNEL(__half, f16)

// ---- prefill on the tensor cores ----

#define TILE_M 64  // query rows of a block: 16 per warp
#define TILE_N 64  // keys of a tile
#define TILE_THREADS 128

// Shared memory of attn_tiles: Q, K and V tiles of T, rows padded by 16 bytes so that the
// eight rows an ldmatrix reads fall in distinct banks (ops/attention.rs computes the same).
template <typename T, int HD>
struct TileSmem {
  static constexpr int P = HD + 8;
  static constexpr size_t q = (size_t)TILE_M * P * sizeof(T), k = (size_t)TILE_N * P * sizeof(T);
  static constexpr size_t offsets = 2 * TILE_N * sizeof(size_t);
  static constexpr size_t total = q + 2 * k + offsets;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global → shared without passing through registers; zeros when !ok. The "memory"
// clobbers keep the compiler from moving shared-memory accesses across the copies.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a · b for one m16n8k16 tile (PTX ISA "Matrix fragments for mma.m16n8k16").
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as one register of two T (x in the low half: the lower column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float x, float y) {
  __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Element offsets of keys kt..kt+TILE_N−1 of one KV head (0 past the last key), one thread
// per key: the block table is read here once per tile, not once per 16-byte copy.
__device__ __forceinline__ void key_offsets(size_t* off, const int* __restrict__ table, int kt, int keys, int bs, int row,
                                            int head) {
  const int j = threadIdx.x;
  if (j < TILE_N) off[j] = j < keys ? kv_offset(table, kt + j, bs, row) + head : 0;
}

// The keys at `off` (rows ≥ keys zero-filled) into a shared tile, 16 bytes per cp.async.
template <typename T, int HD>
__device__ __forceinline__ void load_kv_tile(T* dst, const T* __restrict__ cache, const size_t* off, int keys) {
  constexpr int CH = HD / 8;  // 16-byte chunks per key
#pragma unroll
  for (int i = threadIdx.x; i < TILE_N * CH; i += TILE_THREADS) {
    const int j = i / CH, c = (i % CH) * 8;
    cp_async16(smem_addr(dst + j * TileSmem<T, HD>::P + c), cache + off[j] + c, j < keys);
  }
}

// One tile t = (first row n0, rows cnt ≤ 64, first position pos0, slot) of one sequence and
// query head h, by TILE_THREADS threads. Warp w owns query rows 16w..16w+15: its scores S (16 × 64), their
// probabilities and its output rows (16 × HD) live in its registers in the mma fragment layout
// (lane = 4g + i holds rows g and g + 8, columns 2i and 2i + 1 of every 8-column tile), so the
// probabilities become the next product's A operand without leaving registers. Loop per key
// tile: wait for K, start V's copy, S = Q Kᵀ and the online softmax, wait for V, start the
// next K's copy, O += P V.
template <typename T, int HD>
__device__ void attn_tiles(const float* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
                           const int* __restrict__ tables, int width, int bs, const int4 t, int h, int HQ, int HKV,
                           int window, float scale, float* __restrict__ out) {
  typedef TileSmem<T, HD> L;
  constexpr int P = L::P, NT = TILE_N / 8, DT = HD / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = reinterpret_cast<T*>(smem + L::q);
  T* Vs = reinterpret_cast<T*>(smem + L::q + L::k);
  // Key offsets of the current and the next tile (double-buffered: the next tile's are written
  // while the current tile's V copy may still read them).
  size_t* offs = reinterpret_cast<size_t*>(smem + L::q + 2 * L::k);

  const int n0 = t.x, cnt = t.y, pos0 = t.z, kvh = h / (HQ / HKV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, i4 = lane % 4;
  const int row = HKV * HD;
  const int* table = tables + (size_t)t.w * width;
  const int last = pos0 + cnt - 1;
  const int first_key = window > 0 ? max(0, pos0 - window + 1) : 0;

  key_offsets(offs, table, first_key, min(TILE_N, last + 1 - first_key), bs, row, kvh * HD);
  __syncthreads();
  load_kv_tile<T, HD>(Ks, kc, offs, min(TILE_N, last + 1 - first_key));
  cp_async_commit();
  // Q (f32, after RoPE) → T, rows ≥ cnt zero.
  for (int i = threadIdx.x; i < TILE_M * (HD / 4); i += TILE_THREADS) {
    const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < cnt) x = __ldg(reinterpret_cast<const float4*>(q + ((size_t)(n0 + r) * HQ + h) * HD + c));
    uint2 u;
    u.x = pack2<T>(x.x, x.y);
    u.y = pack2<T>(x.z, x.w);
    *reinterpret_cast<uint2*>(Qs + r * P + c) = u;
  }

  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  // Rows g and g + 8 of the warp: running max (in log2 units) and this lane's share of the sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int r0 = warp * 16 + g;
  const int qpos[2] = {pos0 + r0, pos0 + r0 + 8};
  const bool live[2] = {r0 < cnt, r0 + 8 < cnt};
  const float sl2 = scale * 1.4426950408889634f;  // exp(x·scale) = 2^(x·sl2)
  // ldmatrix row addresses: A (Q) rows lane % 16, columns 8·(lane / 16); K as B: keys
  // lane % 8 + 8·(lane / 16), columns 8·(lane / 8 % 2); V as B (transposed): keys
  // lane % 8 + 8·(lane / 8 % 2), columns 8·(lane / 16).
  const uint32_t q_lane = smem_addr(Qs + (warp * 16 + lane % 16) * P + (lane / 16) * 8);
  const uint32_t k_lane = smem_addr(Ks + (lane % 8 + (lane / 16) * 8) * P + (lane / 8 % 2) * 8);
  const uint32_t v_lane = smem_addr(Vs + (lane % 8 + (lane / 8 % 2) * 8) * P + (lane / 16) * 8);

  for (int kt = first_key, it = 0; kt <= last; kt += TILE_N, ++it) {
    const int keys = min(TILE_N, last + 1 - kt);
    size_t* off = offs + (it % 2) * TILE_N;
    cp_async_wait_all();
    __syncthreads();  // K is in; every warp is done with the previous V
    load_kv_tile<T, HD>(Vs, vc, off, keys);
    cp_async_commit();
    const bool more = kt + TILE_N <= last;
    if (more) key_offsets(offs + (1 - it % 2) * TILE_N, table, kt + TILE_N, min(TILE_N, last + 1 - kt - TILE_N), bs, row, kvh * HD);
    // Only tiles on the diagonal, at the window's edge or with rows past cnt need a mask.
    const bool whole = kt + TILE_N - 1 <= pos0 && cnt == TILE_M && (window <= 0 || kt > last - window);

    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a, q_lane + kk * 16 * sizeof(T));
#pragma unroll
      for (int jp = 0; jp < NT / 2; ++jp) {
        uint32_t b[4];
        ldsm_x4(b, k_lane + (jp * 16 * P + kk * 16) * sizeof(T));
        mma16816<T>(s[2 * jp], a, b[0], b[1]);
        mma16816<T>(s[2 * jp + 1], a, b[2], b[3]);
      }
    }
    // Mask (causal, window, rows past cnt), new max per row, rescale of the output rows.
    float mx[2] = {-INFINITY, -INFINITY};
    if (whole) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] *= sl2;
          mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
        }
    } else {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hr = e / 2, kpos = kt + 8 * j + 2 * i4 + e % 2;
          const bool ok = live[hr] && kpos <= qpos[hr] && (window <= 0 || kpos > qpos[hr] - window);
          s[j][e] = ok ? s[j][e] * sl2 : -INFINITY;
          mx[hr] = fmaxf(mx[hr], s[j][e]);
        }
    }
    float corr[2], m_new[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
      mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
      m_new[hr] = fmaxf(m[hr], mx[hr]);
      corr[hr] = m_new[hr] == -INFINITY ? 1.0f : exp2f(m[hr] - m_new[hr]);
      m[hr] = m_new[hr];
      l[hr] *= corr[hr];
    }
#pragma unroll
    for (int j = 0; j < DT; ++j) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
    // Probabilities, packed as the A operand of P·V: k-step kk covers key tiles 2kk, 2kk + 1.
    uint32_t pa[TILE_N / 16][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = s[j][e] == -INFINITY ? 0.0f : exp2f(s[j][e] - m_new[e / 2]);
        l[e / 2] += p[e];
      }
      pa[j / 2][(j % 2) * 2] = pack2<T>(p[0], p[1]);
      pa[j / 2][(j % 2) * 2 + 1] = pack2<T>(p[2], p[3]);
    }

    cp_async_wait_all();
    __syncthreads();  // V is in; every warp is done with K; the next tile's offsets are written
    if (more) {
      load_kv_tile<T, HD>(Ks, kc, offs + (1 - it % 2) * TILE_N, min(TILE_N, last + 1 - kt - TILE_N));
      cp_async_commit();
    }
#pragma unroll
    for (int kk = 0; kk < TILE_N / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(b, v_lane + (kk * 16 * P + dp * 16) * sizeof(T));
        mma16816<T>(o[2 * dp], pa[kk], b[0], b[1]);
        mma16816<T>(o[2 * dp + 1], pa[kk], b[2], b[3]);
      }
    }
  }
  // The row sums across the lane quad (fixed order), then the normalised rows.
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
    if (!live[hr]) continue;
    const float inv = 1.0f / l[hr];
    float* dst = out + ((size_t)(n0 + r0 + 8 * hr) * HQ + h) * HD + 2 * i4;
#pragma unroll
    for (int j = 0; j < DT; ++j) *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[j][2 * hr] * inv, o[j][2 * hr + 1] * inv);
  }
}

// grid (⌈tiles / per_block⌉, HQ): block b takes tiles b·per_block.. in turn (cnt 0 ends the
// list early). Two a block when the grid would otherwise take more than one wave: the host
// pairs long tiles with short ones, so that every block has about the same number of keys.
#define TILES_KERNEL(NAME, T, HD)                                                                                  \
  extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)                                                    \
      attn_tiles_##NAME##_d##HD(const float* q, const T* kc, const T* vc, const int* tables, int width, int bs,     \
                                const int4* tiles, int per_block, int HQ, int HKV, int window, float scale,          \
                                float* out) {                                                                       \
    for (int i = 0; i < per_block; ++i) {                                                                           \
      const int4 t = tiles[blockIdx.x * per_block + i];                                                             \
      if (t.y == 0) break;                                                                                          \
      if (i > 0) __syncthreads(); /* the previous tile is done with shared memory */                                \
      attn_tiles<T, HD>(q, kc, vc, tables, width, bs, t, blockIdx.y, HQ, HKV, window, scale, out);                  \
    }                                                                                                               \
  }
#define TILES_KERNELS(NAME, T) TILES_KERNEL(NAME, T, 64) TILES_KERNEL(NAME, T, 128) TILES_KERNEL(NAME, T, 256)
TILES_KERNELS(bf16, __nv_bfloat16)
TILES_KERNELS(f16, __half)
