// The bug that started graphsafe, at arena level on the host backend: a DS4-style gather workspace
// whose compressed part (N rows) and SWA part (G rows, at offset N) are sized from sequence lengths.
// Capture at lengths [3,5]; the sequences grow to [15,17] and beyond. Under exact-at-capture the
// guard refuses the replay (and with guards bypassed the replay really corrupts: the check can
// fail); under capacity-bound + static-query-bound every replay equals eager execution.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cstdint>
#include <vector>

#include "../support/seed_model.hpp"

using namespace graphsafe;
using namespace graphsafe_test::seed;

namespace {

// The "kernels": gather compressed rows then SWA rows into ws[b*M + ...] with N, M frozen (kernel
// arguments), reading the lengths from `dev_lens` (a device buffer updated before each replay);
// then "attention" reads the rows named by the combined indices into out[b][...].
void decode_step(HostStream& s, std::int64_t* ws, std::int64_t N, std::int64_t M, const std::vector<int>& dev_lens,
                 std::vector<std::vector<std::int64_t>>& out) {
  const int R = static_cast<int>(dev_lens.size());
  s.launch([=, &dev_lens] {
    for (int b = 0; b < R; ++b) {
      const int L = dev_lens[b], n_c = L / kRatio, gb = std::min(L, kWindow);
      for (int c = 0; c < n_c; ++c) ws[b * M + c] = cmp_value(b, c);
      for (int i = 0; i < gb; ++i) ws[b * M + N + i] = swa_value(b, L - gb + i);
    }
  });
  s.launch([=, &dev_lens, &out] {
    for (int b = 0; b < R; ++b) {
      const int L = dev_lens[b], n_c = L / kRatio, gb = std::min(L, kWindow);
      out[b].clear();
      for (int c = 0; c < n_c; ++c) out[b].push_back(ws[b * M + c]);
      for (int i = 0; i < gb; ++i) out[b].push_back(ws[b * M + N + i]);
    }
  });
}

struct Policies {
  const SizingPolicy& compressed;
  const SizingPolicy& swa;
};

}  // namespace

TEST_CASE("seed scenario: safe policies replay equal to eager after sequences grow", "[seed]") {
  Model m;
  HostBackend backend;
  Arena arena(backend);
  HostStream s;
  arena.reserve(1 << 20, s);
  const StaticQueryBound swa_bound(Extent(m.W));  // one query token per request: G <= W
  const Policies policies[] = {{capacity_bound, swa_bound}, {capacity_bound, capacity_bound}};
  for (const auto& pol : policies) {
    std::vector<int> dev_lens = {3, 5};
    std::vector<std::vector<std::int64_t>> out(2);
    Bindings b;
    b.set(m.R, 2).set(m.W, kWindow).set(m.L, {3, 5});
    auto graph = capture(arena, s, b, [&](const Bindings& bb) {
      const std::int64_t N = arena.dimension(s, "kv.compressed_rows", m.n_c, pol.compressed, bb);
      const std::int64_t G = arena.dimension(s, "kv.swa_rows", m.g, pol.swa, bb);
      const std::int64_t M = N + G;
      auto ws = arena.request(s, "kv", Extent(m.R) * M, sizeof(std::int64_t), capacity_bound, bb);
      decode_step(s, ws.as<std::int64_t>(), N, M, dev_lens, out);
    });
    CHECK(graph.plan().guard_count() == 0);  // both policies proved replay-safe at capture
    for (std::vector<int> lens : {std::vector<int>{3, 5}, {15, 17}, {255, 257}, {511, 512}}) {
      dev_lens = lens;
      b.set(m.L, {lens[0], lens[1]});
      graph.replay(b, s);
      CHECK(out == expected_rows(lens));
    }
  }
}

TEST_CASE("seed scenario: exact-at-capture is reported at capture and refused by the guard", "[seed]") {
  Model m;
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  arena.reserve(1 << 20, s);
  std::vector<int> dev_lens = {3, 5};
  std::vector<std::vector<std::int64_t>> out(2);
  Bindings b;
  b.set(m.R, 2).set(m.W, kWindow).set(m.L, {3, 5});
  std::int64_t* canary = nullptr;
  constexpr std::int64_t kCanaryRows = 4096;
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    const std::int64_t N = arena.dimension(s, "kv.compressed_rows", m.n_c, exact_at_capture, bb);
    const std::int64_t G = arena.dimension(s, "kv.swa_rows", m.g, exact_at_capture, bb);
    CHECK(N == 1);  // docs/ds4_model.md §4.3 worked example: N = max(3//4, 5//4) = 1, G = 4, M = 5
    CHECK(G == 4);
    const std::int64_t M = N + G;
    auto ws = arena.request(s, "kv", Extent(m.R) * M, sizeof(std::int64_t), exact_at_capture, bb);
    auto guard = arena.request(s, "canary", kCanaryRows, sizeof(std::int64_t), capacity_bound, bb);
    canary = guard.as<std::int64_t>();
    decode_step(s, ws.as<std::int64_t>(), N, M, dev_lens, out);
  });
  for (std::int64_t i = 0; i < kCanaryRows; ++i) canary[i] = -7;

  // Detection at capture time: the compressed-row dimension depends on seq_lens with no bound.
  const auto& findings = graph.plan().findings();
  REQUIRE(findings.size() == 2);  // both dimensions: min(L, W) is dynamic too (L < W is possible)
  CHECK(findings[0].request == "kv.compressed_rows");
  CHECK(findings[1].request == "kv.swa_rows");
  CHECK_THAT(findings[0].message, Catch::Contains("seq_lens = [3, 5]"));
  CHECK_THAT(findings[0].site, Catch::Contains("test_seed_scenario.cpp"));

  // At the capture-time lengths the replay is allowed and right.
  graph.replay(b, s);
  CHECK(out == expected_rows({3, 5}));

  // After growth the guard refuses before launch, naming request, symbol, value and limit.
  dev_lens = {15, 17};
  b.set(m.L, {15, 17});
  out.assign(2, {});
  try {
    graph.replay(b, s);
    FAIL("replay at [15,17] should have been refused");
  } catch (const guard_failure& e) {
    REQUIRE(!e.violations().empty());
    CHECK(e.violations()[0].request == "kv.compressed_rows");
    CHECK(e.violations()[0].required == 4);
    CHECK(e.violations()[0].reserved == 1);
    CHECK_THAT(std::string(e.what()), Catch::Contains("seq_lens = [15, 17]") && Catch::Contains("captured [3, 5]"));
  }
  CHECK(out == std::vector<std::vector<std::int64_t>>(2));  // never launched

  // Proof the check can fail: bypass the guard and the replay is wrong (SWA rows overwrite the
  // compressed rows beyond N = 1), exactly the seed's silent corruption.
  graph.replay_unguarded_for_testing(s);
  CHECK(out != expected_rows({15, 17}));
  // Further growth writes past the workspace into its neighbour.
  dev_lens = {255, 257};  // past the 256-byte alignment padding behind the 10-row workspace
  graph.replay_unguarded_for_testing(s);
  bool canary_hit = false;
  for (std::int64_t i = 0; i < kCanaryRows; ++i) canary_hit |= canary[i] != -7;
  CHECK(canary_hit);
}

TEST_CASE("seed scenario: a recapture hook re-captures at a larger bucket instead of failing", "[seed]") {
  Model m;
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  arena.reserve(1 << 20, s);
  std::vector<int> dev_lens = {3, 5};
  std::vector<std::vector<std::int64_t>> out(2);
  Bindings b;
  b.set(m.R, 2).set(m.W, kWindow).set(m.L, {3, 5});
  CaptureOptions opts;
  opts.recapture = [&](const Bindings& refused) -> std::optional<Bindings> {
    Bindings bucket = refused;  // round every length up to the next multiple of 64 (the bucket)
    std::vector<std::int64_t> up;
    for (auto v : refused.values(m.L)) up.push_back(std::min<std::int64_t>((v + 63) / 64 * 64, kMaxLen));
    bucket.set(m.L, std::span<const std::int64_t>(up));
    return bucket;
  };
  auto graph = capture(
      arena, s, b,
      [&](const Bindings& bb) {
        const std::int64_t N = arena.dimension(s, "kv.compressed_rows", m.n_c, exact_at_capture, bb);
        const std::int64_t G = arena.dimension(s, "kv.swa_rows", m.g, exact_at_capture, bb);
        auto ws = arena.request(s, "kv", Extent(m.R) * (N + G), sizeof(std::int64_t), exact_at_capture, bb);
        decode_step(s, ws.as<std::int64_t>(), N, N + G, dev_lens, out);
      },
      opts);
  for (std::vector<int> lens : {std::vector<int>{15, 17}, {60, 63}, {255, 257}}) {
    dev_lens = lens;
    b.set(m.L, {lens[0], lens[1]});
    graph.replay(b, s);
    CHECK(out == expected_rows(lens));
  }
  CHECK(graph.recaptures() == 2);  // [15,17] -> bucket 64; [60,63] fits; [255,257] -> bucket 320
}
