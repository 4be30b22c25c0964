#include "ds4_decode_demo_kernels.hpp"

#include "../tests/support/ds4_bench_kernels.cuh"

#include <cuda_bf16.h>

namespace ds4_demo {
namespace {

// The demo's own generators hash like the DS4 benchmarks' (ds4_bench_kernels.cuh), whose cache and
// query generators fill_cache and fill_bf16 launch: same bytes for the same seed.
using graphsafe::testing::hash32;

__global__ void count_kernel(const std::uint8_t* a, const std::uint8_t* b, int value, int layers, std::size_t stride,
                             std::size_t bytes, unsigned long long* count) {
  unsigned long long local = 0;
  const std::size_t total = static_cast<std::size_t>(layers) * bytes;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t off = (i / bytes) * stride + i % bytes;
    const int want = b != nullptr ? static_cast<int>(b[off]) : value;
    local += static_cast<int>(a[off]) != want ? 1ull : 0ull;
  }
  if (local) atomicAdd(count, local);
}

// bytes % 4 == 0 (the strides are multiples of 16).
__global__ void fill_indexer_kernel(std::uint32_t* words, std::size_t nwords, int rows, std::size_t stride,
                                    std::uint64_t seed) {
  for (std::size_t w = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; w < nwords;
       w += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = (w * 4) % stride;
    const std::uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ULL + w);
    std::uint32_t v = 0;
    if (r < static_cast<std::size_t>(rows) * 128)
      v = h & 0xBFBFBFBFu;  // exponent's top bit clear: |v| < 2, never the NaN code
    else if (r < static_cast<std::size_t>(rows) * 132)
      v = __float_as_uint(0.005f + 0.01f * static_cast<float>(h & 0xFFFF) / 65536.0f);
    words[w] = v;
  }
}

__global__ void fill_fp8_kernel(std::uint8_t* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::uint8_t>(hash32(seed * 0x9E3779B97F4A7C15ULL + i) & 0xBFu);
}

__global__ void fill_f32_kernel(float* p, std::size_t n, float lo, float hi, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * static_cast<float>(hash32(seed * 0x9E3779B97F4A7C15ULL + i) & 0xFFFFFF) / 16777216.0f;
}

}  // namespace

cudaError_t fill_indexer_cache(std::uint8_t* base, std::size_t bytes, int block_rows, std::size_t stride,
                               std::uint64_t seed, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  fill_indexer_kernel<<<2048, 256, 0, s>>>(reinterpret_cast<std::uint32_t*>(base), bytes / 4, block_rows, stride,
                                            seed);
  return cudaGetLastError();
}

cudaError_t fill_fp8(std::uint8_t* p, std::size_t n, std::uint64_t seed, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  fill_fp8_kernel<<<1024, 256, 0, s>>>(p, n, seed);
  return cudaGetLastError();
}

cudaError_t fill_f32(float* p, std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  fill_f32_kernel<<<1024, 256, 0, s>>>(p, n, lo, hi, seed);
  return cudaGetLastError();
}

cudaError_t fill_cache(std::uint8_t* base, std::size_t bytes, int block_tokens, std::size_t stride,
                       std::uint64_t seed, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  graphsafe::testing::fill_mla_cache<<<2048, 256, 0, s>>>(reinterpret_cast<std::uint32_t*>(base), bytes / 4,
                                                           block_tokens, stride, seed);
  return cudaGetLastError();
}

cudaError_t fill_bf16(std::uint16_t* p, std::size_t n, std::uint64_t seed, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  graphsafe::testing::fill_bf16<<<1024, 256, 0, s>>>(p, n, seed);
  return cudaGetLastError();
}

cudaError_t count_differences(const std::uint8_t* a, const std::uint8_t* b, int layers, std::size_t stride,
                              std::size_t bytes, unsigned long long* count, cudaStream_t s) {
  if (layers == 0 || bytes == 0) return cudaSuccess;
  count_kernel<<<1024, 256, 0, s>>>(a, b, 0, layers, stride, bytes, count);
  return cudaGetLastError();
}

cudaError_t count_not_equal(const std::uint8_t* a, std::uint8_t value, int layers, std::size_t stride,
                            std::size_t bytes, unsigned long long* count, cudaStream_t s) {
  if (layers == 0 || bytes == 0) return cudaSuccess;
  count_kernel<<<1024, 256, 0, s>>>(a, nullptr, value, layers, stride, bytes, count);
  return cudaGetLastError();
}

}  // namespace ds4_demo
