// The arena against a simple model. Long seeded random sequences of eager requests and releases on
// several host streams, raw allocate/deallocate, reserve, captures of several families (some of them
// failing), replays, graph destruction and trim; after every step the arena's blocks are walked and
// compared with the model (a map of live ranges): every used block is a live workspace or raw
// allocation, every region block is a live family's region sized by its largest plan, nothing
// overlaps, everything is 256-byte aligned, bytes add up, and free neighbours are coalesced. Then the
// error paths, one by one: each is a typed error and leaves the arena unchanged and serving.
#include <catch2/catch.hpp>

#include "../support/stream_work.hpp"

#include <graphsafe/graphsafe.hpp>

#include "arena_core.hpp"  // test-only: FreeList::for_each_block, to walk the blocks
#include "internal_access.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {

using detail::Block;
using detail::BlockState;
using detail::Slab;

// Invariant checks run thousands of times per step: a plain test, and a Catch failure only when
// one does not hold (a Catch assertion per block would dominate the run time).
#define MODEL_REQUIRE(...)                                              \
  do {                                                                  \
    if (!(__VA_ARGS__)) FAIL("model invariant failed: " #__VA_ARGS__); \
  } while (0)

using graphsafe::test::write;

constexpr std::uint64_t kMiB = 1ull << 20;
std::uint64_t align256(std::uint64_t x) { return (x + 255) / 256 * 256; }
std::uintptr_t addr_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

bool filled(const void* p, std::uint64_t bytes, unsigned char tag, bool full) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (bytes == 0) return true;
  if (!full) return c[0] == tag && c[bytes / 2] == tag && c[bytes - 1] == tag;
  unsigned char ref[4096];
  std::memset(ref, tag, sizeof ref);
  for (std::uint64_t i = 0; i < bytes; i += sizeof ref)
    if (std::memcmp(c + i, ref, std::min<std::uint64_t>(sizeof ref, bytes - i)) != 0) return false;
  return true;
}

bool same_stats(const ArenaStats& a, const ArenaStats& b) {
  return a.slab_bytes == b.slab_bytes && a.slabs == b.slabs && a.free_bytes == b.free_bytes &&
         a.largest_free == b.largest_free && a.eager_bytes == b.eager_bytes && a.eager_blocks == b.eager_blocks &&
         a.region_bytes == b.region_bytes && a.families == b.families && a.live_graphs == b.live_graphs &&
         a.active_captures == b.active_captures;
}

// Walks the blocks: contiguity inside each slab, alignment, coalescing. Returns the free block count.
struct Walk {
  std::size_t slabs = 0;
  std::size_t free_blocks = 0;
  std::size_t fully_free_slabs = 0;
  std::map<std::uintptr_t, std::pair<std::uint64_t, BlockState>> taken;  // used / region / held blocks
};

Walk walk(const Arena& arena) {
  Walk w;
  const std::string consistency = detail::core_of(arena).fl.validate();  // free tree order and byte count
  if (!consistency.empty()) FAIL("free list: " << consistency);
  std::uintptr_t end = 0;
  const Block* prev = nullptr;
  detail::core_of(arena).fl.for_each_block([&](const Slab& s, const Block& b) {
    if (&b == &s.blocks.front()) {
      ++w.slabs;
      MODEL_REQUIRE(b.addr == s.addr);
      end = s.addr;
      prev = nullptr;
      if (s.blocks.size() == 1 && b.state == BlockState::free) ++w.fully_free_slabs;
    }
    MODEL_REQUIRE(b.slab == &s);
    MODEL_REQUIRE(b.addr == end);  // contiguous, no gap, no overlap
    MODEL_REQUIRE(b.size > 0);
    MODEL_REQUIRE(b.addr % kAlignment == 0);
    MODEL_REQUIRE(b.size % kAlignment == 0);
    end += b.size;
    if (b.state == BlockState::free) {
      ++w.free_blocks;
      if (prev && prev->state == BlockState::free) {
        // Two free neighbours stay apart only when released on two different streams.
        INFO("uncoalesced free neighbours at " << prev->addr << " and " << b.addr);
        MODEL_REQUIRE(prev->stream != nullptr);
        MODEL_REQUIRE(b.stream != nullptr);
        MODEL_REQUIRE(prev->stream != b.stream);
      }
    } else {
      w.taken[b.addr] = {b.size, b.state};
    }
    if (&b == &s.blocks.back()) MODEL_REQUIRE(end == s.addr + s.size);
    prev = &b;
  });
  return w;
}

struct Eager {
  Workspace ws;
  int stream;
  unsigned char tag;
};
struct Raw {
  void* p;
  std::uint64_t bytes;
  int stream;
  unsigned char tag;
};
struct Fam {
  std::optional<CaptureFamily> fam;
  std::uint64_t region = 0;  // model: max plan bytes of the graphs since the region was made
  std::uintptr_t base = 0;
  int graphs = 0;
};
struct GraphRec {
  CapturedGraph g;
  int fam;
  std::vector<std::pair<unsigned char*, std::uint64_t>> ws;
  unsigned char tag;
  std::int64_t batch;
  std::int64_t n_at_capture;
  bool exact;
  bool uses_batch;
};

class Harness {
 public:
  Harness(std::uint64_t seed, int nstreams)
      : arena(backend, ArenaOptions{.growth_bytes = 1 * kMiB, .report_findings = false}), streams(nstreams), rng(seed) {
    for (int i = 0; i < 3; ++i) {
      fams.emplace_back();
      fams.back().fam = arena.family("fam" + std::to_string(i));
    }
  }

  HostBackend backend;
  Arena arena;
  std::deque<HostStream> streams;
  std::mt19937_64 rng;
  Symbol B = Symbol::fixed("model.batch");
  Symbol n = Symbol::dynamic("model.n", 2048);
  std::vector<Eager> eager;
  std::vector<Raw> raws;
  std::vector<Fam> fams;
  std::vector<GraphRec> graphs;
  unsigned char next_tag_ = 0;
  std::uint64_t captures_ok = 0, captures_failed = 0, replays_ok = 0, replays_refused = 0, misuses = 0;

  std::uint64_t pick(std::uint64_t n) { return rng() % n; }
  unsigned char tag() { return next_tag_ = static_cast<unsigned char>(next_tag_ % 250 + 1); }
  int stream_index() { return static_cast<int>(pick(streams.size())); }
  Bindings bind(std::int64_t batch, std::int64_t nv) {
    Bindings b;
    b.set(B, batch).set(n, nv);
    return b;
  }

  void check(bool full) {
    const ArenaStats st = arena.stats();
    MODEL_REQUIRE(st.free_bytes + st.eager_bytes + st.region_bytes == st.slab_bytes);
    MODEL_REQUIRE(st.slab_bytes == backend.bytes_in_use());
    MODEL_REQUIRE(st.active_captures == 0);
    MODEL_REQUIRE(st.live_graphs == graphs.size());
    std::map<std::uintptr_t, std::pair<std::uint64_t, BlockState>> model;
    std::uint64_t eager_bytes = 0, eager_blocks = 0, region_bytes = 0, families = 0;
    auto add = [&](std::uintptr_t a, std::uint64_t size, BlockState s) {
      MODEL_REQUIRE(a % kAlignment == 0);
      MODEL_REQUIRE(model.emplace(a, std::make_pair(size, s)).second);
    };
    for (const Eager& e : eager) {
      if (e.ws.bytes() == 0) {
        MODEL_REQUIRE(e.ws.data() == nullptr);
        continue;
      }
      add(addr_of(e.ws.data()), align256(e.ws.bytes()), BlockState::used);
      eager_bytes += align256(e.ws.bytes());
      ++eager_blocks;
    }
    for (const Raw& r : raws) {
      add(addr_of(r.p), align256(std::max<std::uint64_t>(r.bytes, 1)), BlockState::used);
      eager_bytes += align256(std::max<std::uint64_t>(r.bytes, 1));
      ++eager_blocks;
    }
    for (const Fam& f : fams) {
      MODEL_REQUIRE(f.fam->graphs() == static_cast<std::uint64_t>(f.graphs));
      MODEL_REQUIRE(f.fam->region_bytes() == f.region);
      if (f.region == 0) continue;
      MODEL_REQUIRE(f.graphs > 0);
      add(f.base, f.region, BlockState::region);
      region_bytes += f.region;
      ++families;
    }
    // No overlap between live ranges (the map is ordered by address).
    std::uintptr_t end = 0;
    for (const auto& [a, v] : model) {
      MODEL_REQUIRE(a >= end);
      end = a + v.first;
    }
    MODEL_REQUIRE(st.eager_bytes == eager_bytes);
    MODEL_REQUIRE(st.eager_blocks == eager_blocks);
    MODEL_REQUIRE(st.region_bytes == region_bytes);
    MODEL_REQUIRE(st.families == families);
    // The arena's blocks are exactly the model's ranges.
    const Walk w = walk(arena);
    MODEL_REQUIRE(w.slabs == st.slabs);
    MODEL_REQUIRE(w.free_blocks == detail::core_of(arena).fl.free_blocks());
    MODEL_REQUIRE(w.taken == model);
    // Nobody wrote over anybody: eager contents are intact (once the streams ran what they were given).
    backend.quiesce();
    for (const Eager& e : eager) MODEL_REQUIRE(filled(e.ws.data(), e.ws.bytes(), e.tag, full));
    for (const Raw& r : raws) MODEL_REQUIRE(filled(r.p, r.bytes, r.tag, full));
  }

  void request_eager() {
    const int si = stream_index();
    const std::uint64_t elem = 1ull << pick(4);
    std::int64_t count = static_cast<std::int64_t>(pick(8192));
    if (pick(60) == 0) count = static_cast<std::int64_t>((1 + pick(3)) * kMiB / elem + pick(1000));  // grows
    if (pick(40) == 0) count = 0;
    Workspace w;
    if (count <= 2048 && pick(2) == 0) {
      w = arena.request(streams[si], "eager.exact", Extent(n), elem, exact_at_capture, bind(1, count));
    } else {
      w = arena.request(streams[si], "eager.const", Extent(count), elem, capacity_bound, bind(1, 0));
    }
    REQUIRE(w);
    REQUIRE_FALSE(w.captured());
    REQUIRE(w.count() == count);
    REQUIRE(w.bytes() == static_cast<std::uint64_t>(count) * elem);
    REQUIRE(addr_of(w.data()) % kAlignment == 0);
    const unsigned char t = tag();
    write(streams[si], w.data(), w.bytes(), t);
    eager.push_back({std::move(w), si, t});
  }

  void release_eager() {
    if (eager.empty()) return;
    const std::size_t i = pick(eager.size());
    if (pick(2)) eager[i].ws.reset();
    eager.erase(eager.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void allocate_raw() {
    const int si = stream_index();
    std::uint64_t bytes = pick(20000);
    if (pick(100) == 0) bytes = 2 * kMiB + pick(100000);
    const std::uint64_t alignment = 1ull << pick(9);
    void* p = arena.allocate(streams[si], bytes, alignment);
    REQUIRE(p != nullptr);
    REQUIRE(addr_of(p) % kAlignment == 0);
    const unsigned char t = tag();
    write(streams[si], p, bytes, t);
    raws.push_back({p, bytes, si, t});
  }

  void deallocate_raw() {
    if (raws.empty()) return;
    const std::size_t i = pick(raws.size());
    const Raw r = raws[i];
    raws.erase(raws.begin() + static_cast<std::ptrdiff_t>(i));
    const std::uint64_t bytes = pick(4) == 0 ? r.bytes / 2 : r.bytes;  // a smaller size is accepted
    // Released on any stream, ordered after the one that used it (as a program must: an event).
    HostStream& on = streams[stream_index()];
    backend.order_after(on, streams[r.stream]);
    arena.deallocate(on, r.p, bytes);
    if (pick(4) == 0) {  // double release: refused, nothing changes
      const ArenaStats before = arena.stats();
      REQUIRE_THROWS_WITH(arena.deallocate(streams[r.stream], r.p, r.bytes), Contains("double release"));
      REQUIRE(same_stats(before, arena.stats()));
      ++misuses;
    }
  }

  void foreign_deallocate() {
    const ArenaStats before = arena.stats();
    int local = 0;
    REQUIRE_THROWS_AS(arena.deallocate(streams[0], &local, 4), invalid_argument_error);
    if (!eager.empty() && eager.front().ws.bytes()) {  // a workspace is not an allocate() pointer
      REQUIRE_THROWS_AS(arena.deallocate(streams[0], eager.front().ws.data(), eager.front().ws.bytes()),
                        invalid_argument_error);
    }
    if (!raws.empty()) {
      const Raw& r = raws.front();
      const std::uint64_t block = align256(std::max<std::uint64_t>(r.bytes, 1));
      REQUIRE_THROWS_WITH(arena.deallocate(streams[0], r.p, block + 1), Contains("pass the size given to allocate()"));
      REQUIRE_THROWS_AS(arena.deallocate(streams[0], static_cast<char*>(r.p) + 256, 1), invalid_argument_error);
    }
    REQUIRE(same_stats(before, arena.stats()));
    ++misuses;
  }

  void capture_one() {
    const std::size_t fi = pick(4);  // 0..2: shared families; 3: a graph with a family of its own
    const bool solo = fi == 3;
    const int si = stream_index();
    HostStream& s = streams[si];
    const std::int64_t batch = 1 + static_cast<std::int64_t>(pick(4));
    const std::int64_t nv = static_cast<std::int64_t>(pick(2049));
    const Bindings b = bind(batch, nv);
    const int failure = static_cast<int>(pick(12));  // 0: exception in fn, 1: out of space, else: success
    const unsigned char t = tag();
    std::vector<std::pair<unsigned char*, std::uint64_t>> ws;
    std::vector<Eager> made;
    bool exact = false, uses_batch = false;
    CaptureOptions opts;
    if (!solo) opts.family = *fams[fi].fam;
    const ArenaStats before = arena.stats();
    const std::uint64_t region_before = solo ? 0 : fams[fi].region;
    auto fn = [&](const Bindings& bb) {
      REQUIRE(s.capturing());
      const int k = static_cast<int>(pick(6));
      for (int i = 0; i < k; ++i) {
        switch (pick(5)) {
          case 0: {
            auto w = arena.request(s, "cap", Extent(n) * Extent(B), 1 + pick(8), capacity_bound, bb);
            REQUIRE(w.captured());
            REQUIRE(w.count() == 2048 * batch);
            uses_batch = true;
            ws.emplace_back(w.as<unsigned char>(), w.bytes());
            break;
          }
          case 1: {
            auto w = arena.request(s, "exact", Extent(n) * 4, 1 + pick(8), exact_at_capture, bb);
            REQUIRE(w.count() == 4 * nv);
            exact = true;
            ws.emplace_back(w.as<unsigned char>(), w.bytes());
            break;
          }
          case 2: {
            const std::uint64_t bytes = pick(5000);
            void* p = arena.allocate(s, bytes, 1ull << pick(9));
            ws.emplace_back(static_cast<unsigned char*>(p), bytes);
            if (pick(2)) arena.deallocate(s, p, bytes);  // the graph owns it: a no-op during capture
            break;
          }
          case 3:
            REQUIRE(arena.dimension(s, "dim", Extent(n), capacity_bound, bb) == 2048);
            break;
          default: {  // eager traffic on another stream while this one captures
            const int oi = (si + 1) % static_cast<int>(streams.size());
            if (oi == si) break;
            auto w = arena.request(streams[oi], "side", static_cast<std::int64_t>(1 + pick(30000)), 1, capacity_bound, bb);
            REQUIRE_FALSE(w.captured());
            const unsigned char et = tag();
            write(streams[oi], w.data(), w.bytes(), et);
            made.push_back({std::move(w), oi, et});
          }
        }
      }
      for (auto [p, bytes] : ws) write(s, p, bytes, t);
      if (failure == 0) throw std::runtime_error("boom");
      if (failure == 1) arena.allocate(s, 64 * kMiB);
    };
    std::optional<CapturedGraph> g;
    try {
      g.emplace(capture(arena, s, b, fn, opts));
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      // Out of space may also come from a plan larger than the range the capture could take.
      const bool oom = dynamic_cast<const out_of_memory_error*>(&e) != nullptr;
      INFO(what);
      REQUIRE((failure == 0 ? (what == "boom" || oom) : oom));
    }
    for (Eager& e : made) eager.push_back(std::move(e));
    REQUIRE_FALSE(s.capturing());
    if (!g) {  // released everything it acquired
      ++captures_failed;
      const ArenaStats after = arena.stats();
      REQUIRE(after.region_bytes == before.region_bytes);
      REQUIRE(after.families == before.families);
      REQUIRE(after.live_graphs == before.live_graphs);
      REQUIRE(after.active_captures == 0);
      if (!solo) REQUIRE(fams[fi].fam->region_bytes() == region_before);
      return;
    }
    REQUIRE(failure > 1);
    ++captures_ok;
    const Plan& plan = g->plan();
    REQUIRE(plan.bytes() % kAlignment == 0);
    REQUIRE((plan.guard_count() > 0) == exact);
    // The region base, from the entries' offsets.
    std::optional<std::uintptr_t> base;
    std::size_t wi = 0;
    for (const PlanEntry& e : plan.entries()) {
      if (e.kind == PlanEntry::Kind::dimension) continue;
      REQUIRE(wi < ws.size());
      REQUIRE(e.offset % kAlignment == 0);
      REQUIRE(e.offset + e.bytes <= plan.bytes());
      REQUIRE(e.bytes == ws[wi].second);
      const std::uintptr_t bs = addr_of(ws[wi].first) - e.offset;
      if (base) REQUIRE(*base == bs);
      base = bs;
      ++wi;
    }
    REQUIRE(wi == ws.size());
    std::size_t idx = fi;
    if (solo) {
      fams.emplace_back();
      fams.back().fam = g->family();
      idx = fams.size() - 1;
    }
    Fam& f = fams[idx];
    REQUIRE(detail::impl_of(g->family()) == detail::impl_of(*f.fam));
    if (plan.bytes() > 0) {
      if (f.region > 0) REQUIRE(f.base == *base);  // the region never moves while a graph lives
      f.base = *base;
      f.region = std::max(f.region, plan.bytes());
    }
    ++f.graphs;
    REQUIRE(f.fam->largest_plan_bytes() >= f.region);
    graphs.push_back({std::move(*g), static_cast<int>(idx), std::move(ws), t, batch, nv, exact, uses_batch});
  }

  void replay_one(bool full) {
    if (graphs.empty()) return;
    GraphRec& r = graphs[pick(graphs.size())];
    const std::int64_t nv = static_cast<std::int64_t>(pick(2049));
    const std::int64_t batch = pick(8) == 0 ? 1 + static_cast<std::int64_t>(pick(4)) : r.batch;
    const bool refused = (r.exact && nv > r.n_at_capture) || (r.uses_batch && batch != r.batch);
    HostStream& s = streams[stream_index()];
    if (refused) {
      try {
        r.g.replay(bind(batch, nv), s);
        FAIL("replay should have been refused");
      } catch (const guard_failure& e) {
        REQUIRE_FALSE(e.violations().empty());
        if (r.uses_batch && batch != r.batch) REQUIRE_THAT(std::string(e.what()), Contains("static symbol model.batch"));
      }
      ++replays_refused;
      return;
    }
    r.g.replay(bind(batch, nv), s);
    backend.quiesce();
    for (auto [p, bytes] : r.ws) REQUIRE(filled(p, bytes, r.tag, full));
    ++replays_ok;
  }

  void destroy_graph() {
    if (graphs.empty()) return;
    const std::size_t i = pick(graphs.size());
    Fam& f = fams[graphs[i].fam];
    graphs.erase(graphs.begin() + static_cast<std::ptrdiff_t>(i));
    if (--f.graphs == 0) f.region = f.base = 0;
  }

  void reserve() {
    const std::uint64_t bytes = pick(3 * kMiB);
    arena.reserve(bytes, streams[stream_index()]);
    REQUIRE(arena.stats().largest_free >= bytes);
  }

  void trim() {
    arena.trim(streams[stream_index()]);
    REQUIRE(walk(arena).fully_free_slabs == 0);
  }

  void step(int i) {
    const std::uint64_t op = pick(100);
    const bool crowded = eager.size() + raws.size() > 80;
    if (op < 24) crowded ? release_eager() : request_eager();
    else if (op < 42) release_eager();
    else if (op < 52) crowded ? deallocate_raw() : allocate_raw();
    else if (op < 61) deallocate_raw();
    else if (op < 62) foreign_deallocate();
    else if (op < 69) capture_one();
    else if (op < 83) replay_one(i % 64 == 0);
    else if (op < 88) destroy_graph();
    else if (op < 90) graphs.size() > 12 ? destroy_graph() : capture_one();
    else if (op < 93) reserve();
    else if (op < 95) trim();
    else request_eager();
    check(i % 256 == 0);
  }

  void release_all() {
    eager.clear();
    for (const Raw& r : raws) arena.deallocate(streams[r.stream], r.p, r.bytes);
    raws.clear();
    graphs.clear();
    for (Fam& f : fams) f.graphs = 0, f.region = f.base = 0;
    check(true);
    const ArenaStats st = arena.stats();
    REQUIRE(st.eager_bytes == 0);
    REQUIRE(st.region_bytes == 0);
    REQUIRE(st.free_bytes == st.slab_bytes);
  }
};

}  // namespace

TEST_CASE("arena model: 20k random steps on three streams", "[arena][model]") {
  for (std::uint64_t seed : {1ull, 0xC0FFEEull}) {
    INFO("seed " << seed);
    Harness h(seed, 3);
    for (int i = 0; i < 10000; ++i) {
      INFO("step " << i);
      h.step(i);
    }
    INFO("captures ok " << h.captures_ok << ", failed " << h.captures_failed << ", replays ok " << h.replays_ok
                        << ", refused " << h.replays_refused);
    CHECK(h.captures_ok > 100);
    CHECK(h.captures_failed > 20);
    CHECK(h.replays_ok > 100);
    CHECK(h.replays_refused > 20);
    CHECK(h.misuses > 20);
    h.release_all();
    // Everything released and trimmed: every slab goes back, the backend holds nothing.
    h.arena.trim(h.streams[0]);
    CHECK(h.arena.stats().slabs == 0);
    CHECK(h.arena.stats().slab_bytes == 0);
    CHECK(h.backend.bytes_in_use() == 0);
    // And the arena keeps serving.
    auto w = h.arena.request(h.streams[1], "after", 1000, 1, capacity_bound, Bindings());
    CHECK(w.bytes() == 1000);
    CHECK(h.arena.stats().slabs == 1);
  }
}

TEST_CASE("arena model: one stream coalesces completely without trim", "[arena][model]") {
  Harness h(42, 1);
  for (int i = 0; i < 5000; ++i) {
    INFO("step " << i);
    h.step(i);
  }
  h.release_all();
  const ArenaStats st = h.arena.stats();
  CHECK(st.slabs > 0);
  CHECK(detail::core_of(h.arena).fl.free_blocks() == st.slabs);  // one free block per slab
  h.arena.trim(h.streams[0]);
  CHECK(h.arena.stats().slabs == 0);
  CHECK(h.backend.bytes_in_use() == 0);
}

TEST_CASE("arena: a family of 8 graphs shares one region sized by its largest plan", "[arena][family]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s, s2;
  arena.reserve(16 * kMiB, s);
  Symbol B = Symbol::fixed("fam8.batch");
  Symbol n = Symbol::dynamic("fam8.n", 4096);
  auto fam = arena.family("decode");
  std::vector<std::int64_t> batches = {1, 2, 4, 8, 16, 32, 64, 128};
  std::mt19937_64 rng(7);
  std::shuffle(batches.begin(), batches.end(), rng);
  struct G {
    std::optional<CapturedGraph> g;
    std::int64_t batch;
    unsigned char* kv;
    std::uint64_t kv_bytes;
  };
  std::vector<G> gs;
  std::uint64_t largest = 0, sum = 0;
  for (std::int64_t batch : batches) {
    Bindings b;
    b.set(B, batch).set(n, 17);
    G rec{std::nullopt, batch, nullptr, 0};
    rec.g.emplace(capture(
        arena, s, b,
        [&](const Bindings& bb) {
          auto kv = arena.request(s, "kv", Extent(B) * Extent(n), 2, capacity_bound, bb);
          auto tmp = arena.request(s, "tmp", Extent(B) * 64, 4, capacity_bound, bb);
          rec.kv = kv.as<unsigned char>();
          rec.kv_bytes = kv.bytes();
          unsigned char* p = kv.as<unsigned char>();
          const std::uint64_t bytes = kv.bytes();
          const auto t = static_cast<unsigned char>(batch);
          write(s, p, bytes, t);
        },
        CaptureOptions{.family = fam}));
    const std::uint64_t plan = align256(static_cast<std::uint64_t>(batch) * 4096 * 2) + align256(batch * 256);
    CHECK(rec.g->reserved_bytes() == plan);
    largest = std::max(largest, plan);
    sum += plan;
    CHECK(fam.region_bytes() == largest);  // grows in place when a larger plan arrives
    gs.push_back(std::move(rec));
  }
  CHECK(fam.graphs() == 8);
  CHECK(fam.region_bytes() == largest);
  CHECK(fam.largest_plan_bytes() == largest);
  CHECK(fam.sum_of_plan_bytes() == sum);
  CHECK(fam.region_bytes() < fam.sum_of_plan_bytes());
  const ArenaStats st = arena.stats();
  CHECK(st.region_bytes == largest);
  CHECK(st.families == 1);
  CHECK(st.live_graphs == 8);
  CHECK(st.free_bytes + st.region_bytes == st.slab_bytes);
  for (const G& g : gs) CHECK(g.kv == gs.front().kv);  // one region, one base
  // Replays one at a time, on either stream, each seeing its own sizes at the shared addresses.
  for (int i = 0; i < 40; ++i) {
    G& g = gs[rng() % gs.size()];
    Bindings b;
    b.set(B, g.batch).set(n, static_cast<std::int64_t>(rng() % 4097));
    g.g->replay(b, (i % 2) ? s : s2);
    backend.quiesce();
    CHECK(filled(g.kv, g.kv_bytes, static_cast<unsigned char>(g.batch), true));
  }
  // Destroyed in random order: the region stays until the last graph goes.
  std::shuffle(gs.begin(), gs.end(), rng);
  for (std::size_t i = 0; i < gs.size(); ++i) {
    gs[i].g.reset();
    CHECK(fam.graphs() == gs.size() - i - 1);
    CHECK(fam.region_bytes() == (i + 1 < gs.size() ? largest : 0));
  }
  CHECK(arena.stats().region_bytes == 0);
  CHECK(arena.stats().families == 0);
  CHECK(arena.stats().free_bytes == arena.stats().slab_bytes);
}

TEST_CASE("arena: failed captures release everything they acquired", "[arena][errors]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  arena.reserve(4 * kMiB, s);
  Symbol n = Symbol::dynamic("fail.n", 1024);
  Bindings b;
  b.set(n, 10);
  auto fam = arena.family("f");
  auto body = [&](const Bindings& bb) {
    // Held while the allocation is made: a released workspace would give its range to it.
    auto a = arena.request(s, "a", Extent(n), 8, capacity_bound, bb);
    arena.allocate(s, 1000);
  };

  SECTION("exception inside the capture function, family without a region") {
    const ArenaStats before = arena.stats();
    CHECK_THROWS_WITH(capture(arena, s, b,
                              [&](const Bindings& bb) {
                                body(bb);
                                throw std::runtime_error("kernel launch failed");
                              },
                              CaptureOptions{.family = fam}),
                      "kernel launch failed");
    CHECK(same_stats(before, arena.stats()));
    CHECK(fam.region_bytes() == 0);
    CHECK_FALSE(s.capturing());
  }
  SECTION("exception inside the capture function, family with a region") {
    auto g = capture(arena, s, b, body, CaptureOptions{.family = fam});
    const ArenaStats before = arena.stats();
    const std::uint64_t region = fam.region_bytes();
    CHECK_THROWS_AS(capture(arena, s, b,
                            [&](const Bindings& bb) {
                              body(bb);
                              arena.allocate(s, 100000);  // would grow the region
                              throw std::logic_error("bad");
                            },
                            CaptureOptions{.family = fam}),
                    std::logic_error);
    CHECK(same_stats(before, arena.stats()));
    CHECK(fam.region_bytes() == region);
    CHECK(fam.graphs() == 1);
    g.replay(b, s);  // the surviving graph still works
  }
  SECTION("out of space during capture") {
    const ArenaStats before = arena.stats();
    try {
      capture(arena, s, b, [&](const Bindings& bb) {
        body(bb);
        arena.allocate(s, 64 * kMiB);
      });
      FAIL("expected out_of_memory_error");
    } catch (const out_of_memory_error& e) {
      CHECK_THAT(std::string(e.what()), Contains("<opaque>") && Contains("arena.reserve(") &&
                                            Contains("never grow the arena"));
    }
    CHECK(same_stats(before, arena.stats()));
  }
  SECTION("a region that cannot grow in place: out of space, the old graphs keep their region") {
    auto g = capture(arena, s, b, body, CaptureOptions{.family = fam});
    auto neighbour = arena.allocate(s, 256);  // eager block right after the region
    const auto region_before = fam.region_bytes();
    CHECK_THROWS_AS(capture(
                        arena, s, b, [&](const Bindings& bb) {
                          body(bb);
                          arena.allocate(s, 16384);  // more than the region: released ranges cannot hold it
                        },
                        CaptureOptions{.family = fam}),
                    out_of_memory_error);
    CHECK(fam.region_bytes() == region_before);
    g.replay(b, s);
    arena.deallocate(s, neighbour, 256);
    auto g2 = capture(  // now it can grow
        arena, s, b,
        [&](const Bindings& bb) {
          body(bb);
          arena.allocate(s, 16384);  // more than the region: released ranges cannot hold it
        },
        CaptureOptions{.family = fam});
    CHECK(fam.region_bytes() > region_before);
  }
  SECTION("the last graph of a family dies during a capture that then fails") {
    std::optional<CapturedGraph> g(capture(arena, s, b, body, CaptureOptions{.family = fam}));
    {
      CaptureSession cs(arena, s, b, CaptureOptions{.family = fam});
      g.reset();  // the family's region is in use by the capture: it must survive the graph
      CHECK(arena.stats().live_graphs == 0);
      body(b);
    }  // abandoned
    CHECK(fam.graphs() == 0);
    CHECK(fam.region_bytes() == 0);  // nobody holds it: released
    CHECK(arena.stats().region_bytes == 0);
    CHECK(arena.stats().families == 0);
    CHECK(arena.stats().free_bytes == arena.stats().slab_bytes);
  }
  SECTION("the last graph of a family dies during a capture that succeeds") {
    std::optional<CapturedGraph> g(capture(arena, s, b, body, CaptureOptions{.family = fam}));
    const auto region = fam.region_bytes();
    std::optional<CapturedGraph> g2;
    {
      CaptureSession cs(arena, s, b, CaptureOptions{.family = fam});
      g.reset();
      body(b);
      g2.emplace(cs.finish());
    }
    CHECK(fam.graphs() == 1);
    CHECK(fam.region_bytes() == region);
    g2->replay(b, s);
    g2.reset();
    CHECK(arena.stats().region_bytes == 0);
  }
  // Whatever failed, the arena serves eager requests and captures afterwards.
  auto w = arena.request(s, "after", Extent(n), 8, exact_at_capture, b);
  CHECK(w.bytes() == 80);
  auto g = capture(arena, s, b, body, CaptureOptions{.family = fam});
  CHECK(g.reserved_bytes() == align256(1024 * 8) + align256(1000));
  const ArenaStats st = arena.stats();
  CHECK(st.free_bytes + st.eager_bytes + st.region_bytes == st.slab_bytes);
}

TEST_CASE("arena: double release and foreign pointers are refused and change nothing", "[arena][errors]") {
  HostBackend backend;
  Arena arena(backend);
  HostStream s;
  void* p = arena.allocate(s, 1000);
  void* q = arena.allocate(s, 300, 64);
  auto w = arena.request(s, "ws", 100, 4, capacity_bound, Bindings());
  const ArenaStats before = arena.stats();
  int local = 0;
  CHECK_THROWS_WITH(arena.deallocate(s, &local, 4), Contains("not served by this arena") && Contains("nothing was changed"));
  CHECK_THROWS_AS(arena.deallocate(s, static_cast<char*>(p) + 256, 4), invalid_argument_error);
  CHECK_THROWS_AS(arena.deallocate(s, w.data(), 400), invalid_argument_error);
  CHECK_THROWS_WITH(arena.deallocate(s, p, 5000), Contains("5000") && Contains("holds 1024"));
  CHECK(same_stats(before, arena.stats()));
  arena.deallocate(s, p, 1000);
  const ArenaStats after_one = arena.stats();
  CHECK_THROWS_WITH(arena.deallocate(s, p, 1000), Contains("double release"));
  CHECK(same_stats(after_one, arena.stats()));
  arena.deallocate(s, nullptr, 10);  // like free(nullptr)
  arena.deallocate(s, q, 300);
  CHECK_THROWS_AS(arena.deallocate(s, q, 300), invalid_argument_error);
  CHECK_THROWS_WITH(arena.allocate(s, 10, 3), Contains("alignment 3"));
  CHECK_THROWS_WITH(arena.allocate(s, 10, 512), Contains("alignment 512"));
  CHECK_THROWS_AS(arena.allocate(s, ~0ull), overflow_error);
  CHECK_THROWS_AS(arena.request(s, "neg", 10, 0, capacity_bound, Bindings()), invalid_argument_error);
  CHECK_THROWS_WITH(arena.request(s, "huge", Extent(std::int64_t{1} << 61), 8, capacity_bound, Bindings()),
                    Contains("'huge'") && Contains("overflows"));
  w.reset();
  CHECK(arena.stats().eager_blocks == 0);
  CHECK(arena.stats().free_bytes == arena.stats().slab_bytes);
}

TEST_CASE("arena: calls in the wrong capture state are capture_state_errors", "[arena][errors]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s, t;
  arena.reserve(kMiB, s);
  Bindings b;

  SECTION("reserve and trim on a capturing stream") {
    CaptureSession cs(arena, s, b);
    CHECK_THROWS_WITH(arena.reserve(kMiB, s), Contains("reserve(1048576) on a capturing stream"));
    CHECK_THROWS_WITH(arena.trim(s), Contains("trim() on a capturing stream"));
    arena.reserve(4 * kMiB, t);  // the other stream is not capturing
    auto g = cs.finish();
  }
  SECTION("request on a stream captured outside graphsafe, always_check_capture") {
    Arena checked(backend, ArenaOptions{.always_check_capture = true});
    checked.reserve(kMiB, s);
    backend.begin_capture(s, CaptureMode::global);  // e.g. torch.cuda.graph around library code
    const ArenaStats before = checked.stats();
    CHECK_THROWS_WITH(checked.request(s, "ws", 64, 4, capacity_bound, b),
                      Contains("outside graphsafe") && Contains("CaptureSession"));
    CHECK_THROWS_AS(checked.allocate(s, 64), capture_state_error);
    CHECK_THROWS_AS(checked.dimension(s, "d", 64, capacity_bound, b), capture_state_error);
    CHECK(same_stats(before, checked.stats()));
    backend.abort_capture(s);
    auto w = checked.request(s, "ws", 64, 4, capacity_bound, b);  // capture over: served
    CHECK(w.bytes() == 256);
  }
  SECTION("request on a stream captured outside graphsafe while a graphsafe capture runs") {
    CaptureSession cs(arena, s, b);
    backend.begin_capture(t, CaptureMode::global);
    CHECK_THROWS_AS(arena.request(t, "ws", 64, 4, capacity_bound, b), capture_state_error);
    backend.abort_capture(t);
    auto g = cs.finish();
  }
  SECTION("static symbol changed between capture and replay") {
    Symbol W = Symbol::fixed("cs.window");
    Bindings bw;
    bw.set(W, 128);
    auto g = capture(arena, s, bw, [&](const Bindings& bb) { arena.request(s, "swa", Extent(W) * 4, 2, capacity_bound, bb); });
    g.replay(bw, s);
    bw.set(W, 256);
    try {
      g.replay(bw, s);
      FAIL("expected guard_failure");
    } catch (const guard_failure& e) {
      REQUIRE(e.violations().size() == 1);
      CHECK(e.violations()[0].request == "cs.window");
      CHECK(e.violations()[0].required == 256);
      CHECK(e.violations()[0].reserved == 128);
      CHECK_THAT(std::string(e.what()), Contains("static symbol cs.window = 256") && Contains("captured with 128"));
    }
    CHECK_THROWS_AS(g.replay(Bindings(), s), unbound_symbol_error);  // a static symbol must be bound
  }
  SECTION("replay of a moved-from graph") {
    auto g = capture(arena, s, b, [&](const Bindings& bb) { arena.request(s, "x", 10, 1, capacity_bound, bb); });
    CapturedGraph h(std::move(g));
    CHECK_THROWS_WITH(g.replay(b, s), Contains("moved from or destroyed"));
    CHECK_THROWS_AS(g.plan(), capture_state_error);
    CHECK_THROWS_AS(g.replay_unguarded_for_testing(s), capture_state_error);
    h.replay(b, s);
    auto k = capture(arena, s, b, [](const Bindings&) {});
    k = std::move(h);  // h's graph moves; k's own graph is destroyed
    CHECK_THROWS_AS(h.replay(b, s), capture_state_error);
    k.replay(b, s);
    CHECK(arena.stats().live_graphs == 1);
  }
  CHECK(arena.stats().active_captures == 0);
}

TEST_CASE("arena: out of memory from a capped backend, the arena keeps serving what it holds", "[arena][errors]") {
  HostBackend backend(HostBackendOptions{.limit_bytes = 4 * kMiB});
  Arena arena(backend, ArenaOptions{.growth_bytes = kMiB, .report_findings = false});
  HostStream s;
  std::vector<Workspace> ws;
  const std::uint64_t big = 3 * kMiB / 2;
  ws.push_back(arena.request(s, "a", Extent(static_cast<std::int64_t>(big)), 1, capacity_bound, Bindings()));
  ws.push_back(arena.request(s, "b", Extent(static_cast<std::int64_t>(big)), 1, capacity_bound, Bindings()));
  std::memset(ws[0].data(), 1, big);
  std::memset(ws[1].data(), 2, big);
  CHECK(arena.stats().slabs == 2);
  const ArenaStats before = arena.stats();
  try {
    arena.request(s, "c", Extent(static_cast<std::int64_t>(big)), 1, capacity_bound, Bindings());
    FAIL("expected out_of_memory_error");
  } catch (const out_of_memory_error& e) {
    CHECK_THAT(std::string(e.what()), Contains("4194304-byte limit") && Contains("limit_bytes"));
  }
  CHECK_THROWS_AS(arena.allocate(s, big), out_of_memory_error);
  CHECK_THROWS_AS(arena.reserve(3 * kMiB, s), out_of_memory_error);
  CHECK(same_stats(before, arena.stats()));
  // What it holds still serves: small requests, a capture, and the freed big block.
  auto small = arena.request(s, "small", 1000, 1, capacity_bound, Bindings());
  void* raw = arena.allocate(s, 4096);
  auto g = capture(arena, s, Bindings(), [&](const Bindings& bb) { arena.request(s, "cap", 10000, 1, capacity_bound, bb); });
  g.replay(Bindings(), s);
  CHECK(filled(ws[0].data(), big, 1, true));
  CHECK(filled(ws[1].data(), big, 2, true));
  ws.erase(ws.begin());
  auto c = arena.request(s, "c", Extent(static_cast<std::int64_t>(big)), 1, capacity_bound, Bindings());
  CHECK(arena.stats().slabs == 2);
  arena.deallocate(s, raw, 4096);
  // grow_on_demand off: a clear error instead of a slab.
  Arena fixed(backend, ArenaOptions{.grow_on_demand = false});
  CHECK_THROWS_WITH(fixed.request(s, "x", 10, 1, capacity_bound, Bindings()),
                    Contains("grow_on_demand is off") && Contains("arena.reserve"));
  CHECK_THROWS_WITH(capture(fixed, s, Bindings(), [](const Bindings&) {}), Contains("holds no free memory"));
}

namespace {
// A thread's last release waits in its slot until its next request; put it in the free list's cache
// (as stats() would, without flushing the cache) so the tests can look at the cache.
void settle(Arena& a) {
  std::lock_guard g(detail::core_of(a).lock);
  detail::core_of(a).collect_deferred();
}

// Host backend that counts the cross-stream orderings the arena asks for.
class CountingBackend final : public Backend {
 public:
  std::string_view name() const override { return "host"; }
  void* allocate_slab(std::uint64_t bytes, Stream s) override { return host.allocate_slab(bytes, s); }
  void free_slab(void* p, std::uint64_t bytes, Stream s) override { host.free_slab(p, bytes, s); }
  CaptureInfo capture_info(Stream s) const override { return host.capture_info(s); }
  void begin_capture(Stream s, CaptureMode m) override { host.begin_capture(s, m); }
  GraphHandle end_capture(Stream s) override { return host.end_capture(s); }
  void abort_capture(Stream s) noexcept override { host.abort_capture(s); }
  void launch(const GraphHandle& g, Stream s) override { host.launch(g, s); }
  void destroy(GraphHandle& g) noexcept override { host.destroy(g); }
  void order_after(Stream w, Stream p) override {
    ++orderings;
    host.order_after(w, p);
  }
  void synchronize(Stream s) override { host.synchronize(s); }
  HostBackend host;
  int orderings = 0;
};
}  // namespace

TEST_CASE("arena: a released block is re-served by size and stream, without ordering or tree work",
          "[arena][cache]") {
  CountingBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s1, s2;
  arena.reserve(8 * kMiB, s1);
  const Bindings none;
  void* first;
  {
    auto a = arena.request(s1, "a", 3000, 1, capacity_bound, none);
    auto b = arena.request(s1, "b", 5000, 1, capacity_bound, none);
    first = a.data();
  }  // both released on s1: cached, not coalesced yet
  settle(arena);
  CHECK(detail::core_of(arena).fl.cached_blocks() == 2);
  CHECK(detail::core_of(arena).fl.validate().empty());
  {
    auto a = arena.request(s1, "a", 3000, 1, capacity_bound, none);
    CHECK(a.data() == first);  // same size, same stream: the cached block
    CHECK(detail::core_of(arena).fl.cached_blocks() == 1);
    CHECK(backend.orderings == 0);
  }
  CHECK(detail::core_of(arena).fl.validate().empty());
  // stats() reports the coalesced state: one free block, everything free.
  const ArenaStats st = arena.stats();
  CHECK(st.free_bytes == st.slab_bytes);
  CHECK(st.eager_bytes == 0);
  CHECK(detail::core_of(arena).fl.cached_blocks() == 0);
  CHECK(detail::core_of(arena).fl.free_blocks() == 1);
  CHECK(walk(arena).fully_free_slabs == 1);
  // A block cached on s1 is not served to s2 from the cache (it would need ordering): s2 gets best fit.
  { auto a = arena.request(s1, "a", 3000, 1, capacity_bound, none); }
  settle(arena);
  CHECK(detail::core_of(arena).fl.cached_blocks() == 1);
  {
    auto c = arena.request(s2, "c", 3000, 1, capacity_bound, none);
    CHECK(detail::core_of(arena).fl.cached_blocks() == 1);
    CHECK(c.data() != first);
  }
  CHECK(detail::core_of(arena).fl.validate().empty());
  CHECK(arena.stats().free_bytes == arena.stats().slab_bytes);
}

TEST_CASE("arena: cached blocks never make the arena grow or a capture fail", "[arena][cache]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 2 * kMiB, .grow_on_demand = false, .report_findings = false});
  HostStream s;
  arena.reserve(2 * kMiB, s);
  const Bindings none;
  {
    auto a = arena.request(s, "a", Extent(static_cast<std::int64_t>(kMiB / 2)), 1, capacity_bound, none);
    auto b = arena.request(s, "b", Extent(static_cast<std::int64_t>(kMiB / 2 - 512)), 1, capacity_bound, none);
  }
  settle(arena);
  CHECK(detail::core_of(arena).fl.cached_blocks() == 2);
  // No free block fits 2 MiB until the cached halves coalesce: the miss flushes the cache.
  {
    auto whole = arena.request(s, "whole", Extent(static_cast<std::int64_t>(2 * kMiB)), 1, capacity_bound, none);
    CHECK(whole.bytes() == 2 * kMiB);
  }
  CHECK(backend.slab_allocations() == 1);
  // A capture takes the largest (coalesced) block even when the last releases were cached.
  { auto a = arena.request(s, "a", 4096, 1, capacity_bound, none); }
  settle(arena);
  CHECK(detail::core_of(arena).fl.cached_blocks() == 1);
  auto g = capture(arena, s, none, [&](const Bindings& bb) {
    auto w = arena.request(s, "w", Extent(static_cast<std::int64_t>(2 * kMiB - 256)), 1, capacity_bound, bb);
    CHECK(w.captured());
  });
  CHECK(backend.slab_allocations() == 1);
}

TEST_CASE("arena: raw blocks stay indexed while cached and a double release is still refused", "[arena][cache]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  arena.reserve(4 * kMiB, s);
  void* p = arena.allocate(s, 1000);
  arena.deallocate(s, p, 1000);
  CHECK(detail::core_of(arena).fl.cached_blocks() == 1);
  CHECK(detail::core_of(arena).fl.validate().empty());
  CHECK_THROWS_WITH(arena.deallocate(s, p, 1000), Contains("double release"));
  void* q = arena.allocate(s, 1000);
  CHECK(q == p);  // re-served from the cache (still indexed)
  arena.deallocate(s, q, 1000);
  // A workspace request of the same size takes the indexed block: it leaves the used tree, so the
  // raw pointer is no longer accepted.
  {
    auto w = arena.request(s, "w", 1024, 1, capacity_bound, Bindings());
    CHECK(w.data() == p);
    CHECK(detail::core_of(arena).fl.validate().empty());
    CHECK_THROWS_WITH(arena.deallocate(s, p, 1000), Contains("double release"));
  }
  CHECK(detail::core_of(arena).fl.validate().empty());
  const ArenaStats st = arena.stats();
  CHECK(st.free_bytes == st.slab_bytes);
  CHECK(detail::core_of(arena).fl.validate().empty());
}

TEST_CASE("arena: a release parked in another thread's slot is never lost", "[arena][cache][concurrency]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.grow_on_demand = false, .report_findings = false});
  HostStream s;
  arena.reserve(2 * kMiB, s);
  const Bindings none;
  const Extent whole(static_cast<std::int64_t>(2 * kMiB));
  std::mutex m;
  std::condition_variable cv;
  bool parked = false, done = false;
  std::thread t([&] {
    { auto w = arena.request(s, "t", whole, 1, capacity_bound, none); }  // parked in t's slot
    std::unique_lock l(m);
    parked = true;
    cv.notify_all();
    cv.wait(l, [&] { return done; });
  });
  {
    std::unique_lock l(m);
    cv.wait(l, [&] { return parked; });
  }
  // The whole slab waits in t's slot while t lives: another thread's request still gets it.
  {
    auto w = arena.request(s, "main", whole, 1, capacity_bound, none);
    CHECK(w.bytes() == 2 * kMiB);
  }
  {
    std::lock_guard l(m);
    done = true;
  }
  cv.notify_all();
  t.join();
  // A thread that exits hands its parked release back.
  std::thread u([&] { auto w = arena.request(s, "u", whole, 1, capacity_bound, none); });
  u.join();
  {
    std::lock_guard g(detail::core_of(arena).lock);
    CHECK(detail::core_of(arena).eager_blocks == 0);
    CHECK(detail::core_of(arena).deferred_slots.size() == 1);  // main's; t's and u's were dropped when they exited
  }
  const ArenaStats st = arena.stats();
  CHECK(st.free_bytes == st.slab_bytes);
  CHECK(detail::core_of(arena).fl.validate().empty());
}

TEST_CASE("arena: the cache follows a moving working set of sizes", "[arena][cache]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  arena.reserve(64 * kMiB, s);
  const Bindings none;
  for (int round = 0; round < 3; ++round)
    for (std::int64_t k = 1; k <= 300; ++k) {  // 300 distinct sizes per round, each requested twice
      void* first;
      {
        auto w = arena.request(s, "w", Extent(k * 256 + 1000 * round), 1, capacity_bound, none);
        first = w.data();
      }
      auto again = arena.request(s, "w", Extent(k * 256 + 1000 * round), 1, capacity_bound, none);
      CHECK(again.data() == first);
    }
  settle(arena);
  CHECK(detail::core_of(arena).fl.cached_blocks() <= 128);
  CHECK(detail::core_of(arena).fl.validate().empty());
  const ArenaStats st = arena.stats();
  CHECK(st.free_bytes == st.slab_bytes);
  CHECK(detail::core_of(arena).fl.free_blocks() == 1);
  CHECK(backend.slab_allocations() == 1);
}
