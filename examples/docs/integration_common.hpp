// Shared by the integration guide's before/after samples: a toy "device" with lengths read at run
// time, a gather that (like the real kernel) trusts N and M, and an attention that sums the rows.
#pragma once

#include <graphsafe/graphsafe.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

inline constexpr int kRatio = 4, kWindow = 4, kMaxModelLen = 512;

struct Device {
  std::vector<int> lens;      // device seq_lens: updated before every replay
  std::vector<double> out;    // one value per request
};

inline float cmp_row(int b, int c) { return 1000.f * b + c; }
inline float swa_row(int b, int pos) { return -1000.f * b - pos - 1; }

// Row b*M + c <- compressed row c (c < L/r), row b*M + N + i <- SWA token L-g+i. No check against
// N or M (rows past the whole buffer are dropped so the sample stays sound).
inline void gather(Device& d, float* ws, std::size_t rows, int N, int M) {
  for (int b = 0; b < static_cast<int>(d.lens.size()); ++b) {
    const int L = d.lens[b], n_c = L / kRatio, g = std::min(L, kWindow);
    for (int c = 0; c < n_c; ++c)
      if (std::size_t(b) * M + c < rows) ws[b * M + c] = cmp_row(b, c);
    for (int i = 0; i < g; ++i)
      if (std::size_t(b) * M + N + i < rows) ws[b * M + N + i] = swa_row(b, L - g + i);
  }
}

inline void attend(Device& d, const float* ws, int N, int M) {
  d.out.assign(d.lens.size(), 0.0);
  for (int b = 0; b < static_cast<int>(d.lens.size()); ++b) {
    const int L = d.lens[b], n_c = L / kRatio, g = std::min(L, kWindow);
    for (int c = 0; c < n_c; ++c) d.out[b] += ws[b * M + c];
    for (int i = 0; i < g; ++i) d.out[b] += ws[b * M + N + i];
  }
}

// What an eager step computes: the truth.
inline std::vector<double> expected(const std::vector<int>& lens) {
  std::vector<double> e(lens.size(), 0.0);
  for (int b = 0; b < static_cast<int>(lens.size()); ++b) {
    const int L = lens[b], n_c = L / kRatio, g = std::min(L, kWindow);
    for (int c = 0; c < n_c; ++c) e[b] += cmp_row(b, c);
    for (int i = 0; i < g; ++i) e[b] += swa_row(b, L - g + i);
  }
  return e;
}
