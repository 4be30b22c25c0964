// Quickstart: a first captured graph whose workspace grows with the sequences (host backend: runs
// anywhere; with a GPU use CudaBackend and a cudaStream_t, and launch kernels instead of closures).
#include <graphsafe/graphsafe.hpp>

#include <cstdio>
#include <vector>

using namespace graphsafe;

int main() {
  const Symbol R = Symbol::fixed("requests");                  // fixed for the graph's life
  const Symbol L = Symbol::batch("seq_lens", R, /*capacity=*/512);  // grows between replays
  const Extent rows = sum_over(L, [](const Extent& l) { return ceil_div(l, 4); });

  HostBackend backend;
  Arena arena(backend);
  HostStream s;
  arena.reserve(1 << 20, s);  // before capture: captures never allocate

  std::vector<int> lens = {3, 5};  // the "device" lengths the kernel reads at run time
  Bindings b;
  b.set(R, 2).set(L, {3, 5});
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    auto ws = arena.request(s, "rows", rows, sizeof(int), capacity_bound, bb);  // replay-safe
    int* p = ws.as<int>();
    s.launch([p, &lens] { for (int i = 0; i < (lens[0] + 3) / 4 + (lens[1] + 3) / 4; ++i) p[i] = i; });
  });
  lens = {15, 17};
  b.set(L, {15, 17});  // the sequences grew: the guards check first, then the graph runs
  graph.replay(b, s);
  std::printf("replayed at seq_lens = [15, 17]; %zu live guards\n", graph.plan().guard_count());
}
