// A decode step's projections at 4–64 rows on Hopper: y = x Wᵀ for x [M, K] (M ≤ 64), W [N, K]
// row-major, both bf16 or both f16, fp32 accumulation rounded once to y's type (theirs, or f32).
// Alone it is no faster than cuBLAS; what it gains in a decode step comes from its early start
// (below) and from the row launches its epilogues replace (SwiGLU, the short conv). Past 16
// rows x's tiles, which every block copies from L2, cost more than that (the engine takes it
// from 4 to 16 rows; docs/performance.md, *Projections of 4–16 rows*).
//
// A block is one producer warp and WG consumer warpgroups. The producer's one thread has the
// tensor memory accelerator (TMA) copy W's [64·WG rows, 64 k] tiles and x's [NB rows, 64 k]
// tiles into a ring of shared-memory stages, in the 128-byte swizzle wgmma reads, each stage's
// arrival counted by an mbarrier (full) and its release by another (empty): no thread of the
// block spends an instruction on a load. Each consumer warpgroup multiplies its 64 rows of W
// (A) by x's rows (B), both K-major straight from shared memory, keeping one stage's products
// in flight while it waits for the next stage.
//
// K is split S ways across a cluster of S blocks (one tile of W rows each): the blocks add
// their partial tiles through distributed shared memory in rank order and round once, so a
// row of y depends only on its row of x and on (N, K, S), whatever M is. Without a cluster
// (S = 1) a grid of several K slices writes each slice's f32 partial product apart
// (`part_stride` elements on), for a reader that sums them in slice order (the residual norm).
//
// The producer requests W's first stages before it waits for the kernel before this one (W is
// no kernel's output), so a block made resident early (the norms before a projection trigger
// their dependents at entry: common.cuh's pdl_trigger) streams W while they run.
//
// SwiGLU (GLU): W is an MLP's stacked [gate | up] ([2I(+padding), K]); a block's 64 rows of W are
// 32 gate rows and the same 32 up rows (two boxes of 32 rows a stage, one swizzle layout), and
// it writes silu(g) · u for its 32 columns, g and u rounded to T first, as the GEMM's output and
// the swiglu kernel after it would round them: the same bits as those two launches, in one.
//
// Short conv (CONV): W is a delta-rule layer's fused input projection, whose first C output
// rows are [q | k | v]. Each such output, rounded to T as y stores it, is shifted into its row's
// slot's conv window and the conv's output written: conv.cu's conv_step (width 4) in its order,
// so the same bits as the GEMM then that launch. The block's windows and conv weights are
// copied into shared memory (cp.async) as it starts, under W's stream: no kernel of a decode
// step before this one writes a decoding slot's conv state.
#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap

#include "common.cuh"
#include "dtype.cuh"
#include "wgmma.cuh"

namespace cg = cooperative_groups;

#define SK_BK 64  // k a tile: one 128-byte swizzle row of 16-bit elements

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SK_BODY(...) __VA_ARGS__
#define SK_CLUSTER(S) __cluster_dims__(S, 1, 1)
#else
#define SK_BODY(...) __trap()
#define SK_CLUSTER(S)
#endif

__device__ __forceinline__ unsigned sk_smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// What a block writes: y (SK_ROWS; slices or a cluster's sum), SwiGLU of paired rows (SK_GLU),
// or y and the short conv of its first C columns (SK_CONV).
enum SkEpilogue { SK_ROWS, SK_GLU, SK_CONV };

// The short conv's operands (SK_CONV): weight [C, 4] f32, states [slots, C, 4] f32, each x row's
// slot, cy [M, C] f32 (the conv's output), SiLU after it or not.
struct SkConv {
  const float* weight;
  float* states;
  const SlotList* slots;  // the entry's parameter (__grid_constant__: read in place)
  const int* more_slots;
  float* cy;
  int C, silu;
};

// The box at (c0 along K, c1 along rows) of `map` into shared memory at dst, its bytes counted
// on `bar`; with `policy`, W's bytes leave L2 first (they are read once a step).
__device__ __forceinline__ void sk_tma(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void sk_tma_hint(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar,
                                            unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], "
      "[%4], %5;\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}

// D[64, NB] += A[64, 16] · B[16, NB], A and B K-major in shared memory (descriptors).
template <typename T, int NB>
struct SkMma;

#define SK_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define SK_REGS8 "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define SK_REGS16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define SK_REGS32                                                                                     \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
  "%27,%28,%29,%30,%31}"
// The descriptors' operand numbers follow the accumulators': written out per width, since an
// asm string cannot compute them.
#define SK_MMA(T, TY, NB, REGS, A, B, ...)                                                                        \
  template <>                                                                                                    \
  struct SkMma<T, NB> {                                                                                          \
    __device__ __forceinline__ static void run(float (&d)[NB / 2], unsigned long long a, unsigned long long b) { \
      asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                                  \
                   "wgmma.mma_async.sync.aligned.m64n" #NB "k16.f32." TY "." TY " " REGS ", %" #A ", %" #B     \
                   ", p, 1, 1, 0, 0;\n}\n"                                                                      \
                   : __VA_ARGS__                                                                                 \
                   : "l"(a), "l"(b));                                                                            \
    }                                                                                                            \
  };
SK_MMA(__nv_bfloat16, "bf16", 16, SK_REGS8, 8, 9, SK_ACC8(0))
SK_MMA(__nv_bfloat16, "bf16", 32, SK_REGS16, 16, 17, SK_ACC8(0), SK_ACC8(8))
SK_MMA(__nv_bfloat16, "bf16", 64, SK_REGS32, 32, 33, SK_ACC8(0), SK_ACC8(8), SK_ACC8(16), SK_ACC8(24))
SK_MMA(__half, "f16", 16, SK_REGS8, 8, 9, SK_ACC8(0))
SK_MMA(__half, "f16", 32, SK_REGS16, 16, 17, SK_ACC8(0), SK_ACC8(8))
SK_MMA(__half, "f16", 64, SK_REGS32, 32, 33, SK_ACC8(0), SK_ACC8(8), SK_ACC8(16), SK_ACC8(24))

// Grid (slices, ⌈N / (64·WG)⌉), in clusters of S = slices along x or unclustered (S = 1), 128·WG
// + 32 threads. Dynamic shared memory: `stages` · (64·WG + NB) · 128 bytes, 16 · `stages` for the
// mbarriers, 1024 for the swizzle's alignment. K is a multiple of 64 · slices; `tw` maps W ([N,
// K], box [64·WG, 64]) and `tx` x ([M, K], box [NB, 64]), both in the 128-byte swizzle, zeros
// past their rows. y [M, ldy], slice i's at y + i · part_stride when S = 1.
//
// GLU (WG = 1, S = 1): `tw` maps W in boxes of [32, 64]; N is I, the gate rows', and the up rows
// start at row `glu_up`; y [M, ldy] takes silu(g) · u. `trigger`: 1 lets the kernel after this
// one start at this one's entry, 2 once this block's products are done (its W all in), 0 at its
// end.
//
// SK_CONV (WG = 1, S = 1, O = T): `cv` has the conv's operands; after the stages' barriers the
// shared memory holds NB · 64 windows and 64 conv weights (float4 each).
template <typename T, typename O, int WG, int NB, int S, int EPI = SK_ROWS>
__device__ __forceinline__ void skinny(const CUtensorMap* tw, const CUtensorMap* tx, O* __restrict__ y, int ldy, int M,
                                       int N, int K, int stages, int hint, long part_stride, int glu_up = 0,
                                       int trigger = 0, const SkConv* cv = nullptr) {
  constexpr bool GLU = EPI == SK_GLU, CONV = EPI == SK_CONV;
  static_assert(EPI == SK_ROWS || (WG == 1 && S == 1), "SwiGLU and the conv take one warpgroup and no cluster");
  constexpr int BM = 64 * WG, CONSUMERS = 128 * WG;
  constexpr unsigned W_BYTES = BM * 128, STAGE = W_BYTES + NB * 128;
  extern __shared__ unsigned char sk_raw[];
  const unsigned raw = sk_smem(sk_raw), base = (raw + 1023u) & ~1023u;
  unsigned char* smem = sk_raw + (base - raw);
  // full[s] at bars + 8s (the producer's arrival and the copies' bytes), empty[s] after them (a
  // consumer warp's arrival each once it is done with stage s).
  const unsigned bars = base + stages * STAGE;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (stages + s); };

  // GLU: row0 is the block's first gate row (32 a block).
  const int slice = K / (int)gridDim.x, tiles = slice / SK_BK, k0 = (int)blockIdx.x * slice,
            row0 = (int)blockIdx.y * (GLU ? BM / 2 : BM);
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) {
      mb_init(full(s), 1);
      mb_init(empty(s), 4 * WG);
    }
    // The barriers' initialisation visible to the copies' completions (the async proxy).
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (trigger == 1) pdl_trigger();

  // SK_CONV: window e = m · 64 + r of row m at channel row0 + r, then the 64 channels' weights.
  float4* conv_win = reinterpret_cast<float4*>(smem + (bars - base) + 16u * stages);
  float4* conv_wt = conv_win + NB * BM;
  if constexpr (CONV) {
    if (tid < CONSUMERS) {
      for (int e = tid; e < M * BM; e += CONSUMERS) {
        const int r = e % BM, m = e / BM, n = row0 + r;
        if (n < cv->C) {
          const float* st = cv->states + (size_t)slot_of(*cv->slots, cv->more_slots, m) * cv->C * 4 + (size_t)n * 4;
          asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(sk_smem(conv_win + e)), "l"(st) : "memory");
        }
      }
      for (int r = tid; r < BM; r += CONSUMERS)
        if (row0 + r < cv->C)
          asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(sk_smem(conv_wt + r)),
                       "l"(cv->weight + (size_t)(row0 + r) * 4)
                       : "memory");
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
  }

  float acc[NB / 2];
#pragma unroll
  for (int i = 0; i < NB / 2; ++i) acc[i] = 0.0f;

  if (tid == CONSUMERS) {
    // The producer. W is no kernel's output: its first stages are requested before the wait
    // for the kernel before this one, x's only after it.
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(tw) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(tx) : "memory");
    unsigned long long policy = 0;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    auto load_w = [&](int t) {
      const int s = t % stages;
      if constexpr (GLU) {
        // The gate box, then its up rows' box right below it: 32 rows of 128 bytes each, whole
        // swizzle atoms (8 rows), so the pair is laid out as one 64-row box would be.
        const unsigned dst = base + s * STAGE;
        if (hint) {
          sk_tma_hint(dst, tw, k0 + t * SK_BK, row0, full(s), policy);
          sk_tma_hint(dst + W_BYTES / 2, tw, k0 + t * SK_BK, glu_up + row0, full(s), policy);
        } else {
          sk_tma(dst, tw, k0 + t * SK_BK, row0, full(s));
          sk_tma(dst + W_BYTES / 2, tw, k0 + t * SK_BK, glu_up + row0, full(s));
        }
      } else if (hint) {
        sk_tma_hint(base + s * STAGE, tw, k0 + t * SK_BK, row0, full(s), policy);
      } else {
        sk_tma(base + s * STAGE, tw, k0 + t * SK_BK, row0, full(s));
      }
    };
    auto load_x = [&](int t) {
      const int s = t % stages;
      sk_tma(base + s * STAGE + W_BYTES, tx, k0 + t * SK_BK, 0, full(s));
    };
    const int first = min(stages, tiles);
    for (int t = 0; t < first; ++t) {
      mb_arrive_tx(full(t), STAGE);
      load_w(t);
    }
    pdl_entry();
    for (int t = 0; t < first; ++t) load_x(t);
    for (int t = first; t < tiles; ++t) {
      const int s = t % stages;
      mb_wait(empty(s), ((t / stages) - 1) & 1);
      mb_arrive_tx(full(s), STAGE);
      load_w(t);
      load_x(t);
    }
  } else if (tid < CONSUMERS) {
    const int wg = tid >> 7;
    for (int t = 0; t < tiles; ++t) {
      const int s = t % stages;
      mb_wait(full(s), (t / stages) & 1);
      const unsigned a = base + s * STAGE + wg * 64 * 128, b = base + s * STAGE + W_BYTES;
      wg_regs(acc);
      wg_fence();
#pragma unroll
      for (int j = 0; j < SK_BK / 16; ++j) SkMma<T, NB>::run(acc, wg_desc_k(a + j * 32), wg_desc_k(b + j * 32));
      wg_commit();
      // The previous stage's products are done: its buffers may take a later tile.
      wg_wait<1>();
      wg_regs(acc);
      if (t > 0 && (tid & 31) == 0) mb_arrive(empty((t - 1) % stages));
    }
    wg_wait<0>();
    wg_regs(acc);
  }
  if (trigger == 2) pdl_trigger();
  // Every copy has landed and every product is done: the stages hold the partial tile now.
  __syncthreads();

  // The block's partial tile [BM rows of W][NB rows of x] in fp32. In the accumulator's layout a
  // thread holds, for each 8 columns j, rows g and g + 8 of its warp's 16 at columns 2q and
  // 2q + 1 (g = lane / 4, q = lane % 4). Rows PS floats apart: a reader's consecutive rows on
  // consecutive banks.
  constexpr int PS = NB + 1;
  float* part = reinterpret_cast<float*>(smem);
  if (tid < CONSUMERS) {
    const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int r = (tid >> 7) * 64 + warp * 16 + g;
#pragma unroll
    for (int j = 0; j < NB / 8; ++j) {
      part[r * PS + 8 * j + 2 * q] = acc[4 * j];
      part[r * PS + 8 * j + 2 * q + 1] = acc[4 * j + 1];
      part[(r + 8) * PS + 8 * j + 2 * q] = acc[4 * j + 2];
      part[(r + 8) * PS + 8 * j + 2 * q + 1] = acc[4 * j + 3];
    }
  }
  // Block `rank` finishes rows [rank · BM / S, +BM / S) of the tile for every x row, adding the
  // blocks' partials in rank order; consecutive threads take consecutive W rows, so that a row
  // of y is written in runs.
  constexpr int PER = BM / S, THREADS = CONSUMERS + 32;
  if constexpr (GLU) {
    __syncthreads();
    for (int e = tid; e < 32 * NB; e += THREADS) {
      const int r = e % 32, m = e / 32, n = row0 + r;
      if (m < M && n < N) {
        const float g = to_f32(from_f32<T>(part[r * PS + m])), u = to_f32(from_f32<T>(part[(r + 32) * PS + m]));
        y[(size_t)m * ldy + n] = from_f32<O>(ds_silu(g) * u);
      }
    }
  } else if constexpr (S == 1) {
    y += blockIdx.x * part_stride;
    if constexpr (CONV) asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    for (int e = tid; e < PER * NB; e += THREADS) {
      const int r = e % PER, m = e / PER, n = row0 + r;
      if (m < M && n < N) {
        const O out = from_f32<O>(part[r * PS + m]);
        y[(size_t)m * ldy + n] = out;
        if constexpr (CONV) {
          if (n < cv->C) {
            const float4 win = conv_win[m * BM + r], wt = conv_wt[r];
            const float4 v = make_float4(win.y, win.z, win.w, to_f32(out));
            float* st = cv->states + (size_t)slot_of(*cv->slots, cv->more_slots, m) * cv->C * 4 + (size_t)n * 4;
            *reinterpret_cast<float4*>(st) = v;
            float c = 0.0f;
            c += wt.x * v.x;
            c += wt.y * v.y;
            c += wt.z * v.z;
            c += wt.w * v.w;
            cv->cy[(size_t)m * cv->C + n] = cv->silu ? ds_silu(c) : c;
          }
        }
      }
    }
  } else {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const int rank = (int)cluster.block_rank();
    for (int e = tid; e < PER * NB; e += THREADS) {
      const int r = rank * PER + e % PER, m = e / PER, n = row0 + r;
      if (m >= M) break;
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < S; ++s) sum += *cluster.map_shared_rank(part + r * PS + m, s);
      if (n < N) y[(size_t)m * ldy + n] = from_f32<O>(sum);
    }
    // No block leaves while another may still read its partial tile.
    cluster.sync();
  }
}

// skinny_{t}_{o}_w{WG}_n{NB}_s{S}: y = x Wᵀ for M ≤ NB rows of x, 64·WG rows of W a block, K
// split S ways across a cluster (s1: each slice's partial product apart), y in O.
#define SK_ENTRY(T, TN, O, ON, WG, NB, S)                                                                           \
  extern "C" __global__ void SK_CLUSTER(S) __launch_bounds__(128 * WG + 32)                                        \
      skinny_##TN##_##ON##_w##WG##_n##NB##_s##S(const __grid_constant__ CUtensorMap tw,                           \
                                                 const __grid_constant__ CUtensorMap tx, O* y, int ldy, int M, int N, \
                                                 int K, int stages, int hint, long part_stride) {                  \
    SK_BODY(skinny<T, O, WG, NB, S>(&tw, &tx, y, ldy, M, N, K, stages, hint, part_stride));                        \
  }

// skinny_glu_{t}_n{NB}: silu(x W_gᵀ) · (x W_uᵀ) for M ≤ NB rows of x, 32 gate rows a block.
#define SK_GLU_ENTRY(T, TN, NB)                                                                                    \
  extern "C" __global__ void __launch_bounds__(160)                                                                \
      skinny_glu_##TN##_n##NB(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, T* y, \
                              int M, int I, int K, int stages, int hint, int trigger) {                           \
    SK_BODY(skinny<T, T, 1, NB, 1, SK_GLU>(&tw, &tx, y, I, M, I, K, stages, hint, 0, I, trigger));                 \
  }
// ENTRY for each x-row tile and both 16-bit types.
#define SK_TILES(ENTRY)                                                                           \
  ENTRY(__nv_bfloat16, bf16, 16) ENTRY(__nv_bfloat16, bf16, 32) ENTRY(__nv_bfloat16, bf16, 64) \
  ENTRY(__half, f16, 16) ENTRY(__half, f16, 32) ENTRY(__half, f16, 64)
SK_TILES(SK_GLU_ENTRY)

// skinny_conv_{t}_n{NB}: y = x Wᵀ for M ≤ NB rows of x, 64 rows of W a block, K unsplit, and the
// decode step's short conv of y's first C columns into cy.
#define SK_CONV_ENTRY(T, TN, NB)                                                                                    \
  extern "C" __global__ void __launch_bounds__(160)                                                                  \
      skinny_conv_##TN##_n##NB(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, T* y, \
                               int M, int N, int K, int stages, int hint, const float* cw, float* states,           \
                               const __grid_constant__ SlotList slots, const int* more_slots, float* cy, int C,    \
                               int silu) {                                                                          \
    SK_BODY(const SkConv cv{cw, states, &slots, more_slots, cy, C, silu};                                            \
            skinny<T, T, 1, NB, 1, SK_CONV>(&tw, &tx, y, N, M, N, K, stages, hint, 0, 0, 0, &cv));                  \
  }
SK_TILES(SK_CONV_ENTRY)

#define SK_SPLITS(T, TN, O, ON, WG, NB) \
  SK_ENTRY(T, TN, O, ON, WG, NB, 1)     \
  SK_ENTRY(T, TN, O, ON, WG, NB, 2)     \
  SK_ENTRY(T, TN, O, ON, WG, NB, 4)     \
  SK_ENTRY(T, TN, O, ON, WG, NB, 8)
#define SK_WIDTHS(T, TN, O, ON, WG) \
  SK_SPLITS(T, TN, O, ON, WG, 16)   \
  SK_SPLITS(T, TN, O, ON, WG, 32)   \
  SK_SPLITS(T, TN, O, ON, WG, 64)
#define SK_SHAPES(T, TN, O, ON) \
  SK_WIDTHS(T, TN, O, ON, 1)    \
  SK_WIDTHS(T, TN, O, ON, 2)
SK_SHAPES(__nv_bfloat16, bf16, __nv_bfloat16, bf16)
SK_SHAPES(__nv_bfloat16, bf16, float, f32)
SK_SHAPES(__half, f16, __half, f16)
SK_SHAPES(__half, f16, float, f32)
