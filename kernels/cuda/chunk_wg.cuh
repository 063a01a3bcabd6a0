// Launch 2 of the chunked prefill for bf16 inputs with K ≤ 128 on Hopper's warpgroup tensor
// cores (wgmma); chunk_mma.cuh's mma.sync pass takes f32 inputs, K > 128 and unaligned rows.
// One warpgroup (128 threads) per (sequence, value head, 64-column value tile) keeps the state
// transposed, Sᵀ [value columns, keys], in fp32 accumulator registers, and walks the chunks:
//   Zᵀ = Sᵀ Kᵀ, Yᵀ = Sᵀ Qᵀ                       A: Sᵀ rounded to bf16, from registers
//   Rᵀ = Vᵀ − Zᵀ e^G                               V transposed by ldmatrix from shared memory
//   V'ᵀ = Rᵀ T2ᵀ                                   B: T2's rows, K-major as they lie
//   Oᵀ = scale (Yᵀ e^G + V'ᵀ Pᵀ)                  B: P's rows
//   Sᵀ ← e^{G_last} Sᵀ + (V'ᵀ e^{G_last − G}) K   B: the key tile read MN-major
// Transposed, every product's A operand is a previous product's accumulator (rounded to bf16)
// and every B operand a tile as it arrives: nothing goes through shared memory between the
// products, and no warp loads an operand but V. Tiles come by cp.async in the 128-byte swizzle
// wgmma reads (see chunk_wg_state for which arrive when); O leaves through shared memory.
//
// Rounding: Sᵀ, R and V' are rounded to bf16 as the mma.sync pass rounds them; the state update
// takes bf16(V' e^{G_last − G}) where that pass takes bf16(e^{G_last − G} K) (fla rounds as here).
#pragma once
#include "chunk_mma.cuh"  // ldsm4_t, pack_bf16, the tile helpers
#include "wgmma.cuh"

#define WG_THREADS 128
#define WG_VP 72  // V tile's row pitch (padded: ldmatrix reads it, not wgmma)

// The products: A from registers (four bf16 pairs a thread, the mma.sync A layout), B by its
// descriptor, d accumulated unless `acc` is 0; the register lists are written out, since an asm
// string cannot compute them.
// d[64, 64] (+)= a[64, 16] · B[16, 64]: a from registers, B K-major in shared memory.
__device__ __forceinline__ void wg_rs_n64(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
// d[64, 64] (+)= a[64, 16] · B[16, 64]: a from registers, B MN-major in shared memory.
__device__ __forceinline__ void wg_rs_n64_tb(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
// d[64, 128] (+)= a[64, 16] · B[16, 128]: a from registers, B MN-major in shared memory.
__device__ __forceinline__ void wg_rs_n128_tb(float (&d)[64], const unsigned (&a)[4], unsigned long long b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

// The thread's index read anew (volatile): address arithmetic from it is redone where used rather
// than hoisted out of the chunk loop into registers the state needs.
__device__ __forceinline__ int wg_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// A [64, 64·ATOMS] bf16 tile of rows src + r·stride (16-byte aligned; zeros in rows ≥ L and
// columns ≥ W, W a multiple of 8) into 128-byte swizzle atoms 8192 bytes apart. A thread keeps
// one 16-byte column piece and walks rows 128 / PR apart: up to two atoms every row it visits
// has the same swizzle phase, so a copy is a pointer add and an immediate shared-memory offset
// (four atoms, K = 256: rows 4 apart, two phases alternating). The warpgroup's threads are
// TB .. TB + 127.
template <int ATOMS, int TB = 0>
__device__ __forceinline__ void wg_tile(unsigned dst, const bf16* src, size_t stride, int L, int W) {
  constexpr int PR = 8 * ATOMS, RS = WG_THREADS / PR;  // 16-byte pieces a row; rows a step
  const int tid = wg_tid() - TB, cc = tid % PR, r0 = tid / PR;
  const unsigned d = dst + (cc >> 3) * 8192 + wg_swz(r0, cc & 7);
  const unsigned d4 = dst + (cc >> 3) * 8192 + wg_swz(r0 + 4, cc & 7) - 4 * 128;  // RS = 4: odd steps
  const bf16* p = src + (size_t)r0 * stride + cc * 8;
  const bool cok = cc * 8 < W;
#pragma unroll
  for (int j = 0; j < 64 / RS; ++j) {
    const bool ok = cok && r0 + j * RS < L;
    const unsigned at = (RS % 8 == 0 || j % 2 == 0 ? d : d4) + j * RS * 128;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(ok ? p : src), "r"(ok ? 16 : 0)
                 : "memory");
    p += RS * stride;
  }
}

// V's [64, 64] tile of rows vr + r·ldv (zeros past L rows and vw columns) into Vt (pitch WG_VP),
// and G of rows g + r·HV (the last row's past L) into Gt, by the warpgroup's threads TB .. TB + 127.
__device__ __forceinline__ void wg_tile_v(bf16* Vt, float* Gt, const bf16* vr, long ldv, const float* g, int HV, int L,
                                          int vw, int TB) {
  const int vt = wg_tid() - TB, vc = (vt & 7) * 8, vr0 = vt >> 3;
  const bf16* vp0 = vr + (size_t)vr0 * ldv + vc;
  bf16* vd0 = Vt + vr0 * WG_VP + vc;
#pragma unroll
  for (int j = 0; j < 64 / 16; ++j) {
    const bool ok = vc < vw && vr0 + 16 * j < L;
    cp_async16(vd0 + 16 * j * WG_VP, ok ? vp0 : vr, ok);
    vp0 += 16 * ldv;
  }
  if (vt < 64) cp_async4(Gt + vt, g + (size_t)min(vt, L - 1) * HV);
}

// Four accumulators' pairs (16 columns: n8 blocks 2kk and 2kk + 1) as an A fragment in bf16.
__device__ __forceinline__ void wg_to_a(unsigned (&a)[4], const float* d, int kk) {
  const float* x = d + 8 * kk;
  a[0] = pack_bf16(x[0], x[1]);
  a[1] = pack_bf16(x[2], x[3]);
  a[2] = pack_bf16(x[4], x[5]);
  a[3] = pack_bf16(x[6], x[7]);
}

// Per-phase clocks of one warpgroup (the first CTA's thread 0), summed over its chunks, when
// WG_PROFILE is defined (the probe's timing of where a chunk's time goes).
#ifdef WG_PROFILE
__device__ unsigned long long wg_prof[8];
#define WG_MARK(i)                                                         \
  do {                                                                     \
    if (prof_on) {                                                         \
      const long long now_ = clock64();                                    \
      atomicAdd(&wg_prof[i], (unsigned long long)(now_ - prof_t));         \
      prof_t = now_;                                                       \
    }                                                                      \
  } while (0)
// Each CTA's start and end (globaltimer, ns) by its thread 0, CTAs 0 .. 4095.
__device__ unsigned long long wg_cta_ns[4096][2];
#define WG_CTA_MARK(e)                                                                   \
  do {                                                                                   \
    const unsigned cta_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); \
    if (threadIdx.x == 0 && cta_ < 4096) {                                               \
      unsigned long long t_;                                                             \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                             \
      wg_cta_ns[cta_][e] = t_;                                                           \
    }                                                                                    \
  } while (0)
#else
#define WG_MARK(i)
#define WG_CTA_MARK(e)
#endif

// The state passes' shared memory from the dynamic allocation's 1024-aligned start: two buffers
// each of the key and Q tiles (K padded to 16·KT, 128-byte swizzled), one each of T2 and P, two
// each of V (pitch WG_VP) and G, then each pass's own. Addresses are computed from a buffer's
// index rather than indexed, which would put them in local memory.
template <int KT>
struct WgTiles {
  static constexpr int KBYTES = 64 * 16 * KT * 2, PBYTES = 64 * 64 * 2, VBYTES = 64 * WG_VP * 2;
  unsigned base;
  unsigned char* smem;
  __device__ explicit WgTiles(unsigned char* raw) {
    const unsigned a = smem_addr(raw);
    base = (a + 1023u) & ~1023u;
    smem = raw + (base - a);
  }
  __device__ unsigned k(int b) const { return base + b * KBYTES; }
  __device__ unsigned q(int b) const { return base + (2 + b) * KBYTES; }
  __device__ unsigned t2() const { return base + 4 * KBYTES; }
  __device__ unsigned p() const { return t2() + PBYTES; }
  __device__ bf16* v(int b) const { return reinterpret_cast<bf16*>(smem + 4 * KBYTES + 2 * PBYTES + b * VBYTES); }
  __device__ float* g(int b) const {
    return reinterpret_cast<float*>(smem + 4 * KBYTES + 2 * PBYTES + 2 * VBYTES + b * 256);
  }
  // The Q buffer as O's staging tile at K = 128, once Y is formed.
  __device__ bf16* qo(int b) const { return reinterpret_cast<bf16*>(smem + (q(b) - base)); }
  // Past the shared tiles: each pass's own.
  __device__ unsigned char* rest() const { return smem + 4 * KBYTES + 2 * PBYTES + 2 * VBYTES + 512; }
};

// A chunk's steps, shared by the one-warpgroup pass below and the two-warpgroup pass
// (chunk_wg_ws.cuh). A consumer thread is thread tid < 128 of its warpgroup: lane, warp, g8 =
// lane / 4 and t4 = lane % 4 as usual. Sᵀ: n8 block j, entry e is value column
// n = 16·warp + g8 + 8·(e / 2), key kc = 8j + 2·t4 + e % 2.
__device__ __forceinline__ void wg_s_at(int i, int warp, int g8, int t4, int& n, int& kc) {
  n = 16 * warp + g8 + 8 * ((i & 3) >> 1);
  kc = 8 * (i >> 2) + 2 * t4 + (i & 1);
}
// This thread's part of Sᵀ from the state's columns v0 .. v0 + vw (Sg points at column v0).
template <int NS, typename TS>
__device__ __forceinline__ void wg_load_s(float (&s)[NS], const TS* Sg, int vw, int K, int V, int warp, int g8, int t4) {
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    int n, kc;
    wg_s_at(i, warp, g8, t4, n, kc);
    float x[1] = {0.0f};
    if (n < vw && kc < K) state_load<1, false>(x, Sg + (size_t)kc * V + n);
    s[i] = x[0];
  }
}
template <int NS, typename TS>
__device__ __forceinline__ void wg_store_s(const float (&s)[NS], TS* dst, int vw, int K, int V, int warp, int g8, int t4) {
  // An opaque zero: the stores' addresses are formed here, not kept in registers from the
  // loads' across the whole pass.
  size_t zero;
  asm volatile("mov.u64 %0, 0;" : "=l"(zero));
  dst += zero;
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    int n, kc;
    wg_s_at(i, warp, g8, t4, n, kc);
    if (n < vw && kc < K) state_store<1, false>(dst + (size_t)kc * V + n, {s[i]});
  }
}
// Zᵀ = Sᵀ Kᵀ and Yᵀ = Sᵀ Qᵀ from Sᵀ in bf16, issued as two commit groups (Z, then Y); Kt and Qt
// are the chunk's key and Q tiles, atoms of 64 keys 8192 bytes apart.
template <int KS, int NS>
__device__ __forceinline__ void wg_issue_zy(float (&z)[32], float (&y)[32], const float (&s)[NS], unsigned Kt, unsigned Qt) {
  unsigned sa[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) wg_to_a(sa[kk], s, kk);
  wg_regs(sa);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) wg_rs_n64(z, sa[kk], wg_desc_k(Kt + (kk >> 2) * 8192 + (kk & 3) * 32), kk > 0);
  wg_commit();
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) wg_rs_n64(y, sa[kk], wg_desc_k(Qt + (kk >> 2) * 8192 + (kk & 3) * 32), kk > 0);
  wg_commit();
}
// A thread's decays of columns c = 8j + 2·t4 + e, in pairs (Eg: e^G, Dk: e^{G_last − G}).
__device__ __forceinline__ float2 wg_pair(const float* d, int j, int t4) {
  return *reinterpret_cast<const float2*>(d + 8 * j + 2 * t4);
}
// Rᵀ = Vᵀ − Zᵀ e^G as A fragments: ldmatrix.trans of V's rows (Vt, pitch WG_VP) gives Vᵀ in the
// A layout.
__device__ __forceinline__ void wg_form_r(unsigned (&ra)[4][4], const float (&z)[32], const bf16* Vt, const float* Eg,
                                          int lane, int warp, int t4) {
  const int mx = lane >> 3;
  const bf16* vb = Vt + ((mx >> 1) * 8 + (lane & 7)) * WG_VP + 16 * warp + (mx & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    unsigned vf[4];
    ldsm4_t(vf, vb + kk * 16 * WG_VP);
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      // Fragment register h: n8 block 2kk + h / 2, rows g8 (+ 8 for odd h).
      const int jb = 2 * kk + (h >> 1), zi = jb * 4 + (h & 1) * 2;
      const float2 vv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vf[h]));
      const float2 e = wg_pair(Eg, jb, t4);
      ra[kk][h] = pack_bf16(vv.x - e.x * z[zi], vv.y - e.y * z[zi + 1]);
    }
  }
}
// V'ᵀ = Rᵀ T2ᵀ, one commit group (T2t: T2's tile).
__device__ __forceinline__ void wg_issue_vp(float (&vp)[32], unsigned (&ra)[4][4], unsigned T2t) {
  wg_regs(ra);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wg_rs_n64(vp, ra[kk], wg_desc_k(T2t + kk * 32), kk > 0);
  wg_commit();
}
// Oᵀ = Yᵀ e^G + V'ᵀ Pᵀ (scaled when stored), then Sᵀ ← e^{G_last} Sᵀ + (V'ᵀ e^{G_last − G}) K:
// two commit groups (O, then the state update, which reads the key tile Kt MN-major). Without
// `WITH_O` only the state update, one commit group (a warpgroup that holds part of Sᵀ's keys
// and leaves O to another: chunk_wg_split.cuh).
template <int KT, int NS, bool WITH_O = true>
__device__ __forceinline__ void wg_issue_os(float (&y)[32], float (&s)[NS], const float (&vp)[32], const float* Eg,
                                            const float* Dk, unsigned Pt, unsigned Kt, int t4) {
  unsigned va[4][4], vd[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (WITH_O) wg_to_a(va[kk], vp, kk);
    float w[8];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float2 d = wg_pair(Dk, 2 * kk + hh, t4);
#pragma unroll
      for (int e = 0; e < 4; ++e) w[4 * hh + e] = vp[8 * kk + 4 * hh + e] * ((e & 1) ? d.y : d.x);
    }
    wg_to_a(vd[kk], w, 0);
  }
  if constexpr (WITH_O) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 e = wg_pair(Eg, j, t4);
      y[4 * j] *= e.x, y[4 * j + 1] *= e.y, y[4 * j + 2] *= e.x, y[4 * j + 3] *= e.y;
    }
  }
  const float el = Eg[63];
#pragma unroll
  for (int i = 0; i < NS; ++i) s[i] *= el;
  if constexpr (WITH_O) wg_regs(va);
  wg_regs(vd);
  if constexpr (WITH_O) wg_regs(y);
  wg_regs(s);
  wg_fence();
  if constexpr (WITH_O) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wg_rs_n64(y, va[kk], wg_desc_k(Pt + kk * 32), 1);
    wg_commit();
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (KT == 8) {
      wg_rs_n128_tb(s, vd[kk], wg_desc_mn(Kt + kk * 2048), 1);
    } else {
      wg_rs_n64_tb(s, vd[kk], wg_desc_mn(Kt + kk * 2048), 1);
    }
  }
  wg_commit();
}
// O into its staging tile ost [64 tokens, 64 columns], rounded once to bf16 (fla's output dtype for
// bf16 inputs): the column index XOR-ed by the row's pair index (c / 2 mod 4) · 8 keeps a warp's
// transposed writes on 16 distinct words, two lanes a word.
__device__ __forceinline__ void wg_stage_o(bf16* ost, const float (&y)[32], float scale, int warp, int g8, int t4) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int n = 16 * warp + g8 + 8 * ((i & 3) >> 1), c = 8 * (i >> 2) + 2 * t4 + (i & 1);
    ost[c * 64 + (n ^ (((c >> 1) & 3) << 3))] = __float2bfloat16_rn(scale * y[i]);
  }
}
// The staged O of rows t0 .. t0 + L out to o [rows, HV, V] (bf16) at columns v0 .. v0 + vw, each
// row's 128 bytes in 16-byte stores of eight columns, by the warpgroup's threads ot = 0 .. 127.
__device__ __forceinline__ void wg_store_o(const bf16* ost, bf16* o, int t0, int L, int hv, int HV, int V, int v0,
                                           int vw, int ot) {
  const int col = (ot & 7) * 8, c0 = ot >> 3;
  bf16* orow = o + ((size_t)(t0 + c0) * HV + hv) * V + v0 + col;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = c0 + 16 * j;
    const uint4 x = *reinterpret_cast<const uint4*>(ost + c * 64 + (col ^ (((c >> 1) & 3) << 3)));
    if (c < L && col < vw) *reinterpret_cast<uint4*>(orow) = x;
    orow += (size_t)16 * HV * V;
  }
}

// The state pass: grid (⌈V / 64⌉, HV, sequences), WG_THREADS threads, wg_state_smem(KT) bytes of
// dynamic shared memory. Inputs as chunk_mma_state's bf16 ones (q, k [rows, H, K], v's rows ldv
// apart, T2 and P [rows, HV, 64], G [rows, HV]); K, V and ldv multiples of 8, q, k, v, T2 and P
// 16-byte aligned.
//
// Buffers: the keys, Q, V and G of the next chunk arrive a whole chunk ahead (two of each); T2
// and P (one each) are copied for the next chunk once this one's V' and O are formed. cp.async
// groups, committed every chunk even when empty so that their count is fixed: A (keys, Q, V,
// G) at the top, T2 after V', P after O; each wait lets the two groups after it stay in flight.
template <int KT, typename TS>
__device__ void chunk_wg_state(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                               long ldv, const bf16* __restrict__ T2, const bf16* __restrict__ P,
                               const float* __restrict__ G, TS* __restrict__ states, const int* __restrict__ cu,
                               const int* __restrict__ slots, const int* __restrict__ snap, int has_snap,
                               bf16* __restrict__ o, int H, int HV, int K, int V, float scale) {
  static_assert(KT == 4 || KT == 8, "K up to 128: Sᵀ's accumulators are 2·KT·4 registers a thread");
  constexpr int K16 = 16 * KT, ATOMS = K16 / 64, NS = K16 / 8 * 4, KS = K16 / 16;
  extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
  const WgTiles<KT> tl(wg_smem_raw);

  const int hv = blockIdx.y, seq = blockIdx.z, v0 = blockIdx.x * 64;
  const int hk = hv / (HV / H);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
  // Each warp's own copy of the chunk's decays e^G and e^{G_last − G} (two per lane, no barrier).
  float* Eg = reinterpret_cast<float*>(tl.rest()) + warp * 128;
  float* Dk = Eg + 64;
  // K = 64: O's staging tile (K = 128 stages it in the chunk's Q buffer).
  bf16* Ostage = reinterpret_cast<bf16*>(tl.rest() + 4 * 512);
  const int vw = min(64, V - v0);
  TS* Sg = states + ((size_t)slots[seq] * HV + hv) * K * V + v0;
  WG_CTA_MARK(0);
#ifdef WG_PROFILE
  const bool prof_on = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0;
  long long prof_t = clock64();
#endif

  float s[NS];
  wg_load_s(s, Sg, vw, K, V, warp, g8, t4);
  pdl_entry();

  const int t_begin = cu[seq], t_end = cu[seq + 1];
  auto load_a = [&](int t0, int L, int b) {  // the keys, Q, V and G of rows t0 ..
    wg_tile<ATOMS>(tl.k(b), k + ((size_t)t0 * H + hk) * K, (size_t)H * K, L, K);
    wg_tile<ATOMS>(tl.q(b), q + ((size_t)t0 * H + hk) * K, (size_t)H * K, L, K);
    wg_tile_v(tl.v(b), tl.g(b), v + (size_t)t0 * ldv + (size_t)hv * V + v0, ldv, G + (size_t)t0 * HV + hv, HV, L, vw, 0);
  };
  auto load_t2 = [&](int t0, int L) { wg_tile<1>(tl.t2(), T2 + ((size_t)t0 * HV + hv) * 64, (size_t)HV * 64, L, 64); };
  auto load_p = [&](int t0, int L) { wg_tile<1>(tl.p(), P + ((size_t)t0 * HV + hv) * 64, (size_t)HV * 64, L, 64); };
  // Every thread's copies into shared memory visible to every warp's wgmma.
  auto arrived = [&]() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  };
  if (t_begin < t_end) {
    const int L = min(64, t_end - t_begin);
    load_a(t_begin, L, 0);
    load_t2(t_begin, L);
    load_p(t_begin, L);
  }
  cp_async_commit();
  cp_async_commit();  // the first chunk's T2 and P came with its A group
  cp_async_commit();

  for (int t0 = t_begin, b = 0; t0 < t_end; t0 += 64, b ^= 1) {
    const int L = min(64, t_end - t0);
    const bool more = t0 + 64 < t_end;
    const int L1 = more ? min(64, t_end - (t0 + 64)) : 0;
    WG_MARK(0);
    cp_async_wait<2>();  // A; this chunk's T2 and P may still be in flight
    arrived();
    // The previous chunk's state update ran through the wait and the barrier.
    wg_wait<0>();
    wg_regs(s);
    WG_MARK(1);

    float z[32], y[32];
    wg_issue_zy<KS>(z, y, s, tl.k(b), tl.q(b));
    // While they run: the next chunk's A group (its buffers were last read by the previous
    // chunk, complete before the barrier above) and this warp's decays.
    if (more) load_a(t0 + 64, L1, b ^ 1);
    cp_async_commit();
    const float* Gc = tl.g(b);
    const float g_last = Gc[63];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float g = Gc[lane + 32 * h];
      Eg[lane + 32 * h] = __expf(g);
      Dk[lane + 32 * h] = __expf(g_last - g);
    }
    __syncwarp();
    WG_MARK(2);

    wg_wait<1>();
    wg_regs(z);
    WG_MARK(3);
    unsigned ra[4][4];
    wg_form_r(ra, z, tl.v(b), Eg, lane, warp, t4);
    cp_async_wait<2>();  // T2
    arrived();
    WG_MARK(4);

    float vp[32];
    wg_issue_vp(vp, ra, tl.t2());
    wg_wait<0>();  // V', and Y before it
    wg_regs(vp);
    wg_regs(y);
    cp_async_wait<1>();  // P (the next chunk's A group, committed after it, may stay in flight)
    arrived();           // and every warp's V' is formed: T2's buffer is free
    if (more) load_t2(t0 + 64, L1);
    cp_async_commit();
    WG_MARK(5);

    wg_issue_os<KT>(y, s, vp, Eg, Dk, tl.p(), tl.k(b), t4);
    wg_wait<1>();
    wg_regs(y);
    WG_MARK(6);
    __syncthreads();  // every warp's O is formed: P's buffer is free
    if (more) load_p(t0 + 64, L1);
    cp_async_commit();
    // O through shared memory (this chunk's Q buffer, free since Y was formed; its own buffer at
    // K = 64), so that each row goes out in 16-byte stores.
    bf16* ost = KT == 8 ? tl.qo(b) : Ostage;
    wg_stage_o(ost, y, scale, warp, g8, t4);
    __syncthreads();
    wg_store_o(ost, o, t0, L, hv, HV, V, v0, vw, wg_tid());
    WG_MARK(7);
    const int d = has_snap ? snap[t0] : 0;
    if (d > 0) {
      wg_wait<0>();
      wg_regs(s);
      wg_store_s(s, states + ((size_t)(d - 1) * HV + hv) * K * V + v0, vw, K, V, warp, g8, t4);
    }
  }
  wg_wait<0>();
  wg_regs(s);
  cp_async_wait<0>();
  wg_store_s(s, Sg, vw, K, V, warp, g8, t4);
  WG_CTA_MARK(1);
}

// Shared memory of chunk_wg_state<KT> (or with `two`, chunk_wg_state_ws<KT>): WgTiles' two
// buffers each of the keys, Q, V and G and one each of T2 and P; the decays (each warp's copy, or
// one a buffer); O's staging tile at K = 64 (one, or two; K = 128 stages O in the chunk's Q
// buffer); the swizzle's alignment.
__host__ __device__ constexpr int wg_state_smem(int KT, bool two = false) {
  return 4 * (64 * 16 * KT * 2) + 2 * (64 * 64 * 2) + 2 * (64 * WG_VP * 2) + 512 + (two ? 2 : 4) * 512 +
         (KT == 8 ? 0 : (two ? 2 : 1) * 64 * 64 * 2) + 1024;
}
