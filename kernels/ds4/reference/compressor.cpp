// Compressor (learned gated pooling) of docs/ds4_model.md §2.2: per-channel softmax over the slots of one
// compressed row, then RMSNorm + rope of the result.
#include <graphsafe/ds4/reference.hpp>

#include "detail.hpp"

#include <cmath>
#include <cstddef>

namespace graphsafe::ds4::ref {

void compress_row(int ratio, int j, const float* kv_state, const float* score_state, float* out512) {
  if (ratio < 2) detail::fail("compress_row: ratio = ", ratio, " must be >= 2 (C1 has no compressor)");
  if (j < 0) detail::fail("compress_row: j = ", j, " must be >= 0");
  const int c = compressor_channels(ratio);
  const std::size_t row = static_cast<std::size_t>(c) * kHeadDim;  // floats per token of state

  // Slots as (token, channel offset). C4: previous group (channels [0,512)) unless j == 0, then the
  // current group (channels [512,1024)). Otherwise: the current group, channels [0,512).
  struct Slot { long long token; int channel_offset; };
  std::vector<Slot> slots;
  if (ratio == 4) {
    if (j > 0) {
      for (int s = 0; s < 4; ++s) slots.push_back({4LL * j - 4 + s, 0});
    }
    for (int s = 0; s < 4; ++s) slots.push_back({4LL * j + s, kHeadDim});
  } else {
    for (int s = 0; s < ratio; ++s) slots.push_back({static_cast<long long>(ratio) * j + s, 0});
  }

  for (int d = 0; d < kHeadDim; ++d) {
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
    out512[d] = num / den;
  }
}

void compress_finalize(float* row512, const float* norm_w, int position, float rope_theta) {
  float ss = 0.0f;
  for (int d = 0; d < kHeadDim; ++d) ss += row512[d] * row512[d];
  const float inv_rms = 1.0f / std::sqrt(ss / static_cast<float>(kHeadDim) + kRmsNormEps);
  for (int d = 0; d < kHeadDim; ++d) row512[d] = row512[d] * inv_rms * norm_w[d];
  for (int i = 0; i < kRopeDim / 2; ++i) {
    const double inv_freq = std::pow(static_cast<double>(rope_theta), -2.0 * i / kRopeDim);
    const double angle = static_cast<double>(position) * inv_freq;
    const float cs = static_cast<float>(std::cos(angle));
    const float sn = static_cast<float>(std::sin(angle));
    float* pair = row512 + kNopeDim + 2 * i;
    const float a = pair[0], b = pair[1];
    pair[0] = a * cs - b * sn;
    pair[1] = a * sn + b * cs;
  }
}

}  // namespace graphsafe::ds4::ref
