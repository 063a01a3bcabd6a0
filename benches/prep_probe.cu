// The bf16 chunk prep: chunk_prep.cu's (one value head a CTA, or two of a key head) against the
// warpgroup one (chunk_wg_prep.cuh), both as prefill.rs launches them: outputs against an f64
// reference on small shapes, the two against each other and timed (L2 flushed before each
// launch) on the mixer benchmark's shapes.
// nvcc -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/prep_probe.cu
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "chunk_prep.cu"
#include "chunk_wg.cu"

#include "probe.cuh"

static size_t r128(size_t b) { return (b + 127) / 128 * 128; }
// prefill.rs's tc_prep_smem (bf16) and tc_prep_pair_smem.
static size_t prep_smem(int K) {
  const size_t kp = (K + 15) / 16 * 16 + 8, tile32 = 4 * 64 * 72, kt = 2 * 64 * kp;
  return r128(tile32) * 2 + r128(4 * 64) * 2 + r128(kt) * 2;
}
static size_t pair_smem(int K) {
  const size_t kp = (K + 15) / 16 * 16 + 8, tile32 = 4 * 64 * 72;
  return r128(tile32) * 2 + r128(8 * 64) * 2 + r128(std::max(4 * 64 * kp, 2 * tile32));
}

struct Cfg {
  std::string name;
  std::vector<int> lens;
  int H, HV, K;
  bool check;
};

static float bf(bf16 x) { return __bfloat162float(x); }

int main(int argc, char** argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 20;
  std::vector<Cfg> cfgs = {
      {"check K=128 GVA 2:4, lengths 200 64 1", {200, 64, 1}, 2, 4, 128, true},
      {"check K=64, lengths 131 77", {131, 77}, 2, 2, 64, true},
      {"check K=120, length 150", {150}, 1, 1, 120, true},
      {"check K=32 GVA 1:2, length 90", {90}, 1, 2, 32, true},
      {"check K=256 GVA 1:2, lengths 150 64", {150, 64}, 1, 2, 256, true},
      {"check K=192, length 100", {100}, 2, 2, 192, true},
      {"1x4096 H=16 K=128", {4096}, 16, 16, 128, false},
      {"8x2048 H=16 K=128", std::vector<int>(8, 2048), 16, 16, 128, false},
      {"8x2048 H=16 K=64", std::vector<int>(8, 2048), 16, 16, 64, false},
      {"4x8192 H=16 K=128", std::vector<int>(4, 8192), 16, 16, 128, false},
      {"Qwen3.5 1x4096 H=16 HV=32 K=128", {4096}, 16, 32, 128, false},
      {"Qwen3.5 8x64 H=16 HV=32 K=128", std::vector<int>(8, 64), 16, 32, 128, false},
      {"1.39B 1x4096 H=6 K=256", {4096}, 6, 6, 256, false},
      {"1.39B 8x2048 H=6 K=256", std::vector<int>(8, 2048), 6, 6, 256, false},
  };
  CK(cudaFuncSetAttribute(chunk_tc_prep_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem(256)));
  CK(cudaFuncSetAttribute(chunk_tc_prep_bf16_pairs, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pair_smem(256)));
  CK(cudaFuncSetAttribute(chunk_wg_prep_k16, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_prep_smem(16)));
  CK(cudaFuncSetAttribute(chunk_wg_prep_k8, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_prep_smem(8)));
  CK(cudaFuncSetAttribute(chunk_wg_prep_k4, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_prep_smem(4)));
  for (auto [f, name] : {std::pair<const void*, const char*>{(const void*)chunk_wg_prep_k16, "wg_prep_k16"},
                         {(const void*)chunk_wg_prep_k8, "wg_prep_k8"}, {(const void*)chunk_wg_prep_k4, "wg_prep_k4"},
                         {(const void*)chunk_tc_prep_bf16, "tc_prep_bf16"}}) {
    cudaFuncAttributes a;
    CK(cudaFuncGetAttributes(&a, f));
    int blocks = 0;
    const int smem = f == (const void*)chunk_tc_prep_bf16 ? (int)prep_smem(128)
                     : wg_prep_smem(f == (const void*)chunk_wg_prep_k16 ? 16 : f == (const void*)chunk_wg_prep_k8 ? 8 : 4);
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, f == (const void*)chunk_tc_prep_bf16 ? 256 : 128, smem));
    printf("%s: %d registers, %zu bytes local, %d bytes shared, %d CTAs an SM\n", name, a.numRegs, a.localSizeBytes, smem, blocks);
  }
  void* flush;
  CK(cudaMalloc(&flush, 256 << 20));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  bool ok_all = true;
  for (const Cfg& c : cfgs) {
    int rows = 0;
    std::vector<int> crow, clen;
    for (int L : c.lens) {
      for (int c0 = 0; c0 < L; c0 += 64) crow.push_back(rows + c0), clen.push_back(std::min(64, L - c0));
      rows += L;
    }
    const int chunks = crow.size();
    // L2-normalised q and k rows, β in (0, 1), log-decays in (−0.1, 0).
    std::vector<bf16> hq((size_t)rows * c.H * c.K), hk(hq.size());
    for (size_t r = 0; r < (size_t)rows * c.H; ++r)
      for (auto* x : {&hq, &hk}) {
        std::vector<float> t(c.K);
        float n = 0;
        for (float& e : t) e = nd(rng), n += e * e;
        for (int i = 0; i < c.K; ++i) (*x)[r * c.K + i] = __float2bfloat16(t[i] / std::sqrt(n));
      }
    std::vector<float> hb((size_t)rows * c.HV), hg(hb.size());
    for (auto& e : hb) e = ud(rng);
    for (auto& e : hg) e = -0.1f * ud(rng);
    const size_t on = (size_t)rows * c.HV * 64;
    bf16 *q, *k, *T2[2], *P[2];
    float *beta, *g, *Gout[2];
    int *dcrow, *dclen;
    CK(cudaMalloc(&q, hq.size() * 2));
    CK(cudaMalloc(&k, hk.size() * 2));
    CK(cudaMalloc(&beta, hb.size() * 4));
    CK(cudaMalloc(&g, hg.size() * 4));
    for (int v = 0; v < 2; ++v) {
      CK(cudaMalloc(&Gout[v], hg.size() * 4));
      CK(cudaMalloc(&T2[v], on * 2));
      CK(cudaMalloc(&P[v], on * 2));
      CK(cudaMemset(T2[v], 0xff, on * 2));
      CK(cudaMemset(P[v], 0xff, on * 2));
    }
    CK(cudaMalloc(&dcrow, chunks * 4));
    CK(cudaMalloc(&dclen, chunks * 4));
    CK(cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(beta, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g, hg.data(), hg.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcrow, crow.data(), chunks * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dclen, clen.data(), chunks * 4, cudaMemcpyHostToDevice));
    const bool pairs = c.HV / c.H % 2 == 0;
    auto launch = [&](int v) {
      if (v == 1) {
        if (c.K > 128)
          chunk_wg_prep_k16<<<dim3(chunks, c.HV), 128, wg_prep_smem(16)>>>(q, k, beta, g, dcrow, dclen, T2[1], P[1], Gout[1], c.H, c.HV, c.K);
        else if (c.K <= 64)
          chunk_wg_prep_k4<<<dim3(chunks, c.HV), 128, wg_prep_smem(4)>>>(q, k, beta, g, dcrow, dclen, T2[1], P[1], Gout[1], c.H, c.HV, c.K);
        else
          chunk_wg_prep_k8<<<dim3(chunks, c.HV), 128, wg_prep_smem(8)>>>(q, k, beta, g, dcrow, dclen, T2[1], P[1], Gout[1], c.H, c.HV, c.K);
      } else if (pairs) {
        chunk_tc_prep_bf16_pairs<<<dim3(chunks, c.HV / 2), 256, pair_smem(c.K)>>>(q, k, beta, g, dcrow, dclen, T2[0], P[0], Gout[0],
                                                                                   c.H, c.HV, c.K);
      } else {
        chunk_tc_prep_bf16<<<dim3(chunks, c.HV), 256, prep_smem(c.K)>>>(q, k, nullptr, beta, g, dcrow, dclen, nullptr, nullptr, T2[0],
                                                                         P[0], nullptr, nullptr, nullptr, nullptr, nullptr, Gout[0], c.H,
                                                                         c.HV, c.K, 64);
      }
    };
    launch(0);
    launch(1);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    std::vector<bf16> ht2[2], hp[2];
    std::vector<float> hgo[2];
    for (int v = 0; v < 2; ++v) {
      ht2[v].resize(on), hp[v].resize(on), hgo[v].resize(hg.size());
      CK(cudaMemcpy(ht2[v].data(), T2[v], on * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hp[v].data(), P[v], on * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hgo[v].data(), Gout[v], hg.size() * 4, cudaMemcpyDeviceToHost));
    }
    // The two against each other: max |new − old| / max |old| of T2 and P, G bit for bit.
    double dt = 0, mt = 0, dp = 0, mp = 0;
    size_t gdiff = 0, pdiff = 0, tdiff = 0;
    for (size_t i = 0; i < on; ++i) {
      dt = std::max(dt, (double)std::fabs(bf(ht2[1][i]) - bf(ht2[0][i]))), mt = std::max(mt, (double)std::fabs(bf(ht2[0][i])));
      dp = std::max(dp, (double)std::fabs(bf(hp[1][i]) - bf(hp[0][i]))), mp = std::max(mp, (double)std::fabs(bf(hp[0][i])));
      tdiff += bf(ht2[1][i]) != bf(ht2[0][i]);
      pdiff += bf(hp[1][i]) != bf(hp[0][i]);
    }
    for (size_t i = 0; i < hg.size(); ++i) gdiff += hgo[0][i] != hgo[1][i];
    printf("%-36s new vs old: T2 %.2e (%zu of %zu differ), P %.2e (%zu differ), G %zu differ\n", c.name.c_str(), dt / mt, tdiff, on,
           dp / mp, pdiff, gdiff);
    bool ok = dt / mt < 2e-2 && dp / mp < 2e-2 && gdiff == 0;
    if (c.check) {
      // f64 reference from the same bf16 inputs: P and T2 = (I + A)⁻¹ diag(β) per (chunk, head).
      double et[2] = {0, 0}, ep[2] = {0, 0}, rt = 0, rp = 0;
      for (int ch = 0; ch < chunks; ++ch)
        for (int hv = 0; hv < c.HV; ++hv) {
          const int L = clen[ch], r0 = crow[ch], kh = hv / (c.HV / c.H);
          std::vector<double> G(L), A(L * L, 0.0), T(L * L, 0.0);
          double acc = 0;
          for (int i = 0; i < L; ++i) acc += hg[(size_t)(r0 + i) * c.HV + hv], G[i] = acc;
          for (int i = 0; i < L; ++i)
            for (int j = 0; j < i; ++j) {
              double s = 0;
              for (int e = 0; e < c.K; ++e)
                s += (double)bf(hk[((size_t)(r0 + i) * c.H + kh) * c.K + e]) * bf(hk[((size_t)(r0 + j) * c.H + kh) * c.K + e]);
              A[i * L + j] = hb[(size_t)(r0 + i) * c.HV + hv] * s * std::exp(G[i] - G[j]);
            }
          for (int i = 0; i < L; ++i) {  // forward substitution, row by row
            T[i * L + i] = 1.0;
            for (int j = 0; j < i; ++j) {
              double s = 0;
              for (int m = j; m < i; ++m) s += A[i * L + m] * T[m * L + j];
              T[i * L + j] = -s;
            }
          }
          for (int i = 0; i < L; ++i)
            for (int j = 0; j <= i; ++j) {
              double s = 0;
              for (int e = 0; e < c.K; ++e)
                s += (double)bf(hq[((size_t)(r0 + i) * c.H + kh) * c.K + e]) * bf(hk[((size_t)(r0 + j) * c.H + kh) * c.K + e]);
              const double pr = s * std::exp(G[i] - G[j]), tr = T[i * L + j] * hb[(size_t)(r0 + j) * c.HV + hv];
              const size_t at = ((size_t)(r0 + i) * c.HV + hv) * 64 + j;
              rp = std::max(rp, std::fabs(pr)), rt = std::max(rt, std::fabs(tr));
              for (int v = 0; v < 2; ++v) {
                ep[v] = std::max(ep[v], std::fabs(bf(hp[v][at]) - pr));
                et[v] = std::max(et[v], std::fabs(bf(ht2[v][at]) - tr));
              }
            }
          // Above the diagonal and in padding columns: zeros.
          for (int i = 0; i < L; ++i)
            for (int j = i + 1; j < 64; ++j) {
              const size_t at = ((size_t)(r0 + i) * c.HV + hv) * 64 + j;
              for (int v = 0; v < 2; ++v) ep[v] = std::max(ep[v], (double)std::fabs(bf(hp[v][at]))), et[v] = std::max(et[v], (double)std::fabs(bf(ht2[v][at])));
            }
        }
      printf("    against f64: T2 old %.2e new %.2e, P old %.2e new %.2e (relative to the largest entry)\n", et[0] / rt, et[1] / rt,
             ep[0] / rp, ep[1] / rp);
      ok = ok && et[1] / rt < 1e-2 && ep[1] / rp < 1e-2;
    } else {
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      std::vector<float> ms[2];
      for (int r = 0; r < 2 * reps; ++r) {
        CK(cudaMemsetAsync(flush, 0, 256 << 20));
        CK(cudaEventRecord(e0));
        launch(r & 1);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms[r & 1].push_back(t);
      }
      CK(cudaGetLastError());
      const double bytes = 2.0 * rows * c.H * c.K * 2 + 2.0 * rows * c.HV * 64 * 2 + 3.0 * rows * c.HV * 4;
      for (int v = 0; v < 2; ++v) {
        std::sort(ms[v].begin(), ms[v].end());
        const double m = ms[v][ms[v].size() / 2];
        printf("    %s %.4f ms (%.2f TB/s of its inputs and outputs)\n", v ? "warpgroup     " : pairs ? "old, pairs    " : "old, one head ",
               m, bytes / (m * 1e-3) / 1e12);
      }
    }
    printf("    %s\n", ok ? "ok" : "MISMATCH");
    ok_all = ok_all && ok;
    for (void* p : {(void*)q, (void*)k, (void*)beta, (void*)g, (void*)Gout[0], (void*)Gout[1], (void*)T2[0], (void*)T2[1], (void*)P[0],
                    (void*)P[1], (void*)dcrow, (void*)dclen})
      CK(cudaFree(p));
  }
  printf("%s\n", ok_all ? "ALL OK" : "SOME MISMATCH");
  return ok_all ? 0 : 1;
}
