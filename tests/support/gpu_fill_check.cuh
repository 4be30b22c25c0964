// Fill-and-check kernels for the GPU capture tests: every workspace is filled with one value by a
// kernel and checked by a later one, so a replay that let two live workspaces share bytes shows up
// as a count of mismatches. Include after gpu_test_support.hpp.
#pragma once

#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace graphsafe_test {

__global__ void fill_kernel(std::uint32_t* p, std::size_t n, std::uint32_t v) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

__global__ void check_kernel(const std::uint32_t* p, std::size_t n, std::uint32_t v, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    mine += p[i] != v;
  if (mine) atomicAdd(bad, mine);
}

inline void fill(const graphsafe::Workspace& w, std::uint32_t v, cudaStream_t s) {
  fill_kernel<<<64, 256, 0, s>>>(w.as<std::uint32_t>(), w.bytes() / 4, v);
  GRAPHSAFE_CUDA(cudaGetLastError());
}

// Adds to *bad the number of elements of w that differ from v.
inline void check(const graphsafe::Workspace& w, std::uint32_t v, unsigned long long* bad, cudaStream_t s) {
  check_kernel<<<64, 256, 0, s>>>(w.as<std::uint32_t>(), w.bytes() / 4, v, bad);
  GRAPHSAFE_CUDA(cudaGetLastError());
}

// Makes `to` wait for the work queued on `from` so far (an edge in a captured graph).
inline void join(cudaStream_t from, cudaStream_t to) {
  EventHolder e;
  GRAPHSAFE_CUDA(cudaEventRecord(e.e, from));
  GRAPHSAFE_CUDA(cudaStreamWaitEvent(to, e.e, 0));
}

}  // namespace graphsafe_test
