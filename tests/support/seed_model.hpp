// The seed bug's model (docs/concepts.md; the tiny shape of docs/ds4_model.md §7.3), shared by the CPU and GPU tests that
// replay it: R requests, window W, seq_lens[b] <= kMaxLen; a C4 layer's compressed rows
// n_c = max_b floor(L[b] / 4) and SWA rows g = max_b min(L[b], W); the value the gather writes into
// each row (it names request, part and position, so any overlap shows) and the rows a correct
// decode step reads back. Compiles as C++ and as CUDA (the values are also written by kernels).
#pragma once

#include <graphsafe/bindings.hpp>
#include <graphsafe/extent.hpp>
#include <graphsafe/symbol.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#if defined(__CUDACC__)
#define GRAPHSAFE_TEST_HD __host__ __device__
#else
#define GRAPHSAFE_TEST_HD
#endif

namespace graphsafe_test::seed {

constexpr int kWindow = 4;                         // W
constexpr int kRatio = 4;                          // C4
constexpr int kMaxLen = 512;                       // max_model_len (capacity of seq_lens)
constexpr int kOutW = kMaxLen / kRatio + kWindow;  // widest row set a request can produce

GRAPHSAFE_TEST_HD inline std::int64_t cmp_value(int b, int c) { return 1'000'000LL * (b + 1) + 500'000 + c; }
GRAPHSAFE_TEST_HD inline std::int64_t swa_value(int b, int pos) { return 1'000'000LL * (b + 1) + pos; }

struct Model {
  graphsafe::Symbol R = graphsafe::Symbol::fixed("requests");
  graphsafe::Symbol W = graphsafe::Symbol::fixed("window");
  graphsafe::Symbol L = graphsafe::Symbol::batch("seq_lens", R, kMaxLen);
  graphsafe::Extent n_c = max_over(L, [](const graphsafe::Extent& l) { return floor_div(l, kRatio); });
  graphsafe::Extent g = max_over(L, [&](const graphsafe::Extent& l) { return min(l, graphsafe::Extent(W)); });

  graphsafe::Bindings bind(const std::vector<int>& lens) const {
    graphsafe::Bindings b;
    b.set(R, static_cast<std::int64_t>(lens.size())).set(W, kWindow);
    b.set(L, std::span<const std::int32_t>(lens.data(), lens.size()));
    return b;
  }
};

// The rows request b's attention reads: its n_c compressed rows, then its last min(L, W) positions.
inline std::vector<std::vector<std::int64_t>> expected_rows(const std::vector<int>& lens) {
  std::vector<std::vector<std::int64_t>> e(lens.size());
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const int L = lens[b], n_c = L / kRatio, gb = std::min(L, kWindow);
    for (int c = 0; c < n_c; ++c) e[b].push_back(cmp_value(static_cast<int>(b), c));
    for (int i = 0; i < gb; ++i) e[b].push_back(swa_value(static_cast<int>(b), L - gb + i));
  }
  return e;
}

// The same, flat: request b's rows at [b * kOutW, ...), zeros after them (the GPU tests' output).
inline std::vector<std::int64_t> expected_flat(const std::vector<int>& lens) {
  std::vector<std::int64_t> e(lens.size() * kOutW, 0);
  const auto rows = expected_rows(lens);
  for (std::size_t b = 0; b < rows.size(); ++b) std::copy(rows[b].begin(), rows[b].end(), e.begin() + b * kOutW);
  return e;
}

}  // namespace graphsafe_test::seed
