// Token bitmask for structured outputs: every logit of a constrained row whose bit is clear
// becomes -inf (a grammar's allowed tokens, 32 a word, lowest bit first; tokens past the mask
// are disallowed). Out of place: `out` is a copy of `logits` with the masked rows masked.
#include <math.h>

extern "C" __global__ void token_bitmask_f32(const float* logits, float* out, const unsigned* mask_rows,
                                             const unsigned* masks, int constrained, int rows, int words, int vocab) {
  // blockIdx.y: output row; the row is masked when it is one of `mask_rows` (few: searched).
  const int row = blockIdx.y;
  int m = -1;
  for (int r = 0; r < constrained; r++) {
    if ((int)mask_rows[r] == row) m = r;
  }
  const float* in = logits + (long)row * vocab;
  float* o = out + (long)row * vocab;
  const unsigned* bits = m >= 0 ? masks + (long)m * words : nullptr;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vocab; i += gridDim.x * blockDim.x) {
    float v = in[i];
    if (bits != nullptr) {
      const int w = i >> 5;
      const unsigned word = w < words ? bits[w] : 0u;
      if (!((word >> (i & 31)) & 1u)) v = -INFINITY;
    }
    o[i] = v;
  }
}
