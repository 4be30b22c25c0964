// DS4 sparse decode attention benchmark (V4-Flash decode shape): B = 64, H = 64, K = 512,
// W = 128, max_model_len = 65,536, context lengths uniform in [1, 65,536] (fixed seed).
//
// For each layer type (C4, C128, C1) it builds `--layers` (default 43) layers with DISTINCT caches
// (same block tables and lengths, different bytes), so a sweep reads its rows from HBM, not L2, and
// times a CUDA Graph of the whole sweep (median over --reps replays) divided by the layer count:
//   * index build (combine_paged), paged-direct attention (A);
//   * the gather path (B): combine_gather + gather_workspace (capacity N) + attention over it.
// Ceilings measured in the same run: device-to-device copy bandwidth (bytes read + written) and a
// bf16 cuBLAS GEMM (8192^3, fp32 accumulate, random data). Physical bound of (A) per layer =
// max(bytes / copy BW, FLOPs / GEMM rate) with bytes = attended KV rows * 584 + q + out.
// Then the paged-direct path at the other shapes FlashMLA is built for (--variants): V4-Pro (H = 128,
// K = 1024; records ds4_<type>_B64_H128_*) and two query tokens per request (MTP; query row b*2 + t,
// token t at position L_b - 2 + t with picks of its own; records ds4_<type>_B64_H64_SQ2_*), whose
// bound counts each request's distinct rows once (a kernel sharing them between its tokens reads them
// once) and the FLOPs of every query row.
// Prints a table; --json PATH writes records {name, value, unit, baseline_name, baseline_value,
// ratio, machine, command}.
#ifdef GRAPHSAFE_DS4_TIMELINE
// The timeline build instantiates the paged attention with the timeline probe here (the library
// ships the kernel without instrumentation).
#include "../kernels/ds4/attention/timeline.cuh"
#endif
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/layout.hpp>

#include "../tests/support/ds4_bench_kernels.cuh"
#include "bench_support.hpp"
#include "timeline.hpp"  // kernels/ds4: the kernel's timeline record layout

#include <CLI/CLI.hpp>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace ds4 = graphsafe::ds4;
namespace bench = graphsafe::bench;
namespace gk = graphsafe::ds4::cuda;
namespace tl = graphsafe::ds4::cuda::timeline;

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

// The data generators and copy kernel shared with ds4_indexer_bench and the decode demo.
using graphsafe::testing::copy_kernel;
using graphsafe::testing::fill_bf16;
using graphsafe::testing::fill_mla_cache;

template <class T>
T* dalloc(std::size_t count) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<std::size_t>(16, count * sizeof(T))));
  return static_cast<T*>(p);
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); }
  ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
};

// Median time (ms) of `reps` launches of a graph.
double time_graph(cudaGraphExec_t g, cudaStream_t st, int reps) {
  Timer t;
  for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(g, st));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(t.a, st));
    CK(cudaGraphLaunch(g, st));
    CK(cudaEventRecord(t.b, st));
    CK(cudaEventSynchronize(t.b));
    float x = 0;
    CK(cudaEventElapsedTime(&x, t.a, t.b));
    ms.push_back(x);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <class F>
cudaGraphExec_t capture(cudaStream_t st, F&& fn) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  fn();
  CK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

#ifdef GRAPHSAFE_DS4_TIMELINE
// Breakdown of one graph replay of the sweep from the kernel's clock64 stamps (record layout:
// kernels/ds4/timeline.hpp): medians over the CTAs of the layers 2 .. L-2, in
// microseconds at the SM clock.
void print_timeline(const std::vector<unsigned long long>& v, int grid, double clock_ghz) {
  constexpr int S = tl::kSlots;
  const std::size_t count = v.size() / S;
  std::vector<std::size_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a * S + tl::gtime_entry] < v[b * S + tl::gtime_entry]; });
  const std::size_t layers = count / grid;
  std::printf("timeline: %zu CTA records, %zu layers of %d CTAs, SM clock %.2f GHz\n", count, layers, grid, clock_ghz);
  std::vector<double> span, gap, start_skew;
  std::map<std::string, std::vector<double>> d;
  auto us = [&](unsigned long long a, unsigned long long b) { return (double(b) - double(a)) / (clock_ghz * 1e3); };
  for (std::size_t l = 0; l < layers; ++l) {
    unsigned long long g0 = ~0ull, g0max = 0, g1 = 0;
    for (int k = 0; k < grid; ++k) {
      const unsigned long long* r = &v[order[l * grid + k] * S];
      g0 = std::min(g0, r[tl::gtime_entry]);
      g0max = std::max(g0max, r[tl::gtime_entry]);
      g1 = std::max(g1, r[tl::gtime_exit]);
    }
    span.push_back((g1 - g0) / 1e3);
    start_skew.push_back((g0max - g0) / 1e3);
    if (l + 1 < layers) {
      unsigned long long n0 = ~0ull;
      for (int k = 0; k < grid; ++k) n0 = std::min(n0, v[order[(l + 1) * grid + k] * S + tl::gtime_entry]);
      gap.push_back((double(n0) - double(g1)) / 1e3);
    }
    if (l < 2 || l + 2 >= layers) continue;
    for (int k = 0; k < grid; ++k) {
      const unsigned long long* r = &v[order[l * grid + k] * S];
      const int n = static_cast<int>(r[tl::tiles]);
      if (n <= 0 || r[tl::clock_exit] == 0) continue;
      const std::string tag = "n=" + std::to_string(n) + " ";
      d[tag + "a entry -> Q ready"].push_back(us(r[tl::clock_entry], r[tl::q_ready]));
      d[tag + "b entry -> first FULL"].push_back(us(r[tl::clock_entry], r[tl::full]));
      for (int j = 0; j < n && j < 8; ++j) {
        if (j > 0) d[tag + "c FULL(j-1) -> FULL(j)"].push_back(us(r[tl::full + j - 1], r[tl::full + j]));
        d[tag + "d consumer S (FULL -> S done)"].push_back(us(r[tl::full + j], r[tl::s_done + j]));
        d[tag + "e consumer softmax+PV (S done -> PV done)"].push_back(us(r[tl::s_done + j], r[tl::pv_done + j]));
        d[tag + "f producer fill (loads start -> FULL arrive)"].push_back(us(r[tl::p_loads_start + j], r[tl::p_full_arrive + j]));
        if (j > 0) d[tag + "g producer iteration start after consumer FULL(j-1)"].push_back(us(r[tl::full + j - 1], r[tl::p_loads_start + j]));
        if (j > 0) d[tag + "g2 producer FULL(j-1) arrive -> iteration start"].push_back(us(r[tl::p_full_arrive + j - 1], r[tl::p_loads_start + j]));
        if (j > 0 && r[tl::p_prefetched + j - 1] != 0) {
          d[tag + "g4 producer FULL(j-1) arrive -> row B + L2 prefetch issued"].push_back(us(r[tl::p_full_arrive + j - 1], r[tl::p_prefetched + j - 1]));
          d[tag + "g5 producer L2 prefetch issued -> iteration start"].push_back(us(r[tl::p_prefetched + j - 1], r[tl::p_loads_start + j]));
        }
        if (r[tl::p_loads_issued + j] != 0) d[tag + "f1 producer iteration start -> stage free, rows marked"].push_back(us(r[tl::p_loads_start + j], r[tl::p_loads_issued + j]));
        if (r[tl::p_loads_issued + j] != 0) d[tag + "f2 producer stage free -> FULL arrive"].push_back(us(r[tl::p_loads_issued + j], r[tl::p_full_arrive + j]));
        if (r[tl::p_loads_issued + j] != 0) d[tag + "f3 producer stage free -> tile stored (next row A issued)"].push_back(us(r[tl::p_loads_issued + j], r[tl::p_stores_done + j]));
        d[tag + "f4 producer fence.proxy.async"].push_back(us(r[tl::p_stores_done + j], r[tl::p_full_arrive + j]));
        if (j > 0) d[tag + "g3 producer FULL(j-1) arrive -> EMPTY(j) passed"].push_back(us(r[tl::p_full_arrive + j - 1], r[tl::p_empty_ok + j]));
        if (j < 4) {
          d[tag + "e1 math wg: S done -> P_FREE (PV wg done with j - 1)"].push_back(us(r[tl::s_done + j], r[tl::c_x_bar + j]));
          d[tag + "e2 math wg: P_FREE -> P handed over, O rescaled"].push_back(us(r[tl::c_x_bar + j], r[tl::c_pv_start + j]));
          d[tag + "e3 math wg: PV (own half)"].push_back(us(r[tl::c_pv_start + j], r[tl::pv_done + j]));
        }
        d[tag + "h consumer waits FULL (arrive -> acquired)"].push_back(us(r[tl::p_full_arrive + j], r[tl::full + j]));
        if (r[tl::pv_full + j] != 0 && r[tl::pv_pv_done + j] != 0) {  // builds with the PV warpgroup's stamps
          d[tag + "p1 PV wg: its S part (FULL -> S done)"].push_back(us(r[tl::pv_full + j], r[tl::pv_s_done + j]));
          d[tag + "p2 PV wg: P(j) acquired -> PV(j) done"].push_back(us(r[tl::pv_p_ok + j], r[tl::pv_pv_done + j]));
          if (j + 1 < n && j + 1 < 8 && r[tl::pv_s_done + j + 1] != 0 && r[tl::pv_s_done + j + 1] < r[tl::pv_p_ok + j])
            d[tag + "p3 PV wg: S(j+1) done -> P(j) acquired (one tile ahead)"].push_back(us(r[tl::pv_s_done + j + 1], r[tl::pv_p_ok + j]));
          if (r[tl::p_hi_arrive + j] != 0)
            d[tag + "p4 PV wg waits FULL of its half (published -> acquired)"].push_back(us(r[tl::p_hi_arrive + j], r[tl::pv_full + j]));
          if (j + 2 < n && j + 2 < 8 && r[tl::p_hi_arrive + j + 2] != 0)
            d[tag + "p5 PV(j) done -> its half of tile j+2 published (refill)"].push_back(us(r[tl::pv_pv_done + j], r[tl::p_hi_arrive + j + 2]));
        }
      }
      d[tag + "a1 entry -> Q stores start"].push_back(us(r[tl::clock_entry], r[tl::q_landed]));
      if (r[tl::merge_weights] != 0) {
        d[tag + "l1 B -> merge weights"].push_back(us(r[tl::cluster_b], r[tl::merge_weights]));
        d[tag + "l2 merge weights -> merged O"].push_back(us(r[tl::merge_weights], r[tl::merged]));
        d[tag + "l3 merged O -> staged (bar)"].push_back(us(r[tl::merged], r[tl::staged]));
        d[tag + "l4 staged -> stores issued"].push_back(us(r[tl::staged], r[tl::clock_exit]));
      }
      d[tag + "i last PV -> loop end"].push_back(us(r[tl::pv_done + std::min(n, 8) - 1], r[tl::loop_end]));
      d[tag + "j loop end -> cluster A"].push_back(us(r[tl::loop_end], r[tl::cluster_a]));
      d[tag + "k cluster A -> B (push)"].push_back(us(r[tl::cluster_a], r[tl::cluster_b]));
      d[tag + "l cluster B -> exit (merge, store)"].push_back(us(r[tl::cluster_b], r[tl::clock_exit]));
      d[tag + "m entry -> exit"].push_back(us(r[tl::clock_entry], r[tl::clock_exit]));
    }
  }
  auto med = [](std::vector<double> x) {
    if (x.empty()) return 0.0;
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  auto mx = [](const std::vector<double>& x) { return x.empty() ? 0.0 : *std::max_element(x.begin(), x.end()); };
  std::printf("  per layer (globaltimer): span median %.2f max %.2f us; gap to next layer median %.2f us; CTA start skew median %.2f us\n",
              med(span), mx(span), med(gap), med(start_skew));
  for (const auto& [k, x] : d)
    std::printf("  %-58s median %7.3f  max %7.3f us  (%zu)\n", k.c_str(), med(x), mx(x), x.size());
}
#endif

}  // namespace

// The paged-direct attention under test (in the timeline build: the instrumented kernel).
void paged_attention(const gk::PagedAttentionArgs& a, cudaStream_t st, const gk::AttentionOptions& o) {
#ifdef GRAPHSAFE_DS4_TIMELINE
  tl::sparse_attention_paged(a, st, o);
#else
  gk::sparse_attention_paged(a, st, o);
#endif
}

int main(int argc, char** argv) {
  std::string json_path;
  std::vector<std::string> types = {"c4", "c128", "c1"};
  int layers = 43, B = 64, heads_opt = 64, reps = 10, topk_opt = 512, max_len = 65536, splits_opt = 0;
  std::vector<std::string> variants = {"pro", "sq2"};
  const std::string command = bench::command_line(argc, argv);
  CLI::App app("ds4_attention_bench: DS4 sparse decode attention per layer against the physical bound",
               "ds4_attention_bench");
  app.add_option("--json", json_path, "write the records to this file");
  app.add_option("--layers", layers, "layers with distinct caches per sweep")->check(CLI::Range(1, 1024));
  app.add_option("--batch", B, "requests")->check(CLI::Range(1, 4096));
  app.add_option("--heads", heads_opt, "query heads (64 or 128)")->check(CLI::IsMember({64, 128}));
  app.add_option("--reps", reps, "graph replays per timing (median)")->check(CLI::Range(1, 100000));
  app.add_option("--splits", splits_opt,
                 "split-K count of every attention launch (0: gk::choose_splits; records of a forced count "
                 "carry _S<count>)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--topk", topk_opt, "C4 indexer picks")->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-len", max_len, "max_model_len")->check(CLI::Range(256, 1 << 24));
  app.add_option("--types", types, "layer types, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"c4", "c128", "c1"}));
  app.add_option("--variants", variants,
                 "extra paged-direct shapes after the sweep, comma-separated: pro (V4-Pro: H = 128, K = 1024), "
                 "sq2 (two query tokens per request), none")
      ->delimiter(',')
      ->check(CLI::IsMember({"pro", "sq2", "none"}));
  if (const auto code = bench::parse_command_line(app, argc, argv, json_path)) return *code;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const char* engine = std::getenv("GRAPHSAFE_DS4_ATTENTION");
  const std::string machine = std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs";
  // GRAPHSAFE_DS4_ATTENTION=mma_sync times the portable engine (the launchers' options argument).
  const std::string engine_name = engine != nullptr && std::string(engine) == "mma_sync" ? "mma_sync" : "ws";
  gk::AttentionOptions opts;
  if (engine_name == "mma_sync") opts.engine = gk::AttentionEngine::mma_sync;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<bench::Record> recs;

  // ---- ceilings: copy bandwidth and bf16 tensor-core GEMM rate
  double copy_bw = 0, tc_rate = 0;
  {
    const std::size_t bytes = std::size_t(2) << 30;
    auto* a = dalloc<std::uint8_t>(bytes);
    auto* b = dalloc<std::uint8_t>(bytes);
    CK(cudaMemsetAsync(a, 1, bytes, st));
    auto g = capture(st, [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st)); });
    const double ms = time_graph(g, st, reps);
    auto g2 = capture(st, [&] {
      copy_kernel<<<prop.multiProcessorCount * 8, 512, 0, st>>>(reinterpret_cast<const uint4*>(a),
                                                               reinterpret_cast<uint4*>(b), bytes / 16);
    });
    const double ms2 = time_graph(g2, st, reps);
    std::printf("copy: cudaMemcpyAsync %.0f GB/s, uint4 copy kernel %.0f GB/s (read+write)\n", 2.0 * bytes / (ms * 1e-3) / 1e9,
                2.0 * bytes / (ms2 * 1e-3) / 1e9);
    copy_bw = 2.0 * bytes / (std::min(ms, ms2) * 1e-3);
    CK(cudaGraphExecDestroy(g));
    CK(cudaGraphExecDestroy(g2));
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  {
    const int n = 8192;
    auto* A = dalloc<std::uint16_t>(std::size_t(n) * n);
    auto* Bm = dalloc<std::uint16_t>(std::size_t(n) * n);
    auto* C = dalloc<std::uint16_t>(std::size_t(n) * n);
    fill_bf16<<<1024, 256, 0, st>>>(A, std::size_t(n) * n, 1);
    fill_bf16<<<1024, 256, 0, st>>>(Bm, std::size_t(n) * n, 2);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { std::fprintf(stderr, "cublasCreate failed\n"); return 2; }
    cublasSetStream(h, st);
    const float alpha = 1.f, beta = 0.f;
    auto gemm = [&] {
      if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, Bm, CUDA_R_16BF, n, &beta, C,
                       CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasGemmEx failed\n");
        std::exit(2);
      }
    };
    gemm();
    CK(cudaStreamSynchronize(st));
    Timer t;
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      CK(cudaEventRecord(t.a, st));
      gemm();
      CK(cudaEventRecord(t.b, st));
      CK(cudaEventSynchronize(t.b));
      float x;
      CK(cudaEventElapsedTime(&x, t.a, t.b));
      ms.push_back(x);
    }
    std::sort(ms.begin(), ms.end());
    tc_rate = 2.0 * n * double(n) * n / (ms[ms.size() / 2] * 1e-3);
    cublasDestroy(h);
    CK(cudaFree(A));
    CK(cudaFree(Bm));
    CK(cudaFree(C));
  }
  recs.push_back({"ds4_ceiling_copy_bandwidth", copy_bw / 1e9, "GB/s", "", 0, 0});
  recs.push_back({"ds4_ceiling_bf16_gemm_rate", tc_rate / 1e12, "TFLOP/s", "", 0, 0});
  std::printf("machine: %s, attention engine: %s\nceilings: D2D copy %.0f GB/s (read+write), cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s\n",
              machine.c_str(), engine_name.c_str(), copy_bw / 1e9, tc_rate / 1e12);

  // ---- context lengths (same LCG as bench/torch_ds4_baseline.py)
  std::vector<std::int32_t> lens(B);
  {
    std::uint64_t s = 12345;
    for (int b = 0; b < B; ++b) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      lens[b] = 1 + static_cast<std::int32_t>((s >> 33) % static_cast<std::uint64_t>(max_len));
    }
  }
  std::mt19937 rng(7);

  std::printf("\n%-6s %-28s %10s %10s %10s %10s %8s\n", "type", "path", "us/layer", "KV MB", "GB/s", "TFLOP/s", "x bound");
  auto type_list = [&] {
    std::vector<int> r;
    for (const std::string& t : types) r.push_back(t == "c4" ? 4 : (t == "c128" ? 128 : 1));
    return r;
  }();

  // One layer type at one shape: H heads, C4 top-k `topk`, `sq` query tokens per request (query row
  // b*sq + t, token t at position L_b - sq + t). `full`: also the gather path (one query token only).
  auto run_shape = [&](const int ratio, const int H, const int topk, const int sq, const bool full) {
    const std::string tname = ratio == 1 ? "C1" : (ratio == 4 ? "C4" : "C128");
    const int R = B * sq;  // query rows
    // The one-token length of query row r (ds4::query_token_rows).
    auto row_len = [&](int r) { return lens[r / sq] == 0 ? 0 : std::max(lens[r / sq] - sq + 1 + r % sq, 0); };
    const int W = 128, sbt = ds4::kSwaBlockTokens;
    const int E = ratio > 1 ? 256 / ratio : 0;
    const int cap = ratio > 1 ? (max_len + ratio - 1) / ratio : 0;
    const int cw = ratio == 4 ? topk : (ratio > 1 ? (cap + 127) / 128 * 128 : 0);
    // SWA: allocate only the blocks covering the window; compressed: entries 0..n_c-1.
    const int sbpr = (max_len + sbt - 1) / sbt;
    std::vector<std::int32_t> stab(static_cast<std::size_t>(B) * sbpr, -1);
    int snb = 0;
    for (int b = 0; b < B; ++b) {
      const int L = lens[b];
      for (int blk = std::max(0, L - W) / sbt; blk <= (L - 1) / sbt; ++blk) stab[b * sbpr + blk] = snb++;
    }
    const int cbpr = ratio > 1 ? (cap + E - 1) / E : 0;
    std::vector<std::int32_t> ctab(std::max<std::size_t>(1, static_cast<std::size_t>(B) * cbpr), -1);
    int cnb = 0;
    std::vector<int> ncs(B);
    for (int b = 0; b < B; ++b) {
      ncs[b] = ratio > 1 ? lens[b] / ratio : 0;
      for (int blk = 0; blk < (ncs[b] + E - 1) / std::max(E, 1); ++blk) ctab[b * cbpr + blk] = cnb++;
    }
    // shuffle physical ids
    {
      std::vector<std::int32_t> perm(snb);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (auto& v : stab) if (v >= 0) v = perm[v];
      std::vector<std::int32_t> cperm(cnb);
      std::iota(cperm.begin(), cperm.end(), 0);
      std::shuffle(cperm.begin(), cperm.end(), rng);
      for (auto& v : ctab) if (v >= 0) v = cperm[v];
    }
    std::vector<std::int32_t> picks;
    if (ratio == 4) {
      picks.assign(static_cast<std::size_t>(R) * topk, -1);
      for (int r = 0; r < R; ++r) {
        const int nc = row_len(r) / 4;
        std::vector<std::int32_t> ids(nc);
        std::iota(ids.begin(), ids.end(), 0);
        const int len = std::min(nc, topk);
        for (int i = 0; i < len; ++i) {
          std::uniform_int_distribution<int> u(i, nc - 1);
          std::swap(ids[i], ids[u(rng)]);
          picks[static_cast<std::size_t>(r) * topk + i] = ids[i];
        }
      }
    }
    // rows_total: rows attended summed over the query rows (the FLOPs); unique_rows: the distinct
    // cache rows of each request (the bytes a kernel sharing rows between its tokens reads).
    long long rows_total = 0, unique_rows = 0;
    for (int b = 0; b < B; ++b) {
      std::vector<std::int64_t> seen;
      for (int t = 0; t < sq; ++t) {
        const int r = b * sq + t, L = row_len(r), nc = ratio > 1 ? L / ratio : 0;
        const int ncmp = ratio == 4 ? std::min(nc, topk) : (ratio > 1 ? std::min(nc, cw) : 0);
        rows_total += std::min(L, W) + ncmp;
        for (int i = 0; i < ncmp; ++i) seen.push_back(ratio == 4 ? picks[static_cast<std::size_t>(r) * topk + i] : i);
        for (int pos = L - std::min(L, W); pos < L; ++pos) seen.push_back((std::int64_t(1) << 40) + pos);
      }
      std::sort(seen.begin(), seen.end());
      unique_rows += std::unique(seen.begin(), seen.end()) - seen.begin();
    }
    const double kv_bytes = double(unique_rows) * ds4::kTokenBytes;
    const double io_bytes = kv_bytes + 2.0 * R * H * 512 * 2;  // + q read + out write
    const double flops = 4.0 * double(rows_total) * H * 512;

    // device buffers
    auto* d_lens = dalloc<std::int32_t>(B);
    auto* d_stab = dalloc<std::int32_t>(stab.size());
    auto* d_ctab = dalloc<std::int32_t>(ctab.size());
    auto* d_picks = dalloc<std::int32_t>(std::max<std::size_t>(1, picks.size()));  // [R, topk]
    CK(cudaMemcpy(d_lens, lens.data(), B * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_stab, stab.data(), stab.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ctab, ctab.data(), ctab.size() * 4, cudaMemcpyHostToDevice));
    if (!picks.empty()) CK(cudaMemcpy(d_picks, picks.data(), picks.size() * 4, cudaMemcpyHostToDevice));
    auto* d_q = dalloc<std::uint16_t>(std::size_t(R) * H * 512);
    fill_bf16<<<512, 256, 0, st>>>(d_q, std::size_t(R) * H * 512, 99);
    std::vector<float> sink(H);
    for (int h = 0; h < H; ++h) sink[h] = -2.f + 4.f * float(h) / H;
    auto* d_sink = dalloc<float>(H);
    CK(cudaMemcpy(d_sink, sink.data(), H * 4, cudaMemcpyHostToDevice));

    const std::size_t sstride = ds4::block_stride_bytes(sbt), cstride = ratio > 1 ? ds4::block_stride_bytes(E) : 0;
    std::vector<ds4::PagedCache> swa(layers), cmp(layers);
    std::vector<std::uint8_t*> owned;
    for (int l = 0; l < layers; ++l) {
      auto* s = dalloc<std::uint8_t>(snb * sstride);
      owned.push_back(s);
      fill_mla_cache<<<2048, 256, 0, st>>>(reinterpret_cast<std::uint32_t*>(s), snb * sstride / 4, sbt, sstride, 1000 + l);
      swa[l] = {s, sbt, snb, sstride};
      if (ratio > 1) {
        auto* c = dalloc<std::uint8_t>(cnb * cstride);
        owned.push_back(c);
        fill_mla_cache<<<4096, 256, 0, st>>>(reinterpret_cast<std::uint32_t*>(c), cnb * cstride / 4, E, cstride, 5000 + l);
        cmp[l] = {c, E, cnb, cstride};
      }
    }
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));

    // indices (paged-direct), shared by the layers
    auto* cmp_idx = dalloc<std::int32_t>(std::size_t(R) * std::max(cw, 1));
    auto* cmp_lens = dalloc<std::int32_t>(R);
    auto* swa_idx = dalloc<std::int32_t>(std::size_t(R) * W);
    auto* swa_lens = dalloc<std::int32_t>(R);
    gk::PagedIndexArgs pi;
    pi.batch = B; pi.query_tokens = sq; pi.ratio = ratio; pi.window = W; pi.topk = topk; pi.cmp_width = cw;
    pi.seq_lens = d_lens; pi.topk_local = ratio == 4 ? d_picks : nullptr;
    pi.swa_block_table = d_stab; pi.swa_blocks_per_req = sbpr; pi.swa_block_tokens = sbt;
    pi.cmp_block_table = d_ctab; pi.cmp_blocks_per_req = cbpr; pi.cmp_block_entries = E;
    pi.cmp_idx = ratio > 1 ? cmp_idx : nullptr; pi.cmp_lens = cmp_lens; pi.swa_idx = swa_idx; pi.swa_lens = swa_lens;
    gk::combine_paged(pi, st);

    const int splits = splits_opt > 0 ? splits_opt : gk::choose_splits(R, H, cw + W, gk::device_sm_count());
    auto* scratch = dalloc<std::uint8_t>(gk::sparse_attention_scratch_bytes(R, H, splits));
    auto* out = dalloc<std::uint16_t>(std::size_t(R) * H * 512);
    gk::PagedAttentionArgs pa;
    pa.c.batch = R; pa.c.heads = H; pa.c.q = d_q; pa.c.sink = d_sink; pa.c.out = out;
    pa.c.splits = splits; pa.c.scratch = scratch;
    pa.swa_idx = swa_idx; pa.swa_width = W; pa.swa_lens = swa_lens;
    if (ratio > 1) { pa.cmp_idx = cmp_idx; pa.cmp_width = cw; pa.cmp_lens = cmp_lens; }

    pa.swa = swa[0];
    if (ratio > 1) pa.cmp = cmp[0];
    paged_attention(pa, st, opts);  // eager first call (one-time attribute setup outside capture)
    CK(cudaStreamSynchronize(st));
    auto g_idx = capture(st, [&] { for (int l = 0; l < layers; ++l) gk::combine_paged(pi, st); });
    auto g_paged = capture(st, [&] {
      for (int l = 0; l < layers; ++l) {
        pa.swa = swa[l];
        if (ratio > 1) pa.cmp = cmp[l];
        paged_attention(pa, st, opts);
      }
    });
    const double us_idx = time_graph(g_idx, st, reps) * 1e3 / layers;
    const double us_paged = time_graph(g_paged, st, reps) * 1e3 / layers;
#ifdef GRAPHSAFE_DS4_TIMELINE
    {
      CK(cudaStreamSynchronize(st));
      tl::timeline_reset();
      CK(cudaGraphLaunch(g_paged, st));
      CK(cudaStreamSynchronize(st));
      int khz = 0;
      CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
      std::printf("%s paged-direct, ", ratio == 1 ? "C1" : (ratio == 4 ? "C4" : "C128"));
      print_timeline(tl::timeline_read(), R * (H / 64) * splits, khz / 1e6);
    }
#endif

    const double bound_us = std::max(io_bytes / copy_bw, flops / tc_rate) * 1e6;
    const double gbs = io_bytes / (us_paged * 1e-6) / 1e9, tfs = flops / (us_paged * 1e-6) / 1e12;
    const std::string label = "A paged-direct" + std::string(H != heads_opt || topk != topk_opt ? " H" + std::to_string(H) + " K" + std::to_string(topk) : "") +
                              (sq > 1 ? " s_q=" + std::to_string(sq) : "");
    std::printf("%-6s %-28s %10.2f %10.2f %10.0f %10.1f %8.2f\n", tname.c_str(), label.c_str(), us_paged, kv_bytes / 1e6, gbs,
                tfs, us_paged / bound_us);
    std::printf("%-6s %-28s %10.2f\n", tname.c_str(), "  index build (combine_paged)", us_idx);
    std::printf("%-6s %-28s %10.2f   (bytes %.2f MB -> %.2f us at copy BW; %.3f GFLOP -> %.2f us at GEMM rate)\n",
                tname.c_str(), "  physical bound", bound_us, io_bytes / 1e6, io_bytes / copy_bw * 1e6, flops / 1e9,
                flops / tc_rate * 1e6);
    const std::string p = "ds4_" + tname + "_B" + std::to_string(B) + "_H" + std::to_string(H) +
                          (sq > 1 ? "_SQ" + std::to_string(sq) : "") + (engine_name == "ws" ? "" : "_" + engine_name) +
                          (splits_opt > 0 ? "_S" + std::to_string(splits_opt) : "");
    recs.push_back({p + "_paged_direct_us_per_layer", us_paged, "us", "physical_bound_us", bound_us, us_paged / bound_us});
    recs.push_back({p + "_paged_direct_effective_bandwidth", gbs, "GB/s", "d2d_copy_bandwidth", copy_bw / 1e9, gbs / (copy_bw / 1e9)});
    recs.push_back({p + "_paged_direct_tflops", tfs, "TFLOP/s", "cublas_bf16_gemm_rate", tc_rate / 1e12, tfs / (tc_rate / 1e12)});
    recs.push_back({p + "_kv_bytes_per_layer", kv_bytes, "B", "", 0, 0});
    recs.push_back({p + "_index_build_us_per_layer", us_idx, "us", "", 0, 0});
    recs.push_back({p + "_physical_bound_us", bound_us, "us", "", 0, 0});
    auto release = [&](std::vector<void*> extra) {
      for (auto* o : owned) CK(cudaFree(o));
      for (void* x : std::vector<void*>{d_lens, d_stab, d_ctab, d_picks, d_q, d_sink, cmp_idx, cmp_lens, swa_idx, swa_lens,
                                        scratch, out})
        CK(cudaFree(x));
      for (void* x : extra) CK(cudaFree(x));
    };
    if (!full) {
      std::size_t nonfinite = 0;
      std::vector<std::uint16_t> o1(std::size_t(R) * H * 512);
      CK(cudaMemcpy(o1.data(), out, o1.size() * 2, cudaMemcpyDeviceToHost));
      for (auto v : o1) nonfinite += ((v & 0x7F80) == 0x7F80);
      std::printf("%-6s   splits %d, query rows %d, rows attended %lld (distinct %lld), non-finite outputs: %zu\n", tname.c_str(),
                  splits, R, rows_total, unique_rows, nonfinite);
      for (auto* g : {g_idx, g_paged}) CK(cudaGraphExecDestroy(g));
      release({});
      return;
    }

    // gather path with capacity sizes (N = ceil(max_len / r), M = N + W)
    const long long N = cap, M = N + W;
    const int width = (cw + W + 127) / 128 * 128;
    auto* ws = dalloc<std::uint16_t>(std::size_t(B) * M * 512);
    auto* gidx = dalloc<std::int32_t>(std::size_t(B) * width);
    auto* glens = dalloc<std::int32_t>(B);
    gk::GatherIndexArgs gi;
    gi.batch = B; gi.ratio = ratio; gi.window = W; gi.topk = ratio == 4 ? topk : cw; gi.width = width;
    gi.N = N; gi.M = M; gi.seq_lens = d_lens; gi.topk_local = ratio == 4 ? d_picks : nullptr; gi.idx = gidx; gi.lens = glens;
    gk::GatherArgs ga;
    ga.batch = B; ga.ratio = ratio; ga.window = W; ga.N = N; ga.M = M; ga.seq_lens = d_lens;
    ga.swa_block_table = d_stab; ga.swa_blocks_per_req = sbpr; ga.cmp_block_table = d_ctab; ga.cmp_blocks_per_req = cbpr;
    ga.ws = ws;
    gk::WorkspaceAttentionArgs wa;
    wa.c = pa.c;
    wa.ws = ws; wa.ws_rows = B * M; wa.idx = gidx; wa.width = width; wa.lens = glens;
    ga.swa = swa[0];
    ga.cmp = ratio > 1 ? cmp[0] : swa[0];
    gk::combine_gather(gi, st);
    gk::gather_workspace(ga, st);
    gk::sparse_attention_workspace(wa, st, opts);  // eager first call
    CK(cudaStreamSynchronize(st));
    auto g_gather = capture(st, [&] {
      for (int l = 0; l < layers; ++l) {
        ga.swa = swa[l];
        ga.cmp = ratio > 1 ? cmp[l] : swa[l];
        gk::combine_gather(gi, st);
        gk::gather_workspace(ga, st);
        gk::sparse_attention_workspace(wa, st, opts);
      }
    });
    const double us_gpath = time_graph(g_gather, st, reps) * 1e3 / layers;
    auto g_wsonly = capture(st, [&] { for (int l = 0; l < layers; ++l) gk::sparse_attention_workspace(wa, st, opts); });
    const double us_wsonly = time_graph(g_wsonly, st, reps) * 1e3 / layers;
    // correctness smoke: paged vs gather path on the last layer (bitwise equal by construction)
    std::vector<std::uint16_t> o1(std::size_t(B) * H * 512), o2(o1.size());
    pa.swa = swa[layers - 1];
    if (ratio > 1) pa.cmp = cmp[layers - 1];
    paged_attention(pa, st, opts);
    CK(cudaMemcpyAsync(o1.data(), out, o1.size() * 2, cudaMemcpyDeviceToHost, st));
    ga.swa = swa[layers - 1];
    ga.cmp = ratio > 1 ? cmp[layers - 1] : swa[layers - 1];
    gk::combine_gather(gi, st);
    gk::gather_workspace(ga, st);
    gk::sparse_attention_workspace(wa, st, opts);
    CK(cudaMemcpyAsync(o2.data(), out, o2.size() * 2, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    const bool same = o1 == o2;
    std::size_t nonfinite = 0;
    for (auto v : o1) nonfinite += ((v & 0x7F80) == 0x7F80);

    std::printf("%-6s %-28s %10.2f %10s %10s %10s %8.2f\n", tname.c_str(), "B gather path (all 3 steps)", us_gpath, "", "", "",
                us_gpath / bound_us);
    std::printf("%-6s %-28s %10.2f   (one shared workspace: rows L2-warm)\n", tname.c_str(), "  B attention over workspace", us_wsonly);
    std::printf("%-6s   splits %d, rows attended %lld, paged==gather bitwise: %s, non-finite outputs: %zu\n", tname.c_str(),
                splits, rows_total, same ? "yes" : "NO", nonfinite);

    recs.push_back({p + "_gather_path_us_per_layer", us_gpath, "us", p + "_paged_direct_us_per_layer", us_paged, us_gpath / us_paged});
    recs.push_back({p + "_workspace_attention_l2warm_us_per_layer", us_wsonly, "us", p + "_paged_direct_us_per_layer", us_paged,
                    us_wsonly / us_paged});

    for (auto* g : {g_idx, g_paged, g_gather, g_wsonly}) CK(cudaGraphExecDestroy(g));
    release({ws, gidx, glens});
  };
  for (const int ratio : type_list) run_shape(ratio, heads_opt, topk_opt, 1, true);
  for (const std::string& v : variants) {
    if (v == "pro")  // V4-Pro: 128 heads, top-k 1024
      for (const int ratio : type_list) run_shape(ratio, 128, 1024, 1, false);
    if (v == "sq2")  // one MTP draft token: two query tokens per request
      for (const int ratio : type_list) run_shape(ratio, heads_opt, topk_opt, 2, false);
  }

  if (!json_path.empty()) {
    bench::write_records(json_path, recs, machine, command);
    std::printf("\nwrote %zu records to %s\n", recs.size(), json_path.c_str());
  }
  return 0;
}
