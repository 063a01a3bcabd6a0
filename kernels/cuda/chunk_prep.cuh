// The chunk prep's per-chunk pieces that the prep launches share (chunk_prep.cu, and the
// warpgroup prep of chunk_wg_prep.cuh): the decays' scan and the inversion of (I + A).
#pragma once
#include "tc_common.cuh"

// One warp: G = the chunk's inclusive scan of value head hv's log-decay (written to Gout too)
// and Bt its β, rows ≥ L as zeros (G carries the last row's). Lane holds rows 2·lane, 2·lane + 1.
__device__ __forceinline__ void scan_decay(const float* __restrict__ g, const float* __restrict__ beta, size_t row0, int L, int hv,
                                           int HV, float* G, float* Bt, float* __restrict__ Gout) {
  const int lane = threadIdx.x & 31, r = 2 * lane;
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

// T = (I + A)⁻¹ of a strictly lower-triangular fp32 [64, 64] A (pitch AP) into Tf's lower
// triangle, by warps w = 0..3 of the caller's group (w ≥ 4 only keep the barriers); every thread
// of the block calls it. Af's upper blocks serve as scratch.
// Diagonal 16×16 blocks first, warp b for block b, by right-looking elimination in registers:
// lane owns column lane % 16, rows 8·(lane / 16) + [0, 8). After step j, row j is final and
// every later row has subtracted A[i][j]·T[j].
// Then the blocks below the diagonal from the two 32×32 halves, T = [[T₁, 0], [−T₂ A₂₁ T₁, T₂]],
// T₁ = [[T00, 0], [T10, T11]], T₂ = [[T22, 0], [T32, T33]]: three dependent products on the
// critical path (row by row it would be six). Each product runs on the tensor cores in 3×TF32
// (near fp32); intermediate products go to the upper blocks of Af, which nothing reads.
__device__ __forceinline__ void invert_unit_lower(float* Af, float* Tf, int w) {
  const int lane = threadIdx.x & 31;
  if (w < 4) {
    const int b0 = w * 16, col = lane % 16, r0 = (lane / 16) * 8;
    float t[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) t[e] = (r0 + e == col) ? 1.0f : 0.0f;
#pragma unroll
    for (int j = 0; j < 15; ++j) {
      const float tj = __shfl_sync(0xffffffffu, t[j % 8], (j / 8) * 16 + col);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (r0 + e > j) t[e] -= Af[(b0 + r0 + e) * AP + b0 + j] * tj;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) Tf[(b0 + r0 + e) * AP + b0 + col] = t[e];
  }
  __syncthreads();
  auto blk = [](float* m, int i, int j) { return m + i * 16 * AP + j * 16; };
  const auto negate = [](FragC32& f) {
#pragma unroll
    for (int e = 0; e < f.num_elements; ++e) f.x[e] = -f.x[e];
  };
  if (w < 2) {
    // T10 = −T11 A10 T00 (warp 0) and T32 = −T33 A32 T22 (warp 1).
    const int i = 2 * w + 1;
    FragC32 x, t;
    wmma::fill_fragment(x, 0.0f);
    mma_3xtf32(x, blk(Af, i, i - 1), blk(Tf, i - 1, i - 1), AP);
    wmma::store_matrix_sync(blk(Af, i - 1, i), x, AP, wmma::mem_row_major);
    __syncwarp();  // this warp's own scratch block: no block-wide barrier
    wmma::fill_fragment(t, 0.0f);
    mma_3xtf32(t, blk(Tf, i, i), blk(Af, i - 1, i), AP);
    negate(t);
    wmma::store_matrix_sync(blk(Tf, i, i - 1), t, AP, wmma::mem_row_major);
  }
  __syncthreads();
  const int bi = 2 + w / 2, bj = w % 2;  // warps 0–3: block (bi, bj) of the lower half
  if (w < 4) {
    // X = A₂₁ T₁, block X_ij stored at (j, i).
    FragC32 x;
    wmma::fill_fragment(x, 0.0f);
    for (int m = bj; m < 2; ++m) mma_3xtf32(x, blk(Af, bi, m), blk(Tf, m, bj), AP);
    wmma::store_matrix_sync(blk(Af, bj, bi), x, AP, wmma::mem_row_major);
  }
  __syncthreads();
  if (w < 4) {
    // T_ij = −Σ_{m=2..i} T_im X_mj.
    FragC32 t;
    wmma::fill_fragment(t, 0.0f);
    for (int m = 2; m <= bi; ++m) mma_3xtf32(t, blk(Tf, bi, m), blk(Af, bj, m), AP);
    negate(t);
    wmma::store_matrix_sync(blk(Tf, bi, bj), t, AP, wmma::mem_row_major);
  }
  __syncthreads();
}
