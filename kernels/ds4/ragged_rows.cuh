// The ragged gather layout's first row of a request (GatherArgs::ragged, GatherIndexArgs::ragged):
// row0(b) = sum_{j<b} (n_c(j) + min(L_j, W)), L_j = max(seq_lens[j], 0), n_c = L / ratio for
// ratio > 1, else 0. Lengths change between graph replays, so it is computed on the device, by the
// whole CTA: a strided sum over j < b, a shuffle reduction per warp, then the warps' partial sums.
// Batch is at most a few thousand, so each thread reads a handful of lengths (L2-resident).
// Internal to kernels/ds4 (not installed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace graphsafe::ds4::cuda::detail {

// Rows request b occupies in the ragged workspace: n_c + swa_len.
__device__ __forceinline__ long long ragged_rows_of(int seq_len, int ratio, int window) {
  const int L = max(seq_len, 0);
  return static_cast<long long>(ratio > 1 ? L / ratio : 0) + min(L, window);
}

// row0(b). Every thread of the CTA must call it (it synchronizes the CTA) with the same arguments;
// kThreads == blockDim.x, a multiple of 32. Every thread gets the sum.
template <int kThreads>
__device__ __forceinline__ long long ragged_row0(const std::int32_t* seq_lens, int b, int ratio, int window) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  constexpr int kWarpCount = kThreads / 32;
  __shared__ long long warp_sums[kWarpCount];
  long long s = 0;
  for (int j = threadIdx.x; j < b; j += kThreads) s += ragged_rows_of(seq_lens[j], ratio, window);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
  __syncthreads();
  long long t = 0;
#pragma unroll
  for (int w = 0; w < kWarpCount; ++w) t += warp_sums[w];
  return t;
}

}  // namespace graphsafe::ds4::cuda::detail
