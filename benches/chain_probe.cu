// What a chain of streaming kernels can reach: the bound a decode step of one row meets when
// every projection is its own launch. Each kernel of the chain only reads its projection's
// bytes of W (and reads and writes a recurrent state's bytes, or reads a KV cache's), in the
// order of a batch-1 decode step of the 1.39B Gated DeltaNet and of the Qwen3.5 layout; no
// arithmetic beyond folding the loaded words. The chain is captured in a CUDA graph, replayed,
// and compared with the roofline (the same bytes at the bandwidth of a 1 GiB copy, timed here
// as gpu_bench times it). Variants:
//   plain       kernels one after another (no programmatic edges);
//   pdl         each kernel launched programmatically, waiting on griddepcontrol.wait first
//               (the engine's captured steps);
//   pdl+early   each kernel triggers its dependents at entry and issues every load before it
//               waits (W is no kernel's output): how much a chain can overlap at most;
//   per layer   one kernel a layer reading all of that layer's bytes (a layer fused into one
//               launch), programmatic as `pdl`;
//   early own   as `pdl`, but a kernel whose reads no kernel of the step writes (the weights, the
//               recurrent states) issues them before it waits, and the kernel before it lets it
//               start at its entry (after its own wait): the early starts a step could take
//               without breaking a dependence.
// At a batch B > 1 (arguments: the batches, 1 when none) each state piece moves B states, and a
// second chain adds the step's row kernels beside the projections (the seams' add + RMSNorm, the
// short conv, the gated output norm, SwiGLU, the final norm), each a launch moving its rows'
// bytes: what a step of B rows loses to its small launches alone.
// Build and run on the device:  nvcc -O3 -arch=sm_90a chain_probe.cu -o chain_probe && ./chain_probe 1 16 64
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>
#include <cuda_runtime.h>

#define CK(x)                                                            \
  do {                                                                   \
    cudaError_t e_ = (x);                                                \
    if (e_ != cudaSuccess) {                                             \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

// One launch's traffic: bytes read, bytes written.
struct Piece {
  size_t read, write;
  bool own = false;  // reads only what no kernel of the step writes (weights, states): may load before the wait
};

// Folds the 16-byte words of src[0, n_read) this thread takes, DEPTH loads in flight at clamped
// addresses (no branch between them); `after_first_issue` runs once, after the first round of
// loads is issued and before any is used (at the end when the thread has none).
template <int DEPTH, typename F>
__device__ __forceinline__ unsigned fold_reads(const uint4* __restrict__ src, size_t n_read, F after_first_issue) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  bool ran = false;
  for (size_t i = first; i < n_read; i += DEPTH * stride) {
    uint4 v[DEPTH];
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) {
      const size_t k = i + j * stride;
      v[j] = __ldg(src + (k < n_read ? k : i));
    }
    if (!ran) after_first_issue(), ran = true;
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (!ran) after_first_issue();
  return acc;
}

// Writes this thread's words of dst[0, n_write); `acc` kept alive so the loads stay.
__device__ __forceinline__ void write_piece(uint4* __restrict__ dst, size_t n_write, unsigned acc, unsigned* sink) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n_write; k += stride) dst[k] = make_uint4(acc, (unsigned)k, 0, 0);
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

__device__ __forceinline__ void grid_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void grid_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// MODE 0: no griddepcontrol; 1: wait first; 2: trigger at entry, loads, then wait.
template <int MODE, int DEPTH>
__global__ void __launch_bounds__(256) piece_kernel(const uint4* __restrict__ src, size_t n_read, uint4* __restrict__ dst,
                                                    size_t n_write, unsigned* sink) {
  if (MODE == 2) grid_trigger();
  if (MODE == 1) grid_wait();
  const unsigned acc = fold_reads<DEPTH>(src, n_read, [] {});
  if (MODE == 2) grid_wait();
  write_piece(dst, n_write, acc, sink);
}

// `early own`'s kernel: EARLY issues its first loads before griddepcontrol.wait; TRIGGER lets the
// next kernel start right after this one's wait.
template <bool EARLY, bool TRIGGER, int DEPTH>
__global__ void __launch_bounds__(256) own_kernel(const uint4* __restrict__ src, size_t n_read, uint4* __restrict__ dst,
                                                  size_t n_write, unsigned* sink) {
  auto wait = [] {
    grid_wait();
    if (TRIGGER) grid_trigger();
  };
  if (!EARLY) wait();
  const unsigned acc = fold_reads<DEPTH>(src, n_read, [&] {
    if (EARLY) wait();
  });
  write_piece(dst, n_write, acc, sink);
}

__global__ void copy_kernel(const uint4* src, uint4* dst, size_t n) {
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) dst[k] = src[k];
}

static int g_sms = 0;

// One piece's launch of `kernel` (its reads and writes at src and dst), programmatic when `pdl`.
template <typename Kernel>
void launch(Kernel kernel, const Piece& p, const uint4* src, uint4* dst, unsigned* sink, int per_sm, cudaStream_t s, bool pdl) {
  const size_t n_read = p.read / 16, n_write = p.write / 16;
  const size_t n = std::max(n_read, n_write);
  // No more blocks than give every thread one load.
  const size_t need = (n + 255) / 256;
  const unsigned blocks = (unsigned)std::max<size_t>(1, std::min<size_t>((size_t)g_sms * per_sm, need));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, kernel, src, n_read, dst, n_write, sink));
}

// Replays a captured chain: the best of 7 means of 20 replays, ms.
float time_graph(cudaGraphExec_t ge, cudaStream_t s) {
  for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e9f;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms / 20);
  }
  return best;
}

// The chain of `pieces` (each at its own addresses), `launch_one(i, src, dst)` launching piece
// i, captured and replayed: ms.
template <typename LaunchOne>
float replay_ms(const std::vector<Piece>& pieces, char* rd, char* wr, cudaStream_t s, LaunchOne launch_one) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  size_t ro = 0, wo = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    launch_one(i, (const uint4*)(rd + ro), (uint4*)(wr + wo));
    ro += (pieces[i].read + 255) / 256 * 256;
    wo += (pieces[i].write + 255) / 256 * 256;
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  const float ms = time_graph(ge, s);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return ms;
}

template <int MODE, int DEPTH>
float chain_ms(const std::vector<Piece>& pieces, char* rd, char* wr, unsigned* sink, int per_sm, bool pdl, cudaStream_t s) {
  return replay_ms(pieces, rd, wr, s, [&](size_t i, const uint4* src, uint4* dst) {
    launch(piece_kernel<MODE, DEPTH>, pieces[i], src, dst, sink, per_sm, s, pdl);
  });
}

// The chain with `early own`'s kernels (8 loads in flight a thread).
float chain_own_ms(const std::vector<Piece>& pieces, char* rd, char* wr, unsigned* sink, int per_sm, cudaStream_t s) {
  return replay_ms(pieces, rd, wr, s, [&](size_t i, const uint4* src, uint4* dst) {
    const Piece& p = pieces[i];
    const bool trigger = i + 1 < pieces.size() && pieces[i + 1].own;
    if (p.own && trigger) launch(own_kernel<true, true, 8>, p, src, dst, sink, per_sm, s, true);
    else if (p.own) launch(own_kernel<true, false, 8>, p, src, dst, sink, per_sm, s, true);
    else if (trigger) launch(own_kernel<false, true, 8>, p, src, dst, sink, per_sm, s, true);
    else launch(own_kernel<false, false, 8>, p, src, dst, sink, per_sm, s, true);
  });
}

struct Model {
  std::string name;
  std::vector<std::vector<Piece>> layers;  // each layer's launches, then the head's
  size_t batch;  // B, the rows a step decodes
};

// A row kernel's bytes at B rows: the seam's add + RMSNorm (h f32 and delta bf16 read, r f32 and
// x bf16 written), the gated output norm over W columns (o f32 and z bf16 read, x bf16 written),
// SwiGLU (gate | up read, x written), the short conv's step over C channels (inputs, f32 window
// of 3 read and written, outputs f32).
Piece seam(size_t B, size_t D) { return {B * D * 6 + D * 4, B * D * 6}; }
Piece gated(size_t B, size_t W) { return {B * W * 6, B * W * 2}; }
Piece swiglu(size_t B, size_t I) { return {B * I * 4, B * I * 2}; }
Piece conv(size_t B, size_t C) { return {B * C * 14, B * C * 16}; }

Model gdn_1_39b(size_t B, bool rows) {
  // D 2048, 21 layers, 6 heads, K 256, V 512 a head, MLP 5632, vocabulary 32,000; bf16 W, f32 state.
  const size_t D = 2048, H = 6, K = 256, V = 512, I = 5632, VOCAB = 32000;
  const size_t in_proj = (2 * H * K + 2 * H * V + 2 * H) * D * 2, state = B * H * K * V * 4;
  Model m{"1.39B GDN, batch " + std::to_string(B) + (rows ? ", with row kernels" : ""), {}, B};
  for (int l = 0; l < 21; ++l) {
    if (rows)
      m.layers.push_back({seam(B, D), {in_proj, 0, true}, conv(B, 2 * H * K + H * V), {state, state, true},
                          gated(B, H * V), {H * V * D * 2, 0, true}, seam(B, D), {2 * I * D * 2, 0, true}, swiglu(B, I),
                          {I * D * 2, 0, true}});
    else
      m.layers.push_back({{in_proj, 0, true}, {state, state, true}, {H * V * D * 2, 0, true}, {2 * I * D * 2, 0, true},
                          {I * D * 2, 0, true}});
  }
  if (rows) m.layers.push_back({seam(B, D), {VOCAB * D * 2, 0, true}});
  else m.layers.push_back({{VOCAB * D * 2, 0, true}});
  return m;
}

Model qwen35(size_t B) {
  // Qwen3.5 layout: 24 layers (3 GDN : 1 gated attention), D 2048, GDN 16 key / 32 value heads of
  // 128, attention 8 query (+ gate) / 2 KV heads of 256 at a context of 256, MLP 6144,
  // vocabulary 248,320.
  const size_t D = 2048, I = 6144, VOCAB = 248320;
  const size_t gdn_in = (2 * 16 * 128 + 2 * 32 * 128 + 2 * 32) * D * 2, state = B * 32 * 128 * 128 * 4;
  const size_t out_proj = 32 * 128 * D * 2, attn_in = (8 * 256 * 2 + 2 * 2 * 256) * D * 2;
  const size_t kv = B * 256 * 2 * 2 * 256 * 2, o_proj = 8 * 256 * D * 2, mlp_up = 2 * I * D * 2, mlp_down = I * D * 2;
  Model m{"Qwen3.5 layout, batch " + std::to_string(B), {}, B};
  for (int l = 0; l < 24; ++l) {
    if (l % 4 == 3)
      m.layers.push_back({{attn_in, 0, true}, {kv, 0, true}, {o_proj, 0, true}, {mlp_up, 0, true}, {mlp_down, 0, true}});
    else
      m.layers.push_back(
          {{gdn_in, 0, true}, {state, state, true}, {out_proj, 0, true}, {mlp_up, 0, true}, {mlp_down, 0, true}});
  }
  m.layers.push_back({{VOCAB * D * 2, 0, true}});
  return m;
}

int main(int argc, char** argv) {
  std::vector<size_t> batches;
  for (int i = 1; i < argc; ++i) batches.push_back((size_t)atoi(argv[i]));
  if (batches.empty()) batches.push_back(1);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  printf("%s, %d SMs\n", prop.name, g_sms);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned* sink;
  CK(cudaMalloc(&sink, 16));

  // The roofline's bandwidth: a 1 GiB copy (read + written), 8 blocks an SM, median of 15.
  const size_t copy_n = (1ull << 30) / 16;
  uint4 *csrc, *cdst;
  CK(cudaMalloc(&csrc, copy_n * 16));
  CK(cudaMalloc(&cdst, copy_n * 16));
  CK(cudaMemset(csrc, 1, copy_n * 16));
  std::vector<float> ct;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 18; ++i) {
    CK(cudaEventRecord(a, s));
    copy_kernel<<<g_sms * 8, 256, 0, s>>>(csrc, cdst, copy_n);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) ct.push_back(ms);
  }
  std::sort(ct.begin(), ct.end());
  const double copy_bw = 2.0 * copy_n * 16 / (ct[ct.size() / 2] * 1e-3);
  printf("copy bandwidth (1 GiB read + written): %.0f GB/s\n\n", copy_bw / 1e9);
  CK(cudaFree(csrc));
  CK(cudaFree(cdst));

  std::vector<Model> models;
  for (size_t B : batches) {
    models.push_back(gdn_1_39b(B, false));
    if (B > 1) models.push_back(gdn_1_39b(B, true));
    models.push_back(qwen35(B));
  }
  for (const Model& m : models) {
    std::vector<Piece> pieces, merged;
    size_t bytes = 0, rsum = 0, wsum = 0, rtot = 0, wtot = 0;
    for (const auto& layer : m.layers) {
      Piece sum{0, 0};
      for (const Piece& p : layer) {
        pieces.push_back(p);
        bytes += p.read + p.write;
        rsum += p.read;
        wsum += p.write;
        rtot += (p.read + 255) / 256 * 256;
        wtot += (p.write + 255) / 256 * 256;
        sum.read += p.read;
        sum.write += p.write;
      }
      merged.push_back(sum);
    }
    char *rd, *wr;
    CK(cudaMalloc(&rd, rtot));
    CK(cudaMalloc(&wr, std::max<size_t>(wtot, 256)));
    CK(cudaMemset(rd, 1, rtot));
    const double roof_ms = bytes / copy_bw * 1e3;
    printf("## %s: %zu launches, %.1f MB; roofline %.4f ms\n\n", m.name.c_str(), pieces.size(), bytes / 1e6, roof_ms);
    printf("| chain | blocks an SM | loads in flight a thread | ms | %% of the roofline |\n|---|---|---|---|---|\n");
    auto row = [&](const char* name, int per_sm, int depth, float ms) {
      printf("| %s | %d | %d | %.4f | %.1f%% |\n", name, per_sm, depth, ms, 100.0 * roof_ms / ms);
    };
    for (int per_sm : {2, 4, 8}) {
      if (m.batch > 1 && per_sm == 2) continue;  // batches > 1: the engine's shapes, 4 and 8
      row("plain", per_sm, 8, chain_ms<0, 8>(pieces, rd, wr, sink, per_sm, false, s));
      row("pdl", per_sm, 4, chain_ms<1, 4>(pieces, rd, wr, sink, per_sm, true, s));
      row("pdl", per_sm, 8, chain_ms<1, 8>(pieces, rd, wr, sink, per_sm, true, s));
      row("pdl+early", per_sm, 8, chain_ms<2, 8>(pieces, rd, wr, sink, per_sm, true, s));
      row("per layer", per_sm, 8, chain_ms<1, 8>(merged, rd, wr, sink, per_sm, true, s));
      if (m.batch > 1) row("early own", per_sm, 8, chain_own_ms(pieces, rd, wr, sink, per_sm, s));
    }
    // The whole step's bytes as one read (and one write): what one launch streams.
    std::vector<Piece> one{{rsum, wsum}};
    for (int per_sm : {4, 8}) row("one launch", per_sm, 8, chain_ms<1, 8>(one, rd, wr, sink, per_sm, true, s));
    printf("\n");
    CK(cudaFree(rd));
    CK(cudaFree(wr));
  }
  CK(cudaGetLastError());
  return 0;
}
