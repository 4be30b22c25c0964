// Quantize-and-insert (docs/ds4_model.md §3.1): rows [n, 512] -> fp8_ds_mla tokens of a paged cache.
// One warp per row; bit-identical to ref::quantize_insert (exact UE8M0 exponent, RNE fp8/bf16).
#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"

namespace graphsafe::ds4::cuda {
namespace {

using namespace detail;

template <class T>
__global__ void __launch_bounds__(256) quantize_insert_kernel(const T* rows, const std::int32_t* slots,
                                                              int n, CacheView cache) {
  const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (row >= n) return;
  const long long slot = slots[row];
  if (!cache.valid(slot)) return;  // < 0: skipped; beyond the cache: never written
  std::uint8_t* data = const_cast<std::uint8_t*>(cache.data(slot));
  std::uint8_t* scales = const_cast<std::uint8_t*>(cache.scales(slot));
  quantize_row_warp(rows + static_cast<long long>(row) * kHeadDim, data, scales, threadIdx.x & 31);
}

template <class T>
void launch(const char* fn, const T* rows, const std::int32_t* slots, int n, PagedCache cache,
            cudaStream_t stream) {
  if (n < 0) bad_arg(fn, "n", n, "n >= 0");
  if (n == 0) return;
  require_ptr(fn, "rows", rows);
  require_ptr(fn, "slots", slots);
  require_cache(fn, "cache", cache);
  quantize_insert_kernel<T><<<(n + 7) / 8, 256, 0, stream>>>(rows, slots, n, view_of(cache));
  check_launch(fn);
}

}  // namespace

void quantize_insert_bf16(const std::uint16_t* rows_bf16, const std::int32_t* slots, int n,
                          PagedCache cache, cudaStream_t stream) {
  launch("quantize_insert_bf16", rows_bf16, slots, n, cache, stream);
}
void quantize_insert_f32(const float* rows, const std::int32_t* slots, int n, PagedCache cache,
                         cudaStream_t stream) {
  launch("quantize_insert_f32", rows, slots, n, cache, stream);
}

}  // namespace graphsafe::ds4::cuda
