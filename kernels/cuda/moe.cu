// Sparse mixture-of-experts on the device (hybrid-spec.md §4.3), with nothing sized by the
// routing on the host, so that a decode step holding it can be captured as a CUDA graph:
//   moe_route_T    one warp a token: fp32 softmax of its router logits, top-k (an exact tie
//                  goes to the lower expert), weights renormalised, rounded to T; each choice
//                  named by its index among the experts held here (expert parallelism holds a
//                  run of them), or by `held` when it is not held (a group never computed);
//   moe_count, moe_sort  the N·k (token, choice) pairs grouped by expert (counts, offsets, a
//                  scatter whose order inside a group changes no result), and the list of held
//                  experts with rows or of their row tiles;
//   moe_up_T       per listed expert, per 16 output columns: h = silu(gate x) · up x over the
//                  rows that chose it, gate and up rows of `gate_up` read once for 4 rows at a
//                  time;
//   moe_down_T     per listed expert, per 32 output columns: y = h · downᵀ, fp32 out;
//   moe_combine_T  per token and 256 columns: Σ_j w_j · y[pair j] (+ σ(shared gate) · shared),
//                  rounded once.
// T is the activation dtype (f32, bf16, f16); accumulation is fp32 throughout. For prompts
// (many rows an expert), moe_up_tc_T / moe_down_tc_T do the two projections on the tensor
// cores instead (bf16/f16): 64×64 output tiles over the expert's rows, listed by moe_sort.
#include <mma.h>

#include "common.cuh"
#include "dtype.cuh"

#define MOE_THREADS 256
#define MOE_WARPS (MOE_THREADS / 32)
// Output columns a warp computes (the up projection's, of both its gate and up rows; the down
// projection's, whose K is short), rows of x a pass reads.
#define MOE_COLS 2
#define MOE_DOWN_COLS 4
#define MOE_ROWS 4

// Token t = blockIdx.x · warps + warp, a warp a token (a decode step's few tokens then take a
// few warps' shuffles, where a block a token took ~7 µs of barriers): logits [E] (row stride ld)
// → ids [k] (expert − first when held here, else `held`), weights [k] (fp32 of T-rounded
// values). The warp's E probabilities in shared memory (E floats a warp).
// Probabilities as torch's fp32 softmax: exp(x − max) / Σ (IEEE exp and division), so equal
// logits give equal probabilities and the tie rule decides.
template <typename T>
__device__ void route(const T* logits, long ld, int n, int E, int k, int normalise, int first, int held, int* ids,
                      float* weights) {
  extern __shared__ float route_p[];
  const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * warps + w;
  if (t >= n) return;
  float* p = route_p + (size_t)w * E;
  const T* l = logits + (size_t)t * ld;
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, p[e] = to_f32(l[e]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0.0f;
  for (int e = lane; e < E; e += 32) s += (p[e] = expf(p[e] - m));
  s = warp_sum(s);  // every lane the same sum: each butterfly step adds the same two values
  for (int e = lane; e < E; e += 32) p[e] = p[e] / s;
  __syncwarp();
  float total = 0.0f;
  for (int j = 0; j < k; ++j) {
    float v = -1.0f;
    int i = 0x7fffffff;
    for (int e = lane; e < E; e += 32)
      if (p[e] > v) v = p[e], i = e;  // ascending e: a tie keeps the lower index
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
    }
    if (lane == 0) {
      ids[t * k + j] = (i >= first && i < first + held) ? i - first : held;
      weights[t * k + j] = v;
    }
    if (lane == (i & 31)) p[i] = -1.0f;  // probabilities are ≥ 0: taken
    total += v;
    __syncwarp();
  }
  for (int j = lane; j < k; j += 32) {
    float wj = weights[t * k + j];
    if (normalise) wj = wj / total;
    weights[t * k + j] = to_f32(from_f32<T>(wj));
  }
}

// Rows and output columns of a tensor-core tile.
#define TC_M 64
#define TC_N 64
#define TC_K 32
#define TC_LD (TC_K + 8)

// pairs P = N·k of expert ids → offsets [E+1], order [P] (pair at each grouped position),
// pos [P] (grouped position of each pair; −1 for a pair of group `held` and above, whose
// experts are not here), and the list the expert kernels run over: with `tensor_cores`, their
// row tiles, tiles[t] = (expert, first row) for each tile_rows rows of each held expert, ntiles[0] of
// them; otherwise the held experts with rows, active[0 .. nactive[0]) (the GEMV kernels' grid
// covers only those). Tiles are of `tile_rows` rows: TC_M for the wmma tiles, 128 for
// moe_wg.cu's.
//
// Block b of B takes the pairs [b·S, (b + 1)·S) of the scatter (S = ⌈P / B⌉); a prompt's tens of
// thousands of pairs are spread over blocks, as one block's scattered stores took ~60 µs a layer.
// With B > 1 (`counted`), moe_count first writes each block's counts [B, E]; with B = 1 the
// block counts them itself. Each block scans the counts (every block the same sums), places its
// pairs after those of the blocks before it (within a block in the order of its shared-memory
// atomics: the order inside a group changes no result), and block 0 writes offsets and the list.
// Shared memory 2(E + 1) ints. MOE_SORT_THREADS threads.
#define MOE_SORT_THREADS 1024
#define MOE_SORT_ITEMS 8  // consecutive entries a thread scans: E + 1 ≤ 8192

// An exclusive prefix sum of a[0 .. n) in place (n ≤ MOE_SORT_THREADS · MOE_SORT_ITEMS); every
// thread gets the total. Ends with the block synchronised.
__device__ int block_exclusive_scan(int* a, int n) {
  __shared__ int warp_tot[MOE_SORT_THREADS / 32];
  const int i0 = threadIdx.x * MOE_SORT_ITEMS, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int v[MOE_SORT_ITEMS], sum = 0;
#pragma unroll
  for (int j = 0; j < MOE_SORT_ITEMS; ++j) {
    v[j] = i0 + j < n ? a[i0 + j] : 0;
    sum += v[j];
  }
  int incl = sum;  // inclusive over the warp's lanes
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) warp_tot[w] = incl;
  __syncthreads();
  int before = 0, total = 0;
  for (int j = 0; j < MOE_SORT_THREADS / 32; ++j) {
    before += j < w ? warp_tot[j] : 0;
    total += warp_tot[j];
  }
  int run = before + incl - sum;
#pragma unroll
  for (int j = 0; j < MOE_SORT_ITEMS; ++j) {
    if (i0 + j < n) a[i0 + j] = run;
    run += v[j];
  }
  __syncthreads();
  return total;
}

// Block b's counts of its pairs by group: counts[b·G + g].
extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS) moe_count(const int* ids, int P, int G, int* counts) {
  pdl_entry();
  extern __shared__ int hist[];
  const int S = (P + gridDim.x - 1) / gridDim.x, p0 = blockIdx.x * S, p1 = min(P, p0 + S);
  for (int g = threadIdx.x; g < G; g += blockDim.x) hist[g] = 0;
  __syncthreads();
  for (int p = p0 + threadIdx.x; p < p1; p += blockDim.x) atomicAdd(&hist[ids[p]], 1);
  __syncthreads();
  for (int g = threadIdx.x; g < G; g += blockDim.x) counts[(size_t)blockIdx.x * G + g] = hist[g];
}

extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS) moe_sort(const int* ids, int P, int E, int held, const int* counts,
                                                                      int counted, int* offsets, int* order, int* pos, int tensor_cores,
                                                                      int tile_rows, int2* tiles, int* ntiles, int* active,
                                                                      int* nactive) {
  pdl_entry();
  extern __shared__ int sh[];
  int* off = sh;           // [E + 1]: the groups' sizes, then their offsets
  int* next = sh + E + 1;  // [E + 1]: where this block's next pair of each group goes
  const int B = gridDim.x, b = blockIdx.x, S = (P + B - 1) / B, p0 = b * S, p1 = min(P, p0 + S);
  for (int g = threadIdx.x; g <= E; g += blockDim.x) {
    int all = 0, before = 0;
    if (counted && g < E)
      for (int c = 0; c < B; ++c) {
        const int n = counts[(size_t)c * E + g];
        all += n;
        before += c < b ? n : 0;
      }
    off[g] = all;
    next[g] = before;
  }
  __syncthreads();
  if (!counted)
    for (int p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&off[ids[p]], 1);
  __syncthreads();
  block_exclusive_scan(off, E + 1);
  for (int g = threadIdx.x; g <= E; g += blockDim.x) {
    next[g] += off[g];
    if (b == 0) offsets[g] = off[g];
  }
  __syncthreads();
  for (int p = p0 + threadIdx.x; p < p1; p += blockDim.x) {
    const int e = ids[p], at = atomicAdd(&next[e], 1);
    order[at] = p;
    pos[p] = e < held ? at : -1;
  }
  if (b != 0) return;
  // The list: each held expert's tiles (or 1 when it has rows), placed by a second scan.
  __syncthreads();
  for (int g = threadIdx.x; g < E; g += blockDim.x) {
    const int n = off[g + 1] - off[g];
    next[g] = g >= held ? 0 : tensor_cores ? (n + tile_rows - 1) / tile_rows : n > 0;
  }
  __syncthreads();
  const int listed = block_exclusive_scan(next, E);
  for (int g = threadIdx.x; g < held && g < E; g += blockDim.x) {
    const int n = off[g + 1] - off[g], at = next[g];
    if (tensor_cores) {
      for (int r = 0; r < n; r += tile_rows) tiles[at + r / tile_rows] = make_int2(g, r);
    } else if (n > 0) {
      active[at] = g;
    }
  }
  if (threadIdx.x == 0) {
    ntiles[0] = tensor_cores ? listed : 0;
    nactive[0] = tensor_cores ? 0 : listed;
  }
}

// Expert active[blockIdx.y] (blocks past nactive[0] return), output columns from
// (blockIdx.x·warps + warp)·COLS. Rows of x: the
// expert's grouped positions [offsets[e], offsets[e+1]); row r reads x + src(r)·ldx where
// src(r) = order[r] / k (the token of a pair) when `gather`, else r. W: [E, Nw, K]; GATED reads
// rows n and n + N of W (gate and up) and writes T(silu(T(g)) · T(u)) rounded as transformers'
// bf16 ops do; otherwise writes the fp32 dot. out: [P, N] of T (GATED) or f32.
template <typename T, bool GATED, int COLS>
__device__ void grouped(const T* __restrict__ x, long ldx, const int* __restrict__ order, int k, int gather,
                        const int* __restrict__ offsets, const int* __restrict__ active, const int* __restrict__ nactive,
                        const T* __restrict__ w, int N, int K, void* out) {
  if ((int)blockIdx.y >= nactive[0]) return;
  const int e = active[blockIdx.y];
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * MOE_WARPS + (threadIdx.x >> 5)) * COLS;
  if (n0 >= N) return;
  const int Nw = GATED ? 2 * N : N;
  const T* we = w + (size_t)e * Nw * K;
  constexpr int WR = GATED ? 2 * COLS : COLS;
  // The warp's W rows (gate, then up when GATED); a row past N reads row 0 and is never stored.
  const T* wrow[WR];
#pragma unroll
  for (int c = 0; c < WR; ++c) {
    const int n = GATED ? (c < COLS ? n0 + c : N + n0 + c - COLS) : n0 + c;
    wrow[c] = we + (size_t)((c % COLS) + n0 < N ? n : 0) * K;
  }
  // W's 8-element pieces at kk, raw; two K steps in flight: the next step's loads are issued
  // before this one's products, and the first before the rows' lookups (offsets, then order:
  // dependent loads a warp used to wait out before its first W load).
  using Piece = Packed<8, T>;
  auto load_w = [&](Piece (&d)[WR], int kk) {
    if (kk < K) {
#pragma unroll
      for (int c = 0; c < WR; ++c) d[c] = *reinterpret_cast<const Piece*>(wrow[c] + kk);
    }
  };
  Piece wa[WR], wb[WR];
  load_w(wa, lane * 8);
  const int o0 = offsets[e], o1 = offsets[e + 1];
  for (int r0 = o0; r0 < o1; r0 += MOE_ROWS) {
    const int nr = min(MOE_ROWS, o1 - r0);
    const T* xr[MOE_ROWS];
#pragma unroll
    for (int b = 0; b < MOE_ROWS; ++b) {
      const int r = r0 + min(b, nr - 1);
      xr[b] = x + (size_t)(gather ? order[r] / k : r) * ldx;
    }
    float acc[WR][MOE_ROWS] = {};
    // One K step's products: zeros in place of the rows past N, as before the pieces were raw.
    auto step = [&](const Piece (&p)[WR], int kk) {
#pragma unroll
      for (int b = 0; b < MOE_ROWS; ++b) {
        if (b < nr) {
          float xv[8];
          load_vec<8>(xv, xr[b] + kk);
#pragma unroll
          for (int c = 0; c < WR; ++c)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[c][b] += ((c % COLS) + n0 < N ? to_f32(p[c].v[i]) : 0.0f) * xv[i];
        }
      }
    };
    for (int kk = lane * 8; kk < K; kk += 512) {
      load_w(wb, kk + 256);
      step(wa, kk);
      if (kk + 256 >= K) break;
      load_w(wa, kk + 512);
      step(wb, kk + 256);
    }
    if (r0 + MOE_ROWS < o1) load_w(wa, lane * 8);  // the next rows start over
#pragma unroll
    for (int c = 0; c < WR; ++c)
#pragma unroll
      for (int b = 0; b < MOE_ROWS; ++b) acc[c][b] = warp_sum(acc[c][b]);
    if (lane == 0) {
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        if (n0 + c >= N) continue;
#pragma unroll
        for (int b = 0; b < MOE_ROWS; ++b) {
          if (b >= nr) continue;
          const size_t at = (size_t)(r0 + b) * N + n0 + c;
          if constexpr (GATED) {
            const float g = to_f32(from_f32<T>(acc[c][b])), u = to_f32(from_f32<T>(acc[COLS + c][b]));
            static_cast<T*>(out)[at] = from_f32<T>(to_f32(from_f32<T>(g / (1.0f + expf(-g)))) * u);
          } else {
            static_cast<float*>(out)[at] = acc[c][b];
          }
        }
      }
    }
  }
}

// Token blockIdx.x, columns from blockIdx.y·MOE_THREADS, one a thread (a decode step's few
// tokens then spread over several blocks): out[t] = Σ_j w[t, j] · y[pos[t·k + j]]
// (+ σ(sgate[t]) · shared[t]), fp32 sums, one rounding to T.
template <typename T>
__device__ void combine(const float* y, const int* pos, const float* w, int k, const T* shared, long lds, const T* sgate,
                        long ldg, T* out, int D) {
  const int t = blockIdx.x;
  const float gate = shared ? 1.0f / (1.0f + expf(-to_f32(sgate[(size_t)t * ldg]))) : 0.0f;
  for (int d = blockIdx.y * MOE_THREADS + threadIdx.x; d < D; d += MOE_THREADS * gridDim.y) {
    float s = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int at = pos[t * k + j];
      if (at >= 0) s += w[t * k + j] * y[(size_t)at * D + d];  // < 0: an expert another rank holds
    }
    if (shared) s += gate * to_f32(shared[(size_t)t * lds + d]);
    out[(size_t)t * D + d] = from_f32<T>(s);
  }
}

// Tensor-core tiles (bf16/f16). Tile blockIdx.x of moe_sort's list (expert e, rows r0..r0+64
// of its group), output columns blockIdx.y·64. A = the rows (gathered tokens of x when
// `gather`, else rows of h), B = W_e's rows as columns: C = A·W_eᵀ, fp32, over K in steps of 32,
// each step's global loads issued before the previous step's products. Eight warps: warp w
// computes rows (w % 4)·16 and columns (w / 4)·32 (GATED: of both the gate and the up rows).
// The epilogue goes through shared memory, as moe_up_T / moe_down_T round and store.
template <typename T, bool GATED>
__device__ void grouped_tc(const T* __restrict__ x, long ldx, const int* __restrict__ order, int k, int gather,
                           const int* __restrict__ offsets, const int2* __restrict__ tiles, const int* __restrict__ ntiles,
                           const T* __restrict__ w, int N, int K, void* out) {
  using namespace nvcuda;
  constexpr int BR = GATED ? 2 * TC_N : TC_N;  // weight rows a tile reads
  constexpr int CLD = TC_N + 4;
  constexpr int LOAD_BYTES = (TC_M + BR) * TC_LD * (int)sizeof(T);
  constexpr int EPI_BYTES = (GATED ? 2 : 1) * TC_M * CLD * (int)sizeof(float);
  __shared__ __align__(128) unsigned char smem[LOAD_BYTES > EPI_BYTES ? LOAD_BYTES : EPI_BYTES];
  if ((int)blockIdx.x >= ntiles[0]) return;
  const int2 tile = tiles[blockIdx.x];
  const int e = tile.x, m0 = tile.y, o0 = offsets[e], rows = min(TC_M, offsets[e + 1] - o0 - m0);
  const int n0 = blockIdx.y * TC_N;
  if (n0 >= N) return;
  T* As = reinterpret_cast<T*>(smem);
  T* Bs = As + TC_M * TC_LD;
  const int tid = threadIdx.x, warp = tid >> 5;
  const T* we = w + (size_t)e * (GATED ? 2 * N : N) * K;
  // This thread's 8-element pieces: one of A, BR / 64 of B.
  const int ar = tid >> 2, ac = (tid & 3) * 8;
  const T* a_src = nullptr;
  if (ar < rows) a_src = x + (size_t)(gather ? order[o0 + m0 + ar] / k : o0 + m0 + ar) * ldx;
  constexpr int BP = BR / 64;
  const T* b_src[BP];
#pragma unroll
  for (int j = 0; j < BP; ++j) {
    const int br = ar + 64 * j, col = br % TC_N;
    const int n = GATED && br >= TC_N ? N + n0 + col : n0 + col;
    b_src[j] = n0 + col < N ? we + (size_t)n * K : nullptr;
  }
  uint4 a_reg, b_reg[BP];
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto fetch = [&](int k0) {
    a_reg = a_src ? *reinterpret_cast<const uint4*>(a_src + k0 + ac) : zero;
#pragma unroll
    for (int j = 0; j < BP; ++j) b_reg[j] = b_src[j] ? *reinterpret_cast<const uint4*>(b_src[j] + k0 + ac) : zero;
  };
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> FA;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> FB;
  typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FC;
  constexpr int NF = GATED ? 4 : 2;
  FC acc[NF];
#pragma unroll
  for (int f = 0; f < NF; ++f) wmma::fill_fragment(acc[f], 0.0f);
  const int wr = (warp & 3) * 16, wc = (warp >> 2) * 32;
  fetch(0);
  for (int k0 = 0; k0 < K; k0 += TC_K) {
    *reinterpret_cast<uint4*>(As + ar * TC_LD + ac) = a_reg;
#pragma unroll
    for (int j = 0; j < BP; ++j) *reinterpret_cast<uint4*>(Bs + (ar + 64 * j) * TC_LD + ac) = b_reg[j];
    __syncthreads();
    if (k0 + TC_K < K) fetch(k0 + TC_K);
#pragma unroll
    for (int kk = 0; kk < TC_K; kk += 16) {
      FA a;
      wmma::load_matrix_sync(a, As + wr * TC_LD + kk, TC_LD);
#pragma unroll
      for (int f = 0; f < NF; ++f) {
        // Fragment f: columns wc + 16·(f % 2) of the gate (f < 2) or up (f ≥ 2) rows.
        FB b;
        wmma::load_matrix_sync(b, Bs + ((f / 2) * TC_N + wc + 16 * (f % 2)) * TC_LD + kk, TC_LD);
        wmma::mma_sync(acc[f], a, b, acc[f]);
      }
    }
    __syncthreads();
  }
  float* C = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int f = 0; f < NF; ++f)
    wmma::store_matrix_sync(C + (f / 2) * TC_M * CLD + wr * CLD + wc + 16 * (f % 2), acc[f], CLD, wmma::mem_row_major);
  __syncthreads();
  for (int i = tid; i < TC_M * TC_N; i += MOE_THREADS) {
    const int r = i / TC_N, c = i % TC_N;
    if (r >= rows || n0 + c >= N) continue;
    const size_t at = (size_t)(o0 + m0 + r) * N + n0 + c;
    if constexpr (GATED) {
      const float g = to_f32(from_f32<T>(C[r * CLD + c])), u = to_f32(from_f32<T>(C[TC_M * CLD + r * CLD + c]));
      static_cast<T*>(out)[at] = from_f32<T>(to_f32(from_f32<T>(g / (1.0f + expf(-g)))) * u);
    } else {
      static_cast<float*>(out)[at] = C[r * CLD + c];
    }
  }
}

#define MOE_TC_ENTRIES(T, NAME)                                                                                     \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS)                                                         \
      moe_up_tc_##NAME(const T* x, long ldx, const int* order, int k, const int* offsets, const int2* tiles,         \
                       const int* ntiles, const T* w, int N, int K, T* out) { pdl_entry();                                       \
    grouped_tc<T, true>(x, ldx, order, k, 1, offsets, tiles, ntiles, w, N, K, out);                                 \
  }                                                                                                                 \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_down_tc_##NAME(                                     \
      const T* h, const int* offsets, const int2* tiles, const int* ntiles, const T* w, int N, int K, float* out) { pdl_entry(); \
    grouped_tc<T, false>(h, K, nullptr, 1, 0, offsets, tiles, ntiles, w, N, K, out);                                \
  }
MOE_TC_ENTRIES(__nv_bfloat16, bf16)
MOE_TC_ENTRIES(__half, f16)

#define MOE_ENTRIES(T, NAME)                                                                                        \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS)                                                         \
      moe_route_##NAME(const T* logits, long ld, int n, int E, int k, int normalise, int first, int held, int* ids,   \
                       float* weights) { pdl_entry();                                                                             \
    route<T>(logits, ld, n, E, k, normalise, first, held, ids, weights);                                            \
  }                                                                                                                 \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_up_##NAME(                                          \
      const T* x, long ldx, const int* order, int k, const int* offsets, const int* active, const int* nactive,      \
      const T* w, int N, int K, T* out) { pdl_entry();                                                                           \
    grouped<T, true, MOE_COLS>(x, ldx, order, k, 1, offsets, active, nactive, w, N, K, out);                                  \
  }                                                                                                                 \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS)                                                         \
      moe_down_##NAME(const T* h, const int* offsets, const int* active, const int* nactive, const T* w, int N,      \
                      int K, float* out) { pdl_entry();                                                                          \
    grouped<T, false, MOE_DOWN_COLS>(h, K, nullptr, 1, 0, offsets, active, nactive, w, N, K, out);                                 \
  }                                                                                                                 \
  extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_combine_##NAME(                                     \
      const float* y, const int* pos, const float* w, int k, const T* shared, long lds, const T* sgate, long ldg,    \
      T* out, int D) { pdl_entry();                                                                                              \
    combine<T>(y, pos, w, k, shared, lds, sgate, ldg, out, D);                                                      \
  }
MOE_ENTRIES(float, f32)
MOE_ENTRIES(__nv_bfloat16, bf16)
MOE_ENTRIES(__half, f16)
