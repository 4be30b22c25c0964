// Allocation failure at every step of finishing a capture. The backend has already instantiated the
// graph when the arena builds its plan, its graph state and (debug mode) its report, and each of those
// allocates. This program replaces the global operator new with one that fails the N-th allocation
// after the backend's end_capture returns, for N = 0, 1, ... until the capture completes. Whatever
// step fails, the capture must throw std::bad_alloc and leave nothing behind: no instantiated graph
// (the backend counts them), no region held for the family, no capture registered, and the arena
// must capture into the same family again.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "../support/forwarding_backend.hpp"

using namespace graphsafe;

namespace {
// < 0: allocations succeed; otherwise the allocation after `countdown` more fails (once).
std::atomic<long> countdown{-1};
}  // namespace

// Every unaligned form is replaced, so each allocation pairs with a release of the same family
// (sanitizers check that; the aligned forms keep the runtime's own pairs).
void* operator new(std::size_t n) {
  if (countdown.load(std::memory_order_relaxed) >= 0 && countdown.fetch_sub(1) == 0) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

// Host backend that counts live instantiated graphs and arms the allocation failure as soon as
// end_capture has instantiated one.
class ArmingBackend final : public graphsafe_test::ForwardingBackend {
 public:
  GraphHandle end_capture(Stream s) override {
    GraphHandle h = host.end_capture(s);
    ++live_graphs;
    countdown = fail_at;
    return h;
  }
  void destroy(GraphHandle& g) noexcept override {
    if (g.exec) --live_graphs;
    host.destroy(g);
  }
  long fail_at = -1;
  int live_graphs = 0;
};

void sweep(bool debug) {
  ArmingBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 2 << 20, .report_findings = false, .debug = debug});
  HostStream s;
  arena.reserve(2 << 20, s);
  const Symbol n = Symbol::dynamic("alloc.n", 1024);
  Bindings b;
  b.set(n, 10);
  auto fam = arena.family("swept");
  int launches = 0;
  auto fn = [&](const Bindings& bb) {
    auto w = arena.request(s, "kv", Extent(n), 8, exact_at_capture, bb);  // a live guard: the plan allocates
    s.launch([&launches] { ++launches; });
  };
  long failures = 0;
  for (long at = 0;; ++at) {
    INFO("allocation " << at << " after end_capture fails");
    backend.fail_at = at;
    bool threw = false;
    try {
      CapturedGraph g = capture(arena, s, b, fn, CaptureOptions{.family = fam});
      countdown = -1;
      backend.fail_at = -1;
      g.replay(b, s);
    } catch (const std::bad_alloc&) {
      threw = true;
      ++failures;
    }
    countdown = -1;
    backend.fail_at = -1;
    // Nothing of the capture is left, whichever step failed.
    CHECK(backend.live_graphs == 0);
    const ArenaStats st = arena.stats();
    CHECK(st.region_bytes == 0);
    CHECK(st.families == 0);
    CHECK(st.live_graphs == 0);
    CHECK(st.active_captures == 0);
    CHECK(st.free_bytes == st.slab_bytes);
    CHECK(fam.graphs() == 0);
    CHECK_FALSE(s.capturing());
    if (!threw) break;
    REQUIRE(at < 10000);
  }
  CHECK(failures > 0);  // at least one step after end_capture allocates: the sweep tested something
  CHECK(launches == 1);
  // The family captures and replays again.
  CapturedGraph g = capture(arena, s, b, fn, CaptureOptions{.family = fam});
  g.replay(b, s);
  CHECK(launches == 2);
  CHECK(backend.live_graphs == 1);
}

}  // namespace

TEST_CASE("misuse: finishing a capture that runs out of memory at any step leaves no graph and no region", "[misuse][capture]") {
  sweep(false);
}

TEST_CASE("misuse: finishing a debug-mode capture that runs out of memory at any step leaves no graph and no region",
          "[misuse][capture][debug]") {
  sweep(true);
}
