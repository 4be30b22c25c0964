// ChunkRegistrar on the host twin (HostVirtualMemory, host arena): what it registers, when, and how
// many. The registration calls are a recording stand-in that also asks the host stream whether it
// is capturing at each call (an observation of its own, not the registrar's flag), so "no
// registration during capture" is checked against the stream, and "once per mapped chunk" against
// the chunks HostVirtualMemory reports mapped.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>
#include <graphsafe/nccl/registrar.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using namespace graphsafe;
using namespace graphsafe::nccl;

namespace {

constexpr std::uint64_t kGranule = 64 << 10;
constexpr std::int64_t kRowBytes = 4096;  // 16 rows per granule
constexpr std::int64_t kMaxRows = 1024;   // capacity: 64 granules

struct Call {
  std::uintptr_t addr;
  std::uint64_t bytes;
  bool stream_capturing;
};

class RecordingCalls final : public RegistrationCalls {
 public:
  explicit RecordingCalls(const HostStream* s) : s_(s) {}
  std::string kind() const override { return "recording"; }
  void* register_range(void* p, std::uint64_t bytes) override {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if (fail_at && a == fail_at) throw std::runtime_error("recording: refused");
    calls->push_back({a, bytes, s_->capturing()});
    ++(*live)[a];
    return reinterpret_cast<void*>(a ^ 0x1);  // a handle that is not the address
  }
  bool deregister(void* h) noexcept override {
    const auto a = reinterpret_cast<std::uintptr_t>(h) ^ 0x1;
    if (--(*live)[a] == 0) live->erase(a);
    return true;
  }
  std::shared_ptr<std::vector<Call>> calls = std::make_shared<std::vector<Call>>();
  std::shared_ptr<std::map<std::uintptr_t, int>> live = std::make_shared<std::map<std::uintptr_t, int>>();
  std::uintptr_t fail_at = 0;

 private:
  const HostStream* s_;
};

struct Fixture {
  std::shared_ptr<HostVirtualMemory> vm = std::make_shared<HostVirtualMemory>(HostVirtualMemoryOptions{.granularity = kGranule});
  HostBackend backend;
  HostStream s;
  RecordingCalls* calls = nullptr;
  std::shared_ptr<std::vector<Call>> log;
  std::shared_ptr<std::map<std::uintptr_t, int>> live;
  std::shared_ptr<ChunkRegistrar> reg;
  std::unique_ptr<Arena> arena;
  // The engine's bound is far above the graph's kMaxRows rows, which the policy reserves: the plan's
  // guard, not the symbol, refuses more.
  Symbol rows = Symbol::dynamic("tokens", 1 << 20);
  StaticQueryBound bucket{Extent(kMaxRows) * kRowBytes};
  StaticQueryBound bucket2{Extent(kMaxRows) * (2 * kRowBytes)};

  explicit Fixture(RegistrarOptions ro = {}) {
    auto c = std::make_unique<RecordingCalls>(&s);
    calls = c.get();
    log = c->calls;
    live = c->live;
    reg = std::make_shared<ChunkRegistrar>(std::move(c), vm->granularity(), ro);
    vm->set_listener(reg);
    ArenaOptions ao;
    ao.virtual_memory = vm;
    ao.virtual_reserve_bytes = 64ull << 20;
    ao.report_findings = false;
    arena = std::make_unique<Arena>(backend, ao);
  }
  ~Fixture() {
    arena.reset();
    vm->set_listener(nullptr);
  }
  Bindings bind(std::int64_t n) {
    Bindings b;
    b.set(rows, n);
    return b;
  }
  // The step: a send buffer of `rows` rows and a receive buffer of twice as many (a 2-rank
  // all-gather's shapes), capacity-bound, touched as prefixes; "the collective" copies send twice.
  CapturedGraph capture_step(const Bindings& b, std::vector<std::int64_t>& out, void** recv_at) {
    return capture(*arena, s, b, [&](const Bindings& bb) {
      auto send = arena->request(s, "tp.send", Extent(rows) * kRowBytes, 1, bucket, bb);
      auto recv = arena->request(s, "tp.recv", Extent(rows) * (2 * kRowBytes), 1, bucket2, bb);
      auto* sp = send.as<std::int64_t>();
      auto* rp = recv.as<std::int64_t>();
      *recv_at = rp;
      auto* o = &out;
      const std::int64_t* n_now = &current;
      s.launch([=] {
        const std::int64_t per = *n_now * kRowBytes / 8;
        for (std::int64_t i = 0; i < per; ++i) sp[i] = i * 3 + 1;
        std::memcpy(rp, sp, per * 8);
        std::memcpy(rp + per, sp, per * 8);
        o->assign(rp, rp + 2 * per);
      });
    });
  }
  std::int64_t current = 0;  // the "device" row count the step reads at run time
};

// Every mapped granule of the VirtualMemory, by address (HostVirtualMemory::chunk_at).
std::set<std::uintptr_t> registered_addresses(const std::map<std::uintptr_t, int>& live) {
  std::set<std::uintptr_t> out;
  for (auto& [a, n] : live) {
    REQUIRE(n == 1);  // never registered twice
    out.insert(a);
  }
  return out;
}

std::vector<std::int64_t> expected(std::int64_t n) {
  std::vector<std::int64_t> one(n * kRowBytes / 8);
  for (std::size_t i = 0; i < one.size(); ++i) one[i] = static_cast<std::int64_t>(i) * 3 + 1;
  std::vector<std::int64_t> out = one;
  out.insert(out.end(), one.begin(), one.end());
  return out;
}

}  // namespace

TEST_CASE("nccl registrar: no registration during capture, each mapped chunk registered once after it",
          "[nccl]") {
  Fixture f;
  std::vector<std::int64_t> out;
  void* recv = nullptr;
  f.current = 20;
  auto g = f.capture_step(f.bind(20), out, &recv);
  const auto mapped_at_capture = f.vm->stats().chunks_mapped;
  REQUIRE(mapped_at_capture > 0);
  // Everything the capture mapped waits: no call was made, the stream never saw one.
  CHECK(f.log->empty());
  auto st = f.reg->stats();
  CHECK(st.pending == mapped_at_capture);
  CHECK(st.registrations == 0);
  CHECK(st.during_capture == 0);
  CHECK(f.reg->flush() == mapped_at_capture);
  st = f.reg->stats();
  CHECK(st.registrations == mapped_at_capture);
  CHECK(st.live == mapped_at_capture);
  CHECK(st.pending == 0);
  for (const Call& c : *f.log) {
    CHECK_FALSE(c.stream_capturing);
    CHECK(c.bytes == kGranule);
    CHECK(c.addr % kGranule == 0);
    CHECK(f.vm->chunk_at(reinterpret_cast<void*>(c.addr)) >= 0);  // a mapped chunk
  }
  CHECK(registered_addresses(*f.live).size() == mapped_at_capture);
  CHECK(f.reg->registered(recv, 2 * 20 * kRowBytes));

  // Replays within the capacity: growth maps new chunks at the same addresses, registered at once
  // (outside capture), and only those.
  std::uint64_t calls_before = f.log->size();
  for (std::int64_t n : {20, 100, 400, 1024, 300}) {
    INFO("rows " << n);
    f.current = n;
    const auto mapped_before = f.vm->stats().chunks_mapped;
    g.replay(f.bind(n), f.s);
    CHECK(out == expected(n));
    const auto mapped_now = f.vm->stats().chunks_mapped;
    CHECK(f.log->size() - calls_before == mapped_now - mapped_before);  // new chunks only
    calls_before = f.log->size();
    CHECK(f.reg->stats().live == mapped_now);
    CHECK(f.reg->registered(recv, 2 * n * kRowBytes));
  }
  CHECK(registered_addresses(*f.live).size() == f.vm->stats().chunks_mapped);
  for (const Call& c : *f.log) CHECK_FALSE(c.stream_capturing);
  CHECK(f.reg->stats().during_capture == 0);

  // A replay past the capacity is refused by the guards before anything maps or registers.
  const auto calls_at_refusal = f.log->size();
  const Bindings over = f.bind(kMaxRows + 1);
  CHECK_THROWS_AS(g.replay(over, f.s), guard_failure);
  CHECK(f.log->size() == calls_at_refusal);

  // Shrinking unmaps: those chunks are deregistered first.
  f.arena->shrink(f.s, f.bind(20));
  CHECK(f.reg->stats().live == f.vm->stats().chunks_mapped);
  CHECK(f.live->size() == f.vm->stats().chunks_mapped);
  CHECK(f.reg->stats().deregistrations > 0);
}

TEST_CASE("nccl registrar: a second capture of the family reuses registered chunks", "[nccl]") {
  Fixture f;
  std::vector<std::int64_t> out;
  void* recv1 = nullptr;
  void* recv2 = nullptr;
  f.current = 64;
  CaptureOptions co;
  co.family = f.arena->family("tp");
  auto g1 = capture(*f.arena, f.s, f.bind(64), [&](const Bindings& bb) {
    auto w = f.arena->request(f.s, "tp.recv", Extent(f.rows) * kRowBytes, 1, f.bucket, bb);
    recv1 = w.data();
  }, co);
  f.reg->flush();
  const auto regs = f.reg->stats().registrations;
  auto g2 = capture(*f.arena, f.s, f.bind(64), [&](const Bindings& bb) {
    auto w = f.arena->request(f.s, "tp.recv", Extent(f.rows) * kRowBytes, 1, f.bucket, bb);
    recv2 = w.data();
  }, co);
  // Same family, same layout: the same chunks, already registered; nothing deferred.
  CHECK(recv1 == recv2);
  CHECK(f.reg->stats().pending == 0);
  CHECK(f.reg->stats().registrations == regs);
  CHECK(f.reg->registered(recv2, 64 * kRowBytes));
}

TEST_CASE("nccl registrar: refuse mode fails a capture that maps chunks, naming the option", "[nccl]") {
  Fixture f({.capture_maps = CaptureMaps::refuse});
  std::vector<std::int64_t> out;
  void* recv = nullptr;
  try {
    f.capture_step(f.bind(8), out, &recv);
    FAIL("the capture mapped chunks and was not refused");
  } catch (const capture_state_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("CaptureMaps::refuse"));
  }
  CHECK(f.log->empty());
  CHECK(f.vm->stats().chunks_mapped == 0);  // the refused mapping was undone
}

TEST_CASE("nccl registrar: the bound on registrations refuses the growth past it, with nothing mapped",
          "[nccl]") {
  Fixture f({.max_registrations = 8});
  std::vector<std::int64_t> out;
  void* recv = nullptr;
  f.current = 8;
  auto g = f.capture_step(f.bind(8), out, &recv);
  f.reg->flush();
  const auto held = f.reg->stats().live;
  REQUIRE(held < 8);
  const auto mapped = f.vm->stats().chunks_mapped;
  f.current = 1024;
  try {
    g.replay(f.bind(1024), f.s);
    FAIL("growth past max_registrations was not refused");
  } catch (const capacity_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("the limit is 8") && Catch::Contains("max_registrations"));
  }
  CHECK(f.vm->stats().chunks_mapped == mapped);
  CHECK(f.reg->stats().live == held);
  CHECK(f.live->size() == held);
  // Within the bound the same graph still replays.
  f.current = 8;
  g.replay(f.bind(8), f.s);
  CHECK(out == expected(8));
}

TEST_CASE("nccl registrar: a failed registration leaves the chunks unmapped and unregistered", "[nccl]") {
  Fixture f;
  std::vector<std::int64_t> out;
  void* recv = nullptr;
  f.current = 16;
  auto g = f.capture_step(f.bind(16), out, &recv);
  f.reg->flush();
  const auto held = f.reg->stats().live;
  const auto mapped = f.vm->stats().chunks_mapped;
  // The granule just past what the receive buffer has mapped: growth's first new chunk.
  const auto r = reinterpret_cast<std::uintptr_t>(recv);
  std::uintptr_t next = (r + 2 * 16 * kRowBytes + kGranule - 1) / kGranule * kGranule;
  while (f.vm->chunk_at(reinterpret_cast<void*>(next)) >= 0) next += kGranule;
  f.calls->fail_at = next;
  f.current = 512;
  out.clear();
  CHECK_THROWS_WITH(g.replay(f.bind(512), f.s), Catch::Contains("recording: refused"));
  CHECK(out.empty());  // refused before launch
  // The run holding the refused chunk is not mapped; runs mapped before it stay mapped and
  // registered: what is mapped and what is registered never differ.
  CHECK(f.vm->chunk_at(reinterpret_cast<void*>(next)) < 0);
  CHECK(f.vm->stats().chunks_mapped >= mapped);
  CHECK(f.reg->stats().live >= held);
  CHECK(f.reg->stats().live == f.vm->stats().chunks_mapped);
  CHECK(f.live->size() == f.vm->stats().chunks_mapped);
  // Once the library accepts it, the same replay maps and registers the rest.
  f.calls->fail_at = 0;
  g.replay(f.bind(512), f.s);
  CHECK(out == expected(512));
  CHECK(f.reg->registered(recv, 2 * 512 * kRowBytes));
  CHECK(f.live->size() == f.vm->stats().chunks_mapped);
}

TEST_CASE("nccl registrar: bad options are refused with the value and the limit", "[nccl]") {
  HostStream s;
  CHECK_THROWS_WITH(ChunkRegistrar(std::make_unique<RecordingCalls>(&s), kGranule, {.max_registrations = 0}),
                    Catch::Contains("max_registrations is 0"));
  CHECK_THROWS_WITH(ChunkRegistrar(std::make_unique<RecordingCalls>(&s), 0), Catch::Contains("granularity 0"));
  CHECK_THROWS_WITH(ChunkRegistrar(nullptr, kGranule), Catch::Contains("null"));
}
