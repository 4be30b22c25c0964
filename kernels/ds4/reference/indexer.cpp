// The lightning indexer's CPU reference (docs/ds4_model.md §2.3): fp8 key rows with one scale, the
// ReLU-weighted head scores and the top-k selection rule of graphsafe/ds4/indexer.hpp.
#include <graphsafe/ds4/indexer.hpp>
#include <graphsafe/ds4/reference.hpp>

#include "detail.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

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
  std::sort(order.begin(), order.begin() + k);  // the K picked, listed in row order
  std::copy(order.begin(), order.begin() + k, out.begin());
  return out;
}

IndexerInputs make_indexer_inputs(const DecodeProblem& p, std::uint64_t seed, int tie_every) {
  if (p.cfg.ratio != kIndexerRatio) detail::fail("make_indexer_inputs: ratio = ", p.cfg.ratio, " must be 4 (C4)");
  if (p.cfg.compressed_block_entries() != IndexerCache{}.block_rows)
    detail::fail("make_indexer_inputs: compressed blocks of ", p.cfg.compressed_block_entries(), " entries; 64 needed");
  IndexerInputs in;
  in.cache.num_blocks = p.cmp_num_blocks;
  in.cache_bytes.assign(static_cast<std::size_t>(p.cmp_num_blocks) * in.cache.stride, 0);
  in.cache.base = in.cache_bytes.data();
  std::mt19937_64 rng(seed);
  // Uniform values in [-2, 2) from the top bits: the same on every standard library.
  auto value = [&] { return static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-53 * 4.0 - 2.0); };
  const int fill = p.fill_to > 0 ? p.fill_to : *std::max_element(p.seq_lens.begin(), p.seq_lens.end());
  const int rows = fill / kIndexerRatio;
  std::vector<float> x(kIndexerDim);
  for (int b = 0; b < p.batch; ++b) {
    for (int j = 0; j < rows; ++j) {
      if (!(tie_every > 0 && j > 0 && j % tie_every == 0))
        for (float& v : x) v = value();
      const std::int64_t slot =
          static_cast<std::int64_t>(p.cmp_block_table[static_cast<std::size_t>(b) * p.cmp_blocks_per_req +
                                                      j / in.cache.block_rows]) * in.cache.block_rows +
          j % in.cache.block_rows;
      indexer_insert(in.cache, slot, x.data());
    }
  }
  in.q.resize(static_cast<std::size_t>(p.batch) * kIndexerHeads * kIndexerDim);
  for (std::uint8_t& v : in.q) v = fp8_e4m3_from_float(value());
  in.weights.resize(static_cast<std::size_t>(p.batch) * kIndexerHeads);
  for (float& v : in.weights) v = value() * 0.125f;
  return in;
}

std::vector<std::int32_t> indexer_topk_all(const DecodeProblem& p, const IndexerInputs& in) {
  const int K = p.cfg.topk;
  std::vector<std::int32_t> out(static_cast<std::size_t>(p.batch) * K);
  std::vector<float> q(kIndexerHeads * kIndexerDim);
  for (int b = 0; b < p.batch; ++b) {
    const int n_c = std::max(p.seq_lens[b], 0) / kIndexerRatio;
    for (std::size_t i = 0; i < q.size(); ++i)
      q[i] = fp8_e4m3_to_float(in.q[static_cast<std::size_t>(b) * q.size() + i]);
    const std::vector<float> scores =
        indexer_scores(in.cache, p.cmp_block_table.data() + static_cast<std::size_t>(b) * p.cmp_blocks_per_req, n_c,
                       q.data(), in.weights.data() + static_cast<std::size_t>(b) * kIndexerHeads);
    const std::vector<std::int32_t> top = indexer_topk(scores.data(), n_c, K);
    std::copy(top.begin(), top.end(), out.begin() + static_cast<std::ptrdiff_t>(b) * K);
  }
  return out;
}

}  // namespace graphsafe::ds4::ref
