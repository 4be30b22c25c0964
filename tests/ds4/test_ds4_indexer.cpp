// The lightning indexer's CPU reference (graphsafe/ds4/indexer.hpp): key rows, scores, the top-k
// rule, and the logits workspace as a graphsafe dimension that a capture-time size cannot outgrow.
#include <graphsafe/ds4/indexer.hpp>
#include <graphsafe/ds4/reference.hpp>
#include <graphsafe/graphsafe.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace ds4 = graphsafe::ds4;
using namespace graphsafe;

namespace {

struct HostIndexerCache {
  std::vector<std::uint8_t> bytes;
  ds4::IndexerCache view;
  explicit HostIndexerCache(int num_blocks) {
    view.num_blocks = num_blocks;
    bytes.assign(static_cast<std::size_t>(num_blocks) * view.stride, 0);
    view.base = bytes.data();
  }
};

std::vector<float> random_row(std::mt19937& rng, float sd) {
  std::normal_distribution<float> n(0.f, sd);
  std::vector<float> r(ds4::kIndexerDim);
  for (float& v : r) v = n(rng);
  return r;
}

}  // namespace

TEST_CASE("indexer rows keep 128 fp8 values and one scale at the layout's addresses", "[ds4][indexer]") {
  HostIndexerCache c(2);
  std::mt19937 rng(1);
  const std::vector<float> x = random_row(rng, 3.f);
  const std::int64_t slot = 64 + 5;  // block 1, row 5
  ds4::ref::indexer_insert(c.view, slot, x.data());

  // The layout, computed here from the header's description: data at block*stride + t*128, the
  // scale after the block's 64 data rows at 64*128 + t*4.
  const std::uint8_t* blk = c.bytes.data() + 1 * c.view.stride;
  float scale = 0.f;
  std::memcpy(&scale, blk + 64 * 128 + 5 * 4, 4);
  float amax = 0.f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  CHECK(scale == amax / 448.0f);
  for (int d = 0; d < ds4::kIndexerDim; ++d) {
    const float back = ds4::ref::fp8_e4m3_to_float(blk[5 * 128 + d]) * scale;
    // e4m3 keeps 3 mantissa bits: half a step is 1/16 of the value (plus the subnormal floor).
    CHECK(std::fabs(back - x[d]) <= std::fabs(x[d]) / 16.f + scale * 0x1p-9f);
  }
  // Every other byte of both blocks is untouched.
  std::size_t written = 0;
  for (std::uint8_t v : c.bytes) written += v != 0;
  CHECK(written <= ds4::kIndexerDim + 4);
  CHECK_THROWS_AS(ds4::ref::indexer_insert(c.view, 128, x.data()), std::invalid_argument);
}

TEST_CASE("indexer scores are the ReLU-weighted head sum over the stored fp8 rows", "[ds4][indexer]") {
  HostIndexerCache c(3);
  std::mt19937 rng(2);
  const std::vector<std::int32_t> table = {2, 0};  // request rows 0..63 in block 2, 64..127 in block 0
  const int n_c = 70;
  for (int s = 0; s < n_c; ++s) {
    const std::vector<float> x = random_row(rng, 1.f + s % 5);
    ds4::ref::indexer_insert(c.view, static_cast<std::int64_t>(table[s / 64]) * 64 + s % 64, x.data());
  }
  std::vector<float> q(ds4::kIndexerHeads * ds4::kIndexerDim), w(ds4::kIndexerHeads);
  std::uniform_int_distribution<int> byte(0, 0x7E);  // finite e4m3 codes of both signs via the sign bit below
  for (float& v : q) v = ds4::ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(byte(rng) | (rng() & 0x80)));
  std::normal_distribution<float> n(0.f, 1.f);
  for (float& v : w) v = n(rng);

  const std::vector<float> got = ds4::ref::indexer_scores(c.view, table.data(), n_c, q.data(), w.data());
  REQUIRE(got.size() == static_cast<std::size_t>(n_c));
  for (int s = 0; s < n_c; ++s) {
    // Independent evaluation in double from the raw bytes.
    const std::uint8_t* blk = c.bytes.data() + static_cast<std::size_t>(table[s / 64]) * c.view.stride;
    float scale = 0.f;
    std::memcpy(&scale, blk + 64 * 128 + (s % 64) * 4, 4);
    double want = 0;
    for (int h = 0; h < ds4::kIndexerHeads; ++h) {
      double dot = 0;
      for (int d = 0; d < ds4::kIndexerDim; ++d)
        dot += double(q[h * 128 + d]) * ds4::ref::fp8_e4m3_to_float(blk[(s % 64) * 128 + d]);
      want += double(w[h]) * std::max(dot, 0.0);
    }
    want *= scale;
    CHECK(got[s] == Approx(want).epsilon(1e-4).margin(1e-3));
  }
  CHECK(ds4::ref::indexer_scores(c.view, table.data(), 0, q.data(), w.data()).empty());
}

TEST_CASE("indexer top-k takes every row in order when n_c <= K (short context)", "[ds4][indexer][topk]") {
  const std::vector<float> scores = {5.f, -1.f, 9.f, 0.f, 3.f, 7.f, 2.f, 8.f};
  for (int n_c : {0, 1, 5, 8}) {
    const std::vector<std::int32_t> got = ds4::ref::indexer_topk(scores.data(), n_c, 8);
    REQUIRE(got.size() == 8);
    for (int i = 0; i < 8; ++i) CHECK(got[i] == (i < n_c ? i : -1));
  }
}

TEST_CASE("indexer top-k keeps the K best rows in row order, ties to the lower row, -0 equals +0",
          "[ds4][indexer][topk]") {
  //                               0    1    2    3     4    5    6     7    8    9
  const std::vector<float> scores = {1.f, 4.f, 4.f, 0.f, -0.f, 9.f, 4.f, -2.f, 0.f, 7.f};
  const std::vector<std::int32_t> got = ds4::ref::indexer_topk(scores.data(), 10, 8);
  // 9, 7, 4 (rows 1, 2, 6), 1 and two of the three 0s (rows 3, 4, 8: -0 ties with +0, the lower
  // rows win): rows 0 1 2 3 4 5 6 9, listed in row order. Row 8 (a tie) and row 7 (-2) are out.
  const std::vector<std::int32_t> want = {0, 1, 2, 3, 4, 5, 6, 9};
  CHECK(got == want);
  // A tie that crosses K keeps the lower row even when it lies after a higher pick.
  const std::vector<float> cross = {3.f, 5.f, 3.f, 3.f, 8.f};
  CHECK(ds4::ref::indexer_topk(cross.data(), 5, 3) == std::vector<std::int32_t>{0, 1, 4});
  // Rows past n_c are never picked, whatever their scores.
  const std::vector<float> tail = {1.f, 2.f, 3.f, 100.f};
  CHECK(ds4::ref::indexer_topk(tail.data(), 3, 2) == std::vector<std::int32_t>{1, 2});
  CHECK_THROWS_AS(ds4::ref::indexer_topk(tail.data(), 3, 0), std::invalid_argument);
  CHECK_THROWS_AS(ds4::ref::indexer_topk(tail.data(), -1, 2), std::invalid_argument);
}

TEST_CASE("indexer top-k at capacity length picks the K best of every visible row", "[ds4][indexer][topk]") {
  const int max_len = 512, K = 8, n_c = max_len / ds4::kIndexerRatio;  // 128 rows: all of them visible
  std::vector<float> scores(n_c);
  for (int s = 0; s < n_c; ++s) scores[s] = static_cast<float>((s * 37) % n_c);  // a permutation of 0..127
  const std::vector<std::int32_t> got = ds4::ref::indexer_topk(scores.data(), n_c, K);
  // The K largest values, n_c - K .. n_c - 1, each once; listed in ascending row order.
  std::vector<float> picked;
  for (int i = 0; i < K; ++i) picked.push_back(scores[got[i]]);
  std::sort(picked.begin(), picked.end());
  for (int i = 0; i < K; ++i) CHECK(picked[i] == static_cast<float>(n_c - K + i));
  CHECK(std::is_sorted(got.begin(), got.end()));
}

TEST_CASE("indexer key compression pools the C4 slots, then norms and ropes a 128-wide row", "[ds4][indexer]") {
  // Equal gates make the pooled value the mean of the slots' keys; j = 0 uses the current group's
  // second channels only, j = 1 also the previous group's first channels.
  const int tokens = 8, row = 2 * ds4::kIndexerDim;
  std::vector<float> kv(tokens * row), score(tokens * row, 0.25f), norm(ds4::kIndexerDim, 1.f);
  for (int t = 0; t < tokens; ++t)
    for (int ch = 0; ch < row; ++ch) kv[t * row + ch] = static_cast<float>(t + 1) * (ch < 128 ? 1.f : -1.f) + 0.01f * ch;
  auto expect = [&](int j) {
    std::vector<float> m(ds4::kIndexerDim, 0.f);
    int slots = 0;
    for (int t = 4 * j - 4; t < 4 * j && j > 0; ++t, ++slots)
      for (int d = 0; d < 128; ++d) m[d] += kv[t * row + d];
    for (int t = 4 * j; t < 4 * j + 4; ++t, ++slots)
      for (int d = 0; d < 128; ++d) m[d] += kv[t * row + 128 + d];
    double ss = 0;
    for (float& v : m) { v /= static_cast<float>(slots); ss += double(v) * v; }
    const double inv = 1.0 / std::sqrt(ss / 128 + 1e-6);
    for (float& v : m) v = static_cast<float>(v * inv);
    return m;
  };
  std::vector<float> out(ds4::kIndexerDim);
  ds4::ref::indexer_compress_row(0, kv.data(), score.data(), norm.data(), 10000.f, 1e-6f, out.data());
  const std::vector<float> e0 = expect(0);
  for (int d = 0; d < 128; ++d) CHECK(out[d] == Approx(e0[d]).margin(1e-5));  // position 0: rope is the identity
  ds4::ref::indexer_compress_row(1, kv.data(), score.data(), norm.data(), 10000.f, 1e-6f, out.data());
  const std::vector<float> e1 = expect(1);
  for (int d = 0; d < 64; ++d) CHECK(out[d] == Approx(e1[d]).margin(1e-5));  // unroped half
  // Rope at position 4 rotates pairs: their lengths are kept.
  for (int i = 0; i < 32; ++i) {
    const float a = e1[64 + 2 * i], b = e1[65 + 2 * i];
    CHECK(std::hypot(out[64 + 2 * i], out[65 + 2 * i]) == Approx(std::hypot(a, b)).margin(1e-5));
  }
  CHECK_THROWS_AS(ds4::ref::indexer_compress_row(-1, kv.data(), score.data(), norm.data(), 1e4f, 1e-6f, out.data()),
                  std::invalid_argument);
}

TEST_CASE("the indexer's logits stride sized at capture time is flagged and refused once sequences grow",
          "[ds4][indexer][graph]") {
  // The logits workspace [R, N] with N = max_b floor(L_b / 4): an exact capture-time N freezes the
  // row stride, so a longer replay would write request b's rows into request b+1's.
  const Symbol R = Symbol::fixed("requests");
  const Symbol L = Symbol::batch("seq_lens", R, /*capacity=*/512);
  const Extent rows = max_over(L, [](const Extent& l) { return floor_div(l, ds4::kIndexerRatio); });
  HostBackend backend;
  HostStream s;
  Bindings b;
  b.set(R, 2).set(L, {3, 5});

  for (const bool exact : {true, false}) {
    Arena arena(backend, ArenaOptions{.report_findings = false});
    arena.reserve(1 << 20, s);
    std::int64_t frozen = -1;
    auto graph = capture(arena, s, b, [&](const Bindings& bb) {
      const SizingPolicy& policy = exact ? static_cast<const SizingPolicy&>(exact_at_capture) : capacity_bound;
      frozen = arena.dimension(s, "indexer_rows", rows, policy, bb);
      auto logits = arena.request(s, "indexer_logits", Extent(R) * frozen, sizeof(float), policy, bb);
      (void)logits;
    });
    CHECK(frozen == (exact ? 1 : 128));
    CHECK(graph.plan().findings().empty() == !exact);
    Bindings grown;
    grown.set(R, 2).set(L, {15, 17});
    if (exact) {
      CHECK_THROWS_AS(graph.replay(grown, s), guard_failure);
    } else {
      CHECK_NOTHROW(graph.replay(grown, s));
    }
  }
}
