// The arena's behaviours (arena_behaviours.hpp) on the CUDA backend: a real device, non-blocking
// streams, stream capture and graph launch. Skipped (exit 77) on a machine without a CUDA device.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../support/gpu_test_support.hpp"

namespace graphsafe_test::behaviours {

namespace {
// Holds a stream busy for about `ns` nanoseconds, so that work queued behind it lands late.
__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = clock64();
  // clock64 counts SM cycles; 2 GHz is above any H200 clock, so this spins at least `ns`.
  while (clock64() - start < ns * 2) {
  }
}
}  // namespace

// Slabs from the backend's pool even under GRAPHSAFE_DEBUG=1: the pool's own count is the
// reference the trim behaviour checks.
inline graphsafe::CudaBackendOptions pool_slabs() {
  graphsafe::CudaBackendOptions o;
  o.plain_allocations = false;
  return o;
}

struct CudaArenaEnv {
  StreamHolder s0, s1;
  graphsafe::CudaBackend cuda{pool_slabs()};

  graphsafe::Backend& backend() { return cuda; }
  graphsafe::Stream stream(int i) { return i == 0 ? s0.s : s1.s; }
  void fill(graphsafe::Stream s, void* p, std::uint64_t n, std::uint8_t v) {
    GRAPHSAFE_CUDA(cudaMemsetAsync(p, v, n, s.cuda()));
  }
  void slow(graphsafe::Stream s) {
    spin_kernel<<<1, 1, 0, s.cuda()>>>(5'000'000);  // 5 ms: far longer than the host's next calls
    GRAPHSAFE_CUDA(cudaGetLastError());
  }
  // The pool's own count of bytes allocated from it (the arena's slabs), once freed slabs are freed.
  std::uint64_t backend_bytes_in_use() {
    GRAPHSAFE_CUDA(cudaDeviceSynchronize());
    std::uint64_t used = 0;
    GRAPHSAFE_CUDA(cudaMemPoolGetAttribute(cuda.pool(), cudaMemPoolAttrUsedMemCurrent, &used));
    return used;
  }
};

}  // namespace graphsafe_test::behaviours

#define GRAPHSAFE_ARENA_ENVS graphsafe_test::behaviours::CudaArenaEnv
#include "arena_behaviours.hpp"
