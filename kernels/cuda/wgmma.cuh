// Hopper's warpgroup tensor cores (wgmma): operand descriptors for tiles in the 128-byte swizzle,
// the fence, commit and wait around asynchronous products, and the mbarriers that hand tiles
// from their copies to the products. Shared by the chunked prefill, prefill attention and the
// skinny GEMM.
#pragma once

// The 16-byte piece c (0..7) of row r of a 128-byte-row swizzle atom (the atom 1024-aligned).
__device__ __forceinline__ unsigned wg_swz(int r, int c) { return (unsigned)(r * 128 + ((c ^ (r & 7)) << 4)); }

// Operand descriptors, 128-byte swizzle, 8-row groups 1024 bytes apart. K-major: a k-step's 16
// columns lie inside one row of an atom (the leading offset unused). MN-major: the tile's atoms
// of 64 MN-columns lie 8192 bytes apart (64 rows of 128 bytes).
__device__ __forceinline__ unsigned long long wg_desc_k(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
         (1ull << 62);
}
__device__ __forceinline__ unsigned long long wg_desc_mn(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(8192 >> 4) << 16) |
         ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving the registers' other uses across an asynchronous multiply.
template <int N>
__device__ __forceinline__ void wg_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void wg_regs(unsigned (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}


// mbarriers in shared memory (their 8 bytes at `a`): initialised for n arrivals; arrived at
// (with `tx`, also expecting that many bytes of copies); waited on until the phase of the given
// parity has completed.
__device__ __forceinline__ void mb_init(unsigned a, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_arrive(unsigned a) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mb_arrive_tx(unsigned a, unsigned tx) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(tx) : "memory");
}
__device__ __forceinline__ void mb_wait(unsigned a, int parity) {
  asm volatile(
      "{\n.reg .pred p;\nMB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MB_WAIT;\n}\n" ::"r"(a),
      "r"(parity)
      : "memory");
}
