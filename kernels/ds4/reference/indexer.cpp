// The lightning indexer's CPU reference (docs/ds4_model.md §2.3): fp8 key rows with one scale, the
// ReLU-weighted head scores and the top-k selection rule of graphsafe/ds4/indexer.hpp.
#include <graphsafe/ds4/indexer.hpp>
#include <graphsafe/ds4/reference.hpp>

#include "detail.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace graphsafe::ds4::ref {
namespace {

std::uint8_t* row_data(const IndexerCache& c, std::int64_t slot) {
  const std::int64_t block = slot / c.block_rows, t = slot % c.block_rows;
  return c.base + block * static_cast<std::int64_t>(c.stride) + t * kIndexerRowBytes;
}
std::uint8_t* row_scale(const IndexerCache& c, std::int64_t slot) {
  const std::int64_t block = slot / c.block_rows, t = slot % c.block_rows;
  return c.base + block * static_cast<std::int64_t>(c.stride) +
         static_cast<std::int64_t>(c.block_rows) * kIndexerRowBytes + t * kIndexerScaleBytes;
}
void check_slot(const IndexerCache& c, std::int64_t slot, const char* fn) {
  if (c.base == nullptr) detail::fail(fn, ": the indexer cache has no memory");
  if (slot < 0 || slot >= static_cast<std::int64_t>(c.num_blocks) * c.block_rows)
    detail::fail(fn, ": slot = ", slot, " is outside the cache's ", static_cast<long long>(c.num_blocks) * c.block_rows,
                 " rows");
}

}  // namespace

void indexer_quantize_row(const float* x128, std::uint8_t* q128, float* scale) {
  float amax = 0.0f;
  for (int d = 0; d < kIndexerDim; ++d) amax = std::max(amax, std::fabs(x128[d]));
  const float s = std::max(amax, kAmaxFloor) / kFp8Max;
  for (int d = 0; d < kIndexerDim; ++d) q128[d] = fp8_e4m3_from_float(x128[d] / s);
  *scale = s;
}

void indexer_dequantize_row(const std::uint8_t* q128, float scale, float* out128) {
  for (int d = 0; d < kIndexerDim; ++d) out128[d] = fp8_e4m3_to_float(q128[d]) * scale;
}

void indexer_insert(const IndexerCache& cache, std::int64_t slot, const float* x128) {
  check_slot(cache, slot, "indexer_insert");
  float scale = 0.0f;
  indexer_quantize_row(x128, row_data(cache, slot), &scale);
  std::memcpy(row_scale(cache, slot), &scale, sizeof scale);
}

void indexer_read(const IndexerCache& cache, std::int64_t slot, float* q128, float* scale) {
  check_slot(cache, slot, "indexer_read");
  const std::uint8_t* q = row_data(cache, slot);
  for (int d = 0; d < kIndexerDim; ++d) q128[d] = fp8_e4m3_to_float(q[d]);
  std::memcpy(scale, row_scale(cache, slot), sizeof *scale);
}

std::vector<float> indexer_scores(const IndexerCache& cache, const std::int32_t* block_table, int n_c,
                                  const float* q8, const float* weights) {
  if (n_c < 0) detail::fail("indexer_scores: n_c = ", n_c, " must be >= 0");
  std::vector<float> out(static_cast<std::size_t>(n_c));
  float k[kIndexerDim];
  for (int s = 0; s < n_c; ++s) {
    const std::int64_t slot =
        static_cast<std::int64_t>(block_table[s / cache.block_rows]) * cache.block_rows + s % cache.block_rows;
    float scale = 0.0f;
    indexer_read(cache, slot, k, &scale);
    float acc = 0.0f;
    for (int h = 0; h < kIndexerHeads; ++h) {
      float dot = 0.0f;
      for (int d = 0; d < kIndexerDim; ++d) dot += q8[h * kIndexerDim + d] * k[d];
      acc += weights[h] * std::max(dot, 0.0f);
    }
    out[static_cast<std::size_t>(s)] = acc * scale + 0.0f;  // + 0.0f: -0.0 counts as +0.0
  }
  return out;
}

std::vector<std::int32_t> indexer_topk(const float* scores, int n_c, int k) {
  if (k <= 0) detail::fail("indexer_topk: k = ", k, " must be >= 1");
  if (n_c < 0) detail::fail("indexer_topk: n_c = ", n_c, " must be >= 0");
  std::vector<std::int32_t> out(static_cast<std::size_t>(k), -1);
  if (n_c <= k) {  // the short-context path: every row, in order
    std::iota(out.begin(), out.begin() + n_c, 0);
    return out;
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(n_c));
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](std::int32_t s) { return scores[s] + 0.0f; };
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return key(a) > key(b); });
  std::copy(order.begin(), order.begin() + k, out.begin());
  return out;
}

}  // namespace graphsafe::ds4::ref
