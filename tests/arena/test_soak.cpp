// Soak and out-of-memory on the host backend.
//
//   * 10^6 random operations (eager requests and releases on 4 streams, raw allocate/deallocate,
//     captures of 3 families, replays, graph destruction, reserve, trim); at the end everything is
//     released and trimmed and the backend holds 0 bytes. GRAPHSAFE_SOAK_OPS overrides the count
//     (at least 10^5: a smaller one fails the test). Prints ops/s.
//   * With the upstream capped (HostBackendOptions::limit_bytes): reservation fails with an
//     out_of_memory_error naming the size and the limit, nothing leaks, the arena keeps serving what
//     it holds, and once memory is released it grows again.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {
constexpr std::uint64_t kMiB = 1ull << 20;

// Fewer operations than this would let the soak pass without a single capture, replay or refusal: the
// checks on the operation mix below would have nothing to count.
constexpr std::uint64_t kMinSoakOps = 100'000;

// GRAPHSAFE_SOAK_OPS, refused (the test fails, naming the value and the minimum) when it is not a
// number or below kMinSoakOps, so a shortened soak cannot pass vacuously.
std::uint64_t soak_ops() {
  const char* e = std::getenv("GRAPHSAFE_SOAK_OPS");
  if (!e) return 1'000'000;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(e, &end, 10);
  if (end == e || *end != '\0' || errno == ERANGE || e[0] == '-')
    FAIL("GRAPHSAFE_SOAK_OPS='" << e << "' is not an operation count (a decimal number >= " << kMinSoakOps << ")");
  if (v < kMinSoakOps)
    FAIL("GRAPHSAFE_SOAK_OPS=" << v << " is below the soak's minimum of " << kMinSoakOps
                               << " operations: fewer would pass without exercising captures, replays and refusals");
  return v;
}

void mark(void* p, std::uint64_t bytes, unsigned char t) {
  if (!bytes) return;
  auto* c = static_cast<unsigned char*>(p);
  c[0] = t;
  c[bytes / 2] = t;
  c[bytes - 1] = t;
}
// mark() as stream work on `s`, declaring the workspace as written (the seeded mode checks it).
void mark_on(HostStream& s, void* p, std::uint64_t bytes, unsigned char t) {
  s.launch([p, bytes, t] { mark(p, bytes, t); }, {HostAccess::writes(p, bytes)});
}
bool marked(const void* p, std::uint64_t bytes, unsigned char t) {
  if (!bytes) return true;
  const auto* c = static_cast<const unsigned char*>(p);
  return c[0] == t && c[bytes / 2] == t && c[bytes - 1] == t;
}
}  // namespace

TEST_CASE("soak: 10^6 random host-backend operations, nothing left at the end", "[soak]") {
  const std::uint64_t ops = soak_ops();
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 4 * kMiB, .report_findings = false});
  std::deque<HostStream> streams(4);
  Symbol B = Symbol::fixed("soak.B");
  Symbol n = Symbol::dynamic("soak.n", 4096);
  std::vector<CaptureFamily> fams = {arena.family("a"), arena.family("b"), arena.family("c")};
  struct Eager { Workspace ws; unsigned char t; };
  struct Raw { void* p; std::uint64_t bytes; int s; unsigned char t; };
  struct G { CapturedGraph g; unsigned char* p; std::uint64_t bytes; unsigned char t; std::int64_t batch; };
  std::vector<Eager> eager;
  std::vector<Raw> raws;
  std::deque<G> graphs;
  std::mt19937_64 rng(20240607);
  std::uint64_t bad = 0, captures = 0, replays = 0, refused = 0, oom = 0;
  unsigned char tag = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < ops; ++i) {
    const int si = static_cast<int>(rng() % streams.size());
    HostStream& s = streams[static_cast<std::size_t>(si)];
    tag = static_cast<unsigned char>(tag % 250 + 1);
    const std::uint64_t op = rng() % 100;
    if (op < 35) {
      if (eager.size() > 64) { eager.erase(eager.begin() + static_cast<std::ptrdiff_t>(rng() % eager.size())); continue; }
      const std::int64_t count = static_cast<std::int64_t>(rng() % (rng() % 16 == 0 ? 1 << 20 : 4096));
      Bindings b;
      b.set(B, 1).set(n, count % 4097);
      Workspace w = (rng() & 1) ? arena.request(s, "e", Extent(count), 1 + rng() % 8, capacity_bound, b)
                                : arena.request(s, "x", Extent(n), 4, exact_at_capture, b);
      mark_on(s, w.data(), w.bytes(), tag);
      eager.push_back({std::move(w), tag});
    } else if (op < 65) {
      if (!eager.empty()) {
        const std::size_t k = rng() % eager.size();
        backend.quiesce();  // what the streams were given has run (seeded mode)
        bad += !marked(eager[k].ws.data(), eager[k].ws.bytes(), eager[k].t);
        eager[k] = std::move(eager.back());
        eager.pop_back();
      }
    } else if (op < 75) {
      if (raws.size() > 32) continue;
      const std::uint64_t bytes = rng() % 50000;
      void* p = arena.allocate(s, bytes, 1ull << (rng() % 9));
      mark_on(s, p, bytes, tag);
      raws.push_back({p, bytes, si, tag});
    } else if (op < 85) {
      if (!raws.empty()) {
        const std::size_t k = rng() % raws.size();
        backend.quiesce();
        bad += !marked(raws[k].p, raws[k].bytes, raws[k].t);
        backend.order_after(s, streams[static_cast<std::size_t>(raws[k].s)]);  // used there: an event
        arena.deallocate(s, raws[k].p, raws[k].bytes);
        raws[k] = raws.back();
        raws.pop_back();
      }
    } else if (op < 88) {
      const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 3);
      Bindings b;
      b.set(B, batch).set(n, static_cast<std::int64_t>(rng() % 4097));
      unsigned char* p = nullptr;
      std::uint64_t bytes = 0;
      const unsigned char t = tag;
      try {
        CaptureOptions o;
        if (rng() % 4) o.family = fams[rng() % fams.size()];
        auto g = capture(arena, s, b, [&](const Bindings& bb) {
          auto w = arena.request(s, "kv", Extent(n) * Extent(B), 2, capacity_bound, bb);
          arena.allocate(s, rng() % 3000);
          p = w.as<unsigned char>();
          bytes = w.bytes();
          mark_on(s, p, bytes, t);
        }, o);
        graphs.push_back({std::move(g), p, bytes, t, batch});
        ++captures;
      } catch (const out_of_memory_error&) {
        ++oom;  // no room in one range: reserve, as the error says
        arena.reserve(4 * kMiB, s);
      }
      if (graphs.size() > 12) graphs.pop_front();
    } else if (op < 96) {
      if (!graphs.empty()) {
        G& g = graphs[rng() % graphs.size()];
        Bindings b;
        b.set(B, g.batch).set(n, static_cast<std::int64_t>(rng() % 4097));
        g.g.replay(b, s);
        backend.quiesce();
        bad += !marked(g.p, g.bytes, g.t);
        ++replays;
      }
    } else if (op < 97) {
      if (!graphs.empty()) graphs.erase(graphs.begin() + static_cast<std::ptrdiff_t>(rng() % graphs.size()));
    } else if (op < 98) {
      arena.reserve(rng() % (8 * kMiB), s);
    } else if (op < 99) {
      arena.trim(s);
    } else {
      if (!graphs.empty()) {  // a refused replay: static symbol changed
        G& g = graphs.front();
        Bindings b;
        b.set(B, g.batch + 1).set(n, 1);
        try {
          g.g.replay(b, s);
        } catch (const guard_failure&) {
          ++refused;
        }
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ArenaStats peak = arena.stats();
  CHECK(bad == 0);
  CHECK(peak.free_bytes + peak.eager_bytes + peak.region_bytes == peak.slab_bytes);
  CHECK(peak.slab_bytes == backend.bytes_in_use());
  eager.clear();
  for (const Raw& r : raws) arena.deallocate(streams[static_cast<std::size_t>(r.s)], r.p, r.bytes);
  raws.clear();
  graphs.clear();
  const ArenaStats st = arena.stats();
  CHECK(st.eager_bytes == 0);
  CHECK(st.eager_blocks == 0);
  CHECK(st.region_bytes == 0);
  CHECK(st.live_graphs == 0);
  CHECK(st.free_bytes == st.slab_bytes);
  arena.trim(streams[0]);
  CHECK(arena.stats().slabs == 0);
  CHECK(backend.bytes_in_use() == 0);
  std::printf("soak: %llu ops in %.2f s (%.0f ops/s): %llu captures (%llu out-of-space + reserve), %llu replays, "
              "%llu refused; peak slabs %llu (%llu bytes), %llu slab allocations; after release + trim "
              "bytes_in_use = %llu\n",
              static_cast<unsigned long long>(ops), secs, static_cast<double>(ops) / secs,
              static_cast<unsigned long long>(captures), static_cast<unsigned long long>(oom),
              static_cast<unsigned long long>(replays), static_cast<unsigned long long>(refused),
              static_cast<unsigned long long>(peak.slabs), static_cast<unsigned long long>(peak.slab_bytes),
              static_cast<unsigned long long>(backend.slab_allocations()),
              static_cast<unsigned long long>(backend.bytes_in_use()));
  CHECK(captures > ops / 100);
  CHECK(replays > ops / 50);
  CHECK(refused > 0);
}

TEST_CASE("out of memory: capped upstream, clear errors, nothing leaks, the arena keeps serving", "[soak][oom]") {
  const std::uint64_t cap = 16 * kMiB;
  HostBackend backend(HostBackendOptions{.limit_bytes = cap});
  Arena arena(backend, ArenaOptions{.growth_bytes = 4 * kMiB, .report_findings = false});
  HostStream s, t;
  Symbol n = Symbol::dynamic("oom.n", 1 << 20);
  Bindings b;
  b.set(n, 1000);
  // Fill the cap with 4 MiB slabs of 3 MiB workspaces.
  std::vector<Workspace> held;
  for (;;) {
    try {
      held.push_back(arena.request(s, "fill", Extent(std::int64_t{3} << 20), 1, capacity_bound, b));
      std::memset(held.back().data(), static_cast<int>(held.size()), held.back().bytes());
    } catch (const out_of_memory_error& e) {
      CHECK_THAT(std::string(e.what()), Contains("4194304 bytes") && Contains("16777216-byte limit") &&
                                            Contains("limit_bytes"));
      break;
    }
  }
  CHECK(held.size() == 4);
  const ArenaStats full = arena.stats();
  const std::uint64_t allocations = backend.slab_allocations();
  CHECK(full.slab_bytes == cap);
  CHECK(backend.bytes_in_use() == cap);
  // Every way of asking for more fails the same way and changes nothing.
  for (int i = 0; i < 100; ++i) {
    CHECK_THROWS_AS(arena.request(s, "more", Extent(std::int64_t{2} << 20), 1, capacity_bound, b), out_of_memory_error);
    CHECK_THROWS_AS(arena.allocate(t, 2 * kMiB), out_of_memory_error);
    CHECK_THROWS_WITH(arena.reserve(2 * kMiB, s), Contains("2097152") && Contains("16777216-byte limit"));
  }
  CHECK(backend.slab_allocations() == allocations);
  CHECK(backend.bytes_in_use() == cap);
  const ArenaStats after = arena.stats();
  CHECK(after.slab_bytes == full.slab_bytes);
  CHECK(after.free_bytes == full.free_bytes);
  CHECK(after.eager_bytes == full.eager_bytes);
  // What it holds still serves: the 1 MiB tails of the slabs, eagerly and under capture.
  std::vector<Workspace> small;
  for (int i = 0; i < 4; ++i) small.push_back(arena.request(t, "tail", Extent(std::int64_t{1} << 19), 1, capacity_bound, b));
  small.clear();
  auto g = capture(arena, s, b, [&](const Bindings& bb) {
    arena.request(s, "cap", Extent(std::int64_t{1} << 18), 1, capacity_bound, bb);
  });
  g.replay(b, s);
  // A capture that needs more than one free range fails clearly and releases what it took.
  const ArenaStats before_cap = arena.stats();
  CHECK_THROWS_WITH(capture(arena, t, b, [&](const Bindings& bb) { arena.request(t, "big", Extent(std::int64_t{2} << 20), 1, capacity_bound, bb); }),
                    Contains("'big'") && Contains("never grow the arena"));
  CHECK(arena.stats().free_bytes == before_cap.free_bytes);
  CHECK(arena.stats().region_bytes == before_cap.region_bytes);
  // Contents of the held workspaces are intact.
  for (std::size_t i = 0; i < held.size(); ++i) {
    const auto* c = held[i].as<unsigned char>();
    CHECK((c[0] == i + 1 && c[held[i].bytes() - 1] == i + 1));
  }
  // Release, trim: the backend gets everything back and the arena grows again.
  held.clear();
  CHECK_NOTHROW(g.replay(b, s));  // the graph keeps its region through trim
  arena.trim(s);
  CHECK(backend.bytes_in_use() == arena.stats().slab_bytes);
  CHECK(arena.stats().slab_bytes < cap);
  auto again = arena.request(s, "again", Extent(std::int64_t{8} << 20), 1, capacity_bound, b);
  CHECK(again.bytes() == 8 * kMiB);
  again.reset();
  {
    CapturedGraph gone(std::move(g));
  }
  arena.trim(s);
  CHECK(arena.stats().slabs == 0);
  CHECK(backend.bytes_in_use() == 0);
}
