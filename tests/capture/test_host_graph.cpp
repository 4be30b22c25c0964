// Host backend semantics, the contract the CUDA backend also obeys: eager work runs now; captured
// work runs only at replay, with the values it was given at capture (as kernel arguments are frozen
// in a CUDA Graph); workspace addresses are stable across replays; captures do not nest.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {
Stream null_stream() { return Stream(static_cast<cudaStream_t>(nullptr)); }
}  // namespace

TEST_CASE("host graph: eager launch runs now, in order", "[host]") {
  HostStream s;
  std::vector<int> log;
  s.launch([&] { log.push_back(1); });
  CHECK(log == std::vector<int>{1});
  s.launch([&] { log.push_back(2); });
  s.launch([&] { log.push_back(3); });
  CHECK(log == std::vector<int>{1, 2, 3});
  CHECK_FALSE(s.capturing());
}

TEST_CASE("host graph: captured work runs only at replay, with frozen values", "[host]") {
  HostBackend backend;
  HostStream s;
  std::vector<int> log;
  int live = 10;
  backend.begin_capture(s, CaptureMode::global);
  CHECK(s.capturing());
  const CaptureInfo ci = backend.capture_info(s);
  CHECK(ci.active);
  CHECK(ci.id != 0);
  for (int i = 0; i < 3; ++i) {
    const int frozen = live + i;  // a kernel argument: copied at capture
    s.launch([&log, frozen] { log.push_back(frozen); });
  }
  s.launch([&log, &live] { log.push_back(-live); });  // a device buffer: read at replay
  CHECK(log.empty());                                   // nothing ran while capturing
  GraphHandle g = backend.end_capture(s);
  CHECK_FALSE(s.capturing());
  CHECK_FALSE(backend.capture_info(s).active);
  CHECK(log.empty());
  live = 99;
  backend.launch(g, s);
  CHECK(log == std::vector<int>{10, 11, 12, -99});
  live = 7;
  backend.launch(g, s);
  CHECK(log == std::vector<int>{10, 11, 12, -99, 10, 11, 12, -7});
  // Eager work after the capture is not part of the graph.
  s.launch([&] { log.push_back(1000); });
  CHECK(log.back() == 1000);
  log.clear();
  backend.launch(g, s);
  CHECK(log == std::vector<int>{10, 11, 12, -7});
  backend.destroy(g);
  CHECK(g.exec == nullptr);
  CHECK(g.graph == nullptr);
}

TEST_CASE("host graph: capture ids are unique and abort discards the recording", "[host]") {
  HostBackend backend;
  HostStream a, b;
  std::set<std::uint64_t> ids;
  int ran = 0;
  for (int i = 0; i < 5; ++i) {
    backend.begin_capture(a, CaptureMode::global);
    backend.begin_capture(b, CaptureMode::relaxed);  // captures on two streams at once
    ids.insert(backend.capture_info(a).id);
    ids.insert(backend.capture_info(b).id);
    a.launch([&] { ++ran; });
    backend.abort_capture(a);
    GraphHandle g = backend.end_capture(b);
    backend.destroy(g);
  }
  CHECK(ids.size() == 10);
  CHECK(ids.count(0) == 0);
  CHECK(ran == 0);
  CHECK_FALSE(a.capturing());
  a.launch([&] { ++ran; });  // the stream is eager again
  CHECK(ran == 1);
  CHECK_THROWS_AS(backend.end_capture(a), capture_state_error);
  CHECK_THROWS_AS(backend.capture_info(null_stream()), invalid_argument_error);
}

TEST_CASE("host graph: nested capture is refused and the outer capture survives", "[host]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s, other;
  arena.reserve(1 << 20, s);
  Bindings b;
  int ran = 0;

  // Backend level.
  backend.begin_capture(s, CaptureMode::global);
  CHECK_THROWS_WITH(backend.begin_capture(s, CaptureMode::global), Contains("already capturing"));
  backend.abort_capture(s);

  // Arena level: a CaptureSession / capture() inside a capture on the same stream.
  const ArenaStats before = arena.stats();
  auto g = capture(arena, s, b, [&](const Bindings& bb) {
    auto ws = arena.request(s, "outer", 64, 4, capacity_bound, bb);
    try {
      CaptureSession inner(arena, s, bb);
      FAIL("nested capture should have been refused");
    } catch (const capture_state_error& e) {
      CHECK_THAT(std::string(e.what()), Contains("already capturing") && Contains("capture on another stream"));
    }
    CHECK_THROWS_AS(capture(arena, s, bb, [](const Bindings&) {}), capture_state_error);
    CHECK(s.capturing());
    s.launch([&ran] { ++ran; });
  });
  CHECK(ran == 0);
  CHECK(g.plan().entries().size() == 1);
  g.replay(b, s);
  CHECK(ran == 1);
  CHECK(arena.stats().active_captures == 0);
  CHECK(arena.stats().region_bytes == 256);
  CHECK(before.active_captures == 0);

  // A capture on another stream during a capture is fine (streams capture independently).
  // The outer capture holds the largest free block; the inner one needs a block of its own, which
  // an eager reserve on the non-capturing stream provides.
  auto g2 = capture(arena, s, b, [&](const Bindings& bb) {
    arena.reserve(1 << 20, other);
    auto inner = capture(arena, other, bb, [&](const Bindings&) { other.launch([&ran] { ran += 10; }); });
    s.launch([&ran] { ran += 100; });
    CHECK(ran == 1);
    inner.replay(bb, other);  // `other` is not capturing: runs now
    CHECK(ran == 11);
  });
  g2.replay(b, s);
  CHECK(ran == 111);

  // A graph may not be replayed on a stream that is capturing.
  CaptureSession cs(arena, s, b);
  CHECK_THROWS_WITH(g.replay(b, s), Contains("replay() on a stream that is capturing"));
  auto g3 = cs.finish();
  CHECK_THROWS_AS(cs.finish(), capture_state_error);  // one session, one graph
  g.replay(b, s);
  CHECK(ran == 112);
}

TEST_CASE("host graph: workspace addresses are stable across replays", "[host]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 1 << 20, .report_findings = false});
  HostStream s;
  arena.reserve(1 << 20, s);
  Symbol n = Symbol::dynamic("hg.n", 1024);
  Bindings b;
  b.set(n, 10);
  std::vector<std::uintptr_t> seen;
  std::int32_t* captured_ptr = nullptr;
  std::int64_t captured_count = 0;
  auto g = capture(arena, s, b, [&](const Bindings& bb) {
    auto ws = arena.request(s, "buf", Extent(n), sizeof(std::int32_t), capacity_bound, bb);
    captured_ptr = ws.as<std::int32_t>();
    captured_count = ws.count();
    std::int32_t* p = ws.as<std::int32_t>();
    const std::int64_t count = ws.count();
    s.launch([p, count, &seen] {
      seen.push_back(reinterpret_cast<std::uintptr_t>(p));
      for (std::int64_t i = 0; i < count; ++i) p[i] = static_cast<std::int32_t>(i);
    });
  });
  REQUIRE(captured_count == 1024);
  CHECK(reinterpret_cast<std::uintptr_t>(captured_ptr) % kAlignment == 0);
  CHECK(seen.empty());
  std::vector<Workspace> eager;
  for (int i = 0; i < 50; ++i) {
    // Eager traffic between replays (with growth, releases and a trim) never touches the region.
    eager.push_back(arena.request(s, "eager", 1000 + 977 * i, 1, capacity_bound, b));
    std::memset(eager.back().data(), 0x5A, eager.back().bytes());
    if (i % 3 == 0) eager.erase(eager.begin());
    if (i % 10 == 9) arena.trim(s);
    b.set(n, (i * 37) % 1025);
    g.replay(b, s);
    REQUIRE(seen.size() == static_cast<std::size_t>(i + 1));
    CHECK(seen.back() == reinterpret_cast<std::uintptr_t>(captured_ptr));
    for (std::int64_t k = 0; k < captured_count; k += 97) CHECK(captured_ptr[k] == k);
    for (const Workspace& w : eager) {
      const auto* p = static_cast<const unsigned char*>(w.data());
      CHECK(p[0] == 0x5A);
      CHECK(p[w.bytes() - 1] == 0x5A);
    }
  }
  CHECK(g.reserved_bytes() == 4096);
  CHECK(g.family().region_bytes() == 4096);
}

TEST_CASE("host backend: slabs, limits and poison", "[host]") {
  HostBackend backend(HostBackendOptions{.limit_bytes = 3 << 20});
  HostStream s;
  void* a = backend.allocate_slab(2 << 20, s);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 4096 == 0);
  CHECK(static_cast<unsigned char*>(a)[12345] == 0xA5);  // never zeros
  CHECK(backend.bytes_in_use() == (2u << 20));
  CHECK_THROWS_WITH(backend.allocate_slab(2 << 20, s),
                    Contains("2097152") && Contains("3145728-byte limit") && Contains("limit_bytes"));
  CHECK(backend.bytes_in_use() == (2u << 20));
  void* c = backend.allocate_slab(1 << 20, s);
  CHECK(backend.slab_allocations() == 2);
  backend.free_slab(a, 2 << 20, s);
  backend.free_slab(c, 1 << 20, s);
  CHECK(backend.bytes_in_use() == 0);
  CHECK(backend.name() == "host");
}
