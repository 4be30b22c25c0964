// The arena on a real GPU: stream capture with kernels that fill their whole workspace and read the
// sequence lengths from device memory (the seed's gather), replayed after the bindings change.
//
//   * replay after growth equals an eager run, bitwise (safe policies)
//   * exact_at_capture: the guard refuses before launch (output untouched), naming request, symbol,
//     value and limit; bypassing it overwrites the canary workspace behind (the check can fail)
//   * workspace addresses are stable across replays (the kernel writes its ws pointer out)
//   * a family of 8 bucket graphs reserves the largest plan, not the sum, and replays correctly
//   * eager requests on another stream during a capture, outside the capture's region
//   * cuda::mr ArenaResource / thrust_allocator temporaries (CUB, Thrust sort) inside a capture
//   * a stream forked into the capture: its requests land in the same plan
//   * device memory flat after many capture/replay/destroy cycles
// The arena's backend-independent contract (reuse, plans, guards, failed captures, trim, ...) runs
// on the GPU as test_arena_behaviours_gpu (arena_behaviours.hpp).
#include <graphsafe/cuda_mr.hpp>  // first: defines the CCCL experimental memory-resource macro

#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <thrust/execution_policy.h>
#include <thrust/sort.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <random>
#include <string>
#include <vector>

#include "../support/arena_checks.hpp"
#include "../support/gpu_test_support.hpp"
#include "../support/seed_kernels.cuh"

using namespace graphsafe;
using namespace graphsafe_test;
using namespace graphsafe_test::seed;

namespace {

__global__ void write_ptrs_kernel(const void* a, const void* b, unsigned long long* out) {
  out[0] = reinterpret_cast<unsigned long long>(a);
  out[1] = reinterpret_cast<unsigned long long>(b);
}

void check_launch() { GRAPHSAFE_CUDA(cudaGetLastError()); }

void decode_step(cudaStream_t s, const Workspace& ws, std::int64_t N, std::int64_t M, const int* d_lens, int R,
                 std::int64_t* d_out) {
  launch_seed_step(s, ws.as<std::int64_t>(), ws.count(), N, M, d_lens, R, d_out);
}

struct Policies {
  const SizingPolicy& compressed;
  const SizingPolicy& swa;
};

// One decode step through the arena: two sized dimensions and the workspace, then the kernels.
// Returns the workspace pointer (for stability checks; for captured requests it stays valid).
void* arena_step(Arena& arena, cudaStream_t s, const Model& m, const Bindings& b, const Policies& pol,
                 const int* d_lens, std::int64_t* d_out, const char* name = "kv") {
  const std::int64_t N = arena.dimension(s, "kv.compressed_rows", m.n_c, pol.compressed, b);
  const std::int64_t G = arena.dimension(s, "kv.swa_rows", m.g, pol.swa, b);
  const std::int64_t M = N + G;
  auto ws = arena.request(s, name, Extent(m.R) * M, sizeof(std::int64_t), capacity_bound, b);
  decode_step(s, ws, N, M, d_lens, static_cast<int>(b.value(m.R)), d_out);
  return ws.data();
}

// Eager reference: exact sizes under the current bindings, fresh workspace each time.
std::vector<std::int64_t> eager_run(Arena& arena, cudaStream_t s, const Model& m, const std::vector<int>& lens,
                                    DevBuf<int>& d_lens, DevBuf<std::int64_t>& d_out) {
  d_lens.upload(lens, s);
  d_out.fill_bytes(0, s);
  const Bindings b = m.bind(lens);
  arena_step(arena, s, m, b, Policies{exact_at_capture, exact_at_capture}, d_lens.p, d_out.p);
  return d_out.download(s, lens.size() * kOutW);
}

bool overlaps(std::uintptr_t a, std::uint64_t an, std::uintptr_t b, std::uint64_t bn) {
  return a < b + bn && b < a + an;
}

// Start of the region a graph's plan spans, from a captured workspace pointer and its plan entry.
std::uintptr_t region_base(const CapturedGraph& g, const std::string& entry, const void* ptr) {
  for (const auto& e : g.plan().entries())
    if (e.name == entry) return reinterpret_cast<std::uintptr_t>(ptr) - e.offset;
  FAIL("no plan entry named " << entry);
  return 0;
}

int cycles_from_env(int dflt) {
  if (const char* v = std::getenv("GRAPHSAFE_TEST_CYCLES")) {
    const int n = std::atoi(v);
    if (n > 0) return n;
  }
  return dflt;
}


// What every test here starts from: two non-blocking streams, a CUDA backend, an arena that keeps its
// findings to itself, the seed's model and its replay-safe policies. Members die in reverse order:
// the arena before the backend, both before the streams.
struct GpuArena {
  StreamHolder first, second;
  const cudaStream_t s = first.s;
  const cudaStream_t s2 = second.s;
  CudaBackend backend;
  Arena arena{backend, ArenaOptions{.report_findings = false}};
  Model m;
  const StaticQueryBound swa_bound{Extent(m.W)};  // one query token per request: G <= W
  const Policies safe{capacity_bound, swa_bound};
};

}  // namespace

TEST_CASE_METHOD(GpuArena, "gpu: replay after the sequences grow equals an eager run, bitwise", "[gpu][seed]") {
  arena.reserve(16 << 20, s);
  const Policies policies[] = {{capacity_bound, swa_bound}, {capacity_bound, capacity_bound}};
  const std::vector<std::vector<int>> steps2 = {{3, 5}, {15, 17}, {255, 257}, {511, 512}, {1, 0}};
  std::vector<std::vector<int>> steps16;
  for (int k = 0; k < 5; ++k) {
    std::vector<int> l(16);
    for (int b = 0; b < 16; ++b) l[b] = std::min(kMaxLen, 3 + b * 7 + k * 97 + (b * k) % 13);
    steps16.push_back(l);
  }
  for (const auto& steps : {steps2, steps16}) {
    const int R = static_cast<int>(steps[0].size());
    for (const auto& pol : policies) {
      DevBuf<int> d_lens(R), e_lens(R);
      DevBuf<std::int64_t> d_out(R * kOutW), e_out(R * kOutW);
      d_lens.upload(steps[0], s);
      Bindings b = m.bind(steps[0]);
      auto graph = capture(arena, s, b, [&](const Bindings& bb) { arena_step(arena, s, m, bb, pol, d_lens.p, d_out.p); });
      CHECK(graph.plan().guard_count() == 0);  // both policies proved replay-safe at capture
      CHECK(graph.plan().findings().empty());
      for (const auto& lens : steps) {
        d_lens.upload(lens, s);
        d_out.fill_bytes(0, s);
        b = m.bind(lens);
        graph.replay(b, s);
        const auto got = d_out.download(s, lens.size() * kOutW);
        const auto eager = eager_run(arena, s, m, lens, e_lens, e_out);
        INFO("R = " << R << ", lens[0] = " << lens[0] << ", lens[R-1] = " << lens.back());
        CHECK(got == eager);  // bitwise: int64 compared exactly
        CHECK(got == expected_flat(lens));
      }
      GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
    }
  }
  CHECK(arena.stats().live_graphs == 0);
  CHECK(arena.stats().eager_blocks == 0);
}

TEST_CASE_METHOD(GpuArena, "gpu: exact-at-capture is refused before launch, and bypassing the guard overwrites the canary",
          "[gpu][seed][guard]") {
  arena.reserve(16 << 20, s);
  const std::vector<int> lens0 = {3, 5};
  DevBuf<int> d_lens(2);
  DevBuf<std::int64_t> d_out(2 * kOutW);
  d_lens.upload(lens0, s);
  Bindings b = m.bind(lens0);
  constexpr std::int64_t kCanaryRows = 4096;
  std::int64_t* canary = nullptr;
  std::int64_t N = -1, G = -1;
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    N = arena.dimension(s, "kv.compressed_rows", m.n_c, exact_at_capture, bb);
    G = arena.dimension(s, "kv.swa_rows", m.g, exact_at_capture, bb);
    auto ws = arena.request(s, "kv", Extent(m.R) * (N + G), sizeof(std::int64_t), exact_at_capture, bb);
    auto guard = arena.request(s, "canary", kCanaryRows, sizeof(std::int64_t), capacity_bound, bb);
    canary = guard.as<std::int64_t>();
    decode_step(s, ws, N, N + G, d_lens.p, 2, d_out.p);
  });
  CHECK(N == 1);  // max(3//4, 5//4)
  CHECK(G == 4);
  REQUIRE(canary != nullptr);
  REQUIRE(graph.plan().findings().size() == 2);
  CHECK(graph.plan().guard_count() == 2);
  // Canary: a known pattern in the workspace right behind 'kv' (same region, 256-byte aligned).
  std::vector<std::int64_t> canary_pattern(kCanaryRows, -7);
  GRAPHSAFE_CUDA(cudaMemcpyAsync(canary, canary_pattern.data(), kCanaryRows * sizeof(std::int64_t),
                                 cudaMemcpyHostToDevice, s));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));

  // At the capture-time lengths the replay is allowed and right.
  d_out.fill_bytes(0, s);
  graph.replay(b, s);
  CHECK(d_out.download(s) == expected_flat(lens0));

  // After growth the guard refuses before launch: the output keeps its sentinel bytes.
  const std::vector<int> grown = {15, 17};
  d_lens.upload(grown, s);
  b = m.bind(grown);
  d_out.fill_bytes(0xAB, s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  try {
    graph.replay(b, s);
    FAIL("replay at [15, 17] should have been refused");
  } catch (const guard_failure& e) {
    REQUIRE(!e.violations().empty());
    const GuardViolation& v = e.violations()[0];
    CHECK(v.request == "kv.compressed_rows");
    CHECK(v.policy == "exact-at-capture");
    CHECK(v.required == 4);
    CHECK(v.reserved == 1);
    CHECK_THAT(v.site, Catch::Contains("test_arena_gpu.cu"));
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("kv.compressed_rows") && Catch::Contains("needs 4") &&
                         Catch::Contains("reserved 1") && Catch::Contains("seq_lens = [15, 17]") &&
                         Catch::Contains("captured [3, 5]") && Catch::Contains("capacity 512"));
  }
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  const auto untouched = d_out.download(s);
  std::int64_t sentinel;
  std::memset(&sentinel, 0xAB, sizeof sentinel);
  CHECK(std::all_of(untouched.begin(), untouched.end(), [&](std::int64_t v) { return v == sentinel; }));

  // Proof the check can fail: bypass the guard and the replay is wrong (the SWA rows overwrite the
  // compressed rows beyond N = 1) -- the seed's silent corruption.
  d_out.fill_bytes(0, s);
  graph.replay_unguarded_for_testing(s);
  CHECK(d_out.download(s) != expected_flat(grown));
  auto canary_now = [&] {
    std::vector<std::int64_t> c(kCanaryRows);
    GRAPHSAFE_CUDA(cudaMemcpyAsync(c.data(), canary, kCanaryRows * sizeof(std::int64_t), cudaMemcpyDeviceToHost, s));
    GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
    return c;
  };
  CHECK(canary_now() == canary_pattern);  // [15, 17] still stays inside kv's 256-byte padding
  // Further growth writes past the workspace into its neighbour (still inside the region).
  d_lens.upload({255, 257}, s);
  graph.replay_unguarded_for_testing(s);
  CHECK(canary_now() != canary_pattern);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
}

TEST_CASE_METHOD(GpuArena, "gpu: workspace addresses are stable across replays", "[gpu][stability]") {
  arena.reserve(8 << 20, s);
  DevBuf<int> d_lens(4);
  DevBuf<std::int64_t> d_out(4 * kOutW);
  DevBuf<unsigned long long> d_ptrs(2);
  std::vector<int> lens = {1, 2, 3, 4};
  d_lens.upload(lens, s);
  Bindings b = m.bind(lens);
  void* kv_at_capture = nullptr;
  void* scratch_at_capture = nullptr;
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    kv_at_capture = arena_step(arena, s, m, bb, safe, d_lens.p, d_out.p);
    auto scratch = arena.request(s, "scratch", Extent(m.R) * 1000, 4, capacity_bound, bb);
    scratch_at_capture = scratch.data();
    write_ptrs_kernel<<<1, 1, 0, s>>>(kv_at_capture, scratch_at_capture, d_ptrs.p);
    check_launch();
  });
  REQUIRE(kv_at_capture != nullptr);
  REQUIRE(scratch_at_capture != nullptr);
  const std::uintptr_t base = region_base(graph, "kv", kv_at_capture);
  const std::uint64_t span = graph.reserved_bytes();
  std::mt19937 rng(1234);
  std::vector<Workspace> churn;
  for (int r = 0; r < 20; ++r) {
    // Eager churn between replays (other allocations, releases, growth): never inside the region.
    for (int k = 0; k < 8; ++k) {
      const std::int64_t bytes = 256 + static_cast<std::int64_t>(rng() % (4u << 20));
      churn.push_back(arena.request(s, "churn", bytes, 1, capacity_bound, Bindings{}));
      CHECK_FALSE(overlaps(reinterpret_cast<std::uintptr_t>(churn.back().data()), churn.back().bytes(), base, span));
    }
    if (r % 3 == 0) churn.clear();
    if (r == 10) arena.reserve(64 << 20, s);  // growth adds a slab, never moves one
    for (auto& l : lens) l = std::min(kMaxLen, l + 23 * (r + 1));
    d_lens.upload(lens, s);
    b = m.bind(lens);
    d_ptrs.fill_bytes(0, s);
    d_out.fill_bytes(0, s);
    graph.replay(b, s);
    const auto ptrs = d_ptrs.download(s);
    CHECK(ptrs[0] == reinterpret_cast<unsigned long long>(kv_at_capture));
    CHECK(ptrs[1] == reinterpret_cast<unsigned long long>(scratch_at_capture));
    CHECK(d_out.download(s) == expected_flat(lens));
  }
  churn.clear();
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
}

TEST_CASE_METHOD(GpuArena, "gpu: a family of 8 bucket graphs reserves the largest plan, not the sum", "[gpu][family]") {
  arena.reserve(32 << 20, s);
  CaptureFamily fam = arena.family("decode");
  CaptureOptions opts;
  opts.family = fam;
  constexpr int kGraphs = 8;
  std::vector<int> buckets;
  for (int g = 0; g < kGraphs; ++g) buckets.push_back(1 << g);  // 1, 2, 4, ..., 128
  std::vector<std::unique_ptr<DevBuf<int>>> lens_buf;
  std::vector<std::unique_ptr<DevBuf<std::int64_t>>> out_buf;
  std::vector<CapturedGraph> graphs;
  std::vector<void*> kv_ptrs;
  auto lens_for = [](int B, int step) {
    std::vector<int> l(B);
    for (int b = 0; b < B; ++b) l[b] = std::min(kMaxLen, 1 + (b * 37 + step * 101) % kMaxLen);
    return l;
  };
  for (int g = 0; g < kGraphs; ++g) {  // ascending: each capture grows the shared region in place
    const int B = buckets[g];
    lens_buf.push_back(std::make_unique<DevBuf<int>>(B));
    out_buf.push_back(std::make_unique<DevBuf<std::int64_t>>(static_cast<std::size_t>(B) * kOutW));
    lens_buf.back()->upload(lens_for(B, 0), s);
    const Bindings b = m.bind(lens_for(B, 0));
    void* kv = nullptr;
    graphs.push_back(capture(
        arena, s, b,
        [&](const Bindings& bb) {
          kv = arena_step(arena, s, m, bb, safe, lens_buf.back()->p, out_buf.back()->p);
        },
        opts));
    kv_ptrs.push_back(kv);
  }
  std::uint64_t largest = 0, sum = 0;
  for (const auto& g : graphs) {
    largest = std::max(largest, g.reserved_bytes());
    sum += g.reserved_bytes();
  }
  CHECK(fam.graphs() == kGraphs);
  CHECK(fam.largest_plan_bytes() == largest);
  CHECK(fam.sum_of_plan_bytes() == sum);
  CHECK(fam.region_bytes() == fam.largest_plan_bytes());
  CHECK(fam.region_bytes() < fam.sum_of_plan_bytes());
  CHECK(largest == graphs.back().reserved_bytes());
  CHECK(arena.stats().region_bytes == fam.region_bytes());
  CHECK(arena.stats().families == 1);
  for (int g = 1; g < kGraphs; ++g) CHECK(kv_ptrs[g] == kv_ptrs[0]);  // all start at the shared region

  for (int step = 1; step <= 3; ++step) {
    // Replayed one after another on one stream, each with its own grown lengths.
    for (int g = 0; g < kGraphs; ++g) {
      const int B = buckets[g];
      lens_buf[g]->upload(lens_for(B, step), s);
      out_buf[g]->fill_bytes(0, s);
    }
    for (int g = 0; g < kGraphs; ++g) graphs[g].replay(m.bind(lens_for(buckets[g], step)), s);
    for (int g = 0; g < kGraphs; ++g) {
      const int B = buckets[g];
      const auto got = out_buf[g]->download(s);
      DevBuf<int> e_lens(B);
      DevBuf<std::int64_t> e_out(static_cast<std::size_t>(B) * kOutW);
      INFO("bucket " << B << ", step " << step);
      CHECK(got == eager_run(arena, s, m, lens_for(B, step), e_lens, e_out));
      CHECK(got == expected_flat(lens_for(B, step)));
    }
  }
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  graphs.clear();
  CHECK(arena.stats().region_bytes == 0);
  CHECK(arena.stats().families == 0);
  CHECK(arena.stats().live_graphs == 0);
}

TEST_CASE_METHOD(GpuArena, "gpu: eager requests on another stream while a capture is in progress", "[gpu][concurrency]") {
  // Two free slabs before capturing: the capture takes the largest (64 MiB), the eager stream gets
  // the other. The second slab is reserved on s2, so eager work there needs no cross-stream order
  // (ordering after a block last used on the capturing stream would join s2 into the capture).
  arena.reserve(64 << 20, s);
  {
    auto hold = arena.request(s, "hold", std::int64_t(64) << 20, 1, capacity_bound, Bindings{});
    arena.reserve(32 << 20, s2);
  }
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s2));
  REQUIRE(arena.stats().slabs == 2);
  const std::uint64_t slab_bytes = arena.stats().slab_bytes;

  const std::vector<int> cap_lens = {7, 9, 11};
  const std::vector<int> eager_lens = {100, 200, 300, 400, 500};
  DevBuf<int> d_lens(3), e_lens(5);
  DevBuf<std::int64_t> d_out(3 * kOutW), e_out(5 * kOutW);
  d_lens.upload(cap_lens, s);
  e_lens.upload(eager_lens, s2);
  e_out.fill_bytes(0, s2);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s2));

  Workspace eager_ws;
  void* kv = nullptr;
  Bindings b = m.bind(cap_lens);
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    kv = arena_step(arena, s, m, bb, safe, d_lens.p, d_out.p);
    // Meanwhile, on s2 (not capturing): an eager step, sized exactly, run now.
    const Bindings eb = m.bind(eager_lens);
    const std::int64_t N = arena.dimension(s2, "eager.cmp", m.n_c, exact_at_capture, eb);
    const std::int64_t G = arena.dimension(s2, "eager.swa", m.g, exact_at_capture, eb);
    eager_ws = arena.request(s2, "eager.kv", Extent(m.R) * (N + G), sizeof(std::int64_t), exact_at_capture, eb);
    CHECK_FALSE(eager_ws.captured());
    decode_step(s2, eager_ws, N, N + G, e_lens.p, 5, e_out.p);
    CHECK(arena.stats().active_captures == 1);
  });
  CHECK(arena.stats().slabs == 2);  // nothing grew during the capture
  CHECK(arena.stats().slab_bytes == slab_bytes);
  // Only the capture's requests are in its plan.
  for (const auto& e : graph.plan().entries()) CHECK(e.name.rfind("eager", 0) != 0);
  const std::uintptr_t base = region_base(graph, "kv", kv);
  CHECK_FALSE(overlaps(reinterpret_cast<std::uintptr_t>(eager_ws.data()), eager_ws.bytes(), base,
                       graph.reserved_bytes()));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s2));
  CHECK(e_out.download(s2) == expected_flat(eager_lens));
  eager_ws.reset();

  d_out.fill_bytes(0, s);
  graph.replay(b, s);
  CHECK(d_out.download(s) == expected_flat(cap_lens));
  const std::vector<int> grown = {70, 90, 511};
  d_lens.upload(grown, s);
  d_out.fill_bytes(0, s);
  graph.replay(m.bind(grown), s);
  CHECK(d_out.download(s) == expected_flat(grown));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
}

namespace {
// Library code written against the concept: CUB's two-phase temp storage through any async resource.
template <class R>
  requires cuda::mr::async_resource<R>
std::size_t cub_sort_keys(R& res, cudaStream_t s, const std::uint32_t* in, std::uint32_t* out, int n) {
  std::size_t temp = 0;
  GRAPHSAFE_CUDA(cub::DeviceRadixSort::SortKeys(nullptr, temp, in, out, n, 0, 32, s));
  void* t = res.allocate_async(temp, 256, cuda::stream_ref(s));
  GRAPHSAFE_CUDA(cub::DeviceRadixSort::SortKeys(t, temp, in, out, n, 0, 32, s));
  res.deallocate_async(t, temp, 256, cuda::stream_ref(s));
  return temp;
}
}  // namespace

TEST_CASE_METHOD(GpuArena, "gpu: cuda::mr and Thrust temporaries inside a capture replay correctly", "[gpu][cuda_mr]") {
  arena.reserve(64 << 20, s);
  constexpr int n = 1 << 20;
  DevBuf<std::uint32_t> src(n), keys(n), cub_out(n);
  std::mt19937 rng(42);
  auto random_keys = [&] {
    std::vector<std::uint32_t> v(n);
    for (auto& x : v) x = static_cast<std::uint32_t>(rng());
    return v;
  };
  ArenaResource res(arena, s);
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{res};
  thrust_allocator alloc(arena, s);

  // Eager first: the same code outside capture serves from the free list and gives everything back.
  {
    auto h = random_keys();
    src.upload(h, s);
    GRAPHSAFE_CUDA(cudaMemcpyAsync(keys.p, src.p, src.bytes(), cudaMemcpyDeviceToDevice, s));
    thrust::sort(thrust::cuda::par_nosync(alloc).on(s), keys.p, keys.p + n);
    cub_sort_keys(ref, s, src.p, cub_out.p, n);
    std::sort(h.begin(), h.end());
    CHECK(keys.download(s) == h);
    CHECK(cub_out.download(s) == h);
    CHECK(arena.stats().eager_blocks == 0);
  }

  std::size_t cub_temp = 0;
  Bindings b;
  auto graph = capture(arena, s, b, [&](const Bindings&) {
    GRAPHSAFE_CUDA(cudaMemcpyAsync(keys.p, src.p, src.bytes(), cudaMemcpyDeviceToDevice, s));
    thrust::sort(thrust::cuda::par_nosync(alloc).on(s), keys.p, keys.p + n);
    cub_temp = cub_sort_keys(ref, s, src.p, cub_out.p, n);
  });
  std::size_t opaque = 0;
  bool cub_entry = false;
  for (const auto& e : graph.plan().entries()) {
    if (e.kind != PlanEntry::Kind::opaque) continue;
    ++opaque;
    cub_entry |= e.bytes == cub_temp;
  }
  CHECK(opaque >= 2);  // at least one Thrust temporary and CUB's temp storage
  CHECK(cub_entry);
  CHECK(graph.plan().guard_count() == 0);
  CHECK(arena.stats().eager_blocks == 0);  // nothing of the capture was served eagerly
  CHECK(arena.stats().live_graphs == 1);

  for (int r = 0; r < 3; ++r) {
    auto h = random_keys();
    src.upload(h, s);
    keys.fill_bytes(0, s);
    cub_out.fill_bytes(0, s);
    graph.replay(b, s);
    std::sort(h.begin(), h.end());
    INFO("replay " << r);
    CHECK(keys.download(s) == h);
    CHECK(cub_out.download(s) == h);
  }
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  {
    auto dead = std::move(graph);
  }
  CHECK(arena.stats().region_bytes == 0);
  CHECK(arena.stats().free_bytes == arena.stats().slab_bytes);
}

TEST_CASE_METHOD(GpuArena, "gpu: a stream forked into the capture records into the same plan", "[gpu][fork]") {
  EventHolder fork, join;
  arena.reserve(16 << 20, s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  std::vector<int> lens = {4, 8, 12};
  DevBuf<int> d_lens(3);
  DevBuf<std::int64_t> out1(3 * kOutW), out2(3 * kOutW);
  d_lens.upload(lens, s);
  Bindings b = m.bind(lens);
  void* kv1 = nullptr;
  void* kv2 = nullptr;
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    GRAPHSAFE_CUDA(cudaEventRecord(fork.e, s));
    GRAPHSAFE_CUDA(cudaStreamWaitEvent(s2, fork.e, 0));  // s2 joins the capture
    kv2 = arena_step(arena, s2, m, bb, safe, d_lens.p, out2.p, "forked.kv");
    kv1 = arena_step(arena, s, m, bb, safe, d_lens.p, out1.p, "main.kv");
    GRAPHSAFE_CUDA(cudaEventRecord(join.e, s2));
    GRAPHSAFE_CUDA(cudaStreamWaitEvent(s, join.e, 0));  // and joins back
  });
  bool has_fork = false, has_main = false;
  for (const auto& e : graph.plan().entries()) {
    has_fork |= e.name == "forked.kv";
    has_main |= e.name == "main.kv";
  }
  CHECK(has_fork);
  CHECK(has_main);
  CHECK(graph.plan().entries().size() == 6);  // 2 dimensions + 1 workspace per stream
  const std::uintptr_t base = region_base(graph, "main.kv", kv1);
  CHECK(region_base(graph, "forked.kv", kv2) == base);  // one region, one plan
  CHECK(kv1 != kv2);
  CHECK(arena.stats().eager_blocks == 0);
  for (int step = 0; step < 4; ++step) {
    for (auto& l : lens) l = std::min(kMaxLen, l * 3 + step);
    d_lens.upload(lens, s);
    out1.fill_bytes(0, s);
    out2.fill_bytes(0, s);
    graph.replay(m.bind(lens), s);
    INFO("step " << step);
    CHECK(out1.download(s) == expected_flat(lens));
    CHECK(out2.download(s) == expected_flat(lens));
  }
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s2));
}

TEST_CASE_METHOD(GpuArena, "gpu: device memory stays flat over many capture/replay/destroy cycles", "[gpu][leak]") {
  arena.reserve(32 << 20, s);
  DevBuf<int> d_lens(8);
  DevBuf<std::int64_t> d_out(8 * kOutW);
  std::vector<int> lens(8);
  auto cycle = [&](int i) {
    for (int b = 0; b < 8; ++b) lens[b] = 1 + (i * 31 + b * 67) % kMaxLen;
    d_lens.upload(lens, s);
    const Bindings b = m.bind(lens);
    auto graph = capture(arena, s, b, [&](const Bindings& bb) {
      arena_step(arena, s, m, bb, safe, d_lens.p, d_out.p);
      // A 1 MiB scratch per graph so that a leaked region would show quickly.
      auto scratch = arena.request(s, "scratch", std::int64_t(1) << 20, 1, capacity_bound, bb);
      fill_kernel<<<64, kThreads, 0, s>>>(scratch.as<std::int64_t>(), scratch.count() / 8, i);
      check_launch();
    });
    graph.replay(b, s);
    if (i % 97 == 0) {
      d_out.fill_bytes(0, s);
      graph.replay(b, s);
      CHECK(d_out.download(s) == expected_flat(lens));
    }
  };  // the graph is destroyed here (synchronizes its stream first)
  for (int i = 0; i < 5; ++i) cycle(i);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  GRAPHSAFE_CUDA(cudaDeviceSynchronize());
  std::size_t free0 = 0, total = 0;
  GRAPHSAFE_CUDA(cudaMemGetInfo(&free0, &total));
  const ArenaStats st0 = arena.stats();
  const int cycles = cycles_from_env(1000);
  for (int i = 0; i < cycles; ++i) cycle(i);
  GRAPHSAFE_CUDA(cudaDeviceSynchronize());
  std::size_t free1 = 0;
  GRAPHSAFE_CUDA(cudaMemGetInfo(&free1, &total));
  INFO("cycles " << cycles << ", free before " << free0 << ", after " << free1);
  CHECK(free1 + (16ull << 20) >= free0);  // flat within 16 MiB (a leaked 1 MiB region per cycle would not be)
  check_back_to_slabs(st0, arena.stats());
}
