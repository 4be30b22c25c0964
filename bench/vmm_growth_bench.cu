// vmm_growth_bench: virtual growth over a realistic decode trace (issue 5).
//
// B = 64 requests, DS4 gather-workspace shapes for a C4 + a C128 + a C1 layer (kv [R, M, 512] bf16,
// M = N + W, N = capacity-bound compressed rows, W = 128; plus the static index/lens buffers), at
// max_model_len 64K and 1M. One graph per model length, captured at short lengths in virtual mode;
// a "touch" kernel per layer writes the first and last element of every footprint range of every
// request (reading device seq_lens), so a missing mapping faults. The trace: each slot decodes one
// token per step; a finished request (output 512..8192 tokens) is replaced by a new prompt drawn
// log-uniform in [256, max_model_len/2]. Reported per model length:
//   - physical bytes committed vs the exact need (bytes the footprints touch) and vs the granule
//     floor (the touched granules: the least any mapping at this granularity can hold), without and
//     with an explicit shrink policy (shrink to the current need every 256 steps when over target);
//   - target check: committed <= 1.10 * exact + one granule per workspace (and per request slice);
//   - the capacity-bound reservation (plan bytes) and the saving;
//   - added host time per replay (the commit step: CapturedGraph::commit, which replay() runs after
//     its guards) for steps that grow and steps that do not; replay() in virtual mode vs the same
//     graph captured in ordinary (capacity-bound, physically reserved) mode when it fits.
//
// Usage: vmm_growth_bench [--json out.json] [--steps N] [--quick]
// JSON: an array of {"name","value","unit","baseline_name","baseline_value","ratio","machine","command"}.
#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace graphsafe;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kB = 64;
constexpr int kW = 128;
constexpr int kD = 512;

struct Record {
  std::string name;
  double value = 0;
  std::string unit;
  std::string baseline_name;
  double baseline_value = 0;
};

// Writes the first and last bf16 of each touched range of request b (compressed rows [0, n_c),
// SWA rows [N, N + min(L, W))) and the combined index row length.
__global__ void touch_kernel(std::uint16_t* ws, long long N, long long M, int ratio, const int* lens, int* idx_lens) {
  const int b = blockIdx.x;
  if (threadIdx.x != 0) return;
  const int L = lens[b];
  const long long n_c = ratio > 1 ? L / ratio : 0, sl = L < kW ? L : kW;
  std::uint16_t* row0 = ws + static_cast<long long>(b) * M * kD;
  if (n_c > 0) {
    row0[0] = static_cast<std::uint16_t>(b);
    row0[n_c * kD - 1] = static_cast<std::uint16_t>(n_c);
  }
  if (sl > 0) {
    row0[N * kD] = static_cast<std::uint16_t>(L);
    row0[(N + sl) * kD - 1] = static_cast<std::uint16_t>(sl);
  }
  idx_lens[b] = static_cast<int>(n_c + sl);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "vmm_growth_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Model {
  Symbol R = Symbol::fixed("requests");
  Symbol Wsym = Symbol::fixed("window");
  Symbol L;
  explicit Model(int max_len) : L(Symbol::batch("seq_lens", R, max_len)) {}
  Bindings bind(const std::vector<int>& lens) const {
    Bindings b;
    b.set(R, kB).set(Wsym, kW).set(L, std::span<const std::int32_t>(lens.data(), lens.size()));
    return b;
  }
};

// One layer of the step: dimensions, kv with its footprint, index buffers, touch kernel.
void layer(Arena& arena, cudaStream_t s, const Model& m, int ratio, const Bindings& b, const int* d_lens,
           const StaticQueryBound& swa_bound) {
  const Extent n_c = ratio > 1 ? max_over(m.L, [&](const Extent& l) { return floor_div(l, ratio); }) : Extent(0);
  const Extent g = max_over(m.L, [&](const Extent& l) { return min(l, Extent(m.Wsym)); });
  const std::int64_t N = arena.dimension(s, "compressed_rows", n_c, capacity_bound, b);
  const std::int64_t G = arena.dimension(s, "swa_rows", g, swa_bound, b);
  const std::int64_t M = N + G;
  auto fp = Footprint::per_request_ranges(m.L, M * kD, [&](const Extent& l) {
    return std::vector<FootprintRange>{{0, ratio > 1 ? floor_div(l, ratio) * kD : Extent(0)},
                                       {N * kD, min(l, Extent(m.Wsym)) * kD}};
  });
  auto kv = arena.request(s, "kv", Extent(m.R) * M * kD, 2, capacity_bound, b, fp);
  const std::int64_t width = ((ratio == 4 ? 512 : ratio == 128 ? N : 0) + kW + 127) / 128 * 128;
  auto idx = arena.request(s, "combined_indices", Extent(m.R) * width, 4, capacity_bound, b);
  auto lens = arena.request(s, "combined_lens", Extent(m.R), 4, capacity_bound, b);
  touch_kernel<<<kB, 32, 0, s>>>(kv.as<std::uint16_t>(), N, M, ratio, d_lens, lens.as<int>());
  check(cudaGetLastError(), "touch_kernel launch");
  (void)idx;
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * (v.size() - 1) + 0.5))];
}
double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

struct TraceResult {
  std::vector<double> grow_ns, flat_ns, shrink_ms;
  double max_ratio = 0, mean_ratio = 0, max_over_floor = 0;
  double within_target = 0, within_target_req = 0;  // fractions of sampled steps
  double final_committed = 0, final_exact = 0, peak_committed = 0;
  std::uint64_t steps = 0, grow_steps = 0, chunks_created = 0, pool_hits = 0;
};

TraceResult run_trace(int max_len, int steps, bool shrink_policy, double* capacity_plan_bytes,
                      double* replay_virtual_ns, double* replay_plain_ns, bool measure_plain) {
  // Declared first so it is destroyed last: graphs and arenas below are ordered on this stream.
  struct StreamOwner {
    cudaStream_t s{};
    ~StreamOwner() { cudaStreamDestroy(s); }
  } owner;
  check(cudaStreamCreateWithFlags(&owner.s, cudaStreamNonBlocking), "stream");
  cudaStream_t s = owner.s;
  CudaBackend backend;
  auto vm = std::make_shared<CudaVirtualMemory>();
  const double G = static_cast<double>(vm->granularity());
  Arena arena(backend, ArenaOptions{.report_findings = false, .virtual_memory = vm});
  Model m(max_len);
  StaticQueryBound swa_bound{Extent(m.Wsym)};
  int* d_lens = nullptr;
  check(cudaMalloc(&d_lens, kB * sizeof(int)), "cudaMalloc lens");
  std::mt19937_64 rng(20261201 + max_len);
  auto draw_prompt = [&] {
    const double lo = std::log(256.0), hi = std::log(max_len / 2.0);
    return static_cast<int>(std::exp(std::uniform_real_distribution<double>(lo, hi)(rng)));
  };
  std::vector<int> lens(kB), left(kB);
  for (int i = 0; i < kB; ++i) {
    lens[i] = std::uniform_int_distribution<int>(1, 64)(rng);  // capture at short lengths
    left[i] = std::uniform_int_distribution<int>(512, 8192)(rng);
  }
  check(cudaMemcpy(d_lens, lens.data(), kB * sizeof(int), cudaMemcpyHostToDevice), "upload lens");
  Bindings b = m.bind(lens);
  auto step = [&](const Bindings& bb) {
    layer(arena, s, m, 4, bb, d_lens, swa_bound);
    layer(arena, s, m, 128, bb, d_lens, swa_bound);
    layer(arena, s, m, 1, bb, d_lens, swa_bound);
  };
  auto graph = capture(arena, s, b, step);
  *capacity_plan_bytes = static_cast<double>(graph.virtual_stats().reserved_bytes);
  const double workspaces = 9;  // 3 layers x (kv, indices, lens)
  // New prompts start mid-trace: give every slot a first prompt now (the trace's steady state).
  for (int i = 0; i < kB; ++i) lens[i] = draw_prompt();
  TraceResult r;
  std::vector<double> ratios;
  std::uint64_t sampled = 0, ok = 0, ok_req = 0;
  const auto created0 = vm->stats().chunks_created;
  const auto hits0 = vm->stats().pool_hits;
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < kB; ++i) {
      if (--left[i] <= 0 || lens[i] >= max_len) {
        lens[i] = draw_prompt();
        left[i] = std::uniform_int_distribution<int>(512, 8192)(rng);
      } else {
        ++lens[i];
      }
    }
    b = m.bind(lens);
    check(cudaMemcpyAsync(d_lens, lens.data(), kB * sizeof(int), cudaMemcpyHostToDevice, s), "lens");
    const auto grew_before = graph.virtual_stats().grow_events;
    const auto t0 = Clock::now();
    graph.commit(b);  // exactly the step replay() runs after its guards
    const auto t1 = Clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    const bool grew = graph.virtual_stats().grow_events != grew_before;
    (grew ? r.grow_ns : r.flat_ns).push_back(ns);
    r.grow_steps += grew;
    graph.replay(b, s);
    if (t % 64 == 63) check(cudaStreamSynchronize(s), "sync");
    if (grew || t % 16 == 0 || t == steps - 1) {
      const auto vs = graph.virtual_stats(&b);
      const double c = static_cast<double>(vs.committed_bytes), e = static_cast<double>(vs.exact_need_bytes);
      const double fl = static_cast<double>(vs.granule_need_bytes);
      ratios.push_back(c / e);
      r.max_ratio = std::max(r.max_ratio, c / e);
      r.max_over_floor = std::max(r.max_over_floor, c / fl);
      r.peak_committed = std::max(r.peak_committed, c);
      ++sampled;
      ok += c <= 1.10 * e + workspaces * G;
      ok_req += c <= 1.10 * e + (workspaces + 3.0 * kB) * G;
      r.final_committed = c;
      r.final_exact = e;
      if (shrink_policy && t % 256 == 255 && c > 1.10 * e + workspaces * G) {
        const auto s0 = Clock::now();
        arena.shrink(s, b);
        r.shrink_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
      }
    }
  }
  check(cudaStreamSynchronize(s), "sync");
  check(cudaGetLastError(), "trace");
  r.steps = steps;
  r.mean_ratio = mean(ratios);
  r.within_target = sampled ? double(ok) / sampled : 0;
  r.within_target_req = sampled ? double(ok_req) / sampled : 0;
  r.chunks_created = vm->stats().chunks_created - created0;
  r.pool_hits = vm->stats().pool_hits - hits0;
  // replay() host time, virtual vs ordinary, same bindings (nothing grows: the steady state).
  if (replay_virtual_ns) {
    auto time_replays = [&](CapturedGraph& g) {
      std::vector<double> v;
      for (int k = 0; k < 2000; ++k) {
        const auto a = Clock::now();
        g.replay(b, s);
        v.push_back(std::chrono::duration<double, std::nano>(Clock::now() - a).count());
        if (k % 64 == 63) check(cudaStreamSynchronize(s), "sync");
      }
      check(cudaStreamSynchronize(s), "sync");
      return pct(v, 0.5);
    };
    *replay_virtual_ns = time_replays(graph);
    *replay_plain_ns = 0;
    if (measure_plain) {
      Arena plain(backend, ArenaOptions{.report_findings = false});
      plain.reserve(static_cast<std::uint64_t>(*capacity_plan_bytes) + (64ull << 20), s);
      auto pg = capture(plain, s, b, [&](const Bindings& bb) {
        layer(plain, s, m, 4, bb, d_lens, swa_bound);
        layer(plain, s, m, 128, bb, d_lens, swa_bound);
        layer(plain, s, m, 1, bb, d_lens, swa_bound);
      });
      *replay_plain_ns = time_replays(pg);
    }
  }
  check(cudaStreamSynchronize(s), "sync");
  cudaFree(d_lens);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, command;
  int steps = 20000;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--quick") steps = 2000;
    else {
      std::fprintf(stderr, "usage: %s [--json out.json] [--steps N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    std::fprintf(stderr, "vmm_growth_bench: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "properties");
  const std::string machine = prop.name;
  std::vector<Record> rec;
  std::printf("vmm_growth_bench on %s: B=%d, C4 + C128 + C1 layers, %d steps per trace\n", machine.c_str(), kB, steps);
  for (int max_len : {65536, 1048576}) {
    const std::string tag = max_len == 65536 ? "64K" : "1M";
    double plan = 0, rv = 0, rp = 0;
    // The ordinary (physically reserved) baseline graph fits for 64K and 1M (3 layers, ~17 GiB).
    const TraceResult a = run_trace(max_len, steps, false, &plan, &rv, &rp, true);
    double plan2 = 0;
    const TraceResult c = run_trace(max_len, steps, true, &plan2, nullptr, nullptr, false);
    const double MiB = 1048576.0;
    std::printf("\nmax_model_len %s: capacity-bound plan %.1f MiB\n", tag.c_str(), plan / MiB);
    for (const auto* r : {&a, &c}) {
      const bool sh = r == &c;
      std::printf("  %s: peak committed %.1f MiB, final committed %.1f MiB vs exact %.1f MiB; committed/exact mean "
                  "%.3f max %.3f; committed/granule-floor max %.3f; within 10%%+1 granule/workspace %.1f%% of "
                  "samples, +1 granule/request slice %.1f%%; chunks created %llu, pool hits %llu%s\n",
                  sh ? "with shrink" : "no shrink  ", r->peak_committed / MiB, r->final_committed / MiB,
                  r->final_exact / MiB, r->mean_ratio, r->max_ratio, r->max_over_floor, 100 * r->within_target,
                  100 * r->within_target_req, (unsigned long long)r->chunks_created, (unsigned long long)r->pool_hits,
                  sh ? (", shrinks " + std::to_string(r->shrink_ms.size()) + " (median " +
                        std::to_string(pct(r->shrink_ms, 0.5)) + " ms)").c_str()
                     : "");
    }
    std::printf("  commit host time: non-growing steps median %.1f ns p99 %.1f ns (%zu); growing steps median %.1f "
                "us p99 %.1f us (%zu)\n",
                pct(a.flat_ns, 0.5), pct(a.flat_ns, 0.99), a.flat_ns.size(), pct(a.grow_ns, 0.5) / 1e3,
                pct(a.grow_ns, 0.99) / 1e3, a.grow_ns.size());
    std::printf("  replay() host time: virtual %.1f ns, ordinary %.1f ns\n", rv, rp);
    const std::string p = "vmm." + tag + ".";
    rec.push_back({p + "peak_committed_bytes", a.peak_committed, "bytes", p + "capacity_bound_plan_bytes", plan});
    rec.push_back({p + "final_committed_bytes", a.final_committed, "bytes", p + "final_exact_need_bytes", a.final_exact});
    rec.push_back({p + "committed_over_exact_mean", a.mean_ratio, "ratio", "", 0});
    rec.push_back({p + "committed_over_exact_max", a.max_ratio, "ratio", "", 0});
    rec.push_back({p + "committed_over_granule_floor_max", a.max_over_floor, "ratio", "", 0});
    rec.push_back({p + "within_target_fraction", a.within_target, "fraction", "", 0});
    rec.push_back({p + "within_target_per_request_fraction", a.within_target_req, "fraction", "", 0});
    rec.push_back({p + "shrink.committed_over_exact_mean", c.mean_ratio, "ratio", "", 0});
    rec.push_back({p + "shrink.within_target_fraction", c.within_target, "fraction", "", 0});
    rec.push_back({p + "shrink.median_ms", pct(c.shrink_ms, 0.5), "ms", "", 0});
    rec.push_back({p + "commit_ns.nongrowing.median", pct(a.flat_ns, 0.5), "ns", "", 0});
    rec.push_back({p + "commit_ns.nongrowing.p99", pct(a.flat_ns, 0.99), "ns", "", 0});
    rec.push_back({p + "commit_ns.growing.median", pct(a.grow_ns, 0.5), "ns", "", 0});
    rec.push_back({p + "commit_ns.growing.p99", pct(a.grow_ns, 0.99), "ns", "", 0});
    rec.push_back({p + "growing_steps", double(a.grow_steps), "steps", p + "steps", double(a.steps)});
    rec.push_back({p + "chunks_created", double(a.chunks_created), "chunks", p + "pool_hits", double(a.pool_hits)});
    rec.push_back({p + "replay_ns.virtual", rv, "ns", p + "replay_ns.ordinary", rp});
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    if (!out) {
      std::fprintf(stderr, "vmm_growth_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
    auto num = [](double v) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.6g", v);
      return std::string(buf);
    };
    out << "[\n";
    for (std::size_t i = 0; i < rec.size(); ++i) {
      const Record& r = rec[i];
      const bool has_base = !r.baseline_name.empty();
      out << "  {\"name\": \"" << json_escape(r.name) << "\", \"value\": " << num(r.value) << ", \"unit\": \""
          << json_escape(r.unit) << "\", \"baseline_name\": "
          << (has_base ? "\"" + json_escape(r.baseline_name) + "\"" : std::string("null"))
          << ", \"baseline_value\": " << (has_base ? num(r.baseline_value) : std::string("null"))
          << ", \"ratio\": " << (has_base && r.value != 0 ? num(r.baseline_value / r.value) : std::string("null"))
          << ", \"machine\": \"" << json_escape(machine) << "\", \"command\": \"" << json_escape(command) << "\"}"
          << (i + 1 < rec.size() ? "," : "") << "\n";
    }
    out << "]\n";
    std::printf("wrote %zu records to %s\n", rec.size(), json_path.c_str());
  }
  return 0;
}
