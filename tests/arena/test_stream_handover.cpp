// Memory handed from one stream to another, checked by the host backend's seeded mode: every launch
// declares its bytes, so a block, region or slab given to a stream (or back to the upstream pool)
// before the work of another stream that used it is ordered first is a reported race. Each case is
// a program the fuzzer (tests/fuzz) found reaching such a handover; the race checker is the
// reference, and the arena's own figures say where the memory went.
#include <graphsafe/graphsafe.hpp>

#include <catch2/catch.hpp>

#include "../support/forwarding_backend.hpp"
#include "../support/stream_work.hpp"

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace graphsafe;

namespace {
constexpr std::int64_t kMiB = 1ll << 20;

// Seeded, nothing left queued after a launch: work runs in launch order and a missing edge is a
// reported race rather than corrupted memory.
HostBackendOptions checked() {
  return HostBackendOptions{.execution = HostExecution::seeded, .seed = 5, .max_queued = 0};
}

std::string all(const std::vector<HostRace>& races) {
  std::string s;
  for (const HostRace& r : races) s += r.describe() + "\n";
  return s;
}

using test::capture_writer;
using test::write;

// A host backend that runs a hook once, right after it synchronized a chosen stream: what another
// thread does while an arena call waits for that stream, made deterministic.
class SyncHookBackend final : public graphsafe_test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void synchronize(Stream s) override {
    host.synchronize(s);
    if (hook && s.handle() == hook_stream) std::exchange(hook, nullptr)();
  }
  void* hook_stream = nullptr;
  std::function<void()> hook;
};

}  // namespace

TEST_CASE("handover: a graph captured while its family replayed on another stream follows that replay",
          "[handover][family][async]") {
  HostBackend backend(checked());
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s1(backend), s2(backend);
  arena.reserve(2 * kMiB, s1);
  auto fam = arena.family("shared");
  CapturedGraph g1 = capture_writer(arena, s1, fam, 1);
  g1.replay(Bindings{}, s1);
  CaptureOptions o;
  o.family = fam;
  CaptureSession cs(arena, s1, Bindings{}, o);  // ordered after the family's replays so far
  const unsigned char* region;
  {
    auto w = arena.request(s1, "state", 64 * 1024, 1, capacity_bound, Bindings{});
    write(s1, w.data(), w.bytes(), 2);
    region = w.as<unsigned char>();
  }
  g1.replay(Bindings{}, s2);  // the family's region written on s2 while g2 is being captured
  CapturedGraph g2 = cs.finish();
  REQUIRE(fam.graphs() == 2);
  g2.replay(Bindings{}, s1);  // writes the same region: must follow the replay on s2
  CHECK(all(backend.take_races()) == "");
  backend.synchronize(s1);
  CHECK((region[0] == 2 && region[64 * 1024 - 1] == 2));  // the later replay's bytes
  g1.replay(Bindings{}, s2);  // and the family's next replay follows g2's
  CHECK(all(backend.take_races()) == "");
}

TEST_CASE("handover: trim keeps a block released on a stream after trim waited for that stream",
          "[handover][trim][async]") {
  SyncHookBackend backend(checked());
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream x(backend.host), t(backend.host), y(backend.host);
  arena.reserve(2 * kMiB, x);
  const Bindings none;
  void* a = arena.allocate(x, kMiB);
  void* b = arena.allocate(x, kMiB);  // the slab's other half
  REQUIRE(static_cast<char*>(b) == static_cast<char*>(a) + kMiB);
  write(x, a, kMiB, 1);
  arena.deallocate(x, a, kMiB);  // free, released on x: trim waits for x
  // While trim waits for x, the program writes b on x and releases it there (another thread would):
  // that write was queued after the wait, so b is not ready although x was waited for.
  backend.hook_stream = Stream(x).handle();
  backend.hook = [&] {
    write(x, b, kMiB, 2);
    arena.deallocate(x, b, kMiB);
  };
  arena.trim(t);
  REQUIRE_FALSE(backend.hook);  // it ran
  CHECK(all(backend.host.take_races()) == "");  // the slab was not freed under the write on x
  CHECK(arena.stats().slabs == 1);
  // The whole slab to another stream: ordered after x's write of b.
  void* c = arena.allocate(y, 2 * kMiB);
  CHECK(c == a);
  write(y, c, 2 * kMiB, 3);
  CHECK(all(backend.host.take_races()) == "");
  arena.deallocate(y, c, 2 * kMiB);
  arena.trim(t);  // now y is waited for before the slab goes
  CHECK(all(backend.host.take_races()) == "");
  CHECK(arena.stats().slabs == 0);
  CHECK(backend.host.bytes_in_use() == 0);
}

TEST_CASE("handover: threads releasing on their streams while another thread trims hand over no block unordered",
          "[handover][trim][concurrency][async]") {
  HostBackend backend(HostBackendOptions{.execution = HostExecution::seeded, .seed = 9, .max_queued = 4});
  Arena arena(backend, ArenaOptions{.growth_bytes = 256 * 1024, .report_findings = false});
  constexpr int kThreads = 4, kRounds = 300;
  std::deque<HostStream> streams;
  for (int i = 0; i < kThreads; ++i) streams.emplace_back(backend);
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i)
    ts.emplace_back([&, i] {
      HostStream& h = streams[static_cast<std::size_t>(i)];
      std::uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(i + 1);
      for (int k = 0; k < kRounds; ++k) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        if (i == 0 && k % 3 == 0) {  // one thread also trims, waiting for the others' streams
          arena.trim(h);
          continue;
        }
        const auto bytes = static_cast<std::int64_t>(1 + (x >> 33) % (96 * 1024));
        const auto tag = static_cast<unsigned char>(1 + i);
        Workspace w = arena.request(h, "t", Extent(bytes), 1, capacity_bound, Bindings{});
        write(h, w.data(), w.bytes(), tag);
        if ((x >> 20) % 2) continue;  // released with its write still queued
        backend.synchronize(h);
        const auto* c = w.as<unsigned char>();
        for (std::int64_t j = 0; j < bytes; j += 997) wrong += c[j] != tag;
      }
    });
  for (std::thread& t : ts) t.join();
  CHECK(wrong.load() == 0);
  CHECK(all(backend.take_races()) == "");
  const ArenaStats st = arena.stats();
  CHECK(st.eager_bytes == 0);
  CHECK(st.free_bytes == st.slab_bytes);
  arena.trim(streams[1]);
  CHECK(all(backend.take_races()) == "");
  CHECK(arena.stats().slabs == 0);
  CHECK(backend.bytes_in_use() == 0);
}
