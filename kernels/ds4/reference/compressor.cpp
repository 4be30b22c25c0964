// Compressor (learned gated pooling) of docs/ds4_model.md §2.2: per-channel softmax over the slots of one
// compressed row, then RMSNorm + rope of the result.
#include <graphsafe/ds4/reference.hpp>

#include <graphsafe/ds4/indexer.hpp>

#include "detail.hpp"

#include <cmath>
#include <cstddef>

namespace graphsafe::ds4::ref {

namespace {

// Gated pooling of one compressed row of width `dim` from state rows of c * dim floats (the
// attention compressor: dim 512; the indexer's key compressor: dim 128).
void pool_row(int ratio, int j, int dim, const float* kv_state, const float* score_state, float* out) {
  const int c = compressor_channels(ratio);
  const std::size_t row = static_cast<std::size_t>(c) * dim;  // floats per token of state

  // Slots as (token, channel offset). C4: previous group (channels [0,dim)) unless j == 0, then the
  // current group (channels [dim,2*dim)). Otherwise: the current group, channels [0,dim).
  struct Slot { long long token; int channel_offset; };
  std::vector<Slot> slots;
  if (ratio == 4) {
    if (j > 0) {
      for (int s = 0; s < 4; ++s) slots.push_back({4LL * j - 4 + s, 0});
    }
    for (int s = 0; s < 4; ++s) slots.push_back({4LL * j + s, dim});
  } else {
    for (int s = 0; s < ratio; ++s) slots.push_back({static_cast<long long>(ratio) * j + s, 0});
  }

  for (int d = 0; d < dim; ++d) {
    float m = -INFINITY;
    for (const Slot& s : slots) {
      const float g = score_state[static_cast<std::size_t>(s.token) * row + s.channel_offset + d];
      if (g > m) m = g;
    }
    float den = 0.0f, num = 0.0f;
    for (const Slot& s : slots) {
      const std::size_t at = static_cast<std::size_t>(s.token) * row + s.channel_offset + d;
      const float w = std::exp(score_state[at] - m);
      den += w;
      num += w * kv_state[at];
    }
    out[d] = num / den;
  }
}

// RMSNorm (weight norm_w[dim]) and GPT-J rope on the last 64 dims of a row of width `dim`.
void norm_rope(float* x, int dim, const float* norm_w, int position, float rope_theta, float eps) {
  float ss = 0.0f;
  for (int d = 0; d < dim; ++d) ss += x[d] * x[d];
  const float inv_rms = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
  for (int d = 0; d < dim; ++d) x[d] = x[d] * inv_rms * norm_w[d];
  for (int i = 0; i < kRopeDim / 2; ++i) {
    const double inv_freq = std::pow(static_cast<double>(rope_theta), -2.0 * i / kRopeDim);
    const double angle = static_cast<double>(position) * inv_freq;
    const float cs = static_cast<float>(std::cos(angle));
    const float sn = static_cast<float>(std::sin(angle));
    float* pair = x + (dim - kRopeDim) + 2 * i;
    const float a = pair[0], b = pair[1];
    pair[0] = a * cs - b * sn;
    pair[1] = a * sn + b * cs;
  }
}

}  // namespace

void compress_row(int ratio, int j, const float* kv_state, const float* score_state, float* out512) {
  if (ratio < 2) detail::fail("compress_row: ratio = ", ratio, " must be >= 2 (C1 has no compressor)");
  if (j < 0) detail::fail("compress_row: j = ", j, " must be >= 0");
  pool_row(ratio, j, kHeadDim, kv_state, score_state, out512);
}

void compress_finalize(float* row512, const float* norm_w, int position, float rope_theta) {
  norm_rope(row512, kHeadDim, norm_w, position, rope_theta, kRmsNormEps);
}

void indexer_compress_row(int j, const float* kv_state, const float* score_state, const float* norm_w,
                          float rope_theta, float eps, float* out128) {
  if (j < 0) detail::fail("indexer_compress_row: j = ", j, " must be >= 0");
  pool_row(kIndexerRatio, j, kIndexerDim, kv_state, score_state, out128);
  norm_rope(out128, kIndexerDim, norm_w, j * kIndexerRatio, rope_theta, eps);
}

}  // namespace graphsafe::ds4::ref
