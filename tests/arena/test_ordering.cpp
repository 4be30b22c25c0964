// Stream ordering on the CPU: the host backend's seeded mode queues each stream's work, interleaves
// the streams by a seed and reports two unordered accesses to overlapping bytes. The first cases
// check the checker against hand-made programs (a missing edge is reported with both sites, each
// kind of edge removes it); the rest are arena programs whose every launch declares its bytes, so
// a block, region or slab handed over without the ordering it needs is a reported race.
#include <graphsafe/graphsafe.hpp>

#include <catch2/catch.hpp>

#include "../support/stream_work.hpp"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <source_location>
#include <thread>

using namespace graphsafe;
using Catch::Matchers::Contains;

namespace {
constexpr std::int64_t kMiB = 1ll << 20;

// Seeded, and with nothing left queued after a launch: work runs in launch order, so a missing
// edge is reported by the checker instead of corrupting memory (freeing a slab still written).
HostBackendOptions checked(bool default_stream = false) {
  return HostBackendOptions{.execution = HostExecution::seeded, .seed = 11, .max_queued = 0,
                            .default_stream = default_stream};
}

using test::capture_writer;
using test::write;

std::string all(const std::vector<HostRace>& races) {
  std::string s;
  for (const HostRace& r : races) s += r.describe() + "\n";
  return s;
}
}  // namespace

TEST_CASE("ordering: two unordered writes on two streams are one race naming both launch sites", "[ordering]") {
  HostBackend backend(checked());
  HostStream s(backend), t(backend);
  std::vector<unsigned char> buf(4096);
  write(s, buf.data(), 1024, 1);
  write(t, buf.data() + 512, 1024, 2);  // overlaps [512, 1024)
  const auto races = backend.take_races();
  INFO(all(races));
  REQUIRE(races.size() == 1);
  CHECK(races[0].begin == reinterpret_cast<std::uintptr_t>(buf.data() + 512));
  CHECK(races[0].end == reinterpret_cast<std::uintptr_t>(buf.data() + 1024));
  CHECK(races[0].first_write);
  CHECK(races[0].second_write);
  CHECK(races[0].first_stream != races[0].second_stream);
  CHECK_THAT(races[0].first_site, Contains("test_ordering.cpp"));
  CHECK_THAT(races[0].second_site, Contains("test_ordering.cpp"));
  CHECK_THAT(races[0].describe(), Contains("no order_after / synchronize"));
}

TEST_CASE("ordering: order_after, synchronize and disjoint bytes each leave no race", "[ordering]") {
  HostBackend backend(checked());
  HostStream s(backend), t(backend), u(backend);
  std::vector<unsigned char> buf(4096);
  write(s, buf.data(), 1024, 1);
  write(t, buf.data() + 1024, 1024, 2);  // disjoint
  backend.order_after(t, s);
  write(t, buf.data(), 1024, 3);  // after s's write: ordered
  backend.synchronize(t);
  write(u, buf.data(), 2048, 4);  // after the host waited for t (and through t, for s)
  CHECK(all(backend.take_races()) == "");
  backend.synchronize(u);
  CHECK(buf[0] == 4);
  CHECK(buf[2047] == 4);
  // Reads on two streams do not race; a write unordered with one of them does.
  s.launch([] {}, {HostAccess::reads(buf.data(), 16)});
  t.launch([] {}, {HostAccess::reads(buf.data(), 16)});
  CHECK(all(backend.take_races()) == "");
  write(u, buf.data(), 8, 5);
  const auto races = backend.take_races();
  REQUIRE(races.size() == 2);  // u's write against each unordered read
  CHECK_FALSE(races[0].first_write);
  CHECK(races[0].second_write);
}

TEST_CASE("ordering: a seed decides the interleaving, and without an edge it decides what memory holds",
          "[ordering]") {
  // Two streams each write their tag over one byte 8 times; without ordering the last writer
  // depends on the scheduler. Some seed must let each stream finish last (the seeded mode
  // really interleaves), and one seed always gives the same result.
  auto last_writer = [](std::uint64_t seed) {
    unsigned char byte = 0;
    HostBackend backend(HostBackendOptions{.execution = HostExecution::seeded, .seed = seed, .max_queued = 8});
    {
      HostStream s(backend), t(backend);
      for (int i = 0; i < 8; ++i) {
        s.launch([&byte] { byte = 1; });
        t.launch([&byte] { byte = 2; });
      }
      backend.synchronize(s);
      backend.synchronize(t);
    }
    return byte;
  };
  bool saw1 = false, saw2 = false;
  for (std::uint64_t seed = 1; seed <= 64; ++seed) {
    const unsigned char b = last_writer(seed);
    saw1 |= b == 1;
    saw2 |= b == 2;
    CHECK(last_writer(seed) == b);
  }
  CHECK(saw1);
  CHECK(saw2);
}

TEST_CASE("ordering: work queued on a stream has not run until the stream is waited for", "[ordering]") {
  HostBackend backend(HostBackendOptions{.execution = HostExecution::seeded, .seed = 3, .max_queued = 1000});
  HostStream s(backend);
  int ran = 0;
  for (int i = 0; i < 10; ++i) s.launch([&ran] { ++ran; });
  CHECK(ran < 10);  // a seed keeps up to max_queued queued
  backend.synchronize(s);
  CHECK(ran == 10);
}

TEST_CASE("ordering: a bad GRAPHSAFE_HOST_EXECUTION value is refused naming it", "[ordering]") {
  const char* old = std::getenv("GRAPHSAFE_HOST_EXECUTION");
  const std::string saved = old ? old : "";
  ::setenv("GRAPHSAFE_HOST_EXECUTION", "seeded:x", 1);
  CHECK_THROWS_WITH(HostBackend(), Contains("seeded:x"));
  ::setenv("GRAPHSAFE_HOST_EXECUTION", "seeded:5", 1);
  CHECK(HostBackend().seeded());
  CHECK_FALSE(HostBackend(HostBackendOptions{.execution = HostExecution::synchronous}).seeded());
  if (old)
    ::setenv("GRAPHSAFE_HOST_EXECUTION", saved.c_str(), 1);
  else
    ::unsetenv("GRAPHSAFE_HOST_EXECUTION");
}

// ---- the default stream (handle 0) is a stream, not "ready for any stream" ----------------------

TEST_CASE("ordering: a block released on the default stream is ordered before its reuse on another stream",
          "[ordering][default_stream]") {
  HostBackend backend(checked(true));
  Arena arena(backend, ArenaOptions{.report_findings = false});
  const Stream zero(static_cast<cudaStream_t>(nullptr));
  HostStream x(backend);
  arena.reserve(2 * kMiB, x);
  const Bindings none;
  void* first;
  {
    auto w = arena.request(zero, "on_default", 2 * kMiB, 1, capacity_bound, none);  // the whole slab
    first = w.data();
    write(backend.default_stream(), w.data(), w.bytes(), 1);
  }  // released on the default stream
  auto w = arena.request(x, "on_x", 2 * kMiB, 1, capacity_bound, none);
  REQUIRE(w.data() == first);  // the same bytes
  write(x, w.data(), w.bytes(), 2);
  CHECK(all(backend.take_races()) == "");
  backend.synchronize(x);
  CHECK(static_cast<unsigned char*>(w.data())[0] == 2);
}

TEST_CASE("ordering: blocks released on X, the default stream and Y do not coalesce into one tagged X",
          "[ordering][default_stream]") {
  HostBackend backend(checked(true));
  Arena arena(backend, ArenaOptions{.report_findings = false});
  const Stream zero(static_cast<cudaStream_t>(nullptr));
  HostStream w(backend), x(backend), y(backend);
  arena.reserve(4 * kMiB, w);
  const Bindings none;
  {
    auto a = arena.request(x, "a", kMiB, 1, capacity_bound, none);
    auto b = arena.request(zero, "b", kMiB, 1, capacity_bound, none);
    auto c = arena.request(y, "c", kMiB, 1, capacity_bound, none);
    REQUIRE(static_cast<char*>(b.data()) == static_cast<char*>(a.data()) + kMiB);  // adjacent
    REQUIRE(static_cast<char*>(c.data()) == static_cast<char*>(b.data()) + kMiB);
    write(x, a.data(), kMiB, 1);
    write(backend.default_stream(), b.data(), kMiB, 2);
    write(y, c.data(), kMiB, 3);
  }  // a on x, b on the default stream, c on y
  // A request spanning the three: served only from blocks this stream is ordered after.
  auto big = arena.request(w, "big", 3 * kMiB, 1, capacity_bound, none);
  write(w, big.data(), big.bytes(), 4);
  CHECK(all(backend.take_races()) == "");
}

TEST_CASE("ordering: an abandoned capture on the default stream gives its block back tagged with that stream",
          "[ordering][default_stream]") {
  HostBackend backend(checked(true));
  Arena arena(backend, ArenaOptions{.report_findings = false});
  const Stream zero(static_cast<cudaStream_t>(nullptr));
  HostStream x(backend), y(backend);
  arena.reserve(2 * kMiB, x);
  const Bindings none;
  void* first;
  {
    auto w = arena.request(x, "on_x", 2 * kMiB, 1, capacity_bound, none);
    first = w.data();
    write(x, w.data(), w.bytes(), 1);
  }
  {
    CaptureSession cs(arena, zero, none);  // takes the block (ordered after x), then is abandoned
    REQUIRE(backend.default_stream().capturing());
  }
  REQUIRE_FALSE(backend.default_stream().capturing());
  auto w = arena.request(y, "on_y", 2 * kMiB, 1, capacity_bound, none);
  REQUIRE(w.data() == first);
  write(y, w.data(), w.bytes(), 2);
  CHECK(all(backend.take_races()) == "");
}

// ---- replays of one family are ordered one after another -----------------------------------------

namespace {
// A host backend whose launch and order_after can be made to stall or fail once.
class ControlledBackend final : public Backend {
 public:
  explicit ControlledBackend(HostBackendOptions o) : host(o) {}
  std::string_view name() const override { return "host"; }
  void* allocate_slab(std::uint64_t bytes, Stream s) override { return host.allocate_slab(bytes, s); }
  void free_slab(void* p, std::uint64_t bytes, Stream s) override { host.free_slab(p, bytes, s); }
  CaptureInfo capture_info(Stream s) const override { return host.capture_info(s); }
  void begin_capture(Stream s, CaptureMode m) override { host.begin_capture(s, m); }
  GraphHandle end_capture(Stream s) override { return host.end_capture(s); }
  void abort_capture(Stream s) noexcept override { host.abort_capture(s); }
  void destroy(GraphHandle& g) noexcept override { host.destroy(g); }
  void synchronize(Stream s) override { host.synchronize(s); }
  void order_after(Stream w, Stream p) override {
    if (fail_next_order.exchange(false)) throw cuda_error("graphsafe test: event record failed", 700);
    host.order_after(w, p);
  }
  // With `stall_first_launch` set, the first launch waits (up to a timeout) until another launch
  // went through, so a second replay can run in the middle of the first one.
  void launch(const GraphHandle& g, Stream s) override {
    if (stall_first_launch.exchange(false)) {
      std::unique_lock lk(m);
      stalled = true;
      cv.notify_all();
      cv.wait_for(lk, std::chrono::milliseconds(300), [&] { return other_launched; });
      lk.unlock();
      host.launch(g, s);
      return;
    }
    host.launch(g, s);
    std::lock_guard lk(m);
    other_launched = true;
    cv.notify_all();
  }
  HostBackend host;
  std::atomic<bool> fail_next_order{false}, stall_first_launch{false};
  std::mutex m;
  std::condition_variable cv;
  bool stalled = false, other_launched = false;
};

}  // namespace

TEST_CASE("ordering: two threads replaying graphs of one family run one after the other",
          "[ordering][family][concurrency]") {
  ControlledBackend backend(checked());
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s1(backend.host), s2(backend.host);
  arena.reserve(2 * kMiB, s1);
  auto fam = arena.family("shared");
  CapturedGraph g1 = capture_writer(arena, s1, fam, 1);
  CapturedGraph g2 = capture_writer(arena, s2, fam, 2);
  REQUIRE(fam.graphs() == 2);
  backend.stall_first_launch = true;
  std::thread first([&] { g1.replay(Bindings{}, s1); });
  {
    std::unique_lock lk(backend.m);
    backend.cv.wait(lk, [&] { return backend.stalled; });  // the first replay is inside its launch
  }
  std::thread second([&] { g2.replay(Bindings{}, s2); });
  first.join();
  second.join();
  CHECK(all(backend.host.take_races()) == "");
}

TEST_CASE("ordering: a replay whose ordering failed does not become the family's last replay",
          "[ordering][family]") {
  ControlledBackend backend(checked());
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s1(backend.host), s2(backend.host), s3(backend.host);
  arena.reserve(2 * kMiB, s1);
  auto fam = arena.family("shared");
  CapturedGraph g1 = capture_writer(arena, s1, fam, 1);
  CapturedGraph g2 = capture_writer(arena, s2, fam, 2);
  g1.replay(Bindings{}, s1);
  backend.fail_next_order = true;
  CHECK_THROWS_AS(g2.replay(Bindings{}, s2), cuda_error);  // launched nothing
  g1.replay(Bindings{}, s3);  // must follow the replay on s1
  CHECK(all(backend.host.take_races()) == "");
}

TEST_CASE("ordering: an unguarded test replay is ordered after the family's last replay", "[ordering][family]") {
  HostBackend backend(checked());
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s1(backend), s2(backend);
  arena.reserve(2 * kMiB, s1);
  auto fam = arena.family("shared");
  CapturedGraph g1 = capture_writer(arena, s1, fam, 1);
  g1.replay(Bindings{}, s1);
  g1.replay_unguarded_for_testing(s2);
  CHECK(all(backend.take_races()) == "");
  g1.replay(Bindings{}, s1);  // and the next replay follows the unguarded one
  CHECK(all(backend.take_races()) == "");
}

// ---- trim never frees memory a capturing stream may still use ------------------------------------

TEST_CASE("ordering: trim keeps a slab last used by a stream that is capturing", "[ordering][trim]") {
  HostBackend backend(checked());
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream c(backend), s(backend);
  arena.reserve(2 * kMiB, c);
  const Bindings none;
  {
    auto w = arena.request(c, "before_capture", 2 * kMiB, 1, capacity_bound, none);  // the whole slab
    write(c, w.data(), w.bytes(), 1);
  }  // released on c
  arena.reserve(4 * kMiB, s);  // a larger slab: the capture takes it
  REQUIRE(arena.stats().slabs == 2);
  {
    CaptureSession cs(arena, c, none);
    arena.trim(s);  // c cannot be waited for while it captures
    CHECK(all(backend.take_races()) == "");
    CHECK(arena.stats().slabs == 2);
  }
  arena.trim(s);  // now c can be waited for: both slabs go
  CHECK(all(backend.take_races()) == "");
  CHECK(arena.stats().slabs == 0);
  CHECK(backend.bytes_in_use() == 0);
}
