#include <graphsafe/graphsafe.hpp>
using namespace graphsafe;

int main() {
  Symbol R = Symbol::fixed("requests");
  Symbol L = Symbol::batch("seq_lens", R, /*capacity=*/512);
  Extent rows = sum_over(L, [](const Extent& l) { return ceil_div(l, 4); });

  HostBackend backend;            // or CudaBackend with a cudaStream_t
  Arena arena(backend);
  HostStream s;
  arena.reserve(1 << 20, s);      // before capture
  Bindings b;
  b.set(R, 2).set(L, {3, 5});
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    auto ws = arena.request(s, "rows", rows, sizeof(float), capacity_bound, bb);  // replay-safe
    float* p = ws.as<float>();
    s.launch([p] { p[0] = 1.0f; });  // launch kernels on s using the workspace
  });
  b.set(L, {15, 17});             // sequences grew
  graph.replay(b, s);             // guards first; with exact_at_capture this throws guard_failure
  return 0;
}
