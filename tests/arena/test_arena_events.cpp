// The arena's observer interface (src/arena_observer.hpp): a scripted run on the host backend --
// growth, eager requests and releases, a capture, replays, a refused replay, an abandoned capture,
// trim -- and the event sequence an attached observer saw, compared with the sequence the script
// itself predicts from its own sizes and pointers. Debug mode is an observer too: attached next to
// another one, both see every event.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include "arena_core.hpp"
#include "internal_access.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace graphsafe;

namespace {
constexpr std::uint64_t kMiB = 1ull << 20;

std::string at(const void* p) {
  std::ostringstream os;
  os << "@" << p;
  return os.str();
}
std::string at(std::uintptr_t a) { return at(reinterpret_cast<const void*>(a)); }

// Writes each event as one line; captured requests by name, size and offset in the region.
class Recorder final : public detail::ArenaObserver {
 public:
  explicit Recorder(std::vector<std::string>& out) : out_(out) {}
  void slab_added(std::uintptr_t, std::uint64_t bytes, bool heap) override {
    add("slab_added " + std::to_string(bytes) + (heap ? " heap" : " reservation"));
  }
  void slab_removed(std::uintptr_t addr) noexcept override { add("slab_removed " + at(addr)); }
  void request(std::uintptr_t addr, std::uint64_t bytes, std::string_view name, const std::source_location&, Stream,
               bool opaque) override {
    add("request " + std::string(name) + " " + std::to_string(bytes) + " " + at(addr) + (opaque ? " opaque" : ""));
  }
  void release(std::uintptr_t addr, void*) noexcept override { add("release " + at(addr)); }
  void capture_begin(detail::SessionState& st) override { add("capture_begin " + st.family->name); }
  void captured_request(detail::SessionState&, const PlanEntry& e) override {
    add("captured_request " + e.name + " " + std::to_string(e.bytes) + " +" + std::to_string(e.offset));
  }
  void reuse_not_proven(detail::SessionState&, const PlanEntry& e, const std::string&) override {
    add("reuse_not_proven " + e.name);
  }
  void capture_end(detail::SessionState& st, bool success) noexcept override {
    add("capture_end " + st.family->name + (success ? " ok" : " abandoned"));
  }
  void graph_created(detail::SessionState&, detail::GraphState& g) override { add("graph_created " + g.family->name); }
  void replay_begin(detail::GraphState& g, Stream, void*, const std::source_location&) override {
    add("replay_begin " + g.family->name);
  }
  void replay_end(detail::GraphState& g, Stream) override { add("replay_end " + g.family->name); }
  void graph_destroyed(detail::GraphState& g) noexcept override { add("graph_destroyed " + g.family->name); }

 private:
  void add(std::string line) noexcept {
    try {
      std::lock_guard g(m_);
      out_.push_back(std::move(line));
    } catch (...) {
    }
  }
  std::mutex m_;
  std::vector<std::string>& out_;
};

std::string listing(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += "  " + l + "\n";
  return s;
}
}  // namespace

TEST_CASE("an observer sees the event sequence of a scripted run", "[arena][observer]") {
  std::vector<std::string> seen;  // outlives the arena: its death is an event too
  HostBackend backend;
  HostStream s;
  Arena arena(backend, ArenaOptions{.growth_bytes = 4 * kMiB, .report_findings = false, .debug = false});
  detail::core_of(arena).attach(std::make_unique<Recorder>(seen));
  std::vector<std::string> want;  // what the script says happens, step by step

  // Growth and the eager pair. reserve rounds up to 2 MiB; a request no slab fits adds a slab of
  // max(request, growth_bytes) rounded up to 2 MiB.
  arena.reserve(1 * kMiB, s);
  want.push_back("slab_added " + std::to_string(2 * kMiB) + " heap");
  Bindings none;
  Workspace a = arena.request(s, "a", Extent(1000), 1, capacity_bound, none);
  want.push_back("request a 1000 " + at(a.data()));
  void* p = arena.allocate(s, 300);
  want.push_back("request <opaque 300 B> 300 " + at(p) + " opaque");
  const void* a_ptr = a.data();
  a.reset();
  want.push_back("release " + at(a_ptr));
  arena.deallocate(s, p, 300);
  want.push_back("release " + at(p));
  Workspace big = arena.request(s, "big", Extent(static_cast<std::int64_t>(5 * kMiB)), 1, capacity_bound, none);
  want.push_back("slab_added " + std::to_string(6 * kMiB) + " heap");
  want.push_back("request big " + std::to_string(5 * kMiB) + " " + at(big.data()));
  const void* big_ptr = big.data();
  big.reset();
  want.push_back("release " + at(big_ptr));
  CHECK(seen == want);

  // A capture: a request sized by its capacity, a dimension, an opaque byte request. Offsets are
  // the region's bump order (256-byte aligned, nothing released during the capture).
  const Symbol n = Symbol::dynamic("n", 4096);
  Bindings b;
  b.set(n, 100);
  CaptureFamily fam = arena.family("decode");
  CapturedGraph g = capture(
      arena, s, b,
      [&](const Bindings& bb) {
        Workspace x = arena.request(s, "x", Extent(n) * 4, 1, capacity_bound, bb);
        (void)arena.dimension(s, "rows", Extent(n), capacity_bound, bb);
        (void)arena.allocate(s, 512);  // x is still live: placed after it
      },
      CaptureOptions{.family = fam});
  want.push_back("capture_begin decode");
  want.push_back("captured_request x 16384 +0");
  want.push_back("captured_request rows 0 +0");
  want.push_back("captured_request <opaque 512 B> 512 +16384");
  want.push_back("capture_end decode ok");
  want.push_back("graph_created decode");
  CHECK(listing(seen) == listing(want));

  g.replay(b, s);
  b.set(n, 4096);  // the bound the graph was sized for: still no guard failure
  g.replay(b, s);
  want.insert(want.end(), {"replay_begin decode", "replay_end decode", "replay_begin decode", "replay_end decode"});
  CHECK(listing(seen) == listing(want));

  // A graph sized exactly at capture refuses a replay that needs more: the observer sees no launch.
  {
    Bindings e;
    const Symbol m = Symbol::dynamic("m");
    e.set(m, 64);
    CapturedGraph exact = capture(arena, s, e, [&](const Bindings& bb) {
      Workspace y = arena.request(s, "y", Extent(m), 8, exact_at_capture, bb);
    });
    want.insert(want.end(), {"capture_begin graph", "captured_request y 512 +0", "capture_end graph ok",
                             "graph_created graph"});
    e.set(m, 65);
    CHECK_THROWS_AS(exact.replay(e, s), guard_failure);
    CHECK(listing(seen) == listing(want));
  }
  want.push_back("graph_destroyed graph");

  // A capture whose function throws is abandoned: begin, its request, end without a graph.
  CHECK_THROWS_AS(capture(arena, s, b,
                          [&](const Bindings& bb) {
                            Workspace z = arena.request(s, "z", Extent(n), 1, capacity_bound, bb);
                            throw std::runtime_error("model failed");
                          },
                          CaptureOptions{.family = fam}),
                  std::runtime_error);
  // The family holds its region (its graph lives): the capture places there again from offset 0.
  want.insert(want.end(), {"capture_begin decode", "captured_request z 4096 +0", "capture_end decode abandoned"});
  CHECK(listing(seen) == listing(want));

  // The graph dies, then trim gives both slabs back.
  { CapturedGraph gone = std::move(g); }
  want.push_back("graph_destroyed decode");
  CHECK(listing(seen) == listing(want));
  const std::size_t before_trim = seen.size();
  arena.trim(s);
  CHECK(arena.stats().slabs == 0);
  REQUIRE(seen.size() == before_trim + 2);
  for (std::size_t i = before_trim; i < seen.size(); ++i) CHECK(seen[i].rfind("slab_removed @", 0) == 0);
  CHECK(seen[before_trim] != seen[before_trim + 1]);  // two different slabs
}

TEST_CASE("debug mode is an observer: another one attached beside it sees the same events", "[arena][observer][debug]") {
  debug::clear_findings();
  std::vector<std::string> seen;
  HostBackend backend;
  HostStream s;
  Arena arena(backend, ArenaOptions{.report_findings = false, .debug = true});
  detail::core_of(arena).attach(std::make_unique<Recorder>(seen));
  arena.reserve(1 * kMiB, s);
  Bindings b;
  CapturedGraph g = capture(arena, s, b, [&](const Bindings&) { (void)arena.allocate(s, 100); });
  g.replay(b, s);
  // The debug observer reported the opaque request (its finding) and the recorder saw the capture.
  bool opaque_found = false;
  for (const debug::Finding& f : debug::findings()) opaque_found |= f.kind == debug::kind::opaque_request_in_capture;
  CHECK(opaque_found);
  // The event carries the request's own 100 bytes (the guard behind it is debug mode's business).
  const std::vector<std::string> want{"slab_added " + std::to_string(2 * kMiB) + " heap", "capture_begin graph", "captured_request <opaque 100 B> 100 +0",
                                      "capture_end graph ok", "graph_created graph", "replay_begin graph",
                                      "replay_end graph"};
  CHECK(listing(seen) == listing(want));
  debug::clear_findings();
}

TEST_CASE("virtual growth's region provider tells its reservation as the family's memory", "[arena][observer][virtual]") {
  std::vector<std::string> seen;
  HostBackend backend;
  HostStream s;
  auto vm = std::make_shared<HostVirtualMemory>(HostVirtualMemoryOptions{.granularity = 64 << 10});
  Arena arena(backend, ArenaOptions{.report_findings = false,
                                    .debug = false,
                                    .virtual_memory = vm,
                                    .virtual_reserve_bytes = 8 * kMiB});
  detail::core_of(arena).attach(std::make_unique<Recorder>(seen));
  const Symbol n = Symbol::dynamic("n", 1 << 20);
  Bindings b;
  b.set(n, 1000);
  std::vector<std::string> want;
  {
    CaptureFamily fam = arena.family("prefill");
    CapturedGraph g = capture(
        arena, s, b, [&](const Bindings& bb) { Workspace w = arena.request(s, "kv", Extent(n), 4, capacity_bound, bb); },
        CaptureOptions{.family = fam});
    // The reservation is made when the family first captures (before the capture begins); the
    // request takes its bound (4 MiB) of address space at offset 0. No slab is involved.
    want = {"slab_added " + std::to_string(8 * kMiB) + " reservation", "capture_begin prefill",
            "captured_request kv " + std::to_string(4 * kMiB) + " +0", "capture_end prefill ok",
            "graph_created prefill"};
    CHECK(listing(seen) == listing(want));
    g.replay(b, s);
    want.insert(want.end(), {"replay_begin prefill", "replay_end prefill"});
    CHECK(listing(seen) == listing(want));
    CHECK(arena.stats().slabs == 0);
  }
  // The graph died, then the family's last handle: its reservation goes back.
  want.push_back("graph_destroyed prefill");
  REQUIRE(seen.size() == want.size() + 1);
  CHECK(listing(std::vector<std::string>(seen.begin(), seen.end() - 1)) == listing(want));
  CHECK(seen.back().rfind("slab_removed @", 0) == 0);
}
