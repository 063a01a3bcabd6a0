// The wgmma state pass (kernels/cuda/chunk_wg.cuh) against the mma.sync one (chunk_mma.cuh):
// outputs and final states against an f64 reference on small shapes, then both timed on the
// mixer benchmark's shapes. Past K = 128 the split-key pass (chunk_wg_split.cuh) against the
// mma.sync entries prefill.rs picks from (64 columns, 32, 32 double-buffered). nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17
// -Ikernels/cuda benches/wg_state_probe.cu (-DWG_PROFILE: clocks a phase).
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// The engine's own entries, as prefill.rs launches them.
#include "chunk_mma.cu"
#include "chunk_wg.cu"
#define old_k4 chunk_mma_state_k4_bv64
#define old_k8 chunk_mma_state_k8_bv64
#define old_db_k8 chunk_mma_state_db_k8_bv32
#define old_k8_bv32 chunk_mma_state_k8_bv32
#define new_k4 chunk_wg_state_k4
#define new_k8 chunk_wg_state_k8
#define ws_k4 chunk_wg_ws_k4
#define ws_k8 chunk_wg_ws_k8
#define old_k16 chunk_mma_state_k16_bv64
#define old_k16_bv32 chunk_mma_state_k16_bv32
#define old_db_k16 chunk_mma_state_db_k16_bv32
#define split_k16 chunk_wg_split_k16

#ifndef WS_PROF
#define WS_PROF 1  // the pass whose phases -DWG_PROFILE clocks (4: two warpgroups)
#endif
typedef void (*Entry)(const bf16*, const bf16*, const bf16*, long, const bf16*, const bf16*, const float*, float*,
                      const int*, const int*, const int*, int, bf16*, int, int, int, int, float);

#include "probe.cuh"

static size_t r128(size_t b) { return (b + 127) / 128 * 128; }
// prefill.rs's mma_state_smem for bf16 inputs.
static size_t old_smem(int K, int bv = 64, bool db = false) {
  const int kt = K <= 64 ? 4 : K <= 128 ? 8 : 16, k16 = 16 * kt;
  const size_t ktb = 2 * 64 * (k16 + 8), pt = 2 * 64 * 72, sb = 2 * (bv + 8);
  std::vector<size_t> parts = {ktb, ktb, ktb, pt, k16 * sb, pt, 64 * sb, 64 * sb, 12 * 64};
  if (db || kt <= 4) parts.insert(parts.end(), {pt, pt, 64 * sb, 4 * 64});
  size_t t = 0;
  for (size_t p : parts) t += r128(p);
  return t;
}

static float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

struct Cfg {
  std::string name;
  std::vector<int> lens;
  int H, HV, K, V;
  bool check;
};

int main() {
  std::vector<Cfg> cfgs = {
      {"check K=128 GVA 2:4 V=128, lengths 200 131 64 1", {200, 131, 64, 1}, 2, 4, 128, 128, true},
      {"check K=64 V=192, lengths 300 77", {300, 77}, 2, 2, 64, 192, true},
      {"check K=120 V=72, length 150", {150}, 1, 1, 120, 72, true},
      {"1x4096 H=16 K=128 V=256", {4096}, 16, 16, 128, 256, false},
      {"8x2048 H=16 K=128 V=256", std::vector<int>(8, 2048), 16, 16, 128, 256, false},
      {"8x2048 H=16 K=64 V=256", std::vector<int>(8, 2048), 16, 16, 64, 256, false},
      {"4x8192 H=16 K=128 V=256", std::vector<int>(4, 8192), 16, 16, 128, 256, false},
      {"Qwen3.5 GDN 1x4096 H=16 HV=32 K=128 V=128", {4096}, 16, 32, 128, 128, false},
      {"Qwen3.5 GDN 4x1024 H=16 HV=32 K=128 V=128", std::vector<int>(4, 1024), 16, 32, 128, 128, false},
      {"1x64 H=16 K=128 V=256 (one chunk)", {64}, 16, 16, 128, 256, false},
      {"8x64 Qwen3.5 GDN H=16 HV=32 K=128 V=128 (one chunk each)", std::vector<int>(8, 64), 16, 32, 128, 128, false},
      {"1x200 Qwen3.5 GDN H=16 HV=32 K=128 V=128", {200}, 16, 32, 128, 128, false},
      {"2x4096 H=16 K=128 V=256 (128 CTAs of 64 columns)", std::vector<int>(2, 4096), 16, 16, 128, 256, false},
      {"Qwen3.5 GDN 2x512 H=16 HV=32 K=128 V=128 (128 CTAs)", std::vector<int>(2, 512), 16, 32, 128, 128, false},
      {"Qwen3.5 GDN 3x512 H=16 HV=32 K=128 V=128 (192 CTAs)", std::vector<int>(3, 512), 16, 32, 128, 128, false},
      {"check K=256 GVA 1:2 V=128, lengths 200 131 64 1", {200, 131, 64, 1}, 1, 2, 256, 128, true},
      {"check K=192 V=72, length 150", {150}, 1, 1, 192, 72, true},
      {"1.39B 1x4096 H=6 K=256 V=512", {4096}, 6, 6, 256, 512, false},
      {"1.39B 8x2048 H=6 K=256 V=512", std::vector<int>(8, 2048), 6, 6, 256, 512, false},
      {"1.39B 16x512 H=6 K=256 V=512 (served prompts)", std::vector<int>(16, 512), 6, 6, 256, 512, false},
      {"1.39B 2x512 H=6 K=256 V=512", std::vector<int>(2, 512), 6, 6, 256, 512, false},
      {"1.39B 1x64 H=6 K=256 V=512 (one chunk)", {64}, 6, 6, 256, 512, false},
  };
  const size_t wg8 = wg_state_smem(8), wg4 = wg_state_smem(4);
  CK(cudaFuncSetAttribute(new_k8, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg8));
  CK(cudaFuncSetAttribute(new_k4, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg4));
  CK(cudaFuncSetAttribute(ws_k8, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_state_smem(8, true)));
  CK(cudaFuncSetAttribute(ws_k4, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_state_smem(4, true)));
  CK(cudaFuncSetAttribute(old_k8, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)old_smem(128)));
  CK(cudaFuncSetAttribute(old_k4, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)old_smem(64)));
  CK(cudaFuncSetAttribute(old_db_k8, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)old_smem(128, 32, true)));
  CK(cudaFuncSetAttribute(old_k8_bv32, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)old_smem(128, 32)));
  CK(cudaFuncSetAttribute(old_k16, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)old_smem(256)));
  CK(cudaFuncSetAttribute(old_k16_bv32, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)old_smem(256, 32)));
  CK(cudaFuncSetAttribute(old_db_k16, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)old_smem(256, 32, true)));
  CK(cudaFuncSetAttribute(split_k16, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_split_smem()));
  printf("smem: split k16 %d, old k16 %zu / bv32 %zu / db bv32 %zu bytes\n", wg_split_smem(), old_smem(256),
         old_smem(256, 32), old_smem(256, 32, true));
  printf("smem: new k8 %zu, k4 %zu; old k8 %zu, k4 %zu bytes\n", wg8, wg4, old_smem(128), old_smem(64));
  for (auto [f, name] : {std::pair<const void*, const char*>{(const void*)new_k8, "new_k8"}, {(const void*)new_k4, "new_k4"}, {(const void*)ws_k8, "ws_k8"}, {(const void*)ws_k4, "ws_k4"},
                         {(const void*)old_k8, "old_k8"}, {(const void*)old_k4, "old_k4"},
                         {(const void*)split_k16, "split_k16"}, {(const void*)old_k16, "old_k16"}, {(const void*)old_db_k16, "old_db_k16"}}) {
    cudaFuncAttributes a;
    CK(cudaFuncGetAttributes(&a, f));
    printf("%s: %d registers, %zu bytes local\n", name, a.numRegs, a.localSizeBytes);
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  bool all_ok = true;
  // PROBE_ONLY=<name prefix>: that shape alone (a profiler's run).
  const char* only = getenv("PROBE_ONLY");
  for (const Cfg& c : cfgs) {
    if (only && c.name.rfind(only, 0) != 0) continue;
    const int nseq = c.lens.size(), H = c.H, HV = c.HV, K = c.K, V = c.V, gva = HV / H;
    std::vector<int> cu(nseq + 1, 0);
    for (int i = 0; i < nseq; ++i) cu[i + 1] = cu[i] + c.lens[i];
    const int rows = cu[nseq];
    std::vector<float> qf((size_t)rows * H * K), kf((size_t)rows * H * K), vf((size_t)rows * HV * V);
    for (size_t i = 0; i < qf.size(); i += K)
      for (float* x : {&qf[i], &kf[i]}) {
        double ss = 0;
        for (int j = 0; j < K; ++j) x[j] = nd(rng), ss += x[j] * x[j];
        for (int j = 0; j < K; ++j) x[j] = bf(x[j] / std::sqrt(ss));
      }
    for (float& x : vf) x = bf(nd(rng));
    std::vector<float> G((size_t)rows * HV), beta((size_t)rows * HV);
    std::vector<float> T2((size_t)rows * HV * 64, 0.0f), P((size_t)rows * HV * 64, 0.0f);
    for (int s = 0; s < nseq; ++s)
      for (int hv = 0; hv < HV; ++hv) {
        const int hk = hv / gva;
        for (int t0 = cu[s]; t0 < cu[s + 1]; t0 += 64) {
          const int L = std::min(64, cu[s + 1] - t0);
          float acc = 0;
          for (int i = 0; i < L; ++i) {
            acc -= 0.02f + 0.13f * ud(rng);
            G[(size_t)(t0 + i) * HV + hv] = acc;
            beta[(size_t)(t0 + i) * HV + hv] = 0.2f + 0.7f * ud(rng);
          }
          auto g = [&](int i) { return (double)G[(size_t)(t0 + i) * HV + hv]; };
          if (!c.check) {  // timing only: a cheap lower-triangular T2 and P of similar size
            for (int i = 0; i < L; ++i)
              for (int j = 0; j <= i; ++j) {
                const size_t at = ((size_t)(t0 + i) * HV + hv) * 64 + j;
                T2[at] = bf(i == j ? beta[(size_t)(t0 + i) * HV + hv] : 0.05f * nd(rng));
                P[at] = bf(0.1f * nd(rng) * std::exp(g(i) - g(j)));
              }
            continue;
          }
          auto dot = [&](const float* a, const float* b) {
            double d = 0;
            for (int j = 0; j < K; ++j) d += (double)a[j] * b[j];
            return d;
          };
          auto kr = [&](int i) { return &kf[((size_t)(t0 + i) * H + hk) * K]; };
          auto qr = [&](int i) { return &qf[((size_t)(t0 + i) * H + hk) * K]; };
          // T = (I + A)^-1 with A[i][j] = β_i (k_i·k_j) e^{G_i − G_j}, j < i; T2 = T diag(β).
          std::vector<double> T(64 * 64, 0.0);
          for (int i = 0; i < L; ++i) {
            T[i * 64 + i] = 1.0;
            for (int j = 0; j < i; ++j) {
              double sum = 0;
              for (int m = j; m < i; ++m) {
                const double a = beta[(size_t)(t0 + i) * HV + hv] * dot(kr(i), kr(m)) * std::exp(g(i) - g(m));
                sum += a * T[m * 64 + j];
              }
              T[i * 64 + j] = -sum;
            }
          }
          for (int i = 0; i < L; ++i)
            for (int j = 0; j <= i; ++j) {
              T2[((size_t)(t0 + i) * HV + hv) * 64 + j] = bf(T[i * 64 + j] * beta[(size_t)(t0 + j) * HV + hv]);
              P[((size_t)(t0 + i) * HV + hv) * 64 + j] = bf(dot(qr(i), kr(j)) * std::exp(g(i) - g(j)));
            }
        }
      }
    std::vector<int> slots(nseq);
    for (int s = 0; s < nseq; ++s) slots[s] = nseq - 1 - s;
    std::vector<float> S0((size_t)nseq * HV * K * V);
    for (float& x : S0) x = 0.1f * nd(rng);
    const float scale = 1.0f / std::sqrt((float)K);

    auto to_bf = [](const std::vector<float>& x) {
      std::vector<bf16> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
      return y;
    };
    auto up = [](const auto& h) {
      using T = typename std::decay_t<decltype(h)>::value_type;
      T* d;
      CK(cudaMalloc(&d, h.size() * sizeof(T)));
      CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
      return d;
    };
    bf16 *dq = up(to_bf(qf)), *dk = up(to_bf(kf)), *dv = up(to_bf(vf)), *dT2 = up(to_bf(T2)), *dP = up(to_bf(P));
    float* dG = up(G);
    int *dcu = up(cu), *dslots = up(slots);
    float* dS;
    bf16* dO;  // O in bf16, as fla writes it for bf16 inputs
    CK(cudaMalloc(&dS, S0.size() * 4));
    CK(cudaMalloc(&dO, (size_t)rows * HV * V * 2));
    auto get_o = [&](std::vector<float>& out) {
      std::vector<bf16> raw((size_t)rows * HV * V);
      CK(cudaMemcpy(raw.data(), dO, raw.size() * 2, cudaMemcpyDeviceToHost));
      out.resize(raw.size());
      for (size_t i = 0; i < raw.size(); ++i) out[i] = __bfloat162float(raw[i]);
    };
    const bool k4 = K <= 64;
    Entry oldf = k4 ? old_k4 : old_k8, newf = k4 ? new_k4 : new_k8, wsf = k4 ? ws_k4 : ws_k8;
    const size_t osm = old_smem(K), nsm = k4 ? wg4 : wg8;
    // 0: mma.sync, 64-column tiles; 1: wgmma; 2: mma.sync double-buffered, 32-column tiles (K = 128);
    // 3: mma.sync, 32-column tiles; 4: wgmma, producer and consumer warpgroups.
    // Past K = 128: 0, the mma.sync pass's 64 columns; 1, the split-key pass; 3, mma.sync's 32
    // columns; 4, its 32 columns double-buffered.
    auto run = [&](int which) {
      if (K > 128) {
        const dim3 g64((V + 63) / 64, HV, nseq), g32((V + 31) / 32, HV, nseq);
        if (which == 1)
          split_k16<<<g64, SPLIT_THREADS, wg_split_smem()>>>(dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots,
                                                               nullptr, 0, dO, H, HV, K, V, scale);
        else if (which == 0)
          old_k16<<<g64, THREADS, old_smem(256)>>>(dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots, nullptr, 0,
                                                   dO, H, HV, K, V, scale);
        else if (which == 4)
          old_db_k16<<<g32, THREADS, old_smem(256, 32, true)>>>(dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots,
                                                                nullptr, 0, dO, H, HV, K, V, scale);
        else
          old_k16_bv32<<<g32, THREADS, old_smem(256, 32)>>>(dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots,
                                                            nullptr, 0, dO, H, HV, K, V, scale);
        return;
      }
      if (which == 4) {
        wsf<<<dim3((V + 63) / 64, HV, nseq), WS_THREADS, wg_state_smem(k4 ? 4 : 8, true)>>>(
            dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots, nullptr, 0, dO, H, HV, K, V, scale);
      } else if (which == 1) {
        newf<<<dim3((V + 63) / 64, HV, nseq), WG_THREADS, nsm>>>(dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots,
                                                                  nullptr, 0, dO, H, HV, K, V, scale);
      } else if (which == 0) {
        oldf<<<dim3((V + 63) / 64, HV, nseq), THREADS, osm>>>(dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots,
                                                              nullptr, 0, dO, H, HV, K, V, scale);
      } else if (which == 2) {
        old_db_k8<<<dim3((V + 31) / 32, HV, nseq), THREADS, old_smem(128, 32, true)>>>(
            dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots, nullptr, 0, dO, H, HV, K, V, scale);
      } else {
        old_k8_bv32<<<dim3((V + 31) / 32, HV, nseq), THREADS, old_smem(128, 32)>>>(
            dq, dk, dv, (long)HV * V, dT2, dP, dG, dS, dcu, dslots, nullptr, 0, dO, H, HV, K, V, scale);
      }
    };
    printf("\n## %s\n", c.name.c_str());
    if (c.check) {
      // f64 reference.
      std::vector<double> O((size_t)rows * HV * V, 0.0), SF(S0.begin(), S0.end());
      for (int s = 0; s < nseq; ++s)
        for (int hv = 0; hv < HV; ++hv) {
          const int hk = hv / gva;
          double* S = &SF[((size_t)slots[s] * HV + hv) * K * V];
          for (int t0 = cu[s]; t0 < cu[s + 1]; t0 += 64) {
            const int L = std::min(64, cu[s + 1] - t0);
            std::vector<double> Z(64 * V, 0.0), Y(64 * V, 0.0), R(64 * V, 0.0), VP(64 * V, 0.0);
            auto kk = [&](int i, int j) { return (double)kf[((size_t)(t0 + i) * H + hk) * K + j]; };
            auto qq = [&](int i, int j) { return (double)qf[((size_t)(t0 + i) * H + hk) * K + j]; };
            auto g = [&](int i) { return (double)G[(size_t)(t0 + i) * HV + hv]; };
            for (int i = 0; i < L; ++i)
              for (int j = 0; j < K; ++j)
                for (int n = 0; n < V; ++n) {
                  Z[i * V + n] += kk(i, j) * S[(size_t)j * V + n];
                  Y[i * V + n] += qq(i, j) * S[(size_t)j * V + n];
                }
            for (int i = 0; i < L; ++i)
              for (int n = 0; n < V; ++n)
                R[i * V + n] = vf[(size_t)(t0 + i) * HV * V + (size_t)hv * V + n] - std::exp(g(i)) * Z[i * V + n];
            for (int i = 0; i < L; ++i)
              for (int j = 0; j <= i; ++j) {
                const double t = T2[((size_t)(t0 + i) * HV + hv) * 64 + j];
                for (int n = 0; n < V; ++n) VP[i * V + n] += t * R[j * V + n];
              }
            for (int i = 0; i < L; ++i)
              for (int n = 0; n < V; ++n) {
                double x = std::exp(g(i)) * Y[i * V + n];
                for (int j = 0; j <= i; ++j) x += P[((size_t)(t0 + i) * HV + hv) * 64 + j] * VP[j * V + n];
                O[((size_t)(t0 + i) * HV + hv) * V + n] = scale * x;
              }
            const double gl = g(L - 1);
            for (size_t e = 0; e < (size_t)K * V; ++e) S[e] *= std::exp(gl);
            for (int i = 0; i < L; ++i) {
              const double dkk = std::exp(gl - g(i));
              for (int j = 0; j < K; ++j)
                for (int n = 0; n < V; ++n) S[(size_t)j * V + n] += dkk * kk(i, j) * VP[i * V + n];
            }
          }
        }
      std::vector<float> outs[3], sts[3];
      for (int neu = 0; neu < 3; ++neu) {
        CK(cudaMemcpy(dS, S0.data(), S0.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(dO, 0xff, (size_t)rows * HV * V * 2));
        run(neu == 2 ? 4 : neu);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        get_o(outs[neu]);
        sts[neu].resize(S0.size());
        CK(cudaMemcpy(sts[neu].data(), dS, S0.size() * 4, cudaMemcpyDeviceToHost));
      }
      auto err = [](const std::vector<float>& x, const std::vector<double>& ref) {
        double m = 0, e = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          m = std::max(m, std::fabs(ref[i]));
          const double d = std::fabs(x[i] - ref[i]);
          e = std::isfinite(x[i]) ? std::max(e, d) : INFINITY;
        }
        return e / m;
      };
      const double eo[2] = {err(outs[0], O), err(outs[1], O)}, es[2] = {err(sts[0], SF), err(sts[1], SF)};
      printf("| kernel | outputs: max error / max |ref| | final states |\n|---|---|---|\n");
      printf("| mma.sync (old) | %.3e | %.3e |\n| %s | %.3e | %.3e |\n", eo[0], es[0],
             K > 128 ? "wgmma, keys split (new)" : "wgmma (new)", eo[1], es[1]);
      // A hash of the new pass's bits, to compare builds (-D variants) across processes.
      unsigned long long fnv = 1469598103934665603ull;
      for (const auto* vec : {&outs[1], &sts[1]})
        for (float x : *vec) {
          unsigned u;
          memcpy(&u, &x, 4);
          fnv = (fnv ^ u) * 1099511628211ull;
        }
      printf("new pass's bits: hash %016llx\n", fnv);
      const bool same = K > 128 || (outs[2] == outs[1] && sts[2] == sts[1]);
      if (K > 128)
        printf("| mma.sync, 32 columns double-buffered | %.3e | %.3e |\n", err(outs[2], O), err(sts[2], SF));
      else
        printf("| wgmma, two warpgroups | %s |\n", same ? "bit for bit the one-warpgroup pass" : "DIFFERS from the one-warpgroup pass");
      const bool ok = eo[1] < 2.0 * eo[0] + 1e-3 && es[1] < 2.0 * es[0] + 1e-3 && same;
      printf("%s\n", ok ? "PASS" : "FAIL");
      all_ok &= ok;
    } else {
      CK(cudaMemcpy(dS, S0.data(), S0.size() * 4, cudaMemcpyHostToDevice));
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      const int kinds = 5;
      float ms[5][3] = {};
      for (int round = 0; round < 3; ++round)
        for (int neu = 0; neu < kinds; ++neu) {
          // K ≤ 128: the 32-column mma.sync passes are not timed (call5 of h200-wgmma_state).
          if (neu == 2 || (neu == 3 && K <= 128)) continue;
          for (int w = 0; w < 3; ++w) run(neu);
          CK(cudaEventRecord(a));
          for (int r = 0; r < 20; ++r) run(neu);
          CK(cudaEventRecord(b));
          CK(cudaEventSynchronize(b));
          CK(cudaGetLastError());
          float t;
          CK(cudaEventElapsedTime(&t, a, b));
          ms[neu][round] = t / 20;
        }
#ifdef WG_PROFILE
      for (int which : {1, 4}) {
        if (K > 128 && which == 4) continue;  // the mma.sync pass has no marks
        unsigned long long zero8[8] = {0}, prof[8];
        CK(cudaMemcpyToSymbol(wg_prof, zero8, sizeof(zero8)));
        run(which);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpyFromSymbol(prof, wg_prof, sizeof(prof)));
        const int chunks = (c.lens[0] + 63) / 64;
        printf("%s phases, cycles a chunk (CTA 0, thread 0):", which == 4 ? "two warpgroups" : "one warpgroup");
        const char* names[8] = {"end→top", "wait A+barrier+S wait", "Z,Y issue+loads+decays", "Z wait", "R+T2 wait", "V'+P wait", "O,S issue+O wait", "stores"};
        for (int i = 0; i < 8; ++i) printf(" %s %.0f;", names[i], (double)prof[i] / chunks);
        printf("\n");
        // Every CTA's start and end: the span, and how the CTAs' own times spread.
        static unsigned long long ns[4096][2];
        CK(cudaMemcpyFromSymbol(ns, wg_cta_ns, sizeof(ns)));
        const int ctas = std::min(4096, ((V + 63) / 64) * HV * nseq);
        unsigned long long t0 = ~0ull, t1 = 0, s1 = 0;
        std::vector<double> d;
        for (int i = 0; i < ctas; ++i) {
          t0 = std::min(t0, ns[i][0]), t1 = std::max(t1, ns[i][1]), s1 = std::max(s1, ns[i][0]);
          d.push_back((double)(ns[i][1] - ns[i][0]) / 1e3);
        }
        std::sort(d.begin(), d.end());
        printf("%s CTAs: %d, span %.2f us, last start +%.2f us, own time min %.2f / median %.2f / max %.2f us\n",
               which == 4 ? "two warpgroups" : "one warpgroup", ctas, (t1 - t0) / 1e3, (s1 - t0) / 1e3, d[0],
               d[d.size() / 2], d.back());
      }
#endif
      // One run of each from the same states: how far apart the two outputs are.
      std::vector<float> outs[3];
      for (int neu = 0; neu < 3; ++neu) {
        CK(cudaMemcpy(dS, S0.data(), S0.size() * 4, cudaMemcpyHostToDevice));
        run(neu == 2 ? 4 : neu);
        CK(cudaDeviceSynchronize());
        get_o(outs[neu]);
      }
      double m = 0, e = 0;
      for (size_t i = 0; i < outs[0].size(); ++i)
        m = std::max(m, (double)std::fabs(outs[0][i])), e = std::max(e, (double)std::fabs(outs[0][i] - outs[1][i]));
      printf("| kernel | ms, three rounds of 20 |\n|---|---|\n");
      if (K > 128) {
        printf("| mma.sync, 64 columns | %.4f / %.4f / %.4f |\n| mma.sync, 32 columns | %.4f / %.4f / %.4f |\n", ms[0][0],
               ms[0][1], ms[0][2], ms[3][0], ms[3][1], ms[3][2]);
        printf("| mma.sync, 32 columns double-buffered | %.4f / %.4f / %.4f |\n", ms[4][0], ms[4][1], ms[4][2]);
        printf("| wgmma, keys split (new) | %.4f / %.4f / %.4f |\n", ms[1][0], ms[1][1], ms[1][2]);
      } else {
        printf("| mma.sync (old) | %.4f / %.4f / %.4f |\n| wgmma (new) | %.4f / %.4f / %.4f |\n", ms[0][0], ms[0][1],
               ms[0][2], ms[1][0], ms[1][1], ms[1][2]);
        printf("| wgmma, two warpgroups | %.4f / %.4f / %.4f |\n", ms[4][0], ms[4][1], ms[4][2]);
      }
      const bool same = K > 128 || outs[2] == outs[1];
      if (K > 128)
        printf("new against old: outputs differ by %.3e of their max |x|\n", e / m);
      else
        printf("new against old: outputs differ by %.3e of their max |x|; two warpgroups %s\n", e / m,
               same ? "bit for bit one" : "DIFFER from one");
      const bool ok = e / m < 2e-2 && same;
      printf("%s\n", ok ? "PASS" : "FAIL (new against old)");
      all_ok &= ok;
    }
    for (void* p : {(void*)dq, (void*)dk, (void*)dv, (void*)dT2, (void*)dP, (void*)dG, (void*)dcu, (void*)dslots,
                    (void*)dS, (void*)dO})
      CK(cudaFree(p));
  }
  printf("\n%s\n", all_ok ? "ALL CHECKS PASS" : "SOME CHECK FAILED");
  return all_ok ? 0 : 1;
}
