// Attention with sink over the attended rows (docs/ds4_model.md §2.5, §7.4), two entry points: straight from the
// paged caches, and over a gathered workspace through combined indices.
#include <graphsafe/ds4/reference.hpp>

#include "detail.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace graphsafe::ds4::ref {

namespace {

// One request: every head attends `rows` (pointers to 512 floats). out[H*512].
void attend(const DecodeProblem& p, int b, const std::vector<const float*>& rows, float* out) {
  const int H = p.cfg.heads;
  std::fill(out, out + static_cast<std::size_t>(H) * kHeadDim, 0.0f);
  if (rows.empty()) return;
  std::vector<float> q(kHeadDim), s(rows.size());
  for (int h = 0; h < H; ++h) {
    const std::uint16_t* qb = p.q.data() + (static_cast<std::size_t>(b) * H + h) * kHeadDim;
    for (int d = 0; d < kHeadDim; ++d) q[d] = bf16_to_float(qb[d]);
    float m = -INFINITY;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      float dot = 0.0f;
      for (int d = 0; d < kHeadDim; ++d) dot += q[d] * rows[i][d];
      s[i] = kSoftmaxScale * dot;
      m = std::max(m, s[i]);
    }
    float sum = 0.0f;
    for (float& v : s) { v = std::exp(v - m); sum += v; }
    const float lse = m + std::log(sum);
    const float sink_factor = 1.0f / (1.0f + std::exp(p.sink[h] - lse));
    float* o = out + static_cast<std::size_t>(h) * kHeadDim;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const float w = s[i] / sum;
      for (int d = 0; d < kHeadDim; ++d) o[d] += w * rows[i][d];
    }
    for (int d = 0; d < kHeadDim; ++d) o[d] *= sink_factor;
  }
}

}  // namespace

void sparse_attention(const DecodeProblem& p, float* out) {
  validate(p);
  const PagedCache swa = swa_view(p);
  const PagedCache cmp = cmp_view(p);
  const std::size_t per_req = static_cast<std::size_t>(p.cfg.heads) * kHeadDim;
  std::vector<float> storage;
  std::vector<const float*> rows;
  for (int b = 0; b < p.batch; ++b) {
    const int L = p.seq_lens[b];
    const std::vector<int> picks = compressed_picks(p, b);
    const int g = swa_len(L, p.cfg.window);
    storage.assign((picks.size() + static_cast<std::size_t>(g)) * kHeadDim, 0.0f);
    std::size_t r = 0;
    for (int j : picks) dequantize_row(cmp, compressed_slot(p, b, j), storage.data() + kHeadDim * r++);
    for (int i = 0; i < g; ++i) dequantize_row(swa, swa_slot(p, b, L - g + i), storage.data() + kHeadDim * r++);
    rows.clear();
    for (std::size_t i = 0; i < r; ++i) rows.push_back(storage.data() + kHeadDim * i);
    attend(p, b, rows, out + per_req * static_cast<std::size_t>(b));
  }
}

void attention_over_workspace(const DecodeProblem& p, const float* ws, std::int64_t ws_rows,
                              const std::int32_t* idx, const std::int32_t* lens, int width, float* out) {
  validate(p);
  if (width < 0) detail::fail("attention_over_workspace: width = ", width, " must be >= 0");
  const std::size_t per_req = static_cast<std::size_t>(p.cfg.heads) * kHeadDim;
  std::vector<const float*> rows;
  for (int b = 0; b < p.batch; ++b) {
    if (lens[b] < 0 || lens[b] > width) {
      detail::fail("attention_over_workspace: lens[", b, "] = ", lens[b], " outside [0, width = ", width, "]");
    }
    rows.clear();
    for (int i = 0; i < lens[b]; ++i) {
      const std::int32_t k = idx[static_cast<std::size_t>(b) * width + i];
      if (k < 0 || k >= ws_rows) continue;  // invalid entry, as flash_mla_sparse_fwd
      rows.push_back(ws + static_cast<std::size_t>(k) * kHeadDim);
    }
    attend(p, b, rows, out + per_req * static_cast<std::size_t>(b));
  }
}

}  // namespace graphsafe::ds4::ref
