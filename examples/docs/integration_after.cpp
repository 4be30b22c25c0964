// AFTER graphsafe: the same step with N, G and the workspace sized through the arena. The sizes are
// extents over symbols, the policies bound them (capacity for N, the static query bound for G), and
// the plan records every decision: replays after growth are safe by construction.
#include "integration_common.hpp"

struct StepSymbols {
  graphsafe::Symbol R = graphsafe::Symbol::fixed("requests");
  graphsafe::Symbol W = graphsafe::Symbol::fixed("window");
  graphsafe::Symbol L = graphsafe::Symbol::batch("seq_lens", R, kMaxModelLen);
};

void record_step_after(graphsafe::Arena& arena, graphsafe::HostStream& s, const StepSymbols& y,
                       const graphsafe::Bindings& b, Device& dev) {
  using namespace graphsafe;
  const Extent n_c = max_over(y.L, [](const Extent& l) { return floor_div(l, kRatio); });
  const Extent g = max_over(y.L, [&](const Extent& l) { return min(l, Extent(y.W)); });
  const std::int64_t N = arena.dimension(s, "compressed_rows", n_c, capacity_bound, b);
  const std::int64_t G = arena.dimension(s, "swa_rows", g, static_query_bound(Extent(y.W)), b);
  const std::int64_t M = N + G;
  auto ws = arena.request(s, "kv", Extent(y.R) * M, sizeof(float), capacity_bound, b);
  float* p = ws.as<float>();
  const std::size_t rows = static_cast<std::size_t>(ws.count());
  s.launch([&dev, p, rows, N, M] { gather(dev, p, rows, static_cast<int>(N), static_cast<int>(M)); });
  s.launch([&dev, p, N, M] { attend(dev, p, static_cast<int>(N), static_cast<int>(M)); });
}
