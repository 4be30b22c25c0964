// capture_time_bench: host time of capturing graphs (requests placed, graph ended and instantiated),
// on the CUDA backend and on the host backend, against the same benchmark built on an earlier tree.
//
//   build/bench/capture_time_bench --raw now.txt                       # one "case ms" line per case
//   bash bench/capture_time_before.sh /tmp/before                      # the same source, earlier tree
//   /tmp/before/build/capture_time_bench --raw before.txt
//   build/bench/capture_time_bench --before before.txt --json bench/results/capture_time_bench.json
//
// Cases, each the median over --reps repetitions:
//   ds4_43L_4buckets: a DS4-like decode step (43 layers: C1, C1, then C4 / C128 alternating), per
//     layer two sized dimensions and four workspaces (kv, combined indices, lengths, split-K
//     scratch) each used by a kernel and released at the layer's end; four bucket graphs
//     (64, 32, 16, 8, largest first) captured into one family.
//   many_requests_4096: 4096 requests on one stream, a window of 32 live workspaces of varied sizes
//     released oldest first, each used by a kernel.
// Both run on the CUDA backend (kernels) and on the host backend (host closures) unless --host-only.
//
// The source compiles against trees older than bench_support: with GRAPHSAFE_CAPTURE_TIME_RAW_ONLY
// defined it writes --raw only. Without it, --json writes bench/results records: the time of each
// case with the earlier tree's time as baseline, and capture_time.<backend>.<case>.ratio_vs_before
// (now / before; below 1 is faster).
#include <graphsafe/graphsafe.hpp>

#ifndef GRAPHSAFE_CAPTURE_TIME_RAW_ONLY
#include "bench_support.hpp"
#endif

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace graphsafe;

namespace {

__global__ void touch_kernel(unsigned char* p, std::uint64_t n) {
  if (threadIdx.x == 0 && n) p[n - 1] = 0;
}

struct Device {
  bool host = false;
  std::unique_ptr<Backend> backend;
  HostStream hs;
  cudaStream_t cs = nullptr;
  explicit Device(bool h) : host(h) {
    if (host) {
      backend = std::make_unique<HostBackend>();
    } else {
      backend = std::make_unique<CudaBackend>();
      GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    }
  }
  ~Device() {
    if (cs) cudaStreamDestroy(cs);
  }
  Stream stream() { return host ? Stream(hs) : Stream(cs); }
  void touch(const Workspace& w) {
    if (!w.bytes()) return;
    if (host) {
      auto* p = static_cast<unsigned char*>(w.data());
      const std::uint64_t n = w.bytes();
      hs.launch([p, n] { p[n - 1] = 0; });
    } else {
      touch_kernel<<<1, 32, 0, cs>>>(w.as<unsigned char>(), w.bytes());
      GRAPHSAFE_CUDA(cudaGetLastError());
    }
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Ds4Symbols {
  Symbol requests = Symbol::fixed("bench.ds4.requests");
  Symbol seq_lens;
  Symbol window = Symbol::fixed("bench.ds4.window");
  explicit Ds4Symbols(std::int64_t max_len) : seq_lens(Symbol::batch("bench.ds4.seq_lens", requests, max_len)) {}
};

int layer_ratio(int l) { return l < 2 ? 1 : (l % 2 == 0 ? 4 : 128); }

// One DS4-like decode step: each layer's workspaces are released at the layer's end.
void ds4_step(Arena& arena, Device& dev, const Ds4Symbols& sy, const Bindings& b, int layers) {
  const Stream s = dev.stream();
  for (int l = 0; l < layers; ++l) {
    const int r = layer_ratio(l);
    const Extent n_c = r > 1 ? max_over(sy.seq_lens, [&](const Extent& x) { return floor_div(x, Extent(r)); }) : Extent(0);
    const Extent g = max_over(sy.seq_lens, [&](const Extent& x) { return min(x, Extent(sy.window)); });
    const std::int64_t N = arena.dimension(s, "ds4.kv.compressed_rows", n_c, capacity_bound, b);
    const std::int64_t G = arena.dimension(s, "ds4.kv.swa_rows", g, capacity_bound, b);
    const std::int64_t width = (r == 1 ? 0 : (r == 4 ? 512 : 64)) + 128;
    auto kv = arena.request(s, "ds4.kv", Extent(sy.requests) * (N + G) * 512, 2, capacity_bound, b);
    auto idx = arena.request(s, "ds4.combined_indices", Extent(sy.requests) * width, 4, capacity_bound, b);
    auto lens = arena.request(s, "ds4.combined_lens", Extent(sy.requests), 4, capacity_bound, b);
    auto scratch = arena.request(s, "ds4.attention_scratch", Extent(sy.requests) * 64 * 516, 4, capacity_bound, b);
    for (const Workspace* w : {&idx, &lens, &kv, &scratch}) dev.touch(*w);
  }
}

// Many requests on one stream: a window of 32 live workspaces, the oldest released first.
void many_requests(Arena& arena, Device& dev, const Bindings& b, int n) {
  const Stream s = dev.stream();
  std::vector<Workspace> window;
  std::uint64_t x = 12345;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const std::int64_t bytes = static_cast<std::int64_t>(1 + (x >> 33) % 64) << 12;
    window.push_back(arena.request(s, "synthetic", Extent(bytes), 1, capacity_bound, b));
    dev.touch(window.back());
    if (window.size() == 32) window.erase(window.begin());
  }
}

struct Options {
  int reps = 5;
  int layers = 43;
  int requests = 4096;
  int reserve_mib = 3072;
  bool host_only = false;
  std::string raw, before, json;
};

std::map<std::string, double> run(Device& dev, const Options& opt) {
  std::map<std::string, double> out;
  const std::string tag = dev.host ? "host." : "cuda.";
  Ds4Symbols sy(1024);  // capture time, not memory: lean shapes (the earlier tree sums every workspace)
  const std::vector<int> buckets{64, 32, 16, 8};
  std::vector<Bindings> binds;
  for (int B : buckets) {
    Bindings b;
    b.set(sy.requests, B).set(sy.window, 128).set(sy.seq_lens, std::vector<std::int64_t>(static_cast<std::size_t>(B), 1024));
    binds.push_back(b);
  }
  // One arena, reserved once (the earlier tree keeps every request's bytes: ~1 GiB for the DS4 step);
  // each repetition captures into a new family, so no layout of an earlier one is followed.
  Arena arena(*dev.backend, ArenaOptions{.report_findings = false});
  arena.reserve(static_cast<std::uint64_t>(opt.reserve_mib) << 20, dev.stream());
  std::vector<double> t;
  for (int rep = 0; rep < opt.reps + 1; ++rep) {  // the first repetition warms up
    CaptureFamily fam = arena.family("ds4");
    std::vector<CapturedGraph> graphs;
    const auto t0 = std::chrono::steady_clock::now();
    for (const Bindings& b : binds) {
      CaptureOptions co;
      co.family = fam;
      graphs.push_back(capture(arena, dev.stream(), b, [&](const Bindings& bb) { ds4_step(arena, dev, sy, bb, opt.layers); }, co));
    }
    const double ms = ms_since(t0);
    if (rep) t.push_back(ms);
    graphs.clear();
    dev.backend->synchronize(dev.stream());
  }
  out[tag + "ds4_" + std::to_string(opt.layers) + "L_4buckets"] = median(t);
  t.clear();
  for (int rep = 0; rep < opt.reps + 1; ++rep) {
    Bindings b;
    const auto t0 = std::chrono::steady_clock::now();
    auto g = capture(arena, dev.stream(), b, [&](const Bindings& bb) { many_requests(arena, dev, bb, opt.requests); });
    const double ms = ms_since(t0);
    if (rep) t.push_back(ms);
    dev.backend->synchronize(dev.stream());
  }
  out[tag + "many_requests_" + std::to_string(opt.requests)] = median(t);
  return out;
}

std::string machine_name(bool have_gpu) {
  if (!have_gpu) return "host (CPU, HostBackend)";
  cudaDeviceProp prop{};
  int dev = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  return prop.name;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "capture_time_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto count = [&](int lo, int hi) {
      const std::string v = value();
      int n = 0;
      try {
        n = std::stoi(v);
      } catch (...) {
        n = lo - 1;
      }
      if (n < lo || n > hi) {
        std::fprintf(stderr, "capture_time_bench: %s %s is out of range [%d, %d]\n", a.c_str(), v.c_str(), lo, hi);
        std::exit(2);
      }
      return n;
    };
    if (a == "--reps") opt.reps = count(1, 1000);
    else if (a == "--layers") opt.layers = count(1, 1000);
    else if (a == "--requests") opt.requests = count(1, 1 << 20);
    else if (a == "--reserve-mib") opt.reserve_mib = count(64, 1 << 20);
    else if (a == "--host-only") opt.host_only = true;
    else if (a == "--raw") opt.raw = value();
    else if (a == "--before") opt.before = value();
    else if (a == "--json") opt.json = value();
    else {
      std::fprintf(stderr,
                   "usage: capture_time_bench [--reps 5] [--layers 43] [--requests 4096] [--reserve-mib 3072] [--host-only]\n"
                   "                          [--raw out.txt] [--before before.txt] [--json out.json]\n");
      return 2;
    }
  }
  int devices = 0;
  const bool have_gpu = !opt.host_only && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  std::map<std::string, double> now;
  {
    Device host(true);
    now = run(host, opt);
  }
  if (have_gpu) {
    Device cuda(false);
    for (auto& [k, v] : run(cuda, opt)) now[k] = v;
  }
  std::map<std::string, double> before;
  if (!opt.before.empty()) {
    std::ifstream in(opt.before);
    if (!in) {
      std::fprintf(stderr, "capture_time_bench: cannot read --before %s\n", opt.before.c_str());
      return 2;
    }
    std::string k;
    double v;
    while (in >> k >> v) before[k] = v;
  }
  std::printf("capture_time_bench on %s (median of %d)\n%-36s %12s %12s %8s\n", machine_name(have_gpu).c_str(), opt.reps,
              "case", "ms", "before ms", "ratio");
  for (auto& [k, v] : now) {
    auto b = before.find(k);
    if (b != before.end())
      std::printf("%-36s %12.3f %12.3f %8.2f\n", k.c_str(), v, b->second, v / b->second);
    else
      std::printf("%-36s %12.3f %12s %8s\n", k.c_str(), v, "-", "-");
  }
  if (!opt.raw.empty()) {
    std::ofstream out(opt.raw);
    for (auto& [k, v] : now) out << k << " " << v << "\n";
    if (!out) {
      std::fprintf(stderr, "capture_time_bench: cannot write --raw %s\n", opt.raw.c_str());
      return 1;
    }
  }
#ifndef GRAPHSAFE_CAPTURE_TIME_RAW_ONLY
  if (!opt.json.empty()) {
    std::vector<bench::Record> recs;
    for (auto& [k, v] : now) {
      auto b = before.find(k);
      if (b == before.end()) {
        recs.push_back({"capture_time." + k, v, "ms", "", 0, std::nullopt});
        continue;
      }
      recs.push_back({"capture_time." + k, v, "ms", "capture_time." + k + ".before_reuse", b->second, std::nullopt});
      recs.push_back({"capture_time." + k + ".ratio_vs_before", v / b->second, "x", "", 0, std::nullopt});
    }
    bench::write_records(opt.json, recs, machine_name(have_gpu), bench::command_line(argc, argv));
  }
#else
  if (!opt.json.empty()) {
    std::fprintf(stderr, "capture_time_bench: built without bench records (--raw only)\n");
    return 2;
  }
#endif
  return 0;
}
