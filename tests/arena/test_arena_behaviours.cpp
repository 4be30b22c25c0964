// The arena's behaviours (arena_behaviours.hpp) on the host backend: host memory, host streams and
// recorded host graphs. Runs everywhere; the `async` label runs it again with queued, interleaved
// streams and the race checker (GRAPHSAFE_HOST_EXECUTION=seeded).
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cstdint>
#include <cstring>

namespace graphsafe_test::behaviours {

struct HostArenaEnv {
  graphsafe::HostBackend host;
  graphsafe::HostStream s0{host}, s1{host};

  graphsafe::Backend& backend() { return host; }
  graphsafe::Stream stream(int i) { return i == 0 ? graphsafe::Stream(s0) : graphsafe::Stream(s1); }
  void fill(graphsafe::Stream s, void* p, std::uint64_t n, std::uint8_t v) {
    graphsafe::HostStream& hs = s == graphsafe::Stream(s0) ? s0 : s1;
    hs.launch([p, n, v] { std::memset(p, v, n); }, {graphsafe::HostAccess::writes(p, n)});
  }
  // Host streams need no delay: the seeded mode interleaves streams and checks every access.
  void slow(graphsafe::Stream) {}
  std::uint64_t backend_bytes_in_use() { return host.bytes_in_use(); }
};

}  // namespace graphsafe_test::behaviours

#define GRAPHSAFE_ARENA_ENVS graphsafe_test::behaviours::HostArenaEnv
#include "arena_behaviours.hpp"
