// Host-backend "kernels" for the tests: work launched on a HostStream that declares the bytes it
// touches, so the seeded mode's race checker sees them (synchronous mode: they simply run).
#pragma once

#include <graphsafe/graphsafe.hpp>
#include <graphsafe/host_backend.hpp>

#include <cstdint>
#include <cstring>
#include <source_location>

namespace graphsafe::test {

// Write `tag` over [p, p + bytes) on `s`; the race report names the caller.
inline void write(HostStream& s, void* p, std::uint64_t bytes, unsigned char tag,
                  std::source_location loc = std::source_location::current()) {
  if (bytes == 0) return;
  s.launch([p, bytes, tag] { std::memset(p, tag, bytes); }, {HostAccess::writes(p, bytes)}, loc);
}

// A graph of `fam` whose recorded work writes its whole workspace (the family's region).
inline CapturedGraph capture_writer(Arena& arena, HostStream& s, CaptureFamily fam, unsigned char tag) {
  CaptureOptions o;
  o.family = fam;
  return capture(
      arena, s, Bindings{},
      [&](const Bindings& b) {
        auto w = arena.request(s, "state", 64 * 1024, 1, capacity_bound, b);
        write(s, w.data(), w.bytes(), tag);
      },
      o);
}

}  // namespace graphsafe::test
