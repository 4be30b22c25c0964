// Misuse a careful user can make by mistake, and errors thrown halfway through an operation. Each
// case is refused with a typed error that names the value and the limit, and leaves every arena,
// backend and graph involved consistent and serving:
//
//   * a capture family used with an arena other than the one that made it (plain and virtual)
//   * the element extent of sum_over / max_over used outside its fold, or inside another batch's fold
//   * ArenaOptions out of range (slab sizes that wrap when rounded up, guard regions that overflow)
//   * bindings a replay cannot honour (a batch vector of the wrong length, an unbound batch symbol)
//     with every sizing policy, including those whose guards are discharged
//   * a backend that fails to free a slab in the middle of trim()
//   * family figures read while another thread holds the arena's lock
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>
#include <graphsafe/virtual_memory.hpp>

#include "../support/forwarding_backend.hpp"
#include "arena_core.hpp"
#include "internal_access.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

std::string arena_label(const Arena& a) { return "arena #" + std::to_string(detail::core_of(a).id); }

// what() of the graphsafe error `f` throws as E; fails the test when it throws nothing or another type.
template <class E>
std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("threw another type: " << e.what());
  }
  FAIL("threw nothing");
  return {};
}

bool same_stats(const ArenaStats& a, const ArenaStats& b) {
  return a.slab_bytes == b.slab_bytes && a.slabs == b.slabs && a.free_bytes == b.free_bytes &&
         a.largest_free == b.largest_free && a.eager_bytes == b.eager_bytes && a.region_bytes == b.region_bytes &&
         a.families == b.families && a.live_graphs == b.live_graphs && a.active_captures == b.active_captures;
}

// A dynamic symbol n (capacity 1024) bound to 10, and captures of one workspace of n x 8 bytes
// followed by a host "kernel" that counts its launches.
struct Scene {
  Symbol n;
  Bindings bind;
  int launches = 0;
  explicit Scene(const char* name) : n(Symbol::dynamic(name, 1024)) { bind.set(n, 10); }
  CapturedGraph capture_in(Arena& arena, HostStream& s, std::optional<CaptureFamily> family = std::nullopt) {
    return capture(
        arena, s, bind,
        [this, &arena, &s](const Bindings& b) {
          auto w = arena.request(s, "kv", Extent(n), 8, capacity_bound, b);
          s.launch([this] { ++launches; });
        },
        CaptureOptions{.family = std::move(family)});
  }
};

}  // namespace

// ---- a family belongs to one arena ----------------------------------------------------------------

TEST_CASE("misuse: a capture family made by one arena is refused by another, naming both arenas", "[misuse][family]") {
  HostBackend backend;
  const ArenaOptions o{.growth_bytes = 2 * kMiB, .report_findings = false};
  Arena a(backend, o), b(backend, o);
  HostStream s;
  a.reserve(4 * kMiB, s);
  b.reserve(4 * kMiB, s);
  Scene sc("misuse.n");
  auto fam = a.family("decode");
  CapturedGraph ga = sc.capture_in(a, s, fam);
  const ArenaStats a_before = a.stats(), b_before = b.stats();

  const std::string what = thrown<invalid_argument_error>(
      [&] { sc.capture_in(b, s, fam); });
  CHECK_THAT(what, Contains("family 'decode'") && Contains(arena_label(a)) && Contains(arena_label(b)) &&
                       Contains("family()"));
  // Nothing moved: neither arena's books, nor the graph of the family's own arena.
  CHECK(same_stats(a_before, a.stats()));
  CHECK(same_stats(b_before, b.stats()));
  CHECK(detail::core_of(a).fl.validate().empty());
  CHECK(detail::core_of(b).fl.validate().empty());
  CHECK_FALSE(s.capturing());
  CHECK(fam.graphs() == 1);
  ga.replay(sc.bind, s);
  CHECK(sc.launches == 1);

  // A graph's own family (captured without one) belongs to its arena too.
  CapturedGraph solo = sc.capture_in(a, s);
  CHECK_THROWS_AS(sc.capture_in(b, s, solo.family()), invalid_argument_error);
  // Each arena still captures into its own families.
  CapturedGraph ga2 = sc.capture_in(a, s, fam);
  CapturedGraph gb = sc.capture_in(b, s, b.family("decode"));
  ga2.replay(sc.bind, s);
  gb.replay(sc.bind, s);
  CHECK(sc.launches == 3);
  CHECK(fam.graphs() == 2);
}

TEST_CASE("misuse: a capture family is refused by a second arena that shares its VirtualMemory", "[misuse][family][virtual]") {
  HostBackend backend;
  auto vm = std::make_shared<HostVirtualMemory>(HostVirtualMemoryOptions{.granularity = 64 << 10});
  const ArenaOptions o{.report_findings = false, .virtual_memory = vm, .virtual_reserve_bytes = 1ull << 30};
  Arena a(backend, o), b(backend, o);
  HostStream s;
  Scene sc("misuse.vn");
  auto fam = a.family("prefill");
  CapturedGraph ga = sc.capture_in(a, s, fam);
  const std::uint64_t committed = a.committed_bytes();
  const std::string what = thrown<invalid_argument_error>(
      [&] { sc.capture_in(b, s, fam); });
  CHECK_THAT(what, Contains("family 'prefill'") && Contains(arena_label(a)) && Contains(arena_label(b)));
  CHECK(b.committed_bytes() == 0);
  CHECK(a.committed_bytes() == committed);
  CHECK(fam.graphs() == 1);
  ga.replay(sc.bind, s);
  CHECK(sc.launches == 1);
}

// ---- the element extent stays in its fold ------------------------------------------------------------

TEST_CASE("misuse: an element extent used outside its fold is refused, and symbols() lists its batch", "[misuse][extent]") {
  const Symbol R1 = Symbol::fixed("misuse.R1"), R2 = Symbol::fixed("misuse.R2");
  const Symbol L1 = Symbol::batch("misuse.L1", R1, 1000), L2 = Symbol::batch("misuse.L2", R2, 1000);
  Bindings b;
  b.set(R1, 2).set(L1, {1, 5}).set(R2, 3).set(L2, {600, 700, 600});
  Extent leaked = 0;
  const Extent own = sum_over(L1, [&](const Extent& l) {
    leaked = l;
    return l;
  });
  CHECK(own.evaluate(b) == 6);  // the fold that made the element is fine

  // Outside any fold: an error naming the batch, at evaluation and at bounding (no null dereference).
  const Extent escaped = leaked + 1;
  CHECK_THAT(thrown<invalid_argument_error>([&] { (void)escaped.evaluate(b); }),
             Contains("'misuse.L1'") && Contains("outside the sum_over/max_over"));
  CHECK_THAT(thrown<invalid_argument_error>([&] { (void)escaped.capacity_bound(b); }), Contains("'misuse.L1'"));
  CHECK_THROWS_AS((escaped + sum_over(L2, [](const Extent& l) { return l; })).evaluate(b), invalid_argument_error);
  // ... and through the arena (the policy evaluates it).
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  CHECK_THROWS_AS(arena.request(s, "leak", escaped, 4, exact_at_capture, b), invalid_argument_error);
  CHECK(arena.stats().eager_blocks == 0);
  // symbols() does not hide the batch (guards and replays must see it).
  const std::vector<Symbol> syms = escaped.symbols();
  CHECK(std::find(syms.begin(), syms.end(), L1) != syms.end());
  CHECK(std::find(syms.begin(), syms.end(), R1) != syms.end());
  CHECK(escaped.dynamic_symbols() == std::vector<Symbol>{L1});

  // Inside another batch's fold it would read that batch's values in place of its own: refused when
  // the fold is built.
  CHECK_THAT(thrown<invalid_argument_error>([&] { sum_over(L2, [&](const Extent& l) { return l + leaked; }); }),
             Contains("'misuse.L1'") && Contains("'misuse.L2'"));
  CHECK_THAT(thrown<invalid_argument_error>([&] { max_over(L2, [&](const Extent&) { return leaked * 2; }); }),
             Contains("'misuse.L1'") && Contains("'misuse.L2'"));
  CHECK_THROWS_AS(sum_over(L2, [&](const Extent& l) { return min(l, ceil_div(leaked, 4)); }), invalid_argument_error);
  // The same batch's element, taken from another fold over that batch, is that batch's element.
  const Extent twice = sum_over(L1, [&](const Extent& l) { return l + leaked; });
  CHECK(twice.evaluate(b) == 2 * (1 + 5));
}

// ---- ArenaOptions ---------------------------------------------------------------------------------

TEST_CASE("misuse: ArenaOptions out of range are refused when the arena is made, naming the value and the limit",
          "[misuse][options]") {
  HostBackend backend;
  struct Row {
    const char* name;
    ArenaOptions o;
    std::vector<std::string> fragments;
  };
  const std::vector<Row> rows = {
      {"growth_bytes that wraps to 0 when rounded up to 2 MiB", ArenaOptions{.growth_bytes = ~0ull},
       {"growth_bytes = 18446744073709551615", "4611686018427387904"}},
      {"growth_bytes one above the limit", ArenaOptions{.growth_bytes = (1ull << 62) + 1},
       {"growth_bytes = 4611686018427387905", "4611686018427387904"}},
      {"growth_bytes 0 (zero-byte slabs)", ArenaOptions{.growth_bytes = 0}, {"growth_bytes = 0", ">= 1"}},
      {"canary_bytes that overflow bytes + guard", ArenaOptions{.debug = true, .canary_bytes = ~0ull - 100},
       {"canary_bytes = 18446744073709551515", "1073741824"}},
      {"canary_bytes above the limit, debug off", ArenaOptions{.debug = false, .canary_bytes = (1ull << 30) + 1},
       {"canary_bytes = 1073741825", "1073741824"}},
  };
  for (const Row& r : rows) {
    INFO(r.name);
    const std::string what = thrown<invalid_argument_error>([&] { Arena arena(backend, r.o); });
    for (const auto& f : r.fragments) CHECK_THAT(what, Contains(f));
  }
  CHECK(backend.bytes_in_use() == 0);
  // The limits themselves are accepted, and such an arena serves (slabs rounded up to 2 MiB).
  Arena edge(backend, ArenaOptions{.growth_bytes = 1, .report_findings = false, .debug = false,
                                   .canary_bytes = 1ull << 30});
  HostStream s;
  auto w = edge.request(s, "w", 100, 4, capacity_bound, Bindings());
  CHECK(w.bytes() == 400);
  CHECK(edge.stats().slab_bytes == 2 * kMiB);
}

TEST_CASE("misuse: align_up refuses a value that would wrap past 2^64", "[misuse][options]") {
  CHECK(detail::align_up(1, 256) == 256);
  CHECK(detail::align_up(1ull << 62, 2 * kMiB) == 1ull << 62);
  CHECK(detail::align_up(~0ull - 255, 256) == ~0ull - 255);
  CHECK_THAT(thrown<overflow_error>([] { (void)detail::align_up(~0ull - 100, 2 * kMiB); }),
             Contains("18446744073709551515") && Contains("2097152"));
}

// ---- bindings a replay cannot honour -------------------------------------------------------------------

TEST_CASE("misuse: Bindings::set refuses a batch vector whose length differs from its bound count", "[misuse][bindings]") {
  const Symbol R = Symbol::fixed("misuse.R");
  const Symbol L = Symbol::batch("misuse.L", R, 64);
  Bindings b;
  b.set(R, 2).set(L, {3, 4});
  CHECK_THAT(thrown<invalid_argument_error>([&] { b.set(L, {1, 1, 1, 1, 1, 1, 1}); }),
             Contains("'misuse.L' has 7 values") && Contains("length 'misuse.R' is 2"));
  const std::vector<std::int32_t> one = {9};
  CHECK_THAT(thrown<invalid_argument_error>([&] { b.set(L, std::span<const std::int32_t>(one)); }),
             Contains("1 values") && Contains("is 2"));
  CHECK(b.describe(L) == "misuse.L = [3, 4]");  // unchanged
  // The count re-bound first, then the vector: accepted (the new count is the one that matters).
  b.set(R, 3).set(L, {1, 2, 3});
  CHECK(b.values(L).size() == 3);
}

TEST_CASE("misuse: a replay is refused for bindings its extents reject, with every policy", "[misuse][bindings][replay]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 2 * kMiB, .report_findings = false});
  HostStream s;
  const Symbol R = Symbol::fixed("misuse.rR");
  const Symbol L = Symbol::batch("misuse.rL", R, 64);
  const Extent need = sum_over(L, [](const Extent& l) { return l; });
  Bindings at_capture;
  at_capture.set(R, 2).set(L, {3, 4});
  const StaticQueryBound bound(Extent(R) * 64);  // equals the capacity bound: replay-safe, no live guard
  struct Row {
    const char* name;
    const SizingPolicy* policy;
    std::size_t guards;
  };
  const std::vector<Row> rows = {{"capacity_bound", &capacity_bound, 0},
                                 {"static_query_bound", &bound, 0},
                                 {"exact_at_capture", &exact_at_capture, 1}};
  for (const Row& r : rows) {
    INFO(r.name);
    int launches = 0;
    CapturedGraph g = capture(arena, s, at_capture, [&](const Bindings& b) {
      auto w = arena.request(s, "kv", need, 4, *r.policy, b);
      s.launch([&launches] { ++launches; });
    });
    REQUIRE(g.plan().guard_count() == r.guards);
    // 7 values for R = 2 (bound in that order, so set() could not see it).
    Bindings seven;
    seven.set(L, {1, 1, 1, 1, 1, 1, 1}).set(R, 2);
    CHECK_THAT(thrown<invalid_argument_error>([&] { g.replay(seven, s); }),
               Contains("'misuse.rL' has 7 values") && Contains("length 'misuse.rR' is 2"));
    // L unbound.
    Bindings unbound;
    unbound.set(R, 2);
    CHECK_THAT(thrown<unbound_symbol_error>([&] { g.replay(unbound, s); }), Contains("'misuse.rL'"));
    CHECK(launches == 0);  // neither replay launched
    Bindings good;
    good.set(R, 2).set(L, {0, 7});
    g.replay(good, s);
    CHECK(launches == 1);
  }
}

// ---- errors halfway through trim() ------------------------------------------------------------------------

namespace {
// Host backend whose free_slab fails the next `fail_frees` times (a driver error mid-trim).
class FailingFreeBackend final : public graphsafe_test::ForwardingBackend {
 public:
  void free_slab(void* p, std::uint64_t bytes, Stream s) override {
    if (fail_frees > 0) {
      --fail_frees;
      throw graphsafe::error("graphsafe test: free_slab failed");
    }
    host.free_slab(p, bytes, s);
  }
  int fail_frees = 0;
};
}  // namespace

TEST_CASE("misuse: trim() that fails to free one slab keeps it and frees the others", "[misuse][trim]") {
  FailingFreeBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 2 * kMiB, .report_findings = false});
  HostStream s;
  {
    // Three slabs: each 1.5 MiB workspace needs a fresh 2 MiB slab.
    std::vector<Workspace> ws;
    for (int i = 0; i < 3; ++i) ws.push_back(arena.request(s, "w", Extent(static_cast<std::int64_t>(3 * kMiB / 2)), 1, capacity_bound, Bindings()));
  }
  REQUIRE(arena.stats().slabs == 3);
  REQUIRE(backend.host.bytes_in_use() == 6 * kMiB);
  backend.fail_frees = 1;
  CHECK_THROWS_WITH(arena.trim(s), Contains("free_slab failed"));
  // Every byte the backend holds is still the arena's (the slab that failed stays, usable).
  CHECK(arena.stats().slab_bytes == backend.host.bytes_in_use());
  CHECK(arena.stats().slabs == 1);
  CHECK(arena.stats().free_bytes == arena.stats().slab_bytes);
  CHECK(detail::core_of(arena).fl.validate().empty());
  const std::uint64_t allocations = backend.host.slab_allocations();
  { auto w = arena.request(s, "again", Extent(static_cast<std::int64_t>(kMiB)), 1, capacity_bound, Bindings()); }
  CHECK(backend.host.slab_allocations() == allocations);
  arena.trim(s);
  CHECK(backend.host.bytes_in_use() == 0);
  CHECK(arena.stats().slab_bytes == 0);
}

// ---- family figures are read under the arena's lock ---------------------------------------------------

TEST_CASE("misuse: a family's figures are read under the arena's lock", "[misuse][family][concurrency]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 2 * kMiB, .report_findings = false});
  HostStream s;
  arena.reserve(2 * kMiB, s);
  Scene sc("misuse.ln");
  auto fam = arena.family("locked");
  CapturedGraph g = sc.capture_in(arena, s, fam);
  const std::vector<std::pair<const char*, std::function<std::uint64_t()>>> reads = {
      {"region_bytes", [&] { return fam.region_bytes(); }},
      {"graphs", [&] { return fam.graphs(); }},
      {"largest_plan_bytes", [&] { return fam.largest_plan_bytes(); }},
      {"sum_of_plan_bytes", [&] { return fam.sum_of_plan_bytes(); }},
  };
  for (const auto& [name, read] : reads) {
    INFO(name);
    std::atomic<bool> done{false};
    std::uint64_t value = 0;
    std::thread reader;
    {
      // While this thread holds the lock (as a capture or a graph's destruction would while changing
      // the family), the read must wait.
      std::lock_guard lk(detail::core_of(arena).lock);
      reader = std::thread([&] {
        value = read();
        done = true;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      CHECK_FALSE(done.load());
    }
    reader.join();
    CHECK(done.load());
    CHECK(value == read());
  }
  // capacity_bound reserves n's capacity: 1024 x 8 bytes, one plan, one graph.
  CHECK(fam.graphs() == 1);
  CHECK(fam.region_bytes() == 8192);
  CHECK(fam.largest_plan_bytes() == 8192);
  CHECK(fam.sum_of_plan_bytes() == 8192);
}
