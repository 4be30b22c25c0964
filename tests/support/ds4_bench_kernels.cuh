// Device helpers shared by the DS4 benchmarks (bench/ds4_attention_bench.cu, bench/ds4_indexer_bench.cu)
// and the decode demo (examples/ds4_decode_demo_kernels.cu): deterministic random but valid
// fp8_ds_mla caches and bf16 tensors generated on the GPU, and the uint4 copy kernel that measures copy
// bandwidth. One definition, so the benchmarks and the demo read the same bytes for the same seed and
// their recorded results stay comparable; changing the arithmetic here changes every recorded figure.
// Kernels have external linkage: include from one translation unit per program.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace graphsafe::testing {

// MurmurHash3's 64-bit finaliser, truncated: a well-mixed 32-bit value per 64-bit counter.
__device__ __forceinline__ std::uint32_t hash32(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

__device__ __forceinline__ std::uint16_t rand_bf16(std::uint32_t h) {  // uniform in [-1, 1)
  const float f = static_cast<float>(h & 0xFFFFFF) / 8388608.0f - 1.0f;
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Valid fp8_ds_mla bytes for `nwords` words of a paged cache, blocks of `bs` tokens `stride` bytes
// apart: fp8 with the top exponent bit clear (|v| < 2, never NaN), UE8M0 scales 124..127, bf16 rope
// in [-1, 1), zero pad bytes.
__global__ void fill_mla_cache(std::uint32_t* words, std::size_t nwords, int bs, std::size_t stride,
                               std::uint64_t seed) {
  for (std::size_t w = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; w < nwords;
       w += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t off = w * 4, r = off % stride;
    const std::uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ULL + w);
    std::uint32_t v = 0;
    if (r < static_cast<std::size_t>(bs) * 576) {
      const std::size_t b = r % 576;
      if (b < 448)
        v = h & 0xBFBFBFBFu;
      else
        v = rand_bf16(h) | (static_cast<std::uint32_t>(rand_bf16(hash32(h + 7))) << 16);
    } else if (r < static_cast<std::size_t>(bs) * 584) {
      const std::size_t k0 = (r - static_cast<std::size_t>(bs) * 576) % 8;
      for (int i = 0; i < 4; ++i) {
        const std::uint32_t byte = (k0 + i) < 7 ? 124u + ((h >> (8 * i)) & 3u) : 0u;
        v |= byte << (8 * i);
      }
    }
    words[w] = v;
  }
}

// n bf16 values uniform in [-1, 1).
__global__ void fill_bf16(std::uint16_t* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = rand_bf16(hash32(seed * 0x9E3779B97F4A7C15ULL + i));
}

// b[i] = a[i]: the copy kernel side of the copy-bandwidth ceiling (the other is cudaMemcpyAsync).
__global__ void copy_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    b[i] = a[i];
}

}  // namespace graphsafe::testing
