// Reuse inside a capture: a workspace released during a capture gives its range to a later request
// of that capture only when the captured graph orders every use of the old workspace before every
// use of the new one. Host backend: multi-stream captures with HostEvent fork/join, replayed in a
// topological order other than capture order.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {
constexpr std::uint64_t kMiB = 1ull << 20;

Workspace bytes_ws(Arena& a, HostStream& s, const char* name, std::int64_t n, const Bindings& b) {
  return a.request(s, name, Extent(n), 1, capacity_bound, b);
}

bool overlap(const void* a, std::uint64_t an, const void* b, std::uint64_t bn) {
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

// Work on a workspace: fill it with `v` now (at replay), then check it still holds `v` later.
void fill(HostStream& s, void* p, std::uint64_t n, unsigned char v) {
  s.launch([p, n, v] { std::memset(p, v, n); });
}
void check(HostStream& s, void* p, std::uint64_t n, unsigned char v, int& bad) {
  s.launch([p, n, v, &bad] {
    const auto* c = static_cast<const unsigned char*>(p);
    if (std::any_of(c, c + n, [v](unsigned char x) { return x != v; })) ++bad;
  });
}
void join(HostStream& from, HostStream& into) {
  HostEvent e;
  from.record(e);
  into.wait(e);
}
}  // namespace

TEST_CASE("host capture: a forked stream's work joins the graph and replay follows the edges", "[capture_reuse][host]") {
  HostBackend backend;
  HostStream main, side;
  std::vector<int> log;
  backend.begin_capture(main, CaptureMode::global);
  main.launch([&] { log.push_back(1); });
  join(main, side);  // fork
  CHECK(side.capturing());
  CHECK(backend.capture_info(side).id == backend.capture_info(main).id);
  side.launch([&] { log.push_back(2); });
  main.launch([&] { log.push_back(3); });
  join(side, main);  // join
  main.launch([&] { log.push_back(4); });
  GraphHandle g = backend.end_capture(main);
  CHECK_FALSE(side.capturing());
  CHECK(log.empty());
  backend.launch(g, main);
  // 1 first, 4 last; 2 and 3 are concurrent: replay runs the later-captured branch first.
  CHECK(log == std::vector<int>{1, 3, 2, 4});
  backend.destroy(g);
}

TEST_CASE("host capture: ending a capture with a forked stream not joined back throws and discards it",
          "[capture_reuse][host]") {
  HostBackend backend;
  HostStream main, side;
  backend.begin_capture(main, CaptureMode::global);
  join(main, side);
  side.launch([] {});
  CHECK_THROWS_WITH(backend.end_capture(main), Contains("not joined back"));
  CHECK_FALSE(main.capturing());
  CHECK_FALSE(side.capturing());
  // Waiting on an event of another capture is refused.
  HostStream other;
  backend.begin_capture(main, CaptureMode::global);
  backend.begin_capture(other, CaptureMode::global);
  HostEvent e;
  main.record(e);
  CHECK_THROWS_AS(other.wait(e), capture_state_error);
  backend.abort_capture(main);
  backend.abort_capture(other);
}

TEST_CASE("a workspace released on a stream is reused by the next request on that stream", "[capture_reuse]") {
  HostBackend backend;
  Arena arena(backend);
  HostStream s;
  arena.reserve(4 * kMiB, s);
  Bindings b;
  int bad = 0;
  void* first = nullptr;
  void* second = nullptr;
  auto g = capture(arena, s, b, [&](const Bindings& bb) {
    for (int layer = 0; layer < 8; ++layer) {
      auto ws = bytes_ws(arena, s, "layer.scratch", 64 * 1024, bb);
      if (layer == 0) first = ws.data();
      if (layer == 1) second = ws.data();
      fill(s, ws.data(), ws.bytes(), static_cast<unsigned char>(layer + 1));
      check(s, ws.data(), ws.bytes(), static_cast<unsigned char>(layer + 1), bad);
    }  // ws dies: its range goes back to the capture
  });
  CHECK(second == first);
  CHECK(g.plan().bytes() == 64 * 1024);           // one layer's workspace, not eight
  CHECK(g.plan().peak_live_bytes() == 64 * 1024);
  CHECK(arena.stats().region_peak_live_bytes == 64 * 1024);
  CHECK(g.family().peak_live_bytes() == 64 * 1024);
  CHECK(g.plan().entries()[0].released);
  CHECK(g.plan().entries()[1].reuses);
  g.replay(b, s);
  g.replay(b, s);
  CHECK(bad == 0);
}

TEST_CASE("workspaces held together get disjoint ranges and the region is their sum", "[capture_reuse]") {
  HostBackend backend;
  Arena arena(backend);
  HostStream s;
  arena.reserve(4 * kMiB, s);
  Bindings b;
  std::vector<Workspace> held;
  auto g = capture(arena, s, b, [&](const Bindings& bb) {
    for (int i = 0; i < 4; ++i) held.push_back(bytes_ws(arena, s, "held", 1000 * (i + 1), bb));
    for (std::size_t i = 0; i < held.size(); ++i)
      for (std::size_t j = i + 1; j < held.size(); ++j)
        CHECK_FALSE(overlap(held[i].data(), held[i].bytes(), held[j].data(), held[j].bytes()));
  });
  CHECK(g.plan().bytes() == 1024 + 2048 + 3072 + 4096);  // each 256-aligned
  CHECK(g.plan().peak_live_bytes() == g.plan().bytes());
  held.clear();  // after the capture: the graph keeps them
  CHECK(g.plan().bytes() == arena.stats().region_bytes);
}

TEST_CASE("a release on one stream followed by a request on an unjoined stream is not reused", "[capture_reuse]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false, .debug = true, .canary_bytes = 0});
  HostStream main, side;
  arena.reserve(4 * kMiB, main);
  Bindings b;
  int bad = 0;
  void* a_ptr = nullptr;
  void* b_ptr = nullptr;
  const std::size_t findings_before = debug::findings().size();
  auto g = capture(arena, main, b, [&](const Bindings& bb) {
    join(main, side);  // fork before the release: side does not follow it
    {
      auto a = bytes_ws(arena, main, "main.a", 32 * 1024, bb);
      a_ptr = a.data();
      fill(main, a.data(), a.bytes(), 0x11);
      check(main, a.data(), a.bytes(), 0x11, bad);
    }
    auto c = bytes_ws(arena, side, "side.c", 32 * 1024, bb);
    b_ptr = c.data();
    fill(side, c.data(), c.bytes(), 0x22);
    check(side, c.data(), c.bytes(), 0x22, bad);
    join(side, main);
  });
  CHECK_FALSE(overlap(a_ptr, 32 * 1024, b_ptr, 32 * 1024));
  CHECK(g.plan().bytes() == 64 * 1024);
  // Both could run at once: the lower bound counts them together.
  CHECK(g.plan().peak_live_bytes() == 64 * 1024);
  // Debug mode says why the range was not reused.
  const auto all = debug::findings();
  const bool said = std::any_of(all.begin() + static_cast<std::ptrdiff_t>(findings_before), all.end(), [](const auto& f) {
    return f.kind == debug::kind::reuse_not_proven && f.request == "side.c" &&
           f.message.find("'main.a'") != std::string::npos;
  });
  CHECK(said);
  g.replay(b, main);
  CHECK(bad == 0);
}

TEST_CASE("a request on a stream that joined after the release reuses the range", "[capture_reuse]") {
  HostBackend backend;
  Arena arena(backend);
  HostStream main, side;
  arena.reserve(4 * kMiB, main);
  Bindings b;
  int bad = 0;
  void* a_ptr = nullptr;
  void* c_ptr = nullptr;
  void* early_ptr = nullptr;
  HostStream early;
  auto g = capture(arena, main, b, [&](const Bindings& bb) {
    HostEvent before_release;
    {
      auto a = bytes_ws(arena, main, "main.a", 32 * 1024, bb);
      a_ptr = a.data();
      fill(main, a.data(), a.bytes(), 0x11);
      check(main, a.data(), a.bytes(), 0x11, bad);
      main.record(before_release);  // recorded before the last use below
      check(main, a.data(), a.bytes(), 0x11, bad);
    }
    early.wait(before_release);  // joined before the last use of a: must not reuse
    auto e = bytes_ws(arena, early, "early", 32 * 1024, bb);
    early_ptr = e.data();
    fill(early, e.data(), e.bytes(), 0x33);
    check(early, e.data(), e.bytes(), 0x33, bad);
    join(main, side);  // after the release
    auto c = bytes_ws(arena, side, "side.c", 32 * 1024, bb);
    c_ptr = c.data();
    fill(side, c.data(), c.bytes(), 0x22);
    check(side, c.data(), c.bytes(), 0x22, bad);
    join(side, main);
    join(early, main);
  });
  CHECK(c_ptr == a_ptr);
  CHECK_FALSE(overlap(early_ptr, 32 * 1024, a_ptr, 32 * 1024));
  CHECK_FALSE(overlap(early_ptr, 32 * 1024, c_ptr, 32 * 1024));
  CHECK(g.plan().bytes() == 64 * 1024);
  g.replay(b, main);
  CHECK(bad == 0);
}

TEST_CASE("fork and join on 2 to 4 streams: concurrent branches get disjoint ranges, work after the join reuses them",
          "[capture_reuse]") {
  for (int streams = 2; streams <= 4; ++streams) {
    CAPTURE(streams);
    HostBackend backend;
    Arena arena(backend);
    std::vector<HostStream> ss(static_cast<std::size_t>(streams));
    HostStream& main = ss[0];
    arena.reserve(8 * kMiB, main);
    Bindings b;
    int bad = 0;
    std::vector<std::pair<void*, std::uint64_t>> branch;
    void* after = nullptr;
    auto g = capture(arena, main, b, [&](const Bindings& bb) {
      for (int layer = 0; layer < 3; ++layer) {
        for (int i = 1; i < streams; ++i) join(main, ss[static_cast<std::size_t>(i)]);
        for (int i = 0; i < streams; ++i) {
          HostStream& s = ss[static_cast<std::size_t>(i)];
          auto w = bytes_ws(arena, s, "branch", 16 * 1024, bb);
          if (layer == 0) branch.emplace_back(w.data(), w.bytes());
          fill(s, w.data(), w.bytes(), static_cast<unsigned char>(0x40 + i));
          check(s, w.data(), w.bytes(), static_cast<unsigned char>(0x40 + i), bad);
        }
        for (int i = 1; i < streams; ++i) join(ss[static_cast<std::size_t>(i)], main);
      }
      // Everything is joined into main: one workspace as large as all branches together fits
      // in their ranges.
      auto big = bytes_ws(arena, main, "after.join", 16 * 1024 * streams, bb);
      after = big.data();
      fill(main, big.data(), big.bytes(), 0x7f);
      check(main, big.data(), big.bytes(), 0x7f, bad);
    });
    for (std::size_t i = 0; i < branch.size(); ++i)
      for (std::size_t j = i + 1; j < branch.size(); ++j)
        CHECK_FALSE(overlap(branch[i].first, branch[i].second, branch[j].first, branch[j].second));
    CHECK(g.plan().bytes() == static_cast<std::uint64_t>(16 * 1024 * streams));
    CHECK(g.plan().peak_live_bytes() == g.plan().bytes());
    CHECK(after != nullptr);
    g.replay(b, main);
    CHECK(bad == 0);
  }
}

TEST_CASE("an opaque block deallocated during capture gives its range to the next allocation", "[capture_reuse]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  arena.reserve(4 * kMiB, s);
  Bindings b;
  void* p1 = nullptr;
  void* p2 = nullptr;
  auto g = capture(arena, s, b, [&](const Bindings&) {
    p1 = arena.allocate(s, 10000);
    CHECK_THROWS_AS(arena.deallocate(s, p1, 20000), invalid_argument_error);  // more than it holds: refused
    arena.deallocate(s, p1, 10000);
    p2 = arena.allocate(s, 9000);
  });
  CHECK(p1 == p2);
  CHECK(g.plan().bytes() == 10240);
}

TEST_CASE("offline packing: a re-capture of the same sizes keeps the smaller of greedy and packed", "[capture_reuse]") {
  HostBackend backend;
  Arena arena(backend);
  HostStream s;
  arena.reserve(4 * kMiB, s);
  Bindings b;
  const std::int64_t u = 1024;
  // Greedy: a@0, b@1u; a released; c (2u) does not fit a's 1u gap -> c@2u, region 4u.
  // Packed by decreasing size: c@0, a@0 (a ends before c starts), b@2u: region 3u = peak live.
  auto fn = [&](const Bindings& bb) {
    auto a = bytes_ws(arena, s, "a", u, bb);
    auto keep = bytes_ws(arena, s, "b", u, bb);
    a.reset();
    auto c = bytes_ws(arena, s, "c", 2 * u, bb);
  };
  auto fam = arena.family("packed");
  auto g1 = capture(arena, s, b, fn, CaptureOptions{.family = fam});
  CHECK(g1.plan().bytes() == static_cast<std::uint64_t>(4 * u));
  CHECK(g1.plan().peak_live_bytes() == static_cast<std::uint64_t>(3 * u));
  auto g2 = capture(arena, s, b, fn, CaptureOptions{.family = fam});
  CHECK(g2.plan().bytes() == static_cast<std::uint64_t>(3 * u));
  // Different sizes: no layout to follow, greedy again.
  auto g3 = capture(arena, s, b, [&](const Bindings& bb) { auto x = bytes_ws(arena, s, "x", 3 * u, bb); },
                    CaptureOptions{.family = fam});
  CHECK(g3.plan().bytes() == static_cast<std::uint64_t>(3 * u));
}

TEST_CASE("estimate: a family of bucket captures, before any memory is taken, equals the real region",
          "[capture_reuse][estimate]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream main, side;
  Symbol n = Symbol::fixed("est.n");
  std::vector<Bindings> buckets;
  for (int bucket : {64, 32, 16, 8}) buckets.push_back(Bindings().set(n, bucket));
  auto step = [&](const Bindings& bb) {
    const std::int64_t k = bb.value(n);
    for (int layer = 0; layer < 5; ++layer) {
      auto x = arena.request(main, "x", Extent(n) * 1000, 4, capacity_bound, bb);
      join(main, side);
      auto y = arena.request(side, "y", Extent(n) * 300 + layer * 64, 4, capacity_bound, bb);
      {
        auto t = arena.request(main, "t", Extent(n) * 77, 2, capacity_bound, bb);
      }
      auto z = arena.request(main, "z", static_cast<std::int64_t>(k * 500), 1, capacity_bound, bb);
      y.reset();
      join(side, main);
    }
  };
  auto fam = arena.family("buckets");
  const CaptureEstimate est = estimate(arena, main, std::span<const Bindings>(buckets), step, CaptureOptions{.family = fam});
  CHECK(backend.slab_allocations() == 0);  // nothing was taken
  CHECK(backend.bytes_in_use() == 0);
  CHECK_FALSE(main.capturing());
  CHECK_FALSE(side.capturing());
  CHECK(est.region_bytes > 0);
  CHECK(est.peak_live_bytes <= est.region_bytes);
  arena.reserve(est.region_bytes, main);
  std::vector<CapturedGraph> graphs;
  for (const Bindings& bb : buckets) graphs.push_back(capture(arena, main, bb, step, CaptureOptions{.family = fam}));
  CHECK(fam.region_bytes() == est.region_bytes);
  CHECK(fam.peak_live_bytes() == est.peak_live_bytes);
  // One graph, no family: its greedy placement.
  Arena fresh(backend, ArenaOptions{.report_findings = false});
  const CaptureEstimate one = estimate(fresh, main, buckets[0], step);
  fresh.reserve(one.region_bytes, main);
  auto g = capture(fresh, main, buckets[0], step);
  CHECK(g.plan().bytes() == one.region_bytes);
}

namespace {
// A random capture program over 1-4 streams, the same for a seed. Its own model of the graph (nodes,
// edges from stream order and event waits) is the reference the planner is checked against.
struct Program {
  struct Block {
    Workspace ws;
    std::size_t stream = 0;
    std::vector<int> uses;  // model nodes that touch it
    void* ptr = nullptr;
    std::uint64_t bytes = 0;
    unsigned char tag = 0;
  };
  std::uint32_t seed;
  int streams;
  std::vector<Block> blocks;
  std::vector<std::vector<int>> deps;  // model: node -> dependencies
  int bad = 0;

  bool ancestor(int a, int b) const {  // a is b or an ancestor of b
    std::vector<int> stack{b};
    std::set<int> seen;
    while (!stack.empty()) {
      int n = stack.back();
      stack.pop_back();
      if (n == a) return true;
      if (!seen.insert(n).second) continue;
      for (int d : deps[static_cast<std::size_t>(n)]) stack.push_back(d);
    }
    return false;
  }
  // Every use of x precedes every use of y.
  bool before(const Block& x, const Block& y) const {
    for (int u : x.uses)
      for (int v : y.uses)
        if (!ancestor(u, v)) return false;
    return true;
  }

  void run(Arena& arena, std::vector<HostStream>& ss, const Bindings& bb) {
    std::mt19937 rng(seed);
    blocks.clear();
    deps.clear();
    std::vector<std::vector<int>> front(ss.size());
    std::vector<bool> joined(ss.size(), false);
    joined[0] = true;
    auto node = [&](std::size_t s) {
      deps.push_back(front[s]);
      front[s] = {static_cast<int>(deps.size() - 1)};
      return static_cast<int>(deps.size() - 1);
    };
    auto event = [&](std::size_t from, std::size_t to) {
      join(ss[from], ss[to]);
      for (int n : front[from])
        if (std::find(front[to].begin(), front[to].end(), n) == front[to].end()) front[to].push_back(n);
      joined[to] = true;
    };
    auto pick = [&](auto pred) -> std::size_t {
      std::vector<std::size_t> c;
      for (std::size_t i = 0; i < ss.size(); ++i)
        if (pred(i)) c.push_back(i);
      return c.empty() ? ss.size() : c[rng() % c.size()];
    };
    auto use = [&](Block& bl, bool write) {
      HostStream& s = ss[bl.stream];
      if (write)
        fill(s, bl.ptr, bl.bytes, bl.tag);
      else
        check(s, bl.ptr, bl.bytes, bl.tag, bad);
      bl.uses.push_back(node(bl.stream));
    };
    std::vector<std::size_t> live;
    const std::uint64_t sizes[] = {256, 1000, 4096, 5000, 16384, 40000};
    for (int step = 0; step < 80; ++step) {
      const unsigned op = rng() % 10;
      if (op < 2 && streams > 1) {  // fork or join between streams
        const std::size_t from = pick([&](std::size_t i) { return joined[i]; });
        const std::size_t to = pick([&](std::size_t i) { return i != from && i < static_cast<std::size_t>(streams); });
        if (from < ss.size() && to < ss.size()) event(from, to);
      } else if (op < 6) {  // request
        const std::size_t s = pick([&](std::size_t i) { return joined[i]; });
        Block bl;
        bl.stream = s;
        bl.ws = bytes_ws(arena, ss[s], "r", static_cast<std::int64_t>(sizes[rng() % 6]), bb);
        bl.ptr = bl.ws.data();
        bl.bytes = bl.ws.bytes();
        bl.tag = static_cast<unsigned char>(1 + blocks.size() % 250);
        blocks.push_back(std::move(bl));
        use(blocks.back(), true);
        live.push_back(blocks.size() - 1);
      } else if (op < 8 && !live.empty()) {  // use
        use(blocks[live[rng() % live.size()]], false);
      } else if (!live.empty()) {  // release (after a last check on its stream)
        const std::size_t k = rng() % live.size();
        Block& bl = blocks[live[k]];
        use(bl, false);
        bl.ws.reset();
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    for (std::size_t i = 1; i < ss.size(); ++i)
      if (joined[i]) event(i, 0);
  }
};
}  // namespace

TEST_CASE("random capture programs on 1-4 streams: overlapping lifetimes never share bytes, packed region near the "
          "lower bound",
          "[capture_reuse][random]") {
  double worst = 0;
  int reused = 0;
  for (std::uint32_t seed = 1; seed <= 120; ++seed) {
    const int streams = 1 + static_cast<int>(seed % 4);
    CAPTURE(seed, streams);
    HostBackend backend;
    Arena arena(backend, ArenaOptions{.report_findings = false});
    std::vector<HostStream> ss(static_cast<std::size_t>(streams));
    arena.reserve(16 * kMiB, ss[0]);
    Bindings b;
    auto fam = arena.family("random");
    Program p{seed, streams, {}, {}, 0};
    std::vector<CapturedGraph> graphs;
    for (int round = 0; round < 2; ++round) {  // the second capture follows the offline packing
      graphs.push_back(capture(arena, ss[0], b, [&](const Bindings& bb) { p.run(arena, ss, bb); },
                               CaptureOptions{.family = fam}));
      for (std::size_t i = 0; i < p.blocks.size(); ++i)
        for (std::size_t j = i + 1; j < p.blocks.size(); ++j) {
          const auto& x = p.blocks[i];
          const auto& y = p.blocks[j];
          if (!overlap(x.ptr, x.bytes, y.ptr, y.bytes)) continue;
          ++reused;
          INFO("blocks " << i << " and " << j << " share bytes");
          CHECK((p.before(x, y) || p.before(y, x)));
        }
      const Plan& plan = graphs.back().plan();
      CHECK(plan.peak_live_bytes() <= plan.bytes());
      p.bad = 0;
      graphs.back().replay(b, ss[0]);
      CHECK(p.bad == 0);  // every check saw its own workspace's bytes
    }
    const Plan& packed = graphs.back().plan();
    const double ratio = static_cast<double>(packed.bytes()) / static_cast<double>(packed.peak_live_bytes());
    worst = std::max(worst, ratio);
    CHECK(ratio <= 1.10);
  }
  WARN("worst packed region / lower bound over 120 programs: " << worst << ", " << reused << " reused pairs");
  CHECK(reused > 100);  // the programs do exercise reuse
}

TEST_CASE("a capture is placed the same after other captures on the arena as on a fresh one", "[capture_reuse][random]") {
  // Each capture's placement starts from the vectors an earlier capture left to the arena: nothing
  // of that capture (live ranges, releases, streams) may leak into the next one's placement.
  auto offsets = [](const Plan& plan) {
    std::vector<std::uint64_t> out;
    for (const PlanEntry& e : plan.entries()) out.push_back(e.offset);
    return out;
  };
  for (std::uint32_t seed = 1; seed <= 24; ++seed) {
    const int streams = 1 + static_cast<int>(seed % 4);
    CAPTURE(seed, streams);
    Bindings b;
    std::vector<std::uint64_t> fresh;
    {
      HostBackend backend;
      Arena arena(backend, ArenaOptions{.report_findings = false});
      std::vector<HostStream> ss(static_cast<std::size_t>(streams));
      arena.reserve(16 * kMiB, ss[0]);
      Program p{seed, streams, {}, {}, 0};
      auto g = capture(arena, ss[0], b, [&](const Bindings& bb) { p.run(arena, ss, bb); });
      fresh = offsets(g.plan());
    }
    HostBackend backend;
    Arena arena(backend, ArenaOptions{.report_findings = false});
    std::vector<HostStream> ss(4);
    arena.reserve(32 * kMiB, ss[0]);
    std::vector<CapturedGraph> earlier;  // kept alive: the next captures get regions of their own
    for (std::uint32_t other : {seed + 1000, seed + 2000}) {
      Program q{other, 4, {}, {}, 0};
      earlier.push_back(capture(arena, ss[0], b, [&](const Bindings& bb) { q.run(arena, ss, bb); }));
    }
    std::vector<HostStream> mine(static_cast<std::size_t>(streams));
    Program p{seed, streams, {}, {}, 0};
    auto g = capture(arena, mine[0], b, [&](const Bindings& bb) { p.run(arena, mine, bb); });
    CHECK(offsets(g.plan()) == fresh);
    p.bad = 0;
    g.replay(b, mine[0]);
    CHECK(p.bad == 0);
  }
}

TEST_CASE("debug canaries: a reused range raises no false overwrite, a workspace of its own is still guarded",
          "[capture_reuse][debug]") {
  debug::clear_findings();
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false, .debug = true, .nvtx = false});
  HostStream s;
  arena.reserve(4 * kMiB, s);
  Bindings b;
  std::uint64_t overflow = 0;  // bytes the last kernel writes past 'own' (set between replays)
  auto g = capture(arena, s, b, [&](const Bindings& bb) {
    auto own = bytes_ws(arena, s, "own", 1024, bb);  // live throughout: nothing shares its range
    for (int layer = 0; layer < 4; ++layer) {
      auto w = bytes_ws(arena, s, "layer", 4096 - 64 * layer, bb);  // each layer fills its whole workspace
      fill(s, w.data(), w.bytes(), static_cast<unsigned char>(layer + 1));
    }
    void* p = own.data();
    s.launch([p, &overflow] { std::memset(p, 0x5a, 1024 + overflow); });
  });
  std::size_t shared = 0;
  for (const auto& e : g.plan().entries()) shared += e.shares_bytes;
  CHECK(shared == 4);  // the four layers share one range
  g.replay(b, s);
  g.replay(b, s);
  CHECK(debug::check_canaries(g, s).empty());  // layers overwrote each other's range (legitimately): no finding
  overflow = 16;
  g.replay(b, s);
  const auto found = debug::check_canaries(g, s);
  REQUIRE(found.size() == 1);
  CHECK(found[0].request == "own");
}
