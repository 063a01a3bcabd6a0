// Batched sampling: one block per draw, the rule of kernels/src/cpu/sample.rs (its doc says
// why a Gumbel race and thresholds found by bisection). The rules, adjustments and masks come
// in one buffer of 32-bit words (ops/sample.rs packs them); each draw writes OUT_WORDS words:
// status (0 token, 1 non-finite logits, 2 nothing allowed), token (or first non-finite id),
// logprob bits (or the non-finite count), the top count, then (token, logprob) pairs.
#include "common.cuh"
#include <math.h>
#include <limits.h>

#define THREADS 1024
#define MAX_TOP 20
#define RULE_WORDS 13
#define OUT_WORDS (4 + 2 * MAX_TOP)
#define NO_MASK 0xffffffffu
// Tokens a top-p search copies to shared memory at most (16 KB).
#define CANDIDATES 4096

typedef unsigned long long u64;

__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float uniform01(u64 base, unsigned i) {
  const u64 z = mix64(base + ((u64)i + 1ull) * 0x9E3779B97F4A7C15ull);
  return ((float)(unsigned)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// Order-preserving key of a float; 0 marks a token out of the draw.
__device__ __forceinline__ unsigned order_key(float s) {
  if (!isfinite(s)) return 0u;
  const unsigned b = __float_as_uint(s);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Block reductions over THREADS threads in a fixed order (warp shuffles, then one warp over the
// 32 partials); every thread gets the result. `sh` holds 33 values.
struct Add {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const { return a + b; }
};
struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, V* sh, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = sh[lane];
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) sh[32] = v;
  }
  __syncthreads();
  const V r = sh[32];
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_sum(float v, float* sh) { return block_reduce(v, sh, Add{}); }
__device__ __forceinline__ unsigned block_count(unsigned v, unsigned* sh) { return block_reduce(v, sh, Add{}); }
__device__ __forceinline__ float block_max(float v, float* sh) { return block_reduce(v, sh, Max{}); }

// Exclusive prefix sum of `v` over the block in thread order; `total` gets the sum.
__device__ __forceinline__ unsigned block_exclusive_scan(unsigned v, unsigned* sh, unsigned& total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  unsigned inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned up = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += up;
  }
  if (lane == 31) sh[w] = inc;
  __syncthreads();
  if (w == 0) {
    unsigned ws = sh[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned up = __shfl_up_sync(0xffffffffu, ws, o);
      if (lane >= o) ws += up;
    }
    sh[lane] = ws;  // inclusive sums of the warps' totals
  }
  __syncthreads();
  total = sh[31];
  const unsigned before = (w == 0 ? 0u : sh[w - 1]) + inc - v;
  __syncthreads();
  return before;
}

// (value, id) with the larger value winning and the lower id on ties; id INT_MAX = none.
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
  return i != INT_MAX && (bi == INT_MAX || v > bv || (v == bv && i < bi));
}

__device__ __forceinline__ void block_argmax(float& v, int& i, float* shv, int* shi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_down_sync(0xffffffffu, v, o);
    const int oi = __shfl_down_sync(0xffffffffu, i, o);
    if (beats(ov, oi, v, i)) { v = ov; i = oi; }
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) { shv[w] = v; shi[w] = i; }
  __syncthreads();
  if (w == 0) {
    v = shv[lane];
    i = shi[lane];
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_down_sync(0xffffffffu, v, o);
      const int oi = __shfl_down_sync(0xffffffffu, i, o);
      if (beats(ov, oi, v, i)) { v = ov; i = oi; }
    }
    if (lane == 0) { shv[32] = v; shi[32] = i; }
  }
  __syncthreads();
  v = shv[32];
  i = shi[32];
  __syncthreads();
}

// Copies in order the values of x whose key is at least `floor_key` into `cand` when at most
// `cap` of them are there; returns how many are there either way.
__device__ __forceinline__ unsigned gather_above(const float* x, int vocab, unsigned floor_key, float* cand, unsigned cap,
                                                 unsigned* sh) {
  unsigned mine = 0;
  for (int i = threadIdx.x; i < vocab; i += THREADS) mine += order_key(x[i]) >= floor_key;
  unsigned n = 0;
  unsigned at = block_exclusive_scan(mine, sh, n);
  if (n <= cap) {
    for (int i = threadIdx.x; i < vocab && mine > 0; i += THREADS) {
      const float s = x[i];
      if (order_key(s) >= floor_key) {
        cand[at++] = s;
        mine--;
      }
    }
    __syncthreads();
  }
  return n;
}

extern "C" __global__ void __launch_bounds__(THREADS) sample_rows(const float* logits, float* scratch, const unsigned* spec,
                                                                   unsigned* out, int vocab, int words, int adjust_at, int masks_at,
                                                                   int max_candidates) { pdl_entry();
  __shared__ float shf[33];
  __shared__ int shi[33];
  __shared__ unsigned shu[33];
  __shared__ float cand[CANDIDATES];
  const int tid = threadIdx.x;
  const unsigned* r = spec + (long)blockIdx.x * RULE_WORDS;
  const int row = (int)r[0];
  const float temp = __uint_as_float(r[1]);
  const unsigned top_k = r[2];
  const float top_p = __uint_as_float(r[3]);
  const float ln_min_p = __uint_as_float(r[4]);
  const u64 seed = (u64)r[5] | ((u64)r[6] << 32);
  const u64 draw = (u64)r[7] | ((u64)r[8] << 32);
  const int ntop = min((int)r[9], vocab);
  const unsigned adj_from = r[10], adj_len = r[11], mask = r[12];
  const float* raw = logits + (long)row * vocab;
  float* x = scratch + (long)blockIdx.x * vocab;
  unsigned* o = out + (long)blockIdx.x * OUT_WORDS;
  const unsigned* bits = mask == NO_MASK ? nullptr : spec + masks_at + (long)mask * words;

  // Non-finite logits, the model's max, and x = the logits with the mask applied.
  unsigned bad = 0;
  int first = INT_MAX;
  float mx = -INFINITY;
  for (int i = tid; i < vocab; i += THREADS) {
    const float v = raw[i];
    if (!isfinite(v)) {
      bad++;
      first = min(first, i);
    } else {
      mx = fmaxf(mx, v);
    }
    bool ok = true;
    if (bits != nullptr) {
      const int w = i >> 5;
      ok = ((w < words ? bits[w] : 0u) >> (i & 31)) & 1u;
    }
    x[i] = ok ? v : -INFINITY;
  }
  bad = block_count(bad, shu);
  if (bad > 0) {
    float none = 0.f;
    block_argmax(none, first, shf, shi);  // the smallest id (all values equal)
    if (tid == 0) { o[0] = 1; o[1] = (unsigned)first; o[2] = bad; o[3] = 0; }
    return;
  }
  mx = block_max(mx, shf);
  // Adjustments: each token once, scattered by any thread, hence the barrier after.
  for (unsigned j = tid; j < adj_len; j += THREADS) {
    const unsigned* a = spec + adjust_at + (long)(adj_from + j) * 4;
    const unsigned t = a[0];
    if (t < (unsigned)vocab) {
      float v = x[t];
      if (isfinite(v)) {
        v += __uint_as_float(a[1]);
        const float rep = __uint_as_float(a[2]);
        if (rep != 1.0f) v = v > 0.0f ? v / rep : v * rep;
        x[t] = v - __uint_as_float(a[3]);
      }
    }
  }
  __syncthreads();

  // The log-sum-exp of the model's logits; the largest allowed value.
  float sum = 0.f, bv = -INFINITY;
  int bi = INT_MAX;
  unsigned allowed = 0;
  for (int i = tid; i < vocab; i += THREADS) {
    sum += expf(raw[i] - mx);
    const float v = x[i];
    if (isfinite(v)) {
      allowed++;
      if (v > bv) { bv = v; bi = i; }
    }
  }
  sum = block_sum(sum, shf);
  allowed = block_count(allowed, shu);
  block_argmax(bv, bi, shf, shi);
  if (bi == INT_MAX) {
    if (tid == 0) { o[0] = 2; o[1] = 0; o[2] = 0; o[3] = 0; }
    return;
  }
  const float lse = mx + logf(sum);
  int token = bi;

  if (temp != 0.0f) {
    const float m = bv;
    for (int i = tid; i < vocab; i += THREADS) {
      const float v = x[i];
      x[i] = isfinite(v) ? (v - m) / temp : -INFINITY;
    }
    unsigned cut = 1u;
    const unsigned cap = (unsigned)min(max_candidates, CANDIDATES);
    if (top_k > 0 && top_k < allowed) {
      unsigned t = 0;
      for (int b = 31; b >= 0; b--) {
        const unsigned c = t | (1u << b);
        unsigned n = 0;
        for (int i = tid; i < vocab; i += THREADS) n += order_key(x[i]) >= c;
        if (block_count(n, shu) >= top_k) t = c;
      }
      cut = max(cut, t);
    }
    if (ln_min_p > -INFINITY) cut = max(cut, order_key(ln_min_p));
    if (top_p < 1.0f) {
      float part = 0.f;
      for (int i = tid; i < vocab; i += THREADS) {
        const float s = x[i];
        if (order_key(s) >= cut) part += expf(s);
      }
      const float total = block_sum(part, shf);
      const float target = top_p * total;
      // Tokens with p < (1 − top_p) / V of the kept mass are never in the nucleus (all of them
      // together weigh less than 1 − top_p), so the search need not look below that key (halved
      // for rounding). When few tokens lie above it, they are copied to shared memory in
      // order and the 32 passes run there.
      const unsigned floor_key = max(cut, order_key(logf(0.5f * (1.0f - top_p) / (float)vocab) + logf(total)));
      const unsigned n = gather_above(x, vocab, floor_key, cand, cap, shu);
      const bool compact = n <= cap;
      unsigned t = 0;
      for (int b = 31; b >= 0; b--) {
        const unsigned c = t | (1u << b);
        if (c <= floor_key) {
          t = c;  // at or below the floor the kept mass reaches the target
          continue;
        }
        float p = 0.f;
        if (compact) {
          for (unsigned j = tid; j < n; j += THREADS) {
            const float s = cand[j];
            if (order_key(s) >= c) p += expf(s);
          }
        } else {
          for (int i = tid; i < vocab; i += THREADS) {
            const float s = x[i];
            if (order_key(s) >= c) p += expf(s);
          }
        }
        if (block_sum(p, shf) >= target) t = c;
      }
      cut = max(cut, t);
    }
    const u64 base = mix64(seed ^ mix64(draw + 0x9E3779B97F4A7C15ull));
    float best = -INFINITY;
    int at = INT_MAX;
    for (int i = tid; i < vocab; i += THREADS) {
      const float s = x[i];
      if (order_key(s) >= cut) {
        const float score = s + -logf(-logf(uniform01(base, (unsigned)i)));
        if (at == INT_MAX || score > best) { best = score; at = i; }
      }
    }
    block_argmax(best, at, shf, shi);
    token = at;
  }

  // The most likely tokens under the model's logits, one pass each: the best after the last.
  float pv = INFINITY;
  int pi = -1;
  for (int k = 0; k < ntop; k++) {
    float v = -INFINITY;
    int at = INT_MAX;
    for (int i = tid; i < vocab; i += THREADS) {
      const float l = raw[i];
      const bool after = l < pv || (l == pv && i > pi);
      if (after && (at == INT_MAX || l > v)) { v = l; at = i; }
    }
    block_argmax(v, at, shf, shi);
    if (tid == 0) { o[4 + 2 * k] = (unsigned)at; o[5 + 2 * k] = __float_as_uint(v - lse); }
    pv = v;
    pi = at;
  }
  if (tid == 0) {
    o[0] = 0;
    o[1] = (unsigned)token;
    o[2] = __float_as_uint(raw[token] - lse);
    o[3] = (unsigned)ntop;
  }
}
