// Virtual growth on the host twin (HostVirtualMemory: mmap PROT_NONE + memfd chunks, so touching an
// unmapped address faults exactly as it would on the GPU). The DS4 seed scenario at arena level: a
// gather workspace [R, M, E] sized by capacity (N = max_model_len / 4 compressed rows, G = W SWA
// rows) whose per-request footprint is two ranges: compressed rows [b*M, b*M + n_c) and SWA rows
// [b*M + N, b*M + N + min(L, W)). Every row is written whole, so a missing mapping crashes the test.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cstdint>
#include <memory>
#include <vector>

using namespace graphsafe;

namespace {

constexpr int kWindow = 4;
constexpr int kRatio = 4;
constexpr int kMaxLen = 512;
constexpr int kRowElems = 512;                 // int64 elements per row: 4 KiB rows
constexpr std::uint64_t kGranule = 64 << 10;   // 16 rows per granule

struct Model {
  Symbol R = Symbol::fixed("requests");
  Symbol W = Symbol::fixed("window");
  Symbol L = Symbol::batch("seq_lens", R, kMaxLen);
  Extent n_c = max_over(L, [](const Extent& l) { return floor_div(l, kRatio); });
  Extent g = max_over(L, [&](const Extent& l) { return min(l, Extent(W)); });
  Bindings bind(const std::vector<int>& lens) const {
    std::vector<std::int64_t> v(lens.begin(), lens.end());
    Bindings b;
    b.set(R, static_cast<std::int64_t>(lens.size())).set(W, kWindow).set(L, std::span<const std::int64_t>(v));
    return b;
  }
};

std::int64_t cmp_value(int b, int c) { return 1'000'000LL * (b + 1) + 500'000 + c; }
std::int64_t swa_value(int b, int pos) { return 1'000'000LL * (b + 1) + pos; }

std::vector<std::vector<std::int64_t>> expected(const std::vector<int>& lens) {
  std::vector<std::vector<std::int64_t>> e(lens.size());
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const int L = lens[b], n_c = L / kRatio, gb = std::min(L, kWindow);
    for (int c = 0; c < n_c; ++c) e[b].push_back(cmp_value(static_cast<int>(b), c));
    for (int i = 0; i < gb; ++i) e[b].push_back(swa_value(static_cast<int>(b), L - gb + i));
  }
  return e;
}

// The step: sizes N, G (dimensions) and the workspace through the arena, then "gather" (writes whole
// rows) and "attention" (reads them back). Records the workspace address it got.
struct Step {
  Arena& arena;
  const Model& m;
  std::vector<int>& dev_lens;                     // "device" lengths, updated before each replay
  std::vector<std::vector<std::int64_t>>& out;
  const SizingPolicy& cmp_policy;
  const SizingPolicy& swa_policy;
  bool footprint = true;
  bool bad_footprint = false;                     // SWA range one row too long for the last request
  void* ws_seen = nullptr;

  void operator()(HostStream& s, const Bindings& b) {
    const std::int64_t N = arena.dimension(s, "kv.compressed_rows", m.n_c, cmp_policy, b);
    const std::int64_t G = arena.dimension(s, "kv.swa_rows", m.g, swa_policy, b);
    const std::int64_t M = N + G;
    const Extent need = Extent(m.R) * M * kRowElems;
    const int extra = bad_footprint ? 1 : 0;
    Footprint fp = Footprint::per_request_ranges(m.L, M * kRowElems, [&](const Extent& l) {
      return std::vector<FootprintRange>{{0, floor_div(l, kRatio) * kRowElems},
                                         {N * kRowElems, (min(l, Extent(m.W)) + extra) * kRowElems}};
    });
    Workspace ws = footprint ? arena.request(s, "kv", need, 8, capacity_bound, b, fp)
                             : arena.request(s, "kv", need, 8, capacity_bound, b);
    auto* p = ws.as<std::int64_t>();
    ws_seen = p;
    const int R = static_cast<int>(dev_lens.size());
    std::vector<int>* lens = &dev_lens;
    s.launch([=] {
      for (int r = 0; r < R; ++r) {
        const int L = (*lens)[r], n_c = L / kRatio, gb = std::min(L, kWindow);
        for (int c = 0; c < n_c; ++c)
          for (int e = 0; e < kRowElems; ++e) p[(r * M + c) * kRowElems + e] = cmp_value(r, c);
        for (int i = 0; i < gb; ++i)
          for (int e = 0; e < kRowElems; ++e) p[(r * M + N + i) * kRowElems + e] = swa_value(r, L - gb + i);
      }
    });
    auto* o = &out;
    s.launch([=] {
      for (int r = 0; r < R; ++r) {
        const int L = (*lens)[r], n_c = L / kRatio, gb = std::min(L, kWindow);
        (*o)[r].clear();
        for (int c = 0; c < n_c; ++c) (*o)[r].push_back(p[(r * M + c) * kRowElems + kRowElems - 1]);
        for (int i = 0; i < gb; ++i) (*o)[r].push_back(p[(r * M + N + i) * kRowElems + kRowElems - 1]);
      }
    });
  }
};

struct Fixture {
  std::shared_ptr<HostVirtualMemory> vm;
  HostBackend backend;
  std::unique_ptr<Arena> arena;
  HostStream s;
  Model m;
  std::vector<int> dev_lens{3, 5};
  std::vector<std::vector<std::int64_t>> out{2};
  StaticQueryBound swa_bound{Extent(m.W)};
  explicit Fixture(HostVirtualMemoryOptions vo = {.granularity = kGranule}, ArenaOptions ao = {}) {
    vm = std::make_shared<HostVirtualMemory>(vo);
    ao.virtual_memory = vm;
    ao.virtual_reserve_bytes = 64ull << 20;
    ao.report_findings = false;
    arena = std::make_unique<Arena>(backend, ao);
  }
  Step step() { return Step{*arena, m, dev_lens, out, capacity_bound, swa_bound}; }
};

std::uint64_t kv_capacity_bytes() {
  const std::uint64_t M = kMaxLen / kRatio + kWindow;
  return 2 * M * kRowElems * 8;
}

}  // namespace

TEST_CASE("virtual: capture maps the capture-time footprint, replays grow it behind the same addresses",
          "[virtual]") {
  Fixture f;
  Step st = f.step();
  Bindings b = f.m.bind(f.dev_lens);
  auto graph = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st(f.s, bb); });
  void* const ws = st.ws_seen;
  const auto at_capture = graph.virtual_stats(&b);
  REQUIRE(at_capture.virtual_mode);
  CHECK(at_capture.granularity == kGranule);
  CHECK(at_capture.reserved_bytes >= kv_capacity_bytes());
  // Capture-time need: request 0's first granule (rows 0..15, SWA rows lie at N = 128), the SWA rows
  // of both requests, request 1's compressed row: a handful of granules, far below the bound.
  CHECK(at_capture.committed_bytes <= 4 * kGranule);
  CHECK(at_capture.committed_bytes < kv_capacity_bytes() / 4);
  CHECK(f.arena->committed_bytes() == at_capture.committed_bytes);
  CHECK(f.backend.bytes_in_use() == 0);  // no slab: captured memory comes from the virtual range

  std::uint64_t prev = at_capture.committed_bytes;
  for (std::vector<int> lens : {std::vector<int>{3, 5}, {15, 17}, {100, 60}, {255, 257}, {511, 512}}) {
    INFO("lengths " << lens[0] << "," << lens[1]);
    f.dev_lens = lens;
    b = f.m.bind(lens);
    graph.replay(b, f.s);
    CHECK(f.out == expected(lens));
    const auto vs = graph.virtual_stats(&b);
    CHECK(vs.committed_bytes >= prev);                         // never unmapped behind a graph
    CHECK(vs.committed_bytes >= vs.granule_need_bytes);        // everything touched is mapped
    CHECK(vs.granule_need_bytes >= vs.exact_need_bytes);
    CHECK(vs.committed_bytes <= vs.granule_need_bytes + 2 * kGranule);  // + first granule, growth high-water
    prev = vs.committed_bytes;
  }
  CHECK(prev <= graph.virtual_stats().reserved_bytes + kGranule);
  // Eager run of the same step at the largest lengths: same results, ordinary slab memory.
  Step eager = f.step();
  eager(f.s, b);
  CHECK(f.out == expected({511, 512}));
  CHECK(eager.ws_seen != ws);
  // The graph's workspace never moved: a re-capture-free replay wrote through the same pointer.
  CHECK(st.ws_seen == ws);
}

TEST_CASE("virtual: a replay whose need did not grow takes the fast path and maps nothing", "[virtual]") {
  Fixture f;
  Step st = f.step();
  f.dev_lens = {200, 300};
  Bindings b = f.m.bind(f.dev_lens);
  auto graph = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st(f.s, bb); });
  graph.replay(b, f.s);  // first replay: full pass, thresholds computed
  const auto first = graph.virtual_stats();
  const auto created = f.vm->stats().chunks_created;
  for (std::vector<int> lens : {std::vector<int>{200, 300}, {201, 301}, {10, 20}, {199, 303}}) {
    f.dev_lens = lens;
    b = f.m.bind(lens);
    graph.replay(b, f.s);
    CHECK(f.out == expected(lens));
  }
  const auto after = graph.virtual_stats();
  CHECK(after.fast_commits == first.fast_commits + 4);
  CHECK(after.slow_commits == first.slow_commits);
  CHECK(after.committed_bytes == first.committed_bytes);
  CHECK(f.vm->stats().chunks_created == created);
  // One request crosses into an unmapped granule: only the slow path for that request, one grow.
  f.dev_lens = {200, 512};
  b = f.m.bind(f.dev_lens);
  graph.replay(b, f.s);
  CHECK(f.out == expected(f.dev_lens));
  CHECK(graph.virtual_stats().grow_events == after.grow_events + 1);
}

TEST_CASE("virtual: chunks are pooled and reused across graphs; shrink unmaps only what is not needed",
          "[virtual]") {
  Fixture f;
  Bindings b = f.m.bind(f.dev_lens);
  std::uint64_t created_first = 0;
  {
    Step st = f.step();
    auto graph = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st(f.s, bb); });
    f.dev_lens = {511, 512};
    b = f.m.bind(f.dev_lens);
    graph.replay(b, f.s);
    CHECK(f.out == expected(f.dev_lens));
    created_first = f.vm->stats().chunks_created;
    CHECK(f.vm->stats().chunks_mapped * kGranule == f.arena->committed_bytes());
  }
  // The graph died: its family is idle, its chunks are back in the pool (not in the driver).
  CHECK(f.arena->committed_bytes() == 0);
  CHECK(f.vm->stats().chunks_mapped == 0);
  CHECK(f.vm->stats().chunks_pooled == created_first);
  // A new graph (new family) maps from the pool: no chunk is created.
  const auto hits = f.vm->stats().pool_hits;
  Step st2 = f.step();
  f.dev_lens = {300, 400};
  b = f.m.bind(f.dev_lens);
  auto g2 = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st2(f.s, bb); });
  g2.replay(b, f.s);
  CHECK(f.out == expected(f.dev_lens));
  CHECK(f.vm->stats().chunks_created == created_first);
  CHECK(f.vm->stats().pool_hits > hits);

  // Shrink to what short sequences need: fewer chunks mapped, the next replay maps back what it needs.
  const auto before = f.arena->committed_bytes();
  f.dev_lens = {3, 5};
  b = f.m.bind(f.dev_lens);
  f.arena->shrink(f.s, b);
  const auto shrunk = f.arena->committed_bytes();
  CHECK(shrunk < before);
  CHECK(shrunk >= g2.virtual_stats(&b).granule_need_bytes);
  g2.replay(b, f.s);  // fits what was kept: correct without mapping more
  CHECK(f.out == expected(f.dev_lens));
  f.dev_lens = {480, 500};
  b = f.m.bind(f.dev_lens);
  g2.replay(b, f.s);  // grows again, behind the same addresses
  CHECK(f.out == expected(f.dev_lens));
  CHECK(f.arena->committed_bytes() > shrunk);
  // Shrink without bindings: everything goes; a replay maps everything back.
  f.arena->shrink(f.s);
  CHECK(f.arena->committed_bytes() == 0);
  g2.replay(b, f.s);
  CHECK(f.out == expected(f.dev_lens));
  // Pooled chunks can be given back to the "driver".
  f.arena->shrink(f.s);
  f.vm->trim_pool();
  CHECK(f.vm->stats().chunks_pooled == 0);
  CHECK(f.vm->stats().chunks_released > 0);
  g2.replay(b, f.s);
  CHECK(f.out == expected(f.dev_lens));
}

TEST_CASE("virtual: shrink refuses while a capture is under way", "[virtual]") {
  Fixture f;
  Step st = f.step();
  Bindings b = f.m.bind(f.dev_lens);
  auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st(f.s, bb); });
  HostStream other;
  CaptureFamily fam = f.arena->family("other");
  CaptureSession session(*f.arena, other, b, CaptureOptions{.family = fam});
  CHECK_THROWS_AS(f.arena->shrink(other), capture_state_error);  // on the capturing stream
  CHECK_THROWS_AS(f.arena->shrink(f.s), capture_state_error);    // while a family captures
}

TEST_CASE("virtual: the guard still refuses what the reservation cannot hold, before anything runs",
          "[virtual]") {
  Fixture f;
  Step st{*f.arena, f.m, f.dev_lens, f.out, exact_at_capture, exact_at_capture};
  Bindings b = f.m.bind(f.dev_lens);
  auto graph = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st(f.s, bb); });
  CHECK(graph.plan().guard_count() > 0);
  const auto committed = f.arena->committed_bytes();
  f.dev_lens = {15, 17};
  b = f.m.bind(f.dev_lens);
  f.out = {{-1}, {-1}};
  CHECK_THROWS_AS(graph.replay(b, f.s), guard_failure);
  CHECK(f.out == std::vector<std::vector<std::int64_t>>{{-1}, {-1}});  // never launched
  CHECK(f.arena->committed_bytes() == committed);                       // nothing mapped for it
}

TEST_CASE("virtual: a footprint that leaves the reservation is refused before launch", "[virtual]") {
  Fixture f;
  Step st = f.step();
  st.bad_footprint = true;  // SWA range one row longer than G: request 1 reaches past the workspace
  f.dev_lens = {3, 2};
  Bindings b = f.m.bind(f.dev_lens);
  auto graph = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st(f.s, bb); });
  f.dev_lens = {3, 4};  // min(4, W) + 1 = 5 SWA rows for the last request: beyond M
  b = f.m.bind(f.dev_lens);
  f.out = {{-1}, {-1}};
  try {
    graph.replay(b, f.s);
    FAIL("replay was not refused");
  } catch (const guard_failure& e) {
    CHECK_THAT(e.what(), Catch::Contains("footprint of 'kv'"));
    CHECK_THAT(e.what(), Catch::Contains("request 1"));
  }
  CHECK(f.out == std::vector<std::vector<std::int64_t>>{{-1}, {-1}});
}

TEST_CASE("virtual: graphs of one family share the address range and its mapping", "[virtual]") {
  Fixture f;
  CaptureFamily fam = f.arena->family("decode");
  Step small = f.step();
  Step large = f.step();
  Bindings b = f.m.bind(f.dev_lens);
  auto g1 = capture(*f.arena, f.s, b, [&](const Bindings& bb) { small(f.s, bb); }, CaptureOptions{.family = fam});
  // A second bucket (3 requests) of the same family.
  f.dev_lens = {7, 9, 11};
  f.out.resize(3);
  Bindings b3 = f.m.bind(f.dev_lens);
  auto g2 = capture(*f.arena, f.s, b3, [&](const Bindings& bb) { large(f.s, bb); }, CaptureOptions{.family = fam});
  CHECK(small.ws_seen == large.ws_seen);  // both plans start at the family's base
  CHECK(g1.virtual_stats().va_bytes == g2.virtual_stats().va_bytes);
  f.dev_lens = {300, 200, 100};
  b3 = f.m.bind(f.dev_lens);
  g2.replay(b3, f.s);
  CHECK(f.out == expected(f.dev_lens));
  const auto shared = f.arena->committed_bytes();
  CHECK(g1.virtual_stats().committed_bytes == shared);
  f.dev_lens = {250, 150};
  f.out.resize(2);
  b = f.m.bind(f.dev_lens);
  g1.replay(b, f.s);
  CHECK(f.out == expected(f.dev_lens));
  CHECK(f.arena->committed_bytes() >= shared);
  CHECK(fam.graphs() == 2);
}

TEST_CASE("virtual: without a footprint the whole need is mapped (static need) or its prefix (dynamic)",
          "[virtual]") {
  Fixture f;
  Bindings b = f.m.bind(f.dev_lens);
  void* p_static = nullptr;
  void* p_dyn = nullptr;
  const Extent dyn = sum_over(f.m.L, [](const Extent& l) { return l; }) * kRowElems;
  auto graph = capture(*f.arena, f.s, b, [&](const Bindings& bb) {
    auto a = f.arena->request(f.s, "static", Extent(f.m.R) * static_cast<std::int64_t>(3 * kGranule / 8 / 2), 8, capacity_bound, bb);
    auto d = f.arena->request(f.s, "dynamic", dyn, 8, capacity_bound, bb);
    p_static = a.data();
    p_dyn = d.data();
    auto* q = d.as<std::int64_t>();
    const std::vector<int>* lens = &f.dev_lens;
    f.s.launch([=] {
      std::int64_t n = 0;
      for (int l : *lens) n += l;
      for (std::int64_t i = 0; i < n * kRowElems; ++i) q[i] = i;
    });
  });
  CHECK(f.vm->is_mapped(p_static, 3 * kGranule));
  CHECK(!f.vm->is_mapped(static_cast<char*>(p_dyn) + 8 * 8 * kRowElems + kGranule, 1));
  f.dev_lens = {400, 500};
  b = f.m.bind(f.dev_lens);
  graph.replay(b, f.s);
  CHECK(f.vm->is_mapped(p_dyn, 900ull * kRowElems * 8));
  const auto s1 = graph.virtual_stats();
  graph.replay(b, f.s);
  CHECK(graph.virtual_stats().fast_commits == s1.fast_commits + 1);
}

TEST_CASE("virtual: footprints are validated when made", "[virtual]") {
  Model m;
  Symbol dyn = Symbol::dynamic("tokens", 100);
  CHECK_THROWS_AS(Footprint::per_request(dyn, 10, [](const Extent& l) { return l; }), invalid_argument_error);
  CHECK_THROWS_AS(Footprint::per_request(m.L, Extent(dyn), [](const Extent& l) { return l; }), invalid_argument_error);
  CHECK_THROWS_AS(Footprint::per_request(m.L, 10, [&](const Extent& l) { return l + Extent(dyn); }),
                  invalid_argument_error);
  CHECK_THROWS_AS(Footprint::per_request_ranges(m.L, 10,
                                                [&](const Extent& l) {
                                                  return std::vector<FootprintRange>{{l, 1}};
                                                }),
                  invalid_argument_error);
  CHECK_THROWS_AS(Footprint::per_request(m.L, 10, [](const Extent& l) { return ceil_div(Extent(100), l + 1); }),
                  invalid_argument_error);
  const Footprint ok = Footprint::per_request(m.L, Extent(m.W) * 2, [&](const Extent& l) { return min(l, Extent(m.W)); });
  CHECK(ok.kind() == Footprint::Kind::per_request);
  CHECK(ok.ranges().size() == 1);
  // One element symbol per batch symbol, however many footprints are made.
  const Footprint again = Footprint::per_request(m.L, 1, [](const Extent& l) { return l; });
  CHECK(*again.element_symbol() == *ok.element_symbol());
}

TEST_CASE("virtual: a physical limit refuses the replay before launch and leaves the graph usable",
          "[virtual]") {
  Fixture f(HostVirtualMemoryOptions{.granularity = kGranule, .limit_bytes = 6 * kGranule});
  Step st = f.step();
  Bindings b = f.m.bind(f.dev_lens);
  auto graph = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st(f.s, bb); });
  f.dev_lens = {511, 512};
  b = f.m.bind(f.dev_lens);
  f.out = {{-1}, {-1}};
  CHECK_THROWS_AS(graph.replay(b, f.s), out_of_memory_error);
  CHECK(f.out == std::vector<std::vector<std::int64_t>>{{-1}, {-1}});
  f.dev_lens = {20, 30};
  b = f.m.bind(f.dev_lens);
  graph.replay(b, f.s);
  CHECK(f.out == expected(f.dev_lens));
}

TEST_CASE("virtual: debug mode's guard regions are mapped and checked", "[virtual][debug]") {
  debug::clear_findings();
  Fixture f(HostVirtualMemoryOptions{.granularity = kGranule}, ArenaOptions{.debug = true});
  Step st = f.step();
  Bindings b = f.m.bind(f.dev_lens);
  auto graph = capture(*f.arena, f.s, b, [&](const Bindings& bb) { st(f.s, bb); });
  for (std::vector<int> lens : {std::vector<int>{15, 17}, {255, 257}, {511, 512}}) {
    f.dev_lens = lens;
    b = f.m.bind(lens);
    graph.replay(b, f.s);  // arms (fills) and checks the guard behind the workspace
    CHECK(f.out == expected(lens));
  }
  for (const auto& fi : debug::findings()) CHECK(fi.kind != debug::kind::canary_overwrite);
  CHECK(debug::check_canaries(graph, f.s).empty());
  debug::clear_findings();
}

TEST_CASE("virtual: the ordinary arena ignores footprints and has no virtual state", "[virtual]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  Model m;
  std::vector<int> lens{3, 5};
  std::vector<std::vector<std::int64_t>> out(2);
  StaticQueryBound swa{Extent(m.W)};
  Step st{arena, m, lens, out, capacity_bound, swa};
  arena.reserve(4 << 20, s);
  Bindings b = m.bind(lens);
  auto graph = capture(arena, s, b, [&](const Bindings& bb) { st(s, bb); });
  CHECK_FALSE(graph.virtual_stats().virtual_mode);
  CHECK(arena.committed_bytes() == 0);
  lens = {511, 512};
  b = m.bind(lens);
  graph.replay(b, s);
  CHECK(out == expected(lens));
  arena.shrink(s);  // no-op
}
