// The seed's decode step as CUDA kernels (tests/support/seed_model.hpp has the model and values):
// fill the whole workspace, gather compressed rows then SWA rows of request b into ws[b*M + ...]
// with N and M frozen as kernel arguments and the lengths read from device memory at run time, then
// "attention" reads the rows the combined indices name into out[b * kOutW + ...]. Shared by the
// arena and debug-mode GPU tests.
#pragma once

#include "seed_model.hpp"

#include <graphsafe/cuda_backend.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

namespace graphsafe_test::seed {

constexpr int kThreads = 128;
constexpr std::int64_t kFiller = -3;

// Fill the whole workspace (its reserved count, frozen at capture).
__global__ void fill_kernel(std::int64_t* ws, std::int64_t count, std::int64_t value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    ws[i] = value;
}

__global__ void gather_kernel(std::int64_t* ws, std::int64_t N, std::int64_t M, const int* lens) {
  const int b = blockIdx.x;
  const int L = lens[b], n_c = L / kRatio, gb = L < kWindow ? L : kWindow;
  for (int c = threadIdx.x; c < n_c; c += blockDim.x) ws[b * M + c] = cmp_value(b, c);
  __syncthreads();  // SWA rows after compressed rows, as the host seed does (deterministic overlap)
  for (int i = threadIdx.x; i < gb; i += blockDim.x) ws[b * M + N + i] = swa_value(b, L - gb + i);
}

__global__ void attend_kernel(const std::int64_t* ws, std::int64_t N, std::int64_t M, const int* lens,
                              std::int64_t* out) {
  const int b = blockIdx.x;
  const int L = lens[b], n_c = L / kRatio, gb = L < kWindow ? L : kWindow;
  for (int c = threadIdx.x; c < n_c; c += blockDim.x) out[b * kOutW + c] = ws[b * M + c];
  for (int i = threadIdx.x; i < gb; i += blockDim.x) out[b * kOutW + n_c + i] = ws[b * M + N + i];
}

// The three kernels on `s`: fill (when count > 0), gather, attend.
inline void launch_seed_step(cudaStream_t s, std::int64_t* ws, std::int64_t count, std::int64_t N, std::int64_t M,
                             const int* d_lens, int R, std::int64_t* d_out) {
  if (count > 0) {
    const int blocks = static_cast<int>(std::min<std::int64_t>((count + kThreads - 1) / kThreads, 1024));
    fill_kernel<<<blocks, kThreads, 0, s>>>(ws, count, kFiller);
    GRAPHSAFE_CUDA(cudaGetLastError());
  }
  gather_kernel<<<R, kThreads, 0, s>>>(ws, N, M, d_lens);
  GRAPHSAFE_CUDA(cudaGetLastError());
  attend_kernel<<<R, kThreads, 0, s>>>(ws, N, M, d_lens, d_out);
  GRAPHSAFE_CUDA(cudaGetLastError());
}

}  // namespace graphsafe_test::seed
