// arena_bench: host-side costs of graphsafe on a real GPU, each next to the CUDA figure it replaces
// or is paid next to, measured in the same run.
//
//   (a) eager workspace pair: arena request+release vs cudaMallocAsync+cudaFreeAsync on the same
//       stream, same sizes (256 B .. 16 MiB mix); also the raw allocate/deallocate path and the
//       Extent-sized request path (a 64-request sum_over extent evaluated per request).
//   (b) replay guard check of a 43-layer DS4-style plan (4 requests per layer over C1/C4/C128 layer
//       types, B = 64, seq_lens batch symbol): plan.check(bindings) with every guard discharged
//       (capacity-bound compressed rows, static-query-bound SWA rows) and with live guards
//       (exact-at-capture), vs the host time of cudaGraphLaunch of the captured 172-kernel graph.
//   (c) capture-state check per request: default options vs always_check_capture.
//
// Usage: arena_bench [--json out.json] [--quick]
// JSON: an array of {"name","value","unit","baseline_name","baseline_value","ratio","machine","command"};
// ratio = baseline_value / value (how many times cheaper than the baseline), null without baseline.
#include <graphsafe/graphsafe.hpp>

#include "bench_support.hpp"

#include <CLI/CLI.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace graphsafe;
namespace bench = graphsafe::bench;

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int samples = 101;  // medians over this many samples
  int batch = 1000;   // operations per sample (per-op time = sample time / batch)
  int launches = 2000;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median over samples of (time of `batch` calls of op(i)) / batch, in ns. `between` runs untimed
// after each sample (stream syncs, so queued GPU work never piles up).
template <class Op, class Between>
double per_op_ns(const Config& c, Op&& op, Between&& between) {
  std::vector<double> t;
  t.reserve(c.samples);
  std::uint64_t i = 0;
  for (int w = 0; w < 3; ++w) {  // warm-up samples
    for (int k = 0; k < c.batch; ++k) op(i++);
    between();
  }
  for (int s = 0; s < c.samples; ++s) {
    const auto t0 = Clock::now();
    for (int k = 0; k < c.batch; ++k) op(i++);
    const auto t1 = Clock::now();
    t.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / c.batch);
    between();
  }
  return median(std::move(t));
}

__global__ void touch_kernel(int* p, int v) {
  if (threadIdx.x == 0 && p) p[0] = v;
}

// ---- (b) the DS4-style plan ---------------------------------------------------------------------

constexpr int kLayers = 43;
constexpr int kBatch = 64;
constexpr int kMaxModelLen = 16384;
constexpr int kWindow = 128;

struct Ds4Syms {
  Symbol B = Symbol::fixed("batch");
  Symbol W = Symbol::fixed("window");
  Symbol L = Symbol::batch("seq_lens", B, kMaxModelLen);
};

// One decode step: per layer the compressed-row and SWA-row dimensions plus the gathered KV and the
// combined-index workspaces (4 requests), each followed by a tiny kernel (4 kernels per layer).
void ds4_step(Arena& arena, cudaStream_t s, const Ds4Syms& y, const Bindings& b, bool exact) {
  const StaticQueryBound swa_bound(Extent(y.W));  // one query token per request: G <= W
  static const int ratios[3] = {1, 4, 128};      // C1 / C4 / C128 layer types
  for (int layer = 0; layer < kLayers; ++layer) {
    const int r = ratios[layer % 3];
    const Extent n_c = max_over(y.L, [&](const Extent& l) { return floor_div(l, r); });
    const Extent g = max_over(y.L, [&](const Extent& l) { return min(l, Extent(y.W)); });
    const SizingPolicy& cmp = exact ? static_cast<const SizingPolicy&>(exact_at_capture)
                                    : static_cast<const SizingPolicy&>(capacity_bound);
    const SizingPolicy& swa = exact ? static_cast<const SizingPolicy&>(exact_at_capture)
                                    : static_cast<const SizingPolicy&>(swa_bound);
    const std::int64_t N = arena.dimension(s, "ds4.kv.compressed_rows", n_c, cmp, b);
    const std::int64_t G = arena.dimension(s, "ds4.kv.swa_rows", g, swa, b);
    auto kv = arena.request(s, "ds4.kv", Extent(y.B) * (N + G), 2, capacity_bound, b);
    auto idx = arena.request(s, "ds4.combined_indices", Extent(y.B) * (N + G), 4, capacity_bound, b);
    int* p = kv.as<int>();
    int* q = idx.as<int>();
    touch_kernel<<<1, 32, 0, s>>>(p, layer);
    touch_kernel<<<1, 32, 0, s>>>(p, static_cast<int>(N));
    touch_kernel<<<1, 32, 0, s>>>(q, layer);
    touch_kernel<<<1, 32, 0, s>>>(q, static_cast<int>(G));
    GRAPHSAFE_CUDA(cudaGetLastError());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  Config cfg;
  const std::string command = bench::command_line(argc, argv);
  CLI::App app("arena_bench: host-side costs of graphsafe next to the CUDA calls they replace", "arena_bench");
  app.add_option("--json", json_path, "write the records to this file");
  bool quick = false;
  app.add_flag("--quick", quick, "fewer samples (a smoke run)");
  if (const auto code = bench::parse_command_line(app, argc, argv, json_path)) return *code;
  if (quick) {
    cfg.samples = 21;
    cfg.batch = 200;
    cfg.launches = 300;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no usable CUDA device\n");
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    int dev = 0;
    GRAPHSAFE_CUDA(cudaGetDevice(&dev));
    GRAPHSAFE_CUDA(cudaGetDeviceProperties(&prop, dev));
    const std::string machine = prop.name;
    cudaStream_t s = nullptr;
    GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto sync = [&] { GRAPHSAFE_CUDA(cudaStreamSynchronize(s)); };
    std::vector<bench::Record> rec;

    // ---- (a) eager pairs ------------------------------------------------------------------------
    std::mt19937_64 rng(2024);
    constexpr int kSizes = 64;
    std::vector<std::uint64_t> sizes(kSizes);
    for (auto& z : sizes) {  // log-uniform in [256 B, 16 MiB]
      const double e = std::uniform_real_distribution<double>(8.0, 24.0)(rng);
      z = std::min<std::uint64_t>(16ull << 20, std::max<std::uint64_t>(256, static_cast<std::uint64_t>(std::exp2(e))));
    }
    std::vector<Extent> const_extents;
    for (auto z : sizes) const_extents.emplace_back(static_cast<std::int64_t>(z));

    CudaBackend backend;
    Arena arena(backend, ArenaOptions{.report_findings = false});
    arena.reserve(256ull << 20, s);
    sync();
    const Bindings none;
    volatile std::uintptr_t sink = 0;

    const double arena_pair = per_op_ns(
        cfg,
        [&](std::uint64_t i) {
          auto ws = arena.request(s, "bench", const_extents[i % kSizes], 1, capacity_bound, none);
          sink = sink + reinterpret_cast<std::uintptr_t>(ws.data());
          ws.reset();
        },
        sync);
    const double raw_pair = per_op_ns(
        cfg,
        [&](std::uint64_t i) {
          const std::uint64_t z = sizes[i % kSizes];
          void* p = arena.allocate(s, z);
          sink = sink + reinterpret_cast<std::uintptr_t>(p);
          arena.deallocate(s, p, z);
        },
        sync);
    // Extent-sized: rows = sum_b ceil(L[b] / 4) over 64 requests, bytes per row 656 (sizes up to
    // ~11 MiB), evaluated from 16 prepared bindings.
    Ds4Syms y;
    const Extent rows = sum_over(y.L, [](const Extent& l) { return ceil_div(l, 4); });
    std::vector<Bindings> eager_bindings(16);
    for (auto& eb : eager_bindings) {
      std::vector<std::int64_t> lens(kBatch);
      for (auto& l : lens) l = 1 + static_cast<std::int64_t>(rng() % kMaxModelLen) / (1 + rng() % 64);
      eb.set(y.B, kBatch).set(y.W, kWindow).set(y.L, std::span<const std::int64_t>(lens));
    }
    const double extent_pair = per_op_ns(
        cfg,
        [&](std::uint64_t i) {
          auto ws = arena.request(s, "bench.rows", rows, 656, exact_at_capture, eager_bindings[i % 16]);
          sink = sink + reinterpret_cast<std::uintptr_t>(ws.data());
          ws.reset();
        },
        sync);

    // CUDA's stream-ordered allocator, same sizes, same stream. The default pool keeps its memory
    // (release threshold max), as any serving engine configures it.
    cudaMemPool_t default_pool = nullptr;
    GRAPHSAFE_CUDA(cudaDeviceGetDefaultMemPool(&default_pool, dev));
    std::uint64_t threshold = ~0ull;
    GRAPHSAFE_CUDA(cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    const double cuda_pair = per_op_ns(
        cfg,
        [&](std::uint64_t i) {
          void* p = nullptr;
          GRAPHSAFE_CUDA(cudaMallocAsync(&p, sizes[i % kSizes], s));
          sink = sink + reinterpret_cast<std::uintptr_t>(p);
          GRAPHSAFE_CUDA(cudaFreeAsync(p, s));
        },
        sync);
    rec.push_back({"eager_pair.arena_request_release", arena_pair, "ns", "eager_pair.cudaMallocAsync_cudaFreeAsync",
                   cuda_pair});
    rec.push_back({"eager_pair.arena_allocate_deallocate", raw_pair, "ns", "eager_pair.cudaMallocAsync_cudaFreeAsync",
                   cuda_pair});
    rec.push_back({"eager_pair.arena_extent_request_release", extent_pair, "ns",
                   "eager_pair.cudaMallocAsync_cudaFreeAsync", cuda_pair});
    rec.push_back({"eager_pair.cudaMallocAsync_cudaFreeAsync", cuda_pair, "ns", "", 0});

    // ---- (b) guard check of a 43-layer plan vs cudaGraphLaunch -------------------------------------
    std::vector<std::int64_t> lens(kBatch);
    for (int b = 0; b < kBatch; ++b) lens[b] = 1 + (b * 977) % 4096;
    Bindings bind;
    bind.set(y.B, kBatch).set(y.W, kWindow).set(y.L, std::span<const std::int64_t>(lens));
    auto safe_graph = capture(arena, s, bind, [&](const Bindings& bb) { ds4_step(arena, s, y, bb, false); });
    auto exact_graph = capture(arena, s, bind, [&](const Bindings& bb) { ds4_step(arena, s, y, bb, true); });
    const Plan& safe_plan = safe_graph.plan();
    const Plan& exact_plan = exact_graph.plan();
    if (safe_plan.guard_count() != 0 || exact_plan.guard_count() == 0 || !safe_plan.check(bind).empty() ||
        !exact_plan.check(bind).empty()) {
      std::fprintf(stderr, "arena_bench: unexpected plans (safe guards %zu, exact guards %zu)\n",
                   safe_plan.guard_count(), exact_plan.guard_count());
      return 1;
    }
    std::size_t kernels = 0;
    {
      std::size_t nodes = 0;
      GRAPHSAFE_CUDA(cudaGraphGetNodes(static_cast<cudaGraph_t>(safe_graph.handle().graph), nullptr, &nodes));
      kernels = nodes;
    }
    volatile std::size_t vsink = 0;
    auto nothing = [] {};
    const double check_safe = per_op_ns(cfg, [&](std::uint64_t) { vsink = vsink + safe_plan.check(bind).size(); }, nothing);
    const double check_exact =
        per_op_ns(cfg, [&](std::uint64_t) { vsink = vsink + exact_plan.check(bind).size(); }, nothing);
    // cudaGraphLaunch host time: one launch per sample on an idle stream (synchronized, untimed).
    const auto exec = static_cast<cudaGraphExec_t>(safe_graph.handle().exec);
    auto time_each = [&](auto&& op) {
      std::vector<double> t;
      for (int i = 0; i < 20; ++i) {
        op();
        sync();
      }
      for (int i = 0; i < cfg.launches; ++i) {
        const auto t0 = Clock::now();
        op();
        const auto t1 = Clock::now();
        t.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
        sync();
      }
      return median(std::move(t));
    };
    const double launch = time_each([&] { GRAPHSAFE_CUDA(cudaGraphLaunch(exec, s)); });
    const double replay_safe = time_each([&] { safe_graph.replay(bind, s); });
    const double replay_exact = time_each([&] { exact_graph.replay(bind, s); });
    rec.push_back({"guard_check.43_layers.discharged", check_safe, "ns", "cudaGraphLaunch.host", launch});
    rec.push_back({"guard_check.43_layers.live_exact", check_exact, "ns", "cudaGraphLaunch.host", launch});
    rec.push_back({"cudaGraphLaunch.host", launch, "ns", "", 0});
    rec.push_back({"replay.guarded_host.discharged", replay_safe, "ns", "cudaGraphLaunch.host", launch});
    rec.push_back({"replay.guarded_host.live_exact", replay_exact, "ns", "cudaGraphLaunch.host", launch});

    // ---- (c) capture-state check per request ---------------------------------------------------------
    Arena checked(backend, ArenaOptions{.report_findings = false, .always_check_capture = true});
    checked.reserve(64ull << 20, s);
    Arena plain(backend, ArenaOptions{.report_findings = false});
    plain.reserve(64ull << 20, s);
    sync();
    const Extent fixed_4k(std::int64_t(4096));
    auto pair_on = [&](Arena& a) {
      return per_op_ns(
          cfg,
          [&](std::uint64_t) {
            auto ws = a.request(s, "bench.check", fixed_4k, 1, capacity_bound, none);
            sink = sink + reinterpret_cast<std::uintptr_t>(ws.data());
            ws.reset();
          },
          sync);
    };
    const double pair_plain = pair_on(plain);
    const double pair_checked = pair_on(checked);
    const double capture_info = per_op_ns(
        cfg, [&](std::uint64_t) { vsink = vsink + (backend.capture_info(s).active ? 1 : 0); }, nothing);
    rec.push_back({"capture_check.request_pair.default", pair_plain, "ns", "", 0});
    rec.push_back(
        {"capture_check.request_pair.always_check_capture", pair_checked, "ns", "capture_check.request_pair.default",
         pair_plain});
    rec.push_back({"capture_check.cost_per_request", pair_checked - pair_plain, "ns", "", 0});
    rec.push_back({"capture_check.cudaStreamGetCaptureInfo", capture_info, "ns", "", 0});

    sync();
    const std::size_t plan_entries = safe_plan.entries().size();
    const std::size_t exact_guards = exact_plan.guard_count();
    const unsigned long long safe_bytes = safe_graph.reserved_bytes();
    const unsigned long long exact_bytes = exact_graph.reserved_bytes();
    // Graphs die before the arena and backend (their destructors synchronize their streams).
    {
      auto a = std::move(safe_graph);
      auto b2 = std::move(exact_graph);
    }

    // ---- report -----------------------------------------------------------------------------------
    std::printf("arena_bench on %s (median of %d samples x %d ops; launches: median of %d)\n", machine.c_str(),
                cfg.samples, cfg.batch, cfg.launches);
    std::printf("plan: %d layers, %zu entries, %zu live guards in the exact variant (identical extents share one), "
                "%zu kernels in the graph, region %llu bytes (safe) / %llu bytes (exact)\n",
                kLayers, plan_entries, exact_guards, kernels, safe_bytes, exact_bytes);
    std::printf("%-48s %12s  %-42s %12s %10s\n", "figure", "value", "baseline", "baseline", "base/value");
    for (const auto& r : rec) {
      if (r.baseline_name.empty())
        std::printf("%-48s %9.1f %-2s  %-42s %12s %10s\n", r.name.c_str(), r.value, r.unit.c_str(), "-", "-", "-");
      else
        std::printf("%-48s %9.1f %-2s  %-42s %9.1f %-2s %9.2fx\n", r.name.c_str(), r.value, r.unit.c_str(),
                    r.baseline_name.c_str(), r.baseline_value, r.unit.c_str(), r.baseline_value / r.value);
    }
    const double pair_speedup = cuda_pair / arena_pair;
    const double guard_fraction = check_exact / launch;
    std::printf("target: arena pair >= 20x faster than the CUDA pair: %.1fx -> %s\n", pair_speedup,
                pair_speedup >= 20 ? "met" : "MISSED");
    std::printf("target: guard check < 1/3 of cudaGraphLaunch host time: discharged %.3f, live %.3f of launch -> %s\n",
                check_safe / launch, guard_fraction,
                (check_safe / launch < 1.0 / 3 && guard_fraction < 1.0 / 3) ? "met" : "MISSED");

    if (!json_path.empty()) {
      bench::write_records(json_path, rec, machine, command);
      std::printf("wrote %zu records to %s\n", rec.size(), json_path.c_str());
    }
    (void)sink;
    (void)vsink;
    GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
    // Arenas and the backend go before the stream (declared after it).
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arena_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
