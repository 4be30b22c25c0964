// Concurrency on the host backend; CI also runs this file under ThreadSanitizer
// (CTest label `concurrency`, scripts/sanitize.sh).
//
//   * threads allocating eagerly on their own streams while another thread captures, replays and
//     destroys graphs (global and thread-local capture modes)
//   * two captures on two streams at once (both sessions open at the same time, by a barrier)
//   * many threads hammering one arena: request / release / allocate / deallocate / reserve / trim
//
// Every thread writes a pattern of its own into each of its workspaces and verifies it before
// releasing: two live ranges that overlap break somebody's pattern. Catch assertions are not
// thread-safe, so worker threads count failures in atomics and the main thread checks them.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace graphsafe;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

struct Failures {
  std::atomic<std::uint64_t> pattern{0};   // a workspace lost its pattern: overlap
  std::atomic<std::uint64_t> unexpected{0};  // an exception no test expected
  std::atomic<std::uint64_t> replay{0};    // a replay's output was wrong
  std::string first;                       // first unexpected message (written once)
  std::atomic<bool> has_first{false};
  void note(const std::string& what) {
    ++unexpected;
    bool f = false;
    if (has_first.compare_exchange_strong(f, true)) first = what;
  }
};

// A pattern that depends on the owner and the iteration, checked at a few positions and in full
// every few rounds.
void fill(void* p, std::uint64_t bytes, std::uint32_t tag) {
  auto* w = static_cast<std::uint32_t*>(p);
  for (std::uint64_t i = 0; i < bytes / 4; ++i) w[i] = tag ^ static_cast<std::uint32_t>(i);
}
// fill() as stream work on `s`, declaring its bytes (the host backend's seeded mode checks them).
void fill_on(HostStream& s, void* p, std::uint64_t bytes, std::uint32_t tag) {
  s.launch([p, bytes, tag] { fill(p, bytes, tag); }, {HostAccess::writes(p, bytes)});
}
bool intact(const void* p, std::uint64_t bytes, std::uint32_t tag) {
  const auto* w = static_cast<const std::uint32_t*>(p);
  for (std::uint64_t i = 0; i < bytes / 4; ++i)
    if (w[i] != (tag ^ static_cast<std::uint32_t>(i))) return false;
  return true;
}

struct Held {
  Workspace ws;
  std::uint32_t tag;
};
struct HeldRaw {
  void* p;
  std::uint64_t bytes;
  std::uint32_t tag;
};

// One eager worker: its own stream, a rolling set of live workspaces and raw allocations.
void eager_worker(Arena& arena, HostStream& s, int id, int iterations, std::atomic<bool>* stop, Failures& f,
                  std::atomic<std::uint64_t>& ops) {
  std::mt19937_64 rng(0x9E37u + static_cast<unsigned>(id));
  std::deque<Held> live;
  std::deque<HeldRaw> raws;
  Symbol n = Symbol::dynamic("conc.eager.n" + std::to_string(id), 1 << 16);
  for (int it = 0; (iterations < 0 || it < iterations) && !(stop && stop->load()); ++it) {
    try {
      const std::uint32_t tag = (static_cast<std::uint32_t>(id) << 24) | static_cast<std::uint32_t>(it);
      switch (rng() % 4) {
        case 0:
        case 1: {
          const std::int64_t count = 1 + static_cast<std::int64_t>(rng() % 4096);
          Bindings b;
          b.set(n, count);
          Workspace w = (rng() & 1) ? arena.request(s, "eager", Extent(n), 4, exact_at_capture, b)
                                    : arena.request(s, "eager", Extent(count), 4, capacity_bound, b);
          if (w.captured() || w.bytes() != static_cast<std::uint64_t>(count) * 4) f.note("eager request came back wrong");
          fill_on(s, w.data(), w.bytes(), tag);
          live.push_back({std::move(w), tag});
          break;
        }
        case 2: {
          const std::uint64_t bytes = 4 * (1 + rng() % 8192);
          void* p = arena.allocate(s, bytes, 1ull << (rng() % 9));
          fill_on(s, p, bytes, tag);
          raws.push_back({p, bytes, tag});
          break;
        }
        default:
          break;
      }
      arena.backend().synchronize(s);  // the fills ran: the checks below read them
      if (live.size() > 12 || (!live.empty() && rng() % 3 == 0)) {
        const Held& h = live.front();
        if (!intact(h.ws.data(), h.ws.bytes(), h.tag)) ++f.pattern;
        live.pop_front();  // released, stream-ordered on s
      }
      if (raws.size() > 8 || (!raws.empty() && rng() % 3 == 0)) {
        const HeldRaw r = raws.front();
        if (!intact(r.p, r.bytes, r.tag)) ++f.pattern;
        arena.deallocate(s, r.p, r.bytes);
        raws.pop_front();
      }
      ops.fetch_add(1, std::memory_order_relaxed);
    } catch (const std::exception& e) {
      f.note(std::string("eager worker ") + std::to_string(id) + ": " + e.what());
    }
  }
  arena.backend().synchronize(s);
  for (const Held& h : live)
    if (!intact(h.ws.data(), h.ws.bytes(), h.tag)) ++f.pattern;
  for (const HeldRaw& r : raws) {
    if (!intact(r.p, r.bytes, r.tag)) ++f.pattern;
    arena.deallocate(s, r.p, r.bytes);
  }
}

struct CaptureCounts {
  std::uint64_t ok = 0, out_of_space = 0, replays = 0;
};

// One capturing worker: captures graphs of its families on its stream, replays them with growing
// bindings and checks their output, destroys them. Out of space during capture (eager traffic took
// the free blocks) is a documented, typed outcome: it reserves and tries again.
CaptureCounts capture_worker(Arena& arena, HostStream& s, int id, int rounds, CaptureMode mode, Failures& f,
                             std::barrier<>* both_open = nullptr) {
  CaptureCounts c;
  Symbol n = Symbol::dynamic("conc.cap.n" + std::to_string(id), 2048);
  Symbol B = Symbol::fixed("conc.cap.B" + std::to_string(id));
  std::vector<CaptureFamily> fams = {arena.family("cap" + std::to_string(id) + ".a"),
                                     arena.family("cap" + std::to_string(id) + ".b")};
  std::mt19937_64 rng(0xC0DEu + static_cast<unsigned>(id));
  struct G {
    CapturedGraph g;
    std::uint32_t* ws;
    std::int64_t count;
    std::uint32_t* out;
  };
  std::deque<G> graphs;
  std::vector<std::uint32_t> out_storage(4096 * 4);  // where replays write a checksum per graph
  // With a rendezvous, every attempt arrives exactly twice (session open, session done) whatever
  // happens in it, and a thread leaving drops out, so the other never waits for it.
  int arrived = 0;
  auto arrive = [&] {
    if (both_open && arrived < 2) {
      ++arrived;
      both_open->arrive_and_wait();
    }
  };
  auto pad = [&] {
    while (both_open && arrived < 2) arrive();
    arrived = 0;
  };
  for (int r = 0; r < rounds; ++r) {
    const std::int64_t batch = 1 + r % 2;
    Bindings b;
    b.set(B, batch).set(n, 1 + static_cast<std::int64_t>(rng() % 2048));
    std::uint32_t* out = out_storage.data() + (r % 4) * 4096;
    CaptureOptions opts;
    opts.family = fams[static_cast<std::size_t>(r) % fams.size()];
    opts.mode = mode;
    const std::uint32_t tag = (0xF0u + static_cast<std::uint32_t>(id)) << 24 | static_cast<std::uint32_t>(r);
    for (int attempt = 0; attempt < 4; ++attempt) {
      try {
        std::uint32_t* wsp = nullptr;
        std::int64_t count = 0;
        CaptureSession cs(arena, s, b, opts);
        arrive();  // the other thread's session is open too
        Workspace w = arena.request(s, "cap.ws", Extent(n) * Extent(B), 4, capacity_bound, b);
        void* tmp = arena.allocate(s, 1000);
        (void)tmp;
        if (!w.captured() || w.count() != 2048 * batch) f.note("captured request came back wrong");
        wsp = w.as<std::uint32_t>();
        count = w.count();
        // The "kernel": fills the whole workspace (its frozen count) with the pattern, then sums it
        // into out[0..1].
        s.launch(
            [wsp, count, tag, out] {
              fill(wsp, static_cast<std::uint64_t>(count) * 4, tag);
              out[0] = tag;
              out[1] = intact(wsp, static_cast<std::uint64_t>(count) * 4, tag) ? 1u : 0u;
            },
            {HostAccess::writes(wsp, static_cast<std::uint64_t>(count) * 4)});
        graphs.push_back({cs.finish(), wsp, count, out});
        pad();
        ++c.ok;
        break;
      } catch (const out_of_memory_error&) {
        ++c.out_of_space;
        pad();
        try {
          arena.reserve((2048 * 2 * 4 + 2000) * 2, s);
        } catch (const std::exception& e) {
          f.note(e.what());
        }
      } catch (const std::exception& e) {
        f.note(std::string("capture worker ") + std::to_string(id) + ": " + e.what());
        pad();
        break;
      }
    }
    // Replay the live graphs with new bindings (within capacity: always safe) and check them.
    for (G& g : graphs) {
      try {
        Bindings rb;
        const std::int64_t gb = g.count / 2048;
        rb.set(B, gb).set(n, 1 + static_cast<std::int64_t>(rng() % 2048));
        std::fill(g.out, g.out + 2, 0u);
        g.g.replay(rb, s);
        arena.backend().synchronize(s);
        ++c.replays;
        if (g.out[1] != 1u || (g.out[0] >> 24) != ((0xF0u + static_cast<std::uint32_t>(id)) & 0xFF)) ++f.replay;
        // After the replay the workspace must still hold the pattern: nobody wrote over it.
        if (!intact(g.ws, static_cast<std::uint64_t>(g.count) * 4, g.out[0])) ++f.pattern;
      } catch (const std::exception& e) {
        f.note(std::string("replay: ") + e.what());
      }
    }
    if (graphs.size() > 3) graphs.pop_front();  // destroyed (its family's region survives other graphs)
  }
  if (both_open) both_open->arrive_and_drop();
  return c;
}

void check_consistent(const Arena& arena, const HostBackend& backend) {
  const ArenaStats st = arena.stats();
  CHECK(st.free_bytes + st.eager_bytes + st.region_bytes == st.slab_bytes);
  CHECK(st.slab_bytes == backend.bytes_in_use());
  CHECK(st.active_captures == 0);
}

}  // namespace

TEST_CASE("concurrency: eager threads on their own streams while another thread captures", "[concurrency]") {
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_mode}) {
    INFO("mode " << static_cast<int>(mode));
    HostBackend backend;
    Arena arena(backend, ArenaOptions{.growth_bytes = 2 * kMiB, .report_findings = false});
    std::deque<HostStream> streams(4);
    Failures f;
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> ops{0};
    std::vector<std::thread> eager;
    for (int t = 0; t < 3; ++t)
      eager.emplace_back(eager_worker, std::ref(arena), std::ref(streams[static_cast<std::size_t>(t)]), t, -1, &stop,
                         std::ref(f), std::ref(ops));
    CaptureCounts c;
    std::thread capturer([&] { c = capture_worker(arena, streams[3], 10, 150, mode, f); });
    capturer.join();
    stop = true;
    for (auto& t : eager) t.join();
    INFO(f.first);
    CHECK(f.unexpected == 0);
    CHECK(f.pattern == 0);
    CHECK(f.replay == 0);
    CHECK(c.ok >= 140);
    CHECK(c.replays > 300);
    CHECK(ops > 0);
    check_consistent(arena, backend);
    CHECK(arena.stats().eager_blocks == 0);  // every worker released everything
    WARN("mode " << static_cast<int>(mode) << ": " << c.ok << " captures (" << c.out_of_space
                 << " out-of-space retries), " << c.replays << " replays, " << ops.load() << " eager ops");
  }
}

TEST_CASE("concurrency: two captures on two streams at once", "[concurrency]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 2 * kMiB, .report_findings = false});
  std::deque<HostStream> streams(3);
  arena.reserve(8 * kMiB, streams[2]);
  Failures f;
  std::barrier<> both_open(2);
  CaptureCounts c0, c1;
  std::thread a([&] { c0 = capture_worker(arena, streams[0], 20, 100, CaptureMode::global, f, &both_open); });
  std::thread b([&] { c1 = capture_worker(arena, streams[1], 21, 100, CaptureMode::thread_local_mode, f, &both_open); });
  // And an eager thread for good measure.
  std::atomic<std::uint64_t> ops{0};
  std::thread e(eager_worker, std::ref(arena), std::ref(streams[2]), 22, 2000, nullptr, std::ref(f), std::ref(ops));
  a.join();
  b.join();
  e.join();
  INFO(f.first);
  CHECK(f.unexpected == 0);
  CHECK(f.pattern == 0);
  CHECK(f.replay == 0);
  CHECK(c0.ok + c1.ok >= 190);
  check_consistent(arena, backend);
  CHECK(arena.stats().live_graphs == 0);
  CHECK(arena.stats().region_bytes == 0);
}

TEST_CASE("concurrency: many threads hammering one arena, with reserve and trim", "[concurrency]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = kMiB, .report_findings = false});
  const int threads = 8;
  std::deque<HostStream> streams(threads);
  Failures f;
  std::atomic<std::uint64_t> ops{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back(eager_worker, std::ref(arena), std::ref(streams[static_cast<std::size_t>(t)]), 100 + t, 3000,
                    nullptr, std::ref(f), std::ref(ops));
  std::thread maint([&] {  // reserve and trim while the others work
    HostStream s;
    std::mt19937_64 rng(5);
    while (!stop) {
      try {
        if (rng() % 2)
          arena.reserve(rng() % (4 * kMiB), s);
        else
          arena.trim(s);
        const ArenaStats st = arena.stats();  // a consistent snapshot under the lock
        if (st.free_bytes + st.eager_bytes + st.region_bytes != st.slab_bytes) f.note("stats do not add up");
      } catch (const std::exception& e) {
        f.note(e.what());
      }
      std::this_thread::yield();
    }
  });
  for (auto& t : ts) t.join();
  stop = true;
  maint.join();
  INFO(f.first);
  CHECK(f.unexpected == 0);
  CHECK(f.pattern == 0);
  CHECK(ops == static_cast<std::uint64_t>(threads) * 3000);
  check_consistent(arena, backend);
  CHECK(arena.stats().eager_blocks == 0);
  arena.trim(streams[0]);
  CHECK(arena.stats().slabs == 0);
  CHECK(backend.bytes_in_use() == 0);
}

// The out-of-memory message names the largest free block; it is read under the arena's lock while
// another thread changes the free tree (ThreadSanitizer reports the read otherwise).
TEST_CASE("concurrency: an out-of-memory message is built while another thread changes the free tree",
          "[concurrency]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 2 * kMiB, .grow_on_demand = false, .report_findings = false});
  HostStream s1, s2;
  arena.reserve(4 * kMiB, s1);
  std::atomic<bool> stop{false};
  Failures f;
  std::atomic<std::uint64_t> churned{0};
  std::thread churn([&] {
    try {
      for (int i = 0; !stop; ++i) {
        auto a = arena.request(s2, "a", Extent(std::int64_t{4096} * (1 + i % 5)), 1, capacity_bound, Bindings());
        auto b = arena.request(s2, "b", Extent(std::int64_t{8192} * (1 + i % 3)), 1, capacity_bound, Bindings());
        ++churned;
      }
    } catch (const std::exception& e) {
      f.note(e.what());
    }
  });
  std::uint64_t refusals = 0;
  for (int i = 0; i < 2000 || churned == 0; ++i) {
    try {
      arena.request(s1, "huge", Extent(std::int64_t{64} << 20), 1, capacity_bound, Bindings());
      f.note("a 64 MiB request was served by a 4 MiB arena that cannot grow");
    } catch (const out_of_memory_error& e) {
      if (std::string(e.what()).find("largest free ") == std::string::npos) f.note(e.what());
      ++refusals;
    }
  }
  stop = true;
  churn.join();
  INFO(f.first);
  CHECK(f.unexpected == 0);
  CHECK(refusals >= 2000);
  CHECK(churned > 0);
  check_consistent(arena, backend);
}
