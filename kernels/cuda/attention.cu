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
// attn_decode_C_g*  a decode step's rows (one new row a sequence): the append's work done by
//                   the row kernel's blocks themselves, one launch fewer, the same bits.
// attn_combine_T    the splits' partial softmaxes into the output, in the layer's type T,
//                   gated where the layer has Qwen's output gate.
// (Prefill of bf16/f16 models on the tensor cores: attention_tiles.cu.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include <cstddef>

#include "attention.cuh"
#include "common.cuh"

#define MAX_SPLITS 16  // key splits per query row at most (attn_rows); cuda/attention.rs knows it too
#define MIN_SPLIT 16   // keys a split takes at least, so short rows use few splits
#define ROW_THREADS 128
#define KU 8   // key-row loads a thread has in flight at once (attn_rows)
#define VU 16  // value-row loads a thread has in flight at once (attn_rows)

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

// A load through the read-only path (NC), or a plain one: the fused decode kernel reads the
// key and value it wrote itself, which the non-coherent path may not see.
template <bool NC, typename V>
__device__ __forceinline__ V ld(const V* p) {
  if constexpr (NC) return __ldg(p);
  else return *p;
}

// Four consecutive cache elements as fp32 (one 16- or 8-byte load; p aligned to 4 elements).
template <bool NC>
__device__ __forceinline__ float4 load4(const float* p) { return ld<NC>(reinterpret_cast<const float4*>(p)); }
template <bool NC, typename C>
__device__ __forceinline__ float4 load4(const C* p) {
  union {
    uint2 u;
    C h[4];
  } x;
  x.u = ld<NC>(reinterpret_cast<const uint2*>(p));
  return make_float4(to_f(x.h[0]), to_f(x.h[1]), to_f(x.h[2]), to_f(x.h[3]));
}

// Two consecutive cache elements as fp32 (one 8- or 4-byte load; p aligned to 2 elements).
template <bool NC>
__device__ __forceinline__ float2 load2(const float* p) { return ld<NC>(reinterpret_cast<const float2*>(p)); }
template <bool NC, typename C>
__device__ __forceinline__ float2 load2(const C* p) {
  union {
    unsigned u;
    C h[2];
  } x;
  x.u = ld<NC>(reinterpret_cast<const unsigned*>(p));
  return make_float2(to_f(x.h[0]), to_f(x.h[1]));
}

// One (row, head) vector: rotated by the row's position over its first `rot` channels
// (half-split pairs (i, i + rot/2), angle pos · inv_freq[i] in fp32), the rest copied.
// Channel i of the rotated vector, given the angle's sine and cosine (one expression for the
// append and the fused decode kernel, so that both round alike).
__device__ __forceinline__ float rope_at(const float* src, int i, int half, float s, float c) {
  return i < half ? src[i] * c - src[i + half] * s : src[i] * c + src[i - half] * s;
}

// The sine and cosine of channel i's angle (i < rot).
__device__ __forceinline__ void rope_angle(int i, int rot, int pos, const float* inv_freq, float& s, float& c) {
  const int half = rot / 2;
  sincosf((float)pos * inv_freq[i < half ? i : i - half], &s, &c);
}

// rope_copy by the 32 lanes of one warp.
template <typename D>
__device__ __forceinline__ void rope_copy_lanes(D* dst, const float* src, int hd, int pos, const float* inv_freq, int rot,
                                                int lane) {
  for (int i = lane; i < hd; i += 32) {
    float y = src[i];
    if (i < rot) {
      float s, c;
      rope_angle(i, rot, pos, inv_freq, s, c);
      y = rope_at(src, i, rot / 2, s, c);
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

// One warp a (row, head) pair, eight a block: warps whose head is below HQ rotate a query head
// into q_out (f32), the others rotate a key head into the cache and copy its value head beside
// it. inv_freq may be null (no RoPE). Lane l holds channels l + 32j. The norm adds the squares
// as a block of APPEND_ORDER threads would (thread t's channels t, then t + 128, in order; each
// warp's sum; the warps' sums in order), which is attn_decode's prologue's order, so the two
// give a row the same bits. (A block a pair spent most of a prefill's append launching blocks of
// little work: 57 µs a layer at 4,096 rows of ten heads.)
#define APPEND_WARPS 8
#define APPEND_ORDER 128
template <typename C, typename I>
__device__ void attn_append(const QkvRows& in, float* __restrict__ q_out, C* __restrict__ kc, C* __restrict__ vc,
                            const int* __restrict__ tables, int width, int bs, const int* __restrict__ row_slot,
                            const int* __restrict__ row_pos, const float* __restrict__ inv_freq, int rot, int HQ, int HKV,
                            int hd, int N) {
  __shared__ float x_s[APPEND_WARPS][256];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long pair = (long)blockIdx.x * APPEND_WARPS + warp;
  if (pair >= (long)N * (HQ + HKV)) return;
  const int n = (int)(pair / (HQ + HKV)), h = (int)(pair % (HQ + HKV)), pos = row_pos[n];
  const bool is_q = h < HQ;
  const int kh = h - HQ;
  const I* row = is_q ? static_cast<const I*>(in.q) + (size_t)n * in.ldq + (size_t)h * hd
                      : static_cast<const I*>(in.k) + (size_t)n * in.ldk + (size_t)kh * hd;
  const I* vrow = static_cast<const I*>(in.v) + (size_t)n * in.ldv + (size_t)max(kh, 0) * hd;
  constexpr int J = 256 / 32, WO = APPEND_ORDER / 32;
  float x[J], v[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = lane + 32 * j;
    x[j] = i < hd ? to_f(row[i]) : 0.0f;
    v[j] = !is_q && i < hd ? to_f(vrow[i]) : 0.0f;
  }
  const float* w = is_q ? in.q_norm : in.k_norm;
  if (w) {
    // Channel lane + 32·j is thread lane + 32·(j mod WO)'s, in order of j.
    float total = 0.0f;
#pragma unroll
    for (int b = 0; b < WO; ++b) {
      float ss = 0.0f;
#pragma unroll
      for (int j = b; j < J; j += WO) ss += x[j] * x[j];
      total += warp_sum(ss);
    }
    const float inv = rsqrtf(total / hd + in.eps);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int i = lane + 32 * j;
      if (i < hd) x[j] = x[j] * inv * w[i];
    }
  }
  float* xs = x_s[warp];
#pragma unroll
  for (int j = 0; j < J; ++j) xs[lane + 32 * j] = x[j];
  __syncwarp();
  const int r = inv_freq ? rot : 0;
  if (is_q) {
    rope_copy_lanes(q_out + ((size_t)n * HQ + h) * hd, xs, hd, pos, inv_freq, r, lane);
    return;
  }
  const size_t dst = kv_offset(tables + (size_t)row_slot[n] * width, pos, bs, HKV * hd) + (size_t)kh * hd;
  rope_copy_lanes(kc + dst, xs, hd, pos, inv_freq, r, lane);
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = lane + 32 * j;
    if (i < hd) vc[dst + i] = from_f<C>(v[j]);
  }
}

// attn_append_{cache}_{input}.
#define APPEND_KERNEL(NAME, C, INAME, I)                                                                            \
  extern "C" __global__ void attn_append_##NAME##_##INAME(const __grid_constant__ QkvRows in, float* q_out, C* kc,   \
                                                         C* vc, const int* tables, int width, int bs,                \
                                                         const int* row_slot, const int* row_pos,                    \
                                                         const float* inv_freq, int rot, int HQ, int HKV, int hd,  \
                                                         int N) {                                                  \
    pdl_entry();                                                                                                    \
    attn_append<C, I>(in, q_out, kc, vc, tables, width, bs, row_slot, row_pos, inv_freq, rot, HQ, HKV, hd, N);       \
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
// What a row block's prologue knows: its row, KV head, first query head of the group and key
// split [a, b), and where the row's position lies in the cache.
struct RowBlock {
  int n, kvh, g0, G, HQ, HKV, hd, pos, a, b, bs;
  float scale;
  const int* table;
};

// The prologue of attn_rows: the block's GC query heads, RoPE'd by the append, from q (f32).
struct RotatedQ {
  const float* q;
  template <int GC>
  __device__ __forceinline__ void operator()(float (&q_s)[GC][256], const RowBlock& r) const {
    // Every load of q in flight before the first store (a decode step's row is latency-bound).
    constexpr int QN = GC * 256 / ROW_THREADS;
    const int t = threadIdx.x;
    float qv[QN];
#pragma unroll
    for (int e = 0; e < QN; ++e) {
      const int i = t + e * ROW_THREADS, g = i / 256, d = i % 256;
      // Clamped into the row and then zeroed, not branched around (see the key loads below).
      const float x = q[((size_t)r.n * r.HQ + r.kvh * r.G + min(r.g0 + g, r.G - 1)) * r.hd + min(d, r.hd - 1)];
      qv[e] = r.g0 + g < r.G && d < r.hd ? x * r.scale : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < QN; ++e) q_s[(t + e * ROW_THREADS) / 256][(t + e * ROW_THREADS) % 256] = qv[e];
  }
};

// The prologue of attn_decode: the append's arithmetic (attn_append's norm in its order)
// for the block's GC query heads, and, in the block whose split holds the row's position, for
// its key head, written with the value head into the cache. All heads' loads are in flight
// together, and their norms share one barrier. Bit for bit attn_append then RotatedQ.
template <typename I, typename C>
struct FusedQkv {
  QkvRows in;
  C* kc;
  C* vc;
  const float* inv_freq;
  int rot;
  template <int GC>
  __device__ __forceinline__ void operator()(float (&q_s)[GC][256], const RowBlock& r) const {
    static_assert(ROW_THREADS == 128, "two elements a thread cover a head of 256");
    constexpr int S = GC + 1;  // GC query heads, then the key head
    __shared__ float x_s[S][256];
    __shared__ float part[S][ROW_THREADS / 32];
    const int t = threadIdx.x, hd = r.hd;
    const bool own = r.a <= r.pos && r.pos < r.b;
    float x[S][2], v[2];
    const I* vrow = static_cast<const I*>(in.v) + (size_t)r.n * in.ldv + (size_t)r.kvh * hd;
#pragma unroll
    for (int e = 0; e < S; ++e) {
      const bool live = e < GC ? r.g0 + e < r.G : own;
      const I* row = e < GC ? static_cast<const I*>(in.q) + (size_t)r.n * in.ldq +
                                  (size_t)(r.kvh * r.G + min(r.g0 + e, r.G - 1)) * hd
                            : static_cast<const I*>(in.k) + (size_t)r.n * in.ldk + (size_t)r.kvh * hd;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int i = t + u * ROW_THREADS;
        x[e][u] = live && i < hd ? to_f(row[i]) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int i = t + u * ROW_THREADS;
      v[u] = own && i < hd ? to_f(vrow[i]) : 0.0f;
    }
    // attn_append's sums: each thread's squares in order, the warp, then the warps in order (the
    // warps past a head of 64 add zeros).
#pragma unroll
    for (int e = 0; e < S; ++e) {
      float ss = 0.0f;
#pragma unroll
      for (int u = 0; u < 2; ++u) ss += x[e][u] * x[e][u];
      ss = warp_sum(ss);
      if ((t & 31) == 0) part[e][t >> 5] = ss;
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < S; ++e) {
      const float* w = e < GC ? in.q_norm : in.k_norm;
      float inv = 0.0f;
      if (w) {
        float total = 0.0f;
        for (int j = 0; j < ROW_THREADS / 32; ++j) total += part[e][j];
        inv = rsqrtf(total / hd + in.eps);
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int i = t + u * ROW_THREADS;
        if (i < hd) x_s[e][i] = w ? x[e][u] * inv * w[i] : x[e][u];
      }
    }
    __syncthreads();
    const int rot = inv_freq ? this->rot : 0;
    const size_t dst = kv_offset(r.table, r.pos, r.bs, r.HKV * hd) + (size_t)r.kvh * hd;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int i = t + u * ROW_THREADS;
      float s = 0.0f, c = 1.0f;
      if (i < rot) rope_angle(i, rot, r.pos, inv_freq, s, c);
#pragma unroll
      for (int e = 0; e < S; ++e) {
        const float y = i < hd ? (i < rot ? rope_at(x_s[e], i, rot / 2, s, c) : x_s[e][i]) : 0.0f;
        if (e < GC) {
          q_s[e][i] = r.g0 + e < r.G && i < hd ? y * r.scale : 0.0f;
        } else if (own && i < hd) {
          kc[dst + i] = from_f<C>(y);
          vc[dst + i] = from_f<C>(v[u]);
        }
      }
    }
  }
};

template <int GC, typename C, bool NC, typename P>
__device__ void attn_rows(const P& prologue, const C* kc, const C* vc, const int* __restrict__ tables, int width,
                          int bs, const int* __restrict__ row_slot, const int* __restrict__ row_pos, int HQ, int HKV,
                          int hd, int window, float scale, int splits, float* __restrict__ part,
                          float* __restrict__ ml) {
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
  prologue(q_s, RowBlock{n, kvh, g0, G, HQ, HKV, hd, pos, a, b, bs, scale, table});
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
        // KU loads in flight, then their sums in channel order. The loads' addresses are
        // clamped into the row rather than branched around: a load behind a branch waits for
        // the sums before it, one round trip to memory a step.
        for (int d0k = sub * 4; d0k < hd; d0k += 4 * tpk * KU) {
          float4 k4[KU];
#pragma unroll
          for (int u = 0; u < KU; ++u) k4[u] = load4<NC>(kr + min(d0k + u * 4 * tpk, hd - 4));
#pragma unroll
          for (int u = 0; u < KU; ++u) {
            const int d = d0k + u * 4 * tpk;
            if (d < hd) {
#pragma unroll
              for (int g = 0; g < GC; ++g) {
                const float4 q4 = *reinterpret_cast<const float4*>(&q_s[g][d]);
                s[g] += q4.x * k4[u].x + q4.y * k4[u].y + q4.z * k4[u].z + q4.w * k4[u].w;
              }
            }
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
    if (d0 < hd && pairs) {
      // VU keys' loads in flight (indices clamped, not branched around), then their products
      // in key order.
      for (int i0 = 0; i0 < keys; i0 += VU) {
        float2 v[VU];
#pragma unroll
        for (int u = 0; u < VU; ++u) v[u] = load2<NC>(vc + off_s[min(i0 + u, keys - 1)] + d0);
#pragma unroll
        for (int u = 0; u < VU; ++u) {
          if (i0 + u < keys) {
#pragma unroll
            for (int g = 0; g < GC; ++g) {
              acc[g][0] += p_s[g][i0 + u] * v[u].x;
              acc[g][1] += p_s[g][i0 + u] * v[u].y;
            }
          }
        }
      }
    } else if (d0 < hd) {
      for (int i = 0; i < keys; ++i) {
        const C* vr = vc + off_s[i] + d0;
        const float2 v = make_float2(to_f(vr[0]), d0 + 1 < hd ? to_f(vr[1]) : 0.0f);
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
    // attn_combine weighs an empty split (m = −∞) by 0: it loads its output slot with the others
    // but selects it away, never adding it.
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
                               float scale, int splits, float* part, float* ml) {                                     \
    pdl_entry();                                                                                                    \
    attn_rows<GC, C, true>(RotatedQ{q}, kc, vc, tables, width, bs, row_slot, row_pos, HQ, HKV, hd, window, scale,      \
                           splits, part, ml);                                                                         \
  }
// attn_decode_{cache}_g{GC}: q, k, v from the projection in the cache's own type (rows of one
// new token a sequence, so only the block whose split holds a row's position reads its key).
#define DECODE_KERNEL(NAME, C, GC)                                                                                  \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS)                                                         \
      attn_decode_##NAME##_g##GC(const __grid_constant__ QkvRows in, C* kc, C* vc, const int* tables, int width,       \
                                 int bs, const int* row_slot, const int* row_pos, const float* inv_freq, int rot,      \
                                 int HQ, int HKV, int hd, int window, float scale, int splits, float* part,             \
                                 float* ml) {                                                                         \
    pdl_entry();                                                                                                    \
    attn_rows<GC, C, false>(FusedQkv<C, C>{in, kc, vc, inv_freq, rot}, kc, vc, tables, width, bs, row_slot, row_pos,  \
                            HQ, HKV, hd, window, scale, splits, part, ml);                                            \
  }
// The append (from each input type), the row kernels and the fused decode kernels for each
// cache type (GC = 1, 2, 4 query heads a block).
#define CACHE_KERNELS(NAME, C)                \
  APPEND_KERNEL(NAME, C, f32, float)          \
  APPEND_KERNEL(NAME, C, bf16, __nv_bfloat16) \
  APPEND_KERNEL(NAME, C, f16, __half)         \
  ROWS_KERNEL(NAME, C, 1)                     \
  ROWS_KERNEL(NAME, C, 2)                     \
  ROWS_KERNEL(NAME, C, 4)                     \
  DECODE_KERNEL(NAME, C, 1)                   \
  DECODE_KERNEL(NAME, C, 2)                   \
  DECODE_KERNEL(NAME, C, 4)
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
  // Every split's (max, sum) loaded at once (past the last split, the last one's again): loads
  // behind branches would wait for one another.
  float ms[MAX_SPLITS], ls[MAX_SPLITS];
#pragma unroll
  for (int s = 0; s < MAX_SPLITS; ++s) {
    const int c = min(s, splits - 1);
    ms[s] = mls[2 * c];
    ls[s] = mls[2 * c + 1];
  }
  float mx = -INFINITY;
#pragma unroll
  for (int s = 0; s < MAX_SPLITS; ++s) mx = s < splits ? fmaxf(mx, ms[s]) : mx;
  float w[MAX_SPLITS], sum = 0.0f;
#pragma unroll
  for (int s = 0; s < MAX_SPLITS; ++s) {
    w[s] = s < splits && ms[s] > -INFINITY ? expf(ms[s] - mx) : 0.0f;
    if (s < splits) sum += ls[s] * w[s];
  }
  const float inv = 1.0f / sum;
  const T* g = gate ? gate + (nh / HQ) * ldg + (nh % HQ) * hd : nullptr;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    // Every split's load in flight (past the last split, the last one's again), then the sum in
    // split order.
    float p[MAX_SPLITS];
#pragma unroll
    for (int s = 0; s < MAX_SPLITS; ++s) p[s] = part[(nh * splits + min(s, splits - 1)) * hd + d];
    // A select, not a branch, so that the loads stay ahead of it (an empty split's output is
    // never written: its garbage is selected away, never added).
    float o = 0.0f;
#pragma unroll
    for (int s = 0; s < MAX_SPLITS; ++s) o = w[s] != 0.0f ? o + p[s] * w[s] : o;
    o *= inv;
    out[nh * hd + d] = from_f<T>(g ? o * ds_sigmoid(to_f(g[d])) : o);
  }
}

// attn_combine_{out dtype}.
#define COMBINE_KERNEL(T, NAME)                                                                                     \
  extern "C" __global__ void attn_combine_##NAME(const float* part, const float* ml, T* out, const T* gate, long ldg, \
                                                 int HQ, int hd, int splits) { pdl_entry();                                      \
    attn_combine<T>(part, ml, out, gate, ldg, HQ, hd, splits);                                                      \
  }
COMBINE_KERNEL(float, f32)
COMBINE_KERNEL(__nv_bfloat16, bf16)
COMBINE_KERNEL(__half, f16)
