// The arena's behaviours, written once and run on every backend: each test case is a Catch2
// TEMPLATE_TEST_CASE over the environments the including file names, so the host backend (CI, no
// GPU) and the CUDA backend (a real device, real streams and graphs) are held to one contract.
//
//   #define GRAPHSAFE_ARENA_ENVS HostArenaEnv     // before the include: the environments to run
//   #include "arena_behaviours.hpp"
//
// An environment owns a backend and two of its streams and provides what the behaviours need
// beyond the Backend interface:
//
//   Backend& backend();
//   Stream stream(int i);                                  // i = 0, 1: two distinct streams
//   void fill(Stream s, void* p, std::uint64_t n, std::uint8_t v);  // stream-ordered memset; inside
//                                                          // a capture it is recorded, not run
//   void slow(Stream s);        // delays the stream's later work (a GPU spin kernel), so a reuse on
//                               // another stream that is not ordered after it would see its bytes
//   std::uint64_t backend_bytes_in_use();  // slab bytes the backend itself counts as allocated
//
// Expected values come from the arena's contract (256-byte alignment, best-fit placement in a
// fresh slab, a family region as large as its largest plan), not from running the arena.
#pragma once

#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include "../support/arena_checks.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#ifndef GRAPHSAFE_ARENA_ENVS
#error "define GRAPHSAFE_ARENA_ENVS (the environments to run the arena behaviours on) before including"
#endif

namespace graphsafe_test::behaviours {

using namespace graphsafe;

inline constexpr std::uint64_t kKiB = 1ull << 10;
inline constexpr std::uint64_t kMiB = 1ull << 20;

// 256-byte rounding, written out rather than taken from the library.
constexpr std::uint64_t aligned(std::uint64_t bytes) { return (bytes + 255) / 256 * 256; }

// Quiet and without debug mode whatever GRAPHSAFE_DEBUG says: debug mode's canaries would add
// guard bytes behind every workspace and change the expected layouts.
inline ArenaOptions plain_options() {
  ArenaOptions o;
  o.report_findings = false;
  o.debug = false;
  return o;
}

inline ArenaOptions growth_options(std::uint64_t growth_bytes) {
  ArenaOptions o = plain_options();
  o.growth_bytes = growth_bytes;
  return o;
}

// An arena on a fresh environment with `reserve_bytes` reserved on s (one slab; 0: none). Members
// are destroyed arena first, then the streams and backend.
template <class Env>
struct ArenaOn {
  explicit ArenaOn(std::uint64_t reserve_bytes, ArenaOptions opts = plain_options())
      : s(env.stream(0)), t(env.stream(1)), arena(env.backend(), opts) {
    if (reserve_bytes) arena.reserve(reserve_bytes, s);
  }

  Env env;
  Stream s;
  Stream t;
  Arena arena;

  Workspace eager(Stream on, const char* name, std::uint64_t bytes) {
    return arena.request(on, name, Extent(static_cast<std::int64_t>(bytes)), 1, capacity_bound, Bindings{});
  }
  // The bytes at p, read on `on` after its earlier work.
  std::vector<std::uint8_t> read(Stream on, const void* p, std::uint64_t n) {
    std::vector<std::uint8_t> v(n);
    env.backend().copy_to_host(v.data(), p, n, on);
    env.backend().synchronize(on);
    return v;
  }
  bool holds(Stream on, const void* p, std::uint64_t n, std::uint8_t value) {
    const auto v = read(on, p, n);
    return std::all_of(v.begin(), v.end(), [&](std::uint8_t b) { return b == value; });
  }
  // A graph of one workspace of `bytes` that it fills with `value` at every replay; `at` gets its address.
  CapturedGraph filling_graph(std::uint64_t bytes, std::uint8_t value, void*& at, CaptureOptions opts = {}) {
    return capture(
        arena, s, Bindings{},
        [&](const Bindings& bb) {
          auto w = arena.request(s, "w", Extent(static_cast<std::int64_t>(bytes)), 1, capacity_bound, bb);
          at = w.data();
          env.fill(s, w.data(), w.bytes(), value);
        },
        std::move(opts));
  }
};

inline bool overlaps(const void* a, std::uint64_t an, const void* b, std::uint64_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace graphsafe_test::behaviours

TEMPLATE_TEST_CASE("arena behaviour: a released workspace is served again to its size on its stream",
                   "[arena][behaviour]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(4 * kMiB);
  void* first = nullptr;
  {
    auto w = a.eager(a.s, "w", 3000);
    first = w.data();
    CHECK(w.bytes() == 3000);
    CHECK(a.arena.stats().eager_blocks == 1);
    CHECK(a.arena.stats().eager_bytes == aligned(3000));
    a.env.fill(a.s, w.data(), w.bytes(), 0x11);
  }
  ArenaStats st = a.arena.stats();
  CHECK(st.eager_blocks == 0);
  CHECK(st.eager_bytes == 0);
  CHECK(st.free_bytes == st.slab_bytes);
  CHECK(st.slabs == 1);
  auto again = a.eager(a.s, "again", 3000);
  CHECK(again.data() == first);
  // The earlier work's bytes are still there: the same memory, ordered on the same stream.
  CHECK(a.holds(a.s, again.data(), 3000, 0x11));
  st = a.arena.stats();
  CHECK(st.slabs == 1);  // reused, not grown
  CHECK(st.free_bytes == st.slab_bytes - aligned(3000));
}

TEMPLATE_TEST_CASE("arena behaviour: every workspace is 256-byte aligned and none overlaps another",
                   "[arena][behaviour]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(4 * kMiB);
  const std::uint64_t sizes[] = {1, 255, 256, 257, 1000, 4097, 65535, 3};
  std::vector<Workspace> live;
  std::uint64_t held = 0;
  for (const std::uint64_t n : sizes) {
    live.push_back(a.eager(a.s, "w", n));
    held += aligned(n);
  }
  // An element size that is not a power of two: 7 elements of 12 bytes.
  live.push_back(a.arena.request(a.s, "rows", Extent(7), 12, capacity_bound, Bindings{}));
  held += aligned(84);
  CHECK(live.back().bytes() == 84);
  CHECK(live.back().count() == 7);
  for (std::size_t i = 0; i < live.size(); ++i) {
    INFO("workspace " << i << " of " << live[i].bytes() << " bytes");
    CHECK(reinterpret_cast<std::uintptr_t>(live[i].data()) % 256 == 0);
    for (std::size_t j = 0; j < i; ++j) CHECK_FALSE(overlaps(live[i].data(), live[i].bytes(), live[j].data(), live[j].bytes()));
    a.env.fill(a.s, live[i].data(), live[i].bytes(), static_cast<std::uint8_t>(i + 1));
  }
  // Each still holds its own value after all were written.
  for (std::size_t i = 0; i < live.size(); ++i)
    CHECK(a.holds(a.s, live[i].data(), live[i].bytes(), static_cast<std::uint8_t>(i + 1)));
  CHECK(a.arena.stats().eager_bytes == held);
  // Opaque requests (cuda::mr, Thrust) ask for an alignment: up to 256 it is served, above it refused
  // naming the value (as cudaMalloc, the arena guarantees 256).
  void* p = a.arena.allocate(a.s, 100, 64);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  a.arena.deallocate(a.s, p, 100);
  CHECK_THROWS_WITH(a.arena.allocate(a.s, 100, 4096), Catch::Contains("alignment 4096"));
  CHECK(a.arena.stats().eager_bytes == held);
}

TEMPLATE_TEST_CASE("arena behaviour: a block released on one stream is reused on another only after its work",
                   "[arena][behaviour][ordering]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(2 * kMiB);
  void* first = nullptr;
  {
    auto w = a.eager(a.s, "on_s", 2 * kMiB);  // the whole slab: the next request must get these bytes
    first = w.data();
    a.env.slow(a.s);
    a.env.fill(a.s, w.data(), w.bytes(), 1);
  }  // released on s while s is still busy
  auto w = a.eager(a.t, "on_t", 2 * kMiB);
  REQUIRE(w.data() == first);
  CHECK(a.arena.stats().slabs == 1);
  a.env.fill(a.t, w.data(), w.bytes(), 2);
  // Unordered, s's late fill would land after t's and leave 1s behind.
  CHECK(a.holds(a.t, w.data(), w.bytes(), 2));
}

TEMPLATE_TEST_CASE("arena behaviour: a capture records every request in its plan and replays into it",
                   "[arena][behaviour][capture]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(1 * kMiB);
  const Symbol n = Symbol::dynamic("n", /*capacity=*/1000);
  Bindings b;
  b.set(n, 10);
  void* rows = nullptr;
  void* table = nullptr;
  std::int64_t stride = -1;
  auto graph = capture(a.arena, a.s, b, [&](const Bindings& bb) {
    stride = a.arena.dimension(a.s, "stride", Extent(n) + 1, capacity_bound, bb);
    auto r = a.arena.request(a.s, "rows", Extent(n), 4, capacity_bound, bb);
    auto t = a.arena.request(a.s, "table", Extent(100), 8, capacity_bound, bb);
    CHECK(r.captured());
    CHECK(r.count() == 1000);  // sized at the capacity, not at n = 10
    rows = r.data();
    table = t.data();
    a.env.fill(a.s, r.data(), r.bytes(), 0x5A);
    a.env.fill(a.s, t.data(), t.bytes(), 0x6B);
  });
  CHECK(stride == 1001);
  const Plan& plan = graph.plan();
  REQUIRE(plan.entries().size() == 3);
  CHECK(plan.entries()[0].name == "stride");
  CHECK(plan.entries()[0].kind == PlanEntry::Kind::dimension);
  CHECK(plan.entries()[0].reserved == 1001);
  CHECK(plan.entries()[1].name == "rows");
  CHECK(plan.entries()[1].bytes == 4000);
  CHECK(plan.entries()[1].needed_at_capture == 10);
  CHECK(plan.entries()[2].name == "table");
  CHECK(plan.entries()[2].bytes == 800);
  CHECK(plan.entries()[2].offset == plan.entries()[1].offset + aligned(4000));
  CHECK(static_cast<char*>(table) - static_cast<char*>(rows) == static_cast<std::ptrdiff_t>(aligned(4000)));
  CHECK(plan.guard_count() == 0);  // capacity_bound is replay-safe
  CHECK(plan.findings().empty());
  CHECK(graph.reserved_bytes() == aligned(4000) + aligned(800));
  CHECK(a.arena.stats().live_graphs == 1);
  CHECK(a.arena.stats().region_bytes == graph.reserved_bytes());
  CHECK(a.arena.stats().eager_blocks == 0);

  a.env.fill(a.s, rows, 4000, 0);
  a.env.fill(a.s, table, 800, 0);
  b.set(n, 1000);
  graph.replay(b, a.s);
  CHECK(a.holds(a.s, rows, 4000, 0x5A));
  CHECK(a.holds(a.s, table, 800, 0x6B));
}

TEMPLATE_TEST_CASE("arena behaviour: the guard refuses a replay that outgrew an exact capture, before launch",
                   "[arena][behaviour][guard]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(1 * kMiB);
  const Symbol n = Symbol::dynamic("n", /*capacity=*/4096);
  Bindings b;
  b.set(n, 100);
  void* p = nullptr;
  auto graph = capture(a.arena, a.s, b, [&](const Bindings& bb) {
    auto w = a.arena.request(a.s, "w", Extent(n), 4, exact_at_capture, bb);
    p = w.data();
    a.env.fill(a.s, w.data(), w.bytes(), 0x5A);
  });
  REQUIRE(graph.plan().findings().size() == 1);
  CHECK(graph.plan().findings()[0].request == "w");
  CHECK(graph.plan().guard_count() == 1);
  CHECK(graph.reserved_bytes() == aligned(400));

  // Within what was captured: replayed.
  a.env.fill(a.s, p, 400, 0xAB);
  graph.replay(b, a.s);
  CHECK(a.holds(a.s, p, 400, 0x5A));

  // One element more than was reserved: refused, naming the request, need and reservation; the
  // graph did not run (the marker bytes are untouched).
  a.env.fill(a.s, p, 400, 0xAB);
  b.set(n, 101);
  try {
    graph.replay(b, a.s);
    FAIL("a replay at n = 101 should have been refused");
  } catch (const guard_failure& e) {
    REQUIRE(e.violations().size() == 1);
    const GuardViolation& v = e.violations()[0];
    CHECK(v.request == "w");
    CHECK(v.policy == "exact-at-capture");
    CHECK(v.required == 101);
    CHECK(v.reserved == 100);
    CHECK_THAT(std::string(e.what()), Catch::Contains("needs 101") && Catch::Contains("reserved 100") &&
                                          Catch::Contains("n = 101"));
  }
  CHECK(a.holds(a.s, p, 400, 0xAB));
  // Unguarded, the same replay runs (what the guard stands between).
  graph.replay_unguarded_for_testing(a.s);
  CHECK(a.holds(a.s, p, 400, 0x5A));
}

TEMPLATE_TEST_CASE("arena behaviour: a family's region is as large as its largest plan, not their sum",
                   "[arena][behaviour][family]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(1 * kMiB);
  CaptureFamily fam = a.arena.family("buckets");
  CaptureOptions opts;
  opts.family = fam;
  const std::uint64_t sizes[] = {1 * kKiB, 8 * kKiB + 1, 3 * kKiB};  // not in ascending order
  std::vector<CapturedGraph> graphs;
  std::vector<void*> at;
  for (std::size_t g = 0; g < 3; ++g) {
    void* p = nullptr;
    graphs.push_back(a.filling_graph(sizes[g], static_cast<std::uint8_t>(g + 1), p, opts));
    at.push_back(p);
  }
  const std::uint64_t largest = aligned(8 * kKiB + 1);  // 8448
  CHECK(fam.graphs() == 3);
  CHECK(fam.region_bytes() == largest);
  CHECK(fam.largest_plan_bytes() == largest);
  CHECK(fam.sum_of_plan_bytes() == aligned(1 * kKiB) + largest + aligned(3 * kKiB));
  CHECK(a.arena.stats().region_bytes == largest);
  CHECK(a.arena.stats().families == 1);
  CHECK(at[1] == at[0]);  // every member starts at the shared region
  CHECK(at[2] == at[0]);
  // Replayed one at a time: each writes its own value over the shared bytes.
  for (int round = 0; round < 2; ++round)
    for (std::size_t g = 0; g < 3; ++g) {
      graphs[g].replay(Bindings{}, a.s);
      INFO("graph " << g);
      CHECK(a.holds(a.s, at[g], sizes[g], static_cast<std::uint8_t>(g + 1)));
    }
  graphs.clear();
  CHECK(a.arena.stats().region_bytes == 0);
  CHECK(a.arena.stats().families == 0);
  CHECK(a.arena.stats().live_graphs == 0);
}

TEMPLATE_TEST_CASE("arena behaviour: growth adds slabs and never moves what a graph saw",
                   "[arena][behaviour][growth]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(1 * kMiB, growth_options(1 * kMiB));
  void* p = nullptr;
  auto graph = a.filling_graph(64 * kKiB, 0x33, p);
  REQUIRE(a.arena.stats().slabs == 1);
  // Eager work that does not fit the first slab's remainder: the arena grows, twice.
  std::vector<Workspace> more;
  more.push_back(a.eager(a.s, "big", 4 * kMiB));
  a.arena.reserve(16 * kMiB, a.s);
  more.push_back(a.eager(a.s, "bigger", 12 * kMiB));
  CHECK(a.arena.stats().slabs == 3);
  for (auto& w : more) {
    CHECK_FALSE(overlaps(w.data(), w.bytes(), p, 64 * kKiB));
    a.env.fill(a.s, w.data(), w.bytes(), 0xEE);
  }
  a.env.fill(a.s, p, 64 * kKiB, 0);
  graph.replay(Bindings{}, a.s);
  CHECK(a.holds(a.s, p, 64 * kKiB, 0x33));  // the graph still writes where it wrote at capture
  for (auto& w : more) CHECK(a.holds(a.s, w.data(), w.bytes(), 0xEE));
}

TEMPLATE_TEST_CASE("arena behaviour: trim returns fully free slabs to the backend and keeps the rest",
                   "[arena][behaviour][trim]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(0, growth_options(1 * kMiB));
  const std::uint64_t before = a.env.backend_bytes_in_use();
  a.arena.reserve(2 * kMiB, a.s);
  auto keep = a.eager(a.s, "keep", 1 * kMiB);
  {
    auto big = a.eager(a.s, "big", 8 * kMiB);  // does not fit the first slab: a second one
    CHECK(a.arena.stats().slabs == 2);
    CHECK(a.env.backend_bytes_in_use() - before == a.arena.stats().slab_bytes);
    CHECK(a.arena.stats().slab_bytes >= 10 * kMiB);
  }
  a.arena.trim(a.s);
  ArenaStats st = a.arena.stats();
  CHECK(st.slabs == 1);  // the slab holding `keep` stays
  CHECK(st.slab_bytes == 2 * kMiB);
  CHECK(a.env.backend_bytes_in_use() - before == 2 * kMiB);
  a.env.fill(a.s, keep.data(), keep.bytes(), 7);
  CHECK(a.holds(a.s, keep.data(), keep.bytes(), 7));
  keep.reset();
  a.arena.trim(a.s);
  st = a.arena.stats();
  CHECK(st.slabs == 0);
  CHECK(st.slab_bytes == 0);
  CHECK(a.env.backend_bytes_in_use() == before);
}

TEMPLATE_TEST_CASE("arena behaviour: a workspace released during a capture gives its range to later requests",
                   "[arena][behaviour][capture]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(1 * kMiB);
  void* first = nullptr;
  void* second = nullptr;
  void* small = nullptr;
  auto graph = capture(a.arena, a.s, Bindings{}, [&](const Bindings& bb) {
    {
      auto w = a.arena.request(a.s, "layer0", Extent(static_cast<std::int64_t>(64 * kKiB)), 1, capacity_bound, bb);
      first = w.data();
      a.env.fill(a.s, w.data(), w.bytes(), 1);
    }  // released: the next layer's workspace takes its range
    auto w = a.arena.request(a.s, "layer1", Extent(static_cast<std::int64_t>(64 * kKiB)), 1, capacity_bound, bb);
    auto x = a.arena.request(a.s, "extra", Extent(1000), 1, capacity_bound, bb);
    second = w.data();
    small = x.data();
    a.env.fill(a.s, w.data(), w.bytes(), 2);
    a.env.fill(a.s, x.data(), x.bytes(), 3);
  });
  CHECK(second == first);
  CHECK(graph.reserved_bytes() == 64 * kKiB + aligned(1000));  // peak live bytes, not the sum (129 KiB)
  CHECK(graph.plan().peak_live_bytes() == 64 * kKiB + aligned(1000));
  REQUIRE(graph.plan().entries().size() == 3);
  CHECK(graph.plan().entries()[0].released);
  CHECK(graph.plan().entries()[1].reuses);
  graph.replay(Bindings{}, a.s);
  CHECK(a.holds(a.s, second, 64 * kKiB, 2));  // the graph orders layer1's writes after layer0's
  CHECK(a.holds(a.s, small, 1000, 3));
}

TEMPLATE_TEST_CASE("arena behaviour: a failed or abandoned capture gives back everything and the stream captures again",
                   "[arena][behaviour][capture]", GRAPHSAFE_ARENA_ENVS) {
  using namespace graphsafe_test::behaviours;
  ArenaOn<TestType> a(1 * kMiB);
  const ArenaStats before = a.arena.stats();
  auto step = [&](const Bindings& bb) {
    auto w = a.arena.request(a.s, "w", Extent(4096), 1, capacity_bound, bb);
    a.env.fill(a.s, w.data(), w.bytes(), 9);
    return w;
  };
  SECTION("an exception inside capture()") {
    CHECK_THROWS_WITH(capture(a.arena, a.s, Bindings{},
                              [&](const Bindings& bb) {
                                auto w = step(bb);
                                throw std::runtime_error("thrown inside the capture");
                              }),
                      Catch::Contains("thrown inside the capture"));
  }
  SECTION("a CaptureSession abandoned without finish()") {
    CaptureSession session(a.arena, a.s, Bindings{});
    auto w = step(Bindings{});
    CHECK(w.captured());
    CHECK(a.arena.stats().active_captures == 1);
  }
  SECTION("a policy refusal inside the capture") {
    CHECK_THROWS_AS(capture(a.arena, a.s, Bindings{},
                            [&](const Bindings& bb) {
                              auto w = step(bb);
                              // A dynamic symbol without a capacity: capacity_bound has no bound to use.
                              const Symbol unbounded = Symbol::dynamic("unbounded_rows");
                              Bindings more = bb;
                              more.set(unbounded, 3);
                              a.arena.request(a.s, "bad", Extent(unbounded), 4, capacity_bound, more);
                            }),
                    policy_refusal);
  }
  graphsafe_test::check_back_to_slabs(before, a.arena.stats());
  CHECK_FALSE(a.env.backend().capture_info(a.s).active);
  // The stream works eagerly, and captures again.
  {
    auto w = a.eager(a.s, "eager", 4096);
    a.env.fill(a.s, w.data(), w.bytes(), 5);
    CHECK(a.holds(a.s, w.data(), w.bytes(), 5));
  }
  void* p = nullptr;
  auto graph = a.filling_graph(4096, 4, p);
  graph.replay(Bindings{}, a.s);
  CHECK(a.holds(a.s, p, 4096, 4));
}
