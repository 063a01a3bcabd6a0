// Prefill attention of bf16/f16 models on Hopper's warpgroup tensor cores (wgmma), at head dims
// 128 and 256 with an even number of query heads to each KV head (Qwen3.5, Qwen3-Next):
// attention_tiles.cu's tile kernel with its products on wgmma and its copies on a warpgroup of
// their own. The tile kernel runs its products on mma.sync from 238 registers a thread, eight
// warps an SM, and stalls on its own copies between them (docs/gpu.md, *Attention layers of
// hybrids*).
//
// A block takes two query heads of one KV head (h = 2·blockIdx.y + c) and the tiles of its list
// in turn (attention.rs pairs long tiles with short ones), three warpgroups:
//   producer    copies each 64-key tile of K and of V from the paged cache into shared memory
//               (128-byte swizzle, two buffers of each, alternating) and announces it;
//   consumer c  query head h's 64 rows of the tile: S = Q Kᵀ (A and B K-major from shared
//               memory), the online softmax in registers, O += P V (P the A operand from
//               registers, V read MN-major as it lies), O in registers until the end.
// Hand-offs, one side arriving and the other waiting:
//   full_k/v(b)   producer → each consumer, an mbarrier of the producer's 128 threads: the tile
//                 in buffer b has landed (its cp.async waited for and fenced for the async
//                 proxy); each consumer waits on it alone;
//   FREE_K/V + b  consumers → producer, a named barrier of all 384 threads: the products
//                 reading buffer b have completed.
// Tile j's fill of a buffer waits for tile j − 2's release of it, so neither side laps the other;
// the last two releases of a block are not arrived, as no fill waits for them. The producer
// issues tile j + 1's copies before it waits for tile j's, so a tile's copies run while the
// consumers work on the one before.
//
// Arithmetic: the tile kernel's. q and the probabilities are rounded to T (k and v are in T
// already), scores, the running max and sum and O are fp32, the softmax step is the tile
// kernel's own (attention.cuh), and the key tiles start where its do, so a row's keys are grouped
// the same whichever query tile and launch it falls in. The GPU test finds the two kernels'
// outputs equal bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "attention.cuh"
#include "chunk_wg.cuh"  // the 128-byte swizzle, wgmma descriptors, fences and waits, mbarriers

#define AW_THREADS 384
#define AW_TILE 64  // query rows of a head, and keys of a tile

// Named barriers (0 is __syncthreads): FREE_K + b, FREE_V + b for the two buffers, Q + c for
// consumer c's own staging of Q, PRODUCER the producer's own.
enum AwBarrier { AW_FREE_K = 1, AW_FREE_V = 3, AW_Q = 5, AW_PRODUCER = 7 };

__device__ __forceinline__ void aw_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(AW_THREADS) : "memory"); }
__device__ __forceinline__ void aw_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(AW_THREADS) : "memory");
}
// A writer's copies (or stores) made visible to wgmma, which reads through the async proxy.
__device__ __forceinline__ void aw_fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The products; the register lists are written out, since an asm string cannot compute them.
// d[64, 64] (+)= A[64, 16] · B[16, 64], both K-major in shared memory (bf16).
__device__ __forceinline__ void aw_ss_n64(float (&d)[32], unsigned long long a, unsigned long long b, int acc, __nv_bfloat16) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(acc));
}

// d[64, 128] += a[64, 16] · B[16, 128]: a from registers, B MN-major in shared memory (bf16).
__device__ __forceinline__ void aw_rs_n128_tb(float (&d)[64], const unsigned (&a)[4], unsigned long long b, __nv_bfloat16) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// d[64, 64] (+)= A[64, 16] · B[16, 64], both K-major in shared memory (f16).
__device__ __forceinline__ void aw_ss_n64(float (&d)[32], unsigned long long a, unsigned long long b, int acc, __half) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(acc));
}

// d[64, 128] += a[64, 16] · B[16, 128]: a from registers, B MN-major in shared memory (f16).
__device__ __forceinline__ void aw_rs_n128_tb(float (&d)[64], const unsigned (&a)[4], unsigned long long b, __half) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// Shared memory from the dynamic allocation's 1024-aligned start: Q of both heads, then K and V
// in two buffers each, then two tiles' key offsets; a [64, HD] tile is HD / 64 swizzle atoms of
// 64 columns, 8192 bytes apart.
template <int HD>
struct AwSmem {
  static constexpr unsigned TILE = 64 * HD * 2;
  static constexpr unsigned BYTES = 6 * TILE + 2 * AW_TILE * 8 + 16 + 32 + 1024;  // attention.rs's wg_smem
  unsigned base;
  size_t* offs;  // two key tiles' row offsets in the cache (the producer's, alternating)
  int* keys;     // and their key counts
  unsigned mb;   // four mbarriers: full_k(0), full_k(1), full_v(0), full_v(1)
  __device__ explicit AwSmem(unsigned char* raw) {
    base = (smem_addr(raw) + 1023u) & ~1023u;
    offs = reinterpret_cast<size_t*>(raw + (base - smem_addr(raw)) + 6 * TILE);
    keys = reinterpret_cast<int*>(offs + 2 * AW_TILE);
    mb = smem_addr(keys + 4);
  }
  __device__ unsigned full_k(int b) const { return mb + 8 * b; }
  __device__ unsigned full_v(int b) const { return mb + 16 + 8 * b; }
  __device__ unsigned q(int c) const { return base + c * TILE; }
  __device__ unsigned k(int b) const { return base + (2 + b) * TILE; }
  __device__ unsigned v(int b) const { return base + (4 + b) * TILE; }
};
// Where 16-byte piece cc (8 columns) of row r of a tile lies.
__device__ __forceinline__ unsigned aw_at(int r, int cc) { return (cc >> 3) * 8192 + wg_swz(r, cc & 7); }

// One tile of the block's list: (first row n0, rows cnt ≤ 64, first position pos0, slot), the
// keys it attends to [first, last] and their tiles' count.
struct AwTile {
  int n0, cnt, pos0, slot, first, last, n;
  __device__ AwTile(int4 t, int window) : n0(t.x), cnt(t.y), pos0(t.z), slot(t.w) {
    last = pos0 + cnt - 1;
    first = window > 0 ? max(0, pos0 - window + 1) : 0;
    n = (last - first + AW_TILE) / AW_TILE;
  }
};

// The producer's walk over the block's key tiles (over its list's tiles in turn): the current
// key tile's table, first key and key count.
struct AwCursor {
  const int4* list;
  const int* tables;
  int per_block, width, window, i, kt, last;
  const int* table;
  __device__ AwCursor(const int4* list_, int per_block_, const int* tables_, int width_, int window_)
      : list(list_), tables(tables_), per_block(per_block_), width(width_), window(window_), i(-1), kt(0), last(-1) {
    next();
  }
  __device__ int keys() const { return min(AW_TILE, last + 1 - kt); }
  // Steps to the next key tile (past the list's end: keys() ≤ 0).
  __device__ void next() {
    kt += AW_TILE;
    if (kt <= last) return;
    ++i;
    if (i < per_block && list[i].y > 0) {
      const AwTile t(list[i], window);
      kt = t.first;
      last = t.last;
      table = tables + (size_t)t.slot * width;
    } else {
      last = kt - 1;
    }
  }
};

// The producer's row offsets of the cursor's key tile (column col0 of cache rows of `row`
// elements) and its key count, one thread a key: the block table is read once a tile, two tiles
// ahead of its copies.
__device__ __forceinline__ void aw_offsets(size_t* off, int* keys, const AwCursor& k, int bs, int row, int col0) {
  const int j = threadIdx.x, n = k.keys();
  if (j < AW_TILE) off[j] = j < n ? kv_offset(k.table, k.kt + j, bs, row) + col0 : 0;
  if (j == 0) *keys = n;
}
// The producer warpgroup's own barrier (its offsets written before they are read, and read
// before they are rewritten).
__device__ __forceinline__ void aw_producers() { asm volatile("bar.sync %0, 128;\n" ::"r"((int)AW_PRODUCER) : "memory"); }

// The producer's copy of a key tile's rows (at `off`, zeros past `keys`) of a cache into the
// tile at dst: warp w copies rows w·RW .. (w + 1)·RW − 1, a row's 16-byte pieces by its lanes,
// four rows' offsets read from shared memory before their four copies are issued.
template <typename T, int HD>
__device__ __forceinline__ void aw_load_kv(unsigned dst, const T* __restrict__ cache, const size_t* off, int keys) {
  constexpr int PR = HD / 8, RW = AW_TILE * PR / 128;  // pieces a row; rows a thread
  const int tid = threadIdx.x, cc = tid % PR, r0 = tid / PR * RW;
  const T* src = cache + cc * 8;
#pragma unroll
  for (int j = 0; j < RW; j += 4) {
    const ulonglong2 a = *reinterpret_cast<const ulonglong2*>(off + r0 + j);
    const ulonglong2 b = *reinterpret_cast<const ulonglong2*>(off + r0 + j + 2);
    const size_t o[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int r = r0 + j + u;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + aw_at(r, cc)), "l"(src + o[u]),
                   "r"(r < keys ? 16 : 0));
    }
  }
}

// Consumer thread tid's share of head h's Q rows n0 .. n0 + cnt − 1 (f32 after RoPE) into the
// tile at dst, rounded to T, zeros past cnt.
template <typename T, int HD>
__device__ __forceinline__ void aw_stage_q(unsigned dst, const float* __restrict__ q, int n0, int cnt, int HQ, int h,
                                           int tid) {
  constexpr int PR = HD / 8;
#pragma unroll 4
  for (int i = tid; i < AW_TILE * PR; i += 128) {
    const int r = i / PR, cc = i % PR;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    if (r < cnt) {
      const float4* p = reinterpret_cast<const float4*>(q + ((size_t)(n0 + r) * HQ + h) * HD + cc * 8);
      a = __ldg(p);
      b = __ldg(p + 1);
    }
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + aw_at(r, cc)), "r"(pack2<T>(a.x, a.y)),
                 "r"(pack2<T>(a.z, a.w)), "r"(pack2<T>(b.x, b.y)), "r"(pack2<T>(b.z, b.w))
                 : "memory");
  }
}

// The kernel's body: grid (⌈tiles / per_block⌉, HQ / 2), AW_THREADS threads, AwSmem<HD>::BYTES
// of dynamic shared memory; arguments as attn_tiles's.
template <typename T, int HD>
__device__ void attn_wg(const float* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
                        const int* __restrict__ tables, int width, int bs, const int4* __restrict__ tiles, int per_block,
                        int HQ, int HKV, int window, float scale, float* __restrict__ out) {
  constexpr int HH = HD / 128;  // O's n128 halves
  extern __shared__ __align__(1024) unsigned char aw_smem_raw[];
  const AwSmem<HD> sm(aw_smem_raw);
  const int h0 = 2 * blockIdx.y, kvh = h0 / (HQ / HKV), row = HKV * HD;
  const int4* list = tiles + (size_t)blockIdx.x * per_block;
  int total = 0;  // key tiles over the block's tiles
  for (int i = 0; i < per_block && list[i].y > 0; ++i) total += AwTile(list[i], window).n;
  if (total == 0) return;  // an empty block of a CUDA graph's padded list: no copies to issue
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) mb_init(sm.full_k(b), 128), mb_init(sm.full_v(b), 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---- The producer. ----
    // Key tile jg + 1's copies are issued before tile jg's are waited for, each buffer's as soon
    // as the consumers release it, and a tile's offsets are read from the table two tiles ahead.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    pdl_entry();
    AwCursor cur(list, per_block, tables, width, window);
    auto issue = [&](int jg, bool v) {
      const int b = jg & 1;
      aw_load_kv<T, HD>(v ? sm.v(b) : sm.k(b), v ? vc : kc, sm.offs + b * AW_TILE, sm.keys[b]);
      cp_async_commit();
    };
    aw_offsets(sm.offs, sm.keys, cur, bs, row, kvh * HD);
    cur.next();
    aw_offsets(sm.offs + AW_TILE, sm.keys + 1, cur, bs, row, kvh * HD);
    cur.next();
    aw_producers();
    issue(0, false);
    issue(0, true);
    for (int jg = 0; jg < total; ++jg) {
      const int b = jg & 1;
      const bool next = jg + 1 < total;
      if (next) {
        if (jg >= 1) aw_sync(AW_FREE_K + (b ^ 1));
        issue(jg + 1, false);
        cp_async_wait<2>();  // K(jg) has landed; V(jg) and K(jg + 1) may not have
      } else {
        cp_async_wait<1>();
      }
      aw_fence_async();
      mb_arrive(sm.full_k(b));
      if (next) {
        if (jg >= 1) aw_sync(AW_FREE_V + (b ^ 1));
        issue(jg + 1, true);
        cp_async_wait<2>();  // V(jg) has landed
      } else {
        cp_async_wait<0>();
      }
      aw_fence_async();
      mb_arrive(sm.full_v(b));
      if (jg + 2 < total) {  // tile jg + 2's offsets in place of tile jg's, whose copies are issued
        aw_producers();
        aw_offsets(sm.offs + b * AW_TILE, sm.keys + b, cur, bs, row, kvh * HD);
        cur.next();
        aw_producers();
      }
    }
    return;
  }

  // ---- The consumers. ----
  // Each key tile's P·V and the next tile's S = Q Kᵀ are issued together, then the next tile's
  // softmax runs once they complete.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int c = threadIdx.x / 128 - 1, tid = threadIdx.x % 128, h = h0 + c;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, i4 = lane % 4;
  const unsigned Qs = sm.q(c);
  const unsigned long long dq = wg_desc_k(Qs);
  const float sl2 = scale * 1.4426950408889634f;  // exp(x·scale) = 2^(x·sl2)
  pdl_entry();
  int jg = 0;
  for (int i = 0; i < per_block && list[i].y > 0; ++i) {
    const AwTile t(list[i], window);
    aw_stage_q<T, HD>(Qs, q, t.n0, t.cnt, HQ, h, tid);
    aw_fence_async();
    asm volatile("bar.sync %0, 128;\n" ::"r"(AW_Q + c) : "memory");

    float o[HH][64];
#pragma unroll
    for (int hh = 0; hh < HH; ++hh)
#pragma unroll
      for (int e = 0; e < 64; ++e) o[hh][e] = 0.0f;
    // Rows g and g + 8 of the warp: running max (in log2 units) and this lane's share of the sum.
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int r0 = warp * 16 + g;
    const bool live[2] = {r0 < t.cnt, r0 + 8 < t.cnt};
    const TileRows rows{{t.pos0 + r0, t.pos0 + r0 + 8}, {live[0], live[1]}, i4, window, sl2};
    float s[32];
    uint32_t pa[4][4];

    // S = Q Kᵀ of the key tile in buffer b (descriptors advance by constants: a k-step's 32
    // bytes within a swizzle row, an atom's 8192 bytes).
    auto issue_s = [&](int b) {
      const unsigned long long dk = wg_desc_k(sm.k(b));
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const unsigned long long at = (kk >> 2) * 512 + (kk & 3) * 2;
        aw_ss_n64(s, dq + at, dk + at, kk > 0, T());
      }
    };
    // The tile kernel's softmax step (attention.cuh), O's rescale between its two halves.
    auto softmax = [&](int kt) {
      const bool whole = kt + AW_TILE - 1 <= t.pos0 && t.cnt == AW_TILE && (window <= 0 || kt > t.last - window);
      float corr[2], m_new[2];
      tile_softmax_max(s, whole, kt, rows, m, l, corr, m_new);
#pragma unroll
      for (int hh = 0; hh < HH; ++hh)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          o[hh][4 * j] *= corr[0], o[hh][4 * j + 1] *= corr[0];
          o[hh][4 * j + 2] *= corr[1], o[hh][4 * j + 3] *= corr[1];
        }
      tile_softmax_probs<T>(s, m_new, l, pa);
    };

    // The first key tile's scores, then per key tile: P·V, the next tile's scores, softmax.
    mb_wait(sm.full_k(jg & 1), (jg >> 1) & 1);
    wg_fence();
    issue_s(jg & 1);
    wg_commit();
    wg_wait<0>();
    wg_regs(s);
    if (jg + 2 < total) aw_arrive(AW_FREE_K + (jg & 1));
    softmax(t.first);
    for (int kt = t.first; kt <= t.last; kt += AW_TILE, ++jg) {
      const int b = jg & 1;
      const bool more = kt + AW_TILE <= t.last;
      mb_wait(sm.full_v(b), (jg >> 1) & 1);
      const unsigned long long dv = wg_desc_mn(sm.v(b));
      wg_regs(pa);
      wg_regs(s);
#pragma unroll
      for (int hh = 0; hh < HH; ++hh) wg_regs(o[hh]);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int hh = 0; hh < HH; ++hh) aw_rs_n128_tb(o[hh], pa[kk], dv + hh * 1024 + kk * 128, T());
      wg_commit();
      if (more) {
        mb_wait(sm.full_k(b ^ 1), ((jg + 1) >> 1) & 1);
        issue_s(b ^ 1);
        wg_commit();
      }
      wg_wait<0>();
#pragma unroll
      for (int hh = 0; hh < HH; ++hh) wg_regs(o[hh]);
      wg_regs(s);
      if (jg + 2 < total) aw_arrive(AW_FREE_V + b);
      if (more) {
        if (jg + 3 < total) aw_arrive(AW_FREE_K + (b ^ 1));
        softmax(kt + AW_TILE);
      }
    }
    // The row sums (attention.cuh), then the normalised rows.
    tile_softmax_sums(l);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      if (!live[hr]) continue;
      const float inv = 1.0f / l[hr];
      float* dst = out + ((size_t)(t.n0 + r0 + 8 * hr) * HQ + h) * HD + 2 * i4;
#pragma unroll
      for (int hh = 0; hh < HH; ++hh)
#pragma unroll
        for (int j = 0; j < 16; ++j)
          *reinterpret_cast<float2*>(dst + 128 * hh + 8 * j) =
              make_float2(o[hh][4 * j + 2 * hr] * inv, o[hh][4 * j + 2 * hr + 1] * inv);
    }
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define AW_BODY(...) __VA_ARGS__
#else
#define AW_BODY(...) __trap()
#endif

// One CTA an SM (its three warpgroups launch at 168 registers a thread, which setmaxnreg then
// gives unequally: 40 to the producer, 232 to each consumer). Only sm_90a builds have wgmma;
// elsewhere the entries trap, and attention.rs only picks them from a SASS image for it.
#define AW_KERNEL(NAME, T, HD)                                                                                  \
  extern "C" __global__ void __launch_bounds__(AW_THREADS, 1)                                                  \
      attn_wg_##NAME##_d##HD(const float* q, const T* kc, const T* vc, const int* tables, int width, int bs,   \
                             const int4* tiles, int per_block, int HQ, int HKV, int window, float scale,       \
                             float* out) {                                                                      \
    AW_BODY(attn_wg<T, HD>(q, kc, vc, tables, width, bs, tiles, per_block, HQ, HKV, window, scale, out));       \
  }
AW_KERNEL(bf16, __nv_bfloat16, 128)
AW_KERNEL(bf16, __nv_bfloat16, 256)
AW_KERNEL(f16, __half, 128)
AW_KERNEL(f16, __half, 256)
