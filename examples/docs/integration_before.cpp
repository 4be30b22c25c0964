// BEFORE graphsafe: a vLLM-style gather workspace sized from the CPU lengths when the step is
// recorded. N (compressed rows) and M (row stride) become frozen kernel arguments; after the
// sequences grow, the SWA rows written at offset N land on compressed rows >= N.
#include "integration_common.hpp"

// Record one decode step on `s` (captured: N, M and the buffer are frozen in the graph).
void record_step_before(graphsafe::HostStream& s, const std::vector<int>& lens_cpu, Device& dev,
                        std::vector<float>& buffer) {
  int N = 0, G = 0;
  for (int l : lens_cpu) {
    N = std::max(N, l / kRatio);          // sized from capture-time values ...
    G = std::max(G, std::min(l, kWindow));
  }
  const int M = N + G;
  buffer.assign(lens_cpu.size() * M, 0.f);  // ... and allocated at exactly that size
  float* ws = buffer.data();
  const std::size_t rows = buffer.size();
  s.launch([&dev, ws, rows, N, M] { gather(dev, ws, rows, N, M); });
  s.launch([&dev, ws, N, M] { attend(dev, ws, N, M); });
}
