// What the paged-attention kernels share (attention.cu: append, rows, combine;
// attention_tiles.cu: prefill on the tensor cores): where a key position's row lies in a cache
// buffer of blocks [block_size, HKV, hd], found through the sequence's row of the block table.
#pragma once
#include <cstddef>

// Offset (in elements) of key position `pos`'s [HKV, hd] row in a cache buffer.
__device__ __forceinline__ size_t kv_offset(const int* __restrict__ table, int pos, int bs, int row) {
  return ((size_t)table[pos / bs] * bs + pos % bs) * row;
}
