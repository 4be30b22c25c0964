// vmm_growth_bench: virtual growth over a realistic decode trace.
//
// B = 64 requests, DS4 gather-workspace shapes for a C4 + a C128 + a C1 layer at max_model_len 64K
// and 1M, in two layouts of the gather workspace kv (bf16 rows of 512, W = 128 SWA rows):
//   - ragged: request b's rows (n_c(b) = L_b / ratio compressed + min(L_b, W) SWA) follow request
//     b-1's; the workspace's need is sum_over(L, n_c(l) + min(l, W)) rows, one prefix, no footprint;
//   - strided: [R, M, 512], M = N + W (N = capacity-bound compressed rows), request b's slice at
//     b * M rows; its need is two ranges per request (a per-request-ranges footprint). The DS4
//     client's current layout.
// plus the static index/lens buffers: 9 workspaces per step. One graph per (model length, layout),
// captured at short lengths in virtual mode; a "touch" kernel per layer writes the first and last
// element of every request's rows (reading device seq_lens), so a missing mapping faults. The trace:
// each slot decodes one token per step; a finished request (output 512..8192 tokens) is replaced by a
// new prompt drawn log-uniform in [256, max_model_len/2].
//
// Per step (every step is measured) the physical bytes committed (mapped) at launch against
//   - the exact need (bytes the step touches), and the target, read two ways:
//       per workspace:  committed <= 1.10 x exact + one granule per workspace (9 granules)
//       per range:      committed <= 1.10 x exact + one granule per separately addressed range
//                       (ragged: 9; strided: one per request per non-empty range, up to 2 x 64 x 3)
//   - the touched-granule floor (the least any mapping at this granularity can hold);
//   - the capacity-bound reservation (plan bytes).
// Two policies: none (committed is a high-water mark), and shrink-when-over: after the step's commit
// (what replay() does after its guards), if committed is over the layout's target (ragged: per
// workspace; strided: per range, the only one it can meet) shrink to the step's need before launch.
// Host time: the commit step per replay (growing / non-growing steps), the policy's check
// (virtual_stats with bindings), shrinks (they synchronize the stream), replay() virtual vs ordinary.
//
// Usage: vmm_growth_bench [--json out.json] [--steps N] [--quick] [--print-every N] [--csv out.csv]
// JSON: an array of {"name","value","unit","baseline_name","baseline_value","ratio","machine","command"}.
// CSV (optional): one row per step and trace: committed, exact, floor, both targets.
#include <graphsafe/graphsafe.hpp>

#include "bench_support.hpp"

#include <CLI/CLI.hpp>

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
namespace bench = graphsafe::bench;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kB = 64;
constexpr int kW = 128;
constexpr int kD = 512;

enum class Layout { ragged, strided };
const char* layout_name(Layout l) { return l == Layout::ragged ? "ragged" : "strided"; }

// Strided: writes the first and last bf16 of each touched range of request b (compressed rows
// [0, n_c), SWA rows [N, N + min(L, W)) of its slice) and the combined index row length.
__global__ void touch_strided(std::uint16_t* ws, long long N, long long M, int ratio, const int* lens, int* idx_lens) {
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

// Ragged: thread b finds its first row (the rows of requests 0..b-1) and writes the first and last
// bf16 of its rows (compressed, then SWA).
__global__ void touch_ragged(std::uint16_t* ws, int ratio, const int* lens, int* idx_lens, int batch) {
  const int b = threadIdx.x;
  if (b >= batch) return;
  auto rows = [&](int L) { return static_cast<long long>(ratio > 1 ? L / ratio : 0) + (L < kW ? L : kW); };
  long long off = 0;
  for (int j = 0; j < b; ++j) off += rows(lens[j]);
  const long long n = rows(lens[b]);
  if (n > 0) {
    ws[off * kD] = static_cast<std::uint16_t>(b);
    ws[(off + n) * kD - 1] = static_cast<std::uint16_t>(n);
  }
  idx_lens[b] = static_cast<int>(n);
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

// One layer of the step: dimensions, kv (ragged: need = its rows; strided: footprint), index
// buffers, touch kernel.
void layer(Arena& arena, cudaStream_t s, const Model& m, Layout lay, int ratio, const Bindings& b, const int* d_lens,
           const StaticQueryBound& swa_bound) {
  const Extent n_c = ratio > 1 ? max_over(m.L, [&](const Extent& l) { return floor_div(l, ratio); }) : Extent(0);
  const Extent g = max_over(m.L, [&](const Extent& l) { return min(l, Extent(m.Wsym)); });
  const std::int64_t N = arena.dimension(s, "compressed_rows", n_c, capacity_bound, b);
  const std::int64_t G = arena.dimension(s, "swa_rows", g, swa_bound, b);
  const std::int64_t M = N + G;
  const std::int64_t width = ((ratio == 4 ? 512 : ratio == 128 ? N : 0) + kW + 127) / 128 * 128;
  if (lay == Layout::ragged) {
    const Extent rows = sum_over(m.L, [&](const Extent& l) {
      return (ratio > 1 ? floor_div(l, ratio) : Extent(0)) + min(l, Extent(m.Wsym));
    });
    auto kv = arena.request(s, "kv", rows * kD, 2, capacity_bound, b);
    auto idx = arena.request(s, "combined_indices", Extent(m.R) * width, 4, capacity_bound, b);
    auto lens = arena.request(s, "combined_lens", Extent(m.R), 4, capacity_bound, b);
    touch_ragged<<<1, kB, 0, s>>>(kv.as<std::uint16_t>(), ratio, d_lens, lens.as<int>(), kB);
    (void)idx;
  } else {
    auto fp = Footprint::per_request_ranges(m.L, M * kD, [&](const Extent& l) {
      return std::vector<FootprintRange>{{0, ratio > 1 ? floor_div(l, ratio) * kD : Extent(0)},
                                         {N * kD, min(l, Extent(m.Wsym)) * kD}};
    });
    auto kv = arena.request(s, "kv", Extent(m.R) * M * kD, 2, capacity_bound, b, fp);
    auto idx = arena.request(s, "combined_indices", Extent(m.R) * width, 4, capacity_bound, b);
    auto lens = arena.request(s, "combined_lens", Extent(m.R), 4, capacity_bound, b);
    touch_strided<<<kB, 32, 0, s>>>(kv.as<std::uint16_t>(), N, M, ratio, d_lens, lens.as<int>());
    (void)idx;
  }
  check(cudaGetLastError(), "touch kernel launch");
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

struct TraceResult {
  std::vector<double> grow_ns, flat_ns, check_ns, shrink_ms;
  std::vector<double> over_exact, over_target_ws, over_target_rng, over_floor;  // per step
  double final_committed = 0, final_exact = 0, final_floor = 0, peak_committed = 0, peak_physical = 0;
  double max_ranges = 0, workspaces = 0, granule = 0;
  std::uint64_t steps = 0, grow_steps = 0, chunks_created = 0, pool_hits = 0;
  double within(const std::vector<double>& v) const {
    std::size_t n = 0;
    for (double x : v) n += x <= 1.0;
    return v.empty() ? 0 : double(n) / v.size();
  }
  double max_of(const std::vector<double>& v) const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
};

struct TraceOptions {
  int max_len = 65536;
  int steps = 20000;
  Layout layout = Layout::ragged;
  bool shrink_policy = false;
  int print_every = 1000;
  std::FILE* csv = nullptr;
  const char* tag = "";
};

TraceResult run_trace(const TraceOptions& o, double* capacity_plan_bytes, double* replay_virtual_ns,
                      double* replay_plain_ns) {
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
  Model m(o.max_len);
  StaticQueryBound swa_bound{Extent(m.Wsym)};
  int* d_lens = nullptr;
  check(cudaMalloc(&d_lens, kB * sizeof(int)), "cudaMalloc lens");
  std::mt19937_64 rng(20261201 + o.max_len);  // the same trace for both layouts and policies
  auto draw_prompt = [&] {
    const double lo = std::log(256.0), hi = std::log(o.max_len / 2.0);
    return static_cast<int>(std::exp(std::uniform_real_distribution<double>(lo, hi)(rng)));
  };
  std::vector<int> lens(kB), left(kB);
  for (int i = 0; i < kB; ++i) {
    lens[i] = std::uniform_int_distribution<int>(1, 64)(rng);  // capture at short lengths
    left[i] = std::uniform_int_distribution<int>(512, 8192)(rng);
  }
  check(cudaMemcpy(d_lens, lens.data(), kB * sizeof(int), cudaMemcpyHostToDevice), "upload lens");
  Bindings b = m.bind(lens);
  auto step = [&](Arena& a, const Bindings& bb) {
    layer(a, s, m, o.layout, 4, bb, d_lens, swa_bound);
    layer(a, s, m, o.layout, 128, bb, d_lens, swa_bound);
    layer(a, s, m, o.layout, 1, bb, d_lens, swa_bound);
  };
  auto graph = capture(arena, s, b, [&](const Bindings& bb) { step(arena, bb); });
  if (!graph.plan().findings().empty() || graph.plan().guard_count() != 0)
    std::fprintf(stderr, "vmm_growth_bench: unexpected findings/guards in the %s plan\n", layout_name(o.layout));
  *capacity_plan_bytes = static_cast<double>(graph.virtual_stats().reserved_bytes);
  TraceResult r;
  r.granule = G;
  // New prompts start mid-trace: give every slot a first prompt now (the trace's steady state).
  for (int i = 0; i < kB; ++i) lens[i] = draw_prompt();
  const auto created0 = vm->stats().chunks_created;
  const auto hits0 = vm->stats().pool_hits;
  const double MiB = 1048576.0;
  if (o.print_every > 0)
    std::printf("  %s %s, %s: step, committed MiB, exact MiB, floor MiB, target/ws MiB, committed/target(ws), "
                "target/range MiB, committed/target(range)\n",
                o.tag, layout_name(o.layout), o.shrink_policy ? "shrink-when-over" : "no shrink");
  for (int t = 0; t < o.steps; ++t) {
    for (int i = 0; i < kB; ++i) {
      if (--left[i] <= 0 || lens[i] >= o.max_len) {
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
    const auto c0 = Clock::now();
    auto vs = graph.virtual_stats(&b);  // the policy's check: exact need under b
    r.check_ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - c0).count());
    auto target_ws = [&](const VirtualGraphStats& v) { return 1.10 * v.exact_need_bytes + v.workspaces * G; };
    auto target_rng = [&](const VirtualGraphStats& v) { return 1.10 * v.exact_need_bytes + v.touched_ranges * G; };
    if (o.shrink_policy) {
      const double tgt = o.layout == Layout::ragged ? target_ws(vs) : target_rng(vs);
      if (vs.committed_bytes > tgt) {
        const auto s0 = Clock::now();
        arena.shrink(s, b);  // synchronizes s: no replay in flight while unmapping
        r.shrink_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
        vs = graph.virtual_stats(&b);
      }
    }
    graph.replay(b, s);  // guards, commit (nothing new), launch
    if (t % 64 == 63) check(cudaStreamSynchronize(s), "sync");
    // What the step launched with.
    const double c = static_cast<double>(vs.committed_bytes), e = static_cast<double>(vs.exact_need_bytes);
    const double fl = static_cast<double>(vs.granule_need_bytes);
    r.over_exact.push_back(c / e);
    r.over_target_ws.push_back(c / target_ws(vs));
    r.over_target_rng.push_back(c / target_rng(vs));
    r.over_floor.push_back(c / fl);
    r.peak_committed = std::max(r.peak_committed, c);
    r.peak_physical = std::max(r.peak_physical, static_cast<double>(vm->stats().physical_bytes()));
    r.max_ranges = std::max(r.max_ranges, static_cast<double>(vs.touched_ranges));
    r.workspaces = static_cast<double>(vs.workspaces);
    r.final_committed = c;
    r.final_exact = e;
    r.final_floor = fl;
    if (o.print_every > 0 && (t % o.print_every == 0 || t == o.steps - 1))
      std::printf("  %6d %10.1f %10.1f %10.1f %10.1f %7.3f %10.1f %7.3f\n", t, c / MiB, e / MiB, fl / MiB,
                  target_ws(vs) / MiB, c / target_ws(vs), target_rng(vs) / MiB, c / target_rng(vs));
    if (o.csv)
      std::fprintf(o.csv, "%s,%s,%s,%d,%.0f,%.0f,%.0f,%.0f,%.0f\n", o.tag, layout_name(o.layout),
                   o.shrink_policy ? "shrink" : "none", t, c, e, fl, target_ws(vs), target_rng(vs));
  }
  check(cudaStreamSynchronize(s), "sync");
  check(cudaGetLastError(), "trace");
  r.steps = o.steps;
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
    Arena plain(backend, ArenaOptions{.report_findings = false});
    plain.reserve(static_cast<std::uint64_t>(*capacity_plan_bytes) + (64ull << 20), s);
    auto pg = capture(plain, s, b, [&](const Bindings& bb) { step(plain, bb); });
    *replay_plain_ns = time_replays(pg);
  }
  check(cudaStreamSynchronize(s), "sync");
  cudaFree(d_lens);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, csv_path;
  int steps = 20000, print_every = 1000;
  const std::string command = bench::command_line(argc, argv);
  CLI::App app("vmm_growth_bench: virtual growth over a B = 64 DS4 decode trace", "vmm_growth_bench");
  app.add_option("--json", json_path, "write the records to this file");
  app.add_option("--csv", csv_path, "write every step's figures to this file");
  app.add_option("--steps", steps, "trace length")->check(CLI::Range(1, 10000000));
  app.add_option("--print-every", print_every, "progress line every N steps")->check(CLI::Range(1, 10000000));
  bool quick = false;
  app.add_flag("--quick", quick, "2,000 steps (a smoke run)");
  if (const auto code = bench::parse_command_line(app, argc, argv, json_path)) return *code;
  if (quick) steps = 2000;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "vmm_growth_bench: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "properties");
  const std::string machine = prop.name;
  std::FILE* csv = nullptr;
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (!csv) {
      std::fprintf(stderr, "vmm_growth_bench: cannot write %s\n", csv_path.c_str());
      return 1;
    }
    std::fprintf(csv, "max_model_len,layout,policy,step,committed,exact,floor,target_per_workspace,target_per_range\n");
  }
  const double min_g = static_cast<double>(CudaVirtualMemory::minimum_granularity(dev));
  const double rec_g = static_cast<double>(CudaVirtualMemory::recommended_granularity(dev));
  const double MiB = 1048576.0;
  std::vector<bench::Record> rec;
  std::printf("vmm_growth_bench on %s: B=%d, C4 + C128 + C1 layers, %d steps per trace\n", machine.c_str(), kB, steps);
  std::printf("allocation granularity (pinned device memory): minimum %.2f MiB, recommended %.2f MiB; chunks use the "
              "minimum, nothing finer can be mapped\n",
              min_g / MiB, rec_g / MiB);
  std::printf("target: committed <= 1.10 x exact need + one granule per workspace (9 workspaces); also "
              "reported per separately addressed range\n");
  rec.push_back({"vmm.granularity.minimum", min_g, "bytes", "vmm.granularity.recommended", rec_g});
  for (int max_len : {65536, 1048576}) {
    const std::string tag = max_len == 65536 ? "64K" : "1M";
    for (Layout lay : {Layout::ragged, Layout::strided}) {
      double plan = 0, rv = 0, rp = 0, plan2 = 0;
      TraceOptions o{.max_len = max_len, .steps = steps, .layout = lay, .shrink_policy = false,
                     .print_every = print_every, .csv = csv, .tag = tag.c_str()};
      std::printf("\nmax_model_len %s, %s layout\n", tag.c_str(), layout_name(lay));
      const TraceResult a = run_trace(o, &plan, &rv, &rp);
      o.shrink_policy = true;
      const TraceResult c = run_trace(o, &plan2, nullptr, nullptr);
      std::printf("max_model_len %s, %s layout: capacity-bound plan %.1f MiB; %g workspaces; up to %g separately "
                  "addressed ranges\n",
                  tag.c_str(), layout_name(lay), plan / MiB, a.workspaces, a.max_ranges);
      for (const auto* r : {&a, &c}) {
        const bool sh = r == &c;
        std::printf("  %s: committed/exact mean %.3f max %.3f; committed/floor max %.3f; peak committed %.1f MiB "
                    "(physical incl. pool %.1f MiB), final %.1f vs exact %.1f MiB\n",
                    sh ? "shrink-when-over" : "no shrink       ", mean(r->over_exact), r->max_of(r->over_exact),
                    r->max_of(r->over_floor), r->peak_committed / MiB, r->peak_physical / MiB,
                    r->final_committed / MiB, r->final_exact / MiB);
        std::printf("      target per workspace: met at %.2f%% of steps (committed/target max %.3f); per range: met "
                    "at %.2f%% (max %.3f); chunks created %llu, pool hits %llu",
                    100 * r->within(r->over_target_ws), r->max_of(r->over_target_ws),
                    100 * r->within(r->over_target_rng), r->max_of(r->over_target_rng),
                    (unsigned long long)r->chunks_created, (unsigned long long)r->pool_hits);
        if (sh)
          std::printf("; shrinks %zu (%.2f%% of steps, median %.2f ms, p99 %.2f ms)", r->shrink_ms.size(),
                      100.0 * r->shrink_ms.size() / r->steps, pct(r->shrink_ms, 0.5), pct(r->shrink_ms, 0.99));
        std::printf("\n");
      }
      std::printf("  commit host time: non-growing steps median %.1f ns p99 %.1f ns (%zu); growing steps median %.1f "
                  "us p99 %.1f us (%zu); policy check (virtual_stats with bindings) median %.1f us\n",
                  pct(a.flat_ns, 0.5), pct(a.flat_ns, 0.99), a.flat_ns.size(), pct(a.grow_ns, 0.5) / 1e3,
                  pct(a.grow_ns, 0.99) / 1e3, a.grow_ns.size(), pct(a.check_ns, 0.5) / 1e3);
      std::printf("  replay() host time: virtual %.1f ns, ordinary %.1f ns\n", rv, rp);
      const std::string p = "vmm." + tag + "." + layout_name(lay) + ".";
      rec.push_back({p + "peak_committed_bytes", a.peak_committed, "bytes", p + "capacity_bound_plan_bytes", plan});
      rec.push_back({p + "final_committed_bytes", a.final_committed, "bytes", p + "final_exact_need_bytes", a.final_exact});
      rec.push_back({p + "committed_over_exact_mean", mean(a.over_exact), "ratio", "", 0});
      rec.push_back({p + "committed_over_exact_max", a.max_of(a.over_exact), "ratio", "", 0});
      rec.push_back({p + "committed_over_granule_floor_max", a.max_of(a.over_floor), "ratio", "", 0});
      rec.push_back({p + "within_target_per_workspace_fraction", a.within(a.over_target_ws), "fraction", "", 0});
      rec.push_back({p + "within_target_per_range_fraction", a.within(a.over_target_rng), "fraction", "", 0});
      rec.push_back({p + "shrink.peak_committed_bytes", c.peak_committed, "bytes", p + "capacity_bound_plan_bytes", plan});
      rec.push_back({p + "shrink.committed_over_exact_mean", mean(c.over_exact), "ratio", "", 0});
      rec.push_back({p + "shrink.committed_over_exact_max", c.max_of(c.over_exact), "ratio", "", 0});
      rec.push_back({p + "shrink.committed_over_target_per_workspace_max", c.max_of(c.over_target_ws), "ratio", "", 0});
      rec.push_back({p + "shrink.within_target_per_workspace_fraction", c.within(c.over_target_ws), "fraction", "", 0});
      rec.push_back({p + "shrink.within_target_per_range_fraction", c.within(c.over_target_rng), "fraction", "", 0});
      rec.push_back({p + "shrink.shrinks", double(c.shrink_ms.size()), "shrinks", p + "steps", double(c.steps)});
      rec.push_back({p + "shrink.median_ms", pct(c.shrink_ms, 0.5), "ms", "", 0});
      rec.push_back({p + "policy_check_ns.median", pct(a.check_ns, 0.5), "ns", "", 0});
      rec.push_back({p + "commit_ns.nongrowing.median", pct(a.flat_ns, 0.5), "ns", "", 0});
      rec.push_back({p + "commit_ns.nongrowing.p99", pct(a.flat_ns, 0.99), "ns", "", 0});
      rec.push_back({p + "commit_ns.growing.median", pct(a.grow_ns, 0.5), "ns", "", 0});
      rec.push_back({p + "commit_ns.growing.p99", pct(a.grow_ns, 0.99), "ns", "", 0});
      rec.push_back({p + "growing_steps", double(a.grow_steps), "steps", p + "steps", double(a.steps)});
      rec.push_back({p + "chunks_created", double(a.chunks_created), "chunks", p + "pool_hits", double(a.pool_hits)});
      rec.push_back({p + "replay_ns.virtual", rv, "ns", p + "replay_ns.ordinary", rp});
    }
  }
  if (csv) std::fclose(csv);
  if (!json_path.empty()) {
    try {
      bench::write_records(json_path, rec, machine, command);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vmm_growth_bench: %s\n", e.what());
      return 1;
    }
    std::printf("wrote %zu records to %s\n", rec.size(), json_path.c_str());
  }
  return 0;
}
