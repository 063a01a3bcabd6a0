// Launch 1 of the chunked prefill for bf16 inputs with K ≤ 256 on Hopper's warpgroup tensor
// cores: chunk_prep.cu's bf16 prep (T2 = (I + A)⁻¹ diag(β) and P, model-spec.md §3.5) with its
// two Gram products as wgmma from the 128-byte-swizzled tiles the state pass also reads, and the
// decays and masks applied in the accumulators' registers. One warpgroup per (chunk, value head):
//   K Kᵀ, Q Kᵀ                      wgmma, both operands K-major in shared memory
//   A = β_i (k_i·k_j) e^{G_i−G_j}   (j < i), P = (q_i·k_j) e^{G_i−G_j} (j ≤ i), in registers;
//                                   P goes out from them, A to shared memory (over the tiles)
//   T = (I + A)⁻¹                   chunk_prep.cuh's invert_unit_lower (four warps, as there)
//   T2 = T diag(β)                  out
// Its outputs feed either state pass: chunk_wg.cuh's (K ≤ 128) or chunk_mma.cuh's (K > 128).
// chunk_prep.cu formed the products with wmma from padded tiles and staged both in shared memory,
// its index arithmetic and the decays' loop most of its ~18,000 instructions a (chunk, head); the
// rest of the work, the inversion and the outputs, is the same here.
#pragma once
#include "chunk_prep.cuh"
#include "chunk_wg.cuh"

// d[64, 64] (+)= A[64, 16] · B[16, 64], both K-major in shared memory (by descriptor).
__device__ __forceinline__ void wg_ss_n64(float (&d)[32], unsigned long long a, unsigned long long b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(acc));
}

// The key and query tiles' room, which A and T (fp32, pitch AP) take once the products have read
// the tiles.
__host__ __device__ constexpr int wg_prep_tiles(int KT) {
  return 2 * 64 * 16 * KT * 2 > 2 * 64 * AP * 4 ? 2 * 64 * 16 * KT * 2 : 2 * 64 * AP * 4;
}

// Shared memory of chunk_wg_prep<KT>: the tiles' room, G and β, the swizzle's alignment. 38 KB
// at K ≤ 128 (five CTAs an SM), 66 KB at K = 256 (three).
constexpr int wg_prep_smem(int KT) { return wg_prep_tiles(KT) + 512 + 1024; }

// grid (chunks, HV), WG_THREADS threads, wg_prep_smem(KT) bytes. Inputs and outputs as
// chunk_tc_prep_bf16's: q, k [rows, H, K] (K a multiple of 8, rows 16-byte aligned), β and the
// log-decays g [rows, HV] (g may be null: no decay); T2 and P [rows, HV, 64] in bf16, G [rows, HV].
template <int KT>
__device__ void chunk_wg_prep(const bf16* __restrict__ q, const bf16* __restrict__ k, const float* __restrict__ beta,
                              const float* __restrict__ g, const int* __restrict__ crow, const int* __restrict__ clen,
                              bf16* __restrict__ T2out, bf16* __restrict__ Pout, float* __restrict__ Gout, int H, int HV, int K) {
  static_assert(KT == 4 || KT == 8 || KT == 16, "K up to 256");
  constexpr int K16 = 16 * KT, ATOMS = K16 / 64, KS = K16 / 16, KBYTES = 64 * K16 * 2;
  constexpr int TILES = wg_prep_tiles(KT);
  // An unused entry of a fixed-size chunk table (a pass captured as a CUDA graph).
  if (clen[blockIdx.x] == 0) return;
  extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
  const unsigned raw = smem_addr(wg_smem_raw);
  const unsigned base = (raw + 1023u) & ~1023u;
  unsigned char* smem = wg_smem_raw + (base - raw);
  const unsigned Kb = base, Qb = base + KBYTES;
  float* Af = reinterpret_cast<float*>(smem);
  float* Tf = Af + 64 * AP;
  float* G = reinterpret_cast<float*>(smem + TILES);
  float* Bt = G + 64;

  const int c = blockIdx.x, hv = blockIdx.y;
  const int hk = hv / (HV / H);
  const size_t row0 = crow[c];
  const int L = clen[c];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;

  wg_tile<ATOMS>(Kb, k + (row0 * H + hk) * K, (size_t)H * K, L, K);
  wg_tile<ATOMS>(Qb, q + (row0 * H + hk) * K, (size_t)H * K, L, K);
  cp_async_commit();
  if (warp == 0) scan_decay(g, beta, row0, L, hv, HV, G, Bt, Gout);
  cp_async_wait<0>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  // Accumulator entry 4j + e: row 16·warp + g8 + 8·(e / 2), column 8j + 2·t4 + e % 2.
  float kk[32], qk[32];
  // The descriptors' address field is the byte address / 16: a k-step's offset adds to it.
  const unsigned long long dk = wg_desc_k(Kb), dq = wg_desc_k(Qb);
  wg_fence();
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    const unsigned off = ((s >> 2) * 8192 + (s & 3) * 32) >> 4;
    wg_ss_n64(kk, dk + off, dk + off, s > 0);
  }
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    const unsigned off = ((s >> 2) * 8192 + (s & 3) * 32) >> 4;
    wg_ss_n64(qk, dq + off, dk + off, s > 0);
  }
  wg_commit();
  wg_wait<0>();
  wg_regs(kk);
  wg_regs(qk);
  __syncthreads();  // every warp's products have read the tiles: A and T go over them

  // Decays and masks, the same expressions in the same order as chunk_tc_prep's. Column blocks
  // left of the warp's rows need no mask; those right of them are zeros (no exp).
  const int ir[2] = {16 * warp + g8, 16 * warp + g8 + 8};
  const float gi[2] = {G[ir[0]], G[ir[1]]}, bi[2] = {Bt[ir[0]], Bt[ir[1]]};
  bf16* prow[2] = {Pout + ((row0 + ir[0]) * HV + hv) * 64, Pout + ((row0 + ir[1]) * HV + hv) * 64};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int c0 = 8 * j + 2 * t4;
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f}, p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (j < 2 * warp) {
      const float2 gj = *reinterpret_cast<const float2*>(G + c0);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d = __expf(gi[e >> 1] - ((e & 1) ? gj.y : gj.x));
        a[e] = bi[e >> 1] * kk[4 * j + e] * d;
        p[e] = qk[4 * j + e] * d;
      }
    } else if (j <= 2 * warp + 1) {
      const float2 gj = *reinterpret_cast<const float2*>(G + c0);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, col = c0 + (e & 1), i = ir[r];
        const float d = col <= i ? __expf(gi[r] - ((e & 1) ? gj.y : gj.x)) : 0.0f;
        a[e] = col < i ? bi[r] * kk[4 * j + e] * d : 0.0f;
        p[e] = col <= i ? qk[4 * j + e] * d : 0.0f;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<float2*>(Af + ir[r] * AP + c0) = make_float2(a[2 * r], a[2 * r + 1]);
      if (ir[r] < L) *reinterpret_cast<__nv_bfloat162*>(prow[r] + c0) = __floats2bfloat162_rn(p[2 * r], p[2 * r + 1]);
    }
  }
  __syncthreads();

  invert_unit_lower(Af, Tf, warp);

  // T2 = T diag(β) out, eight columns a group: a thread keeps its columns (and their β) and
  // walks rows 16 apart.
  const int j0 = (tid & 7) * 8;
  float bj[8];
#pragma unroll
  for (int cc = 0; cc < 8; ++cc) bj[cc] = Bt[j0 + cc];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const int i = (tid >> 3) + 16 * n;
    if (i >= L) break;
    float t2[8];
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) t2[cc] = j0 + cc <= i ? Tf[i * AP + j0 + cc] * bj[cc] : 0.0f;
    store8(T2out + ((row0 + i) * HV + hv) * 64 + j0, t2);
  }
}
