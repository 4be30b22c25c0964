// Reuse inside a capture on real streams: a range released during a capture is reused on another
// stream only after a join the captured graph records (cudaStreamGetCaptureInfo dependencies and
// graph reachability), never on an unjoined stream. Every workspace is filled by one kernel and
// checked by a later one; a replay that let two live workspaces share bytes counts mismatches.
// Meant to run clean under compute-sanitizer memcheck and racecheck as well.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "../support/gpu_test_support.hpp"
#include "../support/gpu_fill_check.cuh"

using namespace graphsafe;
using graphsafe_test::check;
using graphsafe_test::DevBuf;
using graphsafe_test::EventHolder;
using graphsafe_test::fill;
using graphsafe_test::join;
using graphsafe_test::StreamHolder;

namespace {

bool overlap(const Workspace& a, const Workspace& b) {
  auto x = reinterpret_cast<std::uintptr_t>(a.data()), y = reinterpret_cast<std::uintptr_t>(b.data());
  return x < y + b.bytes() && y < x + a.bytes();
}

constexpr std::int64_t kBytes = 4 << 20;

}  // namespace

TEST_CASE("gpu: a stream joined after the release reuses the range, an unjoined one does not", "[gpu][capture_reuse]") {
  CudaBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  StreamHolder s0, s1, s2;
  arena.reserve(64 << 20, s0.s);
  DevBuf<unsigned long long> bad(1);
  Bindings b;
  std::uintptr_t a_addr = 0, joined_addr = 0, unjoined_addr = 0;
  auto g = capture(arena, s0.s, b, [&](const Bindings& bb) {
    join(s0.s, s2.s);  // forked before the release: s2 must not reuse it
    {
      auto a = arena.request(s0.s, "a", kBytes, 1, capacity_bound, bb);
      a_addr = reinterpret_cast<std::uintptr_t>(a.data());
      fill(a, 0xA, s0.s);
      check(a, 0xA, bad.p, s0.s);
    }
    auto u = arena.request(s2.s, "unjoined", kBytes, 1, capacity_bound, bb);
    unjoined_addr = reinterpret_cast<std::uintptr_t>(u.data());
    fill(u, 0xC, s2.s);
    check(u, 0xC, bad.p, s2.s);
    join(s0.s, s1.s);  // after the release
    auto c = arena.request(s1.s, "joined", kBytes, 1, capacity_bound, bb);
    joined_addr = reinterpret_cast<std::uintptr_t>(c.data());
    fill(c, 0xB, s1.s);
    check(c, 0xB, bad.p, s1.s);
    join(s1.s, s0.s);
    join(s2.s, s0.s);
  });
  CHECK(joined_addr == a_addr);
  CHECK((unjoined_addr + kBytes <= a_addr || a_addr + kBytes <= unjoined_addr));
  CHECK(g.plan().bytes() == 2 * kBytes);
  CHECK(g.plan().peak_live_bytes() == 2 * kBytes);
  for (int i = 0; i < 20; ++i) g.replay(b, s0.s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s0.s));
  CHECK(bad.download(s0.s, 1)[0] == 0);
}

TEST_CASE("gpu: fork and join on 4 streams, per-layer workspaces, region of one layer, replays clean",
          "[gpu][capture_reuse]") {
  CudaBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  StreamHolder ss[4];
  arena.reserve(64 << 20, ss[0].s);
  DevBuf<unsigned long long> bad(1);
  Bindings b;
  auto g = capture(arena, ss[0].s, b, [&](const Bindings& bb) {
    for (int layer = 0; layer < 8; ++layer) {
      for (int i = 1; i < 4; ++i) join(ss[0].s, ss[i].s);
      std::vector<Workspace> ws;
      for (int i = 0; i < 4; ++i) {
        ws.push_back(arena.request(ss[i].s, "branch", kBytes / 4, 1, capacity_bound, bb));
        fill(ws.back(), static_cast<std::uint32_t>(layer * 16 + i), ss[i].s);
        check(ws.back(), static_cast<std::uint32_t>(layer * 16 + i), bad.p, ss[i].s);
      }
      for (std::size_t i = 0; i < ws.size(); ++i)
        for (std::size_t j = i + 1; j < ws.size(); ++j) CHECK_FALSE(overlap(ws[i], ws[j]));
      for (int i = 1; i < 4; ++i) join(ss[i].s, ss[0].s);
    }  // each branch releases on its own stream; the next layer's fork orders every release first
  });
  CHECK(g.plan().bytes() == kBytes);  // one layer's four branches, not eight layers'
  for (int i = 0; i < 20; ++i) g.replay(b, ss[0].s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(ss[0].s));
  CHECK(bad.download(ss[0].s, 1)[0] == 0);
}

TEST_CASE("gpu: estimate equals the region of the captures that follow it", "[gpu][capture_reuse][estimate]") {
  CudaBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  StreamHolder s0, s1;
  DevBuf<unsigned long long> bad(1);
  Symbol n = Symbol::fixed("gpu.est.n");
  std::vector<Bindings> buckets;
  for (int k : {8, 4, 2, 1}) buckets.push_back(Bindings().set(n, k));
  auto step = [&](const Bindings& bb) {
    for (int layer = 0; layer < 6; ++layer) {
      auto x = arena.request(s0.s, "x", Extent(n) * (1 << 18), 4, capacity_bound, bb);
      fill(x, 1, s0.s);
      join(s0.s, s1.s);
      auto y = arena.request(s1.s, "y", Extent(n) * (3 << 16) + layer * 4096, 4, capacity_bound, bb);
      fill(y, 2, s1.s);
      check(x, 1, bad.p, s0.s);
      check(y, 2, bad.p, s1.s);
      join(s1.s, s0.s);
    }
  };
  auto fam = arena.family("est");
  const std::uint64_t before = arena.stats().slab_bytes;
  const CaptureEstimate est = estimate(arena, s0.s, std::span<const Bindings>(buckets), step, {.family = fam});
  CHECK(arena.stats().slab_bytes == before);  // no memory taken
  arena.reserve(est.region_bytes, s0.s);
  std::vector<CapturedGraph> graphs;
  for (const Bindings& bb : buckets) graphs.push_back(capture(arena, s0.s, bb, step, {.family = fam}));
  CHECK(fam.region_bytes() == est.region_bytes);
  for (auto& g : graphs) g.replay(g.plan().captured_bindings(), s0.s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s0.s));
  CHECK(bad.download(s0.s, 1)[0] == 0);
}

// An estimate's workspaces have addresses no memory backs. Kernel arguments may hold them; whether
// the runtime accepts them in memset nodes at capture time is what this case shows on a GPU.
TEST_CASE("gpu: estimate of a function that memsets its workspaces", "[gpu][capture_reuse][estimate][!mayfail]") {
  CudaBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  StreamHolder s0;
  Bindings b;
  auto step = [&](const Bindings& bb) {
    for (int layer = 0; layer < 4; ++layer) {
      auto x = arena.request(s0.s, "x", kBytes, 1, capacity_bound, bb);
      GRAPHSAFE_CUDA(cudaMemsetAsync(x.data(), 0, x.bytes(), s0.s));
    }
  };
  CaptureEstimate est;
  REQUIRE_NOTHROW(est = estimate(arena, s0.s, b, step));
  CHECK(est.region_bytes == static_cast<std::uint64_t>(kBytes));
}
