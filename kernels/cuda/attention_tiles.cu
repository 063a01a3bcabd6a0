// Prefill attention of bf16/f16 models over a paged KV cache in their own type T (hybrid-spec.md
// §1.3–1.4, §3.5, §5.4; the cache's layout and the other kernels: attention.cu).
//
// attn_tiles_T_d*   64 query rows of one sequence and one head against 64-key tiles with
//                   mma.sync on the tensor cores, keys and values copied asynchronously into
//                   shared memory while the previous product runs; scores, softmax and the
//                   output stay in registers, in fp32 (operands rounded to T, as
//                   flash-attention rounds them).
// attn_tiles_T_d256_h2  the same for two query heads of one KV head (GQA), four warps each: the
//                   key and value tiles are copied once for both, half the traffic from L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <cstddef>

#include "attention.cuh"
#include "common.cuh"
#include "cp_async.cuh"

#define TILE_M 64  // query rows of a block: 16 per warp
#define TILE_N 64  // keys of a tile
#define TILE_THREADS 128  // a head's four warps

// Shared memory of attn_tiles: Q tiles (one a head), K and V tiles of T, rows padded by 16 bytes
// so that the eight rows an ldmatrix reads fall in distinct banks (cuda/attention.rs's
// tile_smem computes the same).
template <typename T, int HD, int HP>
struct TileSmem {
  static constexpr int P = HD + 8;
  static constexpr size_t q = (size_t)HP * TILE_M * P * sizeof(T), k = (size_t)TILE_N * P * sizeof(T);
  static constexpr size_t offsets = 2 * TILE_N * sizeof(size_t);
  static constexpr size_t total = q + 2 * k + offsets;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }


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

// Element offsets of keys kt..kt+TILE_N−1 of one KV head (0 past the last key), one thread
// per key: the block table is read here once per tile, not once per 16-byte copy.
__device__ __forceinline__ void key_offsets(size_t* off, const int* __restrict__ table, int kt, int keys, int bs, int row,
                                            int head) {
  const int j = threadIdx.x;
  if (j < TILE_N) off[j] = j < keys ? kv_offset(table, kt + j, bs, row) + head : 0;
}

// The keys at `off` (rows ≥ keys zero-filled) into a shared tile, 16 bytes per cp.async, by
// the block's THREADS threads.
template <typename T, int HD, int THREADS>
__device__ __forceinline__ void load_kv_tile(T* dst, const T* __restrict__ cache, const size_t* off, int keys) {
  constexpr int CH = HD / 8;  // 16-byte chunks per key
  constexpr int P = HD + 8;
#pragma unroll
  for (int i = threadIdx.x; i < TILE_N * CH; i += THREADS) {
    const int j = i / CH, c = (i % CH) * 8;
    cp_async16(smem_addr(dst + j * P + c), cache + off[j] + c, j < keys);
  }
}

// One tile t = (first row n0, rows cnt ≤ 64, first position pos0, slot) of one sequence and
// query heads h0..h0+HP−1 (one KV head's), by HP·TILE_THREADS threads: warps 4i..4i+3 take head
// h0 + i. Warp w of a head owns query rows 16w..16w+15: its scores S (16 × 64), their
// probabilities and its output rows (16 × HD) live in its registers in the mma fragment layout
// (lane = 4g + i holds rows g and g + 8, columns 2i and 2i + 1 of every 8-column tile), so the
// probabilities become the next product's A operand without leaving registers. Loop per key
// tile: wait for K, start V's copy, S = Q Kᵀ and the online softmax, wait for V, start the
// next K's copy, O += P V.
template <typename T, int HD, int HP>
__device__ void attn_tiles(const float* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
                           const int* __restrict__ tables, int width, int bs, const int4 t, int h0, int HQ, int HKV,
                           int window, float scale, float* __restrict__ out) {
  typedef TileSmem<T, HD, HP> L;
  constexpr int P = L::P, NT = TILE_N / 8, DT = HD / 8, THREADS = HP * TILE_THREADS;
  extern __shared__ __align__(128) unsigned char smem[];
  // This thread's head (of the block's HP) and its index among that head's threads.
  const int head = HP == 1 ? 0 : threadIdx.x / TILE_THREADS, h = h0 + head;
  const int ht = HP == 1 ? threadIdx.x : threadIdx.x % TILE_THREADS;
  T* Qs = reinterpret_cast<T*>(smem) + head * TILE_M * P;
  T* Ks = reinterpret_cast<T*>(smem + L::q);
  T* Vs = reinterpret_cast<T*>(smem + L::q + L::k);
  // Key offsets of the current and the next tile (double-buffered: the next tile's are written
  // while the current tile's V copy may still read them).
  size_t* offs = reinterpret_cast<size_t*>(smem + L::q + 2 * L::k);

  const int n0 = t.x, cnt = t.y, pos0 = t.z, kvh = h / (HQ / HKV);
  const int warp = ht / 32, lane = threadIdx.x % 32, g = lane / 4, i4 = lane % 4;
  const int row = HKV * HD;
  const int* table = tables + (size_t)t.w * width;
  const int last = pos0 + cnt - 1;
  const int first_key = window > 0 ? max(0, pos0 - window + 1) : 0;

  key_offsets(offs, table, first_key, min(TILE_N, last + 1 - first_key), bs, row, kvh * HD);
  __syncthreads();
  load_kv_tile<T, HD, THREADS>(Ks, kc, offs, min(TILE_N, last + 1 - first_key));
  cp_async_commit();
  // Q (f32, after RoPE) → T, rows ≥ cnt zero; each head's warps copy its own.
  for (int i = ht; i < TILE_M * (HD / 4); i += TILE_THREADS) {
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
  const bool live[2] = {r0 < cnt, r0 + 8 < cnt};
  const TileRows rows{{pos0 + r0, pos0 + r0 + 8}, {live[0], live[1]}, i4, window, scale * 1.4426950408889634f};
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
    load_kv_tile<T, HD, THREADS>(Vs, vc, off, keys);
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
    // Mask (causal, window, rows past cnt), new max per row, rescale of the output rows, then
    // the probabilities as the A operand of P·V.
    float (&sf)[32] = *reinterpret_cast<float(*)[32]>(&s[0][0]);
    float corr[2], m_new[2];
    tile_softmax_max(sf, whole, kt, rows, m, l, corr, m_new);
#pragma unroll
    for (int j = 0; j < DT; ++j) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
    uint32_t pa[TILE_N / 16][4];
    tile_softmax_probs<T>(sf, m_new, l, pa);

    cp_async_wait_all();
    __syncthreads();  // V is in; every warp is done with K; the next tile's offsets are written
    if (more) {
      load_kv_tile<T, HD, THREADS>(Ks, kc, offs + (1 - it % 2) * TILE_N, min(TILE_N, last + 1 - kt - TILE_N));
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
  // The row sums (attention.cuh), then the normalised rows.
  tile_softmax_sums(l);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    if (!live[hr]) continue;
    const float inv = 1.0f / l[hr];
    float* dst = out + ((size_t)(n0 + r0 + 8 * hr) * HQ + h) * HD + 2 * i4;
#pragma unroll
    for (int j = 0; j < DT; ++j) *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[j][2 * hr] * inv, o[j][2 * hr + 1] * inv);
  }
}

// grid (⌈tiles / per_block⌉, HQ / HP): block b takes tiles b·per_block.. in turn (cnt 0 ends
// the list early), query heads HP·y... Two a block when the grid would otherwise take more than
// one wave: the host pairs long tiles with short ones, so that every block has about the same
// number of keys. Two blocks an SM of one head, or one of two heads (d = 256 only: at 128 two
// heads' registers would allow one block an SM, where one head's allow three).
#define TILES_KERNEL(NAME, T, HD, HP, SUFFIX)                                                                      \
  extern "C" __global__ void __launch_bounds__(HP * TILE_THREADS, 3 - HP)                \
      attn_tiles_##NAME##_d##HD##SUFFIX(const float* q, const T* kc, const T* vc, const int* tables, int width,      \
                                        int bs, const int4* tiles, int per_block, int HQ, int HKV, int window,      \
                                        float scale, float* out) {                                                  \
    pdl_entry();                                                                                                    \
    for (int i = 0; i < per_block; ++i) {                                                                           \
      const int4 t = tiles[blockIdx.x * per_block + i];                                                             \
      if (t.y == 0) break;                                                                                          \
      if (i > 0) __syncthreads(); /* the previous tile is done with shared memory */                                \
      attn_tiles<T, HD, HP>(q, kc, vc, tables, width, bs, t, blockIdx.y * HP, HQ, HKV, window, scale, out);         \
    }                                                                                                               \
  }
#define TILES_KERNELS(NAME, T)                                                                                      \
  TILES_KERNEL(NAME, T, 64, 1, ) TILES_KERNEL(NAME, T, 128, 1, ) TILES_KERNEL(NAME, T, 256, 1, )                    \
      TILES_KERNEL(NAME, T, 256, 2, _h2)
TILES_KERNELS(bf16, __nv_bfloat16)
TILES_KERNELS(f16, __half)
