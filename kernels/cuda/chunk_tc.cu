// Chunked gated delta rule on the tensor cores (bf16 operands, fp32 accumulation and state),
// in two launches, as the WY/UT form allows (model-spec.md §3.5):
//
// 1. chunk_tc_prep: every (chunk, value head) at once. With G the chunk-local cumulative
//    log-decay and A[i,j] = β_i (k_i·k_j) e^{G_i−G_j} (j < i), T = (I + A)⁻¹ and
//      W = T diag(β e^G) K,   U = T diag(β) V,   P[i,j] = (q_i·k_j) e^{G_i−G_j} (j ≤ i).
//    T is inverted in fp32 by 16×16 blocks: the diagonal blocks by forward substitution (one
//    column per lane), then the block rows below from the blocks above them.
// 2. chunk_tc_state: one CTA per (sequence, value head, value tile), chunks in order:
//      V' = U − W S,   O = scale (e^G ⊙ Q S + P V'),   S ← e^{G_last} S + (e^{G_last−G} ⊙ K)ᵀ V'.
//    S stays fp32 in shared memory.
//
// Every fp32 operand enters the matmuls as a bf16 hi + lo pair (x ≈ hi + lo, ~16 mantissa
// bits; the lo·lo product is dropped), so the result is close to an fp32 computation: that
// matters most for V' = U − W S, which cancels when the state already predicts v well. W, U
// and P travel between the launches in fp32. bf16 inputs (TI = bf16) are exact in one bf16,
// so their lo halves and products are skipped.
//
// Chunks never cross sequences: chunk c covers rows [crow[c], crow[c] + clen[c]) of one
// packed sequence. Padding rows (beyond clen) load as zeros and carry the last row's G.
#include <cuda_bf16.h>
#include <mma.h>

#include "common.cuh"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define CH 64
#define THREADS 256
#define AP 68  // fp32 [64, 64] tiles, padded
#define TP 72  // bf16 [64, 64] tiles, padded

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> FragAT;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBT;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

__device__ __forceinline__ int round16(int x) { return (x + 15) / 16 * 16; }

// x ≈ hi + lo with both halves bf16.
__device__ __forceinline__ void split(float x, bf16& hi, bf16& lo) {
  hi = __float2bfloat16(x);
  lo = __float2bfloat16(x - __bfloat162float(hi));
}

// Whether inputs of type T need a lo half.
template <typename T>
struct Split {
  static constexpr bool value = true;
};
template <>
struct Split<bf16> {
  static constexpr bool value = false;
};

// A loader callback writing 8 values into a bf16 tile (hi) and, when lo is non-null, their
// remainders.
__device__ __forceinline__ auto to_tile(bf16* hi, bf16* lo, int ld) {
  return [=](int r, int cc, const float* x) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (lo)
        split(x[e], hi[r * ld + cc + e], lo[r * ld + cc + e]);
      else
        hi[r * ld + cc + e] = __float2bfloat16(x[e]);
    }
  };
}


// Bump allocator over dynamic shared memory; every buffer starts 128-byte aligned (wmma needs 32).
struct Smem {
  unsigned char* p;
  template <typename T>
  __device__ T* take(int n) {
    T* r = reinterpret_cast<T*>(p);
    p += ((size_t)n * sizeof(T) + 127) / 128 * 128;
    return r;
  }
};

// Eight consecutive elements as floats (zeros where !ok or past `valid` columns).
__device__ __forceinline__ void load8(float* v, const bf16* p, bool ok, int valid, bool vec) {
  if (ok && vec && valid >= 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      v[2 * e] = f.x;
      v[2 * e + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = (ok && e < valid) ? __bfloat162float(p[e]) : 0.0f;
  }
}
__device__ __forceinline__ void load8(float* v, const float* p, bool ok, int valid, bool vec) {
  if (ok && vec && valid >= 8) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = (ok && e < valid) ? p[e] : 0.0f;
  }
}

// Visits an [R, W16] block of a row-major matrix (row r at base + r·stride) in groups of 8
// columns, calling f(r, c, v[8]); values are zero in rows ≥ L and columns ≥ W. The loads of
// four groups per thread are issued before any is used, so they overlap in flight.
template <typename TI, typename F>
__device__ __forceinline__ void for_rows8(const TI* base, size_t stride, int R, int L, int W, int W16, F f) {
  const int gpr = W16 / 8, ng = R * gpr;
  const bool vec = W % 8 == 0 && stride % 8 == 0 && (reinterpret_cast<uintptr_t>(base) % 16) == 0;
  for (int g0 = 0; g0 < ng; g0 += 4 * THREADS) {
    float v[4][8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = g0 + threadIdx.x + j * THREADS;
      const int r = i / gpr, c = (i % gpr) * 8;
      load8(v[j], base + (size_t)r * stride + c, i < ng && r < L, W - c, vec);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = g0 + threadIdx.x + j * THREADS;
      if (i < ng) f(i / gpr, (i % gpr) * 8, v[j]);
    }
  }
}

// Stores a warp's 16×16 fp32 accumulator into rows (< L) and columns (< cmax) of a row-major
// matrix (row r at dst + r·stride).
__device__ void store_tile(float* stage, const FragC& acc, float* dst, size_t stride, int L, int r0, int c0, int cmax) {
  const int lane = threadIdx.x & 31;
  wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 256; e += 32) {
    const int r = r0 + e / 16, c = c0 + e % 16;
    if (r < L && c < cmax) dst[r * stride + c] = stage[e];
  }
  __syncwarp();
}

// acc += (a_hi + a_lo)(b_hi + b_lo) without the lo·lo term; null lo pointers are skipped.
template <typename FA, typename FB>
__device__ __forceinline__ void mma_split(FragC& acc, const bf16* a_hi, const bf16* a_lo, int lda, const bf16* b_hi,
                                          const bf16* b_lo, int ldb) {
  FA ah;
  FB bh;
  wmma::load_matrix_sync(ah, a_hi, lda);
  wmma::load_matrix_sync(bh, b_hi, ldb);
  wmma::mma_sync(acc, ah, bh, acc);
  if (a_lo) {
    FA al;
    wmma::load_matrix_sync(al, a_lo, lda);
    wmma::mma_sync(acc, al, bh, acc);
  }
  if (b_lo) {
    FB bl;
    wmma::load_matrix_sync(bl, b_lo, ldb);
    wmma::mma_sync(acc, ah, bl, acc);
  }
}

template <typename TI>
__device__ void chunk_tc_prep(const TI* __restrict__ q, const TI* __restrict__ k, const TI* __restrict__ v,
                              const float* __restrict__ beta, const float* __restrict__ g, const int* __restrict__ crow,
                              const int* __restrict__ clen, float* __restrict__ W, float* __restrict__ U,
                              float* __restrict__ P, float* __restrict__ Gout, int H, int HV, int K, int V) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr bool LO = Split<TI>::value;
  const int K16 = round16(K), KP = K16 + 8;
  // V blocks reuse the q tiles once Q Kᵀ is done.
  const int qsize = max(CH * KP, CH * TP);
  Smem sm{smem_raw};
  bf16* Kh = sm.take<bf16>(CH * KP);
  bf16* Kl = LO ? sm.take<bf16>(CH * KP) : nullptr;
  bf16* Qh = sm.take<bf16>(qsize);
  bf16* Ql = LO ? sm.take<bf16>(qsize) : nullptr;
  bf16* Vh = Qh;
  bf16* Vl = Ql;
  float* Af = sm.take<float>(CH * AP);
  float* Tf = sm.take<float>(CH * AP);
  bf16* T1h = sm.take<bf16>(CH * TP);
  bf16* T1l = sm.take<bf16>(CH * TP);
  bf16* T2h = sm.take<bf16>(CH * TP);
  bf16* T2l = sm.take<bf16>(CH * TP);
  float* stage_all = sm.take<float>(8 * 256);
  float* Xs = sm.take<float>(3 * 256);
  float* G = sm.take<float>(CH);
  float* Bt = sm.take<float>(CH);

  const int c = blockIdx.x, hv = blockIdx.y;
  const int hk = hv / (HV / H);
  const size_t row0 = crow[c];
  const int L = clen[c];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* stage = stage_all + warp * 256;

  for_rows8(k + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Kh, Kl, KP));
  for_rows8(q + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Qh, Ql, KP));
  if (warp == 0) {
    // Inclusive scan of the log-decay: lane holds rows 2·lane and 2·lane + 1.
    const int r = 2 * lane;
    const float g0 = (g && r < L) ? g[(row0 + r) * HV + hv] : 0.0f;
    const float g1 = (g && r + 1 < L) ? g[(row0 + r + 1) * HV + hv] : 0.0f;
    const float pair = g0 + g1;
    float incl = pair;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    G[r] = incl - pair + g0;
    G[r + 1] = incl;
    if (r < L) Gout[(row0 + r) * HV + hv] = G[r];
    if (r + 1 < L) Gout[(row0 + r + 1) * HV + hv] = G[r + 1];
    Bt[r] = r < L ? beta[(row0 + r) * HV + hv] : 0.0f;
    Bt[r + 1] = r + 1 < L ? beta[(row0 + r + 1) * HV + hv] : 0.0f;
  }
  __syncthreads();

  // K Kᵀ into Af and Q Kᵀ into Tf, lower-triangle tiles only: 2 × 10 tiles over 8 warps.
  for (int t = warp; t < 32; t += 8) {
    const int m = t / 16, rt = (t % 16) / 4, ct = t % 4;
    if (ct > rt) continue;
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    const bf16* ah = m ? Qh : Kh;
    const bf16* al = m ? Ql : Kl;
    for (int kk = 0; kk < K16; kk += 16)
      mma_split<FragA, FragBT>(acc, ah + rt * 16 * KP + kk, LO ? al + rt * 16 * KP + kk : nullptr, KP, Kh + ct * 16 * KP + kk,
                               LO ? Kl + ct * 16 * KP + kk : nullptr, KP);
    wmma::store_matrix_sync((m ? Tf : Af) + rt * 16 * AP + ct * 16, acc, AP, wmma::mem_row_major);
  }
  __syncthreads();

  // Decays and masks (exp only where j ≤ i); P goes out now, Tf is reused for T.
  for (int e = tid; e < CH * CH; e += THREADS) {
    const int i = e / CH, j = e % CH;
    const float d = j <= i ? __expf(G[i] - G[j]) : 0.0f;
    Af[i * AP + j] = j < i ? Bt[i] * Af[i * AP + j] * d : 0.0f;
    if (i < L) P[((row0 + i) * HV + hv) * CH + j] = j <= i ? Tf[i * AP + j] * d : 0.0f;
  }
  __syncthreads();

  // Diagonal 16×16 blocks of T = (I + A)⁻¹: warp b, lane = column (columns are independent).
  if (warp < 4 && lane < 16) {
    const int b0 = warp * 16, col = b0 + lane;
    for (int i = 0; i < 16; ++i) {
      const int row = b0 + i;
      float acc = (i == lane) ? 1.0f : 0.0f;
      for (int j = lane; j < i; ++j) acc -= Af[row * AP + b0 + j] * Tf[(b0 + j) * AP + col];
      Tf[row * AP + col] = i >= lane ? acc : 0.0f;
    }
  }
  __syncthreads();
  // Block rows 1..3: T_ij = −T_ii Σ_{m=j}^{i−1} A_im T_mj for j < i.
  for (int bi = 1; bi < 4; ++bi) {
    for (int e = tid; e < bi * 256; e += THREADS) {
      const int bj = e / 256, r = (e % 256) / 16, cc = e % 16;
      float acc = 0.0f;
      for (int m = bj; m < bi; ++m)
        for (int x = 0; x < 16; ++x) acc += Af[(bi * 16 + r) * AP + m * 16 + x] * Tf[(m * 16 + x) * AP + bj * 16 + cc];
      Xs[e] = acc;
    }
    __syncthreads();
    for (int e = tid; e < bi * 256; e += THREADS) {
      const int bj = e / 256, r = (e % 256) / 16, cc = e % 16;
      float acc = 0.0f;
      for (int x = 0; x <= r; ++x) acc -= Tf[(bi * 16 + r) * AP + bi * 16 + x] * Xs[bj * 256 + x * 16 + cc];
      Tf[(bi * 16 + r) * AP + bj * 16 + cc] = acc;
    }
    __syncthreads();
  }
  for (int e = tid; e < CH * CH; e += THREADS) {
    const int i = e / CH, j = e % CH;
    const float t = j <= i ? Tf[i * AP + j] * Bt[j] : 0.0f;
    split(t * __expf(G[j]), T1h[i * TP + j], T1l[i * TP + j]);
    split(t, T2h[i * TP + j], T2l[i * TP + j]);
  }
  __syncthreads();

  // W = T1 K (T1 lower triangular: k-steps up to the row tile).
  for (int t = warp; t < 4 * (K16 / 16); t += 8) {
    const int rt = t / (K16 / 16), ct = t % (K16 / 16);
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk <= rt; ++kk)
      mma_split<FragA, FragB>(acc, T1h + rt * 16 * TP + kk * 16, T1l + rt * 16 * TP + kk * 16, TP, Kh + kk * 16 * KP + ct * 16,
                              LO ? Kl + kk * 16 * KP + ct * 16 : nullptr, KP);
    store_tile(stage, acc, W + (row0 * HV + hv) * K, (size_t)HV * K, L, rt * 16, ct * 16, K);
  }
  // U = T2 V, 64 value columns at a time.
  for (int v0 = 0; v0 < V; v0 += 64) {
    const int w = min(64, V - v0);
    __syncthreads();
    for_rows8(v + (row0 * HV + hv) * V + v0, (size_t)HV * V, CH, L, w, 64, to_tile(Vh, Vl, TP));
    __syncthreads();
    for (int t = warp; t < 16; t += 8) {
      const int rt = t / 4, ct = t % 4;
      if (ct * 16 >= w) continue;
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk <= rt; ++kk)
        mma_split<FragA, FragB>(acc, T2h + rt * 16 * TP + kk * 16, T2l + rt * 16 * TP + kk * 16, TP,
                                Vh + kk * 16 * TP + ct * 16, LO ? Vl + kk * 16 * TP + ct * 16 : nullptr, TP);
      store_tile(stage, acc, U + (row0 * HV + hv) * V + v0, (size_t)HV * V, L, rt * 16, ct * 16, w);
    }
  }
}

template <typename TI, int BV>
__device__ void chunk_tc_state(const TI* __restrict__ q, const TI* __restrict__ k, const float* __restrict__ W,
                               const float* __restrict__ U, const float* __restrict__ P, const float* __restrict__ Gin,
                               float* __restrict__ states, const int* __restrict__ cu, const int* __restrict__ slots,
                               float* __restrict__ o, int H, int HV, int K, int V, float scale) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr int SP = BV + 4;  // fp32 [.., BV] tiles, padded
  constexpr int SB = BV + 8;  // bf16 [.., BV] tiles, padded
  constexpr int NT = BV / 16;
  const int K16 = round16(K), KP = K16 + 8;
  Smem sm{smem_raw};
  float* Sf = sm.take<float>(K16 * SP);
  bf16* Sh = sm.take<bf16>(K16 * SB);
  bf16* Sl = sm.take<bf16>(K16 * SB);
  bf16* Wh = sm.take<bf16>(CH * KP);  // W hi, then e^{G_last − G} ⊙ K
  bf16* Wl = sm.take<bf16>(CH * KP);
  constexpr bool LO = Split<TI>::value;
  bf16* Qh = sm.take<bf16>(CH * KP);
  bf16* Ql = LO ? sm.take<bf16>(CH * KP) : nullptr;
  bf16* Ph = sm.take<bf16>(CH * TP);
  bf16* Pl = sm.take<bf16>(CH * TP);
  float* C1 = sm.take<float>(CH * SP);
  float* C2 = sm.take<float>(CH * SP);
  bf16* Vh = sm.take<bf16>(CH * SB);
  bf16* Vl = sm.take<bf16>(CH * SB);
  float* G = sm.take<float>(CH);

  const int hv = blockIdx.y, seq = blockIdx.z, v0 = blockIdx.x * BV;
  const int hk = hv / (HV / H);
  const int tid = threadIdx.x, warp = tid >> 5;
  const int vw = min(BV, V - v0);
  float* Sg = states + ((size_t)slots[seq] * HV + hv) * K * V + v0;
  for_rows8(Sg, (size_t)V, K16, K, vw, BV, [&](int r, int cc, const float* x) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      Sf[r * SP + cc + e] = x[e];
      split(x[e], Sh[r * SB + cc + e], Sl[r * SB + cc + e]);
    }
  });
  const int t_begin = cu[seq], t_end = cu[seq + 1];
  for (int t0 = t_begin; t0 < t_end; t0 += CH) {
    const int L = min(CH, t_end - t0);
    const size_t row0 = t0;
    __syncthreads();
    for_rows8(W + (row0 * HV + hv) * K, (size_t)HV * K, CH, L, K, K16, to_tile(Wh, Wl, KP));
    for_rows8(q + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, to_tile(Qh, Ql, KP));
    for_rows8(P + (row0 * HV + hv) * CH, (size_t)HV * CH, CH, L, CH, CH, to_tile(Ph, Pl, TP));
    if (tid < CH) G[tid] = Gin[(row0 + min(tid, L - 1)) * HV + hv];
    __syncthreads();

    // C1 = W S (warps 0–3), C2 = Q S (warps 4–7); a warp owns one 16-row band.
    {
      const int m = warp / 4, rt = warp % 4;
      FragC acc[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) wmma::fill_fragment(acc[j], 0.0f);
      for (int kk = 0; kk < K16; kk += 16) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (m)
            mma_split<FragA, FragB>(acc[j], Qh + rt * 16 * KP + kk, LO ? Ql + rt * 16 * KP + kk : nullptr, KP, Sh + kk * SB + j * 16,
                                    Sl + kk * SB + j * 16, SB);
          else
            mma_split<FragA, FragB>(acc[j], Wh + rt * 16 * KP + kk, Wl + rt * 16 * KP + kk, KP, Sh + kk * SB + j * 16,
                                    Sl + kk * SB + j * 16, SB);
        }
      }
#pragma unroll
      for (int j = 0; j < NT; ++j)
        wmma::store_matrix_sync((m ? C2 : C1) + rt * 16 * SP + j * 16, acc[j], SP, wmma::mem_row_major);
    }
    __syncthreads();

    // V' = U − W S; then Wh/Wl take e^{G_last − G} ⊙ K.
    for_rows8(U + (row0 * HV + hv) * V + v0, (size_t)HV * V, CH, L, vw, BV, [&](int r, int cc, const float* x) {
#pragma unroll
      for (int e = 0; e < 8; ++e) split(r < L ? x[e] - C1[r * SP + cc + e] : 0.0f, Vh[r * SB + cc + e], Vl[r * SB + cc + e]);
    });
    const float g_last = G[CH - 1];
    for_rows8(k + (row0 * H + hk) * K, (size_t)H * K, CH, L, K, K16, [&](int r, int cc, const float* x) {
      const float d = __expf(g_last - G[r]);
#pragma unroll
      for (int e = 0; e < 8; ++e) split(x[e] * d, Wh[r * KP + cc + e], Wl[r * KP + cc + e]);
    });
    __syncthreads();

    // C1 = P V' (P lower triangular), and S ← e^{G_last} S + Kdᵀ V'.
    for (int t = warp; t < 4 * NT; t += 8) {
      const int rt = t / NT, ct = t % NT;
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk <= rt; ++kk)
        mma_split<FragA, FragB>(acc, Ph + rt * 16 * TP + kk * 16, Pl + rt * 16 * TP + kk * 16, TP, Vh + kk * 16 * SB + ct * 16,
                                Vl + kk * 16 * SB + ct * 16, SB);
      wmma::store_matrix_sync(C1 + rt * 16 * SP + ct * 16, acc, SP, wmma::mem_row_major);
    }
    const float el = __expf(g_last);
    for (int t = warp; t < (K16 / 16) * NT; t += 8) {
      const int xt = t / NT, ct = t % NT;
      FragC acc;
      wmma::load_matrix_sync(acc, Sf + xt * 16 * SP + ct * 16, SP, wmma::mem_row_major);
#pragma unroll
      for (int e = 0; e < acc.num_elements; ++e) acc.x[e] *= el;
      for (int kk = 0; kk < CH; kk += 16)
        mma_split<FragAT, FragB>(acc, Wh + kk * KP + xt * 16, Wl + kk * KP + xt * 16, KP, Vh + kk * SB + ct * 16, Vl + kk * SB + ct * 16,
                                 SB);
      wmma::store_matrix_sync(Sf + xt * 16 * SP + ct * 16, acc, SP, wmma::mem_row_major);
    }
    __syncthreads();

    for (int i = tid; i < CH * BV; i += THREADS) {
      const int r = i / BV, cc = i % BV;
      if (r < L && cc < vw)
        o[((row0 + r) * HV + hv) * V + v0 + cc] = scale * (__expf(G[r]) * C2[r * SP + cc] + C1[r * SP + cc]);
    }
    for (int i = tid; i < K16 * BV; i += THREADS) {
      const int r = i / BV, cc = i % BV;
      split(Sf[r * SP + cc], Sh[r * SB + cc], Sl[r * SB + cc]);
    }
  }
  __syncthreads();
  for (int i = tid; i < K * BV; i += THREADS) {
    const int r = i / BV, cc = i % BV;
    if (cc < vw) Sg[(size_t)r * V + cc] = Sf[r * SP + cc];
  }
}

#define PREP_ENTRY(NAME, TI)                                                                                         \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
      NAME(const TI* q, const TI* k, const TI* v, const float* beta, const float* g, const int* crow, const int* clen, \
           float* W, float* U, float* P, float* Gout, int H, int HV, int K, int V) {                                   \
    chunk_tc_prep<TI>(q, k, v, beta, g, crow, clen, W, U, P, Gout, H, HV, K, V);                                      \
  }
PREP_ENTRY(chunk_tc_prep_bf16, bf16)
PREP_ENTRY(chunk_tc_prep_f32, float)

#define STATE_ENTRY(NAME, TI, BVV)                                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
      NAME(const TI* q, const TI* k, const float* W, const float* U, const float* P, const float* G, float* states,  \
           const int* cu, const int* slots, float* o, int H, int HV, int K, int V, float scale) {                     \
    chunk_tc_state<TI, BVV>(q, k, W, U, P, G, states, cu, slots, o, H, HV, K, V, scale);                            \
  }
STATE_ENTRY(chunk_tc_state_bf16_bv64, bf16, 64)
STATE_ENTRY(chunk_tc_state_bf16_bv32, bf16, 32)
STATE_ENTRY(chunk_tc_state_bf16_bv16, bf16, 16)
STATE_ENTRY(chunk_tc_state_f32_bv64, float, 64)
STATE_ENTRY(chunk_tc_state_f32_bv32, float, 32)
STATE_ENTRY(chunk_tc_state_f32_bv16, float, 16)
