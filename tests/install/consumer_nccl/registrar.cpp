// The installed graphsafe::chunk_registrar on the host twin (HostVirtualMemory, host arena), with a
// recording stand-in for a library's registration calls: chunks the arena maps while it captures
// are deferred and registered by flush(), each mapped chunk once, none while the stream captures.
#include <graphsafe/graphsafe.hpp>
#include <graphsafe/nccl/registrar.hpp>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

using namespace graphsafe;
using namespace graphsafe::nccl;

namespace {

constexpr std::uint64_t kGranule = 64 << 10;

class RecordingCalls final : public RegistrationCalls {
 public:
  RecordingCalls(const HostStream* s, std::map<std::uintptr_t, int>* live, int* during_capture)
      : s_(s), live_(live), during_capture_(during_capture) {}
  std::string kind() const override { return "recording"; }
  void* register_range(void* p, std::uint64_t bytes) override {
    if (s_->capturing()) ++*during_capture_;
    if (bytes != kGranule) throw error("recording: a range of " + std::to_string(bytes) + " bytes, not one chunk");
    ++(*live_)[reinterpret_cast<std::uintptr_t>(p)];
    return p;
  }
  bool deregister(void* h) noexcept override {
    auto it = live_->find(reinterpret_cast<std::uintptr_t>(h));
    if (it == live_->end()) return false;
    if (--it->second == 0) live_->erase(it);
    return true;
  }

 private:
  const HostStream* s_;
  std::map<std::uintptr_t, int>* live_;
  int* during_capture_;
};

}  // namespace

// Returns the number of failed checks.
int check_registrar() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("FAIL: %s\n", what);
      ++failures;
    }
  };
  std::map<std::uintptr_t, int> live;  // chunk address -> registrations held
  int during_capture = 0;
  HostStream s;
  auto vm = std::make_shared<HostVirtualMemory>(HostVirtualMemoryOptions{.granularity = kGranule});
  auto reg = std::make_shared<ChunkRegistrar>(std::make_unique<RecordingCalls>(&s, &live, &during_capture),
                                              vm->granularity());
  vm->set_listener(reg);
  {
    HostBackend backend;
    ArenaOptions ao;
    ao.virtual_memory = vm;
    ao.virtual_reserve_bytes = 16ull << 20;
    ao.report_findings = false;
    Arena arena(backend, ao);

    const Symbol rows = Symbol::dynamic("tokens", 1 << 20);
    const StaticQueryBound bucket{Extent(256) * 4096};  // 1 MiB reserved: 16 chunks
    Bindings b;
    b.set(rows, 100);
    void* at = nullptr;
    auto g = capture(arena, s, b, [&](const Bindings& bb) {
      auto ws = arena.request(s, "tp.part", Extent(rows) * 4096, 1, bucket, bb);
      at = ws.data();
    });
    const std::uint64_t mapped = vm->stats().chunks_mapped;
    expect(mapped > 0, "the capture mapped chunks");
    expect(live.empty(), "nothing registered while capturing");
    expect(reg->stats().pending == mapped, "every chunk mapped during the capture is deferred");
    expect(reg->flush() == mapped, "flush registers the deferred chunks");
    expect(live.size() == mapped, "one registration per mapped chunk");
    bool once = true;
    for (auto& [a, n] : live) once = once && n == 1 && vm->chunk_at(reinterpret_cast<void*>(a)) >= 0;
    expect(once, "each registration is a mapped chunk, registered once");
    expect(reg->registered(at, 100 * 4096), "the capture's 100 rows are registered");
    expect(during_capture == 0 && reg->stats().during_capture == 0, "no registration while the stream captures");
  }
  vm->set_listener(nullptr);
  reg.reset();  // deregisters what is still registered
  expect(live.empty(), "the registrar gives every registration back");
  return failures;
}
