// capture_memory_bench: graph memory against its lower bound (peak live bytes), the estimate made
// before capturing, and PyTorch's CUDA graph pool on the same allocation pattern.
//
//   build/bench/capture_memory_bench --pattern ds4_pattern.json          # CUDA; writes the pattern
//   python3 bench/torch_capture_pool.py ds4_pattern.json --json torch_pool.json
//   build/bench/capture_memory_bench --torch torch_pool.json --json bench/results/capture_memory_bench.json
//   build/bench/capture_memory_bench --host                               # CPU twin (smaller shapes)
//
// DS4: a 43-layer decode step (C1, C1, then C4 / C128 alternating) with GatherDecode's requests --
// the same names, extents and sizing policies (the N / G dimensions, kv, combined indices and
// lengths, split-K scratch) -- each workspace used by a kernel and released when its
// layer is done; four bucket graphs (64, 32, 16, 8, largest first) in one family, per policy.
// Synthetic: a transformer-like step on two streams, a fork / join per layer, varied sizes.
//
// JSON: an array of {"name","value","unit","baseline_name","baseline_value","ratio","machine","command"};
// ratio = baseline_value / value, null without a baseline.
#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/graphsafe.hpp>

#include "bench_support.hpp"
#include <CLI/CLI.hpp>
#include <graphsafe/policies/capacity_bound.hpp>
#include <graphsafe/policies/static_query_bound.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace graphsafe;

namespace {

struct Options {
  bool host = false;
  int layers = 43;
  int max_model_len = 65536;
  int heads = 64;
  int sms = 0;  // 0: the device's
  std::string json, pattern, torch;
  std::string command;
};


// A use of a workspace in the graph (a kernel: an estimate's planning capture records it with an
// address no memory backs, which a kernel's arguments may hold but a memset node's may not).
__global__ void touch_kernel(unsigned char* p, std::uint64_t n) {
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i == 0) p[0] = 0;
  if (i == 1) p[n - 1] = 0;
}

// Streams and their ordering, on either backend.
struct Device {
  bool host = false;
  std::unique_ptr<Backend> backend;
  std::vector<HostStream> hs;
  std::vector<cudaStream_t> cs;
  explicit Device(bool h) : host(h), hs(h ? 2 : 0) {
    if (host) {
      backend = std::make_unique<HostBackend>();
    } else {
      backend = std::make_unique<CudaBackend>();
      cs.resize(2);
      for (auto& s : cs) GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
  }
  ~Device() {
    for (auto s : cs) cudaStreamDestroy(s);
  }
  Stream stream(int i) { return host ? Stream(hs[static_cast<std::size_t>(i)]) : Stream(cs[static_cast<std::size_t>(i)]); }
  // A use of the workspace in the graph.
  void touch(const Workspace& w, int i) {
    if (!w.bytes()) return;
    if (host) {
      void* p = w.data();
      const std::uint64_t n = w.bytes();
      hs[static_cast<std::size_t>(i)].launch([p, n] { std::memset(p, 0, n); });
    } else {
      touch_kernel<<<1, 32, 0, cs[static_cast<std::size_t>(i)]>>>(w.as<unsigned char>(), w.bytes());
      GRAPHSAFE_CUDA(cudaGetLastError());
    }
  }
  // `to` waits for `from` (fork / join).
  void join(int from, int to) {
    if (host) {
      HostEvent e;
      hs[static_cast<std::size_t>(from)].record(e);
      hs[static_cast<std::size_t>(to)].wait(e);
    } else {
      cudaEvent_t e;
      GRAPHSAFE_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      GRAPHSAFE_CUDA(cudaEventRecord(e, cs[static_cast<std::size_t>(from)]));
      GRAPHSAFE_CUDA(cudaStreamWaitEvent(cs[static_cast<std::size_t>(to)], e, 0));
      GRAPHSAFE_CUDA(cudaEventDestroy(e));
    }
  }
  std::string machine() const {
    if (host) return "host (CPU, HostBackend)";
    cudaDeviceProp prop{};
    int dev = 0;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    return prop.name;
  }
};

int layer_ratio(int l) { return l < 2 ? 1 : (l % 2 == 0 ? 4 : 128); }

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One DS4 decode step: GatherDecode::run's requests per layer, each workspace released at the
// layer's end. `sizes` (optional) gets each layer's workspace bytes.
struct Ds4Step {
  Arena& arena;
  Device& dev;
  const Options& opt;
  ds4::Sizing sizing;
  ds4::LayerConfig cfg[3];
  ds4::Ds4Symbols syms;
  std::vector<std::vector<std::uint64_t>>* sizes = nullptr;

  Ds4Step(Arena& a, Device& d, const Options& o, ds4::Sizing s, const ds4::LayerConfig (&c)[3])
      : arena(a), dev(d), opt(o), sizing(s), cfg{c[0], c[1], c[2]}, syms(c[1]) {}

  void operator()(const Bindings& b) {
    const Stream s = dev.stream(0);
    const int R = static_cast<int>(b.value(syms.requests));
    const StaticQueryBound swa_bound{Extent(syms.window)};
    for (int l = 0; l < opt.layers; ++l) {
      const ds4::LayerConfig& c = cfg[layer_ratio(l) == 1 ? 0 : (layer_ratio(l) == 4 ? 1 : 2)];
      const int r = c.ratio;
      const Symbol W = syms.window;
      const Extent n_c = r > 1 ? max_over(syms.seq_lens, [&](const Extent& x) { return floor_div(x, r); }) : Extent(0);
      const Extent g = max_over(syms.seq_lens, [&](const Extent& x) { return min(x, Extent(W)); });
      const std::int64_t N = arena.dimension(s, "ds4.kv.compressed_rows", n_c, ds4::compressed_rows_policy(sizing), b);
      const std::int64_t G = arena.dimension(s, "ds4.kv.swa_rows", g, ds4::swa_rows_policy(sizing, swa_bound), b);
      const int width = c.combined_width();
      const int splits = ds4::cuda::choose_splits(R, c.heads, width, opt.sms);
      auto kv = arena.request(s, "ds4.kv", Extent(syms.requests) * (N + G) * ds4::kHeadDim, 2, capacity_bound, b);
      auto idx = arena.request(s, "ds4.combined_indices", Extent(syms.requests) * width, 4, capacity_bound, b);
      auto lens = arena.request(s, "ds4.combined_lens", Extent(syms.requests), 4, capacity_bound, b);
      auto scratch = arena.request(s, "ds4.attention_scratch",
                                   static_cast<std::int64_t>(ds4::cuda::sparse_attention_scratch_bytes(R, c.heads, splits)),
                                   1, capacity_bound, b);
      for (const Workspace* w : {&idx, &lens, &kv, &scratch}) dev.touch(*w, 0);
      if (sizes) sizes->back().push_back(kv.bytes() + idx.bytes() + lens.bytes() + scratch.bytes());
    }  // each layer's workspaces are released here
  }
};

// Transformer-like step on two streams: per layer, attention on stream 0 and an MLP branch forked
// to stream 1, joined back; sizes vary by layer.
void synthetic_2stream(Arena& arena, Device& dev, const Bindings& b, int layers) {
  std::uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::int64_t>((x >> 33) % 1000);
  };
  for (int l = 0; l < layers; ++l) {
    auto qkv = arena.request(dev.stream(0), "qkv", (4 + next()) << 12, 1, capacity_bound, b);
    dev.touch(qkv, 0);
    dev.join(0, 1);
    auto mlp = arena.request(dev.stream(1), "mlp.up", (8 + next()) << 13, 1, capacity_bound, b);
    dev.touch(mlp, 1);
    auto attn = arena.request(dev.stream(0), "attn.scratch", (2 + next()) << 12, 1, capacity_bound, b);
    dev.touch(attn, 0);
    {
      auto act = arena.request(dev.stream(1), "mlp.act", (1 + next()) << 12, 1, capacity_bound, b);
      dev.touch(act, 1);
    }
    qkv.reset();
    attn.reset();
    mlp.reset();
    dev.join(1, 0);
  }
}

std::string show(double bytes) {
  char buf[32];
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1ull << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1ull << 20));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  opt.command = bench::command_line(argc, argv);
  CLI::App app("capture_memory_bench: graph memory against its lower bound, the estimate and PyTorch's graph pool",
               "capture_memory_bench");
  app.add_flag("--host", opt.host, "the host backend (the CPU twin, smaller shapes)");
  app.add_option("--json", opt.json, "write the records to this file");
  app.add_option("--pattern", opt.pattern, "write the DS4 allocation pattern for bench/torch_capture_pool.py");
  app.add_option("--torch", opt.torch, "PyTorch's graph pool on the pattern (bench/torch_capture_pool.py --json)")
      ->check(CLI::ExistingFile);
  app.add_option("--layers", opt.layers, "DS4 layers per decode step")->check(CLI::Range(1, 1024));
  const CLI::Option* max_len = app.add_option("--max-model-len", opt.max_model_len, "max_model_len (--host: 8192)")
                                   ->check(CLI::Range(256, 1 << 24));
  app.add_option("--sms", opt.sms, "SMs the split-K scratch is sized for (default: the device's)")
      ->check(CLI::Range(1, 4096));
  if (const auto code = bench::parse_command_line(app, argc, argv, opt.json)) return *code;
  // The torch script's JSON ({"reserved_bytes": N, ...}), read before the run so a bad file stops it.
  double torch_bytes = 0;
  if (!opt.torch.empty()) {
    try {
      torch_bytes = bench::read_json_number(opt.torch, "reserved_bytes");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "capture_memory_bench: --torch: %s\n", e.what());
      return 2;
    }
  }
  if (opt.host && max_len->count() == 0) opt.max_model_len = 8192;  // host memory is shared: lean shapes
  Device dev(opt.host);
  if (opt.sms == 0) opt.sms = opt.host ? 132 : ds4::cuda::device_sm_count();
  const std::string machine = dev.machine();
  std::vector<bench::Record> recs;
  double worst_estimate_error = 0;
  std::string worst_estimate_name;

  ds4::LayerConfig cfg[3];
  for (int t = 0; t < 3; ++t) {
    cfg[t].ratio = t == 0 ? 1 : (t == 1 ? 4 : 128);
    cfg[t].max_model_len = opt.max_model_len;
    cfg[t].heads = opt.heads;
  }
  const std::vector<int> buckets{64, 32, 16, 8};  // largest first, as engines capture
  const std::string ds4_tag = "capture_memory.ds4_" + std::to_string(opt.layers) + "L.";
  std::uint64_t safe_region = 0;
  std::string pattern;  // JSON for bench/torch_capture_pool.py
  std::printf("capture_memory_bench on %s: DS4 %d layers, buckets 64/32/16/8, max_model_len %d\n", machine.c_str(),
              opt.layers, opt.max_model_len);
  std::printf("%-10s %12s %12s %10s %12s %9s %12s %11s %11s\n", "policy", "region", "peak live", "region/pk",
              "estimate", "est. err", "sum of ws", "capture ms", "estim. ms");
  for (auto [name, sizing] : {std::pair{"safe", ds4::Sizing::safe}, std::pair{"capacity", ds4::Sizing::capacity},
                              std::pair{"exact", ds4::Sizing::exact}}) {
    ArenaOptions ao;
    ao.report_findings = false;
    Arena arena(*dev.backend, ao);
    Ds4Step step(arena, dev, opt, sizing, cfg);
    std::vector<Bindings> bs;
    for (int R : buckets) {
      std::vector<std::int32_t> lens(static_cast<std::size_t>(R));
      for (int b = 0; b < R; ++b) lens[static_cast<std::size_t>(b)] = std::min(opt.max_model_len, 1000 + 977 * b);
      bs.push_back(step.syms.bind(R, cfg[1], lens));
    }
    CaptureFamily fam = arena.family("decode");
    auto t0 = std::chrono::steady_clock::now();
    const CaptureEstimate est = estimate(arena, dev.stream(0), std::span<const Bindings>(bs), step, {.family = fam});
    const double est_ms = ms_since(t0);
    arena.reserve(est.region_bytes, dev.stream(0));
    std::vector<CapturedGraph> graphs;
    std::vector<std::vector<std::uint64_t>> sizes;
    step.sizes = &sizes;
    t0 = std::chrono::steady_clock::now();
    std::uint64_t sum_requests = 0;
    for (const Bindings& b : bs) {
      sizes.emplace_back();
      graphs.push_back(capture(arena, dev.stream(0), b, step, {.family = fam}));
      std::uint64_t sum = 0;
      for (const auto& e : graphs.back().plan().entries()) sum += (e.bytes + 255) / 256 * 256;
      sum_requests = std::max(sum_requests, sum);
    }
    const double cap_ms = ms_since(t0);
    const double region = static_cast<double>(fam.region_bytes());
    const double peak = static_cast<double>(fam.peak_live_bytes());
    const double err = std::fabs(static_cast<double>(est.region_bytes) - region) / region;
    if (err >= worst_estimate_error) {
      worst_estimate_error = err;
      worst_estimate_name = name;
    }
    std::printf("%-10s %12s %12s %10.4f %12s %9.2e %12s %11.1f %11.1f\n", name, show(region).c_str(), show(peak).c_str(),
                region / peak, show(static_cast<double>(est.region_bytes)).c_str(), err,
                show(static_cast<double>(sum_requests)).c_str(), cap_ms, est_ms);
    const std::string p = ds4_tag + name + ".";
    recs.push_back({p + "region_over_peak_live", region / peak, "x"});
    recs.push_back({p + "region_bytes", region, "B", p + "peak_live_bytes", peak});
    recs.push_back({p + "peak_live_bytes", peak, "B"});
    recs.push_back({p + "estimate_bytes", static_cast<double>(est.region_bytes), "B", p + "region_bytes", region});
    recs.push_back({p + "sum_of_workspaces_bytes", static_cast<double>(sum_requests), "B", p + "region_bytes", region});
    recs.push_back({p + "capture_ms", cap_ms, "ms"});
    recs.push_back({p + "estimate_ms", est_ms, "ms", p + "capture_ms", cap_ms});
    if (std::string(name) == "safe") {
      safe_region = fam.region_bytes();
      std::ostringstream os;
      os << "{\"policy\": \"" << name << "\", \"layers\": " << opt.layers << ", \"max_model_len\": " << opt.max_model_len
         << ", \"graphsafe_region_bytes\": " << safe_region << ", \"graphsafe_peak_live_bytes\": " << fam.peak_live_bytes()
         << ", \"buckets\": [";
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        os << (i ? ", " : "") << "{\"batch\": " << buckets[i] << ", \"layer_bytes\": [";
        for (std::size_t l = 0; l < sizes[i].size(); ++l) os << (l ? ", " : "") << sizes[i][l];
        os << "]}";
      }
      os << "]}\n";
      pattern = os.str();
    }
    graphs.clear();
  }

  {
    // Synthetic: two streams, fork / join per layer; re-captured once so the offline packing applies.
    Arena arena(*dev.backend, ArenaOptions{.report_findings = false});
    Bindings b;
    auto fn = [&](const Bindings& bb) { synthetic_2stream(arena, dev, bb, 48); };
    CaptureFamily fam = arena.family("synthetic");
    const CaptureEstimate est = estimate(arena, dev.stream(0), b, fn, {.family = fam});
    arena.reserve(est.region_bytes, dev.stream(0));
    auto g = capture(arena, dev.stream(0), b, fn, {.family = fam});
    const double region = static_cast<double>(g.plan().bytes());
    const double peak = static_cast<double>(g.plan().peak_live_bytes());
    const double err = std::fabs(static_cast<double>(est.region_bytes) - region) / region;
    if (err >= worst_estimate_error) {
      worst_estimate_error = err;
      worst_estimate_name = "synthetic_2stream";
    }
    std::printf("%-10s %12s %12s %10.4f %12s %9.2e   (synthetic, 2 streams, 48 layers)\n", "2stream", show(region).c_str(),
                show(peak).c_str(), region / peak, show(static_cast<double>(est.region_bytes)).c_str(), err);
    recs.push_back({"capture_memory.synthetic_2stream.region_over_peak_live", region / peak, "x"});
    recs.push_back({"capture_memory.synthetic_2stream.region_bytes", region, "B",
                    "capture_memory.synthetic_2stream.peak_live_bytes", peak});
  }
  recs.push_back({"capture_memory.estimate_relative_error", worst_estimate_error, "fraction"});
  std::printf("estimate: largest relative error %.3g (%s)\n", worst_estimate_error, worst_estimate_name.c_str());

  if (!opt.pattern.empty()) {
    std::ofstream f(opt.pattern);
    f << pattern;
    std::printf("pattern for bench/torch_capture_pool.py: %s\n", opt.pattern.c_str());
  }
  if (!opt.torch.empty()) {
    std::printf("PyTorch graph pool on the same pattern: %s reserved; graphsafe (safe): %s -> %.4fx\n",
                show(torch_bytes).c_str(), show(static_cast<double>(safe_region)).c_str(),
                static_cast<double>(safe_region) / torch_bytes);
    recs.push_back({ds4_tag + "region_over_torch_graph_pool", static_cast<double>(safe_region) / torch_bytes, "x"});
    recs.push_back({ds4_tag + "safe.region_bytes_vs_torch", static_cast<double>(safe_region), "B",
                    "torch.cuda.graph_pool.reserved_bytes", torch_bytes});
  }
  if (!opt.json.empty()) {
    bench::write_records(opt.json, recs, machine, opt.command);
  }
  return 0;
}
