// Softmax attention over a paged KV cache (hybrid-spec.md §1.3–1.4, §3.5, §5.4). The cache of
// one layer is two f32 buffers of blocks, [block_size, HKV, hd] each; a sequence finds its
// blocks through its row of a [slots, width] block table that lives on the device (so a CUDA
// graph of the decode step reads whatever table the pool holds when it is replayed).
//
// attn_append     RoPE on q and k, then k and v into their blocks at each row's position.
// attn_rows_*     one query row per block row of the grid, fp32 throughout: decode, and prefill
//                 of f32 models. A fixed number of key splits per row, each a contiguous key
//                 range that depends only on the row's own position, so a row's result does
//                 not depend on which rows share the launch (batch invariance) or on the grid
//                 (a CUDA graph captures one grid for every later context length).
// attn_combine    the splits' partial softmaxes into the output.
// attn_tiles_*    prefill of bf16/f16 models: 64 query rows of one sequence and one head against
//                 64-key tiles on the tensor cores (operands rounded to T, as flash-attention
//                 rounds them; scores, softmax and the output accumulate in fp32).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <mma.h>

#include "common.cuh"

using namespace nvcuda;

#define SPLITS 16      // key splits per query row (attn_rows); ops/attention.rs knows it too
#define MIN_SPLIT 64   // keys a split takes at least, so short rows use few splits
#define ROW_THREADS 128

// Offset of key position `pos`'s [HKV, hd] row in a cache buffer.
__device__ __forceinline__ size_t kv_offset(const int* __restrict__ table, int pos, int bs, int row) {
  return ((size_t)table[pos / bs] * bs + pos % bs) * row;
}

// One (row, head) vector: rotated by the row's position over its first `rot` channels
// (half-split pairs (i, i + rot/2), angle pos · inv_freq[i] in fp32), the rest copied.
__device__ __forceinline__ void rope_copy(float* dst, const float* src, int hd, int pos, const float* inv_freq, int rot) {
  const int half = rot / 2;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float y = src[i];
    if (i < rot) {
      const int j = i < half ? i : i - half;
      float s, c;
      sincosf((float)pos * inv_freq[j], &s, &c);
      y = i < half ? src[i] * c - src[i + half] * s : src[i] * c + src[i - half] * s;
    }
    dst[i] = y;
  }
}

// grid (N, HQ + HKV): blocks below HQ rotate a query head into q_out, the others rotate a key
// head into the cache and copy its value head beside it. inv_freq may be null (no RoPE).
extern "C" __global__ void attn_append(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                       float* __restrict__ q_out, float* __restrict__ kc, float* __restrict__ vc,
                                       const int* __restrict__ tables, int width, int bs, const int* __restrict__ row_slot,
                                       const int* __restrict__ row_pos, const float* __restrict__ inv_freq, int rot, int HQ,
                                       int HKV, int hd) {
  const int n = blockIdx.x, h = blockIdx.y, pos = row_pos[n];
  const int r = inv_freq ? rot : 0;
  if (h < HQ) {
    const size_t at = ((size_t)n * HQ + h) * hd;
    rope_copy(q_out + at, q + at, hd, pos, inv_freq, r);
    return;
  }
  const int kh = h - HQ;
  const size_t src = ((size_t)n * HKV + kh) * hd;
  const size_t dst = kv_offset(tables + (size_t)row_slot[n] * width, pos, bs, HKV * hd) + (size_t)kh * hd;
  rope_copy(kc + dst, k + src, hd, pos, inv_freq, r);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) vc[dst + i] = v[src + i];
}

// grid (N, HKV · ⌈G/GC⌉, SPLITS), ROW_THREADS threads: GC query heads of one KV head over one
// key split of one row, in chunks of ROW_THREADS keys. Scores: a thread per key, its whole dot
// product over hd (many independent loads in flight, q broadcast from shared memory). Then the
// chunk's max and sum per head, and P·V with a thread per output channel (rows read coalesced).
// Writes the split's unnormalised output and its (max, sum) for attn_combine.
template <int GC>
__device__ void attn_rows(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                          const int* __restrict__ tables, int width, int bs, const int* __restrict__ row_slot,
                          const int* __restrict__ row_pos, int HQ, int HKV, int hd, int window, float scale,
                          float* __restrict__ part, float* __restrict__ ml) {
  __shared__ __align__(16) float q_s[GC][256];
  __shared__ float p_s[GC][ROW_THREADS];
  __shared__ size_t off_s[ROW_THREADS];
  __shared__ float red[GC][ROW_THREADS / 32];
  const int n = blockIdx.x, G = HQ / HKV, chunks = (G + GC - 1) / GC;
  const int kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * GC, split = blockIdx.z;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int pos = row_pos[n];
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int span = max(MIN_SPLIT, (pos + 1 - lo + SPLITS - 1) / SPLITS);
  const int a = lo + split * span, b = min(a + span, pos + 1);
  const int* table = tables + (size_t)row_slot[n] * width;
  const int row = HKV * hd;
  for (int i = t; i < GC * 256; i += ROW_THREADS) {
    const int g = i / 256, d = i % 256;
    q_s[g][d] = g0 + g < G && d < hd ? q[((size_t)n * HQ + kvh * G + g0 + g) * hd + d] * scale : 0.0f;
  }
  float m[GC], l[GC], acc[GC][2];
#pragma unroll
  for (int g = 0; g < GC; ++g) m[g] = -INFINITY, l[g] = 0.0f, acc[g][0] = acc[g][1] = 0.0f;
  const bool vec = hd % 4 == 0;
  __syncthreads();
  for (int c0 = a; c0 < b; c0 += ROW_THREADS) {
    const int j = c0 + t;
    float s[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) s[g] = -INFINITY;
    if (j < b) {
      const size_t off = kv_offset(table, j, bs, row) + (size_t)kvh * hd;
      off_s[t] = off;
      const float* kr = kc + off;
#pragma unroll
      for (int g = 0; g < GC; ++g) s[g] = 0.0f;
      if (vec) {
        for (int d = 0; d < hd; d += 4) {
          const float4 k4 = __ldg(reinterpret_cast<const float4*>(kr + d));
#pragma unroll
          for (int g = 0; g < GC; ++g) {
            const float4 q4 = *reinterpret_cast<const float4*>(&q_s[g][d]);
            s[g] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
          }
        }
      } else {
        for (int d = 0; d < hd; ++d) {
          const float k1 = __ldg(kr + d);
#pragma unroll
          for (int g = 0; g < GC; ++g) s[g] += q_s[g][d] * k1;
        }
      }
    }
    // The chunk's max per head, across the block.
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float x = s[g];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
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
      p_s[g][t] = j < b ? expf(s[g] - m_new) : 0.0f;
    }
    __syncthreads();
    // Sums in a fixed order (thread 0 of each head, keys in order), outputs per channel.
    const int keys = min(ROW_THREADS, b - c0);
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float sum = 0.0f;
      for (int i = 0; i < keys; ++i) sum += p_s[g][i];
      l[g] = l[g] * corr[g] + sum;
      acc[g][0] *= corr[g];
      acc[g][1] *= corr[g];
    }
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int d = t + h2 * ROW_THREADS;
      if (d < hd) {
        for (int i = 0; i < keys; ++i) {
          const float v = __ldg(vc + off_s[i] + d);
#pragma unroll
          for (int g = 0; g < GC; ++g) acc[g][h2] += p_s[g][i] * v;
        }
      }
    }
    __syncthreads();
  }
  for (int g = 0; g < GC && g0 + g < G; ++g) {
    const size_t at = ((size_t)n * HQ + kvh * G + g0 + g) * SPLITS + split;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int d = t + h2 * ROW_THREADS;
      if (d < hd) part[at * hd + d] = acc[g][h2];
    }
    if (t == 0) {
      ml[2 * at] = m[g];
      ml[2 * at + 1] = l[g];
    }
  }
}

#define ROWS_KERNEL(GC)                                                                                           \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS)                                                       \
      attn_rows_g##GC(const float* q, const float* kc, const float* vc, const int* tables, int width, int bs,        \
                      const int* row_slot, const int* row_pos, int HQ, int HKV, int hd, int window, float scale,   \
                      float* part, float* ml) {                                                                   \
    attn_rows<GC>(q, kc, vc, tables, width, bs, row_slot, row_pos, HQ, HKV, hd, window, scale, part, ml);         \
  }
ROWS_KERNEL(1)
ROWS_KERNEL(2)
ROWS_KERNEL(4)

// grid (N · HQ): out = Σ_s part_s · e^(m_s − M) / Σ_s l_s · e^(m_s − M), splits in order.
extern "C" __global__ void attn_combine(const float* __restrict__ part, const float* __restrict__ ml, float* __restrict__ out,
                                        int hd) {
  const size_t nh = blockIdx.x;
  const float* mls = ml + nh * SPLITS * 2;
  float mx = -INFINITY;
  for (int s = 0; s < SPLITS; ++s) mx = fmaxf(mx, mls[2 * s]);
  float w[SPLITS], sum = 0.0f;
#pragma unroll
  for (int s = 0; s < SPLITS; ++s) {
    w[s] = mls[2 * s] > -INFINITY ? expf(mls[2 * s] - mx) : 0.0f;
    sum += mls[2 * s + 1] * w[s];
  }
  const float inv = 1.0f / sum;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int s = 0; s < SPLITS; ++s)
      if (w[s] != 0.0f) o += part[(nh * SPLITS + s) * hd + d] * w[s];
    out[nh * hd + d] = o * inv;
  }
}

// ---- prefill on the tensor cores ----

#define TILE_M 64
#define TILE_N 64
#define TILE_THREADS 128

template <typename T>
__device__ __forceinline__ T to_t(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 to_t<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half to_t<__half>(float x) { return __float2half(x); }

// Dynamic shared memory of attn_tiles for head dim HD and operand type T (ops/attention.rs
// computes the same sum).
template <typename T, int HD>
struct TileSmem {
  static constexpr int QP = HD + 8, OP = HD + 4, SP = TILE_N + 4, PP = TILE_N + 8;
  static constexpr size_t q = (size_t)TILE_M * QP * sizeof(T), k = (size_t)TILE_N * QP * sizeof(T), v = k;
  static constexpr size_t s = (size_t)TILE_M * SP * 4, p = (size_t)TILE_M * PP * sizeof(T), o = (size_t)TILE_M * OP * 4;
  static constexpr size_t total = q + k + v + s + p + o + 2 * TILE_M * 4;
};

// Four f32 values to four T in shared memory (one 8-byte store).
template <typename T>
__device__ __forceinline__ void store4(T* d, float4 x) {
  union {
    T h[4];
    uint2 u;
  } pack;
  pack.h[0] = to_t<T>(x.x), pack.h[1] = to_t<T>(x.y), pack.h[2] = to_t<T>(x.z), pack.h[3] = to_t<T>(x.w);
  *reinterpret_cast<uint2*>(d) = pack.u;
}

// `rows` f32 rows of HD values from up to two sources (row r at a(r) and b(r); null: zeros) into
// T tiles of pitch qp. Each thread issues LOADS_IN_FLIGHT loads before it converts and stores
// any, so a tile costs a few memory latencies, not one per element group.
#define LOADS_IN_FLIGHT 8
template <typename T, int HD, typename SrcA, typename SrcB>
__device__ __forceinline__ void load_tiles(T* da, T* db, int qp, int rows, SrcA a, SrcB b) {
  constexpr int V4 = HD / 4;
  const int total = rows * V4;
  for (int base = 0; base < total; base += TILE_THREADS * LOADS_IN_FLIGHT) {
    float4 xa[LOADS_IN_FLIGHT], xb[LOADS_IN_FLIGHT];
#pragma unroll
    for (int u = 0; u < LOADS_IN_FLIGHT; ++u) {
      const int i = base + u * TILE_THREADS + threadIdx.x, r = i / V4, c = (i % V4) * 4;
      const float* pa = i < total ? a(r) : nullptr;
      const float* pb = i < total && db ? b(r) : nullptr;
      xa[u] = pa ? __ldg(reinterpret_cast<const float4*>(pa + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
      xb[u] = pb ? __ldg(reinterpret_cast<const float4*>(pb + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < LOADS_IN_FLIGHT; ++u) {
      const int i = base + u * TILE_THREADS + threadIdx.x, r = i / V4, c = (i % V4) * 4;
      if (i < total) {
        store4(da + r * qp + c, xa[u]);
        if (db) store4(db + r * qp + c, xb[u]);
      }
    }
  }
}

// grid (tiles, HQ), TILE_THREADS: tile t = (first row n0, rows cnt ≤ 64, first position pos0,
// slot) of one sequence; warp w owns query rows 16w..16w+15 (its scores, probabilities, output
// rows and running max/sum), so warps meet only around the shared key/value tiles.
template <typename T, int HD>
__device__ void attn_tiles(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                           const int* __restrict__ tables, int width, int bs, const int4* __restrict__ tiles, int HQ,
                           int HKV, int window, float scale, float* __restrict__ out) {
  typedef TileSmem<T, HD> L;
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> FA;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> FBT;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> FB;
  typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FC;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = reinterpret_cast<T*>(smem + L::q);
  T* Vs = reinterpret_cast<T*>(smem + L::q + L::k);
  float* Ss = reinterpret_cast<float*>(smem + L::q + L::k + L::v);
  T* Ps = reinterpret_cast<T*>(smem + L::q + L::k + L::v + L::s);
  float* Os = reinterpret_cast<float*>(smem + L::q + L::k + L::v + L::s + L::p);
  float* m_row = reinterpret_cast<float*>(smem + L::q + L::k + L::v + L::s + L::p + L::o);
  float* l_row = m_row + TILE_M;

  const int4 t = tiles[blockIdx.x];
  const int n0 = t.x, cnt = t.y, pos0 = t.z, h = blockIdx.y, kvh = h / (HQ / HKV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = HKV * HD;
  const int* table = tables + (size_t)t.w * width;
  auto none = [](int) -> const float* { return nullptr; };
  load_tiles<T, HD>(Qs, (T*)nullptr, L::QP, TILE_M,
                    [&](int r) { return r < cnt ? q + ((size_t)(n0 + r) * HQ + h) * HD : nullptr; }, none);
  for (int i = threadIdx.x; i < TILE_M * L::OP; i += TILE_THREADS) Os[i] = 0.0f;
  for (int i = threadIdx.x; i < TILE_M; i += TILE_THREADS) m_row[i] = -INFINITY, l_row[i] = 0.0f;

  const int last = pos0 + cnt - 1;
  const int first_key = window > 0 ? max(0, pos0 - window + 1) : 0;
  // Lane pair (2r, 2r+1) of warp w handles query row 16w + r, 32 key columns each.
  const int r = warp * 16 + lane / 2, half = lane % 2, qpos = pos0 + r;
  float* S_w = Ss + warp * 16 * L::SP;
  T* P_w = Ps + warp * 16 * L::PP;
  for (int kt = first_key; kt <= last; kt += TILE_N) {
    __syncthreads();  // the previous tile's products are done with Ks and Vs
    const int keys = min(TILE_N, last + 1 - kt);
    auto key_row = [&](const float* cache) {
      return [=](int j) { return j < keys ? cache + kv_offset(table, kt + j, bs, row) + (size_t)kvh * HD : nullptr; };
    };
    load_tiles<T, HD>(Ks, Vs, L::QP, TILE_N, key_row(kc), key_row(vc));
    __syncthreads();
    // S = Q Kᵀ for the warp's 16 rows.
    FC s[TILE_N / 16];
#pragma unroll
    for (int j = 0; j < TILE_N / 16; ++j) wmma::fill_fragment(s[j], 0.0f);
#pragma unroll 4
    for (int kk = 0; kk < HD; kk += 16) {
      FA a;
      wmma::load_matrix_sync(a, Qs + warp * 16 * L::QP + kk, L::QP);
#pragma unroll
      for (int j = 0; j < TILE_N / 16; ++j) {
        FBT bt;
        wmma::load_matrix_sync(bt, Ks + j * 16 * L::QP + kk, L::QP);
        wmma::mma_sync(s[j], a, bt, s[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < TILE_N / 16; ++j) wmma::store_matrix_sync(S_w + j * 16, s[j], L::SP, wmma::mem_row_major);
    __syncwarp();
    // Online softmax of the row: mask, max, probabilities (as T), rescale of the output row.
    const float* srow = S_w + (lane / 2) * L::SP + half * 32;
    float x[32], mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int kpos = kt + half * 32 + c;
      const bool ok = r < cnt && kpos <= qpos && (window <= 0 || kpos > qpos - window);
      x[c] = ok ? srow[c] * scale : -INFINITY;
      mx = fmaxf(mx, x[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_old = m_row[r], m_new = fmaxf(m_old, mx);
    const float corr = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
    float sum = 0.0f;
    T* prow = P_w + (lane / 2) * L::PP + half * 32;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float p = x[c] == -INFINITY ? 0.0f : expf(x[c] - m_new);
      sum += p;
      prow[c] = to_t<T>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    __syncwarp();
    if (half == 0) m_row[r] = m_new, l_row[r] = l_row[r] * corr + sum;
    // The pair interleaves columns (adjacent words, fewer bank conflicts than halves).
    float* orow = Os + r * L::OP;
    if (corr != 1.0f)
      for (int c = half; c < HD; c += 2) orow[c] *= corr;
    __syncwarp();
    // O += P V for the warp's rows, 16 output columns at a time.
    float* O_w = Os + warp * 16 * L::OP;
    FA pf[TILE_N / 16];
#pragma unroll
    for (int kk = 0; kk < TILE_N / 16; ++kk) wmma::load_matrix_sync(pf[kk], P_w + kk * 16, L::PP);
#pragma unroll 2
    for (int c = 0; c < HD; c += 16) {
      FC o;
      wmma::load_matrix_sync(o, O_w + c, L::OP, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < TILE_N / 16; ++kk) {
        FB vf;
        wmma::load_matrix_sync(vf, Vs + kk * 16 * L::QP + c, L::QP);
        wmma::mma_sync(o, pf[kk], vf, o);
      }
      wmma::store_matrix_sync(O_w + c, o, L::OP, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();
  if (r < cnt) {
    const float inv = 1.0f / l_row[r];
    float* dst = out + ((size_t)(n0 + r) * HQ + h) * HD;
    const float* orow = Os + r * L::OP;
    for (int c = half; c < HD; c += 2) dst[c] = orow[c] * inv;
  }
}

#define TILES_KERNEL(NAME, T, HD)                                                                                  \
  extern "C" __global__ void __launch_bounds__(TILE_THREADS)                                                       \
      attn_tiles_##NAME##_d##HD(const float* q, const float* kc, const float* vc, const int* tables, int width, int bs, \
                                const int4* tiles, int HQ, int HKV, int window, float scale, float* out) {           \
    attn_tiles<T, HD>(q, kc, vc, tables, width, bs, tiles, HQ, HKV, window, scale, out);                           \
  }
TILES_KERNEL(bf16, __nv_bfloat16, 64)
TILES_KERNEL(bf16, __nv_bfloat16, 128)
TILES_KERNEL(bf16, __nv_bfloat16, 256)
TILES_KERNEL(f16, __half, 64)
TILES_KERNEL(f16, __half, 128)
TILES_KERNEL(f16, __half, 256)
