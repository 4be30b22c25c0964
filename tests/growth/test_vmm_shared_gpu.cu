// Virtual sharing on the GPU (CudaVirtualMemory::alias: cuMemMap of one cuMemCreate handle at a
// second reserved address). Data written by a kernel through one mapping is read back by a later
// kernel through another after the first workspace's lifetime ended; workspaces live at once (or
// on an unjoined stream) keep their bytes. Meant to run clean under compute-sanitizer memcheck.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "../support/gpu_test_support.hpp"

using namespace graphsafe;
using graphsafe_test::DevBuf;
using graphsafe_test::EventHolder;
using graphsafe_test::StreamHolder;

namespace {

__global__ void fill_kernel(std::uint32_t* p, std::size_t n, std::uint32_t v) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = v + static_cast<std::uint32_t>(i);
}

// Counts the elements that differ from what fill_kernel(v) wrote.
__global__ void check_kernel(const std::uint32_t* p, std::size_t n, std::uint32_t v, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    mine += p[i] != v + static_cast<std::uint32_t>(i);
  if (mine) atomicAdd(bad, mine);
}

void fill(void* p, std::size_t bytes, std::uint32_t v, cudaStream_t s) {
  fill_kernel<<<64, 256, 0, s>>>(static_cast<std::uint32_t*>(p), bytes / 4, v);
  GRAPHSAFE_CUDA(cudaGetLastError());
}
void check(const void* p, std::size_t bytes, std::uint32_t v, unsigned long long* bad, cudaStream_t s) {
  check_kernel<<<64, 256, 0, s>>>(static_cast<const std::uint32_t*>(p), bytes / 4, v, bad);
  GRAPHSAFE_CUDA(cudaGetLastError());
}
void join(cudaStream_t from, cudaStream_t to) {
  EventHolder e;
  GRAPHSAFE_CUDA(cudaEventRecord(e.e, from));
  GRAPHSAFE_CUDA(cudaStreamWaitEvent(to, e.e, 0));
}

}  // namespace

TEST_CASE("gpu: CudaVirtualMemory::alias shows one chunk at two addresses", "[gpu][virtual_sharing]") {
  auto vm = std::make_shared<CudaVirtualMemory>();
  const std::uint64_t G = vm->granularity();
  StreamHolder s;
  DevBuf<unsigned long long> bad(1);
  const std::uintptr_t a = vm->reserve(2 * G), b = vm->reserve(2 * G);
  std::uint64_t c[2];
  vm->map(a, 2, c);
  vm->alias(b, 2, c);
  CHECK(vm->stats().chunks_mapped == 2);
  CHECK(vm->stats().alias_mapped == 2);
  CHECK(vm->stats().physical_bytes() == 2 * G);
  fill(reinterpret_cast<void*>(a), 2 * G, 7, s.s);
  check(reinterpret_cast<void*>(b), 2 * G, 7, bad.p, s.s);  // through the other address
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s.s));
  CHECK(bad.download(s.s, 1)[0] == 0);
  // The first mapping gone, the alias still holds the bytes; the chunks go to the pool only after
  // the last mapping.
  vm->unmap(a, 2, c);
  CHECK(vm->stats().chunks_pooled == 0);
  fill(reinterpret_cast<void*>(b) , G, 11, s.s);
  check(reinterpret_cast<void*>(b), G, 11, bad.p, s.s);
  check(reinterpret_cast<char*>(b) + G, G, 7 + static_cast<std::uint32_t>(G / 4), bad.p, s.s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s.s));
  CHECK(bad.download(s.s, 1)[0] == 0);
  vm->unmap(b, 2, c);
  CHECK(vm->stats().chunks_pooled == 2);
  CHECK_THROWS_AS(vm->alias(a, 1, c), invalid_argument_error);  // pooled: not mapped anywhere
  vm->unreserve(a, 2 * G);
  vm->unreserve(b, 2 * G);
}

TEST_CASE("gpu: workspaces with disjoint lifetimes share chunks at their own addresses; live ones do not",
          "[gpu][virtual_sharing]") {
  CudaBackend backend;
  auto vm = std::make_shared<CudaVirtualMemory>();
  const std::uint64_t G = vm->granularity();
  Arena arena(backend, ArenaOptions{.report_findings = false, .debug = false, .virtual_memory = vm,
                                    .virtual_reserve_bytes = 64ull << 30,
                                    .virtual_sharing = VirtualSharing::disjoint_lifetimes});
  StreamHolder s0, s1;
  DevBuf<unsigned long long> bad(1), carried(1);
  Bindings b;
  const std::int64_t bytes = static_cast<std::int64_t>(3 * G / 2);  // crosses a granule boundary
  std::vector<std::uintptr_t> layer_addr;
  std::uintptr_t held_addr = 0, side_addr = 0;
  auto g = capture(arena, s0.s, b, [&](const Bindings& bb) {
    layer_addr.clear();
    // Live through every layer: never shared with them.
    auto held = arena.request(s0.s, "held", Extent(bytes), 1, capacity_bound, bb);
    held_addr = reinterpret_cast<std::uintptr_t>(held.data());
    fill(held.data(), held.bytes(), 100, s0.s);
    join(s0.s, s1.s);  // fork before the layers: s1's workspace is concurrent with them
    auto side = arena.request(s1.s, "side", Extent(bytes), 1, capacity_bound, bb);
    side_addr = reinterpret_cast<std::uintptr_t>(side.data());
    fill(side.data(), side.bytes(), 200, s1.s);
    for (std::uint32_t k = 0; k < 6; ++k) {
      auto ws = arena.request(s0.s, "layer", Extent(bytes), 1, capacity_bound, bb);
      layer_addr.push_back(reinterpret_cast<std::uintptr_t>(ws.data()));
      // Before writing: the previous layer's bytes, written through its own address.
      if (k > 0) check(ws.data(), ws.bytes(), 10 * k, carried.p, s0.s);
      fill(ws.data(), ws.bytes(), 10 * (k + 1), s0.s);
    }
    check(side.data(), side.bytes(), 200, bad.p, s1.s);
    join(s1.s, s0.s);
    check(held.data(), held.bytes(), 100, bad.p, s0.s);
  });
  for (std::size_t i = 0; i < layer_addr.size(); ++i) {
    CHECK(layer_addr[i] != held_addr);
    CHECK(layer_addr[i] != side_addr);
    for (std::size_t j = i + 1; j < layer_addr.size(); ++j) CHECK(layer_addr[i] != layer_addr[j]);
  }
  for (int r = 0; r < 3; ++r) g.replay(b, s0.s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s0.s));
  CHECK(carried.download(s0.s, 1)[0] == 0);  // every layer read its predecessor's data
  CHECK(bad.download(s0.s, 1)[0] == 0);      // the live ones kept theirs
  // Physical: three workspaces live at once (held, side, one layer), not eight.
  CHECK(g.plan().physical_bytes() == 3 * static_cast<std::uint64_t>(bytes));
  CHECK(g.plan().peak_live_bytes() == g.plan().physical_bytes());
  const auto vs = g.virtual_stats();
  CHECK(vs.committed_bytes <= (g.plan().physical_bytes() + G - 1) / G * G);
  CHECK(vs.mapped_bytes >= 8 * static_cast<std::uint64_t>(bytes));
  CHECK(vm->stats().alias_mapped > 0);
}
