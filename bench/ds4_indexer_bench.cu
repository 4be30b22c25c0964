// DS4 lightning indexer benchmark (docs/ds4_model.md §2.3, §7.2 shape): B = 64 requests, 64 index
// heads of dim 128, K = 512, max_model_len = 65,536, context lengths in [1, 65,536] from the LCG that
// bench/ds4_attention_bench.cu and the PyTorch peers use, so n_c = L / 4 compressed rows per request
// (up to 16,384).
//
// It also times the whole C4 decode step of one layer, as an engine runs it (ds4::PagedDecode::run
// with an indexer): indexer scores, the top-k writing the attention's index lists, and the
// paged-direct attention (H = 64 query heads, W = 128) over distinct per-layer attention caches,
// captured, ds4_C4_B64_H64_decode_step_us_per_layer; beside it the same step with the picks written
// to topk_local and turned into the lists by combine_paged (..._two_launch_...). --torch-json (from
// bench/torch_ds4_c4_step.py, run beside it) puts PyTorch's figure for the same step next to it
// (that record's ratio: PyTorch's time / ours; the other ratios: ours / the physical bound).
//
// `--layers` (default 8) layers with DISTINCT indexer caches (same block tables and lengths,
// different bytes) so a sweep reads its keys from HBM, not L2. A CUDA Graph of the sweep is replayed
// (median over --reps) and divided by the layer count, for the scores alone, the top-k alone and
// both. The physical bound of one layer is max(bytes / copy bandwidth, FLOPs / fp8 rate) with bytes
// = the indexer cache rows the layer reads (128 fp8 + 4 scale bytes each), FLOPs = 2 * 64 * 128 per
// row; the copy bandwidth is measured in the same run (device-to-device, bytes read + written, the
// faster of cudaMemcpyAsync and a copy kernel, as ds4_attention_bench does), the
// fp8 rate is the H200's dense fp8 tensor-core peak (1,979 TFLOP/s; the FLOP term is far below the
// memory term at this shape). Prints a table; --json PATH writes records {name, value, unit,
// baseline_name, baseline_value, ratio, machine, command}.
#include <graphsafe/ds4/indexer_kernels.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/layout.hpp>

#include "../tests/support/ds4_bench_kernels.cuh"
#include "bench_support.hpp"

#include <CLI/CLI.hpp>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace ds4 = graphsafe::ds4;
namespace gk = graphsafe::ds4::cuda;

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

constexpr double kFp8PeakFlops = 1979e12;  // H200 SXM dense fp8 tensor-core peak

__global__ void fill_random(std::uint8_t* p, std::size_t n, std::uint64_t seed, bool fp8) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 29;
    std::uint8_t v = static_cast<std::uint8_t>(x);
    if (fp8 && (v & 0x7F) == 0x7F) v ^= 0x01;  // no NaN codes
    p[i] = v;
  }
}
__global__ void fill_scales(ds4::IndexerCache c, float value) {
  const long long rows = static_cast<long long>(c.num_blocks) * c.block_rows;
  for (long long r = blockIdx.x * 256ll + threadIdx.x; r < rows; r += 256ll * gridDim.x) {
    const long long blk = r / c.block_rows, t = r % c.block_rows;
    *reinterpret_cast<float*>(c.base + blk * c.stride + c.block_rows * ds4::kIndexerRowBytes + t * 4) =
        value * (1.0f + 0.001f * static_cast<float>(t));
  }
}

// The data generators and copy kernel shared with ds4_attention_bench and the decode demo.
using graphsafe::testing::copy_kernel;
using graphsafe::testing::fill_bf16;
using graphsafe::testing::fill_mla_cache;

template <class F>
double median_graph_us(cudaStream_t st, int reps, F&& enqueue) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  enqueue();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaGraphLaunch(ge, st));  // warm-up
  CK(cudaStreamSynchronize(st));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("ds4_indexer_bench: scores + top-k per C4 layer against the physical bound", "ds4_indexer_bench");
  std::string json_path, torch_json;
  int layers = 8, batch = 64, topk = 512, max_len = 65536, reps = 20;
  app.add_option("--json", json_path, "write the records to this file");
  app.add_option("--layers", layers, "layers with distinct caches")->check(CLI::Range(1, 64));
  app.add_option("--batch", batch, "requests")->check(CLI::Range(1, 1024));
  app.add_option("--topk", topk, "K")->check(CLI::Range(1, 4096));
  app.add_option("--max-len", max_len, "max_model_len (tokens)")->check(CLI::Range(4, 1 << 20));
  app.add_option("--reps", reps, "timed replays")->check(CLI::Range(1, 1000));
  app.add_option("--torch-json", torch_json, "PyTorch's C4 step (bench/torch_ds4_c4_step.py --json) for the ratio");
  if (const auto code = graphsafe::bench::parse_command_line(app, argc, argv, json_path)) return *code;
  const std::string command = graphsafe::bench::command_line(argc, argv);

  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "ds4_indexer_bench: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // Lengths and block tables (shuffled physical blocks, as a paged allocator leaves them).
  std::mt19937_64 rng(2024);
  std::vector<std::int32_t> lens(batch);
  {
    std::uint64_t x = 12345;
    for (auto& l : lens) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      l = 1 + static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(max_len));
    }
  }
  const int cap_rows = max_len / ds4::kIndexerRatio;
  const int block_rows = ds4::IndexerCache{}.block_rows;
  const int blocks_per_req = (cap_rows + block_rows - 1) / block_rows;
  const int num_blocks = batch * blocks_per_req;
  std::vector<std::int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  long long rows_read = 0;
  for (auto l : lens) rows_read += l / ds4::kIndexerRatio;

  const std::int64_t N = cap_rows;  // the capacity stride, as Sizing::safe reserves it
  const std::size_t items = static_cast<std::size_t>(batch) * N;
  const std::size_t cache_bytes = static_cast<std::size_t>(num_blocks) * ds4::indexer_block_stride_bytes(block_rows);
  std::vector<gk::DeviceBytes> caches;
  std::vector<ds4::IndexerCache> views;
  for (int l = 0; l < layers; ++l) {
    caches.push_back(gk::device_alloc(cache_bytes));
    ds4::IndexerCache c;
    c.base = caches.back().get();
    c.num_blocks = num_blocks;
    fill_random<<<1024, 256, 0, st>>>(c.base, cache_bytes, 1000 + l, true);
    fill_scales<<<1024, 256, 0, st>>>(c, 0.01f);
    views.push_back(c);
  }
  auto q = gk::device_alloc(static_cast<std::size_t>(batch) * 64 * 128);
  fill_random<<<256, 256, 0, st>>>(q.get(), static_cast<std::size_t>(batch) * 64 * 128, 7, true);
  std::vector<float> w(static_cast<std::size_t>(batch) * 64);
  for (auto& x : w) x = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-53) - 0.5f;
  auto dw = gk::device_alloc(w.size() * 4), dlens = gk::device_alloc(lens.size() * 4), dtable = gk::device_alloc(table.size() * 4);
  CK(cudaMemcpy(dw.get(), w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dlens.get(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dtable.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  auto logits = gk::device_alloc(items * 4), top = gk::device_alloc(static_cast<std::size_t>(batch) * topk * 4);

  // GRAPHSAFE_DS4_INDEXER=mma_sync times the portable scores kernel (the launcher's engine argument).
  const char* engine_env = std::getenv("GRAPHSAFE_DS4_INDEXER");
  const gk::IndexerEngine engine = engine_env != nullptr && std::string(engine_env) == "mma_sync"
                                       ? gk::IndexerEngine::mma_sync
                                       : gk::IndexerEngine::automatic;
  auto score = [&](int l) {
    gk::IndexerScoreArgs a;
    a.batch = batch; a.N = N; a.seq_lens = reinterpret_cast<const std::int32_t*>(dlens.get());
    a.q = q.get(); a.weights = reinterpret_cast<const float*>(dw.get()); a.cache = views[l];
    a.block_table = reinterpret_cast<const std::int32_t*>(dtable.get()); a.blocks_per_req = blocks_per_req;
    a.logits = reinterpret_cast<float*>(logits.get());
    a.engine = engine;
    gk::indexer_score(a, st);
  };
  auto select = [&] {
    gk::IndexerTopkArgs a;
    a.batch = batch; a.N = N; a.k = topk; a.seq_lens = reinterpret_cast<const std::int32_t*>(dlens.get());
    a.logits = reinterpret_cast<const float*>(logits.get());
    a.topk_local = reinterpret_cast<std::int32_t*>(top.get());
    gk::indexer_topk(a, st);
  };
  CK(cudaStreamSynchronize(st));

  // Copy bandwidth (bytes read + written), 2 GiB device to device: the faster of the copy engine
  // and a uint4 copy kernel, as ds4_attention_bench measures it.
  const std::size_t copy_bytes = 2ull << 30;
  auto src = gk::device_alloc(copy_bytes), dst = gk::device_alloc(copy_bytes);
  CK(cudaMemsetAsync(src.get(), 1, copy_bytes, st));
  const double memcpy_us = median_graph_us(st, reps, [&] { CK(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, st)); });
  const double kernel_us = median_graph_us(st, reps, [&] {
    copy_kernel<<<prop.multiProcessorCount * 8, 512, 0, st>>>(reinterpret_cast<const uint4*>(src.get()),
                                                             reinterpret_cast<uint4*>(dst.get()), copy_bytes / 16);
  });
  const double copy_bw = 2.0 * copy_bytes / (std::min(memcpy_us, kernel_us) * 1e-6);

  const double score_us = median_graph_us(st, reps, [&] { for (int l = 0; l < layers; ++l) score(l); }) / layers;
  const double topk_us = median_graph_us(st, reps, [&] { for (int l = 0; l < layers; ++l) select(); }) / layers;
  const double both_us = median_graph_us(st, reps, [&] { for (int l = 0; l < layers; ++l) { score(l); select(); } }) / layers;

  // ---- the whole C4 step: indexer, top-k, paged combine, paged-direct attention -----------------
  constexpr int H = 64, W = 128, sbt = ds4::kSwaBlockTokens;
  const int E = ds4::IndexerCache{}.block_rows;  // C4 compressed blocks: 256 / 4 entries, the indexer's table
  const std::size_t cstride = ds4::block_stride_bytes(E), sstride = ds4::block_stride_bytes(sbt);
  const int sbpr = (max_len + sbt - 1) / sbt;
  std::vector<std::int32_t> stab(static_cast<std::size_t>(batch) * sbpr, -1);
  int snb = 0;
  for (int b = 0; b < batch; ++b)
    for (int blk = std::max(0, lens[b] - W) / sbt; blk <= (lens[b] - 1) / sbt; ++blk) stab[static_cast<std::size_t>(b) * sbpr + blk] = snb++;
  std::vector<gk::DeviceBytes> att_mem;
  std::vector<ds4::PagedCache> swa(layers), cmp(layers);
  for (int l = 0; l < layers; ++l) {
    att_mem.push_back(gk::device_alloc(static_cast<std::size_t>(num_blocks) * cstride));
    fill_mla_cache<<<4096, 256, 0, st>>>(reinterpret_cast<std::uint32_t*>(att_mem.back().get()), num_blocks * cstride / 4, E, cstride, 5000 + l);
    cmp[l] = {att_mem.back().get(), E, num_blocks, cstride};
    att_mem.push_back(gk::device_alloc(static_cast<std::size_t>(snb) * sstride));
    fill_mla_cache<<<1024, 256, 0, st>>>(reinterpret_cast<std::uint32_t*>(att_mem.back().get()), snb * sstride / 4, sbt, sstride, 1000 + l);
    swa[l] = {att_mem.back().get(), sbt, snb, sstride};
  }
  auto dstab = gk::device_alloc(stab.size() * 4), dq = gk::device_alloc(static_cast<std::size_t>(batch) * H * 512 * 2);
  CK(cudaMemcpy(dstab.get(), stab.data(), stab.size() * 4, cudaMemcpyHostToDevice));
  fill_bf16<<<512, 256, 0, st>>>(reinterpret_cast<std::uint16_t*>(dq.get()), static_cast<std::size_t>(batch) * H * 512, 99);
  std::vector<float> sink(H);
  for (int h = 0; h < H; ++h) sink[h] = -2.f + 4.f * static_cast<float>(h) / H;
  auto dsink = gk::device_alloc(H * 4);
  CK(cudaMemcpy(dsink.get(), sink.data(), H * 4, cudaMemcpyHostToDevice));
  auto cmp_idx = gk::device_alloc(static_cast<std::size_t>(batch) * topk * 4), cmp_lens = gk::device_alloc(batch * 4);
  auto swa_idx = gk::device_alloc(static_cast<std::size_t>(batch) * W * 4), swa_lens = gk::device_alloc(batch * 4);
  const int splits = gk::choose_splits(batch, H, ((topk + W + 127) / 128) * 128, gk::device_sm_count());
  auto scratch = gk::device_alloc(std::max<std::size_t>(16, gk::sparse_attention_scratch_bytes(batch, H, splits)));
  auto out = gk::device_alloc(static_cast<std::size_t>(batch) * H * 512 * 2);
  gk::PagedIndexArgs pi;
  pi.batch = batch; pi.ratio = 4; pi.window = W; pi.topk = topk; pi.cmp_width = topk;
  pi.seq_lens = reinterpret_cast<const std::int32_t*>(dlens.get());
  pi.topk_local = reinterpret_cast<const std::int32_t*>(top.get());
  pi.swa_block_table = reinterpret_cast<const std::int32_t*>(dstab.get()); pi.swa_blocks_per_req = sbpr; pi.swa_block_tokens = sbt;
  pi.cmp_block_table = reinterpret_cast<const std::int32_t*>(dtable.get()); pi.cmp_blocks_per_req = blocks_per_req;
  pi.cmp_block_entries = E;
  pi.cmp_idx = reinterpret_cast<std::int32_t*>(cmp_idx.get()); pi.cmp_lens = reinterpret_cast<std::int32_t*>(cmp_lens.get());
  pi.swa_idx = reinterpret_cast<std::int32_t*>(swa_idx.get()); pi.swa_lens = reinterpret_cast<std::int32_t*>(swa_lens.get());
  gk::PagedAttentionArgs pa;
  pa.c.batch = batch; pa.c.heads = H; pa.c.q = reinterpret_cast<const std::uint16_t*>(dq.get());
  pa.c.sink = reinterpret_cast<const float*>(dsink.get()); pa.c.out = reinterpret_cast<std::uint16_t*>(out.get());
  pa.c.splits = splits; pa.c.scratch = scratch.get();
  pa.swa_idx = pi.swa_idx; pa.swa_width = W; pa.swa_lens = pi.swa_lens;
  pa.cmp_idx = pi.cmp_idx; pa.cmp_width = topk; pa.cmp_lens = pi.cmp_lens;
  // The step as PagedDecode::run with an indexer enqueues it: the top-k writes the attention's
  // index lists itself. two_launch: the picks to topk_local, then combine_paged (the same lists).
  auto select_lists = [&] {
    gk::IndexerTopkArgs a;
    a.batch = batch; a.N = N; a.k = topk; a.seq_lens = reinterpret_cast<const std::int32_t*>(dlens.get());
    a.logits = reinterpret_cast<const float*>(logits.get());
    a.lists = pi;
    gk::indexer_topk(a, st);
  };
  auto attend = [&](int l) {
    pa.swa = swa[l];
    pa.cmp = cmp[l];
    gk::sparse_attention_paged(pa, st);
  };
  auto step = [&](int l) { score(l); select_lists(); attend(l); };
  auto step_two_launch = [&](int l) { score(l); select(); gk::combine_paged(pi, st); attend(l); };
  step_two_launch(0);  // eager first calls: one-time kernel attribute setup outside the capture
  step(0);
  CK(cudaStreamSynchronize(st));
  const double step_us = median_graph_us(st, reps, [&] { for (int l = 0; l < layers; ++l) step(l); }) / layers;
  const double two_launch_us = median_graph_us(st, reps, [&] { for (int l = 0; l < layers; ++l) step_two_launch(l); }) / layers;
  const double attn_us = median_graph_us(st, reps, [&] { for (int l = 0; l < layers; ++l) attend(l); }) / layers;
  const double lists_us = median_graph_us(st, reps, [&] { for (int l = 0; l < layers; ++l) select_lists(); }) / layers;
  std::optional<double> torch_us;
  if (!torch_json.empty()) {
    std::ifstream f(torch_json);
    const auto j = nlohmann::json::parse(f);
    for (const auto& r : j)
      if (r.at("name").get<std::string>() == "ds4_C4_B" + std::to_string(batch) + "_H64_torch_decode_step_us_per_layer")
        torch_us = r.at("value").get<double>();
    if (!torch_us) std::fprintf(stderr, "ds4_indexer_bench: no torch step record in %s\n", torch_json.c_str());
  }

  const double bytes = static_cast<double>(rows_read) * (ds4::kIndexerRowBytes + ds4::kIndexerScaleBytes);
  const double flops = static_cast<double>(rows_read) * 2.0 * ds4::kIndexerHeads * ds4::kIndexerDim;
  const double bound_us = std::max(bytes / copy_bw, flops / kFp8PeakFlops) * 1e6;

  std::printf("%s: B=%d, K=%d, max_len=%d, %lld indexer rows per layer (%.1f MB), %d layers, scores on %s\n",
              prop.name, batch, topk, max_len, rows_read, bytes / 1e6, layers,
              engine == gk::IndexerEngine::mma_sync ? "mma.sync" : "wgmma (sm_90a) when available");
  std::printf("copy bandwidth %.0f GB/s; memory term %.2f us, fp8 FLOP term %.2f us\n", copy_bw / 1e9,
              bytes / copy_bw * 1e6, flops / kFp8PeakFlops * 1e6);
  std::printf("%-24s %10s %10s\n", "part", "us/layer", "x bound");
  std::printf("%-24s %10.2f %10.2f\n", "scores", score_us, score_us / bound_us);
  std::printf("%-24s %10.2f %10s\n", "top-k", topk_us, "");
  std::printf("%-24s %10.2f %10.2f\n", "scores + top-k", both_us, both_us / bound_us);
  std::printf("%-24s %10.2f\n", "physical bound", bound_us);
  std::printf("%-24s %10.2f\n", "top-k into index lists", lists_us);
  std::printf("C4 decode step (H=%d, W=%d): %.2f us/layer (paged attention alone %.2f; picks + combine_paged "
              "instead of the lists: %.2f)", H, W, step_us, attn_us, two_launch_us);
  if (torch_us) std::printf("; PyTorch %.1f us/layer = %.1fx", *torch_us, *torch_us / step_us);
  std::printf("\n");

  if (!json_path.empty()) {
    namespace gb = graphsafe::bench;
    const std::string p = "ds4_indexer_B" + std::to_string(batch) + "_K" + std::to_string(topk);
    std::vector<gb::Record> recs;
    recs.push_back({p + "_score_topk_us_per_layer", both_us, "us", "physical_bound_us", bound_us, both_us / bound_us});
    recs.push_back({p + "_score_us_per_layer", score_us, "us", "physical_bound_us", bound_us, score_us / bound_us});
    recs.push_back({p + "_topk_us_per_layer", topk_us, "us", "", 0, {}});
    recs.push_back({p + "_physical_bound_us", bound_us, "us", "", 0, {}});
    const std::string sp = "ds4_C4_B" + std::to_string(batch) + "_H64";
    if (torch_us)
      recs.push_back({sp + "_decode_step_us_per_layer", step_us, "us", sp + "_torch_decode_step_us_per_layer", *torch_us,
                      *torch_us / step_us});
    else
      recs.push_back({sp + "_decode_step_us_per_layer", step_us, "us", "", 0, {}});
    recs.push_back({sp + "_decode_step_attention_us_per_layer", attn_us, "us", "", 0, {}});
    recs.push_back({p + "_topk_lists_us_per_layer", lists_us, "us", "", 0, {}});
    recs.push_back({sp + "_decode_step_two_launch_us_per_layer", two_launch_us, "us", sp + "_decode_step_us_per_layer",
                    step_us, two_launch_us / step_us});
    gb::write_records(json_path, recs, prop.name, command);
    std::printf("wrote %zu records to %s\n", recs.size(), json_path.c_str());
  }
  CK(cudaStreamDestroy(st));
  return 0;
}
