// Asynchronous copies global → shared (sm_80+), for kernels that stage tiles in shared memory.
#pragma once
#include <stdint.h>

// 16 bytes global → shared without passing through registers; zeros when !ok. The "memory"
// clobbers keep the compiler from moving shared-memory accesses across the copies.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
