// Device helpers of ds4_decode_demo (ds4_decode_demo_kernels.cu): random but valid fp8_ds_mla caches
// and bf16 queries generated on the GPU (seconds -> milliseconds at 64K tokens), and byte comparisons
// of the layers' outputs done on the device. Every function returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ds4_demo {

// Valid fp8_ds_mla bytes for a paged cache of `bytes` bytes, blocks of `block_tokens` tokens, `stride`
// bytes apart: fp8 data with |v| < 2 (never NaN), UE8M0 scales 124..127, bf16 rope in [-1, 1).
cudaError_t fill_cache(std::uint8_t* base, std::size_t bytes, int block_tokens, std::size_t stride,
                       std::uint64_t seed, cudaStream_t s);
// An indexer key cache (graphsafe/ds4/indexer.hpp layout) of `bytes` bytes, blocks of `block_rows`
// rows `stride` bytes apart: fp8 e4m3 data with |v| < 2 (never NaN), fp32 row scales in [0.005, 0.015).
cudaError_t fill_indexer_cache(std::uint8_t* base, std::size_t bytes, int block_rows, std::size_t stride,
                               std::uint64_t seed, cudaStream_t s);
// n fp8 e4m3 bytes with |v| < 2 (never NaN).
cudaError_t fill_fp8(std::uint8_t* p, std::size_t n, std::uint64_t seed, cudaStream_t s);
// n floats uniform in [lo, hi).
cudaError_t fill_f32(float* p, std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s);
// n bf16 values uniform in [-1, 1).
cudaError_t fill_bf16(std::uint16_t* p, std::size_t n, std::uint64_t seed, cudaStream_t s);
// *count += bytes that differ between a and b over `layers` slices of `bytes` bytes, `stride` apart.
cudaError_t count_differences(const std::uint8_t* a, const std::uint8_t* b, int layers, std::size_t stride,
                              std::size_t bytes, unsigned long long* count, cudaStream_t s);
// *count += bytes of a (same slices) that are not `value`.
cudaError_t count_not_equal(const std::uint8_t* a, std::uint8_t value, int layers, std::size_t stride,
                            std::size_t bytes, unsigned long long* count, cudaStream_t s);

}  // namespace ds4_demo
